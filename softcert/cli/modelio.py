"""Load the model and the test set a command measures: ``load_model(--model, --data)``.

Models: every form of ``softcert.cli.model_formats`` (zoo names, ONNX, torch.export,
entry points, checkpoints). An ONNX export of the ``certify.ViT`` family is matched to a ViT
by its weights and checked numerically (``load_onnx``); any other ONNX graph of supported
operators is read as a graph (``onnx_graph_module``).
Test data: a zoo model's own bundled split, or ``--data``: the user's set (``load_test_set``:
.pt or .npz with x and y) for any image shape the model accepts, or a bundled split by name
(``BUNDLED``). A user's model without ``--data`` is an error.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

ONNX_OPS = ("Add", "Constant", "Gemm", "MatMul", "Mul", "Div", "Sub", "ReduceMean", "Relu",
            "Reshape", "Softmax", "Transpose", "Pow", "Sqrt", "LayerNormalization", "Concat",
            "Expand", "Identity", "ConstantOfShape", "Equal", "Where", "Gather")


def load_model(spec: str, data: str | None = None, *, allow_pickle: bool = False):
    """(model, X_test, y_test, label) for ``--model spec`` (any form of
    ``softcert.cli.model_formats``) and ``--data data``: a test-set file (``load_test_set``) or
    the name of a bundled split (``BUNDLED``). A zoo model without ``data`` is measured on its
    own split; any other model needs ``data`` (never a silent fallback to bundled images)."""
    from softcert.certify import zoo
    from softcert.cli import model_formats

    source = model_formats.parse(spec)
    if source.kind == "zoo":
        model, xte, yte = zoo.load(spec)
        if data is not None:
            xte, yte = test_set(data, model.image, classes_of(model))
        return model, xte, yte, f"zoo:{spec}"
    if data is None:
        raise ValueError(f"--data: {spec} is your own model, so name its test set: --data FILE (.pt or .npz with "
                         f"x in [0, 1] of shape (B, C, H, W) and integer labels y), or a bundled split "
                         f"({', '.join(BUNDLED)}) if the model was trained for it")
    if source.kind == "onnx":
        model = _onnx(Path(spec))
    else:
        model = model_formats.build(source, allow_pickle=allow_pickle)
    model.eval()
    xte, yte = test_set(data, getattr(model, "image", None), None)
    _describe(model, xte, spec)
    if int(yte.max()) >= classes_of(model):
        raise ValueError(f"--data: y has labels in [{int(yte.min())}, {int(yte.max())}]; the model has "
                         f"{classes_of(model)} classes (labels 0..{classes_of(model) - 1})")
    return model, xte, yte, str(Path(spec)) if source.file is not None else spec


#: bundled test splits ``--data`` may name: name -> (image shape, loader in certify.data)
BUNDLED = {"digits": ((1, 8, 8), "digits"), "mnist5k": ((1, 28, 28), "mnist5k")}


def _onnx(path: Path):
    try:
        return load_onnx(path)
    except ValueError:
        # not an export of the certify.ViT family: verify the ONNX graph itself
        return onnx_graph_module(path)


def test_set(data: str, image: tuple | None, classes: int | None):
    """(x, y) of ``--data``: a bundled split by name, else a file (``load_test_set``)."""
    if data in BUNDLED and not Path(data).exists():
        shape, loader = BUNDLED[data]
        if image is not None and tuple(image) != shape:
            raise ValueError(f"--data: the bundled split {data!r} has images {shape}; the model takes {tuple(image)}")
        from softcert.certify import data as bundled

        _, _, xte, yte = getattr(bundled, loader)()
        return xte, yte
    return load_test_set(data, image, classes)


def _describe(model, x, spec) -> None:
    """Give a loaded module the ``image`` and ``classes`` the commands read: the test set's
    image shape, and the width of the logits of one image."""
    from softcert import certify

    if getattr(model, "image", None) is None:
        model.image = tuple(x.shape[1:])
    try:
        with torch.no_grad():
            out = certify.logits_of(model(x[:1]))
    except Exception as exc:  # noqa: BLE001  (the user's model on the user's data: say which failed)
        raise ValueError(f"--model {spec}: running it on one image of --data (shape {tuple(x[:1].shape)}) raised "
                         f"{type(exc).__name__}: {str(exc)[:200]}") from None
    if out.dim() != 2 or out.shape[0] != 1:
        raise ValueError(f"--model {spec}: expected logits (1, classes) for one image, got {tuple(out.shape)}")
    # under a name of its own: a user's module may have a ``classes`` of its own (e.g. names)
    model.softcert_classes = int(out.shape[1])


def _read_xy(path: Path):
    if not path.exists():
        raise ValueError(f"--data: no such file {path}")
    suffix = path.suffix.lower()
    if suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as f:
                arrays = {k: f[k] for k in f.files}
        except (OSError, ValueError) as exc:
            raise ValueError(f"--data: cannot read {path} as .npz ({exc})") from None
        missing = [k for k in ("x", "y") if k not in arrays]
        if missing:
            raise ValueError(f"--data: {path} has no array {missing[0]!r} (found {sorted(arrays)})")
        return arrays["x"], arrays["y"]
    if suffix == ".pt":
        try:
            obj = torch.load(path, weights_only=True, map_location="cpu")
        except Exception as exc:  # noqa: BLE001  (any unpickling error: report it plainly)
            raise ValueError(f"--data: cannot read {path} as a torch file ({type(exc).__name__})") from None
        if isinstance(obj, dict):
            missing = [k for k in ("x", "y") if k not in obj]
            if missing:
                raise ValueError(f"--data: {path} has no key {missing[0]!r} (found {sorted(map(str, obj))})")
            return obj["x"], obj["y"]
        if isinstance(obj, (tuple, list)) and len(obj) == 2:
            return obj[0], obj[1]
        raise ValueError(f"--data: {path} holds a {type(obj).__name__}; expected a dict with keys 'x', 'y' "
                         "or a tuple (x, y)")
    raise ValueError(f"--data: expected a .pt or .npz file, got {path.name!r}")


def load_test_set(path, image: tuple | None, classes: int | None):
    """(x float32 (B, C, H, W), y int64 (B,)) from a user's test set, validated.

    x: floating-point images in the model's input domain [0, 1], shape (B,) + image (any
    (B, C, H, W) when ``image`` is None: a model that takes what its data has); for a
    single-channel model (B, H, W) is accepted and given its channel axis. y: integer labels
    in [0, classes). Anything else raises ValueError naming --data, the key and what is wrong
    (integer images in [0, 255] must be divided by 255 first: nothing is rescaled silently).
    """
    path = Path(path)
    x, y = _read_xy(path)
    arrays = {}
    for key, v in (("x", x), ("y", y)):
        if isinstance(v, torch.Tensor):
            v = v.detach().cpu().numpy()
        if not isinstance(v, np.ndarray):
            raise ValueError(f"--data: {key} is a {type(v).__name__}, expected an array or tensor")
        arrays[key] = v
    x, y = arrays["x"], arrays["y"]
    if x.dtype.kind != "f":
        raise ValueError(f"--data: x has dtype {x.dtype}; expected floating-point images in [0, 1] "
                         "(divide integer pixels by 255)")
    if x.ndim == 3 and (image is None or image[0] == 1):
        x = x[:, None]  # (B, H, W) greyscale: add the channel axis
    want = "(B, C, H, W)" if image is None else f"(B,) + {tuple(image)}"
    if x.ndim != 4 or (image is not None and x.shape[1:] != tuple(image)) or x.shape[0] < 1:
        raise ValueError(f"--data: x has shape {tuple(arrays['x'].shape)}; the model takes images {want} with B >= 1")
    if not np.all(np.isfinite(x)):
        raise ValueError("--data: x has non-finite values")
    lo, hi = float(x.min()), float(x.max())
    if lo < 0 or hi > 1:
        raise ValueError(f"--data: x has values in [{lo:g}, {hi:g}]; the model's input domain is [0, 1]")
    if y.dtype.kind not in "iu":
        raise ValueError(f"--data: y has dtype {y.dtype}; labels must be integers")
    if y.shape != (x.shape[0],):
        raise ValueError(f"--data: y has shape {tuple(y.shape)}; expected ({x.shape[0]},), one label per image")
    if y.min() < 0:
        raise ValueError(f"--data: y has a negative label {int(y.min())}; labels are 0..classes-1")
    if classes is not None and y.max() >= classes:
        raise ValueError(f"--data: y has labels in [{int(y.min())}, {int(y.max())}]; the model has "
                         f"{classes} classes (labels 0..{classes - 1})")
    return torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y, dtype=torch.int64)


# ----------------------------------------------------------------------------- ONNX
def _attr(node, name, default=None):
    import onnx

    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def onnx_eval(graph_proto, x: np.ndarray) -> np.ndarray:
    """Evaluate an ONNX graph of ``ONNX_OPS`` in float64 numpy (a small reference interpreter)."""
    from onnx import numpy_helper

    env = {t.name: numpy_helper.to_array(t).astype(np.float64) if numpy_helper.to_array(t).dtype.kind == "f"
           else numpy_helper.to_array(t) for t in graph_proto.initializer}
    env[graph_proto.input[0].name] = x.astype(np.float64)
    for node in graph_proto.node:
        ins = [env[i] if i else None for i in node.input]
        op = node.op_type
        if op == "Constant":
            v = numpy_helper.to_array(_attr(node, "value"))
            out = v.astype(np.float64) if v.dtype.kind == "f" else v
        elif op == "Add":
            out = ins[0] + ins[1]
        elif op == "Sub":
            out = ins[0] - ins[1]
        elif op == "Mul":
            out = ins[0] * ins[1]
        elif op == "Div":
            out = ins[0] / ins[1]
        elif op == "Pow":
            out = ins[0] ** ins[1]
        elif op == "Sqrt":
            out = np.sqrt(ins[0])
        elif op == "Relu":
            out = np.maximum(ins[0], 0)
        elif op == "MatMul":
            out = ins[0] @ ins[1]
        elif op == "Gemm":
            A, B = ins[0], ins[1]
            if _attr(node, "transA", 0):
                A = A.T
            if _attr(node, "transB", 0):
                B = B.T
            out = _attr(node, "alpha", 1.0) * A @ B
            if len(ins) > 2 and ins[2] is not None:
                out = out + _attr(node, "beta", 1.0) * ins[2]
        elif op == "Reshape":
            shape = [int(s) for s in ins[1]]
            shape = [ins[0].shape[i] if s == 0 else s for i, s in enumerate(shape)]
            out = ins[0].reshape(shape)
        elif op == "Transpose":
            out = np.transpose(ins[0], _attr(node, "perm"))
        elif op == "Softmax":
            ax = _attr(node, "axis", -1)
            e = np.exp(ins[0] - ins[0].max(axis=ax, keepdims=True))
            out = e / e.sum(axis=ax, keepdims=True)
        elif op == "ReduceMean":
            axes = _attr(node, "axes")
            if axes is None and len(ins) > 1 and ins[1] is not None:
                axes = [int(a) for a in ins[1]]
            out = ins[0].mean(axis=tuple(axes) if axes is not None else None,
                              keepdims=bool(_attr(node, "keepdims", 1)))
        elif op == "LayerNormalization":
            ax = _attr(node, "axis", -1)
            mu = ins[0].mean(axis=ax, keepdims=True)
            var = ((ins[0] - mu) ** 2).mean(axis=ax, keepdims=True)
            out = (ins[0] - mu) / np.sqrt(var + _attr(node, "epsilon", 1e-5)) * ins[1]
            if len(ins) > 2 and ins[2] is not None:
                out = out + ins[2]
        elif op == "Concat":
            out = np.concatenate(ins, axis=_attr(node, "axis"))
        elif op == "Expand":
            out = np.broadcast_to(ins[0], np.broadcast_shapes(ins[0].shape, tuple(int(d) for d in ins[1]))).copy()
        elif op == "Identity":
            out = ins[0]
        elif op == "ConstantOfShape":
            val = _attr(node, "value")
            v = numpy_helper.to_array(val).ravel()[0] if val is not None else 0.0
            out = np.full([int(d) for d in ins[0]], v)
        elif op == "Equal":
            out = ins[0] == ins[1]
        elif op == "Where":
            out = np.where(ins[0], ins[1], ins[2])
        elif op == "Gather":
            out = np.take(ins[0], ins[1], axis=_attr(node, "axis", 0))
        else:  # unreachable after check_onnx_ops
            raise ValueError(f"model: unsupported ONNX operator {op}")
        env[node.output[0]] = out
    return env[graph_proto.output[0].name]


def check_onnx_ops(graph_proto) -> None:
    for node in graph_proto.node:
        if node.op_type not in ONNX_OPS:
            raise ValueError(f"model: unsupported layer {node.name or '<unnamed>'!r} (ONNX operator "
                             f"{node.op_type}); supported operators: {', '.join(ONNX_OPS)}")


def classes_of(model) -> int:
    """The number of logits of a loaded model (a certify.ViT, an ONNX graph module, or a
    module given ``classes`` by ``load_model``)."""
    for classes in (getattr(model, "softcert_classes", None), getattr(model, "classes", None),
                    getattr(getattr(model, "head", None), "out_features", None)):
        if isinstance(classes, int) and not isinstance(classes, bool):
            return classes
    raise ValueError(f"model: the number of classes of a {type(model).__name__} is unknown (load it with "
                     "softcert.cli.modelio.load_model, which reads it off the logits)")


def onnx_graph_module(path: Path):
    """Any ONNX classifier of supported operators as a certify.GraphModule (read through onnx
    itself, ``certify.read_onnx``), with ``image`` (the input shape without the batch axis)
    and ``classes``."""
    import math

    from softcert import certify

    net = certify.read_onnx(path)
    gm = certify.GraphModule(net.graph)
    gm.image = tuple(net.input_shape[1:])
    gm.classes = math.prod(net.output_shape[1:])
    return gm


def load_onnx(path: Path):
    """A certify.ViT equal to the ONNX graph (torch.onnx export of the supported family).

    The graph's weights are read in node order (embedding, then per block q, k, v, o, fc1,
    fc2, then the classifier; matrices of MatMul nodes are stored transposed by the exporter),
    the config is inferred from their shapes, the head count is the one whose ViT reproduces
    the graph's outputs on random inputs (float64 interpreter ``onnx_eval``, max error 1e-6).
    """
    try:
        import onnx
    except ImportError:
        raise ValueError("model: reading ONNX needs the onnx package (pip install 'softcert[data]')") from None
    from onnx import numpy_helper

    from softcert.certify.models import ViT

    try:
        m = onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"model: cannot parse {path} as ONNX ({type(exc).__name__})") from None
    g = m.graph
    check_onnx_ops(g)
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    dims = [d.dim_value for d in g.input[0].type.tensor_type.shape.dim]
    if len(dims) != 4 or not all(dims[1:]):
        raise ValueError(f"model: ONNX input must be an image batch (B, C, H, W), got {dims}")
    image = tuple(int(d) for d in dims[1:])
    mats = []  # (kind, weight as (out, in), bias name or None) in node order
    for node in g.node:
        if node.op_type == "MatMul" and node.input[1] in inits:
            mats.append(inits[node.input[1]].T)
        elif node.op_type == "Gemm" and node.input[1] in inits:
            w = inits[node.input[1]]
            mats.append(w if _attr(node, "transB", 0) else w.T)
    if len(mats) < 8 or (len(mats) - 2) % 6:
        raise ValueError(f"model: the ONNX graph has {len(mats)} weight matrices; the certify.ViT family "
                         "has 2 + 6 per block")
    depth = (len(mats) - 2) // 6
    dim, inp = mats[0].shape
    patch = int(round((inp / image[0]) ** 0.5))
    mlp = mats[5].shape[0]
    classes = mats[-1].shape[0]
    has_ln = any(n.endswith("norm1.weight") for n in inits)
    pool = "cls" if "cls" in inits else "mean"
    last_err = None
    for heads in [h for h in (1, 2, 4, 8, 16, 3, 6, 12) if dim % h == 0]:
        model = ViT(image=image, patch=patch, dim=dim, heads=heads, mlp=mlp, depth=depth,
                    classes=classes, layer_norm=has_ln, pool=pool).double()
        sd = model.state_dict()
        lin = ["embed"] + [f"blocks.{i}.{n}" for i in range(depth)
                           for n in ("attn.q", "attn.k", "attn.v", "attn.o", "fc1", "fc2")] + ["head"]
        try:
            for name, W in zip(lin, mats):
                sd[f"{name}.weight"] = torch.as_tensor(np.asarray(W, dtype=np.float64))
            for k in sd:
                if k.endswith(".weight") and k[: -len(".weight")] in lin:
                    continue
                sd[k] = torch.as_tensor(np.asarray(inits[k], dtype=np.float64))
            model.load_state_dict(sd)
        except (KeyError, RuntimeError) as exc:
            raise ValueError(f"model: the ONNX weights do not fit a certify.ViT ({str(exc)[:120]})") from None
        x = np.random.default_rng(0).random((2,) + image)
        with torch.no_grad():
            ref = model(torch.as_tensor(x)).numpy()
        try:
            # the exporter bakes the batch size into Reshape constants: one image at a time
            got = np.concatenate([onnx_eval(g, x[i:i + 1]) for i in range(len(x))])
        except (ValueError, KeyError, IndexError) as exc:
            raise ValueError(f"model: cannot evaluate the ONNX graph ({exc})") from None
        last_err = float(np.max(np.abs(got - ref)))
        if last_err < 1e-6 * max(1.0, float(np.max(np.abs(ref)))):
            return model.float().eval()
    raise ValueError(f"model: the ONNX graph is not a certify.ViT of the supported family "
                     f"(best output mismatch {last_err:.3g})")

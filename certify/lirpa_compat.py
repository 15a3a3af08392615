"""auto_LiRPA 0.3 on torch 2.13 / numpy 2: runtime patches, applied lazily, no file edits.

See shared/notes/auto_lirpa_0.3_on_torch_2.13.md. ``load()`` imports auto_LiRPA after:
0. aliasing ``numpy.lib.arraysetops`` (removed in numpy 2) to a module exposing numpy.isin;
1. providing ``torch.onnx.symbolic_helper._set_opset_version``;
2. making ``torch._C.Node`` subscriptable (``n[k]`` dispatching on ``n.kindOf(k)``);
3. accepting ``remove_duplicate=`` in ``BoundedModule._named_members``;
4. SOUNDNESS: ``BoundReduceMax.bound_backward`` with a fixed index scattered only the first
   specification row (the index has a leading dim of 1); the fix expands the index to the
   full shape of last_A. ``patch_reducemax=False`` leaves the original (for the test that
   shows the violation).
``bounded_module`` also runs the model forward on the actual input before compute_bounds
(patch 5: the fixed max index otherwise comes from the construction input).
"""
from __future__ import annotations

import sys
import types

INSTALL_HINT = "pip install --no-deps auto-lirpa==0.3"
BOUND_OPTS = {"conv_mode": "matrix", "fixed_reducemax_index": True, "sparse_features_alpha": False}
#: alpha-CROWN's slope optimisation in ``lirpa_lower``: 20 Adam steps at rate 0.1 (auto_LiRPA's
#: ``optimize_bound_args``; the "20 iterations, lr 0.1" of docs/mathematics.md)
ALPHA_OPTS = {"iteration": 20, "lr_alpha": 0.1}
_STATE = {"loaded": False, "reducemax_fixed": None, "orig_reducemax": None}


def _pre_import_patches():
    import numpy as np
    import torch

    if "numpy.lib.arraysetops" not in sys.modules:
        mod = types.ModuleType("numpy.lib.arraysetops")
        mod.isin = np.isin
        sys.modules["numpy.lib.arraysetops"] = mod
    import torch.onnx.symbolic_helper as sh

    if not hasattr(sh, "_set_opset_version"):
        def _set_opset_version(version):
            try:
                from torch.onnx._internal.torchscript_exporter._globals import GLOBALS
            except ImportError:  # torch before 2.9 keeps it here
                from torch.onnx._globals import GLOBALS

            GLOBALS.export_onnx_opset_version = version
        sh._set_opset_version = _set_opset_version
    if not hasattr(torch._C.Node, "__getitem__"):
        def _getitem(node, key):
            return getattr(node, node.kindOf(key))(key)
        torch._C.Node.__getitem__ = _getitem


def _fixed_reducemax_backward(self, last_lA, last_uA, x):
    import torch

    if not self.fixed_max_index:
        raise NotImplementedError("BoundReduceMax with perturbed max indices")

    def one_side(last_A):
        if last_A is None:
            return None
        indices = self.indices.unsqueeze(0)
        if not self.keepdim:
            last_A = last_A.unsqueeze(self.axis + 1)
            indices = indices.unsqueeze(self.axis + 1)
        shape = list(last_A.shape)
        shape[self.axis + 1] *= self.input_shape[self.axis]
        A = torch.zeros(shape, device=last_A.device, dtype=last_A.dtype)
        # the fix: one index per specification row, not only the first
        A.scatter_(dim=self.axis + 1, index=indices.expand(*last_A.shape), src=last_A)
        return A

    return [(one_side(last_lA), one_side(last_uA))], 0, 0


def load(patch_reducemax: bool = True):
    """Import auto_LiRPA with the patches; returns the module. Raises ImportError naming the
    install command if it is absent."""
    try:
        _pre_import_patches()
        import auto_LiRPA
    except ModuleNotFoundError as exc:
        if "auto_LiRPA" in str(exc):
            raise ImportError(f"auto_LiRPA is not installed: run `{INSTALL_HINT}`") from exc
        raise
    import importlib

    from auto_LiRPA import bound_general

    reduce = importlib.import_module("auto_LiRPA.operators.reduce")

    if not _STATE["loaded"]:
        orig = bound_general.BoundedModule._named_members

        def _named_members(self, get_members_fn, prefix="", recurse=True, remove_duplicate=True):
            return orig(self, get_members_fn, prefix=prefix, recurse=recurse)
        bound_general.BoundedModule._named_members = _named_members
        _STATE["orig_reducemax"] = reduce.BoundReduceMax.bound_backward
        _STATE["loaded"] = True
    reduce.BoundReduceMax.bound_backward = (
        _fixed_reducemax_backward if patch_reducemax else _STATE["orig_reducemax"])
    _STATE["reducemax_fixed"] = patch_reducemax
    return auto_LiRPA


class PatchModel:
    """Factory for the torch module auto_LiRPA sees: a certify.ViT on flattened patches (as
    before the generic front end, so baseline numbers stay comparable), any other model on its
    own inputs with its output reduced to the logits."""

    @staticmethod
    def on_patches(model):
        return hasattr(model, "forward_patches") and hasattr(model, "patchify")

    @staticmethod
    def wrap(model):
        import torch

        if not PatchModel.on_patches(model):
            from softcert.certify.trace import Logits

            return Logits(model)

        class _OnPatches(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, z):
                return self.m.forward_patches(z)
        return _OnPatches(model)


def bounded_module(model, z0, custom_ops=None, patch_reducemax=True):
    """A BoundedModule for ``model`` (a certify.ViT) on patch inputs like ``z0``."""
    lirpa = load(patch_reducemax)
    return lirpa.BoundedModule(PatchModel.wrap(model), z0, bound_opts=dict(BOUND_OPTS),
                               custom_ops=custom_ops, device=str(z0.device))


def lirpa_lower(model, zl, zu, z0, C, method, custom_ops=None, patch_reducemax=True):
    """auto_LiRPA lower bound of C·logits over the input box [zl, zu] (a certify.ViT: images
    or patches). method: 'IBP', 'CROWN' or 'alpha-CROWN' (ReLU slopes optimised as
    ``ALPHA_OPTS`` says)."""
    import torch

    lirpa = load(patch_reducemax)
    from auto_LiRPA.perturbations import PerturbationLpNorm

    if z0.dim() > 3 and PatchModel.on_patches(model):  # images of a certify.ViT
        zl, zu, z0 = model.patchify(zl), model.patchify(zu), model.patchify(z0)
    try:
        bm = bounded_module(model, z0, custom_ops, patch_reducemax)
        ptb = PerturbationLpNorm(norm=float("inf"), x_L=zl, x_U=zu)
        x = lirpa.BoundedTensor(z0, ptb)
        with torch.no_grad():
            bm(x)  # patch 5: forward on the actual input fixes the max indices
        if method == "alpha-CROWN":
            bm.set_bound_opts({"optimize_bound_args": dict(ALPHA_OPTS)})
        lo, _ = bm.compute_bounds(x=(x,), C=C, method=method, bound_upper=False)
    except Exception as exc:
        where = failure_site(exc)
        if where and len(exc.args) == 1 and isinstance(exc.args[0], str):
            exc.args = (f"{exc.args[0]} ({where})",)  # same type: callers' soft-failure lists still match
        raise
    return lo


def failure_site(exc) -> str:
    """What auto_LiRPA was working on when it raised ``exc``: the operators it rejected
    (its graph builder keeps them in a local list before raising), else the innermost bound
    operator on the stack (type and node name); "" when neither is found."""
    import traceback

    site = ""
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        rejected = frame.f_locals.get("unsupported_ops")
        if rejected:
            return "unsupported: " + ", ".join(sorted({str(getattr(n, "op", n)) for n in rejected}))
        obj = frame.f_locals.get("self")
        if obj is not None and type(obj).__module__.startswith("auto_LiRPA.operators"):
            site = f"in {type(obj).__name__} {getattr(obj, 'name', '?')!r}"
    return site


def _to_f32(t, direction):
    """float64 -> float32 rounded toward ``direction`` (-inf or +inf): stays on the safe side."""
    import torch

    r = t.to(torch.float32)
    bad = (r.double() > t) if direction < 0 else (r.double() < t)
    step = torch.full_like(r, -torch.inf if direction < 0 else torch.inf)
    return torch.where(bad, torch.nextafter(r, step), r)


def vertex_softmax_bound():
    """A Bound class for ``BoundedModule(..., custom_ops={'onnx::Softmax': cls})``.

    Interval: exact elementwise softmax intervals; backward: the coefficient rows of last_A
    are solved exactly over the score box by ``bounds.vertex_softmax`` and returned as a
    constant bias (A = None): min / max of Σ_rows c·softmax(s) with the input dependence
    dropped (see notes/vertex_in_crown_first_measurement.md for when that wins)."""
    import torch

    load()
    from auto_LiRPA.operators.base import Bound

    from softcert.bounds import vertex_softmax

    class VertexSoftmaxBound(Bound):
        def __init__(self, attr, inputs, output_index, options):
            super().__init__(attr, inputs, output_index, options)
            self.axis = attr["axis"]
            self.nonlinear = True
            self.requires_input_bounds = [0]

        def forward(self, x):
            return torch.softmax(x, dim=self.axis)

        def infer_batch_dim(self, batch_size, *x):
            return x[0]

        def _last(self, t):
            return t.movedim(self.axis, -1).double()

        def interval_propagate(self, *v):
            l, u = (self._last(t) for t in v[0])
            n = l.shape[-1]
            eye = torch.eye(n, dtype=torch.float64, device=l.device)
            r = vertex_softmax(eye, l.unsqueeze(-2), u.unsqueeze(-2))  # solved on the CPU: moved back
            return (_to_f32(r.lower.to(l.device), -1).movedim(-1, self.axis).to(v[0][0].dtype),
                    _to_f32(r.upper.to(l.device), 1).movedim(-1, self.axis).to(v[0][0].dtype))

        def bound_backward(self, last_lA, last_uA, x):
            l, u = self._last(x.lower), self._last(x.upper)
            ax = self.axis if self.axis >= 0 else self.axis + l.dim()

            def side(A, lower):
                if A is None:
                    return 0
                c = A.movedim(ax + 1, -1).double()
                r = vertex_softmax(c, l.unsqueeze(0).expand_as(c), u.unsqueeze(0).expand_as(c))
                val = (r.lower if lower else r.upper).to(c.device).flatten(2).sum(-1)
                return _to_f32(val, -1 if lower else 1)

            return [(None, None)], side(last_lA, True), side(last_uA, False)

    return VertexSoftmaxBound

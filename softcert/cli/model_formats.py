"""How a command line names a model: ``--model SPEC`` on certify, bab, report and scaling.

=====================================  ======================================================
SPEC                                   read as
=====================================  ======================================================
``mnist-vit1``                         a zoo model (``certify.zoo.names()``)
``model.onnx`` / ``model.onnx.gz``     an ONNX graph (``softcert.cli.modelio``)
``model.pt2``                          a ``torch.export`` program (``torch.export.save``)
``path/to/file.py:function``           a Python entry point: ``function()`` returns the
``package.module:function``            ``nn.Module``, weights loaded (it runs your code)
``model.pt`` (any other file)          a checkpoint: ``{"recipe": ENTRY, "config": {...},
                                       "state_dict": ...}`` (``ENTRY(**config)`` builds it,
                                       relative ``file.py`` paths from the checkpoint's
                                       folder), or ``{"config", "state_dict"}`` of
                                       ``certify.ViT`` (``certify.train`` writes these)
pickled ``nn.Module`` / TorchScript    only with ``allow_pickle`` (``--allow-pickle``):
                                       loading either runs code stored in the file
=====================================  ======================================================

Checkpoints are read with ``torch.load(weights_only=True)``, which runs no code. Every
refusal is a ValueError naming ``--model``, the file and the way in.
"""
from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

_ENTRY = re.compile(r"^(?P<where>.+):(?P<function>[A-Za-z_]\w*)$")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
FORMS = ("a zoo name", "model.onnx", "model.pt2 (torch.export)", "file.py:function or package.module:function",
         "a checkpoint {'recipe', 'config', 'state_dict'}")


@dataclass(frozen=True)
class Spec:
    """A parsed ``--model``: ``kind`` in zoo, onnx, export, entry, checkpoint; ``target``: the
    zoo name, the file, or (for entry) the ``file.py`` path or module name; ``function``: the
    entry point's function."""

    kind: str
    target: str
    function: str | None = None

    @property
    def file(self) -> Path | None:
        """The file whose content decides the model (None for a zoo name or an installed module)."""
        path = Path(self.target)
        return path if self.kind != "zoo" and path.is_file() else None


def parse(spec: str) -> Spec:
    """The kind of model ``spec`` names (see the module docstring); ValueError if none."""
    from softcert.certify import zoo

    if not isinstance(spec, str) or not spec:
        raise ValueError(f"--model: expected a model name or path, got {spec!r}")
    path = Path(spec)
    if path.exists():
        name = path.name.lower()
        if path.is_dir():
            raise ValueError(f"--model: {spec} is a folder; name a file or an entry point (forms: {', '.join(FORMS)})")
        if name.endswith((".onnx", ".onnx.gz")):
            return Spec("onnx", spec)
        if name.endswith(".pt2"):
            return Spec("export", spec)
        if name.endswith(".py"):
            raise ValueError(f"--model: {spec} is a Python file; name the function that builds the model: "
                             f"{spec}:FUNCTION")
        return Spec("checkpoint", spec)
    m = _ENTRY.match(spec)
    if m:
        where = m["where"]
        if where.endswith(".py"):
            if not Path(where).is_file():
                raise ValueError(f"--model: no such file {where} (entry point {spec})")
            return Spec("entry", where, m["function"])
        if _MODULE.match(where):
            return Spec("entry", where, m["function"])
    if spec in zoo.names():
        return Spec("zoo", spec)
    raise ValueError(f"--model: {spec!r} is no file, entry point or zoo model; forms: {', '.join(FORMS)}; "
                     f"zoo: {', '.join(zoo.names())}")


def entry_file(spec: str):
    """(file.py, function) when ``spec`` names a function in a Python file, else None (the one
    reading of that form: dataset, check and render call it)."""
    m = _ENTRY.match(spec) if isinstance(spec, str) else None
    return (m["where"], m["function"]) if m and m["where"].endswith(".py") else None


def build(spec: Spec, *, allow_pickle: bool = False) -> nn.Module:
    """The ``nn.Module`` a non-zoo ``Spec`` names (ONNX files: ``softcert.cli.modelio``)."""
    if spec.kind == "export":
        return exported(Path(spec.target))
    if spec.kind == "entry":
        return call_entry(spec.target, spec.function, f"--model {spec.target}:{spec.function}")
    if spec.kind == "checkpoint":
        return checkpoint(Path(spec.target), allow_pickle=allow_pickle)
    raise ValueError(f"--model: {spec.kind} models are not built here")


# ----------------------------------------------------------------------------- entry points
def _import(where: str, origin: str):
    if where.endswith(".py"):
        path = Path(where).resolve()
        name = f"softcert_user_{abs(hash(str(path)))}"
        if name in sys.modules:
            return sys.modules[name]
        loader = importlib.util.spec_from_file_location(name, path)
        if loader is None:
            raise ValueError(f"{origin}: cannot import {path}")
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        sys.path.insert(0, str(path.parent))  # its own imports of neighbouring files
        try:
            loader.loader.exec_module(module)
        except Exception as exc:  # noqa: BLE001  (the user's code: say where it failed)
            del sys.modules[name]
            raise ValueError(f"{origin}: importing {path} raised {type(exc).__name__}: {exc}") from None
        finally:
            sys.path.remove(str(path.parent))
        return module
    try:
        return importlib.import_module(where)
    except ImportError as exc:
        raise ValueError(f"{origin}: cannot import module {where!r} ({exc})") from None


def call_entry(where: str, function: str, origin: str, **config) -> nn.Module:
    """``where:function(**config)``, checked to be an ``nn.Module``."""
    fn = getattr(_import(where, origin), function, None)
    if not callable(fn):
        raise ValueError(f"{origin}: {where} has no function {function!r}")
    try:
        model = fn(**config)
    except Exception as exc:  # noqa: BLE001  (the user's code: say where it failed)
        raise ValueError(f"{origin}: {function}({', '.join(config)}) raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, nn.Module):
        raise ValueError(f"{origin}: {function}() returned a {type(model).__name__}, expected a torch.nn.Module")
    return model


# ----------------------------------------------------------------------------- torch.export
class Exported(nn.Module):
    """A loaded ``torch.export`` program as a module: ``eval()``/``train()`` do not reach the
    graph (an exported graph is fixed in the mode it was exported in), and a program exported
    with a static batch of 1 runs a larger batch image by image."""

    def __init__(self, graph: nn.Module, batch: int | None):
        super().__init__()
        self.graph, self.batch = graph, batch

    def train(self, mode: bool = True):
        self.training = mode
        return self

    def forward(self, x):
        if self.batch == 1 and x.shape[0] != 1:
            return torch.cat([self.graph(x[i:i + 1]) for i in range(x.shape[0])])
        return self.graph(x)


def exported(path: Path) -> Exported:
    try:
        program = torch.export.load(str(path))
    except Exception as exc:  # noqa: BLE001  (a damaged or foreign archive)
        raise ValueError(f"--model: cannot read {path} as a torch.export program ({type(exc).__name__}: "
                         f"{str(exc)[:160]})") from None
    inputs = [n for n in program.graph.nodes if n.op == "placeholder"
              and n.name in program.graph_signature.user_inputs]
    if len(inputs) != 1:
        raise ValueError(f"--model: {path} takes {len(inputs)} inputs; softcert certifies models of one input")
    val = inputs[0].meta.get("val")
    batch = val.shape[0] if val is not None and isinstance(val.shape[0], int) else None
    return Exported(program.module(), batch)


# ----------------------------------------------------------------------------- checkpoints
def _is_torchscript(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as z:
            return any(n.split("/", 1)[-1].startswith("code/") for n in z.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def _unsafe_load(path: Path, allow_pickle: bool):
    what = "TorchScript" if _is_torchscript(path) else "a pickled object (e.g. a whole nn.Module)"
    if not allow_pickle:
        raise ValueError(f"--model: {path} holds {what}, and loading it runs code stored in the file. If you trust "
                         "the file, pass --allow-pickle; else save {'recipe': 'my_model.py:build', 'config': {...}, "
                         "'state_dict': model.state_dict()} or name the builder: --model my_model.py:build")
    try:
        if what == "TorchScript":
            return torch.jit.load(str(path), map_location="cpu")
        return torch.load(path, weights_only=False, map_location="cpu")
    except Exception as exc:  # noqa: BLE001  (any unpickling error: report it plainly)
        raise ValueError(f"--model: cannot load {path} ({type(exc).__name__}: {str(exc)[:160]})") from None


def checkpoint(path: Path, *, allow_pickle: bool = False) -> nn.Module:
    """The module of a checkpoint file (see the module docstring)."""
    try:
        obj = torch.load(path, weights_only=True, map_location="cpu")
    except Exception:  # noqa: BLE001  (weights_only refuses anything but tensors and plain containers)
        obj = _unsafe_load(path, allow_pickle)
    if isinstance(obj, nn.Module):
        return obj
    if not isinstance(obj, dict):
        raise ValueError(f"--model: {path} holds a {type(obj).__name__}, expected a checkpoint dict")
    if "recipe" in obj:
        return _from_recipe(path, obj)
    if "config" in obj and "state_dict" in obj:
        return _vit(path, obj)
    raise ValueError(f"--model: {path} is a bare state dict, which does not say how to build the model: save "
                     "{'recipe': 'my_model.py:build', 'config': {...}, 'state_dict': model.state_dict()} (build(**config) "
                     "returns the module), or name the builder that loads its own weights: --model my_model.py:build")


def _load_state(model: nn.Module, sd, origin: str) -> nn.Module:
    if not isinstance(sd, dict):
        raise ValueError(f"{origin}: 'state_dict' is a {type(sd).__name__}, expected a dict of tensors")
    result = model.load_state_dict(sd, strict=False)
    if result.missing_keys or result.unexpected_keys:
        what = (f"lacks {result.missing_keys[0]!r}" if result.missing_keys
                else f"has {result.unexpected_keys[0]!r}, which the model does not")
        raise ValueError(f"{origin}: the state dict {what} ({len(result.missing_keys)} missing, "
                         f"{len(result.unexpected_keys)} unexpected keys)")
    return model


def _from_recipe(path: Path, obj: dict) -> nn.Module:
    origin = f"--model {path}"
    recipe, config = obj["recipe"], obj.get("config", {})
    m = _ENTRY.match(recipe) if isinstance(recipe, str) else None
    if m is None:
        raise ValueError(f"{origin}: 'recipe' must be 'file.py:function' or 'package.module:function', got {recipe!r}")
    if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
        raise ValueError(f"{origin}: 'config' must be a dict of keyword arguments of {recipe}")
    where = m["where"]
    if where.endswith(".py"):
        near = path.parent / where
        where = str(near) if near.is_file() else where
        if not Path(where).is_file():
            raise ValueError(f"{origin}: recipe file {m['where']} found neither beside the checkpoint nor here")
    model = call_entry(where, m["function"], origin, **config)
    try:
        return _load_state(model, obj.get("state_dict", {}), origin)
    except RuntimeError as exc:
        raise ValueError(f"{origin}: the state dict does not fit {recipe}(**config): {str(exc)[:200]}") from None


def _vit(path: Path, obj: dict) -> nn.Module:
    from softcert.certify.models import ViT

    origin = f"--model {path}"
    try:
        cfg = dict(obj["config"])
        cfg["image"] = tuple(cfg["image"])
        model = ViT(**cfg)
    except (TypeError, KeyError, ValueError) as exc:
        raise ValueError(f"{origin}: 'config' does not describe a certify.ViT ({exc}); for another architecture "
                         "save {'recipe': 'my_model.py:build', 'config': {...}, 'state_dict': ...}") from None
    extra = sorted(set(obj["state_dict"]) - set(model.state_dict()))
    if extra:
        raise ValueError(f"{origin}: unsupported layer {extra[0]!r} in the state dict of a certify.ViT (Linear, "
                         "LayerNorm, ReLU, multi-head attention); for another architecture save "
                         "{'recipe': 'my_model.py:build', 'config': {...}, 'state_dict': ...}")
    try:
        return _load_state(model, obj["state_dict"], origin)
    except RuntimeError as exc:
        raise ValueError(f"{origin}: the state dict does not fit the config: {str(exc)[:200]}") from None


def add_arguments(parser, default: str | None, *, many: bool = True) -> None:
    """``--model``, ``--data`` and ``--allow-pickle`` on an argparse parser: the one way every
    command that measures a model names it."""
    parser.add_argument("--model", nargs="+" if many else None, default=[default] if many else default,
                        metavar="MODEL",
                        help="a zoo name (certify.zoo.names()), model.onnx, model.pt2 (torch.export), "
                             "file.py:function or package.module:function returning the nn.Module with its weights, "
                             "or a checkpoint {'recipe': 'file.py:function', 'config': {...}, 'state_dict': ...} "
                             f"(default: {default})")
    parser.add_argument("--data", default=None, metavar="FILE",
                        help="the test set: .pt or .npz with x (B, C, H, W) in [0, 1] and integer labels y, or a "
                             "bundled split (digits, mnist5k); required for a model that is not from the zoo")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="also load a whole pickled nn.Module or TorchScript file, which runs code stored in it "
                             "(only for files you trust)")

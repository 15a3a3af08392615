"""A CPU-side count of the calls that would make a GPU wait for the host (test helper).

On a CUDA device each of these copies a value to the host, or sizes an output by the data, and
so blocks the Python thread until the device has caught up: ``.item()``, ``bool``/``int``/
``float``/``index`` of a tensor (a tensor in an ``if``, ``while``, ``max()``, ``sorted``...),
``.tolist()``, ``.cpu()``/``.numpy()``/``.to("cpu")``, ``nonzero``/``argwhere``/one-argument
``torch.where``, indexing by a boolean mask (``t[mask]``, ``t[mask] = v``), ``masked_select``,
``unique``, ``repeat_interleave`` by a tensor, ``bincount``, ``equal``/``allclose``, and the
formatting of a tensor. Uploads are counted apart (``UPLOADS``): ``torch.tensor``/``as_tensor``
of host data given a ``device`` (``to_device``) and indexing by a Python list (``list_index``),
counted on a CPU run too, where they copy nothing: a pageable host-to-device copy waits for the stream too
(PyTorch's copy synchronises unless ``non_blocking``), but it carries no device value back.

``SyncCounter`` is a ``TorchFunctionMode``: it sees every torch call made in its ``with``
block, on any device, so the count is taken on the CPU. Nested calls made by a torch function
itself (under the mode, which then steps aside) are not seen, only the outer one. The
operators read the device where that costs nothing (the CPU) and avoid it elsewhere
(``certify.ops.host``): count under ``host.reads("defer")`` to see what a GPU run makes.

``python -P tests/bab_sync_counter.py MODEL [--policy defer] [--bab BATCH]`` prints the counts
of one CROWN pass (or of each branch-and-bound round) on a zoo model by call site
(docs/certify/bab.notes.md, "Host reads in the relaxations").
"""
from __future__ import annotations

import argparse
import collections
import pathlib
import sys

import torch
from torch.overrides import TorchFunctionMode

from softcert import certify
from softcert.certify import crown, zoo
from softcert.certify.bab import search
from softcert.certify.graph_cache import classes_of, graph_of
from softcert.certify.ops import host
from softcert.certify.spec import input_box, margin_spec

CERTIFY = str(pathlib.Path(certify.__file__).parent) + "/"

_T = torch.Tensor
#: kind -> the torch callables of that kind (the Tensor methods and the torch functions)
KINDS = {
    "item": (_T.item,),
    "bool": (_T.__bool__, torch.is_nonzero),
    "int": (_T.__int__, _T.__index__),
    "float": (_T.__float__,),
    "tolist": (_T.tolist,),
    "cpu": (_T.cpu, _T.numpy, _T.__array__),
    "nonzero": (_T.nonzero, torch.nonzero, _T.argwhere, torch.argwhere),
    "unique": (_T.unique, torch.unique, _T.unique_consecutive, torch.unique_consecutive, torch._unique2),
    "masked_select": (_T.masked_select, torch.masked_select),
    "equal": (_T.equal, torch.equal, _T.allclose, torch.allclose),
    "bincount": (_T.bincount, torch.bincount),
    "format": (_T.__format__, _T.__repr__),
}
_KIND = {f: k for k, fs in KINDS.items() for f in fs}
#: the kinds that copy host data to the device (counted, not in ``SyncCounter.total``)
UPLOADS = ("to_device", "list_index")


def _has_mask(index):
    """Does an index expression hold a boolean tensor (a mask: its size is read on the host)?"""
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def _on_host(device):
    return device is None or torch.device(device).type == "cpu"


class SyncCounter(TorchFunctionMode):
    """Counts, by kind (``KINDS``, plus "mask_index", "where_nonzero", "repeat_interleave",
    "to_cpu", and the ``UPLOADS`` "to_device" and "list_index"), the synchronisations of the
    torch calls made under it. ``total``: all of them but the uploads; ``paused()`` stops
    counting for a block. With ``sites``, ``by_module`` counts them per (certify module, kind):
    the module of ``softcert.certify`` innermost on the stack at the call ("bab/engine.py",
    "ops/activations.py", "crown.py"; "" outside certify); with ``lines`` also ``by_line``, per
    (that frame's "module:line function", kind)."""

    def __init__(self, sites=False, lines=False):
        super().__init__()
        self.counts = collections.Counter()
        self.by_module = collections.Counter()
        self.by_line = collections.Counter()
        self._sites = sites or lines
        self._lines = lines
        self._paused = 0

    @property
    def total(self):
        return sum(v for k, v in self.counts.items() if k not in UPLOADS)

    def snapshot(self):
        return collections.Counter(self.counts)

    def paused(self):
        counter = self

        class _Pause:
            def __enter__(self):
                counter._paused += 1

            def __exit__(self, *exc):
                counter._paused -= 1

        return _Pause()

    def kind(self, func, args, kwargs):
        """The kind of synchronisation ``func(*args, **kwargs)`` makes, or None."""
        kind = _KIND.get(func)
        if kind is not None:
            return kind
        if func in (_T.__getitem__, _T.__setitem__) and len(args) > 1:
            if _has_mask(args[1]):
                return "mask_index"
            if isinstance(args[1], list):
                return "list_index"  # the list is copied to the tensor's device
        if func in (torch.where, _T.where) and len(args) + len(kwargs) == 1:
            return "where_nonzero"
        if func in (torch.repeat_interleave, _T.repeat_interleave) and "output_size" not in kwargs \
                and len(args) > 1 and isinstance(args[1], torch.Tensor):
            return "repeat_interleave"
        if func in (_T.to, _T.copy_):
            target = [a for a in (*args[1:], *kwargs.values()) if isinstance(a, (str, torch.device))]
            src = args[0] if func is _T.to else args[1]
            if isinstance(src, torch.Tensor) and src.device.type != "cpu" and target and _on_host(target[0]):
                return "to_cpu"
        if func in (torch.tensor, torch.as_tensor) and args and not isinstance(args[0], torch.Tensor) \
                and kwargs.get("device") is not None:
            return "to_device"  # host data for a device: a copy there, even where the run is on the CPU
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self._paused:
            kind = self.kind(func, args, kwargs)
            if kind is not None:
                self.counts[kind] += 1
                if self._sites:
                    frame = _certify_frame()
                    module = "" if frame is None else frame.f_code.co_filename[len(CERTIFY):]
                    self.by_module[(module, kind)] += 1
                    if self._lines:
                        line = "" if frame is None else f"{module}:{frame.f_lineno} {frame.f_code.co_name}"
                        self.by_line[(line, kind)] += 1
        return func(*args, **kwargs)


def _certify_frame():
    """The ``softcert.certify`` frame innermost on the caller's stack (None: outside certify)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith(CERTIFY):
            return frame
        frame = frame.f_back
    return None


def crown_pass(name, images, eps, lines=False, options=crown.DEFAULT):
    """The ``SyncCounter`` of one CROWN pass (``crown.propagate`` with ``options`` and
    ``crown.backward`` of the margins, as ``certify.verify(..., "crown")``) on the zoo model
    ``name``'s test images ``images`` (a slice or list) at radius ``eps``."""
    model, x, y = zoo.load(name)
    x, y = x[images].to(torch.float64), y[images]
    g = graph_of(model, x)
    lo, hi = input_box(x, eps)
    C = margin_spec(y, classes_of(g)).reshape(len(y), classes_of(g), *g.nodes[g.output].shape)
    with SyncCounter(lines=lines) as counter:
        state = crown.propagate(g, lo.unsqueeze(1), hi.unsqueeze(1), centre=x.unsqueeze(1), options=options)
        crown.backward(state, g.output, C)
    return counter


def bab_rounds(name, image, eps, batch, lines=True):
    """Per round of branch and bound on the zoo model ``name``'s test image ``image``
    (``batch`` leaves split per round, 3 rounds and more, no attack): the ``by_line``
    (``lines``) or ``by_module`` Counter of the syncs made in it."""
    model, x, y = zoo.load(name)
    counter, rounds, real = SyncCounter(lines=lines), [], search._Search.round

    def counted(self, number, deadline):
        before = collections.Counter(counter.by_line if lines else counter.by_module)
        out = real(self, number, deadline)
        rounds.append((counter.by_line if lines else counter.by_module) - before)
        return out
    opts = certify.BabOptions(batch=batch, max_leaves=2 * 3 * batch + 10, intermediate="full", timeout=1e6,
                              attack=certify.AttackOptions(enabled=False))
    search._Search.round = counted
    try:
        with counter:
            certify.verify(model, x[image:image + 1], y[image:image + 1], eps, method="bab", options=opts)
    finally:
        search._Search.round = real
    return rounds


def _report(by_line, title):
    reads = {k: v for k, v in by_line.items() if k[1] not in UPLOADS}
    uploads = sum(v for k, v in by_line.items() if k[1] in UPLOADS)
    print(f"{title}: {sum(reads.values())} reads, {uploads} uploads")
    for (site, kind), v in sorted(reads.items(), key=lambda kv: -kv[1]):
        print(f"  {v:5d} {kind:12s} {site}")


def main(argv=None):
    p = argparse.ArgumentParser(description="host synchronisations of certify on a zoo model, by call site")
    p.add_argument("model")
    p.add_argument("--eps", type=float, default=0.08)
    p.add_argument("--images", type=int, nargs=2, default=(0, 1), metavar=("FIRST", "END"))
    p.add_argument("--policy", choices=host.POLICIES, default="auto", help="certify.ops.host.reads")
    p.add_argument("--bab", type=int, metavar="BATCH", help="count branch-and-bound rounds instead (image FIRST)")
    a = p.parse_args(argv)
    with host.reads(a.policy):
        if a.bab:
            for n, counts in enumerate(bab_rounds(a.model, a.images[0], a.eps, a.bab)):
                _report(counts, f"{a.model} eps {a.eps} bab batch {a.bab}, round {n}")
        else:
            c = crown_pass(a.model, slice(*a.images), a.eps, lines=True)
            _report(c.by_line, f"{a.model} eps {a.eps} images {a.images[0]}..{a.images[1] - 1}, one CROWN pass")


if __name__ == "__main__":
    main()

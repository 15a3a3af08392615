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
itself (under the mode, which then steps aside) are not seen, only the outer one.
"""
from __future__ import annotations

import collections
import pathlib
import sys

import torch
from torch.overrides import TorchFunctionMode

from softcert import certify

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
    "ops/activations.py", "crown.py"; "" outside certify)."""

    def __init__(self, sites=False):
        super().__init__()
        self.counts = collections.Counter()
        self.by_module = collections.Counter()
        self._sites = sites
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
                    self.by_module[(_module(), kind)] += 1
        return func(*args, **kwargs)


def _module():
    """The ``softcert.certify`` module innermost on the caller's stack, relative to certify/."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(CERTIFY):
            return name[len(CERTIFY):]
        frame = frame.f_back
    return ""

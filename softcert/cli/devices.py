"""``--device``: where a command bounds (certify, bab). The model and the images move there;
certify follows its inputs' device (issue 30), so nothing else changes. Refused by name: a
string torch does not read as a device, a kind other than cpu and cuda, a CUDA device this
machine does not have."""
from __future__ import annotations

import copy

import torch

__all__ = ["add_argument", "device_of", "on_device"]

_MOVED: dict = {}  # (id of the loaded model, device) -> its copy there: one copy per process


def add_argument(parser) -> None:
    parser.add_argument("--device", default=None, metavar="DEVICE",
                        help="where to bound: cpu, cuda or cuda:N (default: cpu); the model and the "
                             "images are moved there, results are the same up to the proven rounding")


def device_of(value: str | None) -> torch.device:
    """``--device``'s value as a torch.device; ValueError naming the flag and the fix."""
    if value is None:
        return torch.device("cpu")
    try:
        dev = torch.device(value)
    except (RuntimeError, ValueError):
        raise ValueError(f"--device: {value!r} is not a device (expected cpu, cuda or cuda:N)") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device: {value!r}: only cpu and cuda are supported")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {value}: this machine has no CUDA device (torch.cuda.is_available() "
                             "is False); leave --device out to run on the CPU")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"--device {value}: there are {torch.cuda.device_count()} CUDA devices "
                             f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return dev


def on_device(model, x, y, device: torch.device):
    """(model, x, y) on ``device``: the tensors moved, the model copied there once (the loaded
    model stays where it was, for the commands' own CPU work)."""
    if device.type == "cpu":
        return model, x.cpu(), y.cpu()
    key = (id(model), str(device))
    if key not in _MOVED:
        _MOVED[key] = (copy.deepcopy(model).to(device), model)  # keep the original alive: ids stay unique
    return _MOVED[key][0], x.to(device), y.to(device)

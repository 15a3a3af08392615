"""``--device``: where a command bounds (certify, bab, report, vnncomp, vnnlib verify). The
model and the images (an ONNX network's graph and the input boxes) move there; certify
follows its inputs' device (issue 30), so nothing else changes. Refused by name: a string
torch does not read as a device, a kind other than cpu and cuda, a CUDA device this machine
does not have. With ``--workers`` (softcert.cli.dataset), ``worker_device`` spreads the Dask
workers over the CUDA devices.

torch is imported inside the functions: ``softcert vnncomp`` and ``softcert vnnlib`` add the
flag before their time budget's watchdog starts (softcert.cli.wallclock), and importing torch
takes over a second."""
from __future__ import annotations

import copy
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

__all__ = ["ONNX_MOVED", "add_argument", "device_of", "model_on", "on_device", "worker_device"]

#: what ``--device`` moves in the ONNX commands (vnncomp, vnnlib verify: certify.vnncomp.solve)
ONNX_MOVED = ("the network's graph and the input boxes (the attack's PGD too; onnxruntime confirms a "
              "counterexample on the CPU in the model's own dtype)")

_MOVED: dict = {}  # (id of the loaded model, device) -> its copy there: one copy per process


def add_argument(parser, moved: str = "the model and the images", workers: bool = False, prefix: str = "") -> None:
    """``--device`` on ``parser``; ``moved``: what the command moves there (for the help);
    ``workers``: the command runs on Dask with ``--workers`` (the help says how the workers
    share the CUDA devices, ``worker_device``); ``prefix``: put before the help (e.g. "not
    standard: ")."""
    text = (f"{prefix}where to bound: cpu, cuda or cuda:N (default: cpu); {moved} are moved there, results are the "
            "same up to the proven rounding")
    if workers:
        text += ("; with --workers and --device cuda, worker i bounds on cuda:(i mod the number of CUDA devices), "
                 "so with one GPU all workers share cuda:0 (cuda:N puts every worker on cuda:N)")
    parser.add_argument("--device", default=None, metavar="DEVICE", help=text)


def device_of(value: str | None) -> torch.device:
    """``--device``'s value as a torch.device; ValueError naming the flag and the fix."""
    import torch

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


def on_device(model, x, y, device: torch.device | None):
    """(model, x, y) on ``device`` (None: the CPU): the tensors moved, the model as
    ``model_on`` gives it."""
    if device is None or device.type == "cpu":
        return model, x.cpu(), y.cpu()
    return model_on(model, device), x.to(device), y.to(device)


def model_on(model, device: torch.device | None):
    """``model`` on ``device`` (None: the CPU): on the CPU the model itself, elsewhere its copy
    there, made once per process (the loaded model stays where it was, for the commands' own
    CPU work)."""
    if device is None or device.type == "cpu":
        return model
    key = (id(model), str(device))
    if key not in _MOVED:
        _MOVED[key] = (copy.deepcopy(model).to(device), model)  # keep the original alive: ids stay unique
    return _MOVED[key][0]


def worker_device(device: torch.device, worker_index: int | None, count: int | None = None) -> torch.device:
    """Where Dask worker ``worker_index`` bounds for ``--device`` ``device`` (already read by
    ``device_of``): plain ``cuda`` spreads the workers over the CUDA devices, worker i on
    cuda:(i mod count) (``count``: the CUDA devices, default torch.cuda.device_count(); with
    one, every worker shares cuda:0). The CPU, an explicit cuda:N, or no worker index (an
    in-process run, a worker whose name is not an integer) keep ``device`` as it is."""
    import torch

    if device.type != "cuda" or device.index is not None or worker_index is None:
        return device
    count = torch.cuda.device_count() if count is None else count
    if count < 1:
        raise ValueError("--device cuda: this Dask worker sees no CUDA device (torch.cuda.device_count() is 0); "
                         "give the workers GPUs, or leave --device out to run on the CPU")
    return torch.device("cuda", worker_index % count)

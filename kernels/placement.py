"""Which kernel family runs where the data is: Triton on CUDA tensors (when the optional
``triton`` extra is installed), Numba on the CPU. ``bounds.vertex_softmax`` and the top-k
certificates of ``analysis.topk`` resolve their ``backend="auto"`` here."""
from __future__ import annotations

import importlib.util

__all__ = ["auto_backend"]


def auto_backend(device) -> str:
    """"triton" for a CUDA ``device`` when triton is installed, else "numba". Looks the
    package up without importing it (triton's import reads TRITON_INTERPRET; the kernels
    modules set that first)."""
    if getattr(device, "type", None) == "cuda" and importlib.util.find_spec("triton") is not None:
        return "triton"
    return "numba"

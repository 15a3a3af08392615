"""Keep the caller's torch thread count across Numba parallel launches.

When Numba runs its "omp" threading layer it shares one OpenMP runtime with torch, and
starting that layer (its first parallel launch, or ``numba.get_num_threads()``) sets the
runtime's thread count to Numba's, torch's included. Measured on
the 2-core machine (2026-12-03): ``torch.get_num_threads()`` went from 1 to 2 after one
``bounds.vertex_softmax`` call, and every later CROWN bound of a single-threaded
``softcert bab`` process beside another job ran 4x slower. ``caller_threads`` restores
torch's count; it guards every launch (and thread query) in ``kernels/``, so nothing depends
on which call happens to start the layer. torch is looked up only if already loaded.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager

__all__ = ["caller_threads"]


@contextmanager
def caller_threads():
    """Context for a Numba parallel launch: torch's intra-op thread count is the same after it."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    try:
        yield
    finally:
        if before is not None and torch.get_num_threads() != before:
            torch.set_num_threads(before)

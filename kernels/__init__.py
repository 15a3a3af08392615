"""Numba kernels that evaluate softcert's bounds at scale (no models here).

Kernels compile on first call (and are cached on disk), not at import.
"""
from kernels.topk import (
    certified_k_numba,
    gap_bound_numba,
    multi_gap_bound_numba,
    tail_mass_numba,
)
from kernels.vertex import vertex_bounds

__all__ = [
    "certified_k_numba",
    "gap_bound_numba",
    "multi_gap_bound_numba",
    "tail_mass_numba",
    "vertex_bounds",
]

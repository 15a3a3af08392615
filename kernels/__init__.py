"""Numba kernels that evaluate softcert's bounds at scale (no models here)."""
from kernels.topk import (
    certified_k_numba,
    gap_bound_numba,
    multi_gap_bound_numba,
    tail_mass_numba,
)

__all__ = ["certified_k_numba", "gap_bound_numba", "multi_gap_bound_numba", "tail_mass_numba"]

"""Numba kernels that evaluate softcert's bounds at scale (no models here).

Kernels compile on their first call (cache=True), not at import; other submodules are
imported on demand (``from kernels.vertex import vertex_bounds``).
"""
from kernels.topk import (
    certified_k_numba,
    gap_bound_numba,
    multi_gap_bound_numba,
    tail_mass_numba,
)

__all__ = ["certified_k_numba", "gap_bound_numba", "multi_gap_bound_numba", "tail_mass_numba"]

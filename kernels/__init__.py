"""Array backends that evaluate softcert's bounds at scale: the bottom layer.

Nothing here imports the rest of softcert. ``kernels.floating`` is the one module of
rounding constants and error formulas. Kernels compile on first call (and are cached on
disk), not at import.
"""
from kernels.topk import (
    block_abs,
    block_constants,
    blockwise_bound_numba,
    certified_k_numba,
    certify_rows_numba,
    gap_bound_numba,
    multi_gap_bound_numba,
    tail_constants,
    tail_mass_numba,
)
from kernels.vertex import vertex_bounds

__all__ = [
    "block_abs",
    "block_constants",
    "blockwise_bound_numba",
    "certified_k_numba",
    "certify_rows_numba",
    "gap_bound_numba",
    "multi_gap_bound_numba",
    "tail_constants",
    "tail_mass_numba",
    "vertex_bounds",
]

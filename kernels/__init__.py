"""Array backends that evaluate softcert's bounds at scale: the bottom layer.

Nothing here imports the rest of softcert. ``kernels.floating`` is the one module of
rounding constants and error formulas. Kernels compile on first call (and are cached on
disk), not at import. The Triton modules (``kernels.triton_*``) are not imported here: they
load triton, which only backend="triton" may do.
"""
from softcert.kernels.attention import attention_bound, flash_attention
from softcert.kernels.topk import (
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
from softcert.kernels.vertex import vertex_bounds

__all__ = [
    "attention_bound",
    "block_abs",
    "block_constants",
    "blockwise_bound_numba",
    "certified_k_numba",
    "certify_rows_numba",
    "flash_attention",
    "gap_bound_numba",
    "multi_gap_bound_numba",
    "tail_constants",
    "tail_mass_numba",
    "vertex_bounds",
]

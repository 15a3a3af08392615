"""Numba kernels that evaluate softcert's bounds at scale (no models here).

Submodules are imported on demand (``from kernels.vertex import vertex_bounds``) so that
importing the package does not compile anything.
"""

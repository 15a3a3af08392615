"""Transitional alias of ``bounds.box`` (renamed public) for callers not yet updated.

kernels/topk.py and analysis/topk.py still import this name; delete this file once they
import ``bounds.box``.
"""
from bounds.box import as_float64, coefficient_box, score_box, validate_scores

__all__ = ["as_float64", "coefficient_box", "score_box", "validate_scores"]

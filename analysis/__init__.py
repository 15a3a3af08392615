"""Analyses built on softcert's bounds: experiments, radii, top-k, floating point, stability."""
from analysis.topk import (
    OutputErrorBound,
    TopKCertificate,
    blockwise_bound,
    certified_k,
    certify_topk,
    gap_bound,
    gaussian_k_fraction,
    gaussian_rule_check,
    key_block_score_bounds,
    multi_gap_bound,
    output_error_bound,
    tail_mass,
)

__all__ = [
    "OutputErrorBound", "TopKCertificate", "blockwise_bound", "certified_k", "certify_topk",
    "gap_bound", "gaussian_k_fraction", "gaussian_rule_check", "key_block_score_bounds",
    "multi_gap_bound",
    "output_error_bound", "tail_mass",
]

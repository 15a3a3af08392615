"""Analyses built on softcert's bounds: experiments, radii, top-k, floating point, stability."""

from analysis.ghosts import (
    RadiusResult,
    batch_radius,
    binary_radius,
    pi_radius_batch,
    radius_exact,
    radius_lower_bound,
    radius_lower_bound_batch,
    top2_estimate,
)
from analysis.safestep import SafeStep, SafeStepController, SafeStepState, logit_slopes
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
    "RadiusResult", "batch_radius", "binary_radius", "pi_radius_batch", "radius_exact",
    "radius_lower_bound", "radius_lower_bound_batch", "top2_estimate",
    "SafeStep", "SafeStepController", "SafeStepState", "logit_slopes",
    "OutputErrorBound", "TopKCertificate", "blockwise_bound", "certified_k", "certify_topk",
    "gap_bound", "gaussian_k_fraction", "gaussian_rule_check", "key_block_score_bounds",
    "multi_gap_bound",
    "output_error_bound", "tail_mass",
]

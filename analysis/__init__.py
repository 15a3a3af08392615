"""Analyses built on softcert's bounds: Taylor radii and safe steps, top-k certificates,
floating-point error bounds, feedback stability, experiments.

Submodules are the public API (``analysis.ghosts``, ``analysis.topk`` ...); the most used
names are re-exported here. ``SafeStepCallback`` and ``SafeStepLightningCallback`` resolve on
first access (analysis.callbacks), so importing analysis imports neither transformers nor Lightning.
"""
from softcert.analysis.ghosts import (
    RadiusNotVerified,
    RadiusResult,
    batch_radius,
    binary_radius,
    count_zeros,
    pi_radius_batch,
    radius_exact,
    radius_lower_bound,
    radius_lower_bound_batch,
    top2_estimate,
)
from softcert.analysis.safestep import (
    SafeStep,
    SafeStepController,
    SafeStepGuard,
    SafeStepState,
    SafeStepWarning,
    logit_slopes,
)
from softcert.analysis.topk import (
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
    "OutputErrorBound", "RadiusNotVerified", "RadiusResult", "SafeStep", "SafeStepCallback", "SafeStepController",
    "SafeStepGuard", "SafeStepLightningCallback", "SafeStepState", "SafeStepWarning",
    "TopKCertificate", "batch_radius", "binary_radius", "blockwise_bound", "certified_k", "count_zeros",
    "certify_topk", "gap_bound", "gaussian_k_fraction", "gaussian_rule_check",
    "key_block_score_bounds", "logit_slopes", "multi_gap_bound", "output_error_bound",
    "pi_radius_batch", "radius_exact", "radius_lower_bound", "radius_lower_bound_batch",
    "tail_mass", "top2_estimate",
]


def __getattr__(name):
    if name in ("SafeStepCallback", "SafeStepLightningCallback"):
        from softcert.analysis import callbacks

        return getattr(callbacks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

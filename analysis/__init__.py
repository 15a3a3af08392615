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

"""The default branching rule: the largest first-order estimate of the bound gain.

A BBPS-like shortcut (Shi et al. TACAS 2025): the operator's ``SplitRule.gain`` (the gradient
of the leaf's bound with respect to the neuron's interval end points times the amount the
split moves them; ReLU scales it to the exact change, ``certify.ops.elementwise``), plus, for
neurons that feed an optimised slope, |d bound / d alpha|, plus 1e-12 (u - l) to prefer wide
intervals when no gradient reaches a neuron.
"""
from __future__ import annotations

from softcert.certify.bab.branching.base import BranchingRule, Candidate


class GainRule(BranchingRule):
    """Split the neuron with the largest estimated gain."""

    def score(self, c: Candidate, p):
        score = c.rule.gain(c.l, c.u, p, c.gl, c.gu)
        if c.alpha_grad is not None:
            score = score + c.alpha_grad
        return score + 1e-12 * (c.u - c.l)

"""A baseline branching rule: split the widest interval (no gradients used)."""
from __future__ import annotations

from softcert.certify.bab.branching.base import BranchingRule, Candidate


class WidestRule(BranchingRule):
    """Split the neuron whose interval u - l is widest (where its rule has a split point)."""

    def score(self, c: Candidate, p):
        return c.u - c.l

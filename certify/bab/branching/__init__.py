"""Branching rules of branch and bound, one per module on ``base.BranchingRule``; ``RULES``
names them for ``BabOptions.branching``."""
from softcert.certify.bab.branching.base import BranchingRule, Candidate
from softcert.certify.bab.branching.gain import GainRule
from softcert.certify.bab.branching.widest import WidestRule

RULES = {"gain": GainRule, "widest": WidestRule}

__all__ = ["RULES", "BranchingRule", "Candidate", "GainRule", "WidestRule"]

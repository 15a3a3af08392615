"""Branch and bound on nonlinear neurons (GenBaB-style), with falsification alongside.

In three pieces: the leaves and their queue (``leaves``), the rules that pick the neuron to
split (``branching``, one module per rule), and the engine that bounds batches of leaves
(``engine``), driven by the search loop (``search``) and, for classification margins, one
sample at a time (``samples``). Options: ``certify.options.BabOptions``.
"""
from softcert.certify.bab.engine import Rows
from softcert.certify.bab.leaves import Decision, split_interval
from softcert.certify.bab.search import Outcome, branch_and_bound

__all__ = ["Decision", "Outcome", "Rows", "branch_and_bound", "split_interval"]

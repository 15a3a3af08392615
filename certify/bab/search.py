"""Branch and bound on one input box: the search loop over the leaf queue.

Domain: one input box; a leaf is a set of split constraints (``certify.bab.leaves``) bounded
by ``certify.bab.engine.LeafBounder``; the neuron to split is picked by a branching rule
(``certify.bab.branching``). A group of rows (a target class, or a VNN-LIB disjunct) is proved
on a leaf when some row's lower bound exceeds its threshold; the property is proved only when
every leaf of every group is proved. With ``BabOptions.intermediate="auto"`` a root left open
after the first attacks gets the ``root_optimised`` most sensitive intermediate bounds
optimised by alpha-CROWN, within ``root_share`` of the budget left. Falsification runs
alongside through the ``falsify`` callback (``certify.bab.samples`` gives it PGD).

A round reads the device once (its leaves' values and decisions, ``engine.Bounded``) and
copies to it once (``engine.LeafBounder._upload``), once more on an attack round (the start
points' positions); the queue and the control flow run on those host numbers.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from softcert.certify import crown
from softcert.certify.bab.engine import LeafBounder, Rows, upload
from softcert.certify.bab.leaves import Leaf, LeafQueue, RelaxationParams
from softcert.certify.options import BabOptions


@dataclass(frozen=True)
class Outcome:
    """What ``branch_and_bound`` found on one box. ``proved[g]``: group g proved on every
    leaf; ``lower[g]``: min over the final leaves of max_row (lower bound - rhs) (a lower bound
    over the whole box, > 0 when proved); ``counterexample``: what ``falsify`` returned, or None;
    ``timed_out``; ``bounded``: leaves bounded; ``vertex_leaves``: leaves where the
    Vertex-Softmax P·V bound beat McCormick; ``leaves``: the final leaves as (group,
    constraints, proved) with constraints a tuple of (node, flat index, lo, hi): z_node[index]
    in [lo, hi] (index into the node's value without the batch axis)."""

    proved: tuple
    lower: tuple
    counterexample: object
    timed_out: bool
    bounded: int
    vertex_leaves: int
    leaves: tuple


class _Search:
    """The state of one search: the queue, the proved leaves, the bounder."""

    def __init__(self, bounder, falsify, options):
        self.bounder, self.falsify, self.options = bounder, falsify, options
        self.batch = options.batch  # halved when a batch does not fit in the device's memory
        self.queue = LeafQueue()
        self.done = []  # proved leaves: (group, constraints)
        self.final = {k: [] for k in range(len(bounder.rows))}  # proved leaves' values per group

    def file(self, bounded, cons, groups):
        """Each bounded leaf: proved (kept with its value) or queued; returns the open ones."""
        open_ = []
        values = bounded.values()  # read from the device with the decisions, once per batch
        for b, (cs, k) in enumerate(zip(cons, groups)):
            v = values[b]
            if v > 0:
                self.final[k].append(v)
                self.done.append((k, cs))
                continue
            self.queue.push(Leaf(k, cs, v, bounded.lower[b:b + 1], bounded.params.row(b), bounded.decisions[b]))
            open_.append(b)
        return open_

    def root(self, deadline):
        """Bound the roots; attack; optimise an open root's intermediate bounds ("auto").
        Returns a counterexample or None."""
        groups = list(range(len(self.bounder.rows)))
        bounded = self.bounder.bound([{}] * len(groups), groups, None, None, deadline)
        self.file(bounded, [{}] * len(groups), groups)
        if len(self.queue) and self.falsify is not None:
            cex = self.falsify(None)
            if cex is None:
                starts = upload([lf.group for lf in self.queue.leaves()], torch.int64, bounded.worst.device)
                cex = self.falsify(bounded.worst[starts])
            if cex is not None:
                return cex
        if len(self.queue) and self.options.intermediate == "auto" and self.bounder.feeds \
                and time.monotonic() < deadline:
            self._optimise_root(deadline)
        return None

    def _optimise_root(self, deadline):
        """The root is open and no attack broke it (and some neuron can be split, so there are
        intermediate bounds to optimise): optimise its intermediate bounds (each within the
        "full" ones), then bound the open groups' roots again on them."""
        open_ = self.queue.leaves()
        groups = [lf.group for lf in open_]
        chosen = self.bounder.sensitive(groups, RelaxationParams.stack([lf.params for lf in open_]))
        now = time.monotonic()
        share = crown.Deadlines(optimise=now + self.options.root_share * (deadline - now), hard=deadline)
        self.bounder.root = self.bounder.propagate("alpha", share, chosen)
        parents = torch.cat([lf.lower for lf in open_])
        self.queue.clear()
        self.file(self.bounder.bound([{}] * len(groups), groups, None, parents, deadline), [{}] * len(groups), groups)

    def round(self, number, deadline):
        """Split a batch of leaves and bound their children; attack from the worst of them on
        every ``leaf_every``-th round, the first (``number`` 0) included. Returns (counterexample or None, whether anything was split)."""
        take = self.queue.pop_batch(self.batch)
        if not take:
            return None, False
        cons, groups, params, parents = [], [], [], []
        for leaf in take:
            for child in leaf.decision.children(leaf.constraints):
                cons.append(child)
                groups.append(leaf.group)
                params.append(leaf.params)
                parents.append(leaf.lower)
        try:
            bounded = self.bounder.bound(cons, groups, RelaxationParams.stack(params), torch.cat(parents), deadline)
        except (RuntimeError, MemoryError) as exc:
            if not out_of_memory(exc) or len(take) == 1:
                raise
            self._shrink(take)
            return None, True
        open_ = self.file(bounded, cons, groups)
        attack = self.options.attack
        if self.falsify is not None and open_ and number % attack.leaf_every == 0:
            values = bounded.values()
            order = sorted(open_, key=values.__getitem__)[: attack.leaf_count]
            return self.falsify(bounded.worst[upload(order, torch.int64, bounded.worst.device)]), True
        return None, True

    def _shrink(self, take):
        """The batch ``take`` ran out of memory: its leaves go back to the queue (nothing of
        them was filed) and later rounds split half as many."""
        for leaf in take:
            self.queue.push(leaf)
        self.batch = max(1, len(take) // 2)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def outcome(self, cex, timed_out):
        ng = len(self.bounder.rows)
        open_by = {k: [lf.value for lf in self.queue.leaves() if lf.group == k] for k in range(ng)}
        proved = tuple(not open_by[k] and bool(self.final[k]) and cex is None for k in range(ng))
        lower = tuple(min(open_by[k] + self.final[k]) if (open_by[k] or self.final[k]) else -math.inf
                      for k in range(ng))
        flat = lambda cs: tuple((n, j, lo, hi) for (n, j), (lo, hi) in cs.items())  # noqa: E731
        leaves = tuple((k, flat(cs), True) for k, cs in self.done) + \
            tuple((lf.group, flat(lf.constraints), False) for lf in self.queue.leaves())
        return Outcome(proved, lower, cex, timed_out, self.bounder.bounded, self.bounder.vertex_wins, leaves)


def out_of_memory(exc: BaseException) -> bool:
    """Is ``exc`` an allocation failure (CUDA's OutOfMemoryError, the CPU allocator's
    "not enough memory", Python's MemoryError) rather than a bug?"""
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or "not enough memory" in str(exc)


def branch_and_bound(graph, xl, xu, rows: Rows, *, deadline, options=BabOptions(), falsify=None,
                     centre=None) -> Outcome:
    """Prove ``rows`` (``Rows``: for every group, on every input of the box [xl, xu]
    (1, *graph input shape) some row has C·output > rhs) by branch and bound until
    ``deadline`` (a ``time.monotonic()`` value) or ``options.max_leaves`` leaves.
    ``falsify(points)``: called with None (a plain attack) or start points
    (P, *graph input shape); returns a confirmed counterexample or None. ``centre``: the
    point anchoring the softmax shifts (default the box centre)."""
    if not isinstance(options, BabOptions):
        raise ValueError(f"options: expected a BabOptions, got {type(options).__name__}")
    search = _Search(LeafBounder(graph, (xl, xu), rows, centre, options, deadline), falsify, options)
    if time.monotonic() > deadline:
        return search.outcome(None, True)
    cex = search.root(deadline)
    if cex is not None:
        return search.outcome(cex, False)
    rounds, timed_out = 0, False
    while len(search.queue):
        if time.monotonic() > deadline:
            timed_out = True
            break
        if search.bounder.bounded >= options.max_leaves:
            break
        cex, split = search.round(rounds, deadline)
        rounds += 1
        if cex is not None:
            return search.outcome(cex, False)
        if not split:
            break
    return search.outcome(None, timed_out)

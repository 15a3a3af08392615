"""The leaves of branch and bound and the queue they wait in.

A leaf is a set of split constraints z_k in [lo, hi] on neurons k (node, flat index) of one
group of specification rows, with its bound, the relaxation parameters it was bounded with
(its children start from them) and the decision that splits it next. Splitting [lo, hi] at p
gives the children [lo, p] and [p, hi], whose union is the parent (``split_interval`` asserts
it), so the leaves always cover the box.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

import torch


def split_interval(lo, hi, p):
    """The two children [lo, p] and [p, hi] of a split of [lo, hi] at p; asserts that p lies
    strictly inside, so that both children are proper and their union is [lo, hi]."""
    lo, hi, p = float(lo), float(hi), float(p)
    if not lo < p < hi:
        raise AssertionError(f"split point {p!r} outside ({lo!r}, {hi!r}): the children would not cover")
    left, right = (lo, p), (p, hi)
    assert left[0] == lo and right[1] == hi and left[1] == right[0]  # [lo, p] ∪ [p, hi] = [lo, hi]
    return left, right


@dataclass(frozen=True)
class Decision:
    """Split neuron ``index`` (flat, without the batch axis) of node ``node``, whose bounds in
    the leaf are [lo, hi], at ``point``."""

    node: int
    index: int
    lo: float
    hi: float
    point: float

    def children(self, constraints):
        """The two children's constraints: ``constraints`` ((node, index) -> (lo, hi)) with this
        neuron's interval replaced by each half (``split_interval``)."""
        out = []
        for half in split_interval(self.lo, self.hi, self.point):
            c = dict(constraints)
            c[(self.node, self.index)] = half
            out.append(c)
        return out


@dataclass(frozen=True)
class RelaxationParams:
    """A leaf's optimised parameters, batch axis first: ``alphas`` node id -> the node's
    relaxation parameters; ``betas`` node id -> (beta_lo, beta_hi), the multipliers of its
    split constraints (beta-CROWN)."""

    alphas: dict
    betas: dict

    def row(self, b):
        """Leaf b's parameters (batch axis of size 1)."""
        one = lambda t: t[b:b + 1]  # noqa: E731
        return RelaxationParams({k: one(a) for k, a in self.alphas.items()},
                                {k: (one(lo), one(hi)) for k, (lo, hi) in self.betas.items()})

    @staticmethod
    def stack(params):
        """The leaves' parameters stacked on the batch axis; a leaf without some node's
        parameters (e.g. the multipliers of a sibling's new split) starts them at 0. None when
        no leaf has any."""
        alphas = _stack([p.alphas for p in params])
        lo = _stack([{k: v[0] for k, v in p.betas.items()} for p in params])
        hi = _stack([{k: v[1] for k, v in p.betas.items()} for p in params])
        if not alphas and not lo:
            return None
        return RelaxationParams(alphas, {k: (lo[k], hi[k]) for k in lo})


def _stack(dicts):
    """key -> the dicts' tensors concatenated on the batch axis (zeros where a dict lacks it)."""
    out = {}
    for k in dict.fromkeys(k for d in dicts for k in d):
        like = next(d[k] for d in dicts if k in d)
        out[k] = torch.cat([d[k] if k in d else torch.zeros_like(like) for d in dicts])
    return out


@dataclass(frozen=True)
class Leaf:
    """One open or proved leaf: its ``group``, ``constraints`` ((node, index) -> (lo, hi)),
    ``value`` (max over the group's rows of lower bound - rhs; > 0: proved), ``lower`` (1, W)
    the rows' bounds, ``params`` (``RelaxationParams`` of batch 1) and ``decision`` (None:
    nothing left to split)."""

    group: int
    constraints: dict
    value: float
    lower: torch.Tensor
    params: RelaxationParams
    decision: Decision | None


class LeafQueue:
    """Open leaves, lowest value first (ties: first pushed first)."""

    def __init__(self):
        self._heap, self._tick = [], itertools.count()

    def __len__(self):
        return len(self._heap)

    def push(self, leaf):
        heapq.heappush(self._heap, (leaf.value, next(self._tick), leaf))

    def pop_batch(self, size):
        """Up to ``size`` leaves to split, lowest first; stops at the first leaf with nothing
        left to split (it stays queued, open)."""
        take = []
        while self._heap and len(take) < size:
            item = heapq.heappop(self._heap)
            if item[2].decision is None:
                heapq.heappush(self._heap, item)
                break
            take.append(item[2])
        return take

    def leaves(self):
        """The queued leaves (any order)."""
        return [lf for _, _, lf in self._heap]

    def clear(self):
        self._heap.clear()

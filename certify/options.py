"""Every tunable of the verifier, as frozen options objects passed in (never module globals).

- ``PropagationOptions``: how ``certify.crown`` computes intermediate bounds;
- ``AttackOptions``: the PGD falsification that runs beside branch and bound;
- ``BabOptions``: branch and bound (``certify.bab``), holding the two above;
- ``BoundOptions``: how ``certify.verify`` runs a bound-only method (batching, propagation).
Each default cites the measurement it came from; a field marked "measurement only" selects an
algorithm kept to measure the default against, never a better answer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

#: the root's intermediate-bound algorithms of ``certify.crown.propagate``
INTERMEDIATE = ("full", "sparse", "dense", "alpha")
#: the branch-and-bound root's: those, or "auto" ("full", then "alpha" once the root is left
#: open and the first attacks fail)
ROOT_INTERMEDIATE = (*INTERMEDIATE, "auto")


def _check(obj, name, ok, expected):
    value = getattr(obj, name)
    if not ok(value):
        raise ValueError(f"{type(obj).__name__}.{name}: expected {expected}, got {value!r}")


def _count(v, low=0):
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


def _real(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class PropagationOptions:
    """How ``certify.crown.propagate`` bounds the intermediate nodes.

    ``intermediate``: the algorithm for the inputs of nonlinear nodes (``INTERMEDIATE``;
    ``certify.crown.propagate``): "full" (the default; CROWN on every element), "sparse",
    "alpha" (about 30x the time of "full" on mnist-vit1), or "dense" (measurement only: the
    algorithm before "full"). ``arithmetic``: "sound" (the default), or "plain" (measurement
    only: the old unsound float64); None: the ambient ``certify.ops.arithmetic`` setting.
    ``chunk_elements``: coefficients per chunk of intermediate-bound rows (``crown_node``;
    2 MB of float64). The backward pass is dominated by per-step Python overhead, so fewer,
    larger chunks win: ``python -P examples/chunk_benchmark.py --images 4`` (one thread, quiet
    machine, 2026-12-03) gave CPU s per image 7.1 / 2.4 / 1.4 / 1.3 (mnist-vit1) and
    23.6 / 8.5 / 4.9 / 4.9 (mnist-vit2) for 2**14 / 2**16 / 2**18 / 2**20, identical margins.
    ``element_budget``: elements of one coefficient tensor of ``intermediate="dense"``
    (measurement only: the algorithm before "full", for the depth benchmark).
    ``intermediate_steps``: Adam steps per row of an intermediate bound optimised by
    ``intermediate="alpha"`` (about 30x the time of "full" on mnist-vit1 at 10;
    docs/certify/bab.notes.md). ``intermediate_per_product``: whether those rows give each
    product of a matmul its own alpha (``certify.ops.bilinear``; off: one per output element).
    ``plain_slack``: the relative widening of ``arithmetic="plain"`` (measurement only: the old
    unsound float64 of docs/certify/sound-fp.md; no proof rests on it)."""

    intermediate: str = "full"
    arithmetic: str | None = None
    chunk_elements: int = 2**18
    element_budget: int = 2**23
    intermediate_steps: int = 10
    intermediate_per_product: bool = False
    plain_slack: float = 1e-9

    def __post_init__(self):
        for name in ("chunk_elements", "element_budget"):
            _check(self, name, lambda v: _count(v, 1), "a positive int")
        _check(self, "intermediate_steps", _count, "an int >= 0")
        _check(self, "intermediate_per_product", lambda v: isinstance(v, bool), "a bool")
        _check(self, "plain_slack", lambda v: _real(v) and v >= 0, "a finite float >= 0")
        _check(self, "intermediate", lambda v: v in INTERMEDIATE, f"one of {', '.join(INTERMEDIATE)}")
        _check(self, "arithmetic", lambda v: v in (None, "sound", "plain"), "None, 'sound' or 'plain'")


@dataclass(frozen=True)
class AttackOptions:
    """PGD falsification (``certify.attack.pgd``, and beside branch and bound).

    ``restarts`` x ``steps`` of eps·``step`` (2 x 40 of eps/4, Madry et al.'s schedule as
    ``certify.attack`` has always run it); ``seed``: the generator seed of the random restarts
    (branch and bound gives sample b seed + b). From the leaves of branch and bound: every
    ``leaf_every``-th round, PGD of ``leaf_steps`` steps starts at the worst points of the
    ``leaf_count`` open leaves with the lowest bounds (the values behind
    docs/certify/bab.notes.md). ``enabled``: False turns falsification off in branch and bound
    (a sample is then certified or unknown)."""

    restarts: int = 2
    steps: int = 40
    seed: int = 0
    step: float = 0.25
    leaf_every: int = 2
    leaf_count: int = 8
    leaf_steps: int = 20
    enabled: bool = True

    def __post_init__(self):
        for name in ("restarts", "steps", "leaf_steps"):
            _check(self, name, _count, "an int >= 0")
        for name in ("leaf_every", "leaf_count"):
            _check(self, name, lambda v: _count(v, 1), "a positive int")
        _check(self, "seed", lambda v: isinstance(v, int) and not isinstance(v, bool), "an int")
        _check(self, "step", lambda v: _real(v) and v > 0, "a positive finite float")
        _check(self, "enabled", lambda v: isinstance(v, bool), "a bool")


@dataclass(frozen=True)
class BabOptions:
    """Branch and bound (``certify.bab``): one sample is searched for at most ``timeout``
    seconds (None: no time budget, only ``max_leaves``; ``certify.verify`` needs one of them).

    ``batch``: leaves split per round (twice as many children bounded at once); a round that
    runs out of the device's memory puts its leaves back and later rounds split half as many.
    ``max_leaves``: leaves bounded per sample before the search stops (unknown).
    ``alpha_steps``: Adam steps per leaf on the parent-warm-started slopes; ``root_alpha_steps``:
    at the root (alpha-CROWN's 20); ``lr``: their rate (alpha-CROWN's 0.1).
    ``beta``: the split constraints enter the leaves' bounds with optimised multipliers
    (beta-CROWN; False: only through the tightened neuron bounds).
    ``refine``: in a leaf, inputs of nonlinear nodes downstream of a split with at most this
    many neurons are re-bounded by CROWN (larger ones by IBP only). 0: cheaper leaves
    outweigh the tighter ones (mnist-vit1, 60 s: image 11 at eps 0.005 is certified with 1429
    leaves, against lower margin -0.0045 after 999 leaves at refine=128;
    docs/certify/bab.notes.md).
    ``intermediate``: the root's intermediate bounds (``ROOT_INTERMEDIATE``); "auto": "full",
    then "alpha" on the ``root_optimised`` most sensitive elements of each split node, within
    ``root_share`` of the budget left, once the root is left open and the first attacks fail.
    ``root_optimised`` 0.25: on mnist-vit1 image 4 at eps 0.02 optimising 25 % certified at the
    root in 30 s, all of them in 70 s, 10 % left -0.12. ``root_share`` 0.5: without a cap, on
    mnist-vit2 the optimisation took the whole 60 s and ran over it by up to 15 s, so no leaf
    was split (both docs/certify/bab.notes.md).
    ``vertex``: Vertex-Softmax intervals at the root and P·V bounds in the leaves (the method
    "bab-vertex"; off: on mnist-vit1 no leaf had Vertex win and its root took 17 s per sample
    against 2 s, docs/certify/bab.notes.md).
    ``branching``: the rule that picks the neuron to split (``certify.bab.branching.RULES``:
    "gain", the first-order gain estimate, or "widest").
    ``attack``: the falsification beside the search; ``propagation``: how the root is bounded
    (its ``intermediate`` is replaced by the one above)."""

    timeout: float | None = None
    batch: int = 16
    max_leaves: int = 1_000_000
    alpha_steps: int = 4
    root_alpha_steps: int = 20
    lr: float = 0.1
    beta: bool = True
    refine: int = 0
    intermediate: str = "auto"
    root_optimised: float = 0.25
    root_share: float = 0.5
    vertex: bool = False
    branching: str = "gain"
    attack: AttackOptions = field(default_factory=AttackOptions)
    propagation: PropagationOptions = field(default_factory=PropagationOptions)

    def __post_init__(self):
        _check(self, "timeout", lambda v: v is None or (_real(v) and v > 0), "None or a positive finite number "
               "of seconds")
        for name in ("batch", "max_leaves"):
            _check(self, name, lambda v: _count(v, 1), "a positive int")
        for name in ("alpha_steps", "root_alpha_steps", "refine"):
            _check(self, name, _count, "an int >= 0")
        _check(self, "lr", lambda v: _real(v) and v > 0, "a positive finite float")
        for name in ("root_optimised", "root_share"):
            _check(self, name, lambda v: _real(v) and 0 < v <= 1, "a fraction in (0, 1]")
        for name in ("beta", "vertex"):
            _check(self, name, lambda v: isinstance(v, bool), "a bool")
        _check(self, "intermediate", lambda v: v in ROOT_INTERMEDIATE, f"one of {', '.join(ROOT_INTERMEDIATE)}")
        _check(self, "branching", lambda v: v in ("gain", "widest"), "'gain' or 'widest'")
        _check(self, "attack", lambda v: isinstance(v, AttackOptions), "an AttackOptions")
        _check(self, "propagation", lambda v: isinstance(v, PropagationOptions), "a PropagationOptions")


@dataclass(frozen=True)
class BoundOptions:
    """How ``certify.verify`` runs a bound-only method: ``batch_size`` samples bounded at once
    (8; each method may cap it, e.g. auto_LiRPA at 1) and the ``propagation`` options."""

    batch_size: int = 8
    propagation: PropagationOptions = field(default_factory=PropagationOptions)

    def __post_init__(self):
        _check(self, "batch_size", lambda v: _count(v, 1), "a positive int")
        _check(self, "propagation", lambda v: isinstance(v, PropagationOptions), "a PropagationOptions")


def describe(options) -> dict:
    """The options as a plain dict (nested options as dicts), e.g. for a result's record."""
    return {f.name: describe(getattr(options, f.name)) if hasattr(getattr(options, f.name), "__dataclass_fields__")
            else getattr(options, f.name) for f in fields(options)}

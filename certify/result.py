"""What every verification method takes and returns: a ``Problem`` and a ``CertResult``.

``certify.verify`` (and ``verify_box``, ``verify_text``) validate their arguments into a
``Problem``; each method of ``certify.methods.METHODS`` turns it into a ``CertResult``: lower
bounds of the margins and, per sample, a ``SampleVerdict`` (bound-only methods: certified or
unknown; branch and bound: certified, falsified or unknown).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from softcert.certify.graph import Graph
from softcert.certify.spec import DOMAIN

STATUSES = ("certified", "falsified", "unknown")


@dataclass(frozen=True)
class Problem:
    """One validated query on classification margins. ``model``: the torch module (None for
    a bare graph); ``graph``: its traced graph; ``centre`` (B, *graph input shape without the
    traced batch axis): the inputs; ``lower``, ``upper``: the input box around each (the L∞
    ball of radius ``eps`` clipped to ``domain`` and rounded outward, or an explicit box with
    ``eps`` None); ``label`` (B,) int64 labels, checked against the graph's classes;
    ``model_input``: what the auto_LiRPA baselines run on (the model; None where they cannot
    run, e.g. on embeddings)."""

    model: torch.nn.Module | None
    graph: Graph
    centre: torch.Tensor
    lower: torch.Tensor
    upper: torch.Tensor
    label: torch.Tensor
    eps: float | None = None
    domain: tuple | None = None
    model_input: object = None

    @property
    def size(self):
        return self.centre.shape[0]


@dataclass(frozen=True)
class SampleVerdict:
    """One sample's verdict: ``status`` in STATUSES; ``counterexample``: for "falsified", the
    input (model input shape, the model's dtype values as float64) where the model, in its own
    dtype, has a margin < 0; ``seconds``; ``leaves``: branch-and-bound leaves bounded (0 for
    bound-only methods); ``vertex_leaves``: of those, leaves where the Vertex-Softmax P·V
    bound beat McCormick."""

    status: str
    counterexample: torch.Tensor | None = None
    seconds: float = 0.0
    leaves: int = 0
    vertex_leaves: int = 0


@dataclass(frozen=True)
class CertResult:
    """lower_margin[b, j] <= min over the input set of z_y - z_j (0 at j = y); certified[b]
    iff every j != y has a positive lower bound. ``eps``: the ball radius (None for a box);
    ``domain``: the input domain the ball was clipped to (None: unclipped);
    ``assumptions``: the method's, as registered (ours: the arithmetic model
    ``certify.crown.ARITHMETIC``, under which every bound encloses the real-arithmetic value).
    ``verdicts``: one ``SampleVerdict`` per sample (``status``, ``falsified``, ``counts``)."""

    lower_margin: torch.Tensor
    certified: torch.Tensor
    method: str
    eps: float | None
    seconds: float
    note: str = ""
    assumptions: str = field(default="", repr=False)
    domain: tuple | None = DOMAIN
    label: torch.Tensor | None = None  # (B,) the labels y
    verdicts: tuple = ()

    def __post_init__(self):
        if not self.verdicts:
            # bound-only methods: certified or unknown, nothing else is known
            object.__setattr__(self, "verdicts", tuple(SampleVerdict("certified" if c else "unknown")
                                                       for c in self.certified.tolist()))

    @property
    def worst_margin(self):
        """min_{j != y} lower_margin (B,). Without ``label``, every exact 0 counts as y's own
        column (a bound of exactly 0 elsewhere would then be skipped)."""
        m = self.lower_margin.clone()
        if self.label is None:
            m[self.lower_margin == 0] = torch.inf
        else:
            m[torch.arange(len(self.label), device=m.device), self.label] = torch.inf
        return m.min(1).values

    @property
    def status(self):
        """Per sample: "certified", "falsified" or "unknown"."""
        return tuple(v.status for v in self.verdicts)

    @property
    def falsified(self):
        return torch.tensor([v.status == "falsified" for v in self.verdicts], dtype=torch.bool,
                            device=self.certified.device)

    def counts(self) -> dict:
        """{status: number of samples} for every status."""
        return {s: sum(v.status == s for v in self.verdicts) for s in STATUSES}

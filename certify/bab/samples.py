"""Branch and bound on classification margins, one sample at a time (methods "bab" and
"bab-vertex" of ``certify.methods``).

Each sample's margins z_y - z_j (j != y) are the rows of one ``Rows`` property, one group per
class j, over the ball's outward box (``spec.input_box``), searched by
``certify.bab.search.branch_and_bound`` within ``BabOptions.timeout`` seconds. Falsification:
PGD with restarts, and PGD started at each leaf's worst point (the minimiser over the box of
the leaf's linear lower bound), both projected onto the ball's points of the model's dtype
(``spec.inner_box``); a counterexample counts only once ``attack.confirm`` holds: in the ball
as written (exact rationals) and z_j > z_y from the model itself in its own dtype.
"""
from __future__ import annotations

import copy
import dataclasses
import time

import torch

from softcert.certify.attack import confirm, margins, model_dtype, pgd
from softcert.certify.bab.engine import Rows
from softcert.certify.bab.search import branch_and_bound
from softcert.certify.graph_cache import classes_of
from softcert.certify.result import CertResult, SampleVerdict
from softcert.certify.spec import inner_box, margin_spec

ASSUMPTIONS = ("certified: every BaB leaf proved by certify.crown bounds (the arithmetic of "
               "certify.crown.ARITHMETIC) on the float64 real-arithmetic traced graph; leaves cover the input "
               "box by construction (split [lo, hi] at p into [lo, p] and [p, hi]). falsified: a point of the "
               "model's dtype in the ball as written (exact rationals; x and eps the given floats) where the "
               "model itself, in its own dtype, gives some z_j > z_y. unknown: neither within the time budget.")


def _attack_from(model64, starts, label, box, eps, options):
    """PGD on the worst margin from the given start points, projected onto ``box`` (lo, hi):
    ``options.leaf_steps`` steps of eps·``options.step``."""
    lo, hi = box
    x = torch.minimum(torch.maximum(starts, lo), hi)
    lab = label.expand(len(x))
    step = eps * options.step
    other = torch.ones(1, margins(model64, lo, label).shape[1], dtype=torch.bool, device=lo.device)
    other[0, label] = False
    for _ in range(options.leaf_steps):
        x = x.detach().requires_grad_(True)
        m = margins(model64, x, lab)
        w = torch.where(other, m, torch.inf).min(1).values
        if (w < 0).any():
            return x[int(w.argmin())].detach()
        (grad,) = torch.autograd.grad(-w.sum(), x)
        x = torch.minimum(torch.maximum(x + step * grad.sign(), lo), hi)
    with torch.no_grad():
        m = margins(model64, x, lab)
    w = torch.where(other, m, torch.inf).min(1).values
    return x[int(w.argmin())].detach() if (w < 0).any() else None


@dataclasses.dataclass(frozen=True)
class _Sample:
    """What the falsifier of sample b needs: the float64 and own-dtype models, the input
    (1, ...), label (1,), the ball's points of the model's dtype, eps, domain, deadline."""

    model64: torch.nn.Module
    own: torch.nn.Module
    x: torch.Tensor
    label: torch.Tensor
    box: tuple
    eps: float
    domain: tuple | None
    deadline: float

    def falsify(self, starts, options):
        """A confirmed counterexample or None: PGD with restarts (``starts`` None) or from the
        given start points (P, 1, ...)."""
        if not options.enabled or time.monotonic() > self.deadline:
            return None
        if starts is None:
            xa, m = pgd(self.model64, self.x, self.label, self.eps, options, domain=self.domain, box=self.box)
            m[0, self.label] = torch.inf
            found = xa if bool((m < 0).any()) else None
        else:
            found = _attack_from(self.model64, starts.squeeze(1), self.label, self.box, self.eps, options)
            found = None if found is None else found.unsqueeze(0)
        return None if found is None else confirm(self.own, found, self.x, self.label, self.eps, self.domain, self.box)


def search_margins(method, problem, options, progress=None) -> CertResult:
    """Three-valued verdicts for ``problem`` (a ``certify.result.Problem`` on an L∞ ball), each
    sample within ``options.timeout`` seconds or ``options.max_leaves`` leaves: certified
    (every margin proved positive on every leaf), falsified (a counterexample in the ball
    confirmed on the model in its own dtype) or unknown; a model with one logit is certified
    (no other class). ``method``: the registered ``Method`` (its name and assumptions).
    ``progress``: called with 1 after each sample."""
    graph, x, eps, domain = problem.graph, problem.centre, problem.eps, problem.domain
    model64 = copy.deepcopy(problem.model).double().eval()
    own = copy.deepcopy(problem.model).eval()  # the model in its own dtype: counterexamples are confirmed on it
    out, classes = graph.nodes[graph.output].shape, classes_of(graph)
    plo, phi = inner_box(x, eps, domain, model_dtype(own))  # the ball's points of the model's dtype: for attacks
    attack = options.attack
    verdicts, lower = [], []
    t_start = time.perf_counter()
    for b in range(problem.size):
        t0 = time.monotonic()
        deadline = t0 + (float(options.timeout) if options.timeout is not None else float("inf"))
        lab = problem.label[b:b + 1]
        lm = torch.zeros(classes, dtype=torch.float64, device=x.device)
        if classes == 1:
            # no other class: the margin specification is empty, so it holds (as crown answers)
            verdicts.append(SampleVerdict("certified"))
            lower.append(lm)
            if progress is not None:
                progress(1)
            continue
        keep = [j for j in range(classes) if j != int(lab)]
        rows = Rows(margin_spec(lab, classes).reshape(classes, *out)[keep], torch.zeros(len(keep), device=x.device),
                    torch.arange(len(keep), device=x.device))
        sample = _Sample(model64, own, x[b:b + 1], lab, (plo[b:b + 1], phi[b:b + 1]), eps, domain, deadline)
        seeded = dataclasses.replace(attack, seed=attack.seed + b)
        res = branch_and_bound(graph, problem.lower[b:b + 1].unsqueeze(1), problem.upper[b:b + 1].unsqueeze(1), rows,
                               deadline=deadline, options=options,
                               falsify=lambda starts, s=sample, o=seeded: s.falsify(starts, o),
                               centre=x[b:b + 1].unsqueeze(1))
        lm[keep] = torch.tensor(res.lower, dtype=torch.float64, device=x.device)
        if res.counterexample is not None:
            status, cex = "falsified", res.counterexample.reshape(x.shape[1:])
        else:
            status, cex = ("certified" if all(res.proved) else "unknown"), None
        verdicts.append(SampleVerdict(status, cex, time.monotonic() - t0, res.bounded, res.vertex_leaves))
        lower.append(lm)
        if progress is not None:
            progress(1)
    lower_margin = torch.stack(lower)
    certified = torch.tensor([v.status == "certified" for v in verdicts], dtype=torch.bool, device=x.device)
    return CertResult(lower_margin, certified, method.name, eps, time.perf_counter() - t_start, "",
                      method.assumptions, domain, problem.label, tuple(verdicts))

"""PGD on the margin (Madry et al. 2018) with random restarts: the falsification side.

Each step moves x by eps·``step`` · sign(∇) (``certify.options.AttackOptions``; eps/4 by
default) of the worst margin loss -min_{j≠y}(z_y - z_j), projected onto the points of the L∞
ball, clipped to the input domain, as written (x and eps the given floats taken exactly:
``spec.inner_box``; the outward-rounded ``input_box`` is for bounding only). PGD runs on a
float64 copy; a point is a counterexample (VNN-COMP "sat") only once ``confirm`` holds:
rounded to the model's own dtype it lies in the ball (exact rationals, ``spec.in_ball``) and
the model itself, in that dtype, gives some z_j > z_y. A sample is "unsat" only when a sound
method certified it.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F

from softcert.certify.ops import tensor_of
from softcert.certify.options import AttackOptions
from softcert.certify.spec import DOMAIN, check_domain, check_eps, check_images, check_labels, in_ball, inner_box
from softcert.certify.trace import Logits, logits_of


def model_dtype(model):
    """The dtype the model computes in: its first parameter's (or floating buffer's)."""
    # a parameter-free module (e.g. a GraphModule keeps its weights as buffers) has the dtype
    # of its buffers; float32 there would evaluate margins at rounded inputs
    t = next(iter(model.parameters()), None)
    if t is None:
        t = next((b for b in model.buffers() if b.is_floating_point()), None)
    return torch.get_default_dtype() if t is None else t.dtype


def logits(model, x):
    """The model's logits (B, K) as float64, evaluated in the model's dtype."""
    z = Logits(model)(x.to(model_dtype(model)))
    return z.reshape(z.shape[0], -1).to(torch.float64)


def margins(model, x, label):
    """z_y - z_j for all j (B, K), evaluated in the model's dtype."""
    z = logits(model, x)
    return z.gather(1, label[:, None]) - z


def pgd(model, x, label, eps, options=AttackOptions(), *, domain=DOMAIN, box=None):
    """Worst (smallest) margins found by PGD: returns (x_adv (B,...), margins (B, K)).
    ``options`` (``certify.options.AttackOptions``): ``restarts`` x ``steps`` sign steps of
    eps·``step``, random restarts drawn from a generator seeded ``seed`` (the first restart
    starts at x; the draws are made on the CPU and moved to x's device, so every device starts
    from the same points). Steps are projected onto ``box`` (lo, hi), by default the float64
    points of the ball as written (``spec.inner_box``)."""
    _check_options(options)
    lo, hi = inner_box(x, eps, domain) if box is None else box
    step = eps * options.step  # eps·0.25 == eps/4 exactly: the default schedule is unchanged
    gen = torch.Generator(device="cpu").manual_seed(options.seed)
    best_x, best_m = x.clone(), margins(model, x, label).detach()
    other = torch.ones_like(best_m, dtype=torch.bool)
    other[torch.arange(len(label), device=other.device), label] = False
    worst = lambda m: torch.where(other, m, torch.inf).min(1).values  # noqa: E731
    for r in range(options.restarts):
        xa = lo + (hi - lo) * torch.rand(x.shape, generator=gen, dtype=x.dtype, device="cpu").to(x.device) \
            if r else x.clone()
        for _ in range(options.steps + 1):
            xa = xa.detach().requires_grad_(True)
            m = margins(model, xa, label)
            w = worst(m)
            better = w < worst(best_m)
            best_m = torch.where(better[:, None], m.detach(), best_m)
            best_x = torch.where(better.view(-1, *[1] * (x.dim() - 1)), xa.detach(), best_x)
            if eps == 0:
                break
            (g,) = torch.autograd.grad(-w.sum(), xa)
            xa = torch.minimum(torch.maximum(xa + step * g.sign(), lo), hi)
    return best_x.detach(), best_m


def pgd_cross_entropy(model, y, box, step, steps):
    """A point of ``box`` = (lo, hi) from ``steps`` sign steps of ``step`` up the cross-entropy
    of the model's logits at labels ``y``, projected onto the box, from a uniform random start
    drawn from torch's global generator: the adversarial points of PGD training (Madry et al.
    2018) and of SABR's small boxes (certify.training). One start, no best-point tracking: a
    training loss wants a point, not a confirmed counterexample (``pgd`` is that side). The
    model runs in whatever mode the caller left it."""
    lo, hi = box
    xa = lo + (hi - lo) * torch.rand_like(lo)
    for _ in range(steps):
        xa.requires_grad_(True)
        (g,) = torch.autograd.grad(F.cross_entropy(logits_of(model(xa)).reshape(len(xa), -1), y), xa)
        xa = torch.minimum(torch.maximum(xa.detach() + step * g.sign(), lo), hi)
    return xa.detach()


def _check_options(options):
    if not isinstance(options, AttackOptions):
        raise ValueError(f"options: expected a certify.options.AttackOptions, got {type(options).__name__}")


def confirm(model, point, x, label, eps, domain=DOMAIN, box=None):
    """The counterexample, or None: ``point`` (1, ...) rounded to the model's dtype and moved
    into ``box`` (that dtype's points of the ball, ``spec.inner_box``; computed when None),
    when it lies in the ball as written (exact rationals) and the model itself, in its own
    dtype, gives z_j > z_y for some j (as a float64 tensor of the rounded point)."""
    dtype = model_dtype(model)
    lo, hi = inner_box(x, eps, domain, dtype) if box is None else box
    xd = torch.minimum(torch.maximum(point.to(dtype).double(), lo), hi)
    if not in_ball(xd, x, eps, domain):
        return None  # the dtype has no point there (lo > hi) or the box was not the ball's
    with torch.no_grad():
        m = margins(model, xd, label)  # exact signs: the model's own outputs, compared
    m[:, label] = torch.inf
    return xd if bool((m < 0).any()) else None


@dataclass(frozen=True)
class AttackResult:
    """Per-sample verdicts: 'unsat' (certified), 'sat' (counterexample found), 'unknown'."""

    status: tuple
    min_margin: torch.Tensor  # smallest PGD margin min_{j≠y} (B,), of the float64 copy in the ball
    x_adv: torch.Tensor  # PGD's point; for "sat", the confirmed one (the model's dtype, in the ball)
    eps: float
    method: str = "pgd"
    domain: tuple = DOMAIN
    assumptions: str = field(default="PGD margin attack in the L∞ ball clipped to the input domain", repr=False)

    @property
    def falsified(self):
        return torch.tensor([s == "sat" for s in self.status], device=self.min_margin.device)


def attack(model, x, label, eps, certified=None, *, options=AttackOptions(), domain=DOMAIN) -> AttackResult:
    """PGD with restarts (``pgd`` with ``options``, a ``certify.options.AttackOptions``) in the
    L∞ ball clipped to ``domain`` (x must lie in it; None: no clipping) on any model whose
    output is logits (see ``certify.trace.logits_of``). With ``certified`` (bool (B,)),
    certified samples are 'unsat'; a sample both certified and falsified would be a soundness
    bug and raises RuntimeError. Results are on x's device (the model's)."""
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
    _check_options(options)
    domain = None if domain is None else check_domain(domain)
    eps = check_eps(eps)
    x = check_images(model, x, domain)
    model64 = copy.deepcopy(model).double().eval()  # margins in float64, like the bounds
    own = copy.deepcopy(model).eval()  # the model in its own dtype, to confirm
    with torch.no_grad():
        classes = logits(model64, x[:1]).shape[1]
    label = check_labels(label, x.shape[0], classes, x.device)
    box = inner_box(x, eps, domain, model_dtype(own))  # points PGD may return: the model's dtype
    xa, m = pgd(model64, x, label, eps, options, domain=domain, box=box)
    other = torch.ones_like(m, dtype=torch.bool)
    other[torch.arange(len(label), device=other.device), label] = False
    mm = torch.where(other, m, torch.inf).min(1).values
    cert = torch.zeros(len(label), dtype=torch.bool, device=x.device) if certified is None else tensor_of(certified)
    status, xs = [], []
    for b, (c, v) in enumerate(zip(cert.tolist(), mm.tolist())):
        cex = None if v >= 0 else confirm(own, xa[b:b + 1], x[b:b + 1], label[b:b + 1], eps, domain,
                                         (box[0][b:b + 1], box[1][b:b + 1]))
        if c and v < 0:
            raise RuntimeError("soundness violation: a certified sample was falsified")
        status.append("unsat" if c else ("sat" if cex is not None else "unknown"))
        xs.append(xa[b:b + 1] if cex is None else cex)
    return AttackResult(tuple(status), mm, torch.cat(xs), eps, domain=domain)

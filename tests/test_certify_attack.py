"""Counterexamples of certify.attack and certify.bab lie in the ball as written and violate
the margin in the model's own precision. Oracles: exact rationals of x, eps and the point
(fractions.Fraction), the model itself run in its own dtype, and for linear models the exact
minimum margin over the ball (rationals of the float weights)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch
from torch import nn

from softcert import certify
from softcert.certify.attack import attack, pgd, pgd_cross_entropy
from softcert.certify.options import AttackOptions, BabOptions
from softcert.certify.result import STATUSES


def linear(weight, bias, dtype=torch.float64):
    m = nn.Linear(len(weight[0]), len(weight)).to(dtype)
    with torch.no_grad():
        m.weight.copy_(torch.tensor(weight, dtype=torch.float64))
        m.bias.copy_(torch.tensor(bias, dtype=torch.float64))
    return m.eval()


def in_ball(point, x0, eps):
    """|point - x0| <= eps in exact rationals, coordinate by coordinate."""
    return all(abs(Fraction(v) - Fraction(c)) <= Fraction(eps)
               for v, c in zip(point.flatten().tolist(), x0.flatten().tolist()))


def check_counterexample(model, point, x0, label, eps):
    """The oracle: point (any shape of one input) is a value of the model's dtype, in the
    L∞ ball as written, and the model in its own dtype gives some z_j > z_label."""
    dtype = next(model.parameters()).dtype
    p = point.reshape(1, -1).double()
    assert torch.equal(p.to(dtype).double(), p), "not a value of the model's dtype"
    assert in_ball(p, x0, eps), f"{p.tolist()} outside the ball around {x0.tolist()}"
    with torch.no_grad():
        z = model(p.to(dtype)).flatten().tolist()
    assert any(z[j] > z[label] for j in range(len(z)) if j != label), f"no violation in the model's dtype: {z}"


# ---------------------------------------------------------------- the cases
def test_near_tie_on_the_ball_edge_is_not_falsified():
    """z0 = x + 2^-60, z1 = 0.25 at x = 0.5, eps = 0.25: robust (margin >= 2^-60 in reals and
    in float64). It was "falsified" at 0.25 - 2^-55, outside the ball (input_box rounds out)."""
    model = linear([[1.0], [0.0]], [2.0 ** -60, 0.25])
    x = torch.tensor([[0.5]], dtype=torch.float64)
    r = certify.verify(model, x, torch.tensor([0]), 0.25, "bab", domain=None, options=BabOptions(timeout=10))
    assert r.status[0] != "falsified" and r.verdicts[0].counterexample is None
    a = attack(model, x, torch.tensor([0]), 0.25, domain=None)
    assert a.status[0] != "sat"
    assert in_ball(a.x_adv[0], x[0], 0.25)


def test_float32_counterexamples_are_float32_points_of_the_ball():
    """A float32 model, ball [0.2, 0.8] around 0.5 (0.2 is no float32): z1 = 0.3 beats z0 = x
    below 0.3. The counterexample is a float32 inside the ball, violated in float32."""
    model = linear([[1.0], [0.0]], [0.0, 0.3], torch.float32)
    x = torch.tensor([[0.5]], dtype=torch.float64)
    r = certify.verify(model, x, torch.tensor([0]), 0.3, "bab", domain=None, options=BabOptions(timeout=10))
    assert r.status == ("falsified",)
    check_counterexample(model, r.verdicts[0].counterexample, x, 0, 0.3)
    a = attack(model, x, torch.tensor([0]), 0.3, domain=None)
    assert a.status == ("sat",)
    check_counterexample(model, a.x_adv[0], x, 0, 0.3)


def test_violated_only_between_float32_points_is_not_falsified():
    """float32 z0 = x, z1 = 0.25 + 2^-25 (the float32 after 0.25), ball [0.25 + 2^-40, ...]:
    real points below z1 violate, but the least float32 in the ball is z1 itself (a tie): no
    counterexample in the model's own precision."""
    from softcert.certify.spec import inner_box

    b1 = float(np.nextafter(np.float32(0.25), np.float32(1)))
    model = linear([[1.0], [0.0]], [0.0, b1], torch.float32)
    x, eps = torch.tensor([[0.5]], dtype=torch.float64), 0.25 - 2.0 ** -40
    assert inner_box(x, eps, None, torch.float32)[0].item() == b1
    r = certify.verify(model, x, torch.tensor([0]), eps, "bab", domain=None, options=BabOptions(timeout=5))
    assert r.status == ("unknown",)
    assert attack(model, x, torch.tensor([0]), eps, domain=None).status == ("unknown",)


def test_one_logit_is_certified_as_crown_says():
    """A single logit: no other class, the margin specification is empty (it crashed bab)."""
    model = linear([[1.0, -2.0]], [0.5])
    x = torch.tensor([[0.1, 0.2]], dtype=torch.float64)
    crown = certify.verify(model, x, torch.tensor([0]), 0.1, domain=None)
    r = certify.verify(model, x, torch.tensor([0]), 0.1, "bab", domain=None, options=BabOptions(timeout=5))
    assert bool(crown.certified[0]) and r.status == ("certified",)
    assert torch.equal(r.lower_margin[0], torch.zeros(1, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_inner_box_is_the_exact_float_hull(dtype):
    """inner_box's ends are in the ball (and domain) exactly; their outer neighbours are not."""
    from softcert.certify.spec import inner_box

    gen = torch.Generator().manual_seed(0)
    x = torch.rand(200, generator=gen, dtype=torch.float64) * 2 - 1
    for eps in (0.1, 0.3, 2.0 ** -30, 1e-17, 0.0):
        lo, hi = inner_box(x, eps, (-0.95, 0.95), dtype)
        for a, b, c in zip(lo.tolist(), hi.tolist(), x.tolist()):
            ends = [max(Fraction(c) - Fraction(eps), Fraction(-0.95)), min(Fraction(c) + Fraction(eps), Fraction(0.95))]
            if a > b:  # no value of dtype in range
                assert Fraction(a) > ends[1] or Fraction(b) < ends[0]
                continue
            assert ends[0] <= Fraction(a) and Fraction(b) <= ends[1]
            t = torch.tensor([a, b], dtype=dtype)
            out = torch.nextafter(t, torch.tensor([-np.inf, np.inf], dtype=dtype)).tolist()
            assert Fraction(out[0]) < ends[0] and Fraction(out[1]) > ends[1]


# ---------------------------------------------------------------- fuzz over near ties
def near_tie_model(rng, n, k, dtype, x0, eps, relu):
    """A linear (or one-hidden-layer ReLU) classifier whose smallest margin over the ball
    (class 0 against 1) is within a tiny offset of 0 (exactly so for the linear model in
    rationals, before the float rounding of the bias)."""
    if relu:
        model = nn.Sequential(nn.Linear(n, 4), nn.ReLU(), nn.Linear(4, k)).to(dtype).eval()
        with torch.no_grad():
            h = torch.relu(model[0](x0.to(dtype)))
            z = model[2](h)
            model[2].bias[1] += (z[0, 0] - z[0, 1]) - eps * float(rng.uniform(0, 2))
        return model, None
    w = rng.integers(-4, 5, (k, n)) / 4
    w[0] = w[1] + np.where(rng.random(n) < 0.5, 0.5, -0.5)
    d = w[0] - w[1]
    offset = [0.0, 2.0 ** -60, -2.0 ** -60, 2.0 ** -30, -2.0 ** -30][rng.integers(5)]
    b = np.zeros(k)
    b[1] = float(d @ x0.numpy().ravel()) - eps * float(np.abs(d).sum()) - offset  # margin_1 min ≈ offset
    model = linear(w.tolist(), b.tolist(), dtype)
    W = [[Fraction(v) for v in row] for row in model.weight.detach().double().tolist()]
    B = [Fraction(v) for v in model.bias.detach().double().tolist()]
    xs = [Fraction(v) for v in x0.flatten().tolist()]
    exact = min(sum((W[0][i] - W[j][i]) * xs[i] - Fraction(eps) * abs(W[0][i] - W[j][i]) for i in range(n))
                + B[0] - B[j] for j in range(1, k))
    return model, exact


@pytest.mark.parametrize("seed", range(3))
def test_near_tie_fuzz(seed):
    """Near-tie linear/ReLU models, float64 and float32, eps with no exact float neighbours:
    every bab "falsified" and attack "sat" passes the oracle; every bab "certified" of a
    linear model has an exact minimum margin > 0."""
    rng = np.random.default_rng(seed)
    seen = {}
    for k in range(6):
        n, classes = int(rng.integers(1, 4)), int(rng.integers(2, 4))
        dtype = [torch.float64, torch.float32][k % 2]
        x0 = torch.tensor(rng.uniform(-1, 1, (1, n)).round(3), dtype=torch.float64)
        eps = [0.25, 0.1, 0.3, 2.0 ** -20][rng.integers(4)]
        model, exact = near_tie_model(rng, n, classes, dtype, x0, eps, relu=bool(k % 3 == 2))
        r = certify.verify(model, x0, torch.tensor([0]), eps, "bab", domain=None,
                           options=BabOptions(timeout=3, max_leaves=50))
        a = attack(model, x0, torch.tensor([0]), eps, domain=None, options=AttackOptions(steps=20))
        seen[r.status[0]] = seen.get(r.status[0], 0) + 1
        if r.status[0] == "falsified":
            check_counterexample(model, r.verdicts[0].counterexample, x0, 0, eps)
        if r.status[0] == "certified" and exact is not None:
            assert exact > 0
        if a.status[0] == "sat":
            check_counterexample(model, a.x_adv[0], x0, 0, eps)
        assert in_ball(a.x_adv[0], x0[0], eps)
    assert set(seen) <= set(STATUSES)


def test_attack_options_are_validated_and_drive_pgd():
    """pgd/attack take their schedule as a certify.options.AttackOptions: anything else (e.g.
    the old positional steps) is a ValueError naming ``options``; the step is
    eps·options.step, so a larger step reaches the ball's corner in fewer steps."""
    model = linear([[1.0], [0.0]], [0.0, 0.3])  # z0 - z1 = x - 0.3: falsified at x <= 0.3
    x, lab = torch.tensor([[0.5]], dtype=torch.float64), torch.tensor([0])
    with pytest.raises(ValueError, match="options"):
        pgd(model, x, lab, 0.25, 40)
    with pytest.raises(ValueError, match="options"):
        attack(model, x, lab, 0.25, options=dict(steps=3), domain=None)
    one = AttackOptions(steps=1, restarts=1)
    _, short = pgd(model, x, lab, 0.25, one, domain=None)  # 0.5 - 0.25/4: not below 0.3
    _, long = pgd(model, x, lab, 0.25, AttackOptions(steps=1, restarts=1, step=1.0), domain=None)
    assert short[0, 1] > 0 > long[0, 1]
    assert attack(model, x, lab, 0.25, options=AttackOptions(steps=1, restarts=1, step=1.0),
                  domain=None).status == ("sat",)


def test_pgd_cross_entropy_stays_in_its_box_and_climbs_the_loss_of_a_linear_model():
    """On this 2-class linear model the cross-entropy's gradient has the same sign everywhere,
    so sign steps as wide as the box reach its loss-maximising corner from any start and stay
    there (the projection is a clamp): the result is that corner, exactly, above the centre's loss."""
    model = linear([[1.0, -1.0], [-1.0, 1.0]], [0.0, 0.0])
    x = torch.tensor([[0.5, 0.5], [0.2, 0.7]], dtype=torch.float64)
    y = torch.tensor([0, 1])
    lo, hi = x - 0.1, x + 0.1
    torch.manual_seed(0)
    point = pgd_cross_entropy(model, y, (lo, hi), 0.2, 3)
    assert bool(((point >= lo) & (point <= hi)).all())
    # the loss-maximising corner: away from class y (x0 small, x1 large for y = 0; the reverse for y = 1)
    corner = torch.stack([torch.stack([lo[0, 0], hi[0, 1]]), torch.stack([hi[1, 0], lo[1, 1]])])
    assert torch.equal(point, corner)
    loss = nn.functional.cross_entropy(model(point), y, reduction="none")
    assert bool((loss > nn.functional.cross_entropy(model(x), y, reduction="none")).all())

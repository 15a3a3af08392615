"""Tests for analysis.safestep: JVP slopes, scaling rule, schedulers, BN/dropout untouched."""
from __future__ import annotations

import copy
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from softcert.analysis.ghosts_models import make_model
from softcert.analysis.safestep import SafeStep, SafeStepController, logit_slopes


def _batch(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)


def _grads(model, x, y):
    model.zero_grad()
    F.cross_entropy(model(x), y).backward()


def test_slopes_match_finite_differences():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10)).double()
    x = torch.rand(8, 64, dtype=torch.float64)
    tang = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    z, a = logit_slopes(model, tang, (x,))
    eps = 1e-6
    with torch.no_grad():
        plus, minus = copy.deepcopy(model), copy.deepcopy(model)
        for (n, p), q in zip(plus.named_parameters(), minus.parameters()):
            p.add_(eps * tang[n])
            q.sub_(eps * tang[n])
        fd = (plus(x) - minus(x)) / (2 * eps)
        assert torch.allclose(z, model(x))
    assert torch.allclose(a, fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("target", [1.0, 0.3])
def test_scaling_rule(target):
    """Applied update = min(1, r pi / max spread(J_z p)) * p, p the bare optimizer's update."""
    model = make_model("MLP+LN", seed=1)
    ref = copy.deepcopy(model)
    x, y = _batch()
    opt = SafeStep(torch.optim.Adam(model.parameters(), lr=0.5), model, target_ratio=target)
    bare = torch.optim.Adam(ref.parameters(), lr=0.5)
    old = [p.detach().clone() for p in model.parameters()]
    _grads(model, x, y)
    _grads(ref, x, y)
    opt.step()
    bare.step()
    p = {n: q.detach() - o for (n, q), o in zip(ref.named_parameters(), old)}
    norm = math.sqrt(sum(float(v.double().pow(2).sum()) for v in p.values()))
    # slopes at the old parameters, along p, with an independent autograd JVP
    before = copy.deepcopy(ref)
    with torch.no_grad():
        for q, o in zip(before.parameters(), old):
            q.copy_(o)
    params = dict(before.named_parameters())
    names = list(params)

    def f(*vals):
        return torch.func.functional_call(before, dict(zip(names, vals)), (x,))

    _, a = torch.autograd.functional.jvp(f, tuple(params[n].detach() for n in names),
                                         tuple(p[n] for n in names))
    spread = float((a.max(1).values - a.min(1).values).max())
    scale = min(1.0, target * math.pi / spread)
    assert scale < 1.0  # lr 0.5 on Adam is a large step: the controller must act
    assert opt.last_scale == pytest.approx(scale, rel=1e-5)
    assert opt.last_update_norm == pytest.approx(norm, rel=1e-5)  # float32 per-tensor norms
    assert opt.last_rho_a == pytest.approx(math.pi / spread * norm, rel=1e-5)
    assert opt.last_ratio == pytest.approx(opt.last_update_norm / opt.last_rho_a, rel=1e-9)
    assert opt.last_rho_a / opt.last_update_norm <= math.pi / spread * (1 + 1e-6)  # float32 slopes
    for q, o, n in zip(model.parameters(), old, names):
        assert torch.allclose(q.detach(), o + scale * p[n], atol=1e-6)


def test_small_steps_are_untouched_and_sgd_works():
    model = make_model("MLP", seed=2)
    ref = copy.deepcopy(model)
    x, y = _batch()
    opt = SafeStep(torch.optim.SGD(model.parameters(), lr=1e-4), model)
    bare = torch.optim.SGD(ref.parameters(), lr=1e-4)
    for _ in range(3):
        _grads(model, x, y)
        _grads(ref, x, y)
        opt.step()
        bare.step()
        assert opt.last_scale == 1.0 and opt.last_ratio < 1.0
    for q, r in zip(model.parameters(), ref.parameters()):
        assert torch.equal(q, r)


def test_scheduler_acts_on_inner_optimizer():
    model = make_model("Linear")
    inner = torch.optim.Adam(model.parameters(), lr=1e-2)
    opt = SafeStep(inner, model)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
    x, y = _batch()
    with warnings.catch_warnings():
        # torch's scheduler warnings (e.g. "lr_scheduler.step() before optimizer.step()") are
        # UserWarnings; not every category: the first optimizer step of a process may import
        # torch._decomp, whose torch.jit.script raises a DeprecationWarning (torch 2.13)
        warnings.simplefilter("error", UserWarning)
        for _ in range(4):
            _grads(model, x, y)
            opt.step()
            sched.step()
    assert inner.param_groups[0]["lr"] == pytest.approx(1e-4)
    assert opt.param_groups is inner.param_groups
    state = opt.state_dict()
    opt2 = SafeStep(torch.optim.Adam(model.parameters(), lr=1.0), model)
    opt2.load_state_dict(state)
    assert opt2.param_groups[0]["lr"] == pytest.approx(1e-4)
    assert opt2.ctrl_state == opt.ctrl_state


def test_batchnorm_stats_and_dropout_rng_untouched():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(64, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Dropout(0.5),
                          nn.Linear(32, 10))
    model.train()
    x, y = _batch()
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    tang = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    rng = torch.get_rng_state()
    z, a = logit_slopes(model, tang, (x,))
    for k, v in model.named_buffers():
        assert torch.equal(v, buffers[k]), k
    assert torch.equal(torch.get_rng_state(), rng)
    assert model.training and all(m.training for m in model.modules())
    assert model[1].track_running_stats
    # the measurement is the deterministic (dropout-off) network with batch statistics
    model[3].eval()
    with torch.no_grad():
        expected = model(x)
    model[3].train()
    assert torch.allclose(z, expected, atol=1e-6)
    # a SafeStep training step updates BN stats exactly once (the user's own forward)
    opt = SafeStep(torch.optim.SGD(model.parameters(), lr=0.1), model)
    before = int(model[1].num_batches_tracked)
    _grads(model, x, y)
    opt.step()
    assert int(model[1].num_batches_tracked) == before + 1


def test_transformer_jvp_uses_math_backend():
    model = make_model("Transformer")
    x, _ = _batch(4)
    tang = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    z, a = logit_slopes(model, tang, (x,))
    assert z.shape == a.shape == (4, 10) and torch.isfinite(a).all()


def test_controller_pure_and_validates():
    ctrl = SafeStepController(target_ratio=0.5)
    s0 = ctrl.init()
    assert s0.step == 0 and math.isnan(s0.rho_a)
    z = torch.zeros(3, 4)
    a = torch.tensor([[0.0, 1.0, 2.0, 3.0]] * 3, dtype=torch.float64) * math.pi  # spread 3 pi: rho(p) = 1/3
    scale, s1 = ctrl.update(s0, z, a, update_norm=2.0)
    assert scale == pytest.approx(0.5 / 3, rel=1e-12) and s1.step == 1
    assert s1.ratio == pytest.approx(3.0, rel=1e-12) and s1.rho_a == pytest.approx(2 / 3, rel=1e-12)
    assert s0.step == 0  # the input state is not mutated
    with pytest.raises(ValueError, match="target_ratio"):
        SafeStepController(target_ratio=0.0)
    with pytest.raises(ValueError, match="method"):
        SafeStepController(method="top2")
    with pytest.raises(ValueError, match="update_norm"):
        ctrl.update(s0, z, a, update_norm=float("nan"))
    with pytest.raises(ValueError, match="optimizer"):
        SafeStep(object(), nn.Linear(2, 2))

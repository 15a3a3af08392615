"""SafeStep edge cases (issue 16): dict / ModelOutput outputs, no silent no-ops, gradient
accumulation, plain inner-optimizer checkpoints, tied and parametrized weights, the scalar
"pi" radius against pi_radius_batch and exact rational arithmetic."""
from __future__ import annotations

import copy
import math
import warnings
from fractions import Fraction

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from softcert.analysis.ghosts import pi_radius_batch
from softcert.analysis.ghosts_models import make_model
from softcert.analysis.safestep import SafeStep, SafeStepGuard, SafeStepWarning, logit_slopes, pi_rho


def _batch(n=32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.rand(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g)


class _Wrapped(nn.Module):
    """The MLP+LN model with its logits inside a dict, a ModelOutput or a tuple."""

    def __init__(self, kind):
        super().__init__()
        self.net = make_model("MLP+LN", seed=1)
        self.kind = kind

    def forward(self, x):
        z = self.net(x)
        if self.kind == "dict":
            return {"loss": None, "logits": z}
        if self.kind == "modeloutput":
            from transformers.modeling_outputs import SequenceClassifierOutput

            return SequenceClassifierOutput(logits=z)
        return (z,)


def _logits(out):
    if isinstance(out, torch.Tensor):
        return out
    return out[0] if isinstance(out, tuple) else out["logits"]


def _one_step(model, x, y, lr=0.5, **kw):
    opt = SafeStep(torch.optim.Adam(model.parameters(), lr=lr), model, **kw)
    opt.zero_grad()
    F.cross_entropy(_logits(model(x)), y).backward()
    opt.step()
    return opt


@pytest.mark.parametrize("kind", ["dict", "modeloutput"])
def test_dict_and_modeloutput_logits_found(kind):
    """Fails on main: _unpack_dual(): argument 'dual' must be Tensor, not dict."""
    x, y = _batch()
    ref = _one_step(make_model("MLP+LN", seed=1), x, y)
    opt = _one_step(_Wrapped(kind), x, y)
    assert ref.last_scale < 1.0
    assert opt.last_scale == pytest.approx(ref.last_scale, rel=1e-5)
    assert opt.last_rho_a == pytest.approx(ref.last_rho_a, rel=1e-5)


def test_output_without_logits_names_logits_fn():
    x, y = _batch()
    with pytest.raises(ValueError, match="logits_fn"):
        _one_step(_Wrapped("tuple"), x, y)
    opt = _one_step(_Wrapped("tuple"), x, y, logits_fn=lambda out: out[0])
    assert opt.last_scale < 1.0
    with pytest.raises(ValueError, match="logits_fn"):
        SafeStep(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=1.0), nn.Linear(2, 2), logits_fn=3)


def test_warns_when_no_batch_was_recorded():
    """Fails on main: the step went through unscaled with no warning (last_ratio nan, scale 1)."""
    model = make_model("MLP+LN", seed=1)
    x, y = _batch()
    opt = SafeStep(torch.optim.Adam(model.parameters(), lr=0.5), model)
    F.cross_entropy(model(x), y).backward()
    opt.step()  # a measured step: the batch was recorded
    assert opt.ctrl_state.measured and opt.last_scale < 1.0
    opt.zero_grad()
    with torch.no_grad():
        model(x)  # evaluation forwards are not training batches
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    with pytest.warns(SafeStepWarning, match="no training batch"):
        opt.step()
    assert not opt.ctrl_state.measured and opt.last_scale == 1.0 and math.isnan(opt.last_ratio)
    # the batch recorded for one step is not reused by the next (a stale batch would measure
    # another function): the following step without a forward warns again
    with pytest.warns(SafeStepWarning):
        opt.step()


def test_eval_mode_training_is_measured():
    """Fails on main: with the model in eval mode SafeStep measured nothing (ratio nan, scale 1)."""
    model = make_model("MLP+LN", seed=1).eval()
    x, y = _batch()
    with warnings.catch_warnings():
        warnings.simplefilter("error", SafeStepWarning)
        opt = _one_step(model, x, y)
    assert opt.ctrl_state.measured and opt.last_scale < 1.0 and math.isfinite(opt.last_ratio)


@pytest.mark.parametrize("accumulation", ["all", "last"])
def test_gradient_accumulation_radius(accumulation):
    """Two micro-batches, the first with 10x larger inputs (larger slope spread). "all" takes
    the radius over both (fails on main, which used the last micro-batch only); "last" is the
    documented cheaper variant."""
    model = make_model("MLP", seed=4)
    x1, y1 = _batch(16, 1, scale=10.0)
    x2, y2 = _batch(16, 2)
    old = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = SafeStep(torch.optim.Adam(model.parameters(), lr=0.2), model, accumulation=accumulation)
    for x, y in ((x1, y1), (x2, y2)):
        (F.cross_entropy(model(x), y) / 2).backward()
    ref = copy.deepcopy(model)
    bare = torch.optim.Adam(ref.parameters(), lr=0.2)
    for p, q in zip(ref.parameters(), model.parameters()):
        p.grad = q.grad.clone()
    bare.step()
    opt.step()
    tang = {n: p.detach() - old[n] for n, p in ref.named_parameters()}
    _, a1 = logit_slopes(ref, tang, (x1,), params=old)
    _, a2 = logit_slopes(ref, tang, (x2,), params=old)
    spread = lambda a: float((a.amax(1) - a.amin(1)).max())  # noqa: E731
    assert spread(a1) > 2 * spread(a2)  # the first micro-batch is the binding one
    want = max(spread(a1), spread(a2)) if accumulation == "all" else spread(a2)
    norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in tang.values()))
    assert opt.ctrl_state.batches == (2 if accumulation == "all" else 1)
    assert opt.last_rho_a == pytest.approx(math.pi / want * norm, rel=1e-4)


def test_plain_inner_checkpoint_loads():
    """Fails on main: KeyError: 'optimizer'."""
    model = make_model("Linear")
    x, y = _batch()
    plain = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(2):
        plain.zero_grad()
        F.cross_entropy(model(x), y).backward()
        plain.step()
    ckpt = plain.state_dict()
    opt = SafeStep(torch.optim.AdamW(model.parameters(), lr=1.0), model)
    opt.load_state_dict(ckpt)
    assert opt.param_groups[0]["lr"] == pytest.approx(3e-3)
    assert opt.optimizer.param_groups is opt.param_groups
    first = next(iter(plain.state.values()))
    mine = opt.state[next(iter(model.parameters()))]
    assert int(mine["step"]) == 2 and torch.allclose(mine["exp_avg"], first["exp_avg"])
    # training continues from the checkpoint, and SafeStep's own round trip still works
    F.cross_entropy(model(x), y).backward()
    opt.step()
    again = SafeStep(torch.optim.AdamW(model.parameters()), model)
    again.load_state_dict(opt.state_dict())
    assert again.ctrl_state == opt.ctrl_state
    with pytest.raises(ValueError, match="state_dict"):
        opt.load_state_dict({"weights": 1})


def test_guard_attach_matches_wrapper():
    """The hook-based guard (used by the callbacks) scales exactly as the wrapper does, within
    float32 rounding of the two runs' identical operations."""
    x, y = _batch()
    m1, m2 = make_model("MLP+LN", seed=5), make_model("MLP+LN", seed=5)
    opt1 = SafeStep(torch.optim.Adam(m1.parameters(), lr=0.5), m1)
    inner = torch.optim.Adam(m2.parameters(), lr=0.5)
    guard = SafeStepGuard(m2).attach(inner)
    for m, o in ((m1, opt1), (m2, inner)):
        o.zero_grad()
        F.cross_entropy(m(x), y).backward()
        o.step()
    assert guard.last_scale < 1.0 and guard.last_scale == pytest.approx(opt1.last_scale, rel=1e-5)
    for p, q in zip(m1.parameters(), m2.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    guard.remove()
    inner.zero_grad()
    F.cross_entropy(m2(x), y).backward()
    inner.step()  # detached: no measurement, no warning
    assert guard.ctrl_state.step == 1
    with pytest.raises(ValueError, match="before_step"):
        guard.after_step()


class _Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(8, 8)
        self.b.weight = self.a.weight  # tied: one parameter, two modules

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


class _Symmetric(nn.Module):
    def forward(self, w):
        return w.triu() + w.triu(1).transpose(0, 1)


@pytest.mark.parametrize("kind", ["tied", "parametrized"])
def test_slopes_tied_and_parametrized_match_finite_differences(kind):
    torch.manual_seed(6)
    if kind == "tied":
        model = _Tied().double()
    else:
        model = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 4)).double()
        nn.utils.parametrize.register_parametrization(model[0], "weight", _Symmetric())
    x = torch.rand(5, 8, dtype=torch.float64)
    tang = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    z, a = logit_slopes(model, tang, (x,))
    eps = 1e-6
    with torch.no_grad():
        plus, minus = copy.deepcopy(model), copy.deepcopy(model)
        for (n, p), q in zip(plus.named_parameters(), minus.parameters()):
            p.add_(eps * tang[n])
            q.sub_(eps * tang[n])
        fd = (plus(x) - minus(x)) / (2 * eps)
    assert torch.allclose(a, fd, rtol=1e-6, atol=1e-7)
    assert model.a.weight is model.b.weight if kind == "tied" else True  # parameters restored
    assert all(isinstance(p, nn.Parameter) for p in model.parameters())


_PI_BELOW = Fraction(314159265358979, 10 ** 14)  # a rational below pi


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=2, max_size=6), min_size=1, max_size=5)
       .filter(lambda rows: len({len(r) for r in rows}) == 1),
       st.sampled_from([torch.float32, torch.float64]))
def test_pi_rho_sound_and_equal_to_pi_radius_batch(rows, dtype):
    a = torch.tensor(rows, dtype=dtype)
    rho = pi_rho(a)
    ref = float(pi_radius_batch(a).min())
    spread = max(Fraction(max(r)) - Fraction(min(r)) for r in a.double().tolist())
    if spread == 0:
        assert rho == math.inf == ref
        return
    assert Fraction(rho) * spread <= _PI_BELOW  # rho <= pi / spread in exact arithmetic
    assert rho <= ref * (1 + 1e-15) and rho >= ref * (1 - 1e-15)  # the same rounding as the batch form
    assert rho >= float(_PI_BELOW / spread) * (1 - 1e-12)  # and not loose


def test_pi_rho_validates():
    with pytest.raises(ValueError, match="slopes"):
        pi_rho(torch.zeros(3))
    with pytest.raises(ValueError, match="finite"):
        pi_rho(torch.tensor([[0.0, float("nan")]]))


def test_reuse_steps_skips_only_far_from_binding_steps():
    """The explicit cheaper variant: small steps reuse the last rho_a for up to k steps; a
    step that could bind (here an LR spike) is measured and scaled as without reuse."""
    model = make_model("MLP+LN", seed=7)
    ref = make_model("MLP+LN", seed=7)
    x, y = _batch()
    opt = SafeStep(torch.optim.Adam(model.parameters(), lr=1e-3), model, reuse_steps=2)
    exact = SafeStep(torch.optim.Adam(ref.parameters(), lr=1e-3), ref)
    stale = []
    for step in range(7):
        if step == 5:
            for o in (opt, exact):
                o.param_groups[0]["lr"] = 1.0
        for m, o in ((model, opt), (ref, exact)):
            o.zero_grad()
            F.cross_entropy(m(x), y).backward()
            o.step()
        stale.append(opt.ctrl_state.stale)
        assert opt.ctrl_state.measured
    assert stale == [False, True, True, False, True, False, False]
    assert opt.last_scale < 1.0 and opt.last_scale == pytest.approx(exact.last_scale, rel=1e-4)
    with pytest.raises(ValueError, match="reuse_steps"):
        SafeStep(torch.optim.Adam(model.parameters()), model, reuse_steps=-1)
    with pytest.raises(ValueError, match="reuse_margin"):
        SafeStep(torch.optim.Adam(model.parameters()), model, reuse_margin=0.0)


def test_parameters_replaced_after_construction_are_measured():
    """Untying a parameter after the guard was built: the JVP uses the new parameter objects
    (the guard's radius equals pi / spread of a fresh logit_slopes)."""
    torch.manual_seed(8)
    x = torch.rand(6, 8)
    model = _Tied()
    guard = SafeStepGuard(model)
    model.b.weight = nn.Parameter(model.a.weight.detach() * 3)  # untie
    params = list(model.parameters())
    old = {n: p.detach().clone() for n, p in model.named_parameters()}
    guard.before_step(params)
    with torch.no_grad():
        for p in params:
            p.add_(0.5 * torch.randn_like(p))
    guard.after_step(inputs=x)
    tang = {n: p.detach() - old[n] for n, p in model.named_parameters()}
    _, a = logit_slopes(model, tang, (x,), params=old)
    norm = math.sqrt(sum(float(t.double().pow(2).sum()) for t in tang.values()))
    spread = float((a.amax(1) - a.amin(1)).max())
    assert guard.last_rho_a == pytest.approx(math.pi / spread * norm, rel=1e-5)

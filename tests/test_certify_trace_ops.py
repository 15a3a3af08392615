"""The torch front end lowers what the model computes, or refuses it with a ValueError:
random operators (a folded draw is one instance, not the model), constant padding with a
non-zero value (a constant, not an element of x), dtype conversions (no-ops to the model's
own dtype or wider are accepted, narrowing and integer casts refused). A fuzz over random
compositions checks the traced graph against the model's own forward."""
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from softcert import certify

F64 = torch.float64
aten = torch.ops.aten


# ---------------------------------------------------------------- random operators
RANDOM = {
    "randn": lambda x: x + 2 * torch.randn(1, x.shape[1], dtype=x.dtype),
    "rand": lambda x: x * (torch.rand(x.shape[1]) > 0.5),
    "randint": lambda x: x + torch.randint(0, 3, (x.shape[1],)),
    "normal": lambda x: x + torch.normal(torch.zeros(x.shape[1], dtype=x.dtype), 1.0),
    "bernoulli": lambda x: x * torch.bernoulli(torch.full((x.shape[1],), 0.5, dtype=x.dtype)),
    "uniform_": lambda x: x + torch.empty(x.shape[1], dtype=x.dtype).uniform_(),
    "randperm": lambda x: x[:, torch.randperm(x.shape[1])],
    "randn_like": lambda x: x + torch.randn_like(x),
    "dropout": lambda x: x + F.dropout(torch.ones(x.shape[1], dtype=x.dtype), 0.5, True),  # on a constant
}


class _Noise(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _noisy(kind):
    return nn.Sequential(nn.Linear(4, 4), _Noise(RANDOM[kind]), nn.Linear(4, 2)).double().eval()


@pytest.mark.parametrize("kind", sorted(RANDOM))
def test_random_operator_is_refused_with_its_module_path(kind):
    with pytest.raises(ValueError, match=rf"random operator aten\.{kind}\S* at '1'"):
        certify.verify(_noisy(kind), torch.full((1, 4), 0.5, dtype=F64), [0], 0.01)


def test_python_random_numbers_are_refused():
    # not a torch operator: the draw reaches the graph as a Python float; two runs differ
    m = _Noise(lambda x: x * random.gauss(1.0, 1.0))
    with pytest.raises(ValueError, match="two forward passes at the same input give different outputs"):
        certify.trace(m, torch.rand(1, 2, dtype=F64))


def test_eval_mode_dropout_is_the_identity():
    m = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 2)).double().eval()
    x = torch.rand(3, 4, dtype=F64)
    g = certify.trace(m, x)
    torch.testing.assert_close(certify.forward(g, x.unsqueeze(1)).squeeze(1), m(x).detach(), rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- constant padding
class _Pad(nn.Module):
    """z = (-p_0, -0.5) with p = pad(x, (1, 0), 1.0): z_0 = -1 everywhere, class 1 wins."""

    def __init__(self, functional):
        super().__init__()
        self.functional = functional

    def forward(self, x):
        p = F.pad(x, (1, 0), value=1.0) if self.functional else aten.constant_pad_nd(x, (1, 0), 1.0)
        return torch.cat([-p[:, :1], torch.full_like(p[:, :1], -0.5)], 1)


@pytest.mark.parametrize("functional", [False, True], ids=["constant_pad_nd", "F.pad"])
def test_constant_pad_value_is_a_constant_not_a_position(functional):
    m = _Pad(functional)
    x = torch.tensor([[0.2, 0.5]], dtype=F64)
    r = certify.verify(m, x, [0], 0.05, method="crown")
    assert not r.certified.any()
    assert float(r.lower_margin[0, 1]) <= -0.5  # the true margin z_0 - z_1 is -0.5 on the whole ball
    g = certify.trace(m, x)
    torch.testing.assert_close(certify.forward(g, x.unsqueeze(1)).squeeze(1), m(x), rtol=0, atol=0)


# ---------------------------------------------------------------- dtype conversions
class _Cast(nn.Module):
    def __init__(self, kind, dtype):
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(4, 3).to(dtype)
        self.register_buffer("ints", torch.zeros(1, dtype=torch.int64))

    def forward(self, x):
        k, own = self.kind, self.lin.weight.dtype
        if k == "float":
            x = x.float().to(own)
        elif k == "to-weight-dtype":
            x = x.to(self.lin.weight.dtype)
        elif k == "double":
            x = x.double().to(own)
        elif k == "half":
            x = x.half().to(own)
        elif k == "bfloat16":
            x = x.to(torch.bfloat16).to(own)
        elif k == "long":
            x = x.long().to(own)
        elif k == "type_as-int":
            x = (10 * x).type_as(self.ints).type_as(x)
        elif k == "bool":
            x = x.bool().to(own)
        y = self.lin(x)
        return y.float() if k == "logits-float" else y


@pytest.mark.parametrize("kind", ["float", "to-weight-dtype", "double", "logits-float"])
def test_noop_conversions_of_a_float32_model_are_accepted(kind):
    torch.manual_seed(0)
    plain = _Cast("none", torch.float32).eval()
    m = _Cast(kind, torch.float32).eval()
    m.load_state_dict(plain.state_dict())
    x = torch.rand(2, 4, dtype=F64)
    r, ref = certify.verify(m, x, [0, 1], 0.01), certify.verify(plain, x, [0, 1], 0.01)
    assert torch.equal(r.lower_margin, ref.lower_margin)


@pytest.mark.parametrize("dtype,kind", [(torch.float32, "half"), (torch.float32, "bfloat16"),
                                        (torch.float32, "long"), (torch.float32, "type_as-int"),
                                        (torch.float32, "bool"), (torch.float64, "float"),
                                        (torch.float64, "logits-float"), (torch.float64, "type_as-int")])
def test_narrowing_conversions_are_refused(dtype, kind):
    m = _Cast(kind, dtype).eval()
    with pytest.raises(ValueError, match=r"dtype conversion aten\.\S+ to torch\.\w+ at the model's own forward \(no submodule\).*: the model computes in torch\.float"):
        certify.verify(m, torch.rand(1, 4, dtype=F64), [0], 0.01)


class _Trunc(nn.Module):
    """z_0 = trunc(10 x_0) - 4.5, z_1 = 0: at x_0 = 0.47 z_0 = -0.5 on the ball of radius 0.01."""

    def __init__(self):
        super().__init__()
        self.register_buffer("ints", torch.zeros(1, dtype=torch.int64))

    def forward(self, x):
        z0 = (10 * x[:, :1]).type_as(self.ints).type_as(x) - 4.5
        return torch.cat([z0, torch.zeros_like(z0)], 1)


def test_type_as_integer_is_not_the_identity():
    with pytest.raises(ValueError, match=r"aten\.type_as to torch\.int64"):
        certify.verify(_Trunc(), torch.tensor([[0.47]], dtype=F64), [0], 0.01, method="crown")


# ---------------------------------------------------------------- fuzz: the graph is the model
def _refused(kind, dtype):
    narrowing = {"half", "long", "type_as-int"} | ({"float"} if dtype == F64 else set())
    return kind in narrowing or kind in ("randn", "rand-mask", "dropout-train")


class _Composed(nn.Module):
    """Linear layers between the steps ``kinds``; every step keeps the model's dtype."""

    PADS = {"pad0": ((1, 0), 0.0), "pad1": ((0, 2), 1.5), "pad-neg": ((2, 1), -0.25)}
    MODES = ("reflect", "replicate", "circular")

    def __init__(self, kinds, dtype, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.kinds = list(kinds)
        # every step starts from width 3 (a Linear's output); pads widen it
        grown = [3 + (sum(self.PADS[k][0]) if k in self.PADS else 2 if k in self.MODES else 0) for k in self.kinds]
        self.lins = nn.ModuleList(nn.Linear(w, 3).to(dtype) for w in grown)
        self.first = nn.Linear(3, 3).to(dtype)
        self.register_buffer("ints", torch.zeros(1, dtype=torch.int64))

    def step(self, k, x):
        own = self.first.weight.dtype
        moves = {"relu": torch.relu, "double": lambda t: t.double().to(own), "float": lambda t: t.float().to(own),
                 "half": lambda t: t.half().to(own), "long": lambda t: (4 * t).long().to(own),
                 "type_as-int": lambda t: (4 * t).type_as(self.ints).type_as(t),
                 "randn": lambda t: t + torch.randn(t.shape[-1], dtype=own),
                 "rand-mask": lambda t: t * (torch.rand(t.shape[-1]) > 0.5),
                 "dropout-train": lambda t: F.dropout(t, 0.3, True), "dropout-eval": lambda t: F.dropout(t, 0.3, False)}
        if k in self.PADS:
            pad, value = self.PADS[k]
            return F.pad(x, pad, value=value)
        if k in self.MODES:
            return F.pad(x.unsqueeze(1), (1, 1), mode=k).squeeze(1)
        return moves[k](x)

    def forward(self, x):
        x = self.first(x)
        for k, lin in zip(self.kinds, self.lins):
            x = lin(self.step(k, x))
        return x


KINDS = ["relu", "double", "float", "half", "long", "type_as-int", "randn", "rand-mask", "dropout-train",
         "dropout-eval", "pad0", "pad1", "pad-neg", "reflect", "replicate", "circular"]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(KINDS), min_size=1, max_size=3), st.sampled_from([torch.float32, F64]),
       st.integers(0, 1000))
def test_traced_graph_is_the_model_or_refused(kinds, dtype, seed):
    m = _Composed(kinds, dtype, seed).eval()
    x = torch.rand(5, 3, dtype=F64, generator=torch.Generator().manual_seed(seed)) * 4 - 2
    refused = any(_refused(k, dtype) for k in kinds)
    try:
        g = certify.trace(m, x)
    except ValueError as exc:
        assert refused, f"{kinds} {dtype}: {exc}"
        assert "random operator" in str(exc) or "dtype conversion" in str(exc)
        return
    assert not refused, f"{kinds} {dtype}: traced"
    with torch.no_grad():
        want = m(x.to(dtype)).to(F64)
    got = certify.forward(g, x.unsqueeze(1)).squeeze(1)
    tol = 1e-12 if dtype == F64 else 1e-4  # a float32 model rounds where the float64 graph does not
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)

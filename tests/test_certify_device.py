"""Certify computes where its inputs are (issue 30), checked without a GPU.

Inside ``with torch.device("meta")`` every tensor created without an explicit device lands on
the meta device, where it carries no values; combined with a CPU tensor it raises. A run on a
CPU model and CPU inputs inside that block therefore fails wherever certify creates a tensor
that does not follow its inputs' device (what would break on a GPU), and gives the same bits
as outside it otherwise. Two holes of that mechanism are closed here:
- a meta index tensor used on a CPU tensor does not raise (``x[torch.arange(2, device="meta")]``
  reads garbage), so ``strict`` runs also check every ATen call for tensors of two devices
  (``_OneDevice``; slow, so the zoo model's alpha-CROWN runs without it);
- ``torch.as_tensor(cpu_tensor)`` moves the tensor to the default device, so inputs are passed
  as tensors and certify must keep them where they are (``certify.ops.tensor_of``).
Nothing is excluded from the block: tracing (torch.export), PGD and branch and bound run in it.
"""
from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from softcert import certify
from softcert.certify import AttackOptions, zoo

EPS = 0.005
METHODS = ("ibp", "crown", "alpha-crown", "vertex", "alpha-crown-relu")


class _OneDevice(TorchDispatchMode):
    """Every ATen call takes tensors of one device only (0-d CPU scalars included)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        devices = set()

        def visit(a):
            if isinstance(a, torch.Tensor):
                devices.add(a.device)
            elif isinstance(a, (list, tuple)):
                for b in a:
                    visit(b)

        visit(args)
        visit(list(kwargs.values()))
        if len(devices) > 1:
            raise RuntimeError(f"{func} mixes devices {sorted(map(str, devices))}")
        return func(*args, **kwargs)


@contextlib.contextmanager
def elsewhere(strict=True):
    """Default device "meta": certify must put every tensor it makes beside its inputs."""
    with torch.device("meta"), (_OneDevice() if strict else contextlib.nullcontext()):
        yield


def _fresh(model):
    """A copy of the model (another object, so the graph cache traces it again in the block)."""
    return copy.deepcopy(model)


class UserModel(nn.Module):
    """A model written with torch's own attention: MultiheadAttention, LayerNorm, GELU,
    scaled_dot_product_attention."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        with torch.no_grad():
            self.emb = nn.Linear(6, 8)
            self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
            self.norm = nn.LayerNorm(8)
            self.qkv = nn.Linear(8, 24)
            self.head = nn.Linear(8, 3)
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.4)

    def forward(self, x):
        t = self.emb(x.reshape(x.shape[0], 4, 6))
        a, _ = self.mha(t, t, t, need_weights=False)
        h = self.norm(t + a)
        q, k, v = self.qkv(h).split(8, -1)
        h = h + F.gelu(F.scaled_dot_product_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)).squeeze(1))
        return self.head(h.mean(1))


class TinyModel(nn.Module):
    """2-d input, two tokens, one attention head, ReLU: small enough for branch and bound."""

    def __init__(self, seed=2):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = nn.Parameter(torch.randn(1, 4, generator=g))
        self.pos = nn.Parameter(torch.randn(2, 4, generator=g))
        self.qkv = nn.Parameter(torch.randn(4, 12, generator=g) * 0.7)
        self.head = nn.Parameter(torch.randn(4, 3, generator=g))
        self.bias = nn.Parameter(torch.randn(3, generator=g) * 0.3)

    def forward(self, x):
        t = x.unsqueeze(-1) @ self.emb + self.pos
        q, k, v = (t @ self.qkv).split(4, -1)
        return torch.relu(F.scaled_dot_product_attention(q, k, v)).mean(1) @ self.head + self.bias


def _user():
    model = UserModel().double().eval()
    x = torch.rand(2, 24, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        return model, x, model(x).argmax(1)


def _tiny():
    model = TinyModel().double().eval()
    x = torch.tensor([[0.5, 0.5], [0.6, 0.2]], dtype=torch.float64)
    with torch.no_grad():
        return model, x, model(x).argmax(1)


def _zoo():
    model, x, y = zoo.load("mnist-vit1")
    return model, x[:2], y[:2]


def _same(a, b):
    assert a.device == b.device == torch.device("cpu")
    assert torch.equal(a, b)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("case", ["zoo", "user"])
def test_bounds_follow_the_inputs_device(case, method):
    model, x, y = _zoo() if case == "zoo" else _user()
    ref = certify.verify(model, x, y, EPS, method)
    other = _fresh(model)
    # the ATen check makes alpha-CROWN on the zoo model minutes long (the user model runs it
    # strictly); the meta device alone still catches every tensor made on the default device
    with elsewhere(strict=(case, method) != ("zoo", "alpha-crown")):
        out = certify.verify(other, x, y, EPS, method)
    _same(out.lower_margin, ref.lower_margin)
    _same(out.certified, ref.certified)
    assert out.status == ref.status


def test_branch_and_bound_follows_the_inputs_device():
    model, x, y = _tiny()
    options = certify.BabOptions(timeout=30, max_leaves=16, batch=4, intermediate="full")
    ref = certify.verify(model, x, y, 0.2, "bab", options=options)
    with elsewhere():
        out = certify.verify(_fresh(model), x, y, 0.2, "bab", options=options)
    _same(out.lower_margin, ref.lower_margin)
    _same(out.certified, ref.certified)
    assert out.status == ref.status
    assert [v.leaves for v in out.verdicts] == [v.leaves for v in ref.verdicts]
    # both samples split (16 leaves): one falsified from a leaf's worst point, one left unknown
    assert out.status == ("falsified", "unknown") and all(v.leaves > 2 for v in ref.verdicts)
    for a, b in zip(out.verdicts, ref.verdicts):
        assert (a.counterexample is None) == (b.counterexample is None)
        if a.counterexample is not None:
            _same(a.counterexample, b.counterexample)


@pytest.mark.parametrize("case", ["tiny", "user"])
def test_attack_follows_the_inputs_device(case):
    model, x, y = _tiny() if case == "tiny" else _user()
    eps = 0.3 if case == "tiny" else 0.05
    options = AttackOptions(restarts=2, steps=5)
    ref = certify.attack(model, x, y, eps, options=options)
    with elsewhere():
        out = certify.attack(model, x, y, eps, options=options)
    assert out.status == ref.status
    _same(out.min_margin, ref.min_margin)
    _same(out.x_adv, ref.x_adv)
    _same(out.falsified, ref.falsified)


def test_a_model_on_another_device_than_the_inputs_is_refused():
    model, x, y = _tiny()
    with pytest.raises(ValueError, match=r"^model: .*meta"):
        certify.verify(_fresh(model).to("meta"), x, y, EPS, "crown")
    with pytest.raises(ValueError, match=r"^model: .*meta"):
        certify.attack(_fresh(model).to("meta"), x, y, EPS)
    with pytest.raises(ValueError, match=r"^x: a meta tensor"):
        certify.verify(model, x.to("meta"), y, EPS, "crown")


def test_the_device_check_names_the_argument():
    """A model whose parameters are on another (real) device than x: ``x`` is named. Without
    a second real device, the check is called with a CPU model and a tensor claiming another."""
    from softcert.certify.spec import check_device

    model, x, _ = _tiny()
    fake = torch.empty(2, 2, device="meta")  # stands in for a tensor on cuda:0
    with pytest.raises(ValueError, match=r"^x: on meta but the model's parameters are on cpu; move both"):
        check_device(model, fake)
    check_device(model, x)  # same device: nothing to say
    check_device(nn.ReLU(), fake)  # no parameters or buffers: nothing to compare


@pytest.mark.parametrize("value, refused", [("1", True), ("0", False), ("", False), (None, False), ("yes", True)])
def test_cublas_float64_emulation_is_refused_on_cuda_by_name(monkeypatch, value, refused):
    from softcert.certify.spec import check_arithmetic

    if value is None:
        monkeypatch.delenv("CUBLAS_EMULATE_DOUBLE_PRECISION", raising=False)
    else:
        monkeypatch.setenv("CUBLAS_EMULATE_DOUBLE_PRECISION", value)
    check_arithmetic(torch.device("cpu"))  # the CPU's float64 is not cuBLAS's: never refused
    if refused:
        with pytest.raises(ValueError, match=f"CUBLAS_EMULATE_DOUBLE_PRECISION={value}: .*unset it"):
            check_arithmetic(torch.device("cuda"))
    else:
        check_arithmetic(torch.device("cuda"))


def test_verify_on_the_cpu_ignores_the_cuda_setting(monkeypatch):
    monkeypatch.setenv("CUBLAS_EMULATE_DOUBLE_PRECISION", "1")
    model = torch.nn.Sequential(torch.nn.Linear(2, 3)).double()
    r = certify.verify(model, torch.zeros(1, 2, dtype=torch.float64), torch.tensor([0]), 0.01, method="ibp")
    assert r.lower_margin.shape[0] == 1

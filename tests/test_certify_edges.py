"""Edges a user hit (issue 10): scalar types of eps, integer labels, batch_size, the input
domain, the shape reported in errors, unsupported models. Each error names its argument."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

from softcert import certify
from softcert.certify.models import ViT
from softcert.certify.options import AttackOptions
from softcert.certify.spec import input_box


def _model():
    torch.manual_seed(3)
    m = ViT(image=(1, 8, 8), patch=4, dim=8, heads=2, mlp=8, classes=3).eval()
    x = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        y = m(x).argmax(1)
    return m, x, y


M, X, Y = _model()


@pytest.mark.parametrize("eps", [np.float32(0.01), np.float64(0.01), torch.tensor(0.01), torch.tensor(0.01, dtype=torch.float64),
                                 np.array(0.01), 0, np.int64(0)])
def test_eps_accepts_real_scalars(eps):
    r = certify.verify(M, X, Y, eps, method="ibp")
    assert isinstance(r.eps, float) and r.eps == float(eps)
    a = certify.attack(M, X, Y, eps, options=AttackOptions(steps=2, restarts=1))
    assert a.eps == float(eps)


@pytest.mark.parametrize("eps", ["0.01", torch.tensor([0.01]), np.array([0.01, 0.02]), True, 1j, None])
def test_eps_rejects_non_scalars_without_contradiction(eps):
    with pytest.raises(ValueError, match="eps: expected a real scalar") as e:
        certify.verify(M, X, Y, eps, method="ibp")
    assert "got np." not in str(e.value)


@pytest.mark.parametrize("eps", [np.float32(-0.01), torch.tensor(float("nan")), float("inf")])
def test_eps_value_errors_say_what_is_wrong(eps):
    with pytest.raises(ValueError, match="eps: must be finite and >= 0"):
        certify.verify(M, X, Y, eps, method="ibp")


@pytest.mark.parametrize("label", [[1.7, 2.2], torch.tensor([0.5, 1.0]), np.array([float("nan"), 1.0]),
                                   torch.tensor([True, False]), ["a", "b"]])
def test_non_integral_labels_rejected(label):
    for call in (lambda: certify.verify(M, X, label, 0.01, method="ibp"),
                 lambda: certify.attack(M, X, label, 0.01, options=AttackOptions(steps=2)),
                 lambda: certify.evaluate(M, X, label, [0.01], ["ibp"], attack=AttackOptions(steps=2, restarts=1))):
        with pytest.raises(ValueError, match="label"):
            call()


def test_integral_labels_of_any_dtype_agree():
    want = certify.verify(M, X, Y, 0.01, method="ibp").lower_margin
    for lab in (Y.tolist(), Y.double(), Y.numpy().astype(np.int32), Y.numpy().astype(np.float32)):
        got = certify.verify(M, X, lab, 0.01, method="ibp").lower_margin
        torch.testing.assert_close(got, want, rtol=0, atol=0)  # same computation on the same labels


@pytest.mark.parametrize("bs", [0, -1, 1.5, True, "2"])
def test_batch_size_validated(bs):
    with pytest.raises(ValueError, match="BoundOptions.batch_size: expected a positive int"):
        certify.verify(M, X, Y, 0.01, method="ibp", options=certify.BoundOptions(batch_size=bs))


def test_images_outside_the_domain_named():
    big = X * 255
    for call in (lambda: certify.verify(M, big, Y, 0.01, method="ibp"),
                 lambda: certify.attack(M, big, Y, 0.01, options=AttackOptions(steps=2)),
                 lambda: certify.evaluate(M, big, Y, [0.01], ["ibp"], attack=AttackOptions(steps=2, restarts=1))):
        with pytest.raises(ValueError, match=r"x: values must lie in the input domain \[0.0, 1.0\]"):
            call()
    # a declared domain is accepted and the ball is clipped to it
    r = certify.verify(M, big, Y, 1.0, method="ibp", domain=(0, 255))
    assert r.domain == (0.0, 255.0) and r.lower_margin.shape == (2, 3)
    lo, hi = input_box(big.double(), 3.0, (0.0, 255.0))
    assert lo.min() >= 0 and hi.max() <= 255 and (lo <= big).all() and (big <= hi).all()
    with pytest.raises(ValueError, match="domain"):
        certify.verify(M, X, Y, 0.01, method="ibp", domain=(1.0, 0.0))


def test_domain_clips_the_ball_for_attack_and_verify():
    # on the domain (0, 0.5) with x = 0.5 everywhere, the ball is x - eps .. x: PGD stays inside
    x = torch.full((1, 1, 8, 8), 0.5)
    with torch.no_grad():
        y = M(x).argmax(1)
    a = certify.attack(M, x, y, 0.2, options=AttackOptions(steps=3, restarts=2), domain=(0.0, 0.5))
    assert a.x_adv.max() <= 0.5 and a.x_adv.min() >= 0.3 - 1e-12


def test_shape_error_reports_the_shape_passed():
    with pytest.raises(ValueError, match=r"got \(2, 8, 8\)$"):
        certify.verify(M, torch.rand(2, 8, 8), Y, 0.01)
    with pytest.raises(ValueError, match=r"got \(2, 8, 8\)$"):
        certify.attention_scores(M, torch.rand(2, 8, 8))
    r = certify.verify(M, X[0], Y[:1], 0.01, method="ibp")  # one image without a batch axis is fine
    assert r.lower_margin.shape == (1, 3)


class _MHAClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        t = x.reshape(x.shape[0], 8, 8)
        return self.head(self.attn(t, t, t)[0].mean(1))


@pytest.mark.parametrize("model", [_MHAClassifier(), nn.Sequential(nn.Flatten(), nn.Linear(64, 3))])
def test_any_module_of_supported_operators_is_verified_soundly(model):
    model = model.eval()
    r = certify.verify(model, X, Y, 0.01, method="crown")
    lo, hi = input_box(X.double(), 0.01)
    pts = lo + (hi - lo) * torch.rand(64, *X.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        z = copy.deepcopy(model).double()(pts.reshape(-1, *X.shape[1:])).reshape(64, *r.lower_margin.shape)
    sampled = (z.gather(2, Y.view(1, -1, 1).expand(64, -1, 1)) - z).min(0).values
    assert (r.lower_margin <= sampled + 1e-9).all()


def test_a_model_without_attention_has_no_attention_scores():
    with pytest.raises(ValueError, match="no attention layer"):
        certify.attention_scores(nn.Sequential(nn.Flatten(), nn.Linear(64, 3)), X)


class _Ranker(nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=-1).values


def test_unsupported_operator_is_named_with_its_module_path():
    m = ViT(image=(1, 8, 8), patch=4, dim=8, heads=2, mlp=8, classes=3)
    m.blocks[0].relu = _Ranker()
    for call in (lambda: certify.verify(m, X, Y, 0.01), lambda: certify.check_supported(m, X)):
        with pytest.raises(ValueError, match=r"unsupported operator aten\.sort at 'blocks\.0\.relu' \(sort\)"):
            call()


class _Reduced(nn.Module):
    """Heads that lose the batch axis: a scalar (``x.sum()``-style) or the first row only."""

    def __init__(self, head):
        super().__init__()
        self.lin, self.head = nn.Linear(3, 3), head

    def forward(self, x):
        z = self.lin(x)
        return z.sum() if self.head == "sum" else z[0]


@pytest.mark.parametrize("head", ["sum", "row"])
@pytest.mark.parametrize("method", ["ibp", "crown", "bab"])
def test_outputs_without_a_batch_axis_are_refused_by_every_method(head, method):
    """bab certified such a model (issue 27 item 11: it read the output shape by itself);
    every method now asks for logits with a batch axis first."""
    m = _Reduced(head).double().eval()
    x = torch.rand(1, 3, dtype=torch.float64)
    kw = {"options": certify.BabOptions(timeout=5)} if method == "bab" else {}
    with pytest.raises(ValueError, match="expected logits with a batch axis first"):
        certify.verify(m, x, [0], 0.01, method=method, **kw)


def test_meta_and_token_id_inputs_are_named():
    """A meta tensor raised a raw RuntimeError and integer token ids did not point to
    verify_text (issue 32)."""
    m = nn.Sequential(nn.Linear(3, 2)).double().eval()
    with pytest.raises(ValueError, match="meta tensor carries no values"):
        certify.verify(m, torch.empty(1, 3, device="meta"), [0], 0.01, method="ibp")
    with pytest.raises(ValueError, match="verify_text"):
        certify.verify(m, torch.tensor([[1, 2, 3]]), [0], 0.01, method="ibp")


def test_an_unsupported_operator_in_the_top_level_forward_is_located():
    """It was located "at ''" (issue 32)."""

    class Top(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return torch.sort(self.lin(x), -1).values

    with pytest.raises(ValueError, match=r"aten\.sort.* at the model's own forward \(no submodule\)"):
        certify.verify(Top().double().eval(), torch.rand(1, 4, dtype=torch.float64), [0], 0.01, method="ibp")


@pytest.mark.parametrize("method", ["ibp", "crown", "bab"])
def test_verify_reports_progress_per_sample(method):
    """verify was silent (issue 32): ``progress`` gets the samples finished, all of them once."""
    m = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).double().eval()
    x = torch.rand(5, 3, dtype=torch.float64)
    calls = []
    kw = {"options": certify.BabOptions(timeout=2) if method == "bab" else certify.BoundOptions(batch_size=2)}
    certify.verify(m, x, [0] * 5, 0.01, method=method, progress=calls.append, **kw)
    assert sum(calls) == 5 and len(calls) == (5 if method == "bab" else 3)
    with pytest.raises(ValueError, match="progress: expected a callable"):
        certify.verify(m, x, [0] * 5, 0.01, method=method, progress=3, **kw)


def test_worst_margin_counts_a_bound_of_exactly_zero():
    """A margin bound of exactly 0 on another class is the worst one (not certified); it was
    skipped as if it were the label's own column."""
    r = certify.CertResult(torch.tensor([[0.0, 0.0, 0.5]], dtype=torch.float64), torch.tensor([False]),
                           "crown", 0.01, 0.0, label=torch.tensor([0]))
    assert r.worst_margin.tolist() == [0.0]
    m = nn.Sequential(nn.Linear(3, 3)).double().eval()
    res = certify.verify(m, torch.rand(2, 3, dtype=torch.float64), [1, 2], 0.01, method="crown")
    other = res.lower_margin.clone()
    other[torch.arange(2), torch.tensor([1, 2])] = torch.inf
    assert torch.equal(res.worst_margin, other.min(1).values)  # the same selection, computed twice


@pytest.mark.parametrize("method", ["crown", "alpha-crown", "vertex"])
def test_linear_bounds_never_fall_below_the_interval_bound(method):
    """A two-block ViT with doubled weights at eps 0.1: the second block's softmax exp-sums reach
    0 over the box, and the relaxation planes on those astronomically wide boxes carried the
    final linear bound to -inf (every margin, where IBP's are finite); every linear method
    keeps the interval bound of the same state, so it is never looser than IBP, and stays below
    the margins at sampled points (the corners included)."""
    torch.manual_seed(0)
    m = ViT(image=(1, 4, 4), patch=2, dim=8, heads=2, mlp=8, classes=3, depth=2).double().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(2)
    x = torch.rand(4, 1, 4, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        y = m(x).argmax(1)
    eps = 0.1
    ibp = certify.verify(m, x, y, eps, method="ibp").lower_margin
    got = certify.verify(m, x, y, eps, method=method).lower_margin
    assert (got >= ibp).all() and torch.isfinite(ibp).all()
    lo, hi = input_box(x, eps)
    u = torch.rand(256, *x.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    pts = torch.cat([lo + (hi - lo) * u, lo[None], hi[None]])
    with torch.no_grad():
        z = m(pts.reshape(-1, 1, 4, 4)).reshape(len(pts), 4, 3)
    sampled = (z.gather(2, y.view(1, -1, 1).expand(len(pts), -1, 1)) - z).amin(0)
    assert (got <= sampled + 1e-12).all()

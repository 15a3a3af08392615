"""Certified training (certify.training, issue 34): the training margins are lower bounds of
sampled and attacked margins, their gradients reach every parameter, training raises the
verifier's worst margin, runs are deterministic, bad options name their field, and
``softcert train --certified`` writes a checkpoint that ``--model`` loads back."""
import copy
import json

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import softcert.cli
from softcert import certify
from softcert.certify import data
from softcert.certify.attack import pgd
from softcert.certify.models import ViT
from softcert.certify.ops import host
from softcert.certify.options import AttackOptions
from softcert.certify.training import CertifiedTraining, margin_bounds, robust_loss, train_certified
from softcert.cli import model_formats


class _MHA(nn.Module):
    """A user model: nn.MultiheadAttention, LayerNorm, GELU (rows of a 4x4 image as tokens)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        t = self.embed(x.reshape(x.shape[0], 4, 4))
        t = t + self.attn(t, t, t, need_weights=False)[0]
        return self.head(F.gelu(self.fc(self.norm(t))).mean(1))


def _vit():
    torch.manual_seed(0)
    return ViT(image=(1, 4, 4), patch=2, dim=8, heads=2, mlp=8, classes=3).double().eval()


def _mha():
    torch.manual_seed(0)
    return _MHA().double().eval()


X = torch.rand(4, 1, 4, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
Y = torch.tensor([0, 1, 2, 1])
EPS = 0.02


def _sampled_margins(model, n=128):
    """Margins z_y - z_j (n, B, K) at random points of the box and at PGD's worst point."""
    lo, hi = (X - EPS).clamp(0, 1), (X + EPS).clamp(0, 1)
    u = torch.rand(n, *X.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    pts = torch.cat([lo + (hi - lo) * u, lo[None], hi[None]])
    with torch.no_grad():
        z = model(pts.reshape(-1, *X.shape[1:])).reshape(len(pts), *X.shape[:1], -1)
    margins = z.gather(2, Y.view(1, -1, 1).expand(len(pts), -1, 1)) - z
    _, attacked = pgd(model, X, Y, EPS, AttackOptions(restarts=2, steps=10))
    return torch.cat([margins, attacked[None]])


@pytest.mark.parametrize("build", [_vit, _mha], ids=["vit", "mha-layernorm-gelu"])
@pytest.mark.parametrize("bound,beta", [("ibp", 1.0), ("crown-ibp", 1.0), ("crown-ibp", 0.5)])
def test_training_margins_are_lower_bounds_of_sampled_and_attacked_margins(build, bound, beta):
    model = build()
    m = margin_bounds(model, X, Y, EPS, bound, beta=beta)
    assert m.dtype == torch.float64 and torch.isfinite(m).all()
    assert (m.gather(1, Y[:, None]) == 0).all()
    margins = _sampled_margins(model)
    assert (margins >= m.detach() - 1e-9).all()
    # so the robust loss bounds the cross-entropy at every sampled point of the box
    with torch.no_grad():
        lo, hi = (X - EPS).clamp(0, 1), (X + EPS).clamp(0, 1)
        u = torch.rand(64, *X.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        z = model((lo + (hi - lo) * u).reshape(-1, *X.shape[1:])).reshape(64, len(X), -1)
        ce = torch.stack([F.cross_entropy(zi, Y, reduction="none") for zi in z]).max(0).values
    robust = F.cross_entropy(-m.detach(), Y, reduction="none")
    assert (robust >= ce - 1e-9).all()
    assert robust_loss(model, X, Y, EPS, bound, beta=beta).item() >= ce.mean().item() - 1e-9


def test_beta_mixes_the_crown_ibp_and_ibp_margins():
    model = _mha()
    ibp, crown = (margin_bounds(model, X, Y, EPS, b).detach() for b in ("ibp", "crown-ibp"))
    half = margin_bounds(model, X, Y, EPS, "crown-ibp", beta=0.5).detach()
    torch.testing.assert_close(half, (ibp + crown) / 2, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("eps,falls_back", [(0.3, [False, False, True, True]), (0.5, [True] * 4)])
def test_rows_whose_crown_ibp_bound_overflows_fall_back_to_ibp_with_finite_gradients(eps, falls_back):
    """Large weights and radii overflow the IBP bounds of the softmax (exp underflows to 0, so
    -log of its sum is +inf) and CROWN-IBP gives no bound there: those rows keep IBP's, the
    others mix, and no 0·inf reaches a gradient. Rows 0-1 (x = 0) have boxes clipped to half."""
    model = _vit()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2)
    x = torch.cat([torch.zeros(2, 1, 4, 4, dtype=torch.float64), X[:2]])
    ibp = margin_bounds(model, x, Y, eps, "ibp").detach()
    m = margin_bounds(model, x, Y, eps, "crown-ibp")
    assert (ibp == m.detach()).all(1).tolist() == falls_back and torch.isfinite(m).all()
    F.cross_entropy(-m, Y).backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.parametrize("scale,eps", [(1.0, EPS), (2.0, 0.3)], ids=["finite", "overflowing"])
def test_the_steps_skipped_on_the_cpu_change_neither_margins_nor_gradients(scale, eps):
    """On the CPU the bounds skip the steps that are the identity (NaN filtering of finite
    bounds, clamps of values inside the range, max(l, u) of l < u, zeroing finite gradients);
    under host.reads("defer") every step is taken, as on a GPU: the same margins and gradients
    (to an ulp: other operators also change how they evaluate under "defer"), also where
    bounds overflow and the steps do act."""
    runs = []
    for policy in ("auto", "defer"):
        model = _vit()
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(scale)
        x = torch.cat([torch.zeros(2, 1, 4, 4, dtype=torch.float64), X[:2]])
        with host.reads(policy):
            m = margin_bounds(model, x, Y, eps, "crown-ibp", beta=0.5)
            F.cross_entropy(-m, Y).backward()
        runs.append((m.detach(), [p.grad.clone() for p in model.parameters()]))
    (m1, g1), (m2, g2) = runs
    torch.testing.assert_close(m1, m2, rtol=1e-12, atol=1e-12)
    for a, b in zip(g1, g2, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("build", [_vit, _mha], ids=["vit", "mha-layernorm-gelu"])
def test_gradients_reach_the_parameters_and_match_the_model_at_eps_zero(build):
    """At eps 0 the interval margins are the model's margins (up to the intervals' ulp
    widening), so their gradient is the model's own; at eps > 0 every parameter gets one."""
    model = build()
    margin_bounds(model, X, Y, 0.0).sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    z = model(X)
    (z.gather(1, Y[:, None]) - z).sum().backward()
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-6, atol=1e-8, msg=n)
    model.zero_grad()
    robust_loss(model, X, Y, EPS, "crown-ibp", beta=0.5).backward()
    for n, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, n


def _worst_crown_margin(model, x, y, eps):
    lm = certify.verify(model, x, y, eps, method="crown").lower_margin.clone()
    lm[torch.arange(len(y)), y] = torch.inf
    return lm.min(1).values


def test_certified_training_raises_the_verified_worst_margin():
    """A naturally trained tiny ViT, then 24 steps more: certified (CROWN-IBP, eps ramped to
    0.05) against natural. The CROWN worst margins at eps rise above both the start's and
    the natural continuation's (mean and minimum over 32 test images)."""
    xtr, ytr, xte, yte = data.digits()
    xtr, ytr, xte, yte = xtr[:384], ytr[:384], xte[:32], yte[:32]
    torch.manual_seed(0)
    model = ViT(image=(1, 8, 8), patch=4, dim=16, heads=2, mlp=32, classes=10)
    natural = CertifiedTraining(eps=0.0, epochs=10, warmup_epochs=10, ramp_epochs=0, lr=3e-3, batch_size=64)
    train_certified(model, xtr, ytr, natural)
    eps = 0.05
    before = _worst_crown_margin(model, xte, yte, eps)
    more = dict(epochs=4, warmup_epochs=0, lr=3e-3, batch_size=64)
    nat, _ = train_certified(copy.deepcopy(model), xtr, ytr, CertifiedTraining(eps=0.0, ramp_epochs=0, **more))
    ct, history = train_certified(copy.deepcopy(model), xtr, ytr, CertifiedTraining(eps=eps, ramp_epochs=2, **more))
    assert [r.eps for r in history] == pytest.approx([eps / 2, eps, eps, eps])
    assert history[-1].robust_loss is not None and history[-1].skipped_steps == 0
    after, after_nat = _worst_crown_margin(ct, xte, yte, eps), _worst_crown_margin(nat, xte, yte, eps)
    assert after.mean() > before.mean() + 0.3 and after.mean() > after_nat.mean() + 0.3
    assert after.min() > before.min() and after.min() > after_nat.min()


def test_same_seed_same_weights_other_seed_other_weights():
    xtr, ytr, _, _ = data.digits()
    xtr, ytr = xtr[:96], ytr[:96]

    def run(seed):
        torch.manual_seed(0)
        model = ViT(image=(1, 8, 8), patch=4, dim=8, heads=2, mlp=8, classes=10)
        opts = CertifiedTraining(eps=0.05, epochs=3, warmup_epochs=1, ramp_epochs=1, batch_size=32, lr=1e-3, seed=seed)
        steps = []
        model, history = train_certified(model, xtr, ytr, opts, progress=lambda *a: steps.append(a))
        return model.state_dict(), history, steps

    a, ha, sa = run(0)
    b, hb, sb = run(0)
    c, _, _ = run(1)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-9)
    assert ha[0].robust_loss is None and hb[0].robust_loss is None  # the warm-up
    assert [r.robust_loss for r in ha[1:]] == pytest.approx([r.robust_loss for r in hb[1:]], rel=1e-6)
    assert len(sa) == 9 and [s[:3] for s in sa] == [s[:3] for s in sb]
    assert sa[0][4] is None and sa[-1][4] is not None  # no robust loss in the warm-up
    assert any(not torch.allclose(a[k], c[k]) for k in a)


@pytest.mark.parametrize("field,value", [
    ("eps", -0.1), ("eps", float("nan")), ("epochs", 0), ("epochs", 2.0), ("warmup_epochs", -1),
    ("ramp_epochs", True), ("kappa_start", 1.5), ("kappa_end", -0.1), ("bound", "crown"), ("beta_start", 2),
    ("beta_end", float("inf")), ("lr", 0.0), ("batch_size", 0), ("seed", -1), ("domain", (1.0, 0.0)),
    ("lr_decay", 0.0), ("lr_decay", 1.5), ("lr_milestones", (5, 3)), ("lr_milestones", (0,)),
    ("lr_milestones", (100,)), ("lr_milestones", 50), ("ramp", "cosine"), ("grad_clip", 0.0),
    ("grad_clip", float("inf")), ("box_fraction", 0.0), ("box_fraction", 1.5), ("attack_steps", 0),
    ("ramp_start", 0.0), ("ramp_start", 1.0), ("shift", -1), ("shift", 1.5),
])
def test_bad_options_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"CertifiedTraining.{field}"):
        CertifiedTraining(**{field: value})


def test_the_rate_decays_at_each_milestone():
    """Step decay (Gowal et al. 2018): lr · lr_decay^(milestones passed), and training applies
    it: with a decay of 1e-9 from epoch 1, the second epoch barely moves the weights."""
    opts = CertifiedTraining(epochs=5, ramp_epochs=0, lr=1e-3, lr_milestones=[2, 4])
    assert opts.lr_milestones == (2, 4)
    assert [opts.learning_rate(e) for e in range(5)] == pytest.approx([1e-3, 1e-3, 1e-4, 1e-4, 1e-5])
    xtr, ytr, _, _ = data.digits()
    torch.manual_seed(0)
    model = ViT(image=(1, 8, 8), patch=4, dim=8, heads=2, mlp=8, classes=10)
    weights = [copy.deepcopy(model.state_dict())]

    def keep(epoch, step, *rest):
        if step in (2, 5):  # the last step of each epoch (3 per epoch)
            weights.append(copy.deepcopy(model.state_dict()))
    opts = CertifiedTraining(eps=0.0, epochs=2, warmup_epochs=2, ramp_epochs=0, lr=1e-2, batch_size=32,
                             lr_milestones=(1,), lr_decay=1e-9)
    train_certified(model, xtr[:96], ytr[:96], opts, progress=keep)

    def moved(a, b):
        return max(float((a[k] - b[k]).abs().max()) for k in a)
    assert moved(weights[1], weights[0]) > 1e-3 > 1e-6 > moved(weights[2], weights[1])


def test_the_smooth_ramp_rises_continuously_to_eps_with_a_continuous_slope():
    """The smooth ramp is a·t^4 to a quarter of the ramp, then its tangent line, reaching eps at
    the ramp's last step; kappa follows eps (module docstring)."""
    opts = CertifiedTraining(eps=0.02, epochs=12, warmup_epochs=2, ramp_epochs=8, ramp="smooth")
    spe = 100
    eps = [opts.schedule(s, spe)[0] for s in range(12 * spe)]
    assert eps[:2 * spe] == [0.0] * (2 * spe)
    assert eps[10 * spe - 1] == pytest.approx(0.02) and eps[-1] == pytest.approx(0.02)
    ramp = eps[2 * spe:10 * spe]
    steps = [b - a for a, b in zip(ramp, ramp[1:])]
    assert all(d > 0 for d in steps)
    assert max(abs(b - a) for a, b in zip(steps, steps[1:])) < 1e-6  # no kink at the quarter
    assert ramp[len(ramp) // 4 - 1] < 0.1 * 0.02 and ramp[len(ramp) // 2] < 0.5 * 0.02
    linear = CertifiedTraining(eps=0.02, epochs=12, warmup_epochs=2, ramp_epochs=8)
    kappa = [opts.schedule(s, spe)[1] for s in range(2 * spe, 10 * spe)]
    assert kappa == pytest.approx([1 - 0.5 * e / 0.02 for e in ramp])
    assert linear.schedule(6 * spe - 1, spe)[0] == pytest.approx(0.01)


def test_the_geometric_ramp_grows_eps_by_a_constant_factor_from_its_start_to_eps():
    """eps = eps·ramp_start^(1 - t) at ramp fraction t > 0 (0 in the warm-up): one factor per
    step, the first step at ramp_start^(1 - 1/steps)·eps, the last at eps; kappa follows eps."""
    opts = CertifiedTraining(eps=0.02, epochs=6, warmup_epochs=1, ramp_epochs=4, ramp="geometric",
                             ramp_start=1e-12, kappa_start=0.5)
    spe = 10
    eps = [opts.schedule(s, spe)[0] for s in range(6 * spe)]
    assert eps[:spe] == [0.0] * spe
    ramp = eps[spe:5 * spe]
    ratios = [b / a for a, b in zip(ramp, ramp[1:])]
    assert ratios == pytest.approx([1e12 ** (1 / 40)] * 39, rel=1e-9)
    assert ramp[0] == pytest.approx(0.02 * 1e-12 ** (1 - 1 / 40)) and ramp[-1] == pytest.approx(0.02)
    assert eps[5 * spe:] == pytest.approx([0.02] * spe)
    assert all(opts.schedule(s, spe)[1] == pytest.approx(0.5) for s in range(spe, 6 * spe))


def test_a_tiny_gradient_clip_keeps_the_weights_and_a_huge_one_changes_nothing():
    """grad_clip scales every step's gradient to norm <= grad_clip: at 1e-14 Adam's steps are
    lr·g/(|g| + 1e-8), far below lr; at 1e30 training is the same as without clipping."""
    xtr, ytr, _, _ = data.digits()

    def run(clip):
        torch.manual_seed(0)
        model = ViT(image=(1, 8, 8), patch=4, dim=8, heads=2, mlp=8, classes=10)
        start = copy.deepcopy(model.state_dict())
        opts = CertifiedTraining(eps=0.05, epochs=2, warmup_epochs=1, ramp_epochs=1, batch_size=32, lr=1e-2,
                                 bound="ibp", grad_clip=clip)
        end = train_certified(model, xtr[:96], ytr[:96], opts)[0].state_dict()
        return start, end

    start, free = run(None)
    _, huge = run(1e30)
    _, tiny = run(1e-14)
    for k in start:
        torch.testing.assert_close(huge[k], free[k], rtol=1e-6, atol=1e-9)
    assert max(float((free[k] - start[k]).abs().max()) for k in start) > 1e-2
    assert max(float((tiny[k] - start[k]).abs().max()) for k in start) < 1e-6


def test_the_small_box_lies_in_the_eps_box_around_an_attacked_point():
    """box_fraction λ (SABR): the bounded box [c - λ·eps, c + λ·eps] ∩ [0, 1] lies in
    [x - eps, x + eps] ∩ [0, 1], and its centre moves towards a PGD point (it raises the loss)."""
    from softcert.certify.spec import input_box
    from softcert.certify.training import _robust_box

    model = _vit()
    x = torch.cat([X, torch.zeros(1, 1, 4, 4, dtype=torch.float64), torch.ones(1, 1, 4, 4, dtype=torch.float64)])
    y = torch.tensor([0, 1, 2, 1, 0, 2])
    opts = CertifiedTraining(box_fraction=0.25, attack_steps=5)
    eps = 0.1
    centre, radius = _robust_box(model, x, y, eps, opts)
    assert radius == pytest.approx(0.025)
    lo, hi = input_box(centre, radius)
    big_lo, big_hi = input_box(x, eps)
    # both boxes are rounded outward by an ulp (spec.input_box): in real arithmetic the small
    # box lies in the eps box, in float64 to within those ulps
    assert float((big_lo - lo).max()) <= 4e-16 and float((hi - big_hi).max()) <= 4e-16
    loss = lambda t: F.cross_entropy(model(t), y, reduction="none")  # noqa: E731
    with torch.no_grad():
        assert float((loss(centre) - loss(x)).min()) >= -1e-12 and float((loss(centre) - loss(x)).max()) > 0
    assert _robust_box(model, x, y, eps, CertifiedTraining()) == (x, eps)


def test_translated_images_are_the_images_moved_by_at_most_shift_pixels_with_edges_replicated():
    """shift (random translation): each output image equals, for some dy, dx in [-s, s], the
    input read at rows clamp(i + dy) and columns clamp(j + dx); brute force over the offsets."""
    from softcert.certify.training import translated

    gen = torch.Generator().manual_seed(5)
    x = torch.rand(64, 2, 6, 7, generator=gen, dtype=torch.float64)
    assert translated(x, 0) is x
    s = 2
    out = translated(x, s, torch.Generator().manual_seed(1))
    assert out.shape == x.shape and out.dtype == x.dtype
    seen = set()
    for b in range(len(x)):
        found = [(dy, dx) for dy in range(-s, s + 1) for dx in range(-s, s + 1)
                 if torch.equal(out[b], x[b][:, (torch.arange(6) + dy).clamp(0, 5)][:, :, (torch.arange(7) + dx).clamp(0, 6)])]
        assert len(found) == 1, f"image {b}: offsets {found}"
        seen.add(found[0])
    assert len(seen) > 12  # the offsets vary over the batch (25 possible)


def test_training_with_shift_is_deterministic_and_refuses_flat_inputs():
    model = _vit()
    opts = CertifiedTraining(epochs=2, warmup_epochs=0, ramp_epochs=1, bound="ibp", eps=EPS, batch_size=2, shift=1)
    a, _ = train_certified(copy.deepcopy(model), X, Y, opts)
    b, _ = train_certified(copy.deepcopy(model), X, Y, opts)
    c, _ = train_certified(copy.deepcopy(model), X, Y, CertifiedTraining(**{**opts.__dict__, "shift": 0}))
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k])
    assert any(not torch.equal(v, c.state_dict()[k]) for k, v in a.state_dict().items())
    flat = nn.Sequential(nn.Linear(4, 3)).double()
    with pytest.raises(ValueError, match="^options.shift:"):
        train_certified(flat, torch.rand(4, 4, dtype=torch.float64), Y[:4] % 3, opts)


def test_a_ramp_past_the_last_epoch_is_refused():
    with pytest.raises(ValueError, match="CertifiedTraining.ramp_epochs: .*exceeds epochs"):
        CertifiedTraining(epochs=10, warmup_epochs=2, ramp_epochs=9)


def test_bad_arguments_name_the_argument():
    model = _vit()
    for kwargs, name in [(dict(bound="crown"), "bound"), (dict(beta=1.5), "beta"), (dict(eps=-1.0), "eps")]:
        args = dict(bound="ibp", eps=EPS) | kwargs
        with pytest.raises(ValueError, match=f"^{name}:"):
            robust_loss(model, X, Y, args.pop("eps"), **args)
    with pytest.raises(ValueError, match="^label:"):
        robust_loss(model, X, torch.tensor([0, 1, 2, 3]), EPS)
    with pytest.raises(ValueError, match="^options:"):
        train_certified(model, X, Y, {"eps": 0.1})
    with pytest.raises(ValueError, match="^progress:"):
        train_certified(model, X, Y, CertifiedTraining(epochs=1, ramp_epochs=0), progress=3)


def test_a_constant_computed_from_the_parameters_is_refused_naming_node_and_operator():
    """Eval-mode batch norm folds w / sqrt(var + eps) into a new tensor: no view of a
    parameter, so gradients could not reach w."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).eval()
    with pytest.raises(ValueError, match=r"node \d+ '2' \(operator 'mul_const'\).*not a view of one parameter"):
        robust_loss(model, X.float(), Y, EPS)


def test_cli_trains_certifiably_and_writes_a_loadable_checkpoint(tmp_path, capsys):
    argv = ["train", "--certified", "--model", "digits-vit1", "--epochs", "2", "--warmup-epochs", "1",
            "--ramp-epochs", "1", "--n", "64", "--batch-size", "32", "--eps", "0.02", "--out", str(tmp_path)]
    assert softcert.cli.main(argv) == 0
    log = json.loads((tmp_path / "digits-vit1-ct.json").read_text())
    assert log["training"]["eps"] == 0.02 and log["training"]["n"] == 64 and len(log["history"]) == 2
    assert log["training"]["threads"] == 1  # --threads' default, recorded: another count sums in another order
    assert log["history"][0]["robust_loss"] is None and log["history"][1]["robust_loss"] > 0
    ckpt = torch.load(tmp_path / "digits-vit1-ct.pt", weights_only=True)
    assert set(ckpt) >= {"recipe", "config", "state_dict", "training"} and ckpt["dataset"] == "digits"
    model = model_formats.checkpoint(tmp_path / "digits-vit1-ct.pt")
    for k, v in model.state_dict().items():
        assert torch.equal(v, ckpt["state_dict"][k])


def test_cli_trains_in_the_dtype_asked_for_and_records_it(tmp_path):
    argv = ["train", "--certified", "--model", "digits-vit1", "--epochs", "1", "--warmup-epochs", "0",
            "--ramp-epochs", "1", "--ramp", "geometric", "--ramp-start", "1e-6", "--kappa-start", "0.5",
            "--n", "32", "--batch-size", "32", "--dtype", "float64", "--out", str(tmp_path)]
    assert softcert.cli.main(argv) == 0
    log = json.loads((tmp_path / "digits-vit1-ct.json").read_text())
    assert log["training"]["dtype"] == "float64" and log["training"]["ramp"] == "geometric"
    assert log["training"]["ramp_start"] == 1e-6 and log["training"]["kappa_start"] == 0.5
    ckpt = torch.load(tmp_path / "digits-vit1-ct.pt", weights_only=True)
    assert all(v.dtype == torch.float64 for v in ckpt["state_dict"].values() if v.is_floating_point())


def test_cli_refuses_a_certified_training_flag_without_certified(capsys):
    assert softcert.cli.main(["train", "digits-vit1", "--dtype", "float64"]) == 2
    assert "--dtype: only with --certified" in capsys.readouterr().err


@pytest.mark.parametrize("extra,flag", [
    (["--model", "digits-vit1", "--eps", "-1"], "--eps"), (["--model", "digits-vit1", "--lr", "0"], "--lr"),
    (["--model", "digits-vit1", "--n", "0"], "--n"), ([], "--model"),
    (["--model", "tests/no_such.py:build"], "--model"), (["--model", "digits-vit1", "--data", "digits"], "--data"),
    (["--model", "digits-vit1", "--threads", "0"], "--threads"),
])
def test_cli_errors_name_the_argument(tmp_path, capsys, extra, flag):
    assert softcert.cli.main(["train", "--certified", *extra, "--out", str(tmp_path)]) == 2
    assert flag in capsys.readouterr().err


def test_cli_trains_a_certified_zoo_name_with_its_recorded_options(tmp_path, monkeypatch):
    from softcert.certify import train

    recorded = dict(eps=0.01, epochs=2, warmup_epochs=1, ramp_epochs=1, batch_size=32)
    monkeypatch.setitem(train.CERTIFIED, "digits-vit1-ct", ("digits-vit1", recorded))
    assert softcert.cli.main(["train", "--certified", "digits-vit1-ct", "--n", "64", "--out", str(tmp_path)]) == 0
    log = json.loads((tmp_path / "digits-vit1-ct.json").read_text())
    assert {k: log["training"][k] for k in recorded} == recorded and log["training"]["source"] == "digits-vit1-ct"
    # a flag overrides the recorded value
    argv = ["train", "--certified", "--model", "digits-vit1-ct", "--n", "64", "--lr", "0.001", "--out", str(tmp_path)]
    assert softcert.cli.main(argv) == 0
    log = json.loads((tmp_path / "digits-vit1-ct.json").read_text())
    assert log["training"]["lr"] == 0.001 and log["training"]["eps"] == 0.01


def test_cli_builds_a_certified_zoo_name_with_its_recorded_branch_init_and_dtype(tmp_path, monkeypatch, capsys):
    """A CERTIFIED entry's third element (fresh-model fields) reaches the model: its config
    carries branch_init and its weights the dtype; --branch-init overrides it, and is refused
    for a model that brings its own weights."""
    from softcert.certify import train

    recorded = dict(eps=0.01, epochs=1, warmup_epochs=0, ramp_epochs=1, batch_size=32)
    monkeypatch.setitem(train.CERTIFIED, "digits-vit1-ct", ("digits-vit1", recorded,
                                                            dict(branch_init="zero", dtype="float64")))
    assert softcert.cli.main(["train", "--certified", "digits-vit1-ct", "--n", "32", "--out", str(tmp_path)]) == 0
    ckpt = torch.load(tmp_path / "digits-vit1-ct.pt", weights_only=True)
    assert ckpt["config"]["branch_init"] == "zero" and ckpt["training"]["dtype"] == "float64"
    assert all(v.dtype == torch.float64 for v in ckpt["state_dict"].values() if v.is_floating_point())
    argv = ["train", "--certified", "digits-vit1-ct", "--n", "32", "--branch-init", "default", "--out", str(tmp_path)]
    assert softcert.cli.main(argv) == 0
    assert torch.load(tmp_path / "digits-vit1-ct.pt", weights_only=True)["config"]["branch_init"] == "default"
    argv = ["train", "--certified", "--model", str(tmp_path / "digits-vit1-ct.pt"), "--data", "digits",
            "--branch-init", "zero", "--out", str(tmp_path)]
    assert softcert.cli.main(argv) == 2
    assert "--branch-init: initialises a fresh zoo architecture" in capsys.readouterr().err


def test_cli_grows_a_certified_zoo_name_from_its_source_model(tmp_path, monkeypatch, capsys):
    """A CERTIFIED entry with "start_from" starts from that zoo model grown to the recipe's
    depth (certify.models.grown): before any step the model computes the source's logits; a
    source that is missing, or of another architecture, is a ValueError naming --model."""
    from softcert.certify import train, zoo
    from softcert.certify.models import grown

    recorded = dict(eps=0.02, epochs=1, warmup_epochs=0, ramp_epochs=0, batch_size=16, lr=1e-12)
    monkeypatch.setitem(train.CERTIFIED, "grown-ct", ("mnist-vit8-ln", recorded, dict(start_from="mnist-vit4-ln-ct")))
    assert softcert.cli.main(["train", "--certified", "grown-ct", "--n", "16", "--out", str(tmp_path)]) == 0
    ckpt = torch.load(tmp_path / "grown-ct.pt", weights_only=True)
    assert ckpt["config"]["depth"] == 8 and ckpt["config"]["layer_norm"]
    source, x, _ = zoo.load("mnist-vit4-ln-ct")
    model = model_formats.checkpoint(tmp_path / "grown-ct.pt").eval()
    with torch.no_grad():  # lr 1e-12: one step moves no logit visibly
        assert torch.allclose(model(x[:8].float()), grown(source, 8).eval()(x[:8].float()), atol=1e-5)
    monkeypatch.setitem(train.CERTIFIED, "grown-ct", ("mnist-vit8", recorded, dict(start_from="mnist-vit4-ln-ct")))
    assert softcert.cli.main(["train", "--certified", "grown-ct", "--n", "16", "--out", str(tmp_path)]) == 2
    assert "not the recipe's architecture at another depth (layer_norm differs)" in capsys.readouterr().err
    monkeypatch.setitem(train.CERTIFIED, "grown-ct", ("mnist-vit8-ln", recorded, dict(start_from="no-such-ct")))
    assert softcert.cli.main(["train", "--certified", "grown-ct", "--n", "16", "--out", str(tmp_path)]) == 2
    assert "softcert train --certified no-such-ct" in capsys.readouterr().err


def test_cli_certified_flags_need_certified(capsys):
    assert softcert.cli.main(["train", "digits-vit1", "--eps", "0.1"]) == 2
    assert "--eps: only with --certified" in capsys.readouterr().err


def test_a_missing_certified_checkpoint_names_the_command_that_trains_it(monkeypatch):
    from softcert.certify import train, zoo

    monkeypatch.setitem(train.CERTIFIED, "no-such-ct", ("digits-vit1", {}))
    with pytest.raises(ValueError, match="softcert train --certified no-such-ct"):
        zoo.load("no-such-ct")


@pytest.mark.parametrize("build", [_vit, _mha], ids=["vit", "mha-layernorm-gelu"])
def test_interval_widths_boxes_hold_every_sampled_node_value(build):
    """certify.interval_widths: every node's largest width is at least the spread of that
    node's values over 130 points of the box (the corners included), the input's width is
    2·eps inside [0, 1], and at eps 0 every box is a point up to rounding."""
    model = build()
    with torch.no_grad():  # no zero bias, which the trace would fold away (a graph of other nodes)
        for p in model.parameters():
            p.add_(0.05 * torch.rand(p.shape, generator=torch.Generator().manual_seed(4), dtype=p.dtype))
    r = certify.interval_widths(model, X, EPS)
    graph = certify.trace(model, X)
    lo, hi = (X - EPS).clamp(0, 1), (X + EPS).clamp(0, 1)
    u = torch.rand(128, *X.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    pts = torch.cat([lo + (hi - lo) * u, lo[None], hi[None]]).reshape(-1, *X.shape[1:])
    values = graph.values(pts.unsqueeze(1), lifted=True)
    assert r.images == 4 and r.dtype == "float64" and r.input_width == pytest.approx(2 * EPS)
    assert [n.index for n in r.nodes] == list(range(1, len(graph.nodes)))
    for n in r.nodes:
        v = values[n.index].reshape(130, 4, -1)
        spread = float((v.amax(0) - v.amin(0)).max())
        assert n.max_width >= spread - 1e-9 * (1 + spread), (n.name, n.operator)
        assert 0 <= n.median_width <= n.max_width
        assert n.name == graph.nodes[n.index].name and n.operator == graph.nodes[n.index].op
    point = certify.interval_widths(model, X, 0.0)
    assert all(n.max_width <= 1e-9 for n in point.nodes)
    assert r.first_above(-1.0) is r.nodes[0] and r.first_above(float("inf")) is None
    with pytest.raises(ValueError, match="^eps:"):
        certify.interval_widths(model, X, -0.1)
    with pytest.raises(ValueError, match="^model:"):
        certify.interval_widths("model", X, EPS)


def test_widths_command_writes_the_growth_table_json_and_figure(tmp_path, capsys):
    argv = ["widths", "--model", "digits-vit1", "--eps", "0.001", "0.05", "--n", "3", "--out", str(tmp_path)]
    assert softcert.cli.main(argv) == 0
    res = json.loads((tmp_path / "widths.json").read_text())
    assert [(d["model"], d["eps"], d["images"]) for d in res["results"]] == [("digits-vit1", 0.001, 3),
                                                                              ("digits-vit1", 0.05, 3)]
    small, large = ([n["max_width"] for n in d["nodes"]] for d in res["results"])
    assert all(a <= b for a, b in zip(small, large))  # a larger ball, boxes at least as wide
    md = (tmp_path / "widths.md").read_text()
    assert "## digits-vit1, eps 0.05 (3 images, float32" in md and "| head |" in md
    assert (tmp_path / "widths.png").stat().st_size > 0
    assert softcert.cli.main(["widths", "--model", "digits-vit1", "--n", "0", "--out", str(tmp_path)]) == 2
    assert "--n" in capsys.readouterr().err

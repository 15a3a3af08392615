"""Models written the way users write them (softcert.cli.user_models), certified end to end.

Oracles: for every model and method, each certified lower margin z_y - z_j must lie below the
margin at 200 points sampled in the ball and at PGD's worst point, and no certified sample may
have an adversarial example; the traced graph must compute the model itself (float64, 1e-10).
Unsupported operators and training-mode dropout must be refused with a ValueError that names
them. The models are trained for a few epochs on sklearn digits (seconds).
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import softcert.cli
from softcert import certify
from softcert.certify.data import digits
from softcert.certify.trace import logits_of, trace
from softcert.cli import user_models

METHODS = ("crown", "alpha-crown", "vertex", "ibp")
N_IMAGES, EPS, SAMPLES = 3, 0.004, 200
TOL = 1e-9  # sampled margins are float64 forward passes; certified bounds are widened by more


@pytest.fixture(scope="module")
def data():
    xtr, ytr, xte, yte = digits()
    return xtr, ytr, xte, yte


_TRAINED = {}


def _trained(name, data):
    """``name`` trained 6 epochs on 600 training digits (enough for the oracles, which need
    correctly classified digits and a non-vacuous bound; cached: each model is trained once)."""
    if name not in _TRAINED:
        xtr, ytr, _, _ = data
        _TRAINED[name] = user_models.train(user_models.make(name), xtr[:600], ytr[:600], epochs=6, seed=0)
    return _TRAINED[name]


def _margins(model64, x, label):
    """z_y - z_j (B, K) in float64."""
    with torch.no_grad():
        z = logits_of(model64(x.to(torch.float64)))
    return z.gather(1, label[:, None]) - z


def _ball_samples(x, eps, n, seed):
    """n points per image, uniform in the L∞ ball clipped to [0, 1] (corners included)."""
    gen = torch.Generator().manual_seed(seed)
    x = x.to(torch.float64)
    lo, hi = (x - eps).clamp(0, 1), (x + eps).clamp(0, 1)
    u = torch.rand((n, *x.shape), generator=gen, dtype=torch.float64)
    u[: n // 4] = u[: n // 4].round()  # a quarter at vertices of the box, where margins are extreme
    return lo + (hi - lo) * u


def _correct(model, x, y):
    with torch.no_grad():
        keep = logits_of(model(x)).argmax(1) == y
    return x[keep][:N_IMAGES], y[keep][:N_IMAGES]


def _oracle_margins(model, x, y, eps):
    """Margins (B, K) that no certified lower bound may exceed: the elementwise minimum over
    SAMPLES points of the ball, and the margins at PGD's worst point; plus the PGD result."""
    m64 = copy.deepcopy(model).double().eval()
    pts = _ball_samples(x, eps, SAMPLES, seed=1)
    sampled = _margins(m64, pts.flatten(0, 1), y.repeat(SAMPLES)).view(SAMPLES, *x.shape[:1], -1).amin(0)
    att = certify.attack(model, x, y, eps)
    return sampled, _margins(m64, att.x_adv, y), att


@pytest.mark.parametrize("name", user_models.NAMES)
def test_user_model_sound_under_every_method(name, data):
    model = _trained(name, data)
    x, y = _correct(model, data[2], data[3])
    assert len(y) == N_IMAGES
    sampled, at_pgd, att = _oracle_margins(model, x, y, EPS)
    certified = {}
    for meth in METHODS:
        res = certify.verify(model, x, y, EPS, method=meth)
        lower = res.lower_margin
        assert res.method == meth and lower.shape == (N_IMAGES, 10) and not lower.isnan().any()
        gap = (lower - sampled).max()
        assert gap <= TOL, f"{meth}: a sampled margin lies {gap:.3g} below the certified bound"
        gap = (lower - at_pgd).max()
        assert gap <= TOL, f"{meth}: PGD's margin lies {gap:.3g} below the certified bound"
        assert not (res.certified & (att.min_margin < 0)).any(), f"{meth} certified an image PGD broke"
        certified[meth] = res.certified
    # not vacuous: at this small radius CROWN proves something on every model
    assert certified["crown"].any(), f"{name}: CROWN certified none of {N_IMAGES} images at eps={EPS}"


@pytest.mark.parametrize("name", user_models.NAMES)
def test_traced_graph_computes_the_model(name, data):
    model = user_models.make(name)  # the weights do not matter for this check
    x = data[2][:5]
    g = trace(model, x[:1])
    with torch.no_grad():
        expected = logits_of(copy.deepcopy(model).double().eval()(x.double()))
    torch.testing.assert_close(certify.forward(g, x.unsqueeze(1))[:, 0], expected, rtol=1e-10, atol=1e-10)


class _Ranker(nn.Module):
    def forward(self, t):
        return torch.sort(t, dim=-1).values


class _SortingModel(nn.Module):
    """A user model with an unsupported operator deep inside: encoder.ranker calls torch.sort."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(64, 8)
        self.encoder = nn.Sequential()
        self.encoder.add_module("ranker", _Ranker())
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        return self.head(self.encoder(self.embed(x.flatten(1))))


def test_unsupported_operator_names_operator_and_module(data):
    x, y = data[2][:1], data[3][:1]
    with pytest.raises(ValueError, match=r"aten\.sort.*'encoder\.ranker'"):
        certify.verify(_SortingModel().eval(), x, y, 0.01)


def _qkv_with_dropout():
    model = user_models.make("qkv")
    model.mlp.insert(1, nn.Dropout(0.2))  # a plain nn.Dropout, not the attention's own
    return model


def _conv_batch_norm():
    return nn.Sequential(nn.Conv2d(1, 4, 4, stride=4), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(16, 10))


@pytest.mark.parametrize("make", [lambda: user_models.make("encoder-post-norm"), _qkv_with_dropout, _conv_batch_norm],
                         ids=["encoder-layer", "nn.Dropout", "nn.BatchNorm2d"])
def test_training_mode_refused(make, data):
    model = make().train()  # dropout / batch statistics in training mode: not the eval-mode function
    x, y = data[2][:1], data[3][:1]
    with pytest.raises(ValueError, match=r"(dropout|batch norm).*model\.eval\(\)"):
        certify.verify(model, x, y, 0.01)


def test_hf_bert_text_ball_on_one_token():
    model = user_models.hf_bert(seed=0)
    ids = torch.tensor([[2, 7, 11, 5, 3]])
    with torch.no_grad():
        label = model(input_ids=ids).logits.argmax(1)
    eps, pos = 0.01, 2
    res = certify.verify_text(model, ids, label, eps, positions=[pos])
    lower = res.lower_margin
    assert lower.shape == (1, 2) and not lower.isnan().any()
    # oracle: the ball is on the word embedding of token `pos`; sample it through inputs_embeds
    m64 = copy.deepcopy(model).double().eval()
    emb = m64.get_input_embeddings()(ids)
    gen = torch.Generator().manual_seed(0)
    d = (2 * torch.rand((SAMPLES, emb.shape[-1]), generator=gen, dtype=torch.float64) - 1) * eps
    d[: SAMPLES // 4] = d[: SAMPLES // 4].sign() * eps
    e = emb.expand(SAMPLES, -1, -1).clone()
    e[:, pos] += d
    with torch.no_grad():
        z = m64(inputs_embeds=e).logits
    margins = z[:, label] - z
    assert (lower - margins).max() <= TOL
    other = 1 - label.item()
    assert lower[0, label.item()] == 0 and lower[0, other] <= margins[:, other].min() + TOL


def test_readme_lists_the_supported_operators():
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"<!-- supported-operators -->\n```\n(.*?)```\n<!-- /supported-operators -->", text, re.S)
    assert block, "README: the supported-operators block is missing"
    listed = block.group(1).replace(",", " ").split()
    assert sorted(listed) == sorted(certify.supported_operators())


def test_usermodels_command_writes_table(tmp_path):
    rc = softcert.cli.main(["usermodels", "--model", "qkv", "--eps", "0.002", "--methods", "crown", "ibp",
                            "--n", "3", "--epochs", "2", "--out", str(tmp_path)])
    assert rc == 0
    data = json.loads((tmp_path / "user-models.json").read_text())
    assert data["command"].startswith("softcert usermodels --model qkv")
    rows = data["rows"]
    assert [r["method"] for r in rows] == ["crown", "ibp"]
    for r in rows:
        assert r["certified_acc"] <= r["pgd_acc"] <= r["clean_acc"]
    md = (tmp_path / "user-models.md").read_text()
    assert "Regenerate: `softcert usermodels --model qkv" in md and "| 0.002 | crown |" in md

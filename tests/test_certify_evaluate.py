"""The library loop attack -> verify -> soundness check, the method registry, the
verifier's own attention scores, and assumptions as data (also under ``python -OO``)."""
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from softcert import certify
from softcert.certify import evaluation as evaluate_module
from softcert.certify.api import CertResult
from softcert.certify.models import ViT
from softcert.certify.options import AttackOptions


def _model():
    torch.manual_seed(5)
    m = ViT(image=(1, 8, 8), patch=4, dim=8, heads=2, mlp=8, classes=3, depth=2, layer_norm=True,
            pool="cls").eval()
    x = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = m(x).argmax(1)
    y[3] = (y[3] + 1) % 3  # one misclassified image
    return m, x, y


M, X, Y = _model()


@pytest.fixture(scope="module")
def ev():
    calls = []
    out = certify.evaluate(M, X, Y, [0.0, 0.002, 0.05], ["ibp", "crown"],
                           attack=AttackOptions(steps=5, restarts=1),
                           progress=lambda done, total, what: calls.append((done, total, what)))
    return out, calls


def test_records_cover_every_image_eps_and_method(ev):
    e, calls = ev
    assert len(e.records) == 4 * 3 * 2 and e.n == 4
    assert [c[0] for c in calls] == list(range(1, 10)) and all(c[1] == 9 for c in calls)
    for r in e.records:
        assert isinstance(r, certify.Record)
        if r.index == 3:
            assert not (r.correct or r.robust or r.certified) and r.lower_margin is None
        else:
            assert r.correct and r.seconds >= 0
            assert r.pgd_margin >= r.lower_margin - 1e-9  # the loop's own soundness check held
    with pytest.raises(AttributeError):
        e.records[0].certified = True  # frozen


def test_certified_accuracy_matches_verify(ev):
    e, _ = ev
    for eps in e.eps:
        for meth in e.methods:
            res = certify.verify(M, X[:3], Y[:3], eps, method=meth)
            assert e.certified_accuracy(eps, meth) == (int(res.certified.sum()), 4)
            assert certify.certified_accuracy(e.records, eps, meth) == e.certified_accuracy(eps, meth)
        k, n = e.robust_accuracy(eps)
        assert n == 4 and k <= 3 and k >= e.certified_accuracy(eps, "crown")[0]
    assert e.clean_accuracy() == (3, 4)
    assert e.certified_accuracy(0.0, "crown") == (3, 4)  # eps = 0: every correct image


def test_a_certificate_broken_by_the_attack_raises(monkeypatch):
    def liar(model, x, label, eps, method="crown", batch_size=8, *, domain=(0.0, 1.0)):
        lo = torch.full((x.shape[0], 3), 100.0, dtype=torch.float64)
        lo[torch.arange(x.shape[0]), label] = 0.0
        return CertResult(lo, torch.ones(x.shape[0], dtype=torch.bool), method, float(eps), 0.0)

    monkeypatch.setattr(evaluate_module, "verify", liar)
    with pytest.raises(certify.SoundnessError, match="soundness violation"):
        certify.evaluate(M, X[:3], Y[:3], [0.3], ["crown"], attack=AttackOptions(steps=5, restarts=1))


def test_cascade_certifies_the_union_and_bounds_only_the_open_images(monkeypatch):
    # eps 0: IBP certifies every correct image, so CROWN is skipped; 0.002: IBP none, CROWN all;
    # 1.0 (the whole domain): PGD breaks images 1 and 2, which no method may be asked to bound
    radii, attack = [0.0, 0.002, 1.0], AttackOptions(steps=5, restarts=1)
    full = certify.evaluate(M, X, Y, radii, ["ibp", "crown"], attack=attack)
    bounded = []

    def counting(model, x, label, eps, method="crown", **kw):
        bounded.append((eps, method, x.shape[0]))
        return certify.verify(model, x, label, eps, method=method, **kw)

    monkeypatch.setattr(evaluate_module, "verify", counting)
    casc = certify.evaluate(M, X, Y, radii, certify.Cascade(["ibp", "crown"]), attack=attack)
    assert bounded == [(0.0, "ibp", 3), (0.002, "ibp", 3), (0.002, "crown", 3), (1.0, "ibp", 1), (1.0, "crown", 1)]
    by = {(r.index, r.eps, r.method): r for r in casc.records}
    for r in full.records:
        c = by[r.index, r.eps, r.method]
        either = r.certified or by[r.index, r.eps, "ibp"].certified if r.method == "crown" else r.certified
        assert c.correct == r.correct and c.robust == r.robust and c.certified == either
        if c.skipped == certify.SKIP_BROKEN:
            assert not c.robust and c.lower_margin is None and c.class_margins is None
        elif c.skipped:
            ibp = by[r.index, r.eps, "ibp"]
            assert c.skipped == "certified by ibp" and c.lower_margin == ibp.lower_margin > 0
        elif c.correct:
            assert c.lower_margin == pytest.approx(r.lower_margin, rel=1e-9, abs=1e-12)
    kinds = {r.skipped for r in casc.records}
    assert kinds == {"", "certified by ibp", certify.SKIP_BROKEN}
    with pytest.raises(ValueError, match="Cascade.methods"):
        certify.Cascade("ibp")  # a string is not a sequence of names here


@pytest.mark.parametrize("bad", [dict(eps_list=[]), dict(methods=["nope"]), dict(attack=AttackOptions(steps=0)),
                                 dict(attack=AttackOptions(restarts=0)), dict(attack=AttackOptions(enabled=False)),
                                 dict(attack=(40, 2)),
                                 dict(progress="bar"), dict(eps_list=[-1.0]),
                                 dict(methods=certify.Cascade(["ibp", "nope"]))])
def test_evaluate_validates(bad):
    kw = dict(eps_list=[0.01], methods=["ibp"], attack=AttackOptions(steps=2)) | bad
    with pytest.raises(ValueError, match=next(iter(bad)).replace("_list", "")):
        certify.evaluate(M, X, Y, kw.pop("eps_list"), kw.pop("methods"), **kw)


def test_method_registry_carries_descriptions_and_assumptions():
    assert list(certify.METHODS) == ["ibp", "crown", "alpha-crown", "vertex", "alpha-crown-relu",
                                     "alpha-crown-intermediate", "lirpa-ibp", "lirpa-crown", "lirpa-alpha-crown", "bab",
                                     "bab-vertex"]
    for name, m in certify.METHODS.items():
        assert m.name == name and m.description and m.assumptions
        # one table: the complete methods (three-valued verdicts) are registered beside the others
        assert m.complete == name.startswith("bab") and (m.lower is None) == m.complete
    r = certify.verify(M, X[:1], Y[:1], 0.01, method="crown")
    assert r.assumptions == certify.METHODS["crown"].assumptions and "float64" in r.assumptions
    with pytest.raises(TypeError):
        certify.METHODS["mine"] = certify.METHODS["crown"]  # listed once, read-only


# certify's own modules compiled as under ``python -OO`` (docstrings stripped); a real -OO
# run would recompile all of torch without a bytecode cache (over a minute)
_OO = """
import importlib.machinery as im, sys
import torch, numpy
from softcert import bounds

class Stripped(im.SourceFileLoader):
    def get_code(self, name):
        path = self.get_filename(name)
        return compile(self.get_data(path), path, "exec", dont_inherit=True, optimize=2)

class Finder:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name != "softcert.certify" and not name.startswith("softcert.certify."):
            return None
        for finder in sys.meta_path:  # the installed layout's finder (editable or not) locates the file
            if finder is not Finder and hasattr(finder, "find_spec"):
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    spec.loader = Stripped(spec.loader.name, spec.loader.path)
                    return spec
        return None

sys.meta_path.insert(0, Finder)
from softcert import certify
from softcert.certify import crown
from softcert.certify.models import ViT
assert crown.__doc__ is None and certify.verify.__doc__ is None
m = ViT(image=(1, 4, 4), patch=2, dim=4, heads=1, mlp=4, classes=2).eval()
r = certify.verify(m, torch.rand(1, 1, 4, 4), [0], 0.01, method="ibp")
assert "float64" in r.assumptions, r.assumptions
print("ok")
"""


def test_assumptions_survive_stripped_docstrings():
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", _OO], cwd=root, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_attention_scores_match_the_model():
    a = certify.attention_scores(M, X)
    assert isinstance(a, certify.AttentionScores)
    m = M.double()
    # oracle: the model's own modules, block by block
    with torch.no_grad():
        t = m.embed(m.patchify(X.double()))
        t = torch.cat([m.cls.expand(t.shape[0], 1, -1), t], dim=1) + m.pos
        for i, blk in enumerate(m.blocks):
            h = blk.norm1(t)
            at = blk.attn
            q, k, v = at.split(at.q(h)), at.split(at.k(h)), at.split(at.v(h))
            s = q @ k.transpose(-1, -2) / math.sqrt(at.dim // at.heads)
            torch.testing.assert_close(a.scores[:, i], s, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(a.values[:, i], v, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(a.keys_by_queries[:, i], s.transpose(-1, -2), rtol=1e-12, atol=1e-12)
            t = blk(t)
    M.float()
    assert a.scores.shape == (4, 2, 2, 5, 5) and a.values.shape == (4, 2, 2, 5, 4)

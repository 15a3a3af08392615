"""The auto_LiRPA compatibility layer: the ReduceMax fix is needed for soundness, and the
Vertex-Softmax Bound class is sound when plugged in with custom_ops."""
import sys

import pytest
import torch

from softcert import certify
from softcert.certify import lirpa_compat
from softcert.certify.models import ViT
from softcert.certify.spec import input_box, margin_spec

EPS = 0.02


def _setup():
    # sharp attention (large scores): the case where the unpatched ReduceMax goes wrong
    torch.manual_seed(2)
    m = ViT(image=(1, 4, 4), patch=2, dim=8, heads=2, mlp=8, depth=1, classes=3).eval()
    with torch.no_grad():
        for lin in (m.blocks[0].attn.q, m.blocks[0].attn.k):
            lin.weight.mul_(3.0)
        m.pos.mul_(50)
    x = torch.rand(4, 1, 4, 4)
    with torch.no_grad():
        y = m(x).argmax(1)
    lo, hi = input_box(x, EPS)
    g = torch.Generator().manual_seed(0)
    pts = lo + (hi - lo) * torch.rand(4000, *x.shape, generator=g)
    with torch.no_grad():
        z = m(pts.reshape(-1, 1, 4, 4)).reshape(4000, 4, 3)
    worst = (z.gather(2, y.view(1, 4, 1).expand(4000, 4, 1)) - z).min(0).values
    return m, m.patchify(x), m.patchify(lo), m.patchify(hi), margin_spec(y, 3).float(), worst


def test_reducemax_fix_is_needed_for_soundness():
    m, z0, zl, zu, C, worst = _setup()
    try:
        unpatched = lirpa_compat.lirpa_lower(m, zl, zu, z0, C, "CROWN", patch_reducemax=False)
    finally:
        lirpa_compat.load(patch_reducemax=True)
    patched = lirpa_compat.lirpa_lower(m, zl, zu, z0, C, "CROWN")
    assert (worst < unpatched.detach() - 1e-4).any()  # sampled points below the "bound"
    assert (worst >= patched.detach() - 1e-5).all()


@pytest.mark.parametrize("method", ["IBP", "CROWN"])
def test_vertex_softmax_bound_class_is_sound(method):
    m, z0, zl, zu, C, worst = _setup()
    cls = lirpa_compat.vertex_softmax_bound()
    lo = lirpa_compat.lirpa_lower(m, zl, zu, z0, C, method, custom_ops={"onnx::Softmax": cls})
    assert torch.isfinite(lo).all()
    assert (worst >= lo.detach() - 1e-5).all()


def test_missing_auto_lirpa_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "auto_LiRPA", None)
    with pytest.raises(ImportError, match="pip install --no-deps auto-lirpa==0.3"):
        lirpa_compat.load()


def test_lirpa_failure_note_names_the_rejected_operator():
    # GELU exports as onnx::Erf, which auto_LiRPA 0.3 does not support: the soft-failure note
    # must say so instead of only "There are unsupported operations"
    m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.Linear(4, 3)).double().eval()
    x = torch.rand(2, 4, dtype=torch.float64)
    r = certify.verify(m, x, m(x).argmax(1), 0.01, method="lirpa-crown", domain=None)
    assert "unsupported: onnx::Erf" in r.note
    assert not r.certified.any()

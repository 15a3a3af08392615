"""The sympy derivations of the report appendix: the same objects the appendix renders."""
from __future__ import annotations

import math

import numpy as np
import pytest
import sympy as sp

from softcert.analysis import ghosts
from softcert.cli import appendix


@pytest.fixture(scope="module")
def ders():
    return {d.key: d for d in appendix.all_derivations()}


def test_every_identity_holds(ders):
    assert set(ders) == {"binary_radius", "half_plane", "tv_kl", "jacobian_norm", "vertex_threshold"}
    for d in ders.values():
        ok = d.verify()
        assert ok and all(ok.values()), (d.key, ok)


def test_binary_radius_object_matches_numeric(ders):
    b = ders["binary_radius"]
    rho_sq = next(obj for _, obj in b.steps if isinstance(obj, sp.Equality) and "rho" in str(obj.lhs)).rhs
    d, D = sorted(rho_sq.free_symbols, key=str)  # Delta, delta
    for delta, Delta, want in ((0.0, 1.0, math.pi), (2.0, 1.0, 3.7241918), (10.0, 3.0, 3.4939568)):
        val = math.sqrt(float(rho_sq.subs({D: delta, d: Delta})))
        assert abs(val - want) < 1e-6 and abs(val - ghosts.binary_radius(delta, Delta)) < 1e-12


def test_tv_kl_numeric(ders, rng):
    import torch

    from softcert.analysis import topk

    s = torch.as_tensor(rng.standard_normal(20))
    for k in (1, 5, 19):
        tau = float(topk.tail_mass(s, k))
        kl = float(topk.truncation_kl(s, k))
        assert abs((1 - math.exp(-kl)) - tau) < 1e-12
    assert ders["tv_kl"].checks["identity"] == 0 or sp.simplify(ders["tv_kl"].checks["identity"]) == 0


def test_jacobian_norm_numeric(rng):
    from softcert.analysis import feedback

    for n in (2, 3, 7):
        for _ in range(20):
            p = rng.dirichlet(np.ones(n) * 0.3)
            assert feedback.jacobian_norm(p) <= 0.5 + 1e-12
    assert abs(feedback.jacobian_norm([0.5, 0.5, 0.0]) - 0.5) < 1e-12


def test_latex_and_markdown_render_each_derivation(ders):
    tex = appendix.render_latex(ders.values())
    md = appendix.render_markdown(ders.values())
    for d in ders.values():
        assert d.title in tex and d.title in md
    assert "FAILS" not in tex and "FAILS" not in md
    assert sp.latex(ders["tv_kl"].steps[0][1]) in tex

"""The generic front end reproduces the bounds of the retired ViT-only path:
tests/data/retired_vit_path.json holds per-image lower margins computed by that path (taken
from docs/certify/results.json before it was regenerated with the current defaults; its
provenance and command are in the file), in its float64 arithmetic with the relative 1e-9
widening (now ``arithmetic("plain")``), and re-verifying the same images in that arithmetic
gives the same bounds to 1e-9.

Sound arithmetic (the default) moves them: the plain path widened every intermediate bound
by 1e-9·(1 + |v|), which compounds through the layers (about 1e-9 relative on the final
margins here), while the proven rounding charges are far smaller; so the sound margins lie
*above* the stored ones by up to ~1e-8 relative. That difference is not a rounding error we
can prove a bound on (it is the old heuristic's own width), so it is checked as measured:
within 1e-7 relative, and never below the stored bound by more than 1e-12 relative."""
import json
from pathlib import Path

import pytest
import torch

from softcert import certify
from softcert.certify import ops, zoo

RESULTS = Path(__file__).resolve().parent / "data" / "retired_vit_path.json"


def _case(method):
    rows = json.loads(RESULTS.read_text())["rows"]
    row = next(r for r in rows if r["model"] == "digits-vit1" and r["eps"] == 0.01 and r["method"] == method)
    m, X, y = zoo.load("digits-vit1")
    n = 3
    stored = [r for r in row["lower_margin"][:n]]
    keep = [i for i, r in enumerate(stored) if r is not None]
    ref = torch.tensor([stored[i] for i in keep], dtype=torch.float64)
    return m, X[keep], y[keep], ref


@pytest.mark.parametrize("method", ["crown", "vertex"])
def test_zoo_bounds_reproduce_the_vit_path(method):
    m, X, y, ref = _case(method)
    # the stored margins were computed with the softmax lowering of their time (exp · 1/Σ exp)
    with certify.softmax_form("product"):
        with ops.arithmetic("plain"):
            res = certify.verify(m, X, y, 0.01, method=method)
        sound = certify.verify(m, X, y, 0.01, method=method).lower_margin
    torch.testing.assert_close(res.lower_margin, ref, rtol=1e-9, atol=1e-9)
    scale = 1 + ref.abs()
    assert ((sound - ref).abs() <= 1e-7 * scale).all()
    assert (sound >= ref - 1e-12 * scale).all()

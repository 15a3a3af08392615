"""The generic front end reproduces the bounds of the retired ViT-only path: docs/certify/
results.json holds per-image lower margins computed by that path (command in the file), and
re-verifying the same images gives the same bounds to 1e-9."""
import json
from pathlib import Path

import pytest
import torch

import certify
from certify import zoo

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "certify" / "results.json"


@pytest.mark.parametrize("method", ["crown", "vertex"])
def test_zoo_bounds_reproduce_the_vit_path(method):
    rows = json.loads(RESULTS.read_text())["rows"]
    row = next(r for r in rows if r["model"] == "digits-vit1" and r["eps"] == 0.01 and r["method"] == method)
    m, X, y = zoo.load("digits-vit1")
    n = 3
    stored = [r for r in row["lower_margin"][:n]]
    keep = [i for i, r in enumerate(stored) if r is not None]
    res = certify.verify(m, X[keep], y[keep], 0.01, method=method)
    ref = torch.tensor([stored[i] for i in keep], dtype=torch.float64)
    torch.testing.assert_close(res.lower_margin, ref, rtol=1e-9, atol=1e-9)

"""Branching rules (certify/bab/branching/): what each picks, and a search with each stays sound."""
import pytest
import torch

from softcert import certify
from softcert.certify import ops
from softcert.certify.bab.branching import RULES, Candidate, GainRule, WidestRule
from softcert.certify.options import BabOptions


def _candidates():
    l = torch.tensor([[-1.0, -4.0, 0.5]], dtype=torch.float64)
    u = torch.tensor([[1.0, 1.0, 2.5]], dtype=torch.float64)
    gl = torch.tensor([[0.0, 0.0, 5.0]], dtype=torch.float64)
    gu = torch.tensor([[-2.0, -0.1, 0.0]], dtype=torch.float64)
    return {7: Candidate(l, u, gl, gu, ops.get("sigmoid").split)}


def test_gain_rule_takes_the_largest_first_order_gain():
    # gains at the midpoints: 2·1 = 2, 0.1·2.5 = 0.25, 5·1 = 5 -> neuron 2
    (d,) = GainRule().decide(_candidates(), 1)
    assert (d.node, d.index, d.lo, d.hi, d.point) == (7, 2, 0.5, 2.5, 1.5)


def test_widest_rule_takes_the_widest_interval():
    (d,) = WidestRule().decide(_candidates(), 1)
    assert (d.node, d.index, d.point) == (7, 1, -1.5)


def test_no_split_point_means_no_decision():
    l = torch.tensor([[0.5, -2.0]], dtype=torch.float64)
    u = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    z = torch.zeros_like(l)
    # a ReLU is only split where it crosses 0: neither neuron here
    assert GainRule().decide({3: Candidate(l, u, z, z, ops.get("relu").split)}, 1) == [None]


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(2, 8), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_rule_gives_sound_verdicts(rule):
    model = Tiny().double().eval()
    x = torch.rand(3, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        y = model(x).argmax(1)
    r = certify.verify(model, x, y, 0.05, "bab", domain=None,
                       options=BabOptions(timeout=20, max_leaves=40, batch=4, branching=rule))
    t = torch.linspace(0, 1, 101, dtype=torch.float64)
    for b in range(3):
        grid = torch.stack(torch.meshgrid(x[b, 0] - 0.05 + 0.1 * t, x[b, 1] - 0.05 + 0.1 * t, indexing="ij"), -1)
        with torch.no_grad():
            z = model(grid.reshape(-1, 2))
        m = (z[:, y[b]:y[b] + 1] - z).min(0).values
        assert (r.lower_margin[b] <= m + 1e-12).all()
        if r.status[b] == "certified":
            assert (m[torch.arange(3) != y[b]] > 0).all()

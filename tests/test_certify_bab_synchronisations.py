"""Host synchronisations per round of branch and bound (certify.bab), counted on the CPU.

On a GPU every read of a device value by the host (``.item()``, a tensor in an ``if``,
``.tolist()``, a boolean mask...) waits for the device; a round of branch and bound (one batch
of leaves bounded, scored and split) must make a number of them that does not grow with the
leaves in the batch. ``bab_sync_counter.SyncCounter`` (a ``TorchFunctionMode``) counts them by
the certify module that makes them. The model has one splittable node (a ReLU layer) and
piecewise-linear relaxations, so every round runs the same code whatever its leaves: the count
per round is one constant, the same at batch 4 and at batch 32, and any sync per leaf (in the
engine or in the relaxations it calls) breaks the equality. docs/certify/bab.notes.md
("Host synchronisations per round", "Host reads in the relaxations") has the numbers on a zoo
model; tests/test_certify_host_reads.py counts one CROWN pass.
"""
import collections
import math

import pytest
import torch
from bab_sync_counter import UPLOADS, SyncCounter

from softcert import certify
from softcert.certify import bab
from softcert.certify.bab import search
from softcert.certify.bab.engine import LeafBounder, Rows
from softcert.certify.graph_cache import graph_of
from softcert.certify.ops import host
from softcert.certify.spec import input_box, margin_spec


class _ReluNet(torch.nn.Module):
    """2 -> 32 ReLU -> 3: one splittable node, wide enough for rounds of 32 leaves."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(2, 32), torch.nn.Linear(32, 3)
        with torch.no_grad():
            for p in self.parameters():
                p.normal_(0, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _rounds(batch, monkeypatch):
    """Branch and bound at ``batch`` leaves per round: per round (leaves split, Counter of
    (certify module, kind) of the syncs made in it). The attack callback finds nothing, so
    every ``leaf_every``-th round still picks and uploads its start points."""
    model = _ReluNet().double().eval()
    x = torch.tensor([[0.3, -0.2]], dtype=torch.float64)
    with torch.no_grad():
        y = model(x).argmax(1)
    g = graph_of(model, x)
    lo, hi = input_box(x, 0.5, None)
    C = margin_spec(y, 3).reshape(3, 1, 3)[[j for j in range(3) if j != int(y)]]
    counter, rounds = SyncCounter(sites=True), []
    real = search._Search.round

    def counted(self, number, deadline):
        before, taken = collections.Counter(counter.by_module), min(len(self.queue), self.batch)
        out = real(self, number, deadline)
        rounds.append((taken, counter.by_module - before))
        return out

    opts = certify.BabOptions(batch=batch, max_leaves=2 + 8 * batch, intermediate="full")
    with monkeypatch.context() as patch, counter:
        patch.setattr(search._Search, "round", counted)
        bab.branch_and_bound(g, lo.unsqueeze(1), hi.unsqueeze(1), Rows(C, torch.zeros(2), torch.arange(2)),
                             deadline=math.inf, options=opts, falsify=lambda starts: None, centre=x.unsqueeze(1))
    return rounds


def _syncs(counts, modules=lambda m: True, uploads=False):
    return sum(v for (m, kind), v in counts.items() if modules(m) and (kind in UPLOADS) == uploads)


@pytest.mark.parametrize("policy", ["read", "defer"])
def test_a_round_syncs_as_often_at_batch_4_as_at_batch_32(monkeypatch, policy):
    """``policy``: the relaxations' reads (``certify.ops.host``): "read" as on the CPU (71 per
    round), "defer" as on a GPU: one per ``read_once`` block, Adam's loop and the final pass."""
    with host.reads(policy):
        small, large = _rounds(4, monkeypatch), _rounds(32, monkeypatch)
    assert max(t for t, _ in small) == 4 and max(t for t, _ in large) == 32  # full batches were split
    per_round = {_syncs(c) for _, c in small + large}
    assert len(per_round) == 1, [(t, _syncs(c)) for t, c in small + large]
    if policy == "defer":
        assert per_round == {3}, per_round
    # the engine's own: the leaves' values and decisions read once; one upload of the batch
    # (groups and split constraints), one more for the attack's start points every other round
    in_bab = lambda m: m.startswith("bab/")  # noqa: E731
    for _, c in small + large:
        assert _syncs(c, in_bab) == 1, c
    for rounds in (small, large):
        for number, (_, c) in enumerate(rounds):
            assert _syncs(c, in_bab, uploads=True) == 1 + (number % certify.AttackOptions().leaf_every == 0), c


def test_the_counter_sees_every_kind_of_synchronisation():
    t = torch.arange(6.0)
    mask = t > 2
    with SyncCounter() as counter:
        bool(t.sum() > 0)
        int(t.argmax())
        float(t.max())
        t[0].item()
        t.tolist()
        t.cpu()
        t.nonzero()
        torch.where(mask)
        t[mask]
        torch.unique(t)
        t.masked_select(mask)
        torch.tensor([1.0, 2.0], device=t.device)
        t[[0, 1]]
        t + 1  # none
    assert counter.counts == {"bool": 1, "int": 1, "float": 1, "item": 1, "tolist": 1, "cpu": 1, "nonzero": 1,
                              "where_nonzero": 1, "mask_index": 1, "unique": 1, "masked_select": 1,
                              "to_device": 1, "list_index": 1}
    assert counter.total == 11


@pytest.mark.parametrize("paused", [True, False])
def test_a_paused_counter_counts_nothing(paused):
    with SyncCounter() as counter:
        if paused:
            with counter.paused():
                torch.ones(1).item()
        else:
            torch.ones(1).item()
    assert counter.total == (0 if paused else 1)


def test_a_batch_without_a_finite_bound_scores_by_zero_gradients(monkeypatch):
    """The engine sums the finite bounds by a mask it never reads; where no bound of the batch
    is finite (the attention model of test_certify_bab at eps 0.2: -inf at the root) the
    split scores get zero gradients, as when it skipped the backward pass on the host: the
    mask's 0 times an infinite partial upstream would be NaN, and NaN scores change the splits."""
    from test_certify_bab import MODEL, X, Y
    x, y = X[:1], Y[:1]
    lo, hi = input_box(x, 0.2, None)
    C = margin_spec(y, 3).reshape(3, 1, 3)[[j for j in range(3) if j != int(y)]]
    eng = LeafBounder(graph_of(MODEL, x), (lo.unsqueeze(1), hi.unsqueeze(1)), Rows(C, torch.zeros(2), torch.arange(2)),
                      x.unsqueeze(1), certify.BabOptions(intermediate="full"))
    seen, real = [], LeafBounder._candidates
    monkeypatch.setattr(LeafBounder, "_candidates", lambda self, tracked, grad, params:
                        seen.append(grad) or real(self, tracked, grad, params))
    res = eng.bound([{}, {}], [0, 1], None, None)
    assert not torch.isfinite(res.lower).any()
    grads = [g for g in seen[0].values() if g is not None]
    assert grads and all(bool((g == 0).all()) for g in grads)

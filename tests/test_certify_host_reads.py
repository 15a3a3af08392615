"""Host reads in the bounding pass (certify/ops/host.py, issue 30), counted on the CPU.

Off the CPU the operators avoid reading the device ("defer"): they mask instead of indexing,
read a Newton search's convergence every few steps, and batch their tests into one read per
``read_once`` block. ``host.reads("defer")`` runs that path here, where ``SyncCounter``
(tests/bab_sync_counter.py) counts the reads a GPU would wait for. docs/certify/bab.notes.md
("Host reads in the relaxations") has the numbers.
"""
import math

import pytest
import torch
from bab_sync_counter import UPLOADS, SyncCounter, crown_pass

from softcert import certify
from softcert.certify import zoo
from softcert.certify.ops import activations as act
from softcert.certify.ops import host, weighted_sum

#: few large chunks (a faster count; the reads do not depend on the chunking)
OPTIONS = certify.PropagationOptions(chunk_elements=2**22)


def test_a_crown_pass_reads_the_device_as_often_for_one_image_as_for_two():
    """digits-vit1: 7 nodes get CROWN bounds, each one ``read_once`` block (its chunks'
    tests), and the margins one more: 8 reads; the sigmoid's default planes run 4 Newton
    searches (2 tangent points, 2 intercepts), each read at most len(SEARCH_READS) times. The
    same bound at batch 1 and 2 (was 250 and 392 reads, 183 and 315 of them weighted_sum's
    tests for infinities, and 12 to 20 uploads)."""
    with host.reads("defer"):
        one, two = (crown_pass("digits-vit1", images, 0.08, options=OPTIONS) for images in (slice(0, 1), slice(1, 3)))
    for c in (one, two):
        assert c.counts["tolist"] == 8, c.counts
        assert c.counts["nonzero"] <= 4 * len(act.SEARCH_READS), c.counts
        assert c.total == c.counts["tolist"] + c.counts["nonzero"], c.counts
        assert not any(c.counts[k] for k in UPLOADS), c.counts


def test_deferred_reads_give_the_margins_of_reading_at_once():
    """The masked searches and pieces take each element's iterates of the indexed ones; on
    the CPU only the sigmoid's rounding of a kernel's scalar tail (position-dependent) differs."""
    model, x, y = zoo.load("digits-vit1")
    x, y = x[:2].to(torch.float64), y[:2]
    at_once = certify.verify(model, x, y, 0.05, "crown").lower_margin
    with host.reads("defer"):
        deferred = certify.verify(model, x, y, 0.05, "crown").lower_margin
    assert torch.allclose(deferred, at_once, rtol=1e-12, atol=0)


def _sum_then_check(W, v):
    s = weighted_sum(W, v)
    host.require(torch.isfinite(s).all(), lambda: ValueError("not finite"))
    return s


@pytest.mark.parametrize("policy", ["read", "defer"])
def test_an_infinite_weight_behind_a_zero_coefficient_is_run_again_at_once(policy):
    """Deferred, the sum takes the matrix product (0·inf = NaN), so the check after it fails;
    the block's one read sees the infinity and runs the block again, reading at once: the
    masked sum, which gives 0 for the zero coefficient, and the check passes."""
    W = torch.tensor([[[1.0, 0.0], [2.0, 0.0]]], dtype=torch.float64)  # (B, S, n) = (1, 2, 2)
    v = torch.tensor([[[3.0, math.inf]]], dtype=torch.float64)
    with host.reads(policy), SyncCounter() as counter:
        s = host.read_once(lambda: _sum_then_check(W, v), W)
    assert s.tolist() == [[3.0, 6.0]]
    # at once: the test for infinities and the check; deferred: one read for the block, then
    # the second run's two
    assert counter.total == (2 if policy == "read" else 3)


@pytest.mark.parametrize("policy", ["read", "defer"])
def test_a_failed_check_raises_its_own_error_once_the_block_ends(policy):
    ran = []

    def block():
        host.require(torch.tensor(False), lambda: ValueError("first"))
        ran.append("after")
        host.require(torch.tensor(False), lambda: ValueError("second"))
        return 1

    with host.reads(policy), pytest.raises(ValueError, match="^first$"):
        host.read_once(block, torch.zeros(1))
    assert ran == ([] if policy == "read" else ["after"])  # deferred: the block ran to its end


def test_nested_blocks_read_once_and_at_once_reads_at_once():
    W, v = torch.ones(1, 2, 3, dtype=torch.float64), torch.ones(1, 1, 3, dtype=torch.float64)

    def inner():
        return host.read_once(lambda: weighted_sum(W, v), W)

    with host.reads("defer"), SyncCounter() as counter:
        host.read_once(lambda: (inner(), inner()), W)
    assert counter.total == 1
    with host.reads("defer"), SyncCounter() as counter, host.at_once():
        host.read_once(inner, W)
    assert counter.total == 1  # the test itself, at once


def test_a_block_that_raises_without_infinities_raises_its_error():
    def block():
        weighted_sum(torch.ones(1, 1, 2, dtype=torch.float64), torch.ones(1, 1, 2, dtype=torch.float64))
        raise RuntimeError("out of memory")

    with host.reads("defer"), pytest.raises(RuntimeError, match="out of memory"):
        host.read_once(block, torch.zeros(1))


def test_the_policy_is_checked():
    with pytest.raises(ValueError, match="reads: expected one of"):
        with host.reads("sometimes"):
            pass


@pytest.mark.parametrize("name", ["sigmoid", "tanh", "gelu"])
def test_masked_planes_equal_indexed_ones_with_finite_gradients(name):
    """Sigmoid-type planes (Newton searches for tangent and critical points, curvature pieces)
    masked as off the CPU: the same planes within an ulp here (the CPU's sigmoid rounds the
    scalar tail of a kernel apart), and gradients with respect to the bounds and alpha that
    are finite (a masked element's unused 0/0 Newton step must not turn them into NaN)."""
    g = torch.Generator().manual_seed(3)
    c = torch.rand(400, generator=g, dtype=torch.float64) * 12 - 6
    w = 10 ** (torch.rand(400, generator=g, dtype=torch.float64) * 4 - 3)
    alpha = torch.rand(400, generator=g, dtype=torch.float64)
    planes = certify.OPERATORS[name].planes
    out = {}
    for policy in ("read", "defer"):
        l, u, a = (t.clone().requires_grad_(True) for t in (c - w, c + w, alpha))
        with host.reads(policy):
            lw, lb, uw, ub = planes(l, u)
            alw, alb, _, _ = planes(l, u, a)
        total = (lw + lb + uw + ub + alw + alb).sum()
        grads = torch.autograd.grad(total, (l, u, a))
        assert all(torch.isfinite(t).all() for t in grads), policy
        out[policy] = [t.detach() for t in (lw, lb, uw, ub, alw, alb)]
    for r, d in zip(out["read"], out["defer"]):
        assert torch.allclose(r, d, rtol=1e-13, atol=1e-15)

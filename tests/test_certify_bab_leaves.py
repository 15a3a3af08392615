"""The leaf queue, decisions and relaxation parameters of branch and bound (certify/bab/leaves.py)."""
import torch

from softcert.certify.bab.leaves import Decision, Leaf, LeafQueue, RelaxationParams


def _leaf(value, decision=True, group=0):
    d = Decision(1, 0, -1.0, 1.0, 0.0) if decision else None
    return Leaf(group, {}, value, torch.zeros(1, 1), RelaxationParams({}, {}), d)


def test_queue_pops_lowest_first_and_ties_in_push_order():
    q = LeafQueue()
    for v, g in ((-0.5, 0), (-2.0, 1), (-0.5, 2), (-1.0, 3)):
        q.push(_leaf(v, group=g))
    assert [lf.group for lf in q.pop_batch(10)] == [1, 3, 0, 2]
    assert len(q) == 0


def test_queue_stops_at_a_leaf_with_nothing_to_split():
    q = LeafQueue()
    q.push(_leaf(-3.0))
    q.push(_leaf(-2.0, decision=False, group=7))
    q.push(_leaf(-1.0))
    take = q.pop_batch(10)
    # the leaf without a decision stays open in the queue, and so does everything above it
    assert [lf.value for lf in take] == [-3.0] and len(q) == 2
    assert sorted(lf.group for lf in q.leaves()) == [0, 7]


def test_children_replace_only_the_split_neuron():
    parent = {(4, 2): (-1.0, 3.0), (5, 0): (0.0, 1.0)}
    left, right = Decision(4, 2, -1.0, 3.0, 0.5).children(parent)
    assert left[(4, 2)] == (-1.0, 0.5) and right[(4, 2)] == (0.5, 3.0)
    assert left[(5, 0)] == right[(5, 0)] == (0.0, 1.0) and parent[(4, 2)] == (-1.0, 3.0)
    new = Decision(6, 1, 2.0, 4.0, 3.0).children(parent)
    assert all(c[(6, 1)] in ((2.0, 3.0), (3.0, 4.0)) and len(c) == 3 for c in new)


def test_stacked_parameters_start_missing_multipliers_at_zero():
    a = RelaxationParams({3: torch.ones(1, 2, 4)}, {5: (torch.full((1, 2, 4), 2.0), torch.full((1, 2, 4), 3.0))})
    b = RelaxationParams({3: torch.full((1, 2, 4), 0.5)}, {})
    s = RelaxationParams.stack([a, b])
    assert s.alphas[3].shape == (2, 2, 4) and s.alphas[3][1].eq(0.5).all()
    lo, hi = s.betas[5]
    assert lo[0].eq(2.0).all() and hi[0].eq(3.0).all() and lo[1].eq(0).all() and hi[1].eq(0).all()
    assert s.row(1).alphas[3].shape == (1, 2, 4) and s.row(0).betas[5][1].eq(3.0).all()
    assert RelaxationParams.stack([RelaxationParams({}, {})]) is None

"""certify.graph: Graph.values, the node-by-node evaluation of a traced graph."""
import torch
from test_certify_bab import EPS, MODEL, X

from softcert.certify import crown
from softcert.certify.graph_cache import graph_of
from softcert.certify.spec import input_box


def test_values_with_a_box_shift_match_each_sample_alone():
    """With a BoundState's softmax shifts (one box), every sample of a batch gets the box's
    shift index, as if evaluated alone; the output is the model's. (Broadcasting the batch-1
    index through gather instead would subtract sample 0's key score from every sample.)"""
    x = X[:1]
    g = graph_of(MODEL, x)
    lo, hi = input_box(x, EPS, None)
    st = crown.propagate(g, lo.unsqueeze(1), hi.unsqueeze(1), centre=x.unsqueeze(1))
    assert st.consts, "the tiny model has a softmax: its shift index is a const"
    pts = lo + (hi - lo) * torch.rand(20, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    together = g.values(pts, st.consts)
    alone = [g.values(pts[k:k + 1], st.consts) for k in range(len(pts))]
    for i in range(len(g.nodes)):
        # batched and single-row products may sum in another order: within float64 rounding
        torch.testing.assert_close(together[i], torch.cat([a[i] for a in alone]), rtol=1e-12, atol=1e-12)
    with torch.no_grad():
        torch.testing.assert_close(together[-1].squeeze(1), MODEL(pts), rtol=1e-12, atol=1e-12)

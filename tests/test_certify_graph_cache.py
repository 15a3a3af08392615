"""certify.graph_cache: the traced-graph cache (``certify.graph_cache.graph_of``) never answers for a model that is no
longer the one traced: in-place edits through ``.data`` (which leave ``_version`` alone),
plain attributes the forward reads, a submodule switched to train(), a hook, a global. Each
verify after a mutation must equal the verify of a fresh copy (a fresh trace)."""
import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from softcert import certify
from softcert.certify import graph_cache

F64 = torch.float64
OFFSET = [0.0]  # a global the forward of _Global reads


class _Signed(nn.Module):
    """sign · MLP(x) with a Dropout that is the identity in eval mode; ``sign`` a plain float."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3)).double()
        self.sign = 1.0

    def forward(self, x):
        return self.sign * self.net(x)


class _Global(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 2).double()

    def forward(self, x):
        return self.lin(x) + torch.tensor([OFFSET[0], 0.0], dtype=F64)


def _x():
    return torch.tensor([[0.3, 0.6, 0.2, 0.8]], dtype=F64)


def _outcome(model, x, label=0, eps=0.01):
    """verify's lower margins, or the ValueError's message."""
    try:
        return certify.verify(model, x, [label], eps, method="crown").lower_margin
    except ValueError as exc:
        return str(exc)


def _same(a, b):
    return torch.equal(a, b) if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) else a == b


def test_data_edit_after_verify_is_seen():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).double().eval()
    x = _x()
    label = int(m(x).argmax())
    assert certify.verify(m, x, [label], 0.001).certified.all()
    m[2].weight.data.neg_()  # no _version bump through .data
    m[2].bias.data.neg_()
    r = certify.verify(m, x, [label], 0.001)
    z = m(x).detach()[0]
    true = min(float(z[label] - z[j]) for j in range(3) if j != label)
    assert true < 0 and not r.certified.any()
    assert float(r.worst_margin[0]) <= true


def test_plain_attribute_change_is_seen():
    m = _Signed().eval()
    x = _x()
    label = int(m(x).argmax())
    first = certify.verify(m, x, [label], 0.001)
    m.sign = -1.0
    r = certify.verify(m, x, [label], 0.001)
    assert not torch.equal(first.lower_margin, r.lower_margin)
    assert torch.equal(r.lower_margin, certify.verify(copy.deepcopy(m), x, [label], 0.001).lower_margin)


def test_train_switch_of_a_submodule_is_refused_like_a_fresh_model():
    m = _Signed().eval()
    x = _x()
    certify.verify(m, x, [0], 0.001)
    m.net[2].train()
    with pytest.raises(ValueError, match=r"random operator aten\.dropout at 'net\.2'.*model\.eval\(\)"):
        certify.verify(m, x, [0], 0.001)


def test_global_state_is_caught_by_the_output_check():
    m = _Global()
    x = _x()
    OFFSET[0] = 0.0
    try:
        first = _outcome(m, x)
        OFFSET[0] = -5.0  # nothing in the module changed; its output at the traced example did
        assert _same(_outcome(m, x), _outcome(copy.deepcopy(m), x))
        assert not _same(first, _outcome(m, x))
    finally:
        OFFSET[0] = 0.0


def test_unchanged_model_reuses_its_graph():
    m = _Signed().eval()
    x = _x()
    assert graph_cache.graph_of(m, x) is graph_cache.graph_of(m, x)


def test_uncopyable_state_is_never_reused():
    m = _Signed().eval()
    m.gen = torch.Generator()  # a C object without __dict__: cannot be compared, so never cached
    x = _x()
    assert graph_cache.graph_of(m, x) is not graph_cache.graph_of(m, x)


# ---------------------------------------------------------------- mutations, property
def _mutate(m, kind, i, value):
    params = list(m.parameters())
    if kind == "data":
        p = params[i % len(params)]
        p.data.view(-1)[i % p.numel()] = value  # in place, no version bump
    elif kind == "no_grad":
        with torch.no_grad():
            params[i % len(params)].mul_(value)
    elif kind == "sign":
        m.sign = value
    elif kind == "train":
        m.net[2].train(i % 2 == 0)
    elif kind == "relu":
        m.net[1] = nn.Identity() if i % 2 else nn.ReLU()
    elif kind == "hook":
        m.net[3].register_forward_hook(lambda mod, inp, out: out * value)
    elif kind == "state_dict":
        sd = {k: t + value for k, t in m.state_dict().items()}
        m.load_state_dict(sd)


MUTATIONS = st.lists(st.tuples(st.sampled_from(["data", "no_grad", "sign", "train", "relu", "hook", "state_dict"]),
                               st.integers(0, 40), st.floats(-2, 2, allow_nan=False).map(lambda v: round(v, 3))),
                     min_size=1, max_size=3)


@settings(max_examples=12, deadline=None)
@given(MUTATIONS)
def test_verify_after_mutations_equals_a_fresh_trace(mutations):
    m = _Signed().eval()
    x = _x()
    _outcome(m, x)
    for kind, i, value in mutations:
        _mutate(m, kind, i, value)
        assert _same(_outcome(m, x), _outcome(copy.deepcopy(m), x)), (kind, i, value)

"""certify.onnx_graph's comparisons of perturbed values (Greater, Less, GreaterOrEqual,
LessOrEqual, Equal), Where with a perturbed condition, and Not/And/Or of the 0/1 results
(issue 33).

Oracles: onnxruntime (float32) at every corner of the box, at uniform points and at points
exactly on the comparison's boundary (p = q, x = 0) lies inside the IBP and CROWN bounds; the
verifier's forward pass matches onnxruntime; a condition decided on the box gives the chosen
branch's own bounds; a bool value feeding arithmetic is refused naming the node."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper
from test_onnx_graph_reliability import model, ort_run, ours

from softcert.certify.onnx_graph import read_onnx
from softcert.certify.vnncomp import lower_bounds

F64 = torch.float64
#: the rounding charges of the final bounds (outward, at the subnormal scale)
TINY = 1e-12
COMPARISONS = ("Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal")


def _box_bounds(net, xl, xu, method):
    """(lo, hi) of every output over [xl, xu] by ``method`` (C = [I; -I])."""
    n = net.n_outputs
    C = torch.cat([torch.eye(n, dtype=F64), -torch.eye(n, dtype=F64)]).reshape(1, 2 * n, *net.output_shape)
    low = lower_bounds(net.graph, torch.as_tensor(xl, dtype=F64)[None], torch.as_tensor(xu, dtype=F64)[None], C,
                       method)[0].numpy()
    return low[:n], -low[n:]


def _samples(xl, xu, n=150, extra=()):
    """The box's corners, n uniform points (seeded) and the points ``extra`` (e.g. on a
    comparison's boundary), as float32-representable points."""
    lo, hi = xl.reshape(-1), xu.reshape(-1)
    corners = [np.where(np.array(bits, bool), hi, lo) for bits in itertools.product((0, 1), repeat=lo.size)]
    uniform = lo + (hi - lo) * np.random.default_rng(7).random((n, lo.size))
    pts = np.concatenate([np.stack(corners), uniform, np.asarray(extra, dtype=np.float64).reshape(-1, lo.size)])
    return pts.astype(np.float32).astype(np.float64).reshape(-1, *xl.shape[1:])


def _check(m, xl, xu, extra=()):
    """onnxruntime at the sampled points lies inside the IBP and CROWN bounds and equals our
    forward pass (1e-6); returns {method: (lo, hi)}."""
    net = read_onnx(m)
    xs = _samples(xl, xu, extra=extra)
    ys = np.stack([ort_run(m, x[None]).reshape(-1) for x in xs]).astype(np.float64)
    got = np.stack([ours(net, x[None]).reshape(-1) for x in xs])
    np.testing.assert_allclose(got, ys, rtol=1e-6, atol=1e-6)
    slack = 1e-6 * np.maximum(1.0, np.abs(ys))  # onnxruntime computes in float32
    out = {}
    for method in ("ibp", "crown"):
        lo, hi = _box_bounds(net, xl, xu, method)
        assert (ys >= lo - slack).all() and (ys <= hi + slack).all(), method
        out[method] = (lo, hi)
    return out


def _pair(nodes, inits=(), out=1):
    """A model on x of shape (1, 2) split into p = x[:, :1], q = x[:, 1:], then ``nodes``."""
    split = helper.make_node("Split", ["x", "sizes"], ["p", "q"], axis=1)
    return model([split, *nodes], [1, 2], [1, out], inits=[("sizes", np.array([1, 1], np.int64)), *inits])


def _select(op):
    """y = Where(op(p, q), 2 p, q - 1)."""
    return _pair([helper.make_node(op, ["p", "q"], ["g"], name="cmp"),
                  helper.make_node("Mul", ["p", "two"], ["a"]), helper.make_node("Sub", ["q", "one"], ["b"]),
                  helper.make_node("Where", ["g", "a", "b"], ["y"], name="sel")],
                 inits=[("two", np.float32(2.0)), ("one", np.float32(1.0))])


#: boxes (p range, q range): decided true for >, decided false for >, undecided, a point box on p = q
BOXES = {"above": ((1.0, 2.0), (-1.0, 0.5)), "below": ((-2.0, -1.0), (0.0, 1.0)),
         "crossing": ((-1.0, 1.0), (-0.5, 0.75)), "equal": ((0.25, 0.25), (0.25, 0.25))}


def _diagonal(box, n=12):
    """Points with p = q inside the box (empty where the ranges do not meet)."""
    lo, hi = max(box[0][0], box[1][0]), min(box[0][1], box[1][1])
    return [] if lo > hi else [[t, t] for t in np.linspace(lo, hi, n)]


@pytest.mark.parametrize("op", COMPARISONS)
@pytest.mark.parametrize("box", sorted(BOXES))
def test_where_of_a_comparison_of_perturbed_values(op, box):
    (pl, pu), (ql, qu) = BOXES[box]
    xl, xu = np.array([[pl, ql]]), np.array([[pu, qu]])
    bounds = _check(_select(op), xl, xu, extra=_diagonal(BOXES[box]))
    # on the point box p = q = 0.25 the difference's bounds carry a rounding margin [-e, e]:
    # every comparison stays undecided there (sound, not exact)
    truth = box != "equal" and {"Greater": pl > qu, "Less": pu < ql, "GreaterOrEqual": pl >= qu,
                                "LessOrEqual": pu <= ql, "Equal": pl == pu == ql == qu}[op]
    falsity = box != "equal" and {"Greater": pu <= ql, "Less": pl >= qu, "GreaterOrEqual": pu < ql, "LessOrEqual": pl > qu,
                                  "Equal": pu < ql or qu < pl}[op]
    for lo, hi in bounds.values():
        if truth:  # exactly 2 p (up to the rounding charges)
            np.testing.assert_allclose([lo[0], hi[0]], [2 * pl, 2 * pu], atol=1e-9)
        elif falsity:  # exactly q - 1
            np.testing.assert_allclose([lo[0], hi[0]], [ql - 1, qu - 1], atol=1e-9)
        else:  # both branches are possible: the bounds hold both
            assert lo[0] <= min(2 * pl, ql - 1) + 1e-9 and hi[0] >= max(2 * pu, qu - 1) - 1e-9


@pytest.mark.parametrize("op", COMPARISONS)
def test_a_comparison_with_a_constant_cast_to_float_and_int(op):
    """Cast(op(x, 0.5), FLOAT), and through INT32 (sound only: the int -> float cast is a
    trunc, which the rounding charges of 1 - [..] can widen to [0, 1]); x = 0.5 is sampled."""
    cmp = helper.make_node(op, ["x", "h"], ["g"])
    inits = [("h", np.float32(0.5))]
    xl, xu = np.array([[-1.0, 0.5, 0.75]]), np.array([[0.25, 1.0, 2.0]])
    extra = [[0.0, 0.5, 1.0], [0.25, 0.5, 0.75]]
    _check(model([cmp, helper.make_node("Cast", ["g"], ["i"], to=TensorProto.INT32),
                  helper.make_node("Cast", ["i"], ["y"], to=TensorProto.FLOAT)], [1, 3], [1, 3], inits=inits),
           xl, xu, extra=extra)
    m = model([cmp, helper.make_node("Cast", ["g"], ["y"], to=TensorProto.FLOAT)], [1, 3], [1, 3], inits=inits)
    bounds = _check(m, xl, xu, extra=extra)
    for lo, hi in bounds.values():
        assert (lo >= -TINY).all() and (hi <= 1 + TINY).all()
        decided = {"Greater": [0, None, 1], "Less": [1, None, 0], "GreaterOrEqual": [0, None, 1],
                   "LessOrEqual": [1, None, 0], "Equal": [0, None, 0]}[op]
        for k, v in enumerate(decided):
            if v is not None:
                assert abs(lo[k] - v) <= TINY and abs(hi[k] - v) <= TINY
            else:
                assert abs(lo[k]) <= TINY and abs(hi[k] - 1) <= TINY


def test_relu_as_where_encloses_relu_and_is_exact_where_decided():
    where = model([helper.make_node("Greater", ["x", "z"], ["g"]), helper.make_node("Where", ["g", "x", "z"], ["y"])],
                  [1, 4], [1, 4], inits=[("z", np.float32(0.0))])
    relu = model([helper.make_node("Relu", ["x"], ["y"])], [1, 4], [1, 4])
    xl, xu = np.array([[-1.0, 0.5, -2.0, 0.0]]), np.array([[1.0, 2.0, -1.0, 3.0]])
    bounds = _check(where, xl, xu, extra=[[0.0, 0.5, -1.0, 0.0], [0.0, 1.0, -1.5, 0.0]])
    rlo, rhi = _box_bounds(read_onnx(relu), xl, xu, "ibp")  # exact: [relu l, relu u]
    for lo, hi in bounds.values():
        assert (lo <= rlo + 1e-12).all() and (hi >= rhi - 1e-12).all()  # never tighter than the true range
        np.testing.assert_allclose([lo[1], hi[1], lo[2], hi[2]], [0.5, 2.0, 0.0, 0.0], atol=1e-9)


def test_not_and_or_of_comparisons():
    """y = Cast(Or(And(p > q, Not(p <= 0.5)), q == 0)) and Where(Not(p < q), p, q) = max(p, q)."""
    nodes = [helper.make_node("Greater", ["p", "q"], ["g"]), helper.make_node("LessOrEqual", ["p", "h"], ["le"]),
             helper.make_node("Not", ["le"], ["n"]), helper.make_node("And", ["g", "n"], ["a"]),
             helper.make_node("Equal", ["q", "z"], ["e"]), helper.make_node("Or", ["a", "e"], ["o"]),
             helper.make_node("Cast", ["o"], ["y"], to=TensorProto.FLOAT)]
    inits = [("h", np.float32(0.5)), ("z", np.float32(0.0))]
    boxes = [((-1.0, 1.0), (-1.0, 1.0)), ((0.75, 2.0), (-1.0, 0.5)), ((-1.0, 0.25), (0.5, 1.0)), ((1.0, 1.0), (0.0, 0.0))]
    for (pl, pu), (ql, qu) in boxes:
        xl, xu = np.array([[pl, ql]]), np.array([[pu, qu]])
        extra = [*_diagonal(((pl, pu), (ql, qu))), [0.5, 0.0], [pl, 0.0], [0.5, ql]]
        extra = [e for e in extra if pl <= e[0] <= pu and ql <= e[1] <= qu]
        bounds = _check(_pair(nodes, inits), xl, xu, extra=extra)
        for lo, hi in bounds.values():
            assert -TINY <= lo[0] <= hi[0] <= 1 + TINY  # And, Or: steps, exact images in [0, 1]
            if (pl, ql) == (0.75, -1.0) or (pl, qu) == (1.0, 0.0):  # decided: 1
                assert abs(lo[0] - 1) <= TINY and abs(hi[0] - 1) <= TINY
            if (pu, ql) == (0.25, 0.5):  # p <= 0.25 < 0.5 <= q: decided 0
                assert abs(lo[0]) <= TINY and abs(hi[0]) <= TINY
    mx = _pair([helper.make_node("Less", ["p", "q"], ["l"]), helper.make_node("Not", ["l"], ["n"]),
                helper.make_node("Where", ["n", "p", "q"], ["y"])])
    _check(mx, np.array([[-1.0, -0.5]]), np.array([[1.0, 0.75]]), extra=_diagonal(((-1.0, 1.0), (-0.5, 0.75))))


def test_a_where_with_perturbed_condition_and_constant_branches():
    """Where(x > 0, c1, c2) with constant branches of full shape: the step itself."""
    m = model([helper.make_node("Greater", ["x", "z"], ["g"]), helper.make_node("Where", ["g", "c1", "c2"], ["y"])],
              [1, 3], [1, 3], inits=[("z", np.float32(0.0)), ("c1", np.array([[3.0, -1.0, 0.5]], np.float32)),
                                     ("c2", np.float32(-2.0))])
    xl, xu = np.array([[-1.0, 0.5, -2.0]]), np.array([[1.0, 2.0, -1.0]])
    bounds = _check(m, xl, xu, extra=[[0.0, 1.0, -1.0]])
    for lo, hi in bounds.values():
        np.testing.assert_allclose([lo[1], hi[1], lo[2], hi[2]], [-1.0, -1.0, -2.0, -2.0], atol=1e-9)
        assert lo[0] <= -2.0 and hi[0] >= 3.0


def test_bool_arithmetic_is_refused_naming_the_node():
    m = model([helper.make_node("Greater", ["x", "z"], ["g"]), helper.make_node("Less", ["x", "z"], ["l"]),
               helper.make_node("Add", ["g", "l"], ["s"], name="bool_sum"),
               helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT)], [1, 3], [1, 3],
              inits=[("z", np.float32(0.0))], check=False)
    with pytest.raises(ValueError, match="Add at node 'bool_sum'.*BOOL"):
        read_onnx(m)
    cast_int = model([helper.make_node("Greater", ["x", "z"], ["g"]),
                      helper.make_node("Cast", ["g"], ["i"], to=TensorProto.INT32),
                      helper.make_node("Add", ["i", "i"], ["s"], name="int_sum"),
                      helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT)], [1, 3], [1, 3],
                     inits=[("z", np.float32(0.0))])
    with pytest.raises(ValueError, match="Add at node 'int_sum'.*INT32"):
        read_onnx(cast_int)


def test_xor_of_comparisons_is_exact_where_decided():
    """y = Cast(Xor(p > q, q >= 0)): onnxruntime inside both bounds at corners, samples and
    boundary points; [0, 1] always; decided 1 and 0 boxes give 1 and 0."""
    nodes = [helper.make_node("Greater", ["p", "q"], ["g"]), helper.make_node("GreaterOrEqual", ["q", "z"], ["e"]),
             helper.make_node("Xor", ["g", "e"], ["o"]), helper.make_node("Cast", ["o"], ["y"], to=TensorProto.FLOAT)]
    inits = [("z", np.float32(0.0))]
    cases = {((-1.0, 1.0), (-1.0, 1.0)): None, ((1.0, 2.0), (-1.0, -0.5)): 1.0,  # g true, e false
             ((1.0, 2.0), (0.1, 0.5)): 0.0, ((-2.0, -1.0), (0.1, 1.0)): 1.0, ((-2.0, -1.5), (-1.0, -0.5)): 0.0,
             ((1.0, 2.0), (0.0, 0.5)): None}  # touches q = 0: undecided after outward rounding (sound)
    for ((pl, pu), (ql, qu)), want in cases.items():
        xl, xu = np.array([[pl, ql]]), np.array([[pu, qu]])
        extra = [e for e in [*_diagonal(((pl, pu), (ql, qu))), [pl, 0.0], [pu, 0.0]] if pl <= e[0] <= pu and ql <= e[1] <= qu]
        for lo, hi in _check(_pair(nodes, inits), xl, xu, extra=extra).values():
            assert -TINY <= lo[0] <= hi[0] <= 1 + TINY
            if want is not None:
                assert abs(lo[0] - want) <= TINY and abs(hi[0] - want) <= TINY

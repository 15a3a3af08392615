"""kernels.box_check.plain_box: the one-pass fast path of bounds.box.coefficient_box must never
accept a box the detailed checks reject (each bad kind, at each position), and coefficient_box
must give the same tensors either way."""
import numpy as np
import pytest
import torch

from softcert import bounds
from softcert.bounds.box import coefficient_box
from softcert.kernels.box_check import plain_box

INF, NAN = float("inf"), float("nan")


def _box(n=6, seed=0):
    rng = np.random.default_rng(seed)
    c, lo = rng.normal(size=n), rng.normal(size=n)
    return c, lo, lo + rng.random(n)


@pytest.mark.parametrize("where", [0, 3, 5])
@pytest.mark.parametrize("arg, value", [("c", NAN), ("c", INF), ("c", -INF), ("lo", NAN), ("hi", NAN),
                                        ("hi", INF), ("lo", 10.0), ("mask", None)])
def test_every_bad_entry_fails_the_plain_check(arg, value, where):
    c, lo, hi = _box()
    if arg == "mask":
        lo[where] = hi[where] = -INF
    else:
        {"c": c, "lo": lo, "hi": hi}[arg][where] = value
    assert not plain_box(c, lo, hi)


def test_plain_boxes_pass_and_a_vanishing_lower_bound_is_plain():
    c, lo, hi = _box()
    assert plain_box(c, lo, hi)
    lo[2] = -INF
    assert plain_box(c, lo, hi)
    assert plain_box(c, hi, hi)  # zero width


def test_fast_path_and_detailed_path_agree():
    c, lo, hi = (torch.from_numpy(x).reshape(2, 3) for x in _box())
    fast = coefficient_box(c, lo, hi)
    slow = coefficient_box(c.tolist(), lo.tolist(), hi.tolist())  # lists take the detailed path
    assert all(torch.equal(f, s) for f, s in zip(fast, slow))


@pytest.mark.parametrize("arg, value, word", [("c", NAN, "c: contains NaN"), ("hi", INF, "+inf"),
                                              ("lo", 5.0, "lower > upper")])
def test_bad_float64_tensors_still_name_their_problem(arg, value, word):
    c, lo, hi = (torch.from_numpy(x).reshape(2, 3).clone() for x in _box())
    {"c": c, "lo": lo, "hi": hi}[arg][1, 1] = value
    with pytest.raises(ValueError, match=word.replace("+", r"\+")):
        bounds.vertex_softmax(c, lo, hi)


def test_fully_masked_row_and_finite_only_methods_are_still_refused():
    c, lo, hi = (torch.from_numpy(x).reshape(2, 3).clone() for x in _box())
    lo[0], hi[0] = -INF, -INF
    with pytest.raises(ValueError, match="every entry masked"):
        bounds.vertex_softmax(c, lo, hi)
    c, lo, hi = (torch.from_numpy(x).reshape(2, 3).clone() for x in _box())
    lo[0, 0] = -INF
    with pytest.raises(ValueError, match="finite box"):
        coefficient_box(c, lo, hi, allow_masked=False)

"""certify.vnnlib: VNN-LIB 1.0 / 2.0 files as regions. Oracles: hand-computed regions, the
``vnnlib`` package's own reachability form (single-assert 2.0 files, where it conjoins
correctly), and exact rationals for the outward rounding of literals."""
from __future__ import annotations

import gzip
from fractions import Fraction

import numpy as np
import pytest
import vnnlib as vnnlib_pkg
import vnnlib.compat
from hypothesis import given, settings
from hypothesis import strategies as st

from softcert.certify.vnnlib import Region, parse_vnnlib, read_vnnlib

V1 = """; a VNN-COMP style robustness property
(declare-const X_0 Real)
(declare-const X_1 Real)
(declare-const Y_0 Real)
(declare-const Y_1 Real)
(declare-const Y_2 Real)
(assert (<= X_0 1.0))
(assert (>= X_0 -1.0))
(assert (<= X_1 0.5))
(assert (>= X_1 0.0))
(assert (or (and (<= Y_0 Y_1)) (and (>= Y_2 3.0) (<= (+ Y_0 (* 2.0 Y_1)) 1.5))))
"""

V2 = """(vnnlib-version <2.0>)
(declare-network N
  (declare-input X real [1,2])
  (declare-output Y real [3])
)
(assert (and (<= X[0,0] 1.0) (>= X[0,0] -1.0)))
(assert (<= X[0,1] 0.5))
(assert (>= X[0,1] 0.0))
(assert (or (and (<= Y[0] Y[1])) (and (>= Y[2] 3.0) (<= (+ Y[0] (* 2.0 Y[1])) 1.5))))
"""

WANT = [(np.array([[1.0, -1.0, 0.0]]), np.array([0.0])),
        (np.array([[0.0, 0.0, -1.0], [1.0, 2.0, 0.0]]), np.array([-3.0, 1.5]))]


def check_region(p, lower, upper, disjuncts):
    assert len(p.regions) == 1
    r = p.regions[0]
    np.testing.assert_array_equal(r.lower, lower)
    np.testing.assert_array_equal(r.upper, upper)
    assert len(r.disjuncts) == len(disjuncts)
    for (m, b), (wm, wb) in zip(r.disjuncts, disjuncts):
        np.testing.assert_array_equal(m, wm)
        np.testing.assert_array_equal(b, wb)


@pytest.mark.parametrize("text,version", [(V1, "1.0"), (V2, "2.0")])
def test_both_versions(tmp_path, text, version):
    path = tmp_path / "p.vnnlib"
    path.write_text(text)
    p = read_vnnlib(path)
    assert (p.version, p.n_inputs, p.n_outputs) == (version, 2, 3)
    assert p.network == (None if version == "1.0" else "N")
    check_region(p, [-1.0, 0.0], [1.0, 0.5], WANT)


def test_gzipped(tmp_path):
    with gzip.open(tmp_path / "p.vnnlib.gz", "wt") as f:
        f.write(V1)
    check_region(read_vnnlib(tmp_path / "p.vnnlib.gz"), [-1.0, 0.0], [1.0, 0.5], WANT)


def test_agrees_with_the_vnnlib_package_on_one_assert():
    """vnnlib.compat.transform reads a single-assert 2.0 file into the same region."""
    text = V2.split("(assert")[0] + ("(assert (and (<= X[0,0] 1.0) (>= X[0,0] -1.0) (<= X[0,1] 0.5) (>= X[0,1] 0.0) "
                                     "(or (and (<= Y[0] Y[1])) (and (>= Y[2] 3.0) (<= (+ Y[0] (* 2.0 Y[1])) 1.5)))))")
    cases = vnnlib.compat.transform(vnnlib_pkg.parse_query_string(text))
    (case,) = cases
    ours = parse_vnnlib(text).regions[0]
    np.testing.assert_array_equal(ours.lower, [lo for lo, _ in case.input_box])
    np.testing.assert_array_equal(ours.upper, [hi for _, hi in case.input_box])
    theirs = [(np.array(p.coeff_matrix), np.array(p.rhs)) for p in case.output_constraints]
    assert len(theirs) == len(ours.disjuncts)
    for (m, b), (tm, tb) in zip(ours.disjuncts, theirs):
        np.testing.assert_array_equal(m, tm)
        np.testing.assert_array_equal(b, tb)


def test_disjunction_of_boxes_and_equalities():
    text = """(declare-const X_0 Real)
(declare-const Y_0 Real)
(declare-const Y_1 Real)
(assert (or (and (>= X_0 0) (<= X_0 1) (= Y_0 Y_1))
            (and (>= X_0 2) (<= X_0 3) (> Y_0 (- 1)))
            (and (>= X_0 2) (<= X_0 3) (< (- Y_1 Y_0) 0.5))
            (and (>= X_0 5) (<= X_0 4))))
"""
    p = parse_vnnlib(text)
    assert len(p.regions) == 2  # the empty box is dropped, equal boxes merged
    a, b = p.regions
    np.testing.assert_array_equal([a.lower, a.upper], [[0.0], [1.0]])
    np.testing.assert_array_equal(a.disjuncts[0][0], [[1.0, -1.0], [-1.0, 1.0]])
    np.testing.assert_array_equal(b.disjuncts[0][0], [[-1.0, 0.0]])
    np.testing.assert_array_equal(b.disjuncts[0][1], [1.0])
    np.testing.assert_array_equal(b.disjuncts[1][0], [[-1.0, 1.0]])
    assert a.satisfied([0.25, 0.25]) and not a.satisfied([0.25, 0.5])
    assert b.satisfied([0.0, 0.4]) and not b.satisfied([-2.0, 1.0])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.decimals(-100, 100, places=7, allow_nan=False),
                          st.decimals(0, 10, places=9, allow_nan=False)), min_size=1, max_size=4),
       st.decimals(-50, 50, places=11, allow_nan=False))
def test_literals_round_outward(bounds_, rhs):
    """Box bounds and rhs given as decimals: the float64 region contains the exact one."""
    n = len(bounds_)
    text = "".join(f"(declare-const X_{i} Real)\n" for i in range(n)) + "(declare-const Y_0 Real)\n"
    for i, (lo, w) in enumerate(bounds_):
        text += f"(assert (>= X_{i} {lo}))\n(assert (<= X_{i} {lo + w}))\n"
    text += f"(assert (<= Y_0 {rhs}))\n"
    (r,) = parse_vnnlib(text).regions
    for i, (lo, w) in enumerate(bounds_):
        assert Fraction(r.lower[i]) <= Fraction(lo) and Fraction(r.upper[i]) >= Fraction(lo + w)
        assert r.lower[i] == np.nextafter(float(lo), -np.inf) or r.lower[i] == float(lo)
    assert Fraction(r.disjuncts[0][1][0]) >= Fraction(rhs)


@pytest.mark.parametrize("body,match", [
    ("(assert (<= X_0 1))", "X_0 has no lower bound"),
    ("(assert (and (<= X_0 1) (>= X_0 0) (<= (* Y_0 Y_0) 1)))", "nonlinear product"),
    ("(assert (and (<= X_0 1) (>= X_0 0) (<= X_0 Y_0)))", "mixing inputs and outputs"),
    ("(assert (and (<= X_0 1) (>= X_0 0) (not (<= Y_0 1))))", "unsupported construct 'not'"),
    ("(assert (and (<= X_0 1) (>= X_0 0) (<= Z_0 1)))", "undeclared variable 'Z_0'"),
    ("(assert (and (<= X_0 1) (>= X_0 0) (<= Y_0 1))", "unbalanced"),
    # a constraint on several inputs is read (an input polytope), but every input still needs a box
    ("(declare-const X_1 Real)(assert (and (<= (+ X_0 X_1) 1) (>= X_0 0) (<= X_0 1) (<= Y_0 1)))",
     "X_1 has no lower bound"),
    ("(define-fun f () Real 1)", "unsupported construct 'define-fun'"),
])
def test_unsupported_constructs_are_named(tmp_path, body, match):
    path = tmp_path / "bad.vnnlib"
    path.write_text("(declare-const X_0 Real)\n(declare-const Y_0 Real)\n" + body + "\n")
    with pytest.raises(ValueError, match=match) as e:
        read_vnnlib(path)
    assert "bad.vnnlib" in str(e.value)


def test_bad_version_and_package_errors(tmp_path):
    with pytest.raises(ValueError, match="vnnlib-version '3.0'"):
        parse_vnnlib("(vnnlib-version <3.0>)")
    path = tmp_path / "b2.vnnlib"
    path.write_text("(vnnlib-version <2.0>)\n(declare-network N (declare-input X real [2]))\n(assert (<= X[5] 1))\n")
    with pytest.raises(ValueError, match="b2.vnnlib"):
        read_vnnlib(path)
    with pytest.raises(ValueError, match="no such file"):
        read_vnnlib(tmp_path / "missing.vnnlib")


def test_region_is_frozen():
    r = Region(np.zeros(1), np.ones(1), ())
    with pytest.raises(AttributeError):
        r.lower = np.ones(1)


def test_linear_constraints_on_several_inputs_make_a_polytope():
    """Σ a_i X_i <= r rows are kept exactly (strictness too); a point must satisfy them to be
    in the region, and a box on which some row holds nowhere is excluded."""
    text = ("(declare-const X_0 Real)(declare-const X_1 Real)(declare-const Y_0 Real)\n"
            "(assert (and (>= X_0 0) (<= X_0 1) (>= X_1 0) (<= X_1 1)))\n"
            "(assert (<= (+ X_0 X_1) 0.5))(assert (< (- X_0 X_1) 0.25))(assert (>= Y_0 0.9))\n")
    (r,) = parse_vnnlib(text).regions
    assert set(r.input_rows) == {(((0, Fraction(1)), (1, Fraction(1))), Fraction(1, 2), False),
                                 (((0, Fraction(1)), (1, Fraction(-1))), Fraction(1, 4), True)}
    assert r.contains([0.25, 0.25]) and not r.contains([0.3, 0.3]) and not r.contains([0.4, 0.0])
    assert r.excludes(np.array([0.3, 0.3]), np.array([1.0, 1.0])) and not r.excludes(np.zeros(2), np.ones(2))

"""certify.vnnlib as written: strict inequalities kept strict, box bounds and rows as exact
rationals (``Region.contains`` / ``satisfied_exactly`` / ``inner_box``), and malformed files
as ValueErrors naming the file and the line. Oracles: Fractions of the literals as typed,
and float neighbours from numpy's nextafter."""
from __future__ import annotations

import re
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from softcert.certify.vnnlib import MAX_NESTING, Region, parse_vnnlib, read_vnnlib

HEAD = "(declare-const X_0 Real)\n(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n"


def one(body, head=HEAD):
    (r,) = parse_vnnlib(head + body, "p.vnnlib").regions
    return r


def test_strict_rows_are_strict_in_the_exact_check():
    r = one("(assert (>= X_0 0.5))(assert (<= X_0 1))(assert (or (< Y_0 0.0) (> Y_0 1.0)))")
    assert [s.tolist() for s in r.strict()] == [[True], [True]]
    assert not r.satisfied_exactly([0.0, 0.0]) and not r.satisfied_exactly([1.0, 0.0])
    assert r.satisfied_exactly([-5e-324, 0.0]) and r.satisfied_exactly([np.nextafter(1.0, 2.0), 0.0])
    # the float reading (for bounding) is the closure: 0.0 satisfies it
    assert r.satisfied([0.0, 0.0])
    weak = one("(assert (>= X_0 0.5))(assert (<= X_0 1))(assert (<= Y_0 0.0))")
    assert weak.strict()[0].tolist() == [False] and weak.satisfied_exactly([0.0, 7.0])


def test_rows_use_the_literals_not_their_floats():
    """Y_0 <= 0.0999...9 (30 nines): the float rhs rounds up to 0.1, the exact check does not."""
    r = one("(assert (>= X_0 0.1))(assert (<= X_0 0.2))(assert (<= (+ Y_0 (* 0.5 Y_1)) 0.0" + "9" * 30 + "))")
    assert r.satisfied([0.1, 0.0])
    assert not r.satisfied_exactly([0.1, 0.0]) and r.satisfied_exactly([0.09999999999999999, 0.0])
    assert r.satisfied_exactly([0.0, 0.19999999999999998]) and not r.satisfied_exactly([0.0, 0.2])
    assert not r.satisfied_exactly([np.nan, 0.0]) and not r.satisfied_exactly([-np.inf, 0.0])


def test_box_as_written_and_its_inner_points():
    """[0.1, 0.2]: the outward float box holds 0.1's lower neighbour, the box as written does
    not; inner_box gives the first float64 / float32 values inside."""
    r = one("(assert (>= X_0 0.1))(assert (<= X_0 0.2))(assert (<= Y_0 0))")
    assert r.lower[0] <= 0.09999999999999999 or r.lower[0] == 0.1
    assert not r.contains([0.09999999999999999]) and r.contains([0.1]) and not r.contains([0.2])
    assert r.contains([0.19999999999999998])
    assert Fraction(0.1) > Fraction("0.1") and Fraction(0.2) > Fraction("0.2")
    assert not r.contains([np.nextafter(0.2, 1.0)])
    for dtype in (np.float64, np.float32, np.float16):
        lo, hi = r.inner_box(dtype)
        assert lo.dtype == dtype and Fraction(float(lo[0])) >= Fraction("0.1") and Fraction(float(hi[0])) <= Fraction("0.2")
        assert Fraction(float(np.nextafter(lo[0], dtype(-1)))) < Fraction("0.1")
        assert Fraction(float(np.nextafter(hi[0], dtype(1)))) > Fraction("0.2")
    strict = one("(assert (> X_0 0.5))(assert (< X_0 1))(assert (<= Y_0 0))")
    assert not strict.contains([0.5]) and not strict.contains([1.0]) and strict.contains([0.75])
    lo, hi = strict.inner_box(np.float32)
    assert lo[0] == np.nextafter(np.float32(0.5), np.float32(1)) and hi[0] == np.nextafter(np.float32(1), np.float32(0))
    # no float32 lies in [0.1, 0.1]; none at all in (0.5, 0.5]
    assert one("(assert (>= X_0 0.1))(assert (<= X_0 0.1))(assert (<= Y_0 0))").inner_box(np.float32) is None
    assert parse_vnnlib(HEAD + "(assert (> X_0 0.5))(assert (<= X_0 0.5))(assert (<= Y_0 0))").regions == ()


def test_plain_region_is_its_floats():
    r = Region(np.array([0.0]), np.array([1.0]), ((np.array([[1.0, 0.0]]), np.array([0.5])),))
    assert r.contains([1.0]) and not r.contains([1.5]) and r.satisfied_exactly([0.5, 9.0])
    assert r.strict()[0].tolist() == [False]


@settings(max_examples=80, deadline=None)
@given(st.decimals(-10, 10, places=20, allow_nan=False), st.decimals(0, 1, places=20, allow_nan=False),
       st.booleans(), st.booleans(), st.sampled_from([np.float64, np.float32]))
def test_inner_box_is_the_exact_float_hull(lo, width, lo_strict, hi_strict, dtype):
    """For decimal bounds with strictness: inner_box's ends lie in the interval as written and
    their outer neighbours do not; contains agrees with exact comparison."""
    hi = lo + width
    a, b = Fraction(lo), Fraction(hi)
    text = HEAD + f"(assert ({'>' if lo_strict else '>='} X_0 {lo}))(assert ({'<' if hi_strict else '<='} X_0 {hi}))" \
                  "(assert (<= Y_0 0))"
    regions = parse_vnnlib(text).regions
    if a > b or (a == b and (lo_strict or hi_strict)):
        assert regions == ()
        return
    (r,) = regions
    inside = lambda q: (q > a if lo_strict else q >= a) and (q < b if hi_strict else q <= b)  # noqa: E731
    box = r.inner_box(dtype)
    if box is None:
        v = dtype(float(a))
        assert not any(inside(Fraction(float(w))) for w in (np.nextafter(v, dtype(-np.inf)), v,
                                                            np.nextafter(v, dtype(np.inf))))
        return
    u, v = box[0][0], box[1][0]
    assert inside(Fraction(float(u))) and inside(Fraction(float(v)))
    assert not inside(Fraction(float(np.nextafter(u, dtype(-np.inf)))))
    assert not inside(Fraction(float(np.nextafter(v, dtype(np.inf)))))
    for w in (u, v, np.nextafter(u, dtype(-np.inf)), np.nextafter(v, dtype(np.inf)), r.lower[0], r.upper[0]):
        assert r.contains([float(w)]) == inside(Fraction(float(w)))
    assert Fraction(r.lower[0]) <= a and Fraction(r.upper[0]) >= b  # the bounding box is outward


# ---------------------------------------------------------------- malformed files
BOX = "(assert (>= X_0 0))\n(assert (<= X_0 1))\n"


@pytest.mark.parametrize("body,line,match", [
    (BOX + "(assert (<= Y_0 1" + "0" * 400 + "))\n", None, None),  # a huge rhs: never binding, accepted
    (BOX.replace("1))", "1" + "0" * 400 + "))"), 5, "X_0 beyond the float64 range"),
    (BOX + "(assert (<= (* 1e400 Y_0) 1))\n", 6, "coefficient of Y_0 beyond the float64 range"),
    (BOX + "(assert (<= Y_0 1_000))\n", 6, "malformed numeral '1_000'"),
    (BOX + "(assert (<= Y_0 1/2))\n", 6, "malformed numeral '1/2'"),
    (BOX + "(assert (<= Y_0 1e99999999))\n", 6, "exponent beyond"),
    (BOX + "(assert (<= Y_0 " + "9" * 5000 + "))\n", 6, "malformed numeral"),
    (BOX + "(assert " + "(and (or " * 200 + "(<= Y_0 1)" + "))" * 200 + ")\n", 6, "nested deeper than"),
    (BOX + "(assert (<= Y_0 " + "(- " * 300 + "1" + ")" * 300 + "))\n", 6, "nested deeper than"),
    ("(declare-const X_99999999999 Real)\n" + BOX, 4, "unsupported declaration"),
    ("(declare-const X_99999999 Real)\n" + BOX, 4, "more than the"),
    ("(declare-const (X_1) Real)\n" + BOX, 4, "unsupported declaration"),
    ("(declare-const X_1 (Real))\n" + BOX, 4, "unsupported declaration"),
    ("(vnnlib-version (2.0))\n", 4, "unsupported vnnlib-version"),
    (BOX + "(assert (<= Y_0 1))\n(declare-const X_3 Real)\n", 7, "X_1 has no lower bound"),
    (BOX + "(assert (<= Y_0 1)\n", 6, "unbalanced '\\('"),
    (BOX + "(assert (<= Y_0 1)))\n", 6, "unbalanced '\\)'"),
    (BOX + "(assert (<= Y_0 inf))\n", 6, "undeclared variable 'inf'"),
    (BOX + "(assert ())\n", 6, "malformed assertion"),
    (BOX + "(assert (<= () 1))\n", 6, "malformed expression"),
])
def test_malformed_files_name_file_and_line(tmp_path, body, line, match):
    path = tmp_path / "bad.vnnlib"
    path.write_text("(declare-const X_0 Real)\n(declare-const Y_0 Real)\n(declare-const Y_1 Real)\n" + body)
    if match is None:
        (r,) = read_vnnlib(path).regions
        assert r.disjuncts[0][1][0] == np.inf and r.satisfied_exactly([1e308, 0.0])
        return
    with pytest.raises(ValueError, match=match) as e:
        read_vnnlib(path)
    assert str(e.value).startswith(f"{path}:{line}: "), str(e.value)[:200]


def test_long_chains_of_one_operator_parse():
    """A right-nested (or a (or b ...)) of 3000 disjuncts and a 3000-deep (+ ...) chain."""
    ors = "(or (<= Y_0 0)" * 3000 + ")" * 3000
    plus = "(+ Y_1" * 3000 + " Y_0" + ")" * 3000
    p = parse_vnnlib(HEAD + BOX + f"(assert {ors})\n(assert (<= {plus} 1))\n", "long.vnnlib")
    (r,) = p.regions
    assert len(r.disjuncts) == 3000 and r.disjuncts[0][0].tolist() == [[1.0, 0.0], [1.0, 3000.0]]


def test_unreadable_files(tmp_path):
    (tmp_path / "bin.vnnlib").write_bytes(b"\xff\xfe\x00(")
    (tmp_path / "bad.vnnlib.gz").write_bytes(b"not gzip")
    for name in ("bin.vnnlib", "bad.vnnlib.gz"):
        with pytest.raises(ValueError, match="not a readable UTF-8 VNN-LIB text"):
            read_vnnlib(tmp_path / name)
    with pytest.raises(ValueError, match="not a readable"):
        read_vnnlib(tmp_path)


VALID = (HEAD + "(assert (<= X_0 1.0))\n(assert (>= X_0 -1.0))\n"
         "(assert (or (and (< Y_0 Y_1)) (and (>= Y_1 3.0) (<= (+ Y_0 (* 2.0 Y_1)) 1.5))))\n")
TOKENS = re.findall(r"\(|\)|[^\s()]+", VALID)
PIECES = ["(", ")", "(and", "(or", "(<", "(=", "(+", "(*", "(-", "1e400", "1" + "0" * 320, "1_0", "1/2", "X_0", "Y_1",
          "X_9", "Y_99999999999", "-", "0.5", ".", "e5", "<2.0>", "(vnnlib-version", "(declare-const", "Real",
          "(assert", ";", "\n", "X[0]", "nan", "()", "(((((", ")))))", "1e-99999999", "9" * 5000,
          "(- " * 1500 + "1" + ")" * 1500, "(and (or " * 600 + "(<= Y_0 1)" + "))" * 600]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(TOKENS)), st.sampled_from(["insert", "replace", "delete"]),
                          st.sampled_from(PIECES)), min_size=1, max_size=4))
def test_mutated_files_give_value_errors_naming_the_file(edits):
    """Tokens of a valid file inserted, replaced or deleted: parsed, or a ValueError naming
    the file (never another exception)."""
    tokens = list(TOKENS)
    for pos, op, piece in edits:
        pos = min(pos, len(tokens) - (op != "insert"))
        tokens[pos:pos + (op != "insert")] = [] if op == "delete" else [piece]
    try:
        parse_vnnlib(" ".join(tokens), "fuzz.vnnlib")
    except ValueError as e:
        assert str(e).startswith("fuzz.vnnlib"), str(e)


def test_nesting_limit_is_generous_for_real_files():
    depth = MAX_NESTING // 4
    body = "(assert " + "(and (or " * depth + "(<= Y_0 1)" + "))" * depth + ")\n"
    assert len(parse_vnnlib(HEAD + BOX + body).regions) == 1


def test_float_up_and_down_bracket_exact_rationals_at_every_magnitude():
    """One outward rounding of exact rationals, shared by the reader and vnncomp (whose own copy
    raised OverflowError on a sum of rhs literals above the float64 range)."""
    import sys
    from fractions import Fraction

    from softcert.certify.vnnlib import float_down, float_up

    big = Fraction(sys.float_info.max)
    for q in (Fraction(1, 3), Fraction(-1, 3), Fraction(0), Fraction(10) ** -330, big, 2 * big, -2 * big):
        up, down = float_up(q), float_down(q)
        assert down <= up
        if abs(q) <= big:
            assert Fraction(down) <= q <= Fraction(up)
    assert float_up(2 * big) == float("inf") and float_down(-2 * big) == float("-inf")
    assert float_up(Fraction(1, 3)) > 1 / 3 and float_down(Fraction(1, 3)) == 1 / 3

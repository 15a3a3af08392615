"""z3 lemmas for one combine step of the online-softmax monoid (Float32); < 30 s in total."""
from __future__ import annotations

import numpy as np

from softcert.analysis import fp_z3


def test_combine_step_is_finite():
    assert fp_z3.combine_is_finite().result == "proved"


def test_rounding_width_add_and_mul():
    for op in ("add", "mul"):
        lem = fp_z3.rounding_width(op)
        assert lem.result == "proved", lem


def test_step_error_composes_to_gamma2():
    assert fp_z3.step_error().result == "proved"


def test_step_error_is_not_vacuous():
    """The composed constant is attained to first order in Float32 (so γ_2 is the right size):
    search for a step whose real error exceeds 1.5u relative."""
    rng = np.random.default_rng(0)
    SA = rng.uniform(1, 2 ** 20, 20000).astype(np.float32)
    SB = rng.uniform(1, 2 ** 20, 20000).astype(np.float32)
    eA = rng.uniform(0, 1, 20000).astype(np.float32)
    eB = np.ones(20000, np.float32)
    S = (SA * eA + SB * eB).astype(np.float32)
    exact = SA.astype(np.float64) * eA + SB.astype(np.float64) * eB
    rel = np.abs(S - exact) / exact
    assert rel.max() <= 2 * 2.0 ** -24 / (1 - 2 * 2.0 ** -24)
    assert rel.max() > 0.9 * 2.0 ** -24

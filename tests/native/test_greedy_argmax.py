"""The greedy sampler's pick (native/core/sampler.cpp: argmax). It runs in two vectorised
passes (the largest value, then the first index holding it); a greedy user notices any
disagreement with the plain first-largest loop as a different token at a tie or beside a NaN,
so it is checked against that loop on the cases where a vectorised search can go wrong: ties
across and inside vector lanes, lengths that are no multiple of the lanes, signed zeros,
infinities and NaNs."""

from __future__ import annotations

import math

import numpy as np
import pytest

native = pytest.importorskip("llmd._engine")


def first_largest(values: np.ndarray) -> int:
    """The plain loop the engine's greedy pick must agree with."""
    best = 0
    for i in range(1, len(values)):
        if values[i] > values[best]:
            best = i
    return best


def test_ties_pick_the_first_largest_whatever_the_length() -> None:
    rng = np.random.default_rng(0)
    for n in [1, 2, 3, 15, 16, 17, 31, 33, 64, 100, 1000]:
        for _ in range(30):
            # Few distinct values, so the largest repeats at random places, also in one lane.
            values = rng.integers(-3, 4, size=n).astype(np.float32)
            assert native.argmax(values) == first_largest(values) == int(np.argmax(values))


def test_special_values_follow_the_plain_loop() -> None:
    rng = np.random.default_rng(1)
    specials = np.array([math.nan, 0.0, -0.0, math.inf, -math.inf, 1.0, -1.0], dtype=np.float32)
    for n in [1, 5, 16, 17, 40, 257]:
        for _ in range(200):
            values = rng.choice(specials, size=n)
            assert native.argmax(values) == first_largest(values), values


def test_a_nan_is_never_the_pick_unless_it_comes_first() -> None:
    values = np.full(49152, -5.0, dtype=np.float32)
    values[30000] = 2.0
    values[100] = math.nan
    assert native.argmax(values) == 30000
    values[0] = math.nan
    assert native.argmax(values) == 0  # as the plain loop: nothing compares above a NaN


def test_a_vocabulary_row_picks_its_largest_logit() -> None:
    rng = np.random.default_rng(2)
    for _ in range(20):
        row = rng.normal(size=49152).astype(np.float32)
        assert native.argmax(row) == int(np.argmax(row))

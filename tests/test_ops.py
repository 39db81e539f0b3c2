"""Operators of the op library, checked against numpy and finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest

import anfir
from gradcheck import numeric_grad

SOFTPLUS = """
def f(x) = softplus(x)
def df(x) = grad(f)(x)
def ddf(x) = grad(df)(x)
"""


@pytest.mark.parametrize("x", [-30.0, -2.0, -0.3, 0.0, 0.7, 5.0, 40.0])
def test_softplus_value_and_derivatives(x: float) -> None:
    mod = anfir.parse(SOFTPLUS)
    assert anfir.run(mod["f"], x) == pytest.approx(math.log1p(math.exp(x)), rel=1e-12, abs=1e-300)
    sigmoid = 1 / (1 + math.exp(-x))
    assert anfir.run(mod["df"], x) == pytest.approx(sigmoid, rel=1e-12)
    assert anfir.run(mod["ddf"], x) == pytest.approx(numeric_grad(mod["df"], [x]),
                                                     rel=1e-6, abs=1e-9)
    compiled = anfir.compile(mod, entry="ddf", args=[x])
    assert anfir.run(compiled, x) == pytest.approx(anfir.run(mod["ddf"], x), rel=1e-12, abs=1e-300)


def test_softplus_does_not_overflow_and_keeps_f32() -> None:
    mod = anfir.parse(SOFTPLUS)
    assert anfir.run(mod["f"], 1000.0) == 1000.0
    assert anfir.run(mod["f"], -1000.0) == 0.0
    x = np.array([-800.0, -1.5, 0.0, 2.5, 900.0], np.float32)
    out = anfir.run(mod["f"], x)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.logaddexp(np.float32(0), x), rtol=1e-6)
    assert np.all(np.isfinite(out))

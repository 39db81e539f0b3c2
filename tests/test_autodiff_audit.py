"""Regression tests from an audit of the automatic differentiation (issue 4)."""

from __future__ import annotations

import numpy as np
import pytest

import anfir
from anfir.errors import GradientError

MATMUL = """
def h(x, y) = sum(sin(x @ y) * 1.3) + sum(x @ y) * sum(x @ y)
def gx(x, y, c) = sum(grad(h, 0)(x, y) * c)
"""

# numpy's matmul rules: vectors are promoted (row on the left, column on the
# right) and the added dimension is removed; batch dimensions broadcast.
MATMUL_SHAPES = [((3,), (3, 4)), ((2, 3), (3,)), ((3,), (3,)), ((5, 2, 3), (3, 4)),
                 ((2, 3), (5, 3, 4)), ((1, 2, 3), (5, 3, 4)), ((5, 2, 3), (3,))]


def _numeric_grad(graph, args, i, eps=1e-6):
    args = list(args)
    x = args[i]
    out = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[idx] += eps
        minus[idx] -= eps
        args[i] = plus
        fp = anfir.run(graph, *args)
        args[i] = minus
        fm = anfir.run(graph, *args)
        out[idx] = (fp - fm) / (2 * eps)
    return out


@pytest.mark.parametrize("sx, sy", MATMUL_SHAPES)
@pytest.mark.parametrize("wrt", [0, 1])
def test_matmul_gradient_with_vectors_and_batches(sx, sy, wrt):
    rng = np.random.default_rng(0)
    x, y = rng.random(sx), rng.random(sy)
    h = anfir.parse(MATMUL)["h"]
    got = anfir.run(anfir.grad(h, wrt), x, y)
    assert np.shape(got) == np.shape((x, y)[wrt])
    np.testing.assert_allclose(got, _numeric_grad(h, [x, y], wrt), rtol=1e-5, atol=1e-6)
    program = anfir.parse(MATMUL + f"def m(x, y) = grad(h, {wrt})(x, y)\n")
    compiled = anfir.compile(program, entry="m", args=[x, y])
    np.testing.assert_allclose(anfir.run(compiled, x, y), got, rtol=1e-12)


@pytest.mark.parametrize("sx, sy", [((3,), (3, 4)), ((2, 3), (3,)), ((5, 2, 3), (3, 4))])
@pytest.mark.parametrize("wrt", [0, 1])
def test_second_derivative_through_matmul(sx, sy, wrt):
    rng = np.random.default_rng(1)
    x, y, c = rng.random(sx), rng.random(sy), rng.random(sx)
    gx = anfir.parse(MATMUL)["gx"]
    got = anfir.run(anfir.grad(gx, wrt), x, y, c)
    np.testing.assert_allclose(got, _numeric_grad(gx, [x, y, c], wrt), rtol=1e-4, atol=1e-5)


MISSING = ("def f(x) =\n  sin(x) * cos(x)\n\n"
           "def ap(h, x) = h(x) * x\n"
           "def main(x) = grad(f)(x)\n"
           "def m2(x) = grad(lambda (y) ap(sin, y) + cos(y) end)(x)\n")


@pytest.fixture
def no_sin_cos_rules(monkeypatch):
    from anfir.autodiff import jtransform
    from anfir.primitives import PRIMITIVES

    monkeypatch.setattr(PRIMITIVES["sin"], "bprop", None)
    monkeypatch.setattr(PRIMITIVES["cos"], "bprop", None)
    # Graphs transformed by earlier tests must not hide the check.
    monkeypatch.setattr(jtransform, "_default_context", jtransform.JContext(weak=True))


@pytest.mark.parametrize("mode", ["run", "compile"])
def test_missing_rules_of_in_program_grad_are_all_reported_with_locations(no_sin_cos_rules, mode):
    module = anfir.parse(MISSING, "m.anf")
    with pytest.raises(GradientError) as info:
        if mode == "run":
            anfir.run(module["main"], 1.0)
        else:
            anfir.compile(module, entry="main", args=[1.0])
    text = str(info.value)
    assert text.startswith("m.anf:2:6:"), text
    assert "m.anf:2:6: sin" in text and "m.anf:2:15: cos" in text, text


@pytest.mark.parametrize("mode", ["run", "compile"])
def test_missing_rule_of_a_primitive_passed_as_a_value_is_reported(no_sin_cos_rules, mode):
    module = anfir.parse(MISSING, "m.anf")
    with pytest.raises(GradientError) as info:
        if mode == "run":
            anfir.run(module["m2"], 1.0)
        else:
            anfir.compile(module, entry="m2", args=[1.0])
    text = str(info.value)
    assert "m.anf:6:32: sin" in text and "m.anf:6:45: cos" in text, text

"""Gradients of generated programs (closures, if, tuples) against finite differences."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import anfir

UNARY = ["sin", "cos", "tanh", "sigmoid"]
BINARY = ["+", "-", "*"]


@st.composite
def expressions(draw, names: tuple[str, ...], depth: int) -> str:
    """A float-valued ANF expression over ``names`` (smooth almost everywhere)."""
    kind = draw(st.integers(0, 7 if depth > 0 else 1))
    if kind == 0:
        return draw(st.sampled_from(names))
    if kind == 1:
        return repr(draw(st.sampled_from([0.5, 0.75, 1.25, 2.0])))
    sub = lambda extra=(): expressions(names + extra, depth - 1)  # noqa: E731
    if kind in (2, 3):
        op = draw(st.sampled_from(BINARY))
        return f"({draw(sub())} {op} {draw(sub())})"
    if kind == 4:
        return f"{draw(st.sampled_from(UNARY))}({draw(sub())})"
    if kind == 5:  # a closure capturing the names in scope, called twice
        body = draw(sub(("z",)))
        return (f"(let c = lambda (z) {body} end in "
                f"c({draw(sub())}) * c({draw(sub())}))")
    if kind == 6:  # if on a comparison; each branch its own closure graph
        return (f"(if {draw(sub())} > {draw(sub())} then {draw(sub())} "
                f"else {draw(sub())})")
    i = draw(st.integers(0, 1))
    return f"(({draw(sub())}, {draw(sub())})[{i}])"


@st.composite
def programs(draw) -> str:
    a = draw(expressions(("x", "y"), 2))
    b = draw(expressions(("x", "y", "a"), 2))
    out = draw(expressions(("x", "y", "a", "b"), 2))
    return f"def f(x, y) =\n  let a = {a} in\n  let b = {b} in\n  {out}\n"


def _fd(graph, args, i, eps=1e-6):
    plus, minus = list(args), list(args)
    plus[i] += eps
    minus[i] -= eps
    return (anfir.run(graph, *plus) - anfir.run(graph, *minus)) / (2 * eps)


def _smooth_at(graph, args, i, eps=1e-6):
    """Whether one-sided differences agree: no `if` flips right at this point
    (where the derivative does not exist and finite differences mean nothing)."""
    here = anfir.run(graph, *args)
    plus, minus = list(args), list(args)
    plus[i] += eps
    minus[i] -= eps
    right = (anfir.run(graph, *plus) - here) / eps
    left = (here - anfir.run(graph, *minus)) / eps
    return abs(right - left) <= 1e-3 * (1 + abs(right))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.floats(0.2, 1.3), st.floats(-1.1, 0.9))
def test_generated_program_gradients_match_finite_differences(text, x, y):
    f = anfir.parse(text)["f"]
    value = anfir.run(f, x, y)
    if not np.isfinite(value) or abs(value) > 1e6:
        return
    if not (_smooth_at(f, [x, y], 0) and _smooth_at(f, [x, y], 1)):
        return
    dx, dy = anfir.run(anfir.grad(f, (0, 1)), x, y)
    np.testing.assert_allclose(dx, _fd(f, [x, y], 0), rtol=1e-4, atol=1e-5, err_msg=text)
    np.testing.assert_allclose(dy, _fd(f, [x, y], 1), rtol=1e-4, atol=1e-5, err_msg=text)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.floats(0.2, 1.3), st.floats(-1.1, 0.9))
def test_generated_program_second_derivatives(text, x, y):
    f = anfir.parse(text)["f"]
    df = anfir.grad(f, 0)
    ddf = anfir.grad(df, 0)
    if not (_smooth_at(f, [x, y], 0) and _smooth_at(df, [x, y], 0, eps=1e-5)):
        return
    want = _fd(df, [x, y], 0, eps=1e-5)
    if not np.isfinite(want) or abs(want) > 1e5:
        return
    np.testing.assert_allclose(anfir.run(ddf, x, y), want, rtol=1e-3, atol=1e-4, err_msg=text)

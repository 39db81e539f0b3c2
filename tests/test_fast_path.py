"""The fast path computes exactly what the reference computes.

The fast path is ``anfir.compile`` (specialize, inline, optimize, ...) and
``anfir.run`` of the optimized graph; the references are ``anfir.run`` of the
graph as parsed, and plain Python / numpy formulas.  Optimized and parsed
graphs must agree *exactly* on forward values (the optimizer folds,
inlines and deduplicates, but must never reassociate floating-point
arithmetic); formulas computed outside anfir are compared to a tight
relative tolerance (numpy's and the math module's ``sin`` may differ in the
last bit).  Gradients are checked against hand-derived formulas and the
unoptimized gradient graph.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import anfir
import programs
from gradcheck import check_grad
from programs import Dual
from spec_examples import CLOSURE, HOF, MLP, PAPER

CLOSE = dict(rel_tol=1e-12, abs_tol=1e-12)
"""The tolerance for formulas computed outside anfir."""


def compiled(text: str, entry: str, args: list) -> tuple[anfir.FuncGraph, anfir.FuncGraph]:
    """``(optimized graph, parsed graph)`` of the definition ``entry`` of ``text``."""
    module = anfir.parse(text)
    return anfir.compile(module, entry=entry, args=args), module[entry]


def same(a: Any, b: Any) -> bool:
    """Exact equality of results: scalars, arrays (same dtype and shape) and tuples."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
                and all(same(x, y) for x, y in zip(a, b)))
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    return type(a) is type(b) and a == b


# -- the spec's examples --------------------------------------------------------------------

CLOSURES = "\n".join([CLOSURE, HOF, """\
def adder(k) = lambda (v) v + k end

def compose(x) =
  let add2 = adder(2.0) in
  let twice = lambda (f, v) f(f(v)) end in
  twice(add2, x) * twice(adder(x), 1.0)
"""])


def test_paper_example_compiles_to_the_same_value() -> None:
    fast, ref = compiled(PAPER, "main", [5.0, 2.0])
    for x, y in [(5.0, 2.0), (0.25, -3.5), (1e3, 7.0)]:
        a = x - 1
        b = a + y
        assert same(anfir.run(fast, x, y), anfir.run(ref, x, y))
        assert math.isclose(anfir.run(fast, x, y), b * (a / b), **CLOSE)


def test_closures_and_higher_order_functions() -> None:
    fast, ref = compiled(CLOSURES, "ms_closure", [])
    assert anfir.run(fast) == anfir.run(ref) == (4, 5)
    fast, ref = compiled(CLOSURES, "hof", [2.0])
    for x in (2.0, -1.5, 0.0):
        assert same(anfir.run(fast, x), anfir.run(ref, x))
        assert anfir.run(fast, x) == (x + 3) * (x + 3)
    fast, ref = compiled(CLOSURES, "compose", [1.0])
    for x in (1.0, -2.25, 10.0):
        assert same(anfir.run(fast, x), anfir.run(ref, x))
        assert anfir.run(fast, x) == (x + 2.0 + 2.0) * (1.0 + x + x)


# -- recursion and loops ----------------------------------------------------------------------
RECURSION = """\
def fibonacci(n) =
  if n < 1 then 0
  else if n == 1 then 1
  else fibonacci(n - 1) + fibonacci(n - 2)

def even(n) = if n == 0 then true else odd(n - 1)
def odd(n) = if n == 0 then false else even(n - 1)

def power(x, n) =
  let loop = lambda (i, acc)
    if i < n then loop(i + 1, acc * x) else acc end in
  loop(0, 1.0)

def count(i, n, acc) =
  if i < n then count(i + 1, n, acc * 0.99999 + 0.5) else acc
"""


def python_fib(n: int) -> int:
    """The n-th Fibonacci number, by a Python loop."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def test_recursion_compiled_once_runs_for_every_value_of_its_type() -> None:
    fast, ref = compiled(RECURSION, "fibonacci", [10])
    for n in range(0, 16):
        assert anfir.run(fast, n) == anfir.run(ref, n) == python_fib(n)
    fast, ref = compiled(RECURSION, "even", [7])
    for n in (0, 1, 6, 7, 501):
        assert anfir.run(fast, n) is anfir.run(ref, n) is (n % 2 == 0)


def test_loops_match_the_python_loop_bit_for_bit() -> None:
    fast, ref = compiled(RECURSION, "power", [1.5, 3])
    for x, n in [(1.5, 3), (-0.5, 7), (1.0001, 1000)]:
        assert same(anfir.run(fast, x, n), anfir.run(ref, x, n))
        acc = 1.0
        for _ in range(n):
            acc *= x
        assert anfir.run(fast, x, n) == acc
    # 100,000 iterations: the compiled loop is still a loop (no stack growth).
    fast, ref = compiled(RECURSION, "count", [0, 10, 1.0])
    acc = 1.0
    for _ in range(100_000):
        acc = acc * 0.99999 + 0.5
    assert anfir.run(fast, 0, 100_000, 1.0) == anfir.run(ref, 0, 100_000, 1.0) == acc


# -- tensors ------------------------------------------------------------------------------------

TENSORS = """\
def stats(a, b) =
  let c = a * 2.0 + b in
  let m = mean(c, 0) in
  let s = sum(transpose(c) @ c) in
  (maximum(c, 0.5), m, s, where(c > 1.0, c, zeros_like(c)), reshape(c, (6,)))
"""


def mlp_inputs(seed: int, b: int = 5, d: int = 4, h: int = 3, k: int = 2) -> list[np.ndarray]:
    """Random ``(w1, w2, x, y)`` for ``mlp_loss``."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in [(d, h), (h, k), (b, d), (b, k)]]


def numpy_mlp(w1: np.ndarray, w2: np.ndarray, x: np.ndarray, y: np.ndarray
              ) -> tuple[float, np.ndarray, np.ndarray]:
    """Loss and hand-written gradients with respect to ``w1`` and ``w2``."""
    h = np.tanh(x @ w1)
    r = h @ w2 - y
    loss = float(np.sum(r ** 2) / 2)
    return loss, x.T @ ((r @ w2.T) * (1 - h * h)), h.T @ r


def test_tensor_programs() -> None:
    fast, ref = compiled(MLP, "mlp_loss", mlp_inputs(0))
    for seed in range(3):
        args = mlp_inputs(seed)
        assert same(anfir.run(fast, *args), anfir.run(ref, *args))
        assert math.isclose(anfir.run(fast, *args), numpy_mlp(*args)[0], rel_tol=1e-12)
    a = np.arange(6.0).reshape(2, 3) / 4
    b = np.array([0.5, -1.0, 2.0])
    fast, ref = compiled(TENSORS, "stats", [a, b])
    got = anfir.run(fast, a, b)
    assert same(got, anfir.run(ref, a, b))
    c = a * 2.0 + b
    expected = (np.maximum(c, 0.5), c.mean(0), float(np.sum(c.T @ c)),
                np.where(c > 1.0, c, 0.0), c.reshape(6))
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-12)


# -- gradients ------------------------------------------------------------------------------------
def test_mlp_gradient_optimized_matches_numpy_and_unoptimized() -> None:
    raw = anfir.grad(anfir.parse(MLP)["mlp_loss"], (0, 1))
    fast = anfir.compile(raw, args=mlp_inputs(0))
    for seed in range(3):
        args = mlp_inputs(seed)
        got = anfir.run(fast, *args)
        reference = anfir.run(raw, *args)
        _, dw1, dw2 = numpy_mlp(*args)
        for g, r, e in zip(got, reference, (dw1, dw2)):
            np.testing.assert_allclose(g, r, rtol=1e-13, atol=1e-15)
            np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-14)


def test_gradient_through_a_loop_and_in_the_program() -> None:
    module = anfir.parse(RECURSION + "\ndef dpower(x) = grad(power)(x, 3)\n")
    fast = anfir.compile(module, entry="dpower", args=[1.5])
    for x in (1.5, -2.0, 0.3):
        assert math.isclose(anfir.run(fast, x), 3 * x ** 2, **CLOSE)
        assert math.isclose(anfir.run(fast, x), anfir.run(module["dpower"], x), **CLOSE)


def test_gradient_of_a_long_chain() -> None:
    steps = 50
    text = "def f(x0) =\n" + "".join(
        f"  let x{i + 1} = x{i} * 1.0001 + sin(x{i}) * 0.001 in\n" for i in range(steps)
    ) + f"  x{steps}\n"
    raw = anfir.grad(anfir.parse(text)["f"])
    fast = anfir.compile(raw, args=[0.5])
    for x in (0.5, -1.0):
        dx, v = 1.0, x
        for _ in range(steps):
            dx *= 1.0001 + math.cos(v) * 0.001
            v = v * 1.0001 + math.sin(v) * 0.001
        assert math.isclose(anfir.run(fast, x), dx, **CLOSE)
        assert math.isclose(anfir.run(fast, x), anfir.run(raw, x), **CLOSE)


# -- generated arithmetic programs -------------------------------------------------------------
# Programs of tests/programs.py (grammar SMOOTH: arithmetic, closures called twice,
# if, tuples), computed in Python by its evaluator, on Dual numbers for derivatives.
def as_float(value: Any) -> float:
    """A program's result as a float (an all-integer branch may return an int)."""
    assert isinstance(value, (int, float, np.floating)), value
    return float(value)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs.let_programs(programs.SMOOTH), st.floats(-1.5, 1.5), st.floats(-1.5, 1.5))
def test_generated_programs_compiled_equal_parsed_and_python(program, x, y) -> None:
    text = program.text
    fast, ref = compiled(text, "f", [x, y])
    expected = program.value(x, y)
    got = anfir.run(fast, x, y)
    assert same(got, anfir.run(ref, x, y)), text
    assert math.isclose(as_float(got), expected, rel_tol=1e-9, abs_tol=1e-9), text


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs.let_programs(programs.SMOOTH), st.floats(-1.5, 1.5), st.floats(-1.5, 1.5))
def test_generated_program_gradients_optimized_equal_forward_mode(program, x, y) -> None:
    # At a tie in an `if` both one-sided derivatives are valid answers.
    assume(all(m > 1e-6 for m in program.if_margins(x, y)))
    dx = program.value(Dual(x, 1.0), Dual(y, 0.0))
    dy = program.value(Dual(x, 0.0), Dual(y, 1.0))
    # The unoptimized gradient graph, the compiled one and the compiled grad inside
    # the program: equal to 1e-12, and to forward mode to 1e-9.
    grads = check_grad(program.text, [x, y], (0, 1), ways=("api", "compiled", "compiled_program"),
                       want=(dx.d, dy.d), rtol=1e-9, atol=1e-9, agree=(1e-12, 1e-12),
                       msg=program.text)
    for way, grad in grads.items():
        assert all(isinstance(g, (int, float, np.floating)) for g in grad), (way, grad)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_integer_arithmetic_stays_integer(n: int) -> None:
    text = "def f(n) = let a = n * 3 - 1 in if a > 4 then (a, a * a) else (a, 0 - a)\n"
    fast, ref = compiled(text, "f", [n])
    a = n * 3 - 1
    expected = (a, a * a) if a > 4 else (a, -a)
    assert anfir.run(fast, n) == anfir.run(ref, n) == expected
    assert all(type(v) is int for v in anfir.run(fast, n))

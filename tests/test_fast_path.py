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
from dataclasses import dataclass
from typing import Any, Union

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import anfir
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
@dataclass(frozen=True)
class Dual:
    """A value and its derivative with respect to one input (forward mode)."""

    v: float
    d: float

    def __add__(self, o: "Dual") -> "Dual":
        return Dual(self.v + o.v, self.d + o.d)

    def __sub__(self, o: "Dual") -> "Dual":
        return Dual(self.v - o.v, self.d - o.d)

    def __mul__(self, o: "Dual") -> "Dual":
        return Dual(self.v * o.v, self.d * o.v + self.v * o.d)


UNARY = {
    "sin": (math.sin, math.cos),
    "cos": (math.cos, lambda v: -math.sin(v)),
    "tanh": (math.tanh, lambda v: 1 - math.tanh(v) ** 2),
}

Expr = tuple
"""A generated expression: ("var", name) | ("const", c) | ("bin", op, a, b) |
("un", fn, a) | ("if", a, b, then, else) | ("closure", body, arg1, arg2) |
("tuple", a, b, index)."""


@st.composite
def expressions(draw: Any, names: tuple[str, ...], depth: int) -> Expr:
    """A float-valued expression tree over ``names``, at most ``depth`` levels of operators."""
    kind = draw(st.integers(0, 7 if depth > 0 else 1))
    if kind == 0:
        return ("var", draw(st.sampled_from(names)))
    if kind == 1:
        return ("const", draw(st.sampled_from([0.5, 0.75, 1.25, 2.0, 1.0, 0.0])))

    def sub(extra: tuple[str, ...] = ()) -> Expr:
        return draw(expressions(names + extra, depth - 1))

    if kind in (2, 3):
        return ("bin", draw(st.sampled_from("+-*")), sub(), sub())
    if kind == 4:
        return ("un", draw(st.sampled_from(sorted(UNARY))), sub())
    if kind == 5:
        return ("closure", sub(("z",)), sub(), sub())
    if kind == 6:
        return ("if", sub(), sub(), sub(), sub())
    return ("tuple", sub(), sub(), draw(st.integers(0, 1)))


def to_anf(e: Expr) -> str:
    """The ANF text of ``e`` (fully parenthesised)."""
    tag = e[0]
    if tag == "var":
        return e[1]
    if tag == "const":
        return repr(e[1])
    if tag == "bin":
        return f"({to_anf(e[2])} {e[1]} {to_anf(e[3])})"
    if tag == "un":
        return f"{e[1]}({to_anf(e[2])})"
    if tag == "closure":
        return (f"(let c = lambda (z) {to_anf(e[1])} end in "
                f"c({to_anf(e[2])}) * c({to_anf(e[3])}))")
    if tag == "if":
        return f"(if {to_anf(e[1])} > {to_anf(e[2])} then {to_anf(e[3])} else {to_anf(e[4])})"
    return f"(({to_anf(e[1])}, {to_anf(e[2])})[{e[3]}])"


Num = Union[float, Dual]


def evaluate(e: Expr, env: dict[str, Num]) -> Num:
    """``e`` evaluated in Python on floats, or on :class:`Dual` numbers for the derivative."""
    tag = e[0]
    if tag == "var":
        return env[e[1]]
    if tag == "const":
        return e[1] if not isinstance(env["x"], Dual) else Dual(e[1], 0.0)
    if tag == "bin":
        a, b = evaluate(e[2], env), evaluate(e[3], env)
        return a + b if e[1] == "+" else a - b if e[1] == "-" else a * b
    if tag == "un":
        f, df = UNARY[e[1]]
        a = evaluate(e[2], env)
        return Dual(f(a.v), df(a.v) * a.d) if isinstance(a, Dual) else f(a)
    if tag == "closure":
        return (evaluate(e[1], {**env, "z": evaluate(e[2], env)})
                * evaluate(e[1], {**env, "z": evaluate(e[3], env)}))
    if tag == "if":
        a, b = evaluate(e[1], env), evaluate(e[2], env)
        taken = (a.v > b.v) if isinstance(a, Dual) else a > b
        return evaluate(e[3] if taken else e[4], env)
    return evaluate(e[1 + e[3]], env)


@st.composite
def programs(draw: Any) -> tuple[Expr, Expr, Expr]:
    """The three expressions of ``def f(x, y) = let a = .. in let b = .. in ..``."""
    return (draw(expressions(("x", "y"), 2)), draw(expressions(("x", "y", "a"), 2)),
            draw(expressions(("x", "y", "a", "b"), 2)))


def program_text(parts: tuple[Expr, Expr, Expr]) -> str:
    """The ANF text of the generated program ``f``."""
    a, b, out = (to_anf(p) for p in parts)
    return f"def f(x, y) =\n  let a = {a} in\n  let b = {b} in\n  {out}\n"


def program_value(parts: tuple[Expr, Expr, Expr], x: Num, y: Num) -> Num:
    """``f(x, y)`` computed in Python (on floats, or on Dual numbers for a derivative)."""
    env: dict[str, Num] = {"x": x, "y": y}
    env["a"] = evaluate(parts[0], env)
    env["b"] = evaluate(parts[1], env)
    return evaluate(parts[2], env)


def as_float(value: Any) -> float:
    """A program's result as a float (an all-integer branch may return an int)."""
    assert isinstance(value, (int, float, np.floating)), value
    return float(value)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.floats(-1.5, 1.5), st.floats(-1.5, 1.5))
def test_generated_programs_compiled_equal_parsed_and_python(parts, x, y) -> None:
    text = program_text(parts)
    fast, ref = compiled(text, "f", [x, y])
    expected = program_value(parts, x, y)
    got = anfir.run(fast, x, y)
    assert same(got, anfir.run(ref, x, y)), text
    assert math.isclose(as_float(got), expected, rel_tol=1e-9, abs_tol=1e-9), text


def branches_are_clear(parts: tuple[Expr, Expr, Expr], x: float, y: float) -> bool:
    """Whether every ``if`` comparison is far from a tie (a derivative at a tie is not smooth)."""
    margins = []

    def record(e: Expr, env: dict[str, Num]) -> None:
        stack = [(e, env)]
        while stack:
            node, scope = stack.pop()
            if node[0] == "if":
                margins.append(abs(evaluate(node[1], scope) - evaluate(node[2], scope)))
            if node[0] == "closure":
                for arg in (node[2], node[3]):
                    stack.append((node[1], {**scope, "z": evaluate(arg, scope)}))
                stack.extend((child, scope) for child in node[2:4])
                continue
            stack.extend((child, scope) for child in node[1:] if isinstance(child, tuple))

    env: dict[str, Num] = {"x": x, "y": y}
    for part, name in zip(parts, ("a", "b", "out")):
        record(part, env)
        env[name] = evaluate(part, env)
    return all(m > 1e-6 for m in margins)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.floats(-1.5, 1.5), st.floats(-1.5, 1.5))
def test_generated_program_gradients_optimized_equal_forward_mode(parts, x, y) -> None:
    # At a tie in an `if` both one-sided derivatives are valid answers.
    assume(branches_are_clear(parts, x, y))
    text = program_text(parts)
    module = anfir.parse(text + "\ndef df(x, y) = grad(f, 0, 1)(x, y)\n")
    raw = anfir.grad(module["f"], (0, 1))
    fast = anfir.compile(raw, args=[x, y])
    in_program = anfir.compile(module, entry="df", args=[x, y])
    dx = program_value(parts, Dual(x, 1.0), Dual(y, 0.0))
    dy = program_value(parts, Dual(x, 0.0), Dual(y, 1.0))
    ref = anfir.run(raw, x, y)
    for got in (anfir.run(fast, x, y), anfir.run(in_program, x, y)):
        for g, r, e in zip(got, ref, (dx.d, dy.d)):
            assert math.isclose(as_float(g), as_float(r), rel_tol=1e-12, abs_tol=1e-12), text
            assert math.isclose(as_float(g), e, rel_tol=1e-9, abs_tol=1e-9), text


@pytest.mark.parametrize("n", [0, 1, 5])
def test_integer_arithmetic_stays_integer(n: int) -> None:
    text = "def f(n) = let a = n * 3 - 1 in if a > 4 then (a, a * a) else (a, 0 - a)\n"
    fast, ref = compiled(text, "f", [n])
    a = n * 3 - 1
    expected = (a, a * a) if a > 4 else (a, -a)
    assert anfir.run(fast, n) == anfir.run(ref, n) == expected
    assert all(type(v) is int for v in anfir.run(fast, n))

"""Counted tail-recursive loops of every common shape become ``fori_loop`` before AD
(anfir/passes/counted_loops.py), so their gradients export: counting up or down, any
comparison in either order, the exit in either branch, steps other than 1, an exit
expression of the state, a bound passed on as a parameter, nested loops, global
recursive definitions.  Each gradient equals JAX's of the ``lax.fori_loop`` version and
the recursion evaluated without compiling, in anfir, ONNX (checker, onnxruntime,
``onnx.reference``), ``to_jax`` under ``jax.jit`` and the buffer IR."""

from __future__ import annotations

import importlib.util
from typing import Any, Callable

import numpy as np
import pytest

import anfir
from anfir.passes.loops import COUNTED_LOOPS_STAT
from anfir.passes.pipeline import compile_program

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
jax = pytest.importorskip("jax")
from onnx_runs import assert_onnx_equal  # noqa: E402

jax.config.update("jax_enable_x64", True)
jnp, lax = jax.numpy, jax.lax

PROGRAM = """
def count_down(a) =
  let step = lambda (k, x) if k == 0 then x else step(k - 1, 0.5 * (x + a / x)) end in
  step(20, a)
def exit_first(x) =
  let loop = lambda (i, acc) if i > 5 then acc else loop(i + 1, acc * x + 1.0) end in
  loop(0, 1.0)
def up_to_inclusive(x) =
  let loop = lambda (i, acc) if i <= 5 then loop(i + 1, acc * x + 1.0) else acc end in
  loop(1, x)
def bound_first(x) =
  let loop = lambda (i, acc) if 6 > i then loop(i + 1, acc * x - 0.25) else acc end in
  loop(0, x)
def step_two(x) =
  let loop = lambda (i, acc) if i < 10 then loop(i + 2, sin(acc) * x) else acc end in
  loop(0, x)
def down_by_three(x) =
  let loop = lambda (i, acc) if i >= 0 then loop(i - 3, acc * x + i) else acc + i end in
  loop(10, x)
def not_equal(x) =
  let loop = lambda (i, acc) if i != 4 then loop(i + 1, cos(acc) + x) else acc end in
  loop(0, x)
def tensor_state(w) =
  let loop = lambda (i, h) if i < 4 then loop(i + 1, tanh(w @ h)) else sum(h) end in
  loop(0, ones((3,)))
def three_states(x) =
  let loop = lambda (i, a, b) if i < 6 then loop(i + 1, a * b, a + b * 0.5) else a + b end in
  loop(0, x, 1.0)
def counter_in_math(x) =
  let loop = lambda (i, acc) if 0 < i then loop(i - 1, acc * x + i) else acc end in
  loop(5, 1.0)
def tuple_state(x) =
  let loop = lambda (i, s) if i < 4 then loop(i + 1, (s[0] * x, s[1] + s[0])) else s[0] + s[1] end in
  loop(0, (1.0, 0.0))
def int_state(x) =
  let loop = lambda (i, k, acc) if i < 4 then loop(i + 1, k * 2, acc * x + k) else acc end in
  loop(0, 1, 1.0)
def global_step(i, acc, x) = if i < 5 then global_step(i + 1, acc * x, x) else acc
def global_loop(x) = global_step(0, 1.0, x)
def nested(x) =
  let outer = lambda (i, acc)
    if i < 3 then
      let inner = lambda (j, b) if j < 4 then inner(j + 1, b * x + 0.1) else b end in
      outer(i + 1, inner(0, acc))
    else acc end in
  outer(0, 1.0)
def bound_parameter(x, n) =
  let loop = lambda (i, m, acc) if i < m then loop(i + 3, m, acc * x + 1.0) else acc * i end in
  loop(1, n, x)
def over_rows(xs) =
  let loop = lambda (i, acc) if i < shape(xs)[0] then loop(i + 1, acc * 0.5 + gather(xs, i) * gather(xs, i)) else acc end in
  loop(0, 0.0)
def rows_passed(xs, w) =
  let loop = lambda (i, v, acc) if i < shape(v)[0] - 1 then loop(i + 1, v, acc + w * gather(v, i)) else acc * w end in
  loop(0, xs, 1.0)
def down_to(x, n) =
  let loop = lambda (k, acc) if k > n then loop(k - 1, acc * x + 0.5) else acc end in
  loop(7, x)
"""

MOD = anfir.parse(PROGRAM + "".join(
    f"def g_{name}(x) = grad({name})(x)\n" for name in (
        "count_down", "exit_first", "up_to_inclusive", "bound_first", "step_two", "down_by_three",
        "not_equal", "tensor_state", "three_states", "counter_in_math", "tuple_state",
        "global_loop", "nested", "int_state")) + """
def g_bound_parameter(x, n) = grad(bound_parameter)(x, n)
def g_down_to(x, n) = grad(down_to)(x, n)
def g_over_rows(xs) = grad(over_rows)(xs)
def g_rows_passed(xs, w) = grad(rows_passed, 0, 1)(xs, w)
""", "counted.anf")


def _fori(lo: int, hi: int, body: Callable[[Any, Any], Any], init: Any) -> Any:
    return lax.fori_loop(lo, hi, body, init)


def _three_states(x: Any) -> Any:
    a, b = _fori(0, 6, lambda i, s: (s[0] * s[1], s[0] + s[1] * 0.5), (x, 1.0))
    return a + b


def _tuple_state(x: Any) -> Any:
    a, b = _fori(0, 4, lambda i, s: (s[0] * x, s[1] + s[0]), (1.0, 0.0))
    return a + b


def _nested(x: Any) -> Any:
    return _fori(0, 3, lambda i, acc: _fori(0, 4, lambda j, b: b * x + 0.1, acc), 1.0)


def _down_by_three(x: Any) -> Any:
    # i = 10, 7, 4, 1 run; the loop stops at i = -2 and returns acc + i
    acc = _fori(0, 4, lambda k, acc: acc * x + (10 - 3 * k), x)
    return acc - 2


JAX = {
    "count_down": lambda a: _fori(0, 20, lambda k, x: 0.5 * (x + a / x), a),
    "exit_first": lambda x: _fori(0, 6, lambda i, acc: acc * x + 1.0, 1.0),
    "up_to_inclusive": lambda x: _fori(1, 6, lambda i, acc: acc * x + 1.0, x),
    "bound_first": lambda x: _fori(0, 6, lambda i, acc: acc * x - 0.25, x),
    "step_two": lambda x: _fori(0, 5, lambda i, acc: jnp.sin(acc) * x, x),
    "down_by_three": _down_by_three,
    "not_equal": lambda x: _fori(0, 4, lambda i, acc: jnp.cos(acc) + x, x),
    "tensor_state": lambda w: jnp.sum(_fori(0, 4, lambda i, h: jnp.tanh(w @ h), jnp.ones(3))),
    "three_states": _three_states,
    "counter_in_math": lambda x: _fori(0, 5, lambda k, acc: acc * x + (5 - k), 1.0),
    "tuple_state": _tuple_state,
    "global_loop": lambda x: _fori(0, 5, lambda i, acc: acc * x, 1.0),
    "nested": _nested,
    "int_state": lambda x: _fori(0, 4, lambda i, s: (s[0] * 2, s[1] * x + s[0]), (1, 1.0))[1],
}

W = np.random.RandomState(5).randn(3, 3) * 0.5
ONE_ARG = sorted(JAX)


def _args(name: str) -> list[Any]:
    return [W] if name == "tensor_state" else [0.7]




@pytest.mark.parametrize("name", ONE_ARG)
def test_each_shape_is_rewritten_and_its_gradient_equals_jax_everywhere(name: str) -> None:
    entry, args = "g_" + name, _args(name)
    want = np.asarray(jax.grad(JAX[name])(*args))
    result = compile_program(MOD, entry=entry, args=args)
    assert result.program.stats[COUNTED_LOOPS_STAT] >= 1, "not rewritten"
    np.testing.assert_allclose(anfir.run(result.graph, *args), want, rtol=1e-12)
    np.testing.assert_allclose(anfir.run(MOD[entry], *args), want, rtol=1e-12)  # the recursion
    model = anfir.export_onnx(MOD, entry=entry, args=args)
    onnx.checker.check_model(model, full_check=True)
    assert_onnx_equal(model, args, [want], entry, rtol=1e-12, atol=0.0)
    np.testing.assert_allclose(jax.jit(anfir.to_jax(result.graph))(*args), want, rtol=1e-12)
    low = anfir.lower(MOD, entry=entry, args=args)
    np.testing.assert_allclose(np.asarray(anfir.run(low, *args)).reshape(want.shape), want, rtol=1e-12)
    assert low.peak_bytes == low.max_live_bytes


def test_both_loops_of_a_nest_are_rewritten() -> None:
    result = compile_program(MOD, entry="g_nested", args=[0.7])
    assert result.program.stats[COUNTED_LOOPS_STAT] == 2


@pytest.mark.parametrize("entry", ["g_bound_parameter", "g_down_to"])
def test_run_time_bounds_give_the_recursion_s_trip_count(entry: str) -> None:
    # Trip counts from a bound known only at run time, zero trips included: the
    # exported model and the compiled program agree with the recursion for each n.
    result = compile_program(MOD, entry=entry, args=[0.7, 5])
    assert result.program.stats[COUNTED_LOOPS_STAT] == 1
    model = anfir.export_onnx(MOD, entry=entry, args=[0.7, 5])
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in model.graph.input]
    for n in range(-2, 12):
        want = anfir.run(MOD[entry], 0.7, n)
        np.testing.assert_allclose(anfir.run(result.graph, 0.7, n), want, rtol=1e-12)
        feed = {names[0]: np.asarray(0.7), names[1]: np.asarray(n)}
        np.testing.assert_allclose(np.asarray(session.run(None, feed)[0]).ravel()[0], want, rtol=1e-12)


def _over_rows(xs: Any) -> Any:
    return _fori(0, xs.shape[0], lambda i, acc: acc * 0.5 + xs[i] * xs[i], 0.0)


def _rows_passed(xs: Any, w: Any) -> Any:
    return _fori(0, xs.shape[0] - 1, lambda i, acc: acc + w * xs[i], 1.0) * w


def test_a_bound_computed_in_the_loop_from_invariant_values_is_computed_at_the_call() -> None:
    # `i < shape(xs)[0]` (xs from outside) and `i < shape(v)[0] - 1` (v a parameter passed
    # on unchanged): the bound's operations move to the call; each iteration indexes a row.
    xs, w = np.random.RandomState(2).randn(6), 0.8
    for entry, args, want in (
            ("g_over_rows", [xs], jax.grad(_over_rows)(xs)),
            ("g_rows_passed", [xs, w], jax.grad(_rows_passed, argnums=(0, 1))(xs, w))):
        result = compile_program(MOD, entry=entry, args=args)
        assert result.program.stats[COUNTED_LOOPS_STAT] == 1, entry
        for got, ref in zip(leaves(anfir.run(result.graph, *args)), leaves(want)):
            np.testing.assert_allclose(got, ref, rtol=1e-12)
        model = anfir.export_onnx(MOD, entry=entry, args=args)
        onnx.checker.check_model(model, full_check=True)
        assert_onnx_equal(model, args, leaves(want), entry, rtol=1e-12, atol=0.0)
        for got, ref in zip(leaves(jax.jit(anfir.to_jax(result.graph))(*args)), leaves(want)):
            np.testing.assert_allclose(got, ref, rtol=1e-12)
        low = anfir.lower(MOD, entry=entry, args=args)
        for got, ref in zip(leaves(anfir.run(low, *args)), leaves(want)):
            np.testing.assert_allclose(got.reshape(np.shape(ref)), ref, rtol=1e-12)
        assert low.peak_bytes == low.max_live_bytes
        if importlib.util.find_spec("coremltools") is not None:
            assert "while_loop(" in str(anfir.export_coreml(MOD, entry=entry, args=args))


def leaves(value: Any) -> list[np.ndarray]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in leaves(item)]
    return [np.asarray(value, dtype=np.float64)]


LEFT_ALONE = anfir.parse("""
def moving_bound(x) =
  let loop = lambda (i, n, acc) if i < n then loop(i + 1, n - 1, acc * x) else acc end in
  loop(0, 6, 1.0)
def float_counter(x) =
  let loop = lambda (t, acc) if t < 1.0 then loop(t + 0.25, acc * x) else acc end in
  loop(0.0, 1.0)
def wrong_way(x) =
  let loop = lambda (i, acc) if i < 5 then loop(i - 1, acc * x) else acc end in
  loop(7, 1.0)
def skipping_not_equal(x) =
  let loop = lambda (i, acc) if i != 6 then loop(i + 2, acc * x) else acc end in
  loop(0, 1.0)
""" + "".join(f"def g_{n}(x) = grad({n})(x)\n" for n in (
    "moving_bound", "float_counter", "wrong_way", "skipping_not_equal")),
    "left_alone.anf")


@pytest.mark.parametrize("name", ["moving_bound", "float_counter", "wrong_way",
                                  "skipping_not_equal"])
def test_loops_that_are_not_counted_stay_recursions_and_still_differentiate(name: str) -> None:
    # A bound that moves, a float counter, a step away from the bound, a != the step
    # jumps over: not a fori_loop, computed as before.
    result = compile_program(LEFT_ALONE, entry="g_" + name, args=[0.7])
    assert result.program.stats[COUNTED_LOOPS_STAT] == 0
    want = anfir.run(LEFT_ALONE["g_" + name], 0.7)
    np.testing.assert_allclose(anfir.run(result.graph, 0.7), want, rtol=1e-12)


SECOND_ORDER = ["count_down", "counter_in_math", "int_state", "nested", "tuple_state", "step_two"]
GG = anfir.parse(PROGRAM + "".join(f"def gg_{n}(x) = grad(grad({n}))(x)\n" for n in SECOND_ORDER),
                 "counted_gg.anf")


@pytest.mark.parametrize("name", SECOND_ORDER)
def test_second_order_gradients_of_each_shape_are_rewritten_and_export(name: str) -> None:
    # Differentiated twice, the loop is rewritten too (it captures only data); the integer
    # counter meets float arithmetic (counter_in_math) and an integer rides in the carry
    # (int_state): their sensitivities are zeros of their own type.
    entry = "gg_" + name
    want = float(jax.grad(jax.grad(JAX[name]))(0.7))
    result = compile_program(GG, entry=entry, args=[0.7])
    assert result.program.stats[COUNTED_LOOPS_STAT] >= 1
    np.testing.assert_allclose(anfir.run(result.graph, 0.7), want, rtol=1e-11)
    np.testing.assert_allclose(anfir.run(GG[entry], 0.7), want, rtol=1e-11)
    model = anfir.export_onnx(GG, entry=entry, args=[0.7])
    onnx.checker.check_model(model, full_check=True)
    assert_onnx_equal(model, [0.7], [np.asarray(want)], entry, rtol=1e-11, atol=0.0)
    low = anfir.lower(GG, entry=entry, args=[0.7])
    np.testing.assert_allclose(np.asarray(anfir.run(low, 0.7)).ravel()[0], want, rtol=1e-11)

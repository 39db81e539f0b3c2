"""Operators of the op library, checked against numpy, PyTorch and finite differences.

The cases are the table of ``tests/ops_table.py``.  For each operator:

* values against numpy on f32 and f64, on broadcast operands, 0-d, empty
  tensors and Python scalars, the dtype of an f32 argument kept;
* values and gradients against PyTorch (skipped, with the reason, when
  PyTorch is not installed);
* the shape rule against the evaluated shape, for shapes drawn by
  hypothesis, with symbolic dimensions;
* gradients against finite differences, and second derivatives for the
  smooth ones;
* attributes: printed and parsed back, dumped and loaded back, kept by every
  phase of ``anfir.compile``; bad ones are located errors.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import anfir
from anfir.abstract.lattice import abstract_of_value
from anfir.abstract.shapes import dim_symbol
from anfir.abstract.values import AScalar, ATensor
from anfir.dtypes import dtype_of_array
from anfir.errors import AnfirSyntaxError, AnfirTypeError, ShapeError
from anfir.grammar.ir_loader import load_ir_text
from anfir.ir.attrs import Attrs
from anfir.ir.nodes import CNode
from anfir.passes.specialize import infer_new_graph
from anfir.primitives import PRIMITIVES
from anfir.printers.iso import assert_isomorphic
from gradcheck import assert_close, check_grad, numeric_grad
from ops_table import (BINARY, INTEGER, PREDICATES, REDUCTIONS, UNARY, Op, Reduction,
                       torch_dims)

try:
    import torch
except ImportError:  # pragma: no cover - torch is optional (the dev extra lists it)
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed "
                                 "(pip install torch==2.13.0, or the dev extra)")

DTYPES = {"f32": np.float32, "f64": np.float64}
TOL = {"f32": dict(rtol=2e-6, atol=1e-6), "f64": dict(rtol=1e-12, atol=1e-14)}
TORCH_TOL = {"f32": dict(rtol=1e-5, atol=1e-6), "f64": dict(rtol=1e-10, atol=1e-12)}


@functools.lru_cache(maxsize=None)
def program(text: str) -> anfir.Module:
    """The parsed program (each text once)."""
    return anfir.parse(text, "ops.anf")


def fn(call: str, nargs: int = 1) -> anfir.FuncGraph:
    params = "x, y" if nargs == 2 else "x"
    return program(f"def f({params}) = {call.format(x='x', y='y')}")["f"]


def draw(shape: tuple[int, ...], dtype: Any, low: float, high: float, seed: int = 0) -> Any:
    rng = np.random.default_rng(seed)
    return rng.uniform(low, high, size=shape).astype(dtype)


def check_value(got: Any, want: Any, dtype: str, keeps_dtype: bool = True) -> None:
    want = np.asarray(want)
    assert np.shape(got) == want.shape, (np.shape(got), want.shape)
    if keeps_dtype:
        assert np.asarray(got).dtype == want.dtype, (np.asarray(got).dtype, want.dtype)
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(np.asarray(got, np.float64), want.astype(np.float64),
                                   **TOL[dtype], equal_nan=True)


# -- values against numpy ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", UNARY + PREDICATES, ids=lambda o: o.id)
def test_unary_values(op: Op, dtype: str) -> None:
    f = fn(op.call)
    for shape in [(2, 3), (), (0, 3)]:
        x = draw(shape, DTYPES[dtype], op.low, op.high)
        check_value(anfir.run(f, x), op.ref(x), dtype, op.keeps_dtype)
    # A Python float gives a Python scalar.
    value = anfir.run(f, 0.25 if op.low < 0.25 < op.high else op.low + 0.1)
    assert isinstance(value, (float, bool)) and not isinstance(value, np.generic), type(value)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", BINARY, ids=lambda o: o.id)
def test_binary_values_broadcast(op: Op, dtype: str) -> None:
    f = fn(op.call, 2)
    for i, (sx, sy) in enumerate([((2, 3), (2, 3)), ((2, 1), (3,)), ((), (2,)), ((0, 3), (1, 3))]):
        x = draw(sx, DTYPES[dtype], op.low, op.high, i)
        y = draw(sy, DTYPES[dtype], op.low, op.high, i + 10)
        check_value(anfir.run(f, x, y), op.ref(x, y), dtype)
    assert isinstance(anfir.run(f, 1.5, 0.75), float)


@pytest.mark.parametrize("op", INTEGER, ids=lambda o: o.id)
def test_integer_and_boolean_ops(op: Op) -> None:
    f = fn(op.call, op.nargs)
    rng = np.random.default_rng(3)
    for dtype in ([np.int64, np.int32, np.uint8] if op.kind == "int" else [np.bool_]):
        args = [rng.integers(0, 6, size=(2, 3)).astype(dtype) for _ in range(op.nargs)]
        check_value(anfir.run(f, *args), op.ref(*args), "f64")
    scalars = (5, 2) if op.kind == "int" else (True, False)
    assert anfir.run(f, *scalars[:op.nargs]) == op.ref(*scalars[:op.nargs])


def test_division_variants_follow_python_signs() -> None:
    f = program("def f(x, y) = (floor_div(x, y), mod(x, y), fmod(x, y))")["f"]
    assert anfir.run(f, -7, 2) == (-4, 1, -1)
    assert anfir.run(f, 7.5, -2.0) == (-4.0, -0.5, 1.5)
    out = anfir.run(f, np.array([-7, 7], np.int32), np.int32(2))
    assert [o.dtype for o in out] == [np.int32] * 3
    # Division by zero is inf / nan (floats) or 0 (integers), as numpy, without warnings.
    assert anfir.run(f, 1.0, 0.0)[0] == math.inf


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("red", REDUCTIONS, ids=lambda r: r.id)
def test_reduction_values(red: Reduction, dtype: str) -> None:
    kw = dict(red.kw)
    extra = "".join(f", {k}={_literal(v)}" for k, v in red.kw)
    x = draw((2, 3, 4), DTYPES[dtype], red.low, red.high)
    for axis in [None, 0, -1, (0, 2), (-1, 1)]:
        for keepdims in (False, True):
            call = f"{red.name}({red.arg}, axis={_literal(axis)}, keepdims={_literal(keepdims)}{extra})"
            want = reference(red, x, axis, keepdims, kw)
            got = anfir.run(fn(call), x)
            check_value(got, want, dtype, red.result == "float")
    # 0-d tensors and scalars, and empty ones.
    check_value(anfir.run(fn(f"{red.name}({red.arg}{extra})"), np.asarray(x.flat[0])),
                reference(red, np.asarray(x.flat[0]), None, False, kw), dtype, red.result == "float")
    if red.empty_ok:
        empty = np.zeros((0, 3), DTYPES[dtype])
        for axis in (0, 1, None):
            got = anfir.run(fn(f"{red.name}({red.arg}, axis={_literal(axis)}{extra})"), empty)
            check_value(got, reference(red, empty, axis, False, kw), dtype, red.result == "float")


def reference(red: Reduction, x: Any, axis: Any, keepdims: bool, kw: dict) -> Any:
    """numpy's value, quietly (a variance of one element with correction 1 is nan)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return red.ref(x, axis, keepdims, **kw)


def _literal(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and math.isinf(value):
        return "1e999"
    return repr(value)


def test_positional_attributes_are_the_keyword_ones() -> None:
    x = draw((2, 3, 4), np.float64, -1, 1)
    same = [("sum(x, 1)", "sum(x, axis=1)"), ("sum(x, -1, true)", "sum(x, axis=-1, keepdims=true)"),
            ("prod(x, (0, 2))", "prod(x, axis=(0, 2))"), ("norm(x, 1, 0)", "norm(x, ord=1, axis=0)"),
            ("cumsum(x, 2, false, true)", "cumsum(x, axis=2, reverse=true)"),
            ("sum(x, None, false)", "sum(x)")]
    for positional, keyword in same:
        a, b = fn(positional), fn(keyword)
        assert_isomorphic(a, b)  # one canonical graph
        np.testing.assert_array_equal(anfir.run(a, x), anfir.run(b, x))


def test_max_and_min_with_two_arguments_are_elementwise() -> None:
    f = program("def f(x) = (max(x), max(x, 1.0), min(x, axis=0), min(x, 0))")["f"]
    x = np.array([[3.0, -1.0], [0.5, 2.0]])
    top, clipped, low, clamped = anfir.run(f, x)
    assert top == 3.0 and low.tolist() == [0.5, -1.0]
    np.testing.assert_array_equal(clipped, np.maximum(x, 1.0))
    np.testing.assert_array_equal(clamped, np.minimum(x, 0))
    with pytest.raises(anfir.AnfirError, match="elementwise"):
        anfir.run(program("def g(x) = max(x, x, axis=0)")["g"], x)


@pytest.mark.parametrize("dtype", DTYPES)
def test_arg_extremes_and_scans(dtype: str) -> None:
    x = np.array([[1.0, 5.0, 5.0, -2.0], [3.0, 3.0, 0.5, 0.5]], DTYPES[dtype])
    cases = {
        "argmax(x, axis=1)": np.argmax(x, 1), "argmin(x)": np.argmin(x, 0),
        "argmax(x, axis=-1, select_last=true)": np.array([2, 1]),
        "argmin(x, axis=1, keepdims=true, select_last=true)": np.array([[3], [3]]),
        "argmax(x, axis=None)": np.int64(1),
        "cumsum(x, 1)": np.cumsum(x, 1), "cumsum(x)": np.cumsum(x),
        "cumsum(x, axis=-1, exclusive=true)": np.concatenate([np.zeros((2, 1)), np.cumsum(x, 1)[:, :-1]], 1),
        "cumsum(x, axis=0, reverse=true)": np.flip(np.cumsum(np.flip(x, 0), 0), 0),
        "cumprod(x, 1, true, true)": np.concatenate(
            [np.flip(np.cumprod(np.flip(x, 1), 1), 1)[:, 1:], np.ones((2, 1))], 1),
    }
    for call, want in cases.items():
        got = anfir.run(fn(call), x)
        keeps = not call.startswith("arg")
        want = np.asarray(want, x.dtype if keeps else np.int64)
        check_value(got, want, dtype, keeps)


# -- against PyTorch -------------------------------------------------------------------------
@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", [o for o in UNARY + BINARY + PREDICATES if o.torch is not None],
                         ids=lambda o: o.id)
def test_values_and_gradients_against_torch(op: Op, dtype: str) -> None:
    f = fn(op.call, op.nargs)
    args = [draw((2, 3), DTYPES[dtype], op.low, op.high, i) for i in range(op.nargs)]
    tensors = [torch.tensor(a, requires_grad=op.grad) for a in args]
    out = op.torch(torch, *tensors)
    np.testing.assert_allclose(anfir.run(f, *args), out.detach().numpy(), **TORCH_TOL[dtype])
    if not op.grad:
        return
    out.sum().backward()
    loss = program(f"def g({', '.join('xy'[:op.nargs])}) = sum({op.call.format(x='x', y='y')})")["g"]
    grads = anfir.run(anfir.grad(loss, tuple(range(op.nargs))), *args)
    tol = dict(TORCH_TOL[dtype])
    tol["rtol"] = max(tol["rtol"], op.torch_rtol)
    for got, t in zip(grads, tensors):
        assert np.asarray(got).dtype == DTYPES[dtype]
        np.testing.assert_allclose(got, t.grad.numpy(), **tol)


@needs_torch
@pytest.mark.parametrize("op", INTEGER, ids=lambda o: o.id)
def test_integer_ops_against_torch(op: Op) -> None:
    rng = np.random.default_rng(5)
    dtype = np.int64 if op.kind == "int" else np.bool_
    args = [rng.integers(0, 6, size=(2, 3)).astype(dtype) for _ in range(op.nargs)]
    want = op.torch(torch, *(torch.tensor(a) for a in args)).numpy()
    np.testing.assert_array_equal(anfir.run(fn(op.call, op.nargs), *args), want)


@needs_torch
@pytest.mark.parametrize("red", REDUCTIONS, ids=lambda r: r.id)
def test_reductions_against_torch(red: Reduction) -> None:
    kw = dict(red.kw)
    extra = "".join(f", {k}={_literal(v)}" for k, v in red.kw)
    x = draw((2, 3, 4), np.float64, red.low, red.high, 7)
    for axis, keepdims in [(None, False), (1, True), ((0, -1), False)]:
        call = f"{red.name}({red.arg}, axis={_literal(axis)}, keepdims={_literal(keepdims)}{extra})"
        t = torch.tensor(x, requires_grad=red.grad)
        want = red.torch(torch, t, torch_dims(axis, 3), keepdims, **kw)
        np.testing.assert_allclose(anfir.run(fn(call), x), want.detach().numpy(), rtol=1e-10)
        if red.grad:
            want.sum().backward()
            loss = program(f"def g(x) = sum({call})")["g"]
            np.testing.assert_allclose(anfir.run(anfir.grad(loss), x), t.grad.numpy(), rtol=1e-10)


@needs_torch
def test_scans_and_arg_extremes_against_torch() -> None:
    x = draw((3, 4), np.float64, 0.5, 1.5, 11)
    t = torch.tensor(x, requires_grad=True)
    for call, reference in [("cumsum(x, 1)", lambda v: torch.cumsum(v, 1)),
                            ("cumprod(x, 0)", lambda v: torch.cumprod(v, 0)),
                            ("cumsum(x, axis=0, reverse=true)",
                             lambda v: torch.flip(torch.cumsum(torch.flip(v, [0]), 0), [0]))]:
        want = reference(t)
        np.testing.assert_allclose(anfir.run(fn(call), x), want.detach().numpy(), rtol=1e-12)
        (grad,) = torch.autograd.grad((want * want).sum(), t)
        loss = program(f"def g(x) = let c = {call} in sum(c * c)")["g"]
        np.testing.assert_allclose(anfir.run(anfir.grad(loss), x), grad.numpy(), rtol=1e-10)
    np.testing.assert_array_equal(anfir.run(fn("argmax(x, 1)"), x), torch.argmax(t, 1).numpy())
    np.testing.assert_array_equal(anfir.run(fn("argmin(x, 0, true)"), x),
                                  torch.argmin(t, 0, keepdim=True).numpy())


# -- gradients against finite differences ------------------------------------------------------
GRAD_UNARY = [op for op in UNARY + BINARY if op.grad]


@pytest.mark.parametrize("op", GRAD_UNARY, ids=lambda o: o.id)
def test_gradients_against_finite_differences(op: Op) -> None:
    params = ", ".join("xy"[:op.nargs])
    text = f"def f({params}) = sum(sin({op.call.format(x='x', y='y')}))"
    args = [draw((2, 3) if i == 0 else (3,), np.float64, op.low, op.high, 20 + i)
            for i in range(op.nargs)]
    check_grad(text, args, tuple(range(op.nargs)) if op.nargs > 1 else 0,
               ways=("api", "compiled_program"), rtol=1e-5, atol=1e-7)


SECOND = [op for op in GRAD_UNARY if op.second]


@pytest.mark.parametrize("op", SECOND, ids=lambda o: o.id)
def test_second_derivatives(op: Op) -> None:
    # d/dx of the derivative (grad of grad), against finite differences of the derivative.
    if op.nargs == 1:
        text = (f"def d(x) = grad(lambda (y) {op.call.format(x='y')} end)(x)\n")
        point = [0.5 * (op.low + op.high) + 0.13 * (op.high - op.low)]
    else:
        text = f"def d(x, y) = grad(lambda (a, b) {op.call.format(x='a', y='b')} end)(x, y)\n"
        point = [op.low + 0.37 * (op.high - op.low), op.low + 0.71 * (op.high - op.low)]
    # (``compiled_program``: compiling grad(d) from Python, of a d that itself calls
    # grad, is not supported by the ad phase yet; inside a program it is.)
    check_grad(text, point, 0, entry="d", ways=("api", "compiled_program"), rtol=1e-5, atol=1e-7)


GRAD_REDUCTIONS = [r for r in REDUCTIONS if r.grad]


@pytest.mark.parametrize("red", GRAD_REDUCTIONS, ids=lambda r: r.id)
def test_reduction_gradients(red: Reduction) -> None:
    extra = "".join(f", {k}={_literal(v)}" for k, v in red.kw)
    x = draw((2, 3), np.float64, red.low, red.high, 31)
    for axis, keepdims in [(None, False), (-1, True), (0, False)]:
        call = f"{red.name}(x, axis={_literal(axis)}, keepdims={_literal(keepdims)}{extra})"
        check_grad(f"def f(x) = sum(sin({call}))", [x], ways=("api",), rtol=1e-5, atol=1e-7,
                   msg=call)
    if red.second:
        weights = "array(((0.3, -1.1, 0.7), (1.3, 0.2, -0.4)))"
        text = (f"def f(x) = sum(sin({red.name}(x, axis=1{extra})))\n"
                f"def h(x) = sum(grad(f)(x) * {weights})\n")
        check_grad(text, [x], entry="h", ways=("api", "compiled_program"), rtol=1e-5, atol=1e-7)


def test_scan_gradients_to_second_order() -> None:
    x = draw((2, 3), np.float64, 0.5, 1.5, 41)
    for call in ["cumsum(x, 1)", "cumsum(x, axis=0, exclusive=true, reverse=true)", "cumsum(x)",
                 "cumprod(x, 1)", "cumprod(x, axis=-1, exclusive=true)", "cumprod(x)"]:
        text = (f"def f(x) = sum(sin({call}))\n"
                "def h(x) = sum(grad(f)(x) * array(((0.3, -1.1, 0.7), (1.3, 0.2, -0.4))))\n")
        check_grad(text, [x], ways=("api", "compiled_program"), rtol=1e-5, atol=1e-7, msg=call)
        check_grad(text, [x], entry="h", ways=("api",), rtol=1e-5, atol=1e-7, msg=call)


def test_prod_gradient_is_exact_at_zeros() -> None:
    x = np.array([[2.0, 0.0, 3.0], [0.0, 0.0, 1.5]])
    f = program("def f(x) = sum(prod(x, 1) * array((1.0, 2.0)))\n"
                "def g(x) = prod(x)")
    np.testing.assert_allclose(anfir.run(anfir.grad(f["f"]), x),
                               [[0.0, 6.0, 0.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(anfir.run(anfir.grad(f["g"]), np.array([2.0, 0.0, 3.0])),
                               [0.0, 6.0, 0.0])


@pytest.mark.parametrize("call", ["gelu(x)", "norm(x, axis=1)", "var(x, 0, correction=1)",
                                  "logsumexp(x, -1)", "max(x, axis=1)", "clip(x, min=-0.3)"])
def test_an_f32_program_stays_f32_through_gradients(call: str) -> None:
    x = draw((2, 3), np.float32, -1, 1, 51)
    f = program(f"def f(x) = sum({call})")["f"]
    value = anfir.run(f, x)
    assert value.dtype == np.float32
    for graph in (anfir.grad(f), anfir.compile(anfir.grad(f), args=[x])):
        g = anfir.run(graph, x)
        assert g.dtype == np.float32 and g.shape == x.shape
    want = numeric_grad(program(f"def f(x) = sum({call})")["f"], [x.astype(np.float64)], eps=1e-6)
    assert_close(anfir.run(anfir.grad(f), x), want, rtol=2e-3, atol=2e-3)


# -- shape rules ---------------------------------------------------------------------------------
_SYMBOLS = [dim_symbol(n) for n in ("B", "N", "K")]


def infer(call: str, *abstracts: Any, nargs: int = 1) -> Any:
    """The type the specializer gives ``call`` on arguments of these types."""
    return infer_new_graph(fn(call, nargs), abstracts)


def concrete(abstract: Any, sizes: dict[Any, int]) -> tuple[tuple[int, ...], str]:
    if isinstance(abstract, AScalar):
        return (), abstract.dtype
    assert isinstance(abstract, ATensor) and abstract.shape is not None, abstract
    return tuple(int(sympy.sympify(d).subs(sizes)) for d in abstract.shape), abstract.dtype


shapes = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)


def _symbolic(shape: tuple[int, ...], mask: list[bool]) -> tuple[tuple[Any, ...], dict[Any, int]]:
    dims, sizes = [], {}
    for i, (d, symbolic) in enumerate(zip(shape, mask)):
        if symbolic and d > 1:
            dims.append(_SYMBOLS[i])
            sizes[_SYMBOLS[i]] = d
        else:
            dims.append(d)
    return tuple(dims), sizes


SHAPE_OPS = [op for op in UNARY + PREDICATES] + [op for op in BINARY]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), shape=shapes, mask=st.lists(st.booleans(), min_size=3, max_size=3))
def test_elementwise_shape_rules_agree_with_evaluation(data: Any, shape: Any, mask: Any) -> None:
    op = data.draw(st.sampled_from(SHAPE_OPS), label="op")
    dtype = data.draw(st.sampled_from(["f32", "f64"]), label="dtype")
    other = shape[data.draw(st.integers(0, len(shape)), label="suffix"):]
    dims, sizes = _symbolic(shape, mask)
    args = [np.full(shape, 0.5 * (op.low + op.high), DTYPES[dtype])]
    abstracts = [ATensor(dtype, dims)]
    if op.nargs == 2:
        args.append(np.full(other, op.high, DTYPES[dtype]))
        abstracts.append(ATensor(dtype, dims[len(dims) - len(other):]))
    out = anfir.run(fn(op.call, op.nargs), *args)
    got_shape, got_dtype = concrete(infer(op.call, *abstracts, nargs=op.nargs), sizes)
    assert got_shape == np.shape(out)
    assert got_dtype == dtype_of_array(np.asarray(out))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), shape=shapes.filter(lambda s: len(s) > 0),
       mask=st.lists(st.booleans(), min_size=3, max_size=3))
def test_reduction_shape_rules_agree_with_evaluation(data: Any, shape: Any, mask: Any) -> None:
    rank = len(shape)
    red = data.draw(st.sampled_from([r for r in REDUCTIONS if r.empty_ok or 0 not in shape]
                                    + ["argmax", "argmin", "cumsum", "cumprod"]), label="op")
    axes = st.one_of(st.none(), st.integers(-rank, rank - 1),
                     st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True)
                     .map(tuple))
    axis = data.draw(axes, label="axis")
    keepdims = data.draw(st.booleans(), label="keepdims")
    if isinstance(red, str):
        if isinstance(axis, tuple) or (red.startswith("arg") and 0 in shape):
            axis = -1 if not red.startswith("arg") or 0 not in shape else None
            if red.startswith("arg") and 0 in shape:
                return  # argmax of nothing is an error, both ways
        option = "exclusive" if red.startswith("cum") else "keepdims"
        call = f"{red}(x, axis={_literal(axis)}, {option}={_literal(keepdims)})"
    else:
        extra = "".join(f", {k}={_literal(v)}" for k, v in red.kw)
        call = f"{red.name}({red.arg}, axis={_literal(axis)}, keepdims={_literal(keepdims)}{extra})"
    dims, sizes = _symbolic(shape, mask)
    x = np.full(shape, 0.75)
    out = anfir.run(fn(call), x)
    got_shape, got_dtype = concrete(infer(call, ATensor("f64", dims)), sizes)
    assert got_shape == np.shape(out), call
    assert got_dtype == dtype_of_array(np.asarray(out)), call


def test_shape_rules_on_symbolic_dimensions() -> None:
    B, N = _SYMBOLS[:2]
    x = ATensor("f32", (B, N, 3))
    assert infer("sum(x, axis=1, keepdims=true)", x) == ATensor("f32", (B, 1, 3))
    assert infer("var(x, (0, -1))", x) == ATensor("f32", (N,))
    assert infer("cumsum(x)", x) == ATensor("f32", (3 * B * N,))
    assert infer("argmax(x, -1)", x) == ATensor("i64", (B, N))
    assert infer("norm(x)", x) == AScalar("f32")
    assert infer("atan2(x, y)", x, ATensor("f32", (N, 1)), nargs=2) == x
    with pytest.raises(ShapeError, match="out of range"):
        infer("prod(x, 3)", x)


# -- attributes: printing, dumps and phases ----------------------------------------------------
ATTRIBUTES = """
def f(x, w) =
  let h = gelu(x @ w, approximate="tanh") in
  let s = sum(leaky_relu(h, alpha=0.2) * cumsum(h, axis=1, reverse=true), axis=-1, keepdims=true) in
  let n = norm(clip(h, min=-1.0, max=None), ord=1e999, axis=(0, 1)) in
  mean(s) + n + sum(var(h, 0, correction=1)) + sum(sum(h, 1))

def df(x, w) = grad(f, 1)(x, w)
"""


def test_attributes_round_trip_through_text_and_dumps() -> None:
    mod = anfir.parse(ATTRIBUTES, "attrs.anf")
    text = anfir.to_text(mod)
    for expected in ['gelu(%1, approximate="tanh")', "sum(%4, axis=-1, keepdims=true)",
                     "clip(h, min=-1.0)",  # max=None is the default: not repeated
                     "norm(%5, ord=1e999, axis=(0, 1))", "var(h, axis=0, correction=1)",
                     "cumsum(h, axis=1, reverse=true)"]:
        assert expected in text, (expected, text)
    assert_isomorphic(mod, anfir.parse(text, "again.anf"))
    dump = anfir.dump_ir(mod)
    assert "primitive_attrs: {axis: -1, keepdims: true}" in dump
    assert "primitive_attrs: {ord: inf, axis: (0, 1)}" in dump
    loaded = load_ir_text(dump, "attrs.ir")
    assert_isomorphic(mod, loaded)
    assert anfir.dump_ir(loaded) == dump


def test_attributes_survive_every_phase(tmp_path: Path) -> None:
    mod = anfir.parse(ATTRIBUTES, "attrs.anf")
    rng = np.random.default_rng(61)
    args = [rng.normal(size=(3, 4)), rng.normal(size=(4, 5))]
    result = anfir.compile(mod, entry="df", args=args, dump_dir=tmp_path)
    want = anfir.run(mod["df"], *args)
    np.testing.assert_allclose(anfir.run(result, *args), want, rtol=1e-10)
    dumps = sorted(p for p in os.listdir(tmp_path) if p.endswith(".ir"))
    assert len(dumps) >= 7
    for name in dumps:
        text = (tmp_path / name).read_text()
        assert 'approximate: "tanh"' in text and "alpha: 0.2" in text, name
        assert "reverse: true" in text and "correction: 1" in text, name
        loaded = anfir.load(tmp_path / name)
        assert anfir.dump_ir(loaded, phase=name[:-3]) == text, name
        if "parse" not in name and "resolve" not in name:
            np.testing.assert_allclose(anfir.run(loaded, *args), want, rtol=1e-10)
    dot = (tmp_path / dumps[-1].replace(".ir", ".dot")).read_text()
    assert "approximate=&quot;tanh&quot;" in dot or 'approximate="tanh"' in dot


def test_equal_calls_merge_only_with_equal_attributes() -> None:
    mod = anfir.parse("def f(x) = (sum(x, 0), sum(x, axis=0), sum(x, axis=0, keepdims=true), "
                      "sum(x, 1))")
    out = anfir.compile(mod, entry="f", args=[np.ones((2, 3))])
    sums = [n for n in out.nodes() if isinstance(n, CNode) and n.is_apply(PRIMITIVES["sum"])]
    assert sorted(repr(n.attrs) for n in sums) == [
        "{axis: 0, keepdims: True}", "{axis: 0}", "{axis: 1}"]
    # A keepdims given as an integer is not the same attribute as true.
    assert Attrs({"keepdims": True}) != Attrs({"keepdims": 1})


def test_primitives_used_as_values_take_positional_attributes() -> None:
    mod = anfir.parse("""
def apply(f, x) = f(x)
def main(x) = (apply(max, x), partial(sum, x)(1), partial(cumsum, x, 0)(false, true),
               apply(lambda (v) norm(v, ord=1) end, x))
""")
    x = np.array([[1.0, -4.0], [2.5, 3.0]])
    top, rows, scan, l1 = anfir.run(mod["main"], x)
    assert top == 3.0 and rows.tolist() == [-3.0, 5.5] and l1 == 10.5
    np.testing.assert_array_equal(scan, np.flip(np.cumsum(np.flip(x, 0), 0), 0))
    compiled = anfir.compile(mod, entry="main", args=[x])
    for got, want in zip(anfir.run(compiled, x), (top, rows, scan, l1)):
        np.testing.assert_array_equal(got, want)
    check_grad("def apply(f, x) = f(x)\n"
               "def loss(x) = let p = partial(sum, x) in sum(p(0) * array((1.0, 2.0))) * apply(max, x)",
               [x], entry="loss", ways=("api", "program"))
    # (Compiled, the J-transformed sum a partial holds is a graph whose arguments are
    # typed without their values, so its axis is not a constant: not supported yet.)


# -- errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize("text, kind, message, col", [
    ("def f(x) = sum(x, axes=1)", AnfirTypeError, "no attribute 'axes'", 15),
    ("def f(x, a) = sum(x, axis=a)", AnfirSyntaxError, "must be a constant", 22),
    ("def f(x) = exp(x, axis=1)", AnfirTypeError, "takes no keyword", 15),
    ("def g(x) = x\ndef f(x) = g(x, axis=1)", AnfirTypeError, "'g' is a function", 13),
    ("def f(x) = sum(x, 1, axis=0)", AnfirTypeError, "both positionally", 15),
    ("def f(x) = sum(x, axis=0, axis=1)", AnfirSyntaxError, "given twice", 27),
    ("def f(x) = sum(x, axis=(0, x))", AnfirSyntaxError, "must be a constant", 19),
])
def test_bad_attributes_are_located_errors(text: str, kind: type, message: str, col: int) -> None:
    with pytest.raises(kind, match=message) as info:
        anfir.parse(text, "bad.anf")
    assert info.value.loc is not None and info.value.loc.file == "bad.anf"
    assert info.value.loc.col == col


@pytest.mark.parametrize("call, message", [
    ('sum(x, axis="a")', "axis"), ('gelu(x, approximate="fast")', "approximate"),
    ("leaky_relu(x, alpha=true)", "alpha"), ("sum(x, keepdims=1)", "keepdims"),
    ("argmax(x, axis=(0, 1))", "axis"), ("prod(x, axis=5)", "out of (range|bounds)"),
])
def test_bad_attribute_values_are_located_at_compile_and_run_time(call: str, message: str) -> None:
    mod = anfir.parse(f"def f(x) =\n  {call}", "bad.anf")
    x = np.ones((2, 3))
    for action in (lambda: anfir.compile(mod, entry="f", args=[x]), lambda: anfir.run(mod["f"], x)):
        with pytest.raises(anfir.AnfirError, match=message) as info:
            action()
        assert info.value.loc is not None and info.value.loc.line == 2, info.value


def test_bad_attributes_in_a_dump_are_located() -> None:
    good = anfir.dump_ir(anfir.parse("def f(x) = sum(x, axis=1)"))
    for bad, message in [(good.replace("{axis: 1}", "{axes: 1}"), "no attribute"),
                         (good.replace("sum(%para1_x)", "@f(%para1_x)"), "not a primitive")]:
        with pytest.raises(anfir.AnfirError, match=message) as info:
            load_ir_text(bad, "bad.ir")
        assert info.value.loc is not None


def test_every_attribute_declaration_matches_its_evaluation() -> None:
    # declare() checks it at import; this keeps the check itself honest.
    for prim in PRIMITIVES.values():
        assert set(prim.positional_attrs) <= set(prim.attrs)
        assert prim.canonical_attrs(dict(prim.attrs)) == Attrs()


def test_abstract_of_attribute_values_is_static() -> None:
    # A positional attribute is a constant the rule can rely on.
    assert abstract_of_value((0, 1)).items[0] == AScalar("i64", 0)


# -- softplus (the first operator of this file) -------------------------------------------------
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

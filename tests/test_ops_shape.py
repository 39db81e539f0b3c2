"""The shape and indexing operators (anfir/primitives/shaping.py, indexing.py).

Values against numpy and PyTorch (f32 and f64, negative axes, 0-d and empty
tensors), shape rules against evaluated shapes (hypothesis, symbolic
dimensions), gradients against finite differences and torch.autograd (second
order too), attributes through to_text → parse and dump_ir → load, located
errors, and the JAX and ONNX back ends against ``anfir.run``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import anfir
from anfir.abstract.shapes import dim_symbol, is_unknown_dim
from anfir.abstract.values import AScalar, ATensor, ATuple
from anfir.dtypes import dtype_of_array
from anfir.grammar.ir_loader import load_ir_text
from anfir.passes.specialize import infer_new_graph
from anfir.printers.iso import assert_isomorphic
from gradcheck import assert_close, numeric_grad

try:
    import torch
except ImportError:  # pragma: no cover - torch is optional (the dev extra lists it)
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed "
                                 "(pip install torch==2.13.0, or the dev extra)")
DTYPES = {"f32": np.float32, "f64": np.float64}
TOL = {"f32": dict(rtol=1e-6, atol=1e-6), "f64": dict(rtol=1e-13, atol=1e-14)}


@functools.lru_cache(maxsize=None)
def program(text: str) -> anfir.Module:
    return anfir.parse(text, "shape_ops.anf")


def fn(call: str) -> anfir.FuncGraph:
    return program(f"def f(x) = {call}")["f"]


X = np.random.default_rng(7).normal(size=(2, 3, 4))
IDX = np.array([[0, -1], [2, 1]])


@dataclass(frozen=True)
class Case:
    """One call of an operator on x (shape (2, 3, 4) unless ``shape``)."""

    id: str
    call: str
    ref: Callable[[Any], Any]
    """numpy on x."""
    torch: Optional[Callable[[Any, Any], Any]] = None
    """torch(t, x) on a tensor."""
    grad: bool = True
    shape: tuple[int, ...] = (2, 3, 4)


def _t_slice(t: Any, x: Any) -> Any:
    return x[:, 1:-1].flip(-1)[..., ::2]  # (torch has no negative steps)


CASES = [
    Case("concat", "concat((x, x * 2.0), -1)", lambda x: np.concatenate([x, x * 2], -1),
         lambda t, x: t.cat([x, x * 2], -1)),
    Case("concat_0", "concat((x, x, x))", lambda x: np.concatenate([x, x, x]),
         lambda t, x: t.cat([x, x, x])),
    Case("stack", "stack((x, x * 3.0), 1)", lambda x: np.stack([x, x * 3], 1),
         lambda t, x: t.stack([x, x * 3], 1)),
    Case("stack_neg", "stack((x, x), axis=-1)", lambda x: np.stack([x, x], -1),
         lambda t, x: t.stack([x, x], -1)),
    Case("split", "tuple_getitem(split(x, (1, 3), -1), 1)", lambda x: x[..., 1:],
         lambda t, x: t.split(x, [1, 3], -1)[1]),
    Case("split_count", "tuple_getitem(split(x, 2, axis=2), 0)", lambda x: x[..., :2],
         lambda t, x: t.chunk(x, 2, 2)[0]),
    Case("slice", "slice(x, (1, -1, -1), (99, 1, -99), (1, 1, 2), (1, 1, -2))".replace(
        "(1, -1, -1), (99, 1, -99), (1, 1, 2), (1, 1, -2)", "(1, -1), (-1, -99), (1, 2), (1, -2)"),
         lambda x: x[:, 1:-1, ::-2], _t_slice),
    Case("slice_clamp", "slice(x, starts=-100, ends=2, axes=0)", lambda x: x[:2],
         lambda t, x: x[:2]),
    Case("pad", "pad(x, (0, 1, 2, 0, 2, 1), value=1.5)",
         lambda x: np.pad(x, ((0, 0), (1, 2), (2, 1)), constant_values=1.5),
         lambda t, x: t.nn.functional.pad(x, (2, 1, 1, 2, 0, 0), value=1.5)),
    Case("pad_reflect", 'pad(x, (0, 1, 2, 0, 1, 3), "reflect")',
         lambda x: np.pad(x, ((0, 0), (1, 1), (2, 3)), mode="reflect"),
         lambda t, x: t.nn.functional.pad(x, (2, 3, 1, 1), mode="reflect")),
    Case("pad_edge", 'pad(x, (0, 1, 2, 0, 3, 1), mode="edge")',
         lambda x: np.pad(x, ((0, 0), (1, 3), (2, 1)), mode="edge"),
         lambda t, x: t.nn.functional.pad(x, (2, 1, 1, 3), mode="replicate")),
    Case("pad_wrap", 'pad(x, (0, 2, 5, 0, 1, 1), mode="wrap")',
         lambda x: np.pad(x, ((0, 0), (2, 1), (5, 1)), mode="wrap")),
    Case("pad_crop", "pad(x, (0, -1, 1, 0, 0, -2))", lambda x: np.pad(x, ((0, 0), (0, 0), (1, 0)))[:, 1:, :-2],
         lambda t, x: t.nn.functional.pad(x, (1, -2, -1, 0))),
    Case("squeeze", "squeeze(x, axis=0)", lambda x: np.squeeze(x, 0),
         lambda t, x: t.squeeze(x, 0), shape=(1, 3, 1)),
    Case("squeeze_all", "squeeze(x)", np.squeeze, lambda t, x: t.squeeze(x), shape=(1, 3, 1)),
    Case("squeeze_neg", "squeeze(x, (-1, 0))", lambda x: np.squeeze(x, (0, 2)),
         lambda t, x: x.squeeze(-1).squeeze(0), shape=(1, 3, 1)),
    Case("unsqueeze", "unsqueeze(x, -1)", lambda x: x[..., None], lambda t, x: t.unsqueeze(x, -1)),
    Case("unsqueeze_2", "unsqueeze(x, (0, 2))", lambda x: np.expand_dims(x, (0, 2))),
    Case("flatten", "flatten(x)", lambda x: x.reshape(-1), lambda t, x: t.flatten(x)),
    Case("flatten_1", "flatten(x, 1)", lambda x: x.reshape(2, -1), lambda t, x: t.flatten(x, 1)),
    Case("flatten_mid", "flatten(x, start=-3, end=-2)", lambda x: x.reshape(6, 4),
         lambda t, x: t.flatten(x, -3, -2)),
    Case("expand", "expand(x, (3, 1, 1, 4))", lambda x: np.broadcast_to(x, (3, 2, 3, 4)),
         lambda t, x: x.expand(3, 2, 3, 4)),
    Case("expand_both", "expand(x, (2, 1, 5))", lambda x: np.broadcast_to(x, (2, 2, 5)),
         lambda t, x: x.expand(2, 2, 5), shape=(2, 1)),
    Case("tile", "tile(x, (2, 1, 3))", lambda x: np.tile(x, (2, 1, 3)), lambda t, x: t.tile(x, (2, 1, 3))),
    Case("tile_long", "tile(x, (2, 1, 1, 2))", lambda x: np.tile(x, (2, 1, 1, 2)),
         lambda t, x: t.tile(x, (2, 1, 1, 2))),
    Case("tile_short", "tile(x, 2)", lambda x: np.tile(x, 2), lambda t, x: t.tile(x, (2,))),
    Case("flip", "flip(x, (0, -1))", lambda x: np.flip(x, (0, 2)), lambda t, x: t.flip(x, (0, -1))),
    Case("flip_all", "flip(x)", np.flip, lambda t, x: t.flip(x, (0, 1, 2))),
    Case("roll", "roll(x, (1, -5), (-1, 1))", lambda x: np.roll(x, (1, -5), (2, 1)),
         lambda t, x: t.roll(x, (1, -5), (-1, 1))),
    Case("roll_flat", "roll(x, 7)", lambda x: np.roll(x, 7), lambda t, x: t.roll(x, 7)),
    Case("tril", "tril(x)", np.tril, lambda t, x: t.tril(x)),
    Case("triu", "triu(x, -1)", lambda x: np.triu(x, -1), lambda t, x: t.triu(x, -1)),
    Case("tril_k", "tril(x, k=2)", lambda x: np.tril(x, 2), lambda t, x: t.tril(x, 2)),
    Case("gather", "gather(x, array(((0, -1), (2, 1))), 1)", lambda x: np.take(x, IDX % 3, 1),
         lambda t, x: x[:, t.tensor(IDX % 3)]),
    Case("gather_emb", "gather(x, array((1, 1, 0)))", lambda x: x[[1, 1, 0]],
         lambda t, x: t.nn.functional.embedding(t.tensor([1, 1, 0]), x), shape=(3, 4)),
    Case("gather_scalar_index", "gather(x, 2, axis=-1)", lambda x: x[..., 2], lambda t, x: x[..., 2]),
    Case("gather_elements", "gather_elements(x, array(((0, 2, 1), (1, 1, 0))), axis=-1)",
         lambda x: np.take_along_axis(x, np.array([[0, 2, 1], [1, 1, 0]]), -1),
         lambda t, x: t.gather(x, -1, t.tensor([[0, 2, 1], [1, 1, 0]])), shape=(2, 3)),
    Case("gather_elements_0", "gather_elements(x, array(((1, 0, 1),)))",
         lambda x: np.take_along_axis(x, np.array([[1, 0, 1]]), 0),
         lambda t, x: t.gather(x, 0, t.tensor([[1, 0, 1]])), shape=(2, 3)),
    Case("gather_nd", "gather_nd(x, array(((0, 1), (1, -1))))", lambda x: x[[0, 1], [1, -1]],
         lambda t, x: x[[0, 1], [1, -1]]),
    Case("scatter_add", "scatter_add(x, array(((0, 0, 2), (1, 2, 2))), x * x, 1)",
         lambda x: _np_scatter_add(x, np.array([[0, 0, 2], [1, 2, 2]]), x * x, 1),
         lambda t, x: x.scatter_add(1, t.tensor([[0, 0, 2], [1, 2, 2]]), x * x), shape=(2, 3)),
    Case("scatter_nd", "scatter_nd(x, array(((1, 0), (0, 2))), array((5.0, 6.0)) * gather_nd(x, array(((0, 0), (1, 1)))))",
         lambda x: _np_scatter_nd(x), shape=(2, 3)),
    Case("topk", "tuple_getitem(topk(x, 2), 0)", lambda x: -np.sort(-x, -1)[..., :2],
         lambda t, x: t.topk(x, 2)[0]),
    Case("topk_small", "tuple_getitem(topk(x, 1, 0, false), 0)", lambda x: np.sort(x, 0)[:1],
         lambda t, x: t.topk(x, 1, 0, largest=False)[0]),
]


def _np_scatter_add(x: Any, index: Any, updates: Any, axis: int) -> Any:
    out = x.copy()
    rows = np.arange(index.shape[0])[:, None]
    np.add.at(out, (rows, index), updates)
    return out


def _np_scatter_nd(x: Any) -> Any:
    out = x.copy()
    values = np.array([5.0, 6.0]) * np.array([x[0, 0], x[1, 1]])
    out[1, 0], out[0, 2] = values
    return out


def draw(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> Any:
    return np.random.default_rng(seed).normal(size=shape).astype(dtype)


# -- values --------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_values_against_numpy(case: Case, dtype: str) -> None:
    x = draw(case.shape, DTYPES[dtype])
    got = anfir.run(fn(case.call), x)
    want = np.asarray(case.ref(x))
    assert np.asarray(got).dtype == DTYPES[dtype], (np.asarray(got).dtype, dtype)
    assert np.shape(got) == want.shape
    np.testing.assert_allclose(np.asarray(got), want.astype(DTYPES[dtype]), **TOL[dtype])


@needs_torch
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", [c for c in CASES if c.torch is not None], ids=lambda c: c.id)
def test_values_against_torch(case: Case, dtype: str) -> None:
    x = draw(case.shape, DTYPES[dtype])
    assert case.torch is not None
    want = case.torch(torch, torch.from_numpy(x)).numpy()
    got = np.asarray(anfir.run(fn(case.call), x))
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6 if dtype == "f32" else 1e-12, atol=1e-7)


def test_integer_results_and_constructors_against_numpy_and_torch() -> None:
    m = program("""
def f(x, i) = (tuple_getitem(topk(x, 2, axis=0), 1), one_hot(i, 4), one_hot(i, 3, "i64"),
               arange(1, 7, 2), arange(0.5, 2.0, step=0.5, dtype="f32"), full((2, 3), 1.5),
               full(2, 7, "f32"), eye(3), eye(2, 3, -1, "f32"), rank(x), size(x), rank(2.0),
               gather(i, array((1, 0))))
""")["f"]
    x = np.array([[1.0, 5.0], [3.0, 5.0], [2.0, 0.0]])
    i = np.array([[0, 3], [2, 9]])
    got = anfir.run(m, x, i)
    want = (np.array([[1, 0], [2, 1]]), np.eye(4, dtype=np.float32)[[[0, 3], [2, 0]]] * (i < 4)[..., None],
            (i[..., None] == np.arange(3)).astype(np.int64), np.arange(1, 7, 2),
            np.arange(0.5, 2.0, 0.5, dtype=np.float32), np.full((2, 3), 1.5), np.full(2, 7, np.float32),
            np.eye(3), np.eye(2, 3, -1, dtype=np.float32), 2, 6, 0, np.take(i, [1, 0], 0))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.asarray(g).dtype == np.asarray(w).dtype, (g, w)
        np.testing.assert_array_equal(g, w)
    if torch is not None:
        np.testing.assert_array_equal(got[0], torch.topk(torch.from_numpy(x), 2, 0).indices.numpy())
        np.testing.assert_array_equal(got[1][0], torch.nn.functional.one_hot(torch.tensor([0, 3]), 4).numpy())
        np.testing.assert_array_equal(got[7], torch.eye(3, dtype=torch.float64).numpy())
        np.testing.assert_array_equal(got[3], torch.arange(1, 7, 2).numpy())


def test_zero_d_and_empty_tensors() -> None:
    m = program("""
def f(s, e) = (unsqueeze(s, 0), flatten(s), squeeze(unsqueeze(s, 0)), expand(s, (2, 3)),
               tile(s, (2,)), flip(s), rank(s), concat((e, e), 0), stack((e, e), 1),
               slice(e, 1, 5, 1), pad(e, (1, 1, 0, 0)), flip(e, 1), roll(e, 2, 1),
               gather(e, array((0, 0)), 1), tril(e), tuple_getitem(split(e, (0, 2), 1), 0),
               gather(array((1.0, 2.0)), zeros((0,), "i64")), tuple_getitem(topk(e, 0), 0))
""")["f"]
    s = np.float32(1.5)
    e = np.zeros((0, 2), np.float32)
    got = anfir.run(m, s, e)
    want = (np.array([1.5]), np.array([1.5]), 1.5, np.full((2, 3), 1.5), np.array([1.5, 1.5]), 1.5, 0,
            np.zeros((0, 2)), np.zeros((0, 2, 2)), np.zeros((0, 1)), np.zeros((1, 3)), e, e,
            np.zeros((0, 2)), e, np.zeros((0, 0)), np.zeros(0), np.zeros((0, 0)))
    for k, (g, w) in enumerate(zip(got, want)):
        assert np.shape(g) == np.shape(w), (k, np.shape(g), np.shape(w))
        np.testing.assert_array_equal(np.asarray(g, np.float64), np.asarray(w, np.float64))
        if k not in (6, 16):  # rank is an int; the literal array is f64
            assert np.asarray(g).dtype == np.float32, k
    assert np.asarray(got[10]).tolist() == [[0.0, 0.0, 0.0]]


# -- gradients -----------------------------------------------------------------------------------
GRAD_CASES = [c for c in CASES if c.grad]
WEIGHTS = functools.lru_cache(maxsize=None)(lambda shape: np.random.default_rng(3).normal(size=shape))


def _loss_text(call: str) -> str:
    # A weighted sum of sin(result), so the gradient differs per element and is not linear.
    return f"def f(x, w) = sum(sin({call}) * w)"


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.id)
def test_gradients_against_finite_differences_and_torch(case: Case) -> None:
    x = draw(case.shape, np.float64, 1)
    w = WEIGHTS(np.shape(case.ref(x)))
    graph = program(_loss_text(case.call))["f"]
    got = anfir.run(anfir.grad(graph), x, w)
    assert_close(got, numeric_grad(graph, [x, w], 0), rtol=1e-6, atol=1e-7, msg=case.id)
    if torch is not None and case.torch is not None:
        t = torch.from_numpy(x).requires_grad_(True)
        loss = (torch.sin(case.torch(torch, t)) * torch.from_numpy(w)).sum()
        (want,) = torch.autograd.grad(loss, t)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-10, atol=1e-12, err_msg=case.id)


@pytest.mark.parametrize("case", GRAD_CASES, ids=lambda c: c.id)
def test_second_order_gradients(case: Case) -> None:
    # The gradient graphs are differentiable: d/dx of <grad f(x), v> against finite
    # differences of the first gradient (all these operators are smooth where sampled).
    x = draw(case.shape, np.float64, 2)
    w = WEIGHTS(np.shape(case.ref(x)))
    v = np.random.default_rng(5).normal(size=case.shape)
    mod = program(_loss_text(case.call) + """
def g(x, w, v) = sum(grad(f)(x, w) * v)
""")
    got = anfir.run(anfir.grad(mod["g"]), x, w, v)
    assert_close(got, numeric_grad(mod["g"], [x, w, v], 0), rtol=1e-5, atol=1e-6, msg=case.id)
    if torch is not None and case.torch is not None:
        t = torch.from_numpy(x).requires_grad_(True)
        loss = (torch.sin(case.torch(torch, t)) * torch.from_numpy(w)).sum()
        (g1,) = torch.autograd.grad(loss, t, create_graph=True)
        (g2,) = torch.autograd.grad((g1 * torch.from_numpy(v)).sum(), t)
        np.testing.assert_allclose(got, g2.numpy(), rtol=1e-9, atol=1e-11, err_msg=case.id)


def test_gradients_to_updates_tuples_and_f32() -> None:
    mod = program("""
def f(x, u) = sum(sin(scatter_add(x, array(((1, 0), (2, 2))), u, axis=1)) * x)
  + sum(sin(scatter_nd(x, array(((0, 1),)), array((1.0,)) * sum(u))))
def g(a, b) = sum(sin(concat((a, b), 1)) * concat((b, a), 1)) + sum(tuple_getitem(split(a, 2, 1), 1) * b[0:2])
def h(a) = sum(sin(stack(split(a, 2, 1), 0)))
""".replace("b[0:2]", "slice(b, (0, 0), (1, 2))"))
    rng = np.random.default_rng(11)
    x, u = rng.normal(size=(2, 3)), rng.normal(size=(2, 2))
    got = anfir.run(anfir.grad(mod["f"], (0, 1)), x, u)
    want = numeric_grad(mod["f"], [x, u], (0, 1))
    assert_close(got, want, rtol=1e-6, atol=1e-7)
    a, b = rng.normal(size=(2, 4)), rng.normal(size=(2, 4))
    assert_close(anfir.run(anfir.grad(mod["g"], (0, 1)), a, b), numeric_grad(mod["g"], [a, b], (0, 1)),
                 rtol=1e-6, atol=1e-7)
    assert_close(anfir.run(anfir.grad(mod["h"]), a), numeric_grad(mod["h"], [a], 0), rtol=1e-6, atol=1e-7)
    # f32 stays f32 through the gradient graphs.
    g32 = anfir.run(anfir.grad(mod["g"], 0), a.astype(np.float32), b.astype(np.float32))
    assert g32.dtype == np.float32
    # The compiled gradient agrees with the interpreted one.
    compiled = anfir.compile(anfir.grad(mod["g"], (0, 1)), args=[a, b])
    assert_close(anfir.run(compiled, a, b), anfir.run(anfir.grad(mod["g"], (0, 1)), a, b), rtol=1e-12, atol=1e-14)


# -- shape rules ---------------------------------------------------------------------------------
_SYMBOLS = [dim_symbol(n) for n in ("B", "N", "K")]


def infer(call: str, *abstracts: Any) -> Any:
    return infer_new_graph(fn(call), abstracts)


def concrete(abstract: Any, sizes: dict[Any, int]) -> Any:
    if isinstance(abstract, ATuple):
        return tuple(concrete(a, sizes) for a in abstract.items)
    if isinstance(abstract, AScalar):
        return (), abstract.dtype
    assert isinstance(abstract, ATensor) and abstract.shape is not None, abstract
    # An unknown dimension (_N: the rule could not tell) matches any size.
    return tuple(None if is_unknown_dim(d) else int(sympy.sympify(d).subs(sizes))
                 for d in abstract.shape), abstract.dtype


def agrees(inferred: Any, got: Any) -> bool:
    if isinstance(inferred, tuple) and inferred and isinstance(inferred[0], tuple) and \
            len(inferred) == len(got) and isinstance(got[0], tuple) and len(inferred[0]) == 2 \
            and isinstance(inferred[0][1], str):
        return all(agrees(a, b) for a, b in zip(inferred, got))
    (shape, dtype), (want_shape, want_dtype) = inferred, got
    return dtype == want_dtype and len(shape) == len(want_shape) and all(
        d is None or d == w for d, w in zip(shape, want_shape))


def evaluated(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(evaluated(v) for v in value)
    return np.shape(value), dtype_of_array(np.asarray(value))


def _shape_calls(rank: int, data: Any) -> list[str]:
    ax = data.draw(st.integers(-rank, rank - 1), label="axis") if rank else 0
    calls = ["flatten(x)", "unsqueeze(x, 0)", "flip(x)", "roll(x, 3)", f"expand(x, {(2,) + (1,) * rank})",
             "squeeze(x)", "rank(x)", f"tile(x, {(2,) * max(rank, 1)})"]
    if rank:
        calls += [f"concat((x, x, x), {ax})", f"stack((x, x), {ax})", f"flip(x, {ax})",
                  f"roll(x, -2, {ax})", f"gather(x, array((0, 0, 0)), {ax})",
                  f"slice(x, 1, 99, {ax})", f"slice(x, -2, 99, {ax})", f"slice(x, 0, -1, {ax})",
                  f"slice(x, -1, -99, {ax}, -1)", f"flatten(x, {ax})", f"unsqueeze(x, {ax})",
                  f"pad(x, {(1,) * rank + (2,) * rank})", f"tuple_getitem(split(x, 1, {ax}), 0)",
                  f"scatter_add(x, zeros({(1,) * rank}, \"i64\"), ones({(1,) * rank}), {ax})",
                  f"tuple_getitem(topk(x, 0, {ax}), 1)"]
    if rank >= 2:
        calls += ["tril(x, 1)", "triu(x, -1)", "gather_nd(x, array(((0, 0),)))",
                  "gather_elements(x, zeros(shape(x), \"i64\"), 1)"]
    return calls


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), shape=st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple),
       mask=st.lists(st.booleans(), min_size=3, max_size=3))
def test_shape_rules_agree_with_evaluation(data: Any, shape: Any, mask: Any) -> None:
    call = data.draw(st.sampled_from(_shape_calls(len(shape), data)), label="call")
    dtype = data.draw(st.sampled_from(["f32", "f64"]), label="dtype")
    dims, sizes = [], {}
    for i, (d, symbolic) in enumerate(zip(shape, mask)):
        # A symbolic dimension stands for sizes >= 2 (a slice of it assumes the indices reach).
        if symbolic and d > 1:
            dims.append(_SYMBOLS[i])
            sizes[_SYMBOLS[i]] = d
        else:
            dims.append(d)
    x = np.full(shape, 0.5, DTYPES[dtype])[()] if shape else DTYPES[dtype](0.5)
    out = anfir.run(fn(call), x)
    abstract = ATensor(dtype, tuple(dims)) if shape else AScalar(dtype)
    inferred = concrete(infer(call, abstract), sizes)
    assert agrees(inferred, evaluated(out)), (call, inferred, evaluated(out))


def test_shape_rules_on_symbolic_dimensions() -> None:
    B, N = _SYMBOLS[:2]
    x = ATensor("f32", (B, N, 3))
    assert infer("concat((x, x), 1)", x) == ATensor("f32", (B, 2 * N, 3))
    assert infer("stack((x, x), -1)", x) == ATensor("f32", (B, N, 3, 2))
    assert infer("flatten(x, 1)", x) == ATensor("f32", (B, 3 * N))
    assert infer("slice(x, 1, 9223372036854775807, 1)", x) == ATensor("f32", (B, N - 1, 3))
    assert infer("slice(x, -2, 9223372036854775807, 0)", x) == ATensor("f32", (2, N, 3))
    assert infer("pad(x, (0, 1, 0, 0, 2, 0))", x) == ATensor("f32", (B, N + 3, 3))
    assert infer("tile(x, (2, 1, 1))", x) == ATensor("f32", (2 * B, N, 3))
    assert infer("gather(x, array(((0, 1),)), 1)", x) == ATensor("f32", (B, 1, 2, 3))
    assert infer("expand(x, (4, 1, 1, 1))", x) == ATensor("f32", (4, B, N, 3))
    assert infer("split(x, 3, -1)", x) == ATuple((ATensor("f32", (B, N, 1)),) * 3)
    assert infer("topk(x, 2, 1)", x) == ATuple((ATensor("f32", (B, 2, 3)), ATensor("i64", (B, 2, 3))))
    assert infer("rank(x)", x) == AScalar("i64", 3)
    assert infer("one_hot(cast(x, \"i64\"), 5)", x) == ATensor("f32", (B, N, 3, 5))
    y = ATensor("f64", (2 * B, 4))
    assert infer("split(x, 2)", y) == ATuple((ATensor("f64", (B, 4)),) * 2)


# -- attributes through text, dumps and phases ------------------------------------------------------
ATTRS = """
def f(x, i) =
  let c = concat((x, x * 2.0), axis=-1) in
  let s = slice(c, starts=(1, -1), ends=(99, 0), axes=(0, 1), steps=(1, -2)) in
  let p = pad(s, (1, 0, 0, 2), mode="reflect") in
  let g = gather(p, i, axis=1) in
  let t = tuple_getitem(topk(tile(g, reps=(1, 2)), 3, axis=-1, largest=false), 0) in
  let r = roll(flip(t, axis=0), shift=1, axis=1) in
  sum(sin(r)) + sum(tuple_getitem(split(x, sizes=(1, 2), axis=1), 1)) + sum(tril(x, k=-1))
  + sum(flatten(unsqueeze(squeeze(expand(x, (1, 3, 3)), axis=0), axis=-1), start=1, end=2))

def df(x, i) = grad(f)(x, i)
"""


def test_attributes_round_trip_through_text_and_dumps() -> None:
    mod = anfir.parse(ATTRS, "shape_attrs.anf")
    text = anfir.to_text(mod)
    for expected in ["axis=-1", "starts=(1, -1), ends=(99, 0), axes=(0, 1), steps=(1, -2)",
                     'mode="reflect"', "largest=false", "shift=1", "sizes=(1, 2)", "k=-1", "start=1, end=2"]:
        assert expected in text, (expected, text)
    assert_isomorphic(mod, anfir.parse(text, "again.anf"))
    dump = anfir.dump_ir(mod)
    assert "primitive_attrs: {starts: (1, -1), ends: (99, 0), axes: (0, 1), steps: (1, -2)}" in dump
    loaded = load_ir_text(dump, "shape_attrs.ir")
    assert_isomorphic(mod, loaded)
    assert anfir.dump_ir(loaded) == dump
    x = np.random.default_rng(2).normal(size=(3, 3))
    i = np.array([0, 2, 1, 0])
    want = anfir.run(mod["df"], x, i)
    assert_close(want, numeric_grad(mod["f"], [x, i], 0), rtol=1e-6, atol=1e-7)
    assert_close(anfir.run(loaded["df"], x, i), want, rtol=1e-13, atol=1e-14)


def test_attributes_survive_every_phase(tmp_path: Any) -> None:
    mod = anfir.parse(ATTRS, "shape_attrs.anf")
    x = np.random.default_rng(3).normal(size=(3, 3))
    i = np.array([1, 2])
    result = anfir.compile(mod, entry="df", args=[x, i], dump_dir=tmp_path)
    want = anfir.run(mod["df"], x, i)
    assert_close(anfir.run(result, x, i), want, rtol=1e-12, atol=1e-13)
    dumps = sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".ir"))
    assert len(dumps) >= 7
    for name in dumps:
        text = (tmp_path / name).read_text()
        loaded = anfir.load(str(tmp_path / name))
        assert anfir.dump_ir(loaded, phase=name[:-3]) == text, name
        if "parse" not in name and "resolve" not in name:
            assert_close(anfir.run(loaded, x, i), want, rtol=1e-12, atol=1e-13)


# -- errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("call, message", [
    ("concat((x, transpose(x)), 0)", "concat"), ("concat(x, 0)", "tuple"), ("stack((x, x), 3)", "out of range"),
    ("split(x, (1, 1), 1)", "add up"), ("split(x)", "sizes"), ("slice(x, (0,), (1, 2))", "length"),
    ("slice(x, 0, 1, 0, 0)", "step"), ('pad(x, (1, 1), "constant")', "pads"),
    ('pad(x, (1, 0, 0, 0), "mirror")', "mode"), ('pad(x, (5, 0, 0, 0), "reflect")', "reflect"),
    ("squeeze(x, 1)", "not 1"), ("unsqueeze(x)", "axis"), ("unsqueeze(x, 3)", "out of range"),
    ("flatten(x, 1, 0)", "start"), ("expand(x, (4, 4))", "broadcast"), ("tile(x, (-1, 1))", "negative"),
    ("tile(x, 1.5)", "reps"), ("flip(x, (0, 0))", "repeated"), ("roll(x, (1, 2), 0)", "shifts"),
    ("tril(array((1.0, 2.0)))", "rank"), ("gather(x, array((5,)), 0)", "out of range"),
    ("gather(x, array((0.5,)), 0)", "integers"), ("gather_elements(x, array((0,)), 0)", "rank"),
    ("gather_nd(x, array(((0, 0, 0),)))", "rank|last axis"), ("topk(x, 9)", "k=9"),
    ("one_hot(x, 3)", "integers"), ("eye(2, k=true)", "k"), ("arange(0, 5, 0)", "step"),
    ("full((2, -1), 1.0)", "shape"), ("scatter_add(x, array(((0, 0),)), array((1.0,)), 1)", "updates|rank"),
])
def test_bad_attributes_and_shapes_are_located(call: str, message: str) -> None:
    mod = anfir.parse(f"def f(x) =\n  {call}", "bad.anf")
    x = np.ones((2, 3))
    actions = [lambda: anfir.run(mod["f"], x)]
    if "array((5,))" not in call:  # an index's value is known only at run time
        actions.append(lambda: anfir.compile(mod, entry="f", args=[x]))
    for action in actions:
        with pytest.raises(anfir.AnfirError, match=message) as info:
            action()
        assert info.value.loc is not None and info.value.loc.line == 2, info.value


def test_huge_constructors_are_refused_before_allocating() -> None:
    for call in ["full((100000, 100000), 1.0)", "eye(100000)", "arange(0, 1e12)",
                 "one_hot(array((1, 2)), 1000000000)"]:
        with pytest.raises(anfir.AnfirError, match="more than"):
            anfir.run(program(f"def f() = {call}")["f"])


# -- back ends ------------------------------------------------------------------------------------------
BACKEND = """
def ops(x: f64[2, 3, 4]) =
  (concat((x, x), 1), stack((x, x), -1), slice(x, (1, -1), (99, -99), (1, 2), (1, -2)),
   pad(x, (0, 1, 2, 0, 2, 1), value=1.5), pad(x, (0, 1, 2, 0, 1, 3), "reflect"),
   pad(x, (1, 0, 2, 0, 3, 1), "edge"), pad(x, (0, 2, 5, 0, 1, 1), "wrap"), pad(x, (0, -1, 1, 0, 0, -2)),
   squeeze(unsqueeze(x, 0), 0), unsqueeze(x, (0, -1)), flatten(x, 1), flatten(x, 0, 1), expand(x, (3, 1, 1, 4)),
   tile(x, (2, 1, 1, 2)), flip(x, (0, -1)), roll(x, (1, -5), (-1, 1)), roll(x, 7), tril(x), triu(x, -1),
   gather(x, array(((0, -1), (2, 1))), 1), gather_elements(x, zeros((2, 2, 4), "i64") + 2, 1),
   gather_nd(x, array(((0, 1), (1, -1)))), scatter_add(x, zeros((2, 1, 4), "i64") + 1, slice(x, 0, 1, 1) * 0.0 + 1.0, 1),
   scatter_nd(x, array(((1, 0), (0, 2))), ones((2, 4))), one_hot(array((0, 2)), 3), full((2,), 2.0),
   tuple_getitem(split(x, (1, 3), -1), 1), tuple_getitem(topk(x, 2), 0), tuple_getitem(topk(x, 2, 0, false), 1))
def loss(x: f64[2, 3, 4]) =
  sum(sin(concat((x, x * x), 1))) + sum(sin(stack((x, x), -1)) * 2.0) + sum(sin(slice(x, (1, -1), (99, -99), (1, 2), (1, -2))))
  + sum(sin(pad(x, (0, 1, 2, 0, 1, 3), "reflect"))) + sum(sin(pad(x, (1, 0, 2, 0, 3, 1), "edge")))
  + sum(sin(pad(x, (0, 2, 5, 0, 1, 1), "wrap"))) + sum(sin(pad(x, (0, -1, 1, 0, 0, -2), value=2.0)))
  + sum(sin(flatten(unsqueeze(squeeze(unsqueeze(x, 0), 0), -1), 1)) * 0.5) + sum(sin(expand(x, (3, 1, 1, 4))))
  + sum(sin(tile(x, (2, 1, 1, 2)))) + sum(sin(flip(x, (0, -1))) * x) + sum(sin(roll(x, (1, -5), (-1, 1))) * x)
  + sum(sin(roll(x, 7)) * x) + sum(sin(tril(x)) * triu(x, -1)) + sum(sin(gather(x, array(((0, -1), (2, 1))), 1)))
  + sum(sin(gather_nd(x, array(((0, 1), (1, -1))))))
  + sum(sin(gather_elements(x, zeros((2, 2, 4), "i64") + 2, 1))) + sum(sin(scatter_add(x, zeros((2, 1, 4), "i64") + 1, slice(x * x, 0, 1, 1), 1)))
  + sum(sin(tuple_getitem(split(x, (1, 3), -1), 1))) + sum(sin(tuple_getitem(topk(x, 2), 0)))
"""



def test_jax_computes_what_run_computes() -> None:
    jax = pytest.importorskip("jax", reason="the JAX back end needs jax (the jax extra)")
    mod = anfir.parse(BACKEND, "backend.anf")
    x = np.random.default_rng(4).normal(size=(2, 3, 4))
    with jax.enable_x64(True):
        got = jax.jit(anfir.to_jax(mod["ops"]))(x)
        want = anfir.run(mod["ops"], x)
        for k, (g, w) in enumerate(zip(got, want)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-12, atol=1e-13, err_msg=str(k))
        gradient = anfir.grad(mod["loss"])
        want_grad = anfir.run(gradient, x)
        assert_close(want_grad, numeric_grad(mod["loss"], [x], 0), rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(np.asarray(jax.jit(anfir.to_jax(gradient))(x)), want_grad, rtol=1e-11)
        np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(anfir.to_jax(mod["loss"])))(x)), want_grad,
                                   rtol=1e-11)


def test_onnx_export_computes_what_run_computes() -> None:
    pytest.importorskip("onnx", reason="the ONNX exporter needs onnx (the onnx extra)")
    ort = pytest.importorskip("onnxruntime", reason="running the exported model needs onnxruntime")
    from anfir.interop.onnx.exporter import nest_outputs, onnx_inputs
    source = BACKEND + "def dloss(x: f64[2, 3, 4]) = grad(loss)(x)\n"
    mod = anfir.parse(source, "onnx_shape.anf")
    x = np.random.default_rng(6).normal(size=(2, 3, 4))
    for entry in ("ops", "dloss"):
        model = anfir.export_onnx(mod, entry=entry)
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        got = nest_outputs(model, session.run(None, onnx_inputs(model, x)))
        want = anfir.run(mod[entry], x)
        assert_close(got, want, rtol=1e-12, atol=1e-12, msg=entry)


def test_tuple_returning_operators_export_one_output_per_item() -> None:
    pytest.importorskip("onnx", reason="the ONNX exporter needs onnx (the onnx extra)")
    ort = pytest.importorskip("onnxruntime", reason="running the exported model needs onnxruntime")
    from anfir.interop.onnx.exporter import nest_outputs, onnx_inputs
    mod = anfir.parse("""
def f(x: f64[B, 6]) = (split(x, 3, 1), split(x, (1, 5), -1), topk(x, 2), topk(x, 1, 0, false))
def loss(x: f64[B, 6]) = sum(sin(concat((x, x * x), 1))) + sum(sin(stack((x, x * 2.0), 0)))
  + sum(sin(tuple_getitem(split(x, (4, 2), 1), 0)))
def dloss(x: f64[B, 6]) = grad(loss)(x)
""", "tuples.anf")
    x = np.random.default_rng(8).normal(size=(3, 6))
    for entry in ("f", "dloss"):
        model = anfir.export_onnx(mod, entry=entry)
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        got = nest_outputs(model, session.run(None, onnx_inputs(model, x)))
        assert_close(got, anfir.run(mod[entry], x), rtol=1e-12, atol=1e-12, msg=entry)


def test_end_is_a_keyword_argument_name_only_in_a_call() -> None:
    # flatten's attribute is called `end`, a keyword of the language: it is a name right
    # after '(' or ',' and before '=', and nowhere else.
    x = np.ones((2, 3, 4))
    assert anfir.run(program("def f(x) = flatten(x, start=0, end=1)")["f"], x).shape == (6, 4)
    with pytest.raises(anfir.AnfirError, match="found 'end'") as info:
        anfir.parse("def f(x) =\n  let end = 1 in x", "kw.anf")
    assert info.value.loc is not None and info.value.loc.line == 2

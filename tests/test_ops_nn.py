"""The neural-network operators (``anfir/primitives/nn.py``) against PyTorch,
finite differences, their shape rules, ONNX Runtime and JAX.

Each case of :data:`CASES` is one call in ANF over named arguments with a
``torch.nn.functional`` reference.  For each:

* values against PyTorch on f32 and f64, the f32 dtype kept;
* gradients (of ``sum(call * w)``, ``w`` a fixed random weight) against
  ``torch.autograd`` and against central finite differences, by
  ``anfir.grad`` and through ``anfir.compile``;
* second-order gradients (the gradient of a weighted sum of the gradient)
  against finite differences of the first gradient, for the smooth ones;
* the shape rule against the evaluated shape, with symbolic dimensions;
* the ONNX export (onnxruntime) and the JAX back end compute what
  ``anfir.run`` computes, gradients included.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import anfir
from anfir.abstract.shapes import dim_symbol
from anfir.abstract.values import AScalar, ATensor
from anfir.errors import AnfirError, AnfirTypeError, ShapeError
from anfir.passes.specialize import infer_new_graph
from gradcheck import assert_close, check_grad

torch = pytest.importorskip("torch", reason="the references are torch.nn.functional "
                            "(pip install torch==2.13.0, or the dev extra)")
F = torch.nn.functional

DTYPES = {"f32": np.float32, "f64": np.float64}
TORCH_TOL = {"f32": dict(rtol=2e-5, atol=2e-6), "f64": dict(rtol=1e-10, atol=1e-12)}


@dataclass(frozen=True)
class Case:
    """One operator call checked against PyTorch."""

    id: str
    call: str
    """ANF over the argument names (``softmax(x, axis=1)``)."""
    args: tuple[tuple[str, Any], ...]
    """(name, shape) for float arguments, (name, array) for fixed (integer, bool) ones."""
    torch: Callable[..., Any]
    """The reference on torch tensors, in the order of ``args``."""
    wrt: tuple[int, ...] = (0,)
    """The arguments differentiated."""
    second: bool = True
    """Smooth: second-order gradients are checked."""
    low: float = -2.0
    high: float = 2.0
    extra: dict[str, Any] = field(default_factory=dict)


def _i(*values: Any) -> np.ndarray:
    return np.array(values, dtype=np.int64)


_MASK = np.array([[True, False, True, True, False], [True, True, False, False, True],
                  [True, False, False, True, True]])
_SDPA = F.scaled_dot_product_attention

CASES = [
    Case("softmax", "softmax(x)", (("x", (2, 3, 4)),), lambda x: F.softmax(x, -1)),
    Case("softmax_axis1", "softmax(x, axis=1)", (("x", (2, 3, 4)),), lambda x: F.softmax(x, 1)),
    Case("softmax_positional_neg", "softmax(x, -3)", (("x", (2, 3, 4)),),
         lambda x: F.softmax(x, -3)),
    Case("log_softmax", "log_softmax(x, axis=-2)", (("x", (2, 3, 4)),),
         lambda x: F.log_softmax(x, -2)),
    Case("layer_norm", "layer_norm(x)", (("x", (2, 3, 4)),), lambda x: F.layer_norm(x, (4,))),
    Case("layer_norm_affine", "layer_norm(x, s, b, axis=-2)",
         (("x", (2, 3, 4)), ("s", (3, 4)), ("b", (3, 4))),
         lambda x, s, b: F.layer_norm(x, (3, 4), s, b), wrt=(0, 1, 2)),
    Case("layer_norm_eps", "layer_norm(x, s, axis=1, eps=0.001)", (("x", (2, 3, 4)), ("s", (4,))),
         lambda x, s: F.layer_norm(x, (3, 4), s.expand(3, 4), eps=1e-3), wrt=(0, 1)),
    Case("rms_norm", "rms_norm(x, s)", (("x", (2, 3, 4)), ("s", (4,))),
         lambda x, s: F.rms_norm(x, (4,), s, eps=1e-6), wrt=(0, 1)),
    Case("rms_norm_axis", "rms_norm(x, axis=-2, eps=0.01)", (("x", (2, 3, 4)),),
         lambda x: F.rms_norm(x, (3, 4), eps=0.01)),
    Case("group_norm", "group_norm(x, 2, s, b)",
         (("x", (2, 4, 3, 2)), ("s", (4,)), ("b", (4,))),
         lambda x, s, b: F.group_norm(x, 2, s, b), wrt=(0, 1, 2)),
    Case("group_norm_1d", "group_norm(x, 3, s, b, eps=0.001)",
         (("x", (2, 6, 5)), ("s", (6,)), ("b", (6,))),
         lambda x, s, b: F.group_norm(x, 3, s, b, eps=1e-3), wrt=(0, 1, 2)),
    Case("instance_norm", "instance_norm(x, s, b)",
         (("x", (2, 3, 4, 2)), ("s", (3,)), ("b", (3,))),
         lambda x, s, b: F.instance_norm(x, weight=s, bias=b), wrt=(0, 1, 2)),
    Case("einsum_matmul", 'einsum("ij,jk->ik", a, b)', (("a", (2, 3)), ("b", (3, 4))),
         lambda a, b: torch.einsum("ij,jk->ik", a, b), wrt=(0, 1)),
    Case("einsum_ellipsis", 'einsum("...ij,jk->...ik", a, b)', (("a", (2, 2, 3)), ("b", (3, 4))),
         lambda a, b: torch.einsum("...ij,jk->...ik", a, b), wrt=(0, 1)),
    Case("einsum_three", 'einsum("ij,jk,kl->il", a, b, c)',
         (("a", (2, 3)), ("b", (3, 4)), ("c", (4, 2))),
         lambda a, b, c: torch.einsum("ij,jk,kl->il", a, b, c), wrt=(0, 1, 2)),
    Case("einsum_summed_label", 'einsum("ij,jk->k", a, b)', (("a", (2, 3)), ("b", (3, 4))),
         lambda a, b: torch.einsum("ij,jk->k", a, b), wrt=(0, 1)),
    Case("einsum_outer_transpose", 'einsum("i,j->ji", a, b)', (("a", (3,)), ("b", (2,))),
         lambda a, b: torch.einsum("i,j->ji", a, b), wrt=(0, 1)),
    Case("einsum_reduce_all", 'einsum("bij->", a)', (("a", (2, 3, 2)),),
         lambda a: torch.einsum("bij->", a)),
    Case("attention", "attention(q, k, v)", (("q", (2, 3, 4)), ("k", (2, 5, 4)), ("v", (2, 5, 6))),
         lambda q, k, v: _SDPA(q, k, v), wrt=(0, 1, 2)),
    Case("attention_causal_heads", "attention(q, k, v, causal=true)",
         (("q", (2, 2, 4, 3)), ("k", (2, 2, 4, 3)), ("v", (2, 2, 4, 5))),
         lambda q, k, v: _SDPA(q, k, v, is_causal=True), wrt=(0, 1, 2)),
    Case("attention_float_mask", "attention(q, k, v, m, scale=0.5)",
         (("q", (2, 3, 4)), ("k", (2, 5, 4)), ("v", (2, 5, 6)), ("m", (3, 5))),
         lambda q, k, v, m: _SDPA(q, k, v, attn_mask=m, scale=0.5), wrt=(0, 1, 2, 3)),
    Case("attention_bool_mask", "attention(q, k, v, m)",
         (("q", (2, 3, 4)), ("k", (2, 5, 4)), ("v", (2, 5, 6)), ("m", _MASK)),
         lambda q, k, v, m: _SDPA(q, k, v, attn_mask=m), wrt=(0, 1, 2)),
    Case("attention_broadcast_kv", "attention(q, k, v)",
         (("q", (2, 3, 4)), ("k", (5, 4)), ("v", (5, 2))),
         lambda q, k, v: _SDPA(q, k.expand(2, 5, 4), v.expand(2, 5, 2)), wrt=(0, 1, 2)),
    Case("cross_entropy", "cross_entropy(x, t)", (("x", (4, 5)), ("t", _i(0, 4, 2, 2))),
         lambda x, t: F.cross_entropy(x, t)),
    Case("cross_entropy_sum", 'cross_entropy(x, t, reduction="sum")',
         (("x", (4, 5)), ("t", _i(1, 3, 0, 4))),
         lambda x, t: F.cross_entropy(x, t, reduction="sum")),
    Case("cross_entropy_axis1_none", 'cross_entropy(x, t, axis=1, reduction="none")',
         (("x", (2, 5, 3)), ("t", np.array([[0, 4, 2], [1, 1, 3]]))),
         lambda x, t: F.cross_entropy(x, t, reduction="none")),
    Case("nll_loss", "nll_loss(x, t)", (("x", (4, 5)), ("t", _i(0, 4, 2, 2))),
         lambda x, t: F.nll_loss(x, t)),
    Case("nll_loss_positional_none", 'nll_loss(x, t, 1, "none")',
         (("x", (2, 5, 3)), ("t", np.array([[0, 4, 2], [1, 1, 3]]))),
         lambda x, t: F.nll_loss(x, t, reduction="none")),
    Case("mse_loss", "mse_loss(a, b)", (("a", (3, 4)), ("b", (3, 4))),
         lambda a, b: F.mse_loss(a, b), wrt=(0, 1)),
    Case("mse_loss_sum", 'mse_loss(a, b, reduction="sum")', (("a", (3, 4)), ("b", (3, 4))),
         lambda a, b: F.mse_loss(a, b, reduction="sum"), wrt=(0, 1)),
    Case("mse_loss_none_broadcast", 'mse_loss(a, b, reduction="none")', (("a", (3, 4)), ("b", (4,))),
         lambda a, b: F.mse_loss(a, b.expand(3, 4), reduction="none"), wrt=(0, 1)),
]


def _args(case: Case, dtype: Any, seed: int = 0) -> list[Any]:
    rng = np.random.default_rng(seed)
    out = []
    for _, spec in case.args:
        if isinstance(spec, np.ndarray):
            out.append(spec)
        else:
            out.append(rng.uniform(case.low, case.high, size=spec).astype(dtype))
    return out


def _names(case: Case) -> list[str]:
    return [name for name, _ in case.args]


@functools.lru_cache(maxsize=None)
def _parse(text: str) -> anfir.Module:
    return anfir.parse(text, "ops_nn.anf")


def _value_fn(case: Case) -> anfir.FuncGraph:
    return _parse(f"def f({', '.join(_names(case))}) = {case.call}")["f"]


def _loss_text(case: Case) -> str:
    """``f(args..., w) = sum(call * w)``: a scalar whose gradient is the weighted vjp."""
    return f"def f({', '.join(_names(case))}, w) = sum({case.call} * w)"


def _weight(case: Case, dtype: Any) -> Any:
    out = anfir.run(_value_fn(case), *_args(case, np.float64))
    return np.random.default_rng(99).uniform(0.5, 1.5, size=np.shape(out)).astype(dtype)


def _torch_out(case: Case, args: list[Any], grad: bool) -> tuple[Any, list[Any]]:
    tensors = [torch.tensor(a, requires_grad=grad and i in case.wrt) for i, a in enumerate(args)]
    return case.torch(*tensors), tensors


# -- values and gradients against PyTorch --------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_values_against_torch(case: Case, dtype: str) -> None:
    args = _args(case, DTYPES[dtype])
    got = anfir.run(_value_fn(case), *args)
    want, _ = _torch_out(case, args, grad=False)
    assert np.asarray(got).dtype == DTYPES[dtype], (np.asarray(got).dtype, dtype)
    assert np.shape(got) == tuple(want.shape)
    np.testing.assert_allclose(got, want.numpy(), **TORCH_TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_gradients_against_torch_autograd(case: Case, dtype: str) -> None:
    args = _args(case, DTYPES[dtype])
    w = _weight(case, DTYPES[dtype])
    out, tensors = _torch_out(case, args, grad=True)
    (out * torch.tensor(w)).sum().backward()
    loss = _parse(_loss_text(case))["f"]
    grads = anfir.run(anfir.grad(loss, case.wrt), *args, w)
    for i, got in zip(case.wrt, grads):
        want = tensors[i].grad
        assert np.asarray(got).dtype == DTYPES[dtype], (case.id, i, np.asarray(got).dtype)
        np.testing.assert_allclose(got, want.numpy(), **TORCH_TOL[dtype],
                                   err_msg=f"{case.id}: gradient of argument {i}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_gradients_against_finite_differences(case: Case) -> None:
    args = [*_args(case, np.float64, seed=3), _weight(case, np.float64)]
    check_grad(_loss_text(case), args, case.wrt, ways=("api", "compiled"), rtol=1e-5,
               atol=1e-7, msg=case.id)


SECOND = [c for c in CASES if c.second]


@pytest.mark.parametrize("case", SECOND, ids=lambda c: c.id)
def test_second_order_gradients(case: Case) -> None:
    # d/dx0 of <grad_x0 loss, v>: grad of a gradient, against finite differences of it.
    names = _names(case)
    params = ", ".join(names)
    v = np.random.default_rng(7).uniform(0.5, 1.5, size=np.shape(_args(case, np.float64)[0]))
    text = (f"{_loss_text(case)}\n"
            f"def d({params}, w, u_dir) = sum(grad(f, 0)({params}, w) * u_dir)\n")
    args = [*_args(case, np.float64, seed=5), _weight(case, np.float64), v]
    check_grad(text, args, 0, entry="d", ways=("api",), rtol=2e-5, atol=1e-6, msg=case.id)


# -- shape rules ----------------------------------------------------------------------------------
B, N, L = (dim_symbol(n) for n in ("B", "N", "L"))


def _infer(call: str, names: str, *abstracts: Any) -> Any:
    return infer_new_graph(_parse(f"def f({names}) = {call}")["f"], abstracts)


def _concrete(abstract: Any, sizes: dict[Any, int]) -> tuple[int, ...]:
    if isinstance(abstract, AScalar):
        return ()
    assert isinstance(abstract, ATensor) and abstract.shape is not None, abstract
    return tuple(int(sympy.sympify(d).subs(sizes)) for d in abstract.shape)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_shape_rules_agree_with_evaluation_on_symbolic_dimensions(case: Case) -> None:
    # The first dimension of every float argument of rank >= 2 becomes the symbol B
    # (they are batch dimensions of one size, or all equal where the operator needs it).
    args = _args(case, np.float32)
    first = {np.shape(a)[0] for a in args if np.ndim(a) >= 2}
    symbolic = len(first) == 1 and not case.id.startswith(("einsum", "attention_broadcast",
                                                           "mse_loss_none", "layer_norm_affine",
                                                           "group", "instance"))
    abstracts = []
    for a in args:
        shape: tuple[Any, ...] = np.shape(a)
        if symbolic and len(shape) >= 1 and shape[0] in first:
            shape = (B,) + shape[1:]
        abstracts.append(ATensor({np.dtype(np.float32): "f32", np.dtype(np.int64): "i64",
                                  np.dtype(np.bool_): "bool"}[np.asarray(a).dtype], shape))
    got = _infer(case.call, ", ".join(_names(case)), *abstracts)
    out = anfir.run(_value_fn(case), *args)
    sizes = {B: next(iter(first))} if symbolic else {}
    assert _concrete(got, sizes) == np.shape(out), (case.id, got)
    assert got.dtype == "f32"


def test_shape_rules_on_symbolic_dimensions() -> None:
    x = ATensor("f32", (B, N, 8))
    assert _infer("softmax(x, 1)", "x", x) == x
    assert _infer("layer_norm(x, axis=-2)", "x", x) == x
    assert _infer('einsum("bnk,bmk->bnm", x, x)', "x", x) == ATensor("f32", (B, N, N))
    assert _infer('einsum("...k,k->...", x, v)', "x, v", x, ATensor("f32", (8,))) == \
        ATensor("f32", (B, N))
    q, k = ATensor("f32", (B, 4, L, 8)), ATensor("f32", (B, 4, N, 8))
    assert _infer("attention(q, k, v)", "q, k, v", q, k, ATensor("f32", (B, 4, N, 16))) == \
        ATensor("f32", (B, 4, L, 16))
    assert _infer("cross_entropy(x, t, axis=1)", "x, t", x, ATensor("i64", (B, 8))) == AScalar("f32")
    assert _infer('nll_loss(x, t, reduction="none")', "x, t", x, ATensor("i64", (B, N))) == \
        ATensor("f32", (B, N))
    assert _infer('mse_loss(x, y, reduction="none")', "x, y", x, ATensor("f64", (N, 1))) == \
        ATensor("f64", (B, N, 8))
    assert _infer("group_norm(x, 2, s, b)", "x, s, b", ATensor("f64", (B, 4, L)),
                  ATensor("f64", (4,)), ATensor("f64", (4,))) == ATensor("f64", (B, 4, L))
    with pytest.raises(ShapeError, match="share E"):
        _infer("attention(q, k, k)", "q, k", q, ATensor("f32", (B, 4, N, 7)))
    with pytest.raises(ShapeError, match="target"):
        _infer("cross_entropy(x, t)", "x, t", x, ATensor("i64", (B, 8)))
    with pytest.raises(AnfirTypeError, match="out of range"):
        _infer("softmax(x, 3)", "x", x)


@st.composite
def _shape_and_axis(draw: Any) -> tuple[tuple[int, ...], int, list[bool]]:
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=4)))
    axis = draw(st.integers(-len(shape), len(shape) - 1))
    return shape, axis, draw(st.lists(st.booleans(), min_size=len(shape), max_size=len(shape)))


_SYMBOLS = [dim_symbol(n) for n in ("P", "Q", "R", "S")]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_shape_and_axis(), st.sampled_from(["softmax(x, axis={a})", "log_softmax(x, {a})",
                                           "layer_norm(x, axis={a})", "rms_norm(x, axis={a})",
                                           'einsum("...i->i...", x)']))
def test_shape_rules_agree_with_evaluation_for_drawn_shapes(drawn: Any, call: str) -> None:
    shape, axis, mask = drawn
    dims = tuple(_SYMBOLS[i] if symbolic and d > 1 else d
                 for i, (d, symbolic) in enumerate(zip(shape, mask)))
    sizes = {_SYMBOLS[i]: d for i, (d, symbolic) in enumerate(zip(shape, mask)) if symbolic and d > 1}
    text = call.format(a=axis)
    x = np.full(shape, 0.5, np.float32)
    got = _infer(text, "x", ATensor("f32", dims))
    out = anfir.run(_parse(f"def f(x) = {text}")["f"], x)
    assert _concrete(got, sizes) == np.shape(out), (text, got)
    assert got.dtype == "f32" and np.asarray(out).dtype == np.float32


def test_operators_are_values() -> None:
    m = _parse("""
def f(x) = let g = softmax in g(x, 0)
def h(x) = let p = partial(layer_norm, x) in p()
def k(x) = grad(lambda (y) sum(let g = log_softmax in g(y, 1) * y) end)(x)
""")
    x = np.arange(6.0).reshape(2, 3)
    t = torch.tensor(x, requires_grad=True)
    np.testing.assert_allclose(anfir.run(m["f"], x), F.softmax(t, 0).detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(anfir.run(m["h"], x), F.layer_norm(t, (3,)).detach().numpy(),
                               rtol=1e-9, atol=1e-12)
    (F.log_softmax(t, 1) * t).sum().backward()
    np.testing.assert_allclose(anfir.run(m["k"], x), t.grad.numpy(), rtol=1e-12)


# -- edge cases: 0-d, empty, f32 kept, errors ------------------------------------------------------
def test_zero_d_and_empty_tensors() -> None:
    m = _parse("""
def sm(x) = softmax(x)
def lsm(x) = log_softmax(x, axis=0)
def ln(x) = layer_norm(x)
def ce(x, t) = cross_entropy(x, t)
def ces(x, t) = cross_entropy(x, t, reduction="sum")
def es(a, b) = einsum("ij,jk->ik", a, b)
""")
    assert float(anfir.run(m["sm"], np.array(3.0))) == float(F.softmax(torch.tensor(3.0), -1))
    assert float(anfir.run(m["lsm"], np.array(3.0))) == 0.0
    empty = np.zeros((0, 3))
    assert anfir.run(m["sm"], empty).shape == (0, 3)
    assert anfir.run(m["ln"], empty).shape == (0, 3)
    t = np.zeros((0,), np.int64)
    want = F.cross_entropy(torch.tensor(empty), torch.tensor(t))
    assert np.isnan(anfir.run(m["ce"], empty, t)) and torch.isnan(want)
    assert anfir.run(m["ces"], empty, t) == 0.0
    np.testing.assert_array_equal(anfir.run(m["es"], np.zeros((2, 0)), np.zeros((0, 3))),
                                  np.zeros((2, 3)))
    g = anfir.run(anfir.grad(_parse("def f(x) = sum(softmax(x, 1) * x)")["f"]), empty)
    assert g.shape == (0, 3)


def test_softmax_and_losses_do_not_overflow() -> None:
    m = _parse("def f(x) = (softmax(x), log_softmax(x), cross_entropy(x, t))\n"
               "def g(x) = cross_entropy(x, t)\n".replace("t)", "array((0, 1)))"))
    x = np.array([[1000.0, 0.0, -1000.0], [-800.0, 800.0, 0.0]], np.float32)
    sm, lsm, ce = anfir.run(m["f"], x)
    t = torch.tensor(x)
    np.testing.assert_allclose(sm, F.softmax(t, -1).numpy())
    np.testing.assert_allclose(lsm, F.log_softmax(t, -1).numpy())
    np.testing.assert_allclose(ce, F.cross_entropy(t, torch.tensor([0, 1])).numpy())
    assert np.all(np.isfinite(anfir.run(anfir.grad(m["g"]), x)))


@pytest.mark.parametrize("text, kind, message", [
    ("def f(x) = softmax(x, axis=1.5)", AnfirTypeError, "integer"),
    ('def f(x) = cross_entropy(x, t, reduction="avg")', AnfirTypeError, "reduction"),
    ('def f(x) = einsum("ij,jk", x, x)', AnfirTypeError, "explicit"),
    ('def f(x) = einsum("ij,jk->ik", x)', AnfirTypeError, "operands"),
    ('def f(x) = einsum("ij->iz", x)', AnfirTypeError, "no operand"),
    ("def f(x) = group_norm(x, 3, s, s)", ShapeError, "groups"),
    ("def f(x) = layer_norm(x, s, axis=-2)", ShapeError, "scale"),
    ("def f(x) = cross_entropy(x, t, axis=1)", AnfirTypeError, "class index"),
    ("def f(x) = attention(x, x, s)", ShapeError, "attention"),
])
def test_bad_calls_are_located_errors(text: str, kind: type, message: str) -> None:
    x = np.ones((2, 4, 3))
    full = text.replace("(x, t", "(x, array(((0, 9, 1), (1, 1, 1)))").replace(
        "s)", "array((1.0, 2.0, 3.0, 4.0)))").replace("s, s)", "s, s)")
    full = full.replace(", s,", ", array((1.0, 2.0, 3.0, 4.0)),")
    with pytest.raises(kind, match=message) as info:
        anfir.run(_parse(full)["f"], x)
    assert isinstance(info.value, AnfirError)
    assert info.value.render().startswith("ops_nn.anf:1:"), info.value.render()


def test_einsum_gradient_through_a_diagonal_is_refused() -> None:
    f = _parse('def f(x) = einsum("ii->", x)')["f"]
    assert anfir.run(f, np.eye(3) * 2.0) == 6.0
    with pytest.raises(AnfirTypeError, match="diagonal"):
        anfir.run(anfir.grad(f), np.eye(3))


# -- dropout ------------------------------------------------------------------------------------------
def test_dropout_is_identity_unless_training_and_deterministic_by_key() -> None:
    m = _parse("""
def off(x) = dropout(x, 0.3, 1)
def on(x, k) = dropout(x, 0.3, k, training=true)
def loss(x, w) = sum(dropout(x, 0.3, 5, true) * w)
""")
    x = np.random.default_rng(0).uniform(1.0, 2.0, size=(200, 50)).astype(np.float32)
    np.testing.assert_array_equal(anfir.run(m["off"], x), x)
    a, b, c = anfir.run(m["on"], x, 5), anfir.run(m["on"], x, 5), anfir.run(m["on"], x, 6)
    assert a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    kept = a != 0
    np.testing.assert_allclose(a[kept], x[kept] / np.float32(0.7), rtol=1e-6)
    assert abs(kept.mean() - 0.7) < 0.02  # 10,000 draws: 4 standard deviations
    w = np.random.default_rng(1).normal(size=x.shape)
    g = anfir.run(anfir.grad(m["loss"]), x, w)
    np.testing.assert_allclose(g, np.where(kept, w / 0.7, 0.0), rtol=1e-6)
    g2 = anfir.run(anfir.compile(anfir.grad(m["loss"]), args=[x, w]), x, w)
    np.testing.assert_allclose(g2, g, rtol=1e-6)
    # rate 1 drops everything; a rate outside [0, 1] is an error
    assert not np.any(anfir.run(_parse("def f(x) = dropout(x, 1.0, 3, training=true)")["f"], x))
    with pytest.raises(AnfirTypeError, match="rate"):
        anfir.run(_parse("def f(x) = dropout(x, 1.5, 3, training=true)")["f"], x)


# -- attributes survive text and dumps ------------------------------------------------------------
def test_attributes_round_trip_through_text_and_dumps(tmp_path: Any) -> None:
    text = """
def f(x, t, w) =
  let h = layer_norm(x, w, axis=-1, eps=0.001) in
  let p = attention(h, h, h, causal=true, scale=0.25) in
  cross_entropy(log_softmax(p, axis=1) + einsum("bij,bkj->bik", p, h), t, axis=1, reduction="sum")
def df(x, t, w) = grad(f, 0, 2)(x, t, w)
"""
    module = anfir.parse(text, "rt.anf")
    again = anfir.parse(anfir.to_text(module), "rt2.anf")
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(2, 3, 3)), rng.normal(size=3)
    t = np.array([[0, 2, 1], [1, 1, 0]])
    want = anfir.run(module["df"], x, t, w)
    assert_close(anfir.run(again["df"], x, t, w), want, 1e-12, 1e-12)
    result = anfir.compile(module, entry="df", args=[x, t, w], dump_dir=tmp_path)
    assert_close(anfir.run(result, x, t, w), want, 1e-10, 1e-12)
    dumps = sorted(tmp_path.glob("*.ir"))
    assert dumps
    text_ir = dumps[0].read_text()
    assert "eps: 0.001" in text_ir and "causal: true" in text_ir.lower()
    for dump in dumps:
        loaded = anfir.load(dump)
        assert_close(anfir.run(loaded, x, t, w), want, 1e-10, 1e-12)


# -- ONNX and JAX --------------------------------------------------------------------------------
EXPORTED = """
def fwd(x: f32[2, 3, 4], s: f32[4], b: f32[4], m: f32[3, 3], t: i64[2, 3]) =
  let h = layer_norm(x, s, b) + rms_norm(x, s) in
  let g = group_norm(reshape(x, (2, 4, 3)), 2, s, b) + instance_norm(reshape(x, (2, 4, 3)), s, b) in
  let a = attention(h, h, h, m) + attention(h, x, x, causal=true) in
  let e = einsum("bij,bkj->bik", a, h) in
  (softmax(e, 1), log_softmax(e), cross_entropy(e, t), nll_loss(log_softmax(e, 1), t, axis=1),
   mse_loss(a, h), sum(g) + sum(dropout(x, 0.5, 11, training=true)))

def loss(x: f32[2, 3, 4], s: f32[4], b: f32[4], m: f32[3, 3], t: i64[2, 3]) =
  let r = fwd(x, s, b, m, t) in
  sum(r[0] * r[0]) + r[2] + r[3] + r[4] + r[5] * 0.01 + sum(r[1]) * 0.001

def dloss(x: f32[2, 3, 4], s: f32[4], b: f32[4], m: f32[3, 3], t: i64[2, 3]) =
  grad(loss, 0, 1, 2, 3)(x, s, b, m, t)
"""


def _exported_args() -> list[Any]:
    rng = np.random.default_rng(4)
    return [rng.normal(size=(2, 3, 4)).astype(np.float32), rng.normal(size=4).astype(np.float32),
            rng.normal(size=4).astype(np.float32), rng.normal(size=(3, 3)).astype(np.float32),
            np.array([[0, 2, 1], [1, 1, 0]])]


@pytest.mark.parametrize("entry", ["fwd", "dloss"])
def test_onnx_export_computes_what_run_computes(entry: str) -> None:
    pytest.importorskip("onnx", reason="the ONNX exporter needs onnx")
    ort = pytest.importorskip("onnxruntime", reason="the models run on onnxruntime")
    from anfir.interop.onnx.exporter import nest_outputs, onnx_inputs

    module = anfir.parse(EXPORTED, "exported.anf")
    args = _exported_args()
    model = anfir.export_onnx(module, entry=entry)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = nest_outputs(model, session.run(None, onnx_inputs(model, *args)))
    assert_close(got, anfir.run(module[entry], *args), 2e-4, 2e-5)
    used = {node.op_type for node in model.graph.node}
    if entry == "fwd":
        assert {"Softmax", "LogSoftmax", "Einsum"} <= used, used


@pytest.mark.parametrize("entry", ["fwd", "dloss"])
def test_jax_back_end_computes_what_run_computes(entry: str) -> None:
    jax = pytest.importorskip("jax", reason="the JAX back end needs jax")
    module = anfir.parse(EXPORTED, "exported.anf")
    args = [a.astype(np.float64) if a.dtype == np.float32 else a for a in _exported_args()]
    with jax.enable_x64(True):
        got = jax.jit(anfir.to_jax(module[entry]))(*args)
    assert_close(jax.tree_util.tree_map(np.asarray, got), anfir.run(module[entry], *args),
                 1e-9, 1e-10)

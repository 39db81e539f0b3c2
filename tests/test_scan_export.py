"""Structured loops and their gradients leave anfir: ONNX (checked, run by onnxruntime and
``onnx.reference``, equal to anfir), ``to_jax`` (``lax.scan`` under ``jax.jit``, equal); custom derivative rules export as the rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import anfir

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
jax = pytest.importorskip("jax")
from onnx.reference import ReferenceEvaluator  # noqa: E402
from onnx_runs import assert_onnx_equal  # noqa: E402

jax.config.update("jax_enable_x64", True)

PROGRAM = """
def rnn_loss(W, U, xs) =
  let r = scan(lambda (h, x) let h2 = tanh(W @ h + U @ x) in (h2, sum(h2 * h2)) end,
               zeros((3,)), xs) in
  sum(r[1]) + sum(r[0])
def g_rnn(W, U, xs) = grad(rnn_loss, 0, 1, 2)(W, U, xs)

def cumsum_loss(xs) =
  let r = scan(lambda (c, x) (c + x * c + x, c * x) end, 1.0, xs) in r[0] + sum(r[1] * r[1])
def g_cumsum(xs) = grad(cumsum_loss)(xs)

def halving(x) = fori_loop(0, 7, lambda (i, acc) acc * 0.5 + x * x end, x)
def g_halving(x) = grad(halving)(x)

def rev_loss(xs, ws) =
  let r = scan(lambda (c, p) (c * p[1] + p[0], c) end, 0.5, (xs, ws), reverse=true) in
  r[0] + sum(r[1])
def g_rev(xs, ws) = grad(rev_loss, 0, 1)(xs, ws)

def gg_halving(x) = grad(grad(halving))(x)
def gg_cumsum(xs) = grad(lambda (v) sum(g_cumsum(v) * g_cumsum(v)) end)(xs)
def gg_rnn(W, U, xs) = grad(lambda (w) sum(grad(rnn_loss)(w, U, xs)) end)(W)

def naive_softplus(x) = log(1.0 + exp(x))
def sp_fwd(x) = (log1p(exp(-abs(x))) + maximum(x, 0.0), x)
def sp_bwd(x, dout) = (dout * sigmoid(x),)
def g_softplus(x) = grad(lambda (x) custom_vjp(naive_softplus, sp_fwd, sp_bwd)(x) end)(x)
def sp_rule(p, t) = (naive_softplus(p[0]), t[0] * sigmoid(p[0]))
def g_softplus_j(x) = grad(lambda (x) custom_jvp(naive_softplus, sp_rule)(x) end)(x)
"""

MOD = anfir.parse(PROGRAM, "scan_export.anf")
RNG = np.random.RandomState(3)
W, U, XS = RNG.randn(3, 3) * 0.4, RNG.randn(3, 2) * 0.4, RNG.randn(6, 2)
VEC = np.array([0.3, -0.7, 1.1, 0.4])

CASES = [
    ("rnn_loss", (W, U, XS)), ("g_rnn", (W, U, XS)), ("g_cumsum", (VEC,)), ("g_halving", (0.8,)),
    ("g_rev", (VEC, VEC[::-1].copy())), ("g_softplus", (800.0,)), ("g_softplus", (0.4,)),
    ("g_softplus_j", (-2.0,)),
]


def leaves(value: Any) -> list[np.ndarray]:
    if isinstance(value, tuple):
        return [leaf for item in value for leaf in leaves(item)]
    return [np.asarray(value, dtype=np.float64)]


def onnx_model(entry: str, args: tuple) -> Any:
    model = anfir.export_onnx(MOD, entry=entry, args=list(args))
    onnx.checker.check_model(model, full_check=True)
    onnx.shape_inference.infer_shapes(model, strict_mode=True)
    return model


@pytest.mark.parametrize("entry,args", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_onnx_runs_equal_anfir(entry: str, args: tuple) -> None:
    want = leaves(anfir.run(anfir.compile(MOD, entry=entry, args=list(args)), *args))
    assert_onnx_equal(onnx_model(entry, args), args, want, entry)


def _op_types(graph: Any) -> list[str]:
    found: list[str] = []
    stack = [graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            found.append(node.op_type)
            stack.extend(a.g for a in node.attribute if a.HasField("g"))
    return found


def test_the_gradient_of_a_scan_is_two_onnx_loops() -> None:
    ops = _op_types(onnx_model("g_rnn", (W, U, XS)).graph)
    # The forward scan (stacking the carries) and the reversed scan of the backward pass.
    assert ops.count("Loop") == 2
    assert "ScatterND" in ops and "Gather" in ops


def test_rule_is_what_exports() -> None:
    model = onnx_model("g_softplus", (800.0,))
    ops = _op_types(model.graph)
    assert "Sigmoid" in ops  # the user's bwd, not the derivative of log(1 + exp(x))
    (got,) = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: np.asarray(800.0)})
    assert float(np.asarray(got).ravel()[0]) == 1.0


@pytest.mark.parametrize("entry,args", [("g_rnn", (W, U, XS)), ("g_halving", (0.8,)),
                                        ("g_rev", (VEC, VEC[::-1].copy())), ("g_softplus", (0.4,))])
def test_to_jax_jit_equals_anfir(entry: str, args: tuple) -> None:
    compiled = anfir.compile(MOD, entry=entry, args=list(args))
    fn = anfir.to_jax(compiled)
    got = leaves(jax.jit(fn)(*args))
    for g, w in zip(got, leaves(anfir.run(compiled, *args))):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)
    if entry in ("g_rnn", "g_halving"):
        assert "while" in jax.jit(fn).lower(*args).as_text()  # lax.scan's StableHLO


def test_to_jax_of_a_symbolic_length_runs_any_length() -> None:
    compiled = anfir.compile(MOD, entry="g_rnn", args=["f64[3, 3]", "f64[3, 2]", "f64[T, 2]"])
    fn = jax.jit(anfir.to_jax(compiled))
    for steps in (2, 5):
        xs = RNG.randn(steps, 2)
        for g, w in zip(leaves(fn(W, U, xs)), leaves(anfir.run(compiled, W, U, xs))):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_onnx_of_a_symbolic_length_runs_any_length() -> None:
    model = anfir.export_onnx(MOD, entry="g_rnn", args=["f64[3, 3]", "f64[3, 2]", "f64[T, 2]"])
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    compiled = anfir.compile(MOD, entry="g_rnn", args=[W, U, XS])
    for steps in (0, 1, 4, 9):
        xs = RNG.randn(steps, 2)
        feed = {i.name: a for i, a in zip(model.graph.input, (W, U, xs))}
        for g, w in zip(session.run(None, feed), leaves(anfir.run(compiled, W, U, xs))):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)


def test_a_loop_of_no_steps_exports_and_passes_its_state_through() -> None:
    mod = anfir.parse("def f(x, n) = fori_loop(3, n, lambda (i, c) c * x + 1.0 end, x)")
    model = anfir.export_onnx(mod, entry="f", args=[1.5, 5])
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (0, 3, 4, 6):
        feed = {model.graph.input[0].name: np.asarray(1.5), model.graph.input[1].name: np.asarray(n)}
        for got in (session.run(None, feed), ReferenceEvaluator(model).run(None, feed)):
            np.testing.assert_allclose(np.asarray(got[0]).ravel()[0], anfir.run(mod["f"], 1.5, n))


# -- counted tail-recursive loops become fori_loop before AD ------------------------------------
LOOPS = anfir.parse("""
def halving(x, n) =
  let loop = lambda (i, acc) if i < n then loop(i + 1, acc * 0.5 + x * x) else acc end in
  loop(0, x)
def g_halving(x, n) = grad(halving)(x, n)
def gg_halving(x, n) = grad(grad(halving))(x, n)
def halvings(x) =
  let loop = lambda (y, scale) if y < 1.0 then scale * y else loop(y / 2.0, scale * 3.0) end in
  loop(x, 1.0)
def g_halvings(x) = grad(halvings)(x)
""", "loops.anf")


def j_halving(x: Any, n: int) -> Any:
    return jax.lax.fori_loop(0, n, lambda i, acc: acc * 0.5 + x * x, x)


def test_a_counted_loop_is_rewritten_before_ad_and_its_gradient_exports(tmp_path: Path) -> None:
    result_dir = tmp_path / "dumps"
    compiled = anfir.compile(LOOPS, entry="g_halving", args=[0.8, 7], dump_dir=str(result_dir))
    ad_dump = next(result_dir.glob("03_ad.ir")).read_text()
    assert "fori_loop(" in ad_dump and "scan(" in ad_dump  # the rewrite, then its gradient
    # (the loops phase's own dump, 03_loops.ir with fine dumps: tests/test_scan.py)
    for n in (1, 7, 12):
        want = float(jax.grad(j_halving)(0.8, n))
        np.testing.assert_allclose(anfir.run(compiled, 0.8, n), want, rtol=1e-12)
        np.testing.assert_allclose(anfir.run(LOOPS["g_halving"], 0.8, n), want, rtol=1e-12)
    gg = anfir.compile(LOOPS, entry="gg_halving", args=[0.8, 7])
    np.testing.assert_allclose(anfir.run(gg, 0.8, 7), float(jax.grad(jax.grad(j_halving))(0.8, 7)),
                               rtol=1e-12)
    # n is an input of the exported model: the trip count is dynamic.
    model = anfir.export_onnx(LOOPS, entry="g_halving", args=[0.8, 7])
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for n in (1, 7, 12):
        feed = {model.graph.input[0].name: np.asarray(0.8), model.graph.input[1].name: np.asarray(n)}
        for got in (session.run(None, feed), ReferenceEvaluator(model).run(None, feed)):
            np.testing.assert_allclose(np.asarray(got[0]).ravel()[0], float(jax.grad(j_halving)(0.8, n)),
                                       rtol=1e-12)


def test_a_loop_that_is_not_counted_runs_as_before_and_its_export_refusal_says_why() -> None:
    compiled = anfir.compile(LOOPS, entry="g_halvings", args=[5.0])
    assert anfir.run(compiled, 5.0) == anfir.run(LOOPS["g_halvings"], 5.0) == 27.0 / 8.0
    with pytest.raises(anfir.AnfirError) as info:
        anfir.export_onnx(LOOPS, entry="g_halvings", args=[5.0])
    text = info.value.render()
    assert "a loop that carries or returns a function" in text and "counted loop" in text


def test_core_ml_writes_a_counted_loop_gradient_as_while_loops() -> None:
    # (numbers and conversion: tests/test_coreml_loops.py)
    pytest.importorskip("coremltools")
    program = anfir.export_coreml(MOD, entry="g_halving", args=[0.8])
    assert str(program).count("while_loop(") >= 2


def _jax_second_orders() -> dict[str, Any]:
    jnp, lax = jax.numpy, jax.lax

    def halving(x: Any) -> Any:
        return lax.fori_loop(0, 7, lambda i, acc: acc * 0.5 + x * x, x)

    def cumsum_loss(xs: Any) -> Any:
        c, ys = lax.scan(lambda c, x: (c + x * c + x, c * x), 1.0, xs)
        return c + jnp.sum(ys * ys)

    def rnn_loss(w: Any, u: Any, xs: Any) -> Any:
        def step(h: Any, x: Any) -> Any:
            h2 = jnp.tanh(w @ h + u @ x)
            return h2, jnp.sum(h2 * h2)
        h, ys = lax.scan(step, jnp.zeros(3), xs)
        return jnp.sum(ys) + jnp.sum(h)

    g_cumsum = jax.grad(cumsum_loss)
    return {
        "gg_halving": jax.grad(jax.grad(halving))(0.8),
        "gg_cumsum": jax.grad(lambda v: jnp.sum(g_cumsum(v) * g_cumsum(v)))(VEC),
        "gg_rnn": jax.grad(lambda w: jnp.sum(jax.grad(rnn_loss)(w, U, XS)))(W),
    }


SECOND_ORDER = [("gg_halving", (0.8,)), ("gg_cumsum", (VEC,)), ("gg_rnn", (W, U, XS))]


@pytest.mark.parametrize("entry,args", SECOND_ORDER, ids=[c[0] for c in SECOND_ORDER])
def test_second_order_loop_gradients_export_equal_to_jax(entry: str, args: tuple) -> None:
    # The backward scan of a first-order gradient calls the J-transformed body as a
    # constant (autodiff/loops.bake_closed_body), so differentiating it again carries
    # tensors only: the second-order gradient is first-order data that ONNX writes.
    want = np.asarray(_jax_second_orders()[entry], dtype=np.float64)
    np.testing.assert_allclose(leaves(anfir.run(MOD[entry], *args))[0], want, rtol=1e-12)
    model = onnx_model(entry, args)
    assert _op_types(model.graph).count("Loop") >= 2
    feed = {i.name: np.asarray(a, dtype=np.float64) for i, a in zip(model.graph.input, args)}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for name, got in (("onnxruntime", session.run(None, feed)),
                      ("reference", ReferenceEvaluator(model).run(None, feed))):
        np.testing.assert_allclose(np.asarray(got[0], dtype=np.float64).reshape(want.shape), want,
                                   rtol=1e-10, atol=1e-12, err_msg=f"{entry} {name}")
    compiled = anfir.compile(MOD, entry=entry, args=list(args))
    np.testing.assert_allclose(np.asarray(jax.jit(anfir.to_jax(compiled))(*args)), want, rtol=1e-10)

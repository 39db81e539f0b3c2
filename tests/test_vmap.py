"""``vmap``, ``jacfwd``, ``jacrev`` and ``hessian`` against JAX (float64), through
``anfir.run``, ``anfir.compile`` (its numbered dumps reloaded and run) and ``anfir.to_jax``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import anfir

jax = pytest.importorskip("jax", reason='the jax extra is not installed: pip install "anfir[jax]"')
import jax.numpy as jnp  # noqa: E402

jax.config.update("jax_enable_x64", True)

SOURCE = """
def f(x, y) = sin(x) * y + sum(x)
def loss(w, x) = sum(tanh(x @ w) ** 2)
def scale_by(s) = lambda (v) v * s end
def apply(g, v) = g(v)
def power(x, n) =
  let loop = lambda (i, acc)
    if i < n then loop(i + 1, acc * x) else acc end in
  loop(0, 1.0)
def fact(n) = if n < 1.5 then 1.0 else n * fact(n - 1.0)
def absv(x) = if x > 0.0 then x else 0.0 - x
def net(w1, w2, x) = tanh(w2 @ tanh(w1 @ x))
def scal(p) = sum(sin(p) * p) + sum(p) * sum(p * p * p)

def broadcast_arg(xs, y) = vmap(f, (0, None))(xs, y)
def closure(xs, s) = vmap(lambda (x) scale_by(s * sum(x))(x) end)(xs)
def hof(xs) = vmap(lambda (x) apply(lambda (v) v * x end, x + 1.0) end)(xs)
def batched_if(xs) = vmap(absv)(xs)
def loop_trips(xs, ns) = vmap(power)(xs, ns)
def recursion(ns) = vmap(fact)(ns)
def nested(xs) = vmap(lambda (r) vmap(lambda (e) e * sum(r) end)(r) end)(xs)
def out_axis(xs) = vmap(lambda (x) x * 2.0 end, 0, 1)(xs)
def per_example_grads(w, xs) = vmap(grad(loss), (None, 0))(w, xs)
def closure_grads(w, xs) = vmap(lambda (x) grad(lambda (v) loss(v, x) end)(w) end)(xs)
def grad_of_vmap(w, xs) = grad(lambda (v) sum(vmap(lambda (x) tanh(v @ x) end)(xs)) end)(w)
def jac_rev(w1, w2, x) = jacrev(net, 2)(w1, w2, x)
def jac_fwd(w1, w2, x) = jacfwd(net, 0)(w1, w2, x)
def hess(p) = hessian(scal)(p)
def add3(a, b, c) = a + b * c
def partial_fn(xs, s) = vmap(partial(add3, 1.0, s))(xs)
"""

R = np.random.default_rng(0)
XS = R.normal(size=(4, 3))
W = R.normal(size=(3, 2))
W1, W2, X3 = R.normal(size=(4, 3)), R.normal(size=(2, 4)), R.normal(size=(3,))


def jf(x: Any, y: Any) -> Any:
    return jnp.sin(x) * y + jnp.sum(x)


def jloss(w: Any, x: Any) -> Any:
    return jnp.sum(jnp.tanh(x @ w) ** 2)


def jnet(w1: Any, w2: Any, x: Any) -> Any:
    return jnp.tanh(w2 @ jnp.tanh(w1 @ x))


def jscal(p: Any) -> Any:
    return jnp.sum(jnp.sin(p) * p) + jnp.sum(p) * jnp.sum(p * p * p)


def jpower(x: Any, n: Any) -> Any:
    return jax.lax.fori_loop(0, n, lambda i, a: a * x, 1.0)


def jfact(n: Any) -> Any:
    return jax.lax.while_loop(lambda c: c[0] >= 1.5, lambda c: (c[0] - 1.0, c[1] * c[0]), (n, 1.0))[1]


CASES: list[tuple[str, tuple, Callable[..., Any]]] = [
    ("broadcast_arg", (XS, XS[0]), jax.vmap(jf, (0, None))),
    ("closure", (XS, 0.5), lambda xs, s: jax.vmap(lambda x: x * (s * jnp.sum(x)))(xs)),
    ("hof", (XS,), jax.vmap(lambda x: (x + 1.0) * x)),
    ("batched_if", (np.array([-1.0, 2.0, -3.0, 0.5]),), jax.vmap(lambda x: jnp.where(x > 0, x, -x))),
    ("loop_trips", (np.array([2.0, 3.0, 1.5, 0.5]), np.array([3, 0, 5, 2])), jax.vmap(jpower)),
    ("recursion", (np.array([1.0, 3.0, 5.0, 2.0]),), jax.vmap(jfact)),
    ("nested", (XS,), jax.vmap(lambda r: jax.vmap(lambda e: e * jnp.sum(r))(r))),
    ("out_axis", (XS,), jax.vmap(lambda x: x * 2.0, 0, 1)),
    ("per_example_grads", (W, XS), jax.vmap(jax.grad(jloss), (None, 0))),
    ("closure_grads", (W, XS), lambda w, xs: jax.vmap(lambda x: jax.grad(lambda v: jloss(v, x))(w))(xs)),
    ("grad_of_vmap", (W.T, XS), jax.grad(lambda v, xs: jnp.sum(jax.vmap(lambda x: jnp.tanh(v @ x))(xs)))),
    ("jac_rev", (W1, W2, X3), jax.jacrev(jnet, 2)),
    ("jac_fwd", (W1, W2, X3), jax.jacfwd(jnet, 0)),
    ("hess", (R.normal(size=(10,)),), jax.hessian(jscal)),
    ("partial_fn", (XS, 0.5), lambda xs, s: jax.vmap(lambda c: 1.0 + s * c)(xs)),
]

MOD = anfir.parse(SOURCE)


def _close(got: Any, want: Any) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_run_agrees_with_jax(case: tuple[str, tuple, Callable[..., Any]]) -> None:
    name, args, ref = case
    _close(anfir.run(MOD[name], *args), ref(*args))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_to_jax_agrees_with_jax(case: tuple[str, tuple, Callable[..., Any]]) -> None:
    name, args, ref = case
    _close(anfir.to_jax(MOD, entry=name)(*args), ref(*args))


COMPILED = ["broadcast_arg", "closure", "hof", "batched_if", "loop_trips", "recursion", "nested",
            "out_axis", "per_example_grads", "closure_grads", "partial_fn", "grad_of_vmap", "jac_rev",
            "jac_fwd", "hess"]


@pytest.mark.parametrize("name", COMPILED)
def test_compile_and_its_reloaded_dumps_agree_with_jax(name: str, tmp_path: Path) -> None:
    args, ref = next((c[1], c[2]) for c in CASES if c[0] == name)
    compiled = anfir.compile(MOD, entry=name, args=args, dump_dir=str(tmp_path))
    want = ref(*args)
    _close(anfir.run(compiled, *args), want)
    dumps = sorted(p for p in os.listdir(tmp_path) if p.endswith(".ir"))
    # The batched graphs are in the dumps from the specializer on, and each reloads and runs.
    assert any("⊞" in (tmp_path / d).read_text(encoding="utf-8") for d in dumps)
    for dump in dumps[dumps.index(next(d for d in dumps if "specialize" in d)):]:
        reloaded = anfir.load(str(tmp_path / dump))
        _close(anfir.run(reloaded.entry, *args), want)


def test_api_vmap_returns_a_graph_with_in_and_out_axes() -> None:
    g = anfir.vmap(MOD["f"], in_axes=(1, None), out_axes=1)
    xs = XS.T.copy()
    want = jax.vmap(jf, (1, None), 1)(xs, XS[0])
    _close(anfir.run(g, xs, XS[0]), want)
    _close(anfir.to_jax(g)(xs, XS[0]), want)
    _close(anfir.run(anfir.compile(g, args=(xs, XS[0])), xs, XS[0]), want)


def test_api_vmap_of_api_grad_gives_per_example_gradients() -> None:
    g = anfir.vmap(anfir.grad(MOD["loss"]), in_axes=(None, 0))
    _close(anfir.run(g, W, XS), jax.vmap(jax.grad(jloss), (None, 0))(W, XS))


def test_api_hessian_of_a_ten_parameter_function_equals_jax() -> None:
    p = R.normal(size=(10,))
    _close(anfir.run(anfir.hessian(MOD["scal"]), p), jax.hessian(jscal)(p))


def test_api_jacrev_of_a_100_to_10_network_equals_jax() -> None:
    mod = anfir.parse("def net(x, w1, w2) = tanh(w2 @ tanh(w1 @ x))")
    x, w1, w2 = R.normal(size=(100,)), R.normal(size=(20, 100)) / 10, R.normal(size=(10, 20)) / 4
    ref = jax.jacrev(lambda x, a, b: jnp.tanh(b @ jnp.tanh(a @ x)))(x, w1, w2)
    got = anfir.run(anfir.jacrev(mod["net"], 0), x, w1, w2)
    assert np.shape(got) == (10, 100)
    _close(got, ref)
    _close(anfir.run(anfir.jacfwd(mod["net"], 0), x, w1, w2), ref)


def test_second_order_through_a_captured_batched_value_and_vmap_of_jvp() -> None:
    mod = anfir.parse("""
def h(ts) = vmap(lambda (t) grad(lambda (u) grad(lambda (z) z * u end)(2.0) * sum(t) end)(1.0) end)(ts)
def k(xs, ts) = vmap(jvp(lambda (x) sin(x) * x end))(xs, ts)
""")
    _close(anfir.run(mod["h"], XS), XS.sum(axis=1))
    want = jax.vmap(lambda x, t: jax.jvp(lambda v: jnp.sin(v) * v, (x,), (t,)))(XS, 2 * XS)
    for got in (anfir.run(mod["k"], XS, 2 * XS), anfir.to_jax(mod, entry="k")(XS, 2 * XS),
                anfir.run(anfir.compile(mod, entry="k", args=(XS, 2 * XS)), XS, 2 * XS)):
        _close(got[0], want[0])
        _close(got[1], want[1])


def test_bad_in_axes_are_located_errors() -> None:
    mod = anfir.parse("""
def f(x, y) = x + y
def g(xs) = vmap(f, (0,))(xs, xs)
""")
    with pytest.raises(anfir.AnfirError, match="in_axes has 1 entries") as info:
        anfir.run(mod["g"], XS)
    assert info.value.loc is not None
    with pytest.raises(anfir.AnfirError, match="at least one batched"):
        anfir.vmap(mod["f"], in_axes=None)


def test_cli_compiles_runs_and_dumps_a_program_using_vmap(tmp_path: Path) -> None:
    from cli_harness import run_in_process

    program = tmp_path / "batch.anf"
    program.write_text("def power(x, n) =\n"
                       "  let loop = lambda (i, acc)\n"
                       "    if i < n then loop(i + 1, acc * x) else acc end in\n"
                       "  loop(0, 1.0)\n\n"
                       "def main(xs) = vmap(lambda (x) power(x, 3) + grad(sin)(x) end)(xs)\n",
                       encoding="utf-8")
    xs = np.array([1.0, 2.0, 0.5])
    np.save(tmp_path / "xs.npy", xs)
    want = xs ** 3 + np.cos(xs)
    status, out, err = run_in_process(["run", str(program), "xs.npy"], tmp_path)
    assert status == 0, err
    assert "1.5403" in out  # 1 + cos(1)
    dumps = tmp_path / "dumps"
    status, out, err = run_in_process(["compile", str(program), "--args", "xs.npy", "--dump-dir", str(dumps)],
                                      tmp_path)
    assert status == 0, err
    last = sorted(p for p in os.listdir(dumps) if p.endswith(".ir"))[-1]
    reloaded = anfir.load(str(dumps / last))
    _close(anfir.run(reloaded.entry, xs), want)


def test_per_example_gradients_of_a_convnet_equal_jax() -> None:
    mod = anfir.parse("""
def cnn(w, x) = sum(tanh(max_pool(conv(x, w, stride=1), (2,))) ** 2)
def main(w, xs) = vmap(grad(cnn), (None, 0))(w, xs)
""")
    w, xs = R.normal(size=(3, 2, 3)), R.normal(size=(5, 1, 2, 9))

    def jcnn(w: Any, x: Any) -> Any:
        y = jax.lax.conv_general_dilated(x, w, (1,), "VALID")
        y = jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 1, 2), (1, 1, 2), "VALID")
        return jnp.sum(jnp.tanh(y) ** 2)

    want = jax.vmap(jax.grad(jcnn), (None, 0))(w, xs)
    _close(anfir.run(mod["main"], w, xs), want)
    _close(anfir.to_jax(mod, entry="main")(w, xs), want)
    _close(anfir.run(anfir.compile(mod, entry="main", args=(w, xs)), w, xs), want)


def test_in_axes_and_out_axes_may_be_keywords() -> None:
    mod = anfir.parse("""
def f(x, y) = sin(x) * y
def a(xs, y) = vmap(f, in_axes=(1, None))(xs, y)
def b(xs) = vmap(lambda (x) x * 2.0 end, out_axes=1)(xs)
def c(xs) = vmap(f, (0, 0), in_axes=1)(xs, xs)
""".replace("def c(xs) = vmap(f, (0, 0), in_axes=1)(xs, xs)\n", ""))
    xs = XS.T.copy()
    _close(anfir.run(mod["a"], xs, XS[0]), jax.vmap(lambda x, y: jnp.sin(x) * y, (1, None))(xs, XS[0]))
    _close(anfir.run(mod["b"], XS), jax.vmap(lambda x: x * 2.0, out_axes=1)(XS))
    reparsed = anfir.parse(anfir.to_text(mod))  # printed positionally, read back the same
    _close(anfir.run(reparsed["b"], XS), 2.0 * XS.T)
    with pytest.raises(anfir.AnfirError, match="both positionally and as a keyword"):
        anfir.parse("def f(x) = x\ndef c(xs) = vmap(f, 0, in_axes=1)(xs)")
    with pytest.raises(anfir.AnfirError, match="no keyword argument 'axes'"):
        anfir.parse("def f(x) = x\ndef c(xs) = vmap(f, axes=1)(xs)")


def test_compiled_api_jacobians_and_hessian_equal_jax() -> None:
    """``anfir.compile`` of the API's ``hessian``/``jacrev``/``jacfwd`` graphs: the pullback
    (a run-time function value) is called example by example in a ``scan``."""
    p = R.normal(size=(10,))
    hess = anfir.compile(anfir.hessian(MOD["scal"]), args=[p])
    assert "scan" in anfir.to_text(hess)
    _close(anfir.run(hess, p), jax.hessian(jscal)(p))
    w1, w2, x = R.normal(size=(5, 4)), R.normal(size=(3, 5)), R.normal(size=(4,))
    ref = jax.jacrev(lambda a, b, c: jnp.tanh(b @ jnp.tanh(a @ c)), 0)(w1, w2, x)
    for make in (anfir.jacrev, anfir.jacfwd):
        compiled = anfir.compile(make(MOD["net"], 0), args=[w1, w2, x])
        _close(anfir.run(compiled, w1, w2, x), ref)


EXPORTED = ["broadcast_arg", "batched_if", "loop_trips", "out_axis", "per_example_grads",
            "closure_grads", "partial_fn"]
"""Batched programs whose compiled form is first-order and has no fallback loop (`nested`
batches a primitive by `batch_loop`, which no exporter writes): exported."""


@pytest.mark.parametrize("name", EXPORTED)
def test_batched_programs_export_to_onnx_and_core_ml(name: str) -> None:
    """Once typed, the batching primitives are core ones (passes/batching_typed.py): the
    compiled program keeps none, and ONNX (run by onnxruntime) and Core ML write it."""
    ort = pytest.importorskip("onnxruntime")
    from anfir.interop.onnx.exporter import onnx_inputs
    from anfir.primitives.batching import BATCHING_PRIMITIVES

    args, ref = next((c[1], c[2]) for c in CASES if c[0] == name)
    compiled = anfir.compile(MOD, entry=name, args=args)
    text = anfir.to_text(compiled)
    assert not [p.name for p in BATCHING_PRIMITIVES if f"{p.name}(" in text]
    want = ref(*args)
    model = anfir.export_onnx(MOD, entry=name, args=args)
    session = ort.InferenceSession(model.SerializeToString())
    got = session.run(None, onnx_inputs(model, *args))
    for g, w in zip(got, want if isinstance(want, tuple) else (want,)):
        _close(g, w)
    pytest.importorskip("coremltools")
    assert anfir.export_coreml(MOD, entry=name, args=args) is not None


def test_a_straight_line_batched_program_lowers_to_the_buffer_ir() -> None:
    args, ref = next((c[1], c[2]) for c in CASES if c[0] == "per_example_grads")
    low = anfir.lower(MOD, entry="per_example_grads", args=args)
    for g, w in zip(anfir.run(low, *args), ref(*args)):
        _close(g, w)

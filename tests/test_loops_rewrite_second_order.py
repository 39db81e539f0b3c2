"""Counted tail-recursive loops differentiated twice are rewritten into ``fori_loop``
(issue 25): the ``loops`` phase rewrites a counted loop whose captures are data even
when the program takes a derivative of a derivative — the ``ad`` phase closes its body
(the captures ride in the carry) and the J-world loop of a closed body carries only
tensors through its backward scan at every order.  So ``grad(grad(loop))`` equals JAX's
``jax.grad(jax.grad(...))`` of the ``lax.fori_loop`` version and exports (ONNX checked and
run by onnxruntime and ``onnx.reference``, ``to_jax`` under ``jax.jit``, Core ML).

A counted loop that captures a function (``partial(f, x)``) stays a recursion when it
is differentiated twice (its backward scan would carry a gradient environment), and
still differentiates (tests/test_compile_agrees_with_run.py covers orders 1 to 4).
"""

from __future__ import annotations

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
jnp = jax.numpy

PROGRAM = """
def halving(x) =
  let loop = lambda (i, acc) if i < 7 then loop(i + 1, acc * 0.5 + x * x) else acc end in
  loop(0, x)
def gg_halving(x) = grad(grad(halving))(x)
def ggg_halving(x) = grad(grad(grad(halving)))(x)

def newton(a) =
  let loop = lambda (i, y) if i < 6 then loop(i + 1, 0.5 * (y + a / y)) else y end in
  loop(0, a)
def gg_newton(a) = grad(grad(newton))(a)
def g4_newton(a) = grad(grad(grad(grad(newton))))(a)

def tensor_loop(a, v) =
  let loop = lambda (i, h, s) if i < 5 then loop(i + 1, tanh(h * a) + v, s + sum(h * h))
    else s end in
  loop(0, v, 0.0)
def gg_tensor(a, v) = grad(grad(tensor_loop))(a, v)
def gg_tensor_v(a, v) = grad(lambda (w) let g = grad(tensor_loop, 1)(a, w) in sum(g * g) end)(v)

def cube(z) = z * z * z
def inner(x) =
  let l = lambda (i, acc) if i < 3 then l(i + 1, acc + grad(cube)(acc * x)) else acc end in
  l(0, x)
def gg_inner(x) = grad(grad(inner))(x)

def f(a, x) = a * x * x
def captured_fn(x) = let k = partial(f, x) in
  let l = lambda (i, acc) if i < 2 then l(i + 1, acc + k(x)) else acc end in l(0, 0.0)
def gg_captured_fn(x) = grad(grad(captured_fn))(x)
"""

MOD = anfir.parse(PROGRAM, "rewrite2.anf")
VEC = np.array([0.3, -0.7, 1.1, 0.4])


def j_halving(x: Any) -> Any:
    return jax.lax.fori_loop(0, 7, lambda i, acc: acc * 0.5 + x * x, x)


def j_newton(a: Any) -> Any:
    return jax.lax.fori_loop(0, 6, lambda i, y: 0.5 * (y + a / y), a)


def j_tensor_loop(a: Any, v: Any) -> Any:
    def step(i: Any, c: Any) -> Any:
        h, s = c
        return jnp.tanh(h * a) + v, s + jnp.sum(h * h)
    return jax.lax.fori_loop(0, 5, step, (v, 0.0))[1]


def j_inner(x: Any) -> Any:
    return jax.lax.fori_loop(0, 3, lambda i, acc: acc + jax.grad(lambda z: z ** 3)(acc * x), x)


def _gg_tensor_v(a: Any, v: Any) -> Any:
    return jax.grad(lambda w: jnp.sum(jax.grad(j_tensor_loop, 1)(a, w) ** 2))(v)


g = jax.grad
# entry, arguments, JAX's reference (jax.grad of the lax.fori_loop version)
CASES: list[tuple[str, tuple, Callable[..., Any]]] = [
    ("gg_halving", (0.8,), g(g(j_halving))),
    ("gg_newton", (2.0,), g(g(j_newton))),
    ("gg_tensor", (0.7, VEC), g(g(j_tensor_loop))),
    ("gg_tensor_v", (0.7, VEC), _gg_tensor_v),
    ("gg_inner", (0.3,), g(g(j_inner))),  # a gradient taken inside the loop's body
]
IDS = [c[0] for c in CASES]


def leaves(value: Any) -> list[np.ndarray]:
    if isinstance(value, tuple):
        return [leaf for item in value for leaf in leaves(item)]
    return [np.asarray(value, dtype=np.float64)]


def _rewritten(entry: str, args: tuple) -> int:
    return compile_program(MOD, entry=entry, args=list(args)).program.stats[COUNTED_LOOPS_STAT]


@pytest.mark.parametrize("entry,args,ref", CASES, ids=IDS)
def test_second_order_loops_are_fori_loops_equal_to_jax(entry: str, args: tuple,
                                                        ref: Callable[..., Any]) -> None:
    assert _rewritten(entry, args) == 1
    want = np.asarray(ref(*args), dtype=np.float64)
    compiled = anfir.compile(MOD, entry=entry, args=list(args))
    np.testing.assert_allclose(np.asarray(anfir.run(compiled, *args)), want, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.asarray(anfir.run(MOD[entry], *args)), want, rtol=1e-12,
                               atol=1e-14)


def test_the_loops_phase_dump_shows_the_rewrite_at_order_two(tmp_path: Any) -> None:
    result = compile_program(MOD, entry="gg_halving", args=[0.8], dump_dir=tmp_path / "d",
                             fine_dumps=True)
    assert result.program.stats[COUNTED_LOOPS_STAT] == 1
    before = (tmp_path / "d" / "02_specialize.ir").read_text(encoding="utf-8")
    text = (tmp_path / "d" / "03_loops.ir").read_text(encoding="utf-8")
    assert "fori_loop(" in text and "fori_loop(" not in before


def test_third_order_is_rewritten_and_equal_to_jax() -> None:
    assert _rewritten("ggg_halving", (0.8,)) == 1
    compiled = anfir.compile(MOD, entry="ggg_halving", args=[0.8])
    # x^2 terms make the third derivative of halving constant: compare at two points
    for x in (0.8, -1.3):
        want = float(g(g(g(j_halving)))(x))
        np.testing.assert_allclose(anfir.run(compiled, x), want, rtol=1e-12, atol=1e-14)


def test_fourth_order_is_rewritten_and_equal_to_jax() -> None:
    assert _rewritten("g4_newton", (2.0,)) == 1
    compiled = anfir.compile(MOD, entry="g4_newton", args=[2.0])
    np.testing.assert_allclose(anfir.run(compiled, 2.0), float(g(g(g(g(j_newton))))(2.0)),
                               rtol=1e-12)


def test_a_loop_capturing_a_function_stays_a_recursion_at_order_two() -> None:
    assert _rewritten("gg_captured_fn", (1.5,)) == 0
    # captured_fn(x) = 2 x^3: its second derivative is 12 x
    np.testing.assert_allclose(anfir.run(anfir.compile(MOD, entry="gg_captured_fn", args=[1.5]), 1.5),
                               12 * 1.5, rtol=1e-12)


@pytest.mark.parametrize("entry,args,ref", CASES, ids=IDS)
def test_onnx_export_runs_equal(entry: str, args: tuple, ref: Callable[..., Any]) -> None:
    model = anfir.export_onnx(MOD, entry=entry, args=list(args))
    onnx.checker.check_model(model, full_check=True)
    want = leaves(anfir.run(anfir.compile(MOD, entry=entry, args=list(args)), *args))
    assert_onnx_equal(model, args, want, entry)
    ops = [node.op_type for node in model.graph.node]
    assert "Loop" in ops  # the loops, not an unrolled trace


@pytest.mark.parametrize("entry,args,ref", CASES, ids=IDS)
def test_to_jax_jit_equals_jax(entry: str, args: tuple, ref: Callable[..., Any]) -> None:
    fn = jax.jit(anfir.to_jax(anfir.compile(MOD, entry=entry, args=list(args))))
    np.testing.assert_allclose(np.asarray(fn(*args)), np.asarray(ref(*args)), rtol=1e-12, atol=1e-14)
    assert "while" in fn.lower(*args).as_text()


def test_core_ml_converts_and_runs_what_anfir_does(tmp_path: Any) -> None:
    ct = pytest.importorskip("coremltools")
    from mil_reference import gather_nd, scatter_nd
    from anfir.interop.coreml import exporter as coreml_export
    from anfir.interop.coreml import loops as coreml_loops

    program = anfir.export_coreml(MOD, entry="gg_halving", args=[0.8])
    path = tmp_path / "gg_halving.mlpackage"
    coreml_export.to_mlmodel(program).save(str(path))
    described = coreml_export.describe(ct.models.MLModel(str(path)).get_spec())
    assert described["op_types"].count("while_loop") >= 2
    got = coreml_loops.run_program(program, {"x": np.asarray([0.8], dtype=np.float32)},
                                   {"gather_nd": gather_nd, "scatter_nd": scatter_nd})
    (out,) = [v.name for v in program.functions["main"].outputs]
    np.testing.assert_allclose(float(got[out].ravel()[0]), float(g(g(j_halving))(0.8)), rtol=1e-4)

"""Loops and their gradients out to Core ML (issue 25): ``scan``/``fori_loop`` programs,
their reverse-mode gradients (a forward scan plus a reversed scan over stacked
residuals) and a tail-recursive loop rewritten into ``fori_loop`` export as MIL
``while_loop``, convert with ``coremltools.convert(..., "mlprogram")``, save, and load
back with ``ct.models.MLModel``.

Core ML prediction needs macOS.  The numbers are checked two ways on any machine,
both by coremltools' own value inference of each MIL op (its numpy reference):

* :func:`anfir.interop.coreml.loops.run_program` runs the very MIL program that is
  converted (``while_loop`` blocks iterated, inputs fed at run time: symbolic
  lengths and trip counts take several values);
* :func:`anfir.interop.coreml.exporter.evaluate` builds the program with the inputs
  as constants and unrolls each loop by value inference.

Both are compared with ``anfir.run`` (float32 tolerances: Core ML computes f64 as
fp32); ``anfir.run`` itself is checked against JAX in tests/test_scan.py and
tests/test_scan_export.py.  What is not checked here: the Core ML runtime itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

ct = pytest.importorskip("coremltools",
                         reason='the coreml extra is not installed: pip install -e ".[coreml]"')

import anfir  # noqa: E402
from mil_reference import gather_nd, scatter_nd  # noqa: E402
from anfir.interop.coreml import exporter as coreml_export  # noqa: E402
from anfir.interop.coreml import loops as coreml_loops  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

RTOL, ATOL = 1e-4, 1e-5

PROGRAM = anfir.parse("""
def cumsum_loss(xs) =
  let r = scan(lambda (c, x) (c + x, c * x) end, 0.5, xs) in r[0] * r[0] + sum(r[1] * r[1])
def g_cumsum(xs) = grad(cumsum_loss)(xs)

def rnn_loss(W, U, xs) =
  let r = scan(lambda (h, x) let h2 = tanh(W @ h + U @ x) in (h2, sum(h2 * h2)) end,
               zeros((3,)), xs) in
  sum(r[1]) + sum(r[0])
def g_rnn(W, U, xs) = grad(rnn_loss, 0, 1, 2)(W, U, xs)

def newton(a) = fori_loop(0, 8, lambda (i, x) 0.5 * (x + a / x) end, a)
def g_newton(a) = grad(newton)(a)
def gg_newton(a) = grad(g_newton)(a)
def gg_cumsum(xs) = grad(lambda (v) sum(g_cumsum(v) * g_cumsum(v)) end)(xs)

def halving(x, n) =
  let loop = lambda (i, acc) if i < n then loop(i + 1, acc * 0.5 + x * x) else acc end in
  loop(0, x)
def g_halving(x, n) = grad(halving)(x, n)
""", filename="coreml_loops.anf")

RNG = np.random.RandomState(5)
W, U = RNG.randn(3, 3) * 0.4, RNG.randn(3, 2) * 0.4
VEC = np.array([0.3, -0.7, 1.1, 0.4, -0.2])


EVALUATORS = {"gather_nd": gather_nd, "scatter_nd": scatter_nd}


def leaves(value: Any) -> list[np.ndarray]:
    if isinstance(value, tuple):
        return [leaf for item in value for leaf in leaves(item)]
    return [np.asarray(value, dtype=np.float64)]


def loaded(program: Any, tmp_path: Path, name: str) -> dict[str, Any]:
    """Convert (float32), save as an .mlpackage, load it with ``ct.models.MLModel``; what
    the loaded model declares (op types of ``main``, nested blocks included)."""
    path = tmp_path / f"{name}.mlpackage"
    coreml_export.to_mlmodel(program).save(str(path))
    model = ct.models.MLModel(str(path))
    described = coreml_export.describe(model.get_spec())
    assert described["functions"] == ["main"]
    return described


def model_feeds(program: Any, args: tuple) -> dict[str, np.ndarray]:
    """anfir arguments in the model's form (scalars of shape (1,), 32-bit)."""
    feeds = {}
    for (name, var), arg in zip(program.functions["main"].inputs.items(), args):
        dtype = ct.converters.mil.mil.types.nptype_from_builtin(var.dtype)
        feeds[name] = np.asarray(arg, dtype=dtype).reshape(-1 if np.ndim(arg) == 0 else np.shape(arg))
    return feeds


def assert_runs_equal(program: Any, compiled: Any, args: tuple) -> None:
    """The exported program, run op by op, equals ``anfir.run`` (outputs in order)."""
    got = coreml_loops.run_program(program, model_feeds(program, args), EVALUATORS)
    want = leaves(anfir.run(compiled, *args))
    outputs = [v.name for v in program.functions["main"].outputs]
    assert len(outputs) == len(want)
    for name, w in zip(outputs, want):
        np.testing.assert_allclose(got[name].astype(np.float64).reshape(w.shape), w, rtol=RTOL,
                                   atol=ATOL, err_msg=name)


@pytest.mark.parametrize("entry,args", [
    ("g_cumsum", (VEC,)), ("g_newton", (2.0,)),
    ("g_rnn", (W, U, RNG.randn(4, 2))),
    ("gg_newton", (2.0,)), ("gg_cumsum", (VEC,)),
], ids=["cumsum", "newton", "rnn", "newton-order-2", "cumsum-order-2"])
def test_the_gradient_of_a_loop_exports_loads_and_computes_what_anfir_does(
        entry: str, args: tuple, tmp_path: Path) -> None:
    program = anfir.export_coreml(PROGRAM, entry=entry, args=list(args))
    described = loaded(program, tmp_path, entry)
    # the forward scan and the reversed scan of the gradient
    assert described["op_types"].count("while_loop") >= 2, described["op_types"]
    compiled = anfir.compile(PROGRAM, entry=entry, args=list(args))
    assert_runs_equal(program, compiled, args)
    got = leaves(coreml_export.evaluate(PROGRAM, entry, list(args), EVALUATORS))
    for g, w in zip(got, leaves(anfir.run(compiled, *args))):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


def test_an_rnn_gradient_over_a_symbolic_length_runs_any_length(tmp_path: Path) -> None:
    types = ["f64[3, 3]", "f64[3, 2]", "f64[T, 2]"]
    program = anfir.export_coreml(PROGRAM, entry="g_rnn", args=types)
    described = loaded(program, tmp_path, "g_rnn_T")
    assert described["inputs"][2] == {"name": "xs", "dtype": "FLOAT32", "shape": [None, 2]}
    assert "while_loop" in described["op_types"]
    compiled = anfir.compile(PROGRAM, entry="g_rnn", args=types)
    for steps in (0, 1, 6):
        assert_runs_equal(program, compiled, (W, U, RNG.randn(steps, 2)))


def test_a_tail_recursive_counted_loop_is_a_fori_loop_and_its_gradient_exports(
        tmp_path: Path) -> None:
    program = anfir.export_coreml(PROGRAM, entry="g_halving", args=[0.8, 7])
    described = loaded(program, tmp_path, "g_halving")
    assert described["inputs"] == [{"name": "x", "dtype": "FLOAT32", "shape": [1]},
                                   {"name": "n", "dtype": "INT32", "shape": [1]}]
    assert described["op_types"].count("while_loop") >= 2
    compiled = anfir.compile(PROGRAM, entry="g_halving", args=[0.8, 7])
    for n in (0, 1, 7, 12):  # n is an input of the model: the trip count is dynamic
        assert_runs_equal(program, compiled, (0.8, n))
    got = coreml_export.evaluate(PROGRAM, "g_halving", [0.8, 7], EVALUATORS)
    np.testing.assert_allclose(got, anfir.run(compiled, 0.8, 7), rtol=RTOL)


def test_a_loop_of_the_exported_program_never_folds_at_build_time() -> None:
    # The loop state is seeded through select(live, v, v): no loop variable of any
    # while_loop has a build-time value, which coremltools' while_loop typing needs.
    program = anfir.export_coreml(PROGRAM, entry="g_newton", args=[2.0])
    blocks, loops = [program.functions["main"]], 0
    while blocks:
        for op in blocks.pop().operations:
            blocks.extend(op.blocks)
            if op.op_type == "while_loop":
                loops += 1
                assert all(v.sym_val is None for v in op.loop_vars), op.name
    assert loops >= 2


def test_evaluating_a_loop_that_does_not_end_is_refused_not_hung(
        monkeypatch: pytest.MonkeyPatch) -> None:
    mod = anfir.parse("""
def spin(x) =
  let loop = lambda (y) if y > 0.0 then loop(y + 1.0) else y end in loop(x)
""", filename="spin.anf")
    monkeypatch.setattr(coreml_loops, "MAX_UNROLLED_ITERATIONS", 50)
    with pytest.raises(anfir.AnfirError) as info:
        coreml_export.evaluate(mod, "spin", [1.0])
    assert "did not end" in info.value.render() and info.value.loc is not None
    np.testing.assert_allclose(coreml_export.evaluate(mod, "spin", [-2.0]), -2.0)


NESTED = anfir.parse("""
def nested(xs) =
  scan(lambda (c, x) (fori_loop(0, 3, lambda (i, a) a * 0.5 + x end, c), c * x) end, 1.0, xs)
def g_nested(xs) = grad(lambda (xs) let r = nested(xs) in r[0] + sum(r[1]) end)(xs)
def in_if(x, n) = if x > 0.0 then fori_loop(0, n, lambda (i, a) a * x end, 1.0) else x
def flagged(flags: bool[3], x) = fori_loop(0, 2, lambda (i, a) a + x end, x) + sum(where(flags, 1.0, 0.0))
""", filename="coreml_nested_loops.anf")


@pytest.mark.parametrize("entry,runs", [
    ("g_nested", [(np.array([0.3, -0.5, 0.9]),)]),   # a loop in a loop's body, differentiated
    ("in_if", [(1.5, 4), (-1.5, 4), (0.5, 0)]),        # a loop in a cond branch
    ("flagged", [(np.array([True, False, True]), 2.0)]),  # the first input is a boolean
], ids=["loop-in-loop", "loop-in-cond", "bool-input"])
def test_loops_nested_in_control_flow(entry: str, runs: list, tmp_path: Path) -> None:
    program = anfir.export_coreml(NESTED, entry=entry, args=list(runs[0]))
    assert "while_loop" in loaded(program, tmp_path, entry)["op_types"]
    compiled = anfir.compile(NESTED, entry=entry, args=list(runs[0]))
    for args in runs:
        assert_runs_equal(program, compiled, args)
        got = leaves(coreml_export.evaluate(NESTED, entry, list(args), EVALUATORS))
        for g, w in zip(got, leaves(anfir.run(compiled, *args))):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)

"""Core ML keeps the composites MIL has natively (issue 23): a program's ``sigmoid``,
``gelu``, ``softmax``, ``layer_norm``, ``erf``... export as those MIL ops, not as their
expansion, and the exported program still computes what ``anfir.run`` computes
(coremltools' own value inference of each MIL op, float32 tolerances)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

ct = pytest.importorskip("coremltools",
                         reason='the coreml extra is not installed: pip install -e ".[coreml]"')

import anfir  # noqa: E402
from anfir.interop.coreml import exporter as coreml_export  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

X = np.array([[0.3, -1.7, 2.5, -0.5], [4.0, -3.25, 0.0, 1e-3]])
SCALE = np.array([0.5, 2.0, -1.0, 1.5])
BIAS = np.array([0.1, -0.2, 0.0, 3.0])


def _silu(x: Any) -> np.ndarray:
    """MIL silu has no value inference in coremltools: its documented meaning."""
    x = np.asarray(x)
    return x / (1 + np.exp(-x))


EVALUATORS = {"silu": _silu}

NATIVE_CASES: list[tuple[str, str, list[Any], str, set[str]]] = [
    # (call, parameters, args, the MIL op it must be, MIL ops its expansion would use)
    ("sigmoid(x)", "x: f64[2, 4]", [X], "sigmoid", {"tanh", "exp"}),
    ("gelu(x)", "x: f64[2, 4]", [X], "gelu", {"erf", "tanh"}),
    ('gelu(x, approximate="tanh")', "x: f64[2, 4]", [X], "gelu", {"tanh"}),
    ("softmax(x, axis=1)", "x: f64[2, 4]", [X], "softmax", {"exp", "reduce_sum"}),
    ("layer_norm(x, s, b)", "x: f64[2, 4], s: f64[4], b: f64[4]", [X, SCALE, BIAS], "layer_norm",
     {"reduce_mean", "sqrt"}),
    ("erf(x)", "x: f64[2, 4]", [X], "erf", {"exp"}),
    ("silu(x)", "x: f64[2, 4]", [X], "silu", {"sigmoid", "tanh"}),
    ("softplus(x)", "x: f64[2, 4]", [X], "softplus", {"exp", "log"}),
    ("softsign(x)", "x: f64[2, 4]", [X], "softsign", {"abs", "real_div"}),
    ("elu(x, alpha=0.5)", "x: f64[2, 4]", [X], "elu", {"select", "exp"}),
    ("leaky_relu(x, alpha=0.2)", "x: f64[2, 4]", [X], "leaky_relu", {"select"}),
    ("hard_sigmoid(x)", "x: f64[2, 4]", [X], "sigmoid_hard", {"maximum", "minimum"}),
]


def mil_op_types(program: Any) -> list[str]:
    """Every op type of the MIL program, nested blocks included."""
    found: list[str] = []
    blocks = [program.functions["main"]]
    while blocks:
        block = blocks.pop()
        for op in block.operations:
            found.append(op.op_type)
            blocks.extend(op.blocks)
    return found


@pytest.mark.parametrize("case", NATIVE_CASES, ids=lambda c: c[0].split("(")[0] + ("_tanh" if "tanh" in c[0] else ""))
def test_a_native_composite_is_the_mil_op(case: tuple[str, str, list[Any], str, set[str]]) -> None:
    call, params, args, mil_op, expansion = case
    module = anfir.parse(f"def f({params}) = {call}\n")
    ops = mil_op_types(coreml_export.export_coreml(module, entry="f", args=args))
    assert mil_op in ops, (call, ops)
    assert not expansion & set(ops), (call, ops)
    want = anfir.run(anfir.compile(module, entry="f", args=args), *args)
    got = coreml_export.evaluate(module, "f", args, EVALUATORS)
    np.testing.assert_allclose(np.asarray(got, dtype=float), want, rtol=2e-5, atol=1e-6, err_msg=call)


def test_every_kept_composite_has_a_case() -> None:
    """NATIVE (the composites Core ML keeps) and this list agree: adding one to NATIVE
    needs its case here."""
    named = {case[0].split("(")[0] for case in NATIVE_CASES}
    assert {p.name for p in coreml_export.NATIVE} <= named


def test_a_composite_mil_lacks_is_decomposed_and_computes_the_same() -> None:
    """log_softmax and rms_norm have no MIL op: they reach Core ML expanded (with MIL's
    reduce_max / exp / reduce_sum / log), and compute what anfir does."""
    module = anfir.parse("def f(x: f64[2, 4], s: f64[4]) = log_softmax(x, axis=1) + rms_norm(x, s)\n")
    ops = mil_op_types(coreml_export.export_coreml(module, entry="f", args=[X, SCALE]))
    assert {"reduce_max", "exp", "reduce_sum", "log", "reduce_mean", "sqrt"} <= set(ops), ops
    want = anfir.run(anfir.compile(module, entry="f", args=[X, SCALE]), X, SCALE)
    got = coreml_export.evaluate(module, "f", [X, SCALE], EVALUATORS)
    np.testing.assert_allclose(np.asarray(got, dtype=float), want, rtol=2e-5, atol=1e-6)


def test_the_gradient_of_a_native_composite_exports() -> None:
    """A training graph: layer_norm's forward is MIL's layer_norm, its gradient the
    decomposed helpers; the numbers are anfir's."""
    module = anfir.parse("def f(x: f64[2, 4], s: f64[4], b: f64[4]) = sum(gelu(layer_norm(x, s, b)))\n"
                         "def g(x: f64[2, 4], s: f64[4], b: f64[4]) = grad(f, 1)(x, s, b)\n")
    args = [X, SCALE, BIAS]
    ops = mil_op_types(coreml_export.export_coreml(module, entry="g", args=args))
    assert "layer_norm" in ops and "erf" in ops, ops  # the forward pass, then gelu's derivative
    want = anfir.run(anfir.compile(module, entry="g", args=args), *args)
    got = coreml_export.evaluate(module, "g", args, EVALUATORS)
    np.testing.assert_allclose(np.asarray(got, dtype=float), want, rtol=1e-4, atol=1e-5)

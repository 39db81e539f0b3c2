"""Structured loops in MindIR: ``scan`` and ``fori_loop`` written as while-header graphs
(anfir/passes/loops_as_recursion.py), and counted loops rewritten before AD, so that a
loop's gradient is forward loops of data (MindSpore runs those: tests_mindspore).

Every program is exported, imported back and run by anfir, against the source's own
result and JAX's gradient; the files hold no ``scan``/``fori_loop`` but self-calling
graphs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anfir

jax = pytest.importorskip("jax")
pytest.importorskip("google.protobuf")
import jax.numpy as jnp  # noqa: E402

from anfir.interop.mindir.schema import classes  # noqa: E402
from anfir.passes import loops_as_recursion  # noqa: E402
from anfir.passes.pipeline import compile_program  # noqa: E402
from anfir.primitives.loops import flatten_value  # noqa: E402
import test_counted_loops as counted  # noqa: E402
import test_scan_export as scans  # noqa: E402

jax.config.update("jax_enable_x64", True)


def leaves(value: Any) -> list[np.ndarray]:
    return [np.asarray(v) for v in flatten_value(value)[0]]


def round_trip(mod: Any, entry: str, args: list[Any]) -> tuple[list[np.ndarray], list[np.ndarray], bytes]:
    data = anfir.export_mindir(mod, entry=entry, args=args)
    back = anfir.import_mindir(data)
    return leaves(anfir.run(mod[entry], *args)), leaves(anfir.run(back.entry, *args)), data


def ops_of(data: bytes) -> set[str]:
    model = classes()["ModelProto"]()
    model.ParseFromString(data)
    types = {p.name: p.op_type for p in model.primitives}
    return {types.get(n.op_type[5:], n.op_type) for g in [model.graph, *model.functions] for n in g.node}


def calls_itself(data: bytes) -> bool:
    model = classes()["ModelProto"]()
    model.ParseFromString(data)
    graphs = {g.name: g for g in [model.graph, *model.functions]}
    # a header reaches itself through its step branch (a Partial of the step, or a call)
    edges = {name: {i[5:] if i.startswith("REF::") else i for n in g.node for i in [n.op_type, *n.input]
                    if (i[5:] if i.startswith("REF::") else i) in graphs} for name, g in graphs.items()}
    for start in graphs:
        seen, todo = set(), list(edges[start])
        while todo:
            g = todo.pop()
            if g == start:
                return True
            if g not in seen:
                seen.add(g)
                todo.extend(edges[g])
    return False


SCAN_CASES = [*scans.CASES[:5], ("gg_halving", (0.8,)), ("gg_cumsum", (scans.VEC,))]


@pytest.mark.parametrize("entry, args", SCAN_CASES, ids=[c[0] for c in SCAN_CASES])
def test_scans_and_their_gradients_round_trip_as_while_headers(entry: str, args: tuple[Any, ...]) -> None:
    want, got, data = round_trip(scans.MOD, entry, list(args))
    assert len(want) == len(got)
    for a, b in zip(want, got):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)
    assert calls_itself(data)
    assert {"Switch", "Partial"} <= ops_of(data)  # the header's if: Switch of two closures


LOOPS = anfir.parse("""
def rows(xs, w) =
  let r = scan(lambda (c, p) (c * w + p[0] * p[1], (c, None, p[1] > 0.0)) end, 0.25, (xs, xs * 2.0),
               reverse=true) in
  r[0] + sum(r[1][0])
def g_rows(xs, w) = grad(rows, 0, 1)(xs, w)
def counted(xs) = scan(lambda (c, k) (c + cast(k, "f64") * c, k * 2) end, 1.0, xs)
def no_ys(x) = scan(lambda (c, u) (sin(c) * x, None) end, x, None, length=4)[0]
def nested(x) =
  fori_loop(0, 3, lambda (i, a) fori_loop(0, 4, lambda (j, b) b * x + cast(i + j, "f64") end, a) end, x)
def g_nested(x) = grad(nested)(x)
def bounds(x, lo, hi) = fori_loop(lo, hi, lambda (i, a) a * x + cast(i, "f64") end, x)
""", "loops.anf")


def test_the_rewrite_keeps_what_each_kind_of_loop_computes() -> None:
    xs = np.array([0.3, -0.7, 1.1, 0.4])
    # reverse, a tuple of xs, ys holding a None, a bool and a tuple; its gradient
    for entry, args in [("rows", [xs, 0.8]), ("g_rows", [xs, 0.8]), ("no_ys", [0.6]),
                        ("nested", [0.7]), ("g_nested", [0.7])]:
        want, got, data = round_trip(LOOPS, entry, args)
        for a, b in zip(want, got, strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12, err_msg=entry)
        assert calls_itself(data), entry
    # integer xs and ys (written with masks, not Select: MindSpore's CPU Select has no int64)
    want, got, data = round_trip(LOOPS, "counted", [np.arange(5)])
    assert got[1].dtype == np.int64 and np.array_equal(got[1], 2 * np.arange(5))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    # run-time bounds, including no trip at all
    for lo, hi in [(0, 5), (2, 7), (3, 3), (4, 1)]:
        want, got, _ = round_trip(LOOPS, "bounds", [0.9, lo, hi])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12)


def test_the_nested_gradient_equals_jax() -> None:
    def nested(x: Any) -> Any:
        return jax.lax.fori_loop(0, 3, lambda i, a: jax.lax.fori_loop(
            0, 4, lambda j, b: b * x + (i + j).astype(jnp.float64), a), x)
    _, got, _ = round_trip(LOOPS, "g_nested", [0.7])
    np.testing.assert_allclose(got[0], jax.grad(nested)(0.7), rtol=1e-12)


def test_the_pass_leaves_no_structured_loop_and_counts_them() -> None:
    from anfir.interop.mindir.exporter import _phases
    result = compile_program(scans.MOD, entry="g_rnn", args=[scans.W, scans.U, scans.XS],
                             phases=_phases(counted_loops=True))
    assert result.program.stats[loops_as_recursion.STAT] == 2
    assert result.program.stats[loops_as_recursion.LEFT] == 0
    text = anfir.to_text(result.graph)
    assert "scan(" not in text and "fori_loop(" not in text
    np.testing.assert_allclose(anfir.run(result.graph, scans.W, scans.U, scans.XS)[0],
                               anfir.run(scans.MOD["g_rnn"], scans.W, scans.U, scans.XS)[0], rtol=1e-12)


@pytest.mark.parametrize("name", counted.ONE_ARG)
def test_counted_loop_gradients_export_as_forward_loops_and_equal_jax(name: str) -> None:
    entry, args = "g_" + name, counted._args(name)
    want = np.asarray(jax.grad(counted.JAX[name])(*args))
    data = anfir.export_mindir(counted.MOD, entry=entry, args=args)
    got = anfir.run(anfir.import_mindir(data).entry, *args)
    np.testing.assert_allclose(np.asarray(got).reshape(want.shape), want, rtol=1e-12)
    assert calls_itself(data)


@pytest.mark.parametrize("name", ["count_down", "nested", "int_state"])
def test_second_order_counted_loop_gradients_round_trip(name: str) -> None:
    want, got, _ = round_trip(counted.GG, "gg_" + name, [0.7])
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)


def test_a_run_time_trip_count_s_gradient_falls_back_to_tail_recursion() -> None:
    # the backward scan's length is hi - lo, known only at run time: the program is
    # written without the loops phase (a while header and its recursive backpropagator)
    for n in (-1, 0, 3, 8):
        want, got, data = round_trip(counted.MOD, "g_bound_parameter", [0.7, n])
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    assert calls_itself(data)

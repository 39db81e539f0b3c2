"""The op library's operators without a MindIR rule before (reductions, elementwise and
integer ops, argmax/argmin, cumsum...): each exports to MindIR, imports back and computes
anfir's own numbers, edge cases included (tests/mindir_op_cases.py).  That MindSpore's
runtime computes them too is tests_mindspore/test_mindspore_ops.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import anfir  # noqa: E402
from anfir.primitives.loops import flatten_value  # noqa: E402
from mindir_op_cases import CASES, SOURCE  # noqa: E402
from export_samples import SAMPLES, A, S  # noqa: E402
from anfir.ir.attrs import NO_ATTRS  # noqa: E402
from anfir.ir.graph import FuncGraph  # noqa: E402
from anfir.ir.nodes import ValueNode  # noqa: E402
from anfir.interop.mindir import MindirError  # noqa: E402
from anfir.interop.mindir.writer import Writer  # noqa: E402
from anfir.ir.manager import manage  # noqa: E402
from anfir.location import Location  # noqa: E402
from anfir.primitives import arith, elementwise, gradient, reduce, tensor  # noqa: E402


def leaves(value: Any) -> list[np.ndarray]:
    """The non-tuple items of a nested value, in order."""
    return [np.asarray(v) for v in flatten_value(value)[0]]


@pytest.fixture(scope="module")
def module() -> Any:
    return anfir.parse(SOURCE)


@pytest.mark.parametrize("entry", list(CASES))
def test_each_operator_round_trips_with_anfirs_numbers(module: Any, entry: str) -> None:
    args = CASES[entry]
    back = anfir.import_mindir(anfir.export_mindir(module, entry=entry, args=list(args)))
    want, got = leaves(anfir.run(module[entry], *args)), leaves(anfir.run(back.entry, *args))
    assert len(want) == len(got)
    for k, (a, b) in enumerate(zip(want, got)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{entry} result {k}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12, equal_nan=True, err_msg=f"{entry} result {k}")


MINE = [reduce.max_, reduce.min_, reduce.prod, reduce.all_, reduce.any_, reduce.argmax, reduce.argmin, reduce.cumsum,
        elementwise.square, elementwise.round_, elementwise.floor_div, elementwise.mod, elementwise.fmod,
        elementwise.isnan, elementwise.isinf, elementwise.logical_xor, elementwise.bitwise_and,
        elementwise.bitwise_or, elementwise.bitwise_xor, elementwise.bitwise_not, elementwise.bit_shift,
        tensor.zeros, tensor.ones]
"""The primitives this file's rules added (the ONNX rule test's samples are run through each)."""


def one_call(prim: Any, args: tuple[Any, ...]) -> tuple[FuncGraph, list[Any], dict[str, Any]]:
    """A graph computing ``prim(*args)`` from parameters (``S`` args constants), its feed, its attributes."""
    graph = FuncGraph(f"one_{prim.name}")
    given = args[-1].attrs if args and isinstance(args[-1], A) else {}
    inputs: list[Any] = []
    feed: list[Any] = []
    for arg in args:
        if isinstance(arg, A):
            continue
        if isinstance(arg, S):
            inputs.append(ValueNode(arg.value))
        else:
            inputs.append(graph.add_parameter(f"a{len(feed)}"))
            feed.append(arg)
    graph.output = graph.apply(prim, *inputs, attrs=prim.canonical_attrs(given) if given else NO_ATTRS)
    return graph, feed, given


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the samples divide by 0 on purpose
@pytest.mark.parametrize("prim", MINE, ids=lambda p: p.name)
def test_the_onnx_rule_samples_round_trip(prim: Any) -> None:
    samples = SAMPLES.get(prim)
    assert samples, prim.name
    for args in samples:
        graph, feed, given = one_call(prim, args)
        want = prim.impl(*[a.value if isinstance(a, S) else a for a in args if not isinstance(a, A)], **given)
        back = anfir.import_mindir(anfir.export_mindir(graph, args=feed))
        got = np.asarray(anfir.run(back.entry, *feed))
        where = f"{prim.name}{tuple(np.shape(a) for a in feed)} {given}"
        assert got.shape == np.shape(want), where
        assert got.dtype == np.asarray(want).dtype or not isinstance(want, np.ndarray), where
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-6, equal_nan=True, err_msg=where)


def test_j_of_a_function_is_a_located_error_with_its_reason() -> None:
    # what the optimizer would leave of a gradient it could not expand: J of a graph
    f = FuncGraph("f")
    f.output = f.apply(arith.sin, f.add_parameter("x"))
    g = FuncGraph("g")
    g.add_parameter("y")
    g.output = g.apply(gradient.J, ValueNode(f), loc=Location("left.anf", 3, 7))
    manage(g)
    with pytest.raises(MindirError) as info:
        Writer(None).run(g)
    assert "J of a function was left by the optimizer" in str(info.value)
    assert "left.anf:3:7" in str(info.value)

"""The decomposition table (anfir/decompositions/) and its pass (anfir/passes/decompose.py):
every expansion computes its primitive on the exporters' samples (against the primitive's
own numpy evaluation), leaves no decomposed call behind, types every node it makes, and
declines — leaving the call — where it needs a static fact it does not have."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anfir
from anfir.abstract.lattice import abstract_of_value
from anfir.decompositions import DECOMPOSITIONS
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import manage
from anfir.ir.nodes import CNode, ValueNode
from anfir.ir.primitive import Primitive
from anfir.passes.decompose import decompose
from anfir.passes.specialize import infer_call
from anfir.primitives import PRIMITIVES, nn
from export_samples import SAMPLES, A, S


def one_call_graph(prim: Primitive, args: tuple[Any, ...]) -> tuple[FuncGraph, list[Any], dict[str, Any]]:
    """A typed graph computing ``prim(*args)`` from parameters (``S`` args are constants)."""
    graph = FuncGraph(f"one_{prim.name}")
    given = args[-1].attrs if args and isinstance(args[-1], A) else {}
    inputs: list[Any] = []
    feed: list[Any] = []
    for arg in args:
        if isinstance(arg, A):
            continue
        if isinstance(arg, S):
            node: Any = ValueNode(arg.value)
            node.abstract = abstract_of_value(arg.value)
        else:
            node = graph.add_parameter(f"a{len(feed)}")
            node.abstract = abstract_of_value(arg)
            feed.append(arg)
        inputs.append(node)
    callee = ValueNode(prim)
    callee.abstract = abstract_of_value(prim)
    attrs = prim.canonical_attrs(given)
    call = CNode(graph, [callee, *inputs], None, None, attrs)
    call.abstract = infer_call(callee.abstract, [i.abstract for i in inputs], None, attrs)
    graph.output = call
    manage(graph)
    return graph, feed, given


def called(graph: FuncGraph) -> list[Primitive]:
    """The primitives the graph's nodes call."""
    assert graph.manager is not None
    found = []
    for nodes in graph.manager.nodes.values():
        for node in nodes:
            if isinstance(node, CNode) and isinstance(node.inputs[0], ValueNode) \
                    and isinstance(node.inputs[0].value, Primitive):
                found.append(node.inputs[0].value)
                assert node.abstract is not None, f"an untyped node: {node}"
    return found


def _raw(arg: Any) -> Any:
    return arg.value if isinstance(arg, S) else arg


def test_the_table_is_keyed_by_primitive_objects() -> None:
    assert DECOMPOSITIONS and all(isinstance(p, Primitive) for p in DECOMPOSITIONS)


def test_an_f32_expansion_stays_f32() -> None:
    """Constants inside an expansion take the call's dtype (a where of two Python floats
    would be f64): atan2 and the activations of f32 tensors give f32."""
    y = np.array([1.0, -1.0, 0.0, 0.0, 2.0], np.float32)
    x = np.array([0.0, 0.0, -1.0, 1.0, -3.0], np.float32)
    for prim, args in ((PRIMITIVES["atan2"], (y, x)), (PRIMITIVES["selu"], (y,)),
                       (PRIMITIVES["gelu"], (y,)), (PRIMITIVES["logsumexp"], (y,))):
        graph, feed, _ = one_call_graph(prim, args)
        decompose(graph, frozenset())
        assert prim not in called(graph)
        got = anfir.run(graph, *feed)
        assert np.asarray(got).dtype == np.float32, prim.name
        np.testing.assert_allclose(got, prim.impl(*args), rtol=1e-6, atol=1e-6)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("prim", sorted(DECOMPOSITIONS, key=lambda p: p.name), ids=lambda p: p.name)
def test_each_decomposition_computes_its_primitive(prim: Primitive) -> None:
    samples = SAMPLES.get(prim)
    assert samples, f"add sample arguments for {prim.name} to export_samples.SAMPLES"
    for args in samples:
        graph, feed, given = one_call_graph(prim, args)
        want = prim.impl(*[_raw(a) for a in args if not isinstance(a, A)], **given)
        decompose(graph, frozenset())
        left = [p for p in called(graph) if p in DECOMPOSITIONS]
        assert not left, f"{prim.name}{given}: still calls {left}"
        got = anfir.run(graph, *feed)
        where = f"{prim.name}{tuple(np.shape(_raw(a)) for a in args if not isinstance(a, A))} {given}"
        w, g = np.asarray(want), np.asarray(got)
        assert w.shape == g.shape, where
        assert g.dtype == w.dtype or not isinstance(want, np.ndarray), (where, g.dtype, w.dtype)
        single = w.dtype in (np.float32, np.float16)
        np.testing.assert_allclose(g.astype(float), w.astype(float), rtol=1e-5 if single else 1e-9,
                                   atol=1e-6 if single else 1e-12, equal_nan=True, err_msg=where)


def test_a_kept_primitive_stays() -> None:
    x = np.arange(6.0).reshape(2, 3)
    graph, feed, _ = one_call_graph(nn.softmax, (x, A(axis=1)))
    decompose(graph, frozenset({nn.softmax}))
    assert called(graph) == [nn.softmax]
    np.testing.assert_allclose(anfir.run(graph, *feed), nn.softmax.impl(x, axis=1))


def test_an_expansion_uses_other_composites_and_expands_them_too() -> None:
    """cross_entropy expands to log_softmax; kept, it stays; else it is expanded in turn."""
    x, t = np.array([[0.5, -1.0, 2.0], [1.0, 0.0, -3.0]]), np.array([2, 0])
    graph, _, _ = one_call_graph(nn.cross_entropy, (x, t))
    decompose(graph, frozenset({nn.log_softmax}))
    assert nn.log_softmax in called(graph) and nn.cross_entropy not in called(graph)
    graph, feed, _ = one_call_graph(nn.cross_entropy, (x, t))
    decompose(graph, frozenset())
    assert not set(called(graph)) & set(DECOMPOSITIONS)
    np.testing.assert_allclose(anfir.run(graph, *feed), nn.cross_entropy.impl(x, t))


def test_an_expansion_that_needs_a_static_shape_declines() -> None:
    """A causal attention over symbolic sequence lengths: the call stays as it was."""
    mod = anfir.parse("def f(q: f64[B, L, 4], k: f64[B, L, 4], v: f64[B, L, 4]) = "
                      "attention(q, k, v, causal=true)\n")
    graph = anfir.compile(mod, entry="f")
    decompose(graph, frozenset())
    assert nn.attention in called(graph)


def test_the_pass_is_linear_in_the_number_of_composites() -> None:
    """A chain of 2000 softmaxes decomposes (no recursion on program size), every one."""
    body = "\n".join(f"  let y{i + 1} = softmax(y{i}, axis=1) in" for i in range(2000))
    mod = anfir.parse(f"def f(y0: f64[2, 3]) =\n{body}\n  y2000\n")
    graph = anfir.compile(mod, entry="f")
    decompose(graph, frozenset())
    assert nn.softmax not in called(graph)
    x = np.array([[0.5, -1.0, 2.0], [1.0, 0.0, -3.0]])
    want = x
    for _ in range(2000):
        want = nn.softmax.impl(want, axis=1)
    np.testing.assert_allclose(anfir.run(graph, x), want)


def test_a_loss_over_a_symbolic_class_count_decomposes_and_exports() -> None:
    """The one-hot of a loss counts its classes at run time when the class axis is symbolic:
    the ONNX model of cross_entropy over f64[B, C] computes anfir's value (onnxruntime)."""
    ort = pytest.importorskip("onnxruntime")
    from anfir.interop.onnx import exporter as onnx_export
    mod = anfir.parse("def f(x: f64[B, C], t: i64[B]) = cross_entropy(x, t)\n")
    graph = anfir.compile(mod, entry="f")
    decompose(graph, frozenset())
    assert not set(called(graph)) & set(DECOMPOSITIONS)
    model = onnx_export.export_onnx(mod, entry="f")
    session = ort.InferenceSession(model.SerializeToString())
    for x, t in ((np.random.default_rng(1).normal(size=(3, 5)), np.array([1, 4, 0])),
                 (np.random.default_rng(2).normal(size=(2, 7)), np.array([6, 2]))):
        (got,) = session.run(None, onnx_export.onnx_inputs(model, x, t))
        np.testing.assert_allclose(got, nn.cross_entropy.impl(x, t), rtol=1e-12)


_R = np.random.default_rng(5)
SYMBOLIC = {
    "attention over a symbolic E (the default scale at run time)":
        ("def f(q: f64[2, L, E], k: f64[2, L, E], v: f64[2, L, E]) = attention(q, k, v)\n",
         [_R.normal(size=(2, 3, 4))] * 3),
    "group_norm over a symbolic batch":
        ("def f(x: f64[N, 4, 3], s: f64[4], b: f64[4]) = group_norm(x, 2, s, b)\n",
         [_R.normal(size=(2, 4, 3)), _R.normal(size=4), _R.normal(size=4)]),
    "cumprod along a symbolic axis":
        ("def f(x: f64[2, L]) = cumprod(x, axis=1, exclusive=true, reverse=true)\n",
         [_R.normal(size=(2, 5))]),
    "prod's gradient over a symbolic batch":
        ("def g(x: f64[B, 3]) = sum(prod(x, axis=1))\ndef f(x: f64[B, 3]) = grad(g)(x)\n",
         [_R.normal(size=(4, 3))]),
}


@pytest.mark.parametrize("case", sorted(SYMBOLIC))
def test_expansions_over_symbolic_dimensions_compute_at_run_time(case: str) -> None:
    """Where a dimension is symbolic an expansion reads it at run time (shape, arange)
    instead of declining: the ONNX model computes anfir's values (onnxruntime)."""
    ort = pytest.importorskip("onnxruntime")
    from anfir.interop.onnx import exporter as onnx_export
    text, args = SYMBOLIC[case]
    mod = anfir.parse(text)
    graph = anfir.compile(mod, entry="f")
    decompose(graph, frozenset())
    assert not set(called(graph)) & set(DECOMPOSITIONS), case
    model = onnx_export.export_onnx(mod, entry="f")
    (got,) = ort.InferenceSession(model.SerializeToString()).run(
        None, onnx_export.onnx_inputs(model, *args))
    want = anfir.run(anfir.compile(mod, entry="f", args=args), *args)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=case)


@pytest.mark.parametrize("target", ["onnx", "coreml"])
def test_a_declined_expansion_is_reported_as_declined_with_its_reason(target: str) -> None:
    """An exporter without a rule for a composite whose expansion declined says that it
    declined and why (the pass's reason), located at the call — not "no rule"."""
    pytest.importorskip("onnx" if target == "onnx" else "coremltools")
    from anfir.errors import ExportError
    mod = anfir.parse("def f(q: f64[B, L, 4], k: f64[B, L, 4], v: f64[B, L, 4]) =\n"
                      "  attention(q, k, v, causal=true)\n", filename="causal.anf")
    if target == "onnx":
        from anfir.interop.onnx.exporter import export_onnx as export
    else:
        from anfir.interop.coreml.exporter import export_coreml as export
    with pytest.raises(ExportError) as info:
        export(mod, entry="f")
    text = str(info.value)
    assert "attention" in text and "declined: a causal attention needs known sequence lengths" in text
    assert "no ONNX rule" not in text and "no MIL rule" not in text
    assert "causal.anf:2" in text

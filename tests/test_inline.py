"""The inline phase: which calls are inlined, and that values and types survive."""

from __future__ import annotations

import numpy as np

import anfir
from anfir.abstract.values import AScalar
from anfir.ir import CNode, FuncGraph, Location, Manager, ValueNode
from anfir.passes.inline import INLINE_THRESHOLD, inline_calls, scope_size
from anfir.primitives import PRIMITIVES as P

F64 = AScalar("f64")


def _chain_graph(name: str, length: int) -> FuncGraph:
    """``name(y) = y + 1 + 1 + ...`` (``length`` adds)."""
    g = FuncGraph(name)
    node = g.add_parameter("y")
    for _ in range(length):
        node = g.apply(P["add"], node, 1.0)
    g.output = node
    return g


def _calls_to(manager: Manager, graph: FuncGraph) -> int:
    return len(manager.call_sites(graph)) if graph in manager.graphs else 0


def test_graph_called_once_is_inlined_even_when_big() -> None:
    big = _chain_graph("big", INLINE_THRESHOLD * 3)
    f = FuncGraph("f")
    x = f.add_parameter("x")
    f.output = f.apply(P["mul"], f.apply(big, x), 2.0)
    before = anfir.run(f, 1.5)
    m = Manager([f])
    assert inline_calls(m) == 1
    assert big not in m.graphs  # the only caller is gone, so is the graph
    assert list(m.graphs) == [f]
    assert anfir.run(f, 1.5) == before == (1.5 + INLINE_THRESHOLD * 3) * 2.0


def test_small_graph_called_twice_is_inlined_big_one_is_not() -> None:
    small = _chain_graph("small", 2)
    big = _chain_graph("big", INLINE_THRESHOLD + 1)
    f = FuncGraph("f")
    x = f.add_parameter("x")
    s1, s2 = f.apply(small, x), f.apply(small, f.apply(P["neg"], x))
    b1, b2 = f.apply(big, x), f.apply(big, s1)
    f.output = f.apply(P["make_tuple"], s1, s2, b1, b2)
    before = anfir.run(f, 0.5)
    m = Manager([f])
    assert scope_size(m, big) == INLINE_THRESHOLD + 1
    assert inline_calls(m) == 2
    assert _calls_to(m, small) == 0
    assert _calls_to(m, big) == 2
    assert anfir.run(f, 0.5) == before


def test_recursive_graph_is_not_inlined() -> None:
    # loop(n) = if n < 1 then 0.0 else loop(n - 1)
    loop = FuncGraph("loop")
    n = loop.add_parameter("n")
    yes = FuncGraph("yes")
    yes.output = ValueNode(0.0)
    no = FuncGraph("no")
    no.output = no.apply(loop, no.apply(P["sub"], n, 1))
    loop.output = loop.apply(loop.apply(P["switch"], loop.apply(P["lt"], n, 1), yes, no))
    f = FuncGraph("f")
    x = f.add_parameter("x")
    f.output = f.apply(loop, x)
    m = Manager([f])
    assert m.is_recursive(loop)
    inline_calls(m)
    assert _calls_to(m, loop) >= 1  # still called, never copied into itself
    assert loop in m.graphs
    assert anfir.run(f, 5) == 0.0


def test_closure_inside_inlined_graph_keeps_its_free_variables() -> None:
    # outer(a) = (lambda (c) a * c end)(a + 1.0) ; the lambda is nested in outer
    outer = FuncGraph("outer")
    a = outer.add_parameter("a")
    lam = FuncGraph("lam")
    c = lam.add_parameter("c")
    lam.output = lam.apply(P["mul"], a, c)  # a is a free variable of lam
    outer.output = outer.apply(P["make_tuple"], lam, outer.apply(P["add"], a, 1.0))
    f = FuncGraph("f")
    x = f.add_parameter("x")
    pair = f.apply(outer, x)
    fn = f.apply(P["tuple_getitem"], pair, 0)
    arg = f.apply(P["tuple_getitem"], pair, 1)
    f.output = f.apply(fn, arg)
    before = anfir.run(f, 3.0)
    m = Manager([f])
    assert inline_calls(m) == 1
    assert outer not in m.graphs
    # The copy of the lambda now captures f's copy of ``a``, i.e. f's parameter.
    (copy,) = [g for g in m.graphs if g is not f]
    assert m.parent(copy) is f
    assert m.free_variables_total(copy) == [x]
    assert anfir.run(f, 3.0) == before == 12.0


def test_inlining_reaches_a_fixed_point_through_nested_calls() -> None:
    h = _chain_graph("h", 1)
    g = FuncGraph("g")
    y = g.add_parameter("y")
    g.output = g.apply(h, g.apply(h, y))  # h called twice, but small
    f = FuncGraph("f")
    x = f.add_parameter("x")
    f.output = f.apply(g, x)
    m = Manager([f])
    assert inline_calls(m) == 3  # g into f, then both copied calls of h
    assert list(m.graphs) == [f]
    assert not any(isinstance(n, CNode) and isinstance(n.inputs[0], ValueNode)
                   and isinstance(n.inputs[0].value, FuncGraph) for n in f.nodes())
    assert anfir.run(f, 1.0) == 3.0


def test_inlined_nodes_keep_types_and_locations() -> None:
    loc = Location("t.anf", 3, 5, "let z = y * y in")
    g = FuncGraph("g")
    y = g.add_parameter("y")
    y.abstract = F64
    sq = g.apply(P["mul"], y, y, loc=loc, name="z")
    sq.abstract = F64
    g.output = sq
    f = FuncGraph("f")
    x = f.add_parameter("x")
    x.abstract = F64
    call = f.apply(g, x)
    call.abstract = F64
    f.output = f.apply(P["add"], call, call)
    m = Manager([f])
    inline_calls(m)
    copies = [n for n in f.nodes() if isinstance(n, CNode) and n.name == "z"]
    assert len(copies) == 1
    (copy,) = copies
    assert copy.abstract == F64
    assert copy.loc is not None and copy.loc.line == 3 and copy.loc.note == "inline"
    assert copy.inputs[1] is x
    assert anfir.run(f, np.float64(2.0)) == 8.0

"""The evaluator: semantics, closures, tail calls, deep recursion, errors, memory.

Graphs are built with the Python IR API (so these tests do not depend on the
parser); the spec's examples are also run through ``anfir.parse`` at the end.
"""

from __future__ import annotations

import sys
import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import anfir
import programs
from anfir.errors import (AnfirError, AnfirRuntimeError, AnfirTypeError, ArityError,
                          IRConsistencyError, ShapeError)
from anfir.eval import call_function, code_for, disassemble, run
from anfir.eval.opcodes import BRANCH, F1, F2, K2, K2L, P2, RET, TBRANCH, TCALLG
from anfir.ir import CNode, FuncGraph, Location, Module, ValueNode
from anfir.primitives import META_FUNCTIONS, PRIMITIVES, MetaFunction
from anfir.runtime_values import Closure, Partial
from spec_examples import CLOSURE, FIBONACCI, HOF, MLP, PAPER, POWER

P = PRIMITIVES


def loc(line: int, col: int = 1, text: str = "some source line") -> Location:
    return Location("t.anf", line, col, text)


def if_(g: FuncGraph, cond: Any, then_g: FuncGraph, else_g: FuncGraph, *, name: str = "") -> CNode:
    """``switch(cond, ✓, ✗)()`` in ``g``, as the parser builds ``if``."""
    return g.apply(g.apply(P["switch"], cond, ValueNode(then_g), ValueNode(else_g)))


def const_graph(name: str, value: Any) -> FuncGraph:
    g = FuncGraph(name)
    g.output = ValueNode(value)
    return g


# -- graphs of the spec's examples, built by hand --------------------------------------
def paper_main() -> FuncGraph:
    """The MindIR paper's lambda: ``main(5.0, 2.0) == 4.0``."""
    main = FuncGraph("main")
    x = main.add_parameter("x")
    y = main.add_parameter("y")
    func = FuncGraph("func")
    fx = func.add_parameter("x")
    fy = func.add_parameter("y")
    func.output = func.apply(P["div"], fx, fy)
    a = main.apply(P["sub"], x, 1)
    b = main.apply(P["add"], a, y)
    r1 = main.apply(ValueNode(func), a, b)
    main.output = main.apply(P["mul"], b, r1)
    return main


def hof_graph() -> FuncGraph:
    """``hof(2.0) == 25.0``: functions passed as values, called dynamically."""
    hof = FuncGraph("hof")
    x = hof.add_parameter("x")
    f = FuncGraph("f")
    fx = f.add_parameter("x")
    f.output = f.apply(P["add"], fx, 3)
    g = FuncGraph("g")
    fn = g.add_parameter("function")
    gx = g.add_parameter("x")
    g.output = g.apply(P["mul"], g.apply(fn, gx), g.apply(fn, gx))
    hof.output = hof.apply(ValueNode(g), ValueNode(f), x)
    return hof


def fibonacci_graph() -> FuncGraph:
    fib = FuncGraph("fibonacci")
    n = fib.add_parameter("n")
    else1 = FuncGraph("✗fibonacci")
    else2 = FuncGraph("✗✗fibonacci")
    a = else2.apply(ValueNode(fib), else2.apply(P["sub"], n, 1))
    b = else2.apply(ValueNode(fib), else2.apply(P["sub"], n, 2))
    else2.output = else2.apply(P["add"], a, b)
    else1.output = if_(else1, else1.apply(P["eq"], n, 1), const_graph("✓✗fibonacci", 1), else2)
    fib.output = if_(fib, fib.apply(P["lt"], n, 1), const_graph("✓fibonacci", 0), else1)
    return fib


def closure_module() -> Module:
    """``func_outer(a, b) = lambda (c) a + b + c end``; ``ms_closure() == (4, 5)``."""
    outer = FuncGraph("func_outer")
    a = outer.add_parameter("a")
    b = outer.add_parameter("b")
    lam = FuncGraph("lambda")
    c = lam.add_parameter("c")
    lam.output = lam.apply(P["add"], lam.apply(P["add"], a, b), c)
    outer.output = ValueNode(lam)
    ms = FuncGraph("ms_closure")
    clo = ms.apply(ValueNode(outer), 1, 2)
    ms.output = ms.apply(P["make_tuple"], ms.apply(clo, 1), ms.apply(clo, 2))
    return Module({"func_outer": outer, "ms_closure": ms})


def power_graph() -> FuncGraph:
    """``power(x, n)``: a local tail-recursive ``loop`` closing over ``x`` and ``n``."""
    power = FuncGraph("power")
    x = power.add_parameter("x")
    n = power.add_parameter("n")
    loop = FuncGraph("loop")
    i = loop.add_parameter("i")
    acc = loop.add_parameter("acc")
    then_g = FuncGraph("✓loop")
    then_g.output = then_g.apply(ValueNode(loop), then_g.apply(P["add"], i, 1),
                                 then_g.apply(P["mul"], acc, x))
    else_g = FuncGraph("✗loop")
    else_g.output = acc
    loop.output = if_(loop, loop.apply(P["lt"], i, n), then_g, else_g)
    power.output = power.apply(ValueNode(loop), 0, 1.0)
    return power


def counting_loop() -> FuncGraph:
    """``count(i, n, acc) = if i < n then count(i + 1, n, acc + i) else acc`` (top-level tail calls)."""
    g = FuncGraph("count")
    i = g.add_parameter("i")
    n = g.add_parameter("n")
    acc = g.add_parameter("acc")
    then_g = FuncGraph("✓count")
    then_g.output = then_g.apply(ValueNode(g), then_g.apply(P["add"], i, 1), n,
                                 then_g.apply(P["add"], acc, i))
    else_g = FuncGraph("✗count")
    else_g.output = acc
    g.output = if_(g, g.apply(P["lt"], i, n), then_g, else_g)
    return g


def recursive_sum() -> FuncGraph:
    """``rsum(n) = if n == 0 then 0 else n + rsum(n - 1)`` — not a tail call."""
    g = FuncGraph("rsum")
    n = g.add_parameter("n")
    else_g = FuncGraph("✗rsum")
    else_g.output = else_g.apply(P["add"], n, else_g.apply(ValueNode(g), else_g.apply(P["sub"], n, 1)))
    g.output = if_(g, g.apply(P["eq"], n, 0), const_graph("✓rsum", 0), else_g)
    return g


def mlp_loss_graph() -> FuncGraph:
    g = FuncGraph("mlp_loss")
    w1, w2, x, y = (g.add_parameter(p) for p in ("w1", "w2", "x", "y"))
    h = g.apply(P["tanh"], g.apply(P["matmul"], x, w1))
    out = g.apply(P["matmul"], h, w2)
    sq = g.apply(P["pow"], g.apply(P["sub"], out, y), 2)
    g.output = g.apply(P["div"], g.apply(P["sum"], sq), 2)
    return g


# -- the examples ---------------------------------------------------------------------
def test_paper_lambda() -> None:
    assert run(paper_main(), 5.0, 2.0) == 4.0


def test_higher_order_functions() -> None:
    assert run(hof_graph(), 2.0) == 25.0


def test_fibonacci_stays_int() -> None:
    fib = fibonacci_graph()
    result = run(fib, 10)
    assert result == 55 and type(result) is int
    assert run(fib, 20) == 6765
    assert run(fib, 0) == 0 and run(fib, -3) == 0


def test_fibonacci_if_is_fused_into_a_tail_branch() -> None:
    fib = fibonacci_graph()
    kinds = [ins[0] for ins in code_for(fib).instrs]
    assert kinds == [K2, TBRANCH]  # n < 1 with its fast path, then the fused if
    assert "tbranch" in disassemble(fib) and "k2       r1 = lt(r0, 1)" in disassemble(fib)


def test_closures_from_func_outer() -> None:
    mod = closure_module()
    assert run(mod["ms_closure"]) == (4, 5)
    clo = run(mod["func_outer"], 10, 20)
    assert isinstance(clo, Closure) and clo.env == (10, 20)
    assert call_function(clo, (3,)) == 33


def test_power_loop() -> None:
    power = power_graph()
    assert run(power, 2.0, 3) == 8.0
    assert run(power, 3.0, 0) == 1.0
    assert run(power, 1.0000001, 100_000) == pytest.approx(1.0000001 ** 100_000)


def test_mlp_loss_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    w1, w2 = rng.normal(size=(3, 4)), rng.normal(size=(4, 2))
    x, y = rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    expected = np.sum((np.tanh(x @ w1) @ w2 - y) ** 2) / 2
    assert run(mlp_loss_graph(), w1, w2, x, y) == pytest.approx(expected, rel=1e-12)


def test_run_accepts_a_module() -> None:
    mod = Module({"main": paper_main(), "hof": hof_graph()})
    assert anfir.run(mod, 5.0, 2.0) == 4.0


# -- tail calls, deep recursion, memory -------------------------------------------------
def test_tail_loop_of_100000_steps() -> None:
    g = counting_loop()
    assert code_for(if_graph_then(g)).instrs[-1][0] == TCALLG
    assert run(g, 0, 100_000, 0) == sum(range(100_000))


def if_graph_then(g: FuncGraph) -> FuncGraph:
    switch = g.output.inputs[0]
    return switch.inputs[2].value


def test_deep_non_tail_recursion_at_default_limit() -> None:
    assert sys.getrecursionlimit() <= 10_000
    assert run(recursive_sum(), 50_000) == 50_000 * 50_001 // 2


def test_mutual_recursion() -> None:
    even = FuncGraph("even")
    odd = FuncGraph("odd")
    n_even = even.add_parameter("n")
    n_odd = odd.add_parameter("n")
    for g, n, other, base in ((even, n_even, odd, True), (odd, n_odd, even, False)):
        else_g = FuncGraph(f"✗{g.name}")
        else_g.output = else_g.apply(ValueNode(other), else_g.apply(P["sub"], n, 1))
        g.output = if_(g, g.apply(P["eq"], n, 0), const_graph(f"✓{g.name}", base), else_g)
    assert run(even, 10_001) is False
    assert run(odd, 10_001) is True


def _peak_bytes(g: FuncGraph, steps: int) -> int:
    run(g, 0, 10, 0)  # compile outside the measurement
    tracemalloc.start()
    try:
        run(g, 0, steps, 0)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_tail_loop_memory_is_flat() -> None:
    g = counting_loop()
    small = _peak_bytes(g, 5_000)
    large = _peak_bytes(g, 50_000)
    assert large < 2 * small + 4096, (small, large)


def test_closure_loop_memory_is_flat() -> None:
    power = power_graph()
    run(power, 1.0, 2)
    peaks = []
    for steps in (5_000, 50_000):
        tracemalloc.start()
        run(power, 1.0, steps)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert peaks[1] < 2 * peaks[0] + 4096, peaks


# -- closures, partial, function values ----------------------------------------------------
def test_closures_capture_by_value() -> None:
    # make_adders(k) = (adder(k), adder(k + 1)) where adder(j) = lambda (x) x + j end
    adder = FuncGraph("adder")
    j = adder.add_parameter("j")
    lam = FuncGraph("lam")
    lx = lam.add_parameter("x")
    lam.output = lam.apply(P["add"], lx, j)
    adder.output = ValueNode(lam)
    mk = FuncGraph("make_adders")
    k = mk.add_parameter("k")
    first = mk.apply(ValueNode(adder), k)
    second = mk.apply(ValueNode(adder), mk.apply(P["add"], k, 1))
    mk.output = mk.apply(P["make_tuple"], mk.apply(first, 100), mk.apply(second, 100), first)
    out = run(mk, 1)
    assert out[:2] == (101, 102)
    assert out[2].env == (1,) and call_function(out[2], (5,)) == 6


def test_nested_closures_pass_captures_through() -> None:
    # outer(a) = let mid = lambda (b) lambda (c) a * 100 + b * 10 + c end end in mid(2)(3)
    outer = FuncGraph("outer")
    a = outer.add_parameter("a")
    mid = FuncGraph("mid")
    b = mid.add_parameter("b")
    inner = FuncGraph("inner")
    c = inner.add_parameter("c")
    hundred = inner.apply(P["mul"], a, 100)
    inner.output = inner.apply(P["add"], inner.apply(P["add"], hundred, inner.apply(P["mul"], b, 10)), c)
    mid.output = ValueNode(inner)
    outer.output = outer.apply(outer.apply(ValueNode(mid), 2), 3)
    assert run(outer, 1) == 123
    assert code_for(mid).nfree == 1  # mid carries `a` for the closure it makes


def test_closure_capturing_a_computed_node() -> None:
    # f(x) = let s = x * 2 in let g = lambda (y) s + y end in g(1) + g(2)
    f = FuncGraph("f")
    x = f.add_parameter("x")
    s = f.apply(P["mul"], x, 2)
    g = FuncGraph("g")
    y = g.add_parameter("y")
    g.output = g.apply(P["add"], s, y)
    f.output = f.apply(P["add"], f.apply(ValueNode(g), 1), f.apply(ValueNode(g), 2))
    assert run(f, 5) == 23


def test_output_is_a_free_variable_or_parameter_or_constant() -> None:
    outer = FuncGraph("outer")
    a = outer.add_parameter("a")
    lam = FuncGraph("const_a")
    lam.add_parameter("ignored")
    lam.output = a
    outer.output = outer.apply(ValueNode(lam), "x")
    assert run(outer, "kept") == "kept"
    ident = FuncGraph("ident")
    ident.output = ident.add_parameter("v")
    assert run(ident, None) is None
    assert run(const_graph("k", (1, "two", None))) == (1, "two", None)


def test_partial_application() -> None:
    g = FuncGraph("g")
    x = g.add_parameter("x")
    add1 = g.apply(P["partial"], P["add"], 1)
    sub_from = g.apply(P["partial"], P["sub"])
    three = g.apply(P["partial"], P["make_tuple"], 1, 2)
    nested = g.apply(P["partial"], three, 3)
    g.output = g.apply(P["make_tuple"], g.apply(add1, x), g.apply(sub_from, x, 1),
                       g.apply(nested, 4), add1)
    out = run(g, 10)
    assert out[:3] == (11, 9, (1, 2, 3, 4))
    assert isinstance(out[3], Partial) and call_function(out[3], (5,)) == 6


def test_partial_of_a_graph_and_of_a_closure() -> None:
    mod = closure_module()
    adder = run(mod["func_outer"], 1, 2)
    assert call_function(Partial(adder, (4,)), ()) == 7
    assert call_function(Partial(paper_main(), (5.0,)), (2.0,)) == 4.0


def test_primitives_and_graphs_as_values() -> None:
    # apply2(f, a, b) = f(a, b); used with a primitive and with a graph
    apply2 = FuncGraph("apply2")
    f, a, b = (apply2.add_parameter(n) for n in ("f", "a", "b"))
    apply2.output = apply2.apply(f, a, b)
    top = FuncGraph("top")
    top.output = top.apply(P["make_tuple"], top.apply(ValueNode(apply2), P["mul"], 6, 7),
                           top.apply(ValueNode(apply2), ValueNode(paper_main()), 5.0, 2.0),
                           P["add"], ValueNode(apply2))
    out = run(top)
    assert out[:2] == (42, 4.0)
    assert out[2] is P["add"] and out[3] is apply2


def test_switch_as_a_value_and_dynamic_branch() -> None:
    # pick(c) = let f = switch(c, inc, dec) in (f(10), f)   -- the switch has two users
    inc = FuncGraph("inc")
    inc.output = inc.apply(P["add"], inc.add_parameter("v"), 1)
    dec = FuncGraph("dec")
    dec.output = dec.apply(P["sub"], dec.add_parameter("v"), 1)
    pick = FuncGraph("pick")
    c = pick.add_parameter("c")
    f = pick.apply(P["switch"], c, ValueNode(inc), ValueNode(dec))
    pick.output = pick.apply(P["make_tuple"], pick.apply(f, 10), f)
    assert run(pick, True) == (11, inc)
    assert run(pick, np.bool_(False)) == (9, dec)
    # switch(c, inc, dec)(v) alone: fused, the argument passed to the chosen graph
    call = FuncGraph("call")
    cc = call.add_parameter("c")
    call.output = call.apply(call.apply(P["switch"], cc, ValueNode(inc), ValueNode(dec)),
                             call.add_parameter("v"))
    assert [ins[0] for ins in code_for(call).instrs] == [TBRANCH]
    assert (run(call, True, 1), run(call, False, 1)) == (2, 0)
    # a switch on plain values
    sel = FuncGraph("sel")
    sel.output = sel.apply(P["switch"], sel.add_parameter("c"), "yes", "no")
    assert run(sel, False) == "no"


def test_branch_on_numpy_bool_and_non_tail_branch() -> None:
    # f(x) = (if sum(x) > 0 then 1 else -1) * 10   -- the branch result is used
    f = FuncGraph("f")
    x = f.add_parameter("x")
    cond = f.apply(P["gt"], f.apply(P["sum"], x), 0)
    chosen = if_(f, cond, const_graph("✓f", 1), const_graph("✗f", -1))
    f.output = f.apply(P["mul"], chosen, 10)
    assert BRANCH in [ins[0] for ins in code_for(f).instrs]
    assert run(f, np.array([1.0, 2.0])) == 10
    assert run(f, np.array([-1.0, 0.5])) == -10


def test_tuples_strings_none() -> None:
    g = FuncGraph("g")
    t = g.add_parameter("t")
    s = g.add_parameter("s")
    first = g.apply(P["tuple_getitem"], t, 0)
    last = g.apply(P["tuple_getitem"], t, -1)
    g.output = g.apply(P["make_tuple"], g.apply(P["add"], s, "!"), first, last,
                       g.apply(P["len"], t), None, g.apply(P["make_tuple"]))
    assert run(g, ("a", (1, 2), None), "hi") == ("hi!", "a", None, 3, None, ())


def test_tensors_with_broadcasting() -> None:
    g = FuncGraph("g")
    a = g.add_parameter("a")
    b = g.add_parameter("b")
    total = g.apply(P["add"], g.apply(P["mul"], a, b), 1.0)
    g.output = g.apply(P["make_tuple"], total, g.apply(P["sum"], total, 0), g.apply(P["shape"], total))
    a_val = np.arange(3.0).reshape(3, 1)
    b_val = np.array([1.0, 2.0, 3.0, 4.0])
    out = run(g, a_val, b_val)
    np.testing.assert_array_equal(out[0], a_val * b_val + 1.0)
    np.testing.assert_array_equal(out[1], (a_val * b_val + 1.0).sum(0))
    assert out[2] == (3, 4)


def test_variadic_and_three_argument_primitives() -> None:
    g = FuncGraph("g")
    c = g.add_parameter("c")
    g.output = g.apply(P["make_tuple"], g.apply(P["where"], c, 1.0, 2.0),
                       g.apply(P["make_tuple"], 1, 2, 3, 4, 5), g.apply(P["zeros"], (2,)))
    out = run(g, np.array([True, False]))
    np.testing.assert_array_equal(out[0], [1.0, 2.0])
    assert out[1] == (1, 2, 3, 4, 5)
    np.testing.assert_array_equal(out[2], np.zeros(2))


def test_straight_line_chain_is_flat_code() -> None:
    g = FuncGraph("chain")
    node = g.add_parameter("x")
    for _ in range(25_000):
        node = g.apply(P["add"], g.apply(P["mul"], node, 1), 1)
    node = g.apply(P["neg"], node)
    g.output = node
    code = code_for(g)
    assert len(code.instrs) == 50_002
    assert code.instrs[-2][0] == F1 and code.instrs[-1][0] == RET
    assert run(g, 0) == -25_000


def test_cache_is_invalidated_by_edits() -> None:
    g = FuncGraph("g")
    x = g.add_parameter("x")
    node = g.apply(P["add"], x, 1)
    g.output = node
    assert run(g, 1) == 2
    first = code_for(g)
    assert code_for(g) is first
    node.set_input(0, ValueNode(P["mul"]))
    assert run(g, 5) == 5
    assert code_for(g) is not first


def test_callee_edit_is_seen_by_existing_caller_code() -> None:
    fib = fibonacci_graph()
    assert run(fib, 10) == 55
    # Change "n - 2" to "n - 1" in ✗✗fibonacci: fib'(n) = 2 fib'(n-1), fib'(1) = 1.
    else2 = fib.output.inputs[0].inputs[3].value.output.inputs[0].inputs[3].value
    call_b = else2.output.inputs[2]
    call_b.inputs[1].set_input(2, ValueNode(1))
    assert run(fib, 10) == 512


@settings(max_examples=40, deadline=None)
@given(programs.primitive_chains(["add", "sub", "mul", "maximum"], max_size=30),
       st.integers(-10, 10))
def test_chains_match_python(ops: list[tuple[str, Any]], start: int) -> None:
    g = FuncGraph("chain")
    node = g.add_parameter("x")
    expected: Any = start
    for name, k in ops:
        node = g.apply(P[name], node, k)
        expected = P[name].impl(expected, k)
    g.output = node
    result = run(g, start)
    assert result == expected and type(result) is type(expected)


# -- errors -----------------------------------------------------------------------------------
def test_calling_a_non_function_is_located() -> None:
    g = FuncGraph("g")
    x = g.add_parameter("x")
    g.output = g.apply(x, 1, loc=loc(3, 7, "let y = x(1) in"))
    with pytest.raises(AnfirTypeError) as info:
        run(g, 3)
    assert "calling a non-function (Int64 3)" in info.value.message
    assert info.value.loc.line == 3 and info.value.loc.col == 7
    assert "t.anf:3:7" in str(info.value) and "^" in str(info.value)


def test_calling_a_constant_non_function() -> None:
    g = FuncGraph("g")
    g.output = g.apply(ValueNode("text"), loc=loc(1))
    with pytest.raises(AnfirTypeError, match="non-function"):
        run(g)


def test_wrong_arity_to_a_graph_value_is_located() -> None:
    apply1 = FuncGraph("apply1")
    f = apply1.add_parameter("f")
    apply1.output = apply1.apply(f, 1, 2, loc=loc(2, 3))
    assert run(apply1, P["add"]) == 3
    with pytest.raises(ArityError) as info:
        run(apply1, hof_graph())
    assert "@hof takes 1 argument, got 2" in info.value.message and info.value.loc.line == 2


def test_wrong_arity_in_a_direct_call_raises_only_when_reached() -> None:
    g = FuncGraph("g")
    c = g.add_parameter("c")
    bad = FuncGraph("✓bad")
    bad.output = bad.apply(ValueNode(paper_main()), 1.0, loc=loc(4, 9))
    bad_prim = FuncGraph("✗bad")
    bad_prim.output = bad_prim.apply(P["neg"], 1, 2, loc=loc(5, 2))
    g.output = g.apply(P["make_tuple"], if_(g, c, bad, bad_prim))
    with pytest.raises(ArityError, match="@main takes 2 arguments, got 1") as info:
        run(g, True)
    assert info.value.loc.line == 4
    with pytest.raises(ArityError, match="neg takes 1 argument, got 2"):
        run(g, False)
    with pytest.raises(ArityError, match="@main takes 2 arguments, got 1"):
        run(paper_main(), 1.0)


def test_bad_shapes_are_located_shape_errors() -> None:
    g = FuncGraph("g")
    a = g.add_parameter("a")
    b = g.add_parameter("b")
    g.output = g.apply(P["add"], a, b, loc=loc(6, 12, "let c = a + b in"))
    with pytest.raises(ShapeError) as info:
        run(g, np.zeros(3), np.zeros(4))
    assert info.value.loc.line == 6 and "add" in info.value.message
    assert isinstance(info.value.__cause__, ValueError)
    m = FuncGraph("m")
    m.output = m.apply(P["matmul"], m.add_parameter("a"), m.add_parameter("b"), loc=loc(7))
    with pytest.raises(AnfirTypeError) as info:
        run(m, np.zeros((2, 3)), np.zeros((2, 3)))
    assert info.value.loc.line == 7


def test_python_errors_inside_primitives_are_located() -> None:
    g = FuncGraph("g")
    g.output = g.apply(P["add"], g.add_parameter("s"), 1, loc=loc(8))
    with pytest.raises(AnfirTypeError) as info:
        run(g, "text")
    assert info.value.loc.line == 8
    h = FuncGraph("h")
    h.output = h.apply(P["tuple_getitem"], h.add_parameter("t"), 5, loc=loc(9, 4))
    with pytest.raises(AnfirRuntimeError, match="out of range") as info:
        run(h, (1, 2))
    assert info.value.loc.line == 9 and "t.anf:9:4" in str(info.value)


def test_non_bool_condition_is_located() -> None:
    g = FuncGraph("g")
    c = g.add_parameter("c")
    switch = g.apply(P["switch"], c, ValueNode(const_graph("✓", 1)), ValueNode(const_graph("✗", 2)),
                     loc=loc(10))
    g.output = g.apply(switch, loc=loc(10))
    with pytest.raises(AnfirTypeError, match="condition must be a bool, not Int64 1") as info:
        run(g, 1)
    assert info.value.loc.line == 10


def test_errors_deep_in_the_stack_point_at_the_failing_node() -> None:
    # rsum with a string base case at depth 1000: "..." + int fails in the add.
    g = recursive_sum()
    with pytest.raises(AnfirTypeError):
        run(g, "x")


def test_meta_function_without_runtime() -> None:
    # A meta function whose expansion nobody provides (no generator installed).
    meta = MetaFunction("grad", "a stand-in for grad before autodiff exists")
    g = FuncGraph("g")
    g.output = g.apply(meta, ValueNode(hof_graph()), loc=loc(11))
    with pytest.raises(AnfirError, match="grad cannot be evaluated directly") as info:
        run(g)
    assert info.value.loc.line == 11


def test_meta_function_runtime_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    grad = META_FUNCTIONS["grad"]

    def fake_grad(args: tuple) -> FuncGraph:
        # the "gradient" of f: a function calling f back, partial(make_tuple, "d", f(1.0))
        assert args[0] is hof_graph_value[0]
        gen = FuncGraph("fake_grad")
        f = gen.add_parameter("f")
        gen.output = gen.apply(P["partial"], P["make_tuple"], "d", gen.apply(f, 1.0))
        return gen

    hof_graph_value = [hof_graph()]
    monkeypatch.setattr(grad, "generate", fake_grad)
    g = FuncGraph("g")
    g.output = g.apply(g.apply(grad, ValueNode(hof_graph_value[0])), 0)
    assert run(g) == ("d", 16.0, 0)


def test_ill_formed_graph_is_reported() -> None:
    g = FuncGraph("g")
    with pytest.raises(IRConsistencyError):
        run(g)


def test_call_function_on_primitives_and_errors() -> None:
    assert call_function(P["add"], (2, 3)) == 5
    with pytest.raises(ArityError):
        call_function(P["add"], (2,))
    with pytest.raises(AnfirTypeError, match=r"non-function \(Float64 2.5\)"):
        call_function(2.5, ())
    with pytest.raises(AnfirTypeError):
        call_function(P["add"], (2, "x"))


# -- the spec's examples through the parser ------------------------------------------------

PROGRAM = "\n".join([HOF, FIBONACCI, CLOSURE, POWER, MLP, """\
def count(i, n, acc) = if i < n then count(i + 1, n, acc + i) else acc

def rsum(n) = if n == 0 then 0 else n + rsum(n - 1)

def is_even(n) = if n == 0 then true else is_odd(n - 1)
def is_odd(n) = if n == 0 then false else is_even(n - 1)

def adders(k) =
  let mk = lambda (j) lambda (x) x + j end end in
  let a = mk(k) in
  let b = mk(k + 1) in
  (a(100), b(100))

def partials(x) =
  let add1 = partial(add, 1) in
  let twice = lambda (f, v) f(f(v)) end in
  (add1(x), twice(add1, x), twice(partial(mul, 2), x), partial(make_tuple, 1)(2, 3))

def data(t, s) = (t[0], t[2], len(t), s + "!", None, ())

def tensors(a, b) = let c = a * b + 1.0 in (c, sum(c, 0), shape(c))

def call_int(x) = x(1)

def arity(f) = f(1, 2)

def bad_add(a, b) = a + b
"""])


@pytest.fixture(scope="module")
def program() -> Module:
    return anfir.parse(PROGRAM, "prog.anf")


def test_parsed_paper_lambda() -> None:
    mod = anfir.parse(PAPER)
    assert anfir.run(mod, 5.0, 2.0) == 4.0
    assert anfir.run(mod["main"], 5.0, 2.0) == 4.0


def test_parsed_spec_examples(program: Module) -> None:
    assert anfir.run(program["hof"], 2.0) == 25.0
    fib10 = anfir.run(program["fibonacci"], 10)
    assert fib10 == 55 and type(fib10) is int
    assert anfir.run(program["fibonacci"], 20) == 6765
    assert anfir.run(program["ms_closure"]) == (4, 5)
    assert anfir.run(program["power"], 2.0, 3) == 8.0


def test_parsed_grad_goes_through_the_meta_function_runtime(program: Module) -> None:
    assert anfir.run(program["dpower"], 2.0) == pytest.approx(12.0)


def test_parsed_mlp_loss(program: Module) -> None:
    rng = np.random.default_rng(1)
    w1, w2 = rng.normal(size=(4, 8)), rng.normal(size=(8, 3))
    x, y = rng.normal(size=(6, 4)), rng.normal(size=(6, 3))
    expected = np.sum((np.tanh(x @ w1) @ w2 - y) ** 2) / 2
    assert anfir.run(program["mlp_loss"], w1, w2, x, y) == pytest.approx(expected, rel=1e-12)


def test_parsed_loops_and_recursion(program: Module) -> None:
    assert anfir.run(program["count"], 0, 100_000, 0) == sum(range(100_000))
    assert anfir.run(program["power"], 1.0, 100_000) == 1.0
    assert anfir.run(program["rsum"], 50_000) == 50_000 * 50_001 // 2
    assert anfir.run(program["is_even"], 10_001) is False
    assert anfir.run(program["is_odd"], 10_001) is True


def test_parsed_tail_loop_memory_is_flat(program: Module) -> None:
    g = program["count"]
    small = _peak_bytes(g, 10_000)
    large = _peak_bytes(g, 100_000)
    assert large < 2 * small + 4096, (small, large)


def test_parsed_closures_partial_data(program: Module) -> None:
    assert anfir.run(program["adders"], 1) == (101, 102)
    assert anfir.run(program["partials"], 5) == (6, 7, 20, (1, 2, 3))
    assert anfir.run(program["data"], ("a", 2, None), "hi") == ("a", None, 3, "hi!", None, ())
    a, b = np.arange(3.0).reshape(3, 1), np.arange(4.0)
    c, col, shape = anfir.run(program["tensors"], a, b)
    np.testing.assert_array_equal(c, a * b + 1.0)
    np.testing.assert_array_equal(col, (a * b + 1.0).sum(0))
    assert shape == (3, 4)


def test_parsed_errors_are_located(program: Module) -> None:
    with pytest.raises(AnfirTypeError, match=r"calling a non-function \(Int64 3\)") as info:
        anfir.run(program["call_int"], 3)
    assert info.value.loc.file == "prog.anf" and "x(1)" in info.value.loc.line_text
    with pytest.raises(ArityError, match="takes 1 argument, got 2") as info:
        anfir.run(program["arity"], program["fibonacci"])
    assert "f(1, 2)" in info.value.loc.line_text
    with pytest.raises(ShapeError) as info:
        anfir.run(program["bad_add"], np.zeros(3), np.zeros(4))
    assert "a + b" in info.value.loc.line_text
    with pytest.raises(ArityError):
        anfir.run(program["hof"])


# -- the fast paths (anfir/eval/fastpath.py) ------------------------------------------------
_BF16 = np.dtype("bfloat16")
FAST_SAMPLES: dict[type, list[Any]] = {
    float: [0.0, -0.0, 1.5, -2.5, 3.0, 1e-320, 710.0, 1e308, -1e308, float("inf"),
            float("-inf"), float("nan")],
    int: [0, 1, -3, 7, 2 ** 70, -(2 ** 70), 10 ** 400],
    bool: [True, False],
    np.ndarray: [np.array([[1.5, -2.0], [0.0, np.nan]]), np.array([[3, -1], [0, 7]]),
                 np.array([[0.5, 4.0], [-1.0, 0.0]]), np.array([1.0, 2.0, 3.0]),
                 np.array([True, False]), np.array(2.0), np.array([1.5, -0.5], dtype=_BF16),
                 np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32),
                 np.array([1 + 2j, -1j])],
}


def _outcome(fn: Any, *args: Any) -> tuple[str, Any, list[str]]:
    """``fn(*args)``'s result (or exception type) and the warnings it gave."""
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            value = fn(*args)
        except Exception as exc:  # noqa: BLE001 - the kind is compared below
            return "raises", type(exc), [str(w.message) for w in caught]
    return "returns", value, [str(w.message) for w in caught]


def _identical(a: Any, b: Any) -> bool:
    """Same type and the same bits (nan and -0.0 included), arrays' dtype and shape too."""
    if type(a) is not type(b):
        return False
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    return repr(a) == repr(b)


def _fast_cases() -> list[tuple[Any, Any, tuple]]:
    from anfir.eval.fastpath import FAST_PATHS
    cases = []
    for prim, path in FAST_PATHS.items():
        for kind in sorted(path.types, key=lambda t: t.__name__):
            values = FAST_SAMPLES[kind]
            if prim.min_args == 1:
                cases += [(prim, path, (v,)) for v in values]
            else:
                cases += [(prim, path, (v, w)) for v in values for w in values]
    return cases


def test_every_fast_path_computes_what_its_impl_computes() -> None:
    """The contract of anfir/eval/fastpath.py, on edge values of every operand type
    an entry takes: the fast function returns the impl's very result (type, bits,
    warnings) or raises (then the VM calls the impl)."""
    cases = _fast_cases()
    assert len(cases) > 1000
    fell_back = 0
    for prim, path, args in cases:
        with np.errstate(all="warn"):
            fast = _outcome(path.fast, *args)
            impl = _outcome(prim.impl, *args)
        if fast[0] == "raises":
            fell_back += 1
            continue
        assert impl[0] == "returns" and _identical(fast[1], impl[1]) and fast[2] == impl[2], \
            (prim.name, args, fast, impl)
    assert 0 < fell_back < len(cases) // 2  # (x / 0.0, log(0.0), shape mismatches...)


def _graph_of(prim: Any, arity: int) -> FuncGraph:
    g = FuncGraph(f"fast_{prim.name}")
    params = [g.add_parameter(f"a{i}") for i in range(arity)]
    g.output = g.apply(prim, *params)
    return g


def test_the_vm_agrees_with_the_impls_on_fast_and_checked_operands() -> None:
    """Through the VM (F1/F2 instructions), every sample pair — same type (fast path)
    and mixed types (checked path: int with float, float with a bf16 array...) —
    gives the impl's result, or a located AnfirError where the impl raises."""
    from anfir.eval.fastpath import FAST_PATHS
    mixed = [1.5, 3, True, np.array([1.5, -0.5], dtype=_BF16), np.array([[1.0, 2.0], [3.0, 4.0]]),
             np.float64(2.0), (1.0, 2.0)]
    for prim, path in FAST_PATHS.items():
        arity = prim.min_args
        g = _graph_of(prim, arity)
        assert code_for(g).instrs[0][0] == (F2 if arity == 2 else F1)
        kinds = sorted(path.types, key=lambda t: t.__name__)
        samples = [v for kind in kinds for v in FAST_SAMPLES[kind][:4]] + mixed
        pairs = [(v,) for v in samples] if arity == 1 else [(v, w) for v in samples for w in samples]
        for args in pairs:
            with np.errstate(all="ignore"):
                expected = _outcome(prim.impl, *args)
                got = _outcome(run, g, *args)
            if expected[0] == "raises":
                assert got[0] == "raises" and issubclass(got[1], AnfirError), (prim.name, args, got)
            else:
                assert got[0] == "returns" and _identical(got[1], expected[1]), (prim.name, args, got)


def test_constant_operands_compile_to_k2_and_agree_with_the_impls() -> None:
    """A constant operand of a type the fast path takes gives K2 (``x * 1.5``) or K2L
    (``1.5 - x``), one it never takes a plain call (``x * 2``: ints are not ``mul``'s);
    every variable operand then gives the impl's result or a located error."""
    from anfir.eval.fastpath import FAST_PATHS
    mixed = [1.5, 3, True, np.array([1.5, -0.5], dtype=_BF16), np.array([[1.0, 2.0], [3.0, 4.0]]),
             np.float64(2.0), (1.0, 2.0)]
    for prim, path in FAST_PATHS.items():
        if prim.min_args != 2:
            continue
        kinds = sorted(path.types, key=lambda t: t.__name__)
        samples = [v for kind in kinds for v in FAST_SAMPLES[kind][:3]] + mixed
        for const in samples:
            for left in (False, True):
                g = FuncGraph(f"k_{prim.name}")
                x = g.add_parameter("x")
                g.output = g.apply(prim, ValueNode(const), x) if left else g.apply(prim, x, ValueNode(const))
                want = (K2L if left else K2) if type(const) in path.types else P2
                assert code_for(g).instrs[0][0] == want, (prim.name, const, left)
                for value in samples:
                    args = (const, value) if left else (value, const)
                    with np.errstate(all="ignore"):
                        expected = _outcome(prim.impl, *args)
                        got = _outcome(run, g, value)
                    if expected[0] == "raises":
                        assert got[0] == "raises" and issubclass(got[1], AnfirError), (prim.name, args)
                    else:
                        assert got[0] == "returns" and _identical(got[1], expected[1]), (prim.name, args, got)


def test_the_checks_hold_on_the_fast_instructions() -> None:
    """What the fast paths must not skip: tuples refused, Python int products bounded,
    a Python float beside a bf16 array made bf16, a bad operand located."""
    add = _graph_of(P["add"], 2)
    mul = _graph_of(P["mul"], 2)
    with pytest.raises(AnfirTypeError, match="not a tuple"):
        run(add, (1.0,), (2.0,))
    with pytest.raises(AnfirRuntimeError, match="MAX_INT_BITS"):
        run(mul, 2 ** 40_000, 2 ** 40_000)
    out = run(mul, 2.0, np.array([1.5], dtype=_BF16))
    assert out.dtype == _BF16 and out[0] == 3.0
    assert type(run(mul, True, True)) is int and run(mul, 3, 4) == 12
    module = anfir.parse("def f(x, y) =\n  let z = x / y in\n  log(z) + x * y")
    assert run(module["f"], 0.0, 0.0) != run(module["f"], 0.0, 0.0)  # nan, not an error
    assert run(module["f"], 1.0, 0.0) == float("inf")
    with pytest.raises(AnfirTypeError) as info:
        run(module["f"], (1.0,), 2.0)
    assert info.value.loc is not None and info.value.loc.line == 2

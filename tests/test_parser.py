"""The ANF parser: the graph shapes it builds (anfir/grammar/parser.py, passes/resolve.py)."""

from __future__ import annotations

import ast
import os
import sys

import pytest
from hypothesis import given, settings

from anfir.grammar.parser import parse_file, parse_module
from anfir.ir import CNode, FuncGraph, Location, ParameterNode, ValueNode, manage
from anfir.ir.annotations import ScalarAnn, TensorAnn, TupleAnn
from anfir.grammar.resolve import resolve_module
from anfir.primitives import META_FUNCTIONS, PRIMITIVES, MetaFunction, Primitive
from anfir.runtime_values import Symbol
import programs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


# -- helpers ---------------------------------------------------------------------

def prim(node, name: str) -> bool:
    """Whether ``node`` is a CNode calling the primitive ``name``."""
    return isinstance(node, CNode) and node.is_apply(PRIMITIVES[name])


def term(node):
    """A nested tuple for an expression graph: ("add", a, b), constants, parameter names.

    Graph constants print as "@name"; a CNode calling a non-primitive prints
    as ("call", callee, args...).  Explicit stack, so deep graphs are fine.
    """
    done: dict = {}
    stack = [(node, False)]
    while stack:
        current, expanded = stack.pop()
        if current in done:
            continue
        if isinstance(current, ParameterNode):
            done[current] = current.name
        elif isinstance(current, ValueNode):
            value = current.value
            if isinstance(value, FuncGraph):
                done[current] = "@" + value.name
            elif isinstance(value, Symbol):
                done[current] = "$" + value.name
            else:
                done[current] = value
        elif not expanded:
            stack.append((current, True))
            stack.extend((i, False) for i in current.inputs if i not in done)
        else:
            head = current.inputs[0]
            args = tuple(done[i] for i in current.inputs[1:])
            if isinstance(head, ValueNode) and isinstance(head.value, (Primitive, MetaFunction)):
                done[current] = (head.value.name,) + args
            else:
                done[current] = ("call", done[head]) + args
    return done[node]


def graphs_of(module):
    """Every graph reachable from the module's graphs, by name (names must be unique here)."""
    mng = manage(*module.graphs.values())
    return {g.name: g for g in mng.graphs}, mng


def example(name: str):
    return parse_file(os.path.join(EXAMPLES, name))


def expr(text: str, params: str = "a, b, c", engine: str = "tables"):
    """The output term of ``def f(params) = text``."""
    return term(parse_module(f"def f({params}) = {text}", engine=engine)["f"].output)


# -- the spec's examples ------------------------------------------------------------

def test_paper_lambda_is_main_with_nested_func():
    module = example("paper_lambda.anf")
    assert list(module.graphs) == ["main"]
    main = module["main"]
    assert [p.name for p in main.parameters] == ["x", "y"]
    c = main.output
    assert c.name == "c" and prim(c, "mul")
    b, call = c.inputs[1], c.inputs[2]
    assert b.name == "b" and prim(b, "add")
    assert call.name == "%1" and isinstance(call.inputs[0], ValueNode)
    func = call.inputs[0].value
    assert isinstance(func, FuncGraph) and func.name == "func"
    # the inner lambda's (x, y) shadow the outer ones: no free variables
    assert func.output.name == "ret" and prim(func.output, "div")
    assert func.output.inputs[1] is func.parameters[0]
    assert func.output.inputs[2] is func.parameters[1]
    a = b.inputs[1]
    assert a.name == "a" and term(a) == ("sub", "x", 1)
    assert a.inputs[1] is main.parameters[0]
    assert call.inputs[1] is a and call.inputs[2] is b
    mng = manage(main)
    assert mng.free_variables_total(func) == []
    assert all(n.graph is main for n in (a, b, call, c))


def test_hof_lambdas_named_after_their_let():
    module = example("hof.anf")
    hof = module["hof"]
    out = hof.output
    g, f = out.inputs[0].value, out.inputs[1].value
    assert (g.name, f.name) == ("g", "f")
    assert out.inputs[2] is hof.parameters[0]
    assert term(f.output) == ("add", "x", 3)
    assert term(g.output) == ("mul", ("call", "function", "x"), ("call", "function", "x"))
    assert g.output.inputs[1].inputs[0] is g.parameters[0]


def test_fibonacci_branch_graphs():
    module = example("fibonacci.anf")
    graphs, mng = graphs_of(module)
    assert set(graphs) == {"fibonacci", "✓fibonacci", "✗fibonacci", "✓✗fibonacci", "✗✗fibonacci"}
    fib = module["fibonacci"]
    call = fib.output
    assert isinstance(call, CNode) and len(call.inputs) == 1
    select = call.inputs[0]
    assert prim(select, "switch")
    assert term(select.inputs[1]) == ("lt", "n", 1)
    assert select.inputs[2].value is graphs["✓fibonacci"]
    assert select.inputs[3].value is graphs["✗fibonacci"]
    assert graphs["✓fibonacci"].parameters == []
    assert graphs["✓fibonacci"].output.value == 0  # a constant branch still has its graph
    inner = graphs["✗fibonacci"].output.inputs[0]
    assert prim(inner, "switch") and inner.graph is graphs["✗fibonacci"]
    assert inner.inputs[1].inputs[1] is fib.parameters[0]  # a free-variable edge
    assert term(graphs["✗✗fibonacci"].output) == (
        "add", ("call", "@fibonacci", ("sub", "n", 1)), ("call", "@fibonacci", ("sub", "n", 2)))
    assert mng.free_variables_total(graphs["✗✗fibonacci"]) == [fib.parameters[0]]
    assert mng.parent(graphs["✗✗fibonacci"]) is fib
    assert mng.parent(graphs["✓fibonacci"]) is None  # no free variables: not nested


def test_closure_free_variables():
    module = example("closure.anf")
    outer = module["func_outer"]
    lam = outer.output.value
    assert isinstance(lam, FuncGraph) and lam.name == "lambda"
    mng = manage(*module.graphs.values())
    assert mng.free_variables_total(lam) == outer.parameters
    assert mng.parent(lam) is outer
    ms = module["ms_closure"]
    assert term(ms.output) == ("make_tuple", ("call", ("call", "@func_outer", 1, 2), 1),
                               ("call", ("call", "@func_outer", 1, 2), 2))
    out1, out2 = ms.output.inputs[1:]
    assert (out1.name, out2.name) == ("out1", "out2")
    assert out1.inputs[0] is out2.inputs[0] and out1.inputs[0].name == "closure"


def test_power_local_recursion_and_grad():
    module = example("power.anf")
    graphs, mng = graphs_of(module)
    power, loop = module["power"], graphs["loop"]
    assert {"✓loop", "✗loop"} <= set(graphs)
    assert term(power.output) == ("call", "@loop", 0, 1.0)
    true_branch = graphs["✓loop"]
    recursive = true_branch.output
    assert recursive.inputs[0].value is loop  # the lambda sees itself
    assert set(mng.free_variables_total(loop)) == set(power.parameters)
    assert mng.parent(loop) is power
    assert mng.parent(true_branch) is loop
    assert term(graphs["✗loop"].output) == "acc"
    dpower = module["dpower"]
    assert term(dpower.output) == ("call", ("grad", "@power"), "x", 3)
    assert dpower.output.inputs[0].inputs[0].value is META_FUNCTIONS["grad"]


def test_mlp_annotations():
    module = example("mlp.anf")
    g = module["mlp_loss"]
    anns = [p.annotation for p in g.parameters]
    assert anns[0] == TensorAnn("f64", ("D", "H"))
    assert [str(a) for a in anns] == ["f64[D, H]", "f64[H, K]", "f64[B, D]", "f64[B, K]"]
    assert anns[0].loc is not None and (anns[0].loc.line, anns[0].loc.col) == (2, 18)
    assert g.flags["return_type"] == ScalarAnn("f64")
    assert term(g.output) == ("div", ("sum", ("pow", ("sub", ("matmul", ("tanh", ("matmul", "x", "w1")), "w2"),
                                                      "y"), 2)), 2)
    out = g.output.inputs[1].inputs[1].inputs[1].inputs[1]
    assert out.name == "out" and out.inputs[1].name == "h"


@pytest.mark.parametrize("engine", ["tables", "lark"])
def test_both_engines_build_the_same_graphs(engine):
    for name in sorted(os.listdir(EXAMPLES)):
        if not name.endswith(".anf"):
            continue
        with open(os.path.join(EXAMPLES, name), encoding="utf-8") as handle:
            text = handle.read()
        reference = parse_module(text, name)
        other = parse_module(text, name, engine=engine)
        assert list(other.graphs) == list(reference.graphs)
        for key in reference.graphs:
            assert term(other[key].output) == term(reference[key].output)


# -- expressions -----------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("-2 ** 2", ("neg", ("pow", 2, 2))),
    ("2 ** -1", ("pow", 2, -1)),
    ("a ** b ** c", ("pow", "a", ("pow", "b", "c"))),
    ("a - b - c", ("sub", ("sub", "a", "b"), "c")),
    ("a / b * c", ("mul", ("div", "a", "b"), "c")),
    ("a + b * c @ a", ("add", "a", ("matmul", ("mul", "b", "c"), "a"))),
    ("-a * b", ("mul", ("neg", "a"), "b")),
    ("- -2", ("neg", -2)),
    ("-(2)", -2),
    ("-2.5e-3", -0.0025),
    ("a < b == c", ("eq", ("lt", "a", "b"), "c")),
    ("not a == b", ("logical_not", ("eq", "a", "b"))),
    ("not a and b or c", ("logical_or", ("logical_and", ("logical_not", "a"), "b"), "c")),
    ("a or b and not not c", ("logical_or", "a", ("logical_and", "b", ("logical_not", ("logical_not", "c"))))),
    ("a <= b != (c >= a)", ("ne", ("le", "a", "b"), ("ge", "c", "a"))),
    ("a > b", ("gt", "a", "b")),
    ("(a, b)", ("make_tuple", "a", "b")),
    ("(a,)", ("make_tuple", "a")),
    ("()", ("make_tuple",)),
    ("(a, b, c,)", ("make_tuple", "a", "b", "c")),
    ("(a, b)[1]", ("tuple_getitem", ("make_tuple", "a", "b"), 1)),
    ("a[0][2]", ("tuple_getitem", ("tuple_getitem", "a", 0), 2)),
    ("(lambda (x) x end)(1)", ("call", "@lambda", 1)),
    ("sin(cos(a))", ("sin", ("cos", "a"))),
    ("a(b)(c)", ("call", ("call", "a", "b"), "c")),
    ("1e3 + 2.5", ("add", 1000.0, 2.5)),
    ("(true, false, True, False, None)", ("make_tuple", True, False, True, False, None)),
    ('"a\\"b\\\\c\\nd"', 'a"b\\c\nd'),
    ("let %1 = a + 1 in %1 * %1", ("mul", ("add", "a", 1), ("add", "a", 1))),
    ("let x = 1 in let x = x + 1 in x", ("add", 1, 1)),
    ("let y = a in y + y", ("add", "a", "a")),
    ("if a then b else c", ("call", ("switch", "a", "@✓f", "@✗f"))),
    ("a(b, c,)", ("call", "a", "b", "c")),
    ("f(a, b, c)", ("call", "@f", "a", "b", "c")),
    ("a # a comment\n + b", ("add", "a", "b")),
    ("1 + let x = 2 in x * 3", ("add", 1, ("mul", 2, 3))),
    ("a * b + let x = c in x - 1", ("add", ("mul", "a", "b"), ("sub", "c", 1))),
    ("a - if b then 1 else 2 + c", ("sub", "a", ("call", ("switch", "b", "@✓f", "@✗f")))),
])
@pytest.mark.parametrize("engine", ["tables", "lark"])
def test_expressions(text, expected, engine):
    assert expr(text, engine=engine) == expected


def test_minus_literal_folds_to_a_constant():
    node = parse_module("def f() = -2")["f"].output
    assert isinstance(node, ValueNode) and node.value == -2 and type(node.value) is int


def test_nested_expressions_equal_their_let_normal_form():
    nested = parse_module("def f(x) = sin(x * 2 + 1) + 1")["f"]
    flat = parse_module("def f(x) = let a = x * 2 in let b = a + 1 in let c = sin(b) in c + 1")["f"]
    assert term(nested.output) == term(flat.output)


def test_operator_and_call_locations_share_the_line_text():
    g = parse_module("def f(x) =\n  let y = x * 2 + g(x) in y\ndef g(x) = x", "m.anf")["f"]
    add = g.output
    mul, call = add.inputs[1], add.inputs[2]
    assert (add.loc.line, add.loc.col) == (2, 17)
    assert (mul.loc.line, mul.loc.col) == (2, 13)
    assert (call.loc.line, call.loc.col) == (2, 20)  # a call is located at its '('
    assert add.loc.file == "m.anf" and add.loc.line_text == "  let y = x * 2 + g(x) in y"
    assert add.loc.line_text is mul.loc.line_text is call.loc.line_text
    assert add.loc == Location("m.anf", 2, 17, "  let y = x * 2 + g(x) in y")
    assert hash(add.loc) == hash(Location("m.anf", 2, 17, "  let y = x * 2 + g(x) in y"))
    assert add.loc.derive("ad").note == "ad" and add.loc.short() == "m.anf:2:17"
    assert add.inputs[0].loc == add.loc  # the operator's primitive constant too
    assert (g.loc.line, g.loc.col) == (1, 5)
    assert (g.parameters[0].loc.line, g.parameters[0].loc.col) == (1, 7)


def test_type_annotations():
    src = ("def f(a: f32[2, 3], b: f32[], c: f64[N, 3], d: f32[*], e: f32[N, *], "
           "t: (f64, i64), u: (bool,), v: (), s: str, w: (f32)) -> (f64, f32[2]) =\n"
           "  let y: f64[N, 3] = c * 2.0 in let k: i64 = 3 in y")
    g = parse_module(src)["f"]
    anns = {p.name: p.annotation for p in g.parameters}
    assert anns["a"] == TensorAnn("f32", (2, 3))
    assert anns["b"] == TensorAnn("f32", ())
    assert anns["c"] == TensorAnn("f64", ("N", 3))
    assert anns["d"] == TensorAnn("f32", ("*",))
    assert anns["e"] == TensorAnn("f32", ("N", "*"))
    assert anns["t"] == TupleAnn((ScalarAnn("f64"), ScalarAnn("i64")))
    assert anns["u"] == TupleAnn((ScalarAnn("bool"),))
    assert anns["v"] == TupleAnn(())
    assert anns["s"] == ScalarAnn("str")
    assert anns["w"] == ScalarAnn("f32")
    assert g.flags["return_type"] == TupleAnn((ScalarAnn("f64"), TensorAnn("f32", (2,))))
    assert g.output.name == "y" and g.output.annotation == TensorAnn("f64", ("N", 3))
    assert "return_type" not in parse_module("def h(x) = x")["h"].flags


# -- scoping -------------------------------------------------------------------------

def test_inner_lambda_params_shadow_outer_ones():
    g = parse_module("def f(x, y) = lambda (x) x + y end")["f"]
    lam = g.output.value
    add = lam.output
    assert add.inputs[1] is lam.parameters[0]
    assert add.inputs[2] is g.parameters[1]  # free variable
    assert manage(g).free_variables_total(lam) == [g.parameters[1]]


def test_free_variable_edge_to_an_enclosing_let_node():
    g = parse_module("def f(x) = let k = x * 2 in lambda (y) y + k end")["f"]
    lam = g.output.value
    k = lam.output.inputs[2]
    assert k.name == "k" and k.graph is g
    assert manage(g).free_variables_total(lam) == [k]


def test_let_value_does_not_see_its_own_name():
    g = parse_module("def f(x) = let x = x + 1 in x")["f"]
    assert term(g.output) == ("add", "x", 1) and g.output.inputs[1] is g.parameters[0]


@pytest.mark.parametrize("text, expected", [
    # a let-bound lambda sees itself; any other let value sees the outer name
    ("let a = lambda (y) a end in a", "@a"),
    ("let a = (lambda (y) a end)(1) in a", ("call", "@lambda", 1)),
    ("let a = (let a = a * 2 in a + a) in a", ("add", ("mul", "a", 2), ("mul", "a", 2))),
    ("let a = (let z = a in z) in a + 1", ("add", "a", 1)),
    ("let d = (d, 1) in d", ("make_tuple", "@d", 1)),
    ("let d = d in d", "@d"),
    ("let a = (let a = a in a) in a", "a"),
    ("let d = (let d = (let d = d in d) in (d, d)) in d", ("make_tuple", "@d", "@d")),
])
def test_let_value_scoping(text, expected):
    module = parse_module(f"def f(a, b, c) = {text}\ndef d() = 0")
    assert term(module["f"].output) == expected


def test_let_bound_lambda_recursion_through_nested_lambdas_and_branches():
    g = parse_module("def f(n) = let count = lambda (k) if k < 1 then 0 else "
                     "(lambda (j) count(j) end)(k - 1) end in count(n)")["f"]
    count = g.output.inputs[0].value
    assert count.name == "count"
    inner = [graph for graph in manage(g).graphs if graph.name == "lambda"]
    assert len(inner) == 1 and inner[0].output.inputs[0].value is count


def test_crlf_and_tabs():
    g = parse_module("def f(x) =\r\n\tlet y = x +\t1 in\r\n\ty\r\n", "w.anf")["f"]
    add = g.output
    assert term(add) == ("add", "x", 1) and add.name == "y"
    assert (add.loc.line, add.loc.col) == (2, 12)


def test_mutual_recursion_any_order():
    module = parse_module("def even(n) = if n == 0 then true else odd(n - 1)\n"
                          "def odd(n) = if n == 0 then false else even(n - 1)")
    graphs, _ = graphs_of(module)
    assert graphs["✗even"].output.inputs[0].value is module["odd"]
    assert graphs["✗odd"].output.inputs[0].value is module["even"]


def test_top_level_definitions_shadow_builtins_and_locals_shadow_all():
    module = parse_module("def relu(x) = x\ndef f(x) = relu(x)\ndef g(sin) = sin(1)")
    assert module["f"].output.inputs[0].value is module["relu"]
    g = module["g"]
    assert g.output.inputs[0] is g.parameters[0]


def test_builtins_resolve_to_primitives_and_meta_functions():
    g = parse_module("def f(x) = grad(sin)(x)")["f"]
    assert g.output.inputs[0].inputs[0].value is META_FUNCTIONS["grad"]
    assert g.output.inputs[0].inputs[1].value is PRIMITIVES["sin"]


def test_resolve_false_leaves_symbols_then_resolve_module():
    module = parse_module("def f(x) = g(sin(x))\ndef g(y) = y", resolve=False)
    f = module["f"]
    callee, arg = f.output.inputs
    assert isinstance(callee.value, Symbol) and callee.value.name == "g"
    assert (callee.loc.line, callee.loc.col) == (1, 12)
    assert isinstance(arg.inputs[0].value, Symbol)
    assert resolve_module(module) is module
    assert f.output.inputs[0].value is module["g"]
    assert f.output.inputs[0].loc == callee.loc
    assert f.output.inputs[1].inputs[0].value is PRIMITIVES["sin"]


def test_resolve_module_under_a_manager_keeps_its_records_exact():
    module = parse_module("def f(x) = g(x) + g(x)\ndef g(y) = sin(y)", resolve=False)
    f, g = module["f"], module["g"]
    mng = manage(f, g)
    symbol_node = f.output.inputs[1].inputs[0]
    assert isinstance(symbol_node.value, Symbol)
    resolve_module(module)
    assert f.output.inputs[1].inputs[0].value is g
    assert isinstance(symbol_node.value, Symbol)  # the managed node was replaced, not changed
    assert mng.graphs_used[f][g] == 2
    assert set(mng.call_sites(g)) == {f.output.inputs[1], f.output.inputs[2]}
    assert g.output.inputs[0].value is PRIMITIVES["sin"]


def test_global_name_as_graph_output_resolves():
    module = parse_module("def f() = g\ndef g() = 1\ndef h() = sin")
    assert module["f"].output.value is module["g"]
    assert module["h"].output.value is PRIMITIVES["sin"]


def test_let_bound_lambda_named_and_unbound_lambda_named_lambda():
    g = parse_module("def f(x) = let sq = lambda (v) v * v end in (sq, lambda (w) w end)")["f"]
    sq, other = g.output.inputs[1].value, g.output.inputs[2].value
    assert (sq.name, other.name) == ("sq", "lambda")


def test_alias_of_a_let_bound_lambda_does_not_rename_it():
    g = parse_module("def f(x) = let sq = lambda (v) v * v end in let h = sq in h(x)")["f"]
    assert g.output.inputs[0].value.name == "sq"


def test_if_inside_lambda_names_branches_after_it():
    graphs, mng = graphs_of(parse_module(
        "def f(x) = let loop = lambda (i) if i < x then loop(i + 1) else i end in loop(0)"))
    assert {"f", "loop", "✓loop", "✗loop"} == set(graphs)
    assert mng.parent(graphs["✓loop"]) is graphs["loop"]


def test_bare_expression_becomes_main():
    module = parse_module("1 + 2")
    assert list(module.graphs) == ["main"] and term(module["main"].output) == ("add", 1, 2)
    module = parse_module("let k = sin(1.0) in lambda (x) x * k end")
    main = module["main"]
    assert main.parameters == [] and isinstance(main.output.value, FuncGraph)
    module = parse_module("let k = 2.0 in let f = lambda (x) x * k end in f")
    assert [p.name for p in module["main"].parameters] == ["x"]


# -- imports -------------------------------------------------------------------------

def test_imports(tmp_path):
    (tmp_path / "lib.anf").write_text("def square(x) = x * x\ndef cube(x) = x * square(x)\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "more.anf").write_text('import "../lib.anf"\ndef quad(x) = square(square(x))\n')
    main = tmp_path / "main.anf"
    main.write_text('import "lib.anf"\nimport "sub/more.anf"\ndef f(x) = cube(x) + quad(x)\n')
    module = parse_file(str(main))
    assert module.imports == ["lib.anf", "sub/more.anf"]
    assert list(module.graphs) == ["f"]
    assert set(module.imported) == {"square", "cube", "quad"}
    out = module["f"].output
    assert out.inputs[1].inputs[0].value is module.imported["cube"]
    assert out.inputs[2].inputs[0].value is module.imported["quad"]
    # lib.anf is parsed once: both importers share its graphs
    quad = module.imported["quad"]
    assert quad.output.inputs[0].value is module.imported["square"]


def test_parse_module_imports_relative_to_cwd(tmp_path, monkeypatch):
    (tmp_path / "lib.anf").write_text("def one() = 1\n")
    monkeypatch.chdir(tmp_path)
    module = parse_module('import "lib.anf"\ndef f() = one()')
    assert module["f"].output.inputs[0].value is module.imported["one"]


def test_own_definition_shadows_an_imported_one(tmp_path):
    (tmp_path / "lib.anf").write_text("def k() = 1\n")
    main = tmp_path / "main.anf"
    main.write_text('import "lib.anf"\ndef k() = 2\ndef f() = k()\n')
    module = parse_file(str(main))
    assert module["f"].output.inputs[0].value is module["k"]


def test_module_without_imports_has_empty_import_fields():
    module = parse_module("def f(x) = x")
    assert module.imports == [] and module.imported == {}


# -- size and depth (at the default recursion limit) -----------------------------------

def test_default_recursion_limit():
    assert sys.getrecursionlimit() <= 1000


def test_long_let_chain():
    lines = ["def f(x0) ="] + [f"  let x{i + 1} = x{i} * 1.0001 + sin(x{i}) in" for i in range(5000)]
    g = parse_module("\n".join(lines + ["  x5000"]))["f"]
    assert g.output.name == "x5000" and g.output.loc.line == 5001
    node = g.output
    for _ in range(5000):
        node = node.inputs[1].inputs[1]
    assert node is g.parameters[0]


def test_deeply_nested_parentheses():
    g = parse_module("def f() = " + "(" * 3000 + "1" + ")" * 3000)["f"]
    assert g.output.value == 1


def test_deeply_nested_ifs():
    module = parse_module("def f(c) = " + "if c then " * 3000 + "1" + " else 2" * 3000)
    graphs, mng = graphs_of(module)
    assert len(graphs) == 1 + 2 * 3000
    assert "✓" * 3000 + "f" in graphs and "✗✓" + "✓" * 2998 + "f" in graphs


def test_deeply_nested_lets_lambdas_and_operators():
    g = parse_module("def f(c) = " + "let a = (" * 3000 + "c + 1" + ") in a" * 3000)["f"]
    assert g.output.name == "a" and term(g.output) == ("add", "c", 1)
    g = parse_module("def f(c) = " + "lambda (x) " * 3000 + "x + c" + " end" * 3000)["f"]
    assert g.output.value.name == "lambda"
    g = parse_module("def f(c) = " + "not " * 3000 + "c")["f"]
    assert prim(g.output, "logical_not")
    g = parse_module("def f(c) = c" + " ** c" * 3000)["f"]
    assert prim(g.output, "pow") and g.output.inputs[1] is g.parameters[0]
    g = parse_module("def f(c) = c" + " - c" * 20000)["f"]
    assert prim(g.output, "sub") and g.output.inputs[2] is g.parameters[0]


# -- precedence against Python's own parser ------------------------------------------

_PY_BIN = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.MatMult: "matmul",
           ast.Pow: "pow"}
_PY_CMP = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}


def python_term(node):
    """The same nested tuple as :func:`term`, from a Python expression's ast (small inputs)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.BinOp):
        return (_PY_BIN[type(node.op)], python_term(node.left), python_term(node.right))
    if isinstance(node, ast.UnaryOp):
        operand = python_term(node.operand)
        if isinstance(node.op, ast.Not):
            return ("logical_not", operand)
        if isinstance(node.operand, ast.Constant):
            return -operand
        return ("neg", operand)
    if isinstance(node, ast.BoolOp):
        name = "logical_and" if isinstance(node.op, ast.And) else "logical_or"
        result = python_term(node.values[0])
        for value in node.values[1:]:
            result = (name, result, python_term(value))
        return result
    if isinstance(node, ast.Compare):
        assert len(node.ops) == 1
        return (_PY_CMP[type(node.ops[0])], python_term(node.left), python_term(node.comparators[0]))
    if isinstance(node, ast.Tuple):
        return ("make_tuple",) + tuple(python_term(e) for e in node.elts)
    raise AssertionError(ast.dump(node))


# Unparenthesised operator chains from tests/programs.py (Python reads them alike).
@settings(max_examples=150, deadline=None)
@given(programs.operator_chains())
def test_precedence_matches_python(text):
    assert expr(text) == python_term(ast.parse(text, mode="eval").body)


# -- evaluation of the spec examples (when the evaluator is there) ----------------------

def test_spec_examples_run():
    run = pytest.importorskip("anfir.eval").run
    assert run(example("paper_lambda.anf")["main"], 5.0, 2.0) == 4.0
    assert run(example("hof.anf")["hof"], 2.0) == 25.0
    assert run(example("fibonacci.anf")["fibonacci"], 10) == 55
    assert run(example("closure.anf")["ms_closure"]) == (4, 5)
    assert run(parse_module("def f() = let x = 1 in let x = x + 1 in x")["f"]) == 2

"""The specialize phase: types of every node, per-signature clones, errors, fixpoints."""

from __future__ import annotations

import sys
import time
from typing import Any, Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import anfir
from anfir.abstract.shapes import dim_symbol
from anfir.abstract.typeann import abstract_from_annotation_text as T
from anfir.abstract.values import (AFunction, AScalar, ATensor, ATuple, GradFn, GraphFn, GraphSig,
                                   PrimFn)
from anfir.errors import (AnfirError, AnfirTypeError, ArityError, GradientError, InferenceError,
                          ShapeError)
from anfir.ir import CNode, FuncGraph, ValueNode, manage
from anfir.ir.walk import reachable_graphs, toposort
from anfir.passes.specialize import (abstract_of_value, infer_call, infer_new_graph, infer_node,
                                     run, specialize)
from anfir.primitives import lookup
from spec_examples import CLOSURE, FIBONACCI, HOF, MLP, PAPER, POWER

SPEC = "\n".join([FIBONACCI, HOF, CLOSURE, POWER, MLP])



@pytest.fixture(scope="module")
def spec_mod() -> anfir.Module:
    return anfir.parse(SPEC, "spec.anf")


def graphs_of(g: FuncGraph) -> list[FuncGraph]:
    return list(g.manager.graphs) if g.manager is not None else reachable_graphs([g])


def by_name(g: FuncGraph) -> dict[str, FuncGraph]:
    return {h.name: h for h in graphs_of(g)}


def all_nodes(g: FuncGraph) -> Iterator[Any]:
    for h in graphs_of(g):
        for node in toposort(h):
            yield node
            yield from node.inputs
        yield h.output


def assert_fully_typed(g: FuncGraph) -> None:
    for h in graphs_of(g):
        assert isinstance(h.abstract, GraphSig), h
    for node in all_nodes(g):
        assert node.abstract is not None, node
        assert "Bottom" not in str(node.abstract), node


def node_named(g: FuncGraph, name: str) -> Any:
    for node in all_nodes(g):
        if getattr(node, "name", None) == name and isinstance(node, CNode):
            return node
    raise KeyError(name)


def located(exc: AnfirError, line: int, text: str = "") -> None:
    assert exc.loc is not None, exc
    assert exc.loc.line == line, exc.render()
    if text:
        assert text in exc.loc.line_text
    assert "^" in exc.render()


# -- spec examples -----------------------------------------------------------------------
def test_fibonacci_is_int64_everywhere(spec_mod: anfir.Module) -> None:
    g = specialize(spec_mod["fibonacci"], [10])
    assert str(g.abstract) == "(<Int64>) -> <Int64>"
    assert_fully_typed(g)
    assert anfir.run(g, 10) == 55
    # one specialization of fibonacci: the recursive calls point at the clone itself
    fibs = [h for h in graphs_of(g) if h.name == "fibonacci"]
    assert fibs == [g]


def test_power_loop_and_closure_types(spec_mod: anfir.Module) -> None:
    g = specialize(spec_mod["power"], [2.0, 3])
    assert str(g.abstract) == "(<Float64>, <Int64>) -> <Float64>"
    assert_fully_typed(g)
    loop = by_name(g)["loop"]
    assert str(loop.abstract) == "(<Int64>, <Float64>) -> <Float64>"
    assert anfir.run(g, 2.0, 3) == 8.0


def test_dpower_grad_is_inferred(spec_mod: anfir.Module) -> None:
    g = specialize(spec_mod["dpower"], [2.0])
    assert str(g.abstract) == "(<Float64>) -> <Float64>"
    assert_fully_typed(g)
    grad_node = next(n for n in all_nodes(g) if isinstance(n, CNode) and n.is_apply(lookup("grad")))
    (atom,) = grad_node.abstract.options
    assert isinstance(atom, GradFn) and atom.wrt == (0,)
    # the graph given to grad is the specialized power
    assert isinstance(atom.fn, GraphFn) and atom.fn.graph is grad_node.inputs[1].value
    assert str(atom.fn.graph.abstract) == "(<Float64>, <Int64>) -> <Float64>"


def test_hof_and_closures(spec_mod: anfir.Module) -> None:
    g = specialize(spec_mod["hof"], [2])
    assert_fully_typed(g)
    assert str(g.abstract) == "(<Int64>) -> <Int64>"
    assert str(by_name(g)["g"].abstract) == "(<Func @f>, <Int64>) -> <Int64>"
    assert anfir.run(g, 2) == 25
    c = specialize(spec_mod["ms_closure"], [])
    assert_fully_typed(c)
    assert str(c.abstract) == "() -> <Tuple(<Int64>, <Int64>)>"
    assert str(by_name(c)["lambda"].abstract) == "(<Int64>) -> <Int64>"
    assert anfir.run(c, ) == (4, 5)


def test_paper_main() -> None:
    mod = anfir.parse(PAPER)
    g = specialize(mod["main"], [3, 4])
    assert_fully_typed(g)
    assert str(g.abstract) == "(<Int64>, <Int64>) -> <Float64>"
    assert str(node_named(g, "ret").abstract) == "<Float64>"
    assert str(node_named(g, "b").abstract) == "<Int64>"


def test_mlp_loss_from_annotations(spec_mod: anfir.Module) -> None:
    g = specialize(spec_mod["mlp_loss"], None)
    assert_fully_typed(g)
    assert str(node_named(g, "h").abstract) == "<f64[B, H]>"
    assert str(node_named(g, "out").abstract) == "<f64[B, K]>"
    assert str(g.abstract.out) == "<Float64>"
    assert g.abstract.params[0].shape == (dim_symbol("D"), dim_symbol("H"))
    # the same graph runs on any consistent sizes
    rng = np.random.default_rng(0)
    args = [rng.normal(size=s) for s in [(3, 4), (4, 2), (5, 3), (5, 2)]]
    assert np.isclose(anfir.run(g, *args), anfir.run(spec_mod["mlp_loss"], *args))


def test_mlp_loss_with_examples_checks_annotations(spec_mod: anfir.Module) -> None:
    ok = [np.ones((3, 4)), np.ones((4, 2)), np.ones((5, 3)), np.ones((5, 2))]
    g = specialize(spec_mod["mlp_loss"], ok)
    assert str(node_named(g, "h").abstract) == "<f64[5, 4]>"
    bad = [np.ones((3, 4)), np.ones((5, 2)), np.ones((5, 3)), np.ones((5, 2))]
    with pytest.raises(AnfirTypeError, match="dimension H") as info:
        specialize(spec_mod["mlp_loss"], bad)
    mlp_line = SPEC.splitlines().index(MLP.splitlines()[0]) + 1
    located(info.value, mlp_line, "w2: f64[H, K]")


def test_user_graphs_are_not_modified(spec_mod: anfir.Module) -> None:
    g = spec_mod["fibonacci"]
    before = [(n, n.inputs) for n in toposort(g)]
    specialize(g, [3])
    assert [(n, n.inputs) for n in toposort(g)] == before
    assert all(n.abstract is None for n, _ in before)
    assert all(i.abstract is None for _, ins in before for i in ins)
    assert g.abstract is None


# -- specialization per signature and folding -------------------------------------------
def test_one_clone_per_signature() -> None:
    mod = anfir.parse("def id(x) = x\ndef main(a, b) = (id(a), id(b), id(a))")
    g = specialize(mod["main"], [1, 2.0])
    assert_fully_typed(g)
    sigs = sorted(str(h.abstract) for h in graphs_of(g) if h is not g)
    assert sigs == ["(<Float64>) -> <Float64>", "(<Int64>) -> <Int64>"]
    callees = [n.inputs[0].value for n in g.nodes() if isinstance(n, CNode)
               and isinstance(n.inputs[0], ValueNode) and isinstance(n.inputs[0].value, FuncGraph)]
    assert len(callees) == 3 and callees[0] is callees[2] and callees[0] is not callees[1]
    assert anfir.run(g, 1, 2.0) == (1, 2.0, 1)


def test_scalar_values_are_widened_at_calls() -> None:
    mod = anfir.parse("def f(n) = n + 1\ndef main(x) = (f(1), f(2), f(x))")
    g = specialize(mod["main"], [5])
    assert len(graphs_of(g)) == 2  # f specialized once, for <Int64>
    assert str(g.abstract.params[0]) == "<Int64>"  # example values are not kept


def test_function_value_used_with_two_signatures() -> None:
    mod = anfir.parse("def apply(f, x) = f(x)\n"
                      "def main(x) = let sq = lambda (v) v * v end in (apply(sq, x), apply(sq, 2.5))")
    g = specialize(mod["main"], [3])
    assert_fully_typed(g)
    assert anfir.run(g, 3) == (9, 6.25)
    applies = sorted(str(h.abstract) for h in graphs_of(g) if h.name.startswith("apply"))
    assert applies == ["(<Func @sq_1>, <Int64>) -> <Int64>", "(<Func @sq_2>, <Float64>) -> <Float64>"]


def test_switch_on_known_condition_is_folded() -> None:
    mod = anfir.parse('def main(x) = if 3 > 2 then x + 1 else x * "no"')
    g = specialize(mod["main"], [1])
    assert_fully_typed(g)
    prims = {n.inputs[0].value.name for n in all_nodes(g) if isinstance(n, CNode)
             and isinstance(n.inputs[0], ValueNode) and not isinstance(n.inputs[0].value, FuncGraph)}
    assert "switch" not in prims and "mul" not in prims
    assert anfir.run(g, 1) == 2


def test_constant_folding_inside_a_graph() -> None:
    mod = anfir.parse("def main(x) = let a = 2 * 3 in let b = a > 5 in (a, b, x)")
    g = specialize(mod["main"], [1.0])
    assert str(node_named(g, "a").abstract) == "<Int64 = 6>"
    assert str(node_named(g, "b").abstract) == "<Bool = true>"


def test_tuples_strings_none_and_casts() -> None:
    src = ('def main(t, s) = let a = t[0] in let b = t[1] in '
           '(a, b, len(t), s, None, cast(a, "f32"), cast(array(((1, 2), (3, 4))), "f32"))')
    g = specialize(anfir.parse(src)["main"], [(1, 2.0), "hi"])
    assert_fully_typed(g)
    assert str(g.abstract.out) == ("<Tuple(<Int64>, <Float64>, <Int64 = 2>, <String = \"hi\">, <None>, "
                                   "<Float32>, <f32[2, 2]>)>")


def test_tensor_program_with_symbols() -> None:
    src = ('def main(x: f64[B, N], v: f64[N]) = let s = sum(x * v, 1) in '
           'let r = reshape(x, (-1,)) in let t = transpose(x) in let z = zeros(shape(x)) in '
           '(s, r, t @ x, z, mean(x, 0))')
    g = specialize(anfir.parse(src)["main"], None)
    assert_fully_typed(g)
    assert str(g.abstract.out) == ("<Tuple(<f64[B]>, <f64[B*N]>, <f64[N, N]>, <f64[B, N]>, "
                                   "<f64[N]>)>")


def test_partial_and_nested_grad() -> None:
    src = ("def f(x) = x * x * x\n"
           "def main(x) = (grad(grad(f))(x), value_and_grad(f)(x), partial(f)(x), "
           "partial(lambda (a, b) a * b end, 2.0)(x), grad(lambda (a, b) a * b end, 0, 1)(x, x))")
    g = specialize(anfir.parse(src)["main"], [1.5])
    assert_fully_typed(g)
    assert str(g.abstract.out) == ("<Tuple(<Float64>, <Tuple(<Float64>, <Float64>)>, <Float64>, "
                                   "<Float64>, <Tuple(<Float64>, <Float64>)>)>")


def test_annotations_only_without_examples() -> None:
    mod = anfir.parse("def f(x: f32[N, *], k: i64) = x * 2.0")
    g = specialize(mod["f"], None)
    assert str(g.abstract) == "(<f32[N, *]>, <Int64>) -> <f32[N, *]>"
    with pytest.raises(InferenceError, match="parameter x") as info:
        specialize(anfir.parse("def f(x) = x")["f"], None)
    located(info.value, 1)


def test_example_values_can_be_abstract() -> None:
    mod = anfir.parse("def f(x, y) = x @ y")
    g = run(mod["f"], [T("f32[B, 3]"), T("f32[3, 4]")])
    assert str(g.abstract) == "(<f32[B, 3]>, <f32[3, 4]>) -> <f32[B, 4]>"
    assert abstract_of_value(np.zeros((2, 3), np.float32)) == T("f32[2, 3]")
    assert abstract_of_value((1, True, None, "s")) == ATuple((
        AScalar("i64", 1), AScalar("bool", True), abstract_of_value(None), abstract_of_value("s")))


# -- errors ---------------------------------------------------------------------------------
def err(src: str, entry: str, args: Any, kind: type) -> AnfirError:
    mod = anfir.parse(src)
    with pytest.raises(kind) as info:
        specialize(mod[entry], args)
    return info.value


def test_matmul_shape_error_is_located() -> None:
    e = err("def f(a: f64[2, 3], b: f64[2, 3]) =\n  a @ b", "f", None, ShapeError)
    located(e, 2, "a @ b")
    assert "f64[2, 3] @ f64[2, 3]" in e.message


def test_annotation_contradicted_by_body_points_at_annotation() -> None:
    e = err("def f(x: f64) -> i64 =\n  x * 2.0", "f", None, AnfirTypeError)
    located(e, 1)
    assert e.loc.col == 18  # the `i64` of the return annotation
    e = err("def f(x: f64[N]) =\n  let y: f64[M, N] = x + 1.0 in y", "f", None, AnfirTypeError)
    located(e, 2)
    assert e.loc.col == 10


def test_call_errors() -> None:
    located(err("def f(x) =\n  x(1)", "f", [1], AnfirTypeError), 2, "x(1)")
    e = err("def g(a, b) = a\ndef f(x) =\n  let h = (g, g) in h[0](x)", "f", [1], ArityError)
    located(e, 3)
    e = err("def f(x) =\n  if x then 1 else 2", "f", [1], AnfirTypeError)
    located(e, 2)
    assert "bool" in e.message
    e = err("def f(x) =\n  if x > 0 then 1 else 2.0", "f", [1], AnfirTypeError)
    located(e, 2)
    assert "<Int64 = 1> and <Float64 = 2.0>" in e.message
    e = err("def g(x: f64) = x\ndef f(y) =\n  g(y)", "f", [1], AnfirTypeError)
    located(e, 3)
    assert "annotation f64" in e.message


def test_gradient_errors() -> None:
    e = err("def f(x) = x * 2.0\ndef g(x) =\n  grad(f)(x)", "g", [np.ones(3)], GradientError)
    located(e, 3)
    assert "grad of a function whose output is not a scalar (got <f64[3]>)" in e.message
    e = err("def f(x) = x * 2.0\ndef g(x) =\n  grad(f)(x)", "g", [1], GradientError)
    located(e, 3)
    assert "integer arguments are not supported" in e.message
    e = err("def f(x) = x\ndef g(x) =\n  grad(f, x)(1.0)", "g", [0], GradientError)
    assert "constants" in e.message


def test_recursion_without_base_case_is_an_error_not_a_hang() -> None:
    start = time.time()
    e = err("def f(x) =\n  f(x)", "f", [1], InferenceError)
    located(e, 2, "f(x)")
    assert "base case" in e.message
    e = err("def f(x) = g(x)\ndef g(x) = f(x)", "f", [1], InferenceError)
    assert e.loc is not None
    assert time.time() - start < 5


def test_growing_signatures_stop() -> None:
    e = err("def f(x) =\n  f((x, 1))", "f", [1], InferenceError)
    located(e, 2)
    assert "inference does not terminate for f (signatures keep growing" in e.message
    e = err("def f(x) =\n  f((x, x))", "f", [1], InferenceError)
    assert "signatures keep growing" in e.message


def test_recursive_type_that_cannot_be_inferred() -> None:
    e = err("def f(n) =\n  if n < 1 then 1 else (f(n - 1),)", "f", [3], AnfirTypeError)
    located(e, 2)


# -- recursion ---------------------------------------------------------------------------------
def test_mutual_recursion_and_values_in_recursion() -> None:
    src = ("def even(n) = if n == 0 then true else odd(n - 1)\n"
           "def odd(n) = if n == 0 then false else even(n - 1)\n"
           "def count(n, acc) = if n < 1 then acc else count(n - 1, acc + 1)\n"
           "def main(n) = (even(n), count(n, 0), count(n, 0.5))")
    g = specialize(anfir.parse(src)["main"], [7])
    assert_fully_typed(g)
    assert str(g.abstract.out) == "<Tuple(<Bool>, <Int64>, <Float64>)>"
    assert anfir.run(g, 7) == (False, 7, 7.5)


def test_nested_loops_reach_a_fixpoint() -> None:
    src = '''
def main(n) =
  let outer = lambda (i, acc)
    if i < n then
      let inner = lambda (j, a) if j < i then inner(j + 1, a + 1.0) else a end in
      outer(i + 1, inner(0, acc))
    else acc end in
  outer(0, 0.0)
'''
    g = specialize(anfir.parse(src)["main"], [4])
    assert_fully_typed(g)
    assert anfir.run(g, 4) == 6.0


@pytest.fixture
def default_recursion_limit() -> Iterator[None]:
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # Python's default, whatever other modules set
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


def test_long_programs_at_the_default_recursion_limit(default_recursion_limit: None) -> None:
    n = 1000
    chain = "\n".join(f"def f{i}(x) = f{i + 1}(x) + 1" for i in range(n)) + f"\ndef f{n}(x) = x * 2"
    g = specialize(anfir.parse(chain)["f0"], [1])
    assert str(g.abstract) == "(<Int64>) -> <Int64>"
    assert anfir.run(g, 3) == 6 + n
    lines = ["def main(x) ="] + [f"  let x{i} = {'x' if i == 0 else f'x{i - 1}'} * 2.0 + 1 in"
                                 for i in range(5000)] + ["  x4999"]
    g = specialize(anfir.parse("\n".join(lines))["main"], [1.0])
    assert str(g.abstract) == "(<Float64>) -> <Float64>"


# -- typing new graphs -------------------------------------------------------------------------
def test_infer_new_graph_types_in_place_without_reinference() -> None:
    f = specialize(anfir.parse("def f(x) = x * 2.0")["f"], [1.0])
    f_nodes = {n: n.abstract for n in toposort(f)}
    g = FuncGraph("new")
    y = g.add_parameter("y")
    inner = FuncGraph("inner")
    inner.output = inner.apply(lookup("add"), y, 1.0)
    call = g.apply(f, g.apply(inner))
    g.output = g.apply(lookup("make_tuple"), call, y)
    manage(g)
    out = infer_new_graph(g, [AScalar("f64")])
    assert str(out) == "<Tuple(<Float64>, <Float64>)>"
    assert str(g.abstract) == "(<Float64>) -> <Tuple(<Float64>, <Float64>)>"
    assert str(inner.abstract) == "() -> <Float64>"
    assert {n: n.abstract for n in toposort(f)} == f_nodes


def test_infer_call_and_infer_node() -> None:
    matmul = AFunction(frozenset({PrimFn(lookup("matmul"))}))
    assert infer_call(matmul, [T("f64[B, 3]"), T("f64[3, K]")]) == T("f64[B, K]")
    with pytest.raises(ShapeError):
        infer_call(matmul, [T("f64[B, 3]"), T("f64[2, K]")])
    g = specialize(anfir.parse("def f(x) = x + 1")["f"], [1.5])
    node = next(g.cnodes())
    node.abstract = None
    assert str(infer_node(node)) == "<Float64>"
    assert isinstance(infer_call(AFunction(frozenset({GraphFn(g)})), [AScalar("f64")]), AScalar)


# -- the specialized graphs compute what the originals compute --------------------------------
@settings(max_examples=25, deadline=None)
@given(n=st.integers(0, 12), x=st.floats(-3, 3), k=st.integers(0, 5))
def test_specialized_graphs_compute_the_same(spec_mod: anfir.Module, n: int, x: float, k: int) -> None:
    for name, args in [("fibonacci", (n,)), ("power", (x, k)), ("hof", (k,))]:
        g = _specialized(spec_mod, name, args)
        assert anfir.run(g, *args) == anfir.run(spec_mod[name], *args)


@settings(max_examples=15, deadline=None)
@given(b=st.integers(1, 4), d=st.integers(1, 4), h=st.integers(1, 4), k=st.integers(1, 3),
       seed=st.integers(0, 1000))
def test_symbolic_mlp_runs_on_any_sizes(spec_mod: anfir.Module, b: int, d: int, h: int, k: int,
                                        seed: int) -> None:
    g = _specialized(spec_mod, "mlp_loss", None)
    rng = np.random.default_rng(seed)
    args = [rng.normal(size=s) for s in [(d, h), (h, k), (b, d), (b, k)]]
    assert np.isclose(anfir.run(g, *args), anfir.run(spec_mod["mlp_loss"], *args))


_CACHE: dict = {}


def _specialized(mod: anfir.Module, name: str, args: Any) -> FuncGraph:
    key = (id(mod), name, None if args is None else tuple(type(a) for a in args))
    if key not in _CACHE:
        _CACHE[key] = specialize(mod[name], args)
    return _CACHE[key]


def test_dumps_show_types_and_are_deterministic(spec_mod: anfir.Module) -> None:
    first = anfir.dump_ir(specialize(spec_mod["power"], [2.0, 3]))
    second = anfir.dump_ir(specialize(spec_mod["power"], [2.0, 3]))
    assert first == second
    assert ": (<Int64>, <Int64>) -> (<Bool>)" in first


def test_tensor_results_match_the_evaluator() -> None:
    src = "def f(x, w) = let y = tanh(x @ w) in (y, sum(y, 0), y * 2.0 + 1)"
    mod = anfir.parse(src)
    x, w = np.ones((3, 2), np.float32), np.ones((2, 4), np.float32)
    g = specialize(mod["f"], [x, w])
    out = anfir.run(g, x, w)
    types = g.abstract.out.items
    for value, typ in zip(out, types):
        assert isinstance(typ, ATensor) and value.shape == typ.shape and value.dtype == np.float32


def test_function_values_never_called_get_unknown_argument_types(spec_mod: anfir.Module) -> None:
    g = specialize(spec_mod["func_outer"], [1, 2])
    assert_fully_typed(g)
    assert str(g.abstract) == "(<Int64>, <Int64>) -> <Func @lambda>"
    assert str(by_name(g)["lambda"].abstract) == "(<Any>) -> <Any>"
    src = ("def apply(f, x) = f(x)\n"
           "def main(x) = let sq = lambda (v) if v > 0 then v * v else v end in\n"
           "  let p = (sq, sq) in (apply(p[0], x), apply(p[1], 2.5), sq)")
    g = specialize(anfir.parse(src)["main"], [3])
    assert_fully_typed(g)
    assert str(g.abstract.out) == "<Tuple(<Int64>, <Float64>, <Func @sq_3>)>"
    assert anfir.run(g, 3)[:2] == (9, 6.25)


def test_ill_typed_code_that_is_never_called_is_not_an_error() -> None:
    src = "def main(x) = let bad = lambda (v) if 3 then v else v end in (x, bad)"
    g = specialize(anfir.parse(src)["main"], [1])
    assert str(g.abstract.params[0]) == "<Int64>"


def test_infer_new_graph_handles_recursion() -> None:
    g = FuncGraph("countdown")
    n = g.add_parameter("n")
    then = FuncGraph("then")
    then.output = ValueNode(0.0)
    other = FuncGraph("else")
    other.output = other.apply(lookup("add"), other.apply(g, other.apply(lookup("sub"), n, 1)), 1.0)
    g.output = g.apply(g.apply(lookup("switch"), g.apply(lookup("lt"), n, 1), then, other))
    manage(g)
    assert str(infer_new_graph(g, [AScalar("i64")])) == "<Float64>"
    assert str(other.abstract) == "() -> <Float64>"
    assert anfir.run(g, 4) == 4.0


def test_infer_new_graph_types_closures_it_returns() -> None:
    g = FuncGraph("make")
    a = g.add_parameter("a")
    inner = FuncGraph("adder")
    c = inner.add_parameter("c")
    inner.output = inner.apply(lookup("mul"), a, c)
    g.output = ValueNode(inner)
    manage(g)
    assert str(infer_new_graph(g, [AScalar("f64")])) == "<Func @adder>"
    assert str(inner.abstract) == "(<Any>) -> <Any>"

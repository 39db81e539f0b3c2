"""The ``.ir`` dump and its loader: printing then loading gives back the same program.

Also the generated-program round trips of both printers (``to_text`` -> parse,
``dump_ir`` -> load): isomorphic graphs that compute the same values.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import anfir
import programs
from anfir.abstract.lattice import BOTTOM
from anfir.abstract.shapes import dim_symbol
from anfir.abstract.values import (AAny, AEnv, AFunction, AKey, ANone, AScalar, AString, ATensor,
                                   ATuple, AType, GradFn, GraphFn, GraphSig, JFn, PartialFn,
                                   PrimFn)
from anfir.errors import AnfirError, AnfirSyntaxError, NameResolutionError, UsageError
from anfir.grammar.ir_loader import load_ir_text
from anfir.ir import FuncGraph, Location, ValueNode, manage
from anfir.ir.annotations import ScalarAnn, TensorAnn, TupleAnn
from anfir.primitives import PRIMITIVES as P
from anfir.printers.ir import dump_ir, write_ir
from anfir.printers.iso import assert_isomorphic
from anfir.runtime_values import Closure, DType, GradEnv, Partial, Symbol, SymbolicKey
from spec_examples import PAPER, HOF, FIBONACCI as FIB, CLOSURE, POWER, MLP

_RNG = np.random.default_rng(0)
SPEC = {
    "paper": (PAPER, "main", (5.0, 2.0), 4.0),
    "hof": (HOF, "hof", (2.0,), 25.0),
    "fib": (FIB, "fibonacci", (10,), 55),
    "closure": (CLOSURE, "ms_closure", (), (4, 5)),
    "power": (POWER, "dpower", (2.0,), 12.0),
    "mlp": (MLP, "mlp_loss", tuple(_RNG.random(s) for s in [(3, 4), (4, 2), (5, 3), (5, 2)]), None),
}


def same(a, b) -> bool:
    """Equal results (nan equals nan; tuples and arrays elementwise; types too)."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y):
            stack.extend(zip(x, y))
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not np.array_equal(np.asarray(x), np.asarray(y), equal_nan=True):
                return False
        elif isinstance(x, float) and isinstance(y, float):
            if not (x == y or (math.isnan(x) and math.isnan(y))):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def roundtrip(obj):
    """dump -> load -> dump: the loaded program and the second dump (which must equal the first)."""
    text = dump_ir(obj, "04_test")
    loaded = load_ir_text(text, "rt.ir")
    again = dump_ir(loaded if isinstance(obj, anfir.Module) else loaded.ir_entry, "04_test")
    assert again == text
    return loaded


# -- the spec's examples --------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SPEC))
def test_spec_examples_round_trip_and_compute_the_same(name):
    src, entry, args, expected = SPEC[name]
    mod = anfir.parse(src, f"{name}.anf")
    loaded = roundtrip(mod)
    assert_isomorphic(mod, loaded)
    assert loaded.phase == "04_test"
    got, want = anfir.run(loaded[entry], *args), anfir.run(mod[entry], *args)
    assert same(got, want)
    if expected is not None:
        assert same(got, expected)


def test_fibonacci_dump_is_readable_as_specified():
    text = dump_ir(anfir.parse(FIB, "fib.anf"), "00_parse")
    lines = text.splitlines()
    assert lines[:3] == ["# IR entry: @fibonacci", "# Phase: 00_parse",
                         "# Definitions: fibonacci=@fibonacci"]
    assert "# Total params: 1" in lines and "# Total subgraphs: 5" in lines
    assert "subgraph @fibonacci(%para1_n) {" in lines
    assert "subgraph @✗fibonacci parent: @fibonacci () {" in lines
    assert "  %1 = eq($(@fibonacci:%para1_n), 1)" in lines
    assert "  %2 = switch(%1, @✓✗fibonacci, @✗✗fibonacci)" in lines
    assert "      # fib.anf:4:8    else fibonacci(n - 1) + fibonacci(n - 2)" not in lines  # col of the call
    assert any(line.startswith("      # fib.anf:4:") and line.endswith(
        "  else fibonacci(n - 1) + fibonacci(n - 2)") for line in lines)


def test_node_line_with_name_types_and_location_like_the_spec():
    mod = anfir.parse(PAPER, "test_f.anf")
    g = mod["main"]
    for node in g.cnodes():
        node.abstract = AScalar("f64")
    for p in g.parameters:
        p.abstract = AScalar("f64")
    text = dump_ir(g)
    assert "  %4(c) = mul(%2, %3)\n      : (<Float64>, <Float64>) -> (<Float64>)\n" \
           "      # test_f.anf:8:15      let c = b * %1 in\n" in text
    assert "  %3(%1) = @func(%1, %2)" in text
    assert "#   %para1_x : <Float64>" in text
    loaded = roundtrip(g).ir_entry
    assert_isomorphic(g, loaded)
    c = loaded.output
    assert c.name == "c" and str(c.abstract) == "<Float64>"
    assert c.loc == Location("test_f.anf", 8, 15, "    let c = b * %1 in")


def test_free_variables_print_with_their_owner():
    text = dump_ir(anfir.parse(CLOSURE))
    assert "subgraph @lambda parent: @func_outer (%para1_c) {" in text
    assert "  %1 = add($(@func_outer:%para1_a), $(@func_outer:%para2_b))" in text
    power = dump_ir(anfir.parse(POWER))
    assert "  %2 = mul($(@loop:%para2_acc), $(@power:%para1_x))" in power


def test_duplicate_graph_names_are_made_unique_and_kept_on_load():
    mod = anfir.parse("def f(x) = (lambda (a) a + x end)(1) + (lambda (b) b * x end)(2)")
    text = dump_ir(mod)
    assert "subgraph @lambda parent: @f" in text and "subgraph @lambda.1 parent: @f" in text
    loaded = roundtrip(mod)
    names = sorted(g.name for g in manage(loaded["f"]).graphs)
    assert names == ["f", "lambda", "lambda.1"]
    assert anfir.run(loaded["f"], 3) == anfir.run(mod["f"], 3) == 10


def test_dumps_are_deterministic():
    first = dump_ir(anfir.parse(POWER + CLOSURE), "01_resolve")
    second = dump_ir(anfir.parse(POWER + CLOSURE), "01_resolve")
    assert first == second
    assert "0x" not in first


def test_locations_with_notes_annotations_and_flags_survive():
    g = FuncGraph("f", Location("a b.anf", 1, 1, "def f(x: f64[N, *]) -> (f64, i64) ="))
    x = g.add_parameter("x", Location("a b.anf", 1, 7, "def f(x) =", note="ad: ▸f < inline"))
    x.annotation = TensorAnn("f64", ("N", "*"))
    h = g.apply(P["mul"], x, 2.0, name="h", loc=Location("a b.anf", 2, 3, "  g(f, x)", note="x"))
    h.annotation = TensorAnn("f32", (2, "N"))
    g.output = g.apply(P["make_tuple"], h, 1, loc=Location("a b.anf", 3, 9, ""))
    g.flags.update(return_type=TupleAnn((ScalarAnn("f64"), ScalarAnn("i64"))), core=True, rounds=3)
    manage(g)
    loaded = roundtrip(g).ir_entry
    assert_isomorphic(g, loaded)
    lx = loaded.parameters[0]
    assert lx.loc == x.loc and str(lx.annotation) == "f64[N, *]"
    lh = loaded.output.inputs[1]
    assert lh.loc == h.loc and lh.loc.note == "x" and str(lh.annotation) == "f32[2, N]"
    assert loaded.output.loc == Location("a b.anf", 3, 9, "")
    assert loaded.loc == g.loc
    assert str(loaded.flags["return_type"]) == "(f64, i64)"
    assert loaded.flags["core"] is True and loaded.flags["rounds"] == 3


def _all_constants_graph() -> FuncGraph:
    h = FuncGraph("h")
    h.output = h.add_parameter("x")
    gone = FuncGraph("gone")
    gone.output = ValueNode(1)
    g = FuncGraph("f")
    x = g.add_parameter("x")
    B = dim_symbol("B")
    constants = [
        (1, (2.5, 's\t"\\é\n'), None, True, (h,)), np.float32(0.1), np.int8(-3), Symbol("foo"),
        SymbolicKey("k x"), DType("f32"), Partial(P["add"], (1,)), Closure(h, ()),
        GradEnv({SymbolicKey("a"): 1.0}), GradEnv(), float("nan"), float("-inf"), -0.0, 1e300, -5,
        np.array([[True]]), np.zeros((0, 3), np.int32), np.array(2.0),
        np.array([0.1, 1e-7, 3.0], np.float32), np.arange(6, dtype=np.uint8).reshape(3, 2, 1),
    ]
    node = x
    for c in constants:
        node = g.apply(P["make_tuple"], node, c)
    node.abstract = ATuple((
        AScalar("f64", 1.5), ATensor("f32", (2 * B + 1, 3, B ** 2)), ATensor("i64", None),
        ATensor("f64", ()), AString('a"b'), AString(), ANone(), AEnv(), AKey(), AType(), AAny(),
        BOTTOM, AFunction(frozenset({GraphFn(h), PrimFn(P["add"]), GraphFn(gone)})),
        AFunction(frozenset({PartialFn(PrimFn(P["mul"]), (AScalar("i64"),)), JFn(GraphFn(h)),
                             GradFn(GraphFn(h), (0, 1), True), GradFn(GraphFn(h), ())})),
        AScalar("bool", True), AScalar("i64", -3), AScalar("f64", float("nan"))))
    x.abstract = ATensor("f64", (B, 2))
    g.output = node
    g.abstract = GraphSig((x.abstract,), node.abstract)
    manage(g)
    return g


def test_every_kind_of_constant_and_type_round_trips_exactly():
    g = _all_constants_graph()
    text = dump_ir(g)
    for piece in ['Scalar[f32](0.1)', 'Key("k x")', "Symbol(foo)", "DType(f32)", "Partial(add, 1)",
                  "Closure(@h, ())", "GradEnv(Key(a): 1.0)", "-inf", "-0.0", "1e+300",
                  "Tensor[i32, (0, 3)]([])", "Tensor[f64, ()](2.0)", "Tensor[f32, (3,)]([0.1, 1e-07, 3.0])",
                  "<f32[2*B+1, 3, B**2]>", "<Func {@?gone, @h, add}>", "value_and_grad(@h, 0, 1)",
                  "<Bottom>", "subgraph @h(%para1_x)"]:
        assert piece in text, piece
    loaded = roundtrip(g).ir_entry
    assert_isomorphic(g, loaded)
    out = loaded.output
    f32 = out.inputs[1].inputs[2].value
    assert f32.dtype == np.float32 and f32.tolist() == [float(np.float32(v)) for v in (0.1, 1e-7, 3.0)]
    assert out.inputs[2].value.dtype == np.uint8 and out.inputs[2].value.shape == (3, 2, 1)
    dims = out.abstract.items[1].shape
    assert dims[0] == 2 * dim_symbol("B") + 1 and dims[2] == dim_symbol("B") ** 2


def test_numpy_scalar_in_an_abstract_value_prints_as_anf() -> None:
    # np.float64 is a float subclass: its repr ``np.float64(0.5)`` is not ANF.
    assert str(AScalar("f64", np.float64(0.5))) == "<Float64 = 0.5>"
    assert str(AScalar("bool", np.bool_(True))) == "<Bool = true>"


def test_every_primitive_and_meta_function_reads_back_by_name():
    # (also guards against a future primitive named like a word of the dump syntax)
    from anfir.primitives import META_FUNCTIONS

    g = FuncGraph("all")
    g.output = g.apply(P["make_tuple"], *P.values(), *META_FUNCTIONS.values())
    manage(g)
    loaded = roundtrip(g).ir_entry
    assert_isomorphic(g, loaded)


def test_large_tensors_go_to_the_side_file(tmp_path):
    big = np.arange(100.0).reshape(10, 10)
    g = FuncGraph("f")
    x = g.add_parameter("x")
    g.output = g.apply(P["add"], g.apply(P["mul"], x, big), big)
    manage(g)
    side: dict = {}
    text = dump_ir(g, side=side)
    assert 'Tensor[f64, (10, 10)](npz["t0"])' in text and list(side) == ["t0"]
    assert "npz" not in dump_ir(g)  # without a side dict every tensor is printed in full
    paths = write_ir(g, tmp_path / "05_optimize.ir", "05_optimize")
    assert [p.name for p in paths] == ["05_optimize.ir", "05_optimize.npz"]
    npz_bytes = paths[1].read_bytes()
    write_ir(g, tmp_path / "05_optimize.ir", "05_optimize")
    assert paths[1].read_bytes() == npz_bytes  # deterministic side file too
    loaded = anfir.load(str(tmp_path / "05_optimize.ir"))
    assert_isomorphic(g, loaded.ir_entry)
    assert np.array_equal(anfir.run(loaded.ir_entry, 2.0), anfir.run(g, 2.0))
    paths[1].unlink()
    with pytest.raises(AnfirSyntaxError, match="05_optimize.npz"):
        anfir.load(str(tmp_path / "05_optimize.ir"))


def test_pipeline_dumps_load_back_and_rerun(tmp_path):
    mod = anfir.parse(FIB + CLOSURE, "prog.anf")
    anfir.compile(mod, entry="fibonacci", args=(10,), dump_dir=str(tmp_path))
    dumps = sorted(tmp_path.glob("*.ir"))
    assert [p.name[:3] for p in dumps] == [f"{i:02d}_" for i in range(len(dumps))]
    assert len(dumps) >= 7
    for path in dumps:
        text = path.read_text(encoding="utf-8")
        loaded = anfir.load(str(path))
        assert dump_ir(loaded if len(loaded) > 1 else loaded.ir_entry, loaded.phase) == text, path
        assert anfir.run(loaded["fibonacci"], 10) == 55


AD_SOURCE = """def f(x, y) =
  let g = lambda (z) z * x + y end in
  if x < y then g(x) * g(y) else sin(x) * y

def loopy(x) =
  let loop = lambda (i, acc) if i < 3 then loop(i + 1, acc * x) else acc end in
  loop(0, 1.0)
"""


@pytest.mark.parametrize("name, args", [("f", (1.5, 2.0)), ("f", (3.0, 2.0)), ("loopy", (1.3,))])
def test_gradient_graphs_round_trip(name, args):
    mod = anfir.parse(AD_SOURCE, "ad.anf")
    wrt = tuple(range(len(args)))
    for graph in (anfir.grad(mod[name]), anfir.value_and_grad(mod[name], wrt=wrt)):
        loaded = roundtrip(graph).ir_entry
        assert_isomorphic(graph, loaded)
        assert same(anfir.run(loaded, *args), anfir.run(graph, *args))
        assert "Key(" in dump_ir(graph)  # closure gradients travel in environments
        assert 'Key("' in anfir.to_text(graph)  # keys have no ANF spelling: shown for reading
        from anfir.printers.text import to_text
        with pytest.raises(AnfirError, match="dump_ir"):
            to_text(graph, strict=True)


def test_deep_programs_at_the_default_recursion_limit():
    assert sys.getrecursionlimit() <= 1000 + 100
    g = FuncGraph("chain")
    node = g.add_parameter("x")
    for _ in range(10000):
        node = g.apply(P["add"], node, 1)
    g.output = node
    manage(g)
    loaded = roundtrip(g).ir_entry
    assert_isomorphic(g, loaded)
    assert anfir.run(loaded, 0) == 10000
    nested = "def f(n) =\n" + "".join(f"  if n < {i} then {i} else\n" for i in range(600)) + "  n\n"
    mod = anfir.parse(nested)
    loaded = roundtrip(mod)
    assert_isomorphic(mod, loaded)
    assert anfir.run(loaded["f"], 300) == 301


# -- errors ------------------------------------------------------------------------------
_GOOD = """# IR entry: @f
subgraph @f(%para1_x) {
  %1 = add(%para1_x, 1)
  return %1
}
"""


@pytest.mark.parametrize("text, kind, line, col, words", [
    (_GOOD.replace("add(", "addd("), NameResolutionError, 3, 8, "unknown primitive addd"),
    (_GOOD.replace("return %1", "return %7"), NameResolutionError, 4, 10, "%7 is not defined"),
    (_GOOD.replace("add(%para1_x, 1)", "@g(%para1_x)"), NameResolutionError, 3, 8, "never defined"),
    (_GOOD.replace("= add", "add"), AnfirSyntaxError, 3, 6, "expected"),
    (_GOOD[:-3], AnfirSyntaxError, 4, 10, "end of file"),
    (_GOOD.replace("1)", "1 ^)"), AnfirSyntaxError, 3, 24, "'^'"),
    (_GOOD + _GOOD.replace("# IR entry: @f", ""), AnfirSyntaxError, 7, 10, "defined twice"),
    (_GOOD.replace(", 1)", ", Tensor[f64, (2,)]([1.0]))"), AnfirSyntaxError, 3, 40, "2 elements"),
    (_GOOD.replace(", 1)", ", Tensor[f65, (1,)]([1.0]))"), AnfirSyntaxError, 3, 29, "dtype f65"),
    (_GOOD.replace("  return", "      : (<Float64>) -> (<Float64>)\n  return"), AnfirSyntaxError, 3, 3,
     "lists 1 inputs"),
    ("# only a comment\n", AnfirSyntaxError, 2, 1, "no subgraph"),
])
def test_bad_dumps_raise_located_errors(text, kind, line, col, words):
    with pytest.raises(kind) as info:
        load_ir_text(text, "bad.ir")
    err = info.value
    assert isinstance(err, AnfirError)
    assert (err.loc.file, err.loc.line, err.loc.col) == ("bad.ir", line, col)
    assert words in err.message
    if err.loc.line_text:
        assert err.render().splitlines()[-1].strip() == "^"


def test_a_file_that_is_not_utf8_is_a_located_error(tmp_path):
    path = tmp_path / "x.ir"
    path.write_bytes(b"# IR entry: @f\n\xff\xfe\n")
    with pytest.raises(AnfirSyntaxError) as info:
        anfir.load(str(path))
    assert (info.value.loc.line, info.value.loc.col) == (2, 1)
    with pytest.raises(UsageError, match="cannot read"):
        anfir.load(str(tmp_path / "missing.ir"))


# -- generated programs -------------------------------------------------------------------
# Programs of tests/programs.py, grammar ROUNDTRIP: a chain of lets (rebinding names
# too) of arithmetic over integers and floats, closures (nested, curried, passed to
# a higher-order function), ifs with comparisons and logic, tuples, calls of
# helpers and of a recursive def, local recursion, shadowing; every binding returned.
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs.let_chains(programs.ROUNDTRIP))
def test_generated_programs_survive_both_printers(program):
    src = program.text
    mod = anfir.parse(src, "gen.anf")
    expected = anfir.run(mod["main"], 1.5, -0.25)
    text = anfir.to_text(mod)
    reparsed = anfir.parse(text, "gen2.anf")
    assert_isomorphic(mod, reparsed)
    assert anfir.to_text(reparsed) == text
    assert same(anfir.run(reparsed["main"], 1.5, -0.25), expected)
    loaded = roundtrip(mod)
    assert_isomorphic(mod, loaded)
    assert same(anfir.run(loaded["main"], 1.5, -0.25), expected)

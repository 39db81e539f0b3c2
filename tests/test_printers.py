"""The printers: canonical ANF text (``to_text``), Graphviz (``dump_dot``), the Jupyter
picture, and the isomorphism checker they are tested with."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import anfir
from anfir.abstract.values import AScalar
from anfir.errors import AnfirError, UsageError
from anfir.grammar.parser import parse_module
from anfir.ir import FuncGraph, ValueNode, manage
from anfir.ir.annotations import ScalarAnn, TensorAnn
from anfir.primitives import PRIMITIVES as P
from anfir.printers.display import graph_svg
from anfir.printers.iso import IsomorphismError, assert_isomorphic, isomorphic
from anfir.printers.naming import anf_name, is_anf_name
from spec_examples import PAPER, HOF, FIBONACCI as FIB, CLOSURE, POWER, MLP

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = {"paper": PAPER, "hof": HOF, "fib": FIB, "closure": CLOSURE, "power": POWER, "mlp": MLP}
RUNS = {"paper": ("main", (5.0, 2.0)), "hof": ("hof", (2.0,)), "fib": ("fibonacci", (10,)),
        "closure": ("ms_closure", ()), "power": ("dpower", (2.0,)),
        "mlp": ("mlp_loss", (np.eye(3, 4), np.ones((4, 2)), np.full((5, 3), 0.5), np.zeros((5, 2))))}


def reprint(text: str) -> tuple[anfir.Module, anfir.Module, str]:
    """parse -> to_text -> parse; checks isomorphism and that printing is a fixed point."""
    mod = anfir.parse(text)
    printed = anfir.to_text(mod)
    again = anfir.parse(printed)
    assert_isomorphic(mod, again)
    assert anfir.to_text(again) == printed
    return mod, again, printed


# -- to_text -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_spec_examples_reprint_to_isomorphic_graphs(name):
    mod, again, _ = reprint(EXAMPLES[name])
    entry, args = RUNS[name]
    want, got = anfir.run(mod[entry], *args), anfir.run(again[entry], *args)
    assert np.array_equal(want, got) if isinstance(want, np.ndarray) else want == got


def test_canonical_text_of_fibonacci_and_closures():
    assert anfir.to_text(anfir.parse(FIB)) == """def fibonacci(n) =
  let %1 = n < 1 in
  if %1 then 0 else (
    let %2 = n == 1 in
    if %2 then 1 else (
      let %3 = n - 1 in
      let %4 = fibonacci(%3) in
      let %5 = n - 2 in
      let %6 = fibonacci(%5) in
      %4 + %6
    )
  )
"""
    assert anfir.to_text(anfir.parse(CLOSURE + POWER)) == """def func_outer(a, b) =
  lambda (c)
    let %1 = a + b in
    %1 + c
  end

def ms_closure() =
  let closure = func_outer(1, 2) in
  let out1 = closure(1) in
  let out2 = closure(2) in
  (out1, out2)

def power(x, n) =
  let loop = lambda (i, acc)
    let %1 = i < n in
    if %1 then (
      let %2 = i + 1 in
      let %3 = acc * x in
      loop(%2, %3)
    ) else acc
  end in
  loop(0, 1.0)

def dpower(x) =
  let %1 = grad(power) in
  %1(x, 3)
"""


def test_names_annotations_and_source_order_are_kept():
    _, _, printed = reprint(PAPER)
    assert "let %1 = func(a, b) in" in printed and "let c = b * %1 in" in printed
    # the inner lambda's parameters shadowed the outer ones: they are renamed apart
    assert "let func = lambda (x_1, y_1)" in printed
    _, _, printed = reprint(HOF)
    assert printed.index("let f = lambda") < printed.index("let g = lambda")
    _, again, printed = reprint(MLP + "def typed(v: f32[2, *]) = let w: f32[2, *] = v * 2.0 in w\n")
    assert "def mlp_loss(w1: f64[D, H], w2: f64[H, K], x: f64[B, D], y: f64[B, K]) -> f64 =" in printed
    assert "let w: f32[2, *] = v * 2.0 in" in printed
    assert str(again["typed"].output.annotation) == "f32[2, *]"


def test_locals_never_shadow_the_builtins_they_print():
    # ``+`` prints as an operator, so a local named ``add`` keeps its name ...
    mod, again, printed = reprint("def f(x) = let add = x * 2 in add + 1\n")
    assert "let add = x * 2 in" in printed and "add + 1" in printed
    # ... but a local named like a built-in printed by name is renamed apart.
    mod, again, printed = reprint("def f(x) = let y = tanh(x) in let tanh = y * 2 in tanh + 1\n")
    assert "let y = tanh(x) in" in printed and "let tanh_1 = y * 2 in" in printed
    assert anfir.run(again["f"], 0.5) == anfir.run(mod["f"], 0.5)


def test_literals_print_exactly():
    src = 'def f(x) = (x + -2, 0.1, 1e-300, 2.5e+300, -0.0, "q\\"b\\\\c\\nd", None, true, x ** -1)\n'
    mod, again, printed = reprint(src)
    assert "x + (-2)" in printed and "x ** (-1)" in printed and "2.5e300" in printed and '"q\\"b\\\\c\\nd"' in printed
    assert anfir.run(again["f"], 2.0) == anfir.run(mod["f"], 2.0)


def _graph_with_constants(*values) -> FuncGraph:
    g = FuncGraph("consts")
    x = g.add_parameter("x")
    g.output = g.apply(P["make_tuple"], x, *values)
    manage(g)
    return g


def test_constants_without_a_literal_are_normalised_to_equal_values():
    arrays = (np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([1, 2], np.int32),
              np.zeros((2, 0)), np.array(7.5), np.array([True, False]))
    g = _graph_with_constants(*arrays, (1, (2.0, "s")), math.inf, -math.inf, math.nan,
                              np.float32(1.5))
    printed = anfir.to_text(g)
    assert "array(((1.0, 2.0), (3.0, 4.0)))" in printed
    assert 'cast(array((1, 2)), "i32")' in printed and 'zeros((2, 0), "f64")' in printed
    assert "1e999" in printed and "-1e999" in printed and "div(0.0, 0.0)" in printed
    got = anfir.run(anfir.parse(printed)["consts"], 0)
    want = anfir.run(g, 0)
    assert len(got) == len(want)
    for a, b in zip(got[1:6], want[1:6]):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    assert got[6] == (1, (2.0, "s")) and got[7] == math.inf and got[8] == -math.inf
    assert math.isnan(got[9]) and got[10] == 1.5


def test_switch_calls_that_are_not_ifs_print_as_calls():
    src = ("def f(c, x) =\n  let a = lambda (y) y + 1 end in\n  let b = lambda (y) y * 2 end in\n"
           "  switch(c, a, b)(x)\n")
    mod, again, printed = reprint(src)
    assert "switch(c, a, b)" in printed and "if " not in printed
    assert anfir.run(again["f"], False, 5) == 10


def test_symbols_print_as_bare_names():
    mod = parse_module("def f(x) = g(x) + 1\ndef g(y) = y * 2\n", resolve=False)
    printed = anfir.to_text(mod)
    assert "let %1 = g(x) in" in printed and "%1 + 1" in printed
    assert_isomorphic(mod, parse_module(printed, resolve=False))


def test_illegal_names_are_made_legal():
    assert anf_name("✓fibonacci") == "ok_fibonacci" and anf_name("✗✓f") == "no_ok_f"
    assert anf_name("▸f") == "fwd_f" and anf_name("lambda") == "lambda_"
    assert anf_name("lambda.1") == "lambda_1" and anf_name("%1") == "%1"
    assert is_anf_name(anf_name("a b→c")) and not is_anf_name("in")
    helper = FuncGraph("▸weird name")
    hx = helper.add_parameter("✓x")
    helper.output = helper.apply(P["neg"], helper.apply(P["mul"], hx, 2))
    g1, g2 = FuncGraph("✓f"), FuncGraph("g")
    for g in (g1, g2):
        x = g.add_parameter("x")
        g.output = g.apply(ValueNode(helper), x)
    manage(g1, g2)
    mod = anfir.Module({"✓f": g1, "g": g2})
    printed = anfir.to_text(mod)
    # used by two definitions, the closed helper becomes a definition itself
    assert "def fwd_weird_name(ok_x) =" in printed and "def ok_f(x) =" in printed
    again = anfir.parse(printed)
    assert_isomorphic(mod, again)
    assert anfir.run(again["g"], 4) == -8


def _even_odd(use_both: bool) -> FuncGraph:
    outer = FuncGraph("outer")
    n = outer.add_parameter("n")
    even, odd = FuncGraph("even"), FuncGraph("odd")
    for me, other in ((even, odd), (odd, even)):
        k = me.add_parameter("k")
        me.output = me.apply(ValueNode(other), me.apply(P["sub"], k, n))
    calls = [outer.apply(ValueNode(even), n)]
    if use_both:
        calls.append(outer.apply(ValueNode(odd), n))
    outer.output = outer.apply(P["make_tuple"], *calls)
    manage(outer)
    return outer


def test_mutually_recursive_local_closures():
    # used only through ``even``, ``odd`` is printed inside it (where ``even`` is in scope)
    outer = _even_odd(use_both=False)
    printed = anfir.to_text(outer)
    assert printed.index("let even = lambda (k)") < printed.index("let odd = lambda (k_1)")
    assert_isomorphic(outer, anfir.parse(printed)["outer"])
    # used from outside both, the pair has no ANF spelling
    with pytest.raises(UsageError, match="mutually recursive"):
        anfir.to_text(_even_odd(use_both=True))


def test_imports_print_as_imports(tmp_path):
    (tmp_path / "lib.anf").write_text("def helper(x) = x * 2\n")
    (tmp_path / "main.anf").write_text('import "lib.anf"\ndef main(y) = helper(y) + 1\n')
    mod = anfir.load(str(tmp_path / "main.anf"))
    printed = anfir.to_text(mod)
    assert printed.startswith('import "lib.anf"\n') and "def helper" not in printed
    (tmp_path / "copy.anf").write_text(printed)
    again = anfir.load(str(tmp_path / "copy.anf"))
    assert_isomorphic(mod, again)
    assert anfir.run(again["main"], 3) == 7


def test_a_nested_graph_prints_its_whole_definition():
    mod = anfir.parse(CLOSURE)
    inner = mod["func_outer"].output.value
    assert anfir.to_text(inner) == anfir.to_text(mod["func_outer"])
    assert str(mod["ms_closure"]).startswith("def ms_closure() =")


def test_deep_programs_print_at_the_default_recursion_limit():
    assert sys.getrecursionlimit() <= 1100
    chain = "def f(x) =\n" + "".join(f"  let v{i} = {'x' if i == 0 else f'v{i - 1}'} + 1 in\n"
                                    for i in range(5000)) + "  v4999\n"
    _, again, _ = reprint(chain)
    assert anfir.run(again["f"], 0) == 5000
    nested = "def f(n) =\n" + "".join(f"  if n < {i} then {i} else\n" for i in range(800)) + "  n\n"
    _, again, printed = reprint(nested)
    assert anfir.run(again["f"], 500) == 501
    assert max(len(line) - len(line.lstrip()) for line in printed.splitlines()) <= 2 * 33
    lambdas = ("def f(x) =\n" + "".join(f"  let g{i} = lambda (y{i})\n" for i in range(400))
               + "  x" + "".join(f" end in g{i}(1)" for i in reversed(range(400))) + "\n")
    _, again, _ = reprint(lambdas)
    assert anfir.run(again["f"], 3) == 3


# -- isomorphism ---------------------------------------------------------------------------
def test_isomorphism_ignores_names_but_sees_every_difference():
    base = "def f(a, b) = let g = lambda (c) a * c - b end in g(2) + g(3)\n"
    renamed = "def h(p, q) = let k = lambda (r) p * r - q end in k(2) + k(3)\n"
    assert isomorphic(anfir.parse(base), anfir.parse(renamed))
    different = {
        "constant": base.replace("g(3)", "g(4)"),
        "constant type": base.replace("g(3)", "g(3.0)"),
        "argument order": base.replace("a * c - b", "a * c - a"),
        "operator": base.replace("a * c", "a + c"),
        "free variable": base.replace("lambda (c) a * c", "lambda (c) c * c"),
        "parameters": base.replace("lambda (c)", "lambda (c, d)").replace("g(2)", "g(2, 1)")
                          .replace("g(3)", "g(3, 1)"),
    }
    for what, text in different.items():
        with pytest.raises(IsomorphismError):
            assert_isomorphic(anfir.parse(base), anfir.parse(text))
        assert not isomorphic(anfir.parse(base), anfir.parse(text)), what


def test_isomorphism_compares_types_annotations_and_nesting():
    a, b = anfir.parse(MLP), anfir.parse(MLP)
    for node in a["mlp_loss"].cnodes():
        node.abstract = AScalar("f64")
    with pytest.raises(IsomorphismError, match="abstract <Float64> vs \\?"):
        assert_isomorphic(a, b)
    assert isomorphic(a, b, abstracts=False)
    c = anfir.parse(MLP.replace("w1: f64[D, H]", "w1: f64[D, J]"))
    with pytest.raises(IsomorphismError, match="annotation"):
        assert_isomorphic(b, c)
    # the same body nested (a closure) or not (a top-level function)
    nested = anfir.parse("def f(x) = let g = lambda (y) y + x end in g(1)\n")
    flat = anfir.parse("def f(x) = g(1, x)\ndef g(y, x) = y + x\n")
    assert not isomorphic(nested, flat)


def test_isomorphism_of_long_chains_is_iterative():
    g = FuncGraph("chain")
    node = g.add_parameter("x")
    for _ in range(20000):
        node = g.apply(P["add"], node, 1)
    g.output = node
    manage(g)
    assert isomorphic(g, g)


def test_isomorphism_error_on_a_deeply_nested_constant(tmp_path):
    # The differing constant is described without recursion (it used to be its repr).
    depth = 3000
    dump = tmp_path / "deep.ir"
    dump.write_text("subgraph @main() {\n  %1 = make_tuple(" + "(" * depth + "1" + ",)" * depth
                    + ", 2)\n  return %1\n}\n")
    loaded = anfir.load(str(dump))
    other = anfir.parse("def main() = (((1,),), 2)")
    with pytest.raises(IsomorphismError, match="constant"):
        assert_isomorphic(loaded, other, abstracts=False)


# -- dot -------------------------------------------------------------------------------------
def _render(dot_text: str) -> str:
    result = subprocess.run(["dot", "-Tsvg"], input=dot_text.encode(), capture_output=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr.decode().strip() == ""  # no warnings either
    return result.stdout.decode()


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_dot_of_each_spec_example_has_a_cluster_per_graph(name):
    mod = anfir.parse(EXAMPLES[name])
    text = anfir.dump_dot(mod)
    graphs = manage(*mod.graphs.values()).graphs
    assert text.count("subgraph cluster_") == len(graphs)
    assert text == anfir.dump_dot(anfir.parse(EXAMPLES[name]))  # deterministic


@pytest.mark.needs_dot
@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_dot_of_every_spec_example_renders():
    for name in sorted(EXAMPLES):
        assert "<svg" in _render(anfir.dump_dot(anfir.parse(EXAMPLES[name]))), name


def test_dot_marks_free_variables_callees_and_graph_values():
    text = anfir.dump_dot(anfir.parse(POWER))
    assert 'penwidth=2.2' in text and '#d62728' in text  # captured n, x, acc
    assert "style=dashed" in text  # the call of switch's result
    assert "lhead=cluster_" in text  # graph values point at their cluster
    free = [line for line in text.splitlines() if "#d62728" in line]
    assert len(free) == 5  # i, acc (twice: both branches), n, x cross a cluster border
    label = anfir.dump_dot(anfir.parse('def f(x) = (x, "<b>&\\"</b>")\n'))
    assert "&quot;&lt;b&gt;&amp;\\&quot;&lt;/b&gt;&quot;" in label and "<b>&" not in label
    if shutil.which("dot"):
        _render(label)


def test_dot_of_gradient_graphs_renders():
    mod = anfir.parse("def f(x, y) = let g = lambda (z) z * x + y end in "
                      "if x < y then g(x) * y else sin(x)\n")
    text = anfir.dump_dot(anfir.grad(mod["f"]))
    assert "∇f" in text and "env_setitem" in text
    if shutil.which("dot"):
        _render(text)


@pytest.mark.needs_dot
def test_jupyter_svg_and_its_fallback(monkeypatch, tmp_path):
    mod = anfir.parse(FIB)
    # No picture (so Jupyter shows the text form) without the graphviz package...
    with monkeypatch.context() as patch:
        patch.setitem(sys.modules, "graphviz", None)
        assert graph_svg(mod) is None
    # ...or without Graphviz's dot program (an empty PATH hides it where it is installed).
    with monkeypatch.context() as patch:
        patch.setenv("PATH", str(tmp_path))
        assert mod._repr_svg_() is None and graph_svg(mod["fibonacci"]) is None
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed (apt-get install graphviz): "
                    "the fallback is checked, the SVG picture is not")
    svg = mod._repr_svg_()
    assert svg is not None and "<svg" in svg and "fibonacci" in svg
    assert graph_svg(mod["fibonacci"]).startswith("<?xml")


def test_printers_reject_other_objects():
    with pytest.raises(AnfirError):
        anfir.to_text(42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        anfir.dump_dot("f")  # type: ignore[arg-type]


def test_annotations_round_trip_through_text_objects():
    g = FuncGraph("f")
    x = g.add_parameter("x")
    x.annotation = TensorAnn("f64", ("N", 3))
    g.output = g.apply(P["sum"], x)
    g.flags["return_type"] = ScalarAnn("f64")
    manage(g)
    printed = anfir.to_text(g)
    assert printed.startswith("def f(x: f64[N, 3]) -> f64 =")
    assert_isomorphic(g, anfir.parse(printed)["f"])


def test_location_comments_of_a_very_long_line_show_a_window_and_reload(tmp_path):
    # 400 nested ifs on one line: each node's comment shows the text around its
    # own column, not the whole 10 KB line, and the dump still loads back to
    # a program that prints the same and computes the same.
    source = "def main(x) = " + "if x < 0.0 then 1.0 else " * 400 + "x\n"
    text = anfir.dump_ir(anfir.parse(source, filename="long.anf"))
    comments = [line for line in text.splitlines() if line.lstrip().startswith("# long.anf:")]
    assert comments and max(len(line) for line in comments) < 220
    assert any(line.count("…") == 2 and "if x < 0.0 then 1.0" in line for line in comments)
    path = tmp_path / "long.ir"
    path.write_text(text, encoding="utf-8")
    loaded = anfir.load(str(path))
    assert anfir.dump_ir(loaded) == text
    assert anfir.run(loaded["main"], 2.0) == 2.0 and anfir.run(loaded["main"], -1.0) == 1.0


# -- Jupyter display in a fresh interpreter, with and without Graphviz (issue 5) ---------
_DISPLAY = """
import anfir
from IPython.core.formatters import DisplayFormatter

mod = anfir.load({path!r})
graph = mod["fibonacci"]
formatter = DisplayFormatter()
for obj in (graph, mod):
    data, _ = formatter.format(obj)
    print(sorted(data), "svg" if "<svg" in data.get("image/svg+xml", "") else "-")
    print(data["text/plain"].splitlines()[0], "| lines:", len(data["text/plain"].splitlines()))
print(str(graph).splitlines()[0])
"""


def _display(path_env: str) -> list[str]:
    pytest.importorskip("IPython")
    code = _DISPLAY.format(path=str(ROOT / "examples" / "fibonacci.anf"))
    env = dict(os.environ, PATH=path_env, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          encoding="utf-8", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout.splitlines()


@pytest.mark.needs_dot
def test_graphs_display_as_svg_when_dot_is_installed() -> None:
    pytest.importorskip("graphviz")
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed")
    lines = _display(os.environ.get("PATH", ""))
    assert lines[0] == "['image/svg+xml', 'text/plain'] svg"
    assert lines[1] == "def fibonacci(n) = | lines: 12"  # the canonical text
    assert lines[2] == "['image/svg+xml', 'text/plain'] svg"
    assert lines[3] == "def fibonacci(n) = | lines: 12"
    assert lines[4] == "def fibonacci(n) ="


def test_graphs_display_as_text_when_dot_is_missing(tmp_path: Path) -> None:
    """No dot on the PATH: no picture, no error, the program as text instead."""
    bare = tmp_path / "bin"
    bare.mkdir()
    lines = _display(str(bare))
    assert lines[0] == "['text/plain'] -"
    assert lines[1] == "def fibonacci(n) = | lines: 12"
    assert lines[2] == "['text/plain'] -"
    assert lines[3] == "def fibonacci(n) = | lines: 12"
    assert lines[4] == "def fibonacci(n) ="

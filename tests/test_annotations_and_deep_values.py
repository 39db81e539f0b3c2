"""Regressions: let annotations that alias another node, ``f64[N, *]`` inputs, deep tuples.

* ``let y: T = x`` where ``x`` is not a node the let computed (a parameter,
  another let's node, a constant) used to drop or overwrite the annotation;
  it is now an annotated ``identity(x)`` check, located at the annotation.
* An annotation ``f64[N, *]`` keeps its first dimension and rank >= 1
  (``ATensor.leading``) instead of becoming ``<f64[*]>``.
* Abstract values of tuples nested 3,000 deep (constants) are built, joined,
  widened, compared, hashed and printed with explicit stacks.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import anfir
from anfir.abstract.lattice import JoinError, abstract_of_value, join, map_graphs, widen
from anfir.abstract.rules import zeros_like_rule
from anfir.abstract.shapes import dim_symbol
from anfir.abstract.typeann import abstract_from_annotation_text as T
from anfir.abstract.values import AScalar, ATensor, ATuple
from anfir.cli import main as cli_main
from anfir.errors import AnfirTypeError
from anfir.grammar.ir_loader import load_ir_text
from anfir.passes.pipeline import compile_program
from anfir.passes.specialize import specialize
from anfir.printers.abstract_text import abstract_text
from anfir.printers.ir import dump_ir
from anfir.printers.iso import assert_isomorphic

DEPTH = 3000


def type_error(src: str, entry: str = "f") -> AnfirTypeError:
    """The type error specializing ``entry`` of ``src`` from its annotations."""
    mod = anfir.parse(src)
    with pytest.raises(AnfirTypeError) as info:
        specialize(mod[entry], None)
    return info.value


def at(exc: AnfirTypeError, line: int, col: int) -> None:
    """``exc`` is located at ``line``:``col`` and renders a caret line."""
    assert exc.loc is not None, exc
    assert (exc.loc.line, exc.loc.col) == (line, col), exc.render()
    assert "^" in exc.render()


def roundtrip(src: str) -> anfir.Module:
    """parse -> to_text -> parse and parse -> dump_ir -> load: isomorphic, text a fixed point."""
    mod = anfir.parse(src)
    printed = anfir.to_text(mod)
    again = anfir.parse(printed)
    assert_isomorphic(mod, again)
    assert anfir.to_text(again) == printed
    loaded = load_ir_text(dump_ir(mod))
    assert_isomorphic(mod, loaded)
    return mod


# -- 1. let annotations ------------------------------------------------------------------
def test_annotation_on_alias_of_parameter_is_checked_at_the_annotation() -> None:
    e = type_error("def f(x: i64) = let y: f64 = x in y")
    at(e, 1, 24)
    assert "f64" in e.message and "<Int64>" in e.message


def test_two_annotations_of_one_value_are_both_checked() -> None:
    src = "def f(x: f64) =\n  let a: i64 = x + 1.0 in\n  let b: f64 = a in b"
    e = type_error(src)
    at(e, 2, 10)  # a's annotation: i64 (b's f64 would fit)
    assert "i64" in e.message
    # And the alias's own annotation is checked too, at its place.
    e = type_error("def f(x: f64) =\n  let a: f64 = x + 1.0 in\n  let b: i64 = a in b")
    at(e, 3, 10)


def test_annotation_on_alias_of_constant_and_of_let() -> None:
    e = type_error("def f(x: f64) =\n  let k = 3 in\n  let j: f64 = k in j")
    at(e, 3, 10)
    e = type_error("def f(x: f64) =\n  let k: f64 = 3 in k")
    at(e, 2, 10)


def test_correct_alias_annotations_compile_run_and_print_back() -> None:
    src = ("def f(x: f64, w: f64[B, H]) =\n"
           "  let y: f64 = x in\n"
           "  let h: f64[B, H] = w * y in\n"
           "  let g: f64[B, H] = h in\n"
           "  let k: i64 = 3 in\n"
           "  (g, k)\n")
    mod = roundtrip(src)
    assert "let y: f64 = x in" in anfir.to_text(mod)
    assert "let g: f64[B, H] = h in" in anfir.to_text(mod)
    graph = anfir.compile(mod, "f")
    out, k = anfir.run(graph, 2.0, np.ones((2, 3)))
    np.testing.assert_allclose(out, np.full((2, 3), 2.0))
    assert k == 3
    assert anfir.run(mod["f"], 2.0, np.ones((2, 3)))[1] == 3


def test_cli_compile_reports_alias_annotation_mismatch(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "alias.anf"
    path.write_text("def f(x: i64) =\n  let y: f64 = x in y\n")
    assert cli_main(["compile", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:2:10:" in err
    assert "let y: f64 = x in y" in err
    assert "         ^" in err


# -- 2. f64[N, *] ------------------------------------------------------------------------
def test_leading_dims_of_star_annotation_are_kept() -> None:
    n = dim_symbol("N")
    assert T("f64[N, *]") == ATensor("f64", None, (n,))
    assert str(T("f64[N, 3, *]")) == "<f64[N, 3, *]>"
    assert T("f64[N, *]").min_rank == 1
    assert T("f64[*]") == ATensor("f64", None)
    mod = anfir.parse("def f(x: f64[N, *]) = x\n")
    graph = anfir.compile(mod, "f")
    assert str(graph.parameters[0].abstract) == "<f64[N, *]>"
    assert str(graph.abstract) == "(<f64[N, *]>) -> <f64[N, *]>"
    # The dump loads back with the same type.
    loaded = load_ir_text(dump_ir(graph))
    assert loaded["f"].parameters[0].abstract == ATensor("f64", None, (n,))


def test_leading_dims_are_checked_and_shared() -> None:
    e = type_error("def f(x: f64[N, *]) =\n  let y: f64[] = x * 2.0 in y")
    at(e, 2, 10)
    assert "rank at least 1" in e.message
    e = type_error("def f(x: f64[3, *], y: f64[N, *]) =\n  let z: f64[4, *] = x * 2.0 in z")
    at(e, 2, 10)
    # N is the same dimension variable in both parameters.
    mod = anfir.parse("def f(x: f64[N, *], y: f64[N]) = x * 2.0\n")
    graph = anfir.compile(mod, "f")
    n = dim_symbol("N")
    assert graph.parameters[1].abstract == ATensor("f64", (n,))
    assert graph.abstract.out == ATensor("f64", None, (n,))  # type: ignore[union-attr]


def test_join_of_leading_dims() -> None:
    n = dim_symbol("N")
    assert join(ATensor("f64", None, (n, 2)), ATensor("f64", (n, 2, 5))) == \
        ATensor("f64", None, (n, 2))
    assert join(ATensor("f64", None, (n,)), ATensor("f64", None)) == ATensor("f64", None)
    with pytest.raises(JoinError):
        join(ATensor("f64", None, (3,)), ATensor("f64", (4, 2)))
    with pytest.raises(JoinError):
        join(ATensor("f64", None, (3,)), ATensor("f64", ()))
    with pytest.raises(ValueError):
        ATensor("f64", (3,), (3,))


# -- 3. deep tuples -------------------------------------------------------------------------
def deep_value(depth: int = DEPTH) -> tuple:
    value: tuple = (1,)
    for _ in range(depth):
        value = (value,)
    return value


def nesting(value: tuple) -> tuple[int, int]:
    """(how many 1-tuples wrap the innermost item, the innermost item), without recursion."""
    depth = 0
    while isinstance(value, tuple) and len(value) == 1 and isinstance(value[0], tuple):
        value, depth = value[0], depth + 1
    return depth, value[0]


def test_deep_tuple_constant_compiles_at_default_recursion_limit(tmp_path: Path) -> None:
    assert sys.getrecursionlimit() <= 1000
    text = "subgraph @main() {\n  %1 = make_tuple(" + "(" * DEPTH + "1" + ",)" * DEPTH + \
        ", 2)\n  return %1\n}\n"
    path = tmp_path / "deep.ir"
    path.write_text(text)
    result = compile_program(str(path), dump_dir=str(tmp_path / "dumps"))
    out = result.graph.abstract.out  # type: ignore[union-attr]
    assert isinstance(out, ATuple) and out.items[1] == AScalar("i64", 2)
    value = anfir.run(result.graph)
    assert value[1] == 2 and nesting(value[0]) == (DEPTH - 1, 1)
    # The dumps (abstract values printed in them) load back.
    dumped = min((tmp_path / "dumps").glob("*_optimize.ir"))
    again = anfir.compile(anfir.load(str(dumped)))
    assert again.abstract == result.graph.abstract


def test_deep_abstract_values_without_recursion() -> None:
    a = abstract_of_value(deep_value())
    b = abstract_of_value(deep_value())
    assert a is not b and a == b and hash(a) == hash(b)
    assert a != abstract_of_value(deep_value(DEPTH - 1))
    c = abstract_of_value((deep_value(), 2.0))
    assert {a: 1}[b] == 1
    text = str(a)
    assert text.startswith("<Tuple(<Tuple(") and text.count("<Tuple(") == DEPTH + 1
    assert repr(a).startswith("ATuple(items=(ATuple(items=(")
    assert abstract_text(a, lambda g: g.name) == text
    wide = widen(a)
    assert "<Int64>" in str(wide) and "= 1" not in str(wide)
    assert widen(wide) is wide
    joined = join(c, abstract_of_value((deep_value(), 3.0)))
    assert joined == ATuple((a, AScalar("f64")))
    assert join(a, wide) == wide
    with pytest.raises(JoinError):
        join(a, abstract_of_value(deep_value(DEPTH - 1)))
    assert map_graphs(a, lambda g: g) == a
    assert zeros_like_rule(a) == wide

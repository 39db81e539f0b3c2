"""The language's tables exist once: dtypes, keywords, operators, type syntax, and one ``widen``.

* :mod:`anfir.dtypes` — every element type with its numpy dtype, kind, width
  and ``.ir`` spelling; every other module asks it (the new unsigned types
  work end to end: annotations, ``cast``, inference, ``.ir`` dumps, ANF text);
* :mod:`anfir.grammar.syntax` — keywords and operators, read by the lexer, the
  builder, the printers and documented in docs/language.md;
* :mod:`anfir.ir.type_syntax` — types written in ANF, in ``.ir`` dumps and
  as plain text are read and checked by the same rules;
* :func:`anfir.abstract.lattice.widen` is the only widening, and it has no
  recursion on the depth of nested tuples.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import anfir
from anfir import dtypes
from anfir.abstract import lattice
from anfir.abstract.typeann import abstract_from_annotation_text, parse_type_text
from anfir.abstract.values import AScalar, AString, ATensor, ATuple
from anfir.errors import AnfirSyntaxError, AnfirTypeError
from anfir.grammar import anf_lexer, syntax
from anfir.grammar.ir_loader import load_ir_text
from anfir.ir import FuncGraph, ValueNode, manage
from anfir.passes import optimize
from anfir.primitives import PRIMITIVES
from anfir.printers import naming
from anfir.printers.ir import dump_ir

ROOT = Path(__file__).resolve().parent.parent
LANGUAGE = (ROOT / "docs" / "language.md").read_text(encoding="utf-8")
GRAMMAR = (ROOT / "anfir" / "grammar" / "anf.lark").read_text(encoding="utf-8")


# -- dtypes --------------------------------------------------------------------------------
def test_every_dtype_row_agrees_with_numpy() -> None:
    for row in dtypes.DTYPES:
        assert row.kind in dtypes.KINDS
        if row.numpy is None:
            assert row.kind == "str" and not dtypes.is_dtype(row.name)
            continue
        np_dtype = dtypes.numpy_dtype(row.name)
        # The narrow types (i4, u2, f4e2m1) take a byte each in numpy arrays.
        assert np_dtype.itemsize * 8 == max(row.bits, 8) and row.bits == dtypes.bits_of(row.name)
        assert dtypes.dtype_name(np_dtype) == dtypes.dtype_name(np_dtype.type) == row.name
        assert dtypes.dtype_of_array(np.zeros(2, np_dtype)) == row.name
        assert dtypes.from_abstract_name(dtypes.abstract_name(row.name)) == row.name
        # ml_dtypes' types (bfloat16, float8_*, float4_e2m1fn, int4/uint4, int2/uint2) have
        # the numpy kind letter "V" (float8_e5m2 has "f"): their kind is in their name.
        expected_kind = {"f": "float", "i": "int", "u": "uint", "b": "bool", "c": "complex",
                         "V": re.sub(r"\d.*", "", np_dtype.name).replace("bfloat", "float")}
        assert expected_kind[np_dtype.kind] == row.kind == dtypes.numpy_kind(np_dtype)
    assert dtypes.ELEMENT_TYPES == ("f16", "bf16", "f32", "f64", "i8", "i16", "i32", "i64",
                                    "u8", "u16", "u32", "u64", "bool", "c64", "c128",
                                    "f8e4m3fn", "f8e4m3fnuz", "f8e5m2", "f8e5m2fnuz", "f8e8m0",
                                    "f4e2m1", "i4", "u4", "i2", "u2")
    assert dtypes.TYPE_NAMES == dtypes.ELEMENT_TYPES + ("str",)


def test_dtype_helpers() -> None:
    assert [n for n in dtypes.TYPE_NAMES if dtypes.is_float(n)] == ["f16", "bf16", "f32", "f64", "f8e4m3fn",
                                                                "f8e4m3fnuz", "f8e5m2", "f8e5m2fnuz",
                                                                "f8e8m0", "f4e2m1"]
    assert [n for n in dtypes.TYPE_NAMES if dtypes.is_complex(n)] == ["c64", "c128"]
    assert [n for n in dtypes.TYPE_NAMES if dtypes.is_signed_int(n)] == ["i8", "i16", "i32", "i64", "i4", "i2"]
    assert [n for n in dtypes.TYPE_NAMES if dtypes.is_unsigned_int(n)] == ["u8", "u16", "u32", "u64", "u4", "u2"]
    assert not dtypes.is_integer("bool") and dtypes.is_bool("bool") and dtypes.is_integer("u8")
    assert not dtypes.is_complex("f64") and dtypes.kind_of("nope") is None
    assert not dtypes.is_float("nope")
    assert dtypes.dtype_name(np.float128 if hasattr(np, "float128") else np.complex256) is None
    assert dtypes.dtype_name("datetime64") is None
    assert [dtypes.literal_dtype(v) for v in (True, 1, 1.0, np.float64(2.0), "s")] == \
        ["bool", "i64", "f64", "f64", None]
    assert dtypes.abstract_name("f64") == "Float64" and dtypes.abstract_name("weird") == "weird"
    with pytest.raises(AnfirTypeError, match="unknown dtype 'str'; expected one of f16, bf16, f32"):
        dtypes.check_dtype("str")
    with pytest.raises(AnfirTypeError, match="unsupported array dtype datetime64"):
        dtypes.dtype_of_array(np.zeros(1, "datetime64[s]"))
    assert str(AScalar("u16")) == "<UInt16>" and str(AScalar("weird")) == "<weird>"


@pytest.mark.parametrize("name", ["u16", "u32", "u64"])
def test_new_unsigned_types_work_end_to_end(name: str) -> None:
    np_dtype = dtypes.numpy_dtype(name)
    src = (f'def f(x: {name}[N], s: f16) -> {name}[N] =\n'
           f'  x + cast(s, "{name}")\n'
           f'def g() = (cast(3, "{name}"), ones((2,), "{name}"))')
    module = anfir.parse(src)
    assert str(module["f"].parameters[0].annotation) == f"{name}[N]"
    x = np.array([1, 2], np_dtype)
    result = anfir.run(module["f"], x, 1.0)
    assert result.dtype == np_dtype and result.tolist() == [2, 3]
    # Typed, dumped, loaded back: the abstract values and annotations survive.
    compiled = anfir.compile(module, entry="f", args=[f"{name}[N]", "f16"])
    text = dump_ir(compiled)
    assert f"<{name}[N]>" in text and f"-> {name}[N]" in text
    loaded = load_ir_text(text)
    assert dump_ir(loaded.ir_entry) == text
    assert anfir.run(loaded.ir_entry, x, np.float16(1.0)).tolist() == [2, 3]
    # Constants of the type print (ANF and .ir) and read back with their dtype.
    scalar, tensor = anfir.run(module["g"])
    g = FuncGraph("h")
    g.output = g.apply(PRIMITIVES["make_tuple"], np_dtype.type(7), np.arange(3, dtype=np_dtype))
    manage(g)
    text = dump_ir(g)
    assert f"Scalar[{name}](7)" in text and f"Tensor[{name}, (3,)]([0, 1, 2])" in text
    back = anfir.run(load_ir_text(text).ir_entry)
    assert back[0].dtype == np_dtype and back[1].dtype == np_dtype and back[1].tolist() == [0, 1, 2]
    again = anfir.run(anfir.parse(anfir.to_text(g))["h"])
    assert again[1].dtype == np_dtype and again[1].tolist() == [0, 1, 2]
    assert tensor.dtype == np_dtype and scalar == 3


# -- keywords ------------------------------------------------------------------------------
def test_one_keyword_table() -> None:
    assert naming.KEYWORDS is syntax.KEYWORDS
    for word, terminal in syntax.KEYWORDS.items():
        assert anf_lexer.tokenize([word], "<k>")[0][:2] == (terminal, word)
        assert not naming.is_anf_name(word)
        assert naming.is_anf_name(naming.anf_name(word))
    block = LANGUAGE.split("**Keywords** cannot be used as names:", 1)[1].split("**Literals**")[0]
    assert set(block.split()) == set(syntax.KEYWORDS)


def test_every_fixed_token_is_a_terminal_of_the_grammar() -> None:
    declared = set()
    for line in GRAMMAR.splitlines():
        if line.startswith("%declare"):
            declared.update(line.split()[1:])
    assert set(syntax.TERMINALS.values()) <= declared
    for text, terminal in syntax.TERMINALS.items():
        assert [t[0] for t in anf_lexer.tokenize([f"a {text} b"], "<t>")] == ["NAME", terminal, "NAME"]


# -- operators -----------------------------------------------------------------------------
def _documented_operator_rows() -> list[tuple[list[str], list[str], str]]:
    section = LANGUAGE.split("## Operators and precedence", 1)[1].split("Points worth knowing", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[1] in ("primitive", "---", "—"):
            continue
        rows.append((re.findall(r"`([^`]+)`", cells[0]), re.findall(r"`([^`]+)`", cells[1]), cells[2]))
    return rows


def test_operator_table_is_the_documented_one() -> None:
    by_level: dict[int, list[syntax.Operator]] = {}
    for op in syntax.OPERATORS:
        by_level.setdefault(op.precedence, []).append(op)
    levels = sorted(by_level)
    assert [op.precedence for op in syntax.OPERATORS] == sorted(op.precedence for op in syntax.OPERATORS)
    expected = [([op.text for op in by_level[p]], [op.primitive for op in by_level[p]],
                 "—" if by_level[p][0].associativity == "prefix" else by_level[p][0].associativity)
                for p in levels]
    assert _documented_operator_rows() == expected
    for op in syntax.OPERATORS:
        assert op.primitive in PRIMITIVES


@pytest.mark.parametrize("op", [op for op in syntax.OPERATORS], ids=lambda op: f"{op.primitive}")
def test_each_operator_parses_to_its_primitive_and_prints_back(op: syntax.Operator) -> None:
    text = f"def f(a, b) = {op.text} a" if op.arity == 1 else f"def f(a, b) = a {op.text} b"
    graph = anfir.parse(text)["f"]
    assert graph.output.inputs[0].value is PRIMITIVES[op.primitive]
    printed = anfir.to_text(graph)
    assert (f"{op.spelling}a" if op.arity == 1 else f"a {op.text} b") in printed
    assert anfir.to_text(anfir.parse(printed)["f"]) == printed


# -- type syntax ---------------------------------------------------------------------------
_TYPES = ["f64", "str", "u16", "f32[]", "f64[B, 3]", "f32[*]", "i64[N, *]", "(f64, i64)", "(f64,)",
          "()", "((f64, (bool,)), (u8[2, K], ()))"]


@pytest.mark.parametrize("text", _TYPES)
def test_the_three_surfaces_read_types_alike(text: str) -> None:
    ann = parse_type_text(text)
    assert str(ann) == text
    graph = anfir.parse(f"def f(x: {text}) -> {text} = x")["f"]
    assert graph.parameters[0].annotation == ann == graph.flags["return_type"]
    loaded = load_ir_text(dump_ir(graph)).ir_entry
    assert loaded.parameters[0].annotation == ann == loaded.flags["return_type"]


def test_parenthesised_type_is_the_type_everywhere() -> None:
    assert parse_type_text("(f64)") == parse_type_text("f64")
    assert parse_type_text("((f64, i64),)") == anfir.parse(
        "def f(x: ((f64, i64),)) = x")["f"].parameters[0].annotation
    assert parse_type_text(" ( f64 , i64 , ) ") == parse_type_text("(f64, i64)")


@pytest.mark.parametrize("text, message", [
    ("f65", "unknown type 'f65'"),
    ("str[2]", "unknown tensor element type 'str'"),
])
def test_unknown_type_names_are_refused_by_every_surface(text: str, message: str) -> None:
    with pytest.raises(AnfirSyntaxError, match=re.escape(message)) as anf_error:
        anfir.parse(f"def f(x: {text}) = x")
    assert anf_error.value.loc.col == 10
    good = dump_ir(anfir.parse("def f(x: f64) = x")["f"])
    bad = good.replace("(%para1_x: f64)", f"(%para1_x: {text})")
    assert bad != good
    with pytest.raises(AnfirSyntaxError, match=re.escape(message)) as ir_error:
        load_ir_text(bad)
    assert ir_error.value.loc is not None and ir_error.value.loc.line_text.startswith("subgraph @f")
    with pytest.raises(AnfirSyntaxError, match=r"bad type"):
        parse_type_text(text)


@pytest.mark.parametrize("text, why", [
    ("f64[B", "missing ]"), ("(f64", "expected , or )"), ("", "unexpected end"),
    ("f64 x", "unexpected 'x'"), ("f64[3x]", "bad dimension '3x'"), ("$", "unexpected '$'"),
    ("f64[B 3]", "expected , or ]"), ("f65", "unexpected 'f65'"),
    ("str[2]", "unknown tensor element type 'str'"),
])
def test_type_text_errors(text: str, why: str) -> None:
    with pytest.raises(AnfirSyntaxError, match=re.escape(f"bad type {text!r}: {why}")):
        parse_type_text(text)


def test_deeply_nested_type_text() -> None:
    depth = 3_000
    text = "(" * depth + "f64" + ",)" * depth
    ann = parse_type_text(text)
    for _ in range(depth):
        ann = ann.items[0]
    assert str(ann) == "f64"


def test_type_text_abstract_values() -> None:
    value = abstract_from_annotation_text("(u32[N], str, (bool,))")
    assert str(value) == "<Tuple(<u32[N]>, <String>, <Tuple(<Bool>)>)>"
    assert isinstance(value, ATuple) and isinstance(value.items[0], ATensor)
    assert value.items[1] == AString()


# -- one widen -----------------------------------------------------------------------------
def _deep(depth: int) -> ATuple:
    value: object = AScalar("f64", 1.5)
    for index in range(depth):
        value = ATuple((value, AScalar("i64", index)))
    return value  # type: ignore[return-value]


def test_the_optimizer_uses_the_lattice_widen() -> None:
    assert not hasattr(optimize, "widen") or optimize.widen is lattice.widen


def test_widen_of_a_3000_deep_tuple_at_the_default_recursion_limit() -> None:
    assert sys.getrecursionlimit() <= 3_000
    deep = _deep(3_000)
    wide = lattice.widen(deep)
    assert wide == _deep_widened(3_000)
    assert lattice.widen(wide) is wide
    a, b = ValueNode(0), ValueNode(1)
    a.abstract, b.abstract = deep, _deep(3_000)
    assert optimize.RewriteContext.same_type(a, b)
    b.abstract = ATuple((deep, AScalar("f32")))
    assert not optimize.RewriteContext.same_type(a, b)


def _deep_widened(depth: int) -> ATuple:
    value: object = AScalar("f64")
    for _ in range(depth):
        value = ATuple((value, AScalar("i64")))
    return value  # type: ignore[return-value]


def test_documented_dtype_lists_are_the_table() -> None:
    listed = " ".join(dtypes.ELEMENT_TYPES)
    tensors = LANGUAGE.split("* **tensors**: numpy arrays with a dtype (`", 1)[1].split("`", 1)[0]
    assert " ".join(tensors.split()) == listed
    assert f"`x` converted to a dtype (`{listed}`)" in LANGUAGE
    assert PRIMITIVES["cast"].doc.endswith(f"({listed})")
    table = LANGUAGE.split("## Types and dimension variables", 1)[1].split("Annotations go on", 1)[0]
    rows = [re.findall(r"`([a-z0-9]+)`", line.split("|")[1]) for line in table.splitlines()
            if line.startswith("| `") and "[" not in line.split("|")[1] and "(" not in line.split("|")[1]]
    assert [name for row in rows for name in row] == list(dtypes.TYPE_NAMES)

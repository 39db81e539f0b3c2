"""Metadata: doc comments (``##``) and attributes (``#@``) in ANF text, ``# Meta`` /
``meta`` lines in ``.ir`` dumps — parsed onto the module, definitions and nodes,
printed back identically, kept by dumps, located errors when malformed, and
what the ONNX importer records (docs/language.md, "Doc comments and attributes")."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import anfir
from anfir.errors import AnfirSyntaxError
from anfir.grammar.ir_loader import load_ir_text
from anfir.grammar.parser import parse_module
from anfir.ir.graph import FuncGraph, Module
from anfir.ir.manager import analyse
from anfir.printers.ir import dump_ir

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = '''\
# an ordinary comment above the header
#@ producer_name "by hand"
## What this file is for.
##   (indented, kept as written)
#@ "odd key" {"nested": [1, 2.5, true, null], "s": "a \\"quoted\\" word"}

## Squares, then a little more.
#@ source {"line": 3, "tags": ["a", "b"]}
def sq(x) =
  ## the product
  #@ onnx_node "/mul"
  let y = x * x in
  ## adds one
  let inc = lambda (a) a + 1 end in
  #@ k 1
  let z = if y > 1 then inc(y) else y in
  #@ out true
  let w = z - 1 in
  w

### a banner: three or more '#' start an ordinary comment
def plain(x) = x + 1   ## a trailing '##' is an ordinary comment too
'''

BARE = PROGRAM.replace("##", "#").replace("#@", "#")
"""The same program with every doc and attribute line an ordinary comment."""


def _node_meta(graph: FuncGraph) -> dict[str, dict]:
    return {node.name: meta for node, meta in graph.node_meta.items()}


def test_doc_comments_and_attributes_attach_to_what_follows_them() -> None:
    mod = anfir.parse(PROGRAM)
    assert mod.metadata == {
        "doc": "What this file is for.\n  (indented, kept as written)",
        "producer_name": "by hand",
        "odd key": {"nested": [1, 2.5, True, None], "s": 'a "quoted" word'}}
    sq = mod["sq"]
    assert sq.flags["doc"] == "Squares, then a little more."
    assert sq.flags["meta"] == {"source": {"line": 3, "tags": ["a", "b"]}}
    assert _node_meta(sq) == {"y": {"doc": "the product", "onnx_node": "/mul"},
                              "z": {"k": 1}, "w": {"out": True}}
    inc = next(g for g in analyse(sq).graphs if g.name == "inc")
    assert inc.flags["doc"] == "adds one"
    assert "doc" not in mod["plain"].flags and not mod["plain"].node_meta
    # Metadata never changes what a program computes.
    bare = anfir.parse(BARE)
    assert not bare.metadata and not bare["sq"].node_meta and "doc" not in bare["sq"].flags
    for x in (0.5, 3.0):
        assert anfir.run(mod["sq"], x) == anfir.run(bare["sq"], x)


@pytest.mark.parametrize("engine", ["tables", "lark"])
def test_text_round_trip_is_identical(engine: str) -> None:
    text = anfir.to_text(anfir.parse(PROGRAM))
    assert text.startswith("## What this file is for.\n##   (indented, kept as written)\n"
                           '#@ producer_name "by hand"\n#@ "odd key" {')
    assert "\n\n## Squares, then a little more.\n#@ source" in text
    assert "  ## the product\n  #@ onnx_node \"/mul\"\n  let y = x * x in" in text
    again = parse_module(text, engine=engine)
    assert anfir.to_text(again) == text
    assert again.metadata == anfir.parse(PROGRAM).metadata


def test_ir_dump_keeps_metadata() -> None:
    mod = anfir.parse(PROGRAM)
    dump = dump_ir(mod)
    assert '# Meta producer_name: "by hand"' in dump
    assert '# Meta "odd key": {"nested": [1, 2.5, true, null]' in dump
    assert '  meta source = {"line": 3, "tags": ["a", "b"]}' in dump
    assert 'meta: {"doc": "the product", "onnx_node": "/mul"}' in dump
    loaded = load_ir_text(dump)
    assert loaded.metadata == mod.metadata
    assert loaded["sq"].flags["meta"] == mod["sq"].flags["meta"]
    assert loaded["sq"].flags["doc"] == mod["sq"].flags["doc"]
    assert _node_meta(loaded["sq"]) == _node_meta(mod["sq"])
    assert dump_ir(loaded) == dump
    assert anfir.to_text(loaded) == anfir.to_text(mod)


def test_a_doc_that_lines_cannot_hold_is_an_attribute() -> None:
    # A carriage return or another control character would not survive as '##' lines.
    mod = anfir.parse("def f(x) = x")
    mod["f"].flags["doc"] = "one\rtwo\x07"
    text = anfir.to_text(mod)
    assert text.startswith('#@ doc "one\\rtwo\\u0007"\ndef f(x) =')
    assert anfir.parse(text)["f"].flags["doc"] == "one\rtwo\x07"
    # An empty doc, empty doc lines and a JSON-only value print and read back too.
    mod["f"].flags["doc"] = "\nafter an empty line\n"
    mod.metadata = {"ratio": 0.1, "big": 2 ** 70, "text": "é ✓"}
    text = anfir.to_text(mod)
    assert "##\n## after an empty line\n##\ndef f" in text
    again = anfir.parse(text)
    assert again["f"].flags["doc"] == "\nafter an empty line\n"
    assert again.metadata == mod.metadata
    assert anfir.to_text(again) == text


def test_values_json_cannot_hold_print_as_strings() -> None:
    mod = Module({"f": anfir.parse("def f(x) = x")["f"]})
    mod.metadata = {"n": np.int64(3), "pair": (1, 2), "nan": float("nan"), "obj": {1, 2}}
    text = anfir.to_text(mod)
    assert '#@ n 3\n#@ pair [1, 2]\n#@ nan "nan"\n#@ obj "{1, 2}"\n' in text
    assert anfir.parse(text).metadata == {"n": 3, "pair": [1, 2], "nan": "nan", "obj": "{1, 2}"}


def test_programs_without_metadata_print_no_metadata() -> None:
    for path in sorted((ROOT / "examples").glob("*.anf")):
        mod = anfir.load(str(path))
        assert not mod.metadata, path
        text = anfir.to_text(mod)
        assert "#@" not in text and "##" not in text, path
        dump = dump_ir(mod)
        assert "# Meta" not in dump and " meta" not in dump, path


BAD_TEXT = [
    # (source, line, col, words of the message)
    ("#@ producer\n\ndef f(x) = x", 1, 12, "has no value"),
    ("#@ 9x 1\n\ndef f(x) = x", 1, 4, "is not an attribute key"),
    ('#@ a-b 1\ndef f(x) = x', 1, 4, "is not an attribute key"),
    ('#@ k {"a": 1,}\ndef f(x) = x', 1, 14, "not a JSON value"),
    ("#@ k NaN\ndef f(x) = x", 1, 6, "NaN is not a JSON value"),
    ('#@ k {"a": 1, "a": 2}\ndef f(x) = x', 1, 6, "appears twice"),
    ("#@ k 1\n#@ k 2\ndef f(x) = x", 2, 4, "given twice"),
    ('## doc\n#@ doc "again"\ndef f(x) = x', 2, 4, "given twice"),
    ('#@ doc "x"\n## again\ndef f(x) = x', 2, 1, "second doc string"),
    ("#@ doc 3\ndef f(x) = x", 1, 8, "doc string is a JSON string"),
    ("#@ k " + "[" * 100_000 + "\ndef f(x) = x", 1, 6, "not a JSON value"),
    ('#@ k "open\ndef f(x) = x', 1, 6, "not a JSON value"),
    ("def f(x) = x\n\n## a stray doc\n\ndef g(x) = x", 3, 1, "belongs to nothing"),
    ("def f(x) =\n  let y = x + 1 in\n  ## not above a let\n  y * 2", 3, 3, "belongs to nothing"),
    ("def f(x) =\n  #@ k 1\n  let y = x in\n  y", 3, 7, "describe nothing"),
    ("## above an import\nimport \"x.anf\"\ndef f(x) = x", 1, 1, "belongs to nothing"),
    ("#@ k 1\n\n#@ second header block\n\ndef f(x) = x", 3, 1, "belongs to nothing"),
    ("def f(x) =\n  let a = 1 in ## trailing: ordinary\n  #@ k 1\n  a + x", 3, 3, "belongs to nothing"),
]


@pytest.mark.parametrize("source,line,col,words", BAD_TEXT)
def test_malformed_doc_and_attribute_lines_are_located_errors(source: str, line: int, col: int,
                                                              words: str) -> None:
    with pytest.raises(AnfirSyntaxError) as info:
        anfir.parse(source, filename="bad.anf")
    error = info.value
    assert words in error.message
    assert (error.loc.file, error.loc.line, error.loc.col) == ("bad.anf", line, col), error.message


DUMP = '''\
# IR entry: @f
# Definitions: f=@f
{meta}
subgraph @f(%para1_x) {{
{graph}  %1 = add(%para1_x, 1){node}
  return %1
}}
'''

BAD_DUMPS = [
    # (header, graph lines, node suffix, line, col, words)
    ("# Meta k 1", "", "", 3, 10, "expected ':'"),
    ("# Meta k: [1,", "", "", 3, 14, "not a JSON value"),
    ("# Meta k: 1\n# Meta k: 2", "", "", 4, 1, "gives 'k' twice"),
    ("", "  meta k = {bad\n", "", 5, 13, "not a JSON value"),
    ("", "  meta k 1\n", "", 5, 10, "expected '='"),
    ("", "", " meta: [1]", 5, 25, "JSON object"),
    ("", "", " meta: {}", 5, 25, "JSON object"),
    ("", "", ' meta: {"a": 1', 5, 38, "not a JSON value"),
]


@pytest.mark.parametrize("meta,graph,node,line,col,words", BAD_DUMPS)
def test_malformed_dump_metadata_is_a_located_error(meta: str, graph: str, node: str, line: int,
                                                    col: int, words: str) -> None:
    good = load_ir_text(DUMP.format(meta='# Meta k: 1', graph="  meta g = [true]\n",
                                    node=' meta: {"a": 1}'))
    assert good.metadata == {"k": 1} and good["f"].flags["meta"] == {"g": [True]}
    assert _node_meta(good["f"]) == {None: {"a": 1}}
    with pytest.raises(AnfirSyntaxError) as info:
        load_ir_text(DUMP.format(meta=meta, graph=graph, node=node), "bad.ir")
    error = info.value
    assert words in error.message
    assert (error.loc.file, error.loc.line, error.loc.col) == ("bad.ir", line, col), error.message


# -- ONNX ------------------------------------------------------------------------------------
def _onnx_model(constant: bool = False) -> object:
    """A small ONNX model with every kind of metadata; with ``constant``, a named and
    documented Constant node too (it folds: no node is left to keep them)."""
    onnx = pytest.importorskip("onnx", reason="ONNX import needs the onnx package (anfir[onnx])")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    weights = {"W": rng.normal(size=(3, 2)).astype(np.float32),
               "b": rng.normal(size=(2,)).astype(np.float32)}
    two = (helper.make_node("Constant", [], ["two"], name="const", doc_string="folds",
                            value=numpy_helper.from_array(np.array(2.0, np.float32)))
           if constant else helper.make_node("Add", ["a", "a"], ["two"]))
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "b"], ["h"], name="fc", doc_string="the layer"),
         helper.make_node("Relu", ["h"], ["a"], name="act"),
         two,
         helper.make_node("Mul", ["a", "two"], ["twice"]),
         helper.make_node("ReduceSum", ["twice"], ["s"], keepdims=0,
                          doc_string="line one\nline two")],
        "net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
        doc_string="the graph's own doc")
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)],
                              producer_name="anfir-tests", producer_version="1.0",
                              domain="org.example", model_version=3,
                              doc_string="a model\nwith two lines")
    helper.set_model_props(model, {"author": "someone", "license": "MIT"})
    assert onnx.checker.check_model(model) is None
    return model


def test_onnx_metadata_is_kept_printed_and_round_trips() -> None:
    from anfir.interop.onnx.importer import import_onnx

    mod = import_onnx(_onnx_model(), params_as_inputs=True)
    assert {k: mod.metadata[k] for k in ("producer_name", "producer_version", "domain",
                                         "model_version", "doc_string", "opset_import",
                                         "metadata_props")} == {
        "producer_name": "anfir-tests", "producer_version": "1.0", "domain": "org.example",
        "model_version": 3, "doc_string": "a model\nwith two lines",
        "opset_import": {"ai.onnx": 21}, "metadata_props": {"author": "someone", "license": "MIT"}}
    entry = mod.entry
    assert entry.flags["doc"] == "the graph's own doc"
    # Each node's name, op type and doc string sit on the node it computed; the Add
    # and the Mul have neither name nor doc string: nothing is recorded for them.
    assert sorted(_node_meta(entry).values(), key=str) == sorted([
        {"onnx_node": "fc", "op_type": "Gemm", "doc": "the layer"},
        {"onnx_node": "act", "op_type": "Relu"},
        {"op_type": "ReduceSum", "doc": "line one\nline two"}], key=str)
    assert _node_meta(entry)["a"] == {"onnx_node": "act", "op_type": "Relu"}

    text = anfir.to_text(mod)
    assert text.startswith('#@ format "onnx"\n')
    assert '#@ doc_string "a model\\nwith two lines"\n' in text
    assert "\n\n## the graph's own doc\ndef net(W: f32[3, 2], b: f32[2], x: f32[N, 3]) =\n" in text
    assert '  ## line one\n  ## line two\n  #@ op_type "ReduceSum"\n' in text
    again = anfir.parse(text)
    assert anfir.to_text(again) == text
    assert again.metadata == mod.metadata
    assert _node_meta(again["net"]) == _node_meta(entry)
    x = np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32)
    args = [*mod.params.values(), x]
    np.testing.assert_allclose(anfir.run(again["net"], *args), anfir.run(entry, *args), rtol=1e-6)

    dump = dump_ir(mod)
    assert '# Meta metadata_props: {"author": "someone", "license": "MIT"}' in dump
    loaded = load_ir_text(dump)
    assert loaded.metadata == mod.metadata
    assert _node_meta(loaded["net"]) == _node_meta(entry)
    assert loaded["net"].flags["doc"] == entry.flags["doc"]
    assert dump_ir(loaded) == dump


def test_onnx_text_with_constants_keeps_metadata_through_normalisation() -> None:
    # Without params_as_inputs the weights are constants, which print as array(...)
    # calls that parse as nodes: the first reprint normalises, later ones are identical.
    from anfir.interop.onnx.importer import import_onnx

    mod = import_onnx(_onnx_model(constant=True))
    assert "folds" not in str(_node_meta(mod.entry))  # the Constant left no node
    assert len(mod.entry.node_meta) == 3
    once = anfir.to_text(anfir.parse(anfir.to_text(mod)))
    assert anfir.to_text(anfir.parse(once)) == once
    again = anfir.parse(once)
    assert again.metadata == mod.metadata
    assert _node_meta(again["net"]) == _node_meta(mod.entry)


RANGED = '''\
#@ ranges {"n": [2, 3], "m": [1, null]}
def f(x: f64[n, m], pair: (f64[n], i64)) =
  sum(x) + sum(pair[0])
'''


def test_a_definitions_ranges_guard_its_entry_in_text_dumps_and_compiles() -> None:
    """``#@ ranges`` (what the torch importer writes for a Dim) checked at the entry,
    through a tuple parameter too, on anfir.run, compile with examples or types,
    and after an .ir round trip; an unbounded side accepts any size."""
    from anfir.errors import DimensionRangeError

    mod = parse_module(RANGED, "ranged.anf")
    good = (np.ones((2, 50)), (np.ones(2), 1))
    assert anfir.run(mod["f"], *good) == 102.0
    compiled = anfir.compile(mod)  # symbolic: the ranges shown with the graph
    dump = dump_ir(compiled)
    assert 'meta ranges = {"n": [2, 3], "m": [1, null]}' in dump and "f64[n, m]" in dump
    reloaded = load_ir_text(dump, "ranged.ir")
    outside = "argument 1 (x) of @f, dimension 0 has size 4, outside the range of n [2, 3]"
    disagree = "argument 2 (pair) of @f, dimension 0 has size 3, but n is 2 in argument 1 (x)"
    cases = [((np.ones((4, 5)), (np.ones(4), 1)), outside),
             ((np.ones((2, 5)), (np.ones(3), 1)), disagree)]
    for args, message in cases:
        for call in (lambda a=args: anfir.run(mod["f"], *a),
                     lambda a=args: anfir.run(compiled, *a),
                     lambda a=args: anfir.run(reloaded.entry, *a),
                     lambda a=args: anfir.compile(mod, args=list(a))):
            with pytest.raises(DimensionRangeError) as info:
                call()
            assert message in info.value.message
            assert info.value.loc is not None and info.value.loc.line == 2  # at the annotation
    with pytest.raises(DimensionRangeError, match="size 1, outside the range of n"):
        anfir.compile(mod, args=["f64[1, 4]", "(f64[1], i64)"])
    assert anfir.compile(mod, args=["f64[3, 7]", "(f64[3], i64)"]) is not None


@pytest.mark.parametrize("attr, why", [("3", "maps dimension variables"),
                                       ('{"n": [3]}', "must be [low, high]"),
                                       ('{"n": [3, 2]}', "is empty"),
                                       ('{"n": [1.5, 2]}', "must be [low, high]")])
def test_a_malformed_ranges_attribute_is_a_located_error(attr: str, why: str) -> None:
    from anfir.errors import DimensionRangeError

    mod = parse_module(f"#@ ranges {attr}\ndef f(x: f64[n]) = sum(x)\n", "bad.anf")
    with pytest.raises(DimensionRangeError, match=r"the ranges attribute of @f.*" + re.escape(why)) as info:
        anfir.run(mod["f"], np.ones(2))
    assert info.value.loc is not None and info.value.loc.file == "bad.anf"

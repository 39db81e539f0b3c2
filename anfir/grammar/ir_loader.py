"""Loading ``.ir`` dumps back into graphs (the reverse of ``anfir/printers/ir.py``).

The grammar is ``ir.lark`` (Lark LALR, contextual lexer); the transformer
below is passed to ``Lark(...)`` so graphs are built during the parse, with no
parse tree.  Graphs are created on first mention (``@g`` may be used before its
block), each CNode is created when its line is read and its inputs are wired
once the whole file is read — so forward references to nodes and graphs
work.  Constants, types (abstract values), annotations, flags and locations
come back as the objects they were printed from; nothing is ``eval``-ed
(dimension expressions are built with sympy operators, not ``sympify``).

The loaded graphs are ordinary, managed FuncGraphs: ``anfir.run`` runs them
and every pass accepts them.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
import re
import threading
import zipfile
from pathlib import Path
from typing import Any, Mapping, Optional, Union

import numpy as np
import sympy
from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from anfir.abstract.values import (AAny, AbstractValue, AEnv, AFunction, AKey,
                                   ANone, AScalar, AString, ATensor, ATuple, AType, GradFn, GraphFn,
                                   GraphSig, JFn, PartialFn, PrimFn)
from anfir.abstract.lattice import BOTTOM
from anfir.abstract.shapes import dim_symbol
from anfir import limits
from anfir.dtypes import from_abstract_name, int_range, is_dtype, numpy_dtype, numpy_kind
from anfir.errors import (AnfirError, AnfirSyntaxError, AnfirTypeError, NameResolutionError,
                          UsageError)
from anfir.gcpause import gc_paused
from anfir.ir.annotations import DimAnn, ScalarAnn, TensorAnn, TupleAnn
from anfir.ir.type_syntax import dimension, scalar_type, tensor_type, tuple_type
from anfir.ir.attrs import NO_ATTRS, Attrs, is_attr_value
from anfir.ir.graph import FuncGraph, Module
from anfir.location import Location
from anfir.ir.manager import manage
from anfir.ir.metadata import MetadataSyntaxError, parse_json, split_attribute
from anfir.ir.nodes import CNode, Node, ParameterNode, ValueNode
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.primitives import lookup
from anfir.runtime_values import Closure, DType, GradEnv, Partial, Symbol, SymbolicKey

_LOC_NUMBERS = re.compile(r"(?=:(\d+):(\d+))")
"""Where ``:line:col`` may follow a location comment's file name (overlapping)."""
MAX_DIM_EXPONENT = 64
"""The largest exponent a dimension expression may use (``N**2``)."""
MAX_FUNCTION_NESTING = 100
"""How deep ``J(grad(partial(...)))`` may nest in a function type (derivative orders are small)."""
_CALLABLE = (FuncGraph, Primitive, MetaFunction, Closure, Partial, Symbol)
"""What a constant callee may be."""
_DIM_FUNCTIONS = {"floor": sympy.floor, "ceiling": sympy.ceiling, "Max": sympy.Max,
                  "Min": sympy.Min, "Abs": sympy.Abs, "Mod": sympy.Mod}


_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _parser() -> tuple[Lark, "_IRBuilder"]:
    """The compiled parser and the transformer it calls (built once).

    Lark binds the transformer when the parser is built, so one builder object
    serves every load; it is reset before each parse (under a lock).
    """
    grammar = (Path(__file__).parent / "ir.lark").read_text(encoding="utf-8")
    builder = _IRBuilder()
    lark = Lark(grammar, parser="lalr", lexer="contextual", start="start",
                transformer=builder, maybe_placeholders=True)
    return lark, builder


def load_ir_text(text: str, filename: str = "<string>",
                 side: Optional[Mapping[str, np.ndarray]] = None) -> Module:
    """Build the Module a ``.ir`` text describes.

    ``side`` holds the arrays the text refers to as ``npz["t0"]``; when it is
    None and ``filename`` names a file, the side file next to it
    (``x.ir`` -> ``x.npz``) is read if the text needs it.
    """
    lark, builder = _parser()
    with _LOCK, gc_paused():
        builder._reset(filename, text, side)
        try:
            lark.parse(text)
            return builder._finish()
        except UnexpectedInput as exc:
            raise _syntax_error(exc, builder) from None
        finally:
            builder._reset("<string>", "", None)  # drop the file's objects


def load_ir_file(path: Union[str, Path]) -> Module:
    """Read a ``.ir`` file (and its ``.npz`` side file, if it has one) into a Module.

    Only a regular file of at most ``anfir.limits.MAX_SOURCE_BYTES`` is read.
    """
    try:
        data = limits.read_bounded(path)  # type: ignore[arg-type]
    except limits.ReadError as exc:
        # A path that cannot be read is a usage error, as for ANF files.
        raise UsageError(f"cannot read {path}: {exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        shown = data[line_start:exc.start].decode("utf-8", "replace")
        raise AnfirSyntaxError("the file is not valid UTF-8 text",
                               Location(str(path), line, len(shown) + 1, shown)) from None
    return load_ir_text(text, str(path))


def _syntax_error(exc: UnexpectedInput, builder: "_IRBuilder") -> AnfirSyntaxError:
    line = getattr(exc, "line", 0) or 0
    col = getattr(exc, "column", 0) or 0
    if isinstance(exc, UnexpectedEOF) or line <= 0 or line > len(builder.lines):
        line = max(len(builder.lines), 1)
        col = len(builder.lines[-1]) + 1 if builder.lines else 1
        message = "the dump ends too early (a subgraph is not closed with '}'?)"
    elif isinstance(exc, UnexpectedCharacters):
        pos = exc.pos_in_stream
        ch = builder.text[pos] if pos is not None and pos < len(builder.text) else ""
        message = f"unexpected character {ch!r} in the .ir text"
    elif isinstance(exc, UnexpectedToken):
        found = exc.token
        shown = "end of file" if found.type == "$END" else repr(str(found))
        expected = _expected_words(exc.expected)
        message = f"unexpected {shown}" + (f"; expected {expected}" if expected else "")
    else:  # pragma: no cover - other Lark errors
        message = str(exc).splitlines()[0]
    return AnfirSyntaxError(message, builder._location_at(line, col))


_TERMINAL_WORDS = {
    "LOCAL": "a node (%N)", "FREEVAR": "a free variable $(@g:%N)", "GRAPH": "a graph (@name)",
    "NAME": "a name", "INT": "an integer", "FLOAT": "a number", "STRING": "a string",
    "LABEL": "a name", "TENSOR_DATA": "tensor elements [...]", "LOC": "a location comment",
    "ENTRY_LINE": "'# IR entry: @name'", "PHASE_LINE": "'# Phase: ...'",
    "DEFS_LINE": "'# Definitions: ...'", "META_LINE": "'# Meta key: value'",
    "META_STMT": "'meta key = value'", "NODE_META": "'meta: {...}'", "$END": "the end of the file",
}


def _expected_words(expected: Any) -> str:
    """The terminals a state accepts, in words (keywords and punctuation quoted)."""
    lark, _ = _parser()
    by_name = {t.name: t for t in lark.terminals}
    words = set()
    for name in expected:
        term = by_name.get(name)
        if name in _TERMINAL_WORDS:
            words.add(_TERMINAL_WORDS[name])
        elif term is not None and term.pattern.type == "str":
            words.add(f"'{term.pattern.value}'")
    ordered = sorted(words)
    if len(ordered) > 8:
        ordered = ordered[:8] + ["..."]
    return ", ".join(ordered)


# -- building ----------------------------------------------------------------------
class _GraphState:
    """What is known about one graph while its file is read."""

    __slots__ = ("graph", "defined", "locals", "first_use", "pending", "output", "output_abstract")

    def __init__(self, graph: FuncGraph) -> None:
        self.graph = graph
        self.defined = False
        self.locals: dict[str, Node] = {}
        self.first_use: Optional[Token] = None
        self.pending: list[tuple[CNode, list[Any], Token]] = []
        self.output: Any = None
        self.output_abstract: Any = None


class _Ref:
    """An operand naming a node: ``%N`` of the current graph or ``$(@g:%N)``."""

    __slots__ = ("graph", "local", "token")

    def __init__(self, graph: "_GraphState", local: str, token: Token) -> None:
        self.graph = graph
        self.local = local
        self.token = token


class _Const:
    """An operand that is a constant (its ValueNode is made per use)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _SymbolConst(_Const):
    """A ``Symbol(name)`` operand: a global name to resolve, with where the dump has it."""

    __slots__ = ("loc",)

    def __init__(self, value: Any, loc: Location) -> None:
        super().__init__(value)
        self.loc = loc


class _Leading:
    """The dims of ``<f64[N, *]>`` (a tensor of unknown rank whose first dims are known)."""

    __slots__ = ("dims",)

    def __init__(self, dims: tuple) -> None:
        self.dims = dims


@v_args(inline=True)
class _IRBuilder(Transformer):
    """Builds graphs while Lark parses (callbacks run at each reduction)."""

    def __init__(self) -> None:
        super().__init__()
        self._reset("<string>", "", None)

    def _reset(self, filename: str, text: str, side: Optional[Mapping[str, np.ndarray]]) -> None:
        """Forget the previous file; read ``text`` next."""
        self.filename = filename
        self.text = text
        self.lines = text.split("\n")
        self.side = side
        self.graphs: dict[str, _GraphState] = {}
        self.order: list[_GraphState] = []
        self.current: Optional[_GraphState] = None
        self.entry: Optional[str] = None
        self.phase = ""
        self.definitions: list[tuple[str, str, Token]] = []
        self.metadata: dict[str, Any] = {}
        """The module's metadata (``# Meta key: value`` lines)."""
        self.closures: list[tuple[Closure, Token]] = []
        """Every ``Closure(@g, env)`` constant, checked once the graphs are wired."""
        self._dim_loc: Optional[Location] = None
        """Where the last dimension atom was read (for errors in dimension expressions)."""
        archive = getattr(self, "archive", None)
        if archive is not None:
            archive.close()
        self.archive: Optional[zipfile.ZipFile] = None

    # -- helpers --------------------------------------------------------------------
    def _location_at(self, line: int, col: int) -> Location:
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return Location(self.filename, line, col, text)

    def _loc(self, token: Token) -> Location:
        return self._location_at(token.line or 0, token.column or 0)

    def _error(self, message: str, token: Token, kind: type = AnfirSyntaxError) -> AnfirError:
        return kind(message, self._loc(token))

    def _state(self, name: str, token: Token) -> _GraphState:
        st = self.graphs.get(name)
        if st is None:
            # ``@?g``: a graph outside the dump (named by a type): a stub named ``g``.
            st = self.graphs[name] = _GraphState(FuncGraph(name[1:] if name.startswith("?") else name))
            st.first_use = token
        return st

    # -- header -----------------------------------------------------------------------
    def entry_line(self, token: Token) -> None:
        value = token.split(":", 1)[1].strip()
        if not value.startswith("@"):
            raise self._error("the IR entry line names a graph: '# IR entry: @name'", token)
        self.entry = value[1:]

    def phase_line(self, token: Token) -> None:
        self.phase = token.split(":", 1)[1].strip()

    def defs_line(self, token: Token) -> None:
        for item in token.split(":", 1)[1].split():
            key, sep, graph = item.partition("=")
            if not sep or not graph.startswith("@") or not key:
                raise self._error(f"a definition is written name=@graph, not {item!r}", token)
            self.definitions.append((key, graph[1:], token))

    def meta_line(self, token: Token) -> None:
        key, value = self._meta_pair(token, token.index("Meta") + 4, ":")
        if key in self.metadata:
            raise self._error(f"the module's metadata gives {key!r} twice", token)
        self.metadata[key] = value

    def _meta_pair(self, token: Token, start: int, sep: str) -> tuple[str, Any]:
        """``key<sep> value`` in ``token`` from ``start`` on: the key and its JSON value."""
        text = str(token)[start:]
        at = 0  # where in text the part being read starts
        try:
            key, _, value_text, at = split_attribute(text, sep)
            return key, parse_json(value_text)
        except MetadataSyntaxError as exc:
            where = self._location_at(token.line or 0, (token.column or 0) + start + at + exc.offset)
            raise AnfirSyntaxError(exc.message, where) from None

    # -- subgraphs ----------------------------------------------------------------------
    def subgraph_head(self, loc: Optional[Token], name: Token, parent: Any, params: Any,
                      ret: Any) -> None:
        st = self._state(name[1:], name)
        if st.defined:
            raise self._error(f"graph @{st.graph.name} is defined twice", name)
        st.defined = True
        g = st.graph
        g.loc = self._parse_loc(loc) if loc is not None else None
        for token, annotation in params or ():
            local = str(token)
            if local in st.locals:
                raise self._error(f"parameter {local} is declared twice", token)
            p = g.add_parameter(_param_name(local), self._loc(token))
            p.loc = None  # set by a 'param' line when the dump had one
            p.annotation = annotation
            st.locals[local] = p
        if ret is not None:
            g.flags["return_type"] = ret
        self.current = st

    def param_list(self, *decls: Any) -> list:
        return [d for d in decls if d is not None]

    def param_decl(self, token: Token, annotation: Any) -> tuple:
        return (token, annotation)

    def parent(self, token: Token) -> Token:
        return token

    def subgraph(self, _head: Any, *rest: Any) -> None:
        self.current = None

    def attr_stmt(self, name: Token, value: Any) -> None:
        assert self.current is not None
        self.current.graph.flags[str(name)] = self._constant(value)

    def meta_stmt(self, token: Token) -> None:
        assert self.current is not None
        key, value = self._meta_pair(token, 4, "=")
        flags = self.current.graph.flags
        meta = flags.setdefault("meta", {})
        if key in meta:
            raise self._error(f"@{self.current.graph.name}'s metadata gives {key!r} twice", token)
        meta[key] = value

    def abstract_stmt(self, value: Any) -> None:
        assert self.current is not None
        self.current.graph.abstract = value

    def graph_sig(self, *items: Any) -> None:
        assert self.current is not None
        *params, out = items
        self.current.graph.abstract = GraphSig(tuple(p for p in params if p is not None), out)

    def param_stmt(self, token: Token, abstract: Any, loc: Optional[Token]) -> None:
        st = self.current
        assert st is not None
        node = st.locals.get(str(token))
        if not isinstance(node, ParameterNode):
            raise self._error(f"{token} is not a parameter of @{st.graph.name}", token,
                             NameResolutionError)
        node.abstract = abstract
        node.loc = self._parse_loc(loc) if loc is not None else None

    def cnode_stmt(self, token: Token, label: Any, callee: Any, args: Any, attrs: Any,
                   meta: Optional[Token], signature: Any, loc: Optional[Token]) -> None:
        st = self.current
        assert st is not None
        local = str(token)
        if local in st.locals:
            raise self._error(f"{local} is defined twice in @{st.graph.name}", token)
        name, annotation = label if label is not None else (None, None)
        node = CNode(st.graph, (), self._parse_loc(loc) if loc is not None else None, name,
                     self._call_attrs(callee, attrs, token))
        node.annotation = annotation
        if meta is not None:
            st.graph.node_meta[node] = self._node_meta(meta)
        operands = [callee, *(args or [])]
        if signature is not None:
            ins, out = signature
            if len(ins) != len(operands) - 1:
                raise self._error(f"the type line of {local} lists {len(ins)} inputs, "
                                 f"but the node has {len(operands) - 1}", token)
            node.abstract = out
            operands = [operands[0]] + [_typed(op, t) for op, t in zip(operands[1:], ins)]
        callee = operands[0]
        if isinstance(callee, _Const) and not isinstance(callee.value, _CALLABLE):
            raise self._error(f"{local} calls {_shown(callee.value)}, which is not a function",
                              token, AnfirTypeError)
        st.locals[local] = node
        st.pending.append((node, operands, token))

    def _node_meta(self, token: Token) -> dict[str, Any]:
        """``meta: {...}`` after a node line: the node's metadata (a JSON object)."""
        text = str(token)[5:]
        start = len(text) - len(text.lstrip(" \t"))
        try:
            value = parse_json(text.strip(" \t\r"))
        except MetadataSyntaxError as exc:
            where = self._location_at(token.line or 0, (token.column or 0) + 5 + start + exc.offset)
            raise AnfirSyntaxError(exc.message, where) from None
        if not isinstance(value, dict) or not value:
            raise self._error("a node's metadata is a JSON object with keys: meta: {\"key\": value}",
                              token)
        return value

    def prim_attrs(self, *items: Any) -> list:
        return [item for item in items if item is not None]

    def attr_item(self, name: Token, value: Any) -> tuple:
        return (name, value)

    def _call_attrs(self, callee: Any, items: Optional[list], token: Token) -> Attrs:
        """The attributes of a node line, checked against its callee's declaration
        (and put in canonical form)."""
        if not items:
            return NO_ATTRS
        prim = callee.value if isinstance(callee, _Const) else None
        if isinstance(prim, Symbol):
            # A parse-phase dump keeps the global names of a lambda's body unresolved:
            # its attributes are those of the primitive the name stands for.
            prim = lookup(prim.name)
        if not isinstance(prim, Primitive):
            raise self._error(f"{token} has primitive_attrs, but its callee is not a primitive",
                              items[0][0], AnfirTypeError)
        pairs = []
        for name, value in items:
            constant = self._constant(value) if isinstance(value, _Const) else value
            if not is_attr_value(constant):
                raise self._error(f"attribute {name} of {prim.name} is not a constant "
                                  "(None, a number, a bool, a string or a tuple of them)",
                                  name, AnfirTypeError)
            pairs.append((str(name), constant))
        try:
            return prim.canonical_attrs(pairs)
        except AnfirError as exc:
            raise self._error(exc.message, items[0][0], type(exc)) from None

    def label(self, name: Optional[Token], annotation: Any) -> tuple:
        return (str(name) if name is not None else None, annotation)

    def args(self, *operands: Any) -> list:
        return list(operands)

    def signature(self, ins: Any, out: Any) -> tuple:
        return (list(ins or ()), out)

    def abs_list(self, *items: Any) -> list:
        return list(items)

    def return_stmt(self, operand: Any, abstract: Any) -> None:
        st = self.current
        assert st is not None
        st.output = operand
        st.output_abstract = abstract

    # -- operands -------------------------------------------------------------------------
    def local_ref(self, token: Token) -> _Ref:
        assert self.current is not None
        return _Ref(self.current, str(token), token)

    def free_ref(self, token: Token) -> _Ref:
        inner = str(token)[3:-1]  # $(@g:%N) -> g:%N
        graph, _, local = inner.rpartition(":")
        return _Ref(self._state(graph, token), local, token)

    def _parse_loc(self, token: Token) -> Location:
        """``# file:line:col (note)  text`` -> a Location (see :func:`split_location_comment`)."""
        parts = split_location_comment(str(token).rstrip("\r"))
        if parts is None:  # the lexer only makes LOC tokens of this shape
            raise self._error("a location comment is written '# file:line:col  text'", token)
        file, line, col, note, text = parts
        if len(line) > 12 or len(col) > 12:
            raise self._error("a location's line or column number is too large", token)
        return Location(file, int(line), int(col), text, note)

    # -- constants -----------------------------------------------------------------------
    def _constant(self, value: Any) -> Any:
        return value.value if isinstance(value, _Const) else value

    def int_(self, token: Token) -> _Const:
        return _Const(self._int(token))

    def neg_int(self, token: Token) -> _Const:
        return _Const(-self._int(token))

    def _int(self, token: Token) -> int:
        """An INT token's value; more than ``anfir.limits.MAX_INT_DIGITS`` digits is an error."""
        why = limits.int_too_long(str(token))
        if why is not None:
            raise self._error(why, token)
        return int(token)

    def _size(self, token: Token, what: str) -> int:
        """An INT token that is a size (a dimension, an index): at most ``MAX_DIMENSION``."""
        text = str(token)
        if len(text.lstrip("0")) > 19 or int(text) > limits.MAX_DIMENSION:
            shown = text if len(text) <= 30 else text[:20] + "..."
            raise self._error(f"{what} is at most {limits.MAX_DIMENSION:,}, not {shown}", token)
        return int(text)

    def float_(self, token: Token) -> _Const:
        return _Const(float(token))

    def neg_float(self, token: Token) -> _Const:
        return _Const(-float(token))

    def complex_(self, token: Token) -> _Const:
        return _Const(self._complex(str(token), token))

    def _complex(self, word: str, token: Token) -> complex:
        """``re+imj`` read by Python's ``complex()`` (a parser, not eval); its
        parts are bounded by the token's syntax (no integers of 4,300 digits)."""
        if len(word) > 100:
            raise self._error(f"a complex number of {len(word)} characters", token)
        try:
            return complex(word)
        except ValueError:
            raise self._error(f"bad complex number {word!r}", token) from None

    def inf(self) -> _Const:
        return _Const(math.inf)

    def neg_inf(self) -> _Const:
        return _Const(-math.inf)

    def nan(self) -> _Const:
        return _Const(math.nan)

    def true(self) -> _Const:
        return _Const(True)

    def false(self) -> _Const:
        return _Const(False)

    def none(self) -> _Const:
        return _Const(None)

    def string(self, token: Token) -> _Const:
        return _Const(self._unquote(token))

    def _unquote(self, token: Token) -> str:
        try:
            return json.loads(str(token), strict=False)
        except ValueError:
            raise self._error(f"bad string literal {token}", token) from None

    def graph_ref(self, token: Token) -> _Const:
        return _Const(self._state(str(token)[1:], token).graph)

    def builtin(self, token: Token) -> _Const:
        found = lookup(str(token))
        if found is None:
            raise self._error(f"unknown primitive {token!s}", token, NameResolutionError)
        return _Const(found)

    def empty_tuple(self) -> _Const:
        return _Const(())

    def tuple1(self, item: _Const) -> _Const:
        return _Const((item.value,))

    def tuple_n(self, *items: _Const) -> _Const:
        return _Const(tuple(i.value for i in items))

    def shape(self, *dims: Token) -> tuple:
        return tuple(self._size(d, "a dimension") for d in dims if d is not None)

    def tensor(self, dtype: Token, shape: tuple, data: Any) -> _Const:
        name = str(dtype)
        np_dtype = self._numpy_dtype(name, dtype, "unknown tensor dtype")
        kind, payload, token = data
        count = math.prod(shape)  # (Python integers: no overflow)
        if count * np_dtype.itemsize > limits.MAX_CONSTANT_BYTES:
            raise self._error(f"a {name} tensor of shape {shape} would take {count * np_dtype.itemsize:,} "
                              f"bytes; a constant holds at most {limits.MAX_CONSTANT_BYTES:,} "
                              "(anfir.limits.MAX_CONSTANT_BYTES)", dtype)
        if kind == "side":
            array = self._side_array(payload, token, np_dtype, shape, name)
            array.setflags(write=False)
            return _Const(array)
        values = payload
        if len(values) != count:
            raise self._error(f"a {name} tensor of shape {shape} has {count} elements, "
                             f"not {len(values)}", token or dtype)
        if count == 0:
            array = np.zeros(shape, np_dtype)
        else:
            self._check_range(values, np_dtype, name, token or dtype)
            # Floats are read as f64 first, then rounded once to their dtype.
            kind = numpy_kind(np_dtype)
            array = np.array(values, dtype=np.float64 if kind == "float" else np_dtype)
            array = array.astype(np_dtype).reshape(shape)
        array.setflags(write=False)
        return _Const(array)

    def _check_range(self, values: list, np_dtype: np.dtype, name: str, token: Token) -> None:
        """Every element fits ``np_dtype`` (an integer in range; a float for a float
        type; a complex number only for a complex type)."""
        kind = numpy_kind(np_dtype)
        if kind != "complex":
            for v in values:
                if isinstance(v, complex):
                    raise self._error(f"{v!r} is not a {name} value", token,
                                      AnfirTypeError)
        if kind in ("int", "uint"):
            low, high = int_range(np_dtype)
            for v in values:
                if isinstance(v, float) or not (low <= v <= high):
                    raise self._error(f"{v!r} does not fit {name} (whose values are "
                                      f"{low} to {high})", token, AnfirTypeError)
        elif kind in ("float", "complex"):
            for v in values:
                if isinstance(v, int) and not isinstance(v, bool) and abs(v) > 2 ** 1023:
                    raise self._error(f"an integer of {len(limits.int_text(v))} digits is too "
                                      f"large for {name}", token, AnfirTypeError)
        elif kind == "bool":
            for v in values:
                if not isinstance(v, bool) and v not in (0, 1):
                    raise self._error(f"{v!r} is not a bool value (true or false)", token,
                                      AnfirTypeError)

    def tensor_lists(self, token: Token) -> tuple:
        return ("inline", self._tensor_elements(token), token)

    def tensor_scalar(self, value: _Const) -> tuple:
        return ("inline", [value.value], None)

    def tensor_side(self, token: Token) -> tuple:
        return ("side", self._unquote(token), token)

    def _tensor_elements(self, token: Token) -> list:
        text = str(token)
        if text.count("[") != text.count("]"):
            raise self._error("unbalanced brackets in tensor data", token)
        values: list[Any] = []
        for piece in text.replace("[", " ").replace("]", " ").split(","):
            word = piece.strip()
            if not word:
                continue
            values.append(self._element(word, token))
        return values

    def _element(self, word: str, token: Token) -> Any:
        if word == "true":
            return True
        if word == "false":
            return False
        try:
            if re.fullmatch(r"-?\d+", word):
                why = limits.int_too_long(word)
                if why is not None:
                    raise self._error(why, token)
                return int(word)
            if re.fullmatch(r"-?(\d+\.\d*(e[-+]?\d+)?|\d+e[-+]?\d+|inf|nan)", word, re.I):
                return float(word)
            if word.endswith("j"):
                return self._complex(word, token)
        except ValueError:
            pass
        raise self._error(f"bad tensor element {word!r}", token)

    def _side_array(self, key: str, token: Token, np_dtype: np.dtype, shape: tuple,
                    name: str) -> np.ndarray:
        """The array ``key`` of the side data, which must be ``name``\\ ``shape``.

        From the ``.npz`` file, only this member is read, and only once its
        header has said it is the array the dump declares (a member claiming
        another shape or size is refused before its data is read).
        """
        if self.side is not None:
            try:
                array = np.asarray(self.side[key])
            except KeyError:
                raise self._error(f"the side file has no array {key!r}", token) from None
            self._check_side(key, array.dtype, array.shape, np_dtype, shape, name, token)
            return array
        archive = self._open_side_file(token)
        member = key + ".npy"
        try:
            info = archive.getinfo(member)
        except KeyError:
            raise self._error(f"the side file has no array {key!r}", token) from None
        try:
            with archive.open(info) as stream:
                found_shape, fortran, found_dtype = limits.npy_header(stream)
                self._check_side(key, found_dtype, found_shape, np_dtype, shape, name, token)
                return limits.read_npy_data(stream, found_shape, fortran, found_dtype)
        except limits.ReadError as exc:
            raise self._error(f"cannot read array {key!r} of the side file: {exc}", token) from None
        except (OSError, ValueError, EOFError, zipfile.BadZipFile, NotImplementedError) as exc:
            raise self._error(f"cannot read array {key!r} of the side file: {exc}", token) from None

    def _check_side(self, key: str, found_dtype: np.dtype, found_shape: tuple, np_dtype: np.dtype,
                    shape: tuple, name: str, token: Token) -> None:
        if found_dtype != np_dtype or tuple(found_shape) != tuple(shape):
            dims = list(found_shape) if isinstance(found_shape, tuple) else found_shape
            raise self._error(f"side array {key!r} is {found_dtype}{dims}, "
                              f"the dump says {name}{list(shape)}", token)

    def _open_side_file(self, token: Token) -> zipfile.ZipFile:
        """The ``.npz`` side file next to the dump, opened once (a regular file only)."""
        if self.archive is not None:
            return self.archive
        path = Path(self.filename).with_suffix(".npz")
        try:
            if not path.is_file():
                raise self._error(f"this dump keeps large tensors in {path.name}, which is missing",
                                  token)
            handle = open(path, "rb")
        except OSError as exc:
            raise self._error(f"cannot read the side file {path.name}: {exc.strerror or exc}",
                              token) from None
        try:
            self.archive = zipfile.ZipFile(handle)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
            handle.close()
            raise self._error(f"the side file {path.name} is not an .npz archive ({exc})",
                              token) from None
        return self.archive

    def np_scalar(self, dtype: Token, value: _Const) -> _Const:
        np_dtype = self._numpy_dtype(str(dtype), dtype, "unknown dtype")
        self._check_range([value.value], np_dtype, str(dtype), dtype)
        return _Const(np_dtype.type(value.value))

    def _numpy_dtype(self, name: str, token: Token, what: str) -> np.dtype:
        """The numpy dtype of element type ``name``; ``what name`` at ``token`` if none."""
        try:
            return numpy_dtype(name)
        except AnfirError:
            raise self._error(f"{what} {name}", token) from None

    def symbol(self, word: Token) -> _Const:
        # Located in the dump: an unknown name is reported there when resolved.
        return _SymbolConst(Symbol(self._word(word)), self._loc(word))

    def key(self, word: Token) -> _Const:
        return _Const(SymbolicKey(self._word(word)))

    def _word(self, token: Token) -> str:
        return self._unquote(token) if token.type == "STRING" else str(token)

    def dtype(self, name: Token) -> _Const:
        if not is_dtype(str(name)):
            raise self._error(f"unknown dtype {name}", name, AnfirTypeError)
        return _Const(DType(str(name)))

    def partial(self, fn: _Const, *args: _Const) -> _Const:
        inner, bound = fn.value, tuple(a.value for a in args)
        if isinstance(inner, Partial):  # Partial(Partial(f, a), b) is Partial(f, a, b): flat
            inner, bound = inner.fn, inner.args + bound
        return _Const(Partial(inner, bound))

    def closure(self, graph: Token, env: _Const) -> _Const:
        if not isinstance(env.value, tuple):
            raise self._error("a closure's environment is a tuple", graph)
        closure = Closure(self._state(str(graph)[1:], graph).graph, env.value)
        self.closures.append((closure, graph))
        return _Const(closure)

    def grad_env(self, *items: Any) -> _Const:
        return _Const(GradEnv({k: v for k, v in (i for i in items if i is not None)}))

    def env_item(self, word: Token, value: _Const) -> tuple:
        return (SymbolicKey(self._word(word)), value.value)

    # -- annotations --------------------------------------------------------------------
    # Built and checked by anfir.ir.type_syntax, as in ANF text; a dump's
    # annotations keep no location (errors still point at the name).
    def ann_scalar(self, name: Token) -> ScalarAnn:
        return scalar_type(str(name), error_loc=self._loc(name))

    def ann_tensor(self, name: Token, *dims: Any) -> TensorAnn:
        return tensor_type(str(name), (d for d in dims if d is not None), error_loc=self._loc(name))

    def ann_tuple(self, *items: Any) -> TupleAnn:
        return tuple_type(i for i in items if i is not None)

    def ann_int(self, token: Token) -> DimAnn:
        return dimension(str(token), self._loc(token))

    def ann_name(self, token: Token) -> DimAnn:
        return dimension(str(token))

    def ann_star(self) -> DimAnn:
        return dimension("*")

    # -- abstract values ------------------------------------------------------------------
    def unknown_abstract(self) -> None:
        return None

    def abs_named(self, name: Token) -> Any:
        text = str(name)
        if text == "Type":
            return AType()
        if text == "Any":
            return AAny()
        if text == "Bottom":
            return BOTTOM
        return AScalar(from_abstract_name(text))

    def abs_scalar_value(self, name: Token, value: _Const) -> AScalar:
        return AScalar(from_abstract_name(str(name)), value.value)

    def abs_true(self, name: Token) -> AScalar:
        return AScalar(from_abstract_name(str(name)), True)

    def abs_false(self, name: Token) -> AScalar:
        return AScalar(from_abstract_name(str(name)), False)

    def abs_tensor(self, dtype: Token, dims: Any) -> ATensor:
        if isinstance(dims, _Leading):  # ``<f64[N, *]>``: unknown rank, first dims known
            return ATensor(str(dtype), None, dims.dims)
        return ATensor(str(dtype), dims)

    def dims_leading(self, *dims: Any) -> "_Leading":
        return _Leading(tuple(self._dim(d) for d in dims if d is not None))

    def dims_list(self, *dims: Any) -> tuple:
        return tuple(self._dim(d) for d in dims if d is not None)

    def _dim(self, dim: Any) -> Any:
        dim = _norm_dim(dim)
        if isinstance(dim, int) and not 0 <= dim <= limits.MAX_DIMENSION:
            raise AnfirSyntaxError(f"a dimension is from 0 to {limits.MAX_DIMENSION:,}, not "
                                   f"{limits.int_text(dim) if dim.bit_length() < 200 else 'a huge number'}",
                                   self._dim_loc)
        return dim

    def dims_any(self) -> None:
        return None

    def abs_tuple(self, *items: Any) -> ATuple:
        return ATuple(tuple(i for i in items if i is not None))

    def abs_string(self) -> AString:
        return AString()

    def abs_string_value(self, token: Token) -> AString:
        return AString(self._unquote(token))

    def abs_none(self) -> ANone:
        return ANone()

    def abs_env(self) -> AEnv:
        return AEnv()

    def abs_key(self) -> AKey:
        return AKey()

    def abs_func(self, *atoms: Any) -> AFunction:
        return AFunction(frozenset(atoms))

    def fn_graph(self, token: Token) -> GraphFn:
        return GraphFn(self._state(str(token)[1:], token).graph)

    def fn_prim(self, token: Token) -> PrimFn:
        found = lookup(str(token))
        if found is None:
            raise self._error(f"unknown primitive {token!s} in a type", token, NameResolutionError)
        return PrimFn(found)

    def fn_apply(self, name: Token, fn: Any, *args: Any) -> Any:
        kind = str(name)
        depth, inner = 1, fn
        while isinstance(inner, (JFn, PartialFn, GradFn)):
            depth, inner = depth + 1, inner.fn
            if depth > MAX_FUNCTION_NESTING:
                raise self._error(f"a function type nests J/partial/grad more than "
                                  f"{MAX_FUNCTION_NESTING} deep", name)
        abstracts = all(isinstance(a, AbstractValue) for a in args)
        indices = all(isinstance(a, int) for a in args)
        if kind == "J" and not args:
            return JFn(fn)
        if kind == "partial" and abstracts:
            return PartialFn(fn, tuple(args))
        if kind in ("grad", "value_and_grad") and indices:
            return GradFn(fn, tuple(args), with_value=kind == "value_and_grad")
        raise self._error(f"unknown function type {name}(...)", name)

    def fn_index(self, token: Token) -> int:
        return self._size(token, "an argument index")

    def dim_int(self, token: Token) -> int:
        self._dim_loc = self._loc(token)
        return self._size(token, "a dimension")

    def dim_name(self, token: Token) -> Any:
        self._dim_loc = self._loc(token)
        return _dim_symbol(str(token))

    def dim_add(self, a: Any, b: Any) -> Any:
        return a + b

    def dim_sub(self, a: Any, b: Any) -> Any:
        return a - b

    def dim_mul(self, a: Any, b: Any) -> Any:
        return a * b

    def dim_div(self, a: Any, b: Any) -> Any:
        if b == 0:
            raise AnfirSyntaxError("a dimension divided by zero", self._dim_loc)
        return sympy.Rational(a, b) if isinstance(a, int) and isinstance(b, int) else a / b

    def dim_power(self, a: Any, b: Any) -> Any:
        # Dimension expressions are small: a huge power (10**10**10) would make
        # sympy compute for ever, so exponents are small integers.
        if not (isinstance(b, int) or (isinstance(b, sympy.Integer))) or abs(int(b)) > MAX_DIM_EXPONENT:
            raise AnfirSyntaxError(f"a dimension's exponent is an integer from "
                                   f"-{MAX_DIM_EXPONENT} to {MAX_DIM_EXPONENT}, not {b}",
                                   self._dim_loc)
        if isinstance(a, int) and abs(a) > 1 and (abs(a).bit_length() - 1) * int(b) >= 63:
            raise AnfirSyntaxError(f"the dimension {a}**{b} is too large", self._dim_loc)
        return sympy.Pow(a, b)

    def dim_neg(self, a: Any) -> Any:
        return -a

    def dim_call(self, name: Token, *args: Any) -> Any:
        fn = _DIM_FUNCTIONS.get(str(name))
        if fn is None:
            raise self._error(f"unknown function {name} in a dimension", name)
        try:
            return fn(*args)
        except (TypeError, ValueError, ZeroDivisionError) as exc:
            raise self._error(f"bad dimension {name}(...): {exc}", name) from None

    # -- the end ----------------------------------------------------------------------
    def start(self, *_items: Any) -> None:
        return None

    def _finish(self) -> Module:
        """Wire every node's inputs (all graphs are known now) and make the Module."""
        for name, st in self.graphs.items():
            if not st.defined and not name.startswith("?"):
                assert st.first_use is not None
                raise self._error(f"graph @{st.graph.name} is used but never defined",
                                 st.first_use, NameResolutionError)
        for st in self.graphs.values():
            if not st.defined:
                continue
            for node, operands, _ in st.pending:
                node._inputs = tuple(self._operand_node(op) for op in operands)
            if st.output is not None:
                out = self._operand_node(st.output)
                if isinstance(out, ValueNode):
                    out.abstract = st.output_abstract
                st.graph.output = out
        self._check_no_cycle()
        graphs = {}
        for key, name, token in self.definitions:
            state = self.graphs.get(name)
            if state is None or not state.defined:
                raise self._error(f"definition {key} names @{name}, which the dump does not define",
                                 token, NameResolutionError)
            graphs[key] = state.graph
        if not graphs and self.entry is not None and self.entry in self.graphs:
            graphs[self.entry] = self.graphs[self.entry].graph
        if not graphs:
            defined = [st.graph for st in self.graphs.values() if st.defined]
            if defined:
                graphs[defined[0].name] = defined[0]
        roots = [st.graph for st in self.graphs.values() if st.defined]
        if not roots:
            raise AnfirSyntaxError("the dump defines no subgraph",
                                   self._location_at(max(len(self.lines), 1), 1))
        if roots:
            manage(*roots)
        self._check_closures()
        module = Module(graphs, self.filename)
        module.phase = self.phase
        module.metadata = self.metadata
        entry = self.graphs.get(self.entry) if self.entry else None
        module.ir_entry = entry.graph if entry is not None else None
        module.default_entry = next((name for name, g in graphs.items()
                                     if entry is not None and g is entry.graph), None)
        return module

    def _check_no_cycle(self) -> None:
        """Reject a node that depends on itself (``%1 = add(%1, 1)``, or through other
        nodes, of any graph): every walk of the graphs would loop.  Iterative DFS."""
        token_of = {node: token for st in self.graphs.values() for node, _, token in st.pending}
        state: dict[CNode, int] = {}  # 1: on the current path, 2: done
        for start in token_of:
            if start in state:
                continue
            state[start] = 1
            path = [start]
            stack = [iter(start._inputs)]
            while stack:
                for inp in stack[-1]:
                    if inp.__class__ is not CNode:
                        continue
                    seen = state.get(inp)
                    if seen == 1:
                        cycle = path[path.index(inp):] + [inp]
                        names = " -> ".join(self._local_name(n).split()[0] for n in cycle)
                        raise self._error(f"{self._local_name(inp)} depends on its own value "
                                          f"({names}): a node cannot use itself",
                                          token_of[inp], NameResolutionError)
                    if seen is None:
                        state[inp] = 1
                        path.append(inp)
                        stack.append(iter(inp._inputs))
                        break
                else:
                    stack.pop()
                    state[path.pop()] = 2

    def _local_name(self, node: Node) -> str:
        for st in self.graphs.values():
            for local, found in st.locals.items():
                if found is node:
                    return f"{local} of @{st.graph.name}"
        return "a node"  # pragma: no cover - every CNode is some graph's local

    def _check_closures(self) -> None:
        """A ``Closure(@g, env)`` captures exactly the values @g's free variables need."""
        for closure, token in self.closures:
            graph = closure.graph
            if graph.manager is None or not graph.has_output:
                raise self._error(f"a closure of @{graph.name}, which the dump does not define",
                                  token, NameResolutionError)
            needed = len(graph.manager.free_variables_total(graph))
            if needed != len(closure.env):
                raise self._error(f"a closure of @{graph.name} captures {len(closure.env)} "
                                  f"value{'s' if len(closure.env) != 1 else ''}, but "
                                  f"@{graph.name} has {needed} free variable"
                                  f"{'s' if needed != 1 else ''}", token, AnfirTypeError)

    def _operand_node(self, op: Any) -> Node:
        if isinstance(op, _Typed):
            node = self._operand_node(op.operand)
            if isinstance(node, ValueNode):
                node.abstract = op.abstract
            return node
        if isinstance(op, _SymbolConst):
            return ValueNode(op.value, op.loc)
        if isinstance(op, _Const):
            return ValueNode(op.value)
        st = op.graph
        node = st.locals.get(op.local)
        if node is None:
            where = f"@{st.graph.name}"
            raise self._error(f"{op.local} is not defined in {where}", op.token, NameResolutionError)
        return node


class _Typed:
    """An argument with the abstract value its node's type line gives it."""

    __slots__ = ("operand", "abstract")

    def __init__(self, operand: Any, abstract: Any) -> None:
        self.operand = operand
        self.abstract = abstract


def _typed(operand: Any, abstract: Any) -> Any:
    # Only constants take their type from the line (other nodes have their own).
    return _Typed(operand, abstract) if isinstance(operand, _Const) and abstract is not None else operand


def split_location_comment(comment: str) -> Optional[tuple[str, str, str, str, str]]:
    """``(file, line, col, note, text)`` of a location comment
    ``#[ ]file:line:col[ (note)][  text]``, or None if it is not one.

    The file is the shortest prefix after which the rest fits (file names
    may hold ``:``), the note the shortest that ends with ``)`` followed by
    the end or two blanks — what a backtracking regular expression would
    choose, found in linear time (a regex took quadratic time on long lines).
    """
    if not comment.startswith("#"):
        return None
    start = 2 if comment[1:2] in (" ", "\t") else 1
    n = len(comment)
    # Where a note may end: a ')' at the end of the line or before two blanks.
    closes = [i for i in range(n) if comment[i] == ")"
              and (i == n - 1 or comment.startswith("  ", i + 1))] if ")" in comment else []
    for match in _LOC_NUMBERS.finditer(comment, start):
        line, col = match.group(1), match.group(2)
        rest = match.start() + 2 + len(line) + len(col)
        if rest == n:
            return comment[start:match.start()], line, col, "", ""
        if comment.startswith("  ", rest):
            return comment[start:match.start()], line, col, "", comment[rest + 2:]
        if comment.startswith(" (", rest):
            at = bisect.bisect_left(closes, rest + 2)
            if at < len(closes):
                close = closes[at]
                return (comment[start:match.start()], line, col, comment[rest + 2:close],
                        comment[close + 3:])
    return None


def _shown(value: Any) -> str:
    text = repr(value) if not isinstance(value, np.ndarray) else f"a tensor of shape {value.shape}"
    return text if len(text) <= 60 else text[:57] + "..."


def _param_name(local: str) -> str:
    """``%para1_x`` -> ``x`` (``%para1`` -> ``""``)."""
    match = re.match(r"%para\d+_?(.*)\Z", local, re.S)
    return match.group(1) if match else local.lstrip("%")


def _dim_symbol(name: str) -> Any:
    return dim_symbol(name)


def _norm_dim(dim: Any) -> Any:
    if isinstance(dim, sympy.Basic) and dim.is_Integer:
        return int(dim)
    return dim


__all__ = ["load_ir_text", "load_ir_file"]

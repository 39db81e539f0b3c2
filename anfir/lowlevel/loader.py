"""Reading ``.lir`` text back into a :class:`~anfir.lowlevel.program.LowProgram`.

The grammar is ``lir.lark`` (Lark LALR, contextual lexer); the transformer is
passed to ``Lark(...)`` so values are built during the parse, without
recursion however deeply tuples nest.  The builder then checks what the
grammar cannot, each error located at the token (``file:line:col``): names
defined once, buffers used only while allocated, known primitives, one output
per instruction, types and sizes within :mod:`anfir.limits`, offsets that fit
the arena.  The header's figures are recomputed, not read.
"""

from __future__ import annotations

import builtins
import json
import math
import re
import threading
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np
from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken

from anfir import limits
from anfir.dtypes import numpy_dtype
from anfir.errors import AnfirSyntaxError, UsageError
from anfir.ir.primitive import Primitive
from anfir.location import Location
from anfir.lowlevel.program import (
    PSEUDO_PRIMITIVES, Alloc, Branch, Buffer, Dealloc, Instr, Line, Loop, LowProgram, lives,
)
from anfir.lowlevel.rules import RULES, TensorType
from anfir.primitives.registry import PRIMITIVES
from anfir.runtime_values import DType

MAX_DIMS = 64
"""The most dimensions a ``.lir`` type may have."""

MAX_NESTING = 200
"""How deep the signature's tuples, and loop and branch bodies, may nest."""


class LirError(AnfirSyntaxError):
    """A ``.lir`` text that is malformed or inconsistent (located)."""


class _Located:
    """A parsed item with the token that starts it."""

    def __init__(self, token: Token, value: Any) -> None:
        self.token = token
        self.value = value


@v_args(inline=True)
class _Values(Transformer):
    """Builds Python values during the parse."""

    def number(self, token: Token) -> Any:
        text = str(token)
        if re.fullmatch(r"-?\d+", text):
            if len(text) > limits.MAX_INT_DIGITS:
                raise _TokenError("an integer with too many digits", token)
            return int(text)
        return float(text)

    def nan(self) -> float:
        return math.nan

    def inf(self) -> float:
        return math.inf

    def neg_inf(self) -> float:
        return -math.inf

    def true(self) -> bool:
        return True

    def false(self) -> bool:
        return False

    def none(self) -> None:
        return None

    def string(self, token: Token) -> str:
        # the literal syntax is JSON's (printed with json.dumps)
        return str(json.loads(str(token)))

    def dtype(self, token: Token) -> DType:
        return DType(str(token))

    def dims(self, *ints: Token) -> tuple[int, ...]:
        if len(ints) > MAX_DIMS:
            raise _TokenError(f"more than {MAX_DIMS} dimensions", ints[0])
        out = []
        for token in ints:
            if len(token) > 19 or int(token) > limits.MAX_DIMENSION:
                raise _TokenError("a dimension beyond the largest size", token)
            out.append(int(token))
        return tuple(out)

    def type(self, dtype: Token, dims: Optional[tuple[int, ...]] = None) -> _Located:
        return _Located(dtype, TensorType(str(dtype), dims or ()))

    def empty_tuple(self) -> Any:
        return ()

    def tuple(self, *items: Any) -> Any:
        return builtins.tuple(_plain(i) for i in items)

    def empty_list(self) -> Any:
        return []

    def list(self, *items: Any) -> Any:
        return [_plain(i) for i in items]

    def buf_struct(self, token: Token) -> Token:
        return token

    def none_struct(self) -> None:
        return None

    def empty_struct(self) -> Any:
        return ()

    def tuple_struct(self, *items: Any) -> Any:
        return tuple(items)

    def offset(self, token: Token) -> Token:
        return token


def _plain(item: Any) -> Any:
    return item.value if isinstance(item, _Located) else item


class _TokenError(Exception):
    """An error found while building a value, at ``token``."""

    def __init__(self, message: str, token: Token) -> None:
        super().__init__(message)
        self.message = message
        self.token = token


_LOCK = threading.Lock()
_PARSER: Optional[Lark] = None


def _parser() -> Lark:
    global _PARSER
    if _PARSER is None:
        grammar = (Path(__file__).parent / "lir.lark").read_text(encoding="utf-8")
        _PARSER = Lark(grammar, parser="lalr", lexer="contextual", start="start",
                       transformer=_Values(), maybe_placeholders=True)
    return _PARSER


def primitive_named(name: str) -> Optional[Primitive]:
    """The primitive a ``.lir`` instruction names (the op library's or a low-level one)."""
    for prim in PSEUDO_PRIMITIVES:
        if prim.name == name:
            return prim
    return PRIMITIVES.get(name)


def load_lir_text(text: str, filename: str = "<string>") -> LowProgram:
    """The low-level program a ``.lir`` text describes."""
    lines = text.splitlines()

    def at(line: int, col: int) -> Location:
        shown = lines[line - 1] if 0 < line <= len(lines) else ""
        return Location(filename, max(line, 1), max(col, 1), shown)

    with _LOCK:
        try:
            tree = _parser().parse(text)
        except UnexpectedInput as exc:
            raise _syntax_error(exc, at, lines) from None
        except _TokenError as exc:
            raise LirError(exc.message, at(exc.token.line or 1, exc.token.column or 1)) from None
        except Exception as exc:  # a transformer callback failed: Lark wraps it
            inner = getattr(exc, "orig_exc", None)
            if isinstance(inner, _TokenError):
                raise LirError(inner.message, at(inner.token.line or 1, inner.token.column or 1)) from None
            raise
    low = _Builder(filename, at).build(tree)
    if low.arena_bytes is None and not low.allocs() and not re.search(r"^# arena: not planned", text, re.M):
        low.arena_bytes = 0  # planned, with nothing to place
    return low


def load_lir_file(path: Union[str, Path]) -> LowProgram:
    """Read a ``.lir`` file (at most ``anfir.limits.MAX_SOURCE_BYTES``)."""
    try:
        data = limits.read_bounded(str(path))
    except limits.ReadError as exc:
        raise UsageError(f"cannot read {path}: {exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise LirError("the file is not valid UTF-8 text", Location(str(path), line, 1)) from None
    return load_lir_text(text, str(path))


def _syntax_error(exc: UnexpectedInput, at: Any, lines: list[str]) -> LirError:
    line = getattr(exc, "line", 0) or 0
    col = getattr(exc, "column", 0) or 0
    if isinstance(exc, UnexpectedEOF) or line <= 0 or line > len(lines):
        line = max(len(lines), 1)
        col = len(lines[-1]) + 1 if lines else 1
        return LirError("the .lir text ends too early (a section is not closed with '}'?)", at(line, col))
    if isinstance(exc, UnexpectedCharacters):
        return LirError("unexpected character in the .lir text", at(line, col))
    if isinstance(exc, UnexpectedToken):
        found = exc.token
        shown = "end of file" if found.type == "$END" else repr(str(found))
        expected = ", ".join(sorted(str(e).strip('"').lower() for e in exc.expected)[:8])
        return LirError(f"unexpected {shown}; expected one of: {expected}", at(line, col))
    return LirError(str(exc).splitlines()[0], at(line, col))  # pragma: no cover


class _Builder:
    """Checks the parsed items and builds the program."""

    def __init__(self, filename: str, at: Any) -> None:
        self.filename = filename
        self.at = at
        self.buffers: dict[str, Buffer] = {}
        self.names: set[str] = set()

    def error(self, message: str, token: Any) -> LirError:
        return LirError(message, self.at(getattr(token, "line", 1) or 1, getattr(token, "column", 1) or 1))

    def take(self, token: Token) -> str:
        name = str(token)[1:]
        if name in self.names:
            raise self.error(f"%{name} is defined twice", token)
        self.names.add(name)
        return name

    def build(self, tree: Any) -> LowProgram:
        header, signature, declare, program = tree.children
        name, phase = "main", ""
        if header is not None:
            match = re.match(r"# Low-level program @(\S+)(?:\s+phase\s+(\S+))?", str(header))
            if match:
                name, phase = match.group(1), match.group(2) or ""
        declares = [self.decl(d) for d in declare.children]
        params_token, result_token = signature.children
        where = next((t for t in _tokens(signature) if isinstance(t, Token)), None)
        params = self.struct(params_token, "input", where)
        result = self.struct(result_token, None, where)
        if not isinstance(params, tuple):
            raise self.error("the signature's parameters are a tuple: (%a, %b)", where)
        leaves: list[Buffer] = []
        stack: list[Any] = [params]
        while stack:
            item = stack.pop()
            if isinstance(item, Buffer):
                leaves.append(item)
            elif isinstance(item, tuple):
                stack.extend(reversed(item))
        for index, buffer in enumerate(leaves):  # the lowering's comment, derived again
            buffer.comment = f"parameter {index} of @{name}"
        body = self.body(program.children)
        low = LowProgram(name, declares, body, params, result, phase=phase)
        allocs = low.allocs()
        if allocs and all(b.offset is not None for b in allocs):
            low.arena_bytes = max(b.offset + b.size for b in allocs if b.offset is not None)
            self.check_offsets(low)
        elif any(b.offset is not None for b in allocs):
            raise LirError("some allocs have an offset and others not", self.at(1, 1))
        return low

    def struct(self, item: Any, kind: Optional[str], where: Any) -> Any:
        stack: list[tuple[Any, int]] = [(item, 0)]
        tokens: list[Token] = []
        while stack:  # check every name and the depth first (iteratively)
            current, depth = stack.pop()
            if depth > MAX_NESTING:
                raise self.error(f"the signature's tuples nest more than {MAX_NESTING} deep", where)
            if isinstance(current, Token):
                tokens.append(current)
            elif isinstance(current, tuple):
                stack.extend((c, depth + 1) for c in current)
        for token in tokens:
            buffer = self.buffers.get(str(token)[1:])
            if buffer is None or buffer.kind == "alloc":
                raise self.error(f"the signature names {token}, which is not declared", token)
            if kind is not None and buffer.kind != kind:
                raise self.error(f"the signature's parameters are inputs; {token} is {buffer.kind}", token)
        return _map_struct(item, lambda t: self.buffers[str(t)[1:]])

    def decl(self, item: Any) -> Buffer:
        token, kind, type_item, value, loc = item.children
        ttype: TensorType = type_item.value
        self.check_type(ttype, type_item.token)
        buffer = Buffer(self.take(token), ttype.dtype, ttype.shape, str(kind))
        if buffer.kind == "constant":
            if value is None:
                raise self.error(f"the constant %{buffer.name} has no value", token)
            buffer.value = self.constant(value, ttype, token)
        elif value is not None:
            raise self.error(f"an {buffer.kind} has no value", token)
        self.buffers[buffer.name] = buffer
        return buffer

    def check_type(self, ttype: TensorType, token: Token) -> None:
        count = int(np.prod(ttype.shape, dtype=object))
        if count * numpy_dtype(ttype.dtype).itemsize > limits.MAX_CONSTANT_BYTES:
            raise self.error(f"a buffer of {count} elements is beyond the limit of "
                             f"{limits.MAX_CONSTANT_BYTES} bytes", token)

    def constant(self, value: Any, ttype: TensorType, token: Token) -> Any:
        dtype = numpy_dtype(ttype.dtype)
        if not ttype.shape:
            if not isinstance(value, (bool, int, float)):
                raise self.error("a scalar constant is a number or true/false", token)
            try:
                return np.asarray(value, dtype=dtype).item()
            except (OverflowError, ValueError):
                raise self.error(f"{value!r} is not a {ttype.dtype}", token) from None
        if not isinstance(value, list) or any(not isinstance(v, (bool, int, float)) for v in value):
            raise self.error("a tensor constant is a flat list of numbers [1.0, 2.0, ...]", token)
        count = int(np.prod(ttype.shape))
        if len(value) != count:
            raise self.error(f"the constant has {len(value)} elements; its type needs {count}", token)
        try:
            return np.asarray(value, dtype=dtype).reshape(ttype.shape)
        except (OverflowError, ValueError):
            raise self.error(f"the elements are not all {ttype.dtype}", token) from None

    def body(self, items: list[Any]) -> list[Line]:
        """The program section; loop and branch bodies through an explicit stack of
        (items left, lines built, the buffers live when the body began, how it ends).
        A body deallocs exactly what it allocs (a buffer of a body lives within it)."""
        root: list[Line] = []
        live: set[str] = set()
        stack: list[tuple[Any, list[Line], set[str], Any]] = [(iter(items), root, set(), None)]
        while stack:
            source, body, opened, ending = stack[-1]
            item = next(source, None)
            if item is None:
                stack.pop()
                if ending is not None:
                    if live != opened:
                        raise self.error("a body deallocs exactly the buffers it allocs "
                                         f"({', '.join(sorted('%' + n for n in live ^ opened))} "
                                         "are not)", ending)
                continue
            kind = item.data
            if kind == "alloc":
                token, type_item, offset = item.children
                ttype = type_item.value
                self.check_type(ttype, type_item.token)
                buffer = Buffer(self.take(token), ttype.dtype, ttype.shape)
                if offset is not None:
                    if len(offset) > 19:
                        raise self.error("an offset beyond the arena's limit", offset)
                    buffer.offset = int(offset)
                self.buffers[buffer.name] = buffer
                live.add(buffer.name)
                body.append(Alloc(buffer))
            elif kind == "dealloc":
                (token,) = item.children
                buffer = self.live_buffer(token, live)
                if buffer.kind != "alloc":
                    raise self.error(f"{token} is declared, not allocated: it cannot be deallocated", token)
                live.discard(buffer.name)
                body.append(Dealloc(buffer))
            elif kind in ("loop", "branch"):
                token, test, loc_token = item.children[0], item.children[1], item.children[2]
                if len(stack) > MAX_NESTING:  # the executor runs a body inside its loop's call
                    raise self.error(f"loops and branches nest more than {MAX_NESTING} deep", token)
                name = self.take(token)
                flag = self.live_buffer(test, live)
                if flag.kind != "alloc" or (flag.dtype, flag.shape) != ("bool", ()):
                    what = "flag" if kind == "loop" else "condition"
                    raise self.error(f"a {kind}'s {what} is an alloc'd bool<> buffer; {test} is not", test)
                loc = self.location(loc_token)
                inner: list[Line] = []
                if kind == "loop":
                    body.append(Loop(name, flag, inner, loc))
                    stack.append((iter(item.children[3].children), inner, set(live), token))
                else:
                    other: list[Line] = []
                    body.append(Branch(name, flag, inner, other, loc))
                    stack.append((iter(item.children[4].children), other, set(live), token))
                    stack.append((iter(item.children[3].children), inner, set(live), token))
            else:
                body.append(self.instr(item.children, live))
        return root

    def live_buffer(self, token: Token, live: set[str]) -> Buffer:
        buffer = self.buffers.get(str(token)[1:])
        if buffer is None:
            raise self.error(f"{token} is not a buffer (no alloc or declare defines it)", token)
        if buffer.kind == "alloc" and buffer.name not in live:
            raise self.error(f"{token} is used outside its life (before its alloc or after its dealloc)",
                             token)
        return buffer

    def instr(self, children: list[Any], live: set[str]) -> Instr:
        token, prim_token, statics_tree = children[0], children[1], children[2]
        operands_tree = [c for c in children[3:] if c is not None and not isinstance(c, Token)]
        loc_token = children[-1] if isinstance(children[-1], Token) and children[-1].type == "LOC" else None
        name = self.take(token)
        prim = primitive_named(str(prim_token))
        if prim is None:
            raise self.error(f"unknown primitive {str(prim_token)!r}", prim_token)
        rule = RULES.get(prim)
        if rule is None:
            raise self.error(f"{prim.name} has no low-level rule", prim_token)
        statics: dict[str, Any] = {}
        if statics_tree is not None:
            for static in statics_tree.children:
                key, value = static.children
                if str(key) in statics:
                    raise self.error(f"{key} is given twice", key)
                statics[str(key)] = _plain(value)
        operands: list[tuple[str, Buffer]] = []
        for operand in operands_tree:
            mode, buf = operand.children
            buffer = self.live_buffer(buf, live)
            operands.append((str(mode), buffer))
        modes = [m for m, _ in operands]
        outs = modes.count("@out") + modes.count("@inout")
        if outs != 1 or ("@out" in modes and modes[0] != "@out"):
            raise self.error("an instruction writes one buffer: a first @out operand or one @inout",
                             prim_token)
        scratch = [i for i, m in enumerate(modes) if m == "@scratch"]
        if scratch:
            buffer = operands[scratch[0]][1]
            if scratch != [len(operands) - 1] or buffer.kind != "alloc" or buffer.dtype != "u8" \
                    or len(buffer.shape) != 1:
                raise self.error("a @scratch operand is the last one, once, an alloc'd u8<N> buffer",
                                 prim_token)
        instr = Instr(name, prim, operands, statics, self.location(loc_token))
        if instr.output.kind in ("input", "constant"):
            raise self.error(f"%{instr.output.name} is {instr.output.kind}: instructions cannot write it",
                             prim_token)
        nargs = len(instr.inputs) + sum(1 for k in statics if re.fullmatch(r"arg\d+", k))
        if nargs < prim.min_args or (prim.max_args is not None and nargs > prim.max_args):
            raise self.error(f"{prim.name} takes {prim.min_args}"
                             + (f" to {prim.max_args}" if prim.max_args != prim.min_args else "")
                             + f" arguments, not {nargs}", prim_token)
        unknown = [k for k in statics if not re.fullmatch(r"arg\d+", k) and k not in prim.attrs]
        if unknown:
            raise self.error(f"{prim.name} has no attribute {unknown[0]!r}", prim_token)
        return instr

    def location(self, token: Optional[Token]) -> Optional[Location]:
        if token is None:
            return None
        match = re.match(r"#[ \t]+(.*):(\d+):(\d+)\s*$", str(token))
        if match is None:  # the terminal's pattern guarantees the shape
            return None
        line, col = int(match.group(2)), int(match.group(3))
        return Location(match.group(1), min(line, 2 ** 31), min(col, 2 ** 31))

    def check_offsets(self, program: LowProgram) -> None:
        """Planned offsets: aligned, within the limit, and no two buffers live at once share bytes."""
        life = lives(program)
        events = sorted(life.items(), key=lambda item: (item[1][0], item[0].name))
        for buffer, _ in events:
            if buffer.offset is not None and (buffer.offset % 64 or buffer.offset + buffer.size
                                              > limits.MAX_CONSTANT_BYTES * 4):
                raise LirError(f"%{buffer.name} has an offset that is not aligned or beyond the limit",
                               self.at(1, 1))
        active: list[Buffer] = []
        for buffer, (start, end) in events:
            active = [b for b in active if life[b][1] >= start]
            for other in active:
                assert other.offset is not None and buffer.offset is not None
                if other.offset < buffer.offset + buffer.size and buffer.offset < other.offset + other.size:
                    raise LirError(f"%{buffer.name} and %{other.name} are live at once and share bytes "
                                   "of the arena", self.at(1, 1))
            active.append(buffer)


def _tokens(tree: Any) -> list[Any]:
    """The tokens under a parse tree, in order (iteratively)."""
    found: list[Any] = []
    stack = [tree]
    while stack:
        item = stack.pop()
        if isinstance(item, Token):
            found.append(item)
        elif isinstance(item, tuple):
            stack.extend(reversed(item))
        elif hasattr(item, "children"):
            stack.extend(reversed(item.children))
    return found


def _map_struct(item: Any, leaf: Any) -> Any:
    if item is None:
        return None
    if not isinstance(item, tuple):
        return leaf(item)
    return tuple(_map_struct(i, leaf) for i in item)  # at most MAX_NESTING deep (checked)


__all__ = ["LirError", "MAX_DIMS", "load_lir_file", "load_lir_text", "primitive_named"]

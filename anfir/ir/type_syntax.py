"""Type syntax: reading and checking the written types (``f64``, ``f32[B, *]``, ``(f64, i64)``).

Types are written in three places: ANF annotations (read by the LALR grammar
``anf.lark``), the annotations kept in ``.ir`` dumps (read by ``ir.lark``),
and plain type text given on its own (``anfir compile --args 'f64[B, 3]'``,
``compile_program(args=["f64[N]"])``).  The two grammars have to parse types
themselves, because a type sits inside a larger text they parse.  Everything
else is defined once, here:

* which names are types: every row of :mod:`anfir.dtypes` for a scalar
  (``str`` included), only the element types for a tensor;
* how a type is built from its parts, and the errors (with hints) for a name
  that is not a type (:func:`scalar_type`, :func:`tensor_type`,
  :func:`tuple_type`);
* what a dimension is: a size, a dimension variable or ``*`` (:func:`dimension`);
* type text on its own (:func:`parse_type_text`), read by the same rules as
  the ANF grammar's ``type``: ``(T)`` is ``T``, ``(T,)`` a 1-tuple, a trailing
  comma ends a tuple, ``DTYPE[]`` is 0-d.

The ``.ir`` dump's abstract values (``<Float64>``, ``<f64[2*B, H]>``) are a
second surface syntax, with dimension *expressions*; they are the loader's.
``str()`` of an annotation (:mod:`anfir.ir.annotations`) writes the syntax
read here.
"""

from __future__ import annotations

from typing import Iterable, Optional

from anfir import limits
from anfir.dtypes import ELEMENT_TYPES, TYPE_NAMES, is_dtype
from anfir.errors import AnfirSyntaxError
from anfir.ir.annotations import DimAnn, ScalarAnn, TensorAnn, TupleAnn, TypeAnn
from anfir.location import Location

TYPES_HINT = "types: " + " ".join(TYPE_NAMES) + ", DTYPE[DIMS] and (T1, T2)"
"""The hint of an unknown type name."""

ELEMENT_TYPES_HINT = "element types: " + " ".join(ELEMENT_TYPES)
"""The hint of an unknown tensor element type."""

_TYPE_NAMES = frozenset(TYPE_NAMES)


# -- building types from their parts (every surface syntax) ----------------------------
def scalar_type(name: str, loc: Optional[Location] = None, *,
                error_loc: Optional[Location] = None) -> ScalarAnn:
    """The scalar type ``name`` (``f64``, ``str``...) located at ``loc``.

    An unknown name is an :class:`AnfirSyntaxError` at ``error_loc`` (default
    ``loc``: a loader may report where the name is without keeping it).
    """
    if name not in _TYPE_NAMES:
        raise AnfirSyntaxError(f"unknown type '{name}'", error_loc or loc, hint=TYPES_HINT)
    return ScalarAnn(name, loc)


def tensor_type(name: str, dims: Iterable[DimAnn], loc: Optional[Location] = None, *,
                error_loc: Optional[Location] = None) -> TensorAnn:
    """The tensor type ``name[dims]`` located at ``loc`` (``str`` is no element type)."""
    if not is_dtype(name):
        raise AnfirSyntaxError(f"unknown tensor element type '{name}'", error_loc or loc,
                               hint=ELEMENT_TYPES_HINT)
    return TensorAnn(name, tuple(dims), loc)


def tuple_type(items: Iterable[TypeAnn], loc: Optional[Location] = None) -> TupleAnn:
    """The tuple type of ``items`` located at ``loc`` (its ``(``)."""
    return TupleAnn(tuple(items), loc)


def dimension(text: str, loc: Optional[Location] = None) -> DimAnn:
    """A dimension as written: digits are a size, anything else (a dimension
    variable, ``*``) is kept as its text.  The caller's lexer decides what may
    be written.  A size above ``anfir.limits.MAX_DIMENSION`` is a syntax error at ``loc``."""
    if not text.isdigit():
        return text
    if len(text) > 19 and len(text.lstrip("0")) > 19 or int(text) > limits.MAX_DIMENSION:
        raise AnfirSyntaxError(f"a dimension is at most {limits.MAX_DIMENSION:,}, not "
                               f"{text if len(text) <= 30 else text[:20] + '...'}", loc)
    return int(text)


def is_dimension_text(text: str) -> bool:
    """Whether ``text`` may be a dimension: digits, an identifier or ``*``."""
    return text.isdigit() or text == "*" or text.isidentifier()


# -- type text on its own --------------------------------------------------------------
def parse_type_text(text: str) -> TypeAnn:
    """Parse ``f64``, ``f64[B, 3]``, ``f32[*]``, ``(f64, i64)`` into an annotation object.

    Errors are :class:`AnfirSyntaxError` ``bad type '...': why`` (no location:
    the text comes from an argument, not a file).  Tuples nest to any depth:
    open ones are kept on an explicit stack.
    """
    tokens = _tokens(text)
    count = len(tokens)
    pos = 0

    def error(why: str) -> AnfirSyntaxError:
        shown = text if len(text) <= 60 else text[:50] + "..."
        return AnfirSyntaxError(f"bad type {shown!r}: {why if len(why) <= 80 else why[:70] + '...'}")

    # Per open ``(``: its items so far and whether a comma was read in it
    # (``(T)`` is T, ``(T,)`` is a tuple).
    stack: list[tuple[list[TypeAnn], list[bool]]] = []
    while True:
        # A type starts at ``pos``.
        if pos >= count:
            raise error("unexpected end")
        token = tokens[pos]
        pos += 1
        if token == "(":
            if pos < count and tokens[pos] == ")":
                pos += 1
                item: TypeAnn = tuple_type(())
            else:
                stack.append(([], [False]))
                continue
        elif token in _TYPE_NAMES:
            if pos < count and tokens[pos] == "[":
                pos += 1
                dims: list[DimAnn] = []
                if pos < count and tokens[pos] == "]":
                    pos += 1
                else:
                    while True:
                        if pos >= count:
                            raise error("missing ]")
                        dim = tokens[pos]
                        if not is_dimension_text(dim):
                            raise error(f"bad dimension {dim!r}")
                        dims.append(dimension(dim))
                        pos += 1
                        if pos >= count:
                            raise error("missing ]")
                        if tokens[pos] == "]":
                            pos += 1
                            break
                        if tokens[pos] != ",":
                            raise error("expected , or ]")
                        pos += 1
                try:
                    item = tensor_type(token, dims)
                except AnfirSyntaxError as exc:
                    raise error(exc.message) from None
            else:
                item = scalar_type(token)
        else:
            raise error(f"unexpected {token!r}")
        # ``item`` is complete: put it in the innermost open tuple, closing
        # every tuple that ends right after it.
        while stack:
            items, comma = stack[-1]
            items.append(item)
            if pos < count and tokens[pos] == ",":
                pos += 1
                comma[0] = True
                if pos < count and tokens[pos] == ")":  # ``(T1, T2,)``
                    pos += 1
                    stack.pop()
                    item = tuple_type(items)
                    continue
                break  # the next item follows
            if pos < count and tokens[pos] == ")":
                pos += 1
                stack.pop()
                item = tuple_type(items) if comma[0] else items[0]
                continue
            raise error("expected , or )")
        else:
            break
    if pos != count:
        raise error(f"unexpected {tokens[pos]!r}")
    return item


def _tokens(text: str) -> list[str]:
    """Names/numbers (runs of letters, digits and ``_``) and ``( ) [ ] , *``; blanks skipped."""
    tokens: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c.isspace():
            i += 1
        elif c in "()[],*":
            tokens.append(c)
            i += 1
        elif c.isalnum() or c == "_":
            j = i
            while j < len(text) and (text[j].isalnum() or text[j] == "_"):
                j += 1
            tokens.append(text[i:j])
            i = j
        else:
            raise AnfirSyntaxError(f"bad type {text!r}: unexpected {c!r}")
    return tokens


__all__ = ["ELEMENT_TYPES_HINT", "TYPES_HINT", "dimension", "is_dimension_text", "parse_type_text",
           "scalar_type", "tensor_type", "tuple_type"]

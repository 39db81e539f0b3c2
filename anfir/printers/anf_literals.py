"""Constants as ANF source text (the literal syntax of the language).

Every constant prints as an expression that evaluates to the same value.  Most
print as literals that parse back to the *same* constant node; a few have no
literal and are normalised to calls, so the re-parsed graph has a CNode where a
constant was (the value is still equal):

* tuples print as ``(a, b)`` (the parser makes a ``make_tuple`` call of them);
* tensors print as ``array(((1.0, 2.0), (3.0, 4.0)))``, wrapped in
  ``cast(..., "f32")`` for dtypes other than f64/i64/bool, and empty tensors as
  ``zeros(shape, "dtype")``;
* NaN prints as ``div(0.0, 0.0)``; infinities print as ``1e999`` / ``-1e999``
  (float literals that overflow to inf, so they stay constants);
* complex numbers print as ``complex(re, im)``.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from anfir.errors import UsageError
from anfir.nested import nested_text, tuple_items
from anfir.ir.graph import FuncGraph
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.printers.ir_constants import ConstantPrinter
from anfir.dtypes import LITERAL_DTYPES, dtype_name, dtype_of_array, numpy_name
from anfir.runtime_values import DType, Symbol
from anfir.limits import int_text

HELPER_NAMES = ("array", "cast", "zeros", "div", "complex")
"""Built-ins the printer itself may emit (so no local name may shadow them)."""

_NATIVE_ARRAY_DTYPES = {numpy_name(name) for name in LITERAL_DTYPES.values()}
"""The numpy dtypes ``array(...)`` of literals makes (no ``cast`` needed)."""


def float_literal(value: float) -> str:
    """A float as ANF text that reads back bit-exactly (``repr``; inf as ``1e999``)."""
    if math.isnan(value):
        return "div(0.0, 0.0)"
    if math.isinf(value):
        return "1e999" if value > 0 else "-1e999"
    text = repr(value)
    # ``1e+16`` -> ``1e16``: the exponent sign is only needed when negative.
    return text.replace("e+", "e")


def string_literal(value: str) -> str:
    """A string literal with the language's escapes (``\\"``, ``\\\\``, ``\\n``)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def helpers_needed(value: Any) -> set[str]:
    """The built-in names :func:`anf_literal` uses to print ``value``."""
    needed: set[str] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, tuple):
            stack.extend(v)
        elif isinstance(v, np.ndarray):
            needed.update(("array", "cast", "zeros", "div", "complex"))
        elif isinstance(v, np.generic) and not isinstance(v, (np.float64, np.int64, np.bool_)):
            needed.add("cast")
        elif isinstance(v, float) and math.isnan(v):
            needed.add("div")
        elif isinstance(v, complex):
            needed.update(("complex", "div"))
    return needed


def anf_literal(value: Any, graph_name: Callable[[FuncGraph], str], strict: bool = True) -> str:
    """``value`` as an ANF expression; ``graph_name`` spells graph constants.

    A constant with no ANF spelling (a gradient-environment key, a closure...)
    raises :class:`UsageError`, or with ``strict=False`` is shown in the ``.ir``
    dump's syntax (readable, but the text then does not parse).
    """
    if not strict:
        try:
            return anf_literal(value, graph_name)
        except UsageError:
            return ConstantPrinter(graph_name).text(value)
    return nested_text(value, tuple_items, lambda atom: _atom_literal(atom, graph_name))


def _atom_literal(value: Any, graph_name: Callable[[FuncGraph], str]) -> str:
    if isinstance(value, np.ndarray):
        return array_literal(value)
    if isinstance(value, np.generic):
        return _numpy_scalar_literal(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return int_text(value)
    if isinstance(value, float):
        return float_literal(value)
    if isinstance(value, complex):
        return f"complex({float_literal(value.real)}, {float_literal(value.imag)})"
    if isinstance(value, str):
        return string_literal(value)
    if value is None:
        return "None"
    if isinstance(value, FuncGraph):
        return graph_name(value)
    if isinstance(value, (Primitive, MetaFunction)):
        return value.name
    if isinstance(value, Symbol):
        return value.name
    if isinstance(value, DType):
        return string_literal(value.name)
    raise UsageError(f"to_text cannot express the constant {value!r} as ANF text; "
                     "use dump_ir for graphs made by transformations")


def _numpy_scalar_literal(value: np.generic) -> str:
    py = value.item()
    text = anf_literal(py, _no_graphs)
    if isinstance(value, (np.float64, np.int64, np.bool_)):
        return text
    dtype = dtype_name(value.dtype)
    if dtype is None:
        raise UsageError(f"to_text cannot express a numpy {value.dtype.name} constant")
    return f'cast({text}, "{dtype}")'


def array_literal(array: np.ndarray) -> str:
    """A tensor as ``array(nested tuple)`` (with a cast when the dtype needs one)."""
    dtype = dtype_of_array(array)
    if array.size == 0:
        return f"zeros({anf_literal(tuple(int(d) for d in array.shape), _no_graphs)}, \"{dtype}\")"
    nested = _as_tuples(array)
    body = f"array({anf_literal(nested, _no_graphs)})"
    if array.dtype.name in _NATIVE_ARRAY_DTYPES:
        return body
    return f'cast({body}, "{dtype}")'


def _as_tuples(array: np.ndarray) -> Any:
    """Nested tuples of Python scalars (iteratively, one axis at a time)."""
    if array.ndim == 0:
        return array.item()
    flat: list[Any] = array.reshape(-1).tolist()
    # Group the flat list from the innermost axis outwards.
    for size in reversed(array.shape[1:]):
        flat = [tuple(flat[i:i + size]) for i in range(0, len(flat), size)]
    return tuple(flat)


def _no_graphs(graph: FuncGraph) -> str:  # pragma: no cover - arrays never hold graphs
    raise UsageError("a graph inside a tensor constant")

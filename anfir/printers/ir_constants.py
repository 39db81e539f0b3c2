"""Constants as ``.ir`` dump text (read back by ``anfir/grammar/ir.lark``).

Every constant prints in full and exactly:

=========================  ==============================================
``1``, ``-2``, ``1.5``      Python int / float (``repr``; ``inf``, ``nan``)
``true``, ``None``, ``"s"``  bool, None, str (JSON string escapes)
``(1, 2)``, ``(1,)``         tuples
``Tensor[f64, (2, 2)]([[1.0, 2.0], [3.0, 4.0]])``  numpy arrays
``Tensor[f64, (100, 100)](npz["t0"])``  an array kept in the side file
``Scalar[f32](1.5)``         numpy scalars
``@g``, ``add``, ``grad``    graphs, primitives, meta functions
``Symbol(f)``, ``Key(x)``    unresolved names, gradient-environment keys
``DType(f32)``               element types
``Partial(f, 1)``, ``Closure(@g, (1,))``, ``GradEnv(Key(a): 1.0)``
=========================  ==============================================

Float elements of f32/f16 tensors use the shortest text that reads back to
the same value of that dtype.  Nesting is formatted with explicit stacks.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Callable, Optional

import numpy as np

from anfir.ir.graph import FuncGraph
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.dtypes import complex_text, dtype_of_array, numpy_kind
from anfir.runtime_values import Closure, DType, GradEnv, Partial, Symbol, SymbolicKey
from anfir.limits import int_text

INLINE_TENSOR_LIMIT = 64
"""Tensors with more elements go to the side file when one is provided."""

_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def string_text(value: str) -> str:
    """A JSON string literal (UTF-8 kept readable; control characters escaped)."""
    return json.dumps(value, ensure_ascii=False)


def name_text(value: str) -> str:
    """A bare word when ``value`` is one, else a string literal (for Symbol/Key names)."""
    return value if _WORD.match(value) else string_text(value)


def float_text(value: float) -> str:
    """``repr`` of a float: exact, with ``inf``/``-inf``/``nan`` spelled plainly."""
    if math.isnan(value):
        return "nan"
    return repr(float(value))


class ConstantPrinter:
    """Formats constants; large tensors go to ``side`` (when given) under fresh keys."""

    def __init__(self, graph_name: Callable[[FuncGraph], str],
                 side: Optional[dict[str, np.ndarray]] = None) -> None:
        self.graph_name = graph_name
        self.side = side
        self._side_keys: dict[int, str] = {}
        self._side_arrays: list[np.ndarray] = []  # keeps ids stable while printing

    def text(self, value: Any) -> str:
        """``value`` as dump text."""
        value_type = type(value)
        if value_type is int:
            return int_text(value)
        if value_type is float:
            return float_text(value)
        out: list[str] = []
        stack: list[tuple[str, Any]] = [("value", value)]
        while stack:
            kind, item = stack.pop()
            if kind == "text":
                out.append(item)
                continue
            pieces = self._pieces(item)
            if isinstance(pieces, str):
                out.append(pieces)
            else:
                stack.extend(reversed(pieces))
        return "".join(out)

    def _pieces(self, value: Any) -> Any:
        """Text for atoms, or a list of ("text"/"value", ...) pieces for containers."""
        if isinstance(value, tuple):
            if not value:
                return "()"
            return _joined("(", list(value), ",)" if len(value) == 1 else ")")
        if isinstance(value, np.ndarray):
            return self._tensor(value)
        if isinstance(value, np.generic):
            return f"Scalar[{dtype_of_array(np.asarray(value))}]({element_text(value)})"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, int):
            return int_text(value)
        if isinstance(value, float):
            return float_text(value)
        if isinstance(value, complex):
            return complex_text(value)
        if isinstance(value, str):
            return string_text(value)
        if value is None:
            return "None"
        if isinstance(value, FuncGraph):
            return "@" + self.graph_name(value)
        if isinstance(value, (Primitive, MetaFunction)):
            return value.name
        if isinstance(value, Symbol):
            return f"Symbol({name_text(value.name)})"
        if isinstance(value, SymbolicKey):
            return f"Key({name_text(value.name)})"
        if isinstance(value, DType):
            return f"DType({value.name})"
        if isinstance(value, Partial):
            return _joined("Partial(", [value.fn, *value.args], ")")
        if isinstance(value, Closure):
            return [("text", "Closure("), ("value", value.graph), ("text", ", "),
                    ("value", tuple(value.env)), ("text", ")")]
        if isinstance(value, GradEnv):
            pieces: list[tuple[str, Any]] = [("text", "GradEnv(")]
            for i, (key, grad) in enumerate(value.items()):
                if i:
                    pieces.append(("text", ", "))
                pieces.append(("value", key))
                pieces.append(("text", ": "))
                pieces.append(("value", grad))
            pieces.append(("text", ")"))
            return pieces
        raise TypeError(f"dump_ir cannot print the constant {value!r} ({type(value).__name__})")

    def _tensor(self, array: np.ndarray) -> str:
        dtype = dtype_of_array(array)
        shape = "(" + ", ".join(str(d) for d in array.shape) + ("," if array.ndim == 1 else "") + ")"
        head = f"Tensor[{dtype}, {shape}]"
        if self.side is not None and array.size > INLINE_TENSOR_LIMIT:
            key = self._side_keys.get(id(array))
            if key is None:
                index = len(self.side)
                while f"t{index}" in self.side:
                    index += 1
                key = f"t{index}"
                self.side[key] = array
                self._side_keys[id(array)] = key
                self._side_arrays.append(array)
            return f'{head}(npz["{key}"])'
        return f"{head}({tensor_data_text(array)})"


def _joined(open_: str, items: list, close: str) -> list[tuple[str, Any]]:
    pieces: list[tuple[str, Any]] = [("text", open_)]
    for i, item in enumerate(items):
        if i:
            pieces.append(("text", ", "))
        pieces.append(("value", item))
    pieces.append(("text", close))
    return pieces


def element_text(value: Any) -> str:
    """One tensor element (a numpy scalar) as exact text."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (np.integer, int)):
        return str(int(value))
    if isinstance(value, np.generic) and numpy_kind(value.dtype) in ("int", "uint"):
        return str(int(value))  # ml_dtypes' int4/int2 scalars are not np.integer
    if isinstance(value, (complex, np.complexfloating)):
        return complex_text(complex(value))
    if isinstance(value, np.floating) and value.dtype != np.float64:
        if np.isnan(value):
            return "nan"
        # The shortest text identifying the value in its own dtype, if reading
        # it as a Python float and converting (what the loader does) is exact.
        short = str(value)
        if value.dtype.type(float(short)) == value and any(c in short for c in ".ei"):
            return short
        return float_text(float(value))
    return float_text(float(value))


def tensor_data_text(array: np.ndarray) -> str:
    """Nested ``[...]`` lists of the elements (``1.0`` for a 0-d tensor)."""
    if array.ndim == 0:
        return element_text(array[()])
    if array.size == 0:
        # The first empty axis is "[]"; the axes before it repeat it.
        first_empty = array.shape.index(0)
        text = "[]"
        for size in reversed(array.shape[:first_empty]):
            text = "[" + ", ".join([text] * size) + "]"
        return text
    items = [element_text(v) for v in array.reshape(-1)]
    # Group from the innermost axis outwards (no recursion on rank).
    for size in reversed(array.shape):
        items = ["[" + ", ".join(items[i:i + size]) + "]" for i in range(0, len(items), size)]
    return items[0]

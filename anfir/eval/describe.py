"""Short descriptions of runtime values for error messages (``Int64 3``, ``f64[2, 3] tensor``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from anfir.ir.graph import FuncGraph
from anfir.runtime_values import Closure, Partial, Symbol

_SHOWN = 40
"""Longest value text quoted in a message (longer ones are cut)."""


def describe(value: Any) -> str:
    """A type name and, for scalars and strings, the value: ``Int64 3``, ``String "a"``."""
    if isinstance(value, bool):
        return f"Bool {'true' if value else 'false'}"
    if isinstance(value, int):
        return f"Int64 {_cut(str(value))}"
    if isinstance(value, float):
        return f"Float64 {_cut(repr(value))}"
    if isinstance(value, str):
        return f"String {_cut(repr(value))}"
    if value is None:
        return "None"
    if isinstance(value, tuple):
        return f"Tuple of {len(value)}"
    if isinstance(value, np.ndarray):
        dims = ", ".join(str(d) for d in value.shape)
        return f"{value.dtype.name} tensor [{dims}]"
    if isinstance(value, np.generic):
        return f"{value.dtype.name} {_cut(str(value))}"
    if isinstance(value, FuncGraph):
        return f"function @{value.name}"
    if isinstance(value, Closure):
        return f"closure @{value.graph.name}"
    if isinstance(value, Partial):
        return f"partial of {describe(value.fn)}"
    if isinstance(value, Symbol):
        return (f"the unresolved name {value.name!r}: this graph is from before the resolve "
                "phase; compile it, or run a later dump")
    return type(value).__name__


def _cut(text: str) -> str:
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."

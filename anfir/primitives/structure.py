"""Tuples, function values and control: make_tuple, switch, partial, zeros_like..."""

from __future__ import annotations

from typing import Any

import numpy as np

from anfir.errors import AnfirRuntimeError, AnfirTypeError
from anfir.primitives.registry import declare
from anfir.abstract import rules
from anfir.runtime_values import Closure, GradEnv, Partial

FAMILY = "tuple"


def _make_tuple(*items: Any) -> tuple[Any, ...]:
    return items


def _tuple_getitem(t: Any, i: Any) -> Any:
    if not isinstance(t, tuple):
        raise AnfirTypeError(f"indexing needs a tuple, not {type(t).__name__}")
    if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
        raise AnfirTypeError(f"a tuple index is an integer, not {i!r}")
    if not -len(t) <= i < len(t):
        raise AnfirRuntimeError(f"tuple index {i} out of range for a tuple of {len(t)}")
    return t[i]


def _len(t: Any) -> int:
    if not isinstance(t, tuple):
        raise AnfirTypeError(f"len needs a tuple, not {type(t).__name__}")
    return len(t)


def _switch(c: Any, a: Any, b: Any) -> Any:
    if not isinstance(c, (bool, np.bool_)):
        raise AnfirTypeError(f"a condition must be a bool, not {type(c).__name__} {c!r}")
    return a if c else b


def _partial(fn: Any, *args: Any) -> Partial:
    return Partial(fn, args)


def zeros_like_value(x: Any) -> Any:
    """The zero gradient for a value: 0 of scalars, zero arrays, tuples of zeros,
    an empty GradEnv for functions (partial applications included), None for None
    and strings."""
    if isinstance(x, bool):
        return False
    if isinstance(x, (int, float)):
        return type(x)(0)
    if isinstance(x, np.ndarray):
        return np.zeros_like(x)
    if isinstance(x, np.generic):
        return x.dtype.type(0)
    if isinstance(x, tuple):
        return tuple(zeros_like_value(v) for v in x)
    if x is None or isinstance(x, str):
        return None
    return GradEnv()  # a function value: its gradient is an (empty) environment


make_tuple = declare("make_tuple", (0, None), _make_tuple, infer=rules.make_tuple_rule, family=FAMILY,
                     accepts_any=True, structural_gradient=True,
                     doc="make_tuple(a, b, ...) — the tuple (a, b, ...)")
tuple_getitem = declare("tuple_getitem", 2, _tuple_getitem, infer=rules.tuple_getitem_rule, family=FAMILY,
                        doc="tuple_getitem(t, i) — element i of t (t[i]); negative i counts from the end",
    bprop="lambda (t, i, out, dout) (tuple_setitem(zeros_like(t), i, dout), zeros_like(i)) end")
len_ = declare("len", 1, _len, infer=rules.len_rule, family=FAMILY, differentiable=False,
               doc="len(t) — the number of elements of a tuple")

CONTROL = "control"
switch = declare("switch", 3, _switch, infer=rules.switch_rule, family=CONTROL, accepts_any=True,
                 doc="switch(c, a, b) — a if c else b (selects only; `if` calls the result)",
    bprop="lambda (c, a, b, out, dout) (zeros_like(c), switch(c, dout, zeros_like(a)), switch(c, zeros_like(b), dout)) end")
partial = declare("partial", (1, None), _partial, infer=rules.partial_rule, family=CONTROL, accepts_any=True,
                  doc="partial(f, a, ...) — f with its first arguments fixed")
identity = declare("identity", 1, lambda x: x, infer=rules.identity_rule, family=CONTROL, accepts_any=True, doc="identity(x) — x",
    bprop="lambda (x, out, dout) (dout,) end")
stop_gradient = declare("stop_gradient", 1, lambda x: x, infer=rules.identity_rule, family=CONTROL, accepts_any=True, differentiable=False,
                        doc="stop_gradient(x) — x, through which no gradient flows")
zeros_like = declare("zeros_like", 1, zeros_like_value, infer=rules.zeros_like_rule, family="tensor", differentiable=False,
                     doc="zeros_like(x) — zeros of x's shape and type (tuples elementwise)")

__all__ = ["Closure", "zeros_like_value"]

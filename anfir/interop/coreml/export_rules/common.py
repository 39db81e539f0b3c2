"""What the MIL export rules of several families share: the rule type, the factories of the
common rules (:func:`unary`, :func:`binary`, :func:`compare`, :func:`logical`,
:func:`composite`) and the helpers the rules build MIL values with.  Rules use only the
writer's helpers (:class:`~anfir.interop.coreml.exporter.MilWriter`), imported here for types only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from anfir.dtypes import is_float
from anfir.flat.statements import Const, Op, Operand, Value, known_rank_shape, static_dims
from anfir.interop.coreml.mil_types import NUMPY_OF_MIL, mil_dtype
from anfir.interop.export_common import boolean, common_dtype, operands_rule, result_dtype

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.coreml.exporter import MilWriter


MilRule = Callable[["MilWriter", Op], None]
"""``rule(writer, op)``: compute ``op.results`` (see :class:`MilWriter`)."""


def unary(kind: str, **attrs: Any) -> MilRule:
    """``out = kind(x=x)`` in the result's dtype."""
    return operands_rule(result_dtype, lambda w, op, xs: w.bind(
        op.results[0], w.op(kind, op.results[0], x=xs[0], **attrs)), f"MIL {kind}", 1)


def _xy(kind: str) -> Callable[["MilWriter", Op, list[Any]], None]:
    """Writes ``out = kind(x=, y=)`` (``x=`` alone for one operand) of converted operands."""
    def write(w: MilWriter, op: Op, xs: list[Any]) -> None:
        out = op.results[0]
        w.bind(out, w.op(kind, out, **dict(zip(("x", "y"), xs))))
    return write


def binary(kind: str) -> MilRule:
    """``out = kind(x=x, y=y)``, both in the result's dtype."""
    return operands_rule(result_dtype, _xy(kind), f"MIL {kind}", 2)


def compare(kind: str) -> MilRule:
    """``out = kind(x=x, y=y)`` on the operands' common dtype."""
    return operands_rule(common_dtype, _xy(kind), f"MIL {kind}", 2)


def logical(kind: str) -> MilRule:
    """``out = kind(...)`` on booleans."""
    return operands_rule(boolean, _xy(kind), f"MIL {kind}", 2)


def composite(build: Callable[["MilWriter", Any, str], Any], doc: str) -> MilRule:
    """A rule computing ``build(writer, x, dtype)`` (x in the result's dtype)."""
    def rule(w: MilWriter, op: Op) -> None:
        out = op.results[0]
        d = w.dtype(out)
        w.bind(out, build(w, w.tensor(op.args[0], d), d))
    rule.__doc__ = doc
    return rule


def _reduce(kind: str) -> MilRule:
    """A MIL reduction over the axis attribute (None: every axis), keep_dims as asked."""
    def rule(w: MilWriter, op: Op) -> None:
        out = op.results[0]
        x = w.tensor(op.args[0], w.dtype(out))
        w.bind(out, w.reduce(kind, x, op.attrs.get("axis"), bool(op.attrs.get("keepdims")), out))
    rule.__doc__ = f"MIL {kind} over the axis attribute"
    return rule


def _broadcast(w: MilWriter, x: Any, shape: Any, d: str, out: Optional[Value] = None) -> Any:
    """``x`` broadcast to ``shape`` (a 1-D int32 var): ``x + zeros(shape)`` (MIL has no
    expand; booleans through ``logical_or`` with false)."""
    if d == "bool":
        return w.op("logical_or", out, x=x, y=w.op("fill", shape=shape, value=False))
    zeros = w.op("fill", shape=shape, value=NUMPY_OF_MIL[mil_dtype(d)](0))
    return w.op("add", out, x=x, y=zeros)


def _filled_like(fill: int) -> MilRule:
    """``fill`` with the shape of the argument (MIL fill of its shape)."""
    def rule(w: MilWriter, op: Op) -> None:
        out = op.results[0]
        d = mil_dtype(w.dtype(out), w.loc)
        shape = w.shape_of(w.tensor(op.args[0]))
        w.bind(out, w.op("fill", out, shape=shape, value=NUMPY_OF_MIL[d](fill)))
    rule.__doc__ = f"fill(shape(x), {fill})"
    return rule


def _cast(w: MilWriter, op: Op) -> None:
    """MIL cast to the result's dtype."""
    out = op.results[0]
    w.bind(out, w.tensor(op.args[0], w.dtype(out)))


def _i32(values: Sequence[int]) -> np.ndarray:
    return np.array([int(v) for v in values], dtype=np.int32)


def _shape(w: MilWriter, operand: Operand, what: str) -> tuple[Any, ...]:
    return tuple(known_rank_shape(w.type_of(operand), what, w.loc))


def _static(w: MilWriter, operand: Operand, what: str) -> tuple[int, ...]:
    return static_dims(_shape(w, operand, what), what, "Core ML", w.loc)


def _is_none(operand: Operand) -> bool:
    return isinstance(operand, Const) and operand.value is None


def _scalar(value: Any, d: str) -> Any:
    """A numpy scalar of the MIL dtype carrying anfir's ``d`` (fill values)."""
    if d == "bool":
        return np.bool_(value)
    if is_float(d):
        return np.float16(value) if d == "f16" else np.float32(value)
    return np.int32(value)


def _fill(w: MilWriter, shape: Any, value: Any, d: str) -> Any:
    return w.op("fill", shape=shape, value=_scalar(value, d))


def _broadcast_plain(w: MilWriter, x: Any, shape: Any, d: str) -> Any:
    """``x`` broadcast to ``shape`` (MIL has no expand: plus zeros, or or-ed with false)."""
    if d == "bool":
        return w.op("logical_or", x=x, y=_fill(w, shape, False, d))
    return w.op("add", x=x, y=_fill(w, shape, 0, d))


def _shape_var(w: MilWriter, x: Any, items: Sequence[Any]) -> Any:
    """A 1-D int32 shape: each item an int, or ``("dim", i)`` for x's dimension i."""
    static = [x.shape[i[1]] if isinstance(i, tuple) else i for i in items]
    if all(isinstance(s, (int, np.integer)) for s in static):
        return _i32(static)
    shape = w.op("shape", x=x)
    pieces = [w.op("gather", x=shape, indices=_i32([i[1]]), axis=0) if isinstance(i, tuple)
              else w.const(np.array([i]), "i32") for i in items]
    return w.op("concat", values=pieces, axis=0)


def _bind_identity(w: MilWriter, out: Any, var: Any) -> None:
    w.bind(out, w.op("identity", out, x=var))


def _expand_dims(w: MilWriter, x: Any, axes: Sequence[int]) -> Any:
    return w.op("expand_dims", x=x, axes=_i32(axes)) if axes else x


def _slice(w: MilWriter, x: Any, begin: Sequence[int], end: Sequence[Optional[int]],
           stride: Optional[Sequence[int]] = None) -> Any:
    """``x[begin:end:stride]`` on every axis (non-negative bounds; an end of None: to the
    axis's end, which may be symbolic)."""
    inputs: dict[str, Any] = {}
    if any(e is None for e in end):
        inputs["end_mask"] = [e is None for e in end]
    return w.op("slice_by_index", x=x, begin=_i32(begin), end=_i32([e or 0 for e in end]),
                stride=_i32(stride if stride is not None else [1] * len(begin)), **inputs)


def _broadcast_rule(value: int, shape: int) -> MilRule:
    """Operand ``value`` broadcast to the shape operand ``shape`` (expand, full)."""
    def rule(w: MilWriter, op: Op) -> None:
        out = op.results[0]
        d = w.dtype(out)
        _bind_identity(w, out, _broadcast_plain(w, w.tensor(op.args[value], d),
                                          w.shape_tensor(op.args[shape]), d))
    rule.__doc__ = "x broadcast to the shape"
    return rule

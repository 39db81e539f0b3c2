"""The ONNX export rules of the gradient helpers of :mod:`anfir.primitives.gradient` (gadd, sum_to,
broadcast_like,
size, cast_like, tangent_dot).

See :mod:`anfir.interop.onnx.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anfir.dtypes import is_bool, is_integer
from anfir.flat.statements import Op, shape_of_type
from anfir.interop.export_common import broadcast_like_needed, sum_to_plan
from anfir.interop.onnx.export_rules.common import OnnxRule, binary, cast_rule
from anfir.ir.primitive import Primitive
from anfir.primitives import gradient

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.onnx.exporter import OnnxWriter


def _cast_like(w: OnnxWriter, op: Op) -> None:
    """``Cast`` to the dtype of the second argument (as :func:`cast_rule`); to an
    integer or boolean, zeros of ``g``'s shape (an integer's sensitivity is a zero)."""
    out = op.results[0]
    d = w.dtype(out)
    if is_integer(d) or is_bool(d):
        w.node("ConstantOfShape", [w.op("Shape", w.tensor(op.args[0]))], [out.name],
               value=w.fill_value(0, d))
        return
    cast_rule(w, op)


def _size(w: OnnxWriter, op: Op) -> None:
    """``Size``."""
    out = op.results[0]
    w.node("Size", [w.tensor(op.args[0])], [out.name])


def _sum_to(w: OnnxWriter, op: Op) -> None:
    """``sum_to(g, x)``: ``g`` summed over the broadcast axes (kept), reshaped to ``x``'s shape."""
    out = op.results[0]
    g = w.tensor(op.args[0], w.dtype(out))
    axes = sum_to_plan(w, op)
    if axes is None:
        w.node("Identity", [g], [out.name])
        return
    if axes:
        g = w.op("ReduceSum", g, w.ints(axes), keepdims=1)
    w.node("Reshape", [g, w.op("Shape", w.tensor(op.args[1]))], [out.name])


def _broadcast_like(w: OnnxWriter, op: Op) -> None:
    """``broadcast_like(g, x)``: ``Expand(g, Shape(x))``."""
    out = op.results[0]
    g = w.tensor(op.args[0], w.dtype(out))
    if broadcast_like_needed(w, op):
        w.node("Expand", [g, w.op("Shape", w.tensor(op.args[1]))], [out.name])
    else:
        w.node("Identity", [g], [out.name])


def _tangent_dot(w: OnnxWriter, op: Op) -> None:
    """``sum(a * b)``."""
    out = op.results[0]
    d = w.dtype(out)
    a, b = op.args
    product = w.temp("product")
    w.node("Mul", [w.tensor(a, d), w.tensor(b, d)], [product])
    if shape_of_type(w.type_of(a)) == () and shape_of_type(w.type_of(b)) == ():
        w.node("Identity", [product], [out.name])
    else:
        w.node("ReduceSum", [product], [out.name], keepdims=0)


RULES: dict[Primitive, OnnxRule] = {
    gradient.gadd: binary("Add"),
    gradient.sum_to: _sum_to,
    gradient.broadcast_like: _broadcast_like,
    gradient.size: _size,
    gradient.cast_like: _cast_like,
    gradient.tangent_dot: _tangent_dot,
}
"""This family's primitive object → the rule writing its ONNX nodes (merged into
:data:`anfir.interop.onnx.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported, with the reason."""

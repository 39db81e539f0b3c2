"""What the ONNX export rules of several families share: the rule type, the factories of
the common one-node rules (:func:`unary`, :func:`binary`, :func:`compare`,
:func:`logical`), a reduction over the ``axis`` attribute, fills, ``Cast`` and small
type helpers.  Rules use only the writer's helpers
(:class:`~anfir.interop.onnx.exporter.OnnxWriter`), which this module imports for types only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from anfir.abstract.values import AbstractValue, AScalar, AString, ATensor
from anfir.errors import ExportError
from anfir.flat.statements import Op, Operand, known_rank_shape, shape_of_type
from anfir.interop.export_common import boolean, common_dtype, operands_rule, result_dtype
from anfir.interop.onnx.onnx_types import FLOAT8, ONNX_TYPES

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.onnx.exporter import OnnxWriter

OnnxRule = Callable[["OnnxWriter", Op], None]
"""``rule(writer, op)``: write the nodes that compute ``op.results`` (see :class:`OnnxWriter`)."""


def unary(op_type: str) -> OnnxRule:
    """``out = op_type(x)``, ``x`` converted to the result's dtype."""
    return operands_rule(result_dtype, lambda w, op, xs: w.node(op_type, xs, [op.results[0].name]),
                         f"ONNX {op_type}", 1)


def binary(op_type: str) -> OnnxRule:
    """``out = op_type(x, y)``, both converted to the result's dtype (numpy's promotion)."""
    return operands_rule(result_dtype, lambda w, op, xs: w.node(op_type, xs, [op.results[0].name]),
                         f"ONNX {op_type}", 2)


def compare(op_type: str, negate: bool = False) -> OnnxRule:
    """``out = op_type(x, y)`` on the two operands' common dtype (``negate``: then ``Not``)."""
    def write(w: OnnxWriter, op: Op, xs: list[str]) -> None:
        out = op.results[0].name
        if negate:
            w.node("Not", [w.op(op_type, *xs[:2])], [out])
        else:
            w.node(op_type, xs[:2], [out])
    return operands_rule(common_dtype, write, f"ONNX {op_type}" + (" then Not" if negate else ""), 2)


def logical(op_type: str) -> OnnxRule:
    """``out = op_type(*args)`` on booleans."""
    return operands_rule(boolean, lambda w, op, xs: w.node(op_type, xs, [op.results[0].name]),
                         f"ONNX {op_type}")


def reduction(op_type: str) -> OnnxRule:
    """A reduction over the ``axis`` attribute (None: every axis), ``keepdims`` as asked."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        x = w.tensor(op.args[0], w.dtype(out))
        w.reduce(op_type, x, op.attrs.get("axis"), bool(op.attrs.get("keepdims")), out.name)
    rule.__doc__ = f"ONNX {op_type} over the axis attribute"
    return rule


def filled_like(fill: int) -> OnnxRule:
    """A tensor of ``fill`` with the shape of the argument."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        d = w.dtype(out)
        shape = w.temp("shape")
        w.node("Shape", [w.tensor(op.args[0])], [shape])
        w.node("ConstantOfShape", [shape], [out.name], value=w.fill_value(fill, d))
    rule.__doc__ = f"ConstantOfShape(Shape(x), {fill})"
    return rule


def cast_rule(w: OnnxWriter, op: Op) -> None:
    """``Cast`` to the constant dtype (``saturate=0`` to a float8 type: anfir's ``cast``,
    ml_dtypes' conversion, gives inf or NaN past the largest finite value, as that does)."""
    out = op.results[0]
    d = w.dtype(out)
    extra = {"saturate": 0} if d in FLOAT8 else {}
    w.node("Cast", [w.tensor(op.args[0])], [out.name], to=ONNX_TYPES[d], **extra)


def rank_of(w: OnnxWriter, operand: Operand, what: str) -> int:
    """The rank of a tensor operand (its dimensions may be symbolic)."""
    shape = shape_of_type(w.type_of(operand))
    if shape is None:
        raise ExportError(f"{what} needs tensors of known rank", w.loc)
    return len(shape)


def known_shape(w: OnnxWriter, operand: Any, what: str) -> tuple[Any, ...]:
    """The shape of an operand of known rank (its dimensions may be symbolic)."""
    return tuple(known_rank_shape(w.type_of(operand), what, w.loc))


def with_dtype(t: AbstractValue, dtype: str) -> AbstractValue:
    """``t``'s shape with element type ``dtype``."""
    if dtype == "str":
        return AString()
    if isinstance(t, ATensor):
        return ATensor(dtype, t.shape)
    return AScalar(dtype)


__all__ = ["OnnxRule", "binary", "cast_rule", "compare", "filled_like", "known_shape", "logical", "rank_of",
           "reduction", "unary", "with_dtype"]

"""The ONNX export rules of the tensor operators of :mod:`anfir.primitives.tensor` (matmul,
transpose, reshape, sum,
mean, broadcast_to, fills, where, array, cast).

See :mod:`anfir.interop.onnx.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from anfir.errors import ExportError
from anfir.flat.statements import Op, operand_leaves, shape_of_type
from anfir.interop.onnx.export_rules.common import OnnxRule, cast_rule, filled_like, reduction
from anfir.ir.primitive import Primitive
from anfir.primitives import tensor

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.onnx.exporter import OnnxWriter


def _matmul(w: OnnxWriter, op: Op) -> None:
    """``MatMul`` on the result's dtype."""
    out = op.results[0]
    d = w.dtype(out)
    w.node("MatMul", [w.tensor(op.args[0], d), w.tensor(op.args[1], d)], [out.name])


def _transpose(w: OnnxWriter, op: Op) -> None:
    """``Transpose`` with the constant permutation (none: axes reversed)."""
    out = op.results[0]
    x = w.tensor(op.args[0], w.dtype(out))
    perm = w.static(op.args[1]) if len(op.args) > 1 else None
    if perm is None:
        w.node("Transpose", [x], [out.name])
    else:
        w.node("Transpose", [x], [out.name], perm=[int(p) for p in perm])


def _reshape(w: OnnxWriter, op: Op) -> None:
    """``Reshape`` with numpy's meaning of 0 (``allowzero=1``)."""
    out = op.results[0]
    x = w.tensor(op.args[0], w.dtype(out))
    w.node("Reshape", [x, w.shape_tensor(op.args[1])], [out.name], allowzero=1)


def _broadcast_to(w: OnnxWriter, op: Op) -> None:
    """``Expand`` to the shape."""
    out = op.results[0]
    w.node("Expand", [w.tensor(op.args[0], w.dtype(out)), w.shape_tensor(op.args[1])], [out.name])


def _filled(fill: int) -> OnnxRule:
    """A tensor of ``fill`` of the given shape."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        w.node("ConstantOfShape", [w.shape_tensor(op.args[0])], [out.name],
               value=w.fill_value(fill, w.dtype(out)))
    rule.__doc__ = f"ConstantOfShape(shape, {fill})"
    return rule


def _where(w: OnnxWriter, op: Op) -> None:
    """``Where`` on a boolean condition."""
    out = op.results[0]
    d = w.dtype(out)
    w.node("Where", [w.tensor(op.args[0], "bool"), w.tensor(op.args[1], d),
                     w.tensor(op.args[2], d)], [out.name])


def _array(w: OnnxWriter, op: Op) -> None:
    """A tensor from elements computed at run time (constant ones are folded before)."""
    out = op.results[0]
    d = w.dtype(out)
    leaves = operand_leaves(op.args[0])
    one = w.const(np.array([1], dtype=np.int64), "i64")
    pieces = []
    for leaf in leaves:
        piece = w.temp("element")
        w.node("Reshape", [w.tensor(leaf, d), one], [piece])
        pieces.append(piece)
    flat = w.temp("elements")
    w.node("Concat", pieces, [flat], axis=0)
    shape = shape_of_type(out.type)
    if shape is None or not all(isinstance(s, int) for s in shape):
        raise ExportError("array() of values with a shape known only at run time", w.loc)
    w.node("Reshape", [flat, w.const(np.array(shape, dtype=np.int64), "i64")], [out.name])


RULES: dict[Primitive, OnnxRule] = {
    tensor.matmul: _matmul,
    tensor.transpose: _transpose,
    tensor.reshape: _reshape,
    tensor.sum_: reduction("ReduceSum"),
    tensor.mean: reduction("ReduceMean"),
    tensor.broadcast_to: _broadcast_to,
    tensor.ones_like: filled_like(1),
    tensor.zeros: _filled(0),
    tensor.ones: _filled(1),
    tensor.where: _where,
    tensor.array: _array,
    tensor.cast: cast_rule,
}
"""This family's primitive object → the rule writing its ONNX nodes (merged into
:data:`anfir.interop.onnx.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported, with the reason."""

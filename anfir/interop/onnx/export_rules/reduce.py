"""The ONNX export rules of the reductions of :mod:`anfir.primitives.reduce`.

See :mod:`anfir.interop.onnx.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from anfir.flat.statements import Op
from anfir.interop.export_common import operand_shape
from anfir.interop.onnx.onnx_types import ONNX_TYPES
from anfir.interop.onnx.export_rules.common import OnnxRule, reduction
from anfir.ir.primitive import Primitive
from anfir.primitives import elementwise, reduce

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.onnx.exporter import OnnxWriter


def _extreme(reduce_type: str, elementwise: str) -> OnnxRule:
    """max/min: the reduction over the axis attribute, or with two arguments the elementwise op."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        d = w.dtype(out)
        if len(op.args) == 2:
            w.node(elementwise, [w.tensor(op.args[0], d), w.tensor(op.args[1], d)], [out.name])
            return
        w.reduce(reduce_type, w.tensor(op.args[0], d), op.attrs.get("axis"),
                 bool(op.attrs.get("keepdims")), out.name)
    rule.__doc__ = f"{reduce_type} over the axis attribute, or {elementwise} of two arguments"
    return rule


def _cumsum(w: OnnxWriter, op: Op) -> None:
    """ONNX CumSum (its exclusive and reverse are numpy's); no axis: of the flattened x."""
    out = op.results[0]
    x = w.tensor(op.args[0], w.dtype(out))
    if op.attrs.get("axis") is None:
        x = w.op("Reshape", x, w.ints([-1]))  # then axis 0
    axis = w.const(np.array(int(op.attrs.get("axis") or 0), dtype=np.int64), "i64")
    w.node("CumSum", [x, axis], [out.name],
           exclusive=int(bool(op.attrs.get("exclusive"))),
           reverse=int(bool(op.attrs.get("reverse"))))


def _arg_extreme(op_type: str) -> OnnxRule:
    """ArgMax / ArgMin: over one axis, or of the flattened x when the axis is None."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        x = w.tensor(op.args[0])
        axis, keep = op.attrs.get("axis", 0), bool(op.attrs.get("keepdims"))
        last = int(bool(op.attrs.get("select_last")))
        if axis is not None:
            w.node(op_type, [x], [out.name], axis=int(axis), keepdims=int(keep),
                   select_last_index=last)
            return
        rank = len(operand_shape(w, op.args[0], op_type))
        index = w.op(op_type, w.op("Reshape", x, w.ints([-1])), axis=0, keepdims=0,
                     select_last_index=last)
        w.node("Reshape", [index, w.ints([1] * rank if keep else [])], [out.name])
    rule.__doc__ = f"ONNX {op_type}"
    return rule


def _all_any(reduce_type: str) -> OnnxRule:
    """all / any: the minimum / maximum of the truth values (as integers)."""
    def rule(w: OnnxWriter, op: Op) -> None:
        truth = w.cast(w.tensor(op.args[0], "bool"), "bool", "i32")
        reduced = w.reduce(reduce_type, truth, op.attrs.get("axis"), bool(op.attrs.get("keepdims")))
        w.node("Cast", [reduced], [op.results[0].name], to=ONNX_TYPES["bool"])
    rule.__doc__ = f"{reduce_type} of the truth values"
    return rule


RULES: dict[Primitive, OnnxRule] = {
    reduce.max_: _extreme("ReduceMax", "Max"),
    reduce.min_: _extreme("ReduceMin", "Min"),
    reduce.prod: reduction("ReduceProd"),
    reduce.all_: _all_any("ReduceMin"),
    reduce.any_: _all_any("ReduceMax"),
    reduce.argmax: _arg_extreme("ArgMax"),
    reduce.argmin: _arg_extreme("ArgMin"),
    reduce.cumsum: _cumsum,
}
"""This family's primitive object → the rule writing its ONNX nodes (merged into
:data:`anfir.interop.onnx.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported, with the reason."""

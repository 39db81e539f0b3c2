"""The Core ML (MIL) export rules of the reductions of :mod:`anfir.primitives.reduce`.

See :mod:`anfir.interop.coreml.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from anfir.flat.statements import Op
from anfir.interop.export_common import operand_shape
from anfir.interop.coreml.export_rules.common import MilRule, _reduce
from anfir.ir.primitive import Primitive
from anfir.primitives import reduce

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.coreml.exporter import MilWriter


def _cumsum(w: MilWriter, op: Op) -> None:
    """MIL cumsum (reverse as numpy's); exclusive as the inclusive sum minus the element
    (coremltools' exclusive has no reference implementation to check it against);
    no axis: of the flattened x."""
    out = op.results[0]
    x = w.tensor(op.args[0], w.dtype(out))
    axis = op.attrs.get("axis")
    if axis is None:
        x, axis = w.reshape(x, np.array([-1], dtype=np.int32)), 0
    rank = max(len(x.shape), 1)
    total = w.op("cumsum", None if op.attrs.get("exclusive") else out, x=x,
                 axis=int(axis) % rank, reverse=bool(op.attrs.get("reverse")))
    if op.attrs.get("exclusive"):
        total = w.op("sub", out, x=total, y=x)
    w.bind(out, total)


def _extreme(kind: str, elementwise_kind: str) -> MilRule:
    """max/min: the reduction over the axis attribute, or of two arguments elementwise."""
    def rule(w: MilWriter, op: Op) -> None:
        out = op.results[0]
        d = w.dtype(out)
        if len(op.args) == 2:
            w.bind(out, w.op(elementwise_kind, out, x=w.tensor(op.args[0], d),
                             y=w.tensor(op.args[1], d)))
            return
        w.bind(out, w.reduce(kind, w.tensor(op.args[0], d), op.attrs.get("axis"),
                             bool(op.attrs.get("keepdims")), out))
    rule.__doc__ = f"MIL {kind}, or {elementwise_kind} of two arguments"
    return rule


def _all_any(kind: str) -> MilRule:
    """all / any: the minimum / maximum of the truth values (as integers)."""
    def rule(w: MilWriter, op: Op) -> None:
        out = op.results[0]
        truth = w.cast(w.tensor(op.args[0], "bool"), "i32")
        reduced = w.reduce(kind, truth, op.attrs.get("axis"), bool(op.attrs.get("keepdims")))
        w.bind(out, w.cast(reduced, "bool", out))
    rule.__doc__ = f"{kind} of the truth values"
    return rule


def _arg_extreme(kind: str) -> MilRule:
    """reduce_argmax / reduce_argmin over one axis (None: of the flattened x); the last
    of equal extremes is the first of the reversed axis."""
    def rule(w: MilWriter, op: Op) -> None:
        out = op.results[0]
        x = w.tensor(op.args[0])
        axis, keep = op.attrs.get("axis", 0), bool(op.attrs.get("keepdims"))
        rank = len(operand_shape(w, op.args[0], kind))
        if axis is None:
            x, axis_i = w.reshape(x, np.array([-1], dtype=np.int32)), 0
        else:
            axis_i = int(axis) % max(rank, 1)
        if op.attrs.get("select_last"):
            x = w.op("reverse", x=x, axes=np.array([axis_i], dtype=np.int32))
        index = w.op(kind, x=x, axis=axis_i, keep_dims=keep if axis is not None else False)
        if op.attrs.get("select_last"):
            n = w.op("gather", x=w.shape_of(x), indices=np.int32(axis_i), axis=0)
            index = w.op("sub", x=w.op("sub", x=n, y=w.const(1, "i32")), y=index)
        if axis is None and keep:
            index = w.reshape(index, np.array([1] * rank, dtype=np.int32))
        w.bind(out, w.op("identity", out, x=index))
    rule.__doc__ = f"MIL {kind}"
    return rule


RULES: dict[Primitive, MilRule] = {
    reduce.max_: _extreme("reduce_max", "maximum"),
    reduce.min_: _extreme("reduce_min", "minimum"),
    reduce.prod: _reduce("reduce_prod"),
    reduce.all_: _all_any("reduce_min"),
    reduce.any_: _all_any("reduce_max"),
    reduce.argmax: _arg_extreme("reduce_argmax"),
    reduce.argmin: _arg_extreme("reduce_argmin"),
    reduce.cumsum: _cumsum,
}
"""This family's primitive object → the rule writing its MIL ops (merged into
:data:`anfir.interop.coreml.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported to MIL, with the reason."""

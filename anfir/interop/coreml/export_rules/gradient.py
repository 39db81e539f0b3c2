"""The Core ML (MIL) export rules of the gradient helpers of :mod:`anfir.primitives.gradient`.

See :mod:`anfir.interop.coreml.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from anfir.dtypes import is_bool, is_integer
from anfir.flat.statements import Op, shape_of_type
from anfir.interop.export_common import broadcast_like_needed, sum_to_plan
from anfir.interop.coreml.export_rules.common import MilRule, _broadcast, _cast, binary
from anfir.ir.primitive import Primitive
from anfir.primitives import gradient

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.coreml.exporter import MilWriter


def _cast_like(w: MilWriter, op: Op) -> None:
    """A cast to the second argument's dtype; to an integer or boolean, zeros of
    ``g``'s shape (an integer's sensitivity is a zero)."""
    out = op.results[0]
    d = w.dtype(out)
    if not (is_integer(d) or is_bool(d)):
        _cast(w, op)
        return
    g = w.tensor(op.args[0], d)
    w.bind(out, w.op("logical_and", out, x=g, y=False) if is_bool(d)
           else w.op("mul", out, x=g, y=np.zeros((), dtype=np.int32)))


def _size(w: MilWriter, op: Op) -> None:
    """The product of the shape."""
    out = op.results[0]
    shape = w.shape_of(w.tensor(op.args[0]))
    w.bind(out, w.op("reduce_prod", out, x=shape, keep_dims=False))


def _sum_to(w: MilWriter, op: Op) -> None:
    """``sum_to(g, x)``: ``g`` summed over the broadcast axes, reshaped to ``x``'s shape."""
    out = op.results[0]
    g = w.tensor(op.args[0], w.dtype(out))
    axes = sum_to_plan(w, op)
    if axes is not None:
        if axes:
            g = w.op("reduce_sum", x=g, axes=np.array(axes, dtype=np.int32), keep_dims=True)
        g = w.reshape(g, w.shape_of(w.tensor(op.args[1])), out)
    w.bind(out, g)


def _broadcast_like(w: MilWriter, op: Op) -> None:
    """``broadcast_like(g, x)``: ``g`` broadcast to ``x``'s shape."""
    out = op.results[0]
    d = w.dtype(out)
    g = w.tensor(op.args[0], d)
    w.bind(out, _broadcast(w, g, w.shape_of(w.tensor(op.args[1])), d, out)
           if broadcast_like_needed(w, op) else g)


def _tangent_dot(w: MilWriter, op: Op) -> None:
    """``sum(a * b)``."""
    out = op.results[0]
    d = w.dtype(out)
    a, b = op.args
    product = w.op("mul", x=w.tensor(a, d), y=w.tensor(b, d))
    if shape_of_type(w.type_of(a)) == () and shape_of_type(w.type_of(b)) == ():
        w.bind(out, product)
    else:
        w.bind(out, w.op("reduce_sum", out, x=product, keep_dims=False))


RULES: dict[Primitive, MilRule] = {
    gradient.gadd: binary("add"),
    gradient.sum_to: _sum_to,
    gradient.broadcast_like: _broadcast_like,
    gradient.size: _size,
    gradient.cast_like: _cast_like,
    gradient.tangent_dot: _tangent_dot,
}
"""This family's primitive object → the rule writing its MIL ops (merged into
:data:`anfir.interop.coreml.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported to MIL, with the reason."""

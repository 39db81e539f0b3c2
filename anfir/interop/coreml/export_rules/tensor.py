"""The Core ML (MIL) export rules of the tensor operators of :mod:`anfir.primitives.tensor`.

See :mod:`anfir.interop.coreml.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from anfir.errors import ExportError
from anfir.flat.statements import Op, operand_leaves, shape_of_type
from anfir.interop.coreml.mil_types import NUMPY_OF_MIL, mil_dtype
from anfir.interop.export_common import operand_shape
from anfir.interop.coreml.export_rules.common import MilRule, _broadcast, _cast, _filled_like, _reduce
from anfir.ir.primitive import Primitive
from anfir.primitives import tensor

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.coreml.exporter import MilWriter


def _matmul(w: MilWriter, op: Op) -> None:
    """MIL matmul; a vector operand as numpy takes it (a row x, a column y), its axis
    added then removed (MIL's matmul wants rank 2 or more)."""
    out = op.results[0]
    d = w.dtype(out)
    x, y = w.tensor(op.args[0], d), w.tensor(op.args[1], d)
    squeeze = []
    if len(x.shape) == 1:
        x = w.op("expand_dims", x=x, axes=np.array([0], dtype=np.int32))
        squeeze.append(-2)
    if len(y.shape) == 1:
        y = w.op("expand_dims", x=y, axes=np.array([-1], dtype=np.int32))
        squeeze.append(-1)
    if not squeeze:
        w.bind(out, w.op("matmul", out, x=x, y=y))
        return
    product = w.op("matmul", x=x, y=y)
    w.bind(out, w.op("squeeze", out, x=product, axes=np.array(squeeze, dtype=np.int32)))


def _transpose(w: MilWriter, op: Op) -> None:
    """MIL transpose with the permutation (none: axes reversed)."""
    out = op.results[0]
    x = w.tensor(op.args[0], w.dtype(out))
    perm = w.static(op.args[1]) if len(op.args) > 1 else None
    rank = len(operand_shape(w, op.args[0], "transpose"))
    if perm is None:
        perm = tuple(reversed(range(rank)))
    w.bind(out, w.op("transpose", out, x=x, perm=np.array([int(p) % max(rank, 1) for p in perm],
                                                           dtype=np.int32)))


def _reshape(w: MilWriter, op: Op) -> None:
    """MIL reshape to the shape."""
    out = op.results[0]
    w.bind(out, w.reshape(w.tensor(op.args[0], w.dtype(out)), w.shape_tensor(op.args[1]), out))


def _broadcast_to(w: MilWriter, op: Op) -> None:
    """``x`` broadcast to the shape."""
    out = op.results[0]
    d = w.dtype(out)
    w.bind(out, _broadcast(w, w.tensor(op.args[0], d), w.shape_tensor(op.args[1]), d, out))


def _filled(fill: int) -> MilRule:
    """``fill`` of the given shape."""
    def rule(w: MilWriter, op: Op) -> None:
        out = op.results[0]
        d = mil_dtype(w.dtype(out), w.loc)
        shape = shape_of_type(out.type)
        if shape == ():
            w.bind(out, w.const(fill, w.dtype(out)))
            return
        w.bind(out, w.op("fill", out, shape=w.shape_tensor(op.args[0]), value=NUMPY_OF_MIL[d](fill)))
    rule.__doc__ = f"fill(shape, {fill})"
    return rule


def _where(w: MilWriter, op: Op) -> None:
    """MIL select on a boolean condition."""
    out = op.results[0]
    d = w.dtype(out)
    w.bind(out, w.select(w.tensor(op.args[0], "bool"), w.tensor(op.args[1], d),
                         w.tensor(op.args[2], d), d, out))


def _array(w: MilWriter, op: Op) -> None:
    """A tensor from elements computed at run time: concat of the elements, reshaped."""
    out = op.results[0]
    d = w.dtype(out)
    leaves = operand_leaves(op.args[0])
    shape = shape_of_type(out.type)
    if shape is None or not all(isinstance(s, int) for s in shape):
        raise ExportError("array() of values with a shape known only at run time", w.loc)
    pieces = [w.reshape(w.tensor(leaf, d), np.array([1], dtype=np.int32)) for leaf in leaves]
    flat = pieces[0] if len(pieces) == 1 else w.op("concat", values=pieces, axis=0)
    w.bind(out, w.reshape(flat, np.array(shape, dtype=np.int32), out))


RULES: dict[Primitive, MilRule] = {
    tensor.matmul: _matmul,
    tensor.transpose: _transpose,
    tensor.reshape: _reshape,
    tensor.sum_: _reduce("reduce_sum"),
    tensor.mean: _reduce("reduce_mean"),
    tensor.broadcast_to: _broadcast_to,
    tensor.where: _where,
    tensor.array: _array,
    tensor.cast: _cast,
    tensor.ones_like: _filled_like(1),
    tensor.zeros: _filled(0),
    tensor.ones: _filled(1),
}
"""This family's primitive object → the rule writing its MIL ops (merged into
:data:`anfir.interop.coreml.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported to MIL, with the reason."""

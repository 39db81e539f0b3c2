"""The Core ML (MIL) export rules of the indexing operators of :mod:`anfir.primitives.indexing`.

See :mod:`anfir.interop.coreml.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from anfir.flat.statements import Op, Operand
from anfir.interop.coreml.export_rules.common import (MilRule, _bind_identity, _broadcast_rule, _expand_dims,
                                                      _fill, _i32, _shape, _static)
from anfir.ir.primitive import Primitive
from anfir.primitives import indexing, shaping

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.coreml.exporter import MilWriter


def _positive(w: MilWriter, index: Any, n: Any) -> Any:
    """Negative indices counted from the end (MIL's gathers want 0 <= i < n)."""
    negative = w.op("less", x=index, y=np.int32(0))
    return w.op("select", cond=negative, a=w.op("add", x=index, y=n), b=index)


def _axis_length(w: MilWriter, x: Any, ax: int) -> Any:
    n = x.shape[ax]
    if isinstance(n, (int, np.integer)):
        return np.int32(n)
    return w.op("gather", x=w.op("shape", x=x), indices=np.int32(ax), axis=0)


def _gathering(kind: str) -> MilRule:
    """MIL ``kind`` along the axis attribute, negative indices counted from the end."""
    def rule(w: MilWriter, op: Op) -> None:
        out = op.results[0]
        ax = shaping.axis_of(op.attrs["axis"], len(_shape(w, op.args[0], op.prim.name)), op.prim.name)
        x = w.tensor(op.args[0], w.dtype(out))
        index = _positive(w, w.tensor(op.args[1], "i32"), _axis_length(w, x, ax))
        w.bind(out, w.op(kind, out, x=x, indices=index, axis=ax))
    rule.__doc__ = f"MIL {kind} (negative indices from the end)"
    return rule


def _gather_grad(w: MilWriter, op: Op) -> None:
    """dout, its index axes merged into one, added into zeros of x's shape by MIL
    scatter (mode add) along the axis (static shapes)."""
    out = op.results[0]
    d = w.dtype(out)
    x_shape = _static(w, op.args[1], "gather_grad")
    idx_shape = _static(w, op.args[2], "gather_grad")
    rank = len(x_shape)
    ax = shaping.axis_of(op.attrs["axis"], rank, "gather_grad")
    count = int(np.prod(idx_shape, dtype=np.int64))
    index = _positive(w, w.reshape(w.tensor(op.args[2], "i32"), _i32([count])), np.int32(x_shape[ax]))
    g = w.reshape(w.tensor(op.args[0], d), _i32([*x_shape[:ax], count, *x_shape[ax + 1:]]))
    zeros = w.const(np.zeros(x_shape), d)
    w.bind(out, w.op("scatter", out, data=zeros, indices=index, updates=g, axis=ax, mode="add"))


def _scatter_add(w: MilWriter, op: Op) -> None:
    """MIL scatter_along_axis, mode add."""
    out = op.results[0]
    d = w.dtype(out)
    rank = len(_shape(w, op.args[0], "scatter_add"))
    ax = shaping.axis_of(op.attrs["axis"], rank, "scatter_add")
    x = w.tensor(op.args[0], d)
    index = _positive(w, w.tensor(op.args[1], "i32"), _axis_length(w, x, ax))
    w.bind(out, w.op("scatter_along_axis", out, data=x, indices=index,
                     updates=w.tensor(op.args[2], d), axis=ax, mode="add"))


def _nd_index(w: MilWriter, x: Any, index_op: Operand) -> Any:
    """gather_nd's index tuples with negative entries counted from the end."""
    index = w.tensor(index_op, "i32")
    k = index.shape[-1]
    lengths = w.op("slice_by_size", x=w.shape_of(x), begin=_i32([0]), size=_i32([k])) \
        if not isinstance(w.shape_of(x), np.ndarray) else w.shape_of(x)[:k].astype(np.int32)
    return _positive(w, index, lengths)


def _gather_nd(w: MilWriter, op: Op) -> None:
    """MIL gather_nd."""
    out = op.results[0]
    x = w.tensor(op.args[0], w.dtype(out))
    w.bind(out, w.op("gather_nd", out, x=x, indices=_nd_index(w, x, op.args[1])))


def _gather_nd_grad(w: MilWriter, op: Op) -> None:
    """MIL scatter_nd (mode add) of dout into zeros of x's shape."""
    out = op.results[0]
    d = w.dtype(out)
    x = w.tensor(op.args[1], d)
    zeros = _fill(w, w.shape_of(x), 0, d)
    w.bind(out, w.op("scatter_nd", out, data=zeros, indices=_nd_index(w, x, op.args[2]),
                     updates=w.tensor(op.args[0], d), mode="add"))


def _scatter_nd(w: MilWriter, op: Op) -> None:
    """MIL scatter_nd (mode update)."""
    out = op.results[0]
    d = w.dtype(out)
    x = w.tensor(op.args[0], d)
    w.bind(out, w.op("scatter_nd", out, data=x, indices=_nd_index(w, x, op.args[1]),
                     updates=w.tensor(op.args[2], d), mode="update"))


def _topk(w: MilWriter, op: Op) -> None:
    """MIL topk (sorted; ascending for the smallest)."""
    rank = len(_shape(w, op.args[0], "topk"))
    values, indices = op.results
    x = w.tensor(op.args[0], w.dtype(values))
    got_v, got_i = w.op("topk", x=x, k=int(op.attrs["k"]),
                        axis=shaping.axis_of(op.attrs["axis"], rank, "topk"),
                        ascending=not bool(op.attrs["largest"]))
    _bind_identity(w, values, got_v)
    w.bind(indices, w.op("identity", indices, x=got_i))


def _one_hot(w: MilWriter, op: Op) -> None:
    """equal(indices[..., None], 0..depth-1), cast (out of range: zeros, as anfir)."""
    out = op.results[0]
    depth = int(op.attrs["depth"])
    x = w.tensor(op.args[0], "i32")
    index = _expand_dims(w, x, [len(x.shape)]) if x.shape else w.reshape(x, _i32([1]))
    hit = w.op("equal", x=index, y=w.const(np.arange(depth), "i32"))
    w.bind(out, w.cast(hit, w.dtype(out), out))


def _arange(w: MilWriter, op: Op) -> None:
    """MIL range_1d in the result's dtype."""
    out = op.results[0]
    d = w.dtype(out)
    w.bind(out, w.op("range_1d", out, start=w.tensor(op.args[0], d), end=w.tensor(op.args[1], d),
                     step=w.const(op.attrs["step"], d)))


def _eye(w: MilWriter, op: Op) -> None:
    """The constant matrix (its size is static)."""
    out = op.results[0]
    value = indexing.eye.impl(int(w.static(op.args[0])), **op.attrs)
    _bind_identity(w, out, w.const(value, w.dtype(out)))


RULES: dict[Primitive, MilRule] = {
    indexing.gather: _gathering("gather"),
    indexing.gather_elements: _gathering("gather_along_axis"),
    indexing.gather_nd: _gather_nd,
    indexing.topk: _topk,
    indexing.one_hot: _one_hot,
    indexing.scatter_add: _scatter_add,
    indexing.scatter_nd: _scatter_nd,
    indexing.gather_grad: _gather_grad,
    indexing.gather_nd_grad: _gather_nd_grad,
    indexing.arange: _arange,
    indexing.full: _broadcast_rule(1, 0),
    indexing.eye: _eye,
}
"""This family's primitive object → the rule writing its MIL ops (merged into
:data:`anfir.interop.coreml.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported to MIL, with the reason."""

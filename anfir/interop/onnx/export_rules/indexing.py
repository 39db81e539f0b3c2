"""The ONNX export rules of the indexing operators of :mod:`anfir.primitives.indexing`:
Gather, GatherElements, GatherND, ScatterElements, ScatterND, one_hot, arange, full,
eye and TopK (``topk`` returns a tuple: one ONNX output per item).

See :mod:`anfir.interop.onnx.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from anfir.dtypes import numpy_dtype
from anfir.flat.statements import Op
from anfir.interop.onnx.export_rules.common import OnnxRule, known_shape
from anfir.ir.primitive import Primitive
from anfir.primitives import indexing, shaping

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.onnx.exporter import OnnxWriter


def _zeros_like(w: OnnxWriter, x: str, d: str) -> str:
    return w.op("ConstantOfShape", w.op("Shape", x), value=w.fill_value(0, d))


def _gather(w: OnnxWriter, op: Op) -> None:
    """Gather."""
    out = op.results[0]
    rank = len(known_shape(w, op.args[0], "gather"))
    w.node("Gather", [w.tensor(op.args[0], w.dtype(out)), w.tensor(op.args[1], "i64")], [out.name],
           axis=shaping.axis_of(op.attrs["axis"], rank, "gather"))


def _positive(w: OnnxWriter, index: str, n: str) -> str:
    negative = w.op("Less", index, w.const(np.array(0, dtype=np.int64), "i64"))
    return w.op("Where", negative, w.op("Add", index, n), index)


def _permuted(w: OnnxWriter, x: str, perm: list[int]) -> str:
    """``Transpose(x, perm)``, or ``x`` when ``perm`` keeps every axis in place (ONNX
    cannot write the empty ``perm`` of a 0-d tensor)."""
    return x if perm == list(range(len(perm))) else w.op("Transpose", x, perm=perm)


def _gather_grad(w: OnnxWriter, op: Op) -> None:
    """ScatterND (add) of dout, its index axes moved first, into zeros (axis moved first)."""
    out = op.results[0]
    d = w.dtype(out)
    x_shape = known_shape(w, op.args[1], "gather_grad")
    rank = len(x_shape)
    ax = shaping.axis_of(op.attrs["axis"], rank, "gather_grad")
    k = len(known_shape(w, op.args[2], "gather_grad"))
    x = w.tensor(op.args[1], d)
    n = w.op("Gather", w.op("Shape", x), w.const(np.array(ax, dtype=np.int64), "i64"), axis=0)
    index = w.op("Unsqueeze", _positive(w, w.tensor(op.args[2], "i64"), n), w.ints([-1]))
    perm_x = [ax] + [i for i in range(rank) if i != ax]
    zeros = _zeros_like(w, _permuted(w, x, perm_x), d)
    g_rank = rank - 1 + k
    perm_g = list(range(ax, ax + k)) + list(range(ax)) + list(range(ax + k, g_rank))
    g = _permuted(w, w.tensor(op.args[0], d), perm_g)
    acc = w.op("ScatterND", zeros, index, g, reduction="add")
    back = [perm_x.index(i) for i in range(rank)]
    if back == list(range(rank)):
        w.node("Identity", [acc], [out.name])
    else:
        w.node("Transpose", [acc], [out.name], perm=back)


def _gather_elements(w: OnnxWriter, op: Op) -> None:
    """GatherElements."""
    out = op.results[0]
    rank = len(known_shape(w, op.args[0], "gather_elements"))
    w.node("GatherElements", [w.tensor(op.args[0], w.dtype(out)), w.tensor(op.args[1], "i64")],
           [out.name], axis=shaping.axis_of(op.attrs["axis"], rank, "gather_elements"))


def _scatter_add(w: OnnxWriter, op: Op) -> None:
    """ScatterElements with reduction add."""
    out = op.results[0]
    d = w.dtype(out)
    rank = len(known_shape(w, op.args[0], "scatter_add"))
    w.node("ScatterElements", [w.tensor(op.args[0], d), w.tensor(op.args[1], "i64"),
                               w.tensor(op.args[2], d)], [out.name],
           axis=shaping.axis_of(op.attrs["axis"], rank, "scatter_add"), reduction="add")


def _gather_nd(w: OnnxWriter, op: Op) -> None:
    """GatherND."""
    out = op.results[0]
    w.node("GatherND", [w.tensor(op.args[0], w.dtype(out)), w.tensor(op.args[1], "i64")], [out.name])


def _gather_nd_grad(w: OnnxWriter, op: Op) -> None:
    """ScatterND (add) of dout into zeros of x's shape."""
    out = op.results[0]
    d = w.dtype(out)
    zeros = _zeros_like(w, w.tensor(op.args[1], d), d)
    w.node("ScatterND", [zeros, w.tensor(op.args[2], "i64"), w.tensor(op.args[0], d)], [out.name],
           reduction="add")


def _scatter_nd(w: OnnxWriter, op: Op) -> None:
    """ScatterND."""
    out = op.results[0]
    d = w.dtype(out)
    w.node("ScatterND", [w.tensor(op.args[0], d), w.tensor(op.args[1], "i64"),
                         w.tensor(op.args[2], d)], [out.name])


def _one_hot(w: OnnxWriter, op: Op) -> None:
    """Equal(indices[..., None], 0..depth-1), cast (an index out of range gives zeros, as anfir)."""
    out = op.results[0]
    depth = int(op.attrs["depth"])
    index = w.op("Unsqueeze", w.tensor(op.args[0], "i64"), w.ints([-1]))
    hit = w.op("Equal", index, w.const(np.arange(depth, dtype=np.int64), "i64"))
    w.node("Identity", [w.cast(hit, "bool", w.dtype(out))], [out.name])


def _arange(w: OnnxWriter, op: Op) -> None:
    """Range in the result's dtype."""
    out = op.results[0]
    d = w.dtype(out)
    step = w.const(np.array(op.attrs["step"]).astype(numpy_dtype(d)), d)
    w.node("Range", [w.tensor(op.args[0], d), w.tensor(op.args[1], d), step], [out.name])


def _full(w: OnnxWriter, op: Op) -> None:
    """Expand of the value (in the result's dtype) to the shape."""
    out = op.results[0]
    w.node("Expand", [w.tensor(op.args[1], w.dtype(out)), w.shape_tensor(op.args[0])], [out.name])


def _eye(w: OnnxWriter, op: Op) -> None:
    """EyeLike of a zero matrix of the (static) size."""
    out = op.results[0]
    n = int(w.static(op.args[0]))
    value = indexing.eye.impl(n, **op.attrs)
    w.node("Identity", [w.const(value, w.dtype(out))], [out.name])


def _topk(w: OnnxWriter, op: Op) -> None:
    """TopK (sorted; ties: the lower index first, as anfir)."""
    rank = len(known_shape(w, op.args[0], "topk"))
    values, indices = op.results
    w.node("TopK", [w.tensor(op.args[0], w.dtype(values)), w.ints([int(op.attrs["k"])])],
           [values.name, indices.name], axis=shaping.axis_of(op.attrs["axis"], rank, "topk"),
           largest=int(bool(op.attrs["largest"])), sorted=1)



RULES: dict[Primitive, OnnxRule] = {
    indexing.topk: _topk,
    indexing.gather: _gather, indexing.gather_grad: _gather_grad,
    indexing.gather_elements: _gather_elements, indexing.scatter_add: _scatter_add,
    indexing.gather_nd: _gather_nd, indexing.gather_nd_grad: _gather_nd_grad,
    indexing.scatter_nd: _scatter_nd, indexing.one_hot: _one_hot, indexing.arange: _arange,
    indexing.full: _full, indexing.eye: _eye,
}
"""This family's primitive object → the rule writing its ONNX nodes (merged into
:data:`anfir.interop.onnx.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported, with the reason (none)."""

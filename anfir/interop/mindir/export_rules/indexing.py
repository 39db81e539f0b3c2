"""MindIR export rules of :mod:`anfir.primitives.indexing`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from anfir.interop.mindir.common import TYPE_ID_OF
from anfir.interop.mindir.export_rules.common import (Rule, Unsupported, dtype_of, known, numpy_dtype, registrar,
                                                      static_shape)
from anfir.ir.nodes import CNode, Node
from anfir.ir.primitive import Primitive
from anfir.primitives import indexing

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.mindir.writer import Writer

RULES: dict[Primitive, Rule] = {}
"""This family's primitives -> how each is written as MindSpore ops."""
UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives MindIR cannot hold, with the reason."""
rule_of = registrar(RULES)


@rule_of(indexing.gather)
def _gather(w: Writer, node: CNode) -> str:
    # Gather(x, indices, axis, batch_dims 0); a negative index counts from the end (numpy's
    # take), which MindSpore's Gather does not: indices + (indices < 0) * dim
    x, indices = node.args
    shape = static_shape(x, "gather")
    axis = int(node.attrs.get("axis", 0)) if node.attrs else 0
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis < len(shape):
        raise Unsupported(f"gather along axis {axis} of a rank-{len(shape)} tensor")
    ref = _positive(w, indices, shape[axis])
    return w.emit("Gather", [w.ref(x), ref, w.constant(axis, scalar=True), w.constant(0, scalar=True)],
                  abstract=node.abstract)


def _positive(w: Writer, indices: Node, dim: int) -> str:
    """The indices with a negative one counted from the end (numpy's take; MindSpore's
    Gather and UnsortedSegmentSum do not): a constant normalised now, otherwise
    indices + Cast(indices < 0) * dim."""
    value = known(indices)
    if value is not None:
        index = np.asarray(value[0])
        if index.dtype.kind not in "iu":
            raise Unsupported(f"indices of {index.dtype}")
        return w.constant(np.where(index < 0, index + dim, index).astype(np.int64), "i64")
    idtype = dtype_of(indices.abstract)
    if idtype is None or idtype not in TYPE_ID_OF or not idtype.startswith(("i", "u")):
        raise Unsupported(f"indices of {indices.abstract}")
    raw = w.ref(indices)
    negative = w.emit("Less", [raw, w.constant(np.zeros((), numpy_dtype(idtype)), idtype)])
    shift = w.emit("Mul", [w.emit("Cast", [negative, w.constant(TYPE_ID_OF[idtype], scalar=True)]),
                           w.constant(np.asarray(dim, numpy_dtype(idtype)), idtype)])
    return w.emit("Add", [raw, shift])


@rule_of(indexing.gather_grad)
def _gather_grad(w: Writer, node: CNode) -> str:
    # along axis 0: UnsortedSegmentSum(dout, indices, rows) — dout's rows added into x's rows
    dout, x, indices = node.args
    shape = static_shape(x, "gather_grad")
    axis = int(node.attrs.get("axis", 0)) if node.attrs else 0
    if (axis + len(shape) if axis < 0 else axis) != 0:
        raise Unsupported("gather_grad along an axis other than 0 (UnsortedSegmentSum sums rows)")
    return w.emit("UnsortedSegmentSum", [w.ref(dout), _positive(w, indices, shape[0]),
                                         w.constant(int(shape[0]), scalar=True)], abstract=node.abstract)

"""MindIR export rules of :mod:`anfir.primitives.tensor`."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from anfir.interop.mindir.export_rules.common import (SMALL_ZERO, Rule, Unsupported, broadcast, dtype_of, elementwise,
                                                      known, numpy_dtype, rank_of, reducer, registrar, shape_operand,
                                                      static, static_shape)
from anfir.ir.nodes import CNode, ValueNode
from anfir.ir.primitive import Primitive
from anfir.interop.mindir.common import TYPE_ID_OF
from anfir.abstract.values import ATensor
from anfir.primitives import tensor

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.mindir.writer import Writer

RULES: dict[Primitive, Rule] = {}
"""This family's primitives -> how each is written as MindSpore ops."""
UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives MindIR cannot hold, with the reason."""
rule_of = registrar(RULES)


ELEMENTWISE: dict[Primitive, str] = {
    tensor.matmul: "MatMulExt",
    tensor.ones_like: "OnesLike",
}
"""Primitives written as one MindSpore op of the same inputs."""
for _prim, _op in ELEMENTWISE.items():
    RULES[_prim] = elementwise(_op)


@rule_of(tensor.cast)
def _cast(w: Writer, node: CNode) -> str:
    dtype = static(node.args[1], "a cast's dtype")
    if str(dtype) not in TYPE_ID_OF:
        raise Unsupported(f"cast to {dtype}")
    return w.emit("Cast", [w.ref(node.args[0]), w.constant(TYPE_ID_OF[str(dtype)], scalar=True)],
                  abstract=node.abstract)

@rule_of(tensor.transpose)
def _transpose(w: Writer, node: CNode) -> str:
    perm = static(node.args[1], "a permutation") if len(node.args) > 1 else None
    if perm is None:
        abstract = node.args[0].abstract
        if not isinstance(abstract, ATensor) or abstract.shape is None:
            raise Unsupported("transpose of a tensor of unknown rank")
        perm = tuple(reversed(range(len(abstract.shape))))
    return w.emit("Transpose", [w.ref(node.args[0]), w.constant(tuple(int(p) for p in perm), scalar=True)],
                  abstract=node.abstract)

@rule_of(tensor.reshape)
def _reshape(w: Writer, node: CNode) -> str:
    shape = node.args[1]
    ref = (w.constant(tuple(int(d) for d in shape.value), scalar=True) if isinstance(shape, ValueNode)
           else w.raw(shape))
    return w.emit("Reshape", [w.ref(node.args[0]), ref], abstract=node.abstract)


RULES[tensor.sum_] = reducer("ReduceSum")
RULES[tensor.mean] = reducer("ReduceMean")


@rule_of(tensor.shape)
def _shape_of(w: Writer, node: CNode) -> str:
    # a static shape is a constant (a tuple of scalar INT64); one with dimension
    # variables is MindSpore's Shape at run time (a tuple of scalars, as MindSpore
    # writes x.shape of a dynamic input)
    rank = rank_of(node.args[0], "shape")
    try:
        name = w.constant(static_shape(node.args[0], "shape"), scalar=True)
    except Unsupported:
        name = w.emit("Shape", [w.ref(node.args[0])])
    return w.mark_scalar(name, frozenset(range(rank)))

@rule_of(tensor.broadcast_to)
def _broadcast_to(w: Writer, node: CNode) -> str:
    x, target = node.args[0], node.args[1]
    if isinstance(x.abstract, ATensor) and isinstance(node.abstract, ATensor) and x.abstract.shape == node.abstract.shape \
            and x.abstract.shape is not None and all(isinstance(d, int) for d in x.abstract.shape):
        return w.ref(x)
    try:
        out = _static_result(node, "broadcast_to")
    except Unsupported:
        out = None
    if out is not None:
        return broadcast(w, w.ref(x), out, node.abstract)
    # a shape known at run time: the tuple of MindSpore scalars itself (Shape's, a MakeTuple's)
    shape = shape_operand(w, target, rank_of(node, "broadcast_to"), "broadcast_to")
    return w.emit("BroadcastTo", [w.ref(x), shape], abstract=node.abstract)

def _static_result(node: CNode, what: str) -> tuple[int, ...]:
    return static_shape(node, what)


@rule_of(tensor.where)
def _where(w: Writer, node: CNode) -> str:
    """Select(c, x, y): a constant condition stays bool (``elementwise`` would write it in
    the dtype of the computed operands — a constant mask, e.g. of prod's gradient); a
    constant branch takes the result's dtype."""
    c, x, y = node.args
    dtype = dtype_of(node.abstract)
    inputs = []
    for k, arg in enumerate((c, x, y)):
        value = known(arg)
        if value is None:
            inputs.append(w.ref(arg))
        else:
            inputs.append(w.constant(value[0], "bool" if k == 0 else dtype))
    return w.emit("Select", inputs, abstract=node.abstract)


def _filled(value: int) -> Rule:
    """zeros / ones: a constant of the result's static shape (a BroadcastTo of a scalar
    when large, as the zeros of a gradient are); with a shape known only at run time, a
    BroadcastTo of the scalar to the run-time tuple (``zeros(shape(x))``)."""
    def rule(w: Writer, node: CNode) -> str:
        dtype = dtype_of(node.abstract)
        if dtype is None or dtype not in TYPE_ID_OF:
            raise Unsupported(f"a tensor of {node.abstract}")
        np_dtype = numpy_dtype(dtype)
        try:
            shape = static_shape(node, "a tensor constructor")
        except Unsupported:
            target = shape_operand(w, node.args[0], rank_of(node, "a tensor constructor"), "a tensor constructor")
            return w.emit("BroadcastTo", [w.constant(np.full((), value, np_dtype), dtype), target],
                          abstract=node.abstract)
        if int(np.prod(shape)) <= SMALL_ZERO:
            return w.constant(np.full(shape, value, np_dtype), dtype)
        return broadcast(w, w.constant(np.full((), value, np_dtype), dtype), shape, node.abstract)
    return rule


RULES[tensor.zeros] = _filled(0)
RULES[tensor.ones] = _filled(1)

"""Expansions of the gradient helpers (anfir/primitives/gradient.py) the back ends have no
single operator for: a sum's gradient spread back (unreduce), a flattening undone
(reshape_like), the matmul gradients, the clip gradient.  (sum_to and broadcast_like stay rules of each exporter: the flattening
itself writes them, for gradients that are tensors only once tuples are taken apart.)"""

from __future__ import annotations

from typing import Any

from anfir.abstract.values import AScalar
from anfir.decompositions.builder import ExpansionBuilder, Decomposition
from anfir.decompositions.common import as_dtype, out_dtype
from anfir.ir.nodes import Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.primitives import arith, gradient, shaping, structure, tensor


def _swap_last(b: ExpansionBuilder, x: Node) -> Node:
    rank = b.rank(x)
    return b.call(tensor.transpose, x, tuple(range(rank - 2)) + (rank - 1, rank - 2))


def _matmul_grad(wrt_x: bool) -> Decomposition:
    """matmul_dx(dout, y, x) = dout @ yᵀ and matmul_dy(x, dout, y) = xᵀ @ dout, with numpy's
    rules for vectors (x a row, y a column) and batches (summed back to the operand)."""
    def rule(b: ExpansionBuilder) -> Node:
        d = out_dtype(b)
        if wrt_x:
            dout, y, x = (as_dtype(b, b.arg(i), d) for i in range(3))
        else:
            x, dout, y = (as_dtype(b, b.arg(i), d) for i in range(3))
        x_vector, y_vector = b.rank(x) == 1, b.rank(y) == 1
        if b.rank(x) == 0 or b.rank(y) == 0:
            raise b.decline("a matmul of a scalar")
        if y_vector:
            y = b.call(shaping.unsqueeze, y, axis=1)
            dout = b.call(shaping.unsqueeze, dout, axis=b.rank(dout))
        if x_vector:
            x = b.call(shaping.unsqueeze, x, axis=0)
            dout = b.call(shaping.unsqueeze, dout, axis=b.rank(dout) - 1)
        if wrt_x:
            product, target, vector, axis = b.call(tensor.matmul, dout, _swap_last(b, y)), x, x_vector, 0
        else:
            product, target, vector, axis = b.call(tensor.matmul, _swap_last(b, x), dout), y, y_vector, 1
        if b.shape(product) != b.shape(target):
            product = b.call(gradient.sum_to, product, target)
        return b.call(shaping.squeeze, product, axis=axis) if vector else product
    rule.__doc__ = "a matmul with a transposed operand, summed over the broadcast batch axes"
    return rule


def _clip_grad(b: ExpansionBuilder) -> Node:
    """g where lo <= x <= hi (a None bound is no bound), else 0."""
    g, x = b.arg(0), b.arg(1)
    tests = [b.call(prim, x, bound) for prim, bound in ((arith.ge, b.arg(2)), (arith.le, b.arg(3)))
             if not (isinstance(bound, ValueNode) and bound.value is None)]
    if not tests:
        return g
    inside = tests[0] if len(tests) == 1 else b.call(arith.logical_and, *tests)
    return b.call(tensor.where, inside, g, b.call(structure.zeros_like, g))


def _as_scalar(b: ExpansionBuilder, g: Node, d: str) -> Node:
    """``g`` (one element) as the scalar a gradient of a scalar is: a scalar as is, a tensor
    through a full ``sum`` (the reduction of a whole tensor is typed as a scalar)."""
    g = as_dtype(b, g, d)
    return g if isinstance(b.abstract(g), AScalar) else b.call(tensor.sum_, g)


def _shape_operand(b: ExpansionBuilder, x: Node) -> Any:
    """``x``'s shape as an operand: a constant when known, else built from ``shape(x)``."""
    return b.shape_of([b.dim(x, i) for i in range(b.rank(x))])


def _unreduce(b: ExpansionBuilder) -> Node:
    """The gradient of sum(x, axis, keepdims) spread over x: g with the reduced axes back
    (unless kept), broadcast to x's shape."""
    d = out_dtype(b)
    g, x = as_dtype(b, b.arg(0), d), b.arg(1)
    rank = b.rank(x)
    if rank == 0:
        return _as_scalar(b, g, d)
    axis = b.static(b.arg(2))
    keepdims = bool(b.static(b.arg(3))) if b.has(3) else False
    if axis is not None and not keepdims and b.rank(g) > 0:
        axes = sorted(int(a) % rank for a in (axis if isinstance(axis, tuple) else (axis,)))
        g = b.call(shaping.unsqueeze, g, axis=tuple(axes))
    return b.call(tensor.broadcast_to, g, _shape_operand(b, x))


def _reshape_like(b: ExpansionBuilder) -> Node:
    """g with x's shape (undoes a flattening); to a scalar x, g's one element as a scalar."""
    d = out_dtype(b)
    g, x = as_dtype(b, b.arg(0), d), b.arg(1)
    if b.rank(x) == 0:
        return _as_scalar(b, g, d)
    return b.call(tensor.reshape, g, _shape_operand(b, x))


DECOMPOSITIONS: dict[Primitive, Decomposition] = {
    gradient.reshape_like: _reshape_like,
    gradient.unreduce: _unreduce,
    gradient.matmul_dx: _matmul_grad(wrt_x=True),
    gradient.matmul_dy: _matmul_grad(wrt_x=False),
    gradient.clip_grad: _clip_grad,
}
"""The gradient helpers' expansions."""

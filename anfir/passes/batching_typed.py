"""The batching primitives rewritten as core ones once the specializer has typed them.

``vmap``'s transform runs before types exist (it serves the evaluator too), so
its batched graphs carry ``batch_reshape``, ``batch_select``, ``batch_expand``,
``batch_moveaxis``, ``batch_tangent_dot`` and ``batch_tangent_scale``, whose
evaluation looks at the operands' shapes at run time.  After ``specialize``
every such call whose operands are tensors of known shapes is an ordinary
``reshape``, ``where``, ``broadcast_to``, ``transpose``, ``mul`` or ``sum`` —
which every back end (ONNX, Core ML, the low level, ``.mindir``) writes, and
which the evaluator runs without the run-time shape logic.  A call on tuples,
gradient environments or shapes not known at compile time stays as it is.

The table is keyed by the primitive objects; the optimizer tries it as one
rule (:func:`typed_batching`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from anfir.abstract.values import AScalar, ATensor
from anfir.ir.attrs import NO_ATTRS
from anfir.ir.nodes import CNode, Node
from anfir.ir.primitive import Primitive, callee_primitive
from anfir.primitives import arith, batching as bp, tensor

Rewrite = Callable[[CNode, Any], Optional[Node]]
"""``(node, ctx) -> replacement`` (None: left as it is); ``ctx`` is the optimizer's
:class:`~anfir.passes.optimize.RewriteContext`."""


def _static(node: Node) -> Optional[tuple[int, ...]]:
    """``node``'s shape when it is a tensor whose every dimension is a number (a
    number's: ``()``)."""
    a = node.abstract
    if isinstance(a, AScalar):
        return ()
    if not isinstance(a, ATensor) or a.shape is None:
        return None
    if not all(type(d) is int for d in a.shape):
        return None
    return tuple(a.shape)


def _tensors(node: CNode, count: int) -> Optional[list[tuple[int, ...]]]:
    """The static shapes of the node's first ``count`` operands and of its result."""
    shapes = [_static(a) for a in node.inputs[1:1 + count]] + [_static(node)]
    return None if any(s is None for s in shapes) else shapes  # type: ignore[return-value]


def _call(ctx: Any, node: CNode, prim: Primitive, *args: Node, attrs: Any = None) -> CNode:
    assert node.graph is not None
    canonical = prim.canonical_attrs(attrs) if attrs else NO_ATTRS
    return ctx.apply(node.graph, [ctx.constant(prim, like=node), *args], like=node,
                     attrs=canonical)


def _reshaped(ctx: Any, node: CNode, x: Node, shape: tuple[int, ...]) -> Node:
    return _call(ctx, node, tensor.reshape, x, ctx.constant(shape, like=node))


def _reshape(node: CNode, ctx: Any) -> Optional[Node]:
    shapes = _tensors(node, 1)
    if shapes is None:
        return None
    (x_shape, out_shape) = shapes
    x = node.inputs[1]
    if x_shape == out_shape:
        return x if ctx.same_type(x, node) else None
    return _reshaped(ctx, node, x, out_shape)


def _select(node: CNode, ctx: Any) -> Optional[Node]:
    shapes = _tensors(node, 3)
    if shapes is None:
        return None
    c_shape, _, _, out_shape = shapes
    cond = node.inputs[1]
    if len(c_shape) < len(out_shape):  # the example's condition against its whole value
        cond = _reshaped(ctx, node, cond, c_shape + (1,) * (len(out_shape) - len(c_shape)))
    return _call(ctx, node, tensor.where, cond, node.inputs[2], node.inputs[3])


def _expand(node: CNode, ctx: Any) -> Optional[Node]:
    x_shape, out_shape = _static(node.inputs[1]), _static(node)
    if x_shape is None or out_shape is None or tuple(out_shape[1:]) != x_shape:
        return None
    return _call(ctx, node, tensor.broadcast_to, node.inputs[1], ctx.constant(out_shape, like=node))


def _moveaxis(node: CNode, ctx: Any) -> Optional[Node]:
    x_shape = _static(node.inputs[1])
    if x_shape is None or _static(node) is None or len(node.inputs) != 2:
        return None
    rank = len(x_shape)
    source, destination = node.attrs.get("source", 0), node.attrs.get("destination", 0)
    if not (type(source) is int and type(destination) is int
            and -rank <= source < rank and -rank <= destination < rank):
        return None
    order = [a for a in range(rank) if a != source % rank]
    order.insert(destination % rank, source % rank)
    if order == list(range(rank)):
        return node.inputs[1]
    return _call(ctx, node, tensor.transpose, node.inputs[1], ctx.constant(tuple(order), like=node))


def _tangent_scale(node: CNode, ctx: Any) -> Optional[Node]:
    shapes = _tensors(node, 2)
    if shapes is None:
        return None
    a_shape, s_shape, _ = shapes
    s = node.inputs[2]
    if len(s_shape) < len(a_shape):
        s = _reshaped(ctx, node, s, s_shape + (1,) * (len(a_shape) - len(s_shape)))
    return _call(ctx, node, arith.mul, node.inputs[1], s)


def _tangent_dot(node: CNode, ctx: Any) -> Optional[Node]:
    shapes = _tensors(node, 2)
    if shapes is None:
        return None
    a_shape, b_shape, out_shape = shapes
    if a_shape != b_shape or len(a_shape) < 1 or out_shape != a_shape[:1]:
        return None
    product = _call(ctx, node, arith.mul, node.inputs[1], node.inputs[2])
    axes = tuple(range(1, len(a_shape)))
    if not axes:
        return product
    return _call(ctx, node, tensor.sum_, product, attrs={"axis": axes})


TYPED: dict[Primitive, Rewrite] = {
    bp.batch_reshape: _reshape,
    bp.batch_select: _select,
    bp.batch_expand: _expand,
    bp.batch_moveaxis: _moveaxis,
    bp.batch_tangent_scale: _tangent_scale,
    bp.batch_tangent_dot: _tangent_dot,
}
"""Each batching primitive's rewrite into core primitives, once its operands are typed."""


def typed_batching(node: CNode, ctx: Any) -> Optional[Node]:
    """The optimizer's rule: a typed call of a batching primitive as core primitives."""
    prim = callee_primitive(node)
    rewrite = TYPED.get(prim) if prim is not None else None
    if rewrite is None or any(i.abstract is None for i in node.inputs[1:]) or node.abstract is None:
        return None
    made = rewrite(node, ctx)
    # The core calls must give exactly the batched call's type (a number broadcast
    # with a weak dtype, say, would not): otherwise the call stays as it was.
    return made if made is None or ctx.same_type(made, node) else None


__all__ = ["TYPED", "typed_batching"]

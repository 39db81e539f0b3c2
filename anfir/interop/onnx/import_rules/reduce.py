"""The ONNX import rules whose result is built from
the reductions of :mod:`anfir.primitives.reduce`: the Reduce* family (with ONNX's
identities on empty axes), ArgMax/ArgMin, CumSum, CumProd.

See :mod:`anfir.interop.onnx.import_rules` for how a rule is chosen.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from anfir.dtypes import BY_NAME, int_range, is_float, numpy_dtype
from anfir.interop.onnx.common import Ctx, NodeError, OpRule
from anfir.interop.onnx.import_rules.common import RuleSet, int_tuple, static_input_shape
from anfir.ir.nodes import Node
from anfir.ir.primitive import Primitive
from anfir.primitives import arith, reduce, shaping, structure, tensor

RULES = RuleSet()
"""This family's rules (merged into :data:`anfir.interop.onnx.import_rules.OPS`)."""
op = RULES.op


def _axes(ctx: Ctx, input_opset: int) -> Optional[tuple[int, ...]]:
    # Axes were an attribute before ``input_opset`` and the second input since.
    if ctx.opset >= input_opset:
        raw = ctx.static(1, "the axes")
        axes = None if raw is None or raw.size == 0 else int_tuple(raw)
    else:
        listed = ctx.attr("axes")
        axes = None if listed is None else tuple(int(a) for a in listed)
    return axes


def _reduction(build: Callable[[Ctx, Node, Optional[tuple[int, ...]], bool], Node],
               input_opset: int = 18) -> OpRule:
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        x = ctx.need(0)
        axes = _axes(ctx, input_opset)
        keepdims = bool(ctx.attr("keepdims", 1))
        if axes is None and ctx.attr("noop_with_empty_axes", 0):
            return [ctx.call(structure.identity, x)]
        empty = _empty_reduction(ctx, axes, keepdims)
        if empty is not None:
            return [empty]
        return [build(ctx, _identity_padded(ctx, x, axes), axes, keepdims)]
    return rule


_EMPTY_REDUCTION = {"ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceProd": 1, "ReduceLogSum": -np.inf,
                    "ReduceLogSumExp": -np.inf}


def _empty_reduction(ctx: Ctx, axes: Optional[tuple[int, ...]], keepdims: bool) -> Optional[Node]:
    """The result of reducing over no elements (ONNX: the reduction's identity; the
    smallest or largest value of an integer type for max and min), or None."""
    try:
        shape = static_input_shape(ctx, 0)
    except NodeError:
        return None
    rank = len(shape)
    reduced = set(range(rank)) if axes is None else {a % rank for a in axes}
    if not any(shape[a] == 0 for a in reduced):
        return None
    out = tuple(1 if i in reduced else n for i, n in enumerate(shape) if keepdims or i not in reduced)
    return ctx.const(np.full(out, _reduction_identity(ctx), dtype=BY_NAME[ctx.dtype(0)].numpy))


def _reduction_identity(ctx: Ctx) -> Any:
    """What reducing no elements gives, in input 0's dtype: the reduction's identity;
    for max and min of an integer type its smallest or largest value."""
    d = ctx.dtype(0)
    fill = _EMPTY_REDUCTION.get(ctx.node.op_type, 0)
    if d == "bool":
        return bool(fill < 0) if ctx.node.op_type == "ReduceMin" else False if ctx.node.op_type == "ReduceMax" else fill
    if not is_float(d) and fill in (np.inf, -np.inf):
        low, high = int_range(numpy_dtype(d))  # (int4 too: numpy's iinfo lacks it)
        return low if fill < 0 else high
    return fill


_NO_IDENTITY = ("ReduceMax", "ReduceMin")
"""Reductions that anfir's primitive refuses on an empty axis (numpy's max and min have
no identity), where ONNX gives the identity."""


def _positive(dim: Optional[int | str]) -> bool:
    """Whether an ONNX dimension is a known length of at least 1."""
    return isinstance(dim, int) and dim > 0


def _identity_padded(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]]) -> Node:
    """``x``, padded at the end of each reduced axis that may be empty (its length known
    only at run time, or 0 beside a symbolic dimension) with one cell of the reduction's
    identity, for max and min: an input empty along such an axis then reduces to the
    identity, as ONNX says, and any other to its own extreme (the identity never wins).
    Fully static shapes are decided at import instead (:func:`_empty_reduction`); other
    reductions have their identity in numpy already."""
    dims = ctx.type_of(0).dims
    if ctx.node.op_type not in _NO_IDENTITY or dims is None:
        return x
    rank = len(dims)
    reduced = set(range(rank)) if axes is None else {a % rank for a in axes if -rank <= a < rank}
    # (an axis known to be empty gets here when another dimension is symbolic: the
    # identity's shape is then not known at import)
    maybe_empty = {a for a in reduced if not _positive(dims[a])}
    if not maybe_empty:
        return x
    pads = [0] * rank + [1 if a in maybe_empty else 0 for a in range(rank)]
    fill = _reduction_identity(ctx)
    # (pad's value is a number: a bool tensor is padded with 0 or 1)
    return ctx.call(shaping.pad, x, pads=tuple(pads), mode="constant",
                    value=int(fill) if isinstance(fill, bool) else fill)


def _reduce_with(prim: Primitive) -> Callable[[Ctx, Node, Optional[tuple[int, ...]], bool], Node]:
    def build(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
        return ctx.call(prim, x, axis=axes, keepdims=keepdims)
    return build


def _reduce_l1(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
    return ctx.call(tensor.sum_, ctx.call(arith.abs_, x), axis=axes, keepdims=keepdims)


def _reduce_l2(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
    return ctx.call(arith.sqrt, ctx.call(tensor.sum_, ctx.call(arith.mul, x, x), axis=axes,
                                        keepdims=keepdims))


def _reduce_sum_square(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
    return ctx.call(tensor.sum_, ctx.call(arith.mul, x, x), axis=axes, keepdims=keepdims)


def _reduce_log_sum(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
    return ctx.call(arith.log, ctx.call(tensor.sum_, x, axis=axes, keepdims=keepdims))


def _reduce_log_sum_exp(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
    return ctx.call(reduce.logsumexp, x, axis=axes, keepdims=keepdims)


op("ReduceSum")(_reduction(_reduce_with(tensor.sum_), input_opset=13))


op("ReduceMean")(_reduction(_reduce_with(tensor.mean)))


op("ReduceMax")(_reduction(_reduce_with(reduce.max_)))


op("ReduceMin")(_reduction(_reduce_with(reduce.min_)))


op("ReduceProd")(_reduction(_reduce_with(reduce.prod)))


op("ReduceL1")(_reduction(_reduce_l1))


op("ReduceL2")(_reduction(_reduce_l2))


op("ReduceSumSquare")(_reduction(_reduce_sum_square))


op("ReduceLogSum")(_reduction(_reduce_log_sum))


op("ReduceLogSumExp")(_reduction(_reduce_log_sum_exp))


def _arg(prim: Primitive) -> OpRule:
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        return [ctx.call(prim, ctx.need(0), axis=int(ctx.attr("axis", 0)),
                         keepdims=bool(ctx.attr("keepdims", 1)),
                         select_last=bool(ctx.attr("select_last_index", 0)))]
    return rule


op("ArgMax")(_arg(reduce.argmax))


op("ArgMin")(_arg(reduce.argmin))


@op("CumSum")
def _cumsum(ctx: Ctx) -> Sequence[Optional[Node]]:
    raw = ctx.static(1, "the axis")
    assert raw is not None
    out = ctx.call(reduce.cumsum, ctx.need(0), axis=int(raw.reshape(-1)[0]),
                   exclusive=bool(ctx.attr("exclusive", 0)), reverse=bool(ctx.attr("reverse", 0)))
    # numpy sums small integers in i64; ONNX keeps the input's type.
    return [ctx.call(tensor.cast, out, ctx.dtype(0))]


@op("CumProd", 26)
def _cumprod(ctx: Ctx) -> Sequence[Optional[Node]]:
    raw = ctx.static(1, "the axis")
    assert raw is not None
    out = ctx.call(reduce.cumprod, ctx.need(0), axis=int(raw.reshape(-1)[0]),
                   exclusive=bool(ctx.attr("exclusive", 0)), reverse=bool(ctx.attr("reverse", 0)))
    return [ctx.call(tensor.cast, out, ctx.dtype(0))]

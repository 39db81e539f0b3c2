"""The ONNX import rules whose result is built from
:mod:`anfir.primitives.shaping`: Expand, Squeeze, Unsqueeze, Concat, Slice, Pad,
Split, Tile, Trilu.

See :mod:`anfir.interop.onnx.import_rules` for how a rule is chosen.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from anfir.interop.onnx.common import Ctx, NodeError
from anfir.interop.onnx.import_rules.common import (RuleSet, call_named, computed_shape, int_tuple,
                                                    scalar_of, static_dim, static_input_shape)
from anfir.ir.nodes import Node, ValueNode
from anfir.primitives import arith, indexing, shaping, structure, tensor

RULES = RuleSet()
"""This family's rules (merged into :data:`anfir.interop.onnx.import_rules.OPS`)."""
op = RULES.op


@op("Expand")
def _expand(ctx: Ctx) -> Sequence[Optional[Node]]:
    dynamic = computed_shape(ctx, 1)
    if dynamic is not None:
        return [ctx.call(shaping.expand, ctx.need(0), dynamic)]
    raw = ctx.static(1, "the shape")
    assert raw is not None
    target = int_tuple(raw)
    return [ctx.call(shaping.expand, ctx.need(0), target)]


def _listed_axes(ctx: Ctx, since_input: int) -> Optional[tuple[int, ...]]:
    # Squeeze/Unsqueeze: axes as an attribute before opset 13, an input since.
    if ctx.opset >= since_input:
        raw = ctx.static(1, "the axes")
        return None if raw is None else int_tuple(raw)
    listed = ctx.attr("axes")
    return None if listed is None else tuple(int(a) for a in listed)


@op("Squeeze")
def _squeeze(ctx: Ctx) -> Sequence[Optional[Node]]:
    axes = _listed_axes(ctx, 13)
    try:
        shape = static_input_shape(ctx, 0)
    except NodeError:
        # Only the rank is known (a symbolic dimension): the squeeze primitive, which
        # checks the lengths when it runs.
        rank = ctx.rank(0)
        axis = None if axes is None else tuple(sorted({a % rank for a in axes}))
        return [ctx.call(shaping.squeeze, ctx.need(0), axis=axis)]
    rank = len(shape)
    drop = {a % rank for a in axes} if axes is not None else {i for i, d in enumerate(shape) if d == 1}
    if any(shape[a] != 1 for a in drop):
        raise NodeError(f"squeezing axes {sorted(drop)} of shape {shape}: not all of size 1")
    return [ctx.call(tensor.reshape, ctx.need(0), tuple(d for i, d in enumerate(shape) if i not in drop))]


@op("Unsqueeze")
def _unsqueeze(ctx: Ctx) -> Sequence[Optional[Node]]:
    axes = _listed_axes(ctx, 13)
    if axes is None:
        raise NodeError("Unsqueeze without axes")
    try:
        shape = static_input_shape(ctx, 0)
    except NodeError:
        rank = ctx.rank(0) + len(axes)
        return [ctx.call(shaping.unsqueeze, ctx.need(0), axis=tuple(sorted(a % rank for a in axes)))]
    rank = len(shape) + len(axes)
    inserted = {a % rank for a in axes}
    dims = iter(shape)
    out = tuple(1 if i in inserted else next(dims) for i in range(rank))
    return [ctx.call(tensor.reshape, ctx.need(0), out)]


@op("Concat")
def _concat(ctx: Ctx) -> Sequence[Optional[Node]]:
    parts = [a for a in ctx.inputs() if a is not None]
    return [ctx.call(shaping.concat, ctx.call(structure.make_tuple, *parts), axis=int(ctx.attr("axis", 0)))]


@op("Slice")
def _slice(ctx: Ctx) -> Sequence[Optional[Node]]:
    if ctx.opset < 10:
        starts, ends = int_tuple(ctx.attr("starts")), int_tuple(ctx.attr("ends"))
        listed = ctx.attr("axes")
        axes = None if listed is None else tuple(int(a) for a in listed)
        steps = None
    else:
        computed = [i for i in (1, 2) if not isinstance(ctx.input(i), ValueNode)]
        if computed and ctx.type_of(computed[0]).static_shape is not None:
            return [_slice_computed(ctx)]
        starts = int_tuple(ctx.static(1, "the starts"))
        ends = int_tuple(ctx.static(2, "the ends"))
        raw_axes, raw_steps = ctx.static(3, "the axes"), ctx.static(4, "the steps")
        axes = None if raw_axes is None else int_tuple(raw_axes)
        steps = None if raw_steps is None else int_tuple(raw_steps)
    return [call_named(ctx, shaping.slice_, [ctx.need(0)],
                       {"starts": starts, "ends": ends, "axes": axes, "steps": steps})]


def _slice_computed(ctx: Ctx) -> Node:
    """A Slice whose starts or ends are computed at run time: per axis, a gather of
    the indices ``arange(start, end, step)``, the bounds clamped as ONNX clamps them
    (the axes and steps are constants)."""
    x, starts, ends = ctx.need(0), ctx.need(1), ctx.need(2)
    count = (ctx.type_of(1).static_shape or ctx.type_of(2).static_shape or (0,))[0]
    rank = ctx.rank(0)
    raw_axes, raw_steps = ctx.static(3, "the axes"), ctx.static(4, "the steps")
    axes = list(range(count)) if raw_axes is None else [a % rank for a in int_tuple(raw_axes)]
    steps = [1] * count if raw_steps is None else list(int_tuple(raw_steps))
    dims = ctx.call(tensor.shape, x)
    zero = ctx.const(0, "i64")

    def bound(values: Node, k: int, n: Node, lo: Node, hi: Node) -> Node:
        v = ctx.call(tensor.cast, ctx.call(indexing.gather, values, ctx.const(k, "i64"), axis=0), "i64")
        v = ctx.call(tensor.where, ctx.call(arith.lt, v, zero), ctx.call(arith.add, v, n), v)
        return scalar_of(ctx, ctx.call(arith.minimum, ctx.call(arith.maximum, v, lo), hi))

    for k, (axis, step) in enumerate(zip(axes, steps)):
        if step == 0:
            raise NodeError("a Slice step of 0")
        n = ctx.call(tensor.array, ctx.call(structure.tuple_getitem, dims, axis))
        last = ctx.call(arith.sub, n, ctx.const(1, "i64"))
        if step > 0:
            start, end = bound(starts, k, n, zero, n), bound(ends, k, n, zero, n)
        else:
            minus = ctx.const(-1, "i64")
            start, end = bound(starts, k, n, zero, last), bound(ends, k, n, minus, last)
        index = ctx.call(indexing.arange, start, end, step=step, dtype="i64")
        x = ctx.call(indexing.gather, x, index, axis=axis)
    return x


@op("Pad")
def _pad(ctx: Ctx) -> Sequence[Optional[Node]]:
    mode = str(ctx.attr("mode", "constant"))
    if ctx.opset < 11:
        pads = tuple(int(p) for p in ctx.attr("pads", ctx.attr("paddings", [])))
        value: Any = float(ctx.attr("value", 0.0))
    else:
        pads = int_tuple(ctx.static(1, "the pads"))
        raw_value = ctx.static(2, "the constant value")
        value = 0 if raw_value is None or raw_value.size == 0 else raw_value.reshape(-1)[0].item()
        raw_axes = ctx.static(3, "the axes") if ctx.opset >= 18 else None
        if raw_axes is not None:
            rank = ctx.rank(0)
            axes = [a % rank for a in int_tuple(raw_axes)]
            full = [0] * (2 * rank)
            for k, a in enumerate(axes):
                full[a], full[rank + a] = pads[k], pads[len(axes) + k]
            pads = tuple(full)
    return [call_named(ctx, shaping.pad, [ctx.need(0)], {"pads": pads, "mode": mode, "value": value})]


@op("Split")
def _split(ctx: Ctx) -> Sequence[Optional[Node]]:
    axis = int(ctx.attr("axis", 0))
    count = len(ctx.node.output)
    if ctx.opset < 13:
        listed = ctx.attr("split")
        sizes: Any = tuple(int(s) for s in listed) if listed else count
    else:
        raw = ctx.static(1, "the sizes")
        sizes = int_tuple(raw) if raw is not None else count
    if isinstance(sizes, int) and ctx.opset >= 18 and ctx.attr("num_outputs") is not None:
        # num_outputs pieces of ceil(n / num_outputs), the last one smaller.
        length = static_dim(ctx, 0, axis)
        piece = -(-length // sizes)
        sizes = tuple(min(piece, length - piece * k) for k in range(sizes))
    parts = call_named(ctx, shaping.split, [ctx.need(0)], {"sizes": sizes, "axis": axis})
    return [ctx.call(structure.tuple_getitem, parts, k) for k in range(count)]


@op("Tile")
def _tile(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [call_named(ctx, shaping.tile, [ctx.need(0)], {"reps": int_tuple(ctx.static(1, "the repeats"))})]


@op("Trilu")
def _trilu(ctx: Ctx) -> Sequence[Optional[Node]]:
    raw = ctx.static(1, "k")
    k = 0 if raw is None else int(raw.reshape(-1)[0])
    return [call_named(ctx, shaping.triu if ctx.attr("upper", 1) else shaping.tril, [ctx.need(0)], {"k": k})]

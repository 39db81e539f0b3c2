"""The ONNX import rules whose result is built from
:mod:`anfir.primitives.indexing`: the gathers (Gather, GatherElements, GatherND,
Compress, ReverseSequence), the scatters, TopK, Range, OneHot, and the resampling ops
written as gathers (Resize/Upsample, GridSample).

See :mod:`anfir.interop.onnx.import_rules` for how a rule is chosen.
"""

from __future__ import annotations

import itertools
from typing import Callable, Optional, Sequence

import numpy as np

from anfir.dtypes import int_range, is_float, numpy_dtype
from anfir.interop.onnx.common import Ctx, NodeError
from anfir.interop.onnx.import_rules.common import (RuleSet, along_axis, call_named, int_tuple, known_dims,
                                                    scalar_of, static_input_shape)
from anfir.ir.nodes import Node
from anfir.primitives import arith, elementwise, indexing, nn, shaping, structure, tensor

RULES = RuleSet()
"""This family's rules (merged into :data:`anfir.interop.onnx.import_rules.OPS`)."""
op = RULES.op


@op("Gather")
def _gather(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [call_named(ctx, indexing.gather, [ctx.need(0), ctx.need(1)], {"axis": int(ctx.attr("axis", 0))})]


@op("GatherElements")
def _gather_elements(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [call_named(ctx, indexing.gather_elements, [ctx.need(0), ctx.need(1)],
                       {"axis": int(ctx.attr("axis", 0))})]


@op("GatherND")
def _gather_nd(ctx: Ctx) -> Sequence[Optional[Node]]:
    if ctx.attr("batch_dims", 0):
        raise NodeError("batch_dims (anfir's gather_nd has none)")
    return [ctx.call(indexing.gather_nd, ctx.need(0), ctx.need(1))]


@op("TopK")
def _topk(ctx: Ctx) -> Sequence[Optional[Node]]:
    k = int(ctx.attr("k")) if ctx.opset < 10 else int(int_tuple(ctx.static(1, "k"))[0])
    if not ctx.attr("sorted", 1):
        raise NodeError("unsorted TopK (anfir's topk sorts)")
    pair = call_named(ctx, indexing.topk, [ctx.need(0)], {"k": k, "axis": int(ctx.attr("axis", -1)),
                                                   "largest": bool(ctx.attr("largest", 1))})
    return [ctx.call(structure.tuple_getitem, pair, 0), ctx.call(structure.tuple_getitem, pair, 1)]


@op("Range", 11)
def _range(ctx: Ctx) -> Sequence[Optional[Node]]:
    # The length depends on the values: start and limit may be computed, the step
    # is taken statically (a graph input step specializes the model, see ``bind=``).
    raw = ctx.static(2, "the step")
    assert raw is not None
    step = raw.reshape(-1)[0].item()
    return [ctx.call(indexing.arange, scalar_of(ctx, ctx.need(0)), scalar_of(ctx, ctx.need(1)), step=step,
                     dtype=ctx.dtype(0))]


@op("OneHot", 9)
def _one_hot(ctx: Ctx) -> Sequence[Optional[Node]]:
    raw = ctx.static(1, "the depth")
    assert raw is not None
    depth = int(raw.reshape(-1)[0])
    values = ctx.need(2)
    rank = ctx.rank(0) + 1
    axis = int(ctx.attr("axis", -1)) % rank
    index = ctx.call(tensor.cast, ctx.need(0), "i64")
    # Negative indices count from the end of the depth.
    negative = ctx.call(arith.lt, index, ctx.const(0, "i64"))
    index = ctx.call(tensor.where, negative, ctx.call(arith.add, index, ctx.const(depth, "i64")), index)
    index = ctx.call(shaping.unsqueeze, index, axis=axis)
    hot = ctx.call(arith.eq, index, along_axis(ctx, np.arange(depth, dtype=np.int64), rank, axis))
    off = ctx.call(indexing.gather, values, ctx.const(0, "i64"), axis=0)
    on = ctx.call(indexing.gather, values, ctx.const(1, "i64"), axis=0)
    return [ctx.call(tensor.where, hot, on, off)]


def _positive_indices(ctx: Ctx, index: Node, length: Node) -> Node:
    negative = ctx.call(arith.lt, index, ctx.const(0, "i64"))
    return ctx.call(tensor.where, negative, ctx.call(arith.add, index, length), index)


def _scatter_elements(ctx: Ctx, axis: int, reduction: str) -> Node:
    x, updates = ctx.need(0), ctx.need(2)
    rank = ctx.rank(0)
    axis %= rank
    index = ctx.call(tensor.cast, ctx.need(1), "i64")
    length = ctx.call(indexing.gather, ctx.call(tensor.array, ctx.call(tensor.shape, x)), ctx.const(axis, "i64"), axis=0)
    index = _positive_indices(ctx, index, ctx.call(tensor.cast, length, "i64"))
    if reduction == "add":
        return ctx.call(indexing.scatter_add, x, index, updates, axis=axis)
    if reduction != "none":
        # mul, max, min: one element at a time, at positions known when importing.
        raw = ctx.static(1, "the indices (scattered with a reduction)")
        assert raw is not None
        shape = static_input_shape(ctx, 0)
        where = np.indices(raw.shape).reshape(raw.ndim, -1).T.copy()
        where[:, axis] = np.where(raw.reshape(-1) < 0, raw.reshape(-1) + shape[axis], raw.reshape(-1))
        flat = ctx.call(tensor.reshape, updates, (-1,))
        return _scatter_in_order(ctx, x, where, lambda k: ctx.call(indexing.gather, flat, ctx.const(np.array([k])), axis=0),
                                 reduction)
    # Replacing: the updates summed into zeros where the indices point, the rest of x
    # kept (ONNX leaves repeated indices undefined without a reduction).
    zeros = ctx.call(structure.zeros_like, x)
    placed = ctx.call(indexing.scatter_add, zeros, index, updates, axis=axis)
    marks = ctx.call(indexing.scatter_add, ctx.call(tensor.cast, zeros, "i64"), index,
                     ctx.call(tensor.ones_like, ctx.call(tensor.cast, updates, "i64")), axis=axis)
    return ctx.call(tensor.where, ctx.call(arith.gt, marks, ctx.const(0, "i64")), placed, x)


@op("ScatterElements", 11)
def _scatter_elements_rule(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [_scatter_elements(ctx, int(ctx.attr("axis", 0)), str(ctx.attr("reduction", "none")))]


@op("Scatter", 9)
def _scatter_rule(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [_scatter_elements(ctx, int(ctx.attr("axis", 0)), "none")]


@op("ScatterND", 11)
def _scatter_nd_rule(ctx: Ctx) -> Sequence[Optional[Node]]:
    x, index, updates = ctx.need(0), ctx.need(1), ctx.need(2)
    reduction = str(ctx.attr("reduction", "none"))
    if reduction == "none":
        return [ctx.call(indexing.scatter_nd, x, index, updates)]
    if reduction == "add":
        # gather_nd's gradient is the scatter-add of its cotangent into zeros of x.
        return [ctx.call(arith.add, x, ctx.call(indexing.gather_nd_grad, updates, x, index))]
    raw = ctx.static(1, "the indices (scattered with a reduction)")
    assert raw is not None
    depth = raw.shape[-1]
    where = raw.reshape(-1, depth)
    tail = static_input_shape(ctx, 0)[depth:]
    flat = ctx.call(tensor.reshape, updates, (-1, *tail))
    return [_scatter_in_order(ctx, x, where, lambda k: ctx.call(indexing.gather, flat, ctx.const(np.array([k])), axis=0),
                              reduction)]


SCATTER_LIMIT = 4096
"""The most index tuples a scatter with a mul/max/min reduction is unrolled for."""


def _scatter_in_order(ctx: Ctx, x: Node, where: np.ndarray, update: Callable[[int], Node],
                      reduction: str) -> Node:
    """x with each ``update(k)`` combined (mul, max, min) into the place ``where[k]``, in
    order (repeated places combine every update, as ONNX's reductions do)."""
    combine = {"mul": arith.mul, "max": arith.maximum, "min": arith.minimum}.get(reduction)
    if combine is None:
        raise NodeError(f"scatter reduction {reduction!r}")
    if len(where) > SCATTER_LIMIT:
        raise NodeError(f"a scatter with reduction {reduction!r} of {len(where)} places")
    out = x
    for k, place in enumerate(where):
        index = ctx.const(np.asarray(place, dtype=np.int64).reshape(1, -1))
        old = ctx.call(indexing.gather_nd, out, index)
        out = ctx.call(indexing.scatter_nd, out, index, ctx.call(tensor.cast, ctx.call(combine, old, update(k)), ctx.dtype(0)))
    return out


@op("Compress", 9)
def _compress(ctx: Ctx) -> Sequence[Optional[Node]]:
    # The result's length is the number of true conditions: taken statically.
    raw = ctx.static(1, "the condition")
    assert raw is not None
    picked = np.nonzero(raw.reshape(-1).astype(bool))[0].astype(np.int64)
    x = ctx.need(0)
    axis = ctx.attr("axis")
    if axis is None:
        x = ctx.call(tensor.reshape, x, (-1,))
        axis = 0
    return [ctx.call(indexing.gather, x, ctx.const(picked), axis=int(axis))]


def _resize_taps(mode: str, ratio: float, scale: float, antialias: bool, a: float, nearest: str) -> np.ndarray:
    """The weights of the neighbouring input elements of one output element.

    ``ratio`` is the source coordinate's distance past its lower neighbour, in
    (0, 1] (1 when the coordinate is an integer); the taps then start at the
    ``len // 2`` - 1 input elements before it (ONNX's neighbour rule)."""
    if mode == "nearest":
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        upper = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                 "floor": False, "ceil": True}.get(nearest)
        if upper is None:
            raise NodeError(f"nearest_mode {nearest!r}")
        return np.array([0.0, 1.0]) if upper else np.array([1.0, 0.0])
    if mode == "linear":
        if not antialias:
            return np.array([1.0 - ratio, ratio])
        # A triangle filter widened by 1/scale when shrinking.
        s = min(scale, 1.0)
        start = int(np.floor(-1 / s) + 1)
        taps = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * s), 0, 1)
        return taps / taps.sum()
    if mode == "cubic":
        def keys(t: float) -> float:
            # Keys' cubic convolution kernel with parameter a.
            t = abs(t)
            if t <= 1:
                return (a + 2) * t ** 3 - (a + 3) * t ** 2 + 1
            if t < 2:
                return a * t ** 3 - 5 * a * t ** 2 + 8 * a * t - 4 * a
            return 0.0
        if not antialias:
            return np.array([keys(ratio + 1), keys(ratio), keys(1 - ratio), keys(2 - ratio)])
        s = min(scale, 1.0)
        start = int(np.floor(-2 / s) + 1)
        taps = np.array([keys(s * (i - ratio)) for i in range(start, 2 - start)])
        return taps / taps.sum()
    raise NodeError(f"Resize mode {mode!r}")


def resize_matrix(n_in: int, n_out: int, scale: float, mode: str, coords: str,
                  roi: tuple[float, float], antialias: bool = False, cubic_a: float = -0.75,
                  nearest: str = "round_prefer_floor", exclude_outside: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The (n_out, n_in) matrix that resizes one axis as ONNX's Resize does, and which
    output positions fall outside the input (``tf_crop_and_resize`` extrapolates them)."""
    width = scale * n_in  # ONNX divides by the unrounded output length
    y = np.arange(n_out, dtype=np.float64)
    if coords == "align_corners":
        x = np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    elif coords == "asymmetric":
        x = y / scale
    elif coords == "tf_crop_and_resize":
        lo, hi = roi
        x = np.full(n_out, (hi - lo) * (n_in - 1) / 2) if width == 1 else y * (hi - lo) * (n_in - 1) / (width - 1)
        x = x + lo * (n_in - 1)
    elif coords == "pytorch_half_pixel":
        x = np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif coords == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif coords == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise NodeError(f"coordinate_transformation_mode {coords!r}")
    outside = (x < 0) | (x > n_in - 1) if coords == "tf_crop_and_resize" else np.zeros(n_out, bool)
    matrix = np.zeros((n_out, n_in))
    for i in range(n_out):
        low = int(np.floor(x[i]))
        ratio = 1.0 if x[i] == low else float(x[i] - low)
        taps = _resize_taps(mode, ratio, scale, antialias, cubic_a, nearest)
        n = len(taps)
        frac = x[i] - low
        if n % 2 == 0:
            first = low - n // 2 + (0 if frac == 0 else 1)
        else:
            first = low - (n - 1) // 2 + (0 if frac <= 0.5 else 1)
        where = np.arange(first, first + n)
        if exclude_outside:
            taps = np.where((where < 0) | (where >= n_in), 0.0, taps)
            total = taps.sum()
            taps = taps / (total if total != 0 else 1.0)
        # Positions past the ends read the edge element (ONNX pads by repeating it).
        np.add.at(matrix[i], np.clip(where, 0, n_in - 1), taps)
    return matrix, outside


def _scaled(scale: float, n: Optional[int]) -> Optional[int]:
    # The output length of an axis: floor(scale * n); a symbolic axis only unscaled.
    if n is None:
        if scale != 1.0:
            raise NodeError("resizing an axis of symbolic length")
        return None
    return int(np.floor(scale * n))


def _resize_plan(ctx: Ctx, shape: tuple[Optional[int], ...]
                 ) -> tuple[list[float], list[Optional[int]], list[float]]:
    """Per axis: the scale, the output length and the roi (starts then ends)."""
    rank = len(shape)
    if ctx.node.op_type == "Upsample" or ctx.opset < 11:
        raw = ctx.attr("scales") if ctx.opset < 9 else ctx.static(1, "the scales")
        scales = [float(s) for s in np.asarray(raw).reshape(-1)]
        return scales, [_scaled(s, n) for s, n in zip(scales, shape)], [0.0] * rank + [1.0] * rank
    listed = ctx.attr("axes")
    axes = list(range(rank)) if listed is None else [int(a) % rank for a in listed]
    raw_roi = ctx.static(1, "the roi")
    roi = [0.0] * rank + [1.0] * rank
    if raw_roi is not None and raw_roi.size:
        flat = [float(v) for v in raw_roi.reshape(-1)]
        for k, a in enumerate(axes):
            roi[a], roi[rank + a] = flat[k], flat[len(axes) + k]
    raw_scales = ctx.static(2, "the scales")
    raw_sizes = ctx.static(3, "the sizes")
    scales = [1.0] * rank
    sizes: list[Optional[int]] = list(shape)
    if raw_sizes is not None and raw_sizes.size:
        for k, a in enumerate(axes):
            sizes[a] = int(raw_sizes.reshape(-1)[k])
        if any(shape[a] is None for a in axes):
            raise NodeError("Resize to given sizes of an axis of symbolic length")
        scales = [1.0 if shape[i] is None else sizes[i] / shape[i] for i in range(rank)]  # type: ignore[operator]
        policy = str(ctx.attr("keep_aspect_ratio_policy", "stretch"))
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            common = pick(scales[a] for a in axes)
            scales = [common if i in axes else 1.0 for i in range(rank)]
            sizes = [int(common * shape[i] + 0.5) if i in axes else shape[i] for i in range(rank)]  # type: ignore[operator]
    elif raw_scales is not None and raw_scales.size:
        for k, a in enumerate(axes):
            scales[a] = float(raw_scales.reshape(-1)[k])
        sizes = [_scaled(s, n) for s, n in zip(scales, shape)]
    else:
        raise NodeError("Resize needs scales or sizes")
    return scales, sizes, roi


def _resize(ctx: Ctx) -> Sequence[Optional[Node]]:
    # The axes not resized may be symbolic (a batch); the resized ones are static.
    shape = known_dims(ctx, 0)
    rank = len(shape)
    d = ctx.dtype(0)
    scales, sizes, roi = _resize_plan(ctx, shape)
    mode = str(ctx.attr("mode", "nearest"))
    old = ctx.node.op_type == "Upsample" or ctx.opset < 11
    coords = "asymmetric" if old else str(ctx.attr("coordinate_transformation_mode", "half_pixel"))
    nearest = "floor" if old else str(ctx.attr("nearest_mode", "round_prefer_floor"))
    extrapolation = float(ctx.attr("extrapolation_value", 0.0))
    x = ctx.need(0)
    wide = mode != "nearest" or coords == "tf_crop_and_resize"
    if wide:
        x = ctx.call(tensor.cast, x, "f64")  # ONNX interpolates in double precision
    letters = "abcdefghijklmnopqrstuvwxyz"
    for axis in range(rank):
        if scales[axis] == 1.0 and sizes[axis] == shape[axis] and roi[axis] == 0.0 and roi[rank + axis] == 1.0:
            continue
        n_in, n_out = shape[axis], sizes[axis]
        if n_in is None or n_out is None:
            raise NodeError("resizing an axis of symbolic length")
        if n_out == 0:
            raise NodeError("Resize to an empty axis")
        matrix, outside = resize_matrix(
            n_in, n_out, scales[axis], "linear" if mode == "bilinear" else mode, coords,
            (roi[axis], roi[rank + axis]), bool(ctx.attr("antialias", 0)),
            float(ctx.attr("cubic_coeff_a", -0.75)), nearest, bool(ctx.attr("exclude_outside", 0)))
        if not wide:
            # Nearest: each output element copies one input element (any dtype, exactly).
            x = ctx.call(indexing.gather, x, ctx.const(np.argmax(matrix, axis=1).astype(np.int64)), axis=axis)
            continue
        src = letters[:rank]
        dst = src[:axis] + "z" + src[axis + 1:]
        x = ctx.call(nn.einsum, f"{src},z{src[axis]}->{dst}", x, ctx.const(matrix))
        if outside.any():
            x = ctx.call(tensor.where, along_axis(ctx, outside, rank, axis), ctx.const(extrapolation, "f64"), x)
    if wide:
        if not is_float(d):
            # Back to an integer type as ONNX does: rounded, then saturated.
            low, high = int_range(numpy_dtype(d))  # (int4 too: numpy's iinfo lacks it)
            x = ctx.call(elementwise.clip, ctx.call(elementwise.round_, x), ctx.const(float(low), "f64"),
                         ctx.const(float(high), "f64"))
        x = ctx.call(tensor.cast, x, d)
    elif x is ctx.input(0):
        x = ctx.call(structure.identity, x)
    return [x]


op("Resize", 10)(_resize)


op("Upsample", 7)(_resize)


@op("ReverseSequence", 10)
def _reverse_sequence(ctx: Ctx) -> Sequence[Optional[Node]]:
    # Each batch element's first length steps reversed: a gather_elements by
    # indices computed from the (static) lengths.
    shape = static_input_shape(ctx, 0)
    time_axis, batch_axis = int(ctx.attr("time_axis", 0)), int(ctx.attr("batch_axis", 1))
    raw = ctx.static(1, "the sequence lengths")
    assert raw is not None
    steps = np.arange(shape[time_axis])
    index = np.zeros(shape, dtype=np.int64)
    for b, n in enumerate(int_tuple(raw)):
        order = np.where(steps < n, n - 1 - steps, steps)
        view = [1] * len(shape)
        view[time_axis] = shape[time_axis]
        where = [slice(None)] * len(shape)
        where[batch_axis] = slice(b, b + 1)
        index[tuple(where)] = np.broadcast_to(order.reshape(view), index[tuple(where)].shape)
    return [ctx.call(indexing.gather_elements, ctx.need(0), ctx.const(index), axis=time_axis)]


def _keys_taps(ctx: Ctx, t: Node, d: str) -> list[Node]:
    """The four cubic (Keys, a = -0.75) weights of the taps at -1, 0, 1, 2 from floor(x)."""
    a = -0.75

    def c(v: float) -> Node:
        return ctx.const(v, d)

    def near(u: Node) -> Node:  # |u| <= 1: (a+2)u^3 - (a+3)u^2 + 1
        return ctx.call(arith.add, ctx.call(arith.mul, ctx.call(arith.mul, u, u),
                                           ctx.call(arith.sub, ctx.call(arith.mul, c(a + 2), u), c(a + 3))), c(1.0))

    def far(u: Node) -> Node:  # 1 < |u| < 2: ((a u - 5a) u + 8a) u - 4a
        inner = ctx.call(arith.add, ctx.call(arith.mul, ctx.call(arith.sub, ctx.call(arith.mul, c(a), u), c(5 * a)), u),
                         c(8 * a))
        return ctx.call(arith.sub, ctx.call(arith.mul, inner, u), c(4 * a))

    one = c(1.0)
    return [far(ctx.call(arith.add, t, one)), near(t), near(ctx.call(arith.sub, one, t)),
            far(ctx.call(arith.sub, c(2.0), t))]


def _reflect(ctx: Ctx, v: Node, lo: float, hi: float, d: str) -> Node:
    """ONNX's reflection of a coordinate into [lo, hi] (repeatedly, as a mirror)."""
    span = ctx.const(hi - lo, d)
    below = ctx.call(arith.sub, ctx.const(lo, d), v)
    above = ctx.call(arith.sub, v, ctx.const(hi, d))

    def fold(dist: Node, near_end: float, far_end: float) -> Node:
        turns = ctx.call(elementwise.floor, ctx.call(arith.div, dist, span))
        rest = ctx.call(arith.sub, dist, ctx.call(arith.mul, turns, span))
        even = ctx.call(arith.eq, ctx.call(elementwise.mod, turns, ctx.const(2.0, d)), ctx.const(0.0, d))
        return ctx.call(tensor.where, even, ctx.call(arith.add, ctx.const(near_end, d), rest) if near_end == lo
                        else ctx.call(arith.sub, ctx.const(near_end, d), rest),
                        ctx.call(arith.sub, ctx.const(far_end, d), rest) if far_end == hi
                        else ctx.call(arith.add, ctx.const(far_end, d), rest))

    low = ctx.call(arith.lt, v, ctx.const(lo, d))
    high = ctx.call(arith.gt, v, ctx.const(hi, d))
    return ctx.call(tensor.where, low, fold(below, lo, hi),
                    ctx.call(tensor.where, high, fold(above, hi, lo), v))


@op("GridSample", 16)
def _grid_sample(ctx: Ctx) -> Sequence[Optional[Node]]:
    # Each output element: the weighted taps around its source position, fetched
    # from the image flattened per (batch, channel) with gather_elements; taps
    # outside the image read 0 (zeros), the edge (border) or a mirror (reflection).
    shape = static_input_shape(ctx, 0)
    n, ch, spatial = shape[0], shape[1], shape[2:]
    grid_shape = static_input_shape(ctx, 1)
    out_spatial = grid_shape[1:-1]
    r = len(spatial)
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(str(ctx.attr("mode", "linear")),
                                                          str(ctx.attr("mode", "linear")))
    padding = str(ctx.attr("padding_mode", "zeros"))
    aligned = bool(ctx.attr("align_corners", 0))
    d, gd = ctx.dtype(0), ctx.dtype(1)
    grid = ctx.need(1)
    count = int(np.prod(out_spatial))
    per_axis: list[list[tuple[Node, Node, Node]]] = []  # (index, weight, valid) per tap
    for a in range(r):
        size = spatial[a]
        g = ctx.call(tensor.reshape, ctx.call(indexing.gather, grid, ctx.const(r - 1 - a, "i64"), axis=-1), (n, count))
        one = ctx.const(1.0, gd)
        if aligned:
            x = ctx.call(arith.mul, ctx.call(arith.div, ctx.call(arith.add, g, one), ctx.const(2.0, gd)),
                         ctx.const(float(size - 1), gd))
            lo, hi = 0.0, float(size - 1)
        else:
            x = ctx.call(arith.div, ctx.call(arith.sub, ctx.call(arith.mul, ctx.call(arith.add, g, one),
                                                               ctx.const(float(size), gd)), one), ctx.const(2.0, gd))
            lo, hi = -0.5, size - 0.5
        if mode == "nearest":
            x = ctx.call(elementwise.round_, x)
        if padding == "border":
            x = ctx.call(arith.minimum, ctx.call(arith.maximum, x, ctx.const(0.0, gd)), ctx.const(float(size - 1), gd))
        elif padding == "reflection":
            x = _reflect(ctx, x, lo, hi, gd)
        base = ctx.call(elementwise.floor, x)
        t = ctx.call(tensor.cast, ctx.call(arith.sub, x, base), d)
        weights: list[Node]
        if mode == "nearest":
            offsets, weights = [0], [ctx.const(1.0, d)]
        elif mode == "linear":
            offsets, weights = [0, 1], [ctx.call(arith.sub, ctx.const(1.0, d), t), t]
        elif mode == "cubic":
            offsets, weights = [-1, 0, 1, 2], _keys_taps(ctx, t, d)
        else:
            raise NodeError(f"GridSample mode {mode!r}")
        start = ctx.call(tensor.cast, base, "i64")
        taps: list[tuple[Node, Node, Node]] = []
        for off, w in zip(offsets, weights):
            i = ctx.call(arith.add, start, ctx.const(off, "i64"))
            if padding == "reflection":
                i = ctx.call(tensor.cast, _reflect(ctx, ctx.call(tensor.cast, i, gd), lo, hi, gd), "i64")
            inside = ctx.call(arith.logical_and, ctx.call(arith.ge, i, ctx.const(0, "i64")),
                              ctx.call(arith.lt, i, ctx.const(size, "i64")))
            i = ctx.call(arith.minimum, ctx.call(arith.maximum, i, ctx.const(0, "i64")), ctx.const(size - 1, "i64"))
            taps.append((i, w, inside))
        per_axis.append(taps)
    flat = ctx.call(tensor.reshape, ctx.need(0), (n, ch, int(np.prod(spatial))))
    strides = [int(np.prod(spatial[a + 1:])) for a in range(r)]
    total: Optional[Node] = None
    for combo in itertools.product(*per_axis):
        index: Optional[Node] = None
        weight: Optional[Node] = None
        valid: Optional[Node] = None
        for a, (i, w, inside) in enumerate(combo):
            part = ctx.call(arith.mul, i, ctx.const(strides[a], "i64"))
            index = part if index is None else ctx.call(arith.add, index, part)
            weight = w if weight is None else ctx.call(arith.mul, weight, w)
            valid = inside if valid is None else ctx.call(arith.logical_and, valid, inside)
        assert index is not None and weight is not None and valid is not None
        if padding == "zeros":
            weight = ctx.call(tensor.where, valid, weight, ctx.const(0.0, d))
        spread = ctx.call(tensor.broadcast_to, ctx.call(shaping.unsqueeze, index, axis=1), (n, ch, count))
        picked = ctx.call(indexing.gather_elements, flat, spread, axis=2)
        term = ctx.call(arith.mul, picked, ctx.call(shaping.unsqueeze, weight, axis=1))
        total = term if total is None else ctx.call(arith.add, total, term)
    assert total is not None
    return [ctx.call(tensor.reshape, total, (n, ch, *out_spatial))]

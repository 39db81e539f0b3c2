"""The ONNX import rules whose result is built from
:mod:`anfir.primitives.conv`: Conv, ConvTranspose, the pools and BatchNormalization
(and the integer and quantized convolutions).

See :mod:`anfir.interop.onnx.import_rules` for how a rule is chosen.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from anfir.dtypes import BY_NAME, int_range, numpy_dtype
from anfir.interop.onnx.common import Ctx, NodeError, OpRule
from anfir.interop.onnx.import_rules.common import (RuleSet, call_named, minus_zero_point, static_dim,
                                                    static_dims, unary)
from anfir.ir.nodes import Node
from anfir.ir.primitive import Primitive
from anfir.primitives import arith, conv, elementwise, reduce, shaping, tensor

RULES = RuleSet()
"""This family's rules (merged into :data:`anfir.interop.onnx.import_rules.OPS`)."""
op = RULES.op


def _spatial(ctx: Ctx, kernel: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...], Any]:
    """Strides, dilations and the padding (ONNX begins-then-ends, or from auto_pad)."""
    n = len(kernel)
    strides = tuple(int(s) for s in ctx.attr("strides", [1] * n))
    dilations = tuple(int(d) for d in ctx.attr("dilations", [1] * n))
    auto = str(ctx.attr("auto_pad", "NOTSET"))
    if auto == "VALID":
        return strides, dilations, tuple([0] * (2 * n))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        dims = static_dims(ctx, 0, range(2, ctx.rank(0)))
        begins, ends = [], []
        for size, k, s, d in zip(dims, kernel, strides, dilations):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            begins.append(small if auto == "SAME_UPPER" else big)
            ends.append(big if auto == "SAME_UPPER" else small)
        return strides, dilations, tuple(begins + ends)
    pads = tuple(int(p) for p in ctx.attr("pads", [0] * (2 * n)))
    return strides, dilations, pads


@op("Conv")
def _conv(ctx: Ctx) -> Sequence[Optional[Node]]:
    listed = ctx.attr("kernel_shape")
    kernel = tuple(int(k) for k in listed) if listed is not None else static_dims(ctx, 1, range(2, ctx.rank(1)))
    strides, dilations, pads = _spatial(ctx, kernel)
    return [call_named(ctx, conv.conv, [ctx.need(0), ctx.need(1)],
                       {"b": ctx.input(2), "stride": strides, "padding": pads,
                        "dilation": dilations, "groups": int(ctx.attr("group", 1))})]


@op("ConvTranspose")
def _conv_transpose(ctx: Ctx) -> Sequence[Optional[Node]]:
    n = ctx.rank(1) - 2
    listed = ctx.attr("kernel_shape")
    kernel = tuple(int(k) for k in listed) if listed is not None else static_dims(ctx, 1, range(2, n + 2))
    strides = tuple(int(s) for s in ctx.attr("strides", [1] * n))
    dilations = tuple(int(d) for d in ctx.attr("dilations", [1] * n))
    out_pad = [int(p) for p in ctx.attr("output_padding", [0] * n)]
    auto = str(ctx.attr("auto_pad", "NOTSET"))
    wanted = ctx.attr("output_shape")
    pads = [int(p) for p in ctx.attr("pads", [0] * (2 * n))]
    if wanted is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        # ONNX's rule: the padding that gives the output shape (input * stride for SAME).
        dims = static_dims(ctx, 0, range(2, ctx.rank(0)))
        target = [int(v) for v in wanted][-n:] if wanted is not None else [d * s for d, s in zip(dims, strides)]
        pads = [0] * (2 * n)
        for i in range(n):
            total = strides[i] * (dims[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1 - target[i]
            if total < 0:
                # A bigger output than the kernel reaches: the rest is output padding.
                out_pad[i] -= total
                total = 0
            small, big = total // 2, total - total // 2
            pads[i], pads[n + i] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0] * (2 * n)
    return [call_named(ctx, conv.conv_transpose, [ctx.need(0), ctx.need(1)],
                       {"b": ctx.input(2), "stride": strides, "padding": tuple(pads),
                        "output_padding": tuple(out_pad), "dilation": dilations,
                        "groups": int(ctx.attr("group", 1))})]


def _pool(prim: Primitive) -> OpRule:
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        if len(ctx.node.output) > 1 and ctx.node.output[1]:
            raise NodeError("the Indices output of MaxPool")
        kernel = tuple(int(k) for k in ctx.attr("kernel_shape"))
        strides, dilations, pads = _spatial(ctx, kernel)
        named: dict[str, Any] = {"kernel": kernel, "stride": strides, "padding": pads,
                                 "ceil_mode": bool(ctx.attr("ceil_mode", 0))}
        if prim is conv.max_pool:
            named["dilation"] = dilations
        else:
            if any(d != 1 for d in dilations):
                return [_dilated_avg_pool(ctx, kernel, strides, dilations, pads)]
            named["count_include_pad"] = bool(ctx.attr("count_include_pad", 0))
        return [call_named(ctx, prim, [ctx.need(0)], named)]
    return rule


@op("LpPool", 11)
def _lp_pool(ctx: Ctx) -> Sequence[Optional[Node]]:
    # (sum over the window of |x|^p)^(1/p): the window sum as an average including
    # the zero padding, times the window's size.
    p = float(ctx.attr("p", 2))
    kernel = tuple(int(k) for k in ctx.attr("kernel_shape"))
    strides, dilations, pads = _spatial(ctx, kernel)
    if any(d != 1 for d in dilations):
        raise NodeError("dilated LpPool")
    d = ctx.dtype(0)
    powered = ctx.call(arith.pow_, ctx.call(arith.abs_, ctx.need(0)), ctx.const(p, d))
    mean = call_named(ctx, conv.avg_pool, [powered], {"kernel": kernel, "stride": strides, "padding": pads,
                                                   "ceil_mode": bool(ctx.attr("ceil_mode", 0)),
                                                   "count_include_pad": True})
    total = ctx.call(arith.mul, mean, ctx.const(float(np.prod(kernel)), d))
    return [ctx.call(arith.pow_, total, ctx.const(1.0 / p, d))]


def _dilated_avg_pool(ctx: Ctx, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
                      pads: Sequence[int]) -> Node:
    """A dilated average pool (anfir's avg_pool has no dilation): the window sums as a
    depthwise convolution with a kernel of ones, divided by the count of the elements
    each window covers (the same convolution of ones over the input or padded region)."""
    n = len(kernel)
    spatial = static_dims(ctx, 0, range(2, 2 + n))
    shape = (None, static_dim(ctx, 0, 1), *spatial)
    d = ctx.dtype(0)
    ceil = bool(ctx.attr("ceil_mode", 0))
    begins, ends = list(pads[:n]), list(pads[n:])
    extra = [0] * n
    for i in range(n):
        reach = (kernel[i] - 1) * dilations[i] + 1
        span = spatial[i] + begins[i] + ends[i] - reach
        count = (-(-span // strides[i]) if ceil else span // strides[i]) + 1
        if ceil and (count - 1) * strides[i] >= spatial[i] + begins[i]:
            count -= 1  # a last window that starts in the end padding is dropped
        extra[i] = max((count - 1) * strides[i] + reach - (spatial[i] + begins[i] + ends[i]), 0)
    numpy = BY_NAME[d].numpy
    window = {"stride": tuple(strides), "dilation": tuple(dilations)}
    ones_kernel = ctx.const(np.ones((shape[1], 1, *kernel), dtype=numpy))
    padding = tuple(begins + [e + x for e, x in zip(ends, extra)])
    total = call_named(ctx, conv.conv, [ctx.need(0), ones_kernel], {**window, "padding": padding, "groups": shape[1]})
    single = ctx.const(np.ones((1, 1, *kernel), dtype=numpy))
    if ctx.attr("count_include_pad", 0):
        # The explicit padding counts, the extension for ceil_mode does not.
        region = ctx.const(np.ones((1, 1, *[s + b + e for s, b, e in zip(spatial, begins, ends)]), dtype=numpy))
        covered = call_named(ctx, conv.conv, [region, single], {**window, "padding": tuple([0] * n + extra)})
    else:
        region = ctx.const(np.ones((1, 1, *spatial), dtype=numpy))
        covered = call_named(ctx, conv.conv, [region, single], {**window, "padding": padding})
    return ctx.call(arith.div, total, covered)


op("MaxPool")(_pool(conv.max_pool))


op("AveragePool")(_pool(conv.avg_pool))


op("GlobalAveragePool")(unary(conv.global_avg_pool))


op("GlobalMaxPool")(unary(conv.global_max_pool))


@op("BatchNormalization")
def _batch_norm(ctx: Ctx) -> Sequence[Optional[Node]]:
    if ctx.attr("training_mode", 0) or len([o for o in ctx.node.output if o]) > 1:
        return _batch_norm_training(ctx)
    return [call_named(ctx, conv.batch_norm, [ctx.need(0), ctx.need(1), ctx.need(2), ctx.need(3),
                                           ctx.need(4)], {"eps": float(ctx.attr("epsilon", 1e-5))})]


def _batch_norm_training(ctx: Ctx) -> list[Optional[Node]]:
    """Training mode: normalized by the batch's own mean and (population) variance over
    every axis but the channels; the running statistics updated with the momentum."""
    if ctx.opset < 14:
        raise NodeError("training-mode BatchNormalization before opset 14 (other outputs)")
    x = ctx.need(0)
    rank = ctx.rank(0)
    d = ctx.dtype(0)
    axes = tuple(a for a in range(rank) if a != 1)
    eps, momentum = float(ctx.attr("epsilon", 1e-5)), float(ctx.attr("momentum", 0.9))
    mean = ctx.call(tensor.mean, x, axis=axes, keepdims=True)
    var = ctx.call(reduce.var, x, axis=axes, keepdims=True)
    along = tuple(a for a in range(rank) if a != 1)

    def channels(node: Node) -> Node:  # a per-channel vector laid along axis 1
        return ctx.call(shaping.unsqueeze, node, axis=along)

    norm = ctx.call(arith.div, ctx.call(arith.sub, x, mean),
                    ctx.call(arith.sqrt, ctx.call(arith.add, var, ctx.const(eps, d))))
    y = ctx.call(arith.add, ctx.call(arith.mul, norm, channels(ctx.need(1))), channels(ctx.need(2)))
    keep, take = ctx.const(momentum, d), ctx.const(1.0 - momentum, d)
    flat_mean = ctx.call(tensor.reshape, mean, (-1,))
    flat_var = ctx.call(tensor.reshape, var, (-1,))
    running_mean = ctx.call(arith.add, ctx.call(arith.mul, ctx.need(3), keep), ctx.call(arith.mul, flat_mean, take))
    running_var = ctx.call(arith.add, ctx.call(arith.mul, ctx.need(4), keep), ctx.call(arith.mul, flat_var, take))
    return [y, running_mean, running_var]


@op("ConvInteger", 10)
def _conv_integer(ctx: Ctx) -> Sequence[Optional[Node]]:
    listed = ctx.attr("kernel_shape")
    kernel = tuple(int(k) for k in listed) if listed is not None else static_dims(ctx, 1, range(2, ctx.rank(1)))
    strides, dilations, pads = _spatial(ctx, kernel)
    x = minus_zero_point(ctx, 0, 2)
    w = ctx.call(tensor.cast, ctx.need(1), "i32")
    point = ctx.input(3) if len(ctx.node.input) > 3 else None
    if point is not None:
        shift = ctx.call(tensor.cast, point, "i32")
        if ctx.rank(3) == 1:  # one zero point per output channel
            shift = ctx.call(shaping.unsqueeze, shift, axis=tuple(range(1, ctx.rank(1))))
        w = ctx.call(arith.sub, w, shift)
    out = call_named(ctx, conv.conv, [x, w], {"stride": strides, "padding": pads, "dilation": dilations,
                                          "groups": int(ctx.attr("group", 1))})
    return [ctx.call(tensor.cast, out, "i32")]


@op("QLinearConv", 10)
def _qlinear_conv(ctx: Ctx) -> Sequence[Optional[Node]]:
    # The integer convolution (plus the i32 bias), scaled by x_scale * w_scale /
    # y_scale (w_scale per output channel or one), shifted, saturated, rounded.
    listed = ctx.attr("kernel_shape")
    kernel = tuple(int(k) for k in listed) if listed is not None else static_dims(ctx, 3, range(2, ctx.rank(3)))
    strides, dilations, pads = _spatial(ctx, kernel)
    x = minus_zero_point(ctx, 0, 2)
    w = ctx.call(tensor.cast, ctx.need(3), "i32")
    spatial = tuple(range(1, ctx.rank(3)))
    point = ctx.input(5)
    if point is not None:
        shift = ctx.call(tensor.cast, point, "i32")
        if ctx.rank(5) == 1:
            shift = ctx.call(shaping.unsqueeze, shift, axis=spatial)
        w = ctx.call(arith.sub, w, shift)
    out = call_named(ctx, conv.conv, [x, w], {"b": ctx.input(8), "stride": strides, "padding": pads,
                                          "dilation": dilations, "groups": int(ctx.attr("group", 1))})
    w_scale = ctx.need(4)
    if ctx.rank(4) == 1:
        w_scale = ctx.call(shaping.unsqueeze, w_scale, axis=(0, *range(2, ctx.rank(3))))
    ratio = ctx.call(arith.div, ctx.call(arith.mul, ctx.need(1), w_scale), ctx.need(6))
    y = ctx.call(arith.mul, ctx.call(tensor.cast, ctx.call(tensor.cast, out, "i32"), "f64"), ctx.call(tensor.cast, ratio, "f64"))
    zero = ctx.input(7)
    d = ctx.dtype(7) if zero is not None else ctx.dtype(0)
    if zero is not None:
        y = ctx.call(arith.add, y, ctx.call(tensor.cast, zero, "f64"))
    low, high = int_range(numpy_dtype(d))  # (int4 too: numpy's iinfo lacks it)
    y = ctx.call(elementwise.clip, y, ctx.const(float(low), "f64"), ctx.const(float(high), "f64"))
    return [ctx.call(tensor.cast, ctx.call(elementwise.round_, y), d)]

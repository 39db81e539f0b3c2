"""MindIR export rules of :mod:`anfir.primitives.conv`: 2-d convolutions, pools, batch norm (NCHW)."""

from __future__ import annotations

from typing import Any, Optional, TYPE_CHECKING

import numpy as np

from anfir.interop.mindir.export_rules.common import (Rule, Unsupported, batch_probe, broadcast, dtype_of,
                                                      numpy_dtype, rank_of, registrar, static_shape)
from anfir.ir.nodes import CNode, Node
from anfir.ir.primitive import Primitive
from anfir.interop.mindir.common import TYPE_ID_OF
from anfir.primitives import conv
from anfir.primitives.conv import conv_params
from anfir.primitives.conv import pool_params as conv_params_pool

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.mindir.writer import Writer

RULES: dict[Primitive, Rule] = {}
"""This family's primitives -> how each is written as MindSpore ops."""
UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives MindIR cannot hold, with the reason."""
rule_of = registrar(RULES)


def _conv_attrs(node: CNode, x: Node, w: Node, backprop: bool) -> dict[str, Any]:
    xs, ws = batch_probe(x, "conv"), static_shape(w, "conv")
    if len(ws) != 4 or len(xs) != 4:
        raise Unsupported("a convolution that is not 2-d")
    attrs = dict(node.attrs) if node.attrs else {}
    probe = np.broadcast_to(np.zeros((), np.float32), xs), np.broadcast_to(np.zeros((), np.float32), ws)
    try:
        _, stride, pads, dilation, groups = conv_params(*probe, attrs.get("stride", 1), attrs.get("padding", 0),
                                                       attrs.get("dilation", 1), attrs.get("groups", 1), "conv")
    except Exception as e:  # an AnfirError of the attributes: the node cannot be written
        raise Unsupported(f"conv attributes: {e}") from None
    top, left, bottom, right = (int(p) for p in pads)
    pad = (top, bottom, left, right)  # MindSpore's order
    return {"kernel_size": (ws[2], ws[3]), "mode": 1, "out_channel": ws[0], "pad": pad,
            "pad_mode": "PAD" if backprop else "pad", "format": "NCHW", "pad_list": pad,
            "groups": int(groups), "group": int(groups), "stride": (1, 1, *(int(v) for v in stride)),
            "dilation": (1, 1, *(int(v) for v in dilation))}

@rule_of(conv.conv, conv.conv_core)
def _conv(w: Writer, node: CNode) -> str:
    x, weight = node.args[:2]
    out = w.emit("Conv2D", [w.ref(x), w.ref(weight)], attrs=_conv_attrs(node, x, weight, False),
                 abstract=node.abstract if len(node.args) == 2 else None)
    if len(node.args) == 3:  # the bias along axis 1
        out = w.emit("BiasAdd", [out, w.ref(node.args[2]), w.constant(0, scalar=True)], abstract=node.abstract)
    return out

@rule_of(conv.conv_input_grad)
def _conv_input_grad(w: Writer, node: CNode) -> str:
    dout, weight, x = node.args
    attrs = _conv_attrs(node, x, weight, True)
    try:
        size = w.constant(static_shape(x, "conv"), scalar=True)
    except Unsupported:  # a batch known at run time: x's Shape (a tuple of scalars)
        size = w.emit("Shape", [w.ref(x)])
    return w.emit("Conv2DBackpropInput", [w.ref(dout), w.ref(weight), size], attrs=attrs, abstract=node.abstract)

@rule_of(conv.conv_weight_grad)
def _conv_weight_grad(w: Writer, node: CNode) -> str:
    x, dout, weight = node.args
    return w.emit("Conv2DBackpropFilter", [w.ref(dout), w.ref(x), w.constant(static_shape(weight, "conv"), scalar=True)],
                  attrs=_conv_attrs(node, x, weight, True), abstract=node.abstract)

def _window(node: CNode, x: Node, what: str) -> tuple[tuple[int, int], tuple[int, int]]:
    attrs = dict(node.attrs) if node.attrs else {}
    if rank_of(x, what) != 4:
        raise Unsupported(f"{what} that is not 2-d")
    if attrs.get("padding", 0) not in (0, (0, 0), (0, 0, 0, 0)) or attrs.get("ceil_mode", False) or \
            attrs.get("dilation", 1) not in (1, (1, 1)):
        raise Unsupported(f"{what} with padding, dilation or ceil_mode (MindSpore's VALID pooling only)")
    kernel = attrs.get("kernel")
    stride = attrs.get("stride") or kernel
    pair = (lambda v: (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1])))
    return pair(kernel), pair(stride)

def _maxpool_attrs(kernel: tuple[int, int], stride: tuple[int, int]) -> dict[str, Any]:
    return {"kernel_size": (1, 1, *kernel), "strides": (1, 1, *stride), "pad_mode": "VALID",
            "format": "NCHW"}

def _max_window(node: CNode, x: Node) -> tuple[tuple[int, int], tuple[int, int], list[int]]:
    """(kernel, stride, pads: top, left, bottom, right) of a 2-d max pool; ceil mode is
    padding at the ends (anfir's pool_params widens them), dilation has no MindSpore op."""
    attrs = dict(node.attrs) if node.attrs else {}
    xs = batch_probe(x, "max_pool")
    if len(xs) != 4:
        raise Unsupported("max_pool that is not 2-d")
    if attrs.get("dilation", 1) not in (1, (1, 1)):
        raise Unsupported("max_pool with dilation (MindSpore's MaxPool has none)")
    try:
        _, k, st, pads, _, _ = conv_params_pool(np.broadcast_to(np.zeros((), np.float32), xs), attrs.get("kernel"),
                                                attrs.get("stride"), attrs.get("padding", 0), 1,
                                                attrs.get("ceil_mode", False), "max_pool")
    except Exception as e:  # an AnfirError of the attributes: the node cannot be written
        raise Unsupported(f"max_pool attributes: {e}") from None
    return (int(k[0]), int(k[1])), (int(st[0]), int(st[1])), [int(p) for p in pads]

def _pad_lowest(w: Writer, x: Node, pads: list[int], zero: bool = False) -> tuple[str, tuple[int, ...]]:
    """x padded with the value that never wins a maximum (-inf, an integer's minimum), or
    with zeros (``zero``: an average pool's padding), as Concat with broadcast constant
    blocks: MindSpore's MaxPool and AvgPool pad only as SAME/VALID."""
    if not any(pads):
        return w.ref(x), batch_probe(x, "max_pool")
    try:
        shape = list(static_shape(x, "max_pool"))
    except Unsupported:  # the -inf blocks are constants of the padded axes' full shape
        raise Unsupported("padded max_pool of a batch known only at run time (its -inf padding "
                          "blocks are BroadcastTo of a static shape)") from None
    ref = w.ref(x)
    dtype = dtype_of(x.abstract) or "f32"
    kind = np.dtype(numpy_dtype(dtype))
    if kind.kind not in "fiu":
        raise Unsupported(f"max_pool of {dtype}")
    low = kind.type(0) if zero else kind.type(-np.inf) if kind.kind == "f" else np.iinfo(kind).min
    fill = w.constant(np.asarray(low, kind), dtype)
    for axis, (before, after) in ((2, (pads[0], pads[2])), (3, (pads[1], pads[3]))):
        if before == after == 0:
            continue
        parts = []
        for width, where in ((before, 0), (after, 1)):
            if width:
                block = tuple(width if a == axis else d for a, d in enumerate(shape))
                parts.append((where, broadcast(w, fill, block)))
        items = [p for where, p in parts if where == 0] + [ref] + [p for where, p in parts if where == 1]
        ref = w.emit("Concat", [w.emit("MakeTuple", items), w.constant(axis, scalar=True)])
        shape[axis] += before + after
    return ref, tuple(shape)

@rule_of(conv.max_pool)
def _max_pool(w: Writer, node: CNode) -> str:
    kernel, stride, pads = _max_window(node, node.args[0])
    x, _ = _pad_lowest(w, node.args[0], pads)
    return w.emit("MaxPool", [x], attrs=_maxpool_attrs(kernel, stride), abstract=node.abstract)

@rule_of(conv.max_pool_grad)
def _max_pool_grad(w: Writer, node: CNode) -> str:
    x, dout = node.args
    kernel, stride, pads = _max_window(node, x)
    attrs = _maxpool_attrs(kernel, stride)
    padded, _ = _pad_lowest(w, x, pads)
    out = w.emit("MaxPool", [padded], attrs=attrs)
    grad = w.emit("MaxPoolGrad", [padded, out, w.ref(dout)], attrs=attrs)
    if not any(pads):
        return grad
    # the gradient of the padding cut off: Slice(grad, begin, size)
    xs = static_shape(x, "max_pool")
    return w.emit("Slice", [grad, w.constant((0, 0, pads[0], pads[1]), scalar=True), w.constant(xs, scalar=True)],
                  abstract=node.abstract)

def _avg_inputs(w: Writer, kernel: tuple[int, int], stride: tuple[int, int]) -> list[str]:
    # AvgPool takes (kernel, strides, pad_mode VALID = 2, data_format NCHW = 0) as inputs
    return [w.constant(kernel, scalar=True), w.constant(stride, scalar=True), w.constant(2, scalar=True),
            w.constant(0, scalar=True)]

def _avg_padding(node: CNode, x: Node) -> Optional[tuple[tuple[int, int], tuple[int, int], list[int], Any]]:
    """(kernel, stride, pads top/left/bottom/right, the valid fraction of each window or
    None when pads count) of a padded 2-d average pool; None without padding."""
    attrs = dict(node.attrs) if node.attrs else {}
    if attrs.get("padding", 0) in (0, (0, 0), (0, 0, 0, 0)):
        return None
    if attrs.get("ceil_mode", False) or attrs.get("dilation", 1) not in (1, (1, 1)):
        raise Unsupported("avg_pool with ceil_mode or dilation (MindSpore's AvgPool has neither)")
    xs = static_shape(x, "padded avg_pool")
    if len(xs) != 4:
        raise Unsupported("avg_pool that is not 2-d")
    try:
        _, k, st, pads, _, _ = conv_params_pool(np.broadcast_to(np.zeros((), np.float32), xs), attrs.get("kernel"),
                                                attrs.get("stride"), attrs.get("padding", 0), 1, False, "avg_pool")
    except Exception as e:  # an AnfirError of the attributes: the node cannot be written
        raise Unsupported(f"avg_pool attributes: {e}") from None
    kernel, stride = (int(k[0]), int(k[1])), (int(st[0]), int(st[1]))
    pads = [int(p) for p in pads]
    fraction = None
    if not attrs.get("count_include_pad", True):
        # the share of each window inside x: the mean of a padded mask of ones
        mask = np.pad(np.ones(xs[2:]), ((pads[0], pads[2]), (pads[1], pads[3])))
        oh = (mask.shape[0] - kernel[0]) // stride[0] + 1
        ow = (mask.shape[1] - kernel[1]) // stride[1] + 1
        fraction = np.array([[mask[i * stride[0]:i * stride[0] + kernel[0], j * stride[1]:j * stride[1] + kernel[1]].mean()
                              for j in range(ow)] for i in range(oh)]).reshape(1, 1, oh, ow)
    return kernel, stride, pads, fraction


@rule_of(conv.avg_pool)
def _avg_pool(w: Writer, node: CNode) -> str:
    padded = _avg_padding(node, node.args[0])
    if padded is None:
        kernel, stride = _window(node, node.args[0], "avg_pool")
        return w.emit("AvgPool", [w.ref(node.args[0]), *_avg_inputs(w, kernel, stride)], abstract=node.abstract)
    # AvgPool of x padded with zeros; without counting the pads, divided by each window's
    # share inside x (a constant)
    kernel, stride, pads, fraction = padded
    x, _ = _pad_lowest(w, node.args[0], pads, zero=True)
    out = w.emit("AvgPool", [x, *_avg_inputs(w, kernel, stride)],
                 abstract=node.abstract if fraction is None else None)
    if fraction is None:
        return out
    dtype = dtype_of(node.abstract) or "f32"
    return w.emit("RealDiv", [out, w.constant(fraction.astype(numpy_dtype(dtype)), dtype)], abstract=node.abstract)


@rule_of(conv.avg_pool_grad)
def _avg_pool_grad(w: Writer, node: CNode) -> str:
    dout, x = node.args
    padded = _avg_padding(node, x)
    if padded is None:
        kernel, stride = _window(node, x, "avg_pool")
        out = w.emit("AvgPool", [w.ref(x), *_avg_inputs(w, kernel, stride)])
        return w.emit("AvgPoolGrad", [w.ref(x), out, w.ref(dout), *_avg_inputs(w, kernel, stride)],
                      abstract=node.abstract)
    kernel, stride, pads, fraction = padded
    dtype = dtype_of(node.abstract) or "f32"
    g = w.ref(dout) if fraction is None else w.emit(
        "RealDiv", [w.ref(dout), w.constant(fraction.astype(numpy_dtype(dtype)), dtype)])
    xp, _ = _pad_lowest(w, x, pads, zero=True)
    out = w.emit("AvgPool", [xp, *_avg_inputs(w, kernel, stride)])
    grad = w.emit("AvgPoolGrad", [xp, out, g, *_avg_inputs(w, kernel, stride)])
    # the padding's gradient cut off: Slice(grad, begin, size)
    return w.emit("Slice", [grad, w.constant((0, 0, pads[0], pads[1]), scalar=True),
                            w.constant(static_shape(x, "avg_pool"), scalar=True)], abstract=node.abstract)


@rule_of(conv.channel_sum)
def _channel_sum(w: Writer, node: CNode) -> str:
    rank = rank_of(node.args[0], "channel_sum")
    axes = (0,) + tuple(range(2, rank))
    return w.emit("ReduceSum", [w.ref(node.args[0]), w.constant(axes, scalar=True), w.constant(False, scalar=True),
                                w.constant(False, scalar=True)], abstract=node.abstract)

@rule_of(conv.global_avg_pool)
def _global_avg_pool(w: Writer, node: CNode) -> str:
    rank = rank_of(node.args[0], "global_avg_pool")
    return w.emit("ReduceMean", [w.ref(node.args[0]), w.constant(tuple(range(2, rank)), scalar=True),
                                 w.constant(True, scalar=True)], abstract=node.abstract)

@rule_of(conv.channel_spread)
def _channel_spread(w: Writer, node: CNode) -> str:
    v, like = node.args
    rank = rank_of(like, "channel_spread")
    column = w.emit("Reshape", [w.ref(v), w.constant((-1,) + (1,) * (rank - 2), scalar=True)])
    try:
        return broadcast(w, column, static_shape(like, "channel_spread"), node.abstract)
    except Unsupported:  # a batch known at run time: the product with OnesLike(like) broadcasts
        return w.emit("Mul", [w.emit("OnesLike", [w.ref(like)]), column], abstract=node.abstract)

@rule_of(conv.batch_norm)
def _batch_norm(w: Writer, node: CNode) -> str:
    # MindSpore's own BatchNorm in inference mode (its attributes are inputs 5 to 8:
    # is_training, epsilon, momentum, data_format NCHW = 0); its result 0 is y.
    if rank_of(node.args[0], "batch_norm") != 4:
        raise Unsupported("batch_norm of other than NCHW (MindSpore's BatchNorm is 2-d)")
    dtype = dtype_of(node.abstract)
    if dtype not in TYPE_ID_OF:
        raise Unsupported(f"batch_norm of {dtype}")
    eps = float(node.attrs.get("eps", 1e-5)) if node.attrs else 1e-5
    args = [w.ref(a) if dtype_of(a.abstract) == dtype else
            w.emit("Cast", [w.ref(a), w.constant(TYPE_ID_OF[str(dtype)], scalar=True)]) for a in node.args]
    out = w.emit("BatchNorm", [*args, w.constant(False, scalar=True), w.constant(eps, scalar=True),
                               w.constant(0.1, scalar=True), w.constant(0, scalar=True)])
    return w.emit("TupleGetItem", [out, w.constant(0, scalar=True)], abstract=node.abstract)

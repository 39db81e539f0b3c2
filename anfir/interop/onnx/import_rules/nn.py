"""The ONNX import rules whose result is built from
:mod:`anfir.primitives.nn`: Softmax, the norms, Einsum, the losses, Dropout,
Hardmax, LpNormalization, LRN, the recurrent layers (RNN, GRU, LSTM) and DFT.

See :mod:`anfir.interop.onnx.import_rules` for how a rule is chosen.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import numpy as np

from anfir.dtypes import BY_NAME
from anfir.interop.onnx.common import Ctx, NodeError, OpRule, UseFunctionBody
from anfir.interop.onnx.import_rules.common import (RuleSet, along_axis, call_named, static_dim,
                                                    static_input_shape)
from anfir.ir.nodes import Node
from anfir.ir.primitive import Primitive
from anfir.primitives import arith, elementwise, indexing, nn, reduce, shaping, structure, tensor

RULES = RuleSet()
"""This family's rules (merged into :data:`anfir.interop.onnx.import_rules.OPS`)."""
op = RULES.op


@op("Dropout")
def _dropout(ctx: Ctx) -> Sequence[Optional[Node]]:
    # Inference: the identity (a training_mode input that is a true constant is refused).
    training = ctx.static(2, "training_mode") if ctx.opset >= 12 else None
    ratio = ctx.static(1, "the ratio") if ctx.opset >= 12 else None
    if training is not None and bool(training) and not (ratio is not None and float(ratio) == 0.0):
        # (A zero ratio drops nothing: the identity, as at inference.)
        raise NodeError("Dropout in training mode (anfir imports inference graphs)")
    x = ctx.need(0)
    out: list[Optional[Node]] = [ctx.call(structure.identity, x)]
    if len(ctx.node.output) > 1:
        out.append(ctx.call(tensor.ones_like, ctx.call(tensor.cast, x, "bool")))
    return out


def _wide(ctx: Ctx, node: Node, d: str) -> Node:
    # bf16 operands of the primitives that compute in f32 or wider (softmax, einsum).
    return ctx.call(tensor.cast, node, "f32") if d == "bf16" else node


def _narrow(ctx: Ctx, node: Node, d: str) -> Node:
    return ctx.call(tensor.cast, node, d) if d == "bf16" else node


def _softmax_rule(prim: Primitive) -> OpRule:
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        d = ctx.dtype(0)
        x = _wide(ctx, ctx.need(0), d)
        if ctx.opset >= 13:
            return [_narrow(ctx, ctx.call(prim, x, axis=int(ctx.attr("axis", -1))), d)]
        # Before opset 13 the input is seen as 2-d: the axes before `axis`, and the rest.
        shape = static_input_shape(ctx, 0)
        axis = int(ctx.attr("axis", 1)) % max(len(shape), 1)
        flat = (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))
        y = ctx.call(prim, ctx.call(tensor.reshape, x, flat), axis=-1)
        return [_narrow(ctx, ctx.call(tensor.reshape, y, shape), d)]
    return rule


op("Softmax")(_softmax_rule(nn.softmax))


op("LogSoftmax")(_softmax_rule(nn.log_softmax))


@op("LayerNormalization", 17)
def _layer_norm(ctx: Ctx) -> Sequence[Optional[Node]]:
    x, scale, bias = ctx.need(0), ctx.input(1), ctx.input(2)
    axis, eps = int(ctx.attr("axis", -1)), float(ctx.attr("epsilon", 1e-5))
    args = [x] + ([scale] if scale is not None else []) + ([bias] if bias is not None else [])
    if bias is not None and scale is None:
        raise NodeError("a bias without a scale")
    out: list[Optional[Node]] = [ctx.call(nn.layer_norm, *args, axis=axis, eps=eps)]
    if len(ctx.node.output) > 1:
        # Mean and InvStdDev over the normalized axes, kept as dimensions of size 1.
        rank = ctx.rank(0)
        axes = tuple(range(axis % rank, rank))
        out.append(ctx.call(tensor.mean, x, axis=axes, keepdims=True))
        var = ctx.call(reduce.var, x, axis=axes, keepdims=True)
        out.append(ctx.call(elementwise.rsqrt, ctx.call(arith.add, var, ctx.const(eps, ctx.dtype(0)))))
    return out


@op("RMSNormalization", 23)
def _rms_norm(ctx: Ctx) -> Sequence[Optional[Node]]:
    x, scale = ctx.need(0), ctx.input(1)
    args = [x] + ([scale] if scale is not None else [])
    return [ctx.call(nn.rms_norm, *args, axis=int(ctx.attr("axis", -1)),
                     eps=float(ctx.attr("epsilon", 1e-5)))]


@op("InstanceNormalization")
def _instance_norm(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(nn.instance_norm, ctx.need(0), ctx.need(1), ctx.need(2),
                     eps=float(ctx.attr("epsilon", 1e-5)))]


@op("GroupNormalization", 21)
def _group_norm(ctx: Ctx) -> Sequence[Optional[Node]]:
    groups = np.array(int(ctx.attr("num_groups")), dtype=np.int64)
    return [ctx.call(nn.group_norm, ctx.need(0), int(groups), ctx.need(1), ctx.need(2),
                     eps=float(ctx.attr("epsilon", 1e-5)))]


def explicit_einsum(equation: str) -> str:
    """An einsum equation in explicit form: ONNX's implicit ``ij,jk`` is ``ij,jk->ik``
    (the letters used once, in alphabetical order, after any ``...``)."""
    equation = equation.replace(" ", "")
    if "->" in equation:
        return equation
    letters = [c for c in equation if c.isalpha()]
    once = sorted(c for c in set(letters) if letters.count(c) == 1)
    return equation + "->" + ("..." if "..." in equation else "") + "".join(once)


@op("Einsum", 12)
def _einsum(ctx: Ctx) -> Sequence[Optional[Node]]:
    spec = explicit_einsum(str(ctx.attr("equation")))
    d = ctx.dtype(0)
    args = [_wide(ctx, a, d) for a in ctx.inputs() if a is not None]
    return [_narrow(ctx, ctx.call(nn.einsum, spec, *args), d)]


def _loss_reduction(ctx: Ctx) -> str:
    reduction = str(ctx.attr("reduction", "mean"))
    if reduction not in ("mean", "sum", "none"):
        raise NodeError(f"reduction {reduction!r}")
    return reduction


@op("NegativeLogLikelihoodLoss", 12)
def _nll_loss(ctx: Ctx) -> Sequence[Optional[Node]]:
    if ctx.input(2) is not None or ctx.attr("ignore_index") is not None:
        # The schema's function body computes those (with gathers and a where).
        raise UseFunctionBody("class weights and ignore_index (anfir's nll_loss has neither)")
    return [ctx.call(nn.nll_loss, ctx.need(0), ctx.need(1), axis=1,
                     reduction=_loss_reduction(ctx))]


@op("SoftmaxCrossEntropyLoss", 12)
def _cross_entropy(ctx: Ctx) -> Sequence[Optional[Node]]:
    if ctx.input(2) is not None or ctx.attr("ignore_index") is not None:
        raise UseFunctionBody("class weights and ignore_index (anfir's cross_entropy has neither)")
    x, t = ctx.need(0), ctx.need(1)
    out: list[Optional[Node]] = [ctx.call(nn.cross_entropy, x, t, axis=1,
                                          reduction=_loss_reduction(ctx))]
    if len(ctx.node.output) > 1:
        out.append(ctx.call(nn.log_softmax, x, axis=1))
    return out


@op("Hardmax")
def _hardmax(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    d = ctx.dtype(0)
    if ctx.opset >= 13:
        rank = ctx.rank(0)
        axis = int(ctx.attr("axis", -1)) % rank
        length = static_dim(ctx, 0, axis)
        flat, shape = x, None
    else:
        # Before opset 13 the input is seen as 2-d, as Softmax.
        shape = static_input_shape(ctx, 0)
        cut = int(ctx.attr("axis", 1)) % max(len(shape), 1)
        rows, length = int(np.prod(shape[:cut])), int(np.prod(shape[cut:]))
        flat, rank, axis = ctx.call(tensor.reshape, x, (rows, length)), 2, 1
    # The first largest element along the axis (ties: the lowest index, as ONNX).
    top = ctx.call(reduce.argmax, flat, axis=axis, keepdims=True)
    hot = ctx.call(arith.eq, top, along_axis(ctx, np.arange(length, dtype=np.int64), rank, axis))
    out = ctx.call(tensor.cast, hot, d)
    return [out if shape is None else ctx.call(tensor.reshape, out, shape)]


@op("LpNormalization")
def _lp_normalization(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    p = int(ctx.attr("p", 2))
    axis = int(ctx.attr("axis", -1))
    if p == 1:
        norm = ctx.call(tensor.sum_, ctx.call(arith.abs_, x), axis=axis, keepdims=True)
    elif p == 2:
        norm = ctx.call(arith.sqrt, ctx.call(tensor.sum_, ctx.call(arith.mul, x, x), axis=axis, keepdims=True))
    else:
        raise NodeError(f"LpNormalization with p={p} (ONNX allows 1 and 2)")
    # A zero norm leaves the zeros as they are (ONNX's reference), not 0/0.
    zero = ctx.call(arith.eq, norm, ctx.const(0, ctx.dtype(0)))
    safe = ctx.call(tensor.where, zero, ctx.const(1, ctx.dtype(0)), norm)
    return [ctx.call(arith.div, x, safe)]


@op("LRN")
def _lrn(ctx: Ctx) -> Sequence[Optional[Node]]:
    # x / (bias + alpha/size * sum of squares over a window of channels) ** beta;
    # the window sum as the sum of `size` shifted slices of the zero-padded squares.
    x = ctx.need(0)
    d = ctx.dtype(0)
    rank = ctx.rank(0)
    size = int(ctx.attr("size"))
    alpha, beta, bias = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75)), float(ctx.attr("bias", 1.0))
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    channels = static_dim(ctx, 0, 1)
    pads = [0] * (2 * rank)
    pads[1], pads[rank + 1] = before, after
    padded = ctx.call(shaping.pad, ctx.call(arith.mul, x, x), pads=tuple(pads), mode="constant", value=0)
    total: Optional[Node] = None
    for k in range(size):
        piece = ctx.call(shaping.slice_, padded, starts=(k,), ends=(k + channels,), axes=(1,))
        total = piece if total is None else ctx.call(arith.add, total, piece)
    assert total is not None
    base = ctx.call(arith.add, ctx.const(bias, d), ctx.call(arith.mul, ctx.const(alpha / size, d), total))
    return [ctx.call(arith.div, x, ctx.call(arith.pow_, base, ctx.const(beta, d)))]


def _activation(ctx: Ctx, name: str, alpha: Optional[float], beta: Optional[float]) -> Callable[[Node], Node]:
    """One of the activation functions the recurrent ops name."""
    d = ctx.dtype(0)
    if name == "Sigmoid":
        return lambda v: ctx.call(arith.sigmoid, v)
    if name == "Tanh":
        return lambda v: ctx.call(arith.tanh, v)
    if name == "Relu":
        return lambda v: ctx.call(arith.relu, v)
    if name == "HardSigmoid":
        a, b = 0.2 if alpha is None else alpha, 0.5 if beta is None else beta
        return lambda v: ctx.call(elementwise.hard_sigmoid, v, alpha=a, beta=b)
    if name == "LeakyRelu":
        a = 0.01 if alpha is None else alpha
        return lambda v: ctx.call(elementwise.leaky_relu, v, alpha=a)
    if name == "ScaledTanh":
        a, b = 1.0 if alpha is None else alpha, 1.0 if beta is None else beta
        return lambda v: ctx.call(arith.mul, ctx.const(a, d), ctx.call(arith.tanh, ctx.call(arith.mul, ctx.const(b, d), v)))
    if name == "Affine":
        a, b = 1.0 if alpha is None else alpha, 0.0 if beta is None else beta
        return lambda v: ctx.call(arith.add, ctx.call(arith.mul, ctx.const(a, d), v), ctx.const(b, d))
    raise NodeError(f"the activation {name!r}")


def _recurrent(ctx: Ctx, gates: int, defaults: Sequence[str]) -> list[Optional[Node]]:
    """RNN (1 gate), GRU (3) and LSTM (4): each time step built in line, per direction."""
    layout = int(ctx.attr("layout", 0))
    x = ctx.need(0)
    if layout:
        x = ctx.call(tensor.transpose, x, (1, 0, 2))
    # Only the number of steps must be static (the loop is unrolled); the batch
    # may be symbolic (torch.onnx.export's dynamic batch): the zero initial
    # state takes its size from x.
    steps = static_dim(ctx, 0, 1 if layout else 0)
    hidden = int(ctx.attr("hidden_size"))
    direction = str(ctx.attr("direction", "forward"))
    dirs = 2 if direction == "bidirectional" else 1
    d = ctx.dtype(0)
    raw_lens = ctx.static(4, "the sequence lengths") if ctx.input(4) is not None else None
    if raw_lens is not None and not np.all(raw_lens == steps):
        raise NodeError("sequences of different lengths (sequence_lens)")
    names = [str(a) for a in ctx.attr("activations", [])] or list(defaults) * dirs
    alphas, betas = ctx.attr("activation_alpha", []), ctx.attr("activation_beta", [])
    per = len(defaults)
    acts = [_activation(ctx, n, alphas[k] if k < len(alphas) else None, betas[k] if k < len(betas) else None)
            for k, n in enumerate(names)]
    clip = ctx.attr("clip")
    ys: list[list[Node]] = []
    finals_h: list[Node] = []
    finals_c: list[Node] = []
    for k in range(dirs):
        pick = ctx.const(k, "i64")
        w = ctx.call(tensor.transpose, ctx.call(indexing.gather, ctx.need(1), pick, axis=0))
        r = ctx.call(tensor.transpose, ctx.call(indexing.gather, ctx.need(2), pick, axis=0))
        bias = ctx.input(3)
        if bias is not None:
            both = ctx.call(indexing.gather, bias, pick, axis=0)
            halves = call_named(ctx, shaping.split, [both], {"sizes": 2, "axis": 0})
            wb, rb = (ctx.call(structure.tuple_getitem, halves, i) for i in range(2))
        else:
            wb = rb = ctx.const(np.zeros(gates * hidden, dtype=BY_NAME[d].numpy))
        # (batch, 1) zeros from x's first step, broadcast against (1, hidden):
        # shapes inference follows, with a symbolic batch.
        column = ctx.call(shaping.slice_, ctx.call(structure.zeros_like, ctx.call(indexing.gather, x, ctx.const(0, "i64"), axis=0)),
                          starts=(0,), ends=(1,), axes=(1,))
        zeros = ctx.call(arith.add, column, ctx.const(np.zeros((1, hidden), dtype=BY_NAME[d].numpy)))
        h = zeros if ctx.input(5) is None else ctx.call(indexing.gather, ctx.need(5), pick, axis=0)
        c = zeros if ctx.input(6) is None else ctx.call(indexing.gather, ctx.need(6), pick, axis=0)
        peep = None if ctx.input(7) is None or gates != 4 else ctx.call(indexing.gather, ctx.need(7), pick, axis=0)
        f, g = acts[per * k], acts[per * k + 1] if per > 1 else acts[per * k]
        act_h = acts[per * k + 2] if per > 2 else g
        reverse = direction == "reverse" or k == 1
        outs: list[Node] = [zeros] * steps
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            xt = ctx.call(indexing.gather, x, ctx.const(t, "i64"), axis=0)
            xw = ctx.call(arith.add, ctx.call(tensor.matmul, xt, w), wb)

            def part(v: Node, i: int) -> Node:
                return ctx.call(shaping.slice_, v, starts=(i * hidden,), ends=((i + 1) * hidden,), axes=(1,))

            def clipped(v: Node) -> Node:
                if clip is None:
                    return v
                return ctx.call(elementwise.clip, v, ctx.const(-float(clip), d), ctx.const(float(clip), d))

            if gates == 1:
                hr = ctx.call(arith.add, ctx.call(tensor.matmul, h, r), rb)
                h = f(clipped(ctx.call(arith.add, xw, hr)))
            elif gates == 3:
                hr = ctx.call(arith.add, ctx.call(tensor.matmul, h, r), rb)
                z = f(clipped(ctx.call(arith.add, part(xw, 0), part(hr, 0))))
                rt = f(clipped(ctx.call(arith.add, part(xw, 1), part(hr, 1))))
                if ctx.attr("linear_before_reset", 0):
                    cand = ctx.call(arith.mul, rt, part(hr, 2))
                else:
                    rh = ctx.call(tensor.matmul, ctx.call(arith.mul, rt, h), part_w(ctx, r, 2, hidden))
                    cand = ctx.call(arith.add, rh, part(rb_row(ctx, rb), 2))
                hh = g(clipped(ctx.call(arith.add, part(xw, 2), cand)))
                one = ctx.const(1, d)
                h = ctx.call(arith.add, ctx.call(arith.mul, ctx.call(arith.sub, one, z), hh), ctx.call(arith.mul, z, h))
            else:
                hr = ctx.call(arith.add, ctx.call(tensor.matmul, h, r), rb)
                pre = ctx.call(arith.add, xw, hr)
                gi, go, gf, gc = (part(pre, i) for i in range(4))
                if peep is not None:
                    pi, po, pf = (ctx.call(shaping.slice_, peep, starts=(i * hidden,), ends=((i + 1) * hidden,), axes=(0,))
                                  for i in range(3))
                    gi = ctx.call(arith.add, gi, ctx.call(arith.mul, pi, c))
                    gf = ctx.call(arith.add, gf, ctx.call(arith.mul, pf, c))
                it = f(clipped(gi))
                ft = ctx.call(arith.sub, ctx.const(1, d), it) if ctx.attr("input_forget", 0) else f(clipped(gf))
                c = ctx.call(arith.add, ctx.call(arith.mul, ft, c), ctx.call(arith.mul, it, g(clipped(gc))))
                if peep is not None:
                    go = ctx.call(arith.add, go, ctx.call(arith.mul, po, c))
                h = ctx.call(arith.mul, f(clipped(go)), act_h(c))
            outs[t] = h
        ys.append(outs)
        finals_h.append(h)
        finals_c.append(c)
    # Y: (steps, directions, batch, hidden); Y_h, Y_c: (directions, batch, hidden).
    per_step = [ctx.call(shaping.stack, ctx.call(structure.make_tuple, *[ys[k][t] for k in range(dirs)]), axis=0)
                for t in range(steps)]
    y = ctx.call(shaping.stack, ctx.call(structure.make_tuple, *per_step), axis=0)
    y_h = ctx.call(shaping.stack, ctx.call(structure.make_tuple, *finals_h), axis=0)
    y_c = ctx.call(shaping.stack, ctx.call(structure.make_tuple, *finals_c), axis=0)
    if layout:
        y = ctx.call(tensor.transpose, y, (2, 0, 1, 3))
        y_h = ctx.call(tensor.transpose, y_h, (1, 0, 2))
        y_c = ctx.call(tensor.transpose, y_c, (1, 0, 2))
    results: list[Optional[Node]] = [y, y_h, y_c]
    return results[:max(len(ctx.node.output), 1)]


def part_w(ctx: Ctx, r: Node, i: int, hidden: int) -> Node:
    """Columns ``i*hidden ... (i+1)*hidden`` of a transposed recurrence weight."""
    return ctx.call(shaping.slice_, r, starts=(i * hidden,), ends=((i + 1) * hidden,), axes=(1,))


def rb_row(ctx: Ctx, rb: Node) -> Node:
    """A bias vector as one row (its gates then slice along axis 1)."""
    return ctx.call(shaping.unsqueeze, rb, axis=0)


op("RNN", 7)(lambda ctx: _recurrent(ctx, 1, ("Tanh",)))


op("GRU", 7)(lambda ctx: _recurrent(ctx, 3, ("Sigmoid", "Tanh")))


op("LSTM", 7)(lambda ctx: _recurrent(ctx, 4, ("Sigmoid", "Tanh", "Tanh")))


def _inverse_real_dft(ctx: Ctx, x: Node, axis: int, n: int, length: int, d: str) -> Node:
    """x_j = (X_0 + 2 sum_k (Re X_k cos - Im X_k sin)(2 pi j k / L) [+ X_L/2]) / L, the
    imaginary parts of X_0 and of the Nyquist term ignored, as numpy's irfft."""
    rank = ctx.rank(0)
    inner = rank - 1
    used = min(n, length // 2 + 1)
    re = ctx.call(indexing.gather, x, ctx.const(0, "i64"), axis=rank - 1)
    im = ctx.call(indexing.gather, x, ctx.const(1, "i64"), axis=rank - 1) if static_dim(ctx, 0, rank - 1) == 2 else None
    if used < n:
        re = ctx.call(shaping.slice_, re, starts=(0,), ends=(used,), axes=(axis,))
        im = None if im is None else ctx.call(shaping.slice_, im, starts=(0,), ends=(used,), axes=(axis,))
    j = np.arange(length).reshape(-1, 1)
    k = np.arange(used).reshape(1, -1)
    weight = np.where((k == 0) | (2 * k == length), 1.0, 2.0) / length
    angle = 2 * np.pi * ((j * k) % length) / length
    letters = "abcdefghijklmnopqrstuvwxy"[:inner]
    spec = f"{letters},z{letters[axis]}->{letters[:axis]}z{letters[axis + 1:]}"
    out = ctx.call(nn.einsum, spec, re, ctx.const(weight * np.cos(angle)))
    if im is not None:
        sine = np.where((k == 0) | (2 * k == length), 0.0, weight * np.sin(angle))
        out = ctx.call(arith.sub, out, ctx.call(nn.einsum, spec, im, ctx.const(sine)))
    return ctx.call(tensor.cast, ctx.call(shaping.unsqueeze, out, axis=rank - 1), d)


@op("DFT", 17)
def _dft(ctx: Ctx) -> Sequence[Optional[Node]]:
    # The transform along one axis as two products with cosine and sine matrices
    # (a static length), in f64 as ONNX's reference computes it; the last axis of
    # input and output holds (real, imaginary).
    rank = ctx.rank(0)
    if ctx.opset >= 20:
        raw_axis = ctx.static(2, "the axis")
        axis = -2 if raw_axis is None else int(raw_axis.reshape(-1)[0])
    else:
        axis = int(ctx.attr("axis", 1))
    axis %= rank
    if axis == rank - 1:
        raise NodeError("DFT along the last axis (it holds the real and imaginary parts)")
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    d = ctx.dtype(0)
    x = ctx.call(tensor.cast, ctx.need(0), "f64")
    n = static_dim(ctx, 0, axis)
    raw_length = ctx.static(1, "the DFT length")
    given = raw_length is not None and raw_length.size > 0
    if inverse and onesided:
        # A one-sided spectrum back to a real signal (numpy's irfft).
        length = int(raw_length.reshape(-1)[0]) if given else 2 * (n - 1)  # type: ignore[union-attr]
        return [_inverse_real_dft(ctx, x, axis, n, length, d)]
    length = n if not given else int(raw_length.reshape(-1)[0])  # type: ignore[union-attr]
    parts = static_dim(ctx, 0, rank - 1)
    re = ctx.call(indexing.gather, x, ctx.const(0, "i64"), axis=rank - 1)
    im = ctx.call(indexing.gather, x, ctx.const(1, "i64"), axis=rank - 1) if parts == 2 else None
    inner = rank - 1

    def fit(v: Node) -> Node:
        # Truncated or zero-padded to the transform's length.
        if length < n:
            return ctx.call(shaping.slice_, v, starts=(0,), ends=(length,), axes=(axis,))
        if length > n:
            pads = [0] * (2 * inner)
            pads[inner + axis] = length - n
            return ctx.call(shaping.pad, v, pads=tuple(pads), mode="constant", value=0)
        return v

    re = fit(re)
    im = None if im is None else fit(im)
    outputs = length // 2 + 1 if onesided else length
    k = np.arange(outputs).reshape(-1, 1)
    j = np.arange(length).reshape(1, -1)
    angle = 2 * np.pi * ((k * j) % length) / length
    cos, sin = np.cos(angle), np.sin(angle)
    letters = "abcdefghijklmnopqrstuvwxy"[:inner]
    spec = f"{letters},z{letters[axis]}->{letters[:axis]}z{letters[axis + 1:]}"

    def times(v: Node, m: np.ndarray) -> Node:
        return ctx.call(nn.einsum, spec, v, ctx.const(m))

    sign = 1.0 if inverse else -1.0
    # (a + ib)(cos + i*sign*sin) = a cos - sign b sin + i (b cos + sign a sin)
    out_re = times(re, cos)
    out_im = times(re, sign * sin)
    if im is not None:
        out_re = ctx.call(arith.sub, out_re, times(im, sign * sin))
        out_im = ctx.call(arith.add, out_im, times(im, cos))
    if inverse:
        scale = ctx.const(1.0 / length, "f64")
        out_re, out_im = ctx.call(arith.mul, out_re, scale), ctx.call(arith.mul, out_im, scale)
    out = ctx.call(shaping.stack, ctx.call(structure.make_tuple, out_re, out_im), axis=-1)
    return [ctx.call(tensor.cast, out, d)]

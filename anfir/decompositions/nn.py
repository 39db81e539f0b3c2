"""Expansions of the neural-network family (anfir/primitives/nn.py): softmax and its
logarithm, the normalisations, the losses, attention and their internal helpers."""

from __future__ import annotations

import numpy as np

from anfir.decompositions.builder import ExpansionBuilder, Decomposition
from anfir.decompositions.common import (
    as_dtype, channel_view_of, count_ratio, mean_of, optional, out_dtype, reduced,
)
from anfir.dtypes import numpy_dtype
from anfir.ir.nodes import Node
from anfir.ir.primitive import Primitive
from anfir.primitives import arith, gradient, indexing, nn, nn_kernels, reduce, shaping, structure, tensor


def _softmax(b: ExpansionBuilder) -> Node:
    """exp(x - max) / sum(exp(x - max)) along the axis: no overflow."""
    x = as_dtype(b, b.arg(0), out_dtype(b))
    axis = int(b.attrs["axis"])
    shifted = b.call(arith.exp, b.call(arith.sub, x, reduced(b, reduce.max_, x, axis, True)))
    return b.call(arith.div, shifted, reduced(b, tensor.sum_, shifted, axis, True))


def log_softmax_of(b: ExpansionBuilder, x: Node, axis: int) -> Node:
    """(x - max) - log(sum(exp(x - max))) along ``axis``."""
    shifted = b.call(arith.sub, x, reduced(b, reduce.max_, x, axis, True))
    total = reduced(b, tensor.sum_, b.call(arith.exp, shifted), axis, True)
    return b.call(arith.sub, shifted, b.call(arith.log, total))


def _log_softmax(b: ExpansionBuilder) -> Node:
    """log_softmax without overflow."""
    return log_softmax_of(b, as_dtype(b, b.arg(0), out_dtype(b)), int(b.attrs["axis"]))


def normalise(b: ExpansionBuilder, x: Node, axes: tuple[int, ...], eps: float) -> Node:
    """(x - mean) / sqrt(var + eps) over ``axes``, in x's dtype (as anfir computes it)."""
    centred = b.call(arith.sub, x, mean_of(b, x, axes))
    var = mean_of(b, b.call(arith.mul, centred, centred), axes)
    return b.call(arith.div, centred, b.call(arith.sqrt, b.call(arith.add, var, float(eps))))


def _tail(b: ExpansionBuilder, x: Node) -> tuple[int, ...]:
    return nn_kernels.tail_axes(b.rank(x), int(b.attrs["axis"]))


def _layer_norm(b: ExpansionBuilder) -> Node:
    """Normalised over the axes from ``axis``, times scale, plus bias."""
    d = out_dtype(b)
    x = as_dtype(b, b.arg(0), d)
    y = normalise(b, x, _tail(b, x), float(b.attrs["eps"]))
    for index, prim in ((1, arith.mul), (2, arith.add)):
        given = optional(b, index)
        if given is not None:
            y = b.call(prim, y, as_dtype(b, given, d))
    return y


def _rms_norm(b: ExpansionBuilder) -> Node:
    """x / sqrt(mean(x²) + eps) over the axes from ``axis``, times scale."""
    d = out_dtype(b)
    x = as_dtype(b, b.arg(0), d)
    mean = mean_of(b, b.call(arith.mul, x, x), _tail(b, x))
    y = b.call(arith.div, x, b.call(arith.sqrt, b.call(arith.add, mean, float(b.attrs["eps"]))))
    scale = optional(b, 1)
    return y if scale is None else b.call(arith.mul, y, as_dtype(b, scale, d))


def _affine(b: ExpansionBuilder, normal: Node, rank: int, d: str) -> Node:
    """normal * scale + bias, the last two inputs seen per channel."""
    scale, bias = (as_dtype(b, b.arg(i), d) for i in (len(b.inputs) - 2, len(b.inputs) - 1))
    scaled = b.call(arith.mul, normal, channel_view_of(b, scale, rank))
    return b.call(arith.add, scaled, channel_view_of(b, bias, rank))


def _instance_norm(b: ExpansionBuilder) -> Node:
    """Each (sample, channel) plane normalised, then the per-channel affine map."""
    d = out_dtype(b)
    x = as_dtype(b, b.arg(0), d)
    rank = b.rank(x)
    return _affine(b, normalise(b, x, tuple(range(2, rank)), float(b.attrs["eps"])), rank, d)


def _group_norm(b: ExpansionBuilder) -> Node:
    """Groups of channels normalised together (x viewed as (N, groups, -1)), then the
    per-channel affine map."""
    d = out_dtype(b)
    x = as_dtype(b, b.arg(0), d)
    rank = b.rank(x)
    groups = int(b.static(b.arg(1)))
    viewed = b.call(tensor.reshape, x, b.shape_of([b.dim(x, 0), groups, -1]))
    normal = normalise(b, viewed, (2,), float(b.attrs["eps"]))
    normal = b.call(tensor.reshape, normal, b.shape_of([b.dim(x, i) for i in range(rank)]))
    return _affine(b, normal, rank, d)


def _channel_view(b: ExpansionBuilder) -> Node:
    """A (C,) vector as (C, 1, ..., 1) against x."""
    return channel_view_of(b, b.arg(0), b.rank(b.arg(1)))


def _group_view(b: ExpansionBuilder) -> Node:
    """(N, C, ...) as (N, groups, -1)."""
    x = b.arg(0)
    return b.call(tensor.reshape, x, b.shape_of([b.dim(x, 0), int(b.static(b.arg(1))), -1]))


def _tail_mean(b: ExpansionBuilder) -> Node:
    """The mean over the axes from ``axis`` to the end, kept."""
    x = as_dtype(b, b.arg(0), out_dtype(b))
    return mean_of(b, x, _tail(b, x))


def _swap_last(b: ExpansionBuilder) -> Node:
    """The last two axes exchanged."""
    rank = b.rank(b.arg(0))
    if rank < 2:
        raise b.decline("swap_last of a tensor of rank < 2")
    return b.call(tensor.transpose, b.arg(0), tuple(range(rank - 2)) + (rank - 1, rank - 2))


def _scale(b: ExpansionBuilder, q: Node) -> float | Node:
    """The attention scale: the attribute, or 1 / sqrt(E) (computed at run time when E,
    q's last dimension, is symbolic)."""
    scale = b.attrs.get("scale")
    if scale is not None:
        return float(scale)
    if not b.rank(q):
        raise b.decline("attention of a 0-d q")
    last = b.dim(q, -1)
    if isinstance(last, int):
        return nn_kernels.default_scale((last,), None)
    return b.call(arith.div, 1.0, b.call(arith.sqrt, b.call(tensor.cast, last, "f64")))


def _probs(b: ExpansionBuilder, q: Node, k: Node, mask: Node | None) -> Node:
    """softmax(q @ kᵀ * scale + mask) over the last axis (causal: keys j <= i)."""
    d = out_dtype(b)
    q = as_dtype(b, q, d)
    k = as_dtype(b, k, d)
    rank = b.rank(k)
    swapped = b.call(tensor.transpose, k, tuple(range(rank - 2)) + (rank - 1, rank - 2))
    logits = b.call(arith.mul, b.call(tensor.matmul, q, swapped), _scale(b, q))
    keep: Node | None = None
    if b.attrs.get("causal"):
        length, keys = b.shape(q)[-2], b.shape(k)[-2]
        if not isinstance(length, int) or not isinstance(keys, int):
            raise b.decline("a causal attention needs known sequence lengths")
        keep = b.const(np.tril(np.ones((length, keys), dtype=bool)))
    if mask is not None:
        if b.dtype(mask) == "bool":
            keep = mask if keep is None else b.call(arith.logical_and, keep, mask)
        else:
            logits = b.call(arith.add, logits, as_dtype(b, mask, d))
    if keep is not None:
        logits = b.call(tensor.where, keep, logits, -np.inf)
    return b.call(nn.softmax, logits, axis=-1)


def _attention(b: ExpansionBuilder) -> Node:
    """softmax(q kᵀ scale + mask) v."""
    d = out_dtype(b)
    return b.call(tensor.matmul, _probs(b, b.arg(0), b.arg(1), optional(b, 3)),
                  as_dtype(b, b.arg(2), d))


def _attention_probs(b: ExpansionBuilder) -> Node:
    """The weights of attention."""
    return _probs(b, b.arg(0), b.arg(1), optional(b, 2))


def _attention_scale(b: ExpansionBuilder) -> Node:
    """The scale attention uses (a constant when q's last dimension is known)."""
    scale = _scale(b, b.arg(0))
    return scale if isinstance(scale, Node) else b.const(scale)


def _mask_cotangent(b: ExpansionBuilder) -> Node:
    """Zeros for a bool mask, else the gradient summed to the mask's shape."""
    g, mask = b.arg(0), b.arg(1)
    if b.dtype(mask) == "bool":
        return b.call(tensor.cast, b.call(structure.zeros_like, mask), out_dtype(b))
    return b.call(gradient.sum_to, g, mask)


def loss_reduced(b: ExpansionBuilder, x: Node, reduction: str) -> Node:
    """A per-element loss reduced as asked (none, sum, mean)."""
    if reduction == "none":
        return x
    return reduced(b, tensor.sum_ if reduction == "sum" else tensor.mean, x, None, False)


def _loss_reduce(b: ExpansionBuilder) -> Node:
    """Identity, sum or mean."""
    return loss_reduced(b, as_dtype(b, b.arg(0), out_dtype(b)), str(b.attrs["reduction"]))


def _loss_spread(b: ExpansionBuilder) -> Node:
    """Identity, or the gradient spread over like's shape (divided by its size for mean)."""
    d = out_dtype(b)
    g, like = as_dtype(b, b.arg(0), d), b.arg(1)
    reduction = str(b.attrs["reduction"])
    if reduction == "none":
        return g
    if reduction == "mean":
        count = b.call(arith.maximum, b.call(gradient.size, like), 1)
        g = b.call(arith.div, g, b.call(tensor.cast, count, d))
    return b.call(tensor.broadcast_to, g, b.call(tensor.shape, like))


def one_hot(b: ExpansionBuilder, target: Node, like: Node, axis: int, d: str) -> Node:
    """One-hot of the class indices along ``axis`` of ``like``, in dtype ``d``."""
    rank = b.rank(like)
    ax = axis % rank
    classes = b.shape(like)[ax]
    labels: Node
    if isinstance(classes, int):
        labels = b.const(np.arange(classes, dtype=np.int64).reshape([-1] + [1] * (rank - ax - 1)))
    else:  # counted at run time: arange(0, shape(like)[ax])
        count = b.call(structure.tuple_getitem, b.call(tensor.shape, like), ax)
        labels = b.call(indexing.arange, 0, count)
        if rank - ax - 1:
            labels = b.call(shaping.unsqueeze, labels, axis=tuple(range(1, rank - ax)))
    picked = b.call(arith.eq, b.call(shaping.unsqueeze, as_dtype(b, target, "i64"), axis=ax), labels)
    return b.call(tensor.cast, picked, d)


def _class_mask(b: ExpansionBuilder) -> Node:
    """One-hot of the targets."""
    return one_hot(b, b.arg(0), b.arg(1), int(b.attrs["axis"]), out_dtype(b))


def _nll(log_softmax: bool) -> Decomposition:
    """nll_loss (cross_entropy: log_softmax first) from a one-hot mask."""
    def rule(b: ExpansionBuilder) -> Node:
        d = out_dtype(b)
        axis = int(b.attrs["axis"])
        lp = as_dtype(b, b.arg(0), d)
        if log_softmax:
            lp = b.call(nn.log_softmax, lp, axis=axis)
        mask = one_hot(b, b.arg(1), b.arg(0), axis, d)
        picked = b.call(arith.neg, reduced(b, tensor.sum_, b.call(arith.mul, lp, mask), axis, False))
        return loss_reduced(b, picked, str(b.attrs["reduction"]))
    rule.__doc__ = "cross entropy" if log_softmax else "negative log-likelihood"
    return rule


def _mse_loss(b: ExpansionBuilder) -> Node:
    """The reduced squared difference."""
    d = out_dtype(b)
    diff = b.call(arith.sub, as_dtype(b, b.arg(0), d), as_dtype(b, b.arg(1), d))
    return loss_reduced(b, b.call(arith.mul, diff, diff), str(b.attrs["reduction"]))


def _dropout(b: ExpansionBuilder) -> Node:
    """x unless training; then x times the mask drawn now from the constant seed (a
    target's own generator would give another mask than anfir.run)."""
    x = b.arg(0)
    if not b.attrs.get("training"):
        return x
    shape = b.static_shape(x)
    rate, key = float(b.static(b.arg(1))), int(b.static(b.arg(2)))
    if rate == 1.0:
        return b.call(arith.mul, x, 0)
    dtype = numpy_dtype(out_dtype(b))
    keep = nn_kernels.dropout_keep(shape, rate, key).astype(dtype) / (1.0 - rate)
    return b.call(arith.mul, x, b.const(keep.astype(dtype)))


DECOMPOSITIONS: dict[Primitive, Decomposition] = {
    nn.softmax: _softmax,
    nn.log_softmax: _log_softmax,
    nn.layer_norm: _layer_norm,
    nn.rms_norm: _rms_norm,
    nn.group_norm: _group_norm,
    nn.instance_norm: _instance_norm,
    nn.attention: _attention,
    nn.attention_probs: _attention_probs,
    nn.attention_scale: _attention_scale,
    nn.swap_last: _swap_last,
    nn.mask_cotangent: _mask_cotangent,
    nn.cross_entropy: _nll(log_softmax=True),
    nn.nll_loss: _nll(log_softmax=False),
    nn.mse_loss: _mse_loss,
    nn.dropout: _dropout,
    nn.tail_mean: _tail_mean,
    nn.loss_reduce: _loss_reduce,
    nn.loss_spread: _loss_spread,
    nn.class_mask: _class_mask,
    nn.channel_view: _channel_view,
    nn.group_view: _group_view,
}
"""The nn family's expansions."""

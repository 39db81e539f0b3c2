"""The array kernels of the neural-network operators, written once over an array
module ``xp`` (numpy for the evaluator, ``jax.numpy`` for the JAX back end), so
the two compute the same formula.

Nothing here knows about the IR: :mod:`anfir.primitives.nn` declares the
primitives with these kernels bound to numpy, and
:mod:`anfir.backends.tojax.rules` binds them to ``jax.numpy``.  Attributes
arrive checked.
"""

from __future__ import annotations

import math
from typing import Any, Optional, Sequence

import numpy as np


def float_of(xp: Any, x: Any) -> Any:
    """``x`` as an array of its float dtype (integers and bools as f64)."""
    array = xp.asarray(x)
    if xp.issubdtype(array.dtype, xp.floating):
        return array
    return array.astype(xp.float64)


def tail_axes(rank: int, axis: int) -> tuple[int, ...]:
    """The axes from ``axis`` (negative counts from the end) to the last."""
    start = axis + rank if axis < 0 else axis
    return tuple(range(start, rank))


def softmax(xp: Any, x: Any, axis: Any) -> Any:
    """exp(x - max) / sum(exp(x - max)) along ``axis``: no overflow."""
    x = float_of(xp, x)
    if x.size == 0:
        return x
    shifted = xp.exp(x - xp.max(x, axis=axis, keepdims=True))
    return shifted / xp.sum(shifted, axis=axis, keepdims=True)


def log_softmax(xp: Any, x: Any, axis: Any) -> Any:
    """x - max - log(sum(exp(x - max))) along ``axis``: no overflow."""
    x = float_of(xp, x)
    if x.size == 0:
        return x
    shifted = x - xp.max(x, axis=axis, keepdims=True)
    return shifted - xp.log(xp.sum(xp.exp(shifted), axis=axis, keepdims=True))


def tail_mean(xp: Any, x: Any, axis: int) -> Any:
    """The mean over the axes from ``axis`` to the end, kept as 1."""
    x = float_of(xp, x)
    return xp.mean(x, axis=tail_axes(x.ndim, axis), keepdims=True)


def layer_norm(xp: Any, x: Any, scale: Any, bias: Any, axis: int, eps: float) -> Any:
    """(x - mean) / sqrt(var + eps) over the axes from ``axis``, then * scale + bias."""
    x = float_of(xp, x)
    axes = tail_axes(x.ndim, axis)
    centred = x - xp.mean(x, axis=axes, keepdims=True)
    var = xp.mean(centred * centred, axis=axes, keepdims=True)
    out = centred / xp.sqrt(var + eps)
    if scale is not None:
        out = out * scale
    if bias is not None:
        out = out + bias
    return out


def rms_norm(xp: Any, x: Any, scale: Any, axis: int, eps: float) -> Any:
    """x / sqrt(mean(x^2) + eps) over the axes from ``axis``, then * scale."""
    x = float_of(xp, x)
    axes = tail_axes(x.ndim, axis)
    out = x / xp.sqrt(xp.mean(x * x, axis=axes, keepdims=True) + eps)
    return out if scale is None else out * scale


def channel_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """(C, 1, ..., 1): a per-channel vector viewed against an (N, C, ...) tensor."""
    return (int(shape[1]),) + (1,) * (len(shape) - 2)


def group_shape(shape: Sequence[int], groups: int) -> tuple[int, ...]:
    """(N, groups, -1): an (N, C, ...) tensor with its channels in groups."""
    return (int(shape[0]), groups, -1)


def group_norm(xp: Any, x: Any, groups: int, scale: Any, bias: Any, eps: float) -> Any:
    """Normalise each group of channels of each sample, then a per-channel affine map."""
    x = float_of(xp, x)
    grouped = xp.reshape(x, group_shape(x.shape, groups))
    normal = xp.reshape(layer_norm(xp, grouped, None, None, 2, eps), x.shape)
    view = channel_shape(x.shape)
    return normal * xp.reshape(scale, view) + xp.reshape(bias, view)


def instance_norm(xp: Any, x: Any, scale: Any, bias: Any, eps: float) -> Any:
    """Normalise each channel of each sample over its spatial axes, then scale + bias."""
    x = float_of(xp, x)
    view = channel_shape(x.shape)
    return layer_norm(xp, x, None, None, 2, eps) * xp.reshape(scale, view) + \
        xp.reshape(bias, view)


def swap_last(xp: Any, x: Any) -> Any:
    """x with its last two axes exchanged."""
    return xp.swapaxes(x, -1, -2)


def default_scale(q_shape: Sequence[int], scale: Optional[float]) -> float:
    """The attention scale: the attribute, or 1 / sqrt(E) as PyTorch."""
    if scale is not None:
        return float(scale)
    return 1.0 / math.sqrt(int(q_shape[-1])) if int(q_shape[-1]) else 1.0


def attention_probs(xp: Any, q: Any, k: Any, mask: Any, scale: Optional[float],
                    causal: bool) -> Any:
    """softmax(q @ k^T * scale + mask) over the last axis, as PyTorch's
    scaled_dot_product_attention: a bool mask says which keys take part
    (``True``), a float one is added; ``causal`` keeps keys j <= i (top left)."""
    q = float_of(xp, q)
    if xp is np:
        return _attention_probs_numpy(q, k, mask, scale, causal)
    logits = xp.matmul(q, swap_last(xp, k)) * default_scale(q.shape, scale)
    length, keys = logits.shape[-2], logits.shape[-1]
    keep = None
    if causal:
        keep = np.tril(np.ones((length, keys), dtype=bool))
    if mask is not None:
        if mask.dtype == bool:
            keep = mask if keep is None else xp.logical_and(keep, mask)
        else:
            logits = logits + mask
    if keep is not None:
        logits = xp.where(keep, logits, xp.asarray(-np.inf, logits.dtype))
    if logits.size == 0:
        return logits
    return softmax(xp, logits, -1)


def _attention_probs_numpy(q: Any, k: Any, mask: Any, scale: Optional[float], causal: bool) -> Any:
    """:func:`attention_probs` for numpy, in place on the one (…, L, S) buffer the
    matmul makes: the same formula, without a temporary per step (the logits
    are the largest array of a transformer layer)."""
    logits = np.matmul(q, swap_last(np, np.asarray(k)))
    if logits.size == 0:
        return logits
    factor = default_scale(q.shape, scale)
    if factor != 1.0:
        logits *= logits.dtype.type(factor)
    length, keys = logits.shape[-2], logits.shape[-1]
    drop = None
    if causal:
        drop = np.triu(np.ones((length, keys), dtype=bool), 1)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype == bool:
            drop = np.logical_not(mask) if drop is None else np.logical_or(drop, np.logical_not(mask))
        elif (np.broadcast_shapes(mask.shape, logits.shape) == logits.shape
              and np.result_type(logits, mask) == logits.dtype):
            logits += mask
        else:
            logits = logits + mask
    if drop is not None:
        if np.broadcast_shapes(drop.shape, logits.shape) != logits.shape:
            logits = np.array(np.broadcast_to(logits, np.broadcast_shapes(drop.shape, logits.shape)))
        np.copyto(logits, logits.dtype.type(-np.inf), where=drop)
    logits -= np.max(logits, axis=-1, keepdims=True)
    np.exp(logits, out=logits)
    logits /= np.sum(logits, axis=-1, keepdims=True)
    return logits


def attention(xp: Any, q: Any, k: Any, v: Any, mask: Any, scale: Optional[float],
              causal: bool) -> Any:
    """softmax(q @ k^T * scale + mask) @ v."""
    return xp.matmul(attention_probs(xp, q, k, mask, scale, causal), v)


def class_mask(xp: Any, target: Any, like: Any, axis: int) -> Any:
    """One-hot of the class indices ``target`` along ``axis`` of ``like``'s shape,
    in ``like``'s dtype."""
    rank = like.ndim
    ax = axis + rank if axis < 0 else axis
    classes = xp.arange(like.shape[ax]).reshape((-1,) + (1,) * (rank - ax - 1))
    return (xp.expand_dims(target, ax) == classes).astype(like.dtype)


def picked(xp: Any, logp: Any, target: Any, axis: int) -> Any:
    """-logp at the target class along ``axis``, of the target's shape."""
    return -xp.sum(logp * class_mask(xp, target, logp, axis), axis=axis)


def loss_reduce(xp: Any, x: Any, reduction: str) -> Any:
    """A loss per element reduced as asked: ``none``, ``sum`` or ``mean``."""
    if reduction == "none":
        return x
    if reduction == "sum":
        return xp.sum(x)
    return xp.mean(x) if x.size else xp.asarray(np.nan, x.dtype)


def loss_spread(xp: Any, g: Any, like: Any, reduction: str) -> Any:
    """The adjoint of :func:`loss_reduce`: ``g`` spread over ``like``'s shape."""
    if reduction == "none":
        return g
    g = xp.broadcast_to(g, like.shape)
    if reduction == "mean":
        return g / max(int(np.prod(like.shape)), 1)
    return g


def dropout_keep(shape: Sequence[int], rate: float, key: int) -> np.ndarray:
    """The mask of kept elements: numpy's PCG64 seeded by ``key``, uniform draws >= rate."""
    return np.random.default_rng(int(key) & (2 ** 63 - 1)).random(tuple(shape)) >= rate


def einsum_parts(spec: str) -> tuple[list[str], str]:
    """The input subscripts and the output subscript of an explicit einsum spec."""
    lhs, _, rhs = spec.replace(" ", "").partition("->")
    return lhs.split(","), rhs


def einsum_grad_spec(spec: str, index: int) -> str:
    """The spec of the gradient of operand ``index``: the output's cotangent, the
    other operands and a ones operand (for labels only operand ``index`` has,
    spec "" when there are none) contracted to operand ``index``'s labels."""
    inputs, output = einsum_parts(spec)
    mine = inputs[index]
    others = [s for i, s in enumerate(inputs) if i != index]
    seen = set(output.replace("...", "")) | set("".join(others).replace("...", ""))
    alone = any(c not in seen for c in mine.replace("...", ""))
    ones = mine if alone or ("..." in mine and "..." not in output) else ""
    return ",".join([output] + others + [ones]) + "->" + mine

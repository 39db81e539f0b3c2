"""Expansions of the reduction family (anfir/primitives/reduce.py): variance, standard
deviation, logsumexp and the vector norms, from sums, means and extremes."""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from anfir.decompositions.builder import ExpansionBuilder, Decomposition
from anfir.decompositions.common import as_dtype, count_ratio, out_dtype, reduced
from anfir.ir.nodes import Node
from anfir.ir.primitive import Primitive
from anfir.primitives import arith, elementwise, gradient, indexing, reduce, shaping, tensor


def _var_of(b: ExpansionBuilder) -> Node:
    """sum((x - mean)²) / (n - correction) over the axis attribute."""
    d = out_dtype(b)
    x = as_dtype(b, b.arg(0), d)
    axis, keep = b.attrs["axis"], bool(b.attrs["keepdims"])
    mean = reduced(b, tensor.mean, x, axis, True)
    deviation = b.call(arith.sub, x, mean)
    total = reduced(b, tensor.sum_, b.call(arith.mul, deviation, deviation), axis, keep)
    count = count_ratio(b, x, mean, d)
    return b.call(arith.div, total, b.call(arith.sub, count, float(b.attrs["correction"])))


def _var(b: ExpansionBuilder) -> Node:
    return _var_of(b)


def _std(b: ExpansionBuilder) -> Node:
    return b.call(arith.sqrt, _var_of(b))


def _logsumexp(b: ExpansionBuilder) -> Node:
    """log(sum(exp(x - top))) + top, top the maximum where finite (else 0): no overflow."""
    d = out_dtype(b)
    x = as_dtype(b, b.arg(0), d)
    axis, keep = b.attrs["axis"], bool(b.attrs["keepdims"])
    top = reduced(b, reduce.max_, x, axis, True)
    finite = b.call(arith.logical_not, b.call(arith.logical_or, b.call(elementwise.isinf, top),
                                              b.call(elementwise.isnan, top)))
    top = b.call(tensor.where, finite, top, 0.0)
    total = reduced(b, tensor.sum_, b.call(arith.exp, b.call(arith.sub, x, top)), axis, keep)
    # top has length 1 on the reduced axes: summing it over them gives total's shape
    return b.call(arith.add, b.call(arith.log, total), reduced(b, tensor.sum_, top, axis, keep))


def _norm(b: ExpansionBuilder) -> Node:
    """The vector norm of the ord attribute: max/min |x| (±inf), the count of non-zeros (0),
    sum |x| (1), sqrt(sum x²) (2), (sum |x|^ord)^(1/ord)."""
    d = out_dtype(b)
    x = as_dtype(b, b.arg(0), d)
    axis, keep = b.attrs["axis"], bool(b.attrs["keepdims"])
    order = float(b.attrs["ord"])
    magnitude = b.call(arith.abs_, x)
    if order == math.inf:
        return reduced(b, reduce.max_, magnitude, axis, keep)
    if order == -math.inf:
        return reduced(b, reduce.min_, magnitude, axis, keep)
    if order == 0:
        nonzero = b.call(tensor.cast, b.call(arith.ne, x, 0.0), d)
        return reduced(b, tensor.sum_, nonzero, axis, keep)
    if order == 1:
        return reduced(b, tensor.sum_, magnitude, axis, keep)
    if order == 2:
        return b.call(arith.sqrt, reduced(b, tensor.sum_, b.call(arith.mul, x, x), axis, keep))
    powered = b.call(arith.pow_, magnitude, order)
    return b.call(arith.pow_, reduced(b, tensor.sum_, powered, axis, keep), 1.0 / order)


def moved_last(b: ExpansionBuilder, x: Node, axes: Sequence[int]) -> tuple[Node, list[int]]:
    """``x`` with ``axes`` moved last (in order); the permutation used."""
    rank = b.rank(x)
    perm = [i for i in range(rank) if i not in axes] + list(axes)
    return (x if perm == list(range(rank)) else b.call(tensor.transpose, x, tuple(perm))), perm


def moved_back(b: ExpansionBuilder, y: Node, perm: list[int]) -> Node:
    """``y`` with the permutation ``perm`` undone."""
    if perm == sorted(perm):
        return y
    return b.call(tensor.transpose, y, tuple(perm.index(i) for i in range(len(perm))))


def products_where(b: ExpansionBuilder, last: Node, keep: Callable[[Any, Any], Any], d: str) -> Node:
    """For each i of the last axis, the product of the elements j where ``keep(i, j)`` (an
    [n, n] mask, a constant when n is known, else from arange): the elements broadcast to
    [..., n, n], the others made 1 — exact for zeros and signs (no logarithms)."""
    n = b.dim(last, -1)
    if isinstance(n, int):
        mask: Node = b.const(keep(np.arange(n)[:, None], np.arange(n)[None, :]))
    else:
        index = b.call(indexing.arange, 0, n)
        mask = b.call(_COMPARE[keep], b.call(shaping.unsqueeze, index, axis=1),
                      b.call(shaping.unsqueeze, index, axis=0))
    rows = b.call(shaping.unsqueeze, last, axis=b.rank(last) - 1)
    chosen = b.call(tensor.where, mask, rows, b.typed(1, d))
    return reduced(b, reduce.prod, chosen, -1, False)


_COMPARE: dict[Any, Primitive] = {np.less_equal: arith.le, np.less: arith.lt,
                                  np.greater_equal: arith.ge, np.greater: arith.gt,
                                  np.not_equal: arith.ne}
"""The anfir comparison of each numpy one a mask is made with."""


def _cumprod(b: ExpansionBuilder) -> Node:
    """Running products: for each i, the product of the elements j <= i (j < i exclusive;
    j >= i reverse) of the axis (its length must be known)."""
    d = out_dtype(b)
    x = as_dtype(b, b.arg(0), d)
    axis = b.attrs["axis"]
    if axis is None:
        x, axis = b.call(tensor.reshape, x, (-1,)), 0
    rank = b.rank(x)
    last, perm = moved_last(b, x, [int(axis) % rank])
    compare = {(False, False): np.greater_equal, (True, False): np.greater,
               (False, True): np.less_equal, (True, True): np.less}  # keep(i, j): j <= i...
    keep = compare[(bool(b.attrs["exclusive"]), bool(b.attrs["reverse"]))]
    return moved_back(b, products_where(b, last, keep, d), perm)


def _prod_others(b: ExpansionBuilder) -> Node:
    """For each element, the product of the others of its group of ``prod(x, axis)``: the
    reduced axes flattened last, a product over an [n, n] mask without the diagonal."""
    d = out_dtype(b)
    x = as_dtype(b, b.arg(0), d)
    rank = b.rank(x)
    if rank == 0:
        return b.call(tensor.ones_like, x)
    axis = b.static(b.arg(1))
    axes = list(range(rank)) if axis is None else sorted(
        int(a) % rank for a in (axis if isinstance(axis, tuple) else (axis,)))
    moved, perm = moved_last(b, x, axes)
    dims = [b.dim(moved, i) for i in range(rank)]
    flat = b.call(tensor.reshape, moved, b.shape_of(dims[:rank - len(axes)] + [-1]))
    others = products_where(b, flat, np.not_equal, d)
    return moved_back(b, b.call(tensor.reshape, others, b.shape_of(dims)), perm)


DECOMPOSITIONS: dict[Primitive, Decomposition] = {
    reduce.cumprod: _cumprod,
    gradient.prod_others: _prod_others,
    reduce.var: _var,
    reduce.std: _std,
    reduce.logsumexp: _logsumexp,
    reduce.norm: _norm,
}
"""The reduction family's expansions."""

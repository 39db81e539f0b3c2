"""Expansions of the reduction family (anfir/primitives/reduce.py): variance, standard
deviation, logsumexp and the vector norms, from sums, means and extremes."""

from __future__ import annotations

import math

from anfir.decompositions.builder import Builder, Decomposition
from anfir.decompositions.common import as_dtype, count_ratio, out_dtype, reduced
from anfir.ir.nodes import Node
from anfir.ir.primitive import Primitive
from anfir.primitives import arith, elementwise, reduce, tensor


def _var_of(b: Builder) -> Node:
    """sum((x - mean)²) / (n - correction) over the axis attribute."""
    d = out_dtype(b)
    x = as_dtype(b, b.arg(0), d)
    axis, keep = b.attrs["axis"], bool(b.attrs["keepdims"])
    mean = reduced(b, tensor.mean, x, axis, True)
    deviation = b.call(arith.sub, x, mean)
    total = reduced(b, tensor.sum_, b.call(arith.mul, deviation, deviation), axis, keep)
    count = count_ratio(b, x, mean, d)
    return b.call(arith.div, total, b.call(arith.sub, count, float(b.attrs["correction"])))


def _var(b: Builder) -> Node:
    return _var_of(b)


def _std(b: Builder) -> Node:
    return b.call(arith.sqrt, _var_of(b))


def _logsumexp(b: Builder) -> Node:
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


def _norm(b: Builder) -> Node:
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


DECOMPOSITIONS: dict[Primitive, Decomposition] = {
    reduce.var: _var,
    reduce.std: _std,
    reduce.logsumexp: _logsumexp,
    reduce.norm: _norm,
}
"""The reduction family's expansions."""

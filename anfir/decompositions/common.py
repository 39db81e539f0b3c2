"""Small expansions several families' decompositions share."""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from anfir.decompositions.builder import ExpansionBuilder, Declined
from anfir.ir.nodes import Node
from anfir.primitives import arith, gradient, tensor

Axes = Union[int, tuple[int, ...], None]


def out_dtype(b: ExpansionBuilder) -> str:
    """The dtype of the composite call's result."""
    return b.dtype(b.node)


def as_dtype(b: ExpansionBuilder, x: Node, dtype: str) -> Node:
    """``x`` in ``dtype`` (a cast only when it is another one: the exporters computed a
    composite in its result's dtype)."""
    return x if b.dtype(x) == dtype else b.call(tensor.cast, x, dtype)


def reduced(b: ExpansionBuilder, prim: Any, x: Node, axes: Axes, keepdims: bool) -> Node:
    """A reduction ``prim`` of ``x`` over ``axes`` (None: every axis)."""
    if isinstance(axes, list):
        axes = tuple(axes)
    return b.call(prim, x, axis=axes, keepdims=keepdims)


def mean_of(b: ExpansionBuilder, x: Node, axes: Sequence[int]) -> Node:
    """The mean over ``axes``, kept as 1."""
    return reduced(b, tensor.mean, x, tuple(axes), True)


def count_ratio(b: ExpansionBuilder, whole: Node, part: Node, dtype: str) -> Node:
    """size(whole) / size(part) in ``dtype``: a constant when both shapes are known, else
    computed from the sizes at run time."""
    try:
        n, m = _size(b.static_shape(whole)), _size(b.static_shape(part))
        return b.const(n / m if m else 0.0)
    except Declined:  # a symbolic dimension: count at run time
        pass
    return b.call(arith.div, b.call(tensor.cast, b.call(gradient.size, whole), dtype),
                  b.call(tensor.cast, b.call(gradient.size, part), dtype))


def _size(shape: Sequence[int]) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


def channel_view_of(b: ExpansionBuilder, v: Node, rank: int) -> Node:
    """A (C,) vector as (C, 1, ..., 1) against a tensor of ``rank`` (as is for rank <= 2)."""
    if rank <= 2:
        return v
    return b.call(tensor.reshape, v, (-1,) + (1,) * (rank - 2))


def optional(b: ExpansionBuilder, index: int) -> Optional[Node]:
    """The optional input ``index`` (None when absent or the constant None)."""
    return b.arg(index) if b.has(index) else None

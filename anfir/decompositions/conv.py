"""Expansions of the convolution family's channel helpers and global pools
(anfir/primitives/conv.py): reductions over the spatial or non-channel axes and a
broadcast of a channel vector, each the formula anfir evaluates.  (Not batch_norm: the
.mindir exporter, which keeps only the composites it has rules for, would then lose the
located "no MindIR rule for batch_norm" its tests pin.)"""

from __future__ import annotations

from anfir.decompositions.builder import ExpansionBuilder, Decomposition
from anfir.decompositions.common import as_dtype, channel_view_of, out_dtype, reduced
from anfir.ir.nodes import Node
from anfir.ir.primitive import Primitive
from anfir.primitives import conv, reduce, tensor


def _channel_sum(b: ExpansionBuilder) -> Node:
    """The sum over every axis but 1 (the channels)."""
    x = as_dtype(b, b.arg(0), out_dtype(b))
    return reduced(b, tensor.sum_, x, (0, *range(2, b.rank(x))), False)


def _channel_spread(b: ExpansionBuilder) -> Node:
    """The channel vector as (C, 1, ...) broadcast to the other operand's shape."""
    v, like = as_dtype(b, b.arg(0), out_dtype(b)), b.arg(1)
    rank = b.rank(like)
    column = channel_view_of(b, v, rank)
    return b.call(tensor.broadcast_to, column, b.shape_of([b.dim(like, i) for i in range(rank)]))


def _global(prim: Primitive) -> Decomposition:
    """A reduction ``prim`` over the spatial axes (2...), kept as 1."""
    def rule(b: ExpansionBuilder) -> Node:
        x = as_dtype(b, b.arg(0), out_dtype(b))
        rank = b.rank(x)
        if rank < 3:
            raise b.decline("a global pool of an input of rank < 3")
        return reduced(b, prim, x, tuple(range(2, rank)), True)
    rule.__doc__ = f"{prim.name} over the spatial axes, kept"
    return rule


DECOMPOSITIONS: dict[Primitive, Decomposition] = {
    conv.channel_sum: _channel_sum, conv.channel_spread: _channel_spread,
    conv.global_avg_pool: _global(tensor.mean), conv.global_max_pool: _global(reduce.max_),
}
"""The convolution family's expansions."""

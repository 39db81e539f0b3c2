"""Expansions of the shaping family's gradient helpers (anfir/primitives/shaping.py):
``pad_grad``, ``slice_grad`` and ``tile_grad`` from gathers, scatters, reshapes and sums
(every one needs x's static shape: the positions are computed at export)."""

from __future__ import annotations

import numpy as np

from anfir.decompositions.builder import ExpansionBuilder, Decomposition
from anfir.decompositions.common import as_dtype, out_dtype, reduced
from anfir.dtypes import numpy_dtype
from anfir.ir.nodes import Node
from anfir.ir.primitive import Primitive
from anfir.primitives import indexing, shaping, tensor


def flat_scatter(b: ExpansionBuilder, g: Node, positions: np.ndarray, sources: np.ndarray,
                 shape: tuple[int, ...]) -> Node:
    """zeros of ``shape``, then out.flat[positions[k]] += g.flat[sources[k]]."""
    d = out_dtype(b)
    flat = b.call(tensor.reshape, as_dtype(b, g, d), (-1,))
    picked = b.call(indexing.gather, flat, b.const(np.asarray(sources, dtype=np.int64)), axis=0)
    zeros = b.const(np.zeros(int(np.prod(shape, dtype=np.int64)), dtype=numpy_dtype(d)))
    summed = b.call(indexing.scatter_add, zeros, b.const(np.asarray(positions, dtype=np.int64)),
                    picked, axis=0)
    return b.call(tensor.reshape, summed, shape)


def _grid(shape: tuple[int, ...]) -> np.ndarray:
    """Each element's flat position, in x's shape."""
    return np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)


def _pad_grad(b: ExpansionBuilder) -> Node:
    """Each padded element's gradient added to its source."""
    shape = b.static_shape(b.arg(1))
    sources = np.asarray(shaping.pad.impl(_grid(shape), b.attrs["pads"], b.attrs["mode"], -1)).reshape(-1)
    keep = np.nonzero(sources >= 0)[0]
    return flat_scatter(b, b.arg(0), sources[keep], keep, shape)


def _slice_grad(b: ExpansionBuilder) -> Node:
    """The gradient scattered into zeros at the positions slice took."""
    shape = b.static_shape(b.arg(1))
    a = b.attrs
    taken = np.asarray(shaping.slice_.impl(_grid(shape), a["starts"], a["ends"], a["axes"], a["steps"]))
    positions = taken.reshape(-1)
    return flat_scatter(b, b.arg(0), positions, np.arange(positions.size), shape)


def _tile_grad(b: ExpansionBuilder) -> Node:
    """The gradient as (rep, dim) pairs, summed over the reps, in x's shape."""
    shape = b.static_shape(b.arg(1))
    reps = tuple(shaping.ints_attr(b.attrs["reps"], "reps", "tile_grad"))
    dims, counts = shaping.tile_layout(list(shape), reps)
    interleaved = tuple(int(v) for pair in zip(counts, dims) for v in pair)
    g = b.call(tensor.reshape, as_dtype(b, b.arg(0), out_dtype(b)), interleaved)
    summed = reduced(b, tensor.sum_, g, tuple(range(0, 2 * len(dims), 2)), False)
    return b.call(tensor.reshape, summed, shape)


DECOMPOSITIONS: dict[Primitive, Decomposition] = {
    shaping.pad_grad: _pad_grad,
    shaping.slice_grad: _slice_grad,
    shaping.tile_grad: _tile_grad,
}
"""The shaping family's expansions."""

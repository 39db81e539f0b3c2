"""JAX rules of the shape and indexing operators (primitives/shaping.py and
primitives/indexing.py), merged into :data:`anfir.backends.tojax.rules.RULES`.

Attributes are static, so every index structure (slices, pad source indices,
split points) is computed with the primitives' own numpy helpers on static
shapes, and only the data goes through ``jax.numpy``.  Indices held by traced
arrays cannot be range-checked at trace time: negative ones count from the
end as in anfir; out-of-range ones follow JAX (clamped).
"""

from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp
import numpy as np

from anfir.abstract import rules as attr_checks
from anfir.dtypes import numpy_name
from anfir.ir.primitive import Primitive
from anfir.primitives import indexing, shaping

Rule = Callable[..., Any]


def _static_shape_of(impl: Callable[..., Any], x: Any, **attrs: Any) -> tuple[int, ...]:
    """The shape impl gives for x's shape (evaluated on a zero-stride array: no memory)."""
    return tuple(np.shape(impl(np.broadcast_to(np.zeros((), np.float32), np.shape(x)), **attrs)))


def _reshaper(impl: Callable[..., Any]) -> Rule:
    def rule(x: Any, **attrs: Any) -> Any:
        return jnp.reshape(jnp.asarray(x), _static_shape_of(impl, x, **attrs))
    return rule


def _concat(xs: Any, axis: Any = 0) -> Any:
    arrays = [jnp.asarray(x) for x in xs]
    return jnp.concatenate(arrays, shaping.axis_of(axis, arrays[0].ndim, "concat"))


def _stack(xs: Any, axis: Any = 0) -> Any:
    arrays = [jnp.asarray(x) for x in xs]
    return jnp.stack(arrays, shaping.axis_of(axis, arrays[0].ndim, "stack", extra=1))


def _stack_grad(dout: Any, xs: Any, axis: Any = 0) -> Any:
    g = jnp.asarray(dout)
    ax = shaping.axis_of(axis, g.ndim - 1, "stack_grad", extra=1)
    return tuple(jnp.take(g, i, axis=ax) for i in range(g.shape[ax]))


def _split(x: Any, sizes: Any = None, axis: Any = 0) -> Any:
    array = jnp.asarray(x)
    ax = shaping.axis_of(axis, array.ndim, "split")
    parts = shaping.split_sizes(array.shape[ax], sizes)
    return tuple(jnp.split(array, [int(b) for b in np.cumsum(parts)[:-1]], axis=ax))


def _concat_grad(dout: Any, xs: Any, axis: Any = 0) -> Any:
    g = jnp.asarray(dout)
    ax = shaping.axis_of(axis, g.ndim, "concat_grad")
    sizes = [np.shape(x)[ax] for x in xs]
    return tuple(jnp.split(g, [int(b) for b in np.cumsum(sizes)[:-1]], axis=ax))


def _slice(x: Any, starts: Any = None, ends: Any = None, axes: Any = None, steps: Any = None) -> Any:
    array = jnp.asarray(x)
    spec = shaping.slice_spec(array.ndim, starts, ends, axes, steps)
    return array[shaping.slice_index(tuple(array.shape), spec)]


def _slice_grad(dout: Any, x: Any, starts: Any = None, ends: Any = None, axes: Any = None,
                steps: Any = None) -> Any:
    g = jnp.asarray(dout)
    shape = tuple(np.shape(x))
    index = shaping.slice_index(shape, shaping.slice_spec(len(shape), starts, ends, axes, steps))
    return jnp.zeros(shape, g.dtype).at[index].set(g)


def _pad(x: Any, pads: Any = None, mode: Any = "constant", value: Any = 0) -> Any:
    array = jnp.asarray(x)
    spec, mode = shaping.pad_widths(pads, array.ndim, mode)
    out = array
    for ax, (b, e) in enumerate(spec):
        if b == 0 and e == 0:
            continue
        index = shaping.pad_source_index(array.shape[ax], b, e, mode)
        if array.shape[ax]:
            out = jnp.take(out, jnp.asarray(np.maximum(index, 0)), axis=ax)
        else:
            out = jnp.zeros(out.shape[:ax] + (len(index),) + out.shape[ax + 1:], array.dtype)
        if mode == "constant" and (index < 0).any():
            mask = (index < 0).reshape((-1,) + (1,) * (array.ndim - ax - 1))
            out = jnp.where(jnp.asarray(mask), jnp.asarray(value, array.dtype), out)
    return out


def _pad_grad(dout: Any, x: Any, pads: Any = None, mode: Any = "constant") -> Any:
    g = jnp.asarray(dout)
    shape = tuple(np.shape(x))
    spec, mode = shaping.pad_widths(pads, len(shape), mode)
    out = g
    for ax, (b, e) in enumerate(spec):
        if b == 0 and e == 0:
            continue
        index = shaping.pad_source_index(shape[ax], b, e, mode)
        keep = index >= 0
        moved = jnp.moveaxis(out, ax, 0)
        acc = jnp.zeros((shape[ax],) + moved.shape[1:], g.dtype)
        acc = acc.at[jnp.asarray(index[keep])].add(moved[jnp.asarray(np.nonzero(keep)[0])])
        out = jnp.moveaxis(acc, 0, ax)
    return out


def _expand(x: Any, shape: Any) -> Any:
    array = jnp.asarray(x)
    target = shaping.shape_value(shape, "expand")
    return jnp.broadcast_to(array, np.broadcast_shapes(tuple(array.shape), target))


def _tile(x: Any, reps: Any = None) -> Any:
    return jnp.tile(jnp.asarray(x), shaping.ints_attr(reps, "reps", "tile"))


def _tile_grad(dout: Any, x: Any, reps: Any = None) -> Any:
    g = jnp.asarray(dout)
    shape = tuple(np.shape(x))
    dims, counts = shaping.tile_layout(shape, shaping.ints_attr(reps, "reps", "tile_grad"))
    interleaved = [int(v) for pair in zip(counts, dims) for v in pair]
    return jnp.reshape(jnp.sum(jnp.reshape(g, interleaved), axis=tuple(range(0, 2 * len(dims), 2))),
                       shape)


def _flip(x: Any, axis: Any = None) -> Any:
    array = jnp.asarray(x)
    return jnp.flip(array, shaping.axes_of(axis, array.ndim, "flip"))


def _roll(x: Any, shift: Any = None, axis: Any = None) -> Any:
    array = jnp.asarray(x)
    shifts, axes = shaping.roll_args(shift, axis, array.ndim)
    if axes is None:
        return jnp.reshape(jnp.roll(jnp.reshape(array, (-1,)), shifts[0]), array.shape)
    return jnp.roll(array, shifts, axes)


def _roll_back(dout: Any, shift: Any = None, axis: Any = None) -> Any:
    shifts, _ = shaping.roll_args(shift, axis, jnp.ndim(dout))
    return _roll(dout, tuple(-s for s in shifts) if isinstance(shift, tuple) else -shifts[0], axis)


def _triangle(jnp_fn: Callable[..., Any], name: str) -> Rule:
    def rule(x: Any, k: Any = 0) -> Any:
        return jnp_fn(jnp.asarray(x), shaping.int_attr(k, "k", name))
    return rule


def _positive(index: Any, n: int) -> Any:
    index = jnp.asarray(index)
    return jnp.where(index < 0, index + n, index)


def _gather(x: Any, indices: Any, axis: Any = 0) -> Any:
    array = jnp.asarray(x)
    ax = shaping.axis_of(axis, array.ndim, "gather")
    return jnp.take(array, _positive(indices, array.shape[ax]), axis=ax)


def _gather_grad(dout: Any, x: Any, indices: Any, axis: Any = 0) -> Any:
    g = jnp.asarray(dout)
    shape = tuple(np.shape(x))
    ax = shaping.axis_of(axis, len(shape), "gather_grad")
    index = _positive(indices, shape[ax])
    k = index.ndim
    moved = jnp.moveaxis(g, tuple(range(ax, ax + k)), tuple(range(k)))
    acc = jnp.zeros((shape[ax],) + shape[:ax] + shape[ax + 1:], g.dtype).at[index].add(moved)
    return jnp.moveaxis(acc, 0, ax)


def _gather_elements(x: Any, indices: Any, axis: Any = 0) -> Any:
    array = jnp.asarray(x)
    index = jnp.asarray(indices)
    ax = shaping.axis_of(axis, array.ndim, "gather_elements")
    part = array[tuple(slice(0, m) if i != ax else slice(None) for i, m in enumerate(index.shape))]
    return jnp.take_along_axis(part, _positive(index, array.shape[ax]), ax)


def _scatter_add(x: Any, indices: Any, updates: Any, axis: Any = 0) -> Any:
    array = jnp.asarray(x)
    index = jnp.asarray(indices)
    ax = shaping.axis_of(axis, array.ndim, "scatter_add")
    where: list[Any] = [jnp.arange(m).reshape((-1,) + (1,) * (index.ndim - i - 1))
                        for i, m in enumerate(index.shape)]
    where[ax] = _positive(index, array.shape[ax])
    return array.at[tuple(where)].add(jnp.asarray(updates, array.dtype))


def _nd(x_shape: tuple[int, ...], indices: Any) -> tuple[Any, ...]:
    index = jnp.asarray(indices)
    return tuple(_positive(index[..., i], x_shape[i]) for i in range(index.shape[-1]))


def _gather_nd(x: Any, indices: Any) -> Any:
    array = jnp.asarray(x)
    return array[_nd(tuple(array.shape), indices)]


def _gather_nd_grad(dout: Any, x: Any, indices: Any) -> Any:
    g = jnp.asarray(dout)
    shape = tuple(np.shape(x))
    return jnp.zeros(shape, g.dtype).at[_nd(shape, indices)].add(g)


def _scatter_nd(x: Any, indices: Any, updates: Any) -> Any:
    array = jnp.asarray(x)
    return array.at[_nd(tuple(array.shape), indices)].set(jnp.asarray(updates, array.dtype))


def _topk(x: Any, k: Any = None, axis: Any = -1, largest: Any = True) -> Any:
    array = jnp.asarray(x)
    count = shaping.int_attr(k, "k", "topk")
    big = attr_checks.bool_attr(largest, "largest", "topk")
    ax = shaping.axis_of(axis, array.ndim, "topk")
    order = jnp.argsort(-array if big else array, axis=ax, stable=True)
    index = jnp.take(order, jnp.arange(count), axis=ax)
    return jnp.take_along_axis(array, index, ax), index.astype(jnp.int64)


def _one_hot(indices: Any, depth: Any = None, dtype: Any = "f32") -> Any:
    n = shaping.int_attr(depth, "depth", "one_hot")
    return (jnp.asarray(indices)[..., None] == jnp.arange(n)).astype(numpy_name(dtype))


def _full(shape: Any, value: Any, dtype: Any = None) -> Any:
    dims = indexing.shape_attr(shape, "full")
    return jnp.full(dims, value, dtype=None if dtype is None else numpy_name(dtype))


def _rank(x: Any) -> int:
    return int(jnp.ndim(x))


SHAPING_RULES: dict[Primitive, Rule] = {
    shaping.concat: _concat,
    shaping.concat_grad: _concat_grad,
    shaping.stack: _stack,
    shaping.stack_grad: _stack_grad,
    shaping.split: _split,
    shaping.slice_: _slice,
    shaping.slice_grad: _slice_grad,
    shaping.pad: _pad,
    shaping.pad_grad: _pad_grad,
    shaping.squeeze: _reshaper(shaping.squeeze.impl),
    shaping.unsqueeze: _reshaper(shaping.unsqueeze.impl),
    shaping.flatten: _reshaper(shaping.flatten.impl),
    shaping.expand: _expand,
    shaping.tile: _tile,
    shaping.tile_grad: _tile_grad,
    shaping.flip: _flip,
    shaping.roll: _roll,
    shaping.roll_back: _roll_back,
    shaping.tril: _triangle(jnp.tril, "tril"),
    shaping.triu: _triangle(jnp.triu, "triu"),
    shaping.rank: _rank,
    indexing.gather: _gather,
    indexing.gather_grad: _gather_grad,
    indexing.gather_elements: _gather_elements,
    indexing.scatter_add: _scatter_add,
    indexing.gather_nd: _gather_nd,
    indexing.gather_nd_grad: _gather_nd_grad,
    indexing.scatter_nd: _scatter_nd,
    indexing.topk: _topk,
    indexing.one_hot: _one_hot,
    indexing.arange: indexing.arange.impl,
    indexing.full: _full,
    indexing.eye: indexing.eye.impl,
}
"""The JAX rule of each shape and indexing primitive (arange and eye take only
static arguments: their impl runs at trace time)."""

__all__ = ["SHAPING_RULES"]

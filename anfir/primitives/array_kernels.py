"""Array kernels of the elementwise, reduction and gradient families written once over
an array module ``xp`` (numpy for the evaluator, ``jax.numpy`` for the JAX back end),
as :mod:`anfir.primitives.nn_kernels` is for the nn family: the evaluator and the
JAX back end then compute one formula, and a fix reaches both.

Nothing here knows about the IR or checks attributes: the primitives' ``impl`` and
the JAX rules check them (each with its own error location) and call these with
checked values.  Only static facts (shapes, ranks, Python ints) steer the code, so
it traces under ``jax.jit``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from anfir.errors import AnfirTypeError


def clip_bounds(lo: Any, hi: Any, min: Any, max: Any) -> tuple[Any, Any]:
    """``clip``'s bounds from its arguments (``lo``, ``hi``) and attributes (``min``,
    ``max``): each bound given at most once."""
    if min is not None:
        if lo is not None:
            raise AnfirTypeError("clip: the lower bound is given twice (argument and attribute min)")
        lo = min
    if max is not None:
        if hi is not None:
            raise AnfirTypeError("clip: the upper bound is given twice (argument and attribute max)")
        hi = max
    return lo, hi


def clip(xp: Any, x: Any, lo: Any = None, hi: Any = None, *, min: Any = None,
         max: Any = None) -> Any:
    """``x`` limited to the bounds (None: no bound): ``minimum(maximum(x, lo), hi)``."""
    lo, hi = clip_bounds(lo, hi, min, max)
    result = x
    if lo is not None:
        result = xp.maximum(result, lo)
    if hi is not None:
        result = xp.minimum(result, hi)
    return result


def scan(xp: Any, fn: Callable[..., Any], x: Any, axis: Optional[int], exclusive: bool,
         reverse: bool, identity: int) -> Any:
    """The running ``fn`` (``cumsum``/``cumprod`` of ``xp``) along ``axis`` (None: of the
    flattened ``x``); ``exclusive`` shifts it by one (``identity`` first), ``reverse``
    runs it from the end."""
    array = xp.asarray(x)
    if axis is None:
        array, axis = xp.reshape(array, (-1,)), 0
    if reverse:
        array = xp.flip(array, axis)
    result = fn(array, axis=axis)
    n = result.shape[axis]
    if exclusive and n:
        before = (slice(None),) * (axis % result.ndim)
        start = xp.full_like(result[before + (slice(0, 1),)], identity)
        result = xp.concatenate([start, result[before + (slice(0, n - 1),)]], axis)
    if reverse:
        result = xp.flip(result, axis)
    return result


def sum_to(xp: Any, g: Any, g_shape: tuple[int, ...], x_shape: tuple[int, ...]) -> Any:
    """``g`` (of ``g_shape``) summed over the axes broadcasting added to reach ``x_shape`` —
    those in front, and those where ``x_shape`` has 1 and ``g`` does not — and reshaped
    to ``x_shape``."""
    extra = len(g_shape) - len(x_shape)
    axes = tuple(range(extra)) + tuple(extra + i for i, d in enumerate(x_shape)
                                       if d == 1 and g_shape[extra + i] != 1)
    return xp.reshape(xp.sum(g, axis=axes) if axes else g, x_shape)


def unreduce(xp: Any, g: Any, shape: tuple[int, ...], axis: Any, keepdims: Any) -> Any:
    """The gradient of ``sum(x, axis, keepdims)`` spread over ``x`` (of ``shape``): ``g``
    with the reduced axes back (unless kept), broadcast to ``shape``."""
    if keepdims:  # the reduced axes are still there, as 1
        return xp.broadcast_to(g, shape) if tuple(xp.shape(g)) != shape else g
    if axis is None:
        return xp.broadcast_to(g, shape) if shape else g
    axes = tuple(int(a) % len(shape) for a in (axis if isinstance(axis, tuple) else (axis,)))
    return xp.broadcast_to(xp.expand_dims(g, axes), shape)


def products_of_others(xp: Any, array: Any, axes: tuple[int, ...]) -> Any:
    """For each element of ``array`` (rank >= 1), the product of the *other* elements of
    its group over ``axes`` — exact at zeros (no division): the product of those before it
    times the product of those after it, the group's axes moved last and flattened."""
    ends = tuple(range(array.ndim - len(axes), array.ndim))
    moved = xp.moveaxis(array, axes, ends)
    shape = moved.shape
    flat = xp.reshape(moved, shape[:array.ndim - len(axes)] + (-1,))
    one = xp.ones(flat.shape[:-1] + (1,), flat.dtype)
    before = xp.cumprod(xp.concatenate([one, flat[..., :-1]], -1), -1)
    after = xp.flip(xp.cumprod(xp.concatenate([one, xp.flip(flat, -1)[..., :-1]], -1), -1), -1)
    return xp.moveaxis(xp.reshape(before * after, shape), ends, axes)


def within(xp: Any, x: Any, lo: Any, hi: Any) -> Any:
    """Where ``lo <= x <= hi`` (a None bound is no bound; True when both are None): the
    mask of ``clip``'s gradient."""
    inside: Any = True
    if lo is not None:
        inside = xp.logical_and(inside, xp.greater_equal(x, lo))
    if hi is not None:
        inside = xp.logical_and(inside, xp.less_equal(x, hi))
    return inside


def as_matrices(xp: Any, x: Any, y: Any, dout: Any) -> tuple[Any, Any, Any]:
    """``x``, ``y`` and ``dout`` of ``dout = d(x @ y)`` as (batches of) matrices:
    a vector ``x`` is a row, a vector ``y`` a column, as numpy's matmul promotes them."""
    x, y, dout = xp.asarray(x), xp.asarray(y), xp.asarray(dout)
    if y.ndim == 1:
        y = y[:, None]
        dout = dout[..., None]
    if x.ndim == 1:
        x = x[None, :]
        dout = xp.expand_dims(dout, -2)
    return x, y, dout


__all__ = ["clip_bounds", "clip", "scan", "sum_to", "unreduce", "as_matrices",
           "products_of_others", "within"]

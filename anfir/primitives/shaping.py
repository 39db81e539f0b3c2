"""Shape operators: concat, stack, split, slice, pad, squeeze, unsqueeze,
flatten, expand, tile, flip, roll, tril, triu, rank (the shared spec ``ops.md``,
"Shapes and indexing").

Each is one :func:`declare`.  Configuration (axes, sizes, starts, pads, reps...)
is made of attributes, which may also be passed positionally
(``concat(xs, 1)`` is ``concat(xs, axis=1)``); data (``xs``, ``x``, the target
shape of ``expand``) are inputs.  Every operator keeps its input's dtype.  Shape
rules work on symbolic dimensions (:mod:`anfir.abstract.shapes`).  Gradients are
ANF text; a linear operator's gradient is its adjoint, declared here as an
internal primitive whose own gradient is the operator again (``slice`` ↔
``slice_grad``, ``pad`` ↔ ``pad_grad``, ``tile`` ↔ ``tile_grad``...), so
gradients of every order stay closed.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np
import sympy

from anfir.abstract import rules
from anfir.abstract.shapes import (Shape, broadcast_shapes, dims_compatible, fresh_dim,
                                   is_unknown_dim, norm_dim, product, shape_text)
from anfir.abstract.values import AbstractValue, AScalar, ATensor, ATuple, Dim, dim_text
from anfir.dtypes import numpy_name, require_dtype_name
from anfir.errors import AnfirTypeError, ShapeError
from anfir.primitives.registry import declare

FAMILY = "shaping"
BIG = 1 << 62
"""An ``ends`` at least this large means "to the end" (ONNX writes INT64_MAX)."""
MAX_PIECES = 1 << 16
"""The most pieces ``split``/``stack`` handle (a tuple that large is a hostile program)."""


# -- attribute checks ----------------------------------------------------------------------
def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def int_attr(value: Any, name: str, what: str) -> int:
    """An integer attribute checked."""
    if not _is_int(value):
        raise AnfirTypeError(f"the attribute {name} of {what} is an integer, not {value!r}")
    return int(value)


def ints_attr(value: Any, name: str, what: str, scalar_ok: bool = True) -> tuple[int, ...]:
    """An attribute that is a tuple of integers (or one integer)."""
    if scalar_ok and _is_int(value):
        return (int(value),)
    if isinstance(value, tuple) and all(_is_int(v) for v in value):
        return tuple(int(v) for v in value)
    raise AnfirTypeError(f"the attribute {name} of {what} is "
                         f"{'an integer or ' if scalar_ok else ''}a tuple of integers, not {value!r}")


def axis_of(axis: Any, rank: int, what: str, extra: int = 0) -> int:
    """One axis, normalized against ``rank + extra`` (``extra=1``: stack's new axis)."""
    ax = int_attr(axis, "axis", what)
    n = rank + extra
    if not -n <= ax < n:
        raise ShapeError(f"axis {ax} of {what} is out of range for a tensor of rank {rank}")
    return ax % n


def axes_of(axis: Any, rank: int, what: str) -> tuple[int, ...]:
    """Axes (None: all), normalized, distinct, in the given order."""
    if axis is None:
        return tuple(range(rank))
    axes = [axis_of(a, rank, what) for a in ints_attr(axis, "axis", what)]
    if len(set(axes)) != len(axes):
        raise ShapeError(f"repeated axis in {axis!r} ({what})")
    return tuple(axes)


def _arr(x: Any, what: str) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (bool, int, float, np.generic)):
        return np.asarray(x)
    raise AnfirTypeError(f"{what} needs a tensor or a number, not {type(x).__name__}")


def _out(result: np.ndarray) -> Any:
    """A 0-d result as a numpy scalar (the evaluator's scalars), else the array."""
    return result[()] if isinstance(result, np.ndarray) and result.ndim == 0 else result


def _tensors(xs: Any, what: str) -> list[np.ndarray]:
    if not isinstance(xs, tuple) or not xs:
        raise AnfirTypeError(f"{what} needs a non-empty tuple of tensors, not {type(xs).__name__}")
    if len(xs) > MAX_PIECES:
        raise AnfirTypeError(f"{what} of {len(xs)} tensors is more than {MAX_PIECES}")
    arrays = [_arr(x, what) for x in xs]
    dtype = np.result_type(*arrays)
    return [a.astype(dtype, copy=False) for a in arrays]


def _shape_of(a: AbstractValue, what: str) -> tuple[str, Shape]:
    return rules.shape_of_abstract(a, what)


def _result(dtype: str, shape: Shape) -> AbstractValue:
    return rules.tensor_or_scalar(dtype, None if shape is None else tuple(shape))


def _sum_dims(dims: Sequence[Dim]) -> Dim:
    if all(isinstance(d, int) for d in dims):
        return sum(int(d) for d in dims)
    if any(is_unknown_dim(d) for d in dims):
        return fresh_dim()
    return norm_dim(sympy.expand(sum(sympy.sympify(d) for d in dims)))


def _tuple_items(xs: AbstractValue, what: str) -> list[tuple[str, Shape]]:
    if not isinstance(xs, ATuple) or not xs.items:
        raise AnfirTypeError(f"{what} needs a non-empty tuple of tensors, not {xs}")
    if len(xs.items) > MAX_PIECES:
        raise AnfirTypeError(f"{what} of {len(xs.items)} tensors is more than {MAX_PIECES}")
    return [_shape_of(item, what) for item in xs.items]


def _common_dtype(dtypes: Sequence[str]) -> str:
    return require_dtype_name(np.result_type(*[np.dtype(numpy_name(d)) for d in dtypes]))


# -- concat / stack / split --------------------------------------------------------------------
def _concat(xs: Any, axis: Any = 0) -> Any:
    """The tensors of xs joined along axis."""
    arrays = _tensors(xs, "concat")
    rank = arrays[0].ndim
    if rank == 0:
        raise ShapeError("concat needs tensors of rank >= 1, not scalars")
    ax = axis_of(axis, rank, "concat")
    for a in arrays:
        if a.ndim != rank or a.shape[:ax] + a.shape[ax + 1:] != arrays[0].shape[:ax] + arrays[0].shape[ax + 1:]:
            raise ShapeError(f"concat along axis {ax}: shapes {[list(b.shape) for b in arrays]} differ "
                             "off the axis")
    return np.concatenate(arrays, ax)


def _infer_concat(xs: AbstractValue, *, axis: Any = 0) -> AbstractValue:
    items = _tuple_items(xs, "concat")
    dtype = _common_dtype([d for d, _ in items])
    shapes = [s for _, s in items]
    if any(s is None for s in shapes):
        return ATensor(dtype, None)
    first = shapes[0]
    assert first is not None
    if not first:
        raise ShapeError("concat needs tensors of rank >= 1, not scalars")
    ax = axis_of(axis, len(first), "concat")
    out = list(first)
    for s in shapes[1:]:
        assert s is not None
        if len(s) != len(first) or not all(dims_compatible(a, b) for i, (a, b) in enumerate(zip(s, first))
                                           if i != ax):
            raise ShapeError(f"concat along axis {ax}: shapes "
                             f"{', '.join(shape_text(t) for t in shapes)} differ off the axis")
    out[ax] = _sum_dims([s[ax] for s in shapes if s is not None])
    return ATensor(dtype, tuple(out))


def _stack(xs: Any, axis: Any = 0) -> Any:
    """The tensors of xs (one shape) stacked along a new axis."""
    arrays = _tensors(xs, "stack")
    ax = axis_of(axis, arrays[0].ndim, "stack", extra=1)
    if any(a.shape != arrays[0].shape for a in arrays):
        raise ShapeError(f"stack needs tensors of one shape, not {[list(b.shape) for b in arrays]}")
    return np.stack(arrays, ax)


def _infer_stack(xs: AbstractValue, *, axis: Any = 0) -> AbstractValue:
    items = _tuple_items(xs, "stack")
    dtype = _common_dtype([d for d, _ in items])
    shapes = [s for _, s in items]
    if any(s is None for s in shapes):
        return ATensor(dtype, None)
    first = shapes[0]
    assert first is not None
    for s in shapes[1:]:
        assert s is not None
        if len(s) != len(first) or not all(dims_compatible(a, b) for a, b in zip(s, first)):
            raise ShapeError(f"stack needs tensors of one shape, not "
                             f"{', '.join(shape_text(t) for t in shapes)}")
    ax = axis_of(axis, len(first), "stack", extra=1)
    return ATensor(dtype, tuple(first[:ax]) + (len(shapes),) + tuple(first[ax:]))


def _stack_grad(dout: Any, xs: Any, axis: Any = 0) -> Any:
    """The pieces of a stacked tensor, as a tuple (the gradient of stack)."""
    array = _arr(dout, "stack_grad")
    ax = axis_of(axis, array.ndim - 1, "stack_grad", extra=1)
    return tuple(_out(np.take(array, i, axis=ax)) for i in range(array.shape[ax]))


def _infer_stack_grad(dout: AbstractValue, xs: AbstractValue, *, axis: Any = 0) -> AbstractValue:
    dtype, shape = _shape_of(dout, "stack_grad")
    items = _tuple_items(xs, "stack_grad")
    if shape is None:
        return ATuple(tuple(ATensor(dtype, None) for _ in items))
    ax = axis_of(axis, len(shape) - 1, "stack_grad", extra=1)
    piece = tuple(shape[:ax]) + tuple(shape[ax + 1:])
    return ATuple(tuple(_result(dtype, piece) for _ in items))


def split_sizes(n: int, sizes: Any) -> list[int]:
    """split's ``sizes`` (a piece count or the piece lengths) as the lengths of
    the pieces of an axis of length ``n``, checked."""
    if _is_int(sizes):
        count = int(sizes)
        if count < 1 or count > MAX_PIECES:
            raise ShapeError(f"split into {count} pieces: the count is between 1 and {MAX_PIECES}")
        chunk = -(-n // count)
        pieces = [chunk] * (count - 1) + [n - chunk * (count - 1)]
        if pieces[-1] < 0 or (n and pieces[-1] == 0 and count > 1 and n % count):
            raise ShapeError(f"cannot split an axis of {n} into {count} pieces")
        return pieces
    parts = list(ints_attr(sizes, "sizes", "split", scalar_ok=False))
    if len(parts) > MAX_PIECES or any(p < 0 for p in parts) or sum(parts) != n:
        raise ShapeError(f"split sizes {tuple(parts)} do not add up to the axis' {n}")
    return parts


def _split(x: Any, sizes: Any = None, axis: Any = 0) -> Any:
    """x cut into pieces along axis: sizes is a tuple of lengths or a count of equal pieces."""
    if sizes is None:
        raise AnfirTypeError("split needs sizes (a tuple of lengths, or a count of pieces)")
    array = _arr(x, "split")
    if array.ndim == 0:
        raise ShapeError("split needs a tensor of rank >= 1, not a scalar")
    ax = axis_of(axis, array.ndim, "split")
    parts = split_sizes(array.shape[ax], sizes)
    bounds = np.cumsum(parts)[:-1]
    return tuple(np.split(array, bounds, axis=ax))


def _infer_split(x: AbstractValue, *, sizes: Any = None, axis: Any = 0) -> AbstractValue:
    if sizes is None:
        raise AnfirTypeError("split needs sizes (a tuple of lengths, or a count of pieces)")
    dtype, shape = _shape_of(x, "split")
    count = int_attr(sizes, "sizes", "split") if _is_int(sizes) else \
        len(ints_attr(sizes, "sizes", "split", scalar_ok=False))
    if shape is None:
        return ATuple(tuple(ATensor(dtype, None) for _ in range(max(count, 0))))
    if not shape:
        raise ShapeError("split needs a tensor of rank >= 1, not a scalar")
    ax = axis_of(axis, len(shape), "split")
    n = shape[ax]
    parts: list[Dim]
    if isinstance(n, int):
        parts = list(split_sizes(n, sizes))
    elif _is_int(sizes):
        quotient = sympy.cancel(sympy.sympify(n) / int(sizes))
        num, den = sympy.fraction(quotient)
        parts = [norm_dim(num) if den == 1 and not is_unknown_dim(n) else fresh_dim()
                 for _ in range(int(sizes))]
    else:
        parts = list(ints_attr(sizes, "sizes", "split", scalar_ok=False))
        if not is_unknown_dim(n) and not dims_compatible(n, _sum_dims(parts)):
            raise ShapeError(f"split sizes {tuple(parts)} do not add up to the axis' {dim_text(n)}")
    return ATuple(tuple(ATensor(dtype, tuple(shape[:ax]) + (p,) + tuple(shape[ax + 1:]))
                        for p in parts))


def _concat_grad(dout: Any, xs: Any, axis: Any = 0) -> Any:
    """dout cut along axis into pieces the sizes of xs (the gradient of concat)."""
    array = _arr(dout, "concat_grad")
    ax = axis_of(axis, array.ndim, "concat_grad")
    sizes = [np.shape(x)[ax] for x in xs]
    return tuple(np.split(array, np.cumsum(sizes)[:-1], axis=ax))


def _infer_concat_grad(dout: AbstractValue, xs: AbstractValue, *, axis: Any = 0) -> AbstractValue:
    dtype, _ = _shape_of(dout, "concat_grad")
    return ATuple(tuple(ATensor(dtype, s) for _, s in _tuple_items(xs, "concat_grad")))


# -- slice ---------------------------------------------------------------------------------------
def slice_spec(rank: int, starts: Any, ends: Any, axes: Any, steps: Any
                ) -> list[tuple[int, int, int, int]]:
    """(axis, start, end, step) per sliced axis, checked."""
    if starts is None or ends is None:
        raise AnfirTypeError("slice needs starts and ends")
    s = ints_attr(starts, "starts", "slice")
    e = ints_attr(ends, "ends", "slice")
    a = tuple(range(len(s))) if axes is None else ints_attr(axes, "axes", "slice")
    st = (1,) * len(s) if steps is None else ints_attr(steps, "steps", "slice")
    if not len(s) == len(e) == len(a) == len(st):
        raise AnfirTypeError(f"slice: starts {s}, ends {e}, axes {a} and steps {st} differ in length")
    if any(step == 0 for step in st):
        raise AnfirTypeError("slice: a step is not 0")
    norm = [axis_of(ax, rank, "slice") for ax in a]
    if len(set(norm)) != len(norm):
        raise ShapeError(f"repeated axis in {a} (slice)")
    return list(zip(norm, s, e, st))


def _clamped(n: int, start: int, end: int, step: int) -> slice:
    """ONNX Slice's clamping, as a Python slice of an axis of length n."""
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), n), min(max(end, 0), n)
    else:
        start, end = min(max(start, 0), n - 1), min(max(end, -1), n - 1)
    return slice(start, None if end < 0 else end, step)


def slice_index(shape: tuple[int, ...], spec: list[tuple[int, int, int, int]]) -> tuple[slice, ...]:
    """The Python index (a slice per axis, ONNX Slice's clamping) of a ``slice_spec``
    on a concrete shape."""
    index = [slice(None)] * len(shape)
    for ax, s, e, st in spec:
        index[ax] = _clamped(shape[ax], s, e, st)
    return tuple(index)


def _slice(x: Any, starts: Any = None, ends: Any = None, axes: Any = None, steps: Any = None) -> Any:
    """ONNX Slice: starts/ends clamped, negative indices count from the end, any non-zero step."""
    array = _arr(x, "slice")
    spec = slice_spec(array.ndim, starts, ends, axes, steps)
    return array[slice_index(array.shape, spec)]


def _slice_len(n: Dim, start: int, end: int, step: int) -> Dim:
    if isinstance(n, int):
        return len(range(n)[_clamped(n, start, end, step)])
    if is_unknown_dim(n) or step != 1:
        return fresh_dim()
    # A symbolic length: assumed at least as long as the constant indices reach.
    if 0 <= end < BIG:
        return fresh_dim()  # min(end, n) is not known
    lo: Any = n + start if start < 0 else start
    hi: Any = n if end >= BIG else n + end
    length = norm_dim(sympy.expand(sympy.sympify(hi) - sympy.sympify(lo)))
    if isinstance(length, int):
        return max(length, 0)
    return length


def _infer_slice(x: AbstractValue, *, starts: Any = None, ends: Any = None, axes: Any = None,
                 steps: Any = None) -> AbstractValue:
    dtype, shape = _shape_of(x, "slice")
    if shape is None:
        slice_spec(0 if axes is None else 1 << 30, starts, ends, axes, steps)
        return ATensor(dtype, None)
    out = list(shape)
    for ax, s, e, st in slice_spec(len(shape), starts, ends, axes, steps):
        out[ax] = _slice_len(shape[ax], s, e, st)
    return ATensor(dtype, tuple(out))


def _slice_grad(dout: Any, x: Any, starts: Any = None, ends: Any = None, axes: Any = None,
                steps: Any = None) -> Any:
    """dout placed where slice(x, ...) took its elements, zeros elsewhere."""
    g = _arr(dout, "slice_grad")
    shape = np.shape(x)
    result = np.zeros(shape, g.dtype)
    result[slice_index(shape, slice_spec(len(shape), starts, ends, axes, steps))] = g
    return _out(result)


def _infer_like_second(name: str) -> Any:
    """The rule of a gradient helper ``name(dout, x, ...)``: x's shape, dout's dtype."""
    def rule(dout: AbstractValue, x: AbstractValue, *_rest: AbstractValue, **_attrs: Any) -> AbstractValue:
        dtype, _ = _shape_of(dout, name)
        _, shape = _shape_of(x, name)
        return _result(dtype, shape)
    rule.__name__ = rule.__qualname__ = f"infer_{name}"
    rule.__doc__ = f"Abstract rule of {name}: the second argument's shape, dout's dtype."
    return rule


# -- pad -------------------------------------------------------------------------------------------
PAD_MODES = ("constant", "reflect", "edge", "wrap")
_NP_MODES = {"reflect": "reflect", "edge": "edge", "wrap": "wrap"}


def pad_widths(pads: Any, rank: int, mode: Any) -> tuple[list[tuple[int, int]], str]:
    """pad's ``pads`` (all begins, then all ends) as a (begin, end) pair per axis of
    a tensor of ``rank``, with the checked ``mode``."""
    if pads is None:
        raise AnfirTypeError("pad needs pads (all begins, then all ends)")
    p = ints_attr(pads, "pads", "pad", scalar_ok=False)
    mode = rules.choice_attr(mode, "mode", "pad", PAD_MODES)
    if len(p) != 2 * rank:
        raise ShapeError(f"pad: {len(p)} pads for a tensor of rank {rank} (it needs {2 * rank}: "
                         "all begins, then all ends)")
    return [(p[i], p[i + rank]) for i in range(rank)], mode


def pad_source_index(n: int, begin: int, end: int, mode: str) -> np.ndarray:
    """For each position of a padded axis of length n, the source element (-1: the value)."""
    grow = (max(begin, 0), max(end, 0))
    if mode == "constant":
        index = np.pad(np.arange(n), grow, mode="constant", constant_values=-1)
    else:
        if n == 0 and any(grow):
            raise ShapeError(f"pad mode {mode} needs a non-empty axis")
        if mode == "reflect" and n == 1 and any(grow):
            index = np.zeros(n + sum(grow), np.int64)
        elif mode == "reflect" and max(grow) >= n:
            raise ShapeError(f"pad mode reflect pads less than the axis' length {n}, not {max(grow)}")
        else:
            index = np.pad(np.arange(n), grow, mode=_NP_MODES[mode])  # type: ignore[call-overload]
    lo = -begin if begin < 0 else 0
    hi = len(index) + end if end < 0 else len(index)
    if hi < lo:
        raise ShapeError(f"pad: the negative pads ({begin}, {end}) remove more than the axis' {n}")
    return np.asarray(index[lo:hi], np.int64)


def _pad(x: Any, pads: Any = None, mode: Any = "constant", value: Any = 0) -> Any:
    """x padded as ONNX Pad (negative pads crop): constant value, reflect, edge or wrap."""
    array = _arr(x, "pad")
    spec, mode = pad_widths(pads, array.ndim, mode)
    rules.float_attr(value, "value", "pad")
    out = array
    for ax, (b, e) in enumerate(spec):
        if b == 0 and e == 0:
            continue
        index = pad_source_index(array.shape[ax], b, e, mode)
        out = np.take(out, np.maximum(index, 0), axis=ax) if array.shape[ax] else \
            np.zeros(out.shape[:ax] + (len(index),) + out.shape[ax + 1:], array.dtype)
        if mode == "constant" and (index < 0).any():
            mask = (index < 0).reshape((-1,) + (1,) * (array.ndim - ax - 1))
            out = np.where(mask, np.asarray(value).astype(array.dtype), out)
    return _out(np.asarray(out, array.dtype))


def _infer_pad(x: AbstractValue, *, pads: Any = None, mode: Any = "constant", value: Any = 0
               ) -> AbstractValue:
    dtype, shape = _shape_of(x, "pad")
    rules.float_attr(value, "value", "pad")
    if shape is None:
        rules.choice_attr(mode, "mode", "pad", PAD_MODES)
        return ATensor(dtype, None)
    spec, checked_mode = pad_widths(pads, len(shape), mode)
    out: list[Dim] = []
    for d, (b, e) in zip(shape, spec):
        if isinstance(d, int):
            pad_source_index(d, b, e, checked_mode)  # the mode's limits (reflect: pads < length)
            new = d + b + e
            if new < 0:
                raise ShapeError(f"pad: the negative pads ({b}, {e}) remove more than the axis' {d}")
            out.append(new)
        else:
            out.append(fresh_dim() if is_unknown_dim(d) and (b or e) else norm_dim(sympy.expand(d + b + e)))
    return _result(dtype, tuple(out))


def _pad_grad(dout: Any, x: Any, pads: Any = None, mode: Any = "constant") -> Any:
    """The adjoint of pad: each padded element's gradient added back to its source."""
    g = _arr(dout, "pad_grad")
    shape = np.shape(x)
    spec, mode = pad_widths(pads, len(shape), mode)
    out = g
    for ax, (b, e) in enumerate(spec):
        if b == 0 and e == 0:
            continue
        index = pad_source_index(shape[ax], b, e, mode)
        keep = index >= 0
        moved = np.moveaxis(out, ax, 0)
        acc = np.zeros((shape[ax],) + moved.shape[1:], g.dtype)
        np.add.at(acc, index[keep], moved[keep])
        out = np.moveaxis(acc, 0, ax)
    return _out(np.asarray(out, g.dtype))


# -- squeeze / unsqueeze / flatten / expand ------------------------------------------------------
def _squeeze(x: Any, axis: Any = None) -> Any:
    """x without its length-1 axes (None: all of them)."""
    array = _arr(x, "squeeze")
    if axis is None:
        return _out(np.squeeze(array))
    axes = axes_of(axis, array.ndim, "squeeze")
    for ax in axes:
        if array.shape[ax] != 1:
            raise ShapeError(f"squeeze: axis {ax} of a tensor of shape {list(array.shape)} has "
                             f"length {array.shape[ax]}, not 1")
    return _out(np.squeeze(array, axes))


def _infer_squeeze(x: AbstractValue, *, axis: Any = None) -> AbstractValue:
    dtype, shape = _shape_of(x, "squeeze")
    if shape is None:
        return ATensor(dtype, None)
    if axis is None:
        return _result(dtype, tuple(d for d in shape if not (isinstance(d, int) and d == 1)))
    axes = axes_of(axis, len(shape), "squeeze")
    for ax in axes:
        d = shape[ax]
        if not (is_unknown_dim(d) or (isinstance(d, int) and d == 1)):
            raise ShapeError(f"squeeze: axis {ax} of {shape_text(shape, dtype)} has length "
                             f"{dim_text(d)}, not 1")
    return _result(dtype, tuple(d for i, d in enumerate(shape) if i not in axes))


def unsqueeze_axes(axis: Any, rank: int) -> tuple[int, ...]:
    """unsqueeze's ``axis`` as sorted, normalised positions in the result of rank
    ``rank + len(axis)``."""
    if axis is None:
        raise AnfirTypeError("unsqueeze needs an axis (an integer or a tuple of integers)")
    given = ints_attr(axis, "axis", "unsqueeze")
    out_rank = rank + len(given)
    axes = tuple(axis_of(a, out_rank, "unsqueeze") for a in given)
    if len(set(axes)) != len(axes):
        raise ShapeError(f"repeated axis in {axis!r} (unsqueeze)")
    return tuple(sorted(axes))


def _unsqueeze(x: Any, axis: Any = None) -> Any:
    """x with new length-1 axes at the given positions (of the result)."""
    array = _arr(x, "unsqueeze")
    return np.expand_dims(array, unsqueeze_axes(axis, array.ndim))


def _infer_unsqueeze(x: AbstractValue, *, axis: Any = None) -> AbstractValue:
    dtype, shape = _shape_of(x, "unsqueeze")
    if shape is None:
        unsqueeze_axes(axis, 1 << 30)
        return ATensor(dtype, None)
    axes = unsqueeze_axes(axis, len(shape))
    out: list[Dim] = []
    rest = iter(shape)
    for i in range(len(shape) + len(axes)):
        out.append(1 if i in axes else next(rest))
    return ATensor(dtype, tuple(out))


def flatten_range(rank: int, start: Any, end: Any) -> tuple[int, int]:
    """flatten's ``start`` and ``end`` as normalised axes of a tensor of ``rank``."""
    r = max(rank, 1)
    s = axis_of(start, r, "flatten")
    e = axis_of(end, r, "flatten")
    if s > e:
        raise ShapeError(f"flatten: start {start} comes after end {end} (rank {rank})")
    return s, e


def _flatten(x: Any, start: Any = 0, end: Any = -1) -> Any:
    """The axes start..end (inclusive) of x merged into one, as torch.flatten."""
    array = _arr(x, "flatten")
    s, e = flatten_range(array.ndim, start, end)
    if array.ndim == 0:
        return array.reshape(1)
    shape = array.shape
    return array.reshape(shape[:s] + (int(np.prod(shape[s:e + 1])),) + shape[e + 1:])


def _infer_flatten(x: AbstractValue, *, start: Any = 0, end: Any = -1) -> AbstractValue:
    dtype, shape = _shape_of(x, "flatten")
    if shape is None:
        int_attr(start, "start", "flatten")
        int_attr(end, "end", "flatten")
        return ATensor(dtype, None)
    s, e = flatten_range(len(shape), start, end)
    if not shape:
        return ATensor(dtype, (1,))
    middle = shape[s:e + 1]
    merged = fresh_dim() if any(is_unknown_dim(d) for d in middle) else product(middle)
    return ATensor(dtype, tuple(shape[:s]) + (merged,) + tuple(shape[e + 1:]))


def shape_value(shape: Any, what: str) -> tuple[int, ...]:
    """expand's target shape (an integer, a tuple or a 1-d integer array) as ints."""
    if _is_int(shape):
        return (int(shape),)
    if isinstance(shape, tuple) and all(_is_int(d) for d in shape):
        return tuple(int(d) for d in shape)
    if isinstance(shape, np.ndarray) and shape.ndim == 1 and shape.dtype.kind in "iu":
        return tuple(int(d) for d in shape)
    raise AnfirTypeError(f"the shape of {what} is a tuple of integers, not {shape!r}")


def _expand(x: Any, shape: Any) -> Any:
    """x broadcast with shape both ways (ONNX Expand): the result has the broadcast shape."""
    array = _arr(x, "expand")
    target = shape_value(shape, "expand")
    if any(d < 0 for d in target):
        raise ShapeError(f"expand: the shape {target} has a negative dimension")
    try:
        out = np.broadcast_shapes(array.shape, target)
    except ValueError:
        raise ShapeError(f"expand: shapes {list(array.shape)} and {list(target)} do not broadcast") from None
    return _out(np.broadcast_to(array, out))


def _infer_expand(x: AbstractValue, shape: AbstractValue) -> AbstractValue:
    dtype, old = _shape_of(x, "expand")
    target = rules.dims_of_shape_arg(shape, "the shape of expand")
    return _result(dtype, broadcast_shapes([old, target], [dtype, ""]))


# -- tile / flip / roll / tril / triu / rank -----------------------------------------------------------
def _tile(x: Any, reps: Any = None) -> Any:
    """x repeated reps times along each axis (numpy tile)."""
    if reps is None:
        raise AnfirTypeError("tile needs reps")
    r = ints_attr(reps, "reps", "tile")
    if any(v < 0 for v in r):
        raise ShapeError(f"tile: reps {r} has a negative count")
    return _out(np.tile(_arr(x, "tile"), r))


def tile_layout(shape: Sequence[Dim], reps: tuple[int, ...]) -> tuple[list[Dim], list[int]]:
    """tile's operand dims and repeat counts padded with leading 1s to one rank."""
    rank = max(len(shape), len(reps))
    dims = [1] * (rank - len(shape)) + list(shape)
    counts = [1] * (rank - len(reps)) + list(reps)
    return dims, counts


def _infer_tile(x: AbstractValue, *, reps: Any = None) -> AbstractValue:
    if reps is None:
        raise AnfirTypeError("tile needs reps")
    dtype, shape = _shape_of(x, "tile")
    r = ints_attr(reps, "reps", "tile")
    if any(v < 0 for v in r):
        raise ShapeError(f"tile: reps {r} has a negative count")
    if shape is None:
        return ATensor(dtype, None)
    dims, counts = tile_layout(shape, r)
    return _result(dtype, tuple(norm_dim(d * c) if not isinstance(d, int) else d * c
                                for d, c in zip(dims, counts)))


def _tile_grad(dout: Any, x: Any, reps: Any = None) -> Any:
    """The adjoint of tile: the copies' gradients summed onto x's shape."""
    g = _arr(dout, "tile_grad")
    shape = np.shape(x)
    dims, counts = tile_layout(shape, ints_attr(reps, "reps", "tile_grad"))
    interleaved = [v for pair in zip(counts, dims) for v in pair]
    summed = g.reshape(interleaved).sum(axis=tuple(range(0, 2 * len(dims), 2)))
    return _out(np.asarray(summed.reshape(shape), g.dtype))


def _flip(x: Any, axis: Any = None) -> Any:
    """x with the order of the elements along axis (None: every axis) reversed."""
    array = _arr(x, "flip")
    return _out(np.flip(array, axes_of(axis, array.ndim, "flip")))


def roll_args(shift: Any, axis: Any, rank: int) -> tuple[tuple[int, ...], Optional[tuple[int, ...]]]:
    """roll's ``shift`` and ``axis`` checked for a tensor of ``rank``: the shifts and
    the normalised axes (None: roll the flattened tensor)."""
    if shift is None:
        raise AnfirTypeError("roll needs a shift")
    shifts = ints_attr(shift, "shift", "roll")
    if axis is None:
        if len(shifts) != 1:
            raise AnfirTypeError(f"roll without an axis takes one shift, not {shifts}")
        return shifts, None
    axes = tuple(axis_of(a, rank, "roll") for a in ints_attr(axis, "axis", "roll"))
    if len(axes) != len(shifts):
        raise AnfirTypeError(f"roll: {len(shifts)} shifts for {len(axes)} axes")
    return shifts, axes


def _roll(x: Any, shift: Any = None, axis: Any = None) -> Any:
    """x's elements moved shift places along axis, wrapping round (None: of the flattened x)."""
    array = _arr(x, "roll")
    shifts, axes = roll_args(shift, axis, array.ndim)
    if axes is None:
        return _out(np.roll(array, shifts[0]))
    return _out(np.roll(array, shifts, axes))


def _roll_back(dout: Any, shift: Any = None, axis: Any = None) -> Any:
    """roll by minus shift (the gradient of roll)."""
    shifts, _ = roll_args(shift, axis, np.ndim(dout))
    return _roll(dout, tuple(-s for s in shifts) if isinstance(shift, tuple) else -shifts[0], axis)


def _infer_same(name: str, check: Any) -> Any:
    """The rule of an operator whose result has x's shape and dtype (``check`` checks the attributes)."""
    def rule(x: AbstractValue, **attrs: Any) -> AbstractValue:
        dtype, shape = _shape_of(x, name)
        check(1 << 30 if shape is None else len(shape), **attrs)
        return _result(dtype, shape)
    rule.__name__ = rule.__qualname__ = f"infer_{name}"
    rule.__doc__ = f"Abstract rule of {name}: x's shape and dtype."
    return rule


def _check_flip(rank: int, axis: Any = None) -> None:
    if rank < 1 << 30:
        axes_of(axis, rank, "flip")


def _check_roll(rank: int, shift: Any = None, axis: Any = None) -> None:
    roll_args(shift, axis, rank)


def _triangle(name: str, np_fn: Any) -> Any:
    def impl(x: Any, k: Any = 0) -> Any:
        array = _arr(x, name)
        if array.ndim < 2:
            raise ShapeError(f"{name} needs a tensor of rank >= 2, not {list(array.shape)}")
        return np_fn(array, int_attr(k, "k", name))
    impl.__name__ = f"_{name}"
    impl.__doc__ = f"{name}(x, k): the matrices of x with the elements off the triangle zeroed."
    return impl


def _check_triangle(name: str) -> Any:
    def check(rank: int, k: Any = 0) -> None:
        int_attr(k, "k", name)
        if rank < 2:
            raise ShapeError(f"{name} needs a tensor of rank >= 2")
    return check


def _rank(x: Any) -> int:
    """The number of axes of x (0 for a number)."""
    return int(_arr(x, "rank").ndim)


def _infer_rank(x: AbstractValue) -> AbstractValue:
    _, shape = _shape_of(x, "rank")
    return AScalar("i64") if shape is None else AScalar("i64", len(shape))


def _infer_roll_back(dout: AbstractValue, **attrs: Any) -> AbstractValue:
    result: AbstractValue = _infer_same("roll", _check_roll)(dout, **attrs)
    return result


# -- declarations ------------------------------------------------------------------------------
concat = declare("concat", 1, _concat, infer=_infer_concat, family=FAMILY,
                 attrs={"axis": 0}, positional_attrs=1,
                 doc="concat(xs, axis=0) — the tensors of the tuple xs joined along an axis",
    bprop="lambda (xs, axis, out, dout) (concat_grad(dout, xs, axis),) end")
concat_grad = declare("concat_grad", 2, _concat_grad, infer=_infer_concat_grad, family=FAMILY,
                      internal=True, attrs={"axis": 0}, positional_attrs=1,
                      doc="concat_grad(dout, xs, axis) — dout cut into pieces the sizes of xs "
                          "(the gradient of concat)",
    bprop="lambda (dout, xs, axis, out, dd) (concat(dd, axis), zeros_like(xs)) end")
stack = declare("stack", 1, _stack, infer=_infer_stack, family=FAMILY,
                attrs={"axis": 0}, positional_attrs=1,
                doc="stack(xs, axis=0) — the tensors of the tuple xs (one shape) along a new axis",
    bprop="lambda (xs, axis, out, dout) (stack_grad(dout, xs, axis),) end")
stack_grad = declare("stack_grad", 2, _stack_grad, infer=_infer_stack_grad, family=FAMILY,
                     internal=True, attrs={"axis": 0}, positional_attrs=1,
                     doc="stack_grad(dout, xs, axis) — the pieces of dout along axis, as a tuple "
                         "(the gradient of stack)",
    bprop="lambda (dout, xs, axis, out, dd) (stack(dd, axis), zeros_like(xs)) end")
split = declare("split", 1, _split, infer=_infer_split, family=FAMILY,
                attrs={"sizes": None, "axis": 0}, positional_attrs=2,
                doc="split(x, sizes, axis=0) — a tuple of pieces of x along axis: sizes is a "
                    "tuple of lengths, or a count of equal pieces (the last one smaller, as ONNX)",
    bprop="lambda (x, sizes, axis, out, dout) (concat(dout, axis),) end")
slice_ = declare("slice", 1, _slice, infer=_infer_slice, family=FAMILY,
                 attrs={"starts": None, "ends": None, "axes": None, "steps": None},
                 positional_attrs=4,
                 doc="slice(x, starts, ends, axes=None, steps=None) — ONNX Slice: per axis the "
                     "elements start, start + step... before end; negative indices count from "
                     "the end, out-of-range ones are clamped",
    bprop="""lambda (x, starts, ends, axes, steps, out, dout)
        (slice_grad(dout, x, starts, ends, axes, steps),) end""")
slice_grad = declare("slice_grad", 2, _slice_grad, infer=_infer_like_second("slice_grad"),
                     family=FAMILY, internal=True,
                     attrs={"starts": None, "ends": None, "axes": None, "steps": None},
                     positional_attrs=4,
                     doc="slice_grad(dout, x, starts, ends, axes, steps) — zeros of x's shape "
                         "with dout where slice took its elements (the gradient of slice)",
    bprop="""lambda (dout, x, starts, ends, axes, steps, out, dd)
        (slice(dd, starts, ends, axes, steps), zeros_like(x)) end""")
pad = declare("pad", 1, _pad, infer=_infer_pad, family=FAMILY,
              attrs={"pads": None, "mode": "constant", "value": 0}, positional_attrs=3,
              doc='pad(x, pads, mode="constant", value=0) — x padded as ONNX Pad: pads are all '
                  'begins then all ends (negative ones crop); modes "constant" (value), '
                  '"reflect", "edge", "wrap"',
    bprop="lambda (x, pads, mode, value, out, dout) (pad_grad(dout, x, pads, mode),) end")
pad_grad = declare("pad_grad", 2, _pad_grad, infer=_infer_like_second("pad_grad"), family=FAMILY,
                   internal=True, attrs={"pads": None, "mode": "constant"}, positional_attrs=2,
                   doc="pad_grad(dout, x, pads, mode) — the gradient of pad: each element of dout "
                       "added to the element of x it was copied from",
    bprop="lambda (dout, x, pads, mode, out, dd) (pad(dd, pads, mode, 0), zeros_like(x)) end")
squeeze = declare("squeeze", 1, _squeeze, infer=_infer_squeeze, family=FAMILY,
                  attrs={"axis": None}, positional_attrs=1,
                  doc="squeeze(x, axis=None) — x without the given length-1 axes (None: all)",
    bprop="lambda (x, axis, out, dout) (reshape_like(dout, x),) end")
unsqueeze = declare("unsqueeze", 1, _unsqueeze, infer=_infer_unsqueeze, family=FAMILY,
                    attrs={"axis": None}, positional_attrs=1,
                    doc="unsqueeze(x, axis) — x with a new length-1 axis at each given position "
                        "of the result",
    bprop="lambda (x, axis, out, dout) (reshape_like(dout, x),) end")
flatten = declare("flatten", 1, _flatten, infer=_infer_flatten, family=FAMILY,
                  attrs={"start": 0, "end": -1}, positional_attrs=2,
                  doc="flatten(x, start=0, end=-1) — the axes start..end merged (torch.flatten)",
    bprop="lambda (x, start, last, out, dout) (reshape_like(dout, x),) end")
expand = declare("expand", 2, _expand, infer=_infer_expand, family=FAMILY,
                 doc="expand(x, shape) — x broadcast with shape both ways (ONNX Expand)",
    bprop="lambda (x, s, out, dout) (sum_to(dout, x), zeros_like(s)) end")
tile = declare("tile", 1, _tile, infer=_infer_tile, family=FAMILY,
               attrs={"reps": None}, positional_attrs=1,
               doc="tile(x, reps) — x repeated along each axis (numpy tile)",
    bprop="lambda (x, reps, out, dout) (tile_grad(dout, x, reps),) end")
tile_grad = declare("tile_grad", 2, _tile_grad, infer=_infer_like_second("tile_grad"),
                    family=FAMILY, internal=True, attrs={"reps": None}, positional_attrs=1,
                    doc="tile_grad(dout, x, reps) — the copies of dout summed onto x's shape "
                        "(the gradient of tile)",
    bprop="lambda (dout, x, reps, out, dd) (tile(dd, reps), zeros_like(x)) end")
flip = declare("flip", 1, _flip, infer=_infer_same("flip", _check_flip), family=FAMILY,
               attrs={"axis": None}, positional_attrs=1,
               doc="flip(x, axis=None) — x reversed along axes (None: all)",
    bprop="lambda (x, axis, out, dout) (flip(dout, axis),) end")
roll = declare("roll", 1, _roll, infer=_infer_same("roll", _check_roll), family=FAMILY,
               attrs={"shift": None, "axis": None}, positional_attrs=2,
               doc="roll(x, shift, axis=None) — x's elements moved shift places along axes, "
                   "wrapping round (numpy roll)",
    bprop="lambda (x, shift, axis, out, dout) (roll_back(dout, shift, axis),) end")
roll_back = declare("roll_back", 1, _roll_back, infer=_infer_roll_back, family=FAMILY,
                    internal=True, attrs={"shift": None, "axis": None}, positional_attrs=2,
                    doc="roll_back(dout, shift, axis) — roll by minus shift (the gradient of roll)",
    bprop="lambda (dout, shift, axis, out, dd) (roll(dd, shift, axis),) end")
tril = declare("tril", 1, _triangle("tril", np.tril), infer=_infer_same("tril", _check_triangle("tril")),
               family=FAMILY, attrs={"k": 0}, positional_attrs=1,
               doc="tril(x, k=0) — the matrices of x with the elements above diagonal k zeroed",
    bprop="lambda (x, k, out, dout) (tril(dout, k),) end")
triu = declare("triu", 1, _triangle("triu", np.triu), infer=_infer_same("triu", _check_triangle("triu")),
               family=FAMILY, attrs={"k": 0}, positional_attrs=1,
               doc="triu(x, k=0) — the matrices of x with the elements below diagonal k zeroed",
    bprop="lambda (x, k, out, dout) (triu(dout, k),) end")
rank = declare("rank", 1, _rank, infer=_infer_rank, family=FAMILY, differentiable=False,
               doc="rank(x) — the number of axes of x (0 for a number)")

__all__ = ["concat", "stack", "split", "slice_", "pad", "squeeze", "unsqueeze", "flatten",
           "expand", "tile", "flip", "roll", "tril", "triu", "rank", "concat_grad", "stack_grad",
           "slice_grad", "pad_grad", "tile_grad", "roll_back", "int_attr", "ints_attr",
           "axis_of", "axes_of"]

"""Convolution, pooling and inference batch normalization (channels-first, N-d).

``conv``/``conv_transpose`` follow PyTorch (``conv_transpose`` exactly as
``conv_transpose{1,2,3}d``), the spatial rank coming from the weight's rank;
``padding`` is an int, a per-axis tuple, ONNX's begins-then-ends tuple, or
``"same"``/``"valid"``.  Pooling follows PyTorch's ``max_pool*d``/``avg_pool*d``
(``ceil_mode``, ``count_include_pad``).

Kernels are im2col: the padded input's windows, an ``as_strided`` view,
copied once into the column layout a single batched ``matmul`` reads in place
(float32 stays float32, so BLAS's sgemm does the work); the input gradient is
the transposed matmul and col2im; pooling is one vectorised pass per kernel
offset. No Python loop runs over pixels or batch elements.

Gradients are graphs of the internal primitives below, each the adjoint of
another, so every order of differentiation stays in this closed family:
``conv_core`` (conv without bias) ↔ ``conv_input_grad`` ↔ ``conv_weight_grad``;
``max_pool_grad`` ↔ ``max_pool_select``; ``avg_pool`` ↔ ``avg_pool_grad``;
``channel_sum`` ↔ ``channel_spread`` (the bias and batch-norm vectors).
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

import numpy as np
import sympy
from numpy.lib.stride_tricks import as_strided, sliding_window_view

from anfir.abstract import rules
from anfir.abstract.shapes import norm_dim
from anfir.abstract.values import AbstractValue, ANone, ATensor, Dim
from anfir.dtypes import numpy_name, require_dtype_name
from anfir.errors import AnfirTypeError, ShapeError
from anfir.primitives.registry import declare

FAMILY = "nn"
_CONV = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1}


# -- attributes ---------------------------------------------------------------------------
def per_axis_ints(value: Any, n: int, name: str, what: str, least: int = 1) -> tuple[int, ...]:
    """An int-or-tuple attribute as n ints, each >= least."""
    items = value if isinstance(value, tuple) else (value,) * n
    if len(items) != n or not all(isinstance(v, int) and not isinstance(v, bool) and v >= least
                                  for v in items):
        raise AnfirTypeError(f"the attribute {name} of {what} is an integer >= {least} or a tuple "
                             f"of {n} of them, not {value!r}")
    return tuple(items)


def padding_attr(padding: Any, n: int, what: str, *, spatial: Sequence[Dim] = (),
          kernel: Sequence[int] = (), stride: Sequence[int] = (),
          dilation: Sequence[int] = (), strings: bool = True) -> Optional[tuple[Dim, ...]]:
    """The padding attribute as 2n pads (begins then ends); None for "same" on symbolic sizes."""
    if isinstance(padding, str) and strings:
        if padding == "valid":
            return (0,) * (2 * n)
        if padding == "same":
            if any(not isinstance(s, (int, np.integer)) for s in spatial):
                return None
            totals = [max((-(-int(i) // s) - 1) * s + d * (k - 1) + 1 - int(i), 0)
                      for i, k, s, d in zip(spatial, kernel, stride, dilation)]
            return tuple(t // 2 for t in totals) + tuple(t - t // 2 for t in totals)
    if isinstance(padding, int) and not isinstance(padding, bool) and padding >= 0:
        return (padding,) * (2 * n)
    if isinstance(padding, tuple) and all(isinstance(p, int) and not isinstance(p, bool) and p >= 0
                                          for p in padding):
        if len(padding) == n:
            return padding + padding
        if len(padding) == 2 * n:
            return padding
    strs = ', "same" or "valid"' if strings else ""
    raise AnfirTypeError(f"the padding of {what} is an integer >= 0, a tuple of {n} or of "
                         f"{2 * n} (begins then ends) of them{strs}, not {padding!r}")


def _spatial_rank(w: Any, what: str) -> int:
    n = np.ndim(w) - 2
    if n not in (1, 2, 3):
        raise AnfirTypeError(f"{what} needs a weight of rank 3, 4 or 5 (1-, 2- or 3-d), "
                             f"not rank {np.ndim(w)}")
    return n


def conv_params(x: Any, w: Any, stride: Any, padding: Any, dilation: Any, groups: Any,
                 what: str) -> tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...], int]:
    """(n, stride, pads, dilation, groups) of a convolution of concrete x by w."""
    n = _spatial_rank(w, what)
    if np.ndim(x) != n + 2:
        raise AnfirTypeError(f"{what}: the input has rank {np.ndim(x)}, the weight's needs {n + 2}")
    st = per_axis_ints(stride, n, "stride", what)
    dil = per_axis_ints(dilation, n, "dilation", what)
    g = per_axis_ints(groups, 1, "groups", what)[0]
    pads = padding_attr(padding, n, what, spatial=np.shape(x)[2:], kernel=np.shape(w)[2:], stride=st,
                 dilation=dil)
    assert pads is not None
    return n, st, tuple(int(p) for p in pads), dil, g


def _result_dtype(*arrays: Any) -> np.dtype[Any]:
    dtype = np.result_type(*[np.asarray(a).dtype for a in arrays])
    return dtype if dtype.kind in "fc" else np.dtype(np.float64)


# -- kernels ------------------------------------------------------------------------------
# Every kernel is im2col: the input's windows, a strided view (N, C, K..., OUT...) of the
# padded input, copied once into the column layout that one batched matmul reads in place
# (float32 stays float32: BLAS's sgemm). Per spatial offset of the kernel there is at most
# one vectorised pass (pooling, col2im); nothing loops over pixels or batch elements.
def _pad(x: np.ndarray, pads: Sequence[int], n: int, value: float = 0.0) -> np.ndarray:
    """x padded (or cropped, for negative pads) on its last n axes."""
    crop = tuple(slice(max(-b, 0), x.shape[2 + i] - max(-e, 0))
                 for i, (b, e) in enumerate(zip(pads[:n], pads[n:])))
    x = x[(slice(None), slice(None)) + crop]
    begins = [max(b, 0) for b in pads[:n]]
    ends = [max(e, 0) for e in pads[n:]]
    if not any(begins) and not any(ends):
        return x
    # One allocation and one copy (np.pad costs far more per call on small maps).
    padded = np.full((*x.shape[:2], *(s + b + e for s, b, e in zip(x.shape[2:], begins, ends))),
                     value, x.dtype)
    padded[(slice(None), slice(None)) + tuple(slice(b, b + s) for b, s in zip(begins, x.shape[2:]))] = x
    return padded


def _window_view(xp: np.ndarray, kernel: Sequence[int], stride: Sequence[int],
                 dilation: Sequence[int], out: Sequence[int]) -> np.ndarray:
    """The read-only view (N, C, kernel..., out...) of xp: [.., k, p] = xp[.., p*s + k*d]
    (the caller checks that every window fits: (out-1)*s + d*(k-1) < xp's size)."""
    strides = xp.strides
    n = len(kernel)
    return as_strided(xp, (*xp.shape[:2], *kernel, *out),
                      (*strides[:2], *(strides[2 + a] * dilation[a] for a in range(n)),
                       *(strides[2 + a] * stride[a] for a in range(n))), writeable=False)


def _offsets(kernel: Sequence[int], stride: Sequence[int], dilation: Sequence[int],
             out: Sequence[int]) -> tuple[tuple[slice, ...], ...]:
    """Per kernel offset (in flat order), the index of the input cells it reads: xp[index]
    is the (N, C, out...) map of that offset, a strided view."""
    return _offsets_of(tuple(kernel), tuple(stride), tuple(dilation), tuple(out))


@functools.lru_cache(maxsize=512)
def _offsets_of(kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
                out: tuple[int, ...]) -> tuple[tuple[slice, ...], ...]:
    # Cached: a network calls the same few layer shapes again and again, and building
    # the slices costs as much as the arithmetic of a small layer.
    return tuple((slice(None), slice(None)) + tuple(slice(o * d, o * d + (m - 1) * s + 1, s)
                                                    for o, d, m, s in zip(offset, dilation, out, stride))
                 for offset in np.ndindex(*kernel))


@functools.lru_cache(maxsize=64)
def _kernel_cells(kernel: tuple[int, ...]) -> tuple[tuple[Any, ...], ...]:
    """Per kernel offset (in flat order), the index of its (N, C, out...) map in columns
    shaped (N, C, kernel..., out...)."""
    return tuple((slice(None), slice(None)) + offset for offset in np.ndindex(*kernel))


def _out_size(i: int, k: int, s: int, d: int, total_pad: int, ceil: bool = False) -> int:
    span = i + total_pad - d * (k - 1) - 1
    if span < 0:
        raise ShapeError(f"the kernel (extent {d * (k - 1) + 1}) is larger than the padded "
                         f"input ({i + total_pad})")
    return (-(-span // s) if ceil else span // s) + 1


def _columns(x: np.ndarray, kernel: Sequence[int], stride: Sequence[int], pads: Sequence[int],
             dilation: Sequence[int], out: Sequence[int], groups: int) -> np.ndarray:
    """im2col: x's windows as (groups, C/groups * K, N * P) columns, contiguous (P = the
    output's cells): one copy of the window view in the order (C, K..., N, OUT...), so
    that one matmul per group covers the whole batch and reads each weight once (a
    matmul per batch element is a matrix-vector product on a 1x1 map)."""
    n = len(kernel)
    batch, channels = x.shape[:2]
    if all(k == 1 for k in kernel) and all(s == 1 for s in stride) and not any(pads):
        view = x[(slice(None), slice(None)) + tuple(slice(0, o) for o in out)]
        order: tuple[int, ...] = (1, 0, *range(2, 2 + n))
    else:
        view = _window_view(_pad(x, pads, n), kernel, stride, dilation, out)
        order = (1, *range(2, 2 + n), 0, *range(2 + n, 2 + 2 * n))
    cols: np.ndarray = view.transpose(order)
    if batch > 1 or not cols.flags.c_contiguous:
        cols = np.ascontiguousarray(cols)
    return cols.reshape(groups, channels // groups * int(np.prod(kernel)), batch * int(np.prod(out)))


def _batch_last(dout: np.ndarray, groups: int) -> np.ndarray:
    """dout (N, O, OUT...) as (groups, O/groups, N * P), contiguous (a copy unless N = 1)."""
    batch, channels = dout.shape[:2]
    moved = dout.reshape(batch, channels, -1).transpose(1, 0, 2)
    return np.ascontiguousarray(moved).reshape(groups, channels // groups, -1)


def _col2im(cols: np.ndarray, spatial: Sequence[int], kernel: Sequence[int],
            stride: Sequence[int], pads: Sequence[int], dilation: Sequence[int],
            out: Sequence[int]) -> np.ndarray:
    """The adjoint of im2col: cols (N, C, kernel..., out...) added back at every window
    cell of a padded (N, C, spatial + pads) map, returned unpadded."""
    n = len(kernel)
    padded = [s + b + e for s, b, e in zip(spatial, pads[:n], pads[n:])]
    acc = np.zeros((*cols.shape[:2], *padded), cols.dtype)
    for index, cell in zip(_offsets(kernel, stride, dilation, out), _kernel_cells(tuple(kernel))):
        acc[index] += cols[cell]
    return _pad(acc, [-p for p in pads], n)


def _check_groups(channels: int, w: np.ndarray, groups: int, what: str) -> None:
    if channels != w.shape[1] * groups or w.shape[0] % groups:
        raise ShapeError(f"{what}: input channels {channels} and weight {w.shape} do not fit "
                         f"groups={groups}")


def _conv_np(x: np.ndarray, w: np.ndarray, stride: Sequence[int], pads: Sequence[int],
             dilation: Sequence[int], groups: int) -> np.ndarray:
    """The convolution (cross-correlation) of x (N, C, S...) by w (O, C/groups, K...):
    per group, the (O/groups, C/groups*K) weight matrix times the (C/groups*K, N*P)
    columns, moved to (N, O, OUT...)."""
    n = w.ndim - 2
    dtype = _result_dtype(x, w)
    x, w = x.astype(dtype, copy=False), w.astype(dtype, copy=False)
    _check_groups(x.shape[1], w, groups, "conv")
    kernel = w.shape[2:]
    out = [_out_size(i, k, s, d, b + e) for i, k, s, d, b, e
           in zip(x.shape[2:], kernel, stride, dilation, pads[:n], pads[n:])]
    cols = _columns(x, kernel, stride, pads, dilation, out, groups)
    result = np.matmul(w.reshape(groups, w.shape[0] // groups, -1), cols)
    moved = result.reshape(w.shape[0], x.shape[0], *out).swapaxes(0, 1)
    return np.ascontiguousarray(moved)


def _conv_input_grad_np(dout: np.ndarray, w: np.ndarray, spatial: Sequence[int],
                        stride: Sequence[int], pads: Sequence[int], dilation: Sequence[int],
                        groups: int) -> np.ndarray:
    """The gradient of conv's input of spatial size ``spatial`` (a transposed convolution):
    the transposed weight matrix times dout gives the columns' gradient, col2im sums it back."""
    n = w.ndim - 2
    dtype = _result_dtype(dout, w)
    dout, w = dout.astype(dtype, copy=False), w.astype(dtype, copy=False)
    if dout.shape[1] != w.shape[0] or w.shape[0] % groups:
        raise ShapeError(f"conv gradient: {dout.shape[1]} channels for a weight of shape {w.shape}")
    kernel, out = w.shape[2:], dout.shape[2:]
    weights = w.reshape(groups, w.shape[0] // groups, -1).transpose(0, 2, 1)  # BLAS reads it in place
    cols = np.matmul(weights, _batch_last(dout, groups))  # (groups, C/groups*K, N*P)
    # (C, K..., N, OUT...) read as (N, C, K..., OUT...): col2im takes the strided view
    cols = cols.reshape(groups * w.shape[1], *kernel, dout.shape[0], *out)
    cols = cols.transpose(1 + n, 0, *range(1, 1 + n), *range(2 + n, 2 + 2 * n))
    return _col2im(cols, spatial, kernel, stride, pads, dilation, out)


def _conv_weight_grad_np(x: np.ndarray, dout: np.ndarray, kernel: Sequence[int],
                         stride: Sequence[int], pads: Sequence[int], dilation: Sequence[int],
                         groups: int) -> np.ndarray:
    """The gradient of conv's weight: dout times the transposed columns, one matmul per
    group whose inner dimension runs over the whole batch."""
    dtype = _result_dtype(x, dout)
    x, dout = x.astype(dtype, copy=False), dout.astype(dtype, copy=False)
    out = dout.shape[2:]
    channels, cout = x.shape[1], dout.shape[1]
    if channels % groups or cout % groups:
        raise ShapeError(f"conv gradient: {channels} input and {cout} output channels do not "
                         f"fit groups={groups}")
    cols = _columns(x, kernel, stride, pads, dilation, out, groups)
    result: np.ndarray = np.matmul(_batch_last(dout, groups), cols.transpose(0, 2, 1))
    return result.reshape(cout, channels // groups, *kernel)


# -- conv evaluation ------------------------------------------------------------------------
def _conv(x: Any, w: Any, b: Any = None, *, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
          groups: Any = 1) -> Any:
    """conv(x, w, b): the N-d convolution with an optional bias per output channel."""
    x, w = np.asarray(x), np.asarray(w)
    n, st, pads, dil, g = conv_params(x, w, stride, padding, dilation, groups, "conv")
    out = _conv_np(x, w, st, pads, dil, g)
    if b is not None:
        out = out + np.asarray(b, out.dtype).reshape((-1,) + (1,) * n)
    return out


def _conv_core(x: Any, w: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
               groups: Any = 1) -> Any:
    """conv without bias, attributes positional (the gradient rules' form)."""
    return _conv(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)


def _conv_input_grad(dout: Any, w: Any, x: Any, stride: Any = 1, padding: Any = 0,
                     dilation: Any = 1, groups: Any = 1) -> Any:
    """The gradient of conv(x, w) with respect to x, given dout."""
    dout, w, x = np.asarray(dout), np.asarray(w), np.asarray(x)
    _, st, pads, dil, g = conv_params(x, w, stride, padding, dilation, groups, "conv")
    return _conv_input_grad_np(dout, w, x.shape[2:], st, pads, dil, g)


def _conv_weight_grad(x: Any, dout: Any, w: Any, stride: Any = 1, padding: Any = 0,
                      dilation: Any = 1, groups: Any = 1) -> Any:
    """The gradient of conv(x, w) with respect to w, given dout."""
    x, dout, w = np.asarray(x), np.asarray(dout), np.asarray(w)
    _, st, pads, dil, g = conv_params(x, w, stride, padding, dilation, groups, "conv")
    return _conv_weight_grad_np(x, dout, w.shape[2:], st, pads, dil, g)


def _conv_transpose(x: Any, w: Any, b: Any = None, *, stride: Any = 1, padding: Any = 0,
                    output_padding: Any = 0, dilation: Any = 1, groups: Any = 1) -> Any:
    """conv_transpose(x, w, b) as PyTorch: w is (C_in, C_out/groups, K...)."""
    x, w = np.asarray(x), np.asarray(w)
    what = "conv_transpose"
    n = _spatial_rank(w, what)
    if x.ndim != n + 2:
        raise AnfirTypeError(f"{what}: the input has rank {x.ndim}, the weight's needs {n + 2}")
    st, dil = per_axis_ints(stride, n, "stride", what), per_axis_ints(dilation, n, "dilation", what)
    g = per_axis_ints(groups, 1, "groups", what)[0]
    op = per_axis_ints(output_padding, n, "output_padding", what, least=0)
    pads = padding_attr(padding, n, what, strings=False)
    assert pads is not None
    if any(o >= max(s, d) for o, s, d in zip(op, st, dil)):
        raise AnfirTypeError(f"{what}: output_padding {op} must be smaller than the stride "
                             "or the dilation")
    if x.shape[1] != w.shape[0] or w.shape[0] % g:
        raise ShapeError(f"{what}: input channels {x.shape[1]} and weight {w.shape} do not fit "
                         f"groups={g}")
    spatial = [(i - 1) * s - int(pb) - int(pe) + d * (k - 1) + o + 1 for i, s, pb, pe, d, k, o
               in zip(x.shape[2:], st, pads[:n], pads[n:], dil, w.shape[2:], op)]
    if any(s < 1 for s in spatial):
        raise ShapeError(f"{what}: the output would be empty ({spatial})")
    out = _conv_input_grad_np(x, w, spatial, st, [int(p) for p in pads], dil, g)
    if b is not None:
        out = out + np.asarray(b, out.dtype).reshape((-1,) + (1,) * n)
    return out


# -- pooling evaluation ------------------------------------------------------------------------
def pool_params(x: Any, kernel: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: Any,
                 what: str) -> tuple[int, tuple[int, ...], tuple[int, ...], list[int],
                                     tuple[int, ...], list[int]]:
    """(n, kernel, stride, pads (ends widened for ceil mode), dilation, out sizes)."""
    if not isinstance(kernel, (int, tuple)) or isinstance(kernel, bool):
        raise AnfirTypeError(f"the kernel of {what} is an integer or a tuple, not {kernel!r}")
    n = len(kernel) if isinstance(kernel, tuple) else np.ndim(x) - 2
    if n not in (1, 2, 3) or np.ndim(x) != n + 2:
        raise AnfirTypeError(f"{what}: a {n}-d kernel needs an input of rank {n + 2}, "
                             f"not {np.ndim(x)}")
    k = per_axis_ints(kernel, n, "kernel", what)
    st = k if stride is None else per_axis_ints(stride, n, "stride", what)
    dil = per_axis_ints(dilation, n, "dilation", what)
    ceil = rules.bool_attr(ceil_mode, "ceil_mode", what)
    pads = [int(p) for p in padding_attr(padding, n, what, strings=False) or ()]
    out = []
    for a in range(n):
        size = np.shape(x)[2 + a]
        o = _out_size(size, k[a], st[a], dil[a], pads[a] + pads[n + a], ceil)
        if ceil and (o - 1) * st[a] >= size + pads[a]:  # PyTorch: no window starts in the end padding
            o -= 1
        out.append(o)
        # ceil mode may read past the end padding: widen it (those cells never count)
        pads[n + a] = max(pads[n + a], (o - 1) * st[a] + dil[a] * (k[a] - 1) + 1 - size - pads[a])
    return n, k, st, pads, dil, out


def _fill(x: np.ndarray) -> Any:
    """The padding value that never wins a maximum."""
    return -np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min


def _max_pool(x: Any, kernel: Any = None, stride: Any = None, padding: Any = 0, dilation: Any = 1,
              ceil_mode: Any = False) -> Any:
    """The maximum over each window (padding never wins): one np.maximum per kernel offset
    (NaN propagates, as in np.max)."""
    x = np.asarray(x)
    n, k, st, pads, dil, out = pool_params(x, kernel, stride, padding, dilation, ceil_mode,
                                            "max_pool")
    xp = _pad(x, pads, n, _fill(x))
    index = _offsets(k, st, dil, out)
    result = xp[index[0]].copy()
    for i in index[1:]:
        np.maximum(result, xp[i], out=result)
    return result


def _argmax_windows(x: np.ndarray, kernel: Any, stride: Any, padding: Any, dilation: Any,
                    ceil_mode: Any) -> tuple[int, tuple[int, ...], tuple[int, ...], list[int],
                                             tuple[int, ...], list[int], np.ndarray]:
    """The pooling parameters and, per output cell, the flat kernel offset of its maximum
    (the first one, or the first NaN, as np.argmax over the window)."""
    n, k, st, pads, dil, out = pool_params(x, kernel, stride, padding, dilation, ceil_mode,
                                            "max_pool")
    xp = _pad(x, pads, n, _fill(x))
    index = _offsets(k, st, dil, out)
    if x.dtype.kind in "fc" and bool(np.isnan(x).any()):
        # A NaN wins over any number and the first NaN stays (np.argmax's rule):
        # compared offset by offset, only when there is one.
        best = xp[index[0]].copy()
        pick = np.zeros(best.shape, np.int32)
        for flat, i in enumerate(index[1:], 1):
            better = np.greater(xp[i], best) | (np.isnan(xp[i]) & ~np.isnan(best))
            np.copyto(best, xp[i], where=better)
            np.copyto(pick, flat, where=better)
        return n, k, st, pads, dil, out, pick
    # The maximum first (np.maximum per offset), then each cell's first offset that
    # holds it: the offsets visited last to first, the earliest written last.
    top = xp[index[0]].copy()
    for i in index[1:]:
        np.maximum(top, xp[i], out=top)
    pick = np.zeros(top.shape, np.int32)
    for flat in range(len(index) - 1, 0, -1):
        np.copyto(pick, flat, where=np.equal(xp[index[flat]], top))
    np.copyto(pick, 0, where=np.equal(xp[index[0]], top))
    return n, k, st, pads, dil, out, pick


def _scatter_windows(values: np.ndarray, shape: Sequence[int], n: int, kernel: Sequence[int],
                     stride: Sequence[int], pads: Sequence[int], dilation: Sequence[int],
                     out: Sequence[int], pick: Optional[np.ndarray] = None) -> np.ndarray:
    """The adjoint of taking windows: values (N, C, out...) added at every kernel offset
    (only where ``pick`` equals the offset's flat index, if given), unpadded to ``shape``."""
    padded = [s + b + e for s, b, e in zip(shape[2:], pads[:n], pads[n:])]
    acc = np.zeros((*shape[:2], *padded), values.dtype)
    zero = values.dtype.type(0)
    for flat, index in enumerate(_offsets(kernel, stride, dilation, out)):
        acc[index] += values if pick is None else np.where(pick == flat, values, zero)
    return _pad(acc, [-p for p in pads], n)


def _max_pool_grad(x: Any, dout: Any, kernel: Any = None, stride: Any = None, padding: Any = 0,
                   dilation: Any = 1, ceil_mode: Any = False) -> Any:
    """The gradient of max_pool: dout routed to each window's (first) maximum."""
    x, dout = np.asarray(x), np.asarray(dout)
    n, k, st, pads, dil, out, pick = _argmax_windows(x, kernel, stride, padding, dilation, ceil_mode)
    return _scatter_windows(dout, x.shape, n, k, st, pads, dil, out, pick)


def _max_pool_select(x: Any, g: Any, kernel: Any = None, stride: Any = None, padding: Any = 0,
                     dilation: Any = 1, ceil_mode: Any = False) -> Any:
    """g read at each window's maximum of x (the adjoint of max_pool_grad)."""
    x, g = np.asarray(x), np.asarray(g)
    n, k, st, pads, dil, out, pick = _argmax_windows(x, kernel, stride, padding, dilation, ceil_mode)
    gp = _pad(g, pads, n)
    index = _offsets(k, st, dil, out)
    result = gp[index[0]].copy()
    for flat, i in enumerate(index[1:], 1):
        np.copyto(result, gp[i], where=pick == flat)
    return result


def avg_divisor(shape: Sequence[int], n: int, k: Sequence[int], st: Sequence[int],
                 pads: Sequence[int], given: Sequence[int], out: Sequence[int],
                 include: bool) -> np.ndarray:
    """How many cells each window averages: the padded extent (count_include_pad) or the
    input's, never the cells past the end padding that ceil mode reads."""
    divisor = np.ones((), np.float64)
    for a in range(n):
        size = shape[2 + a]
        pos = np.arange(size + pads[a] + pads[n + a])
        lo, hi = (pads[a] - given[a], pads[a] + size + given[n + a]) if include \
            else (pads[a], pads[a] + size)
        inside = ((pos >= lo) & (pos < hi)).astype(np.float64)
        counts = sliding_window_view(inside, k[a])[::st[a]][:out[a]].sum(axis=-1)
        divisor = np.multiply.outer(divisor, counts)
    return divisor


def _avg_setup(x: np.ndarray, kernel: Any, stride: Any, padding: Any, ceil_mode: Any,
               count_include_pad: Any) -> tuple[int, tuple[int, ...], tuple[int, ...], list[int],
                                                tuple[int, ...], list[int], np.ndarray]:
    n, k, st, pads, dil, out = pool_params(x, kernel, stride, padding, 1, ceil_mode, "avg_pool")
    include = rules.bool_attr(count_include_pad, "count_include_pad", "avg_pool")
    given = [int(p) for p in padding_attr(padding, n, "avg_pool", strings=False) or ()]
    divisor = avg_divisor(x.shape, n, k, st, pads, given, out, include)
    return n, k, st, pads, dil, out, divisor


def _avg_pool(x: Any, kernel: Any = None, stride: Any = None, padding: Any = 0, ceil_mode: Any = False,
              count_include_pad: Any = True) -> Any:
    """The mean over each window."""
    x = np.asarray(x)
    if x.dtype.kind != "f":
        x = x.astype(np.float64)
    n, k, st, pads, dil, out, divisor = _avg_setup(x, kernel, stride, padding, ceil_mode,
                                                   count_include_pad)
    xp = _pad(x, pads, n)
    index = _offsets(k, st, dil, out)
    total = xp[index[0]].copy()
    for i in index[1:]:  # one add per kernel offset, not a reduction over a strided view
        total += xp[i]
    return (total / divisor.astype(x.dtype)).astype(x.dtype, copy=False)


def _avg_pool_grad(dout: Any, x: Any, kernel: Any = None, stride: Any = None, padding: Any = 0,
                   ceil_mode: Any = False, count_include_pad: Any = True) -> Any:
    """The gradient of avg_pool: dout / divisor spread over each window."""
    dout, x = np.asarray(dout), np.asarray(x)
    n, k, st, pads, dil, out, divisor = _avg_setup(x, kernel, stride, padding, ceil_mode,
                                                   count_include_pad)
    return _scatter_windows(dout / divisor.astype(dout.dtype), x.shape, n, k, st, pads, dil, out)


def _spatial_axes(x: Any, what: str) -> tuple[int, ...]:
    if np.ndim(x) < 3:
        raise AnfirTypeError(f"{what} needs an input of rank >= 3 (N, C, spatial...), "
                             f"not rank {np.ndim(x)}")
    return tuple(range(2, np.ndim(x)))


def _global_avg_pool(x: Any) -> Any:
    """The mean over every spatial axis, kept as size 1."""
    x = np.asarray(x)
    return np.mean(x, axis=_spatial_axes(x, "global_avg_pool"), keepdims=True)


def _global_max_pool(x: Any) -> Any:
    """The maximum over every spatial axis, kept as size 1."""
    x = np.asarray(x)
    return np.max(x, axis=_spatial_axes(x, "global_max_pool"), keepdims=True)


# -- channel vectors and batch norm -----------------------------------------------------------
def _channel_sum(x: Any) -> Any:
    """The sum over every axis but 1 (the channels)."""
    x = np.asarray(x)
    return np.sum(x, axis=(0, *range(2, x.ndim)))


def _channel_spread(v: Any, like: Any) -> Any:
    """The channel vector v broadcast over like's shape (axis 1)."""
    like = np.asarray(like)
    v = np.asarray(v)
    return np.ascontiguousarray(np.broadcast_to(v.reshape((-1,) + (1,) * (like.ndim - 2)),
                                                like.shape))


def _batch_norm(x: Any, scale: Any, bias: Any, mean: Any, var: Any, eps: Any = 1e-5) -> Any:
    """(x - mean) / sqrt(var + eps) * scale + bias per channel (running statistics)."""
    e = rules.float_attr(eps, "eps", "batch_norm")
    x = np.asarray(x)
    if x.ndim < 2:
        raise AnfirTypeError(f"batch_norm needs an input of rank >= 2 (N, C, ...), not {x.ndim}")
    dtype = _result_dtype(x, scale, bias, mean, var)
    shape = (-1,) + (1,) * (x.ndim - 2)
    vec = [np.asarray(v, dtype).reshape(shape) for v in (scale, bias, mean, var)]
    inv = vec[0] / np.sqrt(vec[3] + dtype.type(e))
    return (x.astype(dtype, copy=False) - vec[2]) * inv + vec[1]


# -- shape rules ------------------------------------------------------------------------------
def _tensor(a: AbstractValue, what: str) -> tuple[str, Optional[tuple[Dim, ...]]]:
    dtype, shape = rules.shape_of_abstract(a, what)
    return dtype, shape


def _float_dtype(*dtypes: str) -> str:
    dtype = np.result_type(*[np.dtype(numpy_name(d)) for d in dtypes])
    return require_dtype_name(dtype if dtype.kind in "fc" else np.dtype(np.float64))


def _sym_out(i: Dim, k: Dim, s: int, d: int, total: Dim, ceil: bool = False) -> Dim:
    span = sympy.sympify(i) + total - d * (sympy.sympify(k) - 1) - 1
    return norm_dim((sympy.ceiling(span / s) if ceil else sympy.floor(span / s)) + 1)


def _rank_of(shape: Optional[tuple[Dim, ...]], n: int, what: str, name: str) -> None:
    if shape is not None and len(shape) != n:
        raise ShapeError(f"{what}: {name} has rank {len(shape)}, not {n}")


def _int_dim(d: Dim) -> Optional[int]:
    try:
        return int(d)
    except TypeError:
        return None


def _conv_out(what: str, x: AbstractValue, w: AbstractValue, stride: Any, padding: Any,
              dilation: Any, groups: Any) -> tuple[str, Optional[tuple[Dim, ...]]]:
    """(dtype, shape) of conv(x, w) with these attributes, on symbolic dims."""
    xd, xs = _tensor(x, what)
    wd, ws = _tensor(w, what)
    if ws is None:
        return _float_dtype(xd, wd), None
    n = len(ws) - 2
    if n not in (1, 2, 3):
        raise AnfirTypeError(f"{what} needs a weight of rank 3, 4 or 5, not rank {len(ws)}")
    _rank_of(xs, n + 2, what, "the input")
    st, dil = per_axis_ints(stride, n, "stride", what), per_axis_ints(dilation, n, "dilation", what)
    g = per_axis_ints(groups, 1, "groups", what)[0]
    if xs is None:
        return _float_dtype(xd, wd), None
    cin, wc = _int_dim(xs[1]), _int_dim(ws[1])
    if cin is not None and wc is not None and cin != wc * g:
        raise ShapeError(f"{what}: input channels {cin} and weight {rules.shape_text(ws)} do not "
                         f"fit groups={g}")
    kernel = ws[2:]
    pads = padding_attr(padding, n, what, spatial=[_int_dim(s) if _int_dim(s) is not None else s
                                            for s in xs[2:]],
                 kernel=[_int_dim(k) or 1 for k in kernel], stride=st, dilation=dil)
    if pads is None:  # "same" on symbolic sizes
        out = [norm_dim(sympy.ceiling(sympy.sympify(i) / s)) for i, s in zip(xs[2:], st)]
    else:
        out = [_sym_out(i, k, s, d, pads[a] + pads[n + a])
               for a, (i, k, s, d) in enumerate(zip(xs[2:], kernel, st, dil))]
    return _float_dtype(xd, wd), (xs[0], ws[0], *out)


def _infer_conv(x: AbstractValue, w: AbstractValue, b: Optional[AbstractValue] = None, *,
                stride: Any = 1, padding: Any = 0, dilation: Any = 1,
                groups: Any = 1) -> AbstractValue:
    """conv: (N, C, S...) * (O, C/groups, K...) -> (N, O, floor((S + pads - d(K-1) - 1)/s) + 1...)."""
    dtype, shape = _conv_out("conv", x, w, stride, padding, dilation, groups)
    if b is not None and not isinstance(b, ANone):
        dtype = _float_dtype(dtype, _tensor(b, "conv")[0])
    return ATensor(dtype, shape)


def _infer_conv_core(x: AbstractValue, w: AbstractValue, stride: Any = 1, padding: Any = 0,
                     dilation: Any = 1, groups: Any = 1) -> AbstractValue:
    """conv_core: conv's shape."""
    return ATensor(*_conv_out("conv", x, w, stride, padding, dilation, groups))


def _infer_like(index: int, *deps: int) -> Any:
    """A rule: the shape of argument ``index``, the float dtype of the arguments ``deps``."""
    def rule(*args: AbstractValue, **_attrs: Any) -> AbstractValue:
        dtypes = [_tensor(args[i], "a convolution gradient")[0] for i in deps]
        return ATensor(_float_dtype(*dtypes), _tensor(args[index], "a convolution gradient")[1])

    rule.__doc__ = f"The shape of argument {index}, the float dtype of {deps}."
    return rule


def _infer_conv_transpose(x: AbstractValue, w: AbstractValue, b: Optional[AbstractValue] = None,
                          *, stride: Any = 1, padding: Any = 0, output_padding: Any = 0,
                          dilation: Any = 1, groups: Any = 1) -> AbstractValue:
    """conv_transpose: (N, C, S...) -> (N, O*groups, (S-1)s - pads + d(K-1) + op + 1...)."""
    what = "conv_transpose"
    xd, xs = _tensor(x, what)
    wd, ws = _tensor(w, what)
    dtype = _float_dtype(xd, wd)
    if b is not None and not isinstance(b, ANone):
        dtype = _float_dtype(dtype, _tensor(b, what)[0])
    if ws is None or xs is None:
        return ATensor(dtype, None)
    n = len(ws) - 2
    _rank_of(xs, n + 2, what, "the input")
    st, dil = per_axis_ints(stride, n, "stride", what), per_axis_ints(dilation, n, "dilation", what)
    g = per_axis_ints(groups, 1, "groups", what)[0]
    op = per_axis_ints(output_padding, n, "output_padding", what, least=0)
    pads = padding_attr(padding, n, what, strings=False)
    assert pads is not None
    out = [norm_dim((sympy.sympify(i) - 1) * s - pads[a] - pads[n + a]
                    + d * (sympy.sympify(k) - 1) + o + 1)
           for a, (i, s, d, k, o) in enumerate(zip(xs[2:], st, dil, ws[2:], op))]
    return ATensor(dtype, (xs[0], norm_dim(sympy.sympify(ws[1]) * g), *out))


def _pool_rule(what: str, has_dilation: bool) -> Any:
    _ = has_dilation  # avg_pool has no dilation attribute: it reads the default 1
    def rule(x: AbstractValue, *_others: AbstractValue, **attrs: Any) -> AbstractValue:
        # max_pool_select(x, g) has max_pool(x)'s shape: only x matters
        kernel, stride = attrs.get("kernel"), attrs.get("stride")
        padding, dilation = attrs.get("padding", 0), attrs.get("dilation", 1)
        ceil = attrs.get("ceil_mode", False)
        dtype, shape = _tensor(x, what)
        if not isinstance(kernel, (int, tuple)) or isinstance(kernel, bool):
            raise AnfirTypeError(f"the kernel of {what} is an integer or a tuple, not {kernel!r}")
        if shape is None:
            return ATensor(dtype if what == "max_pool" else _float_dtype(dtype), None)
        n = len(kernel) if isinstance(kernel, tuple) else len(shape) - 2
        _rank_of(shape, n + 2, what, "the input")
        k = per_axis_ints(kernel, n, "kernel", what)
        st = k if stride is None else per_axis_ints(stride, n, "stride", what)
        dil = per_axis_ints(dilation, n, "dilation", what)
        c = rules.bool_attr(ceil, "ceil_mode", what)
        pads = padding_attr(padding, n, what, strings=False)
        assert pads is not None
        out = []
        for a in range(n):
            o = _sym_out(shape[2 + a], k[a], st[a], dil[a], pads[a] + pads[n + a], c)
            if c:
                last = sympy.sympify(o - 1) * st[a] >= sympy.sympify(shape[2 + a]) + pads[a]
                if last is sympy.true:
                    o = norm_dim(o - 1)
                elif last is not sympy.false:
                    o = norm_dim(sympy.Piecewise((o - 1, last), (o, True)))
            out.append(o)
        out_dtype = dtype if what == "max_pool" else _float_dtype(dtype)
        return ATensor(out_dtype, (shape[0], shape[1], *out))

    rule.__name__ = rule.__qualname__ = f"infer_{what}"
    rule.__doc__ = f"Abstract rule of {what}: floor/ceil((S + pads - d(K-1) - 1)/s) + 1 per axis."
    return rule


def _infer_global(x: AbstractValue) -> AbstractValue:
    """global pools: (N, C, S...) -> (N, C, 1...)."""
    dtype, shape = _tensor(x, "a global pool")
    if shape is not None and len(shape) < 3:
        raise AnfirTypeError(f"a global pool needs an input of rank >= 3, not {len(shape)}")
    return ATensor(dtype, None if shape is None else (shape[0], shape[1], *(1,) * (len(shape) - 2)))


def _infer_global_avg(x: AbstractValue) -> AbstractValue:
    """global_avg_pool: (N, C, S...) -> (N, C, 1...), float."""
    out = _infer_global(x)
    assert isinstance(out, ATensor)
    return ATensor(_float_dtype(out.dtype), out.shape)


def _infer_channel_sum(x: AbstractValue) -> AbstractValue:
    """channel_sum: (N, C, ...) -> (C,)."""
    dtype, shape = _tensor(x, "channel_sum")
    return ATensor(dtype, None if shape is None else (shape[1],))


def _infer_channel_spread(v: AbstractValue, like: AbstractValue) -> AbstractValue:
    """channel_spread: like's shape, v's dtype."""
    return ATensor(_tensor(v, "channel_spread")[0], _tensor(like, "channel_spread")[1])


def _infer_batch_norm(x: AbstractValue, *vectors: AbstractValue, eps: Any = 1e-5) -> AbstractValue:
    """batch_norm: x's shape, the float dtype of every argument."""
    rules.float_attr(eps, "eps", "batch_norm")
    dtype, shape = _tensor(x, "batch_norm")
    return ATensor(_float_dtype(dtype, *[_tensor(v, "batch_norm")[0] for v in vectors]), shape)


# -- declarations -------------------------------------------------------------------------------
_CONV_ARGS = "stride, padding, dilation, groups"
_CONV_GRADS = f"""(conv_input_grad(dout, w, x, {_CONV_ARGS}),
                  conv_weight_grad(x, dout, w, {_CONV_ARGS})"""

conv = declare("conv", (2, 3), _conv, infer=_infer_conv, family=FAMILY, attrs=_CONV,
               doc="conv(x, w, b=None, stride=1, padding=0, dilation=1, groups=1) — N-d "
                   "convolution (1-, 2-, 3-d from w's rank); padding: int, per-axis tuple, "
                   "begins-then-ends tuple, \"same\" or \"valid\"",
    bprop={2: f"lambda (x, w, {_CONV_ARGS}, out, dout) {_CONV_GRADS}) end",
           3: f"lambda (x, w, b, {_CONV_ARGS}, out, dout) {_CONV_GRADS}, channel_sum(dout)) end"})
conv_core = declare("conv_core", 2, _conv_core, infer=_infer_conv_core, family=FAMILY,
                    internal=True, attrs=_CONV, positional_attrs=4,
                    doc="conv_core(x, w, stride, padding, dilation, groups) — conv without bias",
    bprop=f"lambda (x, w, {_CONV_ARGS}, out, dout) {_CONV_GRADS}) end")
conv_input_grad = declare(
    "conv_input_grad", 3, _conv_input_grad, infer=_infer_like(2, 0, 1), family=FAMILY,
    internal=True, attrs=_CONV, positional_attrs=4,
    doc="conv_input_grad(dout, w, x, ...) — the gradient of conv(x, w) for x",
    bprop=f"""lambda (dout, w, x, {_CONV_ARGS}, out, g)
        (conv_core(g, w, {_CONV_ARGS}), conv_weight_grad(g, dout, w, {_CONV_ARGS}),
         zeros_like(x)) end""")
conv_weight_grad = declare(
    "conv_weight_grad", 3, _conv_weight_grad, infer=_infer_like(2, 0, 1), family=FAMILY,
    internal=True, attrs=_CONV, positional_attrs=4,
    doc="conv_weight_grad(x, dout, w, ...) — the gradient of conv(x, w) for w",
    bprop=f"""lambda (x, dout, w, {_CONV_ARGS}, out, g)
        (conv_input_grad(dout, g, x, {_CONV_ARGS}), conv_core(x, g, {_CONV_ARGS}),
         zeros_like(w)) end""")

_CT = {"stride": 1, "padding": 0, "output_padding": 0, "dilation": 1, "groups": 1}
_CT_GRADS = f"""(conv_core(dout, w, {_CONV_ARGS}), conv_weight_grad(dout, x, w, {_CONV_ARGS})"""
conv_transpose = declare(
    "conv_transpose", (2, 3), _conv_transpose, infer=_infer_conv_transpose, family=FAMILY,
    attrs=_CT,
    doc="conv_transpose(x, w, b=None, stride=1, padding=0, output_padding=0, dilation=1, "
        "groups=1) — the transposed convolution of PyTorch's conv_transpose{1,2,3}d",
    bprop={2: f"""lambda (x, w, stride, padding, output_padding, dilation, groups, out, dout)
                 {_CT_GRADS}) end""",
           3: f"""lambda (x, w, b, stride, padding, output_padding, dilation, groups, out, dout)
                 {_CT_GRADS}, channel_sum(dout)) end"""})

_MAXP = {"kernel": None, "stride": None, "padding": 0, "dilation": 1, "ceil_mode": False}
_MAXP_ARGS = "kernel, stride, padding, dilation, ceil_mode"
max_pool = declare("max_pool", 1, _max_pool, infer=_pool_rule("max_pool", True), family=FAMILY,
                   attrs=_MAXP, positional_attrs=5,
                   doc="max_pool(x, kernel, stride=None, padding=0, dilation=1, ceil_mode=false) "
                       "— the maximum of each window (stride defaults to kernel)",
    bprop=f"lambda (x, {_MAXP_ARGS}, out, dout) (max_pool_grad(x, dout, {_MAXP_ARGS}),) end")
max_pool_grad = declare(
    "max_pool_grad", 2, _max_pool_grad, infer=_infer_like(0, 0, 1), family=FAMILY, internal=True,
    attrs=_MAXP, positional_attrs=5,
    doc="max_pool_grad(x, dout, ...) — dout routed to each window's maximum",
    bprop=f"""lambda (x, dout, {_MAXP_ARGS}, out, g)
        (zeros_like(x), max_pool_select(x, g, {_MAXP_ARGS})) end""")
max_pool_select = declare(
    "max_pool_select", 2, _max_pool_select, infer=_pool_rule("max_pool", True), family=FAMILY,
    internal=True, attrs=_MAXP, positional_attrs=5,
    doc="max_pool_select(x, g, ...) — g read at each window's maximum of x",
    bprop=f"""lambda (x, g, {_MAXP_ARGS}, out, dout)
        (zeros_like(x), max_pool_grad(x, dout, {_MAXP_ARGS})) end""")

_AVGP = {"kernel": None, "stride": None, "padding": 0, "ceil_mode": False, "count_include_pad": True}
_AVGP_ARGS = "kernel, stride, padding, ceil_mode, count_include_pad"
avg_pool = declare("avg_pool", 1, _avg_pool, infer=_pool_rule("avg_pool", False), family=FAMILY,
                   attrs=_AVGP, positional_attrs=5,
                   doc="avg_pool(x, kernel, stride=None, padding=0, ceil_mode=false, "
                       "count_include_pad=true) — the mean of each window",
    bprop=f"lambda (x, {_AVGP_ARGS}, out, dout) (avg_pool_grad(dout, x, {_AVGP_ARGS}),) end")
avg_pool_grad = declare(
    "avg_pool_grad", 2, _avg_pool_grad, infer=_infer_like(1, 0), family=FAMILY, internal=True,
    attrs=_AVGP, positional_attrs=5,
    doc="avg_pool_grad(dout, x, ...) — dout spread evenly over each window",
    bprop=f"""lambda (dout, x, {_AVGP_ARGS}, out, g)
        (avg_pool(g, {_AVGP_ARGS}), zeros_like(x)) end""")

global_avg_pool = declare(
    "global_avg_pool", 1, _global_avg_pool, infer=_infer_global_avg, family=FAMILY,
    doc="global_avg_pool(x) — the mean over the spatial axes: (N, C, S...) -> (N, C, 1...)",
    bprop="lambda (x, out, dout) (broadcast_like(dout, x) / (size(x) / size(out)),) end")
global_max_pool = declare(
    "global_max_pool", 1, _global_max_pool, infer=_infer_global, family=FAMILY,
    doc="global_max_pool(x) — the maximum over the spatial axes: (N, C, S...) -> (N, C, 1...)",
    bprop="""lambda (x, out, dout)
        let m = cast_like(x == broadcast_like(out, x), dout) in
        let count = global_avg_pool(m) * (size(x) / size(out)) in
        (broadcast_like(dout / count, x) * m,) end""")

channel_sum = declare("channel_sum", 1, _channel_sum, infer=_infer_channel_sum, family=FAMILY,
                      internal=True, doc="channel_sum(x) — the sum over every axis but 1",
                      bprop="lambda (x, out, dout) (channel_spread(dout, x),) end")
channel_spread = declare(
    "channel_spread", 2, _channel_spread, infer=_infer_channel_spread, family=FAMILY,
    internal=True, doc="channel_spread(v, like) — the channel vector v broadcast over like",
    bprop="lambda (v, like, out, dout) (channel_sum(dout), zeros_like(like)) end")

batch_norm = declare(
    "batch_norm", 5, _batch_norm, infer=_infer_batch_norm, family=FAMILY, attrs={"eps": 1e-5},
    doc="batch_norm(x, scale, bias, mean, var, eps=1e-5) — inference batch normalization: "
        "(x - mean) / sqrt(var + eps) * scale + bias per channel (axis 1)",
    bprop="""lambda (x, scale, bias, mean, var, eps, out, dout)
        let inv = 1.0 / sqrt(var + eps) in
        let xhat = (x - channel_spread(mean, x)) * channel_spread(inv, x) in
        let dxhat = channel_sum(dout * xhat) in
        let dsum = channel_sum(dout) in
        (dout * channel_spread(scale * inv, x), dxhat, dsum, -(dsum * scale * inv),
         dxhat * scale * inv * inv * -0.5) end""")

__all__ = ["avg_divisor", "conv_params", "pool_params", "avg_pool", "avg_pool_grad", "batch_norm", "channel_spread", "channel_sum", "conv",
           "conv_core", "conv_input_grad", "conv_transpose", "conv_weight_grad",
           "global_avg_pool", "global_max_pool", "max_pool", "max_pool_grad", "max_pool_select"]

"""More of PyTorch's Core ATen opset (``torch.Tag.core``) for the torch.export
importer: normalisations, norms and distances, scatters and index updates,
padding modes, resampling, flips and repeats, the backward ops a program that
differentiates itself contains, and the symbolic-size queries.

Each rule composes anfir primitives (see :mod:`anfir.interop.torch.rules.common` for
the rule protocol), so an imported op's gradient is the composition's — each
written so that it is PyTorch's, including at kinks (``tests/test_kinks.py``)
— and every back end that runs the primitives runs the op.  Static sizes are
read from the FX node's FakeTensor metadata; an op that needs a static size
and gets a dynamic one is refused with the reason (in the import's one list
of refusals).  :data:`EXCLUDED` names the core ops left out, with why
(docs/torch.md repeats it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from anfir.errors import AnfirError
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.primitives import arith, conv, elementwise, indexing, nn, reduce, shaping, structure, tensor
from anfir.interop.torch.rules.common import (Rule, _adaptive_avg_pool, _array_node, _axes, _batch_norm_eval,
                                     _constant_pad_nd, _convolution, _div_mode, _expand, _int_tuple, _ints,
                                     _max_pool_with_indices, _binary, _channel_fill, _reshape_to_result,
                                     _softmax_core, _static_ints, aten_table)

def core_overloads(torch: Any) -> list[Any]:
    """Every overload PyTorch tags ``torch.Tag.core``.  ``torch.ops.aten`` loads its
    op packets lazily, so each is named from the registered schemas first."""
    aten = torch.ops.aten
    names = sorted({s.name.split("::", 1)[1] for s in torch._C._jit_get_all_schemas()
                    if s.name.startswith("aten::")})
    found = []
    for name in names:
        packet = getattr(aten, name, None)
        for overload in packet.overloads() if packet is not None else ():
            op = getattr(packet, overload)
            if torch.Tag.core in op.tags:
                found.append(op)
    return found


EXCLUDED = {
    "aten.rand.default": "random numbers: anfir's programs are deterministic (dropout takes its key)",
    "aten.randn.default": "random numbers: anfir's programs are deterministic",
    "aten.randperm.default": "random numbers: anfir's programs are deterministic",
    "aten._fft_r2c.default": "FFTs: anfir has no Fourier-transform primitive",
    "aten._fft_c2r.default": "FFTs: anfir has no Fourier-transform primitive",
    "aten.nonzero.default": "a result whose shape depends on the data (anfir's shapes are "
                            "static or dimension variables of the inputs)",
}
"""Core ATen overloads the importer does not map, with the reason."""


def _shape(b: Any, index: int = 0) -> Any:
    """The (FakeTensor) shape of the node's argument ``index``."""
    return tuple(b.fx_node.args[index].meta["val"].shape)


def _static_shape(b: Any, what: str, index: int = 0) -> tuple[int, ...]:
    shape = _shape(b, index)
    if not all(isinstance(d, int) for d in shape):
        raise AnfirError(f"{what} with a dynamic shape {shape}", b.loc)
    return tuple(int(d) for d in shape)


def _out_val(b: Any) -> Any:
    return b.fx_node.meta.get("val")


def _const(b: Any, value: Any, dtype: str) -> Any:
    return b.call(tensor.cast, value, dtype)


# -- elementwise -----------------------------------------------------------------------------
def _log_base(base: float) -> Rule:
    def rule(b: Any, x: Any) -> Any:
        return b.call(arith.div, b.call(arith.log, x), _const(b, math.log(base), b.out_dtype()))
    return rule


def _asinh(b: Any, x: Any) -> Any:
    """log(x + sqrt(x² + 1)), mirrored for x < 0 (no cancellation); derivative 1/sqrt(x²+1),
    1 at 0 (both branches' formula, not a kink)."""
    def side(v: Any) -> Any:
        return b.call(arith.log, b.call(arith.add, v, b.call(
            arith.sqrt, b.call(arith.add, b.call(arith.mul, v, v), 1.0))))
    neg = b.call(arith.neg, side(b.call(arith.neg, x)))
    return b.call(tensor.where, b.call(arith.lt, x, 0.0), neg, side(x))


def _acosh(b: Any, x: Any) -> Any:
    root = b.call(arith.sqrt, b.call(arith.mul, b.call(arith.sub, x, 1.0),
                                        b.call(arith.add, x, 1.0)))
    return b.call(arith.log, b.call(arith.add, x, root))


def _atanh(b: Any, x: Any) -> Any:
    """0.5 * log1p(2x / (1 - x))."""
    ratio = b.call(arith.div, b.call(arith.mul, x, 2.0), b.call(arith.sub, 1.0, x))
    return b.call(arith.mul, b.call(elementwise.log1p, ratio), 0.5)


def _trunc(b: Any, x: Any) -> Any:
    return b.call(tensor.where, b.call(arith.lt, x, 0.0), b.call(elementwise.ceil, x),
                  b.call(elementwise.floor, x))


def _clamp_tensor(b: Any, x: Any, min: Any = None, max: Any = None) -> Any:
    """``clamp`` with tensor bounds: ``clip(x, lo, hi)`` (PyTorch's gradient: to x at
    the bounds, to a bound where it is strictly the result)."""
    if min is None and max is None:
        return b.call(structure.identity, x)
    if max is None:
        return b.call(elementwise.clip, x, min)
    if min is None:
        return _clamp_max_only(b, x, max)
    return b.call(elementwise.clip, x, min, max)


def _clamp_max_only(b: Any, x: Any, hi: Any) -> Any:
    # clip(-x, -hi) negated: the two-argument clip is a lower bound.
    return b.call(arith.neg, b.call(elementwise.clip, b.call(arith.neg, x), b.call(arith.neg, hi)))


def _copy(b: Any, x: Any, src: Any, non_blocking: bool = False) -> Any:
    """``copy(self, src)``: src broadcast to self's shape, in self's dtype (self's
    values are overwritten: no gradient reaches it)."""
    out = b.call(tensor.broadcast_to, b.call(tensor.cast, src, b.out_dtype()), b.out_shape())
    return out


def _fill(b: Any, x: Any, value: Any) -> Any:
    dt = b.out_dtype()
    zeros = b.call(tensor.cast, b.call(structure.zeros_like, x), dt)
    return b.call(arith.add, zeros, b.call(tensor.cast, value, dt))


def _empty(b: Any, *_: Any, **__: Any) -> Any:
    """``empty``/``empty_strided``: uninitialised memory in PyTorch; zeros here (a value
    a program may not read before writing anyway)."""
    return b.call(tensor.zeros, b.out_shape(), b.out_dtype())


def _local_scalar(b: Any, x: Any) -> Any:
    """``.item()``: the single element, as a 0-d value."""
    return b.call(tensor.reshape, x, b.tuple_of(()))


def _sym_query(b: Any, *_: Any, **__: Any) -> Any:
    """``sym_numel`` / ``sym_stride`` / ``sym_storage_offset``: the value torch traced
    (an int, or an expression of the inputs' sizes)."""
    return b.importer.size_value(_out_val(b), b)


def _resize(b: Any, x: Any, size: Any, memory_format: Any = None) -> Any:
    """``resize_`` (functionalized): the elements in order, cut or extended with
    zeros (PyTorch leaves new memory uninitialised) to the new shape."""
    _static_ints(b, "resize_", *size)
    old = int(np.prod(_static_shape(b, "resize_")))
    new = int(np.prod([int(d) for d in size]))
    flat = b.call(tensor.reshape, x, b.tuple_of((-1,)))
    if new < old:
        flat = b.call(shaping.slice_, flat, starts=0, ends=new, axes=0)
    elif new > old:
        flat = b.call(shaping.pad, flat, pads=(0, new - old))
    return b.call(tensor.reshape, flat, b.tuple_of(tuple(int(d) for d in size)))


# -- reductions, norms, distances -------------------------------------------------------------
def _var_dim(b: Any, x: Any, dim: Any = None, unbiased: bool = True, keepdim: bool = False) -> Any:
    return b.call(reduce.var, x, axis=_axes(dim), keepdims=bool(keepdim),
                  correction=1 if unbiased else 0)


def _vector_norm(b: Any, x: Any, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,
                 dtype: Any = None) -> Any:
    """``linalg_vector_norm`` -> ``norm`` (its gradient at a zero vector is 0, as PyTorch's)."""
    order = float(ord)
    if order == 0.0 or math.isinf(order):
        absx = b.call(arith.abs_, x)
        if order == 0.0:
            ne = b.call(tensor.cast, b.call(arith.ne, x, 0.0), b.out_dtype())
            return b.call(tensor.sum_, ne, axis=_axes(dim), keepdims=bool(keepdim))
        extreme = reduce.max_ if order > 0 else reduce.min_
        return b.call(extreme, absx, axis=_axes(dim), keepdims=bool(keepdim))
    out = b.call(reduce.norm, x, ord=order if order != int(order) else int(order),
                 axis=_axes(dim), keepdims=bool(keepdim))
    return b.call(tensor.cast, out, dtype) if dtype is not None else out


def _distances(b: Any, x1: Any, x2: Any, p: float) -> Any:
    """‖x1[..., i, :] - x2[..., j, :]‖_p for every i, j."""
    diff = b.call(arith.sub, b.call(shaping.unsqueeze, x1, axis=-2),
                  b.call(shaping.unsqueeze, x2, axis=-3))
    order = float(p)
    if math.isinf(order):
        return b.call(reduce.max_, b.call(arith.abs_, diff), axis=-1)
    return b.call(reduce.norm, diff, ord=int(order) if order == int(order) else order, axis=-1)


def _cdist(b: Any, x1: Any, x2: Any, p: float, compute_mode: Any = None) -> Any:
    return _distances(b, x1, x2, p)


def _pdist(b: Any, x: Any, p: float = 2.0) -> Any:
    """The distances of the pairs i < j of the rows, in row-major order."""
    n = _static_shape(b, "pdist")[0]
    rows, cols = np.triu_indices(n, 1)
    full = _distances(b, x, x, p)
    pairs = _array_node(b, np.stack([rows, cols], -1).astype(np.int64)) if len(rows) else None
    if pairs is None:
        return b.call(tensor.zeros, b.tuple_of((0,)), b.out_dtype())
    return b.call(indexing.gather_nd, full, pairs)


# -- normalisation ---------------------------------------------------------------------------
def _group_stats(b: Any, x: Any, n: Any, groups: int) -> tuple[Any, Any, Any]:
    """x as (N, G, rest), its mean and biased variance over ``rest`` (kept)."""
    grouped = b.call(tensor.reshape, x, b.tuple_of((n, groups, -1)))
    mean = b.call(tensor.mean, grouped, axis=2, keepdims=True)
    centered = b.call(arith.sub, grouped, mean)
    var = b.call(tensor.mean, b.call(arith.mul, centered, centered), axis=2, keepdims=True)
    return grouped, mean, var


def _native_group_norm(b: Any, x: Any, weight: Any, bias: Any, n: Any, c: Any, hxw: Any,
                       group: int, eps: float) -> Any:
    """``native_group_norm`` -> ``(out, mean, rstd)``: ``out`` is anfir's ``group_norm``
    primitive (what ONNX's ``GroupNormalization`` imports as; its gradient rule is
    PyTorch's formula), with scale 1 / bias 0 when the norm has none; the saved
    statistics are composed beside it (dead code when nothing reads them)."""
    groups = int(group)
    grouped, mean, var = _group_stats(b, x, n, groups)
    rstd = b.call(elementwise.rsqrt, b.call(arith.add, var, float(eps)))
    fx_x = b.fx_node.args[0]
    weight = _channel_fill(b, fx_x, tensor.ones) if weight is None else weight
    bias = _channel_fill(b, fx_x, tensor.zeros) if bias is None else bias
    out = b.call(nn.group_norm, x, groups, weight, bias, eps=float(eps))
    flat = b.tuple_of((n, groups))
    return b.call(structure.make_tuple, out, b.call(tensor.reshape, mean, flat),
                  b.call(tensor.reshape, rstd, flat))


def _batch_norm_train(b: Any, x: Any, weight: Any, bias: Any, *rest: Any) -> Any:
    """``_native_batch_norm_legit`` (training: the batch's own statistics) ->
    ``(out, save_mean, save_rstd)``; the running statistics' update is PyTorch's
    business (a mutation the gradient does not see)."""
    if len(rest) == 5:  # running_mean, running_var, training, momentum, eps
        eps = rest[4]
    else:  # no_stats: training, momentum, eps
        eps = rest[2]
    rank = len(_shape(b))
    axes = (0,) + tuple(range(2, rank))
    mean = b.call(tensor.mean, x, axis=axes, keepdims=True)
    centered = b.call(arith.sub, x, mean)
    var = b.call(tensor.mean, b.call(arith.mul, centered, centered), axis=axes, keepdims=True)
    rstd = b.call(elementwise.rsqrt, b.call(arith.add, var, float(eps)))
    out = b.call(arith.mul, centered, rstd)
    per_channel = (-1,) + (1,) * (rank - 2)
    if weight is not None:
        out = b.call(arith.mul, out, b.call(tensor.reshape, weight, b.tuple_of(per_channel)))
    if bias is not None:
        out = b.call(arith.add, out, b.call(tensor.reshape, bias, b.tuple_of(per_channel)))
    flat = b.tuple_of((-1,))
    return b.call(structure.make_tuple, out, b.call(tensor.reshape, mean, flat),
                  b.call(tensor.reshape, rstd, flat))


def _batch_norm_functional(b: Any, x: Any, weight: Any, bias: Any, running_mean: Any,
                           running_var: Any, training: bool, momentum: float, eps: float) -> Any:
    """``_native_batch_norm_legit_functional``: the training form plus the updated
    running statistics (PyTorch's: momentum, the unbiased batch variance)."""
    trio = _batch_norm_train(b, x, weight, bias, running_mean, running_var, training, momentum, eps)
    mean, rstd = (b.call(structure.tuple_getitem, trio, i) for i in (1, 2))
    shape = _shape(b)
    count = 1
    for i, d in enumerate(shape):
        if i != 1:
            count *= d
    var = b.call(arith.sub, b.call(arith.div, 1.0, b.call(arith.mul, rstd, rstd)), float(eps))
    unbiased = b.call(arith.mul, var, count / (count - 1) if isinstance(count, int) and count > 1
                      else 1.0)
    m = float(momentum)
    new_mean = b.call(arith.add, b.call(arith.mul, running_mean, 1.0 - m),
                      b.call(arith.mul, b.call(structure.stop_gradient, mean), m))
    new_var = b.call(arith.add, b.call(arith.mul, running_var, 1.0 - m),
                     b.call(arith.mul, b.call(structure.stop_gradient, unbiased), m))
    return b.call(structure.make_tuple, *(b.call(structure.tuple_getitem, trio, i) for i in range(3)),
                  new_mean, new_var)


# -- shapes, joins, copies ----------------------------------------------------------------------
def _flip(b: Any, x: Any, dims: Any) -> Any:
    axes = tuple(int(d) for d in dims)
    if not axes:
        return b.call(structure.identity, x)
    return b.call(shaping.flip, x, axis=axes)


def _repeat(b: Any, x: Any, repeats: Any) -> Any:
    """``repeat`` -> ``tile`` (extra leading repeats add leading axes first)."""
    _static_ints(b, "repeat", *repeats)
    reps = tuple(int(r) for r in repeats)
    rank = len(_shape(b))
    if len(reps) > rank:
        x = b.call(tensor.reshape, x, b.tuple_of((1,) * (len(reps) - rank)
                                                   + tuple(b.importer.size_value(d, b) for d in _shape(b))))
    return b.call(shaping.tile, x, reps=reps)


def _diagonal(b: Any, x: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
    """``diagonal``: the two axes to the front, ``gather_nd`` of the diagonal's
    (row, column) pairs, the result's diagonal axis moved last."""
    shape = _static_shape(b, "diagonal")
    rank = len(shape)
    d1, d2, k = int(dim1) % rank, int(dim2) % rank, int(offset)
    rest = [a for a in range(rank) if a not in (d1, d2)]
    rows = np.arange(max(0, min(shape[d1] + min(k, 0), shape[d2] - max(k, 0))), dtype=np.int64)
    if rows.size == 0:
        return b.call(tensor.zeros, b.out_shape(), b.out_dtype())
    pairs = np.stack([rows - min(k, 0), rows + max(k, 0)], -1)
    moved = b.call(tensor.transpose, x, b.tuple_of([d1, d2] + rest))
    out = b.call(indexing.gather_nd, moved, _array_node(b, pairs))
    return b.call(tensor.transpose, out, b.tuple_of(list(range(1, len(rest) + 1)) + [0]))


def _as_strided(b: Any, x: Any, size: Any, stride: Any, storage_offset: Any = None) -> Any:
    """``as_strided`` of a contiguous tensor: a ``gather`` of the flat elements the
    strides name (their positions are static)."""
    val = b.fx_node.args[0].meta["val"]
    _static_ints(b, "as_strided", *size, *stride, storage_offset)
    _static_shape(b, "as_strided")
    if not val.is_contiguous():
        raise AnfirError("as_strided of a tensor that is not contiguous", b.loc)
    base = int(storage_offset or 0) - int(val.storage_offset())
    flat = np.full(tuple(int(s) for s in size), base, dtype=np.int64)
    for axis, (n, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[axis] = int(n)
        flat = flat + (np.arange(int(n), dtype=np.int64) * int(st)).reshape(shape)
    if flat.size and (flat.min() < 0 or flat.max() >= int(val.numel())):
        raise AnfirError("as_strided reads outside the tensor's elements", b.loc)
    return b.call(indexing.gather, b.call(tensor.reshape, x, b.tuple_of((-1,))),
                  _array_node(b, flat), axis=0)


def _slice_scatter(b: Any, x: Any, src: Any, dim: int = 0, start: Any = None, end: Any = None,
                   step: int = 1) -> Any:
    """``slice_scatter``: x with ``x[start:end:step]`` along ``dim`` replaced by src —
    ``where`` of a mask and src read back in place by a ``gather``.  A static axis
    and bounds give constant masks; a dynamic axis (BART's ``shift_tokens_right``
    on a dynamic sequence) or bound computes them with ``arange``."""
    _static_ints(b, "slice_scatter's step", step)
    shape = _shape(b)
    axis = int(dim) % len(shape)
    size = shape[axis]
    if isinstance(size, int) and not isinstance(start, Node) and not isinstance(end, Node):
        positions = list(range(size))[slice(start, end, int(step))]
        return _place_along(b, x, src, axis, positions, size, len(shape))
    n = b.importer.size_value(size, b)
    begin: Any = 0 if start is None else start
    if isinstance(begin, int) and begin < 0:
        begin = b.call(arith.maximum, b.call(arith.add, n, begin), 0)
    stop: Any = n
    if isinstance(end, int) and end < 0:
        stop = b.call(arith.add, n, end)
    elif end is not None and not (isinstance(end, int) and end >= size_limit(size)):
        stop = b.call(arith.minimum, end, n)
    index = b.call(indexing.arange, 0, n, dtype="i64")
    rel = b.call(arith.sub, index, begin)
    inside = b.call(arith.logical_and, b.call(arith.ge, rel, 0), b.call(arith.lt, index, stop))
    if int(step) != 1:
        inside = b.call(arith.logical_and, inside,
                        b.call(arith.eq, b.call(elementwise.mod, rel, int(step)), 0))
    src_len = b.call(structure.tuple_getitem, b.call(tensor.shape, src), axis)
    pos = b.call(elementwise.floor_div, rel, int(step))
    pos = b.call(arith.minimum, b.call(arith.maximum, pos, 0),
                 b.call(arith.maximum, b.call(arith.sub, src_len, 1), 0))
    view = [1] * len(shape)
    view[axis] = -1
    spread = b.call(indexing.gather, src, pos, axis=axis)
    return b.call(tensor.where, b.call(tensor.reshape, inside, b.tuple_of(view)), spread, x)


def size_limit(size: Any) -> int:
    """An end at or past which a slice reaches the end of an axis of ``size``
    (a static size itself; for a dynamic one, torch's ``sys.maxsize``-like ends)."""
    return size if isinstance(size, int) else 2 ** 62


def _select_scatter(b: Any, x: Any, src: Any, dim: int, index: int) -> Any:
    """``select_scatter``: a ``slice_scatter`` of the one position (src unsqueezed)."""
    rank = len(_shape(b))
    axis = int(dim) % rank
    at = int(index)
    end = None if at == -1 else at + 1
    return _slice_scatter(b, x, b.call(shaping.unsqueeze, src, axis=axis), axis, at, end, 1)


def _place_along(b: Any, x: Any, src: Any, axis: int, positions: list[int], size: int,
                 rank: int) -> Any:
    if not positions:
        return b.call(structure.identity, x)
    source = np.zeros(size, dtype=np.int64)
    mask = np.zeros(size, dtype=bool)
    for k, p in enumerate(positions):
        source[p], mask[p] = k, True
    view = [1] * rank
    view[axis] = size
    spread = b.call(indexing.gather, src, _array_node(b, source), axis=axis)
    return b.call(tensor.where, _array_node(b, mask.reshape(view)), spread, x)


def _coordinates(b: Any, index: Any, index_shape: tuple[int, ...], axis: int) -> Any:
    """ScatterElements' indices as ScatterND coordinates: for each element of
    ``index``, its own position with ``axis`` replaced by its value."""
    parts = []
    for a, n in enumerate(index_shape):
        if a == axis:
            parts.append(b.call(tensor.cast, index, "i64"))
        else:
            view = [1] * len(index_shape)
            view[a] = n
            grid = np.broadcast_to(np.arange(n, dtype=np.int64).reshape(view), index_shape)
            parts.append(_array_node(b, np.ascontiguousarray(grid)))
    return b.call(shaping.stack, b.tuple_of(parts), axis=-1)


def _scatter(b: Any, x: Any, dim: int, index: Any, src: Any, *, reduce: Any = None) -> Any:
    """``scatter`` (src or value): x with the elements ``index`` names along ``dim``
    replaced — ``scatter_nd`` at each index element's coordinates (a repeated index:
    the last write wins; PyTorch leaves it unspecified)."""
    if reduce is not None:
        raise AnfirError(f"scatter with reduce={reduce!r}", b.loc)
    ishape = _static_shape(b, "scatter's index", 2)
    axis = int(dim) % max(len(ishape), 1)
    coords = _coordinates(b, index, ishape, axis)
    if isinstance(src, (int, float, bool)):
        updates = b.call(arith.add, b.call(tensor.zeros, b.tuple_of(ishape), b.out_dtype()),
                         b.call(tensor.cast, src, b.out_dtype()))
    else:
        sshape = _static_shape(b, "scatter's source", 3)
        updates = src if sshape == ishape else b.call(
            shaping.slice_, src, starts=(0,) * len(ishape), ends=ishape,
            axes=tuple(range(len(ishape))))
    return b.call(indexing.scatter_nd, x, coords, updates)


def _scatter_add(b: Any, x: Any, dim: int, index: Any, src: Any) -> Any:
    ishape = _static_shape(b, "scatter_add's index", 2)
    sshape = _static_shape(b, "scatter_add's source", 3)
    if sshape != ishape:
        src = b.call(shaping.slice_, src, starts=(0,) * len(ishape), ends=ishape,
                     axes=tuple(range(len(ishape))))
    return b.call(indexing.scatter_add, x, b.call(tensor.cast, index, "i64"), src, axis=int(dim))


def _scatter_reduce(b: Any, x: Any, dim: int, index: Any, src: Any, reduce: str,
                    *, include_self: bool = True) -> Any:
    """``scatter_reduce`` with ``sum`` or ``mean`` (the others' gradients at ties are
    not composed yet: refused)."""
    if reduce not in ("sum", "mean"):
        raise AnfirError(f"scatter_reduce with reduce={reduce!r} (sum and mean are imported)",
                         b.loc)
    zeros = b.call(structure.zeros_like, x)
    written = _scatter_add(b, zeros, dim, index, b.call(tensor.ones_like, src))
    out = _scatter_add(b, x if include_self else zeros, dim, index, src)
    if reduce == "mean":
        count = b.call(arith.add, written, 1.0) if include_self else written
        out = b.call(arith.div, out, b.call(tensor.where, b.call(arith.gt, count, 0.0),
                                               count, b.call(tensor.ones_like, count)))
    if not include_self:
        out = b.call(tensor.where, b.call(arith.gt, written, 0.0), out, x)
    return b.call(tensor.cast, out, b.out_dtype())


def _index_put(b: Any, x: Any, indices: Any, values: Any, accumulate: bool = False) -> Any:
    """``x[i, j, ...] = values`` (``+=`` with accumulate): the index tensors broadcast
    together to coordinates, ``scatter_nd`` (replace) or a flat ``scatter_add``."""
    torch = b.importer.torch
    fx_indices = b.fx_node.args[1]
    shape = _static_shape(b, "index_put")
    given = [i for i, v in enumerate(indices) if v is not None]
    if not given or given != list(range(len(given))):
        raise AnfirError("index_put with index tensors after a full slice", b.loc)
    if any(fx_indices[i].meta["val"].dtype in (torch.bool, torch.uint8) for i in given):
        raise AnfirError("index_put with a boolean mask", b.loc)
    common = tuple(int(d) for d in torch.broadcast_shapes(*[fx_indices[i].meta["val"].shape
                                                             for i in given]))
    parts = []
    for i in given:
        idx = b.call(tensor.cast, indices[i], "i64")
        # negative indices count from the end, as PyTorch's
        idx = b.call(elementwise.mod, idx, shape[i])
        parts.append(b.call(tensor.broadcast_to, idx, b.tuple_of(common)))
    rest = shape[len(given):]
    vals = b.call(tensor.broadcast_to, b.call(tensor.cast, values, b.out_dtype()),
                  b.tuple_of(common + rest))
    if not accumulate:
        coords = b.call(shaping.stack, b.tuple_of(parts), axis=-1)
        return b.call(indexing.scatter_nd, x, coords, vals)
    # flat position of the indexed prefix, then scatter_add over rows of the rest
    flat = parts[0]
    for i, part in zip(given[1:], parts[1:]):
        flat = b.call(arith.add, b.call(arith.mul, flat, shape[i]), part)
    lead = int(np.prod(shape[:len(given)]))
    width = int(np.prod(rest)) if rest else 1
    count = int(np.prod(common)) if common else 1
    rows = b.call(tensor.reshape, flat, b.tuple_of((count, 1)))
    rows = b.call(tensor.broadcast_to, rows, b.tuple_of((count, width)))
    table = b.call(tensor.reshape, x, b.tuple_of((lead, width)))
    upd = b.call(tensor.reshape, vals, b.tuple_of((count, width)))
    out = b.call(indexing.scatter_add, table, rows, upd, axis=0)
    return b.call(tensor.reshape, out, b.tuple_of(shape))


def _masked_scatter(b: Any, x: Any, mask: Any, source: Any) -> Any:
    """x with its masked places filled, in order, by source's elements: the k-th
    true place reads ``source.flatten()[k]`` (a running count of the mask)."""
    shape = _static_shape(b, "masked_scatter")
    full = b.call(tensor.broadcast_to, mask, b.tuple_of(shape))
    flat_mask = b.call(tensor.reshape, full, b.tuple_of((-1,)))
    order = b.call(arith.sub, b.call(reduce.cumsum, b.call(tensor.cast, flat_mask, "i64"), axis=0), 1)
    nsrc = int(np.prod(_static_shape(b, "masked_scatter's source", 2)))
    order = b.call(elementwise.clip, order, min=0.0, max=float(max(nsrc - 1, 0)))
    picked = b.call(indexing.gather, b.call(tensor.reshape, source, b.tuple_of((-1,))),
                    b.call(tensor.cast, order, "i64"), axis=0)
    return b.call(tensor.where, full, b.call(tensor.reshape, picked, b.tuple_of(shape)), x)


# -- padding and resampling ----------------------------------------------------------------------
def _mode_pad(mode: str, n: int) -> Rule:
    """``reflection_pad{n}d`` / ``replication_pad{n}d`` -> ``pad`` in ONNX's
    ``reflect`` / ``edge`` modes (PyTorch's pads: last axis first, begin and end)."""
    def rule(b: Any, x: Any, padding: Any) -> Any:
        _static_ints(b, f"{mode} padding", *padding)
        rank = len(_shape(b))
        begins, ends = [0] * rank, [0] * rank
        for i in range(len(padding) // 2):
            begins[rank - 1 - i], ends[rank - 1 - i] = int(padding[2 * i]), int(padding[2 * i + 1])
        return b.call(shaping.pad, x, pads=tuple(begins + ends), mode=mode)
    return rule


def _resample_sizes(b: Any, output_size: Any, scales: Any) -> tuple[tuple[int, ...], tuple[int, ...], list[float]]:
    shape = _static_shape(b, "upsampling")
    spatial = shape[2:]
    out = tuple(int(d) for d in _out_val(b).shape[2:])
    if scales is not None and output_size is None:
        factors = [float(s) for s in scales]
    else:
        factors = [o / i for o, i in zip(out, spatial)]
    return spatial, out, factors


def _upsample_nearest(b: Any, x: Any, output_size: Any = None, scales: Any = None) -> Any:
    """``upsample_nearest2d``: per spatial axis a ``gather`` of floor(out · in / out)
    (PyTorch's nearest: the source index of output i is floor(i · scale⁻¹))."""
    spatial, out, factors = _resample_sizes(b, output_size, scales)
    for axis, (n_in, n_out, f) in enumerate(zip(spatial, out, factors)):
        scale = (1.0 / f) if scales is not None and output_size is None else n_in / n_out
        src = np.floor(np.arange(n_out, dtype=np.float32) * np.float32(scale))
        src = np.minimum(src.astype(np.int64), n_in - 1)
        x = b.call(indexing.gather, x, _array_node(b, src), axis=axis + 2)
    return x


def _upsample_bilinear(b: Any, x: Any, output_size: Any, align_corners: bool,
                       scales: Any = None) -> Any:
    """``upsample_bilinear2d``: separable — per spatial axis, two ``gather``s and
    their weights (PyTorch's source coordinates, clamped at 0)."""
    spatial, out, factors = _resample_sizes(b, output_size, scales)
    dtype = b.out_dtype()
    for axis, (n_in, n_out, f) in enumerate(zip(spatial, out, factors)):
        i = np.arange(n_out, dtype=np.float64)
        if align_corners:
            pos = i * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(n_out)
        else:
            scale = (1.0 / f) if scales is not None and output_size is None else n_in / n_out
            pos = np.maximum((i + 0.5) * scale - 0.5, 0.0)
        lo = np.minimum(np.floor(pos).astype(np.int64), n_in - 1)
        hi = np.minimum(lo + 1, n_in - 1)
        w = (pos - lo).astype(np.float32 if dtype == "f32" else np.float64)
        view = [1] * (len(spatial) + 2)
        view[axis + 2] = n_out
        a = b.call(indexing.gather, x, _array_node(b, lo), axis=axis + 2)
        c = b.call(indexing.gather, x, _array_node(b, hi), axis=axis + 2)
        weight = b.call(tensor.cast, _array_node(b, w.reshape(view)), dtype)
        x = b.call(arith.add, a, b.call(arith.mul, b.call(arith.sub, c, a), weight))
    return x


def _grid_sampler_2d(b: Any, x: Any, grid: Any, interpolation: int, padding: int,
                     align_corners: bool) -> Any:
    """``grid_sampler_2d``, bilinear with zero padding (PyTorch's defaults): four
    corner reads by ``gather_elements`` over the flattened image, weighted by the
    fractional coordinates; corners outside the image weigh 0.  Its gradient reaches
    the image and the grid, as PyTorch's."""
    if int(interpolation) != 0 or int(padding) != 0:
        raise AnfirError("grid_sampler_2d other than bilinear with zero padding", b.loc)
    n, c, h, w = _static_shape(b, "grid_sampler_2d")
    gh, gw = _static_shape(b, "grid_sampler_2d's grid", 1)[1:3]
    dt = b.out_dtype()

    def coord(k: int, size: int) -> Any:
        g = b.call(shaping.squeeze, b.call(shaping.slice_, grid, starts=k, ends=k + 1, axes=3), axis=3)
        if align_corners:
            return b.call(arith.mul, b.call(arith.add, g, 1.0), (size - 1) / 2.0)
        return b.call(arith.div, b.call(arith.sub, b.call(arith.mul, b.call(
            arith.add, g, 1.0), float(size)), 1.0), 2.0)
    ix, iy = coord(0, w), coord(1, h)
    x0 = b.call(elementwise.floor, b.call(structure.stop_gradient, ix))
    y0 = b.call(elementwise.floor, b.call(structure.stop_gradient, iy))
    flat = b.call(tensor.reshape, x, b.tuple_of((n, c, h * w)))
    total: Any = None
    for dy in (0, 1):
        for dx in (0, 1):
            cx = b.call(arith.add, x0, float(dx))
            cy = b.call(arith.add, y0, float(dy))
            wx = b.call(arith.sub, 1.0, b.call(arith.abs_, b.call(arith.sub, ix, cx)))
            wy = b.call(arith.sub, 1.0, b.call(arith.abs_, b.call(arith.sub, iy, cy)))
            inside = b.call(arith.logical_and,
                            b.call(arith.logical_and, b.call(arith.ge, cx, 0.0),
                                   b.call(arith.le, cx, float(w - 1))),
                            b.call(arith.logical_and, b.call(arith.ge, cy, 0.0),
                                   b.call(arith.le, cy, float(h - 1))))
            sx = b.call(elementwise.clip, cx, min=0.0, max=float(w - 1))
            sy = b.call(elementwise.clip, cy, min=0.0, max=float(h - 1))
            idx = b.call(tensor.cast, b.call(arith.add, b.call(arith.mul, sy, float(w)), sx), "i64")
            idx = b.call(tensor.reshape, idx, b.tuple_of((n, 1, gh * gw)))
            idx = b.call(tensor.broadcast_to, idx, b.tuple_of((n, c, gh * gw)))
            vals = b.call(tensor.reshape, b.call(indexing.gather_elements, flat, idx, axis=2),
                          b.tuple_of((n, c, gh, gw)))
            weight = b.call(tensor.where, inside, b.call(arith.mul, wx, wy),
                            b.call(tensor.cast, 0.0, dt))
            term = b.call(arith.mul, vals, b.call(shaping.unsqueeze, weight, axis=1))
            total = term if total is None else b.call(arith.add, total, term)
    return total


def _col2im(b: Any, x: Any, output_size: Any, kernel: Any, dilation: Any, padding: Any,
            stride: Any) -> Any:
    """``col2im`` (``fold``): every column entry added to its image place — a
    ``scatter_add`` with static places into the padded image, then cropped."""
    shape = _static_shape(b, "col2im")
    batched = len(shape) == 3
    n = shape[0] if batched else 1
    ckk, length = shape[-2], shape[-1]
    (oh, ow), (kh, kw) = _int_tuple(output_size, 2), _int_tuple(kernel, 2)
    (dh, dw), (ph, pw), (sh, sw) = _int_tuple(dilation, 2), _int_tuple(padding, 2), _int_tuple(stride, 2)
    c = ckk // (kh * kw)
    hp, wp = oh + 2 * ph, ow + 2 * pw
    blocks_w = (wp - (dw * (kw - 1) + 1)) // sw + 1
    places = np.zeros((c, kh, kw, length), dtype=np.int64)
    for ki in range(kh):
        for kj in range(kw):
            for l in range(length):
                by, bx = divmod(l, blocks_w)
                places[:, ki, kj, l] = (by * sh + ki * dh) * wp + bx * sw + kj * dw
    places += (np.arange(c, dtype=np.int64) * hp * wp)[:, None, None, None]
    cols = b.call(tensor.reshape, x, b.tuple_of((n, ckk * length)))
    index = _array_node(b, np.broadcast_to(places.reshape(1, -1), (n, ckk * length)).copy())
    image = b.call(tensor.zeros, b.tuple_of((n, c * hp * wp)), b.out_dtype())
    image = b.call(indexing.scatter_add, image, index, cols, axis=1)
    image = b.call(tensor.reshape, image, b.tuple_of((n, c, hp, wp)))
    image = b.call(shaping.slice_, image, starts=(ph, pw), ends=(ph + oh, pw + ow), axes=(2, 3))
    return image if batched else b.call(shaping.squeeze, image, axis=0)


# -- embeddings, dropout ---------------------------------------------------------------------
def _embedding_bag(b: Any, weight: Any, indices: Any, offsets: Any, scale_grad_by_freq: bool = False,
                   mode: int = 0, sparse: bool = False, per_sample_weights: Any = None,
                   include_last_offset: bool = False, padding_idx: int = -1) -> Any:
    """``_embedding_bag`` with ``sum`` (0) or ``mean`` (1) over 1-d indices: each
    index's bag from the offsets (a comparison count), the rows gathered, scaled by
    per-sample weights, and summed into their bags by a one-hot ``matmul``.
    Returns ``(out, offset2bag, bag_size, max_indices)``."""
    if int(mode) not in (0, 1) or scale_grad_by_freq:
        raise AnfirError("_embedding_bag other than sum or mean (without scale_grad_by_freq)", b.loc)
    (count,) = _static_shape(b, "_embedding_bag's indices", 1)
    (n_off,) = _static_shape(b, "_embedding_bag's offsets", 2)
    bags = n_off - 1 if include_last_offset else n_off
    position = _array_node(b, np.arange(count, dtype=np.int64).reshape(-1, 1))
    starts = b.call(tensor.reshape, b.call(tensor.cast, offsets, "i64"), b.tuple_of((1, n_off)))
    after = b.call(tensor.sum_, b.call(tensor.cast, b.call(arith.ge, position, starts), "i64"), axis=1)
    bag = b.call(arith.sub, after, 1)
    dt = b.out_dtype(0)
    onehot = b.call(indexing.one_hot, bag, depth=bags, dtype=dt)  # (count, bags)
    keep = b.call(arith.lt, bag, bags)
    if int(padding_idx) >= 0:
        keep = b.call(arith.logical_and, keep, b.call(arith.ne, indices, int(padding_idx)))
    keepf = b.call(tensor.cast, keep, dt)
    rows = b.call(indexing.gather, weight, indices, axis=0)
    scale = keepf if per_sample_weights is None else b.call(arith.mul, keepf, per_sample_weights)
    rows = b.call(arith.mul, rows, b.call(shaping.unsqueeze, scale, axis=1))
    out = b.call(tensor.matmul, b.call(tensor.transpose, onehot), rows)  # (bags, D)
    sizes = b.call(tensor.sum_, b.call(arith.mul, onehot, b.call(shaping.unsqueeze, keepf, axis=1)),
                   axis=0)
    if int(mode) == 1:
        safe = b.call(tensor.where, b.call(arith.gt, sizes, 0.0), sizes, 1.0)
        out = b.call(arith.div, out, b.call(shaping.unsqueeze, safe, axis=1))
    zeros = b.call(tensor.zeros, b.tuple_of((bags,)), "i64")
    return b.call(structure.make_tuple, out, bag, b.call(tensor.cast, sizes, "i64"), zeros)


def _native_dropout(b: Any, x: Any, p: float, train: Any) -> Any:
    """``native_dropout`` in eval (``train`` false): ``(x, all-true mask)``; training
    dropout draws random numbers and is refused."""
    if train:
        raise AnfirError("native_dropout in training mode (random numbers)", b.loc)
    return b.call(structure.make_tuple, b.call(structure.identity, x),
                  b.call(tensor.cast, b.call(tensor.ones_like, x), "bool"))


# -- backward ops --------------------------------------------------------------------------------
def _avg_pool2d_backward(b: Any, grad: Any, x: Any, kernel: Any, stride: Any, padding: Any,
                         ceil_mode: bool, count_include_pad: bool, divisor_override: Any) -> Any:
    if divisor_override is not None:
        raise AnfirError("avg_pool2d_backward with divisor_override", b.loc)
    k = _ints(kernel, 2)
    s = _ints(stride, 2) if stride else k
    return b.call(conv.avg_pool_grad, grad, x, kernel=k, stride=s,
                  padding=_ints(padding, 2), ceil_mode=bool(ceil_mode),
                  count_include_pad=bool(count_include_pad))


def _adaptive_avg_pool2d_backward(b: Any, grad: Any, x: Any) -> Any:
    """The gradient of ``_adaptive_avg_pool2d`` where the windows tile the input
    (every size a multiple of the output's): ``avg_pool_grad``."""
    h, w = _static_shape(b, "_adaptive_avg_pool2d_backward", 1)[2:]
    oh, ow = _static_shape(b, "_adaptive_avg_pool2d_backward")[2:]
    if h % oh or w % ow:
        raise AnfirError("adaptive average pooling backward with sizes that do not divide", b.loc)
    k = (h // oh, w // ow)
    return b.call(conv.avg_pool_grad, grad, x, kernel=k, stride=k)


def _max_pool2d_backward(b: Any, grad: Any, x: Any, kernel: Any, stride: Any, padding: Any,
                         dilation: Any, ceil_mode: bool, indices: Any) -> Any:
    """``max_pool2d_with_indices_backward``: ``max_pool_grad`` (to each window's first
    maximum, the index PyTorch's kernel records)."""
    k = _ints(kernel, 2)
    return b.call(conv.max_pool_grad, x, grad, kernel=k,
                  stride=_ints(stride, 2) if stride else k, padding=_ints(padding, 2),
                  dilation=_ints(dilation, 2), ceil_mode=bool(ceil_mode))


def _embedding_dense_backward(b: Any, grad: Any, indices: Any, num_weights: int, padding_idx: int,
                              scale_grad_by_freq: bool) -> Any:
    """The gradient of ``embedding`` for its weight: each index's gradient row added
    to its row (``scatter_add``), none to ``padding_idx``."""
    if scale_grad_by_freq:
        raise AnfirError("embedding_dense_backward with scale_grad_by_freq", b.loc)
    dim = _static_shape(b, "embedding_dense_backward")[-1]
    _static_ints(b, "embedding_dense_backward", num_weights)
    rows = b.call(tensor.reshape, b.call(tensor.cast, indices, "i64"), b.tuple_of((-1, 1)))
    g = b.call(tensor.reshape, grad, b.tuple_of((-1, dim)))
    if int(padding_idx) >= 0:
        g = b.call(arith.mul, g, b.call(tensor.cast, b.call(arith.ne, rows, int(padding_idx)),
                                           b.out_dtype()))
    rows = b.call(tensor.broadcast_to, rows, b.call(tensor.shape, g))
    table = b.call(tensor.zeros, b.tuple_of((int(num_weights), dim)), b.out_dtype())
    return b.call(indexing.scatter_add, table, rows, g, axis=0)


def _convolution_backward(b: Any, grad: Any, x: Any, w: Any, bias_sizes: Any, stride: Any,
                          padding: Any, dilation: Any, transposed: bool, output_padding: Any,
                          groups: int, output_mask: Any) -> Any:
    """``convolution_backward`` of a (not transposed) convolution: ``conv_input_grad``,
    ``conv_weight_grad`` and the bias gradient (a sum), as ``output_mask`` asks."""
    if transposed:
        raise AnfirError("convolution_backward of a transposed convolution", b.loc)
    n = len(_shape(b, 2)) - 2
    attrs = {"stride": _ints(stride, n), "padding": _ints(padding, n),
             "dilation": _ints(dilation, n), "groups": int(groups)}
    mask = list(output_mask)
    gx = b.call(conv.conv_input_grad, grad, w, x, **attrs) if mask[0] else None
    gw = b.call(conv.conv_weight_grad, x, grad, w, **attrs) if mask[1] else None
    gb = (b.call(tensor.sum_, grad, axis=(0,) + tuple(range(2, n + 2)))
          if len(mask) > 2 and mask[2] else None)
    return b.call(structure.make_tuple, gx, gw, gb)


def _layer_norm_backward(b: Any, grad: Any, x: Any, normalized_shape: Any, mean: Any, rstd: Any,
                         weight: Any, bias: Any, output_mask: Any) -> Any:
    """``native_layer_norm_backward``: PyTorch's formula — dx = rstd · (g − mean(g) −
    x̂ · mean(g · x̂)) with g the output gradient times the weight; the weight's
    gradient sums grad · x̂, the bias's grad, over the leading axes."""
    rank = len(_shape(b, 1))
    axes = tuple(range(rank - len(normalized_shape), rank))
    lead = tuple(range(rank - len(normalized_shape)))
    xhat = b.call(arith.mul, b.call(arith.sub, x, mean), rstd)
    g = grad if weight is None else b.call(arith.mul, grad, weight)
    mean_g = b.call(tensor.mean, g, axis=axes, keepdims=True)
    mean_gx = b.call(tensor.mean, b.call(arith.mul, g, xhat), axis=axes, keepdims=True)
    dx = b.call(arith.mul, rstd, b.call(arith.sub, b.call(arith.sub, g, mean_g),
                                           b.call(arith.mul, xhat, mean_gx)))
    mask = list(output_mask)
    dw = (b.call(tensor.sum_, b.call(arith.mul, grad, xhat), axis=lead or None)
          if mask[1] and weight is not None else None)
    db = b.call(tensor.sum_, grad, axis=lead or None) if mask[2] and bias is not None else None
    return b.call(structure.make_tuple, dx if mask[0] else None, dw, db)


def _group_norm_backward(b: Any, grad: Any, x: Any, mean: Any, rstd: Any, weight: Any, n: Any,
                         c: Any, hxw: Any, group: int, output_mask: Any) -> Any:
    """``native_group_norm_backward``: the layer-norm formula per (sample, group)."""
    shape = _static_shape(b, "native_group_norm_backward", 1)
    rank, groups, channels = len(shape), int(group), shape[1]
    per_channel = (-1,) + (1,) * (rank - 2)
    g = grad if weight is None else b.call(
        arith.mul, grad, b.call(tensor.reshape, weight, b.tuple_of(per_channel)))
    view = b.tuple_of((shape[0], groups, -1))
    gg = b.call(tensor.reshape, g, view)
    xg = b.call(tensor.reshape, x, view)
    m = b.call(tensor.reshape, mean, b.tuple_of((shape[0], groups, 1)))
    r = b.call(tensor.reshape, rstd, b.tuple_of((shape[0], groups, 1)))
    xhat = b.call(arith.mul, b.call(arith.sub, xg, m), r)
    mean_g = b.call(tensor.mean, gg, axis=2, keepdims=True)
    mean_gx = b.call(tensor.mean, b.call(arith.mul, gg, xhat), axis=2, keepdims=True)
    dx = b.call(arith.mul, r, b.call(arith.sub, b.call(arith.sub, gg, mean_g),
                                        b.call(arith.mul, xhat, mean_gx)))
    dx = b.call(tensor.reshape, dx, b.tuple_of(shape))
    xhat_full = b.call(tensor.reshape, xhat, b.tuple_of(shape))
    batch_axes = (0,) + tuple(range(2, rank))
    mask = list(output_mask)
    dw = (b.call(tensor.sum_, b.call(arith.mul, grad, xhat_full), axis=batch_axes)
          if mask[1] and weight is not None else None)
    db = b.call(tensor.sum_, grad, axis=batch_axes) if mask[2] else None
    del channels
    return b.call(structure.make_tuple, dx if mask[0] else None, dw, db)


# -- ops of torch.export's training IR (a program imported without decomposition) ------------
def _conv_nd(n: int) -> Rule:
    """``conv{n}d`` (numeric or ``"same"``/``"valid"`` padding) -> ``convolution``."""
    def rule(b: Any, x: Any, w: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
             dilation: Any = 1, groups: int = 1) -> Any:
        if isinstance(padding, str):
            kernel = _static_shape(b, f"conv{n}d's weight", 1)[2:]
            dil = _int_tuple(dilation, n)
            if padding == "valid":
                padding = 0
            else:  # "same": PyTorch pads the extra element of an even kernel at the end
                totals = [d * (k - 1) for d, k in zip(dil, kernel)]
                begins = [t // 2 for t in totals]
                if any(t % 2 for t in totals):
                    rank = n + 2
                    pads = [0, 0] + begins + [0, 0] + [t - t // 2 for t in totals]
                    x = b.call(shaping.pad, x, pads=tuple(pads[:rank] + pads[rank:]))
                    padding = 0
                else:
                    padding = begins
        return _convolution(b, x, w, bias, _int_tuple(stride, n), _int_tuple(padding, n),
                            _int_tuple(dilation, n), False, [0] * n, groups)
    return rule


def _batch_norm_op(b: Any, x: Any, weight: Any, bias: Any, mean: Any, var: Any, training: bool,
                   momentum: float, eps: float, cudnn_enabled: bool = True) -> Any:
    """``batch_norm`` in eval (training mode mutates the running statistics: such a
    program goes through torch's functionalization instead)."""
    if training:
        raise AnfirError("batch_norm in training mode outside torch's functionalization", b.loc)
    return b.call(structure.tuple_getitem, _batch_norm_eval(b, x, weight, bias, mean, var, momentum, eps), 0)


def _instance_norm_op(b: Any, x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                      use_input_stats: bool, momentum: float, eps: float,
                      cudnn_enabled: bool = True) -> Any:
    """``instance_norm``: anfir's ``instance_norm`` (ONNX's ``InstanceNormalization``)
    over each sample's own statistics; with the running statistics instead
    (``use_input_stats`` false: eval with ``track_running_stats``), ``batch_norm``.
    Updating running statistics (training with them) is a mutation: such a program
    goes through torch's functionalization (see :func:`needs_functionalization`)."""
    fx_x = b.fx_node.args[0]
    weight = _channel_fill(b, fx_x, tensor.ones) if weight is None else weight
    bias = _channel_fill(b, fx_x, tensor.zeros) if bias is None else bias
    if not use_input_stats:
        return b.call(conv.batch_norm, x, weight, bias, running_mean, running_var, eps=float(eps))
    if running_mean is not None:
        raise AnfirError("instance_norm updating running statistics outside torch's "
                         "functionalization", b.loc)
    return b.call(nn.instance_norm, x, weight, bias, eps=float(eps))


def _group_norm_op(b: Any, x: Any, groups: int, weight: Any = None, bias: Any = None,
                   eps: float = 1e-5, cudnn_enabled: bool = True) -> Any:
    shape = _shape(b)
    hxw = 1
    for d in shape[2:]:
        hxw = hxw * d
    n = b.importer.size_value(shape[0], b)
    trio = _native_group_norm(b, x, weight, bias, n, shape[1], hxw, groups, eps)
    return b.call(structure.tuple_getitem, trio, 0)


def _pad_op(b: Any, x: Any, pad: Any, mode: str = "constant", value: Any = None) -> Any:
    if mode == "constant":
        return _constant_pad_nd(b, x, pad, 0 if value is None else value)
    modes = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}
    if mode not in modes:
        raise AnfirError(f"pad with mode {mode!r}", b.loc)
    return _mode_pad(modes[mode], len(pad) // 2)(b, x, pad)


def _max_pool_op(n: int) -> Rule:
    inner = _max_pool_with_indices(n)

    def rule(b: Any, x: Any, kernel: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
             ceil_mode: bool = False) -> Any:
        return b.call(structure.tuple_getitem, inner(b, x, kernel, stride, padding, dilation, ceil_mode), 0)
    return rule


def _dropout_op(b: Any, x: Any, p: float = 0.5, train: Any = False) -> Any:
    if train and float(p) > 0.0:
        raise AnfirError("dropout in training mode (random numbers)", b.loc)
    return b.call(structure.identity, x)


def _to_op(b: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
    """``to`` (dtype, device, layout): a ``cast`` to the result's dtype."""
    val = _out_val(b)
    before = b.fx_node.args[0].meta["val"]
    if val.dtype == before.dtype:
        return b.call(structure.identity, x)
    return b.call(tensor.cast, x, b.out_dtype())


def _split_op(b: Any, x: Any, split_size: Any, dim: int = 0) -> Any:
    """``split`` into pieces of ``split_size`` (the last smaller): their sizes are the
    results' (static) sizes."""
    axis = int(dim)
    sizes = [piece.shape[axis] for piece in _out_val(b)]
    if not all(isinstance(s, int) for s in sizes):
        raise AnfirError("split into pieces of a dynamic size", b.loc)
    return b.call(shaping.split, x, sizes=tuple(int(s) for s in sizes), axis=axis)


def _unbind_op(b: Any, x: Any, dim: int = 0) -> Any:
    axis = int(dim)
    n = _shape(b)[axis]
    if not isinstance(n, int):
        raise AnfirError("unbind along a dynamic axis", b.loc)
    pieces = b.call(shaping.split, x, sizes=(1,) * n, axis=axis)
    return b.call(structure.make_tuple, *(b.call(shaping.squeeze, b.call(structure.tuple_getitem, pieces, i),
                                                axis=axis) for i in range(n)))


def _new_filled(fill: Any) -> Rule:
    def rule(b: Any, x: Any, size: Any, *args: Any, **kwargs: Any) -> Any:
        value = args[0] if fill is None else fill
        zeros = b.call(tensor.zeros, b.out_shape(), b.out_dtype())
        return b.call(arith.add, zeros, b.call(tensor.cast, value, b.out_dtype()))
    return rule


def _filled(fill: Any) -> Rule:
    def rule(b: Any, size: Any, *args: Any, **kwargs: Any) -> Any:
        zeros = b.call(tensor.zeros, b.out_shape(), b.out_dtype())
        return zeros if fill == 0 else b.call(arith.add, zeros, b.call(tensor.cast, fill, b.out_dtype()))
    return rule


def _diff_op(b: Any, x: Any, n: int = 1, dim: int = -1, prepend: Any = None, append: Any = None) -> Any:
    """``diff``: ``x[1:] - x[:-1]`` along ``dim``, ``n`` times (after prepend/append)."""
    axis = int(dim)
    parts = [p for p in (prepend, x, append) if p is not None]
    if len(parts) > 1:
        x = b.call(shaping.concat, b.tuple_of(parts), axis=axis)
    bool_input = _shape(b) is not None and b.fx_node.args[0].meta["val"].dtype == b.importer.torch.bool
    for _ in range(int(n)):
        hi = b.call(shaping.slice_, x, starts=1, ends=2 ** 63 - 1, axes=axis)
        lo = b.call(shaping.slice_, x, starts=0, ends=-1, axes=axis)
        x = b.call(elementwise.logical_xor, hi, lo) if bool_input else b.call(arith.sub, hi, lo)
    return x


def _masked_fill(b: Any, x: Any, mask: Any, value: Any) -> Any:
    return b.call(tensor.where, mask, b.call(tensor.cast, value, b.out_dtype()), x)


def _softmax_op(log: bool) -> Rule:
    def rule(b: Any, x: Any, dim: int, dtype: Any = None, **_: Any) -> Any:
        if dtype is not None:
            x = b.call(tensor.cast, x, dtype)
        return _softmax_core(b, x, dim, log=log)
    return rule


def _set_grad_enabled(b: Any, enabled: bool, body: Any, *args: Any) -> Any:
    """``wrap_with_set_grad_enabled`` (a ``torch.no_grad()`` block): its body's graph
    called on the operands; with gradients disabled, its results go through
    ``stop_gradient`` (no gradient flows back through the block, as in PyTorch)."""
    graph, _ = b.importer.subgraph(body, "grad_enabled" if enabled else "no_grad", list(args), b.loc)
    out = CNode(b.graph, [ValueNode(graph, b.loc)], b.loc)
    if enabled:
        return out
    module = body.value if hasattr(body, "value") else body
    count = len(next(n for n in module.graph.nodes if n.op == "output").args[0])
    return b.call(structure.make_tuple, *(b.call(structure.stop_gradient, b.call(structure.tuple_getitem, out, i))
                                         for i in range(count)))


def _recurrent(kind: str) -> Rule:
    """``lstm.input`` / ``gru.input`` (``nn.LSTM``, ``nn.GRU``; layers, bidirectional,
    batch-first): unrolled over the static time axis — each direction's input
    projections in one ``matmul``, then one cell per step, PyTorch's gate order
    (LSTM: input, forget, cell, output; GRU: reset, update, new).  Returns
    ``(output, h_n[, c_n])``; dropout between layers only in training (refused)."""
    gates = 4 if kind == "lstm" else 3

    def rule(b: Any, x: Any, hx: Any, params: Any, has_biases: bool, num_layers: int,
             dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> Any:
        if train and float(dropout) > 0.0 and int(num_layers) > 1:
            raise AnfirError(f"{kind} with dropout in training mode", b.loc)
        shape = _shape(b)
        steps = shape[1] if batch_first else shape[0]
        if not isinstance(steps, int):
            raise AnfirError(f"{kind} over a dynamic number of time steps", b.loc)
        dirs = 2 if bidirectional else 1
        per = 4 if has_biases else 2
        if len(params) != int(num_layers) * dirs * per:
            raise AnfirError(f"{kind} with projections (proj_size)", b.loc)
        seq = b.call(tensor.transpose, x, b.tuple_of((1, 0, 2))) if batch_first else x
        h0 = hx[0] if isinstance(hx, (list, tuple)) else hx
        c0 = hx[1] if kind == "lstm" else None
        finals_h, finals_c = [], []
        layer_in = seq
        for layer in range(int(num_layers)):
            outs = []
            for d in range(dirs):
                k = (layer * dirs + d) * per
                w_ih, w_hh = params[k], params[k + 1]
                b_ih, b_hh = (params[k + 2], params[k + 3]) if has_biases else (None, None)
                h = b.call(indexing.gather, h0, b.call(tensor.cast, layer * dirs + d, "i64"), axis=0)
                c = (b.call(indexing.gather, c0, b.call(tensor.cast, layer * dirs + d, "i64"), axis=0)
                     if c0 is not None else None)
                proj = b.call(tensor.matmul, layer_in, b.call(tensor.transpose, w_ih))
                if b_ih is not None:
                    proj = b.call(arith.add, proj, b_ih)
                pieces = b.call(shaping.split, proj, sizes=(1,) * steps, axis=0)
                w_hh_t = b.call(tensor.transpose, w_hh)
                order = range(steps) if d == 0 else range(steps - 1, -1, -1)
                hs: dict[int, Any] = {}
                for t in order:
                    xi = b.call(shaping.squeeze, b.call(structure.tuple_getitem, pieces, t), axis=0)
                    hh = b.call(tensor.matmul, h, w_hh_t)
                    if b_hh is not None:
                        hh = b.call(arith.add, hh, b_hh)
                    if kind == "lstm":
                        z = b.call(shaping.split, b.call(arith.add, xi, hh), sizes=gates, axis=-1)
                        i_, f_, g_, o_ = (b.call(structure.tuple_getitem, z, j) for j in range(4))
                        i_, f_, o_ = (b.call(arith.sigmoid, v) for v in (i_, f_, o_))
                        c = b.call(arith.add, b.call(arith.mul, f_, c),
                                   b.call(arith.mul, i_, b.call(arith.tanh, g_)))
                        h = b.call(arith.mul, o_, b.call(arith.tanh, c))
                    else:
                        xs = b.call(shaping.split, xi, sizes=gates, axis=-1)
                        hs3 = b.call(shaping.split, hh, sizes=gates, axis=-1)
                        xr, xz, xn = (b.call(structure.tuple_getitem, xs, j) for j in range(3))
                        hr, hz, hn = (b.call(structure.tuple_getitem, hs3, j) for j in range(3))
                        r = b.call(arith.sigmoid, b.call(arith.add, xr, hr))
                        u = b.call(arith.sigmoid, b.call(arith.add, xz, hz))
                        n = b.call(arith.tanh, b.call(arith.add, xn, b.call(arith.mul, r, hn)))
                        h = b.call(arith.add, n, b.call(arith.mul, u, b.call(arith.sub, h, n)))
                    hs[t] = h
                outs.append(b.call(shaping.stack, b.tuple_of([hs[t] for t in range(steps)]), axis=0))
                finals_h.append(h)
                if c is not None:
                    finals_c.append(c)
            layer_in = outs[0] if dirs == 1 else b.call(shaping.concat, b.tuple_of(outs), axis=-1)
        out = b.call(tensor.transpose, layer_in, b.tuple_of((1, 0, 2))) if batch_first else layer_in
        results = [out, b.call(shaping.stack, b.tuple_of(finals_h), axis=0)]
        if kind == "lstm":
            results.append(b.call(shaping.stack, b.tuple_of(finals_c), axis=0))
        return b.call(structure.make_tuple, *results)
    return rule


def _weight_norm(b: Any, v: Any, g: Any, dim: int = 0) -> Any:
    """``_weight_norm``: ``v * g / ‖v‖`` with the norm over every axis but ``dim``."""
    rank = len(_shape(b))
    axes = tuple(a for a in range(rank) if a != int(dim) % rank) if int(dim) != -1 else None
    norm = b.call(reduce.norm, v, ord=2, axis=axes, keepdims=True)
    return b.call(arith.mul, v, b.call(arith.div, g, norm))


def _where_scalars(b: Any, cond: Any, x: Any, y: Any) -> Any:
    dt = b.out_dtype()
    return b.call(tensor.where, cond, b.call(tensor.cast, x, dt), b.call(tensor.cast, y, dt))


def needs_functionalization(torch: Any, node: Any) -> bool:
    """Whether a training-IR node mutates state only torch's functionalization makes
    explicit (batch norm in training mode, and instance norm over its input's
    statistics with running ones, update their running statistics)."""
    aten = torch.ops.aten
    if node.target is aten.batch_norm.default:
        return bool(node.args[5])
    if node.target is aten.instance_norm.default:
        return bool(node.args[5]) and node.args[3] is not None
    return False


def training_ir_table(torch: Any) -> dict[Any, Rule]:
    """Rules for the ops of torch.export's own (training) IR that core ATen
    decomposes, so a program made only of mapped ops imports without torch's
    re-tracing."""
    aten = torch.ops.aten
    table: dict[Any, Rule] = {}

    def put(name: str, overload: str, rule: Rule) -> None:
        op = getattr(getattr(aten, name, None), overload, None)
        if op is not None:
            table[op] = rule

    for n in (1, 2, 3):
        put(f"conv{n}d", "default", _conv_nd(n))
        put(f"conv{n}d", "padding", _conv_nd(n))
        put(f"max_pool{n}d", "default", _max_pool_op(n))
        put(f"adaptive_avg_pool{n}d", "default", _adaptive_avg_pool(n))
    put("batch_norm", "default", _batch_norm_op)
    put("group_norm", "default", _group_norm_op)
    put("instance_norm", "default", _instance_norm_op)
    put("pad", "default", _pad_op)
    for name in ("dropout", "feature_dropout", "alpha_dropout"):
        put(name, "default", _dropout_op)
    for overload in ("dtype", "dtype_layout", "device", "other"):
        put("to", overload, _to_op)
    put("type_as", "default", _to_op)
    put("split", "Tensor", _split_op)
    put("unbind", "int", _unbind_op)
    for dunder, prim in (("__and__", elementwise.bitwise_and), ("__or__", elementwise.bitwise_or),
                         ("__xor__", elementwise.bitwise_xor)):
        put(dunder, "Tensor", _binary(prim))
    put("new_ones", "default", _new_filled(1))
    put("new_zeros", "default", _new_filled(0))
    put("new_full", "default", _new_filled(None))
    put("new_empty", "default", _new_filled(0))
    put("zeros", "default", _filled(0))
    put("ones", "default", _filled(1))
    put("diff", "default", _diff_op)
    put("masked_fill", "Scalar", _masked_fill)
    put("masked_fill", "Tensor", _masked_fill)
    put("softmax", "int", _softmax_op(False))
    put("log_softmax", "int", _softmax_op(True))
    for name, overload in (("view_as", "default"), ("reshape_as", "default"), ("unflatten", "int")):
        put(name, overload, _reshape_to_result)
    put("expand_as", "default", _expand)
    put("lstm", "input", _recurrent("lstm"))
    put("_weight_norm", "default", _weight_norm)
    for overload in ("ScalarOther", "ScalarSelf", "Scalar"):
        put("where", overload, _where_scalars)
    put("min", "other", lambda b, x, y: b.call(arith.minimum, x, y))
    put("max", "other", lambda b, x, y: b.call(arith.maximum, x, y))
    put("fill", "Tensor", _fill)
    put("gru", "input", _recurrent("gru"))
    wrap = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
    if wrap is not None:
        table[wrap] = _set_grad_enabled
    return table


def core_table(torch: Any) -> dict[Any, Rule]:
    """The rules of this module, by ``OpOverload``."""
    aten = torch.ops.aten
    table: dict[Any, Rule] = {}

    def put(name: str, overload: str, rule: Rule) -> None:
        op = getattr(getattr(aten, name, None), overload, None)
        if op is not None:
            table[op] = rule

    put("log2", "default", _log_base(2.0))
    put("log10", "default", _log_base(10.0))
    put("asinh", "default", _asinh)
    put("acosh", "default", _acosh)
    put("atanh", "default", _atanh)
    put("trunc", "default", _trunc)
    put("clamp", "Tensor", _clamp_tensor)
    put("atan2", "out", lambda b, x, y, *, out=None: b.call(elementwise.atan2, x, y))
    for name, prim in (("bitwise_and", elementwise.bitwise_and), ("bitwise_or", elementwise.bitwise_or),
                       ("bitwise_xor", elementwise.bitwise_xor)):
        put(name, "Scalar", _binary(prim))
    put("div", "Scalar_mode", _div_mode)
    put("copy", "default", _copy)
    put("fill", "Scalar", _fill)
    put("empty", "memory_format", _empty)
    put("empty_strided", "default", _empty)
    put("empty_permuted", "default", _empty)
    put("_local_scalar_dense", "default", _local_scalar)
    put("sym_numel", "default", _sym_query)
    put("sym_stride", "int", _sym_query)
    put("sym_storage_offset", "default", _sym_query)
    put("sym_is_contiguous", "default", _sym_query)
    put("resize_", "default", _resize)
    put("var", "dim", _var_dim)
    put("linalg_vector_norm", "default", _vector_norm)
    put("_cdist_forward", "default", _cdist)
    put("_pdist_forward", "default", _pdist)
    put("native_group_norm", "default", _native_group_norm)
    put("_native_batch_norm_legit", "default", _batch_norm_train)
    put("_native_batch_norm_legit", "no_stats", _batch_norm_train)
    put("_native_batch_norm_legit_functional", "default", _batch_norm_functional)
    put("flip", "default", _flip)
    put("repeat", "default", _repeat)
    put("diagonal", "default", _diagonal)
    put("as_strided", "default", _as_strided)
    put("slice_scatter", "default", _slice_scatter)
    put("select_scatter", "default", _select_scatter)
    put("scatter", "src", _scatter)
    put("scatter", "value", _scatter)
    put("scatter_add", "default", _scatter_add)
    put("scatter_reduce", "two", _scatter_reduce)
    put("index_put", "default", _index_put)
    put("masked_scatter", "default", _masked_scatter)
    for n in (1, 2, 3):
        put(f"reflection_pad{n}d", "default", _mode_pad("reflect", n))
        put(f"replication_pad{n}d", "default", _mode_pad("edge", n))
    put("upsample_nearest2d", "vec", _upsample_nearest)
    put("upsample_bilinear2d", "vec", _upsample_bilinear)
    put("grid_sampler_2d", "default", _grid_sampler_2d)
    put("col2im", "default", _col2im)
    put("_embedding_bag", "default", _embedding_bag)
    put("_embedding_bag_forward_only", "default", _embedding_bag)
    put("native_dropout", "default", _native_dropout)
    put("avg_pool2d_backward", "default", _avg_pool2d_backward)
    put("_adaptive_avg_pool2d_backward", "default", _adaptive_avg_pool2d_backward)
    put("max_pool2d_with_indices_backward", "default", _max_pool2d_backward)
    put("embedding_dense_backward", "default", _embedding_dense_backward)
    put("convolution_backward", "default", _convolution_backward)
    put("native_layer_norm_backward", "default", _layer_norm_backward)
    put("native_group_norm_backward", "default", _group_norm_backward)
    return table


def full_table(torch: Any) -> dict[Any, Rule]:
    """Every rule the importer has: :func:`anfir.interop.torch.rules.common.aten_table` and
    this module's."""
    table = aten_table(torch)
    table.update(core_table(torch))
    table.update(training_ir_table(torch))
    return table


__all__ = ["EXCLUDED", "core_overloads", "core_table", "full_table", "needs_functionalization", "training_ir_table"]

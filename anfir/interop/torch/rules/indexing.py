"""The torch.export rules whose result is built from
:mod:`anfir.primitives.indexing`: gathers (index, select, embedding,
diagonal, as_strided, resampling), scatters and index updates, topk and sort, arange.

See :mod:`anfir.interop.torch.rules.common` for the rule protocol.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anfir.errors import AnfirError
from anfir.interop.torch.rules.common import (RuleTable, array_node, int_tuple, out_value, arg_shape,
                                              require_static, static_arg_shape, size_limit)
from anfir.ir.nodes import Node
from anfir.primitives import arith, elementwise, indexing, reduce, shaping, structure, tensor


def _topk(b: Any, x: Any, k: Any, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
    """``topk`` -> anfir's ``topk`` for the indices (ties: the lower index first, as
    PyTorch's CPU kernel), the values read there with ``gather_elements``: the
    gradient goes to the selected elements."""
    require_static(b, "topk's k", k)
    axis = int(dim)
    pair = b.call(indexing.topk, x, k=int(k), axis=axis, largest=bool(largest))
    index = b.call(structure.tuple_getitem, pair, 1)
    return b.call(structure.make_tuple, b.call(indexing.gather_elements, x, index, axis=axis), index)


def _sort(b: Any, x: Any, dim: int = -1, descending: bool = False) -> Any:
    """``sort`` (stable: equal elements keep their order) as a ``topk`` of the
    whole (static) axis."""
    shape = b.fx_node.args[0].meta["val"].shape
    if not shape:
        return b.call(structure.make_tuple, b.call(structure.identity, x),
                      b.call(tensor.cast, b.call(structure.zeros_like, x), "i64"))
    size = shape[int(dim)]
    if not isinstance(size, int):
        raise AnfirError("sort along a dynamic axis", b.loc)
    return _topk(b, x, size, dim, largest=bool(descending))


def _sort_stable(b: Any, x: Any, *, stable: Any = None, dim: int = -1,
                 descending: bool = False) -> Any:
    return _sort(b, x, dim, descending)


def _embedding(b: Any, weight: Any, indices: Any, padding_idx: int = -1,
               scale_grad_by_freq: bool = False, sparse: bool = False) -> Any:
    """``embedding`` -> ``gather(weight, indices)``.  torch gives the row
    ``padding_idx`` no gradient: that row is read through ``stop_gradient``."""
    if scale_grad_by_freq:
        raise AnfirError("embedding with scale_grad_by_freq (its gradient is scaled)", b.loc)
    if int(padding_idx) >= 0:
        rows = b.fx_node.args[0].meta["val"].shape[0]
        mask = np.zeros((int(rows), 1), dtype=bool)
        mask[int(padding_idx), 0] = True
        weight = b.call(tensor.where, array_node(b, mask),
                        b.call(structure.stop_gradient, weight), weight)
    return b.call(indexing.gather, weight, indices, axis=0)


def _index_select(b: Any, x: Any, dim: int, index: Any) -> Any:
    return b.call(indexing.gather, x, index, axis=int(dim))


def _gather_elements(b: Any, x: Any, dim: int, index: Any, *, sparse_grad: bool = False) -> Any:
    return b.call(indexing.gather_elements, x, index, axis=int(dim))


def _index(b: Any, x: Any, indices: Any) -> Any:
    """``x[..., i, ..., j, ...]`` (``aten.index``): one integer index tensor is a
    ``gather`` along its axis; several (PyTorch broadcasts them together) are a
    ``gather_nd`` on x with the indexed axes moved to the front, its result's
    broadcast axes moved back to where the first indexed axis was when the
    indexed axes are adjacent (NumPy's and PyTorch's rule).  The gradient adds
    up at repeated indices, as PyTorch's ``index_put(accumulate=True)``.
    Boolean masks (a data-dependent shape) are refused."""
    torch = b.importer.torch
    fx_indices = b.fx_node.args[1]
    given = [i for i, v in enumerate(indices) if v is not None]
    if not given or any(fx_indices[i].meta["val"].dtype in (torch.bool, torch.uint8) for i in given):
        raise AnfirError("aten.index with a boolean mask (its result's shape depends on the data)",
                         b.loc)
    if len(given) == 1:
        return b.call(indexing.gather, x, indices[given[0]], axis=given[0])
    rank = b.rank(b.fx_node.args[0])
    rest = [a for a in range(rank) if a not in given]
    moved = b.call(tensor.transpose, x, b.tuple_of(given + rest)) if given != list(range(len(given))) else x
    shapes = [fx_indices[i].meta["val"].shape for i in given]
    common = torch.broadcast_shapes(*shapes)
    target = b.tuple_of(b.importer.size_value(d, b) for d in common)
    parts = [b.call(tensor.broadcast_to, b.call(tensor.cast, indices[i], "i64"), target)
             for i in given]
    out = b.call(indexing.gather_nd, moved, b.call(shaping.stack, b.tuple_of(parts), axis=-1))
    adjacent = given == list(range(given[0], given[-1] + 1))
    if adjacent and given[0] > 0:
        # result: (*common, *rest) -> rest[:given[0]], common, rest[given[0]:]
        nb, first = len(common), given[0]
        perm = (list(range(nb, nb + first)) + list(range(nb))
                + list(range(nb + first, nb + len(rest))))
        out = b.call(tensor.transpose, out, b.tuple_of(perm))
    return out


def _arange(b: Any, start: Any, end: Any = None, step: Any = 1, **_: Any) -> Any:
    """``arange(end)`` / ``arange(start, end, step)``; a symbolic ``end`` is a node."""
    if end is None:
        start, end = 0, start
    require_static(b, "arange's step", step)
    return b.call(indexing.arange, start, end, step=step, dtype=b.out_dtype())


def _select(b: Any, x: Any, dim: int, index: int) -> Any:
    """``x.select(dim, index)`` of a static-size axis: ``where`` keeps element
    ``index`` along ``dim`` (a constant bool mask; the others become exact
    zeros, so no inf/nan leaks) and ``sum`` drops the axis.  Exact, and its
    gradient reaches only the selected slice."""
    shape = b.fx_node.args[0].meta["val"].shape
    rank = len(shape)
    dim = int(dim) % rank
    size = shape[dim]
    if not isinstance(size, int):
        # A dynamic axis: a gather of the one (0-d) index, which drops the axis.
        return b.call(indexing.gather, x, b.call(tensor.cast, int(index), "i64"), axis=dim)
    mask_shape = [1] * rank
    mask_shape[dim] = size
    mask = np.zeros(mask_shape, dtype=bool)
    mask.reshape(-1)[int(index) % size] = True
    kept = b.call(tensor.where, array_node(b, mask), x, b.call(tensor.cast, 0, b.out_dtype()))
    return b.call(tensor.sum_, kept, axis=dim)


def _diagonal(b: Any, x: Any, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Any:
    """``diagonal``: the two axes to the front, ``gather_nd`` of the diagonal's
    (row, column) pairs, the result's diagonal axis moved last."""
    shape = static_arg_shape(b, "diagonal")
    rank = len(shape)
    d1, d2, k = int(dim1) % rank, int(dim2) % rank, int(offset)
    rest = [a for a in range(rank) if a not in (d1, d2)]
    rows = np.arange(max(0, min(shape[d1] + min(k, 0), shape[d2] - max(k, 0))), dtype=np.int64)
    if rows.size == 0:
        return b.call(tensor.zeros, b.out_shape(), b.out_dtype())
    pairs = np.stack([rows - min(k, 0), rows + max(k, 0)], -1)
    moved = b.call(tensor.transpose, x, b.tuple_of([d1, d2] + rest))
    out = b.call(indexing.gather_nd, moved, array_node(b, pairs))
    return b.call(tensor.transpose, out, b.tuple_of(list(range(1, len(rest) + 1)) + [0]))


def _as_strided(b: Any, x: Any, size: Any, stride: Any, storage_offset: Any = None) -> Any:
    """``as_strided`` of a contiguous tensor: a ``gather`` of the flat elements the
    strides name (their positions are static)."""
    val = b.fx_node.args[0].meta["val"]
    require_static(b, "as_strided", *size, *stride, storage_offset)
    static_arg_shape(b, "as_strided")
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
                  array_node(b, flat), axis=0)


def _slice_scatter(b: Any, x: Any, src: Any, dim: int = 0, start: Any = None, end: Any = None,
                   step: int = 1) -> Any:
    """``slice_scatter``: x with ``x[start:end:step]`` along ``dim`` replaced by src —
    ``where`` of a mask and src read back in place by a ``gather``.  A static axis
    and bounds give constant masks; a dynamic axis (BART's ``shift_tokens_right``
    on a dynamic sequence) or bound computes them with ``arange``."""
    require_static(b, "slice_scatter's step", step)
    shape = arg_shape(b)
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


def _select_scatter(b: Any, x: Any, src: Any, dim: int, index: int) -> Any:
    """``select_scatter``: a ``slice_scatter`` of the one position (src unsqueezed)."""
    rank = len(arg_shape(b))
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
    spread = b.call(indexing.gather, src, array_node(b, source), axis=axis)
    return b.call(tensor.where, array_node(b, mask.reshape(view)), spread, x)


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
            parts.append(array_node(b, np.ascontiguousarray(grid)))
    return b.call(shaping.stack, b.tuple_of(parts), axis=-1)


def _scatter(b: Any, x: Any, dim: int, index: Any, src: Any, *, reduce: Any = None) -> Any:
    """``scatter`` (src or value): x with the elements ``index`` names along ``dim``
    replaced — ``scatter_nd`` at each index element's coordinates (a repeated index:
    the last write wins; PyTorch leaves it unspecified)."""
    if reduce is not None:
        raise AnfirError(f"scatter with reduce={reduce!r}", b.loc)
    ishape = static_arg_shape(b, "scatter's index", 2)
    axis = int(dim) % max(len(ishape), 1)
    coords = _coordinates(b, index, ishape, axis)
    if isinstance(src, (int, float, bool)):
        updates = b.call(arith.add, b.call(tensor.zeros, b.tuple_of(ishape), b.out_dtype()),
                         b.call(tensor.cast, src, b.out_dtype()))
    else:
        sshape = static_arg_shape(b, "scatter's source", 3)
        updates = src if sshape == ishape else b.call(
            shaping.slice_, src, starts=(0,) * len(ishape), ends=ishape,
            axes=tuple(range(len(ishape))))
    return b.call(indexing.scatter_nd, x, coords, updates)


def _scatter_add(b: Any, x: Any, dim: int, index: Any, src: Any) -> Any:
    ishape = static_arg_shape(b, "scatter_add's index", 2)
    sshape = static_arg_shape(b, "scatter_add's source", 3)
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
    shape = static_arg_shape(b, "index_put")
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
    shape = static_arg_shape(b, "masked_scatter")
    full = b.call(tensor.broadcast_to, mask, b.tuple_of(shape))
    flat_mask = b.call(tensor.reshape, full, b.tuple_of((-1,)))
    order = b.call(arith.sub, b.call(reduce.cumsum, b.call(tensor.cast, flat_mask, "i64"), axis=0), 1)
    nsrc = int(np.prod(static_arg_shape(b, "masked_scatter's source", 2)))
    order = b.call(elementwise.clip, order, min=0.0, max=float(max(nsrc - 1, 0)))
    picked = b.call(indexing.gather, b.call(tensor.reshape, source, b.tuple_of((-1,))),
                    b.call(tensor.cast, order, "i64"), axis=0)
    return b.call(tensor.where, full, b.call(tensor.reshape, picked, b.tuple_of(shape)), x)


def _resample_sizes(b: Any, output_size: Any, scales: Any) -> tuple[tuple[int, ...], tuple[int, ...], list[float]]:
    shape = static_arg_shape(b, "upsampling")
    spatial = shape[2:]
    out = tuple(int(d) for d in out_value(b).shape[2:])
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
        x = b.call(indexing.gather, x, array_node(b, src), axis=axis + 2)
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
        a = b.call(indexing.gather, x, array_node(b, lo), axis=axis + 2)
        c = b.call(indexing.gather, x, array_node(b, hi), axis=axis + 2)
        weight = b.call(tensor.cast, array_node(b, w.reshape(view)), dtype)
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
    n, c, h, w = static_arg_shape(b, "grid_sampler_2d")
    gh, gw = static_arg_shape(b, "grid_sampler_2d's grid", 1)[1:3]
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
    shape = static_arg_shape(b, "col2im")
    batched = len(shape) == 3
    n = shape[0] if batched else 1
    ckk, length = shape[-2], shape[-1]
    (oh, ow), (kh, kw) = int_tuple(output_size, 2), int_tuple(kernel, 2)
    (dh, dw), (ph, pw), (sh, sw) = int_tuple(dilation, 2), int_tuple(padding, 2), int_tuple(stride, 2)
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
    index = array_node(b, np.broadcast_to(places.reshape(1, -1), (n, ckk * length)).copy())
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
    (count,) = static_arg_shape(b, "_embedding_bag's indices", 1)
    (n_off,) = static_arg_shape(b, "_embedding_bag's offsets", 2)
    bags = n_off - 1 if include_last_offset else n_off
    position = array_node(b, np.arange(count, dtype=np.int64).reshape(-1, 1))
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


def _embedding_dense_backward(b: Any, grad: Any, indices: Any, num_weights: int, padding_idx: int,
                              scale_grad_by_freq: bool) -> Any:
    """The gradient of ``embedding`` for its weight: each index's gradient row added
    to its row (``scatter_add``), none to ``padding_idx``."""
    if scale_grad_by_freq:
        raise AnfirError("embedding_dense_backward with scale_grad_by_freq", b.loc)
    dim = static_arg_shape(b, "embedding_dense_backward")[-1]
    require_static(b, "embedding_dense_backward", num_weights)
    rows = b.call(tensor.reshape, b.call(tensor.cast, indices, "i64"), b.tuple_of((-1, 1)))
    g = b.call(tensor.reshape, grad, b.tuple_of((-1, dim)))
    if int(padding_idx) >= 0:
        g = b.call(arith.mul, g, b.call(tensor.cast, b.call(arith.ne, rows, int(padding_idx)),
                                           b.out_dtype()))
    rows = b.call(tensor.broadcast_to, rows, b.call(tensor.shape, g))
    table = b.call(tensor.zeros, b.tuple_of((int(num_weights), dim)), b.out_dtype())
    return b.call(indexing.scatter_add, table, rows, g, axis=0)


def rules(torch: Any, table: RuleTable) -> None:
    """Add this family's rules to ``table``."""
    aten = torch.ops.aten
    put, named = table.put, table.named
    put(aten.topk.default, _topk)
    put(aten.sort.default, _sort)
    put(aten.sort.stable, _sort_stable)
    put(aten.select.int, _select)
    put(aten.embedding.default, _embedding)
    put(aten.index_select.default, _index_select)
    put(aten.gather.default, _gather_elements)
    put(aten.index.Tensor, _index)
    for op in (aten.arange.default, aten.arange.start, aten.arange.start_step):
        put(op, _arange)
    named("diagonal", "default", _diagonal)
    named("as_strided", "default", _as_strided)
    named("slice_scatter", "default", _slice_scatter)
    named("select_scatter", "default", _select_scatter)
    named("scatter", "src", _scatter)
    named("scatter", "value", _scatter)
    named("scatter_add", "default", _scatter_add)
    named("scatter_reduce", "two", _scatter_reduce)
    named("index_put", "default", _index_put)
    named("masked_scatter", "default", _masked_scatter)
    named("upsample_nearest2d", "vec", _upsample_nearest)
    named("upsample_bilinear2d", "vec", _upsample_bilinear)
    named("grid_sampler_2d", "default", _grid_sampler_2d)
    named("col2im", "default", _col2im)
    named("_embedding_bag", "default", _embedding_bag)
    named("_embedding_bag_forward_only", "default", _embedding_bag)
    named("embedding_dense_backward", "default", _embedding_dense_backward)

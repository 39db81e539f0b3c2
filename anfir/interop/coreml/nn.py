"""MIL rules of the neural-network, shape, indexing and convolution operators
(``primitives/nn.py``, ``shaping.py``, ``indexing.py``, ``conv.py``), merged into
:data:`anfir.interop.coreml.exporter.RULES`.

Most map to one MIL op (``softmax``, ``concat``, ``slice_by_index``, ``pad``,
``gather``, ``gather_along_axis``, ``scatter_along_axis``, ``gather_nd``,
``scatter_nd``, ``topk``, ``split``, ``conv``, ``conv_transpose``, ``max_pool``,
``avg_pool``...).  Composites are written where MIL's op means something else
than anfir's: normalisations in the model's dtype from ``reduce_mean``;
``einsum`` as a broadcast product summed over the contracted labels (MIL's
``einsum`` takes two fixed equation forms only); a ``max_pool`` with dilation,
and the pooling gradients, from the windows of the padded input
(``slice_by_index`` per kernel offset, stacked), placed back by a
``conv_transpose`` whose kernels pick one offset each; conv's weight
gradient as a ``conv`` over the batch axis, as the ONNX exporter does.

Rules use only the writer's helpers (:class:`~anfir.interop.coreml.exporter.MilWriter`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from anfir.dtypes import is_float
from anfir.errors import ExportError
from anfir.flat.statements import Const, Op, Operand, known_rank_shape, shape_of_type, static_dims
from anfir.interop.export_common import (
    conv_geometry, conv_params_of, flip_axes, squeeze_axes, zero_array,
)
from anfir.ir.primitive import Primitive
from anfir.primitives import conv, indexing, nn, nn_kernels, shaping

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.coreml.exporter import MilWriter

Rule = Callable[["MilWriter", Op], None]


# -- helpers ------------------------------------------------------------------------------
def _i32(values: Sequence[int]) -> np.ndarray:
    return np.array([int(v) for v in values], dtype=np.int32)


def _shape(w: "MilWriter", operand: Operand, what: str) -> tuple[Any, ...]:
    return tuple(known_rank_shape(w.type_of(operand), what, w.loc))


def _static(w: "MilWriter", operand: Operand, what: str) -> tuple[int, ...]:
    return static_dims(_shape(w, operand, what), what, "Core ML", w.loc)


def _is_none(operand: Operand) -> bool:
    return isinstance(operand, Const) and operand.value is None


def _scalar(value: Any, d: str) -> Any:
    """A numpy scalar of the MIL dtype carrying anfir's ``d`` (fill values)."""
    if d == "bool":
        return np.bool_(value)
    if is_float(d):
        return np.float16(value) if d == "f16" else np.float32(value)
    return np.int32(value)


def _fill(w: "MilWriter", shape: Any, value: Any, d: str) -> Any:
    return w.op("fill", shape=shape, value=_scalar(value, d))


def _broadcast(w: "MilWriter", x: Any, shape: Any, d: str) -> Any:
    """``x`` broadcast to ``shape`` (MIL has no expand: plus zeros, or or-ed with false)."""
    if d == "bool":
        return w.op("logical_or", x=x, y=_fill(w, shape, False, d))
    return w.op("add", x=x, y=_fill(w, shape, 0, d))


def _shape_var(w: "MilWriter", x: Any, items: Sequence[Any]) -> Any:
    """A 1-D int32 shape: each item an int, or ``("dim", i)`` for x's dimension i."""
    static = [x.shape[i[1]] if isinstance(i, tuple) else i for i in items]
    if all(isinstance(s, (int, np.integer)) for s in static):
        return _i32(static)
    shape = w.op("shape", x=x)
    pieces = [w.op("gather", x=shape, indices=_i32([i[1]]), axis=0) if isinstance(i, tuple)
              else w.const(np.array([i]), "i32") for i in items]
    return w.op("concat", values=pieces, axis=0)


def _bind_identity(w: "MilWriter", out: Any, var: Any) -> None:
    w.bind(out, w.op("identity", out, x=var))


def _expand_dims(w: "MilWriter", x: Any, axes: Sequence[int]) -> Any:
    return w.op("expand_dims", x=x, axes=_i32(axes)) if axes else x


def _slice(w: "MilWriter", x: Any, begin: Sequence[int], end: Sequence[Optional[int]],
           stride: Optional[Sequence[int]] = None) -> Any:
    """``x[begin:end:stride]`` on every axis (non-negative bounds; an end of None: to the
    axis's end, which may be symbolic)."""
    inputs: dict[str, Any] = {}
    if any(e is None for e in end):
        inputs["end_mask"] = [e is None for e in end]
    return w.op("slice_by_index", x=x, begin=_i32(begin), end=_i32([e or 0 for e in end]),
                stride=_i32(stride if stride is not None else [1] * len(begin)), **inputs)


# -- nn ----------------------------------------------------------------------------------
def _softmax(w: "MilWriter", op: Op) -> None:
    """MIL softmax along the axis."""
    out = op.results[0]
    x = w.tensor(op.args[0], w.dtype(out))
    w.bind(out, w.op("softmax", out, x=x, axis=int(op.attrs.get("axis", -1))))


def _tail(w: "MilWriter", op: Op, what: str) -> list[int]:
    return list(nn_kernels.tail_axes(len(_shape(w, op.args[0], what)), int(op.attrs.get("axis", -1))))


def _layer_norm(w: "MilWriter", op: Op) -> None:
    """MIL layer_norm over the axes from ``axis``; then times scale and plus bias (MIL's
    gamma and beta must be constants, and a trained model's are inputs)."""
    out = op.results[0]
    d = w.dtype(out)
    y = w.op("layer_norm", x=w.tensor(op.args[0], d), axes=_i32(_tail(w, op, "layer_norm")),
             epsilon=w.const(float(op.attrs.get("eps", 1e-5)), d))
    for operand, kind in zip(op.args[1:], ("mul", "add")):
        if not _is_none(operand):
            y = w.op(kind, x=y, y=w.tensor(operand, d))
    _bind_identity(w, out, y)


def _channel_view_of(w: "MilWriter", v: Any, rank: int) -> Any:
    """A (C,) vector as (C, 1, ..., 1) against a tensor of ``rank``."""
    return _expand_dims(w, v, list(range(1, rank - 1)))


def _einsum_labels(spec: str, ranks: Sequence[int], w: "MilWriter") -> tuple[list[str], str]:
    """The spec's subscripts with ``...`` spelled out as labels of their own (aligned on
    the right, as numpy broadcasts them); a label repeated in one operand is refused."""
    inputs, output = nn_kernels.einsum_parts(spec)
    widths = [r - len(s.replace("...", "")) if "..." in s else 0 for s, r in zip(inputs, ranks)]
    # Labels no spec can use stand for the ellipsis's axes.
    ellipsis = "".join(chr(0x100 + k) for k in range(max(widths, default=0)))
    spelled = [s.replace("...", ellipsis[len(ellipsis) - k:] if k else "")
               for s, k in zip(inputs, widths)]
    out = output.replace("...", ellipsis)
    for s in spelled:
        if len(set(s)) != len(s):
            raise ExportError(f"einsum {spec!r}: a label repeated in one operand (a diagonal) "
                              "has no MIL form", w.loc)
    return spelled, out


def _einsum(w: "MilWriter", op: Op) -> None:
    """Each operand transposed to one label order, expanded to every label, multiplied
    (broadcast), summed over the labels the output drops, transposed to the output's
    order (MIL's own einsum takes two fixed equation forms only)."""
    out = op.results[0]
    d = w.dtype(out)
    spec = str(w.static(op.args[0]))
    operands = op.args[1:]
    ranks = [len(_shape(w, a, "einsum")) for a in operands]
    subs, output = _einsum_labels(spec, ranks, w)
    order: list[str] = []
    for s in [*subs, output]:
        order.extend(c for c in s if c not in order)
    product = None
    for operand, sub in zip(operands, subs):
        x = w.tensor(operand, d)
        mine = sorted(sub, key=order.index)
        if mine != list(sub):
            x = w.op("transpose", x=x, perm=_i32([sub.index(c) for c in mine]))
        x = _expand_dims(w, x, [k for k, c in enumerate(order) if c not in sub])
        product = x if product is None else w.op("mul", x=product, y=x)
    assert product is not None
    dropped = [k for k, c in enumerate(order) if c not in output]
    if dropped:
        product = w.op("reduce_sum", x=product, axes=_i32(dropped), keep_dims=False)
    kept = [c for c in order if c in output]
    if kept != list(output):
        product = w.op("transpose", x=product, perm=_i32([kept.index(c) for c in output]))
    _bind_identity(w, out, product)


def _einsum_ones(w: "MilWriter", op: Op) -> None:
    """Ones of x's shape, or a 0-d one, as the gradient spec needs."""
    out = op.results[0]
    d = w.dtype(out)
    grad = nn.einsum_grad_spec.impl(w.static(op.args[0]), int(w.static(op.args[1])))
    if grad.split("->")[0].split(",")[-1]:
        w.bind(out, _fill(w, w.shape_of(w.tensor(op.args[2])), 1, d))
    else:
        _bind_identity(w, out, w.const(1, d))


# -- shaping ------------------------------------------------------------------------------
def _items(operand: Any) -> tuple[Any, ...]:
    return operand if isinstance(operand, tuple) else (operand,)


def _concat(w: "MilWriter", op: Op) -> None:
    """MIL concat."""
    out = op.results[0]
    d = w.dtype(out)
    items = _items(op.args[0])
    rank = len(_shape(w, items[0], "concat"))
    w.bind(out, w.op("concat", out, values=[w.tensor(i, d) for i in items],
                     axis=shaping.axis_of(op.attrs["axis"], rank, "concat")))


def _stack(w: "MilWriter", op: Op) -> None:
    """MIL stack."""
    out = op.results[0]
    d = w.dtype(out)
    items = _items(op.args[0])
    rank = len(_shape(w, items[0], "stack"))
    w.bind(out, w.op("stack", out, values=[w.tensor(i, d) for i in items],
                     axis=shaping.axis_of(op.attrs["axis"], rank, "stack", extra=1)))


def _slice_of(w: "MilWriter", x: Any, shape: tuple[int, ...], attrs: dict[str, Any]) -> Any:
    """slice_by_index with Python's clamping resolved on the static shape (a negative
    step running to the front ends with end_mask)."""
    spec = shaping.slice_spec(len(shape), attrs["starts"], attrs["ends"], attrs["axes"],
                               attrs["steps"])
    begin, end, stride = [0] * len(shape), list(shape), [1] * len(shape)
    end_mask = [False] * len(shape)
    for axis, start, stop, step in spec:
        b, e, s = slice(start, stop, step).indices(shape[axis])
        begin[axis], end[axis], stride[axis] = b, e, s
        if s < 0 and e < 0:
            end_mask[axis] = True
            end[axis] = 0
    empty = [a for a in range(len(shape))
             if not range(begin[a], -1 if end_mask[a] else end[a], stride[a])]
    if empty:
        raise ExportError(f"a slice that is empty along axis {empty[0]} has no MIL form", w.loc)
    return w.op("slice_by_index", x=x, begin=_i32(begin), end=_i32(end), stride=_i32(stride),
                end_mask=end_mask)


def _slice_rule(w: "MilWriter", op: Op) -> None:
    """slice_by_index (static shape)."""
    out = op.results[0]
    shape = _static(w, op.args[0], "slice")
    _bind_identity(w, out, _slice_of(w, w.tensor(op.args[0], w.dtype(out)), shape, op.attrs))


def _pad(w: "MilWriter", op: Op) -> None:
    """MIL pad (constant, reflect, replicate for edge); wrap as the slices it copies
    concatenated around x; negative pads crop (slice_by_index)."""
    out = op.results[0]
    d = w.dtype(out)
    shape = _static(w, op.args[0], "pad")
    spec, mode = shaping.pad_widths(op.attrs["pads"], len(shape), op.attrs["mode"])
    x = w.tensor(op.args[0], d)
    grow = [(max(b, 0), max(e, 0)) for b, e in spec]
    if any(b or e for b, e in grow):
        if mode == "wrap":
            # Before x: its last b % n cells, then b // n copies; after: e // n copies,
            # then its first e % n cells.
            for axis, (b, e) in enumerate(grow):
                n = x.shape[axis]
                parts = [_axis_slice(w, x, axis, n - b % n, n)] if b % n else []
                parts += [x] * (b // n + 1 + e // n)
                if e % n:
                    parts.append(_axis_slice(w, x, axis, 0, e % n))
                if len(parts) > 1:
                    x = w.op("concat", values=parts, axis=axis)
        else:
            kind = {"constant": "constant", "reflect": "reflect", "edge": "replicate"}[mode]
            flat = [p for pair in grow for p in pair]
            # MIL pads floats only: integers and booleans through fp32 (exact below 2**24).
            wide = d if is_float(d) else "f32"
            inputs: dict[str, Any] = {"x": w.cast(x, wide), "pad": _i32(flat), "mode": kind}
            if kind == "constant":
                inputs["constant_val"] = _scalar(op.attrs["value"], wide)
            x = w.cast(w.op("pad", **inputs), d)
    if any(b < 0 or e < 0 for b, e in spec):
        sizes = list(x.shape)
        begin = [-b if b < 0 else 0 for b, _ in spec]
        end = [n + e if e < 0 else n for n, (_, e) in zip(sizes, spec)]
        x = _slice(w, x, begin, end)
    _bind_identity(w, out, x)


def _axis_slice(w: "MilWriter", x: Any, axis: int, lo: int, hi: int) -> Any:
    begin, end = [0] * len(x.shape), list(x.shape)
    begin[axis], end[axis] = lo, hi
    return _slice(w, x, begin, end)


def _squeeze(w: "MilWriter", op: Op) -> None:
    """MIL squeeze (no axis: the axes of static length 1); all axes: a reshape to ()."""
    out = op.results[0]
    axes, rank = squeeze_axes(w, op)
    x = w.tensor(op.args[0], w.dtype(out))
    if not axes:
        _bind_identity(w, out, x)
    elif len(axes) == rank:
        w.bind(out, w.reshape(x, np.zeros((0,), dtype=np.int32), out))
    else:
        w.bind(out, w.op("squeeze", out, x=x, axes=_i32(axes)))


def _unsqueeze(w: "MilWriter", op: Op) -> None:
    """MIL expand_dims."""
    out = op.results[0]
    rank = len(_shape(w, op.args[0], "unsqueeze"))
    axes = shaping.unsqueeze_axes(op.attrs["axis"], rank)
    x = w.tensor(op.args[0], w.dtype(out))
    if rank == 0:
        w.bind(out, w.reshape(x, _i32([1] * len(axes)), out))
    else:
        w.bind(out, w.op("expand_dims", out, x=x, axes=_i32(axes)))


def _flatten(w: "MilWriter", op: Op) -> None:
    """reshape: leading axes kept, the merged one -1, trailing ones kept."""
    out = op.results[0]
    shape = _shape(w, op.args[0], "flatten")
    s, e = shaping.flatten_range(len(shape), op.attrs["start"], op.attrs["end"])
    x = w.tensor(op.args[0], w.dtype(out))
    items = [("dim", i) for i in range(s)] + [-1] + [("dim", i) for i in range(e + 1, len(shape))]
    w.bind(out, w.reshape(x, _shape_var(w, x, items), out))


def _broadcast_rule(value: int, shape: int) -> Rule:
    """Operand ``value`` broadcast to the shape operand ``shape`` (expand, full)."""
    def rule(w: "MilWriter", op: Op) -> None:
        out = op.results[0]
        d = w.dtype(out)
        _bind_identity(w, out, _broadcast(w, w.tensor(op.args[value], d),
                                          w.shape_tensor(op.args[shape]), d))
    rule.__doc__ = "x broadcast to the shape"
    return rule


def _tile(w: "MilWriter", op: Op) -> None:
    """MIL tile (x given leading axes first when reps is longer than its rank)."""
    out = op.results[0]
    shape = list(_shape(w, op.args[0], "tile"))
    reps = shaping.ints_attr(op.attrs["reps"], "reps", "tile")
    dims, counts = shaping.tile_layout(shape, tuple(reps))
    x = w.tensor(op.args[0], w.dtype(out))
    if len(dims) > len(shape):
        x = w.reshape(x, _i32([1] * (len(dims) - len(shape)) + [int(n) for n in shape])) \
            if not shape else _expand_dims(w, x, list(range(len(dims) - len(shape))))
    w.bind(out, w.op("tile", out, x=x, reps=_i32(counts)))


def _flip(w: "MilWriter", op: Op) -> None:
    """MIL reverse on the axes."""
    out = op.results[0]
    axes = flip_axes(w, op)
    x = w.tensor(op.args[0], w.dtype(out))
    if not axes:
        _bind_identity(w, out, x)
    else:
        w.bind(out, w.op("reverse", out, x=x, axes=_i32(axes)))


def _roll(sign: int) -> Rule:
    """Two slices concatenated per axis (static lengths); no axis: of the flattened x."""
    def rule(w: "MilWriter", op: Op) -> None:
        out = op.results[0]
        shape = _static(w, op.args[0], "roll")
        shifts, axes = shaping.roll_args(op.attrs["shift"], op.attrs["axis"], len(shape))
        x = w.tensor(op.args[0], w.dtype(out))
        flat = axes is None
        if flat:
            x = w.reshape(x, _i32([-1]))
        for shift, ax in zip(shifts, (0,) if axes is None else axes):
            n = x.shape[ax]
            k = (sign * shift) % n if n else 0
            if k:
                x = w.op("concat", values=[_axis_slice(w, x, ax, n - k, n),
                                           _axis_slice(w, x, ax, 0, n - k)], axis=ax)
        if flat:
            x = w.reshape(x, _i32(shape))
        _bind_identity(w, out, x)
    rule.__doc__ = "roll" if sign > 0 else "roll back"
    return rule


def _triangle(upper: bool) -> Rule:
    """x where a constant triangular mask holds, else zero (static last two dims)."""
    def rule(w: "MilWriter", op: Op) -> None:
        out = op.results[0]
        d = w.dtype(out)
        shape = _shape(w, op.args[0], "tril/triu")
        if len(shape) < 2 or not all(isinstance(n, int) for n in shape[-2:]):
            raise ExportError("tril/triu needs static last two dimensions to export to Core ML",
                              w.loc)
        n, m = int(shape[-2]), int(shape[-1])
        k = int(op.attrs["k"])
        keep = ~np.tri(n, m, k - 1, dtype=bool) if upper else np.tri(n, m, k, dtype=bool)
        x = w.tensor(op.args[0], d)
        if d == "bool":
            w.bind(out, w.op("logical_and", out, x=x, y=w.const(keep, "bool")))
        else:
            w.bind(out, w.op("mul", out, x=x, y=w.const(keep.astype(np.float64), d)))
    rule.__doc__ = "triu" if upper else "tril"
    return rule


def _rank(w: "MilWriter", op: Op) -> None:
    """The (static) rank, a constant."""
    out = op.results[0]
    _bind_identity(w, out, w.const(len(_shape(w, op.args[0], "rank")), w.dtype(out)))


def _split_rule(w: "MilWriter", op: Op) -> None:
    """MIL split at the sizes (a count: equal pieces, the last smaller, as anfir)."""
    shape = _static(w, op.args[0], "split")
    ax = shaping.axis_of(op.attrs["axis"], len(shape), "split")
    x = w.tensor(op.args[0], w.dtype(op.results[0]))
    sizes = op.attrs["sizes"]
    n = shape[ax]
    if isinstance(sizes, tuple):
        lengths = [int(s) for s in sizes]
    else:
        step = -(-n // int(sizes)) if int(sizes) else n
        lengths = [min(step, n - k) for k in range(0, n, step)] if n else []
    _split_into(w, op, x, lengths, ax)


def _split_into(w: "MilWriter", op: Op, x: Any, lengths: Sequence[int], ax: int) -> list[Any]:
    if len(lengths) == 1:
        pieces = [x]
    else:
        pieces = list(w.op("split", x=x, split_sizes=_i32(lengths), axis=ax))
    for result, piece in zip(op.results, pieces):
        _bind_identity(w, result, piece)
    return pieces


def _concat_grad(w: "MilWriter", op: Op) -> None:
    """split of dout at the (static) lengths of the xs."""
    items = _items(op.args[1])
    rank = len(_shape(w, op.args[0], "concat_grad"))
    ax = shaping.axis_of(op.attrs["axis"], rank, "concat_grad")
    lengths = [_static(w, item, "concat_grad")[ax] for item in items]
    _split_into(w, op, w.tensor(op.args[0], w.dtype(op.results[0])), lengths, ax)


def _stack_grad(w: "MilWriter", op: Op) -> None:
    """split into pieces of 1, each squeezed."""
    rank = len(_shape(w, op.args[0], "stack_grad"))
    ax = shaping.axis_of(op.attrs["axis"], rank - 1, "stack_grad", extra=1)
    g = w.tensor(op.args[0], w.dtype(op.results[0]))
    pieces = [g] if len(op.results) == 1 else \
        list(w.op("split", x=g, num_splits=len(op.results), axis=ax))
    for result, piece in zip(op.results, pieces):
        squeezed = w.op("squeeze", x=piece, axes=_i32([ax])) if rank > 1 else \
            w.reshape(piece, np.zeros((0,), dtype=np.int32))
        _bind_identity(w, result, squeezed)


# -- indexing -----------------------------------------------------------------------------
def _positive(w: "MilWriter", index: Any, n: Any) -> Any:
    """Negative indices counted from the end (MIL's gathers want 0 <= i < n)."""
    negative = w.op("less", x=index, y=np.int32(0))
    return w.op("select", cond=negative, a=w.op("add", x=index, y=n), b=index)


def _axis_length(w: "MilWriter", x: Any, ax: int) -> Any:
    n = x.shape[ax]
    if isinstance(n, (int, np.integer)):
        return np.int32(n)
    return w.op("gather", x=w.op("shape", x=x), indices=np.int32(ax), axis=0)


def _gathering(kind: str) -> Rule:
    """MIL ``kind`` along the axis attribute, negative indices counted from the end."""
    def rule(w: "MilWriter", op: Op) -> None:
        out = op.results[0]
        ax = shaping.axis_of(op.attrs["axis"], len(_shape(w, op.args[0], op.prim.name)), op.prim.name)
        x = w.tensor(op.args[0], w.dtype(out))
        index = _positive(w, w.tensor(op.args[1], "i32"), _axis_length(w, x, ax))
        w.bind(out, w.op(kind, out, x=x, indices=index, axis=ax))
    rule.__doc__ = f"MIL {kind} (negative indices from the end)"
    return rule


def _gather_grad(w: "MilWriter", op: Op) -> None:
    """dout, its index axes merged into one, added into zeros of x's shape by MIL
    scatter (mode add) along the axis (static shapes)."""
    out = op.results[0]
    d = w.dtype(out)
    x_shape = _static(w, op.args[1], "gather_grad")
    idx_shape = _static(w, op.args[2], "gather_grad")
    rank = len(x_shape)
    ax = shaping.axis_of(op.attrs["axis"], rank, "gather_grad")
    count = int(np.prod(idx_shape, dtype=np.int64))
    index = _positive(w, w.reshape(w.tensor(op.args[2], "i32"), _i32([count])), np.int32(x_shape[ax]))
    g = w.reshape(w.tensor(op.args[0], d), _i32([*x_shape[:ax], count, *x_shape[ax + 1:]]))
    zeros = w.const(np.zeros(x_shape), d)
    w.bind(out, w.op("scatter", out, data=zeros, indices=index, updates=g, axis=ax, mode="add"))


def _scatter_add(w: "MilWriter", op: Op) -> None:
    """MIL scatter_along_axis, mode add."""
    out = op.results[0]
    d = w.dtype(out)
    rank = len(_shape(w, op.args[0], "scatter_add"))
    ax = shaping.axis_of(op.attrs["axis"], rank, "scatter_add")
    x = w.tensor(op.args[0], d)
    index = _positive(w, w.tensor(op.args[1], "i32"), _axis_length(w, x, ax))
    w.bind(out, w.op("scatter_along_axis", out, data=x, indices=index,
                     updates=w.tensor(op.args[2], d), axis=ax, mode="add"))


def _nd_index(w: "MilWriter", x: Any, index_op: Operand) -> Any:
    """gather_nd's index tuples with negative entries counted from the end."""
    index = w.tensor(index_op, "i32")
    k = index.shape[-1]
    lengths = w.op("slice_by_size", x=w.shape_of(x), begin=_i32([0]), size=_i32([k])) \
        if not isinstance(w.shape_of(x), np.ndarray) else w.shape_of(x)[:k].astype(np.int32)
    return _positive(w, index, lengths)


def _gather_nd(w: "MilWriter", op: Op) -> None:
    """MIL gather_nd."""
    out = op.results[0]
    x = w.tensor(op.args[0], w.dtype(out))
    w.bind(out, w.op("gather_nd", out, x=x, indices=_nd_index(w, x, op.args[1])))


def _gather_nd_grad(w: "MilWriter", op: Op) -> None:
    """MIL scatter_nd (mode add) of dout into zeros of x's shape."""
    out = op.results[0]
    d = w.dtype(out)
    x = w.tensor(op.args[1], d)
    zeros = _fill(w, w.shape_of(x), 0, d)
    w.bind(out, w.op("scatter_nd", out, data=zeros, indices=_nd_index(w, x, op.args[2]),
                     updates=w.tensor(op.args[0], d), mode="add"))


def _scatter_nd(w: "MilWriter", op: Op) -> None:
    """MIL scatter_nd (mode update)."""
    out = op.results[0]
    d = w.dtype(out)
    x = w.tensor(op.args[0], d)
    w.bind(out, w.op("scatter_nd", out, data=x, indices=_nd_index(w, x, op.args[1]),
                     updates=w.tensor(op.args[2], d), mode="update"))


def _topk(w: "MilWriter", op: Op) -> None:
    """MIL topk (sorted; ascending for the smallest)."""
    rank = len(_shape(w, op.args[0], "topk"))
    values, indices = op.results
    x = w.tensor(op.args[0], w.dtype(values))
    got_v, got_i = w.op("topk", x=x, k=int(op.attrs["k"]),
                        axis=shaping.axis_of(op.attrs["axis"], rank, "topk"),
                        ascending=not bool(op.attrs["largest"]))
    _bind_identity(w, values, got_v)
    w.bind(indices, w.op("identity", indices, x=got_i))


def _one_hot(w: "MilWriter", op: Op) -> None:
    """equal(indices[..., None], 0..depth-1), cast (out of range: zeros, as anfir)."""
    out = op.results[0]
    depth = int(op.attrs["depth"])
    x = w.tensor(op.args[0], "i32")
    index = _expand_dims(w, x, [len(x.shape)]) if x.shape else w.reshape(x, _i32([1]))
    hit = w.op("equal", x=index, y=w.const(np.arange(depth), "i32"))
    w.bind(out, w.cast(hit, w.dtype(out), out))


def _arange(w: "MilWriter", op: Op) -> None:
    """MIL range_1d in the result's dtype."""
    out = op.results[0]
    d = w.dtype(out)
    w.bind(out, w.op("range_1d", out, start=w.tensor(op.args[0], d), end=w.tensor(op.args[1], d),
                     step=w.const(op.attrs["step"], d)))


def _eye(w: "MilWriter", op: Op) -> None:
    """The constant matrix (its size is static)."""
    out = op.results[0]
    value = indexing.eye.impl(int(w.static(op.args[0])), **op.attrs)
    _bind_identity(w, out, w.const(value, w.dtype(out)))


# -- convolution and pooling ----------------------------------------------------------------
def _mil_pads(pads: Sequence[int], n: int) -> np.ndarray:
    """anfir's begins-then-ends pads as MIL's (begin, end) pairs per axis."""
    return _i32([p for k in range(n) for p in (pads[k], pads[n + k])])


def _conv_rule(w: "MilWriter", op: Op) -> None:
    """MIL conv with custom pads (conv and conv_core); with a dilation, the windows of x
    (stacked) times the weight, by matmul per group (MIL refuses a dilated conv whose
    weight is computed, as a training graph's is)."""
    out = op.results[0]
    d = w.dtype(out)
    n, st, pads, dil, g = conv_params_of(w, op, op.args[0], op.args[1], "Core ML")
    x, weight = w.tensor(op.args[0], d), w.tensor(op.args[1], d)
    bias = w.tensor(op.args[2], d) if op.prim is conv.conv and len(op.args) > 2 \
        and not _is_none(op.args[2]) else None
    if all(v == 1 for v in dil):
        inputs: dict[str, Any] = {} if bias is None else {"bias": bias}
        w.bind(out, w.op("conv", out, x=x, weight=weight, strides=_i32(st), pad_type="custom",
                         pad=_mil_pads(pads, n), dilations=_i32(dil), groups=g, **inputs))
        return
    x_shape = conv_geometry(w, op.args[0], "conv", "Core ML")
    w_shape = _static(w, op.args[1], "conv")
    sizes = conv_geometry(w, out, "conv", "Core ML")[2:]
    kernel = w_shape[2:]
    count, cells = int(np.prod(kernel)), int(np.prod(sizes))
    windows = _windows(w, x, n, kernel, st, pads, dil, sizes, 0.0, d)   # (N, C, P..., K)
    cin, cout = x_shape[1] // g, w_shape[0] // g
    parts = []
    for group in range(g):
        part = windows if g == 1 else _slice(
            w, windows, [0, group * cin, *([0] * (n + 1))],
            [None, (group + 1) * cin, *sizes, count])
        rows = w.reshape(w.op("transpose", x=part, perm=_i32([0, *range(2, 2 + n), 1, 2 + n])),
                         _shape_var(w, x, [("dim", 0), cells, cin * count]))  # (N, P, C/g * K)
        kern = weight if g == 1 else _slice(w, weight, [group * cout, *([0] * (n + 1))],
                                            [(group + 1) * cout, *w_shape[1:]])
        kern = w.reshape(kern, _i32([cout, cin * count]))
        parts.append(w.op("matmul", x=rows, y=kern, transpose_y=True))   # (N, P, O/g)
    result = parts[0] if g == 1 else w.op("concat", values=parts, axis=2)
    result = w.reshape(w.op("transpose", x=result, perm=_i32([0, 2, 1])),
                       _shape_var(w, x, [("dim", 0), w_shape[0], *sizes]))
    if bias is not None:
        result = w.op("add", x=result, y=_channel_view_of(w, bias, n + 2))
    _bind_identity(w, out, result)


def _conv_transpose_rule(w: "MilWriter", op: Op) -> None:
    """MIL conv_transpose; output_padding through its output_shape (static shapes)."""
    out = op.results[0]
    d = w.dtype(out)
    a = op.attrs
    n = len(_shape(w, op.args[1], "conv_transpose")) - 2
    st = conv.per_axis_ints(a.get("stride", 1), n, "stride", "conv_transpose")
    dil = conv.per_axis_ints(a.get("dilation", 1), n, "dilation", "conv_transpose")
    pads = [int(p) for p in conv.padding_attr(a.get("padding", 0), n, "conv_transpose", strings=False) or ()]
    inputs: dict[str, Any] = {"x": w.tensor(op.args[0], d), "weight": w.tensor(op.args[1], d)}
    if len(op.args) > 2 and not _is_none(op.args[2]):
        inputs["bias"] = w.tensor(op.args[2], d)
    shape = _out_shape(w, out)
    w.bind(out, w.op("conv_transpose", out, strides=_i32(st), pad_type="custom",
                     pad=_mil_pads(pads, n), dilations=_i32(dil),
                     groups=int(a.get("groups", 1)), output_shape=_i32(shape), **inputs))


def _out_shape(w: "MilWriter", out: Any) -> tuple[int, ...]:
    shape = shape_of_type(out.type)
    if shape is None or not all(isinstance(s, (int, np.integer)) for s in shape):
        raise ExportError("a transposed convolution needs static shapes to export to Core ML",
                          w.loc)
    return tuple(int(s) for s in shape)


def _conv_input_grad(w: "MilWriter", op: Op) -> None:
    """conv_transpose of dout whose output_shape is x's."""
    out = op.results[0]
    d = w.dtype(out)
    n, st, pads, dil, g = conv_params_of(w, op, op.args[2], op.args[1], "Core ML")
    w.bind(out, w.op("conv_transpose", out, x=w.tensor(op.args[0], d),
                     weight=w.tensor(op.args[1], d), strides=_i32(st), pad_type="custom",
                     pad=_mil_pads(pads, n), dilations=_i32(dil), groups=g,
                     output_shape=_i32(_static(w, op.args[2], "conv's input gradient"))))


def _conv_weight_grad(w: "MilWriter", op: Op) -> None:
    """A conv with the batch as the contraction (x and dout with axes 0 and 1 exchanged,
    stride and dilation exchanged), the extra kernel positions sliced off."""
    out = op.results[0]
    d = w.dtype(out)
    x_shape = _static(w, op.args[0], "conv's weight gradient")
    dout_shape = _static(w, op.args[1], "conv's weight gradient")
    w_shape = _static(w, op.args[2], "conv's weight gradient")
    n, st, pads, dil, g = conv_params_of(w, op, op.args[0], op.args[2], "Core ML")
    spatial = list(range(2, 2 + n))
    x = w.tensor(op.args[0], d)
    batch, channels = x_shape[0], x_shape[1]
    if any(s != 1 for s in st):
        # The swapped conv would dilate its computed weight (dout), which MIL refuses.
        _weight_grad_by_windows(w, op, x, n, st, pads, dil, g, x_shape, dout_shape, w_shape)
        return
    if g == 1:
        xt = w.op("transpose", x=x, perm=_i32([1, 0, *spatial]))
    else:
        cin = channels // g
        grouped = w.reshape(x, _i32([batch, g, cin, *x_shape[2:]]))
        xt = w.reshape(w.op("transpose", x=grouped, perm=_i32([2, 1, 0, *range(3, 3 + n)])),
                       _i32([cin, g * batch, *x_shape[2:]]))
    dt = w.op("transpose", x=w.tensor(op.args[1], d), perm=_i32([1, 0, *spatial]))
    full = w.op("conv", x=xt, weight=dt, strides=_i32(dil), pad_type="custom",
                pad=_mil_pads(pads, n), dilations=_i32(st), groups=g)
    reach = [(i + pads[k] + pads[n + k] - s * (p - 1) - 1) // dl + 1 for k, (i, p, s, dl)
             in enumerate(zip(x_shape[2:], dout_shape[2:], st, dil))]
    if list(reach) != list(w_shape[2:]):
        full = _slice(w, full, [0] * (n + 2), [x_shape[1] // g, w_shape[0], *w_shape[2:]])
    w.bind(out, w.op("transpose", out, x=full, perm=_i32([1, 0, *spatial])))


def _weight_grad_by_windows(w: "MilWriter", op: Op, x: Any, n: int, st: Sequence[int],
                            pads: Sequence[int], dil: Sequence[int], g: int,
                            x_shape: tuple[int, ...], dout_shape: tuple[int, ...],
                            w_shape: tuple[int, ...]) -> None:
    """dw[o, (c, k)] = dout[o, (n, p)] @ windows[(c, k), (n, p)] per group (matmul)."""
    out = op.results[0]
    d = w.dtype(out)
    kernel, sizes = w_shape[2:], dout_shape[2:]
    count, cells = int(np.prod(kernel)), int(np.prod(sizes))
    windows = _windows(w, x, n, kernel, st, pads, dil, sizes, 0.0, d)   # (N, C, P..., K)
    cols = w.reshape(w.op("transpose", x=windows, perm=_i32([1, 2 + n, 0, *range(2, 2 + n)])),
                     _i32([x_shape[1] * count, x_shape[0] * cells]))    # (C * K, N * P)
    rows = w.reshape(w.op("transpose", x=w.tensor(op.args[1], d), perm=_i32([1, 0, *range(2, 2 + n)])),
                     _i32([dout_shape[1], x_shape[0] * cells]))         # (O, N * P)
    cin, cout = x_shape[1] // g, w_shape[0] // g
    parts = []
    for group in range(g):
        r = rows if g == 1 else _slice(w, rows, [group * cout, 0],
                                       [(group + 1) * cout, x_shape[0] * cells])
        c = cols if g == 1 else _slice(w, cols, [group * cin * count, 0],
                                       [(group + 1) * cin * count, x_shape[0] * cells])
        parts.append(w.op("matmul", x=r, y=c, transpose_y=True))        # (O/g, C/g * K)
    result = parts[0] if g == 1 else w.op("concat", values=parts, axis=0)
    w.bind(out, w.reshape(result, _i32(w_shape), out))


def _pool_geometry(w: "MilWriter", op: Op, x_op: Operand, dilation: bool
                   ) -> tuple[int, tuple[int, ...], tuple[int, ...], list[int], tuple[int, ...],
                              list[int], tuple[int, ...]]:
    """(n, kernel, stride, pads (ends widened for ceil mode), dilation, out sizes, x's shape)."""
    a = op.attrs
    shape = conv_geometry(w, x_op, op.prim.name, "Core ML")
    n, k, st, pads, dil, sizes = conv.pool_params(
        zero_array(shape), a.get("kernel"), a.get("stride"), a.get("padding", 0),
        a.get("dilation", 1) if dilation else 1, a.get("ceil_mode", False), op.prim.name)
    return n, k, st, pads, dil, sizes, shape


def _windows(w: "MilWriter", x: Any, n: int, k: Sequence[int], st: Sequence[int],
             pads: Sequence[int], dil: Sequence[int], sizes: Sequence[int], fill: float,
             d: str) -> Any:
    """(N, C, out..., K): x padded with ``fill``, its window cells stacked last (one
    strided slice_by_index per kernel offset)."""
    if any(pads):
        flat = [p for j in range(n) for p in (pads[j], pads[n + j])]
        x = w.op("pad", x=x, pad=_i32(flat), mode="constant", constant_val=_scalar(fill, d))
    cells = []
    for offset in np.ndindex(*k):
        begin = [0, 0] + [o * dl for o, dl in zip(offset, dil)]
        end = [None, None] + [o * dl + (m - 1) * s + 1
                              for o, dl, m, s in zip(offset, dil, sizes, st)]
        cells.append(_slice(w, x, begin, end, [1, 1, *st]))
    if len(cells) == 1:
        return _expand_dims(w, cells[0], [2 + n])
    return w.op("stack", values=cells, axis=2 + n)


def _lowest(d: str) -> float:
    return -np.inf if is_float(d) else float(np.iinfo(np.int32).min)


def _max_pool(w: "MilWriter", op: Op) -> None:
    """MIL max_pool; with a dilation (MIL's has none) the maximum of the stacked windows."""
    out = op.results[0]
    d = w.dtype(out)
    n, k, st, pads, dil, sizes, _ = _pool_geometry(w, op, op.args[0], True)
    x = w.tensor(op.args[0], d)
    if any(v != 1 for v in dil):
        windows = _windows(w, x, n, k, st, pads, dil, sizes, _lowest(d), d)
        w.bind(out, w.op("reduce_max", out, x=windows, axes=_i32([-1]), keep_dims=False))
        return
    w.bind(out, w.op("max_pool", out, x=x, kernel_sizes=_i32(k), strides=_i32(st),
                     pad_type="custom", pad=_mil_pads(pads, n)))


def _argmax_windows(w: "MilWriter", op: Op, d: str) -> tuple[Any, tuple[Any, ...]]:
    """The kernel offset (flat) of each window's first maximum, and the geometry."""
    geometry = _pool_geometry(w, op, op.args[0], True)
    n, k, st, pads, dil, sizes, _ = geometry
    windows = _windows(w, w.tensor(op.args[0], d), n, k, st, pads, dil, sizes, _lowest(d), d)
    return w.op("reduce_argmax", x=windows, axis=-1, keep_dims=False), geometry


def _max_pool_select(w: "MilWriter", op: Op) -> None:
    """g's windows (stacked) read at x's windows' first maxima (gather_along_axis)."""
    out = op.results[0]
    d = w.dtype(out)
    pick, (n, k, st, pads, dil, sizes, _) = _argmax_windows(w, op, d)
    g_windows = _windows(w, w.tensor(op.args[1], d), n, k, st, pads, dil, sizes, 0.0, d)
    picked = w.op("gather_along_axis", x=g_windows, indices=_expand_dims(w, pick, [2 + n]),
                  axis=2 + n)
    w.bind(out, w.op("squeeze", out, x=picked, axes=_i32([2 + n])))


def _place(w: "MilWriter", spread: Any, n: int, pads: Sequence[int], shape: tuple[int, ...],
           out: Any) -> Any:
    """A conv_transpose result on the padded grid cropped (and zero-padded) to x's shape."""
    full = list(spread.shape[2:])
    grow = [max(pads[j] + shape[2 + j] - full[j], 0) for j in range(n)]
    if any(grow):
        spread = w.op("pad", x=spread, pad=_i32([p for g in grow for p in (0, g)]),
                      mode="constant", constant_val=np.float32(0))
    begin = [0, 0, *pads[:n]]
    end = [shape[0], shape[1], *[pads[j] + shape[2 + j] for j in range(n)]]
    return w.op("slice_by_index", out, x=spread, begin=_i32(begin), end=_i32(end),
                stride=_i32([1] * (n + 2)))


def _spread(w: "MilWriter", planes: Any, weight: np.ndarray, groups: int, n: int,
            st: Sequence[int], dil: Sequence[int], sizes: Sequence[int], d: str) -> Any:
    """conv_transpose of (N, groups * K, out...) by constant one-channel kernels: each
    value added to the cells of its window on the padded grid."""
    full = [(m - 1) * s + dl * (kk - 1) + 1
            for m, s, dl, kk in zip(sizes, st, dil, weight.shape[2:])]
    return w.op("conv_transpose", x=planes, weight=w.const(weight, d), strides=_i32(st),
                pad_type="custom", pad=_i32([0] * (2 * n)), dilations=_i32(dil), groups=groups,
                output_shape=_i32([planes.shape[0], groups, *full]))


def _max_pool_grad(w: "MilWriter", op: Op) -> None:
    """dout routed to each window's first maximum: per kernel offset, dout where that
    offset holds the maximum, as K channels per channel, placed back by a grouped
    conv_transpose whose kernel j is 1 at offset j only; cropped to x's shape."""
    out = op.results[0]
    d = w.dtype(out)
    _static(w, op.args[0], "max pooling's gradient")  # the planes' reshape names the batch
    pick, (n, k, st, pads, dil, sizes, shape) = _argmax_windows(w, op, d)
    count = int(np.prod(k))
    hit = w.op("equal", x=_expand_dims(w, pick, [2 + n]), y=w.const(np.arange(count), "i32"))
    routed = w.op("mul", x=w.cast(hit, d), y=_expand_dims(w, w.tensor(op.args[1], d), [2 + n]))
    planes = w.op("transpose", x=routed, perm=_i32([0, 1, 2 + n, *range(2, 2 + n)]))
    planes = w.reshape(planes, _i32([shape[0], shape[1] * count, *sizes]))
    weight = np.tile(np.eye(count).reshape(count, 1, *k), (shape[1], 1, *([1] * n)))
    spread = _spread(w, planes, weight, shape[1], n, st, dil, sizes, d)
    w.bind(out, _place(w, spread, n, pads, shape, out))


def _avg_pool(w: "MilWriter", op: Op) -> None:
    """MIL avg_pool; in ceil mode (where MIL's windows past the end may differ from
    PyTorch's) the stacked windows' sum over anfir's divisor."""
    out = op.results[0]
    d = w.dtype(out)
    n, k, st, pads, _, sizes, shape = _pool_geometry(w, op, op.args[0], False)
    x = w.tensor(op.args[0], d)
    include = bool(op.attrs.get("count_include_pad", True))
    if op.attrs.get("ceil_mode"):
        given = [int(p) for p in conv.padding_attr(op.attrs.get("padding", 0), n, "avg_pool",
                                             strings=False) or ()]
        divisor = conv.avg_divisor(shape, n, k, st, pads, given, sizes, include)
        windows = _windows(w, x, n, k, st, pads, (1,) * n, sizes, 0.0, d)
        total = w.op("reduce_sum", x=windows, axes=_i32([-1]), keep_dims=False)
        w.bind(out, w.op("real_div", out, x=total, y=w.const(divisor, d)))
        return
    w.bind(out, w.op("avg_pool", out, x=x, kernel_sizes=_i32(k), strides=_i32(st),
                     pad_type="custom", pad=_mil_pads(pads, n),
                     exclude_padding_from_average=not include))


def _avg_pool_grad(w: "MilWriter", op: Op) -> None:
    """dout over each window's count (a constant), spread over its window by a grouped
    conv_transpose with a kernel of ones, cropped to x's shape."""
    out = op.results[0]
    d = w.dtype(out)
    _static(w, op.args[1], "average pooling's gradient")  # conv_transpose's output_shape
    n, k, st, pads, _, sizes, shape = _pool_geometry(w, op, op.args[1], False)
    include = bool(op.attrs.get("count_include_pad", True))
    given = [int(p) for p in conv.padding_attr(op.attrs.get("padding", 0), n, "avg_pool",
                                         strings=False) or ()]
    divisor = conv.avg_divisor(shape, n, k, st, pads, given, sizes, include)
    scaled = w.op("real_div", x=w.tensor(op.args[0], d), y=w.const(divisor, d))
    spread = _spread(w, scaled, np.ones((shape[1], 1, *k)), shape[1], n, st, (1,) * n, sizes, d)
    w.bind(out, _place(w, spread, n, pads, shape, out))


def _batch_norm(w: "MilWriter", op: Op) -> None:
    """(x - mean) * scale / sqrt(var + eps) + bias per channel, in the model's dtype
    (MIL's batch_norm wants constant statistics; a training graph feeds them)."""
    out = op.results[0]
    d = w.dtype(out)
    rank = len(_shape(w, op.args[0], "batch_norm"))
    x, scale, bias, mean, var = (w.tensor(a, d) for a in op.args)
    inv = w.op("real_div", x=scale, y=w.op("sqrt", x=w.op(
        "add", x=var, y=w.const(float(op.attrs.get("eps", 1e-5)), d))))
    centred = w.op("sub", x=x, y=_channel_view_of(w, mean, rank))
    scaled = w.op("mul", x=centred, y=_channel_view_of(w, inv, rank))
    w.bind(out, w.op("add", out, x=scaled, y=_channel_view_of(w, bias, rank)))


RULES: dict[Primitive, Rule] = {
    nn.softmax: _softmax, nn.layer_norm: _layer_norm, nn.einsum: _einsum,
    nn.einsum_ones: _einsum_ones,
    # shaping, alphabetically
    shaping.concat: _concat, shaping.concat_grad: _concat_grad, shaping.expand: _broadcast_rule(0, 1),
    shaping.flatten: _flatten, shaping.flip: _flip, shaping.pad: _pad, shaping.rank: _rank,
    shaping.roll: _roll(1), shaping.roll_back: _roll(-1), shaping.slice_: _slice_rule,
    shaping.split: _split_rule, shaping.squeeze: _squeeze, shaping.stack: _stack,
    shaping.stack_grad: _stack_grad, shaping.tile: _tile, shaping.tril: _triangle(upper=False),
    shaping.triu: _triangle(upper=True), shaping.unsqueeze: _unsqueeze,
    # indexing: the gathers, then the scatters and gradients, then the makers
    indexing.gather: _gathering("gather"),
    indexing.gather_elements: _gathering("gather_along_axis"),
    indexing.gather_nd: _gather_nd, indexing.topk: _topk, indexing.one_hot: _one_hot,
    indexing.scatter_add: _scatter_add, indexing.scatter_nd: _scatter_nd,
    indexing.gather_grad: _gather_grad, indexing.gather_nd_grad: _gather_nd_grad,
    indexing.arange: _arange, indexing.full: _broadcast_rule(1, 0), indexing.eye: _eye,
    conv.conv: _conv_rule, conv.conv_core: _conv_rule, conv.conv_transpose: _conv_transpose_rule,
    conv.conv_input_grad: _conv_input_grad, conv.conv_weight_grad: _conv_weight_grad,
    conv.max_pool: _max_pool, conv.max_pool_grad: _max_pool_grad,
    conv.max_pool_select: _max_pool_select, conv.avg_pool: _avg_pool,
    conv.avg_pool_grad: _avg_pool_grad, conv.batch_norm: _batch_norm,
}
"""The MIL rule of each operator of these families that MIL can express."""

UNSUPPORTED: dict[Primitive, str] = {
    nn.einsum_grad_spec: "it computes a string from constants, which constant folding does "
                         "before export; MIL has no strings",
}
"""Primitives of these families without a MIL rule, with the reason."""


__all__ = ["RULES", "UNSUPPORTED"]

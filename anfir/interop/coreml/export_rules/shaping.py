"""The Core ML (MIL) export rules of the shape operators of :mod:`anfir.primitives.shaping` (and the
flat program's ``DIM``).

See :mod:`anfir.interop.coreml.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from anfir.dtypes import is_float
from anfir.errors import ExportError
from anfir.flat.statements import DIM, Op
from anfir.interop.export_common import flip_axes, squeeze_axes
from anfir.interop.coreml.export_rules.common import (MilRule, _bind_identity, _broadcast_rule, _expand_dims,
                                                      _i32, _scalar, _shape, _shape_var, _slice, _static)
from anfir.ir.primitive import Primitive
from anfir.primitives import shaping

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.coreml.exporter import MilWriter


def _dim(w: MilWriter, op: Op) -> None:
    """One dimension: ``gather(shape(x), axis)``."""
    out = op.results[0]
    axis = int(w.static(op.args[1]))
    shape = w.shape_of(w.tensor(op.args[0]))
    w.bind(out, w.op("gather", out, x=shape, indices=np.int32(axis), axis=0))


def _items(operand: Any) -> tuple[Any, ...]:
    return operand if isinstance(operand, tuple) else (operand,)


def _concat(w: MilWriter, op: Op) -> None:
    """MIL concat."""
    out = op.results[0]
    d = w.dtype(out)
    items = _items(op.args[0])
    rank = len(_shape(w, items[0], "concat"))
    w.bind(out, w.op("concat", out, values=[w.tensor(i, d) for i in items],
                     axis=shaping.axis_of(op.attrs["axis"], rank, "concat")))


def _stack(w: MilWriter, op: Op) -> None:
    """MIL stack."""
    out = op.results[0]
    d = w.dtype(out)
    items = _items(op.args[0])
    rank = len(_shape(w, items[0], "stack"))
    w.bind(out, w.op("stack", out, values=[w.tensor(i, d) for i in items],
                     axis=shaping.axis_of(op.attrs["axis"], rank, "stack", extra=1)))


def _slice_of(w: MilWriter, x: Any, shape: tuple[int, ...], attrs: dict[str, Any]) -> Any:
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


def _slice_rule(w: MilWriter, op: Op) -> None:
    """slice_by_index (static shape)."""
    out = op.results[0]
    shape = _static(w, op.args[0], "slice")
    _bind_identity(w, out, _slice_of(w, w.tensor(op.args[0], w.dtype(out)), shape, op.attrs))


def _pad(w: MilWriter, op: Op) -> None:
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


def _axis_slice(w: MilWriter, x: Any, axis: int, lo: int, hi: int) -> Any:
    begin, end = [0] * len(x.shape), list(x.shape)
    begin[axis], end[axis] = lo, hi
    return _slice(w, x, begin, end)


def _squeeze(w: MilWriter, op: Op) -> None:
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


def _unsqueeze(w: MilWriter, op: Op) -> None:
    """MIL expand_dims."""
    out = op.results[0]
    rank = len(_shape(w, op.args[0], "unsqueeze"))
    axes = shaping.unsqueeze_axes(op.attrs["axis"], rank)
    x = w.tensor(op.args[0], w.dtype(out))
    if rank == 0:
        w.bind(out, w.reshape(x, _i32([1] * len(axes)), out))
    else:
        w.bind(out, w.op("expand_dims", out, x=x, axes=_i32(axes)))


def _flatten(w: MilWriter, op: Op) -> None:
    """reshape: leading axes kept, the merged one -1, trailing ones kept."""
    out = op.results[0]
    shape = _shape(w, op.args[0], "flatten")
    s, e = shaping.flatten_range(len(shape), op.attrs["start"], op.attrs["end"])
    x = w.tensor(op.args[0], w.dtype(out))
    items = [("dim", i) for i in range(s)] + [-1] + [("dim", i) for i in range(e + 1, len(shape))]
    w.bind(out, w.reshape(x, _shape_var(w, x, items), out))


def _tile(w: MilWriter, op: Op) -> None:
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


def _flip(w: MilWriter, op: Op) -> None:
    """MIL reverse on the axes."""
    out = op.results[0]
    axes = flip_axes(w, op)
    x = w.tensor(op.args[0], w.dtype(out))
    if not axes:
        _bind_identity(w, out, x)
    else:
        w.bind(out, w.op("reverse", out, x=x, axes=_i32(axes)))


def _roll(sign: int) -> MilRule:
    """Two slices concatenated per axis (static lengths); no axis: of the flattened x."""
    def rule(w: MilWriter, op: Op) -> None:
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


def _triangle(upper: bool) -> MilRule:
    """x where a constant triangular mask holds, else zero (static last two dims)."""
    def rule(w: MilWriter, op: Op) -> None:
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


def _rank(w: MilWriter, op: Op) -> None:
    """The (static) rank, a constant."""
    out = op.results[0]
    _bind_identity(w, out, w.const(len(_shape(w, op.args[0], "rank")), w.dtype(out)))


def _split_rule(w: MilWriter, op: Op) -> None:
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


def _split_into(w: MilWriter, op: Op, x: Any, lengths: Sequence[int], ax: int) -> list[Any]:
    if len(lengths) == 1:
        pieces = [x]
    else:
        pieces = list(w.op("split", x=x, split_sizes=_i32(lengths), axis=ax))
    for result, piece in zip(op.results, pieces):
        _bind_identity(w, result, piece)
    return pieces


def _concat_grad(w: MilWriter, op: Op) -> None:
    """split of dout at the (static) lengths of the xs."""
    items = _items(op.args[1])
    rank = len(_shape(w, op.args[0], "concat_grad"))
    ax = shaping.axis_of(op.attrs["axis"], rank, "concat_grad")
    lengths = [_static(w, item, "concat_grad")[ax] for item in items]
    _split_into(w, op, w.tensor(op.args[0], w.dtype(op.results[0])), lengths, ax)


def _stack_grad(w: MilWriter, op: Op) -> None:
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


RULES: dict[Primitive, MilRule] = {
    DIM: _dim,
    shaping.concat: _concat,
    shaping.concat_grad: _concat_grad,
    shaping.expand: _broadcast_rule(0, 1),
    shaping.flatten: _flatten,
    shaping.flip: _flip,
    shaping.pad: _pad,
    shaping.rank: _rank,
    shaping.roll: _roll(1),
    shaping.roll_back: _roll(-1),
    shaping.slice_: _slice_rule,
    shaping.split: _split_rule,
    shaping.squeeze: _squeeze,
    shaping.stack: _stack,
    shaping.stack_grad: _stack_grad,
    shaping.tile: _tile,
    shaping.tril: _triangle(upper=False),
    shaping.triu: _triangle(upper=True),
    shaping.unsqueeze: _unsqueeze,
}
"""This family's primitive object → the rule writing its MIL ops (merged into
:data:`anfir.interop.coreml.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported to MIL, with the reason."""

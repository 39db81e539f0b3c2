"""The ONNX export rules of the shape operators of :mod:`anfir.primitives.shaping` (and the
flat program's ``DIM``, one dimension of a shape).

Most map to one ONNX operator (Concat, Slice, Pad, Squeeze, Expand, Tile, Trilu).  The
gradient helpers that are linear maps fixed by static shapes (``slice_grad``,
``pad_grad``, ``tile_grad``) reach ONNX decomposed (anfir/decompositions/shaping.py:
a scatter-add of the flattened gradient, a reshape and a sum).  Primitives
that return a tuple (``split``, ``stack_grad``, ``concat_grad``) write
one ONNX output per item.

See :mod:`anfir.interop.onnx.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from anfir.dtypes import numpy_dtype
from anfir.errors import ExportError
from anfir.flat.statements import DIM, Op, static_dims
from anfir.interop.export_common import flip_axes, squeeze_axes
from anfir.interop.onnx.export_rules.common import OnnxRule, known_shape
from anfir.ir.primitive import Primitive
from anfir.primitives import shaping

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.onnx.exporter import OnnxWriter

INT_MAX = np.iinfo(np.int64).max


def _ints_shape(w: OnnxWriter, operand: Any, what: str) -> tuple[int, ...]:
    return static_dims(known_shape(w, operand, what), what, "ONNX", w.loc)


def _concat(w: OnnxWriter, op: Op) -> None:
    """Concat."""
    out = op.results[0]
    d = w.dtype(out)
    items = op.args[0] if isinstance(op.args[0], tuple) else (op.args[0],)
    rank = len(known_shape(w, items[0], "concat"))
    w.node("Concat", [w.tensor(i, d) for i in items], [out.name],
           axis=shaping.axis_of(op.attrs["axis"], rank, "concat"))


def _stack(w: OnnxWriter, op: Op) -> None:
    """Unsqueeze each, then Concat."""
    out = op.results[0]
    d = w.dtype(out)
    items = op.args[0] if isinstance(op.args[0], tuple) else (op.args[0],)
    rank = len(known_shape(w, items[0], "stack"))
    ax = shaping.axis_of(op.attrs["axis"], rank, "stack", extra=1)
    w.node("Concat", [w.op("Unsqueeze", w.tensor(i, d), w.ints([ax])) for i in items], [out.name],
           axis=ax)


def _slice_inputs(w: OnnxWriter, rank: int, attrs: dict[str, Any]) -> list[str]:
    spec = shaping.slice_spec(rank, attrs["starts"], attrs["ends"], attrs["axes"], attrs["steps"])
    return [w.ints([s for _, s, _, _ in spec]), w.ints([min(e, INT_MAX) for _, _, e, _ in spec]),
            w.ints([a for a, _, _, _ in spec]), w.ints([st for _, _, _, st in spec])]


def _slice(w: OnnxWriter, op: Op) -> None:
    """Slice (the same clamping)."""
    out = op.results[0]
    rank = len(known_shape(w, op.args[0], "slice"))
    w.node("Slice", [w.tensor(op.args[0], w.dtype(out)), *_slice_inputs(w, rank, op.attrs)], [out.name])


def _pad(w: OnnxWriter, op: Op) -> None:
    """Pad (modes constant, reflect, edge, wrap)."""
    out = op.results[0]
    d = w.dtype(out)
    rank = len(known_shape(w, op.args[0], "pad"))
    spec, mode = shaping.pad_widths(op.attrs["pads"], rank, op.attrs["mode"])
    pads = [max(b, 0) for b, _ in spec] + [max(e, 0) for _, e in spec]
    value = w.const(np.array(op.attrs["value"]).astype(numpy_dtype(d)), d)
    padded = w.op("Pad", w.tensor(op.args[0], d), w.ints(pads), value, mode=mode)
    # Negative pads crop: a Slice after the Pad (not every engine takes them in Pad).
    crop = [(ax, -b if b < 0 else 0, e if e < 0 else INT_MAX) for ax, (b, e) in enumerate(spec)
            if b < 0 or e < 0]
    if not crop:
        w.node("Identity", [padded], [out.name])
        return
    w.node("Slice", [padded, w.ints([c[1] for c in crop]), w.ints([c[2] for c in crop]),
                     w.ints([c[0] for c in crop])], [out.name])


def _squeeze(w: OnnxWriter, op: Op) -> None:
    """Squeeze (no axis: the axes of static length 1)."""
    out = op.results[0]
    axes, _ = squeeze_axes(w, op)
    w.node("Squeeze", [w.tensor(op.args[0], w.dtype(out)), w.ints(axes)], [out.name])


def _unsqueeze(w: OnnxWriter, op: Op) -> None:
    """Unsqueeze."""
    out = op.results[0]
    rank = len(known_shape(w, op.args[0], "unsqueeze"))
    axes = shaping.unsqueeze_axes(op.attrs["axis"], rank)
    w.node("Unsqueeze", [w.tensor(op.args[0], w.dtype(out)), w.ints(list(axes))], [out.name])


def _flatten(w: OnnxWriter, op: Op) -> None:
    """Reshape: the kept leading axes copied (0), the merged one -1, trailing ones static."""
    out = op.results[0]
    shape = known_shape(w, op.args[0], "flatten")
    s, e = shaping.flatten_range(len(shape), op.attrs["start"], op.attrs["end"])
    trailing = shape[e + 1:]
    if not all(isinstance(n, int) for n in trailing):
        raise ExportError("flatten of symbolic trailing dimensions cannot be exported", w.loc)
    target = [0] * s + [-1] + [int(n) for n in trailing]
    w.node("Reshape", [w.tensor(op.args[0], w.dtype(out)), w.ints(target)], [out.name])


def _expand(w: OnnxWriter, op: Op) -> None:
    """Expand."""
    out = op.results[0]
    w.node("Expand", [w.tensor(op.args[0], w.dtype(out)), w.shape_tensor(op.args[1])], [out.name])


def _tile_input(w: OnnxWriter, op: Op, what: str) -> tuple[str, list[int], list[Any]]:
    shape = list(known_shape(w, op.args[0 if what == "tile" else 1], what))
    reps = list(shaping.ints_attr(op.attrs["reps"], "reps", what))
    dims, counts = shaping.tile_layout(shape, tuple(reps))
    return "", counts, dims


def _tile(w: OnnxWriter, op: Op) -> None:
    """Tile (x given leading axes first when reps is longer than its rank)."""
    out = op.results[0]
    x = w.tensor(op.args[0], w.dtype(out))
    rank = len(known_shape(w, op.args[0], "tile"))
    _, counts, dims = _tile_input(w, op, "tile")
    if len(dims) > rank:
        x = w.op("Unsqueeze", x, w.ints(list(range(len(dims) - rank))))
    w.node("Tile", [x, w.ints(counts)], [out.name])


def _flip(w: OnnxWriter, op: Op) -> None:
    """Slice with step -1 on the axes (none: Identity)."""
    out = op.results[0]
    axes = flip_axes(w, op)
    x = w.tensor(op.args[0], w.dtype(out))
    if axes:
        steps = w.ints([-1] * len(axes))
        w.node("Slice", [x, steps, w.ints([-INT_MAX] * len(axes)), w.ints(axes), steps], [out.name])
    else:
        w.node("Identity", [x], [out.name])


def _roll_with(w: OnnxWriter, op: Op, sign: int) -> None:
    out = op.results[0]
    shape = _ints_shape(w, op.args[0], "roll")
    shifts, axes = shaping.roll_args(op.attrs["shift"], op.attrs["axis"], len(shape))
    x = w.tensor(op.args[0], w.dtype(out))
    if axes is None:
        x, axes, flat = w.op("Reshape", x, w.ints([-1])), (0,), True
        lengths = [int(np.prod(shape))]
    else:
        flat, lengths = False, [shape[a] for a in axes]
    for shift, ax, n in zip(shifts, axes, lengths):
        k = (sign * shift) % n if n else 0
        if k:
            tail = w.op("Slice", x, w.ints([n - k]), w.ints([n]), w.ints([ax]))
            head = w.op("Slice", x, w.ints([0]), w.ints([n - k]), w.ints([ax]))
            x = w.op("Concat", tail, head, axis=ax)
    if flat:
        x = w.op("Reshape", x, w.ints(list(shape)))
    w.node("Identity", [x], [out.name])


def _triangle(upper: int) -> OnnxRule:
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        k = w.const(np.array(int(op.attrs["k"]), dtype=np.int64), "i64")
        w.node("Trilu", [w.tensor(op.args[0], w.dtype(out)), k], [out.name], upper=upper)
    rule.__doc__ = f"Trilu(upper={upper})"
    return rule


def _rank(w: OnnxWriter, op: Op) -> None:
    """Size(Shape(x))."""
    w.node("Size", [w.op("Shape", w.tensor(op.args[0]))], [op.results[0].name])


def _split_lengths(w: OnnxWriter, items: Any, ax: int) -> str:
    """A 1-D i64 tensor of the lengths of axis ax of the operands (static when known)."""
    dims = [known_shape(w, item, "concat_grad")[ax] for item in items]
    if all(isinstance(d, int) for d in dims):
        return w.ints([int(d) for d in dims])
    axis = w.ints([ax])
    return w.op("Concat", *[w.op("Gather", w.op("Shape", w.tensor(item)), axis, axis=0) for item in items],
                axis=0)


def _split(w: OnnxWriter, op: Op) -> None:
    """Split with the sizes (a count: ONNX's own rule, the last piece smaller)."""
    shape = known_shape(w, op.args[0], "split")
    ax = shaping.axis_of(op.attrs["axis"], len(shape), "split")
    x = w.tensor(op.args[0], w.dtype(op.results[0]))
    sizes = op.attrs["sizes"]
    outs = [r.name for r in op.results]
    if isinstance(sizes, tuple):
        w.node("Split", [x, w.ints(list(sizes))], outs, axis=ax)
    else:
        w.node("Split", [x], outs, axis=ax, num_outputs=len(outs))


def _concat_grad(w: OnnxWriter, op: Op) -> None:
    """Split of dout at the lengths of the xs (Shape + Gather when symbolic)."""
    items = op.args[1] if isinstance(op.args[1], tuple) else (op.args[1],)
    rank = len(known_shape(w, op.args[0], "concat_grad"))
    ax = shaping.axis_of(op.attrs["axis"], rank, "concat_grad")
    g = w.tensor(op.args[0], w.dtype(op.results[0]))
    w.node("Split", [g, _split_lengths(w, items, ax)], [r.name for r in op.results], axis=ax)


def _stack_grad(w: OnnxWriter, op: Op) -> None:
    """Split into pieces of 1, each Squeezed."""
    rank = len(known_shape(w, op.args[0], "stack_grad"))
    ax = shaping.axis_of(op.attrs["axis"], rank - 1, "stack_grad", extra=1)
    g = w.tensor(op.args[0], w.dtype(op.results[0]))
    pieces = [w.temp("piece") for _ in op.results]
    w.node("Split", [g], pieces, axis=ax, num_outputs=len(pieces))
    for piece, result in zip(pieces, op.results):
        w.node("Squeeze", [piece, w.ints([ax])], [result.name])


def _dim(w: OnnxWriter, op: Op) -> None:
    """One dimension: ``Gather(Shape(x), axis)``."""
    out = op.results[0]
    shape = w.temp("shape")
    w.node("Shape", [w.tensor(op.args[0])], [shape])
    axis = int(w.static(op.args[1]))
    w.node("Gather", [shape, w.const(np.array(axis, dtype=np.int64), "i64")], [out.name], axis=0)


RULES: dict[Primitive, OnnxRule] = {
    shaping.split: _split, shaping.concat_grad: _concat_grad, shaping.stack_grad: _stack_grad,
    shaping.concat: _concat, shaping.stack: _stack, shaping.slice_: _slice,
    shaping.pad: _pad,
    shaping.squeeze: _squeeze, shaping.unsqueeze: _unsqueeze, shaping.flatten: _flatten,
    shaping.expand: _expand, shaping.tile: _tile,
    shaping.flip: _flip, shaping.roll: lambda w, op: _roll_with(w, op, 1),
    shaping.roll_back: lambda w, op: _roll_with(w, op, -1),
    shaping.tril: _triangle(0), shaping.triu: _triangle(1), shaping.rank: _rank,
    DIM: _dim,
}
"""This family's primitive object → the rule writing its ONNX nodes (merged into
:data:`anfir.interop.onnx.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported, with the reason (none)."""

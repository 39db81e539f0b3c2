"""MindIR export rules of :mod:`anfir.primitives.shaping`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from anfir.interop.mindir.export_rules.common import (Rule, Unsupported, broadcast, dtype_of, numpy_dtype, registrar,
                                                      static, static_shape, symbolic_shape)
from anfir.ir.nodes import CNode
from anfir.ir.primitive import Primitive
from anfir.abstract.values import ATensor, ATuple
from anfir.errors import AnfirError
from anfir.primitives import shaping
from anfir.primitives.shaping import flatten_range, slice_spec, split_sizes

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.mindir.writer import Writer

RULES: dict[Primitive, Rule] = {}
"""This family's primitives -> how each is written as MindSpore ops."""
UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives MindIR cannot hold, with the reason."""
rule_of = registrar(RULES)


@rule_of(shaping.flatten, shaping.squeeze, shaping.unsqueeze)
def _static_reshape(w: Writer, node: CNode) -> str:
    # a reshape to the result's static shape
    out = node.abstract
    if isinstance(out, ATensor) and out.shape is not None and not all(isinstance(d, int) for d in out.shape):
        return _run_time_reshape(w, node, out)
    if not isinstance(out, ATensor) or out.shape is None or not all(isinstance(d, int) for d in out.shape):
        raise Unsupported(f"{node.callee.value.name} needs a static result shape")  # type: ignore[attr-defined]
    return w.emit("Reshape", [w.ref(node.args[0]), w.constant(tuple(int(d) for d in out.shape), scalar=True)],
                  abstract=out)


def _run_time_reshape(w: Writer, node: CNode, out: ATensor) -> str:
    """flatten/squeeze/unsqueeze whose result has dimension variables: a Reshape with -1
    for the one unknown dimension (MindSpore infers it from the run-time size); with
    more, squeeze is MindSpore's Squeeze of its axes, unsqueeze one ExpandDims per new
    axis (ascending), and a flatten keeping several unknown dimensions is refused."""
    prim = node.callee.value  # type: ignore[attr-defined]
    assert out.shape is not None
    unknown = [k for k, d in enumerate(out.shape) if not isinstance(d, int)]
    attrs = prim.bound_attrs(node.attrs or {}, [static(a, f"{prim.name}'s axes") for a in node.args[1:]])
    axis = attrs.get("axis")
    if prim is shaping.squeeze and axis is None:
        # which axes are 1 is decided on the value: a variable dimension may be 1 too
        raise Unsupported("squeeze of every length-1 axis of a tensor with dimensions known only at "
                          "run time (name the axes)")
    if len(unknown) == 1:
        shape = tuple(-1 if k == unknown[0] else int(d) for k, d in enumerate(out.shape))
        return w.emit("Reshape", [w.ref(node.args[0]), w.constant(shape, scalar=True)], abstract=out)
    if prim is shaping.squeeze:
        xs = symbolic_shape(node.args[0], "squeeze")
        axes = [int(a) % len(xs) for a in ((axis,) if isinstance(axis, int) else axis)]
        return w.emit("Squeeze", [w.ref(node.args[0]), w.constant(tuple(axes), scalar=True)], abstract=out)
    if prim is shaping.unsqueeze and axis is not None:
        ref = w.ref(node.args[0])
        for a in sorted(int(a) % len(out.shape) for a in ((axis,) if isinstance(axis, int) else axis)):
            ref = w.emit("ExpandDims", [ref, w.constant(a, scalar=True)])
        return ref
    if prim is shaping.flatten:
        # the kept axes from x's Shape at run time (scalars), the merged one Reshape's -1
        x = node.args[0]
        xs = symbolic_shape(x, "flatten")
        first, last = flatten_range(len(xs), attrs.get("start", 0), attrs.get("end", -1))
        dims = w.emit("Shape", [w.ref(x)])
        items = [w.constant(-1, scalar=True) if k == first else
                 w.constant(int(xs[k]), scalar=True) if isinstance(xs[k], int) else
                 w.emit("TupleGetItem", [dims, w.constant(k, scalar=True)])
                 for k in (*range(first), first, *range(last + 1, len(xs)))]
        return w.emit("Reshape", [w.ref(x), w.emit("MakeTuple", items)], abstract=out)
    raise Unsupported(f"{prim.name} to a shape with {len(unknown)} dimensions known only at run time "
                      f"({out.shape}): one can be Reshape's -1, not more")


# -- joining and cutting (static shapes) --------------------------------------------------------
def _axis(node: CNode, rank: int) -> int:
    axis = int(node.attrs.get("axis", 0)) if node.attrs else 0
    return axis + rank if axis < 0 else axis


@rule_of(shaping.concat)
def _concat(w: Writer, node: CNode) -> str:
    # Concat(MakeTuple of the tensors, axis) — the axis an input, as MindSpore 2.10 writes it
    rank = len(static_shape(node, "concat"))
    return w.emit("Concat", [w.ref(node.args[0]), w.constant(_axis(node, rank), scalar=True)],
                  abstract=node.abstract)


@rule_of(shaping.stack)
def _stack(w: Writer, node: CNode) -> str:
    rank = len(static_shape(node, "stack"))
    return w.emit("Stack", [w.ref(node.args[0])], attrs={"axis": _axis(node, rank)}, abstract=node.abstract)


def _cut(w: Writer, ref: str, shape: tuple[int, ...], axis: int, start: int, length: int, abstract: Any) -> str:
    """Slice(ref, begin, size): ``length`` elements from ``start`` along ``axis``."""
    begin = tuple(start if k == axis else 0 for k in range(len(shape)))
    size = tuple(length if k == axis else d for k, d in enumerate(shape))
    return w.emit("Slice", [ref, w.constant(begin, scalar=True), w.constant(size, scalar=True)], abstract=abstract)


@rule_of(shaping.slice_)
def _slice(w: Writer, node: CNode) -> str:
    # ONNX-style slice with steps of 1: MindSpore's Slice(x, begin, size) of the clamped bounds
    shape = static_shape(node.args[0], "slice")
    attrs = dict(node.attrs) if node.attrs else {}
    try:
        spec = slice_spec(len(shape), attrs.get("starts"), attrs.get("ends"), attrs.get("axes"), attrs.get("steps"))
    except AnfirError as e:
        raise Unsupported(f"slice attributes: {e.message}") from None
    begin, size = [0] * len(shape), list(shape)
    for axis, start, end, step in spec:
        if step != 1:
            raise Unsupported("a slice with a step other than 1 (MindSpore's Slice takes none)")
        n = shape[axis]
        lo = min(max(start + n if start < 0 else start, 0), n)
        hi = min(max(end + n if end < 0 else end, 0), n)
        begin[axis], size[axis] = lo, max(hi - lo, 0)
    return w.emit("Slice", [w.ref(node.args[0]), w.constant(tuple(begin), scalar=True),
                            w.constant(tuple(size), scalar=True)], abstract=node.abstract)


@rule_of(shaping.split)
def _split(w: Writer, node: CNode) -> str:
    # the pieces as Slices (MindSpore's Split cuts equal pieces only), a MakeTuple of them
    shape = static_shape(node.args[0], "split")
    attrs = dict(node.attrs) if node.attrs else {}
    axis = int(attrs.get("axis", 0))
    axis = axis + len(shape) if axis < 0 else axis
    try:
        parts = split_sizes(shape[axis], attrs.get("sizes"))
    except AnfirError as e:
        raise Unsupported(f"split sizes: {e.message}") from None
    items = node.abstract.items if isinstance(node.abstract, ATuple) else [None] * len(parts)
    ref, start, pieces = w.ref(node.args[0]), 0, []
    for length, abstract in zip(parts, items):
        pieces.append(_cut(w, ref, shape, axis, start, int(length), abstract))
        start += int(length)
    return w.emit("MakeTuple", pieces)


@rule_of(shaping.pad)
def _pad(w: Writer, node: CNode) -> str:
    # constant padding as Concat with blocks of the value; a negative pad crops (a Slice)
    shape = list(static_shape(node.args[0], "pad"))
    attrs = dict(node.attrs) if node.attrs else {}
    if attrs.get("mode", "constant") != "constant":
        raise Unsupported(f"pad mode {attrs.get('mode')!r} (constant padding only)")
    pads = [int(p) for p in (attrs.get("pads") or ())]
    rank = len(shape)
    if len(pads) != 2 * rank:
        raise Unsupported(f"pad with {len(pads)} pads for rank {rank}")
    dtype = dtype_of(node.abstract) or "f64"
    fill = w.constant(np.asarray(attrs.get("value", 0), numpy_dtype(dtype)), dtype)
    ref = w.ref(node.args[0])
    for axis in range(rank):
        before, after = pads[axis], pads[rank + axis]
        if before < 0 or after < 0:  # crop first
            lo, hi = max(-before, 0), shape[axis] - max(-after, 0)
            ref = _cut(w, ref, tuple(shape), axis, lo, max(hi - lo, 0), None)
            shape[axis] = max(hi - lo, 0)
            before, after = max(before, 0), max(after, 0)
        if before == after == 0:
            continue
        items = []
        for width, where in ((before, 0), (after, 1)):
            if width:
                block = tuple(width if k == axis else d for k, d in enumerate(shape))
                items.append((where, broadcast(w, fill, block)))
        ordered = [p for where, p in items if where == 0] + [ref] + [p for where, p in items if where == 1]
        ref = w.emit("Concat", [w.emit("MakeTuple", ordered), w.constant(axis, scalar=True)])
        shape[axis] += before + after
    return w.emit("Reshape", [ref, w.constant(tuple(shape), scalar=True)], abstract=node.abstract)


@rule_of(shaping.concat_grad)
def _concat_grad(w: Writer, node: CNode) -> str:
    # dout cut into the pieces' sizes along the axis: Slices, a MakeTuple of them
    shape = static_shape(node.args[0], "concat_grad")
    items = node.abstract.items if isinstance(node.abstract, ATuple) else ()
    axis = _axis(node, len(shape))
    ref, start, pieces = w.ref(node.args[0]), 0, []
    for abstract in items:
        length = int(abstract.shape[axis]) if isinstance(abstract, ATensor) and abstract.shape else 0
        pieces.append(_cut(w, ref, shape, axis, start, length, abstract))
        start += length
    return w.emit("MakeTuple", pieces)


@rule_of(shaping.stack_grad)
def _stack_grad(w: Writer, node: CNode) -> str:
    # dout's slices along the stacked axis, each reshaped without it
    shape = static_shape(node.args[0], "stack_grad")
    axis = _axis(node, len(shape))
    ref = w.ref(node.args[0])
    items = node.abstract.items if isinstance(node.abstract, ATuple) else ()
    pieces = []
    for k, abstract in enumerate(items):
        piece = _cut(w, ref, shape, axis, k, 1, None)
        rest = tuple(d for a, d in enumerate(shape) if a != axis)
        pieces.append(w.emit("Reshape", [piece, w.constant(rest, scalar=True)], abstract=abstract))
    return w.emit("MakeTuple", pieces)

"""MindIR export rules of :mod:`anfir.primitives.reduce`: max, min, prod, all, any
(MindSpore's ``Reduce*`` ops, axes and keep_dims as inputs), argmax / argmin and cumsum."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from anfir.dtypes import is_float
from anfir.interop.mindir.common import TYPE_ID_OF
from anfir.interop.mindir.export_rules.common import (Rule, Unsupported, dtype_of, elementwise, known, reducer,
                                                      registrar, static_shape)
from anfir.ir.nodes import CNode
from anfir.ir.primitive import Primitive
from anfir.primitives import reduce

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.mindir.writer import Writer

RULES: dict[Primitive, Rule] = {}
"""This family's primitives -> how each is written as MindSpore ops."""
UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives MindIR cannot hold, with the reason."""
rule_of = registrar(RULES)


def _extreme(reduction: str, binary: str) -> Rule:
    """max / min: ``reduction`` over the axis attribute, or with two arguments the
    elementwise ``binary`` (``max(x, y)`` is ``maximum(x, y)``, written as that primitive is).
    MindSpore's ReduceMax / ReduceMin skip NaNs where numpy's (anfir's) give NaN: a float
    reduction adds the sum of x's NaNs (0 where there is none, NaN where there is one)."""
    over = reducer(reduction)
    pair = elementwise(binary)

    def rule(w: Writer, node: CNode) -> str:
        if len(node.args) == 2:
            return _nan_kept(w, node, pair(w, node))
        dtype = dtype_of(node.args[0].abstract)
        if dtype is None or not is_float(dtype):
            return over(w, node)
        x = w.ref(node.args[0])
        nans = w.emit("Select", [w.emit("IsNan", [x]), x, w.emit("ZerosLike", [x])])
        axes, keep = _axes(node)
        if axes == () and node.attrs and node.attrs.get("axis") is not None:
            return x  # an empty tuple of axes reduces nothing
        reduced = w.emit(reduction, [x, w.constant(axes, scalar=True), w.constant(keep, scalar=True)])
        spread = w.emit("ReduceSum", [nans, w.constant(axes, scalar=True), w.constant(keep, scalar=True),
                                      w.constant(False, scalar=True)])
        return w.emit("Add", [reduced, spread], abstract=node.abstract)
    return rule


def _nan_kept(w: Writer, node: CNode, pair: str) -> str:
    """max(x, y) / min(x, y) of floats: MindSpore's Maximum / Minimum give the number where
    the other operand is NaN, numpy's (anfir's) give NaN: each float operand's NaNs
    (Select(IsNan(a), a, 0): NaN or 0) are added to the result."""
    dtype = dtype_of(node.abstract)
    if dtype is None or not is_float(dtype):
        return pair
    out = pair
    for arg in node.args:
        value = known(arg)
        if value is not None:
            if np.any(np.isnan(np.asarray(value[0], dtype=np.float64))):
                out = w.emit("Add", [out, w.constant(value[0], dtype)])
            continue
        have = dtype_of(arg.abstract)
        if have is None or not is_float(have):
            continue  # an integer operand is never NaN
        a = w.ref(arg)
        if have != dtype:
            a = w.emit("Cast", [a, w.constant(TYPE_ID_OF[dtype], scalar=True)])
        out = w.emit("Add", [out, w.emit("Select", [w.emit("IsNan", [a]), a, w.emit("ZerosLike", [a])])])
    return out


def _axes(node: CNode) -> tuple[tuple[int, ...], bool]:
    """The reduced axes (``()``: all) and keepdims of a reduction node."""
    axis = node.attrs.get("axis", None) if node.attrs else None
    keep = bool(node.attrs.get("keepdims", False)) if node.attrs else False
    axes = () if axis is None else ((int(axis),) if isinstance(axis, int) else tuple(int(a) for a in axis))
    return axes, keep


RULES[reduce.max_] = _extreme("ReduceMax", "Maximum")
RULES[reduce.min_] = _extreme("ReduceMin", "Minimum")
RULES[reduce.prod] = reducer("ReduceProd")


def _truth(reduction: str) -> Rule:
    """all / any: MindSpore's ReduceAll / ReduceAny take booleans only; anfir's take
    any dtype (non-zero is true), so another dtype is cast to bool first."""
    def rule(w: Writer, node: CNode) -> str:
        x = node.args[0]
        ref = w.ref(x)
        if dtype_of(x.abstract) != "bool":
            ref = w.emit("Cast", [ref, w.constant(TYPE_ID_OF["bool"], scalar=True)])
        axes, keep = _axes(node)
        if axes == () and node.attrs and node.attrs.get("axis") is not None:
            return ref  # an empty tuple of axes reduces nothing
        return w.emit(reduction, [ref, w.constant(axes, scalar=True), w.constant(keep, scalar=True)],
                      abstract=node.abstract)
    return rule


RULES[reduce.all_] = _truth("ReduceAll")
RULES[reduce.any_] = _truth("ReduceAny")


def _flat(w: Writer, x: Any, what: str) -> str:
    """x flattened (a static shape): what argmax / cumsum without an axis work on."""
    size = int(np.prod(static_shape(x, what)))
    return w.emit("Reshape", [w.ref(x), w.constant((size,), scalar=True)])


def _arg_extreme(op: str, reduction: str) -> Rule:
    """argmax / argmin: MindSpore's Argmax / Argmin (axis and output type as inputs; ties:
    the first index, as numpy).  No axis: of the flattened x.  select_last: the largest
    index where x equals its extreme (ReduceMax of (index + 1) where equal, minus 1)."""
    def rule(w: Writer, node: CNode) -> str:
        x = node.args[0]
        shape = static_shape(x, op)
        axis = node.attrs.get("axis", 0) if node.attrs else 0
        keep = bool(node.attrs.get("keepdims", False)) if node.attrs else False
        last = bool(node.attrs.get("select_last", False)) if node.attrs else False
        ref, rank = w.ref(x), len(shape)
        if axis is None:
            ref, shape, axis = _flat(w, x, op), (int(np.prod(shape)),), 0
        elif rank == 0:
            return w.constant(np.zeros((), np.int64), "i64")
        axis = int(axis) % len(shape)
        if not last:
            index = w.emit(op, [ref, w.constant(axis, scalar=True), w.constant(TYPE_ID_OF["i64"], scalar=True)])
        else:
            extreme = w.emit(reduction, [ref, w.constant((axis,), scalar=True), w.constant(True, scalar=True)])
            hit = w.emit("Cast", [w.emit("Equal", [ref, extreme]), w.constant(TYPE_ID_OF["i64"], scalar=True)])
            view = tuple(n if k == axis else 1 for k, n in enumerate(shape))
            places = w.constant(np.arange(1, shape[axis] + 1, dtype=np.int64).reshape(view), "i64")
            top = w.emit("ReduceMax", [w.emit("Mul", [hit, places]), w.constant((axis,), scalar=True),
                                       w.constant(False, scalar=True)])
            index = w.emit("Sub", [top, w.constant(np.ones((), np.int64), "i64")])
        out = static_shape(node, op)
        return w.emit("Reshape", [index, w.constant(out, scalar=True)], abstract=node.abstract)
    return rule


RULES[reduce.argmax] = _arg_extreme("Argmax", "ReduceMax")
RULES[reduce.argmin] = _arg_extreme("Argmin", "ReduceMin")


@rule_of(reduce.cumsum)
def _cumsum(w: Writer, node: CNode) -> str:
    """MindSpore's CumSum (axis, exclusive, reverse as inputs: numpy's meaning); no axis:
    of the flattened x."""
    x = node.args[0]
    axis = node.attrs.get("axis", None) if node.attrs else None
    exclusive = bool(node.attrs.get("exclusive", False)) if node.attrs else False
    reverse = bool(node.attrs.get("reverse", False)) if node.attrs else False
    ref = _flat(w, x, "cumsum") if axis is None else w.ref(x)
    rank = 1 if axis is None else len(static_shape(x, "cumsum"))
    if rank == 0:
        raise Unsupported("cumsum of a scalar along an axis")
    return w.emit("CumSum", [ref, w.constant(0 if axis is None else int(axis) % rank, scalar=True),
                             w.constant(exclusive, scalar=True), w.constant(reverse, scalar=True)],
                  abstract=node.abstract)

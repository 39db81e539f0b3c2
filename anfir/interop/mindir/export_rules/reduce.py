"""MindIR export rules of :mod:`anfir.primitives.reduce`: max, min, prod, all, any
(MindSpore's ``Reduce*`` ops, axes and keep_dims as inputs), argmax / argmin and cumsum."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anfir.dtypes import is_float
from anfir.interop.mindir.common import TYPE_ID_OF
from anfir.interop.mindir.export_rules.common import (Rule, Unsupported, dtype_of, elementwise, reducer,
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
            return pair(w, node)
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

"""MindIR export rules of :mod:`anfir.primitives.shaping`."""

from __future__ import annotations

from typing import TYPE_CHECKING


from anfir.interop.mindir.export_rules.common import Rule, Unsupported, registrar, static, symbolic_shape
from anfir.ir.nodes import CNode
from anfir.ir.primitive import Primitive
from anfir.abstract.values import ATensor
from anfir.primitives import shaping
from anfir.primitives.shaping import flatten_range

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

"""What the ONNX import rules share: the set of rules a family module fills, and
the helpers more than one family uses (reading static attributes and shapes,
building a call with its attributes by name).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from anfir.interop import attributes
from anfir.interop.onnx.common import Ctx, NeedsValue, NodeError, OpRule
from anfir.ir.nodes import Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.primitives import arith, indexing, structure, tensor

class RuleSet:
    """One family's rules: ``(domain, op_type)`` -> ``[(since_version, rule)]``, oldest
    first, filled by :meth:`op` while the family's module runs."""

    def __init__(self) -> None:
        self.rules: dict[tuple[str, str], list[tuple[int, OpRule]]] = {}

    def op(self, op_type: str, since: int = 1, domain: str = "") -> Callable[[OpRule], OpRule]:
        """Register a rule for ``op_type`` from opset ``since`` on."""
        def register(rule: OpRule) -> OpRule:
            entries = self.rules.setdefault((domain, op_type), [])
            entries.append((since, rule))
            entries.sort(key=lambda pair: pair[0])
            return rule
        return register


def unary(prim: Primitive) -> OpRule:
    """The rule of an op that is ``prim`` of its one input."""
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        return [ctx.call(prim, ctx.need(0))]
    return rule


def binary(prim: Primitive) -> OpRule:
    """The rule of an op that is ``prim`` of its two inputs."""
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        return [ctx.call(prim, ctx.need(0), ctx.need(1))]
    return rule


def computed_shape(ctx: Ctx, index: int) -> Optional[Node]:
    """A shape computed at run time (input ``index``, a 1-D i64 tensor of known length)
    as a tuple of numbers, which anfir's shape arguments take; None when the input is
    a constant or its length is unknown."""
    node = ctx.input(index)
    if node is None or isinstance(node, ValueNode):
        return None
    length = ctx.type_of(index).static_shape
    if length is None or len(length) != 1:
        return None
    items = [scalar_of(ctx, ctx.call(indexing.gather, node, ctx.const(k, "i64"), axis=0))
             for k in range(length[0])]
    return ctx.call(structure.make_tuple, *items)


def int_tuple(value: Any) -> tuple[int, ...]:
    """An ints attribute or constant input (any shape) as a tuple of ints."""
    return tuple(int(v) for v in np.asarray(value).reshape(-1))


def static_input_shape(ctx: Ctx, index: int) -> tuple[int, ...]:
    """The static shape of input ``index``; a NodeError when it is not static."""
    node = ctx.input(index)
    if isinstance(node, ValueNode) and isinstance(node.value, np.ndarray):
        return tuple(node.value.shape)
    shape = ctx.type_of(index).static_shape
    if shape is None:
        raise NodeError(f"the shape of input {index} is not static")
    return shape


def static_dim(ctx: Ctx, index: int, axis: int) -> int:
    """The static length of one axis of input ``index`` (the others may be symbolic)."""
    node = ctx.input(index)
    if isinstance(node, ValueNode) and isinstance(node.value, np.ndarray):
        return int(node.value.shape[axis])
    dims = ctx.type_of(index).dims
    if dims is None:
        raise NodeError(f"the rank of input {index} is unknown")
    found = dims[axis]
    if not isinstance(found, int):
        raise NodeError(f"axis {axis % len(dims)} of input {index} has no static length")
    return found


def known_dims(ctx: Ctx, index: int) -> tuple[Optional[int], ...]:
    """Each axis's static length, None where symbolic (the rank must be known)."""
    node = ctx.input(index)
    if isinstance(node, ValueNode) and isinstance(node.value, np.ndarray):
        return tuple(int(d) for d in node.value.shape)
    dims = ctx.type_of(index).dims
    if dims is None:
        raise NodeError(f"the rank of input {index} is unknown")
    return tuple(d if isinstance(d, int) else None for d in dims)


def static_dims(ctx: Ctx, index: int, axes: Sequence[int]) -> tuple[int, ...]:
    """The static lengths of some axes of input ``index``."""
    return tuple(static_dim(ctx, index, a) for a in axes)


def need_entry_input(ctx: Ctx, indices: int | tuple[int, ...], what: str) -> None:
    """A NeedsValue when inputs ``indices`` are (computed from) graph inputs only
    (those that are not constants already): the Backend then imports the model again
    with their values bound."""
    names: list[str] = []
    for index in (indices,) if isinstance(indices, int) else indices:
        node = ctx.input(index)
        if node is None or isinstance(node, ValueNode):
            continue
        found = ctx.importer.entry_inputs_of(node)
        if not found:
            return
        names.extend(n for n in found if n not in names)
    if names:
        raise NeedsValue(f"{what} must be known when importing", names[0], names)


def call_named(ctx: Ctx, prim: Primitive, inputs: Sequence[Node], named: dict[str, Any]) -> Node:
    """``prim(*inputs, ...)`` where each ``named`` value goes as an attribute when the
    primitive declares one of that name, else as the next positional argument (the
    operator library decides which of its parameters are static).  A convolution's or
    pool's window attributes are written in their one short form (every rule gives
    ``stride`` as its n per-axis values, n the spatial rank)."""
    if prim in attributes.WINDOWED and isinstance(named.get("stride"), tuple):
        try:
            named = attributes.window(named, len(named["stride"]))
        except ValueError as e:
            raise NodeError(f"{prim.name}: {e}") from None
    args: list[Any] = list(inputs)
    attrs: dict[str, Any] = {}
    for key, value in named.items():
        if key in prim.attrs:
            if value is not None:
                attrs[key] = value
        else:
            args.append(value)
    while args and args[-1] is None and len(args) > prim.min_args:
        args.pop()
    return ctx.call(prim, *args, **attrs)


def scalar_of(ctx: Ctx, node: Node) -> Node:
    """A one-element tensor as a number (anfir's arange takes numbers): its sum."""
    return ctx.call(tensor.sum_, node)


def along_axis(ctx: Ctx, values: np.ndarray, rank: int, axis: int) -> ValueNode:
    """A constant 1-D ``values`` laid along ``axis`` of a rank-``rank`` tensor (for broadcasting)."""
    return ctx.const(values.reshape([-1 if i == axis else 1 for i in range(rank)]))


def minus_zero_point(ctx: Ctx, value: int, zero: int) -> Node:
    """Input ``value`` as i32, less the zero point input ``zero`` when given."""
    out = ctx.call(tensor.cast, ctx.need(value), "i32")
    point = ctx.input(zero) if zero < len(ctx.node.input) else None
    if point is not None:
        out = ctx.call(arith.sub, out, ctx.call(tensor.cast, point, "i32"))
    return out

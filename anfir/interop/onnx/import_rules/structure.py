"""The ONNX import rules whose result is built from
:mod:`anfir.primitives.structure`: Identity, the sequence and optional ops.

See :mod:`anfir.interop.onnx.import_rules` for how a rule is chosen.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from anfir.interop.onnx.common import Ctx, NodeError
from anfir.interop.onnx.import_rules.common import (RuleSet, call_named, int_tuple, need_entry_input,
                                                    static_dim, unary)
from anfir.ir.nodes import Node, ValueNode
from anfir.primitives import shaping, structure, tensor

RULES = RuleSet()
"""This family's rules (merged into :data:`anfir.interop.onnx.import_rules.OPS`)."""
op = RULES.op


op("Identity")(unary(structure.identity))


@op("SequenceConstruct")
def _sequence_construct(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(structure.make_tuple, *[a for a in ctx.inputs() if a is not None])]


@op("SequenceEmpty")
def _sequence_empty(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(structure.make_tuple)]


def _items(ctx: Ctx, index: int) -> Optional[list[Node]]:
    """The items of a sequence built in this graph (a tuple node or constant), or None."""
    node = ctx.need(index)
    if isinstance(node, ValueNode) and isinstance(node.value, tuple):
        return [ValueNode(v) for v in node.value]
    inputs = getattr(node, "inputs", None)
    if inputs and isinstance(inputs[0], ValueNode) and inputs[0].value is structure.make_tuple:
        return list(inputs[1:])
    return None


@op("SequenceInsert", 11)
def _sequence_insert(ctx: Ctx) -> Sequence[Optional[Node]]:
    items = _items(ctx, 0)
    if items is None:
        need_entry_input(ctx, 0, "the sequence (its length)")
        raise NodeError("SequenceInsert into a sequence of a length unknown when importing")
    raw = ctx.static(2, "the position")
    at = len(items) if raw is None else int(raw.reshape(-1)[0]) % (len(items) + 1)
    return [ctx.call(structure.make_tuple, *items[:at], ctx.need(1), *items[at:])]


@op("SequenceLength")
def _sequence_length(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(tensor.array, ctx.call(structure.len_, ctx.need(0)))]


@op("SequenceAt")
def _sequence_at(ctx: Ctx) -> Sequence[Optional[Node]]:
    raw = ctx.static(1, "the position")
    assert raw is not None
    return [ctx.call(structure.tuple_getitem, ctx.need(0), int(raw.reshape(-1)[0]))]


@op("Optional")
def _optional(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.input(0)
    return [ValueNode(None) if x is None else x]


@op("OptionalHasElement")
def _optional_has_element(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.input(0)
    present = x is not None and not (isinstance(x, ValueNode) and x.value is None)
    return [ctx.const(np.array(present))]


@op("OptionalGetElement")
def _optional_get_element(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    if isinstance(x, ValueNode) and x.value is None:
        raise NodeError("the optional is empty")
    return [x]


@op("SplitToSequence", 11)
def _split_to_sequence(ctx: Ctx) -> Sequence[Optional[Node]]:
    # A tuple of the pieces: by the given sizes, or (none given) pieces of 1, each
    # squeezed unless keepdims.
    rank = ctx.rank(0)
    axis = int(ctx.attr("axis", 0)) % rank
    raw = ctx.static(1, "the sizes")
    length = static_dim(ctx, 0, axis)
    if raw is None:
        sizes: tuple[int, ...] = (1,) * length
    elif raw.ndim == 0:
        piece = int(raw)
        sizes = tuple(min(piece, length - k) for k in range(0, length, piece))
    else:
        sizes = int_tuple(raw)
    parts = call_named(ctx, shaping.split, [ctx.need(0)], {"sizes": sizes, "axis": axis})
    items = [ctx.call(structure.tuple_getitem, parts, k) for k in range(len(sizes))]
    if raw is None and not ctx.attr("keepdims", 1):
        items = [ctx.call(shaping.squeeze, item, axis=axis) for item in items]
    return [ctx.call(structure.make_tuple, *items)]

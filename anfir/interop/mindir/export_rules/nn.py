"""MindIR export rules of :mod:`anfir.primitives.nn`."""

from __future__ import annotations

from typing import TYPE_CHECKING


from anfir.interop.mindir.export_rules.common import Rule, registrar
from anfir.ir.nodes import CNode
from anfir.ir.primitive import Primitive
from anfir.primitives import nn

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.mindir.writer import Writer

RULES: dict[Primitive, Rule] = {}
"""This family's primitives -> how each is written as MindSpore ops."""
UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives MindIR cannot hold, with the reason."""
rule_of = registrar(RULES)


@rule_of(nn.softmax, nn.log_softmax)
def _softmax(w: Writer, node: CNode) -> str:
    axis = int(node.attrs.get("axis", -1)) if node.attrs else -1
    op = "Softmax" if node.is_apply(nn.softmax) else "LogSoftmax"
    # the axis is an input: a tuple of one for Softmax, an int for LogSoftmax
    where = w.constant((axis,) if op == "Softmax" else axis, scalar=True)
    return w.emit(op, [w.ref(node.args[0]), where], abstract=node.abstract)

"""MindIR export rules of :mod:`anfir.primitives.shaping`."""

from __future__ import annotations

from typing import TYPE_CHECKING


from anfir.interop.mindir.export_rules.common import Rule, Unsupported, registrar
from anfir.ir.nodes import CNode
from anfir.ir.primitive import Primitive
from anfir.abstract.values import ATensor
from anfir.primitives import shaping

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
    if not isinstance(out, ATensor) or out.shape is None or not all(isinstance(d, int) for d in out.shape):
        raise Unsupported(f"{node.callee.value.name} needs a static result shape")  # type: ignore[attr-defined]
    return w.emit("Reshape", [w.ref(node.args[0]), w.constant(tuple(int(d) for d in out.shape), scalar=True)],
                  abstract=out)

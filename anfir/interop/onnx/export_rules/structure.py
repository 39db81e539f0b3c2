"""The ONNX export rules of the operators of :mod:`anfir.primitives.structure` (``switch``, ``zeros_like``).

See :mod:`anfir.interop.onnx.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anfir.flat.statements import Op, Operand, Value
from anfir.interop.onnx.export_rules.common import OnnxRule, filled_like, with_dtype
from anfir.ir.primitive import Primitive
from anfir.primitives import structure

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.onnx.exporter import OnnxWriter


def _select(w: OnnxWriter, op: Op) -> None:
    """``switch`` between two computed values: ``Where`` when both have the result's
    type (and neither may be a placeholder), else an ``If`` (shapes may differ)."""
    out = op.results[0]
    d = w.dtype(out)
    c, a, b = op.args
    ta, tb = w.type_of(a), w.type_of(b)
    eager = ta == tb and not any(isinstance(x, Value) and x.maybe_undefined for x in (a, b))
    if eager:
        w.node("Where", [w.tensor(c, "bool"), w.tensor(a, d), w.tensor(b, d)], [out.name])
        return
    branches = []
    for operand, t in ((a, ta), (b, tb)):
        def build(operand: Operand = operand) -> list[str]:
            return [w.tensor(operand, d)]

        branches.append(w.subgraph(build, [with_dtype(t, d)], "select"))
    w.node("If", [w.tensor(c, "bool")], [out.name], then_branch=branches[0],
           else_branch=branches[1])


RULES: dict[Primitive, OnnxRule] = {
    structure.switch: _select,
    structure.zeros_like: filled_like(0),
}
"""This family's primitive object → the rule writing its ONNX nodes (merged into
:data:`anfir.interop.onnx.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported, with the reason."""

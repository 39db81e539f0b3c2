"""The ONNX export rules of the neural-network operators of :mod:`anfir.primitives.nn` (softmax,
log_softmax, einsum).

See :mod:`anfir.interop.onnx.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anfir.errors import ExportError
from anfir.flat.statements import Op
from anfir.interop.onnx.export_rules.common import OnnxRule, rank_of
from anfir.ir.primitive import Primitive
from anfir.primitives import nn

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.onnx.exporter import OnnxWriter


def _softmax(op_type: str) -> OnnxRule:
    """ONNX Softmax / LogSoftmax along the axis attribute."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        x = w.tensor(op.args[0], w.dtype(out))
        if not rank_of(w, op.args[0], op_type):
            raise ExportError(f"{op_type} of a 0-d tensor", w.loc)
        w.node(op_type, [x], [out.name], axis=int(op.attrs.get("axis", -1)))
    rule.__doc__ = f"ONNX {op_type}"
    return rule


def _einsum(w: OnnxWriter, op: Op) -> None:
    """ONNX Einsum with the constant spec."""
    out = op.results[0]
    d = w.dtype(out)
    spec = w.static(op.args[0])
    w.node("Einsum", [w.tensor(a, d) for a in op.args[1:]], [out.name],
           equation=str(spec).replace(" ", ""))


def _einsum_ones(w: OnnxWriter, op: Op) -> None:
    """Ones of x's shape, or a 0-d one, as the gradient spec needs."""
    out = op.results[0]
    d = w.dtype(out)
    grad = nn.einsum_grad_spec.impl(w.static(op.args[0]), int(w.static(op.args[1])))
    if grad.split("->")[0].split(",")[-1]:
        w.node("ConstantOfShape", [w.op("Shape", w.tensor(op.args[2]))], [out.name],
               value=w.fill_value(1, d))
    else:
        w.node("Identity", [w.const(1, d)], [out.name])


RULES: dict[Primitive, OnnxRule] = {
    nn.softmax: _softmax("Softmax"),
    nn.log_softmax: _softmax("LogSoftmax"),
    nn.einsum: _einsum,
    nn.einsum_ones: _einsum_ones,
}
"""This family's primitive object → the rule writing its ONNX nodes (merged into
:data:`anfir.interop.onnx.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {
    nn.einsum_grad_spec: "it computes a string from constants, which constant folding does "
                         "before export; ONNX has no string-valued equation input",
}
"""This family's primitives that cannot be exported, with the reason."""

"""The ONNX export rules of the arithmetic, comparison and logic operators of :mod:`anfir.primitives.arith`.

See :mod:`anfir.interop.onnx.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anfir.dtypes import is_float
from anfir.flat.statements import Op
from anfir.interop.onnx.export_rules.common import OnnxRule, binary, compare, logical, unary
from anfir.ir.primitive import Primitive
from anfir.primitives import arith

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.onnx.exporter import OnnxWriter


def _relu(w: OnnxWriter, op: Op) -> None:
    """``Relu``, or ``Max(x, 0)`` for integers (onnxruntime has no integer Relu)."""
    out = op.results[0]
    d = w.dtype(out)
    x = w.tensor(op.args[0], d)
    if is_float(d):
        w.node("Relu", [x], [out.name])
    else:
        w.node("Max", [x, w.const(0, d)], [out.name])


RULES: dict[Primitive, OnnxRule] = {
    arith.add: binary("Add"),
    arith.sub: binary("Sub"),
    arith.mul: binary("Mul"),
    arith.div: binary("Div"),
    arith.neg: unary("Neg"),
    arith.pow_: binary("Pow"),
    arith.exp: unary("Exp"),
    arith.log: unary("Log"),
    arith.sin: unary("Sin"),
    arith.cos: unary("Cos"),
    arith.tanh: unary("Tanh"),
    arith.sqrt: unary("Sqrt"),
    arith.abs_: unary("Abs"),
    arith.sign: unary("Sign"),
    arith.maximum: binary("Max"),
    arith.minimum: binary("Min"),
    arith.sigmoid: unary("Sigmoid"),
    arith.relu: _relu,
    arith.lt: compare("Less"),
    arith.le: compare("LessOrEqual"),
    arith.gt: compare("Greater"),
    arith.ge: compare("GreaterOrEqual"),
    arith.eq: compare("Equal"),
    arith.ne: compare("Equal", negate=True),
    arith.logical_and: logical("And"),
    arith.logical_or: logical("Or"),
    arith.logical_not: logical("Not"),
}
"""This family's primitive object → the rule writing its ONNX nodes (merged into
:data:`anfir.interop.onnx.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported, with the reason."""

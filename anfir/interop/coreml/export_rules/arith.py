"""The Core ML (MIL) export rules of the arithmetic, comparison and logic operators of
:mod:`anfir.primitives.arith`.

See :mod:`anfir.interop.coreml.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anfir.dtypes import is_bool, is_float
from anfir.flat.statements import Op
from anfir.interop.coreml.export_rules.common import MilRule, binary, compare, composite, logical, unary
from anfir.ir.primitive import Primitive
from anfir.primitives import arith

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.coreml.exporter import MilWriter


def _sign(w: MilWriter, op: Op) -> None:
    """MIL sign (bools: themselves)."""
    out = op.results[0]
    d = w.dtype(out)
    if is_bool(d):
        w.bind(out, w.tensor(op.args[0], d))
        return
    w.bind(out, w.op("sign", out, x=w.tensor(op.args[0], d)))


def _relu(w: MilWriter, op: Op) -> None:
    """MIL relu, or ``maximum(x, 0)`` for integers (relu is float-only)."""
    out = op.results[0]
    d = w.dtype(out)
    x = w.tensor(op.args[0], d)
    if is_float(d):
        w.bind(out, w.op("relu", out, x=x))
    else:
        w.bind(out, w.op("maximum", out, x=x, y=w.const(0, d)))


RULES: dict[Primitive, MilRule] = {
    arith.add: binary("add"),
    arith.sub: binary("sub"),
    arith.mul: binary("mul"),
    arith.div: binary("real_div"),
    arith.neg: composite(lambda w, x, d: w.op("mul", x=x, y=w.const(-1, d)), "x * -1"),
    arith.pow_: binary("pow"),
    arith.exp: unary("exp"),
    arith.log: unary("log"),
    arith.sin: unary("sin"),
    arith.cos: unary("cos"),
    arith.tanh: unary("tanh"),
    arith.sqrt: unary("sqrt"),
    arith.abs_: unary("abs"),
    arith.sign: _sign,
    arith.maximum: binary("maximum"),
    arith.minimum: binary("minimum"),
    arith.sigmoid: unary("sigmoid"),
    arith.relu: _relu,
    arith.softplus: unary("softplus"),
    arith.lt: compare("less"),
    arith.le: compare("less_equal"),
    arith.gt: compare("greater"),
    arith.ge: compare("greater_equal"),
    arith.eq: compare("equal"),
    arith.ne: compare("not_equal"),
    arith.logical_and: logical("logical_and"),
    arith.logical_or: logical("logical_or"),
    arith.logical_not: logical("logical_not"),
}
"""This family's primitive object → the rule writing its MIL ops (merged into
:data:`anfir.interop.coreml.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported to MIL, with the reason."""

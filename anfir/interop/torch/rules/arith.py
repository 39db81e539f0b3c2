"""The torch.export rules whose result is built from
arithmetic and comparisons (:mod:`anfir.primitives.arith`): the unary and binary
math ops, add/sub with ``alpha``, division's rounding modes, logarithms in other bases,
the inverse hyperbolics, and SymInt arithmetic (``operator.add`` ...) on sizes.

See :mod:`anfir.interop.torch.rules.common` for the rule protocol.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Optional

from anfir.interop.torch.rules.common import Rule, RuleTable, binary, cast_const, unary
from anfir.ir.primitive import Primitive
from anfir.primitives import arith, elementwise, tensor


def _add(prim: Primitive) -> Rule:
    mul = arith.mul

    def rule(b: Any, x: Any, y: Any, alpha: Any = 1) -> Any:
        return b.call(prim, x, y if alpha == 1 else b.call(mul, y, alpha))
    return rule


def _div_mode(b: Any, x: Any, y: Any, *, rounding_mode: Optional[str] = None) -> Any:
    if rounding_mode is None:
        return b.call(arith.div, x, y)
    if rounding_mode == "floor":
        return b.call(elementwise.floor_div, x, y)
    q = b.call(arith.div, x, y)  # trunc: toward zero
    t = b.call(tensor.where, b.call(arith.lt, q, 0), b.call(elementwise.ceil, q), b.call(elementwise.floor, q))
    return b.call(tensor.cast, t, b.out_dtype())


# -- elementwise -----------------------------------------------------------------------------
def _log_base(base: float) -> Rule:
    def rule(b: Any, x: Any) -> Any:
        return b.call(arith.div, b.call(arith.log, x), cast_const(b, math.log(base), b.out_dtype()))
    return rule


def _asinh(b: Any, x: Any) -> Any:
    """log(x + sqrt(x² + 1)), mirrored for x < 0 (no cancellation); derivative 1/sqrt(x²+1),
    1 at 0 (both branches' formula, not a kink)."""
    def side(v: Any) -> Any:
        return b.call(arith.log, b.call(arith.add, v, b.call(
            arith.sqrt, b.call(arith.add, b.call(arith.mul, v, v), 1.0))))
    neg = b.call(arith.neg, side(b.call(arith.neg, x)))
    return b.call(tensor.where, b.call(arith.lt, x, 0.0), neg, side(x))


def _acosh(b: Any, x: Any) -> Any:
    root = b.call(arith.sqrt, b.call(arith.mul, b.call(arith.sub, x, 1.0),
                                        b.call(arith.add, x, 1.0)))
    return b.call(arith.log, b.call(arith.add, x, root))


def _atanh(b: Any, x: Any) -> Any:
    """0.5 * log1p(2x / (1 - x))."""
    ratio = b.call(arith.div, b.call(arith.mul, x, 2.0), b.call(arith.sub, 1.0, x))
    return b.call(arith.mul, b.call(elementwise.log1p, ratio), 0.5)


def rules(torch: Any, table: RuleTable) -> None:
    """Add this family's rules to ``table``."""
    aten = torch.ops.aten
    put, named = table.put, table.named
    for name, prim in (("abs", arith.abs_), ("neg", arith.neg), ("exp", arith.exp), ("log", arith.log),
                       ("sin", arith.sin), ("cos", arith.cos), ("tanh", arith.tanh), ("sqrt", arith.sqrt),
                       ("sigmoid", arith.sigmoid), ("relu", arith.relu), ("sign", arith.sign),
                       ("logical_not", arith.logical_not)):
        named(name, "default", unary(prim))
    for op, prim in ((aten.maximum.default, arith.maximum), (aten.minimum.default, arith.minimum),
                     (aten.mul.Tensor, arith.mul), (aten.mul.Scalar, arith.mul),
                     (aten.div.Tensor, arith.div), (aten.div.Scalar, arith.div),
                     (aten.pow.Tensor_Tensor, arith.pow_), (aten.pow.Tensor_Scalar, arith.pow_),
                     (aten.pow.Scalar, arith.pow_), (aten.logical_and.default, arith.logical_and),
                     (aten.logical_or.default, arith.logical_or)):
        put(op, binary(prim))
    for cmp, prim in (("eq", arith.eq), ("ne", arith.ne), ("lt", arith.lt), ("le", arith.le),
                      ("gt", arith.gt), ("ge", arith.ge)):
        put(getattr(aten, cmp).Tensor, binary(prim))
        put(getattr(aten, cmp).Scalar, binary(prim))
    put(aten.add.Tensor, _add(arith.add))
    put(aten.add.Scalar, _add(arith.add))
    put(aten.sub.Tensor, _add(arith.sub))
    put(aten.sub.Scalar, _add(arith.sub))
    put(aten.rsub.Scalar, lambda b, x, y, alpha=1: _add(arith.sub)(b, y, x, alpha))
    put(aten.div.Tensor_mode, _div_mode)
    for py_op, prim in ((operator.add, arith.add), (operator.sub, arith.sub), (operator.mul, arith.mul),
                        (operator.truediv, arith.div), (operator.eq, arith.eq), (operator.ne, arith.ne),
                        (operator.lt, arith.lt), (operator.le, arith.le), (operator.gt, arith.gt),
                        (operator.ge, arith.ge)):
        put(py_op, binary(prim))
    named("min", "other", lambda b, x, y: b.call(arith.minimum, x, y))
    named("max", "other", lambda b, x, y: b.call(arith.maximum, x, y))
    named("log2", "default", _log_base(2.0))
    named("log10", "default", _log_base(10.0))
    named("asinh", "default", _asinh)
    named("acosh", "default", _acosh)
    named("atanh", "default", _atanh)
    named("div", "Scalar_mode", _div_mode)

"""The Core ML (MIL) export rules of the operators of :mod:`anfir.primitives.elementwise` (and the
reasons MIL has no bitwise operations).

See :mod:`anfir.interop.coreml.export_rules` for how the table is assembled.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from anfir.dtypes import is_float
from anfir.flat.statements import Op
from anfir.interop.coreml.export_rules.common import MilRule, composite, logical, unary
from anfir.ir.primitive import Primitive
from anfir.primitives import elementwise

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.coreml.exporter import MilWriter


def _log1p(w: MilWriter, x: Any, d: str) -> Any:
    """log(1 + x), exact near 0 (Goldberg: ``log(u) * x / (u - 1)``, ``u = 1 + x``)."""
    u = w.op("add", x=x, y=w.const(1, d))
    um1 = w.op("sub", x=u, y=w.const(1, d))
    ratio = w.op("real_div", x=w.op("mul", x=w.op("log", x=u), y=x), y=um1)
    exact = w.op("equal", x=um1, y=w.const(0, d))
    small = w.op("select", cond=exact, a=x, b=ratio)
    return w.op("select", cond=w.op("equal", x=x, y=w.const(math.inf, d)), a=x, b=small)


def _expm1(w: MilWriter, x: Any, d: str) -> Any:
    """exp(x) - 1, exact near 0 (Kahan: ``(u - 1) * x / log(u)``, ``u = exp(x)``)."""
    u = w.op("exp", x=x)
    um1 = w.op("sub", x=u, y=w.const(1, d))
    ratio = w.op("real_div", x=w.op("mul", x=um1, y=x), y=w.op("log", x=u))
    # u == 1: x itself; u == inf or u - 1 == -1: u - 1 (the ratio is nan there).
    big = w.op("logical_or", x=w.op("equal", x=u, y=w.const(math.inf, d)),
               y=w.op("equal", x=um1, y=w.const(-1, d)))
    general = w.op("select", cond=big, a=um1, b=ratio)
    return w.op("select", cond=w.op("equal", x=u, y=w.const(1, d)), a=x, b=general)


def _gelu(w: MilWriter, op: Op) -> None:
    """MIL gelu, EXACT or TANH_APPROXIMATION as the approximate attribute says."""
    out = op.results[0]
    mode = "TANH_APPROXIMATION" if op.attrs.get("approximate") == "tanh" else "EXACT"
    w.bind(out, w.op("gelu", out, x=w.tensor(op.args[0], w.dtype(out)), mode=mode))


def _with_alpha(kind: str, default: float) -> MilRule:
    """``kind(x, alpha)`` with the alpha attribute."""
    def rule(w: MilWriter, op: Op) -> None:
        out = op.results[0]
        d = w.dtype(out)
        alpha = float(op.attrs.get("alpha", default))
        w.bind(out, w.op(kind, out, x=w.tensor(op.args[0], d), alpha=np.float32(alpha)))
    rule.__doc__ = f"MIL {kind} with the alpha attribute"
    return rule


def _hard_sigmoid(w: MilWriter, op: Op) -> None:
    """MIL sigmoid_hard (min(max(alpha x + beta, 0), 1))."""
    out = op.results[0]
    w.bind(out, w.op("sigmoid_hard", out, x=w.tensor(op.args[0], w.dtype(out)),
                     alpha=np.float32(op.attrs.get("alpha", 0.2)),
                     beta=np.float32(op.attrs.get("beta", 0.5))))


def _int_safe(w: MilWriter, y: Any, d: str) -> tuple[Any, Any]:
    """(y == 0, y with its zeros made 1): integer division by 0 is 0 in numpy."""
    zero = w.op("equal", x=y, y=w.const(0, d))
    return zero, w.op("select", cond=zero, a=w.const(1, d), b=y)


def _quotient(kind: str, integers: Callable[[MilWriter, Any, Any], Any],
              floats: Callable[[MilWriter, Any, Any], Any]) -> MilRule:
    """numpy's ``kind`` of both operands in the result's dtype: floats by ``floats(w, x, y)``,
    integers by ``integers(w, x, y)`` where y is not 0 (numpy gives 0 there)."""
    def rule(w: MilWriter, op: Op) -> None:
        out = op.results[0]
        d = w.dtype(out)
        x, y = w.tensor(op.args[0], d), w.tensor(op.args[1], d)
        if not is_float(d):
            zero, safe = _int_safe(w, y, d)
            return w.bind(out, w.op("select", out, cond=zero, a=w.const(0, d), b=integers(w, x, safe)))
        w.bind(out, floats(w, x, y))
    rule.__doc__ = f"numpy {kind} (by 0: 0 for integers, as floats compute it for floats)"
    return rule


def _minus_multiple(w: MilWriter, x: Any, q: Any, y: Any) -> Any:
    """``x - q * y``: the remainder of a quotient ``q``."""
    return w.op("sub", x=x, y=w.op("mul", x=q, y=y))


def _floor_of_ratio(w: MilWriter, x: Any, y: Any) -> Any:
    """floor(x / y) of floats."""
    return w.op("floor", x=w.op("real_div", x=x, y=y))


def _c_remainder(w: MilWriter, x: Any, y: Any) -> Any:
    """C fmod of integers (y not 0): |x| mod |y| with the sign of x (floor_div of
    non-negatives truncates)."""
    ax, ay = w.op("abs", x=x), w.op("abs", x=y)
    return w.op("mul", x=_minus_multiple(w, ax, w.op("floor_div", x=ax, y=ay), ay),
                y=w.op("sign", x=x))


def _c_remainder_floats(w: MilWriter, x: Any, y: Any) -> Any:
    """C fmod of floats: ``x - trunc(x / y) * y``, trunc = sign * floor(|.|)."""
    q = w.op("real_div", x=x, y=y)
    return _minus_multiple(w, x, w.op("mul", x=w.op("sign", x=q), y=w.op("floor", x=w.op("abs", x=q))), y)


_floor_div = _quotient("floor_divide", lambda w, x, y: w.op("floor_div", x=x, y=y), _floor_of_ratio)


_mod = _quotient("mod (the sign of y)",
                 lambda w, x, y: _minus_multiple(w, x, w.op("floor_div", x=x, y=y), y),
                 lambda w, x, y: _minus_multiple(w, x, _floor_of_ratio(w, x, y), y))


_fmod = _quotient("fmod (C's: the sign of x)", _c_remainder, _c_remainder_floats)


def _isnan(w: MilWriter, op: Op) -> None:
    """x != x (integers are never nan)."""
    out = op.results[0]
    x = w.tensor(op.args[0])
    w.bind(out, w.op("not_equal", out, x=x, y=x))


def _isinf(w: MilWriter, op: Op) -> None:
    """|x| == inf (integers are never infinite)."""
    out = op.results[0]
    d = w.dtype_of_operand(op.args[0])
    x = w.tensor(op.args[0])
    if not is_float(d):
        w.bind(out, w.op("not_equal", out, x=x, y=x))
        return
    w.bind(out, w.op("equal", out, x=w.op("abs", x=x), y=w.const(math.inf, mil_to_anfir(x))))


def mil_to_anfir(var: Any) -> str:
    """The anfir dtype a MIL var's dtype stands for (fp32 → f32...)."""
    from coremltools.converters.mil.mil import types

    return {"fp16": "f16", "fp32": "f32", "int32": "i32", "bool": "bool"}[
        types.builtin_to_string(var.dtype)]


RULES: dict[Primitive, MilRule] = {
    elementwise.erf: unary("erf"),
    elementwise.expm1: composite(_expm1, "Kahan's expm1"),
    elementwise.log1p: composite(_log1p, "Goldberg's log1p"),
    elementwise.floor: unary("floor"),
    elementwise.ceil: unary("ceil"),
    elementwise.round_: unary("round"),
    elementwise.reciprocal: composite(lambda w, x, d: w.op("real_div", x=w.const(1, d), y=x),
                                      "1 / x"),
    elementwise.rsqrt: composite(lambda w, x, d: w.op("real_div", x=w.const(1, d),
                                                      y=w.op("sqrt", x=x)), "1 / sqrt(x)"),
    elementwise.square: composite(lambda w, x, d: w.op("mul", x=x, y=x), "x * x"),
    elementwise.tan: unary("tan"),
    elementwise.atan: unary("atan"),
    elementwise.sinh: unary("sinh"),
    elementwise.cosh: unary("cosh"),
    elementwise.asin: unary("asin"),
    elementwise.acos: unary("acos"),
    elementwise.softsign: unary("softsign"),
    elementwise.silu: unary("silu"),
    elementwise.gelu: _gelu,
    elementwise.leaky_relu: _with_alpha("leaky_relu", 0.01),
    elementwise.elu: _with_alpha("elu", 1.0),
    elementwise.hard_sigmoid: _hard_sigmoid,
    elementwise.floor_div: _floor_div,
    elementwise.mod: _mod,
    elementwise.fmod: _fmod,
    elementwise.isnan: _isnan,
    elementwise.isinf: _isinf,
    elementwise.logical_xor: logical("logical_xor"),
}
"""This family's primitive object → the rule writing its MIL ops (merged into
:data:`anfir.interop.coreml.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {
    elementwise.bitwise_and: "MIL has no bitwise operations",
    elementwise.bitwise_or: "MIL has no bitwise operations",
    elementwise.bitwise_xor: "MIL has no bitwise operations",
    elementwise.bitwise_not: "MIL has no bitwise operations",
    elementwise.bit_shift: "MIL has no bit shifts",
}
"""This family's primitives that cannot be exported to MIL, with the reason."""

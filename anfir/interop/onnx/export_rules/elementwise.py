"""The ONNX export rules of the operators of :mod:`anfir.primitives.elementwise` (with erf and atan written as
Cephes' rational approximations where onnxruntime has no f64 kernel).

See :mod:`anfir.interop.onnx.export_rules` for how the table is assembled.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable, Sequence

from anfir.dtypes import is_float
from anfir.flat.statements import Op
from anfir.interop.onnx.onnx_types import ONNX_TYPES
from anfir.interop.onnx.export_rules.common import OnnxRule, logical, unary
from anfir.ir.primitive import Primitive
from anfir.primitives import elementwise

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.onnx.exporter import OnnxWriter


# -- erf and atan where onnxruntime has no f64 kernel (Cephes' rational approximations) -----------
_ERF_T = (9.60497373987051638749E0, 9.00260197203842689217E1, 2.23200534594684319226E3,
          7.00332514112805075473E3, 5.55923013010394962768E4)


_ERF_U = (3.35617141647503099647E1, 5.21357949780152679795E2, 4.59432382970980127987E3,
          2.26290000613890934246E4, 4.92673942608635921086E4)


_ERFC_P = (2.46196981473530512524E-10, 5.64189564831068821977E-1, 7.46321056442269912687E0,
           4.86371970985681366614E1, 1.96520832956077098242E2, 5.26445194995477358631E2,
           9.34528527171957607540E2, 1.02755188689515710272E3, 5.57535335369399327526E2)


_ERFC_Q = (1.32281951154744992508E1, 8.67072140885989742329E1, 3.54937778887819891062E2,
           9.75708501743205489753E2, 1.82390916687909736289E3, 2.24633760818710981792E3,
           1.65666309194161350182E3, 5.57535340817727675546E2)


_ERFC_R = (5.64189583547755073984E-1, 1.27536670759978104416E0, 5.01905042251180477414E0,
           6.16021097993053585195E0, 7.40974269950448939160E0, 2.97886665372100240670E0)


_ERFC_S = (2.26052863220117276590E0, 9.39603524938001434673E0, 1.20489539808096656605E1,
           1.70814450747565897222E1, 9.60896809063285878198E0, 3.36907645100081516050E0)


_ATAN_P = (-8.750608600031904122785E-1, -1.615753718733365076637E1, -7.500855792314704667340E1,
           -1.228866684490136173410E2, -6.485021904942025371773E1)


_ATAN_Q = (2.485846490142306297962E1, 1.650270098316988542046E2, 4.328810604912902668951E2,
           4.853903996359136964868E2, 1.945506571482613964425E2)


_ATAN_MOREBITS = 6.123233995736765886130E-17


_NATIVE_F64 = False
"""Whether to write Erf/Atan/Asin/Acos natively for f64 too (onnxruntime has no f64 kernel
for them, so f64 uses the rational approximations below, accurate to about 1 ulp)."""


def _polynomial(w: OnnxWriter, x: str, coefficients: Sequence[float], d: str, monic: bool) -> str:
    """Horner's rule; ``monic``: a leading coefficient 1 not listed (Cephes' p1evl)."""
    result = w.op("Add", x, w.const(coefficients[0], d)) if monic else w.const(coefficients[0], d)
    for c in coefficients[1:]:
        result = w.op("Add", w.op("Mul", result, x), w.const(c, d))
    return result


def _erf_of(w: OnnxWriter, x: str, d: str) -> str:
    """erf(x): ONNX Erf, or for f64 Cephes' erf (|x| <= 1) and 1 - erfc (beyond)."""
    if d != "f64" or _NATIVE_F64:
        return w.op("Erf", x)
    z = w.op("Mul", x, x)
    small = w.op("Div", w.op("Mul", x, _polynomial(w, z, _ERF_T, d, False)),
                 _polynomial(w, z, _ERF_U, d, True))
    a = w.op("Min", w.op("Abs", x), w.const(27.0, d))  # erfc(27) underflows: no inf * 0
    e = w.op("Exp", w.op("Neg", w.op("Mul", a, a)))
    mid = w.op("Div", w.op("Mul", e, _polynomial(w, a, _ERFC_P, d, False)),
               _polynomial(w, a, _ERFC_Q, d, True))
    far = w.op("Div", w.op("Mul", e, _polynomial(w, a, _ERFC_R, d, False)),
               _polynomial(w, a, _ERFC_S, d, True))
    erfc = w.op("Where", w.op("Less", a, w.const(8.0, d)), mid, far)
    big = w.op("Mul", w.op("Sign", x), w.op("Sub", w.const(1.0, d), erfc))
    return w.op("Where", w.op("LessOrEqual", w.op("Abs", x), w.const(1.0, d)), small, big)


def _atan_of(w: OnnxWriter, x: str, d: str) -> str:
    """atan(x): ONNX Atan, or for f64 Cephes' atan (reduced to |x| <= 0.66)."""
    if d != "f64" or _NATIVE_F64:
        return w.op("Atan", x)
    a = w.op("Abs", x)
    big = w.op("Greater", a, w.const(2.41421356237309504880, d))
    mid = w.op("And", w.op("Greater", a, w.const(0.66, d)), w.op("Not", big))
    inverse = w.op("Neg", w.op("Div", w.const(1.0, d), a))
    shifted = w.op("Div", w.op("Sub", a, w.const(1.0, d)), w.op("Add", a, w.const(1.0, d)))
    reduced = w.op("Where", big, inverse, w.op("Where", mid, shifted, a))
    base = w.op("Where", big, w.const(math.pi / 2 + _ATAN_MOREBITS, d),
                w.op("Where", mid, w.const(math.pi / 4 + 0.5 * _ATAN_MOREBITS, d), w.const(0.0, d)))
    z = w.op("Mul", reduced, reduced)
    ratio = w.op("Div", w.op("Mul", z, _polynomial(w, z, _ATAN_P, d, False)),
                 _polynomial(w, z, _ATAN_Q, d, True))
    core = w.op("Add", w.op("Mul", reduced, ratio), reduced)
    return w.op("Mul", w.op("Sign", x), w.op("Add", base, core))


def _atan(w: OnnxWriter, x: str, d: str) -> str:
    """atan(x) (see :func:`_atan_of`)."""
    return _atan_of(w, x, d)


def _erf(w: OnnxWriter, x: str, d: str) -> str:
    """erf(x) (see :func:`_erf_of`)."""
    return _erf_of(w, x, d)


def _asin(w: OnnxWriter, x: str, d: str) -> str:
    """asin(x): ONNX Asin, or for f64 ``atan(x / sqrt((1 - x) (1 + x)))``."""
    if d != "f64" or _NATIVE_F64:
        return w.op("Asin", x)
    one = w.const(1.0, d)
    root = w.op("Sqrt", w.op("Mul", w.op("Sub", one, x), w.op("Add", one, x)))
    return _atan_of(w, w.op("Div", x, root), d)


def _acos(w: OnnxWriter, x: str, d: str) -> str:
    """acos(x): ONNX Acos, or for f64 ``2 atan(sqrt((1 - x) / (1 + x)))``."""
    if d != "f64" or _NATIVE_F64:
        return w.op("Acos", x)
    one = w.const(1.0, d)
    root = w.op("Sqrt", w.op("Div", w.op("Sub", one, x), w.op("Add", one, x)))
    return w.op("Mul", w.const(2.0, d), _atan_of(w, root, d))


def _log1p(w: OnnxWriter, x: str, d: str) -> str:
    """log(1 + x), exact near 0 (Goldberg: ``log(u) * x / (u - 1)`` with ``u = 1 + x``)."""
    u = w.op("Add", x, w.const(1, d))
    um1 = w.op("Sub", u, w.const(1, d))
    ratio = w.op("Div", w.op("Mul", w.op("Log", u), x), um1)
    small = w.op("Where", w.op("Equal", um1, w.const(0, d)), x, ratio)
    return w.op("Where", w.op("IsInf", x), w.op("Log", u), small)


def _expm1(w: OnnxWriter, x: str, d: str) -> str:
    """exp(x) - 1, exact near 0 (Kahan: ``(u - 1) * x / log(u)`` with ``u = exp(x)``)."""
    u = w.op("Exp", x)
    um1 = w.op("Sub", u, w.const(1, d))
    ratio = w.op("Div", w.op("Mul", um1, x), w.op("Log", u))
    general = w.op("Where", w.op("IsInf", u), u, ratio)
    general = w.op("Where", w.op("Equal", um1, w.const(-1, d)), w.const(-1, d), general)
    return w.op("Where", w.op("Equal", u, w.const(1, d)), x, general)


def _float_unary(build: Callable[[OnnxWriter, str, str], str]) -> OnnxRule:
    """A rule computing ``build(writer, x, dtype)`` in the result's dtype."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        d = w.dtype(out)
        w.node("Identity", [build(w, w.tensor(op.args[0], d), d)], [out.name])
    rule.__doc__ = build.__doc__
    return rule


def _tan(w: OnnxWriter, x: str, d: str) -> str:
    """sin(x) / cos(x) (onnxruntime has no f64 Tan)."""
    return w.op("Div", w.op("Sin", x), w.op("Cos", x))


def _sinh(w: OnnxWriter, x: str, d: str) -> str:
    """sinh: ``(e + e / (e + 1)) / 2`` with ``e = expm1(x)`` below |x| = 1, ``(exp(x) - exp(-x)) / 2``
    above (onnxruntime has no f64 Sinh)."""
    e = _expm1(w, x, d)
    small = w.op("Mul", w.const(0.5, d), w.op("Add", e, w.op("Div", e, w.op("Add", e, w.const(1, d)))))
    big = w.op("Mul", w.const(0.5, d), w.op("Sub", w.op("Exp", x), w.op("Exp", w.op("Neg", x))))
    return w.op("Where", w.op("Less", w.op("Abs", x), w.const(1, d)), small, big)


def _cosh(w: OnnxWriter, x: str, d: str) -> str:
    """(exp(x) + exp(-x)) / 2 (onnxruntime has no f64 Cosh)."""
    return w.op("Mul", w.const(0.5, d), w.op("Add", w.op("Exp", x), w.op("Exp", w.op("Neg", x))))


def _int_safe(w: OnnxWriter, y: str, d: str) -> tuple[str, str]:
    """(y == 0, y with its zeros made 1): integer division by 0 is 0 in numpy, undefined in ONNX."""
    zero = w.op("Equal", y, w.const(0, d))
    return zero, w.op("Where", zero, w.const(1, d), y)


def _division(integers: Callable[[OnnxWriter, str, str], str],
              floats: Callable[[OnnxWriter, str, str, str, str], None], doc: str) -> OnnxRule:
    """A rule of the division family on both operands in the result's dtype: floats by
    ``floats(w, x, y, d, out)``; integers by ``integers(w, x, safe_y)``, a division by 0
    giving 0 (numpy's; ONNX leaves it undefined)."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        d = w.dtype(out)
        x, y = w.tensor(op.args[0], d), w.tensor(op.args[1], d)
        if is_float(d):
            floats(w, x, y, d, out.name)
        else:
            zero, safe = _int_safe(w, y, d)
            w.node("Where", [zero, w.const(0, d), integers(w, x, safe)], [out.name])
    rule.__doc__ = doc
    return rule


def _sign_fixed(w: OnnxWriter, m: str, y: str, d: str) -> str:
    """Where fmod's remainder ``m`` is not 0 and its sign is not ``y``'s: where floor
    division and numpy's mod differ from C's truncation."""
    return w.op("And", w.op("Not", w.op("Equal", m, w.const(0, d))),
                w.op("Xor", w.op("Less", y, w.const(0, d)), w.op("Less", m, w.const(0, d))))


def _floor_div_floats(w: OnnxWriter, x: str, y: str, d: str, out: str) -> None:
    """numpy's floor_divide of floats, as its divmod computes it (x / 0 where y is 0)."""
    m = w.op("Mod", x, y, fmod=1)
    div = w.op("Div", w.op("Sub", x, m), y)
    div = w.op("Where", _sign_fixed(w, m, y, d), w.op("Sub", div, w.const(1, d)), div)
    floor = w.op("Floor", div)
    up = w.op("Greater", w.op("Sub", div, floor), w.const(0.5, d))
    result = w.op("Where", up, w.op("Add", floor, w.const(1, d)), floor)
    w.node("Where", [w.op("Equal", y, w.const(0, d)), w.op("Div", x, y), result], [out])


def _mod_floats(w: OnnxWriter, x: str, y: str, d: str, out: str) -> None:
    """numpy's mod of floats: fmod, plus y where the signs differ."""
    m = w.op("Mod", x, y, fmod=1)
    w.node("Where", [_sign_fixed(w, m, y, d), w.op("Add", m, y), m], [out])


_floor_div = _division(lambda w, x, s: w.op("Div", w.op("Sub", x, w.op("Mod", x, s, fmod=0)), s),
                       _floor_div_floats, "numpy floor_divide: integers through Python's modulo, "
                       "floats as numpy's divmod does")


_mod = _division(lambda w, x, s: w.op("Mod", x, s, fmod=0), _mod_floats,
                 "numpy mod (the sign of y): ONNX Mod for integers, fmod corrected for floats")


_fmod = _division(lambda w, x, s: w.op("Mod", x, s, fmod=1),
                  lambda w, x, y, d, out: w.node("Mod", [x, y], [out], fmod=1),
                  "C fmod (the sign of x): ONNX Mod with fmod=1 (integers by 0 give 0, as numpy)")


def _predicate(op_type: str) -> OnnxRule:
    """IsNaN / IsInf (integers, never nan or inf, are compared as floats)."""
    def rule(w: OnnxWriter, op: Op) -> None:
        have = w.dtype_of_operand(op.args[0])
        w.node(op_type, [w.tensor(op.args[0], have if is_float(have) else "f64")],
               [op.results[0].name])
    rule.__doc__ = f"ONNX {op_type}"
    return rule


def _bitwise(op_type: str, logical_type: str) -> OnnxRule:
    """A bitwise op on integers, the logical one on bools."""
    def rule(w: OnnxWriter, op: Op) -> None:
        d = w.dtype(op.results[0])
        w.node(logical_type if d == "bool" else op_type, [w.tensor(a, d) for a in op.args],
               [op.results[0].name])
    rule.__doc__ = f"ONNX {op_type} ({logical_type} on bools)"
    return rule


_UNSIGNED = {"i8": "u8", "i16": "u16", "i32": "u32", "i64": "u64"}


def _bit_shift(w: OnnxWriter, op: Op) -> None:
    """x << y through the unsigned type of x's width (ONNX BitShift is unsigned); a
    right shift of signed integers is the floor division by 2**y, as numpy's."""
    out = op.results[0]
    d = w.dtype(out)
    x, y = w.tensor(op.args[0], d), w.tensor(op.args[1], d)
    right = op.attrs.get("direction") == "right"
    if right and d in _UNSIGNED:
        power = w.op("Pow", w.const(2, d), y)
        w.node("Div", [w.op("Sub", x, w.op("Mod", x, power, fmod=0)), power], [out.name])
        return
    u = _UNSIGNED.get(d, d)
    shifted = w.op("BitShift", w.cast(x, d, u), w.cast(y, d, u),
                   direction="RIGHT" if right else "LEFT")
    w.node("Cast", [shifted], [out.name], to=ONNX_TYPES[d])


RULES: dict[Primitive, OnnxRule] = {
    elementwise.erf: _float_unary(_erf),
    elementwise.expm1: _float_unary(_expm1),
    elementwise.log1p: _float_unary(_log1p),
    elementwise.floor: unary("Floor"),
    elementwise.ceil: unary("Ceil"),
    elementwise.round_: unary("Round"),
    elementwise.reciprocal: unary("Reciprocal"),
    elementwise.rsqrt: _float_unary(lambda w, x, d: w.op("Reciprocal", w.op("Sqrt", x))),
    elementwise.square: _float_unary(lambda w, x, d: w.op("Mul", x, x)),
    elementwise.tan: _float_unary(_tan),
    elementwise.atan: _float_unary(_atan),
    elementwise.sinh: _float_unary(_sinh),
    elementwise.cosh: _float_unary(_cosh),
    elementwise.asin: _float_unary(_asin),
    elementwise.acos: _float_unary(_acos),
    elementwise.floor_div: _floor_div,
    elementwise.mod: _mod,
    elementwise.fmod: _fmod,
    elementwise.isnan: _predicate("IsNaN"),
    elementwise.isinf: _predicate("IsInf"),
    elementwise.logical_xor: logical("Xor"),
    elementwise.bitwise_and: _bitwise("BitwiseAnd", "And"),
    elementwise.bitwise_or: _bitwise("BitwiseOr", "Or"),
    elementwise.bitwise_xor: _bitwise("BitwiseXor", "Xor"),
    elementwise.bitwise_not: _bitwise("BitwiseNot", "Not"),
    elementwise.bit_shift: _bit_shift,
}
"""This family's primitive object → the rule writing its ONNX nodes (merged into
:data:`anfir.interop.onnx.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported, with the reason."""

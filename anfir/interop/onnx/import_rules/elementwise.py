"""The ONNX import rules whose result is built from
the elementwise functions and logic of :mod:`anfir.primitives.elementwise`:
activations (LeakyRelu, Elu, Selu, Gelu, HardSigmoid, PRelu), Clip, Mod, BitShift, IsInf.

See :mod:`anfir.interop.onnx.import_rules` for how a rule is chosen.
"""

from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from anfir.interop.onnx.common import Ctx
from anfir.interop.onnx.import_rules.common import RuleSet, binary, unary
from anfir.ir.nodes import Node
from anfir.primitives import arith, elementwise, structure, tensor

RULES = RuleSet()
"""This family's rules (merged into :data:`anfir.interop.onnx.import_rules.OPS`)."""
op = RULES.op


for _onnx, _anfir in {
    "Tan": elementwise.tan, "Sinh": elementwise.sinh, "Cosh": elementwise.cosh, "Asin": elementwise.asin,
    "Acos": elementwise.acos, "Atan": elementwise.atan, "Floor": elementwise.floor, "Ceil": elementwise.ceil,
    "Round": elementwise.round_, "Reciprocal": elementwise.reciprocal, "Erf": elementwise.erf,
    "IsNaN": elementwise.isnan, "Softsign": elementwise.softsign, "HardSwish": elementwise.hard_swish,
    "Mish": elementwise.mish, "BitwiseNot": elementwise.bitwise_not,
}.items():
    op(_onnx)(unary(_anfir))


for _onnx, _anfir in {
    "Xor": elementwise.logical_xor, "BitwiseAnd": elementwise.bitwise_and, "BitwiseOr": elementwise.bitwise_or,
    "BitwiseXor": elementwise.bitwise_xor,
}.items():
    op(_onnx)(binary(_anfir))


@op("Mod")
def _mod(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(elementwise.fmod if ctx.attr("fmod", 0) else elementwise.mod, ctx.need(0), ctx.need(1))]


@op("BitShift")
def _bit_shift(ctx: Ctx) -> Sequence[Optional[Node]]:
    direction = ctx.attr("direction", "LEFT").lower()
    return [ctx.call(elementwise.bit_shift, ctx.need(0), ctx.need(1), direction=direction)]


@op("IsInf")
def _isinf(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    inf = ctx.call(elementwise.isinf, x)
    if pos and neg:
        return [inf]
    zero = ctx.const(0, ctx.dtype(0))
    side = ctx.call(arith.gt if pos else arith.lt, x, zero)
    if not pos and not neg:
        return [ctx.call(arith.logical_and, inf, ctx.call(arith.logical_not, inf))]
    return [ctx.call(arith.logical_and, inf, side)]


@op("PRelu")
def _prelu(ctx: Ctx) -> Sequence[Optional[Node]]:
    x, slope = ctx.need(0), ctx.need(1)
    neg = ctx.call(arith.lt, x, ctx.const(0, ctx.dtype(0)))
    return [ctx.call(tensor.where, neg, ctx.call(arith.mul, x, slope), x)]


@op("LeakyRelu")
def _leaky_relu(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(elementwise.leaky_relu, ctx.need(0), alpha=float(ctx.attr("alpha", 0.01)))]


@op("Elu")
def _elu(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(elementwise.elu, ctx.need(0), alpha=float(ctx.attr("alpha", 1.0)))]


@op("HardSigmoid")
def _hard_sigmoid(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(elementwise.hard_sigmoid, ctx.need(0), alpha=float(ctx.attr("alpha", 0.2)),
                     beta=float(ctx.attr("beta", 0.5)))]


@op("Gelu", 20)
def _gelu(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(elementwise.gelu, ctx.need(0), approximate=ctx.attr("approximate", "none"))]


_SELU_ALPHA = 1.67326319217681884765625


_SELU_GAMMA = 1.05070102214813232421875


@op("Selu")
def _selu(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    alpha, gamma = float(ctx.attr("alpha", _SELU_ALPHA)), float(ctx.attr("gamma", _SELU_GAMMA))
    d = ctx.dtype(0)
    if np.float32(alpha) == np.float32(_SELU_ALPHA) and np.float32(gamma) == np.float32(_SELU_GAMMA):
        return [ctx.call(elementwise.selu, x)]
    # gamma * (x if x > 0 else alpha * (exp(x) - 1))
    neg = ctx.call(arith.mul, ctx.const(alpha, d), ctx.call(elementwise.expm1, x))
    pos = ctx.call(arith.gt, x, ctx.const(0, d))
    return [ctx.call(arith.mul, ctx.const(gamma, d), ctx.call(tensor.where, pos, x, neg))]


@op("Clip")
def _clip(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    d = ctx.dtype(0)
    if ctx.opset < 11:
        lo, hi = ctx.attr("min"), ctx.attr("max")
        lo_node: Optional[Node] = None if lo is None else ctx.const(lo, d)
        hi_node: Optional[Node] = None if hi is None else ctx.const(hi, d)
    else:
        lo_node, hi_node = ctx.input(1), ctx.input(2)
    out = x
    if lo_node is not None:
        out = ctx.call(arith.maximum, out, lo_node)
    if hi_node is not None:
        out = ctx.call(arith.minimum, out, hi_node)
    if out is x:
        out = ctx.call(structure.identity, x)
    return [out]

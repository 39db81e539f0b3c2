"""The ONNX import rules whose result is built from
arithmetic and comparisons (:mod:`anfir.primitives.arith`): the unary and binary math ops,
the variadic Sum/Max/Min/Mean, Div, Pow, the inverse hyperbolics, and the training
domain's optimizers (Adagrad, Momentum, Adam: arithmetic on the parameters).

See :mod:`anfir.interop.onnx.import_rules` for how a rule is chosen.
"""

from __future__ import annotations

from typing import Optional, Sequence

from anfir.dtypes import is_float
from anfir.interop.onnx.common import Ctx, NodeError, OpRule
from anfir.interop.onnx.import_rules.common import RuleSet, binary, unary
from anfir.ir.nodes import Node
from anfir.ir.primitive import Primitive
from anfir.primitives import arith, elementwise, structure, tensor

RULES = RuleSet()
"""This family's rules (merged into :data:`anfir.interop.onnx.import_rules.OPS`)."""
op = RULES.op


for _onnx, _anfir in {
    "Abs": arith.abs_, "Neg": arith.neg, "Exp": arith.exp, "Log": arith.log, "Sqrt": arith.sqrt, "Sin": arith.sin,
    "Cos": arith.cos, "Tanh": arith.tanh, "Sigmoid": arith.sigmoid, "Relu": arith.relu, "Sign": arith.sign,
    "Softplus": arith.softplus, "Not": arith.logical_not,
}.items():
    op(_onnx)(unary(_anfir))


def _variadic(prim: Primitive) -> OpRule:
    # Sum, Max, Min of any number of inputs: a left fold of the binary operator.
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        args = [a for a in ctx.inputs() if a is not None]
        if not args:
            raise NodeError("needs at least one input")
        acc = args[0]
        for a in args[1:]:
            acc = ctx.call(prim, acc, a)
        if len(args) == 1:
            acc = ctx.call(structure.identity, acc)
        return [acc]
    return rule


for _onnx, _anfir in {
    "Add": arith.add, "Sub": arith.sub, "Mul": arith.mul, "Equal": arith.eq, "Less": arith.lt,
    "LessOrEqual": arith.le, "Greater": arith.gt, "GreaterOrEqual": arith.ge, "And": arith.logical_and,
    "Or": arith.logical_or,
}.items():
    op(_onnx)(binary(_anfir))


op("Sum")(_variadic(arith.add))


op("Max")(_variadic(arith.maximum))


op("Min")(_variadic(arith.minimum))


@op("Mean")
def _mean(ctx: Ctx) -> Sequence[Optional[Node]]:
    args = [a for a in ctx.inputs() if a is not None]
    total = _variadic(arith.add)(ctx)[0]
    return [ctx.call(arith.div, total, ctx.const(len(args), ctx.dtype(0)))]


@op("Div")
def _div(ctx: Ctx) -> Sequence[Optional[Node]]:
    x, y = ctx.need(0), ctx.need(1)
    d = ctx.dtype(0)
    if is_float(d):
        return [ctx.call(arith.div, x, y)]
    # ONNX divides integers toward zero; floor division corrected where the
    # signs differ and the division is inexact.
    q = ctx.call(elementwise.floor_div, x, y)
    r = ctx.call(elementwise.mod, x, y)
    zero = ctx.const(0, d)
    inexact = ctx.call(arith.ne, r, zero)
    differ = ctx.call(arith.ne, ctx.call(arith.lt, x, zero), ctx.call(arith.lt, y, zero))
    fix = ctx.call(arith.logical_and, inexact, differ)
    return [ctx.call(tensor.where, fix, ctx.call(arith.add, q, ctx.const(1, d)), q)]


@op("Pow")
def _pow(ctx: Ctx) -> Sequence[Optional[Node]]:
    d = ctx.dtype(0)
    y = ctx.need(1)
    if ctx.dtype(1) != d:
        y = ctx.call(tensor.cast, y, d)
    return [ctx.call(arith.pow_, ctx.need(0), y)]


for _onnx, _formula in (("Asinh", "asinh"), ("Acosh", "acosh"), ("Atanh", "atanh")):
    def _inverse_hyperbolic(ctx: Ctx, formula: str = _formula) -> Sequence[Optional[Node]]:
        # No primitive: the logarithmic forms (exact to a few ulps away from the poles).
        x = ctx.need(0)
        d = ctx.dtype(0)
        one = ctx.const(1, d)
        if formula == "atanh":
            ratio = ctx.call(arith.div, ctx.call(arith.add, one, x), ctx.call(arith.sub, one, x))
            return [ctx.call(arith.mul, ctx.const(0.5, d), ctx.call(arith.log, ratio))]
        sq = ctx.call(arith.add if formula == "asinh" else arith.sub, ctx.call(arith.mul, x, x), one)
        return [ctx.call(arith.log, ctx.call(arith.add, x, ctx.call(arith.sqrt, sq)))]
    op(_onnx)(_inverse_hyperbolic)


TRAINING = "ai.onnx.preview.training"


def _optimizer_groups(ctx: Ctx, groups: int) -> tuple[Node, Node, list[list[Node]]]:
    """R, T and the tensors after them in ``groups`` equal groups (X..., G..., ...)."""
    rest = [ctx.need(i) for i in range(2, len(ctx.node.input))]
    if len(rest) % groups:
        raise NodeError(f"the inputs after R and T are not {groups} groups of one length")
    n = len(rest) // groups
    return ctx.need(0), ctx.need(1), [rest[k * n:(k + 1) * n] for k in range(groups)]


@op("Adagrad", 1, domain=TRAINING)
def _adagrad(ctx: Ctx) -> Sequence[Optional[Node]]:
    rate, step, (xs, gs, hs) = _optimizer_groups(ctx, 3)
    d = ctx.dtype(2)
    decay, eps = float(ctx.attr("decay_factor", 0.0)), float(ctx.attr("epsilon", 1e-6))
    norm = float(ctx.attr("norm_coefficient", 0.0))
    t = ctx.call(tensor.cast, step, d)
    r = ctx.call(arith.div, ctx.call(tensor.cast, rate, d),
                 ctx.call(arith.add, ctx.const(1.0, d), ctx.call(arith.mul, t, ctx.const(decay, d))))
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        reg = ctx.call(arith.add, ctx.call(arith.mul, ctx.const(norm, d), x), g)
        h2 = ctx.call(arith.add, h, ctx.call(arith.mul, reg, reg))
        adaptive = ctx.call(arith.add, ctx.call(arith.sqrt, h2), ctx.const(eps, d))
        new_x.append(ctx.call(arith.sub, x, ctx.call(arith.div, ctx.call(arith.mul, r, reg), adaptive)))
        new_h.append(h2)
    return [*new_x, *new_h]


@op("Momentum", 1, domain=TRAINING)
def _momentum(ctx: Ctx) -> Sequence[Optional[Node]]:
    rate, step, (xs, gs, vs) = _optimizer_groups(ctx, 3)
    d = ctx.dtype(2)
    alpha, beta = float(ctx.attr("alpha")), float(ctx.attr("beta"))
    norm = float(ctx.attr("norm_coefficient"))
    nesterov = str(ctx.attr("mode", "standard")) == "nesterov"
    r = ctx.call(tensor.cast, rate, d)
    # The first step (T = 0) takes the gradient unscaled by beta.
    b = ctx.call(tensor.where, ctx.call(arith.gt, step, ctx.const(0, ctx.dtype(1))), ctx.const(beta, d), ctx.const(1.0, d))
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        reg = ctx.call(arith.add, ctx.call(arith.mul, ctx.const(norm, d), x), g)
        v2 = ctx.call(arith.add, ctx.call(arith.mul, ctx.const(alpha, d), v), ctx.call(arith.mul, b, reg))
        move = ctx.call(arith.add, reg, ctx.call(arith.mul, ctx.const(alpha, d), v2)) if nesterov else v2
        new_x.append(ctx.call(arith.sub, x, ctx.call(arith.mul, r, move)))
        new_v.append(v2)
    return [*new_x, *new_v]


@op("Adam", 1, domain=TRAINING)
def _adam(ctx: Ctx) -> Sequence[Optional[Node]]:
    rate, step, (xs, gs, vs, hs) = _optimizer_groups(ctx, 4)
    d = ctx.dtype(2)
    alpha, beta = float(ctx.attr("alpha", 0.9)), float(ctx.attr("beta", 0.999))
    eps, norm = float(ctx.attr("epsilon", 1e-6)), float(ctx.attr("norm_coefficient", 0.0))
    post = float(ctx.attr("norm_coefficient_post", 0.0))
    t = ctx.call(tensor.cast, step, d)
    r = ctx.call(tensor.cast, rate, d)
    one = ctx.const(1.0, d)
    # R * sqrt(1 - beta^T) / (1 - alpha^T) once T > 0 (bias correction), else R.
    corrected = ctx.call(arith.div, ctx.call(arith.mul, r, ctx.call(arith.sqrt, ctx.call(
        arith.sub, one, ctx.call(arith.pow_, ctx.const(beta, d), t)))),
        ctx.call(arith.sub, one, ctx.call(arith.pow_, ctx.const(alpha, d), t)))
    r = ctx.call(tensor.where, ctx.call(arith.gt, step, ctx.const(0, ctx.dtype(1))), corrected, r)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        reg = ctx.call(arith.add, ctx.call(arith.mul, ctx.const(norm, d), x), g)
        v2 = ctx.call(arith.add, ctx.call(arith.mul, ctx.const(alpha, d), v), ctx.call(arith.mul, ctx.const(1 - alpha, d), reg))
        h2 = ctx.call(arith.add, ctx.call(arith.mul, ctx.const(beta, d), h),
                      ctx.call(arith.mul, ctx.const(1 - beta, d), ctx.call(arith.mul, reg, reg)))
        root = ctx.call(arith.add, ctx.call(arith.sqrt, h2), ctx.const(eps, d))
        x2 = ctx.call(arith.sub, x, ctx.call(arith.div, ctx.call(arith.mul, r, v2), root))
        new_x.append(ctx.call(arith.mul, ctx.const(1 - post, d), x2))
        new_v.append(v2)
        new_h.append(h2)
    return [*new_x, *new_v, *new_h]

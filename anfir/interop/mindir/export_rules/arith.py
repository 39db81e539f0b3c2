"""MindIR export rules of :mod:`anfir.primitives.arith`: each one MindSpore op of the same inputs."""

from __future__ import annotations

from anfir.interop.mindir.export_rules.common import Rule, elementwise
from anfir.ir.primitive import Primitive
from anfir.primitives import arith

RULES: dict[Primitive, Rule] = {}
"""This family's primitives -> how each is written as MindSpore ops."""
UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives MindIR cannot hold, with the reason."""


ELEMENTWISE: dict[Primitive, str] = {
    arith.add: "Add",
    arith.sub: "Sub",
    arith.mul: "Mul",
    arith.div: "RealDiv",
    arith.neg: "Neg",
    arith.exp: "Exp",
    arith.log: "Log",
    arith.sin: "Sin",
    arith.cos: "Cos",
    arith.tanh: "Tanh",
    arith.sqrt: "Sqrt",
    arith.abs_: "Abs",
    arith.sign: "Sign",
    arith.relu: "ReLU",
    arith.sigmoid: "Sigmoid",
    arith.maximum: "Maximum",
    arith.minimum: "Minimum",
    arith.pow_: "Pow",
    arith.gt: "Greater",
    arith.ge: "GreaterEqual",
    arith.lt: "Less",
    arith.le: "LessEqual",
    arith.eq: "Equal",
    arith.ne: "NotEqual",
    arith.logical_and: "LogicalAnd",
    arith.logical_or: "LogicalOr",
    arith.logical_not: "LogicalNot",
    arith.softplus: "Softplus",
}
"""Primitives written as one MindSpore op of the same inputs."""
for _prim, _op in ELEMENTWISE.items():
    RULES[_prim] = elementwise(_op)

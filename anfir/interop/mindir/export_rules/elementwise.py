"""MindIR export rules of :mod:`anfir.primitives.elementwise`: each one MindSpore op."""

from __future__ import annotations

from anfir.interop.mindir.export_rules.common import Rule, elementwise
from anfir.ir.primitive import Primitive
from anfir.primitives import elementwise as ops

RULES: dict[Primitive, Rule] = {}
"""This family's primitives -> how each is written as MindSpore ops."""
UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives MindIR cannot hold, with the reason."""


ELEMENTWISE: dict[Primitive, str] = {
    ops.erf: "Erf",
    ops.rsqrt: "Rsqrt",
    ops.floor: "Floor",
    ops.ceil: "Ceil",
    ops.reciprocal: "Reciprocal",
    ops.log1p: "Log1p",
    ops.expm1: "Expm1",
    ops.atan: "Atan",
    ops.sinh: "Sinh",
    ops.cosh: "Cosh",
    ops.tan: "Tan",
    ops.asin: "Asin",
    ops.acos: "Acos",
}
"""Primitives written as one MindSpore op of the same inputs."""
for _prim, _op in ELEMENTWISE.items():
    RULES[_prim] = elementwise(_op)

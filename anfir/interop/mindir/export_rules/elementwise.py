"""MindIR export rules of :mod:`anfir.primitives.elementwise`: each one MindSpore op."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anfir.dtypes import is_float
from anfir.interop.mindir.common import TYPE_ID_OF
from anfir.interop.mindir.export_rules.common import (Rule, Unsupported, dtype_of, elementwise, known,
                                                      registrar)
from anfir.ir.nodes import CNode
from anfir.ir.primitive import Primitive
from anfir.primitives import elementwise as ops

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.mindir.writer import Writer

RULES: dict[Primitive, Rule] = {}
"""This family's primitives -> how each is written as MindSpore ops."""
UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives MindIR cannot hold, with the reason."""
rule_of = registrar(RULES)


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


# -- helper mops: the rounding, division, predicate and bit operators ----------------------
def _operands(w: Writer, node: CNode, dtype: str) -> list[str]:
    """The node's operands in ``dtype``: a constant written in it, a computed operand of
    another dtype cast (MindSpore's kernels take operands of one dtype)."""
    refs = []
    for arg in node.args:
        value = known(arg)
        if value is not None:
            refs.append(w.constant(value[0], dtype))
        elif dtype_of(arg.abstract) not in (None, dtype):
            refs.append(w.emit("Cast", [w.ref(arg), w.constant(TYPE_ID_OF[dtype], scalar=True)]))
        else:
            refs.append(w.ref(arg))
    return refs


def _result_dtype(node: CNode) -> str:
    dtype = dtype_of(node.abstract)
    if dtype is None or dtype not in TYPE_ID_OF:
        raise Unsupported(f"a result of type {node.abstract}")
    return dtype


def _in_result_dtype(op: str) -> Rule:
    """``op`` of the operands converted to the result's dtype (round of an integer is a
    float in anfir: MindSpore's Round would keep the integer dtype)."""
    def rule(w: Writer, node: CNode) -> str:
        return w.emit(op, _operands(w, node, _result_dtype(node)), abstract=node.abstract)
    return rule


RULES[ops.square] = _in_result_dtype("Square")


@rule_of(ops.round_)
def _round(w: Writer, node: CNode) -> str:
    # both round halves to even (numpy's rounding); MindSpore 2.10's Round takes its
    # number of decimals as a second input (its kernel selection refuses one input)
    x = _operands(w, node, _result_dtype(node))
    return w.emit("Round", x + [w.constant(0, scalar=True)], abstract=node.abstract)


def _division(op: str) -> Rule:
    """floor_div / mod / fmod: MindSpore's FloorDiv / FloorMod / Mod compute numpy's
    floor_divide / mod / fmod of floats (x / 0 included); an integer divided by 0 is 0 in
    numpy but garbage in MindSpore, so integers divide by y with its zeros made 1 and the
    result is multiplied by (y != 0)."""
    def rule(w: Writer, node: CNode) -> str:
        dtype = _result_dtype(node)
        x, y = _operands(w, node, dtype)
        if is_float(dtype):
            return w.emit(op, [x, y], abstract=node.abstract)
        one = w.constant(1, dtype)
        zero = w.emit("Equal", [y, w.constant(0, dtype)])
        safe = w.emit("Add", [y, w.emit("Cast", [zero, w.constant(TYPE_ID_OF[dtype], scalar=True)])])
        keep = w.emit("Sub", [one, w.emit("Cast", [zero, w.constant(TYPE_ID_OF[dtype], scalar=True)])])
        return w.emit("Mul", [w.emit(op, [x, safe]), keep], abstract=node.abstract)
    return rule


RULES[ops.floor_div] = _division("FloorDiv")
RULES[ops.mod] = _division("FloorMod")
RULES[ops.fmod] = _division("Mod")


def _predicate(op: str) -> Rule:
    """isnan / isinf: MindSpore's IsNan / IsInf take floats; an integer or bool operand is
    cast to f32 first (exactly representable in range: never nan nor inf, as in numpy)."""
    def rule(w: Writer, node: CNode) -> str:
        x = node.args[0]
        dtype = dtype_of(x.abstract)
        ref = w.ref(x)
        if dtype is None or not is_float(dtype):
            ref = w.emit("Cast", [ref, w.constant(TYPE_ID_OF["f32"], scalar=True)])
        return w.emit(op, [ref], abstract=node.abstract)
    return rule


RULES[ops.isnan] = _predicate("IsNan")
RULES[ops.isinf] = _predicate("IsInf")


@rule_of(ops.logical_xor)
def _logical_xor(w: Writer, node: CNode) -> str:
    # anfir's logical_xor takes any dtype (non-zero is true); MindSpore's LogicalXor bools
    return w.emit("LogicalXor", _operands(w, node, "bool"), abstract=node.abstract)


def _bitwise(op: str) -> Rule:
    """A bitwise op of integers or bools (MindSpore's Bitwise* take both) in the result's dtype."""
    return _in_result_dtype(op)


RULES[ops.bitwise_and] = _bitwise("BitwiseAnd")
RULES[ops.bitwise_or] = _bitwise("BitwiseOr")
RULES[ops.bitwise_xor] = _bitwise("BitwiseXor")


@rule_of(ops.bitwise_not)
def _bitwise_not(w: Writer, node: CNode) -> str:
    # numpy's invert of a bool is logical not (MindSpore's Invert takes integers)
    if _result_dtype(node) == "bool":
        return w.emit("LogicalNot", [w.ref(node.args[0])], abstract=node.abstract)
    return w.emit("Invert", _operands(w, node, _result_dtype(node)), abstract=node.abstract)


@rule_of(ops.bit_shift)
def _bit_shift(w: Writer, node: CNode) -> str:
    direction = node.attrs.get("direction", "left") if node.attrs else "left"
    op = "LeftShift" if direction == "left" else "RightShift"
    return w.emit(op, _operands(w, node, _result_dtype(node)), abstract=node.abstract)

"""``lower``: the optimized graph as instructions over buffers, every value its own buffer.

The graph is first flattened (:func:`anfir.flat.flatten.flatten_program`:
calls of non-recursive graphs inlined, closures converted, tuples taken
apart), then each op of the flat program becomes one :class:`Instr` through
its rule (:data:`anfir.lowlevel.rules.RULES`):

* every value an op computes gets an ``alloc`` of the arena right before it,
  and a ``dealloc`` at the end of the program (``share_buffers`` moves them);
* an output of the entry is written straight into its ``declare``'d output
  buffer by the op that computes it; an output no op of the program computes
  (an input, a constant, a value returned twice) is a ``copy`` at the end;
* numbers and arrays the ops read are ``declare``'d constants; other constant
  arguments (a shape, a dtype, an axis) and attributes are the instruction's
  statics; arguments the rule reads only for their type are statics too.

What cannot be lowered — control flow left after flattening, a shape that is
not concrete, strings — is an :class:`~anfir.errors.AnfirError` at the node.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from anfir.abstract.values import AbstractValue, AScalar, ATensor
from anfir.dtypes import TYPE_NAMES, dtype_name, numpy_dtype
from anfir.errors import AnfirError
from anfir.flat.statements import (
    Const, FlatProgram, IfOp, LoopOp, NameAllocator, Op, Undefined, Value, nest_by_structure,
)
from anfir.flat.flatten import flatten_program
from anfir.ir.graph import FuncGraph
from anfir.location import Location
from anfir.runtime_values import DType
from anfir.lowlevel.program import COPY, Alloc, Buffer, Dealloc, Instr, Line, LowProgram, Structure
from anfir.lowlevel.kernels import ScratchMeasure
from anfir.lowlevel.rules import RULES, UNLOWERED, TensorType


class LoweringError(AnfirError):
    """A program the low level cannot express (located at the node that stands in the way)."""


def lower_graph(graph: FuncGraph) -> LowProgram:
    """The optimized ``graph`` (what ``anfir.compile`` returns, with concrete
    shapes) as a low-level program: the ``lower`` phase."""
    try:
        flat = flatten_program(graph)
    except AnfirError as error:
        raise LoweringError(f"cannot lower @{graph.name}: {error.message}", error.loc) from None
    return Lowerer(flat, graph).program()


def concrete_type(t: AbstractValue, what: str, loc: Optional[Location]) -> tuple[str, tuple[int, ...]]:
    """``(dtype, shape)`` of a value's type, or a LoweringError when it is not a
    number or a tensor of concrete shape."""
    if isinstance(t, AScalar) and t.dtype in TYPE_NAMES and t.dtype != "str":
        return t.dtype, ()
    if isinstance(t, ATensor) and t.shape is not None and all(isinstance(d, int) for d in t.shape):
        return t.dtype, tuple(int(d) for d in t.shape)
    if isinstance(t, ATensor):
        raise LoweringError(f"{what} has the type {t}, whose shape is not concrete: the low level "
                            "needs sizes (compile with example arguments or sized annotations)", loc)
    raise LoweringError(f"{what} has the type {t}: the low level holds only numbers and tensors", loc)


class Lowerer:
    """One flat program written as a :class:`LowProgram`."""

    def __init__(self, flat: FlatProgram, graph: FuncGraph) -> None:
        """Ready to lower ``flat``, the flattening of ``graph``."""
        self.flat = flat
        self.graph = graph
        self.names = NameAllocator()
        self.buffers: dict[int, Buffer] = {}
        """id(flat Value) → the buffer holding it."""
        self.constants: dict[tuple[str, str], Buffer] = {}
        self.declares: list[Buffer] = []
        self.body: list[Line] = []
        self.allocs: list[Buffer] = []

    def program(self) -> LowProgram:
        """Lower the whole program."""
        flat, loc = self.flat, self.graph.loc
        # Names first: the inputs', outputs' and values' own, then the buffers' (a0, c0...).
        for value in flat.inputs:
            self.names.take(value.name)
        out_names = [self.names.take(name) for name in flat.output_names]
        for op in flat.body.ops:
            for value in op.results:
                self.names.take(value.name)
        for index, value in enumerate(flat.inputs):
            dtype, shape = concrete_type(value.type, f"input %{value.name}", loc)
            buffer = Buffer(value.name, dtype, shape, "input", comment=f"parameter {index} of @{flat.name}")
            self.declares.append(buffer)
            self.buffers[id(value)] = buffer
        outputs: list[Buffer] = []
        for name, t, operand in zip(out_names, flat.output_types, flat.body.results):
            dtype, shape = concrete_type(t, f"output %{name}", loc)
            outputs.append(Buffer(name, dtype, shape, "output"))
        self.declares.extend(outputs)
        # An output computed by an op of the program is written there directly (its first claim).
        direct: dict[int, Buffer] = {}
        for buffer, operand in zip(outputs, flat.body.results):
            if isinstance(operand, Value) and id(operand) not in direct and id(operand) not in self.buffers:
                direct[id(operand)] = buffer
        for statement in flat.body.ops:
            self.statement(statement, direct)
        for buffer, operand in zip(outputs, flat.body.results):
            if isinstance(operand, Value) and direct.get(id(operand)) is buffer:
                continue
            source = self.operand(operand, loc, f"output %{buffer.name}")
            self.body.append(Instr(self.names.take(f"{buffer.name}_copy"), COPY,
                                   [("@out", buffer), ("@in", source)], {}, loc))
        for buffer in reversed(self.allocs):
            self.body.append(Dealloc(buffer))
        by_name = {b.name: b for b in self.declares}
        params = tuple(_structure(s, by_name) for s in flat.input_structure)
        result = _structure(_renamed(flat.output_structure, dict(zip(flat.output_names, out_names))),
                            by_name)
        return LowProgram(flat.name, self.declares, with_scratch(self.body, self.names), params, result)

    def statement(self, statement: Any, direct: dict[int, Buffer]) -> None:
        """One op of the flat program: an alloc (unless it writes an output) and an instruction."""
        if isinstance(statement, (IfOp, LoopOp)):
            kind = "an if on a value known only at run time" if isinstance(statement, IfOp) else "a loop"
            raise LoweringError(f"cannot lower {kind}: the low level has no control flow (the "
                                "program must be straight-line after optimization)", statement.loc)
        op: Op = statement
        rule = RULES.get(op.prim)
        if rule is None:
            reason = UNLOWERED.get(op.prim, "no rule in anfir/lowlevel/rules.py")
            raise LoweringError(f"cannot lower {op.prim.name}: {reason}", op.loc)
        if len(op.results) != 1:
            raise LoweringError(f"cannot lower {op.prim.name} with {len(op.results)} results", op.loc)
        (value,) = op.results
        dtype, shape = concrete_type(value.type, f"the result of {op.prim.name}", op.loc)
        statics: dict[str, Any] = {}
        inputs: list[tuple[str, Buffer]] = []
        for position, arg in enumerate(op.args):
            what = f"argument {position} of {op.prim.name}"
            if position in rule.shape_only:
                statics[f"arg{position}"] = TensorType(*self.type_of(arg, what, op.loc))
            elif position in rule.static or _is_static(arg):
                statics[f"arg{position}"] = self.static(arg, what, op.loc)
            else:
                inputs.append(("@in", self.operand(arg, op.loc, what)))
        statics.update(op.attrs)
        output = direct.get(id(value))
        if output is None:
            output = Buffer(self.names.take(f"a{len(self.allocs)}"), dtype, shape)
            self.allocs.append(output)
            self.body.append(Alloc(output))
        elif (output.dtype, output.shape) != (dtype, shape):  # the flattening types both alike
            raise LoweringError(f"output %{output.name} is {output.dtype}{list(output.shape)} but its "
                                f"value is {dtype}{list(shape)}", op.loc)
        self.buffers[id(value)] = output
        self.body.append(Instr(value.name, op.prim, [("@out", output), *inputs], statics, op.loc))

    def type_of(self, arg: Any, what: str, loc: Optional[Location]) -> tuple[str, tuple[int, ...]]:
        """The concrete type of an argument read only for its type."""
        if isinstance(arg, Value):
            return concrete_type(arg.type, what, loc)
        if isinstance(arg, Const):
            buffer = self.constant(arg, what, loc)
            return buffer.dtype, buffer.shape
        raise LoweringError(f"{what} is not a tensor", loc)

    def static(self, arg: Any, what: str, loc: Optional[Location]) -> Any:
        """A static argument's value (it must be a constant)."""
        if isinstance(arg, Const):
            value = arg.value
            if isinstance(value, np.ndarray):
                return tuple(value.tolist()) if value.ndim == 1 else value.tolist()
            return value
        if isinstance(arg, tuple) and all(isinstance(a, Const) for a in arg):
            return tuple(a.value for a in arg)
        raise LoweringError(f"{what} must be known when lowering (a static argument), "
                            "but it is computed at run time", loc)

    def operand(self, arg: Any, loc: Optional[Location], what: str) -> Buffer:
        """The buffer an argument is read from (a constant is declared on first use)."""
        if isinstance(arg, Value):
            buffer = self.buffers.get(id(arg))
            if buffer is None:  # the flattening defines every value before its use
                raise LoweringError(f"{what} reads %{arg.name} before it is computed", loc)
            return buffer
        if isinstance(arg, Const):
            return self.constant(arg, what, loc)
        if isinstance(arg, Undefined):
            raise LoweringError(f"{what} is a value no branch defines", loc)
        raise LoweringError(f"{what} is a shape computed at run time: the low level needs it concrete", loc)

    def constant(self, arg: Const, what: str, loc: Optional[Location]) -> Buffer:
        """The declared constant holding ``arg`` (one per distinct value and type)."""
        value = arg.value
        if isinstance(arg.type, AScalar) and not isinstance(value, np.ndarray):
            dtype: Optional[str] = arg.type.dtype
        elif isinstance(value, (bool, np.bool_)):
            dtype = "bool"
        elif isinstance(value, (int, np.integer)) and not isinstance(value, bool):
            dtype = "i64" if isinstance(value, int) else dtype_name(np.asarray(value).dtype)
        elif isinstance(value, (float, np.floating)):
            dtype = "f64" if isinstance(value, float) else dtype_name(np.asarray(value).dtype)
        elif isinstance(value, np.ndarray):
            dtype = dtype_name(value.dtype)
        else:
            raise LoweringError(f"{what} is the constant {value!r}, which the low level cannot hold", loc)
        if dtype is None or dtype == "str":
            raise LoweringError(f"{what} is a constant of a type the low level cannot hold", loc)
        array = np.asarray(value)
        shape = tuple(int(d) for d in array.shape)
        key = (f"{dtype}{shape}", repr(array.tolist()))
        buffer = self.constants.get(key)
        if buffer is None:
            stored = array.astype(array.dtype) if array.ndim else array.item()
            buffer = Buffer(self.names.take(f"c{len(self.constants)}"), dtype, shape, "constant", stored)
            self.constants[key] = buffer
            self.declares.append(buffer)
        return buffer


def _is_static(arg: Any) -> bool:
    """Whether a constant argument is not a number or an array (a shape, a dtype, None, a string)."""
    if isinstance(arg, tuple):
        return True
    if not isinstance(arg, Const):
        return False
    value = arg.value
    return not isinstance(value, (bool, int, float, np.number, np.bool_, np.ndarray))


def _renamed(structure: Any, names: dict[str, str]) -> Any:
    """A flat output structure with its names mapped (lists and names, iteratively)."""
    if isinstance(structure, str):
        return names.get(structure, structure)
    if structure is None:
        return None
    root: list[Any] = []
    stack: list[tuple[list[Any], list[Any]]] = [(structure, root)]
    while stack:
        source, target = stack.pop()
        for item in source:
            if isinstance(item, list):
                inner: list[Any] = []
                target.append(inner)
                stack.append((item, inner))
            else:
                target.append(names.get(item, item) if isinstance(item, str) else item)
    return root


def _structure(structure: Any, buffers: dict[str, Buffer]) -> Structure:
    """A flat structure (names, None, lists) as buffers, None and tuples."""
    return nest_by_structure(structure, lambda name: buffers[name] if isinstance(name, str) else None)


__all__ = ["Lowerer", "LoweringError", "concrete_type", "lower_graph"]


def scratch_bytes(instr: Instr) -> int:
    """The working memory the kernel of ``instr`` takes (0 when its rule has no
    scratch kernel or the kernel does not apply to these operands): the kernel
    bound to arrays of the operands' types, its requests measured."""
    rule = RULES.get(instr.prim)
    if rule is None or rule.scratch is None:
        return 0

    def array(buffer: Buffer) -> Any:
        if buffer.kind == "constant":
            return buffer.value if not buffer.shape else np.asarray(buffer.value,
                                                                   dtype=numpy_dtype(buffer.dtype))
        return np.empty(buffer.shape, dtype=numpy_dtype(buffer.dtype))

    statics = {k: (DType(v.name) if isinstance(v, DType) else v) for k, v in instr.statics.items()}
    measure = ScratchMeasure()
    try:
        kernel = rule.scratch(array(instr.output), [array(b) for b in instr.inputs], statics, measure)
    except Exception:  # operands the kernel refuses: the executor evaluates the primitive instead
        return 0
    return measure.used if kernel is not None else 0


def with_scratch(body: list[Line], names: NameAllocator) -> list[Line]:
    """``body`` with a ``@scratch`` buffer on each instruction whose kernel needs working
    memory (allocated right before it, deallocated right after): the scratch is then
    part of the planned arena like any buffer, and the arena is all the memory a run
    takes besides the declared inputs, outputs and constants."""
    result: list[Line] = []
    for line in body:
        need = scratch_bytes(line) if isinstance(line, Instr) else 0
        if not need:
            result.append(line)
            continue
        assert isinstance(line, Instr)
        buffer = Buffer(names.take("scratch"), "u8", (need,))
        line.operands.append(("@scratch", buffer))
        result.extend([Alloc(buffer), line, Dealloc(buffer)])
    return result

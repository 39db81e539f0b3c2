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

* a Loop of the flat program (a ``scan``, a ``fori_loop``, a ``while``)
  becomes a ``loop`` with a nested body and an If a ``branch`` with two
  (:class:`Lowerer` says how their state and results are held in place).

What cannot be lowered — recursion the flattening cannot write as a loop, a
shape that is not concrete (a scan's stacked output of a run-time length),
strings — is an :class:`~anfir.errors.AnfirError` at the node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from anfir.abstract.values import AbstractValue, AScalar, ATensor
from anfir.dtypes import TYPE_NAMES, dtype_name, numpy_dtype
from anfir.errors import AnfirError
from anfir.flat.statements import (
    Block, Const, FlatProgram, IfOp, LoopOp, NameAllocator, Op, Undefined, Value, nest_by_structure,
    operand_values,
)
from anfir.flat.flatten import flatten_program
from anfir.ir.graph import FuncGraph
from anfir.location import Location
from anfir.runtime_values import DType
from anfir.lowlevel.program import (
    COPY, Alloc, Branch, Buffer, Dealloc, Instr, Line, Loop, LowProgram, Structure,
)
from anfir.flat.statements import DIM
from anfir.primitives import indexing, tensor
from anfir.lowlevel.kernels import ScratchMeasure
from anfir.lowlevel.rules import RULES, UNLOWERED, TensorType


@dataclass(eq=False)
class _Frame:
    """A block being lowered: its lines and its allocs (dealloc'd at its end)."""

    lines: list[Line]
    allocs: list[Buffer]
    owner: Any


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


Read = tuple[int, tuple[tuple[int, int], ...]]
"""Where a value is read: (position, the branches around the read as (if id, 0 or 1) pairs)."""


def _exclusive(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> bool:
    """Whether two positions lie in different branches of one ``if`` (never both run)."""
    taken = dict(a)
    return any(taken.get(if_id, branch) != branch for if_id, branch in b)


def _within(value: Value, block: Block) -> bool:
    """Whether ``value`` is defined in ``block`` or a block nested in it."""
    current = value.block
    while current is not None:
        if current is block:
            return True
        current = current.parent
    return False


class Lowerer:
    """One flat program written as a :class:`LowProgram`.

    Straight-line ops become instructions as before.  A :class:`LoopOp` becomes a
    :class:`Loop`: its carried state lives in buffers ``S_k`` of the enclosing block
    (the initial value's own buffer when it dies there, else a ``copy`` before the
    loop), the body reads ``S_k`` as its parameters and writes the next state back into
    them — a value the body computes goes straight into its ``S_k`` (``@inout`` when
    the instruction updates it in place, as ``scatter_nd`` writing row ``i`` of a
    stacked output) when the old state is not read after it, otherwise it is copied at
    the end of the body.  An :class:`IfOp` becomes a :class:`Branch` whose bodies
    write its results the same way.  So a scan's stacked output (the residuals of a
    gradient) is ONE buffer alloc'd before the loop and updated row by row.

    Whether a write into a buffer is legal is decided from where each flat value is
    read (:meth:`number`: positions in program order; a read inside a loop of a value
    from outside counts at the loop's end, since every iteration reads it; reads in
    the other branch of an ``if`` never conflict).  The walk over nested blocks uses
    an explicit stack of frames (no recursion on the program's nesting)."""

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
        self.dest: dict[int, Buffer] = {}
        """id(flat Value) → the buffer it should be written into (an output, a loop's
        state, a branch's result), where that is legal."""
        self.occupants: dict[Buffer, list[Value]] = {}
        """The flat values each buffer has held."""
        self.reads: dict[int, list[Read]] = {}
        self.position: dict[int, int] = {}
        """id(statement) → its position; id(block) → its end (where it yields)."""
        self.after: dict[int, int] = {}
        """id(LoopOp or IfOp) → the position right after it."""
        self.paths: dict[int, tuple[tuple[int, int], ...]] = {}
        self.frames: list[_Frame] = []
        self.count = 0
        """How many buffers the blocks have alloc'd (their names: a0, a1...)."""
        self.sizes: dict[Any, int] = {}
        """An unknown dimension (``_1``) → the size the program gives it: what ``zeros``
        makes for a loop's stacked output of a trip count the shape rule does not know
        (a ``fori_loop``'s ``hi - lo``), or a loop's initial state."""
        self.measured: dict[int, int] = {}
        """id(value of a ``dim`` op) → the size it reads off a buffer: a static argument
        when it sizes a ``zeros`` (the reversed scan of a twice-differentiated loop sizes
        its stacked outputs by the forward scan's ``dim(ys, 0)``)."""

    # -- where values are read ---------------------------------------------------------
    def number(self) -> None:
        """Positions of every statement and block end, and where each value is read."""
        counter = 0
        raw: list[tuple[Value, int, tuple[tuple[int, int], ...], tuple[LoopOp, ...]]] = []
        events: list[tuple[str, Any, tuple[tuple[int, int], ...], tuple[LoopOp, ...]]] = [
            ("block", self.flat.body, (), ())]
        while events:
            kind, item, path, loops = events.pop()
            if kind == "block":
                events.append(("end", item, path, loops))
                events.extend(("stmt", s, path, loops) for s in reversed(item.ops))
                continue
            here = counter
            counter += 1
            if kind == "after":
                self.after[id(item)] = here
                continue
            if kind == "end":
                self.position[id(item)] = here
                raw += [(v, here, path, loops) for v in operand_values(item.results)]
                continue
            self.position[id(item)] = here
            self.paths[id(item)] = path
            if isinstance(item, Op):
                raw += [(v, here, path, loops) for v in operand_values(item.args)]
            elif isinstance(item, LoopOp):
                raw += [(v, here, path, loops) for v in operand_values(item.init)]
                events.append(("after", item, path, loops))
                events.append(("block", item.body, path, (*loops, item)))
            elif isinstance(item, IfOp):
                raw.append((item.cond, here, path, loops))
                events.append(("after", item, path, loops))
                events.append(("block", item.else_block, (*path, (id(item), 1)), loops))
                events.append(("block", item.then_block, (*path, (id(item), 0)), loops))
        for value, at, path, loops in raw:
            for loop in loops:  # outermost first: read on every iteration of that loop
                if not _within(value, loop.body):
                    at, path = self.position[id(loop.body)], self.paths[id(loop)]
                    break
            self.reads.setdefault(id(value), []).append((at, path))

    def free_to_write(self, buffer: Buffer, at: int, path: tuple[tuple[int, int], ...],
                      inplace: Optional[Value] = None) -> bool:
        """Whether writing ``buffer`` at position ``at`` loses nothing: no value it holds
        is read later (``inplace``, read by the writing instruction itself, may be)."""
        for value in self.occupants.get(buffer, []):
            for where, where_path in self.reads.get(id(value), []):
                if where < at or (where > at and _exclusive(path, where_path)):
                    continue
                if where == at and value is inplace:
                    continue
                return False
        return True

    # -- the walk ----------------------------------------------------------------------
    def program(self) -> LowProgram:
        """Lower the whole program."""
        flat, loc = self.flat, self.graph.loc
        self.number()
        # Names first: the inputs', outputs' and values' own, then the buffers' (a0, c0...).
        for value in flat.inputs:
            self.names.take(value.name)
        out_names = [self.names.take(name) for name in flat.output_names]
        blocks = [flat.body]
        while blocks:  # every value's name, nested blocks' too: buffers take theirs after
            block = blocks.pop()
            for value in block.params:
                self.names.take(value.name)
            for statement in block.ops:
                for value in statement.results:
                    self.names.take(value.name)
                if isinstance(statement, LoopOp):
                    blocks.append(statement.body)
                elif isinstance(statement, IfOp):
                    blocks += [statement.then_block, statement.else_block]
        for index, value in enumerate(flat.inputs):
            dtype, shape = concrete_type(value.type, f"input %{value.name}", loc)
            buffer = Buffer(value.name, dtype, shape, "input", comment=f"parameter {index} of @{flat.name}")
            self.declares.append(buffer)
            self.bind(value, buffer)
        outputs: list[Buffer] = []
        for name, t, operand in zip(out_names, flat.output_types, flat.body.results):
            dtype, shape = concrete_type(t, f"output %{name}", loc)
            outputs.append(Buffer(name, dtype, shape, "output"))
        self.declares.extend(outputs)
        # An output computed by an op of the program is written there directly (its first claim).
        for buffer, operand in zip(outputs, flat.body.results):
            if isinstance(operand, Value) and id(operand) not in self.dest and id(operand) not in self.buffers:
                self.dest[id(operand)] = buffer
        top = _Frame(self.body, self.allocs, None)
        self.frames.append(top)
        self.walk(flat.body)
        for buffer, operand in zip(outputs, flat.body.results):
            if isinstance(operand, Value) and self.buffers.get(id(operand)) is buffer:
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

    def walk(self, root: Block) -> None:
        """Every statement of ``root`` and of the blocks in it, with an explicit stack:
        each entry is a block's statements still to lower, and what to do at its end."""
        stack: list[tuple[Any, Optional[Callable[[], None]]]] = [(iter(root.ops), None)]
        while stack:
            statements, on_end = stack[-1]
            statement = next(statements, None)
            if statement is None:
                stack.pop()
                if on_end is not None:
                    on_end()
                continue
            if isinstance(statement, LoopOp):
                stack.extend(self.loop(statement))
            elif isinstance(statement, IfOp):
                stack.extend(self.branch(statement))
            else:
                self.statement(statement)

    def concrete(self, t: AbstractValue, what: str, loc: Optional[Location]) -> tuple[str, tuple[int, ...]]:
        """:func:`concrete_type` with the unknown dimensions the program gave sizes to."""
        if isinstance(t, ATensor) and t.shape is not None and self.sizes:
            t = ATensor(t.dtype, tuple(self.sizes.get(d, d) if not isinstance(d, int) else d
                                       for d in t.shape))
        return concrete_type(t, what, loc)

    def learn(self, t: AbstractValue, shape: tuple[Any, ...]) -> None:
        """The sizes ``shape`` (concrete) gives the unknown dimensions of ``t``."""
        if isinstance(t, ATensor) and t.shape is not None and len(t.shape) == len(shape):
            for d, n in zip(t.shape, shape):
                if not isinstance(d, int) and isinstance(n, (int, np.integer)) and not isinstance(n, bool):
                    self.sizes.setdefault(d, int(n))

    def bind(self, value: Value, buffer: Buffer) -> None:
        """``value`` is held by ``buffer`` from now on."""
        self.buffers[id(value)] = buffer
        self.occupants.setdefault(buffer, []).append(value)

    def alloc(self, hint: str, dtype: str, shape: tuple[int, ...]) -> Buffer:
        """A new buffer of the current block (dealloc'd at its end)."""
        frame = self.frames[-1]
        self.count += 1
        buffer = Buffer(self.names.take(hint), dtype, shape)
        frame.allocs.append(buffer)
        frame.lines.append(Alloc(buffer))
        return buffer

    def copy(self, name: str, target: Buffer, source: Buffer, loc: Optional[Location]) -> None:
        """``copy @out target, @in source`` in the current block."""
        self.frames[-1].lines.append(Instr(self.names.take(name), COPY, [("@out", target), ("@in", source)],
                                           {}, loc))

    def loop(self, loop: LoopOp) -> list[tuple[Any, Optional[Callable[[], None]]]]:
        """A LoopOp: its state buffers and the ``Loop`` line; the body's frame to walk."""
        at, path, loc = self.position[id(loop)], self.paths[id(loop)], loop.loc
        if len(loop.body.results) != len(loop.body.params) + 1:  # the flattening's form
            raise LoweringError("a loop whose body does not yield a flag and its state", loc)
        state: list[Buffer] = []
        for k, (param, init) in enumerate(zip(loop.body.params, loop.init)):
            known = self.buffers.get(id(init)) if isinstance(init, Value) else None
            if known is not None:
                self.learn(param.type, known.shape)
            dtype, shape = self.concrete(param.type, f"the state {k} of the loop", loc)
            reuse = self.buffers.get(id(init)) if isinstance(init, Value) else None
            if (reuse is not None and reuse.kind == "alloc" and reuse not in state
                    and (reuse.dtype, reuse.shape) == (dtype, shape)
                    and sum(1 for i in loop.init if i is init) == 1
                    and isinstance(init, Value) and self.free_to_write(reuse, at, path, init)):
                state.append(reuse)  # the initial value dies here: the loop updates it in place
                continue
            buffer = self.alloc(f"s{self.count}", dtype, shape)
            if not isinstance(init, Undefined):  # (undefined: the body writes it before any read)
                self.copy(f"{param.name}_init", buffer, self.operand(init, loc, f"the initial state {k}"),
                          loc)
            state.append(buffer)
        flag = self.alloc("flag", "bool", ())
        lines: list[Line] = []
        self.frames[-1].lines.append(Loop(self.names.take("loop"), flag, lines, loc))
        for param, buffer in zip(loop.body.params, state):
            self.bind(param, buffer)
        targets = [flag, *state]
        for value, target in zip(loop.body.results, targets):
            if isinstance(value, Value) and _within(value, loop.body) and id(value) not in self.dest \
                    and value not in loop.body.params:
                self.dest[id(value)] = target
        frame = _Frame(lines, [], loop)
        self.frames.append(frame)

        def end() -> None:
            self.yields(loop.body.results, targets, loop.body, loc)
            self.close(frame)
            for value, buffer in zip(loop.results, state):
                self.bind(value, buffer)
        return [(iter(loop.body.ops), end)]

    def branch(self, branch: IfOp) -> list[tuple[Any, Optional[Callable[[], None]]]]:
        """An IfOp: its result buffers and the ``Branch`` line; the two bodies' frames."""
        loc, path = branch.loc, self.paths[id(branch)]
        cond = self.operand(branch.cond, loc, "the condition of an if")
        if (cond.dtype, cond.shape) != ("bool", ()):
            raise LoweringError(f"an if on %{cond.name}, which is not a bool scalar", loc)
        if cond.kind != "alloc":  # the executor reads a condition from the arena
            held = cond
            cond = self.alloc("cond", "bool", ())
            self.copy("cond", cond, held, loc)
        after = self.after[id(branch)]
        results: list[Buffer] = []
        for k, value in enumerate(branch.results):
            dtype, shape = self.concrete(value.type, f"the result {k} of an if", loc)
            hinted = self.dest.get(id(value))
            if (hinted is not None and (hinted.dtype, hinted.shape) == (dtype, shape)
                    and hinted not in results and self.free_to_write(hinted, after, path)):
                results.append(hinted)
            else:
                results.append(self.alloc(f"r{self.count}", dtype, shape))
        then_lines: list[Line] = []
        else_lines: list[Line] = []
        self.frames[-1].lines.append(Branch(self.names.take("if"), cond, then_lines, else_lines, loc))
        for block in (branch.then_block, branch.else_block):
            for yielded, target in zip(block.results, results):
                if isinstance(yielded, Value) and _within(yielded, block) and id(yielded) not in self.dest:
                    self.dest[id(yielded)] = target
        then_frame = _Frame(then_lines, [], branch)
        else_frame = _Frame(else_lines, [], branch)

        def end_then() -> None:
            self.yields(branch.then_block.results, results, branch.then_block, loc)
            self.close(then_frame)
            self.frames.append(else_frame)

        def end_else() -> None:
            self.yields(branch.else_block.results, results, branch.else_block, loc)
            self.close(else_frame)
            for value, buffer in zip(branch.results, results):
                self.bind(value, buffer)
        self.frames.append(then_frame)
        return [(iter(branch.else_block.ops), end_else), (iter(branch.then_block.ops), end_then)]

    def yields(self, operands: list[Any], targets: list[Buffer], block: Block, loc: Optional[Location]) -> None:
        """A block's results written into their targets at its end, as one parallel move
        (a source that another move of it overwrites is copied aside first)."""
        moves: list[tuple[Buffer, Buffer]] = []
        for k, (operand, target) in enumerate(zip(operands, targets)):
            if isinstance(operand, Undefined):
                continue  # a slot this block never fills: whatever the target holds
            source = self.operand(operand, loc, f"the result {k} of a block")
            if source is not target:
                moves.append((source, target))
        written = {id(target) for _, target in moves}
        for source, target in moves:
            if id(source) in written:
                aside = self.alloc(f"t{self.count}", source.dtype, source.shape)
                self.copy(f"{source.name}_aside", aside, source, loc)
                moves = [(aside if s is source else s, t) for s, t in moves]
        for source, target in moves:
            self.copy(f"{target.name}_next", target, source, loc)
        for operand, target in zip(operands, targets):
            if isinstance(operand, Value) and self.buffers.get(id(operand)) is not target:
                self.occupants.setdefault(target, []).append(operand)

    def close(self, frame: "_Frame") -> None:
        """The end of a body: its buffers' lives end."""
        for buffer in reversed(frame.allocs):
            frame.lines.append(Dealloc(buffer))
        self.frames.remove(frame)

    def statement(self, op: Op) -> None:
        """One op of the flat program: an alloc (unless it writes into its destination)
        and an instruction."""
        rule = RULES.get(op.prim)
        if rule is None and op.prim is not DIM:
            reason = UNLOWERED.get(op.prim, "no rule in anfir/lowlevel/rules.py")
            raise LoweringError(f"cannot lower {op.prim.name}: {reason}", op.loc)
        if len(op.results) != 1:
            raise LoweringError(f"cannot lower {op.prim.name} with {len(op.results)} results", op.loc)
        (value,) = op.results
        if op.prim is DIM and isinstance(op.args[0], Value) and isinstance(op.args[1], Const):
            # A dimension the types leave unknown is concrete once its buffer exists.
            measured = self.buffers.get(id(op.args[0]))
            axis = op.args[1].value
            if measured is not None and isinstance(axis, int) and -len(measured.shape) <= axis < len(measured.shape):
                self.bind(value, self.constant(Const(measured.shape[axis]), "a dimension", op.loc))
                self.measured[id(value)] = int(measured.shape[axis])
                return
        if op.prim is tensor.zeros and op.args and isinstance(op.args[0], tuple) \
                and all(self.knows(a) for a in op.args[0]):
            self.learn(value.type, tuple(self.static(a, "a size", op.loc) for a in op.args[0]))
        if rule is None:
            raise LoweringError(f"cannot lower {op.prim.name}: {UNLOWERED[op.prim]}", op.loc)
        dtype, shape = self.concrete(value.type, f"the result of {op.prim.name}", op.loc)
        statics: dict[str, Any] = {}
        inputs: list[tuple[str, Buffer]] = []
        read: list[Any] = []
        for position, arg in enumerate(op.args):
            what = f"argument {position} of {op.prim.name}"
            if position in rule.shape_only:
                statics[f"arg{position}"] = TensorType(*self.type_of(arg, what, op.loc))
            elif position in rule.static or _is_static(arg):
                statics[f"arg{position}"] = self.static(arg, what, op.loc)
            else:
                inputs.append(("@in", self.operand(arg, op.loc, what)))
                read.append(arg)
        statics.update(op.attrs)
        output = self.dest.get(id(value))
        if output is not None and (output.dtype, output.shape) != (dtype, shape):
            if output.kind == "output":  # the flattening types both alike
                raise LoweringError(f"output %{output.name} is {output.dtype}{list(output.shape)} but its "
                                    f"value is {dtype}{list(shape)}", op.loc)
            output = None
        operands: Optional[list[tuple[str, Buffer]]] = None
        if output is not None and output.kind != "output":
            # Into the destination when nothing it holds is read later; updating an
            # argument held there in place when the instruction can (elementwise, or
            # scatter_nd's rows written into its first argument).
            at, path = self.position[id(op)], self.paths[id(op)]
            aliased = [i for i, (_, b) in enumerate(inputs) if b is output]
            inplace_ok = len(aliased) == 1 and (rule.inplace or (op.prim is indexing.scatter_nd
                                                                  and aliased == [0]))
            victim = read[aliased[0]] if inplace_ok else None
            if aliased and victim is None:
                output = None
            elif not self.free_to_write(output, at, path, victim):
                output = None
            elif aliased:
                operands = [("@inout" if i == aliased[0] else mode, b) for i, (mode, b) in enumerate(inputs)]
        if output is None:
            output = self.alloc(f"a{self.count}", dtype, shape)
        self.bind(value, output)
        self.frames[-1].lines.append(Instr(value.name, op.prim, operands or [("@out", output), *inputs],
                                           statics, op.loc))

    def type_of(self, arg: Any, what: str, loc: Optional[Location]) -> tuple[str, tuple[int, ...]]:
        """The concrete type of an argument read only for its type."""
        if isinstance(arg, Value):
            return self.concrete(arg.type, what, loc)
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
        if isinstance(arg, Value) and id(arg) in self.measured:
            return self.measured[id(arg)]
        if isinstance(arg, tuple) and all(self.knows(a) for a in arg):
            return tuple(self.static(a, what, loc) for a in arg)
        raise LoweringError(f"{what} must be known when lowering (a static argument), "
                            "but it is computed at run time", loc)

    def knows(self, arg: Any) -> bool:
        """Whether an operand's value is known when lowering: a constant, or a dimension
        measured off a buffer of concrete shape."""
        return isinstance(arg, Const) or isinstance(arg, Value) and id(arg) in self.measured

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
    takes besides the declared inputs, outputs and constants.  Loop and branch bodies
    are rewritten the same way (an explicit stack of bodies, no recursion)."""
    root: list[Line] = []
    stack: list[tuple[list[Line], list[Line]]] = [(body, root)]
    while stack:
        source, result = stack.pop()
        for line in source:
            if isinstance(line, Loop):
                inner: list[Line] = []
                stack.append((line.body, inner))
                line.body = inner
            elif isinstance(line, Branch):
                then_lines: list[Line] = []
                else_lines: list[Line] = []
                stack += [(line.then_body, then_lines), (line.else_body, else_lines)]
                line.then_body, line.else_body = then_lines, else_lines
            need = scratch_bytes(line) if isinstance(line, Instr) else 0
            if not need:
                result.append(line)
                continue
            assert isinstance(line, Instr)
            buffer = Buffer(names.take("scratch"), "u8", (need,))
            line.operands.append(("@scratch", buffer))
            result.extend([Alloc(buffer), line, Dealloc(buffer)])
    return root

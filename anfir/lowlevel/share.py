"""``share_buffers``: Glow's IR optimizer on a lowered program.

First each instruction that writes a declared output moves up to right after
the instructions it reads from (:func:`schedule_outputs`).  Then three steps,
in one walk over the instructions:

1. **dealloc after last use** — each buffer's life ends right after the last
   instruction that reads or writes it (``lower`` put every dealloc at the end);
2. **in place** — an instruction whose rule allows it (elementwise) writes its
   result over a data argument of the same dtype and shape that dies at this
   instruction (its old value is never read again): that operand becomes
   ``@inout`` and the result needs no buffer of its own;
3. **reuse** — otherwise, a buffer of the same dtype and shape whose life has
   ended is taken again instead of a new alloc, if no new alloc came since it
   died: the reused buffer is then allocated through the gap, and only while
   nothing new was allocated does that hold no more bytes than were live
   when it died (a buffer dead for longer would hold its bytes through a
   peak in between, where a new alloc lets the planner give them to what
   lives there).

The arena's planner (``plan_memory``) then shares bytes between buffers of any
size whose lives do not overlap.
"""

from __future__ import annotations

from typing import Any

from anfir.lowlevel.program import (
    Alloc, Branch, Buffer, Dealloc, Instr, Line, Loop, LowProgram, has_control_flow, linear,
)
from anfir.lowlevel.rules import RULES


def schedule_outputs(instrs: list[Instr]) -> list[Instr]:
    """The instructions with each one that writes a declared output moved up to right
    after the last instruction it reads from.

    Such an instruction needs no arena memory for its result, and its arguments may
    die sooner: the optimized gradient graph computes, for instance, every weight
    gradient at the end of the backward pass, which keeps each layer's input and
    output gradient alive until then.  In ``lower``'s program every value has a buffer
    of its own, written once, so an instruction can run as soon as its arguments exist.
    Linear: each moved instruction is attached to the one it must follow, and the
    list is written out in one walk (attached instructions in their original order)."""
    writer: dict[int, int] = {}
    """id of a buffer → the index of the instruction that writes it."""
    attached: dict[int, list[int]] = {}
    """index of an instruction (-1: the start) → the moved instructions that follow it."""
    kept: list[int] = []
    for index, instr in enumerate(instrs):
        if instr.output.kind == "output":
            after = max((writer.get(id(b), -1) for b in instr.inputs), default=-1)
            attached.setdefault(after, []).append(index)
        else:
            kept.append(index)
        writer[id(instr.output)] = index
    order: list[int] = []
    stack = list(reversed(attached.get(-1, [])))
    for index in [*kept, -1]:  # -1: the end (what is attached to the start is written first)
        while stack:
            moved = stack.pop()
            order.append(moved)
            stack.extend(reversed(attached.get(moved, [])))
        if index >= 0:
            order.append(index)
            stack.extend(reversed(attached.get(index, [])))
    return [instrs[i] for i in order]


def share_buffers(program: LowProgram) -> LowProgram:
    """A new program with fewer, shorter-lived buffers and the same results."""
    if has_control_flow(program.body):
        return share_structured(program)
    instrs = schedule_outputs(program.instructions())
    last_use: dict[Buffer, int] = {}
    for index, instr in enumerate(instrs):
        for _, buffer in instr.operands:
            if buffer.kind == "alloc":
                last_use[buffer] = index
    physical: dict[Buffer, Buffer] = {}
    """A buffer of the lowered program → the buffer that holds it now."""
    free: dict[tuple[str, tuple[int, ...]], list[Buffer]] = {}
    dying: dict[int, list[Buffer]] = {}
    """Instruction index → the (lowered) buffers whose last use it is."""
    for buffer, index in last_use.items():
        dying.setdefault(index, []).append(buffer)
    current: dict[Buffer, Buffer] = {}
    """A buffer holding values → the (lowered) buffer of the value it holds now."""
    new_instrs: list[Instr] = []
    for index, instr in enumerate(instrs):
        operands = [(mode, physical.get(b, b)) for mode, b in instr.operands]
        out_mode, out = instr.operands[0]
        if out_mode == "@out" and out.kind == "alloc":
            rule = RULES.get(instr.prim)
            inplace = None
            if rule is not None and rule.inplace:
                for position, (mode, original) in enumerate(instr.operands[1:], start=1):
                    if (mode != "@scratch" and original.kind == "alloc" and last_use[original] == index
                            and (original.dtype, original.shape) == (out.dtype, out.shape)):
                        inplace = position
                        break
            if inplace is not None:
                target = operands[inplace][1]
                physical[out] = target
                current[target] = out
                operands = [("@inout" if i == inplace else mode, b)
                            for i, (mode, b) in enumerate(operands) if i > 0]
            else:
                pool = free.get((out.dtype, out.shape))
                target = pool.pop() if pool else out
                if target is out:
                    free.clear()  # a new alloc: what died before may no longer be taken again
                physical[out] = target
                current[target] = out
                operands[0] = ("@out", target)
        new_instrs.append(Instr(instr.name, instr.prim, operands, dict(instr.statics), instr.loc))
        # What dies here goes back to the pool, unless its holder took a new value in place.
        for original in sorted(dying.get(index, []), key=lambda b: b.name):
            holder = physical.get(original, original)
            if current.get(holder) is original:
                free.setdefault((holder.dtype, holder.shape), []).append(holder)
    return LowProgram(program.name, program.declares, _with_lives(new_instrs), program.params,
                      program.result)


def _with_lives(instrs: list[Instr]) -> list[Line]:
    """The instructions with each alloc'd buffer's alloc right before its first
    use and its dealloc right after its last."""
    first: dict[Buffer, int] = {}
    last: dict[Buffer, int] = {}
    for index, instr in enumerate(instrs):
        for _, buffer in instr.operands:
            if buffer.kind == "alloc":
                first.setdefault(buffer, index)
                last[buffer] = index
    opens: dict[int, list[Buffer]] = {}
    closes: dict[int, list[Buffer]] = {}
    for buffer, index in first.items():
        opens.setdefault(index, []).append(buffer)
    for buffer, index in last.items():
        closes.setdefault(index, []).append(buffer)
    body: list[Line] = []
    for index, instr in enumerate(instrs):
        body.extend(Alloc(b) for b in opens.get(index, []))
        body.append(instr)
        body.extend(Dealloc(b) for b in closes.get(index, []))
    return body


def share_structured(program: LowProgram) -> LowProgram:
    """``share_buffers`` of a program with loops or branches: in each body (the program
    section too), every buffer alloc'd there is alloc'd right before its first use and
    dealloc'd right after its last, a loop or a branch counting as one use of every
    buffer it touches (its flag or condition, and what its bodies read or write): a
    buffer a loop's body reads from outside lives through the whole loop.  The lowering
    already writes the state and the stacked outputs in place; the planner then shares
    bytes between buffers whose lives do not overlap, inside bodies as well.  Every body
    is taken on its own, from an explicit list (no recursion)."""
    touched: dict[int, set[Buffer]] = {}
    """id(Loop or Branch) → the buffers it and its bodies use."""
    # Innermost first: a statement's set is its own plus those of the statements in it.
    for line in reversed(linear(program.body)):
        if isinstance(line, (Loop, Branch)):
            inner = [line.body] if isinstance(line, Loop) else [line.then_body, line.else_body]
            used: set[Buffer] = {line.flag if isinstance(line, Loop) else line.cond}
            for body in inner:
                for item in body:
                    used |= _uses(item, touched)
            touched[id(line)] = used
    bodies: list[Any] = [program]
    bodies += [line for line in linear(program.body) if isinstance(line, (Loop, Branch))]
    for owner in bodies:
        if isinstance(owner, Branch):
            owner.then_body = _relive(owner.then_body, touched)
            owner.else_body = _relive(owner.else_body, touched)
        else:
            owner.body = _relive(owner.body, touched)
    return LowProgram(program.name, program.declares, program.body, program.params, program.result)


def _uses(line: Line, touched: dict[int, set[Buffer]]) -> set[Buffer]:
    """The buffers a line uses (a loop's or branch's: all its bodies use)."""
    if isinstance(line, Instr):
        return {b for _, b in line.operands}
    if isinstance(line, (Loop, Branch)):
        return touched[id(line)]
    return set()


def _relive(body: list[Line], touched: dict[int, set[Buffer]]) -> list[Line]:
    """One body with each of its own allocs right before the first use and its dealloc
    right after the last."""
    own = [line.buffer for line in body if isinstance(line, Alloc)]
    items = [line for line in body if not isinstance(line, (Alloc, Dealloc))]
    first: dict[Buffer, int] = {}
    last: dict[Buffer, int] = {}
    mine = set(own)
    for index, item in enumerate(items):
        for buffer in sorted(_uses(item, touched), key=lambda b: b.name):
            if buffer in mine:
                first.setdefault(buffer, index)
                last[buffer] = index
    opens: dict[int, list[Buffer]] = {}
    closes: dict[int, list[Buffer]] = {}
    for buffer in own:  # in alloc order: the printed program is the same on every run
        if buffer in first:
            opens.setdefault(first[buffer], []).append(buffer)
            closes.setdefault(last[buffer], []).append(buffer)
    result: list[Line] = []
    for index, item in enumerate(items):
        result.extend(Alloc(b) for b in opens.get(index, []))
        result.append(item)
        result.extend(Dealloc(b) for b in closes.get(index, []))
    return result


__all__ = ["share_buffers", "share_structured"]

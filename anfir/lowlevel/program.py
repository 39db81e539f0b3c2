"""The low-level program: instructions over explicit buffers (Glow's instruction IR).

A :class:`LowProgram` has Glow's two sections:

* ``declare`` — :class:`Buffer` s that live through the whole program: the
  entry's inputs, its outputs and the constants the instructions read;
* ``program`` — a straight list of :class:`Alloc`, :class:`Instr` and
  :class:`Dealloc`.  An ``alloc`` starts the life of a buffer of the arena,
  a ``dealloc`` ends it; after memory planning every alloc'd buffer has a
  byte ``offset`` in one arena.

An :class:`Instr` applies one primitive.  Its operands are buffers, each
marked ``@out`` (written), ``@in`` (read) or ``@inout`` (read, then written in
place).  The output is the leading ``@out`` operand, or else the one
``@inout`` operand; the primitive's data arguments are the other operands in
argument order (an ``@inout`` one included).  Arguments that are not data —
attributes (``axis``), static arguments (a shape), arguments read only for
their shape and dtype — are the instruction's ``statics``, printed in
``[...]`` after the primitive's name.

The figures of the header (:func:`figures`): ``max live`` (the most arena
bytes live at one instruction — the lower bound of the arena for this order),
``no sharing`` (every value written into the arena in a buffer of its own)
and ``arena`` (the planned size).  Sizes are padded to :data:`ALIGN` bytes,
the alignment of every offset, in all three.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from anfir.dtypes import numpy_dtype
from anfir.ir.primitive import Primitive
from anfir.location import Location

ALIGN = 64
"""The alignment of every buffer's offset in the arena, and the unit sizes are padded to (a cache line, as Glow)."""

KINDS = ("input", "output", "constant")
"""The kinds of ``declare`` entries."""

MODES = ("@out", "@in", "@inout", "@scratch")
"""How an instruction uses an operand (``@scratch``: a ``u8`` buffer of the arena that
the instruction's kernel uses as working memory, alive for that instruction only)."""


@dataclass(eq=False)
class Buffer:
    """A named piece of memory: a ``declare`` entry or an ``alloc`` of the arena."""

    name: str
    """Unique in the program (printed ``%name``)."""
    dtype: str
    """anfir's element type name (``f64``, ``i64``, ``bool``...)."""
    shape: tuple[int, ...]
    """Concrete dimensions (``()`` for a scalar)."""
    kind: str = "alloc"
    """``input``, ``output``, ``constant`` (declared) or ``alloc`` (in the arena)."""
    value: Any = None
    """A constant's value: a Python scalar or a numpy array."""
    offset: Optional[int] = None
    """An alloc's byte offset in the arena, once planned."""
    comment: str = ""
    """What a declare entry stands for (``parameter 0 of @f``), printed after it."""

    @property
    def nbytes(self) -> int:
        """The bytes the buffer's elements take."""
        return math.prod(self.shape) * numpy_dtype(self.dtype).itemsize  # (Python ints: no overflow)

    @property
    def size(self) -> int:
        """The bytes it takes in the arena: :attr:`nbytes` padded to :data:`ALIGN`."""
        return -(-max(self.nbytes, 1) // ALIGN) * ALIGN

    def __repr__(self) -> str:
        return f"%{self.name}"


@dataclass(eq=False)
class Alloc:
    """``%a = alloc TYPE [@ OFFSET]``: the buffer's life starts."""

    buffer: Buffer


@dataclass(eq=False)
class Dealloc:
    """``dealloc %a``: the buffer's life ends."""

    buffer: Buffer


@dataclass(eq=False)
class Instr:
    """``%name = prim[statics] MODE %buffer, ...``."""

    name: str
    """The value it computes (unique; from the source's names)."""
    prim: Primitive
    operands: list[tuple[str, Buffer]]
    """``(mode, buffer)`` pairs in printed order."""
    statics: dict[str, Any] = field(default_factory=dict)
    """Attributes and arguments that are not data, by name (``argN`` for positional ones)."""
    loc: Optional[Location] = None
    """The source location of the node it came from."""

    @property
    def output(self) -> Buffer:
        """The buffer the instruction writes."""
        if self.operands and self.operands[0][0] == "@out":
            return self.operands[0][1]
        for mode, buffer in self.operands:
            if mode == "@inout":
                return buffer
        raise ValueError(f"instruction %{self.name} has no output")  # the builders never make one

    @property
    def inputs(self) -> list[Buffer]:
        """The data arguments, in argument order."""
        start = 1 if self.operands and self.operands[0][0] == "@out" else 0
        return [buffer for mode, buffer in self.operands[start:] if mode != "@scratch"]

    @property
    def scratch(self) -> Optional[Buffer]:
        """The instruction's scratch buffer (its kernel's working memory), if it has one."""
        for mode, buffer in self.operands:
            if mode == "@scratch":
                return buffer
        return None


@dataclass(eq=False)
class Loop:
    """``%name = loop while %flag { body }``: a do-while loop (what a ``scan`` or a
    ``fori_loop`` becomes).  The body runs, then the loop goes on while the ``bool``
    scalar ``flag`` (an alloc of the enclosing block, written by the body) is true.
    The carried state lives in buffers of the enclosing block that the body reads and
    writes in place; a buffer alloc'd in the body lives within one iteration."""

    name: str
    flag: Buffer
    body: list["Line"]
    loc: Optional[Location] = None


@dataclass(eq=False)
class Branch:
    """``%name = if %cond { then } else { else }``: one of two bodies, on a ``bool``
    scalar; each body writes the branch's results into buffers of the enclosing block."""

    name: str
    cond: Buffer
    then_body: list["Line"]
    else_body: list["Line"]
    loc: Optional[Location] = None


Line = Union[Alloc, Instr, Dealloc, Loop, Branch]


def linear(body: list[Line]) -> list[Line]:
    """Every line of ``body`` and of the bodies nested in it, in program order: a loop or
    a branch, then its body's lines (a branch's ``then`` body before its ``else`` body).
    This order is the time line the lives, ``max live`` and the planner count on: a
    buffer alloc'd around a loop lives through all of the body, one alloc'd in the body
    within it (one iteration).  Iterative, however deeply bodies nest."""
    out: list[Line] = []
    stack: list[Any] = [iter(body)]
    while stack:
        item = next(stack[-1], None)
        if item is None:
            stack.pop()
            continue
        out.append(item)
        if isinstance(item, Loop):
            stack.append(iter(item.body))
        elif isinstance(item, Branch):
            stack.append(iter(item.else_body))
            stack.append(iter(item.then_body))
    return out


def has_control_flow(body: list[Line]) -> bool:
    """Whether a program section holds a loop or a branch."""
    return any(isinstance(line, (Loop, Branch)) for line in body)

Structure = Any
"""How flat buffers nest into the entry's tuples: a Buffer, None, or a tuple of structures."""


@dataclass(eq=False)
class LowProgram:
    """A whole lowered entry."""

    name: str
    """The entry graph's name."""
    declares: list[Buffer]
    """Inputs, outputs and constants, in printed order."""
    body: list[Line]
    """The program section."""
    params: Structure
    """A tuple with one structure per parameter of the entry."""
    result: Structure
    """The entry's result as a structure of declared buffers."""
    phase: str = ""
    """The numbered phase that made it (``08_plan_memory``)."""
    arena_bytes: Optional[int] = None
    """The planned arena's size (None before ``plan_memory``)."""

    @property
    def peak_bytes(self) -> Optional[int]:
        """The arena's size once planned (``arena`` in the header)."""
        return self.arena_bytes

    @property
    def max_live_bytes(self) -> int:
        """The most arena bytes live at one instruction (the lower bound for this order)."""
        return max_live(self)

    @property
    def naive_bytes(self) -> int:
        """The arena bytes if every value had a buffer of its own (``no sharing``)."""
        return no_sharing(self)

    def allocs(self) -> list[Buffer]:
        """The arena's buffers, in the order of their allocs."""
        return [line.buffer for line in linear(self.body) if isinstance(line, Alloc)]

    def instructions(self) -> list[Instr]:
        """The instructions, in order (those of loop and branch bodies in :func:`linear` order)."""
        return [line for line in linear(self.body) if isinstance(line, Instr)]


def lives(program: LowProgram) -> dict[Buffer, tuple[int, int]]:
    """Each alloc'd buffer's life ``(first, last)``: the indices, among the
    instructions, of the first and the last instruction between its alloc and
    its dealloc (an unused alloc lives at the next instruction only)."""
    opened: dict[Buffer, int] = {}
    result: dict[Buffer, tuple[int, int]] = {}
    index = 0
    for line in linear(program.body):
        if isinstance(line, Alloc):
            opened[line.buffer] = index
        elif isinstance(line, Dealloc):
            start = opened.pop(line.buffer)
            result[line.buffer] = (start, max(start, index - 1))
        elif isinstance(line, Instr):
            index += 1
    for buffer, start in opened.items():  # never deallocated: lives to the end
        result[buffer] = (start, max(start, index - 1))
    return result


def live_bytes(program: LowProgram) -> list[int]:
    """The arena bytes live at each instruction."""
    count = len(program.instructions())
    delta = [0] * (count + 1)
    for buffer, (start, end) in lives(program).items():
        delta[start] += buffer.size
        delta[end + 1] -= buffer.size
    live, total = [], 0
    for step in delta[:count]:
        total += step
        live.append(total)
    return live


def max_live(program: LowProgram) -> int:
    """The most arena bytes live at one instruction."""
    return max(live_bytes(program), default=0)


def no_sharing(program: LowProgram) -> int:
    """The arena bytes if each value an instruction writes into the arena, and each
    instruction's scratch, had a buffer of its own."""
    total = 0
    for line in linear(program.body):
        if isinstance(line, Instr):
            if line.output.kind == "alloc":
                total += line.output.size
            scratch = line.scratch
            if scratch is not None:
                total += scratch.size
    return total


def figures(program: LowProgram) -> dict[str, Optional[int]]:
    """The header's figures: ``arena`` (None before planning), ``max live``, ``no sharing``."""
    return {"arena": program.arena_bytes, "max live": max_live(program),
            "no sharing": no_sharing(program)}


# -- the operation only the low level has ------------------------------------------------
def _copy_impl(x: Any) -> Any:
    """``copy(x)`` — x itself (the executor copies it into the output buffer)."""
    return x


COPY = Primitive("copy", _copy_impl, 1, 1, doc="copy(x) — x written into another buffer (an output that "
                 "is an input, a constant or another output)", internal=True, family="lowlevel",
                 differentiable=False)
"""Not in the op library's registry: the lowering writes it for an output that
no instruction computes into (an input, a constant, a value returned twice)."""

PSEUDO_PRIMITIVES: tuple[Primitive, ...] = (COPY,)
"""The operations a low-level program may hold besides the op library's (and the flat program's)."""


__all__ = ["ALIGN", "Alloc", "Branch", "Buffer", "COPY", "Dealloc", "Instr", "Loop", "has_control_flow", "linear", "KINDS", "Line", "LowProgram", "MODES",
           "PSEUDO_PRIMITIVES", "Structure", "figures", "live_bytes", "lives", "max_live", "no_sharing"]

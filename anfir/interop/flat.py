"""A first-order, closure-free program: what every exporter writes out.

:func:`anfir.interop.flatten.flatten_program` walks anfir's optimized graph
and produces a :class:`FlatProgram`; an exporter (``onnx_export``, and Core ML
later) turns it into its target's format through a table of rules keyed by
the primitive objects.  The flat program has only what such targets have:

* :class:`Value` — a tensor with a name and a type (an :class:`~anfir.abstract.values.AScalar`
  is a 0-d tensor, an :class:`~anfir.abstract.values.AString` a 0-d string tensor);
* :class:`Op` — one primitive applied to operands, making result values;
* :class:`IfOp` — a conditional with two :class:`Block` s, each yielding the results;
* :class:`LoopOp` — a do-while loop whose body :class:`Block` maps the carried
  state to ``[continue?, *next state]``;
* operands that are values, :class:`Const` ants (Python scalars, strings,
  None, numpy arrays, dtypes — the static arguments of an op such as an axis),
  :class:`Undefined` (a value of a type that is never read: what a branch
  yields for a slot only the other branch fills), or tuples of operands (a
  shape whose dimensions are partly computed).

There are no tuples, closures, gradient environments or calls of graphs left:
the walker has taken them apart.  Blocks nest (a branch sees the values of the
blocks around it), and names are unique across the whole program.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

import numpy as np

from anfir.abstract.values import AbstractValue, AScalar, AString, ATensor
from anfir.ir.primitive import Primitive
from anfir.location import Location


@dataclass(eq=False)
class Value:
    """A tensor of the flat program."""

    name: str
    """Unique in the whole program."""
    type: AbstractValue
    """``AScalar`` (no value), ``ATensor`` or ``AString``."""
    block: Optional["Block"] = None
    """The block that defines it (values of enclosing blocks are visible)."""
    maybe_undefined: bool = False
    """True when it may hold an :class:`Undefined` placeholder (a branch that
    never fills it was taken): a consumer must not read it eagerly (``Where``)."""

    def __repr__(self) -> str:
        return f"%{self.name}:{self.type}"


@dataclass(frozen=True, eq=False)
class Const:
    """A constant operand: a Python scalar, string, None, numpy array, dtype, tuple..."""

    value: Any
    type: Optional[AbstractValue] = None
    """The type the constant stands for (``1.0`` may be an f32 scalar); None: its own."""


@dataclass(frozen=True)
class Undefined:
    """A value of ``type`` that is never read (an unfilled branch slot, a loop's
    result before the first iteration)."""

    type: AbstractValue


Operand = Union[Value, Const, Undefined, tuple]
"""What an op reads: a value, a constant, a placeholder, or a tuple of operands."""


@dataclass(eq=False)
class Op:
    """``results = prim(*args)``."""

    prim: Primitive
    args: tuple[Operand, ...]
    results: tuple[Value, ...]
    loc: Optional[Location] = None
    """Where the anfir node came from (the exporter writes it as the node's doc string)."""


@dataclass(eq=False)
class IfOp:
    """``results = then_block if cond else else_block`` (each block yields ``len(results)`` operands)."""

    cond: Value
    then_block: "Block"
    else_block: "Block"
    results: tuple[Value, ...]
    loc: Optional[Location] = None


@dataclass(eq=False)
class LoopOp:
    """A do-while loop: ``state = init; do { flag, *state = body(*state) } while flag``.

    ``body.params`` are the carried state, ``body.results`` are ``[flag, *next
    state]``; ``results`` are the state after the last iteration.
    """

    init: tuple[Operand, ...]
    body: "Block"
    results: tuple[Value, ...]
    loc: Optional[Location] = None


Statement = Union[Op, IfOp, LoopOp]


@dataclass(eq=False)
class Block:
    """A straight-line list of statements with parameters and results."""

    parent: Optional["Block"] = None
    params: list[Value] = field(default_factory=list)
    ops: list[Statement] = field(default_factory=list)
    results: list[Operand] = field(default_factory=list)

    def sees(self, value: Value) -> bool:
        """Whether ``value`` is defined in this block or one around it."""
        block: Optional[Block] = self
        while block is not None:
            if value.block is block:
                return True
            block = block.parent
        return False


Structure = Any
"""How flat names nest into the program's tuples: a name (str), None, or a list
of structures (JSON-friendly)."""


@dataclass(eq=False)
class FlatProgram:
    """A whole exported program."""

    name: str
    """The entry graph's name."""
    inputs: list[Value]
    """The entry's parameters, flattened (a tuple parameter gives several)."""
    input_structure: list[Structure]
    """One structure per entry parameter."""
    body: Block
    """The main block: its results are the outputs, in the order of ``output_names``."""
    output_names: list[str]
    """One name per result of ``body``."""
    output_structure: Structure
    """How ``output_names`` nest into the entry's result."""
    output_types: list[AbstractValue]
    """The type of each output."""
    names: "NameAllocator"
    """The names taken so far (an exporter takes its temporaries from it)."""
    metadata: dict[str, str] = field(default_factory=dict)
    """Facts about the source (entry, file, signature), for the target's metadata."""


class NameAllocator:
    """Unique, deterministic names: the hint itself, then ``hint_1``, ``hint_2``..."""

    def __init__(self) -> None:
        self._taken: set[str] = set()
        self._next: dict[str, int] = {}

    def take(self, hint: str) -> str:
        """A new name based on ``hint``, not taken before."""
        hint = hint or "t"
        if hint not in self._taken:
            self._taken.add(hint)
            return hint
        k = self._next.get(hint, 1)
        while f"{hint}_{k}" in self._taken:
            k += 1
        self._next[hint] = k + 1
        name = f"{hint}_{k}"
        self._taken.add(name)
        return name


# -- the operations only the flat program has --------------------------------------------
def _dim_impl(x: Any, axis: int) -> int:
    return int(np.shape(x)[axis])


DIM = Primitive("dim", _dim_impl, 2, 2,
                doc="dim(x, axis) — the size of one axis of x, an i64 scalar "
                    "(what shape(x) gives for a dimension known only at run time)",
                internal=True, family="flat", differentiable=False)
"""Not in the op library's registry (programs cannot name it): the walker makes
it for ``shape(x)[i]`` when the dimension is symbolic."""

PSEUDO_PRIMITIVES: tuple[Primitive, ...] = (DIM,)
"""The operations a flat program may hold besides the op library's: every target needs a rule."""


# -- types ----------------------------------------------------------------------------
def dtype_of_type(t: AbstractValue) -> str:
    """The element type of a flat value's type: ``f64``, ``i64``, ``bool``, ``str``..."""
    if isinstance(t, (AScalar, ATensor)):
        return t.dtype
    if isinstance(t, AString):
        return "str"
    raise TypeError(f"not a flat value type: {t}")


def shape_of_type(t: AbstractValue) -> Optional[tuple[Any, ...]]:
    """The shape of a flat value's type: ``()`` for scalars and strings, None when unknown."""
    if isinstance(t, ATensor):
        return t.shape
    return ()


def is_value_type(t: Any) -> bool:
    """Whether ``t`` can type a flat value (a scalar, tensor or string)."""
    return isinstance(t, (AScalar, ATensor, AString))


__all__ = [
    "Block", "Const", "DIM", "FlatProgram", "IfOp", "LoopOp", "NameAllocator", "Op", "Operand",
    "PSEUDO_PRIMITIVES", "Statement", "Structure", "Undefined", "Value", "dtype_of_type",
    "is_value_type", "shape_of_type",
]

"""A first-order, closure-free program: what every exporter writes out.

:func:`anfir.flat.flatten.flatten_program` walks anfir's optimized graph
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

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from anfir.abstract.shapes import dims_equal, is_unknown_dim
from anfir.abstract.values import AbstractValue, AScalar, AString, ATensor
from anfir.dtypes import dtype_name, is_bool, is_float, is_integer, literal_dtype, numpy_dtype
from anfir.errors import ExportError
from anfir.ir.primitive import Primitive
from anfir.location import Location
from anfir.primitives import collective
from anfir.primitives.batching import BATCHING_PRIMITIVES
from anfir.runtime_values import DType


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
    attrs: dict[str, Any] = field(default_factory=dict)
    """The primitive's attributes (``axis``, ``keepdims``...), every one with its value
    (defaults filled in); empty for a primitive without attributes."""


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
        """No name taken yet."""
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


# -- dead code -----------------------------------------------------------------------------
def prune(program: FlatProgram) -> int:
    """Remove the ops whose results nothing reads, and the ``If`` results nothing
    reads (with what each branch yields for them).  Loops stay whole (their
    state is carried).  Returns how many statements and results went.

    The walker evaluates every node of a graph, so values only a part it took
    apart needed (a forward value no gradient reads, a negated condition) are
    left behind; this keeps the model to what runs.  Use counts and a
    worklist: linear in the program's size.
    """
    uses: dict[int, int] = {}
    owner: dict[int, Statement] = {}
    blocks: list[Block] = []
    stack = [program.body]
    while stack:
        block = stack.pop()
        blocks.append(block)
        for statement in block.ops:
            for value in statement.results:
                owner[id(value)] = statement
            for value in _reads(statement):
                uses[id(value)] = uses.get(id(value), 0) + 1
            stack += _inner_blocks(statement)
        for value in operand_values(block.results):
            uses[id(value)] = uses.get(id(value), 0) + 1
    dead: set[int] = set()
    removed: set[int] = set()
    count = 0
    work = [v for statement in owner.values() for v in statement.results if not uses.get(id(v))]
    while work:
        value = work.pop()
        if id(value) in dead or uses.get(id(value)):
            continue
        statement = owner[id(value)]
        freed: list[Value] = []
        if isinstance(statement, LoopOp) or id(statement) in removed:
            continue
        if isinstance(statement, IfOp):
            gone = [i for i, v in enumerate(statement.results) if not uses.get(id(v))]
            keep = [i for i in range(len(statement.results)) if i not in gone]
            for branch in (statement.then_block, statement.else_block):
                freed += operand_values([branch.results[i] for i in gone])
                branch.results = [branch.results[i] for i in keep]
            dead.update(id(statement.results[i]) for i in gone)
            count += len(gone)
            statement.results = tuple(statement.results[i] for i in keep)
            if not keep:
                reads, inside = _contents([statement.then_block, statement.else_block])
                dead.update(inside)
                freed += [statement.cond] + [v for v in reads if id(v) not in inside]
                removed.add(id(statement))
        else:
            if any(uses.get(id(v)) for v in statement.results):
                continue
            dead.update(id(v) for v in statement.results)
            freed = _reads(statement)
            removed.add(id(statement))
            count += 1
        for v in freed:
            if id(v) in dead:
                continue
            uses[id(v)] -= 1
            if not uses[id(v)] and id(v) in owner:
                work.append(v)
    for block in blocks:
        block.ops = [statement for statement in block.ops if id(statement) not in removed]
    return count


def _inner_blocks(statement: Statement) -> list[Block]:
    """The blocks a statement holds (an If's two branches, a Loop's body)."""
    if isinstance(statement, IfOp):
        return [statement.then_block, statement.else_block]
    if isinstance(statement, LoopOp):
        return [statement.body]
    return []


def operand_values(operands: Any) -> list[Value]:
    """The values among (nested tuples of) operands, iteratively."""
    found: list[Value] = []
    stack = list(operands)
    while stack:
        item = stack.pop()
        if isinstance(item, Value):
            found.append(item)
        elif isinstance(item, tuple):
            stack.extend(item)
    return found


def _reads(statement: Statement) -> list[Value]:
    """The values a statement reads directly (not those its blocks read)."""
    if isinstance(statement, Op):
        return operand_values(statement.args)
    if isinstance(statement, IfOp):
        return [statement.cond]
    return operand_values(statement.init)


def _contents(roots: list[Block]) -> tuple[list[Value], set[int]]:
    """What ``roots`` and the blocks in them read, and the ids of the values they define."""
    reads: list[Value] = []
    defined: set[int] = set()
    stack = list(roots)
    while stack:
        current = stack.pop()
        defined.update(id(v) for v in current.params)
        for statement in current.ops:
            reads += _reads(statement)
            defined.update(id(v) for v in statement.results)
            stack += _inner_blocks(statement)
        reads += operand_values(current.results)
    return reads, defined


# -- the operations only the flat program has --------------------------------------------
def _dim_impl(x: Any, axis: int) -> int:
    """The size of ``x``'s axis ``axis`` (DIM's evaluation)."""
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


# -- operands, as both writers read them ---------------------------------------------------------
def is_weak(operand: Operand) -> bool:
    """A Python constant of no declared type: it takes the other operand's dtype."""
    return isinstance(operand, Const) and operand.type is None and not isinstance(
        operand.value, (np.ndarray, np.generic))


def operand_dtype(operand: Operand, loc: Optional[Location] = None) -> str:
    """The element type an operand has when written without a conversion (``str`` for a
    string constant; a tuple is an :class:`ExportError` at ``loc``)."""
    if isinstance(operand, (Value, Undefined)):
        return dtype_of_type(operand.type)
    if isinstance(operand, Const):
        if operand.type is not None:
            return dtype_of_type(operand.type)
        value = operand.value
        if isinstance(value, (np.ndarray, np.generic)):
            return dtype_name(value.dtype) or "f64"
        if isinstance(value, str):
            return "str"
        found = literal_dtype(value)
        if found is None:
            raise ExportError(f"the constant {value!r} is not a tensor", loc)
        return found
    raise ExportError("a tuple where a tensor is needed", loc)


def common_dtype(operands: Sequence[Operand], loc: Optional[Location] = None) -> str:
    """numpy's promotion of the operands' dtypes, Python constants being weak (``x < 0``
    compares an f32 ``x`` as f32)."""
    strong = [operand_dtype(o, loc) for o in operands if not is_weak(o)]
    weak = [operand_dtype(o, loc) for o in operands if is_weak(o)]
    if not strong:
        return dtype_name(np.result_type(*[numpy_dtype(d) for d in weak])) or "f64"
    result = dtype_name(np.result_type(*[numpy_dtype(d) for d in strong])) or "f64"
    for d in weak:
        if is_float(d) and not is_float(result):
            result = "f64"
        elif is_integer(d) and is_bool(result):
            result = "i64"
    return result


def static_value(operand: Operand, loc: Optional[Location] = None) -> Any:
    """The Python value of a constant operand (tuples of constants too; a dtype by name)."""
    if isinstance(operand, Const):
        value = operand.value
        return value.name if isinstance(value, DType) else value
    if isinstance(operand, tuple):
        return tuple(static_value(o, loc) for o in operand)
    raise ExportError("an argument that must be a constant to export is known only at "
                      "run time", loc)



def operand_leaves(operand: Operand) -> list[Operand]:
    """The scalars of a nested tuple operand (``array``'s elements), in order; a constant
    tuple is taken apart too.  Iterative: the nesting may be deep."""
    leaves: list[Operand] = []
    stack: list[Operand] = [operand]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            stack.extend(reversed(item))
        elif isinstance(item, Const) and isinstance(item.value, tuple):
            stack.extend(reversed([Const(v) for v in item.value]))
        else:
            leaves.append(item)
    return leaves


def shape_items(operand: Operand) -> tuple[Operand, ...]:
    """The dimensions of a shape operand (a tuple of constants and int values, a constant
    tuple, or one int), one operand each."""
    if isinstance(operand, tuple):
        return operand
    if isinstance(operand, Const) and isinstance(operand.value, tuple):
        return tuple(Const(v) for v in operand.value)
    return (operand,)


def known_rank_shape(t: AbstractValue, what: str, loc: Optional[Location] = None) -> tuple[Any, ...]:
    """A type's shape (its rank must be known: else an :class:`ExportError` naming ``what``)."""
    shape = shape_of_type(t)
    if shape is None:
        raise ExportError(f"{what} needs tensors of known rank", loc)
    return shape


def sum_to_axes(g_shape: tuple[Any, ...], x_shape: tuple[Any, ...],
                loc: Optional[Location] = None) -> list[int]:
    """The axes of ``g`` that ``sum_to(g, x)`` sums (kept as 1): those broadcasting added in
    front, and those where x has 1 and g does not."""
    extra = len(g_shape) - len(x_shape)
    if extra < 0:
        raise ExportError("sum_to of a gradient of lower rank than its value", loc)
    return list(range(extra)) + [extra + i for i, d in enumerate(x_shape)
                                 if isinstance(d, int) and d == 1 and g_shape[extra + i] != 1]



def same_static_shape(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """Whether two shapes are provably equal (no unknown dimension)."""
    return len(a) == len(b) and all(dims_equal(x, y) and not is_unknown_dim(x) for x, y in zip(a, b))


def program_properties(program: FlatProgram, entry: str, signature: Optional[str],
                       extra: dict[str, str]) -> dict[str, str]:
    """The metadata an exported model carries (entry, signature, ``extra``, how its inputs
    and outputs nest, which outputs are scalars); also set as ``program.metadata``."""
    props = {"anfir.entry": entry}
    if signature is not None:
        props["anfir.signature"] = signature
    props.update(extra)
    props["anfir.inputs"] = json.dumps(program.input_structure)
    props["anfir.outputs"] = json.dumps(program.output_structure)
    props["anfir.scalar_outputs"] = json.dumps(
        [n for n, t in zip(program.output_names, program.output_types) if not isinstance(t, ATensor)])
    program.metadata = props
    return props


def nest_by_structure(structure: Any, leaf: Callable[[Optional[str]], Any]) -> Any:
    """An ``anfir.outputs`` structure (names in nested lists) as nested tuples of
    ``leaf(name)``, built bottom-up without recursion."""
    if not isinstance(structure, list):
        return leaf(structure)
    order: list[list[Any]] = []
    stack = [structure]
    while stack:
        current = stack.pop()
        order.append(current)
        stack.extend(x for x in current if isinstance(x, list))
    done: dict[int, tuple[Any, ...]] = {}
    for current in reversed(order):
        done[id(current)] = tuple(done[id(x)] if isinstance(x, list) else leaf(x) for x in current)
    return done[id(structure)]


def values_by_name(structure: list[Any], args: Sequence[Any]) -> dict[str, Any]:
    """Flat input name → value, from one anfir-style value per entry parameter nested as
    the ``anfir.inputs`` structure says."""
    if len(structure) != len(args):
        raise ExportError(f"the program takes {len(structure)} arguments, not {len(args)}")
    out: dict[str, Any] = {}
    stack: list[tuple[Any, Any]] = list(zip(structure, args))
    while stack:
        names, value = stack.pop()
        if names is None:
            continue
        if isinstance(names, list):
            stack.extend(zip(names, value))
        else:
            out[names] = value
    return out



class OperandReader:
    """What both writers read off operands, their errors located at ``self.loc`` (the op
    being written): dtypes, promotion, constants' values and types."""

    loc: Optional[Location] = None

    def dtype_of_operand(self, operand: Operand) -> str:
        """The element type an operand has when written without a conversion."""
        return operand_dtype(operand, self.loc)

    def common_dtype(self, operands: Sequence[Operand]) -> str:
        """numpy's promotion of the operands' dtypes, Python constants being weak."""
        return common_dtype(operands, self.loc)

    def static(self, operand: Operand) -> Any:
        """The Python value of a constant operand (tuples of constants too)."""
        return static_value(operand, self.loc)

    def constant_type(self, operand: Const) -> AbstractValue:
        """A constant operand's type: its dtype, and its shape when it is an array."""
        value = operand.value
        d = self.dtype_of_operand(operand)
        shape = np.shape(value) if isinstance(value, np.ndarray) else ()
        return AString() if d == "str" else ATensor(d, tuple(shape)) if shape else AScalar(d)



def one_device_reasons(target: str) -> dict[Primitive, str]:
    """Why a flat target (``target`` names it in the message) cannot write the per-device
    (SPMD) primitives nor vmap's batching ones: the stated reasons every such back end gives."""
    spmd = (f"a primitive of per-device (SPMD) programs: {target} describes one device's "
            "program and has no collective communication; export the global program "
            "(compiled without a mesh), or run the per-device one with anfir.to_jax "
            "under jax.shard_map")
    batching = ("a batching primitive of vmap: not supported by this target yet (run the "
                "batched program with anfir.run or anfir.to_jax)")
    return {**{prim: spmd for prim in (*collective.COLLECTIVES, collective.axis_size, collective.shard)},
            **{prim: batching for prim in BATCHING_PRIMITIVES}}



def static_dims(shape: tuple[Any, ...], what: str, target: str,
                loc: Optional[Location] = None) -> tuple[int, ...]:
    """``shape`` with every dimension known (else an :class:`ExportError`: ``what`` needs
    static dimensions to export to ``target``)."""
    if not all(isinstance(d, (int, np.integer)) for d in shape):
        raise ExportError(f"{what} needs static dimensions to export to {target}, not {shape}", loc)
    return tuple(int(d) for d in shape)


__all__ = ["operand_values", 
    "Block", "Const", "DIM", "FlatProgram", "IfOp", "LoopOp", "NameAllocator", "Op", "Operand",
    "PSEUDO_PRIMITIVES", "Statement", "Structure", "Undefined", "Value", "dtype_of_type",
    "is_value_type", "prune", "shape_of_type", "is_weak", "operand_dtype", "common_dtype",
    "static_value", "operand_leaves", "shape_items", "known_rank_shape", "sum_to_axes",
    "same_static_shape", "program_properties", "nest_by_structure", "values_by_name",
    "OperandReader", "one_device_reasons", "static_dims",
]

"""What the MindIR export rules share: the rule type, the error of a node that cannot be
written, static shapes and dtypes of typed nodes, and the helpers writing common
MindSpore patterns (a ``BroadcastTo``, a sum back to a broadcast operand's shape,
leafwise work on nested tuples, zeros of a slot's type)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

import numpy as np

from anfir.abstract.values import AScalar, ATensor, ATuple
from anfir.dtypes import BY_NAME, dtype_name, is_float, is_integer
from anfir.interop.mindir.common import TYPE_ID_OF
from anfir.interop.mindir.environments import EnvLayout, is_run_time
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.primitives import gradient

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.mindir.writer import Writer

Rule = Callable[["Writer", CNode], str]
"""A rule: writes one anfir node as MindSpore nodes, returns the name of its value."""


class Unsupported(Exception):
    """A node the writer has no rule for (collected into one MindirError)."""


def registrar(table: dict[Primitive, Rule]) -> Callable[..., Callable[[Rule], Rule]]:
    """A decorator ``@rule_of(prim, ...)`` registering a rule in ``table`` for each primitive."""
    def rule_of(*prims: Primitive) -> Callable[[Rule], Rule]:
        def register(rule: Rule) -> Rule:
            for prim in prims:
                table[prim] = rule
            return rule
        return register
    return rule_of


def numpy_dtype(dtype: str) -> Any:
    """The numpy dtype of anfir dtype ``dtype``."""
    return BY_NAME[dtype].numpy


def dtype_of(abstract: Any) -> Optional[str]:
    """The dtype of a number or tensor type (``None`` for other types)."""
    if isinstance(abstract, (ATensor, AScalar)):
        return str(abstract.dtype)
    return None


def elementwise(op: str) -> Rule:
    """The rule writing a primitive as MindSpore's ``op`` of the same inputs."""
    def rule(w: Writer, node: CNode) -> str:
        # A constant operand takes the dtype of the other operand (MindSpore selects
        # kernels by exact dtypes).
        constants = [known(a) for a in node.args]
        promoted = promoted_dtype(op, node)
        if promoted is not None:  # operands of two dtypes: both in the promoted one
            return w.emit(op, [as_dtype(w, a, promoted) if k is None else w.constant(k[0], promoted)
                               for a, k in zip(node.args, constants)], abstract=node.abstract)
        others = [dtype_of(a.abstract) for a, k in zip(node.args, constants) if k is None]
        dtype = next((d for d in others if d), None) or dtype_of(node.abstract)
        inputs = [w.ref(a) if k is None else w.constant(k[0], dtype) for a, k in zip(node.args, constants)]
        return w.emit(op, inputs, abstract=node.abstract)
    return rule


def known(node: Node) -> Optional[tuple[Any]]:
    """``(value,)`` of an operand known when writing: a constant, or the size of a
    tensor of static shape (written as a constant of the other operand's dtype)."""
    if isinstance(node, ValueNode) and not isinstance(node.value, (FuncGraph, Primitive)):
        return (node.value,)
    if isinstance(node, CNode) and node.is_apply(gradient.size):
        try:
            return (int(np.prod(static_shape(node.args[0], "size"))),)
        except Unsupported:
            return None
    return None


def static(node: Node, what: str) -> Any:
    """The value of constant ``node`` (``what`` names it when it is not one)."""
    if not isinstance(node, ValueNode):
        raise Unsupported(f"{what} must be a constant")
    return node.value


def reducer(op: str) -> Rule:
    """The rule writing a reduction (``axis``/``keepdims`` attributes) as MindSpore's ``op``
    (``ReduceSum``, ``ReduceMean``...: axes and keep_dims as inputs)."""
    def rule(w: Writer, node: CNode) -> str:
        axis = node.attrs.get("axis", None) if node.attrs else None
        keep = bool(node.attrs.get("keepdims", False)) if node.attrs else False
        axes = () if axis is None else ((int(axis),) if isinstance(axis, int) else tuple(int(a) for a in axis))
        if axes == () and axis is not None:
            return w.ref(node.args[0])  # an empty tuple of axes reduces nothing
        inputs = [w.ref(node.args[0]), w.constant(axes, scalar=True), w.constant(keep, scalar=True)]
        if op == "ReduceSum":
            inputs.append(w.constant(False, scalar=True))  # skip_mode
        return w.emit(op, inputs, abstract=node.abstract)
    return rule


def static_shape(node: Node, what: str) -> tuple[int, ...]:
    """The static shape of ``node`` (a scalar's is ``()``), or unsupported."""
    abstract = node.abstract
    if isinstance(abstract, AScalar):
        return ()
    if isinstance(abstract, ATensor) and abstract.shape is not None and all(
            isinstance(d, int) for d in abstract.shape):
        return tuple(int(d) for d in abstract.shape)
    raise Unsupported(f"{what} needs static shapes (compile with concrete arguments)")


def shape_of_abstract(abstract: Any) -> tuple[int, ...]:
    """The static shape of a tensor type (unsupported, named, when a dimension is a variable)."""
    assert isinstance(abstract, ATensor) and abstract.shape is not None
    if not all(isinstance(d, (int, np.integer)) for d in abstract.shape):
        raise Unsupported(f"a value of shape {tuple(abstract.shape)} made from its static shape (a zero, "
                          "a broadcast mask) where a dimension is known only at run time")
    return tuple(int(d) for d in abstract.shape)


def swap_last(w: Writer, ref: str, rank: int) -> str:
    """``ref`` (of rank ``rank``) with its last two axes swapped."""
    return w.emit("Transpose", [ref, w.constant(tuple(range(rank - 2)) + (rank - 1, rank - 2), scalar=True)])


def summed_to(w: Writer, ref: str, gs: tuple[int, ...], xs: tuple[int, ...], abstract: Any) -> str:
    """``ref`` (of shape ``gs``) summed over the axes a tensor of shape ``xs`` was broadcast along."""
    if gs == xs:
        return ref
    lead = len(gs) - len(xs)
    axes = tuple(range(lead)) + tuple(lead + k for k, d in enumerate(xs) if d == 1 and gs[lead + k] != 1)
    total = w.emit("ReduceSum", [ref, w.constant(axes, scalar=True), w.constant(True, scalar=True),
                                 w.constant(False, scalar=True)])
    return w.emit("Reshape", [total, w.constant(xs, scalar=True)], abstract=abstract)


def broadcast(w: Writer, ref: str, shape: tuple[int, ...], abstract: Any = None) -> str:
    """BroadcastTo(ref, shape): the shape an input (MindSpore 2.10 crashes on it as the
    primitive's attribute)."""
    return w.emit("BroadcastTo", [ref, w.constant(tuple(shape), scalar=True)], abstract=abstract)


def leafwise(w: Writer, a: str, b: str, abstract: Any, combine: Callable[[str, str, Any], str]) -> str:
    """``combine`` of the leaves of two values of type ``abstract`` (nested tuples), the
    results rebuilt as MakeTuples, walked with a stack (a gradient may nest deeply)."""
    # frames: (a, b, abstract, expanded); results gathered on `done`
    stack: list[tuple[str, str, Any, bool]] = [(a, b, abstract, False)]
    done: list[str] = []
    while stack:
        x, y, abstract, expanded = stack.pop()
        if not isinstance(abstract, ATuple):
            done.append(combine(x, y, abstract))
        elif expanded:
            n = len(abstract.items)
            items = done[len(done) - n:] if n else []
            del done[len(done) - n:]
            done.append(w.emit("MakeTuple", items))
        else:
            stack.append((x, y, abstract, True))
            for k in reversed(range(len(abstract.items))):
                index = w.constant(k, scalar=True)
                stack.append((w.emit("TupleGetItem", [x, index]), w.emit("TupleGetItem", [y, index]),
                              abstract.items[k], False))
    return done[-1]


def zero_env(w: Writer, layout: EnvLayout) -> str:
    """An environment with nothing stored: every slot's zero."""
    return w.emit("MakeTuple", [zero(w, abstract) for _, abstract in layout.slots])


def zero(w: Writer, abstract: Any) -> str:
    """The zero of a slot's type (a number, a tensor of static shape, a tuple of them)."""
    if isinstance(abstract, ATuple):
        return w.emit("MakeTuple", [zero(w, item) for item in abstract.items])
    dtype = str(abstract.dtype)
    if isinstance(abstract, AScalar) or is_run_time(abstract):  # a run-time shape: a 0-d zero
        return w.constant(np.zeros((), numpy_dtype(dtype)), dtype)
    shape = shape_of_abstract(abstract)
    if int(np.prod(shape)) <= SMALL_ZERO:
        return w.constant(np.zeros(shape, numpy_dtype(dtype)), dtype)
    return broadcast(w, w.constant(np.zeros((), numpy_dtype(dtype)), dtype), shape, abstract)


SMALL_ZERO = 64
"""A zero gradient with more elements is a BroadcastTo of a scalar, not a constant."""
__all__ = ["PROMOTING", "Rule", "SMALL_ZERO", "Unsupported", "as_dtype", "batch_probe", "broadcast", "broadcast_dims",
           "dtype_of", "elementwise", "known", "leafwise", "numpy_dtype", "promoted_dtype", "rank_of", "reducer",
           "registrar", "shape_of_abstract", "shape_operand", "static", "static_shape", "summed_to", "summed_to_like",
           "swap_last", "symbolic_shape", "zero",
           "zero_env"]


def rank_of(node: Node, what: str) -> int:
    """The rank of ``node``'s type (a scalar's is 0; its dimensions may be symbols), or
    unsupported when even the rank is not known."""
    abstract = node.abstract
    if isinstance(abstract, AScalar):
        return 0
    if isinstance(abstract, ATensor) and abstract.shape is not None:
        return len(abstract.shape)
    raise Unsupported(f"{what} needs the rank of its operand")


def symbolic_shape(node: Node, what: str) -> tuple[Any, ...]:
    """The shape of ``node``'s type, its dimensions ints or dimension variables (a
    scalar's is ``()``); unsupported when the rank is not known."""
    abstract = node.abstract
    if isinstance(abstract, AScalar):
        return ()
    if isinstance(abstract, ATensor) and abstract.shape is not None:
        return tuple(int(d) if isinstance(d, (int, np.integer)) else d for d in abstract.shape)
    raise Unsupported(f"{what} needs the rank of its operand")


def broadcast_dims(a: tuple[Any, ...], b: tuple[Any, ...], what: str) -> tuple[Any, ...]:
    """numpy's broadcast of two shapes whose dimensions may be variables; unsupported
    where the result depends on a variable's value (a variable against a different one,
    or against an int other than 1)."""
    a, b = (1,) * (len(b) - len(a)) + tuple(a), (1,) * (len(a) - len(b)) + tuple(b)
    out = []
    for p, q in zip(a, b):
        if p == q or q == 1:
            out.append(p)
        elif p == 1:
            out.append(q)
        elif isinstance(p, int) and isinstance(q, int):
            raise Unsupported(f"{what}: shapes {a} and {b} do not broadcast")
        else:
            raise Unsupported(f"{what}: whether {p} and {q} broadcast is known only at run time")
    return tuple(out)


def summed_to_like(w: Writer, ref: str, gs: tuple[Any, ...], xs: tuple[Any, ...], abstract: Any) -> str:
    """``ref`` (of shape ``gs``) summed over the axes a tensor of shape ``xs`` was broadcast
    along, dimensions ints or variables: ``summed_to`` when both are static; otherwise a
    ReduceSum keeping the axes where ``xs`` has 1 (a sum over an axis of length 1 is that
    axis itself, whatever ``gs``'s dimension turns out to be), then one dropping the
    leading axes — no Reshape, so no shape is needed at run time.  Unsupported where
    it depends on a variable's value whether ``xs`` was broadcast along an axis."""
    if all(isinstance(d, int) for d in (*gs, *xs)):
        return summed_to(w, ref, tuple(gs), tuple(xs), abstract)
    lead = len(gs) - len(xs)
    if lead < 0:
        raise Unsupported(f"a sum from shape {gs} to the longer {xs}")
    kept = []
    for k, d in enumerate(xs):
        e = gs[lead + k]
        if d == 1 and e != 1:
            kept.append(lead + k)
        elif d != e and not isinstance(d, int):  # an int other than 1 was not broadcast
            raise Unsupported(f"a sum to shape {xs} from {gs}: whether axis {k} was broadcast is known "
                              "only at run time")
    if kept:
        ref = w.emit("ReduceSum", [ref, w.constant(tuple(kept), scalar=True), w.constant(True, scalar=True),
                                   w.constant(False, scalar=True)])
    if lead:
        ref = w.emit("ReduceSum", [ref, w.constant(tuple(range(lead)), scalar=True),
                                   w.constant(False, scalar=True), w.constant(False, scalar=True)],
                     abstract=abstract)
    return ref


def batch_probe(node: Node, what: str) -> tuple[int, ...]:
    """``node``'s shape with a batch dimension (axis 0) known only at run time as 1: a
    window's attributes (stride, padding) do not depend on the batch.  Any other
    dimension must be static (MindSpore's convolutions and pools fix their channels and
    a window's output size from them)."""
    shape = symbolic_shape(node, what)
    if not all(isinstance(d, int) for d in shape[1:]):
        raise Unsupported(f"{what} needs static shapes but for the batch (axis 0): {shape}")
    return tuple(d if isinstance(d, int) else 1 for d in shape)


PROMOTING = frozenset({"Add", "Sub", "Mul", "RealDiv", "Maximum", "Minimum", "Greater", "GreaterEqual", "Less",
                       "LessEqual", "Equal", "NotEqual"})
"""MindSpore ops of anfir's arithmetic and comparisons, whose operands anfir promotes (an
integer with a float computes in the float) — MindSpore computes them in its first
operand's integer dtype, a float constant truncated into it."""

def promoted_dtype(op: str, node: CNode) -> Optional[str]:
    """The dtype both operands of ``op`` are computed in when anfir promotes them: the float
    one when one operand (or a constant) is an integer and the other a float — ``n * 0.5``
    with ``n`` an i64 is 1.5 in anfir —, numpy's promotion when two computed operands have
    different dtypes (``i32`` with ``i64``); None when no promotion is needed."""
    if op not in PROMOTING or len(node.args) != 2:
        return None
    kinds: list[Optional[str]] = []
    for a in node.args:
        value = a.value if isinstance(a, ValueNode) else None
        if isinstance(value, float):
            kinds.append("f64")
        elif isinstance(value, (bool, int)) and not isinstance(value, bool):
            kinds.append("i64")
        else:
            kinds.append(dtype_of(a.abstract))
    if any(k is None for k in kinds):
        return None
    floats = [k for k in kinds if k is not None and is_float(k)]
    ints = [k for k in kinds if k is not None and is_integer(k)]
    if floats and ints:
        out = dtype_of(node.abstract)
        return out if out is not None and is_float(out) else floats[0]
    computed = sorted({k for a, k in zip(node.args, kinds) if k is not None and known(a) is None})
    if len(computed) > 1:
        return str(dtype_name(np.result_type(*(numpy_dtype(d) for d in computed))))
    return None

def as_dtype(w: Writer, node: Node, dtype: str) -> str:
    """``node``'s value in ``dtype`` (a Cast when it has another; a run-time scalar
    straight to a tensor of it)."""
    if w.is_scalar(node):
        return w.scalar_as_tensor(w.raw(node), dtype)
    if dtype_of(node.abstract) == dtype:
        return w.ref(node)
    return w.emit("Cast", [w.ref(node), w.constant(TYPE_ID_OF[dtype], scalar=True)])


def shape_operand(w: Writer, node: Node, rank: int, what: str) -> str:
    """A shape operand of rank ``rank`` (``broadcast_to``'s, ``reshape``'s, ``zeros``'s...) as
    MindSpore's tuple of INT64 scalars: a constant, or the run-time tuple a ``shape(x)`` or
    a ``make_tuple`` of its items wrote (MindSpore's Reshape/BroadcastTo/Zeros take it)."""
    if isinstance(node, ValueNode) and isinstance(node.value, tuple):
        if not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in node.value):
            raise Unsupported(f"{what}: a shape of other than integers ({node.value!r:.60})")
        return w.constant(tuple(int(d) for d in node.value), scalar=True)
    if len(w.scalar_items(node)) != rank:
        raise Unsupported(f"{what} to a shape whose items are not all integers known to MindSpore")
    return w.raw(node)

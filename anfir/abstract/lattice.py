"""The order on abstract values: bottom, join, widening, and values of constants.

* ``BOTTOM`` (⊥) is "no value yet": the provisional result of a recursive call
  whose type is still being inferred.  Calls are strict, so an operation with a
  ⊥ argument gives ⊥; ``join(⊥, x) = x``.  ⊥ never survives a finished
  inference (a recursion that only ever yields ⊥ is an error).
* ``join(a, b)`` is the least type of both (used by ``switch`` and by the
  recursion fixpoint): scalar values are dropped, tuples join elementwise,
  functions by union.  Tensors of different shapes do **not** join: the
  specializer reports them (a dimension that differs between two branches is
  almost always a bug, and an unknown-dimension result would weaken every
  shape check after it).
* ``widen(a)`` forgets scalar values; graph signatures are widened so that
  ``fibonacci(10)`` specializes once per type, not once per ``n``.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from anfir.abstract.values import (UNKNOWN, AAny, AbstractValue, AEnv, AFunction, AKey, ANone,
                                   AScalar, AString, ATensor, ATuple, AType, FunctionAtom, GradFn,
                                   Dim, GraphFn, GraphSig, JFn, PartialFn, PrimFn, scalar_dtype_of)
from anfir.abstract.shapes import dims_equal, is_unknown_dim
from anfir.dtypes import dtype_name, dtype_of_array, is_dtype, is_float
from anfir.errors import AnfirTypeError
from anfir.ir.graph import FuncGraph
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.nested import fold_nested
from anfir.runtime_values import DType, GradEnv, SymbolicKey


class ABottom(AbstractValue):
    """⊥: the value of a computation that has not returned yet (internal to inference)."""

    __slots__ = ()
    _instance: "ABottom | None" = None

    def __new__(cls) -> "ABottom":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __str__(self) -> str:
        return "<Bottom>"

    __repr__ = __str__


BOTTOM = ABottom()
"""The single ⊥ value."""


class JoinError(Exception):
    """Two abstract values have no common type (the engine adds location and context)."""

    def __init__(self, a: AbstractValue, b: AbstractValue, why: str = "") -> None:
        self.a, self.b, self.why = a, b, why
        super().__init__(f"{a} and {b}" + (f" ({why})" if why else ""))


def join(a: AbstractValue, b: AbstractValue) -> AbstractValue:
    """The least abstract value above both ``a`` and ``b``; raises :class:`JoinError`.

    Tuples are joined elementwise with an explicit stack (any nesting depth).
    """
    if a.__class__ is not ATuple or b.__class__ is not ATuple or a is b:
        return _join_one(a, b)
    if a == b:
        return a
    done: dict[tuple[int, int], AbstractValue] = {}  # (id, id) of tuples of a and b (alive)
    stack: list[tuple[Any, Any, bool]] = [(a, b, False)]
    while stack:
        x, y, ready = stack.pop()
        key = (id(x), id(y))
        if key in done:
            continue
        if not ready:
            if len(x.items) != len(y.items):
                raise JoinError(x, y, "tuples of different lengths")
            stack.append((x, y, True))
            for i, j in zip(x.items, y.items):
                if i.__class__ is ATuple and j.__class__ is ATuple and i is not j:
                    stack.append((i, j, False))
            continue
        items = tuple(done[(id(i), id(j))] if (i.__class__ is ATuple and j.__class__ is ATuple
                                               and i is not j) else _join_one(i, j)
                      for i, j in zip(x.items, y.items))
        done[key] = x if all(p is q for p, q in zip(items, x.items)) else ATuple(items)
    return done[(id(a), id(b))]


def _join_one(a: AbstractValue, b: AbstractValue) -> AbstractValue:
    """:func:`join` of two values that are not both tuples (or are the same tuple)."""
    if a is BOTTOM:
        return b
    if b is BOTTOM or a == b:
        return a
    if isinstance(a, AAny) or isinstance(b, AAny):
        return AAny()
    if isinstance(a, AScalar) and isinstance(b, AScalar):
        if a.dtype != b.dtype:
            raise JoinError(a, b)
        return AScalar(a.dtype)
    if isinstance(a, AString) and isinstance(b, AString):
        return AString()
    if isinstance(a, ATensor) and isinstance(b, ATensor):
        if a.dtype != b.dtype:
            raise JoinError(a, b)
        if a.shape is None or b.shape is None:
            return ATensor(a.dtype, None, _join_leading(a, b))

        if len(a.shape) != len(b.shape):
            raise JoinError(a, b, "different ranks")
        dims = []
        for x, y in zip(a.shape, b.shape):
            if is_unknown_dim(x):
                dims.append(x)
            elif is_unknown_dim(y) or dims_equal(x, y):
                dims.append(x if not is_unknown_dim(y) else y)
            else:
                raise JoinError(a, b, "different shapes")
        return ATensor(a.dtype, tuple(dims))
    if isinstance(a, AFunction) and isinstance(b, AFunction):
        return AFunction(a.options | b.options)
    if type(a) is type(b) and isinstance(a, (ANone, AEnv, AKey, AType)):
        return a
    raise JoinError(a, b)


def _join_leading(a: ATensor, b: ATensor) -> tuple[Dim, ...]:
    """The first dimensions known of both tensors, one of unknown rank (for :func:`join`)."""
    first_a = a.shape if a.shape is not None else a.leading
    first_b = b.shape if b.shape is not None else b.leading
    if a.shape is not None and len(a.shape) < b.min_rank or (
            b.shape is not None and len(b.shape) < a.min_rank):
        raise JoinError(a, b, "different ranks")
    dims: list[Dim] = []
    for x, y in zip(first_a, first_b):
        if is_unknown_dim(x):
            dims.append(x)
        elif is_unknown_dim(y) or dims_equal(x, y):
            dims.append(x if not is_unknown_dim(y) else y)
        else:
            raise JoinError(a, b, "different shapes")
    # Known first dimensions of both; the rank of the join is at least that many.
    return tuple(dims[:min(a.min_rank, b.min_rank)])


def widen(a: AbstractValue) -> AbstractValue:
    """``a`` with every scalar value forgotten (strings keep theirs: they name dtypes)."""
    return map_tuple_leaves(a, _widen_leaf)


def _widen_leaf(a: AbstractValue) -> AbstractValue:
    return a.widen() if isinstance(a, AScalar) else a


def map_tuple_leaves(a: AbstractValue, leaf: Callable[[AbstractValue], AbstractValue]) -> AbstractValue:
    """``a`` with ``leaf`` applied to everything that is not a tuple, tuples rebuilt
    (a tuple whose items are all unchanged is kept).  An explicit stack: any depth."""
    def combine(t: ATuple, items: list[AbstractValue]) -> AbstractValue:
        return t if all(p is q for p, q in zip(items, t.items)) else ATuple(tuple(items))

    return fold_nested(a, _items_of_atuple, combine, leaf)


def tuple_leaves(a: AbstractValue) -> list[AbstractValue]:
    """The leaves of a (nested) tuple type, left to right (with a stack: any depth)."""
    out: list[AbstractValue] = []
    stack = [a]
    while stack:
        x = stack.pop()
        if isinstance(x, ATuple):
            stack.extend(reversed(x.items))
        else:
            out.append(x)
    return out


def _items_of_atuple(a: Any) -> Optional[tuple[AbstractValue, ...]]:
    return a.items if a.__class__ is ATuple else None


def contains_bottom(a: AbstractValue) -> bool:
    """Whether ⊥ occurs in ``a`` (at any depth of tuples)."""
    stack = [a]
    while stack:
        x = stack.pop()
        if x is BOTTOM:
            return True
        if isinstance(x, ATuple):
            stack.extend(x.items)
    return False


# -- constants -----------------------------------------------------------------
def abstract_of_value(value: Any, memo: Optional[dict[int, tuple[Any, AbstractValue]]] = None
                      ) -> AbstractValue:
    """The abstract value of a concrete one: example arguments and constants.

    Python ``bool``/``int``/``float`` are ``AScalar("bool"/"i64"/"f64", value)``;
    numpy scalars keep their dtype; arrays are ``ATensor(dtype, shape)``;
    tuples, strings and None map to ``ATuple``, ``AString``, ``ANone``; an
    :class:`AbstractValue` stands for itself.  ``memo`` (see
    :func:`anfir.nested.fold_nested`) reuses the abstract values of tuples seen
    in earlier calls: a constant built from another constant costs its new part.
    """
    # Nested tuples without recursion: a constant may nest thousands deep.
    return fold_nested(value, _python_tuple_items, _abstract_tuple, _abstract_of_leaf, memo)


def _python_tuple_items(value: Any) -> Optional[tuple[Any, ...]]:
    return value if isinstance(value, tuple) else None


def _abstract_tuple(_value: tuple[Any, ...], items: list[AbstractValue]) -> AbstractValue:
    return ATuple(tuple(items))


def _abstract_of_leaf(value: Any) -> AbstractValue:
    """:func:`abstract_of_value` of anything but a tuple."""
    if isinstance(value, AbstractValue):
        return value
    dtype = scalar_dtype_of(value)
    if dtype is not None:
        return AScalar(dtype, value)
    if isinstance(value, np.ndarray):
        return ATensor(dtype_of_array(value), tuple(int(d) for d in value.shape))
    if isinstance(value, np.generic):
        name = dtype_name(value.dtype)
        if name is None:
            raise AnfirTypeError(f"unsupported scalar type {value.dtype.name}")
        return AScalar(name, value.item())
    if isinstance(value, str):
        return AString(value)
    if value is None:
        return ANone()
    if isinstance(value, DType) and is_dtype(value.name):
        return AType()
    if isinstance(value, GradEnv):
        return AEnv()
    if isinstance(value, SymbolicKey):
        return AKey()
    if isinstance(value, FuncGraph):
        return AFunction(frozenset({GraphFn(value)}))
    if isinstance(value, (Primitive, MetaFunction)):
        return AFunction(frozenset({PrimFn(value)}))
    raise AnfirTypeError(f"cannot use a value of type {type(value).__name__} here "
                         "(expected a number, bool, string, None, tuple or numpy array)")


# -- walking function atoms ------------------------------------------------------
def sorted_atoms(fn: AFunction) -> list[FunctionAtom]:
    """``fn``'s options in a deterministic order (by text, then by creation)."""
    return sorted(fn.options, key=_atom_key)


def _atom_key(atom: FunctionAtom) -> tuple[str, int]:
    if isinstance(atom, GraphFn):
        return (str(atom), atom.graph.seq)
    return (str(atom), 0)


def map_graphs(a: AbstractValue, fn: Callable[[FuncGraph], FuncGraph],
               memo: Optional[dict[AbstractValue, AbstractValue]] = None) -> AbstractValue:
    """``a`` with every ``GraphFn(g)`` replaced by ``GraphFn(fn(g))``."""
    memo = {} if memo is None else memo

    def value(x: AbstractValue) -> AbstractValue:
        if isinstance(x, (AScalar, ATensor, AString, ANone)) or x is BOTTOM:
            return x
        try:
            hit: Optional[AbstractValue] = memo.get(x)
        except TypeError:  # pragma: no cover - every abstract value is hashable
            hit = None
        if hit is not None:
            return hit
        if isinstance(x, ATuple):
            # An explicit stack, and every inner tuple memoized as well: the
            # types of a chain of nodes nest one more level per node and share
            # the inner levels, so each node then costs its own level only.
            out: AbstractValue = fold_nested(x, unmapped_items, rebuilt, value)
        elif isinstance(x, AFunction):
            out = AFunction(frozenset(atom(o) for o in x.options))
        elif isinstance(x, GraphSig):
            out = GraphSig(tuple(value(p) for p in x.params), value(x.out))
        else:
            out = x
        memo[x] = out
        return out

    def unmapped_items(x: Any) -> Optional[tuple[AbstractValue, ...]]:
        # A tuple already mapped is a leaf here: ``value`` finds it in the memo.
        return x.items if x.__class__ is ATuple and x not in memo else None

    def rebuilt(t: ATuple, items: list[AbstractValue]) -> AbstractValue:
        out = t if all(p is q for p, q in zip(items, t.items)) else ATuple(tuple(items))
        memo[t] = out
        return out

    def atom(x: FunctionAtom) -> FunctionAtom:
        if isinstance(x, GraphFn):
            new = fn(x.graph)
            return x if new is x.graph else GraphFn(new)
        if isinstance(x, PartialFn):
            return PartialFn(atom(x.fn), tuple(value(i) for i in x.args))
        if isinstance(x, GradFn):
            return GradFn(atom(x.fn), x.wrt, x.with_value)
        if isinstance(x, JFn):
            return JFn(atom(x.fn))
        return x

    return value(a)


def is_float_scalar(a: AbstractValue) -> bool:
    """A float Python scalar or a 0-d float tensor (what ``grad`` differentiates)."""
    if isinstance(a, AScalar):
        return is_float(a.dtype)
    if isinstance(a, ATensor):
        return is_float(a.dtype) and a.shape == ()
    return False


__all__ = ["ABottom", "BOTTOM", "JoinError", "UNKNOWN", "abstract_of_value", "contains_bottom",
           "is_float_scalar", "join", "map_graphs", "map_tuple_leaves", "sorted_atoms", "tuple_leaves",
           "widen"]

"""The values a traced anfir program computes with, and the walks over them.

While JAX traces a program, a value is

* **data**: a JAX array (a tracer under ``jax.jit``/``grad``/``vmap``) — or a
  Python scalar, bool, string, None or numpy array that is *concrete*: known at
  trace time (a constant of the program, or computed from constants only);
* a tuple of values;
* a **function**, exactly as the evaluator represents it — a FuncGraph, a
  :class:`~anfir.runtime_values.Closure` (whose captured values may be traced), a
  :class:`~anfir.runtime_values.Partial`, a Primitive or a MetaFunction — and a
  :class:`~anfir.runtime_values.GradEnv` of gradients;
* two values of this module: :class:`Either` (one of two values, chosen by a
  traced condition: what ``switch`` makes of functions it cannot select at
  trace time) and :class:`Continue` (a loop's next iteration, handed back to
  the frame that turns the loop into ``lax.while_loop``).

Values nest as deep as the program builds them (a gradient of a loop unrolled
1,000 times holds 1,000 nested closures), so every walk here uses an explicit
stack: :func:`anfir.nested.fold_nested` for one value, :func:`zip_fold` for two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from anfir.ir.graph import FuncGraph
from anfir.nested import fold_nested
from anfir.runtime_values import Closure, GradEnv, Partial


@dataclass(frozen=True, eq=False)
class Either:
    """``a`` where the traced bool ``cond`` is true, else ``b``.

    ``switch`` on a traced condition between values that cannot be blended
    elementwise (two different functions: the lambdas of the two arms of an
    ``if``, or the backpropagators a gradient's ``if`` returns) makes one.
    Calling it is a ``lax.cond`` between calling ``a`` and calling ``b``; a
    primitive applied to it is applied to both sides and the results blended
    (lambda-set specialization: the tag is the condition).
    """

    cond: Any
    a: Any
    b: Any


@dataclass(frozen=True, eq=False)
class Continue:
    """``target(*args)`` (called as ``fn``) in tail position: the next iteration of a
    loop whose head ``target`` runs in a frame of an enclosing machine."""

    target: FuncGraph
    fn: Any
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Slot:
    """A traced leaf in a value's skeleton (see :func:`flatten`)."""

    index: int
    shape: tuple[int, ...]
    dtype: Any
    weak_type: bool


class _Absent:
    """No value (a loop iteration that did not exit has no result yet)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


# -- kinds ----------------------------------------------------------------------------
def is_array(x: Any) -> bool:
    """Whether ``x`` is a JAX array (a tracer included)."""
    return isinstance(x, jax.Array)


def is_traced(x: Any) -> bool:
    """Whether ``x`` is a tracer: its value is not known while tracing."""
    return isinstance(x, jax.core.Tracer)


_NUMBERS = (bool, int, float, np.ndarray, np.generic)


def is_numeric(x: Any) -> bool:
    """Data that arithmetic applies to: a JAX or numpy array, a number, a bool."""
    return isinstance(x, _NUMBERS) or is_array(x)


def items_of(value: Any) -> Optional[tuple[Any, ...]]:
    """The values a compound value holds (None for a leaf)."""
    kind = type(value)
    if kind is tuple:
        return value
    if kind is Closure:
        return value.env
    if kind is Partial:
        return (value.fn, *value.args)
    if kind is GradEnv:
        return tuple(v for _, v in value.items())
    if kind is Either:
        return (value.cond, value.a, value.b)
    if kind is Continue:
        return (value.fn, *value.args)
    return None


def rebuild(proto: Any, items: Sequence[Any]) -> Any:
    """A value of ``proto``'s kind holding ``items`` (the inverse of :func:`items_of`)."""
    kind = type(proto)
    if kind is tuple:
        return tuple(items)
    if kind is Closure:
        return Closure(proto.graph, tuple(items))
    if kind is Partial:
        return Partial(items[0], tuple(items[1:]))
    if kind is GradEnv:
        return GradEnv(dict(zip([k for k, _ in proto.items()], items)))
    if kind is Either:
        return Either(items[0], items[1], items[2])
    if kind is Continue:
        return Continue(proto.target, items[0], tuple(items[1:]))
    raise TypeError(f"not a compound value: {proto!r}")  # pragma: no cover


def map_leaves(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` with every leaf replaced by ``leaf(leaf)`` (any depth)."""
    return fold_nested(value, items_of, rebuild, leaf)


def _tuple_items(value: Any) -> Optional[tuple[Any, ...]]:
    return value if type(value) is tuple else None


def _as_tuple(_proto: Any, items: list[Any]) -> Any:
    return tuple(items)


def map_tuples(value: Any, leaf: Callable[[Any], Any]) -> Any:
    """``value`` with every non-tuple in it replaced by ``leaf(it)`` (tuples of any depth)."""
    return fold_nested(value, _tuple_items, _as_tuple, leaf)


def leaves(value: Any) -> list[Any]:
    """Every leaf of ``value``, in no particular order."""
    out: list[Any] = []
    stack = [value]
    while stack:
        item = stack.pop()
        children = items_of(item)
        if children is None:
            out.append(item)
        else:
            stack.extend(children)
    return out


def contains_array(value: Any) -> bool:
    """Whether a JAX array is among ``value``'s leaves (the value is not all concrete);
    stops at the first one."""
    stack = [value]
    while stack:
        item = stack.pop()
        if is_array(item):
            return True
        children = items_of(item)
        if children is not None:
            stack.extend(children)
    return False


def contains_kind(value: Any, kinds: tuple[type, ...]) -> bool:
    """Whether a leaf of ``value`` is an instance of ``kinds`` (tuples looked into)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, kinds):
            return True
        if type(item) is tuple:
            stack.extend(item)
    return False


# -- skeletons: a value's traced leaves taken out ----------------------------------------
def flatten(value: Any) -> tuple[Any, list[Any]]:
    """``(skeleton, arrays)``: the JAX arrays of ``value`` in a list, and ``value``
    with each replaced by a :class:`Slot` naming its index, shape and dtype."""
    arrays: list[Any] = []

    def take(leaf: Any) -> Any:
        if not is_array(leaf):
            return leaf
        arrays.append(leaf)
        return Slot(len(arrays) - 1, tuple(leaf.shape), leaf.dtype, bool(getattr(leaf, "weak_type", False)))

    return map_leaves(value, take), arrays


def unflatten(skeleton: Any, arrays: Sequence[Any]) -> Any:
    """The value of ``skeleton`` with its slots filled from ``arrays``."""
    return map_leaves(skeleton, lambda leaf: arrays[leaf.index] if isinstance(leaf, Slot) else leaf)


def static_equal(x: Any, y: Any) -> bool:
    """Whether two concrete leaves are the same value (numbers by value and type,
    arrays by dtype, shape and elements, functions and graphs by identity)."""
    if x is y:
        return True
    if type(x) is not type(y):
        return False
    if isinstance(x, np.ndarray):
        return x.dtype == y.dtype and x.shape == y.shape and bool(np.array_equal(x, y))
    if isinstance(x, Slot):
        return x.shape == y.shape and x.dtype == y.dtype
    if isinstance(x, (bool, int, float, str, np.generic)):
        return bool(x == y)
    return False


# -- walking two values together ------------------------------------------------------------
@dataclass(frozen=True)
class Done:
    """:func:`zip_fold`'s visitor: this pair's result."""

    value: Any


@dataclass(frozen=True)
class Split:
    """:func:`zip_fold`'s visitor: walk these pairs, then build ``proto``'s kind from
    their results."""

    proto: Any
    pairs: Sequence[tuple[Any, Any]]


def zip_fold(a: Any, b: Any, visit: Callable[[Any, Any], Union[Done, Split]],
             combine: Callable[[Any, list[Any]], Any] = rebuild) -> Any:
    """Walk ``a`` and ``b`` together: ``visit(x, y)`` either answers for a pair or
    splits it into pairs of parts, whose results ``combine(proto, results)``
    joins.  Any depth, constant stack."""
    root: list[Any] = [None]
    pending: list[tuple[Any, Any, list[Any], int]] = [(a, b, root, 0)]
    builds: list[tuple[Any, list[Any], list[Any], int]] = []
    while pending:
        x, y, into, index = pending.pop()
        step = visit(x, y)
        if isinstance(step, Done):
            into[index] = step.value
            continue
        results: list[Any] = [None] * len(step.pairs)
        builds.append((step.proto, results, into, index))
        pending.extend((px, py, results, i) for i, (px, py) in enumerate(step.pairs))
    # A split is recorded before the splits below it: build in reverse.
    for proto, results, into, index in reversed(builds):
        into[index] = combine(proto, results)
    return root[0]


def _same_kind_pairs(x: Any, y: Any) -> Optional[Split]:
    """The pairs of parts of two compound values of one kind and shape, else None."""
    kind = type(x)
    if kind is not type(y):
        return None
    if kind is tuple:
        return Split(x, list(zip(x, y))) if len(x) == len(y) else None
    if kind is Closure:
        return Split(x, list(zip(x.env, y.env))) if x.graph is y.graph and len(x.env) == len(y.env) else None
    if kind is Partial:
        return Split(x, list(zip(items_of(x) or (), items_of(y) or ()))) if len(x.args) == len(y.args) else None
    if kind is Continue:
        if x.target is y.target and len(x.args) == len(y.args):
            return Split(x, list(zip(items_of(x) or (), items_of(y) or ())))
        return None
    if kind is GradEnv:
        keys = sorted({k for k, _ in x.items()} | {k for k, _ in y.items()}, key=lambda k: k.name)
        pairs = []
        for key in keys:
            vx, vy = x.get(key, ABSENT), y.get(key, ABSENT)
            # A key missing on one side holds a zero gradient there.
            pairs.append((zeros_like(vy) if vx is ABSENT else vx, zeros_like(vx) if vy is ABSENT else vy))
        return Split(GradEnv({k: None for k in keys}), pairs)
    return None


# -- select: one of two values by a traced condition ----------------------------------------
def select(cond: Any, a: Any, b: Any) -> Any:
    """``a`` where ``cond`` is true, else ``b``: data blended elementwise with
    ``jnp.where``, the parts that cannot be (different functions, shapes or
    structures) kept as :class:`Either`."""

    def visit(x: Any, y: Any) -> Union[Done, Split]:
        if x is y:
            return Done(x)
        if x is ABSENT:
            return Done(y)
        if y is ABSENT:
            return Done(x)
        if isinstance(x, Either) or isinstance(y, Either):
            return Done(Either(cond, x, y))
        if is_numeric(x) and is_numeric(y):
            if not is_array(x) and not is_array(y) and static_equal(x, y):
                return Done(x)
            if np.shape(x) == np.shape(y):
                return Done(jnp.where(cond, x, y))
            return Done(Either(cond, x, y))
        split = _same_kind_pairs(x, y)
        if split is not None:
            return split
        if static_equal(x, y):
            return Done(x)
        return Done(Either(cond, x, y))

    return zip_fold(a, b, visit)


# -- gradients ------------------------------------------------------------------------------
def zeros_like(x: Any) -> Any:
    """The zero gradient of a value (anfir's ``zeros_like``; JAX zeros for JAX arrays)."""

    def items(v: Any) -> Optional[tuple[Any, ...]]:
        if type(v) is tuple:
            return v
        if type(v) is Partial:
            return v.args
        return None

    def leaf(v: Any) -> Any:
        if isinstance(v, bool):
            return False
        if isinstance(v, (int, float)):
            return type(v)(0)
        if isinstance(v, np.ndarray):
            return np.zeros_like(v)
        if isinstance(v, np.generic):
            return v.dtype.type(0)
        if is_array(v):
            return jnp.zeros_like(v)
        if v is None or isinstance(v, str):
            return None
        if isinstance(v, Either):
            return select(v.cond, zeros_like(v.a), zeros_like(v.b))
        return GradEnv()  # a function value: its gradient is an (empty) environment

    return fold_nested(x, items, _as_tuple, leaf)


def gadd(a: Any, b: Any) -> Any:
    """The sum of two gradients of one value (anfir's ``gadd``: numbers and arrays
    added, tuples elementwise, environments keywise, None as zero)."""

    def visit(x: Any, y: Any) -> Union[Done, Split]:
        if isinstance(x, Either):
            return Done(select(x.cond, gadd(x.a, y), gadd(x.b, y)))
        if isinstance(y, Either):
            return Done(select(y.cond, gadd(x, y.a), gadd(x, y.b)))
        if isinstance(x, GradEnv) or isinstance(y, GradEnv):
            if not isinstance(x, GradEnv) or len(x) == 0:
                return Done(y if isinstance(y, GradEnv) else x)
            if not isinstance(y, GradEnv) or len(y) == 0:
                return Done(x)
            keys = sorted({k for k, _ in x.items()} | {k for k, _ in y.items()}, key=lambda k: k.name)
            return Split(GradEnv({k: None for k in keys}),
                         [(x.get(k, None), y.get(k, None)) for k in keys])
        if isinstance(x, tuple) and isinstance(y, tuple):
            return Split(x[:min(len(x), len(y))], list(zip(x, y)))
        if x is None:
            return Done(y)
        if y is None:
            return Done(x)
        return Done(x + y)

    return zip_fold(a, b, visit)


# -- loop states -----------------------------------------------------------------------------
def dtype_of(x: Any) -> Any:
    """The (canonical) JAX dtype of a number, numpy array or JAX array."""
    if is_array(x) or isinstance(x, (np.ndarray, np.generic)):
        return jax.dtypes.canonicalize_dtype(x.dtype)
    return jax.dtypes.canonicalize_dtype(jnp.result_type(x))


def widen(state: Any, after: Any) -> tuple[Any, bool]:
    """The loop state that holds both ``state`` (a value) and ``after`` (the
    skeleton of the state one iteration later): leaves that differ become JAX
    arrays of the promoted dtype; equal constants stay constants.  Returns the
    new state and whether anything changed.  A change of structure or shape
    is a :class:`ValueError` saying where."""
    changed = [False]

    def visit(x: Any, y: Any) -> Union[Done, Split]:
        if x is ABSENT and y is ABSENT:
            return Done(ABSENT)
        if x is ABSENT:  # the first iteration had no result: zeros of the later one's
            changed[0] = True
            return Done(map_leaves(y, lambda s: jnp.zeros(s.shape, s.dtype) if isinstance(s, Slot) else s))
        if y is ABSENT:
            return Done(x)
        y_numeric = isinstance(y, Slot) or is_numeric(y)
        if is_numeric(x) and y_numeric and not (not is_array(x) and static_equal(x, y)):
            y_shape = y.shape if isinstance(y, Slot) else np.shape(y)
            if tuple(np.shape(x)) != tuple(y_shape):
                raise ValueError(f"a value of shape {tuple(np.shape(x))} becomes {tuple(y_shape)}")
            dtype = jnp.promote_types(dtype_of(x), y.dtype if isinstance(y, Slot) else dtype_of(y))
            dtype = jax.dtypes.canonicalize_dtype(dtype)
            if is_array(x) and x.dtype == dtype and not getattr(x, "weak_type", False):
                return Done(x)
            changed[0] = True
            return Done(lax.convert_element_type(jnp.asarray(x), dtype))
        split = _same_kind_pairs(x, y) if not isinstance(x, GradEnv) else None
        if split is not None:
            return split
        if isinstance(x, GradEnv) and isinstance(y, GradEnv) and \
                [k for k, _ in x.items()] == [k for k, _ in y.items()]:
            return Split(x, list(zip(items_of(x) or (), items_of(y) or ())))
        if static_equal(x, y):
            return Done(x)
        raise ValueError(f"{_describe(x)} becomes {_describe(y)}")

    result = zip_fold(state, after, visit)
    return result, changed[0]


def conform(value: Any, skeleton: Any) -> list[Any]:
    """The arrays to fill ``skeleton``'s slots with ``value``'s leaves (converted to
    the slots' dtypes); a :class:`ValueError` when ``value`` does not fit."""
    out: dict[int, Any] = {}

    def visit(x: Any, s: Any) -> Union[Done, Split]:
        if isinstance(s, Slot):
            if not is_numeric(x) or tuple(np.shape(x)) != s.shape:
                raise ValueError(f"{_describe(x)} does not fit {s}")
            out[s.index] = lax.convert_element_type(jnp.asarray(x), s.dtype)
            return Done(None)
        if x is ABSENT and s is ABSENT:
            return Done(None)
        if is_array(x):
            raise ValueError("a traced value where the state holds a constant")
        split = _same_kind_pairs(x, s)
        if split is not None and not isinstance(x, GradEnv):
            return split
        if isinstance(x, GradEnv) and isinstance(s, GradEnv) and \
                [k for k, _ in x.items()] == [k for k, _ in s.items()]:
            return Split(x, list(zip(items_of(x) or (), items_of(s) or ())))
        if static_equal(x, s):
            return Done(None)
        raise ValueError(f"{_describe(x)} where the state holds {_describe(s)}")

    zip_fold(value, skeleton, visit, lambda _p, _r: None)
    return [out[i] for i in range(len(out))]


def _describe(x: Any) -> str:
    if isinstance(x, Slot):
        return f"a traced {np.dtype(x.dtype).name}{list(x.shape)}"
    if is_array(x):
        return f"a traced {x.dtype}{list(x.shape)}"
    if isinstance(x, Closure):
        return f"a closure of @{x.graph.name}"
    if isinstance(x, FuncGraph):
        return f"@{x.name}"
    if isinstance(x, tuple):
        return f"a tuple of {len(x)}"
    if isinstance(x, float) and math.isnan(x):
        return "nan"
    text = repr(x)
    return text if len(text) < 40 else type(x).__name__


__all__ = ["ABSENT", "Continue", "Done", "Either", "Slot", "Split", "conform", "contains_array",
           "contains_kind", "dtype_of", "flatten", "gadd", "is_array", "is_numeric", "is_traced",
           "items_of", "leaves", "map_leaves", "map_tuples", "rebuild", "select", "static_equal", "unflatten",
           "widen", "zeros_like", "zip_fold"]

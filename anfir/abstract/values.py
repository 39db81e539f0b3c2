"""Abstract values: what the specializer knows about a value without running it.

Every class is a frozen dataclass (hashable, comparable), so abstract values
can key caches (one specialized graph per signature).  ``str()`` gives the
dump syntax used in ``.ir`` files (``<Float64>``, ``<f64[B, H]>``), which the
``.ir`` loader parses back.

Tensor dimensions are ``int`` or sympy expressions (dimension variables such
as ``B`` are ``sympy.Symbol``); ``shape=None`` means "any rank" (``f64[*]``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Union

import numpy as np
import sympy

from anfir.dtypes import abstract_name, complex_text, literal_dtype
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.nested import nested_text

Dim = Union[int, sympy.Expr]


class _Unknown:
    """The value of a scalar that is not known at compile time."""

    _instance: Optional["_Unknown"] = None

    def __new__(cls) -> "_Unknown":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNKNOWN"

    def __reduce__(self) -> str:
        return "UNKNOWN"


UNKNOWN = _Unknown()
"""Marks a scalar whose value is not known."""


class AbstractValue:
    """Base of every abstract value."""

    __slots__ = ()

    def __str__(self) -> str:  # pragma: no cover - every subclass overrides
        return "<?>"


@dataclass(frozen=True)
class AScalar(AbstractValue):
    """A Python scalar: ``dtype`` is ``f64`` (float), ``i64`` (int) or ``bool``
    (or another dtype after a cast); ``value`` is the constant or UNKNOWN."""

    dtype: str
    value: Any = UNKNOWN

    def __str__(self) -> str:
        name = abstract_name(self.dtype)
        if self.value is UNKNOWN:
            return f"<{name}>"
        return f"<{name} = {_scalar_text(self.value)}>"

    def widen(self) -> "AScalar":
        """The same type with the value forgotten."""
        return AScalar(self.dtype) if self.value is not UNKNOWN else self


@dataclass(frozen=True)
class ATensor(AbstractValue):
    """A numpy array of ``dtype`` whose shape is ``shape`` (None: rank not known).

    When the rank is not known, ``leading`` holds the dimensions known to come
    first (``f64[N, *]``: ``shape=None, leading=(N,)``, so the rank is at least
    ``len(leading)``); with a known ``shape`` it is always ``()``.  Code that
    only looks at ``shape`` treats such a tensor as "any rank", which is sound.
    """

    dtype: str
    shape: Optional[tuple[Dim, ...]]
    leading: tuple[Dim, ...] = ()

    def __post_init__(self) -> None:
        if self.leading and self.shape is not None:
            raise ValueError("ATensor: leading dimensions are only for a tensor of unknown rank")

    def __str__(self) -> str:
        if self.shape is None:
            if self.leading:
                return f"<{self.dtype}[{', '.join(dim_text(d) for d in self.leading)}, *]>"
            return f"<{self.dtype}[*]>"
        return f"<{self.dtype}[{', '.join(dim_text(d) for d in self.shape)}]>"

    @property
    def rank(self) -> Optional[int]:
        """The number of dimensions, or None when unknown."""
        return None if self.shape is None else len(self.shape)

    @property
    def min_rank(self) -> int:
        """The least number of dimensions the tensor can have."""
        return len(self.leading) if self.shape is None else len(self.shape)


@dataclass(frozen=True, eq=False)
class ATuple(AbstractValue):
    """A tuple whose elements are ``items``.

    Equality, hashing and text walk nested tuples with an explicit stack (a
    constant may be a tuple nested thousands deep); the hash is cached.
    """

    items: tuple[AbstractValue, ...]

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not ATuple:
            return NotImplemented
        stack: list[tuple[ATuple, ATuple]] = [(self, other)]
        while stack:
            a, b = stack.pop()
            if len(a.items) != len(b.items):
                return False
            ha, hb = a.__dict__.get("_hash"), b.__dict__.get("_hash")
            if ha is not None and hb is not None and ha != hb:
                return False
            for x, y in zip(a.items, b.items):
                if x is y:
                    continue
                if x.__class__ is ATuple:
                    if y.__class__ is not ATuple:
                        return False
                    stack.append((x, y))
                elif y.__class__ is ATuple or x != y:
                    return False
        return True

    def __hash__(self) -> int:
        cached: Optional[int] = self.__dict__.get("_hash")
        if cached is not None:
            return cached
        stack: list[tuple[ATuple, bool]] = [(self, False)]
        while stack:
            t, ready = stack.pop()
            if "_hash" in t.__dict__:
                continue
            if ready:
                h = hash(("ATuple",) + tuple(i.__dict__["_hash"] if i.__class__ is ATuple
                                             else hash(i) for i in t.items))
                object.__setattr__(t, "_hash", h)
                continue
            stack.append((t, True))
            for i in t.items:
                if i.__class__ is ATuple and "_hash" not in i.__dict__:
                    stack.append((i, False))
        result: int = self.__dict__["_hash"]
        return result

    def __str__(self) -> str:
        return nested_text(self, _atuple_items, str, "<Tuple(", ")>", one_comma=False)

    def __repr__(self) -> str:
        return nested_text(self, _atuple_items, repr, "ATuple(items=(", "))")


@dataclass(frozen=True)
class AString(AbstractValue):
    """A string (``value`` known or UNKNOWN)."""

    value: Any = UNKNOWN

    def __str__(self) -> str:
        if self.value is UNKNOWN:
            return "<String>"
        return f"<String = {_string_text(self.value)}>"


@dataclass(frozen=True)
class ANone(AbstractValue):
    """None."""

    def __str__(self) -> str:
        return "<None>"


@dataclass(frozen=True)
class AEnv(AbstractValue):
    """A gradient environment (the gradient of a closure)."""

    def __str__(self) -> str:
        return "<GradEnv>"


@dataclass(frozen=True)
class AKey(AbstractValue):
    """A symbolic key naming a captured value in a gradient environment."""

    def __str__(self) -> str:
        return "<Key>"


@dataclass(frozen=True)
class AType(AbstractValue):
    """A type used as a value (e.g. the dtype argument of cast)."""

    def __str__(self) -> str:
        return "<Type>"


@dataclass(frozen=True)
class AAny(AbstractValue):
    """Nothing is known (the top of the lattice)."""

    def __str__(self) -> str:
        return "<Any>"


# -- functions ---------------------------------------------------------------
class FunctionAtom:
    """One function a value may be: a graph, a primitive, a partial application..."""

    __slots__ = ()


@dataclass(frozen=True, eq=False)
class GraphFn(FunctionAtom):
    """The graph ``graph`` (a closure when it has free variables).

    Compared by the graph's identity.
    """

    graph: Any

    def __eq__(self, other: object) -> bool:
        return isinstance(other, GraphFn) and other.graph is self.graph

    def __hash__(self) -> int:
        return hash(("GraphFn", id(self.graph)))

    def __str__(self) -> str:
        return f"@{self.graph.name}"


@dataclass(frozen=True)
class PrimFn(FunctionAtom):
    """A primitive or meta function."""

    prim: Union[Primitive, MetaFunction]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PrimFn) and other.prim is self.prim

    def __hash__(self) -> int:
        return hash(("PrimFn", id(self.prim)))

    def __str__(self) -> str:
        return self.prim.name


@dataclass(frozen=True)
class PartialFn(FunctionAtom):
    """``partial(fn, *args)`` with the arguments' abstract values."""

    fn: FunctionAtom
    args: tuple[AbstractValue, ...]

    def __str__(self) -> str:
        return f"partial({self.fn}, {', '.join(str(a) for a in self.args)})"


@dataclass(frozen=True)
class JFn(FunctionAtom):
    """The J-transform of ``fn`` (returns ``(value, bprop)``)."""

    fn: FunctionAtom

    def __str__(self) -> str:
        return f"J({self.fn})"


@dataclass(frozen=True)
class GradFn(FunctionAtom):
    """``grad(fn, *wrt)`` (``with_value=False``) or ``value_and_grad(fn, *wrt)``.

    Calling it infers ``fn`` on the arguments, requires a float scalar result
    and returns the arguments' types at ``wrt`` (a tuple when several); with
    ``with_value`` the result is ``(out, grads)``.  The ``ad`` phase expands it.
    """

    fn: FunctionAtom
    wrt: tuple[int, ...] = (0,)
    with_value: bool = False

    def __str__(self) -> str:
        name = "value_and_grad" if self.with_value else "grad"
        return f"{name}({self.fn}, {', '.join(str(i) for i in self.wrt)})"


@dataclass(frozen=True)
class AFunction(AbstractValue):
    """A function value: one of ``options`` (a switch may merge several)."""

    options: frozenset[FunctionAtom]

    def __str__(self) -> str:
        names = sorted(str(o) for o in self.options)
        if len(names) == 1:
            return f"<Func {names[0]}>"
        return f"<Func {{{', '.join(names)}}}>"


@dataclass(frozen=True)
class GraphSig(AbstractValue):
    """A specialized graph's signature (``graph.abstract``): ``(<Float64>, <Int64>) -> <Float64>``."""

    params: tuple[AbstractValue, ...]
    out: AbstractValue

    def __str__(self) -> str:
        return f"({', '.join(str(p) for p in self.params)}) -> {self.out}"


def _atuple_items(a: Any) -> Optional[tuple[AbstractValue, ...]]:
    return a.items if a.__class__ is ATuple else None


# -- text helpers ------------------------------------------------------------
def dim_text(dim: Dim) -> str:
    """A dimension as text: ``3``, ``B``, ``2*B``."""
    if isinstance(dim, int):
        return str(dim)
    if isinstance(dim, sympy.Integer):
        return str(int(dim))
    return str(dim).replace(" ", "")


def _scalar_text(value: Any) -> str:
    if isinstance(value, np.generic):  # np.float64 is a float, but its repr is not ANF
        value = value.item()
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, complex):
        return complex_text(value)
    return str(value)


def _string_text(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def scalar_dtype_of(value: Any) -> Optional[str]:
    """The abstract dtype of a Python scalar (bool before int: bool is an int)."""
    return literal_dtype(value)

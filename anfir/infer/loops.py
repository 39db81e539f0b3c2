"""Typing the structured loops (``scan``, ``fori_loop``) and custom derivatives.

Their first arguments are functions, and typing a call of them means typing
a call of the body — a request only the engine can answer, so these are
generator *callers* (``caller(engine, args, node)``, as the atom callers of
:mod:`anfir.infer.engine`), found in :data:`PRIMITIVE_CALLERS` keyed by the
primitive object.

A loop's carry must keep its type: the body is typed once on the carry's type
with constants forgotten (``widen``), and the carry it returns must fit that
type (JAX asks the same of ``lax.scan``).  The stacked ``ys`` get the number
of steps as their leading dimension: the leading dimension of ``xs`` (a
dimension variable when ``xs`` is ``f64[T, 3]``), or ``length=``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Generator, Optional

from anfir.abstract.lattice import BOTTOM, JoinError, join, map_tuple_leaves, tuple_leaves, widen
from anfir.abstract.shapes import fresh_dim
from anfir.abstract.values import (AAny, AbstractValue, ANone, AScalar, ATensor, ATuple, Dim)
from anfir.errors import AnfirTypeError, ShapeError
from anfir.ir.attrs import NO_ATTRS
from anfir.ir.nodes import CNode
from anfir.primitives import loops

if TYPE_CHECKING:  # pragma: no cover
    from anfir.infer.engine import Engine

Infer = Generator[tuple, Any, AbstractValue]
PrimitiveCaller = Callable[["Engine", tuple, Optional[CNode]], Infer]


def _loc(node: Optional[CNode]) -> Any:
    return node.loc if node is not None else None


def _same_dim(a: Dim, b: Dim) -> bool:
    try:
        return bool(a == b) or (not isinstance(a, int) or not isinstance(b, int)) and (a - b) == 0
    except TypeError:  # pragma: no cover - defensive
        return False


def _steps(xs: AbstractValue, length: Optional[int], node: Optional[CNode]) -> Dim:
    """The number of steps, from ``xs``' leading dimensions or ``length``."""
    found: Optional[Dim] = None
    for leaf in tuple_leaves(xs):
        if isinstance(leaf, (ANone, AAny)):
            continue
        if isinstance(leaf, ATensor):
            if leaf.shape is not None:
                if not leaf.shape:
                    raise ShapeError(f"scan: xs has a tensor of rank 0 ({leaf}); every tensor of "
                                     "xs needs a leading axis to scan over", _loc(node))
                dim = leaf.shape[0]
            elif leaf.leading:
                dim = leaf.leading[0]
            else:
                continue
            if found is None:
                found = dim
            elif isinstance(found, int) and isinstance(dim, int) and found != dim:
                raise ShapeError(f"scan: the tensors of xs have different leading sizes "
                                 f"({found} and {dim})", _loc(node))
            continue
        raise AnfirTypeError(f"scan: xs is a tensor, a tuple of tensors, or None; it holds {leaf}",
                             _loc(node))
    if length is not None:
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise AnfirTypeError(f"scan: length is a non-negative integer, got {length!r}", _loc(node))
        if found is not None and isinstance(found, int) and found != length:
            raise ShapeError(f"scan: length={length} but xs has {found} rows", _loc(node))
        return length
    if found is None:
        if all(isinstance(leaf, ANone) for leaf in tuple_leaves(xs)):
            raise AnfirTypeError("scan: without xs, give length=", _loc(node))
        return fresh_dim()
    return found


def _slice_leaf(a: AbstractValue) -> AbstractValue:
    # A row of a vector is a number, as in the evaluator (a numpy scalar).
    if isinstance(a, ATensor):
        if a.shape is not None:
            return AScalar(a.dtype) if len(a.shape) == 1 else ATensor(a.dtype, a.shape[1:])
        return ATensor(a.dtype, None, a.leading[1:])
    return a


def _stack_leaf(n: Dim) -> Callable[[AbstractValue], AbstractValue]:
    def stack(a: AbstractValue) -> AbstractValue:
        if isinstance(a, ATensor):
            if a.shape is not None:
                return ATensor(a.dtype, (n, *a.shape))
            return ATensor(a.dtype, None, (n, *a.leading))
        if isinstance(a, AScalar):
            return ATensor(a.dtype, (n,))
        if isinstance(a, (ANone, AAny)):
            return a
        raise AnfirTypeError(f"scan: the body's y is made of tensors, numbers and None; it holds {a}")
    return stack


def _carry_fits(before: AbstractValue, after: AbstractValue, what: str, node: Optional[CNode]) -> None:
    """The carry the body returns must have the type it was given (a part of unknown
    type — typing for any arguments — is not checked)."""
    if any(isinstance(leaf, AAny) for leaf in tuple_leaves(after)):
        return
    try:
        joined = join(before, widen(after))
    except JoinError:
        joined = None
    if joined != before:
        raise AnfirTypeError(f"{what}: the carry's type changes in the body, from {before} to "
                             f"{widen(after)} (it must keep its type: cast the initial value)",
                             _loc(node))


def infer_scan(engine: "Engine", args: tuple, node: Optional[CNode]) -> Infer:
    """``scan(f, init, xs)`` → ``(carry, ys)``."""
    attrs = loops.scan.bound_attrs(node.attrs if node is not None else NO_ATTRS)
    if not loops.scan.accepts(len(args)):
        raise AnfirTypeError(f"scan takes {loops.scan.arity_text()} arguments, got {len(args)}",
                             _loc(node))
    f, init = args[0], args[1]
    xs: AbstractValue = args[2] if len(args) > 2 else ANone()
    if any(a is BOTTOM for a in args):
        return BOTTOM
    n = _steps(xs, attrs["length"], node)
    x = map_tuple_leaves(xs, _slice_leaf)
    carry = widen(init)
    out = yield from engine.call(f, (carry, x), node)
    if out is BOTTOM:
        return BOTTOM
    if isinstance(out, AAny):
        return ATuple((carry, AAny()))
    if not isinstance(out, ATuple) or len(out.items) != 2:
        raise AnfirTypeError(f"scan: the body returns a pair (carry, y), not {out}", _loc(node))
    _carry_fits(carry, out.items[0], "scan", node)
    try:
        ys = map_tuple_leaves(widen(out.items[1]), _stack_leaf(n))
    except AnfirTypeError as exc:
        raise AnfirTypeError(exc.message, _loc(node)) from None
    return ATuple((carry, ys))


def infer_fori_loop(engine: "Engine", args: tuple, node: Optional[CNode]) -> Infer:
    """``fori_loop(lo, hi, body, init)`` → the carry."""
    if len(args) != 4:
        raise AnfirTypeError(f"fori_loop takes 4 arguments, got {len(args)}", _loc(node))
    lo, hi, body, init = args
    if any(a is BOTTOM for a in args):
        return BOTTOM
    for what, bound in (("lo", lo), ("hi", hi)):
        if not isinstance(bound, AAny) and not (
                isinstance(bound, AScalar) and bound.dtype.startswith(("i", "u"))) and not (
                isinstance(bound, ATensor) and bound.shape == () and bound.dtype.startswith(("i", "u"))):
            raise AnfirTypeError(f"fori_loop: {what} is an integer, got {bound}", _loc(node))
    carry = widen(init)
    out = yield from engine.call(body, (AScalar("i64"), carry), node)
    if out is BOTTOM:
        return BOTTOM
    if isinstance(out, AAny):
        return carry
    _carry_fits(carry, out, "fori_loop", node)
    return carry


PRIMITIVE_CALLERS: dict[Any, PrimitiveCaller] = {
    loops.scan: infer_scan,
    loops.fori_loop: infer_fori_loop,
}
"""Typing of the primitives that call their function arguments, keyed by the object."""

__all__ = ["PRIMITIVE_CALLERS", "infer_fori_loop", "infer_scan"]

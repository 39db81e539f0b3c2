"""Structured loops: ``scan`` and ``fori_loop`` (as ``lax.scan`` / ``lax.fori_loop``).

A loop written as tail recursion is differentiated exactly, but its gradient is
a chain of closures, which no first-order format (ONNX, MIL, StableHLO) can
hold.  A *structured* loop says what it iterates: ``scan(f, init, xs)`` calls
``f(carry, x) -> (carry, y)`` once per leading slice of ``xs`` and stacks the
``y`` along a new leading axis; ``fori_loop(lo, hi, body, init)`` calls
``body(i, carry) -> carry`` for ``i`` from ``lo`` to ``hi - 1``.  Their
gradient is again a ``scan`` (over the stacked carries, run backwards: see
:mod:`anfir.autodiff.loops`), so the gradient stays first-order data.

They are primitives whose first argument(s) are functions: the evaluator runs
the loop here, calling the body through the evaluator's ``call_function``
(an upcall: the evaluator sits above the op library); the inference engine
types them with the callers of :mod:`anfir.infer.loops` (typing the body
needs the engine).  ``infer`` below is only a guard that is never reached
through the engine.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from anfir.errors import AnfirRuntimeError, AnfirTypeError
from anfir.ir.upcalls import UPCALLS
from anfir.primitives.registry import declare

FAMILY = "loops"


def flatten_value(value: Any) -> tuple[list[Any], Any]:
    """The leaves of a nested tuple, left to right, and a template to rebuild it
    (an explicit stack: any depth)."""
    leaves: list[Any] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            stack.extend(reversed(item))
        else:
            leaves.append(item)
    return leaves, value


def unflatten_value(template: Any, leaves: list[Any]) -> Any:
    """``template`` with its leaves replaced by ``leaves`` (in :func:`flatten_value`'s order)."""
    if not isinstance(template, tuple):
        return leaves[0]
    it = iter(leaves)
    # Post-order rebuild with an explicit stack.
    done: list[Any] = []
    stack: list[tuple[Any, bool]] = [(template, False)]
    while stack:
        item, ready = stack.pop()
        if not isinstance(item, tuple):
            done.append(next(it))
        elif ready:
            n = len(item)
            built = tuple(done[len(done) - n:]) if n else ()
            del done[len(done) - n:]
            done.append(built)
        else:
            stack.append((item, True))
            stack.extend((i, False) for i in reversed(item))
    return done[0]


def _kind(value: Any) -> tuple[Any, ...]:
    """What a carry must keep from step to step (as the compiled program's types do):
    its tuple structure and, per leaf, number or tensor, dtype and shape."""
    out: list[Any] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            out.append(len(item))
            stack.extend(reversed(item))
        elif isinstance(item, np.ndarray):
            out.append(("tensor", item.dtype.str, item.shape))
        elif isinstance(item, (bool, int, float, complex, np.generic)):
            out.append(("number", np.asarray(item).dtype.kind))
        else:
            out.append(type(item).__name__)
    return tuple(out)


def check_carry(what: str, before: Any, after: Any) -> None:
    """Raise the error the compiler gives when a loop's carry changes its type."""
    if before is not after and _kind(before) != _kind(after):
        raise AnfirTypeError(f"{what}: the carry's type changes in the body (it must keep its "
                             "type: cast the initial value)")


def _leading(leaf: Any) -> Optional[int]:
    if leaf is None:
        return None
    if isinstance(leaf, np.ndarray) and leaf.ndim >= 1:
        return int(leaf.shape[0])
    raise AnfirTypeError(f"scan: every leaf of xs is a tensor with a leading axis (or None); "
                         f"got {type(leaf).__name__}"
                         + (" of rank 0" if isinstance(leaf, np.ndarray) else ""))


def scan_length(xs: Any, length: Optional[int]) -> int:
    """The number of steps: the common leading size of ``xs``' tensors, or ``length``."""
    leaves, _ = flatten_value(xs)
    sizes = {n for n in (_leading(leaf) for leaf in leaves) if n is not None}
    if len(sizes) > 1:
        raise AnfirTypeError(f"scan: the tensors of xs have different leading sizes "
                             f"({', '.join(map(str, sorted(sizes)))})")
    if length is not None:
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise AnfirTypeError(f"scan: length is a non-negative integer, got {length!r}")
        if sizes and length not in sizes:
            raise AnfirTypeError(f"scan: length={length} but xs has {sizes.pop()} rows")
        return length
    if not sizes:
        raise AnfirTypeError("scan: without xs (or with xs made only of None), give length=")
    return sizes.pop()


def _slice(leaves: list[Any], i: int) -> list[Any]:
    return [None if leaf is None else leaf[i] for leaf in leaves]


def _stack(steps: list[list[Any]], template_leaves: list[Any]) -> list[Any]:
    out: list[Any] = []
    for j, first in enumerate(template_leaves):
        if first is None:
            out.append(None)
            continue
        column = [np.asarray(step[j]) for step in steps]
        shapes = {c.shape for c in column}
        if len(shapes) > 1:
            raise AnfirTypeError("scan: the body returns ys of different shapes at different "
                                 f"steps ({', '.join(map(str, sorted(shapes)))})")
        out.append(np.stack(column))
    return out


def _empty_stack(template_leaves: list[Any]) -> list[Any]:
    return [None if leaf is None else np.zeros((0, *np.shape(leaf)), np.asarray(leaf).dtype)
            for leaf in template_leaves]


def _scan(f: Any, init: Any, xs: Any = None, length: Optional[int] = None,
          reverse: bool = False) -> Any:
    """scan(f, init, xs): the final carry and the stacked ys (see the module doc)."""
    call = UPCALLS.call_function
    n = scan_length(xs, length)
    x_leaves, x_template = flatten_value(xs)
    carry = init
    steps: list[list[Any]] = []
    y_template: Any = None
    order = range(n - 1, -1, -1) if reverse else range(n)
    for i in order:
        x = unflatten_value(x_template, _slice(x_leaves, i)) if x_leaves else xs
        out = call(f, (carry, x))
        if not isinstance(out, tuple) or len(out) != 2:
            raise AnfirTypeError("scan: the body returns a pair (carry, y)")
        check_carry("scan", carry, out[0])
        carry, y = out
        leaves, y_template = flatten_value(y)
        steps.append(leaves)
    if reverse:
        steps.reverse()
    if n == 0:
        # No step ran: one call on zero slices tells the structure and shapes of y.
        probe = [None if leaf is None else np.zeros(leaf.shape[1:], leaf.dtype) for leaf in x_leaves]
        x = unflatten_value(x_template, probe) if x_leaves else xs
        out = call(f, (carry, x))
        if not isinstance(out, tuple) or len(out) != 2:
            raise AnfirTypeError("scan: the body returns a pair (carry, y)")
        leaves, y_template = flatten_value(out[1])
        return (carry, unflatten_value(y_template, _empty_stack(leaves)))
    return (carry, unflatten_value(y_template, _stack(steps, steps[0])))


def _int_bound(value: Any, what: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) and not (
            isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iu"):
        raise AnfirTypeError(f"fori_loop: {what} is an integer, got {type(value).__name__}")
    return int(value)


def _fori_loop(lo: Any, hi: Any, body: Any, init: Any) -> Any:
    """fori_loop(lo, hi, body, init): body(i, carry) for i in lo..hi-1."""
    call = UPCALLS.call_function
    start, stop = _int_bound(lo, "lo"), _int_bound(hi, "hi")
    carry = init
    for i in range(start, stop):
        new = call(body, (i, carry))
        check_carry("fori_loop", carry, new)
        carry = new
    return carry


def _typed_by_engine(*_args: Any, **_attrs: Any) -> Any:
    # The engine types these calls itself (anfir.infer.loops): typing the body
    # means inferring a call, which a plain rule cannot request.
    raise AnfirRuntimeError("internal: a structured loop is typed by the inference engine")


scan = declare(
    "scan", (2, 3), _scan, infer=_typed_by_engine, family=FAMILY, foldable=False,
    accepts_any=True, attrs={"length": None, "reverse": False},
    doc="scan(f, init, xs, length=None, reverse=false) — as lax.scan: f(carry, x) -> (carry, y) "
        "for each leading slice x of xs (a tensor, a tuple of them, or None with length=); "
        "returns (carry, ys), the ys stacked on a new leading axis")
fori_loop = declare(
    "fori_loop", 4, _fori_loop, infer=_typed_by_engine, family=FAMILY, foldable=False,
    accepts_any=True,
    doc="fori_loop(lo, hi, body, init) — as lax.fori_loop: carry = body(i, carry) for i in "
        "lo, ..., hi - 1; returns the carry")

def _custom_vjp(f: Any, fwd: Any, bwd: Any) -> Any:
    """custom_vjp(f, fwd, bwd): ``f`` itself; only its derivatives differ (the J transform's)."""
    return f


def _custom_jvp(f: Any, rule: Any) -> Any:
    """custom_jvp(f, rule): ``f`` itself; only its derivatives differ."""
    return f


def _first(f: Any, *_rules: Any) -> Any:
    return f


custom_vjp = declare(
    "custom_vjp", 3, _custom_vjp, infer=_first, family=FAMILY, foldable=False, accepts_any=True,
    doc="custom_vjp(f, fwd, bwd) — f, whose reverse-mode derivative is the user's: fwd(x...) -> "
        "(f(x...), residuals), bwd(residuals, dout) -> (dx...) (as jax.custom_vjp)")
custom_jvp = declare(
    "custom_jvp", 2, _custom_jvp, infer=_first, family=FAMILY, foldable=False, accepts_any=True,
    doc="custom_jvp(f, rule) — f, whose derivative is the user's: rule((x...), (t...)) -> "
        "(f(x...), the derivative along t), linear in t (as jax.custom_jvp)")

__all__ = ["custom_jvp", "custom_vjp", "flatten_value", "fori_loop", "scan", "scan_length", "unflatten_value"]

"""JAX rules of the structured loops and custom derivatives: ``lax.scan``, ``lax.fori_loop``.

Their function arguments are anfir function values (closures of the traced
program); the machine hands a rule of :data:`FUNCTION_ARGUMENTS` a Python
callable in their place, which runs the function in a machine of its own
(JAX traces it as the loop body).  So ``scan`` lowers to one ``lax.scan`` —
whose StableHLO is a ``while`` with the stacked outputs — and the gradient
of a ``scan``, itself a ``scan`` run backwards, to another; ``jax.grad`` of
the lowered function passes through them too.  ``custom_vjp`` / ``custom_jvp``
reach the back end only when the program was not compiled (the ``ad`` phase
replaces them by ``f``): they are ``f`` here as well (the program's gradients,
built by anfir, already hold the rule).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax.numpy as jnp
from jax import lax

from anfir.ir.primitive import Primitive
from anfir.primitives import loops


def _jax_tree(value: Any) -> Any:
    # lax.scan's carry must keep its dtypes: Python numbers become arrays up front
    # (a float 0.0 and the f64 a step returns are then one type).
    if isinstance(value, tuple):
        return tuple(_jax_tree(v) for v in value)
    if isinstance(value, (bool, int, float)):
        return jnp.asarray(value)
    return value


def _pair(out: Any) -> tuple[Any, Any]:
    if not isinstance(out, tuple) or len(out) != 2:
        raise TypeError("scan: the body returns a pair (carry, y)")
    return _jax_tree(out[0]), _jax_tree(out[1])


def scan_rule(f: Callable[..., Any], init: Any, xs: Any = None, length: Optional[int] = None,
              reverse: bool = False) -> Any:
    """``lax.scan`` over the body."""
    return lax.scan(lambda c, x: _pair(f(c, x)), _jax_tree(init), _jax_tree(xs),
                    length=length, reverse=reverse)


def fori_loop_rule(lo: Any, hi: Any, body: Callable[..., Any], init: Any) -> Any:
    """``lax.fori_loop`` (a scan when the bounds are known, as JAX makes it)."""
    return lax.fori_loop(lo, hi, lambda i, c: _jax_tree(body(i, c)), _jax_tree(init))


def custom_rule(f: Any, *_rules: Any) -> Any:
    """``custom_vjp(f, ...)`` / ``custom_jvp(f, ...)`` is ``f``."""
    return f


LOOP_RULES: dict[Primitive, Callable[..., Any]] = {
    loops.scan: scan_rule,
    loops.fori_loop: fori_loop_rule,
    loops.custom_vjp: custom_rule,
    loops.custom_jvp: custom_rule,
}
"""The rules, keyed by primitive (merged into ``RULES``)."""

FUNCTION_ARGUMENTS: frozenset[Primitive] = frozenset({loops.scan, loops.fori_loop})
"""Primitives whose function arguments the machine turns into Python callables."""

__all__ = ["FUNCTION_ARGUMENTS", "LOOP_RULES", "custom_rule", "fori_loop_rule", "scan_rule"]

"""The batching primitives (``vmap``'s, :mod:`anfir.primitives.batching`) as JAX.

The kernels are the op library's own, run over ``jax.numpy``; the fallback loop
``batch_loop`` becomes ``jax.vmap`` of the primitive's JAX rule, so on this back
end every primitive is batched by XLA whatever rule anfir's transform had for it.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from anfir.errors import AnfirTypeError
from anfir.ir.primitive import Primitive
from anfir.primitives import batching as bp

JAX = bp.Kernels(jnp)


def loop_rule(rules: dict[Primitive, Callable[..., Any]]) -> Callable[..., Any]:
    """``batch_loop`` as ``jax.vmap`` of the primitive's rule in ``rules`` (the table)."""
    def loop(op: Any, *args: Any, batched: Any = (), op_attrs: Any = ()) -> Any:
        if not isinstance(op, Primitive):
            raise AnfirTypeError(f"batch_loop applies a primitive, not {type(op).__name__}")
        attrs = dict(op_attrs)
        operands = args[:len(batched)]
        rule = rules.get(op)
        if rule is None:
            raise AnfirTypeError(f"batch_loop: {op.name} has no JAX rule")
        return jax.vmap(lambda *a: rule(*a, **attrs), in_axes=tuple(batched))(*operands)

    return loop


def _basis(x: Any) -> Any:
    x = jnp.asarray(x)
    dtype = x.dtype if jnp.issubdtype(x.dtype, jnp.inexact) else jnp.float64
    n = int(x.size)
    return jnp.eye(n, dtype=dtype).reshape((n,) + tuple(x.shape))


BATCHING_RULES: dict[Primitive, Callable[..., Any]] = {
    bp.batch_expand: JAX.expand,
    bp.batch_unexpand: JAX.unexpand,
    bp.batch_select: JAX.select,
    bp.batch_reshape: JAX.reshape,
    bp.batch_moveaxis: JAX.moveaxis,
    bp.batch_tangent_dot: JAX.tangent_dot,
    bp.batch_tangent_scale: JAX.tangent_scale,
    bp.batch_shape: bp.batch_shape.impl,
    bp.batch_fn: bp.batch_fn.impl,
    bp.jac_basis: _basis,
}
"""The JAX rule of each batching primitive."""

__all__ = ["BATCHING_RULES", "loop_rule"]

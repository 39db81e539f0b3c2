"""JAX rules of the collectives (primitives/collective.py), merged into
:data:`anfir.backends.tojax.rules.RULES`: ``lax.psum``/``pmax``/``pmean``,
``lax.all_gather``, ``lax.psum_scatter``, ``lax.all_to_all`` (all tiled) and
``lax.ppermute``, over the mesh axis the call names — so the function
``anfir.to_jax`` makes of a per-device program runs under ``jax.shard_map``
over a mesh with the same axis names (any devices: CPU, GPU, TPU).
"""

from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec

from anfir.errors import AnfirTypeError
from anfir.eval.mesh import spmd_info
from anfir.ir.primitive import Primitive
from anfir.primitives import collective

Rule = Callable[..., Any]


def _all_reduce(x: Any, axis: Any = "", op: Any = "sum") -> Any:
    reducer = {"sum": lax.psum, "max": lax.pmax, "mean": lax.pmean}.get(op)
    if reducer is None:
        raise AnfirTypeError(f"all_reduce: op is 'sum', 'max' or 'mean', not {op!r}")
    return reducer(x, axis)


def _all_gather(x: Any, axis: Any = "", dim: Any = 0) -> Any:
    return lax.all_gather(jnp.asarray(x), axis, axis=dim, tiled=True)


def _reduce_scatter(x: Any, axis: Any = "", dim: Any = 0) -> Any:
    return lax.psum_scatter(jnp.asarray(x), axis, scatter_dimension=dim, tiled=True)


def _all_to_all(x: Any, axis: Any = "", split_dim: Any = 0, concat_dim: Any = 0) -> Any:
    return lax.all_to_all(jnp.asarray(x), axis, split_dim, concat_dim, tiled=True)


def _ppermute(x: Any, axis: Any = "", perm: Any = (), reverse: Any = False) -> Any:
    pairs = [(b, a) if reverse else (a, b) for a, b in perm]
    return lax.ppermute(jnp.asarray(x), axis, perm=pairs)


def _axis_slice(x: Any, axis: Any = "", dim: Any = 0) -> Any:
    array = jnp.asarray(x)
    size = array.shape[dim] // lax.axis_size(axis)
    return lax.dynamic_slice_in_dim(array, lax.axis_index(axis) * size, size, axis=dim)


def _axis_size(axis: Any = "") -> Any:
    return lax.axis_size(axis)


COLLECTIVE_RULES: dict[Primitive, Rule] = {
    collective.all_reduce: _all_reduce,
    collective.all_gather: _all_gather,
    collective.reduce_scatter: _reduce_scatter,
    collective.all_to_all: _all_to_all,
    collective.ppermute: _ppermute,
    collective.axis_slice: _axis_slice,
    collective.axis_size: _axis_size,
    collective.shard: lambda x, spec=(): x,  # the annotation: the value itself
}
"""The JAX rule of each collective primitive."""


def partition_specs(graph: Any) -> tuple[Any, Any]:
    """``(in_specs, out_specs)`` for ``jax.shard_map`` of a per-device program
    compiled with a mesh (``PartitionSpec``s; tuples where the value is a tuple)."""
    info = spmd_info(graph)
    if info is None:
        raise AnfirTypeError(f"@{getattr(graph, 'name', '?')} is not a per-device program: "
                             "compile it with anfir.compile(..., mesh=...)")

    def convert(spec: Any) -> Any:
        if isinstance(spec, list):
            return tuple(convert(s) for s in spec)
        return PartitionSpec() if spec is None else PartitionSpec(*spec)

    return tuple(convert(s) for s in info["in"]), convert(info["out"])


__all__ = ["COLLECTIVE_RULES", "partition_specs"]

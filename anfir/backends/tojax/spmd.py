"""A per-device program over JAX's devices: ``jax.shard_map`` of ``anfir.to_jax``.

``anfir.compile(..., mesh=...)`` returns the program each device runs
(docs/parallelism.md); :func:`spmd_function` runs it on a JAX mesh with the
program's axis names and sizes — the arguments placed by their layouts
(``NamedSharding``), the function jitted under ``jax.shard_map`` — so XLA runs
the collectives anfir inserted, on CPU devices
(``--xla_force_host_platform_device_count``), GPUs or TPUs alike.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from anfir.backends.tojax.collective_rules import partition_specs
from anfir.backends.tojax.function import JaxFunction
from anfir.errors import AnfirTypeError
from anfir.eval.mesh import spmd_info


class SpmdFunction:
    """A per-device program over the JAX devices: called on global arrays, it places
    them by their layouts and runs ``jax.jit(jax.shard_map(anfir.to_jax(graph)))``
    on a mesh of the program's axis names and sizes (see :func:`spmd_function`)."""

    def __init__(self, graph: Any, devices: Any = None) -> None:
        info = spmd_info(graph)
        if info is None:
            raise AnfirTypeError(f"@{getattr(graph, 'name', '?')} is not a per-device program: "
                                 "compile it with anfir.compile(..., mesh=...)")
        mesh = info["mesh"]
        self.mesh = jax.make_mesh(tuple(mesh.values()), tuple(mesh), devices=devices)
        """The JAX mesh (``jax.make_mesh`` of the program's axes)."""
        self.in_specs, self.out_specs = partition_specs(graph)
        self.jitted = jax.jit(jax.shard_map(JaxFunction(graph), mesh=self.mesh,
                                            in_specs=self.in_specs, out_specs=self.out_specs,
                                            check_vma=False))
        """The jitted ``shard_map`` of the per-device function."""

    def place(self, *args: Any) -> list[Any]:
        """The global ``args`` put on the devices by their layouts."""
        return [jax.tree.map(lambda a, s: jax.device_put(jnp.asarray(a),
                                                         NamedSharding(self.mesh, s)), a, s)
                for a, s in zip(args, self.in_specs)]

    def __call__(self, *args: Any) -> Any:
        return self.jitted(*self.place(*args))

    def lower(self, *args: Any) -> Any:
        """``jax.jit(...).lower`` on the placed arguments (``.compile().as_text()`` is
        the partitioned HLO)."""
        return self.jitted.lower(*self.place(*args))


def spmd_function(graph: Any, devices: Any = None) -> SpmdFunction:
    """The per-device program ``graph`` (``anfir.compile(..., mesh=...)``) as a function
    of global arrays over JAX's devices (``devices``: the first of ``jax.devices()``)."""
    return SpmdFunction(graph, devices)


__all__ = ["SpmdFunction", "partition_specs", "spmd_function"]

"""Run by tests/test_spmd.py in a subprocess with 8 simulated CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8`` must be set before JAX
starts, which the rest of the suite must not see).  Prints one JSON object:
the largest relative error of each check against its reference."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

jax.config.update("jax_enable_x64", True)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import anfir  # noqa: E402
from anfir.backends.tojax.collective_rules import partition_specs  # noqa: E402
from anfir.eval.mesh import simulate  # noqa: E402
import spmd_cases as cases  # noqa: E402


def on_mesh(cg: anfir.FuncGraph, mesh: dict, args: list) -> object:
    """The per-device program under jax.shard_map on a JAX mesh of the same axes."""
    jmesh = jax.make_mesh(tuple(mesh.values()), tuple(mesh))
    ins, outs = partition_specs(cg)
    fn = jax.jit(jax.shard_map(anfir.to_jax(cg), mesh=jmesh, in_specs=ins, out_specs=outs,
                               check_vma=False))
    placed = [jax.tree.map(lambda a, s: jax.device_put(jnp.asarray(a), NamedSharding(jmesh, s)),
                           a, s) for a, s in zip(args, ins)]
    return jax.tree.map(np.asarray, fn(*placed))


def nested_tuple(x: object) -> object:
    if isinstance(x, (list, tuple)):
        return tuple(nested_tuple(i) for i in x)
    return x


results: dict[str, float] = {}
import time  # noqa: E402
_start = time.perf_counter()
assert jax.device_count() == 8, jax.device_count()

mod = cases.mlp_module()
args = cases.mlp_args()
want = anfir.run(mod["step"], *args)
for name, (mesh, shardings) in cases.MLP_STRATEGIES.items():
    cg = anfir.compile(mod, entry="step", args=args, mesh=mesh, in_shardings=shardings)
    results[f"mlp {name} f64"] = cases.max_rel_error(nested_tuple(on_mesh(cg, mesh, args)), want)

mod = cases.block_module()
for tag in ("f64", "f32"):
    args = cases.block_args()
    if tag == "f32":
        args = jax.tree.map(lambda a: np.asarray(a, np.float32), args)
    want = anfir.run(mod["step"], *args)  # the single-device program, same dtype
    for name, (mesh, shardings) in cases.BLOCK_STRATEGIES.items():
        if tag == "f32" and name != "dp4xmp2":
            continue
        cg = anfir.compile(mod, entry="step", args=args, mesh=mesh, in_shardings=shardings)
        results[f"block {name} {tag}"] = cases.max_rel_error(
            nested_tuple(on_mesh(cg, mesh, args)), want)

# The collectives' gradients: anfir's gradient of a per-device program, simulated,
# against jax.grad of the same function inside jax.shard_map (check_vma on).
GRADS = {
    "all_reduce": ("def f(x) = sum(all_reduce(x, \"mp\") ** 3)",
                   lambda x: jnp.sum(lax.psum(x, "mp") ** 3)),
    "all_reduce_mean": ("def f(x) = sum(all_reduce(x, \"mp\", \"mean\") ** 3)",
                        lambda x: jnp.sum(lax.pmean(x, "mp") ** 3)),
    "all_gather": ("def f(x) = sum(all_gather(x, \"mp\", 0) ** 3)",
                   lambda x: jnp.sum(lax.all_gather(x, "mp", axis=0, tiled=True) ** 3)),
    "reduce_scatter": ("def f(x) = sum(reduce_scatter(x, \"mp\", 1) ** 3)",
                       lambda x: jnp.sum(lax.psum_scatter(x, "mp", scatter_dimension=1,
                                                          tiled=True) ** 3)),
    "all_to_all": ("def f(x) = sum(all_to_all(x, \"mp\", 1, 0) ** 3)",
                   lambda x: jnp.sum(lax.all_to_all(x, "mp", 1, 0, tiled=True) ** 3)),
    "ppermute": ("def f(x) = sum(ppermute(x, \"mp\", ((0, 1), (1, 2), (2, 3), (3, 0))) ** 3 * x)",
                 lambda x: jnp.sum(lax.ppermute(x, "mp", [(0, 1), (1, 2), (2, 3), (3, 0)]) ** 3
                                   * x)),
}
rng = np.random.default_rng(1)
x = rng.normal(size=(8, 32))
jmesh = jax.make_mesh((2, 4), ("dp", "mp"))
for name, (text, jax_fn) in GRADS.items():
    graph = anfir.grad(anfir.parse(text)["f"])
    got = simulate(graph, {"dp": 2, "mp": 4}, [("dp", "mp")], ("dp", "mp"), x)
    want_grad = jax.jit(jax.shard_map(jax.grad(jax_fn), mesh=jmesh, in_specs=P("dp", "mp"),
                                      out_specs=P("dp", "mp")))(
        jax.device_put(x, NamedSharding(jmesh, P("dp", "mp"))))
    results[f"grad {name}"] = cases.max_rel_error(got, np.asarray(want_grad))

results["seconds"] = time.perf_counter() - _start
print(json.dumps(results))

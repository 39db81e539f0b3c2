"""The evaluator on a simulated mesh: one per-device program, N devices.

:func:`simulate` is the evaluator's ``shard_map``: it splits each global
argument into the blocks its layout gives every device, runs the per-device
program once per device — each device on its own thread, with its own
:class:`~anfir.primitives.collective.DeviceContext`, so that the collectives
(``all_reduce``...) meet their group's values at the hub — and puts the
devices' results back together by the output layouts.

A *layout* (spec) is written as JAX's ``PartitionSpec``: for a tensor, a tuple
with a mesh axis name (the dimension split in equal blocks over that axis)
or None (whole) per dimension; None alone means replicated; for a tuple value,
a list (or tuple) with one layout per item.  :data:`SPMD_KEY` is where a
compiled per-device program keeps its mesh and layouts (in its definition's
metadata, so its ``.ir`` dump reloads as the same SPMD program).
"""

from __future__ import annotations

import threading
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from anfir.errors import AnfirError, UsageError
from anfir.eval import run
from anfir.eval.compiler import code_for
from anfir.ir.graph import FuncGraph
from anfir.primitives.collective import DeviceContext, MeshError, MeshHub, check_spec, on_device

SPMD_KEY = "spmd"
"""The key of a per-device program's mesh and layouts in ``graph.flags["meta"]``."""


def check_mesh(mesh: Any) -> dict[str, int]:
    """``mesh`` checked: a mapping from axis names to positive sizes."""
    if not isinstance(mesh, Mapping) or not mesh:
        raise UsageError(f"a mesh maps axis names to sizes, as {{'dp': 4, 'mp': 2}}, not {mesh!r}")
    result: dict[str, int] = {}
    for name, size in mesh.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise UsageError(f"mesh axis names are identifiers, not {name!r}")
        if type(size) is not int or size < 1:
            raise UsageError(f"mesh axis '{name}' needs a positive int size, not {size!r}")
        result[name] = size
    return result


def _leaf_spec(spec: Any, value: Any, mesh: Mapping[str, int], what: str) -> Optional[tuple]:
    if spec is None:
        return None
    spec = tuple(spec) if isinstance(spec, list) else spec
    try:
        check_spec(spec, what)
    except AnfirError as exc:
        raise UsageError(str(exc)) from None
    rank = np.ndim(value)
    if len(spec) != rank:
        raise UsageError(f"{what}: layout {spec!r} has {len(spec)} entries for a value of rank "
                         f"{rank}")
    for dim, axis in enumerate(spec):
        if axis is None:
            continue
        if axis not in mesh:
            raise UsageError(f"{what}: layout {spec!r} names axis '{axis}', which the mesh "
                             f"{dict(mesh)} lacks")
        if np.shape(value)[dim] % mesh[axis]:
            raise UsageError(f"{what}: dimension {dim} (size {np.shape(value)[dim]}) does not "
                             f"split into {mesh[axis]} equal blocks over '{axis}'")
    return spec


def local_value(value: Any, spec: Any, hub: MeshHub, device: int, what: str = "an argument") -> Any:
    """The block of the global ``value`` that ``device`` holds under layout ``spec``."""
    if isinstance(value, tuple):
        if spec is None:
            return value
        if not isinstance(spec, (list, tuple)) or len(spec) != len(value):
            raise UsageError(f"{what}: a tuple of {len(value)} needs a list of {len(value)} "
                             f"layouts, not {spec!r}")
        return tuple(local_value(v, s, hub, device, f"{what}[{i}]")
                     for i, (v, s) in enumerate(zip(value, spec)))
    leaf = _leaf_spec(spec, value, hub.mesh, what)
    if leaf is None or not any(leaf):
        return value
    coords = hub.coords(device)
    array = np.asarray(value)
    for dim, axis in enumerate(leaf):
        if axis is not None:
            array = np.split(array, hub.mesh[axis], axis=dim)[coords[axis]]
    return array


def global_value(values: Sequence[Any], spec: Any, hub: MeshHub, what: str = "the result") -> Any:
    """The global value the devices' ``values`` (one per device) stand for under ``spec``."""
    first = values[0]
    if isinstance(first, tuple):
        specs = [None] * len(first) if spec is None else list(spec)
        if len(specs) != len(first):
            raise MeshError(f"{what}: {len(specs)} layouts for a tuple of {len(first)}")
        return tuple(global_value([v[i] for v in values], specs[i], hub, f"{what}[{i}]")
                     for i in range(len(first)))
    leaf = None if spec is None else tuple(spec)
    if leaf is None or not any(leaf):
        return first
    # Concatenate along each split dimension, innermost axis first, from the devices
    # whose other coordinates are 0.
    blocks = {hub.device_of(hub.coords(d)): values[d] for d in range(hub.device_count)}
    split_axes = [(dim, axis) for dim, axis in enumerate(leaf) if axis is not None]

    def gather(fixed: dict[str, int], rest: list[tuple[int, str]]) -> Any:
        if not rest:
            coords = {name: fixed.get(name, 0) for name in hub.mesh}
            return blocks[hub.device_of(coords)]
        dim, axis = rest[0]
        parts = [gather({**fixed, axis: i}, rest[1:]) for i in range(hub.mesh[axis])]
        return np.concatenate([np.asarray(p) for p in parts], axis=dim)

    return gather({}, split_axes)


def simulate(graph: FuncGraph, mesh: Mapping[str, int], in_specs: Sequence[Any],
             out_spec: Any, *args: Any) -> Any:
    """Run the per-device program ``graph`` on every device of ``mesh`` (the global
    ``args`` split by ``in_specs``) and return the global result (``out_spec``)."""
    mesh = check_mesh(mesh)
    if len(in_specs) != len(args):
        raise UsageError(f"{len(args)} arguments for {len(in_specs)} input layouts")
    hub = MeshHub(mesh)
    locals_ = [[local_value(a, s, hub, d, f"argument {i}")
                for i, (a, s) in enumerate(zip(args, in_specs))]
               for d in range(hub.device_count)]
    code_for(graph)  # compile once, here, not racing in the device threads

    results: list[Any] = [None] * hub.device_count
    errors: list[Optional[BaseException]] = [None] * hub.device_count

    def device_main(device: int) -> None:
        try:
            with on_device(DeviceContext(hub, device)):
                results[device] = run(graph, *locals_[device])
        except BaseException as exc:  # reported below, in device order
            errors[device] = exc
            hub.abort()

    threads = [threading.Thread(target=device_main, args=(d,), name=f"anfir-device-{d}",
                                daemon=True) for d in range(hub.device_count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # The first device whose error is not the echo of another's failure explains it.
    failures = [e for e in errors if e is not None]
    if failures:
        primary = [e for e in failures if not (isinstance(e, MeshError) and "another device"
                                                in str(e))]
        raise (primary or failures)[0]
    return global_value(results, out_spec, hub)


def spmd_info(graph: Any) -> Optional[dict[str, Any]]:
    """A per-device program's mesh and layouts (``{"mesh", "in", "out"}``, layouts
    decoded), or None for an ordinary graph."""
    if not isinstance(graph, FuncGraph):
        return None
    meta = graph.flags.get("meta") if isinstance(graph.flags, dict) else None
    if not isinstance(meta, dict) or SPMD_KEY not in meta:
        return None
    info = meta[SPMD_KEY]
    return {"mesh": dict(info["mesh"]), "in": [decode_spec(s) for s in info["in"]],
            "out": decode_spec(info["out"])}


def encode_spec(spec: Any) -> Any:
    """A layout as JSON: a tensor's a list of names/null, a tuple's ``{"items": [...]}``."""
    if spec is None:
        return None
    if isinstance(spec, list):
        return {"items": [encode_spec(s) for s in spec]}
    return list(spec)


def decode_spec(data: Any) -> Any:
    """The inverse of :func:`encode_spec`."""
    if data is None:
        return None
    if isinstance(data, dict):
        return [decode_spec(s) for s in data["items"]]
    return tuple(data)


def run_spmd(graph: FuncGraph, *args: Any) -> Any:
    """``anfir.run`` of a per-device program: simulate its mesh on global ``args``."""
    info = spmd_info(graph)
    assert info is not None
    return simulate(graph, info["mesh"], info["in"], info["out"], *args)


__all__ = ["SPMD_KEY", "check_mesh", "decode_spec", "encode_spec", "global_value", "local_value",
           "run_spmd", "simulate", "spmd_info"]

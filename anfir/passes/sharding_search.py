"""The cost of a per-device program, and the automatic search of layouts.

:func:`communication` reads a per-device program (the ``spmd`` phase's
result, or its reloaded dump) and lists its collectives with the bytes each
one moves; :func:`cost` adds a model of the per-device compute (matmul-like
calls at ``2·m·n·k`` flops, attention at its two products, everything else one
flop per element of its result) and of the time on the wires (ring
algorithms: an all-reduce sends ``2(n-1)/n`` of its operand, an all-gather
``n-1`` blocks, a reduce-scatter and an all-to-all ``(n-1)/n``), and the
per-device memory (local arguments plus every local value, no reuse — an
upper bound the search keeps under a limit).

:func:`search` is the automatic mode (MindSpore's ``auto_parallel`` with
sharding propagation, in small): given the devices — a mesh, or a number of
devices whose two-axis meshes ``dp × mp`` are all tried — and nothing else,
it chooses a layout for every argument by coordinate descent on the modeled
cost: starting from every argument replicated, it tries for one argument at
a time every layout that fits (each mesh axis on at most one dimension),
keeps the best program the propagation makes of it, and sweeps again until
nothing improves.  Each candidate is propagated and emitted for real, so the
modeled cost is the cost of the program that runs.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from anfir.abstract.values import AScalar, ATensor, ATuple
from anfir.errors import UsageError
from anfir.eval.mesh import check_mesh
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode
from anfir.ir.primitive import callee_primitive
from anfir.ir.walk import toposort
from anfir.passes import pipeline, sharding
from anfir.primitives import collective, gradient, nn, tensor

FLOPS_PER_SECOND = 1.0e11
"""The modeled compute rate of one device."""
BYTES_PER_SECOND = 1.0e10
"""The modeled bandwidth of one device's link."""
LATENCY = 5.0e-6
"""The modeled start-up time of one collective, in seconds."""


@dataclass(frozen=True)
class Transfer:
    """One collective of a per-device program."""

    kind: str
    """``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all`` or ``ppermute``."""
    axis: str
    """The mesh axis it runs over."""
    payload: int
    """The bytes of its (local) operand."""
    wire: float
    """The bytes each device sends, by the ring algorithms."""


def _numel(a: Any) -> int:
    if isinstance(a, ATensor) and a.shape is not None:
        count = 1
        for d in a.shape:
            count *= int(d)
        return count
    return 1


Op = tuple[Any, Mapping[str, Any], list[Any], Any]
"""One call as the cost model reads it: primitive, attributes, argument and result types."""


def graph_ops(graph: FuncGraph) -> list[Op]:
    """The primitive calls of ``graph`` in program order, as the cost model reads them."""
    ops: list[Op] = []
    for node in toposort(graph):
        prim = callee_primitive(node)
        if prim is not None and isinstance(node, CNode):
            ops.append((prim, node.attrs, [i.abstract for i in node.inputs[1:]], node.abstract))
    return ops


def _dry_ops(program: sharding.SpmdProgram) -> list[Op]:
    return [(c.prim, c.attrs, c.argument_abstracts(), c.abstract) for c in program.calls]


def _graph_mesh(graph: FuncGraph) -> Mapping[str, int]:
    meta = graph.flags.get("meta") or {}
    mesh = (meta.get("spmd") or {}).get("mesh")
    if mesh is None:
        raise UsageError(f"@{graph.name} is not a per-device program; give its mesh")
    return dict(mesh)


def communication(graph: Any, mesh: Optional[Mapping[str, int]] = None) -> list[Transfer]:
    """The collectives of the per-device program ``graph`` (or of a list of
    :data:`Op`) in program order, with their bytes (the mesh: ``graph``'s own,
    from its metadata, unless given)."""
    if isinstance(graph, FuncGraph):
        mesh = mesh if mesh is not None else _graph_mesh(graph)
        ops = graph_ops(graph)
    else:
        ops = graph
    assert mesh is not None
    transfers = []
    for prim, attrs, args, _out in ops:
        if prim not in collective.COLLECTIVES or prim is collective.axis_slice:
            continue
        axis = str(attrs.get("axis", ""))
        n = mesh[axis]
        payload = sharding.nbytes(args[0])
        factor = {"all_reduce": 2.0 * (n - 1) / n, "all_gather": float(n - 1),
                  "reduce_scatter": (n - 1) / n, "all_to_all": (n - 1) / n}.get(prim.name, 1.0)
        transfers.append(Transfer(prim.name, axis, payload, payload * factor))
    return transfers


def flops(ops: Sequence[Op]) -> float:
    """The modeled floating-point operations of these calls (per device)."""
    total = 0.0
    for prim, _attrs, args, out in ops:
        if prim is tensor.matmul and isinstance(args[0], ATensor) and args[0].shape:
            total += 2.0 * _numel(out) * int(args[0].shape[-1])
        elif prim is gradient.matmul_dx and isinstance(args[0], ATensor) and args[0].shape:
            total += 2.0 * _numel(out) * int(args[0].shape[-1])
        elif prim is gradient.matmul_dy and isinstance(args[1], ATensor) and args[1].shape:
            total += 2.0 * _numel(args[0]) * int(args[1].shape[-1])
        elif prim in (nn.attention, nn.attention_probs) and isinstance(args[1], ATensor) \
                and args[1].shape and len(args[1].shape) >= 2:
            products = 2 if prim is nn.attention else 1
            total += 2.0 * products * _numel(args[0]) * int(args[1].shape[-2])
        elif isinstance(out, (ATensor, AScalar)):
            total += _numel(out)
    return total


def memory(ops: Sequence[Op], params: Sequence[Any]) -> int:
    """Modeled per-device bytes: the local arguments and every local value (no reuse)."""
    total = sum(sharding.nbytes(p) for p in params)
    for _prim, _attrs, _args, out in ops:
        if isinstance(out, (ATensor, AScalar)):
            total += sharding.nbytes(out)
    return total


@dataclass(frozen=True)
class Cost:
    """The modeled cost of a per-device program."""

    compute: float
    """Seconds of per-device compute."""
    communication: float
    """Seconds on the wires (latency included)."""
    memory: int
    """Per-device bytes (an upper bound)."""
    wire_bytes: float
    """Bytes each device sends."""

    @property
    def total(self) -> float:
        """Compute plus communication, in seconds."""
        return self.compute + self.communication

    def __str__(self) -> str:
        return (f"modeled {self.total * 1e6:.2f} us per step (compute {self.compute * 1e6:.2f} us, "
                f"communication {self.communication * 1e6:.2f} us for "
                f"{self.wire_bytes:.0f} bytes), {self.memory} bytes per device")


def cost(graph: FuncGraph, mesh: Optional[Mapping[str, int]] = None) -> Cost:
    """The modeled cost of the per-device program ``graph``."""
    mesh = mesh if mesh is not None else _graph_mesh(graph)
    return _cost(graph_ops(graph), [p.abstract for p in graph.parameters], mesh)


def _cost(ops: Sequence[Op], params: Sequence[Any], mesh: Mapping[str, int]) -> Cost:
    transfers = communication(list(ops), mesh)
    wire = sum(t.wire for t in transfers)
    return Cost(flops(ops) / FLOPS_PER_SECOND,
                wire / BYTES_PER_SECOND + LATENCY * len(transfers), memory(ops, params), wire)


@dataclass
class Strategy:
    """A chosen mesh and argument layouts, with the modeled cost of their program."""

    mesh: dict[str, int]
    in_shardings: list[Any]
    cost: Cost
    program: sharding.SpmdProgram
    tried: int = 0
    """How many candidate programs the search built."""
    log: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"mesh {self.mesh}: {self.cost}"]
        for k, spec in enumerate(self.in_shardings):
            lines.append(f"  argument {k}: {spec}")
        return "\n".join(lines)


def _leaf_options(a: Any, mesh: Mapping[str, int]) -> list[Any]:
    """Every layout of a value of abstract ``a`` (each mesh axis on at most one dimension)."""
    if not isinstance(a, ATensor) or a.shape is None:
        return [None]
    shape = [int(d) for d in a.shape]
    per_axis = []
    for axis, size in mesh.items():
        per_axis.append([None] + [d for d in range(len(shape)) if shape[d] % size == 0])
    options: list[Any] = []
    for choice in itertools.product(*per_axis):
        dims = [d for d in choice if d is not None]
        if len(dims) != len(set(dims)):
            continue
        spec: list[Optional[str]] = [None] * len(shape)
        for axis, d in zip(mesh, choice):
            if d is not None:
                spec[d] = axis
        options.append(tuple(spec))
    return options


def _leaves(a: Any, path: tuple[int, ...] = ()) -> list[tuple[tuple[int, ...], Any]]:
    if isinstance(a, ATuple):
        return [leaf for k, item in enumerate(a.items) for leaf in _leaves(item, path + (k,))]
    return [(path, a)]


def _assemble(a: Any, chosen: Mapping[tuple[int, ...], Any], path: tuple[int, ...] = ()) -> Any:
    if isinstance(a, ATuple):
        return [_assemble(item, chosen, path + (k,)) for k, item in enumerate(a.items)]
    spec = chosen.get(path)
    return None if spec is None or not any(spec) else spec


def flat_entry(source: Any, entry: Optional[str] = None,
               args: Optional[Sequence[Any]] = None) -> FuncGraph:
    """The entry of ``source`` compiled for the global ``args`` and flattened: the
    graph the sharding phases and :func:`search` read."""
    phases = [*pipeline.PHASES, pipeline.Phase("flatten", sharding.flatten, "inline every call")]
    return pipeline.compile_program(source, entry=entry, args=args, phases=phases).graph


def meshes_for(devices: int) -> list[dict[str, int]]:
    """The meshes of ``devices`` devices with axes ``dp`` and ``mp`` (a size-1 axis left out)."""
    if type(devices) is not int or devices < 1:
        raise UsageError(f"devices is a positive int, not {devices!r}")
    result = []
    for dp in range(devices, 0, -1):
        if devices % dp == 0:
            mp = devices // dp
            mesh = {name: size for name, size in (("dp", dp), ("mp", mp)) if size > 1}
            result.append(mesh or {"dp": 1})
    return result


_ORDERS: dict[FuncGraph, list[Any]] = {}


def evaluate(graph: FuncGraph, mesh: Mapping[str, int], in_shardings: Sequence[Any],
             dry: bool = False) -> tuple[Cost, sharding.SpmdProgram]:
    """The modeled cost of ``graph`` (flat, typed: the ``flatten`` phase's result)
    partitioned by ``in_shardings`` over ``mesh``; ``dry`` only logs the calls the
    per-device program would make (the same cost, no graph built)."""
    order = _ORDERS.get(graph)
    if order is None:
        _ORDERS.clear()  # one program at a time: the search's
        order = _ORDERS[graph] = toposort(graph)
    program = sharding.emit(sharding.propagate(graph, mesh, in_shardings, order=order), dry=dry)
    return _cost(_dry_ops(program) if dry else graph_ops(program.graph),
                 program.param_abstracts, mesh), program


Leaf = tuple[int, tuple[int, ...], Any]


def _seeds(leaves: Sequence[Leaf], mesh: Mapping[str, int]) -> list[dict[tuple[int, tuple[int, ...]], Any]]:
    """Where the descent starts: everything replicated, and for each mesh axis every
    argument split over it on its first dimension where it divides (the batch of
    the data, the output features of a weight in PyTorch's layout) — generic
    starting points; the descent repairs the arguments they fit badly."""
    seeds: list[dict[tuple[int, tuple[int, ...]], Any]] = [{}]
    for axis, size in mesh.items():
        seed: dict[tuple[int, tuple[int, ...]], Any] = {}
        for k, path, a in leaves:
            if isinstance(a, ATensor) and a.shape and int(a.shape[0]) % size == 0:
                spec: list[Optional[str]] = [None] * len(a.shape)
                spec[0] = axis
                seed[(k, path)] = tuple(spec)
        seeds.append(seed)
    return seeds


def _descend(graph: FuncGraph, mesh: Mapping[str, int], leaves: Sequence[Leaf],
             chosen: dict[tuple[int, tuple[int, ...]], Any], memory_limit: Optional[int],
             sweeps: int) -> tuple[Strategy, int]:
    """Coordinate descent from ``chosen``: one argument's layout at a time, the best."""
    params = graph.parameters

    def shardings() -> list[Any]:
        return [_assemble(p.abstract, {path: s for (k2, path), s in chosen.items() if k2 == k})
                for k, p in enumerate(params)]

    def score(c: Cost) -> tuple[int, float]:
        over = memory_limit is not None and c.memory > memory_limit
        return (1, float(c.memory)) if over else (0, c.total)

    current_cost, current_prog = evaluate(graph, mesh, shardings(), dry=True)
    tried = 1
    for _ in range(sweeps):
        improved = False
        for k, path, a in leaves:
            keep = chosen.get((k, path))
            for option in _leaf_options(a, mesh):
                if option == keep or (keep is None and not any(option or ())):
                    continue
                chosen[(k, path)] = option
                c, prog = evaluate(graph, mesh, shardings(), dry=True)
                tried += 1
                if score(c) < score(current_cost):
                    current_cost, current_prog, keep = c, prog, option
                    improved = True
            chosen[(k, path)] = keep
        if not improved:
            break
    return Strategy(dict(mesh), shardings(), current_cost, current_prog), tried


def search(graph: FuncGraph, mesh: Optional[Mapping[str, int]] = None, *,
           devices: Optional[int] = None, memory_limit: Optional[int] = None,
           sweeps: int = 2) -> Strategy:
    """The layouts (and, given ``devices``, the mesh) of least modeled cost for the
    flat program ``graph`` whose per-device memory stays under ``memory_limit``."""
    if (mesh is None) == (devices is None):
        raise UsageError("search takes a mesh or a number of devices (one of them)")
    meshes = [check_mesh(mesh)] if mesh is not None else meshes_for(devices)  # type: ignore[arg-type]
    best: Optional[Strategy] = None
    tried = 0
    for m in meshes:
        leaves = [(k, path, a) for k, p in enumerate(graph.parameters)
                  for path, a in _leaves(p.abstract)]
        for seed_number, seed in enumerate(_seeds(leaves, m)):
            chosen = dict(seed)
            result, count = _descend(graph, m, leaves, chosen, memory_limit, sweeps)
            tried += count
            if result.cost.memory > (memory_limit if memory_limit is not None else result.cost.memory):
                continue
            result.log.append(f"seed {seed_number}")
            if best is None or result.cost.total < best.cost.total:
                best = result
    if best is None:
        raise UsageError(f"no layout on {len(meshes)} mesh(es) keeps the modeled memory under "
                         f"{memory_limit} bytes per device")
    best.tried = tried
    best.cost, best.program = evaluate(graph, best.mesh, best.in_shardings)  # built for real
    return best


def chooser(memory_limit: Optional[int] = None) -> sharding.Chooser:
    """The automatic mode of ``anfir.compile(..., mesh=..., in_shardings="auto")``: the
    search on the compile's mesh; the chosen layouts and modeled cost are recorded in
    the per-device program's metadata (``spmd.strategy``, ``spmd.modeled_cost``)."""
    def choose(graph: FuncGraph, mesh: Mapping[str, int]) -> tuple[list[Any], dict[str, Any]]:
        strategy = search(graph, mesh, memory_limit=memory_limit)
        return strategy.in_shardings, {"strategy": str(strategy),
                                       "modeled_cost": strategy.cost.total}
    return choose


__all__ = ["chooser", "BYTES_PER_SECOND", "Cost", "FLOPS_PER_SECOND", "LATENCY", "Strategy", "Transfer",
           "communication", "cost", "evaluate", "flat_entry", "flops", "graph_ops", "memory", "meshes_for", "search"]

"""Collectives and layout annotations: the primitives of SPMD programs.

A per-device (SPMD) program runs once on every device of a *mesh* — named
axes with sizes, ``{"dp": 4, "mp": 2}`` — each copy on its own block of the
data.  The collectives are how the copies talk: ``all_reduce`` (sum, max or
mean over the devices along one mesh axis), ``all_gather`` (the blocks
concatenated), ``reduce_scatter`` (summed, then each device keeps its block),
``all_to_all`` (blocks exchanged: split along one dimension, concatenated
along another) and ``ppermute`` (sent along explicit pairs), as JAX's
``lax.psum``/``all_gather``/``psum_scatter``/``all_to_all``/``ppermute``
under ``shard_map`` (``tiled=True``).  ``axis_slice`` takes this device's
block of a replicated value (no communication), and ``shard(x, ("dp",
None))`` annotates the layout of a value of the *global* program (its value
is ``x``; the sharding phase reads the annotation).

Shapes are per-device: ``all_gather`` multiplies a dimension by the size of
its mesh axis, which the rules read from the mesh in scope (:func:`mesh_scope`,
entered by ``anfir.compile(..., mesh=...)`` and by the simulation).

Evaluation is an explicit simulation over the devices' values:
:class:`MeshHub` runs nothing itself — the simulation (``anfir.eval.mesh``)
runs one evaluator per device in its own thread, each thread holding its
:class:`DeviceContext`, and a collective's ``impl`` deposits this device's
value with the hub, waits for the other devices of its group, and computes
its result from their values in device order (so every device of a group
gets bit-identical results).  Called outside a mesh, a collective is an
error that says so.

Gradient rules follow JAX's collectives under ``shard_map``: the gradient of
``all_gather`` is ``reduce_scatter`` (and back), of ``all_to_all`` the
exchange the other way, of ``ppermute`` the reversed permutation; the result
of ``all_reduce`` is the same on every device of the group (replicated), and
its gradient is that one cotangent: the identity for ``sum``, ``dout / n``
for ``mean`` and ``dout`` where ``x`` reached the maximum for ``max``.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional

import numpy as np

from anfir.abstract.values import AbstractValue, AScalar, ATensor
from anfir.errors import AnfirError, AnfirTypeError
from anfir.primitives.registry import declare

FAMILY = "collective"

BARRIER_TIMEOUT = 120.0
"""Seconds a device waits for the others at a collective before the simulation
is declared stuck (a program whose devices disagree on their collectives)."""


class MeshError(AnfirError):
    """A collective outside a mesh, on an axis the mesh lacks, or a simulation
    whose devices stopped agreeing."""


# -- the mesh in scope (shapes) ------------------------------------------------------------
_SCOPE = threading.local()


@contextlib.contextmanager
def mesh_scope(mesh: Mapping[str, int]) -> Iterator[None]:
    """Within the block, the shape rules of collectives read axis sizes from ``mesh``."""
    previous = getattr(_SCOPE, "mesh", None)
    _SCOPE.mesh = dict(mesh)
    try:
        yield
    finally:
        _SCOPE.mesh = previous


def scope_mesh() -> Optional[dict[str, int]]:
    """The mesh in scope on this thread: a device's in a simulation, else
    :func:`mesh_scope`'s, else None."""
    ctx = getattr(_DEVICE, "ctx", None)
    if ctx is not None:
        return dict(ctx.hub.mesh)
    return getattr(_SCOPE, "mesh", None)


def axis_size_of(axis: Any, what: str) -> int:
    """The size of mesh axis ``axis`` in scope, or a MeshError naming ``what``."""
    mesh = scope_mesh()
    if not isinstance(axis, str) or not axis:
        raise AnfirTypeError(f"{what}: axis is the name of a mesh axis (a str), not {axis!r}")
    if mesh is None:
        raise MeshError(f"{what} over mesh axis '{axis}' outside a mesh: compile with "
                        "anfir.compile(..., mesh={...}) or run it on a simulated mesh")
    if axis not in mesh:
        raise MeshError(f"{what}: the mesh has no axis '{axis}' (its axes: "
                        f"{', '.join(mesh) or 'none'})")
    return mesh[axis]


# -- the simulation's devices (values) -------------------------------------------------------
@dataclass(eq=False)
class MeshHub:
    """Where the devices of one simulated run meet at each collective."""

    mesh: dict[str, int]
    """Axis name → size, in mesh order (row-major device numbering)."""
    barrier: threading.Barrier = field(init=False)
    slots: dict[int, dict[int, Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.barrier = threading.Barrier(self.device_count)

    @property
    def device_count(self) -> int:
        """How many devices the mesh has."""
        count = 1
        for size in self.mesh.values():
            count *= size
        return count

    def coords(self, device: int) -> dict[str, int]:
        """The mesh coordinates of device number ``device`` (row-major)."""
        result: dict[str, int] = {}
        for name in reversed(list(self.mesh)):
            result[name] = device % self.mesh[name]
            device //= self.mesh[name]
        return {name: result[name] for name in self.mesh}

    def device_of(self, coords: Mapping[str, int]) -> int:
        """The device number at ``coords``."""
        number = 0
        for name, size in self.mesh.items():
            number = number * size + coords[name]
        return number

    def group(self, device: int, axis: str) -> list[int]:
        """The devices that differ from ``device`` only along ``axis``, in axis order."""
        coords = self.coords(device)
        return [self.device_of({**coords, axis: i}) for i in range(self.mesh[axis])]

    def abort(self) -> None:
        """Release every waiting device (one of them failed)."""
        self.barrier.abort()


@dataclass(eq=False)
class DeviceContext:
    """One simulated device: its number and the hub of its run."""

    hub: MeshHub
    device: int
    calls: int = 0

    def exchange(self, axis: str, value: Any, what: str) -> tuple[list[Any], int]:
        """Deposit ``value``, wait for the whole mesh, and return the values of this
        device's group along ``axis`` (axis order) and this device's index in it."""
        axis_size_of(axis, what)
        key = self.calls
        self.calls += 1
        hub = self.hub
        with hub.lock:
            hub.slots.setdefault(key, {})[self.device] = value
        self._wait(what)
        group = hub.group(self.device, axis)
        slot = hub.slots[key]
        if any(d not in slot for d in group):
            hub.abort()
            raise MeshError(f"{what}: the devices did not all reach the same collective")
        values = [slot[d] for d in group]
        self._wait(what)  # everyone has read: the slot may go
        if self.device == 0:
            with hub.lock:
                hub.slots.pop(key, None)
        return values, group.index(self.device)

    def _wait(self, what: str) -> None:
        try:
            self.hub.barrier.wait(BARRIER_TIMEOUT)
        except threading.BrokenBarrierError:
            raise MeshError(f"{what}: another device of the simulated mesh failed or the "
                            "devices disagree on their collectives") from None


_DEVICE = threading.local()


@contextlib.contextmanager
def on_device(ctx: DeviceContext) -> Iterator[None]:
    """Within the block, collectives on this thread act as device ``ctx``."""
    previous = getattr(_DEVICE, "ctx", None)
    _DEVICE.ctx = ctx
    try:
        yield
    finally:
        _DEVICE.ctx = previous


def _device(what: str) -> DeviceContext:
    ctx: Optional[DeviceContext] = getattr(_DEVICE, "ctx", None)
    if ctx is None:
        raise MeshError(f"{what} runs only on a mesh: compile with anfir.compile(..., mesh=...) "
                        "and anfir.run the result, or simulate it (anfir.eval.mesh.simulate)")
    return ctx


# -- evaluation ---------------------------------------------------------------------------------
def _array(x: Any, what: str) -> np.ndarray:
    array = np.asarray(x)
    if array.dtype.kind not in "biufc":
        raise AnfirTypeError(f"{what} needs a number or a tensor, not {type(x).__name__}")
    return array


def _dim_of(array: np.ndarray, dim: Any, what: str) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool) or not -array.ndim <= dim < array.ndim:
        raise AnfirTypeError(f"{what}: dim {dim!r} is not a dimension of a rank-{array.ndim} tensor")
    return dim % array.ndim


def _split(array: np.ndarray, n: int, dim: int, what: str) -> list[np.ndarray]:
    if array.shape[dim] % n:
        raise AnfirTypeError(f"{what}: dimension {dim} of size {array.shape[dim]} does not split "
                             f"into {n} equal blocks")
    return np.split(array, n, axis=dim)


def _op(op: Any, what: str) -> str:
    if op not in ("sum", "max", "mean"):
        raise AnfirTypeError(f"{what}: op is 'sum', 'max' or 'mean', not {op!r}")
    return str(op)


def _like(result: Any, x: Any) -> Any:
    # Scalars stay scalars (a loss summed over devices is a number).
    return result.item() if np.ndim(x) == 0 and not isinstance(x, np.ndarray) else result


def _all_reduce(x: Any, axis: Any = "", op: Any = "sum") -> Any:
    """The sum (max, mean) of x over the devices along axis."""
    what = "all_reduce"
    op = _op(op, what)
    values, _ = _device(what).exchange(axis, _array(x, what), what)
    total = values[0]
    for v in values[1:]:
        total = np.maximum(total, v) if op == "max" else total + v
    if op == "mean":
        total = total / len(values)
    return _like(np.asarray(total), x)


def _all_gather(x: Any, axis: Any = "", dim: Any = 0) -> Any:
    """The devices' blocks along axis concatenated in dimension dim."""
    what = "all_gather"
    array = _array(x, what)
    d = _dim_of(array, dim, what)
    values, _ = _device(what).exchange(axis, array, what)
    return np.concatenate(values, axis=d)


def _reduce_scatter(x: Any, axis: Any = "", dim: Any = 0) -> Any:
    """The sum over the devices along axis, of which each keeps its block of dimension dim."""
    what = "reduce_scatter"
    array = _array(x, what)
    d = _dim_of(array, dim, what)
    values, index = _device(what).exchange(axis, array, what)
    total = values[0]
    for v in values[1:]:
        total = total + v
    return _split(np.asarray(total), len(values), d, what)[index]


def _all_to_all(x: Any, axis: Any = "", split_dim: Any = 0, concat_dim: Any = 0) -> Any:
    """x split in blocks along split_dim, block j sent to device j; the blocks received
    concatenated along concat_dim."""
    what = "all_to_all"
    array = _array(x, what)
    s, c = _dim_of(array, split_dim, what), _dim_of(array, concat_dim, what)
    values, index = _device(what).exchange(axis, array, what)
    n = len(values)
    return np.concatenate([_split(v, n, s, what)[index] for v in values], axis=c)


def _pairs(perm: Any, n: int, what: str) -> list[tuple[int, int]]:
    ok = isinstance(perm, tuple) and all(
        isinstance(p, tuple) and len(p) == 2 and all(type(i) is int and 0 <= i < n for i in p)
        for p in perm)
    if not ok:
        raise AnfirTypeError(f"{what}: perm is a tuple of (source, destination) pairs of "
                             f"device indices below {n}, not {perm!r}")
    sources = [p[0] for p in perm]
    targets = [p[1] for p in perm]
    if len(set(sources)) != len(sources) or len(set(targets)) != len(targets):
        raise AnfirTypeError(f"{what}: perm sends from or to a device twice: {perm!r}")
    return list(perm)


def _ppermute(x: Any, axis: Any = "", perm: Any = (), reverse: Any = False) -> Any:
    """x sent along the (source, destination) pairs of perm (the other way when
    reverse); a device that receives nothing gets zeros."""
    what = "ppermute"
    array = _array(x, what)
    values, index = _device(what).exchange(axis, array, what)
    pairs = _pairs(perm, len(values), what)
    for src, dst in pairs:
        if reverse:
            src, dst = dst, src
        if dst == index:
            return values[src]
    return np.zeros_like(array)


def _axis_slice(x: Any, axis: Any = "", dim: Any = 0) -> Any:
    """This device's block of dimension dim, the dimension split over axis."""
    what = "axis_slice"
    array = _array(x, what)
    d = _dim_of(array, dim, what)
    ctx = _device(what)
    n = axis_size_of(axis, what)
    return _split(array, n, d, what)[ctx.hub.coords(ctx.device)[axis]]


def _axis_size(axis: Any = "") -> int:
    """The number of devices along mesh axis axis."""
    return axis_size_of(axis, "axis_size")


def check_spec(spec: Any, what: str = "shard") -> tuple[Optional[str], ...]:
    """``spec`` checked as a layout: a tuple with a mesh axis name or None per dimension,
    each axis at most once."""
    if not isinstance(spec, tuple) or not all(s is None or (isinstance(s, str) and s)
                                               for s in spec):
        raise AnfirTypeError(f"{what}: a layout is a tuple with an axis name or None per "
                             f"dimension, not {spec!r}")
    named = [s for s in spec if s is not None]
    if len(set(named)) != len(named):
        raise AnfirTypeError(f"{what}: layout {spec!r} splits two dimensions over one axis")
    return spec


def _shard(x: Any, spec: Any = ()) -> Any:
    """x, annotated with its layout (the evaluation is the identity)."""
    check_spec(spec)
    if len(spec) != np.ndim(x):
        raise AnfirTypeError(f"shard: layout {spec!r} has {len(spec)} entries for a value of "
                             f"rank {np.ndim(x)}")
    return x


# -- shape rules (per-device shapes) ----------------------------------------------------------------
def _tensor(x: AbstractValue, what: str) -> AbstractValue:
    if not isinstance(x, (ATensor, AScalar)):
        raise AnfirTypeError(f"{what} needs a number or a tensor, not {x}")
    return x


def _resized(x: AbstractValue, dim: Any, factor: int, divide: bool, what: str) -> AbstractValue:
    x = _tensor(x, what)
    if not isinstance(x, ATensor) or x.shape is None:
        raise AnfirTypeError(f"{what} needs a tensor of known rank, not {x}")
    rank = len(x.shape)
    if not isinstance(dim, int) or isinstance(dim, bool) or not -rank <= dim < rank:
        raise AnfirTypeError(f"{what}: dim {dim!r} is not a dimension of {x}")
    d = dim % rank
    shape = list(x.shape)
    size = shape[d]
    if divide:
        if isinstance(size, int) and size % factor:
            raise AnfirTypeError(f"{what}: dimension {d} of {x} does not split into {factor} "
                                 "equal blocks")
        shape[d] = size // factor
    else:
        shape[d] = size * factor
    return ATensor(x.dtype, tuple(shape))


def _same_rule(x: AbstractValue, **attrs: Any) -> AbstractValue:
    if "op" in attrs:
        _op(attrs["op"], "all_reduce")
    if "axis" in attrs:
        axis_size_of(attrs["axis"], "a collective")
    return _tensor(x, "a collective")


def _gather_rule(x: AbstractValue, *, axis: Any = "", dim: Any = 0) -> AbstractValue:
    return _resized(x, dim, axis_size_of(axis, "all_gather"), False, "all_gather")


def _scatter_rule(x: AbstractValue, *, axis: Any = "", dim: Any = 0) -> AbstractValue:
    return _resized(x, dim, axis_size_of(axis, "reduce_scatter"), True, "reduce_scatter")


def _slice_rule(x: AbstractValue, *, axis: Any = "", dim: Any = 0) -> AbstractValue:
    return _resized(x, dim, axis_size_of(axis, "axis_slice"), True, "axis_slice")


def _all_to_all_rule(x: AbstractValue, *, axis: Any = "", split_dim: Any = 0,
                     concat_dim: Any = 0) -> AbstractValue:
    n = axis_size_of(axis, "all_to_all")
    return _resized(_resized(x, split_dim, n, True, "all_to_all"), concat_dim, n, False,
                    "all_to_all")


def _ppermute_rule(x: AbstractValue, *, axis: Any = "", perm: Any = (),
                   reverse: Any = False) -> AbstractValue:
    _pairs(perm, axis_size_of(axis, "ppermute"), "ppermute")
    return _tensor(x, "ppermute")


def _axis_size_rule(*, axis: Any = "") -> AbstractValue:
    return AScalar("i64", axis_size_of(axis, "axis_size"))


def _shard_rule(x: AbstractValue, *, spec: Any = ()) -> AbstractValue:
    check_spec(spec)
    if isinstance(x, ATensor) and x.shape is not None and len(x.shape) != len(spec):
        raise AnfirTypeError(f"shard: layout {spec!r} has {len(spec)} entries for {x}")
    if isinstance(x, AScalar) and spec:
        raise AnfirTypeError(f"shard: a scalar's layout is (), not {spec!r}")
    return x


# -- the declarations ------------------------------------------------------------------------
all_reduce = declare(
    "all_reduce", 1, _all_reduce, infer=_same_rule, family=FAMILY, foldable=False,
    attrs={"axis": "", "op": "sum"}, positional_attrs=2,
    doc='all_reduce(x, axis="mp", op="sum") — the sum (max, mean) of x over the devices along '
        "mesh axis axis (lax.psum/pmax/pmean); every device gets the result",
    bprop="lambda (x, axis, op, out, dout) "
          "(if op == \"sum\" then dout "
          "else if op == \"mean\" then dout / axis_size(axis) "
          "else dout * cast_like(x == out, dout),) end")
all_gather = declare(
    "all_gather", 1, _all_gather, infer=_gather_rule, family=FAMILY, foldable=False,
    attrs={"axis": "", "dim": 0}, positional_attrs=2,
    doc='all_gather(x, axis="mp", dim=0) — the blocks of the devices along axis concatenated '
        "in dimension dim (lax.all_gather, tiled)",
    bprop="lambda (x, axis, dim, out, dout) (reduce_scatter(dout, axis, dim),) end")
reduce_scatter = declare(
    "reduce_scatter", 1, _reduce_scatter, infer=_scatter_rule, family=FAMILY, foldable=False,
    attrs={"axis": "", "dim": 0}, positional_attrs=2,
    doc='reduce_scatter(x, axis="mp", dim=0) — the sum over the devices along axis, of which '
        "each keeps its block of dimension dim (lax.psum_scatter, tiled)",
    bprop="lambda (x, axis, dim, out, dout) (all_gather(dout, axis, dim),) end")
all_to_all = declare(
    "all_to_all", 1, _all_to_all, infer=_all_to_all_rule, family=FAMILY, foldable=False,
    attrs={"axis": "", "split_dim": 0, "concat_dim": 0}, positional_attrs=3,
    doc='all_to_all(x, axis="mp", split_dim=0, concat_dim=1) — x split in blocks along '
        "split_dim, block j sent to device j, the blocks received concatenated along "
        "concat_dim (lax.all_to_all, tiled)",
    bprop="lambda (x, axis, split_dim, concat_dim, out, dout) "
          "(all_to_all(dout, axis, concat_dim, split_dim),) end")
ppermute = declare(
    "ppermute", 1, _ppermute, infer=_ppermute_rule, family=FAMILY, foldable=False,
    attrs={"axis": "", "perm": (), "reverse": False}, positional_attrs=3,
    doc='ppermute(x, axis="mp", perm=((0, 1), (1, 0))) — x sent from each source to its '
        "destination device along axis (lax.ppermute); reverse=true sends the other way",
    bprop="lambda (x, axis, perm, reverse, out, dout) "
          "(ppermute(dout, axis, perm, logical_not(reverse)),) end")
axis_slice = declare(
    "axis_slice", 1, _axis_slice, infer=_slice_rule, family=FAMILY, foldable=False,
    attrs={"axis": "", "dim": 0}, positional_attrs=2,
    doc='axis_slice(x, axis="mp", dim=0) — this device\'s block of dimension dim of a '
        "replicated x, the dimension split over axis (no communication)",
    bprop="lambda (x, axis, dim, out, dout) (all_gather(dout, axis, dim),) end")
axis_size = declare(
    "axis_size", 0, _axis_size, infer=_axis_size_rule, family=FAMILY, foldable=False,
    attrs={"axis": ""}, positional_attrs=1, differentiable=False,
    doc='axis_size(axis="mp") — the number of devices along a mesh axis')
shard = declare(
    "shard", 1, _shard, infer=_shard_rule, family=FAMILY, attrs={"spec": ()},
    positional_attrs=1, foldable=False,
    doc='shard(x, ("dp", None)) — x, annotated with its layout: a mesh axis name (the '
        "dimension split over it) or None (whole) per dimension; the sharding phase reads it",
    bprop="lambda (x, spec, out, dout) (dout,) end")

COLLECTIVES = (all_reduce, all_gather, reduce_scatter, all_to_all, ppermute, axis_slice)
"""The primitives that only run on a mesh (their evaluation needs the devices)."""

__all__ = ["COLLECTIVES", "DeviceContext", "MeshError", "MeshHub", "all_gather", "all_reduce",
           "all_to_all", "axis_size", "axis_size_of", "axis_slice", "check_spec", "mesh_scope",
           "on_device", "ppermute", "reduce_scatter", "scope_mesh", "shard"]

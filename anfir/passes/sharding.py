"""Sharding propagation and the per-device (SPMD) program.

``anfir.compile(mod, entry=..., args=..., mesh={"dp": 4, "mp": 2},
in_shardings=[...])`` appends three phases to the pipeline (:func:`phases`):

``flatten``
    every call of a graph inlined and the program optimized again, until the
    entry is one graph of primitive calls (a gradient's backpropagators
    included): layouts are given to values, and a first-order program has a
    value per node.
``sharding``
    the propagation.  The arguments take their layouts from ``in_shardings``;
    walking the program in order, each primitive's *sharding rule* (the
    table :data:`RULES`, keyed by the primitive object) reads its inputs'
    layouts, says which layout it needs each input in and which layout its
    result has.  An input in another layout is *redistributed*: a pending
    sum resolved by ``all_reduce`` (or ``reduce_scatter`` when the dimension
    is to be split anyway), a split dimension that must be whole gathered by
    ``all_gather``, a whole dimension that may be split cut by
    ``axis_slice`` (free).  The dump shows every value's layout and each
    redistribution in the node's metadata (``layout``, ``redistribute``).
``spmd``
    the per-device program: the same walk emits each call on local blocks
    (local shapes; shape arguments such as a ``reshape`` target rewritten),
    with the collectives of the redistributions explicit.  Its mesh and
    layouts are in the definition's metadata (``spmd``), so ``anfir.run`` of
    it (or of its reloaded dump) simulates the mesh on global arguments and
    ``anfir.to_jax`` of it is the function ``jax.shard_map`` runs per device.

A layout (:class:`Layout`) is a mesh axis or None per dimension, as JAX's
``PartitionSpec``, plus the axes over which the value is a *partial* result
(each device holds a term of a sum — or of a mean — not yet reduced): a
matmul whose contracted dimension is split produces one, as Megatron-LM's
row-parallel linear layer does.  Rules keep partial results through linear
operations (add, scale) and reduce them only where a non-linear consumer, a
conflicting layout or the program's result needs the whole value — which is
how the column-/row-parallel MLP ends with exactly one all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import numpy as np

from anfir.abstract.rules import ProbingRule
from anfir.abstract.values import (UNKNOWN, AbstractValue, AFunction, ANone, AScalar, ATensor,
                                   ATuple, GraphSig, PrimFn)
from anfir.dtypes import dtype_name, is_dtype, numpy_dtype
from anfir.errors import AnfirError, UsageError
from anfir.eval.mesh import SPMD_KEY, check_mesh, encode_spec
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager, remove_dead_graphs
from anfir.ir.nodes import CNode, Node, ParameterNode, ValueNode
from anfir.ir.primitive import Primitive, callee_primitive
from anfir.ir.walk import toposort
from anfir.passes import inline, optimize, validate
from anfir.passes.compile_state import Phase, Program
from anfir.primitives import arith, collective, conv, elementwise, gradient, nn, reduce, structure, tensor


class ShardingError(AnfirError):
    """A program or a layout the sharding phases cannot handle (located at the node)."""


# -- layouts -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """How a tensor (or number) is laid out over the mesh."""

    spec: tuple[Optional[str], ...]
    """Per dimension: the mesh axis it is split over (equal blocks), or None (whole)."""
    partial: tuple[str, ...] = ()
    """Axes over which each device holds a term of the value, not yet reduced."""
    reduce: str = "sum"
    """How the partial terms combine: ``sum`` or ``mean``."""

    def __str__(self) -> str:
        text = "[" + ", ".join(a if a is not None else "_" for a in self.spec) + "]"
        if self.partial:
            text += f" partial {self.reduce}({', '.join(self.partial)})"
        return text

    def whole(self) -> "Layout":
        """The same split, partial terms reduced."""
        return Layout(self.spec)


CONST = "const"
"""The layout of a value known at compile time (the same on every device)."""
OTHER = "other"
"""The layout of a value that is no number (None, a string...): the same everywhere."""
AnyLayout = Union[Layout, str, tuple]
"""A value's layout: a :class:`Layout`, :data:`CONST`, :data:`OTHER`, or a tuple of layouts."""


def replicated(rank: int) -> Layout:
    """The layout of a value every device holds whole."""
    return Layout((None,) * rank)


def layout_text(layout: AnyLayout) -> str:
    """The dump's spelling of a layout."""
    if isinstance(layout, tuple):
        return "(" + ", ".join(layout_text(item) for item in layout) + ")"
    return str(layout)


# -- abstract values --------------------------------------------------------------------------------
def global_shape(node: Node) -> tuple[int, ...]:
    """The concrete shape of ``node``'s value (a number's is ``()``)."""
    a = node.abstract
    if isinstance(a, AScalar):
        return ()
    if isinstance(a, ATensor) and a.shape is not None:
        shape = _SHAPES.get(a.shape)
        if shape is None and all(isinstance(d, int) for d in a.shape):
            shape = _SHAPES[a.shape] = tuple(int(d) for d in a.shape)
        if shape is not None:
            return shape
    raise ShardingError(f"the sharding phases need concrete shapes; this value is {a}", node.loc)


_SHAPES: dict[tuple, tuple[int, ...]] = {}
"""Concrete shapes already checked (the search propagates one program many times)."""


def known_value(a: Any) -> Any:
    """The value an abstract value pins down, or UNKNOWN."""
    if isinstance(a, AScalar):
        return a.value
    if isinstance(a, ANone):
        return None
    if isinstance(a, ATuple):
        items = [known_value(i) for i in a.items]
        return UNKNOWN if any(i is UNKNOWN for i in items) else tuple(items)
    return UNKNOWN


def local_abstract(a: AbstractValue, layout: AnyLayout, mesh: Mapping[str, int]) -> AbstractValue:
    """The per-device abstract value of a global value ``a`` in ``layout``."""
    if isinstance(layout, tuple) and isinstance(a, ATuple):
        return ATuple(tuple(local_abstract(i, l, mesh) for i, l in zip(a.items, layout)))
    if isinstance(layout, Layout) and isinstance(a, ATensor) and a.shape is not None:
        shape = tuple(d // mesh[ax] if ax is not None else d for d, ax in zip(a.shape, layout.spec))
        return ATensor(a.dtype, shape)
    return a


def local_shape(shape: Sequence[int], layout: Layout, mesh: Mapping[str, int]) -> tuple[int, ...]:
    """The block of ``shape`` each device holds."""
    return tuple(d // mesh[ax] if ax is not None else d for d, ax in zip(shape, layout.spec))


def nbytes(a: Any) -> int:
    """The bytes of a (local) abstract tensor or number."""
    if isinstance(a, ATensor) and a.shape is not None:
        count = 1
        for d in a.shape:
            count *= int(d)
        return count * numpy_dtype(a.dtype).itemsize
    if isinstance(a, AScalar):
        return numpy_dtype(a.dtype).itemsize if is_dtype(a.dtype) else 8
    if isinstance(a, ATuple):
        return sum(nbytes(i) for i in a.items)
    return 0


# -- what a rule answers -------------------------------------------------------------------------------
Emitter = Callable[["Emission", CNode, list[Node]], Node]


@dataclass
class Plan:
    """A rule's answer for one call."""

    inputs: list[Optional[AnyLayout]]
    """The layout each input is needed in (None: as it is, partial terms included)."""
    out: AnyLayout
    """The result's layout."""
    emit: Optional[Emitter] = None
    """Writes the local call (None: the same primitive on the local inputs)."""
    redistributions: list[str] = field(default_factory=list)
    """Filled by the propagation: what each redistribution of an input does (for the dump)."""


@dataclass
class Context:
    """What rules read besides the call: the mesh and the layouts found so far."""

    mesh: dict[str, int]
    layouts: dict[Node, AnyLayout]

    def layout(self, node: Node) -> AnyLayout:
        """The layout of an input (see :func:`input_layout`)."""
        return input_layout(self.layouts, node)

    def fits(self, axis: Optional[str], size: int) -> bool:
        """Whether a dimension of ``size`` splits in equal blocks over ``axis``."""
        return axis is None or size % self.mesh[axis] == 0


Rule = Callable[[CNode, Context], Plan]


def input_layout(layouts: Mapping[Node, AnyLayout], node: Node) -> AnyLayout:
    """The layout of a call's input: constants are :data:`CONST`, but a constant
    tensor is replicated (a rule may cut it to the blocks it needs)."""
    if isinstance(node, ValueNode):
        a = node.abstract
        if isinstance(a, ATensor) and a.shape is not None:
            return replicated(len(a.shape))
        return CONST
    return layouts[node]


def _tensor_layout(ctx: Context, node: Node) -> Layout:
    layout = ctx.layout(node)
    if isinstance(layout, Layout):
        return layout
    return replicated(len(global_shape(node)) if isinstance(node.abstract, (ATensor, AScalar)) else 0)


def _resolved(layout: AnyLayout) -> AnyLayout:
    return layout.whole() if isinstance(layout, Layout) else layout


# -- the rules -------------------------------------------------------------------------------------------
def replicated_rule(node: CNode, ctx: Context) -> Plan:
    """Any primitive: every number input whole on every device, the result too.
    Always correct (each device computes the global value), the fallback."""
    inputs: list[Optional[AnyLayout]] = []
    for inp in node.inputs[1:]:
        layout = ctx.layout(inp)
        inputs.append(replicated(len(global_shape(inp))) if isinstance(layout, Layout) else None)
    return Plan(inputs, _whole_layout_of(node.abstract))


def _whole_layout_of(a: Any) -> AnyLayout:
    if isinstance(a, ATuple):
        return tuple(_whole_layout_of(i) for i in a.items)
    if isinstance(a, ATensor) and a.shape is not None:
        return replicated(len(a.shape))
    if isinstance(a, AScalar):
        return Layout(())
    return OTHER


def _choose_dims(out_shape: Sequence[int], candidates: Sequence[Sequence[Optional[str]]],
                 ctx: Context, taken: set[str]) -> list[Optional[str]]:
    """Per output dimension, the first candidate axis that fits and is not taken yet."""
    spec: list[Optional[str]] = []
    for d, size in enumerate(out_shape):
        chosen = None
        for cand in candidates:
            axis = cand[d]
            if axis is not None and axis not in taken and ctx.fits(axis, size):
                chosen = axis
                break
        if chosen is not None:
            taken.add(chosen)
        spec.append(chosen)
    return spec


def _aligned(spec: Sequence[Optional[str]], shape: Sequence[int], out_shape: Sequence[int]) -> list[Optional[str]]:
    """An input's spec aligned to the output's dimensions (numpy broadcasting)."""
    offset = len(out_shape) - len(shape)
    result: list[Optional[str]] = [None] * len(out_shape)
    for d, axis in enumerate(spec):
        if shape[d] == out_shape[offset + d]:
            result[offset + d] = axis
    return result


_LINEAR_ALL = set()   # filled below: add, sub — partial when every input is partial alike
_LINEAR_FIRST = set()  # mul, div — partial in one operand, the other whole


def elementwise_rule(node: CNode, ctx: Context) -> Plan:
    """Elementwise (with numpy broadcasting): the result takes the inputs' splits,
    dimension by dimension; a broadcast dimension of size 1 stays whole.  Partial
    terms pass through add/sub (all inputs partial alike) and mul/div (one operand)."""
    prim = callee_primitive(node)
    args = node.inputs[1:]
    out_shape = global_shape(node)
    numbers = [(i, a) for i, a in enumerate(args) if isinstance(ctx.layout(a), Layout)]
    shapes = {i: global_shape(a) for i, a in numbers}
    layouts = {i: _tensor_layout(ctx, a) for i, a in numbers}
    partial, reduce_op = _linear_partial(prim, args, ctx, layouts)
    taken = set(partial)
    candidates = [_aligned(layouts[i].spec, shapes[i], out_shape) for i, _ in numbers]
    spec = _choose_dims(out_shape, candidates, ctx, taken)
    inputs: list[Optional[AnyLayout]] = [None] * len(args)
    for i, _ in numbers:
        shape = shapes[i]
        offset = len(out_shape) - len(shape)
        need = tuple(spec[offset + d] if shape[d] == out_shape[offset + d] else None
                     for d in range(len(shape)))
        inputs[i] = Layout(need, layouts[i].partial if partial and layouts[i].partial else (),
                           layouts[i].reduce)
    return Plan(inputs, Layout(tuple(spec), partial, reduce_op))


def _linear_partial(prim: Optional[Primitive], args: Sequence[Node], ctx: Context,
                    layouts: Mapping[int, Layout]) -> tuple[tuple[str, ...], str]:
    parts = {i: (l.partial, l.reduce) for i, l in layouts.items()}
    partial_ones = [i for i, (p, _) in parts.items() if p]
    if not partial_ones:
        return (), "sum"
    if prim in _LINEAR_ALL:
        # every input a tensor (no constant added on each device) and partial alike
        if len(layouts) == len(args) and len({parts[i] for i in layouts}) == 1:
            return parts[partial_ones[0]]
        return (), "sum"
    if prim in _LINEAR_FIRST and len(partial_ones) == 1:
        i = partial_ones[0]
        if prim is arith.mul or i == 0:
            return parts[i]
    if prim is arith.neg:
        return parts[partial_ones[0]]
    return (), "sum"


def _contraction(node: CNode, ctx: Context, operands: Sequence[tuple[int, Sequence[str]]],
                 out_labels: Sequence[str], prefer: Optional[int] = None) -> Plan:
    """An einsum-like call: each operand's dimensions labelled, the result's too.
    Output labels take an operand's split (``prefer``'s first: a gradient keeps
    the layout of the value it is the gradient of); a contracted label that is
    split makes the result a partial sum over that axis — the other operand is
    cut to match (free) rather than the first gathered."""
    args = node.inputs[1:]
    sizes: dict[str, int] = {}
    for i, labels in operands:
        for label, size in zip(labels, global_shape(args[i])):
            if size != 1 or label not in sizes:
                sizes[label] = max(size, sizes.get(label, 1))
    out_shape = global_shape(node)
    for label, size in zip(out_labels, out_shape):
        sizes[label] = size
    axis_of: dict[str, str] = {}
    taken: set[str] = set()

    def offer(label: str, axis: Optional[str]) -> None:
        if axis is None or label in axis_of or axis in taken or not ctx.fits(axis, sizes[label]):
            return
        axis_of[label] = axis
        taken.add(axis)

    if prefer is not None:
        pref = _tensor_layout(ctx, args[prefer])
        for label, axis in zip(out_labels, pref.spec):
            offer(label, axis)
    for i, labels in operands:
        for label, axis in zip(labels, _tensor_layout(ctx, args[i]).spec):
            if label in out_labels:
                offer(label, axis)
    for i, labels in operands:
        for label, axis in zip(labels, _tensor_layout(ctx, args[i]).spec):
            offer(label, axis)
    inputs: list[Optional[AnyLayout]] = [None] * len(args)
    for i, labels in operands:
        shape = global_shape(args[i])
        inputs[i] = Layout(tuple(axis_of.get(l) if shape[d] == sizes[l] else None
                                 for d, l in enumerate(labels)))
    spec = tuple(axis_of.get(l) for l in out_labels)
    partial = tuple(sorted(axis_of[l] for l in axis_of if l not in out_labels))
    if prefer is not None and inputs[prefer] is None:
        inputs[prefer] = Layout(spec)  # read for its shape only: it must have the result's
    return Plan(inputs, Layout(spec, partial))


def _batch_labels(n: int) -> list[str]:
    return [f"b{i}" for i in range(n)]


def matmul_rule(node: CNode, ctx: Context) -> Plan:
    """``a @ b``: batch dimensions and the rows of ``a`` / columns of ``b`` keep their
    splits (column-parallel when ``b``'s columns are split); a split contracted
    dimension makes a partial sum (row-parallel)."""
    a, b = node.inputs[1:3]
    ra, rb = len(global_shape(a)), len(global_shape(b))
    if ra < 2 or rb < 2:
        return replicated_rule(node, ctx)
    nb = max(ra, rb) - 2
    batch = _batch_labels(nb)
    la = batch[nb - (ra - 2):] + ["m", "k"]
    lb = batch[nb - (rb - 2):] + ["k", "n"]
    return _contraction(node, ctx, [(0, la), (1, lb)], batch + ["m", "n"])


def matmul_dx_rule(node: CNode, ctx: Context) -> Plan:
    """``matmul_dx(dout, y, x)`` = ``dout @ yᵀ`` in ``x``'s shape (the left gradient)."""
    dout, y, x = node.inputs[1:4]
    rd, ry, rx = (len(global_shape(n)) for n in (dout, y, x))
    if rd < 2 or ry < 2 or rx != rd or (ry != 2 and ry != rd):
        return replicated_rule(node, ctx)
    batch = _batch_labels(rd - 2)
    ly = (batch if ry == rd else []) + ["k", "n"]
    return _contraction(node, ctx, [(0, batch + ["m", "n"]), (1, ly)], batch + ["m", "k"],
                        prefer=2)


def matmul_dy_rule(node: CNode, ctx: Context) -> Plan:
    """``matmul_dy(x, dout, y)`` = ``xᵀ @ dout`` in ``y``'s shape (the right gradient):
    the batch dimensions a 2-d ``y`` was broadcast over are contracted too (the
    gradient of a weight used on a data-parallel batch is a partial sum over
    ``dp``)."""
    x, dout, y = node.inputs[1:4]
    rx, rd, ry = (len(global_shape(n)) for n in (x, dout, y))
    if rx < 2 or rd != rx or (ry != 2 and ry != rx):
        return replicated_rule(node, ctx)
    batch = _batch_labels(rx - 2)
    out = (batch if ry == rx else []) + ["k", "n"]
    return _contraction(node, ctx, [(0, batch + ["m", "k"]), (1, batch + ["m", "n"])], out,
                        prefer=2)


def transpose_rule(node: CNode, ctx: Context) -> Plan:
    """A transpose permutes the splits."""
    x = node.inputs[1]
    lay = _tensor_layout(ctx, x)
    rank = len(lay.spec)
    if len(node.inputs) > 2:
        perm = known_value(node.inputs[2].abstract)
        if perm is UNKNOWN:
            return replicated_rule(node, ctx)
        perm = tuple(int(p) % rank for p in perm)
    else:
        perm = tuple(reversed(range(rank)))
    return Plan([None] * (len(node.inputs) - 1),
                Layout(tuple(lay.spec[p] for p in perm), lay.partial, lay.reduce))


def swap_last_rule(node: CNode, ctx: Context) -> Plan:
    """``swap_last`` exchanges the last two splits."""
    lay = _tensor_layout(ctx, node.inputs[1])
    spec = list(lay.spec)
    spec[-1], spec[-2] = spec[-2], spec[-1]
    return Plan([None], Layout(tuple(spec), lay.partial, lay.reduce))


def _reshape_groups(a: Sequence[int], b: Sequence[int]) -> Optional[list[tuple[list[int], list[int]]]]:
    """Input and output dimensions grouped so that each group has one product."""
    groups: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(a) and j < len(b):
        ia, jb = [i], [j]
        pa, pb = a[i], b[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(a):
                pa *= a[i]
                ia.append(i)
                i += 1
            elif pb < pa and j < len(b):
                pb *= b[j]
                jb.append(j)
                j += 1
            else:
                return None
        groups.append((ia, jb))
    if not groups:
        return None
    groups[-1][0].extend(range(i, len(a)))  # trailing dimensions of size 1
    groups[-1][1].extend(range(j, len(b)))
    return groups


def reshape_rule(node: CNode, ctx: Context) -> Plan:
    """A reshape keeps a split when the split dimension leads its group of merged or
    divided dimensions and the group's first output dimension splits as evenly
    (``(N, L, E) → (N, L, heads, E/heads)`` keeps ``E``'s split on the heads); else
    that dimension is gathered first.  The target shape is rewritten per device."""
    x = node.inputs[1]
    a, b = global_shape(x), global_shape(node)
    lay = _tensor_layout(ctx, x)
    groups = _reshape_groups(a, b) if 0 not in a else None
    need: list[Optional[str]] = [None] * len(a)
    spec: list[Optional[str]] = [None] * len(b)
    if groups is not None:
        for ia, jb in groups:
            lead = ia[0]
            axis = lay.spec[lead]
            if axis is not None and ctx.fits(axis, b[jb[0]]) and b[jb[0]] > 1:
                need[lead] = axis
                spec[jb[0]] = axis
    inputs: list[Optional[AnyLayout]] = [Layout(tuple(need), lay.partial, lay.reduce), None]
    return Plan(inputs, Layout(tuple(spec), lay.partial, lay.reduce), emit=_emit_reshape)


def _emit_reshape(em: "Emission", node: CNode, args: list[Node]) -> Node:
    layout = em.layouts[node]
    assert isinstance(layout, Layout)
    target = local_shape(global_shape(node), layout, em.mesh)
    return em.call(tensor.reshape, [args[0], em.constant(target)], node)


def _axes_of(value: Any, rank: int) -> list[int]:
    if value is None:
        return list(range(rank))
    items = value if isinstance(value, tuple) else (value,)
    return sorted({int(a) % rank for a in items})


def reduction_rule(node: CNode, ctx: Context) -> Plan:
    """``sum``/``mean`` over split dimensions leave partial sums (means) over their axes;
    ``max``/``min`` and the others need the reduced dimensions whole."""
    prim = callee_primitive(node)
    x = node.inputs[1]
    if len(node.inputs) != 2:
        return replicated_rule(node, ctx)
    lay = _tensor_layout(ctx, x)
    rank = len(lay.spec)
    axes = _axes_of(node.attrs.get("axis"), rank) if rank else []
    keep = bool(node.attrs.get("keepdims", False))
    linear = prim in (tensor.sum_, tensor.mean)
    if lay.partial and not (linear and (prim is tensor.sum_) == (lay.reduce == "sum")):
        lay = lay.whole()
    need = list(lay.spec)
    partial = list(lay.partial)
    for d in axes:
        axis_d = need[d]
        if axis_d is not None:
            if linear:
                partial.append(axis_d)
            else:
                need[d] = None
    out = [None if d in axes else need[d] for d in range(rank) if keep or d not in axes]
    op = "mean" if prim is tensor.mean else lay.reduce if lay.partial else "sum"
    if prim is tensor.mean and lay.partial and lay.reduce != "mean":
        op = "sum"
    return Plan([Layout(tuple(need), lay.partial, lay.reduce)],
                Layout(tuple(out), tuple(sorted(set(partial))), op))


def sum_to_rule(node: CNode, ctx: Context) -> Plan:
    """``sum_to(x, like)`` — the adjoint of broadcasting: the dimensions ``like`` lacks
    (or has as 1) are summed, so a split there is a partial sum (a bias gradient on a
    data-parallel batch)."""
    x, like = node.inputs[1:3]
    lay = _tensor_layout(ctx, x)
    xs, ts = global_shape(x), global_shape(node)
    offset = len(xs) - len(ts)
    partial = set(lay.partial)
    spec: list[Optional[str]] = []
    for d in range(len(ts)):
        axis = lay.spec[offset + d]
        if ts[d] == xs[offset + d]:
            spec.append(axis)
        else:
            spec.append(None)
            if axis is not None:
                partial.add(axis)
    for d in range(offset):
        lead = lay.spec[d]
        if lead is not None:
            partial.add(lead)
    if lay.partial and lay.reduce != "sum":
        return replicated_rule(node, ctx)
    out = Layout(tuple(spec), tuple(sorted(partial)))
    return Plan([None, Layout(tuple(spec))], out)


def _tail_dims(node: CNode, rank: int, attr: str = "axis") -> int:
    axis = node.attrs.get(attr, -1)
    return int(axis) % rank if rank else 0


def normalization_rule(node: CNode, ctx: Context) -> Plan:
    """softmax, log_softmax, layer_norm, rms_norm, tail_mean: the dimensions from
    ``axis`` on must be whole (the others keep their split, as a batch); scale and
    bias are replicated."""
    prim = callee_primitive(node)
    x = node.inputs[1]
    lay = _tensor_layout(ctx, x).whole()
    rank = len(lay.spec)
    if prim in (nn.softmax, nn.log_softmax):
        dims = [_tail_dims(node, rank)]
    else:
        dims = list(range(_tail_dims(node, rank), rank))
    need = tuple(None if d in dims else a for d, a in enumerate(lay.spec))
    inputs: list[Optional[AnyLayout]] = [Layout(need)]
    for extra in node.inputs[2:]:
        inputs.append(replicated(len(global_shape(extra))) if isinstance(ctx.layout(extra), Layout)
                      else None)
    return Plan(inputs, Layout(need))


def attention_rule(node: CNode, ctx: Context) -> Plan:
    """attention(q, k, v[, mask]) and attention_probs(q, k, mask): the batch dimensions
    (batch, heads) keep the split of ``q`` — heads split over ``mp`` is Megatron's
    attention — the sequence and feature dimensions are whole."""
    q = node.inputs[1]
    lay = _tensor_layout(ctx, q).whole()
    rank = len(lay.spec)
    spec = tuple(a if d < rank - 2 else None for d, a in enumerate(lay.spec))
    inputs: list[Optional[AnyLayout]] = []
    for inp in node.inputs[1:]:
        if isinstance(ctx.layout(inp), Layout):
            shape = global_shape(inp)
            inputs.append(Layout(tuple(spec[d + rank - len(shape)] if d < len(shape) - 2 else None
                                       for d in range(len(shape)))) if len(shape) >= 2
                          else replicated(len(shape)))
        else:
            inputs.append(None)
    out_rank = len(global_shape(node))
    return Plan(inputs, Layout(spec[:out_rank - 2] + (None, None)))


def mse_rule(node: CNode, ctx: Context) -> Plan:
    """``mse_loss(a, b)``: ``b`` in ``a``'s layout; a mean (sum) over split dimensions is
    a partial mean (sum) of equal blocks."""
    a = node.inputs[1]
    lay = _tensor_layout(ctx, a).whole()
    reduction = node.attrs.get("reduction", "mean")
    if reduction == "none":
        return Plan([lay, lay], lay)
    partial = tuple(sorted(x for x in lay.spec if x is not None))
    return Plan([lay, lay], Layout((), partial, "mean" if reduction == "mean" else "sum"))


def loss_spread_rule(node: CNode, ctx: Context) -> Plan:
    """``loss_spread(g, like)`` (a loss's adjoint): the result takes ``like``'s layout; a
    mean's ``1 / count`` is the global count's (the local call is rescaled)."""
    like = node.inputs[2]
    lay = _tensor_layout(ctx, like).whole()
    return Plan([Layout(()) if isinstance(ctx.layout(node.inputs[1]), Layout) else None, lay],
                lay, emit=_emit_loss_spread)


def _emit_loss_spread(em: "Emission", node: CNode, args: list[Node]) -> Node:
    out = em.call(nn.loss_spread, args, node)
    layout = em.layouts[node]
    assert isinstance(layout, Layout)
    if node.attrs.get("reduction", "mean") != "mean":
        return out
    shape = global_shape(node)
    ratio = float(np.prod(local_shape(shape, layout, em.mesh))) / float(np.prod(shape))
    if ratio == 1.0:
        return out
    return em.call(arith.mul, [out, em.constant(ratio)], node, attrs=False)


def shape_only_rule(node: CNode, ctx: Context) -> Plan:
    """A result computed from shapes only (``attention_scale``): a constant of the
    global shapes, whatever the layout."""
    return Plan([None] * (len(node.inputs) - 1), Layout(()), emit=_emit_shape_only)


def _emit_shape_only(em: "Emission", node: CNode, args: list[Node]) -> Node:
    prim = callee_primitive(node)
    assert prim is not None
    samples = [np.broadcast_to(np.zeros((), dtype=numpy_dtype(a.abstract.dtype)), global_shape(a))
               if isinstance(a.abstract, ATensor) else known_value(a.abstract)
               for a in node.inputs[1:]]
    return em.constant(prim.impl(*samples, **dict(node.attrs)))


def _batch_only(ctx: Context, node: Node, axis: Optional[str]) -> Layout:
    rank = len(global_shape(node))
    return Layout(((axis,) + (None,) * (rank - 1)) if rank else ())


def batch_rule(node: CNode, ctx: Context) -> Plan:
    """Convolution and pooling (``conv``, ``conv_core``, ``max_pool``, ``avg_pool``,
    ``conv_input_grad``): data parallel over the batch — the first input's batch
    dimension keeps its split, its other dimensions are whole, the weights
    replicated; a shape operand (the gradient's ``x``) takes the result's layout."""
    prim = callee_primitive(node)
    first = node.inputs[1]
    axis = _tensor_layout(ctx, first).spec[0] if global_shape(first) else None
    if axis is not None and not ctx.fits(axis, global_shape(node)[0]):
        axis = None
    inputs: list[Optional[AnyLayout]] = [_batch_only(ctx, first, axis)]
    for k, inp in enumerate(node.inputs[2:], start=1):
        if not isinstance(ctx.layout(inp), Layout):
            inputs.append(None)
        elif prim is conv.conv_input_grad and k == 2:
            inputs.append(_batch_only(ctx, inp, axis))  # x: read for its shape
        else:
            inputs.append(replicated(len(global_shape(inp))))
    return Plan(inputs, _batch_only(ctx, node, axis))


def batch_reduction_rule(node: CNode, ctx: Context) -> Plan:
    """``conv_weight_grad(x, dout, w)`` and ``channel_sum(dout)``: sums over the batch, so
    a batch split over an axis makes a partial sum over it (the weight gradient of
    data parallelism)."""
    prim = callee_primitive(node)
    first = node.inputs[1]
    axis = _tensor_layout(ctx, first).spec[0] if global_shape(first) else None
    inputs: list[Optional[AnyLayout]] = [_batch_only(ctx, first, axis)]
    for k, inp in enumerate(node.inputs[2:], start=1):
        if not isinstance(ctx.layout(inp), Layout):
            inputs.append(None)
        elif prim is conv.conv_weight_grad and k == 1:
            inputs.append(_batch_only(ctx, inp, axis))  # dout: the same batch blocks
        else:
            inputs.append(replicated(len(global_shape(inp))))
    return Plan(inputs, Layout((None,) * len(global_shape(node)), (axis,) if axis else ()))


def einsum_rule(node: CNode, ctx: Context) -> Plan:
    """``einsum("ij,jk->ik", a, b)``: the contraction rule by the equation's labels
    (a split summed label makes a partial sum); ``...`` runs replicated."""
    spec = node.inputs[1].abstract
    text = getattr(spec, "value", None)
    if not isinstance(text, str) or "..." in text or "->" not in text:
        return replicated_rule(node, ctx)
    lhs, out = text.replace(" ", "").split("->")
    terms = lhs.split(",")
    operands = node.inputs[2:]
    if len(terms) != len(operands) or any(len(t) != len(global_shape(o))
                                          for t, o in zip(terms, operands)):
        return replicated_rule(node, ctx)
    if any(len(set(t)) != len(t) for t in terms):  # a diagonal: keep it simple
        return replicated_rule(node, ctx)
    return _contraction(node, ctx, [(k + 1, list(t)) for k, t in enumerate(terms)], list(out))


def make_tuple_rule(node: CNode, ctx: Context) -> Plan:
    """A tuple holds its items' layouts."""
    return Plan([None] * (len(node.inputs) - 1),
                tuple(ctx.layout(i) for i in node.inputs[1:]))


def tuple_getitem_rule(node: CNode, ctx: Context) -> Plan:
    """An item has the layout it had in the tuple."""
    layout = ctx.layout(node.inputs[1])
    index = known_value(node.inputs[2].abstract)
    if not isinstance(layout, tuple) or not isinstance(index, int):
        return replicated_rule(node, ctx)
    return Plan([None, None], layout[index])


def passthrough_rule(node: CNode, ctx: Context) -> Plan:
    """identity, stop_gradient: the input's layout."""
    return Plan([None] * (len(node.inputs) - 1), ctx.layout(node.inputs[1]))


def grad_arg_check_rule(node: CNode, ctx: Context) -> Plan:
    """``grad_arg_check(x, g)`` is ``g`` once the argument's type is checked (at compile
    time here: the program was specialized for it)."""
    return Plan([None, None], ctx.layout(node.inputs[2]), emit=lambda em, n, args: args[1])


def shard_rule(node: CNode, ctx: Context) -> Plan:
    """``shard(x, spec)``: the annotation is the layout; ``x`` is redistributed to it."""
    spec = node.attrs.get("spec", ())
    lay = Layout(tuple(spec))
    shape = global_shape(node.inputs[1])
    for d, axis in enumerate(lay.spec):
        if axis is not None and (axis not in ctx.mesh or not ctx.fits(axis, shape[d])):
            raise ShardingError(f"shard: layout {spec!r} does not fit the mesh {ctx.mesh} "
                                f"for a value of shape {shape}", node.loc)
    return Plan([lay], lay, emit=lambda em, n, args: args[0])


def _elementwise_prims() -> list[Primitive]:
    found = []
    for module in (arith, elementwise):
        for value in vars(module).values():
            if (isinstance(value, Primitive) and isinstance(value.infer, ProbingRule)
                    and ": elementwise" in (value.infer.__doc__ or "")):
                found.append(value)
    return found


RULES: dict[Primitive, Rule] = {
    **{prim: elementwise_rule for prim in _elementwise_prims()},
    tensor.matmul: matmul_rule,
    gradient.matmul_dx: matmul_dx_rule,
    gradient.matmul_dy: matmul_dy_rule,
    tensor.transpose: transpose_rule,
    nn.swap_last: swap_last_rule,
    tensor.reshape: reshape_rule,
    tensor.sum_: reduction_rule,
    tensor.mean: reduction_rule,
    reduce.max_: reduction_rule,
    gradient.sum_to: sum_to_rule,
    nn.softmax: normalization_rule,
    nn.log_softmax: normalization_rule,
    nn.layer_norm: normalization_rule,
    nn.rms_norm: normalization_rule,
    nn.tail_mean: normalization_rule,
    nn.attention: attention_rule,
    nn.attention_probs: attention_rule,
    nn.attention_scale: shape_only_rule,
    nn.mse_loss: mse_rule,
    nn.loss_spread: loss_spread_rule,
    structure.make_tuple: make_tuple_rule,
    structure.tuple_getitem: tuple_getitem_rule,
    structure.identity: passthrough_rule,
    structure.stop_gradient: passthrough_rule,
    gradient.grad_arg_check: grad_arg_check_rule,
    collective.shard: shard_rule,
    conv.conv: batch_rule,
    conv.conv_core: batch_rule,
    conv.conv_input_grad: batch_rule,
    conv.max_pool: batch_rule,
    conv.avg_pool: batch_rule,
    conv.conv_weight_grad: batch_reduction_rule,
    conv.channel_sum: batch_reduction_rule,
    nn.einsum: einsum_rule,
}
"""The sharding rule of each primitive, keyed by the primitive object; a primitive
without one runs replicated (:func:`replicated_rule`)."""

_LINEAR_ALL.update({arith.add, arith.sub})
_LINEAR_FIRST.update({arith.mul, arith.div})


# -- propagation -------------------------------------------------------------------------------------------
@dataclass
class Sharded:
    """The propagation's result: a layout per value, a plan per call."""

    graph: FuncGraph
    mesh: dict[str, int]
    in_layouts: list[AnyLayout]
    layouts: dict[Node, AnyLayout]
    plans: dict[CNode, Plan]
    order: list[CNode]


def _spec_layout(spec: Any, a: AbstractValue, mesh: Mapping[str, int], where: str) -> AnyLayout:
    """A user's layout (``in_shardings`` entry) for a value of abstract ``a``."""
    if isinstance(a, ATuple):
        if spec is None:
            return tuple(_spec_layout(None, i, mesh, where) for i in a.items)
        if not isinstance(spec, (list, tuple)) or len(spec) != len(a.items):
            raise UsageError(f"{where}: a tuple of {len(a.items)} takes a list of "
                             f"{len(a.items)} layouts, not {spec!r}")
        return tuple(_spec_layout(s, i, mesh, f"{where}[{k}]")
                     for k, (s, i) in enumerate(zip(spec, a.items)))
    if isinstance(a, (ATensor, AScalar)):
        shape = () if isinstance(a, AScalar) else a.shape
        if shape is None or not all(isinstance(d, int) for d in shape):
            raise UsageError(f"{where}: sharding needs concrete shapes, not {a}")
        if spec is None:
            return replicated(len(shape))
        spec = tuple(spec) if isinstance(spec, list) else spec
        try:
            collective.check_spec(spec, where)
        except AnfirError as exc:
            raise UsageError(str(exc)) from None
        if len(spec) != len(shape):
            raise UsageError(f"{where}: layout {spec!r} has {len(spec)} entries for {a}")
        for d, axis in enumerate(spec):
            if axis is not None and axis not in mesh:
                raise UsageError(f"{where}: layout {spec!r} names axis '{axis}', which the "
                                 f"mesh {dict(mesh)} lacks")
            if axis is not None and int(shape[d]) % mesh[axis]:
                raise UsageError(f"{where}: dimension {d} of {a} does not split into "
                                 f"{mesh[axis]} equal blocks over '{axis}'")
        return Layout(spec)
    if spec is not None:
        raise UsageError(f"{where}: a value of type {a} has no layout; give None")
    return OTHER


def user_spec(layout: AnyLayout) -> Any:
    """A layout as the user writes it (tuples of names for tensors, lists for tuples)."""
    if isinstance(layout, tuple):
        return [user_spec(item) for item in layout]
    if isinstance(layout, Layout):
        return layout.spec
    return None


def propagate(graph: FuncGraph, mesh: Mapping[str, int], in_shardings: Optional[Sequence[Any]],
              rules: Optional[Mapping[Primitive, Rule]] = None,
              order: Optional[Sequence[Node]] = None) -> Sharded:
    """Give every value of the first-order ``graph`` a layout (see the module doc)."""
    mesh = check_mesh(mesh)
    params = graph.parameters
    specs = list(in_shardings) if in_shardings is not None else [None] * len(params)
    if len(specs) != len(params):
        raise UsageError(f"in_shardings has {len(specs)} layouts for the {len(params)} "
                         f"parameters of @{graph.name}")
    table = RULES if rules is None else rules
    layouts: dict[Node, AnyLayout] = {}
    in_layouts = []
    for k, (p, s) in enumerate(zip(params, specs)):
        layouts[p] = _spec_layout(s, p.abstract, mesh, f"in_shardings[{k}]")
        in_layouts.append(layouts[p])
    ctx = Context(mesh, layouts)
    plans: dict[CNode, Plan] = {}
    walk = toposort(graph) if order is None else order
    calls: list[CNode] = []
    for node in walk:
        if not isinstance(node, CNode):
            continue
        if node.graph is not graph:
            raise ShardingError("the sharding phases need a first-order program; a call "
                                "inside a nested function remains", node.loc)
        prim = callee_primitive(node)
        if prim is None:
            raise ShardingError("the sharding phases need a program of primitive calls; "
                                "this call of a function value remains after inlining",
                                node.loc)
        calls.append(node)
        if known_value(node.abstract) is not UNKNOWN and prim not in collective.COLLECTIVES:
            layouts[node] = CONST
            continue
        rule = table.get(prim, replicated_rule)
        try:
            plan = rule(node, ctx)
        except ShardingError:
            raise
        except AnfirError as exc:
            raise ShardingError(f"{prim.name}: {exc}", node.loc) from None
        plans[node] = plan
        layouts[node] = plan.out
    return Sharded(graph, mesh, in_layouts, layouts, plans, calls)


# -- redistribution and emission ---------------------------------------------------------------------------
@dataclass
class Emission:
    """Builds the per-device graph (see :func:`emit`)."""

    mesh: dict[str, int]
    graph: FuncGraph
    layouts: dict[Node, AnyLayout]
    collectives: list[CNode] = field(default_factory=list)
    dry: bool = False
    """Only log the calls (what the cost model reads), build no graph."""
    calls: list[Any] = field(default_factory=list)
    """Every call made, in order (``CNode``s, or stand-ins when dry)."""
    local_types: dict[Any, Any] = field(default_factory=dict)

    def apply(self, prim: Primitive, *args: Any, **kwargs: Any) -> CNode:
        """``graph.apply`` with the new constants typed (the callee's included)."""
        if self.dry:
            dry = DryCall(prim, kwargs.get("attrs") or {}, list(args))
            self.calls.append(dry)
            return dry  # type: ignore[return-value]
        node = self.graph.apply(prim, *args, **kwargs)
        self.calls.append(node)
        head = node.inputs[0]
        head.abstract = AFunction(frozenset({PrimFn(prim)}))
        for inp in node.inputs[1:]:
            if isinstance(inp, ValueNode) and inp.abstract is None:
                inp.abstract = _abstract_of_constant(inp.value)
        return node

    def constant(self, value: Any) -> ValueNode:
        """A constant of the per-device program."""
        node = ValueNode(value)
        node.abstract = _abstract_of_constant(value)
        return node

    def call(self, prim: Primitive, args: Sequence[Node], origin: CNode,
             attrs: Any = True, abstract: Optional[AbstractValue] = None) -> CNode:
        """``prim(*args)`` in the per-device graph, typed with ``origin``'s local type
        (or ``abstract``), located at ``origin``."""
        node_attrs = origin.attrs if attrs is True else (attrs or None)
        kwargs = {"attrs": node_attrs} if node_attrs else {}
        loc = origin.loc.derive("spmd") if origin.loc is not None and not self.dry else None
        node = self.apply(prim, *args, loc=loc, **kwargs)
        if abstract is None:
            layout = self.layouts[origin]
            key = (origin.abstract, layout)
            abstract = self.local_types.get(key)
            if abstract is None:
                abstract = self.local_types[key] = local_abstract(origin.abstract, layout,
                                                                  self.mesh)
        node.abstract = abstract
        return node

    def collective(self, prim: Primitive, value: Node, attrs: dict[str, Any],
                   abstract: AbstractValue, origin: Optional[Node]) -> CNode:
        """A collective (or ``axis_slice``) on ``value``, recorded for the cost count."""
        loc = (origin.loc.derive("spmd") if origin is not None and origin.loc is not None
               and not self.dry else None)
        node = self.apply(prim, value, loc=loc, attrs=_canonical(prim, attrs))
        node.abstract = abstract
        if prim is not collective.axis_slice:
            self.collectives.append(node)
        return node

    def redistribute(self, value: Node, src: AnyLayout, dst: Optional[AnyLayout], origin: Node,
                     shape: Optional[tuple[int, ...]], dtype: str) -> Node:
        """``value`` (a local block in layout ``src``) made the block of layout ``dst``."""
        if dst is None or not isinstance(src, Layout) or not isinstance(dst, Layout):
            return value
        assert shape is not None
        spec = list(src.spec)
        mesh = self.mesh

        def typed() -> ATensor | AScalar:
            if not shape:
                return AScalar(dtype)
            return ATensor(dtype, local_shape(shape, Layout(tuple(spec)), mesh))

        for axis in src.partial:
            if axis in dst.partial:
                continue
            target = [d for d, a in enumerate(dst.spec) if a == axis]
            if (target and spec[target[0]] is None and src.reduce == "sum"
                    and axis not in spec):
                d = target[0]
                spec[d] = axis
                value = self.collective(collective.reduce_scatter, value,
                                        {"axis": axis, "dim": d}, typed(), origin)
            else:
                value = self.collective(collective.all_reduce, value,
                                        {"axis": axis, "op": src.reduce}, typed(), origin)
        for d, held in enumerate(spec):
            if held is not None and dst.spec[d] != held:
                spec[d] = None
                value = self.collective(collective.all_gather, value, {"axis": held, "dim": d},
                                        typed(), origin)
        for d, wanted in enumerate(dst.spec):
            if wanted is not None and spec[d] != wanted:
                spec[d] = wanted
                value = self.collective(collective.axis_slice, value, {"axis": wanted, "dim": d},
                                        typed(), origin)
        return value


_ATTRS: dict[tuple, Any] = {}


def _canonical(prim: Primitive, attrs: dict[str, Any]) -> Any:
    key = (prim, tuple(attrs.items()))
    found = _ATTRS.get(key)
    if found is None:
        found = _ATTRS[key] = prim.canonical_attrs(attrs)
    return found


class DryCall:
    """A call the dry emission logs instead of building (see :class:`Emission`)."""

    def __init__(self, prim: Primitive, attrs: Mapping[str, Any], args: list[Any]) -> None:
        self.prim = prim
        self.attrs = attrs
        self.args = args
        self.abstract: Any = None
        self.loc = None

    def argument_abstracts(self) -> list[Any]:
        """The abstract values of the arguments."""
        return [a.abstract if hasattr(a, "abstract") else _abstract_of_constant(a)
                for a in self.args]


def _abstract_of_constant(value: Any) -> AbstractValue:
    if isinstance(value, tuple):
        return ATuple(tuple(_abstract_of_constant(v) for v in value))
    if value is None:
        return ANone()
    if isinstance(value, bool):
        return AScalar("bool", value)
    if isinstance(value, int):
        return AScalar("i64", value)
    if isinstance(value, float):
        return AScalar("f64", value)
    array = np.asarray(value)
    return ATensor(dtype_name(array.dtype) or "f64", tuple(array.shape))


def _dtype_of(a: Any) -> str:
    return a.dtype if isinstance(a, (ATensor, AScalar)) else "f64"


@dataclass
class SpmdProgram:
    """The per-device program and what it was made from."""

    graph: FuncGraph
    mesh: dict[str, int]
    in_specs: list[Any]
    out_spec: Any
    collectives: list[CNode]
    calls: list[Any] = field(default_factory=list)
    """Every call of the program in order (stand-ins for a dry emission)."""
    param_abstracts: list[Any] = field(default_factory=list)
    """The local abstract values of the parameters."""


def emit(sharded: Sharded, name: Optional[str] = None, dry: bool = False) -> SpmdProgram:
    """The per-device program of a propagated graph (``dry``: only its calls logged,
    ``result.calls``, for the cost model)."""
    old = sharded.graph
    mesh = sharded.mesh
    new = FuncGraph(name or old.name, old.loc)
    new.flags = dict(old.flags) if isinstance(old.flags, dict) else {}
    layouts = sharded.layouts
    em = Emission(mesh, new, layouts, dry=dry)
    mapped: dict[Node, Node] = {}
    for p in old.parameters:
        q = new.add_parameter(p.name or "x", p.loc)
        q.abstract = local_abstract(p.abstract, layouts[p], mesh)
        mapped[p] = q

    def local(inp: Node) -> Node:
        if isinstance(inp, ValueNode):
            return inp
        return mapped[inp]

    for node in sharded.order:
        if layouts[node] == CONST:
            mapped[node] = em.constant(known_value(node.abstract))
            continue
        plan = sharded.plans[node]
        args: list[Node] = []
        for inp, need in zip(node.inputs[1:], plan.inputs):
            src = input_layout(layouts, inp)
            shape = global_shape(inp) if isinstance(src, Layout) else None
            args.append(em.redistribute(local(inp), src, need, node, shape, _dtype_of(inp.abstract)))
        if plan.emit is not None:
            mapped[node] = plan.emit(em, node, args)
        else:
            prim = callee_primitive(node)
            assert prim is not None
            mapped[node] = em.call(prim, args, node)
    # The result: partial terms reduced (every device then holds its block of the value).
    out = old.output
    out_layout = CONST if isinstance(out, ValueNode) else layouts[out]
    result = _finish(em, local(out), out_layout, out)
    if dry:
        return SpmdProgram(new, dict(mesh), [], None, em.collectives, em.calls,
                           [q.abstract for q in new.parameters])
    new.output = result[0]
    meta = dict(new.flags.get("meta") or {})
    in_specs = [user_spec(l) for l in sharded.in_layouts]
    out_spec = user_spec(result[1])
    meta[SPMD_KEY] = {"mesh": dict(mesh), "in": [encode_spec(s) for s in in_specs],
                      "out": encode_spec(out_spec)}
    new.flags["meta"] = meta
    new.abstract = GraphSig(tuple(p.abstract for p in new.parameters), new.output.abstract)
    return SpmdProgram(new, dict(mesh), in_specs, out_spec, em.collectives, em.calls,
                       [q.abstract for q in new.parameters])


def _finish(em: Emission, value: Node, layout: AnyLayout, origin: Node) -> tuple[Node, AnyLayout]:
    """``value`` with partial terms reduced, tuples item by item."""
    if isinstance(layout, tuple) and isinstance(origin.abstract, ATuple):
        items = []
        lays = []
        for k, (lay, a) in enumerate(zip(layout, origin.abstract.items)):
            item = em.apply(structure.tuple_getitem, value, k)
            item.abstract = local_abstract(a, lay, em.mesh)
            fixed, fixed_layout = _finish_leaf(em, item, lay, a, origin)
            items.append(fixed)
            lays.append(fixed_layout)
        tup = em.apply(structure.make_tuple, *items)
        tup.abstract = ATuple(tuple(i.abstract for i in items))
        return tup, tuple(lays)
    return _finish_leaf(em, value, layout, origin.abstract, origin)


def _finish_leaf(em: Emission, value: Node, layout: AnyLayout, a: Any,
                 origin: Node) -> tuple[Node, AnyLayout]:
    if isinstance(layout, tuple) and isinstance(a, ATuple):
        return _finish(em, value, layout, _Typed(a))  # type: ignore[arg-type]
    if isinstance(layout, Layout) and layout.partial:
        shape = () if isinstance(a, AScalar) else tuple(int(d) for d in a.shape)
        value = em.redistribute(value, layout, layout.whole(), origin, shape, _dtype_of(a))
        return value, layout.whole()
    if layout in (CONST, OTHER):
        return value, replicated(0) if isinstance(a, AScalar) else layout
    return value, layout


class _Typed:
    """A stand-in origin carrying only an abstract value (nested tuples)."""

    def __init__(self, abstract: AbstractValue) -> None:
        self.abstract = abstract
        self.loc = None


# -- the phases ---------------------------------------------------------------------------------------------
def flatten(program: Program) -> Program:
    """Inline every call and optimize again until the entry is one graph of
    primitive calls (the form the sharding phases read)."""
    manager = program.require_manager()
    for _ in range(8):
        count = inline.inline_calls(manager, threshold=1 << 30, note="flatten")
        optimize.optimize_graphs(manager, program.stats)
        remove_dead_graphs(manager)
        if count == 0:
            break
    return program


Chooser = Callable[[FuncGraph, Mapping[str, int]], tuple[list[Any], dict[str, Any]]]
"""Chooses the argument layouts of a flat program (the automatic search): returns them
and what to record about the choice in the program's metadata."""


def phases(mesh: Mapping[str, int], in_shardings: Union[None, Sequence[Any], Chooser]) -> list[Phase]:
    """The phases ``anfir.compile(..., mesh=..., in_shardings=...)`` appends
    (``in_shardings`` may be a :data:`Chooser`: the layouts are then its choice)."""
    mesh = check_mesh(mesh)
    state: dict[str, Any] = {}

    def sharding(program: Program) -> Program:
        assert program.entry is not None
        layouts = in_shardings
        if callable(layouts):
            layouts, state["note"] = layouts(program.entry, mesh)
        sharded = propagate(program.entry, mesh, layouts)
        state["sharded"] = sharded
        _annotate(sharded)
        program.artifacts["sharding"] = sharded
        return program

    def spmd(program: Program) -> Program:
        sharded = state["sharded"]
        for node in sharded.order:  # the annotations belong to the sharding dump only
            sharded.graph.node_meta.pop(node, None)
        result = emit(sharded)
        if "note" in state:
            result.graph.flags["meta"]["spmd"].update(state["note"])
        program.entry = result.graph
        program.manager = Manager([result.graph])
        program.artifacts["spmd"] = result
        return program

    return [
        Phase("flatten", flatten, "inline every call: one graph of primitive calls"),
        Phase("sharding", sharding, "a layout for every value; redistributions marked"),
        Phase("spmd", spmd, "the per-device program: local shapes, collectives explicit"),
        Phase("validate", validate.run, "check the invariants of the per-device program"),
    ]


def _annotate(sharded: Sharded) -> None:
    """Each call's layout and redistributions as node metadata (the ``sharding`` dump)."""
    graph = sharded.graph
    for node in sharded.order:
        layout = sharded.layouts[node]
        meta: dict[str, Any] = {"layout": layout_text(layout)}
        plan = sharded.plans.get(node)
        if plan is not None:
            moves = []
            for k, (inp, need) in enumerate(zip(node.inputs[1:], plan.inputs)):
                src = input_layout(sharded.layouts, inp)
                if isinstance(need, Layout) and isinstance(src, Layout) and need != src:
                    moves.append(f"input {k}: {src} -> {need}")
            if moves:
                meta["redistribute"] = moves
        graph.node_meta[node] = {**graph.node_meta.get(node, {}), **meta}


__all__ = ["CONST", "Context", "Emission", "Layout", "OTHER", "Plan", "RULES", "Rule",
           "Sharded", "ShardingError", "SpmdProgram", "emit", "flatten", "layout_text",
           "local_abstract", "nbytes", "phases", "propagate", "replicated", "replicated_rule",
           "user_spec"]

"""Automatic rematerialisation of gradient programs: keep or recompute, by min-cut.

A gradient program computes a forward pass and a backward pass in one graph;
every forward value a backward node reads stays alive from the forward pass
to that read, and those values make the memory peak of training (the buffer
planner cannot go below max-live: only recomputation can).  The ``remat``
phase (``anfir.compile(..., remat="min-cut" | BYTES)``, ``anfir compile ...
--remat min-cut|BYTES``) decides which forward values to keep and which to
compute again where the backward pass reads them, as AOTAutograd's min-cut
partitioner does:

1. the entry is inlined completely (every call of a non-recursive graph), so
   the forward and backward passes are one list of nodes;
2. the *backward* nodes are those the autodiff made for a backpropagator
   (their location says ``ad: ◂g`` or ``gradient rule of``) and everything
   computed from them; the others are the *forward* nodes;
3. a flow network over the forward nodes: a node ``v`` is an edge
   ``v_in → v_out`` whose capacity is its size in bytes (keeping it costs
   that); ``v_out → u_in`` for each forward user ``u``, ``v_out → sink`` when
   a backward node reads ``v``, and ``source → v_in`` when ``v`` may not be
   recomputed (an expensive or non-data operation, or outside the allowed
   part).  A minimum cut is a set of forward values to keep whose total size
   is least, such that every value the backward pass reads is kept or
   recomputable from kept values and inputs;
4. each backward read of a value on the sink side becomes a read of a copy
   computed from the kept values; the kept values it starts from are read
   through ``remat_barrier(kept, anchor)``, ``anchor`` a backward input of the
   reading node, so the copy runs just before its reader (a schedule — the
   low level's walk of the graph — would otherwise run it when first
   reached, as early as the original).

Only cheap operations are recomputed by default (:data:`CHEAP`: elementwise
arithmetic, comparisons, reshapes and layout changes, casts, norms), as
AOTAutograd does.  With a byte budget, :func:`rematerialize_for_budget` tries
larger recomputed parts in turn (first the cheap operations of the earliest
part of the forward pass, whose values live longest, then of all of it, then
every operation but matrix products, convolutions and attention) and keeps
the first whose *planned arena* — the low-level program lowered, its buffers
shared and planned — fits; a budget no candidate meets is an
:class:`RematError` that names the smallest arena reached.

Copies are located at their original with the note ``remat: recomputed``,
which the phase's ``.ir`` dump shows; its header has the summary line
(values kept, values recomputed, modeled bytes saved, extra FLOPs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np

from anfir.abstract.lattice import abstract_of_value
from anfir.abstract.values import AbstractValue, AScalar, ATensor, ATuple
from anfir.dtypes import TYPE_NAMES, numpy_dtype
from anfir.errors import AnfirError, UsageError
from anfir.ir.clone import clone
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.ir.walk import toposort
from anfir.lowlevel.lower import lower_graph
from anfir.lowlevel.plan import plan_memory
from anfir.lowlevel.share import share_buffers
from anfir.passes.optimize import optimize_graphs
from anfir.passes.compile_state import Phase, Program, write_dumps
from anfir.passes.validate import rebuild_manager
from anfir.primitives import conv, gradient, nn, shaping, structure, tensor
from anfir.primitives.checkpointing import remat_barrier

RECOMPUTED = "remat: recomputed"
"""The location note of every copy the phase makes (``# file:line:col (remat: recomputed)``)."""

BARRIER = "remat: barrier"
"""The location note of the barriers in front of the copies."""

_CHEAP_FAMILIES = frozenset({"arithmetic", "comparison", "elementwise", "logic", "complex"})
CHEAP: frozenset[Primitive] = frozenset({
    tensor.reshape, tensor.transpose, tensor.broadcast_to, tensor.cast, tensor.where,
    tensor.ones_like, structure.zeros_like, structure.tuple_getitem,
    shaping.expand, shaping.flatten, shaping.squeeze, shaping.unsqueeze, shaping.flip,
    gradient.cast_like, gradient.reshape_like, gradient.broadcast_like,
    conv.batch_norm, conv.channel_spread, nn.channel_view, nn.group_view,
    nn.layer_norm, nn.rms_norm, nn.group_norm, nn.instance_norm,
})
"""Operations cheap enough to recompute by default besides the elementwise families
(:data:`_CHEAP_FAMILIES`): layout changes, casts and the norms (memory-bound:
recomputing them costs a pass over data the backward pass reads anyway)."""

EXPENSIVE: frozenset[Primitive] = frozenset({
    tensor.matmul, conv.conv, conv.conv_core, conv.conv_transpose, nn.attention, nn.einsum,
    gradient.matmul_dx, gradient.matmul_dy, conv.conv_input_grad, conv.conv_weight_grad,
})
"""Never recomputed: the compute-bound operations (their outputs are what is worth keeping)."""

NEVER: frozenset[Primitive] = frozenset({nn.dropout, remat_barrier})
"""Never recomputed at any level: a dropout mask drawn again would differ."""

LEVELS = ("cheap", "more", "all")
"""What may be recomputed: ``cheap`` (:data:`CHEAP`), ``more`` (any data operation
but :data:`EXPENSIVE`: reductions, pooling, softmax too), ``all`` (the expensive
ones too)."""

INF = 1 << 62


class RematError(AnfirError):
    """A rematerialisation that cannot be done (a budget no plan meets, a bad option)."""


@dataclass
class RematSummary:
    """What one rematerialisation decided."""

    kept: int = 0
    """Forward values kept for the backward pass (the cut)."""
    recomputed: int = 0
    """Copies of forward nodes computed again in the backward pass."""
    bytes_saved: int = 0
    """Modeled: the bytes of forward values the backward pass read before, less those it reads now."""
    extra_flops: int = 0
    """Modeled: the floating-point operations of the copies."""
    level: str = "cheap"
    """What was allowed to be recomputed (:data:`LEVELS`)."""
    fraction: float = 1.0
    """The part of the forward pass (from its start) whose values could be recomputed."""
    arena: Optional[int] = None
    """The planned arena of the result, when a budget made the phase measure it."""
    tried: list[tuple[str, float, int]] = field(default_factory=list)
    """With a budget: (level, fraction, planned arena) of each candidate measured."""
    kept_nodes: list[CNode] = field(default_factory=list)
    """The kept forward nodes, in the forward pass's order (for inspection)."""
    """With a budget: (level, fraction, planned arena) of each candidate measured."""

    def line(self) -> str:
        """The summary line of the phase's dump and of the CLI."""
        if self.level == DOTS_SAVEABLE:
            return (f"remat: {self.kept} values kept, {self.recomputed} values recomputed, "
                    f"{self.bytes_saved} bytes saved (modeled), {self.extra_flops} extra FLOPs "
                    f"(checkpoint policy {DOTS_SAVEABLE}: the matrix products and convolutions "
                    "a checkpoint recomputed are kept)")
        text = (f"remat: {self.kept} values kept, {self.recomputed} values recomputed, "
                f"{self.bytes_saved} bytes saved (modeled), {self.extra_flops} extra FLOPs "
                f"(recomputing {self.level} operations of {self.fraction:.0%} of the forward pass)")
        if self.arena is not None:
            text += f", arena {self.arena} bytes"
        return text


# -- sizes and costs ---------------------------------------------------------------------
def nbytes(abstract: Any) -> Optional[int]:
    """The bytes of a value of type ``abstract`` (tuples: their leaves); None when
    it is not data of concrete size."""
    if isinstance(abstract, ATuple):
        total = 0
        stack = list(abstract.items)  # (iterative: a tuple may be nested deeply)
        while stack:
            item = stack.pop()
            if isinstance(item, ATuple):
                stack.extend(item.items)
                continue
            size = nbytes(item)
            if size is None:
                return None
            total += size
        return total
    if isinstance(abstract, AScalar) and abstract.dtype in TYPE_NAMES and abstract.dtype != "str":
        return int(numpy_dtype(abstract.dtype).itemsize)
    if isinstance(abstract, ATensor) and abstract.shape is not None \
            and all(isinstance(d, int) for d in abstract.shape) and abstract.dtype != "str":
        return int(np.prod(abstract.shape, dtype=np.int64)) * int(numpy_dtype(abstract.dtype).itemsize)
    return None


def _numel(abstract: Any) -> int:
    if isinstance(abstract, ATensor) and abstract.shape is not None \
            and all(isinstance(d, int) for d in abstract.shape):
        return int(np.prod(abstract.shape, dtype=np.int64))
    return 1


def flops(node: CNode) -> int:
    """A model of the floating-point operations of ``node``: a multiply-add per
    product term for matrix products and convolutions, one per element otherwise."""
    prim = _prim(node)
    out = _numel(node.abstract)
    if prim is tensor.matmul and len(node.inputs) > 1:
        a = node.inputs[1].abstract
        k = a.shape[-1] if isinstance(a, ATensor) and a.shape and isinstance(a.shape[-1], int) else 1
        return 2 * out * int(k)
    if prim in (conv.conv, conv.conv_core) and len(node.inputs) > 2:
        w = node.inputs[2].abstract
        return 2 * out * (_numel(w) // max(1, w.shape[0] if isinstance(w, ATensor) and w.shape
                                            and isinstance(w.shape[0], int) else 1))
    return out


def _prim(node: Node) -> Optional[Primitive]:
    if isinstance(node, CNode):
        head = node.inputs[0]
        if isinstance(head, ValueNode) and isinstance(head.value, Primitive):
            return head.value
    return None


def recomputable(node: CNode, level: str) -> bool:
    """Whether ``node`` may be computed again at ``level`` (:data:`LEVELS`)."""
    prim = _prim(node)
    if prim is None or prim in NEVER or prim.internal and prim not in CHEAP:
        return False
    if nbytes(node.abstract) is None:
        return False  # a function, an environment, a string: not data to copy
    if prim in CHEAP or prim.family in _CHEAP_FAMILIES:
        return True
    return level == "all" or level == "more" and prim not in EXPENSIVE


# -- the decision ----------------------------------------------------------------------
def _is_backward(node: CNode) -> bool:
    note = node.loc.note if node.loc is not None else ""
    return "◂" in note or "gradient rule of" in note


def _rule_instance(node: Node) -> Optional[tuple[str, str, int, int]]:
    """The gradient rule instance that made ``node`` (the rule's name and the place of
    the call it differentiates), or None for a node the AD made itself (``◂g``)."""
    loc = node.loc
    if loc is None or "◂" in loc.note:
        return None
    at = loc.note.rfind("gradient rule of")
    if at < 0:
        return None
    return loc.note[at:], loc.file, loc.line, loc.col


def rematerialize(graph: FuncGraph, level: str = "cheap", fraction: float = 1.0) -> RematSummary:
    """Rematerialise ``graph`` in place (typed, optimized, one graph: call
    :func:`inline_everything` first); return what was decided."""
    if level not in LEVELS:
        raise RematError(f"unknown remat level {level!r}: one of {', '.join(LEVELS)}")
    manager = graph.manager or rebuild_manager([graph])
    _fold_sizes(graph, manager)
    order = [n for n in toposort(graph, manager) if isinstance(n, CNode) and n.graph is graph]
    position = {n: i for i, n in enumerate(order)}
    # Backward: made for a backpropagator, or computed from such a node.  An element
    # of an input tuple is neither (the optimizer merges the backward pass's reads of
    # a parameter with the forward pass's, keeping either's location).
    backward: set[CNode] = set()
    from_inputs: set[Node] = set(graph.parameters)
    for node in order:
        if _prim(node) is structure.tuple_getitem and node.inputs[1] in from_inputs:
            from_inputs.add(node)
        elif any(i in backward for i in node.inputs) or _is_backward(node):
            backward.add(node)
    forward = [n for n in order if n not in backward]
    summary = RematSummary(level=level, fraction=fraction)
    if not backward or not forward:
        return summary
    index = {n: i for i, n in enumerate(forward)}
    allowed_until = int(round(fraction * len(forward)))

    def readers(node: Node) -> list[tuple[Any, int]]:
        return list(manager.users.get(node, {}))

    # The network: 2i = v_in, 2i + 1 = v_out, then source and sink.
    source, sink = 2 * len(forward), 2 * len(forward) + 1
    net = _FlowNetwork(2 * len(forward) + 2)
    read_by_backward: list[CNode] = []
    aliases: set[Node] = set(graph.parameters)
    for i, v in enumerate(forward):
        size = nbytes(v.abstract)
        # An element of an input tuple is the input's own memory: keeping it costs nothing.
        free = _prim(v) is structure.tuple_getitem and v.inputs[1] in aliases
        if free:
            aliases.add(v)
        net.add(2 * i, 2 * i + 1, 0 if free else (size if size is not None else 0))
        if not (i < allowed_until and recomputable(v, level)):
            net.add(source, 2 * i, INF)
        for inp in v.inputs[1:]:
            j = index.get(inp)  # type: ignore[call-overload]
            if j is not None:
                net.add(2 * j + 1, 2 * i, INF)
        needed = False
        for user, _ in readers(v):
            if isinstance(user, CNode) and user in backward or not isinstance(user, CNode) \
                    or user.graph is not graph:
                needed = True  # read by the backward pass, the output or a closure
        if v is graph.output:
            needed = True
        if needed:
            net.add(2 * i + 1, sink, INF)
            read_by_backward.append(v)
    net.max_flow(source, sink)
    reach = net.reachable(source)
    kept = {v for i, v in enumerate(forward)
            if reach[2 * i] and not reach[2 * i + 1] and v not in aliases}
    recompute = {v for i, v in enumerate(forward) if not reach[2 * i]}
    before = sum(nbytes(v.abstract) or 0 for v in read_by_backward if v not in aliases)
    after = sum(nbytes(v.abstract) or 0 for v in kept)

    # A backward node's depth: 0 when it reads no backward value (it is computed from
    # forward values alone: the 1 - y^2 of tanh's rule, a relu's mask), else one more
    # than its deepest backward input.  A copy waits for the deepest backward input of
    # its reader (an incoming gradient), never for one of depth 0, which is ready as
    # early as the forward values it is made from.
    #
    #
    # A *pure* backward node is one a gradient rule computes from forward values alone,
    # through other nodes of the same rule's instance (all of gelu's rule but its last
    # product with dout): it carries no gradient, so it is no anchor.  Anchoring on it
    # would give each of its pure readers a copy of its own (one copy of gelu's input
    # for erf's side, another for exp's, both live at once); instead pure nodes borrow
    # the anchor of the gradient-carrying node they feed, and their copies are shared.
    # A node reading a backward node of another rule instance (another rule, or the
    # same rule at another place) or an AD node (``◂``) carries a gradient.  (A wrong
    # guess costs memory, never correctness: every anchor is checked below.)
    depth: dict[Node, int] = {}
    pure: set[Node] = set()
    for node in order:
        if node in backward:
            depth[node] = max((depth[i] + 1 for i in node.inputs if i in depth), default=0)
            key = _rule_instance(node)
            if key is not None and all(i in pure and _rule_instance(i) == key
                                       for i in node.inputs if i in depth):
                pure.add(node)
    anchors: dict[CNode, Optional[Node]] = {}
    for node in reversed(order):
        if node not in backward:
            continue
        deepest = max((i for i in node.inputs if i in depth and i not in pure),
                      key=lambda i: depth[i], default=None)
        anchor: Optional[Node] = deepest if deepest is not None and depth[deepest] > 0 else None
        if anchor is None:
            # A backward node computed from forward values only (the 1 - y^2 of tanh's
            # rule): the anchor of its first backward reader, if that comes before it.
            users = sorted((u for u, _ in readers(node) if isinstance(u, CNode) and u in backward),
                           key=lambda u: position[u])
            borrowed = anchors.get(users[0]) if users else None
            if isinstance(borrowed, CNode) and position.get(borrowed, len(order)) < position[node]:
                anchor = borrowed
        anchors[node] = anchor

    copies: dict[tuple[CNode, Optional[Node]], CNode] = {}
    barriers: dict[tuple[Node, Node], CNode] = {}
    barrier_value = ValueNode(remat_barrier)
    barrier_value.abstract = abstract_of_value(remat_barrier)

    def copy_of(value: CNode, anchor: Optional[Node]) -> CNode:
        """The copy of ``value`` computed after ``anchor`` (iterative over the chain)."""
        stack = [value]
        while stack:
            top = stack[-1]
            if (top, anchor) in copies:
                stack.pop()
                continue
            missing = [i for i in top.inputs[1:] if i in recompute and (i, anchor) not in copies]
            if missing:
                stack.extend(missing)
                continue
            stack.pop()
            inputs: list[Node] = [top.inputs[0]]
            for inp in top.inputs[1:]:
                if inp in recompute:
                    inputs.append(copies[(inp, anchor)])
                elif isinstance(inp, CNode) and anchor is not None and inp.graph is graph:
                    fence = barriers.get((inp, anchor))
                    if fence is None:
                        loc = inp.loc.derive(BARRIER) if inp.loc is not None else None
                        fence = CNode(graph, [barrier_value, inp, anchor], loc, inp.name)
                        fence.abstract = inp.abstract
                        barriers[(inp, anchor)] = fence
                    inputs.append(fence)
                else:
                    inputs.append(inp)
            loc = top.loc.derive(RECOMPUTED) if top.loc is not None else None
            made = CNode(graph, inputs, loc, top.name, top.attrs)
            made.abstract = top.abstract
            copies[(top, anchor)] = made
            summary.recomputed += 1
            summary.extra_flops += flops(top)
        return copies[(value, anchor)]

    edits: list[tuple[CNode, int, CNode]] = []
    for node in order:
        if node not in backward:
            continue
        for k, inp in enumerate(node.inputs):
            if k > 0 and inp in recompute:
                edits.append((node, k, copy_of(inp, anchors.get(node))))
    out = graph.output
    if out in recompute:
        graph.output = copy_of(out, None)
    for node, k, made in edits:
        node.set_input(k, made)
    backward_first(graph)
    summary.kept = len(kept)
    summary.kept_nodes = sorted(kept, key=lambda n: position[n])
    summary.bytes_saved = before - after
    return summary


def _fold_sizes(graph: FuncGraph, manager: Manager) -> None:
    """Replace ``size(x)`` of a tensor of concrete shape by its number: a backward node
    reading only a forward value's size (the gradient of ``mean``) must not keep that
    value alive, nor make it recomputed."""
    for node in list(toposort(graph, manager)):
        if _prim(node) is gradient.size and isinstance(node, CNode) and len(node.inputs) == 2:
            t = node.inputs[1].abstract
            if isinstance(t, AScalar) or isinstance(t, ATensor) and t.shape is not None \
                    and all(isinstance(d, int) for d in t.shape):
                count = _numel(t)
                constant = ValueNode(count, node.loc, node.name)
                constant.abstract = abstract_of_value(count)
                manager.replace(node, constant)


def backward_first(graph: FuncGraph) -> None:
    """Make a schedule compute the results last first.

    The low level runs a graph in the order of a depth-first walk from its
    output, inputs left to right.  A gradient program returns the gradients in
    the order of its parameters, the first layer's first: the walk then runs
    the chain of input gradients down to the first layer before any other
    layer's weight gradient, and each layer's incoming gradient (and the
    forward values its weight gradient reads) stays alive until the end.
    Reading the results through a tuple of them in reverse order makes the walk
    take the last layer's gradient first, then the one below: the order of
    the backward pass, each weight gradient computed as soon as it can be.
    The values are unchanged (the low level takes tuples apart)."""
    out = graph.output
    holder: Optional[CNode] = None
    if _prim(out) is gradient.grad_arg_check:  # (the check of grad's argument types wraps the result)
        assert isinstance(out, CNode)
        holder, out = out, out.inputs[2]
    if _prim(out) is not structure.make_tuple:
        return
    leaves: list[Node] = []
    stack: list[Node] = [out]
    while stack:
        node = stack.pop()
        if _prim(node) is structure.make_tuple:
            stack.extend(reversed(node.inputs[1:]))
        else:
            leaves.append(node)
    if len(leaves) < 2:
        return
    make = ValueNode(structure.make_tuple)
    make.abstract = abstract_of_value(structure.make_tuple)
    getitem = ValueNode(structure.tuple_getitem)
    getitem.abstract = abstract_of_value(structure.tuple_getitem)
    loc = out.loc.derive("remat: backward first") if out.loc is not None else None
    reverse = CNode(graph, [make, *reversed(leaves)], loc)
    reverse.abstract = ATuple(tuple(leaf.abstract for leaf in reversed(leaves)))
    reads: dict[Node, Node] = {}
    for i, leaf in enumerate(leaves):
        index = ValueNode(len(leaves) - 1 - i)
        index.abstract = abstract_of_value(len(leaves) - 1 - i)
        read = CNode(graph, [getitem, reverse, index], leaf.loc)
        read.abstract = leaf.abstract
        reads.setdefault(leaf, read)
    # The same nesting again, each leaf read from the reversed tuple (made bottom-up,
    # without recursion: a node's inputs are rebuilt before it).
    rebuilt: dict[Node, Node] = {}
    work: list[tuple[Node, bool]] = [(out, False)]
    while work:
        node, ready = work.pop()
        if node in rebuilt:
            continue
        if _prim(node) is not structure.make_tuple:
            rebuilt[node] = reads[node]
            continue
        assert isinstance(node, CNode)
        if not ready:
            work.append((node, True))
            work.extend((i, False) for i in node.inputs[1:] if i not in rebuilt)
            continue
        made = CNode(graph, [node.inputs[0], *(rebuilt[i] for i in node.inputs[1:])], node.loc)
        made.abstract = node.abstract
        rebuilt[node] = made
    if holder is not None:
        holder.set_input(2, rebuilt[out])
    else:
        graph.output = rebuilt[out]


class _FlowNetwork:
    """A flow network with integer capacities; Dinic's maximum flow, iterative."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.heads: list[list[int]] = [[] for _ in range(size)]
        self.to: list[int] = []
        self.cap: list[int] = []

    def add(self, a: int, b: int, capacity: int) -> None:
        self.heads[a].append(len(self.to))
        self.to.append(b)
        self.cap.append(capacity)
        self.heads[b].append(len(self.to))
        self.to.append(a)
        self.cap.append(0)

    def _levels(self, s: int) -> list[int]:
        level = [-1] * self.size
        level[s] = 0
        queue = [s]
        for a in queue:
            for e in self.heads[a]:
                b = self.to[e]
                if self.cap[e] > 0 and level[b] < 0:
                    level[b] = level[a] + 1
                    queue.append(b)
        return level

    def max_flow(self, s: int, t: int) -> int:
        """Push the maximum flow from ``s`` to ``t``; return its value."""
        total = 0
        while True:
            level = self._levels(s)
            if level[t] < 0:
                return total
            cursor = [0] * self.size
            while True:
                # One augmenting path along the level graph, found without recursion.
                path: list[int] = []
                a = s
                while a != t:
                    edges = self.heads[a]
                    while cursor[a] < len(edges):
                        e = edges[cursor[a]]
                        b = self.to[e]
                        if self.cap[e] > 0 and level[b] == level[a] + 1:
                            break
                        cursor[a] += 1
                    if cursor[a] == len(edges):
                        if not path:
                            break
                        level[a] = -1  # a dead end: retreat
                        e = path.pop()
                        a = self.to[e ^ 1]
                        cursor[a] += 1
                        continue
                    e = edges[cursor[a]]
                    path.append(e)
                    a = self.to[e]
                if a != t:
                    break
                push = min(self.cap[e] for e in path)
                for e in path:
                    self.cap[e] -= push
                    self.cap[e ^ 1] += push
                total += push
                if push >= INF:
                    raise RematError("internal: an infinite cut (a forward value the backward "
                                     "pass reads can neither be kept nor recomputed)")

    def reachable(self, s: int) -> list[bool]:
        """The nodes reachable from ``s`` in the residual network (the source side of a minimum cut)."""
        seen = [False] * self.size
        seen[s] = True
        queue = [s]
        for a in queue:
            for e in self.heads[a]:
                b = self.to[e]
                if self.cap[e] > 0 and not seen[b]:
                    seen[b] = True
                    queue.append(b)
        return seen


# -- the checkpoint policy "save matrix products and convolutions" -----------------------
DOTS_SAVEABLE = "dots-saveable"
"""``remat="dots-saveable"``: the policy of JAX's ``checkpoint_policies.dots_saveable``
for every ``checkpoint(f)`` of the program (:func:`save_dots`)."""


def _constant_key(node: ValueNode) -> Any:
    """A constant's identity for :func:`save_dots`: scalars, strings and flat tuples of
    them by type and value (floats by ``repr``: -0.0 is not 0.0), primitives and graphs
    by object, anything else (arrays) only as the same node."""
    v = node.value
    if v is None or type(v) in (bool, int, str):
        return ("const", type(v).__name__, v)
    if type(v) is float:
        return ("const", "float", repr(v))
    if isinstance(v, tuple) and all(e is None or type(e) in (bool, int, float, str) for e in v):
        return ("tuple", tuple((type(e).__name__, repr(e)) for e in v))
    if isinstance(v, (Primitive, FuncGraph)):
        return v
    return node


def save_dots(graph: FuncGraph) -> RematSummary:
    """Keep the matrix products and convolutions a ``checkpoint(f)`` recomputes (JAX's
    ``dots_saveable`` policy): ``graph`` is rewritten in place (one graph: call
    :func:`inline_everything` first).

    A checkpointed call's backward pass computes ``f``'s forward pass again from its
    inputs read through ``remat_barrier``.  Numbering values modulo those barriers (a
    node is the same value as an earlier one when it applies the same callee, with the
    same attributes, to the same values), each recomputed node of an :data:`EXPENSIVE`
    primitive that equals a forward node is replaced by it: the forward value is kept
    for the backward pass, and only the cheap operations around it are recomputed,
    from it.  Linear in the graph's size."""
    manager = graph.manager or rebuild_manager([graph])
    order = [n for n in toposort(graph, manager) if isinstance(n, CNode) and n.graph is graph]
    value: dict[Node, Any] = {}
    """A node → the earliest node computing the same value (itself if none)."""
    first: dict[Any, CNode] = {}
    recomputed: set[Node] = set()
    """Nodes that read a barrier (the recomputation of a checkpointed forward pass)."""
    summary = RematSummary(level=DOTS_SAVEABLE, fraction=1.0)

    def key_of(node: Node) -> Any:
        if isinstance(node, ValueNode):
            return _constant_key(node)
        return value.get(node, node)

    anchor: dict[Node, Node] = {}
    """A recomputed node → the ``after`` of a barrier it reads (what it waits for)."""
    replace: list[tuple[CNode, CNode]] = []
    for node in order:
        if _prim(node) is remat_barrier:
            value[node] = key_of(node.inputs[1])
            recomputed.add(node)
            anchor[node] = node.inputs[2]
            continue
        waits = next((anchor[i] for i in node.inputs if i in recomputed), None)
        if waits is not None:
            recomputed.add(node)
            anchor[node] = waits
        key = (node.attrs.key, *(key_of(i) for i in node.inputs))
        known = first.setdefault(key, node)
        value[node] = known
        if known is node or node not in recomputed or known in recomputed:
            continue
        if _prim(node) in EXPENSIVE:
            replace.append((node, known))
            summary.kept += 1
            summary.bytes_saved -= nbytes(node.abstract) or 0
        else:
            summary.recomputed += 1
            summary.extra_flops += flops(node)
    # The kept value is read through a barrier on what the copy waited for: the cheap
    # operations recomputed from it stay copies (nothing merges them with the forward
    # pass's) and still run in the backward pass.
    barrier_value = ValueNode(remat_barrier)
    barrier_value.abstract = abstract_of_value(remat_barrier)
    for node, known in replace:
        loc = known.loc.derive(BARRIER) if known.loc is not None else None
        fence = CNode(graph, [barrier_value, known, anchor[node]], loc, known.name)
        fence.abstract = known.abstract
        manager.replace(node, fence)
    return summary


# -- the phase ---------------------------------------------------------------------------
INLINE_ALL = 1 << 30
"""An inlining threshold no graph reaches: every non-recursive call is inlined."""


def inline_everything(manager: Manager) -> None:
    """Inline every call of a non-recursive graph (and simplify what that exposes),
    so that the forward and backward passes are one graph."""
    optimize_graphs(manager, inline_threshold=INLINE_ALL)


def candidates() -> list[tuple[str, float]]:
    """The (level, fraction) pairs a budget tries, from least to most recomputation."""
    return [("cheap", f / 8) for f in range(1, 9)] + [("more", 1.0), ("all", 1.0)]


def planned_arena(graph: FuncGraph) -> int:
    """The planned arena of ``graph`` lowered (its buffers shared and planned)."""
    arena = plan_memory(share_buffers(lower_graph(graph))).arena_bytes
    assert arena is not None  # (planned)
    return arena


def rematerialize_for_budget(graph: FuncGraph, budget: int,
                             measure: Callable[[FuncGraph], int] = planned_arena) -> tuple[FuncGraph, RematSummary]:
    """The first candidate (:func:`candidates`) whose planned arena is at most
    ``budget`` bytes, as a new graph; a :class:`RematError` naming the smallest
    arena reached when none is."""
    tried: list[tuple[str, float, int]] = []
    try:
        arena = measure(graph)
    except AnfirError as error:
        raise RematError("a memory budget is measured by the buffer planner, which cannot "
                         f"lower this program: {error.message}", error.loc) from None
    tried.append(("none", 0.0, arena))
    if arena <= budget:
        summary = RematSummary(level="none", fraction=0.0, arena=arena, tried=tried)
        return graph, summary
    for level, fraction in candidates():
        trial = clone(graph)
        rebuild_manager([trial])
        summary = rematerialize(trial, level, fraction)
        arena = measure(trial)
        tried.append((level, fraction, arena))
        if arena <= budget:
            summary.arena = arena
            summary.tried = tried
            return trial, summary
    level, fraction, best = min(tried, key=lambda t: t[2])
    raise RematError(f"no rematerialisation fits a budget of {budget} bytes: the smallest "
                     f"planned arena reachable is {best} bytes (recomputing {_WHAT[level]} of "
                     f"{fraction:.0%} of the forward pass); give a budget of at least {best} bytes",
                     graph.loc)


_WHAT = {"none": "nothing", "cheap": "the cheap operations",
         "more": "every operation but matrix products, convolutions and attention",
         "all": "every operation"}


RematOption = Union[str, int]


def check_option(remat: Any) -> RematOption:
    """``remat`` checked: ``"min-cut"`` or a positive number of bytes (an int, or a
    string of digits from the command line)."""
    if isinstance(remat, str) and remat.strip().isdigit():
        remat = int(remat.strip())
    if isinstance(remat, bool) or not (remat in ("min-cut", DOTS_SAVEABLE)
                                       or isinstance(remat, int) and remat > 0):
        raise UsageError(f"remat is \"min-cut\", a memory budget in bytes (a positive int) or "
                         f"the checkpoint policy \"{DOTS_SAVEABLE}\", not {remat!r}")
    return remat


def remat_phase(remat: Any) -> Phase:
    """The ``remat`` phase for the option ``remat`` (inserted before ``validate``)."""
    option = check_option(remat)

    def run(program: Program) -> Program:
        if program.entry is None:
            raise UsageError("remat needs the compiled entry graph")
        manager = program.require_manager()
        inline_everything(manager)
        if option == "min-cut":
            summary = rematerialize(program.entry)
        elif option == DOTS_SAVEABLE:
            summary = save_dots(program.entry)
        else:
            assert isinstance(option, int)
            chosen, summary = rematerialize_for_budget(program.entry, option)
            if chosen is not program.entry:
                program.entry = chosen
        program.manager = rebuild_manager([program.entry])
        program.artifacts["remat"] = summary
        program.stats["remat: values recomputed"] += summary.recomputed
        return program

    return Phase("remat", run, "keep or recompute forward values for the backward pass (min-cut)",
                 dump=write_remat_dump)


def write_remat_dump(program: Program, folder: Path, stem: str) -> list[str]:
    """The phase's dump: the usual ``.ir`` and ``.dot``, the summary line in the ``.ir`` header."""
    written = write_dumps(program, folder, stem)
    summary = program.artifacts.get("remat")
    if isinstance(summary, RematSummary) and written:
        path = Path(written[0])
        lines = path.read_text(encoding="utf-8").split("\n")
        lines.insert(2, "# " + summary.line())
        with open(path, "w", encoding="utf-8", newline="\n") as handle:
            handle.write("\n".join(lines))
    return written


def with_remat(phases: list[Phase], remat: Any) -> list[Phase]:
    """``phases`` with the ``remat`` phase inserted before ``validate``."""
    names = [p.name for p in phases]
    at = names.index("validate") if "validate" in names else len(phases)
    return [*phases[:at], remat_phase(remat), *phases[at:]]


__all__ = ["CHEAP", "DOTS_SAVEABLE", "EXPENSIVE", "LEVELS", "RECOMPUTED", "RematError", "RematSummary",
           "candidates", "check_option", "flops", "inline_everything", "nbytes", "planned_arena",
           "recomputable", "remat_phase", "rematerialize", "rematerialize_for_budget", "save_dots",
           "with_remat"]

"""Batching (``vmap``) as a source transform.

``B(g, bts)`` is a new graph computing ``g`` for a batch of examples at once.
Each value of the batched program is either *unbatched* (the same for every
example: the original value) or *batched*: the examples' values stacked on a
new leading axis.  Which one is decided statically, node by node, from which
parameters are batched — a batch tree (``BT``) per node: ``False``, ``True``,
or a tuple of trees for a tuple whose elements differ.  Only the per-example
*rank* of a batched operand is a run-time fact, so the rules write the small
reshapes of :mod:`anfir.primitives.batching` where numpy's broadcasting needs
one and the transform needs no types (it serves ``anfir.run``, which never
types, and the compiler alike, as the J transform does).

How each call ``y = f(x...)`` is transformed:

* ``f`` a primitive: nothing batched, the call is copied; otherwise the
  primitive's rule from :data:`RULES` (keyed by the primitive object, as JAX's
  ``primitive_batchers``), which moves the batch axis, broadcasts unbatched
  operands, rewrites ``axis=``/``keepdims=`` attributes; a primitive without a
  rule runs :func:`~anfir.primitives.batching.batch_loop`, one example at a
  time (:data:`FALLBACK_ONLY` is the list the tests keep).
* ``f`` a known graph: its batched copy for the arguments' batch trees (one
  per tree, so recursion closes on itself); graphs nested in ``g`` are copied
  with their free variables pointing at the batched nodes.
* ``f`` a function value: one made here (a lambda capturing batched values)
  is *batched-world* — it takes every argument batched and returns a batched
  value; one from outside (a parameter, a captured function, ``J(f)``) is
  batched when called, at run time, by ``batch_fn`` (JAX's ``vmap`` of a
  traced function).
* ``grad``/``value_and_grad``/``jvp``/``vmap`` of a known function called on
  batched values: the function is differentiated (or batched) first, in the
  unbatched world, and the result batched — JAX's order for ``vmap(grad(f))``;
  when the function itself differentiates (``vmap(jvp(f))``, whose ``jvp`` is a
  ``grad`` of a ``grad``), it is batched first and the batched function
  differentiated (``grad`` of the sum over the independent examples).
* ``if`` on a batched condition (``switch(c, ✓, ✗)()``): both branches run and
  ``batch_select`` picks per example (JAX's ``select``).  When a branch
  recurses (a loop), that cannot run unconditionally: while *some* example
  still takes the recursive branch, the loop goes on, and the examples already
  done keep their state (the tail call's arguments are selected against the
  current ones, JAX's ``while_loop`` batching) — so the loop runs until every
  example is done.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

import numpy as np

from anfir.autodiff.gradgraphs import build_grad_body, normalize_wrt
from anfir.autodiff.jtransform import FORWARD, check_differentiable_graph, j_graph
from anfir.autodiff.partials import call_node
from anfir.autodiff.runtime import arity_of
from anfir.errors import AnfirError, AnfirTypeError, GradientError
from anfir.ir import capture_names
from anfir.ir.attrs import NO_ATTRS, Attrs
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager, manage
from anfir.ir.nodes import CNode, Node, ParameterNode, ValueNode
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.ir.walk import toposort
from anfir.primitives import (arith, batching as bp, complexes, conv, elementwise, gradient, indexing,
                              loops, meta, nn, reduce, shaping, structure, tensor)
from anfir.primitives.registry import PRIMITIVES
from anfir.runtime_values import Closure, Partial

BT = Union[bool, tuple]
"""A batch tree: False (not batched), True (batched on axis 0, every leaf), or a
tuple of trees for a tuple value whose elements differ."""


class BatchingError(AnfirTypeError):
    """A program ``vmap`` cannot batch (located at the user's node)."""


# -- batch trees -----------------------------------------------------------------------
def bt_any(bt: BT) -> bool:
    """Whether anything in the tree is batched."""
    if isinstance(bt, tuple):
        return any(bt_any(b) for b in bt)
    return bool(bt)


def bt_axes(bt: BT) -> Any:
    """The tree as ``in_axes``: 0 for batched, None for not, tuples for tuples."""
    if isinstance(bt, tuple):
        return tuple(bt_axes(b) for b in bt)
    return 0 if bt else None


def _norm(bt: BT) -> BT:
    if isinstance(bt, tuple):
        items = tuple(_norm(b) for b in bt)
        if not any(bt_any(b) for b in items):
            return False
        return items
    return bool(bt)


# -- instances -----------------------------------------------------------------------------
class _Instance:
    """The batched copy of one graph for one batch tree per parameter."""

    def __init__(self, graph: FuncGraph, bts: tuple[BT, ...], parent: Optional["_Instance"],
                 force: bool, freeze: Optional[tuple[str, Node]]) -> None:
        self.graph = graph
        self.bts = bts
        self.parent = parent
        self.force = force
        self.freeze = freeze
        self.env: dict[Node, tuple[Node, BT]] = {}
        self.static: dict[Node, FuncGraph] = {}
        self.new = graph
        self.batched = False
        self.out_bt: BT = False
        self.ref: Optional[Node] = None
        self.ref_sources: list[tuple[Node, BT]] = []
        self.built = False


class Batcher:
    """One batching transformation: its batched copies, keyed by graph, trees and scope."""

    def __init__(self, per_example_loops: bool = False) -> None:
        self.per_example_loops = per_example_loops
        """For the compiler: a call of a function value from outside (a pullback, a
        captured function) on batched values becomes a ``scan`` over the examples,
        which the specializer types and every back end runs, instead of ``batch_fn``
        (batching at run time, which only the evaluator and JAX can do)."""
        self.instances: dict[tuple, _Instance] = {}
        self.todo: list[_Instance] = []
        self.global_refs: list[Node] = []

    # -- instances ------------------------------------------------------------------
    @staticmethod
    def manager(graph: FuncGraph) -> Manager:
        return graph.manager or manage(graph)

    def _scope_parent(self, graph: FuncGraph, chain: Optional[_Instance]) -> Optional[_Instance]:
        target = self.manager(graph).parent(graph)
        p = chain
        while p is not None and p.graph is not target:
            p = p.parent
        return p

    def instance(self, graph: FuncGraph, bts: tuple[BT, ...], chain: Optional[_Instance],
                 force: bool = True, freeze: Optional[tuple[str, Node]] = None) -> _Instance:
        """The batched copy of ``graph`` (built later, from the work list)."""
        parent = self._scope_parent(graph, chain)
        bts = tuple(_norm(b) for b in bts)
        key = (graph, bts, id(parent) if parent is not None else None, force,
               (freeze[0], id(freeze[1])) if freeze is not None else None)
        inst = self.instances.get(key)
        if inst is not None:
            return inst
        inst = _Instance(graph, bts, parent, force, freeze)
        self.instances[key] = inst
        batched_fvs: list[tuple[Node, BT]] = []
        for fv in self.manager(graph).free_variables_total(graph):
            node, bt = self.lookup_outer(parent, fv)
            if bt_any(bt):
                batched_fvs.append((node, bt))
        batched_fv = batched_fvs[0] if batched_fvs else None
        inst.batched = any(bt_any(b) for b in bts) or batched_fv is not None or freeze is not None
        if not inst.batched and parent is None:
            inst.built = True  # nothing batched reaches it: the graph itself
            return inst
        inst.new = FuncGraph(("⊞" if inst.batched else "") + graph.name, graph.loc)
        inst.new.flags["batch_of"] = graph.name
        for p, b in zip(graph.parameters, bts):
            q = inst.new.add_parameter(p.name or "x", p.loc)
            inst.env[p] = (q, b)
            if bt_any(b):
                inst.ref_sources.append((q, b))
        inst.ref_sources.extend(batched_fvs)
        if freeze is not None:
            inst.ref_sources.append((freeze[1], True))
        inst.out_bt = True if (inst.batched and force) else False
        self.todo.append(inst)
        return inst

    def lookup_outer(self, inst: Optional[_Instance], node: Node) -> tuple[Node, BT]:
        """A node of an enclosing graph as seen from ``inst``'s copies."""
        p = inst
        while p is not None:
            got = p.env.get(node)
            if got is not None:
                return got
            p = p.parent
        return node, False

    def drain(self) -> None:
        while self.todo:
            inst = self.todo.pop()
            if not inst.built:
                inst.built = True
                _Body(self, inst).build()

    def build_now(self, inst: _Instance) -> None:
        if not inst.built:
            self.todo.remove(inst)
            inst.built = True
            _Body(self, inst).build()

    # -- the entry -----------------------------------------------------------------------
    def entry(self, graph: FuncGraph, in_axes: Any, out_axes: Any, loc: Any = None,
              inner: bool = False) -> FuncGraph:
        """``(x...) -> vmap(graph, in_axes, out_axes)(x...)`` as a graph with ``graph``'s free
        variables (a closure of it captures what a closure of ``graph`` does)."""
        n = len(graph.parameters)
        axes = normalize_in_axes(in_axes, n)
        check_out_axes(out_axes)
        entry = FuncGraph(f"vmap_{graph.name}", loc or graph.loc)
        entry.flags["batch_of"] = graph.name
        args: list[Node] = []
        bts: list[BT] = []
        if inner:
            # Called from a batched body: the caller's batched values come first, so the
            # batch size is known even if every batched argument is an empty GradEnv.
            self.global_refs.append(entry.add_parameter("⊞batch"))
        for p, a in zip(graph.parameters, axes):
            q = entry.add_parameter(p.name or "x", p.loc)
            q.annotation = None
            node, bt = _move_in(entry, q, a, loc)
            args.append(node)
            bts.append(bt)
        if not any(bt_any(b) for b in bts):
            raise BatchingError("vmap needs at least one batched argument (an in_axes that "
                                "is not None)", loc)
        self.global_refs.extend(_leaf_ref(entry, n, b, loc) for n, b in zip(args, bts) if bt_any(b))
        inst = self.instance(graph, tuple(bts), None, force=False)
        self.build_now(inst)
        self.drain()
        out: Node = CNode(entry, [ValueNode(inst.new), *args], loc)
        ref = _tuple_of(entry, self.global_refs, loc)
        if not inner and graph.flags.get("ad_of") is not None and graph.name.startswith(FORWARD):
            entry.output = _j_world_out(entry, out, inst.out_bt, axes, out_axes, ref, loc)
        else:
            entry.output = _move_out(entry, out, inst.out_bt, out_axes, ref, loc)
        return entry


def _j_world_out(entry: FuncGraph, out: Node, bt: BT, in_axes: tuple[Any, ...], out_axes: Any,
                 ref: Optional[Node], loc: Any) -> Node:
    """The batched form of a J-transformed function is J-world itself: it returns
    ``(value, bprop)`` where ``bprop`` takes the batched cotangent and returns the
    gradients of the *batched* function — an unbatched argument's (and every captured
    value's, in the GradEnv) summed over the examples, a batched one's per example,
    at its axis (so ``grad`` of ``vmap`` is right, as ``batch_unexpand`` is the
    adjoint of broadcasting)."""
    out = _expand_in(entry, out, bt if isinstance(bt, tuple) else True, ref, loc) \
        if isinstance(bt, tuple) else out
    value = _move_out(entry, _item(entry, out, 0, loc), True, out_axes, ref, loc)
    back = _item(entry, out, 1, loc)
    pull = FuncGraph("⊞◂" + entry.name, loc)
    d = pull.add_parameter("dout")
    moved, _ = _move_in(pull, d, out_axes if out_axes is not None else 0, loc)
    grads = CNode(pull, [back, moved], loc)
    items: list[Node] = [CNode(pull, [ValueNode(bp.batch_unexpand), _item(pull, grads, 0, loc)], loc)]
    for i, a in enumerate(in_axes):
        g = _item(pull, grads, 1 + i, loc)
        items.append(_unbatch_grad(pull, g, a, loc))
    pull.output = CNode(pull, [ValueNode(structure.make_tuple), *items], loc)
    return CNode(entry, [ValueNode(structure.make_tuple), value, ValueNode(pull)], loc)


def _unbatch_grad(graph: FuncGraph, g: Node, axes: Any, loc: Any) -> Node:
    if axes is None:
        return CNode(graph, [ValueNode(bp.batch_unexpand), g], loc)
    if isinstance(axes, tuple):
        return CNode(graph, [ValueNode(structure.make_tuple), *(
            _unbatch_grad(graph, _item(graph, g, i, loc), a, loc) for i, a in enumerate(axes))], loc)
    if axes == 0:
        return g
    return CNode(graph, [ValueNode(bp.batch_moveaxis), g], loc,
                 attrs=bp.batch_moveaxis.canonical_attrs({"source": 0, "destination": axes}))


def normalize_in_axes(in_axes: Any, nparams: int) -> tuple[Any, ...]:
    """``in_axes`` as one tree per parameter (an int or None applies to all)."""
    if in_axes is None or (isinstance(in_axes, int) and not isinstance(in_axes, bool)):
        return (in_axes,) * nparams
    if isinstance(in_axes, list):
        in_axes = tuple(in_axes)
    if not isinstance(in_axes, tuple):
        raise BatchingError(f"vmap's in_axes is an int, None or a tuple of them, not "
                            f"{type(in_axes).__name__}")
    if len(in_axes) != nparams:
        raise BatchingError(f"vmap's in_axes has {len(in_axes)} entries but the function "
                            f"takes {nparams} arguments")
    _check_tree(in_axes, "in_axes")
    return in_axes


def check_out_axes(out_axes: Any) -> None:
    """Refuse an ``out_axes`` that is not an int, None or a tuple of them."""
    _check_tree(out_axes, "out_axes")


def _check_tree(tree: Any, what: str) -> None:
    stack = [tree]
    while stack:
        t = stack.pop()
        if isinstance(t, (tuple, list)):
            stack.extend(t)
        elif not (t is None or (isinstance(t, int) and not isinstance(t, bool))):
            raise BatchingError(f"vmap's {what} holds ints, None and tuples, not {t!r}")


def _item(graph: FuncGraph, node: Node, i: int, loc: Any) -> CNode:
    return CNode(graph, [ValueNode(structure.tuple_getitem), node, ValueNode(i)], loc)


def _move_in(graph: FuncGraph, node: Node, axes: Any, loc: Any) -> tuple[Node, BT]:
    if axes is None:
        return node, False
    if isinstance(axes, tuple):
        items = [_move_in(graph, _item(graph, node, i, loc), a, loc) for i, a in enumerate(axes)]
        return (CNode(graph, [ValueNode(structure.make_tuple), *(n for n, _ in items)], loc),
                _norm(tuple(b for _, b in items)))
    if axes == 0:
        return node, True
    return CNode(graph, [ValueNode(bp.batch_moveaxis), node], loc,
                 attrs=bp.batch_moveaxis.canonical_attrs({"source": axes, "destination": 0})), True


def _tuple_of(graph: FuncGraph, nodes: list[Node], loc: Any) -> Optional[Node]:
    if not nodes:
        return None
    if len(nodes) == 1:
        return nodes[0]
    return CNode(graph, [ValueNode(structure.make_tuple), *nodes], loc)


def _leaf_ref(graph: FuncGraph, node: Node, bt: BT, loc: Any) -> Node:
    """A fully batched node inside ``node`` (a getitem path to a batched leaf)."""
    while isinstance(bt, tuple):
        i = next(i for i, b in enumerate(bt) if bt_any(b))
        node, bt = _item(graph, node, i, loc), bt[i]
    return node


def _expand_in(graph: FuncGraph, node: Node, bt: BT, ref: Optional[Node], loc: Any) -> Node:
    if bt is True:
        return node
    if isinstance(bt, tuple):
        items = [_expand_in(graph, _item(graph, node, i, loc), b, ref, loc) for i, b in enumerate(bt)]
        return CNode(graph, [ValueNode(structure.make_tuple), *items], loc)
    if ref is None:
        raise BatchingError("vmap: internal: no batched value to take the batch size from", loc)
    return CNode(graph, [ValueNode(bp.batch_expand), node, ref], loc)


def _move_out(graph: FuncGraph, node: Node, bt: BT, axes: Any, ref: Optional[Node], loc: Any) -> Node:
    if isinstance(axes, (tuple, list)):
        items = []
        for i, a in enumerate(axes):
            sub = bt[i] if isinstance(bt, tuple) else bt
            items.append(_move_out(graph, _item(graph, node, i, loc), sub, a, ref, loc))
        return CNode(graph, [ValueNode(structure.make_tuple), *items], loc)
    if axes is None:
        if bt_any(bt):
            raise BatchingError("vmap: out_axes=None for an output that depends on the batch", loc)
        return node
    node = _expand_in(graph, node, bt, ref, loc)
    if axes == 0:
        return node
    return CNode(graph, [ValueNode(bp.batch_moveaxis), node], loc,
                 attrs=bp.batch_moveaxis.canonical_attrs({"source": 0, "destination": axes}))


# -- a graph's body ------------------------------------------------------------------------
_META_DIFF = (meta.grad, meta.value_and_grad, meta.jvp)


class _Body:
    """Builds one instance's graph from its original, node by node in order."""

    def __init__(self, batcher: Batcher, inst: _Instance) -> None:
        self.b = batcher
        self.inst = inst
        self.graph = inst.new
        self.mng = batcher.manager(inst.graph)
        self.loc: Any = inst.graph.loc

    # -- helpers the rules use -----------------------------------------------------
    def apply(self, callee: Any, *inputs: Node, attrs: Attrs = NO_ATTRS,
              graph: Optional[FuncGraph] = None) -> CNode:
        head = callee if isinstance(callee, Node) else ValueNode(callee)
        if attrs and isinstance(callee, Primitive):
            attrs = callee.canonical_attrs(list(attrs.items()))
        return CNode(graph or self.graph, [head, *inputs], self.loc, attrs=attrs)

    def ref(self) -> Node:
        """Every batched value in scope, as one tuple: the batch size is read at run time
        from the first array among them (a batched value may be an empty GradEnv)."""
        inst = self.inst
        if inst.ref is None:
            if not inst.ref_sources and not self.b.global_refs:
                raise BatchingError("vmap: internal: no batched value in scope", self.loc)
            leaves = [_leaf_ref(self.graph, n, bt, self.loc) for n, bt in inst.ref_sources]
            p = inst.parent
            while p is not None:  # the enclosing copies' batched values, captured
                leaves.extend(n for n, bt in p.ref_sources if bt is True)
                p = p.parent
            leaves.extend(self.b.global_refs)
            made = _tuple_of(self.graph, leaves, self.loc)
            assert made is not None
            inst.ref = made
        return inst.ref

    def expand(self, node: Node, bt: BT, graph: Optional[FuncGraph] = None) -> Node:
        """``node`` (of tree ``bt``) with every leaf batched."""
        if bt is True:
            return node
        return _expand_in(graph or self.graph, node, bt, self.ref(), self.loc)

    def lookup(self, node: Node) -> tuple[Node, BT]:
        got = self.inst.env.get(node)
        if got is not None:
            return got
        if isinstance(node, ValueNode):
            got = self.constant(node)
            self.inst.env[node] = got
            return got
        if node.graph is self.inst.graph:
            raise BatchingError(f"vmap: internal: {node!r} used before it is computed", node.loc)
        return self.b.lookup_outer(self.inst.parent, node)

    def constant(self, node: ValueNode) -> tuple[Node, BT]:
        """A constant used as a value: a graph becomes its batched-world closure."""
        value = node.value
        if isinstance(value, FuncGraph):
            # A closure capturing nothing batched is an ordinary function (copied when
            # its captured values are copies); one capturing batched values is
            # batched-world: every argument batched, the result batched.
            plain = self.b.instance(value, (False,) * len(value.parameters), self.inst)
            if not plain.batched:
                return (node, False) if plain.new is value else \
                    (ValueNode(plain.new, node.loc, node.name), False)
            inst = self.b.instance(value, (True,) * len(value.parameters), self.inst)
            return ValueNode(inst.new, node.loc, node.name), inst.out_bt
        return node, False

    # -- the walk ------------------------------------------------------------------------
    def build(self) -> None:
        g = self.inst.graph
        lazy = self._branch_switches(g)
        frozen = self.inst.freeze is not None
        for node in toposort(g, self.mng):
            if not isinstance(node, CNode) or node.graph is not g or node in lazy:
                continue
            if frozen and node is g.output:
                continue  # the tail call: made by freeze_output
            self.loc = node.loc or g.loc
            try:
                self.inst.env[node] = made = self.call(node)
                _follow_names(node, made[0])
            except BatchingError:
                raise
            except AnfirError as err:
                if err.loc is None:
                    raise BatchingError(f"vmap: {err.message}", node.loc) from None
                raise
        self.loc = g.loc
        if frozen:
            assert isinstance(g.output, CNode)
            out, bt = self.freeze_output(g.output)
        else:
            out, bt = self.lookup(g.output)
        if self.inst.force and self.inst.batched and bt is not True:
            out, bt = self.expand(out, bt), True
        self.graph.output = out
        name = capture_names.name_of(g, capture_names.OUTPUT)
        if name is not None and not isinstance(out, ValueNode) and out.graph is not self.graph:
            capture_names.set_name(self.graph, capture_names.OUTPUT, name)
        if self.inst.force and self.inst.batched:
            assert bt is True
        self.inst.out_bt = bt if not self.inst.force else self.inst.out_bt

    def _branch_switches(self, g: FuncGraph) -> set[CNode]:
        """The ``switch`` calls whose only uses call them (``if``): batched at the call."""
        found = set()
        for node in toposort(g, self.mng):
            if isinstance(node, CNode) and node.graph is g and node.is_apply(structure.switch):
                users = self.mng.users.get(node, {})
                if users and all(isinstance(u, CNode) and i == 0 for u, i in users):
                    found.add(node)
        return found

    def call(self, node: CNode) -> tuple[Node, BT]:
        callee = node.inputs[0]
        args = node.inputs[1:]
        if isinstance(callee, CNode) and callee.graph is self.inst.graph and callee.is_apply(structure.switch) \
                and callee not in self.inst.env:
            return self.call_if(node, callee)
        static = self._static(callee)
        if static is not None:
            mapped = [self.lookup(a) for a in args]
            inst = self.b.instance(static, tuple(bt for _, bt in mapped), self.inst)
            return self.apply(ValueNode(inst.new, callee.loc), *(n for n, _ in mapped)), inst.out_bt
        if isinstance(callee, ValueNode):
            value = callee.value
            if isinstance(value, Primitive):
                return self.call_primitive(node, value, args)
            if isinstance(value, FuncGraph):
                mapped = [self.lookup(a) for a in args]
                inst = self.b.instance(value, tuple(bt for _, bt in mapped), self.inst)
                head = callee if inst.new is value else ValueNode(inst.new, callee.loc, callee.name)
                return self.apply(head, *(n for n, _ in mapped)), inst.out_bt
            if isinstance(value, MetaFunction):
                return self.call_meta(node, value, args)
        mapped = [self.lookup(a) for a in args]
        if isinstance(callee, CNode) and any(bt_any(b) for _, b in mapped):
            maker = callee.inputs[0]
            made = isinstance(maker, ValueNode) and isinstance(maker.value, Primitive) and \
                CALL_RULES.get(maker.value)
            if made:
                got = made(self, callee, mapped)
                if got is not None:
                    return got
        fn, fbt = self.lookup(callee)
        return self.call_value(fn, fbt, mapped, items=self._items_read(node))

    def _items_read(self, node: CNode) -> Optional[frozenset[int]]:
        """When every use of ``node`` reads a constant item of it (``node[k]``), those
        ``k``; else None."""
        users = self.b.manager(self.inst.graph).users.get(node)
        if not users:
            return None
        read = set()
        for user, index in users:
            if not (isinstance(user, CNode) and index == 1 and user.is_apply(structure.tuple_getitem)
                    and len(user.inputs) == 3 and isinstance(user.inputs[2], ValueNode)
                    and type(user.inputs[2].value) is int and user.inputs[2].value >= 0):
                return None
            read.add(user.inputs[2].value)
        return frozenset(read)

    def _static(self, node: Node) -> Optional[FuncGraph]:
        """The graph a meta call on a lambda made here (called with exact batch trees)."""
        p: Optional[_Instance] = self.inst
        while p is not None:
            made = p.static.get(node)
            if made is not None:
                return made
            p = p.parent
        return None

    def call_value(self, fn: Node, fbt: BT, mapped: list[tuple[Node, BT]],
                   graph: Optional[FuncGraph] = None, items: Optional[frozenset[int]] = None) -> tuple[Node, BT]:
        """Call a function value: as it is, batched-world, or batched at run time."""
        if fbt is True:
            return self.apply(fn, *(self.expand(n, b, graph) for n, b in mapped), graph=graph), True
        if not any(bt_any(b) for _, b in mapped):
            return self.apply(fn, *(n for n, _ in mapped), graph=graph), False
        if self.b.per_example_loops and all(isinstance(b, bool) for _, b in mapped):
            return self.scan_call(fn, mapped, graph, items), True
        axes = tuple(bt_axes(b) for _, b in mapped)
        batched = self.apply(bp.batch_fn, fn, self.ref(), attrs=Attrs({"in_axes": axes, "inner": True}),
                             graph=graph)
        return self.apply(batched, *(n for n, _ in mapped), graph=graph), True

    def scan_call(self, fn: Node, mapped: list[tuple[Node, BT]], graph: Optional[FuncGraph],
                  items: Optional[frozenset[int]] = None) -> Node:
        """``fn`` called example by example: ``scan((c, x) -> (c, fn(..x..)), 0, xs)[1]``, the
        batched arguments sliced by the scan, the others captured; every result leaf
        stacked on axis 0 (batched, as ``batch_fn``'s result).  With ``items``, only those
        items of the result are read (by constant index): the scan stacks them, ``None`` in place of the ones nobody reads (a pullback's environment of
        free-variable gradients, which is no tensor to stack)."""
        body = FuncGraph("per_example", self.loc)
        carry = body.add_parameter("carry")
        example = body.add_parameter("example")
        batched = [n for n, b in mapped if b is True]
        args: list[Node] = []
        sliced = 0
        for n, b in mapped:
            if b is not True:
                args.append(n)  # the same for every example: captured
            elif len(batched) == 1:
                args.append(example)
            else:
                args.append(CNode(body, [ValueNode(structure.tuple_getitem), example,
                                         ValueNode(sliced)], self.loc))
                sliced += 1
        out: Node = CNode(body, [fn, *args], self.loc)
        if items is not None:
            out = CNode(body, [ValueNode(structure.make_tuple), *(
                CNode(body, [ValueNode(structure.tuple_getitem), out, ValueNode(k)], self.loc)
                if k in items else ValueNode(None) for k in range(max(items) + 1))], self.loc)
        body.output = CNode(body, [ValueNode(structure.make_tuple), carry, out], self.loc)
        xs = batched[0] if len(batched) == 1 else self.apply(structure.make_tuple, *batched, graph=graph)
        result = self.apply(loops.scan, ValueNode(body, self.loc), ValueNode(0), xs, graph=graph)
        return self.apply(structure.tuple_getitem, result, ValueNode(1), graph=graph)

    # -- primitives ----------------------------------------------------------------------
    def call_primitive(self, node: CNode, prim: Primitive, args: tuple[Node, ...]) -> tuple[Node, BT]:
        mapped = [self.lookup(a) for a in args]
        if not any(bt_any(b) for _, b in mapped):
            return self.apply(prim, *(n for n, _ in mapped), attrs=node.attrs), False
        rule = RULES.get(prim)
        if rule is not None:
            got = rule(self, prim, mapped, node.attrs)
            if got is not None:
                return got
        return fallback(self, prim, mapped, node.attrs)

    # -- meta functions --------------------------------------------------------------
    def call_meta(self, node: CNode, m: MetaFunction, args: tuple[Node, ...]) -> tuple[Node, BT]:
        mapped = [self.lookup(a) for a in args]
        fn = args[0] if args else None
        if isinstance(fn, ValueNode) and isinstance(fn.value, Primitive) and \
                fn.value.max_args == fn.value.min_args and not fn.value.positional_attrs:
            fn = ValueNode(primitive_graph(fn.value), fn.loc)  # grad(sin): a graph calling it
        static = (isinstance(fn, ValueNode) and isinstance(fn.value, FuncGraph)
                  and all(isinstance(a, ValueNode) for a in args[1:])
                  and any(m is k for k in (*_META_DIFF, VMAP)))
        if static and self.inst.batched and any(m is k for k in _META_DIFF) and \
                _differentiates(fn.value):  # type: ignore[union-attr]
            return self._batched_first(m, fn.value, [a.value for a in args[1:]  # type: ignore[union-attr]
                                                     if isinstance(a, ValueNode)])
        if static and self.inst.batched and not _differentiates(fn.value):  # type: ignore[union-attr]
            # Differentiate (or batch) the known function first, then batch that graph
            # for each call's own arguments: no run-time batching left (compilable).
            made = expand_meta(m, fn.value, [a.value for a in args[1:]  # type: ignore[union-attr]
                                             if isinstance(a, ValueNode)], node.loc)
            self.inst.static[node] = made
            users = self.mng.users.get(node, {})
            if users and all(isinstance(u, CNode) and i == 0 for u, i in users):
                return ValueNode(None, node.loc), False
            return self.constant(ValueNode(made, node.loc))
        if not any(bt_any(b) for _, b in mapped):
            return self.apply(ValueNode(m), *(n for n, _ in mapped)), False
        if isinstance(fn, ValueNode) and isinstance(fn.value, FuncGraph) and \
                not any(bt_any(b) for _, b in mapped[1:]):
            plain = self.b.instance(fn.value, (False,) * len(fn.value.parameters), self.inst)
            if not plain.batched:  # it captures nothing batched: the meta call as it is
                head = fn if plain.new is fn.value else ValueNode(plain.new, fn.loc, fn.name)
                return self.apply(ValueNode(m), head, *(n for n, _ in mapped[1:])), False
        if not (isinstance(fn, ValueNode) and isinstance(fn.value, FuncGraph)) or \
                any(bt_any(b) for _, b in mapped[1:]):
            raise BatchingError(
                f"vmap: {m.name} of a function value that depends on the batch; write the "
                f"function as a lambda where {m.name} is called", node.loc)
        consts = []
        for a in args[1:]:
            if not isinstance(a, ValueNode):
                raise BatchingError(f"vmap: {m.name}'s other arguments must be constants "
                                    "inside vmap", a.loc)
            consts.append(a.value)
        made = expand_meta(m, fn.value, consts, node.loc)
        self.inst.static[node] = made
        users = self.mng.users.get(node, {})
        if users and all(isinstance(u, CNode) and i == 0 for u, i in users):
            # Only called: each call batches ``made`` for its own arguments' trees.
            return ValueNode(None, node.loc), False
        return self.constant(ValueNode(made, node.loc))

    def _batched_first(self, m: MetaFunction, fn: FuncGraph, consts: list[Any]) -> tuple[Node, BT]:
        """A derivative of a function that itself differentiates, inside vmap: batch
        first, then differentiate the batched function — the examples are independent,
        so ``grad`` of the sum over the batch is each example's gradient (every argument
        batched), and ``jvp`` of the batched function each example's derivative."""
        n = len(fn.parameters)
        batched = self.b.instance(fn, (True,) * n, self.inst)
        whole = ValueNode(batched.new, self.loc)
        if m is meta.jvp:
            return self.apply(ValueNode(meta.jvp), whole), True
        total = FuncGraph(f"Σ{fn.name}", self.loc)
        ps = [total.add_parameter(p.name or f"x{i}") for i, p in enumerate(fn.parameters)]
        total.output = CNode(total, [ValueNode(tensor.sum_), CNode(total, [whole, *ps], self.loc)],
                             self.loc)
        grads = self.apply(ValueNode(meta.grad), ValueNode(total), *(ValueNode(c) for c in consts))
        if m is meta.grad:
            return grads, True
        pair = FuncGraph(f"value_and_grad_{fn.name}", self.loc)
        qs = [pair.add_parameter(p.name or f"x{i}") for i, p in enumerate(fn.parameters)]
        pair.output = CNode(pair, [ValueNode(structure.make_tuple), CNode(pair, [whole, *qs], self.loc),
                                   CNode(pair, [grads, *qs], self.loc)], self.loc)
        return ValueNode(pair, self.loc), True

    # -- if ------------------------------------------------------------------------------
    def call_if(self, node: CNode, switch: CNode) -> tuple[Node, BT]:
        c_orig, a_orig, b_orig = switch.inputs[1:4]
        c, cbt = self.lookup(c_orig)
        extra = [self.lookup(a) for a in node.inputs[1:]]
        if not bt_any(cbt):
            (fa, abt), (fb, bbt) = self.lookup(a_orig), self.lookup(b_orig)
            sw = self.apply(structure.switch, c, fa, fb)
            if abt == bbt and not any(bt_any(b) for _, b in extra):
                return self.apply(sw, *(n for n, _ in extra)), abt
            # The branches differ in what they batch: both return every leaf batched.
            wa = self._branch_wrapper(fa, abt, extra)
            wb = self._branch_wrapper(fb, bbt, extra)
            sw = self.apply(structure.switch, c, ValueNode(wa), ValueNode(wb))
            return self.apply(sw), True
        if extra:
            raise BatchingError("vmap: a switch on a batched condition choosing functions "
                                "called with arguments", node.loc)
        graphs = [x.value if isinstance(x, ValueNode) and isinstance(x.value, FuncGraph) else None
                  for x in (a_orig, b_orig)]
        rec = [g is not None and self._recursive(g) for g in graphs]
        if not any(rec):
            ra = self._run_branch(a_orig)
            rb = self._run_branch(b_orig)
            return self.apply(bp.batch_select, c, ra, rb), True
        return self._batched_loop(node, c, a_orig, b_orig, graphs, rec)

    def _branch_wrapper(self, fn: Node, fbt: BT, extra: list[tuple[Node, BT]]) -> FuncGraph:
        w = FuncGraph("⊞branch", self.loc)
        params = [(w.add_parameter(f"a{i}"), bt) for i, (_, bt) in enumerate(extra)]
        # The wrapper is reached with the switch's extra arguments; those are passed on.
        out, bt = self.call_value(fn, fbt, [(p, b) for p, b in params], graph=w)
        w.output = self.expand(out, bt, graph=w)
        return w

    def _run_branch(self, branch: Node, graph: Optional[FuncGraph] = None) -> Node:
        fn, fbt = self.lookup(branch)
        out, bt = self.call_value(fn, fbt, [], graph=graph)
        return self.expand(out, bt, graph=graph)

    def _recursive(self, branch: FuncGraph) -> bool:
        """Whether running ``branch`` may come back to a graph being batched (a loop)."""
        reach: dict[FuncGraph, None] = {branch: None}
        queue = [branch]
        while queue:
            k = queue.pop()
            for used in self.mng.graphs_used.get(k, ()):
                if used not in reach:
                    reach[used] = None
                    queue.append(used)
        chain = set()
        p: Optional[_Instance] = self.inst
        while p is not None:
            chain.add(p.graph)
            p = p.parent
        if chain & set(reach):
            return True
        for k in reach:  # a cycle among the graphs it reaches
            seen = set()
            todo = list(self.mng.graphs_used.get(k, ()))
            while todo:
                h = todo.pop()
                if h is k:
                    return True
                if h in seen:
                    continue
                seen.add(h)
                todo.extend(self.mng.graphs_used.get(h, ()))
        return False

    def _tail_self_call(self, branch: Optional[FuncGraph]) -> bool:
        if branch is None or branch.parameters:
            return False
        out = branch.output
        return (isinstance(out, CNode) and isinstance(out.inputs[0], ValueNode)
                and out.inputs[0].value is self.inst.graph
                and len(out.inputs) - 1 == len(self.inst.graph.parameters))

    def _batched_loop(self, node: CNode, c: Node, a_orig: Node, b_orig: Node,
                      graphs: list[Optional[FuncGraph]], rec: list[bool]) -> tuple[Node, BT]:
        """``if`` on a batched condition where a branch recurses: go on while some
        example takes the recursive branch; examples already done keep their state."""
        side = 0 if rec[0] and not rec[1] else 1 if rec[1] and not rec[0] else None
        branch = graphs[side] if side is not None else None
        if side is not None and branch is not None and self._tail_self_call(branch):
            frozen = self.b.instance(branch, (), self.inst, freeze=("✓" if side == 0 else "✗", c))
            go = ValueNode(frozen.new)
            stop_branch = b_orig if side == 0 else a_orig
            stop = self._wrap(lambda w: self._run_branch(stop_branch, w))
            test = self.apply(reduce.any_ if side == 0 else reduce.all_, c)
            pair = (go, ValueNode(stop)) if side == 0 else (ValueNode(stop), go)
            sw = self.apply(structure.switch, test, *pair)
            return self.apply(sw), True
        # General recursion: only the branches some example takes run.
        both = self._wrap(lambda w: self.apply(bp.batch_select, c, self._run_branch(a_orig, w),
                                               self._run_branch(b_orig, w), graph=w))
        only_a = self._wrap(lambda w: self._run_branch(a_orig, w))
        only_b = self._wrap(lambda w: self._run_branch(b_orig, w))
        some = self._wrap(lambda w: self.apply(self.apply(
            structure.switch, self.apply(reduce.all_, c, graph=w), ValueNode(only_a), ValueNode(both),
            graph=w), graph=w))
        sw = self.apply(structure.switch, self.apply(reduce.any_, c), ValueNode(some), ValueNode(only_b))
        return self.apply(sw), True

    def _wrap(self, body: Callable[[FuncGraph], Node]) -> FuncGraph:
        w = FuncGraph("⊞" + self.inst.graph.name + "_if", self.loc)
        w.output = body(w)
        return w

    def freeze_output(self, out_node: CNode) -> tuple[Node, BT]:
        """The frozen tail call of a loop branch: the arguments are selected against
        the loop's current parameters, so examples already done keep their state."""
        assert self.inst.freeze is not None
        side, c = self.inst.freeze
        loop = self.inst.parent
        assert loop is not None
        args = []
        for arg, param in zip(out_node.inputs[1:], loop.graph.parameters):
            new, nbt = self.lookup(arg)
            old, obt = loop.env[param]
            new, old = self.expand(new, nbt), self.expand(old, obt)
            args.append(self.apply(bp.batch_select, c, *((new, old) if side == "✓" else (old, new))))
        inst = self.b.instance(loop.graph, (True,) * len(args), self.inst)
        return self.apply(ValueNode(inst.new), *args), inst.out_bt


def _follow_names(old: CNode, new: Node) -> None:
    """A copied call keeps the names of its captured uses (GradEnv keys: a gradient
    graph built from the original reads the entries a transform of the copy writes)."""
    if not isinstance(new, CNode) or len(new.inputs) != len(old.inputs):
        return
    for i in range(len(old.inputs)):
        name = capture_names.name_of(old, i)
        if name is not None:
            inp = new.inputs[i]
            if not isinstance(inp, ValueNode) and inp.graph is not new.graph:
                capture_names.set_name(new, i, name)


# -- meta functions inside a batched body ------------------------------------------------
def expand_meta(m: MetaFunction, fn: FuncGraph, consts: list[Any], loc: Any) -> FuncGraph:
    """``m(fn, consts...)`` as a graph of the unbatched world with ``fn``'s free
    variables (then batched like any closure): differentiate first, batch after."""
    if m in _META_DIFF and _differentiates(fn):
        # A second derivative through a captured batched value: the body batches the
        # function first (_Body._batched_first); this entry is for known functions only.
        raise BatchingError(f"vmap: {m.name} of a function that itself differentiates needs "
                            "the batched body's rule", loc)
    if m is meta.grad or m is meta.value_and_grad:
        check_differentiable_graph(fn)
        wrt, multi = normalize_wrt(consts, len(fn.parameters))
        made = FuncGraph(f"∇{fn.name}", loc)
        xs = [made.add_parameter(p.name or f"x{i}", p.loc) for i, p in enumerate(fn.parameters)]
        made.output = build_grad_body(made, ValueNode(j_graph(fn)), xs, wrt, multi,
                                      m is meta.value_and_grad, loc)
        return made
    if m is meta.jvp:
        check_differentiable_graph(fn)
        return _jvp_of(fn, loc)
    if m is VMAP:
        in_axes = consts[0] if consts else 0
        out_axes = consts[1] if len(consts) > 1 else 0
        return Batcher().entry(fn, in_axes, out_axes, loc)
    raise BatchingError(f"vmap: {m.name} of a lambda that captures batched values is not "
                        "supported inside vmap", loc)


def _differentiates(graph: FuncGraph) -> bool:
    """Whether code in ``graph``'s reach calls a differentiation, or carries its own
    derivative (a ``custom_vjp``/``custom_jvp`` call: batched first, the batched rule is
    the one differentiated — JAX's order for ``vmap(grad(f))`` of a custom ``f``)."""
    seen = {graph}
    todo = [graph]
    mng = Batcher.manager(graph)
    while todo:
        g = todo.pop()
        for node in toposort(g, mng):
            if isinstance(node, CNode):
                for inp in node.inputs:
                    if isinstance(inp, ValueNode) and (
                            any(inp.value is d for d in (*_META_DIFF, gradient.J, *CALL_RULES))
                            or isinstance(inp.value, MetaFunction) and inp.value.name.startswith("J(")):
                        return True
        for used in mng.graphs_used.get(g, ()):
            if used not in seen:
                seen.add(used)
                todo.append(used)
    return False


def _jvp_of(fn: FuncGraph, loc: Any) -> FuncGraph:
    """``jvp(fn)`` for a known graph: :func:`anfir.autodiff.forward.build_jvp_graph`'s
    inner closure with ``fn`` in place of its parameter."""
    n = len(fn.parameters)
    f = ValueNode(fn, loc)
    make_tuple = ValueNode(structure.make_tuple)
    inner = FuncGraph(f"jvp▸{fn.name}", loc)
    xs = [inner.add_parameter(f"x{i}") for i in range(n)]
    ts = [inner.add_parameter(f"t{i}") for i in range(n)]
    value = call_node(inner, f, *xs)
    pairing = FuncGraph("jvp_pairing", loc)
    u = pairing.add_parameter("u")
    scalarized = FuncGraph("jvp_scalarized", loc)
    zs = [scalarized.add_parameter(f"z{i}") for i in range(n)]
    scalarized.output = CNode(scalarized, [ValueNode(gradient.tangent_dot),
                                           call_node(scalarized, ValueNode(fn, loc), *zs), u])
    indices = [ValueNode(i) for i in range(n)] if n > 1 else []
    pullback = CNode(pairing, [ValueNode(meta.grad), ValueNode(scalarized), *indices])
    dxs = call_node(pairing, pullback, *xs)
    tangents: Node = ts[0] if n == 1 else CNode(pairing, [make_tuple, *ts])
    pairing.output = CNode(pairing, [ValueNode(gradient.tangent_dot), dxs, tangents])
    derivative = CNode(inner, [ValueNode(meta.grad), ValueNode(pairing)])
    seed = CNode(inner, [ValueNode(structure.zeros_like), value])
    inner.output = CNode(inner, [make_tuple, value, call_node(inner, derivative, seed)])
    return inner


VMAP: MetaFunction = meta.vmap


# -- run time ----------------------------------------------------------------------------
_entries: dict[tuple, FuncGraph] = {}
_keep: list[Any] = []


def _axes_key(a: Any) -> Any:
    return tuple(_axes_key(x) for x in a) if isinstance(a, (tuple, list)) else a


def entry_graph(graph: FuncGraph, in_axes: Any, out_axes: Any, inner: bool = False) -> FuncGraph:
    """The batched entry of ``graph`` (cached: a graph is compiled once by the evaluator)."""
    key = (id(graph), _axes_key(in_axes), _axes_key(out_axes), inner)
    made = _entries.get(key)
    if made is None:
        made = Batcher().entry(graph, in_axes, out_axes, inner=inner)
        _entries[key] = made
        _keep.append(graph)
    return made


def _primitive_graph(prim: Primitive) -> FuncGraph:
    if prim.max_args is None or prim.min_args != prim.max_args or prim.positional_attrs:
        raise BatchingError(f"vmap of {prim.name} needs a function of fixed arity; wrap it in "
                            "a lambda")
    g = FuncGraph(prim.name)
    xs = [g.add_parameter(f"x{i}") for i in range(prim.min_args)]
    g.output = CNode(g, [ValueNode(prim), *xs])
    return g


_prim_graphs: dict[int, FuncGraph] = {}


def primitive_graph(prim: Primitive) -> FuncGraph:
    """``(x...) -> prim(x...)`` (cached), so a primitive is batched like any function."""
    g = _prim_graphs.get(id(prim))
    if g is None:
        g = _prim_graphs[id(prim)] = _primitive_graph(prim)
    return g


def batch_value(fn: Any, in_axes: Any = 0, out_axes: Any = 0, inner: bool = False,
                ref: Any = None) -> Any:
    """``vmap`` of a run-time function value (what ``batch_fn`` computes); ``inner``: for
    a call in a batched body, whose batched values ``ref`` the result takes first."""
    made, bound = _batch_value(fn, in_axes, out_axes, inner)
    if inner:
        bound = (ref, *bound)
    return Partial(made, bound) if bound else made


def _batch_value(fn: Any, in_axes: Any, out_axes: Any, inner: bool) -> tuple[Any, tuple]:
    if isinstance(fn, Closure):
        made = entry_graph(fn.graph, in_axes, out_axes, inner)
        before = manage(fn.graph).free_variables_total(fn.graph)
        after = manage(made).free_variables_total(made)
        if before == after:
            return Closure(made, fn.env), ()
        by_node = dict(zip(before, fn.env))
        return Closure(made, tuple(by_node[n] for n in after)), ()
    if isinstance(fn, FuncGraph):
        return entry_graph(fn, in_axes, out_axes, inner), ()
    if isinstance(fn, Primitive):
        return entry_graph(primitive_graph(fn), in_axes, out_axes, inner), ()
    if isinstance(fn, Partial):
        n = len(fn.args)
        if isinstance(in_axes, (tuple, list)):
            inner_axes: Any = (None,) * n + tuple(in_axes)
        else:
            inner_axes = (None,) * n + (in_axes,) * arity_of(fn)
        made, bound = _batch_value(fn.fn, inner_axes, out_axes, inner)
        return made, (*bound, *fn.args)
    if isinstance(fn, MetaFunction):
        raise BatchingError(f"vmap of the meta function {fn.name} itself; vmap a function it makes")
    raise BatchingError(f"vmap needs a function, not {type(fn).__name__}")


def generate_vmap(args: tuple) -> FuncGraph:
    """The graph for a run-time call ``vmap(f, in_axes, out_axes)``."""
    if not 1 <= len(args) <= 3:
        raise BatchingError(f"vmap takes a function, in_axes and out_axes, got {len(args)} arguments")
    in_axes = args[1] if len(args) > 1 else 0
    out_axes = args[2] if len(args) > 2 else 0
    _check_tree(in_axes, "in_axes")
    check_out_axes(out_axes)
    maker = FuncGraph("vmap")
    f = maker.add_parameter("f")
    for i in range(len(args) - 1):
        maker.add_parameter(f"a{i}")
    maker.output = CNode(maker, [ValueNode(bp.batch_fn), f],
                         attrs=bp.batch_fn.canonical_attrs({"in_axes": _axes_key(in_axes),
                                                            "out_axes": _axes_key(out_axes)}))
    return maker


def vmap_api(graph: FuncGraph, in_axes: Any = 0, out_axes: Any = 0) -> FuncGraph:
    """``anfir.vmap``: a new FuncGraph computing ``graph`` over a batch."""
    made = Batcher().entry(graph, _axes_key(in_axes), _axes_key(out_axes), graph.loc)
    made.name = f"vmap_{graph.name}"
    for new, old in zip(made.parameters, graph.parameters):
        new.annotation = None
    return made


# -- rules -----------------------------------------------------------------------------------
Rule = Callable[[_Body, Primitive, list[tuple[Node, BT]], Attrs], Optional[tuple[Node, BT]]]


def fallback(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs) -> tuple[Node, BT]:
    """The primitive applied to each example (``batch_loop``), results stacked."""
    axes = tuple(bt_axes(bt) for _, bt in mapped)
    loop_attrs = Attrs({"batched": axes, "op_attrs": tuple((k, v) for k, v in attrs.items())})
    return b.apply(bp.batch_loop, ValueNode(prim), *(n for n, _ in mapped), b.ref(), attrs=loop_attrs), True


def _is_scalar_constant(node: Node) -> bool:
    return isinstance(node, ValueNode) and (isinstance(node.value, (bool, int, float, complex))
                                            or (isinstance(node.value, np.ndarray) and node.value.ndim == 0))


def elementwise_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                     ) -> Optional[tuple[Node, BT]]:
    """numpy broadcasting: each batched operand reshaped so that its per-example axes
    line up with the others' (only when some operand is not a scalar constant)."""
    if any(isinstance(bt, tuple) for _, bt in mapped):
        return None
    nodes = [n for n, _ in mapped]
    flags = tuple(bool(bt) for _, bt in mapped)
    others_scalar = sum(1 for n, f in zip(nodes, flags) if not f and not _is_scalar_constant(n))
    batched_nodes = {id(n) for n, f in zip(nodes, flags) if f}
    if len(nodes) == 1 or (len(batched_nodes) == 1 and others_scalar == 0):
        # One batched value (maybe used twice, x * x) with scalar constants: numpy's
        # broadcasting already lines them up.
        return b.apply(prim, *nodes, attrs=attrs), True
    if len(nodes) > 4:
        return None
    new = []
    for i, (n, f) in enumerate(zip(nodes, flags)):
        if not f:
            new.append(n)
            continue
        rest = [m for j, m in enumerate(nodes) if j != i]
        rest_flags = tuple(1 if x else 0 for j, x in enumerate(flags) if j != i)
        new.append(b.apply(bp.batch_reshape, n, *rest,
                           attrs=Attrs({"how": "align", "batched": (1,) + rest_flags})))
    return b.apply(prim, *new, attrs=attrs), True


def first_operand_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                       ) -> Optional[tuple[Node, BT]]:
    """Operations whose other operands only give a type or a constant (cast, zeros_like):
    batched as their first operand is."""
    if any(bt_any(bt) for _, bt in mapped[1:]) and prim is not gradient.cast_like:
        return None
    return b.apply(prim, *(n for n, _ in mapped), attrs=attrs), mapped[0][1]


def _shift(axis: Any) -> Any:
    if axis is None:
        return None
    if isinstance(axis, tuple):
        return tuple(_shift(a) for a in axis)
    return axis + 1 if axis >= 0 else axis


def reduction_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                   ) -> Optional[tuple[Node, BT]]:
    """``axis=`` moved past the batch axis; ``axis=None`` reduces each example's elements."""
    if len(mapped) != 1 or mapped[0][1] is not True:
        return None
    x = mapped[0][0]
    full = prim.bound_attrs(attrs)
    axis = full.get("axis")
    if axis is None:
        if prim is reduce.norm and full.get("ord") is not None:
            return None
        flat = b.apply(bp.batch_reshape, x, attrs=Attrs({"how": "flat"}))
        out = b.apply(prim, flat, attrs=prim.canonical_attrs({**dict(attrs), "axis": 1, "keepdims": False}))
        if full.get("keepdims"):
            out = b.apply(bp.batch_reshape, out, x, attrs=Attrs({"how": "keepdims", "batched": (1, 1)}))
        return out, True
    return b.apply(prim, x, attrs=prim.canonical_attrs({**dict(attrs), "axis": _shift(axis)})), True


def axis_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
              ) -> Optional[tuple[Node, BT]]:
    """One batched data operand, the others unbatched: ``axis`` moved past the batch axis."""
    full = prim.bound_attrs(attrs)
    axis = full.get("axis")
    if axis is None or any(bt_any(bt) for _, bt in mapped[1:]) or mapped[0][1] is not True:
        return None
    return b.apply(prim, *(n for n, _ in mapped),
                   attrs=prim.canonical_attrs({**dict(attrs), "axis": _shift(axis)})), True


def all_batched_axis_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                          ) -> Optional[tuple[Node, BT]]:
    """Operands of one rank (a tuple to concat, indices like data): all batched, axis moved."""
    full = prim.bound_attrs(attrs)
    axis = full.get("axis")
    if axis is None:
        return None
    nodes = [b.expand(n, bt) for n, bt in mapped]
    return b.apply(prim, *nodes, attrs=prim.canonical_attrs({**dict(attrs), "axis": _shift(axis)})), True


def slice_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
               ) -> Optional[tuple[Node, BT]]:
    if len(mapped) != 1 or mapped[0][1] is not True:
        return None
    full = prim.bound_attrs(attrs)
    starts = full.get("starts")
    if starts is None:
        return None
    starts_t = starts if isinstance(starts, tuple) else (starts,)
    axes = full.get("axes")
    if axes is None:
        axes = tuple(range(len(starts_t)))
    elif not isinstance(axes, tuple):
        axes = (axes,)
    return b.apply(prim, mapped[0][0],
                   attrs=prim.canonical_attrs({**dict(attrs), "axes": _shift(axes)})), True


def unary_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
               ) -> Optional[tuple[Node, BT]]:
    """Operations on the trailing axes only (tril, one_hot, ...): applied as they are."""
    if len(mapped) != 1 or mapped[0][1] is not True:
        return None
    return b.apply(prim, mapped[0][0], attrs=attrs), True


def same_bt_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                 ) -> Optional[tuple[Node, BT]]:
    """identity, stop_gradient, zeros_like...: the value keeps its batch tree."""
    if len(mapped) != 1:
        return None
    return b.apply(prim, mapped[0][0], attrs=attrs), mapped[0][1]


def all_expanded_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                      ) -> Optional[tuple[Node, BT]]:
    """gadd, env ops: every operand batched, then the operation as it is."""
    return b.apply(prim, *(b.expand(n, bt) if not _is_key(n) else n for n, bt in mapped),
                   attrs=attrs), True


def _is_key(node: Node) -> bool:
    return isinstance(node, ValueNode) and type(node.value).__name__ == "SymbolicKey"


def make_tuple_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                    ) -> Optional[tuple[Node, BT]]:
    return b.apply(prim, *(n for n, _ in mapped)), _norm(tuple(bt for _, bt in mapped))


def getitem_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                 ) -> Optional[tuple[Node, BT]]:
    (t, tbt), (i, ibt) = mapped
    if ibt:
        return None
    if isinstance(tbt, tuple):
        if isinstance(i, ValueNode) and isinstance(i.value, int) and -len(tbt) <= i.value < len(tbt):
            return b.apply(prim, t, i), tbt[i.value]
        t, tbt = b.expand(t, tbt), True
    return b.apply(prim, t, i), True


def switch_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                ) -> Optional[tuple[Node, BT]]:
    (c, cbt), (x, xbt), (y, ybt) = mapped
    if not bt_any(cbt):
        if xbt == ybt:
            return b.apply(prim, c, x, y), xbt
        return b.apply(prim, c, b.expand(x, xbt), b.expand(y, ybt)), True
    return b.apply(bp.batch_select, c, b.expand(x, xbt), b.expand(y, ybt)), True


def partial_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                 ) -> Optional[tuple[Node, BT]]:
    (f, fbt), rest = mapped[0], mapped[1:]
    if fbt is not True:
        f = b.apply(bp.batch_fn, f, b.ref(), attrs=Attrs({"inner": True}))  # every argument batched
    return b.apply(prim, f, *(b.expand(n, bt) for n, bt in rest)), True


def j_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
           ) -> Optional[tuple[Node, BT]]:
    """``J`` of a captured batched value (data: J is the identity on it) keeps its tree."""
    return b.apply(prim, mapped[0][0]), mapped[0][1]


def len_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
             ) -> Optional[tuple[Node, BT]]:
    t, tbt = mapped[0]
    if isinstance(tbt, tuple):
        return b.apply(prim, t), False
    return b.apply(bp.batch_shape, t, attrs=Attrs({"what": "len"})), False


def shape_of_rule(what: str) -> Rule:
    def rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
             ) -> Optional[tuple[Node, BT]]:
        if mapped[0][1] is not True:
            return None
        return b.apply(bp.batch_shape, mapped[0][0], attrs=Attrs({"what": what})), False

    return rule


def reshape_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                 ) -> Optional[tuple[Node, BT]]:
    (x, xbt), (s, sbt) = mapped
    if sbt or xbt is not True:
        return None
    return b.apply(bp.batch_reshape, x, s, attrs=Attrs({"how": "shape", "batched": (1, 0)})), True


def transpose_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                   ) -> Optional[tuple[Node, BT]]:
    if len(mapped) != 2 or mapped[0][1] is not True or mapped[1][1]:
        return None
    perm = mapped[1][0]
    if not (isinstance(perm, ValueNode) and isinstance(perm.value, tuple)
            and all(isinstance(p, int) and p >= 0 for p in perm.value)):
        return None
    return b.apply(prim, mapped[0][0], ValueNode((0,) + tuple(p + 1 for p in perm.value))), True


def _mm(b: _Body, a: Node, ab: bool, y: Node, yb: bool) -> tuple[Node, Node]:
    a2 = b.apply(bp.batch_reshape, a, y, attrs=Attrs({"how": "mm_a", "batched": (int(ab), int(yb))}))
    y2 = b.apply(bp.batch_reshape, y, a, attrs=Attrs({"how": "mm_b", "batched": (int(yb), int(ab))}))
    return a2, y2


def matmul_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                ) -> Optional[tuple[Node, BT]]:
    """Each operand promoted to a matrix and lined up with the other's batch axes, one
    plain matmul, the promoted axes dropped (all reshapes: differentiable)."""
    (a, abt), (y, ybt) = mapped
    if isinstance(abt, tuple) or isinstance(ybt, tuple):
        return None
    a2, y2 = _mm(b, a, bool(abt), y, bool(ybt))
    out2 = b.apply(prim, a2, y2)
    return b.apply(bp.batch_reshape, out2, a, y,
                   attrs=Attrs({"how": "mm_out", "batched": (int(bool(abt)), int(bool(ybt)))})), True


def matmul_dx_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                   ) -> Optional[tuple[Node, BT]]:
    (dout, dbt), (y, ybt), (x, xbt) = mapped
    if any(isinstance(t, tuple) for t in (dbt, ybt, xbt)):
        return None
    x, dout = b.expand(x, xbt), b.expand(dout, dbt)
    x2, y2 = _mm(b, x, True, y, bool(ybt))
    d2 = b.apply(bp.batch_reshape, dout, x, y, attrs=Attrs({"how": "mm_dout", "batched": (1, int(bool(ybt)))}))
    r = b.apply(prim, d2, y2, x2)
    return b.apply(gradient.reshape_like, r, x), True


def matmul_dy_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                   ) -> Optional[tuple[Node, BT]]:
    (x, xbt), (dout, dbt), (y, ybt) = mapped
    if any(isinstance(t, tuple) for t in (dbt, ybt, xbt)):
        return None
    y, dout = b.expand(y, ybt), b.expand(dout, dbt)
    x2, y2 = _mm(b, x, bool(xbt), y, True)
    d2 = b.apply(bp.batch_reshape, dout, x, y, attrs=Attrs({"how": "mm_dout", "batched": (int(bool(xbt)), 1)}))
    r = b.apply(prim, x2, d2, y2)
    return b.apply(gradient.reshape_like, r, y), True


def _array_bts(mapped: list[tuple[Node, BT]]) -> bool:
    return not any(isinstance(bt, tuple) for _, bt in mapped)


def sum_to_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                ) -> Optional[tuple[Node, BT]]:
    """sum_to(g, x) per example: x lined up with g, then summed where x has ones."""
    if not _array_bts(mapped):
        return None
    (g, gbt), (x, xbt) = mapped
    g, x = b.expand(g, gbt), b.expand(x, xbt)
    x2 = b.apply(bp.batch_reshape, x, g, attrs=Attrs({"how": "align", "batched": (1, 1)}))
    return b.apply(gradient.reshape_like, b.apply(prim, g, x2), x), True


def broadcast_like_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                        ) -> Optional[tuple[Node, BT]]:
    if not _array_bts(mapped):
        return None
    (g, gbt), (x, xbt) = mapped
    g, x = b.expand(g, gbt), b.expand(x, xbt)
    g2 = b.apply(bp.batch_reshape, g, x, attrs=Attrs({"how": "align", "batched": (1, 1)}))
    return b.apply(prim, g2, x), True


def reshape_like_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                      ) -> Optional[tuple[Node, BT]]:
    if not _array_bts(mapped):
        return None
    (g, gbt), (x, xbt) = mapped
    return b.apply(prim, b.expand(g, gbt), b.expand(x, xbt)), True


def unreduce_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                  ) -> Optional[tuple[Node, BT]]:
    if not _array_bts(mapped[:2]) or any(bt_any(bt) for _, bt in mapped[2:]):
        return None
    (g, gbt), (x, xbt) = mapped[:2]
    rest = [n for n, _ in mapped[2:]]
    if not all(isinstance(n, ValueNode) for n in rest):
        return None
    axis = rest[0].value  # type: ignore[attr-defined]
    keepdims = rest[1].value if len(rest) > 1 else False  # type: ignore[attr-defined]
    g, x = b.expand(g, gbt), b.expand(x, xbt)
    if axis is None and not keepdims:
        g = b.apply(bp.batch_reshape, g, x, attrs=Attrs({"how": "keepdims", "batched": (1, 1)}))
        return b.apply(prim, g, x, ValueNode(None), ValueNode(True)), True
    return b.apply(prim, g, x, ValueNode(_shift(axis)), ValueNode(keepdims)), True


def grad_seed_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                   ) -> Optional[tuple[Node, BT]]:
    if mapped[0][1] is not True:
        return None
    return b.apply(tensor.ones_like, mapped[0][0]), True


def clip_grad_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                   ) -> Optional[tuple[Node, BT]]:
    if any(bt_any(bt) for _, bt in mapped[2:]) or not _array_bts(mapped[:2]):
        return None
    (g, gbt), (x, xbt) = mapped[:2]
    g, x = b.expand(g, gbt), b.expand(x, xbt)
    g2 = b.apply(bp.batch_reshape, g, x, attrs=Attrs({"how": "align", "batched": (1, 1)}))
    x2 = b.apply(bp.batch_reshape, x, g, attrs=Attrs({"how": "align", "batched": (1, 1)}))
    return b.apply(prim, g2, x2, *(n for n, _ in mapped[2:])), True


def einsum_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                ) -> Optional[tuple[Node, BT]]:
    """A new letter for the batch on every batched operand and on the output."""
    (spec_node, sbt), operands = mapped[0], mapped[1:]
    if sbt or not isinstance(spec_node, ValueNode) or not isinstance(spec_node.value, str):
        return None
    spec = spec_node.value.replace(" ", "")
    if "->" not in spec or "." in spec or not _array_bts(operands):
        return None
    lhs, rhs = spec.split("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        return None
    letter = next((ch for ch in "zyxwvutsrqponmlkjihgfedcbaZYXWVUTSRQPONMLKJIHGFEDCBA" if ch not in spec), None)
    if letter is None:
        return None
    new_terms = [letter + t if bt else t for t, (_, bt) in zip(terms, operands)]
    new_spec = ",".join(new_terms) + "->" + letter + rhs
    return b.apply(prim, ValueNode(new_spec), *(n for n, _ in operands)), True


def expanded_unary_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                        ) -> Optional[tuple[Node, BT]]:
    """Operations on any number of leading axes (attention): every operand batched."""
    if not _array_bts(mapped) or any(isinstance(n, ValueNode) and n.value is None for n, _ in mapped):
        return None
    return b.apply(prim, *(b.expand(n, bt) for n, bt in mapped), attrs=attrs), True


def tangent_dot_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                     ) -> Optional[tuple[Node, BT]]:
    (x, xbt), (y, ybt) = mapped
    return b.apply(bp.batch_tangent_dot, b.expand(x, xbt), b.expand(y, ybt)), True


def tangent_scale_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
                       ) -> Optional[tuple[Node, BT]]:
    (x, xbt), (s, sbt) = mapped
    if not sbt:
        return b.apply(prim, x, s), xbt
    return b.apply(bp.batch_tangent_scale, b.expand(x, xbt), s), True


def mse_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
             ) -> Optional[tuple[Node, BT]]:
    if prim.bound_attrs(attrs).get("reduction") != "none":
        return None
    return elementwise_rule(b, prim, mapped, attrs)


def fold_rule(b: _Body, prim: Primitive, mapped: list[tuple[Node, BT]], attrs: Attrs
              ) -> Optional[tuple[Node, BT]]:
    """Operations on a leading axis of independent samples (conv, pooling, per-sample
    norms): the batch folded into that axis, the other operands unbatched."""
    (x, xbt), rest = mapped[0], mapped[1:]
    if xbt is not True or any(bt_any(bt) for _, bt in rest):
        return None
    folded = b.apply(bp.batch_reshape, x, attrs=Attrs({"how": "fold"}))
    out = b.apply(prim, folded, *(n for n, _ in rest), attrs=attrs)
    return b.apply(bp.batch_reshape, out, x, attrs=Attrs({"how": "unfold", "batched": (1, 1)})), True


def _family(prims: list[Primitive], rule: Rule) -> dict[Primitive, Rule]:
    return {p: rule for p in prims}


def _of(module: Any, family: str) -> list[Primitive]:
    return [p for p in PRIMITIVES.values() if p.family == family]


RULES: dict[Primitive, Rule] = {
    **_family(_of(arith, "arithmetic"), elementwise_rule),
    **_family(_of(arith, "comparison"), elementwise_rule),
    **_family(_of(elementwise, "elementwise"), elementwise_rule),
    **_family(_of(elementwise, "logic"), elementwise_rule),
    **_family(_of(complexes, "complex"), elementwise_rule),
    tensor.where: elementwise_rule,
    tensor.cast: first_operand_rule,
    gradient.cast_like: first_operand_rule,
    structure.zeros_like: same_bt_rule,
    tensor.ones_like: same_bt_rule,
    structure.identity: same_bt_rule,
    structure.stop_gradient: same_bt_rule,
    structure.make_tuple: make_tuple_rule,
    structure.tuple_getitem: getitem_rule,
    structure.len_: len_rule,
    structure.switch: switch_rule,
    structure.partial: partial_rule,
    gradient.J: j_rule,
    gradient.gadd: all_expanded_rule,
    gradient.tuple_setitem: lambda b, prim, mapped, attrs: None if bt_any(mapped[1][1]) else (
        b.apply(prim, b.expand(*mapped[0]), mapped[1][0], b.expand(*mapped[2])), True),
    gradient.env_setitem: all_expanded_rule,
    gradient.env_getitem: all_expanded_rule,
    gradient.sum_to: sum_to_rule,
    gradient.broadcast_like: broadcast_like_rule,
    gradient.reshape_like: reshape_like_rule,
    gradient.unreduce: unreduce_rule,
    gradient.matmul_dx: matmul_dx_rule,
    gradient.matmul_dy: matmul_dy_rule,
    gradient.grad_seed: grad_seed_rule,
    # grad_arg_check(x, g) only reads x's dtype, the same for every example: g as it is.
    gradient.grad_arg_check: lambda b, prim, mapped, attrs: (
        b.apply(prim, mapped[0][0], mapped[1][0]), mapped[1][1]),
    gradient.clip_grad: clip_grad_rule,
    gradient.size: shape_of_rule("size"),
    tensor.shape: shape_of_rule("shape"),
    shaping.rank: shape_of_rule("rank"),
    tensor.matmul: matmul_rule,
    tensor.reshape: reshape_rule,
    tensor.transpose: transpose_rule,
    tensor.sum_: reduction_rule,
    tensor.mean: reduction_rule,
    **_family([p for p in _of(reduce, "reduction") if "keepdims" in p.attrs], reduction_rule),
    **_family([reduce.cumsum, reduce.cumprod, nn.softmax, nn.log_softmax, nn.tail_mean,
               shaping.flip, shaping.roll, shaping.squeeze, shaping.unsqueeze, shaping.split,
               indexing.gather, indexing.topk, nn.layer_norm, nn.rms_norm], axis_rule),
    **_family([shaping.concat, shaping.stack, indexing.gather_elements, indexing.scatter_add],
              all_batched_axis_rule),
    shaping.slice_: slice_rule,
    **_family([shaping.tril, shaping.triu, indexing.one_hot], unary_rule),
    nn.einsum: einsum_rule,
    nn.attention: expanded_unary_rule,
    nn.mse_loss: mse_rule,
    shaping.flatten: lambda b, prim, mapped, attrs: None if len(mapped) != 1 or mapped[0][1] is not True \
        else (b.apply(prim, mapped[0][0], attrs=prim.canonical_attrs({
            k: _shift(v) for k, v in prim.bound_attrs(attrs).items()})), True),
    **_family([conv.conv, conv.conv_transpose, conv.max_pool, conv.avg_pool, conv.global_avg_pool,
               conv.global_max_pool, nn.instance_norm, nn.group_norm], fold_rule),
    gradient.tangent_dot: tangent_dot_rule,
    gradient.tangent_scale: tangent_scale_rule,
}
"""The batching rule of each primitive (JAX's ``primitive_batchers``), keyed by the
object.  A rule returns None where it does not apply (then the fallback runs)."""

NO_RULE_REASON = "no vectorized rule: the fallback loop (batch_loop) runs it per example"

FALLBACK_ONLY: frozenset[Primitive] = frozenset()
"""Filled below: the primitives that always go through the fallback loop."""


def _fallback_only() -> frozenset[Primitive]:
    return frozenset(p for p in PRIMITIVES.values() if p not in RULES)


FALLBACK_ONLY = _fallback_only()


# -- calls of the function a primitive makes ------------------------------------------------
def custom_rule_call(body: "_Body", made: CNode, mapped: list[tuple[Node, BT]]) -> Optional[tuple[Node, BT]]:
    """``custom_vjp(f, fwd, bwd)(x...)`` (or ``custom_jvp(f, rule)(x...)``) on batched
    ``x``: ``custom_vjp(B(f), B(fwd), B(bwd))(B(x)...)``, as JAX batches a custom rule —
    the function and the user's rules are each batched (every argument batched, every
    result leaf batched: the residuals fwd returns and bwd takes, the cotangents), so a
    derivative of the batched call still uses the user's rule, per example.  Unbatched
    arguments are broadcast first (their cotangent is then the sum over the examples,
    by the broadcast's own derivative).  None (batched at run time, as any function
    value) when a rule is not a known graph."""
    graphs = made.inputs[1:]
    if not graphs or not all(isinstance(g, ValueNode) and isinstance(g.value, FuncGraph)
                             for g in graphs):
        return None
    batched = []
    for g in graphs:
        assert isinstance(g, ValueNode) and isinstance(g.value, FuncGraph)
        graph = g.value
        inst = body.b.instance(graph, (True,) * len(graph.parameters), body.inst)
        batched.append(ValueNode(inst.new, g.loc, g.name))
    rule = body.apply(made.inputs[0], *batched, attrs=made.attrs)
    return body.apply(rule, *(body.expand(n, b) for n, b in mapped)), True


CallRule = Callable[["_Body", CNode, list[tuple[Node, BT]]], Optional[tuple[Node, BT]]]
"""``rule(body, made, mapped)``: the batched call ``made(x...)`` of the function value a
primitive call ``made`` computes, on the batched arguments ``mapped``."""

CALL_RULES: dict[Primitive, CallRule] = {
    loops.custom_vjp: custom_rule_call,
    loops.custom_jvp: custom_rule_call,
}
"""Primitives whose result is a function, by the primitive object: how a call of that
function on batched values is batched (the others: :meth:`_Body.call_value`)."""

__all__ = ["BT", "Batcher", "BatchingError", "CALL_RULES", "CallRule", "FALLBACK_ONLY", "RULES", "batch_value", "bt_any",
           "bt_axes", "custom_rule_call", "entry_graph", "expand_meta", "fallback", "generate_vmap", "normalize_in_axes",
           "vmap_api"]

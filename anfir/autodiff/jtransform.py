"""The J transform: reverse-mode AD as a program transformation.

``J(g)`` is a graph ``▸g`` with ``g``'s parameters that returns
``(value, ◂g)``, where the closure ``◂g(dout)`` returns
``(env, dx1, ..., dxn)``: ``env`` (a :class:`~anfir.runtime_values.GradEnv`) holds the
gradients of the values ``g`` captures, one entry per name of a captured use
(:meth:`_ScopeTransform.captures`, :func:`use_key`), the ``dx`` the gradients
of the inputs (Pearlmutter–Siskind; Myia's ``grad.py``, MindSpore's DFunctor).

How each CNode ``y = f(x1, ..., xk)`` of ``g`` is transformed:

* ``f`` a differentiable primitive: ``▸g`` computes ``y' = f(x1', ..., xk')``;
  ``◂g`` calls the primitive's gradient rule (ANF text declared with the
  primitive) on ``(x', y', sens_y)`` and adds the results to ``sens_xi``.
  A non-differentiable primitive contributes nothing.
* anything else (graphs, closures, function values, meta functions): ``▸g``
  calls the transformed callee ``f'``: ``t = f'(x')``, ``y' = t[0]``,
  ``bp = t[1]``; ``◂g`` calls ``bp(sens_y)`` and distributes element 0 to the
  callee (the gradient of a closure is its GradEnv) and the rest to the args.

Values in the transformed world: data is unchanged, every function value is
its J-transform.  Graphs nested in ``g`` (its scope) are transformed together
with it so their free variables point at ``▸``-nodes; any node *outside* the
transformed scope is brought in by a run-time ``J(n)`` call (identity on
data), whose gradient rule passes ``dout`` straight through — so a closure's
transform ``▸h`` has exactly ``h``'s free variables and run-time
``J(Closure(h, env)) = Closure(▸h, env)``.

A closure value ``ValueNode(h)`` made in ``g`` receives a GradEnv as its
gradient; ``◂g`` reads the entries of the uses it captured (``env_getitem``),
adding each to the node of ``g`` it names, or passing it on under the same
name when ``g`` captures that value too.  The names live on the uses
(:mod:`anfir.ir.capture_names`) and follow cloning and replacement: a compiled
program may transform a closure of a compiled graph at run time, and its
GradEnv must have the names the ``ad`` phase's readers use, even once inlining
has replaced the node it captured (a parameter by the argument) or merged two
captured values into one node (``grad(lambda (y) y * x end)(x)``).  ``◂g`` itself is built only from primitives that have
gradient rules (env ops, ``gadd``, ``tuple_getitem``...), so it can be
transformed again: grad of grad of grad, through closures, ``if`` and
recursion.

Nodes with no gradient contribution are skipped while building ``◂g`` (their
gradient is zero), which keeps gradient graphs small before any
optimization.  Graph bodies are built from a worklist, never recursively.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional, TypeGuard, Union

from anfir.errors import GradientError
from anfir.infer.engine import GENERIC
from anfir.ir import capture_names
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager, manage
from anfir.ir.nodes import CNode, Node, ParameterNode, ValueNode
from anfir.autodiff.gradgraphs import grad_graph_for_types
from anfir.autodiff.loops import J_WORLD, bake_closed_body, closed_body
from anfir.autodiff.partials import (bound_gradient, bound_key, is_generic, j_partial_maker,
                                     note_j_of_maker)
from anfir.autodiff.primitive_j import has_rule, instantiate_bprop, j_primitive_value
from anfir.ir.walk import reachable_graphs, toposort
from anfir.primitives import checkpointing, gradient, meta as metas, structure
from anfir.primitives.checkpointing import CHECKPOINT_FLAG
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.runtime_values import Closure, Partial, SymbolicKey

FORWARD = "▸"
BACKWARD = "◂"

class JContext:
    """Where ``▸g`` graphs are cached, and the worklist of graphs still to build.

    The run-time ``J`` and ``anfir.grad`` share one default context (graphs
    are transformed once per process); the ``ad`` phase uses a fresh context
    per compilation, so the graphs it hands to the optimizer are its own, and
    the typing of ``J`` calls during inference uses one context per engine.

    A cached ``▸g`` is only reused while ``g`` still captures the same free
    variables: ``▸g`` captures exactly ``g``'s, so once a pass has changed them
    (an optimizer folding away the only use of a captured node), the old
    ``▸g`` no longer fits the closures made of ``g`` and is built again.
    """

    def __init__(self, weak: bool = False, static: bool = False) -> None:
        self.static = static
        """Whether the graphs transformed are typed, so what depends on the arity of a
        function value (the J-world partial) can be decided now (the ``ad`` phase)."""
        self.forward: Any = weakref.WeakKeyDictionary() if weak else {}
        # The ids of the free variables ``g`` had when ``▸g`` was made.  The ids
        # are stable: ``▸g`` refers to those very nodes and keeps them alive
        # for as long as its entry exists (plain ints, so a weak key is not
        # kept alive by its own entry).
        self.captured: Any = weakref.WeakKeyDictionary() if weak else {}
        self.pending: list[tuple[FuncGraph, FuncGraph]] = []
        self.partial_makers: dict[tuple[Any, int, int], FuncGraph] = {}
        """The J-world partial's regrouping graph per bound graph and arity (used
        when ``static``; see :func:`anfir.autodiff.runtime.j_partial_maker`)."""

    def request(self, graph: FuncGraph) -> FuncGraph:
        """``▸graph``, created empty and queued if it is new (or stale)."""
        forward = self.forward.get(graph)
        captured = _captured_ids(graph)
        if forward is not None and self.captured.get(graph) == captured:
            return forward
        forward = FuncGraph(FORWARD + graph.name, graph.loc)
        forward.flags["ad_of"] = graph.name
        self.forward[graph] = forward
        self.captured[graph] = captured
        self.pending.append((graph, forward))
        return forward

    def is_cached(self, graph: FuncGraph) -> bool:
        """Whether ``▸graph`` is cached here and still fits ``graph``."""
        return graph in self.forward and self.captured.get(graph) == _captured_ids(graph)

    def drain(self) -> None:
        """Build every queued graph (building may queue more: callees)."""
        while self.pending:
            graph, forward = self.pending.pop()
            try:
                _ScopeTransform(graph, forward, self).build()
            except BaseException:
                self.forward.pop(graph, None)
                self.captured.pop(graph, None)
                self.pending.clear()
                raise

    def j_graph(self, graph: FuncGraph) -> FuncGraph:
        """``▸graph``, fully built."""
        forward = self.request(graph)
        self.drain()
        return forward


def _captured_ids(graph: FuncGraph) -> frozenset[int]:
    """The identities of the nodes ``graph`` captures now (see :class:`JContext`)."""
    manager = graph.manager or manage(graph)
    return frozenset(id(node) for node in manager.free_variables_total(graph))


_default_context = JContext(weak=True)
_key_cache: "weakref.WeakKeyDictionary[Node, SymbolicKey]" = weakref.WeakKeyDictionary()
# A forward node (a parameter or call of ``▸g``) -> the node of ``g`` it computes.
_key_origin: "weakref.WeakKeyDictionary[Node, Node]" = weakref.WeakKeyDictionary()


def j_graph(graph: FuncGraph, context: Optional[JContext] = None) -> FuncGraph:
    """``▸graph``: the J-transform of ``graph`` and the graphs nested in it (cached).

    Graphs that ``graph`` calls are transformed too, from a worklist.
    """
    return (context or _default_context).j_graph(graph)


Positions = dict[FuncGraph, tuple[Manager, int, dict[Node, int]]]
"""graph -> (the manager and its epoch then, node -> index in ``toposort(graph, manager)``)."""


def node_key(node: Node, manager: Manager, positions: Optional[Positions] = None) -> SymbolicKey:
    """The GradEnv key naming ``node`` (stable and readable: ``f/loop:3``).

    A node of ``▸g`` has the key of the node of ``g`` it computes: ``J`` of a
    closure of ``h`` is a closure of ``▸h`` over the same values, and its
    gradient passes straight through to the closure of ``h``, so the GradEnv
    that ``▸h``'s transform fills (keyed by ``▸h``'s free variables, nodes of
    an enclosing ``▸g``) must be read by ``◂g`` with ``h``'s own keys (grad
    of a function whose body takes ``grad`` of a closure over its argument).

    ``positions`` caches the node order of each graph while its manager sees
    no edit: a transform names every value a closure captures, one after the
    other, and sorting the graph once per name made that quadratic.
    """
    origin = _key_origin.get(node)
    if origin is not None:
        while origin is not None:  # ▸▸g -> ▸g -> g, a loop: one step per order of derivative
            node = origin
            origin = _key_origin.get(node)
        if node.graph is not None and node.graph.manager is not None:
            manager = node.graph.manager  # the original's, which knows its graph
    key = _key_cache.get(node)
    if key is None:
        graph = node.graph
        path = []
        current = graph
        while current is not None:
            path.append(current.name)
            current = manager.parent(current)
        index = 0
        if graph is not None:
            cached = positions.get(graph) if positions is not None else None
            if cached is None or cached[0] is not manager or cached[1] != manager.epoch:
                order = {n: i for i, n in enumerate(toposort(graph, manager))}
                cached = (manager, manager.epoch, order)
                if positions is not None:
                    positions[graph] = cached
            index = cached[2].get(node, 0)
        label = node.name or "n"
        key = SymbolicKey(f"{'/'.join(reversed(path))}:{label}.{index}")
        _key_cache[node] = key
    return key


def use_key(user: Union[CNode, FuncGraph], index: int, node: Node, manager: Manager,
            positions: Optional[Positions] = None) -> SymbolicKey:
    """The GradEnv key of the captured value ``node`` read at input ``index`` of
    ``user``: the name that use was given when first asked for (kept through
    cloning and replacement: :mod:`anfir.ir.capture_names`), else :func:`node_key`,
    recorded now."""
    key = capture_names.name_of(user, index)
    if key is None:
        key = node_key(node, manager, positions)
        capture_names.set_name(user, index, key)
    assert isinstance(key, SymbolicKey)
    return key


def _needs_env(value_node: Node, manager: Manager) -> TypeGuard[ValueNode]:
    return (isinstance(value_node, ValueNode) and isinstance(value_node.value, FuncGraph)
            and bool(manager.free_variables_total(value_node.value)))


def _can_receive(node: Node, manager: Manager) -> bool:
    """Whether a gradient for ``node`` has anywhere to go."""
    if isinstance(node, (CNode, ParameterNode)):
        return True
    return _needs_env(node, manager)


class _ScopeTransform:
    """Builds ``▸root`` (already created, empty) and the transforms of the graphs nested in root."""

    def __init__(self, root: FuncGraph, forward_root: FuncGraph, context: JContext) -> None:
        self.context = context
        self.manager = root.manager or manage(root)
        self.root = root
        self.scope = self.manager.scope(root)
        self.in_scope = set(self.scope)
        self.forward: dict[FuncGraph, FuncGraph] = {root: forward_root}
        self.backward: dict[FuncGraph, FuncGraph] = {}
        self.value: dict[Node, Node] = {}      # original node -> its forward value
        self.bprop: dict[CNode, Node] = {}     # original CNode -> bprop closure (generic calls)
        self.jcache: dict[tuple[FuncGraph, Node, Optional[SymbolicKey]], Node] = {}
        self.jfirst: dict[tuple[FuncGraph, Node], Node] = {}  # any J(node) made in ▸g
        self.captured: dict[FuncGraph, list[tuple[SymbolicKey, Node]]] = {}  # captures()
        self.positions: Positions = {}  # node_key's cache, for this transform
        for g in self.scope:
            if g is not root:
                self.forward[g] = FuncGraph(FORWARD + g.name, g.loc)
                self.forward[g].flags["ad_of"] = g.name
            self.backward[g] = FuncGraph(BACKWARD + g.name, g.loc)
            self.backward[g].flags["ad_of"] = g.name
            if is_generic(g):
                # g is typed for unknown arguments (a function value called with several
                # signatures): so are its transforms, wherever they are typed in place.
                self.forward[g].flags[GENERIC] = True
                self.backward[g].flags[GENERIC] = True

    # -- forward --------------------------------------------------------------
    def build(self) -> None:
        for g in self.scope:
            fwd = self.forward[g]
            for p in g.parameters:
                q = fwd.add_parameter(p.name or "x", p.loc)
                q.abstract = None
                self.value[p] = q
                _key_origin[q] = p
        for g in self.scope:
            self._forward_body(g)
        for g in self.scope:
            self._backward_body(g)

    def _note(self, node: Node, graph: FuncGraph, direction: str) -> Any:
        loc = node.loc or graph.loc
        return loc.derive(f"ad: {direction}{graph.name}") if loc is not None else None

    def fmap(self, node: Node, g: FuncGraph, name: Optional[SymbolicKey] = None) -> Node:
        """The forward (J-world) node standing for ``node`` inside ``▸g``.

        ``name``: the name of the captured use being mapped (see :meth:`captures`);
        a node outside the transformed scope is brought in by a ``J(node)`` per
        name, whose input keeps it, so ``▸g`` captures what ``g`` does under the
        same names."""
        mapped = self.value.get(node)
        if mapped is not None:
            return mapped
        if isinstance(node, ValueNode):
            return self._map_constant(node, g)
        # A node outside the transformed scope: bring it in with J at run time.
        if name is None:
            first = self.jfirst.get((g, node))
            if first is not None:
                return first
        key = (g, node, name)
        cached = self.jcache.get(key)
        if cached is None:
            fwd = self.forward[g]
            cached = CNode(fwd, [ValueNode(gradient.J), node], self._note(node, g, FORWARD), node.name)
            if name is not None:
                capture_names.set_name(cached, 1, name)
            self.jcache[key] = cached
            self.jfirst.setdefault((g, node), cached)
        return cached

    def use_name(self, user: Union[CNode, FuncGraph], index: int, node: Node) -> Optional[SymbolicKey]:
        """The name of the use ``(user, index)`` of ``node`` if it is a captured use
        (``node`` computed in another graph than the user's), else None."""
        graph = user if isinstance(user, FuncGraph) else user.graph
        if isinstance(node, ValueNode) or node.graph is graph:
            return None
        return use_key(user, index, node, self.manager, self.positions)

    def captures(self, graph: FuncGraph) -> list[tuple[SymbolicKey, Node]]:
        """What a closure of ``graph`` captures, as (name, node) pairs, one per name:
        the captured uses in ``graph``'s scope and in the scopes of the closures made
        there from graphs outside it (whose own captures it must capture), of nodes
        outside ``graph``'s scope.  Its gradient is a GradEnv with these names."""
        cached = self.captured.get(graph)
        if cached is not None:
            return cached
        mng = self.manager
        outside_of = set(mng.scope(graph))
        found: dict[SymbolicKey, Node] = {}
        seen = {graph}
        todo = [graph]
        while todo:
            h = todo.pop(0)
            scope = mng.scope(h)
            own = set(scope)
            for k in scope:
                uses: list[tuple[Union[CNode, FuncGraph], int, Node]] = []
                for node in toposort(k, mng):
                    if isinstance(node, CNode) and node.graph is k:
                        uses.extend((node, i, inp) for i, inp in enumerate(node.inputs))
                if k.has_output:
                    uses.append((k, capture_names.OUTPUT, k.output))
                for user, index, inp in uses:
                    if isinstance(inp, ValueNode):
                        other = inp.value
                        if isinstance(other, FuncGraph) and other not in own and other not in seen \
                                and mng.free_variables_total(other):
                            seen.add(other)
                            todo.append(other)
                    elif inp.graph not in own and inp.graph not in outside_of:
                        found.setdefault(use_key(user, index, inp, mng, self.positions), inp)
        result = list(found.items())
        self.captured[graph] = result
        return result

    def _map_constant(self, node: ValueNode, g: FuncGraph) -> Node:
        value = node.value
        if isinstance(value, FuncGraph):
            if value in self.in_scope:
                result = ValueNode(self.forward[value], node.loc, node.name)
            elif _needs_env(node, self.manager):
                key: tuple[FuncGraph, Node, Optional[SymbolicKey]] = (g, node, None)
                cached = self.jcache.get(key)
                if cached is None:
                    cached = CNode(self.forward[g], [ValueNode(gradient.J), node],
                                   self._note(node, g, FORWARD), node.name)
                    self.jcache[key] = cached
                return cached
            else:
                result = ValueNode(self.context.request(value), node.loc, node.name)
        elif isinstance(value, Primitive):
            result = ValueNode(j_primitive_value(value), node.loc, node.name)
        elif isinstance(value, MetaFunction):
            result = ValueNode(j_meta(value), node.loc, node.name)
        else:
            return node  # data is its own J-transform
        self.value[node] = result
        return result

    def _forward_body(self, g: FuncGraph) -> None:
        fwd = self.forward[g]
        for node in toposort(g, self.manager):
            if not isinstance(node, CNode):
                continue
            loc = self._note(node, g, FORWARD)
            callee = node.inputs[0]
            names = [self.use_name(node, i, a) for i, a in enumerate(node.inputs)]
            args = [self.fmap(a, g, names[i + 1]) for i, a in enumerate(node.inputs[1:])]
            prim = callee.value if isinstance(callee, ValueNode) else None
            if isinstance(prim, Primitive) and prim in J_WORLD:
                # A structured loop: called through its J-world graph (autodiff/loops.py).
                closed = closed_body(prim, node.inputs[1:], self.manager)
                world = J_WORLD[prim](node.attrs, len(args), closed, node.inputs[1:])
                if closed:
                    bake_closed_body(world, prim, args)
                t = CNode(fwd, [ValueNode(world, callee.loc),
                                *args], loc)
                self._name_uses(t, names)
                y = CNode(fwd, [ValueNode(structure.tuple_getitem), t, ValueNode(0)], loc, node.name)
                self.bprop[node] = CNode(fwd, [ValueNode(structure.tuple_getitem), t, ValueNode(1)], loc)
            elif isinstance(prim, Primitive) and prim is not structure.partial:
                y = CNode(fwd, [callee, *args], loc, node.name, node.attrs)
                self._name_uses(y, names)
            elif prim is structure.partial:
                # The J-world partial calls a wrapper that regroups gradients.
                maker = j_partial_maker(node.inputs[1], len(args) - 1, self.context.static,
                                        self.context.partial_makers)
                y = CNode(fwd, [callee, maker, *args], loc, node.name)
                self._name_uses(y, names[:1] + [None] + names[1:])
            else:
                f = self.fmap(callee, g, names[0])
                t = CNode(fwd, [f, *args], loc)
                self._name_uses(t, names)
                y = CNode(fwd, [ValueNode(structure.tuple_getitem), t, ValueNode(0)], loc, node.name)
                self.bprop[node] = CNode(fwd, [ValueNode(structure.tuple_getitem), t, ValueNode(1)], loc)
            y.abstract = None
            self.value[node] = y
            _key_origin[y] = node
        out_name = self.use_name(g, capture_names.OUTPUT, g.output)
        out = self.fmap(g.output, g, out_name)
        fwd.output = CNode(fwd, [ValueNode(structure.make_tuple), out, ValueNode(self.backward[g])],
                           self._note(g.output, g, FORWARD))
        self._name_uses(fwd.output, [None, out_name])

    @staticmethod
    def _name_uses(user: CNode, names: list[Optional[SymbolicKey]]) -> None:
        """Give the captured inputs of a forward call the names of the uses they copy
        (an input brought in by ``J`` is not captured: the ``J`` call holds the name)."""
        for index, name in enumerate(names):
            if name is not None:
                inp = user.inputs[index]
                if not isinstance(inp, ValueNode) and inp.graph is not user.graph:
                    capture_names.set_name(user, index, name)

    # -- backward -------------------------------------------------------------
    def _backward_body(self, g: FuncGraph) -> None:
        mng = self.manager
        bwd = self.backward[g]
        dout = bwd.add_parameter("dout", g.loc)
        sens: dict[Node, list[Node]] = {}

        named: dict[SymbolicKey, list[Node]] = {}  # gradients of captured values, by name

        def add(node: Node, contribution: Node) -> None:
            sens.setdefault(node, []).append(contribution)

        def add_use(user: Union[CNode, FuncGraph], index: int, node: Node, contribution: Node) -> None:
            name = self.use_name(user, index, node)
            if name is None:
                add(node, contribution)
            else:
                named.setdefault(name, []).append(contribution)

        def add_named(name: SymbolicKey, node: Node, contribution: Node) -> None:
            if node.graph is g:
                add(node, contribution)
            else:  # captured by g too: passed on under the same name
                named.setdefault(name, []).append(contribution)

        def total(node: Node) -> Optional[Node]:
            parts = sens.get(node)
            if not parts:
                return None
            acc = parts[0]
            for part in parts[1:]:
                acc = CNode(bwd, [ValueNode(gradient.gadd), acc, part], self._note(node, g, BACKWARD))
            return acc

        order = self._reverse_order(g)
        add_use(g, capture_names.OUTPUT, g.output, dout)
        for item in order:
            if isinstance(item, ValueNode):
                self._closure_gradient(g, bwd, item, total(item), add_named)
                continue
            node = item
            s = total(node)
            if s is None:
                continue
            loc = self._note(node, g, BACKWARD)
            callee = node.inputs[0]
            prim = callee.value if isinstance(callee, ValueNode) else None
            if isinstance(prim, Primitive) and prim is not structure.partial and prim not in J_WORLD:
                if not prim.differentiable:
                    continue
                args = [self.value_in(a, g) for a in node.inputs[1:]]
                grads = instantiate_bprop(prim, bwd, args, self.value_in(node, g), s, node.loc,
                                          node.attrs, [a.abstract for a in node.inputs[1:]])
                for index, (arg, grad) in enumerate(zip(node.inputs[1:], grads)):
                    if _can_receive(arg, mng):
                        add_use(node, index + 1, arg, grad)
            elif prim is structure.partial:
                # The gradient of a partial value is a GradEnv of d_fn, d_arg1, ...
                # (the keys of the user's partial at every level: see bound_key).
                fn = node.inputs[1].value if isinstance(node.inputs[1], ValueNode) else None
                for i, arg in enumerate(node.inputs[1:]):
                    key = bound_key(fn, i)
                    if key is not None and _can_receive(arg, mng):
                        add_use(node, i + 1, arg, bound_gradient(bwd, s, key, self.value_in(arg, g), loc))
            else:
                bprop = self.bprop[node]
                if g.flags.get(CHECKPOINT_FLAG):
                    bprop = self._recomputed_bprop(bwd, bprop, s, loc)
                all_grads = CNode(bwd, [bprop, s], loc)
                for i, inp in enumerate(node.inputs):
                    if _can_receive(inp, mng):
                        add_use(node, i, inp,
                                CNode(bwd, [ValueNode(structure.tuple_getitem), all_grads, ValueNode(i)], loc))
        # Output: (env of free-variable gradients, d param 1, ...).
        env: Node = CNode(bwd, [ValueNode(gradient.newenv)], self._note(g.output, g, BACKWARD))
        for name, fv in self.captures(g):  # (in a fixed order: the dumps are deterministic)
            parts = named.pop(name, None)
            if parts:
                s = parts[0]
                for part in parts[1:]:
                    s = CNode(bwd, [ValueNode(gradient.gadd), s, part], self._note(fv, g, BACKWARD))
                env = CNode(bwd, [ValueNode(gradient.env_setitem), env, ValueNode(name), s],
                            self._note(fv, g, BACKWARD))
        if named:  # pragma: no cover - would be a bug in captures()
            raise GradientError(f"internal: ◂{g.name} has gradients for values it does not capture "
                                f"({', '.join(map(str, named))})", g.loc)
        outs: list[Node] = [env]
        for p in g.parameters:
            s = total(p)
            if s is None:
                s = CNode(bwd, [ValueNode(structure.zeros_like), self.value[p]], self._note(p, g, BACKWARD))
            outs.append(s)
        bwd.output = CNode(bwd, [ValueNode(structure.make_tuple), *outs], self._note(g.output, g, BACKWARD))

    @staticmethod
    def _recomputed_bprop(bwd: FuncGraph, bprop: Node, s: Node, loc: Any) -> Node:
        """The backpropagator of a call in a checkpointed wrapper (``checkpoint(f)``),
        made again inside ``◂g``: the forward call ``t = ▸f(x')`` of ``▸g`` is repeated
        in ``◂g`` on its inputs read through ``remat_barrier(x', dout)``, and its
        ``t[1]`` used.  ``▸g`` then keeps only ``t[0]``, so the intermediates of ``f``
        die with the forward pass; the barrier keeps common-subexpression
        elimination from merging the two calls (which would keep them alive again)
        and the recomputation from running before the backward pass reaches it."""
        assert isinstance(bprop, CNode)
        t = bprop.inputs[1]
        assert isinstance(t, CNode)
        inputs: list[Node] = [t.inputs[0]]
        for i, arg in enumerate(t.inputs[1:], 1):
            if isinstance(arg, ValueNode):
                inputs.append(arg)  # a constant: nothing to keep alive
                continue
            fenced = CNode(bwd, [ValueNode(checkpointing.remat_barrier), arg, s], loc, arg.name)
            name = capture_names.name_of(t, i)
            if name is not None:
                capture_names.set_name(fenced, 1, name)
            inputs.append(fenced)
        again = CNode(bwd, inputs, loc)
        name = capture_names.name_of(t, 0)
        if name is not None and not isinstance(inputs[0], ValueNode):
            capture_names.set_name(again, 0, name)
        return CNode(bwd, [ValueNode(structure.tuple_getitem), again, ValueNode(1)], loc)

    def value_in(self, node: Node, g: FuncGraph) -> Node:
        """The forward value of ``node`` as seen from ``◂g`` (an edge into ``▸g`` or above)."""
        return self.fmap(node, g)

    def _closure_gradient(self, g: FuncGraph, bwd: FuncGraph, closure: ValueNode,
                          s: Optional[Node], add: Any) -> None:
        """Send a closure's GradEnv entries to the nodes it captured."""
        if s is None:
            return
        loc = self._note(closure, g, BACKWARD)
        for name, fv in self.captures(closure.value):
            zero = CNode(bwd, [ValueNode(structure.zeros_like), self.value_in(fv, g)], loc)
            add(name, fv, CNode(bwd, [ValueNode(gradient.env_getitem), s, ValueNode(name), zero], loc))

    def _reverse_order(self, g: FuncGraph) -> list[Union[CNode, ValueNode]]:
        """``g``'s CNodes (and the closures it makes) in reverse dependency order.

        A closure constant is placed just before its first user, after the
        nodes it captures, so in reverse its gradient is complete before it
        is handed to those nodes.
        """
        mng = self.manager
        order: list[Union[CNode, ValueNode]] = []
        placed: set[Node] = set()
        for node in toposort(g, mng):
            if not isinstance(node, CNode):
                continue
            for inp in node.inputs:
                if inp not in placed and _needs_env(inp, mng):
                    placed.add(inp)
                    order.append(inp)
            order.append(node)
        out = g.output
        if out not in placed and _needs_env(out, mng):
            order.append(out)
        order.reverse()
        return order


def j_meta(meta: MetaFunction) -> MetaFunction:
    """``J(meta)``: generates the J-transform of the graph ``meta`` generates."""
    cached = _j_metas.get(id(meta))
    if cached is None:
        typed = meta.generate_for_types
        if meta is metas.grad or meta is metas.value_and_grad:
            # (``grad`` itself is typed by its own rule, as a GradFn; its transform
            # by the graph a call stands for, from the arity and the indices.)
            with_value = meta is metas.value_and_grad
            typed = lambda args: grad_graph_for_types(args, with_value)  # noqa: E731

        def generate(args: tuple[Any, ...]) -> FuncGraph:
            assert meta.generate is not None  # every meta function's generator is installed
            return j_graph(meta.generate(args))

        cached = MetaFunction(f"J({meta.name})", f"the J-transform of {meta.name}",
                              meta.min_args, meta.max_args,
                              generate=generate, internal=True,
                              # J(J_partial_call): typable when the meta function itself is.
                              generate_for_types=None if typed is None else (
                                  lambda args: _j_of_generated(typed(args))))
        _j_metas[id(meta)] = cached
        _keepalive.append(meta)
        note_j_of_maker(meta, cached)
    return cached




def _j_of_generated(graph: Optional[FuncGraph]) -> Optional[FuncGraph]:
    return None if graph is None else j_graph(graph)


_j_metas: dict[int, MetaFunction] = {}
_keepalive: list[MetaFunction] = []  # J(meta) is cached by id(meta): keep meta alive


def j_graph_checked(graph: FuncGraph) -> FuncGraph:
    """``▸graph`` in the shared context (the run-time ``J``); a graph met for the
    first time is checked first, so every missing gradient rule in its reach is
    reported at once, with locations."""
    if not _default_context.is_cached(graph):
        check_differentiable_graph(graph)
    return _default_context.j_graph(graph)


def check_differentiable_graph(graph: FuncGraph) -> None:
    """Raise a GradientError listing, with locations, every primitive used in
    ``graph``'s reach that is differentiable but has no gradient rule."""

    missing: list[str] = []
    first_loc = None

    def lacks_rule(value: Any, nargs: int, loc: Any) -> None:
        nonlocal first_loc
        if isinstance(value, Primitive) and value.differentiable and not has_rule(value, nargs):
            missing.append(f"  {loc.short() if loc else '?'}: {value.name}")
            first_loc = first_loc or loc

    for g in reachable_graphs([graph]):
        for node in toposort(g):
            if not isinstance(node, CNode):
                continue
            callee = node.inputs[0]
            if isinstance(callee, ValueNode):
                lacks_rule(callee.value, len(node.inputs) - 1, node.loc)
            for arg in node.inputs[1:]:  # a primitive passed as a function value
                value = arg.value if isinstance(arg, ValueNode) else None
                if isinstance(value, Primitive) and value.bprop is None:
                    lacks_rule(value, value.min_args, arg.loc or node.loc)
    if missing:
        raise GradientError("no gradient rule for:\n" + "\n".join(missing), first_loc)
    check_no_self_differentiation(graph)


def _code_reach(graph: FuncGraph) -> set[FuncGraph]:
    """The graphs whose code calling ``graph`` may run: ``graph``, and the graphs its
    own nodes name as constants (called, or made into closures), transitively —
    not the graphs that enclose it (a free variable is a value, not code)."""
    seen = {graph}
    todo = [graph]
    while todo:
        g = todo.pop()
        if not g.has_output:
            continue
        items: list[Node] = [g.output]
        for node in toposort(g):
            if isinstance(node, CNode) and node.graph is g:
                items.extend(node.inputs)
        for item in items:
            if isinstance(item, ValueNode) and isinstance(item.value, FuncGraph) \
                    and item.value not in seen:
                seen.add(item.value)
                todo.append(item.value)
    return seen


_checked: "weakref.WeakKeyDictionary[FuncGraph, int]" = weakref.WeakKeyDictionary()


def check_function_value(fn: Any) -> None:
    """:func:`check_no_self_differentiation` for the graph of the function value
    ``fn`` that a run-time ``grad``/``jvp`` is about to transform (once per graph
    and change of its manager)."""
    while isinstance(fn, Partial):
        fn = fn.fn
    graph = fn.graph if isinstance(fn, Closure) else fn
    if not isinstance(graph, FuncGraph):
        return
    manager = graph.manager or manage(graph)
    if _checked.get(graph) == manager.epoch:
        return
    check_no_self_differentiation(graph)
    _checked[graph] = manager.epoch


_DIFFERENTIATIONS = (metas.grad, metas.value_and_grad, metas.jvp, gradient.J)
"""What transforms the function it is given: a call of one of these inside the
reach of its own function argument is a recursion of the transformation."""


def check_no_self_differentiation(graph: FuncGraph) -> None:
    """Reject a differentiation that would have to unfold for ever: ``grad(@f)``
    called in the reach of ``f`` itself (``def g(x, y) = x * y + grad(g)(2.0, y)``).

    Transforming ``g`` then needs the transform of ``grad(g)``, which needs
    ``J(J(g))``, and so on: each level a bigger graph, without end (at run time
    as in the ``ad`` phase).  Raises a located :class:`GradientError`.
    """
    reach_of: dict[FuncGraph, set[FuncGraph]] = {}
    for g in reachable_graphs([graph]):
        for node in toposort(g):
            if not isinstance(node, CNode) or len(node.inputs) < 2:
                continue
            callee, target = node.inputs[0], node.inputs[1]
            if not (isinstance(callee, ValueNode) and callee.value in _DIFFERENTIATIONS
                    and isinstance(target, ValueNode) and isinstance(target.value, FuncGraph)):
                continue
            fn = target.value
            reach = reach_of.get(fn)
            if reach is None:
                reach = reach_of[fn] = _code_reach(fn)
            if g in reach:
                name = callee.value.name
                raise GradientError(
                    f"{name}(@{fn.name}) is used inside @{fn.name} itself (or what it calls): "
                    f"differentiating @{fn.name} needs the derivative of {name}(@{fn.name}), "
                    "which needs a higher one, and so on for ever — a recursion the "
                    "transformation cannot unfold", node.loc or target.loc,
                    hint=f"compute the {name} outside @{fn.name} and pass it in")

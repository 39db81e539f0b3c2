"""Cloning graphs together with the graphs nested in them.

Inlining, specialization and AD all copy a graph *and its scope* (the closures
defined inside it): the nested graphs' free variables that pointed into the
original must point into the copy.  :func:`clone_scope` does that; nodes
outside the cloned set are shared (they stay free variables of the copy).
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from anfir.ir import capture_names
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager, manage
from anfir.ir.nodes import CNode, Node, ParameterNode, ValueNode
from anfir.location import Location


class Cloner:
    """Copies a set of graphs in two steps (make every node, then wire inputs).

    Two steps need no dependency order, so cycles through recursion and the
    free-variable edges of nested graphs are handled without any recursion.

    * ``node_map`` may be pre-seeded (e.g. parameters to call arguments).
    * ``inline_into[g] = t`` puts ``g``'s nodes into the existing graph ``t``
      instead of a new graph; ``g``'s parameters must then be in ``node_map``.
    * ``note`` marks every copied node's location (``"inline"``, ``"ad: ▸f"``);
      ``loc`` replaces every copied node's location instead (gradient rules
      instantiated for a user's node point at that node).
    """

    def __init__(self, manager: Manager, graphs: Iterable[FuncGraph], *,
                 node_map: Optional[dict[Node, Node]] = None,
                 inline_into: Optional[dict[FuncGraph, FuncGraph]] = None,
                 note: str = "",
                 rename: Optional[Callable[[FuncGraph], str]] = None,
                 keep_types: bool = True, loc: Optional[Location] = None) -> None:
        self.manager = manager
        self.graphs = list(dict.fromkeys(graphs))
        self.node_map: dict[Node, Node] = dict(node_map or {})
        self.graph_map: dict[FuncGraph, FuncGraph] = {}
        self.inline_into = dict(inline_into or {})
        self.note = note
        self.rename = rename
        self.keep_types = keep_types
        self.loc_override = loc
        self._value_map: dict[ValueNode, ValueNode] = {}
        self._run()

    def _loc(self, loc: Optional[Location]) -> Optional[Location]:
        if self.loc_override is not None:
            return self.loc_override
        if loc is None or not self.note:
            return loc
        return loc.derive(self.note)

    def _run(self) -> None:
        mng = self.manager
        placement: dict[FuncGraph, FuncGraph] = {}
        for g in self.graphs:
            if g in self.inline_into:
                # Nodes go into the target; constants naming ``g`` itself
                # (recursion) keep naming ``g``.
                placement[g] = self.inline_into[g]
                continue
            name = self.rename(g) if self.rename else g.name
            new = FuncGraph(name, g.loc)
            new.flags = dict(g.flags)
            if self.keep_types:
                new.abstract = g.abstract
            self.graph_map[g] = new
            placement[g] = new
            for p in g.parameters:
                if p in self.node_map:
                    raise ValueError("a cloned (not inlined) graph's parameters cannot be pre-mapped")
                q = new.add_parameter(p.name or "x", p.loc)
                q.annotation = p.annotation
                if self.keep_types:
                    q.abstract = p.abstract
                self.node_map[p] = q
        # Step 1: make every CNode (inputs are wired in step 2).
        pending: list[tuple[CNode, CNode]] = []
        for g in self.graphs:
            target = placement[g]
            metadata = g.node_meta  # a copy describes what its node does: it keeps the metadata
            for node in sorted(mng.nodes.get(g, ()), key=_seq):
                if isinstance(node, CNode) and node not in self.node_map:
                    copy = CNode(target, node.inputs, self._loc(node.loc), node.name, node.attrs)
                    copy.annotation = node.annotation
                    if self.keep_types:
                        copy.abstract = node.abstract
                    if metadata and node in metadata:
                        target.node_meta[copy] = metadata[node]
                    self.node_map[node] = copy
                    pending.append((node, copy))
        # Step 2: wire inputs and outputs.
        for node, copy in pending:
            copy._inputs = tuple(self.map(inp) for inp in node.inputs)
        for g in self.graphs:
            if g not in self.inline_into and g.has_output:
                self.graph_map[g].output = self.map(g.output)
        # The names of captured uses follow the copies (the autodiff's GradEnv
        # keys: see capture_names).
        capture_names.follow_clone(pending, self.graph_map)

    def map(self, node: Node) -> Node:
        """The copy of ``node`` (or ``node`` itself if it is outside the cloned set)."""
        mapped = self.node_map.get(node)
        if mapped is not None:
            return mapped
        if isinstance(node, ValueNode) and isinstance(node.value, FuncGraph):
            target = self.graph_map.get(node.value)
            if target is not None:
                copy = self._value_map.get(node)
                if copy is None:
                    copy = ValueNode(target, self._loc(node.loc), node.name)
                    copy.abstract = node.abstract if self.keep_types else None
                    self._value_map[node] = copy
                return copy
        return node

    def output_of(self, graph: FuncGraph) -> Node:
        """For an inlined graph: the node that stands for its output in the target."""
        return self.map(graph.output)


def clone_scope(graph: FuncGraph, *, note: str = "",
                rename: Optional[Callable[[FuncGraph], str]] = None,
                manager: Optional[Manager] = None) -> tuple[FuncGraph, Cloner]:
    """Copy ``graph`` and every graph nested in it; return the copy and the cloner."""
    mng = manager or graph.manager or manage(graph)
    cloner = Cloner(mng, mng.scope(graph), note=note, rename=rename)
    return cloner.graph_map[graph], cloner


def clone(graph: FuncGraph, name: Optional[str] = None) -> FuncGraph:
    """A fresh copy of ``graph`` and its nested graphs (free variables outside stay shared)."""
    copy, _ = clone_scope(graph, rename=(lambda g: name if (g is graph and name) else g.name))
    return copy


def inline_call(manager: Manager, call: CNode, note: str = "inline") -> Node:
    """Replace ``call`` (whose callee is a graph constant) by a copy of the graph's body.

    The callee's parameters become the call's arguments; graphs nested in the
    callee are copied with their free variables redirected.  Returns the node
    now standing where the call was.
    """
    callee = call.inputs[0]
    assert isinstance(callee, ValueNode) and isinstance(callee.value, FuncGraph)
    graph = callee.value
    args = call.inputs[1:]
    if len(args) != len(graph.parameters):
        raise ValueError("inline_call: arity mismatch")
    scope = manager.scope(graph)
    seed: dict[Node, Node] = dict(zip(graph.parameters, args))
    cloner = Cloner(manager, scope, node_map=seed, inline_into={graph: call.graph}, note=note)
    result = cloner.output_of(graph)
    manager.replace(call, result)
    return result


def _seq(node: Node) -> int:
    return node.seq


__all__ = ["Cloner", "clone", "clone_scope", "inline_call", "ParameterNode"]

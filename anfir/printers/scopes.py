"""Where each graph is printed: a top-level ``def`` or a ``let``-bound lambda inside another.

A graph with free variables must be printed inside its parent (``manager.parent``),
where the captured names are in scope.  A *closed* graph (no free variables)
could be a ``def``; when every use of it lies inside one definition we nest it
at the innermost graph that contains all uses instead, so a parsed
``let f = lambda (x) x + 3 end in ...`` or an ``if`` branch ``then 0`` prints
back where the user wrote it.  Everything here is iterative and linear.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from anfir.errors import UsageError
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager
from anfir.ir.nodes import Node, ValueNode
from anfir.ir.walk import Facts, toposort
from anfir.runtime_values import Closure, Partial


@dataclass
class ScopePlan:
    """The print tree: which graph each graph is printed in (None: a top-level def)."""

    manager: Manager
    graphs: list[FuncGraph]
    """Every printed graph, in discovery order (roots first, then breadth first)."""
    home: dict[FuncGraph, Optional[FuncGraph]]
    """The graph a graph is printed inside; None for a top-level definition."""
    depth: dict[FuncGraph, int] = field(default_factory=dict)
    """Nesting depth in the print tree (0 for definitions)."""
    children: dict[FuncGraph, list[FuncGraph]] = field(default_factory=dict)
    """Graphs printed directly inside each graph, in discovery order."""

    @property
    def defs(self) -> list[FuncGraph]:
        """The top-level definitions, in discovery order."""
        return [g for g in self.graphs if self.home[g] is None]

    def root_of(self, graph: FuncGraph) -> FuncGraph:
        """The definition whose text contains ``graph``."""
        while self.home[graph] is not None:
            graph = self.home[graph]  # type: ignore[assignment]
        return graph

    def scope_order(self, top: FuncGraph) -> list[FuncGraph]:
        """``top`` and every graph printed inside it, parents first."""
        result = [top]
        index = 0
        while index < len(result):
            result.extend(self.children.get(result[index], ()))
            index += 1
        return result


def discover(roots: Iterable[FuncGraph], external: Iterable[FuncGraph] = (),
             facts: Optional[Facts] = None) -> list[FuncGraph]:
    """Graphs reachable from ``roots`` (breadth first), not entering ``external`` ones.

    A graph is reached through graph constants (also inside constant tuples,
    partials and closures that transformations fold) and through free
    variables (their owners).
    """
    stop = set(external)
    roots = list(roots)
    facts = facts or Facts(roots)
    seen: dict[FuncGraph, None] = {}
    queue: list[FuncGraph] = []
    for g in roots:
        if g not in seen and g not in stop:
            seen[g] = None
            queue.append(g)
    index = 0
    while index < len(queue):
        g = queue[index]
        index += 1
        for other in _referenced(g, facts.of(g)):
            if other not in seen and other not in stop:
                seen[other] = None
                queue.append(other)
    return queue


def discover_managed(roots: list[FuncGraph], external: Iterable[FuncGraph] = ()
                     ) -> tuple[Manager, list[FuncGraph]]:
    """One manager for ``roots`` and everything they reach, and those graphs.

    Graphs reached only through constants (which are not edges) are made
    roots of the same manager, so every fact (users, parents) is known.
    """
    ext = list(external)
    # A read-only analysis: printing must not attach or merge managers.
    facts = Facts([*roots, *ext])
    graphs = discover(roots, ext, facts)
    mng = facts.manager
    if any(g not in mng.graphs for g in graphs):  # graphs with managers of their own
        mng = Manager([*roots, *ext, *graphs], detached=True)
    return mng, graphs


def _referenced(graph: FuncGraph, manager: Manager) -> list[FuncGraph]:
    found: dict[FuncGraph, None] = {}
    used: list[Node] = []
    for node in toposort(graph, manager):
        used.extend(node.inputs)
    if graph.has_output:
        used.append(graph.output)
    for node in used:
        if isinstance(node, ValueNode):
            for g in graphs_in_value(node.value):
                found.setdefault(g, None)
        elif node.graph is not None and node.graph is not graph:
            found.setdefault(node.graph, None)
    return list(found)


def graphs_in_value(value: Any) -> list[FuncGraph]:
    """Graphs a constant holds: itself, or inside tuples, partials and closures."""
    if isinstance(value, FuncGraph):
        return [value]
    if not isinstance(value, (tuple, Partial, Closure)):
        return []
    found: list[FuncGraph] = []
    stack: list[Any] = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, FuncGraph):
            found.append(v)
        elif isinstance(v, tuple):
            stack.extend(reversed(v))
        elif isinstance(v, Partial):
            stack.extend(reversed((v.fn, *v.args)))
        elif isinstance(v, Closure):
            stack.extend(reversed((v.graph, *v.env)))
    return found


def plan_scopes(manager: Manager, graphs: list[FuncGraph], pinned: Iterable[FuncGraph]) -> ScopePlan:
    """Decide the print tree of ``graphs``; closed ``pinned`` graphs stay definitions.

    Every graph is printed at the innermost graph containing all its uses
    (their lowest common ancestor in the print tree), provided that place is
    inside its MindIR parent, whose nodes it captures; uses from inside the
    graph itself (recursion) do not count.  A closed graph whose uses have no
    common ancestor is a definition.
    """
    printed = set(graphs)
    pinned_set = set(pinned)
    mparent: dict[FuncGraph, Optional[FuncGraph]] = {}
    for g in graphs:
        parent = manager.parent(g)
        if parent is not None and parent not in printed:
            raise UsageError(f"cannot print @{g.name}: it is nested in @{parent.name}, "
                             "which is not part of what is printed")
        mparent[g] = parent
    mdepth = depths(graphs, mparent)
    home: dict[FuncGraph, Optional[FuncGraph]] = dict(mparent)
    for g in graphs:
        if g in pinned_set and mparent[g] is None:
            continue
        place = _innermost_use(manager, g, home, mparent, mdepth, printed)
        if place is None or place is g:
            continue
        parent = mparent[g]
        if parent is None or _is_ancestor(parent, place, mparent, mdepth):
            home[g] = place
    _break_cycles(graphs, home, mparent)
    plan = ScopePlan(manager, graphs, home)
    plan.depth = depths(graphs, home)
    for g in graphs:
        parent = home[g]
        if parent is not None:
            plan.children.setdefault(parent, []).append(g)
    return plan


def _innermost_use(manager: Manager, g: FuncGraph, home: dict, mparent: dict, mdepth: dict,
                   printed: set[FuncGraph]) -> Optional[FuncGraph]:
    """The lowest common print ancestor of the graphs using ``g`` from outside it."""
    users: dict[FuncGraph, None] = {}
    for user, _index in manager.graph_users(g):
        owner = user if isinstance(user, FuncGraph) else user.graph
        if owner is not None and owner in printed and not _is_ancestor(g, owner, mparent, mdepth):
            users[owner] = None
    if not users:
        return None
    found = iter(users)
    common: Optional[FuncGraph] = next(found)
    for other in found:
        common = _lca(common, other, home)  # type: ignore[arg-type]
        if common is None:
            return None
    return common


def _is_ancestor(ancestor: FuncGraph, graph: FuncGraph, parent_of: dict, depth: dict) -> bool:
    """Whether ``ancestor`` is ``graph`` or above it in the tree ``parent_of`` (depths ``depth``)."""
    current: Optional[FuncGraph] = graph
    target = depth[ancestor]
    while current is not None and depth[current] > target:
        current = parent_of[current]
    return current is ancestor


def _lca(a: FuncGraph, b: FuncGraph, parent_of: dict) -> Optional[FuncGraph]:
    """Lowest common ancestor-or-self in ``parent_of`` (depths computed on the way)."""
    seen: set[FuncGraph] = set()
    current: Optional[FuncGraph] = a
    while current is not None and current not in seen:
        seen.add(current)
        current = parent_of[current]
    current = b
    visited: set[FuncGraph] = set()
    while current is not None and current not in visited:
        if current in seen:
            return current
        visited.add(current)
        current = parent_of[current]
    return None


def depths(graphs: list[FuncGraph], parent_of: dict) -> dict[FuncGraph, int]:
    """Depth of each graph in the tree ``parent_of`` (0 at the top), iteratively."""
    depth: dict[FuncGraph, int] = {}
    for start in graphs:
        path = []
        g: Optional[FuncGraph] = start
        while g is not None and g not in depth:
            path.append(g)
            g = parent_of.get(g)
        base = -1 if g is None else depth[g]
        for node in reversed(path):
            base += 1
            depth[node] = base
    return depth


def _break_cycles(graphs: list[FuncGraph], home: dict[FuncGraph, Optional[FuncGraph]],
                  mparent: dict[FuncGraph, Optional[FuncGraph]]) -> None:
    """Graphs placed inside each other in a ring go back to their MindIR parent."""
    while True:
        state: dict[FuncGraph, int] = {}  # 1: on the current path, 2: settled
        broken = False
        for start in graphs:
            path: list[FuncGraph] = []
            g: Optional[FuncGraph] = start
            while g is not None and g not in state:
                state[g] = 1
                path.append(g)
                g = home[g]
            if g is not None and state[g] == 1:
                home[g] = mparent[g]
                broken = True
            for node in path:
                state[node] = 2
        if not broken:
            return

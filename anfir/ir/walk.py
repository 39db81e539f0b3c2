"""Iterative walks over graphs: dependency order within a graph, reachable graphs.

Nothing here recurses on program size: a 100,000-node chain is walked with an
explicit stack at Python's default recursion limit.
"""

from __future__ import annotations

from typing import Iterable

from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager, analyse
from anfir.ir.nodes import CNode, Node, ValueNode


def toposort(graph: FuncGraph, manager: Manager | None = None) -> list[Node]:
    """``graph``'s parameters, then its CNodes, each after everything it needs.

    A CNode needs its inputs; a closure constant ``ValueNode(h)`` needs the
    nodes of ``graph`` that ``h`` captures (``free_variables_total(h)``), so a
    node used only inside a nested lambda is computed before the closure is
    made.  Inputs are visited left to right, so the order is deterministic.
    """
    mng = manager or graph.manager or analyse(graph)
    order: list[Node] = list(graph.parameters)
    if not graph.has_output:
        return order
    done: set[Node] = set(order)
    # Entries are (node, expanded?).  A node is emitted after its successors.
    stack: list[tuple[Node, bool]] = [(graph.output, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            if node not in done:
                done.add(node)
                order.append(node)
            continue
        if node in done:
            continue
        succ = _successors(node, graph, mng)
        if isinstance(node, CNode) and node.graph is graph:
            stack.append((node, True))
        for s in reversed(succ):
            if s not in done:
                stack.append((s, False))
    return order


def _successors(node: Node, graph: FuncGraph, mng: Manager) -> list[Node]:
    if isinstance(node, CNode):
        if node.graph is not graph:
            return []
        return list(node.inputs)
    if isinstance(node, ValueNode) and isinstance(node.value, FuncGraph):
        return [fv for fv in mng.free_variables_total(node.value) if fv.graph is graph]
    return []


def reachable_graphs(roots: Iterable[FuncGraph]) -> list[FuncGraph]:
    """Every graph reachable from ``roots`` through constants and free variables.

    Deterministic order: breadth first from the roots, each graph's references
    in the order its nodes use them.
    """
    seen: dict[FuncGraph, None] = {}
    queue = list(roots)
    for g in queue:
        seen.setdefault(g, None)
    facts = Facts(queue)
    index = 0
    while index < len(queue):
        g = queue[index]
        index += 1
        for other in graphs_referenced(g, facts.of(g)):
            if other not in seen:
                seen[other] = None
                queue.append(other)
    return list(seen)


def graphs_referenced(graph: FuncGraph, manager: Manager | None = None) -> list[FuncGraph]:
    """Graphs referenced by ``graph``'s own nodes: graph constants and owners of free variables."""
    found: dict[FuncGraph, None] = {}
    for node in toposort(graph, manager):
        for inp in node.inputs:
            if isinstance(inp, ValueNode) and isinstance(inp.value, FuncGraph):
                found.setdefault(inp.value, None)
            elif inp.graph is not None and inp.graph is not graph:
                found.setdefault(inp.graph, None)
    out = graph.output if graph.has_output else None
    if isinstance(out, ValueNode) and isinstance(out.value, FuncGraph):
        found.setdefault(out.value, None)
    elif out is not None and out.graph is not None and out.graph is not graph:
        found.setdefault(out.graph, None)
    return list(found)


def all_cnodes(graphs: Iterable[FuncGraph]) -> list[CNode]:
    """The CNodes of all ``graphs``, graph by graph in dependency order."""
    graphs = list(graphs)
    facts = Facts(graphs)
    result: list[CNode] = []
    for g in graphs:
        result.extend(n for n in toposort(g, facts.of(g)) if isinstance(n, CNode))
    return result


class Facts:
    """One read-only analysis shared by a walk over many graphs.

    Walking each graph with its own throw-away analysis would analyse the
    whole program once per graph (quadratic); this keeps one, and grows it
    when the walk reaches a graph it does not know (one held only inside a
    constant tuple or closure, which is not an edge).
    """

    def __init__(self, roots: Iterable[FuncGraph]) -> None:
        roots = list(roots)
        self.manager = analyse(*roots) if roots else Manager(detached=True)

    def of(self, graph: FuncGraph) -> Manager:
        """A manager that knows ``graph``'s nodes and free variables."""
        if graph.manager is not None:
            return graph.manager
        if graph not in self.manager.graphs:
            if not self.manager.detached:
                self.manager = Manager(self.manager.roots, detached=True)
            self.manager.add_root(graph)
        return self.manager

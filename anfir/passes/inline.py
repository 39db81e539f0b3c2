"""The ``inline`` phase: replace calls of graph constants by the callee's body.

A call ``g(a, b)`` whose callee is the constant ``@g`` is inlined when ``g``

* is not recursive (``Manager.is_recursive``: inlining a recursive graph
  never ends), and
* is either called exactly once in the whole program (its only use is this
  call: copying it loses nothing, and the original is then dropped), or is
  small — at most :data:`INLINE_THRESHOLD` CNodes, counting the graphs nested
  in it.

The callee's parameters become the call's arguments; graphs nested in the
callee are copied with their free variables redirected into the caller
(:class:`anfir.ir.clone.Cloner`, the same machinery as
:func:`anfir.ir.clone.inline_call`).  Copies keep their ``.abstract`` types
and their source locations (marked ``inline``).

The pass is a worklist over call sites: the calls copied into a caller by an
inlining are queued, and so is the last remaining call of a graph whose other
uses disappeared, until nothing changes.
"""

from __future__ import annotations

from typing import Optional

from anfir.ir.clone import Cloner
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager, remove_dead_graphs
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.passes.compile_state import Program


INLINE_THRESHOLD = 12
"""A non-recursive graph with at most this many CNodes (its scope included) is
inlined at every call site."""


class RecursionCache:
    """Memo of ``Manager.is_recursive`` for one pass.

    Inlining only copies edges a caller could already reach, so during the
    inline phase a graph never *becomes* recursive and both answers can be
    kept.  With ``keep_negative=False`` (the optimizer, whose registered rules
    may add references to graphs) only "recursive" is remembered: a stale
    "recursive" merely skips an inlining, a stale "not recursive" could make
    inlining endless.
    """

    def __init__(self, manager: Manager, keep_negative: bool = True) -> None:
        self.manager = manager
        self.keep_negative = keep_negative
        self._known: dict[FuncGraph, bool] = {}

    def __call__(self, graph: FuncGraph) -> bool:
        known = self._known.get(graph)
        if known is None:
            if self.keep_negative:
                # One walk answers for every graph it reaches, and known
                # answers prune later walks: linear over the whole pass.
                self.manager.settle_recursion(graph, self._known)
                known = self._known[graph]
            else:
                found: dict[FuncGraph, bool] = {}
                self.manager.settle_recursion(graph, found)
                known = found[graph]
                if known:
                    self._known[graph] = True
        return known


def called_graph(call: Node) -> Optional[FuncGraph]:
    """The graph a CNode calls directly (its callee is a graph constant), else None."""
    if not isinstance(call, CNode) or not call.inputs:
        return None
    head = call.inputs[0]
    if isinstance(head, ValueNode) and isinstance(head.value, FuncGraph):
        return head.value
    return None


def scope_size(manager: Manager, graph: FuncGraph, limit: Optional[int] = None) -> int:
    """The number of CNodes in ``graph`` and the graphs nested in it.

    Counting stops early once ``limit`` is exceeded (only "small or not" matters).
    """
    total = 0
    for g in manager.scope(graph):
        nodes = manager.nodes.get(g, {})
        total += sum(1 for n in nodes if isinstance(n, CNode))
        if limit is not None and total > limit:
            break
    return total


def use_count(manager: Manager, graph: FuncGraph) -> int:
    """How many edges use the constant ``@graph`` (calls and uses as a value)."""
    return len(manager.graph_users(graph))


def should_inline(manager: Manager, call: CNode, threshold: int = INLINE_THRESHOLD,
                  recursive: Optional[RecursionCache] = None) -> bool:
    """Whether ``call`` calls a graph that the inlining policy allows to copy here."""
    graph = called_graph(call)
    if graph is None or call.graph is None or graph not in manager.graphs:
        return False
    if len(call.inputs) - 1 != len(graph.parameters):
        return False  # an arity error is the specializer's to report, not ours to hide
    is_rec = recursive(graph) if recursive is not None else manager.is_recursive(graph)
    if is_rec:
        return False
    # Never copy a graph into its own scope (a nested graph calling its parent
    # is recursion, but be explicit: the copy would never end).
    owner: Optional[FuncGraph] = call.graph
    scope = set(manager.scope(graph))
    if owner in scope:
        return False
    if use_count(manager, graph) == 1:
        return True
    return scope_size(manager, graph, threshold) <= threshold


def clone_call_body(manager: Manager, call: CNode, note: str) -> tuple[Node, list[CNode]]:
    """Copy the body of the graph ``call`` calls into ``call.graph``, without
    redirecting ``call``'s users.

    Returns the node standing for the call's value and the new nodes (CNodes
    of the caller and of the copied nested graphs), so a worklist can visit
    them.  The caller does ``manager.replace(call, result)``.
    """
    graph = called_graph(call)
    assert graph is not None and call.graph is not None
    seed: dict[Node, Node] = dict(zip(graph.parameters, call.inputs[1:]))
    cloner = Cloner(manager, manager.scope(graph), node_map=seed,
                    inline_into={graph: call.graph}, note=note)
    result = cloner.output_of(graph)
    created = [copy for original, copy in cloner.node_map.items()
               if isinstance(copy, CNode) and original not in seed]
    created.sort(key=lambda n: n.seq)
    return result, created


def inline_calls(manager: Manager, threshold: int = INLINE_THRESHOLD, note: str = "inline") -> int:
    """Inline every call (in the manager's graphs) the policy allows, to a
    fixed point; return how many calls were inlined."""
    recursive = RecursionCache(manager)
    queue: list[CNode] = []
    for g in sorted(manager.graphs, key=lambda g: g.seq):
        for node in sorted(manager.nodes.get(g, {}), key=lambda n: n.seq):
            if called_graph(node) is not None:
                queue.append(node)  # type: ignore[arg-type]
    count = 0
    index = 0
    while index < len(queue):
        call = queue[index]
        index += 1
        if not manager.tracks(call) or not should_inline(manager, call, threshold, recursive):
            continue
        graph = called_graph(call)
        assert graph is not None
        result, created = clone_call_body(manager, call, note)
        manager.replace(call, result)
        count += 1
        queue.extend(n for n in created if called_graph(n) is not None)
        # The graph may now have a single use left: that call becomes a candidate.
        if graph in manager.graphs:
            users = manager.graph_users(graph)
            if len(users) == 1 and isinstance(users[0][0], CNode) and users[0][1] == 0:
                queue.append(users[0][0])
    return count


def run(program: "Program") -> "Program":
    """The ``inline`` phase entry point: inline calls in the program's graphs."""
    manager = program.require_manager()
    remove_dead_graphs(manager)  # dead callers would make a graph look used twice
    count = inline_calls(manager)
    program.stats["inline"] += count
    remove_dead_graphs(manager)
    return program

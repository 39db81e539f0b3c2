"""The Manager: exact, incrementally kept facts about a set of graphs.

Kept on every edge change (``set_edge``, ``set_output``, ``replace``):

* ``users[node]`` — the (user, index) pairs pointing at ``node``; the user is a
  CNode (index = input position) or a FuncGraph (index ``-1``: its output);
* ``nodes[g]`` — the nodes ``g`` owns that are alive (reachable);
* ``free_variables_direct[g]`` — nodes of other graphs used by ``g``'s own edges;
* ``graphs_used[g]`` — graphs ``g`` refers to through ValueNodes, with counts;
* ``graph_value_nodes[h]`` — the live ValueNodes that hold graph ``h``.

Derived on demand from those and cached until the next change (the facts are
cheap to recompute for all graphs at once and always agree with the edges):

* ``free_variables_total(g)`` — direct free variables plus those of every graph
  ``g`` uses that ``g`` does not own (a closure made in ``g`` needs them);
* ``parent(g)`` — the deepest graph owning one of those free variables;
* ``children(g)`` and ``scope(g)`` (``g`` and all its descendants).

Nodes and graphs that lose their last user are released, so the facts always
describe the live program.  No walk here recurses on program size.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Optional, Union

from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ParameterNode, ValueNode

User = Union[CNode, FuncGraph]
OUTPUT = -1


class Manager:
    """Tracks the graphs reachable from ``roots`` and keeps their facts exact."""

    def __init__(self, roots: Iterable[FuncGraph] = (), detached: bool = False) -> None:
        self.detached = detached
        """A read-only analysis: it never claims its graphs (``graph.manager``
        stays as it was) nor merges their managers, so reading a program
        (printing, walking) leaves it as it was.  Never edit through it."""
        self.roots: dict[FuncGraph, None] = {}
        self.graphs: dict[FuncGraph, None] = {}
        self.users: dict[Node, dict[tuple[User, int], None]] = {}
        self.nodes: dict[FuncGraph, dict[Node, None]] = {}
        self.free_variables_direct: dict[FuncGraph, Counter[Node]] = {}
        self.graphs_used: dict[FuncGraph, Counter[FuncGraph]] = {}
        self.graph_value_nodes: dict[FuncGraph, dict[ValueNode, None]] = {}
        self._derived: Optional[_Derived] = None
        self.epoch = 0
        """Bumped on every change; caches of compiled code compare it."""
        for root in roots:
            self.add_root(root)

    # -- membership -----------------------------------------------------------
    def add_root(self, graph: FuncGraph) -> None:
        """Track ``graph`` (and everything it reaches) and keep it alive."""
        self.roots[graph] = None
        self._acquire_graph(graph)

    def tracks(self, node: Node) -> bool:
        """Whether ``node`` is a live node of this manager."""
        return node in self.users

    def _acquire_graph(self, graph: FuncGraph) -> None:
        if graph in self.graphs or (graph.manager is self and not self.detached):
            return
        todo: list[tuple[User, int, Node]] = []
        self._acquire_graph_deferred(graph, todo)
        self._add_edges(todo)

    def _merge(self, other: "Manager") -> None:
        """Take over every graph of ``other``; afterwards both objects share one state.

        The two managers' graph sets are disjoint and each set's records are
        exact, so their union is exact.  ``other`` is then made an alias of
        this manager (they share ``__dict__``), so code still holding it sees
        the merged facts.
        """
        for graph in other.graphs:
            graph.manager = self
        self.roots.update(other.roots)
        self.graphs.update(other.graphs)
        self.users.update(other.users)
        self.nodes.update(other.nodes)
        self.free_variables_direct.update(other.free_variables_direct)
        self.graphs_used.update(other.graphs_used)
        for graph, holders in other.graph_value_nodes.items():
            self.graph_value_nodes.setdefault(graph, {}).update(holders)
        self._derived = None
        self.epoch += other.epoch + 1
        other.__dict__ = self.__dict__

    # -- edges ----------------------------------------------------------------
    def _add_edges(self, todo: list[tuple[User, int, Node]],
                   releasing: Optional[dict[FuncGraph, None]] = None,
                   revived: Optional[list[FuncGraph]] = None) -> None:
        """Record edges; newly reached nodes and graphs are acquired (iteratively).

        ``releasing``/``revived`` are given by :meth:`_settle`: an edge that
        reaches a graph still being released (one of its nodes, or a constant
        holding it) moves that graph from ``releasing`` to ``revived``.
        """
        self.epoch += 1
        while todo:
            user, index, node = todo.pop()
            if releasing:
                touched = node.value if isinstance(node, ValueNode) else node.graph
                if isinstance(touched, FuncGraph) and touched in releasing:
                    del releasing[touched]
                    assert revived is not None
                    revived.append(touched)
            users = self.users.get(node)
            if users is None:
                users = self.users[node] = {}
                if isinstance(node, CNode):
                    graph = node.graph
                    assert graph is not None
                    if graph not in self.graphs:
                        self._acquire_graph_deferred(graph, todo)
                    self.nodes[graph][node] = None
                    todo.extend((node, i, inp) for i, inp in enumerate(node.inputs))
                elif isinstance(node, ParameterNode):
                    graph = node.graph
                    assert graph is not None
                    if graph not in self.graphs:
                        self._acquire_graph_deferred(graph, todo)
                elif isinstance(node, ValueNode) and isinstance(node.value, FuncGraph):
                    target = node.value
                    self.graph_value_nodes.setdefault(target, {})[node] = None
                    if target not in self.graphs:
                        self._acquire_graph_deferred(target, todo)
            users[(user, index)] = None
            user_graph = user if isinstance(user, FuncGraph) else user.graph
            if isinstance(node, ValueNode):
                if isinstance(node.value, FuncGraph):
                    self.graphs_used[user_graph][node.value] += 1
                    self._derived = None
            elif node.graph is not user_graph:
                self.free_variables_direct[user_graph][node] += 1
                self._derived = None

    def _acquire_graph_deferred(self, graph: FuncGraph, todo: list[tuple[User, int, Node]]) -> None:
        if self.detached:
            self._record_graph(graph, todo)
            return
        if graph.manager is not None and graph.manager is not self:
            # Graphs that reach each other must share one manager: adopt all
            # of the other manager's graphs (their records stay valid).
            self._merge(graph.manager)
            if graph in self.graphs:
                return
        graph.manager = self
        self._record_graph(graph, todo)

    def _record_graph(self, graph: FuncGraph, todo: list[tuple[User, int, Node]]) -> None:
        self.graphs[graph] = None
        self.nodes[graph] = {}
        self.free_variables_direct[graph] = Counter()
        self.graphs_used[graph] = Counter()
        self.graph_value_nodes.setdefault(graph, {})
        self._derived = None
        for param in graph.parameters:
            self.users.setdefault(param, {})
            self.nodes[graph][param] = None
        if graph.has_output:
            todo.append((graph, OUTPUT, graph.output))

    def _drop_edges(self, todo: list[tuple[User, int, Node]],
                    releasing: Optional[dict[FuncGraph, None]] = None) -> None:
        """Forget edges; nodes and graphs left without users are released.

        ``releasing`` holds graphs the caller already proved dead (their
        output edge is in ``todo``).
        """
        self.epoch += 1
        releasing = {} if releasing is None else releasing
        while todo:
            user, index, node = todo.pop()
            users = self.users.get(node)
            if users is None:
                continue
            users.pop((user, index), None)
            user_graph = user if isinstance(user, FuncGraph) else user.graph
            if isinstance(node, ValueNode):
                if isinstance(node.value, FuncGraph):
                    counts = self.graphs_used.get(user_graph)
                    if counts is not None:
                        counts[node.value] -= 1
                        if counts[node.value] <= 0:
                            del counts[node.value]
                    self._derived = None
            elif node.graph is not user_graph:
                fv_counts = self.free_variables_direct.get(user_graph)
                if fv_counts is not None:
                    fv_counts[node] -= 1
                    if fv_counts[node] <= 0:
                        del fv_counts[node]
                self._derived = None
            if users:
                continue
            # ``node`` lost its last user (a parameter keeps its empty record
            # while its graph is tracked).
            if isinstance(node, CNode):
                del self.users[node]
                self.nodes.get(node.graph, {}).pop(node, None)
                todo.extend((node, i, inp) for i, inp in enumerate(node.inputs))
            elif isinstance(node, ValueNode):
                del self.users[node]
                if isinstance(node.value, FuncGraph):
                    target = node.value
                    holders = self.graph_value_nodes.get(target, {})
                    holders.pop(node, None)
                    if (not holders and target not in self.roots and target in self.graphs
                            and target not in releasing):
                        releasing[target] = None
                        if target.has_output:
                            todo.append((target, OUTPUT, target.output))
        if releasing:
            self._settle(releasing)

    def _settle(self, releasing: dict[FuncGraph, None]) -> None:
        """Finish releasing the graphs whose last constant went.

        Their outputs' edges are dropped by now, but a graph stays reachable
        while a live node elsewhere uses one of its parameters or CNodes as a
        free variable (e.g. a closure nested in it that a recursive graph
        keeps alive, or a constant of it that is still held): a manager built
        from scratch would reach the graph through that node.  Such a graph
        is kept and its output edge recorded again, which may in turn reach
        other graphs of ``releasing`` (they are kept too).  The records of the
        others are dropped only now, when none of their nodes has a user left,
        so a graph acquired again later starts from exact (empty) records.
        """
        revived: list[FuncGraph] = [g for g in releasing if self._graph_in_use(g)]
        for g in revived:
            del releasing[g]
        while revived:
            graph = revived.pop()
            if graph.has_output:
                self._add_edges([(graph, OUTPUT, graph.output)], releasing, revived)
        for graph in releasing:
            self._forget_graph(graph)

    def _graph_in_use(self, graph: FuncGraph) -> bool:
        # After its output edge is gone, a graph's tracked CNodes and its
        # parameters' users can only come from live nodes of other graphs.
        if self.graph_value_nodes.get(graph):
            return True
        if any(self.users.get(p) for p in graph.parameters):
            return True
        return any(isinstance(n, CNode) for n in self.nodes.get(graph, {}))

    def release_if_unused(self, graph: FuncGraph) -> bool:
        """Stop tracking ``graph`` if it is no root, no constant holds it and no
        live node uses one of its nodes; return whether it was released.

        Releasing happens by itself when a graph's last constant goes; a graph
        acquired only as the owner of a free variable (a closure's enclosing
        graph, inlined away) has no constant to lose when that free variable
        goes, so whoever proves it dead releases it with this.
        """
        if graph not in self.graphs or graph in self.roots or self.graph_value_nodes.get(graph):
            return False
        todo: list[tuple[User, int, Node]] = []
        if graph.has_output:
            todo.append((graph, OUTPUT, graph.output))
        self._drop_edges(todo, {graph: None})
        return graph not in self.graphs

    def _forget_graph(self, graph: FuncGraph) -> None:
        for param in graph.parameters:
            self.users.pop(param, None)
        self.graphs.pop(graph, None)
        self.nodes.pop(graph, None)
        self.free_variables_direct.pop(graph, None)
        self.graphs_used.pop(graph, None)
        self.graph_value_nodes.pop(graph, None)
        if graph.manager is self:
            graph.manager = None
        self._derived = None

    def set_edge(self, user: CNode, index: int, node: Node) -> None:
        """Point ``user.inputs[index]`` at ``node``."""
        old = user.inputs[index]
        if old is node:
            return
        user._raw_set_input(index, node)
        self._add_edges([(user, index, node)])
        self._drop_edges([(user, index, old)])

    def set_output(self, graph: FuncGraph, node: Node) -> None:
        """Make ``node`` the output of ``graph``."""
        old = graph._output
        graph._raw_set_output(node)
        if old is node and old is not None and (graph, OUTPUT) in self.users.get(old, {}):
            return
        self._add_edges([(graph, OUTPUT, node)])
        if old is not None and old is not node:
            self._drop_edges([(graph, OUTPUT, old)])

    def replace(self, old: Node, new: Node) -> None:
        """Redirect every use of ``old`` to ``new``."""
        if old is new:
            return
        for user, index in list(self.users.get(old, {})):
            if isinstance(user, FuncGraph):
                self.set_output(user, new)
            else:
                self.set_edge(user, index, new)

    # -- derived facts --------------------------------------------------------
    def _facts(self) -> "_Derived":
        if self._derived is None:
            self._derived = _Derived(self)
        return self._derived

    def free_variables_total(self, graph: FuncGraph) -> list[Node]:
        """Free variables of ``graph`` and of the closures it makes, in creation order."""
        return self._facts().fv_total.get(graph, [])

    def parent(self, graph: FuncGraph) -> Optional[FuncGraph]:
        """The graph ``graph`` is nested in (derived from its free variables)."""
        return self._facts().parent.get(graph)

    def children(self, graph: FuncGraph) -> list[FuncGraph]:
        """The graphs whose parent is ``graph``."""
        return self._facts().children.get(graph, [])

    def scope(self, graph: FuncGraph) -> list[FuncGraph]:
        """``graph`` and all its descendants, parents before children."""
        result = [graph]
        index = 0
        while index < len(result):
            result.extend(self.children(result[index]))
            index += 1
        return result

    def ancestors(self, graph: FuncGraph) -> list[FuncGraph]:
        """Parent, grandparent, ... of ``graph``."""
        chain = []
        current = self.parent(graph)
        while current is not None:
            chain.append(current)
            current = self.parent(current)
        return chain

    def graph_users(self, graph: FuncGraph) -> list[tuple[User, int]]:
        """Every (user, index) that refers to ``graph`` through a ValueNode."""
        result: list[tuple[User, int]] = []
        for holder in self.graph_value_nodes.get(graph, {}):
            result.extend(self.users.get(holder, {}))
        return result

    def call_sites(self, graph: FuncGraph) -> list[CNode]:
        """CNodes that call ``graph`` directly (the graph constant is their input 0)."""
        return [user for user, index in self.graph_users(graph)
                if isinstance(user, CNode) and index == 0]

    def is_recursive(self, graph: FuncGraph) -> bool:
        """Whether ``graph`` can reach itself through the graphs it uses."""
        seen: set[FuncGraph] = set()
        stack = list(self.graphs_used.get(graph, ()))
        while stack:
            current = stack.pop()
            if current is graph:
                return True
            if current in seen:
                continue
            seen.add(current)
            stack.extend(self.graphs_used.get(current, ()))
        return False


class _Derived:
    """free_variables_total, parent and children for every managed graph."""

    def __init__(self, manager: Manager) -> None:
        graphs = list(manager.graphs)
        fv: dict[FuncGraph, dict[Node, None]] = {
            g: dict.fromkeys(manager.free_variables_direct[g]) for g in graphs}
        users_of: dict[FuncGraph, list[FuncGraph]] = {g: [] for g in graphs}
        for g in graphs:
            for h in manager.graphs_used[g]:
                if h in users_of:
                    users_of[h].append(g)
        # Fixpoint: a graph needs the free variables of the graphs it uses,
        # except those it owns itself.  Sets only grow, so this terminates.
        work = list(graphs)
        queued = set(graphs)
        while work:
            h = work.pop()
            queued.discard(h)
            for g in users_of[h]:
                target = fv[g]
                grew = False
                for node in fv[h]:
                    if node.graph is not g and node not in target:
                        target[node] = None
                        grew = True
                if grew and g not in queued:
                    queued.add(g)
                    work.append(g)
        self.fv_total = {g: sorted(nodes, key=_seq) for g, nodes in fv.items()}
        # Parent: the deepest owner among the free variables' graphs.  Depth is
        # computed with an explicit stack (nesting can be deep in generated code).
        owners = {g: {n.graph for n in fv[g]} - {g} for g in graphs}
        depth: dict[FuncGraph, int] = {}
        parent: dict[FuncGraph, Optional[FuncGraph]] = {}
        for start in graphs:
            stack = [start]
            while stack:
                g = stack[-1]
                if g in depth:
                    stack.pop()
                    continue
                pending = [o for o in owners.get(g, ()) if o not in depth and o in owners]
                # Guard against ill-scoped cycles (an owner that is an ancestor
                # of itself): treat a node already on the stack as depth 0.
                pending = [o for o in pending if o not in stack]
                if pending:
                    stack.extend(pending)
                    continue
                stack.pop()
                candidates = [o for o in owners.get(g, ()) if o in depth]
                if candidates:
                    best = max(candidates, key=lambda o: (depth[o], -o.seq))
                    parent[g] = best
                    depth[g] = depth[best] + 1
                else:
                    parent[g] = None
                    depth[g] = 0
        self.parent = parent
        children: dict[FuncGraph, list[FuncGraph]] = {}
        for g in sorted(graphs, key=lambda x: x.seq):
            p = parent.get(g)
            if p is not None:
                children.setdefault(p, []).append(g)
        self.children = children


def _seq(node: Node) -> int:
    return node.seq


def remove_dead_graphs(manager: Manager) -> int:
    """Drop the graphs no root can reach; return how many.

    The manager releases a graph when its last constant goes, but a dead
    recursive graph holds its own constant: cutting the dead graphs' outputs
    releases them (they are unreachable, so nobody observes the cut).
    """
    live: set[FuncGraph] = set()
    stack = list(manager.roots)
    while stack:
        g = stack.pop()
        if g in live or g not in manager.graphs:
            continue
        live.add(g)
        stack.extend(manager.graphs_used.get(g, ()))
        stack.extend(fv.graph for fv in manager.free_variables_direct.get(g, ()) if fv.graph is not None)
    dead = sorted((g for g in manager.graphs if g not in live), key=lambda g: g.seq)
    for g in dead:
        if g in manager.graphs and g.has_output:
            g.output = ValueNode(None)
    for g in dead:  # those only a (now gone) free variable had brought in
        manager.release_if_unused(g)
    return len(dead)


def analyse(*graphs: FuncGraph) -> Manager:
    """Facts about ``graphs`` for reading them, with no side effect: their
    manager when they all share one, else a detached analysis (see
    :attr:`Manager.detached`).  Printers and walks use this, not :func:`manage`."""
    existing = {g.manager for g in graphs}
    if len(existing) == 1:
        (manager,) = existing
        if manager is not None:
            return manager
    return Manager(graphs, detached=True)


def manage(*graphs: FuncGraph) -> Manager:
    """The manager of ``graphs`` (the existing one if they share it, else a new one)."""
    existing = {g.manager for g in graphs}
    if len(existing) == 1:
        (manager,) = existing
        if manager is not None:
            for g in graphs:
                manager.roots[g] = None
            return manager
    manager = Manager()
    for g in graphs:
        manager.add_root(g)
    return manager

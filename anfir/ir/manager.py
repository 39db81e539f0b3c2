"""The Manager: exact, incrementally kept facts about a set of graphs.

Kept on every edge change (``set_edge``, ``set_output``, ``replace``):

* ``users[node]`` — the (user, index) pairs pointing at ``node``; the user is a
  CNode (index = input position) or a FuncGraph (index ``-1``: its output);
* ``nodes[g]`` — the nodes ``g`` owns that are alive (reachable);
* ``free_variables_direct[g]`` — nodes of other graphs used by ``g``'s own edges;
* ``graphs_used[g]`` — graphs ``g`` refers to through ValueNodes, with counts;
* ``graph_value_nodes[h]`` — the live ValueNodes that hold graph ``h``;
* ``used_by[h]`` — the graphs whose edges use ``h`` (``graphs_used`` reversed).

Derived from those on demand (:class:`_Derived`), and repaired — not
recomputed — after changes: an edit marks the graphs whose free-variable or
graph-use *sets* changed, and the next query revisits only those graphs and
the facts that flow from them, so a pass that edits and queries in turn (the
inliner: one query per inlined call) costs what it changes, not the size of
the program each time:

* ``free_variables_total(g)`` — direct free variables plus those of every graph
  ``g`` uses that ``g`` does not own (a closure made in ``g`` needs them);
* ``parent(g)`` — the deepest graph owning one of those free variables;
* ``children(g)`` and ``scope(g)`` (``g`` and all its descendants).

Nodes and graphs that lose their last user are released, so the facts always
describe the live program.  No walk here recurses on program size.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Optional, Sequence, Union

from anfir.ir import capture_names
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
        self.used_by: dict[FuncGraph, dict[FuncGraph, None]] = {}
        """``used_by[h]``: the graphs ``g`` with ``h`` in ``graphs_used[g]`` (the
        edges along which free variables flow to the closures' users)."""
        self._derived = _Derived()
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
        for graph, users in other.used_by.items():
            self.used_by.setdefault(graph, {}).update(users)
        # The other manager's derived facts are not carried over: its graphs
        # are re-derived at the next query (a cost in the size of ``other``,
        # like the updates above).
        for graph in other.graphs:
            self._derived.dirty[graph] = None
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
                    used = self.graphs_used[user_graph]
                    count = used[node.value]
                    used[node.value] = count + 1
                    if not count:  # a new graph use: the derived facts of user_graph may change
                        self.used_by.setdefault(node.value, {})[user_graph] = None
                        self._derived.dirty[user_graph] = None
            elif node.graph is not user_graph:
                direct = self.free_variables_direct[user_graph]
                count = direct[node]
                direct[node] = count + 1
                if not count:
                    self._derived.dirty[user_graph] = None

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
        self._derived.dirty[graph] = None
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
                            self.used_by.get(node.value, {}).pop(user_graph, None)
                            self._derived.dirty[user_graph] = None
            elif node.graph is not user_graph:
                fv_counts = self.free_variables_direct.get(user_graph)
                if fv_counts is not None:
                    fv_counts[node] -= 1
                    if fv_counts[node] <= 0:
                        del fv_counts[node]
                        self._derived.dirty[user_graph] = None
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
        for used in self.graphs_used.pop(graph, {}):
            self.used_by.get(used, {}).pop(graph, None)
        self.used_by.pop(graph, None)
        self.graph_value_nodes.pop(graph, None)
        if graph.manager is self:
            graph.manager = None
        self._derived.removed[graph] = None

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

    def set_inputs(self, user: CNode, inputs: tuple[Node, ...]) -> None:
        """Point ``user``'s inputs at ``inputs`` (as many as it has): the edges
        that change are recorded one by one, in order, as :meth:`set_edge`
        would, but the input tuple is rebuilt once."""
        changed = [(index, old) for index, (old, node) in enumerate(zip(user.inputs, inputs))
                   if old is not node]
        if not changed:
            return
        user._raw_set_inputs(inputs)
        for index, old in changed:
            self._add_edges([(user, index, inputs[index])])
            self._drop_edges([(user, index, old)])

    def replace(self, old: Node, new: Node) -> None:
        """Redirect every use of ``old`` to ``new``."""
        if old is new:
            return
        uses = list(self.users.get(old, {}))
        capture_names.follow_replace(old, new, uses)
        # A user may hold ``old`` at thousands of positions (a wide tuple of one
        # value): rebuild each user's input tuple once, then record the edges
        # in the order of the uses, exactly as one set_edge per use would.
        positions: dict[CNode, list[int]] = {}
        for user, index in uses:
            if not isinstance(user, FuncGraph):
                positions.setdefault(user, []).append(index)
        for user, indices in positions.items():
            inputs = list(user.inputs)
            for index in indices:
                inputs[index] = new
            user._raw_set_inputs(tuple(inputs))
        for user, index in uses:
            if isinstance(user, FuncGraph):
                self.set_output(user, new)
            else:
                self._add_edges([(user, index, new)])
                self._drop_edges([(user, index, old)])

    # -- derived facts --------------------------------------------------------
    def _facts(self) -> "_Derived":
        derived = self._derived
        if derived.dirty or derived.removed:
            derived.repair(self)
        return derived

    def free_variables_total(self, graph: FuncGraph) -> list[Node]:
        """Free variables of ``graph`` and of the closures it makes, in creation order."""
        return self._facts().free_variables(graph)

    def parent(self, graph: FuncGraph) -> Optional[FuncGraph]:
        """The graph ``graph`` is nested in (derived from its free variables)."""
        return self._facts().parent.get(graph)

    def children(self, graph: FuncGraph) -> list[FuncGraph]:
        """The graphs whose parent is ``graph``."""
        return self._facts().children_of(graph)

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

    def settle_recursion(self, graph: FuncGraph, known: dict[FuncGraph, bool]) -> None:
        """Record in ``known`` whether ``graph``, and every graph it reaches that
        ``known`` does not hold yet, can reach itself through the graphs it uses.

        One pass of Tarjan's strongly connected components (iterative): a graph
        is recursive when its component has several graphs or it uses itself.
        A graph ``known`` says is *not* recursive lies on no cycle, so the walk
        does not enter it: a caller that keeps the answers (the inliner, whose
        edits never make a graph recursive) pays once for each graph, instead
        of once per question for everything the graph reaches.
        """
        used = self.graphs_used
        index: dict[FuncGraph, int] = {graph: 0}
        low: dict[FuncGraph, int] = {graph: 0}
        component: list[FuncGraph] = [graph]
        on_component: set[FuncGraph] = {graph}
        work = [(graph, iter(list(used.get(graph, ()))))]
        while work:
            g, successors = work[-1]
            descended = False
            for h in successors:
                if known.get(h) is False:
                    continue  # on no cycle: it cannot lead back to g
                if h not in index:
                    index[h] = low[h] = len(index)
                    component.append(h)
                    on_component.add(h)
                    work.append((h, iter(list(used.get(h, ())))))
                    descended = True
                    break
                if h in on_component:
                    low[g] = min(low[g], index[h])
            if descended:
                continue
            work.pop()
            if work:
                caller = work[-1][0]
                low[caller] = min(low[caller], low[g])
            if low[g] == index[g]:
                members = []
                while True:
                    member = component.pop()
                    on_component.discard(member)
                    members.append(member)
                    if member is g:
                        break
                for member in members:
                    known[member] = len(members) > 1 or member in used.get(member, ())

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
    """free_variables_total, parent and children of every managed graph, kept
    up to date by :meth:`repair`.

    ``free_variables_total`` is the least fixpoint of "a graph's direct free
    variables, plus those of every graph it uses that it does not own".  A
    change can add facts (new edges) and remove them (edges gone, graphs
    released), through cycles of recursive graphs too, so :meth:`repair`
    works as delete-and-rederive (DRed) does for recursive views: every fact
    that may have rested on something removed is deleted (cascading along
    ``used_by``), then every graph touched re-derives its facts from its
    current edges and its used graphs' facts, and what it gains flows on to
    the graphs that use it.  A fact that is a *direct* free variable is never
    deleted (the edges say it is true), which stops most cascades at once.
    Parents are then recomputed for the graphs whose owners changed, and in
    turn for those whose owners' depths changed.
    """

    def __init__(self) -> None:
        self.dirty: dict[FuncGraph, None] = {}
        """Graphs whose direct free variables or graph uses changed (as sets), or new."""
        self.removed: dict[FuncGraph, None] = {}
        """Graphs released since the last repair."""
        self.fv: dict[FuncGraph, dict[Node, None]] = {}
        self.owners: dict[FuncGraph, Counter[FuncGraph]] = {}
        """``owners[g][o]``: how many of ``g``'s free variables ``o`` owns."""
        self.owned_by: dict[FuncGraph, dict[FuncGraph, None]] = {}
        """``owned_by[o]``: the graphs with a free variable owned by ``o``
        (their parent depends on ``o``'s depth)."""
        self.parent: dict[FuncGraph, Optional[FuncGraph]] = {}
        self.depth: dict[FuncGraph, int] = {}
        self.children: dict[FuncGraph, dict[FuncGraph, None]] = {}
        self.tangled = False
        """Whether ownership had a cycle (an ill-scoped program) at the last
        full computation: parents are then always recomputed in full, since
        the result depends on the order graphs are visited in."""
        self._sorted_fv: dict[FuncGraph, list[Node]] = {}
        self._sorted_children: dict[FuncGraph, list[FuncGraph]] = {}
        self._reparent: dict[FuncGraph, None] = {}

    # -- reading -------------------------------------------------------------------
    def free_variables(self, graph: FuncGraph) -> list[Node]:
        """``graph``'s free variables sorted by creation (a cached list: never mutate it)."""
        cached = self._sorted_fv.get(graph)
        if cached is None:
            cached = self._sorted_fv[graph] = sorted(self.fv.get(graph, ()), key=_seq)
        return cached

    def children_of(self, graph: FuncGraph) -> list[FuncGraph]:
        """The graphs whose parent is ``graph``, by creation (a cached list)."""
        cached = self._sorted_children.get(graph)
        if cached is None:
            cached = self._sorted_children[graph] = sorted(self.children.get(graph, ()),
                                                           key=_graph_seq)
        return cached

    # -- editing one graph's facts -----------------------------------------------------
    def _add(self, graph: FuncGraph, nodes: Sequence[Node]) -> None:
        facts = self.fv.setdefault(graph, {})
        owners = self.owners.setdefault(graph, Counter())
        for node in nodes:
            facts[node] = None
            owner = node.graph
            assert owner is not None
            if not owners[owner]:
                self.owned_by.setdefault(owner, {})[graph] = None
                self._reparent[graph] = None
            owners[owner] += 1
        self._sorted_fv.pop(graph, None)

    def _remove(self, graph: FuncGraph, nodes: Sequence[Node]) -> None:
        facts = self.fv.get(graph, {})
        owners = self.owners[graph]
        for node in nodes:
            facts.pop(node, None)
            owner = node.graph
            assert owner is not None
            owners[owner] -= 1
            if not owners[owner]:
                del owners[owner]
                self.owned_by.get(owner, {}).pop(graph, None)
                self._reparent[graph] = None
        self._sorted_fv.pop(graph, None)

    def _drop_graph(self, graph: FuncGraph) -> None:
        """Forget a released graph's facts (graphs that depended on them are dirty)."""
        facts = self.fv.pop(graph, None)
        if facts:
            self._remove(graph, list(facts))
        self.owners.pop(graph, None)
        self._sorted_fv.pop(graph, None)
        for user in self.owned_by.pop(graph, {}):
            self._reparent[user] = None
        for child in self.children.pop(graph, {}):
            self._reparent[child] = None
        self._sorted_children.pop(graph, None)
        self._set_parent(graph, None)
        self.parent.pop(graph, None)
        self.depth.pop(graph, None)
        self._reparent.pop(graph, None)

    def _set_parent(self, graph: FuncGraph, parent: Optional[FuncGraph]) -> None:
        old = self.parent.get(graph)
        if old is not parent or graph not in self.parent:
            if old is not None:
                self.children.get(old, {}).pop(graph, None)
                self._sorted_children.pop(old, None)
            if parent is not None:
                self.children.setdefault(parent, {})[graph] = None
                self._sorted_children.pop(parent, None)
        self.parent[graph] = parent

    # -- repair ------------------------------------------------------------------------
    def repair(self, manager: "Manager") -> None:
        """Bring every fact up to date with ``manager``'s edges."""
        graphs = manager.graphs
        direct = manager.free_variables_direct
        dirty = [g for g in self.dirty if g in graphs]
        removed = [g for g in self.removed if g not in graphs]
        self.dirty = {}
        self.removed = {}
        for g in removed:
            self._drop_graph(g)
        for g in dirty:
            self._reparent[g] = None
        # 1. Delete every fact that may rest on a removed edge: in a dirty
        # graph, whatever is not a direct free variable; then, along
        # ``used_by``, the same nodes in the graphs that got them from there.
        touched: dict[FuncGraph, None] = {}
        cascade: list[tuple[FuncGraph, list[Node]]] = []
        for g in dirty:
            own = direct[g]
            lost = [n for n in self.fv.get(g, ()) if n not in own]
            if lost:
                self._remove(g, lost)
                cascade.append((g, lost))
        while cascade:
            g, lost = cascade.pop()
            for user in manager.used_by.get(g, ()):
                facts = self.fv.get(user)
                if not facts:
                    continue
                own = direct[user]
                gone = [n for n in lost if n in facts and n not in own]
                if gone:
                    self._remove(user, gone)
                    touched[user] = None
                    cascade.append((user, gone))
        # 2. Re-derive: each graph touched or dirty from its current edges and
        # the facts of the graphs it uses; what it gains flows to its users.
        grown: list[tuple[FuncGraph, list[Node]]] = []
        for g in (*dirty, *touched):
            facts = self.fv.setdefault(g, {})
            new: dict[Node, None] = {n: None for n in direct[g] if n not in facts}
            for used in manager.graphs_used[g]:
                for n in self.fv.get(used, ()):
                    if n.graph is not g and n not in facts:
                        new[n] = None
            if new:
                gained = list(new)
                self._add(g, gained)
                grown.append((g, gained))
        while grown:
            g, gained = grown.pop()
            for user in manager.used_by.get(g, ()):
                facts = self.fv.setdefault(user, {})
                new_nodes = [n for n in gained if n.graph is not user and n not in facts]
                if new_nodes:
                    self._add(user, new_nodes)
                    grown.append((user, new_nodes))
        # 3. Parents.
        if self.tangled:
            self._all_parents(manager)
        else:
            self._update_parents(manager)

    def _place(self, graph: FuncGraph, graphs: dict[FuncGraph, None]) -> tuple[Optional[FuncGraph], int]:
        # The deepest owner (the first created among equals), from current depths.
        owners = [o for o in self.owners.get(graph, ()) if o in graphs]
        if not owners:
            return None, 0
        best = max(owners, key=lambda o: (self.depth.get(o, 0), -o.seq))
        return best, self.depth.get(best, 0) + 1

    def _update_parents(self, manager: "Manager") -> None:
        """Recompute parent and depth of the graphs marked, owners first (a
        depth-first walk with an explicit stack), and again for the graphs
        whose owners' depths change.  An owner met again on the walk's own
        path means ownership has a cycle: everything is then recomputed by
        :meth:`_all_parents`."""
        graphs = manager.graphs
        todo = self._reparent
        self._reparent = {}
        while todo:
            start = next(iter(todo))
            path = [(start, iter(list(self.owners.get(start, ()))))]
            on_path = {start}
            while path:
                g, owners = path[-1]
                descended = False
                for o in owners:
                    if o in on_path:
                        self._all_parents(manager)
                        return
                    if o in todo and o in graphs:
                        path.append((o, iter(list(self.owners.get(o, ())))))
                        on_path.add(o)
                        descended = True
                        break
                if descended:
                    continue
                path.pop()
                on_path.discard(g)
                todo.pop(g, None)
                if g not in graphs:
                    continue
                parent, depth = self._place(g, graphs)
                moved = self.depth.get(g) != depth
                self._set_parent(g, parent)
                self.depth[g] = depth
                if moved:
                    for user in self.owned_by.get(g, ()):
                        todo[user] = None

    def _all_parents(self, manager: "Manager") -> None:
        """Parent and depth of every graph from scratch, owners first.

        Only for ill-scoped programs, whose ownership has a cycle: an owner met
        again on the walk's own path counts as unknown (it is not a
        candidate), so every graph still gets a parent, which then depends on
        the order the graphs are visited in.
        """
        self._reparent = {}
        graphs = manager.graphs
        depth: dict[FuncGraph, int] = {}
        parent: dict[FuncGraph, Optional[FuncGraph]] = {}
        tangled = False
        for start in graphs:
            if start in depth:
                continue
            path = [(start, iter(list(self.owners.get(start, ()))))]
            on_path = {start}
            while path:
                g, owners = path[-1]
                descended = False
                for o in owners:
                    if o in on_path:
                        tangled = True
                    elif o not in depth and o in graphs:
                        path.append((o, iter(list(self.owners.get(o, ())))))
                        on_path.add(o)
                        descended = True
                        break
                if descended:
                    continue
                path.pop()
                on_path.discard(g)
                candidates = [o for o in self.owners.get(g, ()) if o in depth]
                if candidates:
                    best = max(candidates, key=lambda o: (depth[o], -o.seq))
                    parent[g] = best
                    depth[g] = depth[best] + 1
                else:
                    parent[g] = None
                    depth[g] = 0
        self.tangled = tangled
        self.depth = depth
        self.parent = {}
        self.children = {}
        self._sorted_children = {}
        for g in graphs:
            self._set_parent(g, parent[g])


def _seq(node: Node) -> int:
    return node.seq


def _graph_seq(graph: FuncGraph) -> int:
    return graph.seq


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

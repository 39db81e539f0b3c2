"""The ``optimize`` phase: a worklist rewrite engine run to a fixed point.

The rules live in :mod:`anfir.passes.optimize_rules` (an ordered list; more can
be listed in :data:`DEFAULT_RULES`).  The engine:

1. queues every CNode of every managed graph, in creation order;
2. pops a node and tries the rules in order; the first that returns a
   replacement wins: ``manager.replace(node, new)``, the rule's counter goes
   up, and only the nodes that changed are queued again — the former users of
   ``node`` (their input changed) and the nodes the rule created;
3. when the queue is empty, sweeps graphs nobody can reach any more (dead
   recursive graphs keep themselves alive through their own constant) and
   re-queues calls of graphs left with a single call site (they may be
   inlined now); stops when that finds nothing.

A node is visited once, then again only when one of its inputs was
replaced: the work is linear in the program plus the rewrites done.  A *round* is one generation of the
queue (the nodes queued while the previous generation ran); with
``fine_dumps`` the pipeline writes one ``.ir`` per round.

Types are kept locally: a rule's new node gets its ``.abstract`` from the
node it replaces when the rewrite keeps the value's type, else from
``specialize.infer_call`` on its inputs' types — never by re-running the
specializer over the program.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from anfir.abstract.lattice import widen
from anfir.abstract.values import AScalar, ATensor, ATuple
from anfir.errors import AnfirError, IRConsistencyError
from anfir.ir.attrs import NO_ATTRS, Attrs
from anfir.ir.graph import FuncGraph
from anfir.location import Location
from anfir.ir.manager import Manager, remove_dead_graphs
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.passes.inline import INLINE_THRESHOLD, RecursionCache, called_graph, clone_call_body, should_inline
from anfir.autodiff.rules import GRADIENT_RULES
from anfir.passes.optimize_rules import FINAL_RULES, SIMPLIFY_RULES, Rule, is_data
from anfir.passes.specialize import abstract_of_value, infer_call

if TYPE_CHECKING:  # pragma: no cover
    from anfir.passes.pipeline import Program

MAX_ROUNDS = 100_000
"""A safety net: a rule set that never reaches a fixed point is a bug."""


DEFAULT_RULES: tuple[Rule, ...] = (
    *SIMPLIFY_RULES,
    *(Rule(fn.__name__, fn) for fn in GRADIENT_RULES),
    *FINAL_RULES,
)
"""Every rule the optimizer tries, in order (first match wins): the local
simplifications, the gradient clean-ups, then inlining and CSE.  Composed
here, explicitly: the list never depends on what was imported."""


class RuleDeclined(Exception):
    """Raised inside a rule (e.g. by ``ctx.apply`` when the new node cannot be
    typed) to mean "this rule does not apply here"."""


_INFER: Any = object()


class RewriteContext:
    """What a rule may use: typed node builders, the CSE table, the inliner."""

    def __init__(self, manager: Manager, counts: Counter[str],
                 inline_threshold: int = INLINE_THRESHOLD) -> None:
        self.manager = manager
        """The manager of the graphs being rewritten."""
        self.counts = counts
        """Rule name → times fired (shared with the pipeline's stats)."""
        self.rule = ""
        """The name of the rule being tried (used in derived locations)."""
        self.created: list[Node] = []
        """Nodes made by the current rule; the engine queues them."""
        self.inline_threshold = inline_threshold
        self.recursive = RecursionCache(manager, keep_negative=False)
        self._cse: dict[tuple, CNode] = {}
        # Facts about constant values and types, by identity, for the whole
        # run.  Folding a chain of tuple constructions makes constants that
        # nest the previous one: with these, each fold looks at its new level
        # only, not the whole value again (the memos hold what they key).
        self._abstracts: dict[int, tuple[Any, Any]] = {}
        self._data: dict[int, Any] = {}
        self._compatible: dict[tuple[int, int], tuple[Any, Any]] = {}
        self._memos: dict[str, dict[Any, Any]] = {}

    # -- building --------------------------------------------------------------
    def loc(self, like: Node) -> Optional[Location]:
        """``like``'s location marked as made by the current rule."""
        if like.loc is None:
            return None
        return like.loc.derive(f"optimize: {self.rule}")

    def constant(self, value: Any, like: Node) -> ValueNode:
        """A typed constant ``value`` standing where ``like`` was."""
        node = ValueNode(value, self.loc(like))
        try:
            node.abstract = abstract_of_value(value, self._abstracts)
        except AnfirError:  # a value the type system has no name for: do not make it
            raise RuleDeclined() from None
        return node

    def apply(self, graph: FuncGraph, inputs: Sequence[Node], like: Node,
              abstract: Any = _INFER, attrs: Attrs = NO_ATTRS) -> CNode:
        """A CNode ``inputs[0](inputs[1:])`` in ``graph`` with the attributes
        ``attrs``, replacing ``like``.

        ``abstract`` is the new node's type when the caller knows it (the
        rewrite keeps ``like``'s value); otherwise it is inferred from the
        inputs' types with ``specialize.infer_call``.  A rule that rebuilds a
        call of the same primitive passes the old call's ``attrs`` on.
        """
        node = CNode(graph, inputs, self.loc(like), like.name, attrs)
        if abstract is _INFER:
            abstract = self.infer(inputs, node.loc, attrs)
        node.abstract = abstract
        node.annotation = like.annotation
        self.created.append(node)
        return node

    def infer(self, inputs: Sequence[Node], loc: Optional[Location],
              attrs: Attrs = NO_ATTRS) -> Any:
        """The type of ``inputs[0](inputs[1:])`` (with ``attrs``) from its inputs' types
        (None when untyped)."""
        if any(i.abstract is None for i in inputs):
            return None  # an untyped program (built by hand) stays untyped
        try:
            return infer_call(inputs[0].abstract, [i.abstract for i in inputs[1:]], loc, attrs)
        except AnfirError:
            raise RuleDeclined() from None

    def inline(self, call: CNode) -> Node:
        """The body of the graph ``call`` calls, copied into ``call.graph``."""
        result, created = clone_call_body(self.manager, call, f"optimize: {self.rule}")
        self.created.extend(created)
        return result

    # -- questions ---------------------------------------------------------------
    def can_inline(self, call: CNode) -> bool:
        """Whether the inlining policy allows inlining ``call`` here."""
        return called_graph(call) is not None and should_inline(
            self.manager, call, self.inline_threshold, self.recursive)

    @staticmethod
    def same_type(a: Node, b: Node) -> bool:
        """Whether both nodes are typed and have the same type (known scalar
        values ignored: ``<Float64 = 1.0>`` has the type of ``<Float64>``)."""
        if a.abstract is None or b.abstract is None:
            return False
        return widen(a.abstract) == widen(b.abstract)

    @staticmethod
    def same_value(a: Node, b: Node) -> bool:
        """Whether ``a`` and ``b`` are the same node, or constants equal in type and value."""
        return a is b or (isinstance(a, ValueNode) and isinstance(b, ValueNode)
                          and _input_key(a) == _input_key(b))

    def compatible(self, new: Any, old: Any) -> bool:
        """Whether a constant typed ``new`` may stand where a node typed ``old``
        was: the same kind and dtype (and shape where ``old`` knows it)."""
        return abstract_compatible(new, old, self._compatible)

    def memo(self, name: str) -> dict[Any, Any]:
        """A dict a rule may keep its own facts in for the whole run (one per
        ``name``); what it keeps must stay true under value-preserving rewrites,
        or be checked before use."""
        found = self._memos.get(name)
        if found is None:
            found = self._memos[name] = {}
        return found

    def is_data(self, value: Any) -> bool:
        """Whether ``value`` is plain data a constant can hold (:func:`is_data`)."""
        return is_data(value, self._data)

    # -- CSE ---------------------------------------------------------------------
    def hash_cons(self, node: CNode) -> Optional[CNode]:
        """The live, earlier node equal to ``node`` in its graph, or None (then
        ``node`` becomes the representative of its key)."""
        key = (node.graph, node.attrs.key, *(_input_key(i) for i in node.inputs))
        known = self._cse.get(key)
        if (known is not None and known is not node and self.manager.tracks(known)
                and known.graph is node.graph and known.attrs == node.attrs
                and _same_inputs(known, node)):
            return known
        self._cse[key] = node
        return None


def _input_key(node: Node) -> Any:
    # Constants compare by value (two ``1.0`` ValueNodes are the same input);
    # type names keep 1, 1.0 and True apart; floats use repr so -0.0 != 0.0.
    if isinstance(node, ValueNode):
        v = node.value
        if v is None or type(v) in (bool, int, str):
            return ("const", type(v).__name__, v)
        if type(v) is float:
            return ("const", "float", repr(v))
        if isinstance(v, tuple):
            if all(e is None or type(e) in (bool, int, float, str) for e in v):
                return ("tuple", tuple((type(e).__name__, repr(e)) for e in v))
            return node  # nested or array-holding tuples: only the same ValueNode matches
        if isinstance(v, (list, dict)) or hasattr(v, "__array__"):
            return node  # arrays: only the same ValueNode matches
        try:
            hash(v)
        except TypeError:
            return node
        return ("value", type(v).__name__, v)
    return node


def _same_inputs(a: CNode, b: CNode) -> bool:
    if len(a.inputs) != len(b.inputs):
        return False
    return all(x is y or _input_key(x) == _input_key(y) for x, y in zip(a.inputs, b.inputs))


# -- types -------------------------------------------------------------------
def abstract_compatible(new: Any, old: Any,
                        proven: Optional[dict[tuple[int, int], tuple[Any, Any]]] = None) -> bool:
    """Whether a value typed ``new`` may replace one typed ``old`` (see RewriteContext.compatible).

    ``proven`` holds the pairs already found compatible (by identity; each
    entry holds its pair), which are not compared again; ``(new, old)`` is
    added when compatible."""
    if old is None or new is None:
        return old is None
    stack = [(new, old)]
    while stack:
        n, o = stack.pop()
        if proven is not None and (id(n), id(o)) in proven:
            continue
        if type(n) is not type(o):
            return False
        if isinstance(o, AScalar):
            if n.dtype != o.dtype:
                return False
        elif isinstance(o, ATensor):
            if n.dtype != o.dtype:
                return False
            if o.shape is not None and n.shape is not None:
                if len(n.shape) != len(o.shape):
                    return False
                if any(isinstance(od, int) and nd != od for nd, od in zip(n.shape, o.shape)):
                    return False
        elif isinstance(o, ATuple):
            if len(n.items) != len(o.items):
                return False
            stack.extend(zip(n.items, o.items))
        elif n != o:
            return False
    if proven is not None:
        proven[(id(new), id(old))] = (new, old)
    return True


# -- the engine ------------------------------------------------------------------
def optimize_graphs(manager: Manager, counts: Optional[Counter[str]] = None, *,
                    rules: Optional[Sequence[Rule]] = None,
                    on_round: Optional[Callable[[int], None]] = None,
                    inline_threshold: int = INLINE_THRESHOLD) -> Counter[str]:
    """Rewrite the manager's graphs to a fixed point of ``rules`` (default:
    :data:`DEFAULT_RULES`); return the counts of firings by rule name.

    ``on_round(n)`` is called after each round (1-based), e.g. to dump.
    """
    counts = Counter() if counts is None else counts
    active = list(DEFAULT_RULES) if rules is None else list(rules)
    ctx = RewriteContext(manager, counts, inline_threshold)
    pending: dict[Node, None] = {}
    # Creation order: deterministic, cheap, and mostly inputs before users
    # (any other order only costs a few revisits: users of a change are requeued).
    for g in sorted(manager.graphs, key=lambda g: g.seq):
        for node in sorted(manager.nodes.get(g, {}), key=lambda n: n.seq):
            if isinstance(node, CNode):
                pending[node] = None
    rounds = 0
    while True:
        while pending:
            rounds += 1
            if rounds > MAX_ROUNDS:
                raise IRConsistencyError(f"the optimizer did not reach a fixed point in {MAX_ROUNDS} rounds")
            current = list(pending)
            pending = {}
            for node in current:
                if isinstance(node, CNode) and manager.tracks(node):
                    _visit(node, ctx, active, pending)
            if on_round is not None:
                on_round(rounds)
        removed = remove_dead_graphs(manager)
        if removed:
            counts["dead_graph_elimination"] += removed
        # Graphs whose other uses died may now be called once: revisit those calls.
        for g in sorted(manager.graphs, key=lambda g: g.seq):
            sites = manager.graph_users(g)
            if len(sites) == 1 and isinstance(sites[0][0], CNode) and sites[0][1] == 0:
                call = sites[0][0]
                if ctx.can_inline(call):
                    pending[call] = None
        if not pending:
            return counts


def _visit(node: CNode, ctx: RewriteContext, rules: Sequence[Rule], pending: dict[Node, None]) -> None:
    manager = ctx.manager
    for rule in rules:
        ctx.rule = rule.name
        ctx.created = []
        try:
            new = rule.fn(node, ctx)
        except RuleDeclined:
            continue
        if new is None or new is node:
            continue
        former_users = [u for u, _ in manager.users.get(node, {}) if isinstance(u, CNode)]
        manager.replace(node, new)
        ctx.counts[rule.name] += 1
        for n in ctx.created:
            pending[n] = None
        if isinstance(new, CNode):
            pending[new] = None
        for u in former_users:
            pending[u] = None
        return


def run(program: "Program") -> "Program":
    """The ``optimize`` phase entry point: rewrite to a fixed point, counting rules."""
    manager = program.require_manager()
    on_round = program.round_dumper("optimize")
    optimize_graphs(manager, program.stats, on_round=on_round)
    return program


__all__ = ["DEFAULT_RULES", "Rule", "RewriteContext", "RuleDeclined", "optimize_graphs",
           "remove_dead_graphs", "run"]

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
from typing import Callable, Optional, Sequence

from anfir.errors import IRConsistencyError
from anfir.ir.manager import Manager, remove_dead_graphs
from anfir.ir.nodes import CNode, Node
from anfir.passes.inline import INLINE_THRESHOLD
from anfir.autodiff.rules import GRADIENT_RULES
from anfir.passes.optimize_rules import FINAL_RULES, SIMPLIFY_RULES, Rule
from anfir.passes.compile_state import Program
# Rules and the engine share the context; its names stay importable from here.
from anfir.passes.rewrite_context import RewriteContext, RuleDeclined, abstract_compatible


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

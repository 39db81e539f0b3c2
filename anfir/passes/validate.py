"""The ``validate`` phase: check the invariants the compiled program must meet.

* every node is typed (``.abstract`` set on parameters, CNodes and the
  constants they use);
* nothing is unresolved (no ``Symbol`` constant);
* no meta function or AD placeholder is left (``grad``, ``value_and_grad``,
  ``J``): the ``ad`` phase must have expanded them;
* every CNode has a callee and belongs to a graph the manager tracks;
* a CNode with attributes calls a primitive that declares them, and they are
  in canonical form (declaration order, no value equal to its default);
* every free variable lives in an enclosing graph (scoping);
* the manager's incremental facts (nodes, users, free variables, parents)
  agree with a fresh :class:`~anfir.ir.manager.Manager` built from scratch.

Problems are collected, not stopped at: :class:`IRConsistencyError` lists
them all, each with the source location of the node concerned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

from anfir.errors import AnfirError, IRConsistencyError
from anfir.infer.engine import UNTYPED
from anfir.ir.graph import FuncGraph
from anfir.location import Location
from anfir.ir.manager import Manager
from anfir.ir.nodes import CNode, Node, ParameterNode, ValueNode
from anfir.primitives import MetaFunction, Primitive
from anfir.runtime_values import Symbol
from anfir.passes.compile_state import Program


MAX_LISTED = 50
"""At most this many problems are spelled out in the error message."""


@dataclass(frozen=True)
class Problem:
    """One broken invariant."""

    message: str
    loc: Optional[Location]

    def render(self) -> str:
        """``file:line:col: message`` (or just the message when the place is unknown)."""
        return f"{self.loc.short()}: {self.message}" if self.loc is not None else self.message


def _where(node: Node) -> Optional[Location]:
    if node.loc is not None:
        return node.loc
    return node.graph.loc if node.graph is not None else None


def _describe(node: Node) -> str:
    owner = f"@{node.graph.name}" if node.graph is not None else "a constant"
    label = f" {node.name!r}" if node.name else ""
    kind = type(node).__name__
    if isinstance(node, CNode):
        head = node.inputs[0] if node.inputs else None
        callee = (getattr(head.value, "name", None) if isinstance(head, ValueNode) else None) or "…"
        return f"{kind}{label} ({callee}(...)) in {owner}"
    if isinstance(node, ValueNode):
        return f"constant {node.value!r}"
    return f"{kind}{label} of {owner}"


def _placeholder_name(value: Any) -> Optional[str]:
    """The name of a meta function the ``ad`` phase must have expanded (every one:
    ``grad``, ``jvp``, ``vmap``...), decided by the object's class, not its name.
    (A run-time ``J`` may remain where the differentiated function is only known at
    run time: it is an ordinary primitive with an evaluation rule.)"""
    if isinstance(value, MetaFunction):
        return value.name
    return None


def check_nodes(manager: Manager, *, require_types: bool = True) -> list[Problem]:
    """Types, resolution, placeholders, ownership and scoping of every live node."""
    problems: list[Problem] = []
    graphs = sorted(manager.graphs, key=lambda g: g.seq)
    for g in graphs:
        if not g.has_output:
            problems.append(Problem(f"graph @{g.name} has no output", g.loc))
            continue
        ancestors = set(manager.ancestors(g))
        # A function value the specializer left untyped by design (never called,
        # ill-typed for unknown arguments), and what is nested in it, has no types.
        typed = require_types and not any(a.flags.get(UNTYPED) for a in (g, *ancestors))
        outer = [fv for fv in manager.free_variables_total(g) if fv.graph is not g]
        if g in manager.roots and outer:
            problems.append(Problem(f"root graph @{g.name} has free variables "
                                    f"({_describe(outer[0])}...)", g.loc))
        for fv in outer:
            if fv.graph not in ancestors:
                problems.append(Problem(f"@{g.name} captures {_describe(fv)}, which is not in an "
                                        "enclosing graph", _where(fv)))
        seen_constants: set[ValueNode] = set()
        # Creation order is deterministic and cheaper than a dependency order.
        for node in sorted(manager.nodes.get(g, {}), key=lambda n: n.seq):
            if typed and node.abstract is None:
                problems.append(Problem(f"{_describe(node)} has no type", _where(node)))
            if isinstance(node, ParameterNode):
                continue
            if not isinstance(node, CNode):
                continue
            if not node.inputs:
                problems.append(Problem(f"{_describe(node)} has no callee", _where(node)))
                continue
            if node.graph is None or node.graph not in manager.graphs or node.graph.manager is not manager:
                problems.append(Problem(f"{_describe(node)} belongs to an unmanaged graph", _where(node)))
            if node.attrs:
                problems.extend(_check_attrs(node))
            for index, inp in enumerate(node.inputs):
                if isinstance(inp, ValueNode):
                    if inp in seen_constants:
                        continue
                    seen_constants.add(inp)
                    problems.extend(_check_constant(inp, node, index, typed))
                elif inp.graph is not g and inp.graph not in ancestors:
                    problems.append(Problem(
                        f"{_describe(node)} uses {_describe(inp)}, which is not in an enclosing graph",
                        _where(node)))
        out = g.output
        if isinstance(out, ValueNode):
            problems.extend(_check_constant(out, None, -1, typed, graph=g))
        elif out.graph is not g and out.graph not in ancestors:
            problems.append(Problem(f"graph @{g.name} returns {_describe(out)}, which is not in scope", g.loc))
    return problems


def _check_attrs(node: CNode) -> list[Problem]:
    """A call with attributes calls a primitive constant that declares them, in
    canonical form (declaration order, no default repeated)."""
    head = node.inputs[0]
    prim = head.value if isinstance(head, ValueNode) else None
    if not isinstance(prim, Primitive):
        return [Problem(f"{_describe(node)} has attributes {node.attrs!r} but does not call a "
                        "primitive", _where(node))]
    try:
        canonical = prim.canonical_attrs(node.attrs.pairs())
    except AnfirError as exc:
        return [Problem(f"{_describe(node)}: {exc.message}", _where(node))]
    if canonical.pairs() != node.attrs.pairs() or canonical != node.attrs:
        return [Problem(f"{_describe(node)}: attributes {node.attrs!r} are not in canonical form "
                        f"({canonical!r})", _where(node))]
    return []


def _check_constant(const: ValueNode, user: Optional[CNode], index: int, require_types: bool,
                    graph: Optional[FuncGraph] = None) -> list[Problem]:
    problems = []
    where = const.loc or (_where(user) if user is not None else (graph.loc if graph else None))
    value = const.value
    if isinstance(value, Symbol):
        problems.append(Problem(f"unresolved name {value.name!r}", where))
    placeholder = _placeholder_name(value)
    if placeholder is not None:
        problems.append(Problem(f"{placeholder!r} was not expanded by the ad phase", where))
    if require_types and const.abstract is None:
        problems.append(Problem(f"{_describe(const)} has no type", where))
    return problems


def graphs_reachable(roots: Iterable[FuncGraph]) -> list[FuncGraph]:
    """Every graph reachable from ``roots`` along the edges themselves (graph
    constants and the owners of free variables), in a deterministic order.

    Unlike :func:`anfir.ir.walk.reachable_graphs` it asks no manager, so it
    also works on graphs whose manager is stale or absent.
    """
    found: dict[FuncGraph, None] = dict.fromkeys(roots)
    graphs = list(found)
    seen: set[Node] = set()
    index = 0
    while index < len(graphs):
        g = graphs[index]
        index += 1
        if not g.has_output:
            continue
        stack = [g.output]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            if isinstance(node, ValueNode):
                target = node.value
                if isinstance(target, FuncGraph) and target not in found:
                    found[target] = None
                    graphs.append(target)
                continue
            owner = node.graph
            if owner is not None and owner not in found:
                found[owner] = None
                graphs.append(owner)
            if isinstance(node, CNode):
                stack.extend(reversed(node.inputs))
    return graphs


def rebuild_manager(roots: list[FuncGraph]) -> Manager:
    """A Manager computed from scratch for the graphs reachable from ``roots``.

    Managers merge when they meet (a graph has one manager), so the graphs are
    first detached from whatever manager holds them: the new one then derives
    every fact from the edges alone.  The old managers' records of those
    graphs are left stale (drop the old manager).
    """
    for g in graphs_reachable(roots):
        g.manager = None
    return Manager(roots)


def check_manager(manager: Manager) -> list[Problem]:
    """Compare the manager's incremental facts with a manager built from scratch.

    The fresh manager only reads the edges (the graphs are detached from
    ``manager`` while it is built, so the two do not merge), and the graphs
    are given back to ``manager`` afterwards: validation changes nothing.
    """
    roots = sorted(manager.roots, key=lambda g: g.seq)
    owners = {g: g.manager for g in graphs_reachable(roots)}
    owners.update({g: g.manager for g in manager.graphs})
    try:
        for g in owners:
            g.manager = None
        fresh = Manager(roots)
    finally:
        for g, owner in owners.items():
            g.manager = owner
    problems: list[Problem] = []
    for g in sorted(fresh.graphs, key=lambda g: g.seq):
        if g not in manager.graphs:
            problems.append(Problem(f"graph @{g.name} is reachable but was not managed", g.loc))
            continue
        facts = (
            ("nodes", manager.nodes[g].keys(), fresh.nodes[g].keys()),
            ("direct free variables", manager.free_variables_direct[g], fresh.free_variables_direct[g]),
            ("free variables", manager.free_variables_total(g), fresh.free_variables_total(g)),
            ("parent", manager.parent(g), fresh.parent(g)),
        )
        for label, old, new in facts:
            if old != new:
                problems.append(Problem(
                    f"the manager's {label} of @{g.name} are stale: kept {_text(old)}, "
                    f"recomputed {_text(new)}", g.loc))
        for node in sorted(fresh.nodes[g], key=lambda n: n.seq):
            old_users = manager.users.get(node)
            if old_users is None:
                problems.append(Problem(f"{_describe(node)} is live but the manager does not track it",
                                        _where(node)))
            elif old_users.keys() != fresh.users[node].keys():
                problems.append(Problem(f"the manager's users of {_describe(node)} are stale",
                                        _where(node)))
    return problems


def _text(value: Any) -> str:
    if isinstance(value, FuncGraph):
        return f"@{value.name}"
    if isinstance(value, (frozenset, set, list, dict)) or hasattr(value, "__len__"):
        return f"{len(value)} item(s)"
    return repr(value)


def validate(manager: Manager, *, require_types: bool = True, phase: str = "") -> None:
    """Raise :class:`IRConsistencyError` listing every broken invariant (``phase``
    names the phase that ran last, for the message)."""
    problems = check_nodes(manager, require_types=require_types)
    problems.extend(check_manager(manager))
    if problems:
        shown = [p.render() for p in problems[:MAX_LISTED]]
        if len(problems) > MAX_LISTED:
            shown.append(f"... and {len(problems) - MAX_LISTED} more")
        after = f" after {phase}" if phase else ""
        raise IRConsistencyError(f"{len(problems)} problem(s) in the IR{after}:\n  " + "\n  ".join(shown),
                                 problems[0].loc)


def run(program: "Program") -> "Program":
    """The ``validate`` phase entry point: check the program, then keep it unchanged."""
    validate(program.require_manager(), phase=program.last_phase)
    return program

"""``dump_dot``: Graphviz source drawing a program (see the spec's ``ir-dump.md``).

* One cluster per graph, labelled ``@name(params)``; a graph is drawn inside
  the graph its text is printed in (:mod:`anfir.printers.scopes`), so nesting
  reads like the source.
* A CNode is a small table: one input port per argument on top, the callee
  (primitive name, ``@graph``, or a dashed edge from a computed function)
  below, with the node's name and type when known.
* Parameters are ellipses; constants are small boxes next to their use (one
  per use, so they do not tie clusters together); a graph used as a value is a
  small box linked by a dotted edge to its cluster (``lhead``).
* An edge whose source belongs to another graph (a free variable) is red and
  bold; the callee edge is dashed; ``return`` is a node of each cluster.

Labels are HTML-escaped (users' strings, ``✓`` names stay UTF-8).  The text
is deterministic, and every walk is iterative.
"""

from __future__ import annotations

import html
from typing import Any, Optional, Union

import numpy as np

from anfir.abstract.values import AbstractValue
from anfir.errors import UsageError
from anfir.ir.graph import FuncGraph, Module
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.walk import toposort
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.printers.abstract_text import abstract_text
from anfir.printers.ir import dump_name
from anfir.printers.ir_constants import ConstantPrinter
from anfir.gcpause import without_gc
from anfir.printers.naming import NameAllocator
from anfir.printers.scopes import depths, discover_managed, plan_scopes

GraphOrModule = Union[FuncGraph, Module]

_LABEL_LIMIT = 40  # constants and types longer than this are shortened in pictures
_FREE = 'color="#d62728", penwidth=2.2'
_CALLEE = 'style=dashed'
_GRAPH_LINK = 'style=dotted, color="#1f77b4", arrowhead=empty'


@without_gc
def dump_dot(obj: GraphOrModule) -> str:
    """Graphviz ``dot`` source for a Module (or a graph and every graph it reaches)."""
    return _DotPrinter(obj).render()


class _DotPrinter:
    def __init__(self, obj: GraphOrModule) -> None:
        if isinstance(obj, Module):
            roots = list(dict.fromkeys(obj.graphs.values()))
        elif isinstance(obj, FuncGraph):
            roots = [obj]
        else:
            raise TypeError(f"dump_dot needs a FuncGraph or a Module, not {type(obj).__name__}")
        self.mng, graphs = discover_managed(roots)
        try:
            plan = plan_scopes(self.mng, graphs, pinned=roots)
            self.home = plan.home
            self.depth = plan.depth
        except UsageError:  # ill-scoped graphs: fall back to MindIR's parents
            self.home = {g: self.mng.parent(g) for g in graphs}
            self.depth = depths(graphs, self.home)
        self.graphs = graphs
        self.index = {g: i for i, g in enumerate(graphs)}
        alloc = NameAllocator(separator=".")
        self.gname = {g: alloc.take(dump_name(g.name)) for g in graphs}
        self.constants = ConstantPrinter(lambda g: self.gname.get(g, g.name))
        self.ids: dict[Node, str] = {}
        self.edges: list[str] = []
        self.body: dict[FuncGraph, list[str]] = {}

    # -- structure ---------------------------------------------------------------------
    def render(self) -> str:
        for g in self.graphs:
            for i, p in enumerate(g.parameters, 1):
                self.ids[p] = f"g{self.index[g]}_p{i}"
            for node in toposort(g, self.mng):
                if isinstance(node, CNode):
                    self.ids[node] = f"g{self.index[g]}_n{len(self.ids)}"
        for g in self.graphs:
            self.body[g] = self._graph_body(g)
        lines = [
            "digraph anfir {",
            '  graph [compound=true, newrank=true, rankdir=TB, fontname="Helvetica", fontsize=11];',
            '  node [fontname="Helvetica", fontsize=10];',
            '  edge [fontname="Helvetica", fontsize=9, arrowsize=0.6];',
        ]
        children: dict[Optional[FuncGraph], list[FuncGraph]] = {}
        for g in self.graphs:
            children.setdefault(self.home.get(g), []).append(g)
        # Nested clusters, written with an explicit stack (open, contents, close).
        stack: list[tuple[str, Any, int]] = [("graph", g, 1) for g in reversed(children.get(None, []))]
        while stack:
            kind, item, depth = stack.pop()
            pad = "  " * min(depth, 16)  # deep nesting is not indented further
            if kind == "close":
                lines.append(pad + "}")
                continue
            g = item
            lines.append(f"{pad}subgraph cluster_g{self.index[g]} {{")
            lines.append(f"{pad}  label=<{self._graph_label(g)}>;")
            lines.append(f'{pad}  style="rounded"; color="#7f7f7f"; fontsize=11;')
            lines.extend(pad + "  " + line for line in self.body[g])
            stack.append(("close", None, depth))
            for child in reversed(children.get(g, [])):
                stack.append(("graph", child, depth + 1))
        lines.extend("  " + e for e in self.edges)
        lines.append("}")
        return "\n".join(lines) + "\n"

    def _graph_label(self, g: FuncGraph) -> str:
        params = ", ".join(_esc(p.name or f"p{i}") for i, p in enumerate(g.parameters, 1))
        label = f"<b>@{_esc(self.gname[g])}</b>({params})"
        ret = g.flags.get("return_type")
        if ret is not None:
            label += f" -&gt; {_esc(str(ret))}"
        return label

    def _graph_body(self, g: FuncGraph) -> list[str]:
        out: list[str] = []
        gi = self.index[g]
        for p in g.parameters:
            text = _esc(p.name or "param")
            if p.abstract is not None:
                text += f"<br/><font point-size=\"8\">{_esc(self._abstract(p.abstract))}</font>"
            out.append(f'{self.ids[p]} [label=<{text}>, shape=ellipse, style=filled, '
                       f'fillcolor="#e8f0fe"];')
        self.constant_count = 0
        for node in toposort(g, self.mng):
            if isinstance(node, CNode):
                out.append(self._cnode(node, g, out))
        ret_id = f"g{gi}_ret"
        out.append(f'{ret_id} [label=<<b>return</b>>, shape=box, style="rounded,filled", '
                   f'fillcolor="#eeeeee", fontsize=9];')
        if g.has_output:
            self._input_edge(g.output, g, ret_id, out)
        return out

    def _cnode(self, node: CNode, g: FuncGraph, out: list[str]) -> str:
        node_id = self.ids[node]
        args = node.inputs[1:]
        callee = node.inputs[0]
        op = self._callee_text(callee)
        extra = ""
        if node.attrs:
            attrs = ", ".join(f"{name}={self._constant(value)}" for name, value in node.attrs.items())
            extra += f"<br/><font point-size=\"8\">{_esc(attrs)}</font>"
        if node.name:
            extra += f"<br/><font point-size=\"8\">{_esc(node.name)}</font>"
        if node.abstract is not None:
            extra += f"<br/><font point-size=\"8\" color=\"#555555\">{_esc(self._abstract(node.abstract))}</font>"
        rows = ['<table border="0" cellborder="1" cellspacing="0" cellpadding="3">']
        if args:
            cells = "".join(f'<td port="i{i}"><font point-size="7">{i}</font></td>'
                            for i in range(1, len(args) + 1))
            rows.append(f"<tr>{cells}</tr>")
        span = f' colspan="{len(args)}"' if len(args) > 1 else ""
        rows.append(f'<tr><td port="op"{span} bgcolor="#f5f5f5">{op}{extra}</td></tr>')
        rows.append("</table>")
        for i, arg in enumerate(args, 1):
            self._input_edge(arg, g, f"{node_id}:i{i}:n", out)
        if isinstance(callee, ValueNode):
            if isinstance(callee.value, FuncGraph):
                self._graph_link(f"{node_id}:op", callee.value, g)
        else:
            self._edge(self._source(callee), f"{node_id}:op", self._style(callee, g, _CALLEE))
        return f'{node_id} [shape=plaintext, label=<{"".join(rows)}>];'

    def _input_edge(self, arg: Node, g: FuncGraph, target: str, out: list[str]) -> None:
        if isinstance(arg, ValueNode):
            self.constant_count += 1
            const_id = f"g{self.index[g]}_k{self.constant_count}"
            value = arg.value
            if isinstance(value, FuncGraph):
                out.append(f'{const_id} [label=<@{_esc(self.gname.get(value, value.name))}>, '
                           f'shape=box, style="rounded", color="#1f77b4", fontsize=9, height=0.2];')
                self._graph_link(const_id, value, g)
            else:
                out.append(f'{const_id} [label=<{_esc(self._constant(value))}>, shape=box, '
                           f'style="rounded,filled", fillcolor="#fff3cd", fontsize=9, height=0.2];')
            self.edges.append(f'{const_id} -> {target} [color="#999999"];')
            return
        self._edge(self._source(arg), target, self._style(arg, g, ""))

    def _edge(self, source: str, target: str, attrs: str) -> None:
        self.edges.append(f"{source} -> {target} [{attrs}];" if attrs else f"{source} -> {target};")

    def _graph_link(self, source: str, target: FuncGraph, user: FuncGraph) -> None:
        """A dotted edge from a graph value to the target's cluster (unless it encloses the user)."""
        if target not in self.index:
            return
        current: Optional[FuncGraph] = user
        level = self.depth.get(target, 0)
        while current is not None and self.depth.get(current, 0) > level:
            current = self.home.get(current)
        if current is target:
            return  # recursion: the value is drawn inside its own cluster
        ti = self.index[target]
        self.edges.append(f"{source} -> g{ti}_ret [{_GRAPH_LINK}, lhead=cluster_g{ti}];")

    def _source(self, node: Node) -> str:
        node_id = self.ids.get(node)
        if node_id is None:
            raise TypeError(f"dump_dot: {node!r} is not part of the drawn graphs")
        return node_id

    @staticmethod
    def _style(node: Node, g: FuncGraph, base: str) -> str:
        if node.graph is not g:
            return f"{base}, {_FREE}" if base else _FREE
        return base

    def _callee_text(self, callee: Node) -> str:
        if isinstance(callee, ValueNode):
            value = callee.value
            if isinstance(value, (Primitive, MetaFunction)):
                return f"<b>{_esc(value.name)}</b>"
            if isinstance(value, FuncGraph):
                return f'<b><font color="#1f77b4">@{_esc(self.gname.get(value, value.name))}</font></b>'
            return f"<b>{_esc(self._constant(value))}</b>"
        return "<i>call</i>"

    def _constant(self, value: Any) -> str:
        if isinstance(value, np.ndarray) and value.size > 8:
            return f"Tensor[{value.dtype}, {tuple(value.shape)}]"
        try:
            text = self.constants.text(value)
        except TypeError:
            text = repr(value)
        return _shorten(text)

    def _abstract(self, value: Any) -> str:
        if not isinstance(value, AbstractValue):
            return "?"
        return _shorten(abstract_text(value, lambda g: self.gname.get(g, g.name)))


def _shorten(text: str) -> str:
    return text if len(text) <= _LABEL_LIMIT else text[:_LABEL_LIMIT - 1] + "…"


def _esc(text: str) -> str:
    """Escape for a Graphviz HTML-like label."""
    return html.escape(text, quote=True)


__all__ = ["dump_dot"]

"""``to_text``: graphs back to canonical ANF source that re-parses to the same graphs.

The output is the language of the spec (``anf-text.md``): top-level graphs are
``def``s; a nested graph is ``let name = lambda (...) ... end in`` inside the
graph it is printed in (see :mod:`anfir.printers.scopes`), placed after the
nodes it captures and before its first use; every CNode is a ``let``; calls
are printed as calls (``f(a, b)``), operator primitives as operators over
atoms (``a + b``, ``-x``, ``not c``: the parser maps them to their primitive even
before names are resolved), tuples as ``(a, b)``, constant indexing as ``t[0]``, and ``switch(c, ✓g, ✗g)()`` whose branches are used nowhere else
as ``if c then ... else ...`` (the parser makes exactly that shape of it).

Metadata (:mod:`anfir.ir.metadata`) prints as doc (``##``) and attribute
(``#@ key value``) lines: the module's first, then a blank line; a
definition's above its ``def``, a let-bound lambda's above its ``let``, a
node's above its ``let`` (a node with metadata always gets one).

Names are kept when they are legal and unambiguous; otherwise they are made
legal (``✓f`` -> ``ok_f``) and unique within their definition (``x_1``), and
unnamed nodes get ``%1``, ``%2``...  Local names never shadow a global name or
a built-in the definition uses, so the text means what the graph means.

Normalisation (documented in :mod:`anfir.printers.anf_literals`): tensor and
tuple constants print as ``array(...)`` / tuple expressions, which parse as
CNodes; the structure is otherwise reproduced exactly.
"""

from __future__ import annotations

import heapq
from typing import Any, Optional, Union

from anfir.errors import UsageError
from anfir.grammar.syntax import BY_PRIMITIVE
from anfir.ir.graph import FuncGraph, Module
from anfir.ir.manager import analyse
from anfir.ir.metadata import block_lines
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.printers.anf_literals import HELPER_NAMES, anf_literal, helpers_needed, string_literal
from anfir.gcpause import without_gc
from anfir.printers.naming import KEYWORDS, NameAllocator, anf_name
from anfir.primitives import structure
from anfir.primitives.registry import PRIMITIVES
from anfir.printers.scopes import ScopePlan, discover_managed, plan_scopes
from anfir.runtime_values import Symbol

GraphOrModule = Union[FuncGraph, Module]

_MAX_INDENT = 32  # deeper nesting is not indented further (output stays linear in size)


@without_gc
def to_text(obj: GraphOrModule, strict: bool = False) -> str:
    """Canonical ANF text of a Module, or of a graph and every graph it reaches.

    Graphs made by transformations may hold constants with no ANF spelling
    (the gradient-environment keys of AD graphs: ``Key("f:x.0")``): they are
    shown in the ``.ir`` syntax, so such text is for reading and does not
    parse; with ``strict=True`` they raise :class:`UsageError` instead.
    Everything a parsed program can contain prints as text that parses back.

    >>> import anfir
    >>> print(anfir.to_text(anfir.parse("def f(x) = x * 2 + 1")))  # doctest: +SKIP
    def f(x) =
      let %1 = mul(x, 2) in
      add(%1, 1)
    """
    return _TextPrinter(obj, strict).render()


# -- layout of one graph's body -------------------------------------------------
class _Item:
    """One binding of a graph body: a CNode's ``let``, a lambda, or an ``if``."""

    __slots__ = ("kind", "node", "graph", "switch", "then_graph", "else_graph", "deps")

    def __init__(self, kind: str, node: Optional[CNode] = None, graph: Optional[FuncGraph] = None,
                 switch: Optional[CNode] = None, then_graph: Optional[FuncGraph] = None,
                 else_graph: Optional[FuncGraph] = None) -> None:
        self.kind = kind
        self.node = node
        self.graph = graph
        self.switch = switch
        self.then_graph = then_graph
        self.else_graph = else_graph
        self.deps: list[_Item] = []


class _Body:
    """A graph's bindings in print order and how its final expression prints."""

    __slots__ = ("items", "inline_output", "output_lambda")

    def __init__(self) -> None:
        self.items: list[_Item] = []
        self.inline_output: Optional[_Item] = None
        """The output's own item, printed as the final expression instead of a ``let``."""
        self.output_lambda: Optional[FuncGraph] = None
        """A nested graph used only as the output, printed as a final ``lambda``."""


class _TextPrinter:
    def __init__(self, obj: GraphOrModule, strict: bool = False) -> None:
        self.strict = strict
        self.imports: list[str] = []
        self.metadata: dict[str, Any] = {}
        external: dict[FuncGraph, str] = {}
        if isinstance(obj, Module):
            roots: dict[FuncGraph, str] = {}
            for key, graph in obj.graphs.items():
                roots.setdefault(graph, key)
            self.imports = list(obj.imports)
            self.metadata = obj.metadata
            for key, graph in obj.imported.items():
                external.setdefault(graph, key)
            graphs = list(roots)
        elif isinstance(obj, FuncGraph):
            mng = obj.manager or analyse(obj)
            top = obj
            while mng.parent(top) is not None:
                top = mng.parent(top)  # type: ignore[assignment]
            roots = {top: top.name}
            graphs = [top]
        else:
            raise UsageError(f"to_text needs a FuncGraph or a Module, not {type(obj).__name__}")
        self.mng, printed = discover_managed(graphs, external)
        self.external = external
        self.plan: ScopePlan = plan_scopes(self.mng, printed, pinned=roots)
        self.root_names = roots
        self._scan_globals()
        self.lines: list[str] = []
        self._used_cache: Optional[dict[FuncGraph, list[FuncGraph]]] = None

    # -- global names ------------------------------------------------------------
    def _scan_globals(self) -> None:
        """Names the definitions use from outside: built-ins, symbols, imports, defs."""
        builtins: set[str] = set()
        symbols: set[str] = set()
        helpers: set[str] = set()
        mng = self.mng
        for g in self.plan.graphs:
            values: list[ValueNode] = []
            for node in mng.nodes.get(g, ()):
                inputs = node.inputs
                for index, i in enumerate(inputs):
                    if not isinstance(i, ValueNode):
                        continue
                    if (index == 0 and isinstance(i.value, Primitive)
                            and _operator(i.value, len(inputs) - 1) is not None):
                        continue  # printed as an operator: its name is not needed
                    values.append(i)
            if g.has_output and isinstance(g.output, ValueNode):
                values.append(g.output)
            for vn in values:
                v = vn.value
                if isinstance(v, (Primitive, MetaFunction)):
                    builtins.add(v.name)
                elif isinstance(v, Symbol):
                    symbols.add(v.name)
                elif not isinstance(v, FuncGraph):
                    helpers |= helpers_needed(v)
        def_taken = set(KEYWORDS) | builtins | helpers | set(self.external.values())
        alloc = NameAllocator(def_taken, preferred=self.root_names.values())
        self.graph_names: dict[FuncGraph, str] = dict(self.external)
        for g in self.plan.defs:
            preferred = self.root_names.get(g)
            self.graph_names[g] = alloc.take(anf_name(preferred if preferred else g.name, "f"))
        self.local_taken = (def_taken | symbols | set(HELPER_NAMES)
                            | set(self.graph_names.values()))

    # -- rendering -----------------------------------------------------------------
    def render(self) -> str:
        if self.metadata:
            # The module's header: its doc and attribute lines, then a blank line
            # (which is what tells them from those of the first definition).
            self.lines.extend(block_lines(self.metadata.get("doc"), self.metadata))
            self.lines.append("")
        for path in self.imports:
            self.lines.append(f"import {string_literal(str(path))}")
        if self.imports and self.plan.defs:
            self.lines.append("")
        for index, top in enumerate(self.plan.defs):
            if index:
                self.lines.append("")
            self._render_def(top)
        return "\n".join(self.lines) + ("\n" if self.lines else "")

    def _render_def(self, top: FuncGraph) -> None:
        scope = self.plan.scope_order(top)
        bodies = {g: self._layout(g) for g in scope}
        preferred: set[str] = set()
        for g in scope:
            preferred.update(anf_name(p.name, "x") for p in g.parameters)
            # Only let-bound lambdas print their graph's name (branches of an
            # ``if`` do not, and their MindIR names can be long: ✓✗✗f).
            preferred.update(anf_name(i.graph.name, "f") for i in bodies[g].items
                             if i.kind == "lambda" and i.graph is not None)
            for node in self.mng.nodes.get(g, ()):
                if isinstance(node, CNode) and node.name:
                    preferred.add(anf_name(node.name))
        self.alloc = NameAllocator(self.local_taken, preferred - self.local_taken)
        self.names: dict[Node, str] = {}
        self.bodies = bodies
        header = f"def {self.graph_names[top]}({self._params(top)})"
        ret = top.flags.get("return_type")
        if ret is not None:
            header += f" -> {ret}"
        self.lines.extend(_graph_block(top))
        self.lines.append(header + " =")
        self._emit(top, 1)

    def _params(self, g: FuncGraph) -> str:
        parts = []
        for p in g.parameters:
            name = self.alloc.take(anf_name(p.name, "x"))
            self.names[p] = name
            parts.append(f"{name}: {p.annotation}" if p.annotation is not None else name)
        return ", ".join(parts)

    def _local_graph_name(self, g: FuncGraph) -> str:
        name = self.alloc.take(anf_name(g.name, "f"))
        self.graph_names[g] = name
        return name

    # The emitter walks bodies with an explicit task stack (nesting can be deep).
    def _emit(self, top: FuncGraph, indent: int) -> None:
        tasks: list[tuple] = [("body", top, indent, None)]
        while tasks:
            task = tasks.pop()
            kind = task[0]
            if kind == "line":
                _, ind, text = task
                self.lines.append(_pad(ind) + text)
            elif kind == "body":
                _, g, ind, tail = task
                body = self.bodies[g]
                todo: list[tuple] = [("item", item, ind) for item in body.items]
                todo.append(("final", g, ind, tail))
                tasks.extend(reversed(todo))
            elif kind == "item":
                tasks.extend(reversed(self._item_tasks(task[1], task[2])))
            elif kind == "final":
                _, g, ind, tail = task
                tasks.extend(reversed(self._final_tasks(g, ind, tail)))
            elif kind == "lambda_head":
                _, g, ind, prefix, name_it = task
                if name_it:
                    prefix = f"let {self._local_graph_name(g)} = "
                self.lines.append(_pad(ind) + f"{prefix}lambda ({self._params(g)})")

    def _item_tasks(self, item: _Item, ind: int) -> list[tuple]:
        if item.kind == "node":
            node = item.node
            assert node is not None
            expr = self._ascribed(node) or self._expr(node)
            name = self._bind(node)
            return [*_note_tasks(_node_block(node), ind),
                    ("line", ind, f"let {name}{self._ann(node)} = {expr} in")]
        if item.kind == "lambda":
            g = item.graph
            assert g is not None
            return [*_note_tasks(_graph_block(g), ind),
                    ("lambda_head", g, ind, "", True), ("body", g, ind + 1, None),
                    ("line", ind, "end in")]
        # an ``if``: bind the call's name before the branches are printed
        node = item.node
        assert node is not None
        name = self._bind(node)
        return [*_note_tasks(_node_block(node), ind),
                *self._if_tasks(item, ind, f"let {name}{self._ann(node)} = ", " in")]

    def _final_tasks(self, g: FuncGraph, ind: int, tail: Optional[str]) -> list[tuple]:
        body = self.bodies[g]
        suffix = tail or ""
        if body.output_lambda is not None:
            lam = body.output_lambda
            return [("lambda_head", lam, ind, "", False), ("body", lam, ind + 1, None),
                    ("line", ind, "end" + suffix)]
        item = body.inline_output
        if item is not None and item.kind == "if":
            return self._if_tasks(item, ind, "", suffix)
        if item is not None:
            assert item.node is not None
            return [("line", ind, self._expr(item.node) + suffix)]
        return [("line", ind, self._atom(g.output) + suffix)]

    def _if_tasks(self, item: _Item, ind: int, head: str, tail: str) -> list[tuple]:
        switch = item.switch
        assert switch is not None and item.then_graph is not None and item.else_graph is not None
        cond = self._atom(switch.inputs[1])
        then_simple = self._simple_branch(item.then_graph)
        else_simple = self._simple_branch(item.else_graph)
        text = f"{head}if {cond} then "
        tasks: list[tuple] = []
        if then_simple is not None:
            text += then_simple + " else "
        else:
            tasks.append(("line", ind, text + "("))
            tasks.append(("body", item.then_graph, ind + 1, None))
            text = ") else "
        if else_simple is not None:
            tasks.append(("line", ind, text + else_simple + tail))
        else:
            tasks.append(("line", ind, text + "("))
            tasks.append(("body", item.else_graph, ind + 1, None))
            tasks.append(("line", ind, ")" + tail))
        return tasks

    def _simple_branch(self, g: FuncGraph) -> Optional[str]:
        """The branch as one line (an atom or one operation) when its body has nothing else."""
        body = self.bodies[g]
        if body.items or body.output_lambda is not None:
            return None
        item = body.inline_output
        if item is None:
            return self._atom(g.output)
        if item.kind == "node" and item.node is not None:
            return self._expr(item.node)
        return None

    def _bind(self, node: CNode) -> str:
        name = self.alloc.take(anf_name(node.name)) if node.name else self.alloc.fresh()
        self.names[node] = name
        return name

    @staticmethod
    def _ann(node: Node) -> str:
        return f": {node.annotation}" if node.annotation is not None else ""

    def _ascribed(self, node: CNode) -> Optional[str]:
        """The operand of an annotated ``identity(x)``, which the parser makes of
        ``let y: T = x`` (an annotated alias): printed back as ``x``."""
        if node.annotation is None or len(node.inputs) != 2:
            return None
        callee = node.inputs[0]
        if (isinstance(callee, ValueNode) and isinstance(callee.value, Primitive)
                and callee.value is structure.identity):
            return self._atom(node.inputs[1])
        return None

    def _expr(self, node: CNode) -> str:
        """A CNode as an expression over atoms (attributes as keyword arguments)."""
        callee = node.inputs[0]
        args = node.inputs[1:]
        if node.attrs:
            items = [self._atom(a) for a in args]
            items.extend(f"{name}={anf_literal(value, self._graph_ref, self.strict)}"
                         for name, value in node.attrs.items())
            return f"{self._atom(callee)}({', '.join(items)})"
        if isinstance(callee, ValueNode) and isinstance(callee.value, Primitive):
            prim = callee.value.name
            operator = _operator(callee.value, len(args))
            if operator is not None:
                # Infix: the parser maps operators straight to their primitive
                # (resolved or not) and nothing can shadow them.
                if len(args) == 2:
                    return f"{self._operand(args[0])} {operator} {self._operand(args[1])}"
                if not _is_number(args[0]):  # ``-2`` would read back as the constant -2
                    return f"{operator}{self._operand(args[0])}"
            if prim == "make_tuple":
                inner = ", ".join(self._atom(a) for a in args)
                return f"({inner},)" if len(args) == 1 else f"({inner})"
            if prim == "tuple_getitem" and len(args) == 2:
                target, index = args
                if (isinstance(index, ValueNode) and type(index.value) is int and index.value >= 0
                        and not isinstance(target, ValueNode)):
                    return f"{self._atom(target)}[{index.value}]"
        return f"{self._atom(callee)}({', '.join(self._atom(a) for a in args)})"

    def _operand(self, node: Node) -> str:
        """An atom as an operator's operand (negative numbers in parentheses)."""
        text = self._atom(node)
        return f"({text})" if text.startswith("-") else text

    def _atom(self, node: Node) -> str:
        if isinstance(node, ValueNode):
            return anf_literal(node.value, self._graph_ref, self.strict)
        name = self.names.get(node)
        if name is None:
            owner = node.graph.name if node.graph is not None else "?"
            raise UsageError(f"cannot print a use of {node!r}: it is not in scope "
                             f"(a node of @{owner} used outside it)")
        return name

    def _graph_ref(self, g: FuncGraph) -> str:
        name = self.graph_names.get(g)
        if name is None:
            raise UsageError(f"cannot print a use of @{g.name} outside the graph it is local to")
        return name

    # -- layout -----------------------------------------------------------------
    def _layout(self, g: FuncGraph) -> _Body:
        """Order the bindings of ``g``: dependencies first, output last."""
        mng = self.mng
        plan = self.plan
        body = _Body()
        cnodes = sorted((n for n in mng.nodes.get(g, ()) if isinstance(n, CNode)), key=_seq)
        node_item: dict[Node, _Item] = {}
        graph_item: dict[FuncGraph, _Item] = {}
        items: list[_Item] = []
        for node in cnodes:
            branches = self._if_pattern(node, g)
            if branches is not None:
                switch, a, b = branches
                if_item = _Item("if", node=node, switch=switch, then_graph=a, else_graph=b)
                node_item[node] = node_item[switch] = if_item
                graph_item[a] = graph_item[b] = if_item
        for node in cnodes:
            item = node_item.get(node)
            if item is None:
                item = node_item[node] = _Item("node", node=node)
            elif item.node is not node:
                continue  # the switch of an ``if``: printed by its call's item
            items.append(item)
        output = g.output if g.has_output else None
        for child in plan.children.get(g, ()):
            if child in graph_item:
                continue
            if (isinstance(output, ValueNode) and output.value is child
                    and mng.graph_users(child) == [(g, -1)]):
                body.output_lambda = child
                continue
            item = _Item("lambda", graph=child)
            graph_item[child] = item
            items.append(item)
        self._dependencies(g, items, node_item, graph_item)
        # The output's own CNode becomes the final expression when nothing else needs it.
        if isinstance(output, CNode) and output.graph is g:
            users = mng.users.get(output, {})
            if (not output.name and output.annotation is None and output not in g.node_meta
                    and list(users) == [(g, -1)]):
                body.inline_output = node_item[output]
        if body.inline_output is not None:
            items.remove(body.inline_output)
        body.items = _creation_order(items, self._item_key)
        return body

    def _item_key(self, item: _Item) -> int:
        """Creation order of what the item prints (the parser creates in source order)."""
        if item.node is not None:
            return item.node.seq
        holders = self.mng.graph_value_nodes.get(item.graph, {})  # type: ignore[arg-type]
        return min((h.seq for h in holders), default=0)

    def _if_pattern(self, call: CNode, g: FuncGraph) -> Optional[tuple[CNode, FuncGraph, FuncGraph]]:
        """``switch(c, ✓g, ✗g)()`` whose branches are used only there -> (switch, ✓g, ✗g)."""
        if len(call.inputs) != 1:
            return None
        switch = call.inputs[0]
        if not (isinstance(switch, CNode) and switch.graph is g and len(switch.inputs) == 4):
            return None
        head = switch.inputs[0]
        if not (isinstance(head, ValueNode) and isinstance(head.value, Primitive)
                and head.value is structure.switch):
            return None
        a, b = switch.inputs[2], switch.inputs[3]
        if not (isinstance(a, ValueNode) and isinstance(b, ValueNode)
                and isinstance(a.value, FuncGraph) and isinstance(b.value, FuncGraph)):
            return None
        ga, gb = a.value, b.value
        mng = self.mng
        home = self.plan.home
        if ga is gb or ga.parameters or gb.parameters:
            return None
        if home.get(ga) is not g or home.get(gb) is not g:
            return None
        if list(mng.users.get(switch, {})) != [(call, 0)]:
            return None
        if mng.graph_users(ga) != [(switch, 2)] or mng.graph_users(gb) != [(switch, 3)]:
            return None
        return switch, ga, gb

    def _dependencies(self, g: FuncGraph, items: list[_Item], node_item: dict[Node, _Item],
                      graph_item: dict[FuncGraph, _Item]) -> None:
        mng = self.mng
        home = self.plan.home

        def local(node: Node) -> Optional[_Item]:
            if isinstance(node, CNode) and node.graph is g:
                return node_item.get(node)
            if isinstance(node, ValueNode) and isinstance(node.value, FuncGraph):
                return graph_item.get(node.value)
            return None

        for item in items:
            deps: list[Optional[_Item]] = []
            if item.kind == "node":
                assert item.node is not None
                deps.extend(local(i) for i in item.node.inputs)
                inner: list[FuncGraph] = []
            elif item.kind == "if":
                assert item.switch is not None
                deps.append(local(item.switch.inputs[1]))
                inner = [item.then_graph, item.else_graph]  # type: ignore[list-item]
            else:
                assert item.graph is not None
                inner = [item.graph]
            for sub in inner:
                # Nodes of g that the nested graph captures must be bound first ...
                deps.extend(local(n) for n in mng.free_variables_total(sub) if n.graph is g)
                # ... and so must sibling lambdas used anywhere inside it.
                for used in self._graphs_used_within(sub):
                    if home.get(used) is g:
                        deps.append(graph_item.get(used))
            seen: set[int] = set()
            for dep in deps:
                if dep is not None and dep is not item and id(dep) not in seen:
                    seen.add(id(dep))
                    item.deps.append(dep)

    def _graphs_used_within(self, sub: FuncGraph) -> list[FuncGraph]:
        """Graphs referenced from ``sub`` or anything printed inside it."""
        if self._used_cache is None:
            self._used_cache = self._compute_used_within()
        return self._used_cache.get(sub, [])

    def _compute_used_within(self) -> dict[FuncGraph, list[FuncGraph]]:
        """For each printed graph, the nested graphs its print subtree refers to.

        A graph ``t`` nested in ``L`` is only used inside ``L``'s text (a closure
        needs ``L``'s nodes; a closed graph is placed where all its uses are),
        so a reference from ``h`` to ``t`` matters to the graphs on ``h``'s
        print chain below ``L``: the lambda of ``L`` containing ``h`` must be
        printed after ``t``'s.
        """
        home = self.plan.home
        result: dict[FuncGraph, dict[FuncGraph, None]] = {}
        for h in self.plan.graphs:
            for t in self.mng.graphs_used.get(h, ()):
                target_home = home.get(t)
                if target_home is None:
                    continue
                b: Optional[FuncGraph] = h
                chain: list[FuncGraph] = []
                while b is not None and b is not target_home:
                    chain.append(b)
                    b = home[b]
                if b is None:
                    raise UsageError(f"cannot print @{h.name}: it uses @{t.name}, which is "
                                     f"local to @{target_home.name}")
                for c in chain:
                    result.setdefault(c, {})[t] = None
        return {g: list(v) for g, v in result.items()}


_SPELLING = {key: op.spelling for key, op in BY_PRIMITIVE.items()}
"""(primitive name, argument count) -> its operator's spelling (``("add", 2)`` -> ``+``,
``("logical_not", 1)`` -> ``not ``): the operator table of
:mod:`anfir.grammar.syntax`."""


def _operator(prim: Primitive, nargs: int) -> Optional[str]:
    """The operator spelling of ``prim`` applied to ``nargs`` arguments, if it has one."""
    spelling = _SPELLING.get((prim.name, nargs))
    if spelling is None:
        return None
    if PRIMITIVES.get(prim.name) is not prim:
        return None  # not the registered primitive: print it by name
    return spelling


def _is_number(node: Node) -> bool:
    return (isinstance(node, ValueNode) and isinstance(node.value, (int, float))
            and not isinstance(node.value, bool))


def _creation_order(items: list[_Item], key: Any) -> list[_Item]:
    """Items after their dependencies, the earliest-created ready item first (Kahn)."""
    position = {id(item): i for i, item in enumerate(items)}
    waiting = {id(item): 0 for item in items}
    dependents: dict[int, list[_Item]] = {}
    for item in items:
        for dep in item.deps:
            if id(dep) in position:
                waiting[id(item)] += 1
                dependents.setdefault(id(dep), []).append(item)
    ready = [(key(item), position[id(item)], item) for item in items if waiting[id(item)] == 0]
    heapq.heapify(ready)
    order: list[_Item] = []
    while ready:
        _, _, item = heapq.heappop(ready)
        order.append(item)
        for user in dependents.get(id(item), ()):
            waiting[id(user)] -= 1
            if waiting[id(user)] == 0:
                heapq.heappush(ready, (key(user), position[id(user)], user))
    if len(order) != len(items):
        stuck = [item for item in items if waiting[id(item)] > 0]
        blocker = next(dep for dep in stuck[0].deps if waiting.get(id(dep), 0) > 0)
        raise UsageError(_cycle_message(stuck[0], blocker))
    return order


def _cycle_message(item: _Item, dep: _Item) -> str:
    def what(i: _Item) -> str:
        if i.graph is not None:
            return f"@{i.graph.name}"
        return repr(i.node)

    return (f"cannot print as ANF text: {what(item)} and {what(dep)} need each other "
            "(mutually recursive local functions have no ANF spelling; use dump_ir)")


def _graph_block(g: FuncGraph) -> list[str]:
    """The doc and attribute lines written before a definition or a let-bound lambda."""
    meta = g.flags.get("meta")
    return block_lines(g.flags.get("doc"), meta if isinstance(meta, dict) else {})


def _node_block(node: CNode) -> list[str]:
    """The doc and attribute lines written before a node's ``let``."""
    graph = node.graph
    meta = graph.node_meta.get(node) if graph is not None else None
    return block_lines(meta.get("doc"), meta) if meta else []


def _note_tasks(lines: list[str], ind: int) -> list[tuple]:
    return [("line", ind, line) for line in lines]


def _pad(indent: int) -> str:
    return "  " * min(indent, _MAX_INDENT)


def _seq(node: Node) -> int:
    return node.seq


__all__ = ["to_text"]

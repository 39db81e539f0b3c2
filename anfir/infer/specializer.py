"""Specialization: one clone of a graph per signature, then call sites redirected.

:class:`CloneProvider` gives the inference engine a fresh clone of a graph's
scope for each (graph, signature) — the user's graphs are only read.  A
*template* is what specs are cloned from: a user graph, or a nested graph
inside a spec's clone (its free variables point into that spec, so each
closure is typed in the context of the specialization that creates it).  Node
orders and scopes of the user's graphs come from their manager once; those of
clones are carried over through the cloner's maps, so no manager is involved
until the end.  Every constant node is copied too, so typing never writes to a
node the user's graphs share.

:meth:`CloneProvider.finalize` turns the inference result into the
specialized program:

1. live specs are those reachable from the entry through the calls they made;
2. a ``switch`` whose condition is a known bool is replaced by the chosen
   branch (the branch not taken disappears);
3. a call whose callee is a graph constant is redirected to the spec for its
   arguments' signature;
4. ``partial(@g, a...)`` whose value is only called (directly, or by a graph it
   is passed to) names the spec of ``g`` its calls need, copied once per spec
   when they need several; any other use of a graph as a value is redirected
   to the graph's only live spec; a graph used as a value with several
   signatures (or never called) stays an untyped generic copy (see docs);
5. ``GraphFn`` atoms inside abstract values are rewritten the same way, and
   every live spec gets ``graph.abstract = GraphSig(params, out)``.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any, Callable, Generator, Optional, Sequence

from anfir.infer.engine import (MAX_SIGNATURES, UNTYPED, Engine, Provider, Request, Spec,
                                set_parameters)
from anfir.abstract.lattice import map_graphs, widen
from anfir.abstract.typeann import abstract_from_annotation
from anfir.abstract.values import AAny, AFunction, AScalar, GraphFn, GraphSig
from anfir.errors import AnfirError, InferenceError
from anfir.ir.clone import Cloner
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager, manage
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.walk import reachable_graphs, toposort
from anfir.primitives import structure


class _Info:
    __slots__ = ("order", "scope", "private")

    def __init__(self, order: list[Node], scope: list[FuncGraph], private: bool) -> None:
        self.order = order
        self.scope = scope
        self.private = private


class _NodeTable:
    """The part of the Manager interface that :class:`Cloner` reads (``nodes.get``)."""

    def __init__(self, provider: "CloneProvider") -> None:
        self.nodes = self
        self._provider = provider

    def get(self, graph: FuncGraph, default: object = ()) -> list[Node]:
        """``graph``'s own nodes."""
        return self._provider.info(graph).order


class CloneProvider(Provider):
    """Specs are clones of templates; see the module docstring."""

    def __init__(self) -> None:
        self._info: dict[FuncGraph, _Info] = {}
        self.cache: dict[tuple[FuncGraph, tuple], Spec] = {}
        self.spec_of_graph: dict[FuncGraph, Spec] = {}
        self.enclosing_of: dict[FuncGraph, Spec] = {}
        self.counts: Counter[FuncGraph] = Counter()
        self.generic_specs: dict[FuncGraph, Optional[Spec]] = {}
        self.serial = 0
        self._table = _NodeTable(self)

    # -- graph facts ---------------------------------------------------------------------
    def info(self, graph: FuncGraph) -> _Info:
        """Order and scope of ``graph`` (a user graph is read through its manager)."""
        found = self._info.get(graph)
        if found is None:
            mng = graph.manager if graph.manager is not None else manage(graph)
            found = _Info(toposort(graph, mng), list(mng.scope(graph)), False)
            self._info[graph] = found
        return found

    def template_of(self, graph: FuncGraph) -> FuncGraph:
        """The template a graph stands for (a spec's graph stands for its template)."""
        spec = self.spec_of_graph.get(graph)
        return spec.template if spec is not None else graph

    def clone(self, template: FuncGraph) -> tuple[FuncGraph, list[FuncGraph]]:
        """A private copy of ``template``'s scope, constants included."""
        scope = self.info(template).scope
        inside = set(scope)
        seed: dict[Node, Node] = {}

        def fresh(node: Node) -> None:
            if isinstance(node, ValueNode) and node not in seed:
                if isinstance(node.value, FuncGraph) and node.value in inside:
                    return  # the cloner maps these to the copied graph
                copy = ValueNode(node.value, node.loc, node.name)
                copy.annotation = node.annotation
                seed[node] = copy

        for g in scope:
            for node in self.info(g).order:
                for inp in node.inputs:
                    fresh(inp)
            if g.has_output:
                fresh(g.output)
        cloner = Cloner(self._table, scope, node_map=seed, keep_types=False)  # type: ignore[arg-type]
        copies = []
        for g in scope:
            new = cloner.graph_map[g]
            new.abstract = None
            src = self.info(g)
            self._info[new] = _Info([cloner.node_map[n] for n in src.order],
                                    [cloner.graph_map[k] for k in src.scope], True)
            copies.append(new)
        return cloner.graph_map[template], copies

    # -- specs --------------------------------------------------------------------------------
    def spec_for(self, graph: FuncGraph, sig: tuple, site: Optional[CNode]) -> Spec:
        """The cached spec of ``graph``'s template for ``sig``, else a new clone."""
        template = self.template_of(graph)
        key = (template, sig)
        spec = self.cache.get(key)
        if spec is not None:
            return spec
        self.counts[template] += 1
        if self.counts[template] > MAX_SIGNATURES:
            raise InferenceError(
                f"inference does not terminate for {template.name} (signatures keep growing: "
                f"the latest is ({', '.join(str(a) for a in sig)}))",
                site.loc if site is not None else template.loc)
        new, copies = self.clone(template)
        self.serial += 1
        enclosing = self.enclosing_of.get(template)
        binding = dict(enclosing.binding) if enclosing is not None else {}
        spec = Spec(template, sig, new, self._info[new].order, enclosing, binding, self.serial)
        for c in copies:
            if c is not new:
                self.enclosing_of[c] = spec
        set_parameters(new, sig, binding, site)
        self.cache[key] = spec
        self.spec_of_graph[new] = spec
        return spec

    def _generic(self, engine: Engine, template: FuncGraph) -> Optional[Spec]:
        """A spec of ``template`` for unknown arguments (annotations where given): the type of a
        function value that is never called, or called with several signatures."""
        spec = self.generic_specs.get(template)
        if spec is not None or template in self.generic_specs:
            return spec
        binding: dict = {}
        sig = tuple(abstract_from_annotation(p.annotation, binding) if p.annotation is not None
                    else AAny() for p in template.parameters)

        def root() -> Generator[Request, Any, Spec]:
            found, _ = yield ("call", template, sig, None)
            return found

        try:
            spec = engine.drive(root())
        except AnfirError:
            spec = None  # code that is never called may still be ill-typed: leave it untyped
        self.generic_specs[template] = spec
        return spec

    def _partial_targets(self, live: dict[Spec, None], resolve: Callable[[Node], Node],
                         in_context: Callable[[Optional[Spec], FuncGraph], Optional[FuncGraph]]
                         ) -> dict[CNode, FuncGraph]:
        """Specialize each ``partial(@g, a...)`` whose value is only ever called for the
        signatures of its calls: map every such node to the spec of ``g`` it must name.

        A graph used as a value with several signatures otherwise gets one generic
        (untyped, ``Any``) version, and the ``ad`` phase cannot type the transform of
        a generic graph for two signatures (``partial(f, p)(y) + partial(f, p)(x)``
        with ``y`` an integer and ``x`` a float inside ``grad``).  The signature a
        call of a partial value needs is the bound arguments' types followed by the
        call's, exactly as the engine typed it (``PartialFn``), so such a ``partial``
        can name its spec the way a direct call does.  A ``partial`` whose calls need
        several specs (``let k = partial(f, p) in k(y) + k(x)``) is copied, one copy
        per spec, each call using its own (the copies share the bound arguments and
        are placed right after the original in their graph's order).  A partial
        passed to a direct call of a graph names the spec that call (and what it
        calls) needed, as a graph passed there does (``in_context``).

        The value may be used only by calls in its own graph: a use anywhere else
        (an output, a free variable of a nested graph, whose typing may be generic)
        leaves the node to the general rule.  Every graph that could use it — the
        live specs and the graphs nested in them — is scanned once.
        """

        partial = structure.partial

        def graph_partial(node: Node) -> bool:
            if not (isinstance(node, CNode) and len(node.inputs) >= 2):
                return False
            head, fn = resolve(node.inputs[0]), node.inputs[1]
            return (isinstance(head, ValueNode) and head.value is partial
                    and isinstance(fn, ValueNode) and isinstance(fn.value, FuncGraph))

        # partial node -> (user, input index, the spec it needs) for each use, in order.
        needed: dict[CNode, list[tuple[CNode, int, Optional[Spec]]]] = {}
        escapes: set[Node] = set()
        scanned: set[FuncGraph] = set()
        for s in live:
            for g in self.info(s.graph).scope:
                if g in scanned:
                    continue
                scanned.add(g)
                own = self.spec_of_graph.get(g) in live
                for node in self.info(g).order:
                    if not isinstance(node, CNode):
                        continue
                    for i, raw in enumerate(node.inputs):
                        inp = resolve(raw)
                        if not graph_partial(inp):
                            continue
                        if not own or inp.graph is not g:
                            escapes.add(inp)
                            continue
                        assert isinstance(inp, CNode)
                        fn = inp.inputs[1].value  # type: ignore[attr-defined]
                        spec = None
                        if i == 0:  # called: the spec for the bound and the given arguments
                            spec = self._spec_of_call(fn, [*inp.inputs[2:], *node.inputs[1:]])
                        else:  # passed to a graph: the spec that call reaches
                            head = resolve(node.inputs[0])
                            if isinstance(head, ValueNode) and isinstance(head.value, FuncGraph):
                                callee = self._spec_of_call(head.value, node.inputs[1:])
                                found = in_context(callee, fn) if callee in live else None
                                spec = self.spec_of_graph.get(found) if found is not None else None
                        needed.setdefault(inp, []).append((node, i, spec if spec in live else None))
                if g.has_output:
                    escapes.add(resolve(g.output))
        result: dict[CNode, FuncGraph] = {}
        added: dict[FuncGraph, dict[CNode, list[CNode]]] = {}
        for node, calls in needed.items():
            if node in escapes or any(spec is None for _, _, spec in calls):
                continue
            copies: dict[Spec, CNode] = {}
            for call, index, spec in calls:
                assert spec is not None
                copy = copies.get(spec)
                if copy is None:
                    if not copies:
                        copy = node  # the first spec keeps the original node
                    else:
                        copy = CNode(node.graph, node.inputs, node.loc, node.name, node.attrs)
                        copy.annotation = node.annotation
                        copy.abstract = node.abstract
                        added.setdefault(node.graph, {}).setdefault(node, []).append(copy)
                    copies[spec] = copy
                    result[copy] = spec.graph
                if copy is not node:  # (an unmanaged private node: no manager to notify)
                    call._inputs = (*call.inputs[:index], copy, *call.inputs[index + 1:])
        for g, after in added.items():
            order: list[Node] = []
            for n in self.info(g).order:
                order.append(n)
                order.extend(after.get(n, ()))  # type: ignore[call-overload]
            self.info(g).order[:] = order  # the spec shares this list
        return result

    def _spec_of_call(self, graph: FuncGraph, args: Sequence[Node]) -> Optional[Spec]:
        """The spec a call of ``graph`` with these (typed) arguments used, if any."""
        if any(a.abstract is None for a in args):
            return None
        return self.cache.get((self.template_of(graph), tuple(widen(a.abstract) for a in args)))

    # -- the specialized program -----------------------------------------------------------------
    def finalize(self, engine: Engine, entry: Spec) -> FuncGraph:
        """Rewrite the live specs into the specialized program; return the entry graph."""

        switch = structure.switch
        live: dict[Spec, None] = {}
        live_graphs: set[FuncGraph] = set()
        by_template: dict[FuncGraph, list[Spec]] = {}
        fold: dict[Node, Node] = {}

        def add_live(root: Spec) -> None:
            work = [root]
            while work:
                s = work.pop()
                if s in live:
                    continue
                live[s] = None
                live_graphs.add(s.graph)
                by_template.setdefault(s.template, []).append(s)
                work.extend(reversed(s.calls))
                for node in s.order:
                    if isinstance(node, CNode) and node.is_apply(switch) and len(node.inputs) == 4:
                        cond = node.inputs[1].abstract
                        if isinstance(cond, AScalar) and isinstance(cond.value, bool):
                            fold[node] = node.inputs[2] if cond.value else node.inputs[3]

        add_live(entry)
        final: dict[FuncGraph, FuncGraph] = {}

        def global_final_of(graph: FuncGraph) -> FuncGraph:
            hit = final.get(graph)
            if hit is not None:
                return hit
            spec = self.spec_of_graph.get(graph)
            if spec is not None and spec in live:
                result = graph
            else:
                template = spec.template if spec is not None else graph
                specs = by_template.get(template, [])
                if len(specs) == 1:
                    result = specs[0].graph
                else:
                    generic = self._generic(engine, template)
                    if generic is not None:
                        add_live(generic)
                        result = generic.graph
                    elif self.info(template).private:
                        result = template
                        result.flags[UNTYPED] = True
                    else:
                        result, _ = self.clone(template)  # untyped copy
                        result.flags[UNTYPED] = True
            final[graph] = result
            return result

        # A graph used as a value with several signatures: where the value flows into
        # one call, use the spec that call (and what it calls) needed.
        def is_multi(template: FuncGraph) -> bool:
            return len(by_template.get(template, ())) > 1

        reach_memo: dict[Spec, dict[FuncGraph, list[Spec]]] = {}

        def in_context(spec: Optional[Spec], graph: FuncGraph) -> Optional[FuncGraph]:
            if spec is None:
                return None
            template = self.template_of(graph)
            if not is_multi(template):
                return None
            reach = reach_memo.get(spec)
            if reach is None:
                reach = {}
                visited: set[Spec] = set()
                stack = [spec]
                while stack:
                    x = stack.pop()
                    if x in visited:
                        continue
                    visited.add(x)
                    if is_multi(x.template):
                        reach.setdefault(x.template, []).append(x)
                    stack.extend(x.calls)
                reach_memo[spec] = reach
            found = reach.get(template, [])
            return found[0].graph if len(found) == 1 else None

        value_copies: dict[tuple[ValueNode, FuncGraph], ValueNode] = {}

        def graph_value(node: ValueNode, target: FuncGraph) -> ValueNode:
            if target is node.value:
                return node
            key = (node, target)
            copy = value_copies.get(key)
            if copy is None:
                copy = ValueNode(target, node.loc, node.name)
                copy.annotation = node.annotation
                copy.abstract = AFunction(frozenset({GraphFn(target)}))
                value_copies[key] = copy
            return copy

        def resolve(node: Node) -> Node:
            while node in fold:
                node = fold[node]
            return node

        partial_target = self._partial_targets(live, resolve, in_context)

        graphs: list[FuncGraph] = []
        seen: set[FuncGraph] = set()
        queue = deque([entry.graph])
        while queue:
            g = queue.popleft()
            if g in seen:
                continue
            seen.add(g)
            graphs.append(g)
            typed = g in live_graphs
            here = self.spec_of_graph.get(g) if typed else None
            for node in self.info(g).order:
                if not isinstance(node, CNode):
                    continue
                inputs = [resolve(i) for i in node.inputs]
                callee: Optional[Spec] = None
                for i, inp in enumerate(inputs):
                    if not (isinstance(inp, ValueNode) and isinstance(inp.value, FuncGraph)):
                        continue
                    target = None
                    if i == 0 and typed:
                        sig = tuple(widen(a.abstract) for a in inputs[1:])
                        spec = self.cache.get((self.template_of(inp.value), sig))
                        if spec is not None and spec in live:
                            callee = spec
                            target = spec.graph
                    if target is None and i == 1 and node in partial_target:
                        target = partial_target[node]
                    if target is None and i > 0:
                        target = in_context(callee, inp.value)
                    if target is None:
                        target = in_context(here, inp.value) or global_final_of(inp.value)
                    inputs[i] = graph_value(inp, target)
                    queue.append(target)
                if any(a is not b for a, b in zip(inputs, node.inputs)):
                    node._inputs = tuple(inputs)  # unmanaged private node: no manager to notify
            if g.has_output:
                out = resolve(g.output)
                if isinstance(out, ValueNode) and isinstance(out.value, FuncGraph):
                    out = graph_value(out, in_context(here, out.value) or global_final_of(out.value))
                    queue.append(out.value)
                if out is not g.output:
                    g._raw_set_output(out)
                if out.graph is not None and out.graph is not g:
                    queue.append(out.graph)

        # Abstract values name the final graphs too.
        memos: dict[Optional[Spec], dict] = {}
        for g in graphs:
            here = self.spec_of_graph.get(g)
            here = here if here in live else None
            memo = memos.setdefault(here, {})

            def final_of(graph: FuncGraph, here: Optional[Spec] = here) -> FuncGraph:
                local = in_context(here, graph)
                return local if local in seen else global_final_of(graph)

            for node in self.info(g).order:
                bound = partial_target.get(node) if isinstance(node, CNode) else None
                if bound is not None and node.abstract is not None:
                    # The partial value names the spec its calls need, like its input.
                    template = self.template_of(bound)
                    node.abstract = map_graphs(
                        node.abstract,
                        lambda graph, f=final_of, t=template, b=bound:  # type: ignore[misc]
                            b if self.template_of(graph) is t else f(graph))
                elif node.abstract is not None:
                    node.abstract = map_graphs(node.abstract, final_of, memo)
                for inp in node.inputs:
                    if inp.abstract is not None:
                        inp.abstract = map_graphs(inp.abstract, final_of, memo)
            if g.has_output and g.output.abstract is not None:
                g.output.abstract = map_graphs(g.output.abstract, final_of, memo)
            spec = self.spec_of_graph.get(g)
            if spec is not None and spec in live:
                g.abstract = GraphSig(tuple(p.abstract for p in g.parameters),
                                      map_graphs(spec.out, final_of, memo))
        for specs in by_template.values():
            if len(specs) > 1:
                for k, s in enumerate(sorted(specs, key=lambda x: x.serial), 1):
                    s.graph.name = f"{s.graph.name}_{k}"
        result = entry.graph
        # Typing a call of a J-transformed closure manages the specs it transforms
        # (managers merge), and that manager keeps the transforms made for typing as
        # roots: the program's manager is computed from its own edges, afresh.
        for g in reachable_graphs([result]):
            g.manager = None
        mng = Manager([result])
        stray = [g for g in mng.graphs if g not in seen]
        if stray:
            raise InferenceError(f"internal: specialization left unspecialized graphs "
                                 f"{', '.join('@' + g.name for g in stray)}")
        return result

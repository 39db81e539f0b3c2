"""Graph isomorphism: do two programs have the same structure, up to names?

Used to check that printing and re-reading (``to_text`` -> ``parse``,
``dump_ir`` -> ``load``) gives back the same graphs.  Two programs are
isomorphic when a bijection between their graphs and their nodes maps

* parameters to parameters at the same position of corresponding graphs,
* CNodes to CNodes owned by corresponding graphs, input by input (so
  free-variable edges correspond too), with equal attributes (type and value),
* constants to equal constants (same type; numpy arrays with the same dtype,
  shape and elements; graph constants to corresponding graphs),
* each graph's output, nesting (``manager.parent``), annotations, return
  type and — unless disabled — abstract values.

Names of graphs and nodes may differ.  The walk is a breadth-first search
over node pairs with an explicit worklist: linear, no recursion.
"""

from __future__ import annotations

import math
import reprlib
from typing import Any, NoReturn, Optional, Union

import numpy as np

from anfir.errors import AnfirError
from anfir.ir.graph import FuncGraph, Module
from anfir.ir.manager import Manager, analyse
from anfir.ir.nodes import CNode, Node, ParameterNode, ValueNode
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.printers.abstract_text import abstract_text
from anfir.gcpause import without_gc
from anfir.runtime_values import Closure, GradEnv, Partial

GraphOrModule = Union[FuncGraph, Module]


class IsomorphismError(AnfirError):
    """Two programs differ; the message says where (graph, node, input)."""

    kind = "not isomorphic"


def isomorphic(a: GraphOrModule, b: GraphOrModule, *, abstracts: bool = True) -> bool:
    """Whether ``a`` and ``b`` have the same graph structure (see the module doc)."""
    try:
        assert_isomorphic(a, b, abstracts=abstracts)
    except IsomorphismError:
        return False
    return True


@without_gc
def assert_isomorphic(a: GraphOrModule, b: GraphOrModule, *, abstracts: bool = True) -> None:
    """Raise :class:`IsomorphismError` describing the first difference, if any."""
    _Matcher(abstracts).run(a, b)


class _Matcher:
    def __init__(self, abstracts: bool) -> None:
        self.abstracts = abstracts
        self.gmap: dict[FuncGraph, FuncGraph] = {}
        self.grev: dict[FuncGraph, FuncGraph] = {}
        self.gindex: dict[FuncGraph, int] = {}
        self.nmap: dict[Node, Node] = {}
        self.nrev: dict[Node, Node] = {}
        self.graph_queue: list[tuple[FuncGraph, FuncGraph]] = []
        self.node_queue: list[tuple[Node, Node, Any]] = []
        self.deferred_abstracts: list[tuple[Any, Any, Any]] = []
        self.facts: list[Manager] = []

    # -- driver -------------------------------------------------------------------
    def run(self, a: GraphOrModule, b: GraphOrModule) -> None:
        if isinstance(a, Module) and isinstance(b, Module):
            pairs = _module_pairs(a, b)
            named_a = list(a.graphs.values())
            named_b = list(b.graphs.values())
        elif isinstance(a, FuncGraph) and isinstance(b, FuncGraph):
            pairs = [(a, b)]
            named_a, named_b = [a], [b]
        else:
            raise IsomorphismError(f"cannot compare a {type(a).__name__} with a {type(b).__name__}")
        if named_a or named_b:
            # Read-only analyses: comparing two programs must not change them.
            self.facts = [analyse(*named_a), analyse(*named_b)] if named_a and named_b else []
        for ga, gb in pairs:
            self.pair_graphs(ga, gb, ("defs",))
        index = 0
        while index < len(self.graph_queue) or self.node_queue:
            if self.node_queue:
                na, nb, where = self.node_queue.pop()
                self.compare_nodes(na, nb, where)
                continue
            ga, gb = self.graph_queue[index]
            index += 1
            self.compare_graph_heads(ga, gb)
        for g in named_a:
            if g not in self.gmap:
                self.fail(f"definition @{g.name} of the first program has no counterpart")
        for g in named_b:
            if g not in self.grev:
                self.fail(f"definition @{g.name} of the second program has no counterpart")
        self.compare_nesting()
        if self.abstracts:
            for abs_a, abs_b, where in self.deferred_abstracts:
                if abs_a is None and abs_b is None:
                    continue
                if abs_a is not None and abs_b is not None and _plain_equal(abs_a, abs_b):
                    continue
                text_a = abstract_text(abs_a, self._name_a)
                text_b = abstract_text(abs_b, self._name_b)
                if text_a != text_b:
                    self.fail(f"{_where(where)}: abstract {text_a} vs {text_b}")

    def fail(self, message: str) -> NoReturn:
        raise IsomorphismError(message)

    def failx(self, where: Any, message: str) -> NoReturn:
        raise IsomorphismError(f"{_where(where)}: {message}")

    # -- graphs -------------------------------------------------------------------
    def pair_graphs(self, ga: FuncGraph, gb: FuncGraph, where: Any) -> None:
        mapped = self.gmap.get(ga)
        if mapped is not None:
            if mapped is not gb:
                self.failx(where, f"@{ga.name} corresponds to @{mapped.name}, but here to @{gb.name}")
            return
        back = self.grev.get(gb)
        if back is not None:
            self.failx(where, f"@{gb.name} already corresponds to @{back.name}, not to @{ga.name}")
        self.gmap[ga] = gb
        self.grev[gb] = ga
        self.gindex[ga] = self.gindex[gb] = len(self.graph_queue)
        self.graph_queue.append((ga, gb))

    def compare_graph_heads(self, ga: FuncGraph, gb: FuncGraph) -> None:
        where = f"@{ga.name} vs @{gb.name}"
        if len(ga.parameters) != len(gb.parameters):
            self.fail(f"{where}: {len(ga.parameters)} vs {len(gb.parameters)} parameters")
        ret_a, ret_b = ga.flags.get("return_type"), gb.flags.get("return_type")
        if _ann(ret_a) != _ann(ret_b):
            self.fail(f"{where}: return type {_ann(ret_a)} vs {_ann(ret_b)}")
        for i, (pa, pb) in enumerate(zip(ga.parameters, gb.parameters)):
            ctx: tuple[Any, ...] = ("param", ga, gb, i)
            self.bind(pa, pb, ctx)
            self.compare_common(pa, pb, ctx)
        if ga.has_output != gb.has_output:
            self.fail(f"{where}: one graph has no output")
        if ga.has_output:
            ctx = ("output", ga, gb)
            self.node_queue.append((ga.output, gb.output, ctx))
            if self.abstracts and isinstance(ga.output, ValueNode):
                self.deferred_abstracts.append((ga.output.abstract, gb.output.abstract, ctx))
        if self.abstracts and (ga.abstract is not None or gb.abstract is not None):
            self.deferred_abstracts.append((ga.abstract, gb.abstract, ("graph", ga, gb)))

    def facts_of(self, graph: FuncGraph) -> Manager:
        """The manager or analysis that knows ``graph``'s free variables and parent."""
        if graph.manager is not None:
            return graph.manager
        for facts in self.facts:
            if graph in facts.graphs:
                return facts
        return analyse(graph)

    def compare_nesting(self) -> None:
        for ga, gb in self.gmap.items():
            mng_a = self.facts_of(ga)
            mng_b = self.facts_of(gb)
            pa, pb = mng_a.parent(ga), mng_b.parent(gb)
            expected = self.gmap.get(pa) if pa is not None else None
            if (pa is None) != (pb is None) or (pa is not None and expected is not pb):
                self.fail(f"@{ga.name} vs @{gb.name}: nested in "
                          f"{_gname(pa)} vs {_gname(pb)}")

    # -- nodes --------------------------------------------------------------------
    def bind(self, na: Node, nb: Node, where: Any) -> bool:
        """Record na <-> nb; False if already bound (consistently)."""
        mapped = self.nmap.get(na)
        if mapped is not None:
            if mapped is not nb:
                self.failx(where, f"{_describe(na)} corresponds to {_describe(mapped)}, "
                                  f"but here to {_describe(nb)}")
            return False
        back = self.nrev.get(nb)
        if back is not None:
            self.failx(where, f"{_describe(nb)} already corresponds to {_describe(back)}")
        self.nmap[na] = nb
        self.nrev[nb] = na
        return True

    def compare_common(self, na: Node, nb: Node, where: Any) -> None:
        if na.annotation is not None or nb.annotation is not None:
            if _ann(na.annotation) != _ann(nb.annotation):
                self.failx(where, f"annotation {_ann(na.annotation)} vs {_ann(nb.annotation)}")
        if self.abstracts and (na.abstract is not None or nb.abstract is not None):
            self.deferred_abstracts.append((na.abstract, nb.abstract, ("node", na, nb)))

    def compare_nodes(self, na: Node, nb: Node, where: Any) -> None:
        if type(na) is not type(nb):
            self.failx(where, f"{_describe(na)} vs {_describe(nb)}")
        if isinstance(na, ValueNode):
            assert isinstance(nb, ValueNode)  # the same type as ``na`` (checked above)
            self.compare_values(na.value, nb.value, where)
            return
        if isinstance(na, ParameterNode):
            ga, gb = na.graph, nb.graph
            assert ga is not None and gb is not None
            self.pair_graphs(ga, gb, where)
            ia, ib = _param_index(na), _param_index(nb)
            if ia != ib:
                self.failx(where, f"parameter {ia} of @{ga.name} vs parameter {ib} of @{gb.name}")
            self.bind(na, nb, where)
            return
        assert isinstance(na, CNode) and isinstance(nb, CNode)
        if not self.bind(na, nb, where):
            return
        ga, gb = na.graph, nb.graph
        assert ga is not None and gb is not None
        self.pair_graphs(ga, gb, ("owner", na, nb))
        inputs_a, inputs_b = na.inputs, nb.inputs
        if len(inputs_a) != len(inputs_b):
            self.failx(("node", na, nb), f"{len(inputs_a)} vs {len(inputs_b)} inputs")
        if na.attrs != nb.attrs:
            self.failx(("node", na, nb), f"attributes {na.attrs!r} vs {nb.attrs!r}")
        self.compare_common(na, nb, ("node", na, nb))
        queue = self.node_queue
        for i, (input_a, input_b) in enumerate(zip(inputs_a, inputs_b)):
            queue.append((input_a, input_b, ("input", na, nb, i)))
            if self.abstracts and i > 0 and isinstance(input_a, ValueNode) and isinstance(input_b, ValueNode) \
                    and (input_a.abstract is not None or input_b.abstract is not None):
                self.deferred_abstracts.append((input_a.abstract, input_b.abstract, ("input", na, nb, i)))

    def compare_values(self, va: Any, vb: Any, where: Any) -> None:
        if va is vb and not isinstance(va, (FuncGraph, tuple, Partial, Closure)):
            return  # the same constant object (a primitive, a shared array...)
        stack = [(va, vb)]
        while stack:
            x, y = stack.pop()
            if isinstance(x, FuncGraph) and isinstance(y, FuncGraph):
                self.pair_graphs(x, y, where)
                continue
            if type(x) is not type(y):
                self.failx(where, f"constant {_short(x)} vs {_short(y)}")
            if isinstance(x, tuple):
                if len(x) != len(y):
                    self.failx(where, f"tuples of {len(x)} vs {len(y)} elements")
                stack.extend(zip(x, y))
            elif isinstance(x, np.ndarray):
                if x.dtype != y.dtype or x.shape != y.shape or not np.array_equal(
                        x, y, equal_nan=x.dtype.kind in "fc"):
                    self.failx(where, f"tensor {_short(x)} vs {_short(y)}")
            elif isinstance(x, float):
                if not (repr(x) == repr(y) or (math.isnan(x) and math.isnan(y))):
                    self.failx(where, f"constant {x!r} vs {y!r}")
            elif isinstance(x, (Primitive, MetaFunction)):
                if x is not y:
                    self.failx(where, f"{x.name} vs {y.name}")
            elif isinstance(x, Partial):
                stack.append((x.fn, y.fn))
                stack.append((x.args, y.args))
            elif isinstance(x, Closure):
                stack.append((x.graph, y.graph))
                stack.append((x.env, y.env))
            elif isinstance(x, GradEnv):
                ia, ib = list(x.items()), list(y.items())
                if [k for k, _ in ia] != [k for k, _ in ib]:
                    self.failx(where, "gradient environments with different keys")
                stack.extend((u, v) for (_, u), (_, v) in zip(ia, ib))
            elif isinstance(x, np.generic):
                if repr(x) != repr(y) and not (np.isnan(x) and np.isnan(y)):
                    self.failx(where, f"constant {x!r} vs {y!r}")
            elif x != y:
                self.failx(where, f"constant {_short(x)} vs {_short(y)}")

    def _name_a(self, g: FuncGraph) -> str:
        index = self.gindex.get(g) if g in self.gmap else None
        return f"#{index}" if index is not None else f"?{g.name}"

    def _name_b(self, g: FuncGraph) -> str:
        index = self.gindex.get(g) if g in self.grev else None
        return f"#{index}" if index is not None else f"?{g.name}"


def _plain_equal(a: Any, b: Any) -> bool:
    """Fast path: abstract values equal as objects (graphs inside compare by identity)."""
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - sympy or numpy comparisons: decide by text
        return False


def _where(ctx: Any) -> str:
    """Render a lazily kept context tuple (only when a difference is reported)."""
    kind = ctx[0]
    if kind == "defs":
        return "the module's definitions"
    if kind == "output":
        return f"@{ctx[1].name} vs @{ctx[2].name} output"
    if kind == "graph":
        return f"@{ctx[1].name} vs @{ctx[2].name} signature"
    if kind == "param":
        return f"@{ctx[1].name} vs @{ctx[2].name} parameter {ctx[3]}"
    if kind == "input":
        return f"{_describe(ctx[1])} vs {_describe(ctx[2])}, input {ctx[3]}"
    if kind == "owner":
        return f"the graphs owning {_describe(ctx[1])} and {_describe(ctx[2])}"
    return f"{_describe(ctx[1])} vs {_describe(ctx[2])}"


def _module_pairs(a: Module, b: Module) -> list[tuple[FuncGraph, FuncGraph]]:
    """Definitions of equal names correspond; the rest pair up in order."""
    pairs = []
    rest_a = []
    used_b: set[str] = set()
    for key, graph in a.graphs.items():
        if key in b.graphs:
            pairs.append((graph, b.graphs[key]))
            used_b.add(key)
        else:
            rest_a.append(graph)
    rest_b = [g for k, g in b.graphs.items() if k not in used_b]
    pairs.extend(zip(rest_a, rest_b))
    return pairs


def _param_index(p: Node) -> int:
    graph = p.graph
    assert graph is not None
    for i, q in enumerate(graph.parameters):
        if q is p:
            return i
    return -1


def _ann(annotation: Any) -> Optional[str]:
    return None if annotation is None else str(annotation)


def _gname(g: Optional[FuncGraph]) -> str:
    return "nothing" if g is None else f"@{g.name}"


def _describe(node: Node) -> str:
    if isinstance(node, ValueNode):
        return f"constant {_short(node.value)}"
    owner = node.graph.name if node.graph is not None else "?"
    if isinstance(node, ParameterNode):
        return f"parameter {node.name} of @{owner}"
    head = node.inputs[0] if node.inputs else None
    callee = _short(head.value) if isinstance(head, ValueNode) else "a computed function"
    label = f" {node.name}" if node.name else ""
    return f"CNode{label} ({callee}(...)) of @{owner}"


_REPR = reprlib.Repr()
_REPR.maxlevel = 4
_REPR.maxtuple = _REPR.maxother = _REPR.maxstring = 60


def _short(value: Any) -> str:
    if isinstance(value, FuncGraph):
        return f"@{value.name}"
    if isinstance(value, np.ndarray):
        return f"Tensor[{value.dtype}, {value.shape}]"
    text = _REPR.repr(value)  # depth-limited: a constant tuple may nest thousands deep
    return text if len(text) <= 60 else text[:57] + "..."


__all__ = ["IsomorphismError", "assert_isomorphic", "isomorphic"]

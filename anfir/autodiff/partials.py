"""The J-world ``partial``: a partial value's gradient holds those of what it binds.

The gradient of a partial value is a :class:`~anfir.runtime_values.GradEnv`, as the
gradient of every function value is: ``partial(f, a...)`` holds ``d_f`` under
the key :func:`partial_key` ``(0)`` and ``d_a_i`` under ``partial_key(1 + i)``.
Its zero is the empty GradEnv whatever the J-level of the value, so the
gradient code of a partial can be differentiated again (a partial's
J-transform binds one more value, the regrouping graph, and a zero made from
it must still be the zero of the original partial's gradient).

``partial(f, a...)`` differentiated calls ``f'(a..., b...)`` through a small
regrouping graph so the gradients come back as ``(env{d_f, d_a...}, d_b...)``.
The ``ad`` phase builds that graph statically when the arity of ``f`` is
known (:func:`j_partial_maker`); otherwise the meta function
:func:`j_partial_call` builds it at run time.  Shared by the primitive rules,
the J transform and the run-time J, which all import this module.

Differentiating again, the J-world partial ``partial(M, f', a'...)`` (``M``
the regrouping graph, a *maker*) is itself a partial value, whose transform
binds ``▸M`` in front.  ``J`` passes a gradient straight through, so the
gradient of ``J(p)`` must have the keys of the gradient of ``p``: ``f`` under
``partial.0``, ``a_i`` under ``partial.(1+i)`` at every level.  A maker
therefore carries a *skip*: how many of the values its call returns gradients
for are makers of the levels below (``▸M``, ``▸▸M``...), which have no
gradient (constants without free variables) and get no key
(:func:`maker_skip`, :func:`bound_key`).
"""

from __future__ import annotations

from typing import Any, Optional

from anfir.abstract.values import AAny, AFunction, GradFn, GraphFn, JFn, PartialFn, PrimFn
from anfir.infer.engine import GENERIC
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.ir.walk import toposort
from anfir.primitives import gradient, structure
from anfir.runtime_values import SymbolicKey

_partial_graphs: dict[tuple, FuncGraph] = {}
_partial_calls: dict[tuple[int, int], MetaFunction] = {}
_maker_metas: dict[int, int] = {}  # id(J_partial_call meta) -> its skip
SKIP_FLAG = "j_partial_skip"
"""The flag of a regrouping graph: its skip (a clone keeps its flags, so a
specialized copy is still known as a maker)."""
_partial_keys: list[SymbolicKey] = []


def partial_key(i: int) -> SymbolicKey:
    """The GradEnv key of the ``i``-th value a partial binds (0: the function)."""
    while len(_partial_keys) <= i:
        _partial_keys.append(SymbolicKey(f"partial.{len(_partial_keys)}"))
    return _partial_keys[i]


def partial_gradient(graph: FuncGraph, grads: list[Node], loc: Any = None) -> Node:
    """Nodes in ``graph`` making the gradient of a partial value from the gradients
    of what it binds (``grads[0]`` the function's)."""
    env: Node = CNode(graph, [ValueNode(gradient.newenv)], loc)
    for i, g in enumerate(grads):
        env = CNode(graph, [ValueNode(gradient.env_setitem), env, ValueNode(partial_key(i)), g], loc)
    return env


def maker_skip(fn: Any) -> Optional[int]:
    """The skip of the regrouping function ``fn`` (a graph or meta function made
    here), None when ``fn`` is not one (a partial of it is a user's partial)."""
    if isinstance(fn, FuncGraph):
        skip = fn.flags.get(SKIP_FLAG)
        return skip if isinstance(skip, int) else None
    if isinstance(fn, MetaFunction):
        return _maker_metas.get(id(fn))
    return None


def note_j_of_maker(meta: MetaFunction, j_of_meta: MetaFunction) -> None:
    """Record that ``j_of_meta`` is the J-transform of ``meta`` (for :func:`regroups`)."""
    if regroups(meta):
        _j_of_makers.add(id(j_of_meta))


def regroups(fn: Any) -> bool:
    """Whether ``fn`` is a regrouping meta function or the J-transform of one: a
    partial of it, ``Partial(fn, (g, a...))``, takes the arguments that
    ``partial(g, a...)`` takes (its arity is not its own, which varies)."""
    return isinstance(fn, MetaFunction) and (id(fn) in _maker_metas or id(fn) in _j_of_makers)


_j_of_makers: set[int] = set()  # (the metas are kept alive by the caches that made them)


def j_skip(fn: Any) -> int:
    """The skip of the maker that the J-transform of a partial of ``fn`` binds:
    one more than ``fn``'s if ``fn`` is a maker itself, else 0."""
    skip = maker_skip(fn)
    return 0 if skip is None else skip + 1


def bound_key(fn: Any, i: int) -> Optional[int]:
    """The :func:`partial_key` index of the gradient of ``partial(fn, b...)``'s input
    ``i`` (0: ``fn``, ``1 + k``: ``b_k``), None when it has no gradient (a maker
    and the makers of lower levels it binds first)."""
    skip = maker_skip(fn)
    if skip is None:
        return i
    if i == 0:
        return None
    k = i - 1 - skip
    return k if k >= 0 else None


def bound_gradient(graph: FuncGraph, sens: Node, i: int, bound: Node, loc: Any = None) -> Node:
    """Nodes in ``graph`` reading, from the gradient ``sens`` of a partial value, the
    gradient of the value it binds under key ``i`` (``bound``, for the zero)."""
    zero = CNode(graph, [ValueNode(structure.zeros_like), bound], loc)
    return CNode(graph, [ValueNode(gradient.env_getitem), sens, ValueNode(partial_key(i)), zero], loc)


def j_partial_call(nbound: int, skip: int = 0) -> MetaFunction:
    """The J-world partial: calls ``f'(a..., b...)`` and regroups the gradients as
    ``(env{d_f, d_a...}, d_b...)`` — a partial value's gradient holds those of
    what it binds (``skip``: see :func:`maker_skip`)."""
    cached = _partial_calls.get((nbound, skip))
    if cached is None:
        suffix = f"s{skip}" if skip else ""
        cached = MetaFunction(f"J_partial_call{nbound}{suffix}", "a J-world partial application",
                              nbound + 1, None,
                              generate=lambda args: _partial_call_graph(nbound, len(args) - 1 - nbound,
                                                                        skip),
                              internal=True,
                              # Only the argument count matters: the specializer can type it.
                              generate_for_types=lambda args: _partial_call_graph(
                                  nbound, len(args) - 1 - nbound, skip))
        _partial_calls[(nbound, skip)] = cached
        _maker_metas[id(cached)] = skip
    return cached


def _partial_call_graph(nbound: int, nrest: int, skip: int) -> FuncGraph:
    key = ("partial", nbound, nrest, skip)
    graph = _partial_graphs.get(key)
    if graph is None:
        graph = _partial_graphs[key] = partial_call_graph(nbound, nrest, skip)
    return graph


def j_partial_maker(fn: Node, nbound: int, static: bool,
                    shared: Optional[dict[tuple[Any, int, int], FuncGraph]] = None) -> Node:
    """What the J-world ``partial(fn, a...)`` (``nbound`` arguments bound) binds first.

    When the arity of ``fn`` is known — from its constant, or with ``static``
    (the ``ad`` phase, on a typed program) from its type — a regrouping graph
    for that arity: a plain graph the optimizer and the printers handle, and
    that a program built around the transform (``anfir.grad``) compiles;
    otherwise the meta function :func:`j_partial_call`, which makes it at run
    time.

    The graph is typed in place for the one signature it is called with, so it
    is fresh per ``partial`` node — except that, given ``shared`` (a cache the
    caller keeps for one compilation), the partials of one graph constant share
    it: ``fn`` is then a specialized graph, so every call of the maker has the
    signature of that graph's spec, and two such partial values have the same
    type (``ap(partial(f, p), y) + ap(partial(f, p), x)`` must type ``ap`` once).
    """
    skip = j_skip(fn.value if isinstance(fn, ValueNode) else None)
    nparams = static_arity(fn) if static else constant_arity(fn)
    if nparams is not None:
        if nparams >= nbound:
            graph = fn.value if isinstance(fn, ValueNode) else None
            key = (graph, nbound, nparams - nbound)
            maker = shared.get(key) if shared is not None and isinstance(graph, FuncGraph) else None
            if maker is None:
                maker = partial_call_graph(nbound, nparams - nbound, skip)
                if isinstance(graph, FuncGraph) and is_generic(graph):
                    # The partial is called with several signatures, as its function is.
                    maker.flags[GENERIC] = True
                    for inner in _graph_constants(maker):
                        inner.flags[GENERIC] = True
                if shared is not None and isinstance(graph, FuncGraph):
                    shared[key] = maker
            return ValueNode(maker, fn.loc)
    return ValueNode(j_partial_call(nbound, skip))


def is_generic(graph: FuncGraph) -> bool:
    """Whether the specializer typed ``graph`` for unknown arguments (every parameter
    ``Any``): one spec serving calls with different signatures."""
    params = graph.parameters
    return bool(params) and all(isinstance(p.abstract, AAny) for p in params)


def _graph_constants(graph: FuncGraph) -> list[FuncGraph]:
    """The graphs ``graph``'s own calls and output name as constants (the regrouping
    graph's backward closure)."""
    found = []
    nodes = [n for n in toposort(graph) if isinstance(n, CNode)]
    for node in nodes:
        for inp in node.inputs:
            if isinstance(inp, ValueNode) and isinstance(inp.value, FuncGraph):
                found.append(inp.value)
    return found


def constant_arity(node: Node) -> Optional[int]:
    """The number of arguments of the function ``node`` stands for when constants
    alone say it (a graph or fixed-arity primitive, or ``partial`` calls of one),
    without types; None otherwise."""
    bound = 0
    while isinstance(node, CNode) and node.is_apply(structure.partial) and len(node.inputs) >= 2:
        bound += len(node.inputs) - 2
        node = node.inputs[1]
    if not isinstance(node, ValueNode):
        return None
    arity = static_arity(node)
    return None if arity is None or arity < bound else arity - bound


def static_arity(node: Node) -> Optional[int]:
    """The number of arguments of the function ``node`` stands for, when its
    constant or its abstract value says so (the same for every function it may
    be); None otherwise."""
    value = node.value if isinstance(node, ValueNode) else None
    if isinstance(value, FuncGraph):
        return len(value.parameters)
    if value is None and not isinstance(node.abstract, AFunction):
        return constant_arity(node) if isinstance(node, CNode) else None
    if isinstance(value, Primitive):
        return value.min_args if value.max_args == value.min_args else None
    abstract = node.abstract
    if not isinstance(abstract, AFunction):
        return None
    arities = {atom_arity(atom) for atom in abstract.options}
    arities.discard(None)  # (an option whose arity varies takes the others' count)
    return arities.pop() if len(arities) == 1 else None


def fixed_arity(fn: Any) -> Optional[int]:
    """The one arity every option of an abstract function ``fn`` has (None when ``fn`` is
    not an AFunction, or its options differ or vary): what typing a call of a meta
    function (``grad(f)``, ``jvp(f)``, ``checkpoint(f)``) needs of ``f``."""
    if not isinstance(fn, AFunction):
        return None
    arities = {atom_arity(atom) for atom in fn.options}
    if len(arities) != 1 or None in arities:
        return None
    (nparams,) = arities
    return nparams


def atom_arity(atom: Any) -> Optional[int]:
    """The number of arguments a function atom takes (None if it varies or is unknown)."""
    bound = 0
    while isinstance(atom, (PartialFn, JFn, GradFn)):  # J and grad keep the arity
        if isinstance(atom, PartialFn):
            bound += len(atom.args)
        atom = atom.fn
    if isinstance(atom, GraphFn):
        return len(atom.graph.parameters) - bound
    if isinstance(atom, PrimFn):
        prim = atom.prim
        max_args = getattr(prim, "max_args", None)
        if max_args is not None and prim.min_args == max_args:
            return max_args - bound
    return None


def partial_call_graph(nbound: int, nrest: int, skip: int = 0) -> FuncGraph:
    """A new graph ``(f', a'..., b'...) -> (value, ◂)`` calling ``f'`` and regrouping
    its gradients as ``(env{d_f, d_a...}, d_b...)`` (``nbound`` a's, ``nrest`` b's;
    the first ``skip`` of ``f', a'...`` are makers of lower levels, which get no
    key: see :func:`maker_skip`)."""
    fwd = FuncGraph(f"J_partial_call{nbound}_{nrest}" + (f"s{skip}" if skip else ""))
    fwd.flags[SKIP_FLAG] = skip
    f = fwd.add_parameter("f")
    xs = [fwd.add_parameter(f"x{i}") for i in range(nbound + nrest)]
    t = call_node(fwd, f, *xs)
    value = item_node(fwd, t, 0)
    bp = item_node(fwd, t, 1)
    bwd = FuncGraph(f"◂J_partial_call{nbound}_{nrest}")
    dout = bwd.add_parameter("dout")
    grads = call_node(bwd, bp, dout)
    bound = partial_gradient(bwd, [item_node(bwd, grads, i) for i in range(skip, nbound + 1)])
    rest = [item_node(bwd, grads, nbound + 1 + i) for i in range(nrest)]
    bwd.output = CNode(bwd, [ValueNode(structure.make_tuple), bound, *rest])
    fwd.output = CNode(fwd, [ValueNode(structure.make_tuple), value, ValueNode(bwd)])
    return fwd


def call_node(graph: FuncGraph, fn: Node, *args: Node, loc: Any = None) -> CNode:
    """``fn(args...)`` in ``graph``."""
    return CNode(graph, [fn, *args], loc)


def item_node(graph: FuncGraph, t: Node, i: int, loc: Any = None) -> CNode:
    """``t[i]`` in ``graph``."""
    return CNode(graph, [ValueNode(structure.tuple_getitem), t, ValueNode(i)], loc)


__all__ = ["atom_arity", "is_generic", "bound_gradient", "bound_key", "j_skip", "maker_skip", "note_j_of_maker",
           "regroups", "constant_arity", "call_node", "item_node", "j_partial_call",
           "j_partial_maker", "partial_call_graph", "partial_gradient", "partial_key", "static_arity"]

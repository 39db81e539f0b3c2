"""The J-world ``partial``: a partial value's gradient holds those of what it binds.

The gradient of a partial value is a :class:`~anfir.values.GradEnv`, as the
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
"""

from __future__ import annotations

from typing import Any, Optional

from anfir.abstract.values import AFunction, GradFn, GraphFn, JFn, PartialFn, PrimFn
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.primitives import gradient, structure
from anfir.values import SymbolicKey

_partial_graphs: dict[tuple, FuncGraph] = {}
_partial_calls: dict[int, MetaFunction] = {}
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


def bound_gradient(graph: FuncGraph, sens: Node, i: int, bound: Node, loc: Any = None) -> Node:
    """Nodes in ``graph`` reading, from the gradient ``sens`` of a partial value, the
    gradient of the ``i``-th value it binds (``bound``, for the zero)."""
    zero = CNode(graph, [ValueNode(structure.zeros_like), bound], loc)
    return CNode(graph, [ValueNode(gradient.env_getitem), sens, ValueNode(partial_key(i)), zero], loc)


def j_partial_call(nbound: int) -> MetaFunction:
    """The J-world partial: calls ``f'(a..., b...)`` and regroups the gradients as
    ``(env{d_f, d_a...}, d_b...)`` — a partial value's gradient holds those of
    what it binds."""
    cached = _partial_calls.get(nbound)
    if cached is None:
        cached = MetaFunction(f"J_partial_call{nbound}", "a J-world partial application",
                              nbound + 1, None,
                              generate=lambda args: _partial_call_graph(nbound, len(args) - 1 - nbound),
                              internal=True,
                              # Only the argument count matters: the specializer can type it.
                              generate_for_types=lambda args: _partial_call_graph(
                                  nbound, len(args) - 1 - nbound))
        _partial_calls[nbound] = cached
    return cached


def _partial_call_graph(nbound: int, nrest: int) -> FuncGraph:
    key = ("partial", nbound, nrest)
    graph = _partial_graphs.get(key)
    if graph is None:
        graph = _partial_graphs[key] = partial_call_graph(nbound, nrest)
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
    nparams = static_arity(fn) if static else constant_arity(fn)
    if nparams is not None:
        if nparams >= nbound:
            graph = fn.value if isinstance(fn, ValueNode) else None
            key = (graph, nbound, nparams - nbound)
            maker = shared.get(key) if shared is not None and isinstance(graph, FuncGraph) else None
            if maker is None:
                maker = partial_call_graph(nbound, nparams - nbound)
                if shared is not None and isinstance(graph, FuncGraph):
                    shared[key] = maker
            return ValueNode(maker, fn.loc)
    return ValueNode(j_partial_call(nbound))


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


def partial_call_graph(nbound: int, nrest: int) -> FuncGraph:
    """A new graph ``(f', a'..., b'...) -> (value, ◂)`` calling ``f'`` and regrouping
    its gradients as ``(env{d_f, d_a...}, d_b...)`` (``nbound`` a's, ``nrest`` b's)."""
    fwd = FuncGraph(f"J_partial_call{nbound}_{nrest}")
    f = fwd.add_parameter("f")
    xs = [fwd.add_parameter(f"x{i}") for i in range(nbound + nrest)]
    t = call_node(fwd, f, *xs)
    value = item_node(fwd, t, 0)
    bp = item_node(fwd, t, 1)
    bwd = FuncGraph(f"◂J_partial_call{nbound}_{nrest}")
    dout = bwd.add_parameter("dout")
    grads = call_node(bwd, bp, dout)
    bound = partial_gradient(bwd, [item_node(bwd, grads, i) for i in range(nbound + 1)])
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


__all__ = ["atom_arity", "bound_gradient", "constant_arity", "call_node", "item_node", "j_partial_call",
           "j_partial_maker", "partial_call_graph", "partial_gradient", "partial_key", "static_arity"]

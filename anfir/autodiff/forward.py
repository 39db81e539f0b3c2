"""Forward mode: ``jvp(f)(x..., t...) = (f(x...), ∂f(x)·t)``.

The directional derivative is the transpose of the reverse-mode pullback
(the "double vjp"): ``u ↦ ∂fᵀu`` is linear, ``⟨∂fᵀu, t⟩ = ⟨u, ∂f·t⟩``, so
``∂f·t`` is the gradient of ``u ↦ tangent_dot(∂fᵀu, t)``, taken at any ``u``
(zero).  It is built from ``grad`` alone, so it works
wherever they do — closures, ``switch``, recursion, tuples, ``partial`` —
and to any order: ``jvp`` of ``grad`` is a Hessian-vector product
(forward-over-reverse), ``grad`` through ``jvp`` is reverse-over-forward.
It costs about two reverse passes where a dual-number transform would cost
one forward pass.

:func:`jvp_graph` is the graph behind ``jvp(f)``; the ``ad`` phase expands
calls into it statically and the evaluator at run time (as for ``grad``).
"""

from __future__ import annotations

from typing import Optional

from anfir.autodiff.partials import call_node, fixed_arity
from anfir.autodiff.jtransform import check_function_value
from anfir.autodiff.runtime import arity_of
from anfir.errors import GradientError
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.primitives import gradient, meta, structure

_templates: dict[int, FuncGraph] = {}


def jvp_graph(nparams: int) -> FuncGraph:
    """The template the ``ad`` phase and the specializer copy (never run itself)."""
    graph = _templates.get(nparams)
    if graph is None:
        graph = _templates[nparams] = build_jvp_graph(nparams)
    return graph


def build_jvp_graph(nparams: int) -> FuncGraph:
    """``(f) -> ⟨x1..xn, t1..tn⟩ ↦ (f(x...), ∂f(x)·t)`` for a function of ``nparams`` arguments.

    In ANF, with ``n = 2``::

        lambda (f) lambda (x0, x1, t0, t1)
          let pairing = lambda (u)
            let pullback = grad(lambda (z0, z1) tangent_dot(f(z0, z1), u) end, 0, 1) in
            tangent_dot(pullback(x0, x1), (t0, t1)) end in
          (f(x0, x1), grad(pairing)(zeros_like(f(x0, x1))))
        end end

    ``grad`` of ``⟨f(z), u⟩`` is the pullback ``∂fᵀu``; only ``grad`` is used,
    so every case ``grad`` handles (closures, ``if``, loops, partials, grad
    of grad) is handled here too.
    """
    make_tuple = ValueNode(structure.make_tuple)
    outer = FuncGraph("jvp")
    f = outer.add_parameter("f")
    inner = FuncGraph("jvp▸")
    xs = [inner.add_parameter(f"x{i}") for i in range(nparams)]
    ts = [inner.add_parameter(f"t{i}") for i in range(nparams)]
    value = call_node(inner, f, *xs)
    pairing = FuncGraph("jvp_pairing")
    u = pairing.add_parameter("u")
    scalarized = FuncGraph("jvp_scalarized")
    zs = [scalarized.add_parameter(f"z{i}") for i in range(nparams)]
    scalarized.output = CNode(scalarized, [ValueNode(gradient.tangent_dot),
                                           call_node(scalarized, f, *zs), u])
    indices = [ValueNode(i) for i in range(nparams)] if nparams > 1 else []
    pullback = CNode(pairing, [ValueNode(meta.grad), ValueNode(scalarized), *indices])
    dxs = call_node(pairing, pullback, *xs)
    tangents: Node = ts[0] if nparams == 1 else CNode(pairing, [make_tuple, *ts])
    pairing.output = CNode(pairing, [ValueNode(gradient.tangent_dot), dxs, tangents])
    derivative = CNode(inner, [ValueNode(meta.grad), ValueNode(pairing)])
    seed = CNode(inner, [ValueNode(structure.zeros_like), value])
    inner.output = CNode(inner, [make_tuple, value, call_node(inner, derivative, seed)])
    outer.output = ValueNode(inner)
    return outer


def generate_jvp(args: tuple) -> FuncGraph:
    """The graph for a run-time call ``jvp(f)``."""
    if len(args) != 1:
        raise GradientError(f"jvp takes one function, got {len(args)} arguments")
    # A graph of its own for every call, never the template nor one run before:
    # running a graph attaches a manager to it and the run-time J caches the
    # transforms of its closures, which a later J of the whole graph (jvp inside
    # grad) must not reuse.  Building one is linear in the arity.
    nparams = arity_of(args[0])
    check_function_value(args[0])
    return build_jvp_graph(nparams)


def generate_jvp_for_types(args: tuple) -> Optional[FuncGraph]:
    """The graph for ``jvp(f)`` when ``f``'s abstract value fixes its arity (for typing)."""
    nparams = fixed_arity(args[0]) if len(args) == 1 else None
    return None if nparams is None else jvp_graph(nparams)


def jvp_api(graph: FuncGraph) -> FuncGraph:
    """``anfir.jvp``: a new FuncGraph ``(*args, *tangents) -> (out, tangent_out)``."""
    nparams = len(graph.parameters)
    result = FuncGraph(f"jvp_{graph.name}", graph.loc)
    xs = [result.add_parameter(p.name or f"x{i}", p.loc) for i, p in enumerate(graph.parameters)]
    ts = [result.add_parameter(f"t_{p.name or i}", p.loc) for i, p in enumerate(graph.parameters)]
    # A graph of its own: compiling the result edits it, and the template must stay as it is.
    closure = CNode(result, [ValueNode(build_jvp_graph(nparams)), ValueNode(graph)], graph.loc)
    result.output = CNode(result, [closure, *xs, *ts], graph.loc)
    return result


__all__ = ["build_jvp_graph", "generate_jvp", "generate_jvp_for_types", "jvp_api", "jvp_graph"]

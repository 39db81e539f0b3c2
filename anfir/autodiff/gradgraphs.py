"""The graphs behind ``grad`` and ``value_and_grad``, built from arities and indices.

* :func:`grad_graph` — ``(f, i...) -> closure ∇(x...)`` that runs ``J(f)``,
  seeds the backward pass with 1.0 and picks the requested gradients: what a
  call ``grad(f, i...)`` stands for (the ``ad`` phase expands calls into it
  statically, the evaluator at run time);
* :func:`grad_call_graph` — the same as one graph ``(f, x...) -> gradient``,
  for typing the J-transform of a gradient function;
* :func:`grad_graph_for_types` — :func:`grad_graph` from abstract arguments
  (the J-transform of ``grad`` itself, typed by the specializer).

Shared by the J transform, the run-time side and the API, which all import
this module.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from anfir.abstract.values import AScalar
from anfir.autodiff.partials import call_node, fixed_arity, item_node
from anfir.errors import GradientError
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.primitives import gradient, structure

_grad_graphs: dict[tuple, FuncGraph] = {}


def normalize_wrt(indices: Sequence[Any], nparams: int) -> tuple[tuple[int, ...], bool]:
    """Checked argument indices, and whether the result is a tuple (several indices)."""
    if not indices:
        return (0,), False
    result = []
    for i in indices:
        if isinstance(i, bool) or not isinstance(i, int):
            raise GradientError(f"grad's argument indices must be integer constants, not {i!r}")
        if not -nparams <= i < nparams:
            raise GradientError(f"grad w.r.t. argument {i}, but the function takes {nparams}")
        result.append(i % nparams)
    return tuple(result), len(result) > 1


def grad_graph(nparams: int, wrt: tuple[int, ...], multi: bool, with_value: bool,
               nindices: int) -> FuncGraph:
    """``(f, i...) -> ∇`` where the closure ``∇(x1..xn)`` computes the gradient."""
    key = (nparams, wrt, multi, with_value, nindices)
    graph = _grad_graphs.get(key)
    if graph is not None:
        return graph
    name = "value_and_grad" if with_value else "grad"
    outer = FuncGraph(name)
    f = outer.add_parameter("f")
    for i in range(nindices):
        outer.add_parameter(f"i{i}")
    inner = FuncGraph("∇")
    xs = [inner.add_parameter(f"x{i}") for i in range(nparams)]
    jf = CNode(inner, [ValueNode(gradient.J), f])
    inner.output = build_grad_body(inner, jf, xs, wrt, multi, with_value)
    outer.output = ValueNode(inner)
    _grad_graphs[key] = outer
    return outer


_grad_call_graphs: dict[tuple, FuncGraph] = {}


def grad_call_graph(nparams: int, wrt: tuple[int, ...], multi: bool, with_value: bool) -> FuncGraph:
    """``(f, x1..xn) -> grad(f, wrt...)(x1..xn)`` as one graph (a template, shared:
    copy it before typing it in place).  ``grad(f, i...)`` as a function is this
    graph with ``f`` bound, so the specializer types the J-transform of a
    gradient function as the J-transform of that partial application."""
    key = (nparams, wrt, multi, with_value)
    graph = _grad_call_graphs.get(key)
    if graph is None:
        graph = FuncGraph("value_and_grad_call" if with_value else "grad_call")
        f = graph.add_parameter("f")
        xs = [graph.add_parameter(f"x{i}") for i in range(nparams)]
        jf = CNode(graph, [ValueNode(gradient.J), f])
        graph.output = build_grad_body(graph, jf, xs, wrt, multi, with_value)
        _grad_call_graphs[key] = graph
    return graph


def build_grad_body(graph: FuncGraph, jf: Node, xs: Sequence[Node], wrt: tuple[int, ...],
                    multi: bool, with_value: bool, loc: Any = None) -> Node:
    """Nodes in ``graph`` computing the gradient of ``jf``'s function at ``xs``."""
    t = call_node(graph, jf, *xs, loc=loc)
    value = item_node(graph, t, 0, loc)
    bp = item_node(graph, t, 1, loc)
    seed = CNode(graph, [ValueNode(gradient.grad_seed), value], loc)
    grads = call_node(graph, bp, seed, loc=loc)
    picked = [CNode(graph, [ValueNode(gradient.grad_arg_check), xs[i], item_node(graph, grads, 1 + i, loc)], loc)
              for i in wrt]
    result: Node = picked[0] if not multi else CNode(graph, [ValueNode(structure.make_tuple), *picked], loc)
    if with_value:
        result = CNode(graph, [ValueNode(structure.make_tuple), value, result], loc)
    return result


def grad_graph_for_types(args: tuple, with_value: bool) -> Optional[FuncGraph]:
    """:func:`grad_graph` for a call ``grad(f, i...)`` on abstract arguments, when they
    fix it (the arity of every function ``f`` may be, constant indices); else None."""
    nparams = fixed_arity(args[0]) if args else None
    if nparams is None:
        return None
    indices = []
    for a in args[1:]:
        if not (isinstance(a, AScalar) and type(a.value) is int):
            return None
        indices.append(a.value)
    try:
        wrt, multi = normalize_wrt(indices, nparams)
    except GradientError:
        return None
    return grad_graph(nparams, wrt, multi, with_value, len(indices))


__all__ = ["build_grad_body", "grad_call_graph", "grad_graph", "grad_graph_for_types",
           "normalize_wrt"]

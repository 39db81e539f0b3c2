"""Run-time side of the autodiff: ``J`` on values and the graphs behind ``grad``.

* :func:`j_value` — ``J`` applied to a run-time value: data is unchanged, a
  closure of ``h`` becomes a closure of ``▸h`` over the *same* captured
  values (``▸h`` has exactly ``h``'s free variables), a primitive becomes
  ``▸p``, a partial a J-world partial.
* :func:`grad_graph` — the graph behind ``grad(f, i...)``/``value_and_grad``:
  ``(f, i...) -> closure ∇(x...)`` that runs ``J(f)``, seeds the backward
  pass with 1.0 and picks the requested gradients.  The ``ad`` phase expands
  ``grad`` calls into it statically; the evaluator does the same at run time
  through ``MetaFunction.generate``.
"""

from __future__ import annotations

from typing import Any, Sequence

from anfir.autodiff.jtransform import j_graph_checked, j_meta
from anfir.autodiff.partials import call_node, item_node, j_partial_call
from anfir.autodiff.primitive_j import j_primitive_value
from anfir.errors import GradientError
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import manage
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.primitives import gradient, structure
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.values import Closure, Partial

_grad_graphs: dict[tuple, FuncGraph] = {}


# -- J on values ----------------------------------------------------------------
def j_value(x: Any) -> Any:
    """The J-transform of a run-time value."""
    if isinstance(x, Closure):
        forward = j_graph_checked(x.graph)
        return Closure(forward, _remap_env(x.graph, forward, x.env))
    if isinstance(x, FuncGraph):
        forward = j_graph_checked(x)
        if manage(forward).free_variables_total(forward):
            raise GradientError(f"cannot differentiate @{x.name} outside of its closure")
        return forward
    if isinstance(x, Primitive):
        return j_primitive_value(x)
    if isinstance(x, MetaFunction):
        return j_meta(x)
    if isinstance(x, Partial):
        return Partial(j_partial_call(len(x.args)), (j_value(x.fn), *(j_value(a) for a in x.args)))
    if isinstance(x, tuple):
        return tuple(j_value(v) for v in x)
    return x


def _remap_env(graph: FuncGraph, forward: FuncGraph, env: tuple) -> tuple:
    """Order ``env`` (captured for ``graph``) as ``forward``'s free variables expect."""
    before = manage(graph).free_variables_total(graph)
    after = manage(forward).free_variables_total(forward)
    if before == after:
        return env
    by_node = dict(zip(before, env))
    try:
        return tuple(by_node[n] for n in after)
    except KeyError:  # pragma: no cover - would be a bug in the J transform
        raise GradientError(f"internal: ▸{graph.name} captures values @{graph.name} does not") from None


# -- grad / value_and_grad ------------------------------------------------------
def arity_of(fn: Any) -> int:
    """How many arguments the function value ``fn`` takes."""
    if isinstance(fn, Closure):
        return len(fn.graph.parameters)
    if isinstance(fn, FuncGraph):
        return len(fn.parameters)
    if isinstance(fn, Partial):
        return arity_of(fn.fn) - len(fn.args)
    if isinstance(fn, Primitive):
        if fn.max_args is not None and fn.min_args == fn.max_args:
            return fn.min_args
        raise GradientError(f"grad of {fn.name} needs a function of fixed arity; wrap it in a lambda")
    raise GradientError(f"grad needs a function, not {type(fn).__name__}")


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


def generate_grad(args: tuple, with_value: bool) -> FuncGraph:
    """The graph for a call ``grad(f, i...)`` (``value_and_grad`` with ``with_value``)."""
    if not args:
        raise GradientError("grad needs a function")
    nparams = arity_of(args[0])
    wrt, multi = normalize_wrt(args[1:], nparams)
    return grad_graph(nparams, wrt, multi, with_value, len(args) - 1)


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


__all__ = ["arity_of", "build_grad_body", "generate_grad", "grad_call_graph", "grad_graph",
           "j_value", "normalize_wrt"]

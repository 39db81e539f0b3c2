"""``anfir.grad``, ``anfir.value_and_grad`` and ``anfir.vjp``: new FuncGraphs.

Each returns an ordinary FuncGraph (printable, dumpable, compilable,
runnable) built around ``▸g`` — the J transform of ``g`` — with ``g``'s
parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

from anfir.autodiff.forward import jvp_api
from anfir.autodiff.jtransform import check_differentiable_graph, j_graph
from anfir.autodiff.gradgraphs import build_grad_body, normalize_wrt
from anfir.errors import UsageError
from anfir.ir.graph import FuncGraph, Module
from anfir.ir.manager import analyse
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.walk import reachable_graphs, toposort
from anfir.primitives import gradient, meta as metas, structure

Wrt = Union[int, Sequence[int]]


def entry_graph(graph: Union[FuncGraph, Module]) -> FuncGraph:
    """The graph the API differentiates: ``graph``, or a Module's entry; closures refused."""
    if isinstance(graph, Module):
        return graph.entry
    if not isinstance(graph, FuncGraph):
        raise UsageError(f"expected a FuncGraph, not {type(graph).__name__}")
    if analyse(graph).free_variables_total(graph):
        raise UsageError(f"@{graph.name} is a closure (it has free variables); differentiate "
                         "the graph that makes it, or call grad inside the program")
    return graph


def _wrt(wrt: Wrt, nparams: int) -> tuple[tuple[int, ...], bool]:
    if isinstance(wrt, int) and not isinstance(wrt, bool):
        indices, _ = normalize_wrt([wrt], nparams)
        return indices, False
    if not isinstance(wrt, (list, tuple)) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in wrt):
        shown = repr(wrt) if len(repr(wrt)) <= 40 else type(wrt).__name__
        raise UsageError(f"wrt is an argument index or a tuple of them (wrt=0, wrt=(0, 2)), "
                         f"not {shown}")
    return normalize_wrt(list(wrt), nparams)[0], True


def _gradient(graph: FuncGraph, wrt: Wrt, with_value: bool, prefix: str) -> FuncGraph:
    graph = entry_graph(graph)
    check_differentiable_graph(graph)
    indices, multi = _wrt(wrt, len(graph.parameters))
    result = FuncGraph(f"{prefix}{graph.name}", graph.loc)
    xs = [result.add_parameter(p.name or f"x{i}", p.loc) for i, p in enumerate(graph.parameters)]
    for new, old in zip(xs, graph.parameters):
        new.annotation = old.annotation
    forward = ValueNode(j_graph(graph))
    result.output = build_grad_body(result, forward, xs, indices, multi, with_value, graph.loc)
    result.flags[API_GRAD] = ApiGradient(graph, indices, multi, with_value)
    return result


API_GRAD = "api_gradient"
"""The flag of a graph :func:`grad` / :func:`value_and_grad` made: what it differentiates."""


@dataclass(frozen=True)
class ApiGradient:
    """What an API gradient graph computes: ``grad(graph, indices...)`` of its arguments."""

    graph: FuncGraph
    indices: tuple[int, ...]
    multi: bool
    with_value: bool


def in_program_form(graph: FuncGraph) -> Optional[FuncGraph]:
    """For a graph :func:`grad` made (of a graph it made, ...) whose program itself
    differentiates (calls ``grad``, ``value_and_grad``, ``jvp``): the same gradient
    written as a ``grad`` call in a program, ``(x...) -> grad(g, i...)(x...)``, which
    the compiler expands after typing.  None for the others (compiled as they are).

    The graph :func:`grad` returns is built around ``▸g``, made before typing; the
    transform of a closure that ``g``'s own ``grad`` makes is only known once typed,
    and its gradient environment would be keyed by nodes the compiled program no
    longer has — the in-program form has no such transform made in advance."""
    chain: list[ApiGradient] = []
    current = graph
    while isinstance(current.flags.get(API_GRAD), ApiGradient):
        info = current.flags[API_GRAD]
        chain.append(info)
        current = info.graph
    if not chain or not _differentiates(current):
        return None
    for info in reversed(chain):
        base = info.graph
        loc = base.loc
        made = FuncGraph(f"∇{current.name}", loc)
        xs = [made.add_parameter(p.name or f"x{i}", p.loc) for i, p in enumerate(base.parameters)]
        for new, old in zip(xs, base.parameters):
            new.annotation = old.annotation
        meta = metas.value_and_grad if info.with_value else metas.grad
        fn = CNode(made, [ValueNode(meta), ValueNode(current), *(ValueNode(i) for i in info.indices)],
                   loc)
        out: Node = CNode(made, [fn, *xs], loc)
        if info.multi and len(info.indices) == 1:  # wrt=(i,): a tuple of one gradient
            if info.with_value:
                value = CNode(made, [ValueNode(structure.tuple_getitem), out, ValueNode(0)], loc)
                grads = CNode(made, [ValueNode(structure.tuple_getitem), out, ValueNode(1)], loc)
                out = CNode(made, [ValueNode(structure.make_tuple), value,
                                   CNode(made, [ValueNode(structure.make_tuple), grads], loc)], loc)
            else:
                out = CNode(made, [ValueNode(structure.make_tuple), out], loc)
        made.output = out
        current = made
    return current


_DIFFERENTIATIONS = (metas.grad, metas.value_and_grad, metas.jvp, gradient.J)


def _differentiates(graph: FuncGraph) -> bool:
    """Whether code in ``graph``'s reach calls or names a differentiation."""
    for g in reachable_graphs([graph]):
        for node in toposort(g):
            if isinstance(node, CNode) and any(
                    isinstance(i, ValueNode) and any(i.value is d for d in _DIFFERENTIATIONS)
                    for i in node.inputs):
                return True
    return False


def grad(graph: FuncGraph, wrt: Wrt = 0) -> FuncGraph:
    """A FuncGraph with ``graph``'s parameters returning the gradient w.r.t. ``wrt``
    (a tuple of gradients when ``wrt`` is a sequence)."""
    return _gradient(graph, wrt, False, "∇")


def value_and_grad(graph: FuncGraph, wrt: Wrt = 0) -> FuncGraph:
    """Like :func:`grad`, returning ``(value, gradient)``."""
    return _gradient(graph, wrt, True, "∇")


def vjp(graph: FuncGraph) -> FuncGraph:
    """A FuncGraph ``(*args) -> (out, bprop)``; ``bprop(dout)`` returns the tuple of
    input gradients (one per parameter)."""
    graph = entry_graph(graph)
    check_differentiable_graph(graph)
    result = FuncGraph(f"vjp_{graph.name}", graph.loc)
    xs = [result.add_parameter(p.name or f"x{i}", p.loc) for i, p in enumerate(graph.parameters)]
    t = CNode(result, [ValueNode(j_graph(graph)), *xs], graph.loc)
    value = CNode(result, [ValueNode(structure.tuple_getitem), t, ValueNode(0)], graph.loc)
    bp = CNode(result, [ValueNode(structure.tuple_getitem), t, ValueNode(1)], graph.loc)
    pull = FuncGraph(f"vjp_bprop_{graph.name}", graph.loc)
    dout = pull.add_parameter("dout")
    grads = CNode(pull, [bp, dout], graph.loc)
    pull.output = CNode(pull, [ValueNode(structure.make_tuple)] + [
        CNode(pull, [ValueNode(structure.tuple_getitem), grads, ValueNode(1 + i)], graph.loc)
        for i in range(len(xs))], graph.loc)
    result.output = CNode(result, [ValueNode(structure.make_tuple), value, ValueNode(pull)], graph.loc)
    return result


def jvp(graph: FuncGraph) -> FuncGraph:
    """A FuncGraph ``(*args, *tangents) -> (out, tangent_out)``: forward mode (see
    :mod:`anfir.autodiff.forward`)."""
    graph = entry_graph(graph)
    check_differentiable_graph(graph)
    return jvp_api(graph)

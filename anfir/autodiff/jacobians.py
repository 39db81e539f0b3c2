"""``jacfwd``, ``jacrev`` and ``hessian``: Jacobians from ``vmap`` and the derivatives.

* ``jacfwd(f, i)(x...)`` pushes every basis vector of argument ``i``'s space
  through ``jvp(f)`` at once — ``vmap`` over the tangents, the batch axis put
  last (``out_axes=-1``) — so the result has shape ``out.shape + x_i.shape``;
* ``jacrev(f, i)(x...)`` pulls every basis vector of the output's space back
  through ``f``'s pullback (``J(f)``), ``vmap`` over the cotangents;
* ``hessian(f, i)`` is ``jacrev(grad(f, i), i)``: reverse over reverse, whose
  values are JAX's ``jacfwd(jacrev(f))``.

Each is the graph of a maker ``(f, i) -> (x...) -> ...`` that calls the other
meta functions, so the evaluator and the compiler expand it as they expand
those.
"""

from __future__ import annotations

from typing import Any, Optional

from anfir.autodiff.batching import BatchingError
from anfir.autodiff.runtime import arity_of
from anfir.ir.attrs import NO_ATTRS, Attrs
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.primitives import batching as bp, gradient, meta, structure


def _wrt(args: tuple, what: str) -> tuple[int, int]:
    if not 1 <= len(args) <= 2:
        raise BatchingError(f"{what} takes a function and an argument index, got {len(args)} arguments")
    n = arity_of(args[0])
    i = args[1] if len(args) > 1 else 0
    if isinstance(i, bool) or not isinstance(i, int) or not -n <= i < n:
        raise BatchingError(f"{what}'s argument index must be an integer in range for a "
                            f"function of {n} arguments, not {i!r}")
    return n, i % n


def _maker(name: str, nargs: int, known: Optional[Node] = None) -> tuple[FuncGraph, Node, FuncGraph]:
    """The maker ``(f, i) -> inner``, ``f`` (its parameter, or ``known``: the function
    itself when the compiler knows it, and the maker is then not used) and ``inner``."""
    outer = FuncGraph(name)
    f = outer.add_parameter("f")
    for k in range(nargs - 1):
        outer.add_parameter(f"i{k}")
    inner = FuncGraph(name + "▸")
    outer.output = ValueNode(inner)
    return outer, (f if known is None else known), inner


def _call(graph: FuncGraph, fn: Node, *args: Node) -> CNode:
    return CNode(graph, [fn, *args])


def _prim(graph: FuncGraph, prim: Any, *args: Node, attrs: Any = None) -> CNode:
    return CNode(graph, [ValueNode(prim), *args], attrs=prim.canonical_attrs(attrs) if attrs else NO_ATTRS)


def jacfwd_graph(n: int, i: int, nargs: int, known: Optional[Node] = None) -> FuncGraph:
    """``(f, i) -> (x...) -> reshape(vmap(t ↦ jvp(f)(x, e_i(t))[1], 0, -1)(basis(x_i)))``."""
    outer, f, inner = _maker("jacfwd", nargs, known)
    xs = [inner.add_parameter(f"x{k}") for k in range(n)]
    push = FuncGraph("jacfwd_push")
    t = push.add_parameter("t")
    tangents = [t if k == i else _prim(push, structure.zeros_like, xs[k]) for k in range(n)]
    pushed = _call(push, _call(push, ValueNode(meta.jvp), f), *xs, *tangents)
    push.output = _prim(push, structure.tuple_getitem, pushed, ValueNode(1))
    batched = _call(inner, ValueNode(meta.vmap), ValueNode(push), ValueNode(0), ValueNode(-1))
    columns = _call(inner, batched, _prim(inner, bp.jac_basis, xs[i]))
    inner.output = _prim(inner, bp.batch_reshape, columns, xs[i], attrs={"how": "jac_back"})
    return outer


def jacrev_graph(n: int, i: int, nargs: int, known: Optional[Node] = None) -> FuncGraph:
    """``(f, i) -> (x...) -> reshape(vmap(u ↦ pullback(u)[i], 0, 0)(basis(f(x))))``."""
    outer, f, inner = _maker("jacrev", nargs, known)
    xs = [inner.add_parameter(f"x{k}") for k in range(n)]
    forward = _call(inner, _prim(inner, gradient.J, f), *xs)
    out = _prim(inner, structure.tuple_getitem, forward, ValueNode(0))
    back = _prim(inner, structure.tuple_getitem, forward, ValueNode(1))
    pull = FuncGraph("jacrev_pull")
    u = pull.add_parameter("u")
    pull.output = _prim(pull, structure.tuple_getitem, _call(pull, back, u), ValueNode(1 + i))
    batched = _call(inner, ValueNode(meta.vmap), ValueNode(pull), ValueNode(0), ValueNode(0))
    rows = _call(inner, batched, _prim(inner, bp.jac_basis, out))
    inner.output = _prim(inner, bp.batch_reshape, rows, out, attrs={"how": "jac_front"})
    return outer


def hessian_graph(n: int, i: int, nargs: int, known: Optional[Node] = None) -> FuncGraph:
    """``(f, i) -> (x...) -> jacrev(grad(f, i), i)(x...)``."""
    outer, f, inner = _maker("hessian", nargs, known)
    xs = [inner.add_parameter(f"x{k}") for k in range(n)]
    g = _call(inner, ValueNode(meta.grad), f, *([ValueNode(i)] if n > 1 else []))
    jac = _call(inner, ValueNode(meta.jacrev), g, ValueNode(i))
    inner.output = _call(inner, jac, *xs)
    return outer


def known_jacobian(which: Any, fn: FuncGraph, wrt: int, loc: Any = None) -> FuncGraph:
    """``which(fn, wrt)`` (``which`` one of ``meta.jacfwd``/``jacrev``/``hessian``) for a
    function the compiler knows: the graph ``(x...) -> ...`` itself, calling ``fn`` as a
    constant (what :func:`anfir.passes.vmap.expand_batching` puts in place of the call)."""
    builders = {meta.jacfwd: jacfwd_graph, meta.jacrev: jacrev_graph, meta.hessian: hessian_graph}
    n, i = _wrt((fn, wrt), which.name)
    outer = builders[which](n, i, 2, ValueNode(fn, loc))
    inner = outer.output
    assert isinstance(inner, ValueNode) and isinstance(inner.value, FuncGraph)
    made: FuncGraph = inner.value
    made.name = f"{which.name}_{fn.name}"
    return made


def generate_jacfwd(args: tuple) -> FuncGraph:
    """The graph for a run-time call ``jacfwd(f, i)``."""
    n, i = _wrt(args, "jacfwd")
    return jacfwd_graph(n, i, len(args))


def generate_jacrev(args: tuple) -> FuncGraph:
    """The graph for a run-time call ``jacrev(f, i)``."""
    n, i = _wrt(args, "jacrev")
    return jacrev_graph(n, i, len(args))


def generate_hessian(args: tuple) -> FuncGraph:
    """The graph for a run-time call ``hessian(f, i)``."""
    n, i = _wrt(args, "hessian")
    return hessian_graph(n, i, len(args))


def api_graph(which: Any, graph: FuncGraph, wrt: int) -> FuncGraph:
    """``anfir.jacfwd`` / ``jacrev`` / ``hessian``: ``(x...) -> which(graph, wrt)(x...)``."""
    if isinstance(wrt, bool) or not isinstance(wrt, int):
        raise BatchingError(f"wrt is an argument index, not {wrt!r}")
    n = len(graph.parameters)
    if not -n <= wrt < n:
        raise BatchingError(f"wrt={wrt} but @{graph.name} takes {n} arguments")
    made = FuncGraph(f"{which.name}_{graph.name}", graph.loc)
    xs = [made.add_parameter(p.name or f"x{k}", p.loc) for k, p in enumerate(graph.parameters)]
    fn = CNode(made, [ValueNode(which), ValueNode(graph), ValueNode(wrt % n)], graph.loc)
    made.output = CNode(made, [fn, *xs], graph.loc)
    return made


__all__ = ["api_graph", "known_jacobian", "generate_hessian", "generate_jacfwd", "generate_jacrev", "hessian_graph",
           "jacfwd_graph", "jacrev_graph"]

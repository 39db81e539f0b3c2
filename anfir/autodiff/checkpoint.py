"""The graphs behind ``checkpoint(f)`` and ``anfir.checkpoint``.

``checkpoint(f)`` stands for a *wrapper* ``C(x1..xn) = f(x1..xn)`` whose graph
carries the flag :data:`~anfir.primitives.checkpointing.CHECKPOINT_FLAG`.  Its
value is ``f``'s; what differs is its J transform
(:mod:`anfir.autodiff.jtransform`): ``▸C`` keeps only the value of ``▸f(x)``
(the backpropagator ``◂f`` it made, with every intermediate ``f`` computed,
is dropped at once), and ``◂C(dout)`` calls ``▸f`` again on its inputs read
through ``remat_barrier(x, dout)`` and runs the backpropagator of that second
call: the forward pass recomputed inside the backward pass.  Everything the
J transform handles (closures, ``if``, loops, recursion) goes through
unchanged, since the wrapper is one ordinary call; ``◂C`` is made of
differentiable primitives and calls, so grad of grad works.

* :func:`checkpoint_graph` — ``(f) -> C``, what a call ``checkpoint(f)`` stands
  for (the ``ad`` phase inlines it, the evaluator runs it);
* :func:`generate_checkpoint`, :func:`generate_checkpoint_for_types` — the
  meta function's generators (installed by :mod:`anfir.wiring`);
* :func:`checkpoint_api` — ``anfir.checkpoint(g)``.
"""

from __future__ import annotations

from typing import Any, Optional

from anfir.autodiff.jtransform import check_function_value
from anfir.autodiff.partials import call_node, fixed_arity
from anfir.autodiff.runtime import arity_of
from anfir.errors import GradientError
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, ValueNode
from anfir.primitives.checkpointing import CHECKPOINT_FLAG, checkpoint

_templates: dict[int, FuncGraph] = {}


def build_checkpoint_graph(nparams: int) -> FuncGraph:
    """``lambda (f) lambda (x1..xn) f(x1..xn) end end``, the inner graph flagged."""
    outer = FuncGraph("checkpoint")
    f = outer.add_parameter("f")
    inner = FuncGraph("checkpointed")
    inner.flags[CHECKPOINT_FLAG] = True
    xs = [inner.add_parameter(f"x{i}") for i in range(nparams)]
    inner.output = call_node(inner, f, *xs)
    outer.output = ValueNode(inner)
    return outer


def checkpoint_graph(nparams: int) -> FuncGraph:
    """The template the ``ad`` phase and the specializer copy (never run itself)."""
    graph = _templates.get(nparams)
    if graph is None:
        graph = _templates[nparams] = build_checkpoint_graph(nparams)
    return graph


def generate_checkpoint(args: tuple) -> FuncGraph:
    """The graph for a run-time call ``checkpoint(f)``: a new one per call (running a
    graph attaches a manager to it and the run-time J caches the transforms of its
    closures; a later J of an enclosing graph must not reuse them)."""
    if len(args) != 1:
        raise GradientError(f"checkpoint takes one function, got {len(args)} arguments")
    nparams = arity_of(args[0])
    check_function_value(args[0])
    return build_checkpoint_graph(nparams)


def generate_checkpoint_for_types(args: tuple) -> Optional[FuncGraph]:
    """The graph for ``checkpoint(f)`` when ``f``'s abstract value fixes its arity."""
    nparams = fixed_arity(args[0]) if len(args) == 1 else None
    return None if nparams is None else checkpoint_graph(nparams)


def checkpoint_api(graph: Any) -> FuncGraph:
    """``anfir.checkpoint(g)``: a new FuncGraph ``(*args) -> checkpoint(g)(*args)``:
    ``g``'s values; its gradient recomputes ``g``'s forward pass."""
    if not isinstance(graph, FuncGraph):
        raise GradientError(f"anfir.checkpoint takes a FuncGraph, not {type(graph).__name__}")
    result = FuncGraph(f"checkpoint_{graph.name}", graph.loc)
    xs = [result.add_parameter(p.name or f"x{i}", p.loc) for i, p in enumerate(graph.parameters)]
    wrapped = CNode(result, [ValueNode(checkpoint, graph.loc), ValueNode(graph, graph.loc)], graph.loc)
    result.output = CNode(result, [wrapped, *xs], graph.loc)
    return result


__all__ = ["build_checkpoint_graph", "checkpoint_api", "checkpoint_graph", "generate_checkpoint",
           "generate_checkpoint_for_types"]

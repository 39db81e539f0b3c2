"""Typing calls of J-transformed functions (``JFn`` atoms) for the specializer.

A call of ``J(f)`` is typed by materialising ``▸f`` — the same graph the
evaluator would run — and inferring a call of it; no separate type rules for
transformed functions are needed, and the result is exact.

The ``▸f`` built for typing belong to the inference engine that types them
(one :class:`~anfir.autodiff.jtransform.JContext` per engine), never to the
run-time cache: the passes after typing may still change ``f`` (fold away a
captured value), and the evaluator must then transform the graph it really
runs, not the one typing saw.  Inference also types ``▸f`` in place, which
must not leak into later compilations.
"""

from __future__ import annotations

import weakref
from typing import Any, Optional

from anfir.autodiff.jtransform import JContext, j_graph
from anfir.autodiff.primitive_j import j_prim_graph
from anfir.infer.engine import Engine, Infer
from anfir.abstract.values import AFunction, FunctionAtom, GraphFn, JFn, PrimFn
from anfir.errors import InferenceError
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode
from anfir.ir.primitive import Primitive

_contexts: "weakref.WeakKeyDictionary[Engine, JContext]" = weakref.WeakKeyDictionary()


def _context_of(engine: Engine) -> JContext:
    """The J context of ``engine`` (made on first use, dropped with the engine)."""
    context = _contexts.get(engine)
    if context is None:
        context = _contexts[engine] = JContext()
    return context


def transformed_graph(atom: FunctionAtom, nargs: int,
                      context: Optional[JContext] = None) -> Optional[FuncGraph]:
    """The graph ``J(atom)`` runs when called with ``nargs`` arguments (None if unknown).

    Graphs are transformed in ``context`` (the shared run-time one if None).
    """
    # J(J(...J(atom))): find the innermost atom first, then transform outwards
    # (a loop, so deep nesting does not recurse).
    depth = 0
    while isinstance(atom, JFn):
        atom = atom.fn
        depth += 1
    graph: Optional[FuncGraph] = None
    if isinstance(atom, GraphFn):
        graph = j_graph(atom.graph, context)
    elif isinstance(atom, PrimFn) and isinstance(atom.prim, Primitive):
        graph = j_prim_graph(atom.prim, nargs)
    if graph is None:
        return None
    for _ in range(depth):
        graph = j_graph(graph, context)
    return graph


def call_j(engine: Engine, atom: FunctionAtom, args: tuple, node: Optional[CNode]) -> Infer:
    """Type a call of ``J(f)`` as a call of the graph ``▸f`` (the engine's JFn caller)."""
    assert isinstance(atom, JFn)
    graph = transformed_graph(atom.fn, len(args), _context_of(engine))
    if graph is None:
        raise InferenceError(f"cannot infer a call of {atom} (the J transform of this kind of "
                             "function is only known at run time)", node.loc if node else None)
    result: Any = yield from engine.call(AFunction(frozenset({GraphFn(graph)})), args, node)
    return result


__all__ = ["call_j", "transformed_graph"]

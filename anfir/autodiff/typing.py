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

from anfir.autodiff.jtransform import JContext, j_graph, j_meta
from anfir.autodiff.partials import atom_arity, j_partial_call, j_skip
from anfir.autodiff.primitive_j import j_prim_graph
from anfir.autodiff.gradgraphs import grad_call_graph
from anfir.infer.engine import Engine, Infer
from anfir.abstract.values import (AbstractValue, AFunction, FunctionAtom, GradFn, GraphFn, JFn,
                                   PartialFn, PrimFn)
from anfir.errors import InferenceError
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.primitives.gradient import J

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


def _j_abstract(value: AbstractValue) -> AbstractValue:
    """The abstract value of ``J(x)`` for ``x`` of abstract ``value`` (``J``'s own rule)."""
    rule = J.infer
    assert rule is not None  # declared with a rule
    result: AbstractValue = rule(value)
    return result


def j_of_atom(engine: Engine, atom: FunctionAtom, args: tuple) -> Optional[FunctionAtom]:
    """A function atom the engine can call that computes ``J(atom)`` on ``args``, for the
    atoms whose transform is not a graph of their own: a partial application (the
    J-world partial of the transformed function and values), a gradient function
    (the partial application of :func:`~anfir.autodiff.gradgraphs.grad_call_graph` to
    its function) and a meta function (its J-transform).  None for the others.

    The run-time ``J`` makes the same values (:func:`~anfir.autodiff.runtime.j_value`),
    so a compiled program computes what ``anfir.run`` does."""
    if isinstance(atom, GradFn):
        nparams = atom_arity(atom.fn)
        if nparams is None or len(args) != nparams:
            return None
        wrt = tuple(i % nparams for i in atom.wrt)
        fn_value = AFunction(frozenset({atom.fn}))
        template = grad_call_graph(nparams, wrt, len(wrt) > 1, atom.with_value)
        graph = engine.typing_copy(template, (fn_value, *args))
        atom = PartialFn(GraphFn(graph), (fn_value,))
    if isinstance(atom, PartialFn):
        bound_fn = atom.fn
        bound_value: Any = bound_fn.graph if isinstance(bound_fn, GraphFn) else (
            bound_fn.prim if isinstance(bound_fn, PrimFn) else None)
        return PartialFn(PrimFn(j_partial_call(len(atom.args), j_skip(bound_value))),
                         (AFunction(frozenset({JFn(atom.fn)})),
                          *(_j_abstract(a) for a in atom.args)))
    if isinstance(atom, PrimFn) and isinstance(atom.prim, MetaFunction):
        return PrimFn(j_meta(atom.prim))
    if isinstance(atom, JFn):
        inner = j_of_atom(engine, atom.fn, args)
        if inner is not None:
            return j_of_atom(engine, inner, args) or JFn(inner)
    return None


def call_j(engine: Engine, atom: FunctionAtom, args: tuple, node: Optional[CNode]) -> Infer:
    """Type a call of ``J(f)`` as a call of the graph ``▸f`` (the engine's JFn caller)."""
    assert isinstance(atom, JFn)
    reduced = j_of_atom(engine, atom.fn, args)
    if reduced is not None:
        value: Any = yield from engine.call_atom(reduced, args, node)
        return value
    graph = transformed_graph(atom.fn, len(args), _context_of(engine))
    if graph is None:
        raise InferenceError(f"cannot infer a call of {atom} (the J transform of this kind of "
                             "function is only known at run time)", node.loc if node else None)
    result: Any = yield from engine.call(AFunction(frozenset({GraphFn(graph)})), args, node)
    return result


__all__ = ["call_j", "j_of_atom", "transformed_graph"]

"""Typing calls of J-transformed functions (``JFn`` atoms) for the specializer.

A call of ``J(f)`` is typed by materialising ``▸f`` — the same graph the
evaluator would run — and inferring a call of it; no separate type rules for
transformed functions are needed, and the result is exact.
"""

from __future__ import annotations

from typing import Any, Optional

from anfir.abstract.engine import Engine, Infer, register_atom_caller
from anfir.abstract.values import AFunction, FunctionAtom, GraphFn, JFn, PrimFn
from anfir.errors import InferenceError
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode


def transformed_graph(atom: FunctionAtom, nargs: int) -> Optional[FuncGraph]:
    """The graph ``J(atom)`` runs when called with ``nargs`` arguments (None if unknown)."""
    from anfir.autodiff.jtransform import j_graph
    from anfir.autodiff.primitive_j import j_prim_graph

    if isinstance(atom, GraphFn):
        return j_graph(atom.graph)
    if isinstance(atom, PrimFn) and hasattr(atom.prim, "impl"):
        return j_prim_graph(atom.prim, nargs)
    if isinstance(atom, JFn):
        inner = transformed_graph(atom.fn, nargs)
        return j_graph(inner) if inner is not None else None
    return None


def _call_j(engine: Engine, atom: FunctionAtom, args: tuple, node: Optional[CNode]) -> Infer:
    assert isinstance(atom, JFn)
    graph = transformed_graph(atom.fn, len(args))
    if graph is None:
        raise InferenceError(f"cannot infer a call of {atom} (the J transform of this kind of "
                             "function is only known at run time)", node.loc if node else None)
    result: Any = yield from engine.call(AFunction(frozenset({GraphFn(graph)})), args, node)
    return result


register_atom_caller(JFn, _call_j)

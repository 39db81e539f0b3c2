"""Typed node builders for passes that run after ``specialize``.

A pass that rewrites the typed program makes each node with its abstract value
set at once (the project never re-infers after a rewrite); these are the few
shapes such passes build: a primitive call, a tuple, an item of a tuple, an
integer constant, a graph constant.
"""

from __future__ import annotations

from typing import Any, Optional

from anfir.abstract.values import AbstractValue, AFunction, ANone, AScalar, ATensor, ATuple, GraphFn
from anfir.infer.engine import constant_abstract
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.primitives import structure


def apply(graph: FuncGraph, inputs: list[Node], abstract: AbstractValue, loc: Any,
          attrs: Any = None) -> CNode:
    """``inputs[0](*inputs[1:])`` in ``graph``, typed ``abstract``."""
    node = CNode(graph, inputs, loc, attrs=attrs) if attrs is not None else CNode(graph, inputs, loc)
    node.abstract = abstract
    return node


def prim(primitive: Primitive) -> ValueNode:
    """A constant node holding ``primitive``."""
    node = ValueNode(primitive)
    node.abstract = constant_abstract(node)
    return node


def int_const(value: int) -> ValueNode:
    """An ``i64`` constant node."""
    node = ValueNode(value)
    node.abstract = AScalar("i64", value)
    return node


def graph_value(graph: FuncGraph) -> ValueNode:
    """A constant node holding ``graph`` (a function value)."""
    node = ValueNode(graph)
    node.abstract = AFunction(frozenset({GraphFn(graph)}))
    return node


def make_tuple(graph: FuncGraph, items: list[Node], loc: Any) -> CNode:
    """``(items...)`` in ``graph``."""
    return apply(graph, [prim(structure.make_tuple), *items],
                 ATuple(tuple(i.abstract for i in items)), loc)


def getitem(graph: FuncGraph, tup: Node, index: int, loc: Any) -> CNode:
    """``tup[index]`` in ``graph``; ``tup`` must be typed as a tuple."""
    items: Optional[tuple[AbstractValue, ...]] = (
        tup.abstract.items if isinstance(tup.abstract, ATuple) else None)
    assert items is not None, "getitem of a node not typed as a tuple"
    return apply(graph, [prim(structure.tuple_getitem), tup, int_const(index)], items[index], loc)


def is_data_type(a: Any) -> bool:
    """Whether ``a`` types data: tensors, numbers, None and tuples of them (what a
    loop's carry may hold; a function may not)."""
    stack = [a]
    while stack:
        x = stack.pop()
        if isinstance(x, ATuple):
            stack.extend(x.items)
        elif not isinstance(x, (ATensor, AScalar, ANone)):
            return False
    return True

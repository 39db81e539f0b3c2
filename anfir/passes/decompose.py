"""Decompose composite primitives into core ones, for a back end that lacks them.

::

    decompose(graph, keep=onnx_export.NATIVE)

rewrites, in place, every call of a primitive that has an entry in
:data:`anfir.decompositions.DECOMPOSITIONS` and is not in ``keep`` (the
composites the back end writes natively) into the entry's expansion, on the
optimized, typed graph every back end starts from.  The expansions are written
once, over anfir primitives (as PyTorch's ``torch/_decomp`` is over ATen), so
the ONNX, Core ML, MindIR and low-level back ends share them; each declares only
what it keeps.

The pass is one walk over the nodes plus a worklist of the nodes the
expansions make (an expansion may use another composite the target lacks:
``cross_entropy`` uses ``log_softmax``).  New nodes are typed from their
inputs' abstracts by the primitive's own shape rule as they are made; nothing
is re-inferred.  An expansion that needs a static fact it does not have
(a known shape, a constant input) declines: the call stays and the back end
reports it, located, as a primitive it cannot write.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Union

from anfir.abstract.values import AScalar, ATensor
from anfir.decompositions import DECOMPOSITIONS
from anfir.decompositions.builder import ExpansionBuilder, Declined
from anfir.errors import AnfirTypeError
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import manage
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.location import Location


class HasGraph(Protocol):
    """A compile result (anything holding the optimized entry ``graph``)."""

    graph: FuncGraph


Declines = dict[tuple[Primitive, Optional[Location]], str]
"""Why expansions declined: (primitive, the call's location) → the reason (the first one)."""


def decompose(target: Union[FuncGraph, HasGraph], keep: frozenset[Primitive],
              declined: Optional[Declines] = None) -> FuncGraph:
    """Expand, in place, every composite call of ``target`` (a graph or a compile result)
    whose primitive is not in ``keep``; returns the graph.  Linear in the program's size.
    ``declined``, when given, receives why each call left in place was (so a back end
    without a rule for it can say so)."""
    graph = target if isinstance(target, FuncGraph) else target.graph
    manager = graph.manager or manage(graph)
    work: list[CNode] = []
    for g in list(manager.graphs):
        work.extend(node for node in manager.nodes.get(g, ())
                    if isinstance(node, CNode) and _expands(node, keep) is not None)
    work.reverse()  # popped in the graphs' and nodes' order: the output is deterministic
    while work:
        node = work.pop()
        if not manager.tracks(node):
            continue  # dead: an earlier expansion replaced its only user
        call = _call_of(node, keep)
        if call is None:
            continue
        builder = call
        try:
            new = DECOMPOSITIONS[builder.prim](builder)
        except Declined as why:
            if declined is not None:
                declined.setdefault((builder.prim, node.loc), str(why))
            continue
        if new is node or not _same_kind(new.abstract, node.abstract):
            continue  # an expansion that would change the value's type is not applied
        manager.replace(node, new)
        # The expansion's own composites, in the order it made them.
        work.extend(reversed([c for c in builder.created if _expands(c, keep) is not None]))
    return graph


def _same_kind(new: Any, old: Any) -> bool:
    """Whether an expansion typed ``new`` may stand for a call typed ``old``: the same kind
    of value, dtype and rank (dimensions may be spelled differently)."""
    if isinstance(old, ATensor):
        return isinstance(new, ATensor) and new.dtype == old.dtype and new.rank == old.rank
    if isinstance(old, AScalar):
        return isinstance(new, AScalar) and new.dtype == old.dtype
    return type(new) is type(old)


def _expands(node: Node, keep: frozenset[Primitive]) -> Optional[Primitive]:
    """The primitive of ``node`` when it is a call the pass expands."""
    if not isinstance(node, CNode) or not node.inputs:
        return None
    callee = node.inputs[0]
    if not isinstance(callee, ValueNode) or not isinstance(callee.value, Primitive):
        return None
    prim = callee.value
    return prim if prim in DECOMPOSITIONS and prim not in keep else None


def _call_of(node: CNode, keep: frozenset[Primitive]) -> Optional[ExpansionBuilder]:
    """A builder for ``node``: its inputs, and its attributes with the positional ones
    (constants after the inputs) folded in; None when those are not constants."""
    prim = _expands(node, keep)
    if prim is None:
        return None
    args = node.inputs[1:]
    count = prim.input_count(len(args))
    positional: list[Any] = []
    for extra in args[count:]:
        if not isinstance(extra, ValueNode):
            return None
        positional.append(extra.value)
    try:
        attrs = prim.bound_attrs(node.attrs, positional)
    except AnfirTypeError:  # a malformed call: leave it to the back end's located error
        return None
    return ExpansionBuilder(node, prim, args[:count], attrs)


__all__ = ["decompose", "HasGraph", "Declines"]

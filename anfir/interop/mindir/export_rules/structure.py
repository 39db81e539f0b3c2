"""MindIR export rules of :mod:`anfir.primitives.structure`: tuples, ``switch``, ``partial``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any


from anfir.interop.mindir.export_rules.common import (Rule, broadcast, dtype_of, elementwise, leafwise,
                                                      registrar, shape_of_abstract, static, zero_env)
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.abstract.values import AScalar, ATensor
from anfir.interop.mindir.common import TYPE_ID_OF
from anfir.interop.mindir.environments import is_env, signature, slot_types
from anfir.ir.graph import FuncGraph
from anfir.primitives import structure

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.mindir.writer import Writer

RULES: dict[Primitive, Rule] = {}
"""This family's primitives -> how each is written as MindSpore ops."""
UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives MindIR cannot hold, with the reason."""
rule_of = registrar(RULES)


_plain_zeros_like = elementwise("ZerosLike")


@rule_of(structure.zeros_like)
def _zeros_like_rule(w: Writer, node: CNode) -> str:
    # the zero of an environment is the environment with nothing stored
    if w.envs is not None and is_env(node.abstract):
        return zero_env(w, w.envs)
    return _plain_zeros_like(w, node)

@rule_of(structure.make_tuple)
def _make_tuple(w: Writer, node: CNode) -> str:
    # An int constant item is an anfir Python int (a reshape's (b, l, 4, -1)): a scalar
    # value node, as the items computed next to it are, not a 0-d tensor.
    # A run-time scalar item (a shape's dimension) stays a MindSpore scalar.
    name = w.emit("MakeTuple", [_tuple_item(w, a) for a in node.args])
    items = frozenset(k for k, a in enumerate(node.args) if w.is_scalar(a) or _int_constant(a))
    return w.mark_scalar(name, items) if items else name

def _int_constant(node: Node) -> bool:
    return isinstance(node, ValueNode) and isinstance(node.value, int) and not isinstance(node.value, bool)

def _tuple_item(w: Writer, node: Node) -> str:
    if _int_constant(node):
        return w.constant(node.value, scalar=True)  # type: ignore[attr-defined]
    return w.raw(node) if w.is_scalar(node) else w.ref(node)

@rule_of(structure.tuple_getitem)
def _getitem(w: Writer, node: CNode) -> str:
    index = static(node.args[1], "a tuple index")
    # A scalar INT64 value node: a 0-d tensor index crashes MindSpore.
    if int(index) in w.scalar_items(node.args[0]):  # a run-time shape's dimension: a scalar
        return w.mark_scalar(w.emit("TupleGetItem", [w.raw(node.args[0]), w.constant(int(index), scalar=True)]))
    return w.emit("TupleGetItem", [w.ref(node.args[0]), w.constant(int(index), scalar=True)],
                  abstract=node.abstract)

@rule_of(structure.switch)
def _switch(w: Writer, node: CNode) -> str:
    """``Switch`` of functions (the branches of an ``if``); a switch of data (a branch's
    gradient environment, joined after the call) is a ``Select`` per tensor: MindSpore's
    control-flow scheduler refuses a data ``Switch`` whose operand is a tuple it made
    ("Failed to get level for formal parameter")."""
    abstract = node.abstract
    if w.envs is not None and is_env(abstract) and all(is_env(a.abstract) for a in node.args[1:]):
        abstract = slot_types(w.envs)
    if signature(abstract) is None:
        return w.emit("Switch", [w.ref(a) for a in node.args])
    cond = w.ref(node.args[0])
    if dtype_of(node.args[0].abstract) != "bool":  # Select takes a bool mask
        cond = w.emit("Cast", [cond, w.constant(TYPE_ID_OF["bool"], scalar=True)])

    def select(x: str, y: str, leaf: Any) -> str:
        if isinstance(leaf, ATensor) and leaf.shape is not None and \
                not all(isinstance(d, int) for d in leaf.shape):  # the mask to x's run-time Shape
            # an environment's slot may hold its 0-d zero on one side: each side plus the
            # other's zeros has the common shape
            x, y = (w.emit("Add", [x, w.emit("ZerosLike", [y])]), w.emit("Add", [y, w.emit("ZerosLike", [x])]))
            return w.emit("Select", [w.emit("BroadcastTo", [cond, w.emit("Shape", [x])]), x, y], abstract=leaf)
        shape = () if isinstance(leaf, AScalar) else shape_of_abstract(leaf)
        mask = cond if shape == () else broadcast(w, cond, shape)
        return w.emit("Select", [mask, x, y], abstract=leaf)
    return leafwise(w, w.ref(node.args[1]), w.ref(node.args[2]), abstract, select)

@rule_of(structure.partial)
def _partial(w: Writer, node: CNode) -> str:
    fn, *args = node.args
    if isinstance(fn, ValueNode) and isinstance(fn.value, FuncGraph):
        h = fn.value
        inputs = [w.graph_names[h], *(w.ref(v) for v in w.fvs.get(h, ())), *(w.ref(a) for a in args)]
        return w.emit("Partial", inputs)
    return w.emit("Partial", [w.ref(fn), *(w.ref(a) for a in args)])

@rule_of(structure.identity, structure.stop_gradient)
def _identity(w: Writer, node: CNode) -> str:
    if node.is_apply(structure.stop_gradient):
        return w.emit("StopGradient", [w.ref(node.args[0])], abstract=node.abstract)
    return w.ref(node.args[0])  # identity: the value itself

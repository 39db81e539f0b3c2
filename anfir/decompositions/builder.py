"""What a decomposition writes with: typed node builders over one composite call.

A decomposition (a :data:`Decomposition`) receives a :class:`ExpansionBuilder` for the
call it replaces and returns the node that computes the same value from other
primitives, or raises :class:`Declined` (through :meth:`ExpansionBuilder.decline` or a
shape it needs and does not have) to leave the call as it is.  Every node the
builder makes is typed at once from its inputs' abstracts by the primitive's
own shape rule (``specialize.infer_call``): the pass never re-infers the
program.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from anfir.abstract.lattice import abstract_of_value
from anfir.abstract.values import UNKNOWN, AbstractValue, AScalar, ATensor
from anfir.dtypes import numpy_dtype
from anfir.errors import AnfirError
from anfir.ir.attrs import NO_ATTRS
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.location import Location
from anfir.passes.specialize import infer_call
from anfir.primitives import structure, tensor

Operand = Union[Node, int, float, bool, str, tuple, None, np.ndarray, np.generic]
"""What a builder call takes as an input: a node, or a constant value."""


class Declined(Exception):
    """A decomposition does not apply to this call (a static shape or value it needs
    is not known): the call stays, and the back end reports it if it has no rule."""


class ExpansionBuilder:
    """Builds typed nodes in the graph of the composite call ``node``."""

    def __init__(self, node: CNode, prim: Primitive, inputs: Sequence[Node],
                 attrs: dict[str, Any]) -> None:
        self.node = node
        """The composite call being replaced."""
        self.prim = prim
        """Its primitive."""
        self.inputs = tuple(inputs)
        """Its tensor inputs (positional attributes taken out)."""
        self.attrs = attrs
        """Every attribute of the call, defaults filled in."""
        self.loc: Optional[Location] = node.loc.derive(f"decompose: {prim.name}") \
            if node.loc is not None else None
        self.created: list[CNode] = []
        """The nodes made so far (the pass looks at them for further composites)."""

    # -- building -------------------------------------------------------------------------
    def const(self, value: Any) -> ValueNode:
        """A typed constant."""
        node = ValueNode(value, self.loc)
        try:
            node.abstract = abstract_of_value(value)
        except AnfirError:
            raise Declined(f"no type for the constant {value!r}") from None
        return node

    def typed(self, value: float, dtype: str) -> ValueNode:
        """A 0-d constant of ``dtype`` (where a Python number would be weak on both sides
        of an op, ``where(c, 1.0, 0.0)``, and give f64)."""
        return self.const(np.asarray(value, dtype=numpy_dtype(dtype)))

    def node_of(self, operand: Operand) -> Node:
        """``operand`` as a node (a constant for a plain value)."""
        return operand if isinstance(operand, Node) else self.const(operand)

    def call(self, prim: Primitive, *args: Operand, **attrs: Any) -> CNode:
        """``prim(*args, **attrs)`` as a typed node."""
        inputs = [self.const(prim), *(self.node_of(a) for a in args)]
        canonical = prim.canonical_attrs(attrs) if attrs else NO_ATTRS
        node = CNode(self.node.graph, inputs, self.loc, None, canonical)
        if any(i.abstract is None for i in inputs):
            raise Declined("an untyped input")
        try:
            node.abstract = infer_call(inputs[0].abstract, [i.abstract for i in inputs[1:]],
                                       self.loc, canonical)
        except AnfirError as error:
            raise Declined(str(error)) from None
        self.created.append(node)
        return node

    def decline(self, why: str) -> Declined:
        """The exception to raise when the expansion does not apply (``raise b.decline(...)``)."""
        return Declined(why)

    # -- questions ------------------------------------------------------------------------
    def arg(self, index: int) -> Node:
        """The call's ``index``-th tensor input."""
        return self.inputs[index]

    def has(self, index: int) -> bool:
        """Whether the optional input ``index`` is given and not the constant None."""
        if index >= len(self.inputs):
            return False
        node = self.inputs[index]
        return not (isinstance(node, ValueNode) and node.value is None)

    @staticmethod
    def abstract(node: Node) -> AbstractValue:
        """The node's type."""
        return node.abstract

    def dtype(self, node: Node) -> str:
        """The node's element dtype."""
        a = node.abstract
        if isinstance(a, (ATensor, AScalar)):
            return a.dtype
        raise Declined(f"not a tensor: {a}")

    def shape(self, node: Node) -> tuple[Any, ...]:
        """The node's shape (dims may be symbols); a scalar's is ``()``."""
        a = node.abstract
        if isinstance(a, AScalar):
            return ()
        if isinstance(a, ATensor) and a.shape is not None:
            return tuple(a.shape)
        raise Declined("the rank is not known")

    def static_shape(self, node: Node) -> tuple[int, ...]:
        """The node's shape, every dimension known."""
        shape = self.shape(node)
        if not all(isinstance(d, int) for d in shape):
            raise Declined("a dimension is not known")
        return tuple(int(d) for d in shape)

    def dim(self, node: Node, axis: int) -> Union[int, Node]:
        """Dimension ``axis`` of ``node``: an int when known, else a node computing it at run
        time (``shape(node)[axis]``)."""
        shape = self.shape(node)
        d = shape[axis]
        if isinstance(d, (int, np.integer)):
            return int(d)
        return self.call(structure.tuple_getitem, self.call(tensor.shape, node), axis % len(shape))

    def shape_of(self, dims: Sequence[Union[int, Node]]) -> Union[tuple[int, ...], Node]:
        """A shape operand from dimensions: a tuple constant when all are ints, else a
        tuple built at run time."""
        if all(isinstance(d, int) for d in dims):
            return tuple(int(d) for d in dims)  # type: ignore[arg-type]
        return self.call(structure.make_tuple, *dims)

    def rank(self, node: Node) -> int:
        """The node's rank."""
        return len(self.shape(node))

    def static(self, node: Node) -> Any:
        """The value of a constant input."""
        if isinstance(node, ValueNode):
            return node.value
        a = node.abstract
        value = getattr(a, "value", None)
        if isinstance(a, AScalar) and value is not UNKNOWN:
            return value
        raise Declined("an input that must be a constant is not one")


Decomposition = Callable[[ExpansionBuilder], Node]
"""``rule(builder) -> node``: the expansion of the builder's call (raises :class:`Declined`
when it does not apply)."""

"""What the ONNX importer and its rule table share: the element-type table, the
errors a rule raises, what ONNX says of a value (:class:`TypeInfo`), the names in
scope (:class:`Scope`) and what a rule sees (:class:`Ctx`).

:mod:`anfir.interop.onnx.import_rules` (the rules) and :mod:`anfir.interop.onnx.importer`
(the importer) both build on this module, so neither imports the other's
internals at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, Union

import numpy as np

from anfir.dtypes import BY_NAME, dtype_name
from anfir.errors import AnfirError, MissingDependencyError
from anfir.interop.onnx.exporter import ONNX_TYPES, EXTRA
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import Node, ParameterNode, ValueNode

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.onnx.importer import Importer

DTYPE_OF_ELEM: dict[int, str] = {v: k for k, v in ONNX_TYPES.items() if k != "str"}
"""ONNX ``TensorProto.DataType`` → anfir dtype (the exporter's table, read backwards)."""

MIN_OPSET = 7
"""The oldest default-domain opset the importer reads."""


class OnnxImportError(AnfirError):
    """A model the importer cannot read: the message lists every node (name and
    op type) whose op, opset or type is not supported, all at once."""

    kind = "import error"

    needs_values: tuple[str, ...] = ()
    """Graph inputs whose values were needed as constants (see ``bind=``)."""


class NodeError(Exception):
    """Raised by an op rule for one node; collected into an :class:`OnnxImportError`."""


class UseFunctionBody(NodeError):
    """A rule does not cover this node's inputs or attributes (e.g. a loss's class
    weights): the op is then expanded through its ONNX function body, when it has one."""


class NeedsValue(NodeError):
    """A graph input is used where anfir takes a constant (axes, a shape): importing
    with that input's value bound (``bind=``) would succeed."""

    def __init__(self, message: str, input_name: str, input_names: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.input_name = input_name
        self.input_names = tuple(input_names) or (input_name,)


def require_onnx() -> Any:
    """The ``onnx`` module, or a :class:`MissingDependencyError` naming the extra."""
    try:
        import onnx
        import onnx.defs  # noqa: F401
        import onnx.numpy_helper  # noqa: F401
        import onnx.shape_inference  # noqa: F401
    except ImportError:
        raise MissingDependencyError(
            f'importing ONNX needs the onnx package: pip install "anfir[{EXTRA}]"') from None
    return onnx


# -- values while importing --------------------------------------------------------------
@dataclass
class TypeInfo:
    """What ONNX says of a value: its element dtype and dims (None when unknown)."""

    dtype: Optional[str] = None
    dims: Optional[tuple[Optional[Union[int, str]], ...]] = None

    @property
    def rank(self) -> Optional[int]:
        """The rank, when known."""
        return None if self.dims is None else len(self.dims)

    @property
    def static_shape(self) -> Optional[tuple[int, ...]]:
        """The shape when every dim is a known integer."""
        if self.dims is None or not all(isinstance(d, int) for d in self.dims):
            return None
        return tuple(int(d) for d in self.dims)  # type: ignore[arg-type]


@dataclass
class Scope:
    """Names visible while one ONNX graph (or subgraph, or function body) is built:
    its own values, then the enclosing scope's (read by name: free variables)."""

    graph: FuncGraph
    parent: Optional["Scope"] = None
    values: dict[str, Node] = field(default_factory=dict)

    def lookup(self, name: str) -> Optional[Node]:
        """The node bound to ``name`` here or in an enclosing scope."""
        scope: Optional[Scope] = self
        while scope is not None:
            if name in scope.values:
                return scope.values[name]
            scope = scope.parent
        return None


class Ctx:
    """What an op rule sees: the node, its inputs, attributes and the graph it builds in."""

    def __init__(self, importer: "Importer", scope: Scope, node: Any, opset: int) -> None:
        self.importer = importer
        self.scope = scope
        self.node = node
        self.opset = opset
        self.graph = scope.graph
        self.attrs: dict[str, Any] = {}
        for attr in node.attribute:
            self.attrs[attr.name] = attr

    # -- inputs ----------------------------------------------------------------------------
    def input(self, index: int) -> Optional[Node]:
        """The node of input ``index`` (None when absent or empty)."""
        names = self.node.input
        if index >= len(names) or names[index] == "":
            return None
        found = self.scope.lookup(names[index])
        if found is None:
            raise NodeError(f"input {names[index]!r} is not defined before it is used")
        return found

    def inputs(self) -> list[Optional[Node]]:
        """Every input's node, None for absent ones."""
        return [self.input(i) for i in range(len(self.node.input))]

    def need(self, index: int) -> Node:
        """The node of a required input."""
        node = self.input(index)
        if node is None:
            raise NodeError(f"input {index} is required")
        return node

    def type_of(self, index: int) -> TypeInfo:
        """What ONNX shape inference says of input ``index``."""
        names = self.node.input
        if index >= len(names):
            return TypeInfo()
        found = self.importer.types.get(names[index], TypeInfo())
        if names[index] and (found.dtype is None or found.static_shape is None):
            # ONNX says too little (a subgraph's value, a shape computed from data):
            # anfir's inference of the node built for it may say more.
            node = self.scope.lookup(names[index])
            if node is not None:
                return self.importer.refined_type(found, node)
        return found

    def out_type(self, index: int = 0) -> TypeInfo:
        """What ONNX shape inference says of output ``index``."""
        names = self.node.output
        if index >= len(names):
            return TypeInfo()
        return self.importer.types.get(names[index], TypeInfo())

    def dtype(self, index: int) -> str:
        """The element dtype of input ``index`` (from its constant, or shape inference)."""
        node = self.input(index)
        if isinstance(node, ValueNode) and isinstance(node.value, np.ndarray):
            known = dtype_name(node.value.dtype)
            if known is not None:
                return known
        found = self.type_of(index).dtype
        if found is None:
            raise NodeError(f"the element type of input {index} is unknown")
        return found

    def rank(self, index: int) -> int:
        """The rank of input ``index``."""
        node = self.input(index)
        if isinstance(node, ValueNode) and isinstance(node.value, np.ndarray):
            return int(node.value.ndim)
        found = self.type_of(index).rank
        if found is None:
            message = f"the rank of input {index} is unknown"
            # Computed from integer graph inputs only (a shape given as an input):
            # binding their values makes it known.
            names = self.importer.entry_inputs_of(node) if node is not None else []
            if names and all((self.importer.types.get(n) or TypeInfo()).dtype in ("i64", "i32") for n in names):
                raise NeedsValue(message, names[0], names)
            raise NodeError(message)
        return found

    def static(self, index: int, what: str) -> Optional[np.ndarray]:
        """The constant value of input ``index`` (None when absent); an input that is
        computed at run time is an error: anfir takes ``what`` statically."""
        node = self.input(index)
        if node is None:
            return None
        if isinstance(node, ValueNode) and isinstance(node.value, np.ndarray):
            return node.value
        if isinstance(node, ValueNode) and isinstance(node.value, (int, float, bool, np.generic)):
            return np.asarray(node.value)
        message = (f"{what} (input {index}, {self.node.input[index]!r}) must be a constant: "
                   "anfir takes it statically")
        if isinstance(node, ParameterNode) and node.graph is self.importer.entry:
            raise NeedsValue(message, node.name or "")
        names = self.importer.entry_inputs_of(node)
        if names:
            # Computed from graph inputs only (a shape given as an input, then
            # arithmetic): binding those inputs makes it a constant.
            raise NeedsValue(message, names[0], names)
        raise NodeError(message)

    # -- attributes ------------------------------------------------------------------------
    def attr(self, name: str, default: Any = None) -> Any:
        """The value of attribute ``name`` (numpy for tensors, lists for repeated), or ``default``."""
        attr = self.attrs.get(name)
        if attr is None:
            return default
        return self.importer.attribute_value(attr)

    # -- building --------------------------------------------------------------------------
    def call(self, prim: Any, *args: Any, **attrs: Any) -> Node:
        """``prim(*args, **attrs)`` in the current graph, folded when every argument
        is a constant and the primitive may be folded."""
        return self.importer.call(self.graph, prim, args, attrs, None)

    def const(self, value: Any, dtype: Optional[str] = None) -> ValueNode:
        """A constant tensor (of ``dtype`` when given)."""
        array = np.asarray(value) if dtype is None else np.asarray(value, dtype=BY_NAME[dtype].numpy)
        return ValueNode(array)


OpRule = Callable[[Ctx], Sequence[Optional[Node]]]
"""A rule: the nodes of the ONNX node's outputs, in order (None for an absent one)."""

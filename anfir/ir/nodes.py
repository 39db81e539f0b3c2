"""The three kinds of node of a FuncGraph (MindIR's ANode family).

* :class:`ParameterNode` — a formal parameter; owned by one graph.
* :class:`ValueNode` — a constant: scalar, str, None, tensor, tuple, primitive,
  meta function, FuncGraph, type...  Owned by no graph (``graph is None``), so a
  constant can be shared.
* :class:`CNode` — a call; ``inputs[0]`` is the callee, the rest are arguments.
  Owned by the graph it computes in.  An input owned by another graph is a
  free-variable edge: that is the *only* way closures are expressed (implicit
  scopes, as in Thorin and MindIR).

Invariants are kept by setters, as in torch.fx: change an edge only with
:meth:`CNode.set_input` (or the manager), never by editing ``inputs``; the
setter tells the graph's manager so users and free variables stay exact.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Iterable, Optional

from anfir.ir.attrs import NO_ATTRS, Attrs

if TYPE_CHECKING:  # pragma: no cover
    from anfir.ir.graph import FuncGraph
    from anfir.location import Location

_sequence = itertools.count()


class Node:
    """Common base of every node.

    ``seq`` is a creation counter used only to order nodes deterministically
    (never printed): two runs over the same input create nodes in the same
    order, unlike ``id()``.
    """

    __slots__ = ("graph", "loc", "abstract", "name", "annotation", "seq", "__weakref__")

    graph: Optional["FuncGraph"]
    """The graph this node computes in (None for ValueNodes)."""
    loc: Optional["Location"]
    """Where in the user's text the node comes from."""
    abstract: Any
    """The abstract value (type) inferred by the specializer, or None."""
    name: Optional[str]
    """The source variable's name, for readers (``c`` in ``let c = ...``)."""
    annotation: Any
    """A type annotation written by the user (``let h: f64[B, H] = ...``,
    ``def f(x: f64)``), an :mod:`anfir.ir.annotations` object, or None."""

    def __init__(self, graph: Optional["FuncGraph"], loc: Optional["Location"] = None,
                 name: Optional[str] = None) -> None:
        self.graph = graph
        self.loc = loc
        self.abstract = None
        self.name = name
        self.annotation = None
        self.seq = next(_sequence)

    @property
    def inputs(self) -> tuple["Node", ...]:
        """The node's inputs (empty for parameters and constants)."""
        return ()

    def is_apply(self, callee: Any = None) -> bool:
        """Whether this is a CNode, optionally one calling the constant ``callee``."""
        return False


class ParameterNode(Node):
    """A formal parameter of ``graph``."""

    __slots__ = ()

    graph: "FuncGraph"
    """The graph whose parameter this is (never None)."""

    def __init__(self, graph: "FuncGraph", name: str, loc: Optional["Location"] = None) -> None:
        super().__init__(graph, loc, name)

    def __repr__(self) -> str:
        owner = self.graph.name if self.graph is not None else "?"
        return f"<Parameter {self.name} of @{owner}>"


class ValueNode(Node):
    """A constant.  ``value`` is immutable (numpy arrays are not written to)."""

    __slots__ = ("value",)

    def __init__(self, value: Any, loc: Optional["Location"] = None,
                 name: Optional[str] = None) -> None:
        super().__init__(None, loc, name)
        self.value = value

    def __repr__(self) -> str:
        from anfir.ir.graph import FuncGraph

        if isinstance(self.value, FuncGraph):
            return f"<Value @{self.value.name}>"
        return f"<Value {self.value!r}>"


class CNode(Node):
    """A call ``inputs[0](inputs[1], ...)`` computed in ``graph``.

    ``attrs`` are the call's attributes (static keyword arguments of a
    primitive: ``sum(x, axis=1)``, see :mod:`anfir.ir.attrs`); only a call
    whose callee is a primitive constant has any.  Whoever copies a call
    copies them with it.
    """

    __slots__ = ("_inputs", "_attrs")

    graph: "FuncGraph"
    """The graph the call computes in (never None)."""

    def __init__(self, graph: "FuncGraph", inputs: Iterable[Node],
                 loc: Optional["Location"] = None, name: Optional[str] = None,
                 attrs: Attrs = NO_ATTRS) -> None:
        super().__init__(graph, loc, name)
        self._inputs: tuple[Node, ...] = tuple(inputs)
        self._attrs = attrs

    @property
    def attrs(self) -> Attrs:
        """The call's attributes (empty for most calls)."""
        return self._attrs

    def set_attrs(self, attrs: Attrs) -> None:
        """Replace the attributes (only for nodes no manager tracks yet: a managed
        call is replaced by a new CNode instead, so compiled code never goes stale)."""
        graph = self.graph
        if graph is not None and graph.manager is not None and graph.manager.tracks(self):
            raise RuntimeError("set_attrs on a managed node; build a new CNode instead")
        self._attrs = attrs

    @property
    def inputs(self) -> tuple[Node, ...]:
        """All inputs; ``inputs[0]`` is the callee."""
        return self._inputs

    @property
    def callee(self) -> Node:
        """``inputs[0]``."""
        return self._inputs[0]

    @property
    def args(self) -> tuple[Node, ...]:
        """``inputs[1:]``."""
        return self._inputs[1:]

    def set_input(self, index: int, node: Node) -> None:
        """Point input ``index`` at ``node``, keeping the manager's records exact."""
        graph = self.graph
        manager = graph.manager if graph is not None else None
        if manager is not None and manager.tracks(self):
            manager.set_edge(self, index, node)
        else:
            self._raw_set_input(index, node)

    def set_inputs(self, inputs: Iterable[Node]) -> None:
        """Point every input at the corresponding node of ``inputs`` (as many as
        there are now), keeping the manager's records exact.  One rebuild of the
        input tuple however many change: setting the inputs of a wide node one
        by one would copy its tuple once per input."""
        new = tuple(inputs)
        if len(new) != len(self._inputs):
            raise ValueError("set_inputs: give as many inputs as the node has")
        graph = self.graph
        manager = graph.manager if graph is not None else None
        if manager is not None and manager.tracks(self):
            manager.set_inputs(self, new)
        else:
            self._inputs = new

    def _raw_set_input(self, index: int, node: Node) -> None:
        # Only the manager (which updates its records itself) and builders of
        # not-yet-managed nodes may call this.
        inputs = self._inputs
        self._inputs = inputs[:index] + (node,) + inputs[index + 1:]

    def _raw_set_inputs(self, inputs: Iterable[Node]) -> None:
        # All inputs at once, for the same callers as _raw_set_input.
        self._inputs = tuple(inputs)

    def append_input(self, node: Node) -> None:
        """Add an argument at the end (only for nodes no manager tracks yet)."""
        graph = self.graph
        if graph is not None and graph.manager is not None and graph.manager.tracks(self):
            raise RuntimeError("append_input on a managed node; build a new CNode instead")
        self._inputs = self._inputs + (node,)

    def is_apply(self, callee: Any = None) -> bool:
        """Whether this calls the constant ``callee`` (any callee when None)."""
        if callee is None:
            return True
        head = self._inputs[0] if self._inputs else None
        return isinstance(head, ValueNode) and head.value is callee

    def __repr__(self) -> str:
        owner = self.graph.name if self.graph is not None else "?"
        head = self._inputs[0] if self._inputs else None
        what = repr(head) if head is not None else "?"
        label = f" {self.name}" if self.name else ""
        attrs = f" {self._attrs!r}" if self._attrs else ""
        return f"<CNode{label} in @{owner}: {what}(...{len(self._inputs) - 1} args){attrs}>"


def is_constant(node: Node, kind: type | tuple[type, ...] | None = None) -> bool:
    """Whether ``node`` is a ValueNode (whose value is an instance of ``kind``)."""
    if not isinstance(node, ValueNode):
        return False
    return kind is None or isinstance(node.value, kind)

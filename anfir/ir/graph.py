"""FuncGraph: a function as a graph of nodes, and the Module that names graphs."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Iterator, Optional

from anfir.errors import UsageError
from anfir.ir.attrs import NO_ATTRS, Attrs
from anfir.ir.nodes import CNode, Node, ParameterNode, ValueNode
from anfir.ir.upcalls import UPCALLS
from anfir.location import Location

if TYPE_CHECKING:  # pragma: no cover
    from anfir.ir.manager import Manager

_graph_sequence = itertools.count()


class FuncGraph:
    """A function: parameters, one output node, and the CNodes between them.

    A graph does not list its nodes: they are whatever is reachable from
    ``output`` (the manager keeps that set; :func:`toposort` orders it).  A
    graph is itself a value: a ``ValueNode(graph)`` used in another graph is a
    function constant, or — when the graph has free variables — a closure made
    at the point of use.  Nesting is never stored: ``manager.parent(g)`` is
    derived from where the free variables of ``g`` live.
    """

    __slots__ = ("name", "parameters", "_output", "loc", "manager", "flags",
                 "abstract", "seq", "node_meta", "__weakref__")

    name: str
    """The graph's name (``fibonacci``, ``✓fibonacci``, ``▸f``)."""
    parameters: list[ParameterNode]
    """Formal parameters, in order (append with :meth:`add_parameter`)."""
    loc: Optional["Location"]
    """Where the graph's definition starts in the user's text."""
    manager: Optional["Manager"]
    """The manager tracking this graph, if any."""
    flags: dict[str, Any]
    """Free-form annotations (``{"return_type": ...}``, ``{"core": True}``); the
    definition's doc string is ``flags["doc"]`` and its other attributes
    ``flags["meta"]`` (a dict of JSON values, see :mod:`anfir.ir.metadata`)."""
    node_meta: dict[CNode, dict[str, Any]]
    """Metadata of this graph's CNodes (doc string under ``"doc"``, an ONNX node's
    name and op type...), printed before the node's ``let`` and in dumps; a
    node's copies keep it (see :mod:`anfir.ir.metadata`)."""
    abstract: Any
    """The abstract signature once specialized (a graph-level type), or None."""

    def __init__(self, name: str = "g", loc: Optional["Location"] = None) -> None:
        self.name = name
        self.parameters = []
        self._output: Optional[Node] = None
        self.loc = loc
        self.manager = None
        self.flags = {}
        self.abstract = None
        self.seq = next(_graph_sequence)
        self.node_meta = {}

    # -- building -------------------------------------------------------------
    def add_parameter(self, name: str, loc: Optional["Location"] = None) -> ParameterNode:
        """Append a new parameter named ``name`` and return it."""
        if self.manager is not None:
            raise RuntimeError("add parameters before the graph is managed")
        param = ParameterNode(self, name, loc)
        self.parameters.append(param)
        return param

    def apply(self, callee: Any, *args: Any, loc: Optional["Location"] = None,
              name: Optional[str] = None, attrs: Attrs = NO_ATTRS) -> CNode:
        """Make ``callee(*args)`` in this graph; non-Node arguments become ValueNodes.
        ``attrs``: the call's attributes (for a primitive callee)."""
        inputs = [a if isinstance(a, Node) else ValueNode(a, loc) for a in (callee, *args)]
        return CNode(self, inputs, loc, name, attrs)

    @property
    def output(self) -> Node:
        """The node whose value the graph returns."""
        if self._output is None:
            raise ValueError(f"graph @{self.name} has no output yet")
        return self._output

    @output.setter
    def output(self, node: Node) -> None:
        if self.manager is not None and self._output is not None:
            self.manager.set_output(self, node)
        else:
            self._output = node
            if self.manager is not None:
                self.manager.set_output(self, node)

    def _raw_set_output(self, node: Node) -> None:
        self._output = node

    @property
    def has_output(self) -> bool:
        """Whether ``output`` has been set."""
        return self._output is not None

    # -- reading --------------------------------------------------------------
    def nodes(self) -> list[Node]:
        """This graph's own nodes (parameters first, then CNodes in dependency order).

        Reading never attaches a manager: an unmanaged graph is analysed by a
        throw-away one."""
        from anfir.ir.walk import toposort  # walk builds on this module: a cycle at import

        return toposort(self)

    def cnodes(self) -> Iterator[CNode]:
        """This graph's CNodes in dependency order."""
        for node in self.nodes():
            if isinstance(node, CNode):
                yield node

    def __repr__(self) -> str:
        return f"<FuncGraph @{self.name}({', '.join(p.name or '?' for p in self.parameters)})>"

    def _repr_svg_(self) -> Optional[str]:  # Jupyter display
        return UPCALLS.graph_svg(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # IPython's text form (shown when Graphviz is missing): the program itself.
        printer.text(repr(self) if cycle else str(self))

    def __str__(self) -> str:
        return UPCALLS.graph_text(self)


class Module:
    """Named top-level graphs from one source file (and its imports).

    ``module["f"]`` is the graph defined by ``def f``; ``module.entry`` is the
    graph a command runs by default (``main`` if defined, else the only one).
    """

    def __init__(self, graphs: Optional[dict[str, FuncGraph]] = None, filename: str = "<string>") -> None:
        self.graphs: dict[str, FuncGraph] = dict(graphs or {})
        """Top-level graphs by name, in definition order."""
        self.filename = filename
        """The file the module was read from."""
        self.default_entry: Optional[str] = None
        """The definition to run when none is named, when the module itself says
        which (a dump's ``# IR entry``; the entry a compile was asked for)."""
        self.imports: list[str] = []
        """The ``import "path"`` lines of the source, as written."""
        self.imported: dict[str, FuncGraph] = {}
        """Definitions brought in by imports, by name (not part of :attr:`graphs`)."""
        self.global_uses: list[ValueNode] = []
        """Every ``ValueNode(Symbol)`` the parser made (dead code included), for
        name resolution; emptied once names are resolved."""
        self.phase: Optional[str] = None
        """For a loaded dump, the phase that wrote it (``05_optimize``); None for source."""
        self.ir_entry: Optional[FuncGraph] = None
        """For a loaded dump, the graph its header names as the entry."""
        self.params: dict[str, Any] = {}
        """Values of lifted parameters by name, in order (importers fill it)."""
        self.metadata: dict[str, Any] = {}
        """Facts about where the module came from (producer, versions, its doc
        string under ``"doc"``...), JSON values by key: the header of its ANF text
        (``#@ key value`` lines) and of its dumps (``# Meta key: value``); see
        :mod:`anfir.ir.metadata`."""

    def __getitem__(self, name: str) -> FuncGraph:
        try:
            return self.graphs[name]
        except KeyError:
            raise UsageError(f"no graph named {name!r}; the module defines "
                             f"{', '.join(self.graphs) or 'nothing'}") from None

    def __contains__(self, name: object) -> bool:
        return name in self.graphs

    def __iter__(self) -> Iterator[str]:
        return iter(self.graphs)

    def __len__(self) -> int:
        return len(self.graphs)

    def entry_name(self, entry: Optional[str] = None) -> str:
        """Resolve the entry point name: ``entry``, else :attr:`default_entry`,
        else ``main``, else the only graph."""

        if entry is not None:
            if entry not in self.graphs:
                raise UsageError(f"no definition named {entry!r}; the module defines "
                                 f"{', '.join(self.graphs) or 'nothing'}")
            return entry
        if self.default_entry is not None and self.default_entry in self.graphs:
            return self.default_entry
        if "main" in self.graphs:
            return "main"
        if len(self.graphs) == 1:
            return next(iter(self.graphs))
        raise UsageError("the module has no 'main' and several definitions; choose one with "
                         f"--entry: {', '.join(self.graphs) or '(none)'}")

    @property
    def entry(self) -> FuncGraph:
        """The default entry graph (``main``, else the only definition)."""
        return self.graphs[self.entry_name()]

    def __repr__(self) -> str:
        return f"<Module {self.filename}: {', '.join(self.graphs)}>"

    def _repr_svg_(self) -> Optional[str]:  # Jupyter display
        return UPCALLS.graph_svg(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # IPython's text form (shown when Graphviz is missing): the program itself.
        printer.text(repr(self) if cycle else str(self))

    def __str__(self) -> str:
        return UPCALLS.graph_text(self)

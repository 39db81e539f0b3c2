"""Read a MindSpore ``.mindir`` file as a Module of FuncGraphs.

::

    mod = anfir.import_mindir("net.mindir")            # or the file's bytes
    anfir.run(mod.entry, x)                            # weights are constants
    mod = anfir.import_mindir("net.mindir", params_as_inputs=True)
    anfir.run(mod.entry, *mod.params.values(), x)      # weights first, as import_onnx does

How a model becomes graphs:

* ``ModelProto.graph`` is the entry, every ``functions`` graph a FuncGraph of
  the module (named after MindSpore's graph names); a graph's ``input`` are
  its parameters; the entry's ``parameter`` (weights) are constants, or with
  ``params_as_inputs=True`` the entry's first parameters, their values in
  ``Module.params`` keyed by their ``ref_key`` names;
* a node ``REF::<primitive>`` is built by :data:`import_ops.OPS` for the
  primitive's op type; ``REF::<graph>`` calls that graph; ``REF::<node>``
  calls the closure a node computed (a ``Switch`` of ``Partial``\\ s: anfir's
  ``if``); a while header graph is a tail-recursive anfir graph as it is;
* ``Constant`` nodes (whose names are global across graphs) become ValueNodes;
  a 0-d tensor stays a 0-d array, a scalar a Python number;
* monad plumbing (``UMonad``, ``Load``, ``UpdateState``, ``Depend``) is dropped:
  it only orders reads of parameters;
* every node that does not import is listed, all at once, in one
  :class:`MindirError` located at the first such node (its number in the
  file's order of nodes, its text the excerpt);
* provenance goes to ``Module.metadata`` (producer, versions, MindSpore's
  name of the entry graph), each graph's MindSpore name and attributes to
  ``flags["meta"]``, each node's name, op type and scope to ``graph.node_meta``.

Reading is bounded: the file through :func:`anfir.limits.read_bounded`, every
tensor's size from its declared shape before any allocation, external data
only from the model's own folder, and every walk iterative.
"""

from __future__ import annotations

import os
import re
from typing import Any, Optional, Union

from anfir import limits
from anfir.gcpause import gc_paused
from anfir.interop.mindir.common import TENSOR_DTYPES, MAX_MODEL_BYTES, MindirError, NodeError, check_count, model_location, tensor_of
from anfir.interop.mindir.import_ops import OPS, Ctx
from anfir.interop.mindir.schema import classes
from anfir.ir.graph import FuncGraph, Module
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.location import Location
from anfir.runtime_values import SymbolicKey

Source = Union[str, "os.PathLike[str]", bytes, bytearray, memoryview]

MONAD = None
"""The value a monad (UMonad, IOMonad) and an UpdateState become."""

MAX_GRAPHS = 100_000
MAX_NODES = 10_000_000


def read_model(source: Any) -> tuple[Any, str, Optional[str]]:
    """``(ModelProto, filename, folder)`` of a path or the bytes of a model."""
    model_class = classes()["ModelProto"]
    if isinstance(source, (bytes, bytearray, memoryview)):
        data, filename, folder = bytes(source), "<bytes>", None
    elif isinstance(source, (str, os.PathLike)):
        filename = os.fspath(source)
        try:
            data = limits.read_bounded(filename, MAX_MODEL_BYTES)
        except limits.ReadError as e:
            raise MindirError(f"cannot read {filename}: {e}") from None
        folder = os.path.dirname(os.path.abspath(filename))
    else:
        raise MindirError(f"import_mindir takes a path or bytes, not {type(source).__name__}",
                          Location("<argument>", 1, 1))
    model = model_class()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError (and RecursionError on deep nesting)
        raise MindirError(f"{filename} is not a .mindir model ({type(e).__name__}: {e})",
                          Location(filename, 1, 1)) from None
    if not model.HasField("graph"):
        raise MindirError(f"{filename} is not a .mindir model: it has no graph", Location(filename, 1, 1))
    return model, filename, folder


class Importer:
    """One model being read."""

    def __init__(self, model: Any, filename: str, folder: Optional[str], params_as_inputs: bool) -> None:
        self.model = model
        self.filename = filename
        self.folder = folder
        self.params_as_inputs = params_as_inputs
        self.A = classes()["AttributeProto"]
        self.errors: list[tuple[Location, str]] = []
        self.module = Module(filename=filename)
        self.primitives: dict[str, Any] = {}
        self.graphs: dict[str, FuncGraph] = {}
        self.protos: list[Any] = [model.graph, *model.functions]
        self.constants: dict[str, Any] = {}  # name -> (proto, location): decoded when used
        self.constant_nodes: dict[str, ValueNode] = {}
        self.first_number: dict[str, int] = {}  # graph name -> the file-order number of its node 0
        self.used_names: set[str] = set()
        self.unsupported: set[str] = set()

    def graph_name(self, name: str, entry: bool) -> str:
        """A readable, unique anfir name: ``main`` for the entry; MindSpore's name
        without its counters and ``__main__``/``construct`` decorations otherwise
        (the full name is kept in the graph's metadata)."""
        if entry:
            base = "main"
        else:
            base = re.sub(r"^\d+_\d+_(\d+_)*", "", name).replace("__main___", "").replace("_construct", "")
            base = base or "graph"
        out, k = base, 0
        while out in self.used_names:
            k += 1
            out = f"{base}_{k}"
        self.used_names.add(out)
        return out

    # -- errors ---------------------------------------------------------------------------
    def fail(self, loc: Location, message: str) -> None:
        self.errors.append((loc, message))

    def node_loc(self, graph: Any, node: Any, number: int) -> Location:
        inputs, outputs, name = _ss(node.input), _ss(node.output), _s(node.name)
        text = (f"{_s(graph.name)} / {name or (outputs[0] if outputs else '')} = {_s(node.op_type)}"
                f"({', '.join(inputs[:8])}{', ...' if len(inputs) > 8 else ''})")
        return model_location(self.filename, number, text)

    # -- values ---------------------------------------------------------------------------
    def attribute(self, attr: Any, what: str) -> Any:
        """An AttributeProto's value (numbers, strings, tensors, tuples, None, monads).
        Nesting is bounded by protobuf's own recursion limit when parsing."""
        A = self.A
        kind = attr.type
        # A scalar is in its singular field, or (inside a tuple) the one element of
        # the repeated one.
        if kind in (A.FLOAT,):
            return float(_one(attr, "f", "floats"))
        if kind == A.DOUBLE:
            return float(_one(attr, "d", "doubles"))
        if kind in (A.INT8, A.INT16, A.INT32, A.INT64, A.UINT8, A.UINT16, A.UINT32, A.UINT64):
            return int(_one(attr, "i", "ints"))
        if kind == A.BOOL:
            return bool(_one(attr, "i", "ints"))
        if kind == A.STRING:
            return attr.s.decode("utf-8", "replace")
        if kind == A.TENSOR:
            return tensor_of(attr.t, what, self.folder)
        if kind == A.TENSORS:  # how a constant tensor is written: one tensor with data
            check_count(len(attr.tensors), what)
            if len(attr.tensors) == 1:
                return tensor_of(attr.tensors[0], what, self.folder)
            return tuple(tensor_of(t, what, self.folder) for t in attr.tensors)
        if kind in (A.TUPLE, A.LIST):
            check_count(len(attr.values), what)
            return tuple(self.attribute(v, what) for v in attr.values)
        if kind == A.SYMBOL:  # a gradient environment's key (anfir's own exports)
            return SymbolicKey(attr.s.decode("utf-8", "replace"))
        if kind in (A.NONE, A.TYPE_NULL, A.UMONAD, A.IOMONAD):
            return MONAD if kind in (A.UMONAD, A.IOMONAD) else None
        if kind == A.UNDEFINED:
            # Plain lists written without a type (an attribute of repeated ints, floats...).
            for field in ("ints", "floats", "doubles", "strings"):
                values = getattr(attr, field)
                if len(values):
                    return tuple(v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in values)
            return None
        name = A.AttributeType.Name(kind) if kind in A.AttributeType.values() else str(kind)
        raise NodeError(f"{what} has a value of type {name}, which anfir does not read")

    def constant(self, name: str) -> ValueNode:
        node = self.constant_nodes.get(name)
        if node is None:
            proto, loc = self.constants[name]
            if not len(proto.attribute):
                raise NodeError(f"constant {name!r} has no value")
            node = ValueNode(self.attribute(proto.attribute[0], f"constant {name!r}"), loc, name=None)
            self.constant_nodes[name] = node
        return node

    # -- the model ------------------------------------------------------------------------
    def run(self) -> Module:
        try:
            return self.convert()
        except NodeError as e:  # a bound on the whole model
            raise MindirError(f"{self.filename}: {e}", Location(self.filename, 1, 1)) from None

    def convert(self) -> Module:
        model = self.model
        for prim in model.primitives:
            self.primitives[_s(prim.name)] = prim
        check_count(len(self.protos), "graphs", MAX_GRAPHS)
        number = 0
        for g in self.protos:
            if not _s(g.name) or _s(g.name) in self.graphs:
                raise MindirError(f"{self.filename}: graph name {_s(g.name)!r} is empty or used twice",
                                  Location(self.filename, 1, 1))
            self.graphs[_s(g.name)] = FuncGraph(self.graph_name(_s(g.name), entry=not self.graphs))
            check_count(len(g.node), f"graph {_s(g.name)!r}", MAX_NODES)
            self.first_number[_s(g.name)] = number + 1
            for node in g.node:
                number += 1
                if _s(node.op_type) == "Constant":
                    for name in {_s(node.name), *_ss(node.output)}:
                        if name:
                            self.constants[name] = (node, self.node_loc(g, node, number))
        # Every op anfir has no rule for, listed up front (not only the first on a path).
        for prim in model.primitives:
            if _s(prim.op_type) not in OPS:
                self.unsupported.add(_s(prim.name))
        for g in self.protos:
            for index, node in enumerate(g.node):
                target = _ref(_s(node.op_type))
                if target in self.unsupported:
                    op = self.primitives[target].op_type
                    self.fail(self.node_loc(g, node, self.first_number[_s(g.name)] + index),
                              f"graph {_s(g.name)}, node {_s(node.name)!r}: MindSpore op {op} has no anfir rule")
        for k, g in enumerate(self.protos):
            self.convert_graph(g, entry=(k == 0))
        if self.errors:
            listed = "\n  ".join(f"{loc.file}:{loc.line}: {msg}" for loc, msg in self.errors[:50])
            more = f"\n  ... and {len(self.errors) - 50} more" if len(self.errors) > 50 else ""
            raise MindirError(f"{self.filename}: {len(self.errors)} node(s) do not import:\n  "
                              f"{listed}{more}", self.errors[0][0])
        module = self.module
        entry = self.graphs[_s(model.graph.name)]
        module.graphs = {_s(g.name): g for g in self.graphs.values()}
        module.default_entry = entry.name
        module.metadata.update(self.metadata())
        return module

    def metadata(self) -> dict[str, Any]:
        m = self.model
        meta: dict[str, Any] = {"format": "mindir"}
        for field in ("producer_name", "model_version", "ir_version", "doc_string"):
            value = _s(getattr(m, field))
            if value:
                meta[field] = value
        if m.mind_ir_version:
            meta["mind_ir_version"] = int(m.mind_ir_version)
        if len(m.user_info):
            meta["user_info"] = {_s(e.key): _s(e.value) for e in m.user_info}
        meta["mindir_entry"] = _s(m.graph.name)
        return meta

    def convert_graph(self, g: Any, entry: bool) -> None:
        graph = self.graphs[_s(g.name)]
        scope: dict[str, Node] = {}
        meta: dict[str, Any] = {}
        for attr in g.attribute:
            if _s(attr.name) in ("is_while_header",):
                meta[_s(attr.name)] = bool(attr.i)
        graph.flags["meta"] = {"mindir_graph": _s(g.name), **meta}
        if _s(g.doc_string):
            graph.flags["doc"] = _s(g.doc_string)
        first = self.first_number[_s(g.name)]
        gloc = Location(self.filename, first, 1, f"graph {_s(g.name)}")
        graph.loc = gloc
        # Weights: constants, or (entry, params_as_inputs) the first parameters.
        for p in g.parameter:
            key = _s(p.ref_key) or _s(p.name).rpartition(":")[2] or _s(p.name)
            try:
                value = tensor_of(p, f"weight {key!r}", self.folder)
            except NodeError as e:
                self.fail(gloc, f"graph {_s(g.name)}: {e}")
                continue
            if entry and self.params_as_inputs:
                if key in self.module.params:
                    self.fail(gloc, f"graph {_s(g.name)}: two weights named {key!r}")
                    continue
                scope[_s(p.name)] = graph.add_parameter(_identifier(key), gloc)
                self.module.params[_identifier(key)] = value
            else:
                scope[_s(p.name)] = ValueNode(value, gloc, name=None)
        for inp in g.input:
            if not _s(inp.name) or _s(inp.name) in scope:
                self.fail(gloc, f"graph {_s(g.name)}: input {_s(inp.name)!r} is unnamed or named twice")
                continue
            scope[_s(inp.name)] = graph.add_parameter(_identifier(_s(inp.name).rpartition(":")[2] or _s(inp.name)), gloc)
        # The graph's own nodes by output name; converted in dependency order.
        own: dict[str, int] = {}
        nodes = list(g.node)
        for index, node in enumerate(nodes):
            if _s(node.op_type) == "Constant":
                continue
            names = list(_ss(node.output)) or [_s(node.name)]
            for name in names:
                if not name or name in own or name in scope:
                    self.fail(self.node_loc(g, node, first + index),
                              f"graph {_s(g.name)}: node output {name!r} is unnamed or defined twice")
                    continue
                own[name] = index
        order = self.dependency_order(g, nodes, own)
        if order is None:
            return
        for index in order:
            node = nodes[index]
            loc = self.node_loc(g, node, first + index)
            try:
                result = self.convert_node(g, graph, node, scope, own, loc)
            except _Failed:
                continue
            except NodeError as e:
                self.fail(loc, f"graph {_s(g.name)}, node {_s(node.name)!r} ({_s(node.op_type)}): {e}")
                continue
            for name in list(_ss(node.output)) or [_s(node.name)]:
                scope[name] = result
            if isinstance(result, CNode) and result.graph is graph and result not in graph.node_meta:
                info: dict[str, Any] = {"mindir_node": _s(node.name), "op_type": _s(node.op_type)}
                if _s(node.domain):
                    info["scope"] = _s(node.domain)
                graph.node_meta[result] = info
        if len(g.output) != 1:
            self.fail(gloc, f"graph {_s(g.name)} has {len(g.output)} outputs; a MindSpore graph has one")
            return
        out = _s(g.output[0].name)
        try:
            graph.output = self.lookup(g, graph, out, scope, own)
        except _Failed:
            pass
        except NodeError as e:
            self.fail(gloc, f"graph {_s(g.name)}: output {out!r}: {e}")

    def dependency_order(self, g: Any, nodes: list[Any], own: dict[str, int]) -> Optional[list[int]]:
        """The graph's nodes, each after the nodes of the graph it reads (iteratively);
        None (and an error) on a cycle."""
        order: list[int] = []
        state: dict[int, int] = {}  # 1 while on the stack, 2 when done

        def deps(index: int) -> list[int]:
            node = nodes[index]
            names = [*_ss(node.input)]
            callee = _ref(_s(node.op_type))  # REF::<node> calls what a node computed
            if callee is not None:
                names.append(callee)
            return [own[n] for n in names if n in own]

        for root in own.values():
            if root in state:
                continue
            state[root] = 1
            stack = [(root, deps(root), 0)]
            while stack:
                node, needs, k = stack[-1]
                if k == len(needs):
                    stack.pop()
                    state[node] = 2
                    order.append(node)
                    continue
                stack[-1] = (node, needs, k + 1)
                child = needs[k]
                seen = state.get(child)
                if seen == 2:
                    continue
                if seen == 1:
                    loc = self.node_loc(g, nodes[child], self.first_number[_s(g.name)] + child)
                    self.fail(loc, f"graph {_s(g.name)}: node {_s(nodes[child].name)!r} depends on itself "
                              "(a cycle)")
                    return None
                state[child] = 1
                stack.append((child, deps(child), 0))
        return order

    def lookup(self, g: Any, graph: FuncGraph, name: str, scope: dict[str, Node],
               own: dict[str, int]) -> Node:
        if name in scope:
            return scope[name]
        if name in self.constants:
            return self.constant(name)
        if name in self.graphs:
            return ValueNode(self.graphs[name])
        if name in own:
            raise _Failed(name)  # its own error is listed already
        raise NodeError(f"{name!r} is not a parameter, node or constant of graph {_s(g.name)}, nor a "
                        "graph (a free variable of another graph, or a dangling name)")

    def out_type(self, node: Any) -> tuple[Optional[tuple[int, ...]], Optional[str]]:
        """The node's result shape and dtype from its ``shape`` attribute (one tensor)."""
        for a in node.attribute:
            if _s(a.name) == "shape" and a.type == self.A.TENSORS and len(a.tensors) == 1:
                t = a.tensors[0]
                return tuple(int(d) for d in t.dims), TENSOR_DTYPES.get(t.data_type)
        return None, None

    def convert_node(self, g: Any, graph: FuncGraph, node: Any, scope: dict[str, Node],
                     own: dict[str, int], loc: Location) -> Node:
        args = [self.lookup(g, graph, name, scope, own) for name in _ss(node.input)]
        op = _s(node.op_type)
        target = _ref(op)
        if target is None:
            if op in OPS:  # an older form: the op's name, attributes on the node
                attrs = {_s(a.name): self.attribute(a, f"attribute {_s(a.name)!r}") for a in node.attribute
                         if _s(a.name) != "shape"}
                return OPS[op](Ctx(graph, loc, args, attrs, op, *self.out_type(node)))
            raise NodeError(f"op type {op!r} is not a reference (REF::...) anfir reads")
        if target in self.unsupported:
            raise _Failed(target)  # listed up front
        if target in self.primitives:
            prim = self.primitives[target]
            kind = _s(prim.op_type)
            if kind not in OPS:
                raise NodeError(f"MindSpore op {kind} has no anfir rule")
            attrs = {}
            for a in prim.attribute:
                if _s(a.name) in ("input_names", "output_names"):
                    continue
                try:
                    attrs[_s(a.name)] = self.attribute(a, f"attribute {_s(a.name)!r} of {kind}")
                except NodeError:
                    continue  # an attribute anfir's rule does not read (unusual types)
            return OPS[kind](Ctx(graph, loc, args, attrs, kind, *self.out_type(node)))
        if target in self.graphs:
            return graph.apply(self.graphs[target], *args, loc=loc)
        if target in scope:
            return graph.apply(scope[target], *args, loc=loc)
        raise NodeError(f"calls {target!r}, which is no primitive, graph or value of graph {_s(g.name)}")


def _s(value: Any) -> str:
    """A string field (protobuf hands a proto2 string with invalid UTF-8 over as bytes)."""
    return value if isinstance(value, str) else bytes(value).decode("utf-8", "replace")


def _ss(values: Any) -> list[str]:
    return [_s(v) for v in values]


class _Failed(NodeError):
    """A node read a value whose own node did not import (already listed)."""


def _one(attr: Any, single: str, repeated: str) -> Any:
    if attr.HasField(single):
        return getattr(attr, single)
    values = getattr(attr, repeated)
    if len(values) == 1:
        return values[0]
    if len(values) == 0:
        return getattr(attr, single)  # the default (0)
    raise NodeError(f"attribute {_s(attr.name)!r}: one number expected, {len(values)} given")


def _ref(op_type: str) -> Optional[str]:
    return op_type[5:] if op_type.startswith("REF::") else None


def _identifier(name: str) -> str:
    """A parameter name anfir's text can print (MindSpore names hold ``.`` and ``:``)."""
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return out if out and not out[0].isdigit() else f"p_{out}"


def import_mindir(source: Source, params_as_inputs: bool = False) -> Module:
    """A ``.mindir`` file (a path, or its bytes) as a Module; see the module doc."""
    model, filename, folder = read_model(source)
    with gc_paused():
        return Importer(model, filename, folder, params_as_inputs).run()


__all__ = ["Importer", "MindirError", "import_mindir", "read_model"]

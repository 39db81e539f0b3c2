"""Import an ONNX model as a Module of FuncGraphs.

::

    mod = anfir.import_onnx("model.onnx")                 # or an onnx.ModelProto
    anfir.run(mod.entry, x)                               # entry = the ONNX graph's name
    mod = anfir.import_onnx(model, params_as_inputs=True) # initializers become the
    anfir.grad(mod.entry, wrt=0)(*mod.params.values(), x) # first parameters

How a model becomes graphs:

* the main graph becomes the entry FuncGraph, named after the ONNX graph; its
  parameters are the graph inputs that have no initializer (with
  ``params_as_inputs=True``: every initializer first, in model order, their
  values in ``Module.params``), annotated with their ONNX types — ``dim_param``
  names are dimension variables shared by name across the signature, unknown
  dimensions fresh ones (``_d0``, ``_d1``...);
* each node is built by the rule :data:`anfir.interop.onnx.import_rules.OPS` holds for
  its op type and opset (one rule per op, over the operator library); an op
  with no rule whose ONNX schema is a function is expanded through the
  schema's own function body; model-local functions (``FunctionProto``) become
  FuncGraphs of the module, called by the graph;
* ``If`` is ``switch`` of two branch graphs that read outer values by name (free
  variables: anfir's closures); ``Loop`` and ``Scan`` are tail-recursive graphs
  carrying the loop state; ``Sequence`` values are tuples and an empty
  ``Optional`` is ``None``;
* constants fold while importing, so values ONNX passes as tensors but anfir
  takes as attributes (axes, shapes, pads) are known when they are constants;
* every unsupported op, opset or type is collected, and one
  :class:`OnnxImportError` lists them all, each with its node's name and op type;
* provenance (producer, versions, domain, doc string, opset imports,
  ``metadata_props``) goes to ``Module.metadata``; the ONNX graph's and each
  local function's doc string to its graph's ``flags["doc"]``; each node's
  ONNX name, op type and doc string to ``graph.node_meta`` of the first CNode
  it made (see :mod:`anfir.ir.metadata`: all of it prints in ANF text and
  dumps); output names name the CNodes.

The ``onnx`` package is imported when a model is read, never when anfir is
imported.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Callable, Optional, Sequence, Union

import numpy as np

from anfir import limits
from anfir.dtypes import BY_NAME, dtype_name
from anfir.errors import AnfirError
from anfir.interop.onnx.exporter import ONNX_TYPES
from anfir.interop.onnx.external import ExternalDataError, read_external
from anfir.abstract.lattice import abstract_of_value
from anfir.abstract.rules import static_of_abstract
from anfir.abstract.typeann import abstract_from_annotation
from anfir.abstract.shapes import fresh_dim
from anfir.abstract.values import AbstractValue, AScalar, ATensor
from anfir.ir.annotations import TensorAnn, TypeAnn
from anfir.ir.attrs import NO_ATTRS
from anfir.ir.graph import FuncGraph, Module
from anfir.ir.nodes import CNode, Node, ParameterNode, ValueNode
from anfir.ir.primitive import Primitive
from anfir.interop.onnx.common import (
    DTYPE_OF_ELEM, MIN_OPSET, Ctx, NeedsValue, NodeError, OnnxImportError, Scope, TypeInfo, UseFunctionBody, require_onnx,
)
from anfir.interop.onnx.import_rules import OPS
from anfir.interop.attributes import float32_attr
from anfir.primitives import structure, tensor

__all__ = ["DTYPE_OF_ELEM", "MIN_OPSET", "Importer", "OnnxImportError", "import_onnx", "read_model",
           "require_onnx", "with_input_shapes"]


def _fold_ok(prim: Any, values: Sequence[Any]) -> bool:
    # Fold only foldable primitives on data (never on graphs or functions).
    if not isinstance(prim, Primitive) or not prim.foldable or prim is structure.switch:
        return False
    return not any(isinstance(v, FuncGraph) for v in values)


BF16_CAST = tensor.cast

FOLD_LIMIT = 1 << 20
"""Folded constants up to this many elements are kept; bigger ones stay calls."""


class Importer:
    """One model being imported: the ONNX module, the opsets, types, functions, errors."""

    def __init__(self, onnx: Any, model: Any, params_as_inputs: bool, filename: str) -> None:
        self.onnx = onnx
        self.model = model
        self.params_as_inputs = params_as_inputs
        self.opsets: dict[str, int] = {_domain(o.domain): int(o.version) for o in model.opset_import}
        self.types: dict[str, TypeInfo] = {}
        self.sequence_types: dict[str, Any] = {}  # TypeProtos of sequence values, by name
        self.errors: list[str] = []
        self.needs_values: list[str] = []
        self.entry: Optional[FuncGraph] = None
        self.functions: dict[tuple[str, str], Any] = {(f.domain, f.name): f for f in model.functions}
        self.function_graphs: dict[Any, FuncGraph] = {}
        self.module = Module(filename=filename)
        self.base_dir: Optional[str] = None
        """The model file's directory, where external data is read (None for a ModelProto)."""
        self._fresh = itertools.count()
        self._graph_names: set[str] = set()
        # anfir's own abstract value of nodes built (kept with the node: ids stay unique).
        self._abstracts: dict[int, tuple[Node, Optional[AbstractValue]]] = {}

    # -- names -----------------------------------------------------------------------------
    def graph_name(self, base: str) -> str:
        """A graph name not used yet in this module."""
        base = base or "graph"
        name = base
        k = 0
        while name in self._graph_names:
            k += 1
            name = f"{base}_{k}"
        self._graph_names.add(name)
        return name

    def error(self, node: Any, message: str) -> None:
        """Record an error about ``node`` (reported with all the others at the end)."""
        label = f"node {node.name!r} ({node.op_type})" if node.name else f"a {node.op_type} node"
        domain = node.domain if node.domain not in ("", "ai.onnx") else ""
        if domain:
            label += f" of domain {domain!r}"
        self.errors.append(f"{label}: {message}")

    # -- attributes and tensors ------------------------------------------------------------
    def tensor(self, proto: Any) -> np.ndarray:
        """A TensorProto as a numpy array (its element type checked against anfir's)."""
        if proto.data_type not in DTYPE_OF_ELEM:
            raise NodeError(f"tensor {proto.name!r} has element type "
                            f"{self.onnx.TensorProto.DataType.Name(proto.data_type)}, "
                            "which anfir has no dtype for")
        count = 1
        for d in proto.dims:
            count *= max(int(d), 0)
        itemsize = np.dtype(BY_NAME[DTYPE_OF_ELEM[proto.data_type]].numpy).itemsize
        if count * itemsize > limits.MAX_CONSTANT_BYTES:
            raise NodeError(f"tensor {proto.name!r} has {count} elements: more than the "
                            "constant size limit")
        if proto.data_location == self.onnx.TensorProto.EXTERNAL:
            # MODEL.onnx.data beside the model (torch.onnx.export's default): read
            # within the model's directory and the size limits (anfir.interop.onnx.external).
            try:
                proto = read_external(self.onnx, proto, self.base_dir, itemsize)
            except ExternalDataError as e:
                raise NodeError(e.message) from None
        array = self.onnx.numpy_helper.to_array(proto)
        return np.array(array, dtype=BY_NAME[DTYPE_OF_ELEM[proto.data_type]].numpy)

    def attribute_value(self, attr: Any) -> Any:
        """An AttributeProto's value: numbers, strings, lists, numpy arrays, graphs."""
        A = self.onnx.AttributeProto
        if attr.ref_attr_name:
            raise NodeError(f"attribute {attr.name!r} refers to {attr.ref_attr_name!r} "
                            "outside a function")
        kind = attr.type
        if kind == A.FLOAT:
            return float32_attr(attr.f)
        if kind == A.INT:
            return int(attr.i)
        if kind == A.STRING:
            return attr.s.decode("utf-8", "replace")
        if kind == A.TENSOR:
            return self.tensor(attr.t)
        if kind == A.GRAPH:
            return attr.g
        if kind == A.FLOATS:
            return [float32_attr(x) for x in attr.floats]
        if kind == A.INTS:
            return [int(x) for x in attr.ints]
        if kind == A.STRINGS:
            return [s.decode("utf-8", "replace") for s in attr.strings]
        if kind == A.TENSORS:
            return [self.tensor(t) for t in attr.tensors]
        if kind == A.GRAPHS:
            return list(attr.graphs)
        raise NodeError(f"attribute {attr.name!r} has a type anfir does not read "
                        f"({A.AttributeType.Name(kind)})")

    # -- types -----------------------------------------------------------------------------
    def type_info(self, type_proto: Any) -> TypeInfo:
        """The TypeInfo of a TypeProto (tensors only; others give an empty TypeInfo)."""
        if type_proto.HasField("tensor_type"):
            tt = type_proto.tensor_type
            dtype = DTYPE_OF_ELEM.get(tt.elem_type)
            dims: Optional[tuple[Optional[Union[int, str]], ...]] = None
            if tt.HasField("shape"):
                dims = tuple(int(d.dim_value) if d.HasField("dim_value")
                             else (d.dim_param or None) for d in tt.shape.dim)
            return TypeInfo(dtype, dims)
        return TypeInfo()

    def collect_types(self, graph: Any) -> None:
        """Remember what ONNX says of every value of ``graph`` and its subgraphs."""
        stack = [graph]
        while stack:
            g = stack.pop()
            for vi in itertools.chain(g.input, g.output, g.value_info):
                if vi.type.HasField("sequence_type"):
                    self.sequence_types[vi.name] = vi.type
                info = self.type_info(vi.type)
                if info.dtype is not None or info.dims is not None:
                    self.types[vi.name] = info
            for init in g.initializer:
                if init.data_type in DTYPE_OF_ELEM:
                    self.types[init.name] = TypeInfo(DTYPE_OF_ELEM[init.data_type],
                                                      tuple(int(d) for d in init.dims))
            for node in g.node:
                for attr in node.attribute:
                    if attr.type == self.onnx.AttributeProto.GRAPH:
                        stack.append(attr.g)
                    elif attr.type == self.onnx.AttributeProto.GRAPHS:
                        stack.extend(attr.graphs)

    def annotation(self, type_proto: Any, where: str) -> Optional[TypeAnn]:
        """The anfir annotation of an ONNX input type: ``f32[B, 3]``; sequences and
        optionals are left unannotated; an element type anfir lacks is an error."""
        if type_proto.HasField("tensor_type"):
            tt = type_proto.tensor_type
            if tt.elem_type not in DTYPE_OF_ELEM:
                raise NodeError(f"{where} has element type "
                                f"{self.onnx.TensorProto.DataType.Name(tt.elem_type)}, "
                                "which anfir has no dtype for")
            dtype = DTYPE_OF_ELEM[tt.elem_type]
            if not tt.HasField("shape"):
                return None
            dims: list[Union[int, str]] = []
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    dims.append(int(d.dim_value))
                elif d.dim_param and d.dim_param.isidentifier() and not d.dim_param.startswith("_"):
                    dims.append(d.dim_param)
                else:
                    dims.append(f"_d{next(self._fresh)}")
            return TensorAnn(dtype, tuple(dims))
        if type_proto.HasField("sequence_type") or type_proto.HasField("optional_type"):
            return None
        raise NodeError(f"{where} has a type anfir does not read ({type_proto.WhichOneof('value')})")

    # -- building --------------------------------------------------------------------------
    def call(self, graph: FuncGraph, prim: Any, args: Sequence[Any], attrs: dict[str, Any],
             name: Optional[str]) -> Node:
        """``prim(*args, **attrs)`` in ``graph``, folded on constants when possible."""
        nodes = [a if isinstance(a, Node) else ValueNode(a) for a in args]
        if all(isinstance(n, ValueNode) for n in nodes):
            values = [n.value for n in nodes if isinstance(n, ValueNode)]
            if _fold_ok(prim, values):
                folded: Any = None
                try:
                    folded = prim.impl(*values, **attrs)
                except (AnfirError, ValueError, TypeError, IndexError, ArithmeticError):
                    folded = None
                if folded is not None and (not isinstance(folded, np.ndarray)
                                           or folded.size <= FOLD_LIMIT):
                    return ValueNode(folded)
        attr_obj = prim.canonical_attrs(attrs) if attrs and isinstance(prim, Primitive) else NO_ATTRS
        return CNode(graph, [ValueNode(prim), *nodes], None, name, attr_obj)

    def entry_inputs_of(self, root: Node) -> list[str]:
        """The entry graph's parameters ``root`` is computed from, when it is computed
        from those and constants only (through primitives); else ``[]``."""
        found: list[str] = []
        seen: set[int] = set()
        stack = [root]
        while stack:
            node = stack.pop()
            if id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, ParameterNode):
                if node.graph is not self.entry or not node.name:
                    return []
                found.append(node.name)
            elif isinstance(node, CNode):
                callee = node.inputs[0]
                if not (isinstance(callee, ValueNode) and isinstance(callee.value, Primitive)):
                    return []
                stack.extend(node.inputs[1:])
            elif isinstance(node, ValueNode) and isinstance(node.value, FuncGraph):
                return []
        return sorted(set(found))

    def refined_type(self, info: TypeInfo, node: Node) -> TypeInfo:
        """``info`` completed by anfir's abstract value of ``node``."""
        return _refined(info, self.node_abstract(node)) or info

    def node_abstract(self, root: Node) -> Optional[AbstractValue]:
        """anfir's abstract value of a node built by the importer, from its primitive's
        inference rule over its inputs' (None when some input's is unknown, or the
        callee is a graph): iteratively, each node once."""
        memo = self._abstracts
        stack = [root]
        while stack:
            node = stack[-1]
            if id(node) in memo:
                stack.pop()
                continue
            if isinstance(node, CNode):
                args = list(node.inputs[1:])
                missing = [a for a in args if id(a) not in memo]
                if missing:
                    stack.extend(missing)
                    continue
                found = _apply_rule(node, [memo[id(a)][1] for a in args])
                if found is None and node.name:
                    # A graph's call (an If, a loop): what the import learnt of its value.
                    found = _typeinfo_abstract(self.types.get(node.name))
                memo[id(node)] = (node, found)
            else:
                memo[id(node)] = (node, _leaf_abstract(node))
            stack.pop()
        return memo[id(root)][1]

    # -- the rule of an op -----------------------------------------------------------------
    def rule_for(self, node: Any, opset: int) -> Optional[Callable[[Ctx], Sequence[Optional[Node]]]]:
        """The import rule of ``node`` at ``opset`` (None when there is none)."""
        versions = OPS.get((node.domain if node.domain != "ai.onnx" else "", node.op_type))
        if not versions:
            return None
        best = None
        for since, rule in versions:
            if since <= opset:
                best = rule
        return best

    def opset_of(self, domain: str, opsets: dict[str, int]) -> Optional[int]:
        """The version of ``domain`` the graph imports."""
        key = "" if domain == "ai.onnx" else domain
        return opsets.get(key)

    # -- graphs ----------------------------------------------------------------------------
    def convert_nodes(self, nodes: Sequence[Any], scope: Scope, opsets: dict[str, int]) -> None:
        """Build every node of a graph (in order: ONNX graphs are topologically sorted)."""
        poisoned: set[str] = set()
        for node in nodes:
            if any(name in poisoned for name in node.input if name):
                poisoned.update(node.output)
                continue
            try:
                outputs = self.convert_node(node, scope, opsets)
            except NeedsValue as e:
                self.error(node, str(e))
                for needed in e.input_names:
                    if needed not in self.needs_values:
                        self.needs_values.append(needed)
                poisoned.update(node.output)
                continue
            except NodeError as e:
                self.error(node, str(e))
                poisoned.update(node.output)
                continue
            except AnfirError as e:
                self.error(node, e.message)
                poisoned.update(node.output)
                continue
            if node.name or node.doc_string:
                self.record_node(node, outputs, scope)
            for i, name in enumerate(node.output):
                if not name:
                    continue
                value = outputs[i] if i < len(outputs) else None
                if value is None:
                    self.error(node, f"output {i} ({name!r}) is not produced by anfir's rule")
                    poisoned.add(name)
                    continue
                info = self.types.get(name)
                if isinstance(value, CNode) and (info is None or info.static_shape is None or info.dtype is None):
                    # ONNX's inference lost the type (a shape computed from data):
                    # anfir's rules, which see the folded constants, may know it.
                    info = _refined(info, self.node_abstract(value))
                    if info is not None:
                        self.types[name] = info
                if info is not None and info.dtype == "bf16" and isinstance(value, CNode):
                    # Some primitives compute bf16 in f32 (numpy has no bf16 kernels):
                    # ONNX says the value is bf16, so it is cast back (a no-op when it is).
                    value = self.call(scope.graph, BF16_CAST, [value, "bf16"], {}, None)
                scope.values[name] = value
                if isinstance(value, CNode) and value.name is None:
                    value.name = name

    @staticmethod
    def record_node(node: Any, outputs: Sequence[Optional[Node]], scope: Scope) -> None:
        """Keep an ONNX node's name, op type and doc string as the metadata of the first
        CNode it made for its outputs (``graph.node_meta``: printed above its ``let``).
        A node whose outputs are constants or other nodes' values (folded, an alias)
        leaves no node of its own to carry them."""
        inputs = {id(scope.lookup(name)) for name in node.input if name}
        for value in outputs:
            if (isinstance(value, CNode) and value.graph is not None and id(value) not in inputs
                    and value not in value.graph.node_meta):
                meta: dict[str, Any] = {}
                if node.name:
                    meta["onnx_node"] = node.name
                meta["op_type"] = node.op_type
                if node.domain not in ("", "ai.onnx"):
                    meta["domain"] = node.domain
                if node.doc_string:
                    meta["doc"] = node.doc_string
                value.graph.node_meta[value] = meta
                return

    def convert_node(self, node: Any, scope: Scope, opsets: dict[str, int]) -> Sequence[Optional[Node]]:
        """The output nodes of one ONNX node."""
        domain = "" if node.domain == "ai.onnx" else node.domain
        local = self.functions.get((node.domain, node.op_type))
        if local is not None:
            return self.call_local_function(local, node, scope, opsets)
        opset = self.opset_of(domain, opsets)
        if opset is None:
            raise NodeError(f"the model imports no opset of domain {domain or 'ai.onnx'!r}")
        rule = self.rule_for(node, opset)
        if rule is not None:
            try:
                return rule(Ctx(self, scope, node, opset))
            except UseFunctionBody:
                body = self.schema_function(node, opset, scope)
                if body is None:
                    raise
                return self.expand_inline(body, node, scope, opsets)
        body = self.schema_function(node, opset, scope)
        if body is not None:
            return self.expand_inline(body, node, scope, opsets)
        if domain not in ("",):
            raise NodeError(f"anfir has no rule for domain {domain!r}")
        raise NodeError(f"anfir has no rule for {node.op_type} (opset {opset}) and its "
                        "ONNX schema defines no function body")

    # -- functions -------------------------------------------------------------------------
    def schema_function(self, node: Any, opset: int, scope: Scope) -> Optional[Any]:
        """The FunctionProto the ONNX schema of ``node`` defines for ``opset``, if any."""
        defs = self.onnx.defs
        try:
            schema = defs.get_schema(node.op_type, opset, node.domain or "")
        except Exception:  # onnx raises SchemaError (not exported under one name)
            return None
        raw = b""
        # A body is defined from some opset on: the newest one not after the model's.
        plain = [v for v in schema.function_opset_versions if v <= opset]
        context = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
        if plain:
            raw = schema.get_function_with_opset_version(max(plain))
        elif schema.has_function and schema.function_body.node:
            return schema.function_body
        if not raw and context:
            types = []
            for i, name in enumerate(node.input):
                tp = self.onnx.TypeProto()
                info = self.types.get(name) if name else None
                node_value = scope.lookup(name) if name else None
                dtype = info.dtype if info else None
                if dtype is None and isinstance(node_value, ValueNode) and isinstance(node_value.value, np.ndarray):
                    dtype = dtype_name(node_value.value.dtype)
                if name in self.sequence_types:
                    types.append(self.sequence_types[name].SerializeToString())
                    continue
                if dtype is not None:
                    tp.tensor_type.elem_type = ONNX_TYPES[dtype]
                elif name:
                    # onnx's C++ builders crash on an input of unknown type: no body then.
                    return None
                dims = info.dims if info is not None else None
                if isinstance(node_value, ValueNode) and isinstance(node_value.value, np.ndarray):
                    dims = tuple(node_value.value.shape)
                if name and dims is not None:
                    # Some bodies depend on the rank (RotaryEmbedding's, CausalConvWithState's).
                    tp.tensor_type.shape.SetInParent()
                    for d in dims:
                        dim = tp.tensor_type.shape.dim.add()
                        if isinstance(d, int):
                            dim.dim_value = d
                types.append(tp.SerializeToString())
            try:
                raw = schema.get_context_dependent_function_with_opset_version(
                    max(context), node.SerializeToString(), types)
            except Exception:  # onnx raises its own errors for a body it cannot build
                raw = b""
        if not raw:
            return None
        proto = self.onnx.FunctionProto()
        proto.ParseFromString(raw)
        return proto if proto.node else None

    def bind_attrs(self, body_node: Any, caller: Any, fn: Any) -> Any:
        """A copy of ``body_node`` whose attribute references read the caller's attributes."""
        if not any(a.ref_attr_name for a in body_node.attribute):
            return body_node
        given = {a.name: a for a in caller.attribute}
        defaults = {a.name: a for a in getattr(fn, "attribute_proto", [])}
        try:
            # A schema's function body leaves the defaults to the schema's attributes.
            specs = dict(self.onnx.defs.get_schema(caller.op_type, caller.domain or "").attributes)
        except Exception:  # onnx raises SchemaError (not exported under one name)
            specs = {}
        for name, spec in specs.items():
            if name not in defaults and spec.default_value.name:
                defaults[name] = spec.default_value
        copy = self.onnx.NodeProto()
        copy.CopyFrom(body_node)
        del copy.attribute[:]
        for a in body_node.attribute:
            if a.ref_attr_name:
                source = given.get(a.ref_attr_name) or defaults.get(a.ref_attr_name)
                if source is None:
                    continue
                new = copy.attribute.add()
                new.CopyFrom(source)
                new.name = a.name
            else:
                copy.attribute.add().CopyFrom(a)
        return copy

    def expand_inline(self, fn: Any, caller: Any, scope: Scope, opsets: dict[str, int]) -> list[Optional[Node]]:
        """The outputs of ``caller`` computed by the function body ``fn``, inlined."""
        inner = Scope(scope.graph, None)
        for i, formal in enumerate(fn.input):
            if i < len(caller.input) and caller.input[i]:
                found = scope.lookup(caller.input[i])
                if found is None:
                    raise NodeError(f"input {caller.input[i]!r} is not defined")
                inner.values[formal] = found
                if caller.input[i] in self.types:
                    self.types[formal] = self.types[caller.input[i]]
        fn_opsets = dict(opsets)
        fn_opsets.update({_domain(o.domain): int(o.version) for o in fn.opset_import})
        nodes = [self.bind_attrs(n, caller, fn) for n in fn.node]
        nodes, renamed = self.rename(nodes, fn, f"{caller.name or caller.op_type}/")
        self.infer_body_types(nodes, inner, fn_opsets)
        before = len(self.errors)
        self.convert_nodes(nodes, inner, fn_opsets)
        if len(self.errors) > before:
            inner_errors = self.errors[before:]
            del self.errors[before:]
            raise NodeError("its function body does not import: " + "; ".join(inner_errors))
        out: list[Optional[Node]] = []
        for formal in fn.output:
            out.append(inner.values.get(renamed.get(formal, formal)))
        return out

    def rename(self, nodes: Sequence[Any], fn: Any, prefix: str) -> tuple[list[Any], dict[str, str]]:
        """Body nodes whose intermediate names are unique in the model (a prefix), and
        the new name of each value the body computes."""
        formals = set(fn.input)
        mapping: dict[str, str] = {}
        renamed = []
        tag = next(self._fresh)
        for n in nodes:
            copy = self.onnx.NodeProto()
            copy.CopyFrom(n)
            for i, name in enumerate(copy.input):
                if name and name not in formals:
                    copy.input[i] = mapping.get(name, name)
            self.rename_captures(copy, mapping)
            for i, name in enumerate(copy.output):
                if name:
                    mapping[name] = f"{prefix}{name}#{tag}"
                    copy.output[i] = mapping[name]
            renamed.append(copy)
        return renamed, mapping

    def rename_captures(self, node: Any, mapping: dict[str, str]) -> None:
        """Rename, inside ``node``'s subgraphs (any depth), the outer values they read
        by name that the body renamed (a Scan body in a function body reads the
        function's values)."""
        A = self.onnx.AttributeProto
        stack = [a.g for a in node.attribute if a.type == A.GRAPH]
        stack += [g for a in node.attribute if a.type == A.GRAPHS for g in a.graphs]
        while stack:
            g = stack.pop()
            own = {v.name for v in g.input} | {t.name for t in g.initializer}
            own |= {o for n in g.node for o in n.output}
            for n in g.node:
                for i, name in enumerate(n.input):
                    if name and name not in own and name in mapping:
                        n.input[i] = mapping[name]
                stack.extend(a.g for a in n.attribute if a.type == A.GRAPH)
                stack.extend(sub for a in n.attribute if a.type == A.GRAPHS for sub in a.graphs)
            for o in g.output:
                if o.name not in own and o.name in mapping:
                    o.name = mapping[o.name]

    def infer_body_types(self, nodes: Sequence[Any], scope: Scope, opsets: dict[str, int]) -> None:
        """Types of a function body's values, by ONNX shape inference on a small model."""
        helper = self.onnx.helper
        inputs = []
        seen: set[str] = set()
        produced = {o for n in nodes for o in n.output}
        for n in nodes:
            for name in n.input:
                if not name or name in produced or name in seen:
                    continue
                seen.add(name)
                info = self.types.get(name)
                value = scope.lookup(name)
                if isinstance(value, ValueNode) and isinstance(value.value, np.ndarray):
                    info = TypeInfo(dtype_name(value.value.dtype), tuple(value.value.shape))
                if info is None or info.dtype is None:
                    return
                shape = None if info.dims is None else [d if isinstance(d, (int, str)) else None
                                                        for d in info.dims]
                inputs.append(helper.make_tensor_value_info(name, ONNX_TYPES[info.dtype], shape))
        graph = helper.make_graph(list(nodes), "body", inputs, [])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
        try:
            inferred = self.onnx.shape_inference.infer_shapes(model)
        except Exception:  # inference is a help, not a requirement
            return
        for vi in inferred.graph.value_info:
            info = self.type_info(vi.type)
            if info.dtype is not None:
                self.types[vi.name] = info

    def call_local_function(self, fn: Any, caller: Any, scope: Scope,
                            opsets: dict[str, int]) -> list[Optional[Node]]:
        """A call of the model-local function ``fn``: a FuncGraph of the module (one per
        set of attribute values), called with the caller's inputs."""
        attr_key = tuple(sorted((a.name, a.SerializeToString()) for a in caller.attribute))
        in_types = tuple(str(self.types.get(n)) for n in caller.input)
        key = (fn.domain, fn.name, attr_key, in_types)
        graph = self.function_graphs.get(key)
        if graph is None:
            graph = FuncGraph(self.graph_name(fn.name))
            inner = Scope(graph, None)
            for i, formal in enumerate(fn.input):
                inner.values[formal] = graph.add_parameter(formal)
                if i < len(caller.input) and caller.input[i] in self.types:
                    self.types[formal] = self.types[caller.input[i]]
            fn_opsets = dict(opsets)
            fn_opsets.update({_domain(o.domain): int(o.version) for o in fn.opset_import})
            nodes = [self.bind_attrs(n, caller, fn) for n in fn.node]
            self.infer_body_types(nodes, inner, fn_opsets)
            before = len(self.errors)
            self.convert_nodes(nodes, inner, fn_opsets)
            if len(self.errors) > before:
                inner_errors = self.errors[before:]
                del self.errors[before:]
                raise NodeError(f"local function {fn.name!r} does not import: " + "; ".join(inner_errors))
            outs: list[Node] = []
            for o in fn.output:
                found = inner.values.get(o)
                if found is None:
                    raise NodeError(f"local function {fn.name!r} does not compute its output {o!r}")
                outs.append(found)
            graph.output = outs[0] if len(outs) == 1 else graph.apply(structure.make_tuple, *outs)
            if fn.doc_string:
                graph.flags["doc"] = fn.doc_string
            self.function_graphs[key] = graph
            self.module.graphs[graph.name] = graph
        args: list[Any] = []
        for i in range(len(fn.input)):
            name = caller.input[i] if i < len(caller.input) else ""
            args.append(scope.lookup(name) if name else None)
        result = scope.graph.apply(graph, *args, name=caller.name or None)
        if len(fn.output) == 1:
            return [result]
        return [scope.graph.apply(structure.tuple_getitem, result, i) for i in range(len(fn.output))]

    # -- subgraphs (If, Loop, Scan bodies) --------------------------------------------------
    def convert_subgraph(self, body: Any, graph: FuncGraph, scope: Scope, opsets: dict[str, int],
                         bound: dict[str, Node]) -> list[Node]:
        """Build the ONNX subgraph ``body`` into ``graph`` (whose enclosing scope is
        ``scope``; ``bound`` names the body's inputs); its outputs' nodes."""
        inner = Scope(graph, scope)
        inner.values.update(bound)
        for init in body.initializer:
            inner.values[init.name] = ValueNode(self.tensor(init))
        before = len(self.errors)
        self.convert_nodes(body.node, inner, opsets)
        if len(self.errors) > before:
            inner_errors = self.errors[before:]
            del self.errors[before:]
            raise NodeError(f"its subgraph {body.name!r} does not import: " + "; ".join(inner_errors))
        outs = []
        for o in body.output:
            found = inner.lookup(o.name)
            if found is None:
                raise NodeError(f"subgraph output {o.name!r} is not computed")
            outs.append(found)
        return outs


def _leaf_abstract(node: Node) -> Optional[AbstractValue]:
    """The abstract value of a constant or an annotated parameter (None otherwise)."""
    if isinstance(node, ValueNode):
        if isinstance(node.value, (FuncGraph, Primitive)):
            return None
        try:
            return abstract_of_value(node.value)
        except AnfirError:
            return None
    ann = getattr(node, "annotation", None)
    if ann is not None:
        try:
            return abstract_from_annotation(ann)
        except AnfirError:
            return None
    return None


def _apply_rule(node: CNode, args: list[Optional[AbstractValue]]) -> Optional[AbstractValue]:
    """A primitive call's abstract value by the primitive's rule (None when unknown)."""
    callee = node.inputs[0]
    prim = callee.value if isinstance(callee, ValueNode) else None
    if not isinstance(prim, Primitive) or prim.infer is None or prim is structure.switch:
        return None
    if any(a is None for a in args) or not prim.accepts(len(args)):
        return None
    known = [a for a in args if a is not None]
    try:
        if prim.attrs:
            inputs = prim.input_count(len(known))
            positional = [static_of_abstract(a, name) for name, a in zip(prim.positional_attrs, known[inputs:])]
            result = prim.infer(*known[:inputs], **prim.bound_attrs(node.attrs, positional))
        else:
            result = prim.infer(*known)
    except Exception:  # a rule that rejects its inputs: the type stays unknown
        return None
    return result if isinstance(result, AbstractValue) else None


def _typeinfo_abstract(info: Optional[TypeInfo]) -> Optional[AbstractValue]:
    """A TypeInfo of known dtype and rank as an abstract tensor (unknown dims fresh)."""
    if info is None or info.dtype is None or info.dims is None:
        return None
    return ATensor(info.dtype, tuple(d if isinstance(d, int) else fresh_dim() for d in info.dims))


def _refined(info: Optional[TypeInfo], abstract: Optional[AbstractValue]) -> Optional[TypeInfo]:
    """``info`` completed by an abstract value: its dtype, and its static dims."""
    if isinstance(abstract, AScalar):
        abstract = ATensor(abstract.dtype, ())
    if not isinstance(abstract, ATensor):
        return info
    dtype = info.dtype if info is not None and info.dtype is not None else abstract.dtype
    dims = info.dims if info is not None else None
    if abstract.shape is not None:
        found = tuple(d if isinstance(d, int) else None for d in abstract.shape)
        if dims is None or len(dims) != len(found):
            dims = found
        else:
            dims = tuple(f if isinstance(f, int) else d for d, f in zip(dims, found))
    return TypeInfo(dtype, dims)


def _domain(name: str) -> str:
    """The key of a domain: ``""`` for the default one (also spelled ``ai.onnx``)."""
    return "" if name in ("", "ai.onnx") else name


def _metadata(model: Any) -> dict[str, Any]:
    """The model's provenance as Module.metadata."""
    meta: dict[str, Any] = {"format": "onnx", "ir_version": int(model.ir_version)}
    if model.producer_name:
        meta["producer_name"] = model.producer_name
    if model.producer_version:
        meta["producer_version"] = model.producer_version
    if model.domain:
        meta["domain"] = model.domain
    if model.model_version:
        meta["model_version"] = int(model.model_version)
    if model.doc_string:
        meta["doc_string"] = model.doc_string
    meta["opset_import"] = {(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import}
    if model.metadata_props:
        meta["metadata_props"] = {p.key: p.value for p in model.metadata_props}
    if model.functions:
        meta["functions"] = [f"{f.domain}.{f.name}" if f.domain else f.name for f in model.functions]
    return meta


def with_input_shapes(model: Any, shapes: dict[str, tuple[int, ...]]) -> Any:
    """A copy of ``model`` whose graph inputs named in ``shapes`` have those static
    shapes (symbolic or unknown dimensions made concrete), for a model that imports
    only once its shapes are known (branches chosen by shape, ranks that depend on
    them): a specializing import, as ``AnfirRep`` does with ``static_shapes=True``."""
    onnx = require_onnx()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for inp in copy.graph.input:
        shape = shapes.get(inp.name)
        if shape is None or not inp.type.HasField("tensor_type"):
            continue
        dims = inp.type.tensor_type.shape.dim
        del dims[:]
        for n in shape:
            dims.add().dim_value = int(n)
    return copy


def read_model(model_or_path: Any) -> tuple[Any, str]:
    """An ``onnx.ModelProto`` from a model or a path (read within the size limit)."""
    onnx = require_onnx()
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path, f"<onnx {model_or_path.graph.name or 'model'}>"
    if isinstance(model_or_path, (str, os.PathLike)):
        path = os.fspath(model_or_path)
        try:
            data = limits.read_bounded(path)
        except OSError as e:
            raise OnnxImportError(f"cannot read {path}: {e.strerror or e}") from None
        except limits.ReadError as e:
            raise OnnxImportError(f"cannot read {path}: {e}") from None
        model = onnx.ModelProto()
        try:
            model.ParseFromString(data)
        except Exception as e:  # protobuf's DecodeError
            raise OnnxImportError(f"{path} is not an ONNX model: {e}") from None
        return model, path
    raise OnnxImportError(f"import_onnx takes an onnx.ModelProto or a path, not "
                          f"{type(model_or_path).__name__}")


def import_onnx(model_or_path: Any, params_as_inputs: bool = False,
                bind: Optional[dict[str, Any]] = None) -> Module:
    """Read an ONNX model (a ``ModelProto`` or a ``.onnx`` path) into a Module whose
    entry is the ONNX graph's name.  See the module documentation.

    ``bind`` gives graph inputs values: they become constants, not parameters
    (a model that feeds axes or shapes as inputs imports for given values;
    :class:`OnnxImportError.needs_values` lists the inputs that need one)."""
    onnx = require_onnx()
    model, filename = read_model(model_or_path)
    importer = Importer(onnx, model, params_as_inputs, filename)
    if isinstance(model_or_path, (str, os.PathLike)):
        importer.base_dir = os.path.dirname(os.path.abspath(os.fspath(model_or_path)))
    opsets = importer.opsets
    default = opsets.get("")
    if default is not None and default < MIN_OPSET:
        raise OnnxImportError(f"the model imports ai.onnx opset {default}; anfir reads opset "
                              f"{MIN_OPSET} and later")
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # inference is a help: a model it rejects may still import
        inferred = model
    importer.collect_types(inferred.graph)
    g = model.graph
    name = g.name if g.name and g.name.isidentifier() else "main"
    entry = FuncGraph(importer.graph_name(name))
    scope = Scope(entry)
    initializers = {init.name: init for init in g.initializer}
    if params_as_inputs:
        for init in g.initializer:
            try:
                value = importer.tensor(init)
            except NodeError as e:
                importer.errors.append(f"initializer {init.name!r}: {e}")
                continue
            param = entry.add_parameter(init.name)
            param.annotation = TensorAnn(DTYPE_OF_ELEM[init.data_type], tuple(int(d) for d in value.shape))
            scope.values[init.name] = param
            importer.module.params[init.name] = value
    else:
        for init in g.initializer:
            try:
                scope.values[init.name] = ValueNode(importer.tensor(init))
            except NodeError as e:
                importer.errors.append(f"initializer {init.name!r}: {e}")
    importer.entry = entry
    for inp in g.input:
        if inp.name in initializers:
            continue
        if bind and inp.name in bind:
            given = bind[inp.name]
            # A sequence (a list) is a tuple of tensors; anything else a tensor.
            scope.values[inp.name] = ValueNode(tuple(np.asarray(v) for v in given) if isinstance(given, (list, tuple))
                                               else np.asarray(given))
            continue
        try:
            ann = importer.annotation(inp.type, f"input {inp.name!r}")
        except NodeError as e:
            importer.errors.append(str(e))
            ann = None
        param = entry.add_parameter(inp.name)
        if ann is not None:
            param.annotation = ann
        scope.values[inp.name] = param
    importer.convert_nodes(g.node, scope, opsets)
    outs: list[Node] = []
    for o in g.output:
        found = scope.lookup(o.name)
        if found is None:
            if not importer.errors:
                importer.errors.append(f"graph output {o.name!r} is not computed by any node")
            continue
        outs.append(found)
    if importer.errors:
        listed = "\n  ".join(importer.errors)
        error = OnnxImportError(f"{filename}: {len(importer.errors)} node(s) do not import:\n  {listed}")
        error.needs_values = tuple(importer.needs_values)
        raise error
    entry.output = outs[0] if len(outs) == 1 else entry.apply(structure.make_tuple, *outs)
    if g.doc_string:
        entry.flags["doc"] = g.doc_string
    module = importer.module
    module.graphs = {entry.name: entry, **module.graphs}
    module.default_entry = entry.name
    module.metadata.update(_metadata(model))
    module.metadata["outputs"] = [o.name for o in g.output]
    return module

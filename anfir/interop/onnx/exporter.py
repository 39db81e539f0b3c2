"""Export an anfir program to an ONNX model (opset 21).

::

    model = anfir.export_onnx(mod, entry="mlp_loss")        # an onnx.ModelProto
    onnx.save(model, "mlp.onnx")

The program is compiled (``anfir.compile``: specialized, differentiated,
inlined, optimized), walked into a first-order flat program
(:mod:`anfir.flat.flatten`: tuples taken apart, closures converted, calls
inlined, ``if`` → ``If``, tail recursion → ``Loop``), and each flat op is
written by the rule :data:`RULES` holds for its primitive object.  The rules live in
:mod:`anfir.interop.onnx.export_rules`, one module per family of ``anfir/primitives/``;
adding an operator is one entry in its family's ``RULES``::

    tensor.matmul: binary("MatMul"),

(a rule is a function ``rule(writer, op)`` that writes ONNX nodes computing
``op.results`` from ``op.args`` through the :class:`OnnxWriter` helpers;
:func:`unary`, :func:`binary`, :func:`compare` and :func:`logical` make the
common ones).

Conventions of the exported model:

* inputs are the entry's parameters, by name (a tuple parameter ``t`` gives
  ``t_0``, ``t_1``...); outputs are ``output`` (or ``output_0``, ``output_1_0``...
  when the result is a tuple); anfir's Python scalars (f64, i64, bool) are
  0-d tensors of that dtype, strings 0-d string tensors;
* symbolic dimensions (``f64[B, 3]``) are ONNX ``dim_param`` s;
* ``metadata_props`` hold the entry, the source file, the signature, the
  module's metadata and how inputs and outputs nest (``anfir.inputs``,
  ``anfir.outputs``, JSON) — :func:`onnx_inputs` and :func:`nest_outputs`
  use them to run a model on anfir-style arguments;
* the model is deterministic: the same program gives byte-identical models.

The ``onnx`` package is imported when a model is written, never when anfir is
imported; without it, :class:`~anfir.errors.MissingDependencyError` names the
extra to install.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from anfir.abstract.shapes import is_unknown_dim
from anfir.abstract.values import AbstractValue, AScalar, ATensor, dim_text
from anfir.dtypes import numpy_dtype
from anfir.errors import ExportError, MissingDependencyError
from anfir.flat.statements import (
    Block, Const, FlatProgram, IfOp, LoopOp, NameAllocator, Op, Operand, Undefined, Value,
    OperandReader, dtype_of_type, shape_items,
    nest_by_structure, program_properties, shape_of_type,
    values_by_name,
)
from anfir.flat.flatten import UNKNOWN_DIM, flatten_program, sanitize
from anfir.interop.export_common import rule_for
from anfir.interop.onnx.onnx_types import ONNX_TYPES
from anfir.interop.onnx.export_rules import RULES as FAMILY_RULES, UNSUPPORTED as FAMILY_UNSUPPORTED
from anfir.interop.onnx.export_rules.common import OnnxRule, binary, compare, logical, unary, with_dtype
from anfir.ir.graph import FuncGraph
from anfir.ir.primitive import Primitive
from anfir.location import Location
from anfir.passes.decompose import Declines, decompose
from anfir.passes.pipeline import Source, compile_program
from anfir.primitives import conv, nn, structure, tensor

if TYPE_CHECKING:  # pragma: no cover
    import onnx

OPSET = 21
"""The ONNX opset the models import (the default domain)."""

EXTRA = "onnx"
"""The extra that installs what this module needs: ``pip install "anfir[onnx]"``."""

NATIVE: frozenset[Primitive] = frozenset({nn.softmax, nn.log_softmax, conv.global_avg_pool,
                                          conv.global_max_pool})
"""The composites of :data:`anfir.decompositions.DECOMPOSITIONS` ONNX writes as its own
operators (Softmax, LogSoftmax, GlobalAveragePool, GlobalMaxPool); the others reach :data:`RULES` decomposed.  Not kept:
LayerNormalization (its statistics are computed in stash_type's f32 for an f64 model),
Gelu and Softplus (the expansions compute what ``anfir.run`` computes in every dtype;
ONNX Softplus overflows where anfir's does not)."""

PLACEHOLDER_INITIALIZER_LIMIT = 64
"""Placeholders up to this many elements are initializers; bigger ones ``ConstantOfShape``."""


def require_onnx() -> Any:
    """The ``onnx`` module, or a :class:`MissingDependencyError` naming the extra."""
    try:
        import onnx
        import onnx.helper  # noqa: F401
        import onnx.numpy_helper  # noqa: F401
    except ImportError:
        raise MissingDependencyError(
            f'exporting to ONNX needs the onnx package: pip install "anfir[{EXTRA}]"') from None
    return onnx


def export_onnx(source: Source, entry: Optional[str] = None,
                args: Optional[Sequence[Any]] = None) -> "onnx.ModelProto":
    """Compile ``source`` (a Module, FuncGraph or path) for ``args`` (example values
    or types; the entry's annotations otherwise) and write the optimized entry
    as an ONNX model.  See the module documentation for the conventions."""
    require_onnx()
    result = compile_program(source, entry=entry, args=args)
    module = getattr(source, "metadata", None)
    metadata = {f"anfir.module.{k}": str(v) for k, v in sorted((module or {}).items())}
    program = result.program
    if program.module is not None:
        metadata["anfir.source"] = program.module.filename
    return model_from_graph(result.graph, metadata)


def model_from_graph(graph: FuncGraph, metadata: Optional[dict[str, str]] = None) -> "onnx.ModelProto":
    """The ONNX model of an optimized graph (what ``anfir.compile`` returns).  The composites
    ONNX does not keep (:data:`NATIVE`) are decomposed in ``graph`` first, in place
    (:func:`anfir.passes.decompose.decompose`: the graph computes the same values)."""
    onnx = require_onnx()
    declined: Declines = {}
    flat = flatten_program(decompose(graph, NATIVE, declined))
    flags = {f"anfir.flag.{key}": value for key, value in sorted(graph.flags.items())
             if isinstance(value, str)}
    program_properties(flat, graph.name, None if graph.abstract is None else str(graph.abstract),
                       {**flags, **(metadata or {})})
    writer = OnnxWriter(onnx, flat)
    writer.declined = declined
    return writer.model(graph.loc)


# -- running a model on anfir-style values ---------------------------------------------------
def onnx_inputs(model: "onnx.ModelProto", *args: Any) -> dict[str, np.ndarray]:
    """The feed of ``model`` for anfir-style arguments (scalars, arrays, tuples, strings)."""
    props = {p.key: p.value for p in model.metadata_props}
    structure = json.loads(props.get("anfir.inputs", "[]"))
    types = {i.name: i.type.tensor_type.elem_type for i in model.graph.input}
    if len(structure) != len(args):
        raise ExportError(f"the model takes {len(structure)} arguments, not {len(args)}")
    feed: dict[str, np.ndarray] = {}
    for name, value in values_by_name(structure, args).items():
        elem = types[name]
        if elem == ONNX_TYPES["str"]:
            feed[name] = np.array(value, dtype=object)
        else:
            feed[name] = np.asarray(value, dtype=_NUMPY_OF_ELEM[elem])
    return feed


def nest_outputs(model: "onnx.ModelProto", outputs: Sequence[Any]) -> Any:
    """The outputs of ``model`` (a list, in graph order) nested as anfir returns them:
    tuples, Python scalars for scalar results, numpy arrays for tensors."""
    props = {p.key: p.value for p in model.metadata_props}
    structure = json.loads(props["anfir.outputs"])
    scalars = set(json.loads(props.get("anfir.scalar_outputs", "[]")))
    by_name = {o.name: v for o, v in zip(model.graph.output, outputs)}

    def leaf(name: Optional[str]) -> Any:
        if name is None:
            return None
        value = by_name[name]
        if name in scalars:
            item = np.asarray(value).item()
            return item.decode() if isinstance(item, bytes) else item
        return np.asarray(value)

    return nest_by_structure(structure, leaf)


# -- types -------------------------------------------------------------------------------------
_NEWER_TYPES: dict[str, int] = {"f4e2m1": 23, "f8e8m0": 24, "u2": 25, "i2": 25}
"""Element types ONNX added after the opset the exporter writes: dtype → the opset that has it."""

def _exportable(dtype: str, loc: Optional[Location] = None) -> str:
    """``dtype``, or an :class:`ExportError` when the exported opset has no such element type."""
    newer = _NEWER_TYPES.get(dtype)
    if newer is not None:
        raise ExportError(f"ONNX opset {OPSET} has no {_PROTO_NAMES[dtype]} tensors (the {dtype} "
                          f"element type needs opset {newer}); cast to a wider type first", loc)
    return dtype


_NUMPY_OF_ELEM: dict[int, Any] = {v: (object if k == "str" else numpy_dtype(k))
                                  for k, v in ONNX_TYPES.items()}


def _dims(t: AbstractValue) -> Optional[list[Any]]:
    """ONNX dims of a flat type: ints, dim_param strings, None for unknown; None: unknown rank."""
    shape = shape_of_type(t)
    if shape is None:
        return None
    out: list[Any] = []
    for d in shape:
        if isinstance(d, int):
            out.append(d)
        elif is_unknown_dim(d):
            out.append(None)
        else:
            text = dim_text(d)
            out.append(int(text) if text.isdigit() else text)
    return out


# -- rules ---------------------------------------------------------------------------------------
RULES: dict[Primitive, OnnxRule] = FAMILY_RULES
"""Primitive object → the rule writing its ONNX nodes: the rules of every family of
:mod:`anfir.interop.onnx.export_rules` (one module per family of ``anfir/primitives/``).
A primitive the walker takes apart itself (``make_tuple``, ``env_getitem``...) needs none
(:data:`anfir.flat.flatten.WALKER_ONLY`)."""

UNSUPPORTED: dict[Primitive, str] = FAMILY_UNSUPPORTED
"""Primitives that cannot be exported, with the reason (the walker's error names it)."""


# -- the writer --------------------------------------------------------------------------
@dataclass(eq=False)
class _Graph:
    """One ONNX graph being written (the main graph, a branch, a loop body)."""

    name: str
    nodes: list[Any] = field(default_factory=list)
    inputs: list[Any] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)


@dataclass(eq=False)
class _Task:
    """A block being written into a graph; ``on_done`` runs when its statements are written."""

    block: Block
    graph: _Graph
    on_done: Callable[[], None]
    pos: int = 0


class OnnxWriter(OperandReader):
    """Writes a :class:`FlatProgram` as an ONNX model; the helpers rules use are here."""

    def __init__(self, onnx: Any, program: FlatProgram) -> None:
        """A writer for ``program`` (``onnx`` is the imported module)."""
        self.onnx = onnx
        self.helper = onnx.helper
        self.program = program
        self.names: NameAllocator = program.names
        self.node_names = NameAllocator()
        self.initializers: list[Any] = []
        self._consts: dict[tuple[Any, ...], str] = {}
        self.graph = _Graph(program.name)
        self.loc: Optional[Location] = None
        """The location of the op being written (nodes get it as their doc string)."""
        self.declined: Declines = {}
        """Why the decomposition pass left composite calls (for the error that names one)."""
        for name, code in ONNX_TYPES.items():
            assert getattr(onnx.TensorProto, _PROTO_NAMES[name]) == code, name

    # -- the model -------------------------------------------------------------------
    def model(self, loc: Optional[Location]) -> Any:
        """Write the whole program; return the ModelProto."""
        program = self.program
        main = self.graph
        main.inputs = [self.value_info(v.name, v.type) for v in program.inputs]

        def finish_main() -> None:
            """The main block's results as the model's outputs."""
            self.graph = main
            for operand, name, t in zip(program.body.results, program.output_names,
                                        program.output_types):
                self.loc = loc
                self.node("Identity", [self.tensor(operand, dtype_of_type(t))], [name])
                main.outputs.append(self.value_info(name, t))

        self._write([_Task(program.body, main, finish_main)])
        helper = self.helper
        doc = f"anfir export of @{program.name}" + (f" ({loc.short()})" if loc else "")
        graph = helper.make_graph(main.nodes, _graph_name(program.name), main.inputs, main.outputs,
                                  initializer=self.initializers, doc_string=doc)
        opsets = [helper.make_opsetid("", OPSET)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="anfir",
                                  producer_version=_version(), doc_string=doc,
                                  ir_version=helper.find_min_ir_version_for(opsets))
        helper.set_model_props(model, program.metadata)
        return model

    def _write(self, tasks: list[_Task]) -> None:
        """Write blocks with an explicit stack (If inside If inside Loop... at any depth)."""
        stack = tasks
        while stack:
            task = stack[-1]
            if task.pos >= len(task.block.ops):
                stack.pop()
                task.on_done()
                continue
            statement = task.block.ops[task.pos]
            task.pos += 1
            self.graph = task.graph
            self.loc = statement.loc
            if isinstance(statement, Op):
                rule_for(RULES, UNSUPPORTED, statement, "ONNX", "ONNX", self.declined)(self, statement)
            elif isinstance(statement, IfOp):
                self._if(statement, task.graph, stack)
            else:
                self._loop(statement, task.graph, stack)

    def _if(self, op: IfOp, parent: _Graph, stack: list[_Task]) -> None:
        """Write an IfOp: its branches as graphs (pushed as tasks), then the If node."""
        base = op.results[0].name if op.results else "if"
        then_graph, else_graph = _Graph(f"{base}_then"), _Graph(f"{base}_else")

        def done() -> None:
            self.graph = parent
            self.loc = op.loc
            self.node("If", [self.tensor(op.cond, "bool")], [v.name for v in op.results],
                      then_branch=self._graph_proto(then_graph),
                      else_branch=self._graph_proto(else_graph))

        def finish(block: Block, graph: _Graph) -> Callable[[], None]:
            def run() -> None:
                self._yield(block, graph, op.results, op.loc)
            return run

        def else_done() -> None:
            finish(op.else_block, else_graph)()
            done()

        stack.append(_Task(op.else_block, else_graph, else_done))
        stack.append(_Task(op.then_block, then_graph, finish(op.then_block, then_graph)))

    def _loop(self, op: LoopOp, parent: _Graph, stack: list[_Task]) -> None:
        """Write a LoopOp: its body as a graph (a task), then the Loop node."""
        base = op.results[0].name if op.results else "loop"
        body = _Graph(f"{base}_body")
        iteration, cond_in = self.names.take("iteration"), self.names.take("cond_in")
        body.inputs = [self.value_info(iteration, AScalar("i64")),
                       self.value_info(cond_in, AScalar("bool"))]
        body.inputs += [self.value_info(v.name, _loose(v.type)) for v in op.body.params]

        def done() -> None:
            self.graph = body
            self._yield(op.body, body, (Value("flag", AScalar("bool")), *op.body.params), op.loc,
                        loose=True)
            self.graph = parent
            self.loc = op.loc
            init = [self.tensor(operand, dtype_of_type(v.type))
                    for operand, v in zip(op.init, op.body.params)]
            self.node("Loop", ["", self.const(True, "bool"), *init], [v.name for v in op.results],
                      body=self._graph_proto(body))

        stack.append(_Task(op.body, body, done))

    def _yield(self, block: Block, graph: _Graph, results: Sequence[Value],
               loc: Optional[Location], loose: bool = False) -> None:
        """The block's results as the graph's outputs (each made inside it by an Identity)."""
        self.graph = graph
        self.loc = loc
        for operand, result in zip(block.results, results):
            d = dtype_of_type(result.type)
            name = self.names.take(f"{result.name}_out")
            self.node("Identity", [self.tensor(operand, d)], [name])
            t = self.type_of(operand)
            declared = with_dtype(t, d)
            graph.outputs.append(self.value_info(name, _loose(declared) if loose else declared))

    def _graph_proto(self, graph: _Graph) -> Any:
        """The GraphProto of a written graph."""
        return self.helper.make_graph(graph.nodes, _graph_name(graph.name), graph.inputs,
                                      graph.outputs)

    def subgraph(self, build: Callable[[], list[str]], types: Sequence[AbstractValue],
                 hint: str) -> Any:
        """A branch graph (no inputs) whose outputs are the names ``build()`` returns,
        written while ``build`` runs (for rules that make an ``If`` themselves)."""
        outer = self.graph
        inner = _Graph(self.names.take(hint))
        self.graph = inner
        try:
            names = build()
            for name, t in zip(names, types):
                out = self.names.take(f"{hint}_out")
                self.node("Identity", [name], [out])
                inner.outputs.append(self.value_info(out, t))
        finally:
            self.graph = outer
        return self._graph_proto(inner)

    # -- helpers for rules ---------------------------------------------------------------
    def node(self, op_type: str, inputs: Sequence[str], outputs: Sequence[str], **attrs: Any) -> None:
        """Append a node to the graph being written."""
        doc = self.loc.short() if self.loc is not None else None
        node = self.helper.make_node(op_type, list(inputs), list(outputs),
                                     name=self.node_names.take(op_type), doc_string=doc, **attrs)
        self.graph.nodes.append(node)

    def temp(self, hint: str) -> str:
        """A fresh name for an intermediate tensor."""
        return self.names.take(hint)

    def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
        """One node with one output, a fresh name, which is returned (for composing)."""
        out = self.temp(op_type.lower())
        self.node(op_type, list(inputs), [out], **attrs)
        return out

    def ints(self, values: Sequence[int]) -> str:
        """A 1-D i64 constant (axes, shapes)."""
        return self.const(np.array(list(values), dtype=np.int64), "i64")

    def reduce(self, op_type: str, x: str, axis: Any, keepdims: bool, out: Optional[str] = None) -> str:
        """``op_type`` (``ReduceSum``...) of ``x`` over ``axis`` (an int, a tuple, or None
        for every axis), into ``out`` (a fresh name when None); returns the name."""
        out = out or self.temp(op_type.lower())
        keep = int(bool(keepdims))
        if axis is None:
            self.node(op_type, [x], [out], keepdims=keep)
        elif isinstance(axis, tuple) and not axis:
            self.node("Identity", [x], [out])  # numpy: an empty tuple of axes reduces nothing
        else:
            axes = list(axis) if isinstance(axis, tuple) else [axis]
            self.node(op_type, [x, self.ints(axes)], [out], keepdims=keep)
        return out

    def dtype(self, value: Value) -> str:
        """The element type of a flat value (one the exported opset has)."""
        return _exportable(dtype_of_type(value.type), self.loc)

    def type_of(self, operand: Operand) -> AbstractValue:
        """The type of an operand (a constant's own, with its declared dtype)."""
        if isinstance(operand, Value):
            return operand.type
        if isinstance(operand, Undefined):
            return _placeholder_type(operand.type)
        if isinstance(operand, Const):
            return self.constant_type(operand)
        raise ExportError(f"a tuple where a tensor is needed ({operand!r})", self.loc)

    def tensor(self, operand: Operand, dtype: Optional[str] = None) -> str:
        """The name of a tensor holding ``operand`` (converted to ``dtype`` when given)."""
        if isinstance(operand, Value):
            return self.cast(operand.name, dtype_of_type(operand.type), dtype)
        if isinstance(operand, Undefined):
            return self.placeholder(operand.type, dtype)
        if isinstance(operand, Const):
            d = dtype or self.dtype_of_operand(operand)
            return self.const(operand.value, d)
        raise ExportError("a tuple where a tensor is needed", self.loc)

    def cast(self, name: str, have: str, want: Optional[str]) -> str:
        """``name`` converted from dtype ``have`` to ``want`` (itself when they agree)."""
        if want is None or want == have:
            return name
        out = self.temp(f"{name}_{want}")
        self.node("Cast", [name], [out], to=ONNX_TYPES[want])
        return out

    def shape_tensor(self, operand: Operand) -> str:
        """A 1-D i64 tensor from a shape operand (a tuple of constants and i64 values)."""
        items = shape_items(operand)
        if all(isinstance(i, Const) for i in items):
            dims = [int(i.value) for i in items if isinstance(i, Const)]
            return self.const(np.array(dims, dtype=np.int64), "i64")
        one = self.const(np.array([1], dtype=np.int64), "i64")
        pieces = []
        for item in items:
            piece = self.temp("dim")
            self.node("Reshape", [self.tensor(item, "i64"), one], [piece])
            pieces.append(piece)
        out = self.temp("shape")
        self.node("Concat", pieces, [out], axis=0)
        return out

    def const(self, value: Any, dtype: str) -> str:
        """An initializer holding ``value`` as ``dtype`` (one per distinct constant)."""
        if dtype == "str":
            array = np.array(value, dtype=object)
            key: tuple[Any, ...] = ("str", array.shape, tuple(str(v) for v in array.flat))
        else:
            array = np.asarray(value, dtype=numpy_dtype(_exportable(dtype, self.loc)))
            key = (dtype, array.shape, array.tobytes())
        name = self._consts.get(key)
        if name is None:
            name = self._consts[key] = self.names.take("const")
            if dtype == "str":
                tensor_proto = self.helper.make_tensor(name, ONNX_TYPES["str"], list(array.shape),
                                                       [str(v).encode("utf-8") for v in array.flat])
            else:
                tensor_proto = self.onnx.numpy_helper.from_array(array, name)
            self.initializers.append(tensor_proto)
        return name

    def fill_value(self, fill: int, dtype: str) -> Any:
        """The one-element ``value`` attribute of ``ConstantOfShape``."""
        array = np.array([fill], dtype=numpy_dtype(dtype))
        return self.onnx.numpy_helper.from_array(array, "value")

    def placeholder(self, t: AbstractValue, dtype: Optional[str] = None) -> str:
        """A tensor of type ``t`` (symbolic dimensions 0) that nothing reads."""
        pt = _placeholder_type(t)
        d = dtype or dtype_of_type(pt)
        shape = shape_of_type(pt) or ()
        if d == "str":
            return self.const(np.full(shape, "", dtype=object), "str")
        if int(np.prod(shape, dtype=np.int64)) <= PLACEHOLDER_INITIALIZER_LIMIT:
            return self.const(np.zeros(shape, dtype=numpy_dtype(d)), d)
        out = self.temp("placeholder")
        self.node("ConstantOfShape", [self.const(np.array(shape, dtype=np.int64), "i64")], [out],
                  value=self.fill_value(0, d))
        return out

    def value_info(self, name: str, t: AbstractValue) -> Any:
        """A typed ``ValueInfoProto`` (dtype and dims, symbolic ones as dim_params)."""
        dtype = _exportable(dtype_of_type(t), self.loc)
        return self.helper.make_tensor_value_info(name, ONNX_TYPES[dtype], _dims(t))


_PROTO_NAMES = {"f16": "FLOAT16", "f32": "FLOAT", "f64": "DOUBLE", "i8": "INT8", "i16": "INT16",
                "i32": "INT32", "i64": "INT64", "u8": "UINT8", "u16": "UINT16", "u32": "UINT32",
                "u64": "UINT64", "bool": "BOOL", "str": "STRING", "bf16": "BFLOAT16",
                "c64": "COMPLEX64", "c128": "COMPLEX128", "f8e4m3fn": "FLOAT8E4M3FN",
                "f8e4m3fnuz": "FLOAT8E4M3FNUZ", "f8e5m2": "FLOAT8E5M2", "f8e5m2fnuz": "FLOAT8E5M2FNUZ",
                "f8e8m0": "FLOAT8E8M0", "f4e2m1": "FLOAT4E2M1", "i4": "INT4", "u4": "UINT4",
                "i2": "INT2", "u2": "UINT2"}


def _placeholder_type(t: AbstractValue) -> AbstractValue:
    """The type of the placeholder standing for ``t``: symbolic dimensions are 0, unknown rank is 0-d."""
    if isinstance(t, ATensor):
        if t.shape is None:
            return AScalar(t.dtype)
        return ATensor(t.dtype, tuple(d if isinstance(d, int) else 0 for d in t.shape))
    return t


def _loose(t: AbstractValue) -> AbstractValue:
    """``t`` with its symbolic dimensions unknown (loop-carried values may change shape)."""
    if isinstance(t, ATensor) and t.shape is not None:
        return ATensor(t.dtype, tuple(d if isinstance(d, int) else UNKNOWN_DIM for d in t.shape))
    return t


def _graph_name(name: str) -> str:
    """An ONNX graph name (ASCII) for an anfir graph name."""
    return sanitize(name)


def _version() -> str:
    """anfir's version as installed ('' when not installed as a distribution)."""
    try:
        from importlib.metadata import version

        return version("anfir")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return ""


__all__ = [
    "EXTRA", "ONNX_TYPES", "OPSET", "OnnxRule", "OnnxWriter", "RULES", "UNSUPPORTED", "binary", "compare",
    "export_onnx", "logical", "model_from_graph", "nest_outputs", "onnx_inputs", "require_onnx",
    "unary",
]

"""Export an anfir program to Core ML: a coremltools MIL ``Program`` (and an ``.mlpackage``).

::

    prog = anfir.export_coreml(mod, entry="mlp_loss")       # a MIL Program
    model = coreml_export.to_mlmodel(prog)                  # ct.convert(..., "mlprogram"), float32
    model.save("mlp.mlpackage")

The program is compiled and walked into the same first-order flat program as
the ONNX exporter's (:mod:`anfir.flat.flatten`); each flat op is written by
the rule :data:`RULES` holds for its primitive object, through coremltools'
MIL builder.  ``if`` becomes MIL ``cond``, tail recursion (and ``scan``/``fori_loop``)
``while_loop`` (:mod:`anfir.interop.coreml.loops`).
Adding an operator is one entry::

    RULES[elementwise.erf] = unary("erf")

(a rule is ``rule(writer, op)``: it computes ``op.results`` from ``op.args``
with :meth:`MilWriter.op` and binds them with :meth:`MilWriter.bind`).

What Core ML runs differs from anfir in ways the model says openly:

* Core ML computes in 32 bits: anfir's ``f64`` is MIL ``fp32`` and ``i64``
  ``int32`` (``f32``/``i32``/``f16`` stay; narrower integers widen to ``int32``);
  strings and bit operations have no MIL form (a located error);
* a Core ML input or output has rank 1 or more: an anfir scalar is a tensor of
  shape ``(1,)`` at the boundary (reshaped to a 0-d value inside), and a boolean
  is an ``int32`` 0/1 there;
* symbolic dimensions (``f64[B, 3]``) are MIL symbols of the same name; in the
  converted model they are flexible dimensions with no upper bound.

The ``coremltools`` package is imported when a program is written, never when
anfir is imported; without it, :class:`~anfir.errors.MissingDependencyError`
names the extra (``pip install "anfir[coreml]"``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional, Sequence

import numpy as np

from anfir.abstract.shapes import is_unknown_dim
from anfir.abstract.values import AbstractValue, dim_text
from anfir.dtypes import is_bool
from anfir.errors import ExportError, MissingDependencyError
from anfir.interop.coreml import loops as coreml_loops
from anfir.flat.statements import (  # sorted
    Block, Const, FlatProgram, IfOp, LoopOp, NameAllocator, Op, Operand, OperandReader,
    Undefined, Value, dtype_of_type, nest_by_structure,
    program_properties, shape_items, shape_of_type, values_by_name,
)
from anfir.flat.flatten import flatten_program
from anfir.interop.export_common import boolean, rule_for
from anfir.interop.coreml.mil_types import NUMPY_OF_MIL, mil_dtype
from anfir.interop.coreml.export_rules import RULES as FAMILY_RULES, UNSUPPORTED as FAMILY_UNSUPPORTED
from anfir.interop.coreml.export_rules.common import MilRule, binary, compare, composite, logical, unary
from anfir.ir.graph import FuncGraph
from anfir.ir.primitive import Primitive
from anfir.passes.decompose import Declines, decompose
from anfir.location import Location
from anfir.passes.pipeline import Source, compile_program
from anfir.primitives import arith, elementwise, nn, structure, tensor
from anfir.runtime_values import DType

if TYPE_CHECKING:  # pragma: no cover
    from coremltools.converters.mil.mil import Program

EXTRA = "coreml"
"""The extra that installs what this module needs: ``pip install "anfir[coreml]"``."""

NATIVE: frozenset[Primitive] = frozenset({
    nn.softmax, nn.layer_norm, elementwise.gelu, elementwise.silu, arith.softplus,
    elementwise.softsign, elementwise.elu, elementwise.leaky_relu, elementwise.hard_sigmoid,
})
"""The composites of :data:`anfir.decompositions.DECOMPOSITIONS` written as MIL's own ops
(``softmax``, ``layer_norm``, ``gelu``, ``silu``, ``softplus``, ``softsign``, ``elu``,
``leaky_relu``, ``sigmoid_hard``); the others reach :data:`RULES` decomposed (``sigmoid``
and ``erf`` are core primitives, written as MIL's ``sigmoid`` and ``erf``).  MIL has no
log_softmax, rms_norm, group norm or loss ops; its ``instance_norm`` takes rank 3-4 only."""

MAX_CONTROL_DEPTH = 64
"""How deeply ``cond`` and ``while_loop`` may nest: coremltools' builder writes a
nested block from inside the call that makes its op, so each level costs Python
stack frames (the flat program itself is written without recursion otherwise)."""


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """coremltools' log warnings (no macOS runtime here, an untested torch version,
    flexible shapes) off while it runs for anfir."""
    logger = logging.getLogger("coremltools")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _no_progress_bars() -> Iterator[None]:
    """The converter's pass pipeline without its tqdm progress bars on stderr (it has no
    option for that: its module's ``tqdm`` is replaced while anfir converts)."""
    from coremltools.converters.mil.mil.passes import pass_pipeline

    original = pass_pipeline.tqdm
    pass_pipeline.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        pass_pipeline.tqdm = original


def require_coremltools() -> Any:
    """The ``coremltools`` module, or a :class:`MissingDependencyError` naming the extra."""
    try:
        with _quiet():
            import coremltools
            from coremltools.converters.mil import Builder  # noqa: F401
    except ImportError:
        raise MissingDependencyError(
            f'exporting to Core ML needs the coremltools package: pip install "anfir[{EXTRA}]"'
        ) from None
    return coremltools


_METADATA: "weakref.WeakKeyDictionary[Any, dict[str, str]]" = weakref.WeakKeyDictionary()
"""Program → the facts about its source (entry, file, signature, how outputs nest):
a MIL Program has no metadata of its own, the converted model gets them."""


def export_coreml(source: Source, entry: Optional[str] = None,
                  args: Optional[Sequence[Any]] = None) -> "Program":
    """Compile ``source`` (a Module, FuncGraph or path) for ``args`` (example values
    or types; the entry's annotations otherwise) and write the optimized entry as
    a coremltools MIL ``Program`` (function ``main``).  See the module documentation."""
    require_coremltools()
    result = compile_program(source, entry=entry, args=args)
    module = getattr(source, "metadata", None)
    metadata = {f"anfir.module.{k}": str(v) for k, v in sorted((module or {}).items())}
    if result.program.module is not None:
        metadata["anfir.source"] = result.program.module.filename
    return program_from_graph(result.graph, metadata)


def program_from_graph(graph: FuncGraph, metadata: Optional[dict[str, str]] = None,
                       feeds: Optional[Sequence[Any]] = None,
                       evaluators: Optional[Mapping[str, Callable[..., Any]]] = None) -> "Program":
    """The MIL Program of an optimized graph (what ``anfir.compile`` returns).

    With ``feeds`` (one anfir-style value per entry parameter), the inputs are
    constants instead: coremltools then computes every op it can at build time
    (its ops' value inference), which :func:`evaluate` reads back; ``evaluators``
    compute the ops it cannot (see :func:`evaluate`).  The composites MIL does not have
    (not in :data:`NATIVE`) are decomposed in ``graph`` first, in place
    (:func:`anfir.passes.decompose.decompose`: the graph computes the same values).
    """
    declined: Declines = {}
    flat = flatten_program(decompose(graph, NATIVE, declined))
    props = program_properties(flat, graph.name,
                               None if graph.abstract is None else str(graph.abstract), metadata or {})
    values = None if feeds is None else values_by_name(flat.input_structure, feeds)
    writer = MilWriter(require_coremltools(), flat, evaluators)
    writer.declined = declined
    program = writer.program(values)
    _METADATA[program] = props
    return program


def metadata_of(program: "Program") -> dict[str, str]:
    """The anfir metadata of a Program :func:`export_coreml` wrote (empty for others)."""
    return dict(_METADATA.get(program, {}))


def to_mlmodel(program: "Program") -> Any:
    """``program`` converted by ``coremltools.convert(..., convert_to="mlprogram")``,
    computing in float32 (not the converter's default float16), with symbolic
    dimensions flexible without an upper bound and anfir's metadata in the
    model's user-defined metadata.  Save it with ``model.save("X.mlpackage")``."""
    ct = require_coremltools()
    with warnings.catch_warnings(), _quiet(), _no_progress_bars():
        # "Some dimensions in the input shape are unknown...": the bounds are set below.
        warnings.simplefilter("ignore", UserWarning)
        model = ct.convert(program, convert_to="mlprogram",
                           compute_precision=ct.precision.FLOAT32,
                           minimum_deployment_target=ct.target.iOS17)
        spec = model.get_spec()
        flexible = False
        for feature in spec.description.input:
            array = feature.type.multiArrayType
            if array.HasField("shapeRange"):
                flexible = True
                for dim in array.shapeRange.sizeRanges:
                    if dim.lowerBound != dim.upperBound:
                        dim.lowerBound, dim.upperBound = 0, -1
        if flexible:
            model = ct.models.MLModel(spec, weights_dir=model.weights_dir, skip_model_load=True)
    metadata = _METADATA.get(program, {})
    for key, value in metadata.items():
        model.user_defined_metadata[key] = value
    entry = metadata.get("anfir.entry")
    if entry:
        model.short_description = f"anfir export of @{entry}"
    return model


def evaluate(source: Source, entry: Optional[str] = None, args: Sequence[Any] = (),
             evaluators: Optional[Mapping[str, Callable[..., Any]]] = None) -> Any:
    """What the exported program computes for ``args``, by coremltools itself: the
    program is built with the arguments as constants, and the outputs are the
    values coremltools' ops infer (each MIL op's reference implementation in
    numpy).  Core ML prediction needs macOS; this checks the MIL ops the
    exporter chose on any machine.  ``while_loop`` has no value inference: a loop
    is unrolled, its body written once per iteration and its values inferred
    (:func:`anfir.interop.coreml.loops.unroll`; to run the exported program
    itself, loops and all: :func:`anfir.interop.coreml.loops.run_program`).

    coremltools infers no value for some ops (``conv``, ``conv_transpose``, the
    pools, ``scatter``, ``gather_nd``, ``scatter_nd``), and its inference of
    ``scatter_along_axis`` ignores ``mode="add"``: ``evaluators`` maps an op type
    to a function of the op's inputs (numpy values, by MIL's input names)
    computing its value, which then stands for the op (tests pass PyTorch's)."""
    require_coremltools()
    graph = compile_program(source, entry=entry, args=list(args)).graph
    program = program_from_graph(graph, feeds=args, evaluators=evaluators)
    outputs = program.functions["main"].outputs
    values = []
    for var in outputs:
        if var.val is None:
            raise ExportError(f"coremltools cannot compute the output {var.name} at build time "
                              f"(an op without value inference: {var.op.op_type})")
        values.append(var.val)
    props = _METADATA[program]
    return _nest(json.loads(props["anfir.outputs"]), set(json.loads(props["anfir.scalar_outputs"])),
                 {v.name: np.asarray(x) for v, x in zip(outputs, values)})


def _nest(structure: Any, scalars: set[str], by_name: dict[str, np.ndarray]) -> Any:
    """Outputs nested as anfir returns them (scalars as Python scalars)."""
    def leaf(name: Optional[str]) -> Any:
        if name is None:
            return None
        value = by_name[name]
        return value.reshape(()).item() if name in scalars else value

    return nest_by_structure(structure, leaf)


# -- rules --------------------------------------------------------------------------------
RULES: dict[Primitive, MilRule] = FAMILY_RULES
"""Primitive object → the rule writing its MIL ops: the rules of every family of
:mod:`anfir.interop.coreml.export_rules` (one module per family of ``anfir/primitives/``).
A primitive the walker takes apart itself (``make_tuple``, ``env_getitem``...) needs none
(:data:`anfir.flat.flatten.WALKER_ONLY`)."""

UNSUPPORTED: dict[Primitive, str] = FAMILY_UNSUPPORTED
"""Primitives that cannot be exported to MIL, with the reason (the error quotes it)."""


# -- the writer ----------------------------------------------------------------------------
class MilWriter(OperandReader):
    """Writes a :class:`FlatProgram` as a MIL Program; the helpers rules use are here."""

    def __init__(self, ct: Any, program: FlatProgram,
                 evaluators: Optional[Mapping[str, Callable[..., Any]]] = None) -> None:
        """A writer for ``program`` (``ct`` is the imported coremltools; ``evaluators``
        compute the ops coremltools has no value inference for, see :func:`evaluate`)."""
        from coremltools.converters.mil import Builder
        from coremltools.converters.mil.mil import Var, types

        self.ct = ct
        self.mb = Builder
        self.types = types
        self.flat = program
        self.names: NameAllocator = program.names
        self.vars: dict[int, Any] = {}
        self.loc: Optional[Location] = None
        self.depth = 0
        self.constant_inputs = False
        self.evaluators = dict(evaluators or {})
        self.declined: Declines = {}  # why the decomposition pass left composite calls
        self._var_class = Var

    # -- the program -----------------------------------------------------------------
    def program(self, feeds: Optional[dict[str, Any]] = None) -> Any:
        """Write the whole program as function ``main``; inputs are constants with ``feeds``."""
        from coremltools.converters.mil.mil import Function, Program

        mb, flat = self.mb, self.flat
        self.constant_inputs = feeds is not None
        placeholders: dict[str, Any] = {}
        if feeds is None:
            for value in flat.inputs:
                placeholders[value.name] = mb.placeholder(
                    shape=self._io_shape(value.type), dtype=self._io_dtype(value.type))
        program = Program()
        with Function(placeholders, opset_version=self.ct.target.iOS17) as function:
            for value in flat.inputs:
                d = dtype_of_type(value.type)
                if feeds is not None:
                    self.vars[id(value)] = self.const(feeds[value.name], d)
                    continue
                var = function.inputs[value.name]
                if is_bool(d):
                    var = self.op("not_equal", x=var, y=np.int32(0))
                if shape_of_type(value.type) == ():
                    var = self.reshape(var, np.zeros((0,), dtype=np.int32))
                self.vars[id(value)] = var
            self._write_block(flat.body)
            outputs = []
            for operand, name, t in zip(flat.body.results, flat.output_names, flat.output_types):
                self.loc = None
                d = dtype_of_type(t)
                var = self.tensor(operand, d)
                if is_bool(d):
                    var = self.cast(var, "i32")
                if shape_of_type(t) == ():
                    var = self.reshape(var, np.array([1], dtype=np.int32))
                outputs.append(mb.identity(x=var, name=name))
            function.set_outputs(outputs)
            program.add_function("main", function)
        return program

    def _io_dtype(self, t: AbstractValue) -> Any:
        """The MIL dtype of an input of type ``t`` (a boolean is an int32 0/1)."""
        d = mil_dtype(dtype_of_type(t), self.loc)
        return self.types.string_to_builtin("int32" if d == "bool" else d)

    def _io_shape(self, t: AbstractValue) -> tuple[Any, ...]:
        """The MIL shape of an input of type ``t``: scalars are ``(1,)``; symbols by name."""
        shape = shape_of_type(t)
        if shape is None:
            raise ExportError(f"a Core ML input needs a known rank, not {t}", self.loc)
        return tuple(self.dim(d) for d in shape) or (1,)

    def dim(self, d: Any) -> Any:
        """A MIL dimension: an int, or a symbol (named as anfir's when it is a plain name)."""
        from coremltools.converters.mil.mil import get_new_symbol, program as mil_program

        if isinstance(d, int):
            return d
        text = dim_text(d)
        if text.isdigit():
            return int(text)
        if is_unknown_dim(d) or not text.isidentifier() or text.startswith("is"):
            return get_new_symbol()
        # coremltools allows one Symbol per name in a process: reuse the one made before.
        used = mil_program.k_used_symbols
        return used[text] if text in used else mil_program.Symbol(text)

    def _write_block(self, block: Block) -> None:
        """Write the statements of ``block`` (straight-line; If/Loop nest through the builder)."""
        for statement in block.ops:
            self.loc = statement.loc
            if isinstance(statement, Op):
                rule_for(RULES, UNSUPPORTED, statement, "Core ML", "MIL", self.declined)(self, statement)
            elif isinstance(statement, IfOp):
                self._if(statement)
            else:
                self._loop(statement)

    def _nest(self, loc: Optional[Location]) -> None:
        """One more level of cond/while_loop, refused beyond :data:`MAX_CONTROL_DEPTH`."""
        self.depth += 1
        if self.depth > MAX_CONTROL_DEPTH:
            raise ExportError(f"control flow nested more than {MAX_CONTROL_DEPTH} deep cannot be "
                              "exported to Core ML", loc)

    def _branch(self, block: Block, results: Sequence[Value]) -> Callable[[], Any]:
        """The function MIL ``cond`` calls to build a branch."""
        def build() -> Any:
            self._write_block(block)
            out = tuple(self.op("identity", x=self.tensor(o, dtype_of_type(r.type)))
                        for o, r in zip(block.results, results))
            return out if len(out) != 1 else out[0]
        return build

    def _if(self, op: IfOp) -> None:
        """An IfOp as MIL ``cond`` (branches see the values around them)."""
        self._nest(op.loc)
        if not op.results:
            self.depth -= 1
            return
        outs = self.mb.cond(pred=self.tensor(op.cond, "bool"),
                            _true_fn=self._branch(op.then_block, op.results),
                            _false_fn=self._branch(op.else_block, op.results),
                            name=self.names.take(op.results[0].name + "_cond"))
        self.depth -= 1
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        for value, var in zip(op.results, outs):
            self.vars[id(value)] = var

    def _loop(self, op: LoopOp) -> None:
        """A do-while LoopOp as MIL ``while_loop`` (:mod:`anfir.interop.coreml.loops`);
        with constant inputs (:func:`evaluate`), unrolled by value inference."""
        self._nest(op.loc)
        if self.constant_inputs:
            coreml_loops.unroll(self, op)
        else:
            coreml_loops.write_while_loop(self, op)
        self.depth -= 1

    # -- helpers for rules ---------------------------------------------------------------
    def op(self, kind: str, out: Optional[Value] = None, **inputs: Any) -> Any:
        """One MIL op (``mb.<kind>(**inputs)``) named after ``out`` (or a fresh name)."""
        name = inputs.pop("name", None) or self.names.take(out.name if out is not None else kind)
        if out is not None and name == out.name:
            name = self.names.take(out.name)
        try:
            var = getattr(self.mb, kind)(name=name, **inputs)
        except ExportError:
            raise
        except (ValueError, TypeError, NotImplementedError) as error:
            raise ExportError(f"coremltools refused the MIL op {kind}: {error}", self.loc) from None
        if self.constant_inputs and kind in self.evaluators and isinstance(var, self._var_class):
            var = self._evaluated(kind, name, var, inputs)
        if self.constant_inputs and isinstance(var, self._var_class) and isinstance(
                var.val, (bool, int, float)):
            # Some value inferences give a Python scalar that the next op's cannot take
            # (``cos`` asks for ``.ndim``): a numpy 0-d value of the var's dtype instead.
            value = np.asarray(var.val, dtype=self.types.nptype_from_builtin(var.dtype))
            var = self.mb.const(val=value, name=self.names.take(f"{name}_value"))
        return var

    def _evaluated(self, kind: str, name: str, var: Any, inputs: dict[str, Any]) -> Any:
        """The op's value by ``self.evaluators[kind]`` as a const (``var`` itself when an
        input has no value either)."""
        values = {}
        for key, given in inputs.items():
            value = given.val if isinstance(given, self._var_class) else given
            if value is None:
                return var
            values[key] = np.asarray(value) if isinstance(given, self._var_class) else value
        result = np.asarray(self.evaluators[kind](**values),
                            dtype=self.types.nptype_from_builtin(var.dtype))
        if tuple(result.shape) != tuple(var.shape):
            raise ExportError(f"the evaluator of {kind} gave shape {result.shape}, the op's "
                              f"is {var.shape}", self.loc)
        return self.mb.const(val=result, name=self.names.take(f"{name}_value"))

    def bind(self, value: Value, var: Any) -> None:
        """``var`` computes the flat value ``value``."""
        self.vars[id(value)] = var

    def dtype(self, value: Value) -> str:
        """The anfir element type of a flat value."""
        return dtype_of_type(value.type)

    def type_of(self, operand: Operand) -> AbstractValue:
        """The anfir type of an operand (a constant's own)."""
        if isinstance(operand, (Value, Undefined)):
            return operand.type
        if isinstance(operand, Const):
            return self.constant_type(operand)
        raise ExportError(f"a tuple where a tensor is needed ({operand!r})", self.loc)

    def tensor(self, operand: Operand, dtype: Optional[str] = None) -> Any:
        """The MIL var holding ``operand`` (converted to ``dtype``'s MIL dtype when given)."""
        if isinstance(operand, Value):
            var = self.vars.get(id(operand))
            if var is None:
                raise ExportError(f"the value {operand.name} is read before it is written",
                                  self.loc)
            return self.cast(var, dtype) if dtype is not None else var
        if isinstance(operand, Undefined):
            return self.placeholder(operand.type, dtype)
        if isinstance(operand, Const):
            return self.const(operand.value, dtype or self.dtype_of_operand(operand))
        raise ExportError("a tuple where a tensor is needed", self.loc)

    def cast(self, var: Any, dtype: str, out: Optional[Value] = None) -> Any:
        """``var`` converted to the MIL dtype of anfir's ``dtype`` (itself when it has it)."""
        want = mil_dtype(dtype, self.loc)
        have = self.types.builtin_to_string(var.dtype)
        if have == want:
            return var
        return self.op("cast", out, x=var, dtype=want)

    def const(self, value: Any, dtype: str) -> Any:
        """A MIL const holding ``value`` as the MIL dtype of ``dtype``."""
        if isinstance(value, DType):
            raise ExportError("a dtype where a tensor is needed", self.loc)
        if isinstance(value, str):
            raise ExportError("Core ML has no string tensors", self.loc)
        d = mil_dtype(dtype, self.loc)
        array: np.ndarray = np.asarray(value, dtype=NUMPY_OF_MIL[d])
        return self.mb.const(val=array, name=self.names.take("const"))

    def placeholder(self, t: AbstractValue, dtype: Optional[str] = None) -> Any:
        """A value of type ``t`` that nothing reads (symbolic dimensions 0)."""
        d = dtype or dtype_of_type(t)
        shape = shape_of_type(t)
        if shape is None:
            shape = ()
        concrete = tuple(s if isinstance(s, int) else 0 for s in shape)
        return self.const(np.zeros(concrete), d)

    def shape_of(self, var: Any) -> Any:
        """``shape(var)``: a 1-D int32 var (a constant when the shape is known)."""
        shape = var.shape
        if all(isinstance(s, (int, np.integer)) for s in shape):
            return np.array([int(s) for s in shape], dtype=np.int32)
        return self.op("shape", x=var)

    def size_of(self, var: Any) -> Any:
        """The number of elements of ``var`` (int32)."""
        shape = self.shape_of(var)
        if isinstance(shape, np.ndarray):
            return self.const(int(np.prod(shape)), "i32")
        return self.op("reduce_prod", x=shape, keep_dims=False)

    def shape_tensor(self, operand: Operand) -> Any:
        """A 1-D int32 shape from a shape operand (a tuple of constants and int values)."""
        items = shape_items(operand)
        if all(isinstance(i, Const) for i in items):
            return np.array([int(i.value) for i in items if isinstance(i, Const)], dtype=np.int32)
        pieces = [self.reshape(self.tensor(item, "i32"), np.array([1], dtype=np.int32))
                  for item in items]
        return self.op("concat", values=pieces, axis=0)

    def select(self, cond: Any, a: Any, b: Any, dtype: str, out: Optional[Value] = None) -> Any:
        """``a`` where ``cond`` else ``b``, broadcast as numpy does.  MIL's select takes
        its type from ``a`` and ``b`` alone: a condition of a bigger shape first
        broadcasts ``a`` to it (plus zeros, or or-ed with false)."""
        if tuple(cond.shape) not in (tuple(a.shape), tuple(b.shape)):
            if dtype == "bool":
                a = self.op("logical_or", x=a, y=self.op("logical_and", x=cond,
                                                           y=self.const(False, "bool")))
            else:
                zeros = self.op("mul", x=self.cast(cond, dtype), y=self.const(0, dtype))
                a = self.op("add", x=a, y=zeros)
        return self.op("select", out, cond=cond, a=a, b=b)

    def reshape(self, var: Any, shape: Any, out: Optional[Value] = None) -> Any:
        """``var`` reshaped to ``shape`` (a numpy array or a 1-D int32 var)."""
        if var.val is not None and isinstance(shape, np.ndarray) and not var.shape:
            # coremltools' reshape cannot infer the value of a constant scalar (a Python
            # float has no .reshape): the reshaped constant is written directly.
            value = np.asarray(var.val, dtype=self.types.nptype_from_builtin(var.dtype))
            return self.mb.const(val=value.reshape(shape), name=self.names.take(
                out.name if out is not None else "reshaped"))
        return self.op("reshape", out, x=var, shape=shape)

    def reduce(self, kind: str, x: Any, axis: Any, keepdims: bool,
               out: Optional[Value] = None) -> Any:
        """``kind`` (``reduce_sum``...) of ``x`` over ``axis`` (an int, a tuple, or None for
        every axis)."""
        if isinstance(axis, tuple) and not axis:
            return x  # numpy: an empty tuple of axes reduces nothing
        if not x.shape:
            return x  # a 0-d value reduced over every axis is itself
        if axis is None:
            return self.op(kind, out, x=x, keep_dims=keepdims)
        axes = list(axis) if isinstance(axis, tuple) else [axis]
        return self.op(kind, out, x=x, axes=np.array(axes, dtype=np.int32), keep_dims=keepdims)


def describe(model_or_path: Any) -> dict[str, Any]:
    """What a converted model declares: its function names, inputs and outputs with
    their dtypes and shapes (``None`` for a flexible dimension), and the MIL op
    types of ``main`` (nested blocks too) — read from the spec, as
    ``coremltools.utils.load_spec`` gives it for a saved ``.mlpackage``."""
    ct = require_coremltools()
    spec = ct.utils.load_spec(model_or_path) if isinstance(model_or_path, str) else model_or_path

    def feature(f: Any) -> dict[str, Any]:
        array = f.type.multiArrayType
        ranges = list(array.shapeRange.sizeRanges) if array.HasField("shapeRange") else []
        dims: list[Optional[int]] = []
        for k, d in enumerate(array.shape):
            flexible = k < len(ranges) and ranges[k].lowerBound != ranges[k].upperBound
            dims.append(None if flexible else int(d))
        dtype = ct.proto.FeatureTypes_pb2.ArrayFeatureType.ArrayDataType.Name(array.dataType)
        return {"name": f.name, "dtype": dtype, "shape": dims}

    functions = dict(spec.mlProgram.functions)
    op_types: list[str] = []
    if "main" in functions:
        main = functions["main"]
        blocks = [main.block_specializations[main.opset]]
        while blocks:
            block = blocks.pop()
            for operation in block.operations:
                op_types.append(operation.type)
                blocks.extend(operation.blocks)
    return {"functions": sorted(functions), "inputs": [feature(f) for f in spec.description.input],
            "outputs": [feature(f) for f in spec.description.output], "op_types": op_types,
            "metadata": dict(spec.description.metadata.userDefined)}


__all__ = [
    "EXTRA", "MAX_CONTROL_DEPTH", "MilRule", "MilWriter", "RULES", "UNSUPPORTED", "binary",
    "compare", "composite", "describe", "evaluate", "export_coreml", "logical", "metadata_of",
    "mil_dtype", "mil_to_anfir", "program_from_graph", "require_coremltools", "to_mlmodel", "unary",
]

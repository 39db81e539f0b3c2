"""Export an anfir program to an ONNX model (opset 21).

::

    model = anfir.export_onnx(mod, entry="mlp_loss")        # an onnx.ModelProto
    onnx.save(model, "mlp.onnx")

The program is compiled (``anfir.compile``: specialized, differentiated,
inlined, optimized), walked into a first-order flat program
(:mod:`anfir.flat.flatten`: tuples taken apart, closures converted, calls
inlined, ``if`` → ``If``, tail recursion → ``Loop``), and each flat op is
written by the rule :data:`RULES` holds for its primitive object.  Adding an
operator is one entry::

    RULES[tensor.matmul] = binary("MatMul")

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
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

import numpy as np

from anfir.abstract.shapes import is_unknown_dim
from anfir.abstract.values import AbstractValue, AScalar, AString, ATensor, dim_text
from anfir.dtypes import is_float, numpy_dtype
from anfir.errors import ExportError, MissingDependencyError
from anfir.flat.statements import (
    DIM, Block, Const, FlatProgram, IfOp, LoopOp, NameAllocator, Op, Operand, Undefined, Value,
    OperandReader, dtype_of_type, operand_leaves, shape_items,
    nest_by_structure, program_properties, shape_of_type,
    one_device_reasons, values_by_name,
)
from anfir.flat.flatten import UNKNOWN_DIM, flatten_program, sanitize
from anfir.interop.export_common import (
    boolean, broadcast_like_needed, common_dtype, conv_geometry, conv_params_of, operand_shape,
    operands_rule, result_dtype, rule_for, static_shape, sum_to_plan, zero_array,
)
from anfir.interop.onnx.export_shaping import SHAPING_RULES, UNSUPPORTED_SHAPING
from anfir.ir.graph import FuncGraph
from anfir.ir.primitive import Primitive
from anfir.location import Location
from anfir.passes.decompose import Declines, decompose
from anfir.passes.pipeline import Source, compile_program
from anfir.primitives import arith, complexes, conv, elementwise, gradient, nn, nn_kernels, reduce, structure, tensor

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
ONNX_TYPES: dict[str, int] = {
    "f16": 10, "f32": 1, "f64": 11, "i8": 3, "i16": 5, "i32": 6, "i64": 7,
    "u8": 2, "u16": 4, "u32": 12, "u64": 13, "bool": 9, "str": 8,
    "bf16": 16, "c64": 14, "c128": 15,
    "f8e4m3fn": 17, "f8e4m3fnuz": 18, "f8e5m2": 19, "f8e5m2fnuz": 20, "u4": 21, "i4": 22,
    "f4e2m1": 23, "f8e8m0": 24, "u2": 25, "i2": 26,
}
"""anfir dtype → ONNX ``TensorProto.DataType`` (checked against onnx when a model is written)."""

_NEWER_TYPES: dict[str, int] = {"f4e2m1": 23, "f8e8m0": 24, "u2": 25, "i2": 25}
"""Element types ONNX added after the opset the exporter writes: dtype → the opset that has it."""

_FLOAT8 = ("f8e4m3fn", "f8e4m3fnuz", "f8e5m2", "f8e5m2fnuz")
"""The types ONNX's Cast saturates to by default (``saturate=1``)."""


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
OnnxRule = Callable[["OnnxWriter", Op], None]
"""``rule(writer, op)``: write the nodes that compute ``op.results`` (see :class:`OnnxWriter`)."""


def unary(op_type: str) -> OnnxRule:
    """``out = op_type(x)``, ``x`` converted to the result's dtype."""
    return operands_rule(result_dtype, lambda w, op, xs: w.node(op_type, xs, [op.results[0].name]),
                         f"ONNX {op_type}", 1)


def binary(op_type: str) -> OnnxRule:
    """``out = op_type(x, y)``, both converted to the result's dtype (numpy's promotion)."""
    return operands_rule(result_dtype, lambda w, op, xs: w.node(op_type, xs, [op.results[0].name]),
                         f"ONNX {op_type}", 2)


def compare(op_type: str, negate: bool = False) -> OnnxRule:
    """``out = op_type(x, y)`` on the two operands' common dtype (``negate``: then ``Not``)."""
    def write(w: OnnxWriter, op: Op, xs: list[str]) -> None:
        out = op.results[0].name
        if negate:
            w.node("Not", [w.op(op_type, *xs[:2])], [out])
        else:
            w.node(op_type, xs[:2], [out])
    return operands_rule(common_dtype, write, f"ONNX {op_type}" + (" then Not" if negate else ""), 2)


def logical(op_type: str) -> OnnxRule:
    """``out = op_type(*args)`` on booleans."""
    return operands_rule(boolean, lambda w, op, xs: w.node(op_type, xs, [op.results[0].name]),
                         f"ONNX {op_type}")


def _relu(w: OnnxWriter, op: Op) -> None:
    """``Relu``, or ``Max(x, 0)`` for integers (onnxruntime has no integer Relu)."""
    out = op.results[0]
    d = w.dtype(out)
    x = w.tensor(op.args[0], d)
    if is_float(d):
        w.node("Relu", [x], [out.name])
    else:
        w.node("Max", [x, w.const(0, d)], [out.name])


def _matmul(w: OnnxWriter, op: Op) -> None:
    """``MatMul`` on the result's dtype."""
    out = op.results[0]
    d = w.dtype(out)
    w.node("MatMul", [w.tensor(op.args[0], d), w.tensor(op.args[1], d)], [out.name])


def _transpose(w: OnnxWriter, op: Op) -> None:
    """``Transpose`` with the constant permutation (none: axes reversed)."""
    out = op.results[0]
    x = w.tensor(op.args[0], w.dtype(out))
    perm = w.static(op.args[1]) if len(op.args) > 1 else None
    if perm is None:
        w.node("Transpose", [x], [out.name])
    else:
        w.node("Transpose", [x], [out.name], perm=[int(p) for p in perm])


def _reshape(w: OnnxWriter, op: Op) -> None:
    """``Reshape`` with numpy's meaning of 0 (``allowzero=1``)."""
    out = op.results[0]
    x = w.tensor(op.args[0], w.dtype(out))
    w.node("Reshape", [x, w.shape_tensor(op.args[1])], [out.name], allowzero=1)


def _reduce(op_type: str) -> OnnxRule:
    """A reduction over the ``axis`` attribute (None: every axis), ``keepdims`` as asked."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        x = w.tensor(op.args[0], w.dtype(out))
        w.reduce(op_type, x, op.attrs.get("axis"), bool(op.attrs.get("keepdims")), out.name)
    rule.__doc__ = f"ONNX {op_type} over the axis attribute"
    return rule


def _broadcast_to(w: OnnxWriter, op: Op) -> None:
    """``Expand`` to the shape."""
    out = op.results[0]
    w.node("Expand", [w.tensor(op.args[0], w.dtype(out)), w.shape_tensor(op.args[1])], [out.name])


def _filled_like(fill: int) -> OnnxRule:
    """A tensor of ``fill`` with the shape of the argument."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        d = w.dtype(out)
        shape = w.temp("shape")
        w.node("Shape", [w.tensor(op.args[0])], [shape])
        w.node("ConstantOfShape", [shape], [out.name], value=w.fill_value(fill, d))
    rule.__doc__ = f"ConstantOfShape(Shape(x), {fill})"
    return rule


def _filled(fill: int) -> OnnxRule:
    """A tensor of ``fill`` of the given shape."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        w.node("ConstantOfShape", [w.shape_tensor(op.args[0])], [out.name],
               value=w.fill_value(fill, w.dtype(out)))
    rule.__doc__ = f"ConstantOfShape(shape, {fill})"
    return rule


def _where(w: OnnxWriter, op: Op) -> None:
    """``Where`` on a boolean condition."""
    out = op.results[0]
    d = w.dtype(out)
    w.node("Where", [w.tensor(op.args[0], "bool"), w.tensor(op.args[1], d),
                     w.tensor(op.args[2], d)], [out.name])


def _select(w: OnnxWriter, op: Op) -> None:
    """``switch`` between two computed values: ``Where`` when both have the result's
    type (and neither may be a placeholder), else an ``If`` (shapes may differ)."""
    out = op.results[0]
    d = w.dtype(out)
    c, a, b = op.args
    ta, tb = w.type_of(a), w.type_of(b)
    eager = ta == tb and not any(isinstance(x, Value) and x.maybe_undefined for x in (a, b))
    if eager:
        w.node("Where", [w.tensor(c, "bool"), w.tensor(a, d), w.tensor(b, d)], [out.name])
        return
    branches = []
    for operand, t in ((a, ta), (b, tb)):
        def build(operand: Operand = operand) -> list[str]:
            return [w.tensor(operand, d)]

        branches.append(w.subgraph(build, [_with_dtype(t, d)], "select"))
    w.node("If", [w.tensor(c, "bool")], [out.name], then_branch=branches[0],
           else_branch=branches[1])


def _array(w: OnnxWriter, op: Op) -> None:
    """A tensor from elements computed at run time (constant ones are folded before)."""
    out = op.results[0]
    d = w.dtype(out)
    leaves = operand_leaves(op.args[0])
    one = w.const(np.array([1], dtype=np.int64), "i64")
    pieces = []
    for leaf in leaves:
        piece = w.temp("element")
        w.node("Reshape", [w.tensor(leaf, d), one], [piece])
        pieces.append(piece)
    flat = w.temp("elements")
    w.node("Concat", pieces, [flat], axis=0)
    shape = shape_of_type(out.type)
    if shape is None or not all(isinstance(s, int) for s in shape):
        raise ExportError("array() of values with a shape known only at run time", w.loc)
    w.node("Reshape", [flat, w.const(np.array(shape, dtype=np.int64), "i64")], [out.name])


def _cast(w: OnnxWriter, op: Op) -> None:
    """``Cast`` to the constant dtype (``saturate=0`` to a float8 type: anfir's ``cast``,
    ml_dtypes' conversion, gives inf or NaN past the largest finite value, as that does)."""
    out = op.results[0]
    d = w.dtype(out)
    extra = {"saturate": 0} if d in _FLOAT8 else {}
    w.node("Cast", [w.tensor(op.args[0])], [out.name], to=ONNX_TYPES[d], **extra)


def _cast_like(w: OnnxWriter, op: Op) -> None:
    """``Cast`` to the dtype of the second argument (as :func:`_cast`)."""
    _cast(w, op)


def _size(w: OnnxWriter, op: Op) -> None:
    """``Size``."""
    out = op.results[0]
    w.node("Size", [w.tensor(op.args[0])], [out.name])


def _dim(w: OnnxWriter, op: Op) -> None:
    """One dimension: ``Gather(Shape(x), axis)``."""
    out = op.results[0]
    shape = w.temp("shape")
    w.node("Shape", [w.tensor(op.args[0])], [shape])
    axis = int(w.static(op.args[1]))
    w.node("Gather", [shape, w.const(np.array(axis, dtype=np.int64), "i64")], [out.name], axis=0)


def _sum_to(w: OnnxWriter, op: Op) -> None:
    """``sum_to(g, x)``: ``g`` summed over the broadcast axes (kept), reshaped to ``x``'s shape."""
    out = op.results[0]
    g = w.tensor(op.args[0], w.dtype(out))
    axes = sum_to_plan(w, op)
    if axes is None:
        w.node("Identity", [g], [out.name])
        return
    if axes:
        g = w.op("ReduceSum", g, w.ints(axes), keepdims=1)
    w.node("Reshape", [g, w.op("Shape", w.tensor(op.args[1]))], [out.name])


def _broadcast_like(w: OnnxWriter, op: Op) -> None:
    """``broadcast_like(g, x)``: ``Expand(g, Shape(x))``."""
    out = op.results[0]
    g = w.tensor(op.args[0], w.dtype(out))
    if broadcast_like_needed(w, op):
        w.node("Expand", [g, w.op("Shape", w.tensor(op.args[1]))], [out.name])
    else:
        w.node("Identity", [g], [out.name])


def _tangent_dot(w: OnnxWriter, op: Op) -> None:
    """``sum(a * b)``."""
    out = op.results[0]
    d = w.dtype(out)
    a, b = op.args
    product = w.temp("product")
    w.node("Mul", [w.tensor(a, d), w.tensor(b, d)], [product])
    if shape_of_type(w.type_of(a)) == () and shape_of_type(w.type_of(b)) == ():
        w.node("Identity", [product], [out.name])
    else:
        w.node("ReduceSum", [product], [out.name], keepdims=0)


# -- erf and atan where onnxruntime has no f64 kernel (Cephes' rational approximations) -----------
_ERF_T = (9.60497373987051638749E0, 9.00260197203842689217E1, 2.23200534594684319226E3,
          7.00332514112805075473E3, 5.55923013010394962768E4)
_ERF_U = (3.35617141647503099647E1, 5.21357949780152679795E2, 4.59432382970980127987E3,
          2.26290000613890934246E4, 4.92673942608635921086E4)
_ERFC_P = (2.46196981473530512524E-10, 5.64189564831068821977E-1, 7.46321056442269912687E0,
           4.86371970985681366614E1, 1.96520832956077098242E2, 5.26445194995477358631E2,
           9.34528527171957607540E2, 1.02755188689515710272E3, 5.57535335369399327526E2)
_ERFC_Q = (1.32281951154744992508E1, 8.67072140885989742329E1, 3.54937778887819891062E2,
           9.75708501743205489753E2, 1.82390916687909736289E3, 2.24633760818710981792E3,
           1.65666309194161350182E3, 5.57535340817727675546E2)
_ERFC_R = (5.64189583547755073984E-1, 1.27536670759978104416E0, 5.01905042251180477414E0,
           6.16021097993053585195E0, 7.40974269950448939160E0, 2.97886665372100240670E0)
_ERFC_S = (2.26052863220117276590E0, 9.39603524938001434673E0, 1.20489539808096656605E1,
           1.70814450747565897222E1, 9.60896809063285878198E0, 3.36907645100081516050E0)
_ATAN_P = (-8.750608600031904122785E-1, -1.615753718733365076637E1, -7.500855792314704667340E1,
           -1.228866684490136173410E2, -6.485021904942025371773E1)
_ATAN_Q = (2.485846490142306297962E1, 1.650270098316988542046E2, 4.328810604912902668951E2,
           4.853903996359136964868E2, 1.945506571482613964425E2)
_ATAN_MOREBITS = 6.123233995736765886130E-17
_NATIVE_F64 = False
"""Whether to write Erf/Atan/Asin/Acos natively for f64 too (onnxruntime has no f64 kernel
for them, so f64 uses the rational approximations below, accurate to about 1 ulp)."""


def _polynomial(w: OnnxWriter, x: str, coefficients: Sequence[float], d: str, monic: bool) -> str:
    """Horner's rule; ``monic``: a leading coefficient 1 not listed (Cephes' p1evl)."""
    result = w.op("Add", x, w.const(coefficients[0], d)) if monic else w.const(coefficients[0], d)
    for c in coefficients[1:]:
        result = w.op("Add", w.op("Mul", result, x), w.const(c, d))
    return result


def _erf_of(w: OnnxWriter, x: str, d: str) -> str:
    """erf(x): ONNX Erf, or for f64 Cephes' erf (|x| <= 1) and 1 - erfc (beyond)."""
    if d != "f64" or _NATIVE_F64:
        return w.op("Erf", x)
    z = w.op("Mul", x, x)
    small = w.op("Div", w.op("Mul", x, _polynomial(w, z, _ERF_T, d, False)),
                 _polynomial(w, z, _ERF_U, d, True))
    a = w.op("Min", w.op("Abs", x), w.const(27.0, d))  # erfc(27) underflows: no inf * 0
    e = w.op("Exp", w.op("Neg", w.op("Mul", a, a)))
    mid = w.op("Div", w.op("Mul", e, _polynomial(w, a, _ERFC_P, d, False)),
               _polynomial(w, a, _ERFC_Q, d, True))
    far = w.op("Div", w.op("Mul", e, _polynomial(w, a, _ERFC_R, d, False)),
               _polynomial(w, a, _ERFC_S, d, True))
    erfc = w.op("Where", w.op("Less", a, w.const(8.0, d)), mid, far)
    big = w.op("Mul", w.op("Sign", x), w.op("Sub", w.const(1.0, d), erfc))
    return w.op("Where", w.op("LessOrEqual", w.op("Abs", x), w.const(1.0, d)), small, big)


def _atan_of(w: OnnxWriter, x: str, d: str) -> str:
    """atan(x): ONNX Atan, or for f64 Cephes' atan (reduced to |x| <= 0.66)."""
    if d != "f64" or _NATIVE_F64:
        return w.op("Atan", x)
    a = w.op("Abs", x)
    big = w.op("Greater", a, w.const(2.41421356237309504880, d))
    mid = w.op("And", w.op("Greater", a, w.const(0.66, d)), w.op("Not", big))
    inverse = w.op("Neg", w.op("Div", w.const(1.0, d), a))
    shifted = w.op("Div", w.op("Sub", a, w.const(1.0, d)), w.op("Add", a, w.const(1.0, d)))
    reduced = w.op("Where", big, inverse, w.op("Where", mid, shifted, a))
    base = w.op("Where", big, w.const(math.pi / 2 + _ATAN_MOREBITS, d),
                w.op("Where", mid, w.const(math.pi / 4 + 0.5 * _ATAN_MOREBITS, d), w.const(0.0, d)))
    z = w.op("Mul", reduced, reduced)
    ratio = w.op("Div", w.op("Mul", z, _polynomial(w, z, _ATAN_P, d, False)),
                 _polynomial(w, z, _ATAN_Q, d, True))
    core = w.op("Add", w.op("Mul", reduced, ratio), reduced)
    return w.op("Mul", w.op("Sign", x), w.op("Add", base, core))


def _atan(w: OnnxWriter, x: str, d: str) -> str:
    """atan(x) (see :func:`_atan_of`)."""
    return _atan_of(w, x, d)


def _erf(w: OnnxWriter, x: str, d: str) -> str:
    """erf(x) (see :func:`_erf_of`)."""
    return _erf_of(w, x, d)


def _asin(w: OnnxWriter, x: str, d: str) -> str:
    """asin(x): ONNX Asin, or for f64 ``atan(x / sqrt((1 - x) (1 + x)))``."""
    if d != "f64" or _NATIVE_F64:
        return w.op("Asin", x)
    one = w.const(1.0, d)
    root = w.op("Sqrt", w.op("Mul", w.op("Sub", one, x), w.op("Add", one, x)))
    return _atan_of(w, w.op("Div", x, root), d)


def _acos(w: OnnxWriter, x: str, d: str) -> str:
    """acos(x): ONNX Acos, or for f64 ``2 atan(sqrt((1 - x) / (1 + x)))``."""
    if d != "f64" or _NATIVE_F64:
        return w.op("Acos", x)
    one = w.const(1.0, d)
    root = w.op("Sqrt", w.op("Div", w.op("Sub", one, x), w.op("Add", one, x)))
    return w.op("Mul", w.const(2.0, d), _atan_of(w, root, d))


# -- the operators of anfir/primitives/elementwise.py and reduce.py -----------------------------
def _log1p(w: OnnxWriter, x: str, d: str) -> str:
    """log(1 + x), exact near 0 (Goldberg: ``log(u) * x / (u - 1)`` with ``u = 1 + x``)."""
    u = w.op("Add", x, w.const(1, d))
    um1 = w.op("Sub", u, w.const(1, d))
    ratio = w.op("Div", w.op("Mul", w.op("Log", u), x), um1)
    small = w.op("Where", w.op("Equal", um1, w.const(0, d)), x, ratio)
    return w.op("Where", w.op("IsInf", x), w.op("Log", u), small)


def _expm1(w: OnnxWriter, x: str, d: str) -> str:
    """exp(x) - 1, exact near 0 (Kahan: ``(u - 1) * x / log(u)`` with ``u = exp(x)``)."""
    u = w.op("Exp", x)
    um1 = w.op("Sub", u, w.const(1, d))
    ratio = w.op("Div", w.op("Mul", um1, x), w.op("Log", u))
    general = w.op("Where", w.op("IsInf", u), u, ratio)
    general = w.op("Where", w.op("Equal", um1, w.const(-1, d)), w.const(-1, d), general)
    return w.op("Where", w.op("Equal", u, w.const(1, d)), x, general)


def _float_unary(build: Callable[[OnnxWriter, str, str], str]) -> OnnxRule:
    """A rule computing ``build(writer, x, dtype)`` in the result's dtype."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        d = w.dtype(out)
        w.node("Identity", [build(w, w.tensor(op.args[0], d), d)], [out.name])
    rule.__doc__ = build.__doc__
    return rule


def _tan(w: OnnxWriter, x: str, d: str) -> str:
    """sin(x) / cos(x) (onnxruntime has no f64 Tan)."""
    return w.op("Div", w.op("Sin", x), w.op("Cos", x))


def _sinh(w: OnnxWriter, x: str, d: str) -> str:
    """sinh: ``(e + e / (e + 1)) / 2`` with ``e = expm1(x)`` below |x| = 1, ``(exp(x) - exp(-x)) / 2``
    above (onnxruntime has no f64 Sinh)."""
    e = _expm1(w, x, d)
    small = w.op("Mul", w.const(0.5, d), w.op("Add", e, w.op("Div", e, w.op("Add", e, w.const(1, d)))))
    big = w.op("Mul", w.const(0.5, d), w.op("Sub", w.op("Exp", x), w.op("Exp", w.op("Neg", x))))
    return w.op("Where", w.op("Less", w.op("Abs", x), w.const(1, d)), small, big)


def _cosh(w: OnnxWriter, x: str, d: str) -> str:
    """(exp(x) + exp(-x)) / 2 (onnxruntime has no f64 Cosh)."""
    return w.op("Mul", w.const(0.5, d), w.op("Add", w.op("Exp", x), w.op("Exp", w.op("Neg", x))))


def _extreme(reduce_type: str, elementwise: str) -> OnnxRule:
    """max/min: the reduction over the axis attribute, or with two arguments the elementwise op."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        d = w.dtype(out)
        if len(op.args) == 2:
            w.node(elementwise, [w.tensor(op.args[0], d), w.tensor(op.args[1], d)], [out.name])
            return
        w.reduce(reduce_type, w.tensor(op.args[0], d), op.attrs.get("axis"),
                 bool(op.attrs.get("keepdims")), out.name)
    rule.__doc__ = f"{reduce_type} over the axis attribute, or {elementwise} of two arguments"
    return rule


def _int_safe(w: OnnxWriter, y: str, d: str) -> tuple[str, str]:
    """(y == 0, y with its zeros made 1): integer division by 0 is 0 in numpy, undefined in ONNX."""
    zero = w.op("Equal", y, w.const(0, d))
    return zero, w.op("Where", zero, w.const(1, d), y)


def _division(integers: Callable[[OnnxWriter, str, str], str],
              floats: Callable[[OnnxWriter, str, str, str, str], None], doc: str) -> OnnxRule:
    """A rule of the division family on both operands in the result's dtype: floats by
    ``floats(w, x, y, d, out)``; integers by ``integers(w, x, safe_y)``, a division by 0
    giving 0 (numpy's; ONNX leaves it undefined)."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        d = w.dtype(out)
        x, y = w.tensor(op.args[0], d), w.tensor(op.args[1], d)
        if is_float(d):
            floats(w, x, y, d, out.name)
        else:
            zero, safe = _int_safe(w, y, d)
            w.node("Where", [zero, w.const(0, d), integers(w, x, safe)], [out.name])
    rule.__doc__ = doc
    return rule


def _sign_fixed(w: OnnxWriter, m: str, y: str, d: str) -> str:
    """Where fmod's remainder ``m`` is not 0 and its sign is not ``y``'s: where floor
    division and numpy's mod differ from C's truncation."""
    return w.op("And", w.op("Not", w.op("Equal", m, w.const(0, d))),
                w.op("Xor", w.op("Less", y, w.const(0, d)), w.op("Less", m, w.const(0, d))))


def _floor_div_floats(w: OnnxWriter, x: str, y: str, d: str, out: str) -> None:
    """numpy's floor_divide of floats, as its divmod computes it (x / 0 where y is 0)."""
    m = w.op("Mod", x, y, fmod=1)
    div = w.op("Div", w.op("Sub", x, m), y)
    div = w.op("Where", _sign_fixed(w, m, y, d), w.op("Sub", div, w.const(1, d)), div)
    floor = w.op("Floor", div)
    up = w.op("Greater", w.op("Sub", div, floor), w.const(0.5, d))
    result = w.op("Where", up, w.op("Add", floor, w.const(1, d)), floor)
    w.node("Where", [w.op("Equal", y, w.const(0, d)), w.op("Div", x, y), result], [out])


def _mod_floats(w: OnnxWriter, x: str, y: str, d: str, out: str) -> None:
    """numpy's mod of floats: fmod, plus y where the signs differ."""
    m = w.op("Mod", x, y, fmod=1)
    w.node("Where", [_sign_fixed(w, m, y, d), w.op("Add", m, y), m], [out])


_floor_div = _division(lambda w, x, s: w.op("Div", w.op("Sub", x, w.op("Mod", x, s, fmod=0)), s),
                       _floor_div_floats, "numpy floor_divide: integers through Python's modulo, "
                       "floats as numpy's divmod does")
_mod = _division(lambda w, x, s: w.op("Mod", x, s, fmod=0), _mod_floats,
                 "numpy mod (the sign of y): ONNX Mod for integers, fmod corrected for floats")
_fmod = _division(lambda w, x, s: w.op("Mod", x, s, fmod=1),
                  lambda w, x, y, d, out: w.node("Mod", [x, y], [out], fmod=1),
                  "C fmod (the sign of x): ONNX Mod with fmod=1 (integers by 0 give 0, as numpy)")


def _predicate(op_type: str) -> OnnxRule:
    """IsNaN / IsInf (integers, never nan or inf, are compared as floats)."""
    def rule(w: OnnxWriter, op: Op) -> None:
        have = w.dtype_of_operand(op.args[0])
        w.node(op_type, [w.tensor(op.args[0], have if is_float(have) else "f64")],
               [op.results[0].name])
    rule.__doc__ = f"ONNX {op_type}"
    return rule


def _bitwise(op_type: str, logical_type: str) -> OnnxRule:
    """A bitwise op on integers, the logical one on bools."""
    def rule(w: OnnxWriter, op: Op) -> None:
        d = w.dtype(op.results[0])
        w.node(logical_type if d == "bool" else op_type, [w.tensor(a, d) for a in op.args],
               [op.results[0].name])
    rule.__doc__ = f"ONNX {op_type} ({logical_type} on bools)"
    return rule


_UNSIGNED = {"i8": "u8", "i16": "u16", "i32": "u32", "i64": "u64"}


def _bit_shift(w: OnnxWriter, op: Op) -> None:
    """x << y through the unsigned type of x's width (ONNX BitShift is unsigned); a
    right shift of signed integers is the floor division by 2**y, as numpy's."""
    out = op.results[0]
    d = w.dtype(out)
    x, y = w.tensor(op.args[0], d), w.tensor(op.args[1], d)
    right = op.attrs.get("direction") == "right"
    if right and d in _UNSIGNED:
        power = w.op("Pow", w.const(2, d), y)
        w.node("Div", [w.op("Sub", x, w.op("Mod", x, power, fmod=0)), power], [out.name])
        return
    u = _UNSIGNED.get(d, d)
    shifted = w.op("BitShift", w.cast(x, d, u), w.cast(y, d, u),
                   direction="RIGHT" if right else "LEFT")
    w.node("Cast", [shifted], [out.name], to=ONNX_TYPES[d])


def _arg_extreme(op_type: str) -> OnnxRule:
    """ArgMax / ArgMin: over one axis, or of the flattened x when the axis is None."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        x = w.tensor(op.args[0])
        axis, keep = op.attrs.get("axis", 0), bool(op.attrs.get("keepdims"))
        last = int(bool(op.attrs.get("select_last")))
        if axis is not None:
            w.node(op_type, [x], [out.name], axis=int(axis), keepdims=int(keep),
                   select_last_index=last)
            return
        rank = len(operand_shape(w, op.args[0], op_type))
        index = w.op(op_type, w.op("Reshape", x, w.ints([-1])), axis=0, keepdims=0,
                     select_last_index=last)
        w.node("Reshape", [index, w.ints([1] * rank if keep else [])], [out.name])
    rule.__doc__ = f"ONNX {op_type}"
    return rule


def _cumsum(w: OnnxWriter, op: Op) -> None:
    """ONNX CumSum (its exclusive and reverse are numpy's); no axis: of the flattened x."""
    out = op.results[0]
    x = w.tensor(op.args[0], w.dtype(out))
    if op.attrs.get("axis") is None:
        x = w.op("Reshape", x, w.ints([-1]))  # then axis 0
    axis = w.const(np.array(int(op.attrs.get("axis") or 0), dtype=np.int64), "i64")
    w.node("CumSum", [x, axis], [out.name],
           exclusive=int(bool(op.attrs.get("exclusive"))),
           reverse=int(bool(op.attrs.get("reverse"))))


def _all_any(reduce_type: str) -> OnnxRule:
    """all / any: the minimum / maximum of the truth values (as integers)."""
    def rule(w: OnnxWriter, op: Op) -> None:
        truth = w.cast(w.tensor(op.args[0], "bool"), "bool", "i32")
        reduced = w.reduce(reduce_type, truth, op.attrs.get("axis"), bool(op.attrs.get("keepdims")))
        w.node("Cast", [reduced], [op.results[0].name], to=ONNX_TYPES["bool"])
    rule.__doc__ = f"{reduce_type} of the truth values"
    return rule


# -- neural-network operators -------------------------------------------------------------------
def _softmax(op_type: str) -> OnnxRule:
    """ONNX Softmax / LogSoftmax along the axis attribute."""
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        x = w.tensor(op.args[0], w.dtype(out))
        if not _rank(w, op.args[0], op_type):
            raise ExportError(f"{op_type} of a 0-d tensor", w.loc)
        w.node(op_type, [x], [out.name], axis=int(op.attrs.get("axis", -1)))
    rule.__doc__ = f"ONNX {op_type}"
    return rule


def _einsum(w: OnnxWriter, op: Op) -> None:
    """ONNX Einsum with the constant spec."""
    out = op.results[0]
    d = w.dtype(out)
    spec = w.static(op.args[0])
    w.node("Einsum", [w.tensor(a, d) for a in op.args[1:]], [out.name],
           equation=str(spec).replace(" ", ""))


def _einsum_ones(w: OnnxWriter, op: Op) -> None:
    """Ones of x's shape, or a 0-d one, as the gradient spec needs."""
    out = op.results[0]
    d = w.dtype(out)
    grad = nn.einsum_grad_spec.impl(w.static(op.args[0]), int(w.static(op.args[1])))
    if grad.split("->")[0].split(",")[-1]:
        w.node("ConstantOfShape", [w.op("Shape", w.tensor(op.args[2]))], [out.name],
               value=w.fill_value(1, d))
    else:
        w.node("Identity", [w.const(1, d)], [out.name])

# -- convolution, pooling, batch norm -------------------------------------------------------
def _rank(w: OnnxWriter, operand: Operand, what: str) -> int:
    """The rank of a tensor operand (its dimensions may be symbolic)."""
    shape = shape_of_type(w.type_of(operand))
    if shape is None:
        raise ExportError(f"{what} needs tensors of known rank", w.loc)
    return len(shape)


def _conv_attrs(w: OnnxWriter, op: Op, n: int) -> dict[str, Any]:
    """Conv's strides, dilations, group and pads (or auto_pad for "same"/"valid")."""
    a = op.attrs
    attrs: dict[str, Any] = {
        "strides": list(conv.per_axis_ints(a.get("stride", 1), n, "stride", "conv")),
        "dilations": list(conv.per_axis_ints(a.get("dilation", 1), n, "dilation", "conv")),
        "group": int(a.get("groups", 1))}
    padding = a.get("padding", 0)
    if padding == "same":
        attrs["auto_pad"] = "SAME_UPPER"  # begins get the smaller half, as the op library
    elif padding == "valid":
        attrs["pads"] = [0] * (2 * n)
    else:
        attrs["pads"] = [int(p) for p in conv.padding_attr(padding, n, "conv", strings=False) or ()]
    return attrs


def _bias_operand(op: Op) -> Optional[Operand]:
    if len(op.args) > 2 and not (isinstance(op.args[2], Const) and op.args[2].value is None):
        return op.args[2]
    return None


def _conv(w: OnnxWriter, op: Op) -> None:
    """Conv (conv and conv_core: the attributes map one to one)."""
    out = op.results[0]
    d = w.dtype(out)
    n = _rank(w, op.args[1], "conv") - 2
    inputs = [w.tensor(op.args[0], d), w.tensor(op.args[1], d)]
    bias = _bias_operand(op) if op.prim is conv.conv else None
    if bias is not None:
        inputs.append(w.tensor(bias, d))
    w.node("Conv", inputs, [out.name], **_conv_attrs(w, op, n))


def _conv_transpose(w: OnnxWriter, op: Op) -> None:
    """ConvTranspose with PyTorch's attributes (ONNX's definition is the same)."""
    out = op.results[0]
    d = w.dtype(out)
    n = _rank(w, op.args[1], "conv_transpose") - 2
    a = op.attrs
    inputs = [w.tensor(op.args[0], d), w.tensor(op.args[1], d)]
    bias = _bias_operand(op)
    if bias is not None:
        inputs.append(w.tensor(bias, d))
    w.node("ConvTranspose", inputs, [out.name],
           strides=list(conv.per_axis_ints(a.get("stride", 1), n, "stride", "conv_transpose")),
           dilations=list(conv.per_axis_ints(a.get("dilation", 1), n, "dilation", "conv_transpose")),
           output_padding=list(conv.per_axis_ints(a.get("output_padding", 0), n, "output_padding",
                                        "conv_transpose", least=0)),
           pads=[int(p) for p in conv.padding_attr(a.get("padding", 0), n, "conv_transpose",
                                          strings=False) or ()],
           group=int(a.get("groups", 1)))


def _conv_input_grad(w: OnnxWriter, op: Op) -> None:
    """ConvTranspose of dout, its output_padding chosen so the result has x's shape."""
    out = op.results[0]
    d = w.dtype(out)
    dout_shape = conv_geometry(w, op.args[0], "conv's input gradient", "ONNX")
    w_shape = static_shape(w, op.args[1], "conv's input gradient", "ONNX")
    x_shape = conv_geometry(w, op.args[2], "conv's input gradient", "ONNX")
    n, st, pads, dil, g = conv_params_of(w, op, op.args[2], op.args[1], "ONNX")
    extra = [i - ((o - 1) * s - pads[k] - pads[n + k] + dl * (kk - 1) + 1)
             for k, (i, o, s, dl, kk) in enumerate(zip(x_shape[2:], dout_shape[2:], st, dil,
                                                        w_shape[2:]))]
    w.node("ConvTranspose", [w.tensor(op.args[0], d), w.tensor(op.args[1], d)], [out.name],
           strides=list(st), dilations=list(dil), pads=list(pads), output_padding=extra, group=g)


def _pool_attrs(op: Op, n: int, dilation: bool) -> dict[str, Any]:
    a = op.attrs
    kernel = conv.per_axis_ints(a.get("kernel"), n, "kernel", op.prim.name)
    stride = a.get("stride")
    attrs: dict[str, Any] = {
        "kernel_shape": list(kernel),
        "strides": list(kernel if stride is None else conv.per_axis_ints(stride, n, "stride", op.prim.name)),
        "pads": [int(p) for p in conv.padding_attr(a.get("padding", 0), n, op.prim.name, strings=False) or ()],
        "ceil_mode": int(bool(a.get("ceil_mode", False)))}
    if dilation:
        attrs["dilations"] = list(conv.per_axis_ints(a.get("dilation", 1), n, "dilation", op.prim.name))
    return attrs


def _pool_rank(w: OnnxWriter, op: Op) -> int:
    kernel = op.attrs.get("kernel")
    return len(kernel) if isinstance(kernel, tuple) else _rank(w, op.args[0], op.prim.name) - 2


def _max_pool(w: OnnxWriter, op: Op) -> None:
    """MaxPool (kernel_shape, strides, pads, dilations, ceil_mode)."""
    out = op.results[0]
    w.node("MaxPool", [w.tensor(op.args[0], w.dtype(out))], [out.name],
           **_pool_attrs(op, _pool_rank(w, op), True))


def _avg_pool(w: OnnxWriter, op: Op) -> None:
    """AveragePool (count_include_pad as asked)."""
    out = op.results[0]
    w.node("AveragePool", [w.tensor(op.args[0], w.dtype(out))], [out.name],
           count_include_pad=int(bool(op.attrs.get("count_include_pad", True))),
           **_pool_attrs(op, _pool_rank(w, op), False))


def _global_pool(op_type: str) -> OnnxRule:
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        w.node(op_type, [w.tensor(op.args[0], w.dtype(out))], [out.name])
    rule.__doc__ = op_type
    return rule


def _batch_norm(w: OnnxWriter, op: Op) -> None:
    """BatchNormalization in inference mode (running statistics)."""
    out = op.results[0]
    d = w.dtype(out)
    w.node("BatchNormalization", [w.tensor(a, d) for a in op.args], [out.name],
           epsilon=float(op.attrs.get("eps", 1e-5)))


def _conv_weight_grad(w: OnnxWriter, op: Op) -> None:
    """A Conv with the roles swapped: the batch axis is the contraction, so x with N and C
    exchanged is convolved by dout (likewise) with stride and dilation exchanged
    (dw[o, c, k] = sum over n, p of dout[n, o, p] * x[n, c, p*stride + k*dilation]); the
    extra kernel positions past the weight's are sliced off.  Groups become a grouped Conv
    whose input channels are (group, batch)."""
    out = op.results[0]
    d = w.dtype(out)
    x_shape = conv_geometry(w, op.args[0], "conv's weight gradient", "ONNX")
    dout_shape = conv_geometry(w, op.args[1], "conv's weight gradient", "ONNX")
    w_shape = static_shape(w, op.args[2], "conv's weight gradient", "ONNX")
    n, st, pads, dil, g = conv_params_of(w, op, op.args[0], op.args[2], "ONNX")
    spatial = list(range(2, 2 + n))
    x = w.tensor(op.args[0], d)
    if g == 1:
        xt = w.op("Transpose", x, perm=[1, 0, *spatial])                    # (C, N, S...)
    else:
        cin = x_shape[1] // g
        # (0 copies the batch, -1 is g times it: it may be symbolic)
        grouped = w.op("Reshape", x, w.ints([0, g, cin, *x_shape[2:]]))
        xt = w.op("Reshape", w.op("Transpose", grouped, perm=[2, 1, 0, *range(3, 3 + n)]),
                  w.ints([cin, -1, *x_shape[2:]]))                         # (C/g, g*N, S...)
    dt = w.op("Transpose", w.tensor(op.args[1], d), perm=[1, 0, *spatial])  # (O, N, P...)
    full = w.op("Conv", xt, dt, strides=list(dil), dilations=list(st), pads=list(pads), group=g)
    # The Conv's kernel positions: (S + pads - stride*(P - 1) - 1) // dilation + 1 >= K.
    reach = [(i + pads[k] + pads[n + k] - s * (p - 1) - 1) // dl + 1 for k, (i, p, s, dl)
             in enumerate(zip(x_shape[2:], dout_shape[2:], st, dil))]
    if list(reach) != list(w_shape[2:]):
        full = w.op("Slice", full, w.ints([0] * n), w.ints(list(w_shape[2:])), w.ints(spatial))
    w.node("Transpose", [full], [out.name], perm=[1, 0, *spatial])


def _max_pool_indices(w: OnnxWriter, op: Op, d: str) -> str:
    """The flat index (into all of x, row-major) of each window's maximum: MaxPool's
    second output."""
    values, indices = w.temp("maxpool"), w.temp("argmax")
    w.node("MaxPool", [w.tensor(op.args[0], d)], [values, indices],
           **_pool_attrs(op, _pool_rank(w, op), True))
    return indices


def _max_pool_grad(w: OnnxWriter, op: Op) -> None:
    """dout scattered (ScatterElements, adding) to the flat indices of the windows'
    maxima that MaxPool gives, into zeros of x's size, reshaped to x's shape."""
    out = op.results[0]
    d = w.dtype(out)
    indices = _max_pool_indices(w, op, d)
    x = w.tensor(op.args[0], d)
    flat_zeros = w.op("ConstantOfShape", w.op("Reshape", w.op("Size", x), w.ints([1])),
                      value=w.fill_value(0, d))
    flat = w.op("ScatterElements", flat_zeros, w.op("Reshape", indices, w.ints([-1])),
                w.op("Reshape", w.tensor(op.args[1], d), w.ints([-1])), axis=0, reduction="add")
    w.node("Reshape", [flat, w.op("Shape", x)], [out.name])


def _max_pool_select(w: OnnxWriter, op: Op) -> None:
    """g (flattened) gathered at the flat indices of x's windows' maxima (MaxPool's)."""
    out = op.results[0]
    d = w.dtype(out)
    indices = _max_pool_indices(w, op, d)
    flat_g = w.op("Reshape", w.tensor(op.args[1], d), w.ints([-1]))
    w.node("Gather", [flat_g, indices], [out.name], axis=0)


def _avg_pool_grad(w: OnnxWriter, op: Op) -> None:
    """dout divided by each window's count (a constant: the shapes are known), spread over
    its window by a ConvTranspose with a kernel of ones per channel, zero-padded at the
    end to x's size (the cells no window reads)."""
    out = op.results[0]
    d = w.dtype(out)
    x_shape = conv_geometry(w, op.args[1], "average pooling's gradient", "ONNX")
    a = op.attrs
    kernel, stride, padding, ceil = a.get("kernel"), a.get("stride"), a.get("padding", 0), \
        a.get("ceil_mode", False)
    shaped = zero_array(x_shape)
    n, k, st, pads, _, sizes = conv.pool_params(shaped, kernel, stride, padding, 1, ceil, "avg_pool")
    include = bool(a.get("count_include_pad", True))
    given = [int(p) for p in conv.padding_attr(padding, n, "avg_pool", strings=False) or ()]
    divisor = conv.avg_divisor(x_shape, n, k, st, pads, given, sizes, include)
    scaled = w.op("Div", w.tensor(op.args[0], d), w.const(divisor, d))
    # Each (image, channel) plane on its own: one input channel, one output channel
    # (ONNX's reference ConvTranspose has no groups).
    planes = w.op("Reshape", scaled, w.ints([-1, 1, *sizes]))
    # The windows reach (o - 1) * s + k padded cells: the begin padding is cropped, then
    # whatever lies past x's end (end padding) is cropped, or x's cells past the last
    # window (never read) are zeros padded on.
    reach = [(o - 1) * s + kk - pads[j] for j, (o, s, kk) in enumerate(zip(sizes, st, k))]
    ends = [max(r - i, 0) for r, i in zip(reach, x_shape[2:])]
    extra = [max(i - r, 0) for r, i in zip(reach, x_shape[2:])]
    spread = w.op("ConvTranspose", planes, w.const(np.ones((1, 1, *k)), d), strides=list(st),
                  pads=[*pads[:n], *ends])
    if any(extra):
        spread = w.op("Pad", spread, w.ints([0] * (n + 2) + [0, 0, *extra]))
    w.node("Reshape", [spread, w.op("Shape", w.tensor(op.args[1]))], [out.name])


def _conv_family_rules() -> dict[Primitive, OnnxRule]:
    return {conv.conv: _conv, conv.conv_core: _conv, conv.conv_transpose: _conv_transpose,
            conv.conv_input_grad: _conv_input_grad, conv.conv_weight_grad: _conv_weight_grad,
            conv.max_pool: _max_pool, conv.max_pool_grad: _max_pool_grad,
            conv.max_pool_select: _max_pool_select, conv.avg_pool: _avg_pool,
            conv.avg_pool_grad: _avg_pool_grad,
            conv.global_avg_pool: _global_pool("GlobalAveragePool"),
            conv.global_max_pool: _global_pool("GlobalMaxPool"), conv.batch_norm: _batch_norm}


RULES: dict[Primitive, OnnxRule] = {
    arith.add: binary("Add"),
    arith.sub: binary("Sub"),
    arith.mul: binary("Mul"),
    arith.div: binary("Div"),
    arith.neg: unary("Neg"),
    arith.pow_: binary("Pow"),
    arith.exp: unary("Exp"),
    arith.log: unary("Log"),
    arith.sin: unary("Sin"),
    arith.cos: unary("Cos"),
    arith.tanh: unary("Tanh"),
    arith.sqrt: unary("Sqrt"),
    arith.abs_: unary("Abs"),
    arith.sign: unary("Sign"),
    arith.maximum: binary("Max"),
    arith.minimum: binary("Min"),
    arith.sigmoid: unary("Sigmoid"),
    arith.relu: _relu,
    arith.lt: compare("Less"),
    arith.le: compare("LessOrEqual"),
    arith.gt: compare("Greater"),
    arith.ge: compare("GreaterOrEqual"),
    arith.eq: compare("Equal"),
    arith.ne: compare("Equal", negate=True),
    arith.logical_and: logical("And"),
    arith.logical_or: logical("Or"),
    arith.logical_not: logical("Not"),
    tensor.matmul: _matmul,
    tensor.transpose: _transpose,
    tensor.reshape: _reshape,
    tensor.sum_: _reduce("ReduceSum"),
    tensor.mean: _reduce("ReduceMean"),
    tensor.broadcast_to: _broadcast_to,
    tensor.ones_like: _filled_like(1),
    tensor.zeros: _filled(0),
    tensor.ones: _filled(1),
    tensor.where: _where,
    tensor.array: _array,
    tensor.cast: _cast,
    structure.switch: _select,
    structure.zeros_like: _filled_like(0),
    gradient.gadd: binary("Add"),
    gradient.sum_to: _sum_to,
    gradient.broadcast_like: _broadcast_like,
    gradient.size: _size,
    gradient.cast_like: _cast_like,
    gradient.tangent_dot: _tangent_dot,
    elementwise.erf: _float_unary(_erf),
    elementwise.expm1: _float_unary(_expm1),
    elementwise.log1p: _float_unary(_log1p),
    elementwise.floor: unary("Floor"),
    elementwise.ceil: unary("Ceil"),
    elementwise.round_: unary("Round"),
    elementwise.reciprocal: unary("Reciprocal"),
    elementwise.rsqrt: _float_unary(lambda w, x, d: w.op("Reciprocal", w.op("Sqrt", x))),
    elementwise.square: _float_unary(lambda w, x, d: w.op("Mul", x, x)),
    elementwise.tan: _float_unary(_tan),
    elementwise.atan: _float_unary(_atan),
    elementwise.sinh: _float_unary(_sinh),
    elementwise.cosh: _float_unary(_cosh),
    elementwise.asin: _float_unary(_asin),
    elementwise.acos: _float_unary(_acos),
    elementwise.floor_div: _floor_div,
    elementwise.mod: _mod,
    elementwise.fmod: _fmod,
    elementwise.isnan: _predicate("IsNaN"),
    elementwise.isinf: _predicate("IsInf"),
    elementwise.logical_xor: logical("Xor"),
    elementwise.bitwise_and: _bitwise("BitwiseAnd", "And"),
    elementwise.bitwise_or: _bitwise("BitwiseOr", "Or"),
    elementwise.bitwise_xor: _bitwise("BitwiseXor", "Xor"),
    elementwise.bitwise_not: _bitwise("BitwiseNot", "Not"),
    elementwise.bit_shift: _bit_shift,
    reduce.max_: _extreme("ReduceMax", "Max"),
    reduce.min_: _extreme("ReduceMin", "Min"),
    reduce.prod: _reduce("ReduceProd"),
    reduce.all_: _all_any("ReduceMin"),
    reduce.any_: _all_any("ReduceMax"),
    reduce.argmax: _arg_extreme("ArgMax"),
    reduce.argmin: _arg_extreme("ArgMin"),
    reduce.cumsum: _cumsum,
    nn.softmax: _softmax("Softmax"),
    nn.log_softmax: _softmax("LogSoftmax"),
    nn.einsum: _einsum,
    nn.einsum_ones: _einsum_ones,
    DIM: _dim,
    **_conv_family_rules(),
}
"""Primitive object → the rule writing its ONNX nodes.  A primitive the walker
takes apart itself (``make_tuple``, ``env_getitem``...) needs none
(:data:`anfir.flat.flatten.WALKER_ONLY`)."""

RULES.update(SHAPING_RULES)

UNSUPPORTED: dict[Primitive, str] = {
    **one_device_reasons("ONNX"),
    **UNSUPPORTED_SHAPING,
    **{prim: "ONNX has no complex element types in its operators (complex64/128 are "
             "storage types only: no Real, Imag or Complex operator)"
       for prim in (complexes.complex_, complexes.real, complexes.imag, complexes.conj)},
    nn.einsum_grad_spec: "it computes a string from constants, which constant folding does "
                         "before export; ONNX has no string-valued equation input",
}
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
            declared = _with_dtype(t, d)
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


def _with_dtype(t: AbstractValue, dtype: str) -> AbstractValue:
    """``t``'s shape with element type ``dtype``."""
    if dtype == "str":
        return AString()
    if isinstance(t, ATensor):
        return ATensor(dtype, t.shape)
    return AScalar(dtype)


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
    "EXTRA", "OPSET", "OnnxRule", "OnnxWriter", "RULES", "UNSUPPORTED", "binary", "compare",
    "export_onnx", "logical", "model_from_graph", "nest_outputs", "onnx_inputs", "require_onnx",
    "unary",
]

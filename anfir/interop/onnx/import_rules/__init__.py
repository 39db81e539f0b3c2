"""The ONNX import rules: one entry per ONNX op type, over anfir's operator library.

:data:`OPS` maps ``(domain, op_type)`` to ``[(since_version, rule), ...]``: the
rule used for a node is the last whose ``since_version`` is at most the
model's opset of that domain (a rule may also read ``ctx.opset`` for details
that changed between versions, such as axes moving from an attribute to an
input).  A rule takes a :class:`~anfir.interop.onnx.importer.Ctx` and returns
the nodes of the ONNX node's outputs.  Rules hold the primitive objects of
:mod:`anfir.primitives` (``arith.add``, ``nn.softmax``...), never their names:
a misspelt or missing primitive is an import error of this module, which mypy
sees, not an error of the first model that uses the op.

An op with no rule here whose ONNX schema is a function (``Gelu`` before it had
a rule, ``Celu``, ``Range``...) is expanded through that function body by
:mod:`anfir.interop.onnx.importer`.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable, Optional, Sequence

import numpy as np

from anfir.dtypes import (
    BY_NAME,
    dtype_name,
    float_max,
    int_range,
    is_float,
    is_integer,
    numpy_dtype,
)
from anfir.interop.onnx.common import (
    DTYPE_OF_ELEM,
    Ctx,
    NeedsValue,
    NodeError,
    OpRule,
    TypeInfo,
    UseFunctionBody,
)
from anfir.interop import attributes
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.primitives import arith, conv, elementwise, gradient, indexing, nn, reduce, shaping, structure, tensor

OPS: dict[tuple[str, str], list[tuple[int, OpRule]]] = {}
"""``(domain, op_type)`` → ``[(since_version, rule)]``, oldest first."""


def op(op_type: str, since: int = 1, domain: str = "") -> Callable[[OpRule], OpRule]:
    """Register a rule for ``op_type`` from opset ``since`` on."""
    def register(rule: OpRule) -> OpRule:
        OPS.setdefault((domain, op_type), []).append((since, rule))
        OPS[(domain, op_type)].sort(key=lambda pair: pair[0])
        return rule
    return register


# -- elementwise -------------------------------------------------------------------------------
def _unary(prim: Primitive) -> OpRule:
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        return [ctx.call(prim, ctx.need(0))]
    return rule


for _onnx, _anfir in {
    "Abs": arith.abs_, "Neg": arith.neg, "Exp": arith.exp, "Log": arith.log, "Sqrt": arith.sqrt, "Sin": arith.sin,
    "Cos": arith.cos, "Tan": elementwise.tan, "Tanh": arith.tanh, "Sinh": elementwise.sinh, "Cosh": elementwise.cosh, "Asin": elementwise.asin,
    "Acos": elementwise.acos, "Atan": elementwise.atan, "Sigmoid": arith.sigmoid, "Relu": arith.relu, "Floor": elementwise.floor,
    "Ceil": elementwise.ceil, "Round": elementwise.round_, "Reciprocal": elementwise.reciprocal, "Erf": elementwise.erf, "Sign": arith.sign,
    "IsNaN": elementwise.isnan, "Softplus": arith.softplus, "Softsign": elementwise.softsign, "Not": arith.logical_not,
    "HardSwish": elementwise.hard_swish, "Mish": elementwise.mish, "BitwiseNot": elementwise.bitwise_not, "Identity": structure.identity,
}.items():
    op(_onnx)(_unary(_anfir))


def _variadic(prim: Primitive) -> OpRule:
    # Sum, Max, Min of any number of inputs: a left fold of the binary operator.
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        args = [a for a in ctx.inputs() if a is not None]
        if not args:
            raise NodeError("needs at least one input")
        acc = args[0]
        for a in args[1:]:
            acc = ctx.call(prim, acc, a)
        if len(args) == 1:
            acc = ctx.call(structure.identity, acc)
        return [acc]
    return rule


def _binary(prim: Primitive) -> OpRule:
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        return [ctx.call(prim, ctx.need(0), ctx.need(1))]
    return rule


for _onnx, _anfir in {
    "Add": arith.add, "Sub": arith.sub, "Mul": arith.mul, "Equal": arith.eq, "Less": arith.lt, "LessOrEqual": arith.le,
    "Greater": arith.gt, "GreaterOrEqual": arith.ge, "And": arith.logical_and, "Or": arith.logical_or,
    "Xor": elementwise.logical_xor, "BitwiseAnd": elementwise.bitwise_and, "BitwiseOr": elementwise.bitwise_or,
    "BitwiseXor": elementwise.bitwise_xor,
}.items():
    op(_onnx)(_binary(_anfir))

op("Sum")(_variadic(arith.add))
op("Max")(_variadic(arith.maximum))
op("Min")(_variadic(arith.minimum))


@op("Mean")
def _mean(ctx: Ctx) -> Sequence[Optional[Node]]:
    args = [a for a in ctx.inputs() if a is not None]
    total = _variadic(arith.add)(ctx)[0]
    return [ctx.call(arith.div, total, ctx.const(len(args), ctx.dtype(0)))]


@op("Div")
def _div(ctx: Ctx) -> Sequence[Optional[Node]]:
    x, y = ctx.need(0), ctx.need(1)
    d = ctx.dtype(0)
    if is_float(d):
        return [ctx.call(arith.div, x, y)]
    # ONNX divides integers toward zero; floor division corrected where the
    # signs differ and the division is inexact.
    q = ctx.call(elementwise.floor_div, x, y)
    r = ctx.call(elementwise.mod, x, y)
    zero = ctx.const(0, d)
    inexact = ctx.call(arith.ne, r, zero)
    differ = ctx.call(arith.ne, ctx.call(arith.lt, x, zero), ctx.call(arith.lt, y, zero))
    fix = ctx.call(arith.logical_and, inexact, differ)
    return [ctx.call(tensor.where, fix, ctx.call(arith.add, q, ctx.const(1, d)), q)]


@op("Pow")
def _pow(ctx: Ctx) -> Sequence[Optional[Node]]:
    d = ctx.dtype(0)
    y = ctx.need(1)
    if ctx.dtype(1) != d:
        y = ctx.call(tensor.cast, y, d)
    return [ctx.call(arith.pow_, ctx.need(0), y)]


@op("Mod")
def _mod(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(elementwise.fmod if ctx.attr("fmod", 0) else elementwise.mod, ctx.need(0), ctx.need(1))]


@op("BitShift")
def _bit_shift(ctx: Ctx) -> Sequence[Optional[Node]]:
    direction = ctx.attr("direction", "LEFT").lower()
    return [ctx.call(elementwise.bit_shift, ctx.need(0), ctx.need(1), direction=direction)]


@op("IsInf")
def _isinf(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    inf = ctx.call(elementwise.isinf, x)
    if pos and neg:
        return [inf]
    zero = ctx.const(0, ctx.dtype(0))
    side = ctx.call(arith.gt if pos else arith.lt, x, zero)
    if not pos and not neg:
        return [ctx.call(arith.logical_and, inf, ctx.call(arith.logical_not, inf))]
    return [ctx.call(arith.logical_and, inf, side)]


@op("Where")
def _where(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(tensor.where, ctx.need(0), ctx.need(1), ctx.need(2))]


@op("PRelu")
def _prelu(ctx: Ctx) -> Sequence[Optional[Node]]:
    x, slope = ctx.need(0), ctx.need(1)
    neg = ctx.call(arith.lt, x, ctx.const(0, ctx.dtype(0)))
    return [ctx.call(tensor.where, neg, ctx.call(arith.mul, x, slope), x)]


@op("LeakyRelu")
def _leaky_relu(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(elementwise.leaky_relu, ctx.need(0), alpha=float(ctx.attr("alpha", 0.01)))]


@op("Elu")
def _elu(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(elementwise.elu, ctx.need(0), alpha=float(ctx.attr("alpha", 1.0)))]


@op("HardSigmoid")
def _hard_sigmoid(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(elementwise.hard_sigmoid, ctx.need(0), alpha=float(ctx.attr("alpha", 0.2)),
                     beta=float(ctx.attr("beta", 0.5)))]


@op("Gelu", 20)
def _gelu(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(elementwise.gelu, ctx.need(0), approximate=ctx.attr("approximate", "none"))]


_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214813232421875


@op("Selu")
def _selu(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    alpha, gamma = float(ctx.attr("alpha", _SELU_ALPHA)), float(ctx.attr("gamma", _SELU_GAMMA))
    d = ctx.dtype(0)
    if np.float32(alpha) == np.float32(_SELU_ALPHA) and np.float32(gamma) == np.float32(_SELU_GAMMA):
        return [ctx.call(elementwise.selu, x)]
    # gamma * (x if x > 0 else alpha * (exp(x) - 1))
    neg = ctx.call(arith.mul, ctx.const(alpha, d), ctx.call(elementwise.expm1, x))
    pos = ctx.call(arith.gt, x, ctx.const(0, d))
    return [ctx.call(arith.mul, ctx.const(gamma, d), ctx.call(tensor.where, pos, x, neg))]


@op("Clip")
def _clip(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    d = ctx.dtype(0)
    if ctx.opset < 11:
        lo, hi = ctx.attr("min"), ctx.attr("max")
        lo_node: Optional[Node] = None if lo is None else ctx.const(lo, d)
        hi_node: Optional[Node] = None if hi is None else ctx.const(hi, d)
    else:
        lo_node, hi_node = ctx.input(1), ctx.input(2)
    out = x
    if lo_node is not None:
        out = ctx.call(arith.maximum, out, lo_node)
    if hi_node is not None:
        out = ctx.call(arith.minimum, out, hi_node)
    if out is x:
        out = ctx.call(structure.identity, x)
    return [out]


# -- types ---------------------------------------------------------------------------------------
@op("Cast")
def _cast(ctx: Ctx) -> Sequence[Optional[Node]]:
    to = ctx.attr("to")
    if isinstance(to, str):  # opset 6 spelled the type's name
        raise NodeError(f"Cast to {to!r}: a type name (opset 6)")
    if to not in DTYPE_OF_ELEM:
        raise NodeError(f"Cast to element type {to}, which anfir has no dtype for")
    return [_onnx_cast(ctx, DTYPE_OF_ELEM[to])]


@op("CastLike")
def _cast_like(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [_onnx_cast(ctx, ctx.dtype(1))]


SATURATING = ("f8e4m3fn", "f8e4m3fnuz", "f8e5m2", "f8e5m2fnuz")
"""The types ONNX's ``saturate`` attribute of Cast applies to."""


def _onnx_cast(ctx: Ctx, to: str) -> Node:
    """Input 0 converted to ``to`` as ONNX's Cast/CastLike does: anfir's ``cast``
    (numpy's conversion, ml_dtypes' for the narrow types), except where ONNX differs —
    a float8 target saturates by default, and FLOAT8E8M0 rounds by ``round_mode``."""
    x = ctx.need(0)
    src = ctx.dtype(0)
    saturate = bool(ctx.attr("saturate", 1))
    if to in SATURATING and saturate and src != to:
        x = _saturated(ctx, x, src, to)
    elif to == "f8e8m0" and src != to:
        mode = ctx.attr("round_mode", "up")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        if mode not in ("up", "down", "nearest"):
            raise NodeError(f"Cast with round_mode {mode!r} (ONNX has up, down and nearest)")
        return _to_e8m0(ctx, x, saturate, mode)
    return ctx.call(tensor.cast, x, to)


def _saturated(ctx: Ctx, x: Node, src: str, to: str) -> Node:
    """``x`` clipped to ``to``'s finite range, as onnx.reference's saturating cast does
    before converting: ±inf and values beyond the range become ±the largest finite
    value (ml_dtypes' conversion would give inf or NaN); NaN stays NaN."""
    top = float_max(numpy_dtype(to))
    if is_float(src):
        if float_max(numpy_dtype(src)) <= top:
            return x  # nothing of src's is out of range, and ±inf only exists beyond it
        bound: Any = top
    elif is_integer(src):
        low, high = int_range(numpy_dtype(src))
        if -top <= low and high <= top:
            return x
        bound = int(top)
    else:
        return x  # bool: 0 and 1
    out = ctx.call(arith.minimum, x, ctx.const(bound, src))
    return ctx.call(arith.maximum, out, ctx.const(-bound, src))


def _to_e8m0(ctx: Ctx, x: Node, saturate: bool, mode: str) -> Node:
    """FLOAT8E8M0 (a power of two, 2**-127 … 2**127, or NaN) of ``x`` as ONNX's reference
    makes it from the f32 value's exponent field: the sign is dropped, 0 is 2**-127,
    the rounding is ``up`` (any fraction raises the exponent), ``down`` or ``nearest``
    (a mantissa of at least 1.5 rounds up), inf and NaN give NaN, and an exponent past
    127 is 127 when saturating, else NaN.  Computed in f64, where 2**e is exact."""
    def c(v: float) -> Node:
        return ctx.const(v, "f64")

    def call(prim: Primitive, *args: Any) -> Node:
        return ctx.call(prim, *args)

    a = call(arith.abs_, call(tensor.cast, call(tensor.cast, x, "f32"), "f64"))
    smallest_normal = 2.0 ** -126
    safe = call(arith.maximum, a, c(smallest_normal))
    # floor(log2(a)) exactly: the estimate from log is off by at most one either way.
    e = call(elementwise.floor, call(arith.div, call(arith.log, safe), c(float(np.log(2.0)))))
    e = call(tensor.where, call(arith.gt, call(arith.pow_, c(2.0), e), safe), call(arith.sub, e, c(1.0)), e)
    e = call(tensor.where, call(arith.le, call(arith.pow_, c(2.0), call(arith.add, e, c(1.0))), safe),
             call(arith.add, e, c(1.0)), e)
    power = call(arith.pow_, c(2.0), e)
    if mode == "up":
        e = call(tensor.where, call(arith.gt, safe, power), call(arith.add, e, c(1.0)), e)
        below = c(-126.0)  # an f32 subnormal's exponent field 0 plus its fraction
    elif mode == "nearest":
        e = call(tensor.where, call(arith.ge, safe, call(arith.mul, power, c(1.5))), call(arith.add, e, c(1.0)), e)
        below = call(tensor.where, call(arith.gt, a, c(2.0 ** -127)), c(-126.0), c(-127.0))
    else:
        below = c(-127.0)
    e = call(tensor.where, call(arith.lt, a, c(smallest_normal)), below, e)
    e = call(tensor.where, call(arith.eq, a, c(0.0)), c(-127.0), e)
    nan = c(float("nan"))
    e = call(arith.minimum, e, c(127.0)) if saturate else call(tensor.where, call(arith.gt, e, c(127.0)), nan, e)
    e = call(tensor.where, call(elementwise.isinf, a), nan, e)  # NaN propagates through the rest
    return call(tensor.cast, call(arith.pow_, c(2.0), e), "f8e8m0")


# -- constants -------------------------------------------------------------------------------
@op("Constant")
def _constant(ctx: Ctx) -> Sequence[Optional[Node]]:
    for name, dtype in (("value", None), ("value_float", "f32"), ("value_floats", "f32"),
                        ("value_int", "i64"), ("value_ints", "i64")):
        value = ctx.attr(name)
        if value is not None:
            return [ctx.const(value, dtype)]
    if "value_string" in ctx.attrs or "value_strings" in ctx.attrs:
        raise NodeError("string tensors are not anfir tensors")
    raise NodeError("a Constant with a sparse value (anfir has no sparse tensors)")


def computed_shape(ctx: Ctx, index: int) -> Optional[Node]:
    """A shape computed at run time (input ``index``, a 1-D i64 tensor of known length)
    as a tuple of numbers, which anfir's shape arguments take; None when the input is
    a constant or its length is unknown."""
    node = ctx.input(index)
    if node is None or isinstance(node, ValueNode):
        return None
    length = ctx.type_of(index).static_shape
    if length is None or len(length) != 1:
        return None
    items = [_scalar(ctx, ctx.call(indexing.gather, node, ctx.const(k, "i64"), axis=0))
             for k in range(length[0])]
    return ctx.call(structure.make_tuple, *items)


@op("ConstantOfShape")
def _constant_of_shape(ctx: Ctx) -> Sequence[Optional[Node]]:
    value = ctx.attr("value")
    fill = np.zeros((), np.float32) if value is None else np.asarray(value).reshape(())
    dynamic = computed_shape(ctx, 0)
    if dynamic is not None:
        return [ctx.call(indexing.full, dynamic, ctx.const(fill), dtype=dtype_name(fill.dtype))]
    shape = ctx.static(0, "the shape")
    assert shape is not None
    dims = tuple(int(d) for d in shape.reshape(-1))
    return [ctx.const(np.full(dims, fill, dtype=fill.dtype))]


# -- shapes --------------------------------------------------------------------------------------
def _ints(value: Any) -> tuple[int, ...]:
    return tuple(int(v) for v in np.asarray(value).reshape(-1))


def _input_shape(ctx: Ctx, index: int) -> tuple[int, ...]:
    node = ctx.input(index)
    if isinstance(node, ValueNode) and isinstance(node.value, np.ndarray):
        return tuple(node.value.shape)
    shape = ctx.type_of(index).static_shape
    if shape is None:
        raise NodeError(f"the shape of input {index} is not static")
    return shape


def _dim(ctx: Ctx, index: int, axis: int) -> int:
    """The static length of one axis of input ``index`` (the others may be symbolic)."""
    node = ctx.input(index)
    if isinstance(node, ValueNode) and isinstance(node.value, np.ndarray):
        return int(node.value.shape[axis])
    dims = ctx.type_of(index).dims
    if dims is None:
        raise NodeError(f"the rank of input {index} is unknown")
    found = dims[axis]
    if not isinstance(found, int):
        raise NodeError(f"axis {axis % len(dims)} of input {index} has no static length")
    return found


def _known_dims(ctx: Ctx, index: int) -> tuple[Optional[int], ...]:
    """Each axis's static length, None where symbolic (the rank must be known)."""
    node = ctx.input(index)
    if isinstance(node, ValueNode) and isinstance(node.value, np.ndarray):
        return tuple(int(d) for d in node.value.shape)
    dims = ctx.type_of(index).dims
    if dims is None:
        raise NodeError(f"the rank of input {index} is unknown")
    return tuple(d if isinstance(d, int) else None for d in dims)


def _dims(ctx: Ctx, index: int, axes: Sequence[int]) -> tuple[int, ...]:
    """The static lengths of some axes of input ``index``."""
    return tuple(_dim(ctx, index, a) for a in axes)


@op("Shape")
def _shape(ctx: Ctx) -> Sequence[Optional[Node]]:
    node = ctx.need(0)
    start, end = ctx.attr("start", 0), ctx.attr("end")
    try:
        dims = _input_shape(ctx, 0)
    except NodeError:
        rank = ctx.rank(0)
        full = ctx.call(tensor.shape, node)
        lo, hi, _ = slice(start, end).indices(rank)
        items = [ctx.call(structure.tuple_getitem, full, i) for i in range(lo, hi)]
        return [ctx.call(tensor.array, ctx.call(structure.make_tuple, *items))]
    return [ctx.const(np.array(dims[slice(start, end)], dtype=np.int64))]


@op("Size")
def _size(ctx: Ctx) -> Sequence[Optional[Node]]:
    try:
        dims = _input_shape(ctx, 0)
    except NodeError:
        return [ctx.call(tensor.cast, ctx.call(tensor.array, ctx.call(gradient.size, ctx.need(0))), "i64")]
    return [ctx.const(np.array(int(np.prod(dims)), dtype=np.int64))]


@op("Reshape")
def _reshape(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    if ctx.opset < 5:
        target = _ints(ctx.attr("shape", []))
    else:
        dynamic = computed_shape(ctx, 1)
        if dynamic is not None:
            return [_reshape_computed(ctx, x, dynamic)]
        raw = ctx.static(1, "the shape")
        assert raw is not None
        target = _ints(raw)
    allowzero = ctx.attr("allowzero", 0)
    if not allowzero and 0 in target:
        try:
            dims = _input_shape(ctx, 0)
        except NodeError:
            # A symbolic dimension copied: read from x's shape when it runs.
            known = ctx.call(tensor.shape, x)
            items = [ctx.call(structure.tuple_getitem, known, i) if t == 0 else t
                     for i, t in enumerate(target)]
            return [ctx.call(tensor.reshape, x, ctx.call(structure.make_tuple, *items))]
        target = tuple(dims[i] if t == 0 else t for i, t in enumerate(target))
    return [ctx.call(tensor.reshape, x, target)]


def _reshape_computed(ctx: Ctx, x: Node, target: Node) -> Node:
    # A 0 in a computed shape copies x's dimension (unless allowzero): chosen per item.
    if ctx.attr("allowzero", 0):
        return ctx.call(tensor.reshape, x, target)
    rank = ctx.rank(0)
    dims = ctx.call(tensor.shape, x)
    n = (ctx.type_of(1).static_shape or (0,))[0]
    items = []
    for k in range(n):
        item = ctx.call(structure.tuple_getitem, target, k)
        if k < rank:
            zero = ctx.call(arith.eq, item, ctx.const(0, "i64"))
            item = _scalar(ctx, ctx.call(tensor.where, zero, ctx.call(structure.tuple_getitem, dims, k), item))
        items.append(item)
    return ctx.call(tensor.reshape, x, ctx.call(structure.make_tuple, *items))


@op("Transpose")
def _transpose(ctx: Ctx) -> Sequence[Optional[Node]]:
    perm = ctx.attr("perm")
    if perm is None:
        return [ctx.call(tensor.transpose, ctx.need(0))]
    return [ctx.call(tensor.transpose, ctx.need(0), tuple(int(p) for p in perm))]


@op("Expand")
def _expand(ctx: Ctx) -> Sequence[Optional[Node]]:
    dynamic = computed_shape(ctx, 1)
    if dynamic is not None:
        return [ctx.call(shaping.expand, ctx.need(0), dynamic)]
    raw = ctx.static(1, "the shape")
    assert raw is not None
    target = _ints(raw)
    return [ctx.call(shaping.expand, ctx.need(0), target)]


def _product(dims: Sequence[Optional[int]]) -> int:
    return int(np.prod([int(d) for d in dims if d is not None]))


@op("Flatten")
def _flatten(ctx: Ctx) -> Sequence[Optional[Node]]:
    rank = ctx.rank(0)
    axis = int(ctx.attr("axis", 1))
    axis = axis % rank if rank and axis < 0 else axis
    dims = _known_dims(ctx, 0)
    lead, trail = dims[:axis], dims[axis:]
    if all(isinstance(d, int) for d in lead):
        flat = (_product(lead), -1) if not all(isinstance(d, int) for d in trail) or 0 in lead \
            else (_product(lead), _product(trail))
    elif all(isinstance(d, int) for d in trail) and 0 not in trail:
        flat = (-1, _product(trail))  # a symbolic leading dimension (a batch)
    else:
        raise NodeError("Flatten of symbolic dimensions on both sides of the axis")
    if -1 in flat and 0 in dims:
        raise NodeError("Flatten of an empty tensor with symbolic dimensions")
    return [ctx.call(tensor.reshape, ctx.need(0), flat)]


def _listed_axes(ctx: Ctx, since_input: int) -> Optional[tuple[int, ...]]:
    # Squeeze/Unsqueeze: axes as an attribute before opset 13, an input since.
    if ctx.opset >= since_input:
        raw = ctx.static(1, "the axes")
        return None if raw is None else _ints(raw)
    listed = ctx.attr("axes")
    return None if listed is None else tuple(int(a) for a in listed)


@op("Squeeze")
def _squeeze(ctx: Ctx) -> Sequence[Optional[Node]]:
    axes = _listed_axes(ctx, 13)
    try:
        shape = _input_shape(ctx, 0)
    except NodeError:
        # Only the rank is known (a symbolic dimension): the squeeze primitive, which
        # checks the lengths when it runs.
        rank = ctx.rank(0)
        axis = None if axes is None else tuple(sorted({a % rank for a in axes}))
        return [ctx.call(shaping.squeeze, ctx.need(0), axis=axis)]
    rank = len(shape)
    drop = {a % rank for a in axes} if axes is not None else {i for i, d in enumerate(shape) if d == 1}
    if any(shape[a] != 1 for a in drop):
        raise NodeError(f"squeezing axes {sorted(drop)} of shape {shape}: not all of size 1")
    return [ctx.call(tensor.reshape, ctx.need(0), tuple(d for i, d in enumerate(shape) if i not in drop))]


@op("Unsqueeze")
def _unsqueeze(ctx: Ctx) -> Sequence[Optional[Node]]:
    axes = _listed_axes(ctx, 13)
    if axes is None:
        raise NodeError("Unsqueeze without axes")
    try:
        shape = _input_shape(ctx, 0)
    except NodeError:
        rank = ctx.rank(0) + len(axes)
        return [ctx.call(shaping.unsqueeze, ctx.need(0), axis=tuple(sorted(a % rank for a in axes)))]
    rank = len(shape) + len(axes)
    inserted = {a % rank for a in axes}
    dims = iter(shape)
    out = tuple(1 if i in inserted else next(dims) for i in range(rank))
    return [ctx.call(tensor.reshape, ctx.need(0), out)]


# -- linear algebra ------------------------------------------------------------------------------
@op("MatMul")
def _matmul(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(tensor.matmul, ctx.need(0), ctx.need(1))]


@op("Gemm")
def _gemm(ctx: Ctx) -> Sequence[Optional[Node]]:
    a, b, c = ctx.need(0), ctx.need(1), ctx.input(2)
    d = ctx.dtype(0)
    if ctx.attr("transA", 0):
        a = ctx.call(tensor.transpose, a)
    if ctx.attr("transB", 0):
        b = ctx.call(tensor.transpose, b)
    out = ctx.call(tensor.matmul, a, b)
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    if alpha != 1.0:
        out = ctx.call(arith.mul, ctx.const(alpha, d), out)
    if c is not None:
        if beta != 1.0:
            c = ctx.call(arith.mul, ctx.const(beta, d), c)
        out = ctx.call(arith.add, out, c)
    return [out]


# -- reductions ----------------------------------------------------------------------------------
def _axes(ctx: Ctx, input_opset: int) -> Optional[tuple[int, ...]]:
    # Axes were an attribute before ``input_opset`` and the second input since.
    if ctx.opset >= input_opset:
        raw = ctx.static(1, "the axes")
        axes = None if raw is None or raw.size == 0 else _ints(raw)
    else:
        listed = ctx.attr("axes")
        axes = None if listed is None else tuple(int(a) for a in listed)
    return axes


def _reduction(build: Callable[[Ctx, Node, Optional[tuple[int, ...]], bool], Node],
               input_opset: int = 18) -> OpRule:
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        x = ctx.need(0)
        axes = _axes(ctx, input_opset)
        keepdims = bool(ctx.attr("keepdims", 1))
        if axes is None and ctx.attr("noop_with_empty_axes", 0):
            return [ctx.call(structure.identity, x)]
        empty = _empty_reduction(ctx, axes, keepdims)
        if empty is not None:
            return [empty]
        return [build(ctx, _identity_padded(ctx, x, axes), axes, keepdims)]
    return rule


_EMPTY_REDUCTION = {"ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceProd": 1, "ReduceLogSum": -np.inf,
                    "ReduceLogSumExp": -np.inf}


def _empty_reduction(ctx: Ctx, axes: Optional[tuple[int, ...]], keepdims: bool) -> Optional[Node]:
    """The result of reducing over no elements (ONNX: the reduction's identity; the
    smallest or largest value of an integer type for max and min), or None."""
    try:
        shape = _input_shape(ctx, 0)
    except NodeError:
        return None
    rank = len(shape)
    reduced = set(range(rank)) if axes is None else {a % rank for a in axes}
    if not any(shape[a] == 0 for a in reduced):
        return None
    out = tuple(1 if i in reduced else n for i, n in enumerate(shape) if keepdims or i not in reduced)
    return ctx.const(np.full(out, _reduction_identity(ctx), dtype=BY_NAME[ctx.dtype(0)].numpy))


def _reduction_identity(ctx: Ctx) -> Any:
    """What reducing no elements gives, in input 0's dtype: the reduction's identity;
    for max and min of an integer type its smallest or largest value."""
    d = ctx.dtype(0)
    fill = _EMPTY_REDUCTION.get(ctx.node.op_type, 0)
    if d == "bool":
        return bool(fill < 0) if ctx.node.op_type == "ReduceMin" else False if ctx.node.op_type == "ReduceMax" else fill
    if not is_float(d) and fill in (np.inf, -np.inf):
        low, high = int_range(numpy_dtype(d))  # (int4 too: numpy's iinfo lacks it)
        return low if fill < 0 else high
    return fill


_NO_IDENTITY = ("ReduceMax", "ReduceMin")
"""Reductions that anfir's primitive refuses on an empty axis (numpy's max and min have
no identity), where ONNX gives the identity."""


def _positive(dim: Optional[int | str]) -> bool:
    """Whether an ONNX dimension is a known length of at least 1."""
    return isinstance(dim, int) and dim > 0


def _identity_padded(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]]) -> Node:
    """``x``, padded at the end of each reduced axis that may be empty (its length known
    only at run time, or 0 beside a symbolic dimension) with one cell of the reduction's
    identity, for max and min: an input empty along such an axis then reduces to the
    identity, as ONNX says, and any other to its own extreme (the identity never wins).
    Fully static shapes are decided at import instead (:func:`_empty_reduction`); other
    reductions have their identity in numpy already."""
    dims = ctx.type_of(0).dims
    if ctx.node.op_type not in _NO_IDENTITY or dims is None:
        return x
    rank = len(dims)
    reduced = set(range(rank)) if axes is None else {a % rank for a in axes if -rank <= a < rank}
    # (an axis known to be empty gets here when another dimension is symbolic: the
    # identity's shape is then not known at import)
    maybe_empty = {a for a in reduced if not _positive(dims[a])}
    if not maybe_empty:
        return x
    pads = [0] * rank + [1 if a in maybe_empty else 0 for a in range(rank)]
    fill = _reduction_identity(ctx)
    # (pad's value is a number: a bool tensor is padded with 0 or 1)
    return ctx.call(shaping.pad, x, pads=tuple(pads), mode="constant",
                    value=int(fill) if isinstance(fill, bool) else fill)


def _reduce_with(prim: Primitive) -> Callable[[Ctx, Node, Optional[tuple[int, ...]], bool], Node]:
    def build(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
        return ctx.call(prim, x, axis=axes, keepdims=keepdims)
    return build


def _reduce_l1(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
    return ctx.call(tensor.sum_, ctx.call(arith.abs_, x), axis=axes, keepdims=keepdims)


def _reduce_l2(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
    return ctx.call(arith.sqrt, ctx.call(tensor.sum_, ctx.call(arith.mul, x, x), axis=axes,
                                        keepdims=keepdims))


def _reduce_sum_square(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
    return ctx.call(tensor.sum_, ctx.call(arith.mul, x, x), axis=axes, keepdims=keepdims)


def _reduce_log_sum(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
    return ctx.call(arith.log, ctx.call(tensor.sum_, x, axis=axes, keepdims=keepdims))


def _reduce_log_sum_exp(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
    return ctx.call(reduce.logsumexp, x, axis=axes, keepdims=keepdims)


op("ReduceSum")(_reduction(_reduce_with(tensor.sum_), input_opset=13))
op("ReduceMean")(_reduction(_reduce_with(tensor.mean)))
op("ReduceMax")(_reduction(_reduce_with(reduce.max_)))
op("ReduceMin")(_reduction(_reduce_with(reduce.min_)))
op("ReduceProd")(_reduction(_reduce_with(reduce.prod)))
op("ReduceL1")(_reduction(_reduce_l1))
op("ReduceL2")(_reduction(_reduce_l2))
op("ReduceSumSquare")(_reduction(_reduce_sum_square))
op("ReduceLogSum")(_reduction(_reduce_log_sum))
op("ReduceLogSumExp")(_reduction(_reduce_log_sum_exp))


def _arg(prim: Primitive) -> OpRule:
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        return [ctx.call(prim, ctx.need(0), axis=int(ctx.attr("axis", 0)),
                         keepdims=bool(ctx.attr("keepdims", 1)),
                         select_last=bool(ctx.attr("select_last_index", 0)))]
    return rule


op("ArgMax")(_arg(reduce.argmax))
op("ArgMin")(_arg(reduce.argmin))


@op("CumSum")
def _cumsum(ctx: Ctx) -> Sequence[Optional[Node]]:
    raw = ctx.static(1, "the axis")
    assert raw is not None
    out = ctx.call(reduce.cumsum, ctx.need(0), axis=int(raw.reshape(-1)[0]),
                   exclusive=bool(ctx.attr("exclusive", 0)), reverse=bool(ctx.attr("reverse", 0)))
    # numpy sums small integers in i64; ONNX keeps the input's type.
    return [ctx.call(tensor.cast, out, ctx.dtype(0))]


# -- structure -----------------------------------------------------------------------------------
@op("Dropout")
def _dropout(ctx: Ctx) -> Sequence[Optional[Node]]:
    # Inference: the identity (a training_mode input that is a true constant is refused).
    training = ctx.static(2, "training_mode") if ctx.opset >= 12 else None
    ratio = ctx.static(1, "the ratio") if ctx.opset >= 12 else None
    if training is not None and bool(training) and not (ratio is not None and float(ratio) == 0.0):
        # (A zero ratio drops nothing: the identity, as at inference.)
        raise NodeError("Dropout in training mode (anfir imports inference graphs)")
    x = ctx.need(0)
    out: list[Optional[Node]] = [ctx.call(structure.identity, x)]
    if len(ctx.node.output) > 1:
        out.append(ctx.call(tensor.ones_like, ctx.call(tensor.cast, x, "bool")))
    return out


@op("SequenceConstruct")
def _sequence_construct(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(structure.make_tuple, *[a for a in ctx.inputs() if a is not None])]


@op("SequenceEmpty")
def _sequence_empty(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(structure.make_tuple)]


def _items(ctx: Ctx, index: int) -> Optional[list[Node]]:
    """The items of a sequence built in this graph (a tuple node or constant), or None."""
    node = ctx.need(index)
    if isinstance(node, ValueNode) and isinstance(node.value, tuple):
        return [ValueNode(v) for v in node.value]
    inputs = getattr(node, "inputs", None)
    if inputs and isinstance(inputs[0], ValueNode) and inputs[0].value is structure.make_tuple:
        return list(inputs[1:])
    return None


def _need_entry_input(ctx: Ctx, indices: int | tuple[int, ...], what: str) -> None:
    """A NeedsValue when inputs ``indices`` are (computed from) graph inputs only
    (those that are not constants already): the Backend then imports the model again
    with their values bound."""
    names: list[str] = []
    for index in (indices,) if isinstance(indices, int) else indices:
        node = ctx.input(index)
        if node is None or isinstance(node, ValueNode):
            continue
        found = ctx.importer.entry_inputs_of(node)
        if not found:
            return
        names.extend(n for n in found if n not in names)
    if names:
        raise NeedsValue(f"{what} must be known when importing", names[0], names)


@op("SequenceInsert", 11)
def _sequence_insert(ctx: Ctx) -> Sequence[Optional[Node]]:
    items = _items(ctx, 0)
    if items is None:
        _need_entry_input(ctx, 0, "the sequence (its length)")
        raise NodeError("SequenceInsert into a sequence of a length unknown when importing")
    raw = ctx.static(2, "the position")
    at = len(items) if raw is None else int(raw.reshape(-1)[0]) % (len(items) + 1)
    return [ctx.call(structure.make_tuple, *items[:at], ctx.need(1), *items[at:])]


@op("SequenceLength")
def _sequence_length(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(tensor.array, ctx.call(structure.len_, ctx.need(0)))]


@op("SequenceAt")
def _sequence_at(ctx: Ctx) -> Sequence[Optional[Node]]:
    raw = ctx.static(1, "the position")
    assert raw is not None
    return [ctx.call(structure.tuple_getitem, ctx.need(0), int(raw.reshape(-1)[0]))]


@op("Optional")
def _optional(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.input(0)
    return [ValueNode(None) if x is None else x]


@op("OptionalHasElement")
def _optional_has_element(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.input(0)
    present = x is not None and not (isinstance(x, ValueNode) and x.value is None)
    return [ctx.const(np.array(present))]


@op("OptionalGetElement")
def _optional_get_element(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    if isinstance(x, ValueNode) and x.value is None:
        raise NodeError("the optional is empty")
    return [x]


# -- control flow --------------------------------------------------------------------------------
def _truth(ctx: Ctx, node: Node) -> Node:
    # ONNX conditions are bool tensors of one element; anfir's `if` takes a bool.
    return ctx.call(reduce.all_, node)


@op("If")
def _if(ctx: Ctx) -> Sequence[Optional[Node]]:
    imp = ctx.importer
    cond = _truth(ctx, ctx.need(0))
    if isinstance(cond, ValueNode):
        # A condition known when importing (shapes are often tested): only the branch
        # taken is built, in line (the other may not even import for these shapes).
        body = ctx.attr("then_branch" if bool(np.asarray(cond.value)) else "else_branch")
        outs = imp.convert_subgraph(body, ctx.graph, ctx.scope, _opsets(ctx), {})
        for name, result in zip(ctx.node.output, body.output):
            known = imp.types.get(name)
            if name and result.name in imp.types and (known is None or known.rank is None):
                imp.types[name] = imp.types[result.name]
        return [o if isinstance(o, ValueNode) else ctx.call(structure.identity, o) for o in outs]
    branches = []
    produced: list[list[Node]] = []
    for attr, mark in (("then_branch", "✓"), ("else_branch", "✗")):
        body = ctx.attr(attr)
        g = FuncGraph(imp.graph_name(f"{mark}{ctx.node.name or 'if'}"))
        outs = imp.convert_subgraph(body, g, ctx.scope, _opsets(ctx), {})
        g.output = outs[0] if len(outs) == 1 else g.apply(structure.make_tuple, *outs)
        branches.append(g)
        produced.append(outs)
    _merge_branch_types(ctx, produced)
    chosen = ctx.call(structure.switch, cond, branches[0], branches[1])
    result = ctx.graph.apply(chosen)
    n = len(ctx.node.output)
    if n == 1:
        return [result]
    return [ctx.graph.apply(structure.tuple_getitem, result, i) for i in range(n)]


def _merge_branch_types(ctx: Ctx, produced: list[list[Node]]) -> None:
    """What ONNX leaves unknown of an If's outputs (branches of different shapes), from
    the two branches' outputs (their ONNX types, else anfir's): the rank when they
    agree, the dims where they agree."""
    imp = ctx.importer
    types = imp.types
    bodies = (ctx.attr("then_branch"), ctx.attr("else_branch"))

    def branch_type(k: int, i: int) -> Optional[TypeInfo]:
        found = types.get(bodies[k].output[i].name)
        if found is not None and found.dims is not None:
            return found
        abstract = imp.node_abstract(produced[k][i])
        shape = getattr(abstract, "shape", None)
        if abstract is None or shape is None:
            return found
        return TypeInfo(getattr(abstract, "dtype", None), tuple(d if isinstance(d, int) else None for d in shape))

    for i, name in enumerate(ctx.node.output):
        known = types.get(name)
        if not name or (known is not None and known.rank is not None) or i >= len(bodies[0].output):
            continue
        a, b = branch_type(0, i), branch_type(1, i)
        if a is None or b is None or a.dims is None or b.dims is None or len(a.dims) != len(b.dims):
            continue
        dims = tuple(x if x == y else None for x, y in zip(a.dims, b.dims))
        types[name] = TypeInfo(a.dtype if a.dtype == b.dtype else None, dims)


def _opsets(ctx: Ctx) -> dict[str, int]:
    return ctx.importer.opsets


ElemType = tuple[str, tuple[int, ...]]


def _known_elem_shape(ctx: Ctx, name: str) -> Optional[ElemType]:
    # The dtype and shape of one step's scan output, when ONNX says.
    info = ctx.importer.types.get(name)
    if info is None or info.dtype is None or info.static_shape is None:
        return None
    return info.dtype, info.static_shape


def _build_loop(ctx: Ctx, name: str, n_state: int, n_scan: int,
                counter: Callable[[FuncGraph, Node], Node],
                bind: Callable[[FuncGraph, Node, Node, list[Node]], dict[str, Node]],
                body: Any, start: list[Node], scan_names: list[str],
                reverse_out: Sequence[bool], body_cond: bool) -> tuple[Node, list[ElemType]]:
    """A tail-recursive graph ``loop(i, cond, state..., stacked...)``: while
    ``counter(loop, i) and cond`` it runs the body (``bind`` names the body's inputs)
    and calls itself with the new state, each scan output stacked on its result
    (which starts empty: the element types, from ONNX or from anfir's inference of
    the body, are returned too).  ``start`` is the condition and the states."""
    imp = ctx.importer
    loop = FuncGraph(imp.graph_name(name))
    i = loop.add_parameter("i")
    c = loop.add_parameter("cond")
    state: list[Node] = [loop.add_parameter(f"state{k}") for k in range(n_state)]
    stacked = [loop.add_parameter(f"stacked{k}") for k in range(n_scan)]
    # What anfir knows of the loop's parameters, from their first values (a Scan's
    # state keeps its type; a Loop's may not, and then its scan outputs need ONNX's).
    imp._abstracts[id(i)] = (i, imp.node_abstract(ValueNode(np.array(0, dtype=np.int64))))
    if body_cond or ctx.node.op_type == "Scan":
        for param, first in zip([c, *state], start):
            imp._abstracts[id(param)] = (param, imp.node_abstract(first))
    go = imp.call(loop, reduce.all_, [imp.call(loop, arith.logical_and, [counter(loop, i), c], {}, None)],
                  {}, None)
    step = FuncGraph(imp.graph_name(f"✓{name}"))
    bound = bind(step, i, c, state)
    outs = imp.convert_subgraph(body, step, ctx.scope, _opsets(ctx), bound)
    offset = 1 if body_cond else 0
    next_cond = outs[0] if body_cond else c
    new_state = outs[offset:offset + n_state]
    new_stacked: list[Node] = []
    scan_types: list[ElemType] = []
    for k in range(n_scan):
        known = _known_elem_shape(ctx, scan_names[k])
        if known is None:
            found = _refined_type(imp.node_abstract(outs[offset + n_state + k]))
            if found is None:
                raise NodeError(f"the type of scan output {scan_names[k]!r} is not static (the stacked "
                                "result starts as an empty tensor of that shape)")
            known = found
        scan_types.append(known)
        item = imp.call(step, shaping.unsqueeze, [outs[offset + n_state + k]], {"axis": 0}, None)
        pair = (item, stacked[k]) if reverse_out[k] else (stacked[k], item)
        new_stacked.append(imp.call(step, shaping.concat, [imp.call(step, structure.make_tuple, list(pair), {}, None)],
                                    {"axis": 0}, None))
    next_i = imp.call(step, arith.add, [i, np.array(1, dtype=np.int64)], {}, None)
    step.output = step.apply(loop, next_i, next_cond, *new_state, *new_stacked)
    done = FuncGraph(imp.graph_name(f"✗{name}"))
    done.output = done.apply(structure.make_tuple, *state, *stacked)
    loop.output = loop.apply(loop.apply(structure.switch, go, step, done))
    empty = [ctx.const(np.zeros((0, *shape), dtype=BY_NAME[dtype].numpy)) for dtype, shape in scan_types]
    return ctx.graph.apply(loop, np.array(0, dtype=np.int64), *start, *empty), scan_types


def _refined_type(abstract: Any) -> Optional[ElemType]:
    """(dtype, static shape) of an abstract tensor or scalar, or None."""
    shape = getattr(abstract, "shape", ())
    dtype = getattr(abstract, "dtype", None)
    if dtype is None or shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return str(dtype), tuple(int(d) for d in shape)


@op("Loop")
def _loop(ctx: Ctx) -> Sequence[Optional[Node]]:
    body = ctx.attr("body")
    trip, cond0 = ctx.input(0), ctx.input(1)
    carried = [ctx.need(i) for i in range(2, len(ctx.node.input))]
    n_state = len(carried)
    n_scan = len(body.output) - 1 - n_state

    def counter(loop: FuncGraph, i: Node) -> Node:
        if trip is None:
            return ValueNode(np.array(True))
        return ctx.importer.call(loop, arith.lt, [i, trip], {}, None)

    def bind(step: FuncGraph, i: Node, c: Node, state: list[Node]) -> dict[str, Node]:
        names = [v.name for v in body.input]
        bound: dict[str, Node] = {names[0]: i, names[1]: c}
        bound.update({names[2 + k]: state[k] for k in range(n_state)})
        return bound

    start = [cond0 if cond0 is not None else ctx.const(np.array(True)), *carried]
    try:
        result, _ = _build_loop(ctx, ctx.node.name or "loop", n_state, n_scan, counter, bind, body, start,
                                [body.output[1 + n_state + k].name for k in range(n_scan)], [False] * n_scan,
                                True)
    except NodeError as failed:
        # A body that needs what only a finished iteration knows (a sequence that
        # grows: its length): with a trip count known when importing, the loop is
        # unrolled, each iteration's values then known; a trip count computed from
        # graph inputs asks the Backend to bind them.
        if isinstance(trip, ValueNode) and (cond0 is None or isinstance(cond0, ValueNode)):
            try:
                return _unrolled_loop(ctx, body, int(np.asarray(trip.value).reshape(-1)[0]), start, n_state, n_scan)
            except NodeError:
                raise failed from None
        _need_entry_input(ctx, (0, 1), "the trip count and condition of a loop that is unrolled")
        raise
    return [ctx.graph.apply(structure.tuple_getitem, result, k) for k in range(n_state + n_scan)]


UNROLL_LIMIT = 1024
"""The most iterations of a Loop the importer unrolls."""


def _unrolled_loop(ctx: Ctx, body: Any, trips: int, start: list[Node], n_state: int,
                   n_scan: int) -> list[Optional[Node]]:
    """A Loop of a known trip count built iteration by iteration in the graph, while
    its condition stays a known true."""
    if trips > UNROLL_LIMIT:
        raise NodeError(f"a loop of {trips} iterations is too long to unroll")
    imp = ctx.importer
    names = [v.name for v in body.input]
    cond, state = start[0], list(start[1:])
    scans: list[list[Node]] = [[] for _ in range(n_scan)]
    for k in range(trips):
        if not isinstance(cond, ValueNode):
            raise NodeError("the loop's condition is computed when it runs")
        if not bool(np.all(np.asarray(cond.value))):
            break
        bound: dict[str, Node] = {names[0]: ctx.const(np.array(k, dtype=np.int64)), names[1]: cond}
        bound.update({names[2 + j]: state[j] for j in range(n_state)})
        outs = imp.convert_subgraph(body, ctx.graph, ctx.scope, _opsets(ctx), bound)
        cond, state = outs[0], list(outs[1:1 + n_state])
        for j in range(n_scan):
            scans[j].append(ctx.call(shaping.unsqueeze, outs[1 + n_state + j], axis=0))
    if any(not items for items in scans):
        raise NodeError("a loop with scan outputs that runs no iteration")
    stacked = [ctx.call(shaping.concat, ctx.call(structure.make_tuple, *items), axis=0) for items in scans]
    return [*state, *stacked]


@op("Scan", 9)
def _scan(ctx: Ctx) -> Sequence[Optional[Node]]:
    body = ctx.attr("body")
    m = int(ctx.attr("num_scan_inputs"))
    inputs = [ctx.need(i) for i in range(len(ctx.node.input))]
    n_state = len(inputs) - m
    n_scan = len(body.output) - n_state
    in_axes = [int(a) for a in ctx.attr("scan_input_axes", [0] * m)]
    in_dirs = [int(a) for a in ctx.attr("scan_input_directions", [0] * m)]
    out_axes = [int(a) for a in ctx.attr("scan_output_axes", [0] * n_scan)]
    out_dirs = [int(a) for a in ctx.attr("scan_output_directions", [0] * n_scan)]
    axes = [a % ctx.rank(n_state + k) for k, a in enumerate(in_axes)]
    try:
        shapes = [_input_shape(ctx, n_state + k) for k in range(m)]
    except NodeError:
        # A symbolic length: read from the first scan input when the loop runs.
        shapes = []
    length_node: Node
    if shapes:
        lengths = {shapes[k][axes[k]] for k in range(m)}
        if len(lengths) != 1:
            raise NodeError(f"the scan inputs have different lengths {sorted(lengths)}")
        length_node = ctx.const(lengths.pop(), "i64")
    else:
        length_node = ctx.call(tensor.array, ctx.call(structure.tuple_getitem,
                                                    ctx.call(tensor.shape, inputs[n_state]), axes[0]))
    result, scan_types = _scan_loop(ctx, body, inputs, n_state, axes, length_node, in_dirs, out_dirs)
    outs: list[Optional[Node]] = [ctx.graph.apply(structure.tuple_getitem, result, k)
                                  for k in range(n_state + n_scan)]
    for k in range(n_scan):
        rank = len(scan_types[k][1]) + 1
        axis = out_axes[k] % rank
        if axis:
            perm = list(range(1, rank))
            perm.insert(axis, 0)
            outs[n_state + k] = ctx.call(tensor.transpose, outs[n_state + k], tuple(perm))
    return outs


@op("Scan", 8)
def _scan8(ctx: Ctx) -> Sequence[Optional[Node]]:
    # Opset 8's Scan has a batch axis first (and optional sequence lengths): one
    # scan per batch element, the results stacked.
    if ctx.input(0) is not None:
        raise NodeError("Scan (opset 8) with sequence_lens")
    body = ctx.attr("body")
    m = int(ctx.attr("num_scan_inputs"))
    inputs = [ctx.need(i) for i in range(1, len(ctx.node.input))]
    n_state = len(inputs) - m
    n_scan = len(body.output) - n_state
    dirs = [int(a) for a in ctx.attr("directions", [0] * m)]
    shapes = [_input_shape(ctx, 1 + n_state + k) for k in range(m)]
    lengths = {shape[1] for shape in shapes}
    if len(lengths) != 1:
        raise NodeError(f"the scan inputs have different lengths {sorted(lengths)}")
    length = ctx.const(lengths.pop(), "i64")
    per_batch: list[list[Node]] = []
    for b in range(shapes[0][0]):
        row = [ctx.call(indexing.gather, x, ctx.const(b, "i64"), axis=0) for x in inputs]
        result, _ = _scan_loop(ctx, body, row, n_state, [0] * m, length, dirs, [0] * n_scan)
        per_batch.append([ctx.graph.apply(structure.tuple_getitem, result, k) for k in range(n_state + n_scan)])
    return [ctx.call(shaping.stack, ctx.call(structure.make_tuple, *[r[k] for r in per_batch]), axis=0)
            for k in range(n_state + n_scan)]


def _scan_loop(ctx: Ctx, body: Any, inputs: list[Node], n_state: int, axes: list[int], length_node: Node,
               in_dirs: list[int], out_dirs: list[int]) -> tuple[Node, list[ElemType]]:
    """The loop of a Scan: the final states and the stacked scan outputs (a tuple),
    and each scan output's element type."""
    m = len(inputs) - n_state
    n_scan = len(body.output) - n_state
    scanned = inputs[n_state:]

    def counter(loop: FuncGraph, i: Node) -> Node:
        return ctx.importer.call(loop, arith.lt, [i, length_node], {}, None)

    def bind(step: FuncGraph, i: Node, c: Node, state: list[Node]) -> dict[str, Node]:
        imp = ctx.importer
        names = [v.name for v in body.input]
        bound: dict[str, Node] = {names[k]: state[k] for k in range(n_state)}
        for k in range(m):
            index = i if not in_dirs[k] else imp.call(
                step, arith.sub, [imp.call(step, arith.sub, [length_node, np.array(1, dtype=np.int64)], {}, None), i],
                {}, None)
            bound[names[n_state + k]] = imp.call(step, indexing.gather, [scanned[k], index],
                                                 {"axis": axes[k]}, None)
        return bound

    start = [ctx.const(np.array(True)), *inputs[:n_state]]
    return _build_loop(ctx, ctx.node.name or "scan", n_state, n_scan, counter, bind, body, start,
                       [body.output[n_state + k].name for k in range(n_scan)], [bool(d) for d in out_dirs], False)


# -- neural-network operators ---------------------------------------------------------------------
def _wide(ctx: Ctx, node: Node, d: str) -> Node:
    # bf16 operands of the primitives that compute in f32 or wider (softmax, einsum).
    return ctx.call(tensor.cast, node, "f32") if d == "bf16" else node


def _narrow(ctx: Ctx, node: Node, d: str) -> Node:
    return ctx.call(tensor.cast, node, d) if d == "bf16" else node


def _softmax_rule(prim: Primitive) -> OpRule:
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        d = ctx.dtype(0)
        x = _wide(ctx, ctx.need(0), d)
        if ctx.opset >= 13:
            return [_narrow(ctx, ctx.call(prim, x, axis=int(ctx.attr("axis", -1))), d)]
        # Before opset 13 the input is seen as 2-d: the axes before `axis`, and the rest.
        shape = _input_shape(ctx, 0)
        axis = int(ctx.attr("axis", 1)) % max(len(shape), 1)
        flat = (int(np.prod(shape[:axis])), int(np.prod(shape[axis:])))
        y = ctx.call(prim, ctx.call(tensor.reshape, x, flat), axis=-1)
        return [_narrow(ctx, ctx.call(tensor.reshape, y, shape), d)]
    return rule


op("Softmax")(_softmax_rule(nn.softmax))
op("LogSoftmax")(_softmax_rule(nn.log_softmax))


@op("LayerNormalization", 17)
def _layer_norm(ctx: Ctx) -> Sequence[Optional[Node]]:
    x, scale, bias = ctx.need(0), ctx.input(1), ctx.input(2)
    axis, eps = int(ctx.attr("axis", -1)), float(ctx.attr("epsilon", 1e-5))
    args = [x] + ([scale] if scale is not None else []) + ([bias] if bias is not None else [])
    if bias is not None and scale is None:
        raise NodeError("a bias without a scale")
    out: list[Optional[Node]] = [ctx.call(nn.layer_norm, *args, axis=axis, eps=eps)]
    if len(ctx.node.output) > 1:
        # Mean and InvStdDev over the normalized axes, kept as dimensions of size 1.
        rank = ctx.rank(0)
        axes = tuple(range(axis % rank, rank))
        out.append(ctx.call(tensor.mean, x, axis=axes, keepdims=True))
        var = ctx.call(reduce.var, x, axis=axes, keepdims=True)
        out.append(ctx.call(elementwise.rsqrt, ctx.call(arith.add, var, ctx.const(eps, ctx.dtype(0)))))
    return out


@op("RMSNormalization", 23)
def _rms_norm(ctx: Ctx) -> Sequence[Optional[Node]]:
    x, scale = ctx.need(0), ctx.input(1)
    args = [x] + ([scale] if scale is not None else [])
    return [ctx.call(nn.rms_norm, *args, axis=int(ctx.attr("axis", -1)),
                     eps=float(ctx.attr("epsilon", 1e-5)))]


@op("InstanceNormalization")
def _instance_norm(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(nn.instance_norm, ctx.need(0), ctx.need(1), ctx.need(2),
                     eps=float(ctx.attr("epsilon", 1e-5)))]


@op("GroupNormalization", 21)
def _group_norm(ctx: Ctx) -> Sequence[Optional[Node]]:
    groups = np.array(int(ctx.attr("num_groups")), dtype=np.int64)
    return [ctx.call(nn.group_norm, ctx.need(0), int(groups), ctx.need(1), ctx.need(2),
                     eps=float(ctx.attr("epsilon", 1e-5)))]


def explicit_einsum(equation: str) -> str:
    """An einsum equation in explicit form: ONNX's implicit ``ij,jk`` is ``ij,jk->ik``
    (the letters used once, in alphabetical order, after any ``...``)."""
    equation = equation.replace(" ", "")
    if "->" in equation:
        return equation
    letters = [c for c in equation if c.isalpha()]
    once = sorted(c for c in set(letters) if letters.count(c) == 1)
    return equation + "->" + ("..." if "..." in equation else "") + "".join(once)


@op("Einsum", 12)
def _einsum(ctx: Ctx) -> Sequence[Optional[Node]]:
    spec = explicit_einsum(str(ctx.attr("equation")))
    d = ctx.dtype(0)
    args = [_wide(ctx, a, d) for a in ctx.inputs() if a is not None]
    return [_narrow(ctx, ctx.call(nn.einsum, spec, *args), d)]


def _loss_reduction(ctx: Ctx) -> str:
    reduction = str(ctx.attr("reduction", "mean"))
    if reduction not in ("mean", "sum", "none"):
        raise NodeError(f"reduction {reduction!r}")
    return reduction


@op("NegativeLogLikelihoodLoss", 12)
def _nll_loss(ctx: Ctx) -> Sequence[Optional[Node]]:
    if ctx.input(2) is not None or ctx.attr("ignore_index") is not None:
        # The schema's function body computes those (with gathers and a where).
        raise UseFunctionBody("class weights and ignore_index (anfir's nll_loss has neither)")
    return [ctx.call(nn.nll_loss, ctx.need(0), ctx.need(1), axis=1,
                     reduction=_loss_reduction(ctx))]


@op("SoftmaxCrossEntropyLoss", 12)
def _cross_entropy(ctx: Ctx) -> Sequence[Optional[Node]]:
    if ctx.input(2) is not None or ctx.attr("ignore_index") is not None:
        raise UseFunctionBody("class weights and ignore_index (anfir's cross_entropy has neither)")
    x, t = ctx.need(0), ctx.need(1)
    out: list[Optional[Node]] = [ctx.call(nn.cross_entropy, x, t, axis=1,
                                          reduction=_loss_reduction(ctx))]
    if len(ctx.node.output) > 1:
        out.append(ctx.call(nn.log_softmax, x, axis=1))
    return out


# -- shapes and indexing, convolution and pooling -------------------------------------------------
def call_named(ctx: Ctx, prim: Primitive, inputs: Sequence[Node], named: dict[str, Any]) -> Node:
    """``prim(*inputs, ...)`` where each ``named`` value goes as an attribute when the
    primitive declares one of that name, else as the next positional argument (the
    operator library decides which of its parameters are static).  A convolution's or
    pool's window attributes are written in their one short form (every rule gives
    ``stride`` as its n per-axis values, n the spatial rank)."""
    if prim in attributes.WINDOWED and isinstance(named.get("stride"), tuple):
        try:
            named = attributes.window(named, len(named["stride"]))
        except ValueError as e:
            raise NodeError(f"{prim.name}: {e}") from None
    args: list[Any] = list(inputs)
    attrs: dict[str, Any] = {}
    for key, value in named.items():
        if key in prim.attrs:
            if value is not None:
                attrs[key] = value
        else:
            args.append(value)
    while args and args[-1] is None and len(args) > prim.min_args:
        args.pop()
    return ctx.call(prim, *args, **attrs)


@op("Concat")
def _concat(ctx: Ctx) -> Sequence[Optional[Node]]:
    parts = [a for a in ctx.inputs() if a is not None]
    return [ctx.call(shaping.concat, ctx.call(structure.make_tuple, *parts), axis=int(ctx.attr("axis", 0)))]


@op("Gather")
def _gather(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [call_named(ctx, indexing.gather, [ctx.need(0), ctx.need(1)], {"axis": int(ctx.attr("axis", 0))})]


@op("GatherElements")
def _gather_elements(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [call_named(ctx, indexing.gather_elements, [ctx.need(0), ctx.need(1)],
                       {"axis": int(ctx.attr("axis", 0))})]


@op("GatherND")
def _gather_nd(ctx: Ctx) -> Sequence[Optional[Node]]:
    if ctx.attr("batch_dims", 0):
        raise NodeError("batch_dims (anfir's gather_nd has none)")
    return [ctx.call(indexing.gather_nd, ctx.need(0), ctx.need(1))]


@op("Slice")
def _slice(ctx: Ctx) -> Sequence[Optional[Node]]:
    if ctx.opset < 10:
        starts, ends = _ints(ctx.attr("starts")), _ints(ctx.attr("ends"))
        listed = ctx.attr("axes")
        axes = None if listed is None else tuple(int(a) for a in listed)
        steps = None
    else:
        computed = [i for i in (1, 2) if not isinstance(ctx.input(i), ValueNode)]
        if computed and ctx.type_of(computed[0]).static_shape is not None:
            return [_slice_computed(ctx)]
        starts = _ints(ctx.static(1, "the starts"))
        ends = _ints(ctx.static(2, "the ends"))
        raw_axes, raw_steps = ctx.static(3, "the axes"), ctx.static(4, "the steps")
        axes = None if raw_axes is None else _ints(raw_axes)
        steps = None if raw_steps is None else _ints(raw_steps)
    return [call_named(ctx, shaping.slice_, [ctx.need(0)],
                       {"starts": starts, "ends": ends, "axes": axes, "steps": steps})]


def _slice_computed(ctx: Ctx) -> Node:
    """A Slice whose starts or ends are computed at run time: per axis, a gather of
    the indices ``arange(start, end, step)``, the bounds clamped as ONNX clamps them
    (the axes and steps are constants)."""
    x, starts, ends = ctx.need(0), ctx.need(1), ctx.need(2)
    count = (ctx.type_of(1).static_shape or ctx.type_of(2).static_shape or (0,))[0]
    rank = ctx.rank(0)
    raw_axes, raw_steps = ctx.static(3, "the axes"), ctx.static(4, "the steps")
    axes = list(range(count)) if raw_axes is None else [a % rank for a in _ints(raw_axes)]
    steps = [1] * count if raw_steps is None else list(_ints(raw_steps))
    dims = ctx.call(tensor.shape, x)
    zero = ctx.const(0, "i64")

    def bound(values: Node, k: int, n: Node, lo: Node, hi: Node) -> Node:
        v = ctx.call(tensor.cast, ctx.call(indexing.gather, values, ctx.const(k, "i64"), axis=0), "i64")
        v = ctx.call(tensor.where, ctx.call(arith.lt, v, zero), ctx.call(arith.add, v, n), v)
        return _scalar(ctx, ctx.call(arith.minimum, ctx.call(arith.maximum, v, lo), hi))

    for k, (axis, step) in enumerate(zip(axes, steps)):
        if step == 0:
            raise NodeError("a Slice step of 0")
        n = ctx.call(tensor.array, ctx.call(structure.tuple_getitem, dims, axis))
        last = ctx.call(arith.sub, n, ctx.const(1, "i64"))
        if step > 0:
            start, end = bound(starts, k, n, zero, n), bound(ends, k, n, zero, n)
        else:
            minus = ctx.const(-1, "i64")
            start, end = bound(starts, k, n, zero, last), bound(ends, k, n, minus, last)
        index = ctx.call(indexing.arange, start, end, step=step, dtype="i64")
        x = ctx.call(indexing.gather, x, index, axis=axis)
    return x


@op("Pad")
def _pad(ctx: Ctx) -> Sequence[Optional[Node]]:
    mode = str(ctx.attr("mode", "constant"))
    if ctx.opset < 11:
        pads = tuple(int(p) for p in ctx.attr("pads", ctx.attr("paddings", [])))
        value: Any = float(ctx.attr("value", 0.0))
    else:
        pads = _ints(ctx.static(1, "the pads"))
        raw_value = ctx.static(2, "the constant value")
        value = 0 if raw_value is None or raw_value.size == 0 else raw_value.reshape(-1)[0].item()
        raw_axes = ctx.static(3, "the axes") if ctx.opset >= 18 else None
        if raw_axes is not None:
            rank = ctx.rank(0)
            axes = [a % rank for a in _ints(raw_axes)]
            full = [0] * (2 * rank)
            for k, a in enumerate(axes):
                full[a], full[rank + a] = pads[k], pads[len(axes) + k]
            pads = tuple(full)
    return [call_named(ctx, shaping.pad, [ctx.need(0)], {"pads": pads, "mode": mode, "value": value})]


@op("Split")
def _split(ctx: Ctx) -> Sequence[Optional[Node]]:
    axis = int(ctx.attr("axis", 0))
    count = len(ctx.node.output)
    if ctx.opset < 13:
        listed = ctx.attr("split")
        sizes: Any = tuple(int(s) for s in listed) if listed else count
    else:
        raw = ctx.static(1, "the sizes")
        sizes = _ints(raw) if raw is not None else count
    if isinstance(sizes, int) and ctx.opset >= 18 and ctx.attr("num_outputs") is not None:
        # num_outputs pieces of ceil(n / num_outputs), the last one smaller.
        length = _dim(ctx, 0, axis)
        piece = -(-length // sizes)
        sizes = tuple(min(piece, length - piece * k) for k in range(sizes))
    parts = call_named(ctx, shaping.split, [ctx.need(0)], {"sizes": sizes, "axis": axis})
    return [ctx.call(structure.tuple_getitem, parts, k) for k in range(count)]


@op("Tile")
def _tile(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [call_named(ctx, shaping.tile, [ctx.need(0)], {"reps": _ints(ctx.static(1, "the repeats"))})]


@op("TopK")
def _topk(ctx: Ctx) -> Sequence[Optional[Node]]:
    k = int(ctx.attr("k")) if ctx.opset < 10 else int(_ints(ctx.static(1, "k"))[0])
    if not ctx.attr("sorted", 1):
        raise NodeError("unsorted TopK (anfir's topk sorts)")
    pair = call_named(ctx, indexing.topk, [ctx.need(0)], {"k": k, "axis": int(ctx.attr("axis", -1)),
                                                   "largest": bool(ctx.attr("largest", 1))})
    return [ctx.call(structure.tuple_getitem, pair, 0), ctx.call(structure.tuple_getitem, pair, 1)]


@op("Trilu")
def _trilu(ctx: Ctx) -> Sequence[Optional[Node]]:
    raw = ctx.static(1, "k")
    k = 0 if raw is None else int(raw.reshape(-1)[0])
    return [call_named(ctx, shaping.triu if ctx.attr("upper", 1) else shaping.tril, [ctx.need(0)], {"k": k})]


def _spatial(ctx: Ctx, kernel: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...], Any]:
    """Strides, dilations and the padding (ONNX begins-then-ends, or from auto_pad)."""
    n = len(kernel)
    strides = tuple(int(s) for s in ctx.attr("strides", [1] * n))
    dilations = tuple(int(d) for d in ctx.attr("dilations", [1] * n))
    auto = str(ctx.attr("auto_pad", "NOTSET"))
    if auto == "VALID":
        return strides, dilations, tuple([0] * (2 * n))
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        dims = _dims(ctx, 0, range(2, ctx.rank(0)))
        begins, ends = [], []
        for size, k, s, d in zip(dims, kernel, strides, dilations):
            total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
            small, big = total // 2, total - total // 2
            begins.append(small if auto == "SAME_UPPER" else big)
            ends.append(big if auto == "SAME_UPPER" else small)
        return strides, dilations, tuple(begins + ends)
    pads = tuple(int(p) for p in ctx.attr("pads", [0] * (2 * n)))
    return strides, dilations, pads


@op("Conv")
def _conv(ctx: Ctx) -> Sequence[Optional[Node]]:
    listed = ctx.attr("kernel_shape")
    kernel = tuple(int(k) for k in listed) if listed is not None else _dims(ctx, 1, range(2, ctx.rank(1)))
    strides, dilations, pads = _spatial(ctx, kernel)
    return [call_named(ctx, conv.conv, [ctx.need(0), ctx.need(1)],
                       {"b": ctx.input(2), "stride": strides, "padding": pads,
                        "dilation": dilations, "groups": int(ctx.attr("group", 1))})]


@op("ConvTranspose")
def _conv_transpose(ctx: Ctx) -> Sequence[Optional[Node]]:
    n = ctx.rank(1) - 2
    listed = ctx.attr("kernel_shape")
    kernel = tuple(int(k) for k in listed) if listed is not None else _dims(ctx, 1, range(2, n + 2))
    strides = tuple(int(s) for s in ctx.attr("strides", [1] * n))
    dilations = tuple(int(d) for d in ctx.attr("dilations", [1] * n))
    out_pad = [int(p) for p in ctx.attr("output_padding", [0] * n)]
    auto = str(ctx.attr("auto_pad", "NOTSET"))
    wanted = ctx.attr("output_shape")
    pads = [int(p) for p in ctx.attr("pads", [0] * (2 * n))]
    if wanted is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        # ONNX's rule: the padding that gives the output shape (input * stride for SAME).
        dims = _dims(ctx, 0, range(2, ctx.rank(0)))
        target = [int(v) for v in wanted][-n:] if wanted is not None else [d * s for d, s in zip(dims, strides)]
        pads = [0] * (2 * n)
        for i in range(n):
            total = strides[i] * (dims[i] - 1) + out_pad[i] + (kernel[i] - 1) * dilations[i] + 1 - target[i]
            if total < 0:
                # A bigger output than the kernel reaches: the rest is output padding.
                out_pad[i] -= total
                total = 0
            small, big = total // 2, total - total // 2
            pads[i], pads[n + i] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto == "VALID":
        pads = [0] * (2 * n)
    return [call_named(ctx, conv.conv_transpose, [ctx.need(0), ctx.need(1)],
                       {"b": ctx.input(2), "stride": strides, "padding": tuple(pads),
                        "output_padding": tuple(out_pad), "dilation": dilations,
                        "groups": int(ctx.attr("group", 1))})]


def _pool(prim: Primitive) -> OpRule:
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        if len(ctx.node.output) > 1 and ctx.node.output[1]:
            raise NodeError("the Indices output of MaxPool")
        kernel = tuple(int(k) for k in ctx.attr("kernel_shape"))
        strides, dilations, pads = _spatial(ctx, kernel)
        named: dict[str, Any] = {"kernel": kernel, "stride": strides, "padding": pads,
                                 "ceil_mode": bool(ctx.attr("ceil_mode", 0))}
        if prim is conv.max_pool:
            named["dilation"] = dilations
        else:
            if any(d != 1 for d in dilations):
                return [_dilated_avg_pool(ctx, kernel, strides, dilations, pads)]
            named["count_include_pad"] = bool(ctx.attr("count_include_pad", 0))
        return [call_named(ctx, prim, [ctx.need(0)], named)]
    return rule


@op("LpPool", 11)
def _lp_pool(ctx: Ctx) -> Sequence[Optional[Node]]:
    # (sum over the window of |x|^p)^(1/p): the window sum as an average including
    # the zero padding, times the window's size.
    p = float(ctx.attr("p", 2))
    kernel = tuple(int(k) for k in ctx.attr("kernel_shape"))
    strides, dilations, pads = _spatial(ctx, kernel)
    if any(d != 1 for d in dilations):
        raise NodeError("dilated LpPool")
    d = ctx.dtype(0)
    powered = ctx.call(arith.pow_, ctx.call(arith.abs_, ctx.need(0)), ctx.const(p, d))
    mean = call_named(ctx, conv.avg_pool, [powered], {"kernel": kernel, "stride": strides, "padding": pads,
                                                   "ceil_mode": bool(ctx.attr("ceil_mode", 0)),
                                                   "count_include_pad": True})
    total = ctx.call(arith.mul, mean, ctx.const(float(np.prod(kernel)), d))
    return [ctx.call(arith.pow_, total, ctx.const(1.0 / p, d))]


def _dilated_avg_pool(ctx: Ctx, kernel: Sequence[int], strides: Sequence[int], dilations: Sequence[int],
                      pads: Sequence[int]) -> Node:
    """A dilated average pool (anfir's avg_pool has no dilation): the window sums as a
    depthwise convolution with a kernel of ones, divided by the count of the elements
    each window covers (the same convolution of ones over the input or padded region)."""
    n = len(kernel)
    spatial = _dims(ctx, 0, range(2, 2 + n))
    shape = (None, _dim(ctx, 0, 1), *spatial)
    d = ctx.dtype(0)
    ceil = bool(ctx.attr("ceil_mode", 0))
    begins, ends = list(pads[:n]), list(pads[n:])
    extra = [0] * n
    for i in range(n):
        reach = (kernel[i] - 1) * dilations[i] + 1
        span = spatial[i] + begins[i] + ends[i] - reach
        count = (-(-span // strides[i]) if ceil else span // strides[i]) + 1
        if ceil and (count - 1) * strides[i] >= spatial[i] + begins[i]:
            count -= 1  # a last window that starts in the end padding is dropped
        extra[i] = max((count - 1) * strides[i] + reach - (spatial[i] + begins[i] + ends[i]), 0)
    numpy = BY_NAME[d].numpy
    window = {"stride": tuple(strides), "dilation": tuple(dilations)}
    ones_kernel = ctx.const(np.ones((shape[1], 1, *kernel), dtype=numpy))
    padding = tuple(begins + [e + x for e, x in zip(ends, extra)])
    total = call_named(ctx, conv.conv, [ctx.need(0), ones_kernel], {**window, "padding": padding, "groups": shape[1]})
    single = ctx.const(np.ones((1, 1, *kernel), dtype=numpy))
    if ctx.attr("count_include_pad", 0):
        # The explicit padding counts, the extension for ceil_mode does not.
        region = ctx.const(np.ones((1, 1, *[s + b + e for s, b, e in zip(spatial, begins, ends)]), dtype=numpy))
        covered = call_named(ctx, conv.conv, [region, single], {**window, "padding": tuple([0] * n + extra)})
    else:
        region = ctx.const(np.ones((1, 1, *spatial), dtype=numpy))
        covered = call_named(ctx, conv.conv, [region, single], {**window, "padding": padding})
    return ctx.call(arith.div, total, covered)


op("MaxPool")(_pool(conv.max_pool))
op("AveragePool")(_pool(conv.avg_pool))
op("GlobalAveragePool")(_unary(conv.global_avg_pool))
op("GlobalMaxPool")(_unary(conv.global_max_pool))


@op("BatchNormalization")
def _batch_norm(ctx: Ctx) -> Sequence[Optional[Node]]:
    if ctx.attr("training_mode", 0) or len([o for o in ctx.node.output if o]) > 1:
        return _batch_norm_training(ctx)
    return [call_named(ctx, conv.batch_norm, [ctx.need(0), ctx.need(1), ctx.need(2), ctx.need(3),
                                           ctx.need(4)], {"eps": float(ctx.attr("epsilon", 1e-5))})]


def _batch_norm_training(ctx: Ctx) -> list[Optional[Node]]:
    """Training mode: normalized by the batch's own mean and (population) variance over
    every axis but the channels; the running statistics updated with the momentum."""
    if ctx.opset < 14:
        raise NodeError("training-mode BatchNormalization before opset 14 (other outputs)")
    x = ctx.need(0)
    rank = ctx.rank(0)
    d = ctx.dtype(0)
    axes = tuple(a for a in range(rank) if a != 1)
    eps, momentum = float(ctx.attr("epsilon", 1e-5)), float(ctx.attr("momentum", 0.9))
    mean = ctx.call(tensor.mean, x, axis=axes, keepdims=True)
    var = ctx.call(reduce.var, x, axis=axes, keepdims=True)
    along = tuple(a for a in range(rank) if a != 1)

    def channels(node: Node) -> Node:  # a per-channel vector laid along axis 1
        return ctx.call(shaping.unsqueeze, node, axis=along)

    norm = ctx.call(arith.div, ctx.call(arith.sub, x, mean),
                    ctx.call(arith.sqrt, ctx.call(arith.add, var, ctx.const(eps, d))))
    y = ctx.call(arith.add, ctx.call(arith.mul, norm, channels(ctx.need(1))), channels(ctx.need(2)))
    keep, take = ctx.const(momentum, d), ctx.const(1.0 - momentum, d)
    flat_mean = ctx.call(tensor.reshape, mean, (-1,))
    flat_var = ctx.call(tensor.reshape, var, (-1,))
    running_mean = ctx.call(arith.add, ctx.call(arith.mul, ctx.need(3), keep), ctx.call(arith.mul, flat_mean, take))
    running_var = ctx.call(arith.add, ctx.call(arith.mul, ctx.need(4), keep), ctx.call(arith.mul, flat_var, take))
    return [y, running_mean, running_var]


# -- more operators, written over the library's primitives -----------------------------------------
def _scalar(ctx: Ctx, node: Node) -> Node:
    # A one-element tensor as a number (anfir's arange takes numbers): its sum.
    return ctx.call(tensor.sum_, node)


@op("Range", 11)
def _range(ctx: Ctx) -> Sequence[Optional[Node]]:
    # The length depends on the values: start and limit may be computed, the step
    # is taken statically (a graph input step specializes the model, see ``bind=``).
    raw = ctx.static(2, "the step")
    assert raw is not None
    step = raw.reshape(-1)[0].item()
    return [ctx.call(indexing.arange, _scalar(ctx, ctx.need(0)), _scalar(ctx, ctx.need(1)), step=step,
                     dtype=ctx.dtype(0))]


for _onnx, _formula in (("Asinh", "asinh"), ("Acosh", "acosh"), ("Atanh", "atanh")):
    def _inverse_hyperbolic(ctx: Ctx, formula: str = _formula) -> Sequence[Optional[Node]]:
        # No primitive: the logarithmic forms (exact to a few ulps away from the poles).
        x = ctx.need(0)
        d = ctx.dtype(0)
        one = ctx.const(1, d)
        if formula == "atanh":
            ratio = ctx.call(arith.div, ctx.call(arith.add, one, x), ctx.call(arith.sub, one, x))
            return [ctx.call(arith.mul, ctx.const(0.5, d), ctx.call(arith.log, ratio))]
        sq = ctx.call(arith.add if formula == "asinh" else arith.sub, ctx.call(arith.mul, x, x), one)
        return [ctx.call(arith.log, ctx.call(arith.add, x, ctx.call(arith.sqrt, sq)))]
    op(_onnx)(_inverse_hyperbolic)


@op("CumProd", 26)
def _cumprod(ctx: Ctx) -> Sequence[Optional[Node]]:
    raw = ctx.static(1, "the axis")
    assert raw is not None
    out = ctx.call(reduce.cumprod, ctx.need(0), axis=int(raw.reshape(-1)[0]),
                   exclusive=bool(ctx.attr("exclusive", 0)), reverse=bool(ctx.attr("reverse", 0)))
    return [ctx.call(tensor.cast, out, ctx.dtype(0))]


@op("EyeLike", 9)
def _eye_like(ctx: Ctx) -> Sequence[Optional[Node]]:
    shape = _input_shape(ctx, 0)
    if len(shape) != 2:
        raise NodeError(f"EyeLike of a tensor of shape {shape} (it takes a matrix)")
    to = ctx.attr("dtype")
    d = DTYPE_OF_ELEM.get(to) if to is not None else ctx.dtype(0)
    if d is None:
        raise NodeError(f"EyeLike of element type {to}, which anfir has no dtype for")
    return [ctx.const(np.eye(shape[0], shape[1], k=int(ctx.attr("k", 0)), dtype=BY_NAME[d].numpy))]


def _along(ctx: Ctx, values: np.ndarray, rank: int, axis: int) -> ValueNode:
    """A constant 1-D ``values`` laid along ``axis`` of a rank-``rank`` tensor (for broadcasting)."""
    return ctx.const(values.reshape([-1 if i == axis else 1 for i in range(rank)]))


@op("OneHot", 9)
def _one_hot(ctx: Ctx) -> Sequence[Optional[Node]]:
    raw = ctx.static(1, "the depth")
    assert raw is not None
    depth = int(raw.reshape(-1)[0])
    values = ctx.need(2)
    rank = ctx.rank(0) + 1
    axis = int(ctx.attr("axis", -1)) % rank
    index = ctx.call(tensor.cast, ctx.need(0), "i64")
    # Negative indices count from the end of the depth.
    negative = ctx.call(arith.lt, index, ctx.const(0, "i64"))
    index = ctx.call(tensor.where, negative, ctx.call(arith.add, index, ctx.const(depth, "i64")), index)
    index = ctx.call(shaping.unsqueeze, index, axis=axis)
    hot = ctx.call(arith.eq, index, _along(ctx, np.arange(depth, dtype=np.int64), rank, axis))
    off = ctx.call(indexing.gather, values, ctx.const(0, "i64"), axis=0)
    on = ctx.call(indexing.gather, values, ctx.const(1, "i64"), axis=0)
    return [ctx.call(tensor.where, hot, on, off)]


@op("Hardmax")
def _hardmax(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    d = ctx.dtype(0)
    if ctx.opset >= 13:
        rank = ctx.rank(0)
        axis = int(ctx.attr("axis", -1)) % rank
        length = _dim(ctx, 0, axis)
        flat, shape = x, None
    else:
        # Before opset 13 the input is seen as 2-d, as Softmax.
        shape = _input_shape(ctx, 0)
        cut = int(ctx.attr("axis", 1)) % max(len(shape), 1)
        rows, length = int(np.prod(shape[:cut])), int(np.prod(shape[cut:]))
        flat, rank, axis = ctx.call(tensor.reshape, x, (rows, length)), 2, 1
    # The first largest element along the axis (ties: the lowest index, as ONNX).
    top = ctx.call(reduce.argmax, flat, axis=axis, keepdims=True)
    hot = ctx.call(arith.eq, top, _along(ctx, np.arange(length, dtype=np.int64), rank, axis))
    out = ctx.call(tensor.cast, hot, d)
    return [out if shape is None else ctx.call(tensor.reshape, out, shape)]


@op("LpNormalization")
def _lp_normalization(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    p = int(ctx.attr("p", 2))
    axis = int(ctx.attr("axis", -1))
    if p == 1:
        norm = ctx.call(tensor.sum_, ctx.call(arith.abs_, x), axis=axis, keepdims=True)
    elif p == 2:
        norm = ctx.call(arith.sqrt, ctx.call(tensor.sum_, ctx.call(arith.mul, x, x), axis=axis, keepdims=True))
    else:
        raise NodeError(f"LpNormalization with p={p} (ONNX allows 1 and 2)")
    # A zero norm leaves the zeros as they are (ONNX's reference), not 0/0.
    zero = ctx.call(arith.eq, norm, ctx.const(0, ctx.dtype(0)))
    safe = ctx.call(tensor.where, zero, ctx.const(1, ctx.dtype(0)), norm)
    return [ctx.call(arith.div, x, safe)]


@op("LRN")
def _lrn(ctx: Ctx) -> Sequence[Optional[Node]]:
    # x / (bias + alpha/size * sum of squares over a window of channels) ** beta;
    # the window sum as the sum of `size` shifted slices of the zero-padded squares.
    x = ctx.need(0)
    d = ctx.dtype(0)
    rank = ctx.rank(0)
    size = int(ctx.attr("size"))
    alpha, beta, bias = float(ctx.attr("alpha", 1e-4)), float(ctx.attr("beta", 0.75)), float(ctx.attr("bias", 1.0))
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2
    channels = _dim(ctx, 0, 1)
    pads = [0] * (2 * rank)
    pads[1], pads[rank + 1] = before, after
    padded = ctx.call(shaping.pad, ctx.call(arith.mul, x, x), pads=tuple(pads), mode="constant", value=0)
    total: Optional[Node] = None
    for k in range(size):
        piece = ctx.call(shaping.slice_, padded, starts=(k,), ends=(k + channels,), axes=(1,))
        total = piece if total is None else ctx.call(arith.add, total, piece)
    assert total is not None
    base = ctx.call(arith.add, ctx.const(bias, d), ctx.call(arith.mul, ctx.const(alpha / size, d), total))
    return [ctx.call(arith.div, x, ctx.call(arith.pow_, base, ctx.const(beta, d)))]


def _positive_indices(ctx: Ctx, index: Node, length: Node) -> Node:
    negative = ctx.call(arith.lt, index, ctx.const(0, "i64"))
    return ctx.call(tensor.where, negative, ctx.call(arith.add, index, length), index)


def _scatter_elements(ctx: Ctx, axis: int, reduction: str) -> Node:
    x, updates = ctx.need(0), ctx.need(2)
    rank = ctx.rank(0)
    axis %= rank
    index = ctx.call(tensor.cast, ctx.need(1), "i64")
    length = ctx.call(indexing.gather, ctx.call(tensor.array, ctx.call(tensor.shape, x)), ctx.const(axis, "i64"), axis=0)
    index = _positive_indices(ctx, index, ctx.call(tensor.cast, length, "i64"))
    if reduction == "add":
        return ctx.call(indexing.scatter_add, x, index, updates, axis=axis)
    if reduction != "none":
        # mul, max, min: one element at a time, at positions known when importing.
        raw = ctx.static(1, "the indices (scattered with a reduction)")
        assert raw is not None
        shape = _input_shape(ctx, 0)
        where = np.indices(raw.shape).reshape(raw.ndim, -1).T.copy()
        where[:, axis] = np.where(raw.reshape(-1) < 0, raw.reshape(-1) + shape[axis], raw.reshape(-1))
        flat = ctx.call(tensor.reshape, updates, (-1,))
        return _scatter_in_order(ctx, x, where, lambda k: ctx.call(indexing.gather, flat, ctx.const(np.array([k])), axis=0),
                                 reduction)
    # Replacing: the updates summed into zeros where the indices point, the rest of x
    # kept (ONNX leaves repeated indices undefined without a reduction).
    zeros = ctx.call(structure.zeros_like, x)
    placed = ctx.call(indexing.scatter_add, zeros, index, updates, axis=axis)
    marks = ctx.call(indexing.scatter_add, ctx.call(tensor.cast, zeros, "i64"), index,
                     ctx.call(tensor.ones_like, ctx.call(tensor.cast, updates, "i64")), axis=axis)
    return ctx.call(tensor.where, ctx.call(arith.gt, marks, ctx.const(0, "i64")), placed, x)


@op("ScatterElements", 11)
def _scatter_elements_rule(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [_scatter_elements(ctx, int(ctx.attr("axis", 0)), str(ctx.attr("reduction", "none")))]


@op("Scatter", 9)
def _scatter_rule(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [_scatter_elements(ctx, int(ctx.attr("axis", 0)), "none")]


@op("ScatterND", 11)
def _scatter_nd_rule(ctx: Ctx) -> Sequence[Optional[Node]]:
    x, index, updates = ctx.need(0), ctx.need(1), ctx.need(2)
    reduction = str(ctx.attr("reduction", "none"))
    if reduction == "none":
        return [ctx.call(indexing.scatter_nd, x, index, updates)]
    if reduction == "add":
        # gather_nd's gradient is the scatter-add of its cotangent into zeros of x.
        return [ctx.call(arith.add, x, ctx.call(indexing.gather_nd_grad, updates, x, index))]
    raw = ctx.static(1, "the indices (scattered with a reduction)")
    assert raw is not None
    depth = raw.shape[-1]
    where = raw.reshape(-1, depth)
    tail = _input_shape(ctx, 0)[depth:]
    flat = ctx.call(tensor.reshape, updates, (-1, *tail))
    return [_scatter_in_order(ctx, x, where, lambda k: ctx.call(indexing.gather, flat, ctx.const(np.array([k])), axis=0),
                              reduction)]


SCATTER_LIMIT = 4096
"""The most index tuples a scatter with a mul/max/min reduction is unrolled for."""


def _scatter_in_order(ctx: Ctx, x: Node, where: np.ndarray, update: Callable[[int], Node],
                      reduction: str) -> Node:
    """x with each ``update(k)`` combined (mul, max, min) into the place ``where[k]``, in
    order (repeated places combine every update, as ONNX's reductions do)."""
    combine = {"mul": arith.mul, "max": arith.maximum, "min": arith.minimum}.get(reduction)
    if combine is None:
        raise NodeError(f"scatter reduction {reduction!r}")
    if len(where) > SCATTER_LIMIT:
        raise NodeError(f"a scatter with reduction {reduction!r} of {len(where)} places")
    out = x
    for k, place in enumerate(where):
        index = ctx.const(np.asarray(place, dtype=np.int64).reshape(1, -1))
        old = ctx.call(indexing.gather_nd, out, index)
        out = ctx.call(indexing.scatter_nd, out, index, ctx.call(tensor.cast, ctx.call(combine, old, update(k)), ctx.dtype(0)))
    return out


@op("Compress", 9)
def _compress(ctx: Ctx) -> Sequence[Optional[Node]]:
    # The result's length is the number of true conditions: taken statically.
    raw = ctx.static(1, "the condition")
    assert raw is not None
    picked = np.nonzero(raw.reshape(-1).astype(bool))[0].astype(np.int64)
    x = ctx.need(0)
    axis = ctx.attr("axis")
    if axis is None:
        x = ctx.call(tensor.reshape, x, (-1,))
        axis = 0
    return [ctx.call(indexing.gather, x, ctx.const(picked), axis=int(axis))]


# -- Resize: one interpolation matrix per resized axis ---------------------------------------------
def _resize_taps(mode: str, ratio: float, scale: float, antialias: bool, a: float, nearest: str) -> np.ndarray:
    """The weights of the neighbouring input elements of one output element.

    ``ratio`` is the source coordinate's distance past its lower neighbour, in
    (0, 1] (1 when the coordinate is an integer); the taps then start at the
    ``len // 2`` - 1 input elements before it (ONNX's neighbour rule)."""
    if mode == "nearest":
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        upper = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                 "floor": False, "ceil": True}.get(nearest)
        if upper is None:
            raise NodeError(f"nearest_mode {nearest!r}")
        return np.array([0.0, 1.0]) if upper else np.array([1.0, 0.0])
    if mode == "linear":
        if not antialias:
            return np.array([1.0 - ratio, ratio])
        # A triangle filter widened by 1/scale when shrinking.
        s = min(scale, 1.0)
        start = int(np.floor(-1 / s) + 1)
        taps = np.clip(1 - np.abs((np.arange(start, 2 - start) - ratio) * s), 0, 1)
        return taps / taps.sum()
    if mode == "cubic":
        def keys(t: float) -> float:
            # Keys' cubic convolution kernel with parameter a.
            t = abs(t)
            if t <= 1:
                return (a + 2) * t ** 3 - (a + 3) * t ** 2 + 1
            if t < 2:
                return a * t ** 3 - 5 * a * t ** 2 + 8 * a * t - 4 * a
            return 0.0
        if not antialias:
            return np.array([keys(ratio + 1), keys(ratio), keys(1 - ratio), keys(2 - ratio)])
        s = min(scale, 1.0)
        start = int(np.floor(-2 / s) + 1)
        taps = np.array([keys(s * (i - ratio)) for i in range(start, 2 - start)])
        return taps / taps.sum()
    raise NodeError(f"Resize mode {mode!r}")


def resize_matrix(n_in: int, n_out: int, scale: float, mode: str, coords: str,
                  roi: tuple[float, float], antialias: bool = False, cubic_a: float = -0.75,
                  nearest: str = "round_prefer_floor", exclude_outside: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
    """The (n_out, n_in) matrix that resizes one axis as ONNX's Resize does, and which
    output positions fall outside the input (``tf_crop_and_resize`` extrapolates them)."""
    width = scale * n_in  # ONNX divides by the unrounded output length
    y = np.arange(n_out, dtype=np.float64)
    if coords == "align_corners":
        x = np.zeros(n_out) if width == 1 else y * (n_in - 1) / (width - 1)
    elif coords == "asymmetric":
        x = y / scale
    elif coords == "tf_crop_and_resize":
        lo, hi = roi
        x = np.full(n_out, (hi - lo) * (n_in - 1) / 2) if width == 1 else y * (hi - lo) * (n_in - 1) / (width - 1)
        x = x + lo * (n_in - 1)
    elif coords == "pytorch_half_pixel":
        x = np.full(n_out, -0.5) if width == 1 else (y + 0.5) / scale - 0.5
    elif coords == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif coords == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise NodeError(f"coordinate_transformation_mode {coords!r}")
    outside = (x < 0) | (x > n_in - 1) if coords == "tf_crop_and_resize" else np.zeros(n_out, bool)
    matrix = np.zeros((n_out, n_in))
    for i in range(n_out):
        low = int(np.floor(x[i]))
        ratio = 1.0 if x[i] == low else float(x[i] - low)
        taps = _resize_taps(mode, ratio, scale, antialias, cubic_a, nearest)
        n = len(taps)
        frac = x[i] - low
        if n % 2 == 0:
            first = low - n // 2 + (0 if frac == 0 else 1)
        else:
            first = low - (n - 1) // 2 + (0 if frac <= 0.5 else 1)
        where = np.arange(first, first + n)
        if exclude_outside:
            taps = np.where((where < 0) | (where >= n_in), 0.0, taps)
            total = taps.sum()
            taps = taps / (total if total != 0 else 1.0)
        # Positions past the ends read the edge element (ONNX pads by repeating it).
        np.add.at(matrix[i], np.clip(where, 0, n_in - 1), taps)
    return matrix, outside


def _scaled(scale: float, n: Optional[int]) -> Optional[int]:
    # The output length of an axis: floor(scale * n); a symbolic axis only unscaled.
    if n is None:
        if scale != 1.0:
            raise NodeError("resizing an axis of symbolic length")
        return None
    return int(np.floor(scale * n))


def _resize_plan(ctx: Ctx, shape: tuple[Optional[int], ...]
                 ) -> tuple[list[float], list[Optional[int]], list[float]]:
    """Per axis: the scale, the output length and the roi (starts then ends)."""
    rank = len(shape)
    if ctx.node.op_type == "Upsample" or ctx.opset < 11:
        raw = ctx.attr("scales") if ctx.opset < 9 else ctx.static(1, "the scales")
        scales = [float(s) for s in np.asarray(raw).reshape(-1)]
        return scales, [_scaled(s, n) for s, n in zip(scales, shape)], [0.0] * rank + [1.0] * rank
    listed = ctx.attr("axes")
    axes = list(range(rank)) if listed is None else [int(a) % rank for a in listed]
    raw_roi = ctx.static(1, "the roi")
    roi = [0.0] * rank + [1.0] * rank
    if raw_roi is not None and raw_roi.size:
        flat = [float(v) for v in raw_roi.reshape(-1)]
        for k, a in enumerate(axes):
            roi[a], roi[rank + a] = flat[k], flat[len(axes) + k]
    raw_scales = ctx.static(2, "the scales")
    raw_sizes = ctx.static(3, "the sizes")
    scales = [1.0] * rank
    sizes: list[Optional[int]] = list(shape)
    if raw_sizes is not None and raw_sizes.size:
        for k, a in enumerate(axes):
            sizes[a] = int(raw_sizes.reshape(-1)[k])
        if any(shape[a] is None for a in axes):
            raise NodeError("Resize to given sizes of an axis of symbolic length")
        scales = [1.0 if shape[i] is None else sizes[i] / shape[i] for i in range(rank)]  # type: ignore[operator]
        policy = str(ctx.attr("keep_aspect_ratio_policy", "stretch"))
        if policy != "stretch":
            pick = min if policy == "not_larger" else max
            common = pick(scales[a] for a in axes)
            scales = [common if i in axes else 1.0 for i in range(rank)]
            sizes = [int(common * shape[i] + 0.5) if i in axes else shape[i] for i in range(rank)]  # type: ignore[operator]
    elif raw_scales is not None and raw_scales.size:
        for k, a in enumerate(axes):
            scales[a] = float(raw_scales.reshape(-1)[k])
        sizes = [_scaled(s, n) for s, n in zip(scales, shape)]
    else:
        raise NodeError("Resize needs scales or sizes")
    return scales, sizes, roi


def _resize(ctx: Ctx) -> Sequence[Optional[Node]]:
    # The axes not resized may be symbolic (a batch); the resized ones are static.
    shape = _known_dims(ctx, 0)
    rank = len(shape)
    d = ctx.dtype(0)
    scales, sizes, roi = _resize_plan(ctx, shape)
    mode = str(ctx.attr("mode", "nearest"))
    old = ctx.node.op_type == "Upsample" or ctx.opset < 11
    coords = "asymmetric" if old else str(ctx.attr("coordinate_transformation_mode", "half_pixel"))
    nearest = "floor" if old else str(ctx.attr("nearest_mode", "round_prefer_floor"))
    extrapolation = float(ctx.attr("extrapolation_value", 0.0))
    x = ctx.need(0)
    wide = mode != "nearest" or coords == "tf_crop_and_resize"
    if wide:
        x = ctx.call(tensor.cast, x, "f64")  # ONNX interpolates in double precision
    letters = "abcdefghijklmnopqrstuvwxyz"
    for axis in range(rank):
        if scales[axis] == 1.0 and sizes[axis] == shape[axis] and roi[axis] == 0.0 and roi[rank + axis] == 1.0:
            continue
        n_in, n_out = shape[axis], sizes[axis]
        if n_in is None or n_out is None:
            raise NodeError("resizing an axis of symbolic length")
        if n_out == 0:
            raise NodeError("Resize to an empty axis")
        matrix, outside = resize_matrix(
            n_in, n_out, scales[axis], "linear" if mode == "bilinear" else mode, coords,
            (roi[axis], roi[rank + axis]), bool(ctx.attr("antialias", 0)),
            float(ctx.attr("cubic_coeff_a", -0.75)), nearest, bool(ctx.attr("exclude_outside", 0)))
        if not wide:
            # Nearest: each output element copies one input element (any dtype, exactly).
            x = ctx.call(indexing.gather, x, ctx.const(np.argmax(matrix, axis=1).astype(np.int64)), axis=axis)
            continue
        src = letters[:rank]
        dst = src[:axis] + "z" + src[axis + 1:]
        x = ctx.call(nn.einsum, f"{src},z{src[axis]}->{dst}", x, ctx.const(matrix))
        if outside.any():
            x = ctx.call(tensor.where, _along(ctx, outside, rank, axis), ctx.const(extrapolation, "f64"), x)
    if wide:
        if not is_float(d):
            # Back to an integer type as ONNX does: rounded, then saturated.
            low, high = int_range(numpy_dtype(d))  # (int4 too: numpy's iinfo lacks it)
            x = ctx.call(elementwise.clip, ctx.call(elementwise.round_, x), ctx.const(float(low), "f64"),
                         ctx.const(float(high), "f64"))
        x = ctx.call(tensor.cast, x, d)
    elif x is ctx.input(0):
        x = ctx.call(structure.identity, x)
    return [x]


op("Resize", 10)(_resize)
op("Upsample", 7)(_resize)


# -- quantization ------------------------------------------------------------------------------------
def _quant_param(ctx: Ctx, index: int, axis: int, block: int) -> Optional[Node]:
    """A scale or zero point laid out to broadcast against x: as it is (one per
    tensor), along ``axis`` (one per slice), or repeated over blocks of ``block``."""
    node = ctx.input(index)
    if node is None:
        return None
    rank = ctx.rank(0)
    if block > 0:
        length = _dim(ctx, 0, axis)
        return ctx.call(indexing.gather, node, ctx.const(np.arange(length, dtype=np.int64) // block), axis=axis)
    if ctx.rank(index) == 1 and rank > 1:
        return ctx.call(shaping.unsqueeze, node, axis=tuple(i for i in range(rank) if i != axis))
    return node


def _quant_axis(ctx: Ctx) -> tuple[int, int]:
    rank = max(ctx.rank(0), 1)
    return int(ctx.attr("axis", 1)) % rank, int(ctx.attr("block_size", 0))


@op("QuantizeLinear", 10)
def _quantize_linear(ctx: Ctx) -> Sequence[Optional[Node]]:
    # saturate(round_half_even(x / scale) + zero_point) in the zero point's type.
    axis, block = _quant_axis(ctx)
    scale = _quant_param(ctx, 1, axis, block)
    zero = _quant_param(ctx, 2, axis, block)
    to = ctx.attr("output_dtype", 0)
    if ctx.input(2) is not None:
        d = ctx.dtype(2)
    elif to:
        if to not in DTYPE_OF_ELEM:
            raise NodeError(f"QuantizeLinear to element type {to}, which anfir has no dtype for")
        d = DTYPE_OF_ELEM[to]
    else:
        d = "u8"
    x = ctx.need(0)
    xd = ctx.dtype(0)
    assert scale is not None
    if is_float(d):
        # To a narrow float, as onnx.reference: x / scale converted as Cast does (a float8
        # saturating unless saturate=0, its zero point being 0); FLOAT4E2M1 adds its zero point.
        if d not in SATURATING and d != "f4e2m1":
            raise NodeError(f"QuantizeLinear to {d}")
        q = ctx.call(arith.div, x, ctx.call(tensor.cast, scale, xd))
        if d in SATURATING and ctx.attr("saturate", 1):
            q = _saturated(ctx, q, xd, d)
        elif d == "f4e2m1" and zero is not None:
            q = ctx.call(arith.add, q, ctx.call(tensor.cast, zero, xd))
        return [ctx.call(tensor.cast, q, d)]
    q = ctx.call(elementwise.round_, ctx.call(arith.div, x, ctx.call(tensor.cast, scale, xd)))
    if zero is not None:
        q = ctx.call(arith.add, q, ctx.call(tensor.cast, zero, xd))
    low, high = int_range(numpy_dtype(d))  # (int4 too: numpy's iinfo lacks it)
    q = ctx.call(arith.minimum, ctx.call(arith.maximum, q, ctx.const(low, xd)), ctx.const(high, xd))
    return [ctx.call(tensor.cast, q, d)]


@op("DequantizeLinear", 10)
def _dequantize_linear(ctx: Ctx) -> Sequence[Optional[Node]]:
    # (x - zero_point) * scale, in the scale's type.
    axis, block = _quant_axis(ctx)
    scale = _quant_param(ctx, 1, axis, block)
    zero = _quant_param(ctx, 2, axis, block)
    assert scale is not None
    d = ctx.dtype(1)
    to = ctx.attr("output_dtype", 0)
    x = ctx.call(tensor.cast, ctx.need(0), "f32")
    if zero is not None:
        x = ctx.call(arith.sub, x, ctx.call(tensor.cast, zero, "f32"))
    out = ctx.call(arith.mul, x, ctx.call(tensor.cast, scale, "f32"))
    if to and DTYPE_OF_ELEM.get(to) is not None:
        d = DTYPE_OF_ELEM[to]
    return [ctx.call(tensor.cast, out, d)]


# -- recurrent networks (RNN, GRU, LSTM), unrolled over a static sequence length -------------------
def _activation(ctx: Ctx, name: str, alpha: Optional[float], beta: Optional[float]) -> Callable[[Node], Node]:
    """One of the activation functions the recurrent ops name."""
    d = ctx.dtype(0)
    if name == "Sigmoid":
        return lambda v: ctx.call(arith.sigmoid, v)
    if name == "Tanh":
        return lambda v: ctx.call(arith.tanh, v)
    if name == "Relu":
        return lambda v: ctx.call(arith.relu, v)
    if name == "HardSigmoid":
        a, b = 0.2 if alpha is None else alpha, 0.5 if beta is None else beta
        return lambda v: ctx.call(elementwise.hard_sigmoid, v, alpha=a, beta=b)
    if name == "LeakyRelu":
        a = 0.01 if alpha is None else alpha
        return lambda v: ctx.call(elementwise.leaky_relu, v, alpha=a)
    if name == "ScaledTanh":
        a, b = 1.0 if alpha is None else alpha, 1.0 if beta is None else beta
        return lambda v: ctx.call(arith.mul, ctx.const(a, d), ctx.call(arith.tanh, ctx.call(arith.mul, ctx.const(b, d), v)))
    if name == "Affine":
        a, b = 1.0 if alpha is None else alpha, 0.0 if beta is None else beta
        return lambda v: ctx.call(arith.add, ctx.call(arith.mul, ctx.const(a, d), v), ctx.const(b, d))
    raise NodeError(f"the activation {name!r}")


def _recurrent(ctx: Ctx, gates: int, defaults: Sequence[str]) -> list[Optional[Node]]:
    """RNN (1 gate), GRU (3) and LSTM (4): each time step built in line, per direction."""
    layout = int(ctx.attr("layout", 0))
    x = ctx.need(0)
    if layout:
        x = ctx.call(tensor.transpose, x, (1, 0, 2))
    # Only the number of steps must be static (the loop is unrolled); the batch
    # may be symbolic (torch.onnx.export's dynamic batch): the zero initial
    # state takes its size from x.
    steps = _dim(ctx, 0, 1 if layout else 0)
    hidden = int(ctx.attr("hidden_size"))
    direction = str(ctx.attr("direction", "forward"))
    dirs = 2 if direction == "bidirectional" else 1
    d = ctx.dtype(0)
    raw_lens = ctx.static(4, "the sequence lengths") if ctx.input(4) is not None else None
    if raw_lens is not None and not np.all(raw_lens == steps):
        raise NodeError("sequences of different lengths (sequence_lens)")
    names = [str(a) for a in ctx.attr("activations", [])] or list(defaults) * dirs
    alphas, betas = ctx.attr("activation_alpha", []), ctx.attr("activation_beta", [])
    per = len(defaults)
    acts = [_activation(ctx, n, alphas[k] if k < len(alphas) else None, betas[k] if k < len(betas) else None)
            for k, n in enumerate(names)]
    clip = ctx.attr("clip")
    ys: list[list[Node]] = []
    finals_h: list[Node] = []
    finals_c: list[Node] = []
    for k in range(dirs):
        pick = ctx.const(k, "i64")
        w = ctx.call(tensor.transpose, ctx.call(indexing.gather, ctx.need(1), pick, axis=0))
        r = ctx.call(tensor.transpose, ctx.call(indexing.gather, ctx.need(2), pick, axis=0))
        bias = ctx.input(3)
        if bias is not None:
            both = ctx.call(indexing.gather, bias, pick, axis=0)
            halves = call_named(ctx, shaping.split, [both], {"sizes": 2, "axis": 0})
            wb, rb = (ctx.call(structure.tuple_getitem, halves, i) for i in range(2))
        else:
            wb = rb = ctx.const(np.zeros(gates * hidden, dtype=BY_NAME[d].numpy))
        # (batch, 1) zeros from x's first step, broadcast against (1, hidden):
        # shapes inference follows, with a symbolic batch.
        column = ctx.call(shaping.slice_, ctx.call(structure.zeros_like, ctx.call(indexing.gather, x, ctx.const(0, "i64"), axis=0)),
                          starts=(0,), ends=(1,), axes=(1,))
        zeros = ctx.call(arith.add, column, ctx.const(np.zeros((1, hidden), dtype=BY_NAME[d].numpy)))
        h = zeros if ctx.input(5) is None else ctx.call(indexing.gather, ctx.need(5), pick, axis=0)
        c = zeros if ctx.input(6) is None else ctx.call(indexing.gather, ctx.need(6), pick, axis=0)
        peep = None if ctx.input(7) is None or gates != 4 else ctx.call(indexing.gather, ctx.need(7), pick, axis=0)
        f, g = acts[per * k], acts[per * k + 1] if per > 1 else acts[per * k]
        act_h = acts[per * k + 2] if per > 2 else g
        reverse = direction == "reverse" or k == 1
        outs: list[Node] = [zeros] * steps
        for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
            xt = ctx.call(indexing.gather, x, ctx.const(t, "i64"), axis=0)
            xw = ctx.call(arith.add, ctx.call(tensor.matmul, xt, w), wb)

            def part(v: Node, i: int) -> Node:
                return ctx.call(shaping.slice_, v, starts=(i * hidden,), ends=((i + 1) * hidden,), axes=(1,))

            def clipped(v: Node) -> Node:
                if clip is None:
                    return v
                return ctx.call(elementwise.clip, v, ctx.const(-float(clip), d), ctx.const(float(clip), d))

            if gates == 1:
                hr = ctx.call(arith.add, ctx.call(tensor.matmul, h, r), rb)
                h = f(clipped(ctx.call(arith.add, xw, hr)))
            elif gates == 3:
                hr = ctx.call(arith.add, ctx.call(tensor.matmul, h, r), rb)
                z = f(clipped(ctx.call(arith.add, part(xw, 0), part(hr, 0))))
                rt = f(clipped(ctx.call(arith.add, part(xw, 1), part(hr, 1))))
                if ctx.attr("linear_before_reset", 0):
                    cand = ctx.call(arith.mul, rt, part(hr, 2))
                else:
                    rh = ctx.call(tensor.matmul, ctx.call(arith.mul, rt, h), part_w(ctx, r, 2, hidden))
                    cand = ctx.call(arith.add, rh, part(rb_row(ctx, rb), 2))
                hh = g(clipped(ctx.call(arith.add, part(xw, 2), cand)))
                one = ctx.const(1, d)
                h = ctx.call(arith.add, ctx.call(arith.mul, ctx.call(arith.sub, one, z), hh), ctx.call(arith.mul, z, h))
            else:
                hr = ctx.call(arith.add, ctx.call(tensor.matmul, h, r), rb)
                pre = ctx.call(arith.add, xw, hr)
                gi, go, gf, gc = (part(pre, i) for i in range(4))
                if peep is not None:
                    pi, po, pf = (ctx.call(shaping.slice_, peep, starts=(i * hidden,), ends=((i + 1) * hidden,), axes=(0,))
                                  for i in range(3))
                    gi = ctx.call(arith.add, gi, ctx.call(arith.mul, pi, c))
                    gf = ctx.call(arith.add, gf, ctx.call(arith.mul, pf, c))
                it = f(clipped(gi))
                ft = ctx.call(arith.sub, ctx.const(1, d), it) if ctx.attr("input_forget", 0) else f(clipped(gf))
                c = ctx.call(arith.add, ctx.call(arith.mul, ft, c), ctx.call(arith.mul, it, g(clipped(gc))))
                if peep is not None:
                    go = ctx.call(arith.add, go, ctx.call(arith.mul, po, c))
                h = ctx.call(arith.mul, f(clipped(go)), act_h(c))
            outs[t] = h
        ys.append(outs)
        finals_h.append(h)
        finals_c.append(c)
    # Y: (steps, directions, batch, hidden); Y_h, Y_c: (directions, batch, hidden).
    per_step = [ctx.call(shaping.stack, ctx.call(structure.make_tuple, *[ys[k][t] for k in range(dirs)]), axis=0)
                for t in range(steps)]
    y = ctx.call(shaping.stack, ctx.call(structure.make_tuple, *per_step), axis=0)
    y_h = ctx.call(shaping.stack, ctx.call(structure.make_tuple, *finals_h), axis=0)
    y_c = ctx.call(shaping.stack, ctx.call(structure.make_tuple, *finals_c), axis=0)
    if layout:
        y = ctx.call(tensor.transpose, y, (2, 0, 1, 3))
        y_h = ctx.call(tensor.transpose, y_h, (1, 0, 2))
        y_c = ctx.call(tensor.transpose, y_c, (1, 0, 2))
    results: list[Optional[Node]] = [y, y_h, y_c]
    return results[:max(len(ctx.node.output), 1)]


def part_w(ctx: Ctx, r: Node, i: int, hidden: int) -> Node:
    """Columns ``i*hidden ... (i+1)*hidden`` of a transposed recurrence weight."""
    return ctx.call(shaping.slice_, r, starts=(i * hidden,), ends=((i + 1) * hidden,), axes=(1,))


def rb_row(ctx: Ctx, rb: Node) -> Node:
    """A bias vector as one row (its gates then slice along axis 1)."""
    return ctx.call(shaping.unsqueeze, rb, axis=0)


op("RNN", 7)(lambda ctx: _recurrent(ctx, 1, ("Tanh",)))
op("GRU", 7)(lambda ctx: _recurrent(ctx, 3, ("Sigmoid", "Tanh")))
op("LSTM", 7)(lambda ctx: _recurrent(ctx, 4, ("Sigmoid", "Tanh", "Tanh")))


@op("SplitToSequence", 11)
def _split_to_sequence(ctx: Ctx) -> Sequence[Optional[Node]]:
    # A tuple of the pieces: by the given sizes, or (none given) pieces of 1, each
    # squeezed unless keepdims.
    rank = ctx.rank(0)
    axis = int(ctx.attr("axis", 0)) % rank
    raw = ctx.static(1, "the sizes")
    length = _dim(ctx, 0, axis)
    if raw is None:
        sizes: tuple[int, ...] = (1,) * length
    elif raw.ndim == 0:
        piece = int(raw)
        sizes = tuple(min(piece, length - k) for k in range(0, length, piece))
    else:
        sizes = _ints(raw)
    parts = call_named(ctx, shaping.split, [ctx.need(0)], {"sizes": sizes, "axis": axis})
    items = [ctx.call(structure.tuple_getitem, parts, k) for k in range(len(sizes))]
    if raw is None and not ctx.attr("keepdims", 1):
        items = [ctx.call(shaping.squeeze, item, axis=axis) for item in items]
    return [ctx.call(structure.make_tuple, *items)]


@op("ReverseSequence", 10)
def _reverse_sequence(ctx: Ctx) -> Sequence[Optional[Node]]:
    # Each batch element's first length steps reversed: a gather_elements by
    # indices computed from the (static) lengths.
    shape = _input_shape(ctx, 0)
    time_axis, batch_axis = int(ctx.attr("time_axis", 0)), int(ctx.attr("batch_axis", 1))
    raw = ctx.static(1, "the sequence lengths")
    assert raw is not None
    steps = np.arange(shape[time_axis])
    index = np.zeros(shape, dtype=np.int64)
    for b, n in enumerate(_ints(raw)):
        order = np.where(steps < n, n - 1 - steps, steps)
        view = [1] * len(shape)
        view[time_axis] = shape[time_axis]
        where = [slice(None)] * len(shape)
        where[batch_axis] = slice(b, b + 1)
        index[tuple(where)] = np.broadcast_to(order.reshape(view), index[tuple(where)].shape)
    return [ctx.call(indexing.gather_elements, ctx.need(0), ctx.const(index), axis=time_axis)]


def _inverse_real_dft(ctx: Ctx, x: Node, axis: int, n: int, length: int, d: str) -> Node:
    """x_j = (X_0 + 2 sum_k (Re X_k cos - Im X_k sin)(2 pi j k / L) [+ X_L/2]) / L, the
    imaginary parts of X_0 and of the Nyquist term ignored, as numpy's irfft."""
    rank = ctx.rank(0)
    inner = rank - 1
    used = min(n, length // 2 + 1)
    re = ctx.call(indexing.gather, x, ctx.const(0, "i64"), axis=rank - 1)
    im = ctx.call(indexing.gather, x, ctx.const(1, "i64"), axis=rank - 1) if _dim(ctx, 0, rank - 1) == 2 else None
    if used < n:
        re = ctx.call(shaping.slice_, re, starts=(0,), ends=(used,), axes=(axis,))
        im = None if im is None else ctx.call(shaping.slice_, im, starts=(0,), ends=(used,), axes=(axis,))
    j = np.arange(length).reshape(-1, 1)
    k = np.arange(used).reshape(1, -1)
    weight = np.where((k == 0) | (2 * k == length), 1.0, 2.0) / length
    angle = 2 * np.pi * ((j * k) % length) / length
    letters = "abcdefghijklmnopqrstuvwxy"[:inner]
    spec = f"{letters},z{letters[axis]}->{letters[:axis]}z{letters[axis + 1:]}"
    out = ctx.call(nn.einsum, spec, re, ctx.const(weight * np.cos(angle)))
    if im is not None:
        sine = np.where((k == 0) | (2 * k == length), 0.0, weight * np.sin(angle))
        out = ctx.call(arith.sub, out, ctx.call(nn.einsum, spec, im, ctx.const(sine)))
    return ctx.call(tensor.cast, ctx.call(shaping.unsqueeze, out, axis=rank - 1), d)


@op("DFT", 17)
def _dft(ctx: Ctx) -> Sequence[Optional[Node]]:
    # The transform along one axis as two products with cosine and sine matrices
    # (a static length), in f64 as ONNX's reference computes it; the last axis of
    # input and output holds (real, imaginary).
    rank = ctx.rank(0)
    if ctx.opset >= 20:
        raw_axis = ctx.static(2, "the axis")
        axis = -2 if raw_axis is None else int(raw_axis.reshape(-1)[0])
    else:
        axis = int(ctx.attr("axis", 1))
    axis %= rank
    if axis == rank - 1:
        raise NodeError("DFT along the last axis (it holds the real and imaginary parts)")
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    d = ctx.dtype(0)
    x = ctx.call(tensor.cast, ctx.need(0), "f64")
    n = _dim(ctx, 0, axis)
    raw_length = ctx.static(1, "the DFT length")
    given = raw_length is not None and raw_length.size > 0
    if inverse and onesided:
        # A one-sided spectrum back to a real signal (numpy's irfft).
        length = int(raw_length.reshape(-1)[0]) if given else 2 * (n - 1)  # type: ignore[union-attr]
        return [_inverse_real_dft(ctx, x, axis, n, length, d)]
    length = n if not given else int(raw_length.reshape(-1)[0])  # type: ignore[union-attr]
    parts = _dim(ctx, 0, rank - 1)
    re = ctx.call(indexing.gather, x, ctx.const(0, "i64"), axis=rank - 1)
    im = ctx.call(indexing.gather, x, ctx.const(1, "i64"), axis=rank - 1) if parts == 2 else None
    inner = rank - 1

    def fit(v: Node) -> Node:
        # Truncated or zero-padded to the transform's length.
        if length < n:
            return ctx.call(shaping.slice_, v, starts=(0,), ends=(length,), axes=(axis,))
        if length > n:
            pads = [0] * (2 * inner)
            pads[inner + axis] = length - n
            return ctx.call(shaping.pad, v, pads=tuple(pads), mode="constant", value=0)
        return v

    re = fit(re)
    im = None if im is None else fit(im)
    outputs = length // 2 + 1 if onesided else length
    k = np.arange(outputs).reshape(-1, 1)
    j = np.arange(length).reshape(1, -1)
    angle = 2 * np.pi * ((k * j) % length) / length
    cos, sin = np.cos(angle), np.sin(angle)
    letters = "abcdefghijklmnopqrstuvwxy"[:inner]
    spec = f"{letters},z{letters[axis]}->{letters[:axis]}z{letters[axis + 1:]}"

    def times(v: Node, m: np.ndarray) -> Node:
        return ctx.call(nn.einsum, spec, v, ctx.const(m))

    sign = 1.0 if inverse else -1.0
    # (a + ib)(cos + i*sign*sin) = a cos - sign b sin + i (b cos + sign a sin)
    out_re = times(re, cos)
    out_im = times(re, sign * sin)
    if im is not None:
        out_re = ctx.call(arith.sub, out_re, times(im, sign * sin))
        out_im = ctx.call(arith.add, out_im, times(im, cos))
    if inverse:
        scale = ctx.const(1.0 / length, "f64")
        out_re, out_im = ctx.call(arith.mul, out_re, scale), ctx.call(arith.mul, out_im, scale)
    out = ctx.call(shaping.stack, ctx.call(structure.make_tuple, out_re, out_im), axis=-1)
    return [ctx.call(tensor.cast, out, d)]


# -- GridSample: taps gathered from the flattened image ----------------------------------------------
def _keys_taps(ctx: Ctx, t: Node, d: str) -> list[Node]:
    """The four cubic (Keys, a = -0.75) weights of the taps at -1, 0, 1, 2 from floor(x)."""
    a = -0.75

    def c(v: float) -> Node:
        return ctx.const(v, d)

    def near(u: Node) -> Node:  # |u| <= 1: (a+2)u^3 - (a+3)u^2 + 1
        return ctx.call(arith.add, ctx.call(arith.mul, ctx.call(arith.mul, u, u),
                                           ctx.call(arith.sub, ctx.call(arith.mul, c(a + 2), u), c(a + 3))), c(1.0))

    def far(u: Node) -> Node:  # 1 < |u| < 2: ((a u - 5a) u + 8a) u - 4a
        inner = ctx.call(arith.add, ctx.call(arith.mul, ctx.call(arith.sub, ctx.call(arith.mul, c(a), u), c(5 * a)), u),
                         c(8 * a))
        return ctx.call(arith.sub, ctx.call(arith.mul, inner, u), c(4 * a))

    one = c(1.0)
    return [far(ctx.call(arith.add, t, one)), near(t), near(ctx.call(arith.sub, one, t)),
            far(ctx.call(arith.sub, c(2.0), t))]


def _reflect(ctx: Ctx, v: Node, lo: float, hi: float, d: str) -> Node:
    """ONNX's reflection of a coordinate into [lo, hi] (repeatedly, as a mirror)."""
    span = ctx.const(hi - lo, d)
    below = ctx.call(arith.sub, ctx.const(lo, d), v)
    above = ctx.call(arith.sub, v, ctx.const(hi, d))

    def fold(dist: Node, near_end: float, far_end: float) -> Node:
        turns = ctx.call(elementwise.floor, ctx.call(arith.div, dist, span))
        rest = ctx.call(arith.sub, dist, ctx.call(arith.mul, turns, span))
        even = ctx.call(arith.eq, ctx.call(elementwise.mod, turns, ctx.const(2.0, d)), ctx.const(0.0, d))
        return ctx.call(tensor.where, even, ctx.call(arith.add, ctx.const(near_end, d), rest) if near_end == lo
                        else ctx.call(arith.sub, ctx.const(near_end, d), rest),
                        ctx.call(arith.sub, ctx.const(far_end, d), rest) if far_end == hi
                        else ctx.call(arith.add, ctx.const(far_end, d), rest))

    low = ctx.call(arith.lt, v, ctx.const(lo, d))
    high = ctx.call(arith.gt, v, ctx.const(hi, d))
    return ctx.call(tensor.where, low, fold(below, lo, hi),
                    ctx.call(tensor.where, high, fold(above, hi, lo), v))


@op("GridSample", 16)
def _grid_sample(ctx: Ctx) -> Sequence[Optional[Node]]:
    # Each output element: the weighted taps around its source position, fetched
    # from the image flattened per (batch, channel) with gather_elements; taps
    # outside the image read 0 (zeros), the edge (border) or a mirror (reflection).
    shape = _input_shape(ctx, 0)
    n, ch, spatial = shape[0], shape[1], shape[2:]
    grid_shape = _input_shape(ctx, 1)
    out_spatial = grid_shape[1:-1]
    r = len(spatial)
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(str(ctx.attr("mode", "linear")),
                                                          str(ctx.attr("mode", "linear")))
    padding = str(ctx.attr("padding_mode", "zeros"))
    aligned = bool(ctx.attr("align_corners", 0))
    d, gd = ctx.dtype(0), ctx.dtype(1)
    grid = ctx.need(1)
    count = int(np.prod(out_spatial))
    per_axis: list[list[tuple[Node, Node, Node]]] = []  # (index, weight, valid) per tap
    for a in range(r):
        size = spatial[a]
        g = ctx.call(tensor.reshape, ctx.call(indexing.gather, grid, ctx.const(r - 1 - a, "i64"), axis=-1), (n, count))
        one = ctx.const(1.0, gd)
        if aligned:
            x = ctx.call(arith.mul, ctx.call(arith.div, ctx.call(arith.add, g, one), ctx.const(2.0, gd)),
                         ctx.const(float(size - 1), gd))
            lo, hi = 0.0, float(size - 1)
        else:
            x = ctx.call(arith.div, ctx.call(arith.sub, ctx.call(arith.mul, ctx.call(arith.add, g, one),
                                                               ctx.const(float(size), gd)), one), ctx.const(2.0, gd))
            lo, hi = -0.5, size - 0.5
        if mode == "nearest":
            x = ctx.call(elementwise.round_, x)
        if padding == "border":
            x = ctx.call(arith.minimum, ctx.call(arith.maximum, x, ctx.const(0.0, gd)), ctx.const(float(size - 1), gd))
        elif padding == "reflection":
            x = _reflect(ctx, x, lo, hi, gd)
        base = ctx.call(elementwise.floor, x)
        t = ctx.call(tensor.cast, ctx.call(arith.sub, x, base), d)
        weights: list[Node]
        if mode == "nearest":
            offsets, weights = [0], [ctx.const(1.0, d)]
        elif mode == "linear":
            offsets, weights = [0, 1], [ctx.call(arith.sub, ctx.const(1.0, d), t), t]
        elif mode == "cubic":
            offsets, weights = [-1, 0, 1, 2], _keys_taps(ctx, t, d)
        else:
            raise NodeError(f"GridSample mode {mode!r}")
        start = ctx.call(tensor.cast, base, "i64")
        taps: list[tuple[Node, Node, Node]] = []
        for off, w in zip(offsets, weights):
            i = ctx.call(arith.add, start, ctx.const(off, "i64"))
            if padding == "reflection":
                i = ctx.call(tensor.cast, _reflect(ctx, ctx.call(tensor.cast, i, gd), lo, hi, gd), "i64")
            inside = ctx.call(arith.logical_and, ctx.call(arith.ge, i, ctx.const(0, "i64")),
                              ctx.call(arith.lt, i, ctx.const(size, "i64")))
            i = ctx.call(arith.minimum, ctx.call(arith.maximum, i, ctx.const(0, "i64")), ctx.const(size - 1, "i64"))
            taps.append((i, w, inside))
        per_axis.append(taps)
    flat = ctx.call(tensor.reshape, ctx.need(0), (n, ch, int(np.prod(spatial))))
    strides = [int(np.prod(spatial[a + 1:])) for a in range(r)]
    total: Optional[Node] = None
    for combo in itertools.product(*per_axis):
        index: Optional[Node] = None
        weight: Optional[Node] = None
        valid: Optional[Node] = None
        for a, (i, w, inside) in enumerate(combo):
            part = ctx.call(arith.mul, i, ctx.const(strides[a], "i64"))
            index = part if index is None else ctx.call(arith.add, index, part)
            weight = w if weight is None else ctx.call(arith.mul, weight, w)
            valid = inside if valid is None else ctx.call(arith.logical_and, valid, inside)
        assert index is not None and weight is not None and valid is not None
        if padding == "zeros":
            weight = ctx.call(tensor.where, valid, weight, ctx.const(0.0, d))
        spread = ctx.call(tensor.broadcast_to, ctx.call(shaping.unsqueeze, index, axis=1), (n, ch, count))
        picked = ctx.call(indexing.gather_elements, flat, spread, axis=2)
        term = ctx.call(arith.mul, picked, ctx.call(shaping.unsqueeze, weight, axis=1))
        total = term if total is None else ctx.call(arith.add, total, term)
    assert total is not None
    return [ctx.call(tensor.reshape, total, (n, ch, *out_spatial))]


# -- integer and quantized linear algebra ---------------------------------------------------------
def _minus_zero(ctx: Ctx, value: int, zero: int) -> Node:
    """Input ``value`` as i32, less the zero point input ``zero`` when given."""
    out = ctx.call(tensor.cast, ctx.need(value), "i32")
    point = ctx.input(zero) if zero < len(ctx.node.input) else None
    if point is not None:
        out = ctx.call(arith.sub, out, ctx.call(tensor.cast, point, "i32"))
    return out


@op("MatMulInteger", 10)
def _matmul_integer(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(tensor.matmul, _minus_zero(ctx, 0, 2), _minus_zero(ctx, 1, 3))]


@op("QLinearMatMul", 10)
def _qlinear_matmul(ctx: Ctx) -> Sequence[Optional[Node]]:
    # The integer product, scaled by a_scale * b_scale / y_scale, rounded to even,
    # shifted by y's zero point and saturated to its type.
    product = ctx.call(tensor.matmul, _minus_zero(ctx, 0, 2), _minus_zero(ctx, 3, 5))
    ratio = ctx.call(arith.div, ctx.call(arith.mul, ctx.need(1), ctx.need(4)), ctx.need(6))
    y = ctx.call(arith.mul, ctx.call(tensor.cast, product, "f64"), ctx.call(tensor.cast, ratio, "f64"))
    zero = ctx.input(7)
    d = ctx.dtype(7) if zero is not None else ctx.dtype(0)
    if zero is not None:
        y = ctx.call(arith.add, y, ctx.call(tensor.cast, zero, "f64"))
    low, high = int_range(numpy_dtype(d))  # (int4 too: numpy's iinfo lacks it)
    y = ctx.call(elementwise.clip, ctx.call(elementwise.round_, y), ctx.const(float(low), "f64"), ctx.const(float(high), "f64"))
    return [ctx.call(tensor.cast, y, d)]


@op("ConvInteger", 10)
def _conv_integer(ctx: Ctx) -> Sequence[Optional[Node]]:
    listed = ctx.attr("kernel_shape")
    kernel = tuple(int(k) for k in listed) if listed is not None else _dims(ctx, 1, range(2, ctx.rank(1)))
    strides, dilations, pads = _spatial(ctx, kernel)
    x = _minus_zero(ctx, 0, 2)
    w = ctx.call(tensor.cast, ctx.need(1), "i32")
    point = ctx.input(3) if len(ctx.node.input) > 3 else None
    if point is not None:
        shift = ctx.call(tensor.cast, point, "i32")
        if ctx.rank(3) == 1:  # one zero point per output channel
            shift = ctx.call(shaping.unsqueeze, shift, axis=tuple(range(1, ctx.rank(1))))
        w = ctx.call(arith.sub, w, shift)
    out = call_named(ctx, conv.conv, [x, w], {"stride": strides, "padding": pads, "dilation": dilations,
                                          "groups": int(ctx.attr("group", 1))})
    return [ctx.call(tensor.cast, out, "i32")]


@op("QLinearConv", 10)
def _qlinear_conv(ctx: Ctx) -> Sequence[Optional[Node]]:
    # The integer convolution (plus the i32 bias), scaled by x_scale * w_scale /
    # y_scale (w_scale per output channel or one), shifted, saturated, rounded.
    listed = ctx.attr("kernel_shape")
    kernel = tuple(int(k) for k in listed) if listed is not None else _dims(ctx, 3, range(2, ctx.rank(3)))
    strides, dilations, pads = _spatial(ctx, kernel)
    x = _minus_zero(ctx, 0, 2)
    w = ctx.call(tensor.cast, ctx.need(3), "i32")
    spatial = tuple(range(1, ctx.rank(3)))
    point = ctx.input(5)
    if point is not None:
        shift = ctx.call(tensor.cast, point, "i32")
        if ctx.rank(5) == 1:
            shift = ctx.call(shaping.unsqueeze, shift, axis=spatial)
        w = ctx.call(arith.sub, w, shift)
    out = call_named(ctx, conv.conv, [x, w], {"b": ctx.input(8), "stride": strides, "padding": pads,
                                          "dilation": dilations, "groups": int(ctx.attr("group", 1))})
    w_scale = ctx.need(4)
    if ctx.rank(4) == 1:
        w_scale = ctx.call(shaping.unsqueeze, w_scale, axis=(0, *range(2, ctx.rank(3))))
    ratio = ctx.call(arith.div, ctx.call(arith.mul, ctx.need(1), w_scale), ctx.need(6))
    y = ctx.call(arith.mul, ctx.call(tensor.cast, ctx.call(tensor.cast, out, "i32"), "f64"), ctx.call(tensor.cast, ratio, "f64"))
    zero = ctx.input(7)
    d = ctx.dtype(7) if zero is not None else ctx.dtype(0)
    if zero is not None:
        y = ctx.call(arith.add, y, ctx.call(tensor.cast, zero, "f64"))
    low, high = int_range(numpy_dtype(d))  # (int4 too: numpy's iinfo lacks it)
    y = ctx.call(elementwise.clip, y, ctx.const(float(low), "f64"), ctx.const(float(high), "f64"))
    return [ctx.call(tensor.cast, ctx.call(elementwise.round_, y), d)]


# -- the training domain's optimizers (ai.onnx.preview.training) --------------------------------------
TRAINING = "ai.onnx.preview.training"


def _optimizer_groups(ctx: Ctx, groups: int) -> tuple[Node, Node, list[list[Node]]]:
    """R, T and the tensors after them in ``groups`` equal groups (X..., G..., ...)."""
    rest = [ctx.need(i) for i in range(2, len(ctx.node.input))]
    if len(rest) % groups:
        raise NodeError(f"the inputs after R and T are not {groups} groups of one length")
    n = len(rest) // groups
    return ctx.need(0), ctx.need(1), [rest[k * n:(k + 1) * n] for k in range(groups)]


@op("Adagrad", 1, domain=TRAINING)
def _adagrad(ctx: Ctx) -> Sequence[Optional[Node]]:
    rate, step, (xs, gs, hs) = _optimizer_groups(ctx, 3)
    d = ctx.dtype(2)
    decay, eps = float(ctx.attr("decay_factor", 0.0)), float(ctx.attr("epsilon", 1e-6))
    norm = float(ctx.attr("norm_coefficient", 0.0))
    t = ctx.call(tensor.cast, step, d)
    r = ctx.call(arith.div, ctx.call(tensor.cast, rate, d),
                 ctx.call(arith.add, ctx.const(1.0, d), ctx.call(arith.mul, t, ctx.const(decay, d))))
    new_x, new_h = [], []
    for x, g, h in zip(xs, gs, hs):
        reg = ctx.call(arith.add, ctx.call(arith.mul, ctx.const(norm, d), x), g)
        h2 = ctx.call(arith.add, h, ctx.call(arith.mul, reg, reg))
        adaptive = ctx.call(arith.add, ctx.call(arith.sqrt, h2), ctx.const(eps, d))
        new_x.append(ctx.call(arith.sub, x, ctx.call(arith.div, ctx.call(arith.mul, r, reg), adaptive)))
        new_h.append(h2)
    return [*new_x, *new_h]


@op("Momentum", 1, domain=TRAINING)
def _momentum(ctx: Ctx) -> Sequence[Optional[Node]]:
    rate, step, (xs, gs, vs) = _optimizer_groups(ctx, 3)
    d = ctx.dtype(2)
    alpha, beta = float(ctx.attr("alpha")), float(ctx.attr("beta"))
    norm = float(ctx.attr("norm_coefficient"))
    nesterov = str(ctx.attr("mode", "standard")) == "nesterov"
    r = ctx.call(tensor.cast, rate, d)
    # The first step (T = 0) takes the gradient unscaled by beta.
    b = ctx.call(tensor.where, ctx.call(arith.gt, step, ctx.const(0, ctx.dtype(1))), ctx.const(beta, d), ctx.const(1.0, d))
    new_x, new_v = [], []
    for x, g, v in zip(xs, gs, vs):
        reg = ctx.call(arith.add, ctx.call(arith.mul, ctx.const(norm, d), x), g)
        v2 = ctx.call(arith.add, ctx.call(arith.mul, ctx.const(alpha, d), v), ctx.call(arith.mul, b, reg))
        move = ctx.call(arith.add, reg, ctx.call(arith.mul, ctx.const(alpha, d), v2)) if nesterov else v2
        new_x.append(ctx.call(arith.sub, x, ctx.call(arith.mul, r, move)))
        new_v.append(v2)
    return [*new_x, *new_v]


@op("Adam", 1, domain=TRAINING)
def _adam(ctx: Ctx) -> Sequence[Optional[Node]]:
    rate, step, (xs, gs, vs, hs) = _optimizer_groups(ctx, 4)
    d = ctx.dtype(2)
    alpha, beta = float(ctx.attr("alpha", 0.9)), float(ctx.attr("beta", 0.999))
    eps, norm = float(ctx.attr("epsilon", 1e-6)), float(ctx.attr("norm_coefficient", 0.0))
    post = float(ctx.attr("norm_coefficient_post", 0.0))
    t = ctx.call(tensor.cast, step, d)
    r = ctx.call(tensor.cast, rate, d)
    one = ctx.const(1.0, d)
    # R * sqrt(1 - beta^T) / (1 - alpha^T) once T > 0 (bias correction), else R.
    corrected = ctx.call(arith.div, ctx.call(arith.mul, r, ctx.call(arith.sqrt, ctx.call(
        arith.sub, one, ctx.call(arith.pow_, ctx.const(beta, d), t)))),
        ctx.call(arith.sub, one, ctx.call(arith.pow_, ctx.const(alpha, d), t)))
    r = ctx.call(tensor.where, ctx.call(arith.gt, step, ctx.const(0, ctx.dtype(1))), corrected, r)
    new_x, new_v, new_h = [], [], []
    for x, g, v, h in zip(xs, gs, vs, hs):
        reg = ctx.call(arith.add, ctx.call(arith.mul, ctx.const(norm, d), x), g)
        v2 = ctx.call(arith.add, ctx.call(arith.mul, ctx.const(alpha, d), v), ctx.call(arith.mul, ctx.const(1 - alpha, d), reg))
        h2 = ctx.call(arith.add, ctx.call(arith.mul, ctx.const(beta, d), h),
                      ctx.call(arith.mul, ctx.const(1 - beta, d), ctx.call(arith.mul, reg, reg)))
        root = ctx.call(arith.add, ctx.call(arith.sqrt, h2), ctx.const(eps, d))
        x2 = ctx.call(arith.sub, x, ctx.call(arith.div, ctx.call(arith.mul, r, v2), root))
        new_x.append(ctx.call(arith.mul, ctx.const(1 - post, d), x2))
        new_v.append(v2)
        new_h.append(h2)
    return [*new_x, *new_v, *new_h]

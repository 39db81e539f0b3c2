"""The ONNX import rules whose result is built from
:mod:`anfir.primitives.tensor`: Cast (with the saturating float8 casts), Constant,
Shape, Size, Reshape, Transpose, Flatten, MatMul and Gemm (and their integer and
quantized forms), Where, EyeLike, QuantizeLinear and DequantizeLinear.

See :mod:`anfir.interop.onnx.import_rules` for how a rule is chosen.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from anfir.dtypes import BY_NAME, dtype_name, float_max, int_range, is_float, is_integer, numpy_dtype
from anfir.interop.onnx.common import DTYPE_OF_ELEM, Ctx, NodeError
from anfir.interop.onnx.import_rules.common import (RuleSet, computed_shape, int_tuple, known_dims,
                                                    minus_zero_point, scalar_of, static_dim,
                                                    static_input_shape)
from anfir.ir.nodes import Node
from anfir.ir.primitive import Primitive
from anfir.primitives import arith, elementwise, gradient, indexing, shaping, structure, tensor

RULES = RuleSet()
"""This family's rules (merged into :data:`anfir.interop.onnx.import_rules.OPS`)."""
op = RULES.op


@op("Where")
def _where(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(tensor.where, ctx.need(0), ctx.need(1), ctx.need(2))]


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


@op("Shape")
def _shape(ctx: Ctx) -> Sequence[Optional[Node]]:
    node = ctx.need(0)
    start, end = ctx.attr("start", 0), ctx.attr("end")
    try:
        dims = static_input_shape(ctx, 0)
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
        dims = static_input_shape(ctx, 0)
    except NodeError:
        return [ctx.call(tensor.cast, ctx.call(tensor.array, ctx.call(gradient.size, ctx.need(0))), "i64")]
    return [ctx.const(np.array(int(np.prod(dims)), dtype=np.int64))]


@op("Reshape")
def _reshape(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    if ctx.opset < 5:
        target = int_tuple(ctx.attr("shape", []))
    else:
        dynamic = computed_shape(ctx, 1)
        if dynamic is not None:
            return [_reshape_computed(ctx, x, dynamic)]
        raw = ctx.static(1, "the shape")
        assert raw is not None
        target = int_tuple(raw)
    allowzero = ctx.attr("allowzero", 0)
    if not allowzero and 0 in target:
        try:
            dims = static_input_shape(ctx, 0)
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
            item = scalar_of(ctx, ctx.call(tensor.where, zero, ctx.call(structure.tuple_getitem, dims, k), item))
        items.append(item)
    return ctx.call(tensor.reshape, x, ctx.call(structure.make_tuple, *items))


@op("Transpose")
def _transpose(ctx: Ctx) -> Sequence[Optional[Node]]:
    perm = ctx.attr("perm")
    if perm is None:
        return [ctx.call(tensor.transpose, ctx.need(0))]
    return [ctx.call(tensor.transpose, ctx.need(0), tuple(int(p) for p in perm))]


def _product(dims: Sequence[Optional[int]]) -> int:
    return int(np.prod([int(d) for d in dims if d is not None]))


@op("Flatten")
def _flatten(ctx: Ctx) -> Sequence[Optional[Node]]:
    rank = ctx.rank(0)
    axis = int(ctx.attr("axis", 1))
    axis = axis % rank if rank and axis < 0 else axis
    dims = known_dims(ctx, 0)
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


@op("EyeLike", 9)
def _eye_like(ctx: Ctx) -> Sequence[Optional[Node]]:
    shape = static_input_shape(ctx, 0)
    if len(shape) != 2:
        raise NodeError(f"EyeLike of a tensor of shape {shape} (it takes a matrix)")
    to = ctx.attr("dtype")
    d = DTYPE_OF_ELEM.get(to) if to is not None else ctx.dtype(0)
    if d is None:
        raise NodeError(f"EyeLike of element type {to}, which anfir has no dtype for")
    return [ctx.const(np.eye(shape[0], shape[1], k=int(ctx.attr("k", 0)), dtype=BY_NAME[d].numpy))]


def _quant_param(ctx: Ctx, index: int, axis: int, block: int) -> Optional[Node]:
    """A scale or zero point laid out to broadcast against x: as it is (one per
    tensor), along ``axis`` (one per slice), or repeated over blocks of ``block``."""
    node = ctx.input(index)
    if node is None:
        return None
    rank = ctx.rank(0)
    if block > 0:
        length = static_dim(ctx, 0, axis)
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


@op("MatMulInteger", 10)
def _matmul_integer(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(tensor.matmul, minus_zero_point(ctx, 0, 2), minus_zero_point(ctx, 1, 3))]


@op("QLinearMatMul", 10)
def _qlinear_matmul(ctx: Ctx) -> Sequence[Optional[Node]]:
    # The integer product, scaled by a_scale * b_scale / y_scale, rounded to even,
    # shifted by y's zero point and saturated to its type.
    product = ctx.call(tensor.matmul, minus_zero_point(ctx, 0, 2), minus_zero_point(ctx, 3, 5))
    ratio = ctx.call(arith.div, ctx.call(arith.mul, ctx.need(1), ctx.need(4)), ctx.need(6))
    y = ctx.call(arith.mul, ctx.call(tensor.cast, product, "f64"), ctx.call(tensor.cast, ratio, "f64"))
    zero = ctx.input(7)
    d = ctx.dtype(7) if zero is not None else ctx.dtype(0)
    if zero is not None:
        y = ctx.call(arith.add, y, ctx.call(tensor.cast, zero, "f64"))
    low, high = int_range(numpy_dtype(d))  # (int4 too: numpy's iinfo lacks it)
    y = ctx.call(elementwise.clip, ctx.call(elementwise.round_, y), ctx.const(float(low), "f64"), ctx.const(float(high), "f64"))
    return [ctx.call(tensor.cast, y, d)]

"""The table from MindSpore op names to anfir primitives (``.mindir`` import).

Each entry of :data:`OPS` builds one MindSpore node from its converted inputs
and its primitive's attributes, over the op library's objects.  Many
MindSpore primitives take their former attributes as inputs
(``MatMul(x, w, transpose_a, transpose_b)``, ``ReduceSum(x, axis, keep_dims,
skip_mode)``, ``SumExt(x, dim, keepdim, dtype)``): those inputs must be
constants, read with :meth:`Ctx.static`.  The monad plumbing (``Load``,
``UpdateState``, ``Depend``) only orders reads of parameters here, so it is
dropped: ``Load(x, u)`` and ``Depend(x, ...)`` are ``x`` and ``UpdateState``
is a dead ``None``.  An op that writes state (``Assign``) has no entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from anfir.interop import attributes
from anfir.interop.mindir.common import TYPE_IDS, NodeError
from anfir.ir.attrs import NO_ATTRS
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.location import Location
from anfir.primitives import arith, conv, elementwise, gradient, indexing, nn, reduce, shaping, structure, tensor
from anfir.runtime_values import SymbolicKey


@dataclass
class Ctx:
    """One MindSpore node being converted: the graph, its place, its inputs (anfir
    nodes) and its primitive's attributes (decoded)."""

    graph: FuncGraph
    loc: Location
    args: list[Node]
    attrs: dict[str, Any]
    op: str
    out_shape: Optional[tuple[int, ...]] = None
    """The node's result shape as MindSpore recorded it (its ``shape`` attribute), if a tensor."""
    out_dtype: Optional[str] = None
    """The node's result dtype, likewise."""

    def call(self, prim: Any, *args: Any, **attrs: Any) -> CNode:
        """``prim(*args, **attrs)`` in the node's graph, at its place, the attributes in
        the op library's canonical form (a window's in its short form: MindSpore's
        convolutions and pools are 2-d)."""
        if prim in attributes.WINDOWED:
            try:
                attrs = attributes.window(attrs, 2)
            except ValueError as e:
                raise NodeError(f"{self.op}: {e}") from None
        return self.graph.apply(prim, *args, loc=self.loc,
                                attrs=prim.canonical_attrs(attrs) if attrs else NO_ATTRS)

    def arity(self, lo: int, hi: Optional[int] = None) -> None:
        """The node has between ``lo`` and ``hi`` (default ``lo``) inputs."""
        hi = lo if hi is None else hi
        if not lo <= len(self.args) <= hi:
            want = str(lo) if lo == hi else f"{lo} to {hi}"
            raise NodeError(f"{self.op} takes {want} inputs, not {len(self.args)}")

    def static(self, k: int, default: Any = None) -> Any:
        """The constant value of input ``k`` (``default`` when there are fewer inputs)."""
        if k >= len(self.args):
            return default
        node = self.args[k]
        if not isinstance(node, ValueNode):
            raise NodeError(f"input {k} of {self.op} must be a constant here")
        return node.value

    def attr(self, name: str, default: Any = None) -> Any:
        """A primitive attribute."""
        return self.attrs.get(name, default)


Rule = Callable[[Ctx], Node]
OPS: dict[str, Rule] = {}
"""MindSpore op type -> rule building it (see :class:`Ctx`)."""


def _elementwise(prim: Primitive, n: int) -> Rule:
    def rule(ctx: Ctx) -> Node:
        ctx.arity(n)
        return ctx.call(prim, *ctx.args)
    return rule


UNARY: dict[str, Primitive] = {
    "Neg": arith.neg, "Exp": arith.exp, "Log": arith.log, "Sin": arith.sin, "Cos": arith.cos,
    "Tanh": arith.tanh, "Sqrt": arith.sqrt, "Abs": arith.abs_, "Sign": arith.sign,
    "Sigmoid": arith.sigmoid, "ReLU": arith.relu, "Softplus": arith.softplus,
    "Erf": elementwise.erf, "Floor": elementwise.floor, "Ceil": elementwise.ceil, "Reciprocal": elementwise.reciprocal,
    "Rsqrt": elementwise.rsqrt, "Atan": elementwise.atan, "Sinh": elementwise.sinh, "Cosh": elementwise.cosh,
    "Expm1": elementwise.expm1, "Log1p": elementwise.log1p, "Tan": elementwise.tan, "Asin": elementwise.asin, "Acos": elementwise.acos,
    "LogicalNot": arith.logical_not, "IsNan": elementwise.isnan, "IsInf": elementwise.isinf,
    "OnesLike": tensor.ones_like, "ZerosLike": structure.zeros_like,
    "StopGradient": structure.stop_gradient, "Round": elementwise.round_,
}
"""Elementwise ops of one input, one anfir primitive each."""

BINARY: dict[str, Primitive] = {
    "Add": arith.add, "Sub": arith.sub, "Mul": arith.mul, "RealDiv": arith.div, "Div": arith.div,
    "Maximum": arith.maximum, "Minimum": arith.minimum, "Pow": arith.pow_,
    "Greater": arith.gt, "GreaterEqual": arith.ge, "Less": arith.lt, "LessEqual": arith.le,
    "Equal": arith.eq, "NotEqual": arith.ne, "LogicalAnd": arith.logical_and,
    "LogicalOr": arith.logical_or, "FloorDiv": elementwise.floor_div, "FloorMod": elementwise.mod,
    "Atan2": elementwise.atan2,
    # the scalar forms (Python numbers at run time: the same primitives)
    "ScalarAdd": arith.add, "ScalarSub": arith.sub, "ScalarMul": arith.mul,
    "ScalarDiv": arith.div, "ScalarPow": arith.pow_, "ScalarLt": arith.lt, "ScalarGt": arith.gt,
    "ScalarLe": arith.le, "ScalarGe": arith.ge, "ScalarEq": arith.eq, "ScalarNe": arith.ne,
    "scalar_add": arith.add, "scalar_sub": arith.sub, "scalar_mul": arith.mul,
    "scalar_lt": arith.lt, "scalar_gt": arith.gt, "scalar_eq": arith.eq,
    "ScalarFloorDiv": elementwise.floor_div, "ScalarMod": elementwise.mod,
    # tensor-with-scalar forms
    "Muls": arith.mul, "Adds": arith.add, "Subs": arith.sub, "Divs": arith.div,
    "PowTensorScalar": arith.pow_, "PowScalarTensor": arith.pow_,
}
"""Ops of two inputs (``MakeTuple`` of any number) that are one primitive each."""

for _name, _prim in UNARY.items():
    OPS[_name] = _elementwise(_prim, 1)
for _name, _prim in BINARY.items():
    OPS[_name] = _elementwise(_prim, 2)


def _make_tuple(ctx: Ctx) -> Node:
    return ctx.call(structure.make_tuple, *ctx.args)


OPS["MakeTuple"] = _make_tuple
OPS["make_tuple"] = _make_tuple


def _op(*names: str) -> Callable[[Rule], Rule]:
    def register(rule: Rule) -> Rule:
        for name in names:
            OPS[name] = rule
        return rule
    return register


def _dtype(code: Any, what: str) -> str:
    if isinstance(code, bool) or not isinstance(code, int) or code not in TYPE_IDS:
        raise NodeError(f"{what}: {code!r} is not a MindSpore type id anfir knows")
    return TYPE_IDS[code]


def _axes(value: Any) -> Any:
    # MindSpore writes "all axes" as an empty tuple (with skip_mode false).
    if value is None or value == ():
        return None
    if isinstance(value, list):
        value = tuple(value)
    return value


# -- structure and control ---------------------------------------------------------------
@_op("TupleGetItem", "tuple_getitem", "ListGetItem", "list_getitem")
def _getitem(ctx: Ctx) -> Node:
    ctx.arity(2)
    return ctx.call(structure.tuple_getitem, *ctx.args)


@_op("Switch", "switch")
def _switch(ctx: Ctx) -> Node:
    ctx.arity(3)
    # MindSpore's condition is a bool tensor of one element (or a bool): anfir's
    # `switch` takes a bool, which `all` of it is.
    return ctx.call(structure.switch, ctx.call(reduce.all_, ctx.args[0]), ctx.args[1], ctx.args[2])


@_op("Partial", "partial")
def _partial(ctx: Ctx) -> Node:
    ctx.arity(1, 1_000_000)
    return ctx.call(structure.partial, *ctx.args)


@_op("Load", "Depend")
def _first(ctx: Ctx) -> Node:
    # Load(param, u) reads the parameter; Depend(x, state) is x: with only pure
    # reads there is nothing left to order.
    ctx.arity(1, 1_000_000)
    return ctx.args[0]


@_op("UpdateState")
def _update_state(ctx: Ctx) -> Node:
    return ValueNode(None, ctx.loc)


@_op("AddN")
def _addn(ctx: Ctx) -> Node:
    ctx.arity(1)
    items = _tuple_items(ctx.args[0])
    if items is None:
        raise NodeError("AddN's input must be a tuple made in the model (MakeTuple)")
    total: Node = items[0]
    for item in items[1:]:
        total = ctx.call(arith.add, total, item)
    return total


def _tuple_items(node: Node) -> Optional[list[Node]]:
    if isinstance(node, CNode) and node.is_apply(structure.make_tuple) and len(node.args):
        return list(node.args)
    if isinstance(node, ValueNode) and isinstance(node.value, tuple) and node.value:
        return [ValueNode(v) for v in node.value]
    return None


@_op("EnvironCreate")
def _environ_create(ctx: Ctx) -> Node:
    return ctx.call(gradient.newenv)


def _env_key(ctx: Ctx) -> Node:
    # anfir writes a key as its name (a string constant)
    key = ctx.args[1]
    if isinstance(key, ValueNode) and isinstance(key.value, str):
        return ValueNode(SymbolicKey(key.value), ctx.loc)
    return key


@_op("EnvironSet")
def _environ_set(ctx: Ctx) -> Node:
    ctx.arity(3)
    return ctx.call(gradient.env_setitem, ctx.args[0], _env_key(ctx), ctx.args[2])


@_op("EnvironGet")
def _environ_get(ctx: Ctx) -> Node:
    ctx.arity(3)
    return ctx.call(gradient.env_getitem, ctx.args[0], _env_key(ctx), ctx.args[2])


# -- types ---------------------------------------------------------------------------------
@_op("Cast")
def _cast(ctx: Ctx) -> Node:
    ctx.arity(2)
    return ctx.call(tensor.cast, ctx.args[0], _dtype(ctx.static(1), "Cast"))


@_op("ScalarToTensor")
def _scalar_to_tensor(ctx: Ctx) -> Node:
    ctx.arity(1, 2)
    code = ctx.static(1, 43)
    return ctx.call(indexing.full, (), ctx.args[0], dtype=_dtype(code, "ScalarToTensor"))


@_op("TensorToScalar", "ScalarCast")
def _to_scalar(ctx: Ctx) -> Node:
    ctx.arity(1, 2)
    if len(ctx.args) == 2:
        return ctx.call(tensor.cast, ctx.args[0], _dtype(ctx.static(1), ctx.op))
    return ctx.call(structure.identity, ctx.args[0])


# -- linear algebra -------------------------------------------------------------------------
@_op("MatMul", "BatchMatMul")
def _matmul(ctx: Ctx) -> Node:
    ctx.arity(2, 4)
    ta = bool(ctx.static(2, ctx.attr("transpose_a", False)))
    tb = bool(ctx.static(3, ctx.attr("transpose_b", False)))
    x, y = ctx.args[0], ctx.args[1]
    if ta:
        x = _swap_last(ctx, x)
    if tb:
        y = _swap_last(ctx, y)
    return ctx.call(tensor.matmul, x, y)


def _swap_last(ctx: Ctx, x: Node) -> Node:
    # MatMul's operands are 2-d (a transpose); BatchMatMul's swap their last two axes.
    if ctx.op == "MatMul":
        return ctx.call(tensor.transpose, x)
    return ctx.call(nn.einsum, "...ij->...ji", x)


@_op("MatMulExt", "BatchMatMulExt", "Mm", "Bmm")
def _matmul_ext(ctx: Ctx) -> Node:
    ctx.arity(2)
    return ctx.call(tensor.matmul, *ctx.args)


@_op("BiasAdd")
def _bias_add(ctx: Ctx) -> Node:
    ctx.arity(2, 3)
    fmt = ctx.static(2, 0)
    if fmt not in (0, None, "NCHW"):
        raise NodeError(f"BiasAdd with data format {fmt!r}: anfir reads NCHW (0) only")
    if ctx.out_shape is None or len(ctx.out_shape) < 2:
        raise NodeError("BiasAdd needs its result's rank (the node's shape attribute)")
    view = (-1,) + (1,) * (len(ctx.out_shape) - 2)  # the bias along axis 1
    return ctx.call(arith.add, ctx.args[0], ctx.call(tensor.reshape, ctx.args[1], view))


@_op("Transpose")
def _transpose(ctx: Ctx) -> Node:
    ctx.arity(2)
    return ctx.call(tensor.transpose, ctx.args[0], tuple(ctx.static(1)))


@_op("Reshape")
def _reshape(ctx: Ctx) -> Node:
    ctx.arity(2)
    return ctx.call(tensor.reshape, ctx.args[0], ctx.args[1] if not isinstance(ctx.args[1], ValueNode)
                    else tuple(ctx.static(1)))


@_op("Flatten")
def _flatten(ctx: Ctx) -> Node:
    ctx.arity(1)
    return ctx.call(shaping.flatten, ctx.args[0], start=1)


@_op("ExpandDims")
def _expand_dims(ctx: Ctx) -> Node:
    ctx.arity(2)
    return ctx.call(shaping.unsqueeze, ctx.args[0], axis=int(ctx.static(1)))


@_op("Squeeze")
def _squeeze(ctx: Ctx) -> Node:
    ctx.arity(1, 2)  # the axis an attribute, or (MindSpore 2.10) an input
    axis = ctx.static(1) if len(ctx.args) == 2 else ctx.attr("axis", ())
    axis = (axis,) if isinstance(axis, int) and not isinstance(axis, bool) else axis
    if not isinstance(axis, (tuple, list)) or not all(isinstance(a, int) and not isinstance(a, bool) for a in axis):
        raise NodeError(f"Squeeze's axis must be integers, not {axis!r:.60}")
    return ctx.call(shaping.squeeze, ctx.args[0], axis=tuple(axis) if axis else None)


@_op("Tile")
def _tile(ctx: Ctx) -> Node:
    ctx.arity(2)
    return ctx.call(shaping.tile, ctx.args[0], reps=tuple(ctx.static(1)))


@_op("BroadcastTo")
def _broadcast_to(ctx: Ctx) -> Node:
    ctx.arity(1, 2)
    if len(ctx.args) == 2 and not isinstance(ctx.args[1], ValueNode):  # a shape known at run time
        return ctx.call(tensor.broadcast_to, ctx.args[0], ctx.args[1])
    shape = ctx.static(1) if len(ctx.args) == 2 else ctx.attr("shape")
    return ctx.call(tensor.broadcast_to, ctx.args[0], tuple(shape))


@_op("Slice")
def _slice(ctx: Ctx) -> Node:
    ctx.arity(3)  # (x, begin, size); a size of -1 runs to the end
    begin, size = ctx.static(1), ctx.static(2)
    for what, value in (("begin", begin), ("size", size)):
        if not isinstance(value, tuple) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise NodeError(f"Slice's {what} must be a tuple of integers, not {value!r:.60}")
    if len(begin) != len(size):
        raise NodeError(f"Slice with {len(begin)} begins and {len(size)} sizes")
    ends = tuple(2 ** 62 if n == -1 else b + n for b, n in zip(begin, size))
    return ctx.call(shaping.slice_, ctx.args[0], starts=begin, ends=ends, axes=tuple(range(len(begin))))


@_op("Select")
def _select(ctx: Ctx) -> Node:
    ctx.arity(3)
    return ctx.call(tensor.where, *ctx.args)


@_op("Concat")
def _concat(ctx: Ctx) -> Node:
    ctx.arity(1, 2)
    return ctx.call(shaping.concat, ctx.args[0], axis=int(ctx.static(1, ctx.attr("axis", 0))))


@_op("Stack")
def _stack(ctx: Ctx) -> Node:
    ctx.arity(1)
    return ctx.call(shaping.stack, ctx.args[0], axis=int(ctx.attr("axis", 0)))


# -- reductions ----------------------------------------------------------------------------
def _reduction(prim: Primitive) -> Rule:
    def rule(ctx: Ctx) -> Node:
        ctx.arity(1, 4)
        axis = _axes(ctx.static(1, ()))
        keep = bool(ctx.static(2, ctx.attr("keep_dims", False)))
        if len(ctx.args) == 4 and ctx.static(3) and axis is None:
            return ctx.args[0]  # skip_mode: an empty axis means "reduce nothing"
        return ctx.call(prim, ctx.args[0], axis=axis, keepdims=keep)
    return rule


for _name, _prim in {"ReduceSum": tensor.sum_, "ReduceMean": tensor.mean, "ReduceMax": reduce.max_,
                     "ReduceMin": reduce.min_, "ReduceProd": reduce.prod, "ReduceAll": reduce.all_,
                     "ReduceAny": reduce.any_}.items():
    OPS[_name] = _reduction(_prim)


@_op("SumExt", "MeanExt")
def _sum_ext(ctx: Ctx) -> Node:
    ctx.arity(1, 4)
    dim = ctx.static(1, None)
    axis = _axes(dim if not isinstance(dim, list) else tuple(dim))
    keep = bool(ctx.static(2, False))
    prim = tensor.sum_ if ctx.op == "SumExt" else tensor.mean
    out: Node = ctx.call(prim, ctx.args[0], axis=axis, keepdims=keep)
    code = ctx.static(3, None)
    if code is not None:
        out = ctx.call(tensor.cast, out, _dtype(code, ctx.op))
    return out


# -- neural network ------------------------------------------------------------------------
@_op("Square")
def _square(ctx: Ctx) -> Node:
    ctx.arity(1)
    return ctx.call(arith.mul, ctx.args[0], ctx.args[0])


@_op("TanhGrad")
def _tanh_grad(ctx: Ctx) -> Node:
    ctx.arity(2)  # (y, dy) -> dy * (1 - y * y)
    y, dy = ctx.args
    return ctx.call(arith.mul, dy, ctx.call(arith.sub, 1.0, ctx.call(arith.mul, y, y)))


@_op("SigmoidGrad")
def _sigmoid_grad(ctx: Ctx) -> Node:
    ctx.arity(2)  # (y, dy) -> dy * y * (1 - y)
    y, dy = ctx.args
    return ctx.call(arith.mul, dy, ctx.call(arith.mul, y, ctx.call(arith.sub, 1.0, y)))


@_op("ReluGrad")
def _relu_grad(ctx: Ctx) -> Node:
    ctx.arity(2)  # (dy, y) -> dy where y > 0
    dy, y = ctx.args
    return ctx.call(tensor.where, ctx.call(arith.gt, y, 0.0), dy, ctx.call(structure.zeros_like, dy))


@_op("Softmax", "LogSoftmax")
def _softmax(ctx: Ctx) -> Node:
    ctx.arity(1, 2)
    axis = ctx.static(1, ctx.attr("axis", -1))
    if isinstance(axis, (tuple, list)):
        if len(axis) != 1:
            raise NodeError(f"{ctx.op} over {len(axis)} axes: anfir's takes one")
        axis = axis[0]
    prim = nn.softmax if ctx.op == "Softmax" else nn.log_softmax
    return ctx.call(prim, ctx.args[0], axis=int(axis))


def _pairs(value: Any, n: int, what: str) -> tuple[int, ...]:
    # MindSpore writes 2-d window attributes as (1, 1, h, w) or (h, w) or h.
    if isinstance(value, int):
        return (value,) * n
    items = tuple(int(v) for v in value)
    if len(items) == n + 2:
        items = items[2:]
    if len(items) != n:
        raise NodeError(f"{what} {value!r} is not {n} numbers")
    return items


@_op("Conv2D")
def _conv2d(ctx: Ctx) -> Node:
    ctx.arity(2)
    return ctx.call(conv.conv, ctx.args[0], ctx.args[1], **_conv_attrs(ctx))


def _conv_attrs(ctx: Ctx) -> dict[str, Any]:
    """anfir's conv attributes from a MindSpore convolution primitive's."""
    if str(ctx.attr("format", "NCHW")) != "NCHW":
        raise NodeError(f"{ctx.op} in a format other than NCHW")
    stride = _pairs(ctx.attr("stride", 1), 2, "stride")
    dilation = _pairs(ctx.attr("dilation", 1), 2, "dilation")
    groups = int(ctx.attr("group", ctx.attr("groups", 1)))
    mode = str(ctx.attr("pad_mode", "valid")).lower()
    if mode == "same":
        padding: Any = "same"
    elif mode == "valid":
        padding = 0
    else:  # MindSpore's pad list is (top, bottom, left, right); anfir's begins then ends
        top, bottom, left, right = _pairs(ctx.attr("pad_list", ctx.attr("pad", 0)), 4, "pad")
        padding = (top, left, bottom, right)
    return {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}


def _dtype_of_result(ctx: Ctx) -> str:
    if ctx.out_dtype is None:
        raise NodeError(f"{ctx.op} needs its result's dtype (the node's shape attribute)")
    return ctx.out_dtype


@_op("Conv2DBackpropInput")
def _conv_input_grad(ctx: Ctx) -> Node:
    ctx.arity(3)  # (dout, w, input_size): anfir's rule reads only x's shape
    attrs = _conv_attrs(ctx)
    size: Any = ctx.args[2] if not isinstance(ctx.args[2], ValueNode) else tuple(int(d) for d in ctx.static(2))
    like = ctx.call(tensor.zeros, size, _dtype_of_result(ctx))  # a computed size: x's Shape at run time
    return ctx.call(conv.conv_input_grad, ctx.args[0], ctx.args[1], like, **attrs)


@_op("Conv2DBackpropFilter")
def _conv_weight_grad(ctx: Ctx) -> Node:
    ctx.arity(3)  # (dout, x, filter_size)
    attrs = _conv_attrs(ctx)
    like = ctx.call(tensor.zeros, tuple(int(d) for d in ctx.static(2)), _dtype_of_result(ctx))
    return ctx.call(conv.conv_weight_grad, ctx.args[1], ctx.args[0], like, **attrs)


@_op("MaxPoolGrad")
def _max_pool_grad(ctx: Ctx) -> Node:
    ctx.arity(3)  # (x, out, dout)
    kernel = _pairs(ctx.attr("kernel_size", 1), 2, "kernel_size")
    stride = _pairs(ctx.attr("strides", 1), 2, "strides")
    if str(ctx.attr("pad_mode", "VALID")).upper() != "VALID":
        raise NodeError("MaxPoolGrad with a pad mode other than VALID")
    return ctx.call(conv.max_pool_grad, ctx.args[0], ctx.args[2], kernel=kernel, stride=stride)


@_op("AvgPoolGrad")
def _avg_pool_grad(ctx: Ctx) -> Node:
    ctx.arity(7)  # (x, out, dout, kernel, strides, pad_mode, data_format)
    if ctx.static(5) != 2 or ctx.static(6) != 0:
        raise NodeError("AvgPoolGrad other than VALID, NCHW")
    kernel = _pairs(ctx.static(3), 2, "kernel_size")
    stride = _pairs(ctx.static(4), 2, "strides")
    return ctx.call(conv.avg_pool_grad, ctx.args[2], ctx.args[0], kernel=kernel, stride=stride)


@_op("BatchNorm")
def _batch_norm(ctx: Ctx) -> Node:
    """Inference batch norm over the running statistics, NCHW: ``(y, mean, var, mean, var)``
    (MindSpore's five results; the last four, its saved statistics, are the running
    ones in inference).  Its attributes are inputs 5 to 8 (is_training, epsilon,
    momentum, data_format) or, in older files, the primitive's."""
    ctx.arity(5, 9)
    training = ctx.static(5, ctx.attr("is_training", False))
    eps = ctx.static(6, ctx.attr("epsilon", 1e-5))
    fmt = ctx.static(8, ctx.attr("format", ctx.attr("data_format", "NCHW")))
    fmt = {0: "NCHW", 1: "NHWC"}.get(fmt, str(fmt)) if not isinstance(fmt, str) else fmt
    if training:
        raise NodeError("BatchNorm in training mode (it updates its running statistics): anfir "
                        "imports inference cells (set_train(False) before exporting)")
    if fmt != "NCHW":
        raise NodeError(f"BatchNorm with format {fmt}: anfir reads NCHW")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise NodeError(f"BatchNorm's epsilon must be a number, not {eps!r}")
    x, scale, bias, mean, var = ctx.args[:5]
    y = ctx.call(conv.batch_norm, x, scale, bias, mean, var, eps=float(eps))
    return ctx.call(structure.make_tuple, y, mean, var, mean, var)


@_op("MaxPool", "AvgPool")
def _pool(ctx: Ctx) -> Node:
    if len(ctx.args) == 1:  # the attributes on the primitive
        kernel = _pairs(ctx.attr("kernel_size", 1), 2, "kernel_size")
        stride = _pairs(ctx.attr("strides", 1), 2, "strides")
        mode = str(ctx.attr("pad_mode", "VALID")).upper()
        fmt = str(ctx.attr("format", ctx.attr("data_format", "NCHW")))
    else:  # the attributes as inputs: (x, kernel, strides, pad_mode, data_format)
        ctx.arity(5)
        kernel = _pairs(ctx.static(1), 2, "kernel_size")
        stride = _pairs(ctx.static(2), 2, "strides")
        mode = {0: "PAD", 1: "SAME", 2: "VALID"}.get(ctx.static(3), str(ctx.static(3)))
        fmt = {0: "NCHW", 1: "NHWC"}.get(ctx.static(4), str(ctx.static(4)))
    if mode != "VALID" or fmt != "NCHW":
        raise NodeError(f"{ctx.op} with pad mode {mode} and format {fmt}: anfir reads VALID, NCHW")
    prim = conv.max_pool if ctx.op == "MaxPool" else conv.avg_pool
    return ctx.call(prim, ctx.args[0], kernel=kernel, stride=stride)


# -- mcore: shapes known at run time -------------------------------------------------------
@_op("Shape")
def _shape(ctx: Ctx) -> Node:
    ctx.arity(1)  # a tuple of the dimensions (MindSpore's scalars, anfir's ints)
    return ctx.call(tensor.shape, ctx.args[0])


@_op("Size")
def _size(ctx: Ctx) -> Node:
    ctx.arity(1)
    return ctx.call(gradient.size, ctx.args[0])


__all__ = ["BINARY", "Ctx", "OPS", "UNARY"]


# -- helper mops: the ops anfir writes for fmod, logical_xor, the bit operators ------------------
for _name, _prim in {"Mod": elementwise.fmod, "LogicalXor": elementwise.logical_xor,
                     "BitwiseAnd": elementwise.bitwise_and, "BitwiseOr": elementwise.bitwise_or,
                     "BitwiseXor": elementwise.bitwise_xor}.items():
    OPS[_name] = _elementwise(_prim, 2)
OPS["Invert"] = _elementwise(elementwise.bitwise_not, 1)


@_op("LeftShift", "RightShift")
def _shift(ctx: Ctx) -> Node:
    ctx.arity(2)
    return ctx.call(elementwise.bit_shift, *ctx.args, direction="left" if ctx.op == "LeftShift" else "right")


@_op("Round")
def _round(ctx: Ctx) -> Node:
    # Round(x) or, as MindSpore 2.10 writes it, Round(x, decimals): decimals 0 only
    ctx.arity(1, 2)
    if ctx.static(1, 0) != 0:
        raise NodeError(f"Round to {ctx.static(1)} decimals (anfir's round has none)")
    return ctx.call(elementwise.round_, ctx.args[0])


@_op("Argmax", "Argmin")
def _arg_extreme(ctx: Ctx) -> Node:
    # Argmax(x, axis, output_type) as MindSpore 2.10 writes it (axis an attribute before)
    ctx.arity(1, 3)
    axis = ctx.static(1, ctx.attr("axis", -1))
    out: Node = ctx.call(reduce.argmax if ctx.op == "Argmax" else reduce.argmin, ctx.args[0], axis=int(axis))
    code = ctx.static(2, None)
    if code is not None and _dtype(code, ctx.op) != "i64":
        out = ctx.call(tensor.cast, out, _dtype(code, ctx.op))
    return out


@_op("CumSum")
def _cumsum(ctx: Ctx) -> Node:
    # CumSum(x, axis, exclusive, reverse) (older files: exclusive / reverse attributes)
    ctx.arity(2, 4)
    return ctx.call(reduce.cumsum, ctx.args[0], axis=int(ctx.static(1)),
                    exclusive=bool(ctx.static(2, ctx.attr("exclusive", False))),
                    reverse=bool(ctx.static(3, ctx.attr("reverse", False))))


# -- the lead: indexing
@_op("Gather")
def _gather(ctx: Ctx) -> Node:
    # Gather(x, indices, axis, batch_dims): numpy take along the axis (batch_dims 0)
    ctx.arity(2, 4)
    axis, batch_dims = ctx.static(2, ctx.attr("axis", 0)), ctx.static(3, ctx.attr("batch_dims", 0))
    if not isinstance(axis, int) or isinstance(axis, bool) or batch_dims not in (0, None):
        raise NodeError(f"Gather with axis {axis!r:.40} and batch_dims {batch_dims!r:.40} (anfir reads an "
                        "integer axis, batch_dims 0)")
    return ctx.call(indexing.gather, ctx.args[0], ctx.args[1], axis=axis)


@_op("UnsortedSegmentSum")
def _unsorted_segment_sum(ctx: Ctx) -> Node:
    # (data, segment ids, n): rows of data added into n rows — gather_grad along axis 0 of a
    # zero tensor of the result's shape (MindSpore records it on the node)
    ctx.arity(3)
    if ctx.out_shape is None or ctx.out_dtype is None:
        raise NodeError("UnsortedSegmentSum without a recorded result shape")
    zeros = ctx.call(tensor.zeros, ValueNode(tuple(ctx.out_shape)), ValueNode(ctx.out_dtype))
    return ctx.call(indexing.gather_grad, ctx.args[0], zeros, ctx.args[1], axis=0)

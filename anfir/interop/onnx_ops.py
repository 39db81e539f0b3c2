"""The ONNX import rules: one entry per ONNX op type, over anfir's operator library.

:data:`OPS` maps ``(domain, op_type)`` to ``[(since_version, rule), ...]``: the
rule used for a node is the last whose ``since_version`` is at most the
model's opset of that domain (a rule may also read ``ctx.opset`` for details
that changed between versions, such as axes moving from an attribute to an
input).  A rule takes a :class:`~anfir.interop.onnx_import.Ctx` and returns
the nodes of the ONNX node's outputs.  Primitives are found by name in the
registry, so a rule for an operator the library does not have yet says so
(``anfir has no primitive 'concat'``) instead of failing at import.

An op with no rule here whose ONNX schema is a function (``Gelu`` before it had
a rule, ``Celu``, ``Range``...) is expanded through that function body by
:mod:`anfir.interop.onnx_import`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from anfir.dtypes import is_float
from anfir.interop.onnx_import import DTYPE_OF_ELEM, Ctx, NodeError, OpRule
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import Node, ValueNode
from anfir.primitives import structure
from anfir.primitives.registry import PRIMITIVES

OPS: dict[tuple[str, str], list[tuple[int, OpRule]]] = {}
"""``(domain, op_type)`` → ``[(since_version, rule)]``, oldest first."""


def op(op_type: str, since: int = 1, domain: str = "") -> Callable[[OpRule], OpRule]:
    """Register a rule for ``op_type`` from opset ``since`` on."""
    def register(rule: OpRule) -> OpRule:
        OPS.setdefault((domain, op_type), []).append((since, rule))
        OPS[(domain, op_type)].sort(key=lambda pair: pair[0])
        return rule
    return register


def P(name: str) -> Any:
    """The primitive ``name`` of the operator library (a NodeError if it has none)."""
    prim = PRIMITIVES.get(name)
    if prim is None:
        raise NodeError(f"anfir has no primitive {name!r} yet")
    return prim


# -- elementwise -------------------------------------------------------------------------------
def _unary(name: str) -> OpRule:
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        return [ctx.call(P(name), ctx.need(0))]
    return rule


for _onnx, _anfir in {
    "Abs": "abs", "Neg": "neg", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Sin": "sin",
    "Cos": "cos", "Tan": "tan", "Tanh": "tanh", "Sinh": "sinh", "Cosh": "cosh", "Asin": "asin",
    "Acos": "acos", "Atan": "atan", "Sigmoid": "sigmoid", "Relu": "relu", "Floor": "floor",
    "Ceil": "ceil", "Round": "round", "Reciprocal": "reciprocal", "Erf": "erf", "Sign": "sign",
    "IsNaN": "isnan", "Softplus": "softplus", "Softsign": "softsign", "Not": "logical_not",
    "HardSwish": "hard_swish", "Mish": "mish", "BitwiseNot": "bitwise_not", "Identity": "identity",
}.items():
    op(_onnx)(_unary(_anfir))


def _variadic(name: str) -> OpRule:
    # Sum, Max, Min of any number of inputs: a left fold of the binary operator.
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        args = [a for a in ctx.inputs() if a is not None]
        if not args:
            raise NodeError("needs at least one input")
        acc = args[0]
        for a in args[1:]:
            acc = ctx.call(P(name), acc, a)
        if len(args) == 1:
            acc = ctx.call(P("identity"), acc)
        return [acc]
    return rule


def _binary(name: str) -> OpRule:
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        return [ctx.call(P(name), ctx.need(0), ctx.need(1))]
    return rule


for _onnx, _anfir in {
    "Add": "add", "Sub": "sub", "Mul": "mul", "Equal": "eq", "Less": "lt", "LessOrEqual": "le",
    "Greater": "gt", "GreaterOrEqual": "ge", "And": "logical_and", "Or": "logical_or",
    "Xor": "logical_xor", "BitwiseAnd": "bitwise_and", "BitwiseOr": "bitwise_or",
    "BitwiseXor": "bitwise_xor",
}.items():
    op(_onnx)(_binary(_anfir))

op("Sum")(_variadic("add"))
op("Max")(_variadic("maximum"))
op("Min")(_variadic("minimum"))


@op("Mean")
def _mean(ctx: Ctx) -> Sequence[Optional[Node]]:
    args = [a for a in ctx.inputs() if a is not None]
    total = _variadic("add")(ctx)[0]
    return [ctx.call(P("div"), total, ctx.const(len(args), ctx.dtype(0)))]


@op("Div")
def _div(ctx: Ctx) -> Sequence[Optional[Node]]:
    x, y = ctx.need(0), ctx.need(1)
    d = ctx.dtype(0)
    if is_float(d):
        return [ctx.call(P("div"), x, y)]
    # ONNX divides integers toward zero; floor division corrected where the
    # signs differ and the division is inexact.
    q = ctx.call(P("floor_div"), x, y)
    r = ctx.call(P("mod"), x, y)
    zero = ctx.const(0, d)
    inexact = ctx.call(P("ne"), r, zero)
    differ = ctx.call(P("ne"), ctx.call(P("lt"), x, zero), ctx.call(P("lt"), y, zero))
    fix = ctx.call(P("logical_and"), inexact, differ)
    return [ctx.call(P("where"), fix, ctx.call(P("add"), q, ctx.const(1, d)), q)]


@op("Pow")
def _pow(ctx: Ctx) -> Sequence[Optional[Node]]:
    d = ctx.dtype(0)
    y = ctx.need(1)
    if ctx.dtype(1) != d:
        y = ctx.call(P("cast"), y, d)
    return [ctx.call(P("pow"), ctx.need(0), y)]


@op("Mod")
def _mod(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(P("fmod" if ctx.attr("fmod", 0) else "mod"), ctx.need(0), ctx.need(1))]


@op("BitShift")
def _bit_shift(ctx: Ctx) -> Sequence[Optional[Node]]:
    direction = ctx.attr("direction", "LEFT").lower()
    return [ctx.call(P("bit_shift"), ctx.need(0), ctx.need(1), direction=direction)]


@op("IsInf")
def _isinf(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    pos, neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    inf = ctx.call(P("isinf"), x)
    if pos and neg:
        return [inf]
    zero = ctx.const(0, ctx.dtype(0))
    side = ctx.call(P("gt" if pos else "lt"), x, zero)
    if not pos and not neg:
        return [ctx.call(P("logical_and"), inf, ctx.call(P("logical_not"), inf))]
    return [ctx.call(P("logical_and"), inf, side)]


@op("Where")
def _where(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(P("where"), ctx.need(0), ctx.need(1), ctx.need(2))]


@op("PRelu")
def _prelu(ctx: Ctx) -> Sequence[Optional[Node]]:
    x, slope = ctx.need(0), ctx.need(1)
    neg = ctx.call(P("lt"), x, ctx.const(0, ctx.dtype(0)))
    return [ctx.call(P("where"), neg, ctx.call(P("mul"), x, slope), x)]


@op("LeakyRelu")
def _leaky_relu(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(P("leaky_relu"), ctx.need(0), alpha=float(ctx.attr("alpha", 0.01)))]


@op("Elu")
def _elu(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(P("elu"), ctx.need(0), alpha=float(ctx.attr("alpha", 1.0)))]


@op("HardSigmoid")
def _hard_sigmoid(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(P("hard_sigmoid"), ctx.need(0), alpha=float(ctx.attr("alpha", 0.2)),
                     beta=float(ctx.attr("beta", 0.5)))]


@op("Gelu", 20)
def _gelu(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(P("gelu"), ctx.need(0), approximate=ctx.attr("approximate", "none"))]


_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214813232421875


@op("Selu")
def _selu(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    alpha, gamma = float(ctx.attr("alpha", _SELU_ALPHA)), float(ctx.attr("gamma", _SELU_GAMMA))
    d = ctx.dtype(0)
    if np.float32(alpha) == np.float32(_SELU_ALPHA) and np.float32(gamma) == np.float32(_SELU_GAMMA):
        return [ctx.call(P("selu"), x)]
    # gamma * (x if x > 0 else alpha * (exp(x) - 1))
    neg = ctx.call(P("mul"), ctx.const(alpha, d), ctx.call(P("expm1"), x))
    pos = ctx.call(P("gt"), x, ctx.const(0, d))
    return [ctx.call(P("mul"), ctx.const(gamma, d), ctx.call(P("where"), pos, x, neg))]


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
        out = ctx.call(P("maximum"), out, lo_node)
    if hi_node is not None:
        out = ctx.call(P("minimum"), out, hi_node)
    if out is x:
        out = ctx.call(P("identity"), x)
    return [out]


# -- types ---------------------------------------------------------------------------------------
@op("Cast")
def _cast(ctx: Ctx) -> Sequence[Optional[Node]]:
    to = ctx.attr("to")
    if isinstance(to, str):  # opset 6 spelled the type's name
        raise NodeError(f"Cast to {to!r}: a type name (opset 6)")
    if to not in DTYPE_OF_ELEM:
        raise NodeError(f"Cast to element type {to}, which anfir has no dtype for")
    if ctx.attr("saturate", 1) != 1 and not is_float(DTYPE_OF_ELEM[to]):
        pass
    return [ctx.call(P("cast"), ctx.need(0), DTYPE_OF_ELEM[to])]


@op("CastLike")
def _cast_like(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(P("cast"), ctx.need(0), ctx.dtype(1))]


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


@op("ConstantOfShape")
def _constant_of_shape(ctx: Ctx) -> Sequence[Optional[Node]]:
    shape = ctx.static(0, "the shape")
    value = ctx.attr("value")
    fill = np.zeros((), np.float32) if value is None else np.asarray(value).reshape(())
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


@op("Shape")
def _shape(ctx: Ctx) -> Sequence[Optional[Node]]:
    node = ctx.need(0)
    start, end = ctx.attr("start", 0), ctx.attr("end")
    try:
        dims = _input_shape(ctx, 0)
    except NodeError:
        rank = ctx.rank(0)
        full = ctx.call(P("shape"), node)
        lo, hi, _ = slice(start, end).indices(rank)
        items = [ctx.call(structure.tuple_getitem, full, i) for i in range(lo, hi)]
        return [ctx.call(P("array"), ctx.call(structure.make_tuple, *items))]
    return [ctx.const(np.array(dims[slice(start, end)], dtype=np.int64))]


@op("Size")
def _size(ctx: Ctx) -> Sequence[Optional[Node]]:
    dims = _input_shape(ctx, 0)
    return [ctx.const(np.array(int(np.prod(dims)), dtype=np.int64))]


@op("Reshape")
def _reshape(ctx: Ctx) -> Sequence[Optional[Node]]:
    x = ctx.need(0)
    if ctx.opset < 5:
        target = _ints(ctx.attr("shape", []))
    else:
        raw = ctx.static(1, "the shape")
        assert raw is not None
        target = _ints(raw)
    allowzero = ctx.attr("allowzero", 0)
    if not allowzero and 0 in target:
        dims = _input_shape(ctx, 0)
        target = tuple(dims[i] if t == 0 else t for i, t in enumerate(target))
    return [ctx.call(P("reshape"), x, target)]


@op("Transpose")
def _transpose(ctx: Ctx) -> Sequence[Optional[Node]]:
    perm = ctx.attr("perm")
    if perm is None:
        return [ctx.call(P("transpose"), ctx.need(0))]
    return [ctx.call(P("transpose"), ctx.need(0), tuple(int(p) for p in perm))]


@op("Expand")
def _expand(ctx: Ctx) -> Sequence[Optional[Node]]:
    raw = ctx.static(1, "the shape")
    assert raw is not None
    target = _ints(raw)
    if "expand" in PRIMITIVES:
        return [ctx.call(P("expand"), ctx.need(0), target)]
    dims = _input_shape(ctx, 0)
    out = tuple(int(d) for d in np.broadcast_shapes(dims, target))
    return [ctx.call(P("broadcast_to"), ctx.need(0), out)]


# -- linear algebra ------------------------------------------------------------------------------
@op("MatMul")
def _matmul(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(P("matmul"), ctx.need(0), ctx.need(1))]


@op("Gemm")
def _gemm(ctx: Ctx) -> Sequence[Optional[Node]]:
    a, b, c = ctx.need(0), ctx.need(1), ctx.input(2)
    d = ctx.dtype(0)
    if ctx.attr("transA", 0):
        a = ctx.call(P("transpose"), a)
    if ctx.attr("transB", 0):
        b = ctx.call(P("transpose"), b)
    out = ctx.call(P("matmul"), a, b)
    alpha, beta = float(ctx.attr("alpha", 1.0)), float(ctx.attr("beta", 1.0))
    if alpha != 1.0:
        out = ctx.call(P("mul"), ctx.const(alpha, d), out)
    if c is not None:
        if beta != 1.0:
            c = ctx.call(P("mul"), ctx.const(beta, d), c)
        out = ctx.call(P("add"), out, c)
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
            return [ctx.call(P("identity"), x)]
        return [build(ctx, x, axes, keepdims)]
    return rule


def _reduce_with(name: str) -> Callable[[Ctx, Node, Optional[tuple[int, ...]], bool], Node]:
    def build(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
        return ctx.call(P(name), x, axis=axes, keepdims=keepdims)
    return build


def _reduce_l1(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
    return ctx.call(P("sum"), ctx.call(P("abs"), x), axis=axes, keepdims=keepdims)


def _reduce_l2(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
    return ctx.call(P("sqrt"), ctx.call(P("sum"), ctx.call(P("mul"), x, x), axis=axes,
                                        keepdims=keepdims))


def _reduce_sum_square(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
    return ctx.call(P("sum"), ctx.call(P("mul"), x, x), axis=axes, keepdims=keepdims)


def _reduce_log_sum(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
    return ctx.call(P("log"), ctx.call(P("sum"), x, axis=axes, keepdims=keepdims))


def _reduce_log_sum_exp(ctx: Ctx, x: Node, axes: Optional[tuple[int, ...]], keepdims: bool) -> Node:
    return ctx.call(P("logsumexp"), x, axis=axes, keepdims=keepdims)


op("ReduceSum")(_reduction(_reduce_with("sum"), input_opset=13))
op("ReduceMean")(_reduction(_reduce_with("mean")))
op("ReduceMax")(_reduction(_reduce_with("max")))
op("ReduceMin")(_reduction(_reduce_with("min")))
op("ReduceProd")(_reduction(_reduce_with("prod")))
op("ReduceL1")(_reduction(_reduce_l1))
op("ReduceL2")(_reduction(_reduce_l2))
op("ReduceSumSquare")(_reduction(_reduce_sum_square))
op("ReduceLogSum")(_reduction(_reduce_log_sum))
op("ReduceLogSumExp")(_reduction(_reduce_log_sum_exp))


def _arg(name: str) -> OpRule:
    def rule(ctx: Ctx) -> Sequence[Optional[Node]]:
        return [ctx.call(P(name), ctx.need(0), axis=int(ctx.attr("axis", 0)),
                         keepdims=bool(ctx.attr("keepdims", 1)),
                         select_last=bool(ctx.attr("select_last_index", 0)))]
    return rule


op("ArgMax")(_arg("argmax"))
op("ArgMin")(_arg("argmin"))


@op("CumSum")
def _cumsum(ctx: Ctx) -> Sequence[Optional[Node]]:
    raw = ctx.static(1, "the axis")
    assert raw is not None
    return [ctx.call(P("cumsum"), ctx.need(0), axis=int(raw.reshape(-1)[0]),
                     exclusive=bool(ctx.attr("exclusive", 0)), reverse=bool(ctx.attr("reverse", 0)))]


# -- structure -----------------------------------------------------------------------------------
@op("Dropout")
def _dropout(ctx: Ctx) -> Sequence[Optional[Node]]:
    # Inference: the identity (a training_mode input that is a true constant is refused).
    training = ctx.static(2, "training_mode") if ctx.opset >= 12 else None
    if training is not None and bool(training):
        raise NodeError("Dropout in training mode (anfir imports inference graphs)")
    x = ctx.need(0)
    out: list[Optional[Node]] = [ctx.call(P("identity"), x)]
    if len(ctx.node.output) > 1:
        out.append(ctx.call(P("ones_like"), ctx.call(P("cast"), x, "bool")))
    return out


@op("SequenceConstruct")
def _sequence_construct(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(structure.make_tuple, *[a for a in ctx.inputs() if a is not None])]


@op("SequenceEmpty")
def _sequence_empty(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(structure.make_tuple)]


@op("SequenceLength")
def _sequence_length(ctx: Ctx) -> Sequence[Optional[Node]]:
    return [ctx.call(P("array"), ctx.call(P("len"), ctx.need(0)))]


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
    return ctx.call(P("all"), node)


@op("If")
def _if(ctx: Ctx) -> Sequence[Optional[Node]]:
    imp = ctx.importer
    cond = _truth(ctx, ctx.need(0))
    branches = []
    for attr, mark in (("then_branch", "✓"), ("else_branch", "✗")):
        body = ctx.attr(attr)
        g = FuncGraph(imp.graph_name(f"{mark}{ctx.node.name or 'if'}"))
        outs = imp.convert_subgraph(body, g, ctx.scope, _opsets(ctx), {})
        g.output = outs[0] if len(outs) == 1 else g.apply(structure.make_tuple, *outs)
        branches.append(g)
    chosen = ctx.call(structure.switch, cond, branches[0], branches[1])
    result = ctx.graph.apply(chosen)
    n = len(ctx.node.output)
    if n == 1:
        return [result]
    return [ctx.graph.apply(structure.tuple_getitem, result, i) for i in range(n)]


def _opsets(ctx: Ctx) -> dict[str, int]:
    return ctx.importer.opsets


@op("Loop")
def _loop(ctx: Ctx) -> Sequence[Optional[Node]]:
    imp = ctx.importer
    body = ctx.attr("body")
    trip, cond0 = ctx.input(0), ctx.input(1)
    carried = [ctx.need(i) for i in range(2, len(ctx.node.input))]
    n_carried = len(carried)
    n_scan = len(body.output) - 1 - n_carried
    if n_scan:
        return _loop_with_scans(ctx, body, trip, cond0, carried, n_scan)
    name = ctx.node.name or "loop"
    loop = FuncGraph(imp.graph_name(f"{name}"))
    i = loop.add_parameter("i")
    c = loop.add_parameter("cond")
    state = [loop.add_parameter(body.input[2 + k].name if 2 + k < len(body.input) else f"v{k}")
             for k in range(n_carried)]
    go: Node = c
    if trip is not None:
        go = imp.call(loop, P("logical_and"), [imp.call(loop, P("lt"), [i, trip], {}, None), c], {}, None)
    go = imp.call(loop, P("all"), [go], {}, None)
    step = FuncGraph(imp.graph_name(f"✓{name}"))
    bound: dict[str, Node] = {body.input[0].name: i, body.input[1].name: c}
    for k in range(n_carried):
        bound[body.input[2 + k].name] = state[k]
    outs = imp.convert_subgraph(body, step, ctx.scope, _opsets(ctx), bound)
    next_i = step.apply(P("add"), i, np.array(1, dtype=np.int64))
    step.output = step.apply(loop, next_i, outs[0], *outs[1:1 + n_carried])
    done = FuncGraph(imp.graph_name(f"✗{name}"))
    done.output = done.apply(structure.make_tuple, *state) if n_carried != 1 else done.apply(P("identity"), state[0])
    loop.output = loop.apply(loop.apply(structure.switch, go, step, done))
    start_cond = cond0 if cond0 is not None else ctx.const(np.array(True))
    result = ctx.graph.apply(loop, np.array(0, dtype=np.int64), start_cond, *carried)
    if n_carried == 1:
        return [result]
    return [ctx.graph.apply(structure.tuple_getitem, result, k) for k in range(n_carried)]


def _loop_with_scans(ctx: Ctx, body: Any, trip: Optional[Node], cond0: Optional[Node],
                     carried: list[Node], n_scan: int) -> Sequence[Optional[Node]]:
    raise NodeError("Loop with scan outputs needs concat (not in anfir's operator library yet)")


@op("Scan", 9)
def _scan(ctx: Ctx) -> Sequence[Optional[Node]]:
    raise NodeError("Scan needs slicing and stacking (not in anfir's operator library yet)")


"""Sample arguments for the exporters' rule tests, and the bundled examples each
exporter writes (shared by test_onnx_export.py and test_coreml_export.py)."""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from example_args import resnet18_args, transformer_args
from anfir.flat.statements import DIM
from anfir.primitives import PRIMITIVES, arith, gradient, structure, tensor


class S:
    """A static argument of an op (an axis, a shape, a dtype): a constant operand."""

    def __init__(self, value: Any) -> None:
        self.value = value


class A:
    """The attributes of a sample call (``A(axis=1, keepdims=True)``), last in its tuple."""

    def __init__(self, **attrs: Any) -> None:
        self.attrs = attrs


rng = np.random.default_rng(15)
X = np.array([[0.5, -1.25, 2.0], [3.0, -0.5, 1.5]])
Y = np.array([[1.5, 0.25, 2.0], [0.5, 4.0, 3.0]])
I = np.array([[1, -2, 3], [4, 0, -6]])
J = np.array([[2, 2, -1], [4, 5, 3]])
B = np.array([[True, False, True], [False, False, True]])
V3 = np.array([0.5, -2.0, 1.0])
M34 = rng.normal(size=(3, 4))
M24 = rng.normal(size=(2, 4))
T223 = rng.normal(size=(2, 2, 3))
T224 = rng.normal(size=(2, 2, 4))
BINARY = [(X, Y), (X, 2.0), (2, I), (I, J), (X.astype(np.float32), S(2.0)), (1.5, 2.5)]
UNARY = [(X,), (np.float32(0.75) * X.astype(np.float32),), (0.3,)]
COMPARE = [(X, Y), (I, S(1)), (X.astype(np.float32), S(0)), (1.0, 2.0), (I, X)]

SAMPLES: dict[Any, list[tuple[Any, ...]]] = {
    arith.add: BINARY, arith.sub: BINARY, arith.mul: BINARY, gradient.gadd: BINARY,
    arith.div: [(X, Y), (I, J), (1, 2), (X, S(4))],
    arith.pow_: [(Y, X), (X, S(2)), (J, S(2)), (2.0, 0.5)],
    arith.maximum: BINARY, arith.minimum: BINARY,
    arith.neg: [*UNARY, (I,)], arith.exp: UNARY, arith.log: [(Y,), (2.0,)], arith.sin: UNARY,
    arith.cos: UNARY, arith.tanh: UNARY, arith.sqrt: [(Y,), (2.0,)], arith.abs_: [*UNARY, (I,)],
    arith.sign: [*UNARY, (I,)], arith.sigmoid: UNARY, arith.relu: [*UNARY, (I,)],
    arith.softplus: [*UNARY, (np.array([800.0, -800.0, 0.0]),)],
    arith.lt: COMPARE, arith.le: COMPARE, arith.gt: COMPARE, arith.ge: COMPARE,
    arith.eq: COMPARE, arith.ne: COMPARE,
    arith.logical_and: [(B, ~B), (True, False)], arith.logical_or: [(B, ~B), (False, False)],
    arith.logical_not: [(B,), (True,)],
    tensor.matmul: [(X, M34), (V3, M34), (X, V3), (T223, M34), (I, J.T)],
    tensor.transpose: [(X,), (T223, S((2, 0, 1)))],
    tensor.reshape: [(X, S((3, 2))), (X, S((-1,))), (T223, S((4, 3)))],
    tensor.sum_: [(X,), (X, A(axis=0)), (T223, A(axis=(0, 2), keepdims=True)), (I,),
                  (X, A(axis=-1)), (X, A(axis=()))],
    tensor.mean: [(X,), (X, A(axis=1)), (T223, A(axis=(1, 2))), (X, A(keepdims=True))],
    tensor.broadcast_to: [(V3, S((2, 3))), (2.0, S((2, 2)))],
    tensor.ones_like: [(X,), (I,), (2.5,)], structure.zeros_like: [(X,), (I,), (B,), (2.5,)],
    tensor.zeros: [(S((2, 3)),), (S((2,)), S("f32")), (S(()),)],
    tensor.ones: [(S((2, 3)),), (S((4,)), S("i64"))],
    tensor.where: [(B, X, Y), (B, X, S(0.0)), (True, 1.0, 2.0), (B, 1.0, S(2.0)), (B, V3[:1], Y)],
    tensor.array: [((0.5, -1.5),), (((0.5, 1.0), (2.0, 3.0)),)],
    tensor.cast: [(X, S("i64")), (I, S("f32")), (X, S("bool")), (2.7, S("i32"))],
    structure.switch: [(True, X, Y), (False, X, Y), (False, X, 0.0), (True, 2, 3)],
    gradient.sum_to: [(X, V3), (X, np.ones((1, 3))), (X, 1.0), (T223, X), (X, X)],
    gradient.broadcast_like: [(V3, X), (2.0, X), (X, X)],
    gradient.unreduce: [(V3, X, S(0)), (2.0, X, S(None)), (np.ones(2), T223, S((1, 2))),
                        (np.ones((2, 3)), T223, S(-2)), (np.ones((2, 1)), X, S(1), S(True))],
    gradient.reshape_like: [(np.arange(6.0), X), (X, X), (np.ones(1), 2.0)],
    gradient.prod_others: [(X, S(None)), (X, S(1)), (T223, S((0, 2))), (np.array([2.0, 0.0, 3.0]), S(0)),
                           (2.5, S(None))],
    gradient.clip_grad: [(X, X, S(-0.5), S(1.0)), (Y, X, S(None), S(0.0)), (X, X, S(None), S(None)),
                         (X, X, V3, S(1.0))],
    gradient.matmul_dx: [(M24, M34, X), (rng.normal(size=4), M34, V3), (np.ones(2), V3, X),
                         (T224, M34, T223), (T224, M34, X)],
    gradient.matmul_dy: [(X, M24, M34), (V3, rng.normal(size=4), M34), (X, np.ones(2), V3),
                         (T223, T224, M34)],
    gradient.size: [(X,), (T223,)],
    gradient.cast_like: [(X, I), (B, X), (I, X.astype(np.float32))],
    gradient.tangent_dot: [(X, Y), (2.0, 3.0)],
    DIM: [(X, S(1)), (T223, S(0))],
}
W = np.array([[0.3, -1.7, 2.5, -0.5], [4.0, -3.25, 0.0, 1e-9]])
"""Values around the interesting points of the math functions (0, tiny, halves...)."""
UNIT = np.array([[0.3, -0.7, 0.0, 0.95], [-0.99, 0.5, 1e-9, -1e-12]])
SMALL = np.array([1e-12, -1e-10, 1e-5, -0.3, 2.0, 40.0])
for _name in ("erf", "floor", "ceil", "reciprocal", "square", "atan", "sinh", "cosh", "softsign",
              "silu", "mish", "selu", "hard_swish"):
    SAMPLES[PRIMITIVES[_name]] = [(W,), (W.astype(np.float32),), (0.75,)]
SAMPLES.update({
    PRIMITIVES["expm1"]: [(W,), (SMALL,), (np.array([-800.0, 800.0, 0.0]),), (0.5,)],
    PRIMITIVES["log1p"]: [(np.abs(W),), (SMALL,), (np.array([-1.0, np.inf, 0.0]),), (0.5,)],
    PRIMITIVES["round"]: [(np.array([0.5, 1.5, 2.5, -0.5, -1.7, 3.2]),)],
    PRIMITIVES["rsqrt"]: [(np.abs(W) + 0.1,), (2.0,)],
    PRIMITIVES["tan"]: [(UNIT,), (0.5,)],
    PRIMITIVES["sinh"]: [(W,), (SMALL,), (np.array([-30.0, 30.0]),)],
    PRIMITIVES["asin"]: [(UNIT,), (0.5,)], PRIMITIVES["acos"]: [(UNIT,), (0.5,)],
    PRIMITIVES["gelu"]: [(W,), (W, A(approximate="tanh")), (W.astype(np.float32),)],
    PRIMITIVES["leaky_relu"]: [(W,), (W, A(alpha=0.2))],
    PRIMITIVES["elu"]: [(W,), (W, A(alpha=0.5)), (SMALL,)],
    PRIMITIVES["hard_sigmoid"]: [(W,), (W, A(alpha=1.0 / 6.0, beta=0.5))],
    PRIMITIVES["clip"]: [(W, A(min=-0.5, max=0.7)), (W, A(min=0.1)), (W, Y[:, :1]),
                         (W, V3[:1], S(0.8)), (I, A(max=2))],
    PRIMITIVES["floor_div"]: [(W, np.array([2.0, -0.75, 0.5, 3.0])), (I, J), (I, np.array([2, -4, 0])),
                              (7.5, -2.0), (np.array([1.0, -1.0, 0.0]), 0.0)],
    PRIMITIVES["mod"]: [(W, np.array([2.0, -0.75, 0.5, 3.0])), (I, J), (I, np.array([2, -4, 0])),
                        (-7.5, 2.0)],
    PRIMITIVES["fmod"]: [(W, np.array([2.0, -0.75, 0.5, 3.0])), (I, J), (I, np.array([2, -4, 0]))],
    PRIMITIVES["atan2"]: [(W, np.array([[1.0], [-2.0]])), (np.array([1.0, -1.0, 0.0, 0.0, 2.0]),
                                                         np.array([0.0, 0.0, -1.0, 1.0, -3.0]))],
    PRIMITIVES["isnan"]: [(np.array([1.0, np.nan, np.inf]),), (I,)],
    PRIMITIVES["isinf"]: [(np.array([1.0, np.nan, -np.inf]),), (I,), (np.float32(np.inf),)],
    PRIMITIVES["logical_xor"]: [(B, ~B), (True, True), (I, J)],
    PRIMITIVES["bitwise_and"]: [(I, J), (B, ~B)], PRIMITIVES["bitwise_or"]: [(I, J), (B, B)],
    PRIMITIVES["bitwise_xor"]: [(I, J), (B, ~B)], PRIMITIVES["bitwise_not"]: [(I,), (B,)],
    PRIMITIVES["bit_shift"]: [(I, np.array([1, 2, 3])), (I, np.array([1, 2, 3]), A(direction="right")),
                              (I.astype(np.int32), np.array([4, 0, 1], dtype=np.int32))],
    PRIMITIVES["max"]: [(W,), (W, A(axis=1)), (T223, A(axis=(0, 2), keepdims=True)), (X, Y), (I,)],
    PRIMITIVES["min"]: [(W,), (W, A(axis=0, keepdims=True)), (X, Y), (I, A(axis=1))],
    PRIMITIVES["prod"]: [(W,), (W, A(axis=1)), (I, A(axis=0, keepdims=True))],
    PRIMITIVES["var"]: [(W,), (W, A(axis=1)), (T223, A(axis=(0, 2), keepdims=True, correction=1)), (I,)],
    PRIMITIVES["std"]: [(W,), (W, A(axis=0, correction=1))],
    PRIMITIVES["logsumexp"]: [(W,), (W, A(axis=1, keepdims=True)), (np.array([800.0, 799.0]),),
                              (np.array([-np.inf, -np.inf]),)],
    PRIMITIVES["all"]: [(B,), (B, A(axis=1)), (I, A(axis=0, keepdims=True))],
    PRIMITIVES["any"]: [(B,), (B, A(axis=0)), (W, A(axis=1))],
    PRIMITIVES["norm"]: [(W,), (W, A(ord=1, axis=1)), (W, A(ord=3.0)), (W, A(ord=math.inf, axis=0)),
                         (W, A(ord=-math.inf)), (W, A(ord=0, keepdims=True)), (I,)],
    PRIMITIVES["argmax"]: [(W,), (W, A(axis=1, keepdims=True)), (np.array([1.0, 3.0, 3.0]),
                                                              A(select_last=True)),
                           (W, A(axis=None)), (W, A(axis=None, keepdims=True))],
    PRIMITIVES["argmin"]: [(W, A(axis=1)), (I, A(axis=None))],
    PRIMITIVES["cumsum"]: [(W, A(axis=1)), (W, A(axis=0, exclusive=True, reverse=True)), (I,), (B, A(axis=1))],
    PRIMITIVES["cumprod"]: [(W, A(axis=1)), (W, A(axis=0, exclusive=True)), (T223, A(axis=1, reverse=True)),
                            (T223, A(axis=-1, exclusive=True, reverse=True)), (I,)],
})
"""Sample arguments of each rule's primitive (``S(...)`` marks a constant operand)."""

_R = np.random.default_rng(7)
# f32: onnxruntime implements Conv, ConvTranspose, AveragePool and the global pools for f32 only
X4 = _R.standard_normal((2, 4, 7, 6)).astype(np.float32)
W4 = _R.standard_normal((6, 4, 3, 3)).astype(np.float32)
WG = _R.standard_normal((6, 2, 3, 2)).astype(np.float32)
X3 = _R.standard_normal((2, 4, 9)).astype(np.float32)
W3 = _R.standard_normal((3, 4, 3)).astype(np.float32)
WT = _R.standard_normal((4, 3, 3, 3)).astype(np.float32)
SAMPLES.update({  # the convolution family (anfir/primitives/conv.py)
    PRIMITIVES["conv"]: [(X4, W4), (X4, W4, _R.standard_normal(6).astype(np.float32), A(stride=2, padding=1)),
                         (X4, WG, A(padding=(1, 0, 2, 1), dilation=(1, 2), groups=2)),
                         (X4, W4, A(padding="same")), (X3, W3, A(stride=2, padding="valid")),
                         (X4, W4, A(padding=1))],
    PRIMITIVES["conv_core"]: [(X4, W4, A(stride=(2, 1), padding=(1, 2)))],
    PRIMITIVES["conv_input_grad"]: [(_R.standard_normal((2, 6, 4, 3)).astype(np.float32), W4, X4, A(stride=2, padding=1)),
                                    # (onnx's reference ConvTranspose has no groups)
                                    (_R.standard_normal((2, 6, 7, 6)).astype(np.float32), W4, X4,
                                     A(padding="same"))],
    PRIMITIVES["conv_transpose"]: [(X4, WT), (X4, WT, _R.standard_normal(3).astype(np.float32),
                                             A(stride=2, padding=1, output_padding=1)),
                                   (X4, _R.standard_normal((4, 2, 2, 3)).astype(np.float32),
                                    A(stride=(1, 2), dilation=2))],
    PRIMITIVES["max_pool"]: [(X4.astype(np.float64), A(kernel=2)), (X4, A(kernel=(3, 2), stride=(2, 1), padding=1)),
                             (X4, A(kernel=3, stride=2, dilation=2, padding=1)),
                             (X3, A(kernel=(3,), stride=2, ceil_mode=True))],
    PRIMITIVES["avg_pool"]: [(X4, A(kernel=2)), (X4, A(kernel=3, stride=2, padding=1)),
                             (X4, A(kernel=3, stride=2, padding=1, count_include_pad=False)),
                             (X4, A(kernel=(2, 3), stride=1))],
    # The training graph's gradients (outputs of the forward samples' shapes).
    PRIMITIVES["conv_weight_grad"]: [
        (X4, _R.standard_normal((2, 6, 5, 4)).astype(np.float32), W4),
        (X4, _R.standard_normal((2, 6, 4, 3)).astype(np.float32), W4, A(stride=2, padding=1)),
        (X4, _R.standard_normal((2, 6, 5, 3)).astype(np.float32), WG,
         A(padding=(1, 0, 2, 1), dilation=(1, 2), groups=2)),
        (X4, _R.standard_normal((2, 6, 3, 2)).astype(np.float32), W4, A(stride=(2, 2))),
        (X3, _R.standard_normal((2, 3, 4)).astype(np.float32), W3, A(stride=2, padding="valid"))],
    PRIMITIVES["max_pool_grad"]: [
        (X4.astype(np.float64), _R.standard_normal((2, 4, 3, 3)), A(kernel=2)),
        (X4, _R.standard_normal((2, 4, 4, 7)).astype(np.float32), A(kernel=(3, 2), stride=(2, 1), padding=1)),
        (X4, _R.standard_normal((2, 4, 3, 2)).astype(np.float32), A(kernel=3, stride=2, dilation=2, padding=1)),
        (X3, _R.standard_normal((2, 4, 4)).astype(np.float32), A(kernel=(3,), stride=2, ceil_mode=True)),
        # overlapping windows share maxima (their gradients add); ties go to the first
        (np.round(X4), _R.standard_normal((2, 4, 6, 5)).astype(np.float32), A(kernel=2, stride=1))],
    PRIMITIVES["max_pool_select"]: [
        (X4.astype(np.float64), X4[::-1].astype(np.float64), A(kernel=2)),
        (X4, _R.standard_normal((2, 4, 7, 6)).astype(np.float32), A(kernel=3, stride=2, dilation=2, padding=1)),
        (X3, X3 * 2, A(kernel=(3,), stride=2, ceil_mode=True)),
        (np.round(X4), X4, A(kernel=2, stride=1))],
    PRIMITIVES["avg_pool_grad"]: [
        (_R.standard_normal((2, 4, 3, 3)).astype(np.float32), X4, A(kernel=2)),
        (_R.standard_normal((2, 4, 4, 3)).astype(np.float32), X4, A(kernel=3, stride=2, padding=1)),
        (_R.standard_normal((2, 4, 4, 3)).astype(np.float32), X4,
         A(kernel=3, stride=2, padding=1, count_include_pad=False)),
        (_R.standard_normal((2, 4, 6, 4)).astype(np.float32), X4, A(kernel=(2, 3), stride=1)),
        (_R.standard_normal((2, 4, 5)).astype(np.float32), X3, A(kernel=(2,), ceil_mode=True))],
    PRIMITIVES["global_avg_pool"]: [(X4,), (X3.astype(np.float32),)],
    PRIMITIVES["global_max_pool"]: [(X4,)],  # (onnx's reference GlobalMaxPool is 2-d only)
    PRIMITIVES["batch_norm"]: [(X4, _R.standard_normal(4), _R.standard_normal(4), _R.standard_normal(4),
                                _R.random(4) + 0.5),
                               (X3.astype(np.float32), *[v.astype(np.float32) for v in
                                (_R.standard_normal(4), _R.standard_normal(4), _R.standard_normal(4),
                                 _R.random(4) + 0.5)], A(eps=1e-3))],
    PRIMITIVES["channel_sum"]: [(X4,), (X3,)],
    PRIMITIVES["channel_spread"]: [(_R.standard_normal(4), X4)],
})

# The shape and indexing operators (anfir/interop/onnx/export_rules/shaping.py and indexing.py).
IX = np.array([[1, -1], [0, 2]])
SAMPLES.update({
    PRIMITIVES["concat"]: [((X, Y), A(axis=0)), ((X, M24 @ np.ones((4, 3))), A(axis=-2)), ((V3, V3, V3),)],
    PRIMITIVES["stack"]: [((X, Y), A(axis=1)), ((V3, V3), A(axis=-1)), ((X, Y),)],
    PRIMITIVES["slice"]: [(W, A(starts=(0, 1), ends=(9, -1))), (W, A(starts=-1, ends=-9, axes=1, steps=-2)),
                          (T223, A(starts=(1,), ends=(2,), axes=(-1,)))],
    PRIMITIVES["slice_grad"]: [(np.ones((2, 2)), W, A(starts=(0, 1), ends=(9, -1))),
                               (np.ones((2, 2)), W, A(starts=-1, ends=-9, axes=1, steps=-2))],
    PRIMITIVES["pad"]: [(W, A(pads=(1, 0, 0, 2))), (W, A(pads=(1, 2, 1, 1), mode="reflect")),
                        (W, A(pads=(0, 1, 1, 0), mode="edge", value=0)), (W, A(pads=(1, 3, 1, 2), mode="wrap")), (W, A(pads=(3, 5, 4, 9), mode="wrap")),
                        (W, A(pads=(1, -1, 0, 0), value=2.5)), (I, A(pads=(1, 1, 1, 1), value=7))],
    PRIMITIVES["pad_grad"]: [(np.arange(20.0).reshape(4, 5), X, A(pads=(1, 1, 1, 1), mode="reflect")),
                             (np.ones((4, 4)), X, A(pads=(1, 0, 1, 1))),
                             (np.arange(42.0).reshape(6, 7), X, A(pads=(2, 2, 2, 2), mode="wrap"))],
    PRIMITIVES["squeeze"]: [(np.ones((1, 3, 1)),), (np.ones((1, 3, 1)), A(axis=-1)), (X, A(axis=()))],
    PRIMITIVES["unsqueeze"]: [(X, A(axis=0)), (X, A(axis=(-1, 1))), (2.5, A(axis=0))],
    PRIMITIVES["flatten"]: [(T223,), (T223, A(start=1)), (T223, A(start=0, end=1)), (X, A(start=1, end=1))],
    PRIMITIVES["expand"]: [(V3, S((2, 3))), (np.ones((2, 1)), S((3,))), (X, S((1, 1, 3)))],
    PRIMITIVES["tile"]: [(X, A(reps=(2, 1))), (V3, A(reps=(2, 2))), (T223, A(reps=2))],
    PRIMITIVES["tile_grad"]: [(np.arange(12.0).reshape(4, 3), X, A(reps=(2, 1))),
                              (np.arange(12.0).reshape(2, 6), V3, A(reps=(2, 2)))],
    PRIMITIVES["flip"]: [(X,), (T223, A(axis=(0, -1))), (X, A(axis=()))],
    PRIMITIVES["roll"]: [(X, A(shift=1)), (T223, A(shift=(1, -4), axis=(0, 2))), (W, A(shift=5, axis=1))],
    PRIMITIVES["roll_back"]: [(X, A(shift=1)), (T223, A(shift=(1, -4), axis=(0, 2)))],
    PRIMITIVES["tril"]: [(W,), (T224, A(k=1)), (I, A(k=-1))],
    PRIMITIVES["triu"]: [(W,), (T224, A(k=-1))],
    PRIMITIVES["rank"]: [(X,), (T223,)],
    PRIMITIVES["gather"]: [(M34, IX), (W, IX, A(axis=1)), (M34, np.array([2, -3]), A(axis=-2)), (W, np.array(1))],
    PRIMITIVES["gather_grad"]: [(np.ones((2, 2, 4)), M34, IX), (np.arange(8.0).reshape(2, 2, 2), W, IX, A(axis=1)),
                                (np.ones(4), W, np.array(1), A(axis=0))],
    PRIMITIVES["gather_elements"]: [(W, IX, A(axis=1)), (M34, np.array([[2, 0, 1, -1]]))],
    PRIMITIVES["scatter_add"]: [(W, IX, X[:, :2], A(axis=1)), (M34, np.array([[2, 0, 2, -1]]), M24[:1])],
    PRIMITIVES["gather_nd"]: [(M34, np.array([[0, 1], [2, -1]])), (T223, np.array([[1], [0]]))],
    PRIMITIVES["gather_nd_grad"]: [(np.ones(2), M34, np.array([[0, 1], [0, 1]])),
                                   (np.ones((2, 2, 3)), T223, np.array([[1], [0]]))],
    PRIMITIVES["scatter_nd"]: [(M34, np.array([[0, 1], [2, 3]]), np.array([5.0, 6.0])),
                               (M34, np.array([[1]]), np.ones((1, 4)))],
    PRIMITIVES["one_hot"]: [(IX, A(depth=3)), (np.array([0, 4, 2]), A(depth=4, dtype="i64"))],
    PRIMITIVES["arange"]: [(0, 5), (0.5, 2.0, A(step=0.25)), (S(1), 7, A(step=2, dtype="f32"))],
    PRIMITIVES["full"]: [(S((2, 3)), 2.5), (S((2,)), 3, A(dtype="f32"))],
    PRIMITIVES["eye"]: [(S(3),), (S(2), A(m=4, k=1, dtype="f32"))],
    PRIMITIVES["split"]: [(W, A(sizes=2, axis=1)), (W, A(sizes=(1, 3), axis=-1)), (T223, A(sizes=(1, 1)))],
    PRIMITIVES["topk"]: [(W, A(k=2)), (W, A(k=1, axis=0, largest=False)), (np.array([1.0, 3.0, 3.0, 2.0]), A(k=3))],
    PRIMITIVES["concat_grad"]: [(np.arange(12.0).reshape(2, 6), (X, Y), A(axis=1)), (np.arange(12.0).reshape(4, 3), (X, X), A(axis=0))],
    PRIMITIVES["stack_grad"]: [(T223, (X, X), A(axis=0)), (np.arange(12.0).reshape(2, 3, 2), (X, Y), A(axis=-1))],
})
"""Sample arguments of each rule's primitive (``S(...)`` marks a constant operand)."""

# The neural-network operators (anfir/primitives/nn.py) and their gradient helpers.
_Q, _K, _V = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 2))
_LOGITS, _TARGET = rng.normal(size=(4, 3)), np.array([0, 2, 1, 2])
_IMG = rng.normal(size=(2, 4, 3, 2))
SAMPLES.update({
    PRIMITIVES["softmax"]: [(W,), (W, A(axis=0)), (T223.astype(np.float32), A(axis=1))],
    PRIMITIVES["log_softmax"]: [(W,), (T223, A(axis=-2))],
    PRIMITIVES["layer_norm"]: [(W,), (T223, np.ones(3) * 1.5, V3, A(axis=-1)),
                               (T223, rng.normal(size=(2, 3)), A(axis=1, eps=1e-3)),
                               (T223.astype(np.float32),)],
    PRIMITIVES["rms_norm"]: [(W,), (T223, V3), (T223, A(axis=1))],
    PRIMITIVES["group_norm"]: [(_IMG, S(2), rng.normal(size=4), rng.normal(size=4)),
                               (_IMG, S(4), np.ones(4), np.zeros(4), A(eps=1e-3))],
    PRIMITIVES["instance_norm"]: [(_IMG, rng.normal(size=4), rng.normal(size=4))],
    PRIMITIVES["einsum"]: [(S("ij,jk->ik"), X, M34), (S("bij,bjk->bik"), T223, rng.normal(size=(2, 3, 2))),
                           (S("ij->"), X), (S("...j,j->..."), T223, V3),
                           (S("bIj,Bj->bIB"), T223, rng.normal(size=(4, 3)))],
    PRIMITIVES["attention"]: [(_Q, _K, _V), (_Q, _K, _V, A(causal=True)),
                              (_Q, _K, _V, rng.normal(size=(3, 5)), A(scale=0.3)),
                              (_Q, _K, _V, rng.normal(size=(3, 5)) > 0)],
    PRIMITIVES["attention_probs"]: [(_Q, _K, S(None)), (_Q, _K, rng.normal(size=(3, 5)), A(causal=True))],
    PRIMITIVES["attention_scale"]: [(_Q,), (_Q, A(scale=0.25))],
    PRIMITIVES["swap_last"]: [(X,), (T223,)],
    PRIMITIVES["mask_cotangent"]: [(rng.normal(size=(2, 3, 5)), rng.normal(size=(3, 5))),
                                   (rng.normal(size=(2, 3, 5)), rng.normal(size=(3, 5)) > 0)],
    PRIMITIVES["cross_entropy"]: [(_LOGITS, _TARGET), (_LOGITS, _TARGET, A(reduction="sum")),
                                  (T223, np.array([[0, 1, 1], [1, 0, 1]]), A(axis=1, reduction="none"))],
    PRIMITIVES["nll_loss"]: [(_LOGITS, _TARGET), (_LOGITS, _TARGET, A(reduction="none"))],
    PRIMITIVES["mse_loss"]: [(X, Y), (X, V3, A(reduction="sum")), (X, Y, A(reduction="none"))],
    PRIMITIVES["dropout"]: [(X, S(0.5), S(3)), (X, S(0.5), S(3), A(training=True))],
    PRIMITIVES["tail_mean"]: [(T223, A(axis=1)), (X,)],
    PRIMITIVES["loss_reduce"]: [(X,), (X, A(reduction="sum")), (X, A(reduction="none"))],
    PRIMITIVES["loss_spread"]: [(2.0, X), (1.5, X, A(reduction="sum")), (Y, X, A(reduction="none"))],
    PRIMITIVES["class_mask"]: [(_TARGET, _LOGITS), (np.array([[0, 1, 1], [1, 0, 1]]), T223, A(axis=1))],
    PRIMITIVES["channel_view"]: [(rng.normal(size=4), _IMG)],
    PRIMITIVES["group_view"]: [(_IMG, S(2))],
    PRIMITIVES["einsum_ones"]: [(S("ij,jk->ik"), S(0), X), (S("ij->"), S(0), X)],
})


# -- the bundled examples -------------------------------------------------------------------
_RESNET = resnet18_args(dtype=np.float32)
EXAMPLE_EXPORTS: dict[tuple[str, str], tuple[Optional[list[Any]], list[tuple[Any, ...]], set[str]]] = {
    ("closure", "ms_closure"): ([], [()], set()),
    ("closures", "pick"): ([True, 3], [(True, 3), (False, 3), (True, -2)], {"If"}),
    ("closures", "scaled_square"): ([2.0], [(2.0,), (-1.5,)], set()),
    ("hof", "hof"): ([2.0], [(2.0,), (-3.0,)], set()),
    ("loop", "sum_to"): ([100], [(100,), (0,), (7,)], {"Loop"}),
    ("loop", "newton_sqrt"): ([2.0], [(2.0,), (9.0,)], {"Loop"}),
    ("loop", "halvings"): ([5.0], [(5.0,), (0.5,), (100.0,)], {"Loop", "If"}),
    ("mlp", "mlp_loss"): (None, [(rng.normal(size=(3, 4)), rng.normal(size=(4, 2)),
                                  rng.normal(size=(5, 3)), rng.normal(size=(5, 2))),
                                 (rng.normal(size=(1, 2)), rng.normal(size=(2, 1)),
                                  rng.normal(size=(7, 1)), rng.normal(size=(7, 1)))], set()),
    ("paper_lambda", "main"): ([5.0, 2.0], [(5.0, 2.0), (1.5, -3.0)], set()),
    ("power", "power"): ([2.0, 3], [(2.0, 3), (1.5, 0), (-2.0, 5)], {"Loop"}),
    # A counted loop: rewritten to fori_loop before AD, its gradient is two Loops (a scan
    # forward, a reversed scan backward).
    ("power", "dpower"): ([2.0], [(2.0,), (-1.5,)], {"Loop", "ScatterND"}),
    # Counting down (`if k == 0 then x else step(k - 1, ...)`): a counted loop too.
    ("loop", "dnewton_sqrt"): ([4.0], [(4.0,), (2.0,), (9.0,)], {"Loop", "ScatterND"}),
    ("mlp2", "mlp2_loss"): (None, [tuple(rng.normal(size=s) for s in [(3, 4), (4,), (4, 2), (2,), (5, 3),
                                                                       (5, 2)])], set()),
    ("mlp2", "mlp2_step"): (None, [tuple(rng.normal(size=s) for s in [(3, 4), (4,), (4, 2), (2,), (5, 3),
                                                                       (5, 2)])], set()),
    ("transformer", "encoder_block"): (list(transformer_args()[:2]), [transformer_args(1)[:2]],
                                       {"Softmax", "MatMul"}),
    ("transformer", "block_loss"): (list(transformer_args()), [transformer_args(2)], {"Softmax"}),
    ("transformer", "block_grad"): (list(transformer_args()), [transformer_args(3)], {"Softmax"}),
    # f32: onnxruntime's Conv and pools are f32 only
    ("resnet18", "resnet18"): (list(_RESNET[:2]), [resnet18_args(1, dtype=np.float32)[:2]],
                               {"Conv", "MaxPool", "GlobalAveragePool"}),
    ("resnet18", "resnet18_loss"): (list(_RESNET), [resnet18_args(2, dtype=np.float32)], {"Conv"}),
    ("resnet18", "resnet18_grad"): (list(_RESNET), [resnet18_args(2, dtype=np.float32)],
                                    {"Conv", "ScatterElements"}),
}
"""(file, definition) → (compile args, runs, ONNX ops the model must use)."""

EXAMPLE_NOT_FIRST_ORDER: dict[tuple[str, str], tuple[Optional[list[Any]], str]] = {
    ("closure", "func_outer"): ([1, 2], "returns a function"),
    ("closures", "make_adder"): ([1], "returns a function"),
    ("closures", "compose"): (None, "takes functions"),
    ("closures", "twice"): (None, "takes a function"),
    ("closures", "counter"): ([1, 2], "a loop whose result is a function"),
    ("closures", "drain"): (None, "takes a function"),
    ("closures", "main"): ([], "a loop whose result is a function"),
    ("fibonacci", "fibonacci"): ([10], "not in tail position"),
    ("loop", "dhalvings"): ([5.0], "a loop whose result is a function"),
    ("loop", "main"): ([], "a loop whose result is a function"),
}
"""Definitions that are not first-order after optimization, with what the error says."""


CNN = """\
# A small CNN: conv, max pooling, conv, average pooling, a linear layer, a squared error.
def cnn_loss(w1: f32[4, 1, 3, 3], b1: f32[4], w2: f32[6, 4, 3, 3], w3: f32[12, 3], b3: f32[3],
             x: f32[B, 1, 8, 8], y: f32[B, 3]) -> f32 =
  let h1 = relu(conv(x, w1, b1, padding=1)) in
  let p1 = max_pool(h1, 2) in
  let h2 = tanh(conv(p1, w2, padding=(1, 1, 0, 0), stride=(1, 2))) in
  let p2 = avg_pool(h2, 2, padding=(1, 0), count_include_pad=false) in
  let out = reshape(p2, (shape(p2)[0], 12)) @ w3 + b3 in
  mean((out - y) ** 2)

def cnn_step(w1, b1, w2, w3, b3, x, y, rate) =
  let vg = value_and_grad(cnn_loss, 0, 1, 2, 3, 4)(w1, b1, w2, w3, b3, x, y) in
  let g = vg[1] in
  (vg[0], w1 - rate * g[0], b1 - rate * g[1], w2 - rate * g[2], w3 - rate * g[3], b3 - rate * g[4])
"""
"""A CNN loss and its training step (ONNX export of the gradient graph of conv and pooling)."""


def cnn_data(seed: int, batch: int = 4) -> tuple[np.ndarray, ...]:
    """(w1, b1, w2, w3, b3, x, y) for :data:`CNN`, float32."""
    data = np.random.default_rng(seed)
    shapes = [(4, 1, 3, 3), (4,), (6, 4, 3, 3), (12, 3), (3,), (batch, 1, 8, 8), (batch, 3)]
    scales = [0.5, 0.1, 0.3, 0.3, 0.1, 1.0, 1.0]
    return tuple((data.normal(size=s) * k).astype(np.float32) for s, k in zip(shapes, scales))

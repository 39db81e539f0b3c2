"""Sample arguments for the exporters' rule tests, and the bundled examples each
exporter writes (shared by test_onnx_export.py and test_coreml_export.py)."""

from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from anfir.interop.flat import DIM
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


# -- the bundled examples -------------------------------------------------------------------
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
    ("loop", "dnewton_sqrt"): ([4.0], "a loop whose result is a function"),
    ("loop", "main"): ([], "a loop whose result is a function"),
    ("power", "dpower"): ([2.0], "a loop whose result is a function"),
}
"""Definitions that are not first-order after optimization, with what the error says."""

"""Expansions of the elementwise family (anfir/primitives/elementwise.py) and of the
composite activations of arith (softplus): each the formula anfir evaluates."""

from __future__ import annotations

import math

from anfir.decompositions.builder import ExpansionBuilder, Decomposition
from anfir.decompositions.common import as_dtype, optional, out_dtype
from anfir.ir.nodes import Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.primitives import arith, elementwise, tensor

SELU_ALPHA = 1.6732632423543772848170429916717
"""PyTorch's selu alpha."""
SELU_SCALE = 1.0507009873554804934193349852946
"""PyTorch's selu scale."""


def _x(b: ExpansionBuilder) -> Node:
    return as_dtype(b, b.arg(0), out_dtype(b))


def softplus_of(b: ExpansionBuilder, x: Node) -> Node:
    """relu(x) + log1p(exp(-|x|)): no overflow."""
    tail = b.call(elementwise.log1p, b.call(arith.exp, b.call(arith.neg, b.call(arith.abs_, x))))
    return b.call(arith.add, b.call(arith.relu, x), tail)


def _softplus(b: ExpansionBuilder) -> Node:
    return softplus_of(b, _x(b))


def _softsign(b: ExpansionBuilder) -> Node:
    """x / (1 + |x|)."""
    x = _x(b)
    return b.call(arith.div, x, b.call(arith.add, 1.0, b.call(arith.abs_, x)))


def _silu(b: ExpansionBuilder) -> Node:
    """x * sigmoid(x)."""
    x = _x(b)
    return b.call(arith.mul, x, b.call(arith.sigmoid, x))


def _mish(b: ExpansionBuilder) -> Node:
    """x * tanh(softplus(x))."""
    x = _x(b)
    return b.call(arith.mul, x, b.call(arith.tanh, b.call(arith.softplus, x)))


def _negative_branch(b: ExpansionBuilder, x: Node, alpha: float) -> Node:
    """x where x > 0, else alpha * expm1(x)."""
    negative = b.call(arith.mul, alpha, b.call(elementwise.expm1, x))
    return b.call(tensor.where, b.call(arith.gt, x, 0.0), x, negative)


def _elu(b: ExpansionBuilder) -> Node:
    return _negative_branch(b, _x(b), float(b.attrs["alpha"]))


def _selu(b: ExpansionBuilder) -> Node:
    """scale * elu(x, alpha) with PyTorch's constants."""
    return b.call(arith.mul, SELU_SCALE, _negative_branch(b, _x(b), SELU_ALPHA))


def _leaky_relu(b: ExpansionBuilder) -> Node:
    """x where x >= 0, else alpha * x."""
    x = _x(b)
    return b.call(tensor.where, b.call(arith.ge, x, 0.0), x,
                  b.call(arith.mul, float(b.attrs["alpha"]), x))


def hard_sigmoid_of(b: ExpansionBuilder, x: Node, alpha: float, beta: float) -> Node:
    """min(max(alpha x + beta, 0), 1)."""
    line = b.call(arith.add, b.call(arith.mul, alpha, x), beta)
    return b.call(arith.minimum, b.call(arith.maximum, line, 0.0), 1.0)


def _hard_sigmoid(b: ExpansionBuilder) -> Node:
    return hard_sigmoid_of(b, _x(b), float(b.attrs["alpha"]), float(b.attrs["beta"]))


def _hard_swish(b: ExpansionBuilder) -> Node:
    """x * min(max(x / 6 + 1/2, 0), 1)."""
    x = _x(b)
    return b.call(arith.mul, x, hard_sigmoid_of(b, x, 1.0 / 6.0, 0.5))


def _gelu(b: ExpansionBuilder) -> Node:
    """x * Φ(x): 0.5 x (1 + erf(x / √2)), or the tanh approximation."""
    x = _x(b)
    if b.attrs.get("approximate") == "tanh":
        cube = b.call(arith.mul, b.call(arith.mul, b.call(arith.mul, 0.044715, x), x), x)
        inner = b.call(arith.mul, math.sqrt(2.0 / math.pi), b.call(arith.add, x, cube))
        phi = b.call(arith.add, 1.0, b.call(arith.tanh, inner))
    else:
        phi = b.call(arith.add, 1.0, b.call(elementwise.erf, b.call(arith.mul, x, 1.0 / math.sqrt(2.0))))
    return b.call(arith.mul, b.call(arith.mul, 0.5, x), phi)


def _clip(b: ExpansionBuilder) -> Node:
    """maximum(x, lo) then minimum(., hi): the bounds from the arguments or the min/max
    attributes (None: no bound), in the result's dtype."""
    d = out_dtype(b)
    result = _x(b)
    given = [optional(b, 1), optional(b, 2)]
    for bound, attr, prim in ((given[0], "min", arith.maximum), (given[1], "max", arith.minimum)):
        if bound is None and b.attrs.get(attr) is not None:
            bound = b.const(b.attrs[attr])
        if bound is not None:
            # a constant bound is weak (a Python number), a computed one takes d
            result = b.call(prim, result, bound if isinstance(bound, ValueNode) else as_dtype(b, bound, d))
    return result


def _atan2(b: ExpansionBuilder) -> Node:
    """atan2(y, x) from atan(y / x) and the quadrant (x = 0: ±π/2 by y's sign, 0 at 0)."""
    d = out_dtype(b)
    y, x = as_dtype(b, b.arg(0), d), as_dtype(b, b.arg(1), d)
    base = b.call(elementwise.atan, b.call(arith.div, y, x))
    left = b.call(tensor.where, b.call(arith.lt, y, 0.0), b.call(arith.sub, base, math.pi),
                  b.call(arith.add, base, math.pi))
    vertical = b.call(tensor.where, b.call(arith.gt, y, 0.0), b.typed(math.pi / 2, d),
                      b.call(tensor.where, b.call(arith.lt, y, 0.0), b.typed(-math.pi / 2, d),
                             b.typed(0.0, d)))
    result = b.call(tensor.where, b.call(arith.lt, x, 0.0), left, base)
    return b.call(tensor.where, b.call(arith.eq, x, 0.0), vertical, result)


DECOMPOSITIONS: dict[Primitive, Decomposition] = {
    elementwise.atan2: _atan2, elementwise.clip: _clip,
    # the activations: smooth, then piecewise
    arith.softplus: _softplus, elementwise.softsign: _softsign, elementwise.silu: _silu,
    elementwise.mish: _mish, elementwise.gelu: _gelu,
    elementwise.leaky_relu: _leaky_relu, elementwise.elu: _elu, elementwise.selu: _selu,
    elementwise.hard_sigmoid: _hard_sigmoid, elementwise.hard_swish: _hard_swish,
}
"""The elementwise family's expansions."""

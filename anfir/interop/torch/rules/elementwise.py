"""The torch.export rules whose result is built from
the elementwise functions and logic of :mod:`anfir.primitives.elementwise`:
clamps, activations (gelu, elu, hard*), rounding, bitwise ops.

See :mod:`anfir.interop.torch.rules.common` for the rule protocol.
"""

from __future__ import annotations

import operator
from typing import Any

from anfir.errors import AnfirError
from anfir.interop.torch.rules.common import RuleTable, binary, unary
from anfir.primitives import arith, elementwise, structure, tensor


def _clamp(b: Any, x: Any, min: Any = None, max: Any = None) -> Any:
    return b.call(elementwise.clip, x, min=min, max=max)


def _hardtanh(b: Any, x: Any, min_val: Any = -1.0, max_val: Any = 1.0) -> Any:
    """``hardtanh`` (ReLU6 is ``hardtanh(x, 0, 6)``): the value of ``clip``, but
    PyTorch's gradient, which is 0 at the bounds (``clamp``'s, and anfir
    ``clip``'s, is 1 there): ``x`` strictly inside, else the clipped value read
    through ``stop_gradient``.  Exact: inside, ``clip`` would return ``x``."""
    lo, hi = float(min_val), float(max_val)
    inside = b.call(arith.logical_and, b.call(arith.gt, x, lo), b.call(arith.lt, x, hi))
    held = b.call(elementwise.clip, b.call(structure.stop_gradient, x), min=lo, max=hi)
    return b.call(tensor.where, inside, x, held)


def _hardsigmoid(b: Any, x: Any) -> Any:
    """``hardsigmoid``: anfir's ``hard_sigmoid`` with PyTorch's slope; its gradient
    is 0 at -3 and 3, as PyTorch's (the decomposed form, through ``clamp``, is not)."""
    return b.call(elementwise.hard_sigmoid, x, alpha=1.0 / 6.0, beta=0.5)


def _gelu(b: Any, x: Any, *, approximate: str = "none") -> Any:
    return b.call(elementwise.gelu, x, approximate=approximate)


def _leaky_relu(b: Any, x: Any, negative_slope: Any = 0.01) -> Any:
    return b.call(elementwise.leaky_relu, x, alpha=float(negative_slope))


def _elu(b: Any, x: Any, alpha: Any = 1.0, scale: Any = 1.0, input_scale: Any = 1.0) -> Any:
    """``elu`` -> anfir's ``elu`` (its gradient at 0 is alpha's branch, as PyTorch's)."""
    if float(scale) != 1.0 or float(input_scale) != 1.0:
        raise AnfirError("elu with scale or input_scale other than 1", b.loc)
    return b.call(elementwise.elu, x, alpha=float(alpha))


def _trunc(b: Any, x: Any) -> Any:
    return b.call(tensor.where, b.call(arith.lt, x, 0.0), b.call(elementwise.ceil, x),
                  b.call(elementwise.floor, x))


def _clamp_tensor(b: Any, x: Any, min: Any = None, max: Any = None) -> Any:
    """``clamp`` with tensor bounds: ``clip(x, lo, hi)`` (PyTorch's gradient: to x at
    the bounds, to a bound where it is strictly the result)."""
    if min is None and max is None:
        return b.call(structure.identity, x)
    if max is None:
        return b.call(elementwise.clip, x, min)
    if min is None:
        return _clamp_max_only(b, x, max)
    return b.call(elementwise.clip, x, min, max)


def _clamp_max_only(b: Any, x: Any, hi: Any) -> Any:
    # clip(-x, -hi) negated: the two-argument clip is a lower bound.
    return b.call(arith.neg, b.call(elementwise.clip, b.call(arith.neg, x), b.call(arith.neg, hi)))


def rules(torch: Any, table: RuleTable) -> None:
    """Add this family's rules to ``table``."""
    aten = torch.ops.aten
    put, named = table.put, table.named
    for name, prim in (("rsqrt", elementwise.rsqrt), ("erf", elementwise.erf),
                       ("expm1", elementwise.expm1), ("log1p", elementwise.log1p),
                       ("floor", elementwise.floor), ("ceil", elementwise.ceil),
                       ("round", elementwise.round_), ("reciprocal", elementwise.reciprocal),
                       ("tan", elementwise.tan), ("atan", elementwise.atan), ("sinh", elementwise.sinh),
                       ("cosh", elementwise.cosh), ("asin", elementwise.asin), ("acos", elementwise.acos),
                       ("isnan", elementwise.isnan), ("isinf", elementwise.isinf),
                       ("bitwise_not", elementwise.bitwise_not), ("silu", elementwise.silu),
                       ("mish", elementwise.mish)):
        named(name, "default", unary(prim))
    for op, prim in ((aten.atan2.default, elementwise.atan2), (aten.fmod.Tensor, elementwise.fmod),
                     (aten.fmod.Scalar, elementwise.fmod), (aten.remainder.Tensor, elementwise.mod),
                     (aten.remainder.Scalar, elementwise.mod),
                     (aten.logical_xor.default, elementwise.logical_xor),
                     (aten.bitwise_and.Tensor, elementwise.bitwise_and),
                     (aten.bitwise_or.Tensor, elementwise.bitwise_or),
                     (aten.bitwise_xor.Tensor, elementwise.bitwise_xor)):
        put(op, binary(prim))
    put(aten.clamp.default, _clamp)
    put(aten.hardtanh.default, _hardtanh)
    put(aten.hardsigmoid.default, _hardsigmoid)
    put(aten.hardswish.default, unary(elementwise.hard_swish))
    put(aten.elu.default, _elu)
    put(aten.gelu.default, _gelu)
    put(aten.leaky_relu.default, _leaky_relu)
    for py_op, prim in ((operator.floordiv, elementwise.floor_div), (operator.mod, elementwise.mod)):
        put(py_op, binary(prim))
    for dunder, prim in (("__and__", elementwise.bitwise_and), ("__or__", elementwise.bitwise_or),
                         ("__xor__", elementwise.bitwise_xor)):
        named(dunder, "Tensor", binary(prim))
    named("trunc", "default", _trunc)
    named("clamp", "Tensor", _clamp_tensor)
    named("atan2", "out", lambda b, x, y, *, out=None: b.call(elementwise.atan2, x, y))
    for name, prim in (("bitwise_and", elementwise.bitwise_and), ("bitwise_or", elementwise.bitwise_or),
                       ("bitwise_xor", elementwise.bitwise_xor)):
        named(name, "Scalar", binary(prim))

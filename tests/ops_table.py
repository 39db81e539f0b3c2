"""The operators of the op library under test, with their references.

One :class:`Op` per case: how to call it in ANF (``call``, with ``{x}``,
``{y}`` for the arguments), a numpy reference, a PyTorch reference (None when
PyTorch has no such function), the domain arguments are drawn from, and
whether it is differentiable (``grad``) and smooth enough for second-order
checks (``second``).  ``tests/test_ops.py`` checks each case against all of
them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

Ref = Callable[..., Any]


@dataclass(frozen=True)
class Op:
    """One operator case."""

    id: str
    """The case's name (the primitive, with a suffix when attributes vary)."""
    call: str
    """The call in ANF over ``{x}`` (and ``{y}``): ``gelu({x}, approximate="tanh")``."""
    ref: Ref
    """The numpy reference on arrays."""
    torch: Optional[Callable[..., Any]] = None
    """``torch(torch_module, *tensors)``, or None."""
    low: float = -2.0
    high: float = 2.0
    """The interval arguments are drawn from."""
    nargs: int = 1
    grad: bool = True
    """Differentiable in its (first) float arguments."""
    second: bool = True
    """Smooth: second derivatives are checked too."""
    kind: str = "float"
    """``float`` arguments, or ``int`` / ``bool`` ones."""
    keeps_dtype: bool = True
    """The result has the float dtype of the argument."""
    torch_rtol: float = 0.0
    """A looser tolerance against PyTorch, when PyTorch computes in less precision."""


_ERF = np.frompyfunc(math.erf, 1, 1)


def np_erf(x: Any) -> Any:
    dtype = np.result_type(x)
    return np.asarray(_ERF(np.asarray(x, np.float64)), np.float64).astype(dtype)


def np_sigmoid(x: Any) -> Any:
    return 1.0 / (1.0 + np.exp(-x))


SELU_ALPHA = 1.6732632423543772848170429916717
SELU_SCALE = 1.0507009873554804934193349852946


def np_gelu_tanh(x: Any) -> Any:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


UNARY: list[Op] = [
    Op("erf", "erf({x})", np_erf, lambda t, x: t.erf(x)),
    Op("expm1", "expm1({x})", np.expm1, lambda t, x: t.expm1(x)),
    Op("log1p", "log1p({x})", np.log1p, lambda t, x: t.log1p(x), low=-0.8),
    Op("floor", "floor({x})", np.floor, lambda t, x: t.floor(x), grad=False),
    Op("ceil", "ceil({x})", np.ceil, lambda t, x: t.ceil(x), grad=False),
    Op("round", "round({x})", np.round, lambda t, x: t.round(x), grad=False, low=-4.0, high=4.0),
    Op("reciprocal", "reciprocal({x})", lambda x: 1.0 / x, lambda t, x: t.reciprocal(x),
       low=0.5, high=2.0),
    Op("rsqrt", "rsqrt({x})", lambda x: 1.0 / np.sqrt(x), lambda t, x: t.rsqrt(x), low=0.3),
    Op("square", "square({x})", np.square, lambda t, x: t.square(x)),
    Op("tan", "tan({x})", np.tan, lambda t, x: t.tan(x), low=-1.2, high=1.2),
    Op("atan", "atan({x})", np.arctan, lambda t, x: t.atan(x)),
    Op("sinh", "sinh({x})", np.sinh, lambda t, x: t.sinh(x)),
    Op("cosh", "cosh({x})", np.cosh, lambda t, x: t.cosh(x)),
    Op("asin", "asin({x})", np.arcsin, lambda t, x: t.asin(x), low=-0.9, high=0.9),
    Op("acos", "acos({x})", np.arccos, lambda t, x: t.acos(x), low=-0.9, high=0.9),
    Op("softplus", "softplus({x})", lambda x: np.logaddexp(0, x),
       lambda t, x: t.nn.functional.softplus(x)),
    Op("softsign", "softsign({x})", lambda x: x / (1 + np.abs(x)),
       lambda t, x: t.nn.functional.softsign(x), second=False),
    Op("silu", "silu({x})", lambda x: x * np_sigmoid(x), lambda t, x: t.nn.functional.silu(x)),
    Op("mish", "mish({x})", lambda x: x * np.tanh(np.logaddexp(0, x)),
       lambda t, x: t.nn.functional.mish(x)),
    Op("gelu", "gelu({x})", lambda x: 0.5 * x * (1 + np_erf(x / math.sqrt(2))),
       lambda t, x: t.nn.functional.gelu(x)),
    Op("gelu_tanh", 'gelu({x}, approximate="tanh")', np_gelu_tanh,
       lambda t, x: t.nn.functional.gelu(x, approximate="tanh")),
    Op("leaky_relu", "leaky_relu({x})", lambda x: np.where(x >= 0, x, 0.01 * x),
       lambda t, x: t.nn.functional.leaky_relu(x), second=False),
    Op("leaky_relu_alpha", "leaky_relu({x}, alpha=0.2)", lambda x: np.where(x >= 0, x, 0.2 * x),
       lambda t, x: t.nn.functional.leaky_relu(x, 0.2), second=False),
    Op("elu", "elu({x})", lambda x: np.where(x > 0, x, np.expm1(x)),
       lambda t, x: t.nn.functional.elu(x), second=False),
    Op("elu_alpha", "elu({x}, alpha=0.5)", lambda x: np.where(x > 0, x, 0.5 * np.expm1(x)),
       lambda t, x: t.nn.functional.elu(x, 0.5), second=False),
    Op("selu", "selu({x})", lambda x: SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * np.expm1(x)),
       lambda t, x: t.nn.functional.selu(x), second=False),
    Op("hard_sigmoid", "hard_sigmoid({x})", lambda x: np.clip(0.2 * x + 0.5, 0, 1), None,
       low=-4.0, high=4.0, second=False),
    Op("hard_sigmoid_torch", "hard_sigmoid({x}, alpha=0.16666666666666666, beta=0.5)",
       lambda x: np.clip(x / 6 + 0.5, 0, 1), lambda t, x: t.nn.functional.hardsigmoid(x),
       low=-4.0, high=4.0, second=False, torch_rtol=1e-7),  # torch's gradient uses f32 1/6
    Op("hard_swish", "hard_swish({x})", lambda x: x * np.clip(x / 6 + 0.5, 0, 1),
       lambda t, x: t.nn.functional.hardswish(x), low=-4.0, high=4.0, second=False),
    Op("clip", "clip({x}, min=-0.5, max=0.7)", lambda x: np.clip(x, -0.5, 0.7),
       lambda t, x: t.clamp(x, -0.5, 0.7), second=False),
    Op("clip_min", "clip({x}, min=0.1)", lambda x: np.maximum(x, 0.1),
       lambda t, x: t.clamp(x, min=0.1), second=False),
]
"""Elementwise operators of one float argument."""

BINARY: list[Op] = [
    Op("floor_div", "floor_div({x}, {y})", np.floor_divide,
       lambda t, x, y: t.div(x, y, rounding_mode="floor"), nargs=2, grad=False, low=0.5, high=3.0),
    Op("mod", "mod({x}, {y})", np.mod, lambda t, x, y: t.remainder(x, y), nargs=2, grad=False,
       low=0.5, high=3.0),
    Op("fmod", "fmod({x}, {y})", np.fmod, lambda t, x, y: t.fmod(x, y), nargs=2, low=0.5, high=3.0,
       second=False),
    Op("atan2", "atan2({x}, {y})", np.arctan2, lambda t, x, y: t.atan2(x, y), nargs=2, low=0.3),
    Op("max2", "max({x}, {y})", np.maximum, lambda t, x, y: t.maximum(x, y), nargs=2, second=False),
    Op("min2", "min({x}, {y})", np.minimum, lambda t, x, y: t.minimum(x, y), nargs=2, second=False),
    Op("clip_tensors", "clip({x}, {y}, 0.8)", lambda x, y: np.minimum(np.maximum(x, y), 0.8),
       lambda t, x, y: t.clamp(x, y, t.tensor(0.8, dtype=x.dtype)), nargs=2, second=False),
]
"""Elementwise operators of two float arguments (broadcast)."""

PREDICATES: list[Op] = [
    Op("isnan", "isnan({x})", np.isnan, lambda t, x: t.isnan(x), grad=False, keeps_dtype=False),
    Op("isinf", "isinf({x})", np.isinf, lambda t, x: t.isinf(x), grad=False, keeps_dtype=False),
]
"""Float in, bool out."""

INTEGER: list[Op] = [
    Op("logical_xor", "logical_xor({x}, {y})", np.logical_xor,
       lambda t, x, y: t.logical_xor(x, y), nargs=2, kind="bool", grad=False),
    Op("bitwise_and", "bitwise_and({x}, {y})", np.bitwise_and,
       lambda t, x, y: t.bitwise_and(x, y), nargs=2, kind="int", grad=False),
    Op("bitwise_or", "bitwise_or({x}, {y})", np.bitwise_or,
       lambda t, x, y: t.bitwise_or(x, y), nargs=2, kind="int", grad=False),
    Op("bitwise_xor", "bitwise_xor({x}, {y})", np.bitwise_xor,
       lambda t, x, y: t.bitwise_xor(x, y), nargs=2, kind="int", grad=False),
    Op("bitwise_not", "bitwise_not({x})", np.invert, lambda t, x: t.bitwise_not(x),
       kind="int", grad=False),
    Op("bit_shift", "bit_shift({x}, {y})", np.left_shift,
       lambda t, x, y: t.bitwise_left_shift(x, y), nargs=2, kind="int", grad=False),
    Op("bit_shift_right", 'bit_shift({x}, {y}, direction="right")', np.right_shift,
       lambda t, x, y: t.bitwise_right_shift(x, y), nargs=2, kind="int", grad=False),
]
"""Integer and boolean operators."""


@dataclass(frozen=True)
class Reduction:
    """A reduction case: ``name`` applied with the keyword arguments in ``kw``."""

    name: str
    ref: Ref
    """``ref(x, axis, keepdims, **kw)`` in numpy."""
    torch: Optional[Callable[..., Any]] = None
    """``torch(torch_module, x, dims, keepdims, **kw)``, or None."""
    kw: tuple[tuple[str, Any], ...] = ()
    grad: bool = True
    second: bool = True
    low: float = -2.0
    high: float = 2.0
    empty_ok: bool = True
    """Defined on an empty reduction (max of nothing is an error)."""
    result: str = "float"
    """``float``: the float dtype of x; ``bool``; ``i64``."""
    arg: str = "x"
    """What is reduced, in ANF (``x > 0.0`` for ``all``)."""

    @property
    def id(self) -> str:
        return self.name + "".join(f"_{k}{v}" for k, v in self.kw)


def np_logsumexp(x: Any, axis: Any, keepdims: bool) -> Any:
    with np.errstate(all="ignore"):
        return np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))


def np_norm(x: Any, axis: Any, keepdims: bool, ord: float = 2) -> Any:
    a = np.abs(x)
    if ord == math.inf:
        return np.max(a, axis=axis, keepdims=keepdims)
    if ord == 0:
        return np.sum(a != 0, axis=axis, keepdims=keepdims).astype(x.dtype)
    return np.sum(a ** ord, axis=axis, keepdims=keepdims) ** (1 / ord)


def _dims(axis: Any, ndim: int) -> Any:
    if axis is None:
        return tuple(range(ndim))
    return axis


REDUCTIONS: list[Reduction] = [
    Reduction("sum", lambda x, a, k: np.sum(x, axis=a, keepdims=k),
              lambda t, x, d, k: t.sum(x, dim=d, keepdim=k)),
    Reduction("mean", lambda x, a, k: np.mean(x, axis=a, keepdims=k),
              lambda t, x, d, k: t.mean(x, dim=d, keepdim=k), empty_ok=False),
    Reduction("max", lambda x, a, k: np.max(x, axis=a, keepdims=k),
              lambda t, x, d, k: t.amax(x, dim=d, keepdim=k), empty_ok=False, second=False),
    Reduction("min", lambda x, a, k: np.min(x, axis=a, keepdims=k),
              lambda t, x, d, k: t.amin(x, dim=d, keepdim=k), empty_ok=False, second=False),
    Reduction("prod", lambda x, a, k: np.prod(x, axis=a, keepdims=k),
              lambda t, x, d, k: _torch_prod(t, x, d, k), low=0.5, high=1.5),
    Reduction("var", lambda x, a, k: np.var(x, axis=a, keepdims=k),
              lambda t, x, d, k: t.var(x, dim=d, keepdim=k, correction=0), empty_ok=False),
    Reduction("var", lambda x, a, k, correction: np.var(x, axis=a, keepdims=k, ddof=correction),
              lambda t, x, d, k, correction: t.var(x, dim=d, keepdim=k, correction=correction),
              kw=(("correction", 1),), empty_ok=False),
    Reduction("std", lambda x, a, k: np.std(x, axis=a, keepdims=k),
              lambda t, x, d, k: t.std(x, dim=d, keepdim=k, correction=0), empty_ok=False),
    Reduction("logsumexp", np_logsumexp, lambda t, x, d, k: t.logsumexp(x, dim=d, keepdim=k)),
    Reduction("all", lambda x, a, k: np.all(x > 0, axis=a, keepdims=k),
              lambda t, x, d, k: _torch_all(t, x > 0, d, k), grad=False, result="bool",
              arg="x > 0.0"),
    Reduction("any", lambda x, a, k: np.any(x > 0, axis=a, keepdims=k),
              lambda t, x, d, k: _torch_any(t, x > 0, d, k), grad=False, result="bool",
              arg="x > 0.0"),
    Reduction("norm", lambda x, a, k: np_norm(x, a, k),
              lambda t, x, d, k: t.linalg.vector_norm(x, dim=d, keepdim=k)),
    Reduction("norm", lambda x, a, k, ord: np_norm(x, a, k, ord),
              lambda t, x, d, k, ord: t.linalg.vector_norm(x, ord=ord, dim=d, keepdim=k),
              kw=(("ord", 1),), second=False),
    Reduction("norm", lambda x, a, k, ord: np_norm(x, a, k, ord),
              lambda t, x, d, k, ord: t.linalg.vector_norm(x, ord=ord, dim=d, keepdim=k),
              kw=(("ord", 3),)),
    Reduction("norm", lambda x, a, k, ord: np_norm(x, a, k, ord),
              lambda t, x, d, k, ord: t.linalg.vector_norm(x, ord=ord, dim=d, keepdim=k),
              kw=(("ord", math.inf),), second=False, empty_ok=False),
]
"""Reductions over ``axis`` with ``keepdims``; ``all``/``any`` apply to ``x > 0``."""


def _torch_prod(t: Any, x: Any, dims: Any, keepdim: bool) -> Any:
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    for d in sorted((d % x.ndim for d in dims), reverse=True) if x.ndim else ():
        x = t.prod(x, dim=d, keepdim=keepdim)
    return x


def _torch_all(t: Any, x: Any, dims: Any, keepdim: bool) -> Any:
    return t.all(x, dim=dims, keepdim=keepdim) if x.ndim else x


def _torch_any(t: Any, x: Any, dims: Any, keepdim: bool) -> Any:
    return t.any(x, dim=dims, keepdim=keepdim) if x.ndim else x


def torch_dims(axis: Any, ndim: int) -> Any:
    """``axis`` as torch's ``dim`` (a tuple of every axis for None)."""
    return _dims(axis, ndim)

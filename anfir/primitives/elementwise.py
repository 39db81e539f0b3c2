"""Elementwise functions beyond the basic arithmetic: math, activations, division
variants, predicates and bitwise operations (the shared spec ``ops.md``).

Each is one :func:`declare`.  Evaluation is numpy's (``math`` where numpy has
no vectorised form: ``erf``), with numpy broadcasting and dtypes: an ``f32``
tensor stays ``f32`` (constants in the formulas are Python floats, which numpy
treats as weak), Python scalars give Python scalars, numpy scalars numpy
scalars (:func:`_elementwise`).  Shapes and dtypes are inferred by
``rules.elementwise``, which runs the same evaluation on samples.  Gradient
rules are ANF text (so they are differentiable again); a rule's parameters are
the inputs, then the attributes (``alpha``...), then ``out`` and ``dout``.
"""

from __future__ import annotations

import functools
import importlib
import math
from typing import Any, Callable

import numpy as np

from anfir.abstract import rules
from anfir.dtypes import numpy_kind, weak_scalars
from anfir.errors import AnfirTypeError
from anfir.primitives import array_kernels
from anfir.primitives.registry import declare

FAMILY = "elementwise"
LOGIC = "logic"
_PYTHON_SCALARS = (bool, int, float, complex)


def _elementwise(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` evaluated without numpy warnings (out-of-domain elements give nan or
    inf, as numpy does), returning a scalar of the inputs' kind when no input is
    an array: a Python scalar for Python scalars, a numpy scalar otherwise."""
    @functools.wraps(fn)
    def impl(*args: Any, **attrs: Any) -> Any:
        if len(args) == 2:
            args = weak_scalars(*args)
        with np.errstate(all="ignore"):
            result = fn(*args, **attrs)
        if isinstance(result, np.ndarray) and result.ndim == 0 \
                and not any(isinstance(a, np.ndarray) for a in args):
            result = result[()]
        if isinstance(result, np.generic) and all(type(a) in _PYTHON_SCALARS for a in args):
            return result.item()
        return result

    return impl


def _float_dtype(x: Any) -> Any:
    """The float dtype a function of ``x`` computes in (numpy's: ints give f64)."""
    dtype = np.result_type(x)
    return dtype if numpy_kind(dtype) in ("float", "complex") else np.dtype(np.float64)


_SPECIAL: list[Any] = []
"""scipy.special, once loaded (its import takes ~0.3 s: not paid by ``import anfir``)."""


def _erf(x: Any) -> Any:
    """erf(x), elementwise: scipy's vectorised ufunc (Cephes in f64, rounded to
    x's float dtype — what math.erf element by element gave, ~10x faster)."""
    if not _SPECIAL:
        # importlib: scipy ships no type stubs, and its module is only called here.
        _SPECIAL.append(importlib.import_module("scipy.special"))
    dtype = _float_dtype(x)
    array = np.asarray(x)
    if array.dtype not in (np.float32, np.float64):
        array = array.astype(np.float64)  # f16/bf16/ints: computed in f64
    return np.asarray(_SPECIAL[0].erf(array)).astype(dtype, copy=False)


def _float_unary(np_fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``np_fn`` applied in x's float dtype (integers computed in f64)."""
    def fn(x: Any) -> Any:
        return np_fn(np.asarray(x, _float_dtype(x)))

    fn.__name__ = getattr(np_fn, "__name__", "fn")
    return fn


def _reciprocal(x: Any) -> Any:
    """1 / x."""
    return np.true_divide(1.0, np.asarray(x, _float_dtype(x)))


def _rsqrt(x: Any) -> Any:
    """1 / sqrt(x)."""
    return np.true_divide(1.0, np.sqrt(np.asarray(x, _float_dtype(x))))


def _square(x: Any) -> Any:
    """x * x (integers stay integers)."""
    return np.multiply(x, x)


def _softsign(x: Any) -> Any:
    """x / (1 + |x|)."""
    x = np.asarray(x, _float_dtype(x))
    return x / (1.0 + np.abs(x))


def _sigmoid(x: Any) -> Any:
    """The logistic function, without overflow (numpy arrays)."""
    return 0.5 * (np.tanh(0.5 * x) + 1.0)


def _silu(x: Any) -> Any:
    """x * sigmoid(x)."""
    x = np.asarray(x, _float_dtype(x))
    return x * _sigmoid(x)


def _mish(x: Any) -> Any:
    """x * tanh(softplus(x))."""
    x = np.asarray(x, _float_dtype(x))
    return x * np.tanh(np.logaddexp(0.0, x))


_GELU_TANH = math.sqrt(2.0 / math.pi)
_GELU_CUBIC = 0.044715


def _gelu(x: Any, approximate: str = "none") -> Any:
    """x * Φ(x), exactly (erf) or with the tanh approximation."""
    x = np.asarray(x, _float_dtype(x))
    if approximate == "none":
        return 0.5 * x * (1.0 + _erf(x * (1.0 / math.sqrt(2.0))))
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(_GELU_TANH * (x + _GELU_CUBIC * x * x * x)))
    raise AnfirTypeError(f'the attribute approximate of gelu is "none" or "tanh", not {approximate!r}')


def _number(value: Any, name: str, what: str) -> float:
    """A number attribute checked (a located type error otherwise)."""
    return rules.float_attr(value, name, what)  # type: ignore[return-value]


def _leaky_relu(x: Any, alpha: float = 0.01) -> Any:
    """x where x >= 0, else alpha * x (ONNX LeakyRelu)."""
    alpha = _number(alpha, "alpha", "leaky_relu")
    x = np.asarray(x, _float_dtype(x))
    return np.where(x >= 0, x, alpha * x)


def _elu(x: Any, alpha: float = 1.0) -> Any:
    """x where x > 0, else alpha * (exp(x) - 1)."""
    alpha = _number(alpha, "alpha", "elu")
    x = np.asarray(x, _float_dtype(x))
    return np.where(x > 0, x, alpha * np.expm1(x))


SELU_ALPHA = 1.6732632423543772848170429916717
"""SELU's alpha (PyTorch's value; ONNX's default is its float32 rounding)."""
SELU_SCALE = 1.0507009873554804934193349852946
"""SELU's scale (ONNX's gamma)."""


def _selu(x: Any) -> Any:
    """scale * elu(x, alpha) with PyTorch's constants."""
    x = np.asarray(x, _float_dtype(x))
    return SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * np.expm1(x))


def _hard_sigmoid(x: Any, alpha: float = 0.2, beta: float = 0.5) -> Any:
    """max(0, min(1, alpha * x + beta)) (ONNX HardSigmoid)."""
    alpha = _number(alpha, "alpha", "hard_sigmoid")
    beta = _number(beta, "beta", "hard_sigmoid")
    x = np.asarray(x, _float_dtype(x))
    return np.minimum(np.maximum(alpha * x + beta, 0.0), 1.0)


def _hard_swish(x: Any) -> Any:
    """x * hard_sigmoid(x, 1/6, 1/2) (ONNX HardSwish)."""
    x = np.asarray(x, _float_dtype(x))
    return x * np.minimum(np.maximum(x * (1.0 / 6.0) + 0.5, 0.0), 1.0)


def _clip(x: Any, lo: Any = None, hi: Any = None, *, min: Any = None, max: Any = None) -> Any:
    """x limited to the bounds given as arguments (lo, hi) or attributes (min, max)."""
    _clip_check(min, max)
    return array_kernels.clip(np, x, lo, hi, min=min, max=max)


def _numpy_binary(np_fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """The numpy function ``np_fn`` of two arguments, as a plain function."""
    def fn(x: Any, y: Any) -> Any:
        return np_fn(x, y)

    fn.__name__ = getattr(np_fn, "__name__", "fn")
    return fn


def _bit_shift(x: Any, y: Any, direction: str = "left") -> Any:
    """x << y, or x >> y for direction="right"."""
    rules.choice_attr(direction, "direction", "bit_shift", ("left", "right"))
    return np.left_shift(x, y) if direction == "left" else np.right_shift(x, y)


def _gelu_check(approximate: str = "none") -> None:
    """The approximate attribute is "none" or "tanh"."""
    rules.choice_attr(approximate, "approximate", "gelu", ("none", "tanh"))


def _alpha_check(what: str) -> Callable[..., None]:
    """A check that every attribute of ``what`` is a number."""
    def check(**attrs: Any) -> None:
        for name, value in attrs.items():
            rules.float_attr(value, name, what)

    return check


def _clip_check(min: Any = None, max: Any = None) -> None:
    """The min/max attributes are numbers or None."""
    rules.float_attr(min, "min", "clip", optional=True)
    rules.float_attr(max, "max", "clip", optional=True)


def _shift_check(direction: str = "left") -> None:
    """The direction attribute is "left" or "right"."""
    rules.choice_attr(direction, "direction", "bit_shift", ("left", "right"))


def _unary(name: str, fn: Callable[..., Any], doc: str, bprop: str | None,
           family: str = FAMILY) -> Any:
    """Declare an elementwise primitive of one input (no gradient rule: not differentiable)."""
    return declare(name, 1, _elementwise(fn), infer=rules.elementwise(name), family=family,
                   doc=doc, bprop=bprop, differentiable=bprop is not None)


# -- math ------------------------------------------------------------------------------
erf = _unary("erf", _erf, "erf(x) — the error function",
             "lambda (x, out, dout) (dout * 1.1283791670955126 * exp(-(x * x)),) end")
expm1 = _unary("expm1", _float_unary(np.expm1), "expm1(x) — exp(x) - 1, exact near 0",
               "lambda (x, out, dout) (dout * (out + 1.0),) end")
log1p = _unary("log1p", _float_unary(np.log1p), "log1p(x) — log(1 + x), exact near 0",
               "lambda (x, out, dout) (dout / (x + 1.0),) end")
floor = _unary("floor", _float_unary(np.floor), "floor(x) — the largest integer <= x (a float)",
               None)
ceil = _unary("ceil", _float_unary(np.ceil), "ceil(x) — the smallest integer >= x (a float)", None)
round_ = _unary("round", _float_unary(np.round), "round(x) — the nearest integer, halves to even "
                "(a float)", None)
reciprocal = _unary("reciprocal", _reciprocal, "reciprocal(x) — 1 / x",
                    "lambda (x, out, dout) (-(dout * out * out),) end")
rsqrt = _unary("rsqrt", _rsqrt, "rsqrt(x) — 1 / sqrt(x)",
               "lambda (x, out, dout) (-0.5 * dout * out * out * out,) end")
square = _unary("square", _square, "square(x) — x * x",
                "lambda (x, out, dout) (dout * 2.0 * x,) end")
tan = _unary("tan", _float_unary(np.tan), "tan(x) — tangent",
             "lambda (x, out, dout) (dout * (out * out + 1.0),) end")
atan = _unary("atan", _float_unary(np.arctan), "atan(x) — arc tangent",
              "lambda (x, out, dout) (dout / (x * x + 1.0),) end")
sinh = _unary("sinh", _float_unary(np.sinh), "sinh(x) — hyperbolic sine",
              "lambda (x, out, dout) (dout * cosh(x),) end")
cosh = _unary("cosh", _float_unary(np.cosh), "cosh(x) — hyperbolic cosine",
              "lambda (x, out, dout) (dout * sinh(x),) end")
asin = _unary("asin", _float_unary(np.arcsin), "asin(x) — arc sine (nan outside [-1, 1])",
              "lambda (x, out, dout) (dout / sqrt(1.0 - x * x),) end")
acos = _unary("acos", _float_unary(np.arccos), "acos(x) — arc cosine (nan outside [-1, 1])",
              "lambda (x, out, dout) (-(dout / sqrt(1.0 - x * x)),) end")

# -- activations -------------------------------------------------------------------------
softsign = _unary("softsign", _softsign, "softsign(x) — x / (1 + |x|)",
                  "lambda (x, out, dout) (dout / ((abs(x) + 1.0) * (abs(x) + 1.0)),) end")
silu = _unary("silu", _silu, "silu(x) — x * sigmoid(x) (swish)",
              """lambda (x, out, dout)
                  let s = sigmoid(x) in (dout * s * (x * (1.0 - s) + 1.0),) end""")
mish = _unary("mish", _mish, "mish(x) — x * tanh(softplus(x))",
              """lambda (x, out, dout)
                  let t = tanh(softplus(x)) in (dout * (t + x * (1.0 - t * t) * sigmoid(x)),) end""")
gelu = declare("gelu", 1, _elementwise(_gelu), family=FAMILY,
               infer=rules.elementwise("gelu", _gelu_check), attrs={"approximate": "none"},
               doc='gelu(x, approximate="none") — x * Φ(x) (the erf form); approximate="tanh": '
                   "the tanh approximation",
    bprop=f"""lambda (x, approximate, out, dout)
        if approximate == "tanh" then
          let u = {_GELU_TANH!r} * (x + {_GELU_CUBIC!r} * x * x * x) in
          let t = tanh(u) in
          (dout * (0.5 * (t + 1.0) + 0.5 * x * (1.0 - t * t) * {_GELU_TANH!r}
                   * ({3 * _GELU_CUBIC!r} * x * x + 1.0)),)
        else
          (dout * (x * exp(-0.5 * x * x) * {1 / math.sqrt(2.0 * math.pi)!r}
                   + 0.5 * (erf(x * {1 / math.sqrt(2.0)!r}) + 1.0)),)
        end""")
leaky_relu = declare("leaky_relu", 1, _elementwise(_leaky_relu), family=FAMILY,
                     infer=rules.elementwise("leaky_relu", _alpha_check("leaky_relu")),
                     attrs={"alpha": 0.01},
                     doc="leaky_relu(x, alpha=0.01) — x where x >= 0, else alpha * x",
    bprop="lambda (x, alpha, out, dout) (where(x > 0.0, dout, dout * alpha),) end")
elu = declare("elu", 1, _elementwise(_elu), family=FAMILY,
              infer=rules.elementwise("elu", _alpha_check("elu")), attrs={"alpha": 1.0},
              doc="elu(x, alpha=1.0) — x where x > 0, else alpha * (exp(x) - 1)",
    bprop="lambda (x, alpha, out, dout) (where(x > 0.0, dout, dout * (out + alpha)),) end")
selu = _unary("selu", _selu,
              "selu(x) — scale * elu(x, alpha) with PyTorch's alpha ≈ 1.6733 and scale ≈ 1.0507",
              f"""lambda (x, out, dout)
                  (where(x > 0.0, dout * {SELU_SCALE!r}, dout * (out + {SELU_SCALE * SELU_ALPHA!r})),)
              end""")
hard_sigmoid = declare("hard_sigmoid", 1, _elementwise(_hard_sigmoid), family=FAMILY,
                       infer=rules.elementwise("hard_sigmoid", _alpha_check("hard_sigmoid")),
                       attrs={"alpha": 0.2, "beta": 0.5},
                       doc="hard_sigmoid(x, alpha=0.2, beta=0.5) — max(0, min(1, alpha * x + beta))",
    bprop="""lambda (x, alpha, beta, out, dout)
        let u = alpha * x + beta in (where(u > 0.0 and u < 1.0, dout * alpha, dout * 0.0),) end""")
hard_swish = _unary("hard_swish", _hard_swish,
                    "hard_swish(x) — x * max(0, min(1, x / 6 + 1/2))",
                    # At the kinks PyTorch's (hardswish_backward): 0 at -3, 1 at 3.
                    """lambda (x, out, dout)
                        (where(x <= -3.0, dout * 0.0, where(x >= 3.0, dout, dout * (x / 3.0 + 0.5))),)
                    end""")
clip = declare("clip", (1, 3), _elementwise(_clip), family=FAMILY,
               infer=rules.elementwise("clip", _clip_check), attrs={"min": None, "max": None},
               doc="clip(x, min=None, max=None) — x limited to [min, max] (None: no bound); "
                   "clip(x, lo, hi): bounds that are tensors",
    bprop={1: "lambda (x, min, max, out, dout) (sum_to(clip_grad(dout, x, min, max), x),) end",
           2: """lambda (x, lo, min, max, out, dout)
                   (sum_to(clip_grad(dout, x, lo, None), x),
                    sum_to(where(x < lo, dout, dout * 0.0), lo)) end""",
           # min(max(x, lo), hi): with lo > hi the result is hi, whatever x and lo.
           3: """lambda (x, lo, hi, min, max, out, dout)
                   (sum_to(clip_grad(dout, x, lo, hi), x),
                    sum_to(where(x < lo and lo <= hi, dout, dout * 0.0), lo),
                    sum_to(where(x > hi or lo > hi, dout, dout * 0.0), hi)) end"""})

# -- binary ------------------------------------------------------------------------------
floor_div = declare("floor_div", 2, _elementwise(_numpy_binary(np.floor_divide)),
                    infer=rules.elementwise("floor_div"), family=FAMILY, differentiable=False,
                    doc="floor_div(x, y) — floor(x / y) (numpy floor_divide; integers stay integers)")
mod = declare("mod", 2, _elementwise(_numpy_binary(np.mod)), infer=rules.elementwise("mod"),
              family=FAMILY,
              doc="mod(x, y) — x - floor_div(x, y) * y: the sign of y (numpy mod, Python %)",
    # out = x - floor(x / y) * y, piecewise linear: PyTorch's remainder gradient
    # (at a jump, the side floor_div picks).
    bprop="lambda (x, y, out, dout) (sum_to(dout, x), sum_to(-(dout * floor_div(x, y)), y)) end")
fmod = declare("fmod", 2, _elementwise(_numpy_binary(np.fmod)), infer=rules.elementwise("fmod"),
               family=FAMILY, doc="fmod(x, y) — the remainder with the sign of x (C fmod)",
    # out = x - trunc(x / y) * y, so trunc(x / y) = (x - out) / y.
    bprop="lambda (x, y, out, dout) (sum_to(dout, x), sum_to(-(dout * ((x - out) / y)), y)) end")
atan2 = declare("atan2", 2, _elementwise(_numpy_binary(np.arctan2)), infer=rules.elementwise("atan2"),
                family=FAMILY, doc="atan2(y, x) — the angle of the point (x, y), in [-pi, pi]",
    bprop="""lambda (y, x, out, dout)
        let r = x * x + y * y in (sum_to(dout * x / r, y), sum_to(-(dout * y) / r, x)) end""")

# -- predicates, logic and bits ------------------------------------------------------------
isnan = _unary("isnan", np.isnan, "isnan(x) — whether x is nan", None, family=LOGIC)
isinf = _unary("isinf", np.isinf, "isinf(x) — whether x is inf or -inf", None, family=LOGIC)
logical_xor = declare("logical_xor", 2, _elementwise(_numpy_binary(np.logical_xor)),
                      infer=rules.elementwise("logical_xor"), family=LOGIC, differentiable=False,
                      doc="logical_xor(x, y) — exactly one of x and y")
bitwise_and = declare("bitwise_and", 2, _elementwise(_numpy_binary(np.bitwise_and)),
                      infer=rules.elementwise("bitwise_and"), family=LOGIC, differentiable=False,
                      doc="bitwise_and(x, y) — x & y on integers and bools")
bitwise_or = declare("bitwise_or", 2, _elementwise(_numpy_binary(np.bitwise_or)),
                     infer=rules.elementwise("bitwise_or"), family=LOGIC, differentiable=False,
                     doc="bitwise_or(x, y) — x | y on integers and bools")
bitwise_xor = declare("bitwise_xor", 2, _elementwise(_numpy_binary(np.bitwise_xor)),
                      infer=rules.elementwise("bitwise_xor"), family=LOGIC, differentiable=False,
                      doc="bitwise_xor(x, y) — x ^ y on integers and bools")
bitwise_not = _unary("bitwise_not", np.invert, "bitwise_not(x) — ~x on integers (not x on bools)",
                     None, family=LOGIC)
bit_shift = declare("bit_shift", 2, _elementwise(_bit_shift), family=LOGIC, differentiable=False,
                    infer=rules.elementwise("bit_shift", _shift_check),
                    attrs={"direction": "left"},
                    doc='bit_shift(x, y, direction="left") — x << y ("right": x >> y) on integers')

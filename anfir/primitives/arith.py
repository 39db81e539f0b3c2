"""Elementwise arithmetic, comparison and logic (numpy broadcasting semantics).

Scalars stay Python scalars (``math`` functions, fast); arrays use numpy.
"""

from __future__ import annotations

import math
import operator
from typing import Any, Callable, Sequence

import numpy as np

from anfir import limits
from anfir.dtypes import weak_scalars
from anfir.errors import AnfirRuntimeError, AnfirTypeError
from anfir.primitives.registry import declare
from anfir.abstract import rules

FAMILY = "arithmetic"
_SCALARS = (int, float, bool)


def _refuse_tuple(name: str) -> Any:
    # A tuple is not an operand of elementwise arithmetic (its type rule says
    # so): Python's ``+`` would concatenate and numpy would make an array of it.
    raise AnfirTypeError(f"{name} needs numbers or tensors, not a tuple")


def _unary(scalar_fn: Callable[[Any], Any], array_fn: Callable[[Any], Any],
           name: str = "") -> Callable[[Any], Any]:
    def impl(x: Any) -> Any:
        if type(x) is float or type(x) is int:
            return scalar_fn(x)
        if x.__class__ is tuple:
            _refuse_tuple(name or getattr(array_fn, "__name__", "this operation"))
        return array_fn(x)

    return impl


def _on_data(op: Callable[[Any, Any], Any], name: str) -> Callable[[Any, Any], Any]:
    """``op`` (Python's operator, fast on scalars) refusing tuple operands."""
    def impl(x: Any, y: Any) -> Any:
        if x.__class__ is tuple or y.__class__ is tuple:
            _refuse_tuple(name)
        if x.__class__ is np.ndarray or y.__class__ is np.ndarray:
            x, y = weak_scalars(x, y)
        return op(x, y)

    impl.__name__ = name
    return impl


def _float_fn(fn: Callable[[float], float], np_fn: Callable[[Any], Any],
              total: bool = False) -> Callable[[Any], Any]:
    """A unary float function: ``fn`` on Python numbers, ``np_fn`` on arrays.

    ``total`` says ``np_fn`` never warns (defined and finite everywhere, like
    tanh), so arrays skip the ``errstate`` guard, which costs more than a
    small array's computation.
    """
    def scalar(x: Any) -> float:
        try:
            return fn(x)
        except (ValueError, OverflowError):
            with np.errstate(all="ignore"):
                return float(np_fn(np.float64(x)))

    def array(x: Any) -> Any:
        # Out-of-domain elements give nan/inf, as numpy does, without warnings.
        with np.errstate(all="ignore"):
            return np_fn(x)

    return _unary(scalar, np_fn if total else array,
                  getattr(fn, "__name__", "").strip("_").removesuffix("_scalar"))


def _too_large(what: str) -> AnfirRuntimeError:
    return AnfirRuntimeError(f"{what}: the integer result would have more than "
                             f"{limits.MAX_INT_BITS:,} bits (anfir.limits.MAX_INT_BITS)",
                             hint="use floats for numbers this large")


def _pow(x: Any, y: Any) -> Any:
    if x.__class__ is tuple or y.__class__ is tuple:
        _refuse_tuple("pow")
    if type(x) in (int, float) and type(y) in (int, float):
        if type(x) is int and type(y) is int:
            if y < 0:
                return float(x) ** y
            # Bounded before computing: 10 ** 10 ** 10 would run for hours.
            if x not in (0, 1, -1) and y * math.log2(abs(x)) > limits.MAX_INT_BITS:
                raise _too_large("pow")
        try:
            result = x ** y
        except (ZeroDivisionError, OverflowError):
            with np.errstate(all="ignore"):
                return float(np.power(float(x), float(y)))
        return float("nan") if isinstance(result, complex) else result
    if x.__class__ is np.ndarray and type(y) in (int, float) and y in _POW_BY_PRODUCT \
            and x.dtype.kind in "fc":
        # x ** 2, x ** 3, x ** 0.5: products and sqrt (exact to the ulp, as PyTorch's
        # own fast paths are) instead of numpy's general pow, ~20x slower per element.
        return _POW_BY_PRODUCT[y](x)
    return np.power(*weak_scalars(x, y))


_POW_BY_PRODUCT: dict[Any, Callable[[Any], Any]] = {
    2: np.square, 2.0: np.square,
    3: lambda x: x * x * x, 3.0: lambda x: x * x * x,
    0.5: np.sqrt,
    1: lambda x: x.copy(), 1.0: lambda x: x.copy(),
}


def _mul(x: Any, y: Any) -> Any:
    # Integers are bounded (repeated squaring would exhaust memory); other values
    # go straight to ``*``.
    if type(x) is int and type(y) is int and x.bit_length() + y.bit_length() > limits.MAX_INT_BITS:
        raise _too_large("mul")
    return x * y


def _cheap_pow(values: Sequence[Any]) -> bool:
    """Whether folding ``x ** y`` at compile time is cheap: not a huge integer power."""
    base, exponent = values
    return not (isinstance(base, int) and isinstance(exponent, int) and abs(exponent) > 64)


def _div(x: Any, y: Any) -> Any:
    if x.__class__ is tuple or y.__class__ is tuple:
        _refuse_tuple("div")
    if type(x) in (int, float) and type(y) in (int, float):
        if y == 0:
            with np.errstate(all="ignore"):
                return float(np.true_divide(float(x), float(y)))
        return x / y
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.true_divide(*weak_scalars(x, y))


def _softplus_scalar(x: float) -> float:
    # max(x, 0) + log1p(exp(-|x|)): exact for large |x|, where log(1 + exp(x)) overflows.
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def _softplus_array(x: Any) -> Any:
    return np.logaddexp(0, x)  # log(exp(0) + exp(x)), numpy's overflow-free form


def _sigmoid_scalar(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def _sigmoid_array(x: Any) -> Any:
    return 0.5 * (np.tanh(0.5 * np.asarray(x)) + 1.0)


def _sign_scalar(x: Any) -> Any:
    s = (x > 0) - (x < 0)
    return float(s) if type(x) is float else s


def _relu_scalar(x: Any) -> Any:
    return x if x > 0 else x * 0


def _binary_np(np_fn: Callable[[Any, Any], Any], scalar_fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def impl(x: Any, y: Any) -> Any:
        if type(x) in (int, float, bool) and type(y) in (int, float, bool):
            return scalar_fn(x, y)
        if x.__class__ is tuple or y.__class__ is tuple:
            _refuse_tuple(np_fn.__name__)
        return np_fn(*weak_scalars(x, y))

    return impl


def _check_bool(name: str, x: Any) -> None:
    """``and``, ``or`` and ``not`` take bools (or bool tensors), not numbers."""
    if isinstance(x, (bool, np.bool_)) or (isinstance(x, np.ndarray) and x.dtype == np.bool_):
        return
    kind = f"a {x.dtype} tensor" if isinstance(x, np.ndarray) else type(x).__name__
    raise TypeError(f"needs bools (or bool tensors), not {kind}")


def _logical(name: str, np_fn: Callable[[Any, Any], Any],
             scalar_fn: Callable[[bool, bool], bool]) -> Callable[[Any, Any], Any]:
    def impl(x: Any, y: Any) -> Any:
        if isinstance(x, (bool, np.bool_)) and isinstance(y, (bool, np.bool_)):
            return scalar_fn(bool(x), bool(y))
        if x.__class__ is tuple or y.__class__ is tuple:
            _refuse_tuple(name)
        _check_bool(name, x)
        _check_bool(name, y)
        return np_fn(x, y)

    return impl


def _logical_not(x: Any) -> Any:
    if isinstance(x, (bool, np.bool_)):
        return not x
    if x.__class__ is tuple:
        _refuse_tuple("logical_not")
    _check_bool("logical_not", x)
    return np.logical_not(x)


_TIE_BODY = """
    let half = dout * cast_like(x == y, dout) * 0.5 in
    (sum_to(dout * cast_like(x {win} y, dout) + half, x), sum_to(dout * cast_like(x {lose} y, dout) + half, y)) end"""
_TIE_SPLIT = "lambda (x, y, out, dout)" + _TIE_BODY
"""The gradient of maximum (win ``>``) and minimum (win ``<``): all of dout to the
winner, half to each side of a tie."""
TIE_SPLIT_2ARG = "lambda (x, y, axis, keepdims, out, dout)" + _TIE_BODY
"""The same for ``max(x, y)`` / ``min(x, y)``, whose rules also take the reduction attributes."""

add = declare("add", 2, _on_data(operator.add, "add"), infer=rules.elementwise("add"), family=FAMILY,
    symbolic=operator.add, doc="add(x, y) — x + y, elementwise",
    bprop="lambda (x, y, out, dout) (sum_to(dout, x), sum_to(dout, y)) end")
sub = declare("sub", 2, _on_data(operator.sub, "sub"), infer=rules.elementwise("sub"), family=FAMILY,
    symbolic=operator.sub, doc="sub(x, y) — x - y, elementwise",
    bprop="lambda (x, y, out, dout) (sum_to(dout, x), sum_to(-dout, y)) end")
mul = declare("mul", 2, _on_data(_mul, "mul"), infer=rules.elementwise("mul"), family=FAMILY,
    symbolic=operator.mul, doc="mul(x, y) — x * y, elementwise",
    bprop="lambda (x, y, out, dout) (sum_to(dout * y, x), sum_to(x * dout, y)) end")
div = declare("div", 2, _div, infer=rules.elementwise("div"), family=FAMILY,
              doc="div(x, y) — x / y, true division (ints give a float); x / 0 is inf or nan",
    bprop="lambda (x, y, out, dout) (sum_to(dout / y, x), sum_to(-dout * out / y, y)) end")
neg = declare("neg", 1, _unary(operator.neg, operator.neg, "neg"), infer=rules.elementwise("neg"), family=FAMILY,
    symbolic=operator.neg, doc="neg(x) — -x",
    bprop="lambda (x, out, dout) (-dout,) end")
pow_ = declare("pow", 2, _pow, infer=rules.elementwise("pow"), family=FAMILY, fold_guard=_cheap_pow, doc="pow(x, y) — x ** y, elementwise",
    # Both gradients avoid 0 * inf, which would leak nan into higher derivatives
    # even where the exact answer is finite (JAX and TensorFlow do the same):
    # the base's uses y * x ** (y - 1) only where y != 0 (and x ** -1 is never
    # formed for y == 0), the exponent's uses log(x) only where x > 0.
    bprop="""lambda (x, y, out, dout)
        (sum_to(where(y == 0, zeros_like(out), dout * y * where(y == 0, ones_like(x), x) ** (y - 1)), x),
         sum_to(dout * out * log(where(x > 0, x, ones_like(x))), y)) end""")
exp = declare("exp", 1, _float_fn(math.exp, np.exp), infer=rules.elementwise("exp"), family=FAMILY, doc="exp(x) — e ** x",
    bprop="lambda (x, out, dout) (dout * out,) end")
log = declare("log", 1, _float_fn(math.log, np.log), infer=rules.elementwise("log"), family=FAMILY,
              doc="log(x) — natural logarithm (nan below 0, -inf at 0)",
    bprop="lambda (x, out, dout) (dout / x,) end")
sin = declare("sin", 1, _float_fn(math.sin, np.sin), infer=rules.elementwise("sin"), family=FAMILY, doc="sin(x)",
    bprop="lambda (x, out, dout) (dout * cos(x),) end")
cos = declare("cos", 1, _float_fn(math.cos, np.cos), infer=rules.elementwise("cos"), family=FAMILY, doc="cos(x)",
    bprop="lambda (x, out, dout) (-(dout * sin(x)),) end")
tanh = declare("tanh", 1, _float_fn(math.tanh, np.tanh, total=True), infer=rules.elementwise("tanh"), family=FAMILY, doc="tanh(x)",
    bprop="lambda (x, out, dout) (dout * (1.0 - out * out),) end")
sqrt = declare("sqrt", 1, _float_fn(math.sqrt, np.sqrt), infer=rules.elementwise("sqrt"), family=FAMILY,
               doc="sqrt(x) — square root (nan below 0)",
    bprop="lambda (x, out, dout) (dout / (2.0 * out),) end")
abs_ = declare("abs", 1, _unary(abs, np.abs, "abs"), infer=rules.elementwise("abs"), family=FAMILY, doc="abs(x) — |x|",
    bprop="lambda (x, out, dout) (dout * sign(x),) end")
sign = declare("sign", 1, _unary(_sign_scalar, np.sign, "sign"), infer=rules.elementwise("sign"), family=FAMILY,
               doc="sign(x) — -1, 0 or 1 (as x's type)",
               bprop="lambda (x, out, dout) (zeros_like(x),) end")
maximum = declare("maximum", 2, _binary_np(np.maximum, max), infer=rules.elementwise("maximum"), family=FAMILY,
                  doc="maximum(x, y) — the larger, elementwise",
    # Ties give each side half (PyTorch's, JAX's and onnxruntime's convention):
    # the two gradients still sum to dout, and symmetric programs stay symmetric.
    bprop=_TIE_SPLIT.format(win=">", lose="<"))
minimum = declare("minimum", 2, _binary_np(np.minimum, min), infer=rules.elementwise("minimum"), family=FAMILY,
                  doc="minimum(x, y) — the smaller, elementwise",
    bprop=_TIE_SPLIT.format(win="<", lose=">"))
sigmoid = declare("sigmoid", 1, _float_fn(_sigmoid_scalar, _sigmoid_array, total=True), infer=rules.elementwise("sigmoid"), family=FAMILY,
                  doc="sigmoid(x) — 1 / (1 + exp(-x))",
    bprop="lambda (x, out, dout) (dout * out * (1.0 - out),) end")
relu = declare("relu", 1, _unary(_relu_scalar, lambda x: np.maximum(x, 0), "relu"), infer=rules.elementwise("relu"), family=FAMILY,
               doc="relu(x) — max(x, 0)",
    bprop="lambda (x, out, dout) (dout * cast_like(x > 0, dout),) end")
softplus = declare("softplus", 1, _float_fn(_softplus_scalar, _softplus_array, total=True),
                   infer=rules.elementwise("softplus"), family=FAMILY,
                   doc="softplus(x) — log(1 + exp(x)), without overflow for large x",
    bprop="lambda (x, out, dout) (dout * sigmoid(x),) end")

_CMP = "comparison"
lt = declare("lt", 2, _on_data(operator.lt, "lt"), infer=rules.elementwise("lt"), family=_CMP, differentiable=False, doc="lt(x, y) — x < y")
le = declare("le", 2, _on_data(operator.le, "le"), infer=rules.elementwise("le"), family=_CMP, differentiable=False, doc="le(x, y) — x <= y")
gt = declare("gt", 2, _on_data(operator.gt, "gt"), infer=rules.elementwise("gt"), family=_CMP, differentiable=False, doc="gt(x, y) — x > y")
ge = declare("ge", 2, _on_data(operator.ge, "ge"), infer=rules.elementwise("ge"), family=_CMP, differentiable=False, doc="ge(x, y) — x >= y")
eq = declare("eq", 2, _on_data(operator.eq, "eq"), infer=rules.elementwise("eq"), family=_CMP, differentiable=False, doc="eq(x, y) — x == y")
ne = declare("ne", 2, _on_data(operator.ne, "ne"), infer=rules.elementwise("ne"), family=_CMP, differentiable=False, doc="ne(x, y) — x != y")
logical_and = declare("logical_and", 2, _logical("logical_and", np.logical_and, lambda a, b: a and b),
                      infer=rules.elementwise("logical_and"), family=_CMP, differentiable=False,
                      doc="logical_and(x, y) — x and y (both are evaluated: calls are strict)")
logical_or = declare("logical_or", 2, _logical("logical_or", np.logical_or, lambda a, b: a or b),
                     infer=rules.elementwise("logical_or"), family=_CMP, differentiable=False,
                     doc="logical_or(x, y) — x or y (both are evaluated: calls are strict)")
logical_not = declare("logical_not", 1, _logical_not, infer=rules.elementwise("logical_not"), family=_CMP, differentiable=False,
                      doc="logical_not(x) — not x")

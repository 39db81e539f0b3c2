"""Reductions and scans: max, min, prod, var, std, logsumexp, all, any, norm,
argmax, argmin, cumsum, cumprod (``sum`` and ``mean`` are in ``tensor.py``).

Every reduction takes the attributes ``axis=None`` (an int, a tuple of ints,
or None: every axis) and ``keepdims=false``, which may also be passed
positionally (``prod(x, 1)`` is ``prod(x, axis=1)``); ``max``/``min`` take
them only as keywords, because ``max(x, y)`` is the elementwise maximum.
Semantics are numpy's; shapes follow :func:`anfir.abstract.shapes.reduce_shape`
on symbolic dimensions.  Gradient rules are ANF text whose parameters are the
inputs, the attributes (in declaration order), ``out`` and ``dout``; they pass
attributes on positionally (``sum(m, axis, true)``) and spread a reduced value
back over the input with ``unreduce(g, x, axis, keepdims)``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable, Optional

import numpy as np

from anfir.abstract import rules
from anfir.abstract.shapes import fresh_dim, normalize_axes, product, shape_text
from anfir.abstract.values import AbstractValue, ATensor
from anfir.dtypes import numpy_kind
from anfir.errors import AnfirTypeError
from anfir.primitives import arith, array_kernels
from anfir.primitives.registry import declare

FAMILY = "reduction"
_REDUCE = {"axis": None, "keepdims": False}


def _axis(axis: Any, what: str) -> Any:
    """An axis attribute checked."""
    return rules.axis_attr(axis, what)


def _keep(keepdims: Any, what: str) -> bool:
    """A keepdims attribute checked."""
    return rules.bool_attr(keepdims, "keepdims", what)


def _scalar(result: Any) -> Any:
    """A 0-d array as a numpy scalar, as numpy's own reductions return it."""
    if isinstance(result, np.ndarray) and result.ndim == 0:
        return result[()]
    return result


def _float_array(x: Any) -> np.ndarray:
    """x as an array of its float dtype (integers as f64)."""
    array = np.asarray(x)
    return array if numpy_kind(array.dtype) in ("float", "complex") else array.astype(np.float64)


def _reduced_empty(array: np.ndarray, axis: Any) -> bool:
    """Whether a reduced axis has no element (then max/min have no identity)."""
    if array.size:
        return False
    if axis is None:
        return True
    axes = axis if isinstance(axis, tuple) else (axis,)
    return any(array.shape[a] == 0 for a in axes)


# -- evaluation ---------------------------------------------------------------------------
def _max(x: Any, y: Any = None, *, axis: Any = None, keepdims: bool = False) -> Any:
    """The largest element (over axis), or with two arguments the elementwise maximum."""
    if y is not None:  # max(x, y): the elementwise maximum
        check_binary_only("max", axis, keepdims)
        return arith.maximum.impl(x, y)
    return np.max(x, axis=_axis(axis, "max"), keepdims=_keep(keepdims, "max"))


def _min(x: Any, y: Any = None, *, axis: Any = None, keepdims: bool = False) -> Any:
    """The smallest element (over axis), or with two arguments the elementwise minimum."""
    if y is not None:
        check_binary_only("min", axis, keepdims)
        return arith.minimum.impl(x, y)
    return np.min(x, axis=_axis(axis, "min"), keepdims=_keep(keepdims, "min"))


def check_binary_only(name: str, axis: Any, keepdims: Any) -> None:
    """max(x, y) / min(x, y) take no reduction attribute."""
    if axis is not None or keepdims is not False:
        raise AnfirTypeError(f"{name}(x, y) is the elementwise {name}imum: it takes no axis "
                             f"or keepdims (write {name}(x, axis=...) to reduce)")


def _prod(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """The product of the elements (over axis)."""
    return np.prod(x, axis=_axis(axis, "prod"), keepdims=_keep(keepdims, "prod"))


def _correction(value: Any) -> float:
    """A correction attribute checked."""
    return rules.float_attr(value, "correction", "var")  # type: ignore[return-value]


def _var(x: Any, axis: Any = None, keepdims: bool = False, correction: Any = 0) -> Any:
    """The variance, divided by n - correction."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.var(x, axis=_axis(axis, "var"), keepdims=_keep(keepdims, "var"),
                      ddof=_correction(correction))


def _std(x: Any, axis: Any = None, keepdims: bool = False, correction: Any = 0) -> Any:
    """The standard deviation, sqrt(var)."""
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.std(x, axis=_axis(axis, "std"), keepdims=_keep(keepdims, "std"),
                      ddof=_correction(correction))


def _logsumexp(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """log(sum(exp(x))) over axis, shifted by the maximum so that it does not overflow."""
    array = _float_array(x)
    ax = _axis(axis, "logsumexp")
    keepdims = _keep(keepdims, "logsumexp")
    with np.errstate(all="ignore"):
        if _reduced_empty(array, ax):
            return _scalar(np.log(np.sum(np.exp(array), axis=ax, keepdims=keepdims)))
        top = np.max(array, axis=ax, keepdims=True)
        top = np.where(np.isfinite(top), top, np.zeros_like(top))  # all -inf: log(0) = -inf
        total = np.sum(np.exp(array - top), axis=ax, keepdims=keepdims)
        return _scalar(np.log(total) + np.reshape(top, np.shape(total)))


def _all(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Whether every element (over axis) is true."""
    return np.all(x, axis=_axis(axis, "all"), keepdims=_keep(keepdims, "all"))


def _any(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Whether some element (over axis) is true."""
    return np.any(x, axis=_axis(axis, "any"), keepdims=_keep(keepdims, "any"))


def _ord(value: Any) -> float:
    """An ord attribute checked."""
    return rules.float_attr(value, "ord", "norm")  # type: ignore[return-value]


def _norm(x: Any, ord: Any = 2, axis: Any = None, keepdims: bool = False) -> Any:
    """The vector norm of ``x`` over ``axis`` (all elements by default), as
    ``torch.linalg.vector_norm``: (sum |x|^ord)^(1/ord); ord inf/-inf: max/min |x|;
    ord 0: the number of non-zero elements."""
    p = _ord(ord)
    array = _float_array(x)
    ax = _axis(axis, "norm")
    keepdims = _keep(keepdims, "norm")
    magnitude = np.abs(array)
    with np.errstate(all="ignore"):
        if p == math.inf:
            result = np.max(magnitude, axis=ax, keepdims=keepdims) if not _reduced_empty(array, ax) \
                else np.zeros(np.shape(np.sum(array, axis=ax, keepdims=keepdims)), array.dtype)
        elif p == -math.inf:
            result = np.min(magnitude, axis=ax, keepdims=keepdims)
        elif p == 0:
            result = np.sum(array != 0, axis=ax, keepdims=keepdims).astype(array.dtype)
        elif p == 1:
            result = np.sum(magnitude, axis=ax, keepdims=keepdims)
        elif p == 2:
            result = np.sqrt(np.sum(array * array, axis=ax, keepdims=keepdims))
        else:
            result = np.power(np.sum(np.power(magnitude, p), axis=ax, keepdims=keepdims), 1.0 / p)
    return _scalar(np.asarray(result, array.dtype))


def _arg_extreme(name: str, np_fn: Callable[..., Any]) -> Callable[..., Any]:
    """The impl of argmax/argmin (``np_fn``), with keepdims and select_last."""
    def impl(x: Any, axis: Any = 0, keepdims: bool = False, select_last: bool = False) -> Any:
        if axis is not None and not (isinstance(axis, int) and not isinstance(axis, bool)):
            raise AnfirTypeError(f"the axis of {name} is an integer or None, not {axis!r}")
        rules.bool_attr(select_last, "select_last", name)
        _keep(keepdims, name)
        array = np.asarray(x)
        if not select_last:
            return np.asarray(np_fn(array, axis=axis, keepdims=keepdims), np.int64)[()]
        if axis is None:
            flat = array.reshape(-1)
            index = flat.size - 1 - np_fn(flat[::-1])
            result = np.asarray(index, np.int64)
            return result.reshape((1,) * array.ndim)[()] if keepdims else result[()]
        size = array.shape[axis] if array.ndim else 1
        index = size - 1 - np_fn(np.flip(array, axis), axis=axis, keepdims=keepdims)
        return np.asarray(index, np.int64)[()]

    impl.__name__ = f"_{name}"
    return impl


def _scan(name: str, np_fn: Callable[..., Any], identity: int) -> Callable[..., Any]:
    """The impl of cumsum/cumprod (``np_fn``, ``identity`` for exclusive scans)."""
    def impl(x: Any, axis: Any = None, exclusive: bool = False, reverse: bool = False) -> Any:
        if axis is not None and not (isinstance(axis, int) and not isinstance(axis, bool)):
            raise AnfirTypeError(f"the axis of {name} is an integer or None, not {axis!r}")
        rules.bool_attr(exclusive, "exclusive", name)
        rules.bool_attr(reverse, "reverse", name)
        return array_kernels.scan(np, np_fn, x, axis, bool(exclusive), bool(reverse), identity)

    impl.__name__ = f"_{name}"
    return impl


# -- abstract rules ----------------------------------------------------------------------------
def _extreme_rule(name: str, binary: Any) -> rules.ProbingRule:
    """The rule of max/min: a reduction with one argument, ``binary``'s rule with two."""
    reduce = rules.reduction(name)

    def body(impl: Callable[..., Any], x: AbstractValue, y: Optional[AbstractValue] = None,
             **attrs: Any) -> AbstractValue:
        if y is not None:
            check_binary_only(name, attrs.get("axis"), attrs.get("keepdims", False))
            return binary.infer(x, y)  # type: ignore[no-any-return]
        return reduce.body(impl, x, **attrs)

    rule = rules.ProbingRule(name, body, f"Abstract rule of {name}: a reduction with one "
                             "argument, the elementwise one with two.")
    return rule


def _arg_rule(name: str) -> Callable[..., AbstractValue]:
    """The rule of argmax/argmin: the reduced shape, i64."""
    def rule(x: AbstractValue, *, axis: Any = 0, keepdims: Any = False,
             select_last: Any = False) -> AbstractValue:
        if axis is not None and not (isinstance(axis, int) and not isinstance(axis, bool)):
            raise AnfirTypeError(f"the axis of {name} is an integer or None, not {axis!r}")
        rules.bool_attr(select_last, "select_last", name)
        keep = rules.bool_attr(keepdims, "keepdims", name)
        dtype, shape = rules.shape_of_abstract(x, name)
        return rules.tensor_or_scalar("i64", rules.reduce_shape(shape, axis, dtype, keep))

    rule.__name__ = rule.__qualname__ = f"infer_{name}"
    rule.__doc__ = f"Abstract rule of {name}: the reduced shape, i64."
    return rule


def _scan_rule(name: str) -> rules.ProbingRule:
    """The rule of cumsum/cumprod: x's shape (flattened without an axis)."""
    def body(impl: Callable[..., Any], x: AbstractValue, *, axis: Any = None,
             exclusive: Any = False, reverse: Any = False) -> AbstractValue:
        if axis is not None and not (isinstance(axis, int) and not isinstance(axis, bool)):
            raise AnfirTypeError(f"the axis of {name} is an integer or None, not {axis!r}")
        rules.bool_attr(exclusive, "exclusive", name)
        rules.bool_attr(reverse, "reverse", name)
        dtype, shape = rules.shape_of_abstract(x, name)
        _, out_dtype = rules.probe(name, impl, (ATensor(dtype, (1,)),))
        if axis is None:  # numpy flattens
            return ATensor(out_dtype, (fresh_dim() if shape is None else product(shape),))
        if shape is not None:
            normalize_axes(axis, len(shape), shape_text(shape, dtype))
        return ATensor(out_dtype, shape)

    return rules.ProbingRule(name, body, f"Abstract rule of {name}: the input's shape "
                             "(flattened without an axis).")


# -- declarations ------------------------------------------------------------------------------
max_ = declare("max", (1, 2), _max, infer=_extreme_rule("max", arith.maximum), family=FAMILY,
               attrs=_REDUCE,
               doc="max(x, axis=None, keepdims=false) — the largest element, or along axes; "
                   "max(x, y) is maximum(x, y)",
    bprop={1: """lambda (x, axis, keepdims, out, dout)
                   let m = cast_like(x == unreduce(out, x, axis, keepdims), dout) in
                   (unreduce(dout, x, axis, keepdims) * m / unreduce(sum(m, axis, true), x, axis, true),)
                 end""",
           2: arith.TIE_SPLIT_2ARG.format(win=">", lose="<")})
min_ = declare("min", (1, 2), _min, infer=_extreme_rule("min", arith.minimum), family=FAMILY,
               attrs=_REDUCE,
               doc="min(x, axis=None, keepdims=false) — the smallest element, or along axes; "
                   "min(x, y) is minimum(x, y)",
    bprop={1: """lambda (x, axis, keepdims, out, dout)
                   let m = cast_like(x == unreduce(out, x, axis, keepdims), dout) in
                   (unreduce(dout, x, axis, keepdims) * m / unreduce(sum(m, axis, true), x, axis, true),)
                 end""",
           2: arith.TIE_SPLIT_2ARG.format(win="<", lose=">")})
prod = declare("prod", 1, _prod, infer=rules.reduction("prod"), family=FAMILY,
               attrs=_REDUCE, positional_attrs=2,
               doc="prod(x, axis=None, keepdims=false) — the product of the elements, or along axes",
    bprop="""lambda (x, axis, keepdims, out, dout)
        (unreduce(dout, x, axis, keepdims) * prod_others(x, axis),) end""")
var = declare("var", 1, _var, infer=rules.reduction("var"), family=FAMILY,
              attrs={**_REDUCE, "correction": 0}, positional_attrs=2,
              doc="var(x, axis=None, keepdims=false, correction=0) — the variance (divided by "
                  "n - correction)",
    bprop="""lambda (x, axis, keepdims, correction, out, dout)
        (unreduce(dout, x, axis, keepdims) * 2.0 * (x - mean(x, axis, true))
         / (size(x) / size(out) - correction),) end""")
std = declare("std", 1, _std, infer=rules.reduction("std"), family=FAMILY,
              attrs={**_REDUCE, "correction": 0}, positional_attrs=2,
              doc="std(x, axis=None, keepdims=false, correction=0) — the standard deviation, "
                  "sqrt(var(...))",
    bprop="""lambda (x, axis, keepdims, correction, out, dout)
        (unreduce(dout / out, x, axis, keepdims) * (x - mean(x, axis, true))
         / (size(x) / size(out) - correction),) end""")
logsumexp = declare("logsumexp", 1, _logsumexp, infer=rules.reduction("logsumexp"), family=FAMILY,
                    attrs=_REDUCE, positional_attrs=2,
                    doc="logsumexp(x, axis=None, keepdims=false) — log(sum(exp(x))), without "
                        "overflow",
    bprop="""lambda (x, axis, keepdims, out, dout)
        (unreduce(dout, x, axis, keepdims) * exp(x - unreduce(out, x, axis, keepdims)),) end""")
all_ = declare("all", 1, _all, infer=rules.reduction("all", "bool"), family=FAMILY,
               attrs=_REDUCE, positional_attrs=2, differentiable=False,
               doc="all(x, axis=None, keepdims=false) — whether every element is true (non-zero)")
any_ = declare("any", 1, _any, infer=rules.reduction("any", "bool"), family=FAMILY,
               attrs=_REDUCE, positional_attrs=2, differentiable=False,
               doc="any(x, axis=None, keepdims=false) — whether some element is true (non-zero)")
norm = declare("norm", 1, _norm, infer=rules.reduction("norm"), family=FAMILY,
               attrs={"ord": 2, **_REDUCE}, positional_attrs=3,
               doc="norm(x, ord=2, axis=None, keepdims=false) — the vector norm over axes (all "
                   "elements by default): (sum |x|^ord)^(1/ord); ord=1e999 (inf) is max |x|",
    bprop="""lambda (x, ord, axis, keepdims, out, dout)
        if ord == 0 then (zeros_like(x),)
        else
          let o = unreduce(out, x, axis, keepdims) in
          let safe = where(o == 0.0, ones_like(o), o) in
          (unreduce(dout, x, axis, keepdims) * sign(x) * (abs(x) / safe) ** (ord - 1),)
        end""")
argmax = declare("argmax", 1, _arg_extreme("argmax", np.argmax), infer=_arg_rule("argmax"),
                 family=FAMILY, attrs={"axis": 0, "keepdims": False, "select_last": False},
                 positional_attrs=2, differentiable=False,
                 doc="argmax(x, axis=0, keepdims=false, select_last=false) — the index (i64) of "
                     "the largest element along an axis (None: of the flattened x); ties: the "
                     "first, or the last with select_last")
argmin = declare("argmin", 1, _arg_extreme("argmin", np.argmin), infer=_arg_rule("argmin"),
                 family=FAMILY, attrs={"axis": 0, "keepdims": False, "select_last": False},
                 positional_attrs=2, differentiable=False,
                 doc="argmin(x, axis=0, keepdims=false, select_last=false) — the index (i64) of "
                     "the smallest element along an axis")
cumsum = declare("cumsum", 1, _scan("cumsum", np.cumsum, 0), infer=_scan_rule("cumsum"),
                 family=FAMILY, attrs={"axis": None, "exclusive": False, "reverse": False},
                 positional_attrs=3,
                 doc="cumsum(x, axis, exclusive=false, reverse=false) — running sums along an "
                     "axis (None: of the flattened x)",
    bprop="""lambda (x, axis, exclusive, reverse, out, dout)
        (reshape_like(cumsum(dout, axis, exclusive, not reverse), x),) end""")
cumprod = declare("cumprod", 1, _scan("cumprod", np.cumprod, 1), infer=_scan_rule("cumprod"),
                  family=FAMILY, attrs={"axis": None, "exclusive": False, "reverse": False},
                  positional_attrs=3,
                  doc="cumprod(x, axis, exclusive=false, reverse=false) — running products "
                      "(the gradient divides by x: it needs x without zeros)",
    bprop="""lambda (x, axis, exclusive, reverse, out, dout)
        (reshape_like(cumsum(dout * out, axis, exclusive, not reverse), x) / x,) end""")

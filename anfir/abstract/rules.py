"""Abstract rules of the primitives (the ``infer=`` of each ``declare``).

The interface is one function per primitive::

    infer(*arg_abstracts) -> AbstractValue

It receives the arguments' abstract values (never ⊥: the engine is strict) and
returns the result's, or raises :class:`~anfir.errors.AnfirTypeError` /
:class:`~anfir.errors.ShapeError` with a message; the engine attaches the
calling node's location.  Arguments that are :class:`AAny` make the engine
return ``AAny`` without calling the rule (except for ``make_tuple``).  The
engine also folds constants: when every argument is a scalar or string with a
known value and the rule returns an ``AScalar``, it runs the primitive's
``impl`` and keeps the value (so ``switch(3 > 2, a, b)`` selects ``a``).

Element types follow numpy exactly: :func:`elementwise` runs the primitive's
own ``impl`` once on tiny sample values of the argument types (cached) and
reads the result's type, so ``f32[3] * 2.0`` is ``f32`` and ``i64 / i64`` is
``f64`` just as at run time.  Shapes are computed symbolically
(:mod:`anfir.abstract.shapes`, re-exported here for rule writers).
"""

from __future__ import annotations

from typing import Any, Callable, Hashable, Optional, Sequence

import numpy as np
import sympy

from anfir.abstract.lattice import JoinError, join, map_tuple_leaves
from anfir.abstract.shapes import (broadcast_shapes, broadcast_to_shape, dims_equal, fresh_dim,
                                   matmul_shape, norm_dim, reduce_shape, reshape_shape, shape_text,
                                   transpose_shape)
from anfir.abstract.values import (UNKNOWN, AAny, AbstractValue, AEnv, AFunction, ANone, AScalar,
                                   AString, ATensor, ATuple, Dim, PartialFn)
from anfir.dtypes import (LITERAL_DTYPES, check_dtype, dtype_of_array, is_integer, numpy_name,
                          require_dtype_name)
from anfir.errors import AnfirTypeError, ShapeError
from anfir.nested import fold_nested

Rule = Callable[..., AbstractValue]

__all__ = [
    "ProbingRule", "Rule", "array_rule", "tensor_or_scalar", "broadcast_shapes", "broadcast_to_rule", "cast_rule", "constructor_rule",
    "dims_equal", "elementwise", "identity_rule", "len_rule", "make_tuple_rule", "matmul_rule",
    "matmul_shape", "ones_like_rule", "partial_rule", "reduce_shape", "reduction", "reshape_rule",
    "reshape_shape", "shape_rule", "switch_rule", "transpose_rule", "transpose_shape",
    "tuple_getitem_rule", "where_rule", "zeros_like_rule", "shape_of_abstract", "int_value",
    "dims_of_shape_arg", "dtype_of_arg", "shape_text", "ShapeError", "probe",
    "static_of_abstract", "axis_attr", "bool_attr", "float_attr", "choice_attr",
]


# -- samples: numpy decides element types -------------------------------------------
_DEFAULT_SCALARS = {name: python_type(1) for python_type, name in LITERAL_DTYPES.items()}
"""A sample Python value of each literal type (``True``, ``1``, ``1.0``)."""


def _sample(a: AbstractValue) -> Any:
    if isinstance(a, AScalar):
        if a.dtype in _DEFAULT_SCALARS:
            return _DEFAULT_SCALARS[a.dtype]
        return np.dtype(_np_name(a.dtype)).type(1)
    if isinstance(a, ATensor):
        rank = 1 if a.shape is None else len(a.shape)
        return np.ones((1,) * rank, dtype=_np_name(a.dtype))
    if isinstance(a, AString):
        return "a"
    raise TypeError


def _np_name(dtype: str) -> str:
    return numpy_name(dtype)  # AnfirTypeError "unknown dtype" for a name outside the table


def _kind(a: AbstractValue) -> tuple[Hashable, ...]:
    if isinstance(a, AScalar):
        return ("s", a.dtype)
    if isinstance(a, ATensor):
        return ("t", a.dtype, None if a.shape is None else len(a.shape))
    return (type(a).__name__,)


def _result_kind(value: Any) -> tuple[str, str]:
    """('t', dtype) for an array, ('s', dtype) for a scalar, ('str', '') for a string."""
    if isinstance(value, np.ndarray):
        return ("t", dtype_of_array(value))
    if isinstance(value, bool):
        return ("s", "bool")
    if isinstance(value, int):
        return ("s", "i64")
    if isinstance(value, float):
        return ("s", "f64")
    if isinstance(value, complex):
        return ("s", "c128")
    if isinstance(value, np.generic):
        return ("s", dtype_of_array(value))
    if isinstance(value, str):
        return ("str", "")
    raise TypeError(type(value).__name__)


_PROBES: dict[tuple[Hashable, ...], tuple[str, str]] = {}


def probe(name: str, impl: Callable[..., Any], args: Sequence[AbstractValue]) -> tuple[str, str]:
    """Run ``impl`` on sample values of ``args``' types; ('t'|'s'|'str', dtype) of the result."""
    key = (name,) + tuple(_kind(a) for a in args)
    hit = _PROBES.get(key)
    if hit is not None:
        return hit
    try:
        samples = [_sample(a) for a in args]
        with np.errstate(all="ignore"):
            result = _result_kind(impl(*samples))
    except Exception:  # the sample call is how we learn the op does not accept these types
        raise AnfirTypeError(f"{name} cannot be applied to {', '.join(str(a) for a in args)}") from None
    _PROBES[key] = result
    return result


class ProbingRule:
    """A rule that learns its result's dtype by running the primitive's own
    ``impl`` on sample values (:func:`probe`).  The op library's ``declare``
    binds the impl of the primitive the rule is declared with."""

    def __init__(self, name: str, body: Callable[..., AbstractValue], doc: str) -> None:
        self.name = name
        self.body = body
        self.impl: Optional[Callable[..., Any]] = None
        """The primitive's evaluation, bound by ``declare``."""
        self.__name__ = self.__qualname__ = f"infer_{name}"
        self.__doc__ = doc

    def __call__(self, *args: AbstractValue, **attrs: Any) -> AbstractValue:
        if self.impl is None:
            raise AnfirTypeError(f"the rule of {self.name} is not bound to a primitive")
        return self.body(self.impl, *args, **attrs)


# -- elementwise --------------------------------------------------------------------
def _elementwise_result(name: str, impl: Callable[..., Any], *args: AbstractValue) -> AbstractValue:
    """Numpy broadcasting of ``args``' shapes, and the dtype ``impl`` gives on samples."""
    for a in args:
        if not isinstance(a, (AScalar, ATensor, AString)):
            raise AnfirTypeError(f"{name} needs numbers or tensors, not {a}")
    kind, dtype = probe(name, impl, args)
    tensors = [a for a in args if isinstance(a, ATensor)]
    if kind == "str":
        return AString()
    if (len(tensors) == 1 and tensors[0].leading
            and all(isinstance(a, AScalar) for a in args if a is not tensors[0])):
        # One tensor of unknown rank >= 1 with scalars: the result has its shape.
        return ATensor(dtype, None, tensors[0].leading)
    if kind == "t" or (tensors and any(t.shape is None for t in tensors)):
        shape = broadcast_shapes([t.shape for t in tensors], [t.dtype for t in tensors])
        return ATensor(dtype, shape)
    if tensors:
        # Only 0-d tensors: numpy returns a numpy scalar; still check shapes.
        broadcast_shapes([t.shape for t in tensors], [t.dtype for t in tensors])
    return AScalar(dtype)


def elementwise(name: str, check: Optional[Callable[..., None]] = None) -> ProbingRule:
    """The rule of an elementwise primitive: numpy broadcasting, numpy's result dtype.

    ``check(**attrs)`` validates the call's attributes (raising
    :class:`AnfirTypeError`); a primitive without attributes has none.
    """
    def body(impl: Callable[..., Any], *args: AbstractValue, **attrs: Any) -> AbstractValue:
        if check is not None:
            check(**attrs)
        return _elementwise_result(name, impl, *args)

    return ProbingRule(name, body, f"Abstract rule of {name}: elementwise, numpy broadcasting "
                       "and dtypes.")


# -- argument helpers -----------------------------------------------------------------
def int_value(a: AbstractValue, what: str) -> Optional[int]:
    """The known integer value of ``a`` (None when unknown); errors if not an integer."""
    if not isinstance(a, AScalar) or not is_integer(a.dtype):
        raise AnfirTypeError(f"{what} must be an integer, not {a}")
    if a.value is UNKNOWN:
        return None
    value: int = a.value
    return value


def dims_of_shape_arg(a: AbstractValue, what: str = "a shape") -> tuple[Dim, ...]:
    """A shape argument (an int or a tuple of ints) as dimensions; unknown ints are fresh dims."""
    items = a.items if isinstance(a, ATuple) else (a,)
    dims: list[Dim] = []
    for item in items:
        if not isinstance(item, AScalar) or not is_integer(item.dtype):
            raise AnfirTypeError(f"{what} is an integer or a tuple of integers, not {a}")
        dims.append(fresh_dim() if item.value is UNKNOWN else norm_dim(item.value))
    return tuple(dims)


def dtype_of_arg(a: AbstractValue) -> str:
    """A dtype argument: a string constant such as ``"f32"``."""
    if isinstance(a, AString) and a.value is not UNKNOWN:
        return check_dtype(a.value)
    raise AnfirTypeError(f"a dtype is a constant string such as \"f32\", not {a}")


def shape_of_abstract(a: AbstractValue, what: str) -> tuple[str, Optional[tuple[Dim, ...]]]:
    """(dtype, shape) of a tensor or scalar argument (a scalar has shape ``()``)."""
    if isinstance(a, ATensor):
        return a.dtype, a.shape
    if isinstance(a, AScalar):
        return a.dtype, ()
    raise AnfirTypeError(f"{what} needs a tensor, not {a}")


def _axis_value(a: AbstractValue) -> int | tuple[int, ...] | None:
    if isinstance(a, ANone):
        return None
    if isinstance(a, ATuple):
        values = [int_value(i, "an axis") for i in a.items]
        if any(v is None for v in values):
            raise AnfirTypeError(f"the axes must be constants, not {a}")
        return tuple(v for v in values if v is not None)
    value = int_value(a, "an axis")
    if value is None:
        raise AnfirTypeError(f"the axis must be a constant, not {a}")
    return value


def static_of_abstract(a: AbstractValue, what: str) -> Any:
    """The constant ``a`` stands for — an attribute passed positionally
    (``sum(x, 1)``) must be one: None, a known bool, int, float or string, or a
    tuple of those.  Raises :class:`AnfirTypeError` naming ``what`` otherwise."""
    def leaf(v: AbstractValue) -> Any:
        if isinstance(v, ANone):
            return None
        if isinstance(v, AScalar) and v.value is not UNKNOWN:
            value = v.value
            if isinstance(value, sympy.Basic):
                if not value.is_Integer:
                    raise AnfirTypeError(f"{what} must be a constant (it is an attribute), not {a}")
                return int(value)
            return value
        if isinstance(v, AString) and v.value is not UNKNOWN:
            return v.value
        raise AnfirTypeError(f"{what} must be a constant (it is an attribute), not {a}")

    return fold_nested(a, lambda v: v.items if isinstance(v, ATuple) else None,
                       lambda _t, items: tuple(items), leaf)


def axis_attr(axis: Any, what: str) -> int | tuple[int, ...] | None:
    """An ``axis`` attribute checked: None, an int, or a tuple of ints."""
    if axis is None or (isinstance(axis, int) and not isinstance(axis, bool)):
        return axis
    if isinstance(axis, tuple) and all(isinstance(a, int) and not isinstance(a, bool) for a in axis):
        return axis
    raise AnfirTypeError(f"the axis of {what} is None, an integer or a tuple of integers, "
                         f"not {axis!r}")


def bool_attr(value: Any, name: str, what: str) -> bool:
    """A boolean attribute checked (``keepdims=true``)."""
    if not isinstance(value, bool):
        raise AnfirTypeError(f"the attribute {name} of {what} is true or false, not {value!r}")
    return value


def float_attr(value: Any, name: str, what: str, optional: bool = False) -> Optional[float]:
    """A number attribute checked (``alpha=0.1``); None allowed when ``optional``."""
    if value is None and optional:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise AnfirTypeError(f"the attribute {name} of {what} is a number"
                         f"{' or None' if optional else ''}, not {value!r}")


def choice_attr(value: Any, name: str, what: str, choices: Sequence[str]) -> str:
    """A string attribute among ``choices`` (``approximate="tanh"``)."""
    if not isinstance(value, str) or value not in choices:
        options = ", ".join(f'"{c}"' for c in choices)
        raise AnfirTypeError(f"the attribute {name} of {what} is one of {options}, not {value!r}")
    return value


def tensor_or_scalar(dtype: str, shape: Optional[tuple[Dim, ...]]) -> AbstractValue:
    # numpy returns a numpy scalar (not a 0-d array) from reductions and 1-d @ 1-d.
    return AScalar(dtype) if shape == () else ATensor(dtype, shape)


# -- tensor rules ------------------------------------------------------------------------
def matmul_rule(a: AbstractValue, b: AbstractValue) -> AbstractValue:
    """``matmul(a, b)``: ``(.., n, k) @ (.., k, m) -> (.., n, m)`` on symbolic dims."""
    for x in (a, b):
        if not isinstance(x, ATensor):
            raise AnfirTypeError(f"matmul needs tensors of rank >= 1, not {x}")
    assert isinstance(a, ATensor) and isinstance(b, ATensor)
    shape = matmul_shape(a.shape, b.shape, a.dtype, b.dtype)
    dtype = np.result_type(np.dtype(_np_name(a.dtype)), np.dtype(_np_name(b.dtype)))
    return tensor_or_scalar(require_dtype_name(dtype), shape)


def transpose_rule(x: AbstractValue, perm: Optional[AbstractValue] = None) -> AbstractValue:
    """``transpose(x)`` reverses the axes; ``transpose(x, perm)`` permutes them."""
    dtype, shape = shape_of_abstract(x, "transpose")
    order = None
    if perm is not None and not isinstance(perm, ANone):
        axes = _axis_value(perm)
        order = (axes,) if isinstance(axes, int) else axes
    return ATensor(dtype, transpose_shape(shape, order, dtype))


def reshape_rule(x: AbstractValue, shape: AbstractValue) -> AbstractValue:
    """``reshape(x, shape)``: same number of elements (checked on symbols), ``-1`` solved."""
    dtype, old = shape_of_abstract(x, "reshape")
    return ATensor(dtype, reshape_shape(old, dims_of_shape_arg(shape), dtype))


def reduction(name: str, dtype: Optional[str] = None) -> ProbingRule:
    """The rule of a reduction with attributes ``axis`` and ``keepdims`` (``sum``,
    ``mean``, ``max``...): the reduced axes are dropped (kept as 1 with
    ``keepdims``); the dtype is ``dtype`` when given, else what the primitive's
    ``impl`` gives on a sample.  Other attributes are checked by the impl on
    the sample (an error there is a type error)."""

    def rule(impl: Callable[..., Any], x: AbstractValue, *, axis: Any = None,
             keepdims: Any = False, **others: Any) -> AbstractValue:
        in_dtype, shape = shape_of_abstract(x, name)
        ax = axis_attr(axis, name)
        keep = bool_attr(keepdims, "keepdims", name)
        out_dtype = dtype
        if out_dtype is None:
            _, out_dtype = probe(name, impl, (ATensor(in_dtype, (1,)),))
        return tensor_or_scalar(out_dtype, reduce_shape(shape, ax, in_dtype, keep))

    return ProbingRule(name, rule, f"Abstract rule of {name}: a reduction over all axes or the "
                       "given ones (kept as 1 with keepdims).")


def broadcast_to_rule(x: AbstractValue, shape: AbstractValue) -> AbstractValue:
    """``broadcast_to(x, shape)``: checks numpy broadcasting, gives ``shape``."""
    dtype, old = shape_of_abstract(x, "broadcast_to")
    return ATensor(dtype, broadcast_to_shape(old, dims_of_shape_arg(shape), dtype))


def shape_rule(x: AbstractValue) -> AbstractValue:
    """``shape(x)``: a tuple of integers whose values are the (symbolic) dimensions."""
    dtype, shape = shape_of_abstract(x, "shape")
    if shape is None:
        raise AnfirTypeError(f"shape() of a tensor of unknown rank ({x}) is not supported")
    return ATuple(tuple(AScalar("i64", d) for d in shape))


def ones_like_rule(x: AbstractValue) -> AbstractValue:
    """``ones_like(x)``: x's type and shape (values forgotten)."""
    if isinstance(x, (AScalar, ATensor)):
        return x.widen() if isinstance(x, AScalar) else x
    raise AnfirTypeError(f"ones_like needs a number or a tensor, not {x}")


def zeros_like_rule(x: AbstractValue) -> AbstractValue:
    """``zeros_like(x)``: x's type; tuples elementwise; None for None/str; a GradEnv for
    functions (partial applications included)."""
    if isinstance(x, ATuple):  # (nested tuples with an explicit stack)
        return map_tuple_leaves(x, zeros_like_rule)
    if isinstance(x, AScalar):
        return x.widen()
    if isinstance(x, ATensor):
        return x
    if isinstance(x, (ANone, AString)):
        return ANone()
    if isinstance(x, (AFunction, AEnv)):
        return AEnv()
    if isinstance(x, AAny):  # inside a tuple (a bare Any never reaches the rule): unknown too
        return x
    raise AnfirTypeError(f"zeros_like cannot be applied to {x}")


def constructor_rule(name: str) -> Rule:
    """The rule of ``zeros(shape[, dtype])`` / ``ones(...)``: an ``f64`` tensor by default."""

    def rule(shape: AbstractValue, dtype: Optional[AbstractValue] = None) -> AbstractValue:
        name_ = "f64" if dtype is None else dtype_of_arg(dtype)
        return ATensor(name_, dims_of_shape_arg(shape))

    rule.__name__ = rule.__qualname__ = f"infer_{name}"
    rule.__doc__ = f"Abstract rule of {name}: a tensor of the given shape and dtype."
    return rule


def _where(impl: Callable[..., Any], c: AbstractValue, a: AbstractValue,
           b: AbstractValue) -> AbstractValue:
    if all(isinstance(v, AScalar) for v in (c, a, b)):
        assert isinstance(c, AScalar)
        if c.dtype != "bool":
            raise AnfirTypeError(f"the condition of where must be a bool or a bool tensor, not {c}")
        if c.value is not UNKNOWN:
            return a if c.value else b
        try:
            return join(a, b)
        except JoinError:
            raise AnfirTypeError(f"where on scalars needs two values of one type, not {a} and {b}") from None
    if not isinstance(c, (AScalar, ATensor)) or c.dtype != "bool":
        raise AnfirTypeError(f"the condition of where must be a bool or a bool tensor, not {c}")
    return _elementwise_result("where", impl, c, a, b)


where_rule = ProbingRule("where", _where, "``where(c, a, b)``: broadcast of the three shapes; "
                         "scalars select like ``switch``.")


def _array(impl: Callable[..., Any], nested: AbstractValue) -> AbstractValue:
    def leaf(a: AbstractValue) -> Any:
        if isinstance(a, AScalar):
            return a.value if isinstance(a.value, (bool, int, float)) else _sample(a)
        if isinstance(a, ATensor) and a.shape is not None and all(isinstance(d, int) for d in a.shape):
            return np.ones(a.shape, _np_name(a.dtype))
        raise AnfirTypeError(f"array() needs a nested tuple of numbers, not {nested}")

    # Sample values with the tuple's nesting (any depth: no recursion).
    sample = fold_nested(nested, lambda a: a.items if isinstance(a, ATuple) else None,
                         lambda _t, items: tuple(items), leaf)
    value = impl(sample)
    return ATensor(dtype_of_array(value), tuple(int(d) for d in value.shape))


array_rule = ProbingRule("array", _array, "``array(t)``: the shape is the nesting of the tuple, "
                         "the dtype numpy's.")


def cast_rule(x: AbstractValue, dtype: AbstractValue) -> AbstractValue:
    """``cast(x, "f32")``: the same shape with another dtype."""
    name = dtype_of_arg(dtype)
    if isinstance(x, AScalar):
        return AScalar(name)
    if isinstance(x, ATensor):
        return ATensor(name, x.shape, x.leading)
    raise AnfirTypeError(f"cast needs a number or a tensor, not {x}")


# -- tuples and control ------------------------------------------------------------------
def make_tuple_rule(*items: AbstractValue) -> AbstractValue:
    """``make_tuple(a, b, ...)``."""
    return ATuple(tuple(items))


def tuple_getitem_rule(t: AbstractValue, i: AbstractValue) -> AbstractValue:
    """``t[i]``: the element when ``i`` is a constant; the join of all elements otherwise."""
    if not isinstance(t, ATuple):
        raise AnfirTypeError(f"indexing needs a tuple, not {t}")
    index = int_value(i, "a tuple index")
    if index is None:
        if not t.items:
            raise AnfirTypeError("indexing an empty tuple")
        result = t.items[0]
        try:
            for item in t.items[1:]:
                result = join(result, item)
        except JoinError:
            raise AnfirTypeError(f"a tuple index must be a constant when the elements have "
                                 f"different types ({t})") from None
        return result
    if not -len(t.items) <= index < len(t.items):
        raise AnfirTypeError(f"tuple index {index} is out of range for a tuple of {len(t.items)}: {t}")
    return t.items[index]


def len_rule(t: AbstractValue) -> AbstractValue:
    """``len(t)``: a known integer."""
    if not isinstance(t, ATuple):
        raise AnfirTypeError(f"len needs a tuple, not {t}")
    return AScalar("i64", len(t.items))


def switch_rule(c: AbstractValue, a: AbstractValue, b: AbstractValue) -> AbstractValue:
    """``switch(c, a, b)``: ``a`` or ``b`` when ``c`` is known, else their join (functions unite)."""
    if isinstance(c, AAny):
        c = AScalar("bool")
    if not (isinstance(c, AScalar) and c.dtype == "bool") and not (
            isinstance(c, ATensor) and c.dtype == "bool" and c.shape == ()):
        raise AnfirTypeError(f"a condition must be a bool, not {c}")
    if isinstance(c, AScalar) and c.value is not UNKNOWN:
        return a if c.value else b
    try:
        return join(a, b)
    except JoinError as exc:
        raise AnfirTypeError(f"the two branches have different types: {exc.a} and {exc.b}") from None


def partial_rule(fn: AbstractValue, *args: AbstractValue) -> AbstractValue:
    """``partial(f, a, ...)``: a function atom remembering the bound arguments' types."""
    if isinstance(fn, AAny):
        return AAny()
    if not isinstance(fn, AFunction):
        raise AnfirTypeError(f"partial needs a function, not {fn}")
    return AFunction(frozenset(PartialFn(atom, tuple(args)) for atom in fn.options))


def identity_rule(x: AbstractValue) -> AbstractValue:
    """``identity(x)`` / ``stop_gradient(x)``: x."""
    return x

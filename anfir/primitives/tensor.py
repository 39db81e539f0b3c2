"""Tensor operations: matmul, shapes, reductions, constructors, casts."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from anfir.errors import AnfirTypeError
from anfir.primitives.registry import declare
from anfir.abstract import rules
from anfir.dtypes import ELEMENT_TYPES, LITERAL_DTYPES, check_dtype, numpy_name
from anfir.runtime_values import DType

FAMILY = "tensor"
_PYTHON_SCALARS = frozenset(LITERAL_DTYPES.values())
"""The dtypes whose scalars are Python values (``bool``, ``int``, ``float``)."""


def dtype_attr(dtype: Any) -> str:
    """A ``dtype`` attribute (a name or a ``DType``) as the checked dtype name."""
    return check_dtype(dtype.name if isinstance(dtype, DType) else dtype)


def shape_attr(shape: Any) -> tuple[int, ...]:
    """A ``shape`` attribute (an integer or a tuple of them) as a tuple of ints."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        return (int(shape),)
    if isinstance(shape, tuple) and all(isinstance(d, (int, np.integer)) and not isinstance(d, bool)
                                        for d in shape):
        return tuple(int(d) for d in shape)
    raise AnfirTypeError(f"a shape is a tuple of integers, not {shape!r}")


def _matmul(x: Any, y: Any) -> Any:
    # The common case first: two arrays of rank >= 1 (np.ndim costs a dispatch).
    if type(x) is np.ndarray and type(y) is np.ndarray and x.ndim and y.ndim:
        return x @ y
    if np.ndim(x) == 0 or np.ndim(y) == 0:
        raise AnfirTypeError("matmul needs tensors of rank >= 1, not scalars")
    return np.matmul(x, y)


def _transpose(x: Any, perm: Optional[tuple[int, ...]] = None) -> Any:
    if perm is None and type(x) is np.ndarray:
        return x.T  # reverses the axes, as np.transpose does, without its dispatch
    return np.transpose(x, perm)


def _reshape(x: Any, shape: Any) -> Any:
    return np.reshape(x, shape_attr(shape))


def _axis(axis: Any) -> Any:
    if axis is None or isinstance(axis, (int, np.integer)):
        return axis
    if isinstance(axis, tuple):
        return tuple(int(a) for a in axis)
    raise AnfirTypeError(f"an axis is an integer or a tuple of integers, not {axis!r}")


def _keepdims(keepdims: Any, what: str) -> bool:
    return rules.bool_attr(keepdims, "keepdims", what)


def _sum(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    return np.sum(x, axis=_axis(axis), keepdims=_keepdims(keepdims, "sum"))


def _mean(x: Any, axis: Any = None, keepdims: bool = False) -> Any:
    return np.mean(x, axis=_axis(axis), keepdims=_keepdims(keepdims, "mean"))


def _broadcast_to(x: Any, shape: Any) -> Any:
    return np.broadcast_to(x, shape_attr(shape))


def _shape(x: Any) -> tuple[int, ...]:
    if isinstance(x, np.ndarray):
        return tuple(int(d) for d in x.shape)
    if isinstance(x, (bool, int, float, np.generic)):
        return ()
    raise AnfirTypeError(f"shape needs a tensor or a number, not {type(x).__name__}")


def _zeros(shape: Any, dtype: Any = "f64") -> np.ndarray:
    return np.zeros(shape_attr(shape), numpy_name(dtype_attr(dtype)))


def _ones(shape: Any, dtype: Any = "f64") -> np.ndarray:
    return np.ones(shape_attr(shape), numpy_name(dtype_attr(dtype)))


FOLD_ELEMENTS = 1 << 20
"""The largest tensor that ``zeros``/``ones``/``broadcast_to`` make at compile time
(constant folding): a bigger one is left to run time, so compiling
``ones((99999, 99999))`` neither allocates it nor writes it into a dump."""


def _small_result(position: int) -> Any:
    def guard(values: Any) -> bool:
        shape = values[position] if len(values) > position else ()
        dims = shape if isinstance(shape, tuple) else (shape,)
        count = 1
        for d in dims:
            if not isinstance(d, int) or d < 0:
                return True  # (the evaluation will say what is wrong)
            count *= d
            if count > FOLD_ELEMENTS:
                return False
        return True
    return guard


def _where(c: Any, a: Any, b: Any) -> Any:
    if isinstance(c, (bool, np.bool_)):
        if np.ndim(a) == 0 and np.ndim(b) == 0:
            return a if c else b
    elif not (isinstance(c, np.ndarray) and c.dtype == np.bool_):
        what = f"a {c.dtype.name} tensor" if isinstance(c, np.ndarray) else type(c).__name__
        raise AnfirTypeError(f"the condition of where must be a bool or a bool tensor, not {what}")
    if a.__class__ is tuple or b.__class__ is tuple:
        raise AnfirTypeError("where needs numbers or tensors, not a tuple")
    return np.where(c, a, b)


def _array(nested: Any) -> np.ndarray:
    try:
        result = np.array(nested)
    except ValueError as exc:
        raise AnfirTypeError(f"array() needs a rectangular nested tuple of numbers: {exc}") from None
    if result.dtype.kind not in "biufc":
        raise AnfirTypeError("array() needs numbers")
    return result


def _cast(x: Any, dtype: Any) -> Any:
    """``x`` converted to ``dtype`` the way numpy converts a tensor's elements
    (integers wrap around, floats round to the precision), on a scalar too: a
    scalar of a literal's type (``bool``, ``i64``, ``f64``) is a Python value, any
    other a numpy scalar of that dtype (``cast(1000, "i8")`` is ``int8(-24)``)."""
    name = dtype_attr(dtype)
    if isinstance(x, np.ndarray):
        return x.astype(numpy_name(name))
    if x.__class__ is tuple or isinstance(x, str) or x is None:
        raise AnfirTypeError(f"cast needs a number or a tensor, not {type(x).__name__}")
    with np.errstate(all="ignore"):
        value = np.array(x).astype(numpy_name(name))[()]
    return value.item() if name in _PYTHON_SCALARS else value


matmul = declare("matmul", 2, _matmul, infer=rules.matmul_rule, family=FAMILY,
                 doc="matmul(a, b) — matrix product a @ b (numpy rules for rank 1 and batches)",
    bprop="lambda (x, y, out, dout) (matmul_dx(dout, y, x), matmul_dy(x, dout, y)) end")
transpose = declare("transpose", (1, 2), _transpose, infer=rules.transpose_rule, family=FAMILY,
                    doc="transpose(x) — reverse the axes; transpose(x, perm) — permute them",
    bprop={1: "lambda (x, out, dout) (transpose(dout),) end", 2: "lambda (x, p, out, dout) (transpose(dout, invert_permutation(p)), zeros_like(p)) end"})
reshape = declare("reshape", 2, _reshape, infer=rules.reshape_rule, family=FAMILY,
                  doc="reshape(x, shape) — same elements, new shape (a tuple of ints)",
    bprop="lambda (x, s, out, dout) (reshape(dout, shape(x)), zeros_like(s)) end")
_REDUCE = {"axis": None, "keepdims": False}
"""The attributes every reduction takes."""

sum_ = declare("sum", 1, _sum, infer=rules.reduction("sum"), family=FAMILY,
               attrs=_REDUCE, positional_attrs=2,
               doc="sum(x, axis=None, keepdims=false) — the sum of all elements, or along an axis "
                   "or tuple of axes (sum(x, 1) is sum(x, axis=1))",
    bprop="lambda (x, axis, keepdims, out, dout) (unreduce(dout, x, axis, keepdims),) end")
mean = declare("mean", 1, _mean, infer=rules.reduction("mean"), family=FAMILY,
               attrs=_REDUCE, positional_attrs=2,
               doc="mean(x, axis=None, keepdims=false) — the mean of all elements, or along axes",
    bprop="lambda (x, axis, keepdims, out, dout) (unreduce(dout, x, axis, keepdims) / (size(x) / size(out)),) end")
broadcast_to = declare("broadcast_to", 2, _broadcast_to, infer=rules.broadcast_to_rule, fold_guard=_small_result(1), family=FAMILY,
                       doc="broadcast_to(x, shape) — x repeated to shape (numpy broadcasting)",
    bprop="lambda (x, s, out, dout) (sum_to(dout, x), zeros_like(s)) end")
shape = declare("shape", 1, _shape, infer=rules.shape_rule, family=FAMILY, differentiable=False,
                doc="shape(x) — the shape of x as a tuple of ints (() for a scalar)")
ones_like = declare("ones_like", 1, lambda x: np.ones_like(x) if isinstance(x, np.ndarray) else type(x)(1),
                    infer=rules.ones_like_rule, family=FAMILY, differentiable=False,
                    doc="ones_like(x) — ones of x's shape and type")
zeros = declare("zeros", (1, 2), _zeros, infer=rules.constructor_rule("zeros"), fold_guard=_small_result(0), family=FAMILY, differentiable=False,
                doc='zeros(shape) — an f64 tensor of zeros; zeros(shape, "f32") — of that dtype')
ones = declare("ones", (1, 2), _ones, infer=rules.constructor_rule("ones"), fold_guard=_small_result(0), family=FAMILY, differentiable=False,
               doc='ones(shape) — an f64 tensor of ones; ones(shape, "f32") — of that dtype')
where = declare("where", 3, _where, infer=rules.where_rule, family=FAMILY,
                doc="where(c, a, b) — a where c is true, else b, elementwise",
    bprop="lambda (c, a, b, out, dout) (zeros_like(c), sum_to(where(c, dout, zeros_like(dout)), a), sum_to(where(c, zeros_like(dout), dout), b)) end")
array = declare("array", 1, _array, infer=rules.array_rule, family=FAMILY, differentiable=False,
                doc="array(t) — a tensor from a nested tuple of numbers: array(((1.0, 2.0), (3.0, 4.0)))")
cast = declare("cast", 2, _cast, infer=rules.cast_rule, family=FAMILY,
               doc=f'cast(x, "f32") — convert to a dtype ({" ".join(ELEMENT_TYPES)})',
    bprop="lambda (x, t, out, dout) (cast_like(dout, x), zeros_like(t)) end")

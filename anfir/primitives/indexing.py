"""Indexing and construction: gather, gather_elements, gather_nd, scatter_add,
scatter_nd, topk, one_hot, arange, full, eye (the shared spec ``ops.md``).

Gathers and scatters follow ONNX (negative indices count from the end; an index
out of range is an error).  Gradients flow to the data (``x``, ``updates``),
never to indices; the gradient of a gather is a scatter-add, declared here as an
internal primitive whose gradient is the gather again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anfir.abstract import rules
from anfir.abstract.shapes import dims_compatible, fresh_dim, norm_dim
from anfir.abstract.values import UNKNOWN, AbstractValue, AScalar, ATensor, ATuple, Dim
from anfir.dtypes import check_dtype, is_integer, numpy_name, require_dtype_name
from anfir.errors import AnfirRuntimeError, AnfirTypeError, ShapeError
from anfir.primitives.registry import declare
from anfir.primitives.shaping import _arr, _out, axis_of, int_attr

FAMILY = "indexing"
MAX_ELEMENTS = 1 << 28
"""The largest tensor arange/full/eye/one_hot make (a bigger request is an error, not an allocation)."""


def _indices(i: Any, what: str) -> np.ndarray:
    array = _arr(i, what)
    if array.dtype.kind not in "iu":
        raise AnfirTypeError(f"the indices of {what} are integers, not {array.dtype.name}")
    return array.astype(np.int64, copy=False)


def _in_range(index: np.ndarray, n: int, what: str) -> np.ndarray:
    """Negative indices counted from the end; an index out of [-n, n) is an error."""
    if index.size and (index.min() < -n or index.max() >= n):
        raise AnfirRuntimeError(f"{what}: an index is out of range for an axis of length {n}")
    return np.where(index < 0, index + n, index)


def _int_tensor_abstract(a: AbstractValue, what: str) -> tuple[str, Any]:
    dtype, shape = rules.shape_of_abstract(a, what)
    if not is_integer(dtype):
        raise AnfirTypeError(f"the indices of {what} are integers, not {dtype}")
    return dtype, shape


def _result(dtype: str, shape: Any) -> AbstractValue:
    return rules.tensor_or_scalar(dtype, None if shape is None else tuple(shape))


# -- gather ------------------------------------------------------------------------------------
def _gather(x: Any, indices: Any, axis: Any = 0) -> Any:
    """numpy take / ONNX Gather: x.shape[:axis] + indices.shape + x.shape[axis+1:]."""
    array = _arr(x, "gather")
    if array.ndim == 0:
        raise ShapeError("gather needs a tensor of rank >= 1, not a scalar")
    ax = axis_of(axis, array.ndim, "gather")
    index = _in_range(_indices(indices, "gather"), array.shape[ax], "gather")
    return _out(np.take(array, index, axis=ax))


def _infer_gather(x: AbstractValue, indices: AbstractValue, *, axis: Any = 0) -> AbstractValue:
    dtype, shape = rules.shape_of_abstract(x, "gather")
    _, ishape = _int_tensor_abstract(indices, "gather")
    if shape is None or ishape is None:
        int_attr(axis, "axis", "gather")
        return ATensor(dtype, None)
    if not shape:
        raise ShapeError("gather needs a tensor of rank >= 1, not a scalar")
    ax = axis_of(axis, len(shape), "gather")
    return _result(dtype, tuple(shape[:ax]) + tuple(ishape) + tuple(shape[ax + 1:]))


def _gather_grad(dout: Any, x: Any, indices: Any, axis: Any = 0) -> Any:
    """Zeros of x's shape with dout added at the gathered places (the gradient of gather)."""
    g = _arr(dout, "gather_grad")
    shape = np.shape(x)
    ax = axis_of(axis, len(shape), "gather_grad")
    index = _in_range(_indices(indices, "gather_grad"), shape[ax], "gather_grad")
    acc = np.zeros((shape[ax],) + shape[:ax] + shape[ax + 1:], g.dtype)
    # g has shape x[:ax] + index.shape + x[ax+1:]: move the index axes first.
    k = index.ndim
    moved = np.moveaxis(g, tuple(range(ax, ax + k)), tuple(range(k)))
    np.add.at(acc, index, moved)
    return _out(np.moveaxis(acc, 0, ax))


def _like_second(name: str) -> Any:
    def rule(dout: AbstractValue, x: AbstractValue, *_rest: AbstractValue, **_a: Any) -> AbstractValue:
        dtype, _ = rules.shape_of_abstract(dout, name)
        _, shape = rules.shape_of_abstract(x, name)
        return _result(dtype, shape)
    rule.__name__ = rule.__qualname__ = f"infer_{name}"
    rule.__doc__ = f"Abstract rule of {name}: x's shape, dout's dtype."
    return rule


# -- gather_elements / scatter_add -------------------------------------------------------------
def _elements_args(x: Any, indices: Any, axis: Any, what: str) -> tuple[np.ndarray, np.ndarray, int]:
    array = _arr(x, what)
    index = _indices(indices, what)
    if array.ndim == 0 or index.ndim != array.ndim:
        raise ShapeError(f"{what}: indices of rank {index.ndim} for a tensor of rank {array.ndim} "
                         "(they have the tensor's rank, >= 1)")
    ax = axis_of(axis, array.ndim, what)
    for i, (n, m) in enumerate(zip(array.shape, index.shape)):
        if i != ax and m > n:
            raise ShapeError(f"{what}: indices of shape {list(index.shape)} do not fit a tensor "
                             f"of shape {list(array.shape)}")
    return array, _in_range(index, array.shape[ax], what), ax


def _gather_elements(x: Any, indices: Any, axis: Any = 0) -> Any:
    """numpy take_along_axis / torch.gather / ONNX GatherElements."""
    array, index, ax = _elements_args(x, indices, axis, "gather_elements")
    return np.take_along_axis(array[tuple(slice(0, m) if i != ax else slice(None)
                                          for i, m in enumerate(index.shape))], index, ax)


def _infer_gather_elements(x: AbstractValue, indices: AbstractValue, *, axis: Any = 0) -> AbstractValue:
    dtype, shape = rules.shape_of_abstract(x, "gather_elements")
    _, ishape = _int_tensor_abstract(indices, "gather_elements")
    if shape is not None and ishape is not None:
        if not shape or len(shape) != len(ishape):
            raise ShapeError("gather_elements: the indices have the tensor's rank (>= 1)")
        axis_of(axis, len(shape), "gather_elements")
    return ATensor(dtype, ishape)


def _scatter_add(x: Any, indices: Any, updates: Any, axis: Any = 0) -> Any:
    """ONNX ScatterElements with reduction add: x with updates added at the indexed places."""
    array, index, ax = _elements_args(x, indices, axis, "scatter_add")
    upd = _arr(updates, "scatter_add")
    if upd.shape != index.shape:
        raise ShapeError(f"scatter_add: updates of shape {list(upd.shape)} for indices of shape "
                         f"{list(index.shape)}")
    out = np.array(array, copy=True)
    where = [np.arange(m).reshape((-1,) + (1,) * (index.ndim - i - 1)) for i, m in enumerate(index.shape)]
    where[ax] = index
    np.add.at(out, tuple(where), upd.astype(out.dtype, copy=False))
    return out


def _infer_scatter(name: str) -> Any:
    def rule(x: AbstractValue, indices: AbstractValue, updates: AbstractValue, **attrs: Any) -> AbstractValue:
        dtype, shape = rules.shape_of_abstract(x, name)
        _int_tensor_abstract(indices, name)
        rules.shape_of_abstract(updates, name)
        if "axis" in attrs and shape is not None:
            axis_of(attrs["axis"], max(len(shape), 1), name)
        _, ishape = rules.shape_of_abstract(indices, name)
        _, ushape = rules.shape_of_abstract(updates, name)
        if name == "scatter_add" and ishape is not None and ushape is not None and (
                len(ishape) != len(ushape)
                or not all(dims_compatible(a, b) for a, b in zip(ishape, ushape))):
            raise ShapeError(f"scatter_add: updates of shape {list(ushape)} for indices of shape "
                             f"{list(ishape)}")
        return _result(dtype, shape)
    rule.__name__ = rule.__qualname__ = f"infer_{name}"
    rule.__doc__ = f"Abstract rule of {name}: x's shape and dtype."
    return rule


# -- gather_nd / scatter_nd -------------------------------------------------------------------
def nd_index(x: np.ndarray, indices: Any, what: str) -> tuple[np.ndarray, ...]:
    """numpy's index tuple for ``gather_nd``/``scatter_nd`` indices into ``x`` (their last
    axis indexes ``x``'s leading axes), checked: rank and bounds, ``what`` names the op."""
    index = _indices(indices, what)
    if index.ndim == 0 or index.shape[-1] > x.ndim:
        raise ShapeError(f"{what}: indices of shape {list(index.shape)} for a tensor of rank {x.ndim} "
                         "(the last axis indexes at most every axis)")
    return tuple(_in_range(index[..., i], x.shape[i], what) for i in range(index.shape[-1]))


def _gather_nd(x: Any, indices: Any) -> Any:
    """ONNX GatherND (batch_dims 0): x[tuple(indices[..., i])]."""
    array = _arr(x, "gather_nd")
    return _out(array[nd_index(array, indices, "gather_nd")])


def _infer_gather_nd(x: AbstractValue, indices: AbstractValue) -> AbstractValue:
    dtype, shape = rules.shape_of_abstract(x, "gather_nd")
    _, ishape = _int_tensor_abstract(indices, "gather_nd")
    if shape is None or ishape is None:
        return ATensor(dtype, None)
    q = ishape[-1] if ishape else None
    if not isinstance(q, int):
        if q is None:
            raise ShapeError("gather_nd: the indices have rank >= 1")
        return ATensor(dtype, None)
    if q > len(shape):
        raise ShapeError(f"gather_nd: the indices' last axis ({q}) is longer than the rank {len(shape)}")
    return _result(dtype, tuple(ishape[:-1]) + tuple(shape[q:]))


def _gather_nd_grad(dout: Any, x: Any, indices: Any) -> Any:
    """Zeros of x's shape with dout added at the gathered places (the gradient of gather_nd)."""
    g = _arr(dout, "gather_nd_grad")
    acc = np.zeros(np.shape(x), g.dtype)
    np.add.at(acc, nd_index(acc, indices, "gather_nd_grad"), g)
    return _out(acc)


def _scatter_nd(x: Any, indices: Any, updates: Any) -> Any:
    """ONNX ScatterND (no reduction): x with the indexed places replaced by updates."""
    array = _arr(x, "scatter_nd")
    out = np.array(array, copy=True)
    where = nd_index(out, indices, "scatter_nd")
    upd = _arr(updates, "scatter_nd")
    want = where[0].shape + out.shape[len(where):]
    if upd.shape != want:
        raise ShapeError(f"scatter_nd: updates of shape {list(upd.shape)}, not {list(want)}")
    out[where] = upd
    return _out(out)


# -- topk --------------------------------------------------------------------------------------------
def _topk(x: Any, k: Any = None, axis: Any = -1, largest: Any = True) -> Any:
    """The k largest (smallest) elements along axis, sorted, and their indices (i64); ties: the
    lower index first."""
    array = _arr(x, "topk")
    if k is None:
        raise AnfirTypeError("topk needs k")
    count = int_attr(k, "k", "topk")
    rules.bool_attr(largest, "largest", "topk")
    if array.ndim == 0:
        raise ShapeError("topk needs a tensor of rank >= 1")
    ax = axis_of(axis, array.ndim, "topk")
    if not 0 <= count <= array.shape[ax]:
        raise ShapeError(f"topk: k={count} for an axis of length {array.shape[ax]}")
    key = -array if largest and array.dtype.kind != "b" else (array if not largest else ~array)
    order = np.argsort(key, axis=ax, kind="stable")
    index = np.take(order, np.arange(count), axis=ax)
    return np.take_along_axis(array, index, ax), index.astype(np.int64)


def _infer_topk(x: AbstractValue, *, k: Any = None, axis: Any = -1, largest: Any = True) -> AbstractValue:
    dtype, shape = rules.shape_of_abstract(x, "topk")
    if k is None:
        raise AnfirTypeError("topk needs k")
    count = int_attr(k, "k", "topk")
    rules.bool_attr(largest, "largest", "topk")
    if shape is None:
        return ATuple((ATensor(dtype, None), ATensor("i64", None)))
    if not shape:
        raise ShapeError("topk needs a tensor of rank >= 1")
    ax = axis_of(axis, len(shape), "topk")
    n = shape[ax]
    if isinstance(n, int) and not 0 <= count <= n:
        raise ShapeError(f"topk: k={count} for an axis of length {n}")
    out = tuple(shape[:ax]) + (count,) + tuple(shape[ax + 1:])
    return ATuple((ATensor(dtype, out), ATensor("i64", out)))


# -- constructors -----------------------------------------------------------------------------
def _dtype_attr(dtype: Any, what: str) -> str:
    if not isinstance(dtype, str):
        raise AnfirTypeError(f"the dtype of {what} is a string such as \"f32\", not {dtype!r}")
    return check_dtype(dtype)


def _bounded(count: int, what: str) -> None:
    if count > MAX_ELEMENTS:
        raise AnfirRuntimeError(f"{what} of {count} elements is more than {MAX_ELEMENTS}")


def _one_hot(indices: Any, depth: Any = None, dtype: Any = "f32") -> Any:
    """1 at each index along a new last axis of length depth, 0 elsewhere (out of range: all 0)."""
    index = _indices(indices, "one_hot")
    if depth is None:
        raise AnfirTypeError("one_hot needs a depth")
    n = int_attr(depth, "depth", "one_hot")
    if n < 0:
        raise ShapeError(f"one_hot: depth {n} is negative")
    _bounded(index.size * n, "one_hot")
    name = numpy_name(_dtype_attr(dtype, "one_hot"))
    return (index[..., None] == np.arange(n)).astype(name)


def _infer_one_hot(indices: AbstractValue, *, depth: Any = None, dtype: Any = "f32") -> AbstractValue:
    _, shape = _int_tensor_abstract(indices, "one_hot")
    if depth is None:
        raise AnfirTypeError("one_hot needs a depth")
    n = int_attr(depth, "depth", "one_hot")
    return ATensor(_dtype_attr(dtype, "one_hot"), None if shape is None else tuple(shape) + (n,))


def _number(v: Any, what: str) -> Any:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise AnfirTypeError(f"{what} needs numbers, not {v!r}")
    return v


def _arange(start: Any, stop: Any, step: Any = 1, dtype: Any = None) -> Any:
    """numpy arange: start, start + step... before stop."""
    a, b, s = _number(start, "arange"), _number(stop, "arange"), _number(step, "arange")
    if s == 0:
        raise AnfirRuntimeError("arange: the step is not 0")
    count = max(int(np.ceil((b - a) / s)), 0)
    _bounded(count, "arange")
    name = None if dtype is None else numpy_name(_dtype_attr(dtype, "arange"))
    return np.arange(a, b, s, dtype=name)


def _infer_arange(start: AbstractValue, stop: AbstractValue, *, step: Any = 1, dtype: Any = None
                  ) -> AbstractValue:
    for a in (start, stop):
        if not isinstance(a, AScalar) or a.dtype == "bool":
            raise AnfirTypeError(f"arange needs numbers, not {a}")
    _number(step, "arange")
    if step == 0:
        raise AnfirTypeError("arange: the step is not 0")
    assert isinstance(start, AScalar) and isinstance(stop, AScalar)
    if dtype is not None:
        out = _dtype_attr(dtype, "arange")
    else:
        kinds = [np.dtype(numpy_name(start.dtype)), np.dtype(numpy_name(stop.dtype)), np.asarray(step).dtype]
        out = require_dtype_name(np.result_type(*kinds))
    values = (start.value, stop.value)
    length: Dim
    if any(v is UNKNOWN or not isinstance(v, (int, float)) for v in values) or step == 0:
        length = fresh_dim()
    else:
        length = len(np.arange(values[0], values[1], step)) if abs(values[1] - values[0]) / abs(step) \
            <= MAX_ELEMENTS else fresh_dim()
    return ATensor(out, (length,))


def shape_attr(shape: Any, what: str) -> tuple[int, ...]:
    """A ``shape`` attribute of ``what`` (full, zeros...) as a tuple of ints >= 0,
    bounded in element count."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (int(shape),)
    if not isinstance(shape, tuple) or not all(isinstance(d, (int, np.integer)) and not isinstance(d, bool)
                                               and d >= 0 for d in shape):
        raise AnfirTypeError(f"the shape of {what} is a tuple of non-negative integers, not {shape!r}")
    count = 1
    for d in shape:
        count *= int(d)
    _bounded(count, what)
    return tuple(int(d) for d in shape)


def _full(shape: Any, value: Any, dtype: Any = None) -> Any:
    """A tensor of shape filled with value (dtype: value's, unless given)."""
    dims = shape_attr(shape, "full")
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value[()]
    if not isinstance(value, (bool, int, float, np.generic)):
        raise AnfirTypeError(f"full needs a number, not {type(value).__name__}")
    name = np.asarray(value).dtype if dtype is None else numpy_name(_dtype_attr(dtype, "full"))
    return np.full(dims, value, dtype=name)


def _infer_full(shape: AbstractValue, value: AbstractValue, *, dtype: Any = None) -> AbstractValue:
    dims = rules.dims_of_shape_arg(shape, "the shape of full")
    if any(isinstance(d, int) and d < 0 for d in dims):
        raise AnfirTypeError(f"the shape of full has a negative dimension: {dims}")
    if not isinstance(value, AScalar):
        raise AnfirTypeError(f"full needs a number, not {value}")
    return ATensor(value.dtype if dtype is None else _dtype_attr(dtype, "full"), dims)


def _eye(n: Any, m: Any = None, k: Any = 0, dtype: Any = "f64") -> Any:
    """The n x m matrix with ones on diagonal k (numpy eye)."""
    rows = int_attr(n, "n", "eye")
    cols = rows if m is None else int_attr(m, "m", "eye")
    if rows < 0 or cols < 0:
        raise ShapeError(f"eye: a negative size ({rows}, {cols})")
    _bounded(rows * cols, "eye")
    return np.eye(rows, cols, int_attr(k, "k", "eye"), dtype=numpy_name(_dtype_attr(dtype, "eye")))


def _infer_eye(n: AbstractValue, *, m: Any = None, k: Any = 0, dtype: Any = "f64") -> AbstractValue:
    rows_value = rules.int_value(n, "the size of eye")
    int_attr(k, "k", "eye")
    rows: Dim = fresh_dim() if rows_value is None else norm_dim(rows_value)
    cols: Dim = rows if m is None else int_attr(m, "m", "eye")
    return ATensor(_dtype_attr(dtype, "eye"), (rows, cols))


# -- declarations ------------------------------------------------------------------------------
gather = declare("gather", 2, _gather, infer=_infer_gather, family=FAMILY,
                 attrs={"axis": 0}, positional_attrs=1,
                 doc="gather(x, indices, axis=0) — numpy take / ONNX Gather (the embedding lookup)",
    bprop="lambda (x, i, axis, out, dout) (gather_grad(dout, x, i, axis), zeros_like(i)) end")
gather_grad = declare("gather_grad", 3, _gather_grad, infer=_like_second("gather_grad"),
                      family=FAMILY, internal=True, attrs={"axis": 0}, positional_attrs=1,
                      doc="gather_grad(dout, x, indices, axis) — zeros of x's shape with dout added "
                          "at the gathered places (the gradient of gather)",
    bprop="""lambda (dout, x, i, axis, out, dd)
        (gather(dd, i, axis), zeros_like(x), zeros_like(i)) end""")
gather_elements = declare("gather_elements", 2, _gather_elements, infer=_infer_gather_elements,
                          family=FAMILY, attrs={"axis": 0}, positional_attrs=1,
                          doc="gather_elements(x, indices, axis=0) — numpy take_along_axis / "
                              "torch.gather",
    bprop="""lambda (x, i, axis, out, dout)
        (scatter_add(zeros_like(x), i, dout, axis), zeros_like(i)) end""")
scatter_add = declare("scatter_add", 3, _scatter_add, infer=_infer_scatter("scatter_add"),
                      family=FAMILY, attrs={"axis": 0}, positional_attrs=1,
                      doc="scatter_add(x, indices, updates, axis=0) — x with updates added at "
                          "the indexed places (ONNX ScatterElements, reduction add)",
    bprop="""lambda (x, i, u, axis, out, dout)
        (dout, zeros_like(i), gather_elements(dout, i, axis)) end""")
gather_nd = declare("gather_nd", 2, _gather_nd, infer=_infer_gather_nd, family=FAMILY,
                    doc="gather_nd(x, indices) — ONNX GatherND: x[indices[..., 0], indices[..., 1], ...]",
    bprop="lambda (x, i, out, dout) (gather_nd_grad(dout, x, i), zeros_like(i)) end")
gather_nd_grad = declare("gather_nd_grad", 3, _gather_nd_grad, infer=_like_second("gather_nd_grad"),
                         family=FAMILY, internal=True,
                         doc="gather_nd_grad(dout, x, indices) — zeros of x's shape with dout added "
                             "at the gathered places (the gradient of gather_nd)",
    bprop="lambda (dout, x, i, out, dd) (gather_nd(dd, i), zeros_like(x), zeros_like(i)) end")
scatter_nd = declare("scatter_nd", 3, _scatter_nd, infer=_infer_scatter("scatter_nd"), family=FAMILY,
                     doc="scatter_nd(x, indices, updates) — ONNX ScatterND: x with the indexed "
                         "places replaced by updates",
    bprop="""lambda (x, i, u, out, dout)
        (scatter_nd(dout, i, zeros_like(u)), zeros_like(i), gather_nd(dout, i)) end""")
topk = declare("topk", 1, _topk, infer=_infer_topk, family=FAMILY,
               attrs={"k": None, "axis": -1, "largest": True}, positional_attrs=3,
               doc="topk(x, k, axis=-1, largest=true) — (values, indices) of the k largest "
                   "(smallest) elements along axis, sorted; ties: the lower index first",
    bprop="""lambda (x, k, axis, largest, out, dout)
        (scatter_add(zeros_like(x), tuple_getitem(out, 1), tuple_getitem(dout, 0), axis),) end""")
one_hot = declare("one_hot", 1, _one_hot, infer=_infer_one_hot, family=FAMILY, differentiable=False,
                  attrs={"depth": None, "dtype": "f32"}, positional_attrs=2,
                  doc='one_hot(indices, depth, dtype="f32") — 1 at each index along a new last axis')
arange = declare("arange", 2, _arange, infer=_infer_arange, family=FAMILY, differentiable=False,
                 attrs={"step": 1, "dtype": None}, positional_attrs=2,
                 doc="arange(start, stop, step=1, dtype=None) — numpy arange")
full = declare("full", 2, _full, infer=_infer_full, family=FAMILY, differentiable=False,
               attrs={"dtype": None}, positional_attrs=1,
               doc="full(shape, value, dtype=None) — a tensor filled with value")
eye = declare("eye", 1, _eye, infer=_infer_eye, family=FAMILY, differentiable=False,
              attrs={"m": None, "k": 0, "dtype": "f64"}, positional_attrs=3,
              doc='eye(n, m=None, k=0, dtype="f64") — ones on diagonal k of an n x m matrix')

__all__ = ["gather", "gather_grad", "gather_elements", "scatter_add", "gather_nd", "gather_nd_grad",
           "scatter_nd", "topk", "one_hot", "arange", "full", "eye"]

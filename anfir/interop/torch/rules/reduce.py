"""The torch.export rules whose result is built from
the reductions of :mod:`anfir.primitives.reduce`: max/min (with their
indices), prod, any/all, var, argmax/argmin, cumsum, norms and distances.

See :mod:`anfir.interop.torch.rules.common` for the rule protocol.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from anfir.interop.torch.rules.common import Rule, RuleTable, array_node, dim_axes, reduction, static_arg_shape
from anfir.ir.primitive import Primitive
from anfir.primitives import arith, indexing, reduce, shaping, structure, tensor


def _extreme_dim(prim: Primitive) -> Rule:
    """``max.dim`` / ``min.dim`` -> ``(values, indices)``: the index of the first
    extreme (``argmax``), the values read there with ``gather_elements`` — so the
    gradient goes to that one element, as PyTorch's does (``amax`` spreads it
    evenly over ties instead)."""
    def rule(b: Any, x: Any, dim: int, keepdim: bool = False) -> Any:
        axis = int(dim)
        index = b.call(prim, x, axis=axis, keepdims=True)
        values = b.call(indexing.gather_elements, x, index, axis=axis)
        if not keepdim:
            values = b.call(shaping.squeeze, values, axis=axis)
            index = b.call(shaping.squeeze, index, axis=axis)
        return b.call(structure.make_tuple, values, index)
    return rule


def _var(b: Any, x: Any, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    return b.call(reduce.var, x, axis=dim_axes(dim), keepdims=bool(keepdim),
                  correction=1 if correction is None else correction)


def _argext(prim: Primitive) -> Rule:
    def rule(b: Any, x: Any, dim: Any = None, keepdim: bool = False) -> Any:
        return b.call(prim, x, axis=None if dim is None else int(dim), keepdims=bool(keepdim))
    return rule


def _cumsum(b: Any, x: Any, dim: int, *, dtype: Any = None) -> Any:
    out = b.call(reduce.cumsum, x, axis=int(dim))
    return b.call(tensor.cast, out, dtype) if dtype is not None else out


# -- reductions, norms, distances -------------------------------------------------------------
def _var_dim(b: Any, x: Any, dim: Any = None, unbiased: bool = True, keepdim: bool = False) -> Any:
    return b.call(reduce.var, x, axis=dim_axes(dim), keepdims=bool(keepdim),
                  correction=1 if unbiased else 0)


def _vector_norm(b: Any, x: Any, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,
                 dtype: Any = None) -> Any:
    """``linalg_vector_norm`` -> ``norm`` (its gradient at a zero vector is 0, as PyTorch's)."""
    order = float(ord)
    if order == 0.0 or math.isinf(order):
        absx = b.call(arith.abs_, x)
        if order == 0.0:
            ne = b.call(tensor.cast, b.call(arith.ne, x, 0.0), b.out_dtype())
            return b.call(tensor.sum_, ne, axis=dim_axes(dim), keepdims=bool(keepdim))
        extreme = reduce.max_ if order > 0 else reduce.min_
        return b.call(extreme, absx, axis=dim_axes(dim), keepdims=bool(keepdim))
    out = b.call(reduce.norm, x, ord=order if order != int(order) else int(order),
                 axis=dim_axes(dim), keepdims=bool(keepdim))
    return b.call(tensor.cast, out, dtype) if dtype is not None else out


def _distances(b: Any, x1: Any, x2: Any, p: float) -> Any:
    """‖x1[..., i, :] - x2[..., j, :]‖_p for every i, j."""
    diff = b.call(arith.sub, b.call(shaping.unsqueeze, x1, axis=-2),
                  b.call(shaping.unsqueeze, x2, axis=-3))
    order = float(p)
    if math.isinf(order):
        return b.call(reduce.max_, b.call(arith.abs_, diff), axis=-1)
    return b.call(reduce.norm, diff, ord=int(order) if order == int(order) else order, axis=-1)


def _cdist(b: Any, x1: Any, x2: Any, p: float, compute_mode: Any = None) -> Any:
    return _distances(b, x1, x2, p)


def _pdist(b: Any, x: Any, p: float = 2.0) -> Any:
    """The distances of the pairs i < j of the rows, in row-major order."""
    n = static_arg_shape(b, "pdist")[0]
    rows, cols = np.triu_indices(n, 1)
    full = _distances(b, x, x, p)
    pairs = array_node(b, np.stack([rows, cols], -1).astype(np.int64)) if len(rows) else None
    if pairs is None:
        return b.call(tensor.zeros, b.tuple_of((0,)), b.out_dtype())
    return b.call(indexing.gather_nd, full, pairs)


def rules(torch: Any, table: RuleTable) -> None:
    """Add this family's rules to ``table``."""
    aten = torch.ops.aten
    put, named = table.put, table.named
    put(aten.max.dim, _extreme_dim(reduce.argmax))
    put(aten.min.dim, _extreme_dim(reduce.argmin))
    put(aten.max.default, reduction(reduce.max_))
    put(aten.min.default, reduction(reduce.min_))
    put(aten.amax.default, reduction(reduce.max_))
    put(aten.amin.default, reduction(reduce.min_))
    put(aten.prod.default, lambda b, x, dtype=None: reduction(reduce.prod)(b, x, None, dtype=dtype))
    put(aten.prod.dim_int, reduction(reduce.prod))
    for name, prim in (("any", reduce.any_), ("all", reduce.all_)):
        op = getattr(aten, name)
        put(op.default, reduction(prim))
        put(op.dim, reduction(prim))
        put(op.dims, reduction(prim))
    put(aten.var.correction, _var)
    put(aten.argmax.default, _argext(reduce.argmax))
    put(aten.argmin.default, _argext(reduce.argmin))
    put(aten.cumsum.default, _cumsum)
    named("var", "dim", _var_dim)
    named("linalg_vector_norm", "default", _vector_norm)
    named("_cdist_forward", "default", _cdist)
    named("_pdist_forward", "default", _pdist)

"""The torch.export rules whose result is built from
:mod:`anfir.primitives.tensor`: matmul, transposes, views and reshapes,
sums and means, casts and copies, filled and empty tensors, ``where``.

See :mod:`anfir.interop.torch.rules.common` for the rule protocol.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anfir.interop.torch.rules.common import (Rule, RuleTable, binary, out_value, reduction, require_static,
                                              static_arg_shape)
from anfir.primitives import arith, shaping, structure, tensor


def _reshape_to_result(b: Any, x: Any, *_: Any, **__: Any) -> Any:
    """view / reshape / squeeze / unsqueeze / flatten: the result shape is the FakeTensor's."""
    return b.call(tensor.reshape, x, b.out_shape())


def _expand(b: Any, x: Any, *_: Any, **__: Any) -> Any:
    """``expand`` / ``expand_as``: ``broadcast_to`` the result's shape — or ``x`` itself
    when that is already its static shape (torch's decomposition of a batched
    ``matmul`` expands each operand to its own shape; ONNX's ``MatMul`` has no such step)."""
    before = tuple(b.fx_node.args[0].meta["val"].shape)
    after = tuple(b.fx_node.meta["val"].shape)
    if before == after and all(isinstance(d, int) for d in after):
        return x
    return b.call(tensor.broadcast_to, x, b.out_shape())


def _to_copy(b: Any, x: Any, *, dtype: Any = None, **__: Any) -> Any:
    return b.call(tensor.cast, x, dtype) if dtype is not None else b.call(structure.identity, x)


def _permute(b: Any, x: Any, dims: Any) -> Any:
    return b.call(tensor.transpose, x, b.tuple_of(int(d) for d in dims))


def _transpose_int(b: Any, x: Any, d0: int, d1: int) -> Any:
    rank = b.rank(b.fx_node.args[0])
    perm = list(range(rank))
    perm[d0 % rank], perm[d1 % rank] = perm[d1 % rank], perm[d0 % rank]
    return b.call(tensor.transpose, x, b.tuple_of(perm))


def _t(b: Any, x: Any) -> Any:
    return b.call(tensor.transpose, x) if b.rank(b.fx_node.args[0]) == 2 else b.call(structure.identity, x)


def _addmm(b: Any, bias: Any, m1: Any, m2: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    mul = arith.mul
    prod = b.call(tensor.matmul, m1, m2)
    if alpha != 1:
        prod = b.call(mul, prod, alpha)
    if beta == 0:
        return prod
    return b.call(arith.add, bias if beta == 1 else b.call(mul, bias, beta), prod)


def _full(b: Any, size: Any, fill: Any, **_: Any) -> Any:
    dt = b.out_dtype()
    return b.call(arith.add, b.call(tensor.zeros, b.out_shape(), dt), b.call(tensor.cast, fill, dt))


def _full_like(b: Any, x: Any, fill: Any, **_: Any) -> Any:
    dt = b.out_dtype()
    zeros = b.call(tensor.cast, b.call(structure.zeros_like, x), dt)
    return b.call(arith.add, zeros, b.call(tensor.cast, fill, dt))


def _like(fill: float) -> Rule:
    return lambda b, x, **kw: _full_like(b, x, fill, **kw)


def _scalar_tensor(b: Any, value: Any, **_: Any) -> Any:
    return b.call(tensor.cast, value, b.out_dtype())


def _linear(b: Any, x: Any, w: Any, bias: Any = None) -> Any:
    """``linear`` (kept whole): ``x @ w^T + bias``."""
    out = b.call(tensor.matmul, x, b.call(tensor.transpose, w))
    return out if bias is None else b.call(arith.add, out, bias)


def _copy(b: Any, x: Any, src: Any, non_blocking: bool = False) -> Any:
    """``copy(self, src)``: src broadcast to self's shape, in self's dtype (self's
    values are overwritten: no gradient reaches it)."""
    out = b.call(tensor.broadcast_to, b.call(tensor.cast, src, b.out_dtype()), b.out_shape())
    return out


def _fill(b: Any, x: Any, value: Any) -> Any:
    dt = b.out_dtype()
    zeros = b.call(tensor.cast, b.call(structure.zeros_like, x), dt)
    return b.call(arith.add, zeros, b.call(tensor.cast, value, dt))


def _empty(b: Any, *_: Any, **__: Any) -> Any:
    """``empty``/``empty_strided``: uninitialised memory in PyTorch; zeros here (a value
    a program may not read before writing anyway)."""
    return b.call(tensor.zeros, b.out_shape(), b.out_dtype())


def _local_scalar(b: Any, x: Any) -> Any:
    """``.item()``: the single element, as a 0-d value."""
    return b.call(tensor.reshape, x, b.tuple_of(()))


def _resize(b: Any, x: Any, size: Any, memory_format: Any = None) -> Any:
    """``resize_`` (functionalized): the elements in order, cut or extended with
    zeros (PyTorch leaves new memory uninitialised) to the new shape."""
    require_static(b, "resize_", *size)
    old = int(np.prod(static_arg_shape(b, "resize_")))
    new = int(np.prod([int(d) for d in size]))
    flat = b.call(tensor.reshape, x, b.tuple_of((-1,)))
    if new < old:
        flat = b.call(shaping.slice_, flat, starts=0, ends=new, axes=0)
    elif new > old:
        flat = b.call(shaping.pad, flat, pads=(0, new - old))
    return b.call(tensor.reshape, flat, b.tuple_of(tuple(int(d) for d in size)))


def _to_op(b: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
    """``to`` (dtype, device, layout): a ``cast`` to the result's dtype."""
    val = out_value(b)
    before = b.fx_node.args[0].meta["val"]
    if val.dtype == before.dtype:
        return b.call(structure.identity, x)
    return b.call(tensor.cast, x, b.out_dtype())


def _new_filled(fill: Any) -> Rule:
    def rule(b: Any, x: Any, size: Any, *args: Any, **kwargs: Any) -> Any:
        value = args[0] if fill is None else fill
        zeros = b.call(tensor.zeros, b.out_shape(), b.out_dtype())
        return b.call(arith.add, zeros, b.call(tensor.cast, value, b.out_dtype()))
    return rule


def _filled(fill: Any) -> Rule:
    def rule(b: Any, size: Any, *args: Any, **kwargs: Any) -> Any:
        zeros = b.call(tensor.zeros, b.out_shape(), b.out_dtype())
        return zeros if fill == 0 else b.call(arith.add, zeros, b.call(tensor.cast, fill, b.out_dtype()))
    return rule


def _masked_fill(b: Any, x: Any, mask: Any, value: Any) -> Any:
    return b.call(tensor.where, mask, b.call(tensor.cast, value, b.out_dtype()), x)


def _where_scalars(b: Any, cond: Any, x: Any, y: Any) -> Any:
    dt = b.out_dtype()
    return b.call(tensor.where, cond, b.call(tensor.cast, x, dt), b.call(tensor.cast, y, dt))


def rules(torch: Any, table: RuleTable) -> None:
    """Add this family's rules to ``table``."""
    aten = torch.ops.aten
    put, named = table.put, table.named
    for op, prim in ((aten.mm.default, tensor.matmul), (aten.bmm.default, tensor.matmul),
                     (aten.matmul.default, tensor.matmul)):
        put(op, binary(prim))
    put(aten.where.self, lambda b, c, x, y: b.call(tensor.where, c, x, y))
    put(aten.linear.default, _linear)
    put(aten._to_copy.default, _to_copy)
    put(aten.permute.default, _permute)
    put(aten.transpose.int, _transpose_int)
    put(aten.t.default, _t)
    for op in (aten.view.default, aten._unsafe_view.default, aten.reshape.default,
               aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default,
               aten.flatten.using_ints):
        put(op, _reshape_to_result)
    put(aten.expand.default, _expand)
    put(aten.addmm.default, _addmm)
    put(aten.sum.dim_IntList, reduction(tensor.sum_))
    put(aten.sum.default, lambda b, x, dtype=None: reduction(tensor.sum_)(b, x, None, dtype=dtype))
    put(aten.mean.dim, reduction(tensor.mean))
    put(aten.mean.default, lambda b, x, dtype=None: reduction(tensor.mean)(b, x, None, dtype=dtype))
    put(aten.full.default, _full)
    put(aten.full_like.default, _full_like)
    put(aten.zeros_like.default, _like(0.0))
    put(aten.ones_like.default, _like(1.0))
    put(aten.scalar_tensor.default, _scalar_tensor)
    for overload in ("dtype", "dtype_layout", "device", "other"):
        named("to", overload, _to_op)
    named("type_as", "default", _to_op)
    named("new_ones", "default", _new_filled(1))
    named("new_zeros", "default", _new_filled(0))
    named("new_full", "default", _new_filled(None))
    named("new_empty", "default", _new_filled(0))
    named("zeros", "default", _filled(0))
    named("ones", "default", _filled(1))
    named("masked_fill", "Scalar", _masked_fill)
    named("masked_fill", "Tensor", _masked_fill)
    for name, overload in (("view_as", "default"), ("reshape_as", "default"), ("unflatten", "int")):
        named(name, overload, _reshape_to_result)
    named("expand_as", "default", _expand)
    for overload in ("ScalarOther", "ScalarSelf", "Scalar"):
        named("where", overload, _where_scalars)
    named("fill", "Tensor", _fill)
    named("copy", "default", _copy)
    named("fill", "Scalar", _fill)
    named("empty", "memory_format", _empty)
    named("empty_strided", "default", _empty)
    named("empty_permuted", "default", _empty)
    named("_local_scalar_dense", "default", _local_scalar)
    named("resize_", "default", _resize)

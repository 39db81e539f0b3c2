"""How each primitive becomes a low-level instruction, and how the executor runs it.

:data:`RULES` is keyed by the primitive object (as the ONNX exporter's and the
JAX back end's tables are): a new primitive adds one entry here, or a reason
in :data:`UNLOWERED` (``tests/test_lowlevel.py`` lists the primitives with
neither).  A :class:`LowRule` says

* which arguments are not data: ``static`` (a shape, a dtype, an axis given
  positionally — printed in ``[...]``) and ``shape_only`` (read only for their
  shape and dtype, such as the ``x`` of ``matmul_dx(dout, y, x)``: the
  instruction keeps its type, so the buffer's life does not grow);
* whether the output may take the place of a data argument of the same type
  (``inplace``: elementwise operations, where element ``i`` of the result
  depends only on element ``i`` of the arguments);
* the ``kernel``: a factory that binds the instruction to its buffers' views
  once, returning a function of no arguments that writes the output with
  numpy's ``out=`` and allocates nothing.  A kernel factory returns None when
  its fast path does not apply (an integer dtype, a batched matmul); the
  instruction then runs the primitive's own evaluation and copies the result
  into the output buffer (one temporary; correct for every primitive).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from anfir.flat.statements import DIM, one_device_reasons
from anfir.ir.primitive import Primitive
from anfir.lowlevel import kernels
from anfir.lowlevel.kernels import ScratchFactory
from anfir.lowlevel.program import COPY
from anfir.primitives import (arith, complexes, conv, elementwise, gradient, indexing, nn, reduce, shaping,
                              structure, tensor)
from anfir.primitives import loops
from anfir.primitives import checkpointing


class TensorType(NamedTuple):
    """The type of an argument read only for its shape and dtype (a static of the instruction)."""

    dtype: str
    shape: tuple[int, ...]


Kernel = Callable[[], Any]
KernelFactory = Callable[[np.ndarray, list[Any], dict[str, Any]], Optional[Kernel]]
"""``factory(out, args, statics)``: ``args`` are the data arguments (numpy views
of buffers, or Python scalars for scalar constants) in order; ``statics`` the
attributes and static arguments by name."""


@dataclass(frozen=True)
class LowRule:
    """How one primitive is lowered and run."""

    kernel: Optional[KernelFactory] = None
    """The fast path (None: the primitive's evaluation, copied into the output)."""
    inplace: bool = False
    """Whether the output may overwrite a data argument of its type whose value dies here."""
    static: tuple[int, ...] = ()
    """Positions of arguments that are static (printed ``argN=...``), whatever they hold."""
    shape_only: tuple[int, ...] = ()
    """Positions of arguments read only for their shape and dtype."""
    scratch: Optional[ScratchFactory] = None
    """A fast path that needs scratch memory (the executor's workspace); tried before ``kernel``."""


def _floats(out: np.ndarray, args: list[Any]) -> bool:
    """Whether the output and every array argument are floating point (where the
    numpy ufuncs compute what anfir's evaluation does)."""
    if out.dtype.kind != "f":
        return False
    for a in args:
        if isinstance(a, np.ndarray) and a.dtype.kind != "f":
            return False
    return True


def _scatter_rows(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    """``scatter_nd`` writing only the indexed places: over its first argument when that is
    the output itself (``@inout``: a loop filling row ``i`` of a stacked output, so
    nothing of the size of the whole buffer is copied or allocated per iteration), else
    after copying it into the output.  The indices are checked on every call as the
    evaluation checks them (``indexing.nd_index``: its bounds and negative indices)."""
    if statics or len(args) != 3 or not all(isinstance(a, np.ndarray) for a in args):
        return None
    data, index, updates = args
    if data.shape != out.shape or data.dtype != out.dtype or index.ndim == 0 \
            or index.dtype.kind not in "iu" or index.shape[-1] > out.ndim \
            or updates.shape != index.shape[:-1] + out.shape[index.shape[-1]:]:
        return None  # the evaluation says what is wrong
    same = data is out

    def kernel() -> None:
        if not same:
            np.copyto(out, data)
        out[indexing.nd_index(out, index, "scatter_nd")] = updates

    return kernel


def _select(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    """``switch(c, a, b)`` between two computed values, its condition read from a
    ``bool<>`` buffer of the arena (a 0-d view, which the evaluation's ``switch``, made
    for Python bools, refuses) on every call."""
    if statics or len(args) != 3:
        return None
    cond, a, b = args
    if isinstance(cond, (bool, np.bool_)):
        chosen = a if cond else b
        return partial(np.copyto, out, chosen, casting="unsafe")
    if not (isinstance(cond, np.ndarray) and cond.shape == () and cond.dtype == np.bool_):
        return None

    def kernel() -> None:
        np.copyto(out, a if cond[()] else b, casting="unsafe")

    return kernel


def ufunc(fn: Any) -> LowRule:
    """An elementwise numpy ufunc written with ``out=`` (float types), in place allowed."""

    def factory(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
        if statics or not _floats(out, args):
            return None
        return partial(fn, *args, out=out)

    return LowRule(factory, inplace=True)


def _relu(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    if not _floats(out, args):
        return None
    return partial(np.maximum, args[0], 0.0, out=out)


def _matmul(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    a, b = args
    if not (_floats(out, args) and isinstance(a, np.ndarray) and isinstance(b, np.ndarray)
            and a.ndim == 2 and b.ndim == 2):
        return None
    return partial(np.matmul, a, b, out=out)


def _matrices(out: np.ndarray, args: list[Any], other: Any) -> bool:
    return (_floats(out, args) and all(isinstance(a, np.ndarray) and a.ndim == 2 for a in args)
            and len(other.shape) == 2)


def _matmul_dx(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    dout, y = args  # d(x @ y)/dx = dout @ y.T (the transposed view is made once, here)
    if not _matrices(out, args, statics["arg2"]):
        return None
    return partial(np.matmul, dout, y.T, out=out)


def _matmul_dy(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    x, dout = args  # d(x @ y)/dy = x.T @ dout
    if not _matrices(out, args, statics["arg2"]):
        return None
    return partial(np.matmul, x.T, dout, out=out)


def reduction(fn: Any) -> LowRule:
    """A reduction with ``axis``/``keepdims`` attributes, written with ``out=`` (float types)."""

    def factory(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
        if (len(args) != 1 or set(statics) - {"axis", "keepdims"} or not _floats(out, args)
                or np.ndim(args[0]) == 0):
            return None
        return partial(fn, args[0], axis=statics.get("axis"), keepdims=bool(statics.get("keepdims")),
                       out=out)

    return LowRule(factory)


def _copy(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    return partial(np.copyto, out, args[0])


def _broadcast(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    # broadcast_like / broadcast_to: numpy's copyto broadcasts the source.
    if not _floats(out, args):
        return None
    return partial(np.copyto, out, args[0])


def _reshaped(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    source = args[0]
    if not isinstance(source, np.ndarray) or source.dtype != out.dtype or source.size != out.size:
        return None
    return partial(np.copyto, out, source.reshape(out.shape))  # a view of the buffer, made once


def _fill(value: float) -> KernelFactory:
    def factory(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
        return partial(out.fill, value)

    return factory


def _where(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    cond, a, b = args
    if not (isinstance(cond, np.ndarray) and cond.dtype == np.bool_ and _floats(out, [a, b])):
        return None
    if any(isinstance(x, np.ndarray) and np.shares_memory(x, out) for x in (a, b)):
        return None

    def run() -> None:
        np.copyto(out, b)
        np.copyto(out, a, where=cond)

    return run


def compare(fn: Any) -> LowRule:
    """A comparison ufunc writing a bool buffer with ``out=`` (numeric arguments)."""

    def factory(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
        numeric = all(a.dtype.kind in "fiu" if isinstance(a, np.ndarray) else
                      isinstance(a, (int, float)) and not isinstance(a, bool) for a in args)
        if statics or out.dtype != np.bool_ or not numeric:
            return None
        return partial(fn, *args, out=out)

    return LowRule(factory)


def _cast_like(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    # cast_like(g, x): g in x's dtype (numpy's astype, which copyto with casting="unsafe" is).
    g = args[0]
    if not isinstance(g, np.ndarray) or g.shape != out.shape:
        return None
    if out.dtype.kind in "iub":  # an integer's sensitivity is a zero of its type
        return partial(np.copyto, out, np.zeros((), out.dtype))
    return partial(np.copyto, out, g, casting="unsafe")


def _sum_to(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    # sum_to(g, x): g summed over the axes broadcasting added to reach x's shape.
    g = args[0]
    if not isinstance(g, np.ndarray) or not _floats(out, [g]) or g.ndim < out.ndim:
        return None
    extra = g.ndim - out.ndim
    axes = tuple(range(extra)) + tuple(extra + i for i, d in enumerate(out.shape)
                                       if d == 1 and g.shape[extra + i] != 1)
    if g.shape == out.shape:
        return partial(np.copyto, out, g)
    kept = tuple(d for i, d in enumerate(g.shape) if i not in axes)
    if math.prod(kept) != out.size:
        return None
    return partial(np.sum, g, axis=axes, out=out.reshape(kept))  # a view of the buffer, made once


def _unreduce(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    # unreduce(g, x, axis, keepdims): g broadcast back over the reduced axes of x.
    g = args[0]
    if not _floats(out, [g]):
        return None
    axis, keepdims = statics.get("arg2"), bool(statics.get("arg3", False))
    if not isinstance(g, np.ndarray):
        return partial(out.fill, g) if isinstance(g, float) else None
    if keepdims or axis is None or g.ndim == 0:
        source = g
    else:
        axes = axis if isinstance(axis, tuple) else (axis,)
        if not all(isinstance(a, int) for a in axes):
            return None
        shape = list(out.shape)
        for a in axes:
            shape[a % out.ndim] = 1
        if int(np.prod(shape, dtype=np.int64)) != g.size:
            return None
        source = g.reshape(shape)  # a view, made once
    try:
        np.broadcast_shapes(source.shape, out.shape)
    except ValueError:
        return None
    return partial(np.copyto, out, source)


EVALUATED = LowRule()
"""The primitive's own evaluation, its result copied into the output buffer."""

RULES: dict[Primitive, LowRule] = {
    # arithmetic: numpy ufuncs with out=, in place
    arith.add: ufunc(np.add), arith.sub: ufunc(np.subtract), arith.mul: ufunc(np.multiply),
    arith.div: ufunc(np.true_divide), arith.neg: ufunc(np.negative), arith.pow_: ufunc(np.power),
    arith.exp: ufunc(np.exp), arith.log: ufunc(np.log), arith.sqrt: ufunc(np.sqrt),
    arith.sin: ufunc(np.sin), arith.cos: ufunc(np.cos), arith.tanh: ufunc(np.tanh),
    arith.abs_: ufunc(np.abs), arith.maximum: ufunc(np.maximum), arith.minimum: ufunc(np.minimum),
    arith.relu: LowRule(_relu, inplace=True), arith.sigmoid: EVALUATED, arith.sign: EVALUATED,
    arith.softplus: EVALUATED, arith.eq: compare(np.equal), arith.ne: compare(np.not_equal),
    arith.lt: compare(np.less), arith.le: compare(np.less_equal), arith.gt: compare(np.greater),
    arith.ge: compare(np.greater_equal), arith.logical_and: EVALUATED,
    arith.logical_or: EVALUATED, arith.logical_not: EVALUATED,
    # the elementwise family
    elementwise.square: ufunc(np.square), elementwise.reciprocal: ufunc(np.reciprocal),
    elementwise.expm1: ufunc(np.expm1), elementwise.log1p: ufunc(np.log1p),
    elementwise.sinh: ufunc(np.sinh), elementwise.cosh: ufunc(np.cosh), elementwise.tan: ufunc(np.tan),
    elementwise.asin: ufunc(np.arcsin), elementwise.acos: ufunc(np.arccos),
    elementwise.atan: ufunc(np.arctan), elementwise.atan2: ufunc(np.arctan2),
    elementwise.floor: ufunc(np.floor), elementwise.ceil: ufunc(np.ceil),
    elementwise.round_: EVALUATED, elementwise.rsqrt: EVALUATED, elementwise.erf: LowRule(kernels.erf_kernel, inplace=True),
    elementwise.gelu: EVALUATED, elementwise.leaky_relu: EVALUATED, elementwise.elu: EVALUATED,
    elementwise.selu: EVALUATED, elementwise.silu: EVALUATED, elementwise.mish: EVALUATED,
    elementwise.softsign: EVALUATED, elementwise.hard_sigmoid: EVALUATED,
    elementwise.hard_swish: EVALUATED, elementwise.clip: EVALUATED, elementwise.floor_div: EVALUATED,
    elementwise.mod: EVALUATED, elementwise.fmod: EVALUATED, elementwise.logical_xor: EVALUATED,
    elementwise.bitwise_and: EVALUATED, elementwise.bitwise_or: EVALUATED,
    elementwise.bitwise_xor: EVALUATED, elementwise.bitwise_not: EVALUATED,
    elementwise.bit_shift: EVALUATED, elementwise.isinf: EVALUATED, elementwise.isnan: EVALUATED,
    # tensors
    tensor.matmul: LowRule(_matmul), tensor.sum_: reduction(np.sum), tensor.mean: reduction(np.mean),
    tensor.where: LowRule(_where), tensor.reshape: LowRule(_reshaped, static=(1,)),
    tensor.transpose: LowRule(static=(1,)), tensor.broadcast_to: LowRule(_broadcast, static=(1,)),
    tensor.cast: LowRule(static=(1,)), tensor.zeros: LowRule(_fill(0), static=(0, 1)),
    tensor.ones: LowRule(_fill(1), static=(0, 1)),
    tensor.ones_like: LowRule(_fill(1), shape_only=(0,)), tensor.array: EVALUATED,
    structure.zeros_like: LowRule(_fill(0), shape_only=(0,)),
    structure.switch: LowRule(_select),  # the flat program's select between two computed values
    # reductions
    reduce.max_: reduction(np.max), reduce.min_: reduction(np.min), reduce.prod: reduction(np.prod),
    reduce.var: EVALUATED, reduce.std: EVALUATED, reduce.logsumexp: EVALUATED, reduce.all_: EVALUATED,
    reduce.any_: EVALUATED, reduce.norm: EVALUATED, reduce.argmax: EVALUATED, reduce.argmin: EVALUATED,
    reduce.cumsum: EVALUATED, reduce.cumprod: EVALUATED,
    complexes.complex_: EVALUATED, complexes.real: EVALUATED, complexes.imag: EVALUATED,
    complexes.conj: EVALUATED,
    # neural-network operators: their own (fused numpy) evaluation, into the arena
    nn.softmax: EVALUATED, nn.log_softmax: EVALUATED, nn.layer_norm: EVALUATED,
    nn.rms_norm: EVALUATED, nn.group_norm: EVALUATED, nn.instance_norm: EVALUATED,
    nn.einsum: EVALUATED, nn.attention: EVALUATED, nn.nll_loss: EVALUATED,
    nn.cross_entropy: EVALUATED, nn.mse_loss: EVALUATED, nn.dropout: EVALUATED,
    nn.tail_mean: EVALUATED, nn.swap_last: EVALUATED, nn.attention_probs: EVALUATED,
    nn.attention_scale: EVALUATED, nn.mask_cotangent: EVALUATED, nn.loss_reduce: EVALUATED,
    nn.loss_spread: EVALUATED, nn.class_mask: EVALUATED, nn.channel_view: EVALUATED,
    nn.group_view: EVALUATED, nn.einsum_ones: EVALUATED,
    # shapes and indexing
    shaping.concat: EVALUATED, shaping.stack: EVALUATED, shaping.slice_: EVALUATED,
    shaping.slice_grad: EVALUATED, shaping.pad: EVALUATED, shaping.pad_grad: EVALUATED,
    shaping.squeeze: EVALUATED, shaping.unsqueeze: EVALUATED, shaping.flatten: EVALUATED,
    shaping.expand: EVALUATED, shaping.tile: EVALUATED, shaping.tile_grad: EVALUATED,
    shaping.flip: EVALUATED, shaping.roll: EVALUATED, shaping.roll_back: EVALUATED,
    shaping.tril: EVALUATED, shaping.triu: EVALUATED, shaping.rank: EVALUATED,
    indexing.gather: EVALUATED, indexing.gather_grad: EVALUATED,
    indexing.gather_elements: EVALUATED, indexing.scatter_add: EVALUATED,
    indexing.gather_nd: EVALUATED, indexing.gather_nd_grad: EVALUATED,
    indexing.scatter_nd: LowRule(_scatter_rows), indexing.one_hot: EVALUATED, indexing.arange: EVALUATED,
    indexing.full: EVALUATED, indexing.eye: EVALUATED,
    # convolution, pooling, batch norm: out= kernels on the executor's scratch workspace
    # (anfir/lowlevel/kernels.py); the gradients' type-only arguments are statics
    conv.conv: LowRule(scratch=kernels.conv_kernel),
    conv.conv_core: LowRule(scratch=kernels.conv_kernel),
    conv.conv_transpose: EVALUATED,
    conv.conv_input_grad: LowRule(scratch=kernels.conv_input_grad_kernel, shape_only=(2,)),
    conv.conv_weight_grad: LowRule(scratch=kernels.conv_weight_grad_kernel, shape_only=(2,)),
    conv.max_pool: LowRule(scratch=kernels.max_pool_kernel),
    conv.max_pool_grad: LowRule(scratch=kernels.max_pool_grad_kernel),
    conv.max_pool_select: EVALUATED,
    conv.avg_pool: LowRule(scratch=kernels.avg_pool_kernel),
    conv.avg_pool_grad: LowRule(scratch=kernels.avg_pool_grad_kernel, shape_only=(1,)),
    conv.global_avg_pool: LowRule(kernels.global_pool_kernel(np.mean)),
    conv.global_max_pool: LowRule(kernels.global_pool_kernel(np.max)),
    conv.batch_norm: LowRule(scratch=kernels.batch_norm_kernel),
    conv.channel_sum: LowRule(kernels.channel_sum_kernel),
    conv.channel_spread: LowRule(kernels.channel_spread_kernel, shape_only=(1,)),
    # what the gradients use
    gradient.matmul_dx: LowRule(_matmul_dx, shape_only=(2,)),
    gradient.matmul_dy: LowRule(_matmul_dy, shape_only=(2,)),
    gradient.sum_to: LowRule(_sum_to, shape_only=(1,)),
    gradient.broadcast_like: LowRule(_broadcast, shape_only=(1,)),
    gradient.cast_like: LowRule(_cast_like, shape_only=(1,)),
    gradient.unreduce: LowRule(_unreduce, shape_only=(1,), static=(2, 3)),
    gradient.reshape_like: LowRule(_reshaped, shape_only=(1,)),
    gradient.prod_others: LowRule(static=(1,)),
    gradient.clip_grad: EVALUATED, gradient.gadd: ufunc(np.add), gradient.size: EVALUATED,
    gradient.tangent_dot: EVALUATED,
    COPY: LowRule(_copy),
}
"""The low-level rule of each primitive, keyed by the primitive object."""

_WALKED = "taken apart by the flattening walk (anfir/flat/flatten.py) before lowering"

UNLOWERED: dict[Primitive, str] = {
    **one_device_reasons("the low-level buffer program"),
    DIM: "a dimension known only at run time: the low level needs concrete shapes",
    structure.make_tuple: _WALKED, structure.tuple_getitem: _WALKED, structure.len_: _WALKED,
    structure.partial: _WALKED, structure.identity: _WALKED, structure.stop_gradient: _WALKED,
    tensor.shape: _WALKED, gradient.J: _WALKED, gradient.newenv: _WALKED,
    gradient.env_setitem: _WALKED, gradient.env_getitem: _WALKED, gradient.tuple_setitem: _WALKED,
    gradient.invert_permutation: _WALKED, gradient.grad_arg_check: _WALKED,
    gradient.grad_seed: _WALKED, gradient.tangent_scale: _WALKED,
    checkpointing.remat_barrier: _WALKED,
    **{prim: "its result is a tuple of tensors: an instruction writes one buffer"
       for prim in (shaping.split, shaping.concat_grad, shaping.stack_grad, indexing.topk)},
    nn.einsum_grad_spec: "it computes a string (an einsum equation) from constants, which "
                         "constant folding does before lowering; buffers hold no strings",
}
"""Primitives that never become an instruction, with the reason."""

UNLOWERED.update({  # structured loops and custom derivatives (primitives/loops.py)
    loops.scan: _WALKED + " (into a Loop, which lowers to a loop of the buffer program)",
    loops.fori_loop: _WALKED + " (into a Loop, which lowers to a loop of the buffer program)",
    loops.custom_vjp: _WALKED, loops.custom_jvp: _WALKED,
})

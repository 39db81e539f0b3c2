"""Every primitive of the op library as JAX: one table keyed by the primitive object.

:data:`RULES` maps each :class:`~anfir.ir.primitive.Primitive` to a function of
the same arguments computing it with ``jax.numpy``/``lax`` — adding an
operator to the back end is one line there.  :data:`UNMAPPED` lists the
primitives that have no rule, each with the reason (empty today).

A rule is called only when an argument holds a JAX array: on arguments known at
trace time (constants of the program) the machine calls the primitive's own
``impl``, so what can be computed while tracing is computed exactly as
``anfir.run`` computes it — loop counters, shapes, tuple indices stay Python
values, and control flow on them is decided before XLA sees the program.

The rules keep anfir's semantics where JAX's differ: true division of
integers, ``pow`` of integers by a negative constant, the gradient helpers'
handling of rank-1 matmuls, anfir's error messages for gradients of integers.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from anfir.abstract import rules as attr_checks
from anfir.autodiff.runtime import j_value
from anfir.dtypes import numpy_name
from anfir.errors import AnfirTypeError, GradientError
from anfir.ir.primitive import Primitive
from anfir.nested import fold_nested
from anfir.primitives import arith, batching, complexes, elementwise, gradient, nn, nn_kernels as nnk, reduce, structure, tensor
from anfir.primitives import array_kernels as ak
from anfir.primitives import checkpointing
from anfir.backends.tojax.conv_rules import CONV_RULES
from anfir.backends.tojax.traced import (Either, gadd, is_array, is_numeric, is_traced, map_leaves,
                                         map_tuples, select, zeros_like)
from anfir.backends.tojax.shaping_rules import SHAPING_RULES
from anfir.backends.tojax.loop_rules import FUNCTION_ARGUMENTS, LOOP_RULES  # noqa: F401
from anfir.backends.tojax.batching_rules import BATCHING_RULES, loop_rule
from anfir.backends.tojax.collective_rules import COLLECTIVE_RULES
from anfir.runtime_values import DType, GradEnv

Rule = Callable[..., Any]


# -- helpers ------------------------------------------------------------------------------------
def jax_dtype(dtype: Any) -> Any:
    """The JAX dtype of an anfir dtype argument (``"f32"`` or a DType), canonical:
    ``f64`` is ``float32`` unless ``jax_enable_x64`` is on."""
    name = dtype.name if isinstance(dtype, DType) else dtype
    return jax.dtypes.canonicalize_dtype(np.dtype(numpy_name(tensor.dtype_attr(name))))


def concrete_bool(c: Any) -> Optional[bool]:
    """The value of a condition known at trace time, None when it is traced;
    an AnfirTypeError when it is not a bool."""
    if isinstance(c, (bool, np.bool_)):
        return bool(c)
    if is_array(c) and c.shape == () and c.dtype == jnp.bool_:
        return None if is_traced(c) else bool(c)
    raise AnfirTypeError(f"a condition must be a bool, not {_what(c)}")


def _what(x: Any) -> str:
    if is_array(x):
        return f"a {x.dtype} tensor of shape {tuple(x.shape)}"
    return f"{type(x).__name__} {x!r}"


def _shape_of(x: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in np.shape(x))


# -- arithmetic ---------------------------------------------------------------------------------
def _pow(x: Any, y: Any) -> Any:
    if isinstance(y, int) and not isinstance(y, bool) and y < 0 and \
            jnp.issubdtype(jnp.result_type(x), jnp.integer):
        x = jnp.asarray(x, jax.dtypes.canonicalize_dtype(np.float64))  # anfir: int ** -n is a float
    return jnp.power(x, y)


# -- tensors ------------------------------------------------------------------------------------
def _matmul(x: Any, y: Any) -> Any:
    if np.ndim(x) == 0 or np.ndim(y) == 0:
        raise AnfirTypeError("matmul needs tensors of rank >= 1, not scalars")
    return jnp.matmul(x, y)


def _transpose(x: Any, perm: Any = None) -> Any:
    return jnp.transpose(x, None if perm is None else tuple(int(p) for p in perm))


def _reshape(x: Any, shape: Any) -> Any:
    return jnp.reshape(x, tensor.shape_attr(shape))


def _reduction(jnp_fn: Callable[..., Any], name: str) -> Rule:
    """A reduction with numpy's ``axis`` and ``keepdims`` (checked as ``impl`` checks them)."""
    def rule(x: Any, axis: Any = None, keepdims: Any = False) -> Any:
        return jnp_fn(x, axis=attr_checks.axis_attr(axis, name),
                      keepdims=attr_checks.bool_attr(keepdims, "keepdims", name))

    rule.__name__ = f"_{name}"
    return rule


_sum = _reduction(jnp.sum, "sum")
_mean = _reduction(jnp.mean, "mean")


def _broadcast_to(x: Any, shape: Any) -> Any:
    return jnp.broadcast_to(x, tensor.shape_attr(shape))


def _zeros(shape: Any, dtype: Any = "f64") -> Any:
    return jnp.zeros(tensor.shape_attr(shape), jax_dtype(dtype))


def _ones(shape: Any, dtype: Any = "f64") -> Any:
    return jnp.ones(tensor.shape_attr(shape), jax_dtype(dtype))


def _array(nested: Any) -> Any:
    return jnp.array(fold_nested(nested, lambda v: v if isinstance(v, tuple) else None,
                                 _as_list, _same))


def _as_list(_t: Any, items: list[Any]) -> Any:
    return items


def _same(value: Any) -> Any:
    return value


def _cast(x: Any, dtype: Any) -> Any:
    return lax.convert_element_type(jnp.asarray(x), jax_dtype(dtype))


def _complex(re: Any, im: Any) -> Any:
    # lax.complex wants two arrays of one float dtype; integer parts are f64
    # (as complexes._complex computes them), mixed widths the wider.
    re, im = _float(re), _float(im)
    dtype = jnp.result_type(re, im)
    return lax.complex(re.astype(dtype), im.astype(dtype))


# -- structure ----------------------------------------------------------------------------------
def _switch(c: Any, a: Any, b: Any) -> Any:
    known = concrete_bool(c)
    if known is None:
        return select(c, a, b)
    return a if known else b


def _stop_gradient(x: Any) -> Any:
    return map_leaves(x, lambda v: lax.stop_gradient(v) if is_array(v) else v)


def _j(x: Any) -> Any:
    def leaf(v: Any) -> Any:
        if isinstance(v, Either):
            return Either(v.cond, _j(v.a), _j(v.b))
        return j_value(v)

    return map_tuples(x, leaf)


# -- elementwise math and activations (anfir/primitives/elementwise.py) ---------------------------
def _float(x: Any) -> Any:
    """``x`` in its float dtype: integers and bools become the default float
    (``f64`` with ``jax_enable_x64``), as ``elementwise._float_dtype`` makes them ``f64``."""
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.inexact):  # floats and complex numbers stay
        return x
    return x.astype(jax.dtypes.canonicalize_dtype(np.float64))


def _on_float(jnp_fn: Callable[[Any], Any]) -> Rule:
    def rule(x: Any) -> Any:
        return jnp_fn(_float(x))

    rule.__name__ = f"_{getattr(jnp_fn, '__name__', 'fn')}"
    return rule


def _gelu(x: Any, approximate: str = "none") -> Any:
    attr_checks.choice_attr(approximate, "approximate", "gelu", ("none", "tanh"))
    return jax.nn.gelu(_float(x), approximate=approximate == "tanh")


def _leaky_relu(x: Any, alpha: Any = 0.01) -> Any:
    alpha = attr_checks.float_attr(alpha, "alpha", "leaky_relu")
    x = _float(x)
    return jnp.where(x >= 0, x, alpha * x)


def _elu(x: Any, alpha: Any = 1.0) -> Any:
    alpha = attr_checks.float_attr(alpha, "alpha", "elu")
    x = _float(x)
    return jnp.where(x > 0, x, alpha * jnp.expm1(x))


def _selu(x: Any) -> Any:
    x = _float(x)
    return elementwise.SELU_SCALE * jnp.where(x > 0, x, elementwise.SELU_ALPHA * jnp.expm1(x))


def _hard_sigmoid(x: Any, alpha: Any = 0.2, beta: Any = 0.5) -> Any:
    alpha = attr_checks.float_attr(alpha, "alpha", "hard_sigmoid")
    beta = attr_checks.float_attr(beta, "beta", "hard_sigmoid")
    return jnp.minimum(jnp.maximum(alpha * _float(x) + beta, 0.0), 1.0)


def _hard_swish(x: Any) -> Any:
    x = _float(x)
    return x * jnp.minimum(jnp.maximum(x * (1.0 / 6.0) + 0.5, 0.0), 1.0)


def _clip(x: Any, lo: Any = None, hi: Any = None, *, min: Any = None, max: Any = None) -> Any:
    attr_checks.float_attr(min, "min", "clip", optional=True)
    attr_checks.float_attr(max, "max", "clip", optional=True)
    return ak.clip(jnp, x, lo, hi, min=min, max=max)


def _bit_shift(x: Any, y: Any, direction: str = "left") -> Any:
    attr_checks.choice_attr(direction, "direction", "bit_shift", ("left", "right"))
    return jnp.left_shift(x, y) if direction == "left" else jnp.right_shift(x, y)


# -- reductions and scans (anfir/primitives/reduce.py) --------------------------------------------
def _extreme(name: str, elementwise_fn: Rule, reduce_fn: Callable[..., Any]) -> Rule:
    def rule(x: Any, y: Any = None, *, axis: Any = None, keepdims: Any = False) -> Any:
        if y is not None:  # max(x, y): the elementwise one
            reduce.check_binary_only(name, axis, keepdims)
            return elementwise_fn(x, y)
        return reduce_fn(x, axis=attr_checks.axis_attr(axis, name),
                         keepdims=attr_checks.bool_attr(keepdims, "keepdims", name))

    rule.__name__ = f"_{name}"
    return rule


def _spread(jnp_fn: Callable[..., Any], name: str) -> Rule:
    def rule(x: Any, axis: Any = None, keepdims: Any = False, correction: Any = 0) -> Any:
        return jnp_fn(x, axis=attr_checks.axis_attr(axis, name),
                      keepdims=attr_checks.bool_attr(keepdims, "keepdims", name),
                      ddof=attr_checks.float_attr(correction, "correction", name))

    rule.__name__ = f"_{name}"
    return rule


def _logsumexp(x: Any, axis: Any = None, keepdims: Any = False) -> Any:
    return jax.nn.logsumexp(_float(x), axis=attr_checks.axis_attr(axis, "logsumexp"),
                            keepdims=attr_checks.bool_attr(keepdims, "keepdims", "logsumexp"))


def _norm(x: Any, ord: Any = 2, axis: Any = None, keepdims: Any = False) -> Any:
    p = attr_checks.float_attr(ord, "ord", "norm")
    assert p is not None  # not optional: a number or an error
    ax = attr_checks.axis_attr(axis, "norm")
    keep = attr_checks.bool_attr(keepdims, "keepdims", "norm")
    x = _float(x)
    magnitude = jnp.abs(x)
    if p == math.inf:
        return jnp.max(magnitude, axis=ax, keepdims=keep, initial=0.0)
    if p == -math.inf:
        return jnp.min(magnitude, axis=ax, keepdims=keep)
    if p == 0:
        return jnp.sum(x != 0, axis=ax, keepdims=keep).astype(x.dtype)
    if p == 1:
        return jnp.sum(magnitude, axis=ax, keepdims=keep)
    if p == 2:
        return jnp.sqrt(jnp.sum(x * x, axis=ax, keepdims=keep))
    return jnp.power(jnp.sum(jnp.power(magnitude, p), axis=ax, keepdims=keep), 1.0 / p)


def _arg_extreme(name: str, jnp_fn: Callable[..., Any]) -> Rule:
    def rule(x: Any, axis: Any = 0, keepdims: Any = False, select_last: Any = False) -> Any:
        if axis is not None and not (isinstance(axis, int) and not isinstance(axis, bool)):
            raise AnfirTypeError(f"the axis of {name} is an integer or None, not {axis!r}")
        last = attr_checks.bool_attr(select_last, "select_last", name)
        keep = attr_checks.bool_attr(keepdims, "keepdims", name)
        x = jnp.asarray(x)
        index_dtype = jax.dtypes.canonicalize_dtype(np.int64)
        if not last:
            return jnp_fn(x, axis=axis, keepdims=keep).astype(index_dtype)
        if axis is None:
            flat = jnp.reshape(x, (-1,))
            index = flat.size - 1 - jnp_fn(flat[::-1])
            return jnp.reshape(index, (1,) * x.ndim) if keep else index.astype(index_dtype)
        size = x.shape[axis] if x.ndim else 1
        return (size - 1 - jnp_fn(jnp.flip(x, axis), axis=axis, keepdims=keep)).astype(index_dtype)

    rule.__name__ = f"_{name}"
    return rule


def _scan(name: str, jnp_fn: Callable[..., Any], identity: int) -> Rule:
    def rule(x: Any, axis: Any = None, exclusive: Any = False, reverse: Any = False) -> Any:
        if axis is not None and not (isinstance(axis, int) and not isinstance(axis, bool)):
            raise AnfirTypeError(f"the axis of {name} is an integer or None, not {axis!r}")
        exclusive = attr_checks.bool_attr(exclusive, "exclusive", name)
        reverse = attr_checks.bool_attr(reverse, "reverse", name)
        return ak.scan(jnp, jnp_fn, x, axis, exclusive, reverse, identity)

    rule.__name__ = f"_{name}"
    return rule


# -- gradient helpers (anfir/primitives/gradient.py, on JAX arrays) ------------------------------
def _sum_to(g: Any, x: Any) -> Any:
    if isinstance(g, GradEnv) or g is None or isinstance(g, tuple):
        return g
    gshape, xshape = _shape_of(g), _shape_of(x)
    return g if gshape == xshape else ak.sum_to(jnp, g, gshape, xshape)


def _broadcast_like(g: Any, x: Any) -> Any:
    shape = _shape_of(x)
    return g if _shape_of(g) == shape else jnp.broadcast_to(g, shape)


def _unreduce(g: Any, x: Any, axis: Any, keepdims: Any = False) -> Any:
    return ak.unreduce(jnp, g, _shape_of(x), axis, keepdims)


def _as_matrices(x: Any, y: Any, dout: Any) -> tuple[Any, Any, Any]:
    return ak.as_matrices(jnp, x, y, dout)


def _contract(a: Any, b: Any, a_dim: int, b_dim: int) -> Any:
    """``a`` and ``b`` (matrices) contracted over ``a_dim`` and ``b_dim``: ``a @ b.T``
    or ``a.T @ b`` as one ``dot_general``, no transpose materialized (as JAX's own
    gradient of a matmul is)."""
    a, b = jnp.asarray(a), jnp.asarray(b)
    dtype = jnp.promote_types(a.dtype, b.dtype)
    return lax.dot_general(a.astype(dtype), b.astype(dtype), (((a_dim,), (b_dim,)), ((), ())))


def _matmul_dx(dout: Any, y: Any, x: Any) -> Any:
    if np.ndim(dout) == np.ndim(y) == np.ndim(x) == 2:
        return _contract(dout, y, 1, 1)  # dout @ y.T
    x2, y2, d2 = _as_matrices(x, y, dout)
    return jnp.reshape(_sum_to(jnp.matmul(d2, jnp.swapaxes(y2, -1, -2)), x2), np.shape(x))


def _matmul_dy(x: Any, dout: Any, y: Any) -> Any:
    if np.ndim(dout) == np.ndim(y) == np.ndim(x) == 2:
        return _contract(x, dout, 0, 0)  # x.T @ dout
    x2, y2, d2 = _as_matrices(x, y, dout)
    return jnp.reshape(_sum_to(jnp.matmul(jnp.swapaxes(x2, -1, -2), d2), y2), np.shape(y))


def _reshape_like(g: Any, x: Any) -> Any:
    shape = _shape_of(x)
    return g if _shape_of(g) == shape else jnp.reshape(g, shape)


def _prod_others(x: Any, axis: Any) -> Any:
    """Per element, the product of the other elements of its group of ``prod(x, axis)``
    (exact at zeros: the product before it times the product after it)."""
    array = jnp.asarray(x)
    if array.ndim == 0:
        return jnp.ones_like(array)
    return ak.products_of_others(jnp, array, gradient.reduced_axes(array.ndim, axis))


def _clip_grad(g: Any, x: Any, lo: Any, hi: Any) -> Any:
    inside = ak.within(jnp, x, lo, hi)
    if inside is True:
        return g
    return jnp.where(inside, g, jnp.zeros_like(g))


def _size(x: Any) -> int:
    return math.prod(_shape_of(x))


def _cast_like(g: Any, x: Any) -> Any:
    # The sensitivity of an integer or a boolean is a zero of its type (as in
    # anfir.primitives.gradient's cast_like).
    if isinstance(x, (bool, int, np.bool_, np.integer)) or (
            (is_array(x) or isinstance(x, np.ndarray)) and not jnp.issubdtype(x.dtype, jnp.inexact)):
        dtype = jax.dtypes.canonicalize_dtype(np.asarray(x).dtype if not is_array(x) else x.dtype)
        return jnp.zeros(jnp.shape(g), dtype)
    if is_array(x) or isinstance(x, np.ndarray):
        return lax.convert_element_type(jnp.asarray(g), jax.dtypes.canonicalize_dtype(x.dtype))
    if isinstance(x, float) and not isinstance(x, bool) and not is_array(g) \
            and not isinstance(g, np.ndarray):
        return float(g)
    return g


def _grad_seed(v: Any) -> Any:
    if is_array(v) and v.shape == () and jnp.issubdtype(v.dtype, jnp.floating):
        return jnp.ones_like(v)
    return gradient.grad_seed_value(v)  # its error message for the rest


def _is_integral(x: Any) -> bool:
    if isinstance(x, (bool, int, np.bool_, np.integer)):
        return True
    if is_array(x) or isinstance(x, np.ndarray):
        return bool(jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_)
    return False


def _grad_arg_check(x: Any, g: Any) -> Any:
    if _is_integral(x):
        shown = f"a {x.dtype} tensor" if is_array(x) else repr(x)
        raise GradientError("gradients with respect to integer or boolean arguments are not "
                            f"supported (the argument is {shown}); pass a float")
    return g


def _tangent_dot(a: Any, b: Any) -> Any:
    total: Any = None
    for x, y in gradient.tangent_pairs(a, b):
        if x is None or y is None:
            continue
        if isinstance(x, (GradEnv, str)) or isinstance(y, (GradEnv, str)):
            raise GradientError("jvp needs arguments and results that are numbers, tensors "
                                "or tuples of them")
        term = jnp.sum(jnp.multiply(x, y)) if np.ndim(x) or np.ndim(y) else x * y
        total = term if total is None else total + term
    if total is None:
        return 0.0
    return total


def _tangent_scale(a: Any, s: Any) -> Any:
    return map_tuples(a, lambda v: v if v is None or isinstance(v, GradEnv) or not is_numeric(v)
                      else v * s)


# -- neural-network operators: the evaluator's kernels over jax.numpy ----------------------------
def _softmax_rule(kernel: Callable[..., Any], name: str) -> Rule:
    def rule(x: Any, axis: Any = -1) -> Any:
        x = nnk.float_of(jnp, x)
        ax = nn.axis_attr(axis, x.ndim, name)
        if x.ndim == 0:
            return kernel(jnp, x.reshape(1), 0).reshape(())
        return kernel(jnp, x, ax)
    rule.__name__ = f"_{name}"
    return rule


def _layer_norm(x: Any, scale: Any = None, bias: Any = None, axis: Any = -1,
                eps: Any = 1e-5) -> Any:
    x = nnk.float_of(jnp, x)
    return nnk.layer_norm(jnp, x, scale, bias, nn.axis_attr(axis, x.ndim, "layer_norm"),
                          nn.eps_attr(eps, "layer_norm"))


def _rms_norm(x: Any, scale: Any = None, axis: Any = -1, eps: Any = 1e-6) -> Any:
    x = nnk.float_of(jnp, x)
    return nnk.rms_norm(jnp, x, scale, nn.axis_attr(axis, x.ndim, "rms_norm"),
                        nn.eps_attr(eps, "rms_norm"))


def _group_norm(x: Any, num_groups: Any, scale: Any, bias: Any, eps: Any = 1e-5) -> Any:
    x = nnk.float_of(jnp, x)
    groups = nn.group_count(int(num_groups), x.shape[1])
    return nnk.group_norm(jnp, x, groups, scale, bias, nn.eps_attr(eps, "group_norm"))


def _instance_norm(x: Any, scale: Any, bias: Any, eps: Any = 1e-5) -> Any:
    return nnk.instance_norm(jnp, nnk.float_of(jnp, x), scale, bias,
                             nn.eps_attr(eps, "instance_norm"))


def _einsum(spec: Any, *operands: Any) -> Any:
    nn.parse_einsum_spec(nn.einsum_spec_text(spec), len(operands))
    return jnp.einsum(spec, *operands)


def _attention_attrs(scale: Any, causal: Any) -> tuple[Any, bool]:
    return (attr_checks.float_attr(scale, "scale", "attention", True),
            attr_checks.bool_attr(causal, "causal", "attention"))


def _attention(q: Any, k: Any, v: Any, mask: Any = None, scale: Any = None,
               causal: Any = False) -> Any:
    return nnk.attention(jnp, nnk.float_of(jnp, q), k, v, mask, *_attention_attrs(scale, causal))


def _attention_probs(q: Any, k: Any, mask: Any, scale: Any = None, causal: Any = False) -> Any:
    return nnk.attention_probs(jnp, nnk.float_of(jnp, q), k, mask,
                               *_attention_attrs(scale, causal))


def _mask_cotangent(g: Any, mask: Any) -> Any:
    if jnp.asarray(mask).dtype == jnp.bool_:
        return jnp.zeros(jnp.shape(mask), jnp.result_type(g))
    return _sum_to(g, mask)


def _class_axis(x: Any, axis: Any, what: str) -> int:
    return nn.axis_attr(axis, jnp.ndim(x), what) % max(jnp.ndim(x), 1)


def _nll_loss(logp: Any, target: Any, axis: Any = -1, reduction: Any = "mean") -> Any:
    lp = nnk.float_of(jnp, logp)
    ax = _class_axis(lp, axis, "nll_loss")
    return nnk.loss_reduce(jnp, nnk.picked(jnp, lp, target, ax), nn.reduction_attr(reduction, "nll_loss"))


def _cross_entropy(logits: Any, target: Any, axis: Any = -1, reduction: Any = "mean") -> Any:
    x = nnk.float_of(jnp, logits)
    ax = _class_axis(x, axis, "cross_entropy")
    return nnk.loss_reduce(jnp, nnk.picked(jnp, nnk.log_softmax(jnp, x, ax), target, ax),
                           nn.reduction_attr(reduction, "cross_entropy"))


def _mse_loss(a: Any, b: Any, reduction: Any = "mean") -> Any:
    d = nnk.float_of(jnp, jnp.subtract(a, b))
    return nnk.loss_reduce(jnp, d * d, nn.reduction_attr(reduction, "mse_loss"))


def _dropout(x: Any, rate: Any, key: Any, training: Any = False) -> Any:
    if not attr_checks.bool_attr(training, "training", "dropout"):
        return x
    shape = tuple(int(d) for d in jnp.shape(x))
    # The mask is numpy's (the same seed gives anfir.run's mask), drawn on the host.
    keep = jax.pure_callback(
        lambda r, k: nnk.dropout_keep(shape, float(r), int(k)),
        jax.ShapeDtypeStruct(shape, jnp.bool_), rate, key)
    dtype = jnp.result_type(x)
    return jnp.where(keep, x / (1.0 - jnp.asarray(rate, dtype)), jnp.zeros((), dtype))


def _einsum_grad_spec(spec: Any, index: Any) -> Any:
    return nn.einsum_grad_spec.impl(spec, int(index))


def _einsum_ones(spec: Any, index: Any, x: Any) -> Any:
    ones_part = nn.einsum_grad_spec.impl(spec, int(index)).split("->")[0].split(",")[-1]
    dtype = jnp.result_type(nnk.float_of(jnp, x))
    return jnp.ones(jnp.shape(x) if ones_part else (), dtype)


def _tail_mean(x: Any, axis: Any = -1) -> Any:
    x = nnk.float_of(jnp, x)
    return nnk.tail_mean(jnp, x, nn.axis_attr(axis, x.ndim, "tail_mean"))


def _loss_spread(g: Any, like: Any, reduction: Any = "mean") -> Any:
    return nnk.loss_spread(jnp, jnp.asarray(g), jnp.asarray(like),
                           nn.reduction_attr(reduction, "a loss"))


def _class_mask(target: Any, like: Any, axis: Any = -1) -> Any:
    like = jnp.asarray(like)
    return nnk.class_mask(jnp, jnp.asarray(target), like, _class_axis(like, axis, "a loss"))


def _group_view(x: Any, num_groups: Any) -> Any:
    shape = jnp.shape(x)
    return jnp.reshape(x, nnk.group_shape(shape, nn.group_count(int(num_groups), shape[1])))



RULES: dict[Primitive, Rule] = {
    # arithmetic
    arith.add: jnp.add,
    arith.sub: jnp.subtract,
    arith.mul: jnp.multiply,
    arith.div: jnp.true_divide,
    arith.neg: jnp.negative,
    arith.pow_: _pow,
    arith.exp: jnp.exp,
    arith.log: jnp.log,
    arith.sin: jnp.sin,
    arith.cos: jnp.cos,
    arith.tanh: jnp.tanh,
    arith.sqrt: jnp.sqrt,
    arith.abs_: jnp.abs,
    arith.sign: jnp.sign,
    arith.maximum: jnp.maximum,
    arith.minimum: jnp.minimum,
    arith.sigmoid: jax.nn.sigmoid,
    arith.relu: lambda x: jnp.maximum(x, jnp.zeros((), jnp.result_type(x))),
    arith.softplus: jax.nn.softplus,
    # elementwise math and activations
    elementwise.erf: _on_float(jax.scipy.special.erf),
    elementwise.expm1: _on_float(jnp.expm1),
    elementwise.log1p: _on_float(jnp.log1p),
    elementwise.floor: _on_float(jnp.floor),
    elementwise.ceil: _on_float(jnp.ceil),
    elementwise.round_: _on_float(jnp.round),
    elementwise.reciprocal: _on_float(jnp.reciprocal),
    elementwise.rsqrt: _on_float(lax.rsqrt),
    elementwise.square: lambda x: jnp.multiply(x, x),
    elementwise.tan: _on_float(jnp.tan),
    elementwise.atan: _on_float(jnp.arctan),
    elementwise.sinh: _on_float(jnp.sinh),
    elementwise.cosh: _on_float(jnp.cosh),
    elementwise.asin: _on_float(jnp.arcsin),
    elementwise.acos: _on_float(jnp.arccos),
    elementwise.softsign: _on_float(lambda x: x / (1.0 + jnp.abs(x))),
    elementwise.silu: _on_float(lambda x: x * jax.nn.sigmoid(x)),
    elementwise.mish: _on_float(lambda x: x * jnp.tanh(jax.nn.softplus(x))),
    elementwise.gelu: _gelu,
    elementwise.leaky_relu: _leaky_relu,
    elementwise.elu: _elu,
    elementwise.selu: _selu,
    elementwise.hard_sigmoid: _hard_sigmoid,
    elementwise.hard_swish: _hard_swish,
    elementwise.clip: _clip,
    elementwise.floor_div: jnp.floor_divide,
    elementwise.mod: jnp.mod,
    elementwise.fmod: jnp.fmod,
    elementwise.atan2: jnp.arctan2,
    # comparison and logic
    arith.lt: jnp.less,
    arith.le: jnp.less_equal,
    arith.gt: jnp.greater,
    arith.ge: jnp.greater_equal,
    arith.eq: jnp.equal,
    arith.ne: jnp.not_equal,
    arith.logical_and: jnp.logical_and,
    arith.logical_or: jnp.logical_or,
    arith.logical_not: jnp.logical_not,
    elementwise.isnan: jnp.isnan,
    elementwise.isinf: jnp.isinf,
    elementwise.logical_xor: jnp.logical_xor,
    elementwise.bitwise_and: jnp.bitwise_and,
    elementwise.bitwise_or: jnp.bitwise_or,
    elementwise.bitwise_xor: jnp.bitwise_xor,
    elementwise.bitwise_not: jnp.invert,
    elementwise.bit_shift: _bit_shift,
    # reductions and scans
    reduce.max_: _extreme("max", jnp.maximum, jnp.max),
    reduce.min_: _extreme("min", jnp.minimum, jnp.min),
    reduce.prod: _reduction(jnp.prod, "prod"),
    reduce.var: _spread(jnp.var, "var"),
    reduce.std: _spread(jnp.std, "std"),
    reduce.logsumexp: _logsumexp,
    reduce.all_: _reduction(jnp.all, "all"),
    reduce.any_: _reduction(jnp.any, "any"),
    reduce.norm: _norm,
    reduce.argmax: _arg_extreme("argmax", jnp.argmax),
    reduce.argmin: _arg_extreme("argmin", jnp.argmin),
    reduce.cumsum: _scan("cumsum", jnp.cumsum, 0),
    reduce.cumprod: _scan("cumprod", jnp.cumprod, 1),
    # tensors
    tensor.matmul: _matmul,
    tensor.transpose: _transpose,
    tensor.reshape: _reshape,
    tensor.sum_: _sum,
    tensor.mean: _mean,
    tensor.broadcast_to: _broadcast_to,
    tensor.shape: _shape_of,
    tensor.ones_like: jnp.ones_like,
    tensor.zeros: _zeros,
    tensor.ones: _ones,
    tensor.where: jnp.where,
    tensor.array: _array,
    tensor.cast: _cast,
    complexes.complex_: _complex,
    complexes.real: jnp.real,
    complexes.imag: jnp.imag,
    complexes.conj: jnp.conj,
    # neural-network operators
    nn.softmax: _softmax_rule(nnk.softmax, "softmax"),
    nn.log_softmax: _softmax_rule(nnk.log_softmax, "log_softmax"),
    nn.layer_norm: _layer_norm,
    nn.rms_norm: _rms_norm,
    nn.group_norm: _group_norm,
    nn.instance_norm: _instance_norm,
    nn.einsum: _einsum,
    nn.attention: _attention,
    nn.nll_loss: _nll_loss,
    nn.cross_entropy: _cross_entropy,
    nn.mse_loss: _mse_loss,
    nn.dropout: _dropout,
    nn.tail_mean: _tail_mean,
    nn.swap_last: lambda x: nnk.swap_last(jnp, x),
    nn.attention_probs: _attention_probs,
    nn.attention_scale: lambda q, scale=None: nn.attention_scale.impl(q, scale=scale),
    nn.mask_cotangent: _mask_cotangent,
    nn.loss_reduce: lambda x, reduction="mean": nnk.loss_reduce(
        jnp, jnp.asarray(x), nn.reduction_attr(reduction, "a loss")),
    nn.loss_spread: _loss_spread,
    nn.class_mask: _class_mask,
    nn.channel_view: lambda s, x: jnp.reshape(s, nnk.channel_shape(jnp.shape(x))),
    nn.group_view: _group_view,
    nn.einsum_grad_spec: _einsum_grad_spec,
    nn.einsum_ones: _einsum_ones,
    # tuples, functions, control: their own evaluation is plain Python
    structure.make_tuple: structure.make_tuple.impl,
    structure.tuple_getitem: structure.tuple_getitem.impl,
    structure.len_: structure.len_.impl,
    structure.switch: _switch,
    structure.partial: structure.partial.impl,
    structure.identity: structure.identity.impl,
    structure.stop_gradient: _stop_gradient,
    structure.zeros_like: zeros_like,
    # what the autodiff makes
    gradient.J: _j,
    gradient.newenv: gradient.newenv.impl,
    gradient.env_setitem: gradient.env_setitem.impl,
    gradient.env_getitem: gradient.env_getitem.impl,
    gradient.gadd: gadd,
    gradient.sum_to: _sum_to,
    gradient.broadcast_like: _broadcast_like,
    gradient.unreduce: _unreduce,
    gradient.matmul_dx: _matmul_dx,
    gradient.matmul_dy: _matmul_dy,
    gradient.reshape_like: _reshape_like,
    gradient.prod_others: _prod_others,
    gradient.clip_grad: _clip_grad,
    gradient.size: _size,
    gradient.cast_like: _cast_like,
    gradient.tuple_setitem: gradient.tuple_setitem.impl,
    gradient.invert_permutation: gradient.invert_permutation.impl,
    gradient.grad_seed: _grad_seed,
    gradient.tangent_dot: _tangent_dot,
    gradient.tangent_scale: _tangent_scale,
    gradient.grad_arg_check: _grad_arg_check,
    checkpointing.remat_barrier: lambda x, after: x,  # x; jax.grad of it is dout to x only
    **CONV_RULES,  # convolution, pooling, batch norm: tojax/conv_rules.py
}
"""The JAX rule of each primitive (called when an argument holds a JAX array)."""
RULES.update(SHAPING_RULES)
RULES.update(LOOP_RULES)  # scan, fori_loop, custom rules: tojax/loop_rules.py
RULES.update(BATCHING_RULES)  # vmap's primitives: tojax/batching_rules.py
RULES[batching.batch_loop] = loop_rule(RULES)
RULES.update(COLLECTIVE_RULES)  # all_reduce, all_gather...: tojax/collective_rules.py

STRUCTURAL: frozenset[Primitive] = frozenset({
    structure.make_tuple, structure.tuple_getitem, structure.len_, structure.switch,
    structure.partial, structure.identity, structure.stop_gradient, structure.zeros_like,
    gradient.J, gradient.newenv, gradient.env_setitem, gradient.env_getitem, gradient.gadd,
    gradient.tuple_setitem, batching.batch_fn,
})
"""Primitives on values of any kind (tuples, functions, gradient environments)
whose rule computes what their ``impl`` does on known values too: the machine
calls the rule without first searching the arguments — which may be long chains
of closures — for a traced leaf."""

STRUCTURAL = STRUCTURAL | frozenset(COLLECTIVE_RULES)
"""(The collectives too: on a known value — a constant cut to this device's block —
their rule still runs, under ``shard_map``, where the device is known.)"""

UNMAPPED: dict[Primitive, str] = {}
"""Primitives without a rule, each with the reason (a program calling one on
traced values is refused with it)."""


def rule_for(prim: Primitive) -> Optional[Rule]:
    """The rule of ``prim``, None if it has none."""
    return RULES.get(prim)


__all__ = ["RULES", "Rule", "STRUCTURAL", "UNMAPPED", "concrete_bool", "jax_dtype", "rule_for"]

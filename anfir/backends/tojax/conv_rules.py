"""JAX rules of the convolution family (``anfir/primitives/conv.py``).

The geometry (pads resolved from ``"same"``, ceil-mode end padding, the
divisors of ``avg_pool``) comes from the op library's own helpers, so JAX and
the numpy kernels agree on every edge.  ``conv`` is
``lax.conv_general_dilated``; pooling is ``lax.reduce_window``; the gradient
primitives are the VJPs (and, for ``max_pool_select``, the JVP) of those, which
is what they are by definition.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from anfir.primitives import conv as nn

Rule = Callable[..., Any]


def _float(x: Any) -> Any:
    x = jnp.asarray(x)
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.result_type(float))


def _common(*xs: Any) -> list[Any]:
    dtype = jnp.result_type(*[_float(x) for x in xs])
    return [jnp.asarray(x).astype(dtype) for x in xs]


def _conv_fn(x: Any, w: Any, stride: Any, padding: Any, dilation: Any, groups: Any) -> Any:
    """The bias-free convolution, lax's form of conv_core (x only for its shape)."""
    n, st, pads, dil, g = nn.conv_params(x, w, stride, padding, dilation, groups, "conv")
    pairs = list(zip(pads[:n], pads[n:]))

    def apply(a: Any, b: Any) -> Any:
        a, b = _common(a, b)
        return lax.conv_general_dilated(a, b, st, pairs, rhs_dilation=dil, feature_group_count=g,
                                        precision=lax.Precision.HIGHEST)
    return apply


def _bias(out: Any, b: Any) -> Any:
    return out if b is None else out + jnp.asarray(b, out.dtype).reshape((-1,) + (1,) * (out.ndim - 2))


def _conv(x: Any, w: Any, b: Any = None, *, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
          groups: Any = 1) -> Any:
    return _bias(_conv_fn(x, w, stride, padding, dilation, groups)(x, w), b)


def _conv_core(x: Any, w: Any, stride: Any = 1, padding: Any = 0, dilation: Any = 1,
               groups: Any = 1) -> Any:
    return _conv_fn(x, w, stride, padding, dilation, groups)(x, w)


def _conv_input_grad(dout: Any, w: Any, x: Any, stride: Any = 1, padding: Any = 0,
                     dilation: Any = 1, groups: Any = 1) -> Any:
    fn = _conv_fn(x, w, stride, padding, dilation, groups)
    x0, w0 = _common(jnp.zeros(jnp.shape(x)), w)
    _, pullback = jax.vjp(lambda a: fn(a, w0), x0)
    return pullback(jnp.asarray(dout, x0.dtype))[0]


def _conv_weight_grad(x: Any, dout: Any, w: Any, stride: Any = 1, padding: Any = 0,
                      dilation: Any = 1, groups: Any = 1) -> Any:
    fn = _conv_fn(x, w, stride, padding, dilation, groups)
    x0, w0 = _common(x, jnp.zeros(jnp.shape(w)))
    _, pullback = jax.vjp(lambda b: fn(x0, b), w0)
    return pullback(jnp.asarray(dout, x0.dtype))[0]


def _conv_transpose(x: Any, w: Any, b: Any = None, *, stride: Any = 1, padding: Any = 0,
                    output_padding: Any = 0, dilation: Any = 1, groups: Any = 1) -> Any:
    """The VJP of the convolution whose output has x's shape (PyTorch's definition)."""
    n = jnp.ndim(w) - 2
    st, dil = nn.per_axis_ints(stride, n, "stride", "conv_transpose"), nn.per_axis_ints(dilation, n, "dilation", "conv_transpose")
    op = nn.per_axis_ints(output_padding, n, "output_padding", "conv_transpose", least=0)
    pads = nn.padding_attr(padding, n, "conv_transpose", strings=False) or ()
    g = int(groups)
    spatial = [(i - 1) * s - int(pads[a]) - int(pads[n + a]) + d * (k - 1) + o + 1
               for a, (i, s, d, k, o) in enumerate(zip(jnp.shape(x)[2:], st, dil, jnp.shape(w)[2:], op))]
    like = jax.ShapeDtypeStruct((jnp.shape(x)[0], jnp.shape(w)[1] * g, *spatial), jnp.float32)
    return _bias(_conv_input_grad(x, w, like, stride, tuple(int(p) for p in pads), dilation, groups), b)


def _pool(x: Any, kernel: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: Any,
          init: Any, op: Any) -> Any:
    n, k, st, pads, dil, out = nn.pool_params(x, kernel, stride, padding, dilation, ceil_mode,
                                              "pool")
    pairs = [(0, 0), (0, 0)] + list(zip(pads[:n], pads[n:]))
    return lax.reduce_window(x, init, op, (1, 1, *k), (1, 1, *st), pairs,
                             window_dilation=(1, 1, *dil))[(slice(None), slice(None))
                                                           + tuple(slice(0, o) for o in out)]


def _max_pool(x: Any, kernel: Any = None, stride: Any = None, padding: Any = 0, dilation: Any = 1,
              ceil_mode: Any = False) -> Any:
    x = jnp.asarray(x)
    low = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    # A numpy scalar, not a jnp array: under jit a jnp constant is a tracer, and lax then
    # cannot see that (-inf, max) is a monoid, so reduce_window has no derivative.
    return _pool(x, kernel, stride, padding, dilation, ceil_mode, np.array(low, x.dtype),
                 lax.max)


def _max_pool_grad(x: Any, dout: Any, kernel: Any = None, stride: Any = None, padding: Any = 0,
                   dilation: Any = 1, ceil_mode: Any = False) -> Any:
    _, pullback = jax.vjp(lambda a: _max_pool(a, kernel, stride, padding, dilation, ceil_mode),
                          _float(x))
    return pullback(jnp.asarray(dout, _float(x).dtype))[0]


def _max_pool_select(x: Any, g: Any, kernel: Any = None, stride: Any = None, padding: Any = 0,
                     dilation: Any = 1, ceil_mode: Any = False) -> Any:
    a, t = _common(x, g)
    return jax.jvp(lambda v: _max_pool(v, kernel, stride, padding, dilation, ceil_mode),
                   (a,), (t,))[1]


def _avg_pool(x: Any, kernel: Any = None, stride: Any = None, padding: Any = 0,
              ceil_mode: Any = False, count_include_pad: Any = True) -> Any:
    x = _float(x)
    n, k, st, pads, _, out = nn.pool_params(x, kernel, stride, padding, 1, ceil_mode, "avg_pool")
    given = [int(p) for p in nn.padding_attr(padding, n, "avg_pool", strings=False) or ()]
    divisor = nn.avg_divisor(x.shape, n, k, st, pads, given, out, bool(count_include_pad))
    total = _pool(x, kernel, stride, padding, 1, ceil_mode, jnp.asarray(0, x.dtype), lax.add)
    return total / jnp.asarray(divisor, x.dtype)


def _avg_pool_grad(dout: Any, x: Any, kernel: Any = None, stride: Any = None, padding: Any = 0,
                   ceil_mode: Any = False, count_include_pad: Any = True) -> Any:
    a, d = _common(jnp.zeros(jnp.shape(x)), dout)
    _, pullback = jax.vjp(lambda v: _avg_pool(v, kernel, stride, padding, ceil_mode,
                                              count_include_pad), a)
    return pullback(d)[0]


def _spatial(x: Any) -> tuple[int, ...]:
    return tuple(range(2, jnp.ndim(x)))


def _batch_norm(x: Any, scale: Any, bias: Any, mean: Any, var: Any, eps: Any = 1e-5) -> Any:
    x, scale, bias, mean, var = _common(x, scale, bias, mean, var)
    shape = (-1,) + (1,) * (x.ndim - 2)
    inv = scale.reshape(shape) / jnp.sqrt(var.reshape(shape) + jnp.asarray(eps, x.dtype))
    return (x - mean.reshape(shape)) * inv + bias.reshape(shape)


def _channel_spread(v: Any, like: Any) -> Any:
    return jnp.broadcast_to(jnp.reshape(v, (-1,) + (1,) * (jnp.ndim(like) - 2)), jnp.shape(like))


CONV_RULES: dict[Any, Rule] = {
    nn.conv: _conv,
    nn.conv_core: _conv_core,
    nn.conv_input_grad: _conv_input_grad,
    nn.conv_weight_grad: _conv_weight_grad,
    nn.conv_transpose: _conv_transpose,
    nn.max_pool: _max_pool,
    nn.max_pool_grad: _max_pool_grad,
    nn.max_pool_select: _max_pool_select,
    nn.avg_pool: _avg_pool,
    nn.avg_pool_grad: _avg_pool_grad,
    nn.global_avg_pool: lambda x: jnp.mean(_float(x), axis=_spatial(x), keepdims=True),
    nn.global_max_pool: lambda x: jnp.max(x, axis=_spatial(x), keepdims=True),
    nn.channel_sum: lambda x: jnp.sum(x, axis=(0, *_spatial(x))),
    nn.channel_spread: _channel_spread,
    nn.batch_norm: _batch_norm,
}
"""The rules of the convolution family, merged into ``RULES``."""

__all__ = ["CONV_RULES"]

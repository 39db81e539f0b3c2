"""The torch.export rules whose result is built from
:mod:`anfir.primitives.conv`: convolution, pooling and batch norm, with the
backward ops a program that differentiates itself contains.

See :mod:`anfir.interop.torch.rules.common` for the rule protocol.
"""

from __future__ import annotations

import operator
from typing import Any

from anfir.errors import AnfirError
from anfir.interop.torch.rules.common import Rule, RuleTable, int_tuple, window_ints, arg_shape, static_arg_shape
from anfir.primitives import arith, conv, elementwise, shaping, structure, tensor


def channel_fill(b: Any, fx_x: Any, fill: Any) -> Any:
    """A vector of ones (``fill`` is ``tensor.ones``) or zeros, one per channel (axis 1)
    of the FX argument ``fx_x``, in its dtype: the scale or bias of a norm that has
    none, so the norm is still the op library's primitive (ONNX's carry both)."""
    channels = b.importer.size_value(fx_x.meta["val"].shape[1], b)
    return b.call(fill, b.tuple_of((channels,)), b.arg_dtype(fx_x))


def _batch_norm_eval(b: Any, x: Any, weight: Any, bias: Any, mean: Any, var: Any,
                     momentum: Any, eps: float) -> Any:
    """``_native_batch_norm_legit_no_training`` (batch norm in eval): anfir's
    ``batch_norm`` (what ONNX's ``BatchNormalization`` imports as), with scale 1 /
    bias 0 for a norm without them."""
    fx_x = b.fx_node.args[0]
    weight = channel_fill(b, fx_x, tensor.ones) if weight is None else weight
    bias = channel_fill(b, fx_x, tensor.zeros) if bias is None else bias
    out = b.call(conv.batch_norm, x, weight, bias, mean, var, eps=float(eps))
    # The saved mean/rstd of the eval form are empty in torch; nothing reads them.
    return b.call(structure.make_tuple, out, mean, var)


def _convolution(b: Any, x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
                 transposed: bool, output_padding: Any, groups: int) -> Any:
    """``aten.convolution``: ``conv`` (torch's padding is per axis, both sides), or
    ``conv_transpose`` when ``transposed``."""
    n = b.rank(b.fx_node.args[1]) - 2
    attrs: dict[str, Any] = {"stride": window_ints(stride, n), "padding": window_ints(padding, n),
                             "dilation": window_ints(dilation, n), "groups": int(groups)}
    args = [x, w] if bias is None else [x, w, bias]
    if transposed:
        return b.call(conv.conv_transpose, *args, output_padding=window_ints(output_padding, n),
                      **attrs)
    if window_ints(output_padding, n) != 0:
        raise AnfirError("a convolution with output_padding that is not transposed", b.loc)
    return b.call(conv.conv, *args, **attrs)


def _max_pool_with_indices(n: int) -> Rule:
    """``max_pool{n}d_with_indices`` -> ``(max_pool(x, ...),)``: the indices are not
    computed, so a program that reads them is refused (by the importer, before
    anything is built: see :func:`reads_pool_indices`)."""
    def rule(b: Any, x: Any, kernel: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
             ceil_mode: bool = False) -> Any:
        k = window_ints(kernel, n)
        out = b.call(conv.max_pool, x, kernel=k, stride=window_ints(stride, n) if stride else k,
                     padding=window_ints(padding, n), dilation=window_ints(dilation, n),
                     ceil_mode=bool(ceil_mode))
        return b.call(structure.make_tuple, out)
    return rule


def reads_pool_indices(fx_node: Any) -> bool:
    """Whether a ``max_pool*_with_indices`` node's indices (result 1) are used —
    other than by ``max_pool*_with_indices_backward``, whose rule finds the same
    first maxima itself."""
    def reader(user: Any) -> bool:
        if user.target is operator.getitem and user.args[1] == 0:
            return False
        if user.target is operator.getitem:
            return any("_with_indices_backward" not in str(u.target) for u in user.users)
        return True
    return "_backward" not in str(fx_node.target) and any(reader(u) for u in fx_node.users)


def _avg_pool(n: int) -> Rule:
    """``avg_pool{n}d`` -> ``avg_pool``."""
    def rule(b: Any, x: Any, kernel: Any, stride: Any = (), padding: Any = 0,
             ceil_mode: bool = False, count_include_pad: bool = True,
             divisor_override: Any = None) -> Any:
        if divisor_override is not None:
            raise AnfirError(f"avg_pool{n}d with divisor_override", b.loc)
        k = window_ints(kernel, n)
        return b.call(conv.avg_pool, x, kernel=k, stride=window_ints(stride, n) if stride else k,
                      padding=window_ints(padding, n), ceil_mode=bool(ceil_mode),
                      count_include_pad=bool(count_include_pad))
    return rule


def _adaptive_avg_pool(n: int) -> Rule:
    """``_adaptive_avg_pool{n}d``: ``global_avg_pool`` for an output of ones, else
    ``avg_pool`` with kernel = stride = input / output when every static input
    size is a multiple of its output size (the windows then do not overlap and
    are what torch averages)."""
    def rule(b: Any, x: Any, output_size: Any) -> Any:
        out = int_tuple(output_size, n)
        if all(o == 1 for o in out):
            return b.call(conv.global_avg_pool, x)
        sizes = b.fx_node.args[0].meta["val"].shape[-n:]
        if not all(isinstance(s, int) and s % o == 0 for s, o in zip(sizes, out)):
            raise AnfirError(f"adaptive average pooling from {tuple(sizes)} to {out} "
                             "(only sizes that divide evenly)", b.loc)
        k = tuple(int(s) // o for s, o in zip(sizes, out))
        return b.call(conv.avg_pool, x, kernel=k, stride=k)
    return rule


def _batch_norm_train(b: Any, x: Any, weight: Any, bias: Any, *rest: Any) -> Any:
    """``_native_batch_norm_legit`` (training: the batch's own statistics) ->
    ``(out, save_mean, save_rstd)``; the running statistics' update is PyTorch's
    business (a mutation the gradient does not see)."""
    if len(rest) == 5:  # running_mean, running_var, training, momentum, eps
        eps = rest[4]
    else:  # no_stats: training, momentum, eps
        eps = rest[2]
    rank = len(arg_shape(b))
    axes = (0,) + tuple(range(2, rank))
    mean = b.call(tensor.mean, x, axis=axes, keepdims=True)
    centered = b.call(arith.sub, x, mean)
    var = b.call(tensor.mean, b.call(arith.mul, centered, centered), axis=axes, keepdims=True)
    rstd = b.call(elementwise.rsqrt, b.call(arith.add, var, float(eps)))
    out = b.call(arith.mul, centered, rstd)
    per_channel = (-1,) + (1,) * (rank - 2)
    if weight is not None:
        out = b.call(arith.mul, out, b.call(tensor.reshape, weight, b.tuple_of(per_channel)))
    if bias is not None:
        out = b.call(arith.add, out, b.call(tensor.reshape, bias, b.tuple_of(per_channel)))
    flat = b.tuple_of((-1,))
    return b.call(structure.make_tuple, out, b.call(tensor.reshape, mean, flat),
                  b.call(tensor.reshape, rstd, flat))


def _batch_norm_functional(b: Any, x: Any, weight: Any, bias: Any, running_mean: Any,
                           running_var: Any, training: bool, momentum: float, eps: float) -> Any:
    """``_native_batch_norm_legit_functional``: the training form plus the updated
    running statistics (PyTorch's: momentum, the unbiased batch variance)."""
    trio = _batch_norm_train(b, x, weight, bias, running_mean, running_var, training, momentum, eps)
    mean, rstd = (b.call(structure.tuple_getitem, trio, i) for i in (1, 2))
    shape = arg_shape(b)
    count = 1
    for i, d in enumerate(shape):
        if i != 1:
            count *= d
    var = b.call(arith.sub, b.call(arith.div, 1.0, b.call(arith.mul, rstd, rstd)), float(eps))
    unbiased = b.call(arith.mul, var, count / (count - 1) if isinstance(count, int) and count > 1
                      else 1.0)
    m = float(momentum)
    new_mean = b.call(arith.add, b.call(arith.mul, running_mean, 1.0 - m),
                      b.call(arith.mul, b.call(structure.stop_gradient, mean), m))
    new_var = b.call(arith.add, b.call(arith.mul, running_var, 1.0 - m),
                     b.call(arith.mul, b.call(structure.stop_gradient, unbiased), m))
    return b.call(structure.make_tuple, *(b.call(structure.tuple_getitem, trio, i) for i in range(3)),
                  new_mean, new_var)


# -- backward ops --------------------------------------------------------------------------------
def _avg_pool2d_backward(b: Any, grad: Any, x: Any, kernel: Any, stride: Any, padding: Any,
                         ceil_mode: bool, count_include_pad: bool, divisor_override: Any) -> Any:
    if divisor_override is not None:
        raise AnfirError("avg_pool2d_backward with divisor_override", b.loc)
    k = window_ints(kernel, 2)
    s = window_ints(stride, 2) if stride else k
    return b.call(conv.avg_pool_grad, grad, x, kernel=k, stride=s,
                  padding=window_ints(padding, 2), ceil_mode=bool(ceil_mode),
                  count_include_pad=bool(count_include_pad))


def _adaptive_avg_pool2d_backward(b: Any, grad: Any, x: Any) -> Any:
    """The gradient of ``_adaptive_avg_pool2d`` where the windows tile the input
    (every size a multiple of the output's): ``avg_pool_grad``."""
    h, w = static_arg_shape(b, "_adaptive_avg_pool2d_backward", 1)[2:]
    oh, ow = static_arg_shape(b, "_adaptive_avg_pool2d_backward")[2:]
    if h % oh or w % ow:
        raise AnfirError("adaptive average pooling backward with sizes that do not divide", b.loc)
    k = (h // oh, w // ow)
    return b.call(conv.avg_pool_grad, grad, x, kernel=k, stride=k)


def _max_pool2d_backward(b: Any, grad: Any, x: Any, kernel: Any, stride: Any, padding: Any,
                         dilation: Any, ceil_mode: bool, indices: Any) -> Any:
    """``max_pool2d_with_indices_backward``: ``max_pool_grad`` (to each window's first
    maximum, the index PyTorch's kernel records)."""
    k = window_ints(kernel, 2)
    return b.call(conv.max_pool_grad, x, grad, kernel=k,
                  stride=window_ints(stride, 2) if stride else k, padding=window_ints(padding, 2),
                  dilation=window_ints(dilation, 2), ceil_mode=bool(ceil_mode))


def _convolution_backward(b: Any, grad: Any, x: Any, w: Any, bias_sizes: Any, stride: Any,
                          padding: Any, dilation: Any, transposed: bool, output_padding: Any,
                          groups: int, output_mask: Any) -> Any:
    """``convolution_backward`` of a (not transposed) convolution: ``conv_input_grad``,
    ``conv_weight_grad`` and the bias gradient (a sum), as ``output_mask`` asks."""
    if transposed:
        raise AnfirError("convolution_backward of a transposed convolution", b.loc)
    n = len(arg_shape(b, 2)) - 2
    attrs = {"stride": window_ints(stride, n), "padding": window_ints(padding, n),
             "dilation": window_ints(dilation, n), "groups": int(groups)}
    mask = list(output_mask)
    gx = b.call(conv.conv_input_grad, grad, w, x, **attrs) if mask[0] else None
    gw = b.call(conv.conv_weight_grad, x, grad, w, **attrs) if mask[1] else None
    gb = (b.call(tensor.sum_, grad, axis=(0,) + tuple(range(2, n + 2)))
          if len(mask) > 2 and mask[2] else None)
    return b.call(structure.make_tuple, gx, gw, gb)


# -- ops of torch.export's training IR (a program imported without decomposition) ------------
def _conv_nd(n: int) -> Rule:
    """``conv{n}d`` (numeric or ``"same"``/``"valid"`` padding) -> ``convolution``."""
    def rule(b: Any, x: Any, w: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
             dilation: Any = 1, groups: int = 1) -> Any:
        if isinstance(padding, str):
            kernel = static_arg_shape(b, f"conv{n}d's weight", 1)[2:]
            dil = int_tuple(dilation, n)
            if padding == "valid":
                padding = 0
            else:  # "same": PyTorch pads the extra element of an even kernel at the end
                totals = [d * (k - 1) for d, k in zip(dil, kernel)]
                begins = [t // 2 for t in totals]
                if any(t % 2 for t in totals):
                    rank = n + 2
                    pads = [0, 0] + begins + [0, 0] + [t - t // 2 for t in totals]
                    x = b.call(shaping.pad, x, pads=tuple(pads[:rank] + pads[rank:]))
                    padding = 0
                else:
                    padding = begins
        return _convolution(b, x, w, bias, int_tuple(stride, n), int_tuple(padding, n),
                            int_tuple(dilation, n), False, [0] * n, groups)
    return rule


def _batch_norm_op(b: Any, x: Any, weight: Any, bias: Any, mean: Any, var: Any, training: bool,
                   momentum: float, eps: float, cudnn_enabled: bool = True) -> Any:
    """``batch_norm`` in eval (training mode mutates the running statistics: such a
    program goes through torch's functionalization instead)."""
    if training:
        raise AnfirError("batch_norm in training mode outside torch's functionalization", b.loc)
    return b.call(structure.tuple_getitem, _batch_norm_eval(b, x, weight, bias, mean, var, momentum, eps), 0)


def _max_pool_op(n: int) -> Rule:
    inner = _max_pool_with_indices(n)

    def rule(b: Any, x: Any, kernel: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
             ceil_mode: bool = False) -> Any:
        return b.call(structure.tuple_getitem, inner(b, x, kernel, stride, padding, dilation, ceil_mode), 0)
    return rule


def rules(torch: Any, table: RuleTable) -> None:
    """Add this family's rules to ``table``."""
    aten = torch.ops.aten
    put, named = table.put, table.named
    put(aten._native_batch_norm_legit_no_training.default, _batch_norm_eval)
    put(aten.convolution.default, _convolution)
    for n in (1, 2, 3):
        for name, rule in ((f"max_pool{n}d_with_indices", _max_pool_with_indices(n)),
                           (f"avg_pool{n}d", _avg_pool(n)),
                           (f"_adaptive_avg_pool{n}d", _adaptive_avg_pool(n))):
            op = getattr(aten, name, None)
            if op is not None:
                put(op.default, rule)
    for n in (1, 2, 3):
        named(f"conv{n}d", "default", _conv_nd(n))
        named(f"conv{n}d", "padding", _conv_nd(n))
        named(f"max_pool{n}d", "default", _max_pool_op(n))
        named(f"adaptive_avg_pool{n}d", "default", _adaptive_avg_pool(n))
    named("batch_norm", "default", _batch_norm_op)
    named("_native_batch_norm_legit", "default", _batch_norm_train)
    named("_native_batch_norm_legit", "no_stats", _batch_norm_train)
    named("_native_batch_norm_legit_functional", "default", _batch_norm_functional)
    named("avg_pool2d_backward", "default", _avg_pool2d_backward)
    named("_adaptive_avg_pool2d_backward", "default", _adaptive_avg_pool2d_backward)
    named("max_pool2d_with_indices_backward", "default", _max_pool2d_backward)
    named("convolution_backward", "default", _convolution_backward)

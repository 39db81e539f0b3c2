"""The torch.export rules whose result is built from
:mod:`anfir.primitives.nn`: softmax, layer/group/instance norm (and their
backward ops), attention, dropout, weight norm, the recurrent layers.

See :mod:`anfir.interop.torch.rules.common` for the rule protocol.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anfir.errors import AnfirError
from anfir.interop.torch.rules.common import Rule, RuleTable, array_node, arg_shape, static_arg_shape
from anfir.interop.torch.rules.conv import channel_fill
from anfir.primitives import arith, conv, elementwise, indexing, nn, reduce, shaping, structure, tensor


def _softmax_core(b: Any, x: Any, dim: int, log: bool) -> Any:
    """(log) softmax along ``dim`` as anfir's ``softmax`` / ``log_softmax`` primitive —
    what ONNX's importer makes of ``Softmax`` / ``LogSoftmax``, so a model gives the same
    graph by either route.  Their gradient rules are PyTorch's backward formulas
    (``out * (g - sum(g * out))``, ``g - exp(out) * sum(g)``)."""
    return b.call(nn.log_softmax if log else nn.softmax, x, axis=int(dim))


def _softmax(b: Any, x: Any, dim: int, half_to_float: bool = False) -> Any:
    return _softmax_core(b, x, dim, log=False)


def _log_softmax(b: Any, x: Any, dim: int, half_to_float: bool = False) -> Any:
    return _softmax_core(b, x, dim, log=True)


def _layer_norm(b: Any, x: Any, normalized_shape: Any, weight: Any, bias: Any, eps: float) -> Any:
    """``native_layer_norm`` -> ``(out, mean, rstd)``: ``out`` is anfir's ``layer_norm``
    primitive (as ONNX's ``LayerNormalization`` imports; its gradient rule is PyTorch's
    formula), the saved statistics are composed beside it (a program that does not read
    them loses them to dead-code elimination).  A bias without a weight, which
    ``layer_norm`` cannot take, is the composition throughout."""
    rank = b.rank(b.fx_node.args[0])
    axes = tuple(range(rank - len(normalized_shape), rank))
    mean = b.call(tensor.mean, x, axis=axes, keepdims=True)
    centered = b.call(arith.sub, x, mean)
    var = b.call(tensor.mean, b.call(arith.mul, centered, centered), axis=axes, keepdims=True)
    rstd = b.call(elementwise.rsqrt, b.call(arith.add, var, float(eps)))
    if weight is None and bias is not None:
        out = b.call(arith.add, b.call(arith.mul, centered, rstd), bias)
    else:
        args = [x] + [a for a in (weight, bias) if a is not None]
        out = b.call(nn.layer_norm, *args, axis=-len(normalized_shape), eps=float(eps))
    return b.call(structure.make_tuple, out, mean, rstd)


def _sdpa(b: Any, q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0,
          is_causal: bool = False, *, scale: Any = None, enable_gqa: bool = False) -> Any:
    """``scaled_dot_product_attention`` (kept whole, not decomposed) -> anfir's
    ``attention`` (same mask convention: a bool mask keeps, a float one adds;
    causal is top-left).  With ``enable_gqa`` each key/value head serves
    ``heads / kv_heads`` query heads: they are repeated with a ``gather`` along the
    head axis.  Dropout (training) is refused."""
    if float(dropout_p) != 0.0:
        raise AnfirError("scaled_dot_product_attention with dropout_p > 0 (training-mode dropout)",
                         b.loc)
    if enable_gqa:
        heads = b.fx_node.args[0].meta["val"].shape[-3]
        kv_heads = b.fx_node.args[1].meta["val"].shape[-3]
        if not (isinstance(heads, int) and isinstance(kv_heads, int)) or heads % kv_heads:
            raise AnfirError("grouped-query attention with dynamic or uneven head counts", b.loc)
        if heads != kv_heads:
            rows = array_node(b, np.arange(heads, dtype=np.int64) // (heads // kv_heads))
            k = b.call(indexing.gather, k, rows, axis=-3)
            v = b.call(indexing.gather, v, rows, axis=-3)
    args = [q, k, v] if attn_mask is None else [q, k, v, attn_mask]
    return b.call(nn.attention, *args, scale=None if scale is None else float(scale),
                  causal=bool(is_causal))


def _layer_norm_whole(b: Any, x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None,
                      eps: float = 1e-5, cudnn_enable: bool = True) -> Any:
    """``layer_norm`` (kept whole): anfir's ``layer_norm`` primitive over the trailing
    ``normalized_shape`` axes (one kernel, its own gradient rule); a bias without a
    weight is the ``native_layer_norm`` composition."""
    if weight is None and bias is not None:
        return b.call(structure.tuple_getitem, _layer_norm(b, x, normalized_shape, weight, bias, eps), 0)
    args = [x] + [a for a in (weight, bias) if a is not None]
    return b.call(nn.layer_norm, *args, axis=-len(normalized_shape), eps=float(eps))


# -- normalisation ---------------------------------------------------------------------------
def _group_stats(b: Any, x: Any, n: Any, groups: int) -> tuple[Any, Any, Any]:
    """x as (N, G, rest), its mean and biased variance over ``rest`` (kept)."""
    grouped = b.call(tensor.reshape, x, b.tuple_of((n, groups, -1)))
    mean = b.call(tensor.mean, grouped, axis=2, keepdims=True)
    centered = b.call(arith.sub, grouped, mean)
    var = b.call(tensor.mean, b.call(arith.mul, centered, centered), axis=2, keepdims=True)
    return grouped, mean, var


def _native_group_norm(b: Any, x: Any, weight: Any, bias: Any, n: Any, c: Any, hxw: Any,
                       group: int, eps: float) -> Any:
    """``native_group_norm`` -> ``(out, mean, rstd)``: ``out`` is anfir's ``group_norm``
    primitive (what ONNX's ``GroupNormalization`` imports as; its gradient rule is
    PyTorch's formula), with scale 1 / bias 0 when the norm has none; the saved
    statistics are composed beside it (dead code when nothing reads them)."""
    groups = int(group)
    grouped, mean, var = _group_stats(b, x, n, groups)
    rstd = b.call(elementwise.rsqrt, b.call(arith.add, var, float(eps)))
    fx_x = b.fx_node.args[0]
    weight = channel_fill(b, fx_x, tensor.ones) if weight is None else weight
    bias = channel_fill(b, fx_x, tensor.zeros) if bias is None else bias
    out = b.call(nn.group_norm, x, groups, weight, bias, eps=float(eps))
    flat = b.tuple_of((n, groups))
    return b.call(structure.make_tuple, out, b.call(tensor.reshape, mean, flat),
                  b.call(tensor.reshape, rstd, flat))


def _native_dropout(b: Any, x: Any, p: float, train: Any) -> Any:
    """``native_dropout`` in eval (``train`` false): ``(x, all-true mask)``; training
    dropout draws random numbers and is refused."""
    if train:
        raise AnfirError("native_dropout in training mode (random numbers)", b.loc)
    return b.call(structure.make_tuple, b.call(structure.identity, x),
                  b.call(tensor.cast, b.call(tensor.ones_like, x), "bool"))


def _layer_norm_backward(b: Any, grad: Any, x: Any, normalized_shape: Any, mean: Any, rstd: Any,
                         weight: Any, bias: Any, output_mask: Any) -> Any:
    """``native_layer_norm_backward``: PyTorch's formula — dx = rstd · (g − mean(g) −
    x̂ · mean(g · x̂)) with g the output gradient times the weight; the weight's
    gradient sums grad · x̂, the bias's grad, over the leading axes."""
    rank = len(arg_shape(b, 1))
    axes = tuple(range(rank - len(normalized_shape), rank))
    lead = tuple(range(rank - len(normalized_shape)))
    xhat = b.call(arith.mul, b.call(arith.sub, x, mean), rstd)
    g = grad if weight is None else b.call(arith.mul, grad, weight)
    mean_g = b.call(tensor.mean, g, axis=axes, keepdims=True)
    mean_gx = b.call(tensor.mean, b.call(arith.mul, g, xhat), axis=axes, keepdims=True)
    dx = b.call(arith.mul, rstd, b.call(arith.sub, b.call(arith.sub, g, mean_g),
                                           b.call(arith.mul, xhat, mean_gx)))
    mask = list(output_mask)
    dw = (b.call(tensor.sum_, b.call(arith.mul, grad, xhat), axis=lead or None)
          if mask[1] and weight is not None else None)
    db = b.call(tensor.sum_, grad, axis=lead or None) if mask[2] and bias is not None else None
    return b.call(structure.make_tuple, dx if mask[0] else None, dw, db)


def _group_norm_backward(b: Any, grad: Any, x: Any, mean: Any, rstd: Any, weight: Any, n: Any,
                         c: Any, hxw: Any, group: int, output_mask: Any) -> Any:
    """``native_group_norm_backward``: the layer-norm formula per (sample, group)."""
    shape = static_arg_shape(b, "native_group_norm_backward", 1)
    rank, groups, channels = len(shape), int(group), shape[1]
    per_channel = (-1,) + (1,) * (rank - 2)
    g = grad if weight is None else b.call(
        arith.mul, grad, b.call(tensor.reshape, weight, b.tuple_of(per_channel)))
    view = b.tuple_of((shape[0], groups, -1))
    gg = b.call(tensor.reshape, g, view)
    xg = b.call(tensor.reshape, x, view)
    m = b.call(tensor.reshape, mean, b.tuple_of((shape[0], groups, 1)))
    r = b.call(tensor.reshape, rstd, b.tuple_of((shape[0], groups, 1)))
    xhat = b.call(arith.mul, b.call(arith.sub, xg, m), r)
    mean_g = b.call(tensor.mean, gg, axis=2, keepdims=True)
    mean_gx = b.call(tensor.mean, b.call(arith.mul, gg, xhat), axis=2, keepdims=True)
    dx = b.call(arith.mul, r, b.call(arith.sub, b.call(arith.sub, gg, mean_g),
                                        b.call(arith.mul, xhat, mean_gx)))
    dx = b.call(tensor.reshape, dx, b.tuple_of(shape))
    xhat_full = b.call(tensor.reshape, xhat, b.tuple_of(shape))
    batch_axes = (0,) + tuple(range(2, rank))
    mask = list(output_mask)
    dw = (b.call(tensor.sum_, b.call(arith.mul, grad, xhat_full), axis=batch_axes)
          if mask[1] and weight is not None else None)
    db = b.call(tensor.sum_, grad, axis=batch_axes) if mask[2] else None
    del channels
    return b.call(structure.make_tuple, dx if mask[0] else None, dw, db)


def _instance_norm_op(b: Any, x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                      use_input_stats: bool, momentum: float, eps: float,
                      cudnn_enabled: bool = True) -> Any:
    """``instance_norm``: anfir's ``instance_norm`` (ONNX's ``InstanceNormalization``)
    over each sample's own statistics; with the running statistics instead
    (``use_input_stats`` false: eval with ``track_running_stats``), ``batch_norm``.
    Updating running statistics (training with them) is a mutation: such a program
    goes through torch's functionalization (see :func:`needs_functionalization`)."""
    fx_x = b.fx_node.args[0]
    weight = channel_fill(b, fx_x, tensor.ones) if weight is None else weight
    bias = channel_fill(b, fx_x, tensor.zeros) if bias is None else bias
    if not use_input_stats:
        return b.call(conv.batch_norm, x, weight, bias, running_mean, running_var, eps=float(eps))
    if running_mean is not None:
        raise AnfirError("instance_norm updating running statistics outside torch's "
                         "functionalization", b.loc)
    return b.call(nn.instance_norm, x, weight, bias, eps=float(eps))


def _group_norm_op(b: Any, x: Any, groups: int, weight: Any = None, bias: Any = None,
                   eps: float = 1e-5, cudnn_enabled: bool = True) -> Any:
    shape = arg_shape(b)
    hxw = 1
    for d in shape[2:]:
        hxw = hxw * d
    n = b.importer.size_value(shape[0], b)
    trio = _native_group_norm(b, x, weight, bias, n, shape[1], hxw, groups, eps)
    return b.call(structure.tuple_getitem, trio, 0)


def _dropout_op(b: Any, x: Any, p: float = 0.5, train: Any = False) -> Any:
    if train and float(p) > 0.0:
        raise AnfirError("dropout in training mode (random numbers)", b.loc)
    return b.call(structure.identity, x)


def _softmax_op(log: bool) -> Rule:
    def rule(b: Any, x: Any, dim: int, dtype: Any = None, **_: Any) -> Any:
        if dtype is not None:
            x = b.call(tensor.cast, x, dtype)
        return _softmax_core(b, x, dim, log=log)
    return rule


def _recurrent(kind: str) -> Rule:
    """``lstm.input`` / ``gru.input`` (``nn.LSTM``, ``nn.GRU``; layers, bidirectional,
    batch-first): unrolled over the static time axis — each direction's input
    projections in one ``matmul``, then one cell per step, PyTorch's gate order
    (LSTM: input, forget, cell, output; GRU: reset, update, new).  Returns
    ``(output, h_n[, c_n])``; dropout between layers only in training (refused)."""
    gates = 4 if kind == "lstm" else 3

    def rule(b: Any, x: Any, hx: Any, params: Any, has_biases: bool, num_layers: int,
             dropout: float, train: bool, bidirectional: bool, batch_first: bool) -> Any:
        if train and float(dropout) > 0.0 and int(num_layers) > 1:
            raise AnfirError(f"{kind} with dropout in training mode", b.loc)
        shape = arg_shape(b)
        steps = shape[1] if batch_first else shape[0]
        if not isinstance(steps, int):
            raise AnfirError(f"{kind} over a dynamic number of time steps", b.loc)
        dirs = 2 if bidirectional else 1
        per = 4 if has_biases else 2
        if len(params) != int(num_layers) * dirs * per:
            raise AnfirError(f"{kind} with projections (proj_size)", b.loc)
        seq = b.call(tensor.transpose, x, b.tuple_of((1, 0, 2))) if batch_first else x
        h0 = hx[0] if isinstance(hx, (list, tuple)) else hx
        c0 = hx[1] if kind == "lstm" else None
        finals_h, finals_c = [], []
        layer_in = seq
        for layer in range(int(num_layers)):
            outs = []
            for d in range(dirs):
                k = (layer * dirs + d) * per
                w_ih, w_hh = params[k], params[k + 1]
                b_ih, b_hh = (params[k + 2], params[k + 3]) if has_biases else (None, None)
                h = b.call(indexing.gather, h0, b.call(tensor.cast, layer * dirs + d, "i64"), axis=0)
                c = (b.call(indexing.gather, c0, b.call(tensor.cast, layer * dirs + d, "i64"), axis=0)
                     if c0 is not None else None)
                proj = b.call(tensor.matmul, layer_in, b.call(tensor.transpose, w_ih))
                if b_ih is not None:
                    proj = b.call(arith.add, proj, b_ih)
                pieces = b.call(shaping.split, proj, sizes=(1,) * steps, axis=0)
                w_hh_t = b.call(tensor.transpose, w_hh)
                order = range(steps) if d == 0 else range(steps - 1, -1, -1)
                hs: dict[int, Any] = {}
                for t in order:
                    xi = b.call(shaping.squeeze, b.call(structure.tuple_getitem, pieces, t), axis=0)
                    hh = b.call(tensor.matmul, h, w_hh_t)
                    if b_hh is not None:
                        hh = b.call(arith.add, hh, b_hh)
                    if kind == "lstm":
                        z = b.call(shaping.split, b.call(arith.add, xi, hh), sizes=gates, axis=-1)
                        i_, f_, g_, o_ = (b.call(structure.tuple_getitem, z, j) for j in range(4))
                        i_, f_, o_ = (b.call(arith.sigmoid, v) for v in (i_, f_, o_))
                        c = b.call(arith.add, b.call(arith.mul, f_, c),
                                   b.call(arith.mul, i_, b.call(arith.tanh, g_)))
                        h = b.call(arith.mul, o_, b.call(arith.tanh, c))
                    else:
                        xs = b.call(shaping.split, xi, sizes=gates, axis=-1)
                        hs3 = b.call(shaping.split, hh, sizes=gates, axis=-1)
                        xr, xz, xn = (b.call(structure.tuple_getitem, xs, j) for j in range(3))
                        hr, hz, hn = (b.call(structure.tuple_getitem, hs3, j) for j in range(3))
                        r = b.call(arith.sigmoid, b.call(arith.add, xr, hr))
                        u = b.call(arith.sigmoid, b.call(arith.add, xz, hz))
                        n = b.call(arith.tanh, b.call(arith.add, xn, b.call(arith.mul, r, hn)))
                        h = b.call(arith.add, n, b.call(arith.mul, u, b.call(arith.sub, h, n)))
                    hs[t] = h
                outs.append(b.call(shaping.stack, b.tuple_of([hs[t] for t in range(steps)]), axis=0))
                finals_h.append(h)
                if c is not None:
                    finals_c.append(c)
            layer_in = outs[0] if dirs == 1 else b.call(shaping.concat, b.tuple_of(outs), axis=-1)
        out = b.call(tensor.transpose, layer_in, b.tuple_of((1, 0, 2))) if batch_first else layer_in
        results = [out, b.call(shaping.stack, b.tuple_of(finals_h), axis=0)]
        if kind == "lstm":
            results.append(b.call(shaping.stack, b.tuple_of(finals_c), axis=0))
        return b.call(structure.make_tuple, *results)
    return rule


def _weight_norm(b: Any, v: Any, g: Any, dim: int = 0) -> Any:
    """``_weight_norm``: ``v * g / ‖v‖`` with the norm over every axis but ``dim``."""
    rank = len(arg_shape(b))
    axes = tuple(a for a in range(rank) if a != int(dim) % rank) if int(dim) != -1 else None
    norm = b.call(reduce.norm, v, ord=2, axis=axes, keepdims=True)
    return b.call(arith.mul, v, b.call(arith.div, g, norm))


def rules(torch: Any, table: RuleTable) -> None:
    """Add this family's rules to ``table``."""
    aten = torch.ops.aten
    put, named = table.put, table.named
    put(aten.scaled_dot_product_attention.default, _sdpa)
    put(aten.layer_norm.default, _layer_norm_whole)
    put(aten._softmax.default, _softmax)
    put(aten._log_softmax.default, _log_softmax)
    put(aten.native_layer_norm.default, _layer_norm)
    named("group_norm", "default", _group_norm_op)
    named("instance_norm", "default", _instance_norm_op)
    for name in ("dropout", "feature_dropout", "alpha_dropout"):
        named(name, "default", _dropout_op)
    named("softmax", "int", _softmax_op(False))
    named("log_softmax", "int", _softmax_op(True))
    named("lstm", "input", _recurrent("lstm"))
    named("_weight_norm", "default", _weight_norm)
    named("gru", "input", _recurrent("gru"))
    named("native_group_norm", "default", _native_group_norm)
    named("native_dropout", "default", _native_dropout)
    named("native_layer_norm_backward", "default", _layer_norm_backward)
    named("native_group_norm_backward", "default", _group_norm_backward)

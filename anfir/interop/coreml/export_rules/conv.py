"""The Core ML (MIL) export rules of the operators of :mod:`anfir.primitives.conv` (a ``max_pool``
with dilation, and the pooling
gradients, from the windows of the padded input placed back by a ``conv_transpose`` whose
kernels pick one offset each; conv's weight gradient as a ``conv`` over the batch axis).

See :mod:`anfir.interop.coreml.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from anfir.dtypes import is_float
from anfir.errors import ExportError
from anfir.flat.statements import Op, Operand, shape_of_type
from anfir.interop.export_common import conv_geometry, conv_params_of, zero_array
from anfir.interop.coreml.export_rules.common import (MilRule, _bind_identity, _expand_dims, _i32, _is_none,
                                                      _scalar, _shape, _shape_var, _slice, _static)
from anfir.ir.primitive import Primitive
from anfir.primitives import conv

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.coreml.exporter import MilWriter


def _channel_view_of(w: MilWriter, v: Any, rank: int) -> Any:
    """A (C,) vector as (C, 1, ..., 1) against a tensor of ``rank``."""
    return _expand_dims(w, v, list(range(1, rank - 1)))


def _mil_pads(pads: Sequence[int], n: int) -> np.ndarray:
    """anfir's begins-then-ends pads as MIL's (begin, end) pairs per axis."""
    return _i32([p for k in range(n) for p in (pads[k], pads[n + k])])


def _conv_rule(w: MilWriter, op: Op) -> None:
    """MIL conv with custom pads (conv and conv_core); with a dilation, the windows of x
    (stacked) times the weight, by matmul per group (MIL refuses a dilated conv whose
    weight is computed, as a training graph's is)."""
    out = op.results[0]
    d = w.dtype(out)
    n, st, pads, dil, g = conv_params_of(w, op, op.args[0], op.args[1], "Core ML")
    x, weight = w.tensor(op.args[0], d), w.tensor(op.args[1], d)
    bias = w.tensor(op.args[2], d) if op.prim is conv.conv and len(op.args) > 2 \
        and not _is_none(op.args[2]) else None
    if all(v == 1 for v in dil):
        inputs: dict[str, Any] = {} if bias is None else {"bias": bias}
        w.bind(out, w.op("conv", out, x=x, weight=weight, strides=_i32(st), pad_type="custom",
                         pad=_mil_pads(pads, n), dilations=_i32(dil), groups=g, **inputs))
        return
    x_shape = conv_geometry(w, op.args[0], "conv", "Core ML")
    w_shape = _static(w, op.args[1], "conv")
    sizes = conv_geometry(w, out, "conv", "Core ML")[2:]
    kernel = w_shape[2:]
    count, cells = int(np.prod(kernel)), int(np.prod(sizes))
    windows = _windows(w, x, n, kernel, st, pads, dil, sizes, 0.0, d)   # (N, C, P..., K)
    cin, cout = x_shape[1] // g, w_shape[0] // g
    parts = []
    for group in range(g):
        part = windows if g == 1 else _slice(
            w, windows, [0, group * cin, *([0] * (n + 1))],
            [None, (group + 1) * cin, *sizes, count])
        rows = w.reshape(w.op("transpose", x=part, perm=_i32([0, *range(2, 2 + n), 1, 2 + n])),
                         _shape_var(w, x, [("dim", 0), cells, cin * count]))  # (N, P, C/g * K)
        kern = weight if g == 1 else _slice(w, weight, [group * cout, *([0] * (n + 1))],
                                            [(group + 1) * cout, *w_shape[1:]])
        kern = w.reshape(kern, _i32([cout, cin * count]))
        parts.append(w.op("matmul", x=rows, y=kern, transpose_y=True))   # (N, P, O/g)
    result = parts[0] if g == 1 else w.op("concat", values=parts, axis=2)
    result = w.reshape(w.op("transpose", x=result, perm=_i32([0, 2, 1])),
                       _shape_var(w, x, [("dim", 0), w_shape[0], *sizes]))
    if bias is not None:
        result = w.op("add", x=result, y=_channel_view_of(w, bias, n + 2))
    _bind_identity(w, out, result)


def _conv_transpose_rule(w: MilWriter, op: Op) -> None:
    """MIL conv_transpose; output_padding through its output_shape (static shapes)."""
    out = op.results[0]
    d = w.dtype(out)
    a = op.attrs
    n = len(_shape(w, op.args[1], "conv_transpose")) - 2
    st = conv.per_axis_ints(a.get("stride", 1), n, "stride", "conv_transpose")
    dil = conv.per_axis_ints(a.get("dilation", 1), n, "dilation", "conv_transpose")
    pads = [int(p) for p in conv.padding_attr(a.get("padding", 0), n, "conv_transpose", strings=False) or ()]
    inputs: dict[str, Any] = {"x": w.tensor(op.args[0], d), "weight": w.tensor(op.args[1], d)}
    if len(op.args) > 2 and not _is_none(op.args[2]):
        inputs["bias"] = w.tensor(op.args[2], d)
    shape = _out_shape(w, out)
    w.bind(out, w.op("conv_transpose", out, strides=_i32(st), pad_type="custom",
                     pad=_mil_pads(pads, n), dilations=_i32(dil),
                     groups=int(a.get("groups", 1)), output_shape=_i32(shape), **inputs))


def _out_shape(w: MilWriter, out: Any) -> tuple[int, ...]:
    shape = shape_of_type(out.type)
    if shape is None or not all(isinstance(s, (int, np.integer)) for s in shape):
        raise ExportError("a transposed convolution needs static shapes to export to Core ML",
                          w.loc)
    return tuple(int(s) for s in shape)


def _conv_input_grad(w: MilWriter, op: Op) -> None:
    """conv_transpose of dout whose output_shape is x's."""
    out = op.results[0]
    d = w.dtype(out)
    n, st, pads, dil, g = conv_params_of(w, op, op.args[2], op.args[1], "Core ML")
    w.bind(out, w.op("conv_transpose", out, x=w.tensor(op.args[0], d),
                     weight=w.tensor(op.args[1], d), strides=_i32(st), pad_type="custom",
                     pad=_mil_pads(pads, n), dilations=_i32(dil), groups=g,
                     output_shape=_i32(_static(w, op.args[2], "conv's input gradient"))))


def _conv_weight_grad(w: MilWriter, op: Op) -> None:
    """A conv with the batch as the contraction (x and dout with axes 0 and 1 exchanged,
    stride and dilation exchanged), the extra kernel positions sliced off."""
    out = op.results[0]
    d = w.dtype(out)
    x_shape = _static(w, op.args[0], "conv's weight gradient")
    dout_shape = _static(w, op.args[1], "conv's weight gradient")
    w_shape = _static(w, op.args[2], "conv's weight gradient")
    n, st, pads, dil, g = conv_params_of(w, op, op.args[0], op.args[2], "Core ML")
    spatial = list(range(2, 2 + n))
    x = w.tensor(op.args[0], d)
    batch, channels = x_shape[0], x_shape[1]
    if any(s != 1 for s in st):
        # The swapped conv would dilate its computed weight (dout), which MIL refuses.
        _weight_grad_by_windows(w, op, x, n, st, pads, dil, g, x_shape, dout_shape, w_shape)
        return
    if g == 1:
        xt = w.op("transpose", x=x, perm=_i32([1, 0, *spatial]))
    else:
        cin = channels // g
        grouped = w.reshape(x, _i32([batch, g, cin, *x_shape[2:]]))
        xt = w.reshape(w.op("transpose", x=grouped, perm=_i32([2, 1, 0, *range(3, 3 + n)])),
                       _i32([cin, g * batch, *x_shape[2:]]))
    dt = w.op("transpose", x=w.tensor(op.args[1], d), perm=_i32([1, 0, *spatial]))
    full = w.op("conv", x=xt, weight=dt, strides=_i32(dil), pad_type="custom",
                pad=_mil_pads(pads, n), dilations=_i32(st), groups=g)
    reach = [(i + pads[k] + pads[n + k] - s * (p - 1) - 1) // dl + 1 for k, (i, p, s, dl)
             in enumerate(zip(x_shape[2:], dout_shape[2:], st, dil))]
    if list(reach) != list(w_shape[2:]):
        full = _slice(w, full, [0] * (n + 2), [x_shape[1] // g, w_shape[0], *w_shape[2:]])
    w.bind(out, w.op("transpose", out, x=full, perm=_i32([1, 0, *spatial])))


def _weight_grad_by_windows(w: MilWriter, op: Op, x: Any, n: int, st: Sequence[int],
                            pads: Sequence[int], dil: Sequence[int], g: int,
                            x_shape: tuple[int, ...], dout_shape: tuple[int, ...],
                            w_shape: tuple[int, ...]) -> None:
    """dw[o, (c, k)] = dout[o, (n, p)] @ windows[(c, k), (n, p)] per group (matmul)."""
    out = op.results[0]
    d = w.dtype(out)
    kernel, sizes = w_shape[2:], dout_shape[2:]
    count, cells = int(np.prod(kernel)), int(np.prod(sizes))
    windows = _windows(w, x, n, kernel, st, pads, dil, sizes, 0.0, d)   # (N, C, P..., K)
    cols = w.reshape(w.op("transpose", x=windows, perm=_i32([1, 2 + n, 0, *range(2, 2 + n)])),
                     _i32([x_shape[1] * count, x_shape[0] * cells]))    # (C * K, N * P)
    rows = w.reshape(w.op("transpose", x=w.tensor(op.args[1], d), perm=_i32([1, 0, *range(2, 2 + n)])),
                     _i32([dout_shape[1], x_shape[0] * cells]))         # (O, N * P)
    cin, cout = x_shape[1] // g, w_shape[0] // g
    parts = []
    for group in range(g):
        r = rows if g == 1 else _slice(w, rows, [group * cout, 0],
                                       [(group + 1) * cout, x_shape[0] * cells])
        c = cols if g == 1 else _slice(w, cols, [group * cin * count, 0],
                                       [(group + 1) * cin * count, x_shape[0] * cells])
        parts.append(w.op("matmul", x=r, y=c, transpose_y=True))        # (O/g, C/g * K)
    result = parts[0] if g == 1 else w.op("concat", values=parts, axis=0)
    w.bind(out, w.reshape(result, _i32(w_shape), out))


def _pool_geometry(w: MilWriter, op: Op, x_op: Operand, dilation: bool
                   ) -> tuple[int, tuple[int, ...], tuple[int, ...], list[int], tuple[int, ...],
                              list[int], tuple[int, ...]]:
    """(n, kernel, stride, pads (ends widened for ceil mode), dilation, out sizes, x's shape)."""
    a = op.attrs
    shape = conv_geometry(w, x_op, op.prim.name, "Core ML")
    n, k, st, pads, dil, sizes = conv.pool_params(
        zero_array(shape), a.get("kernel"), a.get("stride"), a.get("padding", 0),
        a.get("dilation", 1) if dilation else 1, a.get("ceil_mode", False), op.prim.name)
    return n, k, st, pads, dil, sizes, shape


def _windows(w: MilWriter, x: Any, n: int, k: Sequence[int], st: Sequence[int],
             pads: Sequence[int], dil: Sequence[int], sizes: Sequence[int], fill: float,
             d: str) -> Any:
    """(N, C, out..., K): x padded with ``fill``, its window cells stacked last (one
    strided slice_by_index per kernel offset)."""
    if any(pads):
        flat = [p for j in range(n) for p in (pads[j], pads[n + j])]
        x = w.op("pad", x=x, pad=_i32(flat), mode="constant", constant_val=_scalar(fill, d))
    cells = []
    for offset in np.ndindex(*k):
        begin = [0, 0] + [o * dl for o, dl in zip(offset, dil)]
        end = [None, None] + [o * dl + (m - 1) * s + 1
                              for o, dl, m, s in zip(offset, dil, sizes, st)]
        cells.append(_slice(w, x, begin, end, [1, 1, *st]))
    if len(cells) == 1:
        return _expand_dims(w, cells[0], [2 + n])
    return w.op("stack", values=cells, axis=2 + n)


def _lowest(d: str) -> float:
    return -np.inf if is_float(d) else float(np.iinfo(np.int32).min)


def _max_pool(w: MilWriter, op: Op) -> None:
    """MIL max_pool; with a dilation (MIL's has none) the maximum of the stacked windows."""
    out = op.results[0]
    d = w.dtype(out)
    n, k, st, pads, dil, sizes, _ = _pool_geometry(w, op, op.args[0], True)
    x = w.tensor(op.args[0], d)
    if any(v != 1 for v in dil):
        windows = _windows(w, x, n, k, st, pads, dil, sizes, _lowest(d), d)
        w.bind(out, w.op("reduce_max", out, x=windows, axes=_i32([-1]), keep_dims=False))
        return
    w.bind(out, w.op("max_pool", out, x=x, kernel_sizes=_i32(k), strides=_i32(st),
                     pad_type="custom", pad=_mil_pads(pads, n)))


def _argmax_windows(w: MilWriter, op: Op, d: str) -> tuple[Any, tuple[Any, ...]]:
    """The kernel offset (flat) of each window's first maximum, and the geometry."""
    geometry = _pool_geometry(w, op, op.args[0], True)
    n, k, st, pads, dil, sizes, _ = geometry
    windows = _windows(w, w.tensor(op.args[0], d), n, k, st, pads, dil, sizes, _lowest(d), d)
    return w.op("reduce_argmax", x=windows, axis=-1, keep_dims=False), geometry


def _max_pool_select(w: MilWriter, op: Op) -> None:
    """g's windows (stacked) read at x's windows' first maxima (gather_along_axis)."""
    out = op.results[0]
    d = w.dtype(out)
    pick, (n, k, st, pads, dil, sizes, _) = _argmax_windows(w, op, d)
    g_windows = _windows(w, w.tensor(op.args[1], d), n, k, st, pads, dil, sizes, 0.0, d)
    picked = w.op("gather_along_axis", x=g_windows, indices=_expand_dims(w, pick, [2 + n]),
                  axis=2 + n)
    w.bind(out, w.op("squeeze", out, x=picked, axes=_i32([2 + n])))


def _place(w: MilWriter, spread: Any, n: int, pads: Sequence[int], shape: tuple[int, ...],
           out: Any) -> Any:
    """A conv_transpose result on the padded grid cropped (and zero-padded) to x's shape."""
    full = list(spread.shape[2:])
    grow = [max(pads[j] + shape[2 + j] - full[j], 0) for j in range(n)]
    if any(grow):
        spread = w.op("pad", x=spread, pad=_i32([p for g in grow for p in (0, g)]),
                      mode="constant", constant_val=np.float32(0))
    begin = [0, 0, *pads[:n]]
    end = [shape[0], shape[1], *[pads[j] + shape[2 + j] for j in range(n)]]
    return w.op("slice_by_index", out, x=spread, begin=_i32(begin), end=_i32(end),
                stride=_i32([1] * (n + 2)))


def _spread(w: MilWriter, planes: Any, weight: np.ndarray, groups: int, n: int,
            st: Sequence[int], dil: Sequence[int], sizes: Sequence[int], d: str) -> Any:
    """conv_transpose of (N, groups * K, out...) by constant one-channel kernels: each
    value added to the cells of its window on the padded grid."""
    full = [(m - 1) * s + dl * (kk - 1) + 1
            for m, s, dl, kk in zip(sizes, st, dil, weight.shape[2:])]
    return w.op("conv_transpose", x=planes, weight=w.const(weight, d), strides=_i32(st),
                pad_type="custom", pad=_i32([0] * (2 * n)), dilations=_i32(dil), groups=groups,
                output_shape=_i32([planes.shape[0], groups, *full]))


def _max_pool_grad(w: MilWriter, op: Op) -> None:
    """dout routed to each window's first maximum: per kernel offset, dout where that
    offset holds the maximum, as K channels per channel, placed back by a grouped
    conv_transpose whose kernel j is 1 at offset j only; cropped to x's shape."""
    out = op.results[0]
    d = w.dtype(out)
    _static(w, op.args[0], "max pooling's gradient")  # the planes' reshape names the batch
    pick, (n, k, st, pads, dil, sizes, shape) = _argmax_windows(w, op, d)
    count = int(np.prod(k))
    hit = w.op("equal", x=_expand_dims(w, pick, [2 + n]), y=w.const(np.arange(count), "i32"))
    routed = w.op("mul", x=w.cast(hit, d), y=_expand_dims(w, w.tensor(op.args[1], d), [2 + n]))
    planes = w.op("transpose", x=routed, perm=_i32([0, 1, 2 + n, *range(2, 2 + n)]))
    planes = w.reshape(planes, _i32([shape[0], shape[1] * count, *sizes]))
    weight = np.tile(np.eye(count).reshape(count, 1, *k), (shape[1], 1, *([1] * n)))
    spread = _spread(w, planes, weight, shape[1], n, st, dil, sizes, d)
    w.bind(out, _place(w, spread, n, pads, shape, out))


def _avg_pool(w: MilWriter, op: Op) -> None:
    """MIL avg_pool; in ceil mode (where MIL's windows past the end may differ from
    PyTorch's) the stacked windows' sum over anfir's divisor."""
    out = op.results[0]
    d = w.dtype(out)
    n, k, st, pads, _, sizes, shape = _pool_geometry(w, op, op.args[0], False)
    x = w.tensor(op.args[0], d)
    include = bool(op.attrs.get("count_include_pad", True))
    if op.attrs.get("ceil_mode"):
        given = [int(p) for p in conv.padding_attr(op.attrs.get("padding", 0), n, "avg_pool",
                                             strings=False) or ()]
        divisor = conv.avg_divisor(shape, n, k, st, pads, given, sizes, include)
        windows = _windows(w, x, n, k, st, pads, (1,) * n, sizes, 0.0, d)
        total = w.op("reduce_sum", x=windows, axes=_i32([-1]), keep_dims=False)
        w.bind(out, w.op("real_div", out, x=total, y=w.const(divisor, d)))
        return
    w.bind(out, w.op("avg_pool", out, x=x, kernel_sizes=_i32(k), strides=_i32(st),
                     pad_type="custom", pad=_mil_pads(pads, n),
                     exclude_padding_from_average=not include))


def _avg_pool_grad(w: MilWriter, op: Op) -> None:
    """dout over each window's count (a constant), spread over its window by a grouped
    conv_transpose with a kernel of ones, cropped to x's shape."""
    out = op.results[0]
    d = w.dtype(out)
    _static(w, op.args[1], "average pooling's gradient")  # conv_transpose's output_shape
    n, k, st, pads, _, sizes, shape = _pool_geometry(w, op, op.args[1], False)
    include = bool(op.attrs.get("count_include_pad", True))
    given = [int(p) for p in conv.padding_attr(op.attrs.get("padding", 0), n, "avg_pool",
                                         strings=False) or ()]
    divisor = conv.avg_divisor(shape, n, k, st, pads, given, sizes, include)
    scaled = w.op("real_div", x=w.tensor(op.args[0], d), y=w.const(divisor, d))
    spread = _spread(w, scaled, np.ones((shape[1], 1, *k)), shape[1], n, st, (1,) * n, sizes, d)
    w.bind(out, _place(w, spread, n, pads, shape, out))


def _batch_norm(w: MilWriter, op: Op) -> None:
    """(x - mean) * scale / sqrt(var + eps) + bias per channel, in the model's dtype
    (MIL's batch_norm wants constant statistics; a training graph feeds them)."""
    out = op.results[0]
    d = w.dtype(out)
    rank = len(_shape(w, op.args[0], "batch_norm"))
    x, scale, bias, mean, var = (w.tensor(a, d) for a in op.args)
    inv = w.op("real_div", x=scale, y=w.op("sqrt", x=w.op(
        "add", x=var, y=w.const(float(op.attrs.get("eps", 1e-5)), d))))
    centred = w.op("sub", x=x, y=_channel_view_of(w, mean, rank))
    scaled = w.op("mul", x=centred, y=_channel_view_of(w, inv, rank))
    w.bind(out, w.op("add", out, x=scaled, y=_channel_view_of(w, bias, rank)))


RULES: dict[Primitive, MilRule] = {
    conv.conv: _conv_rule,
    conv.conv_core: _conv_rule,
    conv.conv_transpose: _conv_transpose_rule,
    conv.conv_input_grad: _conv_input_grad,
    conv.conv_weight_grad: _conv_weight_grad,
    conv.max_pool: _max_pool,
    conv.max_pool_grad: _max_pool_grad,
    conv.max_pool_select: _max_pool_select,
    conv.avg_pool: _avg_pool,
    conv.avg_pool_grad: _avg_pool_grad,
    conv.batch_norm: _batch_norm,
}
"""This family's primitive object → the rule writing its MIL ops (merged into
:data:`anfir.interop.coreml.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported to MIL, with the reason."""

"""The ONNX export rules of the operators of :mod:`anfir.primitives.conv`: convolution, pooling,
batch norm and
their gradients.

See :mod:`anfir.interop.onnx.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from anfir.flat.statements import Const, Op, Operand
from anfir.interop.export_common import conv_geometry, conv_params_of, static_shape, zero_array
from anfir.interop.onnx.export_rules.common import OnnxRule, rank_of
from anfir.ir.primitive import Primitive
from anfir.primitives import conv

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.onnx.exporter import OnnxWriter


def _conv_attrs(w: OnnxWriter, op: Op, n: int) -> dict[str, Any]:
    """Conv's strides, dilations, group and pads (or auto_pad for "same"/"valid")."""
    a = op.attrs
    attrs: dict[str, Any] = {
        "strides": list(conv.per_axis_ints(a.get("stride", 1), n, "stride", "conv")),
        "dilations": list(conv.per_axis_ints(a.get("dilation", 1), n, "dilation", "conv")),
        "group": int(a.get("groups", 1))}
    padding = a.get("padding", 0)
    if padding == "same":
        attrs["auto_pad"] = "SAME_UPPER"  # begins get the smaller half, as the op library
    elif padding == "valid":
        attrs["pads"] = [0] * (2 * n)
    else:
        attrs["pads"] = [int(p) for p in conv.padding_attr(padding, n, "conv", strings=False) or ()]
    return attrs


def _bias_operand(op: Op) -> Optional[Operand]:
    if len(op.args) > 2 and not (isinstance(op.args[2], Const) and op.args[2].value is None):
        return op.args[2]
    return None


def _conv(w: OnnxWriter, op: Op) -> None:
    """Conv (conv and conv_core: the attributes map one to one)."""
    out = op.results[0]
    d = w.dtype(out)
    n = rank_of(w, op.args[1], "conv") - 2
    inputs = [w.tensor(op.args[0], d), w.tensor(op.args[1], d)]
    bias = _bias_operand(op) if op.prim is conv.conv else None
    if bias is not None:
        inputs.append(w.tensor(bias, d))
    w.node("Conv", inputs, [out.name], **_conv_attrs(w, op, n))


def _conv_transpose(w: OnnxWriter, op: Op) -> None:
    """ConvTranspose with PyTorch's attributes (ONNX's definition is the same)."""
    out = op.results[0]
    d = w.dtype(out)
    n = rank_of(w, op.args[1], "conv_transpose") - 2
    a = op.attrs
    inputs = [w.tensor(op.args[0], d), w.tensor(op.args[1], d)]
    bias = _bias_operand(op)
    if bias is not None:
        inputs.append(w.tensor(bias, d))
    w.node("ConvTranspose", inputs, [out.name],
           strides=list(conv.per_axis_ints(a.get("stride", 1), n, "stride", "conv_transpose")),
           dilations=list(conv.per_axis_ints(a.get("dilation", 1), n, "dilation", "conv_transpose")),
           output_padding=list(conv.per_axis_ints(a.get("output_padding", 0), n, "output_padding",
                                        "conv_transpose", least=0)),
           pads=[int(p) for p in conv.padding_attr(a.get("padding", 0), n, "conv_transpose",
                                          strings=False) or ()],
           group=int(a.get("groups", 1)))


def _conv_input_grad(w: OnnxWriter, op: Op) -> None:
    """ConvTranspose of dout, its output_padding chosen so the result has x's shape."""
    out = op.results[0]
    d = w.dtype(out)
    dout_shape = conv_geometry(w, op.args[0], "conv's input gradient", "ONNX")
    w_shape = static_shape(w, op.args[1], "conv's input gradient", "ONNX")
    x_shape = conv_geometry(w, op.args[2], "conv's input gradient", "ONNX")
    n, st, pads, dil, g = conv_params_of(w, op, op.args[2], op.args[1], "ONNX")
    extra = [i - ((o - 1) * s - pads[k] - pads[n + k] + dl * (kk - 1) + 1)
             for k, (i, o, s, dl, kk) in enumerate(zip(x_shape[2:], dout_shape[2:], st, dil,
                                                        w_shape[2:]))]
    w.node("ConvTranspose", [w.tensor(op.args[0], d), w.tensor(op.args[1], d)], [out.name],
           strides=list(st), dilations=list(dil), pads=list(pads), output_padding=extra, group=g)


def _pool_attrs(op: Op, n: int, dilation: bool) -> dict[str, Any]:
    a = op.attrs
    kernel = conv.per_axis_ints(a.get("kernel"), n, "kernel", op.prim.name)
    stride = a.get("stride")
    attrs: dict[str, Any] = {
        "kernel_shape": list(kernel),
        "strides": list(kernel if stride is None else conv.per_axis_ints(stride, n, "stride", op.prim.name)),
        "pads": [int(p) for p in conv.padding_attr(a.get("padding", 0), n, op.prim.name, strings=False) or ()],
        "ceil_mode": int(bool(a.get("ceil_mode", False)))}
    if dilation:
        attrs["dilations"] = list(conv.per_axis_ints(a.get("dilation", 1), n, "dilation", op.prim.name))
    return attrs


def _pool_rank(w: OnnxWriter, op: Op) -> int:
    kernel = op.attrs.get("kernel")
    return len(kernel) if isinstance(kernel, tuple) else rank_of(w, op.args[0], op.prim.name) - 2


def _max_pool(w: OnnxWriter, op: Op) -> None:
    """MaxPool (kernel_shape, strides, pads, dilations, ceil_mode)."""
    out = op.results[0]
    w.node("MaxPool", [w.tensor(op.args[0], w.dtype(out))], [out.name],
           **_pool_attrs(op, _pool_rank(w, op), True))


def _avg_pool(w: OnnxWriter, op: Op) -> None:
    """AveragePool (count_include_pad as asked)."""
    out = op.results[0]
    w.node("AveragePool", [w.tensor(op.args[0], w.dtype(out))], [out.name],
           count_include_pad=int(bool(op.attrs.get("count_include_pad", True))),
           **_pool_attrs(op, _pool_rank(w, op), False))


def _global_pool(op_type: str) -> OnnxRule:
    def rule(w: OnnxWriter, op: Op) -> None:
        out = op.results[0]
        w.node(op_type, [w.tensor(op.args[0], w.dtype(out))], [out.name])
    rule.__doc__ = op_type
    return rule


def _batch_norm(w: OnnxWriter, op: Op) -> None:
    """BatchNormalization in inference mode (running statistics)."""
    out = op.results[0]
    d = w.dtype(out)
    w.node("BatchNormalization", [w.tensor(a, d) for a in op.args], [out.name],
           epsilon=float(op.attrs.get("eps", 1e-5)))


def _conv_weight_grad(w: OnnxWriter, op: Op) -> None:
    """A Conv with the roles swapped: the batch axis is the contraction, so x with N and C
    exchanged is convolved by dout (likewise) with stride and dilation exchanged
    (dw[o, c, k] = sum over n, p of dout[n, o, p] * x[n, c, p*stride + k*dilation]); the
    extra kernel positions past the weight's are sliced off.  Groups become a grouped Conv
    whose input channels are (group, batch)."""
    out = op.results[0]
    d = w.dtype(out)
    x_shape = conv_geometry(w, op.args[0], "conv's weight gradient", "ONNX")
    dout_shape = conv_geometry(w, op.args[1], "conv's weight gradient", "ONNX")
    w_shape = static_shape(w, op.args[2], "conv's weight gradient", "ONNX")
    n, st, pads, dil, g = conv_params_of(w, op, op.args[0], op.args[2], "ONNX")
    spatial = list(range(2, 2 + n))
    x = w.tensor(op.args[0], d)
    if g == 1:
        xt = w.op("Transpose", x, perm=[1, 0, *spatial])                    # (C, N, S...)
    else:
        cin = x_shape[1] // g
        # (0 copies the batch, -1 is g times it: it may be symbolic)
        grouped = w.op("Reshape", x, w.ints([0, g, cin, *x_shape[2:]]))
        xt = w.op("Reshape", w.op("Transpose", grouped, perm=[2, 1, 0, *range(3, 3 + n)]),
                  w.ints([cin, -1, *x_shape[2:]]))                         # (C/g, g*N, S...)
    dt = w.op("Transpose", w.tensor(op.args[1], d), perm=[1, 0, *spatial])  # (O, N, P...)
    full = w.op("Conv", xt, dt, strides=list(dil), dilations=list(st), pads=list(pads), group=g)
    # The Conv's kernel positions: (S + pads - stride*(P - 1) - 1) // dilation + 1 >= K.
    reach = [(i + pads[k] + pads[n + k] - s * (p - 1) - 1) // dl + 1 for k, (i, p, s, dl)
             in enumerate(zip(x_shape[2:], dout_shape[2:], st, dil))]
    if list(reach) != list(w_shape[2:]):
        full = w.op("Slice", full, w.ints([0] * n), w.ints(list(w_shape[2:])), w.ints(spatial))
    w.node("Transpose", [full], [out.name], perm=[1, 0, *spatial])


def _max_pool_indices(w: OnnxWriter, op: Op, d: str) -> str:
    """The flat index (into all of x, row-major) of each window's maximum: MaxPool's
    second output."""
    values, indices = w.temp("maxpool"), w.temp("argmax")
    w.node("MaxPool", [w.tensor(op.args[0], d)], [values, indices],
           **_pool_attrs(op, _pool_rank(w, op), True))
    return indices


def _max_pool_grad(w: OnnxWriter, op: Op) -> None:
    """dout scattered (ScatterElements, adding) to the flat indices of the windows'
    maxima that MaxPool gives, into zeros of x's size, reshaped to x's shape."""
    out = op.results[0]
    d = w.dtype(out)
    indices = _max_pool_indices(w, op, d)
    x = w.tensor(op.args[0], d)
    flat_zeros = w.op("ConstantOfShape", w.op("Reshape", w.op("Size", x), w.ints([1])),
                      value=w.fill_value(0, d))
    flat = w.op("ScatterElements", flat_zeros, w.op("Reshape", indices, w.ints([-1])),
                w.op("Reshape", w.tensor(op.args[1], d), w.ints([-1])), axis=0, reduction="add")
    w.node("Reshape", [flat, w.op("Shape", x)], [out.name])


def _max_pool_select(w: OnnxWriter, op: Op) -> None:
    """g (flattened) gathered at the flat indices of x's windows' maxima (MaxPool's)."""
    out = op.results[0]
    d = w.dtype(out)
    indices = _max_pool_indices(w, op, d)
    flat_g = w.op("Reshape", w.tensor(op.args[1], d), w.ints([-1]))
    w.node("Gather", [flat_g, indices], [out.name], axis=0)


def _avg_pool_grad(w: OnnxWriter, op: Op) -> None:
    """dout divided by each window's count (a constant: the shapes are known), spread over
    its window by a ConvTranspose with a kernel of ones per channel, zero-padded at the
    end to x's size (the cells no window reads)."""
    out = op.results[0]
    d = w.dtype(out)
    x_shape = conv_geometry(w, op.args[1], "average pooling's gradient", "ONNX")
    a = op.attrs
    kernel, stride, padding, ceil = a.get("kernel"), a.get("stride"), a.get("padding", 0), \
        a.get("ceil_mode", False)
    shaped = zero_array(x_shape)
    n, k, st, pads, _, sizes = conv.pool_params(shaped, kernel, stride, padding, 1, ceil, "avg_pool")
    include = bool(a.get("count_include_pad", True))
    given = [int(p) for p in conv.padding_attr(padding, n, "avg_pool", strings=False) or ()]
    divisor = conv.avg_divisor(x_shape, n, k, st, pads, given, sizes, include)
    scaled = w.op("Div", w.tensor(op.args[0], d), w.const(divisor, d))
    # Each (image, channel) plane on its own: one input channel, one output channel
    # (ONNX's reference ConvTranspose has no groups).
    planes = w.op("Reshape", scaled, w.ints([-1, 1, *sizes]))
    # The windows reach (o - 1) * s + k padded cells: the begin padding is cropped, then
    # whatever lies past x's end (end padding) is cropped, or x's cells past the last
    # window (never read) are zeros padded on.
    reach = [(o - 1) * s + kk - pads[j] for j, (o, s, kk) in enumerate(zip(sizes, st, k))]
    ends = [max(r - i, 0) for r, i in zip(reach, x_shape[2:])]
    extra = [max(i - r, 0) for r, i in zip(reach, x_shape[2:])]
    spread = w.op("ConvTranspose", planes, w.const(np.ones((1, 1, *k)), d), strides=list(st),
                  pads=[*pads[:n], *ends])
    if any(extra):
        spread = w.op("Pad", spread, w.ints([0] * (n + 2) + [0, 0, *extra]))
    w.node("Reshape", [spread, w.op("Shape", w.tensor(op.args[1]))], [out.name])


RULES: dict[Primitive, OnnxRule] = {
    conv.conv: _conv,
    conv.conv_core: _conv,
    conv.conv_transpose: _conv_transpose,
    conv.conv_input_grad: _conv_input_grad,
    conv.conv_weight_grad: _conv_weight_grad,
    conv.max_pool: _max_pool,
    conv.max_pool_grad: _max_pool_grad,
    conv.max_pool_select: _max_pool_select,
    conv.avg_pool: _avg_pool,
    conv.avg_pool_grad: _avg_pool_grad,
    conv.global_avg_pool: _global_pool("GlobalAveragePool"),
    conv.global_max_pool: _global_pool("GlobalMaxPool"),
    conv.batch_norm: _batch_norm,
}
"""This family's primitive object → the rule writing its ONNX nodes (merged into
:data:`anfir.interop.onnx.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported, with the reason."""

"""The Core ML (MIL) export rules of the neural-network operators of :mod:`anfir.primitives.nn`
(softmax, layer_norm, einsum:
normalisations in the model's dtype from ``reduce_mean``; ``einsum`` as a broadcast product
summed over the contracted labels, MIL's ``einsum`` taking two fixed equation forms only).

See :mod:`anfir.interop.coreml.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from anfir.errors import ExportError
from anfir.flat.statements import Op
from anfir.interop.coreml.export_rules.common import (MilRule, _bind_identity, _expand_dims, _fill, _i32,
                                                      _is_none, _shape)
from anfir.ir.primitive import Primitive
from anfir.primitives import nn, nn_kernels

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.coreml.exporter import MilWriter


def _softmax(w: MilWriter, op: Op) -> None:
    """MIL softmax along the axis."""
    out = op.results[0]
    x = w.tensor(op.args[0], w.dtype(out))
    w.bind(out, w.op("softmax", out, x=x, axis=int(op.attrs.get("axis", -1))))


def _tail(w: MilWriter, op: Op, what: str) -> list[int]:
    return list(nn_kernels.tail_axes(len(_shape(w, op.args[0], what)), int(op.attrs.get("axis", -1))))


def _layer_norm(w: MilWriter, op: Op) -> None:
    """MIL layer_norm over the axes from ``axis``; then times scale and plus bias (MIL's
    gamma and beta must be constants, and a trained model's are inputs)."""
    out = op.results[0]
    d = w.dtype(out)
    y = w.op("layer_norm", x=w.tensor(op.args[0], d), axes=_i32(_tail(w, op, "layer_norm")),
             epsilon=w.const(float(op.attrs.get("eps", 1e-5)), d))
    for operand, kind in zip(op.args[1:], ("mul", "add")):
        if not _is_none(operand):
            y = w.op(kind, x=y, y=w.tensor(operand, d))
    _bind_identity(w, out, y)


def _einsum_labels(spec: str, ranks: Sequence[int], w: MilWriter) -> tuple[list[str], str]:
    """The spec's subscripts with ``...`` spelled out as labels of their own (aligned on
    the right, as numpy broadcasts them); a label repeated in one operand is refused."""
    inputs, output = nn_kernels.einsum_parts(spec)
    widths = [r - len(s.replace("...", "")) if "..." in s else 0 for s, r in zip(inputs, ranks)]
    # Labels no spec can use stand for the ellipsis's axes.
    ellipsis = "".join(chr(0x100 + k) for k in range(max(widths, default=0)))
    spelled = [s.replace("...", ellipsis[len(ellipsis) - k:] if k else "")
               for s, k in zip(inputs, widths)]
    out = output.replace("...", ellipsis)
    for s in spelled:
        if len(set(s)) != len(s):
            raise ExportError(f"einsum {spec!r}: a label repeated in one operand (a diagonal) "
                              "has no MIL form", w.loc)
    return spelled, out


def _einsum(w: MilWriter, op: Op) -> None:
    """Each operand transposed to one label order, expanded to every label, multiplied
    (broadcast), summed over the labels the output drops, transposed to the output's
    order (MIL's own einsum takes two fixed equation forms only)."""
    out = op.results[0]
    d = w.dtype(out)
    spec = str(w.static(op.args[0]))
    operands = op.args[1:]
    ranks = [len(_shape(w, a, "einsum")) for a in operands]
    subs, output = _einsum_labels(spec, ranks, w)
    order: list[str] = []
    for s in [*subs, output]:
        order.extend(c for c in s if c not in order)
    product = None
    for operand, sub in zip(operands, subs):
        x = w.tensor(operand, d)
        mine = sorted(sub, key=order.index)
        if mine != list(sub):
            x = w.op("transpose", x=x, perm=_i32([sub.index(c) for c in mine]))
        x = _expand_dims(w, x, [k for k, c in enumerate(order) if c not in sub])
        product = x if product is None else w.op("mul", x=product, y=x)
    assert product is not None
    dropped = [k for k, c in enumerate(order) if c not in output]
    if dropped:
        product = w.op("reduce_sum", x=product, axes=_i32(dropped), keep_dims=False)
    kept = [c for c in order if c in output]
    if kept != list(output):
        product = w.op("transpose", x=product, perm=_i32([kept.index(c) for c in output]))
    _bind_identity(w, out, product)


def _einsum_ones(w: MilWriter, op: Op) -> None:
    """Ones of x's shape, or a 0-d one, as the gradient spec needs."""
    out = op.results[0]
    d = w.dtype(out)
    grad = nn.einsum_grad_spec.impl(w.static(op.args[0]), int(w.static(op.args[1])))
    if grad.split("->")[0].split(",")[-1]:
        w.bind(out, _fill(w, w.shape_of(w.tensor(op.args[2])), 1, d))
    else:
        _bind_identity(w, out, w.const(1, d))


RULES: dict[Primitive, MilRule] = {
    nn.softmax: _softmax,
    nn.layer_norm: _layer_norm,
    nn.einsum: _einsum,
    nn.einsum_ones: _einsum_ones,
}
"""This family's primitive object → the rule writing its MIL ops (merged into
:data:`anfir.interop.coreml.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {
    nn.einsum_grad_spec: "it computes a string from constants, which constant folding does "
                         "before export; MIL has no strings",
}
"""This family's primitives that cannot be exported to MIL, with the reason."""

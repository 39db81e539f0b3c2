"""The one spelling importers give the window attributes of convolution and pooling.

The op library's ``conv``, ``conv_transpose``, ``max_pool`` and ``avg_pool`` accept
``stride=1``, ``stride=(1, 1)``, ``padding=1``, ``padding=(1, 1)`` and
``padding=(1, 1, 1, 1)`` (begins then ends) alike; so the same convolution would
be a different call by the route it came in (ONNX writes every axis and both
sides, torch one value per axis) — different attributes for CSE and for a
graph comparison, and a default (``stride=(1, 1)``) that
:meth:`~anfir.ir.primitive.Primitive.canonical_attrs` cannot see is the default.
Every importer writes them here in the shortest form that means the same: one
integer when every axis has it, else one per axis; padding one per axis when
both sides agree, else begins then ends.  Strings (``"same"``, ``"valid"``) and
``None`` (a pool's stride = its kernel) are kept.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence, Union

import numpy as np

from anfir.ir.primitive import Primitive
from anfir.primitives import conv

IntOrInts = Union[int, tuple[int, ...]]

PER_AXIS = ("stride", "dilation", "kernel", "output_padding")
"""The attributes with one integer per spatial axis."""


WINDOWED: frozenset[Primitive] = frozenset({
    conv.conv, conv.conv_transpose, conv.conv_input_grad, conv.conv_weight_grad, conv.max_pool,
    conv.max_pool_grad, conv.avg_pool, conv.avg_pool_grad})
"""The primitives whose attributes :func:`window` writes."""


def per_axis(values: Union[int, Sequence[int]], n: int) -> IntOrInts:
    """A per-axis attribute over ``n`` spatial axes (one int stands for all): one
    int when every axis has the same, else a tuple of ``n``."""
    items = [int(values)] * n if isinstance(values, int) else [int(v) for v in values]
    if len(items) == 1:
        items = items * n
    if len(items) != n:
        raise ValueError(f"{len(items)} values for {n} spatial axes")
    return items[0] if n and len(set(items)) == 1 else tuple(items)


def padding(values: Union[int, str, Sequence[int]], n: int) -> Union[IntOrInts, str]:
    """A padding over ``n`` spatial axes — an int, one per axis (both sides), or
    begins then ends — in its shortest form."""
    if isinstance(values, str):
        return values
    if isinstance(values, int):
        return int(values)
    items = [int(v) for v in values]
    if len(items) == 2 * n and items[:n] == items[n:]:
        items = items[:n]
    if len(items) == n or len(items) == 1:
        return per_axis(items, n)
    if len(items) != 2 * n:
        raise ValueError(f"{len(items)} pads for {n} spatial axes")
    return tuple(items)


def window(attrs: Mapping[str, Any], n: int) -> dict[str, Any]:
    """``attrs`` with each window attribute (:data:`PER_AXIS`, ``padding``) in its
    shortest form; the others (groups, ceil_mode...) as given."""
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        if value is None or isinstance(value, str):
            out[key] = value
        elif key in PER_AXIS:
            out[key] = per_axis(value, n)
        elif key == "padding":
            out[key] = padding(value, n)
        else:
            out[key] = value
    return out


def float32_attr(value: float) -> float:
    """An attribute a file stores as float32 (ONNX's ``epsilon=1e-5`` reads back as
    9.99999975e-06) as the shortest decimal that rounds to the same float32, so the
    same model gives the same attribute by every route (torch's ``eps=1e-05``)."""
    return float(str(np.float32(value)))


__all__ = ["PER_AXIS", "WINDOWED", "float32_attr", "padding", "per_axis", "window"]

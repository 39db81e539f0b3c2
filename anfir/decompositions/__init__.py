"""The decomposition table: each composite primitive's expansion into core primitives.

One module per primitive family, mirroring :mod:`anfir.primitives` (``nn``,
``elementwise``, ``reduce``...); each contributes its entries to
:data:`DECOMPOSITIONS`, keyed by the primitive object.  The pass
:func:`anfir.passes.decompose.decompose` applies them on the optimized graph for a
back end, except the composites the back end keeps natively.  Adding one is an
entry in the family's table::

    DECOMPOSITIONS[nn.rms_norm] = _rms_norm     # rule(builder) -> node

(see :class:`~anfir.decompositions.builder.ExpansionBuilder`).
"""

from __future__ import annotations

from anfir.decompositions import conv, elementwise, gradient, nn, reduce, shaping
from anfir.decompositions.builder import ExpansionBuilder, Declined, Decomposition
from anfir.ir.primitive import Primitive

DECOMPOSITIONS: dict[Primitive, Decomposition] = {
    **elementwise.DECOMPOSITIONS,
    **reduce.DECOMPOSITIONS,
    **gradient.DECOMPOSITIONS,
    **shaping.DECOMPOSITIONS,
    **nn.DECOMPOSITIONS,
    **conv.DECOMPOSITIONS,
}
"""Composite primitive object → the rule building its expansion from other primitives."""

__all__ = ["DECOMPOSITIONS", "ExpansionBuilder", "Declined", "Decomposition"]

"""The Core ML (MIL) export rules: one entry per primitive object, the rule writing its MIL ops.

A rule is a function ``rule(writer, op)`` that computes ``op.results`` from ``op.args``
through the helpers of :class:`~anfir.interop.coreml.exporter.MilWriter` (the writer, which
looks rules up in :data:`RULES` and states :data:`UNSUPPORTED`'s reasons).

The rules live in one module per family of the anfir primitive they write, named as in
``anfir/primitives/`` (as :mod:`anfir.interop.onnx.export_rules`) —
:mod:`~anfir.interop.coreml.export_rules.arith`, :mod:`~anfir.interop.coreml.export_rules.elementwise`,
:mod:`~anfir.interop.coreml.export_rules.tensor`, :mod:`~anfir.interop.coreml.export_rules.reduce`,
:mod:`~anfir.interop.coreml.export_rules.shaping` (with the flat program's ``DIM``),
:mod:`~anfir.interop.coreml.export_rules.indexing`, :mod:`~anfir.interop.coreml.export_rules.nn`,
:mod:`~anfir.interop.coreml.export_rules.conv`, :mod:`~anfir.interop.coreml.export_rules.structure`
and :mod:`~anfir.interop.coreml.export_rules.gradient` — with the shared factories and
helpers in :mod:`~anfir.interop.coreml.export_rules.common`.  Each module has its own
``RULES`` and ``UNSUPPORTED``; :data:`RULES` and :data:`UNSUPPORTED` merge them in the fixed
order of :data:`MODULES`, and a primitive in two families is an error, so the tables do not
depend on that order.  The modules import the writer for types only: importing this
package gives the complete tables, whatever was imported before.
"""

from __future__ import annotations

from types import ModuleType

from anfir.interop.export_common import room_tables
from anfir.interop.coreml.export_rules import (arith, conv, elementwise, gradient, indexing, nn, reduce, shaping,
                                               structure, tensor)
from anfir.interop.coreml.export_rules.common import MilRule
from anfir.ir.primitive import Primitive

MODULES: tuple[ModuleType, ...] = (
    arith, elementwise, tensor, reduce, shaping, indexing, nn, conv, structure, gradient)
"""Each family's rule module, in the fixed order :data:`RULES` merges them."""

FAMILIES: tuple[dict[Primitive, MilRule], ...] = tuple(module.RULES for module in MODULES)
"""Each family's rules (``RULES`` of each of :data:`MODULES`), in the same order."""

_rules, _reasons = room_tables(MODULES, "Core ML", "Core ML has no complex tensors")

RULES: dict[Primitive, MilRule] = _rules
"""Primitive object → the rule writing its MIL ops.  A primitive the walker takes
apart itself (``make_tuple``, ``env_getitem``...) needs none
(:data:`anfir.flat.flatten.WALKER_ONLY`)."""

UNSUPPORTED: dict[Primitive, str] = _reasons
"""Primitives that cannot be exported, with the reason (the writer's error quotes it): the
families', the one-device primitives' and the complex ones' (no family module: no rules)."""


__all__ = ["FAMILIES", "MODULES", "RULES", "UNSUPPORTED"]

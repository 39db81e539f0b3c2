"""The ONNX export rules: one entry per primitive object, the rule writing its ONNX nodes.

A rule is a function ``rule(writer, op)`` that writes the ONNX nodes computing
``op.results`` from ``op.args`` through the helpers of
:class:`~anfir.interop.onnx.exporter.OnnxWriter` (the writer, which looks rules up in
:data:`RULES` and states :data:`UNSUPPORTED`'s reasons).

The rules live in one module per family of the anfir primitive they write, named as in
``anfir/primitives/`` (and as :mod:`anfir.interop.onnx.import_rules`) —
:mod:`~anfir.interop.onnx.export_rules.arith`, :mod:`~anfir.interop.onnx.export_rules.elementwise`,
:mod:`~anfir.interop.onnx.export_rules.tensor`, :mod:`~anfir.interop.onnx.export_rules.reduce`,
:mod:`~anfir.interop.onnx.export_rules.shaping` (with the flat program's ``DIM``),
:mod:`~anfir.interop.onnx.export_rules.indexing`, :mod:`~anfir.interop.onnx.export_rules.nn`,
:mod:`~anfir.interop.onnx.export_rules.conv`, :mod:`~anfir.interop.onnx.export_rules.structure`
and :mod:`~anfir.interop.onnx.export_rules.gradient` — with the shared factories and helpers in
:mod:`~anfir.interop.onnx.export_rules.common`.  Each module has its own ``RULES`` and
``UNSUPPORTED``; :data:`RULES` and :data:`UNSUPPORTED` merge them in the fixed order of
:data:`MODULES`, and a primitive in two families is an error, so the tables do not
depend on that order.  The modules import the writer for types only: importing this
package gives the complete tables, whatever was imported before.
"""

from __future__ import annotations

from types import ModuleType

from anfir.interop.export_common import room_tables
from anfir.interop.onnx.export_rules import (arith, conv, elementwise, gradient, indexing, nn, reduce, shaping,
                                             structure, tensor)
from anfir.interop.onnx.export_rules.common import OnnxRule
from anfir.ir.primitive import Primitive

MODULES: tuple[ModuleType, ...] = (
    arith, elementwise, tensor, reduce, shaping, indexing, nn, conv, structure, gradient)
"""Each family's rule module, in the fixed order :data:`RULES` merges them."""

FAMILIES: tuple[dict[Primitive, OnnxRule], ...] = tuple(module.RULES for module in MODULES)
"""Each family's rules (``RULES`` of each of :data:`MODULES`), in the same order."""

_rules, _reasons = room_tables(
    MODULES, "ONNX", "ONNX has no complex element types in its operators (complex64/128 are "
                     "storage types only: no Real, Imag or Complex operator)")

RULES: dict[Primitive, OnnxRule] = _rules
"""Primitive object → the rule writing its ONNX nodes.  A primitive the walker
takes apart itself (``make_tuple``, ``env_getitem``...) needs none
(:data:`anfir.flat.flatten.WALKER_ONLY`)."""

UNSUPPORTED: dict[Primitive, str] = _reasons
"""Primitives that cannot be exported, with the reason (the writer's error quotes it): the
families', the one-device primitives' and the complex ones' (no family module: no rules)."""


__all__ = ["FAMILIES", "MODULES", "RULES", "UNSUPPORTED"]

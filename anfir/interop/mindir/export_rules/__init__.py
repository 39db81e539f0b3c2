"""The MindIR export rules: one entry per primitive object, the rule writing it as MindSpore ops.

A rule is a function ``rule(writer, node)`` returning the name of the node's value
in the graph being written, through the helpers of
:class:`~anfir.interop.mindir.writer.Writer` (``emit``, ``constant``, ``ref``).
As in the other export rooms (:mod:`anfir.interop.onnx.export_rules`,
:mod:`anfir.interop.coreml.export_rules`), the rules live in one module per family
of the op library, named as in ``anfir/primitives/``; each has its own ``RULES``
and ``UNSUPPORTED``, merged here in the fixed order of :data:`MODULES` (a
primitive in two families is an error, so the tables do not depend on that
order).  The shared helpers are in :mod:`~anfir.interop.mindir.export_rules.common`.
The modules import the writer for types only: importing this package gives the
complete tables, whatever was imported before.
"""

from __future__ import annotations

from types import ModuleType

from anfir.interop.export_common import room_tables
from anfir.interop.mindir.export_rules import (arith, conv, elementwise, gradient, indexing, loops, nn, reduce,
                                               shaping,
                                               structure, tensor)
from anfir.interop.mindir.export_rules.common import Rule
from anfir.ir.primitive import Primitive

MODULES: tuple[ModuleType, ...] = (arith, elementwise, tensor, shaping, nn, conv, structure, gradient, loops,
                                   reduce, indexing)
"""Each family's rule module, in the fixed order :data:`RULES` merges them."""

FAMILIES: tuple[dict[Primitive, Rule], ...] = tuple(module.RULES for module in MODULES)
"""Each family's rules (``RULES`` of each of :data:`MODULES`), in the same order."""

_rules, _reasons = room_tables(MODULES, "MindIR", "MindSpore's .mindir has no complex tensors here")

RULES: dict[Primitive, Rule] = _rules
"""Primitive object → the rule writing it as MindSpore ops."""

UNSUPPORTED: dict[Primitive, str] = _reasons
"""Primitives that cannot be written as MindIR, with the reason (the writer's error quotes it)."""

__all__ = ["FAMILIES", "MODULES", "RULES", "UNSUPPORTED"]

"""The ONNX import rules: one entry per ONNX op type, over anfir's operator library.

:data:`OPS` maps ``(domain, op_type)`` to ``[(since_version, rule), ...]``: the
rule used for a node is the last whose ``since_version`` is at most the
model's opset of that domain (a rule may also read ``ctx.opset`` for details
that changed between versions, such as axes moving from an attribute to an
input).  A rule takes a :class:`~anfir.interop.onnx.common.Ctx` and returns
the nodes of the ONNX node's outputs.  Rules hold the primitive objects of
:mod:`anfir.primitives` (``arith.add``, ``nn.softmax``...), never their names:
a misspelt or missing primitive is an import error of this package, which mypy
sees, not an error of the first model that uses the op.

The rules live in one module per family of the anfir primitive they produce,
named as in ``anfir/primitives/`` — :mod:`~anfir.interop.onnx.import_rules.arith`,
:mod:`~anfir.interop.onnx.import_rules.elementwise`, :mod:`~anfir.interop.onnx.import_rules.tensor`,
:mod:`~anfir.interop.onnx.import_rules.reduce`, :mod:`~anfir.interop.onnx.import_rules.shaping`,
:mod:`~anfir.interop.onnx.import_rules.indexing`, :mod:`~anfir.interop.onnx.import_rules.nn`,
:mod:`~anfir.interop.onnx.import_rules.conv`, :mod:`~anfir.interop.onnx.import_rules.structure`
and :mod:`~anfir.interop.onnx.import_rules.control` (If, Loop, Scan) — with the
shared helpers in :mod:`~anfir.interop.onnx.import_rules.common`.  Each fills its
own :class:`~anfir.interop.onnx.import_rules.common.RuleSet`; :data:`OPS` merges
them in the fixed order of :data:`FAMILIES`, and two rules for one op from the
same opset are an error, so the table does not depend on that order.

An op with no rule here whose ONNX schema is a function (``Gelu`` before it had
a rule, ``Celu``, ``Range``...) is expanded through that function body by
:mod:`anfir.interop.onnx.importer`.
"""

from __future__ import annotations

from anfir.errors import AnfirError
from anfir.interop.onnx.common import OpRule
from anfir.interop.onnx.import_rules import (arith, control, conv, elementwise, indexing, nn, reduce, shaping,
                                             structure, tensor)
from anfir.interop.onnx.import_rules.common import RuleSet

FAMILIES: tuple[RuleSet, ...] = (
    arith.RULES, elementwise.RULES, tensor.RULES, reduce.RULES, shaping.RULES, indexing.RULES, nn.RULES,
    conv.RULES, structure.RULES, control.RULES)
"""Each family's rules, in the fixed order :data:`OPS` merges them."""


def merged(families: tuple[RuleSet, ...]) -> dict[tuple[str, str], list[tuple[int, OpRule]]]:
    """The families' rules as one table, ``(domain, op_type)`` -> ``[(since_version, rule)]``
    oldest first; two rules for one op from the same opset are an error."""
    table: dict[tuple[str, str], list[tuple[int, OpRule]]] = {}
    for family in families:
        for key, entries in family.rules.items():
            merged_entries = table.setdefault(key, [])
            for since, rule in entries:
                if any(s == since for s, _ in merged_entries):
                    raise AnfirError(f"two ONNX import rules for {key[0] or 'ai.onnx'}::{key[1]} from opset {since}")
                merged_entries.append((since, rule))
            merged_entries.sort(key=lambda pair: pair[0])
    return dict(sorted(table.items()))


OPS: dict[tuple[str, str], list[tuple[int, OpRule]]] = merged(FAMILIES)
"""``(domain, op_type)`` → ``[(since_version, rule)]``, oldest first."""

__all__ = ["FAMILIES", "OPS", "merged"]

"""MindIR and :mod:`anfir.primitives.loops`: ``scan`` and ``fori_loop`` have no rule — the
MindIR pipeline writes them back as while-header graphs before the rules run
(:mod:`anfir.passes.loops_as_recursion`); what is left is one that cannot be."""

from __future__ import annotations

from anfir.interop.mindir.export_rules.common import Rule
from anfir.ir.primitive import Primitive
from anfir.primitives import loops

RULES: dict[Primitive, Rule] = {}
"""This family's primitives -> how each is written as MindSpore ops (none: see the module doc)."""

UNSUPPORTED: dict[Primitive, str] = {
    loops.scan: "a scan whose number of steps is known only at run time: a while header's stacked "
                "buffers need a static size (e.g. the gradient of a fori_loop with run-time bounds)",
    loops.fori_loop: "a fori_loop left by the loops phase (written as a while header otherwise)",
}
"""Why a structured loop reaches the rules."""

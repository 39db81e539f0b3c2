"""The Core ML (MIL) export rules of the operators of :mod:`anfir.primitives.structure` (``switch``,
``zeros_like``).

See :mod:`anfir.interop.coreml.export_rules` for how the table is assembled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from anfir.errors import ExportError
from anfir.flat.statements import Op, Value, shape_of_type
from anfir.interop.coreml.export_rules.common import MilRule, _filled_like
from anfir.ir.primitive import Primitive
from anfir.primitives import structure

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.coreml.exporter import MilWriter


def _select(w: MilWriter, op: Op) -> None:
    """``switch`` between two computed values: MIL select when both have the result's
    shape (and neither may be a placeholder), else a ``cond``."""
    out = op.results[0]
    d = w.dtype(out)
    c, a, b = op.args
    eager = (w.type_of(a) == w.type_of(b)
             and not any(isinstance(x, Value) and x.maybe_undefined for x in (a, b)))
    if eager:
        w.bind(out, w.op("select", out, cond=w.tensor(c, "bool"), a=w.tensor(a, d),
                         b=w.tensor(b, d)))
        return
    ranks = [shape_of_type(w.type_of(x)) for x in (a, b)]
    if any(r is None for r in ranks) or len(ranks[0] or ()) != len(ranks[1] or ()):
        raise ExportError("a value that has different ranks in the two branches of an if "
                          f"({w.type_of(a)} or {w.type_of(b)}) cannot be a Core ML value", w.loc)
    w.bind(out, w.op("cond", out, pred=w.tensor(c, "bool"),
                     _true_fn=lambda: w.op("identity", x=w.tensor(a, d)),
                     _false_fn=lambda: w.op("identity", x=w.tensor(b, d))))


RULES: dict[Primitive, MilRule] = {
    structure.switch: _select,
    structure.zeros_like: _filled_like(0),
}
"""This family's primitive object → the rule writing its MIL ops (merged into
:data:`anfir.interop.coreml.export_rules.RULES`)."""

UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives that cannot be exported to MIL, with the reason."""

"""The torch.export importer's rules: one table from ATen op to builder.

One module per family of the anfir primitive a rule produces, named as in
``anfir/primitives/`` — :mod:`~anfir.interop.torch.rules.arith`,
:mod:`~anfir.interop.torch.rules.elementwise`, :mod:`~anfir.interop.torch.rules.tensor`,
:mod:`~anfir.interop.torch.rules.reduce`, :mod:`~anfir.interop.torch.rules.shaping`,
:mod:`~anfir.interop.torch.rules.indexing`, :mod:`~anfir.interop.torch.rules.nn`,
:mod:`~anfir.interop.torch.rules.conv`, :mod:`~anfir.interop.torch.rules.structure` —
and the rule protocol and shared helpers in :mod:`~anfir.interop.torch.rules.common`.

Each rule composes anfir primitives, so an imported op's gradient is the
composition's — each written so that it is PyTorch's, including at kinks
(``tests/test_kinks.py``) — and every back end that runs the primitives runs the
op.  Static sizes are read from the FX node's FakeTensor metadata; an op that
needs a static size and gets a dynamic one is refused with the reason (in the
import's one list of refusals).  :data:`EXCLUDED` names the core ops left out,
with why (docs/torch.md repeats it).
"""

from __future__ import annotations

from typing import Any, Callable

from anfir.interop.torch.rules import (arith, conv, elementwise, indexing, nn, reduce, shaping, structure,
                                       tensor)
from anfir.interop.torch.rules.common import Rule, RuleTable


def core_overloads(torch: Any) -> list[Any]:
    """Every overload PyTorch tags ``torch.Tag.core``.  ``torch.ops.aten`` loads its
    op packets lazily, so each is named from the registered schemas first."""
    aten = torch.ops.aten
    names = sorted({s.name.split("::", 1)[1] for s in torch._C._jit_get_all_schemas()
                    if s.name.startswith("aten::")})
    found = []
    for name in names:
        packet = getattr(aten, name, None)
        for overload in packet.overloads() if packet is not None else ():
            op = getattr(packet, overload)
            if torch.Tag.core in op.tags:
                found.append(op)
    return found


EXCLUDED = {
    "aten.rand.default": "random numbers: anfir's programs are deterministic (dropout takes its key)",
    "aten.randn.default": "random numbers: anfir's programs are deterministic",
    "aten.randperm.default": "random numbers: anfir's programs are deterministic",
    "aten._fft_r2c.default": "FFTs: anfir has no Fourier-transform primitive",
    "aten._fft_c2r.default": "FFTs: anfir has no Fourier-transform primitive",
    "aten.nonzero.default": "a result whose shape depends on the data (anfir's shapes are "
                            "static or dimension variables of the inputs)",
}
"""Core ATen overloads the importer does not map, with the reason."""


def needs_functionalization(torch: Any, node: Any) -> bool:
    """Whether a training-IR node mutates state only torch's functionalization makes
    explicit (batch norm in training mode, and instance norm over its input's
    statistics with running ones, update their running statistics)."""
    aten = torch.ops.aten
    if node.target is aten.batch_norm.default:
        return bool(node.args[5])
    if node.target is aten.instance_norm.default:
        return bool(node.args[5]) and node.args[3] is not None
    return False


FAMILIES: tuple[Callable[[Any, RuleTable], None], ...] = (
    arith.rules, elementwise.rules, tensor.rules, reduce.rules, shaping.rules, indexing.rules,
    nn.rules, conv.rules, structure.rules)
"""Each family's ``rules``, in the fixed order :func:`full_table` calls them."""


def full_table(torch: Any) -> dict[Any, Rule]:
    """Every rule the importer has, for this torch: ``OpOverload`` (or Python
    operator, or higher-order op) -> rule."""
    table = RuleTable(torch)
    for add_rules in FAMILIES:
        add_rules(torch, table)
    return table.rules


__all__ = ["EXCLUDED", "FAMILIES", "core_overloads", "full_table", "needs_functionalization"]

"""Gradient environments written as fixed tuples, one slot per key.

anfir's backpropagators return the gradient of a closure's captured values as
a gradient environment (``newenv`` / ``env_setitem`` / ``env_getitem``).
MindSpore has the same ops (``EnvironCreate`` / ``EnvironSet`` /
``EnvironGet``), but its ``.mindir`` loader infers no type for them ("Got null
AbstractBasePtr for input [0] for primitive MakeTuple"): its own exports never
contain them — MindSpore's optimizer resolves every environment before it
writes a file (tests/mindir_fixtures/while_grad.mindir, its gradient of a
``while``, has none).  anfir cannot always resolve them (the backpropagator of
a branch or of a loop returns one), so the writer gives environments a type
MindSpore knows: a tuple.

Every key of a compiled program is a constant, so the program's environments
share one **layout**: a slot per (key, type of the gradient) over the whole
program, a missing key reading as the zero of its slot's type.  Then

* ``newenv()`` is the tuple of every slot's zero;
* ``env_setitem(e, k, v)`` is ``e`` with slot (k, type of v) replaced by ``v``;
* ``env_getitem(e, k, d)`` is slot (k, type of d) of ``e`` — right because
  anfir's defaults are zeros (checked here: a program with another default
  keeps MindSpore's Environ ops);
* ``gadd`` of environments adds slot by slot (zero is its neutral element).

A slot is keyed by the type too because one key (a partial's bound value
``partial.i``) names gradients of different types in different closures; a
read only ever meets a gradient of its default's type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

import numpy as np

from anfir.abstract.values import AEnv, AScalar, ATensor, ATuple
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.walk import toposort
from anfir.primitives import gradient, structure
from anfir.runtime_values import SymbolicKey

Signature = Any
"""A slot's type, hashable: ``("s", dtype)``, ``("t", dtype, shape)`` or ``("u", items)``."""


@dataclass
class EnvLayout:
    """The slots of every environment of one program."""

    slots: list[tuple[SymbolicKey, Any]] = field(default_factory=list)
    """(key, abstract of the gradient) per slot, in first-use order."""
    index: dict[tuple[SymbolicKey, Signature], int] = field(default_factory=dict)

    def slot(self, key: SymbolicKey, abstract: Any) -> int:
        """The slot of ``key`` holding gradients of type ``abstract`` (added when new)."""
        sig = signature(abstract)
        assert sig is not None
        found = self.index.get((key, sig))
        if found is None:
            found = self.index[(key, sig)] = len(self.slots)
            self.slots.append((key, abstract))
        return found


def signature(abstract: Any) -> Optional[Signature]:
    """The slot type of a gradient of type ``abstract`` (None: not one a slot can hold —
    an environment, a tensor of unknown shape), walked with a stack."""
    stack: list[tuple[Any, bool]] = [(abstract, False)]
    done: list[Any] = []
    while stack:
        item, expanded = stack.pop()
        if isinstance(item, AScalar):
            done.append(("s", str(item.dtype)))
        elif isinstance(item, ATensor):
            if item.shape is None:
                return None
            if not all(isinstance(d, int) for d in item.shape):
                # dimension variables: the slot's zero is a 0-d zero (see is_run_time)
                done.append(("d", str(item.dtype), tuple(str(d) for d in item.shape)))
                continue
            done.append(("t", str(item.dtype), tuple(int(d) for d in item.shape)))
        elif isinstance(item, ATuple) and expanded:
            n = len(item.items)
            items = tuple(done[len(done) - n:]) if n else ()
            del done[len(done) - n:]
            done.append(("u", items))
        elif isinstance(item, ATuple):
            stack.append((item, True))
            stack.extend((element, False) for element in reversed(item.items))
        else:
            return None
    return done[-1]


def is_zero(node: Node) -> bool:
    """Whether ``node`` is certainly zero: ``zeros_like(...)`` or a constant of zeros."""
    if isinstance(node, CNode):
        return node.is_apply(structure.zeros_like)
    if not isinstance(node, ValueNode):
        return False
    stack: list[Any] = [node.value]
    while stack:
        value = stack.pop()
        if isinstance(value, tuple):
            stack.extend(value)
        elif isinstance(value, (bool, int, float, np.generic, np.ndarray)):
            if np.any(np.asarray(value) != 0):
                return False
        else:
            return False
    return True


def plan(graphs: Iterable[FuncGraph]) -> Optional[EnvLayout]:
    """The layout of the environments of ``graphs``, or None when one cannot be a tuple
    (a key known only at run time, a gradient of a type without a static zero, a
    default that is not zero): those programs keep MindSpore's Environ ops."""
    layout = EnvLayout()
    for g in graphs:
        for node in toposort(g):
            if not isinstance(node, CNode):
                continue
            if node.is_apply(gradient.env_setitem) or node.is_apply(gradient.env_getitem):
                if len(node.args) != 3:
                    return None
                _, key, value = node.args
                if not (isinstance(key, ValueNode) and isinstance(key.value, SymbolicKey)):
                    return None
                if signature(value.abstract) is None:
                    return None
                if node.is_apply(gradient.env_getitem) and not is_zero(value):
                    return None
                layout.slot(key.value, value.abstract)
    return layout


def is_env(abstract: Any) -> bool:
    """Whether a value of type ``abstract`` is a gradient environment."""
    return isinstance(abstract, AEnv)


def slot_types(layout: EnvLayout) -> ATuple:
    """The type of an environment under ``layout``: the tuple of its slots' types."""
    return ATuple(tuple(abstract for _, abstract in layout.slots))


def is_run_time(abstract: Any) -> bool:
    """Whether a slot of type ``abstract`` holds a tensor with dimension variables.  Its
    zero cannot be built from a static shape, so it is a 0-d zero: adding gradients
    (``gadd``) broadcasts it away, and a read adds the read's default (a zero of the
    right shape, computed by the program) so the value has the slot's shape."""
    return isinstance(abstract, ATensor) and abstract.shape is not None and \
        not all(isinstance(d, int) for d in abstract.shape)


__all__ = ["EnvLayout", "is_env", "is_run_time", "is_zero", "plan", "signature", "slot_types"]

"""Names of captured uses, kept through cloning and replacement.

The autodiff keys the gradient of a closure (a GradEnv) by names of the values
the closure captures: the transform of the closure's graph writes an entry per
name, the transform of the graph that makes the closure reads them.  When both
are built at once the names agree.  A compiled program, though, may transform a
closure at run time (``grad`` of a function passed as an argument), after the
readers were built and after inlining and the optimizer copied the graph and
replaced what it captures: a parameter by the call's argument — which may be a
node the graph already captured under another name (``grad(lambda (y) ...
y * x ... end)(x)`` inlined captures ``x`` twice, as ``y`` and as ``x``, and
the two gradients differ).  A name derived from the node captured *then* would
be written where no reader looks, and the gradient silently lost or doubled.

So the name lives on the *use*: the input ``index`` of a call ``user`` (or the
output of a graph, index ``-1``) that reads a captured value.  It is recorded
the first time the autodiff asks for it (:func:`set_name`) and then follows the
use: a copy of the user gets its names (:func:`follow_clone`); replacing a
node keeps its users' inputs, so their names stay, and a node replaced by one
of its own captured inputs (``v * 1.0`` by ``v``) hands that input's name on to
its users (:func:`follow_replace`).

Everything is held weakly, and a program that is never differentiated records
nothing (the hooks return at once).
"""

from __future__ import annotations

import weakref
from typing import Any, Iterable, Mapping, Optional, Union

from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode

User = Union[CNode, FuncGraph]
OUTPUT = -1
"""The index naming a graph's output as a use."""

_names: "weakref.WeakKeyDictionary[Any, dict[int, Any]]" = weakref.WeakKeyDictionary()


def name_of(user: User, index: int) -> Optional[Any]:
    """The name of the captured value that input ``index`` of ``user`` reads (None if unnamed)."""
    table = _names.get(user)
    return None if table is None else table.get(index)


def set_name(user: User, index: int, name: Any) -> None:
    """Name the use ``(user, index)`` (kept if it already has a name)."""
    table = _names.get(user)
    if table is None:
        table = _names[user] = {}
    table.setdefault(index, name)


def follow_clone(pairs: Iterable[tuple[Node, Node]],
                 graph_map: Mapping[FuncGraph, FuncGraph]) -> None:
    """Give each copy (``(original, copy)`` call pairs, and copied graphs' outputs)
    the names of its original's uses."""
    if not _names:
        return
    for original, copy in pairs:
        table = _names.get(original)
        if table:
            for index, name in table.items():
                set_name(copy, index, name)  # type: ignore[arg-type]
    for old, new in graph_map.items():
        table = _names.get(old)
        if table and OUTPUT in table:
            set_name(new, OUTPUT, table[OUTPUT])


def follow_replace(old: Node, new: Node, uses: Iterable[tuple[User, int]]) -> None:
    """``new`` now stands where ``old`` stood (at ``uses``): a use of ``old`` that
    now reads an input of ``old`` gets that input's name, and so does the same
    input of ``new`` (a rewrite rebuilt from ``old``'s inputs)."""
    if not _names or isinstance(new, ValueNode):
        return
    table = _names.get(old)
    if not table or not isinstance(old, CNode):
        return
    by_input: dict[Node, Any] = {}
    for index, name in table.items():
        if 0 <= index < len(old.inputs):
            by_input.setdefault(old.inputs[index], name)
    name = by_input.get(new)
    if name is not None:
        for user, index in uses:
            set_name(user, OUTPUT if isinstance(user, FuncGraph) else index, name)
    if isinstance(new, CNode):
        for index, inp in enumerate(new.inputs):
            inherited = by_input.get(inp)
            if inherited is not None:
                set_name(new, index, inherited)


__all__ = ["OUTPUT", "follow_clone", "follow_replace", "name_of", "set_name"]

"""Abstract values as dump text, with graph names chosen by the caller.

``str()`` of an abstract value (``anfir/abstract/values.py``) spells a graph
by its ``name``; a dump must use the dump's unique names (two graphs may both
be called ``lambda``), so this formatter mirrors ``str()`` exactly but asks a
callback for graph names.  Nested tuples are formatted with an explicit stack.
"""

from __future__ import annotations

from typing import Any, Callable

from anfir.abstract.values import (AbstractValue, AFunction, ATuple, GradFn, GraphFn, GraphSig, JFn,
                                   PartialFn, PrimFn)

GraphNamer = Callable[[Any], str]


def abstract_text(value: Any, graph_name: GraphNamer) -> str:
    """``value`` (an AbstractValue, or None -> ``?``) as text; graphs as ``@`` + ``graph_name(g)``."""
    out: list[str] = []
    stack: list[tuple[str, Any]] = [("value", value)]
    while stack:
        kind, item = stack.pop()
        if kind == "text":
            out.append(item)
        elif kind == "atom":
            stack.extend(reversed(_atom_pieces(item, graph_name)))
        else:
            stack.extend(reversed(_value_pieces(item, graph_name)))
    return "".join(out)


def _value_pieces(value: Any, graph_name: GraphNamer) -> list[tuple[str, Any]]:
    if value is None:
        return [("text", "?")]
    if isinstance(value, ATuple):
        pieces: list[tuple[str, Any]] = [("text", "<Tuple(")]
        for i, item in enumerate(value.items):
            if i:
                pieces.append(("text", ", "))
            pieces.append(("value", item))
        pieces.append(("text", ")>"))
        return pieces
    if isinstance(value, GraphSig):
        pieces = [("text", "(")]
        for i, item in enumerate(value.params):
            if i:
                pieces.append(("text", ", "))
            pieces.append(("value", item))
        pieces.append(("text", ") -> "))
        pieces.append(("value", value.out))
        return pieces
    if isinstance(value, AFunction):
        # Options are listed sorted by their text, as ``str()`` does.
        texts = sorted(abstract_atom_text(o, graph_name) for o in value.options)
        if len(texts) == 1:
            return [("text", f"<Func {texts[0]}>")]
        return [("text", "<Func {" + ", ".join(texts) + "}>")]
    if isinstance(value, AbstractValue):  # no graph inside: ``str()`` is the syntax
        return [("text", str(value))]
    raise TypeError(f"not an abstract value: {value!r}")


def abstract_atom_text(atom: Any, graph_name: GraphNamer) -> str:
    """A function atom (``@g``, ``add``, ``partial(...)``, ``J(...)``) as text.

    (Options of a function type are sorted by their text, so each is rendered
    on its own; function types nest only as deep as the types built for them.)
    """
    out: list[str] = []
    stack: list[tuple[str, Any]] = [("atom", atom)]
    while stack:
        kind, item = stack.pop()
        if kind == "text":
            out.append(item)
        elif kind == "atom":
            stack.extend(reversed(_atom_pieces(item, graph_name)))
        else:
            out.append(abstract_text(item, graph_name))
    return "".join(out)


def _atom_pieces(atom: Any, graph_name: GraphNamer) -> list[tuple[str, Any]]:
    if isinstance(atom, GraphFn):
        return [("text", "@" + graph_name(atom.graph))]
    if isinstance(atom, PrimFn):
        return [("text", atom.prim.name)]
    if isinstance(atom, JFn):
        return [("text", "J("), ("atom", atom.fn), ("text", ")")]
    if isinstance(atom, GradFn):
        name = "value_and_grad" if atom.with_value else "grad"
        wrt = "".join(f", {i}" for i in atom.wrt)
        return [("text", f"{name}("), ("atom", atom.fn), ("text", wrt + ")")]
    if isinstance(atom, PartialFn):
        pieces: list[tuple[str, Any]] = [("text", "partial("), ("atom", atom.fn)]
        for arg in atom.args:
            pieces.append(("text", ", "))
            pieces.append(("value", arg))
        pieces.append(("text", ")"))
        return pieces
    return [("text", str(atom))]


__all__ = ["abstract_text", "abstract_atom_text"]

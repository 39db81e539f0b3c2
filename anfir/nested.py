"""Walking nested tuples without recursion.

Constants and abstract values nest tuples to any depth (a program may build a
3,000-deep one), so every walk over them uses an explicit stack.  These are
the two walks they share: a bottom-up fold, and writing them as text.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, TypeVar

R = TypeVar("R")


def fold_nested(root: Any, items_of: Callable[[Any], Optional[Sequence[Any]]],
                combine: Callable[[Any, list[R]], R], leaf: Callable[[Any], R],
                memo: Optional[dict[int, tuple[Any, R]]] = None) -> R:
    """Fold ``root`` bottom-up: ``combine(t, [results of t's items])`` for each
    tuple ``t`` (``items_of(t)`` is its items; None means "not a tuple") and
    ``leaf(x)`` for everything else.

    A tuple reached twice (shared) is folded once.  Any depth, constant stack.
    ``memo`` carries that sharing across calls: ``memo[id(t)] = (t, result)``
    for every tuple folded (holding ``t`` keeps its id from being reused), and
    a tuple found there is not walked again — so folding a chain of values,
    each nesting the previous one, costs the new levels only.
    """
    if items_of(root) is None:
        return leaf(root)
    done: dict[int, tuple[Any, R]] = {} if memo is None else memo
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        t, ready = stack.pop()
        if id(t) in done:
            continue
        items = items_of(t)
        if items is None:
            # ``items_of`` may turn a tuple into a leaf while the fold runs (map_graphs:
            # an equal tuple, another object, was folded meanwhile and memoized).
            done[id(t)] = (t, leaf(t))
            continue
        if not ready:
            stack.append((t, True))
            stack.extend((i, False) for i in items if items_of(i) is not None and id(i) not in done)
            continue
        done[id(t)] = (t, combine(t, [done[id(i)][1] if items_of(i) is not None else leaf(i)
                                      for i in items]))
    return done[id(root)][1]


def nested_text(root: Any, items_of: Callable[[Any], Optional[Sequence[Any]]],
                leaf: Callable[[Any], str], opening: str = "(", closing: str = ")",
                one_comma: bool = True) -> str:
    """``root`` as text: each tuple as ``opening`` items separated by ``", "``
    ``closing`` (with ``one_comma``, a one-item tuple ends ``",)"``-style, as
    Python and ANF write it); everything else by ``leaf``.  ``items_of`` as in
    :func:`fold_nested`.  Any depth, constant stack."""
    out: list[str] = []
    stack: list[tuple[bool, Any]] = [(False, root)]
    while stack:
        is_text, item = stack.pop()
        if is_text:
            out.append(item)
            continue
        items = items_of(item)
        if items is None:
            out.append(leaf(item))
            continue
        pieces: list[tuple[bool, Any]] = [(True, opening)]
        for i, element in enumerate(items):
            if i:
                pieces.append((True, ", "))
            pieces.append((False, element))
        pieces.append((True, ("," if one_comma and len(items) == 1 else "") + closing))
        stack.extend(reversed(pieces))
    return "".join(out)


def tuple_items(value: Any) -> Optional[tuple[Any, ...]]:
    """``value`` itself if it is a Python tuple, else None (``items_of`` for plain values)."""
    return value if isinstance(value, tuple) else None


__all__ = ["fold_nested", "nested_text", "tuple_items"]

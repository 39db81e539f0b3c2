"""Folding nested tuples bottom-up without recursion.

Constants and abstract values nest tuples to any depth (a program may build a
3,000-deep one), so every walk over them uses an explicit stack.  This is the
one post-order fold they share.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, TypeVar

R = TypeVar("R")


def fold_nested(root: Any, items_of: Callable[[Any], Optional[Sequence[Any]]],
                combine: Callable[[Any, list[R]], R], leaf: Callable[[Any], R]) -> R:
    """Fold ``root`` bottom-up: ``combine(t, [results of t's items])`` for each
    tuple ``t`` (``items_of(t)`` is its items; None means "not a tuple") and
    ``leaf(x)`` for everything else.

    A tuple reached twice (shared) is folded once.  Any depth, constant stack.
    """
    if items_of(root) is None:
        return leaf(root)
    done: dict[int, R] = {}  # id of a tuple of ``root`` (kept alive by it) -> its result
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        t, ready = stack.pop()
        if id(t) in done:
            continue
        items = items_of(t)
        assert items is not None
        if not ready:
            stack.append((t, True))
            stack.extend((i, False) for i in items if items_of(i) is not None and id(i) not in done)
            continue
        done[id(t)] = combine(t, [done[id(i)] if items_of(i) is not None else leaf(i)
                                  for i in items])
    return done[id(root)]


__all__ = ["fold_nested"]

"""Pausing Python's cycle collector while a big program is built or walked.

Parsing, loading a dump, printing and compiling allocate many objects and free
few reference cycles meanwhile; when a large program is alive, each automatic
full collection rescans all of it, which can cost more than the work itself
and makes it superlinear.  Reference counting still frees garbage meanwhile.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from typing import Any, Callable, Iterator, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cycle collector inside the block (restoring its previous state)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def without_gc(fn: F) -> F:
    """Decorator: run ``fn`` with the cycle collector paused."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with gc_paused():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]

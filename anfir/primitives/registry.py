"""The op library's registry: one declaration per primitive, found by name.

A :class:`~anfir.ir.primitive.Primitive` carries everything anfir knows about
an operation — its numpy evaluation (``impl``), its arity, its abstract rule
(``infer``), its gradient rule (``bprop``: ANF text of ``lambda (x1, ...,
out, dout) ...`` returning the input gradients) and the facts passes read
(``foldable``, ``accepts_any``, ``fold_guard``, ``symbolic``...).  Adding an
op is one :func:`declare` call in the module of its family plus a row in
``docs/language.md``.

Names matter only at the edges: the parser and the ``.ir`` loader turn a name
into the object here; everything after works with the object.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from anfir.abstract.rules import ProbingRule
from anfir.ir.primitive import BpropText, MetaFunction, Primitive

PRIMITIVES: dict[str, Primitive] = {}
"""Every primitive by name."""
META_FUNCTIONS: dict[str, MetaFunction] = {}
"""Every meta function by name."""


def declare(name: str, arity: int | tuple[int, Optional[int]], impl: Callable[..., Any], *,
            doc: str = "", infer: Optional[Callable[..., Any]] = None,
            bprop: Optional[BpropText] = None, differentiable: bool = True,
            internal: bool = False, foldable: bool = True, family: str = "",
            accepts_any: bool = False,
            fold_guard: Optional[Callable[[Sequence[Any]], bool]] = None,
            symbolic: Optional[Callable[..., Any]] = None,
            structural_gradient: bool = False) -> Primitive:
    """Register a primitive named ``name`` and return it."""
    if name in PRIMITIVES or name in META_FUNCTIONS:
        raise ValueError(f"primitive {name!r} declared twice")
    lo, hi = (arity, arity) if isinstance(arity, int) else arity
    prim = Primitive(name, impl, lo, hi, doc, infer, bprop, differentiable, internal,
                     foldable, family, accepts_any, fold_guard, symbolic, structural_gradient)
    if isinstance(infer, ProbingRule):
        infer.impl = impl  # the rule learns result types from this primitive's evaluation
    PRIMITIVES[name] = prim
    return prim


def declare_meta(name: str, doc: str, min_args: int = 1,
                 max_args: Optional[int] = None) -> MetaFunction:
    """Register a meta function named ``name`` and return it (its generator is
    installed by the layer that implements it)."""
    if name in PRIMITIVES or name in META_FUNCTIONS:
        raise ValueError(f"meta function {name!r} declared twice")
    meta = MetaFunction(name, doc, min_args, max_args)
    META_FUNCTIONS[name] = meta
    return meta


def lookup(name: str) -> Primitive | MetaFunction | None:
    """The primitive or meta function called ``name`` (None if there is none)."""
    return PRIMITIVES.get(name) or META_FUNCTIONS.get(name)


__all__ = ["META_FUNCTIONS", "PRIMITIVES", "declare", "declare_meta", "lookup"]

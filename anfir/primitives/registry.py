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

import inspect
from typing import Any, Callable, Mapping, Optional, Sequence

from anfir.abstract.rules import ProbingRule
from anfir.ir.attrs import NO_ATTRS, Attrs, attr_key
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
            structural_gradient: bool = False,
            attrs: Optional[Mapping[str, Any]] = None,
            positional_attrs: int = 0) -> Primitive:
    """Register a primitive named ``name`` and return it.

    ``arity`` counts the inputs.  ``attrs`` declares the attributes and their
    defaults (in the order positional forms and gradient rules use them);
    ``positional_attrs`` says how many of the first ones may also be passed
    positionally after the inputs (then the inputs are a fixed number).
    """
    if name in PRIMITIVES or name in META_FUNCTIONS:
        raise ValueError(f"primitive {name!r} declared twice")
    lo, hi = (arity, arity) if isinstance(arity, int) else arity
    declared = Attrs(attrs) if attrs else NO_ATTRS
    positional = tuple(declared)[:positional_attrs]
    if positional_attrs:
        if lo != hi or len(positional) != positional_attrs:
            raise ValueError(f"{name}: positional attributes need a fixed number of inputs "
                             "and that many declared attributes")
        hi = lo + positional_attrs
    if declared:
        _check_impl_signature(name, impl, lo, declared, positional)
    prim = Primitive(name, impl, lo, hi, doc, infer, bprop, differentiable, internal,
                     foldable, family, accepts_any, fold_guard, symbolic, structural_gradient,
                     declared, positional)
    if isinstance(infer, ProbingRule):
        infer.impl = impl  # the rule learns result types from this primitive's evaluation
    PRIMITIVES[name] = prim
    return prim


def _check_impl_signature(name: str, impl: Callable[..., Any], inputs: int, attrs: Attrs,
                          positional: tuple[str, ...]) -> None:
    """The impl takes every attribute as a keyword with the declared default, and the
    positional ones right after the inputs: a declaration that disagrees with its
    own evaluation fails at import, not in a user's program."""
    params = inspect.signature(impl).parameters
    for attr, default in attrs.items():
        param = params.get(attr)
        if param is None or param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise ValueError(f"{name}: impl does not take the attribute {attr!r} as a keyword")
        if param.default is param.empty or attr_key(param.default) != attr_key(default):
            raise ValueError(f"{name}: impl's default for {attr!r} is not {default!r}")
    ordered = [p.name for p in params.values() if p.kind == p.POSITIONAL_OR_KEYWORD]
    if tuple(ordered[inputs:inputs + len(positional)]) != positional:
        raise ValueError(f"{name}: impl's positional parameters after the {inputs} inputs "
                         f"are not {positional}")


def declare_meta(name: str, doc: str, min_args: int = 1,
                 max_args: Optional[int] = None,
                 keywords: tuple[tuple[str, Any], ...] = (),
                 generate: Optional[Callable[[tuple[Any, ...]], Any]] = None,
                 generate_for_types: Optional[Callable[[tuple[Any, ...]], Any]] = None
                 ) -> MetaFunction:
    """Register a meta function named ``name`` and return it; ``keywords``: the trailing
    arguments a call may give by keyword, with their defaults; ``generate`` (and
    ``generate_for_types``): the graph a call stands for — a layer above builds it, so
    these call a slot of :data:`anfir.ir.upcalls.UPCALLS`."""
    if name in PRIMITIVES or name in META_FUNCTIONS:
        raise ValueError(f"meta function {name!r} declared twice")
    meta = MetaFunction(name, doc, min_args, max_args, generate=generate,
                        generate_for_types=generate_for_types)
    meta.keywords = keywords
    META_FUNCTIONS[name] = meta
    return meta


def lookup(name: str) -> Primitive | MetaFunction | None:
    """The primitive or meta function called ``name`` (None if there is none)."""
    return PRIMITIVES.get(name) or META_FUNCTIONS.get(name)


__all__ = ["META_FUNCTIONS", "PRIMITIVES", "declare", "declare_meta", "lookup"]

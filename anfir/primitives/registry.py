"""The primitive registry: one declaration per primitive.

A :class:`Primitive` carries everything anfir knows about an operation in one
place — its numpy evaluation (``impl``), its arity, its abstract rule
(``infer``: argument abstract values -> result abstract value), and its
gradient rule (``bprop``: ANF text of ``lambda (x1, ..., out, dout) ...`` that
returns the tuple of input gradients).  Adding an op is one :func:`declare`
call in the module of its family (``arith.py``, ``tensor.py``...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union


@dataclass(eq=False)
class Primitive:
    """A built-in operation.  Compared by identity; printed by name."""

    name: str
    """The name programs use (``add``) and dumps print."""
    impl: Callable[..., Any]
    """Evaluation on Python scalars / numpy arrays (strict, pure)."""
    min_args: int
    """Fewest arguments accepted."""
    max_args: Optional[int]
    """Most arguments accepted (None: any number)."""
    doc: str = ""
    """One line for the language reference: signature and meaning."""
    infer: Optional[Callable[..., Any]] = None
    """Abstract rule: ``infer(*arg_abstracts) -> abstract`` (see anfir.abstract.engine)."""
    bprop: Optional[Union[str, dict[int, str]]] = None
    """Gradient rule as ANF text: ``lambda (x..., out, dout) (dx, ...) end``
    (a dict from argument count to text when the arity varies)."""
    differentiable: bool = True
    """False for comparisons, logic, shapes: their inputs get zero gradients."""
    internal: bool = False
    """True for primitives that only transformations create (not in the language reference)."""
    foldable: bool = True
    """Whether the optimizer may evaluate it on constant arguments."""
    family: str = ""
    """The module that declares it (for the docs)."""
    extra: dict = field(default_factory=dict)
    """Free-form facts used by passes (e.g. ``{"commutative": True}``)."""

    def __repr__(self) -> str:
        return self.name

    def __call__(self, *args: Any) -> Any:
        return self.impl(*args)

    def accepts(self, count: int) -> bool:
        """Whether ``count`` arguments fit the arity."""
        return count >= self.min_args and (self.max_args is None or count <= self.max_args)

    def arity_text(self) -> str:
        """``2``, ``1 or 2``, ``at least 1``."""
        if self.max_args is None:
            return f"at least {self.min_args}"
        if self.max_args == self.min_args:
            return str(self.min_args)
        return f"{self.min_args} to {self.max_args}"


@dataclass(eq=False)
class MetaFunction:
    """A function on functions expanded by a transformation (``grad``).

    ``expand(fn_value, *static_args)`` builds the graph that stands for the
    call; the ``ad`` phase expands calls statically and the evaluator expands
    them when it meets them at run time, with the same code.
    """

    name: str
    doc: str
    min_args: int = 1
    max_args: Optional[int] = None
    generate: Optional[Callable[[tuple], Any]] = None
    """``generate(args) -> FuncGraph``: the graph that computes this call when
    applied to the same ``args`` (it only reads what it needs from them: the
    arity of a function argument, constant indices)."""
    internal: bool = False
    """True for meta functions only transformations create."""
    generate_for_types: Optional[Callable[[tuple], Any]] = None
    """``generate_for_types(abstract_args) -> FuncGraph | None``: the graph
    ``generate`` would make for arguments of these abstract values, or None
    when they do not determine it.  The specializer types a call of the meta
    function as a call of that graph (it types a private copy, so the graph
    may be a shared, cached one)."""

    def __repr__(self) -> str:
        return self.name

    def runtime(self, *args: Any) -> Any:
        """Evaluate a call of this meta function on run-time values."""
        from anfir.errors import AnfirError
        from anfir.eval import call_function

        if self.generate is None:
            raise AnfirError(f"{self.name} cannot be evaluated directly")
        return call_function(self.generate(args), args)

    def accepts(self, count: int) -> bool:
        """Whether ``count`` arguments fit the arity."""
        return count >= self.min_args and (self.max_args is None or count <= self.max_args)


PRIMITIVES: dict[str, Primitive] = {}
"""Every primitive by name."""
META_FUNCTIONS: dict[str, MetaFunction] = {}
"""Every meta function by name."""


def declare(name: str, arity: int | tuple[int, Optional[int]], impl: Callable[..., Any], *,
            doc: str = "", infer: Optional[Callable[..., Any]] = None,
            bprop: Optional[Union[str, dict[int, str]]] = None, differentiable: bool = True,
            internal: bool = False, foldable: bool = True, family: str = "",
            **extra: Any) -> Primitive:
    """Register a primitive named ``name`` and return it."""
    if name in PRIMITIVES:
        raise ValueError(f"primitive {name!r} declared twice")
    lo, hi = (arity, arity) if isinstance(arity, int) else arity
    prim = Primitive(name, impl, lo, hi, doc, infer, bprop, differentiable, internal,
                     foldable, family, dict(extra))
    PRIMITIVES[name] = prim
    return prim


def declare_meta(name: str, doc: str, min_args: int = 1, max_args: Optional[int] = None,
                 generate: Optional[Callable[[tuple], Any]] = None) -> MetaFunction:
    """Register a meta function named ``name`` and return it."""
    meta = MetaFunction(name, doc, min_args, max_args, generate)
    META_FUNCTIONS[name] = meta
    return meta


def lookup(name: str) -> Primitive | MetaFunction | None:
    """The primitive or meta function called ``name`` (None if there is none)."""
    return PRIMITIVES.get(name) or META_FUNCTIONS.get(name)

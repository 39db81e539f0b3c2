"""What a callee constant can be besides a graph: a primitive or a meta function.

The classes live in the IR layer because nodes hold them as values and every
layer above reads them; the *declarations* (one per operation, with their
rules) are the op library, :mod:`anfir.primitives`.  Everything a pass needs
to know about a primitive is a field here, read by the pass — never a list of
names kept somewhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, Union

from anfir.errors import AnfirTypeError
from anfir.ir.attrs import NO_ATTRS, Attrs, attr_key
from anfir.ir.nodes import CNode, Node, ValueNode

if TYPE_CHECKING:  # pragma: no cover
    from anfir.ir.graph import FuncGraph

BpropText = Union[str, dict[int, str]]
"""A gradient rule as ANF text, or such texts by argument count."""


class Arity:
    """Arity checks and their wording, shared by primitives and meta functions
    (which declare ``min_args`` and ``max_args``)."""

    min_args: int
    max_args: Optional[int]

    def accepts(self, count: int) -> bool:
        """Whether ``count`` arguments fit the arity."""
        return count >= self.min_args and (self.max_args is None or count <= self.max_args)

    def arity_text(self) -> str:
        """``2``, ``1 to 2``, ``at least 1``."""
        if self.max_args is None:
            return f"at least {self.min_args}"
        if self.max_args == self.min_args:
            return str(self.min_args)
        return f"{self.min_args} to {self.max_args}"

    def arity_words(self) -> str:
        """``1 argument``, ``2 arguments``, ``at least 1 arguments``... for messages."""
        text = self.arity_text()
        return f"{text} argument" if text == "1" else f"{text} arguments"


@dataclass(eq=False)
class Primitive(Arity):
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
    """Abstract rule: ``infer(*arg_abstracts) -> abstract`` (see anfir.infer.engine)."""
    bprop: Optional[BpropText] = None
    """Gradient rule as ANF text: ``lambda (x..., out, dout) (dx, ...) end``
    (a dict from argument count to text when the arity varies)."""
    differentiable: bool = True
    """False for comparisons, logic, shapes: their inputs get zero gradients."""
    internal: bool = False
    """True for primitives that only transformations create: programs cannot
    name them (they still load back from dumps), and the language reference
    leaves them out."""
    foldable: bool = True
    """Whether the optimizer may evaluate it on constant arguments."""
    family: str = ""
    """The module that declares it (for the docs)."""
    accepts_any: bool = False
    """Whether its abstract rule handles arguments of unknown type (``AAny``)
    itself; for the others the engine answers ``AAny`` without calling it."""
    fold_guard: Optional[Callable[[Sequence[Any]], bool]] = None
    """``fold_guard(values) -> bool``: whether folding on these constant
    arguments is cheap enough to do at compile time (``pow`` refuses huge
    integer exponents); None: always."""
    symbolic: Optional[Callable[..., Any]] = None
    """The same operation on sympy dimension expressions, when it has one
    (``add`` on ``N`` and ``1`` is ``N + 1``), so shapes fold symbolically."""
    structural_gradient: bool = False
    """True when the J transform builds its gradient itself from the call's
    shape rather than from a ``bprop`` text (``make_tuple``: one getitem per
    argument, whatever their number)."""
    attrs: Attrs = NO_ATTRS
    """The attributes a call may give as keyword arguments, with their
    defaults, in order (``{axis: None, keepdims: False}``).  ``impl`` takes
    them as keyword arguments with these defaults; ``infer`` receives all of
    them (defaults filled in) as keyword arguments; a ``bprop`` text takes
    them as parameters after the inputs (see :meth:`rule_parameters`)."""
    positional_attrs: tuple[str, ...] = ()
    """The first attributes, in order, that may also be passed positionally
    after the inputs (``sum(x, 1)`` is ``sum(x, axis=1)``).  A primitive with
    positional attributes has a fixed number of inputs, ``min_args``;
    ``max_args`` counts the positional attributes too."""

    def __repr__(self) -> str:
        return self.name

    def __call__(self, *args: Any) -> Any:
        return self.impl(*args)

    def bprop_text(self, nargs: int) -> Optional[str]:
        """The gradient rule's text for a call with ``nargs`` inputs, if any."""
        rule = self.bprop
        if isinstance(rule, dict):
            return rule.get(nargs)
        return rule

    # -- attributes -------------------------------------------------------------------
    def input_count(self, nargs: int) -> int:
        """How many of ``nargs`` positional arguments are inputs (the rest stand for
        the first positional attributes)."""
        return min(nargs, self.min_args) if self.positional_attrs else nargs

    def rule_parameters(self, ninputs: int) -> int:
        """How many parameters the gradient rule for ``ninputs`` inputs takes: the
        inputs, every attribute (declared order), ``out`` and ``dout``."""
        return ninputs + len(self.attrs) + 2

    def canonical_attrs(self, given: Union[Mapping[str, Any], Sequence[tuple[str, Any]]]) -> Attrs:
        """The canonical form of a call's attributes: names checked, declaration
        order, values equal (in type) to their default left out, and an integer
        given for a float attribute made a float.  Raises an unlocated
        :class:`AnfirTypeError` for a name the primitive does not declare."""
        pairs = list(given.items()) if isinstance(given, Mapping) else list(given)
        if not pairs:
            return NO_ATTRS
        values: dict[str, Any] = {}
        for name, value in pairs:
            if name not in self.attrs:
                raise AnfirTypeError(f"{self.name} has no attribute '{name}' "
                                     f"({self.attrs_text()})")
            if name in values:
                raise AnfirTypeError(f"attribute '{name}' of {self.name} is given twice")
            default = self.attrs[name]
            if type(default) is float and type(value) is int:
                value = float(value)
            values[name] = value
        kept = [(name, values[name]) for name in self.attrs
                if name in values and attr_key(values[name]) != attr_key(self.attrs[name])]
        return Attrs(kept) if kept else NO_ATTRS

    def bound_attrs(self, attrs: Mapping[str, Any], positional: Sequence[Any] = ()) -> dict[str, Any]:
        """Every attribute's value for a call: the defaults, overridden by the
        ``positional`` values (of the first positional attributes) and by ``attrs``."""
        if len(positional) > len(self.positional_attrs):
            raise AnfirTypeError(f"{self.name} takes {self.arity_text()} positional arguments")
        full = dict(self.attrs)
        for name, value in zip(self.positional_attrs, positional):
            if name in attrs:
                raise AnfirTypeError(f"attribute '{name}' of {self.name} is given both "
                                     "positionally and as a keyword")
            full[name] = value
        full.update(attrs)
        return full

    def attrs_text(self) -> str:
        """``its attributes are axis, keepdims`` (or ``it has no attributes``)."""
        if not self.attrs:
            return "it has no attributes"
        return "its attributes are " + ", ".join(self.attrs)


@dataclass(eq=False)
class MetaFunction(Arity):
    """A function on functions expanded by a transformation (``grad``).

    ``generate(args) -> FuncGraph`` builds the graph that stands for a call on
    these (run-time) arguments; the ``ad`` phase expands calls statically and
    the evaluator expands them when it meets them at run time, with the same
    code.  The declarations of the language's meta functions live in
    :mod:`anfir.primitives.meta`; their generators belong to the autodiff
    layer, which installs them (:mod:`anfir.wiring`).
    """

    name: str
    doc: str
    min_args: int = 1
    max_args: Optional[int] = None
    generate: Optional[Callable[[tuple[Any, ...]], FuncGraph]] = None
    """``generate(args) -> FuncGraph``: the graph that computes this call when
    applied to the same ``args`` (it only reads what it needs from them: the
    arity of a function argument, constant indices)."""
    internal: bool = False
    """True for meta functions only transformations create."""
    generate_for_types: Optional[Callable[[tuple[Any, ...]], Optional[FuncGraph]]] = None
    """``generate_for_types(abstract_args) -> FuncGraph | None``: the graph
    ``generate`` would make for arguments of these abstract values, or None
    when they do not determine it.  The specializer types a call of the meta
    function as a call of that graph (it types a private copy, so the graph
    may be a shared, cached one)."""
    keywords: tuple[tuple[str, Any], ...] = ()
    """The trailing arguments a call may also give by keyword, with their defaults, in
    order (``vmap(f, in_axes=0, out_axes=1)``): the resolver makes them positional."""

    def __repr__(self) -> str:
        return self.name



Callee = Union[Primitive, MetaFunction]
"""A built-in callee value."""


def call_attrs(node: Optional[Node], prim: Any) -> Attrs:
    """The attributes of ``node`` when it is a call of the primitive constant
    ``prim`` (the call site of a rule), else none."""
    if isinstance(node, CNode) and node.attrs and node.inputs:
        head = node.inputs[0]
        if isinstance(head, ValueNode) and head.value is prim:
            return node.attrs
    return NO_ATTRS


def callee_primitive(node: Node) -> Optional[Primitive]:
    """The primitive a CNode calls (its callee is a primitive constant), else None."""
    if not isinstance(node, CNode) or not node.inputs:
        return None
    head = node.inputs[0]
    if isinstance(head, ValueNode) and isinstance(head.value, Primitive):
        return head.value
    return None

__all__ = ["Arity", "BpropText", "Callee", "MetaFunction", "Primitive", "call_attrs",
           "callee_primitive"]

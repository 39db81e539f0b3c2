"""The ``specialize`` phase: abstract interpretation, one graph clone per signature.

Entry points:

* :func:`specialize` / :func:`run` — the phase: returns a typed clone of the
  entry (and of everything it reaches); the user's graphs are not modified.
* :func:`infer_new_graph` — types a graph built after this phase (the ``ad``
  phase's gradient graphs) in place, without re-inferring anything else.
* :func:`infer_call` / :func:`infer_node` — local re-typing for rewrites.
* :func:`abstract_of_value`, :func:`abstract_from_annotation_text` — the
  abstract values of example arguments and of type strings.

After this phase every CNode, ParameterNode and ValueNode of the result has
``node.abstract``, and every specialized graph has ``graph.abstract`` (a
:class:`~anfir.abstract.values.GraphSig`).  See :mod:`anfir.infer.engine`
for how recursion, closures and errors are handled.
"""

from __future__ import annotations

from typing import Any, Generator, Optional, Sequence

from anfir.infer.engine import Engine, Infer, InPlaceProvider, Request, Spec
from anfir.abstract.lattice import BOTTOM, abstract_of_value, widen
from anfir.abstract.dimranges import check_signature_ranges
from anfir.abstract.shapes import reset_fresh_dims
from anfir.infer.specializer import CloneProvider
from anfir.abstract.typeann import abstract_from_annotation, abstract_from_annotation_text
from anfir.abstract.values import AbstractValue
from anfir.errors import AnfirError, ArityError, InferenceError
from anfir.ir.attrs import NO_ATTRS, Attrs
from anfir.ir.graph import FuncGraph
from anfir.location import Location
from anfir.ir.nodes import CNode

__all__ = ["abstract_from_annotation_text", "abstract_of_value", "entry_signature", "infer_call",
           "infer_new_graph", "infer_node", "run", "specialize"]


def entry_signature(entry: FuncGraph, arg_abstracts: Optional[Sequence[Any]]) -> tuple[AbstractValue, ...]:
    """The entry's argument abstracts: from examples (values forgotten) or from annotations."""
    if arg_abstracts is None:
        binding: dict = {}
        sig = []
        for param in entry.parameters:
            if param.annotation is None:
                raise InferenceError(f"cannot specialize without example arguments or annotations: "
                                     f"parameter {param.name}", param.loc or entry.loc)
            sig.append(abstract_from_annotation(param.annotation, binding))
        return tuple(sig)
    args = list(arg_abstracts)
    if len(args) != len(entry.parameters):
        raise ArityError(f"@{entry.name} takes {len(entry.parameters)} argument"
                         f"{'' if len(entry.parameters) == 1 else 's'}, got {len(args)}", entry.loc)
    result = []
    for arg in args:
        try:
            result.append(widen(abstract_of_value(arg)))
        except AnfirError as exc:
            raise type(exc)(exc.message, exc.loc or entry.loc, exc.hint) from None
    # Once per compile, at the entry: sizes outside the ranges its dimension
    # variables declare (``#@ ranges``) are refused before anything is inferred.
    check_signature_ranges(entry, result)
    return tuple(result)


def specialize(entry: FuncGraph, arg_abstracts: Optional[Sequence[Any]] = None) -> FuncGraph:
    """Infer ``entry`` for ``arg_abstracts`` (example values or abstract values; None: the
    annotations) and return its specialized clone, every reachable node typed."""
    reset_fresh_dims()
    sig = entry_signature(entry, arg_abstracts)
    provider = CloneProvider()
    engine = Engine(provider)

    def root() -> Generator[Request, Any, Spec]:
        spec, _ = yield ("call", entry, sig, None)
        return spec

    spec = engine.drive(root())
    _raise_if_always_failing(engine, spec.out)
    return provider.finalize(engine, spec)


def _raise_if_always_failing(engine: Engine, out: AbstractValue) -> None:
    """Reject a program whose result is ⊥ because a call on every path raises (a
    gradient w.r.t. an integer); one that only might reach such a call compiles, and
    raises there when it runs, as ``anfir.run`` does."""
    if out is BOTTOM and engine.failures:
        raise engine.failures[0]


def run(entry: FuncGraph, arg_abstracts: Optional[Sequence[Any]] = None) -> FuncGraph:
    """The phase entry used by the pipeline: same as :func:`specialize`."""
    return specialize(entry, arg_abstracts)


def infer_new_graph(graph: FuncGraph, arg_abstracts: Sequence[AbstractValue]) -> AbstractValue:
    """Type a freshly built ``graph`` in place for ``arg_abstracts``; return its output type.

    Graphs it calls that already have ``graph.abstract`` are trusted; untyped
    graphs it calls or creates are typed in place too.  Its free variables must
    already carry ``.abstract``.  Nothing else is re-inferred.
    """
    provider = InPlaceProvider()
    engine = Engine(provider)
    if len(arg_abstracts) != len(graph.parameters):
        raise ArityError(f"@{graph.name} takes {len(graph.parameters)} arguments, "
                         f"got {len(arg_abstracts)}", graph.loc)
    sig = tuple(widen(a) for a in arg_abstracts)
    saved, graph.abstract = graph.abstract, None  # type it even if it carries a stale signature

    def root() -> Infer:
        _, out = yield ("call", graph, sig, None)
        return out

    try:
        out = engine.drive(root())
        _raise_if_always_failing(engine, out)
    except BaseException:
        graph.abstract = saved
        raise
    provider.finish(engine)
    return out


def infer_call(callee_abstract: AbstractValue, arg_abstracts: Sequence[AbstractValue],
               loc: Optional[Location] = None, attrs: Attrs = NO_ATTRS) -> AbstractValue:
    """The abstract result of calling ``callee_abstract`` on ``arg_abstracts`` (with the
    call attributes ``attrs``, for a primitive callee).

    Typed graphs are trusted; untyped ones are typed in place.  Errors point at ``loc``.
    """
    provider = InPlaceProvider()
    engine = Engine(provider)
    site = _LocatedSite(loc, attrs) if loc is not None or attrs else None

    def root() -> Infer:
        return (yield from engine.call(callee_abstract, tuple(arg_abstracts), site))  # type: ignore[arg-type]

    out = engine.drive(root())
    _raise_if_always_failing(engine, out)
    provider.finish(engine)
    if out is BOTTOM:
        raise InferenceError("the call never returns a value", loc)
    return out


def infer_node(node: CNode) -> AbstractValue:
    """Re-type one CNode from its inputs' abstracts (constants are typed on the way); sets
    and returns ``node.abstract``."""
    provider = InPlaceProvider()
    engine = Engine(provider)

    def root() -> Infer:
        return (yield from engine.infer_cnode(node))

    out = engine.drive(root())
    provider.finish(engine)
    node.abstract = out
    return out


class _LocatedSite:
    """A stand-in call node that only carries a location and the call's attributes
    (for :func:`infer_call`)."""

    def __init__(self, loc: Optional[Location], attrs: Attrs = NO_ATTRS) -> None:
        self.loc = loc
        self.attrs = attrs
        self.inputs = ()

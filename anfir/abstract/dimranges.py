"""Ranges of dimension variables, checked once where a call enters a graph.

A definition may say which sizes its dimension variables take, in its
``ranges`` attribute (``graph.flags["meta"]["ranges"]``, written ``#@ ranges
{"s17": [2, 8]}`` above the ``def`` and ``meta ranges = ...`` in ``.ir``
dumps): each variable maps to ``[low, high]``, inclusive, ``null`` for an
unbounded side.  The torch.export importer writes the ranges torch proved for
its ``Dim``\\ s there.  Being metadata, the ranges travel with the graph through
text, dumps and every clone the passes make, and change nothing the graph
computes; they are a guard on its *arguments*:

* :func:`check_argument_ranges` — concrete arguments (``anfir.run``, the
  ``anfir run`` command), before the first node runs;
* :func:`check_signature_ranges` — the argument types a compile specializes
  for (``anfir.compile(..., args=...)``), before inference starts.

Both bind each ranged variable to the size it has in the first parameter
that uses it, refuse a parameter that gives it another size, and refuse a
size outside the range, with a :class:`~anfir.errors.DimensionRangeError`
that names the parameter, the variable, the size and the range (what
torch.export's own guards say).  Variables without a range are left to the
specializer's annotation check; a graph without ``ranges`` costs one dict
lookup per call.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from anfir.abstract.values import ATensor, ATuple
from anfir.errors import DimensionRangeError
from anfir.ir.annotations import TensorAnn, TupleAnn
from anfir.ir.graph import FuncGraph
from anfir.location import Location

RANGES = "ranges"
"""The definition attribute that holds the ranges of its dimension variables."""

Range = tuple[Optional[int], Optional[int]]
"""Inclusive bounds of a dimension variable; None for an unbounded side."""

__all__ = ["RANGES", "Range", "check_argument_ranges", "check_signature_ranges",
           "declared_ranges", "range_text"]


def declared_ranges(graph: FuncGraph) -> dict[str, Range]:
    """The ranges ``graph``'s ``ranges`` attribute declares ({} without one).

    The attribute comes from user text, so a malformed one is a located error,
    not a silently ignored guard."""
    meta = graph.flags.get("meta")
    raw = meta.get(RANGES) if isinstance(meta, dict) else None
    if raw is None:
        return {}
    where = f"the {RANGES} attribute of @{graph.name}"
    if not isinstance(raw, dict):
        raise DimensionRangeError(f"{where} maps dimension variables to [low, high], "
                                  f"not {type(raw).__name__}", graph.loc)
    result: dict[str, Range] = {}
    for name, bounds in raw.items():
        if (not isinstance(bounds, list) or len(bounds) != 2
                or not all(b is None or (isinstance(b, int) and not isinstance(b, bool)) for b in bounds)):
            raise DimensionRangeError(f"{where}: the range of {name} must be [low, high] "
                                      f"(integers or null), not {bounds!r}", graph.loc)
        low, high = bounds
        if low is not None and high is not None and low > high:
            raise DimensionRangeError(f"{where}: the range of {name} is empty ([{low}, {high}])",
                                      graph.loc)
        result[str(name)] = (low, high)
    return result


def range_text(bounds: Range) -> str:
    """``[2, 8]``; ``[2, inf]`` for an unbounded side."""
    low, high = bounds
    return f"[{'-inf' if low is None else low}, {'inf' if high is None else high}]"


def check_argument_ranges(graph: Any, args: Sequence[Any]) -> None:
    """Refuse concrete ``args`` of ``graph`` whose sizes break its declared ranges
    (anything but a FuncGraph with ``ranges``, or a call of the wrong arity, is
    left to the call itself)."""
    if not isinstance(graph, FuncGraph):
        return
    ranges = declared_ranges(graph)
    if ranges and len(args) == len(graph.parameters):
        _check(graph, ranges, [_value_shape_tree(a) for a in args])


def check_signature_ranges(graph: FuncGraph, abstracts: Sequence[Any]) -> None:
    """Refuse argument types (abstract values) whose known sizes break ``graph``'s
    declared ranges; a symbolic size is not checked (it is no call yet)."""
    ranges = declared_ranges(graph)
    if ranges and len(abstracts) == len(graph.parameters):
        _check(graph, ranges, [_abstract_shape_tree(a) for a in abstracts])


# A "shape tree" mirrors an argument: a tuple of ints/None for a tensor (None: a
# size not known), a list of shape trees for a tuple, None for anything else.
def _value_shape_tree(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_value_shape_tree(v) for v in value]
    shape = getattr(value, "shape", None)
    if isinstance(shape, tuple) and all(isinstance(d, int) for d in shape):
        return shape
    return None


def _abstract_shape_tree(abstract: Any) -> Any:
    if isinstance(abstract, ATuple):
        return [_abstract_shape_tree(a) for a in abstract.items]
    if isinstance(abstract, ATensor) and abstract.shape is not None:
        return tuple(_concrete(d) for d in abstract.shape)
    return None


def _concrete(dim: Any) -> Optional[int]:
    if isinstance(dim, int):
        return dim
    if getattr(dim, "is_Integer", False):
        return int(dim)
    return None


def _check(graph: FuncGraph, ranges: dict[str, Range], trees: list[Any]) -> None:
    bound: dict[str, tuple[int, str]] = {}  # variable -> (size, where it was bound)
    for index, (param, tree) in enumerate(zip(graph.parameters, trees)):
        what = f"argument {index + 1} ({param.name}) of @{graph.name}"
        loc = _loc(param.annotation) or param.loc or graph.loc
        # Tuples of tensors nest; walked with a stack (annotations may nest deep).
        stack = [(param.annotation, tree)]
        while stack:
            ann, shape = stack.pop()
            if isinstance(ann, TupleAnn):
                if isinstance(shape, list) and len(shape) == len(ann.items):
                    stack.extend(reversed(list(zip(ann.items, shape))))
                continue
            if not isinstance(ann, TensorAnn) or not isinstance(shape, tuple):
                continue
            if "*" in ann.dims or len(ann.dims) != len(shape):
                continue  # the rank is the specializer's (or the code's) to report
            for axis, (name, size) in enumerate(zip(ann.dims, shape)):
                if isinstance(name, int) and not isinstance(name, bool) and size is not None \
                        and size != name:
                    # A static size of a graph that declares ranges (an imported
                    # torch.export program): torch's guard refuses it too, and
                    # inside it would fail deep, as a broadcast of other sizes.
                    raise DimensionRangeError(
                        f"{what}, dimension {axis} has size {size}, but @{graph.name} was "
                        f"exported for size {name} there (annotation {ann})", loc,
                        "the dimension is static in the program: export it with a "
                        "torch.export.Dim to let it vary")
                if not isinstance(name, str) or name not in ranges or size is None:
                    continue
                where = f"{what}, dimension {axis}"
                low, high = ranges[name]
                if (low is not None and size < low) or (high is not None and size > high):
                    raise DimensionRangeError(
                        f"{where} has size {size}, outside the range of {name} "
                        f"{range_text(ranges[name])} (annotation {ann})", loc,
                        f"the range is @{graph.name}'s `#@ {RANGES}` attribute (an imported "
                        "torch.export program's: its Dim's min and max)")
                first = bound.setdefault(name, (size, where))
                if first[0] != size:
                    raise DimensionRangeError(
                        f"{where} has size {size}, but {name} is {first[0]} in {first[1]} "
                        f"(annotation {ann})", loc)


def _loc(ann: Any) -> Optional[Location]:
    return getattr(ann, "loc", None)

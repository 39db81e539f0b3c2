"""Type annotations as written in ANF text (``f64``, ``f64[N, *]``, ``(f32, i64)``).

These are syntax, kept on parameters, let-bound nodes (``node.annotation``)
and graphs (``graph.flags["return_type"]``); the specializer turns them into
abstract values and checks them.  ``str()`` prints the source syntax back;
:mod:`anfir.ir.type_syntax` reads and checks it (the type names are the rows
of :mod:`anfir.dtypes`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from anfir.location import Location
from anfir.nested import nested_text

DimAnn = Union[int, str]
"""A dimension: an int, a dimension variable name, or ``"*"`` (any rank/dims)."""


@dataclass(frozen=True)
class ScalarAnn:
    """A scalar type: ``f64``, ``i64``, ``bool``, ``str``..."""

    dtype: str
    loc: Optional[Location] = field(default=None, compare=False)

    def __str__(self) -> str:
        return self.dtype


@dataclass(frozen=True)
class TensorAnn:
    """A tensor type ``dtype[dims]``; a ``"*"`` dim stands for any number of dims."""

    dtype: str
    dims: tuple[DimAnn, ...]
    loc: Optional[Location] = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(str(d) for d in self.dims)}]"


@dataclass(frozen=True)
class TupleAnn:
    """A tuple type ``(T1, T2, ...)``."""

    items: tuple["TypeAnn", ...]
    loc: Optional[Location] = field(default=None, compare=False)

    def __str__(self) -> str:
        # Written without recursion: a crafted annotation may nest thousands deep.
        return nested_text(self, _ann_items, str)


def _ann_items(ann: Any) -> Optional[tuple["TypeAnn", ...]]:
    return ann.items if isinstance(ann, TupleAnn) else None


TypeAnn = Union[ScalarAnn, TensorAnn, TupleAnn]

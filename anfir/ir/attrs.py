"""Attributes of a call: the static keyword arguments of a primitive.

``sum(x, axis=1, keepdims=true)`` is a CNode with one input ``x`` and the
attributes ``{axis: 1, keepdims: true}`` — MindSpore's ``primitive_attrs``,
ONNX's node attributes.  They are part of the call node, not inputs: values
fixed at compile time (``None``, booleans, integers, floats, strings and
tuples of those), which every pass keeps and the rules of the primitive read.

:class:`Attrs` is the immutable mapping a CNode holds (``node.attrs``).  Two
mappings are equal when they have the same names with values equal *in type
and value* (``1``, ``1.0`` and ``True`` differ; ``-0.0`` is not ``0.0``), so
common-subexpression elimination merges only calls with equal attributes.
The primitive's declaration says which attributes it has and their defaults
(:attr:`anfir.ir.primitive.Primitive.attrs`); a call's mapping is kept in
canonical form by whoever builds it: in declaration order, without the
attributes that equal their default (see ``Primitive.canonical_attrs``).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Iterator, Mapping, Union

from anfir.nested import fold_nested

AttrValue = Union[None, bool, int, float, str, tuple[Any, ...]]
"""What an attribute may hold: a literal, None, a string, or a tuple of those."""

_SCALARS = (bool, int, float, str)


def _items_of(value: Any) -> Any:
    return value if isinstance(value, tuple) else None


def is_attr_value(value: Any) -> bool:
    """Whether ``value`` can be an attribute: None, bool, int, float, str, or a
    tuple (nested to any depth) of those.  NaN is not one (it equals nothing)."""
    def leaf(v: Any) -> bool:
        if v is None or type(v) in (bool, int, str):
            return True
        return type(v) is float and not math.isnan(v)

    return fold_nested(value, _items_of, lambda _t, items: all(items), leaf)


def attr_key(value: Any) -> Any:
    """A hashable key equal for two attribute values exactly when they are equal
    in type and value (``1``, ``1.0`` and ``True`` differ; floats by ``repr``)."""
    def leaf(v: Any) -> Any:
        if type(v) is float:
            return ("float", repr(v))
        return (type(v).__name__, v)

    return fold_nested(value, _items_of, lambda _t, items: ("tuple", tuple(items)), leaf)


class Attrs(Mapping[str, Any]):
    """An immutable, ordered mapping from attribute names to attribute values.

    Hashable; equal to another :class:`Attrs` with the same names and values
    equal in type (see :func:`attr_key`), whatever the order.  ``str()`` is
    the ``.ir`` dump's spelling without the braces' contents reformatted:
    ``{axis: 1, keepdims: True}`` (printers spell values themselves).
    """

    __slots__ = ("_items", "_index", "_key")

    def __init__(self, items: Union[Mapping[str, Any], Iterable[tuple[str, Any]]] = ()) -> None:
        pairs = tuple(items.items() if isinstance(items, Mapping) else items)
        index: dict[str, Any] = {}
        for name, value in pairs:
            if not isinstance(name, str):
                raise TypeError(f"an attribute name is a string, not {name!r}")
            if name in index:
                raise ValueError(f"attribute {name!r} given twice")
            if not is_attr_value(value):
                raise TypeError(f"attribute {name!r}: {value!r} is not a constant "
                                "(None, bool, int, float, str or a tuple of them)")
            index[name] = value
        self._items = pairs
        self._index = index
        self._key = frozenset((name, attr_key(value)) for name, value in pairs)

    def __getitem__(self, name: str) -> Any:
        return self._index[name]

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Attrs):
            return self._key == other._key
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._key)

    @property
    def key(self) -> frozenset[tuple[str, Any]]:
        """The hashable, type-exact identity of the mapping (order-free)."""
        return self._key

    def pairs(self) -> tuple[tuple[str, Any], ...]:
        """``(name, value)`` in order."""
        return self._items

    def __repr__(self) -> str:
        return "{" + ", ".join(f"{name}: {value!r}" for name, value in self._items) + "}"


NO_ATTRS = Attrs()
"""The attributes of a call that has none (the default of every CNode)."""


__all__ = ["AttrValue", "Attrs", "NO_ATTRS", "attr_key", "is_attr_value"]

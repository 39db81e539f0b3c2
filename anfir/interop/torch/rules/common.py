"""What the torch.export importer's rules share: the rule protocol, the one table
they fill, and the helpers more than one family uses.

A rule maps one ATen op (an ``OpOverload`` of core ATen after
``run_decompositions()``, or of torch.export's training IR), a Python operator on
sizes, or a higher-order op to anfir's operator library: ``rule(b, *args, **kwargs)``
gets a :class:`~anfir.interop.torch.importer.Builder` and the op's arguments with FX
nodes already replaced by anfir nodes, and returns the node computing the op's
result (a tuple for ops with several results).  Rules hold the primitive objects
of :mod:`anfir.primitives` (never their names), so a missing primitive is an
error when the rules are imported, which mypy sees; an op with no entry is the
importer's "unsupported op" error, never a partial graph.

The rules live in one module per family of the anfir primitive they produce,
named as in ``anfir/primitives/`` (``arith.py``, ``nn.py``, ``conv.py`` ...); each
family's ``rules(torch, table)`` adds its entries to one :class:`RuleTable`, and
:func:`anfir.interop.torch.rules.full_table` calls them in a fixed order.  A
second rule for an op already in the table is an error, so the table does not
depend on that order.
"""

from __future__ import annotations

from typing import Any, Callable

from anfir.errors import AnfirError
from anfir.interop import attributes
from anfir.ir.nodes import Node
from anfir.ir.primitive import Primitive
from anfir.primitives import tensor


Rule = Callable[..., Any]
"""``rule(b, *args, **kwargs) -> node`` (see the module's docstring)."""


class RuleTable:
    """The importer's one table from op to rule, filled by each family's ``rules``."""

    def __init__(self, torch: Any) -> None:
        self.aten = torch.ops.aten
        self.rules: dict[Any, Rule] = {}

    def put(self, op: Any, rule: Rule) -> None:
        """Add the rule of ``op`` (an ``OpOverload``, Python operator or higher-order op)."""
        if op in self.rules:
            # Two families claiming one op would make the table depend on their order.
            raise AnfirError(f"two torch import rules for {op}")
        self.rules[op] = rule

    def named(self, name: str, overload: str, rule: Rule) -> None:
        """Add the rule of ``torch.ops.aten.<name>.<overload>`` if this torch has that op
        (ops of torch.export's training IR come and go between versions)."""
        op = getattr(getattr(self.aten, name, None), overload, None)
        if op is not None:
            self.put(op, rule)


def dim_axes(dim: Any) -> Any:
    """A torch ``dim`` argument as an anfir ``axis`` attribute (None: every axis)."""
    if dim is None:
        return None
    if isinstance(dim, (list, tuple)):
        return None if len(dim) == 0 else tuple(int(d) for d in dim)
    return int(dim)


def unary(prim: Primitive) -> Rule:
    """The rule of an op that is ``prim`` of its one argument."""
    return lambda b, x: b.call(prim, x)


def binary(prim: Primitive) -> Rule:
    """The rule of an op that is ``prim`` of its two arguments (tensors, scalars or,
    for Python's operators on SymInts, sizes)."""
    return lambda b, x, y: b.call(prim, x, y)


def reduction(prim: Primitive, all_when_empty: bool = True) -> Rule:
    """The rule of a reduction ``op(x, dim=None, keepdim=False, *, dtype=None)`` as ``prim``."""

    def rule(b: Any, x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
        out = b.call(prim, x, axis=dim_axes(dim), keepdims=bool(keepdim))
        return b.call(tensor.cast, out, dtype) if dtype is not None else out
    return rule


def int_tuple(values: Any, n: int) -> tuple[int, ...]:
    """A torch int-list argument (one int stands for every axis) as n ints."""
    items = list(values) if isinstance(values, (list, tuple)) else [values]
    if len(items) == 1:
        items = items * n
    return tuple(int(v) for v in items)


def window_ints(values: Any, n: int) -> Any:
    """A torch int-list argument (stride, padding per axis, dilation, kernel) as an
    anfir window attribute in its one short form (:mod:`anfir.interop.attributes`)."""
    return attributes.per_axis(int_tuple(values, n), n)


def require_static(b: Any, what: str, *values: Any) -> None:
    """Refuse symbolic (node) values where anfir wants static attributes."""
    if any(isinstance(v, Node) for v in values):
        raise AnfirError(f"{what} with a symbolic (data-dependent or dynamic) bound", b.loc)


def array_node(b: Any, value: Any) -> Any:
    """A small constant array as ``array(((...), ...))`` — the call the ANF text of
    an array literal parses to, so printed programs re-parse to the same graph.
    Built level by level, innermost first (no recursion)."""
    items: list[Any] = [bool(v) if value.dtype == bool else v.item() for v in value.reshape(-1)]
    for size in reversed(value.shape):
        items = [b.tuple_of(items[i:i + size]) for i in range(0, len(items), size)]
    return b.call(tensor.array, items[0])


def arg_shape(b: Any, index: int = 0) -> Any:
    """The (FakeTensor) shape of the node's argument ``index``."""
    return tuple(b.fx_node.args[index].meta["val"].shape)


def static_arg_shape(b: Any, what: str, index: int = 0) -> tuple[int, ...]:
    """The shape of the node's argument ``index``, refused (``what`` says which op)
    when a dimension is dynamic."""
    shape = arg_shape(b, index)
    if not all(isinstance(d, int) for d in shape):
        raise AnfirError(f"{what} with a dynamic shape {shape}", b.loc)
    return tuple(int(d) for d in shape)


def out_value(b: Any) -> Any:
    """The FX node's own result as torch.export traced it (a FakeTensor, or a SymInt)."""
    return b.fx_node.meta.get("val")


def cast_const(b: Any, value: Any, dtype: str) -> Any:
    """The constant ``value`` as a scalar of ``dtype``."""
    return b.call(tensor.cast, value, dtype)


def size_limit(size: Any) -> int:
    """An end at or past which a slice reaches the end of an axis of ``size``
    (a static size itself; for a dynamic one, torch's ``sys.maxsize``-like ends)."""
    return size if isinstance(size, int) else 2 ** 62

"""Type annotations as abstract values, and checking values against annotations.

A *binding* maps dimension-variable names to dimensions; it is shared by all
the annotations of one signature, so ``w1: f64[D, H], w2: f64[H, K]`` makes the
two ``H`` the same symbol.  ``*`` in a shape stands for any number of
dimensions (the tensor's rank is then unknown when built from the annotation,
but the dimensions before the ``*`` are kept: ``ATensor.leading``).
"""

from __future__ import annotations

from typing import Any, Optional

from anfir.abstract.shapes import dim_symbol, dims_compatible, is_unknown_dim
from anfir.abstract.values import (AAny, AbstractValue, AScalar, AString, ATensor, ATuple, Dim,
                                   dim_text)
from anfir.nested import fold_nested
from anfir.ir.annotations import DimAnn, ScalarAnn, TensorAnn, TupleAnn, TypeAnn
from anfir.ir.type_syntax import parse_type_text  # the one reader of type text (re-exported)

Binding = dict[str, Dim]


def abstract_from_annotation(ann: TypeAnn, binding: Optional[Binding] = None) -> AbstractValue:
    """The abstract value an annotation describes (dimension variables from ``binding``).

    Tuples may nest to any depth: they are folded without recursion."""
    binding = {} if binding is None else binding
    return fold_nested(ann, _tuple_items,
                       lambda _t, items: ATuple(tuple(items)),
                       lambda leaf: _abstract_of_leaf(leaf, binding))


def _tuple_items(ann: Any) -> Optional[tuple[TypeAnn, ...]]:
    return ann.items if isinstance(ann, TupleAnn) else None


def _abstract_of_leaf(ann: TypeAnn, binding: Binding) -> AbstractValue:
    if isinstance(ann, ScalarAnn):
        return AString() if ann.dtype == "str" else AScalar(ann.dtype)
    if isinstance(ann, TensorAnn):
        star = "*" in ann.dims
        # With a ``*`` only the dimensions before it are kept (``f64[N, *]``: rank >= 1,
        # first dimension N); the ones after it are checked on values, not represented.
        written = ann.dims[:ann.dims.index("*")] if star else ann.dims
        dims: list[Dim] = []
        for d in written:
            if isinstance(d, int):
                dims.append(d)
            else:
                dims.append(binding.setdefault(d, dim_symbol(d)))
        if star:
            return ATensor(ann.dtype, None, tuple(dims))
        return ATensor(ann.dtype, tuple(dims))
    raise TypeError(f"not an annotation: {ann!r}")


def match_annotation(ann: TypeAnn, value: AbstractValue, binding: Binding) -> Optional[str]:
    """Check ``value`` against ``ann``, binding new dimension variables.

    Returns None when it fits, else a short reason.  A 0-d tensor fits a
    scalar annotation and vice versa; ``AAny`` fits everything.  Tuples are
    checked element by element, left to right, without recursion.
    """
    stack: list[tuple[TypeAnn, AbstractValue]] = [(ann, value)]
    while stack:
        ann, value = stack.pop()
        if isinstance(ann, TupleAnn) and not isinstance(value, AAny):
            if not isinstance(value, ATuple):
                return "not a tuple"
            if len(value.items) != len(ann.items):
                return f"a tuple of {len(value.items)} elements, not {len(ann.items)}"
            stack.extend(reversed(list(zip(ann.items, value.items))))
            continue
        why = _match_leaf(ann, value, binding)
        if why is not None:
            return why
    return None


def _match_leaf(ann: TypeAnn, value: AbstractValue, binding: Binding) -> Optional[str]:
    if isinstance(value, AAny):
        return None
    if isinstance(ann, ScalarAnn):
        if ann.dtype == "str":
            return None if isinstance(value, AString) else "not a string"
        if isinstance(value, AScalar) and value.dtype == ann.dtype:
            return None
        if isinstance(value, ATensor) and value.dtype == ann.dtype and value.shape == ():
            return None
        return f"not {ann.dtype}"
    if isinstance(ann, TensorAnn):
        if isinstance(value, AScalar) and value.dtype == ann.dtype and ann.dims == ():
            return None
        if not isinstance(value, ATensor):
            return "not a tensor"
        if value.dtype != ann.dtype:
            return f"its dtype is {value.dtype}, not {ann.dtype}"
        if value.shape is None:
            return _match_leading(ann.dims, value.leading, binding)
        return _match_dims(ann.dims, value.shape, binding)
    raise TypeError(f"not an annotation: {ann!r}")


def _match_leading(dims: tuple[DimAnn, ...], leading: tuple[Dim, ...], binding: Binding) -> Optional[str]:
    """Annotation ``dims`` against a tensor of unknown rank whose first dims are ``leading``."""
    if "*" in dims:
        head = dims[:dims.index("*")]
        count = min(len(head), len(leading))
        return _match_pairs(list(zip(head[:count], leading[:count])), binding)
    if len(dims) < len(leading):
        return f"rank at least {len(leading)}, not {len(dims)}"
    return _match_pairs(list(zip(dims, leading)), binding)


def _match_dims(dims: tuple[DimAnn, ...], shape: Optional[tuple[Dim, ...]], binding: Binding) -> Optional[str]:
    if shape is None:
        return None  # any rank: nothing to check
    if "*" in dims:
        first = dims.index("*")
        last = len(dims) - 1 - dims[::-1].index("*")
        head, tail = dims[:first], dims[last + 1:]
        if len(shape) < len(head) + len(tail):
            return f"rank {len(shape)} is less than {len(head) + len(tail)}"
        pairs = list(zip(head, shape[:len(head)])) + list(zip(tail, shape[len(shape) - len(tail):]))
    else:
        if len(shape) != len(dims):
            return f"rank {len(shape)}, not {len(dims)}"
        pairs = list(zip(dims, shape))
    return _match_pairs(pairs, binding)


def _match_pairs(pairs: list[tuple[DimAnn, Dim]], binding: Binding) -> Optional[str]:
    """Check (annotation dim, dim) pairs, binding new dimension variables."""
    for ann_dim, dim in pairs:
        if isinstance(ann_dim, int):
            if not dims_compatible(ann_dim, dim):
                return f"dimension {dim_text(dim)} is not {ann_dim}"
            continue
        bound = binding.get(ann_dim)
        if bound is None:
            binding[ann_dim] = dim
        elif not dims_compatible(bound, dim):
            return (f"dimension {ann_dim} is {dim_text(bound)} elsewhere in the signature but "
                    f"{dim_text(dim)} here")
        elif is_unknown_dim(bound) and not is_unknown_dim(dim):
            binding[ann_dim] = dim
    return None


# -- type text -----------------------------------------------------------------------
def abstract_from_annotation_text(text: str) -> AbstractValue:
    """The abstract value of a type written as text: ``"f64[B, 3]"`` -> ``<f64[B, 3]>``."""
    return abstract_from_annotation(parse_type_text(text), {})

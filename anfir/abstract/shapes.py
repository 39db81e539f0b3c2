"""Shape arithmetic on dimensions that are integers or sympy expressions.

A dimension is an ``int`` (``3``), a dimension variable (``sympy.Symbol("B",
integer=True, positive=True)``) or an expression of them (``2*B``).  Two
dimensions are equal when their difference expands to 0.  An *unknown*
dimension (what ``*`` annotations and reshapes to unknown sizes produce) is a
symbol named ``_1``, ``_2``...: it matches anything, because nothing is known
about it.  Every rule raises :class:`~anfir.errors.ShapeError` with both shapes
in the message; the inference engine attaches the node's location.
"""

from __future__ import annotations

import itertools
from typing import Iterable, Optional, Sequence

import sympy

from anfir.abstract.values import Dim, dim_text
from anfir.errors import ShapeError

Shape = Optional[tuple[Dim, ...]]
"""A shape: a tuple of dimensions, or None for "any rank"."""

_fresh = itertools.count(1)


def dim_symbol(name: str) -> sympy.Symbol:
    """The dimension variable ``name`` (the same object-equal symbol every time)."""
    return sympy.Symbol(name, integer=True, positive=True)


def fresh_dim() -> sympy.Symbol:
    """A new unknown dimension (``_1``, ``_2``, ...)."""
    return dim_symbol(f"_{next(_fresh)}")


def reset_fresh_dims() -> None:
    """Restart unknown-dimension numbering (each specialization does, for stable dumps)."""
    global _fresh
    _fresh = itertools.count(1)


def is_unknown_dim(dim: Dim) -> bool:
    """Whether ``dim`` is an unknown dimension (``_N``), which matches any size."""
    return isinstance(dim, sympy.Symbol) and dim.name.startswith("_") and dim.name[1:].isdigit()


def norm_dim(dim: Dim) -> Dim:
    """``dim`` as an ``int`` when it is a constant, else a sympy expression."""
    if isinstance(dim, bool):
        raise ShapeError(f"a dimension is an integer, not {dim!r}")
    if isinstance(dim, int):
        return dim
    if isinstance(dim, sympy.Basic):
        if dim.is_Integer:
            return int(dim)
        return dim
    try:
        return int(dim)  # numpy integers
    except (TypeError, ValueError):
        raise ShapeError(f"a dimension is an integer, not {dim!r}") from None


def dims_equal(a: Dim, b: Dim) -> bool:
    """Whether two dimensions are provably equal."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if a == b:
        return True
    return bool(sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0)


def dims_compatible(a: Dim, b: Dim) -> bool:
    """Equal, or one of them unknown."""
    return is_unknown_dim(a) or is_unknown_dim(b) or dims_equal(a, b)


def shape_text(shape: Shape, dtype: str = "") -> str:
    """``f64[2, B]`` (or ``[2, B]`` without dtype; ``[*]`` for any rank)."""
    inner = "*" if shape is None else ", ".join(dim_text(d) for d in shape)
    return f"{dtype}[{inner}]"


def product(dims: Iterable[Dim]) -> Dim:
    """The product of ``dims`` (an int when all are ints)."""
    result: Dim = 1
    for d in dims:
        result = result * d
    return norm_dim(sympy.expand(result)) if not isinstance(result, int) else result


# -- broadcasting -----------------------------------------------------------------
def broadcast_dims(a: Dim, b: Dim) -> Optional[Dim]:
    """The broadcast of two dimensions, or None when they cannot broadcast."""
    if is_unknown_dim(a):
        return b if not (isinstance(b, int) and b == 1) else a
    if is_unknown_dim(b):
        return a if not (isinstance(a, int) and a == 1) else b
    if isinstance(a, int) and a == 1:
        return b
    if isinstance(b, int) and b == 1:
        return a
    if dims_equal(a, b):
        return a
    return None


def broadcast_shapes(shapes: Sequence[Shape], dtypes: Sequence[str] = ()) -> Shape:
    """numpy broadcasting of ``shapes`` (right-aligned; 1 stretches); None if any rank is unknown."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)  # type: ignore[arg-type]
    result: list[Dim] = []
    for k in range(rank):
        dim: Dim = 1
        for s in shapes:
            assert s is not None
            i = len(s) - rank + k
            if i < 0:
                continue
            new = broadcast_dims(dim, s[i])
            if new is None:
                texts = [shape_text(s, dtypes[j] if j < len(dtypes) else "")
                         for j, s in enumerate(shapes)]
                raise ShapeError(f"shapes {' and '.join(texts)} do not broadcast: dimension "
                                 f"{dim_text(dim)} does not match {dim_text(s[i])}")
            dim = new
        result.append(dim)
    return tuple(result)


# -- matmul -----------------------------------------------------------------------
def matmul_shape(a: Shape, b: Shape, a_dtype: str = "", b_dtype: str = "") -> Shape:
    """numpy ``matmul``: ``(..., n, k) @ (..., k, m) -> (..., n, m)``; rank-1 operands
    lose their axis.  A 1-d @ 1-d product is ``()``."""
    both = f"{shape_text(a, a_dtype)} @ {shape_text(b, b_dtype)}"
    if (a is not None and len(a) == 0) or (b is not None and len(b) == 0):
        raise ShapeError(f"matmul needs tensors of rank >= 1, not {both}")
    if a is None or b is None:
        return None
    a2 = (1,) + tuple(a) if len(a) == 1 else tuple(a)
    b2 = tuple(b) + (1,) if len(b) == 1 else tuple(b)
    k1, k2 = a2[-1], b2[-2]
    if not dims_compatible(k1, k2):
        raise ShapeError(f"matmul shapes do not fit: {both} (the first's last dimension "
                         f"{dim_text(k1)} is not the second's dimension {dim_text(k2)})")
    try:
        batch = broadcast_shapes([a2[:-2], b2[:-2]])
    except ShapeError:
        raise ShapeError(f"matmul batch dimensions do not broadcast: {both}") from None
    assert batch is not None
    out = list(batch)
    if len(a) > 1:
        out.append(a2[-2])
    if len(b) > 1:
        out.append(b2[-1])
    return tuple(out)


# -- axes ---------------------------------------------------------------------------
def normalize_axes(axis: int | tuple[int, ...], rank: int, shape_for_msg: str) -> tuple[int, ...]:
    """Axes as non-negative, checked, sorted ints (numpy's rules for negatives)."""
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    result = []
    for ax in axes:
        if isinstance(ax, bool) or not isinstance(ax, int):
            raise ShapeError(f"an axis is an integer, not {ax!r}")
        if not -rank <= ax < rank:
            raise ShapeError(f"axis {ax} is out of range for a tensor of rank {rank} ({shape_for_msg})")
        result.append(ax % rank)
    if len(set(result)) != len(result):
        raise ShapeError(f"repeated axis in {axes}")
    return tuple(sorted(result))


def reduce_shape(shape: Shape, axis: int | tuple[int, ...] | None, dtype: str = "",
                 keepdims: bool = False) -> Shape:
    """The shape after summing over ``axis`` (None: every axis, giving ``()``);
    with ``keepdims`` the reduced axes stay, as 1."""
    if axis is None and not keepdims:
        return ()
    if shape is None:
        return None
    if axis is None:
        return (1,) * len(shape)
    axes = normalize_axes(axis, len(shape), shape_text(shape, dtype))
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def transpose_shape(shape: Shape, perm: Optional[Sequence[int]] = None, dtype: str = "") -> Shape:
    """Reversed axes, or ``shape`` permuted by ``perm``."""
    if shape is None:
        return None
    if perm is None:
        return tuple(reversed(shape))
    text = shape_text(shape, dtype)
    if len(perm) != len(shape):
        raise ShapeError(f"transpose permutation {tuple(perm)} does not fit a tensor of rank "
                         f"{len(shape)} ({text})")
    axes = [normalize_axes(p, len(shape), text)[0] for p in perm]
    if sorted(axes) != list(range(len(shape))):
        raise ShapeError(f"transpose needs a permutation of 0..{len(shape) - 1}, not {tuple(perm)}")
    return tuple(shape[a] for a in axes)


def reshape_shape(old: Shape, new: Sequence[Dim], dtype: str = "") -> tuple[Dim, ...]:
    """``new`` with a ``-1`` solved; checks that the sizes agree when they are known."""
    new = [norm_dim(d) for d in new]
    holes = [i for i, d in enumerate(new) if isinstance(d, int) and d == -1]
    bad = [d for d in new if isinstance(d, int) and d < -1]
    old_text = shape_text(old, dtype)
    new_text = "(" + ", ".join(dim_text(d) for d in new) + ")"
    if bad or len(holes) > 1:
        raise ShapeError(f"cannot reshape {old_text} to {new_text}: bad target shape")
    known_old = old is not None and not any(is_unknown_dim(d) for d in old)
    known_new = not any(is_unknown_dim(d) for d in new)
    if holes:
        if not (known_old and known_new):
            new[holes[0]] = fresh_dim()
            return tuple(new)
        assert old is not None
        rest = product(d for i, d in enumerate(new) if i != holes[0])
        total = product(old)
        if isinstance(rest, int) and isinstance(total, int):
            if rest == 0 or total % rest:
                raise ShapeError(f"cannot reshape {old_text} to {new_text}: {total} elements "
                                 f"do not divide into parts of {rest}")
            new[holes[0]] = total // rest
        else:
            quotient = sympy.cancel(sympy.sympify(total) / sympy.sympify(rest))
            num, den = sympy.fraction(quotient)
            if den != 1:
                raise ShapeError(f"cannot reshape {old_text} to {new_text}: "
                                 f"{dim_text(total)} elements is not a multiple of {dim_text(rest)}")
            new[holes[0]] = norm_dim(num)
        return tuple(new)
    if known_old and known_new:
        assert old is not None
        if not dims_equal(product(old), product(new)):
            raise ShapeError(f"cannot reshape {old_text} ({dim_text(product(old))} elements) to "
                             f"{new_text} ({dim_text(product(new))} elements)")
    return tuple(new)


def broadcast_to_shape(shape: Shape, target: Sequence[Dim], dtype: str = "") -> tuple[Dim, ...]:
    """Check that ``shape`` broadcasts to ``target`` and return ``target``."""
    target = tuple(norm_dim(d) for d in target)
    if shape is None:
        return target
    text = f"{shape_text(shape, dtype)} to {shape_text(target)}"
    if len(shape) > len(target):
        raise ShapeError(f"cannot broadcast {text}: the target has fewer dimensions")
    for d, t in zip(reversed(shape), reversed(target)):
        if not ((isinstance(d, int) and d == 1) or dims_compatible(d, t)):
            raise ShapeError(f"cannot broadcast {text}: dimension {dim_text(d)} does not "
                             f"match {dim_text(t)}")
    return target

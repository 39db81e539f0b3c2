"""The primitives the batching transform (``vmap``) makes.

A batched value carries its batch axis first.  These internal operations are
what the rules of :mod:`anfir.autodiff.batching` write where a plain
operation of the op library does not do: broadcasting an unbatched value to
the batch (``batch_expand``), its adjoint (``batch_unexpand``), selecting per
example (``batch_select``), the reshapes that put a batched operand where
numpy's broadcasting expects it (``batch_reshape``: the per-example rank is
only known when the program runs, so the transform itself needs no types),
moving an axis (``batch_moveaxis``), the per-example shape
(``batch_shape``), the fallback loop over the examples for a primitive with
no better rule (``batch_loop``), the batched form of a function value only
known at run time (``batch_fn``) and the basis the Jacobians push through
(``jac_basis``).

Each one's evaluation works on numpy arrays; the shape-only ones are
differentiable (their gradient reshapes back), so ``grad`` of ``vmap`` works.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import numpy as np

from anfir.abstract.lattice import abstract_of_value
from anfir.abstract.values import (AAny, AbstractValue, AEnv, AFunction, ANone, AScalar, AString,
                                   ATensor, ATuple, PrimFn)
from anfir.dtypes import numpy_name
from anfir.errors import AnfirRuntimeError, AnfirTypeError
from anfir.ir.primitive import Primitive
from anfir.ir.upcalls import UPCALLS
from anfir.primitives.registry import declare
from anfir.runtime_values import Closure, GradEnv, Partial

FAMILY = "batching"

AxisTree = Any
"""Where each argument is batched: ``0`` (axis 0), ``None`` (not batched) or a
tuple of such trees for a tuple argument."""


# -- values ----------------------------------------------------------------------------
def batch_size_of(value: Any) -> int:
    """The batch size of a batched value: the leading dimension of its first array."""
    stack = [value]
    while stack:
        v = stack.pop()
        shape = getattr(v, "shape", None)
        if shape is not None and not isinstance(v, (tuple, GradEnv)) and len(shape) >= 1:
            return int(shape[0])
        if isinstance(v, tuple):
            stack.extend(reversed(v))
        elif isinstance(v, GradEnv):
            stack.extend(reversed([x for _, x in v.items()]))
    raise AnfirRuntimeError("vmap: a batched value holds no array to take the batch size from")


def _is_function(v: Any) -> bool:
    return isinstance(v, (Closure, Partial, Primitive)) or type(v).__name__ in ("FuncGraph", "MetaFunction")


def _shape(v: Any) -> tuple[int, ...]:
    if type(v) is np.ndarray:  # the common case, without a getattr on any value
        return tuple(v.shape)
    if isinstance(v, (float, int, bool)):
        return ()
    shape = getattr(v, "shape", None)
    return tuple(shape) if shape is not None else np.shape(v)


def _matmul_shapes(sa: tuple[int, ...], sb: tuple[int, ...], ba: bool, bb: bool
                   ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The shapes of the matmul of the promoted, aligned operands: (a2, b2, out2, out)."""
    n = sa[0] if ba else sb[0]
    pa, pb = (sa[1:] if ba else sa), (sb[1:] if bb else sb)
    if not pa or not pb:
        raise AnfirTypeError("matmul needs tensors of rank >= 1, not scalars")
    a2 = (1,) + pa if len(pa) == 1 else pa
    b2 = pb + (1,) if len(pb) == 1 else pb
    rank = max(len(a2), len(b2))
    a2 = (1,) * (rank - len(a2)) + a2
    b2 = (1,) * (rank - len(b2)) + b2
    lead = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    out2 = lead + (a2[-2], b2[-1])
    out = lead + ((a2[-2],) if len(pa) > 1 else ()) + ((b2[-1],) if len(pb) > 1 else ())
    return (((n,) if ba else ()) + a2, ((n,) if bb else ()) + b2, (n,) + out2, (n,) + out)


@functools.lru_cache(maxsize=4096)
def reshape_target(how: str, batched: tuple[Any, ...], shape: tuple[int, ...],
                   facts: tuple[Any, ...]) -> tuple[int, ...]:
    """The shape ``batch_reshape`` gives a value of ``shape`` (cached: a batched program
    meets the same shapes at every call)."""
    if how == "align":
        ranks = [len(f) - (1 if b else 0) for f, b in zip((shape, *facts), batched)]
        top, own = max(ranks), ranks[0]
        return shape if own == top else shape[:1] + (1,) * (top - own) + shape[1:]
    if how == "flat":
        return shape[:1] + (int(np.prod(shape[1:], dtype=np.int64)),)
    if how == "shape":
        target = facts[0]
        if -1 in target:
            known = int(np.prod([d for d in target if d != -1], dtype=np.int64))
            rest = int(np.prod(shape[1:], dtype=np.int64))
            target = tuple(rest // max(known, 1) if d == -1 else d for d in target)
        return shape[:1] + tuple(target)
    if how == "keepdims":  # a full reduction's (B,) back to (B, 1, ..., 1) of the ref's rank
        return shape[:1] + (1,) * (len(facts[0]) - 1)
    if how in ("mm_a", "mm_b"):
        mine, theirs = bool(batched[0]), bool(batched[1])
        if how == "mm_a":
            return _matmul_shapes(shape, facts[0], mine, theirs)[0]
        return _matmul_shapes(facts[0], shape, theirs, mine)[1]
    if how in ("mm_out", "mm_dout"):
        shapes = _matmul_shapes(facts[0], facts[1], bool(batched[0]), bool(batched[1]))
        return shapes[3] if how == "mm_out" else shapes[2]
    if how == "fold":  # (B, N, ...) -> (B * N, ...): the batch folded into a batch-first op's N
        return (shape[0] * shape[1],) + shape[2:]
    if how == "unfold":  # (B * N, ...) -> (B, N, ...), B and N from the folded operand
        return tuple(facts[0][:2]) + shape[1:]
    if how == "jac_front":  # (n, ...) -> refs[0].shape + ...
        return tuple(facts[0]) + shape[1:]
    if how == "jac_back":  # (..., n) -> ... + refs[0].shape
        return shape[:-1] + tuple(facts[0])
    raise AnfirTypeError(f"batch_reshape: unknown how={how!r}")


class Kernels:
    """The evaluation of the batching primitives over an array module (numpy here,
    ``jax.numpy`` in the JAX back end), so both run the same formulas."""

    def __init__(self, xp: Any) -> None:
        self.xp = xp

    def expand(self, x: Any, ref: Any) -> Any:
        xp = self.xp
        n = batch_size_of(ref)
        x_ref = ref

        def leaf(v: Any) -> Any:
            if isinstance(v, tuple):
                return tuple(leaf(e) for e in v)
            if isinstance(v, GradEnv):
                return GradEnv({k: leaf(e) for k, e in v.items()})
            if _is_function(v):
                return UPCALLS.batch_value(v, 0, 0, True, x_ref)
            if v is None or isinstance(v, str) or not hasattr(v, "shape") and not isinstance(
                    v, (bool, int, float, complex)):
                return v
            arr = xp.asarray(v)
            return xp.broadcast_to(arr, (n,) + tuple(arr.shape))

        return leaf(x)

    def unexpand(self, x: Any) -> Any:
        xp = self.xp

        def leaf(v: Any) -> Any:
            if isinstance(v, tuple):
                return tuple(leaf(e) for e in v)
            if isinstance(v, GradEnv):
                return GradEnv({k: leaf(e) for k, e in v.items()})
            if hasattr(v, "shape") and len(v.shape) >= 1:
                return xp.sum(v, axis=0)
            return v

        return leaf(x)

    def select(self, c: Any, a: Any, b: Any) -> Any:
        xp = self.xp
        c = xp.asarray(c)

        def leaf(x: Any, y: Any) -> Any:
            if isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y):
                return tuple(leaf(p, q) for p, q in zip(x, y))
            if isinstance(x, GradEnv) or isinstance(y, GradEnv):
                ex = x if isinstance(x, GradEnv) else GradEnv()
                ey = y if isinstance(y, GradEnv) else GradEnv()
                keys = {k for k, _ in ex.items()} | {k for k, _ in ey.items()}
                out = {}
                for k in keys:
                    p, q = ex.get(k, None), ey.get(k, None)
                    out[k] = leaf(xp.zeros_like(q) if p is None else p, xp.zeros_like(p) if q is None else q)
                return GradEnv(out)
            if x is None and y is None:
                return None
            if _is_function(x) or _is_function(y):
                if x is y:
                    return x
                raise AnfirRuntimeError("vmap: an if on a batched condition chooses between two "
                                        "functions; call them in the branches instead")
            x, y = xp.asarray(x), xp.asarray(y)
            rank = max(len(x.shape), len(y.shape))
            cond = xp.reshape(c, tuple(c.shape) + (1,) * (rank - len(c.shape))) if rank > len(c.shape) else c
            return xp.where(cond, x, y)

        return leaf(a, b)

    def reshape(self, x: Any, *refs: Any, how: str = "align", batched: Any = ()) -> Any:
        x = x if type(x) is np.ndarray else self.xp.asarray(x)
        shape = tuple(x.shape)
        if how == "shape":
            target = refs[0]
            target = (target,) if isinstance(target, (int, np.integer)) else tuple(int(d) for d in target)
            facts: tuple[Any, ...] = (target,)
        else:
            facts = tuple(_shape(r) for r in refs)
        new = reshape_target(how, tuple(batched), shape, facts)
        if new == shape:
            return x
        return x.reshape(new) if type(x) is np.ndarray else self.xp.reshape(x, new)

    def moveaxis(self, x: Any, source: int = 0, destination: int = 0) -> Any:
        if isinstance(x, tuple):
            return tuple(self.moveaxis(v, source, destination) for v in x)
        x = self.xp.asarray(x)
        if source == destination:
            return x
        rank = len(x.shape)
        for axis in (source, destination):
            if not -rank <= axis < rank:
                raise AnfirTypeError(f"vmap: axis {axis} is out of range for a value of shape "
                                     f"{tuple(x.shape)}")
        return self.xp.moveaxis(x, source, destination)

    def tangent_dot(self, a: Any, b: Any) -> Any:
        xp = self.xp
        total: Any = None
        for x, y in _leaf_pairs(a, b):
            if x is None or y is None:
                continue
            x, y = xp.asarray(x), xp.asarray(y)
            prod = x * y
            term = xp.sum(xp.reshape(prod, (prod.shape[0], -1)), axis=1)
            total = term if total is None else total + term
        if total is None:
            raise AnfirTypeError("vmap: tangent_dot of values with no arrays")
        return total

    def tangent_scale(self, a: Any, s: Any) -> Any:
        xp = self.xp
        s = xp.asarray(s)

        def leaf(v: Any) -> Any:
            if isinstance(v, tuple):
                return tuple(leaf(e) for e in v)
            if v is None or isinstance(v, GradEnv):
                return v
            v = xp.asarray(v)
            return v * xp.reshape(s, tuple(s.shape) + (1,) * (len(v.shape) - 1))

        return leaf(a)


def _leaf_pairs(a: Any, b: Any) -> list[tuple[Any, Any]]:
    pairs: list[tuple[Any, Any]] = []
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if isinstance(x, tuple) and isinstance(y, tuple):
            stack.extend(zip(reversed(x), reversed(y)))
        else:
            pairs.append((x, y))
    return pairs


NUMPY = Kernels(np)
"""The kernels on numpy arrays (the primitives' evaluation)."""


def _batch_expand(x: Any, ref: Any) -> Any:
    return NUMPY.expand(x, ref)


def _batch_unexpand(x: Any) -> Any:
    return NUMPY.unexpand(x)


def _batch_select(c: Any, a: Any, b: Any) -> Any:
    return NUMPY.select(c, a, b)


def _batch_reshape(x: Any, *refs: Any, how: str = "align", batched: Any = ()) -> Any:
    return NUMPY.reshape(x, *refs, how=how, batched=batched)


def _batch_moveaxis(x: Any, source: int = 0, destination: int = 0) -> Any:
    return NUMPY.moveaxis(x, source, destination)


def _batch_tangent_dot(a: Any, b: Any) -> Any:
    return NUMPY.tangent_dot(a, b)


def _batch_tangent_scale(a: Any, s: Any) -> Any:
    return NUMPY.tangent_scale(a, s)


def _batch_shape(x: Any, what: str = "shape") -> Any:
    if what == "len" and isinstance(x, tuple):
        return len(x)
    shape = _shape(x)[1:]
    if what == "shape":
        return tuple(int(d) for d in shape)
    if what == "size":
        return int(np.prod(shape, dtype=np.int64))
    if what == "rank":
        return len(shape)
    if what == "len":
        if not shape:
            raise AnfirTypeError("len of a scalar")
        return int(shape[0])
    raise AnfirTypeError(f"batch_shape: unknown what={what!r}")


# -- the fallback loop -------------------------------------------------------------------
def slice_example(value: Any, axes: AxisTree, i: int) -> Any:
    """Example ``i`` of ``value`` batched as ``axes`` says."""
    if axes is None:
        return value
    if isinstance(axes, tuple):
        return tuple(slice_example(v, a, i) for v, a in zip(value, axes))
    if isinstance(value, GradEnv):
        return GradEnv({k: slice_example(v, axes, i) for k, v in value.items()})
    if isinstance(value, tuple):
        return tuple(slice_example(v, axes, i) for v in value)
    if value is None or isinstance(value, str):
        return value
    item = np.asarray(value)[i]
    return item


def stack_examples(results: list[Any]) -> Any:
    """The results of the examples stacked on a new leading axis (tuples leaf by leaf)."""
    first = results[0]
    if isinstance(first, tuple):
        return tuple(stack_examples([r[j] for r in results]) for j in range(len(first)))
    if isinstance(first, GradEnv):
        keys = sorted({k for r in results for k, _ in r.items()}, key=lambda k: k.name)
        out = {}
        for k in keys:
            items = [r.get(k, None) for r in results]
            sample = next(v for v in items if v is not None)
            out[k] = stack_examples([np.zeros_like(sample) if v is None else v for v in items])
        return GradEnv(out)
    if first is None or isinstance(first, str):
        return first
    return np.stack([np.asarray(r) for r in results])


def _batch_loop(op: Any, *args: Any, batched: Any = (), op_attrs: Any = ()) -> Any:
    if not isinstance(op, Primitive):
        raise AnfirTypeError(f"batch_loop applies a primitive, not {type(op).__name__}")
    attrs = dict(op_attrs)
    n = None
    ref = args[len(batched):]  # the batched values in scope, after the operands
    args = args[:len(batched)]
    for value, axes in zip(args, batched):
        if _has_batch(axes):
            try:
                n = _size_along(value, axes)
                break
            except AnfirRuntimeError:  # an empty GradEnv: no size in it
                continue
    if n is None and ref and any(_has_batch(a) for a in batched):
        n = batch_size_of(ref[0])
    if n is None:
        return op.impl(*args, **attrs)
    fast = VECTORIZED.get(op)
    if fast is not None:
        got = fast(args, batched, attrs)
        if got is not NotImplemented:
            return got
    results = [op.impl(*(slice_example(v, a, i) for v, a in zip(args, batched)), **attrs)
               for i in range(n)]
    return stack_examples(results)


def _has_batch(axes: AxisTree) -> bool:
    if isinstance(axes, tuple):
        return any(_has_batch(a) for a in axes)
    return axes is not None


def _size_along(value: Any, axes: AxisTree) -> int:
    if isinstance(axes, tuple):
        for v, a in zip(value, axes):
            if _has_batch(a):
                return _size_along(v, a)
    return batch_size_of(value)


VECTORIZED: dict[Primitive, Callable[[tuple[Any, ...], Any, dict[str, Any]], Any]] = {}
"""Fast batched kernels of ``batch_loop``, keyed by the primitive they batch (filled by
:mod:`anfir.autodiff.batching`); NotImplemented from one falls back to the loop."""


def _batch_value(f: Any, *ref: Any, in_axes: Any = 0, out_axes: Any = 0, inner: bool = False) -> Any:
    return UPCALLS.batch_value(f, in_axes, out_axes, inner, ref[0] if ref else None)


def _jac_basis(x: Any) -> Any:
    array = np.asarray(x)
    dtype = array.dtype if array.dtype.kind in "fc" else np.dtype(np.float64)
    n = int(array.size)
    return np.eye(n, dtype=dtype).reshape((n,) + array.shape)


# -- abstract rules --------------------------------------------------------------------
def _sample_of(a: Any) -> Any:
    """A concrete value of abstract ``a`` (zeros), or raise LookupError when the shape
    is not concrete (then the rule answers "any")."""
    if isinstance(a, ATensor):
        if a.shape is None or not all(isinstance(d, int) for d in a.shape):
            raise LookupError
        return np.zeros(a.shape, numpy_name(a.dtype))
    if isinstance(a, AScalar):
        if a.value is not None and not isinstance(a.value, type(AAny)) and repr(a.value) != "UNKNOWN":
            return a.value
        return np.zeros((), numpy_name(a.dtype))[()]
    if isinstance(a, ATuple):
        return tuple(_sample_of(v) for v in a.items)
    if isinstance(a, AString):
        return a.value if isinstance(getattr(a, "value", None), str) else "s"
    if isinstance(a, ANone):
        return None
    if isinstance(a, AEnv):
        return GradEnv()
    if isinstance(a, AFunction) and len(a.options) == 1:
        (atom,) = a.options
        if isinstance(atom, PrimFn) and isinstance(atom.prim, Primitive):
            return atom.prim
    raise LookupError


def _to_abstract(value: Any) -> AbstractValue:
    def strip(a: AbstractValue) -> AbstractValue:
        if isinstance(a, AScalar):
            return AScalar(a.dtype)
        if isinstance(a, ATuple):
            return ATuple(tuple(strip(v) for v in a.items))
        return a

    return strip(abstract_of_value(value))


def _sampled(impl: Callable[..., Any]) -> Callable[..., AbstractValue]:
    """An abstract rule evaluating ``impl`` on zeros of the arguments' shapes: these
    operations only move data, so their result's type follows from the shapes."""
    def rule(*args: AbstractValue, **attrs: Any) -> AbstractValue:
        try:
            samples = [_sample_of(a) for a in args]
        except LookupError:
            return AAny()
        with np.errstate(all="ignore"):
            return _to_abstract(impl(*samples, **attrs))

    return rule


def _infer_batch_fn(f: AbstractValue, *ref: AbstractValue, in_axes: Any = 0, out_axes: Any = 0,
                    inner: bool = False) -> AbstractValue:
    raise AnfirTypeError("vmap of a function value only known at run time cannot be compiled "
                         "(vmap a named function or a lambda, or run the program with anfir.run)")


_RESHAPE_GRADS = {
    1: "lambda (x, how, batched, out, dout) (reshape_like(dout, x),) end",
    2: "lambda (x, a, how, batched, out, dout) (reshape_like(dout, x), zeros_like(a)) end",
    3: "lambda (x, a, b, how, batched, out, dout) (reshape_like(dout, x), zeros_like(a), zeros_like(b)) end",
    4: """lambda (x, a, b, c, how, batched, out, dout)
            (reshape_like(dout, x), zeros_like(a), zeros_like(b), zeros_like(c)) end""",
}

batch_expand = declare(
    "batch_expand", 2, _batch_expand, infer=_sampled(_batch_expand), family=FAMILY, internal=True,
    foldable=False,
    doc="batch_expand(x, ref) — x (not batched) repeated along a new leading axis, as many "
        "times as ref's batch",
    bprop="lambda (x, ref, out, dout) (batch_unexpand(dout), zeros_like(ref)) end")
batch_tangent_dot = declare(
    "batch_tangent_dot", 2, _batch_tangent_dot, infer=_sampled(_batch_tangent_dot), family=FAMILY,
    internal=True, foldable=False,
    doc="batch_tangent_dot(a, b) — per example, the sum of the elementwise products of two "
        "batched values of one tuple structure",
    bprop="""lambda (a, b, out, dout)
        (batch_tangent_scale(b, dout), batch_tangent_scale(a, dout)) end""")
batch_tangent_scale = declare(
    "batch_tangent_scale", 2, _batch_tangent_scale, infer=_sampled(_batch_tangent_scale),
    family=FAMILY, internal=True, foldable=False,
    doc="batch_tangent_scale(a, s) — every leaf of batched a times its example's scalar in s",
    bprop="""lambda (a, s, out, dout)
        (batch_tangent_scale(dout, s), batch_tangent_dot(dout, a)) end""")
batch_unexpand = declare(
    "batch_unexpand", 1, _batch_unexpand, infer=_sampled(_batch_unexpand), family=FAMILY,
    internal=True, foldable=False,
    doc="batch_unexpand(x) — x summed over its leading (batch) axis, leaf by leaf",
    bprop="lambda (x, out, dout) (batch_expand(dout, x),) end")
batch_select = declare(
    "batch_select", 3, _batch_select, infer=_sampled(_batch_select), family=FAMILY, internal=True,
    foldable=False,
    doc="batch_select(c, a, b) — per example, a where c else b (leaf by leaf; c has one "
        "flag per example)",
    bprop="""lambda (c, a, b, out, dout)
        (zeros_like(c), batch_select(c, dout, zeros_like(dout)),
         batch_select(c, zeros_like(dout), dout)) end""")
batch_reshape = declare(
    "batch_reshape", (1, 4), _batch_reshape, infer=_sampled(_batch_reshape), family=FAMILY,
    internal=True, foldable=False, attrs={"how": "align", "batched": ()},
    doc="batch_reshape(x, refs..., how=, batched=) — x reshaped as a batched operand needs: "
        "aligned for broadcasting, flattened, promoted for matmul, ...",
    bprop=_RESHAPE_GRADS)
batch_moveaxis = declare(
    "batch_moveaxis", 1, _batch_moveaxis, infer=_sampled(_batch_moveaxis), family=FAMILY,
    internal=True, attrs={"source": 0, "destination": 0}, positional_attrs=2,
    doc="batch_moveaxis(x, source, destination) — x with one axis moved",
    bprop="lambda (x, source, destination, out, dout) (batch_moveaxis(dout, destination, source),) end")
batch_shape = declare(
    "batch_shape", 1, _batch_shape, infer=_sampled(_batch_shape), family=FAMILY, internal=True,
    differentiable=False, attrs={"what": "shape"},
    doc="batch_shape(x, what=) — the shape (or size, or rank) of one example of batched x")
batch_loop = declare(
    "batch_loop", (1, None), _batch_loop, infer=_sampled(_batch_loop), family=FAMILY,
    internal=True, foldable=False, attrs={"batched": (), "op_attrs": ()},
    doc="batch_loop(op, args..., batched=, op_attrs=) — the primitive op applied to each "
        "example and the results stacked (the fallback of vmap)")
batch_fn = declare(
    "batch_fn", (1, 2), _batch_value, infer=_infer_batch_fn, family=FAMILY, internal=True,
    foldable=False, attrs={"in_axes": 0, "out_axes": 0, "inner": False},
    doc="batch_fn(f, in_axes=, out_axes=, inner=) — the batched form of the function value f "
        "(vmap at run time; inner: called inside a batched body, where a J-transformed "
        "function's gradients stay per example)",
    # The batched form of a J-world function returns its captured values' gradients
    # summed over the batch, under the same names: the gradient passes straight to f.
    bprop={1: "lambda (f, in_axes, out_axes, inner, out, dout) (dout,) end",
           2: "lambda (f, r, in_axes, out_axes, inner, out, dout) (dout, zeros_like(r)) end"})
jac_basis = declare(
    "jac_basis", 1, _jac_basis, infer=_sampled(_jac_basis), family=FAMILY, internal=True,
    differentiable=False,
    doc="jac_basis(x) — the identity basis of x's space, shaped (size(x), *shape(x))")

BATCHING_PRIMITIVES: tuple[Primitive, ...] = (
    batch_expand, batch_unexpand, batch_select, batch_reshape, batch_moveaxis, batch_shape,
    batch_loop, batch_fn, batch_tangent_dot, batch_tangent_scale, jac_basis)
"""Every primitive this module declares (for the back ends' coverage lists)."""

__all__ = ["AxisTree", "BATCHING_PRIMITIVES", "VECTORIZED", "batch_expand", "batch_fn", "batch_loop", "batch_moveaxis",
           "batch_reshape", "batch_select", "batch_shape", "batch_size_of", "batch_unexpand",
           "Kernels", "NUMPY", "batch_tangent_dot", "batch_tangent_scale", "jac_basis", "slice_example", "stack_examples"]

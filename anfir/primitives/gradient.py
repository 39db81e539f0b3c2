"""Primitives that only the autodiff creates (internal: not in the language reference).

* ``J(f)`` — the forward-mode-of-reverse transform of a function value (a
  closure of ``▸f`` returning ``(value, bprop)``); identity on data.
* ``newenv() / env_setitem / env_getitem`` — gradient environments: the
  gradient of a closure maps each captured node's key to its gradient.
* ``gadd(a, b)`` — adds two gradients of the same value (numbers, arrays,
  tuples elementwise, environments keywise).
* ``sum_to(g, x)`` — sums a broadcast gradient back to ``x``'s shape;
  ``broadcast_like(g, x)`` is its transpose.
* ``unreduce(g, x, axis)`` — spreads the gradient of ``sum(x, axis)`` over x.
* ``matmul_dx(dout, y, x)``, ``matmul_dy(x, dout, y)`` — the gradients of
  ``x @ y`` with numpy's rules for vectors (rank 1) and batches.
* ``reshape_like(g, x)``, ``prod_others(x, axis)``, ``clip_grad(g, x, lo, hi)`` —
  helpers of the gradients of flattening, ``prod`` and ``clip``;
* ``size(x)``, ``cast_like(g, x)``, ``tuple_setitem(t, i, v)``,
  ``invert_permutation(p)``, ``grad_seed(v)`` — small helpers of gradient rules.

Each is declared once here with its evaluation; its gradient rule (``bprop=``)
makes the gradient machinery itself differentiable (grad of grad).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anfir.abstract.lattice import JoinError, is_float_scalar, join, map_tuple_leaves, widen
from anfir.abstract.rules import broadcast_shapes, int_value, shape_of_abstract, tensor_or_scalar
from anfir.abstract.values import UNKNOWN, AEnv, AFunction, ANone, AScalar, AString, ATensor, ATuple, JFn
from anfir.dtypes import is_float, is_float_array
from anfir.errors import AnfirError, AnfirTypeError, GradientError
from anfir.ir.upcalls import UPCALLS
from anfir.nested import fold_nested
from anfir.primitives import arith, array_kernels
from anfir.primitives.registry import declare
from anfir.runtime_values import GradEnv, SymbolicKey

FAMILY = "gradient"


def _is_object_array(x: Any) -> bool:
    return isinstance(x, np.ndarray) and x.dtype == object


def gadd_values(a: Any, b: Any) -> Any:
    """The sum of two gradients of one value."""
    if isinstance(a, GradEnv) or isinstance(b, GradEnv):
        if not isinstance(a, GradEnv) or len(a) == 0:
            return b if isinstance(b, GradEnv) else a
        if not isinstance(b, GradEnv) or len(b) == 0:
            return a
        items = dict(a.items())
        for key, value in b.items():
            items[key] = gadd_values(items[key], value) if key in items else value
        return GradEnv(items)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return tuple(gadd_values(x, y) for x, y in zip(a, b))
    if _is_object_array(a) or _is_object_array(b):
        # The evaluator's scan stacks what is not a number (the gradient environments
        # of a loop body's backward pass, in its residuals) as an object array: the
        # gradients of two such stacks add element by element (third order and up).
        return _GADD_ELEMENTS(a, b)
    if a is None:
        return b
    if b is None:
        return a
    return a + b


_GADD_ELEMENTS = np.frompyfunc(gadd_values, 2, 1)


def _env_setitem(env: Any, key: SymbolicKey, value: Any) -> GradEnv:
    base = env if isinstance(env, GradEnv) else GradEnv()
    return base.set(key, value)


def _env_getitem(env: Any, key: SymbolicKey, default: Any) -> Any:
    if isinstance(env, GradEnv):
        return env.get(key, default)
    return default


def sum_to_value(g: Any, x: Any) -> Any:
    """Sum ``g`` over the dimensions that broadcasting added to reach ``x``'s shape."""
    if isinstance(g, GradEnv) or g is None or isinstance(g, tuple):
        return g
    gshape = np.shape(g)
    xshape = np.shape(x)
    if gshape == xshape:
        if not isinstance(x, np.ndarray) and isinstance(g, np.ndarray):
            return g.item()
        return g
    result = array_kernels.sum_to(np, g, gshape, xshape)
    if not isinstance(x, np.ndarray):
        return result.item() if isinstance(result, np.ndarray) else result
    return result


def _broadcast_like(g: Any, x: Any) -> Any:
    shape = np.shape(x)
    if np.shape(g) == shape:
        return g
    return np.broadcast_to(g, shape)


def _unreduce(g: Any, x: Any, axis: Any, keepdims: Any = False) -> Any:
    return array_kernels.unreduce(np, g, np.shape(x), axis, keepdims)


def _as_matrices(x: Any, y: Any, dout: Any) -> tuple[Any, Any, Any]:
    return array_kernels.as_matrices(np, x, y, dout)


def _all_matrices(a: Any, b: Any, c: Any) -> bool:
    # Spelled out, not all(... for ...): a generator costs more than a 16x16
    # matmul (1.2 us of a 13 us small-MLP gradient).
    return (type(a) is np.ndarray and type(b) is np.ndarray and type(c) is np.ndarray
            and a.ndim == 2 and b.ndim == 2 and c.ndim == 2)


def _matmul_dx(dout: Any, y: Any, x: Any) -> Any:
    """The gradient of ``x @ y`` with respect to ``x``: ``dout @ yᵀ`` in ``x``'s shape."""
    if _all_matrices(dout, y, x):  # the common case, without reshaping
        return dout @ y.T
    x2, y2, d2 = _as_matrices(x, y, dout)
    yt = np.swapaxes(y2, -1, -2)
    # A contraction of length 1 is an outer product: numpy's batched matmul is much
    # slower on it than a broadcast multiply (per-example gradients under vmap).
    grad = d2 * yt if d2.shape[-1] == 1 and d2.ndim > 2 else d2 @ yt
    return np.reshape(sum_to_value(grad, x2), np.shape(x))


def _matmul_dy(x: Any, dout: Any, y: Any) -> Any:
    """The gradient of ``x @ y`` with respect to ``y``: ``xᵀ @ dout`` in ``y``'s shape."""
    if _all_matrices(dout, y, x):  # the common case, without reshaping
        return x.T @ dout
    x2, y2, d2 = _as_matrices(x, y, dout)
    xt = np.swapaxes(x2, -1, -2)
    grad = xt * d2 if xt.shape[-1] == 1 and xt.ndim > 2 else xt @ d2  # an outer product
    return np.reshape(sum_to_value(grad, y2), np.shape(y))


def _size(x: Any) -> int:
    return int(np.size(x))


def _is_discrete(x: Any) -> bool:
    """Whether ``x`` is an integer or boolean number or tensor (a value whose
    sensitivity is a zero of its own type)."""
    if isinstance(x, np.ndarray):
        return x.dtype.kind in "biu"
    return isinstance(x, (bool, int, np.bool_, np.integer))


def _cast_like(g: Any, x: Any) -> Any:
    # The common cases of a gradient rule's result, first: already of x's type.
    if type(x) is float and type(g) is float:
        return g
    if type(x) is np.ndarray and type(g) is np.ndarray and x.dtype == g.dtype:
        return g
    if _is_discrete(x):
        # The sensitivity of an integer or a boolean is a zero of its type (as JAX's
        # float0 cotangent): a loop counter's gradient never turns into a float.
        dtype = x.dtype if isinstance(x, (np.ndarray, np.generic)) else type(x)
        if isinstance(g, np.ndarray) or isinstance(x, np.ndarray):
            return np.zeros(np.shape(g), dtype)
        return x.dtype.type(0) if isinstance(x, np.generic) else type(x)(0)
    if not isinstance(x, (np.ndarray, np.generic, bool, int, float, complex)):
        return g  # a tuple, an environment, None: not a number, passes unchanged
    if isinstance(x, np.ndarray):
        return np.asarray(g).astype(x.dtype)
    if isinstance(x, float) and not isinstance(g, np.ndarray):
        return float(g)
    return g


def _tuple_setitem(t: tuple[Any, ...], i: int, v: Any) -> tuple[Any, ...]:
    return t[:i] + (v,) + t[i + 1:] if i >= 0 else t[:i] + (v,) + (t[i + 1:] if i != -1 else ())


def _invert_permutation(perm: Any) -> Any:
    if perm is None:
        return None
    return tuple(int(i) for i in np.argsort(perm))


def _reshape_like(g: Any, x: Any) -> Any:
    """``g`` with ``x``'s shape (a scalar when ``x`` is one): undoes a flattening."""
    shape = np.shape(x)
    if np.shape(g) == shape:
        return g
    result = np.reshape(g, shape)
    if not isinstance(x, np.ndarray) and isinstance(result, np.ndarray):
        return result[()] if isinstance(x, np.generic) else result.item()
    return result


def reduced_axes(ndim: int, axis: Any) -> tuple[int, ...]:
    """The axes a reduction over ``axis`` (None, an int or a tuple) removes from a
    tensor of ``ndim`` axes, normalised and sorted."""
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, tuple) else (axis,)
    return tuple(sorted(int(a) % ndim for a in axes))


def _prod_others(x: Any, axis: Any) -> Any:
    """For each element, the product of the *other* elements of its group of
    ``prod(x, axis)`` — exact where ``x`` has zeros (no division): the product
    of those before it times the product of those after it."""
    array = np.asarray(x)
    if array.ndim == 0:
        return np.ones_like(x) if isinstance(x, np.ndarray) else type(x)(1)
    return array_kernels.products_of_others(np, array, reduced_axes(array.ndim, axis))


def _clip_grad(g: Any, x: Any, lo: Any, hi: Any) -> Any:
    """``g`` where ``lo <= x <= hi`` (a None bound is no bound), else 0 — the
    gradient of ``clip`` with respect to ``x`` (in ``g``'s broadcast shape)."""
    with np.errstate(invalid="ignore"):
        inside = array_kernels.within(np, x, lo, hi)
    if inside is True:
        return g
    zero = np.zeros_like(g)
    result = np.where(inside, g, zero)
    if not isinstance(g, np.ndarray) and np.ndim(result) == 0:
        return type(g)(result) if isinstance(g, (float, int)) else result[()]
    return result


def grad_seed_value(v: Any) -> Any:
    """1 of the type of a scalar float output (the seed of reverse mode)."""
    if isinstance(v, float) and not isinstance(v, bool):
        return type(v)(1.0)
    if isinstance(v, np.ndarray) and v.ndim == 0 and is_float_array(v):
        return np.ones_like(v)
    if isinstance(v, np.generic) and is_float_array(v):
        return v.dtype.type(1.0)
    what = type(v).__name__
    if isinstance(v, np.ndarray):
        what = f"a {v.dtype.name} tensor of shape {v.shape}"
    raise GradientError(f"grad needs a function whose output is a float scalar, but it returned {what}")


def _j_value(x: Any) -> Any:
    # J of a run-time value is the autodiff's to compute (anfir.wiring installs it).
    return UPCALLS.j_value(x)


# -- abstract rules (the specializer's interface: abstracts in, abstract out) --------
def _infer_j(x: Any) -> Any:
    if isinstance(x, AFunction):
        return AFunction(frozenset(JFn(atom) for atom in x.options))
    if isinstance(x, ATuple):
        return ATuple(tuple(_infer_j(item) for item in x.items))
    return x


def _infer_newenv() -> Any:
    return AEnv()


def _infer_env_setitem(env: Any, key: Any, value: Any) -> Any:
    return AEnv()


def _infer_env_getitem(env: Any, key: Any, default: Any) -> Any:
    return _widen(default)


def _widen(a: Any) -> Any:
    return widen(a)


def _infer_gadd(a: Any, b: Any) -> Any:
    if isinstance(a, (AEnv, AFunction)) or isinstance(b, (AEnv, AFunction)):
        return AEnv()
    try:
        return _widen(join(a, b))
    except JoinError:
        pass
    # The contributions to one gradient may differ in dtype: an integer intermediate
    # used with floats (``(n, x)[0] * x``) gets float gradients next to its integer
    # zeros.  At run time ``gadd`` is ``a + b``, which promotes; type it the same way.

    if isinstance(a, ANone):
        return _widen(b)
    if isinstance(b, ANone):
        return _widen(a)
    if isinstance(a, ATuple) and isinstance(b, ATuple) and len(a.items) == len(b.items):
        return ATuple(tuple(_infer_gadd(x, y) for x, y in zip(a.items, b.items)))
    if isinstance(a, (AScalar, ATensor)) and isinstance(b, (AScalar, ATensor)):
        add_rule = arith.add.infer
        assert add_rule is not None  # declared with a rule
        try:
            return _widen(add_rule(a, b))
        except AnfirError:
            pass
    raise AnfirTypeError(f"cannot add gradients of types {a} and {b}") from None


def _like_shape(g: Any, x: Any, dtype_from: Any) -> Any:
    """The abstract of a value with ``x``'s shape and ``dtype_from``'s dtype."""

    if isinstance(g, (AEnv, ANone, ATuple)):
        return g
    dtype, _ = shape_of_abstract(dtype_from, "a gradient")
    _, shape = shape_of_abstract(x, "a gradient")
    return tensor_or_scalar(dtype, shape)


def _infer_sum_to(g: Any, x: Any) -> Any:
    return _like_shape(g, x, g)


def _infer_unreduce(g: Any, x: Any, axis: Any, keepdims: Any = None) -> Any:
    return _like_shape(g, x, g)


def _infer_matmul_dx(dout: Any, y: Any, x: Any) -> Any:
    return _like_shape(dout, x, dout)


def _infer_matmul_dy(x: Any, dout: Any, y: Any) -> Any:
    return _like_shape(dout, y, dout)


def _infer_cast_like(g: Any, x: Any) -> Any:
    if not isinstance(x, (AScalar, ATensor)):
        return g  # not a number: the value passes unchanged (see _cast_like)
    return _like_shape(g, g, x)


def _infer_reshape_like(g: Any, x: Any) -> Any:
    return _like_shape(g, x, g)


def _infer_prod_others(x: Any, axis: Any) -> Any:
    return _like_shape(x, x, x)


def _infer_clip_grad(g: Any, x: Any, lo: Any, hi: Any) -> Any:
    dtype, _ = shape_of_abstract(g, "a gradient")
    shapes = [shape_of_abstract(v, "a gradient")[1] for v in (g, x, lo, hi) if not isinstance(v, ANone)]
    return tensor_or_scalar(dtype, broadcast_shapes(shapes)) if any(
        isinstance(v, ATensor) for v in (g, x, lo, hi)) else AScalar(dtype)


def _infer_size(x: Any) -> Any:
    return AScalar("i64")


def _infer_tuple_setitem(t: Any, i: Any, v: Any) -> Any:
    index = int_value(i, "a tuple index")
    if not isinstance(t, ATuple) or (index is not None and not -len(t.items) <= index < len(t.items)):
        raise AnfirTypeError(f"tuple_setitem needs a tuple and an index in range, not {t}, {i}")
    items = list(t.items)
    if index is not None:
        items[index] = _widen(v)
        return ATuple(tuple(items))
    # An index known only at run time (the gradient of ``t[k]``): any element may be
    # the one replaced, so each has the join of its type and v's.
    try:
        return ATuple(tuple(_widen(join(item, v)) for item in items))
    except JoinError:
        raise AnfirTypeError(f"tuple_setitem with an index known only at run time needs elements "
                             f"of one type, not {t} and {v}") from None


def _infer_invert_permutation(perm: Any) -> Any:
    """The inverse permutation's type: its values are those of the inverse, never
    ``perm``'s own (a permutation that is not its own inverse would otherwise give
    the transposed gradient ``perm``'s shape)."""
    if isinstance(perm, ANone):
        return perm
    found = perm.items if isinstance(perm, ATuple) else None
    if found is None or not all(isinstance(i, AScalar) for i in found):
        raise AnfirTypeError(f"invert_permutation needs a tuple of axes, not {perm}")
    items = [i for i in found if isinstance(i, AScalar)]
    values = [i.value for i in items]
    if any(v is UNKNOWN for v in values):
        return ATuple(tuple(AScalar(i.dtype) for i in items))
    inverse = _invert_permutation(tuple(values))
    return ATuple(tuple(AScalar(i.dtype, v) for i, v in zip(items, inverse)))


def _infer_grad_seed(v: Any) -> Any:
    if not is_float_scalar(v):
        raise GradientError(f"grad needs a function whose output is a float scalar, not {v}")
    return _widen(v)


def _infer_grad_arg_check(x: Any, g: Any) -> Any:
    if isinstance(x, (AScalar, ATensor)) and not is_float(x.dtype):
        raise GradientError(f"gradients with respect to integer or boolean arguments are not "
                            f"supported (the argument is {x})")
    if isinstance(x, AString):
        raise GradientError(f"a gradient with respect to a string is not defined (the argument "
                            f"is {x})")
    return g


J = declare("J", 1, _j_value, infer=_infer_j, family=FAMILY, internal=True, foldable=False,
            doc="J(f) — the transformed function returning (value, bprop)",
            bprop="lambda (x, out, dout) (dout,) end")
newenv = declare("newenv", 0, GradEnv, infer=_infer_newenv, family=FAMILY, internal=True,
                 doc="newenv() — an empty gradient environment",
                 bprop="lambda (out, dout) () end")
env_setitem = declare("env_setitem", 3, _env_setitem, infer=_infer_env_setitem, family=FAMILY, internal=True,
                      doc="env_setitem(env, key, g) — env with key bound to g",
                      bprop="""lambda (e, k, v, out, dout)
                          (env_setitem(dout, k, zeros_like(v)), zeros_like(k), env_getitem(dout, k, zeros_like(v)))
                      end""")
env_getitem = declare("env_getitem", 3, _env_getitem, infer=_infer_env_getitem, family=FAMILY, internal=True,
                      doc="env_getitem(env, key, default) — the gradient stored for key",
                      bprop="""lambda (e, k, d, out, dout)
                          (env_setitem(newenv(), k, dout), zeros_like(k), zeros_like(d))
                      end""")
gadd = declare("gadd", 2, gadd_values, infer=_infer_gadd, family=FAMILY, internal=True,
               doc="gadd(a, b) — the sum of two gradients of one value",
               bprop="lambda (a, b, out, dout) (dout, dout) end")
sum_to = declare("sum_to", 2, sum_to_value, infer=_infer_sum_to, family=FAMILY, internal=True,
                 doc="sum_to(g, x) — g summed back to x's shape (undoes broadcasting)",
                 bprop="lambda (g, x, out, dout) (broadcast_like(dout, g), zeros_like(x)) end")
broadcast_like = declare("broadcast_like", 2, _broadcast_like, infer=_infer_sum_to, family=FAMILY, internal=True,
                         doc="broadcast_like(g, x) — g broadcast to x's shape",
                         bprop="lambda (g, x, out, dout) (sum_to(dout, g), zeros_like(x)) end")
unreduce = declare("unreduce", (3, 4), _unreduce, infer=_infer_unreduce, family=FAMILY, internal=True,
                   doc="unreduce(g, x, axis, keepdims) — the gradient of sum(x, axis, keepdims) "
                       "spread over x (the reduced value broadcast back to x's shape)",
                   bprop={3: "lambda (g, x, axis, out, dout) (sum(dout, axis), zeros_like(x), zeros_like(axis)) end",
                          4: """lambda (g, x, axis, keepdims, out, dout)
                                  (sum(dout, axis, keepdims), zeros_like(x), zeros_like(axis),
                                   zeros_like(keepdims)) end"""})
matmul_dx = declare("matmul_dx", 3, _matmul_dx, infer=_infer_matmul_dx, family=FAMILY, internal=True,
                    doc="matmul_dx(dout, y, x) — the gradient of x @ y with respect to x",
                    bprop="lambda (dout, y, x, out, g) (g @ y, matmul_dy(g, dout, y), zeros_like(x)) end")
matmul_dy = declare("matmul_dy", 3, _matmul_dy, infer=_infer_matmul_dy, family=FAMILY, internal=True,
                    doc="matmul_dy(x, dout, y) — the gradient of x @ y with respect to y",
                    bprop="lambda (x, dout, y, out, g) (matmul_dx(dout, g, x), x @ g, zeros_like(y)) end")
reshape_like = declare("reshape_like", 2, _reshape_like, infer=_infer_reshape_like, family=FAMILY,
                       internal=True,
                       doc="reshape_like(g, x) — g with x's shape (undoes a flattening)",
                       bprop="lambda (g, x, out, dout) (reshape_like(dout, g), zeros_like(x)) end")
prod_others = declare("prod_others", 2, _prod_others, infer=_infer_prod_others, family=FAMILY,
                      internal=True,
                      doc="prod_others(x, axis) — per element, the product of the other elements "
                          "of its group of prod(x, axis) (the gradient of prod, exact at zeros)",
    # d others_i / d x_k = others_i / x_k for k != i in the group (where x_k != 0).
    bprop="""lambda (x, axis, out, dout)
        ((unreduce(sum(dout * out, axis, true), x, axis, true) - dout * out) / x, zeros_like(axis)) end""")
clip_grad = declare("clip_grad", 4, _clip_grad, infer=_infer_clip_grad, family=FAMILY, internal=True,
                    doc="clip_grad(g, x, lo, hi) — g where lo <= x <= hi (None: no bound), else 0",
                    bprop="""lambda (g, x, lo, hi, out, dout)
                        (sum_to(clip_grad(dout, x, lo, hi), g), zeros_like(x), zeros_like(lo),
                         zeros_like(hi)) end""")
size = declare("size", 1, _size, infer=_infer_size, family=FAMILY, differentiable=False,
               doc="size(x) — the number of elements of x (1 for a scalar)")
cast_like = declare("cast_like", 2, _cast_like, infer=_infer_cast_like, family=FAMILY, internal=True,
                    doc="cast_like(g, x) — g converted to x's dtype; a zero of that dtype when x is "
                        "an integer or boolean (the sensitivity of an integer is zero)",
                    # dout goes through x's dtype first: when x is an integer the result is
                    # a constant zero and g's sensitivity is zero too.
                    bprop="lambda (g, x, out, dout) (cast_like(cast_like(dout, x), g), zeros_like(x)) end")
tuple_setitem = declare("tuple_setitem", 3, _tuple_setitem, infer=_infer_tuple_setitem, family=FAMILY, internal=True,
                        doc="tuple_setitem(t, i, v) — t with element i replaced by v",
                        bprop="""lambda (t, i, v, out, dout)
                            (tuple_setitem(dout, i, zeros_like(v)), zeros_like(i), tuple_getitem(dout, i))
                        end""")
invert_permutation = declare("invert_permutation", 1, _invert_permutation, infer=_infer_invert_permutation,
                             family=FAMILY, internal=True, differentiable=False,
                             doc="invert_permutation(p) — the inverse of an axis permutation")
grad_seed = declare("grad_seed", 1, grad_seed_value, infer=_infer_grad_seed, family=FAMILY, internal=True,
                    differentiable=False, foldable=False,
                    doc="grad_seed(v) — 1.0 of v's type; an error unless v is a float scalar")


def _grad_arg_check(x: Any, g: Any) -> Any:
    if isinstance(x, (bool, int, np.bool_, np.integer)) or (
            isinstance(x, np.ndarray) and x.dtype.kind in "biu"):
        raise GradientError("gradients with respect to integer or boolean arguments are not "
                            f"supported (the argument is {x!r}); pass a float")
    if isinstance(x, str):
        shown = repr(x) if len(x) <= 30 else repr(x[:27]) + "..."
        raise GradientError(f"a gradient with respect to a string is not defined (the argument "
                            f"is {shown})")
    return g


def tangent_pairs(a: Any, b: Any) -> list[tuple[Any, Any]]:
    """The leaves of two values of the same tuple structure, paired (any depth)."""
    pairs: list[tuple[Any, Any]] = []
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if isinstance(x, tuple) or isinstance(y, tuple):
            if not (isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y)):
                raise GradientError("a tangent must have the structure of its value "
                                    f"(got {type(x).__name__} and {type(y).__name__})")
            stack.extend(zip(reversed(x), reversed(y)))
        else:
            pairs.append((x, y))
    return pairs


def _tangent_dot(a: Any, b: Any) -> Any:
    total: Any = None
    for x, y in tangent_pairs(a, b):
        if x is None or y is None:
            continue
        if isinstance(x, (GradEnv, str)) or isinstance(y, (GradEnv, str)):
            raise GradientError("jvp needs arguments and results that are numbers, tensors "
                                "or tuples of them")
        term = np.sum(np.multiply(x, y)) if isinstance(x, np.ndarray) or isinstance(y, np.ndarray) \
            else x * y
        total = term if total is None else total + term
    if total is None:
        return 0.0
    return float(total) if isinstance(total, (bool, int)) else total


def _tangent_scale(a: Any, s: Any) -> Any:
    def scaled(v: Any) -> Any:
        return v if v is None or isinstance(v, GradEnv) else v * s

    return fold_nested(a, lambda v: v if isinstance(v, tuple) else None,
                       lambda _t, items: tuple(items), scaled)


def _infer_tangent_dot(a: Any, b: Any) -> Any:
    dtypes = [v.dtype for v in _leaves(a) + _leaves(b) if isinstance(v, (AScalar, ATensor))]
    floats = [d for d in dtypes if is_float(d)]
    return AScalar(floats[0] if floats else "f64")


def _leaves(a: Any) -> list[Any]:
    out: list[Any] = []
    stack = [a]
    while stack:
        v = stack.pop()
        if isinstance(v, ATuple):
            stack.extend(v.items)
        else:
            out.append(v)
    return out


def _infer_tangent_scale(a: Any, s: Any) -> Any:
    mul_rule = arith.mul.infer
    assert mul_rule is not None  # declared with a rule
    return map_tuple_leaves(a, lambda v: v if isinstance(v, (ANone, AEnv)) else _widen(mul_rule(v, s)))


tangent_dot = declare("tangent_dot", 2, _tangent_dot, infer=_infer_tangent_dot, family=FAMILY, internal=True,
                      foldable=False,
                      doc="tangent_dot(a, b) — the sum of the elementwise products of two values "
                          "of one tuple structure (jvp's pairing of gradients with tangents)",
                      bprop="lambda (a, b, out, dout) (tangent_scale(b, dout), tangent_scale(a, dout)) end")
tangent_scale = declare("tangent_scale", 2, _tangent_scale, infer=_infer_tangent_scale, family=FAMILY,
                        internal=True, foldable=False,
                        doc="tangent_scale(a, s) — every leaf of a times the scalar s",
                        bprop="lambda (a, s, out, dout) (tangent_scale(dout, s), tangent_dot(dout, a)) end")


grad_arg_check = declare("grad_arg_check", 2, _grad_arg_check, infer=_infer_grad_arg_check, family=FAMILY, internal=True,
                         foldable=False,
                         doc="grad_arg_check(x, g) — g, or an error if x is an integer or bool",
                         bprop="lambda (x, g, out, dout) (zeros_like(x), dout) end")

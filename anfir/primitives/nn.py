"""Neural-network operators: softmax, log_softmax, layer_norm, rms_norm,
group_norm, instance_norm, einsum, attention, the losses and dropout (the
shared spec ``ops.md``, "Neural-network operators").

Each is a primitive with a numpy kernel (:mod:`anfir.primitives.nn_kernels`,
shared with the JAX back end) and a gradient rule in ANF text over other
primitives, so gradients of any order go through the existing AD.  They are
primitives rather than ANF composites because their attributes (``axis``,
``eps``, ``reduction``) then behave as every other primitive's — printed,
reloaded, checked, exported as one ONNX node (``Softmax``,
``LayerNormalization``, ``Einsum``) — and the evaluator runs one fused kernel
instead of a dozen small ops.  The gradient rules need a few internal helpers
(``tail_mean``, ``swap_last``, ``attention_probs``, ``loss_reduce``/``loss_spread``,
``class_mask``...), each itself differentiable.

Tensor operands are inputs, never attributes: ``layer_norm(x, scale, bias,
axis=-1)``, ``attention(q, k, v, mask, causal=true)``,
``group_norm(x, num_groups, scale, bias)``, ``dropout(x, rate, key,
training=true)``.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, Optional

import numpy as np

from anfir.abstract import rules
from anfir.abstract.shapes import broadcast_shapes, dims_equal, fresh_dim, shape_text
from anfir.abstract.values import UNKNOWN, AbstractValue, ANone, AScalar, AString, ATensor, Dim
from anfir.dtypes import is_bool, is_float, is_integer, numpy_dtype, require_dtype_name
from anfir.errors import AnfirTypeError, ShapeError
from anfir.primitives import nn_kernels as K
from anfir.primitives.gradient import sum_to_value
from anfir.primitives.registry import declare

FAMILY = "neural network"
_REDUCTIONS = ("none", "mean", "sum")


# -- attribute and argument checks ------------------------------------------------------------
def _int_attr(value: Any, name: str, what: str) -> int:
    """An integer attribute checked (``axis=-1``)."""
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise AnfirTypeError(f"the attribute {name} of {what} is an integer, not {value!r}")
    return int(value)


def axis_attr(axis: Any, rank: int, what: str) -> int:
    """``axis`` checked against a rank (a 0-d tensor counts as rank 1 for softmax)."""
    ax = _int_attr(axis, "axis", what)
    bound = max(rank, 1)
    if not -bound <= ax < bound:
        raise AnfirTypeError(f"the axis {ax} of {what} is out of range for rank {rank}")
    return ax


def eps_attr(value: Any, what: str) -> float:
    """The ``eps`` attribute of a norm, checked, as a float."""
    eps = rules.float_attr(value, "eps", what)
    assert eps is not None
    return eps


def reduction_attr(value: Any, what: str) -> str:
    """A loss' ``reduction`` attribute, checked: ``"none"``, ``"mean"`` or ``"sum"``."""
    return rules.choice_attr(value, "reduction", what, _REDUCTIONS)


def _array(x: Any, what: str) -> np.ndarray:
    """A numeric argument as an array (tuples, strings and None are type errors)."""
    if x is None or isinstance(x, (tuple, str)):
        raise AnfirTypeError(f"{what} needs a tensor, not {type(x).__name__}")
    array = np.asarray(x)
    if array.dtype.kind not in "biuf":
        raise AnfirTypeError(f"{what} needs a numeric tensor, not {array.dtype}")
    return array


def _optional(x: Any, what: str) -> Optional[np.ndarray]:
    return None if x is None else _array(x, what)


def _scalar(result: Any) -> Any:
    """A 0-d result as a numpy scalar, as numpy's reductions give it."""
    if isinstance(result, np.ndarray) and result.ndim == 0:
        return result[()]
    return result


def _quiet(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` without numpy's warnings (nan and inf are results, as in PyTorch; the
    mean of an empty slice is nan)."""
    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return _scalar(fn(*args, **kwargs))
    return run


# -- evaluation -------------------------------------------------------------------------------
def _softmax_like(kernel: Callable[..., Any], name: str) -> Callable[..., Any]:
    def impl(x: Any, axis: Any = -1) -> Any:
        array = K.float_of(np, _array(x, name))
        ax = axis_attr(axis, array.ndim, name)
        if array.ndim == 0:
            return kernel(np, array.reshape(1), 0).reshape(())
        return kernel(np, array, ax)
    impl.__name__ = f"_{name}"
    impl.__doc__ = f"{name} along an axis"
    return _quiet(impl)


def _check_norm_operand(operand: Optional[np.ndarray], x: np.ndarray, axis: int, what: str,
                        role: str) -> None:
    """scale/bias broadcast against the normalised axes of x."""
    if operand is None:
        return
    tail = x.shape[K.tail_axes(x.ndim, axis)[0]:] if x.ndim else ()
    if operand.ndim > len(tail) or any(d not in (1, t) for d, t in
                                       zip(operand.shape[::-1], tail[::-1])):
        raise ShapeError(f"the {role} of {what} has shape {operand.shape}, which does not "
                         f"broadcast to the normalised axes {tuple(tail)}")


def _layer_norm(x: Any, scale: Any = None, bias: Any = None, axis: Any = -1,
                eps: Any = 1e-5) -> Any:
    """ONNX LayerNormalization: normalise over the axes from ``axis`` to the end."""
    array = K.float_of(np, _array(x, "layer_norm"))
    ax = axis_attr(axis, array.ndim, "layer_norm")
    s, b = _optional(scale, "layer_norm"), _optional(bias, "layer_norm")
    _check_norm_operand(s, array, ax, "layer_norm", "scale")
    _check_norm_operand(b, array, ax, "layer_norm", "bias")
    if array.ndim == 0:
        raise AnfirTypeError("layer_norm needs a tensor of rank >= 1")
    return K.layer_norm(np, array, s, b, ax, eps_attr(eps, "layer_norm"))


def _rms_norm(x: Any, scale: Any = None, axis: Any = -1, eps: Any = 1e-6) -> Any:
    """x / sqrt(mean(x^2) + eps) over the axes from ``axis``, times scale."""
    array = K.float_of(np, _array(x, "rms_norm"))
    if array.ndim == 0:
        raise AnfirTypeError("rms_norm needs a tensor of rank >= 1")
    ax = axis_attr(axis, array.ndim, "rms_norm")
    s = _optional(scale, "rms_norm")
    _check_norm_operand(s, array, ax, "rms_norm", "scale")
    return K.rms_norm(np, array, s, ax, eps_attr(eps, "rms_norm"))


def _check_channels(x: np.ndarray, scale: np.ndarray, bias: np.ndarray, what: str) -> None:
    if x.ndim < 2:
        raise ShapeError(f"{what} needs an (N, C, ...) tensor, not shape {x.shape}")
    for role, v in (("scale", scale), ("bias", bias)):
        if v.shape != (x.shape[1],):
            raise ShapeError(f"the {role} of {what} has shape {v.shape}, not ({x.shape[1]},)")


def group_count(num_groups: Any, channels: int) -> int:
    """group_norm's ``num_groups``, checked positive and dividing ``channels``."""
    if not isinstance(num_groups, (int, np.integer)) or isinstance(num_groups, bool) \
            or num_groups <= 0:
        raise AnfirTypeError(f"num_groups of group_norm is a positive integer, not {num_groups!r}")
    if channels % int(num_groups):
        raise ShapeError(f"group_norm: {channels} channels do not split into "
                         f"{num_groups} groups")
    return int(num_groups)


def _group_norm(x: Any, num_groups: Any, scale: Any, bias: Any, eps: Any = 1e-5) -> Any:
    """Group normalisation (PyTorch's group_norm, ONNX GroupNormalization-21)."""
    array = K.float_of(np, _array(x, "group_norm"))
    s, b = _array(scale, "group_norm"), _array(bias, "group_norm")
    _check_channels(array, s, b, "group_norm")
    groups = group_count(num_groups, array.shape[1])
    return K.group_norm(np, array, groups, s, b, eps_attr(eps, "group_norm"))


def _instance_norm(x: Any, scale: Any, bias: Any, eps: Any = 1e-5) -> Any:
    """Instance normalisation (ONNX InstanceNormalization)."""
    array = K.float_of(np, _array(x, "instance_norm"))
    s, b = _array(scale, "instance_norm"), _array(bias, "instance_norm")
    _check_channels(array, s, b, "instance_norm")
    return K.instance_norm(np, array, s, b, eps_attr(eps, "instance_norm"))


def einsum_spec_text(spec: Any) -> str:
    """einsum's ``spec`` attribute, checked to be a string."""
    if not isinstance(spec, str):
        raise AnfirTypeError(f"the spec of einsum is a string such as \"ij,jk->ik\", not {spec!r}")
    return spec


def parse_einsum_spec(spec: str, count: int) -> tuple[list[str], str]:
    """The subscripts of an explicit spec, checked against the operand count."""
    if "->" not in spec:
        raise AnfirTypeError(f"einsum needs the explicit form with '->', not {spec!r}")
    inputs, output = K.einsum_parts(spec)
    if len(inputs) != count:
        raise AnfirTypeError(f"the einsum spec {spec!r} has {len(inputs)} operands, "
                             f"the call {count}")
    for part in inputs + [output]:
        labels = part.replace("...", "", 1)
        if not (labels == "" or (labels.isascii() and labels.isalpha())):
            raise AnfirTypeError(f"bad subscripts {part!r} in the einsum spec {spec!r}")
    used = set("".join(inputs).replace("...", ""))
    for c in output.replace("...", ""):
        if c not in used:
            raise AnfirTypeError(f"the output label {c!r} of einsum {spec!r} is in no operand")
    if len(set(output.replace("...", ""))) != len(output.replace("...", "")):
        raise AnfirTypeError(f"a label repeats in the output of einsum {spec!r}")
    return inputs, output


def _einsum(spec: Any, *operands: Any) -> Any:
    """numpy's einsum, explicit form."""
    text = einsum_spec_text(spec)
    parse_einsum_spec(text, len(operands))
    arrays = [_array(a, "einsum") for a in operands]
    try:
        return np.einsum(text, *arrays, optimize=len(arrays) > 2)
    except ValueError as exc:
        raise ShapeError(f"einsum {text!r}: {exc}") from None


def _check_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2:
        raise ShapeError("attention needs q, k, v of rank >= 2 (..., L, E)")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ShapeError(f"attention: q {q.shape}, k {k.shape} and v {v.shape} do not agree "
                         "(q and k share E, k and v share S)")


def _attention(q: Any, k: Any, v: Any, mask: Any = None, scale: Any = None,
               causal: Any = False) -> Any:
    """Scaled dot-product attention, as torch.nn.functional.scaled_dot_product_attention."""
    qa, ka, va = (K.float_of(np, _array(a, "attention")) for a in (q, k, v))
    _check_attention(qa, ka, va)
    m = _optional(mask, "attention")
    return K.attention(np, qa, ka, va, m, rules.float_attr(scale, "scale", "attention", True),
                       rules.bool_attr(causal, "causal", "attention"))


def _attention_probs(q: Any, k: Any, mask: Any, scale: Any = None, causal: Any = False) -> Any:
    """softmax(q @ k^T * scale + mask): the weights of attention."""
    qa, ka = (K.float_of(np, _array(a, "attention")) for a in (q, k))
    _check_attention(qa, ka, ka)
    return K.attention_probs(np, qa, ka, _optional(mask, "attention"),
                             rules.float_attr(scale, "scale", "attention", True),
                             rules.bool_attr(causal, "causal", "attention"))


def _attention_scale(q: Any, scale: Any = None) -> float:
    """The scale attention uses: the attribute, or 1 / sqrt(E)."""
    return K.default_scale(np.shape(q), rules.float_attr(scale, "scale", "attention", True))


def _swap_last(x: Any) -> Any:
    """x with its last two axes exchanged."""
    array = _array(x, "swap_last")
    if array.ndim < 2:
        raise AnfirTypeError("swap_last needs a tensor of rank >= 2")
    return K.swap_last(np, array)


def _mask_cotangent(g: Any, mask: Any) -> Any:
    """The gradient of an attention mask: ``g`` summed to its shape for a float mask,
    zeros for a bool one (it selects, it is not added)."""
    m = _array(mask, "attention")
    if m.dtype == np.bool_:
        return np.zeros(m.shape, np.asarray(g).dtype)
    return sum_to_value(g, m)


def _target(target: Any, logp: np.ndarray, axis: int, what: str) -> np.ndarray:
    t = _array(target, what)
    if t.dtype.kind not in "iu":
        raise AnfirTypeError(f"the target of {what} holds class indices (integers), not {t.dtype}")
    expected = logp.shape[:axis] + logp.shape[axis + 1:]
    if t.shape != expected:
        raise ShapeError(f"the target of {what} has shape {t.shape}, not {expected} "
                         f"(the input's shape without the class axis)")
    if t.size and (t.min() < 0 or t.max() >= logp.shape[axis]):
        raise AnfirTypeError(f"a target of {what} is not a class index in "
                             f"[0, {logp.shape[axis]})")
    return t


def _class_axis(x: np.ndarray, axis: Any, what: str) -> int:
    if x.ndim == 0:
        raise AnfirTypeError(f"{what} needs a tensor with a class axis")
    ax = axis_attr(axis, x.ndim, what)
    return ax + x.ndim if ax < 0 else ax


def _nll_loss(logp: Any, target: Any, axis: Any = -1, reduction: Any = "mean") -> Any:
    """The negative log-likelihood of the target classes."""
    red = reduction_attr(reduction, "nll_loss")
    lp = K.float_of(np, _array(logp, "nll_loss"))
    ax = _class_axis(lp, axis, "nll_loss")
    t = _target(target, lp, ax, "nll_loss")
    return K.loss_reduce(np, K.picked(np, lp, t, ax), red)


def _cross_entropy(logits: Any, target: Any, axis: Any = -1, reduction: Any = "mean") -> Any:
    """nll_loss(log_softmax(logits, axis), target)."""
    red = reduction_attr(reduction, "cross_entropy")
    x = K.float_of(np, _array(logits, "cross_entropy"))
    ax = _class_axis(x, axis, "cross_entropy")
    t = _target(target, x, ax, "cross_entropy")
    return K.loss_reduce(np, K.picked(np, K.log_softmax(np, x, ax), t, ax), red)


def _mse_loss(a: Any, b: Any, reduction: Any = "mean") -> Any:
    """The (reduced) squared difference."""
    x, y = _array(a, "mse_loss"), _array(b, "mse_loss")
    d = K.float_of(np, x - y) if x.dtype.kind == "f" or y.dtype.kind == "f" \
        else (x - y).astype(np.float64)
    return K.loss_reduce(np, d * d, reduction_attr(reduction, "mse_loss"))


def _loss_reduce(x: Any, reduction: Any = "mean") -> Any:
    """A per-element loss reduced: none, sum or mean."""
    return K.loss_reduce(np, np.asarray(x), reduction_attr(reduction, "a loss"))


def _loss_spread(g: Any, like: Any, reduction: Any = "mean") -> Any:
    """The adjoint of loss_reduce: g spread over like's shape."""
    return K.loss_spread(np, np.asarray(g), np.asarray(like), reduction_attr(reduction, "a loss"))


def _class_mask(target: Any, like: Any, axis: Any = -1) -> Any:
    """One-hot of the targets along the class axis, in like's dtype."""
    arr = np.asarray(like)
    return K.class_mask(np, np.asarray(target), arr, _class_axis(arr, axis, "a loss"))


def _tail_mean(x: Any, axis: Any = -1) -> Any:
    """The mean over the axes from axis to the end, kept as 1."""
    array = K.float_of(np, _array(x, "tail_mean"))
    return K.tail_mean(np, array, axis_attr(axis, array.ndim, "tail_mean"))


def _channel_view(s: Any, x: Any) -> Any:
    """The (C,) vector s as (C, 1, ..., 1) against the (N, C, ...) tensor x."""
    return np.reshape(_array(s, "a channel norm"), K.channel_shape(np.shape(x)))


def _group_view(x: Any, num_groups: Any) -> Any:
    """The (N, C, ...) tensor x as (N, num_groups, -1)."""
    array = _array(x, "group_norm")
    return np.reshape(array, K.group_shape(array.shape, group_count(num_groups, array.shape[1])))


def _dropout(x: Any, rate: Any, key: Any, training: Any = False) -> Any:
    """x unless training; then x * mask / (1 - rate), the mask drawn from the seed key."""
    if not rules.bool_attr(training, "training", "dropout"):
        return x
    array = _array(x, "dropout")
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.floating, np.integer)) \
            or not 0.0 <= float(rate) <= 1.0:
        raise AnfirTypeError(f"the rate of dropout is a number in [0, 1], not {rate!r}")
    if isinstance(key, bool) or not isinstance(key, (int, np.integer)):
        raise AnfirTypeError(f"the key of dropout is an i64 seed, not {key!r}")
    if float(rate) == 1.0:
        return np.zeros_like(array)
    keep = K.dropout_keep(array.shape, float(rate), int(key))
    return array * keep.astype(array.dtype) * array.dtype.type(1.0 / (1.0 - float(rate))) \
        if array.dtype.kind == "f" else array * keep / (1.0 - float(rate))


def _einsum_grad_spec(spec: Any, index: Any) -> str:
    """The einsum spec that computes the gradient of operand ``index``."""
    text = einsum_spec_text(spec)
    inputs, _ = K.einsum_parts(text)
    mine = inputs[int(index)].replace("...", "")
    if len(set(mine)) != len(mine):
        raise AnfirTypeError(f"the gradient of einsum {text!r} through a label repeated in one "
                             "operand (a diagonal) is not supported")
    return K.einsum_grad_spec(text, int(index))


def _einsum_ones(spec: Any, index: Any, x: Any) -> Any:
    """The ones operand of the gradient spec: x's shape when needed, else a 0-d one."""
    grad_spec = _einsum_grad_spec(spec, index)
    array = np.asarray(x)
    dtype = array.dtype if array.dtype.kind == "f" else np.dtype(np.float64)
    ones_part = grad_spec.split("->")[0].split(",")[-1]
    return np.ones(array.shape if ones_part else (), dtype)


# -- abstract rules ---------------------------------------------------------------------------
def _float_dtype(dtype: str) -> str:
    return dtype if is_float(dtype) else "f64"


def _result_dtype(dtypes: list[str], floats: bool = True) -> str:
    """numpy's promotion of the dtypes (each as its float dtype when ``floats``)."""
    promoted = np.result_type(*[numpy_dtype(_float_dtype(d) if floats else d) for d in dtypes])
    return require_dtype_name(promoted)


def _tensor(a: AbstractValue, what: str) -> tuple[str, Optional[tuple[Dim, ...]]]:
    if not isinstance(a, (ATensor, AScalar)) or (isinstance(a, AScalar) and a.dtype == "str"):
        raise AnfirTypeError(f"{what} needs a tensor, not {a}")
    return rules.shape_of_abstract(a, what)


def _same_as_x(name: str, check: Optional[Callable[..., None]] = None,
               min_rank: int = 0) -> Callable[..., AbstractValue]:
    """The rule of an operator whose result has x's shape and x's float dtype."""
    def rule(x: AbstractValue, *others: AbstractValue, **attrs: Any) -> AbstractValue:
        dtype, shape = _tensor(x, name)
        if shape is not None and len(shape) < min_rank:
            raise AnfirTypeError(f"{name} needs a tensor of rank >= {min_rank}, not {x}")
        for other in others:
            if not isinstance(other, ANone):
                _tensor(other, name)
        if check is not None:
            check(shape, *others, **attrs)
        return rules.tensor_or_scalar(_float_dtype(dtype), shape)
    rule.__name__ = rule.__qualname__ = f"infer_{name}"
    rule.__doc__ = f"Abstract rule of {name}: x's shape, x's float dtype."
    return rule


def _axis_check(name: str) -> Callable[..., None]:
    def check(shape: Any, *others: AbstractValue, axis: Any = -1, **attrs: Any) -> None:
        if shape is not None:
            axis_attr(axis, len(shape), name)
        else:
            _int_attr(axis, "axis", name)
        if "eps" in attrs:
            eps_attr(attrs["eps"], name)
    return check


def _channel_check(name: str) -> Callable[..., None]:
    def check(shape: Any, *others: AbstractValue, eps: Any = 1e-5) -> None:
        eps_attr(eps, name)
        if shape is None:
            return
        if len(shape) < 2:
            raise ShapeError(f"{name} needs an (N, C, ...) tensor, not rank {len(shape)}")
        for other in others[-2:]:
            _, s = _tensor(other, name)
            if s is not None and (len(s) != 1 or not dims_equal(s[0], shape[1])):
                raise ShapeError(f"the scale and bias of {name} have shape ({shape_text(shape)}"
                                 f"[1],), not {shape_text(s)}")
    return check


def _einsum_rule(spec: AbstractValue, *operands: AbstractValue) -> AbstractValue:
    """The shape of einsum: each output label's dimension, the ellipsis broadcast."""
    if not isinstance(spec, AString) or spec.value is UNKNOWN:
        raise AnfirTypeError(f"the spec of einsum must be a constant string, not {spec}")
    inputs, output = parse_einsum_spec(spec.value, len(operands))
    sizes: dict[str, Dim] = {}
    ellipses: list[Optional[tuple[Dim, ...]]] = []
    dtypes = []
    for part, a in zip(inputs, operands):
        dtype, shape = _tensor(a, "einsum")
        dtypes.append(dtype)
        if shape is None:
            ellipses.append(None)
            continue
        labels = part.replace("...", "")
        if ("..." in part and len(shape) < len(labels)) or ("..." not in part and
                                                            len(shape) != len(labels)):
            raise ShapeError(f"einsum {spec.value!r}: operand {part!r} does not match {a}")
        head = part.split("...")[0] if "..." in part else part
        tail = part.split("...")[1] if "..." in part else ""
        dims = list(shape[:len(head)]) + (list(shape[len(shape) - len(tail):]) if tail else [])
        if "..." in part:
            ellipses.append(tuple(shape[len(head):len(shape) - len(tail)]))
        for c, d in zip(head + tail, dims):
            if c in sizes and not dims_equal(sizes[c], d) and d != 1 and sizes[c] != 1:
                raise ShapeError(f"einsum {spec.value!r}: label {c!r} is {sizes[c]} and {d}")
            if c not in sizes or sizes[c] == 1:
                sizes[c] = d
    out_dtype = _result_dtype(dtypes, floats=False)
    if any(e is None for e in ellipses) and (ellipses or "..." in output):
        return ATensor(out_dtype, None)
    middle: tuple[Dim, ...] = ()
    if "..." in output:
        middle = broadcast_shapes([e for e in ellipses if e is not None]) or ()
    head, _, tail = output.partition("...")
    shape = tuple(sizes[c] for c in head) + middle + tuple(sizes[c] for c in tail)
    return rules.tensor_or_scalar(out_dtype, shape)


def _attention_rule(q: AbstractValue, k: AbstractValue, v: AbstractValue,
                    mask: Optional[AbstractValue] = None, *, scale: Any = None,
                    causal: Any = False) -> AbstractValue:
    """(broadcast batch dims, L, Ev) with q's float dtype."""
    return _attention_shape(q, k, v, mask, scale, causal, probs=False)


def _attention_probs_rule(q: AbstractValue, k: AbstractValue, mask: AbstractValue, *,
                          scale: Any = None, causal: Any = False) -> AbstractValue:
    """(broadcast batch dims, L, S)."""
    return _attention_shape(q, k, k, mask, scale, causal, probs=True)


def _attention_shape(q: AbstractValue, k: AbstractValue, v: AbstractValue,
                     mask: Optional[AbstractValue], scale: Any, causal: Any,
                     probs: bool) -> AbstractValue:
    rules.float_attr(scale, "scale", "attention", True)
    rules.bool_attr(causal, "causal", "attention")
    shapes = []
    dtype = "f64"
    for i, a in enumerate((q, k, v)):
        d, s = _tensor(a, "attention")
        if i == 0:
            dtype = _float_dtype(d)
        if s is not None and len(s) < 2:
            raise ShapeError(f"attention needs q, k, v of rank >= 2 (..., L, E), not {a}")
        shapes.append(s)
    if mask is not None and not isinstance(mask, ANone):
        _tensor(mask, "attention")
    if any(s is None for s in shapes):
        return ATensor(dtype, None)
    sq, sk, sv = (s for s in shapes if s is not None)
    if not dims_equal(sq[-1], sk[-1]) or not dims_equal(sk[-2], sv[-2]):
        raise ShapeError(f"attention: q {q}, k {k} and v {v} do not agree (q and k share E, "
                         "k and v share S)")
    batch = broadcast_shapes([sq[:-2], sk[:-2], sv[:-2]])
    assert batch is not None
    last = sk[-2] if probs else sv[-1]
    return ATensor(dtype, tuple(batch) + (sq[-2], last))


def _loss_rule(name: str) -> Callable[..., AbstractValue]:
    def rule(x: AbstractValue, target: AbstractValue, *, axis: Any = -1,
             reduction: Any = "mean") -> AbstractValue:
        red = reduction_attr(reduction, name)
        dtype, shape = _tensor(x, name)
        tdtype, tshape = _tensor(target, name)
        if not is_integer(tdtype):
            raise AnfirTypeError(f"the target of {name} holds class indices (integers), "
                                 f"not {target}")
        out_shape: Optional[tuple[Dim, ...]] = None
        if shape is not None:
            if not shape:
                raise AnfirTypeError(f"{name} needs a tensor with a class axis")
            ax = axis_attr(axis, len(shape), name) % len(shape)
            out_shape = shape[:ax] + shape[ax + 1:]
            if tshape is not None and (len(tshape) != len(out_shape) or not all(
                    dims_equal(a, b) for a, b in zip(tshape, out_shape))):
                raise ShapeError(f"the target of {name} is {target}, not of the input's shape "
                                 "without the class axis")
        if red != "none":
            return AScalar(_float_dtype(dtype))
        return ATensor(_float_dtype(dtype), out_shape)
    rule.__name__ = rule.__qualname__ = f"infer_{name}"
    rule.__doc__ = f"Abstract rule of {name}: a scalar, or the target's shape with none."
    return rule


def _mse_rule(a: AbstractValue, b: AbstractValue, *, reduction: Any = "mean") -> AbstractValue:
    """The broadcast shape with reduction none, else a scalar."""
    red = reduction_attr(reduction, "mse_loss")
    da, sa = _tensor(a, "mse_loss")
    db, sb = _tensor(b, "mse_loss")
    name = _result_dtype([da, db])
    shape = broadcast_shapes([sa, sb], [da, db])
    if red != "none":
        return AScalar(name)
    return rules.tensor_or_scalar(name, shape)


def _loss_reduce_rule(x: AbstractValue, *, reduction: Any = "mean") -> AbstractValue:
    dtype, shape = _tensor(x, "a loss")
    if reduction_attr(reduction, "a loss") == "none":
        return x
    return AScalar(dtype)


def _loss_spread_rule(g: AbstractValue, like: AbstractValue, *,
                      reduction: Any = "mean") -> AbstractValue:
    gdtype, _ = _tensor(g, "a loss")
    _, shape = _tensor(like, "a loss")
    reduction_attr(reduction, "a loss")
    return rules.tensor_or_scalar(gdtype, shape)


def _class_mask_rule(target: AbstractValue, like: AbstractValue, *, axis: Any = -1) -> AbstractValue:
    _tensor(target, "a loss")
    return like


def _tail_mean_rule(x: AbstractValue, *, axis: Any = -1) -> AbstractValue:
    dtype, shape = _tensor(x, "tail_mean")
    if shape is None:
        return ATensor(_float_dtype(dtype), None)
    ax = axis_attr(axis, len(shape), "tail_mean")
    axes = K.tail_axes(len(shape), ax)
    return ATensor(_float_dtype(dtype), tuple(1 if i in axes else d for i, d in enumerate(shape)))


def _swap_last_rule(x: AbstractValue) -> AbstractValue:
    dtype, shape = _tensor(x, "swap_last")
    if shape is None:
        return x
    if len(shape) < 2:
        raise AnfirTypeError("swap_last needs a tensor of rank >= 2")
    return ATensor(dtype, shape[:-2] + (shape[-1], shape[-2]))


def _mask_cotangent_rule(g: AbstractValue, mask: AbstractValue) -> AbstractValue:
    gdtype, _ = _tensor(g, "attention")
    _, shape = _tensor(mask, "attention")
    return rules.tensor_or_scalar(gdtype, shape)


def _scale_rule(q: AbstractValue, *, scale: Any = None) -> AbstractValue:
    rules.float_attr(scale, "scale", "attention", True)
    _tensor(q, "attention")
    return AScalar("f64")


def _channel_view_rule(s: AbstractValue, x: AbstractValue) -> AbstractValue:
    dtype, _ = _tensor(s, "a channel norm")
    _, shape = _tensor(x, "a channel norm")
    if shape is None or len(shape) < 2:
        raise AnfirTypeError(f"a channel norm needs an (N, C, ...) tensor of known rank, not {x}")
    return ATensor(dtype, (shape[1],) + (1,) * (len(shape) - 2))


def _group_view_rule(x: AbstractValue, groups: AbstractValue) -> AbstractValue:
    dtype, shape = _tensor(x, "group_norm")
    count = rules.int_value(groups, "num_groups of group_norm")
    if shape is None or len(shape) < 2:
        raise AnfirTypeError(f"group_norm needs an (N, C, ...) tensor of known rank, not {x}")
    rest: Dim = fresh_dim()
    if count is not None and all(isinstance(d, int) for d in shape[1:]):
        rest = int(np.prod([int(d) for d in shape[1:]], dtype=np.int64)) // count
    return ATensor(dtype, (shape[0], fresh_dim() if count is None else count, rest))


def _dropout_rule(x: AbstractValue, rate: AbstractValue, key: AbstractValue, *,
                  training: Any = False) -> AbstractValue:
    rules.bool_attr(training, "training", "dropout")
    _tensor(x, "dropout")
    if not isinstance(rate, AScalar) or not (is_float(rate.dtype) or is_integer(rate.dtype)):
        raise AnfirTypeError(f"the rate of dropout is a number, not {rate}")
    if not isinstance(key, AScalar) or not is_integer(key.dtype) or is_bool(key.dtype):
        raise AnfirTypeError(f"the key of dropout is an i64 seed, not {key}")
    return x


def _grad_spec_rule(spec: AbstractValue, index: AbstractValue) -> AbstractValue:
    if isinstance(spec, AString) and spec.value is not UNKNOWN and isinstance(index, AScalar) \
            and index.value is not UNKNOWN:
        return AString(_einsum_grad_spec(spec.value, index.value))
    raise AnfirTypeError("the gradient of einsum needs a constant spec")


def _einsum_ones_rule(spec: AbstractValue, index: AbstractValue, x: AbstractValue) -> AbstractValue:
    dtype, shape = _tensor(x, "einsum")
    grad = _grad_spec_rule(spec, index)
    assert isinstance(grad, AString)
    ones_part = grad.value.split("->")[0].split(",")[-1]
    return ATensor(_float_dtype(dtype), shape if ones_part else ())


# -- gradient rules ---------------------------------------------------------------------------
def _einsum_bprops(most: int) -> dict[int, str]:
    """The gradient rule of einsum with 1..most operands: operand i's gradient is the
    einsum of dout with the others (and ones) back to i's labels."""
    texts = {}
    for n in range(1, most + 1):
        names = [f"a{i}" for i in range(n)]
        grads = []
        for i in range(n):
            others = ", ".join(names[j] for j in range(n) if j != i)
            args = ", ".join(p for p in ("dout", others, f"einsum_ones(s, {i}, a{i})") if p)
            grads.append(f"sum_to(einsum(einsum_grad_spec(s, {i}), {args}), a{i})")
        texts[n + 1] = (f"lambda (s, {', '.join(names)}, out, dout) "
                        f"(zeros_like(s), {', '.join(grads)}) end")
    return texts


EINSUM_OPERANDS = 6
"""The most operands an einsum call takes (its gradient takes one more)."""

_NORM_DX = """
  let g = dout * {scale} in
  let dx = r * (g - tail_mean(g, axis) - xhat * tail_mean(g * xhat, axis)) in"""
_LAYER_NORM_HEAD = """
  let xc = x - tail_mean(x, axis) in
  let r = rsqrt(tail_mean(xc * xc, axis) + eps) in
  let xhat = xc * r in"""


def _layer_norm_bprop() -> dict[int, str]:
    head = _LAYER_NORM_HEAD
    return {
        1: f"lambda (x, axis, eps, out, dout) {head} {_NORM_DX.format(scale='1.0')} (dx,) end",
        2: f"""lambda (x, s, axis, eps, out, dout) {head} {_NORM_DX.format(scale='s')}
               (dx, sum_to(dout * xhat, s)) end""",
        3: f"""lambda (x, s, b, axis, eps, out, dout) {head} {_NORM_DX.format(scale='s')}
               (dx, sum_to(dout * xhat, s), sum_to(dout, b)) end""",
    }


_RMS_HEAD = """
  let r = rsqrt(tail_mean(x * x, axis) + eps) in
  let g = dout * {scale} in
  let dx = r * (g - x * (r * r) * tail_mean(g * x, axis)) in"""

_CHANNEL_NORM = """lambda (x, {groups}s, b, eps, out, dout)
  let xg = {grouping} in
  let xc = xg - tail_mean(xg, 2) in
  let r = rsqrt(tail_mean(xc * xc, 2) + eps) in
  let xh = xc * r in
  let xhat = reshape_like(xh, x) in
  let g = {regroup}(dout * channel_view(s, x){regroup_args}) in
  let dx = r * (g - tail_mean(g, 2) - xh * tail_mean(g * xh, 2)) in
  (reshape_like(dx, x), {zero}reshape_like(sum_to(dout * xhat, channel_view(s, x)), s),
   reshape_like(sum_to(dout, channel_view(b, x)), b))
end"""

_ATTENTION = """lambda (q, k, v, {mask}scale, causal, out, dout)
  let p = attention_probs(q, k, {mask_arg}, scale, causal) in
  let dp = matmul(dout, swap_last(v)) in
  let t = dp * p in
  let dl = t - p * sum(t, -1, true) in
  let ds = dl * attention_scale(q, scale) in
  (sum_to(matmul(ds, k), q), sum_to(swap_last(matmul(swap_last(q), ds)), k),
   sum_to(swap_last(matmul(swap_last(dout), p)), v){mask_grad})
end"""


# -- declarations -----------------------------------------------------------------------------
softmax = declare("softmax", 1, _softmax_like(K.softmax, "softmax"),
                  infer=_same_as_x("softmax", _axis_check("softmax")), family=FAMILY,
                  attrs={"axis": -1}, positional_attrs=1,
                  doc="softmax(x, axis=-1) — exp(x) / sum(exp(x)) along an axis, without overflow",
    bprop="lambda (x, axis, out, dout) (out * (dout - sum(dout * out, axis, true)),) end")
log_softmax = declare("log_softmax", 1, _softmax_like(K.log_softmax, "log_softmax"),
                      infer=_same_as_x("log_softmax", _axis_check("log_softmax")), family=FAMILY,
                      attrs={"axis": -1}, positional_attrs=1,
                      doc="log_softmax(x, axis=-1) — x - logsumexp(x) along an axis",
    bprop="lambda (x, axis, out, dout) (dout - exp(out) * sum(dout, axis, true),) end")
layer_norm = declare("layer_norm", (1, 3), _quiet(_layer_norm),
                     infer=_same_as_x("layer_norm", _axis_check("layer_norm"), 1), family=FAMILY,
                     attrs={"axis": -1, "eps": 1e-5},
                     doc="layer_norm(x, scale, bias, axis=-1, eps=1e-5) — normalise over the "
                         "axes from axis to the end, then * scale + bias (both optional; ONNX "
                         "LayerNormalization)",
    bprop=_layer_norm_bprop())
rms_norm = declare("rms_norm", (1, 2), _quiet(_rms_norm),
                   infer=_same_as_x("rms_norm", _axis_check("rms_norm"), 1), family=FAMILY,
                   attrs={"axis": -1, "eps": 1e-6},
                   doc="rms_norm(x, scale, axis=-1, eps=1e-6) — x / sqrt(mean(x^2) + eps) over "
                       "the axes from axis to the end, * scale (optional)",
    bprop={1: f"lambda (x, axis, eps, out, dout) {_RMS_HEAD.format(scale='1.0')} (dx,) end",
           2: f"""lambda (x, s, axis, eps, out, dout) {_RMS_HEAD.format(scale='s')}
                    (dx, sum_to(dout * x * r, s)) end"""})
group_norm = declare("group_norm", 4, _quiet(_group_norm),
                     infer=_same_as_x("group_norm", _channel_check("group_norm"), 2),
                     family=FAMILY, attrs={"eps": 1e-5},
                     doc="group_norm(x, num_groups, scale, bias, eps=1e-5) — normalise each "
                         "group of channels of an (N, C, ...) tensor; per-channel scale, bias",
    bprop=_CHANNEL_NORM.format(groups="n, ", grouping="group_view(x, n)", regroup="group_view",
                               regroup_args=", n", zero="zeros_like(n), "))
instance_norm = declare("instance_norm", 3, _quiet(_instance_norm),
                        infer=_same_as_x("instance_norm", _channel_check("instance_norm"), 2),
                        family=FAMILY, attrs={"eps": 1e-5},
                        doc="instance_norm(x, scale, bias, eps=1e-5) — normalise each channel "
                            "of each sample of an (N, C, ...) tensor over its spatial axes",
    bprop=_CHANNEL_NORM.format(groups="", grouping="x", regroup="", regroup_args="", zero=""))
einsum = declare("einsum", (2, EINSUM_OPERANDS + 2), _quiet(_einsum), infer=_einsum_rule,
                 family=FAMILY,
                 doc='einsum("ij,jk->ik", a, b) — numpy einsum, explicit form (up to '
                     f'{EINSUM_OPERANDS} operands; "..." broadcasts)',
    bprop=_einsum_bprops(EINSUM_OPERANDS + 1))
attention = declare("attention", (3, 4), _quiet(_attention), infer=_attention_rule, family=FAMILY,
                    attrs={"scale": None, "causal": False},
                    doc="attention(q, k, v, mask, scale=None, causal=false) — softmax(q @ k^T * "
                        "scale + mask) @ v over (..., L, E) tensors, as PyTorch's "
                        "scaled_dot_product_attention (mask optional: bool keeps, float adds; "
                        "scale None is 1/sqrt(E))",
    bprop={3: _ATTENTION.format(mask="", mask_arg="None", mask_grad=""),
           4: _ATTENTION.format(mask="m, ", mask_arg="m",
                                mask_grad=", mask_cotangent(dl, m)")})
nll_loss = declare("nll_loss", 2, _quiet(_nll_loss), infer=_loss_rule("nll_loss"), family=FAMILY,
                   attrs={"axis": -1, "reduction": "mean"}, positional_attrs=2,
                   doc='nll_loss(logp, target, axis=-1, reduction="mean") — minus the log '
                       'probability of the target classes (i64 indices; "mean", "sum", "none")',
    bprop="""lambda (lp, t, axis, reduction, out, dout)
        (neg(unreduce(loss_spread(dout, t, reduction), lp, axis) * class_mask(t, lp, axis)),
         zeros_like(t)) end""")
cross_entropy = declare("cross_entropy", 2, _quiet(_cross_entropy),
                        infer=_loss_rule("cross_entropy"), family=FAMILY,
                        attrs={"axis": -1, "reduction": "mean"}, positional_attrs=2,
                        doc='cross_entropy(logits, target, axis=-1, reduction="mean") — '
                            'nll_loss(log_softmax(logits, axis), target)',
    bprop="""lambda (x, t, axis, reduction, out, dout)
        let g = unreduce(loss_spread(dout, t, reduction), x, axis) * class_mask(t, x, axis) in
        (softmax(x, axis) * sum(g, axis, true) - g, zeros_like(t)) end""")
mse_loss = declare("mse_loss", 2, _quiet(_mse_loss), infer=_mse_rule, family=FAMILY,
                   attrs={"reduction": "mean"}, positional_attrs=1,
                   doc='mse_loss(a, b, reduction="mean") — the squared difference, reduced',
    bprop="""lambda (a, b, reduction, out, dout)
        let d = a - b in
        let g = loss_spread(dout, d, reduction) * 2.0 * d in
        (sum_to(g, a), sum_to(neg(g), b)) end""")
dropout = declare("dropout", 3, _dropout, infer=_dropout_rule, family=FAMILY,
                  attrs={"training": False}, positional_attrs=1,
                  doc="dropout(x, rate, key, training=false) — x; with training, x * mask / "
                      "(1 - rate), the mask drawn from the i64 seed key (the same key, the "
                      "same mask)",
    bprop="""lambda (x, rate, key, training, out, dout)
        (dropout(dout, rate, key, training), zeros_like(rate), zeros_like(key)) end""")

# -- internal helpers of the gradient rules ------------------------------------------------------
INTERNAL = "neural network (internal)"
tail_mean = declare("tail_mean", 1, _quiet(_tail_mean), infer=_tail_mean_rule, family=INTERNAL,
                    internal=True, attrs={"axis": -1}, positional_attrs=1,
                    doc="tail_mean(x, axis) — the mean over the axes from axis to the end, kept",
    bprop="lambda (x, axis, out, dout) (broadcast_like(dout, x) * (size(out) / size(x)),) end")
swap_last = declare("swap_last", 1, _swap_last, infer=_swap_last_rule, family=INTERNAL,
                    internal=True, doc="swap_last(x) — x with its last two axes exchanged",
    bprop="lambda (x, out, dout) (swap_last(dout),) end")
attention_probs = declare("attention_probs", 3, _quiet(_attention_probs),
                          infer=_attention_probs_rule, family=INTERNAL, internal=True,
                          attrs={"scale": None, "causal": False}, positional_attrs=2,
                          doc="attention_probs(q, k, mask, scale, causal) — the weights "
                              "softmax(q @ k^T * scale + mask) of attention (mask may be None)",
    bprop="""lambda (q, k, m, scale, causal, out, dout)
        let ds = out * (dout - sum(dout * out, -1, true)) * attention_scale(q, scale) in
        (sum_to(matmul(ds, k), q), sum_to(matmul(swap_last(ds), q), k), zeros_like(m)) end""")
attention_scale = declare("attention_scale", 1, _attention_scale, infer=_scale_rule,
                          family=INTERNAL, internal=True, differentiable=False,
                          attrs={"scale": None}, positional_attrs=1,
                          doc="attention_scale(q, scale) — scale, or 1 / sqrt(E) when None")
mask_cotangent = declare("mask_cotangent", 2, _mask_cotangent, infer=_mask_cotangent_rule,
                         family=INTERNAL, internal=True,
                         doc="mask_cotangent(g, mask) — the gradient of an attention mask: g "
                             "summed to a float mask's shape, zeros for a bool mask",
    bprop="""lambda (g, m, out, dout)
        (broadcast_like(cast_like(dout, g), g), zeros_like(m)) end""")
loss_reduce = declare("loss_reduce", 1, _quiet(_loss_reduce), infer=_loss_reduce_rule,
                      family=INTERNAL, internal=True, attrs={"reduction": "mean"},
                      positional_attrs=1,
                      doc='loss_reduce(x, reduction) — x, sum(x) or mean(x) ("none", "sum", "mean")',
    bprop="lambda (x, reduction, out, dout) (loss_spread(dout, x, reduction),) end")
loss_spread = declare("loss_spread", 2, _quiet(_loss_spread), infer=_loss_spread_rule,
                      family=INTERNAL, internal=True, attrs={"reduction": "mean"},
                      positional_attrs=1,
                      doc="loss_spread(g, like, reduction) — the adjoint of loss_reduce: g spread "
                          "over like's shape",
    bprop="lambda (g, like, reduction, out, dout) (loss_reduce(dout, reduction), zeros_like(like)) end")
class_mask = declare("class_mask", 2, _class_mask, infer=_class_mask_rule, family=INTERNAL,
                     internal=True, differentiable=False, attrs={"axis": -1}, positional_attrs=1,
                     doc="class_mask(target, like, axis) — one-hot of the class indices along "
                         "axis, in like's dtype")
channel_view = declare("channel_view", 2, _channel_view, infer=_channel_view_rule,
                       family=INTERNAL, internal=True,
                       doc="channel_view(s, x) — the (C,) vector s as (C, 1, ..., 1), against "
                           "an (N, C, ...) tensor x",
    bprop="lambda (s, x, out, dout) (reshape_like(dout, s), zeros_like(x)) end")
group_view = declare("group_view", 2, _group_view, infer=_group_view_rule, family=INTERNAL,
                     internal=True,
                     doc="group_view(x, g) — an (N, C, ...) tensor as (N, g, C/g * ...)",
    bprop="lambda (x, g, out, dout) (reshape_like(dout, x), zeros_like(g)) end")
einsum_grad_spec = declare("einsum_grad_spec", 2, _einsum_grad_spec, infer=_grad_spec_rule,
                           family=INTERNAL, internal=True, differentiable=False,
                           doc='einsum_grad_spec(spec, i) — the einsum spec of the gradient of '
                               'operand i ("ij,jk->ik", 0 gives "ik,jk,->ij")')
einsum_ones = declare("einsum_ones", 3, _einsum_ones, infer=_einsum_ones_rule, family=INTERNAL,
                      internal=True, differentiable=False,
                      doc="einsum_ones(spec, i, x) — the ones operand of that gradient spec")

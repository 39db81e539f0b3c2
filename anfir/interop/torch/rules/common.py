"""The table from ATen ops (``OpOverload``s of core ATen, after
``run_decompositions()``) to builders over anfir's operator library.

One entry per op: ``rule(b, *args, **kwargs)`` gets a
:class:`~anfir.interop.torch.importer.Builder` and the op's arguments with FX
nodes already replaced by anfir nodes, and returns the node computing the
op's result (a tuple for ops with several results).  Rules hold the
primitive objects of :mod:`anfir.primitives` (never their names), so a
missing primitive is an error when this module is imported, which mypy sees;
an op with no entry is the importer's "unsupported op" error, never a partial
graph.
A few ops (layer norm, batch norm in eval, softmax) are compositions of
anfir primitives, so their gradients come from those primitives' rules.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Optional

from anfir.errors import AnfirError
from anfir.interop import attributes
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.primitives import arith, conv, elementwise, indexing, nn, reduce, shaping, structure, tensor

Rule = Callable[..., Any]


def _axes(dim: Any) -> Any:
    """A torch ``dim`` argument as an anfir ``axis`` attribute (None: every axis)."""
    if dim is None:
        return None
    if isinstance(dim, (list, tuple)):
        return None if len(dim) == 0 else tuple(int(d) for d in dim)
    return int(dim)


def _unary(prim: Primitive) -> Rule:
    return lambda b, x: b.call(prim, x)


def _binary(prim: Primitive) -> Rule:
    return lambda b, x, y: b.call(prim, x, y)


def _add(prim: Primitive) -> Rule:
    mul = arith.mul

    def rule(b: Any, x: Any, y: Any, alpha: Any = 1) -> Any:
        return b.call(prim, x, y if alpha == 1 else b.call(mul, y, alpha))
    return rule


def _reduction(prim: Primitive, all_when_empty: bool = True) -> Rule:

    def rule(b: Any, x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
        out = b.call(prim, x, axis=_axes(dim), keepdims=bool(keepdim))
        return b.call(tensor.cast, out, dtype) if dtype is not None else out
    return rule


def _reshape_to_result(b: Any, x: Any, *_: Any, **__: Any) -> Any:
    """view / reshape / squeeze / unsqueeze / flatten: the result shape is the FakeTensor's."""
    return b.call(tensor.reshape, x, b.out_shape())


def _expand(b: Any, x: Any, *_: Any, **__: Any) -> Any:
    """``expand`` / ``expand_as``: ``broadcast_to`` the result's shape — or ``x`` itself
    when that is already its static shape (torch's decomposition of a batched
    ``matmul`` expands each operand to its own shape; ONNX's ``MatMul`` has no such step)."""
    before = tuple(b.fx_node.args[0].meta["val"].shape)
    after = tuple(b.fx_node.meta["val"].shape)
    if before == after and all(isinstance(d, int) for d in after):
        return x
    return b.call(tensor.broadcast_to, x, b.out_shape())


def _identity(b: Any, x: Any, *_: Any, **__: Any) -> Any:
    return b.call(structure.identity, x)


def _to_copy(b: Any, x: Any, *, dtype: Any = None, **__: Any) -> Any:
    return b.call(tensor.cast, x, dtype) if dtype is not None else b.call(structure.identity, x)


def _permute(b: Any, x: Any, dims: Any) -> Any:
    return b.call(tensor.transpose, x, b.tuple_of(int(d) for d in dims))


def _transpose_int(b: Any, x: Any, d0: int, d1: int) -> Any:
    rank = b.rank(b.fx_node.args[0])
    perm = list(range(rank))
    perm[d0 % rank], perm[d1 % rank] = perm[d1 % rank], perm[d0 % rank]
    return b.call(tensor.transpose, x, b.tuple_of(perm))


def _t(b: Any, x: Any) -> Any:
    return b.call(tensor.transpose, x) if b.rank(b.fx_node.args[0]) == 2 else b.call(structure.identity, x)


def _addmm(b: Any, bias: Any, m1: Any, m2: Any, *, beta: Any = 1, alpha: Any = 1) -> Any:
    mul = arith.mul
    prod = b.call(tensor.matmul, m1, m2)
    if alpha != 1:
        prod = b.call(mul, prod, alpha)
    if beta == 0:
        return prod
    return b.call(arith.add, bias if beta == 1 else b.call(mul, bias, beta), prod)


def _div_mode(b: Any, x: Any, y: Any, *, rounding_mode: Optional[str] = None) -> Any:
    if rounding_mode is None:
        return b.call(arith.div, x, y)
    if rounding_mode == "floor":
        return b.call(elementwise.floor_div, x, y)
    q = b.call(arith.div, x, y)  # trunc: toward zero
    t = b.call(tensor.where, b.call(arith.lt, q, 0), b.call(elementwise.ceil, q), b.call(elementwise.floor, q))
    return b.call(tensor.cast, t, b.out_dtype())


def _clamp(b: Any, x: Any, min: Any = None, max: Any = None) -> Any:
    return b.call(elementwise.clip, x, min=min, max=max)


def _hardtanh(b: Any, x: Any, min_val: Any = -1.0, max_val: Any = 1.0) -> Any:
    """``hardtanh`` (ReLU6 is ``hardtanh(x, 0, 6)``): the value of ``clip``, but
    PyTorch's gradient, which is 0 at the bounds (``clamp``'s, and anfir
    ``clip``'s, is 1 there): ``x`` strictly inside, else the clipped value read
    through ``stop_gradient``.  Exact: inside, ``clip`` would return ``x``."""
    lo, hi = float(min_val), float(max_val)
    inside = b.call(arith.logical_and, b.call(arith.gt, x, lo), b.call(arith.lt, x, hi))
    held = b.call(elementwise.clip, b.call(structure.stop_gradient, x), min=lo, max=hi)
    return b.call(tensor.where, inside, x, held)


def _hardsigmoid(b: Any, x: Any) -> Any:
    """``hardsigmoid``: anfir's ``hard_sigmoid`` with PyTorch's slope; its gradient
    is 0 at -3 and 3, as PyTorch's (the decomposed form, through ``clamp``, is not)."""
    return b.call(elementwise.hard_sigmoid, x, alpha=1.0 / 6.0, beta=0.5)


def _extreme_dim(prim: Primitive) -> Rule:
    """``max.dim`` / ``min.dim`` -> ``(values, indices)``: the index of the first
    extreme (``argmax``), the values read there with ``gather_elements`` — so the
    gradient goes to that one element, as PyTorch's does (``amax`` spreads it
    evenly over ties instead)."""
    def rule(b: Any, x: Any, dim: int, keepdim: bool = False) -> Any:
        axis = int(dim)
        index = b.call(prim, x, axis=axis, keepdims=True)
        values = b.call(indexing.gather_elements, x, index, axis=axis)
        if not keepdim:
            values = b.call(shaping.squeeze, values, axis=axis)
            index = b.call(shaping.squeeze, index, axis=axis)
        return b.call(structure.make_tuple, values, index)
    return rule


def _topk(b: Any, x: Any, k: Any, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
    """``topk`` -> anfir's ``topk`` for the indices (ties: the lower index first, as
    PyTorch's CPU kernel), the values read there with ``gather_elements``: the
    gradient goes to the selected elements."""
    _static_ints(b, "topk's k", k)
    axis = int(dim)
    pair = b.call(indexing.topk, x, k=int(k), axis=axis, largest=bool(largest))
    index = b.call(structure.tuple_getitem, pair, 1)
    return b.call(structure.make_tuple, b.call(indexing.gather_elements, x, index, axis=axis), index)


def _sort(b: Any, x: Any, dim: int = -1, descending: bool = False) -> Any:
    """``sort`` (stable: equal elements keep their order) as a ``topk`` of the
    whole (static) axis."""
    shape = b.fx_node.args[0].meta["val"].shape
    if not shape:
        return b.call(structure.make_tuple, b.call(structure.identity, x),
                      b.call(tensor.cast, b.call(structure.zeros_like, x), "i64"))
    size = shape[int(dim)]
    if not isinstance(size, int):
        raise AnfirError("sort along a dynamic axis", b.loc)
    return _topk(b, x, size, dim, largest=bool(descending))


def _sort_stable(b: Any, x: Any, *, stable: Any = None, dim: int = -1,
                 descending: bool = False) -> Any:
    return _sort(b, x, dim, descending)


def _gelu(b: Any, x: Any, *, approximate: str = "none") -> Any:
    return b.call(elementwise.gelu, x, approximate=approximate)


def _leaky_relu(b: Any, x: Any, negative_slope: Any = 0.01) -> Any:
    return b.call(elementwise.leaky_relu, x, alpha=float(negative_slope))


def _full(b: Any, size: Any, fill: Any, **_: Any) -> Any:
    dt = b.out_dtype()
    return b.call(arith.add, b.call(tensor.zeros, b.out_shape(), dt), b.call(tensor.cast, fill, dt))


def _full_like(b: Any, x: Any, fill: Any, **_: Any) -> Any:
    dt = b.out_dtype()
    zeros = b.call(tensor.cast, b.call(structure.zeros_like, x), dt)
    return b.call(arith.add, zeros, b.call(tensor.cast, fill, dt))


def _like(fill: float) -> Rule:
    return lambda b, x, **kw: _full_like(b, x, fill, **kw)


def _scalar_tensor(b: Any, value: Any, **_: Any) -> Any:
    return b.call(tensor.cast, value, b.out_dtype())


def _sym_size(b: Any, x: Any, dim: int) -> Any:
    return b.call(structure.tuple_getitem, b.call(tensor.shape, x), int(dim))


def _getitem(b: Any, t: Any, i: Any) -> Any:
    """``operator.getitem`` of a multi-result op: the item itself when the op's
    rule built the tuple here (batch norm, max pool), else ``tuple_getitem``."""
    if (isinstance(t, CNode) and isinstance(i, int) and isinstance(t.inputs[0], ValueNode)
            and t.inputs[0].value is structure.make_tuple and 0 <= i < len(t.inputs) - 1):
        return t.inputs[i + 1]
    return b.call(structure.tuple_getitem, t, i)


def _no_value(b: Any, *_: Any, **__: Any) -> Any:
    """Run-time assertions torch inserts: shape facts the specializer checks itself."""
    return None


def _var(b: Any, x: Any, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Any:
    return b.call(reduce.var, x, axis=_axes(dim), keepdims=bool(keepdim),
                  correction=1 if correction is None else correction)


def _argext(prim: Primitive) -> Rule:
    def rule(b: Any, x: Any, dim: Any = None, keepdim: bool = False) -> Any:
        return b.call(prim, x, axis=None if dim is None else int(dim), keepdims=bool(keepdim))
    return rule


def _cumsum(b: Any, x: Any, dim: int, *, dtype: Any = None) -> Any:
    out = b.call(reduce.cumsum, x, axis=int(dim))
    return b.call(tensor.cast, out, dtype) if dtype is not None else out


def _softmax_core(b: Any, x: Any, dim: int, log: bool) -> Any:
    """(log) softmax along ``dim`` as anfir's ``softmax`` / ``log_softmax`` primitive —
    what ONNX's importer makes of ``Softmax`` / ``LogSoftmax``, so a model gives the same
    graph by either route.  Their gradient rules are PyTorch's backward formulas
    (``out * (g - sum(g * out))``, ``g - exp(out) * sum(g)``)."""
    return b.call(nn.log_softmax if log else nn.softmax, x, axis=int(dim))


def _softmax(b: Any, x: Any, dim: int, half_to_float: bool = False) -> Any:
    return _softmax_core(b, x, dim, log=False)


def _log_softmax(b: Any, x: Any, dim: int, half_to_float: bool = False) -> Any:
    return _softmax_core(b, x, dim, log=True)


def _layer_norm(b: Any, x: Any, normalized_shape: Any, weight: Any, bias: Any, eps: float) -> Any:
    """``native_layer_norm`` -> ``(out, mean, rstd)``: ``out`` is anfir's ``layer_norm``
    primitive (as ONNX's ``LayerNormalization`` imports; its gradient rule is PyTorch's
    formula), the saved statistics are composed beside it (a program that does not read
    them loses them to dead-code elimination).  A bias without a weight, which
    ``layer_norm`` cannot take, is the composition throughout."""
    rank = b.rank(b.fx_node.args[0])
    axes = tuple(range(rank - len(normalized_shape), rank))
    mean = b.call(tensor.mean, x, axis=axes, keepdims=True)
    centered = b.call(arith.sub, x, mean)
    var = b.call(tensor.mean, b.call(arith.mul, centered, centered), axis=axes, keepdims=True)
    rstd = b.call(elementwise.rsqrt, b.call(arith.add, var, float(eps)))
    if weight is None and bias is not None:
        out = b.call(arith.add, b.call(arith.mul, centered, rstd), bias)
    else:
        args = [x] + [a for a in (weight, bias) if a is not None]
        out = b.call(nn.layer_norm, *args, axis=-len(normalized_shape), eps=float(eps))
    return b.call(structure.make_tuple, out, mean, rstd)


def _channel_fill(b: Any, fx_x: Any, fill: Any) -> Any:
    """A vector of ones (``fill`` is ``tensor.ones``) or zeros, one per channel (axis 1)
    of the FX argument ``fx_x``, in its dtype: the scale or bias of a norm that has
    none, so the norm is still the op library's primitive (ONNX's carry both)."""
    channels = b.importer.size_value(fx_x.meta["val"].shape[1], b)
    return b.call(fill, b.tuple_of((channels,)), b.arg_dtype(fx_x))


def _batch_norm_eval(b: Any, x: Any, weight: Any, bias: Any, mean: Any, var: Any,
                     momentum: Any, eps: float) -> Any:
    """``_native_batch_norm_legit_no_training`` (batch norm in eval): anfir's
    ``batch_norm`` (what ONNX's ``BatchNormalization`` imports as), with scale 1 /
    bias 0 for a norm without them."""
    fx_x = b.fx_node.args[0]
    weight = _channel_fill(b, fx_x, tensor.ones) if weight is None else weight
    bias = _channel_fill(b, fx_x, tensor.zeros) if bias is None else bias
    out = b.call(conv.batch_norm, x, weight, bias, mean, var, eps=float(eps))
    # The saved mean/rstd of the eval form are empty in torch; nothing reads them.
    return b.call(structure.make_tuple, out, mean, var)


def _int_tuple(values: Any, n: int) -> tuple[int, ...]:
    """A torch int-list argument (one int stands for every axis) as n ints."""
    items = list(values) if isinstance(values, (list, tuple)) else [values]
    if len(items) == 1:
        items = items * n
    return tuple(int(v) for v in items)


def _ints(values: Any, n: int) -> Any:
    """A torch int-list argument (stride, padding per axis, dilation, kernel) as an
    anfir window attribute in its one short form (:mod:`anfir.interop.window_attrs`)."""
    return attributes.per_axis(_int_tuple(values, n), n)


def _convolution(b: Any, x: Any, w: Any, bias: Any, stride: Any, padding: Any, dilation: Any,
                 transposed: bool, output_padding: Any, groups: int) -> Any:
    """``aten.convolution``: ``conv`` (torch's padding is per axis, both sides), or
    ``conv_transpose`` when ``transposed``."""
    n = b.rank(b.fx_node.args[1]) - 2
    attrs: dict[str, Any] = {"stride": _ints(stride, n), "padding": _ints(padding, n),
                             "dilation": _ints(dilation, n), "groups": int(groups)}
    args = [x, w] if bias is None else [x, w, bias]
    if transposed:
        return b.call(conv.conv_transpose, *args, output_padding=_ints(output_padding, n),
                      **attrs)
    if _ints(output_padding, n) != 0:
        raise AnfirError("a convolution with output_padding that is not transposed", b.loc)
    return b.call(conv.conv, *args, **attrs)


def _max_pool_with_indices(n: int) -> Rule:
    """``max_pool{n}d_with_indices`` -> ``(max_pool(x, ...),)``: the indices are not
    computed, so a program that reads them is refused (by the importer, before
    anything is built: see :func:`reads_pool_indices`)."""
    def rule(b: Any, x: Any, kernel: Any, stride: Any = (), padding: Any = 0, dilation: Any = 1,
             ceil_mode: bool = False) -> Any:
        k = _ints(kernel, n)
        out = b.call(conv.max_pool, x, kernel=k, stride=_ints(stride, n) if stride else k,
                     padding=_ints(padding, n), dilation=_ints(dilation, n),
                     ceil_mode=bool(ceil_mode))
        return b.call(structure.make_tuple, out)
    return rule


def reads_pool_indices(fx_node: Any) -> bool:
    """Whether a ``max_pool*_with_indices`` node's indices (result 1) are used —
    other than by ``max_pool*_with_indices_backward``, whose rule finds the same
    first maxima itself."""
    def reader(user: Any) -> bool:
        if user.target is operator.getitem and user.args[1] == 0:
            return False
        if user.target is operator.getitem:
            return any("_with_indices_backward" not in str(u.target) for u in user.users)
        return True
    return "_backward" not in str(fx_node.target) and any(reader(u) for u in fx_node.users)


def _avg_pool(n: int) -> Rule:
    """``avg_pool{n}d`` -> ``avg_pool``."""
    def rule(b: Any, x: Any, kernel: Any, stride: Any = (), padding: Any = 0,
             ceil_mode: bool = False, count_include_pad: bool = True,
             divisor_override: Any = None) -> Any:
        if divisor_override is not None:
            raise AnfirError(f"avg_pool{n}d with divisor_override", b.loc)
        k = _ints(kernel, n)
        return b.call(conv.avg_pool, x, kernel=k, stride=_ints(stride, n) if stride else k,
                      padding=_ints(padding, n), ceil_mode=bool(ceil_mode),
                      count_include_pad=bool(count_include_pad))
    return rule


def _adaptive_avg_pool(n: int) -> Rule:
    """``_adaptive_avg_pool{n}d``: ``global_avg_pool`` for an output of ones, else
    ``avg_pool`` with kernel = stride = input / output when every static input
    size is a multiple of its output size (the windows then do not overlap and
    are what torch averages)."""
    def rule(b: Any, x: Any, output_size: Any) -> Any:
        out = _int_tuple(output_size, n)
        if all(o == 1 for o in out):
            return b.call(conv.global_avg_pool, x)
        sizes = b.fx_node.args[0].meta["val"].shape[-n:]
        if not all(isinstance(s, int) and s % o == 0 for s, o in zip(sizes, out)):
            raise AnfirError(f"adaptive average pooling from {tuple(sizes)} to {out} "
                             "(only sizes that divide evenly)", b.loc)
        k = tuple(int(s) // o for s, o in zip(sizes, out))
        return b.call(conv.avg_pool, x, kernel=k, stride=k)
    return rule


def _static_ints(b: Any, what: str, *values: Any) -> None:
    """Refuse symbolic (node) values where anfir wants static attributes."""
    if any(isinstance(v, Node) for v in values):
        raise AnfirError(f"{what} with a symbolic (data-dependent or dynamic) bound", b.loc)


_INT64_MAX = 2 ** 63 - 1


def _cat(b: Any, tensors: Any, dim: int = 0) -> Any:
    return b.call(shaping.concat, b.tuple_of(tensors), axis=int(dim))


def _slice(b: Any, x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    """``x[start:end:step]`` along ``dim``: anfir's ``slice`` (its ends are clamped
    to the axis, as torch's are); the whole axis is the identity.  A symbolic
    bound (``position_ids[:, :seq_len]`` with a dynamic ``seq_len``) is a
    ``gather`` of ``arange(start, min(end, size), step)``: same elements, and its
    gradient is the same scatter."""
    _static_ints(b, "slice's step", step)
    size = b.fx_node.args[0].meta["val"].shape[int(dim)]
    if isinstance(start, Node) or isinstance(end, Node):
        return _slice_symbolic(b, x, int(dim), start, end, int(step), size)
    start = 0 if start is None else int(start)
    end = _INT64_MAX if end is None else min(int(end), _INT64_MAX)
    if start == 0 and int(step) == 1 and isinstance(size, int) and end >= size:
        return b.call(structure.identity, x)
    return b.call(shaping.slice_, x, starts=start, ends=end, axes=int(dim), steps=int(step))


def _slice_symbolic(b: Any, x: Any, dim: int, start: Any, end: Any, step: int, size: Any) -> Any:
    """A slice whose start or end is a symbolic size (a node): non-negative bounds
    and a positive step (what torch.export's dynamic slices are), clamped to the
    axis as torch clamps them."""
    if step <= 0 or any(isinstance(v, int) and v < 0 for v in (start, end)):
        raise AnfirError("slice with a symbolic bound and a negative start, end or step", b.loc)
    length = b.importer.size_value(size, b)
    start = 0 if start is None else start
    end = length if end is None else b.call(arith.minimum, end, length)
    start = b.call(arith.minimum, start, end) if isinstance(start, Node) else start
    index = b.call(indexing.arange, start, end, step=step, dtype="i64")
    return b.call(indexing.gather, x, index, axis=dim)


def _split_with_sizes(b: Any, x: Any, sizes: Any, dim: int = 0) -> Any:
    _static_ints(b, "split_with_sizes", *sizes)
    return b.call(shaping.split, x, sizes=tuple(int(s) for s in sizes), axis=int(dim))


def _constant_pad_nd(b: Any, x: Any, pad: Any, value: Any = 0) -> Any:
    """torch's pads (last axis first, begin and end in turn; negative crops) as
    anfir's ``pad`` (every axis's begin, then every axis's end)."""
    _static_ints(b, "constant_pad_nd", *pad)
    rank = b.rank(b.fx_node.args[0])
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        begins[rank - 1 - i], ends[rank - 1 - i] = int(pad[2 * i]), int(pad[2 * i + 1])
    return b.call(shaping.pad, x, pads=tuple(begins + ends), value=value)


def _embedding(b: Any, weight: Any, indices: Any, padding_idx: int = -1,
               scale_grad_by_freq: bool = False, sparse: bool = False) -> Any:
    """``embedding`` -> ``gather(weight, indices)``.  torch gives the row
    ``padding_idx`` no gradient: that row is read through ``stop_gradient``."""
    import numpy as np

    if scale_grad_by_freq:
        raise AnfirError("embedding with scale_grad_by_freq (its gradient is scaled)", b.loc)
    if int(padding_idx) >= 0:
        rows = b.fx_node.args[0].meta["val"].shape[0]
        mask = np.zeros((int(rows), 1), dtype=bool)
        mask[int(padding_idx), 0] = True
        weight = b.call(tensor.where, _array_node(b, mask),
                        b.call(structure.stop_gradient, weight), weight)
    return b.call(indexing.gather, weight, indices, axis=0)


def _index_select(b: Any, x: Any, dim: int, index: Any) -> Any:
    return b.call(indexing.gather, x, index, axis=int(dim))


def _gather_elements(b: Any, x: Any, dim: int, index: Any, *, sparse_grad: bool = False) -> Any:
    return b.call(indexing.gather_elements, x, index, axis=int(dim))


def _index(b: Any, x: Any, indices: Any) -> Any:
    """``x[..., i, ..., j, ...]`` (``aten.index``): one integer index tensor is a
    ``gather`` along its axis; several (PyTorch broadcasts them together) are a
    ``gather_nd`` on x with the indexed axes moved to the front, its result's
    broadcast axes moved back to where the first indexed axis was when the
    indexed axes are adjacent (NumPy's and PyTorch's rule).  The gradient adds
    up at repeated indices, as PyTorch's ``index_put(accumulate=True)``.
    Boolean masks (a data-dependent shape) are refused."""
    torch = b.importer.torch
    fx_indices = b.fx_node.args[1]
    given = [i for i, v in enumerate(indices) if v is not None]
    if not given or any(fx_indices[i].meta["val"].dtype in (torch.bool, torch.uint8) for i in given):
        raise AnfirError("aten.index with a boolean mask (its result's shape depends on the data)",
                         b.loc)
    if len(given) == 1:
        return b.call(indexing.gather, x, indices[given[0]], axis=given[0])
    rank = b.rank(b.fx_node.args[0])
    rest = [a for a in range(rank) if a not in given]
    moved = b.call(tensor.transpose, x, b.tuple_of(given + rest)) if given != list(range(len(given))) else x
    shapes = [fx_indices[i].meta["val"].shape for i in given]
    common = torch.broadcast_shapes(*shapes)
    target = b.tuple_of(b.importer.size_value(d, b) for d in common)
    parts = [b.call(tensor.broadcast_to, b.call(tensor.cast, indices[i], "i64"), target)
             for i in given]
    out = b.call(indexing.gather_nd, moved, b.call(shaping.stack, b.tuple_of(parts), axis=-1))
    adjacent = given == list(range(given[0], given[-1] + 1))
    if adjacent and given[0] > 0:
        # result: (*common, *rest) -> rest[:given[0]], common, rest[given[0]:]
        nb, first = len(common), given[0]
        perm = (list(range(nb, nb + first)) + list(range(nb))
                + list(range(nb + first, nb + len(rest))))
        out = b.call(tensor.transpose, out, b.tuple_of(perm))
    return out


def _sdpa(b: Any, q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0,
          is_causal: bool = False, *, scale: Any = None, enable_gqa: bool = False) -> Any:
    """``scaled_dot_product_attention`` (kept whole, not decomposed) -> anfir's
    ``attention`` (same mask convention: a bool mask keeps, a float one adds;
    causal is top-left).  With ``enable_gqa`` each key/value head serves
    ``heads / kv_heads`` query heads: they are repeated with a ``gather`` along the
    head axis.  Dropout (training) is refused."""
    if float(dropout_p) != 0.0:
        raise AnfirError("scaled_dot_product_attention with dropout_p > 0 (training-mode dropout)",
                         b.loc)
    if enable_gqa:
        import numpy as np

        heads = b.fx_node.args[0].meta["val"].shape[-3]
        kv_heads = b.fx_node.args[1].meta["val"].shape[-3]
        if not (isinstance(heads, int) and isinstance(kv_heads, int)) or heads % kv_heads:
            raise AnfirError("grouped-query attention with dynamic or uneven head counts", b.loc)
        if heads != kv_heads:
            rows = _array_node(b, np.arange(heads, dtype=np.int64) // (heads // kv_heads))
            k = b.call(indexing.gather, k, rows, axis=-3)
            v = b.call(indexing.gather, v, rows, axis=-3)
    args = [q, k, v] if attn_mask is None else [q, k, v, attn_mask]
    return b.call(nn.attention, *args, scale=None if scale is None else float(scale),
                  causal=bool(is_causal))


def _linear(b: Any, x: Any, w: Any, bias: Any = None) -> Any:
    """``linear`` (kept whole): ``x @ w^T + bias``."""
    out = b.call(tensor.matmul, x, b.call(tensor.transpose, w))
    return out if bias is None else b.call(arith.add, out, bias)


def _layer_norm_whole(b: Any, x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None,
                      eps: float = 1e-5, cudnn_enable: bool = True) -> Any:
    """``layer_norm`` (kept whole): anfir's ``layer_norm`` primitive over the trailing
    ``normalized_shape`` axes (one kernel, its own gradient rule); a bias without a
    weight is the ``native_layer_norm`` composition."""
    if weight is None and bias is not None:
        return b.call(structure.tuple_getitem, _layer_norm(b, x, normalized_shape, weight, bias, eps), 0)
    args = [x] + [a for a in (weight, bias) if a is not None]
    return b.call(nn.layer_norm, *args, axis=-len(normalized_shape), eps=float(eps))


def _elu(b: Any, x: Any, alpha: Any = 1.0, scale: Any = 1.0, input_scale: Any = 1.0) -> Any:
    """``elu`` -> anfir's ``elu`` (its gradient at 0 is alpha's branch, as PyTorch's)."""
    if float(scale) != 1.0 or float(input_scale) != 1.0:
        raise AnfirError("elu with scale or input_scale other than 1", b.loc)
    return b.call(elementwise.elu, x, alpha=float(alpha))


def _arange(b: Any, start: Any, end: Any = None, step: Any = 1, **_: Any) -> Any:
    """``arange(end)`` / ``arange(start, end, step)``; a symbolic ``end`` is a node."""
    if end is None:
        start, end = 0, start
    _static_ints(b, "arange's step", step)
    return b.call(indexing.arange, start, end, step=step, dtype=b.out_dtype())


def _array_node(b: Any, value: Any) -> Any:
    """A small constant array as ``array(((...), ...))`` — the call the ANF text of
    an array literal parses to, so printed programs re-parse to the same graph.
    Built level by level, innermost first (no recursion)."""
    items: list[Any] = [bool(v) if value.dtype == bool else v.item() for v in value.reshape(-1)]
    for size in reversed(value.shape):
        items = [b.tuple_of(items[i:i + size]) for i in range(0, len(items), size)]
    return b.call(tensor.array, items[0])


def _select(b: Any, x: Any, dim: int, index: int) -> Any:
    """``x.select(dim, index)`` of a static-size axis: ``where`` keeps element
    ``index`` along ``dim`` (a constant bool mask; the others become exact
    zeros, so no inf/nan leaks) and ``sum`` drops the axis.  Exact, and its
    gradient reaches only the selected slice."""
    import numpy as np

    shape = b.fx_node.args[0].meta["val"].shape
    rank = len(shape)
    dim = int(dim) % rank
    size = shape[dim]
    if not isinstance(size, int):
        # A dynamic axis: a gather of the one (0-d) index, which drops the axis.
        return b.call(indexing.gather, x, b.call(tensor.cast, int(index), "i64"), axis=dim)
    mask_shape = [1] * rank
    mask_shape[dim] = size
    mask = np.zeros(mask_shape, dtype=bool)
    mask.reshape(-1)[int(index) % size] = True
    kept = b.call(tensor.where, _array_node(b, mask), x, b.call(tensor.cast, 0, b.out_dtype()))
    return b.call(tensor.sum_, kept, axis=dim)


def _pred(b: Any, pred: Any) -> Any:
    """A cond/while predicate as a bool: a 0-d bool tensor goes through ``all``."""
    fx_pred = b.fx_node.args[0]
    torch = b.importer.torch
    val = fx_pred.meta.get("val") if isinstance(fx_pred, torch.fx.Node) else None
    return b.call(reduce.all_, pred) if isinstance(val, torch.Tensor) else pred


def _cond(b: Any, pred: Any, true_gm: Any, false_gm: Any, operands: Any) -> Any:
    """``torch.cond`` -> ``switch(c, ✓g, ✗g)()``: branch graphs close over the operands."""
    c = _pred(b, pred)
    then_graph, _ = b.importer.subgraph(true_gm, "✓", list(operands), b.loc)
    else_graph, _ = b.importer.subgraph(false_gm, "✗", list(operands), b.loc)
    select = b.call(structure.switch, c, ValueNode(then_graph, b.loc), ValueNode(else_graph, b.loc))
    return CNode(b.graph, (select,), b.loc)


def _while_loop(b: Any, cond_gm: Any, body_gm: Any, carried: Any, additional: Any = ()) -> Any:
    """``while_loop`` -> a tail-recursive graph ``loop(c...) = if cond(c...) then
    loop(body(c...)) else (c...)``, closing over the additional inputs."""
    importer = b.importer
    cond_mod = cond_gm.value if isinstance(cond_gm, ValueNode) else cond_gm
    body_mod = body_gm.value if isinstance(body_gm, ValueNode) else body_gm
    carried, additional = list(carried), list(additional or ())
    loop = FuncGraph("while_loop", b.loc)
    params = [loop.add_parameter(f"carry{i}", b.loc) for i in range(len(carried))]
    inner = [*params, *[importer.as_node(a, b.loc) for a in additional]]

    def bind(gm: Any) -> dict[Any, Node]:
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        return dict(zip(phs, inner))
    out = importer.build_body(cond_mod.graph, loop, bind(cond_mod), cond_mod)
    pred = out[0] if isinstance(out, list) else out
    lb = type(b)(importer, loop, None, b.loc)
    fx_pred = next(n for n in cond_mod.graph.nodes if n.op == "output").args[0]
    fx_pred = fx_pred[0] if isinstance(fx_pred, (list, tuple)) else fx_pred
    if isinstance(fx_pred.meta.get("val"), importer.torch.Tensor):
        pred = lb.call(reduce.all_, pred)
    then_graph = FuncGraph("✓", b.loc)
    new = importer.build_body(body_mod.graph, then_graph, bind(body_mod), body_mod)
    then_graph.output = CNode(then_graph, [ValueNode(loop, b.loc),
                                           *[importer.as_node(v, b.loc) for v in new]], b.loc)
    else_graph = FuncGraph("✗", b.loc)
    else_graph.output = CNode(else_graph, [ValueNode(structure.make_tuple, b.loc), *params], b.loc)
    select = lb.call(structure.switch, pred, ValueNode(then_graph, b.loc), ValueNode(else_graph, b.loc))
    loop.output = CNode(loop, (select,), b.loc)
    return CNode(b.graph, [ValueNode(loop, b.loc), *[importer.as_node(c, b.loc) for c in carried]], b.loc)


def _map(b: Any, body_gm: Any, xs: Any, args: Any) -> Any:
    """``map(body, xs, *args)`` (``higher_order.map_impl``) over a static leading
    dimension: one body graph (its mapped inputs are parameters, ``args`` closed
    over) called on each slice, each of its results ``stack``ed along axis 0.
    A dynamic leading dimension is refused."""
    xs, args = list(xs), list(args)
    sizes = {arg.meta["val"].shape[0] for arg in b.fx_node.args[1]}
    size = sizes.pop() if len(sizes) == 1 else None
    if not isinstance(size, int):
        raise AnfirError("map over a dynamic (or unequal) leading dimension", b.loc)
    body, _ = b.importer.subgraph(body_gm, "map_body", args, b.loc, params=len(xs))
    body_mod = body_gm.value if isinstance(body_gm, ValueNode) else body_gm
    n_out = len(next(n for n in body_mod.graph.nodes if n.op == "output").args[0])
    calls = []
    for i in range(size):
        slices = [b.call(shaping.squeeze, b.call(shaping.slice_, x, starts=i, ends=i + 1, axes=0),
                         axis=0) for x in xs]
        calls.append(CNode(b.graph, [ValueNode(body, b.loc), *slices], b.loc))
    outs = [b.call(shaping.stack, b.tuple_of(b.call(structure.tuple_getitem, c, j) for c in calls))
            for j in range(n_out)]
    return b.call(structure.make_tuple, *outs)


def _sym_binary(prim: Primitive) -> Rule:
    return lambda b, x, y: b.call(prim, x, y)


def aten_table(torch: Any) -> dict[Any, Rule]:
    """The table for this torch: ``OpOverload`` (or Python operator, or
    higher-order op) -> rule."""
    aten = torch.ops.aten
    table: dict[Any, Rule] = {}

    def put(op: Any, rule: Rule) -> None:
        table[op] = rule

    for name, prim in (("abs", arith.abs_), ("neg", arith.neg), ("exp", arith.exp),
                       ("log", arith.log), ("sin", arith.sin), ("cos", arith.cos),
                       ("tanh", arith.tanh), ("sqrt", arith.sqrt), ("rsqrt", elementwise.rsqrt),
                       ("sigmoid", arith.sigmoid), ("relu", arith.relu), ("erf", elementwise.erf),
                       ("expm1", elementwise.expm1), ("log1p", elementwise.log1p),
                       ("floor", elementwise.floor), ("ceil", elementwise.ceil),
                       ("round", elementwise.round_), ("reciprocal", elementwise.reciprocal),
                       ("tan", elementwise.tan), ("atan", elementwise.atan),
                       ("sinh", elementwise.sinh), ("cosh", elementwise.cosh),
                       ("asin", elementwise.asin), ("acos", elementwise.acos),
                       ("sign", arith.sign), ("isnan", elementwise.isnan),
                       ("isinf", elementwise.isinf), ("logical_not", arith.logical_not),
                       ("bitwise_not", elementwise.bitwise_not), ("silu", elementwise.silu),
                       ("mish", elementwise.mish)):
        op = getattr(aten, name, None)
        if op is not None:
            put(op.default, _unary(prim))
    for op, prim in ((aten.maximum.default, arith.maximum), (aten.minimum.default, arith.minimum),
                     (aten.atan2.default, elementwise.atan2), (aten.fmod.Tensor, elementwise.fmod),
                     (aten.fmod.Scalar, elementwise.fmod), (aten.remainder.Tensor, elementwise.mod),
                     (aten.remainder.Scalar, elementwise.mod), (aten.mul.Tensor, arith.mul),
                     (aten.mul.Scalar, arith.mul), (aten.div.Tensor, arith.div), (aten.div.Scalar, arith.div),
                     (aten.pow.Tensor_Tensor, arith.pow_), (aten.pow.Tensor_Scalar, arith.pow_),
                     (aten.pow.Scalar, arith.pow_), (aten.logical_and.default, arith.logical_and),
                     (aten.logical_or.default, arith.logical_or), (aten.logical_xor.default, elementwise.logical_xor),
                     (aten.bitwise_and.Tensor, elementwise.bitwise_and), (aten.bitwise_or.Tensor, elementwise.bitwise_or),
                     (aten.bitwise_xor.Tensor, elementwise.bitwise_xor), (aten.mm.default, tensor.matmul),
                     (aten.bmm.default, tensor.matmul), (aten.matmul.default, tensor.matmul)):
        put(op, _binary(prim))
    for cmp, prim in (("eq", arith.eq), ("ne", arith.ne), ("lt", arith.lt), ("le", arith.le),
                      ("gt", arith.gt), ("ge", arith.ge)):
        put(getattr(aten, cmp).Tensor, _binary(prim))
        put(getattr(aten, cmp).Scalar, _binary(prim))
    put(aten.add.Tensor, _add(arith.add))
    put(aten.add.Scalar, _add(arith.add))
    put(aten.sub.Tensor, _add(arith.sub))
    put(aten.sub.Scalar, _add(arith.sub))
    put(aten.rsub.Scalar, lambda b, x, y, alpha=1: _add(arith.sub)(b, y, x, alpha))
    put(aten.div.Tensor_mode, _div_mode)
    put(aten.where.self, lambda b, c, x, y: b.call(tensor.where, c, x, y))
    put(aten.clamp.default, _clamp)
    put(aten.hardtanh.default, _hardtanh)
    put(aten.hardsigmoid.default, _hardsigmoid)
    put(aten.hardswish.default, _unary(elementwise.hard_swish))
    put(aten.elu.default, _elu)
    put(aten.max.dim, _extreme_dim(reduce.argmax))
    put(aten.min.dim, _extreme_dim(reduce.argmin))
    put(aten.max.default, _reduction(reduce.max_))
    put(aten.min.default, _reduction(reduce.min_))
    put(aten.topk.default, _topk)
    put(aten.sort.default, _sort)
    put(aten.sort.stable, _sort_stable)
    put(aten.scaled_dot_product_attention.default, _sdpa)
    put(aten.linear.default, _linear)
    put(aten.layer_norm.default, _layer_norm_whole)
    put(aten.gelu.default, _gelu)
    put(aten.leaky_relu.default, _leaky_relu)
    put(aten._to_copy.default, _to_copy)
    for op in (aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default,
               aten.contiguous.default):
        put(op, _identity)
    put(aten.detach.default, lambda b, x: b.call(structure.stop_gradient, x))
    put(aten.permute.default, _permute)
    put(aten.transpose.int, _transpose_int)
    put(aten.t.default, _t)
    for op in (aten.view.default, aten._unsafe_view.default, aten.reshape.default,
               aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.unsqueeze.default,
               aten.flatten.using_ints):
        put(op, _reshape_to_result)
    put(aten.expand.default, _expand)
    put(aten.select.int, _select)
    put(aten.addmm.default, _addmm)
    put(aten.sum.dim_IntList, _reduction(tensor.sum_))
    put(aten.sum.default, lambda b, x, dtype=None: _reduction(tensor.sum_)(b, x, None, dtype=dtype))
    put(aten.mean.dim, _reduction(tensor.mean))
    put(aten.mean.default, lambda b, x, dtype=None: _reduction(tensor.mean)(b, x, None, dtype=dtype))
    put(aten.amax.default, _reduction(reduce.max_))
    put(aten.amin.default, _reduction(reduce.min_))
    put(aten.prod.default, lambda b, x, dtype=None: _reduction(reduce.prod)(b, x, None, dtype=dtype))
    put(aten.prod.dim_int, _reduction(reduce.prod))
    for name, prim in (("any", reduce.any_), ("all", reduce.all_)):
        op = getattr(aten, name)
        put(op.default, _reduction(prim))
        put(op.dim, _reduction(prim))
        put(op.dims, _reduction(prim))
    put(aten.var.correction, _var)
    put(aten.argmax.default, _argext(reduce.argmax))
    put(aten.argmin.default, _argext(reduce.argmin))
    put(aten.cumsum.default, _cumsum)
    put(aten.full.default, _full)
    put(aten.full_like.default, _full_like)
    put(aten.zeros_like.default, _like(0.0))
    put(aten.ones_like.default, _like(1.0))
    put(aten.scalar_tensor.default, _scalar_tensor)
    put(aten._softmax.default, _softmax)
    put(aten._log_softmax.default, _log_softmax)
    put(aten.native_layer_norm.default, _layer_norm)
    put(aten._native_batch_norm_legit_no_training.default, _batch_norm_eval)
    put(aten.convolution.default, _convolution)
    for n in (1, 2, 3):
        for name, rule in ((f"max_pool{n}d_with_indices", _max_pool_with_indices(n)),
                           (f"avg_pool{n}d", _avg_pool(n)),
                           (f"_adaptive_avg_pool{n}d", _adaptive_avg_pool(n))):
            op = getattr(aten, name, None)
            if op is not None:
                put(op.default, rule)
    put(aten.cat.default, _cat)
    put(aten.slice.Tensor, _slice)
    put(aten.split_with_sizes.default, _split_with_sizes)
    put(aten.constant_pad_nd.default, _constant_pad_nd)
    put(aten.embedding.default, _embedding)
    put(aten.index_select.default, _index_select)
    put(aten.gather.default, _gather_elements)
    put(aten.index.Tensor, _index)
    for op in (aten.arange.default, aten.arange.start, aten.arange.start_step):
        put(op, _arange)
    put(aten.sym_size.int, _sym_size)
    put(operator.getitem, _getitem)
    for py_op, prim in ((operator.add, arith.add), (operator.sub, arith.sub), (operator.mul, arith.mul),
                        (operator.floordiv, elementwise.floor_div), (operator.mod, elementwise.mod),
                        (operator.truediv, arith.div), (operator.eq, arith.eq), (operator.ne, arith.ne),
                        (operator.lt, arith.lt), (operator.le, arith.le), (operator.gt, arith.gt),
                        (operator.ge, arith.ge)):
        put(py_op, _sym_binary(prim))
    for op in (aten._assert_scalar.default, aten.sym_constrain_range_for_size.default,
               aten._assert_tensor_metadata.default):
        put(op, _no_value)
    put(torch.ops.higher_order.cond, _cond)
    put(torch.ops.higher_order.while_loop, _while_loop)
    put(torch.ops.higher_order.map_impl, _map)
    return table


__all__ = ["aten_table", "reads_pool_indices"]

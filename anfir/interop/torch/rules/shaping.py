"""The torch.export rules whose result is built from
:mod:`anfir.primitives.shaping`: cat, slice, split and unbind, pads
(constant, reflect, edge), flip, repeat, diff.

See :mod:`anfir.interop.torch.rules.common` for the rule protocol.
"""

from __future__ import annotations

from typing import Any

from anfir.errors import AnfirError
from anfir.interop.torch.rules.common import Rule, RuleTable, out_value, arg_shape, require_static
from anfir.ir.nodes import Node
from anfir.primitives import arith, elementwise, indexing, shaping, structure, tensor


_INT64_MAX = 2 ** 63 - 1


def _cat(b: Any, tensors: Any, dim: int = 0) -> Any:
    return b.call(shaping.concat, b.tuple_of(tensors), axis=int(dim))


def _slice(b: Any, x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    """``x[start:end:step]`` along ``dim``: anfir's ``slice`` (its ends are clamped
    to the axis, as torch's are); the whole axis is the identity.  A symbolic
    bound (``position_ids[:, :seq_len]`` with a dynamic ``seq_len``) is a
    ``gather`` of ``arange(start, min(end, size), step)``: same elements, and its
    gradient is the same scatter."""
    require_static(b, "slice's step", step)
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
    require_static(b, "split_with_sizes", *sizes)
    return b.call(shaping.split, x, sizes=tuple(int(s) for s in sizes), axis=int(dim))


def _constant_pad_nd(b: Any, x: Any, pad: Any, value: Any = 0) -> Any:
    """torch's pads (last axis first, begin and end in turn; negative crops) as
    anfir's ``pad`` (every axis's begin, then every axis's end)."""
    require_static(b, "constant_pad_nd", *pad)
    rank = b.rank(b.fx_node.args[0])
    begins, ends = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        begins[rank - 1 - i], ends[rank - 1 - i] = int(pad[2 * i]), int(pad[2 * i + 1])
    return b.call(shaping.pad, x, pads=tuple(begins + ends), value=value)


# -- shapes, joins, copies ----------------------------------------------------------------------
def _flip(b: Any, x: Any, dims: Any) -> Any:
    axes = tuple(int(d) for d in dims)
    if not axes:
        return b.call(structure.identity, x)
    return b.call(shaping.flip, x, axis=axes)


def _repeat(b: Any, x: Any, repeats: Any) -> Any:
    """``repeat`` -> ``tile`` (extra leading repeats add leading axes first)."""
    require_static(b, "repeat", *repeats)
    reps = tuple(int(r) for r in repeats)
    rank = len(arg_shape(b))
    if len(reps) > rank:
        x = b.call(tensor.reshape, x, b.tuple_of((1,) * (len(reps) - rank)
                                                   + tuple(b.importer.size_value(d, b) for d in arg_shape(b))))
    return b.call(shaping.tile, x, reps=reps)


# -- padding and resampling ----------------------------------------------------------------------
def _mode_pad(mode: str, n: int) -> Rule:
    """``reflection_pad{n}d`` / ``replication_pad{n}d`` -> ``pad`` in ONNX's
    ``reflect`` / ``edge`` modes (PyTorch's pads: last axis first, begin and end)."""
    def rule(b: Any, x: Any, padding: Any) -> Any:
        require_static(b, f"{mode} padding", *padding)
        rank = len(arg_shape(b))
        begins, ends = [0] * rank, [0] * rank
        for i in range(len(padding) // 2):
            begins[rank - 1 - i], ends[rank - 1 - i] = int(padding[2 * i]), int(padding[2 * i + 1])
        return b.call(shaping.pad, x, pads=tuple(begins + ends), mode=mode)
    return rule


def _pad_op(b: Any, x: Any, pad: Any, mode: str = "constant", value: Any = None) -> Any:
    if mode == "constant":
        return _constant_pad_nd(b, x, pad, 0 if value is None else value)
    modes = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}
    if mode not in modes:
        raise AnfirError(f"pad with mode {mode!r}", b.loc)
    return _mode_pad(modes[mode], len(pad) // 2)(b, x, pad)


def _split_op(b: Any, x: Any, split_size: Any, dim: int = 0) -> Any:
    """``split`` into pieces of ``split_size`` (the last smaller): their sizes are the
    results' (static) sizes."""
    axis = int(dim)
    sizes = [piece.shape[axis] for piece in out_value(b)]
    if not all(isinstance(s, int) for s in sizes):
        raise AnfirError("split into pieces of a dynamic size", b.loc)
    return b.call(shaping.split, x, sizes=tuple(int(s) for s in sizes), axis=axis)


def _unbind_op(b: Any, x: Any, dim: int = 0) -> Any:
    axis = int(dim)
    n = arg_shape(b)[axis]
    if not isinstance(n, int):
        raise AnfirError("unbind along a dynamic axis", b.loc)
    pieces = b.call(shaping.split, x, sizes=(1,) * n, axis=axis)
    return b.call(structure.make_tuple, *(b.call(shaping.squeeze, b.call(structure.tuple_getitem, pieces, i),
                                                axis=axis) for i in range(n)))


def _diff_op(b: Any, x: Any, n: int = 1, dim: int = -1, prepend: Any = None, append: Any = None) -> Any:
    """``diff``: ``x[1:] - x[:-1]`` along ``dim``, ``n`` times (after prepend/append)."""
    axis = int(dim)
    parts = [p for p in (prepend, x, append) if p is not None]
    if len(parts) > 1:
        x = b.call(shaping.concat, b.tuple_of(parts), axis=axis)
    bool_input = arg_shape(b) is not None and b.fx_node.args[0].meta["val"].dtype == b.importer.torch.bool
    for _ in range(int(n)):
        hi = b.call(shaping.slice_, x, starts=1, ends=2 ** 63 - 1, axes=axis)
        lo = b.call(shaping.slice_, x, starts=0, ends=-1, axes=axis)
        x = b.call(elementwise.logical_xor, hi, lo) if bool_input else b.call(arith.sub, hi, lo)
    return x


def rules(torch: Any, table: RuleTable) -> None:
    """Add this family's rules to ``table``."""
    aten = torch.ops.aten
    put, named = table.put, table.named
    put(aten.cat.default, _cat)
    put(aten.slice.Tensor, _slice)
    put(aten.split_with_sizes.default, _split_with_sizes)
    put(aten.constant_pad_nd.default, _constant_pad_nd)
    named("pad", "default", _pad_op)
    named("split", "Tensor", _split_op)
    named("unbind", "int", _unbind_op)
    named("diff", "default", _diff_op)
    named("flip", "default", _flip)
    named("repeat", "default", _repeat)
    for n in (1, 2, 3):
        named(f"reflection_pad{n}d", "default", _mode_pad("reflect", n))
        named(f"replication_pad{n}d", "default", _mode_pad("edge", n))

"""``out=`` kernels for convolution, pooling and batch norm, on a shared scratch workspace.

The op library's own kernels (anfir/primitives/conv.py) return new arrays;
these write the instruction's output view and allocate nothing when they run.
What they need besides their operands — the zero-padded input, the im2col
matrix, a gradient's padded accumulator — lives in the executor's
:class:`Workspace`: one buffer per *slot*, shared by every instruction (they
run one at a time, and no kernel keeps anything in the workspace between two
calls), sized to the largest request when the program is bound.

Each factory binds once, returning None where its fast path does not apply
(groups other than 1, a negative padding, mixed or integer dtypes...): the
instruction then runs the primitive's evaluation, as every rule's may.  The
arithmetic is that of the evaluation, term by term where it can be (batch
norm, pooling's maxima and sums, the channel sums), and the same products
summed in another order for the convolutions' matmuls (a few ulps apart).

The parameters (padding, output sizes, ceil mode, the divisor of an average)
come from the primitives' own ``conv_params``, ``pool_params`` and
``avg_divisor``, so both levels read the attributes alike.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, Callable, Optional

import numpy as np
from numpy.lib.stride_tricks import as_strided

from anfir.primitives import conv as _conv

Kernel = Callable[[], Any]


class Workspace:
    """Scratch memory of one executor: a growing buffer per slot number."""

    def __init__(self, limit: int = 1 << 62) -> None:
        """No memory until a kernel asks; never more than ``limit`` bytes in all."""
        self.limit = limit
        self.slots: dict[int, np.ndarray] = {}
        self.grown = False
        """Set when a request needed a bigger buffer (kernels bound before hold the smaller one)."""

    def array(self, slot: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """A C-contiguous array of ``shape`` at the start of ``slot``'s buffer."""
        nbytes = max(math.prod(shape) * dtype.itemsize, 1)
        buffer = self.slots.get(slot)
        if buffer is None or buffer.nbytes < nbytes:
            total = self.nbytes - (buffer.nbytes if buffer is not None else 0) + nbytes
            if total > self.limit:  # (the executor turns it into an error at the instruction)
                raise MemoryError(f"the scratch workspace would take {total} bytes, beyond the "
                                  f"executor's limit ({self.limit} bytes left)")
            buffer = np.empty(nbytes, dtype=np.uint8)
            self.slots[slot] = buffer
            self.grown = True
        return buffer[:math.prod(shape) * dtype.itemsize].view(dtype).reshape(shape)

    @property
    def nbytes(self) -> int:
        """The bytes the workspace holds."""
        return sum(b.nbytes for b in self.slots.values())


class RegionWorkspace(Workspace):
    """The scratch memory of one instruction: its ``@scratch`` buffer of the arena.

    Slots are placed one after the other in the order the kernel asks for them
    (each at a multiple of 64 bytes); a slot asked for again gets the same
    place if it fits.  :class:`ScratchMeasure` places them the same way
    without memory, so the lowering sizes the buffer to exactly what binding
    the kernel takes."""

    def __init__(self, region: Optional[np.ndarray]) -> None:
        """Slots carved out of ``region`` (a uint8 array)."""
        super().__init__(region.nbytes if region is not None else 1 << 62)
        self.region = region
        self.used = 0
        self.places: dict[int, tuple[int, int]] = {}

    def place(self, slot: int, nbytes: int) -> int:
        """The byte offset of ``slot`` for a request of ``nbytes``."""
        nbytes = max(nbytes, 1)
        known = self.places.get(slot)
        if known is not None and known[1] >= nbytes:
            return known[0]
        start = -(-self.used // 64) * 64
        self.used = start + nbytes
        if self.used > self.limit:
            raise MemoryError(f"the kernel asks for {self.used} bytes of scratch, more than the "
                              f"{self.limit} of its @scratch buffer")
        self.places[slot] = (start, nbytes)
        return start

    def array(self, slot: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """A C-contiguous array of ``shape`` in the region."""
        nbytes = math.prod(shape) * dtype.itemsize
        start = self.place(slot, nbytes)
        assert self.region is not None
        return self.region[start:start + nbytes].view(dtype).reshape(shape)

    @property
    def nbytes(self) -> int:
        """The bytes placed so far."""
        return self.used


class ScratchMeasure(RegionWorkspace):
    """A :class:`RegionWorkspace` that only measures: each array is new memory."""

    def __init__(self) -> None:
        """Nothing placed yet."""
        super().__init__(None)

    def array(self, slot: int, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
        """A new array of ``shape`` (its place counted)."""
        self.place(slot, math.prod(shape) * dtype.itemsize)
        return np.empty(shape, dtype)


ScratchFactory = Callable[[np.ndarray, list[Any], dict[str, Any], Workspace], Optional[Kernel]]
"""``factory(out, args, statics, workspace)``: a kernel factory that may use scratch memory."""


def _same_floats(out: np.ndarray, arrays: list[Any]) -> bool:
    """Every argument an array of the output's floating-point dtype."""
    return out.dtype.kind == "f" and all(
        isinstance(a, np.ndarray) and a.dtype == out.dtype for a in arrays)


def _windows(xp: np.ndarray, kernel: tuple[int, ...], stride: tuple[int, ...],
             dilation: tuple[int, ...], sizes: tuple[int, ...], kernel_first: bool) -> np.ndarray:
    """The view of xp's windows, ``[n, c, k..., p...]`` (or ``[n, c, p..., k...]``) =
    ``xp[n, c, p * stride + k * dilation]``; every index stays inside xp by the output-size rule."""
    spatial = xp.strides[2:]
    ks = tuple(d * s for d, s in zip(dilation, spatial))
    ps = tuple(st * s for st, s in zip(stride, spatial))
    if kernel_first:
        return as_strided(xp, (*xp.shape[:2], *kernel, *sizes), (*xp.strides[:2], *ks, *ps),
                          writeable=False)
    return as_strided(xp, (*xp.shape[:2], *sizes, *kernel), (*xp.strides[:2], *ps, *ks), writeable=False)


def _offset_views(xp: np.ndarray, kernel: tuple[int, ...], stride: tuple[int, ...],
                  dilation: tuple[int, ...], sizes: tuple[int, ...]) -> list[np.ndarray]:
    """For each kernel offset (C order), the strided view ``xp[:, :, k * dilation + p * stride]``
    over the output positions p: what that offset of every window reads (or receives)."""
    views = []
    for offset in np.ndindex(*kernel):
        index = tuple(slice(k * d, k * d + (m - 1) * s + 1, s)
                      for k, d, m, s in zip(offset, dilation, sizes, stride))
        views.append(xp[(slice(None), slice(None)) + index])
    return views


SPREAD_SLOT = 9
"""The workspace slot of :class:`_Spread` (no kernel uses it for anything else)."""


class _Spread:
    """A vector (or any array) broadcast to the output's shape in scratch, written at each
    call: a ufunc that broadcasts an operand over inner axes would allocate numpy's
    iteration buffer (up to 64 KiB) at every call; ``copyto`` broadcasts without one."""

    def __init__(self, source: np.ndarray, out: np.ndarray, ws: Workspace, channels: bool = True) -> None:
        self.source = source.reshape((-1,) + (1,) * (out.ndim - 2)) if channels else source
        self.array = ws.array(SPREAD_SLOT, out.shape, out.dtype)

    def write(self) -> np.ndarray:
        np.copyto(self.array, self.source)
        return self.array


class _Padded:
    """An input copied into the middle of a scratch array whose border holds ``fill``
    (written at each call: other instructions use the same scratch)."""

    def __init__(self, x: np.ndarray, pads: list[int], fill: float, slot: int, ws: Workspace) -> None:
        n = x.ndim - 2
        self.x = x
        self.fill = fill
        if not any(pads):
            self.array = x
            self.interior: Optional[np.ndarray] = None
            self.borders: list[np.ndarray] = []
            return
        shape = (*x.shape[:2], *(s + pads[a] + pads[n + a] for a, s in enumerate(x.shape[2:])))
        self.array = ws.array(slot, shape, x.dtype)
        self.interior = self.array[(slice(None), slice(None)) + tuple(
            slice(pads[a], pads[a] + s) for a, s in enumerate(x.shape[2:]))]
        self.borders = []
        for a in range(n):  # the slabs before and after the interior along each axis
            before = [slice(None)] * (n + 2)
            after = [slice(None)] * (n + 2)
            before[2 + a] = slice(0, pads[a])
            after[2 + a] = slice(pads[a] + x.shape[2 + a], None)
            self.borders += [self.array[tuple(before)], self.array[tuple(after)]]

    def write(self) -> None:
        """Fill the border and copy the input in."""
        for border in self.borders:
            border.fill(self.fill)
        if self.interior is not None:
            np.copyto(self.interior, self.x)


def _conv_setup(x: np.ndarray, w: np.ndarray, statics: dict[str, Any]
                ) -> Optional[tuple[int, tuple[int, ...], list[int], tuple[int, ...]]]:
    """(n, stride, pads, dilation) of a conv whose fast path applies (groups 1, no cropping)."""
    n, stride, given, dilation, groups = _conv.conv_params(
        x, w, statics.get("stride", 1), statics.get("padding", 0), statics.get("dilation", 1),
        statics.get("groups", 1), "conv")
    pads = [int(p) for p in given]
    if groups != 1 or min(pads) < 0:
        return None
    return n, tuple(stride), pads, tuple(dilation)


def _out_sizes(spatial: tuple[int, ...], kernel: tuple[int, ...], stride: tuple[int, ...],
               pads: list[int], dilation: tuple[int, ...]) -> tuple[int, ...]:
    n = len(kernel)
    return tuple((s + pads[a] + pads[n + a] - dilation[a] * (kernel[a] - 1) - 1) // stride[a] + 1
                 for a, s in enumerate(spatial))


def conv_kernel(out: np.ndarray, args: list[Any], statics: dict[str, Any], ws: Workspace) -> Optional[Kernel]:
    """``conv(x, w[, b])`` and ``conv_core(x, w)``: im2col into scratch, one batched matmul
    writing the output, the bias added in place."""
    if len(args) not in (2, 3) or not _same_floats(out, args):
        return None
    x, w = args[0], args[1]
    setup = _conv_setup(x, w, statics)
    if setup is None:
        return None
    n, stride, pads, dilation = setup
    kernel = w.shape[2:]
    sizes = _out_sizes(x.shape[2:], kernel, stride, pads, dilation)
    if out.shape != (x.shape[0], w.shape[0], *sizes):
        return None
    padded = _Padded(x, pads, 0.0, 0, ws)
    windows = _windows(padded.array, kernel, stride, dilation, sizes, kernel_first=True)
    depth, positions = math.prod(windows.shape[1:2 + n]), math.prod(sizes)
    batch = x.shape[0]
    step = batch_chunk(batch, depth * positions * out.itemsize, out.nbytes)
    w2 = w.reshape(w.shape[0], depth)
    out3 = out.reshape(out.shape[0], out.shape[1], positions)
    bias = _Spread(args[2], out, ws) if len(args) == 3 else None
    rows = _row_chunk(step, sizes, depth * out.itemsize, out.nbytes)
    chunks: list[tuple[Any, ...]]
    if rows is None:
        cols = ws.array(1, (step, *windows.shape[1:]), out.dtype)
        cols3 = cols.reshape(step, depth, positions)
        # (views made once: a run only calls numpy on them)
        chunks = [(cols[:min(step, batch - i)], windows[i:i + step], cols3[:min(step, batch - i)],
                   out3[i:i + step], None, None) for i in range(0, batch, step)]
    else:
        # Not even one sample's matrix fits: a block of output rows of one sample at a time,
        # its product written to scratch and copied into the output's rows.
        rest = math.prod(sizes[1:])
        flat = ws.array(1, (depth * rows * rest,), out.dtype)
        product = ws.array(4, (w.shape[0] * rows * rest,), out.dtype)
        chunks = []  # (the annotation above: the two kinds of chunk)
        for i in range(batch):
            for r0 in range(0, sizes[0], rows):
                r = min(rows, sizes[0] - r0)
                block = windows[i][(slice(None),) * (1 + n) + (slice(r0, r0 + r),)]
                c = flat[:depth * r * rest]
                p = product[:w.shape[0] * r * rest]
                chunks.append((c.reshape(block.shape), block, c.reshape(depth, r * rest),
                               p.reshape(w.shape[0], r * rest), p.reshape(w.shape[0], r, *sizes[1:]),
                               out[i][:, r0:r0 + r]))

    def run() -> None:
        padded.write()
        for c, win, c3, o3, made, target in chunks:
            np.copyto(c, win)
            np.matmul(w2, c3, out=o3)
            if target is not None:
                np.copyto(target, made)
        if bias is not None:
            np.add(out, bias.write(), out=out)

    return run


class _Scatter:
    """The adjoint of reading windows: values at each kernel offset added into a (padded)
    accumulator, whose middle is then the result."""

    def __init__(self, out: np.ndarray, pads: list[int], kernel: tuple[int, ...], stride: tuple[int, ...],
                 dilation: tuple[int, ...], sizes: tuple[int, ...], ws: Workspace, slot: int = 0) -> None:
        n = out.ndim - 2
        self.out = out
        if any(pads):
            shape = (*out.shape[:2], *(s + pads[a] + pads[n + a] for a, s in enumerate(out.shape[2:])))
            self.acc = ws.array(slot, shape, out.dtype)
            self.middle: Optional[np.ndarray] = self.acc[(slice(None), slice(None)) + tuple(
                slice(pads[a], pads[a] + s) for a, s in enumerate(out.shape[2:]))]
        else:
            self.acc, self.middle = out, None
        self.targets = _offset_views(self.acc, kernel, stride, dilation, sizes)
        self.part = ws.array(6, (*out.shape[:2], *sizes), out.dtype)

    def start(self) -> None:
        self.acc.fill(0)

    def add(self, k: int, source: np.ndarray) -> None:
        """Add source (contiguous) at kernel offset k.  Through a contiguous copy of the
        strided target: a ufunc on strided operands allocates numpy's iteration buffer;
        ``copyto`` does not."""
        target, part = self.targets[k], self.part
        np.copyto(part, target)
        np.add(part, source, out=part)
        np.copyto(target, part)

    def finish(self) -> None:
        if self.middle is not None:
            np.copyto(self.out, self.middle)


def conv_input_grad_kernel(out: np.ndarray, args: list[Any], statics: dict[str, Any],
                           ws: Workspace) -> Optional[Kernel]:
    """``conv_input_grad(dout, w, x)`` (x read for its type): the columns ``w.T @ dout``,
    each kernel offset's added back where it was read (col2im)."""
    if len(args) != 2 or not _same_floats(out, args):
        return None
    dout, w = args
    x = np.broadcast_to(np.zeros((), out.dtype), out.shape)  # x's type: what conv_params reads
    setup = _conv_setup(x, w, statics)
    if setup is None:
        return None
    _, stride, pads, dilation = setup
    kernel = w.shape[2:]
    sizes = _out_sizes(out.shape[2:], kernel, stride, pads, dilation)
    if dout.shape != (out.shape[0], w.shape[0], *sizes) or w.shape[1] != out.shape[1]:
        return None
    count, positions = math.prod(kernel), math.prod(sizes)
    batch, channels, filters = out.shape[0], out.shape[1], w.shape[0]
    # each kernel offset's weight as (C, O), copied at each run (the weights change between
    # runs), one offset at a time: the whole transposed weight would be the largest scratch
    # of a deep network's last layers
    weight = ws.array(1, (channels, filters), out.dtype)
    source = w.reshape(filters, channels, count).transpose(2, 1, 0)
    column = ws.array(2, (batch, channels, positions), out.dtype)
    dout3 = dout.reshape(batch, filters, positions)
    scatter = _Scatter(out, pads, kernel, stride, dilation, sizes, ws)
    part = column.reshape(batch, channels, *sizes)

    sources = [source[k] for k in range(count)]

    def run() -> None:
        scatter.start()
        for k in range(count):  # kernel offset k's column, w[:, :, k].T @ dout, added where it was read
            np.copyto(weight, sources[k])
            np.matmul(weight, dout3, out=column)
            scatter.add(k, part)
        scatter.finish()

    return run


def conv_weight_grad_kernel(out: np.ndarray, args: list[Any], statics: dict[str, Any],
                            ws: Workspace) -> Optional[Kernel]:
    """``conv_weight_grad(x, dout, w)`` (w read for its type): ``dout`` as (O, N·P) times the
    input's windows as (N·P, C·K), one matmul writing the output."""
    if len(args) != 2 or not _same_floats(out, args):
        return None
    x, dout = args
    w = np.broadcast_to(np.zeros((), out.dtype), out.shape)
    setup = _conv_setup(x, w, statics)
    if setup is None:
        return None
    n, stride, pads, dilation = setup
    kernel = out.shape[2:]
    sizes = _out_sizes(x.shape[2:], kernel, stride, pads, dilation)
    if dout.shape != (x.shape[0], out.shape[0], *sizes) or out.shape[1] != x.shape[1]:
        return None
    batch, depth, positions = x.shape[0], x.shape[1] * math.prod(kernel), math.prod(sizes)
    padded = _Padded(x, pads, 0.0, 0, ws)
    windows = _windows(padded.array, kernel, stride, dilation, sizes, kernel_first=True)
    # A chunk of the batch at a time (the windows of the whole batch would be the largest
    # scratch of all): its windows as (C, K..., n, P...), the batch next to the positions.
    bound = max(dout.nbytes, out.nbytes)
    step = batch_chunk(batch, depth * positions * out.itemsize, bound)
    order = (1, *range(2, 2 + n), 0, *range(2 + n, 2 + 2 * n))
    shape = tuple(windows.shape[i] for i in order)
    dout_t = dout.reshape(batch, out.shape[0], positions).transpose(1, 0, 2)
    out2 = out.reshape(out.shape[0], depth)
    rows = _row_chunk(step, sizes, depth * out.itemsize, bound)
    partial = ws.array(3, out2.shape, out.dtype) if step < batch or rows is not None else out2
    chunks = []
    if rows is None:
        cols = ws.array(1, (*shape[:1 + n], step, *shape[2 + n:]), out.dtype)
        grads = ws.array(2, (out.shape[0], step, positions), out.dtype)
        for i in range(0, batch, step):
            m = min(step, batch - i)
            c = cols[(slice(None),) * (1 + n) + (slice(0, m),)]
            g = grads[:, :m]
            chunks.append((c, windows[i:i + m].transpose(order), g, dout_t[:, i:i + m],
                           g.reshape(out.shape[0], m * positions), c.reshape(depth, m * positions).T,
                           out2 if i == 0 else partial))
    else:
        # Not even one sample's windows fit: a block of output rows of one sample at a time.
        rest = math.prod(sizes[1:])
        flat = ws.array(1, (depth * rows * rest,), out.dtype)
        gflat = ws.array(2, (out.shape[0] * rows * rest,), out.dtype)
        for i in range(batch):
            for r0 in range(0, sizes[0], rows):
                r = min(rows, sizes[0] - r0)
                block = windows[i][(slice(None),) * (1 + n) + (slice(r0, r0 + r),)]
                c = flat[:depth * r * rest]
                g = gflat[:out.shape[0] * r * rest]
                chunks.append((c.reshape(block.shape), block, g.reshape(out.shape[0], r, *sizes[1:]),
                               dout[i][:, r0:r0 + r], g.reshape(out.shape[0], r * rest),
                               c.reshape(depth, r * rest).T,
                               out2 if not chunks else partial))

    def run() -> None:
        padded.write()
        for c, source, g, d, lhs, rhs, target in chunks:
            np.copyto(c, source)
            np.copyto(g, d)
            np.matmul(lhs, rhs, out=target)
            if target is not out2:
                np.add(out2, target, out=out2)

    return run


def batch_chunk(batch: int, per_sample: int, bound: int) -> int:
    """How many samples a convolution kernel's window matrix holds at a time: as many
    as fit in ``bound`` bytes (the size of an operand, which the arena holds anyway),
    at least one.  The matrix is the largest scratch of a convolutional network
    (K times its input); a chunk of the batch keeps it about an activation's size,
    which the planned arena can afford, for a few more (still large) matmuls."""
    return max(1, min(batch, bound // max(per_sample, 1)))


def _row_chunk(step: int, sizes: tuple[int, ...], per_position: int, bound: int) -> Optional[int]:
    """When a convolution's window matrix exceeds ``bound`` bytes for a single sample
    (``step`` is 1): how many rows of output positions it holds at a time (None: whole
    samples fit, or there is only one row)."""
    positions = math.prod(sizes)
    if step > 1 or not sizes or sizes[0] < 2 or per_position * positions <= bound:
        return None
    per_row = per_position * (positions // sizes[0])
    return max(1, min(sizes[0], bound // max(per_row, 1)))


def _pool_setup(x: np.ndarray, statics: dict[str, Any], dilated: bool, what: str
                ) -> tuple[int, tuple[int, ...], tuple[int, ...], list[int], tuple[int, ...], tuple[int, ...]]:
    n, kernel, stride, pads, dilation, sizes = _conv.pool_params(
        x, statics.get("kernel"), statics.get("stride"), statics.get("padding", 0),
        statics.get("dilation", 1) if dilated else 1, statics.get("ceil_mode", False), what)
    return n, tuple(kernel), tuple(stride), [int(p) for p in pads], tuple(dilation), tuple(sizes)


def max_pool_kernel(out: np.ndarray, args: list[Any], statics: dict[str, Any],
                    ws: Workspace) -> Optional[Kernel]:
    """``max_pool(x)``: the running maximum over the kernel offsets, each offset's cells
    copied into contiguous scratch first (a ufunc on a strided operand would buffer).
    Padding is -inf: it never wins; a NaN wins, as in ``np.max``.  A chunk of the batch
    at a time, as :func:`max_pool_grad_kernel` (recomputed in a backward pass, a pool's
    scratch of the whole padded batch would add to the backward pass's peak)."""
    if len(args) != 1 or not _same_floats(out, args):
        return None
    (x,) = args
    _, kernel, stride, pads, dilation, sizes = _pool_setup(x, statics, True, "max_pool")
    if min(pads) < 0 or out.shape != (*x.shape[:2], *sizes):
        return None
    batch = x.shape[0]
    padded_sample = x.shape[1] * math.prod(s + pads[a] + pads[x.ndim - 2 + a]
                                           for a, s in enumerate(x.shape[2:])) * x.itemsize
    step = batch_chunk(batch, padded_sample + math.prod(out.shape[1:]) * out.itemsize, x.nbytes)
    runs = [_max_pool_chunk(x[i:i + step], out[i:i + step], kernel, stride, pads, dilation, sizes, ws)
            for i in range(0, batch, step)]

    def run() -> None:
        for chunk in runs:
            chunk()

    return run


def _max_pool_chunk(x: np.ndarray, out: np.ndarray, kernel: tuple[int, ...], stride: tuple[int, ...],
                    pads: list[int], dilation: tuple[int, ...], sizes: tuple[int, ...],
                    ws: Workspace) -> Kernel:
    """The kernel of :func:`max_pool_kernel` for one chunk of the batch."""
    padded = _Padded(x, pads, -np.inf, 0, ws)
    first, *rest = _offset_views(padded.array, kernel, stride, dilation, sizes)
    cells = ws.array(2, out.shape, out.dtype)

    def run() -> None:
        padded.write()
        np.copyto(out, first)
        for view in rest:
            np.copyto(cells, view)
            np.maximum(out, cells, out=out)

    return run


class _FirstMaximum:
    """Each window's first maximum, kernel offset by kernel offset, as ``np.argmax`` over
    the window picks it: a cell replaces the best so far when it is greater, or when it is
    NaN and the best is not (the first NaN then stays).  Output-sized scratch only, where
    a copy of every window would take the kernel's size times more."""

    def __init__(self, xp: np.ndarray, kernel: tuple[int, ...], stride: tuple[int, ...],
                 dilation: tuple[int, ...], sizes: tuple[int, ...], ws: Workspace) -> None:
        self.views = _offset_views(xp, kernel, stride, dilation, sizes)
        shape = (*xp.shape[:2], *sizes)
        self.best = ws.array(2, shape, xp.dtype)
        self.cells = ws.array(7, shape, xp.dtype)
        self.pick = ws.array(3, shape, np.dtype(np.intp))
        self.wins = ws.array(4, shape, np.dtype(np.bool_))
        self.nan_cells = ws.array(8, shape, np.dtype(np.bool_))
        self.nan_best = ws.array(10, shape, np.dtype(np.bool_))

    def find(self) -> np.ndarray:
        """The flat kernel offset of each window's first maximum (C order of the offsets)."""
        best, cells, pick, wins = self.best, self.cells, self.pick, self.wins
        nan_cells, nan_best = self.nan_cells, self.nan_best
        np.copyto(best, self.views[0])
        pick.fill(0)
        for k, view in enumerate(self.views[1:], start=1):
            np.copyto(cells, view)
            np.greater(cells, best, out=wins)
            np.isnan(cells, out=nan_cells)
            np.isnan(best, out=nan_best)
            np.logical_not(nan_best, out=nan_best)
            np.logical_and(nan_cells, nan_best, out=nan_cells)
            np.logical_or(wins, nan_cells, out=wins)
            np.copyto(best, cells, where=wins)
            np.copyto(pick, k, where=wins)
        return pick


def max_pool_grad_kernel(out: np.ndarray, args: list[Any], statics: dict[str, Any],
                         ws: Workspace) -> Optional[Kernel]:
    """``max_pool_grad(x, dout)``: each window's (first) maximum found offset by offset,
    and dout added at that kernel offset.

    A chunk of the batch at a time (samples are independent): the scratch — the padded
    input, the running maxima and their offsets — is then bounded by about the size of
    the result instead of five times it (a ResNet's stem pools its largest activation,
    and its gradient runs where the backward pass's memory peaks)."""
    if len(args) != 2 or not _same_floats(out, args):
        return None
    x, dout = args
    _, kernel, stride, pads, dilation, sizes = _pool_setup(x, statics, True, "max_pool")
    if min(pads) < 0 or dout.shape != (*x.shape[:2], *sizes) or out.shape != x.shape:
        return None
    batch = x.shape[0]
    padded_sample = x.shape[1] * math.prod(s + pads[a] + pads[x.ndim - 2 + a]
                                           for a, s in enumerate(x.shape[2:])) * x.itemsize
    cells = math.prod(dout.shape[1:])
    per_sample = padded_sample + cells * (4 * out.itemsize + np.dtype(np.intp).itemsize + 3)
    step = batch_chunk(batch, per_sample, out.nbytes)
    runs = [_max_pool_grad_chunk(x[i:i + step], dout[i:i + step], out[i:i + step],
                                 kernel, stride, pads, dilation, sizes, ws)
            for i in range(0, batch, step)]

    def run() -> None:
        for chunk in runs:
            chunk()

    return run


def _max_pool_grad_chunk(x: np.ndarray, dout: np.ndarray, out: np.ndarray, kernel: tuple[int, ...],
                         stride: tuple[int, ...], pads: list[int], dilation: tuple[int, ...],
                         sizes: tuple[int, ...], ws: Workspace) -> Kernel:
    """The kernel of :func:`max_pool_grad_kernel` for one chunk of the batch (every chunk
    binds the same workspace slots: they run one after the other)."""
    padded = _Padded(x, pads, -np.inf, 1, ws)
    maximum = _FirstMaximum(padded.array, kernel, stride, dilation, sizes, ws)
    hit = maximum.wins  # free once the maxima are found
    part = ws.array(5, dout.shape, out.dtype)
    # The accumulator takes the padded input's place (slot 1, the same shape): the input
    # is not read again once the maxima are found, and start() zeroes it after that.
    scatter = _Scatter(out, pads, kernel, stride, dilation, sizes, ws, slot=1)

    def run() -> None:
        padded.write()
        pick = maximum.find()
        scatter.start()
        for k in range(len(scatter.targets)):
            np.equal(pick, k, out=hit)
            part.fill(0)
            np.copyto(part, dout, where=hit)  # (not dout * hit: an infinite dout elsewhere is not NaN here)
            scatter.add(k, part)
        scatter.finish()

    return run


def _avg_divisor(x: np.ndarray, statics: dict[str, Any], n: int, kernel: tuple[int, ...],
                 stride: tuple[int, ...], pads: list[int], sizes: tuple[int, ...], dtype: Any) -> np.ndarray:
    include = statics.get("count_include_pad", True)
    if not isinstance(include, bool):
        raise TypeError("count_include_pad is true or false")
    # the padding as given: pool_params widens the ends only in ceil mode
    given = _pool_setup(x, {**statics, "ceil_mode": False}, False, "avg_pool")[3]
    divisor = _conv.avg_divisor(x.shape, n, kernel, stride, pads, given, sizes, include)
    return np.ascontiguousarray(divisor.astype(dtype))


def avg_pool_kernel(out: np.ndarray, args: list[Any], statics: dict[str, Any],
                    ws: Workspace) -> Optional[Kernel]:
    """``avg_pool(x)``: the sum over every kernel offset, divided by each window's count."""
    if len(args) != 1 or not _same_floats(out, args):
        return None
    (x,) = args
    n, kernel, stride, pads, dilation, sizes = _pool_setup(x, statics, False, "avg_pool")
    if min(pads) < 0 or out.shape != (*x.shape[:2], *sizes):
        return None
    divisor = _avg_divisor(x, statics, n, kernel, stride, pads, sizes, out.dtype)
    padded = _Padded(x, pads, 0.0, 0, ws)
    window = _windows(padded.array, kernel, stride, dilation, sizes, kernel_first=False)
    axes = tuple(range(2 + n, 2 + 2 * n))

    spread = _Spread(divisor, out, ws, channels=False)

    def run() -> None:
        padded.write()
        np.sum(window, axis=axes, out=out)  # the evaluation's sum, term for term
        np.divide(out, spread.write(), out=out)

    return run


def avg_pool_grad_kernel(out: np.ndarray, args: list[Any], statics: dict[str, Any],
                         ws: Workspace) -> Optional[Kernel]:
    """``avg_pool_grad(dout, x)`` (x read for its type): dout divided by each window's count,
    added at every kernel offset."""
    if len(args) != 1 or not _same_floats(out, args):
        return None
    (dout,) = args
    x = np.broadcast_to(np.zeros((), out.dtype), out.shape)
    n, kernel, stride, pads, dilation, sizes = _pool_setup(x, statics, False, "avg_pool")
    if min(pads) < 0 or dout.shape != (*out.shape[:2], *sizes):
        return None
    divisor = _avg_divisor(x, statics, n, kernel, stride, pads, sizes, out.dtype)
    scaled = ws.array(1, dout.shape, out.dtype)
    spread = _Spread(divisor, dout, ws, channels=False)
    scatter = _Scatter(out, pads, kernel, stride, dilation, sizes, ws)

    def run() -> None:
        np.divide(dout, spread.write(), out=scaled)
        scatter.start()
        for k in range(len(scatter.targets)):
            scatter.add(k, scaled)
        scatter.finish()

    return run


def batch_norm_kernel(out: np.ndarray, args: list[Any], statics: dict[str, Any],
                      ws: Workspace) -> Optional[Kernel]:
    """``batch_norm(x, scale, bias, mean, var)``: ``scale / sqrt(var + eps)`` into scratch,
    then ``(x - mean) * inv + bias`` in the output, as the evaluation computes it."""
    if len(args) != 5 or not _same_floats(out, args) or out.ndim < 2:
        return None
    x, scale, bias, mean, var = args
    eps = statics.get("eps", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        return None
    channels = x.shape[1]
    if any(v.shape != (channels,) for v in (scale, bias, mean, var)):
        return None
    inv = ws.array(0, (channels,), out.dtype)
    eps_value = out.dtype.type(eps)
    mean_b, inv_b, bias_b = (_Spread(v, out, ws) for v in (mean, inv, bias))

    def run() -> None:
        np.add(var, eps_value, out=inv)
        np.sqrt(inv, out=inv)
        np.divide(scale, inv, out=inv)
        np.subtract(x, mean_b.write(), out=out)
        np.multiply(out, inv_b.write(), out=out)
        np.add(out, bias_b.write(), out=out)

    return run


def channel_sum_kernel(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    """``channel_sum(x)``: the sum over every axis but 1, written with ``out=``."""
    if len(args) != 1 or not _same_floats(out, args) or args[0].ndim < 2:
        return None
    x = args[0]
    return lambda: np.sum(x, axis=(0, *range(2, x.ndim)), out=out)


def channel_spread_kernel(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    """``channel_spread(v, like)`` (like read for its type): v broadcast along axis 1."""
    if len(args) != 1 or not _same_floats(out, args) or out.ndim < 2 or args[0].shape != (out.shape[1],):
        return None
    source = args[0].reshape((-1,) + (1,) * (out.ndim - 2))
    return lambda: np.copyto(out, source)


def global_pool_kernel(fn: Any) -> Callable[[np.ndarray, list[Any], dict[str, Any]], Optional[Kernel]]:
    """``global_avg_pool``/``global_max_pool``: the reduction over the spatial axes, kept."""

    def factory(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
        if len(args) != 1 or not _same_floats(out, args) or args[0].ndim < 3:
            return None
        x = args[0]
        axes = tuple(range(2, x.ndim))
        return lambda: fn(x, axis=axes, keepdims=True, out=out)

    return factory


def erf_kernel(out: np.ndarray, args: list[Any], statics: dict[str, Any]) -> Optional[Kernel]:
    """``erf(x)`` written with ``out=`` (scipy's ufunc, as the evaluation computes it), so
    that it may overwrite its argument: gelu's gradient then needs one activation-sized
    temporary fewer (the rule allows ``inplace``)."""
    x = args[0] if len(args) == 1 else None
    if statics or not isinstance(x, np.ndarray) or out.dtype not in (np.float32, np.float64) \
            or x.dtype != out.dtype:
        return None
    # importlib: scipy ships no type stubs (as the op library's own erf).
    erf = importlib.import_module("scipy.special").erf
    return lambda: erf(x, out=out)


__all__ = ["ScratchFactory", "Workspace", "avg_pool_grad_kernel", "avg_pool_kernel", "batch_norm_kernel",
           "channel_spread_kernel", "channel_sum_kernel", "conv_input_grad_kernel", "conv_kernel",
           "conv_weight_grad_kernel", "erf_kernel", "global_pool_kernel", "max_pool_grad_kernel", "max_pool_kernel"]

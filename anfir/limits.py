"""The bounds anfir puts on what it reads and computes, and bounded reading.

Hostile or broken input must give a clear, located error, never a hang, a
machine out of memory or a bare Python exception.  Each bound below is
documented (docs/language.md, docs/cli.md, docs/reading-dumps.md) and is
read where it is used, so a program may adjust one by assignment::

    import anfir.limits
    anfir.limits.MAX_CALL_DEPTH = 5_000_000

(the command line has ``--max-depth`` for the call depth).
"""

from __future__ import annotations

import io
import math
import os
import stat
from typing import IO, Any, Optional

import numpy as np

MAX_SOURCE_BYTES = 64 * 1024 * 1024
"""The largest file anfir reads as text: an ``.anf`` program, an import, an ``.ir`` dump."""

MAX_INT_DIGITS = 4300
"""The most decimal digits of an integer written in a program, a dump or a
command-line argument (Python's own limit for converting text to ``int``)."""

MAX_INT_BITS = 65536
"""The largest integer an evaluation computes (an integer ``*`` or ``**``
whose result would need more bits is a run-time error): about 19,700 digits."""

MAX_CONSTANT_BYTES = 1024 * 1024 * 1024
"""The largest tensor a dump's constant (inline or in its ``.npz`` side file) or
an ``.npy`` argument may hold, checked from the declared shape before any allocation."""

MAX_DIMENSION = 2 ** 63 - 1
"""The largest size of one tensor dimension (numpy's index type)."""

MAX_CALL_DEPTH = 1_000_000
"""The most nested calls (frames) an evaluation may have at once: a recursion
deeper than this (one that never ends, typically) is a run-time error instead
of growing until the machine is out of memory.  Each level of a non-tail
recursion through an ``if`` takes two frames (about 300 bytes)."""


class ReadError(Exception):
    """Why a file could not be read (the caller turns it into its own located error)."""


def read_bounded(path: str, limit: Optional[int] = None) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` (default
    :data:`MAX_SOURCE_BYTES`) of them.

    Devices, pipes, sockets and directories are refused *before* reading (a
    FIFO is opened non-blocking, so ``/dev/stdin`` never blocks, and
    ``/dev/zero`` is never read); so is a file larger than the limit, even
    when it grows while it is read.  Raises :class:`ReadError` with the reason.
    """
    limit = MAX_SOURCE_BYTES if limit is None else limit
    if not isinstance(path, (str, os.PathLike)):
        raise ReadError(f"a path is a string, not {type(path).__name__}")
    text = os.fspath(path)
    if isinstance(text, bytes) or "\0" in text:
        raise ReadError("a path cannot contain a NUL character")
    try:
        before = os.stat(text)
    except OSError as error:
        raise ReadError(error.strerror or str(error)) from None
    if not stat.S_ISREG(before.st_mode):
        raise ReadError(_kind(before.st_mode))
    if before.st_size > limit:
        raise ReadError(_too_large(before.st_size, limit))
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(text, flags)
    except OSError as error:
        raise ReadError(error.strerror or str(error)) from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):  # replaced between stat and open
            raise ReadError(_kind(opened.st_mode))
        chunks = []
        total = 0
        while True:
            try:
                chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            except OSError as error:
                raise ReadError(error.strerror or str(error)) from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise ReadError(_too_large(total, limit))
        return b"".join(chunks)
    finally:
        os.close(fd)


def npy_header(stream: IO[bytes]) -> tuple[tuple[int, ...], bool, "np.dtype[Any]"]:
    """``(shape, fortran_order, dtype)`` from the header of the ``.npy`` data in
    ``stream`` (left just after the header).  Raises :class:`ReadError`."""
    try:
        version = np.lib.format.read_magic(stream)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
        else:
            raise ReadError(f"unsupported .npy version {version}")
    except (ValueError, EOFError, OSError) as error:
        raise ReadError(f"not a .npy array ({error})") from None
    if dtype.hasobject:
        raise ReadError(f"an array of {dtype} cannot be read (only numbers and bools)")
    return shape, fortran, dtype


def read_npy_data(stream: IO[bytes], shape: tuple[int, ...], fortran: bool,
                  dtype: "np.dtype[Any]") -> "np.ndarray[Any, Any]":
    """The array whose header :func:`npy_header` read: its size is checked against
    :data:`MAX_CONSTANT_BYTES` before a byte is read, and the data must be all there."""
    count = math.prod(shape)
    size = count * dtype.itemsize
    if size > MAX_CONSTANT_BYTES:
        raise ReadError(f"the array of shape {shape} would take {size:,} bytes; anfir reads "
                        f"at most {MAX_CONSTANT_BYTES:,} (anfir.limits.MAX_CONSTANT_BYTES)")
    try:
        data = stream.read(size)
    except (OSError, ValueError, EOFError) as error:
        raise ReadError(str(error)) from None
    if len(data) != size:
        raise ReadError(f"the file holds {len(data):,} bytes of data; its header says {size:,}")
    array: "np.ndarray[Any, Any]" = np.frombuffer(data, dtype=dtype, count=count)
    result: "np.ndarray[Any, Any]" = array.reshape(shape, order="F" if fortran else "C").copy()
    return result


def read_npy_file(path: str) -> "np.ndarray[Any, Any]":
    """The array in the ``.npy`` file ``path`` (a regular file; no pickles; bounded)."""
    data = read_bounded(path, MAX_CONSTANT_BYTES + (1 << 20))
    stream = io.BytesIO(data)
    shape, fortran, dtype = npy_header(stream)
    return read_npy_data(stream, shape, fortran, dtype)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "it is a directory"
    return "it is not a regular file (a device, pipe or socket)"


def _too_large(size: int, limit: int) -> str:
    more = "at least " if size == limit + 1 else ""
    return (f"the file is too large ({more}{size:,} bytes; anfir reads at most {limit:,}, "
            "see anfir.limits)")


def int_too_long(digits: str) -> Optional[str]:
    """Why the decimal literal ``digits`` is too long to read, or None if it is fine."""
    count = len(digits.lstrip("+-"))
    if count <= MAX_INT_DIGITS:
        return None
    return f"an integer literal has at most {MAX_INT_DIGITS:,} digits; this one has {count:,}"


_PIECE = 10 ** 4000


def int_text(value: int) -> str:
    """The decimal text of any integer, however long (``str`` refuses more than
    4,300 digits); divide and conquer, so a 20,000-digit number is quick."""
    if -_PIECE < value < _PIECE:
        return str(value)
    sign = "-" if value < 0 else ""
    value = abs(value)
    # Split into pieces of at most 4000 digits, by repeated halving (an explicit stack).
    pieces: list[str] = []
    stack: list[tuple[int, int]] = [(value, 0)]  # (number, digits it must fill; 0: as many as it has)
    while stack:
        number, width = stack.pop()
        if number < _PIECE:
            pieces.append(str(number).zfill(width) if width else str(number))
            continue
        half = (number.bit_length() * 3 // 10) // 2  # about half its decimal digits
        high, low = divmod(number, 10 ** half)
        low_width = half
        high_width = width - half if width else 0
        stack.append((low, low_width))
        stack.append((high, high_width))
    return sign + "".join(pieces)


__all__ = ["MAX_CALL_DEPTH", "MAX_CONSTANT_BYTES", "MAX_DIMENSION", "MAX_INT_BITS",
           "MAX_INT_DIGITS", "MAX_SOURCE_BYTES", "ReadError", "int_text", "int_too_long",
           "npy_header", "read_bounded", "read_npy_data", "read_npy_file"]

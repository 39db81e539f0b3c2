"""ONNX tensors whose bytes live in an external file (``MODEL.onnx.data``).

``torch.onnx.export`` writes every weight of a model to a file beside the
``.onnx`` by default, and protobuf's 2 GB limit makes it the only way for a
large model.  A tensor then carries ``external_data`` entries: ``location`` (a
path relative to the model's directory), ``offset`` and ``length`` (bytes).
They are read as ``onnx.load`` reads them, with anfir's limits on every read:

* the location is a relative path inside the model's directory (after
  resolving symbolic links): an absolute path, or one that climbs out with
  ``..``, is an error — a model file must not make anfir read elsewhere;
* only a regular file is read (no device, FIFO or directory: nothing that
  could block or never end), opened once, checked again once opened;
* the size is bounded before a byte is read: the tensor's own byte count
  (from its shape and element type) must fit ``anfir.limits.MAX_CONSTANT_BYTES``,
  a given ``length`` must be that count, and ``offset + length`` must lie
  within the file — a truncated data file is an error naming the tensor, the
  file and both sizes, never a short array.

:func:`save_model` writes a model the other way: its large tensors' bytes in
``MODEL.onnx.data`` beside it (always, when asked, and by itself when the
model would pass protobuf's 2 GB limit), the ``.onnx`` file keeping only
their references.  The data file is written anew each time (``onnx.save``
appends to an existing one), and both files' bytes depend only on the model.
"""

from __future__ import annotations

import os
import stat
from typing import Any, Optional

import numpy as np

from anfir import limits
from anfir.errors import AnfirError
from anfir.interop.onnx.exporter import require_onnx

PACKED_4BIT = frozenset({"INT4", "UINT4", "FLOAT4E2M1"})
"""Element types stored two to a byte."""
PACKED_2BIT = frozenset({"INT2", "UINT2"})
"""Element types stored four to a byte."""


class ExternalDataError(AnfirError):
    """An external-data reference that cannot be read safely (or at all)."""

    kind = "onnx import error"


def _entries(proto: Any) -> dict[str, str]:
    return {entry.key: entry.value for entry in proto.external_data}


def _byte_count(onnx: Any, proto: Any, itemsize: int) -> int:
    """How many bytes the tensor's raw data has, from its dims and element type."""
    count = 1
    for d in proto.dims:
        if int(d) < 0:
            raise ExternalDataError(f"tensor {proto.name!r} has a negative dimension {int(d)}")
        count *= int(d)
    name = onnx.TensorProto.DataType.Name(proto.data_type)
    if name in PACKED_4BIT:
        return (count + 1) // 2
    if name in PACKED_2BIT:
        return (count + 3) // 4
    return count * itemsize


def _inside(base: str, location: str, tensor: str) -> str:
    """The real path of ``location`` under ``base``, or an error if it leaves it."""
    if not location or "\0" in location:
        raise ExternalDataError(f"tensor {tensor!r}: an empty or invalid external-data location")
    if os.path.isabs(location) or os.path.splitdrive(location)[0]:
        raise ExternalDataError(f"tensor {tensor!r}: the external-data location {location!r} is an "
                                "absolute path; it must be relative to the model's directory")
    root = os.path.realpath(base)
    target = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, target]) != root:
        raise ExternalDataError(f"tensor {tensor!r}: the external-data location {location!r} "
                                f"leads outside the model's directory {root}")
    return target


def _number(entries: dict[str, str], key: str, tensor: str) -> Optional[int]:
    if key not in entries:
        return None
    try:
        value = int(entries[key])
    except ValueError:
        raise ExternalDataError(f"tensor {tensor!r}: external-data {key} {entries[key]!r} is not "
                                "an integer") from None
    if value < 0:
        raise ExternalDataError(f"tensor {tensor!r}: external-data {key} {value} is negative")
    return value


def read_external(onnx: Any, proto: Any, base: Optional[str], itemsize: int) -> Any:
    """The TensorProto ``proto`` with its external bytes read into ``raw_data`` (a
    copy), ready for ``onnx.numpy_helper.to_array``.  ``base`` is the model's
    directory (None: the model was given as a ModelProto, so there is none)."""
    name = proto.name
    entries = _entries(proto)
    location = entries.get("location", "")
    if base is None:
        raise ExternalDataError(
            f"tensor {name!r} keeps its data in the external file {location!r}: import the model "
            "by its path (anfir.import_onnx(\"model.onnx\")) so the file can be found beside it, "
            "or load it with onnx.load first")
    path = _inside(base, location, name)
    expected = _byte_count(onnx, proto, itemsize)
    if expected > limits.MAX_CONSTANT_BYTES:
        raise ExternalDataError(f"tensor {name!r} has {expected:,} bytes: more than "
                                f"{limits.MAX_CONSTANT_BYTES:,} (anfir.limits.MAX_CONSTANT_BYTES)")
    offset = _number(entries, "offset", name) or 0
    length = _number(entries, "length", name)
    if length is not None and length != expected:
        raise ExternalDataError(f"tensor {name!r}: external-data length {length:,} bytes, but its "
                                f"shape and type make {expected:,}")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        before = os.stat(path)
        if not stat.S_ISREG(before.st_mode):
            raise ExternalDataError(f"tensor {name!r}: the external-data location {location!r} is "
                                    "not a regular file")
        fd = os.open(path, flags)
    except OSError as error:
        raise ExternalDataError(f"tensor {name!r}: cannot read its external data {location!r}: "
                                f"{error.strerror or error}") from None
    try:
        opened = os.fstat(fd)
        if not stat.S_ISREG(opened.st_mode):  # replaced between stat and open
            raise ExternalDataError(f"tensor {name!r}: the external-data location {location!r} is "
                                    "not a regular file")
        if offset + expected > opened.st_size:
            raise ExternalDataError(
                f"tensor {name!r}: its external data {location!r} is truncated — the tensor needs "
                f"bytes {offset:,} to {offset + expected:,}, the file has {opened.st_size:,}")
        chunks = []
        done = 0
        while done < expected:
            chunk = os.pread(fd, min(1 << 24, expected - done), offset + done)
            if not chunk:
                raise ExternalDataError(f"tensor {name!r}: its external data {location!r} ended "
                                        f"after {done:,} of {expected:,} bytes (truncated)")
            chunks.append(chunk)
            done += len(chunk)
    except OSError as error:
        raise ExternalDataError(f"tensor {name!r}: cannot read its external data {location!r}: "
                                f"{error.strerror or error}") from None
    finally:
        os.close(fd)
    copy = onnx.TensorProto()
    copy.CopyFrom(proto)
    del copy.external_data[:]
    copy.data_location = onnx.TensorProto.DEFAULT
    copy.raw_data = b"".join(chunks)
    return copy


PROTOBUF_LIMIT = 2**31 - 1
"""The largest message protobuf serialises (2 GB): a larger model must keep its
weights in an external file."""

EXTERNAL_THRESHOLD = 1024
"""Tensors of at least this many bytes go to the data file (``onnx.save``'s own
default); smaller ones stay inline."""

DATA_ALIGNMENT = 64
"""Each tensor starts at a multiple of this offset in the data file (so a
reader may map it aligned)."""


def _tensors(onnx: Any, graph: Any) -> list[Any]:
    """Every TensorProto of ``graph`` and its subgraphs: initializers and the
    tensor attributes of nodes (``Constant``), walked without recursion."""
    found: list[Any] = []
    graphs = [graph]
    while graphs:
        g = graphs.pop()
        found.extend(g.initializer)
        for node in g.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.TENSOR:
                    found.append(attribute.t)
                elif attribute.type == onnx.AttributeProto.GRAPH:
                    graphs.append(attribute.g)
                elif attribute.type == onnx.AttributeProto.GRAPHS:
                    graphs.extend(attribute.graphs)
    return found


def save_model(model: Any, path: str, external_data: Optional[bool] = None) -> Any:
    """Write the ONNX ``model`` to ``path``; the model as written.

    ``external_data``: True writes every tensor of at least
    :data:`EXTERNAL_THRESHOLD` bytes to ``PATH.data`` beside the model (as
    ``torch.onnx.export`` does), False keeps everything in one file (an error
    past protobuf's 2 GB limit), None (the default) chooses external data only
    when one file would pass that limit.  ``model`` itself is not changed.
    """
    onnx = require_onnx()
    if external_data is None:
        external_data = model.ByteSize() > PROTOBUF_LIMIT
    data_path = path + ".data"
    if not external_data:
        if model.ByteSize() > PROTOBUF_LIMIT:
            raise ExternalDataError(
                f"the model has {model.ByteSize():,} bytes, more than protobuf's limit of "
                f"{PROTOBUF_LIMIT:,}: write its weights to an external file (external_data=True, "
                "or `anfir export --external-data`)")
        _write(path, model.SerializeToString(deterministic=True))
        return model
    written = onnx.ModelProto()
    written.CopyFrom(model)
    location = os.path.basename(data_path)
    chunks: list[bytes] = []
    offset = 0
    for tensor in _tensors(onnx, written.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            raise ExternalDataError(f"tensor {tensor.name!r} already refers to external data: "
                                    "load it first (onnx.load with load_external_data=True)")
        raw = tensor.raw_data if tensor.HasField("raw_data") else None
        if raw is None:  # typed fields (float_data, ...): to raw little-endian bytes
            if tensor.data_type == onnx.TensorProto.STRING:
                continue
            raw = onnx.numpy_helper.to_array(tensor).astype(
                onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).tobytes()
        if len(raw) < EXTERNAL_THRESHOLD:
            continue
        padding = -offset % DATA_ALIGNMENT
        chunks.append(b"\0" * padding)
        offset += padding
        for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
            tensor.ClearField(field)
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        del tensor.external_data[:]
        for key, value in (("location", location), ("offset", str(offset)), ("length", str(len(raw)))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        chunks.append(raw)
        offset += len(raw)
    _write(data_path, b"".join(chunks))
    _write(path, written.SerializeToString(deterministic=True))
    return written


def uses_external_data(model: Any) -> bool:
    """Whether any tensor of the ONNX ``model`` keeps its bytes in an external file."""
    onnx = require_onnx()
    return any(t.data_location == onnx.TensorProto.EXTERNAL for t in _tensors(onnx, model.graph))


def _write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path``, replacing what was there (never appending)."""
    with open(path, "wb") as handle:
        handle.write(data)


def itemsize_of(dtype: Any) -> int:
    """The byte size of one element of a numpy dtype."""
    return int(np.dtype(dtype).itemsize)


__all__ = ["ExternalDataError", "read_external", "itemsize_of", "save_model", "uses_external_data", "PROTOBUF_LIMIT",
           "EXTERNAL_THRESHOLD"]

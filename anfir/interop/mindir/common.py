"""What the ``.mindir`` reader and writer share: element types, MindSpore's type
ids, the error class, and tensors to and from ``TensorProto``."""

from __future__ import annotations

import os
from typing import Any, Optional

import numpy as np

from anfir import limits
from anfir.dtypes import BY_NAME
from anfir.errors import AnfirError
from anfir.location import Location


class MindirError(AnfirError):
    """A ``.mindir`` file anfir cannot read, or a program it cannot write as one:
    the message names the graph and node (and the location is the node's place
    in the model: its number in file order, with its text as the excerpt)."""

    kind = "mindir error"


class NodeError(Exception):
    """Raised while converting one node; collected into one :class:`MindirError`."""


TENSOR_DTYPES: dict[int, str] = {
    1: "f32", 2: "u8", 3: "i8", 4: "u16", 5: "i16", 6: "i32", 7: "i64", 9: "bool", 10: "f16",
    11: "f64", 12: "u32", 13: "u64", 14: "c64", 15: "c128", 16: "bf16", 17: "f64",
}
"""``TensorProto.DataType`` -> anfir dtype (FLOAT64=17 is an alias of DOUBLE=11)."""

TENSOR_TYPE_OF: dict[str, int] = {name: code for code, name in TENSOR_DTYPES.items() if code != 17}
"""anfir dtype -> the ``TensorProto.DataType`` anfir writes."""

TYPE_IDS: dict[int, str] = {
    30: "bool", 32: "i8", 33: "i16", 34: "i32", 35: "i64", 37: "u8", 38: "u16", 39: "u32",
    40: "u64", 42: "f16", 43: "f32", 44: "f64", 45: "bf16", 51: "c64", 52: "c128",
}
"""MindSpore's ``TypeId`` numbers (how ``Cast``, ``ScalarToTensor`` and ``SumExt``
take a dtype as an INT64 input) -> anfir dtype."""

TYPE_ID_OF: dict[str, int] = {name: code for code, name in TYPE_IDS.items()}
"""anfir dtype -> MindSpore ``TypeId``."""

MAX_MODEL_BYTES = limits.MAX_CONSTANT_BYTES + 64 * 1024 * 1024
"""The largest ``.mindir`` file anfir reads (protobuf itself stops at 2 GB; bigger
weights live in external data files, each bounded by MAX_CONSTANT_BYTES)."""


def numpy_dtype(name: str) -> Any:
    """The numpy dtype of an anfir element type."""
    return np.dtype(BY_NAME[name].numpy)


def element_count(dims: Any, what: str) -> int:
    """The number of elements of ``dims``, each checked (>= 0, within the limit)."""
    count = 1
    for d in dims:
        d = int(d)
        if d < 0:
            raise NodeError(f"{what} has a negative dimension {d}")
        if d > limits.MAX_DIMENSION:
            raise NodeError(f"{what} has a dimension of {d}, more than anfir.limits.MAX_DIMENSION")
        count *= d
        if count > limits.MAX_CONSTANT_BYTES:
            raise NodeError(f"{what} has shape {tuple(int(x) for x in dims)}: more than "
                            f"{limits.MAX_CONSTANT_BYTES:,} elements (anfir.limits.MAX_CONSTANT_BYTES)")
    return count


def tensor_of(proto: Any, what: str, folder: Optional[str]) -> np.ndarray:
    """A ``TensorProto`` with data as a numpy array.  Sizes are checked from the
    declared shape before anything is allocated; external data is read only from
    a regular file inside ``folder`` (the model's own folder), bounded."""
    if proto.data_type not in TENSOR_DTYPES:
        raise NodeError(f"{what} has element type {proto.data_type}, which anfir has no dtype for")
    if proto.compression_type:
        raise NodeError(f"{what} is compressed (compression type {proto.compression_type}); "
                        "anfir reads uncompressed tensors only")
    dtype = numpy_dtype(TENSOR_DTYPES[proto.data_type])
    dims = tuple(int(d) for d in proto.dims)
    count = element_count(dims, what)
    size = count * dtype.itemsize
    if size > limits.MAX_CONSTANT_BYTES:
        raise NodeError(f"{what} would take {size:,} bytes; anfir reads at most "
                        f"{limits.MAX_CONSTANT_BYTES:,} (anfir.limits.MAX_CONSTANT_BYTES)")
    if proto.HasField("external_data"):
        data = _external(proto.external_data, size, what, folder)
    elif proto.HasField("raw_data"):
        data = proto.raw_data
    else:
        typed = _typed_data(proto)
        if typed is None:
            if count == 0:
                return np.zeros(dims, dtype)
            raise NodeError(f"{what} has no data")
        if len(typed) != count:
            raise NodeError(f"{what} has {len(typed)} values for shape {dims}")
        return np.asarray(typed).astype(dtype).reshape(dims)
    if len(data) != size:
        raise NodeError(f"{what} holds {len(data):,} bytes of data; its shape {dims} and "
                        f"type need {size:,}")
    array: np.ndarray = np.frombuffer(data, dtype=dtype.newbyteorder("<"), count=count)
    return array.astype(dtype).reshape(dims)


def _typed_data(proto: Any) -> Optional[list[Any]]:
    for field in ("float_data", "double_data", "int32_data", "int64_data", "uint64_data"):
        values = getattr(proto, field)
        if len(values):
            return list(values)
    return None


def _external(ext: Any, size: int, what: str, folder: Optional[str]) -> bytes:
    if folder is None:
        raise NodeError(f"{what} keeps its data in an external file; read the model from "
                        "its path (not bytes) so the file can be found beside it")
    location = ext.location if isinstance(ext.location, str) else bytes(ext.location).decode("utf-8", "replace")
    if not location or os.path.isabs(location) or "\0" in location:
        raise NodeError(f"{what}: external data location {location!r} is not a relative path")
    root = os.path.realpath(folder)
    path = os.path.realpath(os.path.join(root, location))
    if os.path.commonpath([root, path]) != root:
        raise NodeError(f"{what}: external data {location!r} is outside the model's folder")
    offset, length = int(ext.offset), int(ext.length)
    if offset < 0 or length < 0 or (length and length != size):
        raise NodeError(f"{what}: external data offset {offset} / length {length} do not fit "
                        f"its {size:,} bytes")
    try:
        blob = limits.read_bounded(path, offset + size)
    except limits.ReadError as e:
        raise NodeError(f"{what}: cannot read external data {location!r}: {e}") from None
    return blob[offset:offset + size]


def write_tensor(proto: Any, array: np.ndarray, dtype: str) -> None:
    """Fill ``proto`` (a TensorProto) with ``array``: dims, data type, raw little-endian data."""
    proto.data_type = TENSOR_TYPE_OF[dtype]
    proto.dims.extend(int(d) for d in array.shape)
    proto.raw_data = np.ascontiguousarray(array, dtype=numpy_dtype(dtype).newbyteorder("<")).tobytes()


def model_location(filename: str, number: int, text: str) -> Location:
    """The place of a model's ``number``-th node (1-based, in file order), its text the excerpt."""
    return Location(filename, number, 1, text[:300])


def check_count(n: int, what: str, limit: int = 10_000_000) -> None:
    """A repeated field must not be absurdly long (protobuf already bounded the bytes)."""
    if n > limit:
        raise NodeError(f"{what}: {n:,} entries, more than anfir reads ({limit:,})")


__all__ = ["MAX_MODEL_BYTES", "MindirError", "NodeError", "TENSOR_DTYPES", "TENSOR_TYPE_OF",
           "TYPE_IDS", "TYPE_ID_OF", "element_count", "model_location", "numpy_dtype",
           "tensor_of", "write_tensor"]

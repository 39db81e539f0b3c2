"""The MIL dtypes of anfir's dtypes, shared by the MIL writer
(:mod:`anfir.interop.coreml.exporter`) and its rules (:mod:`anfir.interop.coreml.export_rules`);
a module of its own so the rules need not import the writer."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from anfir.errors import ExportError
from anfir.location import Location

MIL_DTYPES = {"f16": "fp16", "f32": "fp32", "f64": "fp32", "bool": "bool", "i8": "int32",
              "i16": "int32", "i32": "int32", "i64": "int32", "u8": "int32", "u16": "int32",
              "u32": "int32", "u64": "int32"}
"""anfir dtype → the MIL dtype that carries it (Core ML computes in 32 bits)."""

NUMPY_OF_MIL: dict[str, Any] = {"fp16": np.float16, "fp32": np.float32, "int32": np.int32, "bool": np.bool_}
"""MIL dtype → the numpy scalar type of its constants."""


def mil_dtype(dtype: str, loc: Optional[Location] = None) -> str:
    """The MIL dtype (``fp32``, ``int32``, ``bool``, ``fp16``) standing for an anfir dtype."""
    found = MIL_DTYPES.get(dtype)
    if found is None:
        raise ExportError(f"Core ML has no tensors of {dtype} (strings cannot be exported)", loc)
    return found


__all__ = ["MIL_DTYPES", "NUMPY_OF_MIL", "mil_dtype"]

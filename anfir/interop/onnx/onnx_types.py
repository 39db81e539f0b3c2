"""The ONNX element types of anfir's dtypes, shared by the ONNX writer
(:mod:`anfir.interop.onnx.exporter`), its rules (:mod:`anfir.interop.onnx.export_rules`)
and the importer; a module of its own so the rules need not import the writer."""

from __future__ import annotations

ONNX_TYPES: dict[str, int] = {
    "f16": 10, "f32": 1, "f64": 11, "i8": 3, "i16": 5, "i32": 6, "i64": 7,
    "u8": 2, "u16": 4, "u32": 12, "u64": 13, "bool": 9, "str": 8,
    "bf16": 16, "c64": 14, "c128": 15,
    "f8e4m3fn": 17, "f8e4m3fnuz": 18, "f8e5m2": 19, "f8e5m2fnuz": 20, "u4": 21, "i4": 22,
    "f4e2m1": 23, "f8e8m0": 24, "u2": 25, "i2": 26,
}
"""anfir dtype → ONNX ``TensorProto.DataType`` (checked against onnx when a model is written)."""

FLOAT8 = ("f8e4m3fn", "f8e4m3fnuz", "f8e5m2", "f8e5m2fnuz")
"""The types ONNX's Cast saturates to by default (``saturate=1``)."""

__all__ = ["FLOAT8", "ONNX_TYPES"]

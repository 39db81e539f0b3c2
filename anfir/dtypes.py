"""The one table of element types: anfir names, numpy dtypes, kinds and widths.

Every other module asks this table (never a list of its own) what the dtype
names are, which numpy dtype a name means, which name a numpy dtype has, how
the ``.ir`` dump spells a scalar of that type (``<Float64>``), and what kind
of number it is.  Adding an element type is adding one row to :data:`DTYPES`:
the ANF and ``.ir`` type syntax, ``cast``/``zeros``/``ones``, the type rules,
the printers and the loaders all read it from here.

Kinds are ``float``, ``int`` (signed), ``uint``, ``bool``, ``complex`` and
``str``.  ``str`` is a type a scalar annotation may name (``s: str``) but not a
tensor element type: its row has no numpy dtype.

``bf16`` is numpy's ``bfloat16`` from the ``ml_dtypes`` package (what JAX and
ONNX use); importing this module registers it with numpy.  So are the narrow
storage types ONNX has: the 8-bit floats ``f8e4m3fn f8e4m3fnuz f8e5m2
f8e5m2fnuz f8e8m0`` (``float8_e8m0fnu``: a power of two), the 4-bit float
``f4e2m1`` and the integers ``i4 u4 i2 u2``.  A numpy array of them takes a
byte per element (their row's ``bits`` is their own width); numpy's kind letter
for most of them is ``V`` and ``np.iinfo``/``np.finfo`` do not know them: ask
:func:`numpy_kind`, :func:`int_range` and :func:`float_max`.  ``c64``/``c128``
are numpy's complex types: a complex scalar prints as ``complex(re, im)`` in
ANF and as ``re+imj`` in ``.ir`` dumps.

This is a base-layer module: it imports only the standard library, numpy and
:mod:`anfir.errors`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, TypeGuard

import ml_dtypes  # registers bfloat16, float8_*, int4 ... with numpy: np.dtype("bfloat16")
import numpy as np

from anfir.errors import AnfirTypeError


@dataclass(frozen=True)
class DTypeInfo:
    """One row of the table."""

    name: str
    """The anfir name, as written in programs and dumps: ``f64``."""
    numpy: Optional[str]
    """The numpy dtype's name (``float64``); None for ``str`` (no tensors of it)."""
    kind: str
    """``float``, ``int``, ``uint``, ``bool``, ``complex`` or ``str``."""
    bits: int
    """The width of one element in bits (0 for ``str``; 4 for ``i4``, which numpy
    stores in a byte)."""
    abstract: str
    """How the ``.ir`` dump names a scalar of this type: ``<Float64>``."""


DTYPES: tuple[DTypeInfo, ...] = (
    DTypeInfo("f16", "float16", "float", 16, "Float16"),
    DTypeInfo("bf16", "bfloat16", "float", 16, "BFloat16"),
    DTypeInfo("f32", "float32", "float", 32, "Float32"),
    DTypeInfo("f64", "float64", "float", 64, "Float64"),
    DTypeInfo("i8", "int8", "int", 8, "Int8"),
    DTypeInfo("i16", "int16", "int", 16, "Int16"),
    DTypeInfo("i32", "int32", "int", 32, "Int32"),
    DTypeInfo("i64", "int64", "int", 64, "Int64"),
    DTypeInfo("u8", "uint8", "uint", 8, "UInt8"),
    DTypeInfo("u16", "uint16", "uint", 16, "UInt16"),
    DTypeInfo("u32", "uint32", "uint", 32, "UInt32"),
    DTypeInfo("u64", "uint64", "uint", 64, "UInt64"),
    DTypeInfo("bool", "bool", "bool", 8, "Bool"),
    DTypeInfo("c64", "complex64", "complex", 64, "Complex64"),
    DTypeInfo("c128", "complex128", "complex", 128, "Complex128"),
    # The narrow types (ml_dtypes; ONNX's FLOAT8*, FLOAT4E2M1, INT4/UINT4, INT2/UINT2):
    # storage types, one byte per element in numpy, ``bits`` is their logical width.
    DTypeInfo("f8e4m3fn", "float8_e4m3fn", "float", 8, "Float8E4M3FN"),
    DTypeInfo("f8e4m3fnuz", "float8_e4m3fnuz", "float", 8, "Float8E4M3FNUZ"),
    DTypeInfo("f8e5m2", "float8_e5m2", "float", 8, "Float8E5M2"),
    DTypeInfo("f8e5m2fnuz", "float8_e5m2fnuz", "float", 8, "Float8E5M2FNUZ"),
    DTypeInfo("f8e8m0", "float8_e8m0fnu", "float", 8, "Float8E8M0"),
    DTypeInfo("f4e2m1", "float4_e2m1fn", "float", 4, "Float4E2M1"),
    DTypeInfo("i4", "int4", "int", 4, "Int4"),
    DTypeInfo("u4", "uint4", "uint", 4, "UInt4"),
    DTypeInfo("i2", "int2", "int", 2, "Int2"),
    DTypeInfo("u2", "uint2", "uint", 2, "UInt2"),
    DTypeInfo("str", None, "str", 0, "String"),
)
"""Every type name, in the order messages and documentation list them."""

KINDS = ("float", "int", "uint", "bool", "complex", "str")
"""The kinds a row may have."""

BY_NAME: dict[str, DTypeInfo] = {row.name: row for row in DTYPES}
"""Row by anfir name."""

ELEMENT_TYPES: tuple[str, ...] = tuple(row.name for row in DTYPES if row.numpy is not None)
"""The tensor element types (``f16`` … ``bool``): every name with a numpy dtype."""

TYPE_NAMES: tuple[str, ...] = tuple(row.name for row in DTYPES)
"""Every name a scalar type annotation may use: the element types and ``str``."""

LITERAL_DTYPES: dict[type, str] = {bool: "bool", int: "i64", float: "f64", complex: "c128"}
"""The type of a Python scalar (``bool`` first: a bool is an int to Python)."""

_BY_NUMPY: dict[str, str] = {row.numpy: row.name for row in DTYPES if row.numpy is not None}
_BY_ABSTRACT: dict[str, str] = {row.abstract: row.name for row in DTYPES if row.numpy is not None}
_ABSTRACT: dict[str, str] = {row.name: row.abstract for row in DTYPES if row.numpy is not None}


def _check_table() -> None:
    # Import-time sanity: one row per name, numpy and abstract spelling, known
    # kinds, and numpy agreeing with the widths (a typo here would otherwise
    # surface as a wrong dtype far away).
    assert len(BY_NAME) == len(DTYPES), "duplicate dtype name"
    assert len(_BY_NUMPY) == len(ELEMENT_TYPES), "duplicate numpy dtype"
    assert len(_BY_ABSTRACT) == len(ELEMENT_TYPES), "duplicate abstract name"
    for row in DTYPES:
        assert row.kind in KINDS, row
        if row.numpy is not None:
            assert np.dtype(row.numpy).name == row.numpy, row
            # A narrow type (4 or 2 bits) takes a whole byte in a numpy array.
            assert np.dtype(row.numpy).itemsize * 8 == max(row.bits, 8), row


_check_table()


# -- lookups ------------------------------------------------------------------------
def is_dtype(name: Any) -> TypeGuard[str]:
    """Whether ``name`` is a tensor element type (``"f32"``; ``"str"`` is not)."""
    return isinstance(name, str) and name in _ABSTRACT


def check_dtype(name: Any) -> str:
    """``name`` if it is an element type, else a :class:`AnfirTypeError` listing them
    (the message of a bad ``cast``/``zeros``/``ones`` dtype argument)."""
    if not is_dtype(name):
        raise AnfirTypeError(f"unknown dtype {name!r}; expected one of {', '.join(ELEMENT_TYPES)}")
    return name


def numpy_name(name: str) -> str:
    """The numpy dtype name of an element type: ``"f64"`` -> ``"float64"``.

    Raises :class:`AnfirTypeError` for a name that is not one.
    """
    row = BY_NAME.get(name)
    if row is None or row.numpy is None:
        raise AnfirTypeError(f"unknown dtype {name!r}")
    return row.numpy


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of an element type: ``"f32"`` -> ``dtype('float32')``."""
    return np.dtype(numpy_name(name))


def dtype_name(dtype: Any) -> Optional[str]:
    """The anfir name of a numpy dtype (a ``np.dtype``, a scalar type or a dtype
    name such as ``"float32"``), or None when anfir has no such element type."""
    if isinstance(dtype, str):
        return _BY_NUMPY.get(dtype)
    try:
        return _BY_NUMPY.get(np.dtype(dtype).name)
    except TypeError:
        return None


def require_dtype_name(dtype: np.dtype) -> str:
    """The anfir name of a numpy dtype; :class:`AnfirTypeError` if anfir has none."""
    name = _BY_NUMPY.get(dtype.name)
    if name is None:
        raise AnfirTypeError(f"unsupported array dtype {dtype.name}")
    return name


def dtype_of_array(array: Any) -> str:
    """The anfir name of an array's (or numpy scalar's) dtype; :class:`AnfirTypeError`
    if it has none."""
    return require_dtype_name(array.dtype)


def literal_dtype(value: Any) -> Optional[str]:
    """The type of a Python ``bool``/``int``/``float``/``complex`` (subclasses too), else None."""
    for python_type, name in LITERAL_DTYPES.items():  # bool before int
        if isinstance(value, python_type):
            return name
    return None


def int_range(dtype: Any) -> tuple[int, int]:
    """The smallest and largest value of an integer numpy dtype (``int4`` included:
    numpy's ``iinfo`` knows only its own integers, ml_dtypes' knows both)."""
    info = ml_dtypes.iinfo(np.dtype(dtype))  # type: ignore[no-untyped-call]  # (ml_dtypes has no stubs)
    return int(info.min), int(info.max)


def float_max(dtype: Any) -> float:
    """The largest finite value of a float numpy dtype (``float8_e4m3fn``'s is 448;
    ml_dtypes' ``finfo`` knows numpy's floats and its own)."""
    return float(ml_dtypes.finfo(np.dtype(dtype)).max)  # type: ignore[no-untyped-call]


# -- the .ir spelling of scalar types --------------------------------------------------
def abstract_name(name: str) -> str:
    """How the ``.ir`` dump names a scalar type: ``"f64"`` -> ``"Float64"``
    (a name outside the table is kept as it is)."""
    return _ABSTRACT.get(name, name)


def from_abstract_name(text: str) -> str:
    """The reverse of :func:`abstract_name`: ``"Float64"`` -> ``"f64"`` (others kept)."""
    return _BY_ABSTRACT.get(text, text)


# -- bfloat16 and narrow float operands ---------------------------------------------------
_ML_FLOATS = frozenset(row.numpy for row in DTYPES if row.kind == "float" and row.numpy is not None
                       and row.numpy not in ("float16", "float32", "float64"))
"""ml_dtypes' float types in the table: ``bf16`` and the narrow ``f8…``/``f4e2m1``."""
_WEAK = (int, float)


def weak_scalars(x: Any, y: Any) -> tuple[Any, Any]:
    """``x, y`` with a Python ``int``/``float`` operand beside a ``bf16`` (or narrow
    float: ``f8e4m3fn`` …) array or numpy scalar made a value of that type: numpy's
    promotion (NEP 50) treats Python scalars as weak for its own dtypes, so an ``f32``
    tensor times ``2.0`` stays ``f32``, but not for ml_dtypes' types, where it would
    give ``f32``.  The binary numeric primitives call this on array operands."""
    # (By name: numpy's dtype hashing does not tell ml_dtypes' types apart reliably.)
    dtype = getattr(y, "dtype", None)
    if type(x) in _WEAK and dtype is not None and dtype.name in _ML_FLOATS:
        return dtype.type(x), y
    dtype = getattr(x, "dtype", None)
    if type(y) in _WEAK and dtype is not None and dtype.name in _ML_FLOATS:
        return x, dtype.type(y)
    return x, y


# -- the text of a complex number ------------------------------------------------------
def complex_text(value: complex) -> str:
    """A complex number as ``re+imj`` / ``re-imj`` (``1.5-2.0j``): exact (each part
    is ``repr`` of a float; a ``c64``'s parts are f32 values, exact as f64), and
    what Python's ``complex()`` reads back — the ``.ir`` loader's reader.  The
    ``.ir`` dump spells complex constants and abstract values so."""
    real, imag = float(value.real), float(value.imag)
    sign = "-" if math.copysign(1.0, imag) < 0 and not math.isnan(imag) else "+"
    return f"{real!r}{sign}{abs(imag)!r}j"


# -- kinds ----------------------------------------------------------------------------
def kind_of(name: str) -> Optional[str]:
    """The kind of a type name (``"float"``, ``"uint"``...), None if it is not one."""
    row = BY_NAME.get(name)
    return None if row is None else row.kind


def bits_of(name: str) -> int:
    """The element width in bits (``"f32"`` -> 32); KeyError for an unknown name."""
    return BY_NAME[name].bits


def is_float(name: str) -> bool:
    """Whether ``name`` is a floating-point type (``f16``, ``bf16``, ``f32``, ``f64``
    and the narrow ``f8…``, ``f4e2m1``)."""
    return kind_of(name) == "float"


def is_signed_int(name: str) -> bool:
    """Whether ``name`` is a signed integer type (``i8`` … ``i64``, ``i4``, ``i2``)."""
    return kind_of(name) == "int"


def is_unsigned_int(name: str) -> bool:
    """Whether ``name`` is an unsigned integer type (``u8`` …)."""
    return kind_of(name) == "uint"


def is_integer(name: str) -> bool:
    """Whether ``name`` is an integer type, signed or not (``bool`` is not)."""
    return kind_of(name) in ("int", "uint")


def is_bool(name: str) -> bool:
    """Whether ``name`` is ``bool``."""
    return kind_of(name) == "bool"


def numpy_kind(dtype: Any) -> Optional[str]:
    """The anfir kind of a numpy dtype (``"float"`` for ``float32`` and for
    ``bfloat16``, whose numpy kind letter is ``V``), None when anfir has no such
    element type.  Ask this rather than ``dtype.kind == "f"``."""
    name = dtype_name(dtype)
    return None if name is None else kind_of(name)


def is_float_array(x: Any) -> bool:
    """Whether ``x`` is a numpy array or scalar of a float dtype (``bf16`` included)."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and numpy_kind(dtype) == "float"


def is_complex(name: str) -> bool:
    """Whether ``name`` is a complex type (``c64``, ``c128``)."""
    return kind_of(name) == "complex"


__all__ = [
    "BY_NAME", "DTYPES", "DTypeInfo", "ELEMENT_TYPES", "KINDS", "LITERAL_DTYPES", "TYPE_NAMES",
    "abstract_name", "bits_of", "float_max", "int_range", "complex_text", "check_dtype", "dtype_name", "dtype_of_array", "from_abstract_name",
    "is_bool", "is_complex", "is_dtype", "is_float", "is_float_array", "is_integer", "is_signed_int",
    "is_unsigned_int", "kind_of", "literal_dtype", "numpy_dtype", "numpy_kind", "weak_scalars", "numpy_name", "require_dtype_name",
]

"""The narrow element types (``f8e4m3fn f8e4m3fnuz f8e5m2 f8e5m2fnuz f8e8m0 f4e2m1 i4 u4
i2 u2``, ml_dtypes' types, ONNX's FLOAT8*/FLOAT4E2M1/INT4/UINT4/INT2/UINT2): ``cast`` to
and from them against ml_dtypes (every bit pattern, rounding, NaN, inf, wrapping), the
ONNX importer's Cast against onnx.reference (``saturate``, FLOAT8E8M0's ``round_mode``,
packed 4- and 2-bit initializers), type annotations, ANF text and ``.ir`` dumps, the
arithmetic they allow, and the ONNX exporter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401  (registers the types with numpy)
import numpy as np
import pytest

import anfir
from anfir import dtypes
from anfir.errors import AnfirError, AnfirTypeError

NARROW = {"f8e4m3fn": "float8_e4m3fn", "f8e4m3fnuz": "float8_e4m3fnuz", "f8e5m2": "float8_e5m2",
          "f8e5m2fnuz": "float8_e5m2fnuz", "f8e8m0": "float8_e8m0fnu", "f4e2m1": "float4_e2m1fn",
          "i4": "int4", "u4": "uint4", "i2": "int2", "u2": "uint2"}
FLOATS = [d for d in NARROW if dtypes.is_float(d)]
INTS = [d for d in NARROW if dtypes.is_integer(d)]

# f32 values around the narrow ranges: ties (1.0625 is half-way between e4m3's 1.0 and
# 1.125), subnormals, values past the largest finite one, signed zeros, inf and NaN.
SPECIAL = np.array([0.0, -0.0, 1.0, 1.0625, 1.1875, -1.0625, 0.3, 2.5, -3.75, 5.0, 7.9,
                    240.0, 241.0, 448.0, 464.0, 1000.0, 57344.0, 61440.0, 1e6, -1e6,
                    2.0 ** -9, 2.0 ** -10, 2.0 ** -17, 2.0 ** -130, np.inf, -np.inf, np.nan],
                   np.float32)


def _same(got: Any, want: Any) -> None:
    """Equal dtype and the same values (NaNs where NaNs, signed zeros told apart)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.astype(np.float64), want.astype(np.float64)
    assert np.array_equal(np.isnan(g), np.isnan(w)), (got, want)
    ok = ~np.isnan(w)
    assert np.array_equal(g[ok], w[ok]) and np.array_equal(np.signbit(g[ok]), np.signbit(w[ok])), (got, want)


# -- cast -----------------------------------------------------------------------------------
@pytest.mark.parametrize("d", FLOATS)
def test_cast_to_a_narrow_float_is_ml_dtypes_conversion(d: str) -> None:
    m = anfir.parse(f'def main(x: f32[{SPECIAL.size}]) = cast(x, "{d}")')
    got = anfir.run(m, SPECIAL)
    _same(got, SPECIAL.astype(NARROW[d]))
    assert dtypes.dtype_of_array(got) == d


def test_cast_rounds_to_nearest_even_and_overflows_per_type() -> None:
    # Known values, independently of ml_dtypes: ties go to the even mantissa; past the
    # largest finite value e4m3fn (no inf) gives NaN, e5m2 gives inf, e2m1 saturates.
    # (464, half-way between e4m3fn's largest 448 and the next step, rounds to the even 448.)
    cases = [("f8e4m3fn", [1.0625, 1.1875, 464.0, 500.0, -1e6, np.inf],
              [1.0, 1.25, 448.0, np.nan, np.nan, np.nan]),
             ("f8e5m2", [1.125, 1.375, 61440.0, -1e6, -np.inf], [1.0, 1.5, np.inf, -np.inf, -np.inf]),
             ("f4e2m1", [0.25, 0.75, 2.5, 7.0, -100.0], [0.0, 1.0, 2.0, 6.0, -6.0]),
             ("f8e8m0", [0.3, 3.0, 5.0, 1.0], [0.25, 4.0, 4.0, 1.0])]
    for d, values, want in cases:
        x = np.array(values, np.float32)
        got = anfir.run(anfir.parse(f'def main(x: f32[{x.size}]) = cast(cast(x, "{d}"), "f64")'), x)
        np.testing.assert_array_equal(got, np.array(want))


@pytest.mark.parametrize("d", FLOATS)
def test_every_bit_pattern_goes_to_f32_and_back(d: str) -> None:
    # Each of the type's values is exact in f32, so the round trip is the identity.
    # (f4e2m1 keeps its 4 bits in the low half of a byte: 16 patterns.)
    x = np.arange(16 if d == "f4e2m1" else 256, dtype=np.uint8).view(NARROW[d])
    assert np.unique(x.astype(np.float64)[~np.isnan(x.astype(np.float64))]).size >= x.size // 2 - 2
    m = anfir.parse(f'def main(x: {d}[{x.size}]) = let w = cast(x, "f32") in (w, cast(w, "{d}"))')
    wide, back = anfir.run(m, x)
    _same(wide, x.astype(np.float32))
    _same(back, x)


@pytest.mark.parametrize("d", INTS)
def test_narrow_integers_wrap_and_truncate_as_ml_dtypes(d: str) -> None:
    low, high = dtypes.int_range(NARROW[d])
    ints = np.arange(-20, 21, dtype=np.int32)
    floats = np.array([0.4, 1.6, -1.6, 2.5, 7.9, -8.5, 15.2], np.float32)
    m = anfir.parse(f'def main(i: i32[{ints.size}], f: f32[{floats.size}]) = '
                    f'let a = cast(i, "{d}") in (a, cast(a, "i64"), cast(f, "{d}"))')
    a, wide, from_float = anfir.run(m, ints, floats)
    _same(a, ints.astype(NARROW[d]))
    _same(from_float, floats.astype(NARROW[d]))
    # Wrapping, spelled out: the value modulo 2**bits in the type's range.
    span = 2 ** dtypes.bits_of(d)
    np.testing.assert_array_equal(wide, (ints - low) % span + low)
    assert (low, high) == ((-span // 2, span // 2 - 1) if dtypes.is_signed_int(d) else (0, span - 1))


# -- types, text, dumps -------------------------------------------------------------------
def test_annotations_print_and_parse() -> None:
    m = anfir.parse("def main(x: f8e5m2[2, 3], k: i4[3]) = (cast(x, \"f32\") * 2.0, k)")
    text = anfir.to_text(anfir.compile(m))
    assert "x: f8e5m2[2, 3]" in text and "k: i4[3]" in text
    again = anfir.parse(text)
    x = np.array([[1.5, -2.0, 3.0], [0.25, 96.0, -0.0]], "float8_e5m2")
    k = np.array([-8, 0, 7], "int4")
    for mod in (m, again):
        y, k2 = anfir.run(mod, x, k)
        np.testing.assert_array_equal(y, x.astype(np.float32) * 2)
        _same(k2, k)


@pytest.mark.parametrize("d", list(NARROW))
def test_folded_constants_survive_dump_text_and_reload(d: str, tmp_path: Path) -> None:
    values = "(1.0, -2.0, 3.0, 0.5)" if dtypes.is_float(d) else "(1, -2, 3, 0)"
    src = f'def main(x: f32[4]) = cast(cast(array({values}), "{d}"), "f32") + x * 0.0'
    if d == "f8e8m0":  # no zero, no sign: the constant's NaNs stay NaNs
        src = src.replace("-2.0", "2.0").replace("0.5)", "0.25)")
    m = anfir.parse(src)
    compiled = anfir.compile(m)
    x = np.zeros(4, np.float32)
    want = anfir.run(m, x)
    path = tmp_path / "g.ir"
    path.write_text(anfir.dump_ir(compiled), encoding="utf-8")
    for graph in (compiled, anfir.load(str(path)), anfir.parse(anfir.to_text(compiled))):
        _same(anfir.run(graph, x), want)
    narrow = anfir.compile(anfir.parse(f'def main() = cast(array({values}), "{d}")'))
    dump = anfir.dump_ir(narrow)
    assert f"Tensor[{d}, (4,)]" in dump
    path.write_text(dump, encoding="utf-8")
    _same(anfir.run(anfir.load(str(path))), anfir.run(narrow))


def test_a_narrow_integer_out_of_range_in_a_dump_is_located(tmp_path: Path) -> None:
    dump = anfir.dump_ir(anfir.compile(anfir.parse('def main() = cast(array((1, 2)), "i4")')))
    assert "Tensor[i4, (2,)]([1, 2])" in dump
    path = tmp_path / "bad.ir"
    path.write_text(dump.replace("([1, 2])", "([1, 9])"), encoding="utf-8")
    with pytest.raises(AnfirTypeError, match=r"9 does not fit i4 \(whose values are -8 to 7\)") as info:
        anfir.load(str(path))
    assert info.value.loc is not None and info.value.loc.line > 0


# -- arithmetic -----------------------------------------------------------------------------
def test_float_arithmetic_rounds_each_operation_back_to_the_type() -> None:
    m = anfir.parse("def main(x: f8e4m3fn[5], y: f8e4m3fn[5]) = (x * y + x, x * 2.0, sum(x))")
    x = np.array([1.125, -3.5, 0.0625, 40.0, 2.75], "float8_e4m3fn")
    y = np.array([1.25, 0.75, -8.0, 12.0, 2.75], "float8_e4m3fn")
    fma, doubled, total = anfir.run(m, x, y)
    f = np.float32
    xf, yf = x.astype(f), y.astype(f)
    _same(fma, ((xf * yf).astype(x.dtype).astype(f) + xf).astype(x.dtype))
    _same(doubled, (xf * 2).astype(x.dtype))  # the Python 2.0 takes x's type
    assert np.asarray(total).dtype == x.dtype


# -- ONNX -----------------------------------------------------------------------------------
def _cast_model(onnx: Any, src: int, to: int, opset: int, **attrs: Any) -> Any:
    h = onnx.helper
    node = h.make_node("Cast", ["x"], ["y"], to=to, **attrs)
    graph = h.make_graph([node], "g", [h.make_tensor_value_info("x", src, [None])],
                         [h.make_tensor_value_info("y", to, [None])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])


def _reference(onnx: Any, model: Any, x: np.ndarray) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator
    return np.asarray(ReferenceEvaluator(model).run(None, {"x": x})[0])


@pytest.mark.parametrize("d", ["f8e4m3fn", "f8e4m3fnuz", "f8e5m2", "f8e5m2fnuz"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_onnx_cast_to_float8_saturates_as_the_reference(d: str, saturate: int) -> None:
    onnx = pytest.importorskip("onnx", reason="onnx.reference is the reference")
    from anfir.interop.onnx.exporter import ONNX_TYPES
    with np.errstate(over="ignore"):  # 1e6 is inf in f16
        half = SPECIAL.astype(np.float16)
    for x in (SPECIAL, half, np.array([-1000, -3, 0, 7, 500, 60000], np.int32)):
        model = _cast_model(onnx, ONNX_TYPES[dtypes.require_dtype_name(x.dtype)], ONNX_TYPES[d], 21,
                            saturate=saturate)
        got = anfir.run(anfir.import_onnx(model).entry, x)
        _same(got, _reference(onnx, model, x))


@pytest.mark.parametrize("mode", ["up", "down", "nearest"])
@pytest.mark.parametrize("saturate", [0, 1])
def test_onnx_cast_to_float8e8m0_rounds_as_the_reference(mode: str, saturate: int) -> None:
    onnx = pytest.importorskip("onnx", reason="onnx.reference is the reference")
    rng = np.random.default_rng(1)
    x = np.concatenate([SPECIAL, rng.normal(size=64) * 2.0 ** rng.integers(-140, 128, size=64),
                        [1.5, 1.4999999, 3.0, 2.0 ** -127, 1.5 * 2.0 ** -127, 2.0 ** -149,
                         2.0 ** 127, 1.5 * 2.0 ** 127, 3.4e38]]).astype(np.float32)
    model = _cast_model(onnx, onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT8E8M0, 25,
                        saturate=saturate, round_mode=mode)
    got = anfir.run(anfir.import_onnx(model).entry, x)
    _same(got, _reference(onnx, model, x))


def test_onnx_packed_initializers_and_castlike() -> None:
    onnx = pytest.importorskip("onnx", reason="onnx.numpy_helper packs 4- and 2-bit tensors")
    from onnx.reference import ReferenceEvaluator
    h, T = onnx.helper, onnx.TensorProto
    # Odd sizes: ONNX packs two 4-bit (four 2-bit) values a byte, the last one padded.
    w4 = onnx.numpy_helper.from_array(np.array([-8, -1, 0, 3, 7], "int4"), "w4")
    w2 = onnx.numpy_helper.from_array(np.array([0, 1, 2, 3, 1, 2, 3], "uint2"), "w2")
    like = onnx.numpy_helper.from_array(np.zeros(1, "float8_e5m2"), "like")
    nodes = [h.make_node("Cast", ["w4"], ["a"], to=T.FLOAT),
             h.make_node("Cast", ["w2"], ["b"], to=T.FLOAT),
             h.make_node("Add", ["a", "x"], ["s"]),
             h.make_node("CastLike", ["s", "like"], ["y"]),
             h.make_node("Identity", ["w4"], ["k"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [5])],
                         [h.make_tensor_value_info("y", T.FLOAT8E5M2, [5]),
                          h.make_tensor_value_info("b", T.FLOAT, [7]),
                          h.make_tensor_value_info("k", T.INT4, [5])],
                         initializer=[w4, w2, like])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 25)])
    x = np.array([0.5, 1e5, -2.0, 0.125, 100.0], np.float32)
    got = anfir.run(anfir.import_onnx(model).entry, x)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    for g, w in zip(got, want):
        _same(g, w)


def test_onnx_export_of_narrow_types() -> None:
    onnx = pytest.importorskip("onnx", reason="the ONNX exporter needs the onnx package")
    from onnx.reference import ReferenceEvaluator
    m = anfir.parse('def main(x: f32[6], k: i4[3]) = (cast(x, "f8e4m3fn"), cast(k, "f32"))')
    model = anfir.export_onnx(m)
    onnx.checker.check_model(model, full_check=True)
    # anfir's cast does not saturate: the exported Cast says so (saturate=0).
    x = np.array([1.0625, -3.3, 500.0, -1e6, np.inf, np.nan], np.float32)
    k = np.array([-8, 1, 7], "int4")
    names = [i.name for i in model.graph.input]
    want = anfir.run(m, x, k)
    got = ReferenceEvaluator(model).run(None, dict(zip(names, (x, k))))
    for g, w in zip(got, want):
        _same(g, w)
    # Element types opset 21 does not have are refused, naming the program's line.
    newer = anfir.parse('def main(x: f32[2]) =\n  cast(cast(x, "f4e2m1"), "f32")')
    with pytest.raises(AnfirError, match="opset 21 has no FLOAT4E2M1 tensors") as info:
        anfir.export_onnx(newer)
    assert info.value.loc is not None and info.value.loc.line == 2


@pytest.mark.parametrize("saturate", [0, 1])
def test_onnx_quantize_linear_to_narrow_types(saturate: int) -> None:
    onnx = pytest.importorskip("onnx", reason="onnx.reference is the reference")
    from onnx.reference import ReferenceEvaluator
    h, T = onnx.helper, onnx.TensorProto
    x = np.array([0.1, -3.0, 250.0, -1e4, 7.5, np.inf], np.float32)
    for to, zero in ((T.FLOAT8E4M3FN, np.zeros(1, "float8_e4m3fn")), (T.FLOAT8E5M2, None),
                     (T.FLOAT4E2M1, np.array([1.0], "float4_e2m1fn")), (T.INT4, np.array([2], "int4")),
                     (T.UINT2, None)):
        inits = [onnx.numpy_helper.from_array(np.array([0.5], np.float32), "scale")]
        inputs = ["x", "scale"]
        if zero is not None:
            inits.append(onnx.numpy_helper.from_array(zero.reshape(()), "zero"))
            inputs.append("zero")
        attrs = {"saturate": saturate} if to in (T.FLOAT8E4M3FN, T.FLOAT8E5M2) else {}
        if zero is None:
            attrs["output_dtype"] = to
        node = h.make_node("QuantizeLinear", inputs, ["y"], **attrs)
        graph = h.make_graph([node], "g", [h.make_tensor_value_info("x", T.FLOAT, [None])],
                             [h.make_tensor_value_info("y", to, [None])], initializer=inits)
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", 25)])
        finite = x[:5] if to in (T.INT4, T.UINT2) else x  # (inf to an integer is undefined)
        got = anfir.run(anfir.import_onnx(model).entry, finite)
        _same(got, ReferenceEvaluator(model).run(None, {"x": finite})[0])


# -- the other back ends --------------------------------------------------------------------
def test_jax_and_the_low_level_compute_the_same_casts() -> None:
    pytest.importorskip("jax", reason="the JAX back end needs jax")
    from anfir.lowlevel.executor import run_low
    m = anfir.parse('def main(x: f32[6], k: i32[6]) =\n'
                    '  (cast(x, "f8e4m3fn"), cast(x, "f8e5m2fnuz"), cast(x, "f4e2m1"), cast(x, "f8e8m0"),'
                    ' cast(k, "i4"), cast(k, "u2"), cast(cast(x, "f8e5m2"), "f32") * 2.0)')
    x = np.array([1.0625, -3.3, 0.2, 200.0, 2.0 ** -8, 5.5], np.float32)
    k = np.array([-9, -1, 0, 3, 7, 100], np.int32)  # integers wrap on every back end
    want = anfir.run(m, x, k)
    for got in (anfir.to_jax(m)(x, k), run_low(anfir.lower(m), x, k)):
        for g, w in zip(got, want):
            _same(np.asarray(g), w)


def test_core_ml_has_no_narrow_tensors() -> None:
    from anfir.errors import ExportError
    from anfir.interop.coreml.exporter import mil_dtype
    for d in NARROW:
        with pytest.raises(ExportError, match=f"Core ML has no tensors of {d}"):
            mil_dtype(d)

"""The element types ops.md adds beyond the seed's: ``bf16`` (bfloat16) and the
complex ``c64``/``c128`` — evaluation against numpy and PyTorch, dtypes kept
end to end, printing and loading back (ANF text and ``.ir`` dumps), and the
errors (complex parts, gradients through complex values, bad dump elements)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import anfir
from anfir.errors import AnfirError, AnfirTypeError, GradientError
from anfir.dtypes import complex_text

BF16 = np.dtype(ml_dtypes.bfloat16)

COMPLEX_PROGRAM = """
def main(a: f32[3], b: f32[3]) =
  let z = complex(a, b) in
  let w = z * conj(z) + exp(z) / (z + 2.0) in
  (real(w), imag(w), abs(z), w)
"""


def _ab(dtype: type) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([1.0, 2.0, -0.5], dtype), np.array([0.5, -1.0, 3.0], dtype))


@pytest.mark.parametrize("dtype, cdtype", [(np.float32, np.complex64), (np.float64, np.complex128)])
def test_complex_values_match_numpy_and_keep_their_width(dtype: type, cdtype: type) -> None:
    src = COMPLEX_PROGRAM.replace("f32[3]", "f32[3]" if dtype is np.float32 else "f64[3]")
    a, b = _ab(dtype)
    re, im, modulus, w = anfir.run(anfir.parse(src), a, b)
    z = a + 1j * b
    want = z * np.conj(z) + np.exp(z) / (z + 2.0)
    assert w.dtype == cdtype and re.dtype == im.dtype == modulus.dtype == dtype
    rtol = 1e-6 if dtype is np.float32 else 1e-13
    np.testing.assert_allclose(w, want, rtol=rtol)
    np.testing.assert_allclose(re, want.real, rtol=rtol)
    np.testing.assert_allclose(im, want.imag, rtol=rtol)
    np.testing.assert_allclose(modulus, np.abs(z), rtol=rtol)


def test_complex_matches_pytorch() -> None:
    torch = pytest.importorskip("torch", reason="PyTorch is the second reference")
    a, b = _ab(np.float64)
    got = anfir.run(anfir.parse(COMPLEX_PROGRAM.replace("f32", "f64")), a, b)[3]
    z = torch.complex(torch.tensor(a), torch.tensor(b))
    want = (z * torch.conj(z) + torch.exp(z) / (z + 2.0)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-13)


def test_python_complex_scalars() -> None:
    m = anfir.parse("def main(x) = let z = complex(x, 2.0) in (z * conj(z), real(z), imag(z), conj(z))")
    zz, re, im, zc = anfir.run(m, 1.5)
    assert (zz, re, im, zc) == (complex(6.25, 0.0), 1.5, 2.0, complex(1.5, -2.0))
    assert type(zz) is complex and type(re) is float
    assert anfir.run(anfir.parse("def main() = (real(2.5), imag(2.5), conj(2.5))")) == (2.5, 0.0, 2.5)


@pytest.mark.parametrize("value", [complex(1.5, -2.0), complex(-0.0, 0.0), complex(0.0, -0.0),
                                   complex(math.inf, math.nan), complex(1e300, -1e-300)])
def test_complex_text_reads_back_exactly(value: complex) -> None:
    back = complex(complex_text(value))
    for got, want in ((back.real, value.real), (back.imag, value.imag)):
        assert (math.isnan(got) and math.isnan(want)) or \
            (got == want and math.copysign(1, got) == math.copysign(1, want))


def _roundtrip_ir(graph: anfir.FuncGraph, tmp_path: object) -> anfir.FuncGraph:
    from pathlib import Path
    path = Path(str(tmp_path)) / "g.ir"
    path.write_text(anfir.dump_ir(graph), encoding="utf-8")
    return anfir.load(str(path))


@pytest.mark.parametrize("dtype", ["c64", "c128", "bf16"])
def test_constants_survive_dump_and_reload(dtype: str, tmp_path: object) -> None:
    # The optimizer folds the constant expression into one tensor constant.
    if dtype == "bf16":
        src = 'def main(x: bf16[3]) = x * cast(array((1.0078125, -3.5, 1e30)), "bf16")'
        x = np.array([1.0, 2.0, 3.0], BF16)
    else:
        src = (f'def main(x: f64[3]) = cast(x, "{dtype}") * (cast(array((1.0, 2.0, 3.0)), "{dtype}")'
               ' * complex(0.5, -0.25))')
        x = np.array([1.0, -2.0, 0.25])
    m = anfir.parse(src)
    want = anfir.run(m, x)
    compiled = anfir.compile(m)
    dump = anfir.dump_ir(compiled)
    assert f"Tensor[{dtype}, (3,)]" in dump  # the folded constant is in the dump
    for graph in (compiled, _roundtrip_ir(compiled, tmp_path)):
        got = anfir.run(graph, x)
        assert got.dtype == want.dtype == np.dtype({"c64": np.complex64, "c128": np.complex128,
                                                    "bf16": BF16}[dtype])
        np.testing.assert_array_equal(got, want)
    # ANF text of the compiled graph parses back and computes the same.
    again = anfir.parse(anfir.to_text(compiled))
    np.testing.assert_array_equal(anfir.run(again, x), want)


def test_a_complex_scalar_constant_in_text_and_dumps(tmp_path: object) -> None:
    m = anfir.parse("def main(x) = x * complex(1.0, -2.5)")
    compiled = anfir.compile(m, args=[2.0])
    assert "complex(1.0, -2.5)" in anfir.to_text(compiled) or "1.0-2.5j" in anfir.dump_ir(compiled)
    assert anfir.run(_roundtrip_ir(compiled, tmp_path), 2.0) == complex(2.0, -5.0)
    assert anfir.run(anfir.parse(anfir.to_text(compiled)), 2.0) == complex(2.0, -5.0)


def test_bf16_cast_rounds_as_pytorch() -> None:
    torch = pytest.importorskip("torch", reason="PyTorch's bfloat16 rounding is the reference")
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(size=200) * 10.0 ** rng.integers(-30, 30, size=200),
                        [1.00390625, 1.01171875, -1.00390625, 3.0e38, 65504.0, 0.0, -0.0]])
    got = anfir.run(anfir.parse('def main(x) = cast(x, "bf16")'), x)
    assert got.dtype == BF16
    want = torch.tensor(x).to(torch.bfloat16).to(torch.float64).numpy()
    np.testing.assert_array_equal(got.astype(np.float64), want)


def test_bf16_arithmetic_stays_bf16_and_differentiates() -> None:
    m = anfir.parse("def f(x: bf16[4]) = sum(tanh(x) * x)")
    x = np.array([0.5, -1.0, 2.0, 0.25], BF16)
    value = anfir.run(m, x)
    assert np.asarray(value).dtype == BF16
    g = anfir.run(anfir.grad(m["f"]), x)
    assert g.dtype == BF16
    x64 = x.astype(np.float64)
    want = np.tanh(x64) + x64 * (1 - np.tanh(x64) ** 2)
    np.testing.assert_allclose(g.astype(np.float64), want, rtol=2 ** -6)


def test_complex_parts_must_be_real() -> None:
    m = anfir.parse("def main(z) = complex(z, 1.0)")
    with pytest.raises(AnfirTypeError, match="complex needs real parts"):
        anfir.run(m, complex(1.0, 1.0))


def test_gradients_through_complex_values_are_refused() -> None:
    m = anfir.parse("def f(x) = real(complex(x, 0.0) * complex(x, 1.0))")
    with pytest.raises(GradientError, match="complex|real"):
        anfir.run(anfir.grad(m["f"]), 1.5)


@pytest.mark.parametrize("body, message", [
    ("Tensor[f32, (2,)]([1.0, 2.0+1.0j])", "is not a f32 value"),
    ("Tensor[c64, (2,)]([1.0, 2.0+1.0jj])", "bad complex number"),
    ("Scalar[i32](1.0+2.0j)", "is not a i32 value"),
])
def test_bad_complex_elements_in_a_dump_are_located(body: str, message: str, tmp_path: object) -> None:
    from pathlib import Path
    good = anfir.dump_ir(anfir.compile(anfir.parse("def main(x: f64) = x * 2.0")))
    bad = good.replace("2.0)", f"{body})", 1) if "2.0)" in good else good.replace(", 2.0", f", {body}", 1)
    assert bad != good
    path = Path(str(tmp_path)) / "bad.ir"
    path.write_text(bad, encoding="utf-8")
    with pytest.raises(AnfirError, match=message) as info:
        anfir.load(str(path))
    assert info.value.loc is not None and info.value.loc.line > 0


def test_a_bf16_program_exports_to_onnx() -> None:
    onnx = pytest.importorskip("onnx", reason="the ONNX exporter needs the onnx package")
    from onnx.reference import ReferenceEvaluator
    m = anfir.parse("def main(x: bf16[3]) = x * x + x")
    model = anfir.export_onnx(m)
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.BFLOAT16
    x = np.array([0.5, -1.5, 3.0], BF16)
    (got,) = ReferenceEvaluator(model).run(None, {model.graph.input[0].name: x})
    np.testing.assert_array_equal(np.asarray(got).astype(np.float64),
                                  anfir.run(m, x).astype(np.float64))

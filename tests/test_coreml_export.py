"""Core ML export (issue 15, the MIL half): every program converts with
``coremltools.convert(..., convert_to="mlprogram")``, saves as an ``.mlpackage``
and loads back (``coremltools.utils.load_spec``) declaring the expected function,
input and output names, dtypes and shapes.

Core ML prediction needs macOS.  What the MIL ops compute is checked here with
coremltools itself: a program built with its inputs as constants is evaluated
by each MIL op's value inference (coremltools' numpy reference of the op), and
compared with ``anfir.run`` / the primitive's ``impl`` (float32 tolerances: Core
ML computes f64 as fp32).  ``while_loop`` has no value inference: ``evaluate``
unrolls loops (their numbers: tests/test_coreml_loops.py).

The module skips where coremltools is not installed (``pip install -e ".[coreml]"``).
"""

from __future__ import annotations

import gc
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ct = pytest.importorskip("coremltools",
                         reason='the coreml extra is not installed: pip install -e ".[coreml]"')

import anfir  # noqa: E402
from mil_reference import gather_nd, scatter_nd  # noqa: E402
import spec_examples  # noqa: E402
from anfir.abstract.lattice import abstract_of_value  # noqa: E402
from anfir.abstract.values import AScalar, ATensor, ATuple  # noqa: E402
from anfir.flat import flatten  # noqa: E402
from anfir.interop.coreml import exporter as coreml_export  # noqa: E402
from anfir.interop.coreml.exporter import RULES, UNSUPPORTED, MilWriter  # noqa: E402
from anfir.flat.statements import (  # noqa: E402
    DIM, PSEUDO_PRIMITIVES, Block, Const, FlatProgram, NameAllocator, Op, Value, shape_of_type,
)
from anfir.primitives import PRIMITIVES  # noqa: E402
from anfir.decompositions import DECOMPOSITIONS  # noqa: E402
from cli_harness import run_in_process  # noqa: E402
from export_samples import CNN, EXAMPLE_EXPORTS, SAMPLES, A, S, cnn_data  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _frozen_heap() -> Any:
    # coremltools calls gc.collect() as it converts and saves; late in the suite the
    # process holds millions of objects and each such collection took ~6 s (a test
    # alone takes ~1 s). Frozen, the objects made before this module are not scanned.
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

RTOL, ATOL = 2e-5, 1e-6
"""float32 against anfir's float64."""


def assert_close(want: Any, got: Any, where: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    """``got`` (Core ML's fp32/int32) equals ``want`` (anfir's f64/i64) as numbers, nested alike."""
    stack = [(want, got)]
    while stack:
        w, g = stack.pop()
        if isinstance(w, tuple):
            assert isinstance(g, tuple) and len(g) == len(w), (where, w, g)
            stack.extend(zip(w, g))
            continue
        w_arr, g_arr = np.asarray(w), np.asarray(g)
        assert w_arr.shape == g_arr.shape, (where, w_arr.shape, g_arr.shape)
        if w_arr.dtype == bool:
            np.testing.assert_array_equal(g_arr.astype(bool), w_arr, err_msg=where)
            continue
        np.testing.assert_allclose(g_arr.astype(np.float64), w_arr.astype(np.float64), rtol=rtol,
                                   atol=atol, equal_nan=True, err_msg=where)


def saved(program: Any, tmp_path: Path, name: str = "model") -> dict[str, Any]:
    """Convert (float32), save as an .mlpackage, load the spec back: what it declares."""
    path = tmp_path / f"{name}.mlpackage"
    coreml_export.to_mlmodel(program).save(str(path))
    assert path.is_dir()
    described = coreml_export.describe(str(path))
    assert described["functions"] == ["main"]
    return described


# -- the rule table --------------------------------------------------------------------------
def test_every_primitive_has_a_rule_or_a_reason() -> None:
    # or a decomposition (anfir/decompositions/) the exporter runs for what it does not keep
    decomposed = set(DECOMPOSITIONS) - set(coreml_export.NATIVE)
    handled = set(flatten.WALKER_ONLY) | set(RULES) | set(UNSUPPORTED) | decomposed
    missing = [p.name for p in [*PRIMITIVES.values(), *PSEUDO_PRIMITIVES] if p not in handled]
    assert not missing, f"primitives with no MIL rule, no walker rule, no decomposition and no reason: {missing}"
    assert set(coreml_export.NATIVE) <= set(RULES), "a kept composite needs its rule"
    assert all(reason.strip() for reason in UNSUPPORTED.values())
    assert not set(RULES) & set(UNSUPPORTED)
    assert not set(flatten.WALKER_ONLY) & set(RULES)
    assert set(flatten.STRUCTURAL) - set(flatten.WALKER_ONLY) <= set(RULES)


def _raw(arg: Any) -> Any:
    if isinstance(arg, S):
        return arg.value
    if isinstance(arg, tuple):
        return tuple(_raw(a) for a in arg)
    return arg


def one_op_values(prim: Any, args: tuple[Any, ...]) -> Any:
    """What coremltools' value inference computes for ``prim(*args)`` written by its rule."""
    names = NameAllocator()
    block = Block()
    inputs: list[Value] = []
    feeds: dict[str, Any] = {}
    abstracts: list[Any] = []

    def operand(arg: Any) -> Any:
        if isinstance(arg, S):
            abstracts.append(abstract_of_value(arg.value))
            return Const(arg.value)
        if isinstance(arg, tuple):
            return tuple(operand(a) for a in arg)
        a = abstract_of_value(arg)
        t = a if isinstance(a, ATensor) else AScalar(a.dtype)
        value = Value(names.take(f"a{len(inputs)}"), t, block)
        inputs.append(value)
        feeds[value.name] = arg
        return value

    given = args[-1].attrs if args and isinstance(args[-1], A) else {}
    attrs = prim.bound_attrs(given) if prim.attrs else {}
    operands = []
    for arg in args:
        if isinstance(arg, A):
            continue
        before = len(abstracts)
        operands.append(operand(arg))
        if len(abstracts) == before:
            abstracts.append(abstract_of_value(_raw(arg)))
    if prim is DIM:
        result_type: Any = AScalar("i64")
    else:
        result_type = prim.infer(*abstracts, **attrs)
    # A tuple-valued primitive (split, topk) has a result per item.
    types = list(result_type.items) if isinstance(result_type, ATuple) else [result_type]
    types = [t if isinstance(t, ATensor) else AScalar(t.dtype) for t in types]
    results = [Value(names.take("result"), t, block) for t in types]
    block.ops.append(Op(prim, tuple(operands), tuple(results), None, attrs))
    block.results = results
    outputs = [f"output_{k}" for k in range(len(results))]
    flat = FlatProgram("op", inputs, [v.name for v in inputs], block, outputs, list(outputs),
                       types, names)
    program = MilWriter(ct, flat, REFERENCE_OPS).program(feeds)
    got = []
    for out, t in zip(program.functions["main"].outputs, types):
        assert out.val is not None, f"{prim.name}: coremltools cannot compute {out.op.op_type}"
        value = np.asarray(out.val)
        got.append(value.reshape(()) if shape_of_type(t) == () else value)
    return tuple(got) if isinstance(result_type, ATuple) else got[0]


# -- the MIL ops coremltools infers no value for, computed by PyTorch and numpy -------------
def _torch_pads(pad: np.ndarray) -> list[int]:
    """MIL's (begin, end) pairs, first spatial axis first, as torch.nn.functional.pad's
    (last axis first)."""
    pairs = [(int(pad[2 * k]), int(pad[2 * k + 1])) for k in range(len(pad) // 2)]
    return [p for pair in reversed(pairs) for p in pair]


def _conv(x: Any, weight: Any, strides: Any, pad_type: str, pad: Any, dilations: Any, groups: Any,
          bias: Any = None) -> np.ndarray:
    torch = pytest.importorskip("torch", reason="torch computes the MIL convolutions here")
    functional = torch.nn.functional
    n = weight.ndim - 2
    assert pad_type == "custom"
    xt = functional.pad(torch.tensor(x), _torch_pads(pad))
    run = [functional.conv1d, functional.conv2d, functional.conv3d][n - 1]
    return run(xt, torch.tensor(weight), None if bias is None else torch.tensor(bias),
               stride=tuple(int(s) for s in strides), dilation=tuple(int(d) for d in dilations),
               groups=int(groups)).numpy()


def _conv_transpose(x: Any, weight: Any, strides: Any, pad_type: str, pad: Any, dilations: Any,
                    groups: Any, output_shape: Any, bias: Any = None) -> np.ndarray:
    """PyTorch's full transposed convolution, cropped by the begin pads to output_shape
    (zeros past its end, as an output_padding gives)."""
    torch = pytest.importorskip("torch", reason="torch computes the MIL convolutions here")
    functional = torch.nn.functional
    n = weight.ndim - 2
    assert pad_type == "custom"
    run = [functional.conv_transpose1d, functional.conv_transpose2d,
           functional.conv_transpose3d][n - 1]
    full = run(torch.tensor(x), torch.tensor(weight), None, stride=tuple(int(s) for s in strides),
               dilation=tuple(int(d) for d in dilations), groups=int(groups)).numpy()
    want = [int(s) for s in output_shape][2:]
    begins = [int(pad[2 * k]) for k in range(n)]
    grow = [(0, 0), (0, 0)] + [(0, max(b + m - f, 0)) for b, m, f in zip(begins, want, full.shape[2:])]
    full = np.pad(full, grow)
    out = full[(slice(None), slice(None), *(slice(b, b + m) for b, m in zip(begins, want)))]
    if bias is not None:
        out = out + np.asarray(bias).reshape((-1,) + (1,) * n)
    return out


def _pool(x: Any, kernel_sizes: Any, strides: Any, pad_type: str, pad: Any, fill: float,
          ceil_mode: bool = False) -> Any:
    torch = pytest.importorskip("torch", reason="torch computes the MIL pools here")
    assert pad_type == "custom" and not ceil_mode
    return torch.nn.functional.pad(torch.tensor(x), _torch_pads(pad), value=fill), \
        tuple(int(k) for k in kernel_sizes), tuple(int(s) for s in strides)


def _max_pool(x: Any, kernel_sizes: Any, strides: Any, pad_type: str, pad: Any,
              ceil_mode: bool = False) -> np.ndarray:
    torch = pytest.importorskip("torch", reason="torch computes the MIL pools here")
    xt, k, st = _pool(x, kernel_sizes, strides, pad_type, pad, -np.inf, ceil_mode)
    functional = torch.nn.functional
    return [functional.max_pool1d, functional.max_pool2d, functional.max_pool3d][len(k) - 1](
        xt, k, st).numpy()


def _avg_pool(x: Any, kernel_sizes: Any, strides: Any, pad_type: str, pad: Any,
              exclude_padding_from_average: bool = False, ceil_mode: bool = False) -> np.ndarray:
    """Window sums (a mean over zero-padded windows times their size) over the cell count:
    the kernel's, or the cells of x in the window."""
    torch = pytest.importorskip("torch", reason="torch computes the MIL pools here")
    functional = torch.nn.functional
    xt, k, st = _pool(x, kernel_sizes, strides, pad_type, pad, 0.0, ceil_mode)
    run = [functional.avg_pool1d, functional.avg_pool2d, functional.avg_pool3d][len(k) - 1]
    total = run(xt, k, st).numpy() * float(np.prod(k))
    if not exclude_padding_from_average:
        return total / float(np.prod(k))
    ones, _, _ = _pool(np.ones_like(x), kernel_sizes, strides, pad_type, pad, 0.0, ceil_mode)
    return total / (run(ones, k, st).numpy() * float(np.prod(k)))


def _scatter(data: Any, indices: Any, updates: Any, axis: Any, mode: str) -> np.ndarray:
    assert mode == "add"
    out = np.moveaxis(np.array(data), int(axis), 0)
    np.add.at(out, np.asarray(indices), np.moveaxis(np.asarray(updates), int(axis), 0))
    return np.moveaxis(out, 0, int(axis))


def _scatter_along_axis(data: Any, indices: Any, updates: Any, axis: Any, mode: str) -> np.ndarray:
    assert mode == "add"
    out = np.array(data)
    index = np.asarray(indices)
    grid = list(np.indices(index.shape, sparse=True))
    grid[int(axis)] = index
    np.add.at(out, tuple(grid), np.asarray(updates))
    return out


def test_coremltools_scatter_along_axis_inference_ignores_add() -> None:
    """Why scatter_along_axis has an evaluator above: coremltools' own value inference
    puts the updates (a repeated index keeps the last) where mode="add" adds them (when
    this fails, coremltools fixed it and the evaluator can go)."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function

    with Function({}, opset_version=ct.target.iOS17):
        var = mb.scatter_along_axis(data=np.zeros(3, np.float32), indices=np.array([1, 1], np.int32),
                                    updates=np.array([2.0, 5.0], np.float32), axis=0, mode="add")
        assert var.val is not None and var.val[1] != 7.0
    assert _scatter_along_axis(np.zeros(3), np.array([1, 1]), np.array([2.0, 5.0]), 0, "add")[1] == 7.0


def _silu(x: Any) -> np.ndarray:
    x = np.asarray(x)
    return x / (1 + np.exp(-x))


REFERENCE_OPS = {"conv": _conv, "conv_transpose": _conv_transpose, "max_pool": _max_pool,
                 "avg_pool": _avg_pool, "scatter": _scatter, "gather_nd": gather_nd,
                 "scatter_nd": scatter_nd, "scatter_along_axis": _scatter_along_axis,
                 "silu": _silu}
"""MIL op → its value by its documented meaning, where coremltools has no value inference
(PyTorch's convolutions and pools, numpy's indexing and silu) or one that is wrong
(``scatter_along_axis`` puts where ``mode="add"`` adds)."""


def _fits_32_bits(args: tuple[Any, ...]) -> bool:
    """Core ML has no f64 range: samples beyond float32's (exp(800)...) are f64-only."""
    for arg in args:
        raw = _raw(arg)
        if isinstance(raw, (np.ndarray, float)) and np.any(np.abs(np.asarray(raw, float)) > 80) \
                and np.all(np.isfinite(np.asarray(raw, float))):
            return False
    return True


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the samples divide by 0 on purpose
@pytest.mark.parametrize("prim", sorted(RULES, key=lambda p: p.name), ids=lambda p: p.name)
def test_each_rule_computes_the_primitive(prim: Any) -> None:
    samples = SAMPLES.get(prim)
    assert samples, f"add sample arguments for {prim.name} to export_samples.SAMPLES"
    checked = 0
    for args in samples:
        if not _fits_32_bits(args):
            continue
        given = args[-1].attrs if args and isinstance(args[-1], A) else {}
        want = prim.impl(*[_raw(a) for a in args if not isinstance(a, A)], **given)
        if prim.name == "switch" and np.ndim(_raw(args[1])) != np.ndim(_raw(args[2])):
            # A value whose rank depends on a condition has no MIL type.
            with pytest.raises(anfir.AnfirError, match="different ranks"):
                one_op_values(prim, args)
            continue
        got = one_op_values(prim, args)
        if isinstance(want, tuple):
            want = tuple(np.asarray(item) for item in want)
        if prim.name in _CLAMPED_LOG:
            # MIL's log is log(x + 1e-45) in float32: log(0) is -103.28, not -inf.
            want = np.where(np.isneginf(want), np.log(np.float32(1e-45)), want)
        where = f"{prim.name}{tuple(np.shape(_raw(a)) for a in args if not isinstance(a, A))} {given}"
        assert_close(want, got, where, rtol=1e-4 if prim.name in _LOOSE else RTOL)
        checked += 1
    assert checked


_CLAMPED_LOG = {"log", "log1p", "logsumexp"}

_LOOSE = {"pow", "sinh", "cosh", "var", "std", "norm", "logsumexp", "tan", "prod", "expm1",
          "log1p", "selu", "elu"}
"""Rules whose fp32 result may be several ulps from the f64 one (cancellation in a composite)."""


# -- the bundled examples ------------------------------------------------------------------------
# Of the transformer's definitions, the gradient alone (its forward pass is in it): the
# others cost seconds each and check the same rules. Of the ResNet's, the forward and the
# loss: its gradient converts too (8 s), with the operators of the CNN gradient that
# test_the_cnn_gradient_exports_and_matches_anfir_and_pytorch converts in a second.
@pytest.mark.parametrize("key", sorted(k for k in EXAMPLE_EXPORTS
                                       if k not in (("resnet18", "resnet18_grad"),)
                                       and (k[0] != "transformer" or k[1] == "block_grad")),
                         ids=lambda k: f"{k[0]}.{k[1]}")
def test_example_exports_to_an_mlpackage(key: tuple[str, str], tmp_path: Path) -> None:
    args, runs, onnx_ops = EXAMPLE_EXPORTS[key]
    module = anfir.load(str(EXAMPLES / f"{key[0]}.anf"))
    program = anfir.export_coreml(module, entry=key[1], args=args)
    described = saved(program, tmp_path)
    graph = anfir.compile(module, entry=key[1], args=args)
    flat = flatten.flatten_program(graph)
    assert [i["name"] for i in described["inputs"]] == [v.name for v in flat.inputs]
    assert [o["name"] for o in described["outputs"]] == flat.output_names
    ops = described["op_types"]
    if "Loop" in onnx_ops:
        assert "while_loop" in ops, ops
    else:
        for run in runs:
            want = anfir.run(anfir.compile(module, entry=key[1], args=list(run)), *run)
            got = coreml_export.evaluate(module, key[1], run, REFERENCE_OPS)
            assert_close(want, got, f"{key} {run}", rtol=1e-4, atol=1e-5)
    if "If" in onnx_ops:
        assert "cond" in ops or "select" in ops, ops


# -- control flow ----------------------------------------------------------------------------
CONTROL = anfir.parse("""
def piecewise(x) = if x > 0.0 then x * x else sin(x)
def halve(x: f64[N]) = if sum(x) > 1.0 then (x * 0.5, 1) else (x, 0)
def newton(a) =
  let loop = lambda (x, k) if k == 0 then x else loop(0.5 * (x + a / x), k - 1) end in
  loop(a, 20)
""", filename="control.anf")


def test_if_is_a_mil_cond(tmp_path: Path) -> None:
    program = anfir.export_coreml(CONTROL, entry="halve")
    described = saved(program, tmp_path)
    assert "cond" in described["op_types"]
    assert described["inputs"] == [{"name": "x", "dtype": "FLOAT32", "shape": [None]}]
    assert [o["name"] for o in described["outputs"]] == ["output_0", "output_1"]
    assert [o["dtype"] for o in described["outputs"]] == ["FLOAT32", "INT32"]
    for x in (np.array([0.25, 0.5, 1.0]), np.array([0.1, 0.2])):
        want = anfir.run(anfir.compile(CONTROL, entry="halve", args=[x]), x)
        assert_close(want, coreml_export.evaluate(CONTROL, "halve", [x]), "halve")


def test_the_gradient_of_if_exports(tmp_path: Path) -> None:
    graph = anfir.grad(CONTROL["piecewise"])
    described = saved(anfir.export_coreml(graph, args=[1.0]), tmp_path)
    assert described["inputs"] == [{"name": "x", "dtype": "FLOAT32", "shape": [1]}]
    assert described["outputs"][0]["shape"] == [1]
    for x in (1.5, -0.75):
        want = anfir.run(anfir.compile(graph, args=[x]), x)
        assert_close(want, coreml_export.evaluate(graph, None, [x]), f"grad piecewise {x}")


def test_a_data_dependent_loop_is_a_mil_while_loop(tmp_path: Path) -> None:
    program = anfir.export_coreml(CONTROL, entry="newton", args=[2.0])
    text = str(program)
    assert "while_loop" in text
    described = saved(program, tmp_path)
    assert described["op_types"].count("while_loop") == 1
    assert described["inputs"] == [{"name": "a", "dtype": "FLOAT32", "shape": [1]}]
    loop = anfir.export_coreml(anfir.load(str(EXAMPLES / "loop.anf")), entry="halvings", args=[5.0])
    ops = saved(loop, tmp_path, "halvings")["op_types"]
    assert "while_loop" in ops and "cond" in ops


def test_evaluate_unrolls_a_loop_by_value_inference() -> None:
    want = anfir.run(anfir.compile(CONTROL, entry="newton", args=[2.0]), 2.0)
    assert_close(want, coreml_export.evaluate(CONTROL, "newton", [2.0]), "newton")


# -- the MLP loss and its gradient ----------------------------------------------------------------
def _mlp_data(seed: int) -> tuple[np.ndarray, ...]:
    data = np.random.default_rng(seed)
    return (data.normal(size=(3, 8)), data.normal(size=(8, 2)), data.normal(size=(16, 3)),
            data.normal(size=(16, 2)))


def test_the_mlp_gradient_exports_with_symbolic_dims(tmp_path: Path) -> None:
    mlp = anfir.parse(spec_examples.MLP)["mlp_loss"]
    graph = anfir.value_and_grad(mlp, wrt=(0, 1))
    program = anfir.export_coreml(graph)
    main = program.functions["main"]
    # The annotations' dimensions are MIL symbols of the same names.
    assert [tuple(str(d) for d in v.shape) for v in main.inputs.values()] == [
        ("D", "H"), ("H", "K"), ("B", "D"), ("B", "K")]
    described = saved(program, tmp_path)
    assert [i["name"] for i in described["inputs"]] == ["w1", "w2", "x", "y"]
    assert all(i["dtype"] == "FLOAT32" and i["shape"] == [None, None] for i in described["inputs"])
    assert [o["name"] for o in described["outputs"]] == ["output_0", "output_1_0", "output_1_1"]
    assert described["metadata"]["anfir.outputs"] == '["output_0", ["output_1_0", "output_1_1"]]'
    assert "matmul" in described["op_types"]
    for seed in (1, 2):
        args = _mlp_data(seed)
        want = anfir.run(anfir.compile(graph, args=list(args)), *args)
        assert_close(want, coreml_export.evaluate(graph, None, args), f"seed {seed}", rtol=1e-4,
                     atol=1e-4)


def test_the_mlp_gradient_matches_pytorch_autograd() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    mlp = anfir.parse(spec_examples.MLP)["mlp_loss"]
    w1, w2, x, y = _mlp_data(3)
    tw1, tw2 = (torch.tensor(w, dtype=torch.float32, requires_grad=True) for w in (w1, w2))
    tx, ty = torch.tensor(x, dtype=torch.float32), torch.tensor(y, dtype=torch.float32)
    loss = ((torch.tanh(tx @ tw1) @ tw2 - ty) ** 2).sum() / 2
    loss.backward()
    assert tw1.grad is not None and tw2.grad is not None
    value, (g1, g2) = coreml_export.evaluate(anfir.value_and_grad(mlp, wrt=(0, 1)), None,
                                             (w1, w2, x, y))
    np.testing.assert_allclose(value, loss.item(), rtol=1e-5)
    np.testing.assert_allclose(g1, tw1.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(g2, tw2.grad.numpy(), rtol=1e-4, atol=1e-5)


TRAINER = anfir.parse((EXAMPLES / "mlp.anf").read_text() + """
def step(w1, w2, x, y, rate) =
  let vg = value_and_grad(mlp_loss, 0, 1)(w1, w2, x, y) in
  (vg[0], w1 - rate * vg[1][0], w2 - rate * vg[1][1])
""", filename="train.anf")


def test_a_training_step_exports_and_its_steps_lower_the_loss(tmp_path: Path) -> None:
    types = ["f64[D, H]", "f64[H, K]", "f64[B, D]", "f64[B, K]", "f64"]
    described = saved(anfir.export_coreml(TRAINER, entry="step", args=types), tmp_path)
    assert [i["name"] for i in described["inputs"]] == ["w1", "w2", "x", "y", "rate"]
    assert described["inputs"][-1]["shape"] == [1]
    data = np.random.default_rng(0)
    x = np.linspace(-2, 2, 24).reshape(24, 1) * np.ones((1, 2))
    y = np.sin(x[:, :1])
    w1, w2 = data.normal(size=(2, 8)) * 0.5, data.normal(size=(8, 1)) * 0.5
    losses = []
    for _ in range(15):
        loss, w1, w2 = coreml_export.evaluate(TRAINER, "step", (w1, w2, x, y, 0.01))
        losses.append(loss)
        w1, w2 = w1.astype(np.float64), w2.astype(np.float64)  # Core ML's fp32, fed back
    assert losses[-1] < 0.7 * losses[0], losses


# -- a CNN loss (conv, pooling, linear) and its gradient ---------------------------------------
def test_the_cnn_gradient_exports_and_matches_anfir_and_pytorch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
    functional = torch.nn.functional
    module = anfir.parse(CNN, filename="cnn.anf")
    graph = anfir.value_and_grad(module["cnn_loss"], wrt=(0, 1, 2, 3, 4))
    args = cnn_data(5)
    described = saved(anfir.export_coreml(graph, args=list(args)), tmp_path)
    assert [i["name"] for i in described["inputs"]] == ["w1", "b1", "w2", "w3", "b3", "x", "y"]
    assert [i["shape"] for i in described["inputs"]] == [list(a.shape) for a in args]
    assert all(i["dtype"] == "FLOAT32" for i in described["inputs"])
    assert [o["shape"] for o in described["outputs"]] == [[1], *[list(a.shape) for a in args[:5]]]
    # conv's weight gradient is a conv, its input gradient and the pooling gradients
    # conv_transposes; max pooling's gradient picks from the stacked windows.
    assert {"conv", "conv_transpose", "max_pool", "avg_pool", "reduce_argmax"} <= set(
        described["op_types"])
    value, grads = coreml_export.evaluate(graph, None, args, REFERENCE_OPS)
    want_value, want_grads = anfir.run(anfir.compile(graph, args=list(args)), *args)
    assert_close((want_value, want_grads), (value, grads), "cnn", rtol=1e-4, atol=1e-6)
    params = [torch.tensor(a, requires_grad=True) for a in args[:5]]
    w1, b1, w2, w3, b3 = params
    h1 = functional.max_pool2d(torch.relu(functional.conv2d(torch.tensor(args[5]), w1, b1,
                                                            padding=1)), 2)
    h2 = torch.tanh(functional.conv2d(functional.pad(h1, (1, 0, 1, 0)), w2, stride=(1, 2)))
    p2 = functional.avg_pool2d(h2, 2, padding=(1, 0), count_include_pad=False)
    loss = ((p2.reshape(p2.shape[0], 12) @ w3 + b3 - torch.tensor(args[6])) ** 2).mean()
    loss.backward()
    np.testing.assert_allclose(value, loss.item(), rtol=1e-5)
    for got, param in zip(grads, params):
        assert param.grad is not None
        np.testing.assert_allclose(got, param.grad.numpy(), rtol=1e-4, atol=1e-6)


def test_a_cnn_with_a_symbolic_batch_exports() -> None:
    """Convolutions and pools need static channels and spatial sizes; the batch may be
    a symbol (a flexible dimension of the model)."""
    module = anfir.parse("""
def f(x: f32[B, 2, 7, 6], w: f32[4, 2, 3, 3], v: f32[4, 2, 2, 2]) =
  let h = relu(conv(x, w, padding=1)) in
  (max_pool(h, 2), avg_pool(h, 3, 2, padding=1, ceil_mode=true), conv(x, v, dilation=2),
   max_pool(h, 2, 1, dilation=2))
""", filename="batch.anf")
    program = anfir.export_coreml(module, entry="f")
    outputs = program.functions["main"].outputs
    # The batch stays a symbol (MIL names it afresh after a slice with end_mask or a stack).
    assert str(outputs[0].shape[0]) == "B" and not any(isinstance(v.shape[0], int) for v in outputs)
    assert [tuple(v.shape[1:]) for v in outputs] == [(4, 3, 3), (4, 4, 4), (4, 5, 4), (4, 5, 4)]
    assert [str(d) for d in program.functions["main"].inputs["x"].shape] == ["B", "2", "7", "6"]
    data = np.random.default_rng(6)
    args = [data.normal(size=s).astype(np.float32) for s in [(3, 2, 7, 6), (4, 2, 3, 3), (4, 2, 2, 2)]]
    want = anfir.run(anfir.compile(module, entry="f", args=args), *args)
    assert_close(want, coreml_export.evaluate(module, "f", args, REFERENCE_OPS), "batch 3",
                 rtol=1e-4, atol=1e-5)


# -- errors, metadata, the command line -------------------------------------------------------
def test_what_core_ml_cannot_express_is_a_located_error() -> None:
    mod = anfir.parse("def f(a, b) = bitwise_and(a, b) + 1\n", filename="bits.anf")
    with pytest.raises(anfir.AnfirError) as info:
        anfir.export_coreml(mod, args=[np.array([1, 2]), np.array([3, 1])])
    err = info.value
    assert err.kind == "export error" and "bitwise" in err.message
    assert err.loc is not None and err.loc.file == "bits.anf"
    fib = anfir.load(str(EXAMPLES / "fibonacci.anf"))
    with pytest.raises(anfir.AnfirError) as info:
        anfir.export_coreml(fib, args=[10])
    assert "fibonacci.anf" in info.value.render()


def test_metadata_goes_into_the_model(tmp_path: Path) -> None:
    program = anfir.export_coreml(anfir.load(str(EXAMPLES / "mlp.anf")))
    meta = saved(program, tmp_path)["metadata"]
    assert meta["anfir.entry"] == "mlp_loss" and meta["anfir.source"].endswith("mlp.anf")
    assert meta["anfir.inputs"] == '["w1", "w2", "x", "y"]'
    assert "f64[B, D]" in meta["anfir.signature"]


def test_the_command_line_exports_an_mlpackage(tmp_path: Path) -> None:
    out = tmp_path / "sqrt.mlpackage"
    status, stdout, stderr = run_in_process(
        ["export", str(EXAMPLES / "loop.anf"), "--entry", "newton_sqrt", "--args", "2.0",
         "--to", "coreml", "-o", str(out)], tmp_path)
    assert status == 0, stderr
    assert stdout.startswith("exported @newton_sqrt to ") and "while_loop" in stdout, stdout
    described = coreml_export.describe(str(out))
    assert described["inputs"] == [{"name": "a", "dtype": "FLOAT32", "shape": [1]}]
    status, _, stderr = run_in_process(
        ["export", str(EXAMPLES / "mlp.anf"), "--to", "coreml", "-o", str(tmp_path / "m.onnx")],
        tmp_path)
    assert status == 2 and ".mlpackage" in stderr
    status, _, stderr = run_in_process(
        ["export", str(EXAMPLES / "fibonacci.anf"), "--args", "10", "--to", "coreml",
         "-o", str(tmp_path / "f.mlpackage")], tmp_path)
    assert status == 1 and "export error" in stderr and "Traceback" not in stderr
    assert not (tmp_path / "f.mlpackage").exists()


# -- the op library's table, and generated programs, through the whole pipeline ---------------
def compare_with_anfir(module: Any, entry: str, args: list[Any], rtol: float = 1e-4,
                       atol: float = 1e-4) -> None:
    """The exported program, evaluated by coremltools, computes what anfir does; or it is
    an export error that names a primitive MIL cannot express (and why)."""
    want = anfir.run(anfir.compile(module, entry=entry, args=args), *args)
    try:
        got = coreml_export.evaluate(module, entry, args, REFERENCE_OPS)
    except anfir.AnfirError as err:
        assert err.kind == "export error" and err.loc is not None, err.render()
        assert any(reason in err.message for reason in UNSUPPORTED.values()), err.message
        return
    assert_close(want, got, f"{entry}{tuple(np.shape(a) for a in args)}", rtol=rtol, atol=atol)


from ops_table import BINARY, INTEGER, PREDICATES, REDUCTIONS, UNARY  # noqa: E402

_CASES = [*UNARY, *BINARY, *PREDICATES, *INTEGER]


def _draw(op: Any, shape: tuple[int, ...], seed: int) -> np.ndarray:
    data = np.random.default_rng(seed)
    if op.kind == "int":
        return data.integers(1, 6, size=shape)
    if op.kind == "bool":
        return data.integers(0, 2, size=shape).astype(bool)
    return data.uniform(op.low, op.high, size=shape)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("op", _CASES, ids=lambda o: o.id)
def test_library_operator_exports_with_its_gradient(op: Any) -> None:
    params = ", ".join("xy"[:op.nargs])
    call = op.call.format(x="x", y="y")
    args = [_draw(op, (2, 3), 1), _draw(op, (3,), 2)][:op.nargs]
    text = f"def f({params}) = {call}\n"
    if op.grad:
        text += (f"def g({params}) = grad(lambda ({params}) sum(sin({call})) end, "
                 f"{', '.join(str(i) for i in range(op.nargs))})({params})\n")
    module = anfir.parse(text, f"{op.id}.anf")
    compare_with_anfir(module, "f", args)
    if op.grad:
        compare_with_anfir(module, "g", args)


def _literal(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and np.isinf(value):
        return "1e999"
    return repr(value)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("red", REDUCTIONS, ids=lambda r: r.id)
def test_library_reduction_exports_with_its_gradient(red: Any) -> None:
    extra = "".join(f", {k}={_literal(v)}" for k, v in red.kw)
    defs = []
    for k, (axis, keepdims) in enumerate([(None, False), (1, True), ((0, 2), False), (-1, False)]):
        call = f"{red.name}({red.arg}, axis={_literal(axis)}, keepdims={_literal(keepdims)}{extra})"
        defs.append(f"def f{k}(x) = {call}")
        if red.grad:
            defs.append(f"def g{k}(x) = grad(lambda (y) sum(sin({call.replace('(x', '(y')})) end)(x)")
    module = anfir.parse("\n".join(defs) + "\n", f"{red.id}.anf")
    x = np.random.default_rng(3).uniform(red.low, red.high, size=(2, 3, 4))
    for name in module.graphs:
        compare_with_anfir(module, name, [x])


NOTEBOOK = anfir.parse("""
def f(x, y) = sin(x) * y + x * x
def piecewise(x) = if x > 0.0 then x * x else sin(x)
def a(x) = tanh(x) * exp(-x * x) + sqrt(x * x + 1.0)
def c(x) = (lambda (g) g(g(x)) end)(lambda (y) y * y + x end)
def choose(k, x) =
  let f = if k > 0 then (lambda (y) y * x end) else (lambda (y) y + x end) in
  f(x) * 2.0
""", filename="notebooks.anf")


@pytest.mark.parametrize("name,args", [
    ("f", [0.5, 2.0]), ("piecewise", [1.5]), ("piecewise", [-0.5]), ("a", [0.3]), ("c", [1.25]),
    ("choose", [1, 3.0]), ("choose", [-1, 3.0]),
])
def test_notebook_programs_and_their_gradients(name: str, args: list[Any]) -> None:
    compare_with_anfir(NOTEBOOK, name, args)
    floats = [i for i, a in enumerate(args) if isinstance(a, float)]
    compare_with_anfir(anfir.grad(NOTEBOOK[name], wrt=tuple(floats)), None, args)


def test_export_is_deterministic() -> None:
    mlp = anfir.parse(spec_examples.MLP)["mlp_loss"]

    def text() -> str:
        # coremltools numbers blocks with a process-wide counter; the rest is anfir's naming.
        return re.sub(r"block\d+", "block", str(anfir.export_coreml(anfir.value_and_grad(
            mlp, wrt=(0, 1)))))

    first = text()
    assert text() == first and "matmul" in first


# -- shapes known only at run time -----------------------------------------------------------
SYMBOLIC = anfir.parse("""
def run(x: f64[N, 2], steps: i64) =
  let loop = lambda (k, state)
    if k == 0 then state
    else loop(k - 1, (state[0] * 0.5 + 1.0, state[1] + sum(state[0]))) end in
  loop(steps, (x, 0.0))
def f(x: f64[N, 3]) =
  let flat = reshape(x, (shape(x)[0] * 3,)) in
  (flat, zeros(shape(x)), mean(x), broadcast_to(sum(x, 0), shape(x)))
def h(w: f64[3], x: f64[N, 3]) = if sum(w) > 0.0 then sum(sin(x * w)) else sum(x @ w)
def gh(w: f64[3], x: f64[N, 3]) = grad(h)(w, x)
def loss(w: f64[3], x: f64[N, 3]) =
  mean(sin(x * w) + reshape(x, (3, shape(x)[0])) @ ones((shape(x)[0],)))
def gloss(w: f64[3], x: f64[N, 3]) = grad(loss)(w, x)
""", filename="symbolic.anf")


def test_a_loop_carrying_a_tensor_of_symbolic_shape(tmp_path: Path) -> None:
    described = saved(anfir.export_coreml(SYMBOLIC, entry="run"), tmp_path)
    assert described["inputs"] == [{"name": "x", "dtype": "FLOAT32", "shape": [None, 2]},
                                   {"name": "steps", "dtype": "INT32", "shape": [1]}]
    assert {"cond", "while_loop"} <= set(described["op_types"])


@pytest.mark.parametrize("entry", ["f", "gh", "gloss"])
def test_shapes_known_only_at_run_time(entry: str, tmp_path: Path) -> None:
    described = saved(anfir.export_coreml(SYMBOLIC, entry=entry), tmp_path)
    assert described["inputs"][-1] == {"name": "x", "dtype": "FLOAT32", "shape": [None, 3]}
    x = np.arange(6.0).reshape(2, 3) / 4
    w = np.array([0.5, -1.0, 2.0])
    for args in ([x], [x[:1]]) if entry == "f" else ([w, x], [-w, x], [w, x[:1]]):
        compare_with_anfir(SYMBOLIC, entry, args)

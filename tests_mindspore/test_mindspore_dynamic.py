"""Live check: anfir's MindIR core exports run in MindSpore 2.10 with anfir's numbers.

The gradients of reductions over some axes, and programs compiled with dimension
variables (``f64[N, 3]``: -1 dims, MindSpore's ``Shape`` at run time), each run on
several concrete sizes.  All programs go to ONE MindSpore process (``ms_runs.py``:
starting MindSpore costs seconds).  Run explicitly::

    MINDSPORE_PYTHON=/work/msvenv/bin/python python -m pytest tests_mindspore/test_mindspore_dynamic.py -q
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

import anfir  # noqa: E402
from anfir.primitives.loops import flatten_value  # noqa: E402

RUNNER = Path(__file__).resolve().parent / "ms_runs.py"
TIMEOUT = 170


def mindspore_python() -> str:
    path = os.environ.get("MINDSPORE_PYTHON", "/work/msvenv/bin/python")
    if not os.path.exists(path):
        pytest.fail(f"MindSpore's Python {path} does not exist: set MINDSPORE_PYTHON")
    return path


def leaves(value: Any) -> list[np.ndarray]:
    """The non-tuple items of a nested value, in order."""
    return [np.asarray(v) for v in flatten_value(value)[0]]


def _reduction_cases() -> list[tuple[str, Any, Any, list[tuple[Any, ...]]]]:
    x = np.random.default_rng(3).uniform(-1.0, 1.0, size=(2, 3, 4))
    cases = []
    for reduction in ("sum", "mean"):
        for axis, keep in ((1, "true"), ((0, 2), "false"), (-1, "false")):
            call = f"{reduction}(y, axis={axis}, keepdims={keep})"
            mod = anfir.parse(f"def g(x) = grad(lambda (y) sum(sin({call})) end)(x)\n")
            cases.append((f"grad {call}", mod["g"], [x], [(x,)]))
    return cases


def _symbolic_cases() -> list[tuple[str, Any, Any, list[tuple[Any, ...]]]]:
    import spec_examples  # tests/: the spec's MLP
    import test_mindir_core as core  # tests/: the CNN with a symbolic batch
    rng = np.random.default_rng(0)

    def data(*shapes: tuple[int, ...]) -> tuple[Any, ...]:
        return tuple(rng.normal(size=s) for s in shapes)

    shapes = anfir.parse("""
def f(x: f64[N, 3]) =
  let flat = reshape(x, (shape(x)[0] * 3,)) in
  (flat, mean(x), broadcast_to(sum(x, 0), shape(x)))
def loss(w: f64[3], x: f64[N, 3]) = mean(sin(x * w)) + sum(sin(reshape(x, (3, shape(x)[0])) * 2.0))
def filled(x: f64[N, 3]) = (zeros(shape(x)) + x, ones((shape(x)[0],)) * 2.0)
""")
    vectors = anfir.parse("""
def mv(a, v) = sum(sin(a @ v))
def vm(v, a) = sum(sin(v @ a))
def vv(u, v) = sin(u @ v)
def loss(w: f64[3], x: f64[N, 3]) = mean(sin(x * w)) + sum(sin(reshape(x, (3, shape(x)[0])) @ sin(sum(x, 1))))
""")
    mlp = anfir.parse(spec_examples.MLP)["mlp_loss"]
    mlp2 = anfir.load(str(ROOT / "examples" / "mlp2.anf"))
    return [
        ("shapes f64[N, 3]", shapes["f"], None, [(np.arange(3.0 * n).reshape(n, 3),) for n in (1, 4, 7)]),
        ("zeros/ones of a run-time shape", shapes["filled"], None,
         [(np.arange(3.0 * n).reshape(n, 3),) for n in (1, 4)]),
        ("grad with f64[N, 3]", anfir.grad(shapes["loss"], wrt=(0, 1)), None,
         [(np.array([0.5, -1.0, 2.0]), np.arange(3.0 * n).reshape(n, 3) / 7.0) for n in (2, 5)]),
        ("mlp value_and_grad f64[B, D]...", anfir.value_and_grad(mlp, wrt=(0, 1, 2, 3)), None,
         [data((3, 8), (8, 2), (b, 3), (b, 2)) for b in (1, 16)] + [data((2, 5), (5, 4), (3, 2), (3, 4))]),
        ("mlp2_step f64[B, D]...", mlp2["mlp2_step"], None,
         [data((3, 5), (5,), (5, 2), (2,), (b, 3), (b, 2)) for b in (1, 6)]),
        ("grad of a product with a vector of length N", anfir.grad(vectors["loss"], wrt=(0, 1)), None,
         [(np.array([0.5, -1.0, 2.0]), np.arange(3.0 * n).reshape(n, 3) / 7.0) for n in (1, 2, 5)]),
        (CNN_SYMBOLIC, anfir.value_and_grad(core.CNN["cnn_loss"], wrt=(0, 1, 2, 3, 4)),
         None, [core.cnn_data(b, b) for b in (1, 3)]),
        (CNN_STATIC, anfir.value_and_grad(core.CNN["cnn_loss"], wrt=(0, 1, 2, 3, 4)),
         list(core.cnn_data(1, 1)), [core.cnn_data(1, 1)]),
        *[(f"{name} with dimension variables", core.RESHAPES[name], None,
           [tuple(rng.normal(size=s) for s in core.RESHAPE_SHAPES[name](b)) for b in (1, 3)])
          for name in sorted(core.RESHAPE_SHAPES)],
        ("integers with floats", core.PROMOTIONS["f"], [3, 3.5], [(np.int64(3), 3.5), (np.int64(-2), 0.25)]),
        ("integers with floats, N", core.PROMOTIONS["g"], None, [(np.ones((n, 3)) * 1.5,) for n in (1, 4)]),
        *[(f"{label} {name} over B", program, None, [data((b, 4)) for b in (1, 3)])
          for name in sorted(core.SWEEP) if name != "log_softmax"  # MindSpore's f64 LogSoftmax is ~2e-6 off (docs/mindir.md)
          for label, program in (("value", anfir.parse(core.SWEEP[name] + "\n")["f"]),
                                 ("grad", anfir.grad(anfir.parse(core.SWEEP[name] + "\n")["f"])))
          if label == "value" or name not in core.SWEEP_VALUE_ONLY],
        *[(f"{FRESH} on a run-time dimension: {entry}", core.CONTROL[entry], None,
           [data((n, 3)) for n in (1, 3, 4)]) for entry in ("f", "g")],
        *[(f"{FRESH}: {name} wrt {wrt}", anfir.grad(core.BRANCHES[name], wrt=wrt), None,
           core.BRANCH_RUNS[name]) for name, wrt in (("f", (0, 1)), ("h", (0, 1)), ("k", (0, 1)), ("l", (0,)))],
        *[(f"grad {name} {shapes}", anfir.grad(vectors[name], wrt=(0, 1)), list(args), [args])
          for name, shapes in (("mv", ((2, 3, 4), (4,))), ("vm", ((4,), (4, 3))), ("vv", ((4,), (4,))))
          for args in [data(*shapes)]],
    ]


FRESH = "grad through if"
"""Cases run in a new GraphCell per input size: MindSpore 2.10 runs a gradient through ``if``
of a dynamic-shape input once per GraphCell ("The actor already exists" on the next shape),
its own export of such a cell (GradOperation of a Cell with ``if``, input Tensor(shape=[None,
3])) just the same."""

CNN_SYMBOLIC = "cnn value_and_grad f32[B, 1, 8, 8]"
CNN_STATIC = "cnn value_and_grad f32[1, 1, 8, 8]"
CNN_ATOL = 1e-4
"""MindSpore's CPU kernels give this CNN's conv weight gradient up to ~4e-5 (absolute, f32,
values ~0.1) from anfir's — with static shapes just as with the symbolic batch (measured: the
two files' MindSpore results are bit-identical, and anfir's f32 is 4e-7 from its f64): the
symbolic batch is checked to add nothing, then both against anfir to this tolerance."""

CASES: list[tuple[str, Any, Any, list[tuple[Any, ...]]]] = _reduction_cases() + _symbolic_cases()
"""(name, program, compile args, runs): every program checked in the one MindSpore process."""


@pytest.fixture(scope="module")
def mindspore_results(tmp_path_factory: Any) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("msdyn")
    inputs: dict[str, np.ndarray] = {}
    models = []
    for i, (name, program, args, runs) in enumerate(CASES):
        path = tmp / f"m{i}.mindir"
        path.write_bytes(anfir.export_mindir(program, args=args))
        models.append(str(path))
        for r, values in enumerate(runs):
            for k, v in enumerate(values):
                inputs[f"m{i}_r{r}_in{k}"] = np.asarray(v)
        if name.startswith(FRESH):
            inputs[f"m{i}_fresh"] = np.asarray(1)
    np.savez(tmp / "in.npz", **inputs)
    command = [mindspore_python(), str(RUNNER), str(tmp / "in.npz"), str(tmp / "out.npz"), *models]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"MindSpore did not finish in {TIMEOUT} s")
    errors = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("[WARNING"))
    assert done.returncode == 0, f"MindSpore failed (status {done.returncode}):\n{errors[-3000:]}"
    result = np.load(tmp / "out.npz")
    return {key: result[key] for key in result.files}


@pytest.mark.parametrize("index", range(len(CASES)), ids=[case[0] for case in CASES])
def test_mindspore_runs_the_export_with_anfirs_numbers(mindspore_results: dict[str, Any], index: int) -> None:
    name, program, args, runs = CASES[index]
    error = mindspore_results.get(f"m{index}_error")
    assert error is None, f"{name}: {error}"
    compiled = anfir.compile(program, args=args)
    atol = CNN_ATOL if name in (CNN_SYMBOLIC, CNN_STATIC) else None
    if name == CNN_SYMBOLIC:  # batch 1: the same numbers as MindSpore's run of the static export
        twin = [case[0] for case in CASES].index(CNN_STATIC)
        assert mindspore_results.get(f"m{twin}_error") is None
        count = sum(1 for key in mindspore_results if key.startswith(f"m{twin}_r0_out"))
        assert count == 6
        for k in range(count):
            np.testing.assert_array_equal(mindspore_results[f"m{index}_r0_out{k}"],
                                          mindspore_results[f"m{twin}_r0_out{k}"])
    for r, values in enumerate(runs):
        want = leaves(anfir.run(compiled, *values))
        got = [mindspore_results[f"m{index}_r{r}_out{k}"] for k in range(len(want))]
        for k, (a, b) in enumerate(zip(want, got)):
            assert a.shape == b.shape, f"{name} run {r} output {k}: {a.shape} != {b.shape}"
            rtol = 1e-5 if a.dtype == np.float32 else 1e-12
            np.testing.assert_allclose(b, a, rtol=rtol, atol=atol or rtol, err_msg=f"{name} run {r} output {k}")


def test_mindspores_own_dynamic_export_imports_and_runs_every_size(tmp_path: Any) -> None:
    # MindSpore's export of a cell with input Tensor(shape=[None, 3]): -1 dims, Shape,
    # TupleGetItem, MakeTuple and Size at run time; anfir reads it and computes
    # MindSpore's numbers for each size
    script = Path(__file__).resolve().parent / "ms_dynamic_export.py"
    try:
        done = subprocess.run([mindspore_python(), str(script), str(tmp_path)], capture_output=True, text=True,
                              timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"MindSpore did not finish in {TIMEOUT} s")
    assert done.returncode == 0, done.stderr[-3000:]
    data = np.load(tmp_path / "dynamic.npz")
    module = anfir.import_mindir(str(tmp_path / "dynamic.mindir"))
    runs = sorted({key.split("_")[0] for key in data.files})
    assert len(runs) == 3
    for run in runs:
        got = leaves(anfir.run(module.entry, data[f"{run}_in0"]))
        want = [data[f"{run}_out{k}"] for k in range(sum(1 for key in data.files if key.startswith(f"{run}_out")))]
        assert len(got) == len(want) == 5
        for k, (a, b) in enumerate(zip(want, got)):
            assert a.shape == b.shape, f"{run} output {k}: {a.shape} != {b.shape}"
            np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12, err_msg=f"{run} output {k}")

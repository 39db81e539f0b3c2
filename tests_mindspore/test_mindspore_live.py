"""Live check: anfir's ``.mindir`` exports run in MindSpore itself.

MindSpore (2.10) needs numpy<2 and cannot share anfir's venv, so each case
exports with anfir here, then runs ``ms_runner.py`` with MindSpore's own
Python in a subprocess with a timeout (MindSpore segfaults or hangs on some
files): ``mindspore.load`` + ``nn.GraphCell`` on the inputs, results compared
with anfir's own.  Run explicitly (``.ci/mindspore_check`` makes the venv)::

    MINDSPORE_PYTHON=/work/msvenv/bin/python python -m pytest tests_mindspore -q

Without MindSpore's Python this file fails (it is never collected by the
normal suite: ``testpaths`` is ``tests``).
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
from export_samples import EXAMPLE_EXPORTS  # noqa: E402

EXAMPLES = ROOT / "examples"
RUNNER = Path(__file__).resolve().parent / "ms_runner.py"
TIMEOUT = 180


def mindspore_python() -> str:
    path = os.environ.get("MINDSPORE_PYTHON", "/work/msvenv/bin/python")
    if not os.path.exists(path):
        pytest.fail(f"MindSpore's Python {path} does not exist: make the venv (.ci/mindspore_check) "
                    "or set MINDSPORE_PYTHON")
    return path


def run_in_mindspore(tmp: Path, data: bytes, args: tuple[Any, ...], load_only: bool = False) -> list[np.ndarray]:
    model, inputs, outputs = tmp / "m.mindir", tmp / "in.npz", tmp / "out.npz"
    model.write_bytes(data)
    np.savez(inputs, **{f"in{k}": np.asarray(a) for k, a in enumerate(args)})
    command = [mindspore_python(), str(RUNNER), str(model), str(inputs), str(outputs)]
    if load_only:
        command.append("--load-only")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"MindSpore did not finish in {TIMEOUT} s")
    errors = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("[WARNING"))
    assert done.returncode == 0, f"MindSpore failed (status {done.returncode}):\n{errors[-3000:]}"
    if load_only:
        assert done.stdout.strip().endswith("loaded")
        return []
    result = np.load(outputs)
    return [result[f"out{k}"] for k in range(len(result.files))]


def compare(want: Any, got: list[np.ndarray], where: str) -> None:
    items = list(want) if isinstance(want, tuple) else [want]
    assert len(items) == len(got), where
    for a, b in zip(items, got):
        a = np.asarray(a)
        assert a.shape == b.shape, f"{where}: {a.shape} != {b.shape}"
        rtol = 1e-5 if a.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(b, a, rtol=rtol, atol=rtol * max(1.0, float(np.max(np.abs(a))) if a.size else 1.0),
                                   err_msg=where)


LOOP_GRADIENT = ("a loop's gradient (its backpropagator is a non-tail recursion): MindSpore's "
                 "runtime does not finish MindSpore's OWN export of a while loop's gradient either "
                 "(test_mindspores_own_loop_gradient_does_not_finish)")
LOAD_ONLY = {
    ("loop", "main", ()): "calls the gradient of a loop whose exit depends on data (dhalvings, not a "
                          "counted loop): " + LOOP_GRADIENT,
    ("fibonacci", "fibonacci", (10,)): "non-tail recursion: MindSpore does not finish its OWN graph-mode "
                                       "Cell of the same recursion, nor its export of it "
                                       "(test_mindspores_own_recursion_does_not_finish)",
}
"""Programs MindSpore's own runtime cannot run (why): the file loads; anfir's reader runs
them (tests/test_mindir.py checks their results there)."""


RUN = [k for k in EXAMPLE_EXPORTS if not any(k == (name, entry) for name, entry, _ in LOAD_ONLY)]
"""The ONNX exporter's examples (every one: anfir writes them all as MindIR)."""


def tensor_leaves(value: Any) -> list[Any]:
    """The non-tuple items of a nested result or argument, in order."""
    return flatten_value(value)[0]


def flat_entry(name: str, entry: str, args: tuple[Any, ...]) -> tuple[Any, list[Any]]:
    """(a graph taking ``entry``'s nested tuple arguments — a network's weights — as
    separate tensors, those tensors).  GraphCell is called with tensors; anfir's
    ResNet and transformer take their weights as nested tuples."""
    leaves = tensor_leaves(tuple(args))
    counter = iter(range(len(leaves)))
    # a nested argument's text, walked with a stack of (value, closing) items
    texts: list[str] = []
    for arg in args:
        parts: list[str] = []
        stack: list[Any] = [arg]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                parts.append(item)
            elif isinstance(item, tuple):
                stack.append(",)" if len(item) == 1 else ")")
                for k, element in enumerate(reversed(item)):
                    stack.append(element)
                    if k < len(item) - 1:
                        stack.append(", ")
                parts.append("(")
            else:
                parts.append(f"a{next(counter)}")
        texts.append("".join(parts))
    source = (EXAMPLES / f"{name}.anf").read_text(encoding="utf-8")
    params = ", ".join(f"a{k}" for k in range(len(leaves)))
    module = anfir.parse(f"{source}\ndef flat_{entry}({params}) = {entry}({', '.join(texts)})\n")
    return module[f"flat_{entry}"], leaves


@pytest.mark.parametrize("key", RUN, ids=str)
def test_an_exported_example_runs_in_mindspore(key: tuple[str, str], tmp_path: Path) -> None:
    args, runs, _ = EXAMPLE_EXPORTS[key]
    module = anfir.load(str(EXAMPLES / f"{key[0]}.anf"))
    nested = any(isinstance(a, tuple) for a in runs[0])
    for run in runs[:2]:
        if nested:  # weights as nested tuples: a wrapper takes them flat
            entry, flat = flat_entry(key[0], key[1], tuple(run))
            data = anfir.export_mindir(entry, args=flat)
            want = tuple(tensor_leaves(anfir.run(module[key[1]], *run)))
            compare(want, run_in_mindspore(tmp_path, data, tuple(flat)), f"{key}")
            continue
        data = anfir.export_mindir(module, entry=key[1], args=args if args is not None else list(runs[0]))
        compare(anfir.run(module[key[1]], *run), run_in_mindspore(tmp_path, data, run), f"{key} on {run}")


PROGRAMS = """
def mlp_loss(w1: f64[3, 4], w2: f64[4, 2], x: f64[5, 3], y: f64[5, 2]) -> f64 =
  let h = tanh(x @ w1) in
  let d = h @ w2 - y in
  sum(d * d) / 10.0
def piecewise(x: f64) -> f64 = if x > 0.0 then x * x else sin(x)
def layer(w: f64[10, 10], v: f64[3], x: f64) =
  if x > 0.0 then sum(w * x) + sum(v) * x else sum(sin(w)) - x
def clip_sum(x: f64[3], k: i64) =
  let g = lambda (y) y * x ** 2 end in
  if k > 0 then g(x) else x - 1.0
def run_while(x: f64, n: i64) =
  let loop = lambda (i, z) if i >= n then z else loop(i + 1, sin(z) * x + 0.5) end in
  let z = loop(0, x) in z * z
def unary(x: f64[4]) =
  sum(log1p(x) + expm1(x) + atan(x) + sinh(x) + cosh(x) + tan(x) + asin(x) + acos(x))
def naive_softplus(x) = log(1.0 + exp(x))
def sp_fwd(x) = (log1p(exp(-abs(x))) + maximum(x, 0.0), x)
def sp_bwd(x, dout) = (dout * sigmoid(x),)
def softplus(x: f64) = custom_vjp(naive_softplus, sp_fwd, sp_bwd)(x)
"""
R = np.random.default_rng(3)
GRADIENTS = [
    ("mlp_loss", (0, 1), (R.normal(size=(3, 4)), R.normal(size=(4, 2)), R.normal(size=(5, 3)), R.normal(size=(5, 2)))),
    # the gradient of `if`, through each branch: the branches' backpropagators return
    # gradient environments, written as tuples (anfir/interop/mindir/environments.py)
    ("piecewise", 0, (0.7,)),
    ("piecewise", 0, (-0.4,)),
    # tensors captured by the branches: tensor slots, a zero where a branch sets none
    ("layer", (0, 1, 2), (R.normal(size=(10, 10)), R.normal(size=3), 0.5)),
    ("layer", (0, 1, 2), (R.normal(size=(10, 10)), R.normal(size=3), -2.0)),
    # Log1p, Expm1, Atan, Sinh, Cosh, Tan, Asin, Acos and their gradients
    ("unary", 0, (np.array([0.1, -0.3, 0.45, 0.7]),)),
    # a user's custom_vjp rule (the stable softplus): the rule is what is written
    ("softplus", 0, (800.0,)),
    ("softplus", 0, (-1.5,)),
]
PLAIN = [("clip_sum", (np.array([0.5, -1.0, 2.0]), 3)), ("clip_sum", (np.array([0.5, -1.0, 2.0]), -1)),
         ("run_while", (0.7, 4)), ("run_while", (0.7, 0))]


@pytest.mark.parametrize("name, wrt, args", GRADIENTS)
def test_a_gradient_runs_in_mindspore(name: str, wrt: Any, args: tuple[Any, ...], tmp_path: Path) -> None:
    g = anfir.grad(anfir.parse(PROGRAMS)[name], wrt=wrt)
    data = anfir.export_mindir(g, args=list(args))
    compare(anfir.run(g, *args), run_in_mindspore(tmp_path, data, args), f"d{name}")


@pytest.mark.parametrize("name, args", PLAIN)
def test_control_flow_runs_in_mindspore(name: str, args: tuple[Any, ...], tmp_path: Path) -> None:
    module = anfir.parse(PROGRAMS)
    data = anfir.export_mindir(module, entry=name, args=list(args))
    compare(anfir.run(module[name], *args), run_in_mindspore(tmp_path, data, args), name)


@pytest.mark.parametrize("entry", ["cnn_loss", "cnn_grad"])
def test_the_cnn_and_its_gradient_run_in_mindspore(entry: str, tmp_path: Path) -> None:
    from test_mindir import CNN, cnn_args

    module = anfir.parse(CNN)
    args = cnn_args()
    data = anfir.export_mindir(module, entry=entry, args=args)
    compare(anfir.run(module[entry], *args), run_in_mindspore(tmp_path, data, tuple(args)), entry)


def test_a_pooling_head_runs_in_mindspore(tmp_path: Path) -> None:
    from test_mindir import HEAD, head_args

    module = anfir.parse(HEAD)
    args = head_args()
    data = anfir.export_mindir(module, entry="head", args=args)
    compare(anfir.run(module["head"], *args), run_in_mindspore(tmp_path, data, tuple(args)), "head")


def test_softmax_runs_in_mindspore(tmp_path: Path) -> None:
    # (LogSoftmax is exported too, but MindSpore's f64 LogSoftmax kernel is off by
    # ~2e-6 on CPU, measured: not comparable at f64 precision)
    module = anfir.parse("def probs(x: f64[3, 4], w: f64[4, 5]) = softmax(x @ w, axis=0)")
    r = np.random.default_rng(2)
    args = (r.standard_normal((3, 4)), r.standard_normal((4, 5)))
    data = anfir.export_mindir(module, entry="probs", args=list(args))
    compare(anfir.run(module["probs"], *args), run_in_mindspore(tmp_path, data, args), "softmax")


def test_imported_weights_run_in_mindspore_as_parameters(tmp_path: Path) -> None:
    fixtures = ROOT / "tests" / "mindir_fixtures"
    mod = anfir.import_mindir(str(fixtures / "dense_relu.mindir"), params_as_inputs=True)
    x = np.load(fixtures / "dense_relu.npz")["in0"]
    data = anfir.export_mindir(mod, args=[*mod.params.values(), x])
    # the weights are the file's parameters: MindSpore takes only x
    compare(anfir.run(mod.entry, *mod.params.values(), x), run_in_mindspore(tmp_path, data, (x,)), "dense")


GRADIENT_LOAD_ONLY = {
    ("run_while", 0.7): LOOP_GRADIENT,
}
"""Gradients MindSpore's runtime cannot run (why): they load; anfir's reader runs them."""


@pytest.mark.parametrize("name, x", list(GRADIENT_LOAD_ONLY))
def test_gradients_mindspore_cannot_run_still_load(name: str, x: float, tmp_path: Path) -> None:
    source = anfir.parse(PROGRAMS)[name]
    args = (x,) if name == "piecewise" else (x, 4)
    g = anfir.grad(source)
    data = anfir.export_mindir(g, args=list(args))
    run_in_mindspore(tmp_path, data, args, load_only=True)
    got = anfir.run(anfir.import_mindir(data).entry, *args)
    compare(anfir.run(g, *args), [np.asarray(got)], f"d{name} read back")


@pytest.mark.parametrize("key", list(LOAD_ONLY), ids=str)
def test_what_mindspore_cannot_run_still_loads(key: tuple[str, str, tuple[Any, ...]], tmp_path: Path) -> None:
    name, entry, args = key
    module = anfir.load(str(EXAMPLES / f"{name}.anf"))
    data = anfir.export_mindir(module, entry=entry, args=list(args))
    run_in_mindspore(tmp_path, data, args, load_only=True)
    back = anfir.import_mindir(data)
    want, got = anfir.run(module[entry], *args), anfir.run(back.entry, *args)
    compare(want, [np.asarray(v) for v in (got if isinstance(got, tuple) else (got,))], f"{entry} read back")


def test_padded_pools_and_batched_matmul_gradients_run_in_mindspore(tmp_path: Path) -> None:
    # one file for the three (each MindSpore process takes seconds to start)
    from test_mindir import WINDOWS

    r = np.random.default_rng(5)
    module = anfir.parse(WINDOWS + "def windows(x, a, w, v) = (pools(x), pools_grad(x), bmm_grad(a, w, v))\n")
    args = [r.standard_normal((2, 3, 7, 7)).astype(np.float32),
            *(r.standard_normal(s) for s in ((2, 3, 4), (4, 5), (1, 5, 2)))]
    data = anfir.export_mindir(module, entry="windows", args=args)
    want = tuple(tensor_leaves(anfir.run(module["windows"], *args)))
    compare(want, run_in_mindspore(tmp_path, data, tuple(args)), "windows")


EVIDENCE_TIMEOUT = 90
"""Seconds MindSpore is given to show it does not finish (measured: not in 150 s either)."""


def does_not_finish(command: list[str]) -> str:
    """Run ``command``; fail if it finishes within EVIDENCE_TIMEOUT (then MindSpore can run
    it and the load-only names above must move to the programs that run); its output."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=EVIDENCE_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        out = e.stdout
        return out.decode() if isinstance(out, bytes) else (out or "")
    errors = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("[WARNING"))
    pytest.fail(f"MindSpore finished (status {done.returncode}): {done.stdout[-500:]}{errors[-2000:]} — "
                "if it ran, move the programs named load-only for this reason to the ones that run")


def test_mindspores_own_loop_gradient_does_not_finish(tmp_path: Path) -> None:
    # MindSpore's own export of the gradient of a while loop (GradOperation of a Cell with
    # `while i < n`, made by tests/mindir_fixtures/make_fixtures.py): it loads, and
    # MindSpore's runtime does not finish running it — as anfir's loop gradients
    fixtures = ROOT / "tests" / "mindir_fixtures"
    data = np.load(fixtures / "while_grad.npz")
    np.savez(tmp_path / "in.npz", in0=data["in0"], in1=data["in1"])
    run_in_mindspore(tmp_path, (fixtures / "while_grad.mindir").read_bytes(), (), load_only=True)
    np.savez(tmp_path / "in.npz", in0=data["in0"], in1=data["in1"])
    does_not_finish([mindspore_python(), str(RUNNER), str(fixtures / "while_grad.mindir"),
                     str(tmp_path / "in.npz"), str(tmp_path / "out.npz")])


def test_mindspores_own_recursion_does_not_finish(tmp_path: Path) -> None:
    # examples/fibonacci.anf's recursion as a MindSpore graph-mode Cell, exported by
    # MindSpore and run back: it exports at once, and does not finish running (n = 5)
    out = does_not_finish([mindspore_python(), str(Path(__file__).resolve().parent / "ms_fibonacci.py"),
                           str(tmp_path / "fib.mindir"), "5"])
    assert "exported" in out


# -- structured loops and counted loops: while headers of data (issue 29) ---------------------
sys.path.insert(0, str(ROOT / "tests"))
import test_scan_export as scans  # noqa: E402
import test_counted_loops as counted  # noqa: E402

LOOPS_RUN = [(scans.MOD, "rnn_loss", (scans.W, scans.U, scans.XS)), (scans.MOD, "g_rnn", (scans.W, scans.U, scans.XS)),
             (counted.MOD, "g_tensor_state", (counted.W,)), (scans.MOD, "g_cumsum", (scans.VEC,)),
             (scans.MOD, "g_halving", (0.8,)), (scans.MOD, "g_rev", (scans.VEC, scans.VEC[::-1].copy())),
             (scans.MOD, "gg_halving", (0.8,)), (scans.MOD, "gg_cumsum", (scans.VEC,)),
             (counted.MOD, "g_count_down", (0.7,)), (counted.MOD, "g_nested", (0.7,)),
             (counted.MOD, "g_int_state", (0.7,)), (counted.GG, "gg_count_down", (0.7,))]
"""Scans, fori_loops and counted tail recursion, their gradients and second-order ones:
each loop a while-header graph over data, which MindSpore's runtime runs."""


@pytest.mark.parametrize("mod, entry, args", LOOPS_RUN, ids=[c[1] for c in LOOPS_RUN])
def test_loops_and_their_gradients_run_in_mindspore(mod: Any, entry: str, args: tuple[Any, ...],
                                                    tmp_path: Path) -> None:
    data = anfir.export_mindir(mod, entry=entry, args=list(args))
    compare(anfir.run(mod[entry], *args), run_in_mindspore(tmp_path, data, args), entry)


# -- shaping operators with static shapes -----------------------------------------------------
import test_mindir_shaping as shaping_cases  # noqa: E402


@pytest.mark.parametrize("entry", sorted(shaping_cases.ARGS))
def test_shaping_operators_run_in_mindspore(entry: str, tmp_path: Path) -> None:
    args = shaping_cases.ARGS[entry]
    data = anfir.export_mindir(shaping_cases.PROGRAM, entry=entry, args=args)
    want = tuple(tensor_leaves(anfir.run(shaping_cases.PROGRAM[entry], *args)))
    compare(want if len(want) > 1 else want[0], run_in_mindspore(tmp_path, data, tuple(args)), entry)

"""anfir → XLA: the JAX back end timed against JAX itself and against anfir's evaluator.

    pip install -e ".[dev,jax]"
    python benchmarks/bench_jax.py          # the three figures alone
    python benchmarks/run_all.py --only jax_small,jax_large,jax_eval

The workload is the gradient of the spec's ``mlp_loss`` with respect to ``w1``
and ``w2`` (float64, ``jax_enable_x64`` on, inputs already on the device):

* **anfir → XLA**: ``jax.jit(anfir.to_jax(g))`` where ``g`` is the optimized
  gradient graph ``anfir.compile`` makes of the program-level ``grad`` (the
  graph the evaluator figures time);
* **peer**: ``jax.jit(jax.grad(loss, (0, 1)))`` of the same loss written by
  hand in ``jax.numpy``;
* **evaluator**: ``anfir.run`` of the same optimized graph on numpy arrays.

Every call is followed by ``jax.block_until_ready``; both XLA programs are
compiled before timing (warm-up calls).  XLA runs on one thread, as numpy and
the evaluator do (``XLA_FLAGS`` set before JAX loads, unless already set).
Ratios only: the figures are measured in one process, samples interleaved
(``harness.paired_seconds``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Optional

# One thread everywhere, set before numpy and JAX load (as run_all.py does): XLA's
# CPU runtime then computes on one core like numpy's BLAS and anfir's evaluator.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}
for _variable, _value in ONE_THREAD.items():
    os.environ.setdefault(_variable, _value)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

import numpy as np  # noqa: E402

import anfir  # noqa: E402
import peers  # noqa: E402
import workloads  # noqa: E402
from harness import Figure, format_details, format_table, micro, paired_seconds  # noqa: E402

NA = "n/a"
SMALL = (4, 16, 16)
LARGE = (64, 256, 10)
"""(batch, D = H, K) of the two MLPs, as in the evaluator's mlp figures."""


def jax_version() -> Optional[str]:
    """JAX's version, or None when it is not importable."""
    try:
        import jax
    except ImportError:
        return None
    return str(jax.__version__)


def optimized_gradient(inputs: tuple[np.ndarray, ...]) -> anfir.FuncGraph:
    """The pipeline-optimized gradient of ``mlp_loss`` w.r.t. ``w1`` and ``w2``."""
    text = workloads.MLP_ANF + "\ndef d_mlp(w1, w2, x, y) = grad(mlp_loss, 0, 1)(w1, w2, x, y)\n"
    return anfir.compile(anfir.parse(text), entry="d_mlp", args=list(inputs))


def jax_peer(jax: Any) -> Callable[..., Any]:
    """``jax.jit(jax.grad(loss, (0, 1)))`` of the loss written in ``jax.numpy``."""
    jnp = jax.numpy

    def loss(w1: Any, w2: Any, x: Any, y: Any) -> Any:
        h = jnp.tanh(x @ w1)
        out = h @ w2
        return jnp.sum((out - y) ** 2) / 2

    return jax.jit(jax.grad(loss, (0, 1)))


def _check(label: str, got: Any, expected: tuple[np.ndarray, ...]) -> None:
    if len(got) != len(expected) or not all(
            np.allclose(np.asarray(g), e, rtol=1e-10, atol=1e-12) for g, e in zip(got, expected)):
        raise AssertionError(f"the {label} gradient differs from the numpy one")


def measure(batch: int, width: int, outputs: int, repeat: int = 11) -> dict[str, Any]:
    """Seconds per call of anfir → XLA, of the JAX peer and of the evaluator, plus sizes."""
    import jax

    jax.config.update("jax_enable_x64", True)
    inputs = peers.mlp_inputs(batch, width, outputs)
    expected = peers.numpy_mlp_grad(*inputs)
    graph = optimized_gradient(inputs)
    raw = anfir.grad(anfir.parse(workloads.MLP_ANF)["mlp_loss"], (0, 1))
    on_device = tuple(jax.device_put(a) for a in inputs)
    ours = jax.jit(anfir.to_jax(graph))
    unoptimized = jax.jit(anfir.to_jax(raw))
    theirs = jax_peer(jax)
    for label, fn in (("anfir -> XLA", ours), ("unoptimized anfir -> XLA", unoptimized),
                      ("jax.grad", theirs)):
        _check(label, fn(*on_device), expected)
    _check("evaluator", anfir.run(graph, *inputs), expected)
    block = jax.block_until_ready
    work = {
        "anfir -> XLA": lambda: block(ours(*on_device)),
        "jax.grad": lambda: block(theirs(*on_device)),
        "unoptimized": lambda: block(unoptimized(*on_device)),
        "evaluator": lambda: anfir.run(graph, *inputs),
    }
    times = paired_seconds(work, repeat=repeat)
    ours_hlo = ours.lower(*on_device).compile().as_text()
    theirs_hlo = theirs.lower(*on_device).compile().as_text()
    return {"times": times, "ops": (ours_hlo.count("\n"), theirs_hlo.count("\n")),
            "name": f"B={batch}, D=H={width}, K={outputs}"}


_CACHE: dict[tuple[int, int, int, bool], dict[str, Any]] = {}


def _measured(shape: tuple[int, int, int], quick: bool) -> dict[str, Any]:
    key = (*shape, quick)
    if key not in _CACHE:
        _CACHE[key] = measure(*shape, repeat=3 if quick else 11)
    return _CACHE[key]


def _figure(name: str, goal: str, fill: Callable[[Figure], None]) -> Figure:
    fig = Figure(name, goal=goal)
    if jax_version() is None:
        fig.peer = NA
        fig.details.append('JAX not installed: pip install "anfir[jax]"')
        return fig
    try:
        fill(fig)
    except Exception as exc:  # report, never crash the table
        lines = str(exc).strip().splitlines()
        fig.error = f"{type(exc).__name__}: {lines[0] if lines else ''}"
        fig.value = fig.passed = None
    return fig


def xla_figure(shape: tuple[int, int, int], goal: float, quick: bool = False) -> Figure:
    """anfir → XLA over ``jax.jit(jax.grad(...))`` of the hand-written loss."""
    batch, width, outputs = shape

    def fill(fig: Figure) -> None:
        m = _measured(shape, quick)
        t = m["times"]
        fig.value = t["anfir -> XLA"] / t["jax.grad"]
        fig.passed = fig.value <= goal
        fig.peer = f"{micro(t['jax.grad'])}"
        fig.details += [
            f"JAX {jax_version()}, float64; inputs on the device; every call blocks until ready",
            f"jax.jit(anfir.to_jax(optimized gradient)): {micro(t['anfir -> XLA'])} = {fig.value:.2f}x",
            f"jax.jit(jax.grad(loss)) of the hand-written jax.numpy loss: {micro(t['jax.grad'])}",
            f"jax.jit(anfir.to_jax(anfir.grad(mlp_loss))), unoptimized: {micro(t['unoptimized'])} "
            f"= {t['unoptimized'] / t['jax.grad']:.2f}x",
            f"compiled HLO: {m['ops'][0]} lines (anfir) vs {m['ops'][1]} (jax.grad)",
        ]

    return _figure(f"mlp_loss gradient, anfir -> XLA vs jax.jit(jax.grad) (B={batch}, D=H={width}, "
                   f"K={outputs})", f"<= {goal:g}x", fill)


def evaluator_figure(quick: bool = False) -> Figure:
    """anfir → XLA over anfir's evaluator, on the same optimized gradient graph."""

    def fill(fig: Figure) -> None:
        parts = []
        worst = 0.0
        for shape in (SMALL, LARGE):
            m = _measured(shape, quick)
            t = m["times"]
            ratio = t["anfir -> XLA"] / t["evaluator"]
            worst = max(worst, ratio)
            parts.append(f"{ratio:.2f}x")
            fig.details.append(f"{m['name']}: anfir -> XLA {micro(t['anfir -> XLA'])}, "
                               f"anfir.run {micro(t['evaluator'])} = {ratio:.2f}x")
        fig.value = worst
        fig.passed = worst <= 1.0
        fig.peer = " / ".join(parts) + " (small / large)"

    return _figure("mlp_loss gradient, anfir -> XLA vs anfir's evaluator (worse of small, large)",
                   "<= 1x", fill)


def all_figures(quick: bool = False) -> dict[str, Callable[[], Figure]]:
    """The figures by key, for run_all.py."""
    return {
        "jax_small": lambda: xla_figure(SMALL, 1.2, quick),
        "jax_large": lambda: xla_figure(LARGE, 1.2, quick),
        "jax_eval": lambda: evaluator_figure(quick),
    }


def main() -> int:
    """Measure the three figures and print them."""
    results = [run() for run in all_figures(quick="--quick" in sys.argv).values()]
    print(format_table(results))
    print()
    print(format_details(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

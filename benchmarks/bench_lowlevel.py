"""The low-level buffer IR: the arena executor against the register VM, and what sharing saves.

    python benchmarks/bench_lowlevel.py            # the speed figure and the memory table
    python benchmarks/run_all.py --only lowlevel_speed

* **speed** — the training step of ``examples/mlp2.anf`` (the gradient of a
  two-layer MLP's mean squared error with respect to its four parameters) at
  batch 64, width 256: ``Executor(anfir.lower(...)).run(*args)`` (the
  instructions on views of one preallocated arena, numpy ``out=``) over
  ``anfir.run`` of the optimized graph ``anfir.compile`` returns (the register
  VM, each result a new array), samples interleaved in one process.  Both take
  the arguments and return new result arrays; the executor's time includes
  copying the arguments into its input buffers.  Goal: at most 1.0x.
* **memory** — for each program, the header figures of its ``plan_memory``
  dump: ``no sharing`` (every value its own buffer), ``max live`` (the lower
  bound for the instruction order) and ``arena``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))

import numpy as np  # noqa: E402

import anfir  # noqa: E402
from anfir.lowlevel import Executor  # noqa: E402
from harness import Figure, format_details, format_table, micro, paired_seconds  # noqa: E402

EXAMPLES = HERE.parent / "examples"
BATCH, WIDTH = 64, 256


def _types(batch: int, d: int, h: int, k: int) -> list[str]:
    return [f"f64[{d}, {h}]", f"f64[{h}]", f"f64[{h}, {k}]", f"f64[{k}]", f"f64[{batch}, {d}]",
            f"f64[{batch}, {k}]"]


def _values(types: list[str], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for t in types:
        dims = [int(d) for d in t[t.index("[") + 1:-1].split(",")]
        out.append(rng.standard_normal(dims) * 0.1)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(b, tuple):
        return isinstance(a, tuple) and len(a) == len(b) and all(map(_same, a, b))
    return bool(np.allclose(a, b, rtol=1e-10, atol=1e-12))


def speed_figure(quick: bool = False) -> Figure:
    """Arena executor time over register-VM time on the MLP training step."""
    figure = Figure(f"low-level arena executor / register VM, MLP training step (B={BATCH}, width {WIDTH})",
                    goal="<= 1.0x")
    module = anfir.load(str(EXAMPLES / "mlp2.anf"))
    types = _types(BATCH, WIDTH, WIDTH, WIDTH)
    values = _values(types)
    graph = anfir.compile(module, entry="mlp2_step", args=types)
    low = anfir.lower(module, entry="mlp2_step", args=types)
    executor = Executor(low)
    want = anfir.run(graph, *values)
    if not _same(executor.run(*values), want):
        figure.error = "the executor's result differs from the evaluator's"
        return figure
    # The other case: two sets of argument arrays in turn, each result kept until the next
    # call (the executor binds again the instructions that read an argument or write an output).
    turns = [values, [v.copy() for v in values]]
    kept: dict[str, Any] = {}

    def fresh(name: str, run: Callable[..., Any]) -> Callable[[], Any]:
        def call() -> None:
            turns.reverse()
            kept[name] = run(*turns[0])
        return call

    fns: dict[str, Callable[[], Any]] = {
        "executor": lambda: executor.run(*values), "vm": lambda: anfir.run(graph, *values),
        "executor, new arrays": fresh("executor", executor.run),
        "vm, new arrays": fresh("vm", lambda *a: anfir.run(graph, *a))}
    best = paired_seconds(fns, repeat=3 if quick else 41)  # best of many: the machine is shared
    figure.value = best["executor"] / best["vm"]
    figure.passed = figure.value <= 1.0
    other = best["executor, new arrays"] / best["vm, new arrays"]
    figure.details = [f"arena executor {micro(best['executor'])}, register VM {micro(best['vm'])} "
                      "(the same argument arrays each call, each result let go of)",
                      f"{other:.2f}x with two sets of argument arrays in turn and each result kept: "
                      f"{micro(best['executor, new arrays'])} vs {micro(best['vm, new arrays'])}",
                      f"{len(low.instructions())} instructions, {executor.fast} with an out= kernel; "
                      f"arena {low.peak_bytes:,} bytes, no sharing {low.naive_bytes:,} bytes"]
    return figure


def memory_rows() -> list[tuple[str, int, int, int]]:
    """(program, no sharing, max live, arena) for the programs of the tests, at benchmark sizes."""
    mlp = anfir.load(str(EXAMPLES / "mlp.anf"))["mlp_loss"]
    mlp2 = anfir.load(str(EXAMPLES / "mlp2.anf"))
    mlp_types = [f"f64[{WIDTH}, {WIDTH}]", f"f64[{WIDTH}, 10]", f"f64[{BATCH}, {WIDTH}]", f"f64[{BATCH}, 10]"]
    cases: list[tuple[str, Any, list[str], str | None]] = [
        ("mlp.anf mlp_loss (inference)", mlp, mlp_types, None),
        ("mlp.anf grad(mlp_loss, (w1, w2))", anfir.grad(mlp, (0, 1)), mlp_types, None),
        ("mlp2.anf mlp2_loss (inference)", mlp2, _types(BATCH, WIDTH, WIDTH, WIDTH), "mlp2_loss"),
        ("mlp2.anf mlp2_step (training step)", mlp2, _types(BATCH, WIDTH, WIDTH, WIDTH), "mlp2_step"),
    ]
    rows = []
    for name, source, types, entry in cases:
        low = anfir.lower(source, entry=entry, args=types)
        assert low.peak_bytes is not None
        rows.append((name, low.naive_bytes, low.max_live_bytes, low.peak_bytes))
    return rows


def memory_table() -> str:
    """The rows as a Markdown table."""
    lines = ["| program (B=64, width 256, f64) | no sharing | max live | arena | no sharing / arena |",
             "|---|---|---|---|---|"]
    for name, naive, peak, arena in memory_rows():
        lines.append(f"| {name} | {naive:,} | {peak:,} | {arena:,} | {naive / arena:.2f}x |")
    return "\n".join(lines)


def all_figures(quick: bool = False) -> dict[str, Callable[[], Figure]]:
    """The figures by key, for run_all.py."""
    return {"lowlevel_speed": lambda: speed_figure(quick)}


def main() -> int:
    """Measure the speed figure and print the memory table."""
    results = [run() for run in all_figures(quick="--quick" in sys.argv).values()]
    print(format_table(results))
    print()
    print(format_details(results))
    print()
    print(memory_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())

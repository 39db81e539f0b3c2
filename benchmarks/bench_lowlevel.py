"""The low-level buffer IR: the arena executor against the register VM, and what sharing saves.

    python benchmarks/bench_lowlevel.py            # the speed figure and the memory table
    python benchmarks/run_all.py --only lowlevel_speed

* **speed** — the training step of ``examples/mlp2.anf`` (the gradient of a
  two-layer MLP's mean squared error with respect to its four parameters) at
  batch 64, width 256: ``Executor(anfir.lower(...)).run(*args)`` (the
  instructions on views of one preallocated arena, numpy ``out=``) over
  ``anfir.run`` of the optimized graph ``anfir.compile`` returns (the register
  VM, each result a new array), samples interleaved in one process, in CPU
  time (the wall-clock ratio in the details).  Two cases: the same argument
  arrays at each call with each result let go of (a training loop updating
  its weights in place: the executor binds nothing again and writes the same
  output arrays), and two sets of argument arrays in turn with each result
  kept until the next call (the executor binds again the instructions that
  touch them and allocates new outputs).  Goal: at most 1.0x.  The same for
  the ResNet-style network's training step at batch 16, 3 x 32 x 32.
* **memory** — for each program, the header figures of its ``plan_memory``
  dump: ``no sharing`` (every value its own buffer), ``max live`` (the lower
  bound for the instruction order) and ``arena``.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))
sys.path.insert(2, str(HERE.parent / "tests"))  # convnets: the tests' networks

import numpy as np  # noqa: E402

import anfir  # noqa: E402
import convnets  # noqa: E402
from anfir.lowlevel import Executor  # noqa: E402
from harness import Figure, calls_per_sample, format_details, format_table, micro, paired_seconds  # noqa: E402

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


def paired_cpu_seconds(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Like ``harness.paired_seconds``, in CPU time (``time.process_time``): on a machine
    shared with other jobs a wall-clock sample also counts the time the process waited for
    a core; its CPU time does not (numpy runs on one thread here, so the two agree when idle)."""
    numbers = {name: calls_per_sample(fn) for name, fn in fns.items()}
    best = {name: float("inf") for name in fns}
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            for name, fn in fns.items():
                gc.collect()
                start = time.process_time()
                for _ in range(numbers[name]):
                    fn()
                best[name] = min(best[name], (time.process_time() - start) / numbers[name])
    finally:
        if enabled:
            gc.enable()
    return best


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
    # The figure is in CPU time: on the shared machine a wall-clock sample also counts the time
    # spent waiting for a core (the wall-clock ratio, measured alongside, is in the details).
    cpu = paired_cpu_seconds(fns, repeat=3 if quick else 41)
    wall = paired_seconds(fns, repeat=3 if quick else 41)
    figure.value = cpu["executor"] / cpu["vm"]
    figure.passed = figure.value <= 1.0
    figure.details = [f"CPU time: arena executor {micro(cpu['executor'])}, register VM {micro(cpu['vm'])} "
                      "(the same argument arrays each call, each result let go of)",
                      f"{cpu['executor, new arrays'] / cpu['vm, new arrays']:.2f}x with two sets of argument "
                      f"arrays in turn and each result kept: {micro(cpu['executor, new arrays'])} vs "
                      f"{micro(cpu['vm, new arrays'])}",
                      f"wall clock: {wall['executor'] / wall['vm']:.2f}x ({micro(wall['executor'])} vs "
                      f"{micro(wall['vm'])}), {wall['executor, new arrays'] / wall['vm, new arrays']:.2f}x "
                      f"with new arrays ({micro(wall['executor, new arrays'])} vs "
                      f"{micro(wall['vm, new arrays'])})",
                      f"{len(low.instructions())} instructions, {executor.fast} with an out= kernel; "
                      f"arena {low.peak_bytes:,} bytes, no sharing {low.naive_bytes:,} bytes"]
    return figure


# The CNN and ResNet-style networks of tests/test_lowlevel.py (tests/convnets.py) at CIFAR's
# size (B x 3 x 32 x 32).
CNN_BATCH, C1, C2, CLASSES = 16, 16, 32, 10


def nets() -> tuple[Any, list[str], list[str]]:
    """The networks' module and the argument types of ``cnn`` and ``resnet``."""
    module = anfir.parse(convnets.NETS, "nets.anf")

    def t(*dims: int) -> str:
        return f"f64[{', '.join(map(str, dims))}]"

    def bn(c: int) -> list[str]:
        return [t(c)] * 4

    data = [t(CNN_BATCH, 3, 32, 32), t(CNN_BATCH, CLASSES)]
    cnn = [t(C1, 3, 3, 3), t(C1), *bn(C1), t(C2, C1, 3, 3), t(C2, CLASSES), *data]
    resnet = [t(C1, 3, 3, 3), *bn(C1), t(C1, C1, 3, 3), *bn(C1), t(C1, C1, 3, 3), *bn(C1),
              t(C2, C1, 3, 3), *bn(C2), t(C2, C2, 3, 3), *bn(C2), t(C2, C1, 1, 1), t(C2, CLASSES), *data]
    return module, cnn, resnet


def cnn_speed_figure(quick: bool = False) -> Figure:
    """Arena executor time over register-VM time on the ResNet-style training step."""
    figure = Figure(f"low-level arena executor / register VM, ResNet-style training step "
                    f"(B={CNN_BATCH}, 3x32x32)", goal="<= 1.0x")
    module, _, types = nets()
    step = anfir.grad(module["resnet"], tuple(range(len(types) - 2)))
    values = [v * 0.5 for v in _values(types)]
    graph = anfir.compile(step, args=types)
    low = anfir.lower(step, args=types)
    executor = Executor(low)
    if not _same(executor.run(*values), anfir.run(graph, *values)):
        figure.error = "the executor's result differs from the evaluator's"
        return figure
    fns: dict[str, Callable[[], Any]] = {"executor": lambda: executor.run(*values),
                                          "vm": lambda: anfir.run(graph, *values)}
    cpu = paired_cpu_seconds(fns, repeat=3 if quick else 21)
    wall = paired_seconds(fns, repeat=3 if quick else 21)
    figure.value = cpu["executor"] / cpu["vm"]
    figure.passed = figure.value <= 1.0
    figure.details = [f"CPU time: arena executor {micro(cpu['executor'])}, register VM {micro(cpu['vm'])}; "
                      f"wall clock {wall['executor'] / wall['vm']:.2f}x ({micro(wall['executor'])} vs "
                      f"{micro(wall['vm'])})",
                      f"{len(low.instructions())} instructions, {executor.fast} with an out= kernel; "
                      f"arena {low.peak_bytes:,} bytes, scratch {executor.workspace.nbytes:,} bytes"]
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
    module, cnn, resnet = nets()
    size = f"B={CNN_BATCH}, 3x32x32, widths {C1}/{C2}"
    cases += [
        (f"CNN (inference; {size})", module["cnn"], cnn, None),
        (f"CNN grad, every parameter ({size})", anfir.grad(module["cnn"], tuple(range(len(cnn) - 2))), cnn,
         None),
        (f"ResNet-style (inference; {size})", module["resnet"], resnet, None),
        (f"ResNet-style grad, every parameter ({size})",
         anfir.grad(module["resnet"], tuple(range(len(resnet) - 2))), resnet, None),
    ]
    rows = []
    for name, source, types, entry in cases:
        low = anfir.lower(source, entry=entry, args=types)
        assert low.peak_bytes is not None
        rows.append((name, low.naive_bytes, low.max_live_bytes, low.peak_bytes))
    return rows


def memory_table() -> str:
    """The rows as a Markdown table."""
    lines = ["| program (f64; the MLPs at B=64, width 256) | no sharing | max live | arena | no sharing / arena |",
             "|---|---|---|---|---|"]
    for name, naive, peak, arena in memory_rows():
        lines.append(f"| {name} | {naive:,} | {peak:,} | {arena:,} | {naive / arena:.2f}x |")
    return "\n".join(lines)


def all_figures(quick: bool = False) -> dict[str, Callable[[], Figure]]:
    """The figures by key, for run_all.py."""
    return {"lowlevel_speed": lambda: speed_figure(quick), "lowlevel_cnn_speed": lambda: cnn_speed_figure(quick)}


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

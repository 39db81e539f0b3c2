"""Automatic rematerialisation measured by the buffer planner (issue 27).

    python benchmarks/bench_remat.py              # the table, the sweep and its plot
    python benchmarks/bench_remat.py --quick      # fewer samples

For the training steps of ``examples/resnet18.anf`` (small inputs) and
``examples/transformer.anf``: the planned arena — every buffer of the step,
the kernels' ``@scratch`` included — and the time of one step, lowered
without and with ``remat="min-cut"``; the results are checked equal first.
Time is CPU time (``time.process_time``), the best of interleaved samples,
for the arena executor (``Executor(low).run``) and for the evaluator
(``anfir.run`` of the compiled graph).  Goal: arena <= 0.5x at <= 1.3x time.

Then a sweep of budgets for the ResNet step: every candidate the budget
search tries (nothing recomputed, the cheap operations of the first 1/8 ...
8/8 of the forward pass, then more operations) with its planned arena and
executor time, plotted as ``docs/images/remat_sweep.png``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(1, str(HERE.parent / "tests"))  # example_args: the examples' arguments

import numpy as np  # noqa: E402

import anfir  # noqa: E402
from anfir.ir.clone import clone  # noqa: E402
from anfir.lowlevel import Executor, lower  # noqa: E402
from anfir.lowlevel import remat  # noqa: E402
from anfir.passes.validate import rebuild_manager  # noqa: E402
from example_args import resnet18_args, transformer_args  # noqa: E402

EXAMPLES = HERE.parent / "examples"
IMAGE = HERE.parent / "docs" / "images" / "remat_sweep.png"

MODELS = {
    "ResNet-18 step (batch 4, 3x32x32, widths 16-128)":
        ("resnet18.anf", "resnet18_grad", lambda: resnet18_args(batch=4, size=32, widths=(16, 32, 64, 128))),
    "transformer block step (batch 8, length 32, width 32)":
        ("transformer.anf", "block_grad", lambda: transformer_args(batch=8, length=32)),
}


def same(a: Any, b: Any) -> bool:
    """Equal leaf by leaf (rtol 1e-10)."""
    if isinstance(b, tuple):
        return isinstance(a, tuple) and len(a) == len(b) and all(map(same, a, b))
    return bool(np.allclose(a, b, rtol=1e-10, atol=1e-12))


def best_cpu(fns: dict[str, Callable[[], Any]], samples: int) -> dict[str, float]:
    """The best CPU time of one call of each function, samples interleaved."""
    best = {name: float("inf") for name in fns}
    for fn in fns.values():
        fn()  # warm up (the evaluator compiles on its first call)
    for _ in range(samples):
        for name, fn in fns.items():
            start = time.process_time()
            fn()
            best[name] = min(best[name], time.process_time() - start)
    return best


def compare(label: str, file: str, entry: str, make: Callable[[], Any], samples: int) -> dict[str, Any]:
    """No remat against min-cut for one training step."""
    mod = anfir.load(str(EXAMPLES / file))
    args = list(make())
    plain = anfir.lower(mod, entry=entry, args=args)
    cut = anfir.lower(mod, entry=entry, args=args, remat="min-cut")
    graph_plain = anfir.compile(mod, entry=entry, args=args)
    graph_cut = anfir.compile(mod, entry=entry, args=args, remat="min-cut")
    run_plain, run_cut = Executor(plain), Executor(cut)
    want = anfir.run(graph_plain, *args)
    for got in (run_plain.run(*args), run_cut.run(*args), anfir.run(graph_cut, *args)):
        if not same(got, want):
            raise SystemExit(f"ERROR: {label}: remat changed the results")
    times = best_cpu({"exec": lambda: run_plain.run(*args), "exec_remat": lambda: run_cut.run(*args),
                      "eval": lambda: anfir.run(graph_plain, *args),
                      "eval_remat": lambda: anfir.run(graph_cut, *args)}, samples)
    scratch = max((i.scratch.size for i in cut.instructions() if i.scratch is not None), default=0)
    return {"label": label, "plain": plain.peak_bytes, "remat": cut.peak_bytes,
            "exec": times["exec_remat"] / times["exec"], "eval": times["eval_remat"] / times["eval"],
            "t_exec": times["exec"], "scratch": scratch}


def sweep(file: str, entry: str, make: Callable[[], Any], samples: int) -> list[tuple[str, int, float]]:
    """(candidate, planned arena, executor CPU seconds) for every candidate of the budget search."""
    mod = anfir.load(str(EXAMPLES / file))
    args = list(make())
    graph = anfir.compile(mod, entry=entry, args=args)
    remat.inline_everything(rebuild_manager([graph]))
    points = []
    for level, fraction in [("none", 0.0), *remat.candidates()]:
        trial = clone(graph)
        rebuild_manager([trial])
        if level != "none":
            remat.rematerialize(trial, level, fraction)
        low = lower(trial)
        executor = Executor(low)
        executor.run(*args)
        seconds = best_cpu({"x": lambda: executor.run(*args)}, samples)["x"]
        name = "none" if level == "none" else f"{level} {fraction:.3g}"
        points.append((name, low.peak_bytes, seconds))
        print(f"  {name:<12} arena {low.peak_bytes:>10,} bytes   {seconds * 1e3:8.2f} ms", flush=True)
    return points


def plot(points: list[tuple[str, int, float]], title: str) -> None:
    """Arena against step time, one point per candidate."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    xs = [p[2] * 1e3 for p in points]
    ys = [p[1] / 1024 for p in points]
    ax.plot(xs, ys, "o", color="tab:blue")
    for (name, _, _), x, y in zip(points, xs, ys):
        ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    ax.set_xlabel("step time, arena executor (ms, CPU)")
    ax.set_ylabel("planned arena (KiB, scratch included)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    IMAGE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMAGE, dpi=110)


def main() -> None:
    """Print the comparison table and the sweep; write the plot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--no-plot", action="store_true", help="skip the sweep's plot")
    ns = parser.parse_args()
    samples = 3 if ns.quick else 7
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print("| training step | arena, no remat | arena, min-cut | ratio (goal <= 0.5x) "
          "| time, executor (goal <= 1.3x) | time, evaluator | largest scratch |")
    print("|---|---|---|---|---|---|---|")
    for label, (file, entry, make) in MODELS.items():
        r = compare(label, file, entry, make, samples)
        print(f"| {label} | {r['plain']:,} | {r['remat']:,} | {r['remat'] / r['plain']:.2f}x "
              f"| {r['exec']:.2f}x ({r['t_exec'] * 1e3:.1f} ms without) | {r['eval']:.2f}x "
              f"| {r['scratch']:,} |", flush=True)
    label, (file, entry, make) = next(iter(MODELS.items()))
    print(f"\nbudget sweep, {label}:")
    points = sweep(file, entry, make, samples)
    if not ns.no_plot:
        plot(points, f"remat candidates: {label}")
        print(f"plot: {IMAGE.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()

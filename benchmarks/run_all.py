"""All the figures in one run, side by side with torch, xDSL, numpy and JAX.

    pip install -e ".[dev,bench]"        # torch (CPU) and xDSL, the peers
    python benchmarks/run_all.py         # about a minute; prints the table
    python benchmarks/run_all.py --quick --only parse,memory

Prints a Markdown table (figure, anfir's ratio, the peer's, the goal,
PASS/MISS) and, below it, the raw times behind every ratio.  A peer that is
not installed shows "n/a"; a figure whose anfir part fails shows ERROR with
the exception below the table.  Not part of the test suite.  Exit status 0
unless ``--strict`` is given and a goal is missed.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

# One BLAS thread, set before numpy loads: anfir, numpy and torch (see
# peers.py) then all compute on one core, and a multi-threaded BLAS sharing a
# busy 2-core machine does not turn a 200 µs matmul into a 2 ms one at random.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
# XLA's CPU runtime on one thread too (the JAX figures), set before JAX loads.
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))           # harness, peers, workloads, figures
sys.path.insert(1, str(HERE.parent))    # anfir from the checkout when not installed

import numpy as np  # noqa: E402

import bench_convnet  # noqa: E402
import bench_jax  # noqa: E402
import bench_lowlevel  # noqa: E402
import figures  # noqa: E402
import peers  # noqa: E402
from harness import format_details, format_table  # noqa: E402


def all_figures(quick: bool = False) -> dict:
    """Every figure by key, in table order: issue 6's, the JAX back end's, the low level's,
    the convolutional networks'."""
    return {**figures.all_figures(quick), **bench_jax.all_figures(quick), **bench_lowlevel.all_figures(quick),
            **bench_convnet.all_figures(quick)}


KEYS = list(all_figures())
"""Names for ``--only``, in table order."""


def environment() -> str:
    """One line naming the machine, the versions measured and the load (a busy
    machine makes every ratio noisy: rerun when the 1-minute load is high)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"Python {platform.python_version()}, numpy {np.__version__}, "
            f"torch {peers.torch_version() or 'n/a'}, xDSL {peers.xdsl_version() or 'n/a'}, "
            f"JAX {bench_jax.jax_version() or 'n/a'}, "
            f"{platform.machine()} {platform.system()}, {os.cpu_count()} CPUs, load {load:.2f}")


def main(argv: list[str] | None = None) -> int:
    """Measure the selected figures and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(KEYS)}")
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a goal is missed")
    options = parser.parse_args(argv)
    wanted = [k.strip() for k in options.only.split(",") if k.strip()] or KEYS
    unknown = sorted(set(wanted) - set(KEYS))
    if unknown:
        parser.error(f"unknown figure(s) {', '.join(unknown)}; choose from {', '.join(KEYS)}")
    runners = all_figures(options.quick)
    print(environment())
    results = []
    for key in KEYS:
        if key not in wanted:
            continue
        start = time.perf_counter()
        results.append(runners[key]())
        print(f"  measured {key} in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    print()
    print(format_table(results))
    print()
    print(format_details(results))
    missed = [f for f in results if f.verdict in ("MISS", "ERROR")]
    return 1 if options.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())

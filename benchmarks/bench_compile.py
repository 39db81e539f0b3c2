"""Compile time grows linearly with program size.

Compiles a straight-line chain of N ``let``s (each node using the previous
one, with a foldable constant and a duplicated subexpression every few
nodes, so the optimizer has work) for N = 1,000 and N = 10,000, and prints
the ratio of the times.  Linear means about 10x; the target is at most 12x.

    python benchmarks/bench_compile.py [--small 1000] [--large 10000] [--repeat 3]

Exit status 1 when the ratio exceeds the bound.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import anfir  # noqa: E402
from anfir.passes.pipeline import compile_program  # noqa: E402

BOUND = 12.0
"""The largest acceptable ratio of compile times (10x the nodes)."""


def chain_source(length: int) -> str:
    """ANF text of ``main(x)``: ``length`` lets, each depending on the previous one."""
    lines = ["def main(x: f64) -> f64 ="]
    prev = "x"
    for i in range(length):
        kind = i % 4
        if kind == 0:
            expr = f"{prev} * (2.0 - 1.5)"       # a constant to fold
        elif kind == 1:
            expr = f"{prev} + 1.0"
        elif kind == 2:
            expr = f"sin({prev}) + sin({prev})"  # a common subexpression
        else:
            expr = f"{prev} * 1.0"               # an identity
        lines.append(f"  let v{i} = {expr} in")
        prev = f"v{i}"
    lines.append(f"  {prev}")
    return "\n".join(lines) + "\n"


def compile_seconds(length: int, repeat: int) -> float:
    """The best of ``repeat`` compile times (parsing excluded) for a chain of ``length``."""
    module = anfir.parse(chain_source(length), filename=f"chain{length}.anf")
    best = float("inf")
    for _ in range(repeat):
        gc.collect()  # the previous run's garbage is not this run's cost
        start = time.process_time()
        result = compile_program(module, args=[0.5])
        best = min(best, time.process_time() - start)
        del result
    return best


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the times and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=1000)
    parser.add_argument("--large", type=int, default=10000)
    parser.add_argument("--repeat", type=int, default=3)
    options = parser.parse_args(argv)
    compile_seconds(100, 1)  # warm up imports and caches
    small = compile_seconds(options.small, options.repeat)
    large = compile_seconds(options.large, options.repeat)
    ratio = large / small
    print(f"compile {options.small:>6} nodes: {small * 1000:9.1f} ms")
    print(f"compile {options.large:>6} nodes: {large * 1000:9.1f} ms")
    print(f"ratio: {ratio:.2f} (bound {BOUND:.0f}x for {options.large / options.small:.0f}x the nodes)")
    return 0 if ratio <= BOUND else 1


if __name__ == "__main__":
    sys.exit(main())

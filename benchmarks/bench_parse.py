"""Parser throughput: lines per second on a long straight-line program.

Usage: ``python benchmarks/bench_parse.py [LINES] [--engine tables|lark]``.
The program is one definition whose body is a chain of typical lines
``let x123 = x122 * 1.0001 + sin(x122) in`` (the goal is >= 40,000 lines/s
for 20,000 lines).  Prints the best of a few runs, with and without resolve.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from anfir.grammar.parser import parse_module  # noqa: E402


def program(lines: int) -> str:
    """A ``def`` of ``lines`` typical let-lines."""
    body = [f"  let x{i + 1} = x{i} * 1.0001 + sin(x{i}) in" for i in range(lines)]
    return "\n".join(["def f(x0) ="] + body + [f"  x{lines}"]) + "\n"


def best_rate(text: str, lines: int, resolve: bool, engine: str, runs: int) -> tuple[float, float]:
    """The best lines/s over ``runs`` parses: (wall clock, CPU time of this process).

    CPU time is the steadier figure on a shared machine.
    """
    best_wall = best_cpu = float("inf")
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        parse_module(text, "bench.anf", resolve=resolve, engine=engine)
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
    return lines / best_wall, lines / best_cpu


def main() -> None:
    """Run the benchmark and print lines/s."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("lines", type=int, nargs="?", default=20000)
    parser.add_argument("--engine", choices=("tables", "lark"), default="tables")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    text = program(args.lines)
    parse_module("def warm(x) = x", resolve=False)  # builds the parser object once
    for resolve in (False, True):
        wall, cpu = best_rate(text, args.lines, resolve, args.engine, args.runs)
        print(f"{args.lines} lines, engine={args.engine}, resolve={resolve}: "
              f"{wall:,.0f} lines/s (wall clock), {cpu:,.0f} lines/s (CPU time)")


if __name__ == "__main__":
    main()

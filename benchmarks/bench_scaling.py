"""Compile time grows linearly on the program shapes of issue 10.

For each shape — a chain of calls, nested 1-tuples, a wide tuple literal,
nested ``if``s — compiles the program at N and at 10N units and prints both
times and their ratio: linear is 10x, the goal at most 12x.  Then compiles the
first- and the second-order gradient of one straight-line chain of lets and
prints the second order's time and peak memory over the first order's: the
goal is within 10x.

    python benchmarks/bench_scaling.py [--quick] [--repeat 3] [--only calls,ifs,order2]

Times are CPU seconds (``time.process_time``: another process's load does not
count), parsing excluded, the best of ``--repeat`` compiles with the garbage
of the previous one collected first.  Peak memory is measured in a fresh
process per compile (``ru_maxrss`` after the compile minus before it), so
neither the other compile nor the timing runs leave their high-water mark.
Every compiled program is first checked against ``anfir.run`` of the source.
Exit status 1 when a goal is missed.
"""

from __future__ import annotations

import argparse
import gc
import math
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))           # workloads
sys.path.insert(1, str(HERE.parent))    # anfir from the checkout when not installed

import anfir  # noqa: E402
import workloads  # noqa: E402
from anfir.passes.pipeline import compile_program  # noqa: E402
from anfir.ir.walk import all_cnodes, reachable_graphs  # noqa: E402

RATIO_BOUND = 12.0
"""The largest acceptable compile-time ratio for 10x the program."""

ORDER_BOUND = 10.0
"""The largest acceptable second-order / first-order ratio (time and memory)."""


@dataclass(frozen=True)
class Shape:
    """One program shape: its generator and the sizes it is measured at."""

    key: str
    """The name ``--only`` takes."""
    label: str
    """The shape's name in the table."""
    unit: str
    """What one unit of size is (``calls``)."""
    source: Callable[[int], str]
    """ANF text of ``main(x)`` at a size."""
    size: int
    """N (the figure compiles N and 10N)."""
    quick_size: int
    """N with ``--quick``."""


SHAPES = (
    Shape("calls", "call chain", "calls", workloads.call_chain_anf, 400, 100),
    Shape("tuples", "nested 1-tuples", "levels", workloads.nested_tuples_anf, 400, 100),
    Shape("wide", "wide tuple literal", "elements", workloads.wide_tuple_anf, 5000, 1000),
    Shape("ifs", "nested ifs", "ifs", workloads.nested_ifs_anf, 1000, 200),
)
"""The shapes, in table order."""

ORDER_SIZE, ORDER_QUICK_SIZE = 2000, 200
"""Lets in the chain whose first- and second-order gradients are compared."""

ARGUMENT = 0.5
ORDER_ARGUMENTS = (0.5, 0.7)


def same_value(a: Any, b: Any) -> bool:
    """``a == b`` for results that may nest tuples thousands deep (Python's own
    comparison recurses), floats compared to 1e-9."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if isinstance(x, tuple) or isinstance(y, tuple):
            if not (isinstance(x, tuple) and isinstance(y, tuple)) or len(x) != len(y):
                return False
            stack.extend(zip(x, y))
        elif not (x == y or (isinstance(x, float) and isinstance(y, float)
                             and math.isclose(x, y, rel_tol=1e-9))):
            return False
    return True


def compile_seconds(source: str, args: list[Any], repeat: int) -> tuple[float, int]:
    """The best CPU time of ``repeat`` compiles of ``source`` (parsing excluded)
    and the number of call nodes compiled; the first compiled program is
    checked against ``anfir.run`` of the source."""
    module = anfir.parse(source)
    best, nodes = math.inf, 0
    for sample in range(max(repeat, 1)):
        gc.collect()  # the previous compile's garbage is not this one's cost
        start = time.process_time()
        result = compile_program(module, args=args)
        best = min(best, time.process_time() - start)
        if sample == 0:
            if not same_value(anfir.run(result.graph, *args), anfir.run(module["main"], *args)):
                raise AssertionError("the compiled program computes a different value")
            nodes = len(all_cnodes(reachable_graphs([result.graph])))
        del result
    return best, nodes


def shape_times(shape: Shape, size: int, repeat: int) -> dict[int, float]:
    """Compile seconds of ``shape`` at ``size`` and at 10 times ``size``."""
    compile_seconds(shape.source(max(size // 10, 2)), [ARGUMENT], 1)  # warm up imports and caches
    return {n: compile_seconds(shape.source(n), [ARGUMENT], repeat)[0] for n in (size, 10 * size)}


def peak_growth(order: int, size: int) -> int:
    """Bytes the peak resident memory grows by while the ``order``-th order
    gradient of the ``size``-let chain compiles, in a fresh process."""
    out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--peak-of",
                          str(order), str(size)], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def _measure_peak(order: int, size: int) -> int:
    # In the child process: parse, then compile once, and report how much the
    # peak resident memory grew.
    module = anfir.parse(workloads.grad_order_anf(size, order))
    gc.collect()
    before = _peak_resident_bytes()
    compile_program(module, args=list(ORDER_ARGUMENTS))
    return _peak_resident_bytes() - before


def _peak_resident_bytes() -> int:
    # Linux: VmHWM, the high-water mark of this process's own memory.  (Not
    # ru_maxrss: Linux carries the parent's resident size over fork and exec
    # into the child's ru_maxrss, so a child of a big parent reads no growth.)
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource  # Unix only; on Windows the parent reports no memory figure

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS


@dataclass
class OrderCosts:
    """First- and second-order compile costs of one chain."""

    seconds: dict[int, float]
    nodes: dict[int, int]
    memory: dict[int, Optional[int]]
    """Peak memory growth in bytes (None where it cannot be measured)."""

    @property
    def time_ratio(self) -> float:
        """Second-order seconds over first-order seconds."""
        return self.seconds[2] / self.seconds[1]

    @property
    def memory_ratio(self) -> Optional[float]:
        """Second-order peak growth over first-order peak growth."""
        if self.memory[1] is None or self.memory[2] is None or self.memory[1] <= 0:
            return None
        return self.memory[2] / self.memory[1]


def order_costs(size: int, repeat: int) -> OrderCosts:
    """Compile time, compiled size and peak memory of the first- and second-order
    gradients of the ``size``-let chain."""
    compile_seconds(workloads.grad_order_anf(10, 2), list(ORDER_ARGUMENTS), 1)  # warm up
    seconds, nodes, memory = {}, {}, {}
    for order in (1, 2):
        seconds[order], nodes[order] = compile_seconds(
            workloads.grad_order_anf(size, order), list(ORDER_ARGUMENTS), repeat)
        try:
            memory[order] = peak_growth(order, size)
        except (OSError, subprocess.CalledProcessError):  # no resource module (Windows)
            memory[order] = None
    return OrderCosts(seconds, nodes, memory)


def main(argv: Optional[list[str]] = None) -> int:
    """Measure the shapes and the gradient orders; print the times and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    keys = [s.key for s in SHAPES] + ["order2"]
    parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(keys)}")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, one compile each")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--peak-of", nargs=2, type=int, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.peak_of:
        print(_measure_peak(*options.peak_of))
        return 0
    wanted = [k.strip() for k in options.only.split(",") if k.strip()] or keys
    repeat = 1 if options.quick else options.repeat
    missed = False
    for shape in SHAPES:
        if shape.key not in wanted:
            continue
        size = shape.quick_size if options.quick else shape.size
        times = shape_times(shape, size, repeat)
        ratio = times[10 * size] / times[size]
        missed |= ratio > RATIO_BOUND
        print(f"{shape.label:20} N = {size:>6,}: {times[size] * 1e3:9.1f} ms   "
              f"10N = {10 * size:>7,}: {times[10 * size] * 1e3:9.1f} ms   ratio {ratio:5.2f}x "
              f"(bound {RATIO_BOUND:.0f}x)")
    if "order2" in wanted:
        size = ORDER_QUICK_SIZE if options.quick else ORDER_SIZE
        costs = order_costs(size, repeat)
        missed |= costs.time_ratio > ORDER_BOUND
        print(f"gradient of a {size:,}-let chain, order 1: {costs.seconds[1] * 1e3:9.1f} ms, "
              f"{costs.nodes[1]:,} call nodes; order 2: {costs.seconds[2] * 1e3:9.1f} ms, "
              f"{costs.nodes[2]:,} call nodes; time ratio {costs.time_ratio:.2f}x "
              f"(bound {ORDER_BOUND:.0f}x)")
        if costs.memory_ratio is not None:
            missed |= costs.memory_ratio > ORDER_BOUND
            print(f"    peak memory growth: order 1 {costs.memory[1] / 2**20:.1f} MiB, order 2 "
                  f"{costs.memory[2] / 2**20:.1f} MiB; ratio {costs.memory_ratio:.2f}x "
                  f"(bound {ORDER_BOUND:.0f}x)")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Compile work grows linearly with the program, on the shapes of issue 10.

Counted, not timed: the number of function calls a compile makes (cProfile's
total, built-ins included) is the same on any machine under any load, and a
step that is quadratic in the program — a walk of the whole program per
inlined call, every scope re-derived after each edit, a whole nested type or
constant walked again at each of its levels, a lookup that moves one entry
per rewrite — multiplies it.  Ten times the program may cost at most twelve
times the calls.  Work done inside one call (copying a tuple) is not counted;
``benchmarks/bench_scaling.py`` times the same shapes at sizes where it would
show.  The programs are the benchmark's own (``benchmarks/workloads.py``).
"""

from __future__ import annotations

import cProfile
import importlib.util
import pstats
from pathlib import Path
from typing import Any, Callable

import pytest

import anfir
from anfir.passes.pipeline import compile_program

# benchmarks/ is a folder of scripts, not a package (and site-packages may hold
# an unrelated ``benchmarks``): load the workloads module by its path.
_WORKLOADS = Path(__file__).resolve().parent.parent / "benchmarks" / "workloads.py"
_spec = importlib.util.spec_from_file_location("anfir_bench_workloads", _WORKLOADS)
assert _spec is not None and _spec.loader is not None
workloads = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workloads)

BOUND = 12.0
"""The largest acceptable ratio of calls for ten times the program."""


def _second_order(size: int) -> str:
    return workloads.grad_order_anf(size, 2)


SHAPES: dict[str, tuple[Callable[[int], str], int, list[Any]]] = {
    "call chain": (workloads.call_chain_anf, 40, [0.5]),
    "nested 1-tuples": (workloads.nested_tuples_anf, 60, [0.5]),
    "wide tuple literal": (workloads.wide_tuple_anf, 300, [0.5]),
    "nested ifs": (workloads.nested_ifs_anf, 20, [0.5]),
    "second-order gradient of a chain": (_second_order, 8, [0.5, 0.7]),
}
"""Shape -> (program generator, the small size N, example arguments); sizes
small enough for the suite, large enough that a quadratic step shows (before
the fixes of issue 10 the chain, the tuples and the gradient counted 26x, 71x
and 18x)."""


def compile_calls(source: str, args: list[Any]) -> int:
    """The number of function calls ``compile_program`` makes on ``source``."""
    module = anfir.parse(source)
    profile = cProfile.Profile()
    profile.enable()
    try:
        compile_program(module, args=args)
    finally:
        profile.disable()
    return pstats.Stats(profile).total_calls


@pytest.mark.parametrize("shape", list(SHAPES))
def test_compile_work_is_linear(shape: str) -> None:
    generate, size, args = SHAPES[shape]
    # Once per process, not per program: gradient rules parsed, caches filled.
    compile_program(anfir.parse(generate(size)), args=args)
    small = compile_calls(generate(size), args)
    large = compile_calls(generate(10 * size), args)
    assert large / small <= BOUND, (
        f"{shape}: {large:,} calls at {10 * size} against {small:,} at {size} "
        f"({large / small:.1f}x for 10x the program)")

"""The figures of issue 6, one function each, every one returning a :class:`Figure`.

A figure whose anfir part fails (a phase still being written, a wrong
result) comes back with ``error`` set instead of raising, so one missing
piece never hides the others.  Every timed anfir result is first checked
against the peer's or a plain formula: a fast wrong answer is not a figure.
"""

from __future__ import annotations

import functools
import gc
import math
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import numpy as np

import anfir
import bench_scaling
from harness import Figure, micro, milli, paired_seconds
import peers
import workloads
from anfir.ir.walk import all_cnodes, reachable_graphs

NA = "n/a"
"""What a peer's column says when the peer is not installed."""


def measured(name: str, goal: str, unit: str = "x"
             ) -> Callable[[Callable[..., None]], Callable[..., Figure]]:
    """Make a figure function: the wrapped function fills the :class:`Figure`
    it is given; an exception inside it is recorded as the figure's ``error``
    (the details measured before it are kept), never raised."""

    def wrap(fn: Callable[..., None]) -> Callable[..., Figure]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Figure:
            fig = Figure(name, goal=goal, unit=unit)
            try:
                fn(fig, *args, **kwargs)
            except Exception as exc:  # report, never crash the table
                lines = str(exc).strip().splitlines()
                fig.error = f"{type(exc).__name__}: {lines[0] if lines else ''}"
                fig.value = fig.passed = None
            return fig

        return run

    return wrap


def cnode_count(graph: anfir.FuncGraph) -> int:
    """The number of call nodes in ``graph`` and every graph it references."""
    return len(all_cnodes(reachable_graphs([graph])))


# -- 1. parsing ---------------------------------------------------------------------------------
PARSE_GOAL = ">= 5x"


@measured("parse + build IR, lines/s vs xDSL (20,000 lines)", PARSE_GOAL)
def parse_figure(fig: Figure, lines: int = 20_000, repeat: int = 3) -> None:
    """anfir's lines/s (``anfir.parse``: tokens, graphs, name resolution) over
    xDSL's lines/s parsing the same operations in MLIR generic form."""
    anf = workloads.parse_chain_anf(lines)
    anf_lines = anf.count("\n")
    module = anfir.parse(anf, "bench.anf")
    if cnode_count(module["f"]) != lines:
        raise AssertionError(f"expected {lines} call nodes, got {cnode_count(module['f'])}")
    mlir = workloads.parse_chain_mlir(lines)
    mlir_lines = mlir.count("\n")
    work = {"anfir": lambda: anfir.parse(anf, "bench.anf")}
    xdsl = peers.xdsl_parse_peer(mlir)
    if xdsl is not None:
        work["xdsl"] = xdsl
    times = paired_seconds(work, repeat=repeat, target=0)
    rate = anf_lines / times["anfir"]
    fig.details.append(f"anfir.parse: {anf_lines} lines in {milli(times['anfir'])} "
                       f"= {rate:,.0f} lines/s")
    if xdsl is None:
        fig.peer = NA
        fig.details.append("xDSL not installed")
        return
    theirs = times["xdsl"]
    their_rate = mlir_lines / theirs
    fig.value = rate / their_rate
    fig.peer = f"{their_rate:,.0f} lines/s"
    fig.passed = fig.value >= 5.0
    fig.details.append(f"xDSL {peers.xdsl_version()} Parser.parse_module: {mlir_lines} lines in "
                       f"{milli(theirs)} = {their_rate:,.0f} lines/s")


# -- 2. the evaluator ---------------------------------------------------------------------------
EVAL_GOAL = "<= 0.5x"


@measured("evaluator time per node vs torch eager per op (1,000-op chain)", EVAL_GOAL)
def eval_figure(fig: Figure, ops: int = 1000, repeat: int = 11) -> None:
    """µs per primitive node of ``anfir.run`` on a 1,000-op scalar chain over
    torch eager's µs per op on the same chain (0-d float64 tensor)."""
    graph = anfir.parse(workloads.eval_chain_anf(ops))["chain"]
    expected = 0.5
    for i in range(ops):
        expected = expected * 1.0001 if i % 2 == 0 else expected + 0.5
    got = anfir.run(graph, 0.5)
    if not math.isclose(got, expected, rel_tol=1e-12):
        raise AssertionError(f"chain computed {got}, expected {expected}")
    work = {"anfir": lambda: anfir.run(graph, 0.5)}
    torch_chain = peers.torch_eval_chain_peer(ops)
    if torch_chain is not None:
        work["torch"] = torch_chain
    times = paired_seconds(work, repeat=repeat)
    mine = times["anfir"] / ops
    fig.details.append(f"anfir.run: {micro(mine)} per node ({ops} nodes)")
    if torch_chain is None:
        fig.peer = NA
        fig.details.append("torch not installed")
        return
    theirs = times["torch"] / ops
    fig.value = mine / theirs
    fig.peer = f"{micro(theirs)}/op"
    fig.passed = fig.value <= 0.5
    fig.details.append(f"torch {peers.torch_version()} eager: {micro(theirs)} per op")


# -- gradients: the optimized gradient graph -------------------------------------------------
def optimized_gradient(fig: Figure, module: anfir.Module, name: str, args: list, wrt: Any
                       ) -> tuple[anfir.FuncGraph, str]:
    """The pipeline-optimized gradient of ``module[name]`` and how it was made.

    Prefers the program-level ``grad`` (a definition ``d_name`` calling
    ``grad(name, ...)``, compiled with the ad phase); falls back to
    ``anfir.compile(anfir.grad(g), args=...)`` while the ad phase cannot
    expand it.
    """
    indices = (wrt,) if isinstance(wrt, int) else tuple(wrt)
    params = ", ".join(p.name or f"a{i}" for i, p in enumerate(module[name].parameters))
    text = anfir.to_text(module) + (
        f"\ndef d_{name}({params}) = grad({name}, {', '.join(map(str, indices))})({params})\n")
    try:
        program = anfir.parse(text)
        return anfir.compile(program, entry=f"d_{name}", args=args), "program-level grad, compiled"
    except Exception as exc:  # the ad phase is not there yet: say so in the details
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        fig.details.append(f"program-level grad({name}) does not compile: {reason}")
    graph = anfir.compile(anfir.grad(module[name], wrt), args=args)
    return graph, "anfir.compile(anfir.grad(g))"


GRAD_GOAL = "<= 3x"


@measured("gradient time / forward time (200-op scalar chain)", GRAD_GOAL)
def grad_ratio_figure(fig: Figure, steps: int = 50, repeat: int = 11) -> None:
    """``anfir.run`` of the optimized gradient graph over ``anfir.run`` of the
    forward graph, on ``x = x * 1.0001 + sin(x) * 0.001`` 50 times; torch's
    autograd over its own forward is the peer."""
    module = anfir.parse(workloads.grad_chain_anf(steps))
    forward = module["f"]
    x = 0.5
    expected_dx = 1.0
    value = x
    for _ in range(steps):
        expected_dx *= 1.0001 + math.cos(value) * 0.001
        value = value * 1.0001 + math.sin(value) * 0.001
    if not math.isclose(anfir.run(forward, x), value, rel_tol=1e-12):
        raise AssertionError("the forward chain computed a wrong value")
    raw = anfir.grad(forward)
    check_scalar_gradient("unoptimized", anfir.run(raw, x), expected_dx)
    optimized, how = optimized_gradient(fig, module, "f", [x], 0)
    check_scalar_gradient("optimized", anfir.run(optimized, x), expected_dx)
    work = {"forward": lambda: anfir.run(forward, x), "optimized": lambda: anfir.run(optimized, x),
            "raw": lambda: anfir.run(raw, x)}
    torch_pair = peers.torch_grad_chain_peers(steps)
    if torch_pair is not None:
        work["torch forward"], work["torch grad"] = torch_pair
    t = paired_seconds(work, repeat=repeat)
    fig.value = t["optimized"] / t["forward"]
    fig.passed = fig.value <= 3.0
    fig.details += [
        f"forward: {micro(t['forward'])} ({cnode_count(forward)} call nodes)",
        f"optimized gradient: {micro(t['optimized'])} = {fig.value:.2f}x "
        f"({cnode_count(optimized)} call nodes; {how})",
        f"unoptimized anfir.grad: {micro(t['raw'])} = {t['raw'] / t['forward']:.2f}x "
        f"({cnode_count(raw)} call nodes)",
    ]
    if torch_pair is None:
        fig.peer = NA
        return
    ratio = t["torch grad"] / t["torch forward"]
    fig.peer = f"{ratio:.2f}x"
    fig.details.append(f"torch: forward {micro(t['torch forward'])}, autograd.grad "
                       f"{micro(t['torch grad'])} = {ratio:.2f}x")


def check_scalar_gradient(label: str, got: float, expected: float) -> None:
    """Raise when a gradient is not the expected number (a wrong answer is no figure)."""
    if not math.isclose(got, expected, rel_tol=1e-9):
        raise AssertionError(f"the {label} gradient is {got}, expected {expected}")


# -- mlp_loss ----------------------------------------------------------------------------------
def mlp_figure(batch: int, width: int, outputs: int, goal: float, repeat: int = 11) -> Figure:
    """The optimized gradient of ``mlp_loss`` (w.r.t. ``w1`` and ``w2``) over
    the hand-written numpy forward+backward; torch autograd as the peer."""
    name = f"mlp_loss gradient vs numpy by hand (B={batch}, D=H={width}, K={outputs})"
    return measured(name, f"<= {goal:g}x")(_mlp_figure)(batch, width, outputs, goal, repeat)


def _mlp_figure(fig: Figure, batch: int, width: int, outputs: int, goal: float,
                repeat: int) -> None:
    inputs = peers.mlp_inputs(batch, width, outputs)
    module = anfir.parse(workloads.MLP_ANF)
    expected = peers.numpy_mlp_grad(*inputs)
    raw = anfir.grad(module["mlp_loss"], (0, 1))
    check_array_gradients("unoptimized", anfir.run(raw, *inputs), expected)
    optimized, how = optimized_gradient(fig, module, "mlp_loss", list(inputs), (0, 1))
    check_array_gradients("optimized", anfir.run(optimized, *inputs), expected)
    by_hand = anfir.parse(workloads.MLP_BY_HAND_ANF)["mlp_grad_by_hand"]
    check_array_gradients("hand-written ANF", anfir.run(by_hand, *inputs), expected)
    work = {"numpy": peers.numpy_mlp_peer(inputs), "optimized": lambda: anfir.run(optimized, *inputs),
            "raw": lambda: anfir.run(raw, *inputs), "by hand": lambda: anfir.run(by_hand, *inputs)}
    torch_grad = peers.torch_mlp_peer(inputs)
    if torch_grad is not None:
        work["torch"] = torch_grad
    t = paired_seconds(work, repeat=repeat)
    fig.value = t["optimized"] / t["numpy"]
    fig.passed = fig.value <= goal
    fig.details += [
        f"numpy forward+backward: {micro(t['numpy'])}",
        f"optimized gradient: {micro(t['optimized'])} = {fig.value:.2f}x "
        f"({cnode_count(optimized)} call nodes; {how})",
        f"unoptimized anfir.grad: {micro(t['raw'])} = {t['raw'] / t['numpy']:.2f}x "
        f"({cnode_count(raw)} call nodes)",
        f"anfir.run of numpy's backward written in ANF: {micro(t['by hand'])} = "
        f"{t['by hand'] / t['numpy']:.2f}x ({cnode_count(by_hand)} call nodes; the floor "
        "a perfect optimizer reaches with today's evaluator and primitives)",
    ]
    faults = {name: page_faults_per_call(work[name]) for name in ("numpy", "optimized")}
    if None not in faults.values() and any(faults.values()):
        fig.details.append(f"minor page faults per call: numpy {faults['numpy']:.0f}, "
                           f"anfir optimized {faults['optimized']:.0f} (memory the allocator "
                           "returned to the OS and takes back, zeroed, on every call)")
    if torch_grad is None:
        fig.peer = NA
        return
    fig.peer = f"{t['torch'] / t['numpy']:.2f}x"
    fig.details.append(f"torch autograd: {micro(t['torch'])} = {t['torch'] / t['numpy']:.2f}x")


def page_faults_per_call(fn: Callable[[], Any], calls: int = 50) -> float | None:
    """Minor page faults per call of ``fn`` (None where ``resource`` is missing)."""
    try:
        import resource
    except ImportError:  # not on Windows
        return None
    fn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls


def check_array_gradients(label: str, got: Any, expected: tuple[np.ndarray, ...]) -> None:
    """Raise when the gradients ``got`` differ from numpy's."""
    if len(got) != len(expected) or not all(
            np.allclose(g, e, rtol=1e-10, atol=1e-12) for g, e in zip(got, expected)):
        raise AssertionError(f"the {label} gradient differs from the numpy one")


# -- compile time --------------------------------------------------------------------------------
COMPILE_GOAL = "<= 12x"


@measured("compile time, 10,000-node chain / 1,000-node chain", COMPILE_GOAL)
def compile_figure(fig: Figure, small: int = 1000, large: int = 10_000, repeat: int = 3) -> None:
    """``anfir.compile`` time (parsing excluded) of ``bench_compile``'s chain
    of 10,000 lets over the chain of 1,000: linear is 10x."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_compile import chain_source  # the compile owner's workload, shared

    work = {}
    for length in (small, large):
        module = anfir.parse(chain_source(length), f"chain{length}.anf")
        compiled = anfir.compile(module, args=[0.5])
        if not math.isclose(anfir.run(compiled, 0.5), anfir.run(module["main"], 0.5), rel_tol=1e-9):
            raise AssertionError(f"the compiled chain of {length} computes a different value")
        fig.details.append(f"chain of {length:>6} lets: {cnode_count(module['main'])} -> "
                           f"{cnode_count(compiled)} call nodes")
        work[length] = lambda module=module: anfir.compile(module, args=[0.5])
    # Samples of the two sizes alternate (a busy moment hits both); the small
    # one is batched to about 0.3 s so its timer noise matches the large one's.
    times = paired_seconds(work, repeat=repeat, target=0.3)
    for length in (small, large):
        fig.details.append(f"compile {length:>6} lets: {milli(times[length])}")
    fig.details.append("per phase, large / small: " + phase_ratios(chain_source, small, large))
    fig.value = times[large] / times[small]
    fig.passed = fig.value <= 12.0


def phase_ratios(source: Callable[[int], str], small: int, large: int) -> str:
    """Each pipeline phase's time on the large program over the small one (one
    more compile of each, best of two): which phase grows faster than the input."""
    from anfir.passes.pipeline import compile_program

    phases: dict[int, dict[str, float]] = {}
    for length in (small, large):
        module = anfir.parse(source(length))
        runs = [compile_program(module, args=[0.5]).timings for _ in range(2)]
        phases[length] = {name: min(r[name] for r in runs) for name in runs[0]}
    return ", ".join(f"{name} {phases[large][name] / phases[small][name]:.1f}x"
                     for name in phases[small] if phases[small][name] > 1e-4)


# -- compile scaling (issue 10) --------------------------------------------------------------
SCALING_GOAL = f"<= {bench_scaling.RATIO_BOUND:g}x"


def scaling_figure(key: str, quick: bool = False, repeat: int = 3) -> Figure:
    """CPU time of ``anfir.compile`` on one of ``bench_scaling``'s shapes at 10N
    over its time at N: linear is 10x."""
    shape = next(s for s in bench_scaling.SHAPES if s.key == key)
    size = shape.quick_size if quick else shape.size
    name = f"compile time, {shape.label} ({10 * size:,} / {size:,} {shape.unit})"
    return measured(name, SCALING_GOAL)(_scaling_figure)(shape, size, repeat)


def _scaling_figure(fig: Figure, shape: "bench_scaling.Shape", size: int, repeat: int) -> None:
    times = bench_scaling.shape_times(shape, size, repeat)
    for n in (size, 10 * size):
        fig.details.append(f"{n:>7,} {shape.unit}: {milli(times[n])} (CPU, parsing excluded)")
    fig.value = times[10 * size] / times[size]
    fig.passed = fig.value <= bench_scaling.RATIO_BOUND


ORDER_GOAL = f"<= {bench_scaling.ORDER_BOUND:g}x"


def order_figure(quick: bool = False, repeat: int = 3) -> Figure:
    """Second-order over first-order gradient compile of one chain of lets:
    CPU time (the figure) and peak memory (in the details; both must pass)."""
    size = bench_scaling.ORDER_QUICK_SIZE if quick else bench_scaling.ORDER_SIZE
    name = f"compile time, 2nd-order / 1st-order gradient ({size:,}-let chain)"
    return measured(name, ORDER_GOAL)(_order_figure)(size, repeat)


def _order_figure(fig: Figure, size: int, repeat: int) -> None:
    costs = bench_scaling.order_costs(size, repeat)
    for order in (1, 2):
        memory = costs.memory[order]
        grown = f", peak memory +{memory / 2**20:.1f} MiB" if memory is not None else ""
        fig.details.append(f"order {order}: {milli(costs.seconds[order])} (CPU), "
                           f"{costs.nodes[order]:,} call nodes compiled{grown}")
    fig.value = costs.time_ratio
    fig.passed = fig.value <= bench_scaling.ORDER_BOUND
    if costs.memory_ratio is None:
        fig.details.append("peak memory not measured on this system")
    else:
        fig.details.append(f"peak memory ratio {costs.memory_ratio:.2f}x (goal {ORDER_GOAL})")
        fig.passed = fig.passed and costs.memory_ratio <= bench_scaling.ORDER_BOUND


# -- memory ---------------------------------------------------------------------------------------
MEMORY_GOAL = "flat (< 64 KiB)"
MEMORY_SLACK = 64 * 1024
"""Peak growth tolerated between 1,000 and 100,000 steps: any per-step leak
(a frame, a closure, a float kept alive) would be megabytes."""


def peak_bytes(fn: Callable[[], Any]) -> tuple[int, float]:
    """The tracemalloc peak (bytes above the start) while ``fn`` runs, and its seconds."""
    gc.collect()
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        start = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak - base, elapsed


@measured("peak memory growth of a 100,000-step loop (tracemalloc)", MEMORY_GOAL, unit="KiB")
def memory_figure(fig: Figure, steps: tuple[int, ...] = (1_000, 10_000, 100_000)) -> None:
    """The tracemalloc peak of ``anfir.run`` of two loops (a local recursive
    closure, a top-level tail recursion) at 100,000 steps minus at 1,000.

    A control, the non-tail recursion ``depth``, must grow: it shows the
    measurement sees the evaluator's frames at all."""
    module = anfir.parse(workloads.LOOP_ANF)
    loops = {
        "local closure loop": lambda n: anfir.run(module["run_loop"], 0.99999, n),
        "top-level tail loop": lambda n: anfir.run(module["count"], 0, n, 1.0),
    }
    worst = -math.inf
    for label, run in loops.items():
        run(10)  # compile the graphs to flat code outside the measurement
        peaks = []
        for n in steps:
            peak, elapsed = peak_bytes(lambda: run(n))
            peaks.append(peak)
            fig.details.append(f"{label}, {n:>7} steps: peak {peak / 1024:8.1f} KiB "
                               f"({milli(elapsed)} under tracemalloc)")
        worst = max(worst, peaks[-1] - peaks[0])
    depth = module["depth"]
    anfir.run(depth, 10)
    small, _ = peak_bytes(lambda: anfir.run(depth, 1_000))
    large, _ = peak_bytes(lambda: anfir.run(depth, 10_000))
    fig.details.append(f"control, non-tail recursion depth 1,000 -> 10,000: peak "
                       f"{small / 1024:.1f} -> {large / 1024:.1f} KiB (must grow)")
    if large - small < MEMORY_SLACK:
        raise AssertionError("tracemalloc does not see the evaluator's frames: no figure")
    fig.value = worst / 1024
    fig.passed = worst < MEMORY_SLACK


def all_figures(quick: bool = False) -> dict[str, Callable[[], Figure]]:
    """The figures by key, in table order (``quick``: fewer samples, for a smoke run)."""
    few, many = (1, 3) if quick else (3, 11)
    return {
        "parse": lambda: parse_figure(repeat=few),
        "eval": lambda: eval_figure(repeat=many),
        "grad": lambda: grad_ratio_figure(repeat=many),
        "mlp_small": lambda: mlp_figure(4, 16, 16, 2.0, repeat=many),
        "mlp_large": lambda: mlp_figure(64, 256, 10, 1.2, repeat=many),
        "compile": lambda: compile_figure(repeat=few),
        "memory": memory_figure,
        **{f"scale_{shape.key}": functools.partial(scaling_figure, shape.key, quick, few)
           for shape in bench_scaling.SHAPES},
        "order2": lambda: order_figure(quick, few),
    }

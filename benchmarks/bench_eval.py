"""Evaluator speed: µs per primitive node on a 1,000-op scalar chain, and calls.

Run ``python benchmarks/bench_eval.py``.  Plain ``time.perf_counter`` timers
(best of several repeats); a torch eager column is printed when torch imports.
The goal (issue 6) is at most 1 µs per primitive node on the chain.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Callable

# Runnable as a plain script from a checkout (the package need not be installed).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import anfir  # noqa: E402
from anfir.eval import code_for  # noqa: E402
from anfir.ir import FuncGraph, ValueNode  # noqa: E402
from anfir.primitives import PRIMITIVES  # noqa: E402

P = PRIMITIVES


def chain_graph(ops: int) -> FuncGraph:
    """``x = x * 1.0001 + 0.5`` repeated: ``ops`` primitive nodes in one graph."""
    g = FuncGraph("chain")
    node = g.add_parameter("x")
    for _ in range(ops // 2):
        node = g.apply(P["mul"], node, 1.0001)
        node = g.apply(P["add"], node, 0.5)
    g.output = node
    return g


def register_chain_graph(ops: int) -> FuncGraph:
    """``x = x * a + b`` repeated, ``a`` and ``b`` parameters: the same chain with
    no constant operand (the evaluator's F2 instructions instead of K2)."""
    g = FuncGraph("register_chain")
    node = g.add_parameter("x")
    a = g.add_parameter("a")
    b = g.add_parameter("b")
    for _ in range(ops // 2):
        node = g.apply(P["mul"], node, a)
        node = g.apply(P["add"], node, b)
    g.output = node
    return g


def loop_graph() -> FuncGraph:
    """``loop(i, acc) = if i < n then loop(i + 1, acc * 1.0001 + 0.5) else acc`` (tail calls)."""
    loop = FuncGraph("loop")
    i = loop.add_parameter("i")
    acc = loop.add_parameter("acc")
    n = loop.add_parameter("n")
    then_g = FuncGraph("✓loop")
    step = then_g.apply(P["add"], then_g.apply(P["mul"], acc, 1.0001), 0.5)
    then_g.output = then_g.apply(ValueNode(loop), then_g.apply(P["add"], i, 1), step, n)
    else_g = FuncGraph("✗loop")
    else_g.output = acc
    cond = loop.apply(P["lt"], i, n)
    loop.output = loop.apply(loop.apply(P["switch"], cond, ValueNode(then_g), ValueNode(else_g)))
    return loop


def best(fn: Callable[[], Any], repeat: int = 7) -> float:
    """The fastest of ``repeat`` runs, in seconds."""
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def torch_chain(ops: int) -> Callable[[], Any] | None:
    """The same chain in torch eager on a 0-d tensor, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    x0 = torch.tensor(1.0, dtype=torch.float64)

    def run() -> Any:
        x = x0
        for _ in range(ops // 2):
            x = x * 1.0001 + 0.5
        return x

    return run


def main() -> None:
    """Print the figures."""
    ops = 1000
    g = chain_graph(ops)
    start = time.perf_counter()
    code_for(g)
    compile_s = time.perf_counter() - start
    per_run = best(lambda: [anfir.run(g, 1.0) for _ in range(100)]) / 100
    print(f"chain of {ops} ops: compile {compile_s * 1e3:.2f} ms, "
          f"run {per_run * 1e6 / ops:.3f} µs/node")
    regs = register_chain_graph(ops)
    per_run = best(lambda: [anfir.run(regs, 1.0, 1.0001, 0.5) for _ in range(100)]) / 100
    print(f"the same chain on parameters (x * a + b): {per_run * 1e6 / ops:.3f} µs/node")
    tch = torch_chain(ops)
    if tch is None:
        print("torch eager: skipped (torch not importable)")
    else:
        t = best(lambda: [tch() for _ in range(10)]) / 10
        print(f"torch eager, same chain: {t * 1e6 / ops:.3f} µs/node")

    loop = loop_graph()
    steps = 100_000
    t = best(lambda: anfir.run(loop, 0, 1.0, steps), repeat=3)
    # Each step: lt, fused branch, mul, add, add, tail call.
    print(f"tail loop of {steps} steps: {t * 1e6 / steps:.3f} µs/step")

    fib = fib_graph()
    t = best(lambda: anfir.run(fib, 20), repeat=3)
    print(f"fibonacci(20) (21,891 calls): {t * 1e3:.1f} ms, {t * 1e6 / 21891:.2f} µs/call")


def fib_graph() -> FuncGraph:
    """``fibonacci(n)`` as the parser builds it (nested switch branches)."""
    fib = FuncGraph("fibonacci")
    n = fib.add_parameter("n")
    t1 = FuncGraph("✓fibonacci")
    t1.output = ValueNode(0)
    e1 = FuncGraph("✗fibonacci")
    t2 = FuncGraph("✓✗fibonacci")
    t2.output = ValueNode(1)
    e2 = FuncGraph("✗✗fibonacci")
    a = e2.apply(ValueNode(fib), e2.apply(P["sub"], n, 1))
    b = e2.apply(ValueNode(fib), e2.apply(P["sub"], n, 2))
    e2.output = e2.apply(P["add"], a, b)
    c2 = e1.apply(P["eq"], n, 1)
    e1.output = e1.apply(e1.apply(P["switch"], c2, ValueNode(t2), ValueNode(e2)))
    c1 = fib.apply(P["lt"], n, 1)
    fib.output = fib.apply(fib.apply(P["switch"], c1, ValueNode(t1), ValueNode(e1)))
    return fib


if __name__ == "__main__":
    main()

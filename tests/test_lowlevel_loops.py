"""Loops lower to the buffer IR (issue 25): the gradients of ``scan`` / ``fori_loop`` programs
(orders 1 and 2) compiled with ``lower=True`` run on the low-level executor, and from their reloaded ``.lir``
dumps, to ``anfir.run``'s values and JAX's (float64); the arena equals max live; a scan's
stacked residuals are one planned buffer each, so on a long sequence the planned arena
grows by exactly their bytes; located errors for what does not lower or load."""

from __future__ import annotations

import re
import tracemalloc
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import pytest

import anfir
from anfir.errors import AnfirError, AnfirRuntimeError
from anfir.lowlevel import executor as executor_module
from anfir.lowlevel import load_lir_text, print_program
from anfir.lowlevel.executor import Executor
from anfir.lowlevel.loader import LirError
from anfir.lowlevel.program import Branch, Buffer, Instr, Loop, LowProgram, lives, linear
from anfir.primitives import indexing

jax = pytest.importorskip("jax")
jnp = jax.numpy
lax = jax.lax
jax.config.update("jax_enable_x64", True)

PROGRAM = """
def cumsum_loss(xs) =
  let r = scan(lambda (c, x) (c + x * c + x, c * x) end, 1.0, xs) in
  r[0] + sum(r[1] * r[1])
def g_cumsum(xs) = grad(cumsum_loss)(xs)

def rnn_loss(W, U, xs) =
  let r = scan(lambda (h, x) let h2 = tanh(W @ h + U @ x) in (h2, sum(h2 * h2)) end,
               zeros((3,)), xs) in
  sum(r[1]) + sum(r[0])
def g_rnn(W, U, xs) = grad(rnn_loss, 0, 1, 2)(W, U, xs)
def g_rnn_w(W, U, xs) = grad(rnn_loss)(W, U, xs)

def newton_sqrt(a) = fori_loop(0, 6, lambda (i, y) 0.5 * (y + a / y) end, a)
def g_newton(a) = grad(newton_sqrt)(a)

def halving(x) =
  let loop = lambda (i, acc) if i < 7 then loop(i + 1, acc * 0.5 + x * x) else acc end in
  loop(0, x)
def g_halving(x) = grad(halving)(x)
def gg_halving(x) = grad(grad(halving))(x)

def halving_n(x, n) =
  let loop = lambda (i, acc) if i < n then loop(i + 1, acc * 0.5 + x * x) else acc end in
  loop(0, x)
def g_halving_n(x, n) = grad(halving_n)(x, n)

def halvings(x) =
  let loop = lambda (y, scale) if y < 1.0 then scale * y else loop(y / 2.0, scale * 3.0) end in
  loop(x, 1.0)

def fib(a) = fori_loop(0, 6, lambda (i, p) (p[1] * a, p[0] + p[1]) end, (0.5, 1.0))
def g_fib(a) = grad(lambda (a) let r = fib(a) in r[0] * r[1] end)(a)

def nested(xs) =
  scan(lambda (c, row) let r = scan(lambda (d, x) (d * 0.5 + x * c, d) end, c, row) in
                       (r[0], sum(r[1])) end, 1.0, xs)
def g_nested(xs) = grad(lambda (xs) let r = nested(xs) in r[0] + sum(r[1] * r[1]) end)(xs)

def rev_loss(xs, ws) =
  let r = scan(lambda (c, p) (c * p[1] + p[0], c) end, 0.5, (xs, ws), reverse=true) in
  r[0] + sum(r[1])
def g_rev(xs, ws) = grad(rev_loss, 0, 1)(xs, ws)

def gg_newton(a) = grad(grad(newton_sqrt))(a)
def gg_cumsum(xs) = grad(lambda (v) sum(g_cumsum(v) * g_cumsum(v)) end)(xs)
def gg_rnn(W, U, xs) =
  grad(lambda (W, U, xs) let g = grad(rnn_loss, 0, 1, 2)(W, U, xs) in
                         sum(g[0]) + sum(g[1] * g[1]) + sum(g[2]) end, 0, 1, 2)(W, U, xs)
"""

MOD = anfir.parse(PROGRAM, "lowloops.anf")


def j_cumsum(xs: Any) -> Any:
    c, ys = lax.scan(lambda c, x: (c + x * c + x, c * x), 1.0, xs)
    return c + jnp.sum(ys * ys)


def j_rnn(W: Any, U: Any, xs: Any) -> Any:
    def step(h: Any, x: Any) -> Any:
        h2 = jnp.tanh(W @ h + U @ x)
        return h2, jnp.sum(h2 * h2)
    c, ys = lax.scan(step, jnp.zeros(3), xs)
    return jnp.sum(ys) + jnp.sum(c)


def j_newton(a: Any) -> Any:
    return lax.fori_loop(0, 6, lambda i, y: 0.5 * (y + a / y), a)


def j_halving(x: Any) -> Any:
    return lax.fori_loop(0, 7, lambda i, acc: acc * 0.5 + x * x, x)


def j_halvings(x: float) -> float:
    y, scale = x, 1.0  # the while loop, in Python
    while not y < 1.0:
        y, scale = y / 2.0, scale * 3.0
    return scale * y


def j_fib(a: Any) -> Any:
    p = lax.fori_loop(0, 6, lambda i, p: (p[1] * a, p[0] + p[1]), (0.5, 1.0))
    return p[0] * p[1]


def j_nested(xs: Any) -> Any:
    def outer(c: Any, row: Any) -> Any:
        d, ds = lax.scan(lambda d, x: (d * 0.5 + x * c, d), c, row)
        return d, jnp.sum(ds)
    c, ys = lax.scan(outer, 1.0, xs)
    return c + jnp.sum(ys * ys)


def j_rev(xs: Any, ws: Any) -> Any:
    c, ys = lax.scan(lambda c, p: (c * p[1] + p[0], c), 0.5, (xs, ws), reverse=True)
    return c + jnp.sum(ys)


def j_gg_cumsum(xs: Any) -> Any:
    return jax.grad(lambda v: jnp.sum(jax.grad(j_cumsum)(v) ** 2))(xs)


def j_gg_rnn(W: Any, U: Any, xs: Any) -> Any:
    def loss(W: Any, U: Any, xs: Any) -> Any:
        g = jax.grad(j_rnn, (0, 1, 2))(W, U, xs)
        return jnp.sum(g[0]) + jnp.sum(g[1] * g[1]) + jnp.sum(g[2])
    return jax.grad(loss, (0, 1, 2))(W, U, xs)


RNG = np.random.RandomState(11)
W = RNG.randn(3, 3) * 0.4
U = RNG.randn(3, 2) * 0.4
XS = RNG.randn(6, 2)
VEC = np.array([0.3, -0.7, 1.1, 0.4, -0.2])

CASES: list[tuple[str, tuple, Optional[Callable[..., Any]]]] = [
    ("g_cumsum", (VEC,), lambda xs: jax.grad(j_cumsum)(xs)),
    ("g_rnn", (W, U, XS), lambda *a: jax.grad(j_rnn, (0, 1, 2))(*a)),
    ("g_newton", (2.0,), lambda a: jax.grad(j_newton)(a)),
    ("g_halving", (0.8,), lambda x: jax.grad(j_halving)(x)),
    ("g_rev", (VEC, VEC[::-1].copy()), lambda *a: jax.grad(j_rev, (0, 1))(*a)),
    ("g_fib", (1.1,), lambda a: jax.grad(j_fib)(a)),  # the state swaps its two halves
    ("g_nested", (RNG.randn(3, 4),), lambda xs: jax.grad(j_nested)(xs)),  # a scan in a scan
    ("halvings", (37.0,), j_halvings),  # a while loop on a value: a do-while Loop, no trip count
    ("halving_n", (0.8, 5), None),  # a run-time trip count (no stacked output)
    # Second order: the reversed scans of the differentiated backward pass size their
    # stacked outputs by dim(ys, 0) of the forward scan's, measured off its buffer.
    ("gg_newton", (2.0,), lambda a: jax.grad(jax.grad(j_newton))(a)),
    ("gg_cumsum", (VEC,), j_gg_cumsum),
    ("gg_rnn", (W, U, XS), j_gg_rnn),
]


def leaves(value: Any) -> list[np.ndarray]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in leaves(item)]
    return [np.asarray(value, dtype=np.float64)]


def same(got: Any, want: Any) -> None:
    g, w = leaves(got), leaves(want)
    assert len(g) == len(w)
    for a, b in zip(g, w):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def header(text: str) -> dict[str, int]:
    """The figures of a ``.lir`` header line."""
    match = re.search(r"# arena: (\d+) bytes\s+max live: (\d+) bytes\s+no sharing: (\d+) bytes", text)
    assert match is not None, text[:300]
    return {"arena": int(match.group(1)), "max live": int(match.group(2)), "no sharing": int(match.group(3))}


def lowered(entry: str, args: tuple, folder: Path) -> tuple[Any, Path]:
    """``anfir.compile(..., lower=True)`` with dumps: the graph and the planned ``.lir``."""
    compiled = anfir.compile(MOD, entry=entry, args=list(args), dump_dir=str(folder), lower=True)
    (planned,) = sorted(folder.glob("*_plan_memory.lir"))
    return compiled, planned


@pytest.mark.parametrize("entry,args,reference", CASES, ids=[c[0] for c in CASES])
def test_loop_programs_lower_run_and_reload_to_the_same_values(entry: str, args: tuple,
                                                               reference: Any, tmp_path: Path) -> None:
    compiled, planned = lowered(entry, args, tmp_path)
    want = anfir.run(compiled, *args)
    if reference is not None:
        same(want, reference(*args))
    low = anfir.lower(MOD, entry=entry, args=list(args))
    assert any(isinstance(line, Loop) for line in linear(low.body))
    same(anfir.run(low, *args), want)
    reloaded = anfir.load(str(planned))
    assert isinstance(reloaded, LowProgram)
    same(anfir.run(reloaded, *args), want)
    executor = Executor(reloaded)  # bound once, run again: the state starts over each run
    same(executor.run(*args), want)
    same(executor.run(*args), want)
    figures = header(planned.read_text())
    assert figures["arena"] == figures["max live"] == low.peak_bytes == low.max_live_bytes
    assert figures["no sharing"] > figures["arena"]


def test_dumps_are_byte_identical_and_every_instruction_keeps_its_location(tmp_path: Path) -> None:
    texts = []
    for run in ("a", "b"):
        folder = tmp_path / run
        lowered("g_rnn", (W, U, XS), folder)
        texts.append({p.name: p.read_bytes() for p in sorted(folder.glob("*.lir"))})
    assert texts[0] == texts[1] and len(texts[0]) == 3
    low = anfir.lower(MOD, entry="g_rnn", args=[W, U, XS])
    lines = linear(low.body)
    assert all(line.loc is not None for line in lines if isinstance(line, (Instr, Loop, Branch)))
    assert any("lowloops.anf" in line.loc.file for line in lines if isinstance(line, Instr) and line.loc)
    assert print_program(load_lir_text(print_program(low))) == print_program(low)


def test_no_two_buffers_live_at_once_share_bytes() -> None:
    low = anfir.lower(MOD, entry="g_rnn", args=[W, U, XS])
    life = lives(low)
    allocs = low.allocs()
    assert sum(1 for line in linear(low.body) if isinstance(line, Loop)) == 2
    for i, a in enumerate(allocs):
        for b in allocs[i + 1:]:
            overlap_time = life[a][0] <= life[b][1] and life[b][0] <= life[a][1]
            assert a.offset is not None and b.offset is not None
            overlap_bytes = a.offset < b.offset + b.size and b.offset < a.offset + a.size
            assert not (overlap_time and overlap_bytes), (a.name, b.name)


def _stacked(low: LowProgram, steps: int) -> tuple[list[Buffer], list[Buffer]]:
    """The forward loop's stacked outputs that the reversed (backward) loop reads, and
    every buffer of ``steps`` rows the backward loop touches."""
    forward, backward = [line for line in linear(low.body) if isinstance(line, Loop)]
    written = {b for line in linear(forward.body) if isinstance(line, Instr)
               and line.prim is indexing.scatter_nd for mode, b in line.operands if mode == "@inout"}
    touched = {b for line in linear(backward.body) if isinstance(line, Instr)
               for _, b in line.operands if b.kind == "alloc" and b.shape and b.shape[0] == steps}
    return sorted(written & touched, key=lambda b: b.name), sorted(touched, key=lambda b: b.name)


def test_the_residuals_of_a_long_sequence_are_what_the_planner_reports() -> None:
    short, long = 8, 512
    lows = {t: anfir.lower(MOD, entry="g_rnn_w", args=[W, U, RNG.randn(t, 2)]) for t in (short, long)}
    residuals = {t: _stacked(lows[t], t) for t in lows}
    # The residuals (h, and the captured W and U, per step) are one buffer each, written
    # row by row in place by the forward loop and read by the reversed one.
    names = [[b.name for b in residuals[t][0]] for t in lows]
    assert names[0] == names[1] and len(names[0]) == 3
    assert sorted(b.shape[1:] for b in residuals[long][0]) == [(3,), (3, 2), (3, 3)]
    for t, low in lows.items():
        assert low.peak_bytes == low.max_live_bytes
        rows = [b for b in low.allocs() if b.shape and b.shape[0] == t]
        assert len({b.name for b in rows}) == len(rows)  # no copy of a stacked buffer
    grown = lows[long].peak_bytes - lows[short].peak_bytes
    backward_rows = {t: sum(b.size for b in residuals[t][1]) for t in lows}
    assert grown == backward_rows[long] - backward_rows[short]
    residual_bytes = sum(b.size for b in residuals[long][0])
    assert residual_bytes == long * (3 + 9 + 6) * 8 == 73728
    assert grown >= residual_bytes - sum(b.size for b in residuals[short][0])
    xs = RNG.randn(long, 2)
    same(anfir.run(lows[long], W, U, xs), jax.grad(j_rnn)(W, U, xs))


def test_the_executor_allocates_nothing_of_the_sequence_per_iteration() -> None:
    steps = 512
    xs = RNG.randn(steps, 2)
    low = anfir.lower(MOD, entry="g_rnn_w", args=[W, U, xs])
    executor = Executor(low)
    executor.run(W, U, xs)
    tracemalloc.start()
    try:
        result = executor.run(W, U, xs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    same(result, jax.grad(j_rnn)(W, U, xs))
    one_row_buffer = steps * 3 * 8  # the smallest residual: a copy of it per iteration would show
    assert peak < one_row_buffer, peak


def test_second_order_stacked_outputs_have_the_trip_count_of_rows() -> None:
    # grad(grad(fori_loop)): the forward scan, its reversed scan, and the two scans of
    # differentiating that one again; the stacked outputs of the last three are sized by
    # dim(ys, 0) of the first's, which the types leave unknown and the lowering measures.
    low = anfir.lower(MOD, entry="gg_newton", args=[2.0])
    assert sum(1 for line in linear(low.body) if isinstance(line, Loop)) == 4
    stacked = [b for b in low.allocs() if b.shape and b.shape not in ((1,), (1, 1))]
    assert len(stacked) >= 10 and {b.shape for b in stacked} == {(6,)}
    assert low.peak_bytes == low.max_live_bytes


def test_order_two_and_run_time_stacked_sizes_are_refused_with_a_location() -> None:
    # A dynamic trip count gives the stacked residuals a size known only at run time.
    with pytest.raises(AnfirError) as info:
        anfir.lower(MOD, entry="g_halving_n", args=[0.8, 5])
    assert info.value.loc is not None and "concrete" in info.value.message
    # A tail-recursive counted loop differentiated twice is a fori_loop before AD (it
    # captures only data), so its second-order gradient lowers like the cases above.
    low = anfir.lower(MOD, entry="gg_halving", args=[0.8])
    assert any(isinstance(line, Loop) for line in linear(low.body))
    np.testing.assert_allclose(anfir.run(low, 0.8), anfir.run(MOD["gg_halving"], 0.8), rtol=1e-12)
    np.testing.assert_allclose(anfir.run(low, 0.8), jax.grad(jax.grad(j_halving))(0.8), rtol=1e-12)


LOOP_LIR = """\
signature (%x) -> %out
declare {
  %x = input f64<>
  %out = output f64<>
  %half = constant f64<> 0.5
  %one = constant f64<> 1.0
}
program {
  %s = alloc f64<>
  %init = copy @out %s, @in %x                     # hand.lir:1:1
  %flag = alloc FLAGTYPE
  %loop = loop while %flag {                       # hand.lir:2:1
    %m = mul @inout %s, @in %half                  # hand.lir:3:1
    %f = BODY                                      # hand.lir:4:1
  }
  %o = copy @out %out, @in %s                      # hand.lir:5:1
  dealloc %flag
  dealloc %s
}
"""


def test_a_hand_written_loop_runs_and_bad_loops_are_located_errors(monkeypatch: Any) -> None:
    good = LOOP_LIR.replace("FLAGTYPE", "bool<>").replace("BODY", "gt @out %flag, @in %s, @in %one")
    assert anfir.run(load_lir_text(good, "hand.lir"), 37.0) == 37.0 / 64.0
    with pytest.raises(LirError) as info:  # the flag is not a bool
        load_lir_text(LOOP_LIR.replace("FLAGTYPE", "f64<>").replace("BODY", "add @out %flag, @in %s, @in %one"),
                      "hand.lir")
    assert info.value.loc is not None and info.value.loc.line == 12 and "bool" in info.value.message
    leaky = good.replace("    %m = mul", "    %t = alloc f64<>\n    %m = mul")
    with pytest.raises(LirError, match="deallocs exactly"):
        load_lir_text(leaky, "hand.lir")
    forever = LOOP_LIR.replace("FLAGTYPE", "bool<>").replace("BODY", "lt @out %flag, @in %s, @in %one")
    monkeypatch.setattr(executor_module, "MAX_ITERATIONS", 50)
    with pytest.raises(AnfirRuntimeError) as error:
        anfir.run(load_lir_text(forever, "hand.lir"), 0.5)  # 0.5 halves forever below 1
    assert error.value.loc is not None and error.value.loc.line == 2


BRANCHES = anfir.parse("""
def h(x, v) = let w = if x > 0.0 then v * x else v - x in w * v
def g_h(x, v) = grad(lambda (x, v) sum(h(x, v)) end, 0, 1)(x, v)
""", "branches.anf")


@pytest.mark.parametrize("x", [0.7, -0.4])
def test_an_if_on_a_run_time_value_lowers_to_a_branch(x: float) -> None:
    v = np.array([1.0, 2.5, -3.0])
    # d/dx and d/dv of sum(w * v): w = v x (x > 0), else w = v - x.
    want_g = (float(np.sum(v * v)), 2 * v * x) if x > 0 else (float(-np.sum(v)), 2 * v - x)
    for entry, want in (("h", (v * x if x > 0 else v - x) * v), ("g_h", want_g)):
        low = anfir.lower(BRANCHES, entry=entry, args=[x, v])
        assert any(isinstance(line, Branch) for line in linear(low.body))
        assert low.peak_bytes == low.max_live_bytes
        same(anfir.run(low, x, v), want)
        same(anfir.run(load_lir_text(print_program(low)), x, v), want)
        same(anfir.run(anfir.compile(BRANCHES, entry=entry, args=[x, v]), x, v), want)


def test_bodies_nested_beyond_the_limit_are_a_located_error() -> None:
    depth = 300
    opening = "".join(f"  %l{k} = loop while %flag {{\n" for k in range(depth))
    text = ("signature (%x) -> %out\ndeclare {\n  %x = input f64<>\n  %out = output f64<>\n}\n"
            "program {\n  %flag = alloc bool<>\n" + opening
            + "  %o = copy @out %out, @in %x\n" + "  }\n" * depth + "  dealloc %flag\n}\n")
    with pytest.raises(LirError) as info:
        load_lir_text(text, "deep.lir")
    assert info.value.loc is not None and info.value.loc.line == 8 + 200 and "nest" in info.value.message  # %l200, the 201st

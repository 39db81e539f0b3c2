"""Structured loops: ``scan`` and ``fori_loop`` — values, shapes, gradients (orders 1-2,
reverse and forward mode) against JAX's ``lax.scan`` / ``lax.fori_loop`` in float64,
through ``anfir.run`` (the evaluator) and ``anfir.compile`` (the pipeline), plus
dumps that reload and located errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import anfir
from anfir.abstract.values import ATensor, ATuple
from anfir.ir.nodes import CNode, ValueNode
from anfir.ir.walk import reachable_graphs, toposort
from anfir.primitives import loops

jax = pytest.importorskip("jax")
jnp = jax.numpy
lax = jax.lax
jax.config.update("jax_enable_x64", True)

PROGRAM = """
def cumsum_loss(xs) =
  let r = scan(lambda (c, x) (c + x * c + x, c * x) end, 1.0, xs) in
  r[0] + sum(r[1] * r[1])
def g_cumsum(xs) = grad(cumsum_loss)(xs)
def gg_cumsum(xs) = grad(lambda (xs) sum(grad(cumsum_loss)(xs) * xs) end)(xs)

def rnn_loss(W, U, xs) =
  let r = scan(lambda (h, x) let h2 = tanh(W @ h + U @ x) in (h2, sum(h2 * h2)) end,
               zeros((3,)), xs) in
  sum(r[1]) + sum(r[0])
def g_rnn(W, U, xs) = grad(rnn_loss, 0, 1, 2)(W, U, xs)
def gg_rnn(W, U, xs) = grad(lambda (W, U, xs) sum(grad(rnn_loss)(W, U, xs)) end)(W, U, xs)

def newton_sqrt(a) = fori_loop(0, 6, lambda (i, y) 0.5 * (y + a / y) end, a)
def g_newton(a) = grad(newton_sqrt)(a)
def gg_newton(a) = grad(grad(newton_sqrt))(a)

def halving(x, n) = fori_loop(0, n, lambda (i, acc) acc * 0.5 + x * x end, x)
def g_halving(x, n) = grad(halving)(x, n)
def gg_halving(x, n) = grad(grad(halving))(x, n)

def rev_loss(xs, ws) =
  let r = scan(lambda (c, p) (c * p[1] + p[0], c) end, 0.5, (xs, ws), reverse=true) in
  r[0] + sum(r[1])
def g_rev(xs, ws) = grad(rev_loss, 0, 1)(xs, ws)

def power(x) = scan(lambda (c, u) (c * x, c) end, 1.0, None, length=4)
def power_loss(x) = let r = power(x) in r[0] + sum(r[1])
def g_power(x) = grad(power_loss)(x)
def jvp_power(x, t) = jvp(power_loss)(x, t)
def jvp_rnn(W, U, xs, tW) = jvp(lambda (W) rnn_loss(W, U, xs) end)(W, tW)
"""

MOD = anfir.parse(PROGRAM, "scan_test.anf")


# -- the JAX references ----------------------------------------------------------------
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


def j_halving(x: Any, n: int) -> Any:
    return lax.fori_loop(0, n, lambda i, acc: acc * 0.5 + x * x, x)


def j_rev(xs: Any, ws: Any) -> Any:
    c, ys = lax.scan(lambda c, p: (c * p[1] + p[0], c), 0.5, (xs, ws), reverse=True)
    return c + jnp.sum(ys)


def j_power(x: Any) -> Any:
    c, ys = lax.scan(lambda c, _: (c * x, c), 1.0, None, length=4)
    return c + jnp.sum(ys)


RNG = np.random.RandomState(7)
W = RNG.randn(3, 3) * 0.4
U = RNG.randn(3, 2) * 0.4
XS5 = RNG.randn(5, 2)
VEC = np.array([0.3, -0.7, 1.1, 0.4])


def close(a: Any, b: Any) -> None:
    if isinstance(b, (tuple, list)):
        assert isinstance(a, tuple) and len(a) == len(b)
        for x, y in zip(a, b):
            close(x, y)
        return
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b), rtol=1e-10, atol=1e-12)


def both_ways(entry: str, *args: Any) -> list[Any]:
    """The entry run by the evaluator and compiled (then run)."""
    compiled = anfir.compile(MOD, entry=entry, args=list(args))
    return [anfir.run(MOD[entry], *args), anfir.run(compiled, *args)]


CASES: list[tuple[str, tuple, Callable[..., Any]]] = [
    ("g_cumsum", (VEC,), lambda xs: jax.grad(j_cumsum)(xs)),
    ("gg_cumsum", (VEC,), lambda xs: jax.grad(lambda v: jnp.sum(jax.grad(j_cumsum)(v) * v))(xs)),
    ("g_rnn", (W, U, XS5), lambda *a: jax.grad(j_rnn, (0, 1, 2))(*a)),
    ("gg_rnn", (W, U, XS5), lambda *a: jax.grad(lambda *b: jnp.sum(jax.grad(j_rnn)(*b)))(*a)),
    ("g_newton", (2.0,), lambda a: jax.grad(j_newton)(a)),
    ("gg_newton", (2.0,), lambda a: jax.grad(jax.grad(j_newton))(a)),
    ("g_halving", (0.8, 7), lambda x, n: jax.grad(j_halving)(x, n)),
    ("gg_halving", (0.8, 7), lambda x, n: jax.grad(jax.grad(j_halving))(x, n)),
    ("g_rev", (VEC, VEC[::-1].copy()), lambda *a: jax.grad(j_rev, (0, 1))(*a)),
    ("g_power", (1.3,), lambda x: jax.grad(j_power)(x)),
]


@pytest.mark.parametrize("entry,args,reference", CASES, ids=[c[0] for c in CASES])
def test_gradients_equal_jax(entry: str, args: tuple, reference: Callable[..., Any]) -> None:
    expected = reference(*args)
    if isinstance(expected, tuple):
        expected = tuple(np.asarray(e) for e in expected)
    for got in both_ways(entry, *args):
        close(got, expected)


def test_values_equal_jax() -> None:
    for got in both_ways("cumsum_loss", VEC):
        close(got, j_cumsum(VEC))
    for got in both_ways("rnn_loss", W, U, XS5):
        close(got, j_rnn(W, U, XS5))
    for got in both_ways("newton_sqrt", 2.0):
        close(got, np.sqrt(2.0))
    for got in both_ways("power", 1.5):
        close(got, (1.5 ** 4, np.array([1.0, 1.5, 1.5 ** 2, 1.5 ** 3])))


def test_forward_mode_equals_jax_jvp() -> None:
    for got in both_ways("jvp_power", 1.3, 0.5):
        close(got, jax.jvp(j_power, (1.3,), (0.5,)))
    tW = RNG.randn(3, 3)
    for got in both_ways("jvp_rnn", W, U, XS5, tW):
        close(got, jax.jvp(lambda w: j_rnn(w, U, XS5), (W,), (tW,)))


def _scan_calls(graph: Any) -> list[CNode]:
    return [n for g in reachable_graphs([graph]) for n in toposort(g)
            if isinstance(n, CNode) and n.graph is g and isinstance(n.inputs[0], ValueNode)
            and n.inputs[0].value in (loops.scan, loops.fori_loop)]


def test_rnn_over_a_symbolic_sequence_length() -> None:
    compiled = anfir.compile(MOD, entry="g_rnn", args=["f64[3, 3]", "f64[3, 2]", "f64[T, 2]"])
    # The gradient is a scan forward and a reversed scan, typed with the length T.
    calls = _scan_calls(compiled)
    assert any(c.attrs.get("reverse", False) for c in calls)
    assert any(isinstance(c.abstract, ATuple) and isinstance(c.abstract.items[1], ATuple)
               and any(isinstance(leaf, ATensor) and leaf.shape and str(leaf.shape[0]) == "T"
                       for leaf in c.abstract.items[1].items)
               for c in calls)
    for steps in (1, 4, 9):
        xs = RNG.randn(steps, 2)
        close(anfir.run(compiled, W, U, xs), tuple(np.asarray(g) for g in jax.grad(j_rnn, (0, 1, 2))(W, U, xs)))
    # order 2 over the same symbolic length
    second = anfir.compile(MOD, entry="gg_rnn", args=["f64[3, 3]", "f64[3, 2]", "f64[T, 2]"])
    for steps in (1, 4, 9):
        xs = RNG.randn(steps, 2)
        want = jax.grad(lambda *b: jnp.sum(jax.grad(j_rnn)(*b)))(W, U, xs)
        np.testing.assert_allclose(anfir.run(second, W, U, xs), want, rtol=1e-10)


def test_the_shape_rule_stacks_on_the_leading_axis() -> None:
    mod = anfir.parse("def f(xs) = scan(lambda (c, x) (c + x, (x, sum(x))) end, zeros((2,)), xs)")
    compiled = anfir.compile(mod, entry="f", args=["f64[N, 2]"])
    out = compiled.output.abstract
    assert str(out) == "<Tuple(<f64[2]>, <Tuple(<f64[N, 2]>, <f64[N]>)>)>"


def test_dumps_print_and_reload(tmp_path: Path) -> None:
    compiled = anfir.compile(MOD, entry="g_rnn", args=[W, U, XS5], dump_dir=str(tmp_path))
    expected = anfir.run(compiled, W, U, XS5)
    dumps = sorted(tmp_path.glob("*.ir"))
    assert dumps and any("scan(" in d.read_text() for d in dumps)
    for dump in dumps:
        if dump.name.startswith(("00", "01")):
            continue
        module = anfir.load(str(dump))
        close(anfir.run(module[module.default_entry or "g_rnn"], W, U, XS5), expected)
    # The ANF text round-trips too.
    again = anfir.parse(anfir.to_text(MOD), "again.anf")
    close(anfir.run(again["g_rnn"], W, U, XS5), expected)


def test_empty_scan_has_the_right_shapes() -> None:
    mod = anfir.parse("def f(xs) = scan(lambda (c, x) (c + sum(x), x * 2.0) end, 0.0, xs)")
    carry, ys = anfir.run(mod["f"], np.zeros((0, 3)))
    assert carry == 0.0 and ys.shape == (0, 3)


@pytest.mark.parametrize("source,args,message", [
    ("def f(xs) = scan(lambda (c, x) (c + x, x) end, 0, xs)", (np.ones(3),),
     "carry's type changes"),
    ("def f(xs) = scan(lambda (c, x) c + x end, 0.0, xs)", (np.ones(3),), "pair (carry, y)"),
    ("def f(xs, ys) = scan(lambda (c, x) (c, x[0]) end, 0.0, (xs, ys))", (np.ones(3), np.ones(4)),
     "different leading sizes"),
    ("def f(x) = fori_loop(0.0, 3, lambda (i, c) c end, x)", (1.0,), "integer"),
    ("def f(x) = scan(lambda (c, u) (c, u) end, x)", (1.0,), "length="),
])
def test_bad_loops_are_located_errors(source: str, args: tuple, message: str) -> None:
    mod = anfir.parse(source, "bad.anf")
    with pytest.raises(anfir.AnfirError) as run_info:
        anfir.run(mod["f"], *args)
    assert message in run_info.value.render()
    assert run_info.value.loc is not None and run_info.value.loc.file == "bad.anf"
    with pytest.raises(anfir.AnfirError) as compile_info:
        anfir.compile(mod, entry="f", args=list(args))
    assert message in compile_info.value.render() or "carry" in compile_info.value.render()
    assert compile_info.value.loc is not None


# -- the counted-loop rewrite as a phase of its own (loops, before ad) ----------------------------
HALVING_TEXT = """
def halving(x, n) =
  let loop = lambda (i, acc) if i < n then loop(i + 1, acc * 0.5 + x * x) else acc end in
  loop(0, x)
def g_halving(x, n) = grad(halving)(x, n)
def plain(x) = grad(lambda (y) y * sin(y) end)(x)
"""
HALVING = anfir.parse(HALVING_TEXT, "halving.anf")


def _j_halving(x: Any, n: int) -> Any:
    return jax.lax.fori_loop(0, n, lambda i, acc: acc * 0.5 + x * x, x)


def test_the_loops_phase_dump_shows_the_fori_loop_and_runs_equal(tmp_path: Path) -> None:
    from anfir.passes.pipeline import compile_program

    result = compile_program(HALVING, entry="g_halving", args=[0.8, 7], dump_dir=tmp_path / "d",
                             fine_dumps=True)
    assert result.program.stats["loops: counted loops as fori_loop"] == 1
    names = [Path(f).name for f in result.dump_files if f.endswith(".ir") and "/optimize/" not in f]
    assert names == ["00_parse.ir", "01_resolve.ir", "02_specialize.ir", "03_loops.ir", "04_ad.ir",
                     "05_inline.ir", "06_optimize.ir", "07_validate.ir"]
    assert "loops" in result.timings
    before = (tmp_path / "d" / "02_specialize.ir").read_text(encoding="utf-8")
    text = (tmp_path / "d" / "03_loops.ir").read_text(encoding="utf-8")
    assert "# Phase: 03_loops" in text and "fori_loop(" in text and "fori_loop(" not in before
    loaded = anfir.load(str(tmp_path / "d" / "03_loops.ir"))
    assert loaded.ir_entry is not None
    for n in (0, 1, 7, 10):
        want = float(jax.grad(_j_halving)(0.8, n))
        np.testing.assert_allclose(anfir.run(loaded.ir_entry, 0.8, n), want, rtol=1e-12)


def test_without_a_rewrite_or_fine_dumps_the_numbering_is_unchanged(tmp_path: Path) -> None:
    from anfir.passes.pipeline import compile_program

    ordinary = ["00_parse.ir", "01_resolve.ir", "02_specialize.ir", "03_ad.ir", "04_inline.ir",
                "05_optimize.ir", "06_validate.ir"]
    for folder, entry, args, fine in (("plain", "plain", [0.5], True),
                                      ("default", "g_halving", [0.8, 7], False)):
        result = compile_program(HALVING, entry=entry, args=args, dump_dir=tmp_path / folder,
                                 fine_dumps=fine)
        names = sorted(p.name for p in (tmp_path / folder).iterdir() if p.suffix == ".ir")
        assert names == ordinary, (entry, names)
        assert "loops" not in result.timings
    # the default dumps still show the rewrite, in the ad phase's dump
    assert "fori_loop(" in (tmp_path / "default" / "03_ad.ir").read_text(encoding="utf-8")


def test_the_loops_phase_dump_is_reachable_from_anfir_compile_and_the_cli(tmp_path: Path) -> None:
    from cli_harness import run_in_process

    graph = anfir.compile(HALVING, entry="g_halving", args=[0.8, 7], dump_dir=str(tmp_path / "api"),
                          fine_dumps=True)
    np.testing.assert_allclose(anfir.run(graph, 0.8, 7), float(jax.grad(_j_halving)(0.8, 7)),
                               rtol=1e-12)
    assert "fori_loop(" in (tmp_path / "api" / "03_loops.ir").read_text(encoding="utf-8")
    assert (tmp_path / "api" / "07_validate.ir").exists()
    source = tmp_path / "halving.anf"
    source.write_text(HALVING_TEXT, encoding="utf-8")
    code, out, err = run_in_process(["compile", str(source), "--entry", "g_halving", "--args",
                                     "0.8", "7", "--dump-dir", str(tmp_path / "cli"),
                                     "--fine-dumps"], tmp_path)
    assert code == 0, err
    assert "03_loops.ir" in out and "04_ad.ir" in out
    loaded = anfir.load(str(tmp_path / "cli" / "03_loops.ir"))
    np.testing.assert_allclose(anfir.run(loaded.ir_entry, 0.8, 7),
                               float(jax.grad(_j_halving)(0.8, 7)), rtol=1e-12)
    # without --dump-dir the switch has nothing to write: a usage error, not a traceback
    code, out, err = run_in_process(["compile", str(source), "--entry", "g_halving", "--args",
                                     "0.8", "7", "--fine-dumps"], tmp_path)
    assert code == 2 and "--fine-dumps needs --dump-dir" in err and "Traceback" not in err

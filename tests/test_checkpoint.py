"""``checkpoint(f)`` in programs and ``anfir.checkpoint``: the same values and
gradients as without it (float64, rtol 1e-12) through closures, ``if``, loops,
recursion and at second order, at run time and compiled; dumps reload and
run; JAX's ``jax.checkpoint`` agrees; and the lowered gradient of a deep chain
really needs less memory (the recomputation is not merged back by CSE)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import anfir
from anfir.primitives.checkpointing import remat_barrier

PROGRAM = """
def layer(x, w) = tanh(sin(x @ w) * 2.0 + x)

# closures: the checkpointed function captures w and b from its caller
def closure_loss(x, w, b) =
  let f = lambda (v) tanh(v @ w + b) * v end in
  sum(f(f(x)))
def closure_loss_ck(x, w, b) =
  let f = checkpoint(lambda (v) tanh(v @ w + b) * v end) in
  sum(f(f(x)))

# if inside the checkpointed function
def branchy(x, w) = if sum(x) > 0.0 then sin(x @ w) * x else cos(x) @ w
def if_loss(x, w) = sum(branchy(branchy(x, w), w) ** 2)
def if_loss_ck(x, w) = sum(checkpoint(branchy)(checkpoint(branchy)(x, w), w) ** 2)

# a loop (tail recursion) inside the checkpointed function, and one calling it
def power_loop(x, n) = if n == 0 then x else power_loop(sin(x) * x + x, n - 1)
def loop_in_loss(x) = sum(power_loop(x, 3))
def loop_in_loss_ck(x) = sum(checkpoint(lambda (v) power_loop(v, 3) end)(x))
def apply_n(x, w, n) = if n == 0 then x else apply_n(layer(x, w), w, n - 1)
def apply_n_ck(x, w, n) = if n == 0 then x else apply_n_ck(checkpoint(layer)(x, w), w, n - 1)
def loop_loss(x, w) = sum(apply_n(x, w, 4))
def loop_loss_ck(x, w) = sum(apply_n_ck(x, w, 4))

# recursion that is not a loop: a tree of checkpointed calls
def tree(x, w, d) = if d == 0 then layer(x, w) else tree(x, w, d - 1) * tree(layer(x, w), w, d - 1)
def tree_ck(x, w, d) =
  if d == 0 then checkpoint(layer)(x, w)
  else tree_ck(x, w, d - 1) * checkpoint(lambda (v) tree_ck(v, w, d - 1) end)(layer(x, w))
def tree_loss(x, w) = sum(tree(x, w, 2))
def tree_loss_ck(x, w) = sum(tree_ck(x, w, 2))

# second order: a scalar function, its derivative differentiated again
def scalar(x, y) = sin(x * y) * exp(x) + x ** 3 * y
def second(x, y) = grad(grad(scalar))(x, y)
def second_ck(x, y) = grad(grad(checkpoint(scalar)))(x, y)
def second_inner_ck(x, y) = grad(lambda (a) grad(checkpoint(scalar), 1)(a, y) * a end)(x)
def second_inner(x, y) = grad(lambda (a) grad(scalar, 1)(a, y) * a end)(x)
"""

MOD = anfir.parse(PROGRAM, "checkpoint.anf")
RNG = np.random.default_rng(27)
X = RNG.normal(size=(3, 4)) * 0.5
W = RNG.normal(size=(4, 4)) * 0.5
B = RNG.normal(size=(4,))

# (entry without checkpoint, entry with it, arguments, argument indices of the gradient)
CASES: dict[str, tuple[str, str, list[Any], tuple[int, ...]]] = {
    "closure": ("closure_loss", "closure_loss_ck", [X, W, B], (0, 1, 2)),
    "if": ("if_loss", "if_loss_ck", [X, W], (0, 1)),
    "if_negative": ("if_loss", "if_loss_ck", [-np.abs(X), W], (0, 1)),
    "loop_inside": ("loop_in_loss", "loop_in_loss_ck", [X[0]], (0,)),
    "loop": ("loop_loss", "loop_loss_ck", [X, W], (0, 1)),
    "recursion": ("tree_loss", "tree_loss_ck", [X, W], (0, 1)),
}


def close(got: Any, want: Any, rtol: float = 1e-12) -> None:
    """Equal leaf by leaf (nested tuples of floats and arrays), to ``rtol``."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            close(g, w, rtol)
        return
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol, atol=1e-14)


def grad_program(entry: str, nargs: int, wrt: tuple[int, ...]) -> anfir.Module:
    """A module whose ``main`` is ``grad(entry, wrt...)`` on ``nargs`` arguments."""
    params = ", ".join(f"a{i}" for i in range(nargs))
    indices = ", ".join(str(i) for i in wrt)
    return anfir.parse(PROGRAM + f"\ndef main({params}) = grad({entry}, {indices})({params})\n",
                       "checkpoint.anf")


@pytest.mark.parametrize("case", sorted(CASES))
def test_checkpointed_gradient_equals_plain(case: str) -> None:
    plain, ck, args, wrt = CASES[case]
    # The same values...
    close(anfir.run(MOD[ck], *args), anfir.run(MOD[plain], *args))
    # ...and the same gradients, at run time and compiled.
    want = anfir.run(grad_program(plain, len(args), wrt)["main"], *args)
    mod = grad_program(ck, len(args), wrt)
    close(anfir.run(mod["main"], *args), want)
    close(anfir.run(anfir.compile(mod, args=args), *args), want)


@pytest.mark.parametrize("plain, ck", [("second", "second_ck"), ("second_inner", "second_inner_ck")])
def test_second_order(plain: str, ck: str) -> None:
    for x, y in [(0.7, -1.3), (-0.4, 2.1)]:
        want = anfir.run(MOD[plain], x, y)
        close(anfir.run(MOD[ck], x, y), want)
        close(anfir.run(anfir.compile(MOD, entry=ck, args=[x, y]), x, y), want)
        # and against the closed form of d2/dx2 (sin(xy) e^x + x^3 y) for the first pair
    x, y = 0.7, -1.3
    exact = (-y * y * np.sin(x * y) * np.exp(x) + 2 * y * np.cos(x * y) * np.exp(x)
             + np.sin(x * y) * np.exp(x) + 6 * x * y)
    close(anfir.run(MOD["second_ck"], x, y), exact, rtol=1e-12)


def test_api_checkpoint_and_its_text() -> None:
    g = MOD["layer"]
    cg = anfir.checkpoint(g)
    assert "checkpoint(layer)" in anfir.to_text(cg).replace("@", "")
    close(anfir.run(cg, X, W), anfir.run(g, X, W))
    loss = anfir.parse(PROGRAM + "\ndef main(x, w) = sum(layer(x, w) * x)\n")["main"]
    closs = anfir.parse(PROGRAM + "\ndef main(x, w) = sum(checkpoint(layer)(x, w) * x)\n")["main"]
    want = anfir.run(anfir.grad(loss, (0, 1)), X, W)
    got = anfir.grad(closs, (0, 1))
    close(anfir.run(got, X, W), want)
    close(anfir.run(anfir.compile(got, args=[X, W]), X, W), want)
    # anfir.grad of the API's wrapper directly
    scalar = MOD["scalar"]
    close(anfir.run(anfir.grad(anfir.checkpoint(scalar), (0, 1)), 0.3, 1.2),
          anfir.run(anfir.grad(scalar, (0, 1)), 0.3, 1.2))


def test_dumps_reload_and_run(tmp_path: Path) -> None:
    args = [X, W]
    mod = grad_program("if_loss_ck", 2, (0, 1))
    want = anfir.run(grad_program("if_loss", 2, (0, 1))["main"], *args)
    anfir.compile(mod, args=args, dump_dir=str(tmp_path))
    dumps = sorted(tmp_path.glob("*.ir"))
    assert [p.name[:2] for p in dumps] == [f"{i:02d}" for i in range(len(dumps))]
    # the call before the ad phase, the recomputation (behind its barriers) after it
    assert "checkpoint(" in next(p for p in dumps if p.name.endswith("_specialize.ir")).read_text()
    assert "remat_barrier(" in next(p for p in dumps if p.name.endswith("_ad.ir")).read_text()
    for path in dumps:
        loaded = anfir.load(str(path))
        close(anfir.run(loaded, *args), want)
    # the optimized dump compiles again to the same gradient
    final = anfir.load(str(dumps[-1]))
    close(anfir.run(anfir.compile(final, args=args), *args), want)


def test_gradient_agrees_with_jax_checkpoint() -> None:
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    jnp = jax.numpy

    def layer(x: Any, w: Any) -> Any:
        return jnp.tanh(jnp.sin(x @ w) * 2.0 + x)

    def loss(x: Any, w: Any) -> Any:
        f = jax.checkpoint(layer)
        return jnp.sum(f(f(x, w), w))

    want = jax.grad(loss, argnums=(0, 1))(jnp.asarray(X), jnp.asarray(W))
    src = PROGRAM + "\ndef main(x, w) = grad(lambda (a, b) sum(checkpoint(layer)(checkpoint(layer)(a, b), b)) end, 0, 1)(x, w)\n"
    mod = anfir.parse(src)
    got = anfir.run(mod["main"], X, W)
    close(got, tuple(np.asarray(v) for v in want), rtol=1e-12)
    close(anfir.run(anfir.compile(mod, args=[X, W]), X, W), got)
    # the JAX back end runs the compiled gradient (remat_barrier included) too
    fn = anfir.to_jax(anfir.compile(mod, args=[X, W]))
    close(tuple(np.asarray(v) for v in fn(X, W)), got, rtol=1e-12)


def _chain(n: int, checkpointed: bool) -> anfir.Module:
    call = "checkpoint(layer)" if checkpointed else "layer"
    body = "x"
    for _ in range(n):
        body = f"{call}({body}, w)"
    return anfir.parse(PROGRAM + f"\ndef loss(x, w) = sum({body})\n"
                       "def step(x, w) = grad(loss, 0, 1)(x, w)\n")


def test_lowered_checkpointed_gradient_needs_less_memory() -> None:
    types = ["f64[32, 32]", "f64[32, 32]"]
    plain = anfir.lower(_chain(8, False), entry="step", args=types)
    ck = anfir.lower(_chain(8, True), entry="step", args=types)
    # Without checkpoint every layer's sin, scaled sum and tanh stay for the
    # backward pass; with it only the layer inputs do (a 32x32 f64 is 8 KiB).
    assert ck.peak_bytes < 0.7 * plain.peak_bytes, (ck.peak_bytes, plain.peak_bytes)
    # Not merged back: the optimized gradient still calls layer's forward twice per layer.
    graph = anfir.compile(_chain(8, True), entry="step", args=types)
    text = anfir.dump_ir(graph)
    assert text.count("remat_barrier(") >= 8
    x, w = RNG.normal(size=(32, 32)) * 0.3, RNG.normal(size=(32, 32)) * 0.3
    want = anfir.run(anfir.compile(_chain(8, False), entry="step", args=[x, w]), x, w)
    close(anfir.run(ck, x, w), want)
    close(anfir.run(graph, x, w), want)


def test_barrier_is_x_and_passes_its_gradient_to_x_only() -> None:
    assert remat_barrier.impl(3.0, 5.0) == 3.0
    mod = anfir.parse("def f(x, y) = x * y\n")
    close(anfir.run(anfir.grad(mod["f"], (0, 1)), 2.0, 3.0), (3.0, 2.0))


def test_the_wrapper_flag_is_dumped_and_reloads(tmp_path: Path) -> None:
    # checkpoint outside any grad: the flagged wrapper is in the ad phase's dump
    mod = anfir.parse(PROGRAM + "\ndef main(x, w) = checkpoint(layer)(x, w)\n")
    anfir.compile(mod, args=[X, W], dump_dir=str(tmp_path))
    path = next(tmp_path.glob("*_ad.ir"))
    assert "attr checkpoint = true" in path.read_text()
    loaded = anfir.load(str(path))
    close(anfir.run(loaded, X, W), anfir.run(MOD["layer"], X, W))


def test_checkpoint_takes_one_argument() -> None:
    with pytest.raises(anfir.AnfirError, match=r"bad.anf:1:25: .*'checkpoint' takes 1 argument"):
        anfir.parse("def main(x) = checkpoint(sin, 1)(x)", "bad.anf")


@pytest.mark.parametrize("src, message", [
    ("def main(x) = checkpoint(1.0)(x)", "function"),
])
def test_bad_checkpoint_calls_are_located_errors(src: str, message: str) -> None:
    mod = anfir.parse(src, "bad.anf")
    for action in (lambda: anfir.run(mod["main"], 1.0), lambda: anfir.compile(mod, args=[1.0])):
        with pytest.raises(anfir.AnfirError) as info:
            action()
        assert message in str(info.value)
        assert "bad.anf:1:" in str(info.value)

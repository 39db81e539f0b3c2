"""``remat="dots-saveable"``: the checkpoint policy of JAX's ``dots_saveable``.

Every ``checkpoint(f)`` keeps the matrix products and convolutions of ``f``'s
forward pass and recomputes only the rest: gradients equal to the plain
program's and to JAX's ``jax.checkpoint(..., policy=dots_saveable)``, as many
matmuls and convolutions as the plain program, the cheap operations still
recomputed, and the phase's summary line says what was kept."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
from cli_harness import run_in_process

import anfir

CHAIN = """
def layer(x, w) = tanh(sin(x @ w) * 2.0 + x)
def plain(x, w) = sum(layer(layer(layer(x, w), w), w))
def saved(x, w) = let c = checkpoint(layer) in sum(c(c(c(x, w), w), w))
def plain_step(x, w) = grad(plain, 0, 1)(x, w)
def saved_step(x, w) = grad(saved, 0, 1)(x, w)
"""

CONVS = """
def block(x, w) = relu(conv(x, w, padding=1)) * 0.5 + x
def plain(x, w) = sum(block(block(x, w), w))
def saved(x, w) = sum(checkpoint(block)(checkpoint(block)(x, w), w))
def plain_step(x, w) = grad(plain, 0, 1)(x, w)
def saved_step(x, w) = grad(saved, 0, 1)(x, w)
"""


def same(got: Any, want: Any) -> None:
    """Equal leaf by leaf at rtol 1e-12 (float64)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def counts(mod: anfir.Module, entry: str, args: list[Any], remat: Any, *names: str) -> list[int]:
    """How many instructions of each primitive the lowered step runs."""
    low = anfir.lower(mod, entry=entry, args=args, remat=remat)
    prims = [i.prim.name for i in low.instructions()]
    return [prims.count(name) for name in names]


def test_matmuls_are_kept_and_the_rest_recomputed() -> None:
    mod = anfir.parse(CHAIN, "chain.anf")
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((16, 16)), 0.3 * rng.standard_normal((16, 16))
    want = anfir.run(mod["plain_step"], x, w)
    graph = anfir.compile(mod, entry="saved_step", args=[x, w], remat="dots-saveable")
    same(anfir.run(graph, x, w), want)
    same(anfir.run(anfir.lower(mod, entry="saved_step", args=[x, w], remat="dots-saveable"), x, w), want)
    plain = counts(mod, "plain_step", [x, w], None, "matmul", "sin")
    checkpointed = counts(mod, "saved_step", [x, w], None, "matmul", "sin")
    policy = counts(mod, "saved_step", [x, w], "dots-saveable", "matmul", "sin")
    assert checkpointed[0] == 2 * plain[0]  # checkpoint alone recomputes the products
    assert policy[0] == plain[0]  # the policy keeps them
    assert policy[1] > plain[1]  # ... and still recomputes sin


def test_the_gradient_equals_jaxs_dots_saveable_checkpoint() -> None:
    import jax
    import jax.numpy as jnp
    jax.config.update("jax_enable_x64", True)

    def layer(x: Any, w: Any) -> Any:
        return jnp.tanh(jnp.sin(x @ w) * 2.0 + x)

    saved = jax.checkpoint(layer, policy=jax.checkpoint_policies.dots_saveable)
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((8, 8)), 0.3 * rng.standard_normal((8, 8))
    want = jax.grad(lambda x, w: jnp.sum(saved(saved(saved(x, w), w), w)), argnums=(0, 1))(x, w)
    mod = anfir.parse(CHAIN, "chain.anf")
    same(anfir.run(anfir.compile(mod, entry="saved_step", args=[x, w], remat="dots-saveable"), x, w),
         [np.asarray(v) for v in want])


def test_convolutions_are_kept() -> None:
    mod = anfir.parse(CONVS, "convs.anf")
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((2, 3, 6, 6)), 0.3 * rng.standard_normal((3, 3, 3, 3))
    want = anfir.run(mod["plain_step"], x, w)
    same(anfir.run(anfir.lower(mod, entry="saved_step", args=[x, w], remat="dots-saveable"), x, w), want)
    (plain,) = counts(mod, "plain_step", [x, w], None, "conv")
    (policy,) = counts(mod, "saved_step", [x, w], "dots-saveable", "conv")
    (checkpointed,) = counts(mod, "saved_step", [x, w], None, "conv")
    assert checkpointed == 2 * plain and policy == plain


def test_the_dump_says_what_was_kept(tmp_path: Path) -> None:
    mod = anfir.parse(CHAIN, "chain.anf")
    x = np.full((4, 4), 0.1)
    anfir.compile(mod, entry="saved_step", args=[x, x], remat="dots-saveable", dump_dir=str(tmp_path))
    text = next(tmp_path.glob("*_remat.ir")).read_text(encoding="utf-8")
    line = re.search(r"^# remat: (\d+) values kept, (\d+) values recomputed, .*checkpoint policy "
                     r"dots-saveable", text, re.M)
    assert line is not None, text[:400]
    assert int(line.group(1)) == 3 and int(line.group(2)) > 0  # the three layers' products
    same(anfir.run(anfir.load(str(next(tmp_path.glob("*_remat.ir")))), x, x),
         anfir.run(mod["plain_step"], x, x))


def test_the_command_line_takes_the_policy(tmp_path: Path) -> None:
    source = tmp_path / "chain.anf"
    source.write_text(CHAIN, encoding="utf-8")
    status, out, err = run_in_process(["compile", str(source), "--entry", "saved_step", "--args",
                                       "f64[4, 4]", "f64[4, 4]", "--lower", "--remat", "dots-saveable"],
                                      tmp_path)
    assert status == 0, err
    assert re.search(r"^remat: 3 values kept, .*dots-saveable", out, re.M), out

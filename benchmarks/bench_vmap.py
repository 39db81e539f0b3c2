"""Per-example gradients of ``examples/mlp.anf``'s loss at batch 64 (issue 26).

Two figures, each a ratio measured in one process, results checked first:

* evaluator: ``anfir.run`` of ``anfir.vmap(anfir.grad(mlp_loss, (0, 1)), in_axes=(None,
  None, 0, 0))`` — every example's gradients with respect to both weight matrices at once —
  against a Python loop of ``anfir.run(anfir.grad(mlp_loss, (0, 1)), ...)`` over the 64
  examples (goal: >= 20x faster);
* JAX: ``jax.jit`` of ``anfir.to_jax`` of the same batched graph against
  ``jax.jit(jax.vmap(jax.grad(loss, (0, 1)), (None, None, 0, 0)))`` (goal: within 1.2x).

Each example is one row (``x: f64[1, D]``), the loss as the example file writes it.
Usage: ``python benchmarks/bench_vmap.py [--quick]``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import anfir  # noqa: E402
from harness import paired_seconds  # noqa: E402

BATCH, K = 64, 10
SIZES = (16, 64)
"""D = H: the small net (the interpreter's overhead dominates a loop over examples) and a
larger one (numpy's work on the per-example gradients dominates)."""
D = H = 64


def data(d: int = 64) -> tuple[Any, ...]:
    D = H = d
    rng = np.random.default_rng(0)
    return (rng.normal(size=(D, H)) / 8, rng.normal(size=(H, K)) / 8,
            rng.normal(size=(BATCH, 1, D)), rng.normal(size=(BATCH, 1, K)))


def figures(quick: bool = False, d: int = 64) -> dict[str, float]:
    """The two ratios and the times behind them (seconds per batch)."""
    import jax
    import jax.numpy as jnp

    jax.config.update("jax_enable_x64", True)
    mod = anfir.load(str(ROOT / "examples" / "mlp.anf"))
    loss = mod["mlp_loss"]
    grad = anfir.grad(loss, wrt=(0, 1))
    batched = anfir.vmap(grad, in_axes=(None, None, 0, 0))
    w1, w2, xs, ys = data(d)

    def jloss(a: Any, b: Any, x: Any, y: Any) -> Any:
        return jnp.sum((jnp.tanh(x @ a) @ b - y) ** 2) / 2

    ref = jax.jit(jax.vmap(jax.grad(jloss, (0, 1)), (None, None, 0, 0)))
    ours = jax.jit(anfir.to_jax(batched))

    def loop() -> Any:
        return [anfir.run(grad, w1, w2, xs[i], ys[i]) for i in range(BATCH)]

    def vm() -> Any:
        return anfir.run(batched, w1, w2, xs, ys)

    want = [np.asarray(a) for a in ref(w1, w2, xs, ys)]
    for got in (vm(), [np.stack([r[k] for r in loop()]) for k in range(2)],
                [np.asarray(a) for a in ours(w1, w2, xs, ys)]):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)  # a fast wrong answer is no figure

    compiled_grad = anfir.compile(grad, args=(w1, w2, xs[0], ys[0]))
    compiled_vmap = anfir.compile(batched, args=(w1, w2, xs, ys))

    def cloop() -> Any:
        return [anfir.run(compiled_grad, w1, w2, xs[i], ys[i]) for i in range(BATCH)]

    def cvm() -> Any:
        return anfir.run(compiled_vmap, w1, w2, xs, ys)

    for g, w in zip(cvm(), want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12)
    repeat = 3 if quick else 7
    evaluator = paired_seconds({"loop": loop, "vmap": vm, "cloop": cloop, "cvmap": cvm}, repeat=repeat)

    def jax_ref() -> Any:
        return [a.block_until_ready() for a in ref(w1, w2, xs, ys)]

    def jax_ours() -> Any:
        return [a.block_until_ready() for a in ours(w1, w2, xs, ys)]

    jax_times = paired_seconds({"jax": jax_ref, "anfir": jax_ours}, repeat=repeat)
    return {"loop_s": evaluator["loop"], "vmap_s": evaluator["vmap"],
            "speedup": evaluator["loop"] / evaluator["vmap"],
            "cloop_s": evaluator["cloop"], "cvmap_s": evaluator["cvmap"],
            "compiled_speedup": evaluator["cloop"] / evaluator["cvmap"],
            "jax_s": jax_times["jax"], "to_jax_s": jax_times["anfir"],
            "to_jax_over_jax": jax_times["anfir"] / jax_times["jax"]}


def main() -> None:
    for d in SIZES:
        report(figures("--quick" in sys.argv, d), d)


def report(got: dict[str, float], d: int) -> None:
    print(f"batch {BATCH}, D = H = {d}, K = {K}")
    print(f"evaluator: loop of anfir.run(grad) {got['loop_s'] * 1e3:.2f} ms, "
          f"anfir.run(vmap(grad)) {got['vmap_s'] * 1e3:.2f} ms: {got['speedup']:.1f}x faster (goal >= 20x)")
    print(f"  both compiled: loop {got['cloop_s'] * 1e3:.2f} ms, vmap {got['cvmap_s'] * 1e3:.2f} ms: "
          f"{got['compiled_speedup']:.1f}x faster")
    print(f"JAX: jit(vmap(grad)) {got['jax_s'] * 1e3:.3f} ms, jit(to_jax(anfir.vmap(grad))) "
          f"{got['to_jax_s'] * 1e3:.3f} ms: {got['to_jax_over_jax']:.2f}x (goal <= 1.2x)")


if __name__ == "__main__":
    main()

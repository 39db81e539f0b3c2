"""Imported Hugging Face models timed as a new user would run them (issue 24).

    pip install -e ".[dev]"
    python benchmarks/bench_models.py            # about two minutes
    python benchmarks/bench_models.py --only gpt2,vit

Small random configurations of GPT-2, BERT, Llama, ViT and ResNet
(tests/zoo_models.py: width 64, 2 layers, vocabulary 50; batch 8, sequence
128 or image 64), exported with ``torch.export`` and imported with
``anfir.import_torch``.  One thread for every library (BLAS, torch, XLA).

Rows per model (each a ratio of best times, the compared calls interleaved:
benchmarks/harness.py's ``paired_seconds``):

* **forward / eager**: ``anfir.run(mod.entry, *params, x)`` over the module
  called under ``torch.no_grad()`` — goal <= 1.3;
* **gradient / autograd**: ``anfir.run`` of ``anfir.grad`` of the loss
  ``sum(out * r)`` with respect to every parameter over ``torch.autograd.grad``
  of the same loss (forward included in both) — goal <= 1.3;
* **jit forward / eager**, **jit gradient / autograd**: the same graphs through
  ``jax.jit(anfir.to_jax(...))`` — goal <= 0.8;
* **export s**, **import s**: ``torch.export.export`` and ``anfir.import_torch``
  of it (best of 3).

Results are checked first (forward to 1e-4 relative, every gradient to 1e-3):
a wrong answer prints ERROR instead of a time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))
sys.path.insert(2, str(HERE.parent / "tests"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import anfir  # noqa: E402
from anfir.ir.graph import FuncGraph  # noqa: E402
from anfir.primitives import registry  # noqa: E402
from harness import paired_seconds  # noqa: E402
import zoo_models  # noqa: E402

torch.set_num_threads(1)

MODELS: dict[str, Callable[[], Any]] = {
    "gpt2": lambda: zoo_models.gpt2(width=64, layers=2, heads=4, batch=8, seq=128),
    "bert": lambda: zoo_models.bert(width=64, layers=2, heads=4, batch=8, seq=128),
    "llama": lambda: zoo_models.llama(width=64, layers=2, heads=4, batch=8, seq=128),
    "vit": lambda: zoo_models.vit(image=64, width=64, layers=2, batch=8),
    "resnet": lambda: zoo_models.resnet(image=64, batch=8, sizes=(16, 32, 64)),
}
"""Each builds (module, [input], _, dynamic_shapes) at the benchmark's size."""


def best_of(fn: Callable[[], Any], repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def loss_graph(mod: anfir.Module, cotangent: np.ndarray) -> FuncGraph:
    g = FuncGraph("loss", None)
    params = [g.add_parameter(p.name, None) for p in mod.entry.parameters]
    out = g.apply(registry.lookup("mul"), g.apply(mod.entry, *params), cotangent)
    g.output = g.apply(registry.lookup("sum"), out)
    return g


def measure(name: str, repeat: int) -> dict[str, Any]:
    torch.manual_seed(0)
    module, inputs, _, dynamic = zoo_models._quiet(MODELS[name])()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_s = best_of(lambda: torch.export.export(module, tuple(inputs), dynamic_shapes=dynamic))
        ep = torch.export.export(module, tuple(inputs), dynamic_shapes=dynamic)
    import_s = best_of(lambda: anfir.import_torch(ep))
    mod = anfir.import_torch(ep)
    lifted = list(mod.params.values())
    x = [i.numpy() for i in inputs]
    with torch.no_grad():
        want = module(*inputs).numpy()
    cot = np.random.default_rng(0).standard_normal(want.shape).astype(np.float32)
    kinds = mod.metadata["inputs"]
    wrt = tuple(i for i, k in enumerate(kinds) if k.startswith("parameter "))
    named = dict(module.named_parameters())
    params = [named[kinds[i].split(" ", 1)[1]] for i in wrt]
    grad_graph = anfir.grad(loss_graph(mod, cot), wrt=wrt)
    cot_t = torch.from_numpy(cot)

    def eager() -> Any:
        with torch.no_grad():
            return module(*inputs)

    def autograd() -> Any:
        found = torch.autograd.grad((module(*inputs) * cot_t).sum(), params, allow_unused=True)
        return [torch.zeros_like(p) if g is None else g for p, g in zip(params, found)]

    def forward() -> Any:
        return anfir.run(mod.entry, *lifted, *x)

    def gradient() -> Any:
        return anfir.run(grad_graph, *lifted, *x)

    import jax

    jit_forward = jax.jit(anfir.to_jax(mod))
    jit_gradient = jax.jit(anfir.to_jax(grad_graph))

    def jax_forward() -> Any:
        return jit_forward(*lifted, *x).block_until_ready()

    def jax_gradient() -> Any:
        return jax.block_until_ready(jit_gradient(*lifted, *x))

    row: dict[str, Any] = {"export s": export_s, "import s": import_s}
    scale = float(np.max(np.abs(want)))
    refs = [g.numpy() for g in autograd()]
    gscale = max(float(np.max(np.abs(r))) for r in refs)
    checks = {
        "forward": lambda: np.max(np.abs(forward() - want)) <= 1e-4 * scale,
        "gradient": lambda: all(np.max(np.abs(g - r)) <= 1e-3 * gscale for g, r in zip(gradient(), refs)),
        "jit forward": lambda: np.max(np.abs(np.asarray(jax_forward()) - want)) <= 1e-4 * scale,
        "jit gradient": lambda: all(np.max(np.abs(np.asarray(g) - r)) <= 1e-3 * gscale
                                    for g, r in zip(jax_gradient(), refs)),
    }
    ok = {k: bool(check()) for k, check in checks.items()}
    times = paired_seconds({"eager": eager, "forward": forward, "jax forward": jax_forward},
                           repeat=repeat, target=0.0)
    gtimes = paired_seconds({"autograd": autograd, "gradient": gradient, "jax gradient": jax_gradient},
                            repeat=repeat, target=0.0)
    row["forward / eager"] = times["forward"] / times["eager"] if ok["forward"] else "ERROR"
    row["gradient / autograd"] = gtimes["gradient"] / gtimes["autograd"] if ok["gradient"] else "ERROR"
    row["jit forward / eager"] = times["jax forward"] / times["eager"] if ok["jit forward"] else "ERROR"
    row["jit gradient / autograd"] = (gtimes["jax gradient"] / gtimes["autograd"]
                                      if ok["jit gradient"] else "ERROR")
    row["eager ms"] = times["eager"] * 1e3
    row["autograd ms"] = gtimes["autograd"] * 1e3
    return row


COLUMNS = ["forward / eager", "gradient / autograd", "jit forward / eager", "jit gradient / autograd",
           "eager ms", "autograd ms", "export s", "import s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated model names")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(MODELS)
    print("| model | " + " | ".join(COLUMNS) + " |")
    print("| --- |" + " --- |" * len(COLUMNS))
    for name in names:
        row = measure(name, args.repeat)
        cells = [f"{row[c]:.2f}" if isinstance(row[c], float) else str(row[c]) for c in COLUMNS]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

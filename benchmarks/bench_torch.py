"""The torch.export importer timed (issue 13): import + compile time of models
written here, and anfir's gradient time against ``torch.autograd`` on CPU.

    pip install -e ".[dev,torch]"
    python benchmarks/bench_torch.py

Rows (no goal yet; a report):

* **import**: ``anfir.import_torch(ep)`` of an already exported program
  (``run_decompositions`` included), best of 3; next to it, torch's own
  ``ep.run_decompositions()`` alone (best of 3), the part of the import that
  is torch's;
* **compile**: ``anfir.compile`` of the imported entry for the example
  arguments (parameters and input), and of its gradient with respect to
  every parameter (``anfir.grad`` included), best of 3 each;
* **grad / torch.autograd**: ``anfir.run`` of the compiled gradient of a
  scalar loss with respect to every parameter, over ``torch.autograd.grad`` of
  the same loss (forward included in both), best of 5 each, one thread.  The
  gradients are compared first: a wrong answer prints ``ERROR``.

Models: an MLP, the conv-bn-relu-pool-linear CNN and the ResNet-18
(``BasicBlock``s, [2, 2, 2, 2], real widths 64-512, 11.2 M parameters) of
``tests/test_torch_import.py`` (batch norm in eval), and the
``nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)`` block.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import anfir  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_torch_import import CNN, ResNet18, randomize_batch_norms  # noqa: E402


def best(fn: Callable[[], Any], repeats: int) -> float:
    """The best wall time of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


class MLPLoss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(),
                                       torch.nn.Linear(256, 256), torch.nn.GELU(),
                                       torch.nn.Linear(256, 10))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((self.net(x) - y) ** 2).mean()


class EncoderLoss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0).eval()
        self.probe = torch.randn(16, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.block(x) * self.probe).sum()


class SquaredError(torch.nn.Module):
    """``mean((net(x) - y) ** 2)``: a scalar loss of a model's output."""

    def __init__(self, net: torch.nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((self.net(x) - y) ** 2).mean()


def row(name: str, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> str:
    """One line of the table for ``model`` at ``inputs``."""
    ep = torch.export.export(model, inputs)
    t_decompose = best(lambda: ep.run_decompositions(), 3)
    t_import = best(lambda: anfir.import_torch(ep), 3)
    mod = anfir.import_torch(ep)
    args = [*mod.params.values(), *(t.numpy() for t in inputs)]
    t_compile = best(lambda: anfir.compile(mod, args=args), 3)
    params = list(model.parameters())
    wrt = tuple(range(len(params)))
    t_grad_compile = best(lambda: anfir.compile(anfir.grad(mod.entry, wrt=wrt), args=args), 3)
    grad_graph = anfir.compile(anfir.grad(mod.entry, wrt=wrt), args=args)
    got = anfir.run(grad_graph, *args)
    want = torch.autograd.grad(model(*inputs), params)
    ok = all(np.allclose(g, w.numpy(), rtol=1e-3, atol=1e-4 * float(w.abs().max()) + 1e-7)
             for g, w in zip(got, want))
    t_anfir = best(lambda: anfir.run(grad_graph, *args), 5)
    t_torch = best(lambda: torch.autograd.grad(model(*inputs), params), 5)
    ratio = f"{t_anfir / t_torch:.1f}x" if ok else "ERROR"
    return (f"| {name} | {t_import * 1e3:.0f} ms ({t_decompose * 1e3:.0f} ms) | "
            f"{t_compile * 1e3:.0f} ms / {t_grad_compile * 1e3:.0f} ms | "
            f"{t_anfir * 1e3:.2f} ms / {t_torch * 1e3:.2f} ms = {ratio} |")


def main() -> int:
    """Print the table."""
    torch.manual_seed(0)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13's own pytree notice
    print(f"torch {torch.__version__}, one thread, load {os.getloadavg()[0]:.1f}")
    print("| model | import (torch's run_decompositions) | compile: forward / gradient | "
          "grad: anfir / torch.autograd |")
    print("|---|---|---|---|")
    print(row("MLP 64-256-256-10, batch 32", MLPLoss(), (torch.randn(32, 64), torch.randn(32, 10))))
    print(row("TransformerEncoderLayer(32, 4, 64), 2x16x32", EncoderLoss(), (torch.randn(2, 16, 32),)))
    cnn = SquaredError(randomize_batch_norms(CNN()))
    print(row("CNN (2 conv-bn-relu-pool, linear), 16x3x16x16", cnn,
              (torch.randn(16, 3, 16, 16), torch.randn(16, 10))))
    resnet = SquaredError(randomize_batch_norms(ResNet18()))
    print(row("ResNet-18, 1x3x32x32", resnet, (torch.randn(1, 3, 32, 32), torch.randn(1, 10))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

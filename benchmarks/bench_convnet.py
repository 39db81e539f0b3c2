"""Convolutional networks: a ResNet training step and the ResNet-18 forward, against torch eager.

    python benchmarks/bench_convnet.py          # both figures
    python benchmarks/run_all.py --only convnet_step,resnet18_forward

Both run ``examples/resnet18.anf`` (torchvision's ResNet-18 in eval mode, written
in ANF) in float32 on one thread, its parameters those of the tests
(``tests/example_args.py``: He-initialised convolutions, batch-norm statistics
away from (1, 0)); the peer is the same network in ``torch.nn.functional``
(``F.batch_norm`` over the running statistics, as ``model.eval()`` computes it).

* **convnet_step** — one training step: the loss (cross entropy over 10
  classes) and its gradient with respect to every parameter, for a batch of 8
  3x32x32 images (CIFAR-sized) at ResNet-18's widths (64, 128, 256, 512).
  anfir: ``anfir.run`` of ``anfir.compile(module, entry="resnet18_grad")``;
  torch: ``torch.autograd.grad`` of the same loss over its forward.  The ratio
  is of CPU time (``time.process_time``, best of interleaved samples): both
  compute on one thread, and on the shared machine wall time also counts the
  moments another process had the core (the details give it too).  torch
  differentiates the trainable parameters (weights, batch-norm scales and
  biases), anfir also the running statistics (a few channel vectors more).
  The gradients are compared first.  Goal: at most 1.5x.  The details give
  the same step at a quarter of the widths (16 ... 128), where the time per
  call weighs more than the arithmetic (no goal).
* **resnet18_forward** — the forward of one 3x224x224 image at the standard
  widths, ``anfir.run`` of the parsed definition (no compile: the evaluator as
  a user calls it), over torch's forward under ``no_grad``.  Goal: anfir's wall
  time under one second (the ratio is reported; the details add CPU times).
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent))
sys.path.insert(2, str(HERE.parent / "tests"))  # example_args: the tests' parameters

import numpy as np  # noqa: E402

import anfir  # noqa: E402
import peers  # noqa: E402
from example_args import resnet18_args  # noqa: E402
from harness import Figure, format_details, format_table, milli, paired_seconds  # noqa: E402

EXAMPLE = HERE.parent / "examples" / "resnet18.anf"
WIDTHS = (64, 128, 256, 512)
NARROW = (16, 32, 64, 128)
BATCH, SIZE, CLASSES = 8, 32, 10


def paired_cpu_seconds(fns: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Best CPU time (``time.process_time``) per call of each of ``fns``, samples interleaved,
    after a warm-up call, the collector paused as in ``harness.paired_seconds``.  Everything
    here computes on one thread, so CPU time is the work done, and unlike wall time it does
    not count the moments another process had the core (the machine is shared)."""
    for fn in fns.values():
        fn()
    best = {name: float("inf") for name in fns}
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            for name, fn in fns.items():
                gc.collect()
                start = time.process_time()
                fn()
                best[name] = min(best[name], time.process_time() - start)
    finally:
        if enabled:
            gc.enable()
    return best


def _tmap(fn: Callable[[Any], Any], value: Any) -> Any:
    return tuple(_tmap(fn, v) for v in value) if isinstance(value, tuple) else fn(value)


def _leaves(value: Any) -> list[Any]:
    return [leaf for v in value for leaf in _leaves(v)] if isinstance(value, tuple) else [value]


def torch_resnet18(torch: Any) -> Callable[[Any, Any], Any]:
    """ResNet-18's eval-mode forward in torch.nn.functional, on parameters nested as the
    example's (conv weight, (scale, bias, running mean, running var), ...)."""
    F = torch.nn.functional

    def bn(v: Any, s: Any) -> Any:
        return F.batch_norm(v, s[2], s[3], s[0], s[1], False)

    def block(v: Any, b: Any) -> Any:
        stride = 1 if len(b) == 4 else 2
        h = F.relu(bn(F.conv2d(v, b[0], stride=stride, padding=1), b[1]))
        shortcut = v if len(b) == 4 else bn(F.conv2d(v, b[4], stride=2), b[5])
        return F.relu(bn(F.conv2d(h, b[2], padding=1), b[3]) + shortcut)

    def forward(x: Any, p: Any) -> Any:
        h = F.max_pool2d(F.relu(bn(F.conv2d(x, p[0][0], stride=2, padding=3), p[0][1])), 3, 2, 1)
        for stage in p[1:5]:
            h = block(block(h, stage[0]), stage[1])
        return torch.flatten(F.adaptive_avg_pool2d(h, 1), 1) @ p[5][0].T + p[5][1]

    return forward


def _torch_params(torch: Any, p: Any) -> tuple[Any, list[Any], list[bool]]:
    """The parameters as torch tensors, the trainable ones requiring gradients (not a
    batch norm's running mean and variance). Returns (nested tensors, the trainable
    leaves, per leaf of the nesting: trainable?)."""
    mask: list[bool] = []

    def convert(value: Any, running: bool = False) -> Any:
        if not isinstance(value, tuple):
            mask.append(not running)
            return torch.tensor(value, requires_grad=not running)
        # a batch norm: four channel vectors (scale, bias, running mean, running var)
        norm = len(value) == 4 and all(np.ndim(v) == 1 for v in value)
        return tuple(convert(v, norm and i >= 2) for i, v in enumerate(value))

    nested = convert(p)
    return nested, [leaf for leaf, t in zip(_leaves(nested), mask) if t], mask


def _step_times(torch: Any, module: anfir.Module, widths: tuple[int, ...], repeat: int
                ) -> tuple[Optional[dict[str, float]], str]:
    """Best CPU seconds of anfir's compiled training step and torch's, at these widths
    (None when the gradients differ), and a line of details (wall times too)."""
    x, p, labels = resnet18_args(batch=BATCH, size=SIZE, widths=widths, classes=CLASSES,
                                 dtype=np.float32)
    start = time.perf_counter()
    step = anfir.compile(module, entry="resnet18_grad", args=[x, p, labels])
    compile_seconds = time.perf_counter() - start
    forward = torch_resnet18(torch)
    nested, trainable, mask = _torch_params(torch, p)
    tx, tlabels = torch.tensor(x), torch.tensor(labels)

    def torch_step() -> Any:
        loss = torch.nn.functional.cross_entropy(forward(tx, nested), tlabels)
        return torch.autograd.grad(loss, trainable)

    got = [g for g, t in zip(_leaves(anfir.run(step, x, p, labels)), mask) if t]
    want = [w.numpy() for w in torch_step()]
    if not all(np.allclose(g, w, rtol=1e-3, atol=1e-4 * float(np.abs(w).max()) + 1e-6)
               for g, w in zip(got, want)):
        return None, f"widths {widths}: anfir's gradients differ from torch's"
    fns: dict[str, Callable[[], Any]] = {"anfir": lambda: anfir.run(step, x, p, labels),
                                          "torch": torch_step}
    best = paired_cpu_seconds(fns, repeat)
    wall = paired_seconds(fns, repeat=repeat, target=0)
    return best, (f"widths {widths}: CPU anfir {milli(best['anfir'])}, torch {milli(best['torch'])} "
                  f"= {best['anfir'] / best['torch']:.2f}x; wall anfir {milli(wall['anfir'])}, "
                  f"torch {milli(wall['torch'])} = {wall['anfir'] / wall['torch']:.2f}x "
                  f"(anfir.compile {compile_seconds:.2f} s; {len(want)} trainable tensors, anfir "
                  f"also differentiates the {len(mask) - len(want)} running statistics)")


def step_figure(quick: bool = False) -> Figure:
    """anfir's compiled training step over torch eager's forward + autograd; the details
    add the same at narrow widths, where per-call overhead weighs more than arithmetic."""
    figure = Figure(f"ResNet-18 training step vs torch eager + autograd (B={BATCH}, 3x{SIZE}x{SIZE}, f32)",
                    goal="<= 1.5x")
    torch = peers._torch()
    if torch is None:
        figure.peer = "n/a"
        return figure
    module = anfir.load(str(EXAMPLE))
    best, line = _step_times(torch, module, WIDTHS, 3 if quick else 11)
    figure.details.append(line)
    if best is None:
        figure.error = line
        return figure
    figure.value = best["anfir"] / best["torch"]
    figure.peer = f"{milli(best['torch'])} CPU"
    figure.passed = figure.value <= 1.5
    figure.details.append(_step_times(torch, module, NARROW, 3 if quick else 11)[1])
    return figure


def forward_figure(quick: bool = False) -> Figure:
    """anfir's evaluator on the ResNet-18 forward at 224x224, with torch's time beside."""
    figure = Figure("ResNet-18 forward 1x3x224x224 (f32), anfir.run vs torch eager",
                    goal="anfir < 1 s")
    module = anfir.load(str(EXAMPLE))
    x, p, _ = resnet18_args(batch=1, size=224, widths=WIDTHS, classes=1000, dtype=np.float32)
    forward = module["resnet18"]
    got = anfir.run(forward, x, p)
    fns: dict[str, Callable[[], Any]] = {"anfir": lambda: anfir.run(forward, x, p)}
    torch = peers._torch()
    want: Optional[np.ndarray] = None
    if torch is not None:
        reference = torch_resnet18(torch)
        nested = _tmap(lambda a: torch.tensor(a), p)
        tx = torch.tensor(x)

        def torch_forward() -> Any:
            with torch.no_grad():
                return reference(tx, nested)

        want = torch_forward().numpy()
        if not np.allclose(got, want, rtol=1e-3, atol=1e-3):
            figure.error = "anfir's logits differ from torch's"
            return figure
        fns["torch"] = torch_forward
    best = paired_seconds(fns, repeat=2 if quick else 5, target=0)
    cpu = paired_cpu_seconds(fns, repeat=2 if quick else 5)
    anfir_s = best["anfir"]
    figure.passed = anfir_s < 1.0
    if "torch" in best:
        figure.value = anfir_s / best["torch"]
        figure.peer = f"anfir {milli(anfir_s)} / torch {milli(best['torch'])}"
    else:
        figure.peer = f"anfir {milli(anfir_s)} / torch n/a"
    figure.details.append(f"wall: anfir.run (evaluator, no compile) {milli(anfir_s)}"
                          + (f", torch eager no_grad {milli(best['torch'])}" if "torch" in best else ""))
    figure.details.append(f"CPU: anfir {milli(cpu['anfir'])}"
                          + (f", torch {milli(cpu['torch'])}" if "torch" in cpu else ""))
    return figure


def all_figures(quick: bool = False) -> dict[str, Callable[[], Figure]]:
    """The figures by key, for run_all.py."""
    return {"convnet_step": lambda: step_figure(quick),
            "resnet18_forward": lambda: forward_figure(quick)}


def main() -> int:
    """Measure both figures and print them."""
    results = [run() for run in all_figures(quick="--quick" in sys.argv).values()]
    print(format_table(results))
    print()
    print(format_details(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())

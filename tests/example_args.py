"""Arguments for the bundled examples that need many (shared by the tests that
run every example: pipeline, ONNX export, JAX)."""

from __future__ import annotations

from typing import Any

import numpy as np

TRANSFORMER_SHAPES = [(32, 32), (32,), (32, 32), (32,), (32, 32), (32,), (32, 32), (32,),
                      (32,), (32,), (64, 32), (64,), (32, 64), (32,), (32,), (32,)]
"""The parameters of examples/transformer.anf, in its order (PyTorch's layout)."""


def transformer_args(seed: int = 0, batch: int = 2, length: int = 5,
                     dtype: Any = np.float64) -> tuple[Any, tuple[Any, ...], Any]:
    """(x, params, y) for examples/transformer.anf: random, scaled like an initialised layer."""
    rng = np.random.default_rng(seed)
    params = tuple((rng.normal(size=s) * (0.2 if len(s) == 2 else 0.1)
                    + (1.0 if i in (8, 14) else 0.0)).astype(dtype)
                   for i, s in enumerate(TRANSFORMER_SHAPES))
    x = rng.normal(size=(batch, length, 32)).astype(dtype)
    y = rng.normal(size=(batch, length, 32)).astype(dtype)
    return x, params, y


def resnet18_params(widths: tuple[int, ...] = (4, 4, 8, 8), classes: int = 5, seed: int = 0,
                    dtype: Any = np.float64) -> tuple[Any, ...]:
    """The parameters of examples/resnet18.anf (nested as torchvision's state dict) for
    these stage widths: He-initialised convolutions, batch-norm statistics away from
    (1, 0) so the normalisation matters."""
    rng = np.random.default_rng(seed)

    def conv(out: int, inp: int, k: int) -> Any:
        return (rng.normal(size=(out, inp, k, k)) * np.sqrt(2.0 / (inp * k * k))).astype(dtype)

    def bn(c: int) -> tuple[Any, ...]:
        return tuple(v.astype(dtype) for v in (rng.uniform(0.5, 1.5, c), rng.normal(size=c) * 0.1,
                                                rng.normal(size=c) * 0.1,
                                                rng.uniform(0.5, 1.5, c)))

    stages: list[Any] = []
    inp = widths[0]
    for i, width in enumerate(widths):
        first = (conv(width, inp, 3), bn(width), conv(width, width, 3), bn(width))
        if i > 0:  # stages 2-4 halve the size: a 1x1 projection on the shortcut
            first += (conv(width, inp, 1), bn(width))
        stages.append((first, (conv(width, width, 3), bn(width), conv(width, width, 3), bn(width))))
        inp = width
    fc = ((rng.normal(size=(classes, inp)) / np.sqrt(inp)).astype(dtype),
          (rng.normal(size=classes) * 0.1).astype(dtype))
    return ((conv(widths[0], 3, 7), bn(widths[0])), *stages, fc)


def resnet18_args(seed: int = 0, batch: int = 1, size: int = 16,
                  widths: tuple[int, ...] = (4, 4, 8, 8), classes: int = 5,
                  dtype: Any = np.float64) -> tuple[Any, tuple[Any, ...], Any]:
    """(x, params, labels) for examples/resnet18.anf: a small image batch, narrow widths."""
    rng = np.random.default_rng(seed + 1)
    x = rng.normal(size=(batch, 3, size, size)).astype(dtype)
    labels = rng.integers(0, classes, size=batch)
    return x, resnet18_params(widths, classes, seed, dtype), labels

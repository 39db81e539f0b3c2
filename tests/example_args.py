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

"""The programs and hand strategies the SPMD tests share (tests/test_spmd.py and
the multi-device JAX check it runs in a subprocess, tests/spmd_jax_check.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import anfir

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

MLP_STEP = "\ndef step(w1, w2, x, y) = value_and_grad(mlp_loss, 0, 1)(w1, w2, x, y)\n"
BLOCK_STEP = "\ndef step(x, p, y) = value_and_grad(block_loss, 1)(x, p, y)\n"


def mlp_module() -> anfir.Module:
    """examples/mlp.anf with a training step: the loss and its gradient to both weights."""
    return anfir.parse((EXAMPLES / "mlp.anf").read_text() + MLP_STEP, str(EXAMPLES / "mlp.anf"))


def block_module() -> anfir.Module:
    """examples/transformer.anf with a training step: the loss and its gradient to p."""
    return anfir.parse((EXAMPLES / "transformer.anf").read_text() + BLOCK_STEP,
                       str(EXAMPLES / "transformer.anf"))


def mlp_args(dtype: Any = np.float64, seed: int = 0, scale: int = 1) -> list[Any]:
    """w1 (16, 32), w2 (32, 8), x (16, 16), y (16, 8), every size times ``scale``."""
    rng = np.random.default_rng(seed)
    shapes = ((16, 32), (32, 8), (16, 16), (16, 8))
    return [(rng.normal(size=(a * scale, b * scale)) * 0.3 / scale).astype(dtype)
            for a, b in shapes]


E, F, N, L = 32, 64, 8, 4


def block_args(seed: int = 0) -> list[Any]:
    """x (8, 4, 32), the 16 parameters of a 4-head block in PyTorch's layout, y."""
    rng = np.random.default_rng(seed)

    def w(*shape: int) -> Any:
        return rng.normal(size=shape) * 0.2

    p = (w(E, E), w(E), w(E, E), w(E), w(E, E), w(E), w(E, E), w(E), 1 + w(E), w(E),
         w(F, E), w(F), w(E, F), w(E), 1 + w(E), w(E))
    return [w(N, L, E), p, w(N, L, E)]


def megatron(mp: str) -> list[Any]:
    """Megatron-LM's layouts of the block's parameters: q, k, v and the first MLP
    layer column-parallel (a PyTorch weight is (out, in): its rows split), the
    attention output and the second MLP layer row-parallel, norms replicated."""
    col, row, bias = (mp, None), (None, mp), (mp,)
    return [col, bias, col, bias, col, bias, row, None, None, None, col, bias, row, None, None, None]


BATCH3 = ("dp", None, None)

MLP_STRATEGIES: dict[str, tuple[dict[str, int], list[Any]]] = {
    "dp8": ({"dp": 8}, [None, None, ("dp", None), ("dp", None)]),
    "mp8": ({"mp": 8}, [(None, "mp"), ("mp", None), None, None]),
    "dp4xmp2": ({"dp": 4, "mp": 2}, [(None, "mp"), ("mp", None), ("dp", None), ("dp", None)]),
    "dp2xmp4": ({"dp": 2, "mp": 4}, [(None, "mp"), ("mp", None), ("dp", None), ("dp", None)]),
}
"""Data parallel, Megatron tensor parallel (w1 column-, w2 row-parallel), and mixed."""

BLOCK_STRATEGIES: dict[str, tuple[dict[str, int], list[Any]]] = {
    "dp8": ({"dp": 8}, [BATCH3, None, BATCH3]),
    "mp8": ({"mp": 8}, [None, megatron("mp"), None]),
    "dp4xmp2": ({"dp": 4, "mp": 2}, [BATCH3, megatron("mp"), BATCH3]),
    "dp2xmp4": ({"dp": 2, "mp": 4}, [BATCH3, megatron("mp"), BATCH3]),
}
"""The same four on the transformer block (with mp=8 the 4 heads cannot split 8
ways: the propagation gathers around the attention, and the result still agrees)."""


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, tuple):
        return [leaf for item in x for leaf in _leaves(item)]
    return [np.asarray(x, dtype=np.float64)]


def max_rel_error(got: Any, want: Any) -> float:
    """The largest |got - want| / (|want| + s) over nested tuples, where s is 1e-3 of
    the largest |want| of all: a relative error that a gradient equal to zero up to
    rounding (the key bias's: softmax ignores it) does not blow up."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), (type(got), len(want))
    gs, ws = _leaves(got), _leaves(want)
    assert len(gs) == len(ws)
    scale = 1e-3 * max((float(np.max(np.abs(w))) for w in ws if w.size), default=0.0) + 1e-300
    error = 0.0
    for g, w in zip(gs, ws):
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.size:
            error = max(error, float(np.max(np.abs(g - w) / (np.abs(w) + scale))))
    return error

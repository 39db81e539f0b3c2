"""The peers anfir is measured against: xDSL's parser, torch eager and autograd,
and a hand-written numpy forward+backward.

Every ``*_peer`` function returns a zero-argument callable doing the peer's
work, or None when the peer is not installed (``pip install -e ".[bench]"``
installs torch and xDSL); ``run_all.py`` then prints "n/a".
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

Work = Callable[[], Any]


def xdsl_version() -> Optional[str]:
    """xDSL's version, or None when it is not importable."""
    try:
        import xdsl
    except ImportError:
        return None
    return getattr(xdsl, "__version__", "?")


def xdsl_parse_peer(mlir_text: str) -> Optional[Work]:
    """Parse ``mlir_text`` (generic form) into xDSL IR, in this process."""
    try:
        from xdsl.context import Context
        from xdsl.dialects.arith import Arith
        from xdsl.dialects.builtin import Builtin
        from xdsl.dialects.func import Func
        from xdsl.dialects.math import Math
        from xdsl.parser import Parser
    except ImportError:
        return None
    context = Context()
    for dialect in (Builtin, Func, Arith, Math):
        context.load_dialect(dialect)

    def parse() -> Any:
        module = Parser(context, mlir_text, "bench.mlir").parse_module()
        return module

    return parse


def _torch() -> Any:
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(1)  # anfir and numpy run on one thread here too
    return torch


def torch_version() -> Optional[str]:
    """torch's version, or None when it is not importable."""
    torch = _torch()
    return None if torch is None else str(torch.__version__)


def torch_eval_chain_peer(ops: int) -> Optional[Work]:
    """The evaluator chain (``* 1.0001``, ``+ 0.5`` alternating) in torch eager on a 0-d f64 tensor."""
    torch = _torch()
    if torch is None:
        return None
    x0 = torch.tensor(0.5, dtype=torch.float64)

    def chain() -> Any:
        x = x0
        for i in range(ops):
            x = x * 1.0001 if i % 2 == 0 else x + 0.5
        return x

    return chain


def torch_grad_chain_peers(steps: int) -> Optional[tuple[Work, Work]]:
    """(forward, forward + backward) of ``x = x * 1.0001 + sin(x) * 0.001`` in torch."""
    torch = _torch()
    if torch is None:
        return None
    plain = torch.tensor(0.5, dtype=torch.float64)
    leaf = torch.tensor(0.5, dtype=torch.float64, requires_grad=True)

    def forward(x: Any) -> Any:
        for _ in range(steps):
            x = x * 1.0001 + torch.sin(x) * 0.001
        return x

    def gradient() -> Any:
        (dx,) = torch.autograd.grad(forward(leaf), (leaf,))
        return dx

    return (lambda: forward(plain)), gradient


def mlp_inputs(batch: int, width: int, outputs: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """``(w1, w2, x, y)`` for ``mlp_loss``: f64 arrays of shapes (D, H), (H, K), (B, D), (B, K)."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((width, width)) / np.sqrt(width)
    w2 = rng.standard_normal((width, outputs)) / np.sqrt(width)
    x = rng.standard_normal((batch, width))
    y = rng.standard_normal((batch, outputs))
    return w1, w2, x, y


def numpy_mlp_grad(w1: np.ndarray, w2: np.ndarray, x: np.ndarray, y: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Hand-written forward and backward of ``sum((tanh(x @ w1) @ w2 - y) ** 2) / 2``:
    the gradients with respect to ``w1`` and ``w2``."""
    h = np.tanh(x @ w1)
    r = h @ w2 - y                # d loss / d out
    dw2 = h.T @ r
    dh = r @ w2.T
    dw1 = x.T @ (dh * (1.0 - h * h))
    return dw1, dw2


def numpy_mlp_peer(inputs: tuple[np.ndarray, ...]) -> Work:
    """:func:`numpy_mlp_grad` on ``inputs``."""
    return lambda: numpy_mlp_grad(*inputs)


def torch_mlp_peer(inputs: tuple[np.ndarray, ...]) -> Optional[Work]:
    """torch autograd's gradients of ``mlp_loss`` with respect to ``w1`` and ``w2``."""
    torch = _torch()
    if torch is None:
        return None
    w1, w2, x, y = (torch.from_numpy(a) for a in inputs)
    w1.requires_grad_(True)
    w2.requires_grad_(True)

    def gradient() -> Any:
        loss = ((torch.tanh(x @ w1) @ w2 - y) ** 2).sum() / 2
        return torch.autograd.grad(loss, (w1, w2))

    return gradient

"""examples/transformer.anf against torch.nn.TransformerEncoderLayer.

The example's encoder block (multi-head self-attention, residuals, layer norm,
an MLP with gelu; batch first) is run with the weights of a PyTorch layer
mapped onto its parameters: its output and the gradients of a loss to every
parameter agree with PyTorch's forward and autograd, through ``anfir.run``
and through ``anfir.compile``, in f64 and f32.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import anfir
from gradcheck import assert_close

torch = pytest.importorskip("torch", reason="the reference is torch.nn.TransformerEncoderLayer "
                            "(pip install torch==2.13.0, or the dev extra)")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "transformer.anf"
TORCH_NAMES = ["self_attn.in_proj_weight", "self_attn.in_proj_bias", "self_attn.out_proj.weight",
               "self_attn.out_proj.bias", "norm1.weight", "norm1.bias", "linear1.weight",
               "linear1.bias", "linear2.weight", "linear2.bias", "norm2.weight", "norm2.bias"]
TOL = {"f64": (1e-10, 1e-12), "f32": (2e-4, 2e-5)}


def _layer(dtype: Any) -> Any:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0,
                                             activation="gelu")
    # Non-trivial norm parameters (they start as ones and zeros), so their mapping is checked.
    with torch.no_grad():
        for name in ("norm1", "norm2"):
            getattr(layer, name).weight.uniform_(0.5, 1.5)
            getattr(layer, name).bias.uniform_(-0.5, 0.5)
    return layer.to(dtype).eval()


def _params(layer: Any) -> tuple[Any, ...]:
    """The layer's weights as the example's parameters (wq, bq, wk, bk, wv, bv, wo, bo,
    norm1, linear1, linear2, norm2)."""
    sd = {k: v.detach().numpy() for k, v in layer.state_dict().items()}
    w, b = sd["self_attn.in_proj_weight"], sd["self_attn.in_proj_bias"]
    return (w[:32], b[:32], w[32:64], b[32:64], w[64:], b[64:],
            *(sd[name] for name in TORCH_NAMES[2:]))


def _torch_grads(layer: Any) -> tuple[Any, ...]:
    """PyTorch's gradients in the example's parameter order."""
    g = {name: p.grad.numpy() for name, p in layer.named_parameters()}
    w, b = g["self_attn.in_proj_weight"], g["self_attn.in_proj_bias"]
    return (w[:32], b[:32], w[32:64], b[32:64], w[64:], b[64:],
            *(g[name] for name in TORCH_NAMES[2:]))


@pytest.fixture(scope="module")
def module() -> anfir.Module:
    return anfir.load(str(EXAMPLE))


@pytest.mark.parametrize("dtype", ["f64", "f32"])
def test_forward_and_parameter_gradients_match_pytorch(module: anfir.Module, dtype: str) -> None:
    np_dtype, torch_dtype = {"f64": (np.float64, torch.float64),
                             "f32": (np.float32, torch.float32)}[dtype]
    layer = _layer(torch_dtype)
    params = _params(layer)
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 7, 32)).astype(np_dtype)
    y = rng.normal(size=(3, 7, 32)).astype(np_dtype)
    rtol, atol = TOL[dtype]

    out = layer(torch.tensor(x))
    got = anfir.run(module["encoder_block"], x, params)
    assert got.dtype == np_dtype
    assert_close(got, out.detach().numpy(), rtol, atol, msg="forward")

    torch.nn.functional.mse_loss(out, torch.tensor(y)).backward()
    want = _torch_grads(layer)
    grads = anfir.run(module["block_grad"], x, params, y)
    assert all(np.asarray(g).dtype == np_dtype for g in grads)
    assert_close(grads, want, rtol, atol, msg="parameter gradients (run)")
    compiled = anfir.compile(module, entry="block_grad", args=[x, params, y])
    assert_close(anfir.run(compiled, x, params, y), want, rtol, atol,
                 msg="parameter gradients (compiled)")


def test_gradient_to_the_input_matches_pytorch(module: anfir.Module) -> None:
    layer = _layer(torch.float64)
    params = _params(layer)
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(2, 4, 32)), rng.normal(size=(2, 4, 32))
    tx = torch.tensor(x, requires_grad=True)
    torch.nn.functional.mse_loss(layer(tx), torch.tensor(y)).backward()
    got = anfir.run(anfir.grad(module["block_loss"], 0), x, params, y)
    assert_close(got, tx.grad.numpy(), 1e-10, 1e-12)

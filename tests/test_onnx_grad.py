"""``anfir.grad`` of ONNX models exported from PyTorch matches PyTorch's autograd.

A small MLP and a small CNN, each with its loss, are exported with
``torch.onnx.export`` (the TorchScript exporter: the torch.export-based one
needs onnxscript), imported with ``params_as_inputs=True`` — every initializer
becomes a parameter of the entry — and differentiated with respect to every
one of them; the reference is ``loss.backward()`` on the same module.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the reference gradients are PyTorch's autograd")
pytest.importorskip("onnx", reason="ONNX import needs the onnx package (anfir[onnx])")

import anfir  # noqa: E402
from anfir.interop.onnx.importer import import_onnx  # noqa: E402

nn = torch.nn


class MLPLoss(nn.Module):
    """A two-layer MLP and its mean squared error."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(5, 7)
        self.fc2 = nn.Linear(7, 3)

    def forward(self, x: "torch.Tensor", target: "torch.Tensor") -> "torch.Tensor":
        y = self.fc2(torch.tanh(self.fc1(x)))
        return ((y - target) ** 2).mean()


class CNNLoss(nn.Module):
    """Convolution, ReLU, max pooling, a second convolution, a linear layer and
    the cross entropy of its log-softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(4, 3, kernel_size=3, stride=2)
        self.fc = nn.Linear(3 * 1 * 1, 5)

    def forward(self, x: "torch.Tensor", labels: "torch.Tensor") -> "torch.Tensor":
        h = torch.relu(self.conv1(x))
        h = torch.nn.functional.max_pool2d(h, 2)
        h = torch.relu(self.conv2(h))
        logits = self.fc(torch.flatten(h, 1))
        logp = torch.log_softmax(logits, dim=1)
        return -(logp * labels).sum() / x.shape[0]


def _export(module: "nn.Module", args: tuple) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter announces its deprecation
        # No constant folding: the initializers stay the module's parameters as they are.
        torch.onnx.export(module, args, buffer, dynamo=False, do_constant_folding=False,
                          input_names=["x", "target"], output_names=["loss"], opset_version=17)
    return buffer.getvalue()


def _check_gradients(module: "nn.Module", x: np.ndarray, target: np.ndarray) -> None:
    import onnx

    torch.manual_seed(0)
    args = (torch.tensor(x), torch.tensor(target))
    model = onnx.load_from_string(_export(module, args))
    mod = import_onnx(model, params_as_inputs=True)
    named = dict(module.named_parameters())
    # Every parameter of the module is an initializer of the model, by name.
    assert sorted(mod.params) == sorted(named)
    for name, value in mod.params.items():
        np.testing.assert_array_equal(value, named[name].detach().numpy())

    loss = module(*args)
    loss.backward()
    count = len(mod.params)
    values = [*mod.params.values(), x, target]
    np.testing.assert_allclose(anfir.run(mod.entry, *values), loss.item(), rtol=1e-5)
    grads = anfir.run(anfir.grad(mod.entry, wrt=tuple(range(count))), *values)
    assert len(grads) == count
    for got, name in zip(grads, mod.params):
        want = named[name].grad.numpy()
        assert got.shape == want.shape, name
        assert np.abs(want).max() > 0, f"{name}: a zero gradient would compare nothing"
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6, err_msg=name)


def test_mlp_exported_from_pytorch() -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    _check_gradients(MLPLoss(), rng.normal(size=(4, 5)).astype(np.float32),
                     rng.normal(size=(4, 3)).astype(np.float32))


def test_cnn_exported_from_pytorch() -> None:
    torch.manual_seed(1)
    rng = np.random.default_rng(1)
    labels = np.eye(5, dtype=np.float32)[rng.integers(0, 5, size=3)]
    _check_gradients(CNNLoss(), rng.normal(size=(3, 2, 6, 6)).astype(np.float32), labels)

"""Make the MindSpore ``.mindir`` fixtures of tests/test_mindir.py (committed).

Run with MindSpore's own venv (MindSpore needs numpy<2, so it cannot share
anfir's)::

    /work/msvenv/bin/python tests/mindir_fixtures/make_fixtures.py [NAME ...]

Each case writes ``NAME.mindir`` (``mindspore.export``) and ``NAME.npz``: the
inputs ``in0, in1, ...`` and MindSpore's own results ``out0, out1, ...`` (a
tuple result flattened in order), computed by the cell in graph mode.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

HERE = os.path.dirname(os.path.abspath(__file__))
ms.set_context(mode=ms.GRAPH_MODE)
ms.set_seed(5)
RNG = np.random.default_rng(29)


def normal(*shape: int, dtype: type = np.float32, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(dtype)


class DenseReLU(nn.Cell):
    """A Dense layer and a ReLU (f32)."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Dense(4, 3, weight_init=Tensor(normal(3, 4)), bias_init=Tensor(normal(3)))
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.dense(x))


class ConvNet(nn.Cell):
    """Conv, ReLU, max pool, conv, ReLU, average pool, flatten, Dense (f32; no tanh: MindSpore's
    f32 tanh on CPU is an approximation, off by ~1e-5)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 2, 3, pad_mode="pad", padding=1, has_bias=True,
                               weight_init=Tensor(normal(2, 1, 3, 3, scale=0.5)),
                               bias_init=Tensor(normal(2, scale=0.1)))
        self.pool1 = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(2, 3, 3, pad_mode="valid", stride=1,
                               weight_init=Tensor(normal(3, 2, 3, 3, scale=0.3)))
        self.pool2 = nn.AvgPool2d(2, 2)
        self.flat = nn.Flatten()
        self.fc = nn.Dense(3, 2, weight_init=Tensor(normal(2, 3)), bias_init=Tensor(normal(2)))

    def construct(self, x):
        h = self.pool1(ops.relu(self.conv1(x)))
        h = self.pool2(ops.relu(self.conv2(h)))
        return self.fc(self.flat(h))


class ControlFlow(nn.Cell):
    """``if`` on data, a ``while`` with a run-time trip count, a closure and a
    parameter (f64)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = Parameter(Tensor(np.array([0.5, -1.0, 2.0])), name="w")

    def construct(self, x, n):
        def inner(y):
            return y * self.w + x

        if ops.reduce_sum(x) > 0:
            z = inner(x)
        else:
            z = x - 1.0
        i = 0
        while i < n:
            z = ops.sin(z) + self.w
            i = i + 1
        return z * 2.0


class MLPLoss(nn.Cell):
    """A two-layer tanh MLP's squared error; weights are arguments (f64)."""

    def construct(self, w1, b1, w2, x, y):
        h = ops.tanh(ops.matmul(x, w1) + b1)
        out = ops.matmul(h, w2)
        return ops.reduce_mean(ops.square(out - y))


class MLPGrad(nn.Cell):
    """MindSpore's gradient of :class:`MLPLoss` with respect to every argument."""

    def __init__(self) -> None:
        super().__init__()
        self.loss = MLPLoss()
        self.grad = ops.GradOperation(get_all=True)

    def construct(self, w1, b1, w2, x, y):
        return self.grad(self.loss)(w1, b1, w2, x, y)


class WhileLoss(nn.Cell):
    """A loop with a run-time trip count: ``x`` squashed ``n`` times (f64)."""

    def construct(self, x, n):
        i = 0
        z = x
        while i < n:
            z = ops.sin(z) * x + 0.5
            i = i + 1
        return ops.reduce_sum(z * z)


class WhileGrad(nn.Cell):
    """MindSpore's gradient of :class:`WhileLoss` with respect to ``x``."""

    def __init__(self) -> None:
        super().__init__()
        self.loss = WhileLoss()
        self.grad = ops.GradOperation()

    def construct(self, x, n):
        return self.grad(self.loss)(x, n)


class ConvBN(nn.Cell):
    """Conv, BatchNorm (inference: the running statistics) and ReLU (f32), the ResNet
    stem's pattern; the statistics are away from (0, 1) so the normalisation matters."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, pad_mode="valid", weight_init=Tensor(normal(3, 2, 3, 3, scale=0.4)))
        self.bn = nn.BatchNorm2d(3, eps=1e-3, gamma_init=Tensor(normal(3, scale=0.2) + 1.0),
                                 beta_init=Tensor(normal(3, scale=0.1)),
                                 moving_mean_init=Tensor(normal(3, scale=0.3)),
                                 moving_var_init=Tensor(np.abs(normal(3)) + 0.5))
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.relu(self.bn(self.conv(x)))


def _flat(value):
    if isinstance(value, (tuple, list)):
        out = []
        for v in value:
            out.extend(_flat(v))
        return out
    return [value.asnumpy() if isinstance(value, Tensor) else np.asarray(value)]


ONLY: set[str] = set()
"""The fixtures to make again (the command's arguments); empty: all of them.  Every cell is
still built, in order, so each fixture's random weights stay what they were."""


def make(name: str, cell: nn.Cell, *inputs: np.ndarray, run: bool = True) -> None:
    if ONLY and name not in ONLY:
        return
    tensors = [Tensor(a) for a in inputs]
    path = os.path.join(HERE, name + ".mindir")
    if os.path.exists(path):
        os.remove(path)  # MindSpore writes its files read-only
    ms.export(cell, *tensors, file_name=os.path.join(HERE, name), file_format="MINDIR")
    os.chmod(path, 0o644)
    arrays = {f"in{k}": a for k, a in enumerate(inputs)}
    for k, out in enumerate(_flat(cell(*tensors))):
        arrays[f"out{k}"] = out
    np.savez(os.path.join(HERE, name + ".npz"), **arrays)
    print(f"{name}: {os.path.getsize(os.path.join(HERE, name + '.mindir'))} bytes")


def main() -> None:
    ONLY.update(sys.argv[1:])
    make("dense_relu", DenseReLU(), normal(5, 4))
    make("conv_net", ConvNet(), normal(2, 1, 8, 8))
    make("control_flow", ControlFlow(), np.array([0.1, 0.2, -0.3]), np.array(3, np.int64))
    make("control_flow_else", ControlFlow(), np.array([-0.1, 0.2, -0.3]), np.array(2, np.int64))
    mlp = [normal(3, 4, dtype=np.float64), normal(4, dtype=np.float64),
           normal(4, 2, dtype=np.float64), normal(6, 3, dtype=np.float64), normal(6, 2, dtype=np.float64)]
    make("mlp_loss", MLPLoss(), *mlp)
    make("mlp_grad", MLPGrad(), *mlp)
    make("while_loss", WhileLoss(), np.array([0.3, -0.8, 1.1]), np.array(4, np.int64))
    make("while_grad", WhileGrad(), np.array([0.3, -0.8, 1.1]), np.array(4, np.int64))
    make("conv_bn", ConvBN().set_train(False), normal(2, 2, 6, 6))


if __name__ == "__main__":
    sys.exit(main())

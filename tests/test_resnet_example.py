"""examples/resnet18.anf against the same network written in PyTorch.

The reference is ResNet-18 as torchvision builds it (BasicBlocks, strided
1x1 projections on the shortcuts of stages 2-4, a 7x7 stem with a 3x3 max
pool, a global average pool and a linear layer; eval mode), written here with
``torch.nn.functional`` because torchvision is not a dependency.  Its batch
norm is the inference formula spelled out, so that autograd also gives the
gradients of the running statistics, which anfir's ``batch_norm`` has; that
formula is first checked against ``F.batch_norm``.  With the same weights,
the example's logits and the gradients of its loss to every parameter agree
with PyTorch through ``anfir.run``, and ``anfir.compile`` of the forward and
of the gradient computes what ``anfir.run`` does.  Small inputs and narrow
widths keep it quick; the 224x224 forward is timed in benchmarks/.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_harness import run_in_process
from example_args import resnet18_args
from gradcheck import assert_close

import anfir
from anfir.cli import compile_args

torch = pytest.importorskip("torch", reason="the reference is ResNet-18 in torch.nn.functional "
                            "(pip install torch==2.13.0, or the dev extra)")
F = torch.nn.functional

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "resnet18.anf"
WIDTHS = (4, 8, 8, 16)
TOL = {"f64": (1e-9, 1e-11), "f32": (1e-4, 1e-5)}


def _bn(v: Any, s: Any) -> Any:
    """Inference batch norm, ``F.batch_norm(v, mean, var, weight, bias, training=False)``."""
    shape = (1, -1, 1, 1)
    scale = s[0] / torch.sqrt(s[3] + 1e-5)
    return (v - s[2].reshape(shape)) * scale.reshape(shape) + s[1].reshape(shape)


def _block(v: Any, b: Any) -> Any:
    h = F.relu(_bn(F.conv2d(v, b[0], padding=1), b[1]))
    shortcut = v if len(b) == 4 else _bn(F.conv2d(v, b[4], stride=2), b[5])
    stride = 1 if len(b) == 4 else 2
    if stride == 2:  # the first block of stages 2-4: its first convolution halves the size
        h = F.relu(_bn(F.conv2d(v, b[0], stride=2, padding=1), b[1]))
    return F.relu(_bn(F.conv2d(h, b[2], padding=1), b[3]) + shortcut)


def torch_resnet18(x: Any, p: Any) -> Any:
    """torchvision's resnet18 forward (eval mode) on parameters nested as the example's."""
    h = F.relu(_bn(F.conv2d(x, p[0][0], stride=2, padding=3), p[0][1]))
    h = F.max_pool2d(h, 3, stride=2, padding=1)
    for stage in p[1:5]:
        h = _block(_block(h, stage[0]), stage[1])
    return torch.flatten(F.adaptive_avg_pool2d(h, 1), 1) @ p[5][0].T + p[5][1]


def _tmap(fn: Callable[[Any], Any], value: Any) -> Any:
    return tuple(_tmap(fn, v) for v in value) if isinstance(value, tuple) else fn(value)


def _leaves(value: Any) -> tuple[Any, ...]:
    return tuple(leaf for v in value for leaf in _leaves(v)) if isinstance(value, tuple) \
        else (value,)


@pytest.fixture(scope="module")
def module() -> anfir.Module:
    return anfir.load(str(EXAMPLE))


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """torch on one thread while these tests run: its threads spin-wait, and on a busy
    2-core machine a tiny network then takes seconds instead of milliseconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_batch_norm_of_the_reference_is_torchs() -> None:
    _, p, _ = resnet18_args(widths=WIDTHS)
    s = _tmap(torch.tensor, p[0][1])
    v = torch.tensor(np.random.default_rng(3).normal(size=(2, WIDTHS[0], 5, 5)))
    np.testing.assert_allclose(_bn(v, s).numpy(),
                               F.batch_norm(v, s[2], s[3], s[0], s[1], False).numpy(), rtol=1e-12)


@pytest.mark.parametrize("dtype", ["f32", "f64"])
def test_forward_and_every_parameter_gradient_match_pytorch(module: anfir.Module,
                                                            dtype: str) -> None:
    np_dtype = {"f32": np.float32, "f64": np.float64}[dtype]
    rtol, atol = TOL[dtype]
    x, p, labels = resnet18_args(seed=1, batch=2, size=32, widths=WIDTHS, classes=10, dtype=np_dtype)
    tp = _tmap(lambda a: torch.tensor(a, requires_grad=True), p)
    logits = torch_resnet18(torch.tensor(x), tp)

    got = anfir.run(module["resnet18"], x, p)
    assert got.dtype == np_dtype and got.shape == (2, 10)
    assert_close(got, logits.detach().numpy(), rtol, atol, msg="logits")
    loss = F.cross_entropy(logits, torch.tensor(labels))
    assert_close(anfir.run(module["resnet18_loss"], x, p, labels), loss.item(), rtol, atol,
                 msg="loss")

    want = tuple(g.numpy() for g in torch.autograd.grad(loss, _leaves(tp)))
    grads = anfir.run(module["resnet18_grad"], x, p, labels)
    # Nested as the parameters: 5 (stem) + 8 blocks * 10 + 3 projections * 5 + 2 (fc) arrays.
    assert _tmap(np.shape, grads) == _tmap(np.shape, p)
    leaves = _leaves(grads)
    assert len(leaves) == len(want) == 102
    assert all(np.asarray(g).dtype == np_dtype for g in leaves)
    assert_close(leaves, want, rtol, atol, msg="parameter gradients (run)")


def test_compiled_forward_and_gradient_agree_with_run(module: anfir.Module) -> None:
    x, p, labels = resnet18_args(seed=2, batch=2, size=32, widths=WIDTHS, classes=10,
                                 dtype=np.float32)
    forward = anfir.compile(module, entry="resnet18", args=[x, p])
    assert_close(anfir.run(forward, x, p), anfir.run(module["resnet18"], x, p), 1e-5, 1e-6,
                 msg="compiled forward")
    gradient = anfir.compile(module, entry="resnet18_grad", args=[x, p, labels])
    want = anfir.run(module["resnet18_grad"], x, p, labels)
    got = anfir.run(gradient, x, p, labels)
    assert _tmap(np.shape, got) == _tmap(np.shape, p)
    assert_close(_leaves(got), _leaves(want), 1e-5, 1e-6, msg="compiled gradient")


def test_gradient_to_the_image_matches_pytorch(module: anfir.Module) -> None:
    x, p, labels = resnet18_args(seed=3, batch=1, size=32, widths=WIDTHS, classes=10)
    tx = torch.tensor(x, requires_grad=True)
    F.cross_entropy(torch_resnet18(tx, _tmap(torch.tensor, p)), torch.tensor(labels)).backward()
    got = anfir.run(anfir.grad(module["resnet18_loss"], 0), x, p, labels)
    assert_close(got, tx.grad.numpy(), 1e-9, 1e-11)


def test_the_stem_gradient_jits_in_jax() -> None:
    """The JAX back end on the example's stem (conv, batch norm, relu, max pool) and its
    gradient under jax.jit (the whole example is too slow for XLA to compile here:
    tests/test_jax.py says so); max_pool's rule once had no derivative under jit."""
    jax = pytest.importorskip("jax", reason="the JAX back end")
    stem = anfir.parse("""
def stem(x, w, s) = sum(max_pool(relu(batch_norm(conv(x, w, stride=2, padding=3), s[0], s[1],
                                                 s[2], s[3])), 3, stride=2, padding=1) ** 2)
""")["stem"]
    x, p, _ = resnet18_args(seed=4, batch=2, size=16, widths=WIDTHS, dtype=np.float32)
    args = (x, *p[0])
    gradient = anfir.grad(stem, (0, 1, 2))
    want = anfir.run(gradient, *args)
    got = jax.jit(anfir.to_jax(gradient))(*args)
    assert_close(_tmap(np.asarray, tuple(got)), want, 1e-4, 1e-5)


def _type_text(value: Any) -> str:
    """The ANF type of nested f32 arrays: ``(f32[4, 3, 7, 7], (f32[4], ...), ...)``."""
    if isinstance(value, tuple):
        return "(" + ", ".join(_type_text(v) for v in value) + ")"
    assert value.dtype == np.float32
    return f"f32[{', '.join(map(str, value.shape))}]"


def test_compiled_once_for_symbolic_batch_and_image_sizes(module: anfir.Module) -> None:
    """Types instead of values, as ``anfir compile --args`` takes them: one compiled
    forward serves every batch and image size, and the command line compiles the
    gradient the same way."""
    _, p, _ = resnet18_args(widths=WIDTHS, dtype=np.float32)
    types = ["f32[N, 3, H, W]", _type_text(p), "i64[N]"]
    forward = anfir.compile(module, entry="resnet18", args=compile_args(types[:2]))
    for batch, size in ((1, 16), (3, 40)):
        x, _, _ = resnet18_args(seed=batch, batch=batch, size=size, widths=WIDTHS, dtype=np.float32)
        assert_close(anfir.run(forward, x, p), anfir.run(module["resnet18"], x, p), 1e-5, 1e-6)
    status, out, err = run_in_process(["compile", str(EXAMPLE), "--entry", "resnet18_grad",
                                       "--args", *types], EXAMPLE.parent)
    assert status == 0, err
    assert out.startswith("compiled @resnet18_grad: "), out

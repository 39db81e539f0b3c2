"""Gradients at kinks and ties, op by op, against PyTorch's (issue 24).

Each case is a small ``torch.nn.Module`` built around one ATen op, evaluated at
the exact points where the op is not differentiable — a clamp's bounds, relu's
0, equal arguments of ``maximum``, repeated maxima of a reduction, equal keys
of ``sort``/``topk``, a pooling window whose maximum is repeated — exported with
``torch.export``, imported, and differentiated by anfir; the gradient with
respect to every input must be PyTorch's ``torch.autograd.grad`` exactly (these
are sums of a few products of small integers).  The cotangent is a fixed
random tensor, so a gradient sent to the wrong element shows.

ONNX-imported ops are checked the same way against the conventions of
onnxruntime's training gradient builder (``Max``/``Min`` split a tie evenly over
the equal inputs, ``Clip`` passes the gradient at its bounds, ``Relu`` does not
at 0), which are PyTorch's for the same ops: the expected values come from the
equivalent PyTorch function.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

import anfir  # noqa: E402
from anfir.ir.graph import FuncGraph  # noqa: E402
from anfir.primitives import registry  # noqa: E402

F = torch.nn.functional

KINKS = torch.tensor([-7.0, -6.0, -3.0, -1.0, -0.5, 0.0, 0.0, 0.5, 1.0, 3.0, 6.0, 7.0])
"""Every kink of the ops below (0, ±1 for hardtanh, ±3 for the hard ones, 0 and 6
for ReLU6), with neighbours on both sides."""

TIES_A = torch.tensor([[1.0, 2.0, 2.0, 0.0], [5.0, 5.0, 5.0, -1.0], [0.0, 3.0, 1.0, 3.0]])
TIES_B = torch.tensor([[1.0, 1.0, 2.0, 3.0], [5.0, 4.0, 5.0, -1.0], [0.0, 3.0, 2.0, 3.0]])
"""Equal elements inside rows (repeated maxima and minima) and across the two
tensors (ties of maximum/minimum)."""
TOPK = torch.tensor([[1.0, 2.0, 2.0, 0.0], [5.0, 0.0, 5.0, -1.0], [0.0, 3.0, 1.0, 3.0]])


class Op(torch.nn.Module):
    """``fn`` of the inputs as a module (what torch.export needs)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: Any) -> Any:
        return self.fn(*xs)


def _values(out: Any) -> Any:
    """The differentiable result of an op that returns (values, indices)."""
    return out[0] if isinstance(out, tuple) else out


CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "relu": (torch.relu, (KINKS,)),
    "abs": (torch.abs, (KINKS,)),
    "relu6 (hardtanh 0..6)": (F.relu6, (KINKS,)),
    "hardtanh": (F.hardtanh, (KINKS,)),
    "hardtanh(-3, 3)": (lambda x: F.hardtanh(x, -3.0, 3.0), (KINKS,)),
    "clamp (scalar bounds)": (lambda x: torch.clamp(x, -3.0, 6.0), (KINKS,)),
    "clamp_min": (lambda x: torch.clamp(x, min=0.0), (KINKS,)),
    "hardsigmoid": (F.hardsigmoid, (KINKS,)),
    "hardswish": (F.hardswish, (KINKS,)),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.1), (KINKS,)),
    "elu": (lambda x: F.elu(x, 0.5), (KINKS,)),
    "sign, round, floor, ceil": (lambda x: torch.sign(x) * x + torch.round(x) + torch.floor(x)
                                 + torch.ceil(x), (KINKS,)),
    "maximum": (torch.maximum, (TIES_A, TIES_B)),
    "minimum": (torch.minimum, (TIES_A, TIES_B)),
    "maximum with a broadcast scalar": (lambda x: torch.maximum(x, torch.tensor(2.0)), (TIES_A,)),
    "amax (ties share)": (lambda x: torch.amax(x, dim=1), (TIES_A,)),
    "amin (ties share)": (lambda x: torch.amin(x, dim=1), (TIES_A,)),
    "max (all, ties share)": (lambda x: torch.max(x), (TIES_A,)),
    "min (all, ties share)": (lambda x: torch.min(x), (TIES_A,)),
    "max.dim (the index's element)": (lambda x: _values(torch.max(x, dim=1)), (TIES_A,)),
    "min.dim keepdim": (lambda x: _values(torch.min(x, dim=0, keepdim=True)), (TIES_A,)),
    # PyTorch leaves the order of equal elements in topk unspecified (its CPU
    # kernel's heap picks the later ones); anfir's takes the lower index first,
    # so the ties here are within the selected k, where both agree.
    "topk": (lambda x: _values(torch.topk(x, 2, dim=1)), (TOPK,)),
    "topk smallest": (lambda x: _values(torch.topk(x, 2, dim=1, largest=False)), (TOPK,)),
    "sort": (lambda x: _values(torch.sort(x, dim=1)), (TIES_A,)),
    "sort descending stable": (lambda x: _values(torch.sort(x, dim=1, descending=True,
                                                            stable=True)), (TIES_A,)),
    "max_pool2d (repeated window maxima)": (
        lambda x: F.max_pool2d(x, 2, 1), (torch.tensor([[[[1.0, 1.0, 0.0], [1.0, 1.0, 2.0],
                                                         [2.0, 2.0, 2.0]]]]),)),
    "where at equal branches": (lambda x, y: torch.where(x > y, x, y), (TIES_A, TIES_B)),
    "pow at 0": (lambda x: torch.pow(x, 2.0) + torch.pow(x.abs(), 3.0), (KINKS,)),
    "prod with zeros": (lambda x: torch.prod(x, dim=1),
                        (torch.tensor([[0.0, 2.0, 3.0], [0.0, 0.0, 2.0], [1.0, 2.0, 3.0]]),)),
    "index with repeated indices": (lambda x: x[torch.tensor([0, 2, 0]), torch.tensor([1, 1, 1])],
                                    (TIES_A,)),
    "gather with repeated indices": (lambda x: torch.gather(x, 1, torch.tensor([[0, 0], [1, 1],
                                                                                [3, 3]])), (TIES_A,)),
    "embedding padding_idx": (lambda w: F.embedding(torch.tensor([0, 1, 1, 2]), w, padding_idx=1),
                              (TIES_A,)),
    "fmod / remainder at the jumps": (lambda x, y: torch.fmod(x, y) + torch.remainder(x, y),
                                      (torch.tensor([-4.0, -2.0, 0.0, 2.0, 3.0, 4.0]),
                                       torch.tensor([2.0, 2.0, 2.0, 2.0, 1.5, -2.0]))),
}


def _loss(mod: anfir.Module, cotangent: np.ndarray) -> FuncGraph:
    """sum(forward(...) * cotangent) as a graph over the entry's parameters."""
    g = FuncGraph("loss", None)
    params = [g.add_parameter(p.name, None) for p in mod.entry.parameters]
    out = g.apply(mod.entry, *params)
    g.output = g.apply(registry.lookup("sum"), g.apply(registry.lookup("mul"), out, cotangent))
    return g


def _anfir_grads(mod: anfir.Module, inputs: list[np.ndarray], cotangent: np.ndarray) -> Any:
    lifted = list(mod.params.values())
    wrt = tuple(range(len(lifted), len(lifted) + len(inputs)))
    return anfir.run(anfir.grad(_loss(mod, cotangent), wrt=wrt), *lifted, *inputs)


@pytest.mark.parametrize("name", list(CASES))
def test_gradient_at_kinks_and_ties_is_pytorchs(name: str) -> None:
    fn, inputs = CASES[name]
    module = Op(fn).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = anfir.import_torch(torch.export.export(module, tuple(inputs)))
    leaves = [x.clone().requires_grad_(True) for x in inputs]
    out = module(*leaves)
    cotangent = torch.from_numpy(
        np.random.default_rng(7).integers(1, 5, size=tuple(out.shape)).astype(np.float32))
    want = torch.autograd.grad((out * cotangent).sum(), leaves)
    np.testing.assert_allclose(anfir.run(mod.entry, *mod.params.values(),
                                         *[x.numpy() for x in inputs]),
                               out.detach().numpy(), rtol=1e-6, atol=0)
    got = _anfir_grads(mod, [x.numpy() for x in inputs], cotangent.numpy())
    for g, w in zip(got, want):
        # Exact but for the rounding of smooth parts (elu's exp): a gradient sent
        # to the wrong side of a kink is off by a whole cotangent entry.
        np.testing.assert_allclose(np.asarray(g, np.float32), w.numpy(), rtol=1e-5, atol=1e-7,
                                   err_msg=name)


def test_the_old_clip_mapping_of_relu6_would_differ() -> None:
    """The check above can fail: ``clip``'s own gradient (PyTorch's ``clamp``'s, 1 at
    the bounds) differs from ReLU6's at 0 and 6 — the issue's example."""
    x = np.array([-1.0, 0.0, 3.0, 6.0, 7.0], np.float32)
    clip = anfir.parse("def f(x) = sum(clip(x, min=0.0, max=6.0))")["f"]
    assert anfir.run(anfir.grad(clip), x).tolist() == [0, 1, 1, 1, 0]
    mod = anfir.import_torch(torch.export.export(Op(F.relu6), (torch.from_numpy(x),)))
    sums = _anfir_grads(mod, [x], np.ones(5, np.float32))
    assert sums[0].tolist() == [0, 0, 1, 0, 0]


# -- ONNX ---------------------------------------------------------------------------------
def _onnx_model(op: str, n_inputs: int, shape: tuple[int, ...], **attrs: Any) -> Any:
    from onnx import TensorProto, helper

    names = [f"x{i}" for i in range(n_inputs)]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], "kink", [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in names],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


ONNX_CASES: dict[str, tuple[Any, Callable[..., Any], tuple[Any, ...]]] = {
    "Relu": (_onnx_model("Relu", 1, (12,)), torch.relu, (KINKS,)),
    "Abs": (_onnx_model("Abs", 1, (12,)), torch.abs, (KINKS,)),
    "Max (ties split evenly)": (_onnx_model("Max", 2, (3, 4)), torch.maximum, (TIES_A, TIES_B)),
    "Min (ties split evenly)": (_onnx_model("Min", 2, (3, 4)), torch.minimum, (TIES_A, TIES_B)),
    "LeakyRelu": (_onnx_model("LeakyRelu", 1, (12,), alpha=0.1),
                  lambda x: F.leaky_relu(x, 0.1), (KINKS,)),
    "HardSigmoid": (_onnx_model("HardSigmoid", 1, (12,), alpha=1.0 / 6.0),
                    F.hardsigmoid, (KINKS,)),
}


@pytest.mark.parametrize("name", list(ONNX_CASES))
def test_onnx_gradient_at_kinks_and_ties_follows_onnxruntime_training(name: str) -> None:
    model, fn, inputs = ONNX_CASES[name]
    mod = anfir.import_onnx(model)
    leaves = [x.clone().requires_grad_(True) for x in inputs]
    out = fn(*leaves)
    cotangent = torch.from_numpy(
        np.random.default_rng(7).integers(1, 5, size=tuple(out.shape)).astype(np.float32))
    want = torch.autograd.grad((out * cotangent).sum(), leaves)
    got = _anfir_grads(mod, [x.numpy() for x in inputs], cotangent.numpy())
    got = got if isinstance(got, tuple) else (got,)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g, np.float32), w.numpy(), rtol=1e-6, err_msg=name)

"""PyTorch's Core ATen opset through the torch.export importer (issue 24).

``test_core_aten_coverage`` lists which of the overloads PyTorch tags
``torch.Tag.core`` the importer maps; every one it does not is in
``anfir.interop.torch.rules.EXCLUDED`` with a reason (docs/torch.md lists them), and at
most nine are.  The cases below run the ops the importer gained for it: each
module is exported, imported, run against eager PyTorch, and — where the op is
differentiable — differentiated against ``torch.autograd``.
"""

from __future__ import annotations

import re
import warnings
from typing import Any, Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import anfir  # noqa: E402
from anfir.interop.torch.rules import EXCLUDED, full_table  # noqa: E402
from anfir.interop.torch.rules import core_overloads as _core_overloads  # noqa: E402
from anfir.ir.graph import FuncGraph  # noqa: E402
from anfir.primitives import registry  # noqa: E402

aten = torch.ops.aten
F = torch.nn.functional


def core_overloads() -> list[Any]:
    return _core_overloads(torch)


def test_core_aten_coverage() -> None:
    table = full_table(torch)
    ops = core_overloads()
    assert len(ops) >= 189  # 193 in torch 2.13 (189 of them loaded by default)
    missing = sorted(str(op) for op in ops if op not in table)
    assert missing == sorted(EXCLUDED), missing
    assert len(ops) - len(missing) >= 180
    assert len(missing) <= 9
    with open("docs/torch.md", encoding="utf-8") as f:
        docs = f.read()
    for name in EXCLUDED:  # each exclusion is documented with its reason
        assert f"`{name}`" in docs, name


class Op(torch.nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: Any) -> Any:
        return self.fn(*xs)


R = np.random.default_rng(5)


def t(*shape: int) -> Any:
    return torch.from_numpy(R.standard_normal(shape).astype(np.float32))


def ints(high: int, *shape: int) -> Any:
    return torch.from_numpy(R.integers(0, high, size=shape).astype(np.int64))


CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "log2 log10": (lambda x: torch.log2(x.abs() + 1) + torch.log10(x.abs() + 1), (t(5),)),
    "asinh acosh atanh": (lambda x: torch.asinh(x * 3) + torch.acosh(x.abs() + 1.5)
                          + torch.atanh(torch.tanh(x) * 0.9), (t(7),)),
    "trunc": (lambda x: torch.trunc(x * 3) + x, (t(6),)),
    "clamp with tensor bounds": (lambda x, lo, hi: torch.clamp(x, lo, hi) + torch.clamp(x, max=hi),
                                 (t(3, 4), t(4) - 1, t(3, 1) + 1)),
    "bitwise with a scalar": (lambda i: (i & 3) | 8 ^ 1, (ints(16, 5),)),
    "div floor by a scalar": (lambda x: torch.div(x, 0.7, rounding_mode="floor"), (t(5),)),
    "var.dim": (lambda x: torch.var(x, dim=1) + torch.var(x, dim=0, unbiased=False, keepdim=True).sum(),
                (t(4, 5),)),
    "vector norms": (lambda x: torch.linalg.vector_norm(x, dim=1) + torch.linalg.vector_norm(x, 1, dim=1)
                     + torch.linalg.vector_norm(x, float("inf"), dim=1) + F.normalize(x, dim=1).sum(1),
                     (t(3, 4),)),
    "cdist": (lambda a, c: torch.cdist(a, c), (t(2, 4, 3), t(2, 5, 3))),
    "pdist": (lambda a: F.pdist(a), (t(5, 3),)),
    "group_norm": (lambda x, w, b2: F.group_norm(x, 2, w, b2), (t(2, 4, 3, 3), t(4), t(4))),
    "batch_norm (training)": (lambda x, w, b2: F.batch_norm(x, None, None, w, b2, training=True),
                              (t(4, 3, 2, 2), t(3), t(3))),
    "flip": (lambda x: torch.flip(x, [0, 2]), (t(2, 3, 4),)),
    "repeat": (lambda x: x.repeat(2, 1, 3), (t(3, 2),)),
    "diagonal": (lambda x: torch.diagonal(x, 1, 0, 2) + torch.diagonal(x, -1, 2, 0), (t(4, 2, 4),)),
    "as_strided": (lambda x: torch.as_strided(x, (3, 3), (2, 1), 1), (t(12),)),
    "slice_scatter": (lambda x, s: torch.slice_scatter(x, s, 1, 1, 5, 2), (t(3, 6), t(3, 2))),
    "select_scatter": (lambda x, s: torch.select_scatter(x, s, 0, 1), (t(3, 4), t(4))),
    "scatter src and value": (lambda x, s: torch.scatter(x, 1, torch.tensor([[2, 0], [1, 3]]), s)
                              + torch.scatter(x, 0, torch.tensor([[1, 0, 1, 0]]), 2.0),
                              (t(2, 4), t(2, 2))),
    "scatter_add": (lambda x, s: torch.scatter_add(x, 1, torch.tensor([[2, 2, 0], [1, 3, 1]]), s),
                    (t(2, 4), t(2, 3))),
    "scatter_reduce sum and mean": (
        lambda x, s: torch.scatter_reduce(x, 1, torch.tensor([[2, 2, 0], [1, 3, 1]]), s, "sum")
        + torch.scatter_reduce(x, 1, torch.tensor([[2, 2, 0], [1, 3, 1]]), s, "mean", include_self=False),
        (t(2, 4), t(2, 3))),
    "index_put": (lambda x, v: torch.index_put(x, (torch.tensor([0, 2, 0]), torch.tensor([1, 1, 1])), v,
                                               accumulate=True)
                  + torch.index_put(x, (torch.tensor([1, -1]),), v[:2, None], accumulate=False),
                  (t(3, 4), t(3))),
    "masked_scatter": (lambda x, s: x.masked_scatter(x > 0, s), (t(3, 4), t(12))),
    "reflection and replication padding 1d": (
        lambda x: F.pad(x, (1, 2), mode="reflect") + F.pad(x, (2, 1), mode="replicate"), (t(2, 3, 5),)),
    "reflection and replication padding 2d": (
        lambda x: F.pad(x, (1, 2, 2, 1), mode="reflect") + F.pad(x, (2, 1, 1, 2), mode="replicate"),
        (t(2, 3, 4, 5),)),
    "reflection and replication padding 3d": (
        lambda x: F.pad(x, (1, 0, 1, 1, 0, 1), mode="reflect") + F.pad(x, (0, 1, 1, 1, 1, 0), mode="replicate"),
        (t(1, 2, 3, 3, 4),)),
    "upsample nearest": (lambda x: F.interpolate(x, scale_factor=2, mode="nearest"), (t(1, 2, 3, 3),)),
    "upsample nearest to a size": (lambda x: F.interpolate(x, size=(5, 7), mode="nearest"), (t(1, 2, 3, 4),)),
    "upsample bilinear": (lambda x: F.interpolate(x, size=(5, 7), mode="bilinear", align_corners=False)
                          .sum((-1, -2)) + F.interpolate(x, scale_factor=2, mode="bilinear",
                                                        align_corners=True).sum((-1, -2)),
                          (t(2, 2, 3, 4),)),
    "grid_sampler_2d": (lambda x, g: F.grid_sample(x, g, align_corners=False)
                        + F.grid_sample(x, g, align_corners=True), (t(2, 3, 4, 5), t(2, 3, 2, 2) * 0.7)),
    "col2im (fold)": (lambda c: F.fold(c, (4, 5), (2, 2), padding=1, stride=(1, 2)), (t(2, 12, 15),)),
    "embedding_bag": (lambda w, ps: F.embedding_bag(torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), w,
                                                    torch.tensor([0, 4, 4, 6]), mode="sum",
                                                    per_sample_weights=ps)
                      + F.embedding_bag(torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), w,
                                        torch.tensor([0, 4, 4, 6]), mode="mean"),
                      (t(10, 3), t(8))),
    "native_dropout (eval)": (lambda x: aten.native_dropout(x, 0.5, False)[0] * 2, (t(3, 4),)),
    "empty, fill, copy": (lambda x: torch.empty_like(x).fill_(2.0) + x.new_empty((3, 4)).copy_(x * 3),
                          (t(3, 4),)),
    "convolution_backward": (
        lambda g, x, w: sum(r.sum() for r in aten.convolution_backward(
            g, x, w, [3], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True])),
        (t(2, 3, 4, 4), t(2, 2, 4, 4), t(3, 2, 3, 3))),
    "native_layer_norm_backward": (
        lambda g, x, w, b2: sum(r.sum() * (i + 1) for i, r in enumerate(aten.native_layer_norm_backward(
            g, x, [4], *aten.native_layer_norm(x, [4], w, b2, 1e-5)[1:], w, b2, [True, True, True]))),
        (t(2, 3, 4), t(2, 3, 4), t(4), t(4))),
    "native_group_norm_backward": (
        lambda g, x, w: sum(r.sum() * (i + 1) for i, r in enumerate(aten.native_group_norm_backward(
            g, x, *aten.native_group_norm(x, w, None, 2, 4, 6, 2, 1e-5)[1:], w, 2, 4, 6, 2,
            [True, True, True]))),
        (t(2, 4, 2, 3), t(2, 4, 2, 3), t(4))),
    "pooling backward ops": (
        lambda g, x: aten.avg_pool2d_backward(g, x, [2, 2], [2, 2], [0, 0], False, True, None)
        + aten._adaptive_avg_pool2d_backward(g, x)
        + aten.max_pool2d_with_indices_backward(g, x, [2, 2], [2, 2], [0, 0], [1, 1], False,
                                                F.max_pool2d(x, 2, return_indices=True)[1]),
        (t(2, 3, 2, 2), t(2, 3, 4, 4))),
    "embedding_dense_backward": (
        lambda g: aten.embedding_dense_backward(g, torch.tensor([[0, 3, 3], [1, 0, 2]]), 5, 2, False),
        (t(2, 3, 4),)),
}


NO_TORCH_GRADIENT = {"native_group_norm_backward"}
"""Ops PyTorch has no derivative for (only the forward is compared)."""


def _loss(mod: anfir.Module, cot: np.ndarray) -> FuncGraph:
    g = FuncGraph("loss", None)
    params = [g.add_parameter(p.name, None) for p in mod.entry.parameters]
    out = g.apply(registry.lookup("mul"), g.apply(mod.entry, *params), cot)
    g.output = g.apply(registry.lookup("sum"), out)
    return g


@pytest.mark.parametrize("name", list(CASES))
def test_core_op_matches_pytorch(name: str) -> None:
    fn, inputs = CASES[name]
    module = Op(fn).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mod = anfir.import_torch(torch.export.export(module, tuple(inputs)))
    want = module(*inputs)
    lifted = list(mod.params.values())
    got = anfir.run(mod.entry, *lifted, *[x.numpy() for x in inputs])
    np.testing.assert_allclose(np.asarray(got), want.detach().numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
    floats = [i for i, x in enumerate(inputs) if x.dtype.is_floating_point]
    if not floats or not want.dtype.is_floating_point or name in NO_TORCH_GRADIENT:
        return
    leaves = [x.clone().requires_grad_(x.dtype.is_floating_point) for x in inputs]
    out = module(*leaves)
    cot = R.standard_normal(tuple(out.shape)).astype(np.float32)
    wants = torch.autograd.grad((out * torch.from_numpy(cot)).sum(), [leaves[i] for i in floats],
                                allow_unused=True)
    grads = anfir.run(anfir.grad(_loss(mod, cot), wrt=tuple(len(lifted) + i for i in floats)),
                      *lifted, *[x.numpy() for x in inputs])
    grads = grads if isinstance(grads, tuple) else (grads,)
    for i, g, w in zip(floats, grads, wants):
        ref = np.zeros_like(g) if w is None else w.numpy()
        np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-5, err_msg=f"{name}: input {i}")


def test_documented_exclusions_name_only_core_ops() -> None:
    names = {str(op) for op in core_overloads()}
    assert set(EXCLUDED) <= names
    assert all(re.fullmatch(r"aten\.[\w.]+", n) for n in EXCLUDED)

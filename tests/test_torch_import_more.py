"""torch.export import: advanced indexing, tied weights, dynamic slices, the
static-size guard, torch tensors as arguments, and imports that do not depend
on torch's own decomposition (issue 24).  References: eager PyTorch and
torch.autograd."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import anfir  # noqa: E402
from anfir.errors import DimensionRangeError  # noqa: E402
from anfir.ir.graph import FuncGraph  # noqa: E402
from anfir.primitives import registry  # noqa: E402


def export(module: Any, *args: Any, dynamic: Any = None) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.export.export(module.eval(), tuple(args), dynamic_shapes=dynamic)


def loss_grads(mod: anfir.Module, inputs: list[np.ndarray], cotangent: np.ndarray,
               wrt: tuple[int, ...]) -> Any:
    """anfir's gradient of sum(forward(*params, *inputs) * cotangent)."""
    g = FuncGraph("loss", None)
    params = [g.add_parameter(p.name, None) for p in mod.entry.parameters]
    out = g.apply(registry.lookup("mul"), g.apply(mod.entry, *params), cotangent)
    g.output = g.apply(registry.lookup("sum"), out)
    return anfir.run(anfir.grad(g, wrt=wrt), *mod.params.values(), *inputs)


class Indexer(torch.nn.Module):
    """x[i, j], x[:, i, j] (adjacent, after a slice), x[i, :, j] (separated: the
    broadcast axes go first), broadcast index shapes, negative and repeated indices."""

    def forward(self, x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> Any:
        a = x[i, j]                      # (2, 3) broadcast from (2, 1) and (3,)
        b = x[:, i, j]                   # (B, 2, 3): axes 1 and 2 adjacent
        c = x[i, :, j]                   # (2, 3, C1): separated -> front
        d = x[:, -1:, i[:, 0]]           # a slice then one index tensor
        return a.sum() + (b * 2.0).sum() + (c ** 2).sum() + d.sum() + x[..., j].mean()


def test_several_index_tensors_broadcast_as_numpy_and_differentiate() -> None:
    x = torch.randn(4, 5, 6)
    i = torch.tensor([[0], [-1]])
    j = torch.tensor([1, 1, -2])
    mod = anfir.import_torch(export(Indexer(), x, i, j))
    module = Indexer()
    got = anfir.run(mod.entry, x.numpy(), i.numpy(), j.numpy())
    np.testing.assert_allclose(got, module(x, i, j).item(), rtol=1e-5)
    leaf = x.clone().requires_grad_(True)
    (want,) = torch.autograd.grad(module(leaf, i, j), [leaf])
    g = anfir.run(anfir.grad(mod.entry, wrt=0), x.numpy(), i.numpy(), j.numpy())
    np.testing.assert_allclose(g, want.numpy(), rtol=1e-5, atol=1e-6)  # repeated indices add up


class TiedLM(torch.nn.Module):
    """An embedding and an output head that share one weight (GPT-2, T5, BART)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(11, 6)
        self.mix = torch.nn.Linear(6, 6)
        self.head = torch.nn.Linear(6, 11, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.mix(self.embed(ids))))


def test_tied_weights_are_one_parameter_with_the_summed_gradient() -> None:
    model = TiedLM()
    ids = torch.tensor([[1, 4, 4, 10], [0, 3, 2, 1]])
    ep = export(model, ids)
    lifted = [s.target for s in ep.graph_signature.input_specs if s.kind.name == "PARAMETER"]
    mod = anfir.import_torch(ep)
    assert len(mod.params) == len(dict(model.named_parameters())) == 3
    if len(lifted) > 3:  # torch.export lifted the alias: the import says which one it folded
        assert mod.metadata["aliases"] == {"head.weight": "embed.weight"}
    cot = np.random.default_rng(1).standard_normal((2, 4, 11)).astype(np.float32)
    grads = loss_grads(mod, [ids.numpy()], cot, wrt=(0, 1, 2))
    out = (model(ids) * torch.from_numpy(cot)).sum()
    want = torch.autograd.grad(out, list(model.parameters()))
    for g, w in zip(grads, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-6)
    # Updating the one parameter updates both uses, as in the source model.
    name = next(iter(mod.params))
    mod.params[name] = mod.params[name] * 2.0
    with torch.no_grad():
        model.embed.weight.mul_(2.0)
    np.testing.assert_allclose(anfir.run(mod.entry, *mod.params.values(), ids.numpy()),
                               model(ids).detach().numpy(), rtol=1e-5, atol=1e-6)


class Positions(torch.nn.Module):
    """BERT's ``position_ids[:, :seq_len]`` of a buffer longer than the input."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.register_buffer("position_ids", torch.arange(16).expand((1, -1)), persistent=False)
        self.pos = torch.nn.Embedding(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[1]
        return x + self.pos(self.position_ids[:, :seq])


def test_a_slice_with_a_symbolic_bound_runs_at_every_length() -> None:
    seq = torch.export.Dim("seq", min=2, max=16)
    batch = torch.export.Dim("batch", min=1, max=8)
    model = Positions()
    mod = anfir.import_torch(export(model, torch.randn(2, 5, 4), dynamic=({0: batch, 1: seq},)))
    for shape in ((2, 5, 4), (3, 9, 4), (1, 16, 4)):
        x = torch.randn(*shape)
        np.testing.assert_allclose(anfir.run(mod.entry, *mod.params.values(), x.numpy()),
                                   model(x).detach().numpy(), rtol=1e-6)
    cot = np.ones((3, 9, 4), np.float32)
    assert list(mod.params)[0] == "p_pos_weight"
    g = loss_grads(mod, [np.zeros((3, 9, 4), np.float32)], cot, wrt=0)
    want = np.zeros((16, 4), np.float32)
    want[:9] = 3.0
    np.testing.assert_array_equal(g, want)


def test_a_wrong_static_size_is_refused_at_the_entry() -> None:
    batch = torch.export.Dim("batch", min=1, max=8)
    model = Positions()
    mod = anfir.import_torch(export(model, torch.randn(2, 5, 4), dynamic=({0: batch},)))
    with pytest.raises(DimensionRangeError) as info:
        anfir.run(mod.entry, *mod.params.values(), np.zeros((2, 7, 4), np.float32))
    message = str(info.value)
    assert "dimension 1 has size 7" in message and "exported for size 5" in message
    assert info.value.loc is not None and info.value.loc.file == __file__


def test_run_takes_torch_tensors_and_explains_requires_grad() -> None:
    model = torch.nn.Linear(3, 2)
    mod = anfir.import_torch(export(model, torch.randn(4, 3)))
    x = torch.randn(4, 3)
    got = anfir.run(mod.entry, *[torch.from_numpy(p) for p in mod.params.values()], x)
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-6)
    with pytest.raises(anfir.AnfirError, match=r"requires grad: pass tensor.detach\(\)"):
        anfir.run(mod.entry, *mod.params.values(), x.requires_grad_(True))


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.hardswish(self.fc(x)) + torch.nn.functional.scaled_dot_product_attention(
            x[:, None], x[:, None], x[:, None], is_causal=True)[:, 0]


def test_the_import_does_not_depend_on_torchs_decomposition(monkeypatch: Any) -> None:
    """Ops anfir maps whole (linear, hardswish, attention) stay whole; and if
    torch's lowering fails, the program is imported as exported."""
    model = Block()
    x = torch.randn(3, 4)
    ep = export(model, x)
    kept = anfir.to_text(anfir.import_torch(ep))
    assert "attention(" in kept and "hard_swish(" in kept

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("Cannot view a tensor with shape ... as a tensor with shape ...")
    monkeypatch.setattr(type(ep), "run_decompositions", broken)
    mod = anfir.import_torch(ep)
    np.testing.assert_allclose(anfir.run(mod.entry, *mod.params.values(), x.numpy()),
                               model(x).detach().numpy(), rtol=1e-5, atol=1e-6)

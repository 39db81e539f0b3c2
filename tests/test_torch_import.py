"""torch.export programs imported as anfir Modules (anfir.import_torch, `anfir import`),
checked against eager PyTorch 2.13 on CPU: forward values, gradients, a
Hessian-vector product, signature kinds, control flow, dynamic shapes,
locations in dumps, and the error for unsupported ops."""

from __future__ import annotations

import contextlib
import io
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch importer needs PyTorch (anfir[torch])")

import anfir  # noqa: E402
from anfir.cli import format_value  # noqa: E402
from anfir.cli import main as cli_main  # noqa: E402
from anfir.printers.iso import assert_isomorphic  # noqa: E402

THIS_FILE = os.path.basename(__file__)
RTOL = 1e-4


def export(model: torch.nn.Module, *args: torch.Tensor, dynamic: object = None) -> object:
    torch.manual_seed(0)
    return torch.export.export(model, args, dynamic_shapes=dynamic)


def run_imported(mod: anfir.Module, *inputs: np.ndarray) -> object:
    return anfir.run(mod.entry, *mod.params.values(), *inputs)


def close(a: object, b: object, rtol: float = RTOL, atol: float = 1e-5) -> None:
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64),
                               rtol=rtol, atol=atol)


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.fc1 = torch.nn.Linear(6, 16)
        self.fc2 = torch.nn.Linear(16, 16)
        self.fc3 = torch.nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc1(x))
        h = torch.nn.functional.gelu(self.fc2(h))
        return self.fc3(h)


class MLPLoss(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = MLP()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((self.mlp(x) - y) ** 2).mean()


class Signature(torch.nn.Module):
    """Every signature kind: parameters, a persistent and a non-persistent buffer,
    a lifted constant, a mutated buffer and a mutated user input, and nested,
    multiple and scalar outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 3)
        self.register_buffer("count", torch.zeros(1))
        self.register_buffer("scale", torch.full((3,), 2.0), persistent=False)
        self.const = torch.tensor([0.5, -1.0, 1.5])

    def forward(self, x: torch.Tensor, acc: torch.Tensor) -> object:
        self.count.add_(1)
        acc.add_(x.sum(0))
        y = self.lin(x) * self.scale + self.const
        return {"y": y, "stats": (y.mean(), [y.amax(), x.shape[0]])}


def test_signature_kinds_values_and_mutations() -> None:
    model = Signature()
    batch = torch.export.Dim("batch", min=2, max=32)
    ep = export(model, torch.randn(5, 4), torch.zeros(4), dynamic=({0: batch}, None))
    mod = anfir.import_torch(ep)
    assert list(mod.params) == ["p_lin_weight", "p_lin_bias", "b_count", "b_scale", "c_const"]
    assert [p.name for p in mod.entry.parameters] == [*mod.params, "x", "acc"]
    assert mod.metadata["inputs"] == [
        "parameter lin.weight", "parameter lin.bias", "buffer count", "buffer scale",
        "constant_tensor const", "user_input x", "user_input acc"]
    assert mod.metadata["mutations"] == ["buffer_mutation count", "user_input_mutation acc"]
    close(mod.params["b_scale"], np.full(3, 2.0))  # the non-persistent buffer is lifted too
    x = np.random.default_rng(0).standard_normal((7, 4)).astype(np.float32)  # not the exported 5
    acc = np.ones(4, np.float32)
    new_count, new_acc, out = run_imported(mod, x, acc)
    fresh = Signature()
    fresh.load_state_dict(model.state_dict())
    fresh.count.zero_()
    acc_t = torch.ones(4)
    want = fresh(torch.from_numpy(x), acc_t)
    close(new_count, fresh.count.numpy())
    close(new_acc, acc_t.numpy())
    y, (mean, (amax, n)) = out
    close(y, want["y"].detach().numpy())
    close(mean, want["stats"][0].detach().numpy())
    close(amax, want["stats"][1][0].detach().numpy())
    assert n == 7 == want["stats"][1][1]


def test_dynamic_dims_are_dimension_variables_with_ranges() -> None:
    batch = torch.export.Dim("batch", min=2, max=64)
    mod = anfir.import_torch(export(MLP(), torch.randn(8, 6), dynamic=({0: batch},)))
    x_param = mod.entry.parameters[-1]
    (sym,) = mod.entry.flags["meta"]["ranges"]
    assert str(x_param.annotation) == f"f32[{sym}, 6]"
    assert mod.entry.flags["meta"]["ranges"][sym] == [2, 64]
    compiled = anfir.compile(mod)  # from the annotations alone: the batch stays symbolic
    assert f"f32[{sym}, 3]" in anfir.dump_ir(compiled)


def test_mlp_forward_matches_eager_at_another_batch_size() -> None:
    model = MLP().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    mod = anfir.import_torch(export(model, torch.randn(8, 6), dynamic=({0: batch},)))
    for n in (8, 3):
        x = torch.randn(n, 6)
        close(run_imported(mod, x.numpy()), model(x).detach().numpy())
        compiled = anfir.compile(mod, args=[*mod.params.values(), x.numpy()])
        close(anfir.run(compiled, *mod.params.values(), x.numpy()), model(x).detach().numpy())


def _mlp_loss_setup() -> tuple[MLPLoss, anfir.Module, list[torch.Tensor], torch.Tensor, torch.Tensor]:
    model = MLPLoss()
    x, y = torch.randn(5, 6), torch.randn(5, 3)
    mod = anfir.import_torch(export(model, x, y))
    params = [p.detach() for p in model.parameters()]
    return model, mod, params, x, y


def test_gradients_wrt_every_parameter_match_autograd() -> None:
    model, mod, params, x, y = _mlp_loss_setup()
    n = len(mod.params)
    grads = anfir.run(anfir.grad(mod.entry, wrt=tuple(range(n))), *mod.params.values(),
                      x.numpy(), y.numpy())
    want = torch.autograd.grad(model(x, y), list(model.parameters()))
    assert len(grads) == len(want) == n
    for got, ref in zip(grads, want):
        close(got, ref.numpy())


def test_hessian_vector_product_matches_torch_hvp() -> None:
    model, mod, params, x, y = _mlp_loss_setup()
    n = len(mod.params)
    names = [name for name, _ in model.named_parameters()]
    rng = np.random.default_rng(3)
    vs = [rng.standard_normal(p.shape).astype(np.float32) for p in params]

    def loss(*ps: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(model, dict(zip(names, ps)), (x, y))

    _, want = torch.autograd.functional.hvp(loss, tuple(params), tuple(torch.from_numpy(v) for v in vs))
    forward_over_reverse = anfir.jvp(anfir.grad(mod.entry, wrt=tuple(range(n))))
    tangents = [*vs, np.zeros_like(x.numpy()), np.zeros_like(y.numpy())]
    _, hv = anfir.run(forward_over_reverse, *mod.params.values(), x.numpy(), y.numpy(), *tangents)
    for got, ref in zip(hv, want):
        close(got, ref.numpy(), rtol=1e-3, atol=1e-4)


class CondClosure(torch.nn.Module):
    """torch.cond whose branches use a parameter and a buffer they close over."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
        self.register_buffer("shift", torch.tensor([0.25, 0.5, 0.75]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def then(x: torch.Tensor) -> torch.Tensor:
            return torch.sin(x) * self.w

        def otherwise(x: torch.Tensor) -> torch.Tensor:
            return torch.cos(x) + self.shift

        return torch.cond(x.sum() > 0, then, otherwise, (x,))


def test_cond_branches_close_over_parameters_and_buffers() -> None:
    model = CondClosure()
    mod = anfir.import_torch(export(model, torch.ones(3)))
    text = anfir.to_text(mod)
    assert "if " in text and "sin(" in text and "cos(" in text
    for x in (torch.tensor([1.0, 2.0, 0.5]), torch.tensor([-1.0, -2.0, 0.5])):
        close(run_imported(mod, x.numpy()), model(x).detach().numpy())
    x = torch.tensor([1.0, 2.0, 0.5])
    got = anfir.run(anfir.grad(lambda_sum(mod), wrt=0), *mod.params.values(), x.numpy())
    close(got, torch.sin(x).numpy())


def lambda_sum(mod: anfir.Module) -> anfir.FuncGraph:
    """``sum(forward(...))`` as a graph (a scalar loss to differentiate)."""
    params = ", ".join(p.name for p in mod.entry.parameters)
    text = f"def loss({params}) = sum(forward({params}))\n"
    wrapper = anfir.parse(anfir.to_text(mod) + text)
    return wrapper["loss"]


class Counter(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> object:
        from torch._higher_order_ops.while_loop import while_loop

        def cond(i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return i < 5

        def body(i: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, v * 1.5 + 1.0

        return while_loop(cond, body, (torch.tensor(0), x))


def test_while_loop_is_tail_recursion() -> None:
    x = torch.tensor([1.0, 2.0])
    mod = anfir.import_torch(export(Counter(), x))
    i, v = run_imported(mod, x.numpy())
    want_i, want_v = Counter()(x)
    assert int(i) == int(want_i) == 5
    close(v, want_v.numpy())


def test_dumps_name_the_users_file_and_line_and_reload(tmp_path: object) -> None:
    model = MLP()
    x = torch.randn(4, 6)
    mod = anfir.import_torch(export(model, x))
    tanh = next(n for n in mod.entry.nodes() if getattr(n, "loc", None) is not None
                and "tanh" in n.loc.line_text)
    assert tanh.loc.file == __file__ and "torch.tanh(self.fc1(x))" in tanh.loc.line_text
    dump_dir = str(tmp_path)
    args = [*mod.params.values(), x.numpy()]
    anfir.compile(mod, args=args, dump_dir=dump_dir)
    dumps = sorted(f for f in os.listdir(dump_dir) if f.endswith(".ir"))
    assert dumps
    want = model(x).detach().numpy()
    for name in dumps:
        with open(os.path.join(dump_dir, name), encoding="utf-8") as handle:
            text = handle.read()
        assert f"{THIS_FILE}:{tanh.loc.line}" in text, name
        close(anfir.run(anfir.load(os.path.join(dump_dir, name)).ir_entry, *args), want)


def test_cli_import_prints_text_that_reparses(tmp_path: object) -> None:
    model = MLP()
    path = os.path.join(str(tmp_path), "mlp.pt2")
    torch.export.save(export(model, torch.randn(2, 6)), path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["import", path]) == 0
    reparsed = anfir.parse(out.getvalue())
    assert_isomorphic(reparsed, anfir.import_torch(torch.export.load(path)), abstracts=False)
    target = os.path.join(str(tmp_path), "mlp.anf")
    assert cli_main(["import", path, "-o", target]) == 0
    assert anfir.to_text(anfir.load(target)) == out.getvalue()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert cli_main(["import", os.path.join(str(tmp_path), "model.xyz")]) == 2
    assert ".pt2" in err.getvalue()


class Unsupported(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        picked = x[x > 0]  # a boolean mask: refused by aten.index's rule, not by the table
        return torch.fft.rfft(x).real.sum() + torch.nn.functional.relu(picked).sum()


def test_unsupported_ops_are_listed_with_their_lines() -> None:
    ep = export(Unsupported(), torch.randn(5))
    with pytest.raises(anfir.AnfirError) as info:
        anfir.import_torch(ep)
    message = str(info.value)
    assert "aten._fft_r2c" in message and f"{__file__}:" in message
    # The refusal inside a rule is in the same up-front list, with its reason.
    assert "aten.index.Tensor" in message and "boolean mask" in message
    assert message.count("\n  ") >= 2  # every unsupported op, not only the first


def test_import_torch_rejects_other_objects() -> None:
    with pytest.raises(anfir.AnfirError, match="ExportedProgram"):
        anfir.import_torch(MLP())


class EncoderLoss(torch.nn.Module):
    """A transformer block's output against fixed random weights: a scalar loss
    whose gradient reaches every parameter."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.block = torch.nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0).eval()
        self.probe = torch.randn(5, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.block(x) * self.probe).sum()


def test_transformer_encoder_layer_forward_at_another_batch_size() -> None:
    block = EncoderLoss().block
    batch = torch.export.Dim("batch", min=1, max=16)
    mod = anfir.import_torch(export(block, torch.randn(2, 5, 32), dynamic=({0: batch},)))
    for n in (2, 3):
        x = torch.randn(n, 5, 32)
        close(run_imported(mod, x.numpy()), block(x).detach().numpy())


def test_transformer_encoder_layer_gradients_match_autograd() -> None:
    model = EncoderLoss()
    x = torch.randn(2, 5, 32)
    mod = anfir.import_torch(export(model, x))
    n = len(mod.params) - 1  # the probe is a lifted constant, not a parameter
    assert list(mod.params)[-1].startswith("c_")
    grads = anfir.run(anfir.grad(mod.entry, wrt=tuple(range(n))), *mod.params.values(), x.numpy())
    want = torch.autograd.grad(model(x), list(model.parameters()))
    assert len(grads) == len(want) == n
    for got, ref in zip(grads, want):
        close(got, ref.numpy(), atol=1e-4 * float(ref.abs().max()))


# -- convolutional networks: a small CNN and ResNet-18 -------------------------------------


def randomize_batch_norms(model: torch.nn.Module) -> torch.nn.Module:
    """Running statistics and affine parameters away from their identity defaults,
    so the imported batch norm is checked on real numbers; the model in eval."""
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.rand(m.num_features, generator=gen) - 0.5)
                m.running_var.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(m.num_features, generator=gen) + 0.5)
                    m.bias.copy_(torch.rand(m.num_features, generator=gen) - 0.5)
    return model.eval()


class CNN(torch.nn.Module):
    """conv-bn-relu-pool twice, then a linear layer: max pooling, then an adaptive
    average pool to 2x2."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.pool = torch.nn.AdaptiveAvgPool2d((2, 2))
        self.fc = torch.nn.Linear(16 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        h = self.pool(torch.relu(self.bn2(self.conv2(h))))
        return self.fc(torch.flatten(h, 1))


class BasicBlock(torch.nn.Module):
    """torchvision's ResNet BasicBlock: two 3x3 conv-bn, a 1x1 conv-bn shortcut
    where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(cout)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(cout)
        self.downsample: torch.nn.Module = torch.nn.Identity()
        if stride != 1 or cin != cout:
            self.downsample = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False),
                                                  torch.nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.downsample(x))


RESNET_WIDTH = 64
"""ResNet-18's first width (torchvision's: 64, then 128, 256, 512).  The test
runs the real widths; halving this quarters the convolutions' cost."""


class ResNet18(torch.nn.Module):
    """torchvision's resnet18 layout, [2, 2, 2, 2] BasicBlocks, the 7x7/2 stem
    and 3x3/2 max pool, 10 classes; widths ``width`` times 1, 2, 4, 8."""

    def __init__(self, width: int = RESNET_WIDTH) -> None:
        super().__init__()
        torch.manual_seed(6)
        self.conv1 = torch.nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(width)
        self.maxpool = torch.nn.MaxPool2d(3, 2, 1)
        layers, cin = [], width
        for i, planes in enumerate((width, 2 * width, 4 * width, 8 * width)):
            layers.append(torch.nn.Sequential(BasicBlock(cin, planes, 1 if i == 0 else 2),
                                              BasicBlock(planes, planes, 1)))
            cin = planes
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        self.avgpool = torch.nn.AdaptiveAvgPool2d((1, 1))
        self.fc = torch.nn.Linear(cin, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(torch.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def probe_loss(mod: anfir.Module) -> anfir.FuncGraph:
    """``sum(forward(...) * probe)``: a scalar loss of the imported model, its
    last parameter a fixed random weighting of the outputs."""
    params = ", ".join(p.name for p in mod.entry.parameters)
    text = f"def loss({params}, probe) = sum(forward({params}) * probe)\n"
    return anfir.parse(anfir.to_text(mod) + text)["loss"]


def check_forward_and_gradients(model: torch.nn.Module, example: torch.Tensor,
                                batches: tuple[int, ...], grad_batch: int) -> anfir.Module:
    """Export ``model`` at ``example`` with a dynamic batch, import it; its forward
    at each batch size in ``batches`` against eager PyTorch, and the gradients of
    ``sum(model(x) * probe)`` with respect to every parameter (at ``grad_batch``)
    against ``torch.autograd.grad``."""
    batch = torch.export.Dim("batch", min=1, max=16)
    mod = anfir.import_torch(export(model, example, dynamic=({0: batch},)))
    params = list(model.parameters())
    assert all(kind.startswith("parameter ") for kind in mod.metadata["inputs"][:len(params)])
    rng = np.random.default_rng(7)
    for n in batches:
        x = rng.standard_normal((n, *example.shape[1:])).astype(np.float32)
        close(run_imported(mod, x), model(torch.from_numpy(x)).detach().numpy())
    x = torch.from_numpy(rng.standard_normal((grad_batch, *example.shape[1:])).astype(np.float32))
    with torch.no_grad():
        probe = torch.from_numpy(rng.standard_normal(model(x).shape).astype(np.float32))
    grads = anfir.run(anfir.grad(probe_loss(mod), wrt=tuple(range(len(params)))),
                      *mod.params.values(), x.numpy(), probe.numpy())
    want = torch.autograd.grad((model(x) * probe).sum(), params)
    assert len(grads) == len(want) == len(params)
    for got, ref in zip(grads, want):
        close(got, ref.numpy(), atol=1e-5 * float(ref.abs().max()) + 1e-7)
    return mod


def test_cnn_forward_at_other_batch_sizes_and_gradients_match_torch() -> None:
    model = randomize_batch_norms(CNN())
    mod = check_forward_and_gradients(model, torch.randn(2, 3, 16, 16), batches=(2, 1, 5),
                                      grad_batch=3)
    text = anfir.to_text(mod)
    for op in ("conv(", "batch_norm(", "max_pool(", "avg_pool(", "relu(", " @ "):
        assert op in text, op
    compiled = anfir.compile(mod)  # symbolic batch: the shapes through conv and pooling
    sym = str(mod.entry.parameters[-1].annotation).split("[")[1].split(",")[0]
    assert f"f32[{sym}, 10]" in anfir.dump_ir(compiled)


def test_resnet18_forward_at_1x3x32x32_and_gradients_match_torch() -> None:
    """Exported at batch 2 (torch specializes an example batch of 1 to a constant,
    so a dynamic batch needs another example), run at 1x3x32x32."""
    model = randomize_batch_norms(ResNet18())
    if RESNET_WIDTH == 64:
        assert sum(p.numel() for p in model.parameters()) > 11_000_000  # resnet18's 11.2 M
    check_forward_and_gradients(model, torch.randn(2, 3, 32, 32), batches=(1,), grad_batch=1)


class ConvZoo(torch.nn.Module):
    """The other convolution and pooling forms: a transposed convolution with
    output padding, a grouped dilated convolution, batch norm without affine
    parameters, average pooling with ceil mode and without padded cells, max
    pooling in ceil mode, adaptive average pooling to a non-square size."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(8)
        self.up = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)
        self.grouped = torch.nn.Conv2d(6, 6, 3, padding=2, dilation=2, groups=3)
        self.bn = torch.nn.BatchNorm2d(6, affine=False)
        self.avg = torch.nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
        self.max = torch.nn.MaxPool2d(2, ceil_mode=True)
        self.adaptive = torch.nn.AdaptiveAvgPool2d((2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn(self.grouped(torch.relu(self.up(x))))
        return self.adaptive(self.max(self.avg(h)))


def test_transposed_grouped_convolutions_and_pooling_forms_match_torch() -> None:
    check_forward_and_gradients(randomize_batch_norms(ConvZoo()), torch.randn(2, 4, 7, 11),
                                batches=(2, 3), grad_batch=2)


class PoolIndices(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pool = torch.nn.MaxPool2d(2, return_indices=True)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool(x)


def test_max_pool_indices_that_are_read_are_refused_with_the_line() -> None:
    with pytest.raises(anfir.AnfirError) as info:
        anfir.import_torch(export(PoolIndices(), torch.randn(1, 2, 4, 4)))
    message = str(info.value)
    assert "max_pool2d_with_indices" in message and "indices are used" in message
    assert "nothing imported" in message


class Indexing(torch.nn.Module):
    """The indexing and joining ops of sequence models after decomposition:
    embedding with a padding row, cat, slice, split, constant pad (with a crop),
    index_select, gather, one-tensor indexing, arange over the dynamic batch."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(9)
        self.emb = torch.nn.Embedding(10, 3, padding_idx=0)
        self.w = torch.nn.Parameter(torch.randn(3, 3))

    def forward(self, x: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
        h = self.emb(tok).sum(1) @ self.w + x
        a = torch.cat([h, h * 2], dim=1)[:, 1:5:2]
        p, q = h.split([1, 2], dim=1)
        d = torch.nn.functional.pad(q, (1, -1), value=0.5)
        f = torch.index_select(h, 1, torch.tensor([0, 2]))
        g = torch.gather(h, 1, tok[:, :2] % 3)
        k = h[tok[:, 0] % h.shape[0]][:, :2]
        r = torch.arange(h.shape[0]).unsqueeze(1).to(h.dtype)
        return a * p + d * f + g * k + h[:, -1:] * r


def test_indexing_and_joining_ops_match_torch() -> None:
    model = Indexing()
    batch = torch.export.Dim("batch", min=2, max=16)
    tok = torch.tensor([[0, 3, 4, 0, 9], [5, 0, 1, 2, 2], [7, 8, 0, 1, 3]])
    mod = anfir.import_torch(export(model, torch.randn(3, 3), tok,
                                    dynamic=({0: batch}, {0: batch})))
    rng = np.random.default_rng(10)
    for n in (3, 5):
        x = torch.from_numpy(rng.standard_normal((n, 3)).astype(np.float32))
        t = torch.from_numpy(rng.integers(0, 10, (n, 5)))
        t[0, 0] = 0  # the padding row is read
        close(run_imported(mod, x.numpy(), t.numpy()), model(x, t).detach().numpy())
    probe = torch.from_numpy(rng.standard_normal((n, 2)).astype(np.float32))
    params = ", ".join(p.name for p in mod.entry.parameters)
    loss = anfir.parse(anfir.to_text(mod) +
                       f"def loss({params}, probe) = sum(forward({params}) * probe)\n")["loss"]
    grads = anfir.run(anfir.grad(loss, wrt=(0, 1)), *mod.params.values(), x.numpy(), t.numpy(),
                      probe.numpy())
    assert list(mod.params)[:2] == ["p_w", "p_emb_weight"]  # own parameters first; then the index constant
    want = torch.autograd.grad((model(x, t) * probe).sum(), [model.w, model.emb.weight])
    assert not want[1][0].any() and want[1].abs().sum(1).gt(0).sum() > 3  # no gradient at row 0
    for got, ref in zip(grads, want):
        close(got, ref.numpy())


# PyTorch's own export examples (ExportDB, torch/_export/db/examples) of the kinds
# the importer must handle: cond closing over a tensor and with operands, dynamic
# shapes, map, a mutated user input, a scalar output, a dict output.
EXPORT_DB = ["cond_closed_over_variable", "cond_operands", "dynamic_shape_view", "dynamic_shape_map",
             "user_input_mutation", "scalar_output", "dictionary"]


def _leaves(value: object) -> list[object]:
    """The leaves of nested tuples, in order (iteratively)."""
    out, stack = [], [value]
    while stack:
        v = stack.pop()
        if isinstance(v, tuple):
            stack.extend(reversed(v))
        else:
            out.append(v)
    return out


@pytest.mark.parametrize("name", EXPORT_DB)
def test_pytorch_export_db_examples(name: str) -> None:
    import copy
    import importlib

    try:
        case = importlib.import_module(f"torch._export.db.examples.{name}")
    except ImportError:
        pytest.skip(f"this torch has no ExportDB example {name}")
    args = case.example_args
    ep = torch.export.export(case.model, copy.deepcopy(args),
                             dynamic_shapes=getattr(case, "dynamic_shapes", None), strict=False)
    mod = anfir.import_torch(ep)
    flat = [a.numpy() if isinstance(a, torch.Tensor) else a
            for a in torch.utils._pytree.tree_leaves(copy.deepcopy(args))]
    got = run_imported(mod, *flat)
    eager_args = copy.deepcopy(args)
    want = torch.utils._pytree.tree_leaves(case.model(*eager_args))
    if mod.metadata["mutations"]:  # (new value of each mutated input..., output)
        assert name == "user_input_mutation"
        close(got[0], eager_args[0].numpy())
        got = got[-1]
    got_leaves = _leaves(got)
    assert len(got_leaves) == len(want) >= 1
    for g, w in zip(got_leaves, want):
        if isinstance(w, torch.Tensor):
            close(g, w.detach().numpy())
        else:
            assert g == w


class TwoInputs(torch.nn.Module):
    """Two inputs sharing one dynamic batch: the guard binds it once."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(2)
        self.fc = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * y.sum(1, keepdim=True)


def _two_inputs(batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(batch)
    return (rng.standard_normal((batch, 3)).astype(np.float32),
            rng.standard_normal((batch, 3)).astype(np.float32))


def _export_two_inputs() -> object:
    batch = torch.export.Dim("batch", min=2, max=8)
    return export(TwoInputs(), torch.randn(4, 3), torch.randn(4, 3),
                  dynamic=({0: batch}, {0: batch}))


def _expect_range_error(call: object, sym: str, size: int, param: str = "x") -> anfir.AnfirError:
    from anfir.errors import DimensionRangeError, ShapeError

    with pytest.raises(DimensionRangeError) as info:
        call()  # type: ignore[operator]
    err = info.value
    assert isinstance(err, ShapeError) and err.loc is not None
    assert f"({param})" in err.message and f"size {size}" in err.message
    assert f"range of {sym} [2, 8]" in err.message
    return err


def test_dim_ranges_check_run_and_compile_at_the_entry() -> None:
    model = TwoInputs()
    mod = anfir.import_torch(_export_two_inputs())
    (sym,) = mod.entry.flags["meta"]["ranges"]
    assert mod.entry.flags["meta"]["ranges"][sym] == [2, 8]
    params = list(mod.params.values())
    for n in (4, 2, 8):  # inside the range, the bounds included
        x, y = _two_inputs(n)
        want = model(torch.from_numpy(x), torch.from_numpy(y)).detach().numpy()
        close(anfir.run(mod["forward"], *params, x, y), want)
        close(anfir.run(anfir.compile(mod, args=[*params, x, y]), *params, x, y), want)
    symbolic = anfir.compile(mod)  # no arguments: the batch stays s<N>, its range in the dump
    dump = anfir.dump_ir(symbolic)
    assert f"f32[{sym}, 3]" in dump and f'meta ranges = {{"{sym}": [2, 8]}}' in dump
    for n in (9, 1):
        args = [*params, *_two_inputs(n)]
        err = _expect_range_error(lambda a=args: anfir.run(mod["forward"], *a), sym, n)
        assert err.loc.file == __file__  # the user's forward, where x is first read
        _expect_range_error(lambda a=args: anfir.compile(mod, args=a), sym, n)
        _expect_range_error(lambda a=args: anfir.run(symbolic, *a), sym, n)
    # Torch's guard binds the batch once: x and y must agree.
    x, _ = _two_inputs(4)
    _, y = _two_inputs(5)
    for call in (lambda: anfir.run(mod["forward"], *params, x, y),
                 lambda: anfir.compile(mod, args=[*params, x, y])):
        with pytest.raises(anfir.AnfirError, match=f"(y).*size 5, but {sym} is 4 .*(x)"):
            call()


def test_dim_ranges_survive_text_dumps_and_the_cli(tmp_path: object) -> None:
    model = TwoInputs()
    folder = str(tmp_path)
    pt2 = os.path.join(folder, "two.pt2")
    torch.export.save(_export_two_inputs(), pt2)
    anf = os.path.join(folder, "two.anf")
    assert cli_main(["import", pt2, "-o", anf]) == 0
    with open(anf, encoding="utf-8") as handle:
        text = handle.read()
    mod = anfir.load(anf)
    (sym,) = mod.entry.flags["meta"]["ranges"]
    assert f'#@ ranges {{"{sym}": [2, 8]}}\ndef forward(' in text
    assert anfir.to_text(mod) == text
    params = list(anfir.import_torch(torch.export.load(pt2)).params.values())  # not in the text
    x, y = _two_inputs(9)
    err = _expect_range_error(lambda: anfir.run(mod["forward"], *params, x, y), sym, 9)
    assert err.loc.file == anf and f"x: f32[{sym}, 3]" in err.loc.excerpt()  # the annotation
    # An .ir dump carries the attribute too, and loads back guarded.
    ir = os.path.join(folder, "two.ir")
    with open(ir, "w", encoding="utf-8") as handle:
        handle.write(anfir.dump_ir(anfir.compile(mod)))
    _expect_range_error(lambda: anfir.run(anfir.load(ir)["forward"], *params, x, y), sym, 9)
    # The command line: the weights and the inputs as .npy files.
    names = []
    for i, value in enumerate([*params, x, y]):
        names.append(os.path.join(folder, f"a{i}.npy"))
        np.save(names[-1], value)
    for command in (["run", anf, *names], ["compile", anf, "--args", *names]):
        err_text = io.StringIO()
        with contextlib.redirect_stderr(err_text), contextlib.redirect_stdout(io.StringIO()):
            assert cli_main(command) != 0
        assert f"outside the range of {sym} [2, 8]" in err_text.getvalue(), command
        assert f"{anf}:" in err_text.getvalue()
    x, y = _two_inputs(3)
    np.save(names[-2], x)
    np.save(names[-1], y)
    want = model(torch.from_numpy(x), torch.from_numpy(y)).detach().numpy()
    got = anfir.run(anfir.compile(anf, args=[*params, x, y]), *params, x, y)
    close(got, want)
    for command, prefix in ((["run", anf, *names], ""), (["compile", anf, "--args", *names], "result: ")):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli_main(command) == 0
        assert prefix + format_value(got) in out.getvalue(), command

"""One graph whichever route a model comes in (issue 23).

A model exported with ``torch.export`` and imported by ``anfir.import_torch``, and
the same model written by ``torch.onnx.export`` and read by ``anfir.import_onnx``,
must become the same operations: both importers map softmax, log-softmax, layer,
group, batch and instance norms to the op library's ``nn`` / ``conv`` primitives
(the torch importer used to spell softmax and the native norms as 5-8 core ops).
After ``anfir.compile`` (the optimizer: inlining, folding, dead code) the set of
primitive OBJECTS the graphs use is compared, and each graph is run against
PyTorch; the torch routes are also differentiated against ``torch.autograd``.

``torch.onnx.export`` runs its TorchScript exporter (``dynamo=False``; the dynamo
one needs onnxscript) at opset 20, the first with ``Gelu``: at opset 17 it writes
GELU as its erf formula, a difference of the exporter, not of the importers.
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

import anfir  # noqa: E402
from anfir.ir.graph import FuncGraph  # noqa: E402
from anfir.ir.nodes import CNode, ValueNode  # noqa: E402
from anfir.ir.primitive import Primitive  # noqa: E402
from anfir.primitives import arith, conv, elementwise, nn, reduce, shaping, tensor  # noqa: E402

OPSET = 20


def primitives_of(graph: FuncGraph) -> set[Primitive]:
    """Every primitive called or passed in ``graph`` and the graphs it reaches."""
    found: set[Primitive] = set()
    seen: set[int] = set()
    stack = [graph]
    while stack:
        g = stack.pop()
        if id(g) in seen:
            continue
        seen.add(id(g))
        for node in g.nodes():
            for item in [node, *(node.inputs if isinstance(node, CNode) else ())]:
                if isinstance(item, ValueNode):
                    if isinstance(item.value, Primitive):
                        found.add(item.value)
                    elif isinstance(item.value, FuncGraph):
                        stack.append(item.value)
    return found


def attrs_of(graph: FuncGraph, prim: Primitive) -> list[tuple[tuple[str, Any], ...]]:
    """The attributes of every call of ``prim`` in ``graph`` (sorted): with the weights
    as parameters on one route and constants on the other, the calls' other inputs
    differ, but each call's attributes are the importer's to write."""
    return sorted((node.attrs.pairs() for node in graph.nodes()
                   if isinstance(node, CNode) and isinstance(node.inputs[0], ValueNode)
                   and node.inputs[0].value is prim), key=repr)


def _names(prims: set[Primitive]) -> list[str]:
    return sorted(p.name for p in prims)


def via_onnx(model: Any, x: Any) -> anfir.Module:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), buf, dynamo=False, input_names=["x"], output_names=["y"],
                          opset_version=OPSET)
    return anfir.import_onnx(onnx.load_from_string(buf.getvalue()))


def via_torch(model: Any, x: Any, decomposed: bool) -> anfir.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, (x,))
        # The user may lower the program to core ATen first (aten._softmax,
        # native_layer_norm, native_group_norm, _native_batch_norm_legit_no_training...).
        return anfir.import_torch(ep.run_decompositions() if decomposed else ep)


def _loss(mod: anfir.Module, cotangent: np.ndarray) -> FuncGraph:
    g = FuncGraph("loss", None)
    params = [g.add_parameter(p.name, None) for p in mod.entry.parameters]
    g.output = g.apply(tensor.sum_, g.apply(arith.mul, g.apply(mod.entry, *params), cotangent))
    return g


def check_torch_route(model: Any, x: Any, decomposed: bool) -> FuncGraph:
    """Import by torch.export, check value and every parameter's gradient against
    PyTorch, return the optimized graph."""
    mod = via_torch(model, x, decomposed)
    lifted = list(mod.params.values())
    xs = x.numpy()
    want = model(x)
    compiled = anfir.compile(mod, args=[*lifted, xs])
    np.testing.assert_allclose(anfir.run(compiled, *lifted, xs), want.detach().numpy(), rtol=1e-5, atol=1e-5)
    kinds = mod.metadata["inputs"]
    wrt = tuple(i for i, k in enumerate(kinds) if k.startswith("parameter "))
    targets = [kinds[i].split(" ", 1)[1] for i in wrt]
    named = dict(model.named_parameters())
    assert sorted(targets) == sorted(named)
    cot = np.random.default_rng(1).standard_normal(want.shape).astype(np.float32)
    grads = anfir.run(anfir.grad(_loss(mod, cot), wrt=wrt), *lifted, xs)
    refs = torch.autograd.grad((want * torch.from_numpy(cot)).sum(), [named[t] for t in targets])
    for target, got, ref in zip(targets, grads, refs):
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-6 * float(ref.abs().max()),
                                   err_msg=f"gradient of {target} (decomposed={decomposed})")
    return compiled


def check_onnx_route(model: Any, x: Any) -> FuncGraph:
    mod = via_onnx(model, x)
    xs = x.numpy()
    compiled = anfir.compile(mod, args=[xs])
    np.testing.assert_allclose(anfir.run(compiled, xs), model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    return compiled


class Block(torch.nn.Module):
    """A pre-norm transformer block: LayerNorm, softmax attention written by hand
    (two heads), a GELU MLP, residuals."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)
        self.act = torch.nn.GELU()

    def forward(self, x: Any) -> Any:
        b, t, d = x.shape
        h = self.heads
        q, k, v = (p.reshape(b, t, h, d // h).transpose(1, 2)
                   for p in self.qkv(self.ln1(x)).split(d, dim=-1))
        a = torch.softmax(q @ k.transpose(-2, -1) / (d // h) ** 0.5, dim=-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


def test_transformer_block_is_one_graph_by_either_route() -> None:
    torch.manual_seed(0)
    model = Block().eval()
    x = torch.randn(2, 5, 16)
    onnx_graph = check_onnx_route(model, x)
    from_onnx = primitives_of(onnx_graph)
    for decomposed in (False, True):
        torch_graph = check_torch_route(model, x, decomposed)
        from_torch = primitives_of(torch_graph)
        assert from_torch == from_onnx, (
            f"decomposed={decomposed}: only via torch {_names(from_torch - from_onnx)}, "
            f"only via ONNX {_names(from_onnx - from_torch)}")
        # The same attributes too: ONNX's epsilon (a float32, 9.99999975e-06) reads as
        # torch's 1e-05, the default, which the canonical form leaves out.
        for prim in (nn.layer_norm, nn.softmax, elementwise.gelu):
            assert attrs_of(torch_graph, prim) == attrs_of(onnx_graph, prim), prim.name
        assert attrs_of(onnx_graph, nn.layer_norm) == [(), ()]
    # The composites stay whole (a regression to the core-op spelling fails here too).
    assert {nn.softmax, nn.layer_norm, elementwise.gelu} <= from_onnx
    assert not {arith.exp, reduce.max_, reduce.logsumexp, elementwise.rsqrt} & from_onnx


class Norms(torch.nn.Module):
    """Convolution, then batch norm (affine and not; eval), group norm, instance
    norm, and a log-softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn, self.bn_plain = torch.nn.BatchNorm2d(4), torch.nn.BatchNorm2d(4, affine=False)
        self.gn = torch.nn.GroupNorm(2, 4)
        self.inorm = torch.nn.InstanceNorm2d(4, affine=True)

    def forward(self, x: Any) -> Any:
        y = self.conv(x)
        z = self.bn(y) + self.bn_plain(y) + self.gn(y) + self.inorm(y)
        return torch.log_softmax(z.flatten(1), dim=-1)


GROUP_NORM_VIA_ONNX = {nn.group_norm}
"""The ONNX exporter has no GroupNormalization below opset 21: it writes a group norm
as an InstanceNormalization of the groups (reshape, instance_norm, reshape, * scale
+ bias), all of which the model uses anyway; the torch route keeps ``group_norm``."""

INSTANCE_NORM_PRE_DECOMPOSED = {tensor.mean, arith.mul, elementwise.rsqrt, arith.sub, shaping.tile}
"""``run_decompositions`` by the user turns ``instance_norm`` into ``repeat`` and a
batch norm over the batch's own statistics (``_native_batch_norm_legit.no_stats``),
which both importers compose (ONNX's training-mode BatchNormalization too); anfir's
own import keeps ``instance_norm`` whole (it is in the importer's table)."""


def test_norms_map_to_the_same_primitives() -> None:
    torch.manual_seed(0)
    model = Norms().eval()
    with torch.no_grad():  # running statistics that are not the identity
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2.0)
        model.bn_plain.running_mean.uniform_(-1, 1)
    x = torch.randn(2, 3, 6, 6)
    onnx_graph = check_onnx_route(model, x)
    from_onnx = primitives_of(onnx_graph)
    assert {conv.batch_norm, nn.instance_norm, nn.log_softmax} <= from_onnx
    torch_graph = check_torch_route(model, x, decomposed=False)
    whole = primitives_of(torch_graph)
    assert whole - from_onnx == GROUP_NORM_VIA_ONNX and from_onnx <= whole
    assert {conv.batch_norm, nn.group_norm, nn.instance_norm, nn.log_softmax} <= whole
    # One spelling of the window attributes: ONNX's strides (1, 1), pads (1, 1, 1, 1)
    # and torch's stride [1, 1], padding [1, 1] are both `padding=1` (stride 1 the default).
    assert attrs_of(torch_graph, conv.conv) == attrs_of(onnx_graph, conv.conv) == [(("padding", 1),)]
    # (ONNX's route has one more instance_norm: the group norm's, see GROUP_NORM_VIA_ONNX.)
    for prim in (conv.batch_norm, nn.instance_norm):
        assert set(attrs_of(torch_graph, prim)) == set(attrs_of(onnx_graph, prim)) == {()}, prim.name
    lowered = primitives_of(check_torch_route(model, x, decomposed=True))
    assert lowered - from_onnx == GROUP_NORM_VIA_ONNX | INSTANCE_NORM_PRE_DECOMPOSED
    assert from_onnx - lowered == {nn.instance_norm}


def test_window_attributes_have_one_short_form() -> None:
    from anfir.interop import attributes as w
    assert w.per_axis((1, 1), 2) == 1 and w.per_axis([2, 3], 2) == (2, 3) and w.per_axis(4, 3) == 4
    assert w.per_axis([5], 2) == 5
    assert w.padding((1, 1, 1, 1), 2) == 1          # begins == ends, all equal
    assert w.padding((1, 2, 1, 2), 2) == (1, 2)     # begins == ends, per axis
    assert w.padding((1, 0, 0, 0), 2) == (1, 0, 0, 0)
    assert w.padding((1, 1), 1) == 1 and w.padding((0, 1), 1) == (0, 1)  # 1-d: begin, end
    assert w.padding("same", 2) == "same" and w.padding(3, 2) == 3
    assert w.window({"stride": (2, 2), "kernel": (3, 3), "padding": (0, 0, 0, 0), "groups": 2,
                     "ceil_mode": True}, 2) == {"stride": 2, "kernel": 3, "padding": 0, "groups": 2,
                                                "ceil_mode": True}
    with pytest.raises(ValueError):
        w.per_axis((1, 2, 3), 2)
    with pytest.raises(ValueError):
        w.padding((1, 2, 3), 2)
    # The shortest decimal of the float32 an ONNX file stores.
    assert w.float32_attr(float(np.float32(1e-5))) == 1e-5
    assert w.float32_attr(float(np.float32(0.1))) == 0.1
    assert np.float32(w.float32_attr(0.123456789)) == np.float32(0.123456789)
    # The short form means the same: the op library computes the same convolution.
    x = np.random.default_rng(0).standard_normal((1, 2, 5, 6)).astype(np.float32)
    k = np.random.default_rng(1).standard_normal((3, 2, 3, 3)).astype(np.float32)
    long = conv.conv.impl(x, k, stride=(1, 2), padding=(1, 2, 1, 2), dilation=(1, 1))
    short = conv.conv.impl(x, k, **w.window({"stride": (1, 2), "padding": (1, 2, 1, 2),
                                             "dilation": (1, 1)}, 2))
    np.testing.assert_array_equal(long, short)

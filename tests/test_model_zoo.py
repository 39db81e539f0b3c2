"""A zoo of models nobody on the project wrote, through every documented path
(issue 24): tiny random Hugging Face ``transformers`` configurations (decoder
LMs, encoders, an encoder-decoder, vision, audio) and ``torch.nn`` recurrent and
attention layers (tests/zoo_models.py), each

1. exported with ``torch.export`` (dynamic batch; dynamic sequence for text),
   imported with ``anfir.import_torch`` and run at the example size and at
   another batch size (and sequence length), against eager PyTorch;
2. differentiated: a loss ``sum(out * r)`` (r fixed random) by ``anfir.grad``
   with respect to every parameter, against ``torch.autograd.grad`` at rtol
   1e-4 (absolute slack 1e-6 of the largest gradient, for the ones that are
   exactly zero up to rounding, such as attention key biases);
3. exported with ``torch.onnx.export``, its weights written to
   ``MODEL.onnx.data`` beside it by onnx's own writer, read back by
   ``anfir.import_onnx(path)`` and run at the other size;
4. written by ``anfir.export_onnx`` and run by onnxruntime;
5. lowered by ``anfir.to_jax`` and run under ``jax.jit``.

``torch.onnx.export`` runs its TorchScript exporter (``dynamo=False``): its
default exporter needs ``onnxscript``, which the test environment does not
install.  The decoder LMs are called with an explicit attention mask (as a
tokenizer's batch has), because the TorchScript exporter cannot write the
``aten::diff`` that transformers' packed-sequence check uses without one.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
jax = pytest.importorskip("jax")

import anfir  # noqa: E402
from anfir.ir.graph import FuncGraph  # noqa: E402
from anfir.primitives import registry  # noqa: E402

from zoo_models import TEXT, ZOO  # noqa: E402

ONNX_AT_EXAMPLE_SIZE = {"lstm_gru_attention"}
"""Models whose ONNX file is exported without dynamic axes: the TorchScript
exporter writes MultiheadAttention's reshapes from runtime shapes whose rank
ONNX's shape inference loses with a dynamic batch."""


def _close(got: Any, want: Any, what: str, rtol: float = 1e-4, scale: float = 1e-5) -> None:
    want = np.asarray(want)
    np.testing.assert_allclose(np.asarray(got), want, rtol=rtol,
                               atol=scale * float(np.max(np.abs(want)) + 1e-30), err_msg=what)


def _numpy(inputs: list[Any]) -> list[np.ndarray]:
    return [x.numpy() for x in inputs]


def _loss(mod: anfir.Module, cotangent: np.ndarray) -> FuncGraph:
    g = FuncGraph("loss", None)
    params = [g.add_parameter(p.name, None) for p in mod.entry.parameters]
    out = g.apply(registry.lookup("mul"), g.apply(mod.entry, *params), cotangent)
    g.output = g.apply(registry.lookup("sum"), out)
    return g


@pytest.mark.parametrize("name", list(ZOO))
def test_model_through_every_path(name: str, tmp_path: Any) -> None:
    module, example, other, dynamic = ZOO[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(module, tuple(example), dynamic_shapes=dynamic)
    mod = anfir.import_torch(ep)
    lifted = list(mod.params.values())
    if name in TEXT:
        assert example[0].shape[1] != other[0].shape[1]
    assert example[0].shape[0] != other[0].shape[0]

    # 1. forward at two sizes
    with torch.no_grad():
        want = {id(ins): module(*ins).numpy() for ins in (example, other)}
    for ins in (example, other):
        _close(anfir.run(mod.entry, *lifted, *_numpy(ins)), want[id(ins)], f"{name} forward")

    # 2. every parameter's gradient
    kinds = mod.metadata["inputs"]
    wrt = tuple(i for i, k in enumerate(kinds) if k.startswith("parameter "))
    targets = [kinds[i].split(" ", 1)[1] for i in wrt]
    named = dict(module.named_parameters())
    assert sorted(targets) == sorted(named)  # one per tensor: tied weights appear once
    cot = np.random.default_rng(0).standard_normal(want[id(other)].shape).astype(np.float32)
    grads = anfir.run(anfir.grad(_loss(mod, cot), wrt=wrt), *lifted, *_numpy(other))
    trainable = [t for t in targets if named[t].requires_grad]
    out = (module(*other) * torch.from_numpy(cot)).sum()
    found = torch.autograd.grad(out, [named[t] for t in trainable], allow_unused=True)
    # A parameter the output does not use (BERT's pooler) has gradient zero.
    refs = {t: np.zeros(tuple(named[t].shape), np.float32) if r is None else r.numpy()
            for t, r in zip(trainable, found)}
    largest = max(float(np.abs(r).max()) for r in refs.values())
    for target, g in zip(targets, grads):
        if target in refs:
            np.testing.assert_allclose(g, refs[target], rtol=1e-4, atol=1e-6 * largest,
                                       err_msg=f"{name}: gradient of {target}")

    # 3. torch.onnx.export -> MODEL.onnx + MODEL.onnx.data -> anfir.import_onnx(path)
    path = os.path.join(str(tmp_path), f"{name}.onnx")
    static = name in ONNX_AT_EXAMPLE_SIZE
    axes = None if static else {"x": {0: "batch", 1: "seq"} if name in TEXT else {0: "batch"}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, tuple(example), path, dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes=axes, opset_version=17)
    onnx.save_model(onnx.load(path), path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{name}.onnx.data", size_threshold=0)
    assert os.path.getsize(path + ".data") > 0
    from_onnx = anfir.import_onnx(path)
    ins = example if static else other
    got = anfir.run(from_onnx.entry, *_numpy(ins))
    _close(got[0] if isinstance(got, tuple) else got, want[id(ins)], f"{name} via torch.onnx.export")

    # 4. anfir.export_onnx -> onnxruntime
    args = [*lifted, *_numpy(other)]
    proto = anfir.export_onnx(mod, args=args)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: a for i, a in zip(session.get_inputs(), args)}
    _close(session.run(None, feeds)[0], want[id(other)], f"{name} via anfir.export_onnx")

    # 5. anfir.to_jax -> jax.jit
    _close(jax.jit(anfir.to_jax(mod))(*args), want[id(other)], f"{name} via to_jax")

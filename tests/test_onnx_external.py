"""ONNX models whose weights live in ``MODEL.onnx.data`` beside them (issue 24).

The data files are written by onnx's own ``save_model(save_as_external_data=True)``
(the layout ``torch.onnx.export`` writes by default); the imported model must
compute what onnxruntime computes from the same files, and every unsafe or
broken reference must be a clear ``AnfirError`` naming the tensor — never a
read outside the model's directory, of a device, or of a short file.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import anfir  # noqa: E402
from anfir.cli import main as cli_main  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _mlp() -> object:
    """x @ W1 + b1 -> relu -> @ W2 + b2, with a dynamic batch."""
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("W1", (4, 16)), ("b1", (16,)), ("W2", (16, 3)), ("b2", (3,)))]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "W2"], ["h3"]),
             helper.make_node("Add", ["h3", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _save(folder: str, model: object = None) -> str:
    path = os.path.join(folder, "mlp.onnx")
    onnx.save_model(model or _mlp(), path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="mlp.onnx.data", size_threshold=0)
    return path


def _error(path: str) -> str:
    with pytest.raises(anfir.AnfirError) as info:
        anfir.import_onnx(path)
    return str(info.value)


def test_external_data_is_read_beside_the_model(tmp_path: object) -> None:
    path = _save(str(tmp_path))
    assert os.path.getsize(path + ".data") > 0
    assert not any(init.raw_data for init in onnx.load(path, load_external_data=False).graph.initializer)
    mod = anfir.import_onnx(path)
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(anfir.run(mod.entry, x), want, rtol=1e-5, atol=1e-6)
    # params_as_inputs reads the same bytes, as parameters.
    lifted = anfir.import_onnx(path, params_as_inputs=True)
    assert list(lifted.params) == ["W1", "b1", "W2", "b2"]
    np.testing.assert_array_equal(lifted.params["W1"], numpy_helper.to_array(
        onnx.load(path).graph.initializer[0]))


def test_the_cli_imports_a_model_with_external_data(tmp_path: object, capsys: object) -> None:
    path = _save(str(tmp_path))
    assert cli_main(["import", path]) == 0
    assert "def mlp(" in capsys.readouterr().out  # type: ignore[attr-defined]


def _relocate(path: str, location: str) -> None:
    """Point every external tensor of the model at ``location``."""
    model = onnx.load(path, load_external_data=False)
    for init in model.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = location
    with open(path, "wb") as f:
        f.write(model.SerializeToString())


def test_a_location_outside_the_models_folder_is_refused(tmp_path: object) -> None:
    folder = os.path.join(str(tmp_path), "model")
    os.mkdir(folder)
    path = _save(folder)
    os.rename(path + ".data", os.path.join(str(tmp_path), "secret.data"))
    _relocate(path, "../secret.data")
    message = _error(path)
    assert "leads outside the model's directory" in message and "'W1'" in message
    _relocate(path, os.path.join(str(tmp_path), "secret.data"))
    assert "absolute path" in _error(path)
    # A symbolic link inside the folder that points out of it is refused too.
    os.symlink(os.path.join(str(tmp_path), "secret.data"), os.path.join(folder, "link.data"))
    _relocate(path, "link.data")
    assert "leads outside the model's directory" in _error(path)


def test_a_truncated_data_file_is_an_error_naming_the_sizes(tmp_path: object) -> None:
    path = _save(str(tmp_path))
    size = os.path.getsize(path + ".data")
    with open(path + ".data", "r+b") as f:
        f.truncate(size - 8)
    message = _error(path)
    assert "truncated" in message and "'b2'" in message and f"the file has {size - 8:,}" in message


def test_missing_files_devices_and_wrong_lengths_are_errors(tmp_path: object) -> None:
    path = _save(str(tmp_path))
    model = onnx.load(path, load_external_data=False)
    # A length that disagrees with the tensor's shape.
    for entry in model.graph.initializer[1].external_data:
        if entry.key == "length":
            entry.value = "4"
    with open(path, "wb") as f:
        f.write(model.SerializeToString())
    assert "length 4 bytes, but its shape and type make 64" in _error(path)
    _relocate(path, "missing.data")
    assert "cannot read its external data 'missing.data'" in _error(path)
    os.mkdir(os.path.join(str(tmp_path), "folder.data"))
    _relocate(path, "folder.data")
    assert "not a regular file" in _error(path)
    if hasattr(os, "mkfifo"):
        os.mkfifo(os.path.join(str(tmp_path), "pipe.data"))
        _relocate(path, "pipe.data")
        assert "not a regular file" in _error(path)  # refused before opening: no hang


def test_a_model_proto_with_unloaded_external_data_says_how_to_load_it(tmp_path: object) -> None:
    path = _save(str(tmp_path))
    with pytest.raises(anfir.AnfirError, match="import the model by its path"):
        anfir.import_onnx(onnx.load(path, load_external_data=False))
    # Loaded by onnx with its data, the ModelProto imports as usual.
    mod = anfir.import_onnx(onnx.load(path))
    assert anfir.run(mod.entry, np.ones((2, 4), np.float32)).shape == (2, 3)


def test_an_unreadable_model_path_is_an_anfir_error(tmp_path: object) -> None:
    with pytest.raises(anfir.AnfirError, match="cannot read"):
        anfir.import_onnx(os.path.join(str(tmp_path), "absent.onnx"))


# -- writing: anfir.save_onnx / anfir export --external-data ---------------------------------------
def _wide() -> object:
    """An MLP whose first two weights (2 and 4 KiB) go to the data file; its last (192 B) stays inline."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
             for n, s in (("W1", (8, 64)), ("W2", (64, 16)), ("W3", (16, 3)))]
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h0"]), helper.make_node("Relu", ["h0"], ["h1"]),
             helper.make_node("MatMul", ["h1", "W2"], ["h2"]), helper.make_node("Tanh", ["h2"], ["h3"]),
             helper.make_node("MatMul", ["h3", "W3"], ["y"])]
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 3])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _external(model: object) -> list[object]:
    return [t for t in model.graph.initializer  # type: ignore[attr-defined]
            if t.data_location == TensorProto.EXTERNAL]


def test_save_onnx_writes_the_weights_beside_the_model(tmp_path: object) -> None:
    mod = anfir.import_onnx(_wide())
    exported = anfir.export_onnx(mod)
    path = os.path.join(str(tmp_path), "wide.onnx")
    written = anfir.save_onnx(exported, path, external_data=True)
    external = _external(written)
    sizes = sorted(int(dict((e.key, e.value) for e in t.external_data)["length"]) for t in external)
    assert sizes == [2048, 4096], sizes  # W1 and W2; W3 (192 bytes) stays in the .onnx
    assert all(int(dict((e.key, e.value) for e in t.external_data)["offset"]) % 64 == 0 for t in external)
    assert not _external(exported), "the exported model itself is not changed"
    assert os.path.getsize(path + ".data") >= 6144 and os.path.getsize(path) < 2048
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    want = anfir.run(mod.entry, x)
    session = ort.InferenceSession(path)  # onnxruntime reads the data file by the model's path
    np.testing.assert_allclose(session.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(anfir.run(anfir.import_onnx(path).entry, x), want, rtol=1e-6)
    loaded = onnx.load(path)
    assert all(t.data_location != TensorProto.EXTERNAL for t in loaded.graph.initializer)


def test_saving_twice_writes_the_same_bytes_not_appended(tmp_path: object) -> None:
    exported = anfir.export_onnx(anfir.import_onnx(_wide()))
    path = os.path.join(str(tmp_path), "wide.onnx")
    anfir.save_onnx(exported, path, external_data=True)
    first = (open(path, "rb").read(), open(path + ".data", "rb").read())
    anfir.save_onnx(exported, path, external_data=True)
    assert (open(path, "rb").read(), open(path + ".data", "rb").read()) == first


def test_external_data_is_chosen_past_protobufs_limit(tmp_path: object,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from anfir.interop.onnx import external as onnx_external

    exported = anfir.export_onnx(anfir.import_onnx(_wide()))
    path = os.path.join(str(tmp_path), "wide.onnx")
    anfir.save_onnx(exported, path)  # small: one file
    assert not os.path.exists(path + ".data") and not _external(onnx.load(path, load_external_data=False))
    monkeypatch.setattr(onnx_external, "PROTOBUF_LIMIT", 2000)  # as if the model passed 2 GB
    written = anfir.save_onnx(exported, path)
    assert _external(written) and os.path.exists(path + ".data")
    with pytest.raises(anfir.AnfirError, match="protobuf's limit"):
        anfir.save_onnx(exported, path, external_data=False)


def test_the_cli_exports_with_external_data(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    folder = str(tmp_path)
    source = os.path.join(folder, "wide.anf")
    with open(source, "w") as handle:
        handle.write(anfir.to_text(anfir.import_onnx(_wide())))
    out = os.path.join(folder, "out.onnx")
    assert cli_main(["export", source, "-o", out, "--external-data"]) == 0
    assert "weights in" in capsys.readouterr().out
    x = np.random.default_rng(1).standard_normal((2, 8)).astype(np.float32)
    session = ort.InferenceSession(out)
    want = anfir.run(anfir.import_onnx(_wide()).entry, x)
    np.testing.assert_allclose(session.run(None, {session.get_inputs()[0].name: x})[0], want, rtol=1e-5, atol=1e-5)
    assert cli_main(["export", source, "-o", os.path.join(folder, "m.mlpackage"), "--to", "coreml",
                     "--external-data"]) == 2
    assert "--external-data is for ONNX" in capsys.readouterr().err

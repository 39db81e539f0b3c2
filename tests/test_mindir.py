"""MindSpore ``.mindir`` files: MindSpore's own exports imported and run, the
gradient of an imported cell against MindSpore's, anfir's exports read back,
and malformed files refused with located errors.

The fixtures are made by ``tests/mindir_fixtures/make_fixtures.py`` in
MindSpore's own venv (each ``NAME.npz`` holds the inputs and MindSpore's
results); nothing here needs MindSpore (the live check is tests_mindspore/).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import anfir
from anfir.errors import AnfirError
from anfir.interop.mindir import MindirError, import_mindir

FIXTURES = Path(__file__).resolve().parent / "mindir_fixtures"
CASES = ["dense_relu", "conv_net", "control_flow", "control_flow_else", "mlp_loss", "mlp_grad",
         "while_loss", "while_grad"]


def fixture(name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(inputs, MindSpore's outputs) of a fixture."""
    data = np.load(FIXTURES / f"{name}.npz")
    count_in = sum(1 for k in data.files if k.startswith("in"))
    count_out = sum(1 for k in data.files if k.startswith("out"))
    return [data[f"in{k}"] for k in range(count_in)], [data[f"out{k}"] for k in range(count_out)]


def assert_close(got: Any, want: np.ndarray, where: str) -> None:
    """1e-6 relative for f32, 1e-12 for f64 (the issue's bar), same dtype and shape."""
    got = np.asarray(got)
    assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
    rtol = 1e-6 if want.dtype == np.float32 else 1e-12
    scale = max(float(np.max(np.abs(want))), 1e-30) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=where)


def outputs(value: Any) -> list[Any]:
    return list(value) if isinstance(value, tuple) else [value]


@pytest.mark.parametrize("name", CASES)
def test_mindspore_export_imports_and_matches(name: str) -> None:
    inputs, want = fixture(name)
    mod = import_mindir(FIXTURES / f"{name}.mindir")
    got = outputs(anfir.run(mod.entry, *inputs))
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, f"{name} output {k}")


@pytest.mark.parametrize("name", ["dense_relu", "conv_net", "control_flow"])
def test_weights_as_parameters(name: str) -> None:
    inputs, want = fixture(name)
    mod = anfir.import_mindir(str(FIXTURES / f"{name}.mindir"), params_as_inputs=True)
    assert mod.params, "the cell has weights"
    names = [p.name for p in mod.entry.parameters]
    assert names[:len(mod.params)] == list(mod.params)
    got = outputs(anfir.run(mod.entry, *mod.params.values(), *inputs))
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, f"{name} output {k}")


def test_the_while_header_is_a_tail_recursive_graph() -> None:
    mod = import_mindir(FIXTURES / "while_loss.mindir")
    headers = [g for g in mod.graphs.values() if g.flags["meta"].get("is_while_header")]
    assert len(headers) == 1
    # the header calls itself through its body graph: a loop, run for several trip counts
    x = np.array([0.3, -0.8, 1.1])
    for n in (0, 1, 7):
        z = x.copy()
        for _ in range(n):
            z = np.sin(z) * x + 0.5
        assert_close(anfir.run(mod.entry, x, np.array(n)), np.sum(z * z), f"n={n}")


@pytest.mark.parametrize("loss, grad, wrt", [
    ("mlp_loss", "mlp_grad", (0, 1, 2, 3, 4)),
    ("while_loss", "while_grad", 0),
])
def test_anfir_grad_of_an_imported_cell_matches_mindspores_gradient(loss: str, grad: str, wrt: Any) -> None:
    inputs, _ = fixture(loss)
    _, want = fixture(grad)
    mod = import_mindir(FIXTURES / f"{loss}.mindir")
    got = outputs(anfir.run(anfir.grad(mod.entry, wrt=wrt), *inputs))
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, f"d{loss}/d{k}")


def test_metadata_is_kept() -> None:
    mod = import_mindir(FIXTURES / "dense_relu.mindir")
    assert mod.metadata["producer_name"] == "MindSpore"
    assert mod.metadata["model_version"] == "2.10.0"
    assert mod.metadata["format"] == "mindir"
    ops = {meta["op_type"].split("::")[-1].split(":")[0] for meta in mod.entry.node_meta.values()}
    assert {"MatMul", "BiasAdd", "ReLU"} <= ops
    # the ANF text carries it and parses back to the same computation
    inputs, want = fixture("dense_relu")
    again = anfir.parse(anfir.to_text(mod))
    assert_close(anfir.run(again.entry, *inputs), want[0], "re-parsed")


def test_import_from_bytes_and_the_command_line(tmp_path: Path) -> None:
    from cli_harness import run_in_process

    data = (FIXTURES / "control_flow.mindir").read_bytes()
    inputs, want = fixture("control_flow")
    assert_close(anfir.run(import_mindir(data).entry, *inputs), want[0], "from bytes")
    status, out, err = run_in_process(["import", str(FIXTURES / "control_flow.mindir")], tmp_path)
    assert status == 0, err
    assert "switch(" in out and "partial(" in out

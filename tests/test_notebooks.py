"""The tutorial notebooks run from top to bottom and draw at least one graph each.

Each notebook is executed on a temporary copy with ``nbclient``, on a
``python3`` kernel that runs this test's own interpreter (a kernelspec written
into a temporary ``JUPYTER_PATH``, so a differently configured system-wide
``python3`` kernel cannot be picked up). The repository root is put on the
kernel's ``PYTHONPATH`` so ``import anfir`` works without installing.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
NAMES = ["01_writing_ir_by_hand.ipynb", "02_differentiating.ipynb",
         "03_inspecting_the_pipeline.ipynb"]
TIMEOUT = 300


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment variables that make ``python3`` this interpreter's ipykernel."""
    pytest.importorskip("ipykernel")
    data = tmp_path_factory.mktemp("jupyter")
    spec_dir = data / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (anfir tests)", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    path = os.environ.get("PYTHONPATH", "")
    return {"JUPYTER_PATH": str(data),
            "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""),
            "MPLBACKEND": "Agg"}


def test_the_generator_matches_the_committed_notebooks() -> None:
    """The .ipynb files are what make_notebooks.py writes (outputs cleared)."""
    sys.path.insert(0, str(NOTEBOOKS))
    try:
        import make_notebooks
    finally:
        sys.path.remove(str(NOTEBOOKS))
    assert sorted(make_notebooks.NOTEBOOKS) == NAMES
    for name, cells in make_notebooks.NOTEBOOKS.items():
        committed = nbformat.read(NOTEBOOKS / name, as_version=4)
        generated = make_notebooks.build(cells)
        assert [c.source for c in committed.cells] == [c.source for c in generated.cells], name
        for cell in committed.cells:
            if cell.cell_type == "code":
                assert cell.outputs == [] and cell.execution_count is None, \
                    f"{name}: commit notebooks with outputs cleared"


def _outputs(notebook: object) -> list[dict]:
    return [out for cell in notebook.cells if cell.cell_type == "code"  # type: ignore[attr-defined]
            for out in cell.get("outputs", [])]


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_and_draws_a_graph(name: str, tmp_path: Path, kernel_env: dict[str, str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in kernel_env.items():
        monkeypatch.setenv(key, value)
    copy = tmp_path / name
    shutil.copy(NOTEBOOKS / name, copy)
    notebook = nbformat.read(copy, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as error:
        pytest.fail(f"{name}: a cell failed:\n{error}")
    outputs = _outputs(notebook)
    errors = [out for out in outputs if out.get("output_type") == "error"]
    assert not errors, f"{name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    svgs = [out for out in outputs if "image/svg+xml" in out.get("data", {})]
    assert svgs, f"{name}: no rendered graph (image/svg+xml output)"
    assert all("<svg" in "".join(out["data"]["image/svg+xml"]) for out in svgs)

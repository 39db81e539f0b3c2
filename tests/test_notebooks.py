"""The tutorial notebooks: committed executed, and they still run from top to bottom.

``notebooks/make_notebooks.py`` writes them, executed where Graphviz's ``dot``
is installed so that a reader of the repository sees the results and the
pictures; the first two tests check the committed files (no kernel needed).
The last one executes each notebook again on a temporary copy with
``nbclient``, on a ``python3`` kernel that runs this test's own interpreter
(a kernelspec written into a temporary ``JUPYTER_PATH``, so a differently
configured system-wide ``python3`` kernel cannot be picked up; the repository
root is put on the kernel's ``PYTHONPATH`` so ``import anfir`` works without
installing).  Every cell that shows a picture in the committed notebook must
draw it again, or, where ``dot`` is not installed, show the program as text
instead (that run then reports a skip for the pictures, after everything else
has been checked).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
NAMES = ["01_writing_ir_by_hand.ipynb", "02_differentiating.ipynb",
         "03_inspecting_the_pipeline.ipynb", "04_importing_onnx.ipynb",
         "05_models_in_anf.ipynb", "06_importing_torch.ipynb", "07_importing_gpt2.ipynb",
         "08_batching.ipynb", "09_training_memory.ipynb"]
REQUIRES = {"04_importing_onnx.ipynb": ("onnx", "anfir[onnx]"),
            "06_importing_torch.ipynb": ("torch", "anfir[torch]"),
            "07_importing_gpt2.ipynb": ("transformers", "anfir[dev]"),
            "08_batching.ipynb": ("jax", "anfir[jax]"),
            "09_training_memory.ipynb": ("matplotlib", "anfir[dev]")}
"""The optional package a notebook imports, and the extra that installs it: without
it the notebook cannot run (its committed form is still checked)."""
SVG = "image/svg+xml"


def _generator():  # notebooks/make_notebooks.py, imported as a module
    sys.path.insert(0, str(NOTEBOOKS))
    try:
        import make_notebooks
    finally:
        sys.path.remove(str(NOTEBOOKS))
    return make_notebooks


make_notebooks = _generator()


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment variables that make ``python3`` this interpreter's ipykernel."""
    pytest.importorskip("ipykernel")
    return make_notebooks.kernel_environment(tmp_path_factory.mktemp("jupyter"))


def _committed(name: str) -> Any:
    return nbformat.read(NOTEBOOKS / name, as_version=4)


def _text(value: object) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _picture_cells(notebook: Any) -> list[int]:
    """Indices of the cells that show an SVG picture."""
    return [index for index, cell in enumerate(notebook.cells)
            if any(SVG in out.get("data", {}) for out in cell.get("outputs", []))]


def test_the_generator_matches_the_committed_notebooks() -> None:
    """The .ipynb files have the cells and metadata make_notebooks.py writes."""
    assert sorted(make_notebooks.NOTEBOOKS) == NAMES
    for name, cells in make_notebooks.NOTEBOOKS.items():
        committed = _committed(name)
        generated = make_notebooks.build(cells)
        assert [c.source for c in committed.cells] == [c.source for c in generated.cells], \
            f"{name}: run .venv/bin/python notebooks/make_notebooks.py"
        assert [c.id for c in committed.cells] == [c.id for c in generated.cells], name
        assert committed.metadata == generated.metadata, name


@pytest.mark.parametrize("name", NAMES)
def test_the_committed_notebook_is_executed_and_machine_independent(name: str) -> None:
    """Committed with outputs (pictures included) and nothing that varies between runs."""
    raw = (NOTEBOOKS / name).read_text(encoding="utf-8")
    committed = nbformat.reads(raw, as_version=4)
    kinds = [kind for kind, _ in make_notebooks.NOTEBOOKS[name] if kind != "md"]
    code = [cell for cell in committed.cells if cell.cell_type == "code"]
    # Executed in order on one kernel: counts 1, 2, 3..., no errors.
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1)), \
        f"{name}: commit it executed (run notebooks/make_notebooks.py)"
    assert sum(1 for cell in code if cell.outputs) >= len(code) // 2, name
    for cell, kind in zip(code, kinds):
        assert all(out.output_type != "error" for out in cell.outputs), (name, cell.id)
        if kind == "py-varies":  # timings: their output is not committed
            assert cell.outputs == [], (name, cell.id)
    pictures = _picture_cells(committed)
    assert pictures, f"{name}: no picture (generate it where Graphviz's dot is installed)"
    as_text = [cell.id for cell in code for out in cell.outputs
               if make_notebooks.shows_program_text(out)]
    assert not as_text, f"{name}: graphs shown as text, not drawn, in {as_text}"
    assert all("<svg" in _text(out["data"][SVG]) for i in pictures
               for out in committed.cells[i].outputs if SVG in out.get("data", {}))
    # Nothing of the machine or the moment it ran on: no absolute paths, no
    # object addresses, no timestamps or execution metadata.
    texts = [_text(out.get("text", "")) for cell in code for out in cell.outputs]
    texts += [_text(value) for cell in code for out in cell.outputs
              for mime, value in out.get("data", {}).items() if mime != "image/png"]
    for text in texts:
        for bad in (str(ROOT), "/work/", "/tmp/", "/home/", "/Users/", "site-packages"):
            assert bad not in text, f"{name}: a machine path in an output: {text[:200]!r}"
        assert not re.search(r"\b0x[0-9a-fA-F]{6,}\b", text), f"{name}: an address: {text[:200]!r}"
    assert all(cell.metadata == {} for cell in committed.cells), f"{name}: cell metadata"
    assert not re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d", raw), f"{name}: a timestamp"
    assert not make_notebooks.machine_specific(committed), name


@pytest.mark.needs_dot
@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_and_draws_a_graph(name: str, tmp_path: Path, kernel_env: dict[str, str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    if name in REQUIRES:
        module, extra = REQUIRES[name]
        pytest.importorskip(module, reason=f"{name} imports {module} (pip install \"{extra}\")")
    for key, value in kernel_env.items():
        monkeypatch.setenv(key, value)
    copy = tmp_path / name
    shutil.copy(NOTEBOOKS / name, copy)
    notebook = nbformat.read(copy, as_version=4)
    try:
        make_notebooks.execute(notebook, tmp_path)  # clears the committed outputs first
    except nbclient.exceptions.CellExecutionError as error:
        pytest.fail(f"{name}: a cell failed:\n{error}")
    outputs = [out for cell in notebook.cells for out in cell.get("outputs", [])]
    errors = [out for out in outputs if out.get("output_type") == "error"]
    assert not errors, f"{name}: {errors[0].get('ename')}: {errors[0].get('evalue')}"
    pictures = _picture_cells(_committed(name))
    assert pictures, f"{name}: the committed notebook shows no picture"
    have_dot = shutil.which("dot") is not None
    if have_dot:  # every graph displayed is drawn, not only those of the committed pictures
        as_text = [cell.id for cell in notebook.cells for out in cell.get("outputs", [])
                   if make_notebooks.shows_program_text(out)]
        assert not as_text, f"{name}: graphs shown as text although dot is installed: {as_text}"
    for index in pictures:
        cell = notebook.cells[index]
        svgs = [_text(out["data"][SVG]) for out in cell.outputs if SVG in out.get("data", {})]
        if have_dot:
            assert svgs and all("<svg" in svg for svg in svgs), \
                f"{name}: {cell.id} drew no picture:\n{cell.source}"
            continue
        # Without dot: no picture, and the program as ANF text in its place.
        assert not svgs, f"{name}: {cell.id} has a picture without Graphviz's dot"
        assert any(make_notebooks.shows_program_text(out) for out in cell.outputs), \
            f"{name}: {cell.id} shows neither a picture nor the program's text: {cell.outputs}"
    if not have_dot:
        pytest.skip(f"Graphviz's dot is not installed (apt-get install graphviz): {name} ran "
                    f"and showed the text form in place of {len(pictures)} picture(s)")

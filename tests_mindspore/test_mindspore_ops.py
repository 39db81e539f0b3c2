"""Live check: the op library's operators anfir writes as MindIR (tests/mindir_op_cases.py,
round-tripped by tests/test_mindir_ops.py) run in MindSpore's own runtime with anfir's
numbers — one MindSpore subprocess per family of operators."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import anfir  # noqa: E402
from mindir_op_cases import CASES, SOURCE  # noqa: E402
from test_mindspore_live import run_in_mindspore  # noqa: E402


def same(want: Any, got: list[np.ndarray], where: str) -> None:
    """MindSpore's results equal anfir's: dtype, shape, the same nan/inf places, the finite
    values within 1e-12 (the live module's ``compare`` scales its tolerance by the largest
    magnitude, which an inf makes infinite)."""
    items = list(want) if isinstance(want, tuple) else [want]
    assert len(items) == len(got), where
    for k, (a, b) in enumerate(zip(items, got)):
        a = np.asarray(a)
        assert a.shape == b.shape and a.dtype == b.dtype, f"{where} result {k}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        if a.dtype.kind != "f":
            np.testing.assert_array_equal(b, a, err_msg=f"{where} result {k}")
            continue
        finite = np.isfinite(a)
        np.testing.assert_array_equal(np.where(finite, 0.0, b), np.where(finite, 0.0, a), err_msg=f"{where} result {k}")
        np.testing.assert_allclose(b[finite], a[finite], rtol=1e-12, atol=1e-12, err_msg=f"{where} result {k}")


@pytest.mark.parametrize("entry", list(CASES))
def test_each_operator_family_runs_in_mindspore(entry: str, tmp_path: Path) -> None:
    module: Any = anfir.parse(SOURCE)
    args = CASES[entry]
    data = anfir.export_mindir(module, entry=entry, args=list(args))
    same(anfir.run(module[entry], *args), run_in_mindspore(tmp_path, data, args), entry)

"""Live check: the op library's operators anfir writes as MindIR (tests/mindir_op_cases.py,
round-tripped by tests/test_mindir_ops.py) run in MindSpore's own runtime with anfir's
numbers — one MindSpore subprocess per family of operators."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import anfir  # noqa: E402
from mindir_op_cases import CASES, SOURCE  # noqa: E402
from test_mindspore_live import compare, run_in_mindspore  # noqa: E402


@pytest.mark.parametrize("entry", list(CASES))
def test_each_operator_family_runs_in_mindspore(entry: str, tmp_path: Path) -> None:
    module: Any = anfir.parse(SOURCE)
    args = CASES[entry]
    data = anfir.export_mindir(module, entry=entry, args=list(args))
    compare(anfir.run(module[entry], *args), run_in_mindspore(tmp_path, data, args), entry)

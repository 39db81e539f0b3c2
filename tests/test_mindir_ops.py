"""The op library's operators without a MindIR rule before (reductions, elementwise and
integer ops, argmax/argmin, cumsum...): each exports to MindIR, imports back and computes
anfir's own numbers, edge cases included (tests/mindir_op_cases.py).  That MindSpore's
runtime computes them too is tests_mindspore/test_mindspore_ops.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))

import anfir  # noqa: E402
from mindir_op_cases import CASES, SOURCE  # noqa: E402


def leaves(value: Any) -> list[np.ndarray]:
    """The non-tuple items of a nested value, in order."""
    out, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            stack.extend(reversed(item))
        else:
            out.append(np.asarray(item))
    return out


@pytest.fixture(scope="module")
def module() -> Any:
    return anfir.parse(SOURCE)


@pytest.mark.parametrize("entry", list(CASES))
def test_each_operator_round_trips_with_anfirs_numbers(module: Any, entry: str) -> None:
    args = CASES[entry]
    back = anfir.import_mindir(anfir.export_mindir(module, entry=entry, args=list(args)))
    want, got = leaves(anfir.run(module[entry], *args)), leaves(anfir.run(back.entry, *args))
    assert len(want) == len(got)
    for k, (a, b) in enumerate(zip(want, got)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{entry} result {k}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12, equal_nan=True, err_msg=f"{entry} result {k}")

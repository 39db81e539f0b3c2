"""Regressions found by auditing the compile pipeline against issue 3 (by running it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

import anfir
from anfir.abstract.values import AScalar
from anfir.passes.pipeline import PHASES, compile_program
from anfir.passes.resolve import resolve_module


def _run_every_dump(folder: Path, args: tuple) -> list:
    """Load each phase's ``.ir`` back and run its entry (the parse dump resolved first)."""
    results = []
    for index, phase in enumerate(PHASES):
        module = anfir.load(str(folder / f"{index:02d}_{phase.name}.ir"))
        if index == 0:
            module = resolve_module(module) or module
        results.append(anfir.run(module.ir_entry, *args))
    return results


def test_numpy_scalar_in_an_abstract_value_prints_as_anf() -> None:
    # np.float64 is a float subclass: its repr ``np.float64(0.5)`` is not ANF.
    assert str(AScalar("f64", np.float64(0.5))) == "<Float64 = 0.5>"
    assert str(AScalar("bool", np.bool_(True))) == "<Bool = true>"


def test_a_folded_numpy_scalar_leaves_the_dumps_loadable(tmp_path: Path) -> None:
    # ``sum`` folds to an np.float64: the optimize dump's type must still re-parse.
    module = anfir.parse("def main(x) = sum(ones((2, 3)) * 0.0)\n", "npf.anf")
    result = compile_program(module, args=(1.0,), dump_dir=tmp_path)
    assert anfir.run(result.graph, 1.0) == 0.0
    assert "np." not in (tmp_path / "05_optimize.ir").read_text(encoding="utf-8")
    assert _run_every_dump(tmp_path, (1.0,)) == [0.0] * len(PHASES)


def test_grad_through_a_closure_called_in_the_differentiated_function(tmp_path: Path) -> None:
    # The inner lambda closes over main's x only, so its J stays a run-time J;
    # typing it used to make a manager that took over the program's graphs,
    # and validate then rejected the IR ("belongs to an unmanaged graph").
    text = "def main(x, y) = grad(lambda (p) (lambda (q) x end)(0.0) * p end)(y)\n"
    module = anfir.parse(text, "gclo.anf")
    expected = anfir.run(module.entry, 2.0, 3.0)
    assert expected == 2.0
    result = compile_program(module, args=(2.0, 3.0), dump_dir=tmp_path)
    manager = result.program.manager  # (running may root more graphs: check it first)
    assert result.graph.manager is manager and list(manager.roots) == [result.graph]
    assert anfir.run(result.graph, 2.0, 3.0) == expected
    assert _run_every_dump(tmp_path, (2.0, 3.0)) == [expected] * len(PHASES)

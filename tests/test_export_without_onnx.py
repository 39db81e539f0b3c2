"""What the exporters need without the ``onnx`` package: the walk to a flat
program (closures, If, Loop, located errors), and a clear error naming the
extra when ONNX export is asked for without it.  ``import anfir`` never
imports ``onnx``.  (test_onnx_export.py checks the models themselves.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import anfir
import spec_examples
from anfir.errors import ExportError, MissingDependencyError
from anfir.flat.statements import Block, IfOp, LoopOp, Op
from anfir.flat.flatten import flatten_program
from cli_harness import run_in_process

ROOT = Path(__file__).resolve().parent.parent


def statements(block: Block) -> list[Any]:
    """Every statement of ``block`` and the blocks inside it."""
    found: list[Any] = []
    stack = [block]
    while stack:
        current = stack.pop()
        for statement in current.ops:
            found.append(statement)
            if isinstance(statement, IfOp):
                stack += [statement.then_block, statement.else_block]
            elif isinstance(statement, LoopOp):
                stack.append(statement.body)
    return found


def flat(text: str, entry: str, args: Any = None) -> Any:
    return flatten_program(anfir.compile(anfir.parse(text), entry=entry, args=args))


def test_a_tail_loop_is_one_loop_whose_body_is_an_if() -> None:
    program = flat(spec_examples.POWER, "power", [2.0, 3])
    (loop,) = [s for s in program.body.ops if isinstance(s, LoopOp)]
    assert [type(s) for s in loop.body.ops].count(IfOp) == 1
    # The state (i, acc) and the result are carried; the body yields "continue?" first.
    assert len(loop.body.params) == 3 and len(loop.body.results) == 4
    assert [v.name for v in program.inputs] == ["x", "n"]


def test_the_gradient_of_if_needs_no_closure() -> None:
    graph = anfir.grad(anfir.parse("def f(x) = if x > 0.0 then x * x else sin(x)")["f"])
    program = flatten_program(anfir.compile(graph, args=[1.0]))
    ifs = [s for s in statements(program.body) if isinstance(s, IfOp)]
    assert len(ifs) == 1  # the call of the backpropagator, dispatching on its tag
    prims = [s.prim.name for s in program.body.ops if isinstance(s, Op)]
    # The forward `if` gives only the tag (its value is not read): a select.
    assert prims[:2] == ["gt", "switch"]
    everything = {s.prim.name for s in statements(program.body) if isinstance(s, Op)}
    assert not everything & {"env_getitem", "env_setitem", "make_tuple", "tuple_getitem"}


def test_straight_line_gradients_are_straight_line() -> None:
    mlp = anfir.parse(spec_examples.MLP)["mlp_loss"]
    program = flatten_program(anfir.compile(anfir.value_and_grad(mlp, wrt=(0, 1))))
    assert all(isinstance(s, Op) for s in program.body.ops)
    assert program.output_structure == ["output_0", ["output_1_0", "output_1_1"]]


COUNTDOWN = """\
def power(x, n) =
  let loop = lambda (k, acc) if k == 0 then acc else loop(k - 1, acc * x) end in
  loop(n, 1.0)
def dpower(x) = grad(power)(x, 3)
"""


DATA_EXIT = """\
def halvings(x) =
  let loop = lambda (y, scale) if y < 1.0 then scale * y else loop(y / 2.0, scale * 3.0) end in
  loop(x, 1.0)
def dhalvings(x) = grad(halvings)(x)
"""


@pytest.mark.parametrize("text", [spec_examples.POWER, COUNTDOWN], ids=["up", "down"])
def test_the_gradient_of_a_counted_loop_is_first_order(text: str) -> None:
    program = flat(text, "dpower", [2.0])
    assert sum(isinstance(s, LoopOp) for s in statements(program.body)) == 2


@pytest.mark.parametrize("text,entry,args,message", [
    (spec_examples.FIBONACCI, "fibonacci", [10], "not in tail position"),
    # A counted loop (spec_examples.POWER, COUNTDOWN) becomes a fori_loop before AD and
    # exports (tests/test_counted_loops.py); a loop that stops on a data value is refused.
    (DATA_EXIT, "dhalvings", [5.0], "a loop that carries or returns a function"),
    (spec_examples.CLOSURE, "func_outer", [1, 2], "is a function"),
])
def test_what_is_not_first_order_is_a_located_export_error(text: str, entry: str, args: Any,
                                                           message: str) -> None:
    with pytest.raises(ExportError) as info:
        flat(text, entry, args)
    assert message in info.value.message
    assert info.value.loc is not None and "^" in info.value.render()


def _without_onnx(monkeypatch: pytest.MonkeyPatch) -> None:
    # A None entry makes `import onnx` raise ImportError, installed or not.
    for name in [m for m in sys.modules if m == "onnx" or m.startswith("onnx.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "onnx", None)


def test_export_without_onnx_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _without_onnx(monkeypatch)
    with pytest.raises(MissingDependencyError) as info:
        anfir.export_onnx(anfir.parse(spec_examples.MLP), entry="mlp_loss")
    assert isinstance(info.value, anfir.AnfirError)
    assert 'pip install "anfir[onnx]"' in info.value.message


def test_the_command_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    _without_onnx(monkeypatch)
    status, out, err = run_in_process(["export", str(ROOT / "examples" / "mlp.anf"), "-o",
                                       str(tmp_path / "mlp.onnx")], tmp_path)
    assert status == 1 and out == ""
    assert "missing dependency" in err and "anfir[onnx]" in err and "Traceback" not in err
    assert not (tmp_path / "mlp.onnx").exists()


def test_importing_anfir_never_imports_onnx() -> None:
    code = ("import sys\n"
            "import anfir, anfir.cli, anfir.interop.onnx.exporter, anfir.flat.flatten\n"
            "assert 'onnx' not in sys.modules, 'onnx was imported'\n"
            "sys.modules['onnx'] = None\n"
            "import importlib; importlib.reload(anfir.interop.onnx.exporter)\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))


def _without_coremltools(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "coremltools" or m.startswith("coremltools.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "coremltools", None)


def test_export_without_coremltools_names_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    _without_coremltools(monkeypatch)
    with pytest.raises(MissingDependencyError) as info:
        anfir.export_coreml(anfir.parse(spec_examples.MLP), entry="mlp_loss")
    assert 'pip install "anfir[coreml]"' in info.value.message
    status, out, err = run_in_process(["export", str(ROOT / "examples" / "mlp.anf"), "--to",
                                       "coreml", "-o", str(tmp_path / "mlp.mlpackage")], tmp_path)
    assert status == 1 and out == ""
    assert "missing dependency" in err and "anfir[coreml]" in err and "Traceback" not in err
    assert not (tmp_path / "mlp.mlpackage").exists()


def test_importing_anfir_never_imports_coremltools() -> None:
    code = ("import sys\n"
            "import anfir, anfir.cli, anfir.interop.coreml.exporter\n"
            "assert 'coremltools' not in sys.modules, 'coremltools was imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT,
                   env=dict(os.environ, PYTHONPATH=str(ROOT)))

"""Regressions found by the foundation audit (issue 2): CLI output and diagnostics.

Each test failed before its fix:

* ``anfir run`` printed a result nested 3,000 tuples deep with a recursive
  formatter and ended in "internal error: Python recursion limit reached";
* an output path that cannot be written (``-o`` into a missing directory,
  ``--dump-dir`` naming a file) was an "internal error" with exit status 3
  instead of a usage error (exit status 2);
* the isomorphism checker described a differing deeply nested constant with
  ``repr`` and raised ``RecursionError`` instead of ``IsomorphismError``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import anfir
from anfir.cli import format_value
from cli_harness import run_in_process
from anfir.printers.iso import IsomorphismError, assert_isomorphic

DEPTH = 3000


def _cli(*argv: str) -> tuple[int, str, str]:
    return run_in_process(list(argv), Path.cwd())


def _nested(depth: int) -> tuple:
    value: tuple = (1,)
    for _ in range(depth - 1):
        value = (value,)
    return value


def test_format_value_of_a_deeply_nested_tuple_is_iterative():
    text = format_value(_nested(DEPTH))
    assert text == "(" * DEPTH + "1" + ",)" * DEPTH


def test_format_value_keeps_the_anf_spelling_of_every_kind_of_result():
    value = ((), (1,), (2.5, "a\"b\\c\nd", None, True, False), -3)
    assert format_value(value) == '((), (1,), (2.5, "a\\"b\\\\c\\nd", None, true, false), -3)'


def test_run_prints_a_result_nested_thousands_deep(tmp_path: Path):
    prog = tmp_path / "deep.anf"
    prog.write_text("def main(x) = " + "(x, " * DEPTH + "x" + ")" * DEPTH + "\n")
    status, out, err = _cli("run", str(prog), "7")
    assert (status, err) == (0, "")
    assert out == "(7, " * DEPTH + "7" + ")" * DEPTH + "\n"


@pytest.mark.parametrize("argv", [
    ("dot", "{prog}", "-o", "{missing}/f.dot"),
    ("grad", "{prog}", "-o", "{missing}/g.ir", "2.0"),
    ("compile", "{prog}", "--args", "2.0", "--dump-dir", "{prog}"),
])
def test_an_unwritable_output_path_is_a_usage_error(tmp_path: Path, argv):
    prog = tmp_path / "sq.anf"
    prog.write_text("def main(x) = x * x\n")
    args = [a.format(prog=prog, missing=tmp_path / "no" / "such" / "dir") for a in argv]
    status, _, err = _cli(*args)
    assert status == 2, err
    assert f"anfir {argv[0]}: usage error: cannot use" in err
    assert "internal error" not in err and "Traceback" not in err


def test_isomorphism_error_on_a_deeply_nested_constant(tmp_path: Path):
    dump = tmp_path / "deep.ir"
    dump.write_text("subgraph @main() {\n  %1 = make_tuple(" + "(" * DEPTH + "1" + ",)" * DEPTH
                    + ", 2)\n  return %1\n}\n")
    loaded = anfir.load(str(dump))
    other = anfir.parse("def main() = (((1,),), 2)")
    with pytest.raises(IsomorphismError, match="constant"):
        assert_isomorphic(loaded, other, abstracts=False)

"""`anfir compile` on bad programs: located messages, exit status 1, no traceback, bounded time."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from anfir.cli import main

LOCATED = re.compile(r"^(?P<file>[^:\n]+\.anf):(?P<line>\d+):(?P<col>\d+): [a-z ]+ error: ", re.M)

CASES = {
    "unknown_name": ("def main(x) = x + nothing\n", ["--args", "1.0"], "unknown name", (1, 19)),
    "wrong_arity": ("def f(a, b) = a * b\ndef main(x) = f(x)\n", ["--args", "1.0"], "argument", (2, None)),
    "shape_mismatch": ("def main(a: f64[2, 3], b: f64[2, 3]) = a @ b\n", [], "f64[2, 3]", (1, None)),
    "annotation_contradicted": ("def main(x: f64) -> i64 = x * 2.0\n", [], "annotation", (1, None)),
    "call_non_function": ("def main(x) = 3(x)\n", ["--args", "1.0"], "not a function", (1, None)),
    "grad_non_scalar": ("def f(x) = (x, x)\ndef main(x) = grad(f)(x)\n", ["--args", "1.0"],
                        "not a scalar", (2, None)),
    "no_base_case": ("def f(x) = f(x)\ndef main(x) = f(x)\n", ["--args", "1.0"], "base case", (None, None)),
    "empty_file": ("", [], "defines nothing", (None, None)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_compile_reports_a_located_error(name, tmp_path: Path, capsys) -> None:
    text, extra, needle, (line, col) = CASES[name]
    path = tmp_path / f"{name}.anf"
    path.write_text(text)
    start = time.perf_counter()
    status = main(["compile", str(path), *extra])
    elapsed = time.perf_counter() - start
    out, err = capsys.readouterr()
    assert status == 1, err
    assert "Traceback" not in err and "internal error" not in err
    assert needle in err, err
    assert elapsed < 30  # bounded: inference never hangs
    head = LOCATED.search(err)
    assert head, err
    assert head.group("file").endswith(f"{name}.anf")
    if line is not None:
        assert int(head.group("line")) == line, err
    if col is not None:
        assert int(head.group("col")) == col, err
    if text.strip():
        # the offending line, then a caret under the column
        lines = err.splitlines()
        caret = next(i for i, l in enumerate(lines) if l.strip() == "^")
        assert lines[caret - 1].strip() in text


def test_the_command_line_process_exits_1_without_traceback(tmp_path: Path) -> None:
    path = tmp_path / "bad.anf"
    path.write_text("def main(a: f64[2, 3], b: f64[2, 3]) = a @ b\n")
    proc = subprocess.run([sys.executable, "-m", "anfir", "compile", str(path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and "bad.anf:1:" in proc.stderr

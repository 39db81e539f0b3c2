"""Running the ``anfir`` command in this process, for the tests (fast: no
interpreter start-up per invocation)."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

from anfir.cli import main as cli_main


def run_in_process(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """``anfir ARGS`` run in ``cwd``: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    previous = os.getcwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = cli_main(args)
            except SystemExit as stop:  # argparse's --help and usage errors
                status = stop.code if isinstance(stop.code, int) else 1
    finally:
        os.chdir(previous)
    return status, out.getvalue(), err.getvalue()

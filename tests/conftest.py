"""Make the repository root importable when pytest is run as plain ``pytest``."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import pytest

DEFAULT_RECURSION_LIMIT = 1000
"""Python's default. Some libraries raise it when imported (IPython sets 3000);
every test runs at the default so "no recursion on program size" is checked
for real."""


@pytest.fixture(autouse=True)
def default_recursion_limit():
    """Run each test at Python's default recursion limit."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(DEFAULT_RECURSION_LIMIT)
    yield
    sys.setrecursionlimit(old)



@pytest.fixture(autouse=True)
def mindir_round_trip(monkeypatch):
    """Every program a test exports to ONNX also round-trips MindIR (issue 29): the check
    of tests/mindir_parity.py runs after each ONNX export (``anfir.export_onnx`` calls
    the exporter module's function, which is wrapped)."""
    try:
        from anfir.interop.onnx import exporter
    except ImportError:  # without onnx there is no ONNX export to follow
        yield
        return
    from mindir_parity import wrap

    monkeypatch.setattr(exporter, "export_onnx", wrap(exporter.export_onnx))
    yield

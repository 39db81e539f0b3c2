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

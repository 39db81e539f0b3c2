"""The first hour (issue 5): what a newcomer runs first keeps working.

* every fenced block of docs/*.md and README.md is executed by
  tests/test_docs.py, except the two install commands of the README's quick
  start and a diagram — and the quick start's first command does what the
  README says once installed;
* the built-in list of the language spec has entries in docs/language.md;
* FuncGraph and Module display as SVG in Jupyter, and as text when Graphviz's
  ``dot`` is not on the PATH;
* every example shown by ``anfir COMMAND --help`` runs, and every argument
  of every command has a help line.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import spec_examples

from anfir.cli import build_parser
from cli_harness import run_in_process
from anfir.passes.pipeline import PHASES

import test_docs

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
EXECUTED_TAGS = {"anf", "python", "console"}
COMMANDS = ["run", "grad", "compile", "fmt", "dot"]


# -- every code block of the docs is run --------------------------------------------
def _fence_lines(path: Path) -> int:
    return sum(1 for line in path.read_text(encoding="utf-8").split("\n")
               if re.match(r"^\s*```", line))


@pytest.mark.parametrize("path", test_docs.DOC_FILES, ids=lambda p: p.name)
def test_the_block_extractor_sees_every_fenced_block(path: Path) -> None:
    """test_docs.fenced_blocks finds every block (an opening and a closing fence each)."""
    assert _fence_lines(path) == 2 * len(test_docs.fenced_blocks(path))


def test_every_doc_block_is_executed_except_the_known_ones() -> None:
    """No code block slips through untested: each is anf/python/console, or one of these."""
    not_run = sorted((block.path.name, block.tag) for path in test_docs.DOC_FILES
                     for block in test_docs.fenced_blocks(path) if block.tag not in EXECUTED_TAGS)
    # The README's two install commands (checked below and by CI) and the
    # data-flow diagram of architecture.md.
    assert not_run == [("README.md", "sh"), ("README.md", "sh"), ("architecture.md", "text")]
    for path in test_docs.DOC_FILES:
        if path.name not in ("index.md", "architecture.md"):  # a table of contents, a map
            executed = [b for b in test_docs.fenced_blocks(path) if b.tag in EXECUTED_TAGS]
            assert executed, f"{path.name} has no executed example"


def test_the_readme_session_and_python_examples_are_checked() -> None:
    blocks = test_docs.fenced_blocks(README)
    tags = [b.tag for b in blocks]
    assert {"anf", "python", "console"} <= set(tags)
    session = next(b for b in blocks if b.tag == "console")
    assert "$ anfir run examples/fibonacci.anf 10\n55\n" in session.text
    python = next(b for b in blocks if b.tag == "python")
    assert python.text.count("assert ") >= 2  # the results it shows are compared


def _quick_start() -> list[str]:
    return [b.text.strip() for b in test_docs.fenced_blocks(README) if b.tag == "sh"]


def test_the_quick_start_has_the_two_commands_ci_expects() -> None:
    install_and_run, install_and_test = _quick_start()
    assert install_and_run.startswith("python3 -m venv .venv && .venv/bin/pip install -q -e . && ")
    assert install_and_test == ('python3 -m venv .venv && .venv/bin/pip install -q -e ".[dev]" '
                                "&& .venv/bin/python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    pattern = re.search(r"grep -m1 -E '([^']+)' README\.md", ci)
    assert pattern is not None
    assert re.search(pattern.group(1), install_and_test)


_anfir = run_in_process


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    return tmp_path


def test_the_first_quick_start_command_compiles_differentiates_and_dumps(scratch: Path) -> None:
    """Its anfir part, run as written: dumps, a timing table, the derivative's value."""
    command = _quick_start()[0].split(" && ")[-1]
    assert command.startswith(".venv/bin/anfir ")
    args = shlex.split(command)[1:]
    status, out, err = _anfir(args, scratch)
    assert status == 0, err
    assert "grad" in (scratch / args[args.index("compile") + 1]).read_text(encoding="utf-8")
    assert re.search(r"^result: 27\.0$", out, re.M), out  # d/dx x**3 at 3.0
    dump_dir = args[args.index("--dump-dir") + 1]
    assert f"dumps in {dump_dir}/" in out
    names = sorted(p.name for p in (scratch / dump_dir).iterdir())
    assert names[0] == "00_parse.dot" and "03_ad.ir" in names and names[-1].endswith("_validate.ir")
    for phase in PHASES:
        assert re.search(rf"^{phase.name}\s+\d+\.\d+$", out, re.M), f"no time for {phase.name}"


# -- the language reference covers the spec's built-ins -------------------------------
SPEC = ROOT.parent / "shared" / "spec" / "anf-text.md"


EXAMPLE_FILES = {"paper": "paper_lambda.anf", "hof": "hof.anf", "fibonacci": "fibonacci.anf",
                 "closure": "closure.anf", "power": "power.anf", "mlp": "mlp.anf"}


@pytest.mark.parametrize("name", sorted(spec_examples.ALL))
def test_shared_examples_are_the_contracts_own_text(name: str) -> None:
    """The tests' copy and the bundled example file hold the spec's text verbatim."""
    text = spec_examples.ALL[name]
    bundled = (ROOT / "examples" / EXAMPLE_FILES[name]).read_text(encoding="utf-8")
    assert text in bundled
    if not SPEC.exists():
        return  # the file check above still ran; the spec sits beside the checkout in CI
    indented = "\n".join(("    " + line) if line else "" for line in text.splitlines())
    assert indented in SPEC.read_text(encoding="utf-8")


def test_every_builtin_of_the_spec_is_documented() -> None:
    if not SPEC.exists():
        pytest.skip("the shared spec is not beside this checkout")
    section = SPEC.read_text(encoding="utf-8").split("## Built-in names", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for code in re.findall(r"`([^`]+)`", section):
        while re.search(r"\([^()]*\)", code):  # drop argument lists: `sum(x, axis)` -> `sum`
            code = re.sub(r"\([^()]*\)", "", code)
        # Single letters are the spec's argument names (`a scalar-valued `f``).
        names.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]+", code))
    assert {"add", "relu", "where", "cast", "switch", "value_and_grad"} <= names
    documented = test_docs.documented_names(test_docs.LANGUAGE.read_text(encoding="utf-8"))
    missing = sorted(names - documented)
    assert not missing, f"docs/language.md has no entry for the spec's {missing}"


# -- Jupyter display ------------------------------------------------------------------
_DISPLAY = """
import anfir
from IPython.core.formatters import DisplayFormatter

mod = anfir.load({path!r})
graph = mod["fibonacci"]
formatter = DisplayFormatter()
for obj in (graph, mod):
    data, _ = formatter.format(obj)
    print(sorted(data), "svg" if "<svg" in data.get("image/svg+xml", "") else "-")
    print(data["text/plain"].splitlines()[0], "| lines:", len(data["text/plain"].splitlines()))
print(str(graph).splitlines()[0])
"""


def _display(path_env: str) -> list[str]:
    pytest.importorskip("IPython")
    code = _DISPLAY.format(path=str(ROOT / "examples" / "fibonacci.anf"))
    env = dict(os.environ, PATH=path_env, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          encoding="utf-8", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout.splitlines()


def test_graphs_display_as_svg_when_dot_is_installed() -> None:
    pytest.importorskip("graphviz")
    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not installed")
    lines = _display(os.environ.get("PATH", ""))
    assert lines[0] == "['image/svg+xml', 'text/plain'] svg"
    assert lines[1] == "def fibonacci(n) = | lines: 12"  # the canonical text
    assert lines[2] == "['image/svg+xml', 'text/plain'] svg"
    assert lines[3] == "def fibonacci(n) = | lines: 12"
    assert lines[4] == "def fibonacci(n) ="


def test_graphs_display_as_text_when_dot_is_missing(tmp_path: Path) -> None:
    """No dot on the PATH: no picture, no error, the program as text instead."""
    bare = tmp_path / "bin"
    bare.mkdir()
    lines = _display(str(bare))
    assert lines[0] == "['text/plain'] -"
    assert lines[1] == "def fibonacci(n) = | lines: 12"
    assert lines[2] == "['text/plain'] -"
    assert lines[3] == "def fibonacci(n) = | lines: 12"
    assert lines[4] == "def fibonacci(n) ="


# -- CLI help -------------------------------------------------------------------------
def _help(command: str) -> str:
    status, out, err = _anfir([command, "--help"], ROOT)
    assert status == 0, err
    return out


def _examples(text: str) -> list[str]:
    tail = re.split(r"^examples?:\n", text, flags=re.M)[1]
    return [line.split("#")[0].strip() for line in tail.split("\n") if line.startswith("  anfir ")]


@pytest.mark.parametrize("command", COMMANDS + [None], ids=lambda c: c or "anfir")
def test_every_help_example_runs(command: str | None, scratch: Path) -> None:
    np.save(scratch / "w1.npy", np.full((3, 4), 0.1))
    np.save(scratch / "w2.npy", np.full((4, 2), 0.2))
    np.save(scratch / "x.npy", np.ones((5, 3)))
    np.save(scratch / "y.npy", np.zeros((5, 2)))
    if command is None:
        status, text, err = _anfir(["--help"], ROOT)
        assert status == 0, err
    else:
        text = _help(command)
    examples = _examples(text)
    assert examples, text
    for example in examples:
        if shutil.which("dot") is None and re.search(r"-o \S+\.(svg|png)", example):
            continue
        status, out, err = _anfir(shlex.split(example)[1:], scratch)
        assert status == 0, f"{example}\n{err}"
        assert out or "-o" in example, example


@pytest.mark.parametrize("command", COMMANDS)
def test_every_argument_has_a_help_line(command: str) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")  # noqa: SLF001
    for action in sub.choices[command]._actions:  # noqa: SLF001
        assert action.help, f"anfir {command}: {action.option_strings or action.dest} has no help"

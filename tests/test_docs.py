"""The documentation is executable: every example in docs/ must stay true.

Conventions checked here (documented at the top of docs/language.md):

* every non-internal built-in (primitive or meta function) has a table row or
  a heading naming it in docs/language.md;
* every fenced block tagged ``anf`` parses; a comment line
  ``# run: NAME(ARGS) => RESULT`` runs definition NAME on literal ARGS and
  compares the result, printed as ``anfir run`` prints it, with RESULT
  (``=> error: TEXT`` expects an AnfirError containing TEXT); a comment line
  ``# error: TEXT`` says the program must be rejected at load time;
* every fenced block tagged ``python`` runs (in a scratch directory holding a
  copy of ``examples/``), each block on its own;
* every fenced block tagged ``console`` is a shell session: ``$ `` lines are
  commands, the lines after one are its expected stdout and stderr; a line
  ``...`` stands for any number of lines, and ``...`` inside a line for any
  text (see :func:`run_session` for how commands run).  A command that
  renders a picture (``anfir dot ... -o OUT.svg``/``.png``) needs Graphviz's
  ``dot``; where it is not installed, that command and the later ones that
  name its output file are not run (the test then reports a skip saying so),
  and the other commands of the block still run and are checked;
* likewise where the ``onnx`` package (the ``[onnx]`` extra) is not installed:
  ``anfir export`` commands (and later ones naming the model file) are not
  run, and a ``python`` block that imports ``onnx`` is skipped; the same for
  coremltools (the ``[coreml]`` extra) and ``anfir export --to coreml``.
* blocks that use the JAX back end (a ``python`` block importing ``jax`` or
  calling ``to_jax``, a command with ``--backend jax``) need JAX, an optional
  dependency: where it is not installed, they are skipped the same way.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import anfir
from anfir.cli import format_value
import spec_examples
from cli_harness import run_in_process
from anfir.passes.pipeline import PHASES
from anfir.primitives import META_FUNCTIONS, PRIMITIVES

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
LANGUAGE = DOCS / "language.md"
DOC_FILES = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]


@dataclass
class Block:
    """One fenced code block of a Markdown file."""

    path: Path
    line: int
    """1-based line of the opening fence."""
    tag: str
    text: str

    def id(self) -> str:
        return f"{self.path.name}:{self.line}"


_FENCE = re.compile(r"^(\s*)```\s*([A-Za-z0-9_+-]*)\s*$")


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, with its tag (``""`` if none)."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").split("\n")
    index = 0
    while index < len(lines):
        match = _FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        start, tag, body = index, match.group(2), []
        index += 1
        while index < len(lines) and lines[index].strip() != "```":
            body.append(lines[index])
            index += 1
        blocks.append(Block(path, start + 1, tag, "\n".join(body) + "\n"))
        index += 1
    return blocks


def blocks_tagged(tag: str) -> list[Block]:
    return [b for path in DOC_FILES if path.exists() for b in fenced_blocks(path) if b.tag == tag]


# -- the built-in reference ---------------------------------------------------------
def public_builtins() -> list[str]:
    names = [n for n, p in PRIMITIVES.items() if not p.internal]
    names += [n for n, m in META_FUNCTIONS.items() if not m.internal]
    return sorted(names)


def documented_names(text: str) -> set[str]:
    """Names that head a table row (first cell `` `name` ``) or a Markdown heading."""
    found: set[str] = set()
    in_code = False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        row = re.match(r"^\|\s*`([A-Za-z_][A-Za-z0-9_]*)`\s*\|", line)
        if row:
            found.add(row.group(1))
        heading = re.match(r"^#{1,6}\s+`?([A-Za-z_][A-Za-z0-9_]*)`?", line)
        if heading:
            found.add(heading.group(1))
    return found


def test_builtin_registry_is_not_empty() -> None:
    # Guards the test below against an empty registry (it would pass vacuously).
    assert {"add", "grad", "switch", "matmul", "value_and_grad"} <= set(public_builtins())


def test_every_builtin_has_an_entry_in_language_md() -> None:
    documented = documented_names(LANGUAGE.read_text(encoding="utf-8"))
    missing = [name for name in public_builtins() if name not in documented]
    assert not missing, f"docs/language.md has no table row or heading for: {missing}"


def test_no_entry_for_an_unknown_builtin() -> None:
    """Rows of the built-in tables name real built-ins (catches renamed or removed ones)."""
    text = LANGUAGE.read_text(encoding="utf-8")
    section = text.split("## Built-in functions", 1)[1].split("\n## ", 1)[0]
    # Section headings ("Reductions", "Complex numbers") are capitalised; built-ins never are.
    rows = {name for name in documented_names(section) if not name[:1].isupper()}
    unknown = sorted(rows - set(PRIMITIVES) - set(META_FUNCTIONS))
    assert not unknown, f"language.md documents built-ins that do not exist: {unknown}"


def test_every_internal_primitive_is_explained_in_reading_dumps() -> None:
    """Internal primitives only appear in dumps; reading-dumps.md says what each does."""
    text = (DOCS / "reading-dumps.md").read_text(encoding="utf-8")
    internal = sorted(n for n, p in PRIMITIVES.items() if p.internal)
    assert internal, "no internal primitive registered"
    missing = [n for n in internal if not re.search(rf"`{re.escape(n)}\(", text)]
    assert not missing, f"docs/reading-dumps.md does not explain: {missing}"


def test_documented_names_finds_rows_and_headings() -> None:
    text = "| `add` | `add(x, y)` |\n### `grad`\n| name | x |\n`sub` in prose\n```anf\n# mul\n```\n"
    assert documented_names(text) == {"add", "grad"}


# -- anf blocks ---------------------------------------------------------------------
_RUN = re.compile(r"^\s*#\s*run:\s*([A-Za-z_%][A-Za-z0-9_]*)\((.*)\)\s*=>\s*(.*?)\s*$")
_ERROR = re.compile(r"^\s*#\s*error:\s*(.*?)\s*$")


def literal_args(text: str) -> tuple:
    """The values of a comma-separated list of ANF literals (no free names)."""
    if not text.strip():
        return ()
    module = anfir.parse(f"def __args__() = ({text},)", "<doc-args>")
    return anfir.run(module["__args__"])


ANF_BLOCKS = blocks_tagged("anf")


def test_the_docs_have_anf_examples() -> None:
    assert len(ANF_BLOCKS) >= 20
    runs = sum(1 for b in ANF_BLOCKS for line in b.text.split("\n") if _RUN.match(line))
    assert runs >= 20


@pytest.mark.parametrize("block", ANF_BLOCKS, ids=Block.id)
def test_anf_block(block: Block) -> None:
    lines = block.text.split("\n")
    load_errors = [m.group(1) for m in map(_ERROR.match, lines) if m]
    runs = [m.groups() for m in map(_RUN.match, lines) if m]
    # Padding with the lines above the block makes errors point into the .md file.
    filename = f"{block.path.parent.name}/{block.path.name}"
    source = "\n" * block.line + block.text
    if load_errors:
        assert not runs, "a block is either rejected at load time or run, not both"
        with pytest.raises(anfir.AnfirError) as info:
            anfir.parse(source, filename)
        message = info.value.render()
        assert load_errors[0] in message
        assert re.search(r":\d+:\d+: ", message), f"error not located: {message}"
        assert "^" in message
        return
    module = anfir.parse(source, filename)
    for name, args, expected in runs:
        values = literal_args(args)
        if expected.startswith("error:"):
            with pytest.raises(anfir.AnfirError) as info:
                anfir.run(module[name], *values)
            assert expected[len("error:"):].strip() in info.value.render()
        else:
            got = format_value(anfir.run(module[name], *values))
            assert " ".join(got.split()) == " ".join(expected.split()), \
                f"{name}({args}) printed {got!r}, the docs say {expected!r}"


# -- python and console blocks ------------------------------------------------------
@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with a copy of examples/ (docs use relative paths)."""
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    return tmp_path


PYTHON_BLOCKS = blocks_tagged("python")
HAVE_ONNX = importlib.util.find_spec("onnx") is not None
"""Whether the ``[onnx]`` extra is installed (``anfir export`` and ONNX snippets need it)."""
NO_ONNX = 'the onnx package is not installed (pip install -e ".[onnx]")'
HAVE_COREMLTOOLS = importlib.util.find_spec("coremltools") is not None
"""Whether the ``[coreml]`` extra is installed (``--to coreml`` and Core ML snippets need it)."""
NO_COREMLTOOLS = 'coremltools is not installed (pip install -e ".[coreml]")'


HAVE_TORCH = importlib.util.find_spec("torch") is not None
"""Whether the ``[torch]`` extra is installed (the torch importer's snippets need it)."""


def jax_installed() -> bool:
    """Whether the optional JAX back end can run here (``pip install "anfir[jax]"``)."""
    try:
        import jax  # noqa: F401
    except ImportError:
        return False
    return True


def needs_jax(text: str) -> bool:
    """Whether a python block or a command uses the JAX back end."""
    return bool(re.search(r"^\s*(import|from) jax\b|\bto_jax\(|backend=\"jax\"|--backend jax|stablehlo",
                          text, re.M))


def test_needs_jax() -> None:
    assert needs_jax("import jax\nimport anfir\n") and needs_jax("anfir run f.anf --backend jax 1")
    assert needs_jax("fn = anfir.to_jax(g)") and not needs_jax("import anfir\nanfir.run(g)")
    assert needs_jax("head -n 1 dumps/07_stablehlo.mlir")


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=Block.id)
def test_python_block(block: Block, scratch: Path) -> None:
    if not HAVE_ONNX and re.search(r"^\s*(import|from) onnx\b", block.text, re.M):
        pytest.skip(NO_ONNX)
    if not HAVE_COREMLTOOLS and re.search(r"^\s*(import|from) coremltools\b", block.text, re.M):
        pytest.skip(NO_COREMLTOOLS)
    if not HAVE_TORCH and re.search(r"^\s*(import|from) torch\b", block.text, re.M):
        pytest.skip('the block imports torch, which is not installed: pip install "anfir[torch]"')
    if needs_jax(block.text) and not jax_installed():
        pytest.skip('the block uses the JAX back end; JAX is not installed: pip install "anfir[jax]"')
    # Running documentation snippets is test code; the package itself never execs.
    code = compile(block.text, f"{block.path.name}:{block.line}", "exec")
    exec(code, {"__name__": "__doc__"})  # noqa: S102


CONSOLE_BLOCKS = blocks_tagged("console")


def parse_session(text: str) -> list[tuple[str, list[str]]]:
    """``[(command, expected output lines)]`` of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.rstrip("\n").split("\n"):
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise AssertionError(f"a console block must start with '$ ': {line!r}")
    return steps


def lines_match(expected: list[str], got: list[str]) -> bool:
    """Whether ``got`` matches ``expected``, where a ``...`` line matches any lines."""
    exp = [line.rstrip() for line in expected]
    out = [line.rstrip() for line in got]
    while exp and not exp[-1]:
        exp.pop()
    while out and not out[-1]:
        out.pop()
    # Dynamic programming over (expected index, output index); no recursion.
    reachable = {(0, 0)}
    frontier = [(0, 0)]
    while frontier:
        i, j = frontier.pop()
        if i == len(exp):
            if j == len(out):
                return True
            continue
        nexts = []
        if exp[i] == "...":
            nexts.append((i + 1, j))
            if j < len(out):
                nexts.append((i, j + 1))
        elif j < len(out) and (exp[i] == out[j] or _ellipsis_line(exp[i], out[j])):
            nexts.append((i + 1, j + 1))
        for state in nexts:
            if state not in reachable:
                reachable.add(state)
                frontier.append(state)
    return False


def _ellipsis_line(pattern: str, line: str) -> bool:
    """A line containing `` ... `` in the middle matches any text there."""
    if "..." not in pattern or pattern == "...":
        return False
    parts = [re.escape(p) for p in pattern.split("...")]
    return re.fullmatch(".*".join(parts), line) is not None


def test_lines_match() -> None:
    assert lines_match(["a", "...", "d"], ["a", "b", "c", "d"])
    assert lines_match(["a", "...", "b"], ["a", "b"])
    assert not lines_match(["a", "b"], ["a", "c"])
    assert not lines_match(["a"], ["a", "b"])
    assert lines_match(["x = ... ms"], ["x = 1.25 ms"])


_SHELL_SYNTAX = re.compile(r"[|;&<>$`*?]|\\$")


def graphviz_output(command: str) -> str | None:
    """The picture file a command makes with Graphviz's ``dot`` program, or None.

    That is ``anfir dot ... -o OUT.svg`` (or ``.png``, or ``--output``), the
    one kind of command in the docs that runs ``dot``.
    """
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if words[:2] != ["anfir", "dot"]:
        return None
    for flag, value in zip(words, words[1:] + [""]):
        if flag.startswith("--output="):
            flag, value = "--output", flag.split("=", 1)[1]
        if flag in ("-o", "--output") and value.lower().endswith((".svg", ".png")):
            return value
    return None


def onnx_export_output(command: str) -> str | None:
    """The model file ``anfir export ... -o OUT`` writes (needs the onnx package), or None."""
    try:
        words = shlex.split(command)
    except ValueError:
        return None
    if words[:2] != ["anfir", "export"]:
        return None
    for flag, value in zip(words, words[1:] + [""]):
        if flag.startswith("--output="):
            return flag.split("=", 1)[1]
        if flag in ("-o", "--output"):
            return value
    return ""


def test_onnx_export_output() -> None:
    assert onnx_export_output("anfir export examples/mlp.anf -o mlp.onnx") == "mlp.onnx"
    assert onnx_export_output("anfir export f.anf --output=m.onnx") == "m.onnx"
    assert onnx_export_output("anfir run f.anf -o m.onnx") is None


def test_graphviz_output() -> None:
    assert graphviz_output("anfir dot examples/fibonacci.anf -o fib.svg") == "fib.svg"
    assert graphviz_output("anfir dot f.anf --output=out.PNG --entry main") == "out.PNG"
    assert graphviz_output("anfir dot examples/fibonacci.anf | head -n 1") is None
    assert graphviz_output("anfir dot examples/fibonacci.anf -o fib.dot") is None
    assert graphviz_output("anfir run x.anf -o fib.svg") is None


def run_session(block: Block, cwd: Path, skipped: list[str] | None = None,
                ) -> list[tuple[str, list[str], list[str]]]:
    """Run the commands of a console block in ``cwd``: ``(command, expected, got)`` each.

    Where Graphviz's ``dot`` is not installed, a command that needs it (see
    :func:`graphviz_output`) and every later command naming the file it would
    have made are not run: they are appended to ``skipped`` (with
    ``skipped=None``, such a command is an error).  The same holds for
    ``anfir export`` where the onnx package is not installed.

    A plain ``anfir ...`` command runs in this process through the CLI's
    ``main`` (a Python start per command would make this test slow; that
    ``python -m anfir`` behaves the same is checked in test_cli.py), its
    stdout then its stderr; anything else (pipes, ``echo $?``, ``ls``) runs in
    bash, where ``anfir`` is ``python -m anfir`` and ``$?`` is the previous
    command's status.
    """
    steps = parse_session(block.text)
    status = 0
    report = []
    not_made: list[str] = []  # files not made: dot or onnx is missing
    without_jax = not jax_installed()
    for command, expected in steps:
        picture = graphviz_output(command) if shutil.which("dot") is None else None
        model = onnx_export_output(command)
        coreml = model is not None and "--to coreml" in command
        if coreml and HAVE_COREMLTOOLS or not coreml and HAVE_ONNX:
            model = None
        made = picture if picture is not None else model
        if made is not None or any(name in command for name in not_made):
            if skipped is None:
                raise AssertionError(f"needs a tool that is not installed: {command}")
            not_made += [made] if made else []
            skipped.append(command)
            continue
        if without_jax and needs_jax(command):
            if skipped is None:
                raise AssertionError(f"needs JAX, which is not installed: {command}")
            skipped.append(command)
            continue
        if command.startswith("anfir ") and not _SHELL_SYNTAX.search(command):
            status, output = _anfir_in_process(shlex.split(command)[1:], cwd)
        else:
            status, output = _bash(command, cwd, status)
        report.append((command, expected, output.split("\n")))
    return report


def _anfir_in_process(args: list[str], cwd: Path) -> tuple[int, str]:
    status, out, err = run_in_process(args, cwd)
    return status, out + err


def _bash(command: str, cwd: Path, previous_status: int) -> tuple[int, str]:
    script = (f'anfir() {{ "{sys.executable}" -m anfir "$@"; }}\n'
              f'python() {{ "{sys.executable}" "$@"; }}\n'
              f"(exit {previous_status}); {command}")
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING="utf-8")
    proc = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, encoding="utf-8", timeout=240)
    return proc.returncode, proc.stdout


def _console_case(block: Block) -> Any:
    """A console block as a test case; one that runs ``dot`` is marked needs_dot."""
    draws = any(graphviz_output(command) for command, _ in parse_session(block.text))
    return pytest.param(block, marks=[pytest.mark.needs_dot] if draws else [])


@pytest.mark.parametrize("block", [_console_case(b) for b in CONSOLE_BLOCKS], ids=Block.id)
def test_console_block(block: Block, scratch: Path) -> None:
    skipped: list[str] = []
    problems = [f"$ {command}\n--- the docs say:\n" + "\n".join(expected)
                + "\n--- the tool printed:\n" + "\n".join(got)
                for command, expected, got in run_session(block, scratch, skipped)
                if not lines_match(expected, got)]
    assert not problems, "\n\n".join(problems)
    if skipped:
        missing = [what for what, absent in (
            ("Graphviz's dot is not installed (apt-get install graphviz)", shutil.which("dot") is None),
            (NO_ONNX, not HAVE_ONNX), (NO_COREMLTOOLS, not HAVE_COREMLTOOLS),
            ('JAX is not installed (pip install "anfir[jax]")', not jax_installed())) if absent]
        pytest.skip("; ".join(missing) + ": the other commands of the block passed; not run: "
                    + "; ".join(f"$ {command}" for command in skipped))


def test_console_sessions_exist() -> None:
    assert len(CONSOLE_BLOCKS) >= 5


# -- the first hour (issue 5): what a newcomer runs first keeps working ---------------
# Every fenced block of docs/*.md and README.md is executed above, except the two
# install commands of the README's quick start and a diagram -- and the quick
# start's first command does what the README says once installed.  The built-in
# list of the language spec has entries in docs/language.md.
README = ROOT / "README.md"
EXECUTED_TAGS = {"anf", "python", "console"}


def _fence_lines(path: Path) -> int:
    return sum(1 for line in path.read_text(encoding="utf-8").split("\n")
               if re.match(r"^\s*```", line))


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: p.name)
def test_the_block_extractor_sees_every_fenced_block(path: Path) -> None:
    """fenced_blocks finds every block (an opening and a closing fence each)."""
    assert _fence_lines(path) == 2 * len(fenced_blocks(path))


def test_every_doc_block_is_executed_except_the_known_ones() -> None:
    """No code block slips through untested: each is anf/python/console, or one of these."""
    not_run = sorted((block.path.name, block.tag) for path in DOC_FILES
                     for block in fenced_blocks(path) if block.tag not in EXECUTED_TAGS)
    # The README's two install commands (checked below and by CI) and the
    # data-flow diagram of architecture.md.
    assert not_run == [("README.md", "sh"), ("README.md", "sh"), ("architecture.md", "text")]
    for path in DOC_FILES:
        if path.name not in ("index.md", "architecture.md"):  # a table of contents, a map
            executed = [b for b in fenced_blocks(path) if b.tag in EXECUTED_TAGS]
            assert executed, f"{path.name} has no executed example"


def test_the_readme_session_and_python_examples_are_checked() -> None:
    blocks = fenced_blocks(README)
    tags = [b.tag for b in blocks]
    assert {"anf", "python", "console"} <= set(tags)
    session = next(b for b in blocks if b.tag == "console")
    assert "$ anfir run examples/fibonacci.anf 10\n55\n" in session.text
    python = next(b for b in blocks if b.tag == "python")
    assert python.text.count("assert ") >= 2  # the results it shows are compared


def _quick_start() -> list[str]:
    return [b.text.strip() for b in fenced_blocks(README) if b.tag == "sh"]


def test_the_quick_start_has_the_two_commands_ci_expects() -> None:
    install_and_run, install_and_test = _quick_start()
    assert install_and_run.startswith("python3 -m venv .venv && .venv/bin/pip install -q -e . && ")
    assert install_and_test == ('python3 -m venv .venv && .venv/bin/pip install -q -e ".[dev]" '
                                "&& .venv/bin/python -m pytest")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    patterns = re.findall(r"grep -m1 -E '([^']+)' README\.md", ci)
    assert len(patterns) == 2
    assert re.search(patterns[0], install_and_run) and not re.search(patterns[0], install_and_test)
    assert re.search(patterns[1], install_and_test) and not re.search(patterns[1], install_and_run)
    # A newcomer's machine is CI's machine: nothing is installed before the README's
    # commands have run (an install before them could make them pass where they alone fail).
    readme_run = ci.index('run_readme "$test_cmd"')
    before = [line.strip() for line in ci[:readme_run].splitlines()]
    commands = [line for line in before if line and not line.startswith(("#", "echo "))
                and "grep -m1" not in line]
    assert not [c for c in commands if re.search(r"\b(apt-get|apt|pip3?|uv|conda) install\b", c)]


def test_the_first_quick_start_command_compiles_differentiates_and_dumps(scratch: Path) -> None:
    """Its anfir part, run as written: dumps, a timing table, the derivative's value."""
    command = _quick_start()[0].split(" && ")[-1]
    assert command.startswith(".venv/bin/anfir ")
    args = shlex.split(command)[1:]
    status, out, err = run_in_process(args, scratch)
    assert status == 0, err
    assert "grad" in (scratch / args[args.index("compile") + 1]).read_text(encoding="utf-8")
    assert re.search(r"^result: 27\.0$", out, re.M), out  # d/dx x**3 at 3.0
    dump_dir = args[args.index("--dump-dir") + 1]
    assert f"dumps in {dump_dir}/" in out
    names = sorted(p.name for p in (scratch / dump_dir).iterdir())
    assert names[0] == "00_parse.dot" and "03_ad.ir" in names and names[-1].endswith("_validate.ir")
    for phase in (p for p in PHASES if p.shown is None):  # loops: shown with fine dumps
        assert re.search(rf"^{phase.name}\s+\d+\.\d+$", out, re.M), f"no time for {phase.name}"


# -- the language reference covers the spec's built-ins ------------------------------
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
    documented = documented_names(LANGUAGE.read_text(encoding="utf-8"))
    missing = sorted(names - documented)
    assert not missing, f"docs/language.md has no entry for the spec's {missing}"

"""The ``anfir`` command end to end.

Exit status 0 on success, 1 on an error in the user's input (a located
message on stderr, never a traceback), 2 on a usage error.

Every invocation below runs in-process through :func:`anfir.cli.main` (fast:
one Python start for the whole matrix), and a representative subset also runs
as a real ``python -m anfir`` subprocess — launched together in a thread pool —
whose status, stdout and stderr must be identical to the in-process run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

import anfir
from anfir.cli import build_parser, format_value
from cli_harness import run_in_process

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
COMMANDS = ("run", "grad", "compile", "fmt", "dot")
PHASES = ("parse", "resolve", "specialize", "ad", "inline", "optimize", "validate")
LOCATED = re.compile(r"^\S+:\d+:\d+: [a-z ]+ error: ", re.M)
"""The head of a located message: ``file:line:col: kind error: ...``."""


@dataclass
class Result:
    """What one invocation of the command did."""

    returncode: int
    stdout: str
    stderr: str


def anfir_cli(args: list[str], cwd: Path, timeout: float = 120) -> Result:
    """Run ``python -m anfir ARGS`` in a subprocess in ``cwd``, the repository importable."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING="utf-8")
    env.pop("ANFIR_DEBUG", None)
    proc = subprocess.run([sys.executable, "-m", "anfir", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, encoding="utf-8", timeout=timeout)
    return Result(proc.returncode, proc.stdout, proc.stderr)


def anfir_in_process(args: list[str], cwd: Path) -> Result:
    """Run the command's ``main(args)`` in this process, in ``cwd``."""
    return Result(*run_in_process(args, cwd))


SUBPROCESS = ("run_fib", "compile_time", "help_grad", "unknown_option", "bad_syntax",
              "bad_binary_garbage", "grad_int_arg")
"""Invocations also run as ``python -m anfir`` subprocesses."""


# Programs with one mistake each: (file name, file bytes, text the message must contain,
# line and column it must point at).
BAD_PROGRAMS: dict[str, tuple[bytes, str, Optional[tuple[int, int]]]] = {
    "syntax": (b"def main() =\n  let x = 1 in\n  x +\n", "syntax error", (3, 6)),
    "unknown_name": (b"def main() =\n  fibonaci(3)\n", "unknown name 'fibonaci'", (2, 3)),
    "arity": (b"def f(x) = x\ndef main() = f(1, 2)\n", "arity error", (2, 15)),
    "arity_at_run_time": (b"def apply(g) = g(1, 2)\ndef main() = apply(lambda (x) x end)\n",
                          "arity error", (1, 17)),
    "not_a_function": (b"def main() = 3(1)\n", "not a function", (1, 14)),
    "not_a_function_at_run_time": (b"def call(g) = g(1)\ndef main() = call(2.5)\n",
                                   "type error", (1, 16)),
    "condition_not_bool": (b"def main() = if 1 then 2 else 3\n", "must be a bool", (1, 14)),
    "empty_file": (b"", "defines nothing", (1, 1)),
    "only_comments": (b"# nothing here\n\n", "defines nothing", None),
    "binary_garbage": (bytes(range(256)) * 4, "not UTF-8", None),
    "nul_bytes": (b"def main() = 1\x00\x00\n", "NUL", (1, 15)),
    "unterminated_string": (b'def main() = "abc\n', "unterminated string", (1, 14)),
    "duplicate_definition": (b"def f() = 1\ndef f() = 2\n", "defined twice", (2, 5)),
    "shape_mismatch": (b"def main() = zeros((2,)) + zeros((3,))\n", "shape error", (1, 26)),
    "tuple_index": (b"def main() = (1, 2)[5]\n", "out of range", (1, 20)),
    "grad_of_non_scalar": (b"def f(x) = (x, x)\ndef main() = grad(f)(1.0)\n", "gradient error",
                           None),
    "grad_of_int_output": (b"def f(x) = 2 * x\ndef main() = grad(f)(3)\n", "gradient error",
                           None),
}


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch directory with a copy of examples/, the bad programs and some .npy files."""
    root = tmp_path_factory.mktemp("cli")
    shutil.copytree(EXAMPLES, root / "examples")
    for name, (data, _, _) in BAD_PROGRAMS.items():
        (root / f"{name}.anf").write_bytes(data)
    rng = np.random.default_rng(0)
    np.save(root / "w1.npy", rng.normal(size=(3, 4)))
    np.save(root / "w2.npy", rng.normal(size=(4, 2)))
    np.save(root / "x.npy", rng.normal(size=(5, 3)))
    np.save(root / "y.npy", rng.normal(size=(5, 2)))
    (root / "notes.npy").write_bytes(b"not an array")
    (root / "args.anf").write_text('def main(t, s, b, n) = (t[0] + t[1], s + "!", not b, n)\n')
    return root


def _invocations() -> dict[str, list[str]]:
    calls: dict[str, list[str]] = {
        "run_fib": ["run", "examples/fibonacci.anf", "10"],
        "run_paper": ["run", "examples/paper_lambda.anf", "5.0", "2.0"],
        "run_hof": ["run", "examples/hof.anf", "2.0"],
        "run_entry_first": ["run", "--entry", "fibonacci", "examples/fibonacci.anf", "10"],
        "run_entry_between": ["run", "examples/fibonacci.anf", "--entry", "fibonacci", "10"],
        "run_entry_after": ["run", "examples/fibonacci.anf", "10", "--entry", "fibonacci"],
        "run_closure": ["run", "examples/closure.anf", "--entry", "ms_closure"],
        "run_closures_main": ["run", "examples/closures.anf"],
        "run_loop_long": ["run", "--entry", "sum_to", "examples/loop.anf", "100000"],
        "run_ambiguous": ["run", "examples/power.anf"],
        "run_no_such_entry": ["run", "--entry", "nope", "examples/power.anf"],
        "run_npy": ["run", "examples/mlp.anf", "w1.npy", "w2.npy", "x.npy", "y.npy"],
        "run_bad_npy": ["run", "examples/mlp.anf", "notes.npy", "w2.npy", "x.npy", "y.npy"],
        "run_missing_npy": ["run", "examples/mlp.anf", "gone.npy", "w2.npy", "x.npy", "y.npy"],
        "run_negative_arg": ["run", "--entry", "power", "examples/power.anf", "-2.0", "3"],
        "run_literal_args": ["run", "args.anf", "(1, 2.5)", '"hi"', "true", "None"],
        "grad_spec_form": ["grad", "examples/power.anf", "--entry", "power", "--wrt", "0", "2.0", "3"],
        "grad_options_first": ["grad", "--entry", "power", "--wrt", "0", "examples/power.anf",
                               "2.0", "3"],
        "grad_two": ["grad", "--wrt", "0,1", "examples/paper_lambda.anf", "5.0", "2.0"],
        "grad_npy": ["grad", "--wrt", "0,1", "examples/mlp.anf", "w1.npy", "w2.npy", "x.npy",
                     "y.npy"],
        "grad_int_arg": ["grad", "--entry", "power", "--wrt", "1", "examples/power.anf", "2.0", "3"],
        "grad_bad_wrt": ["grad", "--wrt", "a", "examples/hof.anf", "2.0"],
        "grad_no_args": ["grad", "examples/hof.anf"],
        "grad_o": ["grad", "--entry", "power", "-o", "dpower_cli.ir", "examples/power.anf"],
        "compile_time": ["compile", "examples/mlp.anf", "--time"],
        "compile_dumps": ["compile", "examples/hof.anf", "--args", "2.0", "--dump-dir", "hof_dumps"],
        "compile_dpower": ["compile", "examples/power.anf", "--entry", "dpower", "--args", "3.0",
                           "--dump-dir", "dpower_dumps"],
        "compile_types": ["compile", "examples/hof.anf", "--args", "f64"],
        "fmt_hof": ["fmt", "examples/hof.anf"],
        "fmt_closures": ["fmt", "examples/closures.anf"],
        "dot_stdout": ["dot", "examples/fibonacci.anf"],
        "dot_file": ["dot", "examples/fibonacci.anf", "-o", "fib.dot"],
        "dot_bad_ext": ["dot", "examples/fibonacci.anf", "-o", "fib.txt"],
        "no_command": [],
        "unknown_command": ["frobnicate", "examples/hof.anf"],
        "unknown_option": ["run", "--frob", "examples/hof.anf"],
        "missing_file_arg": ["run"],
        "missing_file": ["run", "no_such_file.anf"],
        "fmt_extra_arg": ["fmt", "examples/hof.anf", "extra"],
        "bad_literal_arg": ["run", "examples/hof.anf", "(1,"],
    }
    if shutil.which("dot"):
        calls["dot_svg"] = ["dot", "examples/fibonacci.anf", "-o", "fib.svg"]
    for command in COMMANDS:
        calls[f"help_{command}"] = [command, "--help"]
    calls["help"] = ["--help"]
    for name in BAD_PROGRAMS:
        calls[f"bad_{name}"] = ["run", f"{name}.anf"]
    return calls


@pytest.fixture(scope="module")
def results(work: Path) -> dict[str, Result]:
    """Every invocation, run once in-process."""
    return {name: anfir_in_process(args, work) for name, args in _invocations().items()}


@pytest.fixture(scope="module")
def subprocess_results(work: Path, results: dict[str, Result]) -> dict[str, Result]:
    """The :data:`SUBPROCESS` invocations as real processes, started concurrently."""
    calls = _invocations()
    with ThreadPoolExecutor(max_workers=len(SUBPROCESS)) as pool:
        futures = {name: pool.submit(anfir_cli, calls[name], work) for name in SUBPROCESS}
        return {name: future.result() for name, future in futures.items()}


def _normal(text: str, timings: bool) -> str:
    """Newlines as text-mode pipes give them; timings (with their padding) blanked."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return re.sub(r" *\d+\.\d+", " T", text) if timings else text


@pytest.mark.parametrize("name", SUBPROCESS)
def test_python_m_anfir_behaves_like_main(name: str, results: dict[str, Result],
                                          subprocess_results: dict[str, Result]) -> None:
    real, inproc = subprocess_results[name], results[name]
    assert real.returncode == inproc.returncode, real.stderr
    assert "Traceback" not in real.stderr
    timings = name == "compile_time"
    assert _normal(real.stdout, timings) == _normal(inproc.stdout, timings)
    assert _normal(real.stderr, False) == _normal(inproc.stderr, False)


def ok(proc: Result) -> str:
    """stdout of a successful run (the assertion shows stderr otherwise)."""
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    return proc.stdout


def usage_error(proc: Result) -> str:
    assert proc.returncode == 2, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr and proc.stderr.strip()
    return proc.stderr


def user_error(proc: Result) -> str:
    assert proc.returncode == 1, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    return proc.stderr


# -- run -------------------------------------------------------------------------------
def test_run_examples(results: dict) -> None:
    assert ok(results["run_fib"]) == "55\n"
    assert ok(results["run_paper"]) == "4.0\n"
    assert ok(results["run_hof"]) == "25.0\n"
    assert ok(results["run_closure"]) == "(4, 5)\n"
    assert ok(results["run_closures_main"]) == "(6, 11, 4, 16, 30, 13, 36.0)\n"
    assert ok(results["run_loop_long"]) == "5000050000\n"
    assert ok(results["run_negative_arg"]) == "-8.0\n"
    assert ok(results["run_literal_args"]) == '(3.5, "hi!", false, None)\n'


def test_run_entry_option_may_come_anywhere(results: dict) -> None:
    # The spec's synopsis puts options between FILE and the ARGs.
    assert ok(results["run_entry_first"]) == "55\n"
    assert ok(results["run_entry_between"]) == "55\n"
    assert ok(results["run_entry_after"]) == "55\n"


def test_run_entry_choice(results: dict) -> None:
    err = usage_error(results["run_ambiguous"])
    assert "--entry" in err and "power" in err and "dpower" in err
    err = usage_error(results["run_no_such_entry"])
    assert "nope" in err and "dpower" in err


def test_run_npy_arguments(results: dict, work: Path) -> None:
    w1, w2, x, y = (np.load(work / f"{n}.npy") for n in ("w1", "w2", "x", "y"))
    expected = float(np.sum((np.tanh(x @ w1) @ w2 - y) ** 2) / 2)
    assert float(ok(results["run_npy"])) == pytest.approx(expected, rel=1e-12)
    assert "notes.npy" in usage_error(results["run_bad_npy"])
    assert "gone.npy" in usage_error(results["run_missing_npy"])


# -- grad ------------------------------------------------------------------------------
def test_grad_examples(results: dict) -> None:
    assert ok(results["grad_options_first"]) == "12.0\n"
    assert ok(results["grad_two"]) == "(1.0, 0.0)\n"


def test_grad_spec_synopsis(results: dict) -> None:
    # `anfir grad FILE [--entry NAME] [--wrt I] [ARG ...]`, as README and the spec show it.
    assert ok(results["grad_spec_form"]) == "12.0\n"


def test_grad_of_tensors(results: dict, work: Path) -> None:
    out = ok(results["grad_npy"])
    assert out.startswith("(Tensor[f64, (3, 4)](") and "Tensor[f64, (4, 2)](" in out


def test_grad_errors(results: dict) -> None:
    err = user_error(results["grad_int_arg"])
    assert "gradient error" in err and "integer or boolean" in err
    assert "--wrt" in usage_error(results["grad_bad_wrt"])
    assert "arguments" in usage_error(results["grad_no_args"])


def test_grad_writes_a_loadable_ir(results: dict, work: Path) -> None:
    assert ok(results["grad_o"]) == ""
    text = (work / "dpower_cli.ir").read_text(encoding="utf-8")
    assert text.startswith("# IR entry: @")
    module = anfir.load(str(work / "dpower_cli.ir"))
    assert anfir.run(module.entry, 2.0, 3) == 12.0
    again = anfir_in_process(["run", "dpower_cli.ir", "2.0", "3"], work)
    assert ok(again) == "12.0\n"


# -- compile ---------------------------------------------------------------------------
def test_compile_time_prints_the_phase_table(results: dict) -> None:
    out = ok(results["compile_time"])
    assert out.startswith("compiled @mlp_loss: ")
    rows = {line.split()[0]: line.split()[-1] for line in out.split("\n")[1:] if line.strip()}
    for phase in PHASES + ("total",):
        assert phase in rows, f"no row for {phase}:\n{out}"
        float(rows[phase])
    assert list(rows).index("parse") < list(rows).index("validate") < list(rows).index("total")


def test_compile_writes_numbered_dumps(results: dict, work: Path) -> None:
    out = ok(results["compile_dumps"])
    assert "result: 25.0" in out
    names = sorted(p.name for p in (work / "hof_dumps").iterdir())
    irs = [n for n in names if n.endswith(".ir")]
    assert irs[0] == "00_parse.ir" and irs[-1].endswith("_validate.ir")
    assert [n[:2] for n in irs] == [f"{i:02d}" for i in range(len(irs))]
    assert {n[3:-3] for n in irs} >= set(PHASES)
    assert all(n[:-3] + ".dot" in names for n in irs)
    for name in irs:
        head = (work / "hof_dumps" / name).read_text(encoding="utf-8").split("\n", 2)
        assert head[0] == "# IR entry: @hof" and head[1] == f"# Phase: {name[:-3]}", name


def test_compile_with_grad_inside(results: dict, work: Path) -> None:
    out = ok(results["compile_dpower"])
    assert "result: 27.0" in out
    last = sorted((work / "dpower_dumps").glob("*_optimize.ir"))[-1]
    assert ok(anfir_in_process(["run", str(last.relative_to(work)), "3.0"], work)) == "27.0\n"


def test_compile_with_types(results: dict) -> None:
    out = ok(results["compile_types"])
    assert out.startswith("compiled @hof: ") and "result:" not in out


# -- fmt and dot -----------------------------------------------------------------------
@pytest.mark.parametrize("key,example", [("fmt_hof", "hof.anf"), ("fmt_closures", "closures.anf")])
def test_fmt_prints_canonical_text_that_parses_back(results: dict, key: str, example: str) -> None:
    text = ok(results[key])
    assert "def " in text and "let %1 = " in text
    original = anfir.load(str(EXAMPLES / example))
    reparsed = anfir.parse(text, example)
    assert anfir.to_text(reparsed) == text
    assert list(reparsed.graphs) == list(original.graphs)


def test_dot(results: dict, work: Path) -> None:
    source = ok(results["dot_stdout"])
    assert source.startswith("digraph") and "@fibonacci" in source and "cluster" in source
    assert ok(results["dot_file"]) == ""
    assert (work / "fib.dot").read_text(encoding="utf-8") == source
    assert ".txt" in usage_error(results["dot_bad_ext"])


@pytest.mark.needs_dot
@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_dot_renders_svg(results: dict, work: Path) -> None:
    ok(results["dot_svg"])
    assert "<svg" in (work / "fib.svg").read_text(encoding="utf-8")


# -- help and usage errors -------------------------------------------------------------
@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_an_example(results: dict, command: str) -> None:
    out = ok(results[f"help_{command}"])
    assert f"usage: anfir {command}" in out
    assert re.search(rf"^examples?:\n\s+anfir {command} \S+", out, re.M), out


def test_top_level_help_lists_commands(results: dict) -> None:
    out = ok(results["help"])
    for command in COMMANDS:
        assert re.search(rf"^\s+{command}\s", out, re.M)
    assert re.search(r"^examples?:", out, re.M)


@pytest.mark.parametrize("key", ["unknown_command", "unknown_option", "missing_file_arg",
                                 "fmt_extra_arg", "missing_file"])
def test_bad_arguments_exit_2(results: dict, key: str) -> None:
    usage_error(results[key])


def test_no_command_prints_usage_and_exits_2(results: dict) -> None:
    result = results["no_command"]
    assert result.returncode == 2
    assert "usage: anfir" in result.stdout + result.stderr


def test_a_bad_literal_argument_is_a_usage_error(results: dict) -> None:
    # A command-line argument is part of the command, not of the program: exit 2,
    # naming the argument as typed (not the wrapper the CLI parses it in).
    err = usage_error(results["bad_literal_arg"])
    assert "cannot read the argument '(1,'" in err and "__arg__" not in err


def test_missing_file_is_named(results: dict) -> None:
    assert "no_such_file.anf" in usage_error(results["missing_file"])


# -- errors in programs ----------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(BAD_PROGRAMS))
def test_user_error_is_located(results: dict, name: str) -> None:
    _, needle, where = BAD_PROGRAMS[name]
    err = user_error(results[f"bad_{name}"])
    assert needle in err, err
    head = LOCATED.search(err)
    assert head, f"no file:line:col: kind error: head in\n{err}"
    path, line, col = head.group(0).split(":")[:3]
    assert path.endswith(f"{name}.anf"), err
    if where is not None:
        assert (int(line), int(col)) == where, err
    if not BAD_PROGRAMS[name][0].strip():
        return  # an empty file has no line to show
    # The excerpt: the offending line, then a caret under the column.
    lines = err.split("\n")
    carets = [i for i, text in enumerate(lines) if text.strip() == "^"]
    assert carets, err
    caret_col = lines[carets[0]].index("^") - 4 + 1
    assert caret_col == int(col), err


def test_every_dump_of_a_compile_runs_its_entry_by_default(tmp_path):
    # Compiling dpower (not main, not the only definition): every phase's dump
    # names @dpower as its entry, and `anfir run` of any dump — the parse dump
    # included, whose global names are not resolved yet — runs it.
    dumps = tmp_path / "d"
    result = anfir_in_process(["compile", str(EXAMPLES / "power.anf"), "--entry", "dpower",
                               "--args", "3.0", "--dump-dir", str(dumps)], tmp_path)
    assert result.returncode == 0, result.stderr
    irs = sorted(dumps.glob("*.ir"))
    assert len(irs) == 7
    for ir in irs:
        assert ir.read_text(encoding="utf-8").startswith("# IR entry: @dpower\n"), ir.name
        ran = anfir_in_process(["run", str(ir), "2.0"], tmp_path)
        assert (ran.returncode, ran.stdout.strip()) == (0, "12.0"), (ir.name, ran.stderr)


def test_running_a_parse_dump_from_the_api_says_it_is_unresolved(tmp_path):
    dumps = tmp_path / "d"
    anfir.compile(str(EXAMPLES / "power.anf"), entry="dpower", args=[3.0],
                  dump_dir=str(dumps))
    module = anfir.load(str(dumps / "00_parse.ir"))
    assert module.entry_name() == "dpower"
    with pytest.raises(anfir.AnfirError, match="unresolved name 'grad'.*before the resolve phase"):
        anfir.run(module.entry, 3.0)


# -- results of any depth, output paths that cannot be written (issue 2) ---------------
DEPTH = 3000


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
    status, out, err = run_in_process(["run", str(prog), "7"], Path.cwd())
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
    status, _, err = run_in_process(args, Path.cwd())
    assert status == 2, err
    assert f"anfir {argv[0]}: usage error: cannot use" in err
    assert "internal error" not in err and "Traceback" not in err


# -- every example of --help runs, every argument has a help line (issue 5) -------------
@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    return tmp_path


def _help(command: str) -> str:
    status, out, err = run_in_process([command, "--help"], ROOT)
    assert status == 0, err
    return out


def _help_examples(text: str) -> list[str]:
    tail = re.split(r"^examples?:\n", text, flags=re.M)[1]
    return [line.split("#")[0].strip() for line in tail.split("\n") if line.startswith("  anfir ")]


@pytest.mark.parametrize("command", list(COMMANDS) + [None], ids=lambda c: c or "anfir")
def test_every_help_example_runs(command: str | None, scratch: Path) -> None:
    np.save(scratch / "w1.npy", np.full((3, 4), 0.1))
    np.save(scratch / "w2.npy", np.full((4, 2), 0.2))
    np.save(scratch / "x.npy", np.ones((5, 3)))
    np.save(scratch / "y.npy", np.zeros((5, 2)))
    if command is None:
        status, text, err = run_in_process(["--help"], ROOT)
        assert status == 0, err
    else:
        text = _help(command)
    examples = _help_examples(text)
    assert examples, text
    for example in examples:
        if shutil.which("dot") is None and re.search(r"-o \S+\.(svg|png)", example):
            continue
        if (example.startswith(("anfir export ", "anfir import "))
                and importlib.util.find_spec("onnx") is None):
            continue  # needs the [onnx] extra
        status, out, err = run_in_process(shlex.split(example)[1:], scratch)
        assert status == 0, f"{example}\n{err}"
        assert out or "-o" in example, example


@pytest.mark.parametrize("command", COMMANDS)
def test_every_argument_has_a_help_line(command: str) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")  # noqa: SLF001
    for action in sub.choices[command]._actions:  # noqa: SLF001
        assert action.help, f"anfir {command}: {action.option_strings or action.dest} has no help"

"""Fuzzing (issue 10): mutated programs and dumps give success or located AnfirErrors.

Valid inputs — the examples, programs drawn by tests/programs.py, and dumps
of both — are mutated (bytes deleted, duplicated, replaced, and hostile
snippets inserted: huge integers and powers, NULs, deep nesting, absolute
imports, internal primitives, cyclic nodes, huge shapes...).  Each mutant is
parsed or loaded, printed back, compiled and run.  The property: nothing but
an :class:`~anfir.errors.AnfirError` comes out, with a location whenever the
input has a place to point at; no phase hangs (a time bound per case) and
memory stays bounded (the process's peak resident size grows little).

Running a mutant may legitimately never end (a mutated loop counter): a run
that outlives its short budget *inside the evaluator's loop* is inconclusive;
one stuck anywhere else (a transformation the evaluator started) is a hang.
A recursion that never ends meets a lowered depth limit.
"""

from __future__ import annotations

import os
import re
import tempfile
import traceback
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import anfir
import anfir.limits as limits
import programs
from anfir.errors import AnfirError, UsageError
from anfir.grammar.ir_loader import load_ir_text
from anfir.grammar.parser import parse_module
from anfir.grammar.resolve import resolve_module
from bounded import Hang, peak_rss_mb, within

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.anf"))

CASE_SECONDS = 20.0
"""Parsing, loading, printing and compiling one mutant: far more than they need."""
RUN_SECONDS = 1.0
"""Running one definition of a mutant (a mutated loop may run for ever)."""
MEMORY_GROWTH_MB = 400
"""How much one case may raise the process's peak resident size."""

EXAMPLES_PER_RUN = int(os.environ.get("ANFIR_FUZZ_EXAMPLES", "0")) or None
"""``ANFIR_FUZZ_EXAMPLES=2000 pytest tests/test_fuzz.py`` fuzzes longer, with fresh
random cases each run; by default a fixed set of 30 cases per property runs."""

FUZZ = settings(max_examples=EXAMPLES_PER_RUN or 30, deadline=None,
                derandomize=EXAMPLES_PER_RUN is None, database=None,
                suppress_health_check=list(HealthCheck))

ANF_SNIPPETS = [
    "10 ** 10 ** 10", "9" * 5000, "\0", "(" * 300, ")" * 3, "lambda (x) ", " end", "let v = ",
    " in ", "if ", " then ", " else ", "grad(", "jvp(", "value_and_grad(", "main", "main(1.0)",
    'import "/etc/passwd"\n', 'import "../../x.anf"\n', 'import "examples/hof.anf"\n',
    "env_getitem(", "J(", "gadd(", "not ", " and ", " or ", "1e999", "-", "**", "@", "[0]",
    "[99999999999999999999]", ",", '"', "#", "\n", ": f64[N, *]", ": f64[99999999999999999999]",
    "def main() = ", "def f(x) = f(x)\n", "x", "%1", "é", "\ufeff", "1.0", "2", "(1, 2.0)",
    "array((1.0, 2.0))", "ones((99999, 99999))", "zeros((3000000000,))", "reshape(",
    "sum(", "cast(", '"f16"', "None", "true", "x * x", "lambda () 1 end", "partial(",
]
IR_SNIPPETS = [
    "%1", "%2", "$(@main:%1)", "@main", "@nowhere", "Tensor[f64, (4294967296, 4294967296)](0.0)",
    "Tensor[i8, (1,)]([300])", "Tensor[f64, (2,)]([1.0])", "Scalar[u8](-1)", "Symbol(__import__)",
    "Symbol(env_getitem)", "DType(O)", "Closure(@main, (1, 2))", "<f64[10**10**10]>",
    "<f64[N**99]>", 'npz["t0"]', "9" * 5000, "# f:1:1 (" * 50, "subgraph @x() {\n", "}\n",
    "return ", " = ", "(", ")", ",", "\0", "attr x = 1\n", "param ", "<Func @main>",
    "<Tuple(<Int64>)>", "<Func grad(@main, 0)>", "J", "grad", "add", "switch", "make_tuple",
    "tuple_getitem", "1", "-1", "1.5", "inf", "nan", "true", '"s"', "None", "Key(x)",
    "GradEnv(Key(a): 1.0)", "Partial(add, 1)", "# IR entry: @nowhere\n", "# Definitions: a=@b\n",
    "\n", ": (<Float64>) -> (<Float64>)",
]


ANF_TERMS = [
    "1", "0", "-1", "2.5", "x", "y", "main", "f", "g", "loop", "10 ** 10 ** 10", "9" * 5000,
    "(1, 2.0)", "None", '"s"', "true", "lambda (z) z end", "env_getitem(1, 2, 3)", "grad(main)",
    "jvp(main)", "grad(lambda (p) p * main(p, p) end)", "ones((99999, 99999))", "not 1.5",
    "1 and 2", "(lambda (a) a(a) end)(lambda (a) a(a) end)", "array(((1.0, 2.0), (3.0,)))",
    "sum(1)", "shape(1.0)", "reshape(ones(4), (3, 3))", "x[5]", "x(1)", "make_tuple()",
]
"""Whole expressions, to put in the place of one token (the result often parses)."""
IR_TERMS = ["%1", "%2", "%3", "%4", "$(@main:%1)", "@main", "1", "-1", "2.5", "inf", "None",
            "Tensor[f64, (2,)]([1.0, 2.0])", "make_tuple", "switch", "J", "grad", "add",
            "env_getitem", "Symbol(x)", "Closure(@main, ())", "Partial(add, 1)", "true"]
_ATOM = re.compile(r"(?<![\w%@$.\"])(%?[A-Za-z_]\w*|\d[\w.]*)")
_KEYWORDS = {"def", "lambda", "let", "in", "end", "if", "then", "else", "and", "or", "not",
             "import", "subgraph", "return", "param", "attr", "abstract", "parent"}


QUIET_ALARMS = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
"""An alarm that lands in a garbage-collector callback is dropped there (and fired
again, see bounded.within); pytest would warn about the dropped one."""


@st.composite
def mutants(draw: Any, seeds: st.SearchStrategy[str], snippets: list[str],
            terms: list[str]) -> str:
    """A seed text with one to four mutations: text spliced (inserted, deleted,
    duplicated, replaced) or, more often, one name or number swapped for another
    of the text or for a whole term (which keeps many mutants parseable)."""
    text = draw(seeds)
    for _ in range(draw(st.integers(1, 4))):
        n = len(text)
        at = draw(st.integers(0, max(n, 1) - 1)) if n else 0
        kind = draw(st.sampled_from(["insert", "delete", "duplicate", "replace",
                                     "token", "token", "token", "term", "term"]))
        if kind in ("token", "term"):
            spans = [m.span() for m in _ATOM.finditer(text) if m.group() not in _KEYWORDS]
            if spans:
                start, end = spans[draw(st.integers(0, len(spans) - 1))]
                if kind == "term":
                    new = draw(st.sampled_from(terms))
                else:
                    other = spans[draw(st.integers(0, len(spans) - 1))]
                    new = text[other[0]:other[1]]
                text = text[:start] + new + text[end:]
        elif kind == "insert":
            text = text[:at] + draw(st.sampled_from(snippets)) + text[at:]
        elif kind == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 40)):]
        elif kind == "duplicate":
            piece = text[at:at + draw(st.integers(1, 200))]
            where = draw(st.integers(0, n))
            text = text[:where] + piece + text[where:]
        else:
            char = draw(st.sampled_from(list("()[],:=%@$#\"\\{}<>*+-/ \n0123456789xyzé\0")))
            text = text[:at] + char + text[at + 1:]
    return text


# -- seeds -------------------------------------------------------------------------------------
def _example_texts() -> list[str]:
    return [path.read_text(encoding="utf-8") for path in EXAMPLES]


_GENERATED = st.one_of(
    programs.single_def(programs.COMPILE.but(callees=("helper",)), 3).map(
        lambda p: p.text + programs.HELPERS),
    programs.let_chains(programs.ROUNDTRIP, lets=(1, 4)).map(lambda p: p.text),
    programs.modules(programs.PIPELINE, [programs.Def("g", ("a",), 2),
                                         programs.Def("main", ("x", "y"), 2, ("g",))]).map(
        lambda p: p.text),
)
ANF_SEEDS = st.one_of(st.sampled_from(_example_texts()), _GENERATED)


@lru_cache(maxsize=1)
def _dump_texts() -> tuple[str, ...]:
    """Dumps of every example as parsed, and of one compilation phase by phase."""
    texts = []
    for path in EXAMPLES:
        module = anfir.load(str(path))
        texts.append(anfir.dump_ir(module, phase="00_parse"))
    result = anfir.passes.pipeline.compile_program(str(ROOT / "examples" / "power.anf"),
                                                   entry="dpower", args=[3.0])
    texts.append(anfir.dump_ir(result.graph, phase="05_optimize"))
    with tempfile.TemporaryDirectory() as folder:
        anfir.compile(anfir.load(str(ROOT / "examples" / "closures.anf")), entry="main",
                      args=[], dump_dir=folder)
        for name in ("02_specialize.ir", "03_ad.ir"):
            texts.append((Path(folder) / name).read_text(encoding="utf-8"))
    return tuple(texts)


# -- the property --------------------------------------------------------------------------------
def _check_error(error: BaseException, text: str, located: bool = True) -> None:
    """``error`` is an AnfirError, located when ``located`` (usage errors need no place)."""
    if isinstance(error, Hang):
        raise AssertionError(f"hang on:\n{text[:3000]!r}") from error
    if not isinstance(error, AnfirError):
        raise AssertionError(f"{type(error).__name__} (not an AnfirError) on:\n{text[:3000]!r}"
                             ) from error
    if located and not isinstance(error, UsageError):
        assert error.loc is not None, f"unlocated {error.render()!r} on:\n{text[:3000]!r}"
        assert error.loc.line >= 1, error.render()


def _inside_the_evaluator(error: Hang) -> bool:
    """Whether the run was interrupted in the evaluator's own loop (or a primitive it
    called), not in a transformation: then it may simply be a loop that never ends."""
    frames = traceback.extract_tb(error.__traceback__)
    deepest_vm = max((i for i, f in enumerate(frames) if f.filename.endswith("eval/vm.py")),
                     default=None)
    if deepest_vm is None:
        return False
    deeper = [f.filename for f in frames[deepest_vm + 1:] if "anfir" in f.filename]
    return all(part in name for name in deeper for part in ("anfir",)) and not any(
        marker in name for name in deeper
        for marker in ("autodiff", "passes", "infer", "grammar", "ir/manager", "ir/clone"))


def _run_definitions(module: Any, text: str, definitions: Optional[list] = None,
                     located: bool = True) -> None:
    graphs = definitions if definitions is not None else list(module.graphs.values())
    for graph in graphs[:3]:
        args = [1.5 if i % 2 == 0 else 3 for i in range(len(graph.parameters))]
        try:
            with within(RUN_SECONDS):
                anfir.run(graph, *args)
        except Hang as hang:
            if not _inside_the_evaluator(hang):
                raise
        except Exception as error:  # noqa: BLE001 - checked
            _check_error(error, text, located)


def _bounded_case(text: str, body: Callable[[], None]) -> None:
    before = peak_rss_mb()
    depth = limits.MAX_CALL_DEPTH
    limits.MAX_CALL_DEPTH = 20_000
    try:
        with within(CASE_SECONDS):
            body()
    except Hang as hang:
        raise AssertionError(f"hang on:\n{text[:3000]!r}") from hang
    finally:
        limits.MAX_CALL_DEPTH = depth
    grown = peak_rss_mb() - before
    assert grown < MEMORY_GROWTH_MB, f"memory grew by {grown:.0f} MiB on:\n{text[:3000]!r}"


def check_anf(text: str, compile_too: bool) -> None:
    def body() -> None:
        try:
            module = parse_module(text, "fuzz.anf")
        except Exception as error:  # noqa: BLE001 - checked
            _check_error(error, text)
            return
        for printer in (anfir.to_text, anfir.dump_ir):
            try:
                printer(module)
            except Exception as error:  # noqa: BLE001 - checked
                _check_error(error, text, located=False)
        _run_definitions(module, text)
        if compile_too and module.graphs:
            name = next(iter(module.graphs))
            args = [1.5] * len(module.graphs[name].parameters)
            try:
                compiled = anfir.compile(module, entry=name, args=args)
            except Exception as error:  # noqa: BLE001 - checked
                _check_error(error, text)
                return
            _run_definitions(None, text, [compiled])

    _bounded_case(text, body)


def check_ir(text: str) -> None:
    def body() -> None:
        try:
            module = load_ir_text(text, "fuzz.ir")
            if module.phase is not None:
                resolve_module(module)  # as the command line does for a dump
        except Exception as error:  # noqa: BLE001 - checked
            _check_error(error, text)
            return
        try:
            anfir.dump_ir(module)
        except Exception as error:  # noqa: BLE001 - checked
            _check_error(error, text, located=False)
        entry = module.ir_entry or (next(iter(module.graphs.values()), None))
        if entry is not None:
            # (A node whose location comment was cut off has no place to point at.)
            _run_definitions(module, text, [entry], located=False)

    _bounded_case(text, body)


@QUIET_ALARMS
@FUZZ
@given(text=mutants(ANF_SEEDS, ANF_SNIPPETS, ANF_TERMS), compile_too=st.booleans())
def test_mutated_programs_give_located_errors(text: str, compile_too: bool) -> None:
    check_anf(text, compile_too)


@QUIET_ALARMS
@FUZZ
@given(data=st.data())
def test_mutated_dumps_give_located_errors(data: st.DataObject) -> None:
    text = data.draw(mutants(st.sampled_from(_dump_texts()), IR_SNIPPETS, IR_TERMS))
    check_ir(text)


@pytest.mark.parametrize("text", [
    "def main() = 10 ** 10 ** 10",
    'import "/dev/zero"\ndef main() = 1',
    "def g(x, y) = x * y + grad(g, 0, 1)(2.0, 0.5)",
    "def f(n) = 1 + f(n + 1)\ndef main() = f(0)",
    "def main() = " + "(" * 5000 + "1" + ")" * 5000,
])
def test_the_fuzz_property_holds_for_the_issues_own_cases(text: str) -> None:
    check_anf(text, compile_too=True)


def test_the_fuzz_property_holds_for_a_cyclic_dump() -> None:
    check_ir("subgraph @main() {\n  %1 = add(%1, 1)\n  return %1\n}\n")


# -- .mindir files (issue 29) --------------------------------------------------------------------
MINDIR_FIXTURES = ROOT / "tests" / "mindir_fixtures"


def check_mindir(data: bytes, inputs: list[Any]) -> None:
    """A mutated ``.mindir``: imported (bytes), printed and run on the fixture's inputs;
    only located AnfirErrors, in bounded time and memory."""
    text = repr(data[:200])

    def body() -> None:
        try:
            module = anfir.import_mindir(data)
        except Exception as error:  # noqa: BLE001 - checked
            _check_error(error, text)
            return
        try:
            anfir.to_text(module)
        except Exception as error:  # noqa: BLE001 - checked
            _check_error(error, text, located=False)
        try:
            with within(RUN_SECONDS):
                anfir.run(module.entry, *inputs)
        except Hang as hang:
            if not _inside_the_evaluator(hang):
                raise
        except Exception as error:  # noqa: BLE001 - checked
            _check_error(error, text, located=False)

    _bounded_case(text, body)


@QUIET_ALARMS
@FUZZ
@given(data=st.data())
def test_mutated_mindir_files_give_located_errors(data: st.DataObject) -> None:
    import numpy as np

    name = data.draw(st.sampled_from(["dense_relu", "control_flow", "while_grad"]))
    blob = bytearray((MINDIR_FIXTURES / f"{name}.mindir").read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(blob) - 1))
        kind = data.draw(st.sampled_from(["byte", "byte", "delete", "duplicate"]))
        if kind == "byte":
            blob[at] = data.draw(st.integers(0, 255))
        elif kind == "delete":
            del blob[at:at + data.draw(st.integers(1, 16))]
        else:
            blob[at:at] = blob[at:at + data.draw(st.integers(1, 64))]
        if not blob:
            blob = bytearray(b"\0")
    arrays = np.load(MINDIR_FIXTURES / f"{name}.npz")
    inputs = [arrays[f"in{k}"] for k in range(sum(1 for f in arrays.files if f.startswith("in")))]
    check_mindir(bytes(blob), inputs)

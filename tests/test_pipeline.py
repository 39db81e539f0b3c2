"""The compile pipeline end to end: phases, dumps (loadable, renderable,
deterministic), results equal to the parsed program's, errors, validation."""

from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import anfir
import programs
from anfir.abstract.values import AScalar
from anfir.errors import AnfirError, IRConsistencyError
from anfir.ir import CNode, FuncGraph, Location, Manager
from anfir.passes.pipeline import PHASES, Phase, Program, compile_program, sanitize_file_part
from anfir.passes.validate import validate
from anfir.primitives import META_FUNCTIONS, PRIMITIVES as P
from anfir.runtime_values import Symbol
from example_args import resnet18_args, transformer_args
from spec_examples import PAPER as MINDIR, HOF, FIBONACCI, CLOSURE, POWER, MLP

PHASE_NAMES = ["parse", "resolve", "specialize", "ad", "inline", "optimize", "validate"]
"""The phases every program is dumped after (``loops``, before ``ad``, only when it rewrote
a loop: Phase.shown)."""
DUMPED = [p for p in PHASES if p.shown is None]
EXAMPLES_DIR = Path(__file__).resolve().parents[1] / "examples"







_rng = np.random.default_rng(0)
_MLP_ARGS = (_rng.normal(size=(3, 4)), _rng.normal(size=(4, 2)), _rng.normal(size=(5, 3)),
             _rng.normal(size=(5, 2)))
_MLP2_ARGS = tuple(_rng.normal(size=s) for s in [(3, 4), (4,), (4, 2), (2,), (5, 3), (5, 2)])

# (name, text, entry, args, expected result)
SPEC_EXAMPLES: list[tuple[str, str, Any, tuple, Any]] = [
    ("mindir", MINDIR, None, (3.0, 2.0), 2.0),
    ("hof", HOF, None, (2.0,), 25.0),
    ("fibonacci", FIBONACCI, None, (10,), 55),
    ("closure", CLOSURE, "ms_closure", (), (4, 5)),
    ("power", POWER, "power", (2.0, 3), 8.0),
    ("dpower", POWER, "dpower", (2.0,), 12.0),
    ("mlp", MLP, None, _MLP_ARGS, None),
]


def same(a: Any, b: Any) -> bool:
    """Equal results: tuples elementwise, arrays by value, nan equal to nan."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if isinstance(x, tuple) or isinstance(y, tuple):
            if not (isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y)):
                return False
            stack.extend(zip(x, y))
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if not np.allclose(x, y, rtol=1e-12, atol=0, equal_nan=True):
                return False
        elif isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
            continue
        elif x != y or type(x) is not type(y) and not (isinstance(x, float) and isinstance(y, float)):
            return False
    return True


def run_dump(path: Path, args: tuple, entry: Any = None) -> Any:
    """Load an ``.ir`` dump and run its entry (``entry`` in a whole-module dump)."""
    module = anfir.load(str(path))
    if path.name.startswith("00_"):
        # The parse dump shows names unresolved: re-run the resolve phase on it.
        from anfir.grammar.resolve import resolve_module

        module = resolve_module(module) or module
    if entry is not None and entry in module.graphs:
        graph = module[entry]
    else:
        graph = getattr(module, "ir_entry", None) or module.entry
    return anfir.run(graph, *args)


def write_source(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.anf"
    path.write_text(text, encoding="utf-8")
    return path


# -- the phase list ------------------------------------------------------------------
def test_phases_are_the_documented_ordered_list() -> None:
    assert [p.name for p in DUMPED] == PHASE_NAMES
    assert [p.name for p in PHASES] == [*PHASE_NAMES[:3], "loops", *PHASE_NAMES[3:]]
    assert all(isinstance(p, Phase) and p.doc for p in PHASES)


def test_sanitize_file_part() -> None:
    assert sanitize_file_part("../../etc/passwd") == "etc_passwd"
    assert sanitize_file_part("✓ my pass") == "my_pass"
    assert sanitize_file_part("...") == "phase"


# -- spec examples -------------------------------------------------------------------
def check_compile(source: Path, entry: Any, args: tuple, dumps: Path) -> Any:
    """Compile ``source`` with dumps and check the result and every dump against
    the parsed program; return the reference result."""
    parsed = anfir.load(str(source))
    reference = anfir.run(parsed[parsed.entry_name(entry)], *args)
    result = compile_program(str(source), entry=entry, args=args, dump_dir=dumps)
    assert same(anfir.run(result.graph, *args), reference)
    stems = [f"{i:02d}_{n}" for i, n in enumerate(PHASE_NAMES)]
    for stem in stems:
        assert (dumps / f"{stem}.ir").is_file() and (dumps / f"{stem}.dot").is_file()
    listed = sorted(p.name for p in dumps.iterdir() if p.suffix == ".ir")
    assert listed == [f"{s}.ir" for s in stems]  # `ls` order is run order
    assert [Path(f).name for f in result.dump_files if f.endswith(".ir")] == listed
    for stem in stems:
        ir = dumps / f"{stem}.ir"
        text_ir = ir.read_text(encoding="utf-8")
        assert f"# Phase: {stem}" in text_ir and "\r" not in text_ir
        assert same(run_dump(ir, args, entry), reference), stem
    # Source locations survive every phase.
    assert f"{source.name}:" in (dumps / "05_optimize.ir").read_text(encoding="utf-8")
    assert set(result.timings) == set(PHASE_NAMES)
    assert all(t >= 0 for t in result.timings.values())
    return reference


@pytest.mark.parametrize("name,text,entry,args,expected", SPEC_EXAMPLES, ids=[e[0] for e in SPEC_EXAMPLES])
def test_spec_example_compiles_with_loadable_dumps(tmp_path: Path, name: str, text: str, entry: Any,
                                                   args: tuple, expected: Any) -> None:
    reference = check_compile(write_source(tmp_path, name, text), entry, args, tmp_path / "dumps")
    if expected is not None:
        assert same(reference, expected)


# (file in examples/, entry, args, expected result or None)
EXAMPLE_FILE_CASES: list[tuple[str, Any, tuple, Any]] = [
    ("closure.anf", "ms_closure", (), (4, 5)),
    ("closures.anf", "main", (), None),
    ("closures.anf", "pick", (True, 3), 30),
    ("closures.anf", "scaled_square", (2.0,), 36.0),
    ("fibonacci.anf", "fibonacci", (10,), 55),
    ("hof.anf", "hof", (2.0,), 25.0),
    ("loop.anf", "sum_to", (100,), 5050),
    ("loop.anf", "halvings", (5.0,), None),
    ("loop.anf", "main", (), None),
    ("mlp.anf", "mlp_loss", _MLP_ARGS, None),
    ("mlp2.anf", "mlp2_step", _MLP2_ARGS, None),
    ("paper_lambda.anf", None, (5.0, 2.0), 4.0),
    ("power.anf", "power", (2.0, 3), 8.0),
    ("power.anf", "dpower", (2.0,), 12.0),
    ("transformer.anf", "encoder_block", transformer_args()[:2], None),
    ("transformer.anf", "block_grad", transformer_args(), None),
    ("resnet18.anf", "resnet18", resnet18_args()[:2], None),
]


@pytest.mark.parametrize("filename,entry,args,expected", EXAMPLE_FILE_CASES,
                         ids=[f"{c[0]}:{c[1]}" for c in EXAMPLE_FILE_CASES])
def test_example_file_compiles_with_loadable_dumps(tmp_path: Path, filename: str, entry: Any,
                                                   args: tuple, expected: Any) -> None:
    reference = check_compile(EXAMPLES_DIR / filename, entry, args, tmp_path / "dumps")
    if expected is not None:
        assert same(reference, expected)


def test_every_example_file_has_a_compile_case() -> None:
    files = {p.name for p in EXAMPLES_DIR.glob("*.anf")}
    assert files <= {c[0] for c in EXAMPLE_FILE_CASES}, "add the new examples to EXAMPLE_FILE_CASES"


@pytest.mark.needs_dot
@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_dumps_render_with_graphviz_and_are_deterministic(tmp_path: Path) -> None:
    source = write_source(tmp_path, "prog", FIBONACCI + "\n" + CLOSURE + "\n" + HOF)
    first = compile_program(str(source), entry="ms_closure", dump_dir=tmp_path / "a", fine_dumps=True)
    second = compile_program(str(source), entry="ms_closure", dump_dir=tmp_path / "b", fine_dumps=True)
    assert (tmp_path / "a" / "optimize" / "01_round.ir").read_bytes() == \
        (tmp_path / "b" / "optimize" / "01_round.ir").read_bytes()
    names = sorted(p.name for p in (tmp_path / "a").iterdir() if p.is_file())
    assert names == sorted(p.name for p in (tmp_path / "b").iterdir() if p.is_file())
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    for dot in sorted((tmp_path / "a").glob("*.dot")):
        out = subprocess.run(["dot", "-Tsvg", str(dot)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, (dot.name, out.stderr)
        assert "<svg" in out.stdout
    assert first.rule_counts == second.rule_counts


# -- the user's program is not touched ------------------------------------------------
def test_compile_never_mutates_the_users_module() -> None:
    module = anfir.parse(HOF + "\n" + CLOSURE)
    before = anfir.dump_ir(module)
    graphs = {name: g for name, g in module.graphs.items()}
    cg = anfir.compile(module, entry="hof", args=(2.0,))
    assert anfir.run(cg, 2.0) == 25.0
    assert anfir.dump_ir(module) == before
    assert module.graphs == graphs
    for g in module.graphs.values():  # no type was written into the user's nodes or constants
        assert all(n.abstract is None for n in g.nodes())
        assert all(i.abstract is None for n in g.nodes() for i in n.inputs)
    cg2 = anfir.compile(module["hof"], args=(1.0,))  # a FuncGraph is copied as well
    assert anfir.run(cg2, 1.0) == 16.0
    assert anfir.dump_ir(module) == before


def test_args_as_abstract_values_and_annotation_strings() -> None:
    module = anfir.parse("def f(x, y) = x * y + 1.0")
    by_value = anfir.compile(module, args=(2.0, 3.0))
    by_type = anfir.compile(module, args=("f64", AScalar("f64")))
    assert anfir.run(by_value, 2.0, 3.0) == anfir.run(by_type, 2.0, 3.0) == 7.0
    mlp = anfir.parse(MLP)
    typed = anfir.compile(mlp, args=("f64[3, 4]", "f64[4, 2]", "f64[5, 3]", "f64[5, 2]"))
    from_annotations = anfir.compile(mlp)
    expected = anfir.run(mlp.entry, *_MLP_ARGS)
    assert same(anfir.run(typed, *_MLP_ARGS), expected)
    assert same(anfir.run(from_annotations, *_MLP_ARGS), expected)


def test_optimizer_work_is_counted_and_shrinks_the_graph() -> None:
    text = """
    def main(x) =
      let k = (2.0 * 3.0) - 5.0 in
      let t = (x * k, x - 0.0) in
      let a = sin(t[0]) in
      let b = sin(t[0]) in
      if 1 < 2 then a + b + t[1] else x
    """
    result = compile_program(anfir.parse(text), args=(0.5,))
    counts = result.rule_counts
    # (``if 1 < 2`` is already decided by the specializer, which types only the
    # taken branch; the call of that branch is inlined.)
    for rule in ("fold_constant", "arithmetic_identity", "getitem_of_make_tuple", "cse", "inline"):
        assert counts.get(rule, 0) >= 1, (rule, counts)
    assert anfir.run(result.graph, 0.5) == anfir.run(anfir.parse(text).entry, 0.5)
    manager = result.program.manager
    assert list(manager.graphs) == [result.graph]  # branches inlined, dead ones gone
    callees = sorted(n.inputs[0].value.name for n in result.graph.nodes() if isinstance(n, CNode))
    assert callees == ["add", "add", "sin"]


def test_fine_dumps_one_per_round(tmp_path: Path) -> None:
    result = compile_program(anfir.parse(FIBONACCI), args=(6,), dump_dir=tmp_path, fine_dumps=True)
    rounds = sorted((tmp_path / "optimize").glob("*_round.ir"))
    assert rounds and rounds[0].name == "01_round.ir"
    assert [str(p) for p in rounds] == [f for f in result.dump_files if Path(f).parent.name == "optimize"]
    for path in rounds:
        assert run_dump(path, (6,)) == 8


def test_the_pipeline_reruns_from_any_dump(tmp_path: Path) -> None:
    source = write_source(tmp_path, "closure", CLOSURE)
    compile_program(str(source), entry="ms_closure", dump_dir=tmp_path / "first")
    for stem in ("01_resolve", "02_specialize", "04_inline", "05_optimize"):
        entry = "ms_closure" if stem == "01_resolve" else None  # a specialized dump names its entry
        again = compile_program(str(tmp_path / "first" / f"{stem}.ir"), entry=entry)
        assert anfir.run(again.graph) == (4, 5), stem


def test_extra_phase_gets_a_numbered_dump(tmp_path: Path) -> None:
    seen: list[str] = []

    def note(program: Program) -> Program:
        seen.append(program.last_phase)
        return program

    phases = list(PHASES)
    phases.insert(-1, Phase("my/pass", note, "a user's phase"))
    result = compile_program(anfir.parse(HOF), args=(1.0,), dump_dir=tmp_path, phases=phases)
    assert seen == ["05_optimize"]
    assert (tmp_path / "06_my_pass.ir").is_file() and (tmp_path / "07_validate.ir").is_file()
    assert anfir.run(result.graph, 1.0) == 16.0


# -- errors surface through compile, located --------------------------------------------
@pytest.mark.parametrize("text,args", [
    ("def f(x) = x + nowhere", (1.0,)),                 # unknown name
    ("def g(a, b) = a + b\ndef f(x) = g(x)", (1.0,)),    # wrong arity
    ("def f(x: f64[2, 3], y: f64[4]) = x + y", None),    # shape mismatch
    ("def f(x) = let k = 3 in k(x)", (1.0,)),           # calling a non-function
    ("", None),                                          # empty file
], ids=["unknown-name", "arity", "shape", "not-a-function", "empty"])
def test_compile_errors_are_located(tmp_path: Path, text: str, args: Any) -> None:
    source = write_source(tmp_path, "bad", text)
    with pytest.raises(AnfirError) as info:
        anfir.compile(str(source), entry="f" if text else None, args=args)
    err = info.value
    assert err.loc is not None and err.loc.file.endswith("bad.anf"), err.render()
    assert "bad.anf:" in err.render()


def test_unknown_entry_and_missing_file_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(AnfirError, match="no definition named"):
        anfir.compile(anfir.parse(HOF), entry="nope")
    with pytest.raises(AnfirError, match="no such file"):
        anfir.compile(str(tmp_path / "missing.anf"))


# -- validate ----------------------------------------------------------------------------
LOC = Location("v.anf", 2, 3, "  let y = g(x) in")
F64 = AScalar("f64")


def test_validate_lists_every_problem_with_its_location() -> None:
    f = FuncGraph("f", LOC)
    x = f.add_parameter("x")
    x.abstract = F64
    a = f.apply(P["add"], x, 1.0)  # untyped
    b = f.apply(Symbol("g"), a, loc=LOC)
    c = f.apply(META_FUNCTIONS["grad"], a, loc=LOC)
    d = f.apply(META_FUNCTIONS["value_and_grad"], a, loc=LOC)
    f.output = f.apply(P["make_tuple"], b, c, d)
    m = Manager([f])
    with pytest.raises(IRConsistencyError) as info:
        validate(m, phase="05_optimize")
    text = info.value.render()
    assert "after 05_optimize" in text
    assert "v.anf:2:3: unresolved name 'g'" in text
    assert "'grad' was not expanded" in text and "'value_and_grad' was not expanded" in text
    assert "has no type" in text
    assert info.value.loc is not None


def test_validate_detects_a_stale_manager_and_leaves_ownership_alone() -> None:
    f = FuncGraph("f")
    x = f.add_parameter("x")
    a = f.apply(P["add"], x, 1.0)
    f.output = f.apply(P["exp"], a)
    m = Manager([f])
    validate(m, require_types=False)  # consistent
    a._raw_set_input(2, x)  # an edge changed behind the manager's back
    with pytest.raises(IRConsistencyError, match="users of ParameterNode 'x' of @f are stale"):
        validate(m, require_types=False)
    assert f.manager is m


def test_validate_detects_scoping_errors() -> None:
    # @g uses a node of @f, so @g is nested in @f; as an entry (a root) it cannot be.
    f = FuncGraph("f")
    x = f.add_parameter("x")
    f.output = f.apply(P["neg"], x)
    g = FuncGraph("g")
    y = g.add_parameter("y")
    g.output = g.apply(P["add"], y, f.output)
    with pytest.raises(IRConsistencyError, match="root graph @g has free variables"):
        validate(Manager([g, f]), require_types=False)
    # @h uses nodes of two graphs, neither nested in the other.
    f2 = FuncGraph("f2")
    z = f2.add_parameter("z")
    f2.output = f2.apply(P["exp"], z)
    h = FuncGraph("h")
    h.output = h.apply(P["add"], f.output, f2.output)
    f.output = f.apply(P["make_tuple"], f.output, h)
    f2.output = f2.apply(P["make_tuple"], f2.output, h)
    top = FuncGraph("top")
    top.output = top.apply(P["make_tuple"], f, f2)
    with pytest.raises(IRConsistencyError, match="not in an enclosing graph"):
        validate(Manager([top]), require_types=False)


def test_compiled_program_passes_validation() -> None:
    result = compile_program(anfir.parse(CLOSURE), entry="ms_closure")
    validate(result.program.manager)
    assert anfir.run(result.graph) == (4, 5)


# -- generated programs ------------------------------------------------------------------
# Programs of tests/programs.py, grammar PIPELINE: ``def main(x, y) = e``, ``e`` four
# levels of arithmetic, lets, closures called once or twice, if and tuples.
_FLOATS = st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.5, 3.0])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(program=programs.single_def(programs.PIPELINE, 4), x=_FLOATS, y=_FLOATS)
def test_generated_programs_agree_before_after_and_at_every_phase(
        tmp_path: Path, program: programs.Program, x: float, y: float) -> None:
    text = program.text
    module = anfir.parse(text, filename="gen.anf")
    expected = anfir.run(module.entry, x, y)
    folder = tmp_path / f"d{abs(hash((text, x, y))) % 10**8}"
    result = compile_program(module, args=(x, y), dump_dir=folder)
    assert same(anfir.run(result.graph, x, y), expected), text
    for i, name in enumerate(PHASE_NAMES):
        assert same(run_dump(folder / f"{i:02d}_{name}.ir", (x, y)), expected), (name, text)
    shutil.rmtree(folder)


# -- regressions found by running the pipeline (issue 3) -----------------------------------
def run_every_dump(folder: Path, args: tuple) -> list:
    """Load each phase's ``.ir`` back and run its ``# IR entry`` (the parse dump resolved first)."""
    results = []
    for index, phase in enumerate(DUMPED):
        path = folder / f"{index:02d}_{phase.name}.ir"
        assert anfir.load(str(path)).ir_entry is not None, path
        results.append(run_dump(path, args))
    return results


def test_a_folded_numpy_scalar_leaves_the_dumps_loadable(tmp_path: Path) -> None:
    # ``sum`` folds to an np.float64: the optimize dump's type must still re-parse.
    module = anfir.parse("def main(x) = sum(ones((2, 3)) * 0.0)\n", "npf.anf")
    result = compile_program(module, args=(1.0,), dump_dir=tmp_path)
    assert anfir.run(result.graph, 1.0) == 0.0
    assert "np." not in (tmp_path / "05_optimize.ir").read_text(encoding="utf-8")
    assert run_every_dump(tmp_path, (1.0,)) == [0.0] * len(DUMPED)


def test_grad_through_a_closure_called_in_the_differentiated_function(tmp_path: Path) -> None:
    # The inner lambda closes over main's x only, so its J stays a run-time J;
    # typing it used to make a manager that took over the program's graphs,
    # and validate then rejected the IR ("belongs to an unmanaged graph").
    text = "def main(x, y) = grad(lambda (p) (lambda (q) x end)(0.0) * p end)(y)\n"
    module = anfir.parse(text, "gclo.anf")
    expected = anfir.run(module.entry, 2.0, 3.0)
    assert expected == 2.0
    result = compile_program(module, args=(2.0, 3.0), dump_dir=tmp_path)
    manager = result.program.manager  # (running may root more graphs: check it first)
    assert result.graph.manager is manager and list(manager.roots) == [result.graph]
    assert anfir.run(result.graph, 2.0, 3.0) == expected
    assert run_every_dump(tmp_path, (2.0, 3.0)) == [expected] * len(DUMPED)

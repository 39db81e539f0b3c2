"""The JAX back end: ``jax.jit(anfir.to_jax(g))`` computes what ``anfir.run(g)`` computes.

Checked on every bundled example (parsed and compiled, in float64 with
``jax_enable_x64`` and in float32 without), on generated programs of
tests/programs.py (closures, ``if``, loops, tuples, ``grad`` and ``partial``
inside programs), and ``jax.grad`` of loop-free programs against ``anfir.grad``.
Control flow: a traced ``if`` is a ``lax.cond``, a loop with a traced trip count
a ``lax.while_loop``, a known trip count unrolls (so ``jax.grad`` passes);
recursion on traced values is refused.  The 8-device data-parallel step of
docs/jax.md runs in a subprocess (``XLA_FLAGS`` must be set before JAX starts).

The whole module is skipped where JAX is not installed (``pip install
"anfir[jax]"``), except the tests of what happens without it.  jit compiles are
the slow part: every jitted function is made once and shared (:func:`jitted`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import anfir
import programs
from anfir.errors import AnfirError
from anfir.ir.primitive import callee_primitive
from anfir.ir.walk import reachable_graphs
from anfir.primitives import PRIMITIVES
from cli_harness import run_in_process
from example_args import transformer_args

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

try:
    import jax
    import jax.numpy as jnp
except ImportError:  # the tests below that need JAX skip; the ones of its absence run
    jax = None  # type: ignore[assignment]

needs_jax = pytest.mark.skipif(jax is None, reason='JAX is not installed: pip install "anfir[jax]"')


# -- without JAX ---------------------------------------------------------------------------
def _python(code: str, env: Optional[dict[str, str]] = None, timeout: float = 120
            ) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONIOENCODING="utf-8", **(env or {}))
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True,
                          text=True, encoding="utf-8", timeout=timeout)


def test_without_jax_anfir_imports_and_to_jax_and_the_command_name_the_extra() -> None:
    proc = _python(
        "import sys\n"
        "import anfir, anfir.cli, anfir.backends.tojax\n"
        "assert 'jax' not in sys.modules, 'import anfir loaded jax'\n"
        "sys.modules['jax'] = None  # as if it were not installed\n"
        "from anfir.cli import main\n"
        "mod = anfir.parse('def f(x) = x * 2.0')\n"
        "for call in (lambda: anfir.to_jax(mod), lambda: anfir.compile(mod, args=[1.0], backend='jax')):\n"
        "    try:\n"
        "        call()\n"
        "    except anfir.AnfirError as exc:\n"
        "        print(exc)\n"
        "print('status', main(['run', 'examples/power.anf', '--entry', 'dpower', '--backend', 'jax', '2.0']))\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count('pip install "anfir[jax]"') == 2, proc.stdout
    assert "status 1" in proc.stdout
    assert 'pip install "anfir[jax]"' in proc.stderr and "Traceback" not in proc.stderr


# -- shared jitted functions -------------------------------------------------------------------
_JITTED: dict[tuple[int, tuple[int, ...]], Any] = {}
_KEEP: list[Any] = []  # the graphs keyed by id above stay alive


def jitted(graph: anfir.FuncGraph, static: tuple[int, ...] = ()) -> Any:
    """``jax.jit(anfir.to_jax(graph))``, made once per graph (jit caches its compiles)."""
    key = (id(graph), static)
    fn = _JITTED.get(key)
    if fn is None:
        _KEEP.append(graph)
        fn = _JITTED[key] = jax.jit(anfir.to_jax(graph), static_argnums=static)
    return fn


def same(got: Any, want: Any, rtol: float) -> bool:
    """``got`` (JAX arrays, tuples) equals ``want`` (anfir.run's values) up to ``rtol``."""
    if isinstance(want, tuple) or isinstance(got, tuple):
        return (isinstance(want, tuple) and isinstance(got, tuple) and len(got) == len(want)
                and all(same(g, w, rtol) for g, w in zip(got, want)))
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape:
        return False
    if w.dtype.kind in "biu" and g.dtype.kind in "biu":
        return bool(np.array_equal(g, w))
    return bool(np.allclose(g.astype(float), w.astype(float), rtol=rtol, atol=rtol, equal_nan=True))


# -- the bundled examples ------------------------------------------------------------------
_RNG = np.random.default_rng(7)
MLP_ARGS = tuple(_RNG.normal(size=s) * 0.5 for s in [(3, 4), (4, 2), (5, 3), (5, 2)])
MLP2_ARGS = tuple(_RNG.normal(size=s) * 0.5 for s in [(3, 4), (4,), (4, 2), (2,), (5, 3), (5, 2)])

CALLS: dict[tuple[str, str], tuple[Any, ...]] = {
    ("closure.anf", "ms_closure"): (),
    ("closures.anf", "main"): (),
    ("closures.anf", "pick"): (True, 3),          # a closure chosen by a traced if
    ("closures.anf", "scaled_square"): (2.0,),
    ("fibonacci.anf", "fibonacci"): (10,),        # recursion: the argument static
    ("hof.anf", "hof"): (2.0,),
    ("loop.anf", "sum_to"): (100,),               # a traced trip count: lax.while_loop
    ("loop.anf", "newton_sqrt"): (2.0,),
    ("loop.anf", "dnewton_sqrt"): (4.0,),
    ("loop.anf", "halvings"): (5.0,),
    ("loop.anf", "main"): (),
    ("mlp.anf", "mlp_loss"): MLP_ARGS,
    ("mlp2.anf", "mlp2_loss"): MLP2_ARGS,
    ("mlp2.anf", "mlp2_step"): MLP2_ARGS,
    ("paper_lambda.anf", "main"): (5.0, 2.0),
    ("power.anf", "power"): (2.0, 3),
    ("power.anf", "dpower"): (2.0,),
    ("transformer.anf", "encoder_block"): transformer_args()[:2],
    ("transformer.anf", "block_loss"): transformer_args(),
    ("transformer.anf", "block_grad"): transformer_args(),
}
"""Every definition of examples/*.anf that takes and returns data, with arguments."""

NOT_DATA = {
    ("closure.anf", "func_outer"): "returns a closure",
    ("closures.anf", "make_adder"): "returns a closure",
    ("closures.anf", "compose"): "takes and returns functions",
    ("closures.anf", "twice"): "takes and returns functions",
    ("closures.anf", "counter"): "returns a closure",
    ("closures.anf", "drain"): "takes a closure",
}
"""The definitions that take or return functions: a function of JAX arrays cannot."""

SLOW_TO_COMPILE = {
    ("resnet18.anf", name): "XLA's CPU compile of a ResNet takes 5-20 s a definition on the "
    "suite's machine, over its time budget; the conv family's JAX rules are checked one by one "
    "in tests/test_ops_conv.py, and jitted through a gradient in tests/test_resnet_example.py"
    for name in ("resnet18", "resnet18_loss", "resnet18_grad")}
"""Data definitions left out of the JAX runs, with why."""

TRACED_RECURSION = {("loop.anf", "dhalvings"): (5.0,)}
"""Data definitions jax.jit refuses: the gradient of a loop that stops on a data value
recurses as deep as the traced value decides (a located error, tested below)."""

STATIC = {("fibonacci.anf", "fibonacci"): (0,)}
"""Arguments made static: a recursion as deep as its argument is unrolled at trace time."""


def test_the_table_covers_every_example_definition() -> None:
    defined = {(path.name, name) for path in EXAMPLES.glob("*.anf")
               for name in anfir.load(str(path)).graphs}
    assert defined == set(CALLS) | set(NOT_DATA) | set(SLOW_TO_COMPILE) | set(TRACED_RECURSION)


def _example(key: tuple[str, str]) -> tuple[anfir.Module, anfir.FuncGraph]:
    module = _MODULES.get(key[0])
    if module is None:
        module = _MODULES[key[0]] = anfir.load(str(EXAMPLES / key[0]))
    return module, module[key[1]]


_MODULES: dict[str, anfir.Module] = {}


@needs_jax
@pytest.mark.parametrize("key", sorted(CALLS), ids=lambda k: f"{k[0]}:{k[1]}")
def test_example_jitted_computes_what_run_computes(key: tuple[str, str]) -> None:
    module, graph = _example(key)
    args = CALLS[key]
    want = anfir.run(graph, *args)
    with jax.enable_x64(True):
        assert same(jitted(graph, STATIC.get(key, ()))(*args), want, 1e-12), key
    # float32 (numbers and numpy float64 arrays come in as float32), op by op: no compile.
    assert same(anfir.to_jax(graph)(*args), want, 2e-5), key


@needs_jax
@pytest.mark.parametrize("key", sorted(CALLS), ids=lambda k: f"{k[0]}:{k[1]}")
def test_compiled_example_lowers_and_computes_the_same(key: tuple[str, str]) -> None:
    module, graph = _example(key)
    args = CALLS[key]
    compiled = anfir.compile(module, entry=key[1], args=list(args))
    with jax.enable_x64(True):
        assert same(jitted(compiled, STATIC.get(key, ()))(*args), anfir.run(graph, *args), 1e-12)


@needs_jax
@pytest.mark.parametrize("key", sorted(TRACED_RECURSION), ids=lambda k: f"{k[0]}:{k[1]}")
def test_a_data_exit_loop_gradient_is_refused_by_jit_and_runs_op_by_op(key: tuple[str, str]) -> None:
    _, graph = _example(key)
    args = TRACED_RECURSION[key]
    with jax.enable_x64(True):
        with pytest.raises(AnfirError) as info:
            jitted(graph, ())(*args)
        assert "calls itself under a condition on traced values" in info.value.message
        assert info.value.loc is not None
        assert same(anfir.to_jax(graph)(*args), anfir.run(graph, *args), 1e-12)


@needs_jax
def test_recursion_on_a_traced_value_is_refused_with_a_located_message() -> None:
    _, graph = _example(("fibonacci.anf", "fibonacci"))
    with pytest.raises(AnfirError) as info:
        jitted(graph)(10)
    text = str(info.value)
    assert "fibonacci.anf:" in text and "@fibonacci calls itself under a condition on traced values" in text
    assert "static_argnums" in text
    # Not traced (called directly, no jit): the recursion runs at trace time.
    assert int(anfir.to_jax(graph)(10)) == 55


# -- control flow ------------------------------------------------------------------------------
def _jaxpr(graph: anfir.FuncGraph, *args: Any) -> str:
    return str(jax.make_jaxpr(anfir.to_jax(graph))(*args))


@needs_jax
def test_traced_if_is_lax_cond_and_a_known_one_picks_its_arm() -> None:
    graph = anfir.parse("def f(x, c) = if c then sin(x) else cos(x)")["f"]
    assert "cond[" in _jaxpr(graph, 1.0, True)
    known = anfir.to_jax(graph)
    assert "cond[" not in str(jax.make_jaxpr(lambda x: known(x, True))(1.0))


@needs_jax
def test_traced_trip_count_is_a_while_loop_and_a_known_one_unrolls_for_grad() -> None:
    _, power = _example(("power.anf", "power"))
    assert "while[" in _jaxpr(power, 2.0, 3)
    fn = anfir.to_jax(power)
    unrolled = str(jax.make_jaxpr(lambda x: fn(x, 3))(2.0))
    assert "while[" not in unrolled and "cond[" not in unrolled
    assert float(jax.grad(lambda x: fn(x, 3))(2.0)) == 12.0      # through the unrolled loop
    assert float(jax.jit(jax.grad(lambda x: fn(x, 3)))(2.0)) == 12.0


@needs_jax
def test_a_while_loop_runs_under_vmap() -> None:
    _, power = _example(("power.anf", "power"))
    got = jax.jit(jax.vmap(anfir.to_jax(power)))(jnp.arange(4.0), jnp.array([1, 2, 3, 4]))
    assert np.allclose(got, [0.0, 1.0, 8.0, 81.0])


@needs_jax
def test_gradient_of_a_loop_with_a_traced_trip_count_is_refused() -> None:
    src = ("def g(x, n) = grad(lambda (p) let l = lambda (i, acc) if i < n then l(i + 1, acc * p) "
           "else acc end in l(0, 1.0) end)(x)\n")
    graph = anfir.parse(src, "g.anf")["g"]
    with pytest.raises(AnfirError, match="calls itself under a condition on traced values"):
        jax.jit(anfir.to_jax(graph))(2.0, 3)
    fn = anfir.to_jax(graph)
    assert float(jax.jit(lambda x: fn(x, 3))(2.0)) == 12.0   # n known: unrolled


CONTROL = """
def g1(x) = grad(lambda (p) if p > 0.0 then p * p else p * 3.0 end)(x)
def g4(x) = grad(lambda (p) let f = if p > 1.0 then lambda (x) x * p end else lambda (x) x + p end in f(p) end)(x)
def g7(x) = grad(grad(lambda (p) if p > 0.0 then p * p * p else p end))(x)
def tup(x, y) = let t = if x > y then (x, 1) else (y, 2) in t[0] * 2.0 + t[1]
def nested(x, n) = let outer = lambda (i, acc) if i < n then (let inner = lambda (j, a2) if j < i then inner(j + 1, a2 + x) else a2 end in outer(i + 1, acc + inner(0, 0.0))) else acc end in outer(0, 0.0)
def ev(k, acc, x) = if k < 1 then acc else od(k - 1, acc + x, x)
def od(k, acc, x) = if k < 1 then acc else ev(k - 1, acc * 2.0, x)
def mutual(x, n) = ev(n, 0.0, x)
def grow(x, n) = let l = lambda (i, acc) if i < n then l(i + 1, acc + 1.5) else acc end in l(0, 0) * x
"""


@needs_jax
@pytest.mark.parametrize("name, args", [
    ("g1", (2.0,)), ("g1", (-2.0,)),           # grad through a traced if: the bprops differ
    ("g4", (2.0,)), ("g4", (0.5,)),            # closures chosen by a traced if, differentiated
    ("g7", (2.0,)), ("g7", (-1.0,)),           # grad of grad through if
    ("tup", (1.0, 2.0)), ("tup", (3.0, 2.0)),  # tuples out of a cond
    ("nested", (1.5, 4)),                      # a while_loop inside a while_loop
    ("mutual", (1.5, 5)),                      # mutual tail recursion: one loop
    ("grow", (2.0, 3)),                        # the state widens: int 0 meets 1.5
])
def test_control_flow_under_jit(name: str, args: tuple[Any, ...]) -> None:
    graph = _CONTROL[name] if name in _CONTROL else _CONTROL.setdefault(
        name, anfir.parse(CONTROL, "control.anf")[name])
    with jax.enable_x64(True):
        assert same(jitted(graph)(*args), anfir.run(graph, *args), 1e-12)


_CONTROL: dict[str, anfir.FuncGraph] = {}


@needs_jax
def test_a_long_program_and_a_long_unrolled_gradient_at_the_default_recursion_limit() -> None:
    assert sys.getrecursionlimit() == 1000
    lines = [f"  let x{i} = sin(x{i - 1}) * 1.0001 in" for i in range(1, 1500)]
    graph = anfir.parse("def f(x0) =\n" + "\n".join(lines) + "\n  x1499\n")["f"]
    assert len(jax.make_jaxpr(anfir.to_jax(graph))(0.5).jaxpr.eqns) == 2 * 1499
    # 400 iterations of a loop differentiated: 400 nested backpropagator closures.
    src = ("def d(x) = grad(lambda (p) let l = lambda (i, acc) if i < 400 then l(i + 1, acc * 0.999 + p) "
           "else acc end in l(0, 0.0) end)(x)\n")
    graph = anfir.parse(src)["d"]
    jaxpr = jax.make_jaxpr(anfir.to_jax(graph))(1.0)
    assert len(jaxpr.jaxpr.eqns) >= 400 and "while" not in str(jaxpr)


# -- generated programs ---------------------------------------------------------------------------
COMPILE_PROGRAMS = programs.modules(programs.COMPILE, [
    programs.Def("h0", ("a", "b"), 2, callees=("h1",)),
    programs.Def("h1", ("a", "b"), 2, callees=("add",)),
    programs.Def("main", ("x", "y"), 3, callees=("h0", "h1")),
])
ROUNDTRIP_PROGRAMS = programs.let_chains(programs.ROUNDTRIP, lets=(1, 4))
_FEW = settings(max_examples=8, deadline=None, database=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.data_too_large])
_POINTS = dict(x=st.sampled_from([0.0, 1.0, -1.5, 2.0, 0.5]), y=st.sampled_from([1.0, 2, -3, 0.5]))


def _agrees(program: programs.Program, x: Any, y: Any) -> None:
    """jit of the generated program's entry computes what run computes (or both refuse)."""
    module = anfir.parse(program.text, "gen.anf")
    graph = module[program.entry]
    try:
        want = anfir.run(graph, x, y)
    except AnfirError:
        return
    with jax.enable_x64(True):
        try:
            got = jax.jit(anfir.to_jax(graph))(x, y)
        except AnfirError as exc:  # only recursion on traced values may be refused
            assert "calls itself under a condition on traced values" in str(exc), program.text
            return
    assert same(got, want, 1e-9), (program.text, x, y, got, want)


@needs_jax
@_FEW
@given(program=COMPILE_PROGRAMS, **_POINTS)
def test_generated_programs_with_grad_partial_and_loops(program: programs.Program, x: Any, y: Any) -> None:
    _agrees(program, x, y)


@needs_jax
@_FEW
@given(program=ROUNDTRIP_PROGRAMS, **_POINTS)
def test_generated_programs_with_helpers_recursion_and_logic(program: programs.Program, x: Any,
                                                               y: Any) -> None:
    _agrees(program, x, y)


# -- jax.grad against anfir.grad --------------------------------------------------------------------
@needs_jax
@settings(max_examples=10, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(program=programs.single_def(programs.SMOOTH, 3),
       x=st.floats(-2.0, 2.0), y=st.floats(-2.0, 2.0))
def test_jax_grad_of_loop_free_programs_agrees_with_anfir_grad(program: programs.Program,
                                                                 x: float, y: float) -> None:
    if min(program.if_margins(x, y), default=1.0) < 1e-3:
        return  # too close to a tie: the two sides may take different branches
    graph = anfir.parse(program.text)["main"]
    want = anfir.run(anfir.grad(graph, (0, 1)), x, y)
    with jax.enable_x64(True):
        got = jax.grad(anfir.to_jax(graph), argnums=(0, 1))(x, y)
    assert same(tuple(got), want, 1e-9), (program.text, x, y, got, want)


@needs_jax
@pytest.mark.parametrize("key, wrt", [(("hof.anf", "hof"), 0), (("paper_lambda.anf", "main"), (0, 1)),
                                      (("closures.anf", "scaled_square"), 0),
                                      (("mlp.anf", "mlp_loss"), (0, 1))])
def test_jax_grad_of_examples_agrees_with_anfir_grad(key: tuple[str, str], wrt: Any) -> None:
    _, graph = _example(key)
    args = CALLS[key]
    want = anfir.run(anfir.grad(graph, wrt), *args)
    with jax.enable_x64(True):
        got = jax.jit(jax.grad(anfir.to_jax(graph), argnums=wrt))(*args)
    assert same(got, want, 1e-10)


# -- the primitive table ------------------------------------------------------------------------
@needs_jax
def test_every_primitive_has_a_jax_rule_or_a_reason() -> None:
    from anfir.backends.tojax.rules import RULES, UNMAPPED

    missing = sorted(name for name, prim in PRIMITIVES.items() if prim not in RULES and prim not in UNMAPPED)
    assert not missing, f"no JAX rule in anfir/backends/tojax/rules.py for: {missing}"
    assert all(reason.strip() for reason in UNMAPPED.values())
    assert not set(RULES) & set(UNMAPPED)
    gradient_helpers = {"sum_to", "unreduce", "matmul_dx", "matmul_dy", "cast_like", "broadcast_like",
                        "tangent_dot", "tangent_scale", "grad_seed", "grad_arg_check", "zeros_like",
                        "env_setitem", "env_getitem", "newenv", "gadd", "J"}
    assert {PRIMITIVES[name] for name in gradient_helpers} <= set(RULES)


OPERATORS = """
def ops(x: f64[2, 3], v: f64[3]) =
  let a = (x + 1.0) * 2.0 - x / 3.0 in
  let b = exp(-abs(a)) + log(abs(a) + 1.0) + sqrt(abs(a)) + sin(a) * cos(a) + tanh(a) in
  let c = maximum(a, b) + minimum(a, b) + sigmoid(a) + relu(a) + softplus(a) + sign(a) + a ** 2.0 in
  let m = x @ v in
  let t = transpose(x) in
  let r = reshape(x, (3, 2)) in
  let s = sum(c) + sum(sum(c, 0)) * 0.5 + mean(c) + sum(c, (0, 1)) + sum(mean(c, 1)) in
  let w = where(a > b, a, b) in
  let k = cast(c, "f32") in
  let bt = broadcast_to(v, (2, 3)) in
  (s, m, t, r, w, k, bt, ones_like(x), zeros((2,)), ones((1, 2), "i32"), shape(x),
   array(((1.0, 2.0), (3.0, 4.0))), logical_and(a > 0.0, b > 0.0), logical_or(a < 0.0, b < 0.0),
   logical_not(a == b), a != b, a <= b, a >= b, len((1, 2)), stop_gradient(a), identity(b),
   transpose(r, (1, 0)), partial(lambda (p, q) p * q end, a)(b), zeros_like(a))
"""


@needs_jax
def test_every_public_operator_computes_what_run_computes() -> None:
    graph = anfir.parse(OPERATORS, "ops.anf")["ops"]
    x, v = _RNG.normal(size=(2, 3)), _RNG.normal(size=3)
    with jax.enable_x64(True):
        got = jitted(graph)(x, v)
    assert same(got, anfir.run(graph, x, v), 1e-12)
    called = {callee.name for g in reachable_graphs([graph]) for n in g.nodes()
              if (callee := callee_primitive(n)) is not None}
    assert OPERATORS_COVERED - called <= {"switch", "tuple_getitem"}, sorted(OPERATORS_COVERED - called)


OPERATORS_COVERED = {"add", "sub", "mul", "div", "neg", "pow", "exp", "log", "sin", "cos", "tanh", "sqrt", "abs",
           "sign", "maximum", "minimum", "sigmoid", "relu", "softplus", "lt", "le", "gt", "ge", "eq",
           "ne", "logical_and", "logical_or", "logical_not", "matmul", "transpose", "reshape", "sum",
           "mean", "broadcast_to", "shape", "ones_like", "zeros", "ones", "where", "array", "cast",
           "make_tuple", "tuple_getitem", "len", "switch", "partial", "identity", "stop_gradient",
           "zeros_like"}
"""The operators the program above calls (an operator added later has its rule checked
by the table test; add it here to check its values too)."""


OPS_MD = """
def un(x: f64[2, 3]) =
  (erf(x), expm1(x), log1p(abs(x)), floor(x), ceil(x), round(x), reciprocal(x), rsqrt(abs(x) + 1.0),
   square(x), tan(x), atan(x), sinh(x), cosh(x), asin(x * 0.3), acos(x * 0.3), softsign(x), silu(x),
   mish(x), gelu(x), gelu(x, approximate="tanh"), leaky_relu(x), leaky_relu(x, alpha=0.2), elu(x),
   elu(x, alpha=0.5), selu(x), hard_sigmoid(x), hard_sigmoid(x, alpha=0.3, beta=0.4), hard_swish(x),
   clip(x, min=-0.5, max=0.5), clip(x, 0.0 - x, x), floor_div(x, 0.7), mod(x, 0.7), fmod(x, 0.7), atan2(x, x + 2.0),
   isnan(x), isinf(x), logical_xor(x > 0.0, x > 0.5), 
   max(x), max(x, axis=1), max(x, x * 0.5), min(x, axis=0, keepdims=true), min(x, x * 2.0), prod(x), prod(x, 1),
   var(x), var(x, 0, true), std(x, axis=1, correction=1), logsumexp(x), logsumexp(x, 1), all(x > -9.0), any(x > 0.0, 1),
   norm(x), norm(x, 1), norm(x, 3.0, 1), norm(x, 0), norm(x, 1e999), argmax(x), argmax(x, 1), argmin(x, None),
   argmax(x, 1, select_last=true), argmin(x, axis=None, keepdims=true, select_last=true), cumsum(x, 1), cumsum(x), cumsum(x, 0, true, true), cumprod(x, 1), cumprod(x, 1, true),
   sum(x, 1, true), mean(x, axis=0, keepdims=true))
def bits(a: i64[3], b: i64[3]) = (bitwise_and(a, b), bitwise_or(a, b), bitwise_xor(a, b), bitwise_not(a), bit_shift(a, b), bit_shift(a, b, direction="right"), floor_div(a, b), mod(a, b), square(a))
def loss(x: f64[2, 3]) = sum(erf(x) + expm1(x) * 0.1 + log1p(abs(x)) + rsqrt(abs(x) + 1.0) + square(x) + tan(x * 0.5) + atan(x) + sinh(x) + cosh(x) + asin(x * 0.3) + acos(x * 0.3) + softsign(x) + silu(x) + mish(x) + gelu(x) + gelu(x, approximate="tanh") + leaky_relu(x) + elu(x) + selu(x) + hard_sigmoid(x) + hard_swish(x) + clip(x, min=-0.5, max=0.5) + fmod(x, 0.7) + atan2(x, x + 2.0)) + sum(max(x, axis=1)) + sum(min(x, x * 2.0)) + prod(x) + sum(prod(x, 1)) + var(x) + sum(std(x, axis=1, correction=1)) + logsumexp(x) + norm(x) + norm(x, 3.0) + sum(cumsum(x, 1)) + sum(cumprod(x, 1) * x) + sum(sum(x, 1, true) * x) + sum(mean(x, 0, true) * x) + sum(reciprocal(x + 3.0))
"""
"""The operators of the shared spec's ops.md, with their attributes; ``loss`` sums the
differentiable ones (their gradient rules use reshape_like, prod_others, clip_grad)."""


@needs_jax
def test_the_ops_md_operators_and_their_gradients_compute_what_run_computes() -> None:
    module = anfir.parse(OPS_MD, "ops_md.anf")
    x = np.array([[0.3, -1.2, 2.0], [0.7, -0.4, 1.1]])
    a, b = np.array([5, 12, 7]), np.array([1, 2, 3])
    with jax.enable_x64(True):
        for name, args in (("un", (x,)), ("bits", (a, b))):
            assert same(jitted(module[name])(*args), anfir.run(module[name], *args), 1e-12), name
        gradient = anfir.grad(module["loss"])
        want = anfir.run(gradient, x)
        assert same(jax.jit(jax.grad(anfir.to_jax(module["loss"])))(x), want, 1e-9)
        assert same(jitted(gradient)(x), want, 1e-12)


@needs_jax
def test_gradient_graph_helpers_with_rank_one_and_batched_matmuls() -> None:
    src = ("def f(a, b, c, d) = sum(tanh(a @ b)) + sum(b @ c) + sum(d @ c) + sum(broadcast_to(c, (2, 3, 4))) "
           "+ sum(cast(a, \"f32\"))\n")
    graph = anfir.parse(src)["f"]
    a, b, c, d = (_RNG.normal(size=s) for s in [(3,), (3, 4), (4,), (2, 3, 4)])
    want = anfir.run(anfir.grad(graph, (0, 1, 2, 3)), a, b, c, d)
    with jax.enable_x64(True):
        lowered = anfir.to_jax(anfir.compile(anfir.grad(graph, (0, 1, 2, 3)), args=[a, b, c, d]))
        assert same(jax.jit(lowered)(a, b, c, d), want, 1e-10)


@needs_jax
def test_grad_of_an_integer_argument_is_anfirs_error() -> None:
    graph = anfir.parse("def main(x, y) = grad(lambda (p) x * p end)(y)\n", "t.anf")["main"]
    with pytest.raises(AnfirError, match="integer or boolean"):
        jax.jit(anfir.to_jax(graph))(2.0, 2)


@needs_jax
def test_a_program_returning_a_function_is_refused() -> None:
    module, graph = _example(("closure.anf", "func_outer"))
    with pytest.raises(AnfirError, match="returns a function value"):
        anfir.to_jax(graph)(1, 2)


# -- compile --backend jax -----------------------------------------------------------------------
@needs_jax
def test_compile_backend_jax_adds_the_stablehlo_phase_and_returns_the_graph(tmp_path: Path) -> None:
    module, _ = _example(("power.anf", "dpower"))
    graph = anfir.compile(module, entry="dpower", args=[3.0], dump_dir=str(tmp_path), backend="jax")
    assert isinstance(graph, anfir.FuncGraph) and anfir.run(graph, 3.0) == 27.0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[-1] == "07_stablehlo.mlir" and "06_validate.ir" in names
    text = (tmp_path / "07_stablehlo.mlir").read_text(encoding="utf-8")
    assert text.startswith("module @jit_dpower") and "tensor<f64>" in text
    with pytest.raises(AnfirError, match="unknown backend"):
        anfir.compile(module, entry="dpower", args=[3.0], backend="tpu")


@needs_jax
def test_the_stablehlo_dump_is_deterministic_and_needs_concrete_shapes(tmp_path: Path) -> None:
    args = ["compile", "examples/mlp.anf", "--backend", "jax", "--args", "f64[3, 4]", "f64[4, 2]",
            "f64[5, 3]", "f64[5, 2]", "--dump-dir"]
    for out in ("a", "b"):
        status, stdout, stderr = run_in_process([*args, str(tmp_path / out)], ROOT)
        assert status == 0, stderr
    first = (tmp_path / "a" / "07_stablehlo.mlir").read_bytes()
    assert first == (tmp_path / "b" / "07_stablehlo.mlir").read_bytes()
    assert b"stablehlo.dot_general" in first and b"tensor<5x3xf64>" in first
    status, _, stderr = run_in_process(["compile", "examples/mlp.anf", "--backend", "jax"], ROOT)
    assert status == 2 and "needs concrete argument types" in stderr


@needs_jax
def test_run_backend_jax_prints_what_run_prints() -> None:
    for args in (["examples/power.anf", "--entry", "dpower", "2.0"], ["examples/loop.anf"],
                 ["examples/closures.anf"], ["examples/fibonacci.anf", "10"]):
        plain = run_in_process(["run", *args], ROOT)
        on_jax = run_in_process(["run", *args, "--backend", "jax"], ROOT)
        assert on_jax[0] == 0 and on_jax[1] == plain[1], (args, on_jax)
    assert "compile-time constants" in on_jax[2]  # fibonacci: its argument made static


@needs_jax
def test_compile_backend_jax_runs_the_lowered_program() -> None:
    status, out, err = run_in_process(["compile", "examples/power.anf", "--entry", "dpower",
                                       "--args", "3.0", "--backend", "jax"], ROOT)
    assert status == 0, err
    assert "after 8 phases" in out and re.search(r"^result: 27\.0$", out, re.M)


# -- many devices ------------------------------------------------------------------------------------
def recipe() -> str:
    """The data-parallel training step of docs/jax.md (its python block under "Many devices"):
    anfir's per-device program under jax.shard_map."""
    text = (ROOT / "docs" / "jax.md").read_text(encoding="utf-8")
    section = text.split("## Many devices", 1)[1]
    return section.split("```python\n", 1)[1].split("\n```", 1)[0]


@needs_jax
def test_the_data_parallel_step_on_8_virtual_devices() -> None:
    code = recipe() + (
        "\nimport json\n"
        "print(json.dumps({'devices': jax.device_count(), 'all_reduce': 'all-reduce' in hlo,\n"
        "                  'x_shards': len(step.place(w1, w2, x, y)[2].addressable_shards),\n"
        "                  'difference': float(max(abs(new_w1 - one[0]).max(), abs(new_w2 - one[1]).max()))}))\n")
    proc = _python(code, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8",
                              "JAX_PLATFORMS": "cpu"}, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["devices"] == 8 and report["x_shards"] == 8
    assert report["all_reduce"], "the gradient's sum over the batch should be an all-reduce"
    assert report["difference"] < 1e-5


"""The low-level buffer IR (docs/lowlevel.md): lowering, sharing, planning, dumps, the executor.

Every case is checked against the high-level graph run by anfir's evaluator;
the arena's safety is checked by :func:`check_arena`, which reads the dump's
text with its own regular expressions (not the loader, not the planner).
"""

from __future__ import annotations

import re
import tracemalloc
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import anfir
import convnets
from anfir.errors import AnfirError
from anfir.lowlevel import Executor, LowProgram, load_lir_text, print_program
from anfir.lowlevel.rules import RULES, UNLOWERED
from anfir.primitives.registry import PRIMITIVES

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

MLP_TYPES = ["f64[16, 32]", "f64[32, 4]", "f64[8, 16]", "f64[8, 4]"]
MLP2_TYPES = ["f64[16, 32]", "f64[32]", "f64[32, 4]", "f64[4]", "f64[8, 16]", "f64[8, 4]"]

INLINE = """
def softmax_ce(w: f64[6, 5], x: f64[3, 6], y: f64[3, 5]) -> f64 =
  let z = x @ w in
  let m = max(z, axis=1, keepdims=true) in
  let e = exp(z - m) in
  let p = e / sum(e, axis=1, keepdims=true) in
  -sum(y * log(p)) / 3.0

def affine(w: f64[4, 3], b: f64[3], x: f64[5, 4]) =
  (sigmoid(x @ w + b), transpose(x @ w))

def squares(a: f64[7]) = sum(a * a) + 1.0

def layer(w, x) = tanh(x @ w)

def two_layers(w1: f64[6, 6], w2: f64[6, 2], x: f64[4, 6]) -> f64 =
  let scale = lambda (v) v * 0.5 end in
  sum(scale(layer(w2, layer(w1, x))))
"""


# A small CNN and a ResNet-style network (tests/convnets.py), here at 2 x 3 x 8 x 8.
NETS = convnets.NETS


def _bn_types(c: int) -> list[str]:
    return [f"f64[{c}]"] * 4


CNN_TYPES = ["f64[4, 3, 3, 3]", "f64[4]", *_bn_types(4), "f64[6, 4, 3, 3]", "f64[6, 5]", "f64[2, 3, 8, 8]",
             "f64[2, 5]"]
RESNET_TYPES = ["f64[4, 3, 3, 3]", *_bn_types(4), "f64[4, 4, 3, 3]", *_bn_types(4), "f64[4, 4, 3, 3]",
                *_bn_types(4), "f64[8, 4, 3, 3]", *_bn_types(8), "f64[8, 8, 3, 3]", *_bn_types(8),
                "f64[8, 4, 1, 1]", "f64[8, 5]", "f64[2, 3, 8, 8]", "f64[2, 5]"]


def _values(types: list[str], seed: int = 0) -> list[Any]:
    rng = np.random.default_rng(seed)
    out = []
    for t in types:
        dims = [int(d) for d in re.findall(r"\d+", t.split("[", 1)[1])] if "[" in t else []
        out.append(rng.standard_normal(dims) * 0.5)
    return out


def _cases() -> list[tuple[str, Any, list[str], bool]]:
    """(id, graph, argument types, is a gradient graph)."""
    mlp = anfir.load(str(EXAMPLES / "mlp.anf"))["mlp_loss"]
    mlp2 = anfir.load(str(EXAMPLES / "mlp2.anf"))
    inline = anfir.parse(INLINE)
    nets = anfir.parse(NETS, "nets.anf")
    weights = tuple(range(len(RESNET_TYPES) - 2))  # every parameter but x and y
    return [
        ("mlp", mlp, MLP_TYPES, False),
        ("mlp_grad", anfir.grad(mlp, (0, 1)), MLP_TYPES, True),
        ("mlp2", mlp2["mlp2_loss"], MLP2_TYPES, False),
        ("mlp2_step", mlp2["mlp2_step"], MLP2_TYPES, True),
        ("softmax_ce", inline["softmax_ce"], ["f64[6, 5]", "f64[3, 6]", "f64[3, 5]"], False),
        ("softmax_ce_grad", anfir.grad(inline["softmax_ce"], 0), ["f64[6, 5]", "f64[3, 6]", "f64[3, 5]"], True),
        ("affine", inline["affine"], ["f64[4, 3]", "f64[3]", "f64[5, 4]"], False),
        ("squares_grad", anfir.grad(inline["squares"]), ["f64[7]"], True),
        # calls of a non-recursive graph and a closure, inlined before lowering
        ("two_layers", inline["two_layers"], ["f64[6, 6]", "f64[6, 2]", "f64[4, 6]"], False),
        ("two_layers_grad", anfir.grad(inline["two_layers"], (0, 1)), ["f64[6, 6]", "f64[6, 2]", "f64[4, 6]"],
         True),
        # the CNN and ResNet-style networks: conv, pooling, batch norm and their gradients
        ("cnn", nets["cnn"], CNN_TYPES, False),
        ("cnn_grad", anfir.grad(nets["cnn"], tuple(range(len(CNN_TYPES) - 2))), CNN_TYPES, True),
        ("resnet", nets["resnet"], RESNET_TYPES, False),
        ("resnet_grad", anfir.grad(nets["resnet"], weights), RESNET_TYPES, True),
    ]


CASES = _cases()


def _same(got: Any, want: Any) -> bool:
    if isinstance(want, tuple):
        return isinstance(got, tuple) and len(got) == len(want) and all(map(_same, got, want))
    return bool(np.allclose(np.asarray(got, dtype=float), np.asarray(want, dtype=float),
                            rtol=1e-10, atol=1e-12))


def _compile(graph: Any, types: list[str], folder: Path) -> list[Path]:
    anfir.compile(graph, args=types, dump_dir=str(folder), lower=True)
    return sorted(folder.glob("*.lir"))


def check_arena(text: str) -> tuple[int, int]:
    """Independently of the planner: every operand is a live buffer, and no two
    buffers live at once share a byte of the arena.  Returns (arena, max live)
    computed from the text; asserts the header states the same."""
    allocs: dict[str, tuple[int, int]] = {}
    live: dict[str, tuple[int, int]] = {}
    declared = set(re.findall(r"^  %(\S+) = (?:input|output|constant) ", text, re.MULTILINE))
    peak = arena = 0
    body = text.split("program {", 1)[1]
    for line in body.splitlines():
        m = re.match(r"  %(\S+) = alloc (\w+)<([^>]*)> @ (\d+)$", line)
        if m:
            dims = [int(d) for d in m.group(3).split(" x ")] if m.group(3) else []
            size = int(np.prod(dims, dtype=np.int64)) * np.dtype(
                {"f64": "float64", "f32": "float32", "i64": "int64", "bool": "bool",
                 "u8": "uint8"}[m.group(2)]).itemsize
            size = -(-max(size, 1) // 64) * 64
            start = int(m.group(4))
            for other, (o, s) in live.items():
                assert o + s <= start or start + size <= o, f"%{m.group(1)} overlaps %{other}"
            live[m.group(1)] = allocs[m.group(1)] = (start, size)
            arena = max(arena, start + size)
            continue
        m = re.match(r"  dealloc %(\S+)$", line)
        if m:
            del live[m.group(1)]
            continue
        if "=" in line:
            # (a kernel's working memory is a @scratch buffer of the arena, planned like the rest)
            for name in re.findall(r"@(?:in|out|inout|scratch) %(\S+?)(?:,|\s|$)", line):
                assert name in live or name in declared, f"{line.strip()}: %{name} is not live"
            peak = max(peak, sum(s for _, s in live.values()))
    header = re.search(r"# arena: (\d+) bytes   max live: (\d+) bytes", text)
    assert header is not None
    assert (int(header.group(1)), int(header.group(2))) == (arena, peak)
    return arena, peak


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_dump_reloads_and_runs_to_the_graphs_values(case: Any, tmp_path: Path) -> None:
    _, graph, types, _ = case
    files = _compile(graph, types, tmp_path)
    assert [f.name.split("_", 1)[1] for f in files] == ["lower.lir", "share_buffers.lir", "plan_memory.lir"]
    values = _values(types)
    want = anfir.run(anfir.compile(graph, args=types), *values)
    for path in files:
        low = anfir.load(str(path))
        assert isinstance(low, LowProgram)
        assert _same(anfir.run(low, *values), want), path.name
        assert print_program(low) == path.read_text(encoding="utf-8")  # prints back to the same bytes


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_dumps_are_byte_identical_across_runs(case: Any, tmp_path: Path) -> None:
    _, graph, types, _ = case
    first = [p.read_bytes() for p in _compile(graph, types, tmp_path / "a")]
    second = [p.read_bytes() for p in _compile(graph, types, tmp_path / "b")]
    assert first == second


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_the_arena_is_safe_and_tight(case: Any, tmp_path: Path) -> None:
    _, graph, types, gradient = case
    plan = _compile(graph, types, tmp_path)[-1]
    arena, peak = check_arena(plan.read_text(encoding="utf-8"))
    if gradient:
        assert arena <= 1.05 * peak
    else:
        assert arena == peak
    low = anfir.lower(graph, args=types)
    assert (low.peak_bytes, low.max_live_bytes) == (arena, peak)
    assert low.naive_bytes >= arena


def test_sharing_saves_memory_on_the_training_step() -> None:
    mlp2 = anfir.load(str(EXAMPLES / "mlp2.anf"))
    low = anfir.lower(mlp2, entry="mlp2_step", args=MLP2_TYPES)
    assert low.naive_bytes / low.peak_bytes >= 1.5
    text = print_program(low)
    assert "@inout" in text  # elementwise results written in place


def test_the_executor_allocates_nothing_per_instruction() -> None:
    # The MLP's training step at batch 64, width 256: a per-instruction temporary would be >= 16 KiB.
    grad = anfir.grad(anfir.load(str(EXAMPLES / "mlp.anf"))["mlp_loss"], (0, 1))
    types = ["f64[256, 256]", "f64[256, 256]", "f64[64, 256]", "f64[64, 256]"]
    low = anfir.lower(grad, args=types)
    executor = Executor(low)
    values = _values(types)
    want = anfir.run(anfir.compile(grad, args=types), *values)
    assert _same(executor.run(*values), want)
    assert executor.fast == len(executor.steps), "every instruction of the MLP step has a kernel"
    executor.run_steps()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for _ in range(3):
            executor.run_steps()
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak < 4096, f"{peak} bytes allocated while running {len(executor.steps)} instructions"
    # A whole run, its results let go of by the caller and its arguments the same arrays: the
    # outputs (256 KiB of gradients) are written again, nothing is bound again.
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for _ in range(3):
            executor.run(*values)
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert peak < 4096, f"{peak} bytes allocated by a run"


def test_results_the_caller_holds_are_never_written_again() -> None:
    # The executor writes an output array again only once the caller has let it go, and binds
    # the instructions reading an argument again only when the argument is another array.
    grad = anfir.grad(anfir.load(str(EXAMPLES / "mlp.anf"))["mlp_loss"], (0, 1))
    compiled = anfir.compile(grad, args=MLP_TYPES)
    executor = Executor(anfir.lower(grad, args=MLP_TYPES))
    first, second = _values(MLP_TYPES, 1), _values(MLP_TYPES, 2)
    kept = executor.run(*first)
    snapshot = [a.copy() for a in kept]
    again = executor.run(*second)
    assert _same(again, anfir.run(compiled, *second))
    assert all(k is not a for k, a in zip(kept, again))
    assert _same(kept, tuple(snapshot))  # untouched by the second run
    let_go = weakref.ref(again[0])
    del again
    first[2] *= 3.0  # the same argument array, changed in place: read again, not cached
    third = executor.run(*first)
    assert third[0] is let_go()  # the array the caller let go of, written again
    assert _same(third, anfir.run(compiled, *first))
    assert _same(kept, tuple(snapshot))


def test_lowering_refuses_control_flow_with_a_location() -> None:
    mod = anfir.load(str(EXAMPLES / "fibonacci.anf"))
    with pytest.raises(AnfirError) as info:
        anfir.lower(mod, args=[10])
    assert info.value.loc is not None and "fibonacci.anf" in info.value.loc.file


def test_lowering_refuses_symbolic_shapes() -> None:
    mlp = anfir.load(str(EXAMPLES / "mlp.anf"))
    with pytest.raises(AnfirError, match="concrete"):
        anfir.lower(mlp)  # the annotations' sizes are symbols


BAD_LIR = [
    ("signature () -> %o\ndeclare {\n  %o = output f64<>\n}\nprogram {\n  %v = nosuch @out %o\n}\n",
     6, "unknown primitive"),
    ("signature () -> %o\ndeclare {\n  %o = output f64<>\n}\nprogram {\n  %v = copy @out %o, @in %zz\n}\n",
     6, "not a buffer"),
    (("signature () -> %o\ndeclare {\n  %o = output f64<>\n}\nprogram {\n  %a = alloc f64<>\n  dealloc %a\n"
     "  %v = copy @out %o, @in %a\n}\n"), 8, "outside its life"),
    ("signature () -> %o\ndeclare {\n  %o = output f64<>\n  %o = output f64<>\n}\nprogram {\n}\n",
     4, "defined twice"),
    ("signature () -> %o\ndeclare {\n  %o = output f64<3 x>\n}\n", 3, "unexpected"),
    ("signature () -> %o\ndeclare {\n  %c = constant f64<2> [1.0]\n  %o = output f64<>\n}\nprogram {\n}\n",
     3, "elements"),
    ("signature () -> %o\ndeclare {\n  %o = output f64<99999999 x 99999999>\n}\nprogram {\n}\n",
     3, "limit"),
    (("signature () -> %o\ndeclare {\n  %o = output f64<>\n}\nprogram {\n  %a = alloc f64<> @ 0\n"
     "  %b = alloc f64<> @ 0\n  %v = add @out %o, @in %a, @in %b\n}\n"), 1, "share bytes"),
    ("signature () -> %o\ndeclare {\n  %o = output f64<>\n}\nprogram {\n", 5, "end of file"),
]


@pytest.mark.parametrize("text,line,message", BAD_LIR)
def test_bad_lir_gives_located_errors(text: str, line: int, message: str) -> None:
    with pytest.raises(AnfirError, match=message) as info:
        load_lir_text(text, "bad.lir")
    assert info.value.loc is not None and info.value.loc.file == "bad.lir"
    assert info.value.loc.line == line


def test_deeply_nested_signatures_are_refused() -> None:
    text = ("signature " + "(" * 5000 + ")" * 5000 + " -> none\ndeclare {\n}\nprogram {\n}\n")
    with pytest.raises(AnfirError, match="nest more than") as info:
        load_lir_text(text, "deep.lir")
    assert info.value.loc is not None and info.value.loc.line == 1


WRONG_OPERANDS = [
    # matmul_dx with its type-only argument in the wrong place: the kernel cannot bind
    ("signature (%a, %b) -> %o\ndeclare {\n  %a = input f64<2 x 3>\n  %b = input f64<4 x 3>\n"
     "  %o = output f64<2 x 4>\n}\nprogram {\n  %v = matmul_dx[arg1=f64<4 x 3>] @out %o, @in %a, @in %b   # t.anf:3:4\n}\n"),
    # shapes that do not multiply: numpy refuses when it runs
    ("signature (%a, %b) -> %o\ndeclare {\n  %a = input f64<2 x 3>\n  %b = input f64<2 x 3>\n"
     "  %o = output f64<2 x 3>\n}\nprogram {\n  %v = matmul @out %o, @in %a, @in %b   # t.anf:3:4\n}\n"),
]


@pytest.mark.parametrize("text", WRONG_OPERANDS)
def test_instructions_whose_operands_do_not_fit_fail_at_their_location(text: str) -> None:
    low = load_lir_text(text, "wrong.lir")
    with pytest.raises(AnfirError) as info:
        anfir.run(low, np.ones((2, 3)), np.ones(low.declares[1].shape))
    assert info.value.loc is not None and (info.value.loc.file, info.value.loc.line) == ("t.anf", 3)


def test_every_primitive_has_a_low_level_rule_or_a_reason() -> None:
    missing = sorted(name for name, prim in PRIMITIVES.items() if prim not in RULES and prim not in UNLOWERED)
    assert not missing, f"no low-level rule in anfir/lowlevel/rules.py for: {missing}"
    assert all(reason.strip() for reason in UNLOWERED.values())
    assert not set(RULES) & set(UNLOWERED)


def test_compile_cli_lower(tmp_path: Path) -> None:
    from anfir.cli import main

    code = main(["compile", str(EXAMPLES / "mlp.anf"), "--args", *MLP_TYPES, "--dump-dir", str(tmp_path),
                 "--lower"])
    assert code == 0
    names = sorted(p.name for p in tmp_path.glob("*.lir"))
    assert names == ["07_lower.lir", "08_share_buffers.lir", "09_plan_memory.lir"]


# -- the op library's table, lowered --------------------------------------------------------------
# Every case of tests/ops_table.py as a program and (where differentiable) the gradient of
# sum(sin(op)), lowered, printed, loaded back and run against the evaluator: each rule's kernel
# (or its evaluation) and its statics' round trip.
from ops_table import BINARY, INTEGER, PREDICATES, REDUCTIONS, UNARY

_OPS = [*UNARY, *BINARY, *PREDICATES, *INTEGER]


def _draw(op: Any, shape: tuple[int, ...], seed: int) -> np.ndarray:
    data = np.random.default_rng(seed)
    if op.kind == "int":
        return data.integers(1, 6, size=shape)
    if op.kind == "bool":
        return data.integers(0, 2, size=shape).astype(bool)
    return data.uniform(op.low, op.high, size=shape)


def lower_and_compare(module: Any, entry: str, args: list[Any]) -> None:
    """The lowered entry, and its dump loaded back, compute what the evaluator does."""
    want = anfir.run(module[entry], *args)
    low = anfir.lower(module, entry=entry, args=args)
    check_arena(print_program(low))
    again = load_lir_text(print_program(low), f"{entry}.lir")
    for program in (low, again):
        got = anfir.run(program, *args)
        assert _same_exact(got, want), f"{entry}: {got} != {want}"


def _same_exact(got: Any, want: Any) -> bool:
    if isinstance(want, tuple):
        return isinstance(got, tuple) and len(got) == len(want) and all(map(_same_exact, got, want))
    g, w = np.asarray(got), np.asarray(want)
    if g.shape != w.shape:
        return False
    if w.dtype.kind in "fc":
        return bool(np.allclose(g, w, rtol=1e-12, atol=1e-14, equal_nan=True))
    return bool(np.array_equal(g, w))


@pytest.mark.parametrize("op", _OPS, ids=lambda o: o.id)
def test_library_operator_lowers_with_its_gradient(op: Any) -> None:
    params = ", ".join("xy"[:op.nargs])
    call = op.call.format(x="x", y="y")
    args = [_draw(op, (2, 3), 1), _draw(op, (3,), 2)][:op.nargs]
    text = f"def f({params}) = {call}\n"
    if op.grad:
        text += (f"def g({params}) = grad(lambda ({params}) sum(sin({call})) end, "
                 f"{', '.join(str(i) for i in range(op.nargs))})({params})\n")
    module = anfir.parse(text, f"{op.id}.anf")
    lower_and_compare(module, "f", args)
    if op.grad:
        lower_and_compare(module, "g", args)


def _literal(value: Any) -> str:
    if value is None:
        return "None"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and np.isinf(value):
        return "1e999"
    return repr(value)


@pytest.mark.parametrize("red", REDUCTIONS, ids=lambda r: r.id)
def test_library_reduction_lowers_with_its_gradient(red: Any) -> None:
    extra = "".join(f", {k}={_literal(v)}" for k, v in red.kw)
    defs = []
    for k, (axis, keepdims) in enumerate([(None, False), (1, True), ((0, 2), False), (-1, False)]):
        call = f"{red.name}({red.arg}, axis={_literal(axis)}, keepdims={_literal(keepdims)}{extra})"
        defs.append(f"def f{k}(x) = {call}")
        if red.grad:
            defs.append(f"def g{k}(x) = grad(lambda (y) sum(sin({call.replace('(x', '(y')})) end)(x)")
    module = anfir.parse("\n".join(defs) + "\n", f"{red.id}.anf")
    x = np.random.default_rng(3).uniform(red.low, red.high, size=(2, 3, 4))
    for name in module.graphs:
        lower_and_compare(module, name, [x])


# -- convolution, pooling and batch norm: the out= kernels of anfir/lowlevel/kernels.py -------------
# Each case and the gradient of sum(sin(case)) for every argument, lowered and run by the arena
# executor against the evaluator; `kernel` says whether every instruction must take the out= path
# (grouped convolutions run the primitive's evaluation).
CONV_CASES = [
    ("conv(x, w, b, stride=2, padding=1)", [(2, 3, 7, 6), (4, 3, 3, 3), (4,)], True),
    ("conv(x, w, dilation=2, padding=(1, 2))", [(1, 2, 8, 7), (3, 2, 3, 2)], True),
    ("conv(x, w, padding=(1, 0, 0, 2), stride=(1, 2))", [(2, 2, 5, 6), (3, 2, 2, 3)], True),
    ("conv(x, w, padding=\"same\")", [(1, 2, 6, 6), (2, 2, 4, 4)], True),
    ("conv(x, w, stride=2, padding=1)", [(2, 2, 9), (3, 2, 3)], True),  # 1-d
    ("conv(x, w, padding=1)", [(1, 2, 4, 3, 4), (2, 2, 3, 3, 2)], True),  # 3-d
    ("conv(x, w, groups=2, padding=1)", [(1, 4, 5, 5), (4, 2, 3, 3)], False),
    ("max_pool(x, 3, 2, padding=1, ceil_mode=true)", [(2, 3, 7, 8)], True),
    ("max_pool(x, 2, dilation=2)", [(1, 2, 7, 7)], True),
    ("max_pool(x, 3, 2)", [(2, 2, 9)], True),
    ("avg_pool(x, 3, 2, padding=1, ceil_mode=true, count_include_pad=false)", [(2, 3, 7, 8)], True),
    ("avg_pool(x, (2, 3), (1, 2), padding=(1, 1))", [(1, 2, 5, 7)], True),
    ("global_max_pool(x) + global_avg_pool(x)", [(2, 3, 4, 5)], True),
    ("batch_norm(x, s, b, m, exp(v), eps=0.001)", [(2, 3, 4, 4), (3,), (3,), (3,), (3,)], True),
]


@pytest.mark.parametrize("call,shapes,kernel", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_conv_pool_and_batch_norm_kernels_compute_the_evaluators_values(call: str, shapes: list[Any],
                                                                         kernel: bool) -> None:
    names = "xwbmv" if len(shapes) < 5 else "xsbmv"
    params = ", ".join(names[:len(shapes)])
    text = (f"def f({params}) = {call}\n"
            f"def g({params}) = grad(lambda ({params}) sum(sin({call})) end, "
            f"{', '.join(str(i) for i in range(len(shapes)))})({params})\n")
    module = anfir.parse(text, "conv_case.anf")
    rng = np.random.default_rng(7)
    args = [rng.standard_normal(shape) for shape in shapes]
    for entry in ("f", "g"):
        want = anfir.run(module[entry], *args)
        low = anfir.lower(module, entry=entry, args=args)
        check_arena(print_program(low))
        executor = Executor(load_lir_text(print_program(low), f"{entry}.lir"))
        assert _same(executor.run(*args), want), entry
        evaluated = [i.prim.name for i, step in zip(executor.instructions, executor.steps)
                     if step.__class__.__name__ == "_Evaluate"]
        assert not evaluated if kernel else evaluated, evaluated


def test_the_cnn_training_step_allocates_nothing_per_instruction() -> None:
    # The ResNet-style network's gradient at batch 4, 16 x 16: its smallest activation is
    # 4 x 8 x 4 x 4 f64 (4 KiB); an instruction writing through a temporary, or a numpy ufunc
    # buffering a strided or broadcast operand, would allocate at least that much.
    nets = anfir.parse(NETS, "nets.anf")
    types = [t.replace("f64[2, 3, 8, 8]", "f64[4, 3, 16, 16]").replace("f64[2, 5]", "f64[4, 5]")
             for t in RESNET_TYPES]
    grad = anfir.grad(nets["resnet"], tuple(range(len(types) - 2)))
    executor = Executor(anfir.lower(grad, args=types))
    assert executor.fast == len(executor.steps), "every instruction has an out= kernel"
    values = _values(types)
    assert _same(executor.run(*values), anfir.run(anfir.compile(grad, args=types), *values))
    tracemalloc.start()
    try:
        worst = (0, "")
        for step, instr in zip(executor.steps, executor.instructions):
            before = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            step()
            worst = max(worst, (tracemalloc.get_traced_memory()[1] - before, instr.prim.name))
    finally:
        tracemalloc.stop()
    assert worst[0] < 4096, f"{worst[1]} allocated {worst[0]} bytes"


def test_instructions_writing_outputs_move_up_and_free_their_arguments(monkeypatch: Any) -> None:
    # share_buffers moves each instruction that writes a declared output to right after the
    # instructions it reads from: the weight gradients, which the optimized graph computes last,
    # then free the activations and output gradients they read early.
    import anfir.lowlevel.share as share
    from anfir.lowlevel import lower_graph, plan_memory

    grad = anfir.grad(anfir.load(str(EXAMPLES / "mlp.anf"))["mlp_loss"], (0, 1))
    graph = anfir.compile(grad, args=MLP_TYPES)
    moved = plan_memory(share.share_buffers(lower_graph(graph)))
    instrs = moved.instructions()
    for index, instr in enumerate(instrs):
        if instr.output.kind == "output":
            writers = [i for i, other in enumerate(instrs[:index]) if other.output in instr.inputs]
            # nothing between its last argument's writer and it but other moved instructions
            start = max(writers, default=-1) + 1
            assert all(other.output.kind == "output" for other in instrs[start:index]), instr.name
    monkeypatch.setattr(share, "schedule_outputs", lambda instrs: instrs)
    kept = plan_memory(share.share_buffers(lower_graph(graph)))
    assert moved.max_live_bytes < kept.max_live_bytes
    values = _values(MLP_TYPES)
    assert _same(anfir.run(moved, *values), anfir.run(kept, *values))


def test_scratch_beyond_the_memory_limit_is_an_error_at_the_instruction(monkeypatch: Any) -> None:
    import anfir.lowlevel.executor as executor_module

    module = anfir.parse("def f(x, w) =\n  conv(x, w, padding=1)\n", "big.anf")
    args = [np.ones((1, 2, 16, 16)), np.ones((4, 2, 3, 3))]
    low = anfir.lower(module, args=args)
    assert _same(Executor(low).run(*args), anfir.run(module["f"], *args))
    # the declared buffers take ~13 KB, the conv's scratch (its padded input and a block of
    # rows of its window matrix) ~14 KB: a @scratch buffer of the arena, so the executor
    # refuses the program before allocating anything
    text = print_program(low)
    assert re.search(r"@scratch %\S+", text)
    monkeypatch.setattr(executor_module, "MAX_MEMORY_BYTES", 20_000)
    with pytest.raises(AnfirError, match=r"@f needs \d+ bytes \(arena and declared buffers\)"):
        Executor(low)
    # A program without its @scratch (a hand-written .lir) uses the executor's shared
    # workspace: beyond the limit, an error at the instruction.
    plain = re.sub(r", @scratch %\S+", "", text)
    plain = "\n".join(line for line in plain.split("\n")
                      if not re.match(r"  (%scratch\S* = alloc|dealloc %scratch)", line))
    shared = load_lir_text(plain, "big.lir")
    assert shared.instructions()[0].scratch is None
    with pytest.raises(AnfirError, match="scratch workspace") as info:
        Executor(shared)
    assert info.value.loc is not None and (info.value.loc.file, info.value.loc.line) == ("big.anf", 2)


def test_max_pool_ties_and_nans_pick_the_evaluators_cell() -> None:
    # The kernels find each window's maximum offset by offset; ties go to the first offset and
    # a NaN wins (the first NaN), as np.max and np.argmax over the whole window decide.
    module = anfir.parse("def f(x) = max_pool(x, 3, 1, padding=1)\n"
                         "def g(x) = grad(lambda (y) sum(max_pool(y, 3, 1, padding=1) * 2.0) end)(x)\n",
                         "ties.anf")
    x = np.random.default_rng(5).integers(0, 3, size=(2, 2, 6, 6)).astype(float)  # many ties
    x[0, 0, 2, 3] = x[1, 1, 0, 0] = x[1, 1, 0, 1] = np.nan
    for entry in ("f", "g"):
        want = anfir.run(module[entry], x)
        got = Executor(anfir.lower(module, entry=entry, args=[x])).run(x)
        assert np.array_equal(got, want, equal_nan=True), entry

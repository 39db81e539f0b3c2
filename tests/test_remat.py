"""The ``remat`` phase: automatic rematerialisation of gradient programs.

Results equal the program without it (evaluator and arena executor), the
planned arena shrinks, the dump marks the recomputed nodes and carries the
summary line and loads back, a budget is met or refused with the smallest
budget reachable, and the min-cut solver agrees with brute force."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_harness import run_in_process
from example_args import resnet18_args, transformer_args

import anfir
from anfir.errors import UsageError
from anfir.lowlevel.remat import RECOMPUTED, RematError, _FlowNetwork

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MLP2_TYPES = ["f64[8, 16]", "f64[16]", "f64[16, 4]", "f64[4]", "f64[32, 8]", "f64[32, 4]"]


def same(got: Any, want: Any, rtol: float = 1e-12) -> None:
    """Equal leaf by leaf (nested tuples of arrays)."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            same(g, w, rtol)
        return
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=rtol, atol=1e-13)


def _values(types: list[str]) -> list[Any]:
    rng = np.random.default_rng(3)
    return [rng.standard_normal([int(d) for d in t[4:-1].split(", ")]) for t in types]


CASES = {
    "resnet18": ("resnet18.anf", "resnet18_grad",
                 lambda: list(resnet18_args(batch=2, size=32, widths=(8, 16, 32, 64)))),
    "transformer": ("transformer.anf", "block_grad", lambda: list(transformer_args(batch=2, length=8))),
    "mlp2": ("mlp2.anf", "mlp2_step", lambda: _values(MLP2_TYPES)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_min_cut_gives_the_same_results_in_a_smaller_arena(case: str) -> None:
    file, entry, make_args = CASES[case]
    mod = anfir.load(str(EXAMPLES / file))
    args = make_args()
    want = anfir.run(anfir.compile(mod, entry=entry, args=args), *args)
    graph = anfir.compile(mod, entry=entry, args=args, remat="min-cut")
    same(anfir.run(graph, *args), want, 1e-10)
    plain = anfir.lower(mod, entry=entry, args=args)
    low = anfir.lower(mod, entry=entry, args=args, remat="min-cut")
    same(anfir.run(low, *args), want, 1e-10)
    assert low.peak_bytes < plain.peak_bytes, (low.peak_bytes, plain.peak_bytes)
    if case == "resnet18":  # conv outputs kept, batch norm and relu recomputed
        assert low.peak_bytes <= 0.85 * plain.peak_bytes, (low.peak_bytes, plain.peak_bytes)


def test_the_dump_marks_recomputed_nodes_and_reloads(tmp_path: Path) -> None:
    mod = anfir.load(str(EXAMPLES / "mlp2.anf"))
    args = _values(MLP2_TYPES)
    anfir.compile(mod, entry="mlp2_step", args=args, remat="min-cut", dump_dir=str(tmp_path))
    names = sorted(p.name for p in tmp_path.glob("*.ir"))
    assert names[-2:] == ["06_remat.ir", "07_validate.ir"]
    text = (tmp_path / "06_remat.ir").read_text(encoding="utf-8")
    line = re.search(r"^# remat: (\d+) values kept, (\d+) values recomputed, (-?\d+) bytes saved "
                     r"\(modeled\), (\d+) extra FLOPs", text, re.M)
    assert line is not None
    recomputed = int(line.group(2))
    assert recomputed > 0 and int(line.group(3)) > 0
    assert text.count(f"({RECOMPUTED}") == recomputed  # every copy marked, at its original's location
    assert "remat_barrier(" in text
    want = anfir.run(anfir.compile(mod, entry="mlp2_step", args=args), *args)
    same(anfir.run(anfir.load(str(tmp_path / "06_remat.ir")), *args), want)


def test_a_budget_is_met_or_refused_with_the_smallest_reachable() -> None:
    file, entry, make_args = CASES["resnet18"]
    mod = anfir.load(str(EXAMPLES / file))
    args = make_args()
    plain = anfir.lower(mod, entry=entry, args=args)
    least = anfir.lower(mod, entry=entry, args=args, remat="min-cut")
    budget = (plain.peak_bytes + least.peak_bytes) // 2
    low = anfir.lower(mod, entry=entry, args=args, remat=budget)
    assert low.peak_bytes <= budget
    same(anfir.run(low, *args), anfir.run(plain, *args), 1e-10)
    # a budget the program already meets recomputes nothing
    met = anfir.compile(mod, entry=entry, args=args, remat=2 * plain.peak_bytes)
    assert RECOMPUTED not in anfir.dump_ir(met)


def test_a_budget_no_plan_meets_names_the_smallest_reachable() -> None:
    mod = anfir.load(str(EXAMPLES / "mlp2.anf"))
    least = anfir.lower(mod, entry="mlp2_step", args=MLP2_TYPES, remat="min-cut")
    with pytest.raises(RematError) as info:
        anfir.compile(mod, entry="mlp2_step", args=MLP2_TYPES, remat=1000)
    message = str(info.value)
    found = re.search(r"smallest planned arena reachable is (\d+) bytes", message)
    assert found is not None and "mlp2.anf:7:" in message, message
    smallest = int(found.group(1))
    assert 1000 < smallest <= least.peak_bytes
    # ...and that budget is met
    low = anfir.lower(mod, entry="mlp2_step", args=MLP2_TYPES, remat=smallest)
    assert low.peak_bytes <= smallest
    values = _values(MLP2_TYPES)
    same(anfir.run(low, *values), anfir.run(anfir.lower(mod, entry="mlp2_step", args=MLP2_TYPES),
                                            *values))


@pytest.mark.parametrize("bad", ["fast", 0, -5, 1.5, True])
def test_bad_options_are_usage_errors(bad: Any) -> None:
    with pytest.raises(UsageError, match="min-cut"):
        anfir.compile(anfir.load(str(EXAMPLES / "mlp2.anf")), entry="mlp2_step",
                      args=MLP2_TYPES, remat=bad)


def test_a_program_without_gradient_is_left_alone() -> None:
    mod = anfir.parse("def f(x, w) = sum(tanh(x @ w) * 2.0)\n")
    x, w = np.ones((3, 4)), np.full((4, 2), 0.5)
    graph = anfir.compile(mod, args=[x, w], remat="min-cut")
    assert RECOMPUTED not in anfir.dump_ir(graph)
    same(anfir.run(graph, x, w), anfir.run(mod["f"], x, w))


def test_checkpoint_and_remat_together() -> None:
    src = """
def layer(x, w) = tanh(sin(x @ w) * 2.0 + x)
def loss(x, w) = sum(checkpoint(layer)(layer(checkpoint(layer)(x, w), w), w))
def step(x, w) = grad(loss, 0, 1)(x, w)
"""
    mod = anfir.parse(src)
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(6, 6)) * 0.5, rng.normal(size=(6, 6)) * 0.5
    want = anfir.run(mod["step"], x, w)
    same(anfir.run(anfir.compile(mod, entry="step", args=[x, w], remat="min-cut"), x, w), want)
    same(anfir.run(anfir.lower(mod, entry="step", args=[x, w], remat="min-cut"), x, w), want)


def test_the_command_line_flag(tmp_path: Path) -> None:
    args = ["compile", str(EXAMPLES / "mlp2.anf"), "--entry", "mlp2_step", "--args", *MLP2_TYPES,
            "--lower", "--remat", "min-cut"]
    status, out, err = run_in_process(args, tmp_path)
    assert status == 0, err
    assert re.search(r"^remat: \d+ values kept, \d+ values recomputed", out, re.M), out
    status, out, err = run_in_process([*args[:-1], "64"], tmp_path)
    assert status == 1 and "smallest planned arena reachable is" in err, err


def _brute_force_cut(n: int, edges: list[tuple[int, int, int]], s: int, t: int) -> int:
    best = None
    others = [v for v in range(n) if v not in (s, t)]
    for bits in itertools.product((0, 1), repeat=len(others)):
        side = {s} | {v for v, b in zip(others, bits) if b}
        cost = sum(c for a, b, c in edges if a in side and b not in side)
        best = cost if best is None else min(best, cost)
    assert best is not None
    return best


def test_max_flow_equals_the_brute_force_min_cut() -> None:
    rng = np.random.default_rng(0)
    for _ in range(40):
        n = int(rng.integers(3, 8))
        edges = [(int(a), int(b), int(rng.integers(0, 10))) for a, b in
                 rng.integers(0, n, size=(int(rng.integers(2, 16)), 2)) if a != b]
        net = _FlowNetwork(n)
        for a, b, c in edges:
            net.add(a, b, c)
        flow = net.max_flow(0, n - 1)
        assert flow == _brute_force_cut(n, edges, 0, n - 1)
        side = net.reachable(0)
        assert not side[n - 1]
        assert sum(c for a, b, c in edges if side[a] and not side[b]) == flow

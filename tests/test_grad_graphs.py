"""The *shape* of gradient graphs: flat, small, readable, located at the user's code."""

from __future__ import annotations

import os

import numpy as np
import pytest

import anfir
from anfir.ir.nodes import CNode, ValueNode
from anfir.ir.walk import reachable_graphs
from spec_examples import MLP


FORBIDDEN = {"switch", "partial", "tuple_getitem", "zeros_like", "env_getitem", "env_setitem",
             "newenv", "gadd", "J", "grad_seed", "grad_arg_check"}


def primitive_calls(graph):
    """(graphs reached, names of the primitives called) of a compiled graph."""
    graphs = reachable_graphs([graph])
    names = []
    for g in graphs:
        for node in g.nodes():
            if isinstance(node, CNode):
                callee = node.inputs[0]
                assert isinstance(callee, ValueNode), f"a call of a computed function in @{g.name}"
                names.append(callee.value.name)
    return graphs, names


def assert_flat(graph):
    graphs, names = primitive_calls(graph)
    assert len(graphs) == 1, [g.name for g in graphs]
    assert not FORBIDDEN.intersection(names), names
    return names


def test_gradient_of_sin_x_times_x_is_a_handful_of_primitives():
    f = anfir.parse("def f(x) = sin(x) * x")["f"]
    compiled = anfir.compile(anfir.grad(f), args=[2.0])
    names = assert_flat(compiled)
    assert len(names) <= 7, names
    assert sorted(names) == ["add", "cos", "mul", "sin"]
    assert anfir.run(compiled, 2.0) == pytest.approx(np.sin(2.0) + 2.0 * np.cos(2.0))


@pytest.mark.parametrize("with_examples", [True, False])
def test_gradient_of_mlp_loss_is_one_flat_graph_of_at_most_25_calls(with_examples):
    mlp = anfir.parse(MLP)["mlp_loss"]
    rng = np.random.default_rng(0)
    args = [rng.normal(size=s) for s in [(3, 5), (5, 2), (4, 3), (4, 2)]]
    compiled = anfir.compile(anfir.grad(mlp, (0, 1)), args=args if with_examples else None)
    names = assert_flat(compiled)
    assert len(names) <= 25, names
    got = anfir.run(compiled, *args)
    want = anfir.run(anfir.grad(mlp, (0, 1)), *args)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b)


def test_in_program_gradient_through_a_loop_compiles_flat():
    mod = anfir.parse("""
def power(x, n) =
  let loop = lambda (i, acc)
    if i < n then loop(i + 1, acc * x) else acc end in
  loop(0, 1.0)
def dpower(x) = grad(power)(x, 3)
""")
    compiled = anfir.compile(mod, entry="dpower", args=[2.0])
    assert anfir.run(compiled, 2.0) == pytest.approx(12.0)
    assert anfir.run(compiled, -1.5) == pytest.approx(3 * 1.5 ** 2)


def test_ad_dump_names_transformed_graphs_and_points_at_user_code(tmp_path):
    path = tmp_path / "prog.anf"
    path.write_text("def f(x) =\n  let y = sin(x) in\n  y * x\n\ndef main(x) = grad(f)(x)\n")
    result = anfir.passes.pipeline.compile_program(str(path), args=[1.0], dump_dir=str(tmp_path / "d"))
    names = sorted(os.listdir(tmp_path / "d"))
    ad_dump = next(n for n in names if n.endswith("_ad.ir"))
    text = (tmp_path / "d" / ad_dump).read_text()
    assert "subgraph @▸f" in text and "subgraph @◂f" in text
    assert "prog.anf:2:" in text and "(ad: " in text  # sin(x) on line 2, marked as made by ad
    assert anfir.run(result.graph, 1.0) == pytest.approx(np.sin(1.0) + np.cos(1.0))


def test_mlp_gradient_matches_the_hand_written_backward_once_shapes_are_known():
    # With example shapes, the seed of sum(e ** 2) / 2 folds into e itself: no
    # pow, no unreduce, the same 14 calls as numpy's forward+backward by hand.
    mlp = anfir.parse(MLP)["mlp_loss"]
    rng = np.random.default_rng(1)
    args = [rng.normal(size=s) for s in [(3, 5), (5, 2), (4, 3), (4, 2)]]
    compiled = anfir.compile(anfir.grad(mlp, (0, 1)), args=args)
    names = assert_flat(compiled)
    assert "pow" not in names and "unreduce" not in names, names
    assert len(names) <= 14, names
    w1, w2, x, y = args
    h = np.tanh(x @ w1)
    r = h @ w2 - y
    want = (x.T @ ((r @ w2.T) * (1.0 - h * h)), h.T @ r)
    for got, expected in zip(anfir.run(compiled, *args), want):
        np.testing.assert_allclose(got, expected)


@pytest.mark.parametrize("body, dtype", [
    ("sum(x * x) * 3", "f64"), ("sum(x) * 0.5 - 2", "f64"), ("3.0 / mean(x)", "f64"),
    ("sum(x * x) * 3", "f32"), ("sum(x - 1.0) / 4", "f32")])
def test_scalar_seed_folding_keeps_values_and_dtypes(body, dtype):
    f = anfir.parse(f"def f(x: {dtype}[2, 3]) -> {dtype} = {body}")["f"]
    x = np.arange(1.0, 7.0).reshape(2, 3).astype({"f64": np.float64, "f32": np.float32}[dtype])
    want = anfir.run(anfir.grad(f), x)
    got = anfir.run(anfir.compile(anfir.grad(f), args=[x]), x)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6)

"""The MindIR writer's core: programs export, import back and compute ``anfir.run``'s numbers.

Covers the gradients of reductions over some axes (``unreduce`` reads its axes and
keepdims from its inputs), a program returning a string (refused, located: MindSpore
computes no strings), integers with floats (computed in the float), and programs
compiled with dimension variables (``f64[N, 3]``): the MLP and a CNN gradient over a
symbolic batch, training steps with every dimension a variable, products with vectors,
reshapes, gradients through ``if`` (environments holding run-time shapes), control flow
on a run-time dimension.  Their files hold -1 dims and MindSpore's ``Shape``, and run
equal to anfir for several concrete sizes; what MindIR cannot hold is refused by name.
References: ``anfir.run`` of the source (and central differences for the reductions).
The live check against MindSpore itself is tests_mindspore/test_mindspore_dynamic.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest

import anfir
from anfir.primitives.loops import flatten_value
import anfir.interop.mindir.schema
from anfir.interop.mindir import MindirError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def leaves(value: Any) -> list[Any]:
    """The leaves of a nested tuple, in order (iteratively)."""
    return flatten_value(value)[0]


def round_trip(source: Any, entry: Any, args: Any, runs: Sequence[tuple[Any, ...]]) -> bytes:
    """Export ``source``'s entry for ``args`` (values or types), import it back, and check
    the import computes what ``anfir.run`` of the compiled source does on every run."""
    data = anfir.export_mindir(source, entry=entry, args=args)
    back = anfir.import_mindir(data)
    compiled = anfir.compile(source, entry=entry, args=args)
    for values in runs:
        want, got = leaves(anfir.run(compiled, *values)), leaves(anfir.run(back.entry, *values))
        assert len(want) == len(got)
        for a, b in zip(want, got):
            if isinstance(a, str):
                assert a == b
                continue
            assert np.shape(a) == np.shape(b), (np.shape(a), np.shape(b))
            # f32: the writer may sum in another order (ReduceSum of kept axes, then leading)
            single = np.asarray(a).dtype == np.float32
            np.testing.assert_allclose(np.asarray(b, dtype=float), np.asarray(a, dtype=float),
                                       rtol=1e-5 if single else 1e-12, atol=1e-6 if single else 1e-12)
    return data


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("axis,keepdims", [(1, "true"), ((0, 2), "false"), (-1, "false"), ((2, 0), "true"),
                                           (None, "false")])
def test_the_gradient_of_a_reduction_over_some_axes_round_trips(reduction: str, axis: Any,
                                                                 keepdims: str) -> None:
    call = f"{reduction}(y, axis={'None' if axis is None else axis}, keepdims={keepdims})"
    mod = anfir.parse(f"def g(x) = grad(lambda (y) sum(sin({call}) * {call}) end)(x)\n")
    x = np.random.default_rng(3).uniform(-1.0, 1.0, size=(2, 3, 4))
    round_trip(mod, "g", [x], [(x,)])
    # the reference itself: the gradient by central differences
    g = anfir.run(anfir.compile(mod, entry="g", args=[x]), x)
    f = anfir.parse(f"def f(y) = sum(sin({call}) * {call})\n")["f"]
    e = np.zeros_like(x)
    e[1, 2, 3] = 1e-6
    numeric = (anfir.run(f, x + e) - anfir.run(f, x - e)) / 2e-6
    np.testing.assert_allclose(g[1, 2, 3], numeric, rtol=1e-6)


def test_a_program_returning_a_string_is_refused_with_a_located_error() -> None:
    # MindSpore's runtime computes no strings (GraphCell returns a meaningless uint8 for
    # one; its own export of such a cell fails): a located MindirError, not a file that
    # MindSpore runs wrong, nor a bare exception.
    mod = anfir.parse('def count_down(n) =\n'
                      '  let loop = lambda (i) if i == 0 then "done" else loop(i - 1) end in\n'
                      '  loop(n)\n', "count.anf")
    assert anfir.run(mod["count_down"], 3) == "done"
    with pytest.raises(anfir.AnfirError) as caught:
        anfir.export_mindir(mod, entry="count_down", args=[10])
    assert isinstance(caught.value, MindirError)
    assert "a string value" in str(caught.value)
    assert caught.value.loc is not None and caught.value.loc.file == "count.anf"
    assert caught.value.loc.line == 3  # the entry, whose result is the string
    # a string in a tuple result likewise
    pair = anfir.parse('def f(x) = (x * 2.0, "twice")\n', "pair.anf")
    with pytest.raises(MindirError, match="a string value"):
        anfir.export_mindir(pair, entry="f", args=[1.0])


# -- shapes known only at run time -------------------------------------------------------------
SYMBOLIC = anfir.parse("""
def f(x: f64[N, 3]) =
  let flat = reshape(x, (shape(x)[0] * 3,)) in
  (flat, mean(x), broadcast_to(sum(x, 0), shape(x)), size(x) / 3, shape(x)[0] - 1)
def loss(w: f64[3], x: f64[N, 3]) = mean(sin(x * w)) + sum(sin(reshape(x, (3, shape(x)[0])) * 2.0))
def batched(a: f64[B, N, 3], b: f64[3, 2]) = sum(sin(a @ b) * mean(a, axis=(1, 2), keepdims=true))
def outer(a: f64[N, 1], b: f64[M]) = sum(sin(a * b))
""", "symbolic.anf")
"""Programs typed with dimension variables (N, B, M): compiled without arguments."""


def _data(seed: int, *shapes: tuple[int, ...]) -> tuple[Any, ...]:
    rng = np.random.default_rng(seed)
    return tuple(rng.normal(size=s) for s in shapes)


def test_shapes_known_only_at_run_time_round_trip_for_several_sizes() -> None:
    data = round_trip(SYMBOLIC, "f", None, [(np.arange(3.0 * n).reshape(n, 3),) for n in (1, 4, 7)])
    model = anfir.interop.mindir.schema.classes()["ModelProto"]()
    model.ParseFromString(data)
    assert list(model.graph.input[0].tensor[0].dims) == [-1, 3]  # the dimension variable
    ops = {p.op_type for p in model.primitives}
    assert {"Shape", "ScalarMul"} <= ops, ops


def test_gradients_with_shapes_known_only_at_run_time_round_trip() -> None:
    dloss = anfir.grad(SYMBOLIC["loss"], wrt=(0, 1))
    round_trip(dloss, None, None, [(np.array([0.5, -1.0, 2.0]), np.arange(3.0 * n).reshape(n, 3) / 7.0)
                                   for n in (1, 2, 5)])
    # batches: the matmul gradients and the unreduce of a mean over two axes
    dbatched = anfir.grad(SYMBOLIC["batched"], wrt=(0, 1))
    round_trip(dbatched, None, None, [_data(b, (b, n, 3), (3, 2)) for b, n in ((1, 1), (2, 3), (4, 2))])
    # sum_to of the axis x has as 1 (N, 1) and of the leading one (M)
    douter = anfir.grad(SYMBOLIC["outer"], wrt=(0, 1))
    round_trip(douter, None, None, [_data(n + m, (n, 1), (m,)) for n, m in ((1, 1), (3, 4), (5, 2))])


@pytest.mark.parametrize("entry,args,shapes", [
    ("mlp_loss", None, [((3, 8), (8, 2), (b, 3), (b, 2)) for b in (1, 16)] + [((2, 5), (5, 4), (3, 2), (3, 4))]),
])
def test_the_mlp_gradient_with_a_symbolic_batch_round_trips(entry: str, args: Any, shapes: Any) -> None:
    import spec_examples
    mlp = anfir.parse(spec_examples.MLP)[entry]
    runs = [_data(k, *s) for k, s in enumerate(shapes)]
    round_trip(anfir.value_and_grad(mlp, wrt=(0, 1, 2, 3)), None, args, runs)


def test_a_training_step_with_every_dimension_a_variable_round_trips() -> None:
    mlp2 = anfir.load(str(ROOT / "examples" / "mlp2.anf"))
    round_trip(mlp2, "mlp2_step", None,
               [_data(b, (3, 5), (5,), (5, 2), (2,), (b, 3), (b, 2)) for b in (1, 6)])
    train = anfir.parse((ROOT / "examples" / "mlp.anf").read_text() + """
def step(w1, w2, x, y, rate) =
  let vg = value_and_grad(mlp_loss, 0, 1)(w1, w2, x, y) in
  (vg[0], w1 - rate * vg[1][0], w2 - rate * vg[1][1])
""")
    types = ["f64[D, H]", "f64[H, K]", "f64[B, D]", "f64[B, K]", "f64"]
    round_trip(train, "step", types, [_data(b, (1, 16), (16, 1), (b, 1), (b, 1)) + (0.005,) for b in (3, 10)]
               + [_data(0, (2, 3), (3, 4), (5, 2), (5, 4)) + (0.1,)])


def test_a_broadcast_known_only_at_run_time_is_refused_by_name() -> None:
    # anfir's shape rules refuse N against M or 3 in a program (so no typed program gets
    # here); the writer's helper still names the case rather than guess.
    from anfir.interop.mindir.export_rules.common import Unsupported, broadcast_dims
    assert broadcast_dims(("B", 1), (3,), "t") == ("B", 3)
    assert broadcast_dims((1, "N"), ("B", "N"), "t") == ("B", "N")
    with pytest.raises(Unsupported, match="whether N and M broadcast is known only at run time"):
        broadcast_dims(("N",), ("M",), "t")
    with pytest.raises(Unsupported, match="do not broadcast"):
        broadcast_dims((2,), (3,), "t")


VECTORS = anfir.parse("""
def mv(a, v) = sum(sin(a @ v))
def vm(v, a) = sum(sin(v @ a))
def vv(u, v) = sin(u @ v)
def loss(w: f64[3], x: f64[N, 3]) = mean(sin(x * w)) + sum(sin(reshape(x, (3, shape(x)[0])) @ sin(sum(x, 1))))
""", "vectors.anf")
"""Products with a vector operand (numpy's rules: a row on the left, a column on the right)."""


@pytest.mark.parametrize("name,shapes", [("mv", [(3, 4), (4,)]), ("mv", [(2, 3, 4), (4,)]),
                                         ("vm", [(4,), (4, 3)]), ("vm", [(4,), (2, 4, 3)]),
                                         ("vv", [(4,), (4,)])])
def test_the_gradient_of_a_product_with_a_vector_round_trips(name: str, shapes: list[tuple[int, ...]]) -> None:
    args = _data(len(shapes[0]) + len(shapes[1]), *shapes)
    round_trip(anfir.grad(VECTORS[name], wrt=(0, 1)), None, list(args), [args])


def test_the_gradient_of_a_product_with_a_vector_of_run_time_length_round_trips() -> None:
    # the program of test_onnx_export's test_gradients_with_shapes_known_only_at_run_time,
    # its vector made without `ones` (another branch's rule)
    round_trip(anfir.grad(VECTORS["loss"], wrt=(0, 1)), None, None,
               [(np.array([0.5, -1.0, 2.0]), np.arange(3.0 * n).reshape(n, 3) / 7.0) for n in (1, 2, 5)])


CNN = anfir.parse("""
def cnn_loss(w1: f32[4, 1, 3, 3], b1: f32[4], w2: f32[6, 4, 3, 3], w3: f32[12, 3], b3: f32[3],
             x: f32[B, 1, 8, 8], y: f32[B, 3]) -> f32 =
  let h1 = relu(conv(x, w1, b1, padding=1)) in
  let p1 = max_pool(h1, 2) in
  let h2 = tanh(conv(p1, w2, padding=(1, 1, 0, 0), stride=(1, 2))) in
  let p2 = avg_pool(h2, (2, 1), stride=(2, 1)) in
  let out = reshape(p2, (shape(p2)[0], 12)) @ w3 + b3 in
  mean((out - y) ** 2)
def padded(x: f32[B, 1, 4, 4]) = sum(max_pool(x, 2, padding=1))
""", "cnn.anf")
"""tests/export_samples.py's CNN with MindSpore's VALID average pooling, its batch B a variable."""


def cnn_data(seed: int, batch: int) -> tuple[np.ndarray, ...]:
    """(w1, b1, w2, w3, b3, x, y) for :data:`CNN`, float32."""
    rng = np.random.default_rng(seed)
    shapes = [(4, 1, 3, 3), (4,), (6, 4, 3, 3), (12, 3), (3,), (batch, 1, 8, 8), (batch, 3)]
    return tuple((rng.normal(size=s) * 0.5).astype(np.float32) for s in shapes)


def test_a_cnn_gradient_with_a_symbolic_batch_round_trips() -> None:
    # conv, its input gradient (Conv2DBackpropInput of x's run-time Shape), max and average
    # pooling and their gradients, for batches of 1 and 3
    round_trip(anfir.value_and_grad(CNN["cnn_loss"], wrt=(0, 1, 2, 3, 4)), None, None,
               [cnn_data(b, b) for b in (1, 3)])


def test_a_padded_max_pool_of_a_symbolic_batch_is_refused_by_name() -> None:
    with pytest.raises(MindirError, match="padded max_pool of a batch known only at run time") as caught:
        anfir.export_mindir(CNN, entry="padded")
    assert caught.value.loc is not None and caught.value.loc.file == "cnn.anf"
    # with a concrete batch it exports
    x = np.random.default_rng(0).normal(size=(2, 1, 4, 4)).astype(np.float32)
    round_trip(CNN, "padded", [x], [(x,)])


RESHAPES = anfir.parse("""
def fl(x: f64[B, 2, 3]) = sin(flatten(x, 1))
def fl2(x: f64[B, N, 3]) = sin(flatten(x, 1))
def sq(x: f64[B, 1, N]) = sin(squeeze(x, 1))
def sqa(x: f64[B, 1, N, 1]) = sin(squeeze(x, (1, 3)))
def us(x: f64[B, N]) = sin(unsqueeze(x, (0, 2)))
def gfl(x: f64[B, 2, 3]) = grad(lambda (y) sum(sin(flatten(y, 1)) * 2.0) end)(x)
def sqn(x: f64[B, 1, N, 1]) = sin(squeeze(x))
""", "reshapes.anf")
"""flatten/squeeze/unsqueeze whose results have dimensions known only at run time."""

RESHAPE_SHAPES = {"fl": lambda b: [(b, 2, 3)], "fl2": lambda b: [(b, b + 1, 3)], "sq": lambda b: [(b, 1, b + 1)],
                  "sqa": lambda b: [(b, 1, b + 2, 1)], "us": lambda b: [(b, b + 1)], "gfl": lambda b: [(b, 2, 3)]}


@pytest.mark.parametrize("name", sorted(RESHAPE_SHAPES))
def test_reshapes_to_shapes_known_only_at_run_time_round_trip(name: str) -> None:
    round_trip(RESHAPES, name, None, [_data(b, *RESHAPE_SHAPES[name](b)) for b in (1, 3, 4)])


def test_a_squeeze_of_every_unit_axis_with_dimension_variables_is_refused_by_name() -> None:
    # a variable dimension may be 1 at run time: which axes go is decided on the value
    with pytest.raises(MindirError, match="squeeze of every length-1 axis") as caught:
        anfir.export_mindir(RESHAPES, entry="sqn")
    assert caught.value.loc is not None and caught.value.loc.file == "reshapes.anf"


BRANCHES = anfir.parse("""
def f(w: f64[3], x: f64[N, 3]) = sum(if sum(w) > 0.0 then sin(x * w) else x * w)
def h(w: f64[3], x: f64[N, 3]) = let g = lambda (v) sum(sin(x * v)) end in (if sum(w) > 0.0 then g(w) else g(w * 2.0))
def k(w: f64[3], x: f64[N, 3]) =
  let y = sin(x) in
  sum((if sum(w) > 0.0 then lambda (v) sum(y * v) end else lambda (v) sum(y * y * v) end)(w) * y)
def l(x: f64[N, 3]) = let y = sin(x) in sum(if sum(x) > 0.0 then y else y * 2.0)
""", "branches.anf")
"""Gradients through `if` whose backpropagators return gradient environments holding
tensors with dimension variables (their slots' zeros are 0-d: no Environ ops)."""

BRANCH_RUNS = {name: [((np.array(w), x) if name != "l" else (x,))
                      for w in ([0.5, -1.0, 2.0], [-1.0, -1.0, 0.0])
                      for x in (np.linspace(-1.0, 1.0, 3 * n).reshape(n, 3) * (1.0 if w[0] > 0 else -1.0)
                                for n in (1, 3))]
               for name in ("f", "h", "k", "l")}


@pytest.mark.parametrize("name,wrt", [("f", (0,)), ("f", (0, 1)), ("h", (0, 1)), ("k", (0,)), ("k", (0, 1)),
                                      ("l", (0,))])
def test_gradients_through_branches_with_dimension_variables_round_trip(name: str, wrt: tuple[int, ...]) -> None:
    graph = anfir.grad(BRANCHES[name], wrt=wrt)
    data = round_trip(graph, None, None, BRANCH_RUNS[name])
    model = anfir.interop.mindir.schema.classes()["ModelProto"]()
    model.ParseFromString(data)
    # environments as tuples: MindSpore's loader types no Environ op
    assert not {p.op_type for p in model.primitives} & {"EnvironCreate", "EnvironSet", "EnvironGet"}


PROMOTIONS = anfir.parse("""
def f(n, y) = (n * 0.5, n < y, 2 * y, n + y, y - n, maximum(n, y))
def g(x: f64[N, 3]) = x * (shape(x)[0] * 0.5)
def h(k: i64[3], x: f64[3]) = (k * x, k / 2, x / k)
""", "promote.anf")
"""Integers with floats: anfir computes in the float (MindSpore's ops, in their first
operand's integer dtype, would truncate the float)."""


@pytest.mark.parametrize("entry,args,runs", [
    ("f", [3, 3.5], [(3, 3.5), (-2, 0.25), (7, -7.5)]),
    ("g", None, [(np.ones((n, 3)) * 1.5,) for n in (1, 3, 4)]),
    ("h", [np.array([1, -2, 3]), np.array([0.5, 1.5, -2.0])],
     [(np.array([1, -2, 3]), np.array([0.5, 1.5, -2.0])), (np.array([7, 0, -5]), np.array([3.0, 1.0, 0.5]))]),
])
def test_integers_with_floats_compute_in_the_float(entry: str, args: Any, runs: Any) -> None:
    round_trip(PROMOTIONS, entry, args, runs)


SWEEP = {
    "softmax": "def f(x: f64[B, 4]) = sum(softmax(x, axis=1) * x)",
    "log_softmax": "def f(x: f64[B, 4]) = sum(log_softmax(x, axis=-1))",
    "transpose": "def f(x: f64[B, 4]) = sum(sin(transpose(x)) @ x)",
    "where": "def f(x: f64[B, 4]) = sum(where(x > 0.0, x, x * x))",
    "var": "def f(x: f64[B, 4]) = sum(var(x, axis=0))",
    "unsqueeze": "def f(x: f64[B, 4]) = sum(sin(unsqueeze(x, 1) * x))",
    "mean": "def f(x: f64[B, 4]) = mean(x * x) / mean(x)",
    "sizes": "def f(x: f64[B, 4]) = floor_div(shape(x)[0], 2) + size(x) - 1",
    "shape": "def f(x: f64[B, 4]) = (shape(x), shape(x)[0] * shape(x)[1])",
    # floor division of a negative run-time integer: floor, not truncation (-5 // 2 is -3)
    "negative": "def f(x: f64[B, 4]) = (floor_div(shape(x)[0] - 6, 2), (shape(x)[0] - 6) * 3, 7 - shape(x)[0])",
}
"""Programs over a batch B known only at run time, each with its gradient where it has one."""
SWEEP_VALUE_ONLY = ("sizes", "shape", "negative")


@pytest.mark.parametrize("name", sorted(SWEEP))
def test_programs_over_a_run_time_batch_round_trip(name: str) -> None:
    f = anfir.parse(SWEEP[name] + "\n")["f"]
    runs = [_data(b, (b, 4)) for b in (1, 3, 5)]
    round_trip(f, None, None, runs)
    if name not in SWEEP_VALUE_ONLY:
        round_trip(anfir.grad(f), None, None, runs)


CONTROL = anfir.parse("""
def f(x: f64[N, 3]) =
  let loop = lambda (i, acc) if i == 0 then acc else loop(i - 1, acc + sum(x)) end in loop(shape(x)[0], 0.0)
def g(x: f64[N, 3]) = if shape(x)[0] > 2 then sum(x) else sum(x * x)
""", "control.anf")
"""A loop counting a run-time dimension down, an `if` on one (the scalar goes to a
0-d tensor where a graph takes it)."""


@pytest.mark.parametrize("entry", ["f", "g"])
def test_control_flow_on_a_run_time_dimension_round_trips(entry: str) -> None:
    round_trip(CONTROL, entry, None, [_data(n, (n, 3)) for n in (1, 3, 4)])

"""MindSpore ``.mindir`` files: MindSpore's own exports imported and run, the
gradient of an imported cell against MindSpore's, anfir's exports read back,
and malformed files refused with located errors.

The fixtures are made by ``tests/mindir_fixtures/make_fixtures.py`` in
MindSpore's own venv (each ``NAME.npz`` holds the inputs and MindSpore's
results); nothing here needs MindSpore (the live check is tests_mindspore/).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import anfir
from anfir.primitives.loops import flatten_value
from anfir.errors import AnfirError
from anfir.interop.mindir import MindirError, import_mindir

FIXTURES = Path(__file__).resolve().parent / "mindir_fixtures"
CASES = ["dense_relu", "conv_net", "control_flow", "control_flow_else", "mlp_loss", "mlp_grad",
         "while_loss", "while_grad", "conv_bn"]


def fixture(name: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(inputs, MindSpore's outputs) of a fixture."""
    data = np.load(FIXTURES / f"{name}.npz")
    count_in = sum(1 for k in data.files if k.startswith("in"))
    count_out = sum(1 for k in data.files if k.startswith("out"))
    return [data[f"in{k}"] for k in range(count_in)], [data[f"out{k}"] for k in range(count_out)]


def assert_close(got: Any, want: np.ndarray, where: str) -> None:
    """1e-6 relative for f32, 1e-12 for f64 (the issue's bar), same dtype and shape."""
    got = np.asarray(got)
    assert got.shape == want.shape, f"{where}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{where}: dtype {got.dtype} != {want.dtype}"
    rtol = 1e-6 if want.dtype == np.float32 else 1e-12
    scale = max(float(np.max(np.abs(want))), 1e-30) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=rtol, atol=rtol * scale, err_msg=where)


def outputs(value: Any) -> list[Any]:
    return list(value) if isinstance(value, tuple) else [value]


@pytest.mark.parametrize("name", CASES)
def test_mindspore_export_imports_and_matches(name: str) -> None:
    inputs, want = fixture(name)
    mod = import_mindir(FIXTURES / f"{name}.mindir")
    got = outputs(anfir.run(mod.entry, *inputs))
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, f"{name} output {k}")


@pytest.mark.parametrize("name", ["dense_relu", "conv_net", "control_flow", "conv_bn"])
def test_weights_as_parameters(name: str) -> None:
    inputs, want = fixture(name)
    mod = anfir.import_mindir(str(FIXTURES / f"{name}.mindir"), params_as_inputs=True)
    assert mod.params, "the cell has weights"
    names = [p.name for p in mod.entry.parameters]
    assert names[:len(mod.params)] == list(mod.params)
    got = outputs(anfir.run(mod.entry, *mod.params.values(), *inputs))
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, f"{name} output {k}")


def test_the_while_header_is_a_tail_recursive_graph() -> None:
    mod = import_mindir(FIXTURES / "while_loss.mindir")
    headers = [g for g in mod.graphs.values() if g.flags["meta"].get("is_while_header")]
    assert len(headers) == 1
    # the header calls itself through its body graph: a loop, run for several trip counts
    x = np.array([0.3, -0.8, 1.1])
    for n in (0, 1, 7):
        z = x.copy()
        for _ in range(n):
            z = np.sin(z) * x + 0.5
        assert_close(anfir.run(mod.entry, x, np.array(n)), np.sum(z * z), f"n={n}")


@pytest.mark.parametrize("loss, grad, wrt", [
    ("mlp_loss", "mlp_grad", (0, 1, 2, 3, 4)),
    ("while_loss", "while_grad", 0),
])
def test_anfir_grad_of_an_imported_cell_matches_mindspores_gradient(loss: str, grad: str, wrt: Any) -> None:
    inputs, _ = fixture(loss)
    _, want = fixture(grad)
    mod = import_mindir(FIXTURES / f"{loss}.mindir")
    got = outputs(anfir.run(anfir.grad(mod.entry, wrt=wrt), *inputs))
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, f"d{loss}/d{k}")


def test_metadata_is_kept() -> None:
    mod = import_mindir(FIXTURES / "dense_relu.mindir")
    assert mod.metadata["producer_name"] == "MindSpore"
    assert mod.metadata["model_version"] == "2.10.0"
    assert mod.metadata["format"] == "mindir"
    ops = {meta["op_type"].split("::")[-1].split(":")[0] for meta in mod.entry.node_meta.values()}
    assert {"MatMul", "BiasAdd", "ReLU"} <= ops
    # the ANF text carries it and parses back to the same computation
    inputs, want = fixture("dense_relu")
    again = anfir.parse(anfir.to_text(mod))
    assert_close(anfir.run(again.entry, *inputs), want[0], "re-parsed")


def test_import_from_bytes_and_the_command_line(tmp_path: Path) -> None:
    from cli_harness import run_in_process

    data = (FIXTURES / "control_flow.mindir").read_bytes()
    inputs, want = fixture("control_flow")
    assert_close(anfir.run(import_mindir(data).entry, *inputs), want[0], "from bytes")
    status, out, err = run_in_process(["import", str(FIXTURES / "control_flow.mindir")], tmp_path)
    assert status == 0, err
    assert "switch(" in out and "partial(" in out


# -- anfir's exports read back ---------------------------------------------------------------
from export_samples import EXAMPLE_EXPORTS  # noqa: E402

from anfir.interop.mindir.exporter import export_mindir  # noqa: E402

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

LOOP_GRADIENTS = [("loop", "dnewton_sqrt", [4.0]), ("power", "dpower", [2.0]), ("loop", "main", []),
                  ("closures", "main", []), ("fibonacci", "fibonacci", [10])]
"""Gradients of loops, closures through loops, and non-tail recursion (which ONNX cannot take)."""


def leaves(value: Any) -> list[Any]:
    """The non-tuple items of a (nested) result, in order (a gradient of nested weights nests)."""
    return flatten_value(value)[0]


def same(want: Any, got: Any, where: str) -> None:
    want_items, got_items = leaves(want), leaves(got)
    assert len(want_items) == len(got_items), where
    for a, b in zip(want_items, got_items):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, where
        rtol = 1e-6 if a.dtype == np.float32 else 1e-12  # f32: a reordered sum rounds differently
        np.testing.assert_allclose(b, a, rtol=rtol, atol=rtol * float(np.max(np.abs(a), initial=1e-30)),
                                   err_msg=where)


@pytest.mark.parametrize("key", list(EXAMPLE_EXPORTS), ids=str)
def test_an_example_exports_and_imports_back_with_equal_results(key: tuple[str, str]) -> None:
    args, runs, _ = EXAMPLE_EXPORTS[key]
    module = anfir.load(str(EXAMPLES / f"{key[0]}.anf"))
    data = export_mindir(module, entry=key[1], args=args if args is not None else list(runs[0]))
    back = import_mindir(data)
    for run in runs:
        same(anfir.run(module[key[1]], *run), anfir.run(back.entry, *run), f"{key} on {run}")


@pytest.mark.parametrize("name, entry, args", LOOP_GRADIENTS)
def test_loop_gradients_and_closures_export_and_import_back(name: str, entry: str, args: list[Any]) -> None:
    module = anfir.load(str(EXAMPLES / f"{name}.anf"))
    back = import_mindir(anfir.export_mindir(module, entry=entry, args=args))
    same(anfir.run(module[entry], *args), anfir.run(back.entry, *args), entry)


LOOP = """
def loss(x, n) =
  let loop = lambda (i, z) if i >= n then z else loop(i + 1, sin(z) * x + 0.5) end in
  let z = loop(0, x) in z * z
"""


def test_the_gradient_of_a_while_loop_round_trips_for_any_trip_count(tmp_path: Path) -> None:
    module = anfir.parse(LOOP)
    for g in (anfir.grad(module["loss"]), anfir.value_and_grad(module["loss"])):
        path = tmp_path / "g.mindir"
        data = anfir.export_mindir(g, args=[0.7, 4], path=str(path))
        assert path.read_bytes() == data
        back = import_mindir(str(path))
        for x, n in [(0.7, 4), (-0.3, 0), (1.2, 9)]:
            same(anfir.run(g, x, n), anfir.run(back.entry, x, n), f"{g.name}({x}, {n})")


def test_exported_graphs_have_no_free_variables_and_typed_constants() -> None:
    from anfir.interop.mindir.schema import classes

    module = anfir.parse("def f(x: f64[3], k: i64) =\n"
                         "  let g = lambda (y) y * x ** 2 end in\n"
                         "  let t = (x, k) in\n"
                         "  if k > 0 then g(t[0]) else x\n")
    data = anfir.export_mindir(module, entry="f")
    model = classes()["ModelProto"].FromString(data)
    graphs = [model.graph, *model.functions]
    constants = {n.name: n for g in graphs for n in g.node if n.op_type == "Constant"}
    for g in graphs:  # every input names this graph's own inputs, nodes, constants or graphs
        own = {i.name for i in g.input} | {n.name for n in g.node} | set(constants) | {h.name for h in graphs}
        for n in g.node:
            assert set(n.input) <= own, (g.name, n.name)
    pows = [n for g in graphs for n in g.node if n.op_type.startswith("REF::Pow")]
    assert len(pows) == 1
    t = constants[pows[0].input[1]].attribute[0].tensors[0]
    assert t.data_type == 11 and not t.dims  # the exponent 2 as a 0-d f64 tensor, the base's dtype
    # a tuple index is a scalar INT64 value node (the gradient of a loop indexes tuples)
    dpower = classes()["ModelProto"].FromString(
        anfir.export_mindir(anfir.load(str(EXAMPLES / "power.anf")), entry="dpower", args=[2.0]))
    dgraphs = [dpower.graph, *dpower.functions]
    dconstants = {n.name: n for g in dgraphs for n in g.node if n.op_type == "Constant"}
    getitems = [n for g in dgraphs for n in g.node if n.op_type.startswith("REF::TupleGetItem")]
    assert getitems
    A = classes()["AttributeProto"]
    assert all(dconstants[n.input[1]].attribute[0].type == A.INT64 for n in getitems)
    x = np.array([0.5, -1.0, 2.0])
    back = import_mindir(data)
    for k in (3, -1):
        same(anfir.run(module["f"], x, k), anfir.run(back.entry, x, k), f"k={k}")


BRANCHES = """
def piecewise(x: f64) -> f64 = if x > 0.0 then x * x else sin(x)
def layer(w: f64[10, 10], v: f64[3], x: f64) =
  if x > 0.0 then sum(w * x) + sum(v) * x else sum(sin(w)) - x
"""


def test_gradient_environments_are_written_as_tuples() -> None:
    # MindSpore's loader cannot type EnvironCreate/Set/Get: a branch's backpropagator's
    # environment is a tuple, one slot per key (a zero tensor where a branch sets none)
    from anfir.interop.mindir.schema import classes

    module = anfir.parse(BRANCHES)
    cases = [(anfir.grad(module["piecewise"]), [(0.7,), (-0.4,)]),
             (anfir.grad(module["layer"], wrt=(0, 1, 2)),
              [(np.full((10, 10), 0.3), np.array([1.0, 2.0, -3.0]), s) for s in (0.5, -2.0)]),
             (anfir.grad(anfir.parse(LOOP)["loss"]), [(0.7, 4), (-0.3, 0)])]
    for g, runs in cases:
        data = anfir.export_mindir(g, args=list(runs[0]))
        model = classes()["ModelProto"].FromString(data)
        ops = {p.op_type for p in model.primitives}
        assert not {"EnvironCreate", "EnvironSet", "EnvironGet"} & ops, (g.name, ops)
        back = import_mindir(data)
        for run in runs:
            same(anfir.run(g, *run), anfir.run(back.entry, *run), f"{g.name}{run}")


def test_imported_weights_export_as_parameters() -> None:
    mod = import_mindir(FIXTURES / "dense_relu.mindir", params_as_inputs=True)
    inputs, want = fixture("dense_relu")
    data = anfir.export_mindir(mod, args=[*mod.params.values(), *inputs])
    back = import_mindir(data, params_as_inputs=True)
    assert list(back.params) == list(mod.params)
    assert_close(anfir.run(back.entry, *back.params.values(), *inputs), want[0], "re-exported")


def test_the_command_line_exports_mindir(tmp_path: Path) -> None:
    from cli_harness import run_in_process

    out = tmp_path / "n.mindir"
    status, stdout, err = run_in_process(["export", str(EXAMPLES / "loop.anf"), "--entry", "newton_sqrt",
                                          "--args", "2.0", "--to", "mindir", "-o", str(out)], tmp_path)
    assert status == 0, err
    assert "MindIR" in stdout
    assert abs(float(anfir.run(import_mindir(str(out)).entry, 2.0)) - 2.0 ** 0.5) < 1e-12


# -- malformed files ----------------------------------------------------------------------------
def _model(name: str = "control_flow") -> Any:
    from anfir.interop.mindir.schema import classes

    return classes()["ModelProto"].FromString((FIXTURES / f"{name}.mindir").read_bytes())


def _refused(data: Any, *needles: str) -> MindirError:
    with pytest.raises(MindirError) as info:
        import_mindir(data)
    error = info.value
    assert error.loc is not None and error.loc.line >= 1, error.render()
    for needle in needles:
        assert needle in str(error), str(error)
    return error


def test_truncated_files_are_refused_or_import_never_crash() -> None:
    data = (FIXTURES / "while_grad.mindir").read_bytes()
    inputs, _ = fixture("while_grad")
    refused = 0
    for cut in range(1, len(data), max(1, len(data) // 60)):
        try:
            mod = import_mindir(data[:cut])
        except MindirError as error:
            assert error.loc is not None
            refused += 1
            continue
        try:  # a cut at a field boundary may still be a model: it runs or fails located
            anfir.run(mod.entry, *inputs)
        except AnfirError as error:
            assert error.loc is not None, error.render()
    assert refused > 30


def test_a_file_that_is_not_a_model() -> None:
    _refused(b"\xff\xfe garbage \x00\x01", "is not a .mindir model")
    _refused(b"", "no graph")


def test_a_cycle_between_nodes_is_refused() -> None:
    model = _model("mlp_loss")
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    nodes[0].input[0] = nodes[2].output[0]  # MatMul reads Tanh, which reads MatMul
    _refused(model.SerializeToString(), "depends on itself (a cycle)")


def test_a_free_variable_is_refused() -> None:
    model = _model("control_flow")
    victim = next(n for n in model.functions[0].node if n.op_type != "Constant")
    victim.input.append(next(n for n in model.graph.node if n.op_type != "Constant").output[0])
    _refused(model.SerializeToString(), "free variable")


def test_huge_dimensions_are_refused_before_allocating() -> None:
    model = _model("dense_relu")
    weight = model.graph.parameter[0]
    del weight.dims[:]
    weight.dims.extend([1 << 40, 1 << 40])
    _refused(model.SerializeToString(), "MAX_CONSTANT_BYTES")
    weight.dims[0] = -3
    _refused(model.SerializeToString(), "negative dimension")


def test_wrong_types_are_refused() -> None:
    model = _model("dense_relu")
    model.graph.parameter[0].data_type = 99
    _refused(model.SerializeToString(), "element type 99")
    model = _model("dense_relu")
    model.graph.parameter[0].raw_data = model.graph.parameter[0].raw_data[:-4]
    _refused(model.SerializeToString(), "bytes of data")
    model = _model("while_loss")  # ScalarToTensor's dtype input becomes a string
    from anfir.interop.mindir.schema import classes

    A = classes()["AttributeProto"]
    for g in [model.graph, *model.functions]:
        for n in g.node:
            if n.op_type == "Constant" and n.attribute[0].type == A.INT64 and n.attribute[0].i == 35:
                n.attribute[0].type, n.attribute[0].s = A.STRING, b"int64"
    _refused(model.SerializeToString(), "is not a MindSpore type id")


def test_unsupported_ops_are_listed_at_once() -> None:
    model = _model("dense_relu")
    for p in model.primitives:
        if p.op_type in ("ReLU", "BiasAdd"):
            p.op_type = "Assign" if p.op_type == "ReLU" else "FancyOp"
    error = _refused(model.SerializeToString(), "2 node(s) do not import", "MindSpore op Assign",
                     "MindSpore op FancyOp")
    assert error.loc is not None and error.loc.file == "<bytes>"


def test_external_data_stays_in_the_model_folder(tmp_path: Path) -> None:
    model = _model("dense_relu")
    weight = model.graph.parameter[0]
    size = len(weight.raw_data)
    (tmp_path / "w.bin").write_bytes(b"\0" * 8 + weight.raw_data)
    weight.ClearField("raw_data")
    weight.external_data.location, weight.external_data.offset = "w.bin", 8
    weight.external_data.length = size
    path = tmp_path / "m.mindir"
    path.write_bytes(model.SerializeToString())
    inputs, want = fixture("dense_relu")
    assert_close(anfir.run(import_mindir(str(path)).entry, *inputs), want[0], "external data")
    _refused(model.SerializeToString(), "read the model from its path")  # bytes: no folder
    for outside in ("../w.bin", "/etc/passwd"):
        weight.external_data.location = outside
        path.write_bytes(model.SerializeToString())
        with pytest.raises(MindirError, match="outside the model's folder|not a relative path"):
            import_mindir(str(path))


def test_devices_and_directories_are_not_read(tmp_path: Path) -> None:
    for path in ("/dev/zero", str(tmp_path)):
        with pytest.raises(MindirError, match="cannot read"):
            import_mindir(path)
    with pytest.raises(MindirError):
        import_mindir(12)  # type: ignore[arg-type]


def test_the_docs_table_names_every_rule() -> None:
    from anfir.interop.mindir.exporter import RULES
    from anfir.interop.mindir.import_ops import OPS

    text = (Path(__file__).resolve().parent.parent / "docs" / "mindir.md").read_text(encoding="utf-8")
    words = set(text.replace("|", " ").replace(",", " ").replace("`", " ").split())
    assert not sorted(set(OPS) - words), "docs/mindir.md lacks MindSpore ops"
    assert not sorted({p.name for p in RULES} - words), "docs/mindir.md lacks exported primitives"


CNN = """
def cnn_loss(w1: f32[4, 1, 3, 3], b1: f32[4], w2: f32[6, 4, 3, 3], w3: f32[6, 3], b3: f32[3],
             x: f32[4, 1, 8, 8], y: f32[4, 3]) -> f32 =
  let h1 = relu(conv(x, w1, b1, padding=1)) in
  let p1 = max_pool(h1, 2) in
  let h2 = relu(conv(p1, w2, padding=(1, 1, 0, 0), stride=(1, 2))) in
  let p2 = avg_pool(h2, 2) in
  let out = reshape(p2, (4, 6)) @ w3 + b3 in
  mean((out - y) ** 2)
def cnn_grad(w1, b1, w2, w3, b3, x, y) = grad(cnn_loss, 0, 1, 2, 3, 4)(w1, b1, w2, w3, b3, x, y)
"""
"""A CNN whose pooling MindSpore has (VALID windows), its loss and gradient (f32)."""


def cnn_args(seed: int = 4) -> list[np.ndarray]:
    """Arguments of :data:`CNN`."""
    r = np.random.default_rng(seed)
    return [(r.standard_normal(s) * k).astype(np.float32) for s, k in
            [((4, 1, 3, 3), .5), ((4,), .1), ((6, 4, 3, 3), .3), ((6, 3), .3), ((3,), .1), ((4, 1, 8, 8), 1),
             ((4, 3), 1)]]


@pytest.mark.parametrize("entry", ["cnn_loss", "cnn_grad"])
def test_the_cnn_and_its_gradient_round_trip(entry: str) -> None:
    from anfir.interop.mindir.schema import classes

    module = anfir.parse(CNN)
    args = cnn_args()
    data = anfir.export_mindir(module, entry=entry, args=args)
    ops = {p.op_type for p in classes()["ModelProto"].FromString(data).primitives}
    assert {"Conv2D", "MaxPool", "AvgPool"} <= ops
    if entry == "cnn_grad":
        assert {"Conv2DBackpropInput", "Conv2DBackpropFilter", "MaxPoolGrad", "AvgPoolGrad"} <= ops
    back = import_mindir(data)
    for seed in (4, 5):
        same(anfir.run(module[entry], *cnn_args(seed)), anfir.run(back.entry, *cnn_args(seed)), entry)


HEAD = """
def head(x: f32[2, 3, 4, 4], w: f32[3, 2]) =
  let h = relu(x * 2.0) in
  let f = flatten(global_avg_pool(h), 1) in
  squeeze(unsqueeze(f, axis=0), axis=0) @ w
"""
"""Global average pooling and the static reshapes (flatten, squeeze, unsqueeze)."""


def head_args(seed: int = 2) -> list[np.ndarray]:
    r = np.random.default_rng(seed)
    return [r.standard_normal((2, 3, 4, 4)).astype(np.float32), r.standard_normal((3, 2)).astype(np.float32)]


def test_pooling_heads_and_static_reshapes_round_trip() -> None:
    module = anfir.parse(HEAD)
    back = import_mindir(anfir.export_mindir(module, entry="head", args=head_args()))
    for seed in (2, 3):
        same(anfir.run(module["head"], *head_args(seed)), anfir.run(back.entry, *head_args(seed)), "head")


@pytest.mark.parametrize("body", ["x", "1.0"])
def test_deeply_nested_tuples_round_trip_without_recursion(body: str) -> None:
    n = 600  # far past protobuf's nesting limit and Python's recursion limit per level
    module = anfir.parse("def main(x) = " + "(" * n + body + ",)" * n)
    back = import_mindir(anfir.export_mindir(module, args=[2.0]))
    got = anfir.run(back.entry, 2.0)
    for _ in range(n):
        assert isinstance(got, tuple) and len(got) == 1
        got = got[0]
    assert float(got) == (2.0 if body == "x" else 1.0)


PROBS = """
def probs(x: f64[3, 4], w: f64[4, 5]) = (softmax(x @ w), log_softmax(x @ w, axis=0))
"""


def test_softmax_and_log_softmax_round_trip() -> None:
    from anfir.interop.mindir.schema import classes

    module = anfir.parse(PROBS)
    r = np.random.default_rng(2)
    args = [r.standard_normal((3, 4)), r.standard_normal((4, 5))]
    data = anfir.export_mindir(module, entry="probs", args=args)
    ops = {p.op_type for p in classes()["ModelProto"].FromString(data).primitives}
    assert {"Softmax", "LogSoftmax"} <= ops
    same(anfir.run(module["probs"], *args), anfir.run(import_mindir(data).entry, *args), "probs")


WINDOWS = """
def pools(x: f32[2, 3, 7, 7]) =
  (max_pool(x, 3, 2, 1), max_pool(x, (2, 3), 2, (0, 1, 1, 0), 1, true), max_pool(x, 2, 2, 0, 1, true))
def pools_grad(x: f32[2, 3, 7, 7]) =
  grad(lambda (y) let t = pools(y) in sum(sin(t[0])) + sum(t[1] * t[1]) + sum(t[2]) end)(x)
def bmm_grad(x: f64[2, 3, 4], w: f64[4, 5], v: f64[1, 5, 2]) =
  grad(lambda (x, w, v) sum(sin((x @ w) @ v)) end, 0, 1, 2)(x, w, v)
def nested_grad(p, x) =
  grad(lambda (p, x) let a = p[0][0] in let b = p[0][1] in let c = p[1] in
                     sum(a * x + b * b * x + c) * sum(a * c) end)(p, x)
"""
"""Max pooling with padding and ceil mode, batched matmul gradients summed back over a
broadcast batch, and the gradient of nested tuples."""


@pytest.mark.parametrize("entry", ["pools", "pools_grad", "bmm_grad", "nested_grad"])
def test_padded_pools_batched_matmul_and_nested_gradients_round_trip(entry: str) -> None:
    r = np.random.default_rng(5)
    module = anfir.parse(WINDOWS)
    args: list[Any]
    if entry.startswith("pools"):
        args = [r.standard_normal((2, 3, 7, 7)).astype(np.float32)]
    elif entry == "bmm_grad":
        args = [r.standard_normal(s) for s in ((2, 3, 4), (4, 5), (1, 5, 2))]
    else:
        args = [((r.standard_normal(3), r.standard_normal(3)), r.standard_normal(3)), r.standard_normal(3)]
    back = import_mindir(anfir.export_mindir(module, entry=entry, args=args))
    want = anfir.run(module[entry], *args)
    same(want, anfir.run(back.entry, *args), entry)
    if entry == "pools":  # against numpy: -inf padding, windows read past the end in ceil mode
        x = args[0]
        padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
        first = np.max(np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))[:, :, ::2, ::2],
                       axis=(4, 5))
        np.testing.assert_array_equal(np.asarray(want[0]), first)


TUPLE_LOOP = """
def tl(p, x, n) =
  let loop = lambda (i, z, q) if i >= n then z else loop(i + 1, sin(z) * q[0] + q[1], q) end in
  sum(loop(0, x, p))
def dtl(p, x, n) = grad(tl)(p, x, n)
"""


def test_tuple_gradients_summed_in_a_loop_round_trip(monkeypatch: pytest.MonkeyPatch) -> None:
    # A loop stays a graph, so its backpropagator sums the tuple argument's gradients
    # (gadd of tuples) in the file: written item by item.
    from anfir.abstract.values import ATuple
    from anfir.interop.mindir import exporter
    from anfir.primitives import gradient

    tuples: list[bool] = []
    rule = exporter.RULES[gradient.gadd]

    def spy(w: Any, node: Any) -> str:
        tuples.append(isinstance(node.abstract, ATuple))
        return rule(w, node)

    monkeypatch.setitem(exporter.RULES, gradient.gadd, spy)
    module = anfir.parse(TUPLE_LOOP)
    p, x = (np.array([0.5, -0.3]), np.array([0.1, 0.2])), np.array([0.3, 0.9])
    back = import_mindir(anfir.export_mindir(module, entry="dtl", args=[p, x, 3]))
    assert any(tuples), "the file sums tuples of gradients"
    for n in (0, 1, 3, 6):
        same(anfir.run(module["dtl"], p, x, n), anfir.run(back.entry, p, x, n), f"n={n}")


def test_a_slice_of_wrong_types_is_a_located_error() -> None:
    from anfir.interop.mindir.schema import classes

    module = anfir.parse("def f(x: f32[2, 3, 4, 4]) = grad(lambda (y) sum(sin(max_pool(y, 3, 2, 1))) end)(x)")
    model = classes()["ModelProto"]()
    model.ParseFromString(anfir.export_mindir(module, entry="f", args=[np.ones((2, 3, 4, 4), np.float32)]))
    [node] = [n for g in [model.graph, *model.functions] for n in g.node if "Slice" in n.op_type]
    [begin] = [n for n in model.graph.node if n.name == node.input[1]]
    value = begin.attribute[0]
    value.ClearField("values")
    value.type, value.i = value.INT64, 3
    with pytest.raises(MindirError, match="Slice's begin must be a tuple of integers") as info:
        import_mindir(model.SerializeToString())
    assert info.value.loc is not None


UNARY_AND_CUSTOM = """
def unary(x: f64[4]) =
  sum(log1p(x) + expm1(x) + atan(x) + sinh(x) + cosh(x) + tan(x) + asin(x) + acos(x))
def g_unary(x: f64[4]) = grad(unary)(x)
def naive_softplus(x) = log(1.0 + exp(x))
def sp_fwd(x) = (log1p(exp(-abs(x))) + maximum(x, 0.0), x)
def sp_bwd(x, dout) = (dout * sigmoid(x),)
def g_softplus(x: f64) = grad(lambda (x) custom_vjp(naive_softplus, sp_fwd, sp_bwd)(x) end)(x)
"""


@pytest.mark.parametrize("entry, args", [("g_unary", [np.array([0.1, -0.3, 0.45, 0.7])]),
                                         ("g_softplus", [800.0]), ("g_softplus", [-1.5])])
def test_unary_functions_and_a_custom_rule_round_trip(entry: str, args: list[Any]) -> None:
    # Log1p ... Acos and the reverse-mode seed (OnesLike) are written; a custom_vjp's rule
    # is what is written (the naive softplus's own gradient overflows at 800).
    module = anfir.parse(UNARY_AND_CUSTOM)
    back = import_mindir(export_mindir(module, entry=entry, args=args))
    same(anfir.run(module[entry], *args), anfir.run(back.entry, *args), entry)

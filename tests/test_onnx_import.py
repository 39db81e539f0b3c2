"""ONNX import: ONNX's own backend node cases, an MLP's gradient against PyTorch,
round trips through export, metadata, dimension variables, and located errors."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="ONNX import needs the onnx package (anfir[onnx])")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import anfir  # noqa: E402
from anfir.errors import AnfirError  # noqa: E402
from anfir.interop.onnx.importer import OnnxImportError, import_onnx  # noqa: E402

from tests import onnx_node_runner as runner  # noqa: E402


# -- ONNX's backend node cases ----------------------------------------------------------------
@pytest.fixture(scope="module")
def node_results() -> dict[str, object]:
    cases = runner.load_cases()
    return {case.name: runner.run_case(case) for case in cases}


def test_node_cases_match_the_manifest(node_results: dict[str, object]) -> None:
    # Every case passes unless the manifest lists it with its reason; a listed
    # case that passes now must leave the manifest (regenerate it).
    expected = runner.read_manifest()
    unexpected = {n: r for n, r in node_results.items() if r is not None and n not in expected}
    fixed = sorted(n for n in expected if n in node_results and node_results[n] is None)
    assert not unexpected, f"cases that fail but are not in the manifest: {unexpected}"
    assert not fixed, f"cases that pass now; remove them from the manifest: {fixed}"
    assert all(reason for reason in expected.values()), "every expected failure has a reason"


def test_node_case_pass_rates(node_results: dict[str, object]) -> None:
    # The floors of what passes today: they only go up as the operator library grows.
    rates = runner.rates(node_results)  # type: ignore[arg-type]
    passed, total = rates["all"]
    assert total > 1500 and passed / total >= 0.92
    passed, total = rates["common"]
    assert passed / total >= 0.99


def test_control_flow_cases_pass(node_results: dict[str, object]) -> None:
    # Every If, Loop and Scan case: a slice by the loop counter (test_loop11), a
    # sequence grown by a loop (unrolled for its trip count: test_loop13_seq), Scan
    # of opsets 8 and 9.
    names = [n for n in node_results if runner.is_control_flow(n)]
    assert len(names) >= 10
    for name in names:
        assert node_results[name] is None, (name, node_results[name])


DYNAMIC_GAPS = {
    "test_scan_sum": "Scan of opset 8 is unrolled per element of its batch axis, which must be static",
}
"""The common and control-flow cases that pass but not with a symbolic first dimension."""


def test_common_and_control_cases_pass_with_a_symbolic_first_dimension(
        node_results: dict[str, object]) -> None:
    # onnx-mlir's dynamic mode: every input's first dimension a dimension variable, so
    # nothing about it is known when importing (an empty reduction, a length...).
    names = [n for n, r in node_results.items()
             if r is None and (runner.is_common(n) or runner.is_control_flow(n))]
    assert len(names) > 500
    cases = {case.name: case for case in runner.load_cases() if case.name in set(names)}
    failed = {n: runner.run_case(cases[n], runner.symbolic_first_dim) for n in names}
    failed = {n: r for n, r in failed.items() if r is not None}
    assert set(failed) == set(DYNAMIC_GAPS), failed


LIGHT_MODELS = ("squeezenet", "shufflenet")
"""The model-zoo graphs of the onnx wheel the suite runs (about 1 s each); all nine
(resnet50, densenet121, inception_v1/v2, vgg19, alexnet, zfnet512 too) run in
``benchmarks/onnx_light_models.py``."""


def light_model_case(name: str) -> tuple[onnx.ModelProto, np.ndarray, np.ndarray]:
    """A "light" model-zoo graph shipped in the onnx wheel, its input as ONNX's runner
    makes it (``arange(n) / n`` in the input's shape) and its shipped output."""
    import os

    folder = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
    model = onnx.load(os.path.join(folder, f"light_{name}.onnx"))
    inits = {i.name for i in model.graph.initializer}
    inp = next(i for i in model.graph.input if i.name not in inits)
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1 for d in inp.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    x = (np.arange(n).reshape(shape) / n).astype(np.float32)
    want = numpy_helper.to_array(onnx.load_tensor(os.path.join(folder, f"light_{name}_output_0.pb")))
    return model, x, want


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_light_model_zoo_graphs_match_their_outputs(name: str) -> None:
    from anfir.interop.onnx import Backend

    model, x, want = light_model_case(name)
    got = Backend.prepare(model).run([x])[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-7)  # ONNX's tolerances for them


def test_silero_vad_matches_the_reference_evaluator() -> None:
    # A real control-flow model: Silero VAD (25 If nodes, nested four deep, two LSTMs,
    # an STFT as a convolution), run on three chunks of audio with its state carried
    # from one to the next, against onnx.reference.  Its branches are chosen by the
    # sample rate (an input: bound to 16 kHz) and by shapes (the chunk's, made static).
    silero_vad = pytest.importorskip("silero_vad", reason="the model ships in the silero-vad wheel")
    import os

    from onnx.reference import ReferenceEvaluator

    from anfir.interop.onnx.importer import with_input_shapes

    path = os.path.join(os.path.dirname(silero_vad.__file__), "data", "silero_vad.onnx")
    model = onnx.load(path)
    assert sum(n.op_type == "If" for n in _all_nodes(model.graph)) >= 20
    rate = np.array(16000)
    mod = import_onnx(with_input_shapes(model, {"input": (1, 512), "state": (2, 1, 128)}), bind={"sr": rate})
    reference = ReferenceEvaluator(model)
    rng = np.random.default_rng(7)
    state = want_state = np.zeros((2, 1, 128), np.float32)
    for _ in range(3):
        chunk = (rng.standard_normal((1, 512)) * 0.3).astype(np.float32)
        prob, state = anfir.run(mod.entry, chunk, state)
        with np.errstate(over="ignore"):  # the reference LSTM's sigmoid overflows exp
            want_prob, want_state = reference.run(None, {"input": chunk, "state": want_state, "sr": rate})
        np.testing.assert_allclose(prob, want_prob, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(state, want_state, rtol=1e-4, atol=1e-5)


def _all_nodes(graph: onnx.GraphProto) -> list:
    """Every node of a graph and of its subgraphs."""
    found, stack = [], [graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            found.append(node)
            stack.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
    return found


def test_resize_matches_the_reference_on_odd_sizes() -> None:
    # Every interpolation mode and coordinate mapping at once, against onnx.reference,
    # on sizes the node cases do not use (7x5 to 4x9: shrinking one axis, growing the other).
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2, 7, 5)).astype(np.float32)
    for mode, coords, antialias in (("linear", "half_pixel", 0), ("cubic", "align_corners", 0),
                                    ("nearest", "asymmetric", 0), ("linear", "pytorch_half_pixel", 1),
                                    ("cubic", "half_pixel_symmetric", 1)):
        node = helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode=mode, antialias=antialias,
                                coordinate_transformation_mode=coords)
        model = _model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                       [numpy_helper.from_array(np.array([1, 2, 4, 9], np.int64), "sizes")])
        want = ReferenceEvaluator(model).run(None, {"x": x})[0]
        got = anfir.run(import_onnx(model).entry, x)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=f"{mode} {coords}")


def test_loop_carries_its_state() -> None:
    # y = x; for i in range(n) while y < 100: y = y * 2 + i  — against onnxruntime
    # (ONNX's reference evaluator runs no iteration when the condition input is absent).
    ort = pytest.importorskip("onnxruntime", reason="the reference is onnxruntime")

    f, b, i64 = TensorProto.FLOAT, TensorProto.BOOL, TensorProto.INT64
    body = helper.make_graph(
        [helper.make_node("Cast", ["i"], ["fi"], to=f),
         helper.make_node("Add", ["y_in", "y_in"], ["twice"]),
         helper.make_node("Add", ["twice", "fi"], ["y_out"]),
         helper.make_node("ReduceMax", ["y_out"], ["top"], keepdims=0),
         helper.make_node("Less", ["top", "limit"], ["c_out"])],
        "body",
        [helper.make_tensor_value_info("i", i64, []), helper.make_tensor_value_info("c_in", b, []),
         helper.make_tensor_value_info("y_in", f, [2])],
        [helper.make_tensor_value_info("c_out", b, []), helper.make_tensor_value_info("y_out", f, [2])])
    model = _model([helper.make_node("Loop", ["n", "", "x"], ["y"], body=body)],
                   [helper.make_tensor_value_info("n", i64, []),
                    helper.make_tensor_value_info("x", f, [2])],
                   [helper.make_tensor_value_info("y", f, [2])],
                   [numpy_helper.from_array(np.array(100.0, np.float32), "limit")])
    mod = import_onnx(model)
    session = ort.InferenceSession(model.SerializeToString())
    for n in (0, 3, 50):
        x = np.array([1.0, 0.5], np.float32)
        want = session.run(None, {"n": np.array(n), "x": x})[0]
        got = anfir.run(mod.entry, np.array(n), x)
        np.testing.assert_array_equal(got, want)


# -- building small models ---------------------------------------------------------------------
def _model(nodes: list, inputs: list, outputs: list, initializers: list = (), opset: int = 21,
           **kwargs: object) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], **kwargs)


def _mlp(rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    weights = {"W1": rng.normal(size=(4, 8)).astype(np.float32),
               "b1": rng.normal(size=(8,)).astype(np.float32),
               "W2": rng.normal(size=(8, 3)).astype(np.float32),
               "b2": rng.normal(size=(3,)).astype(np.float32)}
    nodes = [
        helper.make_node("Gemm", ["x", "W1", "b1"], ["h"], name="fc1"),
        helper.make_node("Tanh", ["h"], ["a"], name="act"),
        helper.make_node("Gemm", ["a", "W2", "b2"], ["y"], name="fc2"),
        helper.make_node("Sub", ["y", "target"], ["d"], name="diff"),
        helper.make_node("Mul", ["d", "d"], ["sq"], name="square"),
        helper.make_node("ReduceMean", ["sq"], ["loss"], name="mse", keepdims=0),
    ]
    model = _model(nodes,
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4]),
                    helper.make_tensor_value_info("target", TensorProto.FLOAT, ["N", 3])],
                   [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
                   [numpy_helper.from_array(v, k) for k, v in weights.items()],
                   producer_name="anfir-tests", doc_string="a two-layer MLP and its loss")
    return model, weights


def test_mlp_gradient_matches_torch() -> None:
    torch = pytest.importorskip("torch", reason="the reference gradient is PyTorch's autograd")
    rng = np.random.default_rng(0)
    model, weights = _mlp(rng)
    mod = import_onnx(model, params_as_inputs=True)
    assert list(mod.params) == ["W1", "b1", "W2", "b2"]
    x = rng.normal(size=(5, 4)).astype(np.float32)
    t = rng.normal(size=(5, 3)).astype(np.float32)
    args = [*mod.params.values(), x, t]
    grads = anfir.run(anfir.grad(mod.entry, wrt=(0, 1, 2, 3)), *args)

    tw = {k: torch.tensor(v, requires_grad=True) for k, v in weights.items()}
    y = torch.tanh(torch.tensor(x) @ tw["W1"] + tw["b1"]) @ tw["W2"] + tw["b2"]
    loss = ((y - torch.tensor(t)) ** 2).mean()
    loss.backward()
    for got, name in zip(grads, ["W1", "b1", "W2", "b2"]):
        np.testing.assert_allclose(got, tw[name].grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(anfir.run(mod.entry, *args), loss.item(), rtol=1e-5)


def test_imported_text_reparses_and_runs_the_same() -> None:
    rng = np.random.default_rng(1)
    model, _ = _mlp(rng)
    mod = import_onnx(model)
    text = anfir.to_text(mod)
    assert "def g(x: f32[N, 4], target: f32[N, 3])" in text
    again = anfir.parse(text)
    x = rng.normal(size=(2, 4)).astype(np.float32)
    t = rng.normal(size=(2, 3)).astype(np.float32)
    np.testing.assert_allclose(anfir.run(again["g"], x, t), anfir.run(mod.entry, x, t), rtol=1e-6)


def test_export_then_import_gives_the_same_values() -> None:
    mlp = anfir.load("examples/mlp.anf")
    exported = anfir.export_onnx(mlp["mlp_loss"])
    mod = import_onnx(exported)
    rng = np.random.default_rng(2)
    args = (rng.normal(size=(3, 8)), rng.normal(size=(8, 2)), rng.normal(size=(5, 3)),
            rng.normal(size=(5, 2)))
    np.testing.assert_allclose(anfir.run(mod.entry, *args), anfir.run(mlp["mlp_loss"], *args),
                               rtol=1e-12)
    assert anfir.parse(anfir.to_text(mod))


def test_metadata_is_kept() -> None:
    model, _ = _mlp(np.random.default_rng(3))
    model.model_version = 7
    model.domain = "org.example"
    helper.set_model_props(model, {"author": "someone"})
    mod = import_onnx(model)
    meta = mod.metadata
    assert meta["producer_name"] == "anfir-tests"
    assert meta["doc_string"] == "a two-layer MLP and its loss"
    assert meta["model_version"] == 7 and meta["domain"] == "org.example"
    assert meta["metadata_props"] == {"author": "someone"}
    assert meta["opset_import"] == {"ai.onnx": 21}


def test_dim_params_are_shared_and_unknown_dims_fresh() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", None, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", None, 3])
    out = helper.make_tensor_value_info("z", TensorProto.FLOAT, None)
    mod = import_onnx(_model([helper.make_node("Add", ["x", "y"], ["z"])], [x, y], [out]))
    anns = [str(p.annotation) for p in mod.entry.parameters]
    assert anns[0].startswith("f32[B, _d") and anns[1].startswith("f32[B, _d")
    assert anns[0] != anns[1]  # two unknown dims are two different symbols


def test_if_captures_outer_values() -> None:
    then = helper.make_graph([helper.make_node("Add", ["x", "x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2])])
    model = _model([helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                   [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                    helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    mod = import_onnx(model)
    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(anfir.run(mod.entry, np.array(True), x), x + x)
    np.testing.assert_array_equal(anfir.run(mod.entry, np.array(False), x), -x)
    assert "if " in anfir.to_text(mod)


def test_every_unsupported_node_is_listed_at_once() -> None:
    nodes = [helper.make_node("Frobnicate", ["x"], ["a"], name="first", domain="com.example"),
             helper.make_node("Relu", ["x"], ["b"], name="fine"),
             helper.make_node("Unique", ["b"], ["c"], name="second")]
    model = helper.make_model(
        helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                          [helper.make_tensor_value_info("a", TensorProto.FLOAT, [3]),
                           helper.make_tensor_value_info("c", TensorProto.FLOAT, None)]),
        opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.example", 1)])
    with pytest.raises(OnnxImportError) as info:
        import_onnx(model)
    text = str(info.value)
    assert "node 'first' (Frobnicate) of domain 'com.example'" in text
    assert "node 'second' (Unique)" in text
    assert "'fine'" not in text
    assert isinstance(info.value, AnfirError)


def test_old_opsets_and_bad_files_are_errors(tmp_path: object) -> None:
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], opset=6)
    with pytest.raises(OnnxImportError, match="opset 6"):
        import_onnx(model)
    path = f"{tmp_path}/junk.onnx"
    with open(path, "wb") as f:
        f.write(b"\xff\xff\xff not a model")
    with pytest.raises(AnfirError):
        import_onnx(path)


def test_schema_functions_expand_through_their_body() -> None:
    # Celu has no rule of its own: it is expanded through its ONNX function body.
    x = np.array([-2.0, -0.5, 0.0, 1.5], np.float32)
    model = _model([helper.make_node("Celu", ["x"], ["y"], alpha=2.0)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])])
    from onnx.reference import ReferenceEvaluator

    want = ReferenceEvaluator(model).run(None, {"x": x})[0]
    np.testing.assert_allclose(anfir.run(import_onnx(model).entry, x), want, rtol=1e-6)


def test_local_functions_become_graphs() -> None:
    fn = helper.make_function("local", "Twice", ["a"], ["b"],
                              [helper.make_node("Add", ["a", "a"], ["b"])],
                              [helper.make_opsetid("", 21)])
    graph = helper.make_graph([helper.make_node("Twice", ["x"], ["y"], domain="local")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, functions=[fn], opset_imports=[
        helper.make_opsetid("", 21), helper.make_opsetid("local", 1)])
    mod = import_onnx(model)
    assert "Twice" in mod.graphs
    np.testing.assert_array_equal(anfir.run(mod.entry, np.array([1.0, 2.0], np.float32)), [2.0, 4.0])


def test_without_onnx_the_error_names_the_extra() -> None:
    # A fresh interpreter where `import onnx` fails: anfir imports, and importing
    # a model is a MissingDependencyError that says which extra to install.
    import subprocess
    import sys

    code = ("import sys; sys.modules['onnx'] = None\n"
            "import anfir\n"
            "from anfir.errors import MissingDependencyError\n"
            "try:\n    anfir.import_onnx('model.onnx')\n"
            "except MissingDependencyError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=str(__import__("pathlib").Path(__file__).resolve().parent.parent))
    assert 'pip install "anfir[onnx]"' in out.stdout, out.stderr


DRAWN_WEIGHT_MODELS = ("densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
                       "squeezenet")
"""The light graphs the suite runs with drawn weights (about 5 s together); vgg19, alexnet
and zfnet512, whose fully connected layers hold 60-140 M weights to draw (25 s more),
run so in ``benchmarks/onnx_light_models.py``."""


def _with_random_weights(model: onnx.ModelProto, seed: int) -> onnx.ModelProto:
    # The light graphs make every weight of rank >= 2 with a ConstantOfShape of its
    # shape, so each of them outputs a uniform softmax (0.001 everywhere) and matching
    # the shipped output shows little.  Here those weights are drawn instead, scaled
    # by their fan-in (He's way, so that 20 layers neither explode nor vanish), and
    # become initializers; biases and batch-norm statistics stay as shipped.
    data = np.random.default_rng(seed)
    shapes = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer
              if i.data_type == TensorProto.INT64}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    kept = []
    for node in out.graph.node:
        shape = shapes.get(node.input[0]) if node.op_type == "ConstantOfShape" else None
        if shape is None or len(shape) < 2:
            kept.append(node)
            continue
        fan_in = int(np.prod(shape[1:]))
        drawn = data.standard_normal(tuple(shape), dtype=np.float32) * np.float32(np.sqrt(2.0 / fan_in))
        out.graph.initializer.append(numpy_helper.from_array(drawn, node.output[0]))
    assert len(kept) < len(out.graph.node), "the graph makes no weight with ConstantOfShape"
    del out.graph.node[:]
    out.graph.node.extend(kept)
    return out


@pytest.mark.parametrize("name", DRAWN_WEIGHT_MODELS)
def test_light_model_zoo_architectures_with_drawn_weights_match_onnxruntime(name: str) -> None:
    pytest.importorskip("onnxruntime", reason="the second reference for the model zoo")
    got, want = drawn_weight_outputs(name)
    assert got.shape == want.shape and float(np.std(want)) > 1e-5  # not a uniform answer
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6)


def drawn_weight_outputs(name: str) -> tuple[np.ndarray, np.ndarray]:
    """anfir's and onnxruntime's outputs of light graph ``name`` with drawn weights, on a
    drawn input."""
    import onnxruntime as ort

    from anfir.interop.onnx import Backend

    model, x, _ = light_model_case(name)
    model = _with_random_weights(model, seed=len(name))
    x = np.random.default_rng(1).normal(size=x.shape).astype(np.float32)
    options = ort.SessionOptions()
    options.log_severity_level = 3  # (not the notice of each weight's now unused shape)
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    want = session.run(None, {session.get_inputs()[0].name: x})[0]
    return Backend.prepare(model).run([x])[0], want

"""One way to run an exported ONNX model for the export tests: by onnxruntime and by
``onnx.reference``, both compared with what anfir computed."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def onnx_runs(model: Any, args: Sequence[Any]) -> list[tuple[str, list[np.ndarray]]]:
    """``[(runner, outputs)]`` of ``model`` on ``args`` (its inputs in order), run by
    onnxruntime and by onnx's reference evaluator."""
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    feed = {i.name: np.asarray(a) for i, a in zip(model.graph.input, args)}
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return [("onnxruntime", [np.asarray(o) for o in session.run(None, feed)]),
            ("reference", [np.asarray(o) for o in ReferenceEvaluator(model).run(None, feed)])]


def assert_onnx_equal(model: Any, args: Sequence[Any], want: Sequence[np.ndarray], where: str,
                      rtol: float = 1e-10, atol: float = 1e-12) -> None:
    """Both runners give ``want`` (one array per output, float64 compared)."""
    for name, got in onnx_runs(model, args):
        assert len(got) == len(want), f"{where} {name}: {len(got)} outputs, want {len(want)}"
        for g, w in zip(got, want):
            w = np.asarray(w, dtype=np.float64)
            np.testing.assert_allclose(np.asarray(g, dtype=np.float64).reshape(w.shape), w,
                                       rtol=rtol, atol=atol, err_msg=f"{where} {name}")

"""The "light" model-zoo graphs shipped in the onnx wheel, through anfir's ONNX backend.

::

    PYTHONPATH=. python benchmarks/onnx_light_models.py

imports and runs each of the nine graphs in ``onnx/backend/test/data/light``
(resnet50, densenet121, inception_v1/v2, squeezenet, shufflenet, vgg19, alexnet,
zfnet512) on the input ONNX's backend runner makes for them, compares the result
with the output shipped beside the model (ONNX's tolerances, rtol 1e-3, atol 1e-7)
and prints import and run times.  The light graphs make their weights with
``ConstantOfShape`` (every one answers a uniform softmax), so each is also run
with drawn weights on a drawn input against onnxruntime.  The test suite runs
two with their shipped outputs and six with drawn weights
(``tests/test_onnx_import.py``); this script is the whole set (about 35 s on
two cores), for CI or by hand.  Exits 1 when a graph does not match.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

NAMES = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50", "shufflenet",
         "squeezenet", "vgg19", "zfnet512")


def main() -> int:
    """Run every graph; print one line each; 1 when any output differs."""
    import numpy as np

    from anfir.interop.onnx import Backend
    from tests.test_onnx_import import drawn_weight_outputs, light_model_case

    failed = 0
    print(f"{'model':<14} {'import':>8} {'run':>8}  max |error| / max |output|")
    for name in NAMES:
        model, x, want = light_model_case(name)
        start = time.perf_counter()
        rep = Backend.prepare(model)
        imported = time.perf_counter()
        got = rep.run([x])[0]
        ran = time.perf_counter()
        ok = got.shape == want.shape and np.allclose(got, want, rtol=1e-3, atol=1e-7)
        failed += not ok
        error = float(np.max(np.abs(got - want)) / max(float(np.max(np.abs(want))), 1e-30)) \
            if got.shape == want.shape else float("nan")
        # The shipped weights are constants (every graph answers a uniform softmax):
        # the same graph with drawn weights against onnxruntime says more.
        drawn, reference = drawn_weight_outputs(name)
        drawn_ok = drawn.shape == reference.shape and np.allclose(drawn, reference, rtol=1e-3, atol=1e-6)
        failed += not drawn_ok
        drawn_error = float(np.max(np.abs(drawn - reference)) / float(np.max(np.abs(reference))))
        print(f"{name:<14} {imported - start:7.2f}s {ran - imported:7.2f}s  {error:.1e}"
              f"{'' if ok else '  MISMATCH'}   drawn weights vs onnxruntime: {drawn_error:.1e}"
              f"{'' if drawn_ok else '  MISMATCH'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

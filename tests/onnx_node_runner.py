"""Run ONNX's backend node test cases through ``anfir.interop.onnx.Backend``.

The cases are generated in memory by ``onnx.backend.test.loader`` (they ship in
the onnx wheel: a model and its inputs and expected outputs per case, made by
ONNX's reference implementations).  A case passes when every output has the
expected dtype, shape and values (within the case's rtol/atol).

``tests/onnx_node_expected_failures.txt`` lists the cases expected to fail,
one per line: ``name<TAB>reason``.  Regenerate it after adding rules or
operators with::

    PYTHONPATH=. python tests/onnx_node_runner.py --write

which also prints the pass rates (all cases, the common ops, control flow).
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from typing import Any, Callable, Optional

import numpy as np

MANIFEST = os.path.join(os.path.dirname(__file__), "onnx_node_expected_failures.txt")

COMMON_OPS = (
    "add", "sub", "mul", "div", "pow", "neg", "abs", "exp", "log", "sqrt", "relu", "sigmoid",
    "tanh", "erf", "conv", "batchnorm", "layer_normalization", "gelu", "softmax", "gather",
    "slice", "concat", "reshape", "transpose", "reduce", "matmul", "gemm", "where", "cast",
    "pad", "einsum", "top_k", "max", "min", "clip", "equal", "less", "greater",
)
"""The ops real models use most, as the prefixes of their test case names."""

CONTROL_FLOW = ("if", "loop", "scan", "range")
"""Control-flow cases (``test_if...``, ``test_loop...``, ``test_scan...``)."""


def _base(name: str) -> str:
    return name[len("test_"):] if name.startswith("test_") else name


def is_common(name: str) -> bool:
    """Whether a case tests one of :data:`COMMON_OPS` (its name starts with it)."""
    base = _base(name)
    if base.startswith(("castlike", "concat_from_sequence", "gather_elements", "gathernd",
                        "convinteger", "convtranspose", "matmulinteger", "maxpool", "maxunpool",
                        "min_max", "mean", "reduce_log_sum_exp")):
        return base.startswith("reduce_log_sum_exp")
    return any(base == op or base.startswith(op + "_") or base.startswith(op) and op == "reduce"
               for op in COMMON_OPS)


def is_control_flow(name: str) -> bool:
    """Whether a case tests If, Loop or Scan."""
    base = _base(name)
    return any(base == op or base.startswith(op + "_") or base.startswith(op + "1")
               or base.startswith(op + "9") for op in CONTROL_FLOW[:3])


def load_cases() -> list[Any]:
    """Every node case of the installed onnx, generated in memory."""
    import onnx.backend.test.loader as loader

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with np.errstate(all="ignore"):
            return list(loader.load_model_tests(kind="node"))


def _array(value: Any) -> Any:
    import onnx.numpy_helper

    if isinstance(value, list):
        return [_array(v) for v in value]
    if hasattr(value, "SerializeToString") and hasattr(value, "data_type"):
        return onnx.numpy_helper.to_array(value)
    return value


def _compare(got: Any, want: Any, rtol: float, atol: float) -> None:
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            raise AssertionError(f"a sequence of {len(want)} expected, got {type(got).__name__}")
        for g, w in zip(got, want):
            _compare(g, w, rtol, atol)
        return
    if want is None:
        if got is not None:
            raise AssertionError("None expected")
        return
    want = np.asarray(want)
    got = np.asarray(got)
    if got.dtype != want.dtype:
        raise AssertionError(f"dtype {got.dtype}, expected {want.dtype}")
    if got.shape != want.shape:
        raise AssertionError(f"shape {got.shape}, expected {want.shape}")
    if want.dtype == object or want.dtype.kind in "USb":
        if not np.array_equal(got, want):
            raise AssertionError("values differ")
        return
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


def symbolic_first_dim(model: Any) -> Any:
    """A copy of ``model`` whose inputs' first dimensions are the symbol ``N0``,
    ``N1``... (onnx-mlir's dynamic mode: the shapes are not known when importing)."""
    import onnx

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    initializers = {t.name for t in copy.graph.initializer}
    for k, inp in enumerate(copy.graph.input):
        if inp.name in initializers or not inp.type.HasField("tensor_type"):
            continue
        shape = inp.type.tensor_type.shape
        if inp.type.tensor_type.HasField("shape") and len(shape.dim) > 0:
            shape.dim[0].Clear()
            shape.dim[0].dim_param = f"N{k}"
    return copy


def run_case(case: Any, transform: Optional[Callable[[Any], Any]] = None) -> Optional[str]:
    """None when the case passes through the Backend, else why it fails (one line)."""
    from anfir.errors import AnfirError
    from anfir.interop.onnx import Backend

    model = case.model if transform is None else transform(case.model)
    try:
        with np.errstate(all="ignore"):
            rep = Backend.prepare(model)
            for inputs, outputs in case.data_sets:
                got = rep.run([_array(i) for i in inputs])
                if len(got) != len(outputs):
                    raise AssertionError(f"{len(got)} outputs, expected {len(outputs)}")
                for g, w in zip(got, outputs):
                    _compare(g, _array(w), case.rtol, case.atol)
    except AnfirError as e:
        lines = [line.strip() for line in e.message.splitlines() if line.strip()]
        return "error: " + (lines[-1] if lines else e.kind)
    except AssertionError as e:
        text = str(e).strip().splitlines()
        return "wrong result: " + next((t.strip() for t in text if t.strip()), "mismatch")
    except Exception as e:  # a crash is a failure to report, not to hide
        return f"crash: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def reason_text(failure: str) -> str:
    """A manifest reason: one line, no tabs, bounded."""
    text = re.sub(r"\s+", " ", failure).strip()
    return text[:300]


def read_manifest(path: str = MANIFEST) -> dict[str, str]:
    """The expected failures: case name → reason."""
    found: dict[str, str] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip() or line.startswith("#"):
                continue
            name, _, reason = line.rstrip("\n").partition("\t")
            found[name] = reason
    return found


def rates(results: dict[str, Optional[str]]) -> dict[str, tuple[int, int]]:
    """(passed, total) for all cases, the common ops, control flow."""
    groups: dict[str, tuple[int, int]] = {}
    for label, keep in (("all", lambda n: True), ("common", is_common), ("control", is_control_flow)):
        names = [n for n in results if keep(n)]
        groups[label] = (sum(results[n] is None for n in names), len(names))
    return groups


def main(argv: list[str]) -> int:
    """Run every case; print the rates; with ``--write``, rewrite the manifest."""
    cases = load_cases()
    results = {case.name: run_case(case) for case in cases}
    for label, (passed, total) in rates(results).items():
        print(f"{label}: {passed}/{total} = {passed / max(total, 1):.1%}")
    if "--dynamic" in argv:
        # The cases that pass, again with every input's first dimension symbolic.
        passing = [c for c in cases if results[c.name] is None]
        dynamic = {c.name: run_case(c, symbolic_first_dim) for c in passing}
        for label, (passed, total) in rates(dynamic).items():
            print(f"dynamic first dim, of those passing, {label}: {passed}/{total} = "
                  f"{passed / max(total, 1):.1%}")
    if "--write" in argv:
        with open(MANIFEST, "w", encoding="utf-8") as f:
            f.write("# ONNX backend node cases expected to fail through anfir.interop.onnx.Backend,\n"
                    "# one per line: name<TAB>reason.  Regenerate: PYTHONPATH=. python tests/onnx_node_runner.py --write\n")
            for name in sorted(results):
                if results[name] is not None:
                    f.write(f"{name}\t{reason_text(results[name] or '')}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The MLP training step exported to ``.mindir`` and run in MindSpore's graph mode,
against anfir's own evaluator on the same compiled program (issue 29).

    MINDSPORE_PYTHON=/work/msvenv/bin/python python benchmarks/bench_mindir.py

MindSpore needs numpy<2 and has a venv of its own, so its side runs in one
subprocess of that venv's Python, timed there (warm-up calls, then the median
of many calls of ``nn.GraphCell`` on the file anfir wrote); anfir's side is
timed here the same way (median of ``anfir.run`` of the compiled step).  Both
results are checked against each other before anything is reported.
Batch 64, D = H = 256, K = 10, float32 — the step returns the loss and the
updated weights.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# One thread on both sides (numpy's BLAS, MindSpore's kernels), as the other benchmarks
# run torch: on a shared 2-core machine, spinning BLAS threads swamp a 1 ms step.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import anfir  # noqa: E402

STEP = """
def mlp_loss(w1, w2, x, y) =
  let h = tanh(x @ w1) in
  let d = h @ w2 - y in
  sum(d * d) / 2.0
def mlp_step(w1, w2, x, y) =
  let vg = value_and_grad(mlp_loss, 0, 1)(w1, w2, x, y) in
  (vg[0], w1 - 0.01 * vg[1][0], w2 - 0.01 * vg[1][1])
"""

MS_TIMER = r"""
import json, sys, time, statistics
import numpy as np, mindspore as ms
from mindspore import Tensor, nn
ms.set_context(mode=ms.GRAPH_MODE)
cell = nn.GraphCell(ms.load(sys.argv[1]))
data = np.load(sys.argv[2])
args = [Tensor(data[f"in{k}"]) for k in range(len(data.files))]
for _ in range(5):
    out = cell(*args)
samples = []
for _ in range(int(sys.argv[4])):
    start = time.perf_counter()
    out = cell(*args)
    [o.asnumpy() for o in out]
    samples.append(time.perf_counter() - start)
np.savez(sys.argv[3], **{f"out{k}": o.asnumpy() for k, o in enumerate(out)})
print(json.dumps({"median_s": statistics.median(samples)}))
"""


def main() -> int:
    python = os.environ.get("MINDSPORE_PYTHON", "/work/msvenv/bin/python")
    rng = np.random.default_rng(0)
    args = [(rng.standard_normal(s) * 0.1).astype(np.float32) for s in [(256, 256), (256, 10), (64, 256), (64, 10)]]
    module = anfir.parse(STEP)
    compiled = anfir.compile(module, entry="mlp_step", args=args)
    repeats = 200
    for _ in range(5):
        want = anfir.run(compiled, *args)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        anfir.run(compiled, *args)
        samples.append(time.perf_counter() - start)
    anfir_s = statistics.median(samples)
    with tempfile.TemporaryDirectory() as tmp:
        model, inputs, outputs = (os.path.join(tmp, n) for n in ("step.mindir", "in.npz", "out.npz"))
        anfir.export_mindir(module, entry="mlp_step", args=args, path=model)
        np.savez(inputs, **{f"in{k}": a for k, a in enumerate(args)})
        done = subprocess.run([python, "-c", MS_TIMER, model, inputs, outputs, str(repeats)],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
        ms_s = json.loads(done.stdout.strip().splitlines()[-1])["median_s"]
        got = np.load(outputs)
        for k, w in enumerate(want):
            np.testing.assert_allclose(got[f"out{k}"], w, rtol=2e-4, atol=1e-5)
    print("| figure | anfir evaluator | MindSpore graph mode (GraphCell) | anfir / MindSpore |")
    print("|---|---|---|---|")
    print(f"| MLP training step, B=64, D=H=256, K=10, f32 (median) | {anfir_s * 1e3:.2f} ms | "
          f"{ms_s * 1e3:.2f} ms | {anfir_s / ms_s:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

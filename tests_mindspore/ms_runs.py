"""Run several ``.mindir`` files, each on several input sets, in one MindSpore process.

Runs in MindSpore's own venv (not anfir's)::

    python ms_runs.py INPUTS.npz OUTPUTS.npz MODEL0.mindir MODEL1.mindir ...

``INPUTS.npz`` holds ``m{i}_r{r}_in{k}`` (model i, run r, input k); the results, a tuple
flattened in order, go to ``OUTPUTS.npz`` as ``m{i}_r{r}_out{k}``.  A model that fails
to load or run writes ``m{i}_error`` (its message) and the others still run, so one
process checks many programs (a MindSpore process costs seconds to start).  ``m{i}_fresh``
in the inputs runs each of model i's input sets in a new GraphCell: MindSpore 2.10 runs
a gradient through ``if`` of a dynamic-shape input once per GraphCell ("The actor already
exists" on the next shape — its own export of such a cell does the same).
"""

import re
import sys

import numpy as np

from ms_runner import flat  # the same flattening of a result (this script's folder is on sys.path)


def main() -> int:
    import mindspore as ms
    from mindspore import Tensor, nn

    inputs, outputs, models = sys.argv[1], sys.argv[2], sys.argv[3:]
    ms.set_context(mode=ms.GRAPH_MODE)
    data = np.load(inputs)
    runs = {}
    fresh = {int(re.fullmatch(r"m(\d+)_fresh", key).group(1)) for key in data.files if key.endswith("_fresh")}
    for key in data.files:
        if key.endswith("_fresh"):
            continue
        i, r, k = (int(v) for v in re.fullmatch(r"m(\d+)_r(\d+)_in(\d+)", key).groups())
        runs.setdefault(i, {}).setdefault(r, {})[k] = data[key]
    results = {}
    for i, path in enumerate(models):
        try:
            cell = nn.GraphCell(ms.load(path))
            for r in sorted(runs.get(i, {})):
                if i in fresh and r:
                    cell = nn.GraphCell(ms.load(path))
                args = [Tensor(v) for _, v in sorted(runs[i][r].items())]
                for k, v in enumerate(flat(cell(*args), [])):
                    results[f"m{i}_r{r}_out{k}"] = v
        except Exception as e:  # reported per model; the test names it
            results[f"m{i}_error"] = np.array(f"{type(e).__name__}: {e}"[:2000])
    np.savez(outputs, **results)
    print("ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())

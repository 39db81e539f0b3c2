"""MindSpore's own export of a cell with a dynamic-shape input, run on several sizes.

Runs in MindSpore's own venv (not anfir's)::

    python ms_dynamic_export.py OUT_DIR

Writes ``OUT_DIR/dynamic.mindir`` (``mindspore.export`` with ``Tensor(shape=[None, 3])``:
-1 dims, ``Shape``/``TupleGetItem``/``MakeTuple`` at run time, ``Size``) and
``OUT_DIR/dynamic.npz``: for each run r its input ``r{r}_in0`` and MindSpore's results
``r{r}_out{k}`` (a tuple flattened in order).
"""

import os
import sys

import numpy as np


def main() -> int:
    import mindspore as ms
    from mindspore import Tensor, nn, ops

    ms.set_context(mode=ms.GRAPH_MODE)

    class Dynamic(nn.Cell):
        def construct(self, x):
            n = x.shape[0]
            flat = ops.reshape(x, (n * 3,))
            spread = ops.broadcast_to(x.sum(0), x.shape)
            scaled = x.mean() / ops.size(x)
            product = ops.matmul(ops.transpose(x, (1, 0)), ops.sin(x))
            return flat, spread, scaled, product, ops.exp(x) * 2.0

    out = sys.argv[1]
    path = os.path.join(out, "dynamic")
    ms.export(Dynamic(), Tensor(shape=[None, 3], dtype=ms.float64), file_name=path, file_format="MINDIR")
    results = {}
    for r, n in enumerate((1, 4, 6)):
        x = np.linspace(-1.0, 2.0, 3 * n).reshape(n, 3)
        # a new GraphCell per size (MindSpore's own way to run one file on several shapes)
        cell = nn.GraphCell(ms.load(path + ".mindir"))
        results[f"r{r}_in0"] = x
        for k, value in enumerate(cell(Tensor(x))):
            results[f"r{r}_out{k}"] = value.asnumpy()
    np.savez(path + ".npz", **results)
    print("exported")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""MindSpore's own non-tail recursion: Fibonacci as a graph-mode Cell (evidence for the live check).

Runs in MindSpore's own venv::

    python ms_fibonacci.py OUT.mindir N

exports the Cell with ``mindspore.export`` (MindSpore writes it at once), then
runs the file with ``mindspore.load`` + ``nn.GraphCell`` on ``N`` and prints the
result.  Measured with MindSpore 2.10 on CPU: running the Cell itself in graph mode
and running its export both do not finish in 150 s, even for N = 5 — as anfir's
export of examples/fibonacci.anf.
"""

import os
import sys

import numpy as np


def fibonacci(n):
    if n < 1:
        return n * 0
    if n == 1:
        return n * 0 + 1
    return fibonacci(n - 1) + fibonacci(n - 2)


def main() -> int:
    import mindspore as ms
    from mindspore import Tensor, nn

    class Fibonacci(nn.Cell):
        def construct(self, n):
            return fibonacci(n)

    out, n = sys.argv[1], Tensor(np.array(int(sys.argv[2]), np.int64))
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.export(Fibonacci(), n, file_name=os.path.splitext(out)[0], file_format="MINDIR")
    print("exported", flush=True)
    cell = nn.GraphCell(ms.load(out))
    print("ran", cell(n), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

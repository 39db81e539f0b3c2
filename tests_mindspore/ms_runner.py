"""Run one ``.mindir`` file in MindSpore (``mindspore.load`` + ``nn.GraphCell``).

Runs in MindSpore's own venv (not anfir's)::

    python ms_runner.py MODEL.mindir INPUTS.npz OUTPUTS.npz [--load-only]

``INPUTS.npz`` holds ``in0, in1, ...`` (0-d arrays for anfir's scalars); the
results, a tuple flattened in order, go to ``OUTPUTS.npz`` as ``out0, ...``.
With ``--load-only`` the model is loaded and wrapped but not run.
"""

import sys

import numpy as np


def flat(value, out):
    if isinstance(value, (tuple, list)):
        for v in value:
            flat(v, out)
    else:
        out.append(value.asnumpy() if hasattr(value, "asnumpy") else np.asarray(value))
    return out


def main() -> int:
    import mindspore as ms
    from mindspore import Tensor, nn

    model, inputs, outputs = sys.argv[1:4]
    ms.set_context(mode=ms.GRAPH_MODE)
    graph = ms.load(model)
    cell = nn.GraphCell(graph)
    if "--load-only" in sys.argv:
        print("loaded")
        return 0
    data = np.load(inputs)
    args = [Tensor(data[f"in{k}"]) for k in range(len(data.files))]
    result = flat(cell(*args), [])
    np.savez(outputs, **{f"out{k}": v for k, v in enumerate(result)})
    print("ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Programs of the op library's operators (and their gradients, anfir's own ``grad``)
whose MindIR export is checked: round trip in tests/test_mindir_ops.py, MindSpore's own
runtime in tests_mindspore/test_mindspore_ops.py.  Each entry returns a tuple of many
results so that one MindSpore subprocess checks a whole family; the inputs hold the
edge cases (ties, NaN/inf, negative operands, half-way values)."""

from __future__ import annotations

from typing import Any

import numpy as np

SOURCE = """
def reductions(x, b) = (max(x, axis=None, keepdims=false), max(x, axis=1, keepdims=true),
                        max(x, axis=(0, 2), keepdims=false), min(x, axis=-1, keepdims=false),
                        min(x, axis=None, keepdims=true), prod(x, axis=1), prod(x, axis=(0, 2)), prod(x),
                        all(b, axis=1), any(b, axis=(0, 2)), all(x > -0.5), any(x, axis=-1, keepdims=true),
                        max(x, x * 0.5), min(x, 0.25))
# (keepdims=true: the gradients of keepdims=false reductions over some axes are helper
# mcore's import ShapeError)
def reductions_grad(x) = grad(lambda (y) sum(sin(max(y, axis=1, keepdims=true))) + sum(cos(min(y, axis=(0, 2), keepdims=true)))
                                         + sin(max(y)) + sum(sin(prod(y, axis=-1, keepdims=true))) + sin(prod(y))
                                         + sum(sin(max(y, y * 0.5))) end)(x)
def reductions_nan(x) = (max(x, axis=1), min(x, axis=0), max(x), min(x, axis=1, keepdims=true))
"""
"""The programs, one entry per family (see :data:`CASES`)."""

_TIES = np.array([[[1.0, 3.0, 3.0, -2.0], [0.5, 0.5, -1.0, 0.5], [2.0, -3.0, 1.5, 2.0]],
                  [[-1.0, -1.0, 0.75, 0.25], [1.25, 3.0, 3.0, 0.0], [-0.5, 1.5, 2.0, 2.0]]])
_BOOLS = np.array([[[True, False, True, True], [True, True, True, True], [False, False, False, False]],
                   [[True, True, True, True], [False, True, False, False], [True, False, True, True]]])
_NANS = np.array([[1.0, np.nan, 3.0], [2.0, 2.0, -np.inf], [np.inf, 0.5, np.nan]])

CASES: dict[str, tuple[Any, ...]] = {
    "reductions": (_TIES, _BOOLS),
    "reductions_grad": (_TIES,),
    "reductions_nan": (_NANS,),
}
"""Entry of :data:`SOURCE` -> its arguments."""

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
def reductions_nan(x) = (max(x, axis=1), min(x, axis=0), max(x), min(x, axis=1, keepdims=true),
                        max(x, 0.25), min(x, transpose(x)), max(x, sum(x, axis=0)), min(1.0, x))
def scans(x) = (argmax(x, axis=1), argmin(x), argmax(x, axis=-1, select_last=true),
                argmin(x, axis=1, keepdims=true, select_last=true), argmax(x, axis=None),
                argmin(x, axis=None, keepdims=true), argmax(x, axis=0, keepdims=true), cumsum(x, 1), cumsum(x),
                cumsum(x, axis=-1, exclusive=true), cumsum(x, 0, false, true), cumsum(x, 0, true, true),
                cumprod(x, 1, true, true))
def scans_grad(x) = grad(lambda (y) sum(sin(cumsum(y, 1))) + sum(sin(cumprod(y, axis=0)))
                                    + sum(cumsum(y) * cumsum(y)) + sum(sin(cumsum(y, 0, true, true))) end)(x)
# the optimizer leaves J(data) (the value itself) in these gradients of partial applications
def closures(a, b) = (grad(lambda (p3) partial(lambda (a, b) a - b end, p3)(b) * p3 end)(add(a, 2.0) * 1.0),
                      grad(lambda (p2) partial(lambda (a, b) a * b - (if b < 0.5 then b else 0.5) end, p2)(2.0)
                                       + partial(lambda (a, b) a * b end, p2)(sum(ones((2, 3)) * -1.5) * 1.0) end)(
                          grad(lambda (q) q * q * a end)(b)))
def rounding(x, y, z) = (square(x), round(x), floor_div(x, y), mod(x, y), fmod(x, y), floor_div(x, 0.75),
                         mod(x, -1.5), fmod(x, 2.0), floor_div(x, z), mod(x, z), fmod(x, z))
def rounding_grad(x, y) = grad(lambda (x, y) sum(sin(square(x))) + sum(sin(fmod(x, y))) + sum(sin(mod(x, y)))
                                            + sum(sin(max(x, y))) + sum(sin(min(x, y))) end, 0, 1)(x, y)
def integers(i, j) = (floor_div(i, j), mod(i, j), fmod(i, j), floor_div(i, 3), mod(i, -3), fmod(i, 2),
                      bitwise_and(i, j), bitwise_or(i, j), bitwise_xor(i, j), bitwise_not(i),
                      bit_shift(i, abs(j)), bit_shift(i, abs(j), direction="right"), square(i), round(i),
                      isnan(i), isinf(i))
def logic(b, c, x) = (logical_xor(b, c), logical_xor(x, c), bitwise_and(b, c), bitwise_or(b, c),
                      bitwise_xor(b, c), bitwise_not(b), isnan(x), isinf(x), zeros((2, 3)),
                      ones((10, 10), "i64"), zeros((3,), "bool"), ones((2, 2)) + sum(zeros_like(x) + 1.0))
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
    # ties (argmax/argmin: the first index, or the last with select_last)
    "scans": (_TIES[0],),
    "scans_grad": (_TIES[1],),
    "closures": (1.5, 0.25),
    # half-way values for round; negative operands; zero divisors (x / 0 is inf, nan)
    "rounding": (np.array([-7.0, -2.5, -0.5, 0.5, 1.5, 2.5, 7.0, 3.0, -4.0]),
                 np.array([2.0, -2.0, 2.0, -2.0, 2.0, 2.0, -3.0, 0.0, 0.0]),
                 np.array([[1.5], [-2.0]])),
    "rounding_grad": (np.array([-7.3, -2.4, -0.6, 0.45, 1.7, 2.5]), np.array([2.0, -2.0, 2.1, -2.0, 1.1, 2.5])),
    # integer division by 0 (numpy: 0), negative operands
    "integers": (np.array([-7, -3, 7, 7, 0, 5, -8, 9], np.int64), np.array([2, 2, -2, 0, 3, -3, 0, 1], np.int64)),
    "logic": (np.array([True, False, True, False]), np.array([True, True, False, False]),
              np.array([np.nan, np.inf, -np.inf, 0.0])),
}
"""Entry of :data:`SOURCE` -> its arguments."""

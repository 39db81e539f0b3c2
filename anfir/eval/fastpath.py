"""The evaluator's fast paths: scalar and array arithmetic without the checks' frames.

A primitive's ``impl`` is the whole semantics, checks included: arithmetic
refuses tuple operands, bounds integer products (``limits.MAX_INT_BITS``),
gives a ``bf16`` array's Python-scalar operand the array's type
(``dtypes.weak_scalars``), and turns ``math``'s domain errors into nan/inf
as numpy does.  Each check is a Python frame on every call, which on a Python
float costs several times the arithmetic itself.  Most operands need none of
them: ``1.5 * 2.0`` is Python's ``*``, and so is an array times an array.

:data:`FAST_PATHS` says, per primitive object, which operand types need no
check and which function then computes the impl's result.  The compiler emits
a guarded instruction (``F1``/``F2``, see :mod:`anfir.eval.opcodes`) for a call
of such a primitive; the VM calls ``fast`` when the operands' types pass the
guard and ``impl`` otherwise, so every check still runs for every operand
that needs it (tuples, Python ints in ``mul``, a Python float beside an array,
bools in arithmetic, numpy scalars...).

The contract of an entry ``FastPath(fast, types)``: for operands whose exact
types are in ``types`` — for a binary primitive, *both* operands of the *same*
type —, ``fast(*args)`` either returns exactly what ``impl(*args)`` returns
(same value, same type) or raises; when it raises, the VM calls ``impl``,
which gives the result (``math.log(0.0)`` raises where the impl answers
``-inf``) or the error.  ``tests/test_eval.py`` checks the contract on edge
values of every entry.  ``pow`` has no entry: ``(-8.0) ** (1 / 3)`` returns a
complex number, where the impl answers nan, instead of raising.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from anfir.ir.primitive import Primitive
from anfir.primitives import arith, tensor


class FastPath(NamedTuple):
    """How the VM may compute a primitive's call without its impl's checks."""

    fast: Callable[..., Any]
    """Returns what the impl returns for operands of ``types``, or raises."""
    types: frozenset[type]
    """Operand types (exact, not subclasses) for which ``fast`` may be called."""


# Python ints and floats; numpy arrays (not numpy scalars, not subclasses).
# An array with an array needs no check: weak_scalars only concerns a Python
# scalar beside an array, which fails the same-type guard.
_NUMBERS = frozenset({int, float})
_NUMBERS_ARRAYS = frozenset({int, float, np.ndarray})
# mul: a product of two Python ints is bounded by the impl (repeated squaring
# would exhaust memory), so ints always take the checked path.
_FLOATS_ARRAYS = frozenset({float, np.ndarray})
_BOOLS = frozenset({bool})
_ARRAYS = frozenset({np.ndarray})

FAST_PATHS: dict[Primitive, FastPath] = {
    arith.add: FastPath(operator.add, _NUMBERS_ARRAYS),
    arith.sub: FastPath(operator.sub, _NUMBERS_ARRAYS),
    arith.mul: FastPath(operator.mul, _FLOATS_ARRAYS),
    # x / 0 raises here; the impl answers inf or nan.  Arrays are divided under
    # numpy's errstate by the impl (no warning), so they are not fast.
    arith.div: FastPath(operator.truediv, _NUMBERS),
    arith.neg: FastPath(operator.neg, _NUMBERS_ARRAYS),
    arith.abs_: FastPath(abs, _NUMBERS),
    # math's domain and range errors raise (log(0.0), exp(1e3), sin(inf)); the
    # impl then answers numpy's nan or inf.
    arith.exp: FastPath(math.exp, _NUMBERS),
    arith.log: FastPath(math.log, _NUMBERS),
    arith.sin: FastPath(math.sin, _NUMBERS),
    arith.cos: FastPath(math.cos, _NUMBERS),
    arith.tanh: FastPath(math.tanh, _NUMBERS),
    arith.sqrt: FastPath(math.sqrt, _NUMBERS),
    arith.maximum: FastPath(max, _NUMBERS),
    arith.minimum: FastPath(min, _NUMBERS),
    arith.lt: FastPath(operator.lt, _NUMBERS_ARRAYS),
    arith.le: FastPath(operator.le, _NUMBERS_ARRAYS),
    arith.gt: FastPath(operator.gt, _NUMBERS_ARRAYS),
    arith.ge: FastPath(operator.ge, _NUMBERS_ARRAYS),
    arith.eq: FastPath(operator.eq, _NUMBERS_ARRAYS),
    arith.ne: FastPath(operator.ne, _NUMBERS_ARRAYS),
    # Two Python bools: ``&``, ``|`` and ``not`` give the bool the impl gives.
    arith.logical_and: FastPath(operator.and_, _BOOLS),
    arith.logical_or: FastPath(operator.or_, _BOOLS),
    arith.logical_not: FastPath(operator.not_, _BOOLS),
    # Two arrays of rank >= 1: ``@``.  A 0-d array raises here; the impl then
    # refuses it as a scalar operand.
    tensor.matmul: FastPath(operator.matmul, _ARRAYS),
}
"""The fast path of each primitive that has one (see the module's docstring)."""


__all__ = ["FAST_PATHS", "FastPath"]

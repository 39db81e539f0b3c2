"""Complex numbers (``c64``, ``c128``): building them and taking them apart.

``complex(re, im)`` makes a complex value of two real ones (``f32`` parts give
``c64``, ``f64`` and Python floats ``c128``); ``real``, ``imag`` and ``conj``
are numpy's.  ``abs`` (in :mod:`arith`) gives a complex value's modulus, and
the arithmetic primitives, ``exp``, ``cast``... work on complex values as
numpy's do.  Gradients through complex values are not defined (ops.md does not
ask for them): these four have no gradient rule, so differentiating a program
that calls them is a GradientError naming the call (not a silent zero: the
derivative of ``real(complex(x, 0.0))`` is 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anfir.abstract import rules
from anfir.errors import AnfirTypeError
from anfir.primitives.elementwise import _elementwise
from anfir.primitives.registry import declare

FAMILY = "complex"


def _real_input(name: str, x: Any) -> None:
    """``complex`` takes real parts: a complex part would be silently mixed in."""
    if np.iscomplexobj(x):
        raise AnfirTypeError(f"complex needs real parts; its {name} part is complex")


@_elementwise
def _complex(re: Any, im: Any) -> Any:
    _real_input("first", re)
    _real_input("second", im)
    if type(re) in (int, float) and type(im) in (int, float):
        return complex(re, im)
    # NEP 50: Python's 1j is weak, so f32 parts give c64 and f64 parts c128;
    # integer parts compute in f64 (as every float function of an int does).
    re_array = np.asarray(re)
    im_array = np.asarray(im)
    dtype = np.result_type(re_array, im_array)
    if dtype.kind not in "f" and dtype.name != "bfloat16":
        re_array, im_array = re_array.astype(np.float64), im_array.astype(np.float64)
    elif dtype.name in ("float16", "bfloat16"):
        re_array, im_array = re_array.astype(np.float32), im_array.astype(np.float32)
    return re_array + 1j * im_array


def _part(np_fn: Any) -> Any:
    @_elementwise
    def impl(z: Any) -> Any:
        return np_fn(z)  # (_elementwise makes Python scalars of Python scalars' results)

    impl.__name__ = np_fn.__name__
    return impl


complex_ = declare("complex", 2, _complex, infer=rules.elementwise("complex"), family=FAMILY,
                   doc="complex(re, im) — re + im·i (f32 parts give c64, f64 parts c128)")
real = declare("real", 1, _part(np.real), infer=rules.elementwise("real"), family=FAMILY,
               doc="real(z) — the real part (of a real value: itself)")
imag = declare("imag", 1, _part(np.imag), infer=rules.elementwise("imag"), family=FAMILY,
               doc="imag(z) — the imaginary part (of a real value: 0)")
conj = declare("conj", 1, _part(np.conj), infer=rules.elementwise("conj"), family=FAMILY,
               doc="conj(z) — the complex conjugate")

__all__ = ["complex_", "conj", "imag", "real"]

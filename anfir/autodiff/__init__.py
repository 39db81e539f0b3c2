"""Source-transform reverse-mode automatic differentiation (the J transform).

* :mod:`~anfir.autodiff.jtransform` — ``▸g``/``◂g`` construction;
* :mod:`~anfir.autodiff.primitive_j` — gradient rules of primitives;
* :mod:`~anfir.autodiff.runtime` — ``J`` on values and the graphs behind ``grad``;
* :mod:`~anfir.autodiff.api` — ``anfir.grad``, ``value_and_grad``, ``vjp``.
"""

from anfir.autodiff.api import grad, jvp, value_and_grad, vjp

__all__ = ["grad", "jvp", "value_and_grad", "vjp"]

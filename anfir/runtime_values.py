"""Values that are not plain Python/numpy data.

Plain data is represented natively: ``bool``, ``int``, ``float``, ``str``,
``None``, ``tuple`` and ``numpy.ndarray``.  This module adds

* :class:`Symbol` — a global name not yet resolved (what the parser leaves for
  the ``resolve`` phase);
* :class:`Closure` — a graph together with the values of its free variables
  (captured by value when the closure is made);
* :class:`Partial` — ``partial(f, a, ...)``;
* :class:`SymbolicKey` and :class:`GradEnv` — the environment in which the
  gradients of a closure's captured values travel (Myia/MindSpore's EnvInstance);
* :class:`DType` — a scalar element type (``f64``), usable as a value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from anfir import dtypes

if TYPE_CHECKING:  # pragma: no cover
    from anfir.ir.graph import FuncGraph


@dataclass(frozen=True)
class Symbol:
    """An unresolved global name (a top-level definition or a built-in)."""

    name: str

    def __repr__(self) -> str:
        return f"Symbol({self.name})"


@dataclass(frozen=True, eq=False)
class Closure:
    """A function value: ``graph`` with the captured values ``env``.

    ``env[i]`` is the value of ``manager.free_variables_total(graph)[i]`` at the
    moment the closure was made.
    """

    graph: "FuncGraph"
    env: tuple

    def __repr__(self) -> str:
        return f"<closure @{self.graph.name}>"


@dataclass(frozen=True, eq=False)
class Partial:
    """``partial(fn, *args)``: calling it with ``more`` calls ``fn(*args, *more)``."""

    fn: Any
    args: tuple

    def __repr__(self) -> str:
        return f"<partial {self.fn!r} {len(self.args)} args>"


@dataclass(frozen=True, order=True)
class SymbolicKey:
    """Names a captured value in a :class:`GradEnv` (one per free-variable node)."""

    name: str

    def __repr__(self) -> str:
        return f"Key({self.name})"


class GradEnv:
    """An immutable map from :class:`SymbolicKey` to gradient.

    The gradient of a closure is the GradEnv of its captured values' gradients;
    missing keys mean zero.  ``add`` merges two environments elementwise.
    """

    __slots__ = ("_items",)

    def __init__(self, items: dict | None = None) -> None:
        self._items: dict[SymbolicKey, Any] = dict(items or {})

    def get(self, key: SymbolicKey, default: Any) -> Any:
        """The gradient stored for ``key``, or ``default``."""
        return self._items.get(key, default)

    def set(self, key: SymbolicKey, value: Any) -> "GradEnv":
        """A new env with ``key`` bound to ``value``."""
        items = dict(self._items)
        items[key] = value
        return GradEnv(items)

    def items(self) -> Iterator[tuple[SymbolicKey, Any]]:
        """Entries in key order (deterministic)."""
        return iter(sorted(self._items.items(), key=lambda kv: kv[0].name))

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k.name}: {v!r}" for k, v in self.items())
        return f"GradEnv({{{inner}}})"


@dataclass(frozen=True)
class DType:
    """A scalar element type such as ``f64`` or ``i32``."""

    name: str

    @property
    def numpy(self) -> np.dtype:
        """The matching numpy dtype."""
        return dtypes.numpy_dtype(self.name)

    @property
    def is_float(self) -> bool:
        """Whether this is a floating-point type."""
        return dtypes.is_float(self.name)

    def __repr__(self) -> str:
        return self.name

"""The pipeline's last phase for ``backend="jax"``: the optimized graph lowered to
JAX, and the StableHLO of the jitted program as its numbered dump.

The phase (:data:`PHASE`) runs after ``validate``: it makes the optimized entry a
:class:`~anfir.backends.tojax.function.JaxFunction`, lowers ``jax.jit`` of it for
the entry's argument types (``jax.jit(fn).lower(*specs).as_text()``) and keeps
both in ``program.artifacts`` (``"jax"``, ``"stablehlo"``); its dump is
``NN_stablehlo.mlir``.  Lowering runs with ``jax_enable_x64`` on, so anfir's
types are kept as they are (``f64`` stays ``f64``, a Python float is a 64-bit
scalar); arguments declared ``f32`` stay ``f32``.

It also holds what ``anfir run --backend jax`` does (:func:`run_jitted`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import jax
import numpy as np

from anfir.abstract.values import AbstractValue, AScalar, ATensor, ATuple
from anfir.dtypes import numpy_name
from anfir.errors import UsageError
from anfir.ir.graph import FuncGraph
from anfir.nested import fold_nested
from anfir.passes.compile_state import Phase, Program, write_text
from anfir.backends.tojax.errors import TracedRecursionError
from anfir.backends.tojax.function import JaxFunction
from anfir.backends.tojax.traced import is_array, map_tuples


def argument_specs(graph: FuncGraph) -> list[Any]:
    """``jax.ShapeDtypeStruct``s (tuples of them for tuples) for the parameters of
    a specialized graph, from the types the specializer gave them."""
    specs = []
    for index, param in enumerate(graph.parameters):
        what = param.name or f"argument {index}"
        specs.append(_spec(param.abstract, what))
    return specs


def _spec(abstract: Optional[AbstractValue], what: str) -> Any:
    def leaf(value: Any) -> Any:
        if isinstance(value, AScalar) and value.dtype != "str":
            return jax.ShapeDtypeStruct((), np.dtype(numpy_name(value.dtype)))
        if isinstance(value, ATensor) and value.shape is not None and \
                all(isinstance(d, int) for d in value.shape):
            return jax.ShapeDtypeStruct(tuple(int(d) for d in value.shape),
                                        np.dtype(numpy_name(value.dtype)))
        raise UsageError(f"lowering to StableHLO needs concrete argument types: {what} is "
                         f"{value}; give example values or types such as 'f32[4, 3]' (--args)")

    return fold_nested(abstract, lambda v: v.items if isinstance(v, ATuple) else None,
                       lambda _t, items: tuple(items), leaf)


def lower_phase(program: Program) -> Program:
    """Lower the optimized entry to JAX and keep it and its StableHLO text."""
    graph = program.entry
    assert graph is not None  # the phases before give the specialized entry
    fn = JaxFunction(graph)
    specs = argument_specs(graph)
    with jax.enable_x64(True):
        program.artifacts["stablehlo"] = jax.jit(fn).lower(*specs).as_text()
    program.artifacts["jax"] = fn
    return program


def write_stablehlo(program: Program, folder: Path, stem: str) -> list[str]:
    """The phase's dump: ``folder/stem.mlir``, the StableHLO text."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.mlir"
    write_text(path, program.artifacts["stablehlo"])
    return [str(path)]


PHASE = Phase("stablehlo", lower_phase, "lower to JAX; the StableHLO of the jitted program",
              dump=write_stablehlo)
"""The phase ``anfir.compile(..., backend="jax")`` appends to the pipeline."""


def run_jitted(fn: JaxFunction, args: Sequence[Any]) -> tuple[Any, bool]:
    """``jax.jit(fn)(*args)`` with ``jax_enable_x64`` on (anfir's 64-bit types), the
    result as numpy arrays and Python scalars (as ``anfir.run`` returns them).

    Every argument is traced.  When the program recurses to a depth its
    arguments decide (``fibonacci(n)``), which JAX cannot trace, it runs again
    with the arguments that are not arrays static (compile-time constants):
    returns ``(result, True)`` then.
    """
    with jax.enable_x64(True):
        try:
            out, static = jax.jit(fn)(*args), False
        except TracedRecursionError:
            numbers = tuple(i for i, a in enumerate(args) if not isinstance(a, np.ndarray))
            if not numbers:
                raise
            out, static = jax.jit(fn, static_argnums=numbers)(*args), True
        return _plain(out), static


def _plain(value: Any) -> Any:
    def leaf(v: Any) -> Any:
        if not is_array(v):
            return v
        array = np.asarray(v)
        return array.item() if array.ndim == 0 else array

    return map_tuples(value, leaf)


__all__ = ["PHASE", "argument_specs", "lower_phase", "run_jitted", "write_stablehlo"]

"""The JAX back end: ``anfir.to_jax`` and the StableHLO phase of ``anfir.compile(..., backend="jax")``.

This module imports no JAX (``import anfir`` loads it): the modules that do —
:mod:`~anfir.backends.tojax.traced`, :mod:`~anfir.backends.tojax.rules`,
:mod:`~anfir.backends.tojax.machine`, :mod:`~anfir.backends.tojax.function`,
:mod:`~anfir.backends.tojax.stablehlo` — are imported when a function here is
first called, after :func:`require_jax` has checked that JAX is installed.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

from anfir.backends.tojax.errors import (JAX_EXTRA, LoweringError, MissingExtraError,
                                         TracedRecursionError)
from anfir.errors import UsageError
from anfir.ir.graph import FuncGraph, Module
from anfir.passes.compile_state import Phase


def require_jax() -> None:
    """Raise :class:`MissingExtraError` naming the extra when JAX cannot be imported."""
    try:
        import jax  # noqa: F401  (the back end's modules need it; this is the check)
    except ImportError as exc:
        raise MissingExtraError(f"the JAX back end needs JAX, which is not installed ({exc}): "
                                f"{JAX_EXTRA}") from None


def entry_graph(mod_or_graph: Union[Module, FuncGraph], entry: Optional[str] = None) -> FuncGraph:
    """The graph to convert: ``mod_or_graph``'s entry ``entry`` (default ``main``,
    else its only definition), or the FuncGraph itself."""
    if isinstance(mod_or_graph, Module):
        return mod_or_graph[mod_or_graph.entry_name(entry)]
    if isinstance(mod_or_graph, FuncGraph):
        if entry is not None and entry != mod_or_graph.name:
            raise UsageError(f"entry {entry!r} given with the graph @{mod_or_graph.name}")
        return mod_or_graph
    raise UsageError(f"to_jax needs a Module or a FuncGraph, not {type(mod_or_graph).__name__}")


def to_jax(mod_or_graph: Union[Module, FuncGraph], entry: Optional[str] = None) -> Callable[..., Any]:
    """``mod_or_graph``'s entry as a pure function of JAX arrays.

    The function traces the graph — parsed, or optimized by ``anfir.compile`` —
    into ``jax.numpy``/``lax`` operations when it is called, so ``jax.jit``,
    ``jax.grad``, ``jax.vmap`` and sharded inputs apply to it.  ``if`` on a
    traced condition becomes ``lax.cond``, a loop whose decisions are traced
    ``lax.while_loop`` (one whose decisions are known unrolls, so ``jax.grad``
    passes through it), closures and ``partial`` are resolved while tracing;
    a recursion deeper than a traced value allows is an AnfirError.  Without
    JAX installed, an AnfirError saying ``pip install "anfir[jax]"``.
    """
    require_jax()
    from anfir.backends.tojax.function import JaxFunction  # JAX is installed: load the back end

    return JaxFunction(entry_graph(mod_or_graph, entry))


def lowering_phase() -> Phase:
    """The phase ``anfir.compile(..., backend="jax")`` appends to the pipeline: the
    optimized graph lowered to JAX, dumped as ``NN_stablehlo.mlir``
    (:mod:`anfir.backends.tojax.stablehlo`)."""
    require_jax()
    from anfir.backends.tojax.stablehlo import PHASE  # JAX is installed: load the back end

    return PHASE


def run_with_jax(fn: Callable[..., Any], args: Sequence[Any]) -> tuple[Any, bool]:
    """What ``anfir run --backend jax`` does: ``jax.jit(fn)(*args)`` with 64-bit types
    on, the result as numpy values; when the program recurses on its scalar
    arguments, again with those static.  Returns ``(result, scalars were static)``."""
    require_jax()
    from anfir.backends.tojax.stablehlo import run_jitted  # JAX is installed: load the back end

    return run_jitted(fn, args)  # type: ignore[arg-type]


__all__ = ["JAX_EXTRA", "LoweringError", "MissingExtraError", "TracedRecursionError",
           "entry_graph", "lowering_phase", "require_jax", "run_with_jax", "to_jax"]

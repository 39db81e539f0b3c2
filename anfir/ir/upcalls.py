"""Calls from the lower layers up to the higher ones, installed in one place.

Layers import downwards only (docs/architecture.md).  A few things a lower
layer offers need a higher one to do the work: printing a graph (``str(g)``
is the printers' ANF text), drawing it in Jupyter, and applying ``J`` to a
run-time value (the autodiff).  Each such call goes through a slot here;
:mod:`anfir.wiring` fills every slot when the package is imported, so what a
program does never depends on which submodules were imported first.
"""

from __future__ import annotations

from typing import Any, Callable, Optional


def _missing(what: str) -> Callable[..., Any]:
    def fail(*_args: Any) -> Any:
        raise RuntimeError(f"anfir: {what} is not installed (import anfir, which wires the layers)")

    return fail


class Upcalls:
    """The slots; each holds a function of the higher layer named in its doc."""

    graph_text: Callable[[Any], str] = _missing("the ANF printer")
    """``anfir.printers.text.to_text``: ``str()`` of a graph or module."""
    graph_svg: Callable[[Any], Optional[str]] = _missing("the SVG drawing")
    """``anfir.printers.display.graph_svg``: Jupyter's picture of a graph or module."""
    j_value: Callable[[Any], Any] = _missing("the J transform of values")
    """``anfir.autodiff.runtime.j_value``: what the ``J`` primitive computes."""
    load_lir: Callable[[Any], Any] = _missing("the low-level loader")
    """``anfir.lowlevel.loader.load_lir_file``: ``anfir.load`` of a ``.lir`` dump."""
    call_function: Callable[[Any, tuple[Any, ...]], Any] = _missing("the evaluator's call of function values")
    """``anfir.eval.call_function``: how the structured loops (``scan``, ``fori_loop``) and
    ``custom_vjp``/``custom_jvp`` call their function arguments."""
    batch_value: Callable[..., Any] = _missing("the batching transform of values")
    """``anfir.autodiff.batching.batch_value``: what ``batch_fn`` (vmap at run time) computes."""


UPCALLS = Upcalls()
"""The one instance; :mod:`anfir.wiring` sets its slots."""

__all__ = ["UPCALLS", "Upcalls"]

"""Up-calls: calls from the lower layers up to the higher ones, installed in one place.

Layers import downwards only (docs/architecture.md).  A few things a lower
layer offers need a higher one to do the work: printing a graph (``str(g)``
is the printers' ANF text), drawing it in Jupyter, applying ``J`` to a
run-time value, the graph a call of ``grad``/``jvp``/``vmap``... stands for,
and typing a call of a J-transformed function (the autodiff).  Each such call
goes through a slot of :data:`UPCALLS` — the one mechanism, and the one name,
for them: the meta functions' ``generate`` fields and the inference engine's
table of atom callers call these slots rather than being filled from above.
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
    # The graphs the op library's meta functions stand for (``MetaFunction.generate``
    # and ``generate_for_types`` of the declarations in ``anfir.primitives.meta`` and
    # ``checkpointing`` call these): ``slot(args) -> FuncGraph``.
    grad_graph: Callable[[tuple[Any, ...], bool], Any] = _missing("the graphs of grad")
    """``anfir.autodiff.runtime.generate_grad(args, with_value)``: ``grad``/``value_and_grad``."""
    jvp_graph: Callable[[tuple[Any, ...]], Any] = _missing("the graphs of jvp")
    """``anfir.autodiff.forward.generate_jvp``."""
    jvp_graph_for_types: Callable[[tuple[Any, ...]], Any] = _missing("the typed graphs of jvp")
    """``anfir.autodiff.forward.generate_jvp_for_types`` (None: the types do not determine it)."""
    vmap_graph: Callable[[tuple[Any, ...]], Any] = _missing("the graphs of vmap")
    """``anfir.autodiff.batching.generate_vmap``."""
    jacfwd_graph: Callable[[tuple[Any, ...]], Any] = _missing("the graphs of jacfwd")
    """``anfir.autodiff.jacobians.generate_jacfwd``."""
    jacrev_graph: Callable[[tuple[Any, ...]], Any] = _missing("the graphs of jacrev")
    """``anfir.autodiff.jacobians.generate_jacrev``."""
    hessian_graph: Callable[[tuple[Any, ...]], Any] = _missing("the graphs of hessian")
    """``anfir.autodiff.jacobians.generate_hessian``."""
    checkpoint_graph: Callable[[tuple[Any, ...]], Any] = _missing("the graphs of checkpoint")
    """``anfir.autodiff.checkpoint.generate_checkpoint``."""
    checkpoint_graph_for_types: Callable[[tuple[Any, ...]], Any] = _missing(
        "the typed graphs of checkpoint")
    """``anfir.autodiff.checkpoint.generate_checkpoint_for_types``."""
    infer_j_call: Callable[..., Any] = _missing("the typing of J-transformed calls")
    """``anfir.autodiff.typing.call_j(engine, atom, args, node)``: the inference engine's
    rule for a call of a ``JFn`` (a generator, like the engine's other atom callers)."""


UPCALLS = Upcalls()
"""The one instance; :mod:`anfir.wiring` sets its slots."""

__all__ = ["UPCALLS", "Upcalls"]

"""The one place where higher layers plug into lower ones: the up-calls.

Layers import downwards only (docs/architecture.md).  Where a lower layer
offers something only a higher one can do, it calls a slot of
:data:`anfir.ir.upcalls.UPCALLS` (the one mechanism for it), and this module
fills every slot when ``anfir`` is imported — before any user code runs, so
behaviour never depends on which submodules someone imported first:

* ``str(graph)`` and Jupyter's picture → the printers (``graph_text``, ``graph_svg``);
* the ``J`` primitive on run-time values → the autodiff (``j_value``);
* ``anfir.load`` of a ``.lir`` dump → the low-level loader (``load_lir``);
* the structured loops and custom rules calling their function arguments → the
  evaluator (``call_function``);
* ``batch_fn`` (vmap at run time) → the batching transform (``batch_value``);
* ``grad`` / ``value_and_grad`` / ``jvp`` / ``vmap`` / ``jacfwd`` / ``jacrev`` /
  ``hessian`` / ``checkpoint`` called at run time or expanded by the ``ad`` phase
  (and, for ``jvp`` and ``checkpoint``, typed by the specializer) → the graphs the
  autodiff generates (``*_graph``, ``*_graph_for_types``);
* typing a call of a J-transformed function → the autodiff's typing rule
  (``infer_j_call``, the inference engine's caller for ``JFn`` atoms).
"""

from __future__ import annotations

from anfir.autodiff.batching import batch_value, generate_vmap
from anfir.autodiff.jacobians import generate_hessian, generate_jacfwd, generate_jacrev
from anfir.autodiff.checkpoint import generate_checkpoint, generate_checkpoint_for_types
from anfir.autodiff.forward import generate_jvp, generate_jvp_for_types
from anfir.autodiff.runtime import generate_grad, j_value
from anfir.autodiff.typing import call_j
from anfir.ir.upcalls import UPCALLS
from anfir.eval import call_function
from anfir.lowlevel.loader import load_lir_file
from anfir.printers.display import graph_svg
from anfir.printers.text import to_text


def install() -> None:
    """Fill every slot of :data:`UPCALLS` (idempotent); nothing else is assigned here."""
    UPCALLS.graph_text = to_text
    UPCALLS.graph_svg = graph_svg
    UPCALLS.j_value = j_value
    UPCALLS.load_lir = load_lir_file
    UPCALLS.call_function = call_function
    UPCALLS.batch_value = batch_value
    UPCALLS.grad_graph = generate_grad
    UPCALLS.jvp_graph = generate_jvp
    UPCALLS.jvp_graph_for_types = generate_jvp_for_types
    UPCALLS.vmap_graph = generate_vmap
    UPCALLS.jacfwd_graph = generate_jacfwd
    UPCALLS.jacrev_graph = generate_jacrev
    UPCALLS.hessian_graph = generate_hessian
    UPCALLS.checkpoint_graph = generate_checkpoint
    UPCALLS.checkpoint_graph_for_types = generate_checkpoint_for_types
    UPCALLS.infer_j_call = call_j


install()

__all__ = ["install"]

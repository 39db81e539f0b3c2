"""The one place where higher layers plug into lower ones.

Layers import downwards only (docs/architecture.md).  Where a lower layer
offers something only a higher one can do, it leaves a slot, and this module
fills every slot when ``anfir`` is imported — before any user code runs, so
behaviour never depends on which submodules someone imported first:

* ``str(graph)`` and Jupyter's picture → the printers;
* the ``J`` primitive on run-time values → the autodiff;
* ``anfir.load`` of a ``.lir`` dump → the low-level loader;
* ``grad`` / ``value_and_grad`` / ``jvp`` called at run time (and typed by the
  specializer) → the graphs the autodiff generates;
* typing a call of a J-transformed function → the autodiff's typing rule,
  registered with the inference engine.
"""

from __future__ import annotations

from anfir.abstract.values import JFn
from anfir.autodiff.batching import batch_value, generate_vmap
from anfir.autodiff.jacobians import generate_hessian, generate_jacfwd, generate_jacrev
from anfir.autodiff.checkpoint import generate_checkpoint, generate_checkpoint_for_types
from anfir.autodiff.forward import generate_jvp, generate_jvp_for_types
from anfir.autodiff.runtime import generate_grad, j_value
from anfir.autodiff.typing import call_j
from anfir.infer.engine import register_atom_caller
from anfir.ir.upcalls import UPCALLS
from anfir.eval import call_function
from anfir.lowlevel.loader import load_lir_file
from anfir.primitives import meta
from anfir.primitives import checkpointing
from anfir.printers.display import graph_svg
from anfir.printers.text import to_text


def install() -> None:
    """Fill every slot (idempotent)."""
    UPCALLS.graph_text = to_text
    UPCALLS.graph_svg = graph_svg
    UPCALLS.j_value = j_value
    UPCALLS.load_lir = load_lir_file
    UPCALLS.call_function = call_function
    meta.grad.generate = lambda args: generate_grad(args, with_value=False)
    meta.value_and_grad.generate = lambda args: generate_grad(args, with_value=True)
    meta.jvp.generate = generate_jvp
    meta.jvp.generate_for_types = generate_jvp_for_types
    register_atom_caller(JFn, call_j)
    UPCALLS.batch_value = batch_value
    meta.vmap.generate = generate_vmap
    meta.jacfwd.generate = generate_jacfwd
    meta.jacrev.generate = generate_jacrev
    meta.hessian.generate = generate_hessian
    checkpointing.checkpoint.generate = generate_checkpoint
    checkpointing.checkpoint.generate_for_types = generate_checkpoint_for_types


install()

__all__ = ["install"]

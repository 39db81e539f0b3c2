"""Write anfir programs as MindSpore ``.mindir`` files.

::

    data = anfir.export_mindir(mod, entry="mlp_loss", args=[w1, w2, x, y], path="mlp.mindir")
    # in MindSpore:  mindspore.nn.GraphCell(mindspore.load("mlp.mindir"))(*tensors)

The program is compiled (``anfir.compile``: specialized, differentiated,
optimized) and its graphs themselves are written — not a flattened
first-order program — because MindIR has anfir's model: graphs are values,
closures are ``Partial``\\ s, ``if`` is ``Switch`` of two functions followed by
a call of the chosen one, a loop is a graph that tail-calls itself.

* every graph reachable from the entry becomes a ``GraphProto`` (the entry is
  ``ModelProto.graph``, the others ``functions``);
* closures are lambda-lifted: a graph's free variables become its first
  inputs, a use of the graph as a value is ``Partial(graph, captured...)`` and a
  direct call passes them first — no graph of the file has a free variable
  (MindSpore hangs loading one that does);
* a primitive call is written by :data:`RULES` (keyed by the primitive object)
  as MindSpore ops; a call of a computed function is ``REF::<node>``;
* weights: the entry's parameters named in ``params`` (e.g. ``mod.params`` of
  an imported model) are written as ``GraphProto.parameter`` tensors;
* dtypes as MindSpore wants them: anfir's Python scalars are 0-d tensors, a
  scalar constant next to a tensor carries that tensor's dtype (``Pow(f64,
  i64)`` finds no kernel), a tuple index is a scalar INT64 constant (a 0-d
  tensor there crashes MindSpore), a dtype is MindSpore's type id.

A program anfir cannot write (a primitive without a rule) is one located
:class:`MindirError` listing every such node.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence

from anfir.decompositions import DECOMPOSITIONS
from anfir.interop.mindir.export_rules import RULES
from anfir.interop.mindir.writer import Writer
from anfir.ir.graph import Module
from anfir.ir.manager import remove_dead_graphs
from anfir.ir.primitive import Primitive
from anfir.passes import ad, inline, loops_as_recursion
from anfir.passes.compile_state import Program
from anfir.passes.decompose import decompose
from anfir.passes.inline import inline_calls
from anfir.passes.pipeline import PHASES, Phase, compile_program


def native() -> frozenset[Primitive]:
    """The composites of :data:`anfir.decompositions.DECOMPOSITIONS` MindSpore has as ops of
    its own (those :data:`RULES` writes: ``Softmax``, ``LogSoftmax``, ``Softplus``...); the
    others are decomposed into core primitives before the graphs are written."""
    return frozenset(p for p in DECOMPOSITIONS if p in RULES)

def _inline_every_call(program: Program) -> Program:
    """The inline phase with no size limit: every call of a non-recursive graph is
    inlined (recursive ones, the loops, stay graphs).  A graph called twice — a
    network's block — otherwise keeps its backpropagator returning a gradient
    environment for its free variables, a type MindSpore's loader cannot infer;
    inlined, the optimizer resolves the environment to the gradients themselves."""
    manager = program.require_manager()
    remove_dead_graphs(manager)
    program.stats["inline"] += inline_calls(manager, threshold=UNLIMITED)
    remove_dead_graphs(manager)
    return program

UNLIMITED = 1 << 62
"""An inlining threshold no graph reaches."""

def _phases(counted_loops: bool) -> list[Phase]:
    """The pipeline for MindIR: every call inlined; scans and fori_loops back to
    while-header graphs before ``validate`` (their bodies inlined and their tuples
    folded after: a ``None`` in a tuple MindSpore's runtime must allocate fails there);
    with or without the ``loops`` phase."""
    phases = [Phase(p.name, _inline_every_call, p.doc) if p.run is inline.run else p for p in PHASES
              if counted_loops or p.run is not ad.rewrite_counted_loops]
    at = [p.name for p in phases].index("validate")
    optimize = phases[at - 1]
    phases[at:at] = [
        Phase("loops_as_recursion", loops_as_recursion.run,
              "scan / fori_loop -> tail-recursive header graphs (MindIR's loops)"),
        Phase("inline_loops", _inline_every_call, "inline the loops' bodies"),
        Phase("optimize_loops", optimize.run, optimize.doc)]
    return phases


def export_mindir(source: Any, entry: Optional[str] = None, args: Optional[Sequence[Any]] = None,
                  path: Optional[str] = None, params: Optional[dict[str, Any]] = None) -> bytes:
    """Compile ``source``'s entry for ``args`` and write it as ``.mindir`` bytes (and to
    ``path`` when given).  ``params`` names entry parameters written as weights (a
    Module's ``params`` are used by default)."""
    if params is None and isinstance(source, Module):
        params = dict(source.params)
    # MindIR writes a loop as a graph that calls itself (a while header): counted tail
    # recursion becomes fori_loop before AD (the loops phase), so its gradient is two
    # forward loops of data, and every scan/fori_loop is then written back as a header
    # graph (passes/loops_as_recursion.py), which MindSpore's runtime runs.  A scan
    # whose number of steps is known only at run time (the gradient of a loop with a
    # run-time trip count) cannot be: then the program is compiled again without the
    # loops phase, its counted loops staying tail recursion, whose gradient
    # MindSpore loads but does not finish (docs/mindir.md).
    program = compile_program(source, entry=entry, args=args, phases=_phases(counted_loops=True))
    if program.program.stats[loops_as_recursion.LEFT]:
        program = compile_program(source, entry=entry, args=args, phases=_phases(counted_loops=False))
    graph = program.graph
    model = Writer(params).run(decompose(graph, native()))
    data: bytes = model.SerializeToString(deterministic=True)
    if path is not None:
        with open(os.fspath(path), "wb") as handle:
            handle.write(data)
    return data


__all__ = ["RULES", "Writer", "export_mindir"]

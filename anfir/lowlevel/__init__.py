"""The low-level buffer IR (Glow's instruction level): see docs/lowlevel.md.

``lower`` → ``share_buffers`` → ``plan_memory``, each a pipeline phase with a
numbered ``.lir`` dump (:data:`PHASES`, appended after ``validate`` by
``anfir.compile(..., lower=True)`` and ``anfir compile --lower``);
:func:`lower` is ``anfir.lower``; :func:`load_lir_file` reads a dump back;
:class:`~anfir.lowlevel.executor.Executor` runs one on a preallocated arena.
"""

from __future__ import annotations

from pathlib import Path

from anfir.errors import UsageError
from anfir.ir.graph import FuncGraph
from anfir.lowlevel.executor import Executor, run_low
from anfir.lowlevel.loader import LirError, load_lir_file, load_lir_text
from anfir.lowlevel.lower import LoweringError, lower_graph
from anfir.lowlevel.plan import plan_memory
from anfir.lowlevel.printer import print_program
from anfir.lowlevel.program import LowProgram, figures, live_bytes
from anfir.lowlevel.share import share_buffers
from anfir.passes.compile_state import Phase, Program, write_text


def _low(program: Program) -> LowProgram:
    low = program.artifacts.get("lowlevel")
    if not isinstance(low, LowProgram):
        raise UsageError("the low-level phases run in order: lower first")
    return low


def lower_phase(program: Program) -> Program:
    """``lower``: the optimized entry as instructions, every value its own buffer."""
    if program.entry is None:
        raise UsageError("lowering needs the compiled entry graph")
    program.artifacts["lowlevel"] = lower_graph(program.entry)
    return program


def share_phase(program: Program) -> Program:
    """``share_buffers``: deallocs after last use, in place, dead buffers reused."""
    program.artifacts["lowlevel"] = share_buffers(_low(program))
    return program


def plan_phase(program: Program) -> Program:
    """``plan_memory``: every buffer at an offset of one arena."""
    program.artifacts["lowlevel"] = plan_memory(_low(program))
    return program


def write_lir(program: Program, folder: Path, stem: str) -> list[str]:
    """A low-level phase's dump: ``folder/stem.lir``."""
    low = _low(program)
    low.phase = stem
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.lir"
    write_text(path, print_program(low))
    return [str(path)]



PHASES: list[Phase] = [
    Phase("lower", lower_phase, "instructions over explicit buffers, every value its own", dump=write_lir),
    Phase("share_buffers", share_phase, "dealloc after last use, in place, reuse dead buffers",
          dump=write_lir),
    Phase("plan_memory", plan_phase, "offsets in one arena (the best of several strategies)",
          dump=write_lir),
]
"""The low-level phases, appended after ``validate``."""


def lower(graph: FuncGraph) -> LowProgram:
    """The optimized ``graph`` lowered, its buffers shared and planned (all three phases)."""
    low = plan_memory(share_buffers(lower_graph(graph)))
    low.phase = "plan_memory"
    return low


__all__ = ["Executor", "LirError", "LowProgram", "LoweringError", "PHASES", "figures", "live_bytes", "load_lir_file",
           "load_lir_text", "lower", "lower_graph", "plan_memory", "print_program", "run_low",
           "share_buffers", "write_lir"]

"""The compile pipeline: an ordered, visible list of phases, with numbered dumps.

:data:`PHASES` is the whole compiler::

    parse → resolve → specialize → [loops] → ad → inline → optimize → validate

Each phase is one function ``run(program) -> program`` (one module per phase
under ``anfir/passes``; the parse, resolve and specialize adapters below wrap
the parser, resolver and specializer).  A :class:`Program` carries everything
that flows between phases.  :func:`compile_program` runs the phases in order,
times each one, and — given a ``dump_dir`` — writes ``NN_phase.ir`` and
``NN_phase.dot`` after each, numbered in the order the phases ran.  A phase
with :attr:`Phase.shown` (``loops``) is dumped, numbered and timed only when it
changed the program and the finer dumps are asked for (``fine_dumps``):
``03_loops.ir`` then shows a counted loop rewritten into ``fori_loop`` and the
phases after it number one higher (``04_ad.ir``); otherwise every program keeps
``03_ad.ir``.

Extending the pipeline
----------------------
Write a module under ``anfir/passes`` with ``def run(program: Program) ->
Program`` that edits the graphs through ``program.require_manager()``
(``Manager.replace``, ``CNode.set_input``, ``graph.output = ...``), keeps
every node typed (copy ``.abstract`` or use ``specialize.infer_call``), and
marks the locations of the nodes it makes (``loc.derive("mypass")``).  Then
add it where it belongs::

    from anfir.passes import pipeline, mypass

    phases = list(pipeline.PHASES)
    phases.insert(-1, pipeline.Phase("mypass", mypass.run, "what it does"))
    result = pipeline.compile_program("prog.anf", phases=phases, dump_dir="dumps")

(or edit :data:`PHASES` itself for a permanent phase).  It gets its numbered
dump and its timing for free; ``validate`` still runs last and checks it.
A new rewrite rule does not need a phase: see
:data:`anfir.passes.optimize.DEFAULT_RULES` (the rules are listed there, in order).
"""

from __future__ import annotations

import os
import re
import sys
import time as _time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence, Union

from anfir.dtypes import TYPE_NAMES
from anfir.errors import AnfirError, UsageError
from anfir.gcpause import gc_paused
from anfir.ir.clone import Cloner
from anfir.ir.graph import FuncGraph, Module
from anfir.ir.manager import Manager
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.abstract.values import AbstractValue
from anfir.grammar.parser import parse_file
from anfir.grammar.resolve import resolve_module
from anfir.loading import load_file
from anfir.passes.specialize import abstract_from_annotation_text, abstract_of_value, specialize
from anfir.autodiff.api import in_program_form
from anfir.passes import ad, inline, loops, optimize, validate
from anfir.passes.vmap import expand_batching
# The phase state lives in its own module so that passes import it without importing
# this list of every pass; its names stay importable from here (the pipeline's API).
from anfir.passes.compile_state import Phase, Program, sanitize_file_part, write_dumps, write_text

Source = Union[Module, FuncGraph, str, "os.PathLike[str]"]


@dataclass
class CompileResult:
    """What :func:`compile_program` returns."""

    graph: FuncGraph
    """The optimized entry graph (``anfir.run(result.graph, *args)``)."""
    timings: dict[str, float]
    """Phase name → seconds spent in it (dumps excluded)."""
    rule_counts: dict[str, int]
    """Rewrite rule name → times it fired (plus ``inline`` and ``dead_graph_elimination``)."""
    dump_files: list[str]
    """The files written, in order (empty without a dump directory)."""
    program: Program
    """The final program state (module copy, manager, argument types)."""


# -- the adapters of the phases written elsewhere -------------------------------------
def parse_phase(program: Program) -> Program:
    """Read the source into the program's own Module (a path is parsed with
    ``resolve=False``; a Module or FuncGraph is copied, never mutated)."""
    source = program.source
    if isinstance(source, Module):
        program.entry_name = _entry_name(source, program.entry_name)
        program.module = clone_module(source)
    elif isinstance(source, FuncGraph):
        # anfir.grad of a program that differentiates inside: compiled as the same
        # gradient written as a grad call (see in_program_form).
        rewritten = in_program_form(source)
        program.module = clone_entry_graph(rewritten if rewritten is not None else source)
        if program.entry_name is not None and program.entry_name != source.name:
            raise UsageError(f"entry {program.entry_name!r} given with the graph @{source.name}")
        program.entry_name = next(iter(program.module.graphs))
    elif isinstance(source, (str, os.PathLike)):
        program.module = _read_file(Path(source))
        program.entry_name = _entry_name(program.module, program.entry_name)
    else:
        raise UsageError(f"cannot compile a {type(source).__name__}: give a Module, a FuncGraph "
                         "or the path of a .anf / .ir file")
    # The dumps of the whole module name the entry being compiled (``# IR entry``),
    # so a dump loaded back runs that definition by default.
    program.module.default_entry = program.entry_name
    return program


def _entry_name(module: Module, entry: Optional[str]) -> str:
    # A loaded ``.ir`` dump names its entry (``# IR entry: @f``): its default_entry.
    return module.entry_name(entry)


def _read_file(path: Path) -> Module:
    if not path.is_file():
        raise UsageError(f"no such file: {path}")
    if path.suffix == ".ir":

        return load_file(str(path))

    return parse_file(str(path), resolve=False)


def resolve_phase(program: Program) -> Program:
    """Resolve global names (``Symbol`` constants) to graphs and primitives."""

    assert program.module is not None
    resolved = resolve_module(program.module)
    if isinstance(resolved, Module):
        program.module = resolved
    assert program.entry_name is not None
    program.entry = program.module[program.entry_name]
    return program


def specialize_phase(program: Program) -> Program:
    """Type every node for the argument types (per-signature clones of the graphs)."""

    assert program.entry is not None
    expand_batching(program.entry)  # vmap, jacobians of known functions: ordinary graphs to type
    program.arg_abstracts = argument_abstracts(program.args)
    entry = program.entry = specialize(program.entry, program.arg_abstracts)
    # A manager of the specialized program only: reuse the specializer's when
    # it tracks just that, else rebuild one (never adopt unspecialized graphs).
    manager = entry.manager
    if manager is None or list(manager.roots) != [entry]:
        manager = validate.rebuild_manager([entry])
    program.manager = manager
    program.specialized = True
    return program


def argument_abstracts(args: Optional[Sequence[Any]]) -> Optional[list]:
    """Abstract values for ``args``: example values are abstracted, abstract
    values kept, annotation strings (``"f64[2, 3]"``) parsed; None stays None
    (the specializer then reads the entry's annotations)."""
    if args is None:
        return None

    result = []
    for arg in args:
        if isinstance(arg, AbstractValue):
            result.append(arg)
        elif isinstance(arg, str) and _looks_like_type(arg):
            try:
                result.append(_abstract_of_annotation(arg))
            except AnfirError:  # not a type after all: an example string
                result.append(abstract_of_value(arg))
        else:
            result.append(abstract_of_value(arg))
    return result


_TYPE_TEXT = re.compile(r"\s*(\(|(" + "|".join(map(re.escape, TYPE_NAMES)) + r")\b)")
"""The start of a type: ``(`` or a type name of the dtype table."""


def _looks_like_type(text: str) -> bool:
    # A str argument is an annotation when it starts like one, else an example string.
    return bool(_TYPE_TEXT.match(text))


def _abstract_of_annotation(text: str) -> Any:

    return abstract_from_annotation_text(text)


PHASES: list[Phase] = [
    Phase("parse", parse_phase, "read the text (or copy the given Module) into graphs"),
    Phase("resolve", resolve_phase, "names -> graphs, primitives and meta functions"),
    Phase("specialize", specialize_phase, "types for every node, one graph per signature"),
    Phase("loops", ad.rewrite_counted_loops, "differentiated counted tail-recursive loops -> "
          "fori_loop (dumped with fine_dumps, when one was rewritten)", shown=loops.rewrote_counted_loops),
    Phase("ad", ad.run, "expand grad / value_and_grad with the J transform"),
    Phase("inline", inline.run, "inline graphs called once, or small and non-recursive"),
    Phase("optimize", optimize.run, "rewrite rules to a fixed point (folding, CSE, ...)"),
    Phase("validate", validate.run, "check the invariants of the compiled program"),
]
"""The compiler, in order.  Copy and edit the list to add a phase (see the module doc)."""


# -- copying the user's program ---------------------------------------------------------
def clone_module(module: Module) -> Module:
    """A deep copy of ``module``: graphs, nodes and constants are new objects,
    so no later phase can touch the user's module."""
    imported: dict[str, FuncGraph] = dict(getattr(module, "imported", {}) or {})
    graphs = list(dict.fromkeys([*module.graphs.values(), *imported.values()]))
    copy = Module({}, module.filename)
    if graphs:
        cloner = _clone_graphs(graphs)
        copy.graphs = {name: cloner.graph_map[g] for name, g in module.graphs.items()}
        imported = {name: cloner.graph_map[g] for name, g in imported.items()}
    # The parser's record of imports (definitions of other files, not in ``graphs``).
    copy.imports = list(module.imports)
    copy.imported = imported
    copy.metadata = dict(module.metadata)  # the dumps' header shows it
    return copy


def clone_entry_graph(graph: FuncGraph) -> Module:
    """A Module holding a deep copy of ``graph`` (and the graphs it uses)."""
    manager, borrowed = _manager_of([graph])
    closure = bool(manager.free_variables_total(graph))
    for g in borrowed:
        g.manager = None
    if closure:
        raise UsageError(f"@{graph.name} is a closure over values of an enclosing graph; "
                         "compile the enclosing graph instead", graph.loc)
    cloner = _clone_graphs([graph])
    filename = graph.loc.file if graph.loc is not None else "<graph>"
    return Module({graph.name: cloner.graph_map[graph]}, filename)


def _manager_of(graphs: list[FuncGraph],
                reachable: Optional[list[FuncGraph]] = None) -> tuple[Manager, list[FuncGraph]]:
    """A manager tracking ``graphs`` (theirs if they share one) and the graphs
    that had none: the caller hands those back (``g.manager = None``)."""
    managers = {g.manager for g in graphs}
    if len(managers) == 1:
        (manager,) = managers
        if manager is not None and all(g in manager.graphs for g in graphs):
            return manager, []  # reuse it: nothing of the user's changes
    if reachable is None:
        reachable = validate.graphs_reachable(graphs)
    unmanaged = [g for g in reachable if g.manager is None]
    return Manager(graphs), unmanaged


def _clone_graphs(graphs: list[FuncGraph]) -> Cloner:
    everything = validate.graphs_reachable(graphs)
    manager, borrowed = _manager_of(graphs, everything)
    cloner = Cloner(manager, everything)
    # The cloner shares constants between original and copy; give the copy its
    # own ValueNodes so typing the copy never writes into the user's nodes.
    fresh: dict[ValueNode, ValueNode] = {}

    def own(node: Node) -> Node:
        if not isinstance(node, ValueNode) or isinstance(node.value, FuncGraph):
            return node
        copy = fresh.get(node)
        if copy is None:
            copy = fresh[node] = ValueNode(node.value, node.loc, node.name)
            copy.abstract = node.abstract
            copy.annotation = node.annotation
        return copy

    for original, copy in list(cloner.node_map.items()):
        if isinstance(copy, CNode) and copy is not original:
            # (the copy is not managed yet: a plain edit, one per node however wide)
            copy.set_inputs([own(inp) for inp in copy.inputs])
    for g, new in cloner.graph_map.items():
        if new.has_output and isinstance(new.output, ValueNode):
            new.output = own(new.output)
    for g in borrowed:
        g.manager = None  # leave the user's graphs as they were
    return cloner


# -- the driver ----------------------------------------------------------------------------
def compile_program(source: Source, entry: Optional[str] = None, args: Optional[Sequence[Any]] = None,
                    dump_dir: Optional[Union[str, "os.PathLike[str]"]] = None, *, time: bool = False,
                    fine_dumps: bool = False, phases: Optional[Sequence[Phase]] = None) -> CompileResult:
    """Run the pipeline on ``source`` and return the optimized entry graph.

    ``source`` is a Module, a FuncGraph or the path of a ``.anf``/``.ir`` file;
    ``entry`` names the definition to compile (default ``main``, else the only
    one); ``args`` are example values, abstract values or annotation strings
    for the entry's parameters (None: its annotations).  With ``dump_dir``,
    each phase writes ``NN_phase.ir`` and ``NN_phase.dot`` there (and, with
    ``fine_dumps``, the optimizer one ``.ir`` per round under ``optimize/``).
    ``time=True`` prints the phase timings to stderr.  ``phases`` replaces
    :data:`PHASES`.
    """
    if entry is not None and not isinstance(entry, str):
        raise UsageError(f"entry is the name of a definition (a str), not {type(entry).__name__}")
    if args is not None and not isinstance(args, (list, tuple)):
        raise UsageError(f"args is a list of example arguments (one per parameter of the entry), "
                         f"not {type(args).__name__}; write args=[{_short_repr(args)}]")
    folder = None
    if dump_dir is not None:
        if not isinstance(dump_dir, (str, os.PathLike)):
            raise UsageError(f"dump_dir is a directory name, not {type(dump_dir).__name__}")
        folder = Path(dump_dir)
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"cannot use {str(folder)!r} as the dump directory: it exists and "
                             "is not a directory")
    program = Program(source=source, entry_name=entry, args=list(args) if args is not None else None,
                      dump_dir=folder, fine_dumps=fine_dumps)
    # The cyclic garbage collector's full passes grow with the live heap, which
    # a compile fills with (cyclic) nodes: left on, it makes compile time
    # superlinear in the program's size.  Nothing here needs it mid-compile.
    with gc_paused():
        program, timings = _run_phases(program, PHASES if phases is None else phases)
    if program.entry is None or not program.specialized:
        raise UsageError("the pipeline ended without a specialized entry graph "
                         "(a phase list needs parse, resolve and specialize)")
    if time:
        _print_timings(timings, sys.stderr)
    return CompileResult(program.entry, timings, dict(sorted(program.stats.items())),
                         list(program.dump_files), program)


def _short_repr(value: Any) -> str:
    text = repr(value) if isinstance(value, (int, float, bool, str)) else "..."
    return text if len(text) <= 30 else "..."


def _run_phases(program: Program, phases: Sequence[Phase]) -> tuple[Program, dict[str, float]]:
    timings: dict[str, float] = {}
    number = 0
    for phase in phases:
        start = _time.perf_counter()
        result = phase.run(program)
        if not isinstance(result, Program):
            raise UsageError(f"phase {phase.name!r} returned {type(result).__name__}, not a Program")
        program = result
        if phase.shown is not None and not phase.shown(program):
            continue  # a phase that changed nothing: no dump, no number, no row (Phase.shown)
        timings[phase.name] = timings.get(phase.name, 0.0) + _time.perf_counter() - start
        stem = f"{number:02d}_{sanitize_file_part(phase.name)}"
        number += 1
        program.last_phase = stem
        if program.dump_dir is not None:
            writer = phase.dump if phase.dump is not None else write_dumps
            program.dump_files.extend(writer(program, program.dump_dir, stem))
    return program, timings


def _print_timings(timings: dict[str, float], stream: Any) -> None:
    total = sum(timings.values())
    for name, seconds in timings.items():
        stream.write(f"{name:>12}  {seconds * 1000:9.2f} ms\n")
    stream.write(f"{'total':>12}  {total * 1000:9.2f} ms\n")


__all__ = ["CompileResult", "PHASES", "Phase", "Program", "argument_abstracts", "clone_module",
           "compile_program", "sanitize_file_part", "write_dumps", "write_text", "AnfirError"]

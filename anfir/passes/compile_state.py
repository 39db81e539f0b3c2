"""The state that flows between compile phases: :class:`Program`, :class:`Phase`, the dumps.

Every pass takes and returns a :class:`Program`; :mod:`anfir.passes.pipeline`
lists the phases and runs them.  This module imports no pass, so a pass can
import :class:`Program` at module level without the loop pass -> pipeline ->
every pass (issue 23).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from anfir.errors import UsageError
from anfir.ir.graph import FuncGraph, Module
from anfir.ir.manager import Manager
from anfir.printers.dot import dump_dot
from anfir.printers.ir import dump_ir, side_file_path, write_side_file


@dataclass
class Program:
    """What flows from phase to phase."""

    source: Any
    """What the user passed: a Module, a FuncGraph or a path (never mutated)."""
    entry_name: Optional[str] = None
    """The entry definition asked for (None: ``main``, else the only one)."""
    args: Optional[Sequence[Any]] = None
    """Example values, abstract values or annotation strings (None: annotations)."""
    module: Optional[Module] = None
    """The program's own copy of the module (set by ``parse``)."""
    entry: Optional[FuncGraph] = None
    """The entry graph: the module's after ``resolve``, the specialized one after ``specialize``."""
    arg_abstracts: Optional[list] = None
    """The abstract values the entry was specialized for."""
    manager: Optional[Manager] = None
    """Tracks the specialized program (rooted at ``entry``) from ``specialize`` on."""
    stats: Counter = field(default_factory=Counter)
    """Counters: rule name → times fired, ``inline`` → calls inlined..."""
    specialized: bool = False
    """Whether ``entry`` is the typed, specialized graph."""
    dump_dir: Optional[Path] = None
    """Where the numbered dumps go (None: no dumps)."""
    fine_dumps: bool = False
    """Whether phases write finer dumps (one per optimizer round) in a sub-folder."""
    last_phase: str = ""
    """The numbered name of the phase that ran last (``04_inline``), for messages."""
    dump_files: list[str] = field(default_factory=list)
    """Every file written so far, in order."""
    artifacts: dict[str, Any] = field(default_factory=dict)
    """What phases beyond the graph IR made, by name (a back end's lowered
    program: ``"jax"``, ``"stablehlo"``)."""

    def require_manager(self) -> Manager:
        """The manager of the specialized program (created on first use)."""
        if self.manager is None:
            if self.entry is None:
                raise UsageError("this phase needs the entry graph: run parse and resolve first")
            self.manager = Manager([self.entry])
        return self.manager

    def dump_object(self) -> Union[Module, FuncGraph, None]:
        """What a dump shows: the whole module before specialization, the entry after."""
        if self.specialized and self.entry is not None:
            return self.entry
        return self.module if self.module is not None else self.entry

    def round_dumper(self, phase: str) -> Optional[Callable[[int], None]]:
        """With ``fine_dumps``: a callback writing ``dump_dir/phase/NN_round.ir``."""
        if not (self.fine_dumps and self.dump_dir is not None):
            return None
        folder = self.dump_dir / sanitize_file_part(phase)

        def dump_round(number: int) -> None:
            stem = f"{number:02d}_round"
            self.dump_files.extend(write_dumps(self, folder, stem, dot=False))

        return dump_round


@dataclass(frozen=True)
class Phase:
    """One step of the pipeline."""

    name: str
    """The name used for the dump files (``NN_name.ir``) and timings."""
    run: Callable[[Program], Program]
    """The phase's entry function."""
    doc: str = ""
    """One line saying what the phase does."""
    dump: Optional[Callable[[Program, Path, str], list[str]]] = None
    """Writes the phase's numbered dump, ``dump(program, folder, stem)`` returning
    the paths written (None: the graphs as ``stem.ir`` and ``stem.dot``, see
    :func:`write_dumps`).  A back end's phase writes what it lowered to
    (``07_stablehlo.mlir``)."""
    shown: Optional[Callable[[Program], bool]] = None
    """For a phase that usually changes nothing (``loops``): asked after the phase
    ran, False means the phase leaves no trace — no dump, no number (the next
    phase takes it), no timing row — so ordinary programs keep their dump names.
    None (the default): the phase is always dumped, numbered and timed."""


# -- dumps -------------------------------------------------------------------------------
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def sanitize_file_part(text: str) -> str:
    """``text`` made safe as part of a file name (no separators, no dots first)."""
    cleaned = _UNSAFE.sub("_", text).strip("._")
    return cleaned or "phase"


def write_dumps(program: Program, folder: Path, stem: str, dot: bool = True) -> list[str]:
    """Write ``folder/stem.ir`` (plus ``stem.npz`` for large tensors) and
    ``stem.dot`` for the program's current state; return the paths written."""

    obj = program.dump_object()
    if obj is None:
        return []
    try:
        return _write_dumps(program, obj, folder, stem, dot)
    except OSError as error:
        where = error.filename or folder
        raise UsageError(f"cannot use {where} for the dumps: {error.strerror or error}") from None


def _write_dumps(program: Program, obj: Any, folder: Path, stem: str, dot: bool) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    ir_path = folder / f"{stem}.ir"
    side: dict[str, Any] = {}
    write_text(ir_path, dump_ir(obj, phase=stem, side=side))
    written.append(str(ir_path))
    npz_path = side_file_path(ir_path)
    if side:
        write_side_file(npz_path, side)
        written.append(str(npz_path))
    elif npz_path.exists():
        npz_path.unlink()  # left by an earlier run: it would mislead a reader
    if dot:

        dot_path = folder / f"{stem}.dot"
        write_text(dot_path, dump_dot(obj))
        written.append(str(dot_path))
    return written


def write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` as UTF-8 with ``\\n`` line ends and a final newline
    (every dump is written so: byte-identical from run to run and across systems)."""
    if not text.endswith("\n"):
        text += "\n"
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(text)

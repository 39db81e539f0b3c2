"""``anfir.load``: read a program from a file, whatever it holds.

* ``*.ir`` — a dump written by ``dump_ir`` (any phase); its ``.npz`` side
  file, if any, is read too.  The Module has ``phase`` (``"05_optimize"``) and
  ``ir_entry`` (the graph the dump names as its entry) attributes.
* ``*.lir`` — a low-level program (docs/lowlevel.md), loaded by the
  low-level loader through :data:`anfir.ir.upcalls.UPCALLS` (it sits above);
* anything else — ANF source text, parsed (with its imports) by
  :func:`anfir.grammar.parser.parse_file`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Union

from anfir.errors import UsageError
from anfir.ir.upcalls import UPCALLS
from anfir.grammar.ir_loader import load_ir_file
from anfir.grammar.parser import parse_file


def load_file(path: Union[str, Path]) -> Any:
    """The Module stored in ``path`` (a ``.ir`` dump or ANF source), or the
    low-level program of a ``.lir`` dump."""
    if not isinstance(path, (str, Path)):
        raise UsageError(f"anfir.load takes the path of a file (a str), not {type(path).__name__}"
                         + ("; use anfir.parse for program text" if isinstance(path, bytes) else ""))
    if "\0" in str(path):
        raise UsageError(f"cannot read {str(path)!r}: a path cannot contain a NUL character")
    if Path(path).suffix.lower() == ".lir":
        return UPCALLS.load_lir(path)
    if Path(path).suffix.lower() == ".ir":

        return load_ir_file(path)

    return parse_file(str(path))


__all__ = ["load_file"]

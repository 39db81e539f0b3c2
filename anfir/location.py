"""Source locations: where in the user's text a node (or an error) comes from."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional


@dataclass(frozen=True)
class Location:
    """A point in a source file, with the text of its line for excerpts.

    ``line_text`` is a reference to the already split line of the source (no
    copy per node).  ``note`` says which transformation made a node from the
    node at this location (``"ad: ◂f"``), so dumps can map generated nodes back
    to the user's code.
    """

    file: str
    """The file name as the user gave it (``<string>`` for text)."""
    line: int
    """1-based line number."""
    col: int
    """1-based column number."""
    line_text: str = ""
    """The whole source line, without its newline."""
    note: str = ""
    """Which transformation derived the node from this place, if any."""

    def excerpt(self) -> str:
        """The source line and a caret under the column (empty if no text is known)."""
        if not self.line_text:
            return ""
        # Control characters (from binary input) would garble the terminal.
        text = "".join(c if c.isprintable() else "\ufffd"
                       for c in self.line_text.expandtabs(1).rstrip("\r"))
        shown = text if len(text) <= 200 else text[: max(self.col + 40, 200)]
        return f"    {shown}\n    {' ' * max(self.col - 1, 0)}^"

    def derive(self, note: str) -> "Location":
        """The same place, marked as the origin of a node made by ``note``."""
        if self.note:
            note = f"{note} < {self.note}"
        return replace(self, note=note)

    def short(self) -> str:
        """``file:line:col``."""
        return f"{self.file}:{self.line}:{self.col}"

    def __str__(self) -> str:
        return self.short()


def location_from_offset(file: str, text: str, lines: list[str], offset: int) -> Location:
    """The Location of a character offset in ``text`` (whose lines are ``lines``)."""
    line = text.count("\n", 0, offset) + 1
    start = text.rfind("\n", 0, offset) + 1
    col = offset - start + 1
    line_text = lines[line - 1] if 0 < line <= len(lines) else ""
    return Location(file, line, col, line_text)


UNKNOWN: Optional[Location] = None

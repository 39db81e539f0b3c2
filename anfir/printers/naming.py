"""Names for printers: legal ANF identifiers and unique, deterministic spellings.

Graph and node names come from the parser (``fibonacci``, ``✓fibonacci``,
``lambda``) and from transformations (``▸f``, ``◂f``).  The ANF text needs
identifiers of ``[A-Za-z_][A-Za-z0-9_]*`` (optionally ``%``-prefixed); the
``.ir`` dump is more permissive but still needs unique graph names.  Both
allocate names in a fixed order, so the same program always prints the same.
"""

from __future__ import annotations

import re
from typing import Iterable, Optional

from anfir.grammar.syntax import KEYWORDS  # the words the ANF lexer reserves (re-exported)

_ANF_NAME = re.compile(r"%?[A-Za-z_][A-Za-z0-9_]*\Z|%[A-Za-z0-9_]+\Z")

# MindIR's marks on generated graphs, spelled so a reader still recognises them.
_MARKS = {"✓": "ok_", "✗": "no_", "▸": "fwd_", "◂": "bwd_", "∇": "grad_", ".": "_", "-": "_",
          " ": "_"}


def is_anf_name(text: str) -> bool:
    """Whether ``text`` is an identifier the ANF lexer accepts (and not a keyword)."""
    return bool(_ANF_NAME.match(text)) and text not in KEYWORDS


def anf_name(raw: Optional[str], fallback: str = "v") -> str:
    """A legal ANF identifier close to ``raw`` (``✓f`` -> ``ok_f``, ``lambda`` -> ``lambda_``)."""
    if not raw:
        return fallback
    if is_anf_name(raw):
        return raw
    prefix = "%" if raw.startswith("%") else ""
    body = raw[1:] if prefix else raw
    out = []
    for ch in body:
        if ch.isascii() and (ch.isalnum() or ch == "_"):
            out.append(ch)
        elif ch in _MARKS:
            out.append(_MARKS[ch])
        else:
            out.append(f"u{ord(ch):x}_")
    text = "".join(out) or fallback
    if not prefix and text[0].isdigit():
        text = "_" + text
    text = prefix + text
    if text in KEYWORDS:
        text += "_"
    return text


class NameAllocator:
    """Hands out unique names: the preferred one if free, else ``base_1``, ``base_2``...

    ``taken`` are names that must never be handed out (keywords, globals);
    ``preferred`` are names some later request will ask for, so fresh names
    (``%1``, ``%2``...) avoid them and a user's ``%2`` keeps its spelling.
    """

    def __init__(self, taken: Iterable[str] = (), preferred: Iterable[str] = (),
                 separator: str = "_") -> None:
        self.used: set[str] = set(taken)
        self.preferred: set[str] = set(preferred)
        self.separator = separator
        self._fresh = 0
        self._suffix: dict[str, int] = {}

    def take(self, name: str) -> str:
        """``name`` if it is free, else the first free ``name<sep>k``."""
        if name not in self.used:
            self.used.add(name)
            return name
        k = self._suffix.get(name, 0)
        while True:
            k += 1
            candidate = f"{name}{self.separator}{k}"
            if candidate not in self.used and candidate not in self.preferred:
                self._suffix[name] = k
                self.used.add(candidate)
                return candidate

    def fresh(self, prefix: str = "%") -> str:
        """A new ``%k`` name that no one has or will ask for."""
        while True:
            self._fresh += 1
            candidate = f"{prefix}{self._fresh}"
            if candidate not in self.used and candidate not in self.preferred:
                self.used.add(candidate)
                return candidate

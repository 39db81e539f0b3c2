"""Metadata of modules, definitions and nodes: doc strings and ``key: value`` attributes.

Where it lives (nothing else reads it: it never changes what a program computes):

* a module's: :attr:`Module.metadata <anfir.ir.graph.Module.metadata>`;
* a definition's (a ``def`` or a let-bound ``lambda``): its doc string in
  ``graph.flags["doc"]``, its other attributes in ``graph.flags["meta"]`` (a
  dict; flags are copied when a graph is cloned, so they follow it through
  the passes);
* a node's: ``graph.node_meta[cnode]`` (a dict, the doc string under
  ``"doc"``); the node's copies (:class:`anfir.ir.clone.Cloner`: specialized,
  inlined, differentiated) keep it, a node the optimizer rewrites does not.

Values are JSON values (strings, numbers, booleans, None, lists, dicts with
string keys): that is how both text forms write them (``#@ key value`` lines
in ANF text, ``# Meta key: value`` and ``meta`` lines in ``.ir`` dumps; see
docs/language.md, "Doc comments and attributes").  This module holds the
spelling both printers and both parsers share.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Optional

DOC = "doc"
"""The key of a doc string among a node's or a module's attributes."""

KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*\Z")
"""An attribute key written bare (others are written as a JSON string)."""


class MetadataSyntaxError(ValueError):
    """A malformed attribute value; ``offset`` is where in the text it went wrong."""

    def __init__(self, message: str, offset: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.offset = offset


def json_text(value: Any) -> str:
    """``value`` as one line of JSON (tuples as lists).

    A value JSON cannot hold (a NaN, an object of another type, a dict with keys
    that are not strings) is written as the JSON string of its ``str``: the text
    stays readable and parses back, as that string.
    """
    try:
        return json.dumps(_plain(value), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        return json.dumps(str(value), ensure_ascii=False)
    except (ValueError, RecursionError):  # an int too long for str(), a self-containing list
        return json.dumps(f"<{type(value).__name__}>")


def json_object_text(attrs: dict[Any, Any]) -> str:
    """``attrs`` as one JSON object (keys as strings, each value as :func:`json_text`)."""
    items = (f"{json.dumps(str(k), ensure_ascii=False)}: {json_text(v)}" for k, v in attrs.items())
    return "{" + ", ".join(items) + "}"


def _plain(value: Any) -> Any:
    """``value`` with numpy scalars made Python numbers (json.dumps knows no others)."""
    item = getattr(value, "item", None)
    if item is not None and getattr(value, "shape", None) == ():
        return item()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("not a JSON number")
    return value


def key_text(key: Any) -> str:
    """An attribute key as written: bare when it is a name (dots allowed), else a JSON string."""
    text = str(key)
    return text if KEY.match(text) else json.dumps(text, ensure_ascii=False)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise MetadataSyntaxError(f"the key {key!r} appears twice in one object")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise MetadataSyntaxError(f"{name} is not a JSON value (numbers are finite)")


def parse_json(text: str) -> Any:
    """The JSON value ``text`` holds (all of it); :class:`MetadataSyntaxError` if none.

    Strict: no NaN or Infinity, no key twice in an object, nothing after the
    value; nesting deeper than Python's JSON reader takes is an error too.
    """
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except MetadataSyntaxError:
        raise
    except json.JSONDecodeError as error:
        raise MetadataSyntaxError(f"not a JSON value: {error.msg}", error.pos) from None
    except RecursionError:
        raise MetadataSyntaxError("not a JSON value: nested too deeply") from None
    except ValueError as error:  # e.g. an integer of more digits than Python converts
        raise MetadataSyntaxError(f"not a JSON value: {error}") from None


def split_attribute(text: str, sep: str = "") -> tuple[str, int, str, int]:
    """``key value`` (the text after ``#@``) -> (key, its offset, value text, its offset).

    The key is a name (``[A-Za-z_][A-Za-z0-9_.]*``) or a JSON string; blanks
    separate it from the value, or ``sep`` (``:`` in a dump's ``# Meta key: value``
    header line, ``=`` in its ``meta key = value`` lines) with optional blanks.
    """
    start = len(text) - len(text.lstrip(" \t"))
    if start == len(text):
        raise MetadataSyntaxError("the attribute's key is missing", start)
    if text[start] == '"':
        decoder = json.JSONDecoder()
        try:
            key, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError as error:
            raise MetadataSyntaxError(f"the key is not a JSON string: {error.msg}", error.pos) from None
    else:
        match = re.compile(r"[A-Za-z0-9_.]*").match(text, start)
        assert match is not None
        key, end = match.group(), match.end()
        if not KEY.match(key) or (not sep and end < len(text) and text[end] not in " \t"):
            raise MetadataSyntaxError(
                f"{text[start:].split()[0]!r} is not an attribute key (a name such as "
                "producer_name or onnx.domain, or a JSON string)", start)
    rest = text[end:]
    value_start = end + len(rest) - len(rest.lstrip(" \t"))
    if sep:
        if text[value_start:value_start + 1] != sep:
            raise MetadataSyntaxError(f"expected {sep!r} after the key {key!r}", value_start)
        rest = text[value_start + 1:]
        value_start = value_start + 1 + len(rest) - len(rest.lstrip(" \t"))
    elif value_start == end:
        value_start = len(text)
    value = text[value_start:].rstrip(" \t\r")
    if not value:
        raise MetadataSyntaxError(f"the attribute {key!r} has no value (a JSON value: \"text\", "
                                  "1, true, null, [..], {..})", min(value_start, len(text)))
    return key, start, value, value_start


def plain_doc(doc: str) -> bool:
    """Whether ``doc`` prints as ``##`` lines (each line printable, tabs allowed) and
    reads back the same; other doc strings are written as ``#@ doc "..."``."""
    return all(line.replace("\t", "").isprintable() for line in doc.split("\n"))


def doc_lines(doc: str) -> list[str]:
    """The ``##`` lines of a plain doc string (an empty line is a bare ``##``)."""
    return [f"## {line}" if line else "##" for line in doc.split("\n")]


def block_lines(doc: Optional[str], attrs: dict[str, Any]) -> list[str]:
    """The lines written before a definition or a ``let`` (or at the top of a module):
    the doc string, then one ``#@ key value`` line per attribute, in order."""
    lines: list[str] = []
    if isinstance(doc, str):
        if plain_doc(doc):
            lines.extend(doc_lines(doc))
        else:
            lines.append(f"#@ {DOC} {json_text(doc)}")
    for key, value in attrs.items():
        if key == DOC:
            continue
        lines.append(f"#@ {key_text(key)} {json_text(value)}")
    return lines


def is_note_line(stripped: str) -> bool:
    """Whether a line (leading blanks removed) is a doc (``##``) or attribute (``#@``) line.

    ``###`` and longer runs of ``#`` are ordinary comments (banners)."""
    return stripped.startswith("#@") or (stripped.startswith("##") and not stripped.startswith("###"))


__all__ = ["DOC", "KEY", "MetadataSyntaxError", "block_lines", "doc_lines", "is_note_line",
           "json_object_text", "json_text", "key_text", "parse_json", "plain_doc", "split_attribute"]

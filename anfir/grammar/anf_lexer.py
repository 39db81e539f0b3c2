"""The ANF lexer: text -> a list of ``(type, text, line, col)`` token tuples.

One compiled regular expression splits each source line (``findall``) into
(blanks, token) pairs, so blanks cost no separate match; keywords and
operators are then found by a dict lookup on the text, other tokens by their
first character (the fixed tokens are
:data:`anfir.grammar.syntax.TERMINALS`).  Lines are scanned one by one, so the
line number is the loop counter and the column a running sum: no newline
bookkeeping per token.
Tokens are plain tuples (the cheapest Python object); :class:`LarkToken`
wraps them for Lark's own parse loop, which needs a ``.type`` attribute.

Errors (a stray character, an unterminated string, a bad escape) are
:class:`~anfir.errors.AnfirSyntaxError` located at the offending character.
"""

from __future__ import annotations

import re
import string
from typing import Any, Iterator, Optional

from lark.lexer import Lexer

from anfir.errors import AnfirSyntaxError
from anfir.grammar.syntax import TERMINALS
from anfir.location import Location

Token = tuple  # (type: str, text: str, line: int, col: int)
"""A token: its terminal name, its text, its 1-based line and column."""


def _symbols_pattern() -> str:
    """A regex alternative for every punctuation/operator token of :data:`TERMINALS`:
    the longer ones first (``**`` before ``*``), then one class of single characters."""
    symbols = sorted((t for t in TERMINALS if not t[0].isalpha()), key=lambda t: (-len(t), t))
    longer = [re.escape(t) for t in symbols if len(t) > 1]
    single = "".join(re.escape(t) for t in symbols if len(t) == 1)
    return " | ".join([*longer, f"[{single}]"])


# One match = optional blanks (group 1) + one token (group 2).  Matches are
# consecutive, so the column is the running sum of their lengths; the only
# text no match covers is trailing blanks.  The last alternative takes any
# other character, so nothing is skipped silently.
_TOKEN_RE = re.compile(r"""
    ([ \t\r\f\v]*)
    (   %[A-Za-z0-9_]+ | [A-Za-z_][A-Za-z0-9_]*              # name or keyword
      | \d+\.\d+(?:[eE][+-]?\d+)? | \d+[eE][+-]?\d+ | \d+      # number
      | """ + _symbols_pattern() + r"""                          # punctuation, operator
      | "(?:[^"\\\n]|\\.)*"                                 # string
      | \#.*                                                 # comment
      | [^ \t\r\f\v]                                        # anything else: an error
    )""", re.VERBOSE)

_FIRST_CHAR = dict.fromkeys(string.ascii_letters + "_", "NAME")
_FIRST_CHAR.update(dict.fromkeys(string.digits, "INT"))
_FIRST_CHAR['"'] = "STRING"
_FIRST_CHAR["#"] = "COMMENT"
_FIXED = TERMINALS  # keywords, punctuation and operators: text -> terminal
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "r": "\r", "0": "\0"}


LONG_LINE = 10_000
"""Lines longer than this are scanned a match at a time (``finditer``) and
handed on in batches, so that no more than a batch of a line's tokens exist
before the parser has checked them (a huge line of junk fails at once)."""
_BATCH = 1000


def tokenize(lines: list[str], filename: str, notes: Optional[set[int]] = None) -> list[Token]:
    """All tokens of ``lines`` (the source split at ``\\n``), comments dropped
    (``notes``: see :func:`token_batches`)."""
    tokens: list[Token] = []
    for batch in token_batches(lines, filename, notes):
        tokens.extend(batch)
    return tokens


def token_batches(lines: list[str], filename: str,
                  notes: Optional[set[int]] = None) -> Iterator[list[Token]]:
    """The tokens of ``lines`` in source order, a list per line (or per part of a long line).

    The parser pulls them as it goes, so bad input is rejected after
    scanning at most one line (or batch) beyond the error.  The numbers of the
    lines that are doc (``##``) or attribute (``#@``) lines are added to
    ``notes`` as they are scanned (the builder attaches them to what follows).
    """
    fixed_get = _FIXED.get
    first_get = _FIRST_CHAR.get
    findall = _TOKEN_RE.findall
    finditer = _TOKEN_RE.finditer
    lineno = 0
    for line in lines:
        lineno += 1
        col = 1
        tokens: list[Token] = []
        append = tokens.append
        matches: Any = findall(line) if len(line) <= LONG_LINE else (
            m.groups() for m in finditer(line))
        for blanks, text in matches:
            col += len(blanks)
            kind = fixed_get(text)
            if kind is None:
                kind = first_get(text[0])
                if kind == "INT":
                    if "." in text or "e" in text or "E" in text:
                        kind = "FLOAT"
                elif kind == "COMMENT":
                    # A comment runs to the end of the line; a whole line of
                    # doc or attribute is noted (is_note_line, spelt out: this
                    # loop is the parser's hot path).
                    if notes is not None and (text[1:2] == "@" or (
                            text[1:2] == "#" and text[2:3] != "#")) and not line[:col - 1].strip():
                        notes.add(lineno)
                    break
                elif kind is None or (kind == "STRING" and len(text) == 1):
                    if text[0] == "%" and len(text) > 1:
                        kind = "NAME"
                    else:
                        _raise_bad_character(text, filename, lineno, col, line)
            if kind == "EQ" and len(tokens) >= 2 and tokens[-1][1].isalpha() \
                    and tokens[-1][0] != "NAME" and tokens[-2][0] in ("LPAR", "COMMA"):
                # A keyword between '(' or ',' and '=' is a keyword argument's name
                # (flatten(x, end=-1)); 'let end = ...' stays an error.
                previous = tokens[-1]
                tokens[-1] = ("NAME", previous[1], previous[2], previous[3])
            append((kind, text, lineno, col))
            col += len(text)
            if len(tokens) >= _BATCH and len(line) > LONG_LINE:
                yield tokens
                tokens = []
                append = tokens.append
        if tokens:
            yield tokens


def string_value(token: Token, filename: str, line_text: str) -> str:
    """The value of a STRING token: quotes removed, escapes ``\\" \\\\ \\n \\t`` decoded."""
    text = token[1]
    body = text[1:-1]
    if "\\" not in body:
        return body
    out = []
    index = 0
    while index < len(body):
        char = body[index]
        if char == "\\":
            code = body[index + 1]
            if code not in _ESCAPES:
                col = token[3] + 1 + index
                raise AnfirSyntaxError(
                    f"unknown escape '\\{code}' in a string", Location(filename, token[2], col, line_text),
                    hint="strings accept \\\" \\\\ \\n \\t \\r and \\0")
            out.append(_ESCAPES[code])
            index += 2
        else:
            out.append(char)
            index += 1
    return "".join(out)


def _raise_bad_character(char: str, filename: str, line: int, col: int, line_text: str) -> None:
    loc = Location(filename, line, col, line_text)
    if char == '"':
        raise AnfirSyntaxError("unterminated string (a string ends with '\"' on the same line)", loc)
    if char == "\0":
        raise AnfirSyntaxError("unexpected NUL byte: this does not look like ANF text", loc)
    if char == "%":
        raise AnfirSyntaxError("'%' must be followed by a name (as in %1 or %tmp)", loc)
    if char == ".":
        raise AnfirSyntaxError("unexpected '.': a float needs digits on both sides (1.0)", loc)
    shown = char if char.isprintable() else repr(char)
    raise AnfirSyntaxError(f"unexpected character '{shown}'", loc)


class LarkToken(tuple):
    """A token tuple that also has the attributes Lark's own LALR loop reads."""

    __slots__ = ()

    @property
    def type(self) -> str:
        """The terminal name."""
        return self[0]

    @property
    def value(self) -> str:
        """The token text."""
        return self[1]

    @property
    def line(self) -> int:
        """1-based line."""
        return self[2]

    @property
    def column(self) -> int:
        """1-based column."""
        return self[3]

    start_pos = end_pos = None
    end_line = line
    end_column = column


class AnfLarkLexer(Lexer):
    """Lark's custom-lexer hook: feeds :func:`tokenize`'s tokens to Lark's own parse loop.

    The text handed to ``Lark.parse`` must be a :class:`LexerInput`, which
    carries the tokens along (they are made before the parse, for both engines).
    """

    __future_interface__ = 0

    def __init__(self, lexer_conf: Any) -> None:
        pass

    def lex(self, data: Any) -> Iterator[LarkToken]:  # type: ignore[override]
        """Tokens of ``data`` (a :class:`LexerInput`)."""
        for token in data.tokens:
            yield LarkToken(token)


class LexerInput(str):
    """Text for ``Lark.parse`` that carries its already scanned tokens."""

    tokens: list[Token]

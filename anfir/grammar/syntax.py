"""The ANF language's fixed tokens: keywords, punctuation and operators, in one table each.

The lexer (:mod:`anfir.grammar.anf_lexer`) reads its token kinds from here, the
graph builder (:mod:`anfir.grammar.anf_builder`) its operator precedences and
primitives, the text printer (:mod:`anfir.printers.text`) how each operator
primitive is spelled, and the name allocator (:mod:`anfir.printers.naming`)
the words a name must not be.  ``docs/language.md`` documents the same tables
(a test compares them).

The terminal names (``PLUS``, ``LPAR``...) are the ones ``anf.lark`` declares.
Operators map to primitive *names*: whoever needs the primitive objects looks
them up once.  The module imports only the standard library, so the printers
(a layer above the front ends) read it without pulling in the parser.
"""

from __future__ import annotations

from dataclasses import dataclass

KEYWORDS: dict[str, str] = {
    "import": "IMPORT", "def": "DEF", "lambda": "LAMBDA", "let": "LET", "in": "IN",
    "end": "END", "if": "IF", "then": "THEN", "else": "ELSE", "and": "AND", "or": "OR",
    "not": "NOT", "true": "TRUE", "True": "TRUE", "false": "FALSE", "False": "FALSE",
    "None": "NONE",
}
"""Words the lexer reserves (keywords and the literal names) -> their terminal.
None of them can be a name."""

PUNCTUATION: dict[str, str] = {
    "(": "LPAR", ")": "RPAR", "[": "LSQB", "]": "RSQB", ",": "COMMA", "=": "EQ",
    ":": "COLON", "->": "ARROW",
}
"""Punctuation that is not an operator, by text -> terminal."""


@dataclass(frozen=True)
class Operator:
    """One operator of the language: a call of ``primitive`` spelled ``text``."""

    text: str
    """How it is written: ``+``, ``and``."""
    terminal: str
    """The lexer's terminal for ``text`` (``PLUS``)."""
    primitive: str
    """The name of the primitive it calls (``add``)."""
    arity: int
    """2 for an infix operator, 1 for a prefix one."""
    precedence: int
    """Larger binds tighter."""
    associativity: str
    """``left`` or ``right`` for an infix operator, ``prefix`` for a prefix one."""

    @property
    def spelling(self) -> str:
        """The text a printer writes before a prefix operator's operand, or
        between an infix operator's operands (a word needs a blank after it)."""
        return self.text + " " if self.arity == 1 and self.text.isalpha() else self.text


OPERATORS: tuple[Operator, ...] = (
    Operator("or", "OR", "logical_or", 2, 1, "left"),
    Operator("and", "AND", "logical_and", 2, 2, "left"),
    Operator("not", "NOT", "logical_not", 1, 3, "prefix"),
    Operator("<", "LT", "lt", 2, 4, "left"),
    Operator("<=", "LE", "le", 2, 4, "left"),
    Operator(">", "GT", "gt", 2, 4, "left"),
    Operator(">=", "GE", "ge", 2, 4, "left"),
    Operator("==", "EQEQ", "eq", 2, 4, "left"),
    Operator("!=", "NE", "ne", 2, 4, "left"),
    Operator("+", "PLUS", "add", 2, 5, "left"),
    Operator("-", "MINUS", "sub", 2, 5, "left"),
    Operator("*", "STAR", "mul", 2, 6, "left"),
    Operator("/", "SLASH", "div", 2, 6, "left"),
    Operator("@", "AT", "matmul", 2, 6, "left"),
    Operator("-", "MINUS", "neg", 1, 7, "prefix"),
    Operator("**", "POW", "pow", 2, 8, "right"),
)
"""Every operator, from the loosest to the tightest binding (the spec's table).

The grammar (``anf.lark``) parses unary minus and the right-associative ``**``
itself; the left-associative infix operators form one flat ``chain`` that the
builder orders by these precedences, with ``not`` applied at its own."""

CHAIN_OPERATORS: dict[str, Operator] = {
    op.terminal: op for op in OPERATORS if op.arity == 2 and op.associativity == "left"}
"""The left-associative infix operators (those of a ``chain``), by terminal."""

PREFIX_OPERATORS: dict[str, Operator] = {op.terminal: op for op in OPERATORS if op.arity == 1}
"""The prefix operators (``not``, unary ``-``), by terminal."""

INFIX_OPERATORS: dict[str, Operator] = {op.terminal: op for op in OPERATORS if op.arity == 2}
"""Every infix operator (the chain's and ``**``), by terminal."""

BY_PRIMITIVE: dict[tuple[str, int], Operator] = {(op.primitive, op.arity): op for op in OPERATORS}
"""The operator that calls a primitive with that many arguments: ``("neg", 1)`` -> ``-``."""

TERMINALS: dict[str, str] = {**KEYWORDS, **PUNCTUATION,
                             **{op.text: op.terminal for op in OPERATORS}}
"""Every fixed token (keyword, punctuation, operator) by text -> its terminal."""


def _check_tables() -> None:
    # Import-time sanity: one text is one terminal (``-`` is MINUS both as an
    # infix and as a prefix operator; ``and`` is the keyword and the operator),
    # and each primitive has one spelling per arity.
    seen: dict[str, str] = {}
    for text, terminal in [*KEYWORDS.items(), *PUNCTUATION.items(),
                           *((op.text, op.terminal) for op in OPERATORS)]:
        assert seen.setdefault(text, terminal) == terminal, text
    assert len(BY_PRIMITIVE) == len(OPERATORS), "a primitive with two spellings"
    for op in OPERATORS:
        assert op.associativity in (("prefix",) if op.arity == 1 else ("left", "right")), op
        assert not op.text.isalpha() or op.text in KEYWORDS, op  # word operators are reserved


_check_tables()


__all__ = ["BY_PRIMITIVE", "CHAIN_OPERATORS", "INFIX_OPERATORS", "KEYWORDS", "OPERATORS", "Operator",
           "PREFIX_OPERATORS", "PUNCTUATION", "TERMINALS"]

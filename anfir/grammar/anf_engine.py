"""The LALR engine: Lark's tables and callbacks for anf.lark, and a compact loop driving them.

``Lark(anf.lark, parser="lalr", lexer=AnfLarkLexer, transformer=AnfBuilder())``
is built once per process.  Lark computes the LALR(1) tables and turns the
transformer's methods into the rule callbacks; those are exactly what
``Lark.parse`` would run.  :func:`run_tables` feeds tokens through the same
tables and callbacks with a tighter loop than ``ParserState.feed_token``
(an action is a state number or the reduction itself, no per-token method
call, plain tuple tokens, one-child reductions done in place, an atom's
shift and reduction fused): about three times the throughput of Lark's
loop, which is what lets the parser reach its lines-per-second goal.
``engine="lark"`` runs Lark's own loop instead (tests check both give the
same graphs).

Syntax errors are reported in words ("expected 'in' or an operator, found
'x'"): the tokens before the bad one are replayed through the tables
(without callbacks) and each terminal the table lists there is checked by
simulating the reductions it would cause, so only what could really come
next is named.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from itertools import chain
from typing import Any, Callable, Iterable, Optional, Union

from lark import Lark
from lark.parsers.lalr_analysis import Shift

from anfir.errors import AnfirSyntaxError
from anfir.grammar.anf_builder import AnfBuilder
from anfir.grammar.anf_lexer import AnfLarkLexer, LexerInput, Token
from anfir.location import Location

GRAMMAR_PATH = os.path.join(os.path.dirname(__file__), "anf.lark")
"""The grammar file."""

END = "$END"


Reduction = tuple  # (number of children, nonterminal made, callback or None to pass the child)
"""A rule to reduce; the callback is None for a rule that passes its one child through."""
Action = Union[int, Reduction]
ActionTable = list[dict[str, Any]]
"""Per state: symbol -> :data:`Action`.  The loops tell an action's kind by
``code.__class__`` (cheaper than isinstance) and read a goto (always an int) by
nonterminal name; mypy follows neither, so the driving loops see ``Any``."""


@dataclass
class Engine:
    """The parser object: Lark, its builder, and the tables compiled for :func:`run_tables`."""

    lark: Lark
    builder: AnfBuilder
    actions: ActionTable
    """Per state: symbol -> the state to shift or go to (an int), or the
    :data:`Reduction` to make."""
    fused: ActionTable
    """``actions`` with shift-then-reduce pairs fused (see :func:`_fuse`); used by the loop."""
    start: int
    end: int
    lock: threading.Lock


_ENGINE: Optional[Engine] = None
_ENGINE_LOCK = threading.Lock()


def engine() -> Engine:
    """The process-wide parser object (built on first use)."""
    global _ENGINE
    if _ENGINE is None:
        with _ENGINE_LOCK:
            if _ENGINE is None:
                _ENGINE = _build()
    return _ENGINE


def _build() -> Engine:
    with open(GRAMMAR_PATH, encoding="utf-8") as handle:
        grammar = handle.read()
    builder = AnfBuilder()
    # strict: a shift/reduce conflict is an error, not silently resolved.
    lark = Lark(grammar, parser="lalr", lexer=AnfLarkLexer, transformer=builder,
                maybe_placeholders=False, start="start", strict=True)
    inner = lark.parser.parser.parser  # ParsingFrontend -> LALR_Parser -> _Parser
    table = inner.parse_table
    callbacks = inner.callbacks
    reductions: dict[Any, Reduction] = {}
    actions: list[dict[str, Action]] = [{} for _ in range(max(table.states) + 1)]
    for state, row in table.states.items():
        codes = actions[state]
        for symbol, (action, arg) in row.items():
            # Lark's symbol names may be Token objects (a str subclass with a
            # Python-level __eq__); plain str keys make every lookup C-speed.
            symbol = str(symbol)
            if action is Shift:
                codes[symbol] = arg
                continue
            reduction = reductions.get(arg)
            if reduction is None:
                callback = callbacks[arg]
                size = len(arg.expansion)
                # A one-child pass-through rule only changes the state.
                passthrough = size == 1 and callback == builder.first
                reduction = reductions[arg] = (size, str(arg.origin.name),
                                               None if passthrough else callback)
            codes[symbol] = reduction
    return Engine(lark, builder, actions, _fuse(actions), table.start_states["start"],
                  table.end_states["start"], threading.Lock())


def _fuse(actions: list[dict[str, Action]]) -> list[dict[str, Action]]:
    """``actions`` where a shift into a state that can only reduce one 1-child rule
    (``postfix: NAME``, ``postfix: FLOAT``...) does that reduction at once.

    The reduction would happen next whatever the lookahead, so doing it at
    the shift changes no callback's order; it saves a loop turn per atom.
    Such an action is a :class:`ShiftReduce`.
    """
    only: dict[int, Reduction] = {}
    for state, row in enumerate(actions):
        kinds = {id(code) for code in row.values() if code.__class__ is tuple}
        if row and len(kinds) == 1 and all(code.__class__ is tuple for code in row.values()):
            reduction = next(iter(row.values()))
            assert isinstance(reduction, tuple)  # (checked above)
            if reduction[0] == 1:
                only[state] = reduction
    fused: list[dict[str, Action]] = []
    for row in actions:
        new_row = dict(row)
        for symbol, code in row.items():
            if code.__class__ is int and symbol.isupper() and code in only:
                _, origin, callback = only[code]
                new_row[symbol] = ShiftReduce((origin, callback))
        fused.append(new_row)
    return fused


class ShiftReduce(tuple):
    """A fused action: shift the token, then reduce it alone as ``(origin, callback)``."""

    __slots__ = ()


def run_tables(eng: Engine, batches: Iterable[list[Token]], end_token: Callable[[], Token]) -> Any:
    """Parse the tokens of ``batches`` (lists of tokens, pulled one at a time),
    then ``end_token()`` (the end-of-input token), with the LALR tables,
    running the callbacks.

    Raises :class:`Unexpected` with the failing token.
    """
    actions = eng.fused
    state = eng.start
    states = [state]
    values: list = []
    push_state = states.append
    push_value = values.append
    for token in chain.from_iterable(batches):
        kind = token[0]
        while True:
            code: Any = actions[state].get(kind)  # (see ActionTable)
            cls = code.__class__
            if cls is int:  # shift
                push_state(code)
                push_value(token)
                state = code
                break
            if cls is tuple:  # reduce
                size, origin, callback = code
                if size == 1:  # the most common size: replace the top in place
                    if callback is not None:
                        values[-1] = callback([values[-1]])
                    state = states[-1] = actions[states[-2]][origin]
                    continue
                if size:
                    children = values[-size:]
                    del values[-size:]
                    del states[-size:]
                else:
                    children = []
                push_value(callback(children))
                state = actions[states[-1]][origin]
                push_state(state)
                continue
            if code is None:
                raise Unexpected(token)
            origin, callback = code  # shift, then reduce the token alone
            push_value(token if callback is None else callback([token]))
            state = actions[state][origin]
            push_state(state)
            break
    end_state = eng.end
    eof = end_token()
    while True:
        code = actions[state].get(END)
        if code is None or code.__class__ is int:
            raise Unexpected(eof)
        size, origin, callback = code
        if size:
            children = values[-size:]
            del values[-size:]
            del states[-size:]
        else:
            children = []
        value = children[0] if callback is None else callback(children)
        state = actions[states[-1]][origin]
        if state == end_state:
            return value
        push_value(value)
        push_state(state)


def run_lark(eng: Engine, text: str, tokens: list[Token]) -> Any:
    """Parse with Lark's own LALR loop (``Lark.parse``) over the same tokens."""
    data = LexerInput(text)
    data.tokens = tokens
    return eng.lark.parse(data)


class Unexpected(Exception):
    """A token the grammar does not accept (internal; becomes a syntax error)."""

    def __init__(self, token: Token) -> None:
        super().__init__(token)
        self.token = token


def states_before(eng: Engine, tokens: list[Token]) -> list[int]:
    """The state stack after shifting ``tokens`` (all valid), without running callbacks.

    Used on an error: the loop may already have made reductions for the bad
    token, so the expected set is computed from the stack as it was before.
    """
    actions = eng.actions
    states = [eng.start]
    for token in tokens:
        kind = token[0]
        while True:
            code = actions[states[-1]][kind]
            if code.__class__ is int:
                states.append(code)
                break
            size, origin, _ = code
            if size:
                del states[-size:]
            states.append(actions[states[-1]][origin])
    return states


def expected_terminals(eng: Engine, states: list[int]) -> set[str]:
    """The terminals that the parser, with state stack ``states``, could shift next.

    An LALR table may reduce on a lookahead it cannot shift afterwards (its
    lookahead sets merge contexts), so each candidate is checked by running
    the reductions it would trigger on a copy of the stack.
    """
    actions = eng.actions
    candidates = {symbol for symbol in actions[states[-1]] if symbol.isupper()}
    accepted = set()
    for symbol in candidates:
        stack = list(states)
        while True:
            code = actions[stack[-1]].get(symbol)
            if code is None:
                break
            if code.__class__ is int or (symbol == END and _reaches_end(eng, stack, code)):
                accepted.add(symbol)
                break
            if symbol == END:
                break
            size, origin, _ = code
            if size:
                del stack[-size:]
            stack.append(actions[stack[-1]][origin])
    return accepted or candidates


def _reaches_end(eng: Engine, stack: list[int], code: Any) -> bool:
    """Whether reducing on end-of-input from ``stack`` completes the parse."""
    stack = list(stack)
    while True:
        size, origin, _ = code
        if size:
            del stack[-size:]
        state = eng.actions[stack[-1]][origin]
        if state == eng.end:
            return True
        stack.append(state)
        code = eng.actions[state].get(END)
        if code is None or code.__class__ is int:
            return False


def syntax_error(token: Token, expected: set[str], filename: str, lines: list[str]) -> AnfirSyntaxError:
    """The located, worded error for ``token`` where only ``expected`` terminals fit."""
    line, col = token[2], token[3]
    line_text = lines[line - 1] if 0 < line <= len(lines) else ""
    loc = Location(filename, line, col, line_text)
    return AnfirSyntaxError(f"expected {describe_expected(expected)}, found {describe_token(token)}", loc)


EXPRESSION_START = {"NAME", "INT", "FLOAT", "STRING", "TRUE", "FALSE", "NONE", "LPAR", "LAMBDA",
                    "LET", "IF", "MINUS", "NOT"}
BINARY_OPERATORS = {"OR", "AND", "LT", "LE", "GT", "GE", "EQEQ", "NE", "PLUS", "MINUS", "STAR",
                    "SLASH", "AT", "POW"}
_WORDS = {
    "IN": "'in'", "THEN": "'then'", "ELSE": "'else'", "END": "'end' (closing the lambda)",
    "RPAR": "')'", "RSQB": "']'", "COMMA": "','", "EQ": "'='", "COLON": "':'", "ARROW": "'->'",
    "DEF": "a definition ('def')", "IMPORT": "'import'", END: "the end of the file",
    "STRING": "a string", "NAME": "a name", "INT": "an integer", "LSQB": "'['", "LPAR": "'('",
    "STAR": "'*'", "LAMBDA": "'lambda'", "LET": "'let'", "IF": "'if'",
}
_ORDER = ["IN", "THEN", "ELSE", "END", "EQ", "COLON", "ARROW", "RPAR", "RSQB", "COMMA", "NAME",
          "INT", "STRING", "LPAR", "LSQB", "STAR", "DEF", "IMPORT", "LAMBDA", "LET", "IF", END]


def describe_expected(expected: set[str]) -> str:
    """What the parser expected, in words: keywords and punctuation first, then groups."""
    rest = set(expected)
    groups = []
    if len(rest & EXPRESSION_START) >= 3:
        groups.append("an expression")
        rest -= EXPRESSION_START
    if len(rest & BINARY_OPERATORS) >= 3:
        groups.append("an operator")
        rest -= BINARY_OPERATORS
        rest -= {"LPAR", "LSQB"}  # a call or an index continues an operand too
    words = [_WORDS[t] for t in _ORDER if t in rest]
    words += sorted(t.lower() for t in rest if t not in _WORDS)
    words += groups
    if not words:
        return "something else"
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def describe_token(token: Token) -> str:
    """The offending token, in words."""
    kind, text = token[0], token[1]
    if kind == END:
        return "the end of the file"
    if kind == "STRING":
        return "a string " + (text if len(text) <= 30 else text[:27] + '..."')
    if kind in ("INT", "FLOAT"):
        return f"the number {text}"
    return f"'{text}'"

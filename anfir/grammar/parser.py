"""Parse ANF text (shared spec anf-text.md) into a :class:`~anfir.ir.graph.Module`.

::

    mod = parse_module("def f(x) = x * 2")      # resolved: mod["f"] is a FuncGraph
    mod = parse_file("prog.anf")                # handles `import "other.anf"`
    raw = parse_module(text, resolve=False)     # globals left as Symbol constants

The grammar is ``anf.lark`` (Lark, LALR); graphs are built during the parse by
the callbacks of :mod:`anfir.grammar.anf_builder` (see that module for the
exact graph shapes).  Global names are left as ``ValueNode(Symbol(name))`` and
replaced by :func:`anfir.grammar.resolve.resolve_module` (run here unless
``resolve=False``).

Imports: ``module.imports`` lists the imported paths as written;
``module.imported`` maps each imported definition's name to its graph (those
graphs are not in ``module.graphs``).  A file's own definitions shadow
imported ones; two imports defining one name is an error.
``module.global_uses`` lists every ``ValueNode(Symbol)`` the parser made
(dead code included); :func:`~anfir.grammar.resolve.resolve_module` checks
those names too, then drops the list.
"""

from __future__ import annotations

import os
from typing import Optional

from lark.exceptions import UnexpectedInput

from anfir.errors import (AnfirSyntaxError, DuplicateDefinitionError, NameResolutionError,
                          UsageError)
from anfir.gcpause import gc_paused
from anfir.grammar.resolve import resolve_module
from anfir.grammar import anf_engine
from anfir.grammar.anf_lexer import tokenize
from anfir.ir.graph import FuncGraph, Module
from anfir.location import Location


def parse_module(text: str, filename: str = "<string>", resolve: bool = True,
                 engine: str = "tables") -> Module:
    """Parse ANF ``text`` into a Module; ``import`` paths are relative to the cwd.

    ``engine="lark"`` runs Lark's own parse loop instead of the faster table
    loop (same tables, same callbacks, same graphs).
    """
    if not isinstance(text, str):
        raise UsageError(f"parse_module expects text (str), not {type(text).__name__}; "
                         "use parse_file for a path")
    if engine not in ("tables", "lark"):
        raise UsageError(f"unknown parser engine {engine!r}; use 'tables' or 'lark'")
    with gc_paused():
        return _Loader(engine).load_text(text, filename, os.getcwd(), resolve)


def parse_file(path: str, resolve: bool = True) -> Module:
    """Read and parse the ANF file ``path`` and, recursively, the files it imports."""
    with gc_paused():
        return _Loader("tables").load_path(path, resolve, None)


def read_source(path: str, loc: Optional[Location] = None) -> str:
    """The text of ``path`` as UTF-8; undecodable bytes are a located syntax error."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as error:
        reason = error.strerror or str(error)
        message = (f"cannot import {path!r}: {reason}" if loc is not None
                   else f"cannot read {path}: {reason}")
        if loc is not None:
            raise NameResolutionError(message, loc) from None
        raise UsageError(message) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        start = error.start
        line = data.count(b"\n", 0, start) + 1
        line_start = data.rfind(b"\n", 0, start) + 1
        line_end = data.find(b"\n", start)
        raw_line = data[line_start: line_end if line_end >= 0 else len(data)]
        shown = raw_line.decode("utf-8", errors="replace")
        col = len(data[line_start:start].decode("utf-8", errors="replace")) + 1
        raise AnfirSyntaxError(
            f"the file is not UTF-8 text (byte 0x{data[start]:02x}); is it a binary file?",
            Location(path, line, col, shown)) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return text


class _Loader:
    """One parse request: follows imports, detects cycles, parses each file once."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.loaded: dict[str, Module] = {}
        self.active: list[str] = []

    def load_path(self, path: str, resolve: bool, loc: Optional[Location]) -> Module:
        key = os.path.realpath(path)
        if key in self.loaded:
            return self.loaded[key]
        text = read_source(path, loc)
        self.active.append(key)
        try:
            module = self.load_text(text, path, os.path.dirname(os.path.abspath(path)), resolve)
        finally:
            self.active.pop()
        self.loaded[key] = module
        return module

    def load_text(self, text: str, filename: str, base_dir: str, resolve: bool) -> Module:
        imports, definitions, global_uses = _parse_text(text, filename, self.engine)
        module = Module({}, filename)
        # Every use of a global name, dead code included, so that the resolve
        # phase reports a misspelt name even where its value is never used.
        module.global_uses = global_uses
        graphs = module.graphs
        first: dict[str, Location] = {}
        for graph, loc in definitions:
            if graph.name in graphs:
                previous = first[graph.name]
                raise DuplicateDefinitionError(
                    f"'{graph.name}' is defined twice", loc,
                    hint=f"the first definition is at line {previous.line}")
            graphs[graph.name] = graph
            first[graph.name] = loc
        imported: dict[str, FuncGraph] = {}
        origin: dict[str, str] = {}
        for path, loc in imports:
            full = os.path.join(base_dir, path)
            key = os.path.realpath(full)
            if key in self.active:
                cycle = [os.path.basename(p) for p in self.active[self.active.index(key):]]
                cycle.append(os.path.basename(key))
                raise NameResolutionError("import cycle: " + " -> ".join(cycle), loc)
            other = self.load_path(full, True, loc)
            for name, graph in other.graphs.items():
                if name in imported and imported[name] is not graph:
                    raise DuplicateDefinitionError(
                        f"'{name}' is defined by both {origin[name]!r} and {path!r}", loc)
                imported[name] = graph
                origin[name] = path
        module.imports = [path for path, _ in imports]
        module.imported = imported
        if resolve:

            resolve_module(module)
        return module


def _parse_text(text: str, filename: str, engine: str) -> tuple[list, list, list]:
    """Run lexer and LALR parser over ``text``: (imports, definitions, global name uses)."""
    lines = text.split("\n")
    tokens = tokenize(lines, filename)
    if not tokens:
        raise AnfirSyntaxError("the file defines nothing (no definition and no expression)",
                               Location(filename, 1, 1, lines[0]),
                               hint="write `def NAME(PARAMS) = EXPR` or one expression")
    last = tokens[-1]
    eof = (anf_engine.END, "", last[2], last[3] + len(last[1]))
    eng = anf_engine.engine()
    with eng.lock:
        builder = eng.builder
        builder.begin(filename, lines)
        try:
            if engine == "lark":
                try:
                    anf_engine.run_lark(eng, text, tokens)
                except UnexpectedInput as error:
                    token = getattr(error, "token", None)
                    if token is None or token.type == anf_engine.END:
                        where = len(tokens)
                    else:
                        where = next(i for i, t in enumerate(tokens)
                                     if (t[2], t[3]) == (token.line, token.column))
                    raise _syntax_error(eng, tokens, where, eof, filename, lines) from None
            else:
                try:
                    anf_engine.run_tables(eng, tokens, eof)
                except anf_engine.Unexpected as error:
                    where = len(tokens) if error.token is eof else tokens.index(error.token)
                    raise _syntax_error(eng, tokens, where, eof, filename, lines) from None
            result = builder.finish()
        finally:
            builder.begin("<string>", [""])
    return result


def _syntax_error(eng: anf_engine.Engine, tokens: list, where: int, eof: tuple, filename: str,
                  lines: list[str]) -> AnfirSyntaxError:
    """The error for ``tokens[where]`` (``eof`` past the end), with what would have fit there."""
    states = anf_engine.states_before(eng, tokens[:where])
    expected = anf_engine.expected_terminals(eng, states)
    token = tokens[where] if where < len(tokens) else eof
    return anf_engine.syntax_error(token, expected, filename, lines)

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
from typing import Iterator, Optional, Sequence

from lark.exceptions import UnexpectedInput

from anfir.errors import (AnfirSyntaxError, DuplicateDefinitionError, NameResolutionError,
                          UsageError)
from anfir import limits
from anfir.gcpause import gc_paused
from anfir.grammar.resolve import resolve_module
from anfir.grammar import anf_engine
from anfir.grammar.anf_lexer import token_batches, tokenize
from anfir.ir.graph import FuncGraph, Module
from anfir.location import Location


def parse_module(text: str, filename: str = "<string>", resolve: bool = True,
                 engine: str = "tables", *, allow_internal: bool = False,
                 search_path: Optional[Sequence[str]] = None) -> Module:
    """Parse ANF ``text`` into a Module; ``import`` paths are relative to the cwd.

    ``engine="lark"`` runs Lark's own parse loop instead of the faster table
    loop (same tables, same callbacks, same graphs).  ``allow_internal`` lets
    the text name internal primitives (the autodiff's own gradient rules do;
    a user's program gets a located name error).  ``search_path``: see
    :func:`import_search_path`.
    """
    if not isinstance(text, str):
        raise UsageError(f"parse_module expects text (str), not {type(text).__name__}; "
                         "use parse_file for a path")
    if not isinstance(filename, str):
        raise UsageError(f"a file name is a str, not {type(filename).__name__}")
    if engine not in ("tables", "lark"):
        raise UsageError(f"unknown parser engine {engine!r}; use 'tables' or 'lark'")
    if len(text) > limits.MAX_SOURCE_BYTES:
        raise UsageError(f"the text is too large ({len(text):,} characters; anfir reads at most "
                         f"{limits.MAX_SOURCE_BYTES:,}, see anfir.limits)")
    with gc_paused():
        loader = _Loader(engine, os.getcwd(), search_path, allow_internal)
        return loader.load_text(text, filename, os.getcwd(), resolve)


def parse_file(path: str, resolve: bool = True, *,
               search_path: Optional[Sequence[str]] = None) -> Module:
    """Read and parse the ANF file ``path`` and, recursively, the files it imports.

    Imports stay inside the directory tree of ``path`` and the directories of
    the search path (:func:`import_search_path`).
    """
    if not isinstance(path, (str, os.PathLike)):
        raise UsageError(f"a path is a str, not {type(path).__name__}")
    path = os.fspath(path)
    if not isinstance(path, str) or "\0" in path:
        raise UsageError(f"cannot read {path!r}: not a valid path")
    root = os.path.dirname(os.path.realpath(path))
    with gc_paused():
        return _Loader("tables", root, search_path, False).load_path(path, resolve, None)


SEARCH_PATH_VARIABLE = "ANFIR_PATH"
"""The environment variable listing extra import directories (``os.pathsep``-separated)."""


def import_search_path(search_path: Optional[Sequence[str]] = None) -> list[str]:
    """The directories, besides the program's own tree, that ``import`` may read from:
    ``search_path`` when given, else those listed in ``$ANFIR_PATH``."""
    if search_path is None:
        listed = os.environ.get(SEARCH_PATH_VARIABLE, "")
        search_path = [d for d in listed.split(os.pathsep) if d]
    elif isinstance(search_path, (str, bytes)) or not all(isinstance(d, str) for d in search_path):
        raise UsageError("search_path is a list of directory names")
    return [os.path.realpath(d) for d in search_path if "\0" not in d]


def read_source(path: str, loc: Optional[Location] = None) -> str:
    """The text of ``path`` as UTF-8; undecodable bytes are a located syntax error.

    Only a regular file of at most ``anfir.limits.MAX_SOURCE_BYTES`` is read.
    """
    try:
        data = limits.read_bounded(path)
    except limits.ReadError as error:
        if loc is not None:
            raise NameResolutionError(f"cannot import {path!r}: {error}", loc) from None
        raise UsageError(f"cannot read {path}: {error}") from None
    return decode_source(data, path)


def decode_source(data: bytes, path: str) -> str:
    """``data`` as UTF-8 text (a leading byte-order mark dropped); undecodable
    bytes are a syntax error located at the first of them."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        start = error.start
        line = data.count(b"\n", 0, start) + 1
        line_start = data.rfind(b"\n", 0, start) + 1
        line_end = data.find(b"\n", start)
        raw_line = data[line_start: line_end if line_end >= 0 else len(data)]
        shown = raw_line[:1000].decode("utf-8", errors="replace")
        col = len(data[line_start:start].decode("utf-8", errors="replace")) + 1
        raise AnfirSyntaxError(
            f"the file is not UTF-8 text (byte 0x{data[start]:02x}); is it a binary file?",
            Location(path, line, col, shown)) from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return text


def _inside(path: str, folder: str) -> bool:
    """Whether the real path ``path`` is ``folder`` or below it."""
    try:
        return os.path.commonpath([path, folder]) == folder
    except ValueError:  # different drives
        return False


class _Loader:
    """One parse request: follows imports, detects cycles, parses each file once.

    Imports are confined: a path is relative (never absolute), names an
    ``.anf`` file, and must lead (symbolic links followed) inside ``root`` —
    the directory of the file the request started from (the cwd for text) —
    or inside a directory of the search path.
    """

    def __init__(self, engine: str, root: str, search_path: Optional[Sequence[str]],
                 allow_internal: bool) -> None:
        self.engine = engine
        self.allow_internal = allow_internal
        self.roots = [os.path.realpath(root), *import_search_path(search_path)]
        self.search = self.roots[1:]
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

    def find_import(self, path: str, base_dir: str, loc: Location) -> str:
        """The file ``import "path"`` in a file of ``base_dir`` reads (checked, see the class)."""
        if not path or "\0" in path:
            raise NameResolutionError(f"cannot import {path!r}: not a valid path", loc)
        if os.path.isabs(path) or path.startswith(("/", "\\")) or os.path.splitdrive(path)[0]:
            raise NameResolutionError(
                f"cannot import {path!r}: an import path is relative to the importing file", loc,
                hint=f"put the file in the program's directory tree or in a directory listed "
                     f"in ${SEARCH_PATH_VARIABLE}")
        if not path.endswith(".anf"):
            raise NameResolutionError(f"cannot import {path!r}: only .anf files can be imported",
                                      loc)
        candidates = [os.path.join(base_dir, path)]
        candidates += [os.path.join(folder, path) for folder in self.search]
        allowed = [full for full in candidates
                   if any(_inside(os.path.realpath(full), root) for root in self.roots)]
        found = next((full for full in allowed if os.path.lexists(full)), None)
        if found is not None:
            return found
        if candidates[0] not in allowed:
            # (Whether such a file exists is not said: nothing outside is looked at.)
            raise NameResolutionError(
                f"cannot import {path!r}: it is outside the program's directory tree", loc,
                hint=f"imports read the tree of the program's own directory and the "
                     f"directories listed in ${SEARCH_PATH_VARIABLE}")
        return candidates[0]

    def load_text(self, text: str, filename: str, base_dir: str, resolve: bool) -> Module:
        imports, definitions, global_uses, metadata = _parse_text(text, filename, self.engine)
        module = Module({}, filename)
        module.metadata = metadata
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
            full = self.find_import(path, base_dir, loc)
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

            resolve_module(module, allow_internal=self.allow_internal)
        return module


def _parse_text(text: str, filename: str, engine: str) -> tuple[list, list, list, dict]:
    """Run lexer and LALR parser over ``text``: (imports, definitions, global name uses,
    the module's metadata).

    The table engine pulls tokens a line at a time, so only the tokens before
    an error (and those of its line) are ever made.
    """
    lines = text.split("\n")
    eng = anf_engine.engine()
    consumed: list = []
    ends: list = []
    notes: set[int] = set()  # doc and attribute lines, as the lexer meets them

    def batches() -> Iterator[list]:
        for batch in token_batches(lines, filename, notes):
            consumed.extend(batch)
            yield batch

    def end_token() -> tuple:
        if not consumed:
            raise AnfirSyntaxError("the file defines nothing (no definition and no expression)",
                                   Location(filename, 1, 1, lines[0]),
                                   hint="write `def NAME(PARAMS) = EXPR` or one expression")
        last = consumed[-1]
        ends.append((anf_engine.END, "", last[2], last[3] + len(last[1])))
        return ends[-1]

    with eng.lock:
        builder = eng.builder
        builder.begin(filename, lines)
        builder.notes = notes
        try:
            if engine == "lark":
                consumed = tokenize(lines, filename, notes)
                eof = end_token()
                try:
                    anf_engine.run_lark(eng, text, consumed)
                except UnexpectedInput as error:
                    token = getattr(error, "token", None)
                    if token is None or token.type == anf_engine.END:
                        where = len(consumed)
                    else:
                        where = next(i for i, t in enumerate(consumed)
                                     if (t[2], t[3]) == (token.line, token.column))
                    raise _syntax_error(eng, consumed, where, eof, filename, lines) from None
            else:
                try:
                    anf_engine.run_tables(eng, batches(), end_token)
                except anf_engine.Unexpected as error:
                    if ends and error.token is ends[-1]:
                        where = len(consumed)
                    else:
                        where = consumed.index(error.token)
                    eof = ends[-1] if ends else end_token()
                    raise _syntax_error(eng, consumed, where, eof, filename, lines) from None
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

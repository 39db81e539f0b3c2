"""No module finds a primitive by its name string, outside the places that turn TEXT into primitives.

A primitive is one object (docs/architecture.md): rules and tables hold it, so a
misspelt or missing primitive is an ``AttributeError`` when the module is imported
(and a mypy error), never a failure of the first program that uses the op.  Names
matter only where text comes in — the parser and the ``.ir`` / ``.lir`` loaders —
and in the registry that serves them.

Every module's source is read with ``ast`` (like ``tests/test_layers.py``) and
each of these counts as a lookup by string:

* ``PRIMITIVES[...]``, ``META_FUNCTIONS[...]``, their ``.get(...)``, ``... in PRIMITIVES``
  (however the registry is reached: ``from anfir.primitives import PRIMITIVES``,
  ``registry.PRIMITIVES``, ``anfir.primitives.registry.PRIMITIVES``);
* a call of the registry's ``lookup`` (imported or as ``registry.lookup``);
* an alias of one of those (``P = PRIMITIVES``), which would hide the rest;
* ``getattr(family, ...)`` on an op-library family module (``anfir.primitives.nn``...).

A helper that wraps a lookup (the importers' old ``P("softmax")`` / ``_prim(name)``)
is caught where it does the lookup, and so is every call of it in its module.  Enumerating the registry
(``PRIMITIVES.values()``, e.g. for a coverage check) is not a lookup by name.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "anfir"

REGISTRY_MODULES = ("anfir.primitives", "anfir.primitives.registry")
"""Where ``PRIMITIVES`` / ``META_FUNCTIONS`` / ``lookup`` are exported from."""
REGISTRY_NAMES = ("PRIMITIVES", "META_FUNCTIONS", "lookup")
FAMILY_PREFIX = "anfir.primitives."

ALLOWED: dict[str, str] = {
    "anfir.primitives.registry":
        "the registry itself: it declares primitives by name and serves the front ends",
    "anfir.primitives":
        "re-exports the registry (PRIMITIVES, lookup) for the front ends",
    "anfir.grammar.anf_builder":
        "the parser's builder: turns an operator token (+, not, **) of program text into its primitive",
    "anfir.grammar.resolve":
        "the front end's name resolution: a name written in a program is looked up "
        "(and the 'did you mean' list offers the registered names)",
    "anfir.grammar.ir_loader":
        "the .ir loader: a primitive written in a .ir file is found by its name",
    "anfir.lowlevel.loader":
        "the .lir loader: an instruction of a .lir file names its primitive",
    "anfir.printers.text":
        "the printer writes TEXT: it prints an operator spelling only when the primitive's "
        "name reads back (through the parser) as the same object",
}
"""Modules that legitimately map user TEXT to primitives, with the reason."""

PENDING_ELSEWHERE: dict[str, str] = {
}
"""Hits in files another branch owns: listed so this branch's test passes, each to go."""


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name/Attribute chain ('' for anything else)."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return ""
    names.append(node.id)
    return ".".join(reversed(names))


class _Finder(ast.NodeVisitor):
    """Collects the string lookups of one module (line, what)."""

    def __init__(self) -> None:
        self.registry_names: set[str] = set()   # local names bound to PRIMITIVES/META_FUNCTIONS/lookup
        self.registry_modules: set[str] = set()  # local names bound to a registry module
        self.family_modules: set[str] = set()    # local names bound to an op-library family
        self.helpers: set[str] = set()           # functions of this module that do a lookup
        self.hits: list[tuple[int, str]] = []

    # -- what the imports bind -------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname is None:
                continue  # `import anfir.primitives.nn` binds `anfir`: the dotted check sees it
            if alias.name in REGISTRY_MODULES:
                self.registry_modules.add(alias.asname)
            elif alias.name.startswith(FAMILY_PREFIX):
                self.family_modules.add(alias.asname)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        source = node.module or ""
        for alias in node.names:
            local = alias.asname or alias.name
            full = f"{source}.{alias.name}"
            if source in REGISTRY_MODULES and alias.name in REGISTRY_NAMES:
                self.registry_names.add(local)
            elif full in REGISTRY_MODULES:
                self.registry_modules.add(local)
            elif full.startswith(FAMILY_PREFIX):
                self.family_modules.add(local)

    # -- what counts as a registry reference ------------------------------------------------
    def is_registry(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.registry_names
        if isinstance(node, ast.Attribute) and node.attr in REGISTRY_NAMES:
            owner = _dotted(node.value)
            return owner in self.registry_modules or owner in REGISTRY_MODULES
        return False

    def is_family(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.family_modules
        dotted = _dotted(node)
        return dotted.startswith(FAMILY_PREFIX) and dotted.count(".") == 2

    # -- the lookups ------------------------------------------------------------------------
    def visit_Subscript(self, node: ast.Subscript) -> None:
        if self.is_registry(node.value):
            self.hits.append((node.lineno, f"{ast.unparse(node)}"))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "get" and self.is_registry(func.value):
            self.hits.append((node.lineno, ast.unparse(node)))
        elif self.is_registry(func):  # lookup("name")
            self.hits.append((node.lineno, ast.unparse(node)))
        elif isinstance(func, ast.Name) and func.id in self.helpers:  # P("name")
            self.hits.append((node.lineno, f"via helper {ast.unparse(node)}"))
        elif (isinstance(func, ast.Name) and func.id == "getattr" and node.args
              and self.is_family(node.args[0])):
            self.hits.append((node.lineno, ast.unparse(node)))
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        for op, right in zip(node.ops, node.comparators):
            if isinstance(op, (ast.In, ast.NotIn)) and self.is_registry(right):
                self.hits.append((node.lineno, ast.unparse(node)))
        self.generic_visit(node)

    def visit_Assign(self, node: ast.Assign) -> None:
        if self.is_registry(node.value):
            self.hits.append((node.lineno, f"alias {ast.unparse(node)}"))
            # The alias's uses are lookups too (`P = PRIMITIVES; P["erf"]`).
            self.registry_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        self.generic_visit(node)


def lookups_in(source: str, imported_helpers: dict[str, set[str]] | None = None) -> list[tuple[int, str]]:
    """The string lookups of primitives in one module's source: (line, code).
    ``imported_helpers``: other modules' lookup helpers (module -> names), whose calls
    here count too."""
    return _scan(source, imported_helpers or {})[0]


def _scan(source: str, imported_helpers: dict[str, set[str]]) -> tuple[list[tuple[int, str]], set[str]]:
    """(the lookups, the module-level functions that do one)."""
    # Every lookup spells one of these names (an alias or a helper is found from one),
    # so a module that spells none has none: skip parsing it (most of the package).
    names = {*REGISTRY_NAMES, "getattr", *(h for hs in imported_helpers.values() for h in hs)}
    if not any(name in source for name in names):
        return [], set()
    tree = ast.parse(source)
    finder = _Finder()
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    outside = {alias.asname or alias.name for node in imports if isinstance(node, ast.ImportFrom)
               for alias in node.names if alias.name in imported_helpers.get(node.module or "", ())}
    # Imports first (anywhere in the module, functions included), then the uses.
    for node in imports:
        if isinstance(node, ast.Import):
            finder.visit_Import(node)
        else:
            finder.visit_ImportFrom(node)
    finder.visit(tree)
    # A module-level function whose body does a lookup is a lookup helper: its calls
    # count too (a second pass, since a helper may be defined after its first use).
    helpers = {f.name for f in tree.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
               and any(f.lineno <= line <= (f.end_lineno or f.lineno) for line, _ in finder.hits)}
    if helpers or outside:
        finder.helpers = helpers | outside
        finder.hits = []
        finder.visit(tree)
    return sorted(set(finder.hits)), helpers


@functools.lru_cache(maxsize=None)
def lookups(package: Path = PACKAGE) -> dict[str, list[tuple[int, str]]]:
    """Every module of ``package`` (a directory named ``anfir``) with string lookups."""
    sources = {module_name(path, package.parent): path.read_text(encoding="utf-8")
               for path in sorted(package.rglob("*.py"))}
    # First each module's own lookup helpers, then every module again with the
    # helpers it imports from others (the torch rules used a shared `_prim`).
    helpers = {name: _scan(text, {})[1] for name, text in sources.items()}
    found = {}
    for name, text in sources.items():
        hits = lookups_in(text, helpers)
        if hits:
            found[name] = hits
    return found


def _report(found: dict[str, list[tuple[int, str]]]) -> Iterator[str]:
    for module, hits in found.items():
        for line, code in hits:
            yield f"{module}:{line}: {code}"


def test_no_string_lookup_of_primitives_outside_the_allow_list() -> None:
    found = lookups()
    bad = {m: h for m, h in found.items() if m not in ALLOWED and m not in PENDING_ELSEWHERE}
    assert not bad, "primitives looked up by name (hold the object instead):\n" + "\n".join(_report(bad))


def test_allow_list_is_current() -> None:
    # Every allowed module exists and still does what it is allowed for: a stale entry
    # would let a new lookup in that module through unseen.
    found = lookups()
    # The registry defines (and the package re-exports) PRIMITIVES: not a use of an import.
    stale = sorted(set(ALLOWED) - set(found) - set(REGISTRY_MODULES)) + sorted(set(PENDING_ELSEWHERE) - set(found))
    assert not stale, f"allow-list entries with no lookup left (remove them): {stale}"


def test_the_finder_sees_each_form() -> None:
    # Each form the module docstring lists is caught, and holding the object is not.
    caught = [
        "from anfir.primitives.registry import PRIMITIVES\nx = PRIMITIVES['add']\n",
        "from anfir.primitives import PRIMITIVES\ny = PRIMITIVES.get('add')\n",
        "from anfir.primitives.registry import PRIMITIVES\nok = 'expand' in PRIMITIVES\n",
        "from anfir.primitives import registry\nf = registry.lookup('add')\n",
        "from anfir.primitives.registry import lookup as L\nf = L('add')\n",
        "import anfir.primitives.registry\nf = anfir.primitives.registry.PRIMITIVES['add']\n",
        "from anfir.primitives.registry import PRIMITIVES\nP = PRIMITIVES\n",
        "from anfir.primitives import nn\nf = getattr(nn, 'softmax')\n",
        "def P(name):\n    from anfir.primitives.registry import PRIMITIVES\n    return PRIMITIVES[name]\n",
    ]
    for source in caught:
        assert lookups_in(source), source
    # The calls of a helper that wraps a lookup, and an alias's uses, are each a hit.
    helper = ("from anfir.primitives.registry import PRIMITIVES\n"
              "def P(name):\n    return PRIMITIVES.get(name)\n"
              "a = P('add')\nb = P('mul')\n")
    assert [line for line, _ in lookups_in(helper)] == [3, 4, 5]
    alias = "from anfir.primitives.registry import PRIMITIVES\nP = PRIMITIVES\nx = P['erf']\n"
    assert [line for line, _ in lookups_in(alias)] == [2, 3]
    clean = [
        "from anfir.primitives import arith, nn\nf = (arith.add, nn.softmax)\n",
        "from anfir.primitives.registry import PRIMITIVES\nfams = {p.family for p in PRIMITIVES.values()}\n",
        "d = {}\nx = d['PRIMITIVES']\n",
    ]
    for source in clean:
        assert not lookups_in(source), source

"""No module reaches into another package's private names (issue 23, "attributes canonical once").

The op library canonicalises attributes (padding, stride, axes, eps...) through public,
documented helpers (``conv.padding_attr``, ``nn.axis_attr``, ``shaping.slice_spec``...);
a back end that calls ``conv._pads`` instead depends on an implementation detail the
library may change without notice.  This test reads every module's source with ``ast``
and fails on an import of, or an attribute access to, a ``_private`` name of a module in
another package.  Modules of ``anfir/primitives`` may share their own helpers.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "anfir"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(module: str, known: dict[str, Path]) -> str:
    """The package a module belongs to (a package's ``__init__`` is its own package)."""
    path = known.get(module)
    return module if path is not None and path.name == "__init__.py" else module.rpartition(".")[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(name: str, source: str, known: dict[str, Path]) -> Iterator[str]:
    """``line: what`` for each private name of another package's module that ``source`` uses.

    ``from pkg.mod import _helper`` and ``mod._helper`` (``mod`` bound by an import of an
    anfir module) both count; a module's own package is exempt.
    """
    tree = ast.parse(source)
    own = _package_of(name, known)
    aliases: dict[str, str] = {}  # local name -> the anfir module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = own.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    aliases[alias.asname or alias.name] = full
                elif (_private(alias.name) and base in known
                      and _package_of(base, known) != own):
                    yield f"{node.lineno}: from {base} import {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in known:
                    # `import a.b.c` binds `a`; only `import a.b.c as m` binds the module itself
                    aliases[alias.asname or alias.name.partition(".")[0]] = (
                        alias.name if alias.asname else alias.name.partition(".")[0])
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr)
                and isinstance(node.value, ast.Name) and node.value.id in aliases):
            target = aliases[node.value.id]
            if _package_of(target, known) != own:
                yield f"{node.lineno}: {node.value.id}.{node.attr} ({target})"


def _known_modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def test_no_module_uses_a_private_name_of_another_package() -> None:
    known = _known_modules()
    found = [f"{path.relative_to(ROOT)}:{use}"
             for name, path in known.items() if not name.startswith("anfir.primitives")
             for use in private_uses(name, path.read_text(encoding="utf-8"), known)]
    assert not found, "private names used across packages:\n" + "\n".join(found)


def test_the_check_catches_a_private_call_and_import() -> None:
    # The check must be able to fail: the two forms a back end could use, and the exempt ones.
    known = _known_modules()
    back_end = "anfir.backends.tojax.conv_rules"
    assert list(private_uses(back_end, "from anfir.primitives import conv\nconv._pads(0, 2, 'c')\n",
                             known)) == ["2: conv._pads (anfir.primitives.conv)"]
    assert list(private_uses(back_end, "from anfir.primitives.shaping import _slice\n", known)) \
        == ["1: from anfir.primitives.shaping import _slice"]
    assert list(private_uses(back_end, "import anfir.primitives.nn as nn\nnn._eps(1, 'x')\n",
                             known)) == ["2: nn._eps (anfir.primitives.nn)"]
    # the same package, a dunder and a public helper are fine
    assert not list(private_uses(back_end, "from anfir.backends.tojax import rules\nrules._x()\n"
                                 "from anfir.primitives import conv\nconv.padding_attr(0, 2, 'c')\n"
                                 "conv.__name__\n", known))

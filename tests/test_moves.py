"""The small moves of issue 23, kept: type-only imports point down too, no pass imports the
pipeline that imports every pass, and the core decides by primitive object, not by name.

``tests/test_layers.py`` skips ``if TYPE_CHECKING:`` blocks (annotations only); these
checks read them as well, because a type-only import still says which layer a module
depends on (``autodiff/rules.py`` once named ``passes.optimize.RewriteContext`` there).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, Iterator

import test_layers as layers

_CORE = ("anfir.autodiff", "anfir.passes", "anfir.eval", "anfir.infer")
"""Where a primitive must be recognised by object (the parser, the ``.ir`` loader, the
registry and the importers are the edges where names are allowed)."""


def all_imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int, bool]]:
    """Like ``test_layers.imports_of``, ``if TYPE_CHECKING:`` blocks included."""
    return layers.imports_of(name, path, known, type_checking=True)


def _graph() -> dict[str, list[tuple[str, int, bool]]]:
    known = layers.modules()
    return {name: sorted(set(all_imports(name, path, known))) for name, path in known.items()}


def test_type_only_imports_point_down_too() -> None:
    upward = [f"{name}:{line} imports {target}"
              for name, targets in _graph().items() for target, line, _ in targets
              if target != "anfir" and layers.layer_of(target) > layers.layer_of(name)]
    assert not upward, "imports (type-only included) that point up:\n" + "\n".join(upward)


def test_the_passes_form_no_import_loop_even_for_types() -> None:
    # Every pass takes a Program; it lives in passes/compile_state.py, which imports no pass,
    # so pipeline.py (which imports every pass) is imported by no phase's module.
    graph = {name: [t for t, _, inside in targets if not inside and t.startswith("anfir.passes")]
             for name, targets in _graph().items() if name.startswith("anfir.passes")}
    assert layers.find_cycle(graph) is None, layers.find_cycle(graph)
    assert not [t for t in graph["anfir.passes.compile_state"]], "compile_state.py imports a pass"
    assert "anfir.passes.compile_state" in graph["anfir.passes.inline"]


def _string_set(node: ast.AST, constants: dict[str, ast.AST]) -> bool:
    """Whether ``node`` is a string literal or a collection of them (maybe by a module name)."""
    if isinstance(node, ast.Name) and node.id in constants:
        node = constants[node.id]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
            "frozenset", "set", "tuple") and node.args:
        node = node.args[0]
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return bool(node.elts) and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                       for e in node.elts)
    return False


def decisions_by_name(source: str) -> Iterator[int]:
    """Lines comparing an object's ``.name`` with a string or a set of strings."""
    tree = ast.parse(source)
    constants = {t.id: stmt.value for stmt in tree.body if isinstance(stmt, ast.Assign)
                 for t in stmt.targets if isinstance(t, ast.Name)}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute)
                and node.left.attr == "name"
                and any(_string_set(c, constants) for c in node.comparators)):
            yield node.lineno


def test_the_core_decides_by_primitive_object_not_by_name() -> None:
    found = [f"{path.relative_to(layers.ROOT)}:{line}"
             for name, path in layers.modules().items() if name.startswith(_CORE)
             for line in decisions_by_name(path.read_text(encoding="utf-8"))]
    assert not found, "decisions by a name string:\n" + "\n".join(found)


def test_the_checks_can_fail(tmp_path: Path) -> None:
    known = layers.modules()
    path = tmp_path / "probe.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                    "    from anfir.passes.optimize import X\n", encoding="utf-8")
    assert ("anfir.passes.optimize", 3, False) in set(all_imports("anfir.autodiff.rules", path, known))
    assert layers.layer_of("anfir.passes.optimize") > layers.layer_of("anfir.autodiff.rules")
    assert list(decisions_by_name('E = ("add", "mul")\nif p.name not in E:\n    pass\n')) == [2]
    assert list(decisions_by_name('if prim.name == "add":\n    pass\n')) == [1]
    assert not list(decisions_by_name("E = frozenset({add, mul})\nif p not in E:\n    pass\n"))


# Names that several modules or classes still share, as of issue 23 (each in a different
# layer or back end, where the package path tells them apart).  The list may only shrink:
# a new module or class must not take a name another one already has.
SHARED_MODULE_NAMES = frozenset({"batching.py", "errors.py", "loops.py", "rules.py"})
SHARED_CLASS_NAMES = frozenset({"Continue", "Ctx", "Engine", "Frame", "Importer", "LoweringError",
                                "NameAllocator", "NodeError", "Plan"})


def shared_names() -> tuple[set[str], set[str]]:
    """(module file names, public class names) that occur more than once in the package."""
    files: dict[str, int] = {}
    classes: dict[str, int] = {}
    for path in sorted(layers.PACKAGE.rglob("*.py")):
        if path.name != "__init__.py":
            files[path.name] = files.get(path.name, 0) + 1
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                classes[node.name] = classes.get(node.name, 0) + 1
    return {n for n, c in files.items() if c > 1}, {n for n, c in classes.items() if c > 1}


ROOM_ROLES = frozenset({"common.py", "importer.py", "exporter.py"})
"""What a file is for in a room of its own (interop/onnx/, interop/torch/, interop/mindir/...)."""


def room_names() -> frozenset[str]:
    """Names the rooms share by design (issue 23): a rule file is named after the op
    library's family module it serves (``nn.py`` is how nn's primitives reach ONNX, Core
    ML, JAX...), and a room's parts after their role."""
    return frozenset(p.name for p in (layers.PACKAGE / "primitives").glob("*.py")) | ROOM_ROLES


def test_no_new_shared_module_or_class_name() -> None:
    modules, classes = shared_names()
    # values.py (run-time, abstract, traced) and Closure (run-time, flattened) were ambiguous
    assert "values.py" not in modules and "Closure" not in classes
    modules -= room_names()
    assert modules <= SHARED_MODULE_NAMES, sorted(modules - SHARED_MODULE_NAMES)
    assert classes <= SHARED_CLASS_NAMES, sorted(classes - SHARED_CLASS_NAMES)
    from anfir import runtime_values
    from anfir.flat import flatten
    assert flatten.FlatClosure is not runtime_values.Closure
    assert (layers.PACKAGE / "backends" / "tojax" / "traced.py").is_file()


def test_the_name_check_can_fail(tmp_path: Path, monkeypatch: Any) -> None:
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "values.py").write_text("class Closure:\n    pass\n", encoding="utf-8")
    monkeypatch.setattr(layers, "PACKAGE", tmp_path)
    assert shared_names() == ({"values.py"}, {"Closure"})


def _wiring_assignments(source: str) -> list[str]:
    """The targets ``install()`` in wiring's ``source`` assigns, as text; AssertionError
    when it does anything but assign ``UPCALLS.<slot> = ...``."""
    tree = ast.parse(source)
    install = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "install")
    slots = []
    for stmt in install.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # the docstring
        assert isinstance(stmt, ast.Assign) and len(stmt.targets) == 1, ast.unparse(stmt)
        target = stmt.targets[0]
        assert (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                and target.value.id == "UPCALLS"), ast.unparse(stmt)
        slots.append(target.attr)
    return slots


def test_every_up_call_is_an_upcalls_slot_filled_once_by_wiring() -> None:
    from anfir.ir.upcalls import UPCALLS, Upcalls
    import anfir  # noqa: F401  (wires the layers)
    declared = [name for name in vars(Upcalls) if not name.startswith("_")]
    filled = _wiring_assignments((layers.PACKAGE / "wiring.py").read_text(encoding="utf-8"))
    assert sorted(filled) == sorted(declared) and len(set(filled)) == len(filled)
    assert all(getattr(UPCALLS, name) is not getattr(Upcalls, name) for name in declared)
    # No other mechanism: nothing assigns a meta function's generator or registers a caller
    # from outside its declaration.
    other = [f"{path.relative_to(layers.ROOT)}:{node.lineno}"
             for path in sorted(layers.PACKAGE.rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Assign) and any(
                 isinstance(t, ast.Attribute) and t.attr in ("generate", "generate_for_types")
                 for t in node.targets)]
    assert not other, other


def test_the_wiring_check_can_fail() -> None:
    try:
        _wiring_assignments("def install():\n    meta.grad.generate = g\n")
    except AssertionError as error:
        assert "meta.grad.generate" in str(error)
    else:
        raise AssertionError("an assignment to a meta function passed")
    assert _wiring_assignments('def install():\n    """doc"""\n    UPCALLS.a = f\n') == ["a"]


def documented_tables() -> list[tuple[str, list[str], list[str]]]:
    """(who, table names, module paths) per row of architecture.md's "tables keyed by
    primitive object" section."""
    text = (layers.ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("### The tables keyed by primitive object", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or cells[0] in ("who", "---"):
            continue
        names = [n for n in re.findall(r"`([A-Z_]+)`", cells[1])]
        modules = re.findall(r"`([a-z_/]+\.py)`", cells[2])
        rows.append((cells[0], names, modules))
    return rows


def test_the_documented_tables_exist_where_the_doc_says() -> None:
    rows = documented_tables()
    assert len(rows) >= 12
    missing = []
    for who, names, modules in rows:
        folder = None
        paths = []
        for module in modules:  # a bare file name is in the folder of the row's previous one
            path = layers.PACKAGE / module if "/" in module or folder is None else folder / module
            folder = path.parent
            paths.append(path)
        assert paths and all(p.is_file() for p in paths), (who, modules)
        defined = set()
        for path in paths:
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                targets = (node.targets if isinstance(node, ast.Assign)
                           else [node.target] if isinstance(node, ast.AnnAssign) else [])
                defined |= {t.id for t in targets if isinstance(t, ast.Name)}
        missing += [f"{who}: {name}" for name in names if name not in defined]
    assert not missing, "tables the doc names that its modules do not define:\n" + "\n".join(missing)

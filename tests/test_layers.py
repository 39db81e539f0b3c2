"""The package's layers point one way (docs/architecture.md), lazy imports included.

Every ``import`` of an anfir module is read from the source (module level and
inside functions alike; ``if TYPE_CHECKING:`` blocks are type annotations only
and are skipped) and checked against the layer table: a module may import its
own layer and those below, never one above.  The module graph must have no
cycle, and the function-level imports that remain are an explicit, commented
allow-list.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator, Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "anfir"

LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("anfir.errors", "anfir.location", "anfir.dtypes", "anfir.nested", "anfir.gcpause",
              "anfir.limits")),
    ("ir", ("anfir.ir", "anfir.runtime_values")),
    ("abstract", ("anfir.abstract",)),
    ("op library", ("anfir.primitives",)),
    ("inference", ("anfir.infer",)),
    ("front ends", ("anfir.grammar", "anfir.loading")),
    ("printers", ("anfir.printers",)),
    ("evaluator", ("anfir.eval",)),
    ("autodiff", ("anfir.autodiff",)),
    ("passes", ("anfir.passes", "anfir.decompositions")),
    ("flat program", ("anfir.flat",)),
    ("interop and back ends", ("anfir.interop", "anfir.backends", "anfir.lowlevel")),
    ("top", ("anfir.wiring", "anfir.cli", "anfir.__main__", "anfir")),
]
"""Bottom to top.  A module belongs to the first entry whose prefix names it."""

FUNCTION_LEVEL_ALLOWED: dict[tuple[str, str], str] = {
    ("anfir.ir.graph", "anfir.ir.walk"):
        "FuncGraph.nodes() is the walk's toposort, and the walk is built on FuncGraph",
    ("anfir.ir.nodes", "anfir.ir.graph"):
        "ValueNode's repr names a graph constant; graphs are made of nodes",
    ("anfir.backends.tojax", "anfir.backends.tojax.function"):
        "the JAX back end's modules import jax; `import anfir` loads only its jax-free surface",
    ("anfir.backends.tojax", "anfir.backends.tojax.stablehlo"):
        "the JAX back end's modules import jax; `import anfir` loads only its jax-free surface",
}
"""(importer, imported) pairs allowed inside a function, with the reason."""


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def layer_of(module: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + ".") and prefix != "anfir":
                return index
    raise AssertionError(f"{module} is in no layer of the table: add it to LAYERS")


def _type_checking_block(node: ast.AST) -> bool:
    return (isinstance(node, ast.If) and isinstance(node.test, ast.Name)
            and node.test.id == "TYPE_CHECKING")


def imports_of(name: str, path: Path, known: dict[str, Path],
               type_checking: bool = False) -> Iterator[tuple[str, int, bool]]:
    """(imported module, line, inside a function?) for each anfir import in ``path``
    (with ``type_checking``, those of ``if TYPE_CHECKING:`` blocks too)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, in_function = stack.pop()
        if not type_checking and _type_checking_block(node):
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            while target not in known and "." in target:
                target = target.rpartition(".")[0]
            if target in known and target != name:
                yield target, node.lineno, in_function  # type: ignore[attr-defined]
        nested = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        stack.extend((child, nested) for child in ast.iter_child_nodes(node))


def import_graph() -> dict[str, list[tuple[str, int, bool]]]:
    known = modules()
    return {name: sorted(set(imports_of(name, path, known))) for name, path in known.items()}


def test_every_import_points_down() -> None:
    upward = []
    for name, targets in import_graph().items():
        for target, line, _ in targets:
            if target == "anfir" and name != "anfir":
                upward.append(f"{name}:{line} imports the package root")
            elif layer_of(target) > layer_of(name):
                upward.append(f"{name}:{line} ({LAYERS[layer_of(name)][0]}) imports {target} "
                              f"({LAYERS[layer_of(target)][0]})")
    assert not upward, "imports that point up:\n" + "\n".join(upward)


def test_function_level_imports_are_the_allowed_few() -> None:
    lazy = sorted((name, target, line) for name, targets in import_graph().items()
                  for target, line, inside in targets if inside)
    unexplained = [f"{name}:{line} imports {target}" for name, target, line in lazy
                   if (name, target) not in FUNCTION_LEVEL_ALLOWED]
    assert not unexplained, "function-level imports not in the allow-list:\n" + "\n".join(unexplained)
    assert len(lazy) <= 15


def find_cycle(graph: dict[str, list[str]]) -> Optional[list[str]]:
    """A cycle of ``graph`` as a list of nodes, or None (iterative DFS)."""
    state: dict[str, int] = {}
    for start in sorted(graph):
        if start in state:
            continue
        path: list[str] = []
        stack: list[tuple[str, Iterator[str]]] = [(start, iter(graph[start]))]
        state[start] = 1
        path.append(start)
        while stack:
            node, children = stack[-1]
            for child in children:
                if state.get(child) == 1:
                    return path[path.index(child):] + [child]
                if child not in state:
                    state[child] = 1
                    path.append(child)
                    stack.append((child, iter(graph.get(child, []))))
                    break
            else:
                stack.pop()
                state[node] = 2
                path.pop()
    return None


def test_no_import_cycle_between_modules() -> None:
    graph = {name: [t for t, _, inside in targets if not inside]
             for name, targets in import_graph().items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_cycle_between_layers_with_lazy_imports_counted() -> None:
    graph: dict[str, list[str]] = {}
    for name, targets in import_graph().items():
        for target, _, _ in targets:
            a, b = LAYERS[layer_of(name)][0], LAYERS[layer_of(target)][0]
            if a != b:
                graph.setdefault(a, []).append(b)
                graph.setdefault(b, [])
    assert find_cycle(graph) is None


def test_the_layer_check_catches_an_upward_import(tmp_path: Path) -> None:
    # The check must be able to fail: an IR module importing the printers is upward.
    assert layer_of("anfir.ir.graph") < layer_of("anfir.printers.text")
    assert layer_of("anfir.primitives.meta") < layer_of("anfir.autodiff.runtime")
    assert find_cycle({"a": ["b"], "b": ["a"]}) == ["a", "b", "a"]


_PROGRAM = ROOT / "examples" / "power.anf"


def _compile_in_fresh_interpreter(tmp_path: Path, first: str) -> dict[str, bytes]:
    out = tmp_path / first.replace(" ", "_")
    script = (
        "import importlib, pkgutil, sys\n"
        f"{first}\n"
        "import anfir\n"
        f"anfir.compile(anfir.load({str(_PROGRAM)!r}), entry='dpower', args=[3.0], dump_dir={str(out)!r})\n"
    )
    env = dict(os.environ, PYTHONHASHSEED="0")
    subprocess.run([sys.executable, "-c", script], check=True, cwd=ROOT, env=env)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_dumps_do_not_depend_on_what_was_imported_first(tmp_path: Path) -> None:
    only_anfir = _compile_in_fresh_interpreter(tmp_path, "pass")
    everything = _compile_in_fresh_interpreter(
        tmp_path,
        "import anfir.passes.optimize, anfir.autodiff.rules, anfir.autodiff.typing\n"
        "[importlib.import_module(m.name) for m in pkgutil.walk_packages("
        "importlib.import_module('anfir').__path__, 'anfir.')]")
    assert only_anfir.keys() == everything.keys() and len(only_anfir) >= 14
    for name in only_anfir:
        assert only_anfir[name] == everything[name], name


@pytest.mark.parametrize("module", ["anfir.ir.graph", "anfir.primitives.meta", "anfir.infer.engine",
                                    "anfir.passes.optimize"])
def test_importing_a_submodule_first_wires_the_layers(module: str) -> None:
    code = (f"import {module}\n"
            "from anfir.ir.upcalls import UPCALLS\n"
            "from anfir.primitives import meta\n"
            "assert meta.grad.generate is not None\n"
            "import anfir\n"
            "m = anfir.parse('def f(x) = x * x')\n"
            "assert str(m['f']).strip().endswith('x * x'), str(m['f'])\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def _hard_dependencies() -> frozenset[str]:
    """The import names of pyproject's core dependencies, plus json (stdlib, always there)."""
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as handle:
        deps = tomllib.load(handle)["project"]["dependencies"]
    names = {re.split(r"[<>=!~ \[;]", dep, maxsplit=1)[0].strip().replace("-", "_") for dep in deps}
    return frozenset(names | {"json"})


def function_level_hard_imports(source: str, hard: frozenset[str]) -> list[int]:
    """Lines of ``source`` that import a hard dependency inside a function."""
    tree = ast.parse(source)
    found = []
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    while stack:
        node, in_function = stack.pop()
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        if in_function and any(n.partition(".")[0] in hard for n in names):
            found.append(node.lineno)  # type: ignore[attr-defined]
        nested = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        stack.extend((child, nested) for child in ast.iter_child_nodes(node))
    return sorted(found)


def test_hard_dependencies_are_imported_at_module_level() -> None:
    # numpy, sympy, lark, ml_dtypes, scipy (and json) are always installed: importing one
    # inside a function only hides a module's dependencies (optional packages — torch,
    # onnx, jax, coremltools — stay lazy: `import anfir` must work without them).
    hard = _hard_dependencies()
    assert {"numpy", "sympy", "lark", "json"} <= hard and "torch" not in hard
    lazy = [f"{path.relative_to(ROOT)}:{line}" for path in sorted(PACKAGE.rglob("*.py"))
            for line in function_level_hard_imports(path.read_text(encoding="utf-8"), hard)]
    assert not lazy, "function-level imports of hard dependencies:\n" + "\n".join(lazy)
    assert function_level_hard_imports("def f():\n    import numpy as np\n    import torch\n",
                                       hard) == [2]


# -- the rooms of interop (issue 23): packages that mirror primitives/ ----------------------------

ROOMS: dict[str, str] = {
    "anfir.interop.onnx": "the ONNX importer, its rules by family, the Backend",
    "anfir.interop.onnx.import_rules": "ONNX import rules, one module per primitive family",
    "anfir.interop.onnx.export_rules": "ONNX export rules, one module per primitive family",
    "anfir.interop.torch": "the torch.export importer",
    "anfir.interop.torch.rules": "torch.export rules, one module per primitive family",
    "anfir.interop.mindir": "MindSpore's .mindir format",
    "anfir.interop.mindir.export_rules": "MindIR export rules, one module per primitive family",
    "anfir.interop.coreml": "the Core ML (MIL) exporter",
    "anfir.interop.coreml.export_rules": "Core ML (MIL) export rules, one module per primitive family",
}
"""The packages of ``anfir/interop`` and what each holds."""

RULE_ROOMS = {"anfir.interop.onnx.import_rules": {"control"}, "anfir.interop.torch.rules": set(),
              "anfir.interop.onnx.export_rules": set(), "anfir.interop.coreml.export_rules": set(),
              "anfir.interop.mindir.export_rules": set()}
"""Rule packages whose modules are named after ``anfir/primitives/`` modules (plus the
named extras; ``control`` holds ONNX's If/Loop/Scan, built on ``structure.switch``)."""


def test_every_interop_package_is_a_known_room_in_the_architecture_doc() -> None:
    packages = sorted(name for name, path in modules().items()
                      if path.name == "__init__.py" and name.startswith("anfir.interop."))
    assert packages == sorted(ROOMS), packages
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    for name in ROOMS:
        assert "`" + name.replace("anfir.", "", 1).replace(".", "/") + "/" in doc, name


def test_rule_rooms_mirror_the_op_library_and_list_every_family() -> None:
    import importlib
    primitives = {p.stem for p in (PACKAGE / "primitives").glob("*.py")}
    for package, extras in RULE_ROOMS.items():
        folder = PACKAGE.joinpath(*package.split(".")[1:])
        families = {p.stem for p in folder.glob("*.py")} - {"__init__", "common"}
        assert families - extras <= primitives, (package, families - extras - primitives)
        # Each family module is in the package's fixed FAMILIES order exactly once, so
        # none is left out of the table and none depends on being imported first.
        order = importlib.import_module(package).FAMILIES
        assert len(order) == len(families), (package, len(order), sorted(families))
        for family in families:
            module = importlib.import_module(f"{package}.{family}")
            member = module.RULES if hasattr(module, "RULES") else module.rules
            assert sum(entry is member for entry in order) == 1, (package, family)


def test_interop_modules_import_absolutely() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("onnx")
    # A relative import could reach anfir.interop.torch (or .onnx) for `torch`; absolute
    # imports always get PyTorch and onnx, whatever imports first.
    relative = [f"{name}:{node.lineno}" for name, path in modules().items() if name.startswith("anfir.interop")
                for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(node, ast.ImportFrom) and node.level]
    assert not relative, relative
    code = ("import anfir.interop.torch.importer as imp, anfir.interop.onnx.backend\n"
            "torch = imp.require_torch()\n"
            "assert torch.__name__ == 'torch' and hasattr(torch, 'export'), torch\n"
            "import onnx\n"
            "assert hasattr(onnx, 'ModelProto'), onnx\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)

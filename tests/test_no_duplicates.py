"""Issue 23's first done-when, checked without an external tool: no run of six or more
lines of the same shape is shared between two back ends' rule files.

A line's *shape* is its tokens with every name, number and string replaced by a
placeholder (keywords and operators kept), as a duplicate-code finder compares
them; blank lines, comments, docstring-only lines, lone punctuation and imports
are passed over.  Two files share a run when six consecutive kept lines of one
have the shapes of six consecutive kept lines of the other.  The back ends are
the exporters and back ends that each write every primitive their own way (ONNX,
Core ML, JAX, the low level, MindSpore); what they share (the decomposition
table, the flat program, the shared kernels) lives once, below them.
"""

from __future__ import annotations

import functools
import io
import keyword
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "anfir"

RUN = 6
"""How many consecutive lines of the same shape make a duplicate (the issue's figure)."""

PLACES = 8
"""A window of lines standing in more places than this over the package is a pattern, not
a copy (as the duplicate finder the issue names counts it)."""

BACK_ENDS: dict[str, tuple[str, ...]] = {
    "onnx": ("interop/onnx/exporter.py",
             *(f"interop/onnx/export_rules/{family}.py"
               for family in ("common", "arith", "elementwise", "tensor", "reduce", "shaping", "indexing",
                              "nn", "conv", "structure", "gradient"))),
    "coreml": ("interop/coreml/exporter.py",
               *(f"interop/coreml/export_rules/{family}.py"
                 for family in ("common", "arith", "elementwise", "tensor", "reduce", "shaping", "indexing",
                                "nn", "conv", "structure", "gradient"))),
    "jax": ("backends/tojax/rules.py", "backends/tojax/shaping_rules.py",
            "backends/tojax/conv_rules.py", "backends/tojax/loop_rules.py",
            "backends/tojax/batching_rules.py", "backends/tojax/collective_rules.py"),
    "lowlevel": ("lowlevel/rules.py",),
    "mindir": ("interop/mindir/exporter.py",),
}
"""Each back end's rule files (relative to the package)."""

_SKIPPED_TOKENS = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                   tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}


def line_shapes(text: str) -> list[tuple[int, str]]:
    """The kept lines of ``text`` as (line number, shape), in order."""
    by_line: dict[int, list[str]] = {}
    depth_at: dict[int, int] = {}  # the bracket depth where each line's first token stands
    depth = 0
    fstring_depth = 0  # an f-string's pieces (Python 3.12 tokenizes inside it) are one string
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        name = tokenize.tok_name[tok.type]
        if name == "FSTRING_START":
            fstring_depth += 1
            if fstring_depth == 1:
                by_line.setdefault(tok.start[0], []).append("S")
            continue
        if name == "FSTRING_END":
            fstring_depth -= 1
            continue
        if fstring_depth or tok.type in _SKIPPED_TOKENS:
            continue
        if tok.type == tokenize.NAME:
            word = tok.string if keyword.iskeyword(tok.string) else "N"
        elif tok.type == tokenize.NUMBER:
            word = "0"
        elif tok.type == tokenize.STRING:
            word = "S"
        else:
            word = tok.string
        depth_at.setdefault(tok.start[0], depth)
        depth += (word in "([{") - (word in ")]}") if tok.type == tokenize.OP else 0
        by_line.setdefault(tok.start[0], []).append(word)
    kept: list[tuple[int, str]] = []
    for number in sorted(by_line):
        words = by_line[number]
        if words[0] in ("import", "from") or words == ["S"]:
            continue  # imports and docstring lines are not code
        if all(not (w[0].isalnum() or w[0] == "_") for w in words):
            continue  # lone punctuation: ")", "],", "}:"
        if depth_at.get(number, 0) and (words[1:2] == [":"] or words[1:4] == [".", "N", ":"]):
            continue  # a row of a table literal (``arith.add: binary("Add"),``): data, not logic
        kept.append((number, " ".join(words)))
    return kept


def windows_of(lines: list[tuple[int, str]], run: int = RUN) -> dict[tuple[str, ...], list[int]]:
    """Each window of ``run`` consecutive kept lines' shapes → the line numbers it starts at."""
    windows: dict[tuple[str, ...], list[int]] = {}
    for i in range(len(lines) - run + 1):
        windows.setdefault(tuple(s for _, s in lines[i:i + run]), []).append(lines[i][0])
    return windows


def shared_runs(a: list[tuple[int, str]], b: list[tuple[int, str]], run: int = RUN,
                common: frozenset[tuple[str, ...]] = frozenset()) -> list[tuple[int, int]]:
    """The line numbers (in ``a``, in ``b``) where ``run`` consecutive kept lines of ``a``
    and ``b`` have the same shapes, except the windows in ``common``."""
    in_b = windows_of(b, run)
    return [(i, j) for window, starts in windows_of(a, run).items() if window not in common
            for i in starts for j in in_b.get(window, ())]


def too_common(files: list[list[tuple[int, str]]], run: int = RUN) -> frozenset[tuple[str, ...]]:
    """The windows that stand in more than :data:`PLACES` places over ``files``: rows of a
    table (``arith.add: binary("Add"),`` ...) or a writer's idiom, not a copied piece."""
    count: dict[tuple[str, ...], int] = {}
    for lines in files:
        for window, starts in windows_of(lines, run).items():
            count[window] = count.get(window, 0) + len(starts)
    return frozenset(w for w, n in count.items() if n > PLACES)


@functools.lru_cache(maxsize=1)
def _shapes() -> dict[str, list[tuple[int, str]]]:
    return {path: line_shapes((ROOT / path).read_text(encoding="utf-8"))
            for files in BACK_ENDS.values() for path in files}


@functools.lru_cache(maxsize=1)
def _common() -> frozenset[tuple[str, ...]]:
    """The windows too common over the whole package to count as a copy."""
    return too_common([line_shapes(p.read_text(encoding="utf-8"))
                       for p in sorted(ROOT.rglob("*.py"))])


def test_the_finder_finds_a_renamed_copy_and_passes_over_what_is_not_code() -> None:
    # The same rule written for two writers, names and constants changed: a run.
    first = (
        "def _sum_to(w, op):\n"
        "    '''doc'''\n"
        "    out = op.results[0]\n"
        "    g_op, x_op = op.args\n"
        "    g = w.tensor(g_op, w.dtype(out))\n"
        "    # a comment\n"
        "    g_shape = _static_shape(w, g_op, 'sum_to')\n"
        "    x_shape = _static_shape(w, x_op, 'sum_to')\n"
        "    if same_static_shape(g_shape, x_shape):\n"
        "        return 1\n"
    )
    second = first.replace("_sum_to", "_other").replace("g_op", "h").replace("'sum_to'", "'x'") \
        .replace("return 1", "return 2")
    a, b = line_shapes(first), line_shapes(second)
    assert [n for n, _ in a] == [1, 3, 4, 5, 7, 8, 9, 10]  # no docstring, no comment
    assert shared_runs(a, b) == [(1, 1), (3, 3), (4, 4)]
    # One line of another shape in each window: no run.
    third = second.replace("x_shape = _static_shape(w, x_op, 'x')", "x_shape = w.shape(x_op)")
    assert shared_runs(a, line_shapes(third)) == []


@pytest.mark.parametrize("left, right", [(l, r) for i, l in enumerate(BACK_ENDS)
                                         for r in list(BACK_ENDS)[i + 1:]])
def test_no_two_back_ends_share_a_run_of_six_lines(left: str, right: str) -> None:
    shapes = _shapes()
    common = _common()
    runs = [f"{pa}:{la} ~ {pb}:{lb}"
            for pa in BACK_ENDS[left] for pb in BACK_ENDS[right]
            for la, lb in shared_runs(shapes[pa], shapes[pb], common=common)]
    assert runs == [], "\n".join(runs)


def test_the_jax_rules_share_no_run_with_the_op_librarys_evaluation() -> None:
    """Where the evaluator's numpy kernel and the JAX rule compute one formula, it is
    written once over an array module (``primitives/*_kernels.py``), not twice."""
    shapes = _shapes()
    library = {str(p.relative_to(ROOT)): line_shapes(p.read_text(encoding="utf-8"))
               for p in sorted((ROOT / "primitives").glob("*.py"))}
    runs = [f"{pa}:{la} ~ {pb}:{lb}" for pa, a in library.items()
            for pb in (*BACK_ENDS["jax"], *BACK_ENDS["lowlevel"])
            for la, lb in shared_runs(a, shapes[pb], common=_common())]
    assert runs == [], "\n".join(runs)

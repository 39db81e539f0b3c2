"""Hostile input (issue 10): one regression test (at least) per class of defect.

Each case once disclosed a file, hung, exhausted memory or leaked a bare
Python exception.  Now every one is a clear AnfirError (located where the
input has a place) or a usage error, within a time bound.  The limits are
those of :mod:`anfir.limits` (documented in docs/language.md, docs/cli.md
and docs/reading-dumps.md).
"""

from __future__ import annotations

import io
import os
import sys
import time
import tracemalloc
import zipfile
from pathlib import Path

import numpy as np
import pytest

import anfir
import anfir.limits as limits
from anfir.cli import format_value, parse_arg
from anfir.errors import (AnfirError, AnfirRuntimeError, AnfirSyntaxError, AnfirTypeError,
                          GradientError, NameResolutionError, UsageError)
from anfir.grammar.ir_loader import load_ir_text, split_location_comment
from anfir.grammar.parser import parse_file, parse_module
from bounded import within
from cli_harness import run_in_process

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def located(error: AnfirError, file: str | None = None) -> AnfirError:
    """``error`` names a line of ``file`` (when given) and shows it with a caret."""
    assert error.loc is not None, error.render()
    assert error.loc.line >= 1 and error.loc.col >= 1
    if file is not None:
        assert error.loc.file.endswith(file), error.render()
    assert "^" in error.render()
    return error


def raises(kind: type, fn, *args, **kwargs) -> AnfirError:
    with pytest.raises(kind) as info:
        fn(*args, **kwargs)
    return info.value


# -- security: imports stay in the program's tree, errors quote only programs -------------
SECRET = "root:x:0:0:the-secret-line"


@pytest.mark.parametrize("path", ["/etc/passwd", "/proc/self/environ", "/dev/stdin", "/dev/zero",
                                  "//server/share/x.anf"])
def test_an_absolute_import_is_refused_before_anything_is_read(tmp_path, path):
    main = tmp_path / "main.anf"
    main.write_text(f'import "{path}"\ndef main() = 1\n')
    with within(10):
        error = located(raises(NameResolutionError, parse_file, str(main)), "main.anf")
    assert "relative" in error.message
    assert error.loc.line == 1 and "root:" not in error.render() and "PATH=" not in error.render()


def test_an_import_leaving_the_tree_is_refused_and_nothing_is_quoted(tmp_path):
    (tmp_path / "secret.anf").write_text(SECRET + "\n")
    (tmp_path / "prog").mkdir()
    main = tmp_path / "prog" / "main.anf"
    main.write_text('import "../secret.anf"\ndef main() = 1\n')
    error = located(raises(NameResolutionError, parse_file, str(main)), "main.anf")
    assert "outside the program's directory tree" in error.message
    assert SECRET not in error.render()
    # A missing file outside the tree is reported the same way (nothing outside is probed).
    main.write_text('import "../nothing_there.anf"\ndef main() = 1\n')
    assert "outside" in raises(NameResolutionError, parse_file, str(main)).message


@pytest.mark.skipif(not hasattr(os, "symlink") or sys.platform == "win32", reason="symlinks")
def test_a_symbolic_link_out_of_the_tree_is_refused(tmp_path):
    (tmp_path / "secret.anf").write_text(SECRET + "\n")
    (tmp_path / "prog").mkdir()
    os.symlink(tmp_path / "secret.anf", tmp_path / "prog" / "lib.anf")
    main = tmp_path / "prog" / "main.anf"
    main.write_text('import "lib.anf"\ndef main() = 1\n')
    error = raises(NameResolutionError, parse_file, str(main))
    assert "outside" in error.message and SECRET not in error.render()


def test_only_anf_files_are_imported(tmp_path):
    (tmp_path / "notes.txt").write_text(SECRET + "\n")
    main = tmp_path / "main.anf"
    main.write_text('import "notes.txt"\ndef main() = 1\n')
    error = located(raises(NameResolutionError, parse_file, str(main)), "main.anf")
    assert ".anf" in error.message and SECRET not in error.render()


def test_text_parsed_from_python_imports_only_below_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "secret.anf").write_text(SECRET + "\n")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    error = raises(NameResolutionError, parse_module, 'import "../secret.anf"\ndef f() = 1')
    assert "outside" in error.message and SECRET not in error.render()


def test_the_search_path_is_explicit(tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "geometry.anf").write_text("def square(x) = x * x\n")
    (tmp_path / "prog").mkdir()
    main = tmp_path / "prog" / "main.anf"
    main.write_text('import "geometry.anf"\ndef main() = square(3)\n')
    monkeypatch.delenv("ANFIR_PATH", raising=False)
    assert "cannot import" in raises(NameResolutionError, parse_file, str(main)).message
    assert anfir.run(parse_file(str(main), search_path=[str(lib)])["main"]) == 9
    monkeypatch.setenv("ANFIR_PATH", str(lib))
    assert anfir.run(anfir.load(str(main))["main"]) == 9
    # The search path is a root too: nothing above it.
    (tmp_path / "secret.anf").write_text(SECRET + "\n")
    (lib / "up.anf").write_text('import "../secret.anf"\ndef g() = 1\n')
    main.write_text('import "up.anf"\ndef main() = g()\n')
    assert "outside" in raises(NameResolutionError, parse_file, str(main)).message


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs")
def test_an_import_of_a_fifo_in_the_tree_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "pipe.anf")
    main = tmp_path / "main.anf"
    main.write_text('import "pipe.anf"\ndef main() = 1\n')
    with within(10):
        error = located(raises(NameResolutionError, parse_file, str(main)), "main.anf")
    assert "not a regular file" in error.message
    with within(10):
        assert "not a regular file" in str(raises(UsageError, anfir.load, str(tmp_path / "pipe.anf")))


def test_an_import_path_with_a_nul_byte_is_a_located_error(tmp_path):
    main = tmp_path / "main.anf"
    main.write_text('import "a\\0b.anf"\ndef main() = 1\n')
    located(raises(NameResolutionError, parse_file, str(main)), "main.anf")


# -- hangs -----------------------------------------------------------------------------------
def test_a_node_using_itself_in_a_dump_is_rejected_at_load():
    for text in ["subgraph @main() {\n  %1 = add(%1, 1)\n  return %1\n}\n",
                 "subgraph @main() {\n  %1 = add(%2, 1)\n  %2 = mul(%1, 2)\n  return %2\n}\n"]:
        with within(10):
            error = located(raises(NameResolutionError, load_ir_text, text, "cyc.ir"), "cyc.ir")
        assert "depends on its own value" in error.message


def test_a_huge_integer_power_is_a_runtime_error_not_a_hang():
    module = anfir.parse("def main() = 10 ** 10 ** 10\ndef ok() = 2 ** 100")
    with within(20):
        error = located(raises(AnfirRuntimeError, anfir.run, module["main"]))
        assert "MAX_INT_BITS" in error.message
        assert anfir.run(module["ok"]) == 2 ** 100
        compiled = anfir.compile(module, entry="main")  # the folder leaves it to run time
        located(raises(AnfirRuntimeError, anfir.run, compiled))


def test_repeated_integer_squaring_is_bounded():
    module = anfir.parse("def sq(x, n) = if n == 0 then x else sq(x * x, n - 1)")
    with within(20):
        assert anfir.run(module["sq"], 3, 5) == 3 ** 32
        error = located(raises(AnfirRuntimeError, anfir.run, module["sq"], 3, 40))
    assert "mul" in error.message


def test_a_huge_dimension_power_in_a_dump_is_refused():
    for dim, words in [("10**10**10", "exponent"), ("N**100000", "exponent"),
                       ("2**63", "too large"), ("N/0", "divided by zero"),
                       ("Mod(N)", "bad dimension")]:
        text = f"subgraph @main(%para1_x) {{\n  param %para1_x : <f64[{dim}]>\n  return %para1_x\n}}\n"
        with within(10):
            error = located(raises(AnfirSyntaxError, load_ir_text, text, "d.ir"), "d.ir")
        assert words in error.message, error.message


@pytest.mark.parametrize("comment", [
    "# " + "a:1:1 (" * 40000,           # many candidate file names, each with an open note
    "# " + ":1" * 140000,               # many colon-number pairs
    "# f:1:1 (" + ")" * 100000 + "x",   # a note that never ends before two blanks
])
def test_location_comments_are_read_in_linear_time(comment):
    text = f"subgraph @main() {{\n  %1 = add(1, 1) {comment}\n  return %1\n}}\n"
    start = time.perf_counter()
    with within(20):
        split_location_comment(comment)
        try:
            anfir.run(load_ir_text(text, "loc.ir")["main"])
        except AnfirError as error:
            located(error, "loc.ir")
    assert time.perf_counter() - start < 10


def test_location_comments_read_as_before():
    assert split_location_comment("# a.anf:3:5 (ad: ◂f)  let x = f(y)") == \
        ("a.anf", "3", "5", "ad: ◂f", "let x = f(y)")
    assert split_location_comment("#C:\\p\\a.anf:1:2") == ("C:\\p\\a.anf", "1", "2", "", "")
    assert split_location_comment("# a:1:2:3  t") == ("a:1", "2", "3", "", "t")
    assert split_location_comment("# no location") is None


def test_a_definition_differentiating_itself_is_an_error_not_a_hang(tmp_path):
    texts = {"grad": "def g(x, y) = x * y + grad(g, 0, 1)(2.0, 0.5)[0]",
             "jvp": "def g(x, y) = x * y + jvp(g)(2.0, 0.5, 1.0, 1.0)[1]",
             "mutual": "def g(x) = h(x)\ndef h(x) = x * grad(g)(x)"}
    for name, text in texts.items():
        module = anfir.parse(text, f"{name}.anf")
        with within(30):
            error = located(raises(GradientError, anfir.run, module["g"], *([1.0] * len(module["g"].parameters))))
        assert "cannot unfold" in error.message, name
    with within(60):
        error = raises(AnfirError, anfir.compile, anfir.parse(texts["mutual"], "m.anf"),
                       entry="g", args=[1.0])
    located(error, "m.anf")


# -- memory: bounded reading -------------------------------------------------------------------
def test_devices_are_not_read():
    with within(10):
        for path in ["/dev/zero", "/dev/stdin"]:
            if os.path.exists(path):
                assert "not a regular file" in str(raises(UsageError, anfir.load, path))
                assert "not a regular file" in str(raises(UsageError, parse_file, path))
        status, _, err = run_in_process(["run", "/dev/zero"], ROOT)
    assert status == 2 and "not a regular file" in err


def test_files_above_the_size_limit_are_refused_before_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MAX_SOURCE_BYTES", 1000)
    big = tmp_path / "big.anf"
    big.write_text("def main() = 1\n" + "# padding\n" * 200)
    error = raises(UsageError, anfir.load, str(big))
    assert "too large" in error.message and "1,000" in error.message
    dump = tmp_path / "big.ir"
    dump.write_text(anfir.dump_ir(anfir.parse("def main() = 1")) + "# padding\n" * 200)
    assert "too large" in raises(UsageError, anfir.load, str(dump)).message
    main = tmp_path / "main.anf"
    main.write_text('import "big.anf"\ndef f() = main()\n')
    error = located(raises(NameResolutionError, parse_file, str(main)), "main.anf")
    assert "too large" in error.message
    assert "too large" in raises(UsageError, parse_module, "x" * 2000).message


def test_a_long_line_of_junk_is_rejected_without_tokenizing_it_whole():
    for junk, kind in [("\0" * 3_000_000, AnfirSyntaxError), ("1 " * 1_500_000, AnfirSyntaxError)]:
        text = "def main() = " + junk
        tracemalloc.start()
        try:
            with within(20):
                located(raises(kind, parse_module, text, "junk.anf"))
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        # The text itself and its split lines: a few times its size; its tokens
        # (tens of bytes each) would be far more.
        assert peak < 8 * len(text) + (16 << 20), peak


def _npz_with_header_only(path: Path, key: str, shape: tuple, data: bytes = b"") -> None:
    """An .npz whose member ``key`` claims ``shape`` (f64) but holds only ``data``."""
    header = io.BytesIO()
    np.lib.format.write_array_header_2_0(header, {"descr": "<f8", "fortran_order": False,
                                                  "shape": shape})
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{key}.npy", header.getvalue() + data)
        archive.writestr("small.npy", _npy_bytes(np.arange(4.0)))


def _npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def test_side_file_arrays_are_read_only_when_used_and_checked_before(tmp_path):
    dump = tmp_path / "d.ir"
    dump.write_text('subgraph @main() {\n  return Tensor[f64, (4,)](npz["small"])\n}\n')
    # The member "huge" claims 40000 x 40000 floats (12.8 GB): never read, never allocated.
    _npz_with_header_only(tmp_path / "d.npz", "huge", (40000, 40000))
    with within(10):
        assert anfir.run(anfir.load(str(dump))["main"]).tolist() == [0.0, 1.0, 2.0, 3.0]
    dump.write_text('subgraph @main() {\n  return Tensor[f64, (3,)](npz["huge"])\n}\n')
    error = located(raises(AnfirSyntaxError, anfir.load, str(dump)), "d.ir")
    assert "the dump says f64[3]" in error.message
    dump.write_text('subgraph @main() {\n  return Tensor[f64, (40000, 40000)](npz["huge"])\n}\n')
    error = located(raises(AnfirSyntaxError, anfir.load, str(dump)), "d.ir")
    assert "MAX_CONSTANT_BYTES" in error.message
    dump.write_text('subgraph @main() {\n  return Tensor[f64, (5,)](npz["short"])\n}\n')
    _npz_with_header_only(tmp_path / "d.npz", "short", (5,), b"\0" * 8)
    assert "header says" in located(raises(AnfirSyntaxError, anfir.load, str(dump))).message


def test_a_side_file_that_is_not_a_zip_is_a_located_error(tmp_path):
    dump = tmp_path / "d.ir"
    dump.write_text('subgraph @main() {\n  return Tensor[f64, (4,)](npz["t0"])\n}\n')
    (tmp_path / "d.npz").write_bytes(b"this is not a zip archive")
    error = located(raises(AnfirSyntaxError, anfir.load, str(dump)), "d.ir")
    assert "not an .npz archive" in error.message


@pytest.mark.parametrize("shape", ["(4294967296, 4294967296)", "(9223372036854775807, 2)",
                                   "(0, 99999999999999999999999)"])
def test_huge_constant_shapes_are_refused_before_allocating(shape):
    text = f"subgraph @main() {{\n  return Tensor[f64, {shape}](0.0)\n}}\n"
    with within(10):
        located(raises(AnfirSyntaxError, load_ir_text, text, "t.ir"), "t.ir")


def test_an_npy_argument_is_checked_before_it_is_read(tmp_path):
    lying = tmp_path / "lie.npy"
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False,
                                                  "shape": (40000, 40000)})
    lying.write_bytes(header.getvalue() + b"\0" * 64)
    with within(10):
        assert "MAX_CONSTANT_BYTES" in raises(UsageError, parse_arg, str(lying)).message
    ok = tmp_path / "ok.npy"
    np.save(ok, np.arange(6).reshape(2, 3))
    assert parse_arg(str(ok)).tolist() == [[0, 1, 2], [3, 4, 5]]
    pickled = tmp_path / "obj.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    assert "cannot be read" in raises(UsageError, parse_arg, str(pickled)).message


# -- no bare Python exceptions -------------------------------------------------------------------
BIG = "1" * 5000


def test_integer_literals_beyond_the_digit_limit_are_located_errors():
    error = located(raises(AnfirSyntaxError, parse_module, f"def main() = {BIG}", "b.anf"), "b.anf")
    assert "4,300 digits" in error.message
    located(raises(AnfirSyntaxError, parse_module, f"def main(t) = t[{BIG}]", "b.anf"))
    located(raises(AnfirSyntaxError, parse_module, f"def main(x: f64[{BIG}]) = x", "b.anf"))
    assert anfir.run(parse_module("def main() = " + "9" * 4300)["main"]) == 10 ** 4300 - 1


@pytest.mark.parametrize("text", [
    f"subgraph @main() {{\n  return {BIG}\n}}\n",
    f"subgraph @main() {{\n  return -{BIG}\n}}\n",
    f"subgraph @main() {{\n  return Tensor[i64, (1,)]([{BIG}])\n}}\n",
    f"subgraph @main(%para1_x) {{\n  param %para1_x : <f64[{BIG}]>\n  return %para1_x\n}}\n",
    f"subgraph @main(%para1_x: f64[{BIG}]) {{\n  return %para1_x\n}}\n",
    f"subgraph @main() {{\n  %1 = add(1, 1) # f:{BIG}:1\n  return %1\n}}\n",
    f"subgraph @main() {{\n  %1 = add(1, 1) : (<Int64 = {BIG}>, <Int64>) -> (<Int64>)\n  return %1\n}}\n",
])
def test_long_integers_in_a_dump_are_located_errors(text):
    located(raises(AnfirError, load_ir_text, text, "big.ir"), "big.ir")


def test_a_long_integer_argument_is_a_usage_error():
    error = raises(UsageError, parse_arg, BIG)
    assert "4,300 digits" in error.message and BIG not in error.message
    status, _, err = run_in_process(["run", "examples/fibonacci.anf", BIG], ROOT)
    assert status == 2 and "internal error" not in err


def test_a_5000_digit_result_prints(tmp_path):
    prog = tmp_path / "big.anf"
    prog.write_text("def main() = 10 ** 4999 + 7\n")
    status, out, err = run_in_process(["run", str(prog)], ROOT)
    assert status == 0, err
    assert out == "1" + "0" * 4998 + "7\n"
    assert format_value(-(10 ** 20000)) == "-1" + "0" * 20000
    assert limits.int_text(10 ** 20000 + 1) == "1" + "0" * 19999 + "1"
    assert len(limits.int_text(3 ** 40000)) == 19085


@pytest.mark.parametrize("constant, words", [
    ("Tensor[i8, (1,)]([300])", "does not fit i8"),
    ("Tensor[u8, (2,)]([1, -1])", "does not fit u8"),
    ("Scalar[u8](-1)", "does not fit u8"),
    ("Scalar[i64](9223372036854775808)", "does not fit i64"),
    ("Scalar[i64](-9223372036854775809)", "does not fit i64"),
    ("Tensor[i32, (1,)]([1.5])", "does not fit i32"),
    ("Tensor[f32, (1,)]([" + "9" * 400 + "])", "too large for f32"),
    ("Tensor[bool, (1,)]([7])", "not a bool"),
])
def test_constants_out_of_their_dtype_range_are_located_errors(constant, words):
    text = f"subgraph @main() {{\n  return {constant}\n}}\n"
    error = located(raises(AnfirTypeError, load_ir_text, text, "r.ir"), "r.ir")
    assert words in error.message


def test_the_largest_values_of_each_dtype_still_load():
    text = ("subgraph @main() {\n  return (Scalar[i64](9223372036854775807), "
            "Scalar[u8](255), Tensor[i8, (2,)]([-128, 127]))\n}\n")
    a, b, c = anfir.run(load_ir_text(text, "ok.ir")["main"])
    assert (int(a), int(b), c.tolist()) == (2 ** 63 - 1, 255, [-128, 127])


# -- API misuse ---------------------------------------------------------------------------------
def test_api_misuse_is_a_usage_error(tmp_path):
    module = anfir.parse("def main(x) = x * 2.0")
    afile = tmp_path / "afile"
    afile.write_text("")
    for call in [lambda: anfir.compile(module, args=[1.0], dump_dir=str(afile)),
                 lambda: anfir.compile(module, args=5),
                 lambda: anfir.compile(module, args="1.0"),
                 lambda: anfir.compile(module, entry=3),
                 lambda: anfir.grad(module["main"], wrt=0.5),
                 lambda: anfir.grad(module["main"], wrt="a"),
                 lambda: anfir.value_and_grad(module["main"], wrt=[0.5]),
                 lambda: anfir.load(None),
                 lambda: anfir.load(b"def f() = 1"),
                 lambda: anfir.load("a\0b.anf"),
                 lambda: anfir.parse(None)]:
        with pytest.raises(UsageError):
            call()


def test_a_dump_directory_that_cannot_be_made_is_a_usage_error(tmp_path):
    (tmp_path / "file").write_text("")
    module = anfir.parse("def main(x) = x * 2.0")
    with pytest.raises(UsageError):
        anfir.compile(module, args=[1.0], dump_dir=str(tmp_path / "file" / "sub"))


def test_a_gradient_with_respect_to_a_string_is_an_error():
    module = anfir.parse('def f(x, s) = x * 2.0\ndef main() = grad(f, 1)(1.0, "s")', "s.anf")
    for fn in [lambda: anfir.run(module["main"]),
               lambda: anfir.run(anfir.grad(module["f"], 1), 1.0, "s"),
               lambda: anfir.run(anfir.compile(module, entry="main"))]:
        error = located(raises(GradientError, fn))
        assert "string" in error.message


@pytest.mark.parametrize("source, entry, args", [
    ("def f(a) = lambda (x) a(x) end", "f", [2.0]),
    (str(EXAMPLES / "closures.anf"), "compose", [2.0, 3.0]),
    (str(EXAMPLES / "closures.anf"), "twice", [2.0]),
])
def test_a_closure_never_called_and_ill_typed_compiles(source, entry, args):
    module = anfir.load(source) if source.endswith(".anf") else anfir.parse(source)
    compiled = anfir.compile(module, entry=entry, args=args)  # no "invalid IR"
    closure = anfir.run(compiled, *args)
    # Calling it fails at run time, located, as anfir.run of the source does.
    with pytest.raises(AnfirTypeError):
        anfir.run(closure, 1.0)


@pytest.mark.parametrize("name", ["env_getitem(1, 2, 3)", "J(1)", "gadd(1, 2)", "newenv()",
                                  "grad_seed(1.0)"])
def test_internal_primitives_are_not_part_of_the_language(name):
    error = located(raises(NameResolutionError, parse_module, f"def main() = {name}", "i.anf"))
    assert "internal primitive" in error.message


def test_internal_primitives_still_load_from_dumps_and_serve_gradient_rules(tmp_path):
    module = anfir.load(str(EXAMPLES / "power.anf"))
    anfir.compile(module, entry="dpower", args=[3.0], dump_dir=str(tmp_path))
    ad = next(tmp_path.glob("*_ad.ir"))
    text = ad.read_text()
    assert any(f"{name}(" in text for name in ("env_getitem", "grad_seed", "J", "sum_to"))
    assert anfir.run(anfir.load(str(ad)), 3.0) == pytest.approx(27.0)
    # A parse-phase dump names globals: an internal one is an unknown name there too.
    bad = "subgraph @main() {\n  %1 = Symbol(env_getitem)(1, 2, 3)\n  return %1\n}\n"
    status, _, err = run_in_process(["run", _write(tmp_path / "bad.ir", bad)], ROOT)
    assert status == 1 and "bad.ir:2:15" in err and "internal primitive" in err


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("text, words", [("def main() = not 1.5", "needs bools"),
                                         ("def main() = 1 and 2", "needs bools"),
                                         ("def main(x) = x or true", "needs bools")])
def test_logic_on_numbers_is_a_type_error(text, words):
    module = anfir.parse(text, "l.anf")
    args = [1] if module["main"].parameters else []
    assert words in located(raises(AnfirTypeError, anfir.run, module["main"], *args)).message
    located(raises(AnfirTypeError, anfir.compile, module, args=args or None))
    assert anfir.run(anfir.parse("def main() = not (1 < 2) or true and false")["main"]) is False


# -- errors from crafted dumps name their line -------------------------------------------------------
@pytest.mark.parametrize("body, kind, words", [
    ("  %1 = Symbol(__import__)(1)\n  return %1", NameResolutionError, "unknown name '__import__'"),
    ("  return DType(O)", AnfirTypeError, "unknown dtype O"),
    ("  %1 = Closure(@f, (1, 2))(3)\n  return %1", AnfirTypeError, "captures 2 values"),
    ("  %1 = 3(4)\n  return %1", AnfirTypeError, "not a function"),
    ('  %1 = "s"(4)\n  return %1', AnfirTypeError, "not a function"),
])
def test_crafted_dump_errors_are_located(tmp_path, body, kind, words):
    text = ("# Definitions: f=@f main=@main\nsubgraph @f(%para1_x) {\n  return %para1_x\n}\n"
            "subgraph @main() {\n" + body + "\n}\n")
    path = _write(tmp_path / "c.ir", text)
    with pytest.raises(kind) as info:
        module = anfir.load(path)
        anfir.grammar.resolve.resolve_module(module)
        anfir.run(module["main"])
    located(info.value, "c.ir")
    assert words in info.value.message
    status, _, err = run_in_process(["run", path, "--entry", "main"], ROOT)
    assert status == 1 and "c.ir:" in err and "internal error" not in err


# -- run-time recursion depth ----------------------------------------------------------------------
def test_a_recursion_that_never_ends_is_a_runtime_error(monkeypatch):
    module = anfir.parse("def f(n) = 1 + f(n + 1)\ndef g(n) = if n == 0 then 0 else 1 + g(n - 1)",
                         "r.anf")
    monkeypatch.setattr(limits, "MAX_CALL_DEPTH", 20_000)
    with within(30):
        error = located(raises(AnfirRuntimeError, anfir.run, module["f"], 0), "r.anf")
    assert "recursion too deep" in error.message and "20,000" in error.message
    assert anfir.run(module["g"], 19_000) == 19_000  # a frame per level (the if is a tail call)
    located(raises(AnfirRuntimeError, anfir.run, module["g"], 21_000))
    # The depth is read when a run starts: raising the limit lets deeper runs through.
    monkeypatch.setattr(limits, "MAX_CALL_DEPTH", 30_000)
    assert anfir.run(module["g"], 21_000) == 21_000


def test_the_default_depth_limit_is_generous():
    assert limits.MAX_CALL_DEPTH >= 500_000  # 50,000-deep recursions (tests) need ~100,000 frames


def test_the_command_line_sets_the_depth_limit(tmp_path):
    prog = _write(tmp_path / "r.anf", "def f(n) = 1 + f(n + 1)\n")
    status, _, err = run_in_process(["run", prog, "0", "--max-depth", "500"], ROOT)
    assert status == 1 and "more than 500 nested calls" in err
    assert limits.MAX_CALL_DEPTH == 1_000_000  # restored after the command
    status, _, err = run_in_process(["run", prog, "0", "--max-depth", "0"], ROOT)
    assert status == 2


# -- deep nesting in crafted input: no recursion on its size -------------------------------------
DEEP = 5000


@pytest.mark.parametrize("text", [
    "def main(x: " + "(" * DEEP + "f64" + ",)" * DEEP + ") = x",
    "def main() = " + "(" * DEEP + "1" + ",)" * DEEP,
])
def test_deeply_nested_annotations_and_tuples_are_handled_without_recursion(text):
    module = anfir.parse(text)
    anfir.to_text(module)
    compiled = anfir.compile(module, args=None if not module["main"].parameters else None)
    anfir.dump_ir(compiled)


@pytest.mark.parametrize("text, words", [
    ("subgraph @main(%para1_x: " + "(" * DEEP + "f64" + ",)" * DEEP + ") {\n  return %para1_x\n}\n",
     None),
    ("subgraph @main() {\n  return " + "Partial(" * DEEP + "add" + ", 1)" * DEEP + "\n}\n", None),
    ("subgraph @main(%para1_x) {\n  param %para1_x : <Func " + "J(" * DEEP + "add" + ")" * DEEP
     + ">\n  return %para1_x\n}\n", "more than 100 deep"),
])
def test_deeply_nested_dump_values_load_or_fail_cleanly(text, words):
    if words is None:
        module = load_ir_text(text, "deep.ir")
        anfir.dump_ir(module)
        anfir.to_text(module)
    else:
        assert words in located(raises(AnfirSyntaxError, load_ir_text, text, "deep.ir")).message


def test_compiling_a_huge_constant_tensor_does_not_allocate_it():
    module = anfir.parse("def main() = sum(ones((12000, 12000)))\ndef small() = sum(ones((2, 3)))")
    tracemalloc.start()
    try:
        with within(30):
            anfir.compile(module, entry="main")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 << 20, peak  # the tensor would be 1.1 GB
    assert anfir.run(anfir.compile(module, entry="small")) == 6.0
    error = located(raises(AnfirRuntimeError, anfir.run,
                           anfir.parse("def main() = ones((99999, 99999))")["main"]))
    assert "allocate" in error.message

"""Bad ANF input: every error is an AnfirError subclass, located, with a caret line."""

from __future__ import annotations

import pytest

from anfir.errors import (AnfirError, AnfirSyntaxError, AnfirTypeError, ArityError,
                          DuplicateDefinitionError, NameResolutionError, UsageError)
from anfir.grammar.parser import parse_file, parse_module
from anfir.grammar.resolve import resolve_module


def check(error: AnfirError, line: int, col: int, *words: str) -> None:
    """``error`` is at ``line``:``col``, renders its line with a caret there, and says ``words``."""
    assert isinstance(error, AnfirError)
    assert error.loc is not None
    assert (error.loc.line, error.loc.col) == (line, col)
    rendered = error.render()
    assert rendered.startswith(f"{error.loc.file}:{line}:{col}: ")
    lines = rendered.splitlines()
    caret = " " * (4 + col - 1) + "^"
    assert caret in lines, rendered
    assert error.loc.line_text  # the offending line is known and shown above the caret
    assert lines[lines.index(caret) - 1] == error.loc.excerpt().splitlines()[0]
    for word in words:
        assert word in rendered, rendered


def fails(text: str, kind: type, engine: str = "tables") -> AnfirError:
    with pytest.raises(kind) as info:
        parse_module(text, "bad.anf", engine=engine)
    return info.value


# -- syntax ------------------------------------------------------------------------

@pytest.mark.parametrize("engine", ["tables", "lark"])
@pytest.mark.parametrize("text, line, col, message", [
    ("def f(x) = let y = x y", 1, 22, "expected 'in' or an operator, found 'y'"),
    ("def f(x) =", 1, 11, "expected an expression, found the end of the file"),
    ("def f(x) =\n  let y = 1 in\n", 2, 15, "expected an expression, found the end of the file"),
    ("def f(x) = (1, 2", 1, 17, "expected ')', ',' or an operator"),
    ("def f(x) = lambda (a) a", 1, 24, "expected 'end'"),
    ("def f(x) = if x then 1 2", 1, 24, "expected 'else' or an operator, found the number 2"),
    ("def f(x) = x\n)", 2, 1, "expected a definition ('def'), the end of the file or an operator, found ')'"),
    ("def (x) = 1", 1, 5, "expected a name, found '('"),
    ("def f(x) = x[a]", 1, 14, "expected an integer, found 'a'"),
    ("def f(x) = [1]", 1, 12, "expected an expression, found '['"),
    ("1 2", 1, 3, "expected the end of the file or an operator"),
    ("def f(x) = let in x", 1, 16, "expected a name, found 'in'"),
    ("def f(x) -> = x", 1, 13, "expected a name or '('"),
    ("def f(x) = x\nlet y = 1 in y", 2, 1, "found 'let'"),
    ("import 1", 1, 8, "expected a string"),
])
def test_unexpected_tokens_are_described_in_words(text, line, col, message, engine):
    error = fails(text, AnfirSyntaxError, engine)
    check(error, line, col, message)
    assert "LPAR" not in error.render() and "NAME" not in error.render()


@pytest.mark.parametrize("text, line, col, message", [
    ("def f(x) = x $ 1", 1, 14, "unexpected character '$'"),
    ("def f(x) =\n  x ? 1", 2, 5, "unexpected character '?'"),
    ("def f(x) = x.y", 1, 13, "unexpected '.'"),
    ('def f(x) = "abc', 1, 12, "unterminated string"),
    ('def f(x) = "a\\qb"', 1, 14, "unknown escape '\\q'"),
    ("def f(x) = % + 1", 1, 12, "'%' must be followed by a name"),
    ("def f(x) = x\x00\x01", 1, 13, "NUL byte"),
    ("def f(x: f65) = x", 1, 10, "unknown type 'f65'"),
    ("def f(x: str[2]) = x", 1, 10, "unknown tensor element type 'str'"),
    ("def f(a, b) = a == not b", 1, 20, "'not' binds more loosely than '=='"),
])
def test_bad_characters_and_tokens(text, line, col, message):
    check(fails(text, AnfirSyntaxError), line, col, message)


@pytest.mark.parametrize("text", ["", "   \n\n", "# only\n# comments\n"])
def test_a_file_that_defines_nothing(text):
    error = fails(text, AnfirSyntaxError)
    assert "the file defines nothing" in error.render()
    assert (error.loc.line, error.loc.col) == (1, 1)
    if text.startswith("#"):
        check(error, 1, 1)


def test_binary_file(tmp_path):
    path = tmp_path / "garbage.anf"
    path.write_bytes(b"def f(x) = x\ndef g(y) = \xff\xfe y\n")
    with pytest.raises(AnfirSyntaxError) as info:
        parse_file(str(path))
    check(info.value, 2, 12, "not UTF-8", "0xff")


def test_nul_bytes_in_a_file(tmp_path):
    path = tmp_path / "nul.anf"
    path.write_bytes(b"\x00\x00\x00\x01")
    with pytest.raises(AnfirSyntaxError) as info:
        parse_file(str(path))
    check(info.value, 1, 1, "NUL byte")


def test_bytes_instead_of_text_is_a_usage_error():
    with pytest.raises(UsageError):
        parse_module(b"def f(x) = x")  # type: ignore[arg-type]


def test_missing_file_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError):
        parse_file(str(tmp_path / "nope.anf"))


# -- names ---------------------------------------------------------------------------

def test_unknown_name_suggests_close_names():
    check(fails("def f(x) =\n  sinn(x)", NameResolutionError), 2, 3, "unknown name 'sinn'", "'sin'")


def test_first_unknown_name_in_source_order():
    error = fails("def g(x) = bar(x)\ndef f(x) =\n  foo(x) + bar(x)", NameResolutionError)
    check(error, 1, 12, "unknown name 'bar'")


def test_unknown_name_in_dead_code():
    check(fails("def f(x) =\n  let unused = cosine(x) in x", NameResolutionError), 2, 16,
          "unknown name 'cosine'", "'cos'")


def test_unknown_name_found_by_resolve_module():
    module = parse_module("def f(x) = helper(x) + 1\ndef helpr(y) = y", resolve=False)
    with pytest.raises(NameResolutionError) as info:
        resolve_module(module)
    check(info.value, 1, 12, "unknown name 'helper'", "'helpr'")


def test_a_name_bound_only_in_another_scope_is_unknown():
    check(fails("def f(x) = (lambda (y) y end, y)", NameResolutionError), 1, 31, "'y'")
    check(fails("def f(x) = let y = x in g(y)\ndef g(z) = y", NameResolutionError), 2, 12, "'y'")


def test_duplicate_definitions():
    error = fails("def f(x) = x\ndef g(x) = x\ndef f(y) = y", DuplicateDefinitionError)
    check(error, 3, 5, "'f' is defined twice", "line 1")


def test_duplicate_parameters():
    check(fails("def f(x, y, x) = x", DuplicateDefinitionError), 1, 13,
          "duplicate parameter name 'x'")
    check(fails("def f(y) =\n  lambda (a, b, a) a end", DuplicateDefinitionError), 2, 17,
          "duplicate parameter name 'a'")


# -- calls -------------------------------------------------------------------------------

@pytest.mark.parametrize("text, line, col, message", [
    ("def g(a) = a\ndef f(x) = g(x, x)", 2, 13, "'g' takes 1 argument, but 2 were given"),
    ("def f(x) = f()", 1, 13, "'f' takes 1 argument, but 0 were given"),
    ("def f(x) = let h = lambda (a) a end in h(1, 2)", 1, 41, "'h' takes 1 argument, but 2 were given"),
    ("def f(x) = (lambda (a, b) a end)(1)", 1, 33, "'lambda' takes 2 arguments, but 1 was given"),
    ("def f(x) = sin(1, 2)", 1, 15, "'sin' takes 1 argument, but 2 were given"),
    ("def f(x) = switch(x)", 1, 18, "'switch' takes 3 arguments"),
    ("def f(x) = grad()", 1, 16, "'grad' takes at least 1 argument, but 0 were given"),
])
def test_wrong_arity_when_statically_visible(text, line, col, message):
    check(fails(text, ArityError), line, col, message)


def test_arity_of_unknown_callees_is_not_checked():
    parse_module("def f(g) = g(1, 2, 3)")
    parse_module("def f(x) = grad(sin)(x)")


@pytest.mark.parametrize("text, col, message", [
    ("def f(x) = 3(4)", 12, "3 is not a function"),
    ('def f(x) = "s"(1)', 12, "'s' is not a function"),
    ("def f(x) = (1.5)(x)", 13, "1.5 is not a function"),
    ("def f(x) = None()", 12, "None is not a function"),
    ("def f(x) = True(x)", 12, "True is not a function"),
    ("def f(x) = let k = 2 in k(x)", 20, "2 is not a function"),
])
def test_calling_a_constant(text, col, message):
    check(fails(text, AnfirTypeError), 1, col, message)


# -- imports --------------------------------------------------------------------------------

def test_import_cycle(tmp_path):
    (tmp_path / "a.anf").write_text('import "b.anf"\ndef fa() = 1\n')
    (tmp_path / "b.anf").write_text('import "a.anf"\ndef fb() = 2\n')
    with pytest.raises(NameResolutionError) as info:
        parse_file(str(tmp_path / "a.anf"))
    check(info.value, 1, 8, "import cycle: a.anf -> b.anf -> a.anf")
    assert info.value.loc.file.endswith("b.anf")


def test_self_import(tmp_path):
    (tmp_path / "a.anf").write_text('import "a.anf"\ndef fa() = 1\n')
    with pytest.raises(NameResolutionError) as info:
        parse_file(str(tmp_path / "a.anf"))
    check(info.value, 1, 8, "import cycle")


def test_missing_import(tmp_path):
    (tmp_path / "a.anf").write_text('def fa() = 1\nimport "zzz.anf"\n')
    with pytest.raises(AnfirSyntaxError):
        parse_file(str(tmp_path / "a.anf"))  # imports come first
    (tmp_path / "b.anf").write_text('import "zzz.anf"\ndef fb() = 1\n')
    with pytest.raises(NameResolutionError) as info:
        parse_file(str(tmp_path / "b.anf"))
    check(info.value, 1, 8, "cannot import")


def test_two_imports_defining_one_name(tmp_path):
    (tmp_path / "x.anf").write_text("def same() = 1\n")
    (tmp_path / "y.anf").write_text("def same() = 2\n")
    (tmp_path / "m.anf").write_text('import "x.anf"\nimport "y.anf"\ndef f() = same()\n')
    with pytest.raises(DuplicateDefinitionError) as info:
        parse_file(str(tmp_path / "m.anf"))
    check(info.value, 2, 8, "'same'")


def test_error_in_an_imported_file_names_that_file(tmp_path):
    (tmp_path / "lib.anf").write_text("def g(x) =\n  x +\n")
    (tmp_path / "m.anf").write_text('import "lib.anf"\ndef f() = g(1)\n')
    with pytest.raises(AnfirSyntaxError) as info:
        parse_file(str(tmp_path / "m.anf"))
    assert info.value.loc.file.endswith("lib.anf")
    check(info.value, 2, 6, "expected an expression, found the end of the file")

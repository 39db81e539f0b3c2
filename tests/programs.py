"""Random ANF programs for the property tests: one generator, configured per test.

A program is drawn (with hypothesis) as a tree of :data:`Expr` nodes, plain
tuples ``(kind, ...)``, and printed as ANF text by :func:`to_anf`.  The
float-arithmetic part of the language can also be evaluated in Python
(:func:`evaluate`, on floats, or on :class:`Dual` numbers for forward-mode
derivatives), so a test can compare anfir with an independent reference.

What a test's programs contain is a :class:`Grammar`: the kinds of
expression it draws below the leaves (a kind listed twice is drawn twice as
often), its constants, operators and comparisons, how local functions are
called, and whether bound names are always fresh or may shadow names in
scope.  The kinds (``e`` is a sub-expression, drawn one level shallower):

================  ================================================================
``var``           a name in scope
``const``         one of the grammar's constants
``leaf``          ``var`` or ``const``, even odds (depth 0 draws only these)
``bin``           ``(e op e)``
``unary``         ``fn(e)``, or ``(-e)`` for ``"-"``
``let``           ``(let v = e in e)``
``if``            ``(if e cmp e then e else e)``
``logic``         ``(if e < e and not (e == e) or e >= e then e else e)``
``closure``       a local function called once or twice,
                  ``(let c = lambda (z) e end in c(e) * c(e))``
``tuple``         ``(e, e)[i]``
``tuple_let``     ``(let t = (e, e, e) in t[i] * t[0])``
``call``          ``f(e, e)``, ``f`` one of the grammar's ``callees``
``count``         ``count(n, e)``: the recursive ``count`` of :data:`HELPERS`
``loop``          local tail recursion,
                  ``(let v = lambda (i, acc) if i < n then v(i + 1, e) else acc end in v(0, e))``
``hof``           a lambda passed to a local function that applies it twice
``hof_pair``      a let-bound lambda passed to a local function calling it on two values
``esc``           a closure that escapes its maker: ``(let v = lambda (p) lambda () p + e end end in v(e)())``
``curry``         ``(let v = lambda (p) lambda (q) p * q + e end end in v(e)(e))``
``grad``          ``grad(lambda (p) e * p end)(e * 1.0)``
``tensor``        ``sum(ones((2, 3)) * e)``
``partial``       ``partial(lambda (a, b) a - b end, e)(e)``
``partial_grad``  ``partial`` inside a differentiated function, the bound function
                  closing over the differentiated parameter (grad of grad when nested)
``partial_two``   one function bound by two ``partial`` nodes, called with
                  arguments whose types may differ
``builtin``       a built-in passed as a value, ``(lambda (h, z) h(z) * z end)(sin, e)``
``partial_prim``  a built-in bound by ``partial``, ``partial(mul, e)(e)``
``grad_value``    a gradient function used as a value: of a built-in, of a
                  ``partial`` (binding a variable in scope, too), chosen by ``if``, picked from a tuple, from a tuple
                  by a loop counter, or let-bound and called twice
================  ================================================================

The programs (strategies drawing a :class:`Program`, whose ``text`` is the ANF):

* :func:`single_def` -- ``def main(x, y) = e``;
* :func:`let_programs` -- ``def f(x, y) = let a = e in let b = e in e``;
* :func:`modules` -- several definitions calling each other;
* :func:`let_chains` -- ``def main(a, b) =`` a chain of lets (rebinding names
  too) returning every binding, with :data:`HELPERS`.

Each property test names its grammar here (:data:`SMOOTH`, :data:`PIPELINE`,
:data:`COMPILE`, :data:`ROUNDTRIP`, :data:`IEEE`), so what it covers is visible in one place.
Two narrower generators live here too: :func:`operator_chains` (unparenthesised
operator expressions, for precedence) and :func:`primitive_chains` (a list of
primitive calls, for graphs built through the IR API).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence, Union

from hypothesis import strategies as st

Expr = tuple
"""A generated expression: ``(kind, ...)``, see the module docstring."""

HELPERS = """
def helper(x, y) = if x < y then x * 2.0 else y - x
def count(n, acc) = if n < 1 then acc else count(n - 1, acc + 1.5)
"""
"""Top-level functions that the ``call`` (``helper``) and ``count`` kinds call."""


@dataclass(frozen=True)
class Grammar:
    """What generated expressions may contain."""

    kinds: tuple[str, ...]
    """The kinds drawn above depth 0 (repeat one to weight it)."""
    constants: tuple[Any, ...] = (0.5, 0.75, 1.25, 2.0)
    unary: tuple[str, ...] = ("sin", "cos", "tanh")
    binary: tuple[str, ...] = ("+", "-", "*")
    comparisons: tuple[str, ...] = ("<",)
    calls: tuple[Optional[str], ...] = ("*",)
    """How a ``closure`` is called: ``None`` once, an operator twice, joined by it."""
    callees: tuple[str, ...] = ()
    """Functions of two arguments for the ``call`` kind."""
    shadowing: bool = False
    """Whether bound names may shadow (a quarter of the time): a parameter or a
    ``let`` the name of a value in scope, a local function that of an enclosing
    one.  Otherwise every bound name is fresh."""
    grad_forms: tuple[str, ...] = ("builtin", "partial", "partial_over", "if", "tuple", "loop",
                                   "let")
    """The forms of the ``grad_value`` kind (:data:`GRAD_VALUE_FORMS`)."""

    def but(self, **changes: Any) -> "Grammar":
        """This grammar with some fields changed."""
        return replace(self, **changes)


LEAVES = ("var", "const")

SMOOTH = Grammar(
    kinds=("var", "const", "bin", "bin", "unary", "closure", "if", "tuple"),
    constants=(0.5, 0.75, 1.25, 2.0, 1.0, 0.0),
    unary=("sin", "cos", "tanh", "sigmoid"),
    comparisons=(">",),
    calls=("*",),
    shadowing=True,
)
"""Float arithmetic, smooth almost everywhere, that :func:`evaluate` can run:
closures called twice, ``if``, tuples (gradients, the fast path)."""

PIPELINE = Grammar(
    kinds=("leaf", "bin", "let", "if", "closure", "tuple", "unary"),
    constants=(0.0, 0.5, 1.0, 2.0, -1.5, 3.0),
    unary=("-", "sin", "cos"),
    comparisons=("<", ">=", "=="),
    calls=(None, "*"),
)
"""Arithmetic, lets, closures, ``if`` and tuples (every phase of the pipeline)."""

COMPILE = Grammar(
    kinds=("leaf", "bin", "let", "if", "closure", "tuple", "call", "loop", "hof", "grad",
           "tensor", "esc", "partial", "partial_grad", "partial_two"),
    constants=(0.0, 1.0, -1.5, 2.0, 0.5, 3.0),
    comparisons=("<",),
    calls=("+",),
)
"""Closures, local recursion, higher-order and escaping functions, tensors,
``grad`` and ``partial`` in three modules' definitions calling each other
(compile agrees with run; the known gaps are in test_compile_agrees_with_run)."""

ROUNDTRIP = Grammar(
    kinds=("leaf", "bin", "closure", "if", "logic", "tuple_let", "call", "count", "loop",
           "hof_pair", "curry", "unary"),
    constants=(-3, -2, -1, 0, 1, 2, 3, 0.5, 2.0, -1.5),
    unary=("-",),
    comparisons=("<", "<=", "==", ">"),
    calls=(None,),
    callees=("helper",),
    shadowing=True,
)
"""Integers and floats, closures nested and curried, ``if`` with logic, tuples,
calls of helpers and of a recursive def, local recursion, shadowing (printers)."""

HIGHER = Grammar(
    kinds=("leaf", "bin", "bin", "unary", "let", "closure", "tuple", "if", "builtin",
           "partial_prim", "partial", "grad_value", "grad_value"),
    constants=(0.5, 1.25, -0.75, 2.0),
    unary=("sin", "cos", "tanh"),
    comparisons=("<",),
    calls=(None, "*"),
)
"""Smooth float arithmetic with function values of every kind — closures,
``partial`` (of lambdas and built-ins), built-ins passed as values, gradient
functions as values (chosen by ``if``, in tuples, by a loop counter) — for
differentiating to high order from the program and from the API, run and
compiled."""

GRAD_VALUE_FORMS = Grammar(kinds=()).grad_forms
"""The forms of the ``grad_value`` kind (``partial_over``: ``grad`` of a ``partial``
binding a variable in scope — a differentiated parameter, so differentiating the
program differentiates a gradient of a partial over its own variable)."""

IEEE = Grammar(
    kinds=("leaf", "bin", "bin", "bin", "unary", "let", "tuple", "closure"),
    constants=(0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 0, 1),
    unary=("-", "exp", "tanh", "sqrt", "log", "abs"),
    binary=("+", "-", "*", "/"),
    calls=(None, "*", "-"),
    shadowing=True,
)
"""Float arithmetic with the constants an optimizer is tempted to fold (``x * 0.0``,
``x - x``, ``x / x``, ``x + 0.0``), integers among them, and no ``if``: the
expressions also run elementwise on tensors (rewrites are exact on inf and nan)."""


# -- drawing -------------------------------------------------------------------------------
@dataclass
class _Names:
    """The fresh-name counter of one program."""

    n: int = 0

    def fresh(self, prefix: str) -> str:
        self.n += 1
        return f"{prefix}{self.n}"


@dataclass(frozen=True)
class _Scope:
    values: tuple[str, ...]
    """Names of values, usable as ``var``."""
    functions: tuple[str, ...] = ()
    """Names of local functions in scope (which a new local function may shadow)."""

    def with_value(self, name: str) -> "_Scope":
        return replace(self, values=self.values + (name,) if name not in self.values
                       else self.values)

    def with_function(self, name: str) -> "_Scope":
        return replace(self, functions=self.functions + (name,))


def _bound(draw: Any, g: Grammar, names: _Names, prefix: str, taken: Sequence[str]) -> str:
    """A name to bind: fresh, or (a quarter of the time, if the grammar shadows) one of ``taken``."""
    if g.shadowing and taken and draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(tuple(taken)))
    return names.fresh(prefix)


def _leaf(draw: Any, g: Grammar, scope: _Scope, kind: str) -> Expr:
    if kind == "leaf":
        kind = "var" if draw(st.booleans()) else "const"
    if kind == "var":
        return ("var", draw(st.sampled_from(scope.values)))
    return ("const", draw(st.sampled_from(g.constants)))


@st.composite
def expressions(draw: Any, grammar: Grammar, names: Sequence[str], depth: int,
                counter: Optional[_Names] = None) -> Expr:
    """An expression over ``names``, at most ``depth`` levels of ``grammar``'s kinds
    (``counter``: the fresh names of the program it is part of)."""
    return _expr(draw, grammar, _Scope(tuple(names)), depth, counter or _Names())


def _expr(draw: Any, g: Grammar, scope: _Scope, depth: int, names: _Names) -> Expr:
    if depth <= 0:
        return _leaf(draw, g, scope, draw(st.sampled_from(LEAVES)))
    kind = draw(st.sampled_from(g.kinds))
    if kind in ("var", "const", "leaf"):
        return _leaf(draw, g, scope, kind)

    def sub(inner: _Scope = scope) -> Expr:
        return _expr(draw, g, inner, depth - 1, names)

    def value(name: str, inner: _Scope = scope) -> _Scope:
        return inner.with_value(name)

    if kind == "bin":
        return ("bin", draw(st.sampled_from(g.binary)), sub(), sub())
    if kind == "unary":
        return ("unary", draw(st.sampled_from(g.unary)), sub())
    if kind == "let":
        v = _bound(draw, g, names, "v", scope.values)
        return ("let", v, sub(), sub(value(v)))
    if kind == "if":
        return ("if", draw(st.sampled_from(g.comparisons)), sub(), sub(), sub(), sub())
    if kind == "logic":
        return ("logic", tuple(sub() for _ in range(6)), sub(), sub())
    if kind == "closure":
        c = _bound(draw, g, names, "v", scope.functions)
        z = _bound(draw, g, names, "p", scope.values)
        body = sub(value(z, scope.with_function(c)))
        join = draw(st.sampled_from(g.calls))
        args = (sub(),) if join is None else (sub(), sub())
        return ("closure", c, z, body, args, join)
    if kind == "tuple":
        return ("tuple", (sub(), sub()), draw(st.integers(0, 1)))
    if kind == "tuple_let":
        t = _bound(draw, g, names, "t", scope.values)
        return ("tuple_let", t, (sub(), sub(), sub()), draw(st.integers(0, 2)))
    if kind == "call":
        return ("call", draw(st.sampled_from(g.callees)), sub(), sub())
    if kind == "count":
        return ("count", draw(st.integers(0, 4)), sub())
    if kind == "loop":
        v, acc = names.fresh("v"), f"a{names.n}"
        return ("loop", v, acc, draw(st.integers(0, 3)), sub(value(acc)), sub())
    if kind == "hof":
        v = names.fresh("v")
        return ("hof", v, sub(), sub())
    if kind == "hof_pair":
        k, h = names.fresh("k"), names.fresh("h")
        p = _bound(draw, g, names, "p", scope.values)
        return ("hof_pair", k, h, p, sub(), sub(), sub())
    if kind == "esc":
        v = names.fresh("v")
        p = names.fresh("p")
        return ("esc", v, p, sub(value(p)), sub())
    if kind == "curry":
        v = names.fresh("mk")
        p = _bound(draw, g, names, "p", scope.values)
        q = _bound(draw, g, names, "q", scope.values + (p,))
        return ("curry", v, p, q, sub(value(q, value(p))), sub(), sub())
    if kind == "grad":
        p = names.fresh("p")
        return ("grad", p, sub(value(p)), sub())
    if kind == "tensor":
        return ("tensor", sub())
    if kind == "partial":
        return ("partial", sub(), sub())
    if kind == "partial_grad":
        p = names.fresh("p")
        return ("partial_grad", p, sub(value(p)), sub(value(p)), sub())
    if kind == "partial_two":
        p, v = names.fresh("p"), f"v{names.n}"
        return ("partial_two", p, v, sub(value(p)), sub(value(p)), sub(value(p)), sub())
    builtins = tuple(u for u in g.unary if u != "-") or ("sin",)
    if kind == "builtin":
        return ("builtin", draw(st.sampled_from(builtins)), names.fresh("h"), sub())
    if kind == "partial_prim":
        return ("partial_prim", draw(st.sampled_from(("add", "sub", "mul"))), sub(), sub())
    if kind == "grad_value":
        form = draw(st.sampled_from(g.grad_forms))
        p = names.fresh("p")
        # A function of p and of what is in scope (for partial_over, the bound function
        # may close over the very variable the partial binds).
        body = sub(value(p))
        u1, u2, a = draw(st.sampled_from(builtins)), draw(st.sampled_from(builtins)), sub()
        b = ("var", draw(st.sampled_from(scope.values))) if form == "partial_over" else sub()
        return ("grad_value", form, p, body, u1, u2, a, b, names.fresh("d"),
                draw(st.integers(0, 1)))
    raise ValueError(f"unknown kind of expression {kind!r}")


# -- printing ------------------------------------------------------------------------------
def to_anf(e: Expr) -> str:
    """The ANF text of ``e`` (parenthesised wherever precedence could matter)."""
    tag = e[0]
    if tag == "var":
        return e[1]
    if tag == "const":
        return repr(e[1])
    if tag == "bin":
        return f"({to_anf(e[2])} {e[1]} {to_anf(e[3])})"
    if tag == "unary":
        return f"(-{to_anf(e[2])})" if e[1] == "-" else f"{e[1]}({to_anf(e[2])})"
    if tag == "let":
        return f"(let {e[1]} = {to_anf(e[2])} in {to_anf(e[3])})"
    if tag == "if":
        _, cmp, a, b, then, other = e
        return f"(if {to_anf(a)} {cmp} {to_anf(b)} then {to_anf(then)} else {to_anf(other)})"
    if tag == "logic":
        a, b, c, d, f, h = (to_anf(x) for x in e[1])
        return (f"(if {a} < {b} and not ({c} == {d}) or {f} >= {h} "
                f"then {to_anf(e[2])} else {to_anf(e[3])})")
    if tag == "closure":
        _, c, z, body, args, join = e
        calls = f" {join} ".join(f"{c}({to_anf(a)})" for a in args)
        return f"(let {c} = lambda ({z}) {to_anf(body)} end in {calls})"
    if tag == "tuple":
        return f"(({', '.join(to_anf(x) for x in e[1])})[{e[2]}])"
    if tag == "tuple_let":
        _, t, items, i = e
        return f"(let {t} = ({', '.join(to_anf(x) for x in items)}) in {t}[{i}] * {t}[0])"
    if tag == "call":
        return f"{e[1]}({to_anf(e[2])}, {to_anf(e[3])})"
    if tag == "count":
        return f"count({e[1]}, {to_anf(e[2])})"
    if tag == "loop":
        _, v, acc, bound, body, init = e
        return (f"(let {v} = lambda (i, {acc}) if i < {bound} then {v}(i + 1, {to_anf(body)}) "
                f"else {acc} end in {v}(0, {to_anf(init)}))")
    if tag == "hof":
        _, v, factor, arg = e
        return (f"(let {v} = lambda (g, z) g(g(z)) end in "
                f"{v}(lambda (q) q * {to_anf(factor)} end, {to_anf(arg)}))")
    if tag == "hof_pair":
        _, k, h, p, term, arg, other = e
        return (f"(let {k} = lambda ({p}) {p} + {to_anf(term)} end in "
                f"let {h} = lambda (fn, z) fn(z) * fn({to_anf(other)}) end in "
                f"{h}({k}, {to_anf(arg)}))")
    if tag == "esc":
        _, v, p, term, arg = e
        return f"(let {v} = lambda ({p}) lambda () {p} + {to_anf(term)} end end in {v}({to_anf(arg)})())"
    if tag == "curry":
        _, v, p, q, term, a, b = e
        return (f"(let {v} = lambda ({p}) lambda ({q}) {p} * {q} + {to_anf(term)} end end in "
                f"{v}({to_anf(a)})({to_anf(b)}))")
    if tag == "grad":
        # ``* 1.0``: the point is a float even when it is computed from an integer.
        _, p, body, point = e
        return f"grad(lambda ({p}) {to_anf(body)} * {p} end)({to_anf(point)} * 1.0)"
    if tag == "tensor":
        return f"sum(ones((2, 3)) * {to_anf(e[1])})"
    if tag == "partial":
        return f"partial(lambda (a, b) a - b end, {to_anf(e[1])})({to_anf(e[2])})"
    if tag == "partial_grad":
        _, p, term, arg, point = e
        return (f"grad(lambda ({p}) partial(lambda (a, b) a * b - {to_anf(term)} end, {p})"
                f"({to_anf(arg)} * 1.0) end)({to_anf(point)} * 1.0)")
    if tag == "partial_two":
        _, p, v, term, arg, other, point = e
        return (f"grad(lambda ({p}) (let {v} = lambda (a, b) a * b - {to_anf(term)} end in "
                f"partial({v}, {p})({to_anf(arg)}) + partial({v}, {p})({to_anf(other)} * 1.0)) "
                f"end)({to_anf(point)} * 1.0)")
    if tag == "builtin":
        _, fn, h, arg = e
        return f"(lambda ({h}, z) {h}(z) * z end)({fn}, {to_anf(arg)})"
    if tag == "partial_prim":
        return f"partial({e[1]}, {to_anf(e[2])})({to_anf(e[3])})"
    if tag == "grad_value":
        return _grad_value_anf(e)
    raise ValueError(f"unknown kind of expression {tag!r}")


def _grad_value_anf(e: Expr) -> str:
    _, form, p, body, u1, u2, a, b, d, i = e
    own = f"grad(lambda ({p}) {to_anf(body)} * {p} end)"  # a gradient of the program's own
    at = f"({to_anf(a)} * 1.0)"  # a float point, even if the expression is an integer
    if form == "builtin":
        return f"(grad({u1})({at}) * {own}({at}))"
    if form in ("partial", "partial_over"):
        return f"grad(partial(lambda (c, {p}) c * {to_anf(body)} * {p} end, {to_anf(b)}))({at})"
    if form == "if":
        return f"(if {to_anf(a)} < {to_anf(b)} then grad({u1}) else {own})({at})"
    if form == "tuple":
        return f"((grad({u1}), {own})[{i}])({at})"
    if form == "loop":
        return (f"(let {d} = (grad({u1}), {own}, grad({u2})) in let l{d} = lambda (k, acc) "
                f"if k < 3 then l{d}(k + 1, acc + tuple_getitem({d}, k)({at})) else acc end in "
                f"l{d}(0, 0.0))")
    return f"(let {d} = {own} in {d}({at}) * {d}({to_anf(b)} * 1.0))"


def kinds_in(e: Expr) -> set[str]:
    """The kinds of expression that occur in ``e``."""
    found: set[str] = set()
    stack = [e]
    while stack:
        node = stack.pop()
        found.add(node[0])
        for part in node[1:]:
            if isinstance(part, tuple) and part and isinstance(part[0], str):
                stack.append(part)
            elif isinstance(part, tuple):
                stack.extend(x for x in part if isinstance(x, tuple))
    return found


# -- evaluating in Python ------------------------------------------------------------------
@dataclass(frozen=True)
class Dual:
    """A value and its derivative with respect to one input (forward mode)."""

    v: float
    d: float

    def __add__(self, o: "Dual") -> "Dual":
        return Dual(self.v + o.v, self.d + o.d)

    def __sub__(self, o: "Dual") -> "Dual":
        return Dual(self.v - o.v, self.d - o.d)

    def __mul__(self, o: "Dual") -> "Dual":
        return Dual(self.v * o.v, self.d * o.v + self.v * o.d)


def _sigmoid(v: float) -> float:
    return 1.0 / (1.0 + math.exp(-v))


UNARY = {
    "sin": (math.sin, math.cos),
    "cos": (math.cos, lambda v: -math.sin(v)),
    "tanh": (math.tanh, lambda v: 1 - math.tanh(v) ** 2),
    "sigmoid": (_sigmoid, lambda v: _sigmoid(v) * (1 - _sigmoid(v))),
    "-": (lambda v: -v, lambda v: -1.0),
}
"""Each unary function :func:`evaluate` knows, and its derivative."""

_BINARY = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
_COMPARE = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
            ">=": lambda a, b: a >= b, "==": lambda a, b: a == b}

Num = Union[float, Dual]


def _plain(x: Num) -> float:
    return x.v if isinstance(x, Dual) else x


def evaluate(e: Expr, env: dict[str, Num]) -> Num:
    """``e`` computed in Python on floats, or on :class:`Dual` numbers (then every
    value in ``env`` is one) for a derivative: the kinds var, const, bin, unary,
    let, if, closure and tuple."""
    tag = e[0]
    if tag == "var":
        return env[e[1]]
    if tag == "const":
        dual = any(isinstance(v, Dual) for v in env.values())
        return Dual(e[1], 0.0) if dual else e[1]
    if tag == "bin":
        return _BINARY[e[1]](evaluate(e[2], env), evaluate(e[3], env))
    if tag == "unary":
        f, df = UNARY[e[1]]
        a = evaluate(e[2], env)
        return Dual(f(a.v), df(a.v) * a.d) if isinstance(a, Dual) else f(a)
    if tag == "let":
        return evaluate(e[3], {**env, e[1]: evaluate(e[2], env)})
    if tag == "if":
        taken = _COMPARE[e[1]](_plain(evaluate(e[2], env)), _plain(evaluate(e[3], env)))
        return evaluate(e[4] if taken else e[5], env)
    if tag == "closure":
        _, _, z, body, args, join = e
        values = [evaluate(body, {**env, z: evaluate(a, env)}) for a in args]
        return values[0] if join is None else _BINARY[join](*values)
    if tag == "tuple":
        return evaluate(e[1][e[2]], env)
    raise NotImplementedError(f"evaluate: kind {tag!r}")


def if_margins(e: Expr, env: dict[str, Num]) -> list[float]:
    """``|a - b|`` of every ``if a cmp b`` in ``e`` (taken or not) as evaluated at
    ``env`` (a closure's body once per call): how far each branch is from a tie."""
    margins: list[float] = []
    stack = [(e, env)]
    while stack:
        node, scope = stack.pop()
        tag = node[0]
        if tag == "if":
            margins.append(abs(_plain(evaluate(node[2], scope)) - _plain(evaluate(node[3], scope))))
        if tag == "closure":
            _, _, z, body, args, _ = node
            stack.extend((body, {**scope, z: evaluate(a, scope)}) for a in args)
            stack.extend((a, scope) for a in args)
        elif tag == "let":
            stack.append((node[2], scope))
            stack.append((node[3], {**scope, node[1]: evaluate(node[2], scope)}))
        elif tag == "tuple":
            stack.extend((x, scope) for x in node[1])
        else:
            stack.extend((x, scope) for x in node[1:] if isinstance(x, tuple))
    return margins


# -- programs ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Program:
    """A generated program: ``def entry(params) = let name = e in ... result``."""

    entry: str
    params: tuple[str, ...]
    lets: tuple[tuple[str, Expr], ...]
    result: Optional[Expr]
    """The returned expression (None: the names of ``returns``, as a tuple)."""
    returns: tuple[str, ...] = ()
    defs: tuple["Program", ...] = ()
    """Other definitions of the module, printed first."""
    extra: str = ""
    """ANF text appended to the module (helpers)."""

    @property
    def text(self) -> str:
        """The module's ANF text."""
        return "".join(d.definition for d in self.defs) + self.definition + self.extra

    @property
    def definition(self) -> str:
        """The ANF text of the entry's definition."""
        head = f"def {self.entry}({', '.join(self.params)}) ="
        result = ("(" + ", ".join(self.returns) + ",)" if self.result is None
                  else to_anf(self.result))
        if not self.lets:
            return f"{head} {result}\n"
        lines = [f"let {name} = {to_anf(value)} in" for name, value in self.lets]
        return head + "\n  " + "\n  ".join(lines + [result]) + "\n"

    def environment(self, *args: Num) -> dict[str, Num]:
        """Parameters and let-bound names at ``args``, computed in Python."""
        env: dict[str, Num] = dict(zip(self.params, args))
        for name, value in self.lets:
            env[name] = evaluate(value, env)
        return env

    def value(self, *args: Num) -> Num:
        """The entry's result at ``args``, computed in Python (see :func:`evaluate`)."""
        assert self.result is not None
        return evaluate(self.result, self.environment(*args))

    def if_margins(self, *args: float) -> list[float]:
        """How far each ``if`` is from a tie at ``args`` (see :func:`if_margins`)."""
        env: dict[str, Num] = dict(zip(self.params, args))
        margins = []
        for name, value in self.lets:
            margins += if_margins(value, env)
            env[name] = evaluate(value, env)
        return margins + (if_margins(self.result, env) if self.result is not None else [])

    def kinds(self) -> set[str]:
        """The kinds of expression in the module's generated definitions."""
        found: set[str] = set()
        for d in self.defs:
            found |= d.kinds()
        for _, value in self.lets:
            found |= kinds_in(value)
        return found | (kinds_in(self.result) if self.result is not None else set())


@st.composite
def single_def(draw: Any, grammar: Grammar, depth: int, params: tuple[str, ...] = ("x", "y"),
               entry: str = "main") -> Program:
    """``def main(x, y) = e``, ``e`` at most ``depth`` deep."""
    return Program(entry, params, (), draw(expressions(grammar, params, depth)))


@st.composite
def let_programs(draw: Any, grammar: Grammar, depth: int = 2, lets: tuple[str, ...] = ("a", "b"),
                 params: tuple[str, ...] = ("x", "y"), entry: str = "f") -> Program:
    """``def f(x, y) = let a = e in let b = e in e``, each ``e`` over the names before it."""
    counter = _Names()
    names = params
    bound = []
    for name in lets:
        bound.append((name, draw(expressions(grammar, names, depth, counter))))
        names += (name,)
    return Program(entry, params, tuple(bound), draw(expressions(grammar, names, depth, counter)))


@dataclass(frozen=True)
class Def:
    """One definition of :func:`modules`: its name, parameters, depth and the
    functions its ``call`` expressions may call."""

    name: str
    params: tuple[str, ...]
    depth: int
    callees: tuple[str, ...] = ()


@st.composite
def modules(draw: Any, grammar: Grammar, defs: Sequence[Def]) -> Program:
    """A module of ``defs`` (drawn and printed in order), the last one the entry."""
    counter = _Names()
    drawn = [Program(d.name, d.params, (),
                     draw(expressions(grammar.but(callees=d.callees), d.params, d.depth, counter)))
             for d in defs]
    return replace(drawn[-1], defs=tuple(drawn[:-1]))


@st.composite
def let_chains(draw: Any, grammar: Grammar, depth: tuple[int, int] = (1, 2),
               lets: tuple[int, int] = (1, 10), params: tuple[str, ...] = ("a", "b"),
               entry: str = "main") -> Program:
    """``def main(a, b) =`` a number of bindings in the range ``lets``, each of a depth
    in the range ``depth`` (rebinding a name in scope one time in thirteen if the
    grammar shadows), returning every name bound; the module has :data:`HELPERS`."""
    counter = _Names()
    names = list(params)
    bound = []
    for _ in range(draw(st.integers(*lets))):
        value = draw(expressions(grammar, tuple(names), draw(st.integers(*depth)), counter))
        if grammar.shadowing and draw(st.integers(0, 12)) == 0:
            name = draw(st.sampled_from(names))  # rebinding shadows the earlier binding
        else:
            name = counter.fresh("v")
        bound.append((name, value))
        names.append(name)
    # Unused lets are dead code (not in the graph): return every binding.
    return Program(entry, params, tuple(bound), None, returns=tuple(dict.fromkeys(reversed(names))),
                   extra=HELPERS)


# -- narrower generators ---------------------------------------------------------------------
_ATOMS = st.sampled_from(["a", "b", "c", "1", "2", "3"])
_OPERATORS = st.sampled_from(["+", "-", "*", "/", "@", "**", "and", "or"])


@st.composite
def operator_chains(draw: Any) -> str:
    """An unparenthesised chain of binary operators, prefixes ``-`` and ``not`` and at
    most one comparison over ``a b c 1 2 3`` (a few atoms parenthesised pairs):
    text that Python parses with the same precedence as ANF."""
    parts = []
    comparisons = 0
    for index in range(draw(st.integers(1, 6))):
        if index:
            if comparisons == 0 and draw(st.booleans()) and draw(st.booleans()):
                parts.append(draw(st.sampled_from(["<", "<=", ">", ">=", "==", "!="])))
                comparisons += 1
            else:
                parts.append(draw(_OPERATORS))
        prefix = draw(st.sampled_from(["", "", "-", "- -"]))
        atom = draw(_ATOMS)
        if draw(st.integers(0, 4)) == 0:
            atom = f"({atom} {draw(_OPERATORS)} {draw(_ATOMS)})"
        parts.append(prefix + atom)
    text = " ".join(parts)
    if draw(st.booleans()):
        text = "not " + text
    return text


def primitive_chains(names: Sequence[str] = ("add", "sub", "mul", "maximum"),
                     max_size: int = 30) -> st.SearchStrategy[list[tuple[str, Any]]]:
    """``[(primitive, constant), ...]``: the program ``x -> p_n(...p_1(x, k_1)..., k_n)``,
    constants integers or floats."""
    return st.lists(st.tuples(st.sampled_from(tuple(names)),
                              st.integers(-5, 5) | st.floats(-4, 4, allow_nan=False)),
                    max_size=max_size)

"""The gradient checker of the tests: anfir's gradients against central finite
differences (or a reference the test computes), computed the ways a user can;
and the finite differences themselves, for reverse mode (:func:`numeric_grad`)
and forward mode (:func:`numeric_jvp`), with :func:`assert_close` to compare.

The ways (``ways=``), for a function ``f`` and arguments ``args``:

* ``"api"`` -- ``anfir.run(anfir.grad(f, wrt), *args)``;
* ``"program"`` -- ``anfir.run`` of ``def G(...) = grad(f, wrt)(...)`` added to
  the program's text;
* ``"compiled"`` -- ``anfir.compile(anfir.grad(f, wrt), args=args)``, run;
* ``"compiled_program"`` -- ``anfir.compile`` of the program with entry ``G``, run.

The program ways need ``f`` as ANF text (``entry`` names the function in it);
the others take a FuncGraph too.  Arguments may be scalars, numpy arrays (each
element is perturbed) and tuples of those; ``wrt`` is one argument index or a
tuple of them (then every gradient is a tuple).  Only the public API of anfir
is used.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence, Union

import numpy as np

import anfir

EPS = 1e-6
"""The step of the finite differences."""
RTOL, ATOL = 1e-5, 1e-6
"""Default tolerances: ``|got - want| <= max(ATOL, RTOL * |want|)`` element by element."""
WAYS = ("api", "program", "compiled", "compiled_program")
GRAD_ENTRY = "gradcheck_grad"
"""The name of the definition the program ways add."""

Function = Union[str, "anfir.FuncGraph", Callable[..., Any]]
Wrt = Union[int, Sequence[int]]


# -- finite differences ---------------------------------------------------------------------
def _caller(f: Function, entry: str) -> Callable[..., Any]:
    if isinstance(f, str):
        f = anfir.parse(f, "gradcheck.anf")[entry]
    if callable(f) and not isinstance(f, anfir.FuncGraph):
        return f
    graph = f
    return lambda *args: anfir.run(graph, *args)


def _leaves(value: Any) -> list[tuple[tuple[int, ...], Any]]:
    """(path, leaf) for each scalar or array of a nested tuple."""
    if isinstance(value, tuple):
        return [((i,) + path, leaf) for i, item in enumerate(value)
                for path, leaf in _leaves(item)]
    return [((), value)]


def _replace(value: Any, path: tuple[int, ...], new: Any) -> Any:
    if not path:
        return new
    items = list(value)
    items[path[0]] = _replace(items[path[0]], path[1:], new)
    return tuple(items)


def _rebuild(value: Any, leaves: Iterable[Any]) -> Any:
    """``value``'s structure with ``leaves`` in place of its leaves."""
    it = iter(leaves)

    def build(v: Any) -> Any:
        return tuple(build(x) for x in v) if isinstance(v, tuple) else next(it)

    return build(value)


def numeric_grad(f: Function, args: Sequence[Any], wrt: Wrt = 0, *, eps: float = EPS,
                 entry: str = "f") -> Any:
    """Central finite differences of the scalar ``f`` at ``args``.

    ``f`` is a FuncGraph (run with ``anfir.run``), ANF text (its ``entry``), or a
    Python function.  The gradient has the structure of ``args[wrt]`` (a tuple
    of them if ``wrt`` is a tuple): a float for a scalar, a float array for an
    array (every element perturbed), a tuple for a tuple.
    """
    call = _caller(f, entry)
    if not isinstance(wrt, int):
        return tuple(numeric_grad(call, args, i, eps=eps) for i in wrt)
    args = list(args)
    x = args[wrt]
    grads = []
    for path, leaf in _leaves(x):
        def at(point: Any, path: tuple[int, ...] = path) -> Any:
            return call(*args[:wrt], _replace(x, path, point), *args[wrt + 1:])

        if isinstance(leaf, np.ndarray):
            out = np.zeros(leaf.shape, dtype=float)
            for index in np.ndindex(leaf.shape):
                plus, minus = leaf.copy(), leaf.copy()
                plus[index] += eps
                minus[index] -= eps
                out[index] = (at(plus) - at(minus)) / (2 * eps)
            grads.append(out)
        else:
            grads.append((at(leaf + eps) - at(leaf - eps)) / (2 * eps))
    return _rebuild(x, grads)


def numeric_jvp(f: Function, args: Sequence[Any], tangents: Sequence[Any], *,
                eps: float = EPS, entry: str = "f") -> Any:
    """Directional central differences ``(f(x + eps t) - f(x - eps t)) / 2 eps``
    of ``f`` (as for :func:`numeric_grad`) at ``args`` along ``tangents``, for
    arguments and results that are scalars, arrays and tuples of them."""
    call = _caller(f, entry)

    def shift(x: Any, t: Any, s: float) -> Any:
        if isinstance(x, tuple):
            return tuple(shift(a, b, s) for a, b in zip(x, t))
        return x + s * eps * np.asarray(t) if isinstance(x, np.ndarray) else x + s * eps * t

    def diff(a: Any, b: Any) -> Any:
        if isinstance(a, tuple):
            return tuple(diff(p, q) for p, q in zip(a, b))
        return (np.asarray(a) - np.asarray(b)) / (2 * eps)

    return diff(call(*[shift(x, t, 1.0) for x, t in zip(args, tangents)]),
                call(*[shift(x, t, -1.0) for x, t in zip(args, tangents)]))


def smooth_at(f: Function, args: Sequence[Any], wrt: int = 0, *, eps: float = EPS,
              tol: float = 1e-3, entry: str = "f") -> bool:
    """Whether the one-sided differences of ``f`` in scalar argument ``wrt`` agree:
    no ``if`` flips right at this point, where the derivative does not exist and
    finite differences mean nothing."""
    call = _caller(f, entry)
    here = call(*args)
    plus, minus = list(args), list(args)
    plus[wrt] += eps
    minus[wrt] -= eps
    right = (call(*plus) - here) / eps
    left = (here - call(*minus)) / eps
    return abs(right - left) <= tol * (1 + abs(right))


# -- comparing ------------------------------------------------------------------------------
def assert_close(got: Any, want: Any, rtol: float = RTOL, atol: float = ATOL,
                 msg: str = "") -> None:
    """``got`` equals ``want`` within ``max(atol, rtol * |want|)`` element by element:
    tuples of the same length, arrays (and scalars) of the same shape, no nan.
    (No looser than ``numpy.testing.assert_allclose`` or ``math.isclose`` with
    the same tolerances.)"""
    stack = [(got, want, "")]
    while stack:
        g, w, where = stack.pop()
        if isinstance(g, tuple) or isinstance(w, tuple):
            assert isinstance(g, tuple) and isinstance(w, tuple) and len(g) == len(w), \
                f"{msg}\n{where or 'value'}: got {g!r}, want {w!r}"
            stack.extend((a, b, f"{where}[{i}]") for i, (a, b) in enumerate(zip(g, w)))
            continue
        ga, wa = np.asarray(g, dtype=float), np.asarray(w, dtype=float)
        assert ga.shape == wa.shape, f"{msg}\n{where or 'value'}: shape {ga.shape} != {wa.shape}"
        bad = ~(np.abs(ga - wa) <= np.maximum(atol, rtol * np.abs(wa)))
        assert not bad.any(), (f"{msg}\n{where or 'value'}: got {g!r}, want {w!r} "
                               f"(rtol={rtol}, atol={atol})")


# -- anfir's gradients ----------------------------------------------------------------------
def _wrt_tuple(wrt: Wrt) -> tuple[int, ...]:
    return (wrt,) if isinstance(wrt, int) else tuple(wrt)


def grad_program(text: str, entry: str, wrt: Wrt, nargs: int) -> str:
    """``text`` with ``def gradcheck_grad(...) = grad(entry, wrt)(...)`` added."""
    params = ", ".join(f"arg{i}" for i in range(nargs))
    indices = ", ".join(str(i) for i in _wrt_tuple(wrt))
    return f"{text}\ndef {GRAD_ENTRY}({params}) = grad({entry}, {indices})({params})\n"


def _graph(f: Union[str, "anfir.FuncGraph"], entry: str) -> "anfir.FuncGraph":
    return anfir.parse(f, "gradcheck.anf")[entry] if isinstance(f, str) else f


def gradients(f: Union[str, "anfir.FuncGraph"], args: Sequence[Any], wrt: Wrt = 0, *,
              ways: Sequence[str] = ("api",), entry: str = "f",
              graph: "anfir.FuncGraph | None" = None) -> dict[str, Any]:
    """anfir's gradient of ``f`` at ``args``, each of the ``ways`` (see the module)
    (``graph``: ``f``'s entry already parsed)."""
    args = list(args)
    api_wrt = wrt if isinstance(wrt, int) else tuple(wrt)
    graph = graph if graph is not None else _graph(f, entry)
    found: dict[str, Any] = {}
    for way in ways:
        if way == "api":
            found[way] = anfir.run(anfir.grad(graph, api_wrt), *args)
        elif way == "compiled":
            found[way] = anfir.run(anfir.compile(anfir.grad(graph, api_wrt), args=args), *args)
        elif way in ("program", "compiled_program"):
            if not isinstance(f, str):
                raise TypeError(f"gradcheck: the {way!r} way needs the program's text")
            module = anfir.parse(grad_program(f, entry, wrt, len(args)), "gradcheck.anf")
            if way == "program":
                found[way] = anfir.run(module[GRAD_ENTRY], *args)
            else:
                found[way] = anfir.run(anfir.compile(module, entry=GRAD_ENTRY, args=args), *args)
        else:
            raise ValueError(f"gradcheck: unknown way {way!r} (one of {WAYS})")
    return found


def check_grad(f: Union[str, "anfir.FuncGraph"], args: Sequence[Any], wrt: Wrt = 0, *,
               entry: str = "f", ways: Sequence[str] | None = None, want: Any = None,
               rtol: float = RTOL, atol: float = ATOL, eps: float = EPS,
               agree: tuple[float, float] | None = None, msg: str = "") -> dict[str, Any]:
    """Check anfir's gradient of scalar ``f`` at ``args`` with respect to ``wrt``.

    Each of the ``ways`` (default: ``api`` and, for text, ``program`` too) must
    be within ``rtol``/``atol`` of ``want`` -- central finite differences of
    ``f`` with step ``eps`` unless given -- and, with ``agree=(rtol, atol)``,
    within that of the first way.  Returns the gradients, by way.
    """
    if ways is None:
        ways = ("api", "program") if isinstance(f, str) else ("api",)
    graph = _graph(f, entry)
    found = gradients(f, args, wrt, ways=ways, entry=entry, graph=graph)
    if want is None:
        want = numeric_grad(graph, args, wrt, eps=eps)
    first = found[ways[0]]
    for way, got in found.items():
        assert_close(got, want, rtol, atol, msg=f"{msg}\ngradient ({way}) against the reference")
        if agree is not None:
            assert_close(got, first, *agree, msg=f"{msg}\ngradient ({way}) against ({ways[0]})")
    return found

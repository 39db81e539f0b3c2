"""Forward mode: ``jvp`` in programs and ``anfir.jvp`` from the API, against
directional finite differences (tests/gradcheck.py) and closed forms."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import anfir
from gradcheck import assert_close, numeric_jvp

PROGRAM = """
def f(x, y) = sin(x) * y + x ** 3

def poly(x) = x ** 5 - 2.0 * x ** 3 + x ** 2

def loop(x, n) =
  let go = lambda (i, acc) if i < n then go(i + 1, acc * x + 1.0) else acc end in
  go(0, 0.0)

def closure(x, w) = let g = lambda (z) tanh(w * z) end in g(x) * g(x + 1.0)

def pair(t) = (t[0] * t[1], exp(t[0]))

def mlp(w, x) = sum(tanh(x @ w) ** 2)

def main_f(x, y, tx, ty) = jvp(f)(x, y, tx, ty)
def main_loop(x, t) = jvp(lambda (z) loop(z, 4) end)(x, t)
def main_closure(x, w, tx, tw) = jvp(closure)(x, w, tx, tw)
def main_pair(a, b, ta, tb) = jvp(pair)((a, b), (ta, tb))
def main_mlp(w, x, tw, tx) = jvp(mlp)(w, x, tw, tx)
def hvp(x, v) = jvp(grad(poly))(x, v)
def third(x) = jvp(grad(grad(poly)))(x, 1.0)
def rof(x) = grad(lambda (z) jvp(f)(z, 2.0, 1.0, 0.0)[1] end)(x)
"""

def close(got: Any, want: Any, rtol: float = 1e-5, atol: float = 1e-7) -> None:
    assert_close(got, want, rtol, atol)


MOD = anfir.parse(PROGRAM, "jvp.anf")
RNG = np.random.default_rng(7)
W, X = RNG.normal(size=(3, 2)), RNG.normal(size=(4, 3))
CASES = {
    "main_f": ("f", [0.7, -1.3], [0.4, 2.0]),
    "main_loop": (None, [1.1], [0.5]),
    "main_closure": ("closure", [0.3, 1.7], [-1.0, 0.25]),
    "main_pair": ("pair", [(0.4, -2.0)], [(1.0, 0.5)]),
    "main_mlp": ("mlp", [W, X], [RNG.normal(size=W.shape), RNG.normal(size=X.shape)]),
}


@pytest.mark.parametrize("entry", sorted(CASES))
def test_jvp_in_programs_matches_finite_differences(entry: str) -> None:
    name, xs, ts = CASES[entry]
    if name is None:
        fn: Callable[..., Any] = lambda z: anfir.run(MOD["loop"], z, 4)  # noqa: E731
    else:
        fn = lambda *a, g=MOD[name]: anfir.run(g, *a)  # noqa: E731
    flat_args = [a for pair_ in zip(xs, ts) for a in pair_] if entry == "main_pair" else [*xs, *ts]
    if entry == "main_pair":
        flat_args = [xs[0][0], xs[0][1], ts[0][0], ts[0][1]]
    value, tangent = anfir.run(MOD[entry], *flat_args)
    close(value, fn(*xs))
    close(tangent, numeric_jvp(fn, xs, ts), rtol=1e-5, atol=1e-6)
    compiled = anfir.compile(MOD, entry=entry, args=flat_args)
    close(anfir.run(compiled, *flat_args), (value, tangent), rtol=1e-12, atol=1e-12)


def test_jvp_from_the_api_runs_and_compiles() -> None:
    jf = anfir.jvp(MOD["f"])
    assert [p.name for p in jf.parameters] == ["x", "y", "t_x", "t_y"]
    value, tangent = anfir.run(jf, 0.7, -1.3, 0.4, 2.0)
    close(value, anfir.run(MOD["f"], 0.7, -1.3))
    close(tangent, np.cos(0.7) * -1.3 * 0.4 + 3 * 0.7 ** 2 * 0.4 + np.sin(0.7) * 2.0, rtol=1e-12)
    compiled = anfir.compile(jf, args=[0.7, -1.3, 0.4, 2.0])
    close(anfir.run(compiled, 0.7, -1.3, 0.4, 2.0), (value, tangent), rtol=1e-12)
    jm = anfir.jvp(MOD["mlp"])
    t_w, t_x = RNG.normal(size=W.shape), RNG.normal(size=X.shape)
    close(anfir.run(jm, W, X, t_w, t_x)[1],
          numeric_jvp(lambda w, x: anfir.run(MOD["mlp"], w, x), [W, X], [t_w, t_x]), rtol=1e-5)


def test_jvp_keeps_float32() -> None:
    w, x = W.astype(np.float32), X.astype(np.float32)
    value, tangent = anfir.run(anfir.jvp(MOD["mlp"]), w, x, np.ones_like(w), np.zeros_like(x))
    assert np.asarray(value).dtype == np.float32 and np.asarray(tangent).dtype == np.float32


@pytest.mark.parametrize("x", [-0.8, 0.0, 0.6, 1.3])
def test_forward_over_reverse_is_a_hessian_vector_product(x: float) -> None:
    # poly'' = 20 x^3 - 12 x + 2, poly''' = 60 x^2 - 12
    value, hv = anfir.run(MOD["hvp"], x, 0.5)
    close(value, 5 * x ** 4 - 6 * x ** 2 + 2 * x, rtol=1e-12, atol=1e-12)
    close(hv, 0.5 * (20 * x ** 3 - 12 * x + 2), rtol=1e-12, atol=1e-12)
    close(anfir.run(MOD["third"], x)[1], 60 * x ** 2 - 12, rtol=1e-12, atol=1e-12)


def test_reverse_over_forward() -> None:
    # d/dx of (d/dx f along (1, 0)) = d/dx (cos(x) y + 3 x^2) = -sin(x) y + 6x, y = 2
    x = 1.0
    close(anfir.run(MOD["rof"], x), -np.sin(x) * 2.0 + 6 * x, rtol=1e-12)


def test_compiled_forward_over_reverse() -> None:
    compiled = anfir.compile(MOD, entry="hvp", args=[0.6, 0.5])
    close(anfir.run(compiled, 0.6, 0.5), anfir.run(MOD["hvp"], 0.6, 0.5), rtol=1e-12)


def test_compiled_reverse_over_forward() -> None:
    compiled = anfir.compile(MOD, entry="rof", args=[1.0])
    close(anfir.run(compiled, 1.0), anfir.run(MOD["rof"], 1.0), rtol=1e-12)


def test_jvp_errors_are_located() -> None:
    bad = anfir.parse("def f(x) = x * 2.0\ndef main(x) = jvp(f)(x)", "bad.anf")
    with pytest.raises(anfir.AnfirError):
        anfir.run(bad["main"], 1.0)
    with pytest.raises(anfir.AnfirError, match="bad.anf:2"):
        anfir.compile(bad, args=[1.0])

"""Sensitivities of integers (issue 25): a loop counter or an integer carried in a loop's
state that meets float arithmetic, differentiated twice and three times.

The rule under test: the sensitivity of an integer (or boolean) value is a zero of its
own type — a gradient rule's float result for an integer input goes through
``cast_like``, which gives that zero — so the backward ``scan`` of a ``fori_loop``
differentiated again and a tail-recursive ``◂loop`` keep their carry's type.  Each
program is run by the evaluator and compiled, and both equal JAX's
``jax.grad(jax.grad(...))`` of the ``lax.fori_loop`` / ``lax.scan`` / Python version
(float64, rtol 1e-12)."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

import anfir
from anfir.ir.nodes import CNode
from anfir.ir.primitive import callee_primitive
from anfir.ir.walk import reachable_graphs, toposort
from anfir.primitives import gradient

jax = pytest.importorskip("jax")
jnp = jax.numpy
lax = jax.lax
jax.config.update("jax_enable_x64", True)

from anfir.backends.tojax import rules as tojax_rules  # noqa: E402  (needs jax, checked above)

PROGRAM = """
def h(x) = fori_loop(0, 3, lambda (i, acc) acc + x * x * i end, 0.0)
def ggh(x) = grad(grad(h))(x)

def r(x) =
  let loop = lambda (i, acc) if i < 3 then loop(i + 1, acc + x * x * i) else acc end in
  loop(0, 0.0)
def ggr(x) = grad(grad(r))(x)

def s(x) = let t = fori_loop(0, 5, lambda (k, c) (c[0] + 1, c[1] * x + c[0]) end, (0, 1.0)) in t[1] * t[0]
def ggs(x) = grad(grad(s))(x)

def q(x, xs) =
  let r = scan(lambda (c, u) ((c[0] + 1, c[1] * x + u * c[0]), c[1] * c[0] * x) end, (1, 0.5), xs) in
  r[0][1] + sum(r[1])
def ggq(x, xs) = grad(grad(q))(x, xs)

def w(x) = fori_loop(1, 5, lambda (i, acc) acc * x + sin(x * i) + cast(i, "f64") * x / i end, 1.0)
def gw(x) = grad(w)(x)
def ggw(x) = grad(grad(w))(x)
def gggw(x) = grad(grad(grad(w)))(x)

def rr(x) =
  let loop = lambda (i, acc) if i < 4 then loop(i + 1, acc * x + x * sin(x * i)) else acc end in
  loop(1, 1.0)
def gggrr(x) = grad(grad(grad(rr)))(x)
"""

MOD = anfir.parse(PROGRAM, "integer_sensitivities.anf")


# -- the JAX references ------------------------------------------------------------------
def j_h(x: Any) -> Any:
    return lax.fori_loop(0, 3, lambda i, acc: acc + x * x * i, 0.0)


def j_r(x: Any) -> Any:
    acc, i = 0.0, 0
    while i < 3:
        acc, i = acc + x * x * i, i + 1
    return acc


def j_s(x: Any) -> Any:
    t = lax.fori_loop(0, 5, lambda k, c: (c[0] + 1, c[1] * x + c[0]), (0, 1.0))
    return t[1] * t[0]


def j_q(x: Any, xs: Any) -> Any:
    def step(c: Any, u: Any) -> Any:
        return (c[0] + 1, c[1] * x + u * c[0]), c[1] * c[0] * x
    c, ys = lax.scan(step, (1, 0.5), xs)
    return c[1] + jnp.sum(ys)


def j_w(x: Any) -> Any:
    return lax.fori_loop(1, 5, lambda i, acc: acc * x + jnp.sin(x * i) + i.astype(jnp.float64) * x / i, 1.0)


def j_rr(x: Any) -> Any:
    acc = 1.0
    for i in range(1, 4):
        acc = acc * x + x * jnp.sin(x * i)
    return acc


def dd(f: Callable[..., Any]) -> Callable[..., Any]:
    return jax.grad(jax.grad(f))


XS = np.array([0.3, -0.7, 1.1, 0.4])

CASES: list[tuple[str, tuple[Any, ...], Callable[..., Any]]] = [
    ("ggh", (0.7,), dd(j_h)),                      # a fori_loop's index in float arithmetic
    ("ggr", (0.7,), dd(j_r)),                      # the same loop as a tail recursion
    ("ggs", (0.7,), dd(j_s)),                      # an int carried in a fori_loop's state
    ("ggq", (0.6, XS), dd(j_q)),                   # an int carried in a scan's state
    ("gw", (0.8,), jax.grad(j_w)),                 # the index through sin, cast and div
    ("ggw", (0.8,), dd(j_w)),
    ("gggw", (0.8,), jax.grad(dd(j_w))),           # order 3
    ("gggrr", (0.9,), jax.grad(dd(j_rr))),         # order 3 of a tail-recursive loop
]


def close(a: Any, b: Any) -> None:
    np.testing.assert_allclose(np.asarray(a, dtype=np.float64), np.asarray(b), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("entry,args,reference", CASES, ids=[c[0] for c in CASES])
def test_matches_jax_run_and_compiled(entry: str, args: tuple[Any, ...],
                                      reference: Callable[..., Any]) -> None:
    expected = reference(*args)
    ran = anfir.run(MOD[entry], *args)
    close(ran, expected)
    compiled = anfir.compile(MOD, entry=entry, args=list(args))
    close(anfir.run(compiled, *args), expected)
    close(anfir.run(compiled, *args), ran)


def test_no_float_cast_to_an_integer_is_left() -> None:
    """Compiled, the integer's sensitivity is a constant zero: no ``cast_like`` of a
    gradient to an integer type reaches a back end (it would be a real cast there)."""
    compiled = anfir.compile(MOD, entry="ggs", args=[0.7])
    for graph in reachable_graphs([compiled]):
        for node in toposort(graph):
            if isinstance(node, CNode) and callee_primitive(node) is gradient.cast_like:
                target = node.inputs[2].abstract
                assert getattr(target, "dtype", "f64") not in ("i64", "i32", "bool"), node


def test_cast_like_to_an_integer_is_zero() -> None:
    """The value rule itself: a float gradient of an integer is a zero of the integer's
    type (scalars and tensors), a float's is the cast."""
    assert gradient._cast_like(2.5, 3) == 0 and type(gradient._cast_like(2.5, 3)) is int
    assert gradient._cast_like(2.5, True) is False
    z = gradient._cast_like(np.array([1.5, 2.0]), np.array([1, 2], dtype=np.int32))
    assert z.dtype == np.int32 and not z.any()
    assert gradient._cast_like(np.float32(2.5), 1.0) == 2.5
    assert gradient._cast_like(np.array([1, 2]), np.zeros(2)).dtype == np.float64


def test_integer_loop_index_gets_no_gradient_through_a_cast() -> None:
    """``cast(i, "f64")`` of a float-derived integer: JAX's derivative through a cast to
    an integer is zero, and so is anfir's (the cast's rule gives the integer's zero)."""
    mod = anfir.parse("""
def f(x) = let n = cast(x * 3.0, "i64") in x * cast(n, "f64")
def gf(x) = grad(f)(x)
""")
    expected = jax.grad(lambda x: x * (x * 3.0).astype(jnp.int64).astype(jnp.float64))(1.3)
    close(anfir.run(mod["gf"], 1.3), expected)
    close(anfir.run(anfir.compile(mod, entry="gf", args=[1.3]), 1.3), expected)


@pytest.mark.parametrize("entry,args,reference", [c for c in CASES if c[0] in ("ggh", "ggs", "ggq")],
                         ids=["ggh", "ggs", "ggq"])
def test_to_jax_of_the_second_order_gradient(entry: str, args: tuple[Any, ...],
                                             reference: Callable[..., Any]) -> None:
    """The compiled second-order gradients leave through ``to_jax`` (``jax.jit``) with
    the same value as JAX's own."""
    compiled = anfir.compile(MOD, entry=entry, args=list(args))
    close(jax.jit(anfir.to_jax(compiled))(*args), reference(*args))


def test_to_jax_cast_like_of_an_integer_is_zero() -> None:
    """The JAX back end's ``cast_like`` follows the same rule as the evaluator's."""
    z = tojax_rules._cast_like(jnp.array([1.5, 2.0]), jnp.array([1, 2]))
    assert z.dtype == jnp.int64 and not bool(jnp.any(z))
    assert tojax_rules._cast_like(jnp.array(2.5), 3) == 0
    assert float(tojax_rules._cast_like(jnp.array(2.5, jnp.float32), np.float64(1.0))) == 2.5

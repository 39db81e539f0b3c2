"""Gradients: checked against finite differences and closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest

import anfir
from anfir.errors import AnfirError, GradientError

EPS = 1e-6


def numeric_grad(graph, args, i, eps=EPS):
    """Central finite difference of a scalar graph w.r.t. argument i (scalar or array)."""
    args = list(args)
    x = args[i]
    if isinstance(x, np.ndarray):
        out = np.zeros_like(x, dtype=float)
        it = np.nditer(x, flags=["multi_index"])
        for _ in it:
            idx = it.multi_index
            plus = x.copy(); plus[idx] += eps
            minus = x.copy(); minus[idx] -= eps
            args[i] = plus; fp = anfir.run(graph, *args)
            args[i] = minus; fm = anfir.run(graph, *args)
            out[idx] = (fp - fm) / (2 * eps)
        args[i] = x
        return out
    args[i] = x + eps; fp = anfir.run(graph, *args)
    args[i] = x - eps; fm = anfir.run(graph, *args)
    return (fp - fm) / (2 * eps)


def check_grad(graph, args, wrt=0, rtol=1e-5, atol=1e-6):
    g = anfir.grad(graph, wrt)
    got = anfir.run(g, *args)
    want = numeric_grad(graph, args, wrt)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    return got


def f_of(text, name="f"):
    return anfir.parse(text)[name]


# -- every differentiable primitive ------------------------------------------------
UNARY = {
    "exp": 0.3, "log": 1.7, "sin": 0.4, "cos": 0.4, "tanh": 0.2, "sqrt": 2.0, "abs": -1.3,
    "sigmoid": 0.6, "relu": 0.9, "neg": 0.5, "identity": 0.7,
}


@pytest.mark.parametrize("name,x", sorted(UNARY.items()))
def test_unary_primitive_scalar(name, x):
    check_grad(f_of(f"def f(x) = {name}(x) * 1.5"), [x])


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_primitive_tensor(name):
    x = np.array([[0.3, 1.2, 0.7], [1.1, 0.5, 1.9]])
    check_grad(f_of(f"def f(x) = sum({name}(x) * x)"), [x])


@pytest.mark.parametrize("op", ["+", "-", "*", "/", "**"])
def test_binary_operators_scalar(op):
    g = f_of(f"def f(x, y) = (x {op} y) * x")
    check_grad(g, [1.3, 0.7], 0)
    check_grad(g, [1.3, 0.7], 1)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "pow", "maximum", "minimum"])
def test_binary_broadcasting_tensor(name):
    g = f_of(f"def f(x, y) = sum({name}(x, y) * x)")
    x = np.array([[0.5, 1.5, 0.9], [1.2, 0.3, 0.8]])
    y = np.array([0.7, 1.1, 0.6])
    check_grad(g, [x, y], 0)
    check_grad(g, [x, y], 1)
    check_grad(g, [x, 0.75], 1)


def test_matmul_transpose_reshape_sum_mean():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(4, 2))
    check_grad(f_of("def f(a, b) = sum(tanh(a @ b))"), [a, b], 0)
    check_grad(f_of("def f(a, b) = sum(tanh(a @ b))"), [a, b], 1)
    check_grad(f_of("def f(a) = sum(transpose(a) * transpose(a))"), [a])
    check_grad(f_of("def f(a) = sum(transpose(a, (1, 0)) ** 3)"), [a])
    check_grad(f_of("def f(a) = sum(reshape(a, (2, 6)) * reshape(a, (2, 6)))"), [a])
    check_grad(f_of("def f(a) = sum(sum(a, 0) ** 2)"), [a])
    check_grad(f_of("def f(a) = sum(mean(a, 1) ** 2) + mean(a) ** 2"), [a])
    check_grad(f_of("def f(a) = sum(broadcast_to(sum(a, 0), (5, 4)) ** 2)"), [a])


def test_where_cast_and_stop_gradient():
    x = np.array([-1.0, 0.5, 2.0])
    check_grad(f_of("def f(x) = sum(where(x > 0.0, x * x, -x))"), [x])
    check_grad(f_of('def f(x) = sum(cast(x, "f64") * x)'), [x])
    got = anfir.run(anfir.grad(f_of("def f(x) = x * stop_gradient(x * x)")), 3.0)
    assert got == pytest.approx(9.0)


# -- the language spec's examples --------------------------------------------------
POWER = """
def power(x, n) =
  let loop = lambda (i, acc)
    if i < n then loop(i + 1, acc * x) else acc end in
  loop(0, 1.0)

def dpower(x) = grad(power)(x, 3)      # 3 * x ** 2
def ddpower(x) = grad(dpower)(x)
def dddpower(x) = grad(ddpower)(x)
"""


def test_dpower_closed_form_and_higher_orders():
    mod = anfir.parse(POWER)
    for x in (0.5, 2.0, -1.5):
        assert anfir.run(mod["dpower"], x) == pytest.approx(3 * x ** 2)
        assert anfir.run(mod["ddpower"], x) == pytest.approx(6 * x)
        assert anfir.run(mod["dddpower"], x) == pytest.approx(6.0)
    assert anfir.run(anfir.grad(mod["dpower"]), 2.0) == pytest.approx(12.0)


def test_mlp_loss_gradients_match_numpy():
    mod = anfir.parse("""
def mlp_loss(w1: f64[D, H], w2: f64[H, K], x: f64[B, D], y: f64[B, K]) -> f64 =
  let h = tanh(x @ w1) in
  let out = h @ w2 in
  sum((out - y) ** 2) / 2
""")
    rng = np.random.default_rng(1)
    w1, w2, x, y = (rng.normal(size=s) for s in [(3, 5), (5, 2), (4, 3), (4, 2)])
    dw1, dw2 = anfir.run(anfir.grad(mod["mlp_loss"], (0, 1)), w1, w2, x, y)
    h = np.tanh(x @ w1)
    dout = h @ w2 - y
    np.testing.assert_allclose(dw2, h.T @ dout)
    np.testing.assert_allclose(dw1, x.T @ ((dout @ w2.T) * (1 - h * h)))


# -- closures ------------------------------------------------------------------------
def test_closure_captured_twice_and_returned():
    mod = anfir.parse("""
def make(a) = lambda (x) a * x * a end
def f(a) = let c = make(a) in c(2.0) + c(a)
def g(a) =
  let k = lambda (x) x * a end in
  let h = lambda (y) k(y) + k(a) end in
  h(3.0)
""")
    check_grad(mod["f"], [1.3])
    assert anfir.run(anfir.grad(mod["f"]), 1.3) == pytest.approx(4 * 1.3 + 3 * 1.3 ** 2)
    check_grad(mod["g"], [0.7])


def test_closures_chosen_by_if_and_three_levels():
    mod = anfir.parse("""
def pick(a, b, c) =
  let f = if c > 0.0 then lambda (x) x * a end else lambda (x) x + b end in
  f(a * b)
def nest(a) =
  let l1 = lambda (x)
    let l2 = lambda (y)
      let l3 = lambda (z) z * x * y * a end in
      l3(y + a) end in
    l2(x * x) end in
  l1(a + 1.0)
""")
    for c in (1.0, -1.0):
        check_grad(mod["pick"], [1.2, 0.4, c], 0)
        check_grad(mod["pick"], [1.2, 0.4, c], 1)
    check_grad(mod["nest"], [0.6])


def test_higher_order_functions_and_partial():
    mod = anfir.parse("""
def twice(f, x) = f(f(x))
def sq(x) = x * x
def h(x) = twice(sq, x) + twice(lambda (y) sin(y) * x end, x)
def p(x) = let add3 = partial(lambda (a, b, c) a * b + c end, x, 3.0) in add3(x) * x
def prim(x) = twice(sin, x)
""")
    check_grad(mod["h"], [0.8])
    check_grad(mod["p"], [1.4])
    check_grad(mod["prim"], [0.3])


# -- recursion and loops -------------------------------------------------------------
def test_recursion_non_tail_and_tree():
    mod = anfir.parse("""
def rpow(x, n) = if n == 0 then 1.0 else x * rpow(x, n - 1)
def tree(x, n) = if n < 2 then x else tree(x * 0.9, n - 1) * tree(x + 0.1, n - 2)
def even(x, n) = if n == 0 then x else odd(x * 1.1, n - 1)
def odd(x, n) = if n == 0 then -x else even(sin(x), n - 1)
""")
    assert anfir.run(anfir.grad(mod["rpow"]), 1.5, 4) == pytest.approx(4 * 1.5 ** 3)
    check_grad(mod["tree"], [0.9, 6])
    check_grad(mod["even"], [0.4, 7])


def test_loop_of_2000_steps_at_default_recursion_limit():
    mod = anfir.parse("""
def run(x) =
  let loop = lambda (i, acc) if i < 2000 then loop(i + 1, acc * 0.999 + sin(x) * 0.001) else acc end in
  loop(0, x)
""")
    assert anfir.run(anfir.grad(mod["run"]), 0.3) == pytest.approx(
        numeric_grad(mod["run"], [0.3], 0), rel=1e-6)


def test_second_and_third_order_through_if_and_loops():
    mod = anfir.parse("""
def f(x) = if x > 0.0 then x * x * x else sin(x)
def d1(x) = grad(f)(x)
def d2(x) = grad(d1)(x)
def d3(x) = grad(d2)(x)
def cube_loop(x) =
  let loop = lambda (i, acc) if i < 3 then loop(i + 1, acc * x) else acc end in
  loop(0, 1.0)
def l2(x) = grad(grad(cube_loop))(x)
def l3(x) = grad(grad(grad(cube_loop)))(x)
""")
    assert anfir.run(mod["d2"], 1.5) == pytest.approx(9.0)
    assert anfir.run(mod["d3"], 1.5) == pytest.approx(6.0)
    assert anfir.run(mod["d2"], -0.5) == pytest.approx(-math.sin(-0.5))
    assert anfir.run(mod["d3"], -0.5) == pytest.approx(-math.cos(-0.5))
    assert anfir.run(mod["l2"], 2.0) == pytest.approx(12.0)
    assert anfir.run(mod["l3"], 2.0) == pytest.approx(6.0)


def test_tuples():
    mod = anfir.parse("""
def f(x, y) = let t = (x * y, sin(x), (y, x)) in t[0] + t[1] * t[2][1] + t[2][0]
def g(x) = let p = (x, x * x) in let q = (p[1], p[0]) in q[0] * q[1]
""")
    check_grad(mod["f"], [0.5, 1.5], 0)
    check_grad(mod["f"], [0.5, 1.5], 1)
    check_grad(mod["g"], [1.1])


def test_value_and_grad_and_vjp():
    g = f_of("def f(x, y) = x * y + sin(x)")
    v, d = anfir.run(anfir.value_and_grad(g, 0), 2.0, 3.0)
    assert v == pytest.approx(6.0 + math.sin(2.0)) and d == pytest.approx(3.0 + math.cos(2.0))
    dx, dy = anfir.run(anfir.grad(g, (0, 1)), 2.0, 3.0)
    assert (dx, dy) == (pytest.approx(3.0 + math.cos(2.0)), pytest.approx(2.0))
    out, bprop = anfir.run(anfir.vjp(g), 2.0, 3.0)
    assert out == pytest.approx(6.0 + math.sin(2.0))
    assert anfir.run(bprop, 2.0) == (pytest.approx(2 * (3.0 + math.cos(2.0))), pytest.approx(4.0))
    mod = anfir.parse("def f(x, y) = value_and_grad(lambda (a, b) a * b * b end, 1)(x, y)")
    assert anfir.run(mod["f"], 2.0, 3.0) == (pytest.approx(18.0), pytest.approx(12.0))


def test_gradient_descent_on_mlp_inside_the_program():
    mod = anfir.parse("""
def mlp_loss(w1, w2, x, y) =
  let h = tanh(x @ w1) in
  let out = h @ w2 in
  sum((out - y) ** 2) / 2

def train(w1, w2, x, y, steps) =
  let loop = lambda (i, w1, w2)
    if i < steps then
      let g = grad(mlp_loss, 0, 1)(w1, w2, x, y) in
      loop(i + 1, w1 - 0.05 * g[0], w2 - 0.05 * g[1])
    else (w1, w2) end in
  loop(0, w1, w2)
""")
    rng = np.random.default_rng(3)
    w1, w2, x, y = (rng.normal(size=s) * 0.5 for s in [(3, 8), (8, 2), (16, 3), (16, 2)])
    before = anfir.run(mod["mlp_loss"], w1, w2, x, y)
    t1, t2 = anfir.run(mod["train"], w1, w2, x, y, 60)
    after = anfir.run(mod["mlp_loss"], t1, t2, x, y)
    assert after < 0.7 * before


# -- errors ---------------------------------------------------------------------------
def test_grad_of_non_scalar_output_is_a_located_error():
    with pytest.raises(GradientError) as info:
        anfir.run(anfir.grad(f_of("def f(x) = (x, x)")), 1.0)
    assert "float scalar" in str(info.value)


def test_grad_wrt_integer_argument_is_an_error():
    with pytest.raises(GradientError) as info:
        anfir.run(anfir.grad(f_of("def f(x, n) = x * n"), 1), 1.0, 3)
    assert "integer" in str(info.value)


def test_missing_gradient_rules_are_all_reported(monkeypatch):
    from anfir.primitives import PRIMITIVES

    monkeypatch.setattr(PRIMITIVES["sin"], "bprop", None)
    monkeypatch.setattr(PRIMITIVES["cos"], "bprop", None)
    with pytest.raises(GradientError) as info:
        anfir.grad(anfir.parse("def f(x) =\n  sin(x) * cos(x)", "m.anf")["f"])
    text = str(info.value)
    assert text.startswith("m.anf:2:") and ": sin" in text and ": cos" in text
    assert "^" in text  # the caret under the first offending call
    assert isinstance(info.value, AnfirError)

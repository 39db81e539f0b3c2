"""Gradients: checked against finite differences and closed forms.

Every check goes through tests/gradcheck.py (``check_grad``: ``anfir.grad``
from the API and, for a program's text, ``grad`` inside the program, against
central finite differences); generated programs come from tests/programs.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import anfir
import programs
from anfir.errors import AnfirError, GradientError
from gradcheck import WAYS, check_grad, numeric_grad, smooth_at


def f_of(text, name="f"):
    return anfir.parse(text)[name]


# -- every differentiable primitive ------------------------------------------------
UNARY = {
    "exp": 0.3, "log": 1.7, "sin": 0.4, "cos": 0.4, "tanh": 0.2, "sqrt": 2.0, "abs": -1.3,
    "sigmoid": 0.6, "relu": 0.9, "neg": 0.5, "identity": 0.7,
}


@pytest.mark.parametrize("name,x", sorted(UNARY.items()))
def test_unary_primitive_scalar(name, x):
    check_grad(f"def f(x) = {name}(x) * 1.5", [x])


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_primitive_tensor(name):
    x = np.array([[0.3, 1.2, 0.7], [1.1, 0.5, 1.9]])
    check_grad(f"def f(x) = sum({name}(x) * x)", [x])


@pytest.mark.parametrize("op", ["+", "-", "*", "/", "**"])
def test_binary_operators_scalar(op):
    g = f"def f(x, y) = (x {op} y) * x"
    check_grad(g, [1.3, 0.7], 0)
    check_grad(g, [1.3, 0.7], 1)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "pow", "maximum", "minimum"])
def test_binary_broadcasting_tensor(name):
    g = f"def f(x, y) = sum({name}(x, y) * x)"
    x = np.array([[0.5, 1.5, 0.9], [1.2, 0.3, 0.8]])
    y = np.array([0.7, 1.1, 0.6])
    check_grad(g, [x, y], 0)
    check_grad(g, [x, y], 1)
    check_grad(g, [x, 0.75], 1)


def test_matmul_transpose_reshape_sum_mean():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(4, 2))
    check_grad("def f(a, b) = sum(tanh(a @ b))", [a, b], 0)
    check_grad("def f(a, b) = sum(tanh(a @ b))", [a, b], 1)
    check_grad("def f(a) = sum(transpose(a) * transpose(a))", [a])
    check_grad("def f(a) = sum(transpose(a, (1, 0)) ** 3)", [a])
    check_grad("def f(a) = sum(reshape(a, (2, 6)) * reshape(a, (2, 6)))", [a])
    check_grad("def f(a) = sum(sum(a, 0) ** 2)", [a])
    check_grad("def f(a) = sum(mean(a, 1) ** 2) + mean(a) ** 2", [a])
    check_grad("def f(a) = sum(broadcast_to(sum(a, 0), (5, 4)) ** 2)", [a])



def test_transposes_whose_permutations_are_not_their_own_inverse_at_second_order():
    # The gradient transposes by the inverse permutation; its type once said the
    # permutation itself, so the second-order program did not compile (issue 11).
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(2, 5, 3, 4)), rng.normal(size=(2, 3, 4, 5))
    f = ("def f(x, y) = sum(sin(transpose(x, (0, 3, 1, 2))) * transpose(y, (0, 2, 3, 1)))\n"
         "def g(x, y) = sum(grad(f)(x, y) * x)\n")
    ways = ("api", "program", "compiled", "compiled_program")
    check_grad(f, [x, y], (0, 1), ways=ways, rtol=1e-4)
    check_grad(f, [x, y], (0, 1), entry="g", ways=ways, rtol=1e-4)

def test_where_cast_and_stop_gradient():
    x = np.array([-1.0, 0.5, 2.0])
    check_grad("def f(x) = sum(where(x > 0.0, x * x, -x))", [x])
    check_grad('def f(x) = sum(cast(x, "f64") * x)', [x])
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


POWERS = """
def poly(x) = x ** 5 - 2.0 * x ** 3 + x ** 2
def d3(x) = grad(grad(grad(poly)))(x)
def d4(x) = grad(grad(grad(grad(poly))))(x)
"""


@pytest.mark.parametrize("entry, x", [("d4", -0.8), ("d3", 0.0)])
def test_high_derivatives_of_powers_at_and_below_zero_agree_with_jax(entry, x):
    # ``**``'s exponent gradient is ``dout * out * log(x)``: nan for x <= 0, and a
    # 0 * nan once leaked into higher orders (issue 11: the fourth derivative at -0.8
    # was nan, the third at 0 nan when run and 6.0 compiled).
    jax = pytest.importorskip("jax", reason="JAX is the reference for these derivatives")
    jax.config.update("jax_enable_x64", True)

    order = int(entry[1:])
    reference = lambda x: x ** 5 - 2.0 * x ** 3 + x ** 2  # noqa: E731
    for _ in range(order):
        reference = jax.grad(reference)
    want = float(reference(x))
    ran = anfir.run(f_of(POWERS, entry), x)
    compiled = anfir.run(anfir.compile(anfir.parse(POWERS), entry=entry, args=[x]), x)
    api = f_of(POWERS, "poly")
    for _ in range(order):
        api = anfir.grad(api)
    for got in (ran, compiled, anfir.run(api, x)):
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12)


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
    text = """
def make(a) = lambda (x) a * x * a end
def f(a) = let c = make(a) in c(2.0) + c(a)
def g(a) =
  let k = lambda (x) x * a end in
  let h = lambda (y) k(y) + k(a) end in
  h(3.0)
"""
    mod = anfir.parse(text)
    check_grad(text, [1.3], entry="f")
    assert anfir.run(anfir.grad(mod["f"]), 1.3) == pytest.approx(4 * 1.3 + 3 * 1.3 ** 2)
    check_grad(text, [0.7], entry="g")


def test_closures_chosen_by_if_and_three_levels():
    text = """
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
"""
    for c in (1.0, -1.0):
        check_grad(text, [1.2, 0.4, c], 0, entry="pick")
        check_grad(text, [1.2, 0.4, c], 1, entry="pick")
    check_grad(text, [0.6], entry="nest")


def test_higher_order_functions_and_partial():
    text = """
def twice(f, x) = f(f(x))
def sq(x) = x * x
def h(x) = twice(sq, x) + twice(lambda (y) sin(y) * x end, x)
def p(x) = let add3 = partial(lambda (a, b, c) a * b + c end, x, 3.0) in add3(x) * x
def prim(x) = twice(sin, x)
"""
    check_grad(text, [0.8], entry="h")
    check_grad(text, [1.4], entry="p")
    check_grad(text, [0.3], entry="prim")


# -- recursion and loops -------------------------------------------------------------
def test_recursion_non_tail_and_tree():
    text = """
def rpow(x, n) = if n == 0 then 1.0 else x * rpow(x, n - 1)
def tree(x, n) = if n < 2 then x else tree(x * 0.9, n - 1) * tree(x + 0.1, n - 2)
def even(x, n) = if n == 0 then x else odd(x * 1.1, n - 1)
def odd(x, n) = if n == 0 then -x else even(sin(x), n - 1)
"""
    mod = anfir.parse(text)
    assert anfir.run(anfir.grad(mod["rpow"]), 1.5, 4) == pytest.approx(4 * 1.5 ** 3)
    check_grad(text, [0.9, 6], entry="tree")
    check_grad(text, [0.4, 7], entry="even")


def test_loop_of_2000_steps_at_default_recursion_limit():
    text = """
def run(x) =
  let loop = lambda (i, acc) if i < 2000 then loop(i + 1, acc * 0.999 + sin(x) * 0.001) else acc end in
  loop(0, x)
"""
    check_grad(text, [0.3], entry="run", rtol=1e-6, atol=1e-12)


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
    text = """
def f(x, y) = let t = (x * y, sin(x), (y, x)) in t[0] + t[1] * t[2][1] + t[2][0]
def g(x) = let p = (x, x * x) in let q = (p[1], p[0]) in q[0] * q[1]
"""
    check_grad(text, [0.5, 1.5], 0, entry="f")
    check_grad(text, [0.5, 1.5], 1, entry="f")
    check_grad(text, [1.1], entry="g")


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


@pytest.fixture
def no_sin_cos_rules(monkeypatch):
    from anfir.autodiff import jtransform
    from anfir.primitives import PRIMITIVES

    monkeypatch.setattr(PRIMITIVES["sin"], "bprop", None)
    monkeypatch.setattr(PRIMITIVES["cos"], "bprop", None)
    # Graphs transformed by earlier tests must not hide the check.
    monkeypatch.setattr(jtransform, "_default_context", jtransform.JContext(weak=True))


def test_missing_gradient_rules_are_all_reported(no_sin_cos_rules):
    with pytest.raises(GradientError) as info:
        anfir.grad(anfir.parse("def f(x) =\n  sin(x) * cos(x)", "m.anf")["f"])
    text = str(info.value)
    assert text.startswith("m.anf:2:") and ": sin" in text and ": cos" in text
    assert "^" in text  # the caret under the first offending call
    assert isinstance(info.value, AnfirError)


MISSING = ("def f(x) =\n  sin(x) * cos(x)\n\n"
           "def ap(h, x) = h(x) * x\n"
           "def main(x) = grad(f)(x)\n"
           "def m2(x) = grad(lambda (y) ap(sin, y) + cos(y) end)(x)\n")


@pytest.mark.parametrize("mode", ["run", "compile"])
def test_missing_rules_of_in_program_grad_are_all_reported_with_locations(no_sin_cos_rules, mode):
    module = anfir.parse(MISSING, "m.anf")
    with pytest.raises(GradientError) as info:
        if mode == "run":
            anfir.run(module["main"], 1.0)
        else:
            anfir.compile(module, entry="main", args=[1.0])
    text = str(info.value)
    assert text.startswith("m.anf:2:6:"), text
    assert "m.anf:2:6: sin" in text and "m.anf:2:15: cos" in text, text


@pytest.mark.parametrize("mode", ["run", "compile"])
def test_missing_rule_of_a_primitive_passed_as_a_value_is_reported(no_sin_cos_rules, mode):
    module = anfir.parse(MISSING, "m.anf")
    with pytest.raises(GradientError) as info:
        if mode == "run":
            anfir.run(module["m2"], 1.0)
        else:
            anfir.compile(module, entry="m2", args=[1.0])
    text = str(info.value)
    assert "m.anf:6:32: sin" in text and "m.anf:6:45: cos" in text, text


# -- matmul: numpy's rules for vectors and batches ------------------------------------
MATMUL = """
def h(x, y) = sum(sin(x @ y) * 1.3) + sum(x @ y) * sum(x @ y)
def gx(x, y, c) = sum(grad(h, 0)(x, y) * c)
"""

# numpy's matmul rules: vectors are promoted (row on the left, column on the
# right) and the added dimension is removed; batch dimensions broadcast.
MATMUL_SHAPES = [((3,), (3, 4)), ((2, 3), (3,)), ((3,), (3,)), ((5, 2, 3), (3, 4)),
                 ((2, 3), (5, 3, 4)), ((1, 2, 3), (5, 3, 4)), ((5, 2, 3), (3,))]


@pytest.mark.parametrize("sx, sy", MATMUL_SHAPES)
@pytest.mark.parametrize("wrt", [0, 1])
def test_matmul_gradient_with_vectors_and_batches(sx, sy, wrt):
    rng = np.random.default_rng(0)
    x, y = rng.random(sx), rng.random(sy)
    # From the API, and compiled from grad inside the program (equal to 1e-12).
    got = check_grad(MATMUL, [x, y], wrt, entry="h", ways=("api", "compiled_program"),
                     agree=(1e-12, 0.0))
    assert np.shape(got["api"]) == np.shape((x, y)[wrt])


@pytest.mark.parametrize("sx, sy", [((3,), (3, 4)), ((2, 3), (3,)), ((5, 2, 3), (3, 4))])
@pytest.mark.parametrize("wrt", [0, 1])
def test_second_derivative_through_matmul(sx, sy, wrt):
    rng = np.random.default_rng(1)
    x, y, c = rng.random(sx), rng.random(sy), rng.random(sx)
    check_grad(MATMUL, [x, y, c], wrt, entry="gx", rtol=1e-4, atol=1e-5)


# -- generated programs (closures, if, tuples) -----------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs.let_programs(programs.SMOOTH), st.floats(0.2, 1.3), st.floats(-1.1, 0.9))
def test_generated_program_gradients_match_finite_differences(program, x, y):
    text = program.text
    f = anfir.parse(text)["f"]
    value = anfir.run(f, x, y)
    if not np.isfinite(value) or abs(value) > 1e6:
        return
    if not (smooth_at(f, [x, y], 0) and smooth_at(f, [x, y], 1)):
        return
    check_grad(text, [x, y], (0, 1), rtol=1e-4, atol=1e-5, msg=text)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs.let_programs(programs.SMOOTH), st.floats(0.2, 1.3), st.floats(-1.1, 0.9))
def test_generated_program_second_derivatives(program, x, y):
    f = anfir.parse(program.text)["f"]
    df = anfir.grad(f, 0)
    if not (smooth_at(f, [x, y], 0) and smooth_at(df, [x, y], 0, eps=1e-5)):
        return
    want = numeric_grad(df, [x, y], 0, eps=1e-5)
    if not np.isfinite(want) or abs(want) > 1e5:
        return
    check_grad(df, [x, y], 0, want=want, rtol=1e-3, atol=1e-4, msg=program.text)


# -- a tuple index known only at run time --------------------------------------------
DYNAMIC_INDEX = """
def g(t, k) = tuple_getitem(t, k) * tuple_getitem(t, k + 1)
def loop(t, n) =
  let l = lambda (i, acc) if i < n then l(i + 1, acc + sin(tuple_getitem(t, i)) * tuple_getitem(t, i)) else acc end in
  l(0, 0.0)
def second(t, n) = let d = grad(loop)(t, n) in d[0] * d[1] + d[2]
"""


@pytest.mark.parametrize("entry, k", [("g", 1), ("g", 0), ("loop", 3), ("second", 2)])
def test_gradients_through_a_tuple_index_known_only_at_run_time(entry, k):
    # The gradient of t[k] sets element k of zeros: typed with a run-time k too.
    t = (0.7, -1.2, 2.1)
    check_grad(DYNAMIC_INDEX, [t, k], 0, entry=entry, ways=WAYS)

"""``custom_vjp`` / ``custom_jvp``: gradients that are the user's rule — equal to the rule,
to finite differences where the rule is the true gradient, orders 1-2, through run and
compile, in the language and through the Python API; an implicitly differentiated
fixed-point solver matched against JAX's ``custom_vjp`` version."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anfir

jax = pytest.importorskip("jax")
jnp = jax.numpy
jax.config.update("jax_enable_x64", True)

PROGRAM = """
def naive_softplus(x) = log(1.0 + exp(x))
def sp_fwd(x) = (log1p(exp(-abs(x))) + maximum(x, 0.0), x)
def sp_bwd(x, dout) = (dout * sigmoid(x),)
def softplus(x) = custom_vjp(naive_softplus, sp_fwd, sp_bwd)(x)
def g_softplus(x) = grad(softplus)(x)
def gg_softplus(x) = grad(grad(softplus))(x)
def g_naive(x) = grad(naive_softplus)(x)

def sp_rule(p, t) = (naive_softplus(p[0]), t[0] * sigmoid(p[0]))
def softplus_j(x) = custom_jvp(naive_softplus, sp_rule)(x)
def g_softplus_j(x) = grad(softplus_j)(x)
def gg_softplus_j(x) = grad(grad(softplus_j))(x)
def jvp_softplus_j(x, t) = jvp(softplus_j)(x, t)

def ste(x) = custom_vjp(lambda (x) round(x) end, lambda (x) (round(x), ()) end,
                        lambda (r, dout) (dout,) end)(x)
def ste_loss(x, w) = sum(ste(x) * w)
def g_ste(x, w) = grad(ste_loss, 0, 1)(x, w)

def step(a, x) = 0.5 * cos(x) + a * x * 0.2 + a
def solve(a) = fori_loop(0, 60, lambda (i, x) step(a, x) end, a)
def fp_fwd(a) = let x = solve(a) in (x, (a, x))
def fp_bwd(res, dout) =
  let a = res[0] in
  let x = res[1] in
  let dx = grad(step, 1)(a, x) in
  let w = fori_loop(0, 60, lambda (i, w) dout + w * dx end, dout) in
  (w * grad(step, 0)(a, x),)
def fixed_point(a) = custom_vjp(solve, fp_fwd, fp_bwd)(a)
def g_fixed_point(a) = grad(fixed_point)(a)
def gg_fixed_point(a) = grad(grad(fixed_point))(a)
"""

MOD = anfir.parse(PROGRAM, "custom.anf")


def both(entry: str, *args: Any) -> list[Any]:
    compiled = anfir.compile(MOD, entry=entry, args=list(args))
    return [anfir.run(MOD[entry], *args), anfir.run(compiled, *args)]


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + np.exp(-x))


def fd(fn: Any, x: float, h: float = 1e-6) -> float:
    return (fn(x + h) - fn(x - h)) / (2 * h)


@pytest.mark.parametrize("x", [-3.0, 0.25, 2.0])
def test_stable_softplus_gradient_is_the_rule_and_the_true_gradient(x: float) -> None:
    for got in both("g_softplus", x):
        np.testing.assert_allclose(got, sigmoid(x), rtol=1e-12)
        np.testing.assert_allclose(got, fd(lambda v: anfir.run(MOD["softplus"], v), x), rtol=1e-7)
    s = sigmoid(x)
    for got in both("gg_softplus", x):
        np.testing.assert_allclose(got, s * (1 - s), rtol=1e-10)
        np.testing.assert_allclose(got, fd(lambda v: anfir.run(MOD["g_softplus"], v), x), rtol=1e-6)


def test_the_rule_is_what_runs_where_the_derived_gradient_overflows() -> None:
    with np.errstate(all="ignore"):
        assert not np.isfinite(anfir.run(MOD["g_naive"], 800.0))
        for got in both("g_softplus", 800.0):
            assert got == 1.0
        for got in both("g_softplus_j", 800.0):
            assert got == 1.0


@pytest.mark.parametrize("x", [-1.5, 0.7])
def test_custom_jvp_gives_grad_jvp_and_second_order(x: float) -> None:
    s = sigmoid(x)
    for got in both("g_softplus_j", x):
        np.testing.assert_allclose(got, s, rtol=1e-12)
    for got in both("gg_softplus_j", x):
        np.testing.assert_allclose(got, s * (1 - s), rtol=1e-10)
    for got in both("jvp_softplus_j", x, 3.0):
        np.testing.assert_allclose(got[1], 3.0 * s, rtol=1e-12)
        np.testing.assert_allclose(got[0], np.log1p(np.exp(x)), rtol=1e-12)


def test_straight_through_estimator_passes_the_gradient_through_round() -> None:
    x = np.array([0.2, 1.6, -2.7])
    w = np.array([1.5, -2.0, 0.5])
    for dx, dw in both("g_ste", x, w):
        np.testing.assert_allclose(dx, w)           # the rule: round is the identity backwards
        np.testing.assert_allclose(dw, np.round(x))  # the forward value is round's


def _jax_fixed_point() -> Any:
    def step(a: Any, x: Any) -> Any:
        return 0.5 * jnp.cos(x) + a * x * 0.2 + a

    def solve(a: Any) -> Any:
        return jax.lax.fori_loop(0, 60, lambda i, x: step(a, x), a)

    @jax.custom_vjp
    def fixed_point(a: Any) -> Any:
        return solve(a)

    def fwd(a: Any) -> Any:
        x = solve(a)
        return x, (a, x)

    def bwd(res: Any, dout: Any) -> Any:
        a, x = res
        _, vjp_x = jax.vjp(lambda x: step(a, x), x)
        _, vjp_a = jax.vjp(lambda a: step(a, x), a)
        w = jax.lax.fori_loop(0, 60, lambda i, w: dout + vjp_x(w)[0], dout)
        return (vjp_a(w)[0],)

    fixed_point.defvjp(fwd, bwd)
    return fixed_point


def test_implicit_fixed_point_matches_jax_custom_vjp() -> None:
    reference = _jax_fixed_point()
    a = 0.3
    value = float(reference(a))
    for got in both("fixed_point", a):
        np.testing.assert_allclose(got, value, rtol=1e-12)
    expected = float(jax.grad(reference)(a))
    for got in both("g_fixed_point", a):
        np.testing.assert_allclose(got, expected, rtol=1e-10)
        # The implicit gradient is the true derivative of the fixed point.
        np.testing.assert_allclose(got, fd(lambda v: anfir.run(MOD["fixed_point"], v), a), rtol=1e-6)
    expected2 = float(jax.grad(jax.grad(reference))(a))
    for got in both("gg_fixed_point", a):
        np.testing.assert_allclose(got, expected2, rtol=1e-8)


def test_python_api_custom_vjp_and_custom_jvp() -> None:
    api = anfir.parse("""
def f(x) = x * x * x
def fwd(x) = (x * x * x, x)
def bwd(x, dout) = (dout * 10.0 * x,)
def rule(p, t) = (p[0] * p[0] * p[0], t[0] * 7.0)
""")
    cv = anfir.custom_vjp(api["f"], api["fwd"], api["bwd"])
    assert anfir.run(cv, 2.0) == 8.0
    assert anfir.run(anfir.grad(cv), 2.0) == 20.0  # the user's (deliberately wrong) rule
    assert anfir.run(anfir.compile(anfir.grad(cv), args=[2.0]), 2.0) == 20.0
    cj = anfir.custom_jvp(api["f"], api["rule"])
    assert anfir.run(anfir.grad(cj), 2.0) == 7.0
    assert anfir.run(anfir.jvp(cj), 2.0, 1.0) == (8.0, 7.0)
    with pytest.raises(anfir.AnfirError):
        anfir.custom_vjp(api["f"], api["fwd"], api["f"])


# -- vmap of custom rules: the user's rule, batched (as jax.custom_vjp under jax.vmap) -----------
jax.config.update("jax_enable_x64", True)
jnp = jax.numpy

VMAPPED = anfir.parse("""
def f(x, w) = sin(x) * w
def f_fwd(x, w) = (sin(x) * w, (x, w))
def f_bwd(res, g) = (clip(g * cos(res[0]) * res[1], -0.5, 0.5), g * sin(res[0]) * 3.0)
def cf(x, w) = custom_vjp(f, f_fwd, f_bwd)(x, w)
def v(xs, w) = vmap(cf, (0, None))(xs, w)
def g_sum(xs, w) = grad(lambda (xs, w) sum(vmap(cf, (0, None))(xs, w)) end, 0, 1)(xs, w)
def v_grad(xs, w) = vmap(grad(cf, 0, 1), (0, None))(xs, w)

def c(x) = x * x * x
def c_rule(p, t) = (c(p[0]), t[0] * 5.0 * p[0])
def cj(x) = custom_jvp(c, c_rule)(x)
def vj(xs) = vmap(cj)(xs)
def g_vj(xs) = grad(lambda (xs) sum(vmap(cj)(xs) * xs) end)(xs)
def v_grad_j(xs) = vmap(grad(cj))(xs)
def jvp_vj(xs, ts) = jvp(lambda (xs) vmap(cj)(xs) end)(xs, ts)

def k(x) = sin(x)
def k_fwd(x) = (sin(x), x)
def k_bwd(r, g) = (g * 2.0,)
def direct(xs) = vmap(custom_vjp(k, k_fwd, k_bwd))(xs)
def g_direct(xs) = grad(lambda (xs) sum(vmap(custom_vjp(k, k_fwd, k_bwd))(xs)) end)(xs)
def g_whole(xs) = grad(lambda (xs) sum(custom_vjp(k, k_fwd, k_bwd)(xs)) end)(xs)
""", "vmapped_custom.anf")


@jax.custom_vjp
def _jf(x: Any, w: Any) -> Any:
    return jnp.sin(x) * w


def _jf_fwd(x: Any, w: Any) -> Any:
    return jnp.sin(x) * w, (x, w)


def _jf_bwd(res: Any, g: Any) -> Any:
    return jnp.clip(g * jnp.cos(res[0]) * res[1], -0.5, 0.5), g * jnp.sin(res[0]) * 3.0


_jf.defvjp(_jf_fwd, _jf_bwd)


@jax.custom_jvp
def _jc(x: Any) -> Any:
    return x * x * x


@_jc.defjvp
def _jc_jvp(p: Any, t: Any) -> Any:
    return _jc(p[0]), t[0] * 5.0 * p[0]


@jax.custom_vjp
def _jk(x: Any) -> Any:
    return jnp.sin(x)


_jk.defvjp(lambda x: (jnp.sin(x), x), lambda r, g: (g * 2.0,))


XS = np.array([0.3, -1.2, 2.0, 0.7])
W = 1.7

VMAP_CASES = [
    ("v", (XS, W), lambda xs, w: jax.vmap(_jf, (0, None))(xs, w)),
    ("g_sum", (XS, W), jax.grad(lambda xs, w: jnp.sum(jax.vmap(_jf, (0, None))(xs, w)), (0, 1))),
    ("v_grad", (XS, W), jax.vmap(jax.grad(_jf, (0, 1)), (0, None))),
    ("vj", (XS,), jax.vmap(_jc)),
    ("g_vj", (XS,), jax.grad(lambda xs: jnp.sum(jax.vmap(_jc)(xs) * xs))),
    ("v_grad_j", (XS,), jax.vmap(jax.grad(_jc))),
    ("jvp_vj", (XS, XS[::-1].copy()), lambda xs, ts: jax.jvp(jax.vmap(_jc), (xs,), (ts,))),
    ("direct", (XS,), jax.vmap(_jk)),
    # the rule reads only the cotangent: it must have the output's shape (the compiled
    # gradient once dropped the sum's unreduce, an untyped shape adjustment, and gave 2.0)
    ("g_direct", (XS,), jax.grad(lambda xs: jnp.sum(jax.vmap(_jk)(xs)))),
    ("g_whole", (XS,), jax.grad(lambda xs: jnp.sum(_jk(xs)))),
]


def _leaves(value: Any) -> list[np.ndarray]:
    if isinstance(value, (tuple, list)):
        return [leaf for item in value for leaf in _leaves(item)]
    return [np.asarray(value, dtype=np.float64)]


@pytest.mark.parametrize("entry,args,reference", VMAP_CASES, ids=[c[0] for c in VMAP_CASES])
def test_vmap_of_a_custom_rule_matches_jax(entry: str, args: tuple, reference: Any) -> None:
    want = _leaves(reference(*args))
    compiled = anfir.compile(VMAPPED, entry=entry, args=list(args))
    for where, got in (("run", anfir.run(VMAPPED[entry], *args)),
                       ("compiled", anfir.run(compiled, *args))):
        got_leaves = _leaves(got)
        assert len(got_leaves) == len(want), (where, got)
        for g, w in zip(got_leaves, want):
            np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14, err_msg=f"{entry} {where}")


def test_the_batched_rule_is_the_users_not_the_derived_gradient() -> None:
    # The rule clips the x-cotangent at 0.5 and triples the w one: the derived
    # gradient (cos(x) * w, sum sin(x)) differs, so equality with it would be a failure.
    dx, dw = anfir.run(anfir.compile(VMAPPED, entry="g_sum", args=[XS, W]), XS, W)
    assert np.all(np.abs(dx) <= 0.5) and not np.allclose(dx, np.cos(XS) * W)
    np.testing.assert_allclose(dw, 3.0 * np.sum(np.sin(XS)), rtol=1e-12)
    # the compiled batched program has no per-example loop: the rule is batched
    assert "scan" not in anfir.dump_ir(anfir.compile(VMAPPED, entry="g_sum", args=[XS, W]))

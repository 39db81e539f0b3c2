"""Convolution, pooling and batch norm (anfir/primitives/conv.py) against PyTorch.

Values of the anfir programs vs torch.nn.functional (f32 and f64, strides,
padding forms, dilation, groups); the shape rules on known and symbolic
dimensions vs evaluated shapes; gradients of whole programs vs torch.autograd
and finite differences; a second-order gradient through conv; the JAX rules.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import sympy

import anfir
from anfir.abstract.shapes import dim_symbol
from anfir.abstract.values import ATensor
from anfir.errors import AnfirError
from anfir.primitives import PRIMITIVES
from anfir.primitives import conv as nn

torch = pytest.importorskip("torch", reason="the references are torch.nn.functional")
F = torch.nn.functional

RNG = np.random.default_rng(0)


def _run(source: str, *args: Any) -> Any:
    return anfir.run(anfir.parse(source)["f"], *args)


def _t(a: np.ndarray) -> Any:
    return torch.tensor(a)


def _close(got: Any, want: Any, dtype: Any) -> None:
    tol = 1e-4 if dtype == np.float32 else 1e-10
    want = want.detach().numpy() if hasattr(want, "detach") else want
    assert np.asarray(got).dtype == dtype
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


CONVS = [  # (spatial rank, stride, padding (anfir), padding (torch), dilation, groups)
    (2, 1, 0, 0, 1, 1), (2, 2, 1, 1, 1, 1), (2, (2, 1), (1, 2), (1, 2), (2, 1), 2),
    (1, 3, 2, 2, 1, 1), (3, 2, 1, 1, 1, 2), (2, 1, "same", "same", 2, 1), (1, 1, "valid", "valid", 1, 1),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", CONVS)
def test_conv_values_and_gradients_match_torch(case: tuple[Any, ...], dtype: Any) -> None:
    n, stride, pad, tpad, dil, groups = case
    x = RNG.standard_normal((2, 4) + (7,) * n).astype(dtype)
    w = RNG.standard_normal((6, 4 // groups) + (3,) * n).astype(dtype)
    b = RNG.standard_normal(6).astype(dtype)
    attrs = f"stride={stride!r}, padding={pad!r}, dilation={dil!r}, groups={groups}".replace("'", '"')
    src = f"def f(x, w, b) = conv(x, w, b, {attrs})\n"
    fn = [F.conv1d, F.conv2d, F.conv3d][n - 1]
    xt, wt, bt = (_t(a).requires_grad_() for a in (x, w, b))
    want = fn(xt, wt, bt, stride=stride, padding=tpad, dilation=dil, groups=groups)
    _close(_run(src, x, w, b), want, dtype)
    (want * want).sum().backward()
    module = anfir.parse(f"def f(x, w, b) = sum(conv(x, w, b, {attrs}) ** 2)\n")
    gx, gw, gb = anfir.run(anfir.grad(module["f"], (0, 1, 2)), x, w, b)
    for got, ref in ((gx, xt.grad), (gw, wt.grad), (gb, bt.grad)):
        _close(got, ref, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("stride, pad, opad, dil, groups", [(1, 0, 0, 1, 1), (2, 1, 1, 1, 1),
                                                            (2, 1, 0, 2, 2), (3, 2, 2, 1, 1)])
def test_conv_transpose_matches_torch(stride: int, pad: int, opad: int, dil: int, groups: int,
                                      dtype: Any) -> None:
    x = RNG.standard_normal((2, 4, 5, 5)).astype(dtype)
    w = RNG.standard_normal((4, 3, 3, 3)).astype(dtype)
    b = RNG.standard_normal(3 * groups).astype(dtype)
    attrs = f"stride={stride}, padding={pad}, output_padding={opad}, dilation={dil}, groups={groups}"
    xt, wt, bt = (_t(a).requires_grad_() for a in (x, w, b))
    want = F.conv_transpose2d(xt, wt, bt, stride=stride, padding=pad, output_padding=opad,
                              dilation=dil, groups=groups)
    _close(_run(f"def f(x, w, b) = conv_transpose(x, w, b, {attrs})\n", x, w, b), want, dtype)
    (want * want).sum().backward()
    module = anfir.parse(f"def f(x, w, b) = sum(conv_transpose(x, w, b, {attrs}) ** 2)\n")
    for got, ref in zip(anfir.run(anfir.grad(module["f"], (0, 1, 2)), x, w, b),
                        (xt.grad, wt.grad, bt.grad)):
        _close(got, ref, dtype)


POOLS = [(2, None, 0, 1, False), (3, 2, 1, 1, True), (3, 2, 1, 2, False), (2, 2, 0, 1, True),
         ((3, 2), (2, 1), (1, 0), 1, False)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kernel, stride, pad, dil, ceil", POOLS)
def test_pooling_matches_torch(kernel: Any, stride: Any, pad: Any, dil: int, ceil: bool,
                               dtype: Any) -> None:
    x = RNG.standard_normal((2, 3, 8, 7)).astype(dtype)
    c = "true" if ceil else "false"
    xt = _t(x).requires_grad_()
    want = F.max_pool2d(xt, kernel, stride, pad, dil, ceil_mode=ceil)
    src = f"max_pool(x, {kernel}, {stride if stride else 'None'}, {pad}, {dil}, {c})"
    _close(_run(f"def f(x) = {src}\n", x), want, dtype)
    (want * want).sum().backward()
    _close(anfir.run(anfir.grad(anfir.parse(f"def f(x) = sum({src} ** 2)\n")["f"]), x), xt.grad, dtype)
    for include in (True, False):
        xt = _t(x).requires_grad_()
        want = F.avg_pool2d(xt, kernel, stride, pad, ceil_mode=ceil, count_include_pad=include)
        inc = "true" if include else "false"
        src = f"avg_pool(x, {kernel}, stride={stride if stride else 'None'}, padding={pad}, " \
              f"ceil_mode={c}, count_include_pad={inc})"
        _close(_run(f"def f(x) = {src}\n", x), want, dtype)
        (want * want).sum().backward()
        _close(anfir.run(anfir.grad(anfir.parse(f"def f(x) = sum({src} ** 2)\n")["f"]), x),
               xt.grad, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_global_pools_and_batch_norm_match_torch(dtype: Any) -> None:
    x = RNG.standard_normal((2, 3, 5, 4)).astype(dtype)
    vecs = [RNG.standard_normal(3).astype(dtype) for _ in range(3)] + [(RNG.random(3) + 0.5).astype(dtype)]
    xt = _t(x).requires_grad_()
    _close(_run("def f(x) = global_avg_pool(x)\n", x), xt.mean((2, 3), keepdim=True), dtype)
    _close(_run("def f(x) = global_max_pool(x)\n", x), xt.amax((2, 3), keepdim=True), dtype)
    ts = [_t(v).requires_grad_() for v in vecs]
    src = "def f(x, s, b, m, v) = batch_norm(x, s, b, m, v, eps=1e-3)\n"
    _close(_run(src, x, *vecs), F.batch_norm(_t(x), _t(vecs[2]), _t(vecs[3]), _t(vecs[0]),
                                             _t(vecs[1]), training=False, eps=1e-3), dtype)
    # torch's batch_norm does not differentiate its running statistics: the formula does
    col = [t.reshape(-1, 1, 1) for t in ts]
    want = (xt - col[2]) / torch.sqrt(col[3] + 1e-3) * col[0] + col[1]
    (want * want).sum().backward()
    module = anfir.parse("def f(x, s, b, m, v) = sum(batch_norm(x, s, b, m, v, eps=1e-3) ** 2)\n")
    grads = anfir.run(anfir.grad(module["f"], (0, 1, 2, 3, 4)), x, *vecs)
    for got, ref in zip(grads, [xt.grad, *[t.grad for t in ts]]):
        _close(got, ref, dtype)
    gsrc = "def f(x) = sum(global_max_pool(x) * global_avg_pool(x))\n"
    xt = _t(x).requires_grad_()
    (xt.amax((2, 3), keepdim=True) * xt.mean((2, 3), keepdim=True)).sum().backward()
    _close(anfir.run(anfir.grad(anfir.parse(gsrc)["f"]), x), xt.grad, dtype)


def test_second_order_through_conv_matches_torch() -> None:
    x = RNG.standard_normal((1, 2, 5, 5))
    w = RNG.standard_normal((3, 2, 3, 3))
    src = """
def inner(x, w) = sum(max_pool(conv(x, w * w, stride=2, padding=1) ** 2, 2) + avg_pool(conv(x, w), 3))
def f(x, w) = sum(grad(inner)(x, w) ** 2)
"""
    got = anfir.run(anfir.grad(anfir.parse(src)["f"], 1), x, w)
    xt, wt = _t(x).requires_grad_(), _t(w).requires_grad_()
    inner = (F.max_pool2d(F.conv2d(xt, wt * wt, stride=2, padding=1) ** 2, 2).sum()
             + F.avg_pool2d(F.conv2d(xt, wt), 3).sum())
    (gx,) = torch.autograd.grad(inner, xt, create_graph=True)
    (gx ** 2).sum().backward()
    _close(got, wt.grad, np.float64)


def test_gradients_agree_with_finite_differences() -> None:
    x = RNG.standard_normal((1, 2, 6, 5))
    w = RNG.standard_normal((2, 1, 2, 3))
    src = "def f(x, w) = sum(sin(avg_pool(conv(x, w, padding=(1, 0, 0, 2), groups=2), 2, 1)))\n"
    module = anfir.parse(src)
    gw = anfir.run(anfir.grad(module["f"], 1), x, w)
    eps = 1e-6
    numeric = np.zeros_like(w)
    for i in np.ndindex(*w.shape):
        d = np.zeros_like(w)
        d[i] = eps
        numeric[i] = (anfir.run(module["f"], x, w + d) - anfir.run(module["f"], x, w - d)) / (2 * eps)
    np.testing.assert_allclose(gw, numeric, rtol=1e-6, atol=1e-7)


def test_shape_rules_agree_with_evaluation_and_work_on_symbols() -> None:
    x = np.zeros((2, 4, 9, 8))
    w = np.zeros((6, 2, 3, 2))
    for pad in (1, (1, 2), (0, 1, 2, 3), "same", "valid"):
        attrs = {"stride": (2, 1), "padding": pad, "dilation": (1, 2), "groups": 2}
        got = nn.conv.infer(ATensor("f64", x.shape), ATensor("f64", w.shape), **attrs)
        assert got.shape == nn.conv.impl(x, w, **attrs).shape
    for kernel, st, ceil in ((3, 2, True), (2, None, False), ((2, 3), (1, 2), True)):
        attrs = {"kernel": kernel, "stride": st, "padding": 1, "ceil_mode": ceil}
        assert nn.max_pool.infer(ATensor("f32", x.shape), **attrs, dilation=1).shape \
            == nn.max_pool.impl(x, **attrs).shape
    n, h = dim_symbol("n"), dim_symbol("h")
    got = nn.conv.infer(ATensor("f32", (n, 4, h, 8)), ATensor("f32", w.shape), stride=2,
                        padding=1, dilation=1, groups=2)
    assert got.dtype == "f32" and got.shape[0] == n and got.shape[1] == 6
    assert sympy.simplify(got.shape[2] - (sympy.floor((h - 1) / 2) + 1)) == 0
    assert got.shape[3] == 5
    same = nn.conv.infer(ATensor("f32", (n, 4, h, 8)), ATensor("f32", w.shape), stride=2,
                         padding="same", dilation=1, groups=2)
    assert sympy.simplify(same.shape[2] - sympy.ceiling(h / 2)) == 0
    ct = nn.conv_transpose.infer(ATensor("f64", (n, 4, h, 3)), ATensor("f64", (4, 3, 3, 3)),
                                 stride=2, padding=1, output_padding=1, dilation=1, groups=1)
    assert ct.shape[1] == 3 and sympy.simplify(ct.shape[2] - 2 * h) == 0 and ct.shape[3] == 6
    pooled = nn.avg_pool.infer(ATensor("f32", (n, 3, h, 8)), kernel=2, stride=None, padding=0,
                               ceil_mode=False, count_include_pad=True)
    assert sympy.simplify(pooled.shape[2] - sympy.floor(h / 2)) == 0


def test_an_f32_network_stays_f32_through_compile() -> None:
    src = """
def f(x, w, s, b, m, v) =
  sum(global_avg_pool(max_pool(relu(batch_norm(conv(x, w, padding=1), s, b, m, v)), 2)))
"""
    args = [RNG.standard_normal((1, 3, 8, 8)), RNG.standard_normal((4, 3, 3, 3))] + \
           [RNG.random(4) + 0.5 for _ in range(4)]
    args = [a.astype(np.float32) for a in args]
    module = anfir.parse(src)
    compiled = anfir.compile(module, entry="f", args=args)
    assert np.asarray(anfir.run(compiled, *args)).dtype == np.float32
    grads = anfir.run(anfir.grad(module["f"], (0, 1)), *args)
    assert all(g.dtype == np.float32 for g in grads)


@pytest.mark.parametrize("source", [
    "def f(x, w) = conv(x, w, padding=-1)\n", "def f(x, w) = conv(x, w, stride=(1, 2, 3))\n",
    "def f(x, w) = conv(x, w, groups=3)\n", "def f(x, w) = max_pool(x, (2, 2, 2))\n",
])
def test_bad_attributes_are_anfir_errors(source: str) -> None:
    with pytest.raises(AnfirError):
        _run(source, np.zeros((1, 4, 5, 5)), np.zeros((2, 4, 3, 3)))


def test_jax_rules_compute_what_the_kernels_compute() -> None:
    jax = pytest.importorskip("jax", reason="the JAX back end's rules")
    from anfir.backends.tojax.conv_rules import CONV_RULES
    x = RNG.standard_normal((2, 4, 7, 6))
    w = RNG.standard_normal((6, 2, 3, 2))
    d = RNG.standard_normal((2, 6, 4, 6))
    conv_attrs = {"stride": (2, 1), "padding": (1, 0, 1, 1), "dilation": 1, "groups": 2}
    cases = [(nn.conv, (x, w), conv_attrs), (nn.conv_input_grad, (d, w, x), conv_attrs),
             (nn.conv_weight_grad, (x, d, w), conv_attrs),
             (nn.conv_transpose, (x, RNG.standard_normal((4, 3, 3, 3))),
              {"stride": 2, "padding": 1, "output_padding": 1}),
             (nn.max_pool, (x,), {"kernel": 3, "stride": 2, "padding": 1, "ceil_mode": True}),
             (nn.avg_pool, (x,), {"kernel": 3, "stride": 2, "padding": 1, "ceil_mode": True,
                                  "count_include_pad": False}),
             (nn.global_avg_pool, (x,), {}), (nn.channel_sum, (x,), {})]
    with jax.enable_x64(True):
        for prim, args, attrs in cases:
            want = prim.impl(*args, **attrs)
            got = CONV_RULES[prim](*[jax.numpy.asarray(a) for a in args], **attrs)
            np.testing.assert_allclose(np.asarray(got), want, rtol=1e-9, atol=1e-9, err_msg=prim.name)
    assert set(CONV_RULES) == {p for p in PRIMITIVES.values() if p.family == "nn"}

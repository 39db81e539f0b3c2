"""MindIR writes the shaping operators with static shapes — concat, stack, slice (steps of
1), split (as Slices), constant pad (Concat of blocks of the value, a negative pad a crop)
— and their gradients, and padded average pools (AvgPool of x padded with zeros, divided
by each window's share inside x when the pads do not count; the gradient's padding cut off): each program round-trips with anfir's numbers (MindSpore runs
them too: tests_mindspore/test_mindspore_live.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anfir
from anfir.primitives.loops import flatten_value

pytest.importorskip("google.protobuf")

PROGRAM = anfir.parse("""
def joins(x: f64[2, 3], y: f64[2, 3]) =
  (concat((x, y), 1), concat((x, y, x)), stack((x, y)), stack((x, y), -1))
def cuts(x: f64[4, 6]) =
  (slice(x, (1,), (3,)), slice(x, (-5, 0), (100, -2), (1, 0)), split(x, 3, 1), split(x, (1, 3), 0))
def pads(x: f64[2, 3]) =
  (pad(x, (1, 0, 0, 2)), pad(x, (0, 1, 1, 0), value=-2.5), pad(x, (-1, 1, 0, -1)))
def loss(x: f64[4, 6], y: f64[4, 6]) =
  let a = split(concat((x, y), 1), (5, 7), 1) in
  sum(sin(a[0]) * split(a[1], (5, 2), 1)[0]) + sum(stack((x, y)) ** 2)
def g(x: f64[4, 6], y: f64[4, 6]) = grad(loss, 0, 1)(x, y)
def pools(x: f32[2, 3, 7, 6]) =
  (avg_pool(x, 2, padding=(1, 0), count_include_pad=false), avg_pool(x, 3, 2, 1),
   avg_pool(x, (2, 3), (1, 2), (1, 1), count_include_pad=false))
def pool_loss(x: f32[2, 3, 7, 6]) =
  sum(sin(avg_pool(x, 2, padding=(1, 0), count_include_pad=false))) + sum(avg_pool(x, 3, 2, 1) ** 2)
def g_pools(x: f32[2, 3, 7, 6]) = grad(pool_loss)(x)
def takes(x: f64[4, 5], i: i64[3], k: i64) =
  (gather(x, i), gather(x, i, 1), gather(x, k, -1), gather(x, array((-1, 0, 2)), 1))
def embed(x: f64[4, 5], i: i64[2, 3]) = sum(sin(gather(x, i)) * gather(x, i))
def g_embed(x: f64[4, 5], i: i64[2, 3]) = grad(embed)(x, i)
""", "shaping.anf")

RNG = np.random.default_rng(4)
ARGS = {"joins": [RNG.normal(size=(2, 3)), RNG.normal(size=(2, 3))], "cuts": [RNG.normal(size=(4, 6))],
        "pads": [RNG.normal(size=(2, 3))], "loss": [RNG.normal(size=(4, 6)), RNG.normal(size=(4, 6))],
        "g": [RNG.normal(size=(4, 6)), RNG.normal(size=(4, 6))],
        "pools": [RNG.normal(size=(2, 3, 7, 6)).astype(np.float32)],
        "g_pools": [RNG.normal(size=(2, 3, 7, 6)).astype(np.float32)],
        "takes": [RNG.normal(size=(4, 5)), np.array([3, -1, -4]), np.int64(-2)],
        "g_embed": [RNG.normal(size=(4, 5)), np.array([[0, 3, -1], [3, 3, 1]])]}


def leaves(value: Any) -> list[np.ndarray]:
    return [np.asarray(v) for v in flatten_value(value)[0]]


@pytest.mark.parametrize("entry", sorted(ARGS))
def test_shaping_operators_round_trip(entry: str) -> None:
    args = ARGS[entry]
    back = anfir.import_mindir(anfir.export_mindir(PROGRAM, entry=entry, args=args))
    want, got = leaves(anfir.run(PROGRAM[entry], *args)), leaves(anfir.run(back.entry, *args))
    assert len(want) == len(got)
    for a, b in zip(want, got):
        assert a.shape == b.shape
        tol = 1e-6 if a.dtype == np.float32 else 1e-12
        np.testing.assert_allclose(b, a, rtol=tol, atol=tol)


def test_a_strided_slice_is_refused_by_name() -> None:
    mod = anfir.parse("def f(x: f64[6]) = slice(x, (0,), (6,), (0,), (2,))")
    with pytest.raises(anfir.AnfirError, match="a step other than 1"):
        anfir.export_mindir(mod, entry="f", args=[np.arange(6.0)])

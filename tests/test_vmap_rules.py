"""Batching rules against their definition: ``vmap(op)`` equals the op applied to each
example and the results stacked, for every operator case of the op table (and a few
shaping, matmul and nn cases), over random batched/unbatched argument combinations and
batch axes; and the primitives that still go through the fallback loop, listed."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import anfir
import ops_table
from anfir.autodiff.batching import FALLBACK_ONLY, RULES
from anfir.primitives import PRIMITIVES

CASES: list[tuple[str, str, int, str]] = []
"""(id, ANF call over x, y, number of arguments, kind)."""
for op in ops_table.UNARY + ops_table.BINARY + ops_table.PREDICATES + ops_table.INTEGER:
    CASES.append((op.id, op.call, op.nargs, op.kind))
for red in ops_table.REDUCTIONS:
    if any(isinstance(v, float) and not np.isfinite(v) for _, v in red.kw):
        continue  # ord=inf has no ANF literal
    kw = "".join(f", {k}={v}" for k, v in red.kw)
    arg = red.arg.replace("x", "{x}")
    for axis, keep in ((None, "false"), (0, "false"), (-1, "true"), (None, "true")):
        CASES.append((f"{red.id}_{axis}_{keep}", f"{red.name}({arg}, axis={'none' if axis is None else axis}, keepdims={keep}{kw})".replace("axis=none", "axis=None"), 1, "float"))
CASES += [
    ("matmul", "{x} @ {y}", 2, "mat"),
    ("softmax", "softmax({x}, axis=0)", 1, "float"),
    ("log_softmax", "log_softmax({x})", 1, "float"),
    ("cumsum", "cumsum({x}, axis=-1)", 1, "float"),
    ("transpose", "transpose({x}, (1, 0))", 1, "mat1"),
    ("reshape", "reshape({x}, (-1,))", 1, "float"),
    ("flatten", "flatten({x})", 1, "float"),
    ("slice", "slice({x}, (0,), (1,), axes=(-1,))", 1, "float"),
    ("concat", "concat(({x}, {y}), axis=-1)", 2, "same"),
    ("stack", "stack(({x}, {y}), axis=0)", 2, "same"),
    ("where", "where({x} > 0.0, {x}, {y})", 2, "float"),
    ("einsum", 'einsum("ij,jk->ik", {x}, {y})', 2, "mat"),
    ("tril", "tril({x})", 1, "mat1"),
    ("flip", "flip({x}, axis=0)", 1, "float"),
    ("pad", "pad({x}, (1, 0, 0, 2))", 1, "mat1"),
    ("shape", "size({x}) * 1.0 + {x}", 1, "float"),
    ("conv", "conv({x}, ones((3, 2, 3)), stride=2)", 1, "nchw"),
    ("max_pool", "max_pool({x}, (2,))", 1, "nchw"),
    ("global_avg_pool", "global_avg_pool({x})", 1, "nchw"),
    ("instance_norm", "instance_norm({x}, ones((2,)), zeros((2,)))", 1, "nchw"),
]


def _draw(rng: np.random.Generator, kind: str, shape: tuple[int, ...]) -> Any:
    if kind == "int":
        return rng.integers(1, 6, size=shape)
    if kind == "bool":
        return rng.random(size=shape) > 0.5
    return rng.uniform(0.3, 1.8, size=shape)


def _shapes(kind: str, nargs: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    if kind == "mat":
        mats: list[tuple[int, ...]] = [(2, 3), (3, 2)]
        return mats[:nargs]
    if kind == "mat1":
        return [(3, 3)]
    if kind == "nchw":
        return [(2, 2, 7)]
    base = [(2, 3), (3,), ()][int(rng.integers(0, 2))]
    if kind == "same":
        return [base] * nargs
    shapes = [base]
    for _ in range(nargs - 1):
        shapes.append(base if rng.random() < 0.5 else base[1:])
    return shapes


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_vmap_of_an_operator_is_the_stack_of_its_examples(case: tuple[str, str, int, str]) -> None:
    name, call, nargs, kind = case
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    params = ["x", "y"][:nargs]
    text = f"def f({', '.join(params)}) = " + call.format(x="x", y="y")
    mod = anfir.parse(text)
    for trial in range(2):
        shapes = _shapes(kind, nargs, rng)
        n = int(rng.integers(1, 4))
        axes: list[Any] = []
        args = []
        for i, shape in enumerate(shapes):
            batched = i == 0 or rng.random() < 0.6
            if not batched:
                axes.append(None)
                args.append(_draw(rng, kind if kind in ("int", "bool") else "float", shape))
                continue
            axis = int(rng.integers(0, len(shape) + 1)) if trial else 0
            stacked = _draw(rng, kind if kind in ("int", "bool") else "float", (n,) + shape)
            args.append(np.moveaxis(stacked, 0, axis))
            axes.append(axis)
        examples = []
        for k in range(n):
            one = [a if ax is None else np.take(a, k, axis=ax) for a, ax in zip(args, axes)]
            examples.append(np.asarray(anfir.run(mod["f"], *one)))
        want = np.stack(examples)
        got = anfir.run(anfir.vmap(mod["f"], in_axes=tuple(axes)), *args)
        assert np.asarray(got).shape == want.shape, (name, axes)
        np.testing.assert_allclose(np.asarray(got, dtype=want.dtype), want, rtol=1e-12, atol=1e-12)


def test_the_primitives_without_a_batching_rule_are_these() -> None:
    # Each runs once per example (batch_loop); anfir.to_jax batches them with jax.vmap.
    # The structured loops, custom derivatives, remat_barrier and the SPMD primitives
    # (collectives, shard, axis_*) landed beside vmap and have no batching rule yet.
    assert sorted(p.name for p in FALLBACK_ONLY) == [
        'all_gather', 'all_reduce', 'all_to_all',
        'arange', 'array', 'attention_probs', 'attention_scale', 'avg_pool_grad', 'axis_size',
        'axis_slice',
        'batch_expand', 'batch_fn', 'batch_loop', 'batch_moveaxis', 'batch_norm', 'batch_reshape',
        'batch_select', 'batch_shape', 'batch_tangent_dot', 'batch_tangent_scale', 'batch_unexpand',
        'broadcast_to', 'channel_spread', 'channel_sum', 'channel_view', 'class_mask', 'concat_grad',
        'conv_core', 'conv_input_grad', 'conv_weight_grad', 'cross_entropy', 'custom_jvp',
        'custom_vjp',
        'dropout', 'einsum_grad_spec', 'einsum_ones', 'expand', 'eye', 'fori_loop', 'full',
        'gather_grad', 'gather_nd', 'gather_nd_grad',
        'group_view', 'invert_permutation', 'jac_basis', 'loss_reduce',
        'loss_spread', 'mask_cotangent', 'max_pool_grad', 'max_pool_select', 'newenv',
        'nll_loss', 'ones', 'pad', 'pad_grad', 'ppermute', 'prod_others', 'reduce_scatter',
        'remat_barrier', 'roll_back', 'scan', 'scatter_nd', 'shard',
        'slice_grad', 'stack_grad', 'swap_last', 'tile', 'tile_grad', 'zeros']
    assert set(RULES) | FALLBACK_ONLY == set(PRIMITIVES.values())


def test_the_fallback_loop_batches_a_primitive_without_a_rule() -> None:
    mod = anfir.parse("def f(x) = tile(x, (2, 1)) * 2.0")
    xs = np.random.default_rng(1).normal(size=(3, 2, 4))
    got = anfir.run(anfir.vmap(mod["f"]), xs)
    want = np.stack([anfir.run(mod["f"], x) for x in xs])
    np.testing.assert_allclose(got, want, rtol=1e-12)

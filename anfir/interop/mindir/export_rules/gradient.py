"""MindIR export rules of :mod:`anfir.primitives.gradient`: the AD helpers, gradient environments as tuples."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from anfir.interop.mindir.export_rules.common import (Rule, Unsupported, dtype_of, elementwise, leafwise,
                                                      registrar, static, static_shape, summed_to, swap_last,
                                                      zero_env)
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.abstract.values import AFunction, ATuple
from anfir.dtypes import is_bool, is_integer
from anfir.interop.mindir.common import TYPE_ID_OF
from anfir.interop.mindir.environments import is_env, slot_types
from anfir.primitives import gradient

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.mindir.writer import Writer

RULES: dict[Primitive, Rule] = {}
"""This family's primitives -> how each is written as MindSpore ops."""
UNSUPPORTED: dict[Primitive, str] = {}
"""This family's primitives MindIR cannot hold, with the reason."""
rule_of = registrar(RULES)


RULES[gradient.grad_seed] = elementwise("OnesLike")  # 1 of the (scalar, float) output's type


@rule_of(gradient.size)
def _size(w: Writer, node: CNode) -> str:
    return w.constant(int(np.prod(static_shape(node.args[0], "size"))), "i64")

def _batched_matmul_grad(w: Writer, node: CNode, wrt_x: bool) -> str:
    """The gradient of a batched ``x @ y`` (rank >= 2 operands): a MatMulExt with one
    operand transposed, summed back over the batch axes the operand was broadcast along
    (the expansion of anfir/decompositions/gradient.py, written in MindSpore's ops)."""
    if wrt_x:
        dout, y, x = node.args
        a, b = w.ref(dout), swap_last(w, w.ref(y), len(static_shape(y, "matmul_dx")))
        da, db, target = static_shape(dout, "matmul_dx"), static_shape(y, "matmul_dx"), x
    else:
        x, dout, y = node.args
        a, b = swap_last(w, w.ref(x), len(static_shape(x, "matmul_dy"))), w.ref(dout)
        da, db, target = static_shape(x, "matmul_dy"), static_shape(dout, "matmul_dy"), y
    if wrt_x:  # (..., m, n) @ (..., n, k)ᵀ ; (..., n, m)ᵀ @ (..., n, k)
        product_shape = (*np.broadcast_shapes(da[:-2], db[:-2]), da[-2], db[-2])
    else:
        product_shape = (*np.broadcast_shapes(da[:-2], db[:-2]), da[-1], db[-1])
    product = w.emit("MatMulExt", [a, b])
    return summed_to(w, product, product_shape, static_shape(target, "matmul"), node.abstract)

def _matmul_grad_rule(wrt_x: bool) -> Rule:
    what = "matmul_dx" if wrt_x else "matmul_dy"

    def rule(w: Writer, node: CNode) -> str:
        ranks = [len(static_shape(a, what)) for a in node.args]
        if min(ranks) < 2:
            raise Unsupported(f"{what} of a vector")
        if ranks != [2, 2, 2]:
            return _batched_matmul_grad(w, node, wrt_x)
        if wrt_x:
            dout, y, _ = node.args  # dout @ yᵀ
            return w.emit("MatMul", [w.ref(dout), w.ref(y), w.constant(False, scalar=True),
                                     w.constant(True, scalar=True)], abstract=node.abstract)
        x, dout, _ = node.args  # xᵀ @ dout
        return w.emit("MatMul", [w.ref(x), w.ref(dout), w.constant(True, scalar=True),
                                 w.constant(False, scalar=True)], abstract=node.abstract)
    return rule


RULES[gradient.matmul_dx] = _matmul_grad_rule(True)
RULES[gradient.matmul_dy] = _matmul_grad_rule(False)


@rule_of(gradient.sum_to)
def _sum_to(w: Writer, node: CNode) -> str:
    g, x = node.args  # the sum of g over the axes x was broadcast along
    return summed_to(w, w.ref(g), static_shape(g, "sum_to"), static_shape(x, "sum_to"), node.abstract)

@rule_of(gradient.broadcast_like)
def _broadcast_like(w: Writer, node: CNode) -> str:
    g, x = node.args
    if static_shape(g, "broadcast_like") == static_shape(x, "broadcast_like"):
        return w.ref(g)
    return w.emit("Mul", [w.emit("OnesLike", [w.ref(x)]), w.ref(g)], abstract=node.abstract)

@rule_of(gradient.unreduce)
def _unreduce(w: Writer, node: CNode) -> str:
    g, x = node.args[:2]
    axis = node.attrs.get("axis", None) if node.attrs else None
    keep = bool(node.attrs.get("keepdims", False)) if node.attrs else False
    xs = static_shape(x, "unreduce")
    ref = w.ref(g)
    if not keep and axis is not None and xs:
        axes = {a % len(xs) for a in ((axis,) if isinstance(axis, int) else axis)}
        view = tuple(1 if k in axes else d for k, d in enumerate(xs))
        ref = w.emit("Reshape", [ref, w.constant(view, scalar=True)])
    return w.emit("Mul", [w.emit("OnesLike", [w.ref(x)]), ref], abstract=node.abstract)

@rule_of(gradient.cast_like)
def _cast_like(w: Writer, node: CNode) -> str:
    g, x = node.args
    want, have = dtype_of(x.abstract), dtype_of(g.abstract)
    if want is None or want == have:
        return w.ref(g)
    if want not in TYPE_ID_OF:
        raise Unsupported(f"cast_like to {want}")
    cast = w.emit("Cast", [w.ref(g), w.constant(TYPE_ID_OF[want], scalar=True)], abstract=node.abstract)
    if is_integer(want) or is_bool(want):  # an integer's sensitivity is a zero
        return w.emit("ZerosLike", [cast], abstract=node.abstract)
    return cast

@rule_of(gradient.newenv)
def _newenv(w: Writer, node: CNode) -> str:
    if w.envs is not None:
        return zero_env(w, w.envs)
    return w.emit("EnvironCreate", [])

@rule_of(gradient.env_setitem)
def _env_set(w: Writer, node: CNode) -> str:
    if w.envs is None:
        return w.emit("EnvironSet", [w.ref(a) for a in node.args])
    env, key, value = node.args
    slot = w.envs.slot(static(key, "a gradient environment's key"), value.abstract)
    # the environment a zero gradient of a function stands for (zeros_like of a closure)
    base = w.ref(env) if is_env(env.abstract) else zero_env(w, w.envs)
    items = [w.ref(value) if k == slot else w.emit("TupleGetItem", [base, w.constant(k, scalar=True)])
             for k in range(len(w.envs.slots))]
    return w.emit("MakeTuple", items)

@rule_of(gradient.env_getitem)
def _env_get(w: Writer, node: CNode) -> str:
    if w.envs is None:
        return w.emit("EnvironGet", [w.ref(a) for a in node.args], abstract=node.abstract)
    env, key, default = node.args
    if not is_env(env.abstract):  # nothing stored: the default (a zero)
        return w.ref(default)
    slot = w.envs.slot(static(key, "a gradient environment's key"), default.abstract)
    return w.emit("TupleGetItem", [w.ref(env), w.constant(slot, scalar=True)], abstract=node.abstract)


_add = elementwise("Add")


@rule_of(gradient.gadd)
def _gadd(w: Writer, node: CNode) -> str:
    """The sum of two gradients: ``Add`` of numbers and tensors; of tuples (a tuple
    argument's gradient) item by item, as MakeTuple of the items' sums, walked with a
    stack (a gradient may nest tuples deeply)."""
    abstract = node.abstract
    if w.envs is not None and is_env(abstract):
        # environments (a tuple of slots); a zero gradient of a function adds nothing
        envs = [a for a in node.args if is_env(a.abstract)]
        if len(envs) < 2:
            return w.ref(envs[0]) if envs else zero_env(w, w.envs)
        abstract = slot_types(w.envs)
    elif not isinstance(abstract, ATuple):
        return _add(w, node)
    return leafwise(w, w.ref(node.args[0]), w.ref(node.args[1]), abstract,
                     lambda x, y, leaf: w.emit("Add", [x, y], abstract=leaf))

@rule_of(gradient.grad_arg_check)
def _grad_arg_check(w: Writer, node: CNode) -> str:
    # grad_arg_check(x, g) is g once compiled (its check is on x's type, made when
    # the program was specialized): the value itself
    return w.ref(node.args[1])

@rule_of(gradient.reshape_like)
def _reshape_like(w: Writer, node: CNode) -> str:
    g, x = node.args
    return w.emit("Reshape", [w.ref(g), w.constant(static_shape(x, "reshape_like"), scalar=True)],
                  abstract=node.abstract)


@rule_of(gradient.J)
def _j(w: Writer, node: CNode) -> str:
    """``J(x)`` of data is ``x`` (as the flat exporters' rule: anfir/flat/flatten.py); J of
    a function is a transform the ad phase left, which no MindSpore op computes."""
    x = node.args[0]
    if _holds_function(x):
        raise Unsupported("J of a function was left by the optimizer (a gradient the ad phase "
                          "could not expand statically)")
    return w.ref(x)


def _holds_function(node: Node) -> bool:
    """Whether ``node``'s value is, or holds in its tuples, a function (walked with a stack)."""
    if isinstance(node, ValueNode) and isinstance(node.value, (FuncGraph, Primitive)):
        return True
    stack = [node.abstract]
    while stack:
        abstract = stack.pop()
        if isinstance(abstract, AFunction):
            return True
        if isinstance(abstract, ATuple):
            stack.extend(abstract.items)
    return False

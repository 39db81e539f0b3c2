"""MindIR export rules of :mod:`anfir.primitives.gradient`: the AD helpers, gradient environments as tuples."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from anfir.interop.mindir.export_rules.common import (Rule, Unsupported, broadcast_dims, dtype_of,
                                                      elementwise, leafwise, rank_of, registrar, static,
                                                      static_shape, summed_to_like, swap_last,
                                                      symbolic_shape, zero_env)
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.abstract.lattice import tuple_leaves
from anfir.abstract.values import AFunction, ATuple
from anfir.dtypes import is_bool, is_integer
from anfir.interop.mindir.common import TYPE_ID_OF
from anfir.interop.mindir.environments import is_env, is_run_time, slot_types
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
    try:
        return w.constant(int(np.prod(static_shape(node.args[0], "size"))), "i64")
    except Unsupported:  # dimension variables: MindSpore's Size at run time (a scalar)
        return w.mark_scalar(w.emit("Size", [w.ref(node.args[0])]))

def _batched_matmul_grad(w: Writer, node: CNode, wrt_x: bool) -> str:
    """The gradient of a batched ``x @ y`` (rank >= 2 operands): a MatMulExt with one
    operand transposed, summed back over the batch axes the operand was broadcast along
    (the expansion of anfir/decompositions/gradient.py, written in MindSpore's ops).
    Dimensions may be variables where it is known which batch axes were broadcast."""
    what = "matmul_dx" if wrt_x else "matmul_dy"
    if wrt_x:
        dout, y, x = node.args
        a, b = w.ref(dout), swap_last(w, w.ref(y), rank_of(y, what))
        da, db, target = symbolic_shape(dout, what), symbolic_shape(y, what), x
    else:
        x, dout, y = node.args
        a, b = swap_last(w, w.ref(x), rank_of(x, what)), w.ref(dout)
        da, db, target = symbolic_shape(x, what), symbolic_shape(dout, what), y
    batch = broadcast_dims(da[:-2], db[:-2], what)
    if wrt_x:  # (..., m, n) @ (..., n, k)ᵀ ; (..., n, m)ᵀ @ (..., n, k)
        product_shape = (*batch, da[-2], db[-2])
    else:
        product_shape = (*batch, da[-1], db[-1])
    product = w.emit("MatMulExt", [a, b])
    return summed_to_like(w, product, product_shape, symbolic_shape(target, what), node.abstract)

def _matmul_grad_rule(wrt_x: bool) -> Rule:
    what = "matmul_dx" if wrt_x else "matmul_dy"

    def rule(w: Writer, node: CNode) -> str:
        ranks = [rank_of(a, what) for a in node.args]
        if min(ranks) < 2:
            return _vector_matmul_grad(w, node, wrt_x)
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
    return summed_to_like(w, w.ref(g), symbolic_shape(g, "sum_to"), symbolic_shape(x, "sum_to"),
                          node.abstract)

@rule_of(gradient.broadcast_like)
def _broadcast_like(w: Writer, node: CNode) -> str:
    g, x = node.args
    if symbolic_shape(g, "broadcast_like") == symbolic_shape(x, "broadcast_like"):
        return w.ref(g)
    return w.emit("Mul", [w.emit("OnesLike", [w.ref(x)]), w.ref(g)], abstract=node.abstract)

@rule_of(gradient.unreduce)
def _unreduce(w: Writer, node: CNode) -> str:
    # unreduce(g, x, axis, keepdims): axis and keepdims are the call's third and fourth
    # inputs (constants), not attributes.  The reduced axes come back as 1s one ExpandDims
    # at a time (ascending), so only x's rank is needed, not its dimensions; the product
    # with OnesLike(x) broadcasts g over them.
    g, x = node.args[:2]
    axis = static(node.args[2], "unreduce's axes") if len(node.args) > 2 else None
    keep = bool(static(node.args[3], "unreduce's keepdims")) if len(node.args) > 3 else False
    rank = rank_of(x, "unreduce")
    ref = w.ref(g)
    if not keep and axis is not None and rank:
        for a in sorted({int(a) % rank for a in ((axis,) if isinstance(axis, int) else axis)}):
            ref = w.emit("ExpandDims", [ref, w.constant(a, scalar=True)])
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
    if is_run_time(default.abstract):  # the slot may hold its 0-d zero: plus the default (a zero)
        item = w.emit("TupleGetItem", [w.ref(env), w.constant(slot, scalar=True)])
        return w.emit("Add", [item, w.ref(default)], abstract=node.abstract)
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
    try:
        shape = w.constant(static_shape(x, "reshape_like"), scalar=True)
    except Unsupported:  # x's shape at run time
        shape = w.emit("Shape", [w.ref(x)])
    return w.emit("Reshape", [w.ref(g), shape], abstract=node.abstract)


def _vector_matmul_grad(w: Writer, node: CNode, wrt_x: bool) -> str:
    """The gradient of ``x @ y`` where an operand is a vector, by numpy's rules (a vector
    ``x`` a row, a vector ``y`` a column: ExpandDims), the matrix product, the sum back
    over broadcast batch axes, and the added axis squeezed away — the expansion of
    anfir/decompositions/gradient.py in MindSpore's ops; dimensions may be variables."""
    what = "matmul_dx" if wrt_x else "matmul_dy"
    if wrt_x:
        dout, y, x = node.args
    else:
        x, dout, y = node.args
    if rank_of(x, what) == 0 or rank_of(y, what) == 0:
        raise Unsupported(f"{what} of a scalar")
    xr, yr, dr = w.ref(x), w.ref(y), w.ref(dout)
    xs, ys, ds = symbolic_shape(x, what), symbolic_shape(y, what), symbolic_shape(dout, what)

    def expand(ref: str, axis: int) -> str:
        return w.emit("ExpandDims", [ref, w.constant(axis, scalar=True)])

    y_vector, x_vector = len(ys) == 1, len(xs) == 1
    if y_vector:  # a column; dout gains its last axis
        yr, ys = expand(yr, 1), (*ys, 1)
        dr, ds = expand(dr, len(ds)), (*ds, 1)
    if x_vector:  # a row; dout gains the axis before its last
        xr, xs = expand(xr, 0), (1, *xs)
        dr, ds = expand(dr, len(ds) - 1), (*ds[:-1], 1, ds[-1])
    batch = broadcast_dims(ds[:-2], (ys if wrt_x else xs)[:-2], what)
    if wrt_x:  # dout @ yᵀ, back to x's shape
        product = w.emit("MatMulExt", [dr, swap_last(w, yr, len(ys))])
        total = summed_to_like(w, product, (*batch, ds[-2], ys[-2]), xs, None)
        vector, axis = x_vector, 0
    else:  # xᵀ @ dout, back to y's shape
        product = w.emit("MatMulExt", [swap_last(w, xr, len(xs)), dr])
        total = summed_to_like(w, product, (*batch, xs[-1], ds[-1]), ys, None)
        vector, axis = y_vector, len(ys) - 1
    if not vector:
        return total
    # the axis an input (a tuple), as MindSpore 2.10 writes Squeeze (an attribute crashes it)
    return w.emit("Squeeze", [total, w.constant((axis,), scalar=True)], abstract=node.abstract)


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
    return any(isinstance(leaf, AFunction) for leaf in tuple_leaves(node.abstract))

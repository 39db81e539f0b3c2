"""Structured loops back into tail recursion, for back ends whose loops are graphs that call
themselves (MindSpore's MindIR: a "while header" graph).

``fori_loop(lo, hi, body, init)`` becomes a call ``H(lo, init)`` of a new graph::

    H(i, c) = switch(i < hi, lambda () H(i + 1, body(i, c)) end, lambda () c end)()

and ``scan(f, init, xs, length=n, reverse=r)`` a call ``H(0, init, zeros...)`` of::

    H(i, c, ys...) = switch(i < n, lambda () let k = (r ? n - 1 - i : i),
                                                 (c2, y) = f(c, (row k of xs...)) in
                                             H(i + 1, c2, (row k of ys set to y)...) end,
                                   lambda () (c, (ys...)) end)()

with one stacked buffer per leaf of ``y``, zeros at first, its row ``k`` written by a
one-hot ``where`` (``where(iota == k, y, ys)``) and row ``k`` of ``xs`` read as the sum
of ``where(iota == k, xs, 0)`` over the leading axis — both exact (a select, and a sum
of one value and zeros), and both made only of elementwise ops, a broadcast and a
reduction, which every back end has.  The number of steps of a scan must be known
(a static leading dimension, or ``length=``).

This runs on the typed, optimized program (after the ``optimize`` phase): each new
node gets its type from its primitive's rule as it is made (``infer_call``), the
graphs theirs from the loop's own types, so nothing is inferred again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Sequence

import numpy as np

from anfir.abstract.lattice import map_tuple_leaves, tuple_leaves
from anfir.abstract.values import (AbstractValue, AFunction, ANone, AScalar, ATensor, ATuple, GraphFn,
                                   GraphSig)
from anfir.dtypes import BY_NAME, is_integer
from anfir.infer.engine import constant_abstract
from anfir.ir.attrs import NO_ATTRS
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.ir.walk import toposort
from anfir.passes.specialize import infer_call
from anfir.passes.typed_nodes import apply, getitem, graph_value, int_const, make_tuple, prim
from anfir.primitives import arith, loops, structure, tensor

if TYPE_CHECKING:  # pragma: no cover
    from anfir.passes.compile_state import Program

STAT = "loops as recursion"
"""The ``program.stats`` counter of the structured loops rewritten."""
LEFT = "loops as recursion: left"
"""The ``program.stats`` counter of the structured loops left as they were (a scan whose
number of steps is not known)."""


def _typed(graph: FuncGraph, primitive: Primitive, args: Sequence[Node], loc: Any, **attrs: Any) -> CNode:
    """``primitive(*args, **attrs)`` in ``graph``, typed by the primitive's own rule."""
    canonical = primitive.canonical_attrs(attrs) if attrs else NO_ATTRS
    callee = prim(primitive)
    abstract = infer_call(callee.abstract, [a.abstract for a in args], loc, canonical)
    return apply(graph, [callee, *args], abstract, loc, canonical if attrs else None)


def _cast(graph: FuncGraph, node: Node, dtype: str, loc: Any) -> CNode:
    return _typed(graph, tensor.cast, [node, _constant(dtype)], loc)


def _constant(value: Any) -> ValueNode:
    node = ValueNode(value)
    node.abstract = constant_abstract(node)
    return node


def _leaf_nodes(graph: FuncGraph, node: Node, abstract: AbstractValue, loc: Any) -> list[Node]:
    """The leaves of the (nested tuple) value of ``node``, left to right, as nodes."""
    out: list[Node] = []
    stack: list[tuple[Node, AbstractValue]] = [(node, abstract)]
    while stack:
        n, a = stack.pop()
        if isinstance(a, ATuple):
            stack.extend((getitem(graph, n, k, loc), item) for k, item in reversed(list(enumerate(a.items))))
        else:
            out.append(n)
    return out


def _rebuild(graph: FuncGraph, template: AbstractValue, leaves: list[Node], loc: Any) -> Node:
    """The nested tuple of shape ``template`` holding ``leaves`` (post-order, with a stack)."""
    it = iter(leaves)
    done: list[Node] = []
    stack: list[tuple[AbstractValue, bool]] = [(template, False)]
    while stack:
        a, ready = stack.pop()
        if not isinstance(a, ATuple):
            done.append(next(it))
        elif ready:
            n = len(a.items)
            items = done[len(done) - n:] if n else []
            del done[len(done) - n:]
            done.append(make_tuple(graph, items, loc))
        else:
            stack.append((a, True))
            stack.extend((item, False) for item in reversed(a.items))
    return done[0]


def _steps(length: Optional[int], x_leaves: list[AbstractValue], y_leaves: list[AbstractValue],
           learned: dict[Any, int]) -> Optional[int]:
    """A scan's number of steps: ``length=``, or a static leading dimension of ``xs`` or
    ``ys``, or a dimension variable an earlier scan of the program fixed (``learned``: a
    gradient's backward scan reads the stacked ys of its forward one, typed once for any
    length)."""
    if length is not None:
        return int(length)
    for leaf in [*x_leaves, *y_leaves]:
        if isinstance(leaf, ATensor) and leaf.shape:
            first = leaf.shape[0]
            if isinstance(first, int):
                return int(first)
            if first in learned:
                return learned[first]
    return None


def _static_dims(a: AbstractValue) -> Optional[tuple[int, ...]]:
    if isinstance(a, AScalar):
        return ()
    if isinstance(a, ATensor) and a.shape is not None and all(isinstance(d, int) for d in a.shape):
        return tuple(int(d) for d in a.shape)
    return None


class _Header:
    """The header graph ``H`` of one loop and its two branches, being built."""

    def __init__(self, name: str, loc: Any, params: list[tuple[str, AbstractValue]], out: AbstractValue) -> None:
        self.loc = loc
        self.graph = FuncGraph(name, loc)
        self.params = []
        for pname, abstract in params:
            p = self.graph.add_parameter(pname, loc)
            p.abstract = abstract
            self.params.append(p)
        self.graph.abstract = GraphSig(tuple(a for _, a in params), out)
        self.step = FuncGraph(name + "_step", loc)
        self.done = FuncGraph(name + "_done", loc)
        self.out = out

    def finish(self, go: Node, step_out: Node, done_out: Node) -> None:
        """``H``'s body: ``switch(go, step, done)()``."""
        for branch, output in ((self.step, step_out), (self.done, done_out)):
            branch.output = output
            branch.abstract = GraphSig((), self.out)
        h, loc = self.graph, self.loc
        chosen = apply(h, [prim(structure.switch), go, graph_value(self.step), graph_value(self.done)],
                       AFunction(frozenset({GraphFn(self.step), GraphFn(self.done)})), loc)
        h.output = apply(h, [chosen], self.out, loc)

    def again(self, args: list[Node]) -> CNode:
        """``H(args...)`` in the step branch: the tail call."""
        return apply(self.step, [graph_value(self.graph), *args], self.out, self.loc)


def _fori_loop(call: CNode, learned: dict[Any, int]) -> Optional[Node]:
    lo, hi, body, init = call.args
    graph, loc = call.graph, call.loc
    carry = call.abstract
    counter = lo.abstract if isinstance(lo.abstract, ATensor) else AScalar("i64")
    header = _Header("fori_while", loc, [("i", counter), ("carry", carry)], carry)
    i, c = header.params
    go = _typed(header.graph, arith.lt, [i, hi], loc)
    step = header.step
    nxt = apply(step, [body, i, c], carry, loc)
    header.finish(go, header.again([_typed(step, arith.add, [i, int_const(1)], loc), nxt]), c)
    return apply(graph, [graph_value(header.graph), lo, init], carry, loc)


def _scan(call: CNode, learned: dict[Any, int]) -> Optional[Node]:
    f, init = call.args[0], call.args[1]
    xs = call.args[2] if len(call.args) > 2 else None
    attrs = loops.scan.bound_attrs(call.attrs)
    out = call.abstract
    if not isinstance(out, ATuple) or len(out.items) != 2:
        return None
    carry, ys_abs = out.items
    y_leaves = tuple_leaves(ys_abs)
    x_abs = xs.abstract if xs is not None else ANone()
    x_leaves = tuple_leaves(x_abs)
    n = _steps(attrs["length"], x_leaves, y_leaves, learned)
    if n is None:
        return None  # the number of steps is not known when writing
    for leaf in [*x_leaves, *y_leaves]:
        if isinstance(leaf, ATensor) and leaf.shape and not isinstance(leaf.shape[0], int):
            learned[leaf.shape[0]] = n
    for leaf in [*y_leaves, *x_leaves]:
        if isinstance(leaf, ATensor) and (leaf.shape is None or _static_dims(ATensor(leaf.dtype, leaf.shape[1:])) is None
                                          or BY_NAME[str(leaf.dtype)].numpy == np.bool_):
            return None  # a row of unknown shape, or of booleans (no reduction of booleans here)
    # the stacked ys' types with the number of steps (the gradient's scans are typed once
    # for any length: their leading dimension may be a variable)
    ys_abs = map_tuple_leaves(ys_abs, lambda a: ATensor(a.dtype, (n, *(a.shape or ())[1:])) if isinstance(a, ATensor) else a)
    y_leaves = tuple_leaves(ys_abs)
    out = ATuple((carry, ys_abs))
    graph, loc = call.graph, call.loc
    stacked = [leaf for leaf in y_leaves if isinstance(leaf, ATensor)]
    # H returns (carry, (stacked buffers...)): no None in a loop's result (MindSpore's
    # runtime cannot allocate one); the ys' template is rebuilt after the loop.
    # (Without any: H returns the carry alone — MindSpore's runtime refuses an empty tuple too.)
    result = ATuple((carry, ATuple(tuple(stacked)))) if stacked else carry
    header = _Header("scan_while", loc, [("i", AScalar("i64")), ("carry", carry),
                                   *((f"ys{k}", leaf) for k, leaf in enumerate(stacked))], result)
    i, c, *buffers = header.params
    step = header.step
    go = _typed(header.graph, arith.lt, [i, int_const(n)], loc)
    k: Node = i if not attrs["reverse"] else _typed(step, arith.sub, [int_const(n - 1), i], loc)

    def one_hot(rank: int, dims: tuple[int, ...]) -> Node:
        # iota == k, broadcast to a stacked leaf's shape (n, *dims)
        iota = _constant(np.arange(n, dtype=np.int64).reshape((n,) + (1,) * rank))
        mask = _typed(step, arith.eq, [iota, k], loc)
        return _typed(step, tensor.broadcast_to, [mask, _constant((n, *dims))], loc)

    rows: list[Node] = []
    for node in (_leaf_nodes(step, xs, x_abs, loc) if xs is not None else []):
        abstract = node.abstract
        if not isinstance(abstract, ATensor):
            rows.append(node)  # None: nothing to slice
            continue
        dims = tuple(int(d) for d in abstract.shape[1:])  # type: ignore[index]
        mask = one_hot(len(dims), dims)
        if is_integer(str(abstract.dtype)):  # (MindSpore's CPU Select has no integer kernel)
            kept = _typed(step, arith.mul, [node, _cast(step, mask, str(abstract.dtype), loc)], loc)
        else:
            kept = _typed(step, tensor.where, [mask, node, _typed(step, structure.zeros_like, [node], loc)], loc)
        row = _typed(step, tensor.sum_, [kept], loc, axis=0)
        rows.append(row)
    x = _rebuild(step, x_abs, rows, loc) if xs is not None else _constant(None)
    body_out = apply(step, [f, c, x], ATuple((carry, _unstacked(ys_abs))), loc)
    new_carry = getitem(step, body_out, 0, loc)
    y_nodes = _leaf_nodes(step, getitem(step, body_out, 1, loc), _unstacked(ys_abs), loc)
    written: list[Node] = []
    stacked_y = [y for y, leaf in zip(y_nodes, y_leaves) if isinstance(leaf, ATensor)]
    for y, buffer in zip(stacked_y, buffers):
        full = buffer.abstract
        assert isinstance(full, ATensor) and full.shape is not None
        dims = tuple(int(d) for d in full.shape[1:])
        row = _typed(step, tensor.reshape, [y, _constant((1, *dims))], loc)
        spread = _typed(step, tensor.broadcast_to, [row, _constant((n, *dims))], loc)
        mask = one_hot(len(dims), dims)
        if is_integer(str(full.dtype)):  # ys + mask * (y - ys), exact for integers
            change = _typed(step, arith.sub, [spread, buffer], loc)
            masked = _typed(step, arith.mul, [_cast(step, mask, str(full.dtype), loc), change], loc)
            written.append(_typed(step, arith.add, [buffer, masked], loc))
        else:
            written.append(_typed(step, tensor.where, [mask, spread, buffer], loc))
    tail = header.again([_typed(step, arith.add, [i, int_const(1)], loc), new_carry, *written])
    header.finish(go, tail, make_tuple(header.done, [c, make_tuple(header.done, list(buffers), loc)], loc)
                  if stacked else c)
    zeros = [_constant(np.zeros(tuple(int(d) for d in leaf.shape), BY_NAME[str(leaf.dtype)].numpy))  # type: ignore[union-attr]
             for leaf in stacked]
    looped = apply(graph, [graph_value(header.graph), int_const(0), init, *zeros], result, loc)
    if not stacked:
        ys_none: list[Node] = [_constant(None) for _ in y_leaves]
        return make_tuple(graph, [looped, _rebuild(graph, ys_abs, ys_none, loc)], loc)
    buffers_out = getitem(graph, looped, 1, loc)
    it = iter(range(len(stacked)))
    ys_leaves: list[Node] = [getitem(graph, buffers_out, next(it), loc) if isinstance(leaf, ATensor)
                             else _constant(None) for leaf in y_leaves]
    return make_tuple(graph, [getitem(graph, looped, 0, loc), _rebuild(graph, ys_abs, ys_leaves, loc)], loc)


def _row_type(leaf: AbstractValue) -> AbstractValue:
    if isinstance(leaf, ATensor) and leaf.shape is not None:
        return AScalar(leaf.dtype) if len(leaf.shape) == 1 else ATensor(leaf.dtype, leaf.shape[1:])
    return leaf


def _unstacked(ys: AbstractValue) -> AbstractValue:
    """The type of one step's ``y`` from the stacked ``ys`` (a row of a vector is a number)."""
    return map_tuple_leaves(ys, _row_type)


def _replace(manager: Manager, call: CNode, new: Node) -> None:
    """Replace ``call`` by ``new``; an item taken from a scan's result takes the item
    itself (no tuple holding ``None`` is left for the back end: MindSpore's runtime
    cannot allocate one), walking through nested items with a stack."""
    stack: list[tuple[Node, Node]] = [(call, new)]
    while stack:
        old, value = stack.pop()
        if isinstance(value, CNode) and value.is_apply(structure.make_tuple):
            for (user, index) in list(manager.users.get(old, {})):
                if (isinstance(user, CNode) and index == 1 and user.is_apply(structure.tuple_getitem)
                        and isinstance(user.args[1], ValueNode) and isinstance(user.args[1].value, int)):
                    stack.append((user, value.args[user.args[1].value]))
        if manager.users.get(old):
            manager.replace(old, value)


_REWRITES = {loops.fori_loop: _fori_loop, loops.scan: _scan}


def run(program: "Program") -> "Program":
    """Rewrite the program's ``scan`` and ``fori_loop`` calls into tail-recursive header
    graphs (see the module doc); a loop that cannot be (a scan whose number of steps is
    not known) is left for the back end to name."""
    manager = program.require_manager()
    calls = [node for graph in list(manager.graphs) for node in toposort(graph, manager)
             if isinstance(node, CNode) and node.graph is graph and isinstance(node.callee, ValueNode)
             and node.callee.value in _REWRITES]
    learned: dict[Any, int] = {}  # dimension variables the scans' numbers of steps fix
    for call in calls:
        callee = call.callee
        assert isinstance(callee, ValueNode)
        new = _REWRITES[callee.value](call, learned)
        if new is None:
            program.stats[LEFT] += 1
        else:
            _replace(manager, call, new)
            program.stats[STAT] += 1
    return program


__all__ = ["LEFT", "STAT", "run"]

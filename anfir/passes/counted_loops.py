"""Counted tail-recursive loops rewritten as ``fori_loop`` (part of the ``loops`` phase).

A loop written as tail recursion whose trip count follows from an integer
counter and a bound fixed for the whole loop is a ``fori_loop``; rewritten so
before ``ad``, its gradient is a reversed ``scan`` over stacked residuals —
first-order data that every exporter and the buffer IR take — instead of a
chain of closures.  The forms recognised (``loop`` a graph, ``n`` computed
outside it or a parameter passed on unchanged, ``c`` a positive integer
literal)::

    lambda (..., i, ...) if i OP n then loop(..., i ± c, ...) else STOP end
    lambda (..., i, ...) if i OP n then STOP else loop(..., i ± c, ...) end

with ``OP`` any comparison (either operand order) that, with the step's sign,
bounds the trip count: counting up while ``i < n`` / ``i <= n`` (``!=`` with
step 1), down while ``i > n`` / ``i >= n`` (``!=`` with step -1).  ``STOP``
is any expression of the loop's parameters (``acc``, ``scale * y``,
``sum(h)``, ``s[0] + s[1]``); it is computed once after the ``fori_loop``,
from the final state and the counter's final value.

The counter is never carried: the ``fori_loop`` index is the counter (step 1),
its negation (step -1), or ``S + k * c`` from a start ``S`` that is the same
constant at every call.  An integer parameter passed on unchanged with the same
constant at every call is substituted; the other parameters are the carry,
which must be data (numbers, tensors, tuples of them; a function in the state
leaves the loop a recursion).  A loop ``!=``-bounded that never meets its
bound ran forever before; it now stops after no iteration (the only change of
meaning, on programs that did not terminate).  What is not recognised stays a
recursion: it runs and differentiates as before, and the exporters' refusal
says why.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Optional

from anfir.abstract.values import UNKNOWN, AbstractValue, AScalar, ATuple, GraphSig
from anfir.ir.clone import Cloner
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.ir.walk import toposort
from anfir.primitives import arith, elementwise, loops, structure
from anfir.passes.compile_state import Program
from anfir.passes.typed_nodes import (apply, getitem, graph_value, int_const, is_data_type,
                                      make_tuple, prim)

_COMPARE = {arith.lt: "lt", arith.le: "le", arith.gt: "gt", arith.ge: "ge", arith.eq: "eq",
            arith.ne: "ne"}
_MIRROR = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
"""``n OP i`` read as ``i MIRROR[OP] n``."""
_NEGATE = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}
"""The condition under which the *else* branch runs."""


@dataclass(frozen=True)
class CountedLoop:
    """A recognised loop: continue while ``params[counter] op bound``, the counter
    changing by ``step`` each iteration; ``go`` calls the loop again, ``stop`` returns."""

    loop: FuncGraph
    counter: int
    step: int
    op: str
    bound: Node
    bound_nodes: tuple[CNode, ...]  # the loop's operations computing ``bound``, in order
    go: FuncGraph
    stop: FuncGraph
    tail: CNode


def _known_int(node: Node) -> Optional[int]:
    """The value of an integer ``node`` known at compile time, else None."""
    if isinstance(node, ValueNode):
        value = node.value
        return value if type(value) is int else None
    a = node.abstract
    if isinstance(a, AScalar) and a.value is not UNKNOWN and type(a.value) is int:
        return int(a.value)
    return None


def _is_int_scalar(a: Any) -> bool:
    return isinstance(a, AScalar) and str(a.dtype) == "i64"


def _step_of(node: Node, counter: Node) -> Optional[int]:
    """``c`` for ``counter + c`` / ``c + counter``, ``-c`` for ``counter - c``."""
    if not isinstance(node, CNode) or len(node.inputs) != 3:
        return None
    a, b = node.inputs[1], node.inputs[2]
    if node.is_apply(arith.add):
        other = b if a is counter else a if b is counter else None
        sign = 1
    elif node.is_apply(arith.sub) and a is counter:
        other, sign = b, -1
    else:
        return None
    if not isinstance(other, ValueNode) or type(other.value) is not int or other.value == 0:
        return None
    return sign * other.value


def _branches(loop: FuncGraph) -> Optional[tuple[CNode, FuncGraph, FuncGraph]]:
    """``(cond, then, else)`` when ``loop`` ends in ``switch(cond, then, else)()``."""
    out = loop.output
    if not isinstance(out, CNode) or len(out.inputs) != 1 or not out.inputs[0].is_apply(structure.switch):
        return None
    switch = out.inputs[0]
    assert isinstance(switch, CNode)
    cond, then_v, else_v = switch.inputs[1:]
    if not (isinstance(cond, CNode) and isinstance(then_v, ValueNode) and isinstance(then_v.value, FuncGraph)
            and isinstance(else_v, ValueNode) and isinstance(else_v.value, FuncGraph)):
        return None
    then_g, else_g = then_v.value, else_v.value
    if then_g.parameters or else_g.parameters:
        return None
    return cond, then_g, else_g


def _is_tail_call(node: Node, loop: FuncGraph) -> bool:
    return (isinstance(node, CNode) and isinstance(node.inputs[0], ValueNode)
            and node.inputs[0].value is loop and len(node.inputs) == len(loop.parameters) + 1)


def _reads_only_parameters(manager: Manager, loop: FuncGraph, branches: list[FuncGraph],
                           tail: CNode) -> bool:
    """The branches read the loop's parameters and values from outside it, nothing else
    the loop computes, and call the loop only in ``tail``."""
    params = set(loop.parameters)
    for branch in branches:
        for g in manager.scope(branch):
            for node in toposort(g, manager):
                if isinstance(node, CNode) and node.graph is g:
                    for inp in node.inputs:
                        if inp.graph is loop and inp not in params:
                            return False
                        if isinstance(inp, ValueNode) and inp.value is loop and node is not tail:
                            return False
    return True


def _invariant_expression(loop: FuncGraph, root: Node, counter: int,
                          tail: CNode) -> Optional[list[CNode]]:
    """The operations of ``loop`` computing ``root`` (``shape(xs)[0]``, ``n - 1``), in
    order, when ``root`` depends only on values from outside the loop and parameters
    passed on unchanged; None when it may change between iterations."""
    params = loop.parameters
    order: list[CNode] = []
    seen: set[Node] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, ready = stack.pop()
        if node.graph is not loop:
            continue  # a constant or a value from outside
        if node in params:
            index = params.index(node)
            if index == counter or tail.inputs[1 + index] is not node:
                return None
            continue
        if not (isinstance(node, CNode) and isinstance(node.inputs[0], ValueNode)
                and isinstance(node.inputs[0].value, Primitive)):
            return None  # only primitive operations are recomputed at the call
        if ready:
            order.append(node)
        elif node not in seen:
            seen.add(node)
            stack.append((node, True))
            stack.extend((inp, False) for inp in node.inputs[1:])
    return order


def _bound_at(call: CNode, found: CountedLoop) -> Node:
    """The loop's bound computed where ``call`` starts it (its operations copied into
    the call's graph, the loop's parameters read as the call's arguments)."""
    known = _known_int(found.bound)
    if known is not None:
        return int_const(known)  # a static trip count: the gradient's scan has a length
    params = found.loop.parameters
    mapping: dict[Node, Node] = {p: a for p, a in zip(params, call.inputs[1:])}
    for node in found.bound_nodes:
        inputs: list[Node] = []
        for inp in node.inputs:
            if isinstance(inp, ValueNode):
                copy = ValueNode(inp.value)
                copy.abstract = inp.abstract
                inputs.append(copy)
            else:
                inputs.append(mapping.get(inp, inp))
        mapping[node] = apply(call.graph, inputs, node.abstract, node.loc, node.attrs)
    return mapping.get(found.bound, found.bound)


def _outside_reads(found: CountedLoop) -> list[Node]:
    """The values from outside the loop its bound reads."""
    reads = [inp for node in found.bound_nodes for inp in node.inputs]
    return [n for n in [found.bound, *reads]
            if n.graph is not None and n.graph is not found.loop]


def find_counted_loop(manager: Manager, loop: FuncGraph) -> Optional[CountedLoop]:
    """The loop's counted form (see the module doc), or None."""
    params = loop.parameters
    if len(params) < 2 or not isinstance(loop.abstract, GraphSig):
        return None
    found = _branches(loop)
    if found is None:
        return None
    cond, then_g, else_g = found
    op_name = _COMPARE.get(cond.inputs[0].value) if isinstance(cond.inputs[0], ValueNode) else None
    if op_name is None or cond.graph is not loop or len(cond.inputs) != 3:
        return None
    if _is_tail_call(then_g.output, loop):
        go, stop, op = then_g, else_g, op_name
    elif _is_tail_call(else_g.output, loop):
        go, stop, op = else_g, then_g, _NEGATE[op_name]
    else:
        return None
    tail = go.output
    assert isinstance(tail, CNode)
    left, right = cond.inputs[1], cond.inputs[2]
    if left in params:
        counter_node, bound = left, right
    elif right in params:
        counter_node, bound, op = right, left, _MIRROR[op]
    else:
        return None
    counter = params.index(counter_node)
    step = _step_of(tail.inputs[1 + counter], counter_node)
    if step is None or not _is_int_scalar(counter_node.abstract) or not _is_int_scalar(bound.abstract):
        return None
    allowed = {"lt", "le"} if step > 0 else {"gt", "ge"}
    if abs(step) == 1:
        allowed.add("ne")
    if op not in allowed:
        return None
    bound_nodes = _invariant_expression(loop, bound, counter, tail)
    if bound_nodes is None:
        return None  # a bound that changes between iterations
    if set(manager.scope(loop)) != {loop, then_g, else_g}:
        # A closure made inside the step (``ap(lambda (z) ... acc end, x)``, owned by the
        # loop, not the branch): the body's clone would leave it reading the loop's old
        # parameters, so such a loop stays a recursion, as it ran before.
        return None
    if not _reads_only_parameters(manager, loop, [go, stop], tail):
        return None
    return CountedLoop(loop, counter, step, op, bound, tuple(bound_nodes), go, stop, tail)


def _int_node(graph: FuncGraph, fn: Callable[[int, int], int], primitive: Primitive,
              a: Node, b: Node, loc: Any) -> Node:
    """``fn(a, b)`` on two integer scalars: a constant when both are known."""
    ka, kb = _known_int(a), _known_int(b)
    if ka is not None and kb is not None:
        return int_const(fn(ka, kb))
    return apply(graph, [prim(primitive), a, b], AScalar("i64"), loc)


def _neg(graph: FuncGraph, a: Node, loc: Any) -> Node:
    return _int_node(graph, operator.sub, arith.sub, int_const(0), a, loc)


@dataclass(frozen=True)
class _Plan:
    """How the loop's calls become ``fori_loop(lo, hi, body, carry)``."""

    state: list[int]                 # the parameters carried (indices)
    passed: list[int]                # passed on unchanged, not read by an iteration
    constants: dict[int, Node]       # integer parameters substituted by a constant
    start: Optional[int]             # the counter's start when |step| > 1 (the same everywhere)


def _inputs_read(manager: Manager, graph: FuncGraph, skip: Node) -> set[Node]:
    """Every node an operation of ``graph`` or a graph nested in it, but ``skip``, reads."""
    return {inp for g in manager.scope(graph) for node in toposort(g, manager)
            if isinstance(node, CNode) and node.graph is g and node is not skip
            for inp in node.inputs}


def _plan(found: CountedLoop, calls: list[CNode], manager: Manager) -> Optional[_Plan]:
    params = found.loop.parameters
    constants: dict[int, Node] = {}
    state: list[int] = []
    passed: list[int] = []
    # What one iteration reads, a parameter passed on unchanged to the next not counted.
    go_reads = _inputs_read(manager, found.go, skip=found.tail)
    go_reads.update(arg for i, arg in enumerate(found.tail.inputs[1:]) if arg is not params[i])
    for index, param in enumerate(params):
        if index == found.counter:
            continue
        invariant = found.tail.inputs[1 + index] is param
        if invariant and param not in go_reads:
            passed.append(index)  # the bound or the exit reads it: the call's value
            continue
        values = {_known_int(call.inputs[1 + index]) for call in calls}
        if invariant and len(values) == 1 and None not in values:
            (value,) = values
            assert value is not None
            constants[index] = int_const(value)  # the same integer at every call
        elif is_data_type(param.abstract):
            state.append(index)
        else:
            return None  # a function in the state: the loop stays a recursion
    if not state:
        return None
    start: Optional[int] = None
    if abs(found.step) != 1:
        starts = {_known_int(call.inputs[1 + found.counter]) for call in calls}
        if len(starts) != 1 or None in starts:
            return None
        (start,) = starts
    for node in _outside_reads(found):
        owner = node.graph
        assert owner is not None  # _outside_reads keeps nodes of a graph
        if any(call.graph not in manager.scope(owner) for call in calls):
            return None  # the bound is not visible where the loop is started
    return _Plan(state, passed, constants, start)


def _body(manager: Manager, found: CountedLoop, plan: _Plan, carry_abs: AbstractValue) -> FuncGraph:
    """``body(k, carry)``: one iteration, the counter computed from the index ``k``."""
    loop, loc = found.loop, found.loop.loc
    params = loop.parameters
    body = FuncGraph(loop.name + "_body", loop.loc)
    k = body.add_parameter(params[found.counter].name or "i", params[found.counter].loc)
    k.abstract = AScalar("i64")
    c = body.add_parameter("carry", loc)
    c.abstract = carry_abs
    if found.step == 1:
        counter: Node = k
    elif found.step == -1:
        counter = _neg(body, k, loc)
    else:
        assert plan.start is not None
        scaled = _int_node(body, operator.mul, arith.mul, k, int_const(found.step), loc)
        counter = _int_node(body, operator.add, arith.add, int_const(plan.start), scaled, loc)
    seed: dict[Node, Node] = {params[found.counter]: counter}
    seed.update({params[i]: v for i, v in plan.constants.items()})
    if len(plan.state) == 1:
        seed[params[plan.state[0]]] = c
    else:
        for slot, index in enumerate(plan.state):
            seed[params[index]] = getitem(body, c, slot, params[index].loc)
    cloner = Cloner(manager, manager.scope(found.go), node_map=seed, inline_into={found.go: body})
    new_state = [cloner.node_map.get(found.tail.inputs[1 + i], found.tail.inputs[1 + i])
                 for i in plan.state]
    body.output = new_state[0] if len(new_state) == 1 else make_tuple(body, new_state, loc)
    body.abstract = GraphSig((k.abstract, carry_abs), carry_abs)
    return body


def _bounds(graph: FuncGraph, found: CountedLoop, plan: _Plan, start: Node, bound: Node,
            loc: Any) -> tuple[Node, Node]:
    """``(lo, hi)`` of the ``fori_loop`` index for one call."""
    step, op = found.step, found.op
    one = int_const(1)
    if step == 1:
        hi = _int_node(graph, operator.add, arith.add, bound, one, loc) if op == "le" else bound
        return start, hi
    if step == -1:
        lo = _neg(graph, start, loc)
        hi = _neg(graph, bound, loc)
        return lo, (_int_node(graph, operator.add, arith.add, hi, one, loc) if op == "ge" else hi)
    # |step| = c > 1 from the constant start S: ceil(max(0, distance) / c) iterations,
    # the distance counting the bound itself for <= and >=.
    assert plan.start is not None
    c = abs(step)
    s = int_const(plan.start)
    distance = (_int_node(graph, operator.sub, arith.sub, bound, s, loc) if step > 0
                else _int_node(graph, operator.sub, arith.sub, s, bound, loc))
    if op in ("le", "ge"):
        distance = _int_node(graph, operator.add, arith.add, distance, one, loc)
    ahead = _int_node(graph, max, arith.maximum, distance, int_const(0), loc)
    rounded = _int_node(graph, operator.add, arith.add, ahead, int_const(c - 1), loc)
    return int_const(0), _int_node(graph, operator.floordiv, elementwise.floor_div, rounded,
                                   int_const(c), loc)


def _final_counter(graph: FuncGraph, found: CountedLoop, plan: _Plan, lo: Node, hi: Node,
                   loc: Any) -> Node:
    """The counter's value when the loop stops (what ``stop`` sees)."""
    last = _int_node(graph, max, arith.maximum, lo, hi, loc)
    if found.step == 1:
        return last
    if found.step == -1:
        return _neg(graph, last, loc)
    assert plan.start is not None
    moved = _int_node(graph, operator.mul, arith.mul, hi, int_const(found.step), loc)
    return _int_node(graph, operator.add, arith.add, int_const(plan.start), moved, loc)


def _rewrite(manager: Manager, found: CountedLoop, plan: _Plan, calls: list[CNode]) -> None:
    params = found.loop.parameters
    state_abs = [params[i].abstract for i in plan.state]
    carry_abs: AbstractValue = state_abs[0] if len(state_abs) == 1 else ATuple(tuple(state_abs))
    body = _body(manager, found, plan, carry_abs)
    for call in calls:
        graph, loc = call.graph, call.loc
        args = call.inputs[1:]
        bound = _bound_at(call, found)
        lo, hi = _bounds(graph, found, plan, args[found.counter], bound, loc)
        init = [args[i] for i in plan.state]
        carry_in = init[0] if len(init) == 1 else make_tuple(graph, init, loc)
        looped = apply(graph, [prim(loops.fori_loop), lo, hi, graph_value(body), carry_in],
                       carry_abs, loc)
        seed: dict[Node, Node] = {params[i]: v for i, v in plan.constants.items()}
        seed.update((params[i], args[i]) for i in plan.passed)
        seed[params[found.counter]] = _final_counter(graph, found, plan, lo, hi, loc)
        if len(plan.state) == 1:
            seed[params[plan.state[0]]] = looped
        else:
            for slot, index in enumerate(plan.state):
                seed[params[index]] = getitem(graph, looped, slot, loc)
        stop = found.stop
        if stop.output in seed:
            result = seed[stop.output]
        else:
            cloner = Cloner(manager, manager.scope(stop), node_map=seed, inline_into={stop: graph})
            result = cloner.output_of(stop)
        manager.replace(call, result)


def _uses(manager: Manager) -> dict[FuncGraph, list[tuple[CNode, int]]]:
    uses: dict[FuncGraph, list[tuple[CNode, int]]] = {}
    for graph in list(manager.graphs):
        for node in toposort(graph, manager):
            if isinstance(node, CNode) and node.graph is graph:
                for index, inp in enumerate(node.inputs):
                    if isinstance(inp, ValueNode) and isinstance(inp.value, FuncGraph):
                        uses.setdefault(inp.value, []).append((node, index))
    return uses


def captures_only_data(manager: Manager, loop: FuncGraph) -> bool:
    """Whether everything ``loop`` captures is data (tensors, numbers, None, tuples of
    them): then the ``loops`` phase closes the ``fori_loop`` body (its captures ride in
    the carry), and the J-world loop of a closed body carries only data through its
    backward scan at every order.  A captured function (``partial(f, x)``, a tuple of
    gradients) cannot ride in a carry: the backward scan of such a body accumulates its
    gradient environment, and differentiating that scan again would stack environments
    as residuals."""
    return all(is_data_type(fv.abstract) for fv in manager.free_variables_total(loop))


def recognise_counted_loops(program: "Program", data_captures_only: bool = False) -> int:
    """Rewrite each counted tail-recursive loop (see the module doc) whose only uses
    are calls into ``fori_loop``.  Inner loops first: a loop whose step holds a
    counted loop is met again once that one is rewritten.  With ``data_captures_only``
    (the program differentiates a derivative), only loops that capture nothing but
    data are rewritten (:func:`captures_only_data`); the others stay recursions, which
    differentiate at any order.  Returns how many loops were rewritten."""
    manager = program.require_manager()
    count = 0
    done: set[FuncGraph] = set()
    while True:
        rewritten = 0
        waiting = False  # a loop this round's rewrites may have made recognisable
        touched: set[FuncGraph] = set()  # graphs a rewrite of this round changed
        for loop, sites in _uses(manager).items():
            if loop in done:
                continue
            if loop in touched or any(node.graph in touched for node, _ in sites):
                waiting = True
                continue
            found = find_counted_loop(manager, loop)
            if found is None or (data_captures_only and not captures_only_data(manager, loop)):
                # An outer loop holding an inner one is refused until that one is rewritten.
                if _branches(loop) is not None:
                    scope = set(manager.scope(loop))
                    waiting = waiting or any(node.graph in scope for node, _ in sites)
                continue
            own = set(manager.scope(loop))
            outside = [(node, index) for node, index in sites if node.graph not in own]
            calls = [node for node, index in outside]
            if not calls or any(index != 0 for node, index in outside):
                continue  # used as a value somewhere: kept
            plan = _plan(found, calls, manager)
            if plan is None:
                continue
            _rewrite(manager, found, plan, calls)
            done.add(loop)
            touched.update(own)
            touched.update(call.graph for call in calls)
            rewritten += 1
        count += rewritten
        # Another walk only when a rewrite may have freed a loop still refused.
        if not rewritten or not waiting:
            return count

"""The ``loops`` phase: structured loops made ready for AD and export.

Runs on the typed program, before ``ad``.  A ``scan`` / ``fori_loop`` body
that captures values (``lambda (h, x) tanh(W @ h + x) end`` captures ``W``)
has a gradient for them, which the J transform returns as a GradEnv of the
closure; carried through the reversed scan, that environment would make the
backward loop's state a non-tensor.  This phase *closes* such a body: the
captured values become explicit parameters and ride along in the carry,
unchanged by each step, so their gradient is an ordinary tensor accumulated by
the backward scan (``d carry`` of a value passed through is the sum of the
steps' contributions) and the body the J transform sees captures nothing::

    scan(@body, init, xs)        # @body captures W
  ⇒ let r = scan(@closed, (init, (W,)), xs) in (r[0][0], r[1])
    # @closed(cv, x) = let o = @body'(cv[0], x, cv[1][0]) in ((o[0], cv[1]), o[1])

Only bodies whose captured values are all data (tensors, numbers, tuples of
them) are closed; the others keep their captures (they still differentiate,
with the GradEnv in the backward carry).  Every node made is typed here, so
nothing is inferred again.
"""

from __future__ import annotations

from typing import Any, Optional

from anfir.abstract.values import (AbstractValue, AFunction, ANone, AScalar, ATensor, ATuple,
                                   GraphFn, GraphSig)
from anfir.infer.engine import constant_abstract
from anfir.ir.clone import Cloner
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.ir.walk import toposort
from anfir.primitives import arith, loops, structure
from anfir.passes.compile_state import Program


_BODY = {loops.scan: 0, loops.fori_loop: 2}


def _is_data(a: Any) -> bool:
    stack = [a]
    while stack:
        x = stack.pop()
        if isinstance(x, ATuple):
            stack.extend(x.items)
        elif not isinstance(x, (ATensor, AScalar, ANone)):
            return False
    return True


def _fn_abstract(graph: FuncGraph) -> AFunction:
    return AFunction(frozenset({GraphFn(graph)}))


def _apply(graph: FuncGraph, inputs: list[Node], abstract: AbstractValue, loc: Any,
           attrs: Any = None) -> CNode:
    node = CNode(graph, inputs, loc, attrs=attrs) if attrs is not None else CNode(graph, inputs, loc)
    node.abstract = abstract
    return node


def _getitem(graph: FuncGraph, tup: Node, i: int, loc: Any) -> CNode:
    items = tup.abstract.items if isinstance(tup.abstract, ATuple) else None
    assert items is not None
    return _apply(graph, [_prim(structure.tuple_getitem), tup, _const(i)], items[i], loc)


def _prim(prim: Primitive) -> ValueNode:
    node = ValueNode(prim)
    node.abstract = constant_abstract(node)
    return node


def _const(value: Any) -> ValueNode:
    node = ValueNode(value)
    node.abstract = AScalar("i64", value)
    return node


def _tuple(graph: FuncGraph, items: list[Node], loc: Any) -> CNode:
    return _apply(graph, [_prim(structure.make_tuple), *items],
                  ATuple(tuple(i.abstract for i in items)), loc)


def _graph_value(graph: FuncGraph) -> ValueNode:
    node = ValueNode(graph)
    node.abstract = _fn_abstract(graph)
    return node


def close_body(manager: Manager, call: CNode) -> Optional[Node]:
    """The closed form of the loop ``call`` (see the module doc), or None when its
    body is not a graph constant capturing only data."""
    prim = call.inputs[0].value if isinstance(call.inputs[0], ValueNode) else None
    index = _BODY.get(prim) if isinstance(prim, Primitive) else None
    if index is None or len(call.inputs) <= index + 1:
        return None
    body_node = call.inputs[1 + index]
    if not isinstance(body_node, ValueNode) or not isinstance(body_node.value, FuncGraph):
        return None
    body = body_node.value
    sig = body.abstract
    fvs = list(manager.free_variables_total(body))
    if not fvs or not isinstance(sig, GraphSig) or not all(_is_data(fv.abstract) for fv in fvs):
        return None
    scope = manager.scope(body)
    inside = set(scope)
    direct = {inp for g in scope for node in toposort(g, manager) if isinstance(node, CNode)
              for inp in node.inputs if inp.graph is not None and inp.graph not in inside}
    if not all(fv in direct for fv in fvs):
        return None  # a value captured through a closure made outside the body: kept
    loc = call.loc
    # body'(params..., v1..vk): the body with its captured values as parameters.
    opened = FuncGraph(body.name + "_closed", body.loc)
    params = [opened.add_parameter(p.name or "p", p.loc) for p in body.parameters]
    extra = [opened.add_parameter(f"{getattr(fv, 'name', None) or 'v'}_{i}", loc) for i, fv in enumerate(fvs)]
    for new, old in zip(params, body.parameters):
        new.abstract = old.abstract
    for new, fv in zip(extra, fvs):
        new.abstract = fv.abstract
    seed: dict[Node, Node] = dict(zip(body.parameters, params))
    seed.update(zip(fvs, extra))
    cloner = Cloner(manager, scope, node_map=seed, inline_into={body: opened})
    opened.output = cloner.output_of(body)
    opened.abstract = GraphSig((*sig.params, *(fv.abstract for fv in fvs)), sig.out)
    vs_abs = ATuple(tuple(fv.abstract for fv in fvs))
    # closed(a, cv): calls body' on the carry part and the captured values, passes them on.
    closed = FuncGraph(body.name + "_carried", body.loc)
    carry_pos = 0 if prim is loops.scan else 1
    a0 = closed.add_parameter(body.parameters[0].name or "a", loc)
    a1 = closed.add_parameter(body.parameters[1].name or "b", loc)
    sig_params = list(sig.params)
    packed = ATuple((sig_params[carry_pos], vs_abs))
    (a0 if carry_pos == 0 else a1).abstract = packed
    (a1 if carry_pos == 0 else a0).abstract = sig_params[1 - carry_pos]
    cv = a0 if carry_pos == 0 else a1
    carry_in = _getitem(closed, cv, 0, loc)
    vs = _getitem(closed, cv, 1, loc)
    values = [_getitem(closed, vs, i, loc) for i in range(len(fvs))]
    first = [carry_in, a1] if carry_pos == 0 else [a0, carry_in]
    out = _apply(closed, [_graph_value(opened), *first, *values], sig.out, loc)
    if prim is loops.scan:
        carry_out = _getitem(closed, out, 0, loc)
        y = _getitem(closed, out, 1, loc)
        closed.output = _tuple(closed, [_tuple(closed, [carry_out, vs], loc), y], loc)
    else:
        closed.output = _tuple(closed, [out, vs], loc)
    closed.abstract = GraphSig((a0.abstract, a1.abstract), closed.output.abstract)
    # The new call, and what replaces the old one.
    graph = call.graph
    args = list(call.inputs[1:])
    init_pos = 1 if prim is loops.scan else 3
    args[init_pos] = _tuple(graph, [args[init_pos], _tuple(graph, list(fvs), loc)], loc)
    args[index] = _graph_value(closed)
    old = call.abstract
    if prim is loops.scan:
        assert isinstance(old, ATuple)
        new_abs = ATuple((ATuple((old.items[0], vs_abs)), old.items[1]))
        looped = _apply(graph, [call.inputs[0], *args], new_abs, loc, call.attrs)
        carry = _getitem(graph, _getitem(graph, looped, 0, loc), 0, loc)
        return _tuple(graph, [carry, _getitem(graph, looped, 1, loc)], loc)
    looped = _apply(graph, [call.inputs[0], *args], ATuple((old, vs_abs)), loc, call.attrs)
    return _getitem(graph, looped, 0, loc)


def run(program: "Program") -> "Program":
    """Close the bodies of the program's structured loops (see the module doc)."""
    manager = program.require_manager()
    calls = [node for graph in list(manager.graphs) for node in toposort(graph, manager)
             if isinstance(node, CNode) and node.graph is graph and node.inputs
             and isinstance(node.inputs[0], ValueNode) and isinstance(node.inputs[0].value, Primitive)
             and node.inputs[0].value in _BODY]
    for call in calls:
        replacement = close_body(manager, call)
        if replacement is not None:
            manager.replace(call, replacement)
    return program


# -- counted tail-recursive loops rewritten as fori_loop ---------------------------------------
def _counted_loop(manager: Manager, loop: FuncGraph) -> Optional[tuple[Node, FuncGraph, int]]:
    """``(n, then-branch, index of the returned state)`` when ``loop`` has the form

        lambda (i, s1, ..., sk) if i < n then loop(i + 1, e1, ..., ek) else sj end

    with ``n`` computed outside the loop and the state data; else None (the loop
    stays a recursion: it runs and differentiates as before, and its export refusal
    says why)."""
    params = loop.parameters
    if len(params) < 2 or not isinstance(loop.abstract, GraphSig):
        return None
    out = loop.output
    if not isinstance(out, CNode) or len(out.inputs) != 1 or not out.inputs[0].is_apply(structure.switch):
        return None
    switch = out.inputs[0]
    assert isinstance(switch, CNode)
    cond, then_v, else_v = switch.inputs[1:]
    if not (isinstance(then_v, ValueNode) and isinstance(then_v.value, FuncGraph)
            and isinstance(else_v, ValueNode) and isinstance(else_v.value, FuncGraph)):
        return None
    if not (isinstance(cond, CNode) and cond.is_apply(arith.lt) and cond.inputs[1] is params[0]):
        return None
    n = cond.inputs[2]
    if n.graph is loop or n in params:
        return None
    then_g, else_g = then_v.value, else_v.value
    if then_g.parameters or else_g.parameters or else_g.output not in params[1:]:
        return None
    tail = then_g.output
    if not (isinstance(tail, CNode) and isinstance(tail.inputs[0], ValueNode)
            and tail.inputs[0].value is loop and len(tail.inputs) == len(params) + 1):
        return None
    step = tail.inputs[1]
    if not (isinstance(step, CNode) and step.is_apply(arith.add) and step.inputs[1] is params[0]
            and isinstance(step.inputs[2], ValueNode) and step.inputs[2].value == 1
            and type(step.inputs[2].value) is int):
        return None
    if not isinstance(params[0].abstract, AScalar) or not str(params[0].abstract.dtype).startswith("i"):
        return None
    if not all(_is_data(p.abstract) for p in params[1:]):
        return None
    # The then-branch may read the loop's parameters, nothing else the loop computes.
    scope = manager.scope(then_g)
    if set(manager.scope(loop)) != {loop, then_g, else_g}:
        # A closure made inside the step (``ap(lambda (z) ... acc end, x)``, owned by the
        # loop, not the branch): the body's clone would leave it reading the loop's old
        # parameters (the manager's parent repair then never settled), so such a loop
        # stays a recursion, as it ran before.
        return None
    inside = set(scope)
    for g in scope:
        for node in toposort(g, manager):
            if isinstance(node, CNode) and node.graph is g:
                for inp in node.inputs:
                    if inp.graph is loop and inp not in params:
                        return None
                    if isinstance(inp, ValueNode) and inp.value is loop and node is not tail:
                        return None
    del inside
    return n, then_g, params.index(else_g.output)


def _rewrite_counted_loop(manager: Manager, loop: FuncGraph, n: Node, then_g: FuncGraph,
                          returned: int, calls: list[CNode]) -> None:
    params = loop.parameters
    state = params[1:]
    loc = loop.loc
    carry_abs: AbstractValue = state[0].abstract if len(state) == 1 else ATuple(
        tuple(p.abstract for p in state))
    body = FuncGraph(loop.name + "_body", loop.loc)
    i = body.add_parameter(params[0].name or "i", params[0].loc)
    i.abstract = AScalar("i64")
    c = body.add_parameter("carry", loc)
    c.abstract = carry_abs
    seed: dict[Node, Node] = {params[0]: i}
    if len(state) == 1:
        seed[state[0]] = c
    else:
        for k, p in enumerate(state):
            seed[p] = _getitem(body, c, k, p.loc)
    cloner = Cloner(manager, manager.scope(then_g), node_map=seed, inline_into={then_g: body})
    tail = then_g.output
    assert isinstance(tail, CNode)
    new_state = [cloner.node_map.get(a, a) for a in tail.inputs[2:]]
    body.output = new_state[0] if len(state) == 1 else _tuple(body, new_state, loc)
    body.abstract = GraphSig((i.abstract, carry_abs), carry_abs)
    for call in calls:
        graph = call.graph
        start, *init = call.inputs[1:]
        carry_in = init[0] if len(state) == 1 else _tuple(graph, list(init), call.loc)
        looped = _apply(graph, [_prim(loops.fori_loop), start, n, _graph_value(body), carry_in],
                        carry_abs, call.loc)
        result = looped if len(state) == 1 else _getitem(graph, looped, returned - 1, call.loc)
        manager.replace(call, result)


def _captures_only_data(manager: Manager, loop: FuncGraph) -> bool:
    """Whether everything ``loop`` captures is data (tensors, numbers, tuples of them):
    then :func:`close_body` makes the ``fori_loop`` body capture nothing, and the J-world
    loop of the closed body (:func:`anfir.autodiff.loops.bake_closed_body`) carries only
    data through its backward scan, at every order.  A captured function (``partial(f,
    x)``, a tuple of gradients) cannot ride in a carry: the backward scan of such a body
    accumulates its gradient environment, and differentiating that scan again would
    stack environments as residuals."""
    return all(_is_data(fv.abstract) for fv in manager.free_variables_total(loop))


def recognise_counted_loops(program: "Program", data_captures_only: bool = False) -> int:
    """Rewrite each counted tail-recursive loop (see :func:`_counted_loop`) whose only
    uses are calls into ``fori_loop``, so its gradient is a reversed scan (first-order:
    it exports).  With ``data_captures_only`` (the program differentiates a derivative),
    only loops that capture nothing but data are rewritten (see
    :func:`_captures_only_data`); the others stay recursions, which differentiate at any
    order.  Returns how many loops were rewritten."""
    manager = program.require_manager()
    uses: dict[FuncGraph, list[tuple[CNode, int]]] = {}
    for graph in list(manager.graphs):
        for node in toposort(graph, manager):
            if isinstance(node, CNode) and node.graph is graph:
                for index, inp in enumerate(node.inputs):
                    if isinstance(inp, ValueNode) and isinstance(inp.value, FuncGraph):
                        uses.setdefault(inp.value, []).append((node, index))
    count = 0
    for loop, sites in uses.items():
        found = _counted_loop(manager, loop)
        if found is None or (data_captures_only and not _captures_only_data(manager, loop)):
            continue
        n, then_g, returned = found
        own = set(manager.scope(loop))
        calls = [node for node, index in sites if node.graph not in own]
        if not calls or any(index != 0 for node, index in sites if node.graph not in own):
            continue  # used as a value somewhere: kept
        if not all(n.graph is None or n.graph is call.graph for call in calls):
            continue  # the bound is not visible where the loop is started
        _rewrite_counted_loop(manager, loop, n, then_g, returned, calls)
        count += 1
    return count


COUNTED_LOOPS_STAT = "loops: counted loops as fori_loop"
"""The ``program.stats`` counter of the loops the ``loops`` phase rewrote."""


def rewrote_counted_loops(program: "Program") -> bool:
    """The ``loops`` phase's :attr:`Phase.shown`: it is dumped as ``NN_loops.ir`` and
    numbered when it rewrote a loop and the finer dumps are asked for
    (``compile_program(..., fine_dumps=True)``).  The default dumps keep their names
    for every program: the spec examples' (``dpower``'s ``03_ad.ir``,
    ``07_stablehlo.mlir``), which the docs and CI quote, have a counted loop too."""
    return program.fine_dumps and program.stats[COUNTED_LOOPS_STAT] > 0


def strip_custom_rules(program: "Program") -> int:
    """After the ``ad`` phase, ``custom_vjp(f, ...)`` / ``custom_jvp(f, ...)`` is ``f``: the
    gradients that use the rules are built, and what is left (the forward computation)
    calls ``f``, so exporters see the user's rule in the gradient and ``f`` elsewhere.
    Returns how many calls went."""
    manager = program.require_manager()
    custom = (loops.custom_vjp, loops.custom_jvp)
    calls = [node for graph in list(manager.graphs) for node in toposort(graph, manager)
             if isinstance(node, CNode) and node.graph is graph and node.inputs
             and isinstance(node.inputs[0], ValueNode) and isinstance(node.inputs[0].value, Primitive)
             and node.inputs[0].value in custom]
    for call in calls:
        manager.replace(call, call.inputs[1])
    return len(calls)


__all__ = ["COUNTED_LOOPS_STAT", "close_body", "recognise_counted_loops", "rewrote_counted_loops",
           "run", "strip_custom_rules"]

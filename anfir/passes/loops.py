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

from typing import Optional

from anfir.abstract.values import ATuple, GraphSig
from anfir.ir.clone import Cloner
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.ir.walk import toposort
from anfir.primitives import loops
from anfir.passes.compile_state import Program
from anfir.passes.typed_nodes import apply, getitem, graph_value, is_data_type, make_tuple, prim


_BODY = {loops.scan: 0, loops.fori_loop: 2}


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
    if not fvs or not isinstance(sig, GraphSig) or not all(is_data_type(fv.abstract) for fv in fvs):
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
    carry_in = getitem(closed, cv, 0, loc)
    vs = getitem(closed, cv, 1, loc)
    values = [getitem(closed, vs, i, loc) for i in range(len(fvs))]
    first = [carry_in, a1] if carry_pos == 0 else [a0, carry_in]
    out = apply(closed, [graph_value(opened), *first, *values], sig.out, loc)
    if prim is loops.scan:
        carry_out = getitem(closed, out, 0, loc)
        y = getitem(closed, out, 1, loc)
        closed.output = make_tuple(closed, [make_tuple(closed, [carry_out, vs], loc), y], loc)
    else:
        closed.output = make_tuple(closed, [out, vs], loc)
    closed.abstract = GraphSig((a0.abstract, a1.abstract), closed.output.abstract)
    # The new call, and what replaces the old one.
    graph = call.graph
    args = list(call.inputs[1:])
    init_pos = 1 if prim is loops.scan else 3
    args[init_pos] = make_tuple(graph, [args[init_pos], make_tuple(graph, list(fvs), loc)], loc)
    args[index] = graph_value(closed)
    old = call.abstract
    if prim is loops.scan:
        assert isinstance(old, ATuple)
        new_abs = ATuple((ATuple((old.items[0], vs_abs)), old.items[1]))
        looped = apply(graph, [call.inputs[0], *args], new_abs, loc, call.attrs)
        carry = getitem(graph, getitem(graph, looped, 0, loc), 0, loc)
        return make_tuple(graph, [carry, getitem(graph, looped, 1, loc)], loc)
    looped = apply(graph, [call.inputs[0], *args], ATuple((old, vs_abs)), loc, call.attrs)
    return getitem(graph, looped, 0, loc)


def run(program: "Program") -> "Program":
    """Close the bodies of the program's structured loops (see the module doc)."""
    manager = program.require_manager()
    calls = [node for graph in list(manager.graphs) for node in toposort(graph, manager)
             if isinstance(node, CNode) and node.graph is graph and node.inputs
             and isinstance(node.inputs[0], ValueNode) and isinstance(node.inputs[0].value, Primitive)
             and node.inputs[0].value in _BODY]
    # A loop in a loop's body that captures a value makes the outer body read it
    # through the inner body; once the inner one is closed, the outer reads it
    # directly and closes too: rounds until nothing more closes (nesting depth).
    while calls:
        left = []
        for call in calls:
            replacement = close_body(manager, call)
            if replacement is None:
                left.append(call)
            else:
                manager.replace(call, replacement)
        if len(left) == len(calls):
            break
        calls = left
    return program


# -- counted tail-recursive loops: anfir.passes.counted_loops rewrites them ---------------------
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


__all__ = ["COUNTED_LOOPS_STAT", "close_body", "rewrote_counted_loops", "run", "strip_custom_rules"]

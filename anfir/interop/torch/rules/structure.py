"""The torch.export rules whose result is built from
:mod:`anfir.primitives.structure`: identities and ``detach``, tuple items,
the symbolic-size queries, asserts, and the higher-order ops (cond, while_loop, map).

See :mod:`anfir.interop.torch.rules.common` for the rule protocol.
"""

from __future__ import annotations

import operator
from typing import Any

from anfir.errors import AnfirError
from anfir.interop.torch.rules.common import RuleTable, out_value
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.primitives import reduce, shaping, structure, tensor


def _identity(b: Any, x: Any, *_: Any, **__: Any) -> Any:
    return b.call(structure.identity, x)


def _sym_size(b: Any, x: Any, dim: int) -> Any:
    return b.call(structure.tuple_getitem, b.call(tensor.shape, x), int(dim))


def _getitem(b: Any, t: Any, i: Any) -> Any:
    """``operator.getitem`` of a multi-result op: the item itself when the op's
    rule built the tuple here (batch norm, max pool), else ``tuple_getitem``."""
    if (isinstance(t, CNode) and isinstance(i, int) and isinstance(t.inputs[0], ValueNode)
            and t.inputs[0].value is structure.make_tuple and 0 <= i < len(t.inputs) - 1):
        return t.inputs[i + 1]
    return b.call(structure.tuple_getitem, t, i)


def _no_value(b: Any, *_: Any, **__: Any) -> Any:
    """Run-time assertions torch inserts: shape facts the specializer checks itself."""
    return None


def _pred(b: Any, pred: Any) -> Any:
    """A cond/while predicate as a bool: a 0-d bool tensor goes through ``all``."""
    fx_pred = b.fx_node.args[0]
    torch = b.importer.torch
    val = fx_pred.meta.get("val") if isinstance(fx_pred, torch.fx.Node) else None
    return b.call(reduce.all_, pred) if isinstance(val, torch.Tensor) else pred


def _cond(b: Any, pred: Any, true_gm: Any, false_gm: Any, operands: Any) -> Any:
    """``torch.cond`` -> ``switch(c, ✓g, ✗g)()``: branch graphs close over the operands."""
    c = _pred(b, pred)
    then_graph, _ = b.importer.subgraph(true_gm, "✓", list(operands), b.loc)
    else_graph, _ = b.importer.subgraph(false_gm, "✗", list(operands), b.loc)
    select = b.call(structure.switch, c, ValueNode(then_graph, b.loc), ValueNode(else_graph, b.loc))
    return CNode(b.graph, (select,), b.loc)


def _while_loop(b: Any, cond_gm: Any, body_gm: Any, carried: Any, additional: Any = ()) -> Any:
    """``while_loop`` -> a tail-recursive graph ``loop(c...) = if cond(c...) then
    loop(body(c...)) else (c...)``, closing over the additional inputs."""
    importer = b.importer
    cond_mod = cond_gm.value if isinstance(cond_gm, ValueNode) else cond_gm
    body_mod = body_gm.value if isinstance(body_gm, ValueNode) else body_gm
    carried, additional = list(carried), list(additional or ())
    loop = FuncGraph("while_loop", b.loc)
    params = [loop.add_parameter(f"carry{i}", b.loc) for i in range(len(carried))]
    inner = [*params, *[importer.as_node(a, b.loc) for a in additional]]

    def bind(gm: Any) -> dict[Any, Node]:
        phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
        return dict(zip(phs, inner))
    out = importer.build_body(cond_mod.graph, loop, bind(cond_mod), cond_mod)
    pred = out[0] if isinstance(out, list) else out
    lb = type(b)(importer, loop, None, b.loc)
    fx_pred = next(n for n in cond_mod.graph.nodes if n.op == "output").args[0]
    fx_pred = fx_pred[0] if isinstance(fx_pred, (list, tuple)) else fx_pred
    if isinstance(fx_pred.meta.get("val"), importer.torch.Tensor):
        pred = lb.call(reduce.all_, pred)
    then_graph = FuncGraph("✓", b.loc)
    new = importer.build_body(body_mod.graph, then_graph, bind(body_mod), body_mod)
    then_graph.output = CNode(then_graph, [ValueNode(loop, b.loc),
                                           *[importer.as_node(v, b.loc) for v in new]], b.loc)
    else_graph = FuncGraph("✗", b.loc)
    else_graph.output = CNode(else_graph, [ValueNode(structure.make_tuple, b.loc), *params], b.loc)
    select = lb.call(structure.switch, pred, ValueNode(then_graph, b.loc), ValueNode(else_graph, b.loc))
    loop.output = CNode(loop, (select,), b.loc)
    return CNode(b.graph, [ValueNode(loop, b.loc), *[importer.as_node(c, b.loc) for c in carried]], b.loc)


def _map(b: Any, body_gm: Any, xs: Any, args: Any) -> Any:
    """``map(body, xs, *args)`` (``higher_order.map_impl``) over a static leading
    dimension: one body graph (its mapped inputs are parameters, ``args`` closed
    over) called on each slice, each of its results ``stack``ed along axis 0.
    A dynamic leading dimension is refused."""
    xs, args = list(xs), list(args)
    sizes = {arg.meta["val"].shape[0] for arg in b.fx_node.args[1]}
    size = sizes.pop() if len(sizes) == 1 else None
    if not isinstance(size, int):
        raise AnfirError("map over a dynamic (or unequal) leading dimension", b.loc)
    body, _ = b.importer.subgraph(body_gm, "map_body", args, b.loc, params=len(xs))
    body_mod = body_gm.value if isinstance(body_gm, ValueNode) else body_gm
    n_out = len(next(n for n in body_mod.graph.nodes if n.op == "output").args[0])
    calls = []
    for i in range(size):
        slices = [b.call(shaping.squeeze, b.call(shaping.slice_, x, starts=i, ends=i + 1, axes=0),
                         axis=0) for x in xs]
        calls.append(CNode(b.graph, [ValueNode(body, b.loc), *slices], b.loc))
    outs = [b.call(shaping.stack, b.tuple_of(b.call(structure.tuple_getitem, c, j) for c in calls))
            for j in range(n_out)]
    return b.call(structure.make_tuple, *outs)


def _sym_query(b: Any, *_: Any, **__: Any) -> Any:
    """``sym_numel`` / ``sym_stride`` / ``sym_storage_offset``: the value torch traced
    (an int, or an expression of the inputs' sizes)."""
    return b.importer.size_value(out_value(b), b)


def _set_grad_enabled(b: Any, enabled: bool, body: Any, *args: Any) -> Any:
    """``wrap_with_set_grad_enabled`` (a ``torch.no_grad()`` block): its body's graph
    called on the operands; with gradients disabled, its results go through
    ``stop_gradient`` (no gradient flows back through the block, as in PyTorch)."""
    graph, _ = b.importer.subgraph(body, "grad_enabled" if enabled else "no_grad", list(args), b.loc)
    out = CNode(b.graph, [ValueNode(graph, b.loc)], b.loc)
    if enabled:
        return out
    module = body.value if hasattr(body, "value") else body
    count = len(next(n for n in module.graph.nodes if n.op == "output").args[0])
    return b.call(structure.make_tuple, *(b.call(structure.stop_gradient, b.call(structure.tuple_getitem, out, i))
                                         for i in range(count)))


def rules(torch: Any, table: RuleTable) -> None:
    """Add this family's rules to ``table``."""
    aten = torch.ops.aten
    put, named = table.put, table.named
    for op in (aten.clone.default, aten.alias.default, aten.lift_fresh_copy.default,
               aten.contiguous.default):
        put(op, _identity)
    put(aten.detach.default, lambda b, x: b.call(structure.stop_gradient, x))
    put(aten.sym_size.int, _sym_size)
    put(operator.getitem, _getitem)
    for op in (aten._assert_scalar.default, aten.sym_constrain_range_for_size.default,
               aten._assert_tensor_metadata.default):
        put(op, _no_value)
    put(torch.ops.higher_order.cond, _cond)
    put(torch.ops.higher_order.while_loop, _while_loop)
    put(torch.ops.higher_order.map_impl, _map)
    wrap = getattr(torch.ops.higher_order, "wrap_with_set_grad_enabled", None)
    if wrap is not None:
        put(wrap, _set_grad_enabled)
    named("sym_numel", "default", _sym_query)
    named("sym_stride", "int", _sym_query)
    named("sym_storage_offset", "default", _sym_query)
    named("sym_is_contiguous", "default", _sym_query)

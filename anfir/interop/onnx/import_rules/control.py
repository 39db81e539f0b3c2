"""The ONNX import rules whose result is built from
the control primitives (``switch``, in :mod:`anfir.primitives.structure`): If, Loop
and Scan, their bodies imported as graphs.

See :mod:`anfir.interop.onnx.import_rules` for how a rule is chosen.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from anfir.dtypes import BY_NAME
from anfir.interop.onnx.common import Ctx, NodeError, TypeInfo
from anfir.interop.onnx.import_rules.common import RuleSet, need_entry_input, static_input_shape
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import Node, ValueNode
from anfir.primitives import arith, indexing, reduce, shaping, structure, tensor

RULES = RuleSet()
"""This family's rules (merged into :data:`anfir.interop.onnx.import_rules.OPS`)."""
op = RULES.op


def _truth(ctx: Ctx, node: Node) -> Node:
    # ONNX conditions are bool tensors of one element; anfir's `if` takes a bool.
    return ctx.call(reduce.all_, node)


@op("If")
def _if(ctx: Ctx) -> Sequence[Optional[Node]]:
    imp = ctx.importer
    cond = _truth(ctx, ctx.need(0))
    if isinstance(cond, ValueNode):
        # A condition known when importing (shapes are often tested): only the branch
        # taken is built, in line (the other may not even import for these shapes).
        body = ctx.attr("then_branch" if bool(np.asarray(cond.value)) else "else_branch")
        outs = imp.convert_subgraph(body, ctx.graph, ctx.scope, _opsets(ctx), {})
        for name, result in zip(ctx.node.output, body.output):
            known = imp.types.get(name)
            if name and result.name in imp.types and (known is None or known.rank is None):
                imp.types[name] = imp.types[result.name]
        return [o if isinstance(o, ValueNode) else ctx.call(structure.identity, o) for o in outs]
    branches = []
    produced: list[list[Node]] = []
    for attr, mark in (("then_branch", "✓"), ("else_branch", "✗")):
        body = ctx.attr(attr)
        g = FuncGraph(imp.graph_name(f"{mark}{ctx.node.name or 'if'}"))
        outs = imp.convert_subgraph(body, g, ctx.scope, _opsets(ctx), {})
        g.output = outs[0] if len(outs) == 1 else g.apply(structure.make_tuple, *outs)
        branches.append(g)
        produced.append(outs)
    _merge_branch_types(ctx, produced)
    chosen = ctx.call(structure.switch, cond, branches[0], branches[1])
    result = ctx.graph.apply(chosen)
    n = len(ctx.node.output)
    if n == 1:
        return [result]
    return [ctx.graph.apply(structure.tuple_getitem, result, i) for i in range(n)]


def _merge_branch_types(ctx: Ctx, produced: list[list[Node]]) -> None:
    """What ONNX leaves unknown of an If's outputs (branches of different shapes), from
    the two branches' outputs (their ONNX types, else anfir's): the rank when they
    agree, the dims where they agree."""
    imp = ctx.importer
    types = imp.types
    bodies = (ctx.attr("then_branch"), ctx.attr("else_branch"))

    def branch_type(k: int, i: int) -> Optional[TypeInfo]:
        found = types.get(bodies[k].output[i].name)
        if found is not None and found.dims is not None:
            return found
        abstract = imp.node_abstract(produced[k][i])
        shape = getattr(abstract, "shape", None)
        if abstract is None or shape is None:
            return found
        return TypeInfo(getattr(abstract, "dtype", None), tuple(d if isinstance(d, int) else None for d in shape))

    for i, name in enumerate(ctx.node.output):
        known = types.get(name)
        if not name or (known is not None and known.rank is not None) or i >= len(bodies[0].output):
            continue
        a, b = branch_type(0, i), branch_type(1, i)
        if a is None or b is None or a.dims is None or b.dims is None or len(a.dims) != len(b.dims):
            continue
        dims = tuple(x if x == y else None for x, y in zip(a.dims, b.dims))
        types[name] = TypeInfo(a.dtype if a.dtype == b.dtype else None, dims)


def _opsets(ctx: Ctx) -> dict[str, int]:
    return ctx.importer.opsets


ElemType = tuple[str, tuple[int, ...]]


def _known_elem_shape(ctx: Ctx, name: str) -> Optional[ElemType]:
    # The dtype and shape of one step's scan output, when ONNX says.
    info = ctx.importer.types.get(name)
    if info is None or info.dtype is None or info.static_shape is None:
        return None
    return info.dtype, info.static_shape


def _build_loop(ctx: Ctx, name: str, n_state: int, n_scan: int,
                counter: Callable[[FuncGraph, Node], Node],
                bind: Callable[[FuncGraph, Node, Node, list[Node]], dict[str, Node]],
                body: Any, start: list[Node], scan_names: list[str],
                reverse_out: Sequence[bool], body_cond: bool) -> tuple[Node, list[ElemType]]:
    """A tail-recursive graph ``loop(i, cond, state..., stacked...)``: while
    ``counter(loop, i) and cond`` it runs the body (``bind`` names the body's inputs)
    and calls itself with the new state, each scan output stacked on its result
    (which starts empty: the element types, from ONNX or from anfir's inference of
    the body, are returned too).  ``start`` is the condition and the states."""
    imp = ctx.importer
    loop = FuncGraph(imp.graph_name(name))
    i = loop.add_parameter("i")
    c = loop.add_parameter("cond")
    state: list[Node] = [loop.add_parameter(f"state{k}") for k in range(n_state)]
    stacked = [loop.add_parameter(f"stacked{k}") for k in range(n_scan)]
    # What anfir knows of the loop's parameters, from their first values (a Scan's
    # state keeps its type; a Loop's may not, and then its scan outputs need ONNX's).
    imp._abstracts[id(i)] = (i, imp.node_abstract(ValueNode(np.array(0, dtype=np.int64))))
    if body_cond or ctx.node.op_type == "Scan":
        for param, first in zip([c, *state], start):
            imp._abstracts[id(param)] = (param, imp.node_abstract(first))
    go = imp.call(loop, reduce.all_, [imp.call(loop, arith.logical_and, [counter(loop, i), c], {}, None)],
                  {}, None)
    step = FuncGraph(imp.graph_name(f"✓{name}"))
    bound = bind(step, i, c, state)
    outs = imp.convert_subgraph(body, step, ctx.scope, _opsets(ctx), bound)
    offset = 1 if body_cond else 0
    next_cond = outs[0] if body_cond else c
    new_state = outs[offset:offset + n_state]
    new_stacked: list[Node] = []
    scan_types: list[ElemType] = []
    for k in range(n_scan):
        known = _known_elem_shape(ctx, scan_names[k])
        if known is None:
            found = _refined_type(imp.node_abstract(outs[offset + n_state + k]))
            if found is None:
                raise NodeError(f"the type of scan output {scan_names[k]!r} is not static (the stacked "
                                "result starts as an empty tensor of that shape)")
            known = found
        scan_types.append(known)
        item = imp.call(step, shaping.unsqueeze, [outs[offset + n_state + k]], {"axis": 0}, None)
        pair = (item, stacked[k]) if reverse_out[k] else (stacked[k], item)
        new_stacked.append(imp.call(step, shaping.concat, [imp.call(step, structure.make_tuple, list(pair), {}, None)],
                                    {"axis": 0}, None))
    next_i = imp.call(step, arith.add, [i, np.array(1, dtype=np.int64)], {}, None)
    step.output = step.apply(loop, next_i, next_cond, *new_state, *new_stacked)
    done = FuncGraph(imp.graph_name(f"✗{name}"))
    done.output = done.apply(structure.make_tuple, *state, *stacked)
    loop.output = loop.apply(loop.apply(structure.switch, go, step, done))
    empty = [ctx.const(np.zeros((0, *shape), dtype=BY_NAME[dtype].numpy)) for dtype, shape in scan_types]
    return ctx.graph.apply(loop, np.array(0, dtype=np.int64), *start, *empty), scan_types


def _refined_type(abstract: Any) -> Optional[ElemType]:
    """(dtype, static shape) of an abstract tensor or scalar, or None."""
    shape = getattr(abstract, "shape", ())
    dtype = getattr(abstract, "dtype", None)
    if dtype is None or shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return str(dtype), tuple(int(d) for d in shape)


@op("Loop")
def _loop(ctx: Ctx) -> Sequence[Optional[Node]]:
    body = ctx.attr("body")
    trip, cond0 = ctx.input(0), ctx.input(1)
    carried = [ctx.need(i) for i in range(2, len(ctx.node.input))]
    n_state = len(carried)
    n_scan = len(body.output) - 1 - n_state

    def counter(loop: FuncGraph, i: Node) -> Node:
        if trip is None:
            return ValueNode(np.array(True))
        return ctx.importer.call(loop, arith.lt, [i, trip], {}, None)

    def bind(step: FuncGraph, i: Node, c: Node, state: list[Node]) -> dict[str, Node]:
        names = [v.name for v in body.input]
        bound: dict[str, Node] = {names[0]: i, names[1]: c}
        bound.update({names[2 + k]: state[k] for k in range(n_state)})
        return bound

    start = [cond0 if cond0 is not None else ctx.const(np.array(True)), *carried]
    try:
        result, _ = _build_loop(ctx, ctx.node.name or "loop", n_state, n_scan, counter, bind, body, start,
                                [body.output[1 + n_state + k].name for k in range(n_scan)], [False] * n_scan,
                                True)
    except NodeError as failed:
        # A body that needs what only a finished iteration knows (a sequence that
        # grows: its length): with a trip count known when importing, the loop is
        # unrolled, each iteration's values then known; a trip count computed from
        # graph inputs asks the Backend to bind them.
        if isinstance(trip, ValueNode) and (cond0 is None or isinstance(cond0, ValueNode)):
            try:
                return _unrolled_loop(ctx, body, int(np.asarray(trip.value).reshape(-1)[0]), start, n_state, n_scan)
            except NodeError:
                raise failed from None
        need_entry_input(ctx, (0, 1), "the trip count and condition of a loop that is unrolled")
        raise
    return [ctx.graph.apply(structure.tuple_getitem, result, k) for k in range(n_state + n_scan)]


UNROLL_LIMIT = 1024
"""The most iterations of a Loop the importer unrolls."""


def _unrolled_loop(ctx: Ctx, body: Any, trips: int, start: list[Node], n_state: int,
                   n_scan: int) -> list[Optional[Node]]:
    """A Loop of a known trip count built iteration by iteration in the graph, while
    its condition stays a known true."""
    if trips > UNROLL_LIMIT:
        raise NodeError(f"a loop of {trips} iterations is too long to unroll")
    imp = ctx.importer
    names = [v.name for v in body.input]
    cond, state = start[0], list(start[1:])
    scans: list[list[Node]] = [[] for _ in range(n_scan)]
    for k in range(trips):
        if not isinstance(cond, ValueNode):
            raise NodeError("the loop's condition is computed when it runs")
        if not bool(np.all(np.asarray(cond.value))):
            break
        bound: dict[str, Node] = {names[0]: ctx.const(np.array(k, dtype=np.int64)), names[1]: cond}
        bound.update({names[2 + j]: state[j] for j in range(n_state)})
        outs = imp.convert_subgraph(body, ctx.graph, ctx.scope, _opsets(ctx), bound)
        cond, state = outs[0], list(outs[1:1 + n_state])
        for j in range(n_scan):
            scans[j].append(ctx.call(shaping.unsqueeze, outs[1 + n_state + j], axis=0))
    if any(not items for items in scans):
        raise NodeError("a loop with scan outputs that runs no iteration")
    stacked = [ctx.call(shaping.concat, ctx.call(structure.make_tuple, *items), axis=0) for items in scans]
    return [*state, *stacked]


@op("Scan", 9)
def _scan(ctx: Ctx) -> Sequence[Optional[Node]]:
    body = ctx.attr("body")
    m = int(ctx.attr("num_scan_inputs"))
    inputs = [ctx.need(i) for i in range(len(ctx.node.input))]
    n_state = len(inputs) - m
    n_scan = len(body.output) - n_state
    in_axes = [int(a) for a in ctx.attr("scan_input_axes", [0] * m)]
    in_dirs = [int(a) for a in ctx.attr("scan_input_directions", [0] * m)]
    out_axes = [int(a) for a in ctx.attr("scan_output_axes", [0] * n_scan)]
    out_dirs = [int(a) for a in ctx.attr("scan_output_directions", [0] * n_scan)]
    axes = [a % ctx.rank(n_state + k) for k, a in enumerate(in_axes)]
    try:
        shapes = [static_input_shape(ctx, n_state + k) for k in range(m)]
    except NodeError:
        # A symbolic length: read from the first scan input when the loop runs.
        shapes = []
    length_node: Node
    if shapes:
        lengths = {shapes[k][axes[k]] for k in range(m)}
        if len(lengths) != 1:
            raise NodeError(f"the scan inputs have different lengths {sorted(lengths)}")
        length_node = ctx.const(lengths.pop(), "i64")
    else:
        length_node = ctx.call(tensor.array, ctx.call(structure.tuple_getitem,
                                                    ctx.call(tensor.shape, inputs[n_state]), axes[0]))
    result, scan_types = _scan_loop(ctx, body, inputs, n_state, axes, length_node, in_dirs, out_dirs)
    outs: list[Optional[Node]] = [ctx.graph.apply(structure.tuple_getitem, result, k)
                                  for k in range(n_state + n_scan)]
    for k in range(n_scan):
        rank = len(scan_types[k][1]) + 1
        axis = out_axes[k] % rank
        if axis:
            perm = list(range(1, rank))
            perm.insert(axis, 0)
            outs[n_state + k] = ctx.call(tensor.transpose, outs[n_state + k], tuple(perm))
    return outs


@op("Scan", 8)
def _scan8(ctx: Ctx) -> Sequence[Optional[Node]]:
    # Opset 8's Scan has a batch axis first (and optional sequence lengths): one
    # scan per batch element, the results stacked.
    if ctx.input(0) is not None:
        raise NodeError("Scan (opset 8) with sequence_lens")
    body = ctx.attr("body")
    m = int(ctx.attr("num_scan_inputs"))
    inputs = [ctx.need(i) for i in range(1, len(ctx.node.input))]
    n_state = len(inputs) - m
    n_scan = len(body.output) - n_state
    dirs = [int(a) for a in ctx.attr("directions", [0] * m)]
    shapes = [static_input_shape(ctx, 1 + n_state + k) for k in range(m)]
    lengths = {shape[1] for shape in shapes}
    if len(lengths) != 1:
        raise NodeError(f"the scan inputs have different lengths {sorted(lengths)}")
    length = ctx.const(lengths.pop(), "i64")
    per_batch: list[list[Node]] = []
    for b in range(shapes[0][0]):
        row = [ctx.call(indexing.gather, x, ctx.const(b, "i64"), axis=0) for x in inputs]
        result, _ = _scan_loop(ctx, body, row, n_state, [0] * m, length, dirs, [0] * n_scan)
        per_batch.append([ctx.graph.apply(structure.tuple_getitem, result, k) for k in range(n_state + n_scan)])
    return [ctx.call(shaping.stack, ctx.call(structure.make_tuple, *[r[k] for r in per_batch]), axis=0)
            for k in range(n_state + n_scan)]


def _scan_loop(ctx: Ctx, body: Any, inputs: list[Node], n_state: int, axes: list[int], length_node: Node,
               in_dirs: list[int], out_dirs: list[int]) -> tuple[Node, list[ElemType]]:
    """The loop of a Scan: the final states and the stacked scan outputs (a tuple),
    and each scan output's element type."""
    m = len(inputs) - n_state
    n_scan = len(body.output) - n_state
    scanned = inputs[n_state:]

    def counter(loop: FuncGraph, i: Node) -> Node:
        return ctx.importer.call(loop, arith.lt, [i, length_node], {}, None)

    def bind(step: FuncGraph, i: Node, c: Node, state: list[Node]) -> dict[str, Node]:
        imp = ctx.importer
        names = [v.name for v in body.input]
        bound: dict[str, Node] = {names[k]: state[k] for k in range(n_state)}
        for k in range(m):
            index = i if not in_dirs[k] else imp.call(
                step, arith.sub, [imp.call(step, arith.sub, [length_node, np.array(1, dtype=np.int64)], {}, None), i],
                {}, None)
            bound[names[n_state + k]] = imp.call(step, indexing.gather, [scanned[k], index],
                                                 {"axis": axes[k]}, None)
        return bound

    start = [ctx.const(np.array(True)), *inputs[:n_state]]
    return _build_loop(ctx, ctx.node.name or "scan", n_state, n_scan, counter, bind, body, start,
                       [body.output[n_state + k].name for k in range(n_scan)], [bool(d) for d in out_dirs], False)

"""The optimized graph as a first-order program: closures, calls and recursion taken apart.

:func:`flatten_program` walks the graph ``anfir.compile`` returns and writes a
:class:`~anfir.flat.statements.FlatProgram` — what every exporter emits from.  The
walk is a small partial evaluator: each node gets a *symbolic value*
(:class:`SV`) — a tensor of the flat program (:class:`Leaf`), a constant known
at export time (:class:`Known`), a tuple of symbolic values (:class:`Tup`), a
closure (a graph with the symbolic values it captured), a gradient
environment with static keys (:class:`Env`)... — so that everything that is
not a tensor disappears:

* **tuples** are taken apart (``tuple_getitem`` of a :class:`Tup` is its item);
* **calls of non-recursive graphs are inlined**: the callee's body is walked
  with its parameters bound to the arguments' symbolic values;
* **closures** are converted: a closure is its graph plus the captured
  symbolic values, so calling it is inlining it;
* ``switch(c, f, g)()`` — anfir's ``if`` — becomes an :class:`~anfir.flat.statements.IfOp`
  whose branches are the two calls; what they return is merged slot by slot
  (a value made in a branch leaves it as a result of the ``If``);
* **a function value from several lambdas** (a backpropagator returned from an
  ``if`` in a gradient graph) is *defunctionalized*: a :class:`FnUnion` of the
  possible closures (lambda-set specialization) and an ``i64`` tag saying which
  one it is; calling it is an ``If`` chain on the tag;
* **tail recursion** whose state is tensors and scalars becomes a
  :class:`~anfir.flat.statements.LoopOp`: the recursive graph is walked once as
  the loop body, a self-call in tail position is "continue with these
  arguments", any other result is "stop with this value";
* gradient **environments** (``newenv``/``env_setitem``/``env_getitem``) have
  constant keys, so they are dictionaries at export time.

What cannot be taken apart — a function that is still an input or an output,
recursion that is not a loop (``fibonacci``, the backward pass of a loop), a
loop carrying functions — is an :class:`~anfir.errors.ExportError` located at
the node.

The walk is iterative: calls and branches push frames on an explicit stack
(continuations are callbacks the driver runs), so program size never meets
Python's recursion limit.  Only the structure of one value (tuples inside
tuples) is walked recursively, up to :data:`MAX_NESTING` levels.

Which primitive the walker handles itself is :data:`STRUCTURAL` (a table keyed
by the primitive objects); every other primitive becomes an
:class:`~anfir.flat.statements.Op` for the target's own table.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

import numpy as np

from anfir.abstract.lattice import abstract_of_value
from anfir.abstract.shapes import dim_symbol, dims_equal
from anfir.abstract.values import (
    UNKNOWN, AbstractValue, AEnv, ANone, AScalar, AString, ATensor, ATuple, GraphSig,
)
from anfir.dtypes import dtype_name, is_float, numpy_dtype
from anfir.errors import AnfirError, ExportError
from anfir.flat.statements import (
    DIM, Block, Const, FlatProgram, IfOp, LoopOp, NameAllocator, Op, Operand, Structure, Undefined,
    Value, dtype_of_type, is_value_type, prune,
)
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager, analyse
from anfir.ir.nodes import CNode, Node, ParameterNode, ValueNode
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.ir.walk import toposort
from anfir.location import Location
from anfir.primitives import arith, gradient, indexing, loops, shaping, structure, tensor
from anfir.primitives import checkpointing
from anfir.primitives.structure import zeros_like_value
from anfir.runtime_values import GradEnv, Partial, SymbolicKey

MAX_NESTING = 200
"""How deep tuples (and closures inside tuples) may nest in one exported value."""

UNKNOWN_DIM = dim_symbol("_0")
"""A dimension that differs between the branches that make a value (unknown)."""


# -- symbolic values -------------------------------------------------------------------
class SV:
    """What the walker knows about a node's value."""

    __slots__ = ()


@dataclass(eq=False)
class Known(SV):
    """A value known at export time (a scalar, string, None, array, tuple, key, dtype...)."""

    value: Any
    type: Optional[AbstractValue] = None
    """Its type when it is a scalar whose type is not its Python type (``1.0`` as an f32)."""


@dataclass(eq=False)
class Leaf(SV):
    """A tensor of the flat program."""

    value: Value


@dataclass(eq=False)
class Tup(SV):
    """A tuple."""

    items: tuple[SV, ...]


@dataclass(eq=False)
class FlatClosure(SV):
    """A graph and the symbolic values of its free variables (``free_variables_total``)."""

    graph: FuncGraph
    captured: dict[Node, SV]


@dataclass(eq=False)
class PrimValue(SV):
    """A primitive used as a value (``g(sin, x)``)."""

    prim: Primitive


@dataclass(eq=False)
class PartialValue(SV):
    """``partial(fn, *args)``."""

    fn: SV
    args: tuple[SV, ...]


@dataclass(eq=False)
class CondTag:
    """The tag of ``switch(cond, f, g)``: option 0 when ``cond``, else option 1."""

    cond: Value


@dataclass(eq=False)
class FnUnion(SV):
    """A function value that is one of ``options``; ``tag`` says which (an i64 index)."""

    tag: Any
    """A :class:`CondTag`, or an :class:`SV` (a :class:`Leaf` or :class:`Known` index)."""
    options: tuple[SV, ...]


@dataclass(eq=False)
class Entry:
    """One key of a gradient environment: ``value``, present when ``flag`` is true (None: always)."""

    value: SV
    flag: Optional[SV] = None


@dataclass(eq=False)
class Env(SV):
    """A gradient environment: constant keys (``SymbolicKey``) to entries."""

    entries: dict[Any, Entry]


@dataclass(eq=False)
class Continue(SV):
    """A self-call in tail position of a loop body: run the body again with ``args``."""

    args: tuple[SV, ...]


@dataclass(eq=False)
class LoopStep(SV):
    """What one iteration of a loop body gives: continue?, the next state, the result."""

    flag: SV
    state: tuple[SV, ...]
    result: SV


class _Absent(SV):
    """A slot a branch does not fill (the other branch's closure, say)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()


# -- the walk's bookkeeping -------------------------------------------------------------------
@dataclass(eq=False)
class LoopContext:
    """A loop being built: the recursive graph walked as its body."""

    head: FuncGraph
    members: frozenset[FuncGraph]
    """The graphs of the recursion's cycle (inlined in the body; only ``head`` is the loop)."""
    state_types: list[AbstractValue]
    state_in: list[Value]
    result_type: AbstractValue
    result_in: list[Value]
    body: Block


@dataclass(eq=False)
class Frame:
    """A graph being walked: the nodes left to do and the symbolic values so far."""

    graph: FuncGraph
    order: list[Node]
    values: dict[Node, SV]
    captured: dict[Node, SV]
    block: Block
    tail: Optional[LoopContext]
    """The loop whose body this frame's result is (a self-call at its output is "continue")."""
    on_return: Callable[[SV], None]
    pos: int = 0


@dataclass(eq=False)
class PrimCall:
    """One application of a primitive, as the structural rules see it."""

    prim: Primitive
    args: list[SV]
    block: Block
    loc: Optional[Location]
    type: Optional[AbstractValue]
    """The node's abstract value (None for calls the walker makes itself)."""
    hint: str
    """A name for the results."""
    what: str
    """How messages name the node."""
    attrs: dict[str, Any] = field(default_factory=dict)
    """The call's attributes (``sum(x, axis=1)``); once bound (:meth:`Walker.bind`),
    every attribute of the primitive, defaults filled in."""


StructuralRule = Callable[["Walker", PrimCall], SV]


@dataclass
class Walker:
    """Walks an optimized entry graph into a :class:`FlatProgram` (see the module doc)."""

    entry: FuncGraph
    manager: Manager = field(init=False)
    names: NameAllocator = field(default_factory=NameAllocator)
    stack: list[Any] = field(default_factory=list)
    loops: list[LoopContext] = field(default_factory=list)
    active: Counter = field(default_factory=Counter)
    orders: dict[FuncGraph, list[Node]] = field(default_factory=dict)
    cycles: dict[FuncGraph, frozenset[FuncGraph]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.manager = analyse(self.entry)
        self.cycles = _cycles(self.manager)

    # -- the program ---------------------------------------------------------------
    def program(self) -> FlatProgram:
        """Walk the entry and return the flat program."""
        entry = self.entry
        main = Block()
        inputs: list[Value] = []
        structures: list[Structure] = []
        values: dict[Node, SV] = {}
        for param in entry.parameters:
            sv, struct = self._input(param, main, inputs)
            values[param] = sv
            structures.append(struct)
        result: list[SV] = []
        members = self.cycles.get(entry)
        if members is not None:  # the entry is itself a loop (``def gcd(a, b) = ... gcd(...)``)
            args = [values[p] for p in entry.parameters]
            self._start_loop(FlatClosure(entry, {}), args, main, entry.loc, f"@{entry.name}", members,
                             result.append)
        else:
            self._push(Frame(entry, self._order(entry), values, {}, main, None, result.append))
        self._drive()
        (out,) = result
        output_names: list[str] = []
        output_types: list[AbstractValue] = []
        where = _describe_graph_output(entry)
        struct = self._output(out, main, output_names, output_types, "output", where, entry, 0)
        return FlatProgram(entry.name, inputs, structures, main, output_names, struct, output_types,
                           self.names)

    def _input(self, param: ParameterNode, block: Block, inputs: list[Value]) -> tuple[SV, Structure]:
        """The symbolic value of an entry parameter, and its flat inputs."""
        name = param.name or "input"
        abstract = param.abstract
        return self._input_value(abstract, sanitize(name), block, inputs, param, 0)

    def _input_value(self, abstract: Any, hint: str, block: Block, inputs: list[Value],
                     param: ParameterNode, depth: int) -> tuple[SV, Structure]:
        """Flat inputs for a parameter of type ``abstract`` (a tuple gives one per leaf)."""
        self._depth(depth, param.loc)
        if isinstance(abstract, ATuple):
            items, structs = [], []
            for i, item in enumerate(abstract.items):
                sv, struct = self._input_value(item, f"{hint}_{i}", block, inputs, param, depth + 1)
                items.append(sv)
                structs.append(struct)
            return Tup(tuple(items)), structs
        if isinstance(abstract, ANone):
            return Known(None), None
        if is_value_type(abstract):
            value = Value(self.names.take(hint), _widen(abstract), block)
            inputs.append(value)
            return Leaf(value), value.name
        raise ExportError(f"the parameter {param.name!r} of @{param.graph.name} is {abstract}: "
                          "only tensors, scalars, strings and tuples of them can be inputs "
                          "(a function parameter is not first-order)", param.loc)

    def _output(self, sv: SV, block: Block, names: list[str], types: list[AbstractValue],
                hint: str, where: str, graph: FuncGraph, depth: int) -> Structure:
        """Yield ``sv`` from the main block as outputs; return how their names nest."""
        self._depth(depth, graph.loc)
        if isinstance(sv, Known) and isinstance(sv.value, tuple):
            sv = Tup(tuple(Known(v) for v in sv.value))
        if isinstance(sv, Tup):
            return [self._output(item, block, names, types, f"{hint}_{i}", where, graph, depth + 1)
                    for i, item in enumerate(sv.items)]
        if isinstance(sv, Known) and sv.value is None:
            return None
        if isinstance(sv, (Leaf, Known)) and _is_leaflike(sv):
            name = self.names.take(hint)
            operand = self._operand(sv, where, graph.loc)
            block.results.append(operand)
            names.append(name)
            types.append(_type_of(sv))
            return name
        raise ExportError(f"{where} is {_kind_text(sv)}: an exported program must return tensors, "
                          "scalars, strings and tuples of them (the program is not first-order "
                          "after optimization)", graph.loc)

    # -- the driver --------------------------------------------------------------------
    def _push(self, frame: Frame) -> None:
        """Start walking a frame."""
        self.active[frame.graph] += 1
        self.stack.append(frame)

    def _later(self, callback: Callable[[SV], None], sv: SV) -> None:
        """Run ``callback(sv)`` from the driver (never from inside another callback)."""
        self.stack.append(lambda: callback(sv))

    def _drive(self) -> None:
        """Run frames and callbacks until the stack is empty (the only loop of the walk)."""
        stack = self.stack
        while stack:
            item = stack[-1]
            if not isinstance(item, Frame):
                stack.pop()
                item()
                continue
            if item.pos >= len(item.order):
                stack.pop()
                self.active[item.graph] -= 1
                item.on_return(self._lookup(item, item.graph.output))
                continue
            node = item.order[item.pos]
            item.pos += 1
            if isinstance(node, CNode):
                self._eval(item, node)

    def _order(self, graph: FuncGraph) -> list[Node]:
        """``graph``'s nodes in dependency order (computed once)."""
        order = self.orders.get(graph)
        if order is None:
            order = self.orders[graph] = toposort(graph, self.manager)
        return order

    def _lookup(self, frame: Frame, node: Node) -> SV:
        """The symbolic value of ``node`` as seen from ``frame``."""
        found = frame.values.get(node)
        if found is not None:
            return found
        found = frame.captured.get(node)
        if found is not None:
            return found
        if isinstance(node, ValueNode):
            return self._constant(frame, node)
        raise ExportError(f"internal: no value for {node!r} in @{frame.graph.name}", node.loc)

    def _constant(self, frame: Frame, node: ValueNode) -> SV:
        """The symbolic value of a constant (a graph constant makes a closure here)."""
        value = node.value
        if isinstance(value, FuncGraph):
            fvs = self.manager.free_variables_total(value)
            return FlatClosure(value, {fv: self._lookup(frame, fv) for fv in fvs})
        if isinstance(value, Primitive):
            return PrimValue(value)
        if isinstance(value, GradEnv):
            return Env({key: Entry(Known(v)) for key, v in value.items()})
        if isinstance(value, Partial):
            fn = value.fn
            fn_sv: SV = PrimValue(fn) if isinstance(fn, Primitive) else Known(fn)
            if isinstance(fn, FuncGraph):
                fn_sv = FlatClosure(fn, {})
            return PartialValue(fn_sv, tuple(Known(a) for a in value.args))
        return Known(value, _widen(node.abstract) if isinstance(node.abstract, AScalar) else None)

    # -- one node ------------------------------------------------------------------------
    def _eval(self, frame: Frame, node: CNode) -> None:
        """Evaluate one CNode of ``frame``: a primitive at once, a call by pushing work."""
        callee = self._lookup(frame, node.inputs[0])
        args = [self._lookup(frame, a) for a in node.inputs[1:]]
        if isinstance(callee, PrimValue) and callee.prim in (loops.scan, loops.fori_loop):
            self._structured_loop(frame, node, callee.prim, args)  # a Loop: see that section
            return
        if isinstance(callee, PrimValue):
            call = PrimCall(callee.prim, args, frame.block, node.loc, node.abstract,
                            _hint(node, callee.prim.name), _describe(node), dict(node.attrs))
            frame.values[node] = self.apply(call)
            return
        tail = frame.tail if node is frame.graph.output else None

        def done(sv: SV) -> None:
            frame.values[node] = sv

        self._call(callee, args, frame.block, tail, node, done)

    def _call(self, fn: SV, args: list[SV], block: Block, tail: Optional[LoopContext],
              node: CNode, on_result: Callable[[SV], None]) -> None:
        """Call ``fn`` on ``args``: inline it, start a loop, continue one, or dispatch on a tag."""
        if isinstance(fn, PartialValue):
            self._call(fn.fn, [*fn.args, *args], block, tail, node, on_result)
            return
        if isinstance(fn, PrimValue):
            call = PrimCall(fn.prim, args, block, node.loc, None, fn.prim.name, _describe(node))
            self._later(on_result, self.apply(call))
            return
        if isinstance(fn, FnUnion):
            self._call_union(fn, args, block, tail, node, on_result)
            return
        if not isinstance(fn, FlatClosure):
            what = _kind_text(fn)
            if isinstance(fn, Known) and isinstance(fn.value, MetaFunction):
                what = f"the meta function {fn.value.name}, which the ad phase did not expand"
            raise ExportError(f"{_describe(node)} calls {what}", node.loc)
        graph = fn.graph
        if len(args) != len(graph.parameters):
            raise ExportError(f"{_describe(node)} calls @{graph.name} with {len(args)} arguments; "
                              f"it takes {len(graph.parameters)}", node.loc)
        heads = [ctx for ctx in self.loops if ctx.head is graph]
        if heads:
            if tail is not None and tail.head is graph:
                self._later(on_result, Continue(tuple(args)))
                return
            raise ExportError(
                f"{_describe(node)}: @{graph.name} calls itself, but not in tail position — "
                "recursion that is not a loop (such as fibonacci, or the backward pass of a "
                "loop) cannot be exported to a target without recursion", node.loc)
        if self.active[graph] > 0:
            raise ExportError(f"{_describe(node)}: @{graph.name} calls itself through a path that "
                              "is not a loop; only tail recursion exports (as a Loop)", node.loc)
        members = self.cycles.get(graph)
        if members is not None and not any(graph in ctx.members for ctx in self.loops):
            self._start_loop(fn, args, block, node.loc, _describe(node), members, on_result)
            return
        values: dict[Node, SV] = dict(zip(graph.parameters, args))
        self._push(Frame(graph, self._order(graph), values, fn.captured, block, tail, on_result))

    # -- if: a call of a function union -----------------------------------------------------
    def _call_union(self, fn: FnUnion, args: list[SV], block: Block, tail: Optional[LoopContext],
                    node: CNode, on_result: Callable[[SV], None]) -> None:
        """Call a function that is one of several: each option in its own branch, merged into If(s)."""
        tag = fn.tag
        if isinstance(tag, Known):
            self._call(fn.options[int(tag.value)], args, block, tail, node, on_result)
            return
        options = fn.options
        blocks = [Block(parent=block) for _ in options]
        results: list[SV] = []

        def start(i: int) -> None:
            self._call(options[i], args, blocks[i], tail, node, finish)

        def finish(sv: SV) -> None:
            results.append(sv)
            if len(results) < len(options):
                start(len(results))
                return
            merged, values = self._merge(results, blocks, block, tail, node.loc, _hint(node, "if"))
            if isinstance(tag, CondTag):
                block.ops.append(IfOp(tag.cond, blocks[0], blocks[1], tuple(values), node.loc))
            else:
                self._if_chain(tag, blocks, block, values, node.loc)
            on_result(merged)

        start(0)

    def _if_chain(self, tag: Any, blocks: list[Block], block: Block, values: list[Value],
                  loc: Optional[Location]) -> None:
        """``if tag == 0 then b0 else if tag == 1 then b1 ... else b_last``."""
        assert isinstance(tag, Leaf)
        else_block = blocks[-1]
        for i in range(len(blocks) - 2, -1, -1):
            outer = block if i == 0 else Block(parent=block)
            test = self._emit(arith.eq, (tag.value, Const(i)), AScalar("bool"), outer, loc, "is_option")
            if i == 0:
                outs = values
            else:
                outs = [Value(self.names.take(v.name), v.type, outer, v.maybe_undefined) for v in values]
            blocks[i].parent = outer
            else_block.parent = outer
            outer.ops.append(IfOp(test, blocks[i], else_block, tuple(outs), loc))
            if i:
                outer.results = list(outs)
            else_block = outer

    # -- tail recursion: a loop ----------------------------------------------------------
    def _start_loop(self, fn: FlatClosure, args: list[SV], block: Block, loc: Optional[Location],
                    what: str, members: frozenset[FuncGraph],
                    on_result: Callable[[SV], None]) -> None:
        """Walk ``fn``'s recursive graph once as the body of a Loop started by this call."""
        graph = fn.graph
        body = Block(parent=block)
        state_types: list[AbstractValue] = []
        state_in: list[Value] = []
        param_values: dict[Node, SV] = {}
        init: list[Operand] = []
        for param, arg in zip(graph.parameters, args):
            types = self._slots(param.abstract, graph, f"the loop state {param.name!r}", 0)
            leaves = [Value(self.names.take(sanitize(param.name or "state")), t, body) for t in types]
            state_types.extend(types)
            state_in.extend(leaves)
            param_values[param] = _rebuild(param.abstract, iter(leaves))
            for sv, t in zip(self._to_slots(arg, param.abstract, what, loc, 0), types):
                init.append(self._operand(_typed(sv, t), what, loc))
        signature = graph.abstract
        if not isinstance(signature, GraphSig):
            raise ExportError(f"internal: @{graph.name} has no signature", graph.loc)
        result_types = self._slots(signature.out, graph, f"the result of the loop @{graph.name}", 0)
        result_in = [Value(self.names.take("result"), t, body) for t in result_types]
        init.extend(Undefined(t) for t in result_types)
        body.params = state_in + result_in
        ctx = LoopContext(graph, members, state_types, state_in, signature.out, result_in, body)

        def finish(sv: SV) -> None:
            self.loops.remove(ctx)
            step = self._as_step(sv, ctx)
            where = f"the loop @{graph.name}"
            body.results = [self._operand(_typed(step.flag, AScalar("bool")), where, loc)]
            body.results += [self._operand(_typed(s, t), where, loc)
                             for s, t in zip(step.state, state_types)]
            result_svs = self._to_slots(step.result, ctx.result_type, where, loc, 0)
            body.results += [self._operand(_typed(s, t), where, loc)
                             for s, t in zip(result_svs, result_types)]
            outs = [Value(self.names.take(v.name), v.type, block) for v in state_in + result_in]
            block.ops.append(LoopOp(tuple(init), body, tuple(outs), loc))
            on_result(_rebuild(ctx.result_type, iter(outs[len(state_in):])))

        self.loops.append(ctx)
        self._push(Frame(graph, self._order(graph), param_values, fn.captured, body, ctx, finish))

    def _slots(self, abstract: Any, graph: FuncGraph, what: str, depth: int) -> list[AbstractValue]:
        """The leaf types of a loop's state or result (constants and None take no slot)."""
        self._depth(depth, graph.loc)
        if isinstance(abstract, ATuple):
            return [t for item in abstract.items for t in self._slots(item, graph, what, depth + 1)]
        if isinstance(abstract, ANone) or _is_constant_abstract(abstract):
            return []
        if is_value_type(abstract):
            return [_widen(abstract)]
        raise ExportError(f"{what} is {abstract}: a loop exports when its state and result are "
                          "tensors, scalars and tuples of them (a loop that carries or returns "
                          "a function, as the gradient of a loop does, does not)", graph.loc,
                          hint="a loop whose gradient exports is a scan or fori_loop; the loops "
                               "phase makes one of a counted loop — an integer counter stepped by "
                               "a constant towards a bound fixed for the loop (`if i < n then "
                               "loop(i + 1, ...) else ...`, `if k == 0 then ... else loop(k - 1, "
                               "...)`) with a state of floats and tensors — write this loop that "
                               "way, or with scan/fori_loop")

    def _to_slots(self, sv: SV, abstract: Any, what: str, loc: Optional[Location],
                  depth: int) -> list[SV]:
        """``sv`` cut into the slots :meth:`_slots` gives for ``abstract``."""
        self._depth(depth, loc)
        if isinstance(abstract, ATuple):
            items = _tuple_items(sv)
            if items is None or len(items) != len(abstract.items):
                raise ExportError(f"internal: {what} gives {_kind_text(sv)} where a tuple "
                                  f"{abstract} is expected", loc)
            return [s for item, a in zip(items, abstract.items)
                    for s in self._to_slots(item, a, what, loc, depth + 1)]
        if isinstance(abstract, ANone) or _is_constant_abstract(abstract):
            return []
        if sv is ABSENT or _is_leaflike(sv):
            return [sv]
        raise ExportError(f"{what} gives {_kind_text(sv)} where a loop carries data", loc)

    def _as_step(self, sv: SV, ctx: LoopContext) -> LoopStep:
        """A loop body's result as a step: continue with new state, or stop with a result."""
        if isinstance(sv, LoopStep):
            return sv
        if isinstance(sv, Continue):
            params = ctx.head.parameters
            state: list[SV] = []
            for param, arg in zip(params, sv.args):
                state.extend(self._to_slots(arg, param.abstract, f"the loop @{ctx.head.name}",
                                            ctx.head.loc, 0))
            typed = tuple(_typed(s, t) for s, t in zip(state, ctx.state_types))
            return LoopStep(Known(True), typed, _rebuild(ctx.result_type, iter(ctx.result_in)))
        return LoopStep(Known(False), tuple(Leaf(v) for v in ctx.state_in), sv)

    # -- structured loops: scan and fori_loop as a counted Loop ------------------------------
    def _structured_loop(self, frame: Frame, node: CNode, prim: Primitive, args: list[SV]) -> None:
        """``scan``/``fori_loop`` as a :class:`LoopOp` whose state is ``(i, carry...,
        ys...)``: each step reads row ``i`` of ``xs`` (``gather``), walks the body
        once, writes ``y`` into row ``i`` of the stacked buffers (``scatter_nd``), and
        goes on while ``i + 1 < n``.  The Loop runs its body once before testing, so
        the step sits in an ``If`` on ``i < n``: a loop of zero steps passes its state
        through (the initial carry, empty stacked outputs)."""
        loc, what, outer = node.loc, _describe(node), frame.block
        scan = prim is loops.scan
        if scan:
            fn, init = args[0], args[1]
            xs = args[2] if len(args) > 2 else Known(None)
            xs_t: Any = node.inputs[3].abstract if len(args) > 2 else ANone()
            if not isinstance(node.abstract, ATuple):
                raise ExportError(f"internal: {what} has no type", loc)
            carry_t, ys_t = node.abstract.items
        else:
            lo, hi, fn, init = args
            carry_t, ys_t, xs, xs_t = node.abstract, ANone(), Known(None), ANone()
        if not isinstance(fn, FlatClosure):
            raise ExportError(f"{what}: its body is {_kind_text(fn)}; a loop exports when its "
                              "body is a function of the program", loc)
        i64 = AScalar("i64")
        carry_types = self._slots(carry_t, fn.graph, f"the carry of {what}", 0)
        body = Block(parent=outer)
        i_in = Value(self.names.take("i"), i64, body)
        carry_in = [Value(self.names.take("carry"), t, body) for t in carry_types]
        xs_leaves = [self._operand(sv, what, loc) for sv in self._to_slots(xs, xs_t, what, loc, 0)]
        xs_types = self._slots(xs_t, fn.graph, f"the xs of {what}", 0)
        ys_types = self._slots(ys_t, fn.graph, f"the ys of {what}", 0)
        # The trip count and the first index.
        if scan:
            length = prim.bound_attrs(node.attrs)["length"]
            count: Operand = Const(length) if length is not None else self._leading_dim(
                xs_leaves, xs_types, outer, loc, what)
            start: Operand = Const(0)
        else:
            start = self._operand(_typed(lo, i64), what, loc)
            count = self._operand(_typed(hi, i64), what, loc)
        buffers: list[Operand] = []
        for t in ys_types:
            assert isinstance(t, ATensor) and t.shape is not None
            shape = tuple(count if k == 0 else self._dim_operand(d, what, loc)
                          for k, d in enumerate(t.shape))
            buffers.append(self._emit(tensor.zeros, (shape, Const(t.dtype)), t, outer, loc, "ys"))
        ys_in = [Value(self.names.take("ys"), t, body) for t in ys_types]
        body.params = [i_in, *carry_in, *ys_in]
        guard = self._emit(arith.lt, (i_in, count), AScalar("bool"), body, loc, "in_range")
        work, keep = Block(parent=body), Block(parent=body)
        keep.results = [*carry_in, *ys_in]
        index: Operand = i_in
        if scan and prim.bound_attrs(node.attrs)["reverse"]:
            last = self._emit(arith.sub, (count, Const(1)), i64, body, loc, "last")
            index = self._emit(arith.sub, (last, i_in), i64, body, loc, "index")
        x_values = [self._emit(indexing.gather, (leaf, index), _row_type(t), work, loc, "x",
                               {"axis": 0}) for leaf, t in zip(xs_leaves, xs_types)]
        x_sv = _rebuild(_row_abstract(xs_t), iter(x_values))
        carry_sv = _rebuild(carry_t, iter(carry_in))
        call_args = [carry_sv, x_sv] if scan else [Leaf(i_in), carry_sv]
        first: list[Operand] = [start]
        init_slots = self._to_slots(init_of(scan, args), carry_t, what, loc, 0)
        first += [self._operand(_typed(sv, t), what, loc) for sv, t in zip(init_slots, carry_types)]

        def done(value: SV) -> None:
            frame.values[node] = value

        def finish(sv: SV) -> None:
            if scan:
                items = _tuple_items(sv)
                if items is None or len(items) != 2:
                    raise ExportError(f"{what}: the body returns {_kind_text(sv)}, not a pair", loc)
                carry_out, y = items
            else:
                carry_out, y = sv, Known(None)
            new_carry = [self._operand(_typed(s, t), what, loc)
                         for s, t in zip(self._to_slots(carry_out, carry_t, what, loc, 0), carry_types)]
            y_leaves = self._to_slots(y, _row_abstract(ys_t), what, loc, 0)
            position = self._emit(tensor.reshape, (index, Const((1, 1))), ATensor("i64", (1, 1)),
                                  work, loc, "row")
            new_ys: list[Operand] = []
            for buf, y_sv, t in zip(ys_in, y_leaves, ys_types):
                row = self._operand(_typed(y_sv, _row_type(t)), what, loc)
                update = self._emit(shaping.unsqueeze, (row,), ATensor(t.dtype, (1, *t.shape[1:]))
                                    if isinstance(t, ATensor) and t.shape else t, work, loc, "y",
                                    {"axis": 0})
                new_ys.append(self._emit(indexing.scatter_nd, (buf, position, update), t, work,
                                         loc, "ys"))
            step = self._emit(arith.add, (i_in, Const(1)), i64, body, loc, "i")
            flag = self._emit(arith.lt, (step, count), AScalar("bool"), body, loc, "more")
            work.results = [*new_carry, *new_ys]
            stepped = [Value(self.names.take(v.name), v.type, body) for v in [*carry_in, *ys_in]]
            body.ops.append(IfOp(guard, work, keep, tuple(stepped), loc))
            body.results = [flag, step, *stepped]
            outs = [Value(self.names.take(v.name), v.type, outer) for v in body.params]
            outer.ops.append(LoopOp(tuple([*first, *buffers]), body, tuple(outs), loc))
            carry_value = _rebuild(carry_t, iter(outs[1:1 + len(carry_in)]))
            if scan:
                done(Tup((carry_value, _rebuild(ys_t, iter(outs[1 + len(carry_in):])))))
            else:
                done(carry_value)

        self._call(fn, call_args, work, None, node, finish)

    def _leading_dim(self, leaves: list[Operand], types: list[AbstractValue], block: Block,
                     loc: Optional[Location], what: str) -> Operand:
        """The number of rows of ``xs``: a constant, or a ``dim`` op when symbolic."""
        for leaf, t in zip(leaves, types):
            if isinstance(t, ATensor) and t.shape:
                first = t.shape[0]
                if isinstance(first, int):
                    return Const(first)
                return self._emit(DIM, (leaf, Const(0)), AScalar("i64"), block, loc, "steps")
        raise ExportError(f"{what}: no tensor in xs gives the number of steps", loc)

    def _dim_operand(self, dim: Any, what: str, loc: Optional[Location]) -> Operand:
        if isinstance(dim, int):
            return Const(dim)
        raise ExportError(f"{what}: y has the dimension {dim}, known only at run time; an exported "
                          "scan needs the shape of y (beyond the steps) known", loc)

    # -- merging what branches give -------------------------------------------------------
    def _merge(self, svs: list[SV], blocks: list[Block], outer: Block, tail: Optional[LoopContext],
               loc: Optional[Location], hint: str) -> tuple[SV, list[Value]]:
        """One symbolic value for the results of ``blocks`` (one per branch): what differs
        leaves the branches as yields of each block, and the new values are returned."""
        values: list[Value] = []
        merger = _Merger(self, blocks, outer, tail, loc, hint, values)
        return merger.merge(svs, 0), values

    # -- primitives -------------------------------------------------------------------
    def apply(self, call: PrimCall) -> SV:
        """The symbolic value of a primitive call: structural, folded, or a flat op."""
        call = self.bind(call)
        rule = STRUCTURAL.get(call.prim)
        if rule is not None:
            return rule(self, call)
        return self.emit_call(call)

    def bind(self, call: PrimCall) -> PrimCall:
        """``call`` with its attributes bound: the arguments that stand for positional
        attributes (``sum(x, 1)``) moved into them, every default filled in."""
        prim = call.prim
        if not prim.attrs:
            if call.attrs:
                raise ExportError(f"{call.what}: {prim.name} takes no attributes", call.loc)
            return call
        inputs = prim.input_count(len(call.args))
        positional = []
        for name, sv in zip(prim.positional_attrs, call.args[inputs:]):
            if not isinstance(sv, Known):
                raise ExportError(f"{call.what}: the {name} of {prim.name} must be a constant to "
                                  "export (it is known only at run time)", call.loc)
            positional.append(sv.value)
        try:
            attrs = prim.bound_attrs(call.attrs, positional)
        except AnfirError as err:
            raise ExportError(f"{call.what}: {err.message}", call.loc) from None
        return replace(call, args=call.args[:inputs], attrs=attrs)

    def emit_call(self, call: PrimCall) -> SV:
        """Fold ``call`` when its arguments are known, else write it as an op."""
        call = self.bind(call)
        folded = self._fold(call)
        if folded is not None:
            return folded
        operands = tuple(self._operand(a, call.what, call.loc, static_ok=True) for a in call.args)
        result_type = self._result_type(call)
        if isinstance(result_type, ATuple):
            # A primitive returning a flat tuple (split, topk): one op with a result per item.
            values = tuple(Value(self.names.take(sanitize(call.hint)), _widen(item), call.block)
                           for item in result_type.items)
            call.block.ops.append(Op(call.prim, operands, values, call.loc, dict(call.attrs or {})))
            return Tup(tuple(Leaf(v) for v in values))
        return Leaf(self._emit(call.prim, operands, result_type, call.block, call.loc, call.hint,
                               call.attrs))

    def _fold(self, call: PrimCall) -> Optional[SV]:
        """``call`` evaluated at export time when every argument is known (and it may be folded)."""
        if not call.prim.foldable or not all(isinstance(a, Known) for a in call.args):
            return None
        values = [a.value for a in call.args if isinstance(a, Known)]
        if any(isinstance(v, (FuncGraph, Primitive, MetaFunction)) for v in values):
            return None
        try:
            result = call.prim.impl(*values, **call.attrs)
        except Exception:  # noqa: BLE001 - an op that fails at export time fails at run time too
            return None
        result_type = _widen(call.type) if isinstance(call.type, AScalar) else None
        return Known(result, result_type)

    def _result_type(self, call: PrimCall) -> AbstractValue:
        """The flat type of ``call``'s result: the node's type, else the primitive's rule."""
        if call.type is not None and is_value_type(call.type):
            return _widen(call.type)
        if call.type is not None and _flat_tuple_type(call.type):
            return call.type
        infer = call.prim.infer
        try:
            if infer is None:
                raise ExportError(f"{call.prim.name} has no type rule")
            result = infer(*[_abstract_of_sv(a) for a in call.args], **call.attrs)
        except AnfirError as err:
            raise ExportError(f"{call.what}: cannot type {call.prim.name} here ({err.message})",
                              call.loc) from None
        if _flat_tuple_type(result):
            return result
        if not is_value_type(result):
            raise ExportError(f"{call.what}: {call.prim.name} gives {result} here, not a tensor",
                              call.loc)
        return _widen(result)

    def _emit(self, prim: Primitive, operands: tuple[Operand, ...], result_type: AbstractValue,
              block: Block, loc: Optional[Location], hint: str,
              attrs: Optional[dict[str, Any]] = None) -> Value:
        """Append ``prim(*operands)`` (with ``attrs``) to ``block``; return its result."""
        value = Value(self.names.take(sanitize(hint)), result_type, block)
        block.ops.append(Op(prim, operands, (value,), loc, dict(attrs or {})))
        return value

    def emit(self, prim: Primitive, args: Sequence[SV], block: Block, loc: Optional[Location],
             what: str, result_type: Optional[AbstractValue] = None) -> SV:
        """``prim(*args)`` made by the walker itself (folded when the arguments are known)."""
        call = PrimCall(prim, list(args), block, loc, result_type, prim.name, what)
        return self.emit_call(call)

    def _operand(self, sv: SV, what: str, loc: Optional[Location], static_ok: bool = True,
                 depth: int = 0) -> Operand:
        """``sv`` as an operand of a flat op (a value, a constant, a tuple of operands)."""
        self._depth(depth, loc)
        if isinstance(sv, Leaf):
            return sv.value
        if isinstance(sv, Known):
            if isinstance(sv.value, (FuncGraph, Primitive, MetaFunction, GradEnv)):
                raise ExportError(f"{what} uses {_kind_text(sv)} as data", loc)
            return Const(sv.value, sv.type)
        if isinstance(sv, Tup) and static_ok:
            return tuple(self._operand(item, what, loc, static_ok, depth + 1) for item in sv.items)
        if sv is ABSENT:
            raise ExportError(f"internal: an unfilled slot in {what}", loc)
        raise ExportError(f"{what} uses {_kind_text(sv)} where the exported program needs "
                          "a tensor", loc)

    def _depth(self, depth: int, loc: Optional[Location]) -> None:
        """Refuse values that nest deeper than :data:`MAX_NESTING`."""
        if depth > MAX_NESTING:
            raise ExportError(f"a value nests tuples more than {MAX_NESTING} deep; the exporter "
                              "takes values apart up to that depth", loc)

    # -- selecting between values (data switch) -----------------------------------------------
    def select(self, cond: SV, a: SV, b: SV, block: Block, loc: Optional[Location], what: str,
               depth: int = 0) -> SV:
        """``a if cond else b`` for data already computed (``switch`` not followed by a call)."""
        self._depth(depth, loc)
        if isinstance(cond, Known):
            return a if cond.value else b
        if a is b or (isinstance(a, Known) and isinstance(b, Known) and _same_known(a, b)):
            return a
        ta, tb = _tuple_items(a), _tuple_items(b)
        if ta is not None and tb is not None and len(ta) == len(tb):
            return Tup(tuple(self.select(cond, x, y, block, loc, what, depth + 1)
                             for x, y in zip(ta, tb)))
        if _is_function(a) and _is_function(b):
            assert isinstance(cond, Leaf)
            return self.switch_functions(cond.value, a, b, block, loc, what)
        ea, eb = _as_env(a), _as_env(b)
        if ea is not None and eb is not None:
            return self._select_env(cond, ea, eb, block, loc, what, depth)
        if _is_leaflike(a) and _is_leaflike(b):
            t = join_types([_type_of(a), _type_of(b)])
            operands = (self._operand(cond, what, loc), self._operand(a, what, loc),
                        self._operand(b, what, loc))
            value = self._emit(structure.switch, operands, t, block, loc, "select")
            value.maybe_undefined = any(isinstance(x, Leaf) and x.value.maybe_undefined
                                        for x in (a, b))
            return Leaf(value)
        raise ExportError(f"{what} chooses between {_kind_text(a)} and {_kind_text(b)}", loc)

    def _select_env(self, cond: SV, a: Env, b: Env, block: Block, loc: Optional[Location],
                    what: str, depth: int) -> Env:
        """``cond ? a : b`` of two environments, key by key (a key in one only is flagged)."""
        entries: dict[Any, Entry] = {}
        negated: list[SV] = []

        def not_cond() -> SV:
            if not negated:
                negated.append(self.emit(arith.logical_not, [cond], block, loc, what))
            return negated[0]

        for key in [*a.entries, *[k for k in b.entries if k not in a.entries]]:
            x, y = a.entries.get(key), b.entries.get(key)
            if x is not None and y is not None:
                value = self.select(cond, x.value, y.value, block, loc, what, depth + 1)
                if x.flag is None and y.flag is None:
                    entries[key] = Entry(value)
                else:
                    flags = [f if f is not None else Known(True) for f in (x.flag, y.flag)]
                    entries[key] = Entry(value, self.select(cond, flags[0], flags[1], block, loc,
                                                            what, depth + 1))
            elif x is not None:
                entries[key] = Entry(x.value, self._and(x.flag, cond, block, loc, what))
            elif y is not None:
                entries[key] = Entry(y.value, self._and(y.flag, not_cond(), block, loc, what))
        return Env(entries)

    def _and(self, flag: Optional[SV], cond: SV, block: Block, loc: Optional[Location],
             what: str) -> SV:
        """``flag and cond`` (just ``cond`` when there is no flag)."""
        if flag is None:
            return cond
        return self.emit(arith.logical_and, [flag, cond], block, loc, what)

    def switch_functions(self, cond: Value, a: SV, b: SV, block: Block, loc: Optional[Location],
                         what: str) -> SV:
        """``switch(cond, a, b)`` of two function values: a union, tagged by ``cond``."""
        if not isinstance(a, FnUnion) and not isinstance(b, FnUnion):
            return FnUnion(CondTag(cond), (a, b))
        opts_a, tag_a = _as_options(a)
        opts_b, tag_b = _as_options(b)
        index_a = self.tag_index(tag_a, block, loc, what)
        index_b = self.tag_index(tag_b, block, loc, what)
        shifted = self.emit(arith.add, [index_b, Known(len(opts_a))], block, loc, what,
                            AScalar("i64"))
        tag = self.select(Leaf(cond), index_a, shifted, block, loc, what)
        return FnUnion(tag, (*opts_a, *opts_b))

    def tag_index(self, tag: Any, block: Block, loc: Optional[Location], what: str) -> SV:
        """A union's tag as an i64 index (a :class:`CondTag` becomes ``cond ? 0 : 1``;
        None — a single function — is 0)."""
        if tag is None:
            return Known(0)
        if isinstance(tag, CondTag):
            return self.select(Leaf(tag.cond), Known(0), Known(1), block, loc, what)
        assert isinstance(tag, SV)
        return tag

    def remap_tag(self, tag: Any, mapping: list[int], block: Block, loc: Optional[Location],
                  what: str) -> SV:
        """The index ``mapping[tag]`` (the options renumbered after a merge)."""
        if isinstance(tag, CondTag):
            return self.select(Leaf(tag.cond), Known(mapping[0]), Known(mapping[1]), block, loc,
                               what)
        if isinstance(tag, Known):
            return Known(mapping[int(tag.value)])
        assert isinstance(tag, SV)
        if mapping == list(range(len(mapping))):
            return tag
        result: SV = Known(mapping[-1])
        for i in range(len(mapping) - 2, -1, -1):
            test = self.emit(arith.eq, [tag, Known(i)], block, loc, what, AScalar("bool"))
            result = self.select(test, Known(mapping[i]), result, block, loc, what)
        return result


@dataclass(eq=False)
class _Merger:
    """Merges the symbolic values that the branches of one ``If`` give (see :meth:`Walker._merge`)."""

    walker: Walker
    blocks: list[Block]
    outer: Block
    tail: Optional[LoopContext]
    loc: Optional[Location]
    hint: str
    values: list[Value]

    def merge(self, svs: list[SV], depth: int) -> SV:
        """One symbolic value for ``svs`` (one per branch; ABSENT where a branch has none)."""
        walker = self.walker
        walker._depth(depth, self.loc)
        present = [s for s in svs if s is not ABSENT]
        if not present:
            return ABSENT
        if self.tail is not None and any(isinstance(s, (Continue, LoopStep)) for s in present):
            steps = [walker._as_step(s, self.tail) if s is not ABSENT else None for s in svs]
            flag = self.merge([s.flag if s else ABSENT for s in steps], depth + 1)
            width = len(next(s for s in steps if s is not None).state)
            state = tuple(self.merge([s.state[k] if s else ABSENT for s in steps], depth + 1)
                          for k in range(width))
            result = self.merge([s.result if s else ABSENT for s in steps], depth + 1)
            return LoopStep(flag, state, result)
        first = present[0]
        if all(s is first for s in present) and _visible(first, self.outer, depth):
            return first
        if all(isinstance(s, Known) for s in present) and all(
                _same_known(s, first) for s in present):  # type: ignore[arg-type]
            return first
        if all(_is_leaflike(s) for s in present):
            return self._leaf(svs)
        items = [_tuple_items(s) for s in present]
        if all(i is not None for i in items):
            width = len(items[0] or ())
            if all(len(i or ()) == width for i in items):
                columns = [_tuple_items(s) if s is not ABSENT else None for s in svs]
                return Tup(tuple(self.merge([c[k] if c is not None else ABSENT for c in columns],
                                            depth + 1) for k in range(width)))
        if all(_is_function(s) for s in present):
            return self._functions(svs, depth)
        if all(_as_env(s) is not None for s in present):
            return self._envs(svs, depth)
        kinds = sorted({_kind_text(s) for s in present})
        raise ExportError(f"the branches of this `if` give values of different kinds "
                          f"({', '.join(kinds)}), which no exported value can hold", self.loc)

    def _leaf(self, svs: list[SV]) -> SV:
        """Leaves of the branches: one result of the If, each branch yielding its own."""
        types = [_type_of(s) for s in svs if s is not ABSENT]
        t = join_types(types)
        undefined = any(s is ABSENT or isinstance(s, Leaf) and s.value.maybe_undefined for s in svs)
        value = Value(self.walker.names.take(sanitize(self.hint)), t, self.outer, undefined)
        for block, s in zip(self.blocks, svs):
            if s is ABSENT:
                block.results.append(Undefined(t))
            elif isinstance(s, Leaf):
                block.results.append(s.value)
            else:
                assert isinstance(s, Known)
                block.results.append(Const(s.value, _retype(s.value, t)))
        self.values.append(value)
        return Leaf(value)

    def _functions(self, svs: list[SV], depth: int) -> SV:
        """Functions of the branches: the union of their options, tagged."""
        walker = self.walker
        sides = [_as_options(s) if s is not ABSENT else None for s in svs]
        keys: dict[Any, int] = {}
        side_keys: list[Optional[list[Any]]] = []
        for side in sides:
            if side is None:
                side_keys.append(None)
                continue
            seen: Counter = Counter()
            mine = []
            for option in side[0]:
                key = _option_key(option)
                mine.append((key, seen[key]))
                seen[key] += 1
            for k in mine:
                keys.setdefault(k, len(keys))
            side_keys.append(mine)
        merged: list[SV] = []
        for key in keys:
            column: list[SV] = []
            for side, owned in zip(sides, side_keys):
                if side is None or owned is None or key not in owned:
                    column.append(ABSENT)
                else:
                    column.append(side[0][owned.index(key)])
            merged.append(self._option(column, depth + 1))
        if len(merged) == 1:
            return merged[0]
        tags: list[SV] = []
        for block, side, owned in zip(self.blocks, sides, side_keys):
            if side is None or owned is None:
                tags.append(ABSENT)
            elif side[1] is None:
                tags.append(Known(keys[owned[0]]))
            else:
                tags.append(walker.remap_tag(side[1], [keys[k] for k in owned], block, self.loc,
                                             "a merged function value"))
        return FnUnion(self.merge(tags, depth + 1), tuple(merged))

    def _option(self, column: list[SV], depth: int) -> SV:
        """One option of a merged union: the same closure (or primitive) from each side."""
        present = [s for s in column if s is not ABSENT]
        first = present[0]
        if isinstance(first, PrimValue):
            return first
        if isinstance(first, PartialValue):
            fn = self.merge([s.fn if isinstance(s, PartialValue) else ABSENT for s in column], depth)
            args = tuple(self.merge([s.args[k] if isinstance(s, PartialValue) else ABSENT
                                     for s in column], depth) for k in range(len(first.args)))
            return PartialValue(fn, args)
        assert isinstance(first, FlatClosure)
        captured = {node: self.merge([s.captured[node] if isinstance(s, FlatClosure) else ABSENT
                                      for s in column], depth)
                    for node in first.captured}
        return FlatClosure(first.graph, captured)

    def _envs(self, svs: list[SV], depth: int) -> SV:
        """Environments of the branches: keys merged, an entry flagged where a branch lacks it."""
        envs = [_as_env(s) if s is not ABSENT else None for s in svs]
        keys: dict[Any, None] = {}
        for env in envs:
            if env is not None:
                keys.update(dict.fromkeys(env.entries))
        entries: dict[Any, Entry] = {}
        for key in keys:
            got = [env.entries.get(key) if env is not None else None for env in envs]
            missing = any(env is not None and g is None for env, g in zip(envs, got))
            flagged = missing or any(g is not None and g.flag is not None for g in got)
            value = self.merge([g.value if g is not None else ABSENT for g in got], depth + 1)
            if not flagged:
                entries[key] = Entry(value)
                continue
            flags: list[SV] = []
            for env, g in zip(envs, got):
                if env is None:
                    flags.append(ABSENT)
                elif g is None:
                    flags.append(Known(False))
                else:
                    flags.append(g.flag if g.flag is not None else Known(True))
            entries[key] = Entry(value, self.merge(flags, depth + 1))
        return Env(entries)


# -- the structural rules ---------------------------------------------------------------------
def _make_tuple(w: Walker, call: PrimCall) -> SV:
    """``make_tuple(a, ...)``: a tuple of the symbolic values."""
    return Tup(tuple(call.args))


def _static_int(w: Walker, call: PrimCall, sv: SV, what: str) -> int:
    """``sv`` as an int, or an error: the walker needs this argument constant."""
    if isinstance(sv, Known) and isinstance(sv.value, (int, np.integer)) and not isinstance(sv.value, bool):
        return int(sv.value)
    raise ExportError(f"{call.what}: {what} must be a constant to export", call.loc)


def _tuple_getitem(w: Walker, call: PrimCall) -> SV:
    """``t[i]`` with a constant ``i``: the item itself."""
    t, i = call.args
    index = _static_int(w, call, i, "a tuple index")
    items = _tuple_items(t)
    if items is None:
        raise ExportError(f"{call.what} indexes {_kind_text(t)}", call.loc)
    return items[index]


def _len(w: Walker, call: PrimCall) -> SV:
    """``len(t)``: a constant."""
    items = _tuple_items(call.args[0])
    if items is None:
        raise ExportError(f"{call.what}: len of {_kind_text(call.args[0])}", call.loc)
    return Known(len(items))


def _switch(w: Walker, call: PrimCall) -> SV:
    """``switch(c, a, b)``: the chosen value when ``c`` is known, else a select (or a union of functions)."""
    c, a, b = call.args
    if isinstance(c, Known):
        return a if c.value else b
    return w.select(c, a, b, call.block, call.loc, call.what)


def _partial(w: Walker, call: PrimCall) -> SV:
    """``partial(f, a...)``: a partial application, called like ``f(a..., more...)``."""
    return PartialValue(call.args[0], tuple(call.args[1:]))


def _identity(w: Walker, call: PrimCall) -> SV:
    """``identity(x)`` / ``stop_gradient(x)``: ``x``."""
    return call.args[0]


def _j(w: Walker, call: PrimCall) -> SV:
    """``J(x)`` of data is ``x``; of a function it is a transform the ad phase left (an error)."""
    if _is_function(call.args[0]):
        raise ExportError(f"{call.what}: J of a function was left by the optimizer (a gradient "
                          "the ad phase could not expand statically)", call.loc)
    return call.args[0]


def _zeros_like(w: Walker, call: PrimCall) -> SV:
    """``zeros_like(x)``: zeros of tensors, tuples of zeros, an empty environment for functions."""
    return _zeros_of(w, call, call.args[0], 0)


def _zeros_of(w: Walker, call: PrimCall, sv: SV, depth: int) -> SV:
    """The zero gradient of one symbolic value (tuples item by item)."""
    w._depth(depth, call.loc)
    items = _tuple_items(sv)
    if items is not None:
        return Tup(tuple(_zeros_of(w, call, item, depth + 1) for item in items))
    if _is_function(sv) or isinstance(sv, Env):
        return Env({})
    if isinstance(sv, Known):
        if isinstance(sv.value, (str, type(None))):
            return Known(None)
        return Known(zeros_like_value(sv.value), sv.type)
    if isinstance(sv, Leaf) and isinstance(sv.value.type, AString):
        return Known(None)
    sub = PrimCall(call.prim, [sv], call.block, call.loc, None, call.hint, call.what, call.attrs)
    return w.emit_call(sub)


def _gadd(w: Walker, call: PrimCall) -> SV:
    """``gadd(a, b)``: gradients added (tensors, tuples item by item, environments key by key)."""
    return _gadd_of(w, call, call.args[0], call.args[1], 0)


def _gadd_of(w: Walker, call: PrimCall, a: SV, b: SV, depth: int) -> SV:
    """The sum of two gradients of one value (see :func:`_gadd`)."""
    w._depth(depth, call.loc)
    if isinstance(a, Known) and a.value is None:
        return b
    if isinstance(b, Known) and b.value is None:
        return a
    ea, eb = _as_env(a), _as_env(b)
    if ea is not None or eb is not None or _is_function(a) or _is_function(b):
        ea = ea if ea is not None else Env({})
        eb = eb if eb is not None else Env({})
        entries = dict(ea.entries)
        for key, y in eb.entries.items():
            x = entries.get(key)
            if x is None:
                entries[key] = y
            elif x.flag is None and y.flag is None:
                entries[key] = Entry(_gadd_of(w, call, x.value, y.value, depth + 1))
            else:
                raise ExportError(f"{call.what}: adding gradient environments whose entries "
                                  "depend on branches is not supported by the exporter", call.loc)
        return Env(entries)
    ta, tb = _tuple_items(a), _tuple_items(b)
    if ta is not None and tb is not None:
        return Tup(tuple(_gadd_of(w, call, x, y, depth + 1) for x, y in zip(ta, tb)))
    node_type = call.type if depth == 0 and ta is None else None
    sub = PrimCall(call.prim, [a, b], call.block, call.loc, node_type, call.hint, call.what,
                   call.attrs)
    return w.emit_call(sub)


def _newenv(w: Walker, call: PrimCall) -> SV:
    """``newenv()``: an empty gradient environment."""
    return Env({})


def _env_setitem(w: Walker, call: PrimCall) -> SV:
    """``env_setitem(env, key, g)``: the environment with ``key`` bound (keys are constants)."""
    env, key, value = call.args
    found = _as_env(env) if not _is_function(env) else Env({})
    if found is None or not isinstance(key, Known):
        raise ExportError(f"{call.what}: a gradient environment with a key known only at "
                          "run time", call.loc)
    entries = dict(found.entries)
    entries[key.value] = Entry(value)
    return Env(entries)


def _env_getitem(w: Walker, call: PrimCall) -> SV:
    """``env_getitem(env, key, default)``: the entry, the default, or a select when the entry depends on a branch."""
    env, key, default = call.args
    found = _as_env(env) if not _is_function(env) else Env({})
    if found is None or not isinstance(key, Known):
        raise ExportError(f"{call.what}: a gradient environment with a key known only at "
                          "run time", call.loc)
    entry = found.entries.get(key.value)
    if entry is None:
        return default
    if entry.flag is None:
        return entry.value
    return w.select(entry.flag, entry.value, default, call.block, call.loc, call.what)


def _tuple_setitem(w: Walker, call: PrimCall) -> SV:
    """``tuple_setitem(t, i, v)``: the tuple with item ``i`` replaced."""
    t, i, v = call.args
    items = _tuple_items(t)
    if items is None:
        raise ExportError(f"{call.what} sets an item of {_kind_text(t)}", call.loc)
    index = _static_int(w, call, i, "a tuple index")
    new = list(items)
    new[index] = v
    return Tup(tuple(new))


def _invert_permutation(w: Walker, call: PrimCall) -> SV:
    """``invert_permutation(p)`` of a constant permutation."""
    perm = call.args[0]
    if isinstance(perm, Known):
        return Known(gradient.invert_permutation.impl(perm.value))
    items = _tuple_items(perm)
    if items is not None:
        known = [i.value for i in items if isinstance(i, Known)]
        if len(known) == len(items):
            return Known(gradient.invert_permutation.impl(tuple(known)))
    raise ExportError(f"{call.what}: a permutation known only at run time", call.loc)


def _shape(w: Walker, call: PrimCall) -> SV:
    """``shape(x)``: constants for known dimensions, a ``dim`` op for symbolic ones."""
    x = call.args[0]
    if isinstance(x, Known):
        return Known(tensor.shape.impl(x.value))
    if not isinstance(x, Leaf):
        raise ExportError(f"{call.what}: the shape of {_kind_text(x)}", call.loc)
    t = x.value.type
    if not isinstance(t, ATensor):
        return Known(())
    if t.shape is None:
        raise ExportError(f"{call.what}: the shape of a tensor of unknown rank ({t})", call.loc)
    dims: list[SV] = []
    for axis, dim in enumerate(t.shape):
        if isinstance(dim, int):
            dims.append(Known(dim))
        else:
            dims.append(Leaf(w._emit(DIM, (x.value, Const(axis)), AScalar("i64"), call.block,
                                     call.loc, "dim")))
    return Tup(tuple(dims))


def _size(w: Walker, call: PrimCall) -> SV:
    """``size(x)``: a constant when the shape is known, else an op."""
    x = call.args[0]
    if isinstance(x, Leaf):
        t = x.value.type
        if not isinstance(t, ATensor):
            return Known(1)
        if t.shape is not None and all(isinstance(d, int) for d in t.shape):
            return Known(int(np.prod(t.shape, dtype=np.int64)))
    return w.emit_call(call)


def _grad_arg_check(w: Walker, call: PrimCall) -> SV:
    """``grad_arg_check(x, g)``: ``g`` (inference has checked ``x``'s type)."""
    return call.args[1]


def _grad_seed(w: Walker, call: PrimCall) -> SV:
    """``grad_seed(v)``: 1 of ``v``'s float type, a constant."""
    v = call.args[0]
    if isinstance(v, Known):
        return Known(gradient.grad_seed_value(v.value), v.type)
    if isinstance(v, Leaf) and isinstance(v.value.type, AScalar) and is_float(v.value.type.dtype):
        return Known(1.0, AScalar(v.value.type.dtype))
    raise ExportError(f"{call.what}: grad needs a float scalar output, not {_kind_text(v)}",
                      call.loc)


def _passes_gradients(w: Walker, call: PrimCall) -> SV:
    """sum_to / broadcast_like / cast_like: gradients that are not tensors pass unchanged."""
    g = call.args[0]
    if _as_env(g) is not None or _is_function(g) or _tuple_items(g) is not None or (
            isinstance(g, Known) and g.value is None):
        return g
    return w.emit_call(call)


def _tangent_dot(w: Walker, call: PrimCall) -> SV:
    """``tangent_dot(a, b)``: the sum over leaf pairs of ``sum(x * y)``."""
    pairs: list[tuple[SV, SV]] = []
    _pair_leaves(w, call, call.args[0], call.args[1], pairs, 0)
    result_type = _widen(call.type) if isinstance(call.type, AScalar) else AScalar("f64")
    total: Optional[SV] = None
    for x, y in pairs:
        sub = PrimCall(call.prim, [x, y], call.block, call.loc, result_type, call.hint, call.what)
        term = w.emit_call(sub)
        total = term if total is None else w.emit(arith.add, [total, term], call.block, call.loc,
                                                   call.what, result_type)
    return total if total is not None else Known(0.0, result_type)


def _pair_leaves(w: Walker, call: PrimCall, a: SV, b: SV, out: list[tuple[SV, SV]],
                 depth: int) -> None:
    """The tensor leaves of two values of one tuple structure, paired (None and environments skipped)."""
    w._depth(depth, call.loc)
    ta, tb = _tuple_items(a), _tuple_items(b)
    if ta is not None and tb is not None:
        for x, y in zip(ta, tb):
            _pair_leaves(w, call, x, y, out, depth + 1)
        return
    if any(isinstance(v, Known) and v.value is None or _as_env(v) is not None for v in (a, b)):
        return
    out.append((a, b))


def _tangent_scale(w: Walker, call: PrimCall) -> SV:
    """``tangent_scale(a, s)``: every tensor leaf of ``a`` times ``s``."""
    return _scale_leaves(w, call, call.args[0], call.args[1], 0)


def _scale_leaves(w: Walker, call: PrimCall, a: SV, s: SV, depth: int) -> SV:
    """The leaves of ``a`` times ``s`` (see :func:`_tangent_scale`)."""
    w._depth(depth, call.loc)
    items = _tuple_items(a)
    if items is not None:
        return Tup(tuple(_scale_leaves(w, call, x, s, depth + 1) for x in items))
    if isinstance(a, Known) and a.value is None or _as_env(a) is not None:
        return a
    return w.emit(arith.mul, [a, s], call.block, call.loc, call.what)


STRUCTURAL: dict[Primitive, StructuralRule] = {
    structure.make_tuple: _make_tuple,
    structure.tuple_getitem: _tuple_getitem,
    structure.len_: _len,
    structure.switch: _switch,
    structure.partial: _partial,
    structure.identity: _identity,
    structure.stop_gradient: _identity,
    structure.zeros_like: _zeros_like,
    tensor.shape: _shape,
    gradient.J: _j,
    gradient.newenv: _newenv,
    gradient.env_setitem: _env_setitem,
    gradient.env_getitem: _env_getitem,
    gradient.gadd: _gadd,
    gradient.tuple_setitem: _tuple_setitem,
    gradient.invert_permutation: _invert_permutation,
    gradient.size: _size,
    gradient.grad_arg_check: _grad_arg_check,
    gradient.grad_seed: _grad_seed,
    gradient.sum_to: _passes_gradients,
    gradient.broadcast_like: _passes_gradients,
    gradient.cast_like: _passes_gradients,
    gradient.tangent_dot: _tangent_dot,
    gradient.tangent_scale: _tangent_scale,
    # x, once ``after`` is computed: the order it imposes is the graph's, which the walk keeps
    checkpointing.remat_barrier: _identity,
}
"""The primitives the walker handles itself (tuples, closures, environments...),
keyed by the primitive object.  Some of them still write a flat op for tensors
(``zeros_like`` of a tensor, ``gadd`` of two tensors, ``switch`` between two
computed values); see :data:`WALKER_ONLY` for those that never do."""

WALKER_ONLY: frozenset[Primitive] = frozenset({
    structure.make_tuple, structure.tuple_getitem, structure.len_, structure.partial,
    structure.identity, structure.stop_gradient, tensor.shape, gradient.J, gradient.newenv,
    gradient.env_setitem, gradient.env_getitem, gradient.tuple_setitem,
    gradient.invert_permutation, gradient.grad_arg_check, gradient.grad_seed,
    gradient.tangent_scale, checkpointing.remat_barrier,
})
"""The primitives that never reach a target's rule table (the walker takes them apart)."""

STRUCTURAL.update({loops.custom_vjp: _identity, loops.custom_jvp: _identity})
"""``custom_vjp(f, ...)`` is ``f`` (the ``ad`` phase has used the rule; ``identity`` reads argument 0)."""
WALKER_ONLY = WALKER_ONLY | {loops.scan, loops.fori_loop, loops.custom_vjp, loops.custom_jvp}
"""``scan``/``fori_loop`` become Loops in the walk (:meth:`Walker._structured_loop`)."""


# -- helpers ------------------------------------------------------------------------
def flatten_program(graph: FuncGraph) -> FlatProgram:
    """The optimized ``graph`` (what ``anfir.compile`` returns) as a flat program.

    Raises :class:`~anfir.errors.ExportError`, located at the node, for what a
    first-order target cannot express.
    """
    program = Walker(graph).program()
    prune(program)
    selects_for_trivial_ifs(program)
    return program


def selects_for_trivial_ifs(program: FlatProgram) -> int:
    """An ``If`` whose branches compute nothing (each yields constants or outer
    values: the tag of a backpropagator chosen by ``if``) becomes one ``switch``
    op per result, which a target writes as a select.  Returns how many went."""
    count = 0
    stack = [program.body]
    while stack:
        block = stack.pop()
        ops: list[Any] = []
        for statement in block.ops:
            if (isinstance(statement, IfOp) and not statement.then_block.ops
                    and not statement.else_block.ops
                    and not any(isinstance(o, Undefined) for o in
                                [*statement.then_block.results, *statement.else_block.results])):
                for value, a, b in zip(statement.results, statement.then_block.results,
                                       statement.else_block.results):
                    ops.append(Op(structure.switch, (statement.cond, a, b), (value,), statement.loc))
                count += 1
                continue
            ops.append(statement)
            if isinstance(statement, IfOp):
                stack += [statement.then_block, statement.else_block]
            elif isinstance(statement, LoopOp):
                stack.append(statement.body)
        block.ops = ops
    return count


def join_types(types: Sequence[AbstractValue]) -> AbstractValue:
    """The type of a value that is one of ``types`` (dimensions that differ are unknown)."""
    dtypes = list(dict.fromkeys(dtype_of_type(t) for t in types))
    if len(dtypes) == 1:
        dtype = dtypes[0]
    elif "str" in dtypes:
        raise ExportError(f"a value is a string in one branch and a number in another ({dtypes})")
    else:
        dtype = dtype_name(np.result_type(*[numpy_dtype(d) for d in dtypes])) or "f64"
    if dtype == "str":
        return AString()
    shapes = [t.shape if isinstance(t, ATensor) else () for t in types]
    if all(s == () for s in shapes) and not any(isinstance(t, ATensor) for t in types):
        return AScalar(dtype)
    if any(s is None for s in shapes) or len({len(s) for s in shapes if s is not None}) != 1:
        return ATensor(dtype, None)
    first = shapes[0]
    assert first is not None
    dims = []
    for k, dim in enumerate(first):
        same = all(s is not None and dims_equal(s[k], dim) for s in shapes)
        dims.append(dim if same else UNKNOWN_DIM)
    return ATensor(dtype, tuple(dims))


def _cycles(manager: Manager) -> dict[FuncGraph, frozenset[FuncGraph]]:
    """Each graph on a cycle of graph references → the graphs of its cycle (Tarjan, iterative)."""
    graphs = sorted(manager.graphs, key=lambda g: g.seq)
    index: dict[FuncGraph, int] = {}
    low: dict[FuncGraph, int] = {}
    on_stack: set[FuncGraph] = set()
    stack: list[FuncGraph] = []
    result: dict[FuncGraph, frozenset[FuncGraph]] = {}
    counter = 0

    def successors(g: FuncGraph) -> list[FuncGraph]:
        return sorted((h for h in manager.graphs_used.get(g, ()) if h in manager.graphs),
                      key=lambda h: h.seq)

    for root in graphs:
        if root in index:
            continue
        work: list[tuple[FuncGraph, int]] = [(root, 0)]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            g, i = work[-1]
            succ = successors(g)
            if i < len(succ):
                work[-1] = (g, i + 1)
                h = succ[i]
                if h not in index:
                    index[h] = low[h] = counter
                    counter += 1
                    stack.append(h)
                    on_stack.add(h)
                    work.append((h, 0))
                elif h in on_stack:
                    low[g] = min(low[g], index[h])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[g])
            if low[g] == index[g]:
                members = []
                while True:
                    h = stack.pop()
                    on_stack.discard(h)
                    members.append(h)
                    if h is g:
                        break
                cyclic = len(members) > 1 or g in manager.graphs_used.get(g, ())
                if cyclic:
                    group = frozenset(members)
                    for h in members:
                        result[h] = group
    return result


def _flat_tuple_type(t: Any) -> bool:
    """Whether ``t`` is a non-empty tuple of tensors (the results of a multi-result op)."""
    return isinstance(t, ATuple) and bool(t.items) and all(isinstance(i, ATensor) for i in t.items)


def _widen(t: Any) -> AbstractValue:
    """A flat value's type: the abstract with its constant value forgotten."""
    if isinstance(t, AScalar):
        return AScalar(t.dtype)
    if isinstance(t, AString):
        return AString()
    assert isinstance(t, AbstractValue)
    return t


def _is_constant_abstract(a: Any) -> bool:
    """Whether the abstract value is a known constant (it takes no slot in a loop)."""
    return isinstance(a, AScalar) and a.value is not UNKNOWN or (
        isinstance(a, AString) and a.value is not UNKNOWN)


def init_of(scan: bool, args: list[SV]) -> SV:
    """The initial carry of a ``scan`` (argument 1) or ``fori_loop`` (argument 3) call."""
    return args[1] if scan else args[3]


def _row_type(t: AbstractValue) -> AbstractValue:
    """The type of one row of a stacked tensor (a number for a vector)."""
    if isinstance(t, ATensor) and t.shape:
        return AScalar(t.dtype) if len(t.shape) == 1 else ATensor(t.dtype, t.shape[1:])
    return t


def _row_abstract(a: Any) -> Any:
    """``a`` with each tensor leaf cut to one row."""
    if isinstance(a, ATuple):
        return ATuple(tuple(_row_abstract(item) for item in a.items))
    return _row_type(a)


def _rebuild(abstract: Any, leaves: Any) -> SV:
    """A symbolic value of ``abstract``'s structure made of the values ``leaves`` gives."""
    if isinstance(abstract, ATuple):
        return Tup(tuple(_rebuild(item, leaves) for item in abstract.items))
    if isinstance(abstract, ANone):
        return Known(None)
    if _is_constant_abstract(abstract):
        return Known(abstract.value, _widen(abstract))
    return Leaf(next(leaves))


def _typed(sv: SV, t: AbstractValue) -> SV:
    """A known scalar given the type of the slot it fills."""
    if isinstance(sv, Known) and not isinstance(sv.value, (tuple, np.ndarray)):
        return Known(sv.value, _retype(sv.value, t))
    return sv


def _retype(value: Any, t: AbstractValue) -> Optional[AbstractValue]:
    """The type a constant is written with in a slot of type ``t`` (its own shape, ``t``'s dtype)."""
    dtype = dtype_of_type(t)
    if dtype == "str":
        return AString()
    if isinstance(value, np.ndarray):
        return ATensor(dtype, tuple(int(d) for d in value.shape))
    return AScalar(dtype)


def _tuple_items(sv: SV) -> Optional[tuple[SV, ...]]:
    """The items of a tuple (a known tuple's items as known values), else None."""
    if isinstance(sv, Tup):
        return sv.items
    if isinstance(sv, Known) and isinstance(sv.value, tuple):
        return tuple(Known(v) for v in sv.value)
    return None


def _is_function(sv: SV) -> bool:
    """Whether ``sv`` is a function value."""
    return isinstance(sv, (FlatClosure, PrimValue, PartialValue, FnUnion))


def _is_leaflike(sv: SV) -> bool:
    """Whether ``sv`` is one tensor: a flat value or a known number, string or array."""
    if isinstance(sv, Leaf):
        return True
    if isinstance(sv, Known):
        v = sv.value
        return isinstance(v, (bool, int, float, str, np.ndarray, np.generic)) and not isinstance(
            v, SymbolicKey)
    return False


def _as_env(sv: SV) -> Optional[Env]:
    """``sv`` as a gradient environment (a constant GradEnv too), else None."""
    if isinstance(sv, Env):
        return sv
    if isinstance(sv, Known) and isinstance(sv.value, GradEnv):
        return Env({key: Entry(Known(v)) for key, v in sv.value.items()})
    return None


def _as_options(sv: SV) -> tuple[tuple[SV, ...], Any]:
    """A function value's options and tag (a single function: itself, tag None)."""
    if isinstance(sv, FnUnion):
        return sv.options, sv.tag
    return (sv,), None


def _option_key(sv: SV) -> Any:
    """What identifies an option of a union across branches: its graph, primitive or partial."""
    if isinstance(sv, FlatClosure):
        return ("graph", sv.graph.seq)
    if isinstance(sv, PrimValue):
        return ("prim", sv.prim.name)
    if isinstance(sv, PartialValue):
        return ("partial", _option_key(sv.fn), len(sv.args))
    raise ExportError(f"internal: {_kind_text(sv)} as a function option")


def _same_known(a: Known, b: Known) -> bool:
    """Whether two known values are the same constant of the same type."""
    x, y = a.value, b.value
    if type(x) is not type(y):
        return False
    if isinstance(x, np.ndarray):
        return bool(x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y))
    try:
        same = bool(x == y)
    except Exception:  # noqa: BLE001 - values that do not compare are different
        return False
    ta, tb = a.type, b.type
    return same and (ta is None and tb is None or ta == tb)


def _visible(sv: SV, block: Block, depth: int) -> bool:
    """Whether every tensor ``sv`` holds is visible in ``block``."""
    if depth > MAX_NESTING:
        return False
    if isinstance(sv, Leaf):
        return block.sees(sv.value)
    if isinstance(sv, Tup):
        return all(_visible(i, block, depth + 1) for i in sv.items)
    if isinstance(sv, FlatClosure):
        return all(_visible(v, block, depth + 1) for v in sv.captured.values())
    if isinstance(sv, PartialValue):
        return _visible(sv.fn, block, depth + 1) and all(_visible(a, block, depth + 1)
                                                         for a in sv.args)
    if isinstance(sv, FnUnion):
        tag = sv.tag
        ok = block.sees(tag.cond) if isinstance(tag, CondTag) else _visible(tag, block, depth + 1)
        return ok and all(_visible(o, block, depth + 1) for o in sv.options)
    if isinstance(sv, Env):
        return all(_visible(e.value, block, depth + 1)
                   and (e.flag is None or _visible(e.flag, block, depth + 1))
                   for e in sv.entries.values())
    return isinstance(sv, (Known, PrimValue))


def _type_of(sv: SV) -> AbstractValue:
    """The flat type of a leaf-like symbolic value."""
    if isinstance(sv, Leaf):
        return sv.value.type
    assert isinstance(sv, Known)
    if sv.type is not None:
        if isinstance(sv.value, np.ndarray):
            return _retype(sv.value, sv.type) or sv.type
        return sv.type
    return _widen(abstract_of_value(sv.value))


def _abstract_of_sv(sv: SV) -> AbstractValue:
    """The abstract value a type rule sees for ``sv``."""
    if isinstance(sv, Leaf):
        return sv.value.type
    if isinstance(sv, Known):
        if sv.type is not None and not isinstance(sv.value, (tuple, np.ndarray)):
            return AScalar(dtype_of_type(sv.type), sv.value) if isinstance(sv.type, AScalar) \
                else sv.type
        return abstract_of_value(sv.value)
    if isinstance(sv, Tup):
        return ATuple(tuple(_abstract_of_sv(i) for i in sv.items))
    if isinstance(sv, Env):
        return AEnv()
    raise ExportError(f"internal: no abstract value for {_kind_text(sv)}")


def _kind_text(sv: Any) -> str:
    """How messages call a symbolic value (``a function (@f)``, ``a tuple``...)."""
    if isinstance(sv, FlatClosure):
        return f"a function (@{sv.graph.name})"
    if isinstance(sv, FnUnion):
        return "a function chosen at run time"
    if isinstance(sv, (PrimValue, PartialValue)):
        return "a function"
    if isinstance(sv, Env):
        return "a gradient environment"
    if isinstance(sv, Tup):
        return "a tuple"
    if isinstance(sv, Leaf):
        return f"a tensor {sv.value.type}"
    if isinstance(sv, Known):
        if isinstance(sv.value, GradEnv):
            return "a gradient environment"
        if isinstance(sv.value, MetaFunction):
            return f"the meta function {sv.value.name}"
        return f"the constant {sv.value!r}"
    if isinstance(sv, (Continue, LoopStep)):
        return "a loop step"
    return "a value"


_HINT_CHARS = {"▸": "fwd_", "◂": "bwd_", "✓": "then_", "✗": "else_", "∇": "grad_", "%": ""}
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def sanitize(text: str) -> str:
    """``text`` as an ASCII identifier for names in the exported model."""
    for char, replacement in _HINT_CHARS.items():
        text = text.replace(char, replacement)
    text = _UNSAFE.sub("_", text).strip("_")
    return text or "t"


def _hint(node: CNode, default: str) -> str:
    """A name for a node's results: its source name, else ``default``."""
    return sanitize(node.name or default)


def _describe(node: CNode) -> str:
    """How messages name a node: ``the call of @loop in @✓loop``, ``tanh(...) in @f``."""
    head = node.inputs[0] if node.inputs else None
    graph = node.graph.name if node.graph is not None else "?"
    if isinstance(head, ValueNode):
        value = head.value
        if isinstance(value, FuncGraph):
            return f"the call of @{value.name} in @{graph}"
        name = getattr(value, "name", None)
        if name is not None:
            return f"`{name}(...)` in @{graph}"
    label = f" {node.name}" if node.name else ""
    return f"the call{label} in @{graph}"


def _describe_graph_output(graph: FuncGraph) -> str:
    """How messages name a graph's result."""
    return f"the result of @{graph.name}"


__all__ = [
    "ABSENT", "FlatClosure", "Continue", "Env", "FnUnion", "Known", "Leaf", "LoopStep", "MAX_NESTING",
    "PrimCall", "STRUCTURAL", "SV", "Tup", "UNKNOWN_DIM", "WALKER_ONLY", "Walker", "flatten_program",
    "join_types", "sanitize",
]

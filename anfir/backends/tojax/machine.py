"""The machine that traces a FuncGraph into JAX operations.

It runs the program the way the evaluator does (:mod:`anfir.eval`) — graphs
walked in :func:`~anfir.ir.walk.toposort` order, closures capturing values,
``partial``, ``grad`` expanded with the graph the autodiff generates, a call in
tail position replacing its frame, non-tail calls pushed on an explicit frame
stack — but on JAX values (:mod:`anfir.backends.tojax.traced`), inside a JAX
trace.  What it meets decides what JAX sees:

* a primitive whose arguments are all known is evaluated on the spot with its
  own ``impl`` (constant folding); otherwise its rule (:data:`~anfir.backends.tojax.rules.RULES`)
  emits JAX operations;
* ``switch`` on a known condition picks an arm; on a traced one it selects
  (``jnp.where``) or, for functions, makes an :class:`~anfir.backends.tojax.traced.Either`;
  calling an Either is a ``lax.cond`` (:meth:`Machine.cond`);
* a loop (tail recursion) whose decisions are known unrolls, one iteration after
  another in the same frame, so ``jax.grad`` passes through it; when a decision
  is traced, the iteration that reaches the loop's head again returns a
  :class:`~anfir.backends.tojax.traced.Continue` and the frame that runs the head
  turns the loop into ``lax.while_loop`` (:meth:`Machine.while_loop`);
* non-tail recursion under a traced condition is refused
  (:class:`~anfir.backends.tojax.errors.TracedRecursionError`): a traced
  condition cannot bound how deep a trace-time recursion goes.

Recursion of Python: the machine's own loop never recurses on the program.
A ``lax.cond`` branch and a ``lax.while_loop`` body are traced by a nested
machine (JAX traces them as Python functions), so Python's stack grows with the
*nesting* of traced conditions and loops in the program text — one level per
``if`` or loop inside another, a few frames each — never with the length of a
program, the depth of a concrete recursion or the number of iterations.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import jaxpr_as_fun

from anfir.errors import AnfirError, AnfirTypeError, ArityError, IRConsistencyError
from anfir.eval.vm import attach_location, locate
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager, manage
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.ir.walk import toposort
from anfir.backends.tojax.errors import LoweringError, TracedRecursionError
from anfir.backends.tojax.rules import (FUNCTION_ARGUMENTS, STRUCTURAL, UNMAPPED, concrete_bool,
                                        rule_for)
from anfir.backends.tojax.traced import (ABSENT, Continue, Either, Slot, conform, contains_array,
                                         flatten, is_array, items_of, select, static_equal,
                                         unflatten, widen)
from anfir.primitives import structure
from anfir.runtime_values import Closure, GradEnv, Partial

RECURSION_LIMIT = 4
"""How many times a graph may be re-entered under traced conditions before the
machine takes it for recursion on traced values and refuses it.  A graph that
calls itself (not in tail position) under a traced ``if`` would otherwise be
traced forever; a higher-order function called again inside a traced branch
(re-entered once or twice) is not recursion and passes."""

LOOP_TYPING_ROUNDS = 8
"""How many times a loop's state may widen (a constant becoming traced, an int
becoming a float) before the machine gives up on typing it."""


# -- plans: a graph ready to run --------------------------------------------------------
class Plan:
    """A graph's calls in dependency order, and what a frame of it needs."""

    __slots__ = ("graph", "manager", "epoch", "params", "fvs", "calls", "output", "__weakref__")

    def __init__(self, graph: FuncGraph, manager: Manager) -> None:
        self.graph = graph
        self.manager = manager
        self.epoch = manager.epoch
        self.params = list(graph.parameters)
        self.fvs = list(manager.free_variables_total(graph))
        if not graph.has_output:
            raise IRConsistencyError(f"graph @{graph.name} has no output", graph.loc)
        self.calls = [n for n in toposort(graph, manager) if isinstance(n, CNode) and n.graph is graph]
        self.output = graph.output


_PLANS: "weakref.WeakKeyDictionary[FuncGraph, Plan]" = weakref.WeakKeyDictionary()


def plan_for(graph: FuncGraph) -> Plan:
    """``graph``'s plan, from the cache while the graph is unchanged (the manager's
    epoch moves on every edit); a graph no manager tracks is managed, as the
    evaluator does."""
    plan = _PLANS.get(graph)
    manager = graph.manager
    if plan is not None and plan.manager is manager and manager is not None and plan.epoch == manager.epoch:
        return plan
    plan = Plan(graph, manager or manage(graph))
    _PLANS[graph] = plan
    return plan


@dataclass(eq=False)
class Frame:
    """One call being evaluated."""

    plan: Plan
    regs: dict[Node, Any]
    """Values of the parameters, captured nodes and computed calls."""
    dest: Optional[CNode]
    """The call in the caller whose value this frame computes (None at the base)."""
    chain: dict[FuncGraph, None]
    """The graphs this frame has run, a tail call after another: the heads a
    loop can come back to."""
    pc: int = 0


_MISSING = object()


def _graph_and_env(fn: Any) -> tuple[FuncGraph, tuple[Any, ...]]:
    if isinstance(fn, Closure):
        return fn.graph, fn.env
    return fn, ()


class Machine:
    """Runs graphs on JAX values; one per traced region (the top level, a branch
    of a ``lax.cond``, the body of a ``lax.while_loop``).

    ``targets`` are the loop heads of enclosing frames: a call in tail position
    of this machine's first frame to one of them is that loop's next iteration
    (a :class:`Continue` handed back).  ``active`` counts, per graph, the frames
    of enclosing machines running it (re-entering one is recursion through a
    traced condition).
    """

    def __init__(self, targets: frozenset[FuncGraph] = frozenset(),
                 active: Optional[dict[FuncGraph, int]] = None) -> None:
        self.targets = targets
        self.active: dict[FuncGraph, int] = dict(active or {})
        self.stack: list[Frame] = []

    # -- the main loop --------------------------------------------------------------------
    def run(self, fn: Any, args: tuple[Any, ...], entry_may_continue: bool = True) -> Any:
        """``fn(*args)``.  With ``entry_may_continue``, ``fn`` itself being a target
        gives a :class:`Continue` at once (a ``lax.cond`` branch); a loop body
        starts *in* its head instead."""
        stack = self.stack
        pending: Optional[tuple[Any, tuple[Any, ...], Optional[CNode], bool]] = (fn, args, None, True)
        first = not entry_may_continue
        while True:
            if pending is not None:
                callee, call_args, node, tail = pending
                pending = None
                while isinstance(callee, Partial):
                    call_args = (*callee.args, *call_args)
                    callee = callee.fn
                if isinstance(callee, (FuncGraph, Closure)):
                    graph, env = _graph_and_env(callee)
                    base = len(stack) <= 1
                    if tail and base and not first and graph in self.targets:
                        value: Any = Continue(graph, callee, call_args)
                    else:
                        first = False
                        frame = self._frame(graph, env, call_args, node)
                        if tail and stack:
                            top = stack[-1]
                            top.plan, top.regs, top.pc = frame.plan, frame.regs, 0
                            top.chain[graph] = None
                        else:
                            stack.append(frame)
                        continue
                elif isinstance(callee, Primitive):
                    value = self.apply(callee, call_args, node)
                elif isinstance(callee, MetaFunction):
                    if not callee.accepts(len(call_args)):
                        raise self._located(ArityError(
                            f"{callee.name} takes {callee.arity_words()}, got {len(call_args)}"), node)
                    if callee.generate is None:
                        raise self._located(AnfirError(f"{callee.name} cannot be evaluated directly"), node)
                    pending = (callee.generate(call_args), call_args, node, tail)
                    continue
                elif isinstance(callee, Either):
                    targets: frozenset[FuncGraph] = frozenset()
                    if tail and stack:
                        targets = frozenset(stack[-1].chain)
                        if len(stack) == 1:
                            targets |= self.targets
                    value = self.cond(callee, call_args, targets, node)
                else:
                    raise self._located(AnfirTypeError(f"calling a non-function ({_describe(callee)})"), node)
                first = False
                if not stack:
                    return value
                if not tail:
                    assert node is not None
                    stack[-1].regs[node] = value
                    continue
                done, pending = self._finish(value)
                if done:
                    return pending
                continue
            frame = stack[-1]
            calls = frame.plan.calls
            if frame.pc < len(calls):
                node = calls[frame.pc]
                frame.pc += 1
                inputs = node.inputs
                if not inputs:
                    raise IRConsistencyError(f"a call with no callee in @{frame.plan.graph.name}", node.loc)
                pending = (self.value(frame, inputs[0], node),
                           tuple(self.value(frame, i, node) for i in inputs[1:]),
                           node, node is frame.plan.output)
                continue
            done, pending = self._finish(self.value(frame, frame.plan.output, None))
            if done:
                return pending

    def _finish(self, value: Any) -> tuple[bool, Any]:
        """The top frame returns ``value``.  ``(True, result)`` when the machine is
        done; ``(False, pending call)`` to go on (``pending`` None: the caller got it)."""
        stack = self.stack
        frame = stack[-1]
        # The first frame's Continues to the enclosing machines' heads are theirs.
        outer = self.targets if len(stack) == 1 else frozenset()
        while True:
            if isinstance(value, Continue) and value.target in frame.chain and value.target not in outer:
                # Every way through the iteration comes back to the head: the loop
                # goes on at trace time, in this frame.
                return False, (value.fn, value.args, frame.dest, True)
            heads = [g for g in _continue_targets(value) if g in frame.chain and g not in outer]
            if not heads:
                break
            head = max(heads, key=list(frame.chain).index)
            stack.pop()
            try:
                exits = frozenset(list(frame.chain)[:list(frame.chain).index(head) + 1])
                if not stack:
                    exits |= self.targets
                value = self.while_loop(head, value, exits, frame.dest)
            finally:
                stack.append(frame)
        stack.pop()
        if not stack:
            return True, value
        assert frame.dest is not None
        stack[-1].regs[frame.dest] = value
        return False, None

    # -- frames and values -----------------------------------------------------------------
    def _frame(self, graph: FuncGraph, env: tuple[Any, ...], args: tuple[Any, ...],
               node: Optional[CNode]) -> Frame:
        plan = plan_for(graph)
        if len(args) != len(plan.params):
            words = "1 argument" if len(plan.params) == 1 else f"{len(plan.params)} arguments"
            raise self._located(ArityError(f"@{graph.name} takes {words}, got {len(args)}"), node)
        if len(env) != len(plan.fvs):
            raise self._located(AnfirError(
                f"@{graph.name} captures {len(plan.fvs)} values but was called with {len(env)}"), node)
        if self.active.get(graph, 0) >= RECURSION_LIMIT:
            raise self._located(TracedRecursionError(
                f"@{graph.name} calls itself under a condition on traced values: a jitted "
                "program cannot recurse to a depth decided at run time",
                hint="make the argument that bounds the recursion static "
                     "(jax.jit(fn, static_argnums=...)), or write the recursion as a loop "
                     "(a call in tail position), which becomes lax.while_loop"), node)
        regs: dict[Node, Any] = dict(zip(plan.params, args))
        regs.update(zip(plan.fvs, env))
        return Frame(plan, regs, node, {graph: None})

    def value(self, frame: Frame, node: Node, user: Optional[CNode]) -> Any:
        """The value of ``node`` in ``frame`` (constants, closures made here)."""
        value = frame.regs.get(node, _MISSING)
        if value is not _MISSING:
            return value
        if isinstance(node, ValueNode):
            constant = node.value
            if isinstance(constant, FuncGraph):
                fvs = plan_for(constant).fvs
                if fvs:
                    return Closure(constant, tuple(self.value(frame, fv, user) for fv in fvs))
            return constant
        raise IRConsistencyError(
            f"@{frame.plan.graph.name} uses {node!r}, which it neither computes nor captures",
            node.loc or (user.loc if user is not None else None))

    def _located(self, error: AnfirError, node: Optional[Node]) -> AnfirError:
        if error.loc is None:
            attach_location(error, node)
        return error

    def _active_now(self, skip_top: bool = False) -> dict[FuncGraph, int]:
        counts = dict(self.active)
        frames = self.stack[:-1] if skip_top else self.stack
        for frame in frames:
            graph = frame.plan.graph
            counts[graph] = counts.get(graph, 0) + 1
        return counts

    # -- primitives ------------------------------------------------------------------------
    def apply(self, prim: Primitive, args: tuple[Any, ...], node: Optional[CNode]) -> Any:
        """``prim(*args)``: its own evaluation on known arguments, its JAX rule otherwise."""
        if not prim.accepts(len(args)):
            raise self._located(ArityError(
                f"{prim.name} takes {prim.arity_words()}, got {len(args)}"), node)
        for index, arg in enumerate(args):
            if isinstance(arg, Either) and prim not in _HOLD_EITHER:
                # Applied to both possibilities, the results blended by the condition.
                when_a = self.apply(prim, (*args[:index], arg.a, *args[index + 1:]), node)
                when_b = self.apply(prim, (*args[:index], arg.b, *args[index + 1:]), node)
                return select(arg.cond, when_a, when_b)
        # A call's attributes (sum(x, axis=1)) are keyword arguments of impl and rule alike.
        attrs = node.attrs if node is not None else {}
        try:
            if prim not in STRUCTURAL and not any(contains_array(a) for a in args):
                return prim.impl(*args, **attrs)
            rule = rule_for(prim)
            if prim in FUNCTION_ARGUMENTS:  # a loop body: traced by a machine of its own
                args = tuple(self._callable(a) if _is_function(a) else a for a in args)
            if rule is None:
                reason = UNMAPPED.get(prim, "no rule in anfir/backends/tojax/rules.py")
                raise LoweringError(f"{prim.name} has no JAX rule: {reason}")
            return rule(*args, **attrs)
        except AnfirError as exc:
            raise self._located(exc, node)
        except Exception as exc:
            if isinstance(exc, jax.errors.JAXTypeError) or type(exc).__module__.startswith("jax"):
                raise self._located(LoweringError(f"{prim.name}: {exc}"), node) from exc
            raise locate(exc, node) from exc

    def _callable(self, fn: Any) -> Callable[..., Any]:
        """``fn`` as a Python function JAX can trace (a loop body)."""
        active = self._active_now()
        return lambda *args: Machine(frozenset(), active).run(fn, args)

    # -- lax.cond -----------------------------------------------------------------------------
    def cond(self, either: Either, args: tuple[Any, ...], targets: frozenset[FuncGraph],
             node: Optional[CNode]) -> Any:
        """Call ``either`` on ``args``: a ``lax.cond`` on its condition between
        calling its two sides, each traced by a machine of its own.  Results of
        the same structure come out of the cond as they are; different ones
        both come out (zeros on the side not taken) and are blended by
        :func:`select`."""
        known = concrete_bool(either.cond)
        if known is not None:
            return self.run_nested(either.a if known else either.b, args, targets, True)
        active = self._active_now()
        side_a = _trace(lambda: Machine(targets, active).run(either.a, args))
        side_b = _trace(lambda: Machine(targets, active).run(either.b, args))
        if not side_a.arrays and not side_b.arrays:
            return select(either.cond, side_a.skeleton, side_b.skeleton)
        fa, fb = jaxpr_as_fun(side_a.jaxpr), jaxpr_as_fun(side_b.jaxpr)
        if _same_structure(side_a.skeleton, side_b.skeleton):
            dtypes = [jnp.promote_types(x.dtype, y.dtype) for x, y in zip(side_a.arrays, side_b.arrays)]

            def cast(outs: list[Any]) -> list[Any]:
                return [lax.convert_element_type(o, d) for o, d in zip(outs, dtypes)]

            outs = lax.cond(either.cond, lambda: cast(fa()), lambda: cast(fb()))
            return unflatten(side_a.skeleton, outs)
        zeros_a = [jnp.zeros(s.shape, s.dtype) for s in side_a.arrays]
        zeros_b = [jnp.zeros(s.shape, s.dtype) for s in side_b.arrays]
        outs = lax.cond(either.cond, lambda: [*fa(), *zeros_b], lambda: [*zeros_a, *fb()])
        count = len(side_a.arrays)
        return select(either.cond, unflatten(side_a.skeleton, outs[:count]),
                      unflatten(side_b.skeleton, outs[count:]))

    def run_nested(self, fn: Any, args: tuple[Any, ...], targets: frozenset[FuncGraph],
                   entry_may_continue: bool) -> Any:
        """``fn(*args)`` in a machine of its own (the stack of this one is busy)."""
        return Machine(targets, self._active_now()).run(fn, args, entry_may_continue)

    # -- lax.while_loop -----------------------------------------------------------------------
    def while_loop(self, head: FuncGraph, first: Any, exits: frozenset[FuncGraph],
                   node: Optional[CNode]) -> Any:
        """The rest of a loop as ``lax.while_loop``, ``first`` being what its first
        iteration returned (an :class:`Either` tree whose leaves are
        :class:`Continue` to ``head`` or results).

        The state is ``(going on?, (head's function, its arguments), result so
        far)``; one iteration is one run of the head in a machine whose
        targets are ``exits`` (a Continue to ``head`` goes round, to an outer
        head leaves as a result).  The state's type is found by running an
        iteration on it and widening until nothing changes (a constant that
        changes becomes traced, an int meeting a float a float).
        """
        active = self._active_now()
        flag, carry, result = _resolve(first, head)
        state: Any = (jnp.asarray(flag), carry, result)

        def iterate(current: Any) -> Any:
            go, (fn, args), so_far = current
            value = Machine(exits, active).run(fn, args, entry_may_continue=False)
            new_flag, new_carry, new_result = _resolve(value, head)
            return (jnp.asarray(new_flag),
                    (fn, args) if new_carry is ABSENT else new_carry,
                    so_far if new_result is ABSENT else new_result)

        for _ in range(LOOP_TYPING_ROUNDS):
            state, _ = widen(state, flatten(state)[0])  # every state leaf traced or constant
            skeleton, arrays = flatten(state)
            after: list[Any] = []

            def body(*leaves: Any) -> list[Any]:
                new = iterate(unflatten(skeleton, leaves))
                after.append(new)
                try:
                    return conform(new, skeleton)
                except ValueError:
                    return flatten(new)[1]  # not the same type yet: widen and trace again

            traced = _trace_fn(body, arrays)
            try:
                state, changed = widen(state, flatten(after[0])[0])
            except ValueError as exc:
                raise self._located(LoweringError(
                    f"the state of the loop @{head.name} changes from one iteration to the next "
                    f"({exc}): lax.while_loop needs a state of fixed type and structure",
                    hint="a loop whose trip count depends on traced values cannot grow its state; "
                         "differentiating such a loop (a closure per iteration) needs a static "
                         "trip count: make the bound static (jax.jit(fn, static_argnums=...))"),
                    node) from None
            if not changed:
                break
        else:
            raise self._located(LoweringError(
                f"the state of the loop @{head.name} does not settle to one type"), node)
        if skeleton[2] is ABSENT:
            raise self._located(LoweringError(f"the loop @{head.name} never returns"), node)
        flag_slot = skeleton[0]
        assert isinstance(flag_slot, Slot)
        step = jaxpr_as_fun(traced)
        final = lax.while_loop(lambda leaves: leaves[flag_slot.index],
                               lambda leaves: list(step(*leaves)), list(arrays))
        return unflatten(skeleton, final)[2]


def _is_function(value: Any) -> bool:
    return isinstance(value, (Closure, Partial, FuncGraph, Primitive, MetaFunction))


_HOLD_EITHER = frozenset({structure.switch, structure.make_tuple, structure.partial,
                          structure.identity, structure.zeros_like})
"""Primitives that take an Either as a value (keep it, select on it) rather than
being applied to each of its sides."""


def _describe(value: Any) -> str:
    if is_array(value):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return type(value).__name__


def _continue_targets(value: Any) -> list[FuncGraph]:
    """The loop heads the Continues among ``value``'s possibilities go back to."""
    found: list[FuncGraph] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Either):
            stack.extend((item.a, item.b))
        elif isinstance(item, Continue) and item.target not in found:
            found.append(item.target)
    return found


def _resolve(value: Any, head: FuncGraph) -> tuple[Any, Any, Any]:
    """``(going on?, (function, arguments), result)`` of one iteration's outcome:
    Continues to ``head`` go on, anything else is a result; an Either blends
    both sides' (ABSENT where a side has none)."""
    # Post-order over the Either tree, with an explicit stack.
    done: dict[int, tuple[Any, Any, Any]] = {}
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        item, ready = stack.pop()
        if isinstance(item, Either):
            if not ready:
                stack.extend([(item, True), (item.a, False), (item.b, False)])
                continue
            fa, ca, ra = done[id(item.a)]
            fb, cb, rb = done[id(item.b)]
            flag = fa if fa is fb else jnp.where(item.cond, fa, fb)
            done[id(item)] = (flag, select(item.cond, ca, cb), select(item.cond, ra, rb))
        elif isinstance(item, Continue) and item.target is head:
            done[id(item)] = (True, (item.fn, item.args), ABSENT)
        else:
            done[id(item)] = (False, ABSENT, item)
    return done[id(value)]


@dataclass
class Traced:
    """A function traced to a jaxpr: its closed jaxpr, its result's skeleton and the
    shapes of the result's arrays."""

    jaxpr: Any
    skeleton: Any
    arrays: list[Any]


def _trace(thunk: Callable[[], Any]) -> Traced:
    """Trace ``thunk()`` (which may return any value) to a jaxpr of its arrays."""
    holder: list[Any] = []

    def arrays() -> list[Any]:
        skeleton, out = flatten(thunk())
        holder.append(skeleton)
        return out

    jaxpr, shapes = jax.make_jaxpr(arrays, return_shape=True)()
    return Traced(jaxpr, holder[0], list(shapes))


def _trace_fn(fn: Callable[..., list[Any]], arrays: list[Any]) -> Any:
    return jax.make_jaxpr(fn)(*arrays)


def _same_structure(a: Any, b: Any) -> bool:
    """Whether two skeletons have the same constants and slots of the same shapes
    in the same places (slot dtypes may differ: the cond promotes them)."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if isinstance(x, Slot) or isinstance(y, Slot):
            if not (isinstance(x, Slot) and isinstance(y, Slot) and x.shape == y.shape
                    and x.index == y.index):
                return False
            continue
        from_x, from_y = items_of(x), items_of(y)
        if from_x is None or from_y is None:
            if from_x is not None or from_y is not None:
                return False
            if not static_equal(x, y):
                return False
            continue
        if type(x) is not type(y) or len(from_x) != len(from_y):
            return False
        if isinstance(x, Closure) and x.graph is not y.graph:
            return False
        if isinstance(x, Continue) and x.target is not y.target:
            return False
        if isinstance(x, GradEnv) and [k for k, _ in x.items()] != [k for k, _ in y.items()]:
            return False
        stack.extend(zip(from_x, from_y))
    return True


__all__ = ["Machine", "Plan", "RECURSION_LIMIT", "plan_for"]

"""Static expansion of ``vmap`` for the compiler (run before the specializer types).

Each call ``vmap(f, in_axes, out_axes)`` whose function is known — a graph
(a closure: the batched graph captures what ``f`` captures), or a meta call on
one (``vmap(grad(f), ...)``) — becomes the constant of its batched graph
(:meth:`anfir.autodiff.batching.Batcher.entry`), so the specializer types an
ordinary program; innermost calls are expanded by the transform itself.
A function only known at run time is left to the evaluator (compiling it is a
located error from the specializer).  ``anfir.run`` batches the same way at run time.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from anfir.autodiff.batching import CALL_RULES, Batcher, BatchingError, primitive_graph
from anfir.autodiff.jacobians import known_jacobian
from anfir.errors import AnfirError
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import manage
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.ir.walk import reachable_graphs, toposort
from anfir.primitives import meta, structure


JACOBIANS = (meta.jacfwd, meta.jacrev, meta.hessian)
"""The meta functions built from ``vmap`` and a derivative (anfir/autodiff/jacobians.py)."""

MAX_ROUNDS = 64
"""Each round expands the calls the previous one made (``hessian`` makes a
``jacrev``, which makes a ``vmap``); nesting deeper than this is left to the
evaluator (compiling it is then a located error of the specializer)."""


def expand_batching(entry: FuncGraph) -> int:
    """Expand ``jacfwd``/``jacrev``/``hessian`` and ``vmap`` calls on known functions
    in ``entry``'s reach, round by round until none is left; the count."""
    total = 0
    for _ in range(MAX_ROUNDS):
        count = expand_jacobians(entry) + expand_vmaps(entry)
        if not count:
            break
        total += count
    return total


def expand_jacobians(entry: FuncGraph) -> int:
    """Replace every ``jacfwd``/``jacrev``/``hessian`` call ``which(f, i)`` whose ``f`` and
    ``i`` are known by the graph it makes (whose ``vmap`` the next round expands); the count."""

    def make(call: CNode, consts: list[Any]) -> Optional[FuncGraph]:
        fn = _target(call, [None]) if len(consts) <= 1 else None
        if fn is None:
            return None
        which = call.inputs[0].value  # type: ignore[attr-defined]
        return known_jacobian(which, fn, consts[0] if consts else 0, call.loc)

    return _expand(entry, JACOBIANS, make)


def expand_vmaps(entry: FuncGraph) -> int:
    """Replace every ``vmap`` call on a known function in ``entry``'s reach; the count."""

    def make(call: CNode, consts: list[Any]) -> Optional[FuncGraph]:
        target = _target(call, consts)
        if target is None:
            return None
        in_axes = consts[0] if consts else 0
        out_axes = consts[1] if len(consts) > 1 else 0
        return Batcher(per_example_loops=True).entry(target, in_axes, out_axes, call.loc)

    return _expand(entry, (meta.vmap,), make)


def _expand(entry: FuncGraph, metas: tuple[MetaFunction, ...],
            make: Callable[[CNode, list[Any]], Optional[FuncGraph]]) -> int:
    """Replace each call of one of ``metas`` in ``entry``'s reach whose arguments after the
    function are constants by the graph ``make(call, constants)`` builds (None: left as
    it is); the count.  An error without a place is placed at the call."""
    manager = entry.manager or manage(entry)
    calls = []
    for graph in reachable_graphs([entry]):
        for node in toposort(graph, manager):
            if isinstance(node, CNode) and node.graph is graph and any(node.is_apply(m) for m in metas):
                calls.append(node)
    count = 0
    for call in calls:
        consts = [_constant(a) for a in call.inputs[2:]]
        if any(c is _UNKNOWN for c in consts):
            continue
        try:
            made = make(call, consts)
        except AnfirError as err:
            if err.loc is None:
                raise BatchingError(err.message, call.loc) from None
            raise
        if made is None:
            continue
        manager.replace(call, ValueNode(made, call.loc, call.name))
        count += 1
    return count


_UNKNOWN = object()


def _constant(node: Node) -> Any:
    """The value of a constant or of a tuple of constants (``(0, None)``), else _UNKNOWN."""
    if isinstance(node, ValueNode):
        return node.value
    if isinstance(node, CNode) and node.is_apply(structure.make_tuple):
        items = [_constant(a) for a in node.inputs[1:]]
        return _UNKNOWN if any(i is _UNKNOWN for i in items) else tuple(items)
    return _UNKNOWN


def _target(call: CNode, consts: list[Any]) -> Optional[FuncGraph]:
    """The graph ``vmap`` batches: the function, or a wrapper calling the meta call."""
    args = call.inputs[1:]
    if not args:
        return None
    fn = args[0]
    if isinstance(fn, ValueNode) and isinstance(fn.value, FuncGraph):
        return fn.value
    if isinstance(fn, ValueNode) and isinstance(fn.value, Primitive):
        return primitive_graph(fn.value)
    if isinstance(fn, CNode) and fn.is_apply(structure.partial) and len(fn.inputs) > 1:
        # vmap(partial(g, a...)): a wrapper taking the remaining arguments, which may
        # capture the bound ones (computed where the partial was).
        inner = fn.inputs[1]
        if isinstance(inner, ValueNode) and isinstance(inner.value, Primitive):
            inner = ValueNode(primitive_graph(inner.value), inner.loc)
        if not (isinstance(inner, ValueNode) and isinstance(inner.value, FuncGraph)):
            return None
        bound = list(fn.inputs[2:])
        wrapper = FuncGraph(f"partial_{inner.value.name}", fn.loc)
        rest = [wrapper.add_parameter(p.name or f"x{i}")
                for i, p in enumerate(inner.value.parameters[len(bound):])]
        wrapper.output = CNode(wrapper, [inner, *bound, *rest], fn.loc)
        return wrapper
    if isinstance(fn, CNode) and isinstance(fn.inputs[0], ValueNode) and \
            isinstance(fn.inputs[0].value, MetaFunction) and \
            all(isinstance(a, ValueNode) for a in fn.inputs[1:]) and len(fn.inputs) > 1:
        inner = fn.inputs[1]
        if isinstance(inner, ValueNode) and isinstance(inner.value, Primitive):
            inner = ValueNode(primitive_graph(inner.value), inner.loc)
        if not (isinstance(inner, ValueNode) and isinstance(inner.value, FuncGraph)):
            return None
        nparams = _arity(fn.inputs[0].value, inner.value, consts[0] if consts else None)
        wrapper = FuncGraph(f"{fn.inputs[0].value.name}_{inner.value.name}", fn.loc)
        params = [wrapper.add_parameter(f"x{i}") for i in range(nparams)]
        made = CNode(wrapper, [ValueNode(fn.inputs[0].value), inner,
                               *(ValueNode(a.value, a.loc) for a in fn.inputs[2:] if isinstance(a, ValueNode))],
                     fn.loc)
        wrapper.output = CNode(wrapper, [made, *params], fn.loc)
        return wrapper
    if isinstance(fn, CNode) and len(fn.inputs) > 1 and isinstance(fn.inputs[0], ValueNode) and \
            any(fn.inputs[0].value is p for p in CALL_RULES) and \
            all(isinstance(a, ValueNode) and isinstance(a.value, FuncGraph) for a in fn.inputs[1:]):
        # vmap(custom_vjp(f, fwd, bwd)): a wrapper calling the custom function, whose
        # call the batcher batches with the user's rules (batching.CALL_RULES).
        inner_graph = fn.inputs[1].value  # type: ignore[attr-defined]
        wrapper = FuncGraph(f"{fn.inputs[0].value.name}_{inner_graph.name}", fn.loc)
        params = [wrapper.add_parameter(p.name or f"x{i}")
                  for i, p in enumerate(inner_graph.parameters)]
        made = CNode(wrapper, [ValueNode(fn.inputs[0].value),
                               *(ValueNode(a.value, a.loc) for a in fn.inputs[1:]
                                 if isinstance(a, ValueNode))], fn.loc)
        wrapper.output = CNode(wrapper, [made, *params], fn.loc)
        return wrapper
    return None


def _arity(m: MetaFunction, fn: FuncGraph, in_axes: Any) -> int:
    if isinstance(in_axes, tuple):
        return len(in_axes)
    n = len(fn.parameters)
    if m is meta.jvp:
        return 2 * n
    if m in (meta.grad, meta.value_and_grad, meta.jacfwd, meta.jacrev, meta.hessian):
        return n
    raise BatchingError(f"vmap of {m.name}(...) needs in_axes as a tuple (one per argument)")


__all__ = ["expand_batching", "expand_jacobians", "expand_vmaps"]

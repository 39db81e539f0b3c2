"""Run-time side of the autodiff: ``J`` on values and the graphs behind ``grad``.

* :func:`j_value` — ``J`` applied to a run-time value: data is unchanged, a
  closure of ``h`` becomes a closure of ``▸h`` over the *same* captured
  values (``▸h`` has exactly ``h``'s free variables), a primitive becomes
  ``▸p``, a partial a J-world partial.
* :func:`grad_graph` — the graph behind ``grad(f, i...)``/``value_and_grad``:
  ``(f, i...) -> closure ∇(x...)`` that runs ``J(f)``, seeds the backward
  pass with 1.0 and picks the requested gradients.  The ``ad`` phase expands
  ``grad`` calls into it statically; the evaluator does the same at run time
  through ``MetaFunction.generate``.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from anfir.abstract.values import AFunction, GradFn, GraphFn, JFn, PartialFn, PrimFn
from anfir.errors import GradientError
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import manage
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.primitives import PRIMITIVES
from anfir.primitives.registry import MetaFunction, Primitive
from anfir.values import Closure, GradEnv, Partial

P = PRIMITIVES
_grad_graphs: dict[tuple, FuncGraph] = {}
_j_metas: dict[int, MetaFunction] = {}
_partial_calls: dict[int, MetaFunction] = {}


# -- J on values ----------------------------------------------------------------
def j_value(x: Any) -> Any:
    """The J-transform of a run-time value."""
    from anfir.autodiff.jtransform import j_graph_checked
    from anfir.autodiff.primitive_j import j_primitive_value

    if isinstance(x, Closure):
        forward = j_graph_checked(x.graph)
        return Closure(forward, _remap_env(x.graph, forward, x.env))
    if isinstance(x, FuncGraph):
        forward = j_graph_checked(x)
        if manage(forward).free_variables_total(forward):
            raise GradientError(f"cannot differentiate @{x.name} outside of its closure")
        return forward
    if isinstance(x, Primitive):
        return j_primitive_value(x)
    if isinstance(x, MetaFunction):
        return j_meta(x)
    if isinstance(x, Partial):
        return Partial(j_partial_call(len(x.args)), (j_value(x.fn), *(j_value(a) for a in x.args)))
    if isinstance(x, tuple):
        return tuple(j_value(v) for v in x)
    return x


def _remap_env(graph: FuncGraph, forward: FuncGraph, env: tuple) -> tuple:
    """Order ``env`` (captured for ``graph``) as ``forward``'s free variables expect."""
    before = manage(graph).free_variables_total(graph)
    after = manage(forward).free_variables_total(forward)
    if before == after:
        return env
    by_node = dict(zip(before, env))
    try:
        return tuple(by_node[n] for n in after)
    except KeyError:  # pragma: no cover - would be a bug in the J transform
        raise GradientError(f"internal: ▸{graph.name} captures values @{graph.name} does not") from None


def j_meta(meta: MetaFunction) -> MetaFunction:
    """``J(meta)``: generates the J-transform of the graph ``meta`` generates."""
    cached = _j_metas.get(id(meta))
    if cached is None:
        from anfir.autodiff.jtransform import j_graph

        typed = meta.generate_for_types
        cached = MetaFunction(f"J({meta.name})", f"the J-transform of {meta.name}",
                              meta.min_args, meta.max_args,
                              generate=lambda args, m=meta: j_graph(m.generate(args)), internal=True,
                              # J(J_partial_call): typable when the meta function itself is.
                              generate_for_types=None if typed is None else (
                                  lambda args, t=typed: _j_of_generated(t(args))))
        _j_metas[id(meta)] = cached
        _keepalive.append(meta)
    return cached


_keepalive: list[MetaFunction] = []


def _j_of_generated(graph: Optional[FuncGraph]) -> Optional[FuncGraph]:
    from anfir.autodiff.jtransform import j_graph

    return None if graph is None else j_graph(graph)


def j_partial_call(nbound: int) -> MetaFunction:
    """The J-world partial: calls ``f'(a..., b...)`` and regroups the gradients as
    ``((d_f, d_a...), d_b...)`` — a partial value's gradient holds those of
    what it binds."""
    cached = _partial_calls.get(nbound)
    if cached is None:
        cached = MetaFunction(f"J_partial_call{nbound}", "a J-world partial application",
                              nbound + 1, None,
                              generate=lambda args, k=nbound: _partial_call_graph(k, len(args) - 1 - k),
                              internal=True,
                              # Only the argument count matters: the specializer can type it.
                              generate_for_types=lambda args, k=nbound: _partial_call_graph(
                                  k, len(args) - 1 - k))
        _partial_calls[nbound] = cached
    return cached


def _partial_call_graph(nbound: int, nrest: int) -> FuncGraph:
    key = ("partial", nbound, nrest)
    graph = _grad_graphs.get(key)
    if graph is None:
        graph = _grad_graphs[key] = partial_call_graph(nbound, nrest)
    return graph


def j_partial_maker(fn: Node, nbound: int, static: bool,
                    shared: Optional[dict[tuple[Any, int, int], FuncGraph]] = None) -> Node:
    """What the J-world ``partial(fn, a...)`` (``nbound`` arguments bound) binds first.

    With ``static`` (the ``ad`` phase, on a typed program) and the arity of
    ``fn`` known from its constant or its type, a regrouping graph for that
    arity — a plain graph the optimizer and the printers handle; otherwise the
    meta function :func:`j_partial_call`, which makes it at run time.

    The graph is typed in place for the one signature it is called with, so it
    is fresh per ``partial`` node — except that, given ``shared`` (a cache the
    caller keeps for one compilation), the partials of one graph constant share
    it: ``fn`` is then a specialized graph, so every call of the maker has the
    signature of that graph's spec, and two such partial values have the same
    type (``ap(partial(f, p), y) + ap(partial(f, p), x)`` must type ``ap`` once).
    """
    if static:
        nparams = static_arity(fn)
        if nparams is not None and nparams >= nbound:
            graph = fn.value if isinstance(fn, ValueNode) else None
            key = (graph, nbound, nparams - nbound)
            maker = shared.get(key) if shared is not None and isinstance(graph, FuncGraph) else None
            if maker is None:
                maker = partial_call_graph(nbound, nparams - nbound)
                if shared is not None and isinstance(graph, FuncGraph):
                    shared[key] = maker
            return ValueNode(maker, fn.loc)
    return ValueNode(j_partial_call(nbound))


def static_arity(node: Node) -> Optional[int]:
    """The number of arguments of the function ``node`` stands for, when its
    constant or its abstract value says so (the same for every function it may
    be); None otherwise."""
    value = node.value if isinstance(node, ValueNode) else None
    if isinstance(value, FuncGraph):
        return len(value.parameters)
    if isinstance(value, Primitive):
        return value.min_args if value.max_args == value.min_args else None
    abstract = node.abstract
    if not isinstance(abstract, AFunction):
        return None
    arities = {atom_arity(atom) for atom in abstract.options}
    arities.discard(None)  # (an option whose arity varies takes the others' count)
    return arities.pop() if len(arities) == 1 else None


def atom_arity(atom: Any) -> Optional[int]:
    """The number of arguments a function atom takes (None if it varies or is unknown)."""
    bound = 0
    while isinstance(atom, (PartialFn, JFn, GradFn)):  # J and grad keep the arity
        if isinstance(atom, PartialFn):
            bound += len(atom.args)
        atom = atom.fn
    if isinstance(atom, GraphFn):
        return len(atom.graph.parameters) - bound
    if isinstance(atom, PrimFn):
        prim = atom.prim
        max_args = getattr(prim, "max_args", None)
        if max_args is not None and prim.min_args == max_args:
            return max_args - bound
    return None


def partial_call_graph(nbound: int, nrest: int) -> FuncGraph:
    """A new graph ``(f', a'..., b'...) -> (value, ◂)`` calling ``f'`` and regrouping
    its gradients as ``((d_f, d_a...), d_b...)`` (``nbound`` a's, ``nrest`` b's)."""
    fwd = FuncGraph(f"J_partial_call{nbound}_{nrest}")
    f = fwd.add_parameter("f")
    xs = [fwd.add_parameter(f"x{i}") for i in range(nbound + nrest)]
    t = _call(fwd, f, *xs)
    value = _item(fwd, t, 0)
    bp = _item(fwd, t, 1)
    bwd = FuncGraph(f"◂J_partial_call{nbound}_{nrest}")
    dout = bwd.add_parameter("dout")
    grads = _call(bwd, bp, dout)
    bound = CNode(bwd, [ValueNode(P["make_tuple"])] + [_item(bwd, grads, i) for i in range(nbound + 1)])
    rest = [_item(bwd, grads, nbound + 1 + i) for i in range(nrest)]
    bwd.output = CNode(bwd, [ValueNode(P["make_tuple"]), bound, *rest])
    fwd.output = CNode(fwd, [ValueNode(P["make_tuple"]), value, ValueNode(bwd)])
    return fwd


# -- grad / value_and_grad ------------------------------------------------------
def arity_of(fn: Any) -> int:
    """How many arguments the function value ``fn`` takes."""
    if isinstance(fn, Closure):
        return len(fn.graph.parameters)
    if isinstance(fn, FuncGraph):
        return len(fn.parameters)
    if isinstance(fn, Partial):
        return arity_of(fn.fn) - len(fn.args)
    if isinstance(fn, Primitive):
        if fn.max_args is not None and fn.min_args == fn.max_args:
            return fn.min_args
        raise GradientError(f"grad of {fn.name} needs a function of fixed arity; wrap it in a lambda")
    raise GradientError(f"grad needs a function, not {type(fn).__name__}")


def normalize_wrt(indices: Sequence[Any], nparams: int) -> tuple[tuple[int, ...], bool]:
    """Checked argument indices, and whether the result is a tuple (several indices)."""
    if not indices:
        return (0,), False
    result = []
    for i in indices:
        if isinstance(i, bool) or not isinstance(i, int):
            raise GradientError(f"grad's argument indices must be integer constants, not {i!r}")
        if not -nparams <= i < nparams:
            raise GradientError(f"grad w.r.t. argument {i}, but the function takes {nparams}")
        result.append(i % nparams)
    return tuple(result), len(result) > 1


def generate_grad(args: tuple, with_value: bool) -> FuncGraph:
    """The graph for a call ``grad(f, i...)`` (``value_and_grad`` with ``with_value``)."""
    if not args:
        raise GradientError("grad needs a function")
    nparams = arity_of(args[0])
    wrt, multi = normalize_wrt(args[1:], nparams)
    return grad_graph(nparams, wrt, multi, with_value, len(args) - 1)


def grad_graph(nparams: int, wrt: tuple[int, ...], multi: bool, with_value: bool,
               nindices: int) -> FuncGraph:
    """``(f, i...) -> ∇`` where the closure ``∇(x1..xn)`` computes the gradient."""
    key = (nparams, wrt, multi, with_value, nindices)
    graph = _grad_graphs.get(key)
    if graph is not None:
        return graph
    name = "value_and_grad" if with_value else "grad"
    outer = FuncGraph(name)
    f = outer.add_parameter("f")
    for i in range(nindices):
        outer.add_parameter(f"i{i}")
    inner = FuncGraph("∇")
    xs = [inner.add_parameter(f"x{i}") for i in range(nparams)]
    jf = CNode(inner, [ValueNode(P["J"]), f])
    inner.output = build_grad_body(inner, jf, xs, wrt, multi, with_value)
    outer.output = ValueNode(inner)
    _grad_graphs[key] = outer
    return outer


def build_grad_body(graph: FuncGraph, jf: Node, xs: Sequence[Node], wrt: tuple[int, ...],
                    multi: bool, with_value: bool, loc: Any = None) -> Node:
    """Nodes in ``graph`` computing the gradient of ``jf``'s function at ``xs``."""
    t = _call(graph, jf, *xs, loc=loc)
    value = _item(graph, t, 0, loc)
    bp = _item(graph, t, 1, loc)
    seed = CNode(graph, [ValueNode(P["grad_seed"]), value], loc)
    grads = _call(graph, bp, seed, loc=loc)
    picked = [CNode(graph, [ValueNode(P["grad_arg_check"]), xs[i], _item(graph, grads, 1 + i, loc)], loc)
              for i in wrt]
    result: Node = picked[0] if not multi else CNode(graph, [ValueNode(P["make_tuple"]), *picked], loc)
    if with_value:
        result = CNode(graph, [ValueNode(P["make_tuple"]), value, result], loc)
    return result


def _call(graph: FuncGraph, fn: Node, *args: Node, loc: Any = None) -> CNode:
    return CNode(graph, [fn, *args], loc)


def _item(graph: FuncGraph, t: Node, i: int, loc: Any = None) -> CNode:
    return CNode(graph, [ValueNode(P["tuple_getitem"]), t, ValueNode(i)], loc)


__all__ = ["GradEnv", "arity_of", "atom_arity", "build_grad_body", "generate_grad", "grad_graph",
           "j_meta", "j_partial_call", "j_partial_maker", "j_value", "normalize_wrt",
           "partial_call_graph", "static_arity"]

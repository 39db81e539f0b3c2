"""The ``ad`` phase: expand ``grad`` / ``value_and_grad`` calls with the J transform.

For every call ``grad(f, i...)`` in the specialized program, innermost first
(a ``grad`` inside ``f`` is expanded before ``f`` is transformed, so grad of
grad of grad works):

1. the call becomes the body of :func:`anfir.autodiff.runtime.grad_graph` —
   a closure ``∇(x...)`` that calls ``J(f)``, seeds the backward pass with
   ``1.0`` and picks the requested gradients (the same graph the evaluator
   runs when it meets ``grad`` at run time);
2. ``J(f)`` with ``f`` a known graph becomes the constant ``▸f`` built by the
   J transform (for a closure, ``▸f`` captures the same nodes, so the constant
   makes the right closure where it stands); a function only known at run
   time keeps a run-time ``J``;
3. the new graphs are typed where they are (``specialize.infer_new_graph``):
   the rest of the program is not inferred again.

Transformed graphs get readable names (``▸f`` forward, ``◂f`` backward) and
every node they contain is located at the user's node it was made from
(``# file:line:col ... (ad: ◂f)`` in the dumps).
"""

from __future__ import annotations

from typing import Any, Optional

from anfir.abstract.lattice import BOTTOM, abstract_of_value
from anfir.abstract.values import AAny, AFunction, AScalar, AString, ATensor, GradFn, GraphFn, JFn, PartialFn
from anfir.autodiff.checkpoint import checkpoint_graph
from anfir.autodiff.forward import jvp_graph
from anfir.autodiff.jtransform import JContext, check_differentiable_graph
from anfir.autodiff.partials import static_arity
from anfir.autodiff.gradgraphs import grad_graph, normalize_wrt
from anfir.dtypes import is_float
from anfir.errors import AnfirError, GradientError
from anfir.ir.clone import clone_scope, inline_call
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.walk import reachable_graphs, toposort
from anfir.passes import counted_loops, loops
from anfir.passes.specialize import infer_new_graph
from anfir.passes.validate import rebuild_manager
from anfir.primitives import checkpointing, gradient, meta as metas
from anfir.ir.primitive import MetaFunction
from anfir.passes.compile_state import Program


_GRADS = (metas.grad, metas.value_and_grad, metas.jvp)


def rewrite_counted_loops(program: "Program") -> "Program":
    """The ``loops`` phase (before ``ad``): when the program takes a derivative, each
    counted tail-recursive loop becomes a ``fori_loop``
    (:func:`anfir.passes.counted_loops.recognise_counted_loops`), so its gradient is a
    reversed scan (first-order data, which the flat exporters write).  The count
    goes to ``program.stats`` (:func:`anfir.passes.loops.rewrote_counted_loops`)."""
    manager = program.require_manager()
    calls = _meta_calls(manager)
    # A counted loop differentiated twice (grad of a function that itself takes a
    # gradient through the loop) is rewritten when it captures only data: the ``ad``
    # phase closes its body (captures ride in the carry) and the J-world loop of a
    # closed body carries tensors at every order.  One that captures a function stays
    # a recursion: the second J of its backward scan would stack gradient environments.
    if calls:
        rewritten = counted_loops.recognise_counted_loops(
            program, data_captures_only=_nested_derivatives(calls))
        if rewritten:
            program.stats[loops.COUNTED_LOOPS_STAT] += rewritten
    return program


def run(program: "Program") -> "Program":
    """Expand every ``grad``/``value_and_grad`` call of the program (innermost first).

    Counted loops were rewritten into ``fori_loop`` by the ``loops`` phase before
    (:func:`rewrite_counted_loops`)."""
    manager = program.require_manager()
    context = JContext(static=True)
    count = 0
    untyped: list[tuple[FuncGraph, Node]] = []
    calls = _meta_calls(manager)
    if calls:  # loop bodies carry their captures
        loops.run(program)
    # checkpoint(f) first: the J transform then meets a call of a flagged wrapper.
    count += _expand_checkpoints(manager, untyped)
    while True:
        calls = _meta_calls(manager)
        if not calls:
            break
        call = _innermost(calls, manager)
        _expand(manager, call, context, untyped)
        count += 1
    for nabla, fn in untyped:
        if nabla in manager.graphs and nabla.abstract is None:
            # Still alive, and never called where its arguments are typed (the gradient of
            # a built-in chosen by ``if`` and differentiated again): typed for any
            # arguments, as the specializer types a function value it cannot place.
            try:
                infer_new_graph(nabla, [AAny() for _ in nabla.parameters])
            except AnfirError:
                raise GradientError("cannot type the gradient: its arguments' types are unknown",
                                    fn.loc) from None
    count += _expand_generated_calls(manager, program.entry)
    if loops.strip_custom_rules(program):  # the rules are used: what is left calls f
        program.stats["ad: custom rules applied"] += 1
    if count:
        program.stats["ad: grad expanded"] += count
        _track_entry_only(program)
    return program


def _expand_generated_calls(manager: Manager, entry: Optional[FuncGraph]) -> int:
    """Replace each call of a meta function the autodiff made (``J(grad)`` in the
    transform of a graph that calls ``grad``, ``J`` of a built-in of varying arity)
    by a call of the graph it stands for, typed for the call's arguments.

    They come from a program built around a J-transform made before typing (what
    ``anfir.grad`` returns): the specializer typed each call as a call of the graph
    the meta function generates for these argument types, and that graph is what
    the compiled program calls.  A worklist over the graphs the entry reaches (the
    manager may also hold graphs of the user's it merged with): the new graphs are
    scanned too."""
    count = 0
    queue = reachable_graphs([entry]) if entry is not None else list(manager.graphs)
    seen: set[FuncGraph] = set()
    while queue:
        graph = queue.pop()
        if graph in seen or graph not in manager.graphs:
            continue
        seen.add(graph)
        for node in list(toposort(graph, manager)):
            head = node.inputs[0] if isinstance(node, CNode) else None
            meta = head.value if isinstance(head, ValueNode) else None
            if not isinstance(meta, MetaFunction) or any(meta is m for m in _GRADS):
                continue
            assert isinstance(node, CNode)
            sig = tuple(a.abstract for a in node.inputs[1:])
            if any(_captures(a) for a in sig):
                raise GradientError(
                    f"cannot compile {meta.name} of a closure in a graph built around a "
                    "J-transform (anfir.grad of a program whose grad differentiates a "
                    "closure): its gradient environment is keyed by nodes the compiled "
                    "program no longer has. Compile the program with the grad call in it "
                    "(def main(x) = grad(f)(x)), which is the same gradient", node.loc)
            typed = all(a is not None and not isinstance(a, AAny) for a in sig)
            made = (meta.generate_for_types(sig) if meta.generate_for_types is not None and typed
                    else None)
            if made is None and meta.generate is not None and all(
                    isinstance(a, ValueNode) for a in node.inputs[1:]):
                # In a graph left untyped (a function value the specializer only typed
                # generically): its constants still say what the call makes.
                made = meta.generate(tuple(a.value for a in node.inputs[1:]))  # type: ignore[attr-defined]
                typed = False
            if made is None:
                raise GradientError(f"cannot compile a call of {meta.name}: the function it "
                                    "transforms is only known at run time", node.loc)
            copy, _ = clone_scope(made, note=f"ad: {meta.name}")
            _locate(copy, node)
            callee = ValueNode(copy, node.loc, head.name)  # type: ignore[union-attr]
            node.set_input(0, callee)
            if typed:
                callee.abstract = AFunction(frozenset({GraphFn(copy)}))
                infer_new_graph(copy, sig)
            count += 1
            queue.extend(manager.graphs_used.get(graph, ()))
    return count


def _captures(abstract: Any) -> bool:
    """Whether a function of type ``abstract`` may be a closure (it captures values),
    or a partial application binding one."""
    stack = [abstract]
    while stack:
        a = stack.pop()
        if not isinstance(a, AFunction):
            continue
        for atom in a.options:
            while isinstance(atom, (JFn, GradFn)):
                atom = atom.fn
            if isinstance(atom, PartialFn):
                stack.append(AFunction(frozenset({atom.fn})))
                stack.extend(atom.args)
            elif isinstance(atom, GraphFn):
                graph = atom.graph
                manager = graph.manager
                if manager is not None and manager.free_variables_total(graph):
                    return True
    return False


def _track_entry_only(program: "Program") -> None:
    """Give the program a manager of exactly its entry's graphs again.

    Typing a call of a run-time ``J`` builds a ``▸g`` for the types alone; when
    ``g`` is a closure over the program, the manager made for ``▸g`` adopts the
    program's graphs (managers merge) and keeps ``▸g`` and its graphs as extra
    roots.  The program's manager object would then no longer own its graphs.
    """
    entry = program.entry
    manager = program.manager
    if entry is not None and (manager is None or entry.manager is not manager
                              or list(manager.roots) != [entry]):
        program.manager = rebuild_manager([entry])


def _nested_derivatives(calls: list[CNode]) -> bool:
    """Whether a differentiated function may reach another derivative call (an order
    above 1); a function known only at run time counts as one that may."""
    owners = {call.graph for call in calls}
    for call in calls:
        if len(call.inputs) < 2:
            continue
        fn = call.inputs[1]
        if isinstance(fn, ValueNode):
            roots = [fn.value] if isinstance(fn.value, FuncGraph) else []
        elif isinstance(fn, CNode):  # partial(g, ...) made where the call is
            head = fn.inputs[0]
            if isinstance(head, ValueNode) and isinstance(head.value, MetaFunction):
                return True  # grad(grad(f)): a derivative of a derivative
            roots = [i.value for i in fn.inputs
                     if isinstance(i, ValueNode) and isinstance(i.value, FuncGraph)]
        else:
            return True
        if any(g in owners for g in reachable_graphs(roots)):
            return True
    return False


def _meta_calls(manager: Manager) -> list[CNode]:
    found = []
    for graph in list(manager.graphs):
        for node in toposort(graph, manager):
            if isinstance(node, CNode):
                head = node.inputs[0]
                if isinstance(head, ValueNode) and any(head.value is m for m in _GRADS):
                    found.append(node)
    return found


def _innermost(calls: list[CNode], manager: Manager) -> CNode:
    """A call whose differentiated function reaches no other grad call."""
    owners = {call.graph for call in calls}
    pending: set[Node] = set(calls)
    for call in calls:
        fn = call.inputs[1] if len(call.inputs) > 1 else None
        if fn in pending:
            continue  # grad(grad(f)): the inner call becomes a known closure first
        target = _known_graph(fn) if fn is not None else None
        if target is None or owners.isdisjoint(_code_of(target, manager)):
            return call
    return calls[0]  # a grad reaching itself (recursion through grad): any order works


def _code_of(target: FuncGraph, manager: Manager) -> list[FuncGraph]:
    """The graphs whose code ``J(target)`` transforms: ``target`` and every graph it
    reaches through graph constants (nested closures, callees).

    Graphs only reached through free variables are not among them: a closure's
    enclosing graph has already computed the values it captures, so a ``grad``
    there (``grad(lambda (z) grad(lambda (y) y * z end)(z) end)``) is outside
    the inner differentiated function and must not keep it from going first.
    """
    seen: dict[FuncGraph, None] = {target: None}
    queue = [target]
    while queue:
        graph = queue.pop()
        for used in manager.graphs_used.get(graph, ()):
            if used not in seen:
                seen[used] = None
                queue.append(used)
    return list(seen)


def _known_graph(node: Node) -> Optional[FuncGraph]:
    if isinstance(node, ValueNode) and isinstance(node.value, FuncGraph):
        return node.value
    return None


def _arity(node: Node) -> int:
    arity = static_arity(node)
    if arity is not None:
        return arity
    raise GradientError("grad needs a function whose number of arguments is known at compile time",
                        node.loc)


def _fails_when_called(manager: Manager, call: CNode) -> bool:
    """Replace the calls of ``grad(f)`` that can only raise; True if no other use is left.

    The specializer types a gradient w.r.t. an integer argument as ⊥ (no value)
    instead of rejecting the program: like ``anfir.run``, which raises only if
    it gets there, the compiled program raises the located error only on the
    path that calls it.  Each such call becomes ``grad_arg_check(n, n)`` on the
    integer argument — the check that raises that error at run time — or, for a
    call that is ⊥ because an argument is, that argument (which raises first).
    """
    users = list(manager.users.get(call, {}))
    indices = [n.value for n in call.inputs[2:] if isinstance(n, ValueNode) and type(n.value) is int]
    for site, index in users:
        if not (isinstance(site, CNode) and index == 0 and site.abstract is BOTTOM):
            continue
        args = site.inputs[1:]
        failing = next((a for a in args if a.abstract is BOTTOM), None)
        if failing is None:
            wrt = [args[i] for i in (indices or [0]) if -len(args) <= i < len(args)]
            integer = next((a for a in wrt if _is_integer(a.abstract)), None)
            if integer is None:
                continue  # ⊥ for another reason: left to the expansion
            check = ValueNode(gradient.grad_arg_check, site.loc)
            check.abstract = abstract_of_value(gradient.grad_arg_check)
            failing = CNode(site.graph, [check, integer, integer], site.loc, site.name)
            failing.abstract = BOTTOM
        manager.replace(site, failing)
    return not manager.users.get(call)


def _is_integer(abstract: Any) -> bool:
    """Whether a gradient with respect to a value of type ``abstract`` is refused
    (an integer, a bool or a string)."""
    return (isinstance(abstract, (AScalar, ATensor)) and not is_float(abstract.dtype)
            or isinstance(abstract, AString))


def _expand(manager: Manager, call: CNode, context: JContext,
            untyped: list[tuple[FuncGraph, Node]]) -> None:
    meta: MetaFunction = call.inputs[0].value  # type: ignore[attr-defined]
    if meta is metas.jvp:
        _expand_jvp(manager, call, context, untyped)
        return
    if _fails_when_called(manager, call):
        return
    if len(call.inputs) < 2:
        raise GradientError(f"{meta.name} needs a function", call.loc)
    fn = call.inputs[1]
    indices = []
    for node in call.inputs[2:]:
        if not (isinstance(node, ValueNode) and type(node.value) is int):
            raise GradientError(f"{meta.name}'s argument indices must be integer constants", node.loc)
        indices.append(node.value)
    nparams = _arity(fn)
    try:
        wrt, multi = normalize_wrt(indices, nparams)
    except AnfirError as err:
        raise GradientError(err.message, call.loc) from None
    target = _known_graph(fn)
    if target is not None:
        check_differentiable_graph(target)
    template = grad_graph(nparams, wrt, multi, meta is metas.value_and_grad, len(indices))
    maker, _ = clone_scope(template, note=f"ad: {meta.name}")
    _locate(maker, call)
    expanded = CNode(call.graph, [ValueNode(maker, call.loc), *call.inputs[1:]], call.loc, call.name)
    expanded.abstract = call.abstract
    manager.replace(call, expanded)
    closure = inline_call(manager, expanded, note=f"ad: {meta.name}")
    assert isinstance(closure, ValueNode) and isinstance(closure.value, FuncGraph)
    nabla = closure.value
    nabla.name = f"∇{target.name}" if target is not None else "∇"
    _resolve_known_j(manager, nabla, context)  # J(f) itself included, when f is known
    closure.abstract = AFunction(frozenset({GraphFn(nabla)}))
    if not _type_new_graph(manager, closure, nabla, fn):
        untyped.append((nabla, fn))


def _expand_jvp(manager: Manager, call: CNode, context: JContext,
                untyped: list[tuple[FuncGraph, Node]]) -> None:
    """``jvp(f)`` → the closure of :func:`~anfir.autodiff.forward.jvp_graph`, whose
    ``grad`` call the next rounds of :func:`run` expand in turn."""
    if len(call.inputs) != 2:
        raise GradientError("jvp takes one function", call.loc)
    fn = call.inputs[1]
    target = _known_graph(fn)
    if target is not None:
        check_differentiable_graph(target)
    maker, _ = clone_scope(jvp_graph(_arity(fn)), note="ad: jvp")
    _locate(maker, call)
    expanded = CNode(call.graph, [ValueNode(maker, call.loc), fn], call.loc, call.name)
    expanded.abstract = call.abstract
    manager.replace(call, expanded)
    closure = inline_call(manager, expanded, note="ad: jvp")
    assert isinstance(closure, ValueNode) and isinstance(closure.value, FuncGraph)
    tangent = closure.value
    tangent.name = f"jvp▸{target.name}" if target is not None else "jvp▸"
    _resolve_known_j(manager, tangent, context)
    closure.abstract = AFunction(frozenset({GraphFn(tangent)}))
    if not _type_new_graph(manager, closure, tangent, fn, tangents=True):
        untyped.append((tangent, fn))


def _resolve_known_j(manager: Manager, nabla: FuncGraph, context: JContext) -> None:
    """Replace each run-time ``J(@h)`` in the code of ``nabla`` by the constant ``▸h``.

    The J transform brings a closure made outside the transformed scope in with
    a run-time ``J`` (a ``grad`` inside ``f`` over a closure that captures
    ``f``'s parameter, and the ``J(@▸h)`` the outer transform makes of it).
    At run time that ``J`` transforms the graph it is handed and keys its
    GradEnv by that graph's free variables *as they are then*; the readers of
    that GradEnv were built now, with the keys of today's nodes.  Once
    ``inline`` or the optimizer has copied ``h`` (its free variables are then
    other nodes, with other keys), the two disagree and the gradient reaching
    the captured value is silently zero.  ``▸h`` built now captures exactly
    ``h``'s free variables (see :mod:`anfir.autodiff.jtransform`), so the
    constant makes the same closure where the call stood, and its keys are
    fixed with the readers' and copied along with them.

    A worklist over the graphs reached from ``nabla``: the graphs ``▸h`` brings
    are queued in turn (their own closures over outer nodes are ``J(@...)``
    calls too); each graph is scanned once.
    """
    j_prim = gradient.J
    seen: set[FuncGraph] = set()
    queue = [nabla]
    while queue:
        graph = queue.pop()
        if graph in seen:
            continue
        seen.add(graph)
        for node in list(toposort(graph, manager)):
            if not (isinstance(node, CNode) and node.is_apply(j_prim) and len(node.inputs) == 2):
                continue
            fn = node.inputs[1]
            target = _known_graph(fn)
            if target is None:
                continue  # a value only known at run time keeps its run-time J
            # Located where the user wrote the function, as the graph constant was.
            manager.replace(node, ValueNode(context.j_graph(target), fn.loc, fn.name))
        queue.extend(g for g in manager.graphs_used.get(graph, ()) if g not in seen)


def _locate(graph: FuncGraph, call: CNode) -> None:
    """Point the generated grad wrapper's nodes at the user's ``grad`` call."""
    manager = graph.manager
    if manager is None or call.loc is None:
        return
    for g in manager.scope(graph):
        g.loc = call.loc
        for node in manager.nodes.get(g, ()):
            if node.loc is None:
                node.loc = call.loc.derive(f"ad: {g.name}")


def _type_new_graph(manager: Manager, closure: ValueNode, nabla: FuncGraph, fn: Node,
                    tangents: bool = False) -> bool:
    """Type ``∇`` (and the transformed graphs it reaches) for its first call site;
    False when nothing gives its signature yet.

    Without a call site, the signature is that of the differentiated function
    (twice over with ``tangents``: a jvp closure takes a tangent per argument,
    of its argument's type).  When neither says (``grad(grad(sin))``: the inner
    ``∇`` is only differentiated, and ``sin`` takes any number), ``∇`` is left
    untyped: the outer expansion transforms it and types its transform where it
    is called; :func:`run` reports a ``∇`` still untyped at the end."""
    sig = None
    for user, index in manager.users.get(closure, {}):
        if isinstance(user, CNode) and index == 0 and all(a.abstract is not None for a in user.inputs[1:]):
            sig = [a.abstract for a in user.inputs[1:]]
            break
    if sig is None:
        target = _known_graph(fn)
        if target is not None and all(p.abstract is not None for p in target.parameters):
            sig = [p.abstract for p in target.parameters]
    if sig is None:
        abstract = fn.abstract
        atoms = list(abstract.options) if isinstance(abstract, AFunction) else []
        graphs = [a.graph for a in atoms if isinstance(a, GraphFn)]
        if graphs and all(p.abstract is not None for p in graphs[0].parameters):
            sig = [p.abstract for p in graphs[0].parameters]
    if sig is None:
        return False
    if tangents and len(sig) * 2 == len(nabla.parameters):
        sig = sig + sig
    infer_new_graph(nabla, sig)
    return True


def _expand_checkpoints(manager: Manager, untyped: list[tuple[FuncGraph, Node]]) -> int:
    """Replace every call ``checkpoint(f)`` by the closure it makes: a copy of
    :func:`~anfir.autodiff.checkpoint.checkpoint_graph` inlined, the wrapper
    ``C(x...) = f(x...)`` (flagged, so the J transform recomputes its call in the
    backward pass), typed where it is called."""
    count = 0
    while True:
        calls = [node for graph in list(manager.graphs) for node in toposort(graph, manager)
                 if isinstance(node, CNode) and isinstance(node.inputs[0], ValueNode)
                 and node.inputs[0].value is checkpointing.checkpoint]
        if not calls:
            return count
        for call in calls:
            if len(call.inputs) != 2:
                raise GradientError("checkpoint takes one function", call.loc)
            fn = call.inputs[1]
            maker, _ = clone_scope(checkpoint_graph(_arity(fn)), note="ad: checkpoint")
            _locate(maker, call)
            expanded = CNode(call.graph, [ValueNode(maker, call.loc), fn], call.loc, call.name)
            expanded.abstract = call.abstract
            manager.replace(call, expanded)
            closure = inline_call(manager, expanded, note="ad: checkpoint")
            assert isinstance(closure, ValueNode) and isinstance(closure.value, FuncGraph)
            wrapper = closure.value
            target = _known_graph(fn)
            wrapper.name = f"checkpoint▸{target.name}" if target is not None else "checkpoint▸"
            closure.abstract = AFunction(frozenset({GraphFn(wrapper)}))
            if not _type_new_graph(manager, closure, wrapper, fn):
                untyped.append((wrapper, fn))
            count += 1

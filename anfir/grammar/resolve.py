"""The resolve phase: global names -> graphs, primitives and meta functions.

The parser leaves each use of a global name as ``ValueNode(Symbol(name))``
(and lists them all, dead code included, in ``module.global_uses``).
:func:`resolve_module` makes each stand for the graph of a definition of the
module (or an imported one), else the primitive or meta function of that
name.  Scoping: local names were settled by the parser; a
module's definitions shadow imported ones, which shadow built-ins.

It then checks the arity of every call whose callee is statically known (a
graph constant — a top-level definition or a let-bound lambda — a primitive
or a meta function), and puts every call of a primitive in canonical form
(:func:`canonical_call`): keyword arguments are checked against the
primitive's declared attributes, constant positional arguments that stand for
attributes (``sum(x, 1)``) become attributes (``sum(x, axis=1)``), and
attributes equal to their default are dropped — so the two spellings are one
graph.  Errors are located: an unknown name (the first in source order, with
the close names that exist), a wrong number of arguments, a keyword argument
on a call of something that is not a primitive, an unknown attribute.

One iterative walk over the nodes reachable from the module's graphs: linear
in program size, no recursion.
"""

from __future__ import annotations

import difflib
from typing import Any, Optional

from anfir.errors import AnfirError, AnfirTypeError, ArityError, NameResolutionError
from anfir.ir.attrs import NO_ATTRS, Attrs, is_attr_value
from anfir.ir.graph import FuncGraph, Module
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.nested import fold_nested
from anfir.primitives import META_FUNCTIONS, PRIMITIVES, lookup
from anfir.primitives.structure import make_tuple
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.runtime_values import Symbol


def resolve_module(module: Module, *, allow_internal: bool = False) -> Module:
    """Replace every Symbol constant reachable from ``module``'s graphs; check static arities.

    Returns ``module``, changed in place: a Symbol constant no manager tracks
    becomes the resolved constant itself; under a manager, its uses are
    redirected to a new ValueNode, so the manager's records stay exact.
    Raises :class:`NameResolutionError` for the first unknown name in source
    order, :class:`ArityError` for the first call with a wrong argument count.
    An internal primitive (``env_getitem``, ``J``...: what the autodiff
    generates) is an unknown name to a program, unless ``allow_internal``
    (the autodiff's own gradient rules are parsed so).
    """
    imported: dict[str, FuncGraph] = dict(getattr(module, "imported", None) or {})
    scope: dict[str, FuncGraph] = dict(imported)
    scope.update(module.graphs)
    stop = set(imported.values()) - set(module.graphs.values())
    symbol_uses, calls = _collect(list(module.graphs.values()), stop)
    targets: dict[str, Any] = {}
    unknown = []
    for use in symbol_uses:
        name = use[2].value.name
        if name not in targets:
            targets[name] = _target(name, scope, allow_internal)
        if targets[name] is None:
            unknown.append(use)
    # Uses the parser saw that are not reachable (dead let bindings) are
    # checked too: a misspelt name is an error wherever it is.
    for node in module.global_uses:
        if isinstance(node.value, Symbol):
            name = node.value.name
            if name not in targets:
                targets[name] = _target(name, scope, allow_internal)
            if targets[name] is None:
                unknown.append((None, -1, node))
    if unknown:
        _, _, node = min(unknown, key=lambda use: _source_order(use[2]))
        raise _unknown_name(node, scope)
    module.global_uses = []  # settled: free the dead nodes
    resolved = [(user, index, node, targets[node.value.name]) for user, index, node in symbol_uses]
    for user, index, node, target in resolved:
        graph = user if isinstance(user, FuncGraph) else user.graph
        if graph is None or graph.manager is None:
            # No manager tracks these edges yet (a fresh parse): the constant
            # itself changes, which every use of it sees.
            node.value = target
        else:
            replacement = ValueNode(target, node.loc, node.name)
            replacement.annotation = node.annotation
            if isinstance(user, FuncGraph):
                user.output = replacement
            else:
                user.set_input(index, replacement)
        if index == 0 and not isinstance(user, FuncGraph) \
                and not _arity_fits(target, len(user.inputs) - 1):
            calls.append(user)
    if calls:
        calls.sort(key=_source_order)
        for cnode in calls:
            check_arity(cnode)
    keyword_calls = []
    for user, index, node, target in resolved:
        if index != 0 or isinstance(user, FuncGraph):
            continue
        if isinstance(target, Primitive):
            canonical_call(user)
        elif user.attrs and isinstance(target, MetaFunction) and target.keywords:
            _positional_keywords(user, target)
        elif user.attrs:
            keyword_calls.append((user, target))
    if keyword_calls:
        user, target = min(keyword_calls, key=lambda item: _source_order(item[0]))
        what = (f"'{target.name}' is a function of the program" if isinstance(target, FuncGraph)
                else f"'{target.name}' is not a primitive")
        raise AnfirTypeError(f"keyword arguments are attributes of a call of a primitive; {what}",
                             user.loc, hint="pass the value positionally")
    return module


def _positional_keywords(cnode: CNode, meta: MetaFunction) -> None:
    """``vmap(f, out_axes=1)`` as ``vmap(f, 0, 1)``: a meta function's keyword arguments
    made positional, the ones before a given one filled with their defaults."""
    names = [name for name, _ in meta.keywords]
    first = meta.min_args  # the keywords follow the required arguments
    given = dict(cnode.attrs.items())
    unknown = [k for k in given if k not in names]
    if unknown:
        raise AnfirTypeError(f"{meta.name} has no keyword argument '{unknown[0]}' "
                             f"(its keywords are {', '.join(names)})", cnode.loc)
    args = list(cnode.inputs[1:])
    for position, (name, default) in enumerate(meta.keywords):
        index = first + position
        if name in given:
            if index < len(args):
                raise AnfirTypeError(f"{meta.name}'s argument '{name}' is given both positionally "
                                     "and as a keyword", cnode.loc)
            while len(args) < index:  # an earlier keyword left out: its default
                args.append(ValueNode(meta.keywords[len(args) - first][1], cnode.loc))
            args.append(ValueNode(given[name], cnode.loc))
    set_call(cnode, [cnode.inputs[0], *args], NO_ATTRS)


def static_value(node: Node) -> Optional[tuple[Any]]:
    """``(value,)`` when ``node`` is a constant an attribute can hold — a literal,
    None, a string, or a ``make_tuple`` call (``(2, 2)``, any depth) of such
    constants — else None."""
    def items_of(n: Node) -> Any:
        if n.__class__ is CNode and n.inputs and n.inputs[0].__class__ is ValueNode \
                and n.inputs[0].value is make_tuple and not n.attrs:
            return n.inputs[1:]
        return None

    def leaf(n: Node) -> Any:
        if n.__class__ is ValueNode and is_attr_value(n.value):
            return n.value
        raise _NotStatic()

    try:
        return (fold_nested(node, items_of, lambda _n, items: tuple(items), leaf),)
    except _NotStatic:
        return None


class _NotStatic(Exception):
    """Raised inside :func:`static_value` by a part that is not a constant."""


def canonical_call(cnode: CNode) -> None:
    """Put a call of a primitive in canonical form (see the module doc), in place on a
    node no manager tracks, else by replacing it through its manager.  Raises a
    located :class:`AnfirTypeError` for an unknown attribute or one given twice."""
    prim = cnode.inputs[0].value  # type: ignore[attr-defined]
    if not prim.attrs:
        if cnode.attrs:
            raise AnfirTypeError(f"{prim.name} takes no keyword arguments ({prim.attrs_text()})",
                                 cnode.loc)
        return
    args = list(cnode.inputs[1:])
    inputs = prim.input_count(len(args))
    moved: list[tuple[str, Any]] = []
    # The constant tail of the positional attributes moves into the attributes
    # (`cumsum(x, a, true)`: `a` is not a constant, so it stays positional).
    while len(args) > inputs:
        found = static_value(args[-1])
        if found is None:
            break
        moved.append((prim.positional_attrs[len(args) - 1 - inputs], found[0]))
        args.pop()
    try:
        given = list(cnode.attrs.items())
        positional = set(prim.positional_attrs[:len(args) - inputs])
        for name, _ in given:
            if name in positional or any(name == m for m, _ in moved):
                raise AnfirTypeError(f"attribute '{name}' of {prim.name} is given both "
                                     "positionally and as a keyword")
        attrs = prim.canonical_attrs([*reversed(moved), *given])
    except AnfirError as exc:
        raise type(exc)(exc.message, exc.loc or cnode.loc, exc.hint) from None
    if attrs == cnode.attrs and attrs.pairs() == cnode.attrs.pairs() \
            and len(args) == len(cnode.inputs) - 1:
        return  # already canonical (the same values, types and order)
    set_call(cnode, [cnode.inputs[0], *args], attrs)


def set_call(cnode: CNode, inputs: list[Node], attrs: Attrs = NO_ATTRS) -> CNode:
    """Give ``cnode`` these inputs and attributes: in place when no manager tracks it,
    else through a new CNode that replaces it.  Returns the node standing there."""
    graph = cnode.graph
    manager = graph.manager if graph is not None else None
    if manager is None or not manager.tracks(cnode):
        cnode._raw_set_inputs(inputs)
        cnode.set_attrs(attrs)
        return cnode
    new = CNode(graph, inputs, cnode.loc, cnode.name, attrs)
    new.annotation = cnode.annotation
    manager.replace(cnode, new)
    return new


def _target(name: str, scope: dict[str, FuncGraph], allow_internal: bool) -> Any:
    """What the global ``name`` stands for: a definition, else a built-in (None if nothing)."""
    target = scope.get(name)
    if target is not None:
        return target
    found = lookup(name)
    if found is not None and found.internal and not allow_internal:
        return None
    return found


def _arity_fits(callee: Any, count: int) -> bool:
    """Whether calling the constant ``callee`` with ``count`` arguments may be right."""
    cls = callee.__class__
    if cls is Primitive or cls is MetaFunction:
        return callee.accepts(count)
    if cls is FuncGraph:
        return len(callee.parameters) == count
    if isinstance(callee, FuncGraph):
        return len(callee.parameters) == count
    if isinstance(callee, (Primitive, MetaFunction)):
        return callee.accepts(count)
    return True


def check_arity(cnode: CNode) -> None:
    """Raise :class:`ArityError` if ``cnode`` calls a known function with the wrong argument count."""
    callee = cnode.inputs[0]
    if not isinstance(callee, ValueNode):
        return
    value = callee.value
    count = len(cnode.inputs) - 1
    if isinstance(value, FuncGraph):
        expected = len(value.parameters)
        if count != expected:
            raise ArityError(f"'{value.name}' takes {_arguments(expected)}, "
                             f"but {count} {'was' if count == 1 else 'were'} given",
                             cnode.loc or callee.loc)
    elif isinstance(value, (Primitive, MetaFunction)):
        if not value.accepts(count):
            expected_text = value.arity_text()
            raise ArityError(f"'{value.name}' takes {expected_text} argument"
                             f"{'' if expected_text.split()[-1] == '1' else 's'}, but {count} "
                             f"{'was' if count == 1 else 'were'} given",
                             cnode.loc or callee.loc)


def _collect(roots: list[FuncGraph], stop: set[FuncGraph]) -> tuple[list, list]:
    """Symbol uses ``(user, index, node)`` and the calls to check, reachable from ``roots``.

    Follows CNode inputs (whatever graph owns them: free-variable edges too)
    and graph constants, except into the graphs of ``stop`` (imported ones,
    already resolved).  The calls kept are those of a known function with
    the wrong number of arguments (a Symbol callee is checked once replaced).
    """
    seen_graphs: set[FuncGraph] = set(roots)
    seen: set[Node] = set()
    stack: list[CNode] = []
    uses: list[tuple[Any, int, ValueNode]] = []
    calls: list[CNode] = []
    todo = list(roots)
    while todo:
        graph = todo.pop()
        if not graph.has_output:
            continue
        out = graph.output
        if isinstance(out, ValueNode):
            value = out.value
            if isinstance(value, Symbol):
                uses.append((graph, -1, out))
            elif isinstance(value, FuncGraph) and value not in seen_graphs and value not in stop:
                seen_graphs.add(value)
                todo.append(value)
            continue
        if not isinstance(out, CNode) or out in seen:
            continue
        seen.add(out)
        stack.append(out)
        while stack:
            node = stack.pop()
            inputs = node.inputs
            index = 0
            for item in inputs:
                if isinstance(item, ValueNode):
                    value = item.value
                    if isinstance(value, Symbol):
                        uses.append((node, index, item))
                    elif isinstance(value, FuncGraph) and value not in seen_graphs \
                            and value not in stop:
                        seen_graphs.add(value)
                        todo.append(value)
                    if index == 0 and not _arity_fits(value, len(inputs) - 1):
                        calls.append(node)
                elif isinstance(item, CNode) and item not in seen:
                    seen.add(item)
                    stack.append(item)
                index += 1
    return uses, calls


def _source_order(node: Node) -> tuple:
    loc = node.loc
    if loc is None:
        return (1, "", 0, 0)
    return (0, loc.file, loc.line, loc.col)


def _unknown_name(node: ValueNode, scope: dict[str, FuncGraph]) -> NameResolutionError:
    name = node.value.name
    found = lookup(name)
    if found is not None and found.internal:
        return NameResolutionError(
            f"unknown name '{name}': {name} is an internal primitive (the automatic "
            "differentiation generates it); programs cannot use it", node.loc)
    public = [n for n, p in PRIMITIVES.items() if not p.internal]
    public += [n for n, m in META_FUNCTIONS.items() if not m.internal]
    candidates = sorted(set(scope) | set(public))
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
    hint = ("did you mean " + " or ".join(f"'{c}'" for c in close) + "?") if close else ""
    return NameResolutionError(f"unknown name '{name}'", node.loc, hint=hint)


def _arguments(count: int) -> str:
    return f"{count} argument{'' if count == 1 else 's'}"


__all__ = ["canonical_call", "check_arity", "resolve_module", "set_call", "static_value"]

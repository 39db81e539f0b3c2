"""Rewrite rules that clean up gradient graphs (registered with the optimizer).

The J transform is written for generality — gradients travel in tuples and
environments, every primitive's rule sums back to its input's shape, the
seed is ``grad_seed(v)`` — and these rules remove that generality wherever
the types show it is not needed, so the gradient of a straight-line program
becomes one flat graph of arithmetic:

* ``sum_to(g, x)``, ``broadcast_like(g, x)``, ``cast_like(g, x)``,
  ``unreduce(g, x, axis, keepdims)``, ``reshape_like(g, x)`` → ``g`` when ``g``
  already has the result's type;
* ``cast_like(g, x)`` with ``x`` an integer or boolean → a zero of ``x``'s type
  (the sensitivity of an integer is zero);
* ``env_getitem(env_setitem(e, k, v), k, d)`` → ``v`` (another key: look in
  ``e``); ``env_getitem(newenv(), k, d)`` → ``d``;
* ``gadd(0, b)`` → ``b``; ``gadd(a, b)`` of two numbers/tensors of one type → ``add``;
* ``zeros_like(x)`` of a scalar → ``0.0``; of a tuple built by ``make_tuple`` →
  the tuple of zeros; of any (short) tuple → the tuple of its items' zeros; of a
  function → ``newenv()`` (so the zero does not keep a closure alive and
  un-inlined: what makes third- and fourth-order gradients flatten);
* ``gadd(make_tuple(a...), make_tuple(b...))`` → ``make_tuple(gadd(a_i, b_i)...)``;
  ``gadd(a, env_setitem(e, k, v))`` → ``env_setitem(gadd(a, e), k, gadd(a[k], v))``;
* ``tuple_setitem(make_tuple(...), i, v)`` → ``make_tuple(..., v, ...)``;
  ``tuple_getitem(tuple_setitem(t, i, v), i)`` → ``v``;
* ``grad_seed(v)`` of a float scalar → ``1.0``; ``grad_arg_check(x, g)`` with
  ``x`` a float → ``g``;
* ``neg(neg(x))`` → ``x``;
* ``op(unreduce(s, r, None), c)`` with ``s`` and ``c`` scalars →
  ``unreduce(op(s, c), r, None)`` (the constant part folds), and
  ``op(unreduce(s, r, None), b)`` with ``b`` of the result's type →
  ``op(s, b)``: numpy broadcasting spreads the scalar anyway.  This is what
  turns the seed of ``sum(e ** 2) / 2`` into ``e`` itself.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence

from anfir.abstract.values import AAny, AEnv, AFunction, AScalar, ATensor, ATuple
from anfir.dtypes import is_bool, is_float, is_integer, is_signed_int, numpy_dtype
from anfir.ir.attrs import Attrs
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive, callee_primitive
from anfir.primitives import arith, gradient, structure
from anfir.runtime_values import SymbolicKey


class RuleContext(Protocol):
    """What these rules use of the optimizer that runs them.

    The optimizer (``anfir.passes.rewrite_context.RewriteContext``, a layer above) provides
    it; the rules name only this protocol, so the autodiff layer imports nothing
    from the passes, not even for type checking.
    """

    manager: Manager
    """The manager of the graphs being rewritten."""

    def constant(self, value: Any, like: Node) -> ValueNode:
        """A typed constant ``value`` standing where ``like`` was."""
        ...

    def apply(self, graph: FuncGraph, inputs: Sequence[Node], like: Node,
              abstract: Any = ..., attrs: Attrs = ...) -> CNode:
        """A typed CNode ``inputs[0](inputs[1:])`` in ``graph`` replacing ``like``."""
        ...

    def same_type(self, a: Node, b: Node) -> bool:
        """Whether both nodes are typed and have the same type."""
        ...

    def memo(self, name: str) -> dict[Any, Any]:
        """A dict a rule keeps its own facts in for the whole run."""
        ...


def _is(node: Node, prim: Primitive) -> bool:
    return isinstance(node, CNode) and callee_primitive(node) is prim


def _is_zero(node: Node) -> bool:
    """A node that is certainly a zero gradient."""
    if _is(node, structure.zeros_like) or _is(node, gradient.newenv):
        return True
    if isinstance(node, ValueNode) and type(node.value) in (int, float) and node.value == 0:
        return True
    return False


def _is_float(abstract: object) -> bool:
    if isinstance(abstract, (AScalar, ATensor)):
        return is_float(abstract.dtype)
    return False


def drop_shape_adjustment(node: CNode, ctx: RuleContext) -> Optional[Node]:
    """``sum_to/broadcast_like/cast_like/unreduce/reshape_like(g, ...)`` → ``g`` when
    types agree."""
    prim = callee_primitive(node)
    if prim not in (gradient.sum_to, gradient.broadcast_like, gradient.cast_like, gradient.unreduce,
                    gradient.reshape_like):
        return None
    g = node.inputs[1]
    if isinstance(node.abstract, AAny):
        return None  # an untyped gradient (a custom rule's pullback): the shape is unknown
    if ctx.same_type(g, node):
        return g
    return None


def integer_sensitivity(node: CNode, ctx: RuleContext) -> Optional[Node]:
    """``cast_like(g, x)`` with ``x`` an integer or boolean → a zero of ``x``'s type
    (the sensitivity of an integer is zero: see ``primitive_j._in_input_type``), so
    no back end meets the cast of a float gradient to an integer."""
    if not _is(node, gradient.cast_like):
        return None
    g, x = node.inputs[1], node.inputs[2]
    abstract = x.abstract
    if not isinstance(abstract, (AScalar, ATensor)) or not (is_integer(abstract.dtype)
                                                            or is_bool(abstract.dtype)):
        return None
    if isinstance(node.abstract, AScalar) and node.abstract.dtype == abstract.dtype:
        zero = False if is_bool(abstract.dtype) else (
            0 if abstract.dtype == "i64" else numpy_dtype(abstract.dtype).type(0))
        return ctx.constant(zero, like=node)
    assert node.graph is not None
    if ctx.same_type(x, node):
        return ctx.apply(node.graph, [ctx.constant(structure.zeros_like, like=node), x], like=node,
                         abstract=node.abstract)
    if _is_zero(g):
        return None  # already the cast of a zero (a tensor of g's shape)
    zero = ctx.apply(node.graph, [ctx.constant(structure.zeros_like, like=node), g], like=node,
                     abstract=g.abstract)
    return ctx.apply(node.graph, [node.inputs[0], zero, x], like=node, abstract=node.abstract)


def env_get_after_set(node: CNode, ctx: RuleContext) -> Optional[Node]:
    """``env_getitem(env_setitem(e, k, v), k, d)`` → ``v``; another constant key
    looks further down; ``env_getitem(newenv(), k, d)`` → ``d``.

    The whole chain of ``env_setitem`` below the environment is searched in
    one firing, through an index of the chain kept for the run
    (:func:`_env_lookup`): the environment of a gradient holds one entry per
    captured value, and looking every one of them up a step at a time would
    fire this rule, and make a node, once per entry passed over."""
    if not _is(node, gradient.env_getitem) or len(node.inputs) != 4:
        return None
    _, env, key, default = node.inputs
    if _is(env, gradient.newenv):
        return default
    if not (_is(env, gradient.env_setitem) and isinstance(key, ValueNode)
            and isinstance(key.value, SymbolicKey) and _constant_key(env) is not None):
        return None
    found, bottom = _env_lookup(env, key.value, ctx)
    if found is not None:
        return found.inputs[3]
    if _is(bottom, gradient.newenv):
        return default
    assert node.graph is not None
    return ctx.apply(node.graph, [node.inputs[0], bottom, key, default], like=node,
                     abstract=node.abstract)


def _constant_key(env: Node) -> Optional[SymbolicKey]:
    # The key of ``env_setitem(e, k, v)`` when it is a constant symbolic key.
    key = env.inputs[2]
    if isinstance(key, ValueNode) and isinstance(key.value, SymbolicKey):
        return key.value
    return None


class _EnvIndex:
    """The ``env_setitem`` chain below one environment node: for each
    constant key, the outermost ``env_setitem`` that sets it, and the first
    node down the chain that is not such an ``env_setitem`` (its bottom)."""

    __slots__ = ("setters", "bottom")

    def __init__(self, env: Node) -> None:
        self.setters: dict[SymbolicKey, CNode] = {}
        current = env
        while _is(current, gradient.env_setitem):
            key = _constant_key(current)
            if key is None:
                break
            assert isinstance(current, CNode)
            self.setters.setdefault(key, current)
            current = current.inputs[1]
        self.bottom = current


def _env_lookup(env: Node, key: SymbolicKey, ctx: RuleContext) -> tuple[Optional[CNode], Node]:
    """The ``env_setitem`` of ``key`` the chain below ``env`` holds (None if
    none), and the chain's bottom.

    The index is built once per environment node and kept for the run.
    Rewrites only ever replace a node by one of equal value, so what an
    environment maps a key to never changes; an index is rebuilt only when a
    node it names is gone from the program (or is no longer that
    ``env_setitem``)."""
    indexes: dict[Node, _EnvIndex] = ctx.memo("env_get_after_set")
    index = indexes.get(env)
    if index is None or not _env_index_valid(index, key, ctx):
        index = indexes[env] = _EnvIndex(env)
    return index.setters.get(key), index.bottom


def _env_index_valid(index: _EnvIndex, key: SymbolicKey, ctx: RuleContext) -> bool:
    found = index.setters.get(key)
    if found is not None:
        return (ctx.manager.tracks(found) and _is(found, gradient.env_setitem)
                and _constant_key(found) == key)
    return ctx.manager.tracks(index.bottom) or isinstance(index.bottom, ValueNode)


def gadd_simplify(node: CNode, ctx: RuleContext) -> Optional[Node]:
    """``gadd(0, b)`` → ``b``; ``gadd(a, b)`` on numbers or tensors of one type → ``add(a, b)``."""
    if not _is(node, gradient.gadd):
        return None
    _, a, b = node.inputs
    if _is_zero(a) and ctx.same_type(b, node):
        return b
    if _is_zero(b) and ctx.same_type(a, node):
        return a
    if (isinstance(node.abstract, (AScalar, ATensor)) and ctx.same_type(a, node)
            and ctx.same_type(b, node)):
        assert node.graph is not None
        return ctx.apply(node.graph, [ctx.constant(arith.add, like=node), a, b], like=node,
                         abstract=node.abstract)
    return None


def zeros_simplify(node: CNode, ctx: RuleContext) -> Optional[Node]:
    """``zeros_like`` of a float/int scalar → a constant; of ``make_tuple(...)`` → elementwise."""
    if not _is(node, structure.zeros_like):
        return None
    x = node.inputs[1]
    abstract = x.abstract
    if isinstance(abstract, AScalar) and is_float(abstract.dtype):
        return ctx.constant(0.0, like=node)
    if isinstance(abstract, AScalar) and is_signed_int(abstract.dtype):
        return ctx.constant(0, like=node)
    if _is(x, structure.make_tuple) and isinstance(node.abstract, ATuple):
        assert node.graph is not None
        zeros = [ctx.apply(node.graph, [node.inputs[0], item], like=node) for item in x.inputs[1:]]
        return ctx.apply(node.graph, [ctx.constant(structure.make_tuple, like=node), *zeros], like=node,
                         abstract=node.abstract)
    if isinstance(abstract, AFunction) and isinstance(node.abstract, AEnv):
        # A function's zero gradient is the empty environment whatever the function:
        # the zero no longer holds the closure alive (it may then be inlined).
        assert node.graph is not None
        return ctx.apply(node.graph, [ctx.constant(gradient.newenv, like=node)], like=node,
                         abstract=node.abstract)
    if (isinstance(abstract, ATuple) and isinstance(node.abstract, ATuple)
            and len(abstract.items) <= _SPREAD_MAX and len(node.abstract.items) == len(abstract.items)):
        # The tuple of the items' zeros: ``tuple_setitem`` and ``gadd`` then fold it.
        graph = node.graph
        assert graph is not None
        zeros = []
        for i, item in enumerate(abstract.items):
            part = ctx.apply(graph, [ctx.constant(structure.tuple_getitem, like=node), x,
                                     ctx.constant(i, like=node)], like=node, abstract=item)
            zeros.append(ctx.apply(graph, [node.inputs[0], part], like=node,
                                   abstract=node.abstract.items[i]))
        return ctx.apply(graph, [ctx.constant(structure.make_tuple, like=node), *zeros], like=node,
                         abstract=node.abstract)
    return None


_SPREAD_MAX = 64
"""The longest tuple whose zero (or gradient sum) is spread into its items: a wider
one stays one node (the rewrite would add a node per item for little gain)."""


def gadd_of_env_set(node: CNode, ctx: RuleContext) -> Optional[Node]:
    """``gadd(a, env_setitem(e, k, v))`` → ``env_setitem(gadd(a, e), k, gadd(a[k], v))``,
    or ``v`` for ``gadd(a[k], v)`` when ``a`` has no ``k`` (either side), when ``a``
    is a chain of ``env_setitem`` with constant keys over ``newenv()`` — so what
    ``a`` holds under ``k`` is known here and the result is what ``gadd`` computes
    at run time, key by key.  The sum of environments built in one graph then folds
    away, and ``env_getitem`` of it reaches the entries."""
    if not (_is(node, gradient.gadd) and isinstance(node.abstract, AEnv)):
        return None
    _, a, b = node.inputs
    if not _is(b, gradient.env_setitem):
        a, b = b, a
    if not (_is(b, gradient.env_setitem) and _is(a, gradient.env_setitem)):
        return None  # (gadd_simplify drops a newenv() side)
    assert isinstance(b, CNode)
    key = _constant_key(b)
    if key is None or _constant_key(a) is None:
        return None
    found, bottom = _env_lookup(a, key, ctx)
    if not _is(bottom, gradient.newenv):
        return None
    graph = node.graph
    assert graph is not None
    _, inner, key_node, value = b.inputs
    total = value
    if found is not None:
        total = ctx.apply(graph, [node.inputs[0], found.inputs[3], value], like=node,
                          abstract=value.abstract)
    rest = ctx.apply(graph, [node.inputs[0], a, inner], like=node, abstract=node.abstract)
    return ctx.apply(graph, [b.inputs[0], rest, key_node, total], like=node, abstract=node.abstract)


def gadd_of_tuples(node: CNode, ctx: RuleContext) -> Optional[Node]:
    """``gadd(make_tuple(a...), make_tuple(b...))`` → ``make_tuple(gadd(a_i, b_i)...)``:
    what ``gadd`` computes on tuples, item by item, so the items' sums fold."""
    if not _is(node, gradient.gadd):
        return None
    _, a, b = node.inputs
    if not (_is(a, structure.make_tuple) and _is(b, structure.make_tuple)
            and isinstance(node.abstract, ATuple)):
        return None
    items = node.abstract.items
    assert isinstance(a, CNode) and isinstance(b, CNode)
    if not (len(a.inputs) == len(b.inputs) == len(items) + 1 and len(items) <= _SPREAD_MAX):
        return None
    graph = node.graph
    assert graph is not None
    sums = [ctx.apply(graph, [node.inputs[0], x, y], like=node, abstract=item)
            for x, y, item in zip(a.inputs[1:], b.inputs[1:], items)]
    return ctx.apply(graph, [ctx.constant(structure.make_tuple, like=node), *sums], like=node,
                     abstract=node.abstract)


def tuple_set_simplify(node: CNode, ctx: RuleContext) -> Optional[Node]:
    """``tuple_setitem(make_tuple(...), i, v)`` → ``make_tuple(..., v, ...)``;
    ``tuple_getitem(tuple_setitem(t, i, v), j)`` → ``v`` or ``tuple_getitem(t, j)``."""
    if _is(node, gradient.tuple_setitem):
        _, tup, index, value = node.inputs
        if _is(tup, structure.make_tuple) and isinstance(index, ValueNode) and type(index.value) is int:
            items = list(tup.inputs[1:])
            i = index.value
            if -len(items) <= i < len(items):
                items[i] = value
                assert node.graph is not None
                return ctx.apply(node.graph, [tup.inputs[0], *items], like=node, abstract=node.abstract)
        return None
    if _is(node, structure.tuple_getitem):
        _, tup, index = node.inputs
        if not (_is(tup, gradient.tuple_setitem) and isinstance(index, ValueNode)):
            return None
        _, inner, index2, value = tup.inputs
        if not isinstance(index2, ValueNode) or type(index.value) is not int or type(index2.value) is not int:
            return None
        if index.value == index2.value:
            return value
        assert node.graph is not None
        return ctx.apply(node.graph, [node.inputs[0], inner, index], like=node, abstract=node.abstract)
    return None


def seed_and_check(node: CNode, ctx: RuleContext) -> Optional[Node]:
    """``grad_seed(v)`` → ``1.0`` and ``grad_arg_check(x, g)`` → ``g`` once types prove them."""
    if _is(node, gradient.grad_seed):
        abstract = node.inputs[1].abstract
        if isinstance(abstract, AScalar) and is_float(abstract.dtype):
            # 1 of the output's own float type: an f32 loss seeds with float32(1).
            one = 1.0 if abstract.dtype == "f64" else numpy_dtype(abstract.dtype).type(1.0)
            return ctx.constant(one, like=node)
        return None
    if _is(node, gradient.grad_arg_check) and _is_float(node.inputs[1].abstract):
        return node.inputs[2]
    return None


def double_negation(node: CNode, ctx: RuleContext) -> Optional[Node]:
    """``neg(neg(x))`` → ``x``."""
    if _is(node, arith.neg) and _is(node.inputs[1], arith.neg):
        return node.inputs[1].inputs[1]
    return None


_ELEMENTWISE = frozenset({arith.add, arith.sub, arith.mul, arith.div})
"""The binary elementwise primitives a broadcast scalar gradient is pushed into
(by object, as every table keyed by primitive)."""


def _scalar_unreduce(node: Node) -> bool:
    # unreduce(s, r, None) of a scalar s: a tensor filled with s, shaped like r.
    return (_is(node, gradient.unreduce) and isinstance(node.inputs[3], ValueNode)
            and node.inputs[3].value is None and isinstance(node.inputs[1].abstract, AScalar))


def scalar_unreduce_into_elementwise(node: CNode, ctx: RuleContext) -> Optional[Node]:
    """Push a broadcast scalar gradient into the elementwise op that uses it.

    ``op(unreduce(s, r, None), c)`` with ``c`` a scalar → ``unreduce(op(s, c), r, None)``;
    ``op(unreduce(s, r, None), b)`` with ``b`` already of the result's type →
    ``op(s, b)`` (and the same with the operands swapped).  Only when the
    result's type is unchanged, so no dtype or shape can differ.
    """
    prim = callee_primitive(node)
    if prim is None or prim not in _ELEMENTWISE or len(node.inputs) != 3:
        return None
    _, a, b = node.inputs
    for spread, other, spread_first in ((a, b, True), (b, a, False)):
        if not _scalar_unreduce(spread):
            continue
        scalar, ref = spread.inputs[1], spread.inputs[2]
        operands = [scalar, other] if spread_first else [other, scalar]
        assert node.graph is not None
        if ctx.same_type(other, node):
            return ctx.apply(node.graph, [node.inputs[0], *operands], like=node,
                             abstract=node.abstract)
        if isinstance(other.abstract, AScalar) and ctx.same_type(spread, node):
            inner = ctx.apply(node.graph, [node.inputs[0], *operands], like=node)
            if not isinstance(inner.abstract, AScalar):
                return None
            return ctx.apply(node.graph, [spread.inputs[0], inner, ref, *spread.inputs[3:]],
                             like=node, abstract=node.abstract)
    return None


GRADIENT_RULES = (drop_shape_adjustment, integer_sensitivity, env_get_after_set, gadd_simplify, gadd_of_tuples,
                  gadd_of_env_set, zeros_simplify,
                  tuple_set_simplify, seed_and_check, double_negation,
                  scalar_unreduce_into_elementwise)
"""The clean-up rewrites for gradient graphs, in the order the optimizer tries
them (:data:`anfir.passes.optimize.DEFAULT_RULES` places them)."""

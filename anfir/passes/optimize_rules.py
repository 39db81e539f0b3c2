"""The optimizer's rule library: small local rewrites, applied in list order.

A rule is a function ``rule(node, ctx) -> Node | None`` that looks at one
CNode (and its inputs) and returns the node that should replace it, or None
when it does not apply.  Rules never edit edges themselves: the engine
(:mod:`anfir.passes.optimize`) does ``manager.replace(node, result)``, counts
the firing under the rule's name and revisits the users.

New nodes are made through the context, which types them locally and marks
their location with the rule's name (``loc.derive("optimize: fold_constant")``):

* ``ctx.constant(value, like)`` — a typed constant;
* ``ctx.apply(graph, inputs, like, abstract=...)`` — a typed CNode (the type
  is given when the rewrite provably keeps it, else ``specialize.infer_call``);
* ``ctx.inline(call)`` — the body of the called graph, copied into the caller;
* ``ctx.same_type(a, b)`` — whether two nodes have the same (widened) type;
* ``ctx.same_value(a, b)`` — whether two nodes are one node or equal constants.

Adding a rule: write the function here (or, for a rule that only makes sense
on gradient graphs, in :mod:`anfir.autodiff.rules`) and put it in the list
:data:`anfir.passes.optimize.DEFAULT_RULES` composes — nothing registers
itself, so the optimizer does the same thing whatever was imported.

The default rules, in order: constant folding, attributes from constant
positional arguments, switch on a constant,
tuple_getitem of make_tuple, selects for branches that only return a value,
partial elimination, arithmetic identities, identity elimination, inlining of
known graph calls, CSE.  Dead code goes
without a rule (the manager releases unused nodes; the engine sweeps graphs
nobody reaches and counts them as ``dead_graph_elimination``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from anfir.dtypes import is_integer
from anfir.errors import AnfirError
from anfir.ir.attrs import is_attr_value
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import callee_primitive
from anfir.primitives import arith, structure, tensor
from anfir.passes.batching_typed import typed_batching
from anfir.passes.rewrite_context import RewriteContext, is_data


RuleFn = Callable[[CNode, "RewriteContext"], Optional[Node]]


@dataclass(frozen=True)
class Rule:
    """A named rewrite rule."""

    name: str
    """The name the rule's firings are counted under (``CompileResult.rule_counts``)."""
    fn: RuleFn
    """``fn(node, ctx) -> replacement or None``."""


# -- helpers -----------------------------------------------------------------
_SWITCH = structure.switch
_PARTIAL = structure.partial
_MAKE_TUPLE = structure.make_tuple
_TUPLE_GETITEM = structure.tuple_getitem
_IDENTITY = structure.identity
_ZEROS_LIKE = structure.zeros_like
_ADD = arith.add
_WHERE = tensor.where
_SUB = arith.sub
_MUL = arith.mul
_DIV = arith.div
_POW = arith.pow_


def _numeric_constant(node: Node, target: int) -> bool:
    """Whether ``node`` is the constant ``target`` (0 or 1): a number, not a bool,
    or a numeric array all of whose elements equal it."""
    if not isinstance(node, ValueNode):
        return False
    v = node.value
    if isinstance(v, bool) or isinstance(v, np.bool_):
        return False
    if isinstance(v, (int, float, np.integer, np.floating)):
        return bool(v == target)
    if isinstance(v, np.ndarray) and v.dtype.kind in "iuf":
        return bool(np.all(v == target))
    return False


def constant_bool(node: Node) -> Optional[bool]:
    """The value of a condition known at compile time (a bool constant, or a
    node the specializer typed with a known bool value), else None."""
    if isinstance(node, ValueNode):
        v = node.value
        if isinstance(v, (bool, np.bool_)):
            return bool(v)
        return None
    abstract = node.abstract
    value = getattr(abstract, "value", None)
    if getattr(abstract, "dtype", None) == "bool" and isinstance(value, (bool, np.bool_)):
        return bool(value)
    return None


# -- rules -------------------------------------------------------------------
def fold_constant(node: CNode, ctx: "RewriteContext") -> Optional[Node]:
    """``prim(c1, c2)`` with constant data arguments → the constant result.

    Only ``prim.foldable`` primitives; an error while evaluating (a runtime
    error the program may never reach) means no fold; a result whose type
    differs from the node's inferred type is not folded either.
    """
    prim = callee_primitive(node)
    if prim is None or not prim.foldable or prim is _SWITCH or prim is _PARTIAL:
        return None
    args = [a for a in node.inputs[1:] if isinstance(a, ValueNode)]
    if len(args) != len(node.inputs) - 1 or not all(ctx.is_data(a.value) for a in args):
        return None
    if not prim.accepts(len(args)):
        return None
    if prim.fold_guard is not None and not prim.fold_guard([a.value for a in args]):
        return None  # too costly to fold at compile time (10 ** 10 ** 10)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            value = prim.impl(*[a.value for a in args], **node.attrs)
    except Exception:  # noqa: BLE001 - any failure simply means "do not fold"
        return None
    if not ctx.is_data(value):
        return None
    if type(value) is int and value.bit_length() > 63:
        return None  # an integer beyond i64 (the specializer's type) stays a computation
    new = ctx.constant(value, like=node)
    if not ctx.compatible(new.abstract, node.abstract):
        return None
    return new


def attributes_from_constants(node: CNode, ctx: "RewriteContext") -> Optional[Node]:
    """``sum(x, 1, true)`` → ``sum(x, axis=1, keepdims=true)``: constant positional
    arguments standing for attributes become attributes (the canonical form the
    parser gives written calls), so equal calls look equal (CSE) and dumps show
    attributes.  Gradient rules pass their attributes on positionally; once
    instantiated (and folded) they are constants."""
    prim = callee_primitive(node)
    if prim is None or not prim.positional_attrs:
        return None
    args = list(node.inputs[1:])
    inputs = prim.input_count(len(args))
    moved: list[tuple[str, Any]] = []
    while len(args) > inputs:
        last = args[-1]
        if not (isinstance(last, ValueNode) and is_attr_value(last.value)):
            break
        moved.append((prim.positional_attrs[len(args) - 1 - inputs], last.value))
        args.pop()
    if not moved:
        return None
    try:
        attrs = prim.canonical_attrs([*reversed(moved), *node.attrs.items()])
    except AnfirError:
        return None  # given twice: left for the evaluator to report
    assert node.graph is not None
    return ctx.apply(node.graph, [node.inputs[0], *args], like=node, abstract=node.abstract,
                     attrs=attrs)


def switch_on_constant(node: CNode, ctx: "RewriteContext") -> Optional[Node]:
    """``switch(true, a, b)`` → ``a``; ``switch(false, a, b)`` → ``b``;
    ``switch(c, a, a)`` → ``a``."""
    if callee_primitive(node) is not _SWITCH or len(node.inputs) != 4:
        return None
    _, cond, yes, no = node.inputs
    if ctx.same_value(yes, no):
        return yes
    known = constant_bool(cond)
    if known is None:
        return None
    return yes if known else no


def where_on_constant(node: CNode, ctx: "RewriteContext") -> Optional[Node]:
    """``where(true, a, b)`` → ``a`` and ``where(false, a, b)`` → ``b`` for a scalar
    constant condition, when the chosen value already has the result's type (no
    broadcasting to do).  Exact: ``where`` selects, it does not compute."""
    if callee_primitive(node) is not _WHERE or len(node.inputs) != 4:
        return None
    known = constant_bool(node.inputs[1])
    if known is None:
        return None
    chosen = node.inputs[2] if known else node.inputs[3]
    return chosen if ctx.same_type(chosen, node) else None


def getitem_of_make_tuple(node: CNode, ctx: "RewriteContext") -> Optional[Node]:
    """``tuple_getitem(make_tuple(a, b, c), 1)`` → ``b``."""
    if callee_primitive(node) is not _TUPLE_GETITEM or len(node.inputs) != 3:
        return None
    _, tup, index = node.inputs
    if not (isinstance(tup, CNode) and callee_primitive(tup) is _MAKE_TUPLE):
        return None
    if not isinstance(index, ValueNode) or isinstance(index.value, (bool, np.bool_)):
        return None
    if not isinstance(index.value, (int, np.integer)):
        return None
    items = tup.inputs[1:]
    i = int(index.value)
    if not -len(items) <= i < len(items):
        return None  # out of range: leave the runtime error where it is
    return items[i]


def _trivial_output(graph_node: Node) -> Optional[Node]:
    # The value a parameterless branch graph returns without computing
    # anything (a constant, or a value of an enclosing graph), else None.
    if not (isinstance(graph_node, ValueNode) and isinstance(graph_node.value, FuncGraph)):
        return None
    graph = graph_node.value
    if graph.parameters or not graph.has_output:
        return None
    out = graph.output
    if isinstance(out, ValueNode) or out.graph is not graph:
        return out
    return None


def select_trivial_branches(node: CNode, ctx: "RewriteContext") -> Optional[Node]:
    """``switch(c, ✓g, ✗g)()`` where both branches only return a value that
    exists already (``if c then 0 else x``) → ``switch(c, 0, x)``: a select,
    no call.  The value is the call's, so its type is kept."""
    head = node.inputs[0]
    if len(node.inputs) != 1 or not isinstance(head, CNode) or callee_primitive(head) is not _SWITCH:
        return None
    if len(head.inputs) != 4:
        return None
    yes, no = _trivial_output(head.inputs[2]), _trivial_output(head.inputs[3])
    if yes is None or no is None:
        return None
    assert node.graph is not None
    return ctx.apply(node.graph, [head.inputs[0], head.inputs[1], yes, no], like=node,
                     abstract=node.abstract)


def partial_elimination(node: CNode, ctx: "RewriteContext") -> Optional[Node]:
    """``partial(f, a)(b)`` → ``f(a, b)`` (same result, so the node's type is kept)."""
    head = node.inputs[0]
    if not (isinstance(head, CNode) and callee_primitive(head) is _PARTIAL and len(head.inputs) >= 2):
        return None
    assert node.graph is not None
    inputs = [*head.inputs[1:], *node.inputs[1:]]
    return ctx.apply(node.graph, inputs, like=node, abstract=node.abstract)


def _zero_with_sign(node: Node, negative: bool) -> bool:
    """Whether ``node`` is the constant zero, and, if it holds floats, the zero of
    that sign: ``x + (-0.0)`` and ``x - 0.0`` are ``x`` for every IEEE ``x``, but
    ``(-0.0) + 0.0`` is ``+0.0``."""
    if not _numeric_constant(node, 0):
        return False
    v = node.value  # type: ignore[attr-defined]
    if isinstance(v, (int, np.integer)) or (isinstance(v, np.ndarray) and v.dtype.kind in "iu"):
        return True
    return bool(np.all(np.signbit(v) == negative))


def _integral(abstract: Any) -> bool:
    dtype = getattr(abstract, "dtype", None)
    return type(abstract).__name__ in ("AScalar", "ATensor") and dtype is not None and (
        is_integer(dtype) or dtype == "bool")


def arithmetic_identity(node: CNode, ctx: "RewriteContext") -> Optional[Node]:
    """``x * 1``, ``1 * x``, ``x + (-0.0)``, ``x - 0.0``, ``x / 1``, ``x ** 1`` → ``x``;
    on integers also ``x + 0``, ``0 + x`` → ``x`` and ``x * 0``, ``0 * x`` → zeros.

    Exact for every IEEE value: ``x * 0.0`` is nan for an infinite or nan ``x``
    and ``-0.0`` for a negative one, and ``(-0.0) + 0.0`` is ``+0.0``, so those
    are left to run time on floats.  Only when the types prove it: ``x`` has the
    result's type (so an int never becomes a float, and broadcasting never
    changes a shape).
    """
    prim = callee_primitive(node)
    if prim is None or len(node.inputs) != 3:
        return None
    _, a, b = node.inputs
    candidate: Optional[Node] = None
    if prim is _MUL:
        if _numeric_constant(b, 1):
            candidate = a
        elif _numeric_constant(a, 1):
            candidate = b
        elif (_numeric_constant(b, 0) or _numeric_constant(a, 0)) and _integral(node.abstract):
            other = a if _numeric_constant(b, 0) else b
            return _zeros_for(node, other, ctx)
    elif prim is _ADD:
        if _zero_with_sign(b, True):
            candidate = a
        elif _zero_with_sign(a, True):
            candidate = b
    elif prim is _SUB:
        if _zero_with_sign(b, False):
            candidate = a
    elif prim is _DIV or prim is _POW:
        if _numeric_constant(b, 1):
            candidate = a
    if candidate is None or not ctx.same_type(candidate, node):
        return None
    return candidate


def _zeros_for(node: CNode, other: Node, ctx: "RewriteContext") -> Optional[Node]:
    # x * 0 on integers: zeros of the result's type, only when that is x's type too.
    if not ctx.same_type(other, node):
        return None
    abstract = node.abstract
    kind = type(abstract).__name__
    dtype = getattr(abstract, "dtype", "")
    if kind == "AScalar":
        if is_integer(dtype):
            return ctx.constant(0, like=node)
        return None
    if kind == "ATensor":
        assert node.graph is not None
        callee = ctx.constant(_ZEROS_LIKE, like=node)
        return ctx.apply(node.graph, [callee, other], like=node, abstract=abstract)
    return None


def identity_elimination(node: CNode, ctx: "RewriteContext") -> Optional[Node]:
    """``identity(x)`` → ``x``."""
    if callee_primitive(node) is _IDENTITY and len(node.inputs) == 2:
        return node.inputs[1]
    return None


def inline_known_call(node: CNode, ctx: "RewriteContext") -> Optional[Node]:
    """A call of a graph constant (e.g. after a switch was folded) → the graph's
    body, when the inlining policy allows (called once, or small and not recursive)."""
    if not ctx.can_inline(node):
        return None
    return ctx.inline(node)


def cse(node: CNode, ctx: "RewriteContext") -> Optional[Node]:
    """Common subexpression elimination: a CNode equal to an earlier one of the
    same graph (same callee, same inputs) → that one.  Hash-consing: one table
    lookup per visit, so the whole pass is linear."""
    return ctx.hash_cons(node)


SIMPLIFY_RULES: tuple[Rule, ...] = tuple(Rule(fn.__name__, fn) for fn in (
    fold_constant, attributes_from_constants, switch_on_constant, where_on_constant, getitem_of_make_tuple, select_trivial_branches,
    partial_elimination, arithmetic_identity, identity_elimination, typed_batching))
"""The local simplifications, tried in this order."""
FINAL_RULES: tuple[Rule, ...] = (Rule("inline_known_call", inline_known_call), Rule("cse", cse))
"""Tried after every other rule: inlining, then common subexpressions."""

__all__ = ["FINAL_RULES", "Rule", "RuleFn", "SIMPLIFY_RULES", "callee_primitive"]

"""What a rewrite rule may use: :class:`RewriteContext` (typed node builders, the CSE
table, the inliner's facts) and :class:`RuleDeclined`.

Apart from the optimizer's engine (:mod:`anfir.passes.optimize`) so that the rule
modules (:mod:`anfir.passes.optimize_rules`) import it at module level without the
loop optimize -> optimize_rules -> optimize.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional, Sequence

import numpy as np

from anfir.abstract.lattice import widen
from anfir.abstract.values import AScalar, ATensor, ATuple
from anfir.errors import AnfirError
from anfir.ir.attrs import NO_ATTRS, Attrs
from anfir.ir.graph import FuncGraph
from anfir.location import Location
from anfir.ir.manager import Manager
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.passes.inline import INLINE_THRESHOLD, RecursionCache, called_graph, clone_call_body, should_inline
from anfir.passes.specialize import abstract_of_value, infer_call
from anfir.dtypes import dtype_name
from anfir.runtime_values import DType


FOLD_MAX_ELEMENTS = 1024
"""Folding never creates a tensor constant with more elements than this: a
large constant would bloat the dumps (and memory) for little gain."""


def is_data(value: Any, known: Optional[dict[int, Any]] = None) -> bool:
    """Whether ``value`` is plain data a constant can hold (no functions).

    ``known`` holds tuples already found to be data (``known[id(t)] = t``),
    which are not walked again; ``value`` is added when it is data."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, tuple):
            if known is None or id(v) not in known:
                stack.extend(v)
        elif isinstance(v, np.ndarray):
            if dtype_name(v.dtype) is None or v.size > FOLD_MAX_ELEMENTS:
                return False
        elif v is None or isinstance(v, (bool, int, float, complex, str, np.generic, DType)):
            continue
        else:
            return False
    if known is not None and isinstance(value, tuple):
        known[id(value)] = value
    return True


class RuleDeclined(Exception):
    """Raised inside a rule (e.g. by ``ctx.apply`` when the new node cannot be
    typed) to mean "this rule does not apply here"."""


_INFER: Any = object()


class RewriteContext:
    """What a rule may use: typed node builders, the CSE table, the inliner."""

    def __init__(self, manager: Manager, counts: Counter[str],
                 inline_threshold: int = INLINE_THRESHOLD) -> None:
        self.manager = manager
        """The manager of the graphs being rewritten."""
        self.counts = counts
        """Rule name → times fired (shared with the pipeline's stats)."""
        self.rule = ""
        """The name of the rule being tried (used in derived locations)."""
        self.created: list[Node] = []
        """Nodes made by the current rule; the engine queues them."""
        self.inline_threshold = inline_threshold
        self.recursive = RecursionCache(manager, keep_negative=False)
        self._cse: dict[tuple, CNode] = {}
        # Facts about constant values and types, by identity, for the whole
        # run.  Folding a chain of tuple constructions makes constants that
        # nest the previous one: with these, each fold looks at its new level
        # only, not the whole value again (the memos hold what they key).
        self._abstracts: dict[int, tuple[Any, Any]] = {}
        self._data: dict[int, Any] = {}
        self._compatible: dict[tuple[int, int], tuple[Any, Any]] = {}
        self._memos: dict[str, dict[Any, Any]] = {}

    # -- building --------------------------------------------------------------
    def loc(self, like: Node) -> Optional[Location]:
        """``like``'s location marked as made by the current rule."""
        if like.loc is None:
            return None
        return like.loc.derive(f"optimize: {self.rule}")

    def constant(self, value: Any, like: Node) -> ValueNode:
        """A typed constant ``value`` standing where ``like`` was."""
        node = ValueNode(value, self.loc(like))
        try:
            node.abstract = abstract_of_value(value, self._abstracts)
        except AnfirError:  # a value the type system has no name for: do not make it
            raise RuleDeclined() from None
        return node

    def apply(self, graph: FuncGraph, inputs: Sequence[Node], like: Node,
              abstract: Any = _INFER, attrs: Attrs = NO_ATTRS) -> CNode:
        """A CNode ``inputs[0](inputs[1:])`` in ``graph`` with the attributes
        ``attrs``, replacing ``like``.

        ``abstract`` is the new node's type when the caller knows it (the
        rewrite keeps ``like``'s value); otherwise it is inferred from the
        inputs' types with ``specialize.infer_call``.  A rule that rebuilds a
        call of the same primitive passes the old call's ``attrs`` on.
        """
        node = CNode(graph, inputs, self.loc(like), like.name, attrs)
        if abstract is _INFER:
            abstract = self.infer(inputs, node.loc, attrs)
        node.abstract = abstract
        node.annotation = like.annotation
        self.created.append(node)
        return node

    def infer(self, inputs: Sequence[Node], loc: Optional[Location],
              attrs: Attrs = NO_ATTRS) -> Any:
        """The type of ``inputs[0](inputs[1:])`` (with ``attrs``) from its inputs' types
        (None when untyped)."""
        if any(i.abstract is None for i in inputs):
            return None  # an untyped program (built by hand) stays untyped
        try:
            return infer_call(inputs[0].abstract, [i.abstract for i in inputs[1:]], loc, attrs)
        except AnfirError:
            raise RuleDeclined() from None

    def inline(self, call: CNode) -> Node:
        """The body of the graph ``call`` calls, copied into ``call.graph``."""
        result, created = clone_call_body(self.manager, call, f"optimize: {self.rule}")
        self.created.extend(created)
        return result

    # -- questions ---------------------------------------------------------------
    def can_inline(self, call: CNode) -> bool:
        """Whether the inlining policy allows inlining ``call`` here."""
        return called_graph(call) is not None and should_inline(
            self.manager, call, self.inline_threshold, self.recursive)

    @staticmethod
    def same_type(a: Node, b: Node) -> bool:
        """Whether both nodes are typed and have the same type (known scalar
        values ignored: ``<Float64 = 1.0>`` has the type of ``<Float64>``)."""
        if a.abstract is None or b.abstract is None:
            return False
        return widen(a.abstract) == widen(b.abstract)

    @staticmethod
    def same_value(a: Node, b: Node) -> bool:
        """Whether ``a`` and ``b`` are the same node, or constants equal in type and value."""
        return a is b or (isinstance(a, ValueNode) and isinstance(b, ValueNode)
                          and _input_key(a) == _input_key(b))

    def compatible(self, new: Any, old: Any) -> bool:
        """Whether a constant typed ``new`` may stand where a node typed ``old``
        was: the same kind and dtype (and shape where ``old`` knows it)."""
        return abstract_compatible(new, old, self._compatible)

    def memo(self, name: str) -> dict[Any, Any]:
        """A dict a rule may keep its own facts in for the whole run (one per
        ``name``); what it keeps must stay true under value-preserving rewrites,
        or be checked before use."""
        found = self._memos.get(name)
        if found is None:
            found = self._memos[name] = {}
        return found

    def is_data(self, value: Any) -> bool:
        """Whether ``value`` is plain data a constant can hold (:func:`is_data`)."""
        return is_data(value, self._data)

    # -- CSE ---------------------------------------------------------------------
    def hash_cons(self, node: CNode) -> Optional[CNode]:
        """The live, earlier node equal to ``node`` in its graph, or None (then
        ``node`` becomes the representative of its key)."""
        key = (node.graph, node.attrs.key, *(_input_key(i) for i in node.inputs))
        known = self._cse.get(key)
        if (known is not None and known is not node and self.manager.tracks(known)
                and known.graph is node.graph and known.attrs == node.attrs
                and _same_inputs(known, node)):
            return known
        self._cse[key] = node
        return None


def _input_key(node: Node) -> Any:
    # Constants compare by value (two ``1.0`` ValueNodes are the same input);
    # type names keep 1, 1.0 and True apart; floats use repr so -0.0 != 0.0.
    if isinstance(node, ValueNode):
        v = node.value
        if v is None or type(v) in (bool, int, str):
            return ("const", type(v).__name__, v)
        if type(v) is float:
            return ("const", "float", repr(v))
        if isinstance(v, tuple):
            if all(e is None or type(e) in (bool, int, float, str) for e in v):
                return ("tuple", tuple((type(e).__name__, repr(e)) for e in v))
            return node  # nested or array-holding tuples: only the same ValueNode matches
        if isinstance(v, (list, dict)) or hasattr(v, "__array__"):
            return node  # arrays: only the same ValueNode matches
        try:
            hash(v)
        except TypeError:
            return node
        return ("value", type(v).__name__, v)
    return node


def _same_inputs(a: CNode, b: CNode) -> bool:
    if len(a.inputs) != len(b.inputs):
        return False
    return all(x is y or _input_key(x) == _input_key(y) for x, y in zip(a.inputs, b.inputs))


# -- types -------------------------------------------------------------------
def abstract_compatible(new: Any, old: Any,
                        proven: Optional[dict[tuple[int, int], tuple[Any, Any]]] = None) -> bool:
    """Whether a value typed ``new`` may replace one typed ``old`` (see RewriteContext.compatible).

    ``proven`` holds the pairs already found compatible (by identity; each
    entry holds its pair), which are not compared again; ``(new, old)`` is
    added when compatible."""
    if old is None or new is None:
        return old is None
    stack = [(new, old)]
    while stack:
        n, o = stack.pop()
        if proven is not None and (id(n), id(o)) in proven:
            continue
        if type(n) is not type(o):
            return False
        if isinstance(o, AScalar):
            if n.dtype != o.dtype:
                return False
        elif isinstance(o, ATensor):
            if n.dtype != o.dtype:
                return False
            if o.shape is not None and n.shape is not None:
                if len(n.shape) != len(o.shape):
                    return False
                if any(isinstance(od, int) and nd != od for nd, od in zip(n.shape, o.shape)):
                    return False
        elif isinstance(o, ATuple):
            if len(n.items) != len(o.items):
                return False
            stack.extend(zip(n.items, o.items))
        elif n != o:
            return False
    if proven is not None:
        proven[(id(new), id(old))] = (new, old)
    return True

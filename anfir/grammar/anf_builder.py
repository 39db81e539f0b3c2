"""The graph builder: the transformer whose callbacks make FuncGraphs during the parse.

The grammar (anf.lark) splits every binder into a *head* rule that reduces
before the scope it opens is parsed (``let_head`` after ``in``,
``lambda_head`` after the parameters, ``if_head`` after ``then``,
``if_else`` after ``else``, ``def_head`` after ``=``).  So although LALR
parsing is bottom up, the builder always knows

* ``self.graph`` — the graph being built (CNodes are created in it directly),
* ``self.env`` — name -> stack of bound nodes (innermost last),

and each name is resolved when it reduces: to its bound node (a parameter, a
let-bound node or constant — of an enclosing graph too, which is exactly a
free-variable edge), else to ``ValueNode(Symbol(name))``, a global left for
the resolve phase (:mod:`anfir.grammar.resolve`).

The one forward reference is a ``let`` whose value mentions its own name:
``let loop = lambda ... loop(...) ... end in`` must see the lambda itself, but
``let x = x + 1 in`` the outer ``x``.  While a let's value is parsed its name
is bound to a :class:`Pending`; uses of it are :class:`PendingUse`
placeholders whose slots are filled when the value is known (the lambda's
graph constant, else whatever the name meant outside).

Graph shapes (what the other phases rely on):

* operators: ``CNode(graph, [ValueNode(PRIMITIVES[op]), a, b])`` located at the
  operator; unary minus on a literal folds to a negative constant;
* calls: ``CNode(graph, [callee, *args])`` located at the ``(``; tuples are
  ``make_tuple``, ``e[i]`` is ``tuple_getitem(e, i)``; keyword arguments
  (``sum(x, axis=1)``) are the CNode's ``attrs``, constants only, on a call
  of a global name (the resolve phase checks it is a primitive);
* ``let x = e in b``: no node; uses of ``x`` are ``e``'s node, named ``x``
  (and annotated) when it is a CNode that ``e`` computed;
* ``let x: T = e in b`` when ``e`` is not such a CNode (a parameter, another
  let's node, a constant, a global): ``identity(e)`` named ``x``, annotated ``T``
  and located at the annotation — an explicit check, so that every annotation
  of one value is checked where it is written;
* ``lambda``: a FuncGraph valued as ``ValueNode(graph)``, named after the let
  binding it, else ``lambda``;
* ``if c then a else b`` in graph G: ``switch(c, ✓G, ✗G)()`` with two
  zero-parameter branch graphs.

No recursion anywhere: every callback does a bounded amount of work.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from lark import Transformer

from anfir import limits
from anfir.errors import AnfirSyntaxError, AnfirTypeError, DuplicateDefinitionError
from anfir.grammar.anf_lexer import Token, string_value
from anfir.grammar.resolve import static_value
from anfir.grammar.syntax import CHAIN_OPERATORS, INFIX_OPERATORS, PREFIX_OPERATORS
from anfir.ir.attrs import Attrs
from anfir.ir.annotations import ScalarAnn, TensorAnn, TupleAnn, TypeAnn
from anfir.ir.type_syntax import dimension, scalar_type, tensor_type
from anfir.ir.graph import FuncGraph
from anfir.ir.metadata import DOC, MetadataSyntaxError, parse_json, split_attribute
from anfir.location import Location
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.primitives import PRIMITIVES, structure
from anfir.runtime_values import Symbol

# The operators of anfir.grammar.syntax, their primitives looked up once here.
_BINARY = {terminal: (op.precedence, PRIMITIVES[op.primitive])
           for terminal, op in CHAIN_OPERATORS.items()}
"""Chain operator terminal -> (precedence, primitive); larger binds tighter."""
_NOT_PRECEDENCE = PREFIX_OPERATORS["NOT"].precedence
_NOT = PRIMITIVES[PREFIX_OPERATORS["NOT"].primitive]
_NEG = PRIMITIVES[PREFIX_OPERATORS["MINUS"].primitive]
_POW = PRIMITIVES[INFIX_OPERATORS["POW"].primitive]
_SWITCH = structure.switch
_MAKE_TUPLE = structure.make_tuple
_GETITEM = structure.tuple_getitem
_IDENTITY = structure.identity

TRUE_BRANCH = "✓"
"""Prefix of the graph of an ``if``'s ``then`` branch (MindIR's spelling)."""
FALSE_BRANCH = "✗"
"""Prefix of the graph of an ``if``'s ``else`` branch."""


class Pending:
    """A let's own name while its value is being parsed (see the module docstring)."""

    __slots__ = ("name", "outer", "slots")

    def __init__(self, name: str, outer: Any) -> None:
        self.name = name
        self.outer = outer
        """What the name means outside the let (a node, another Pending, or None: global)."""
        self.slots: list[tuple[Any, int, PendingUse]] = []
        """(user, index, use) for each place a use was put; index -1 is a graph's output."""


class PendingUse:
    """A use of a :class:`Pending` name: a placeholder until the let's value is known."""

    __slots__ = ("pending", "line", "col")

    def __init__(self, pending: Pending, line: int, col: int) -> None:
        self.pending = pending
        self.line = line
        self.col = col


class Negated:
    """An operand of a chain preceded by ``not`` tokens (applied by precedence in ``climb``)."""

    __slots__ = ("nots", "operand")

    def __init__(self, nots: list, operand: Any) -> None:
        self.nots = nots
        self.operand = operand


class NegatedChain(list):
    """A chain (operands and operators) in which some operand is :class:`Negated`."""

    __slots__ = ()


class Keyword:
    """A keyword argument of a call being parsed: its name token and constant value."""

    __slots__ = ("token", "value")

    def __init__(self, token: Token, value: Any) -> None:
        self.token = token
        self.value = value


class IfParts:
    """An ``if`` being parsed: its condition and branch graphs."""

    __slots__ = ("cond", "then_graph", "else_graph", "loc")

    def __init__(self, cond: Any, then_graph: FuncGraph, loc: Location) -> None:
        self.cond = cond
        self.then_graph = then_graph
        self.else_graph: Optional[FuncGraph] = None
        self.loc = loc


Item = Union[Node, PendingUse]
"""What an expression reduces to."""


def _fast_locations_work() -> bool:
    # Locations are made for most tokens; building the frozen dataclass through
    # its __init__ costs twice as much as filling its __dict__ directly.  Use
    # the shortcut only if it makes an identical object (it would not if
    # Location changed shape, e.g. gained __slots__ or a field).
    try:
        probe = Location("f", 2, 3, "text")
        fast = object.__new__(Location)
        object.__setattr__(fast, "__dict__", {"file": "f", "line": 2, "col": 3,
                                              "line_text": "text", "note": ""})
        return (fast == probe and repr(fast) == repr(probe) and hash(fast) == hash(probe)
                and vars(fast) == vars(probe))
    except Exception:  # noqa: BLE001  (any failure means: use the constructor)
        return False


_FAST_LOCATIONS = _fast_locations_work()


def location_factory(filename: str, lines: list[str]) -> Callable[[int, int], Location]:
    """A function ``(line, col) -> Location`` in ``filename`` whose lines are ``lines``.

    ``line_text`` is the already split line (shared, not copied, per node).
    """
    count = len(lines)
    if not _FAST_LOCATIONS:
        def make(line: int, col: int) -> Location:
            return Location(filename, line, col, lines[line - 1] if line <= count else "")
        return make
    new = object.__new__
    set_attr = object.__setattr__

    def fast(line: int, col: int) -> Location:
        loc = new(Location)
        set_attr(loc, "__dict__", {"file": filename, "line": line, "col": col,
                                   "line_text": lines[line - 1] if line <= count else "",
                                   "note": ""})
        return loc
    return fast


def _graph_meta(graph: FuncGraph, meta: dict[str, Any]) -> None:
    """Attach a definition's doc (``flags["doc"]``) and attributes (``flags["meta"]``)."""
    doc = meta.pop(DOC, None)
    if doc is not None:
        graph.flags["doc"] = doc
    if meta:
        graph.flags["meta"] = meta


def _set_output(graph: FuncGraph, value: Item) -> None:
    graph._raw_set_output(value)  # type: ignore[arg-type]
    if value.__class__ is PendingUse:
        value.pending.slots.append((graph, -1, value))


class AnfBuilder(Transformer):
    """Callbacks of the ANF grammar (one method per rule alias) building graphs.

    Lark is given one instance (the parser object is built once); the
    per-parse state is set by :meth:`begin` and collected by :meth:`finish`.
    Callbacks receive the list of their children; tokens are
    ``(type, text, line, col)`` tuples.
    """

    def __init__(self) -> None:
        super().__init__(visit_tokens=False)
        self.begin("<string>", [""])

    # -- per-parse state ----------------------------------------------------
    def begin(self, filename: str, lines: list[str]) -> None:
        """Start a parse of ``lines`` (the source split at newlines) from ``filename``."""
        self.filename = filename
        self.lines = lines
        self.loc = location_factory(filename, lines)
        """``loc(line, col)``: the Location of that point of the file being parsed."""
        self.main = FuncGraph("main", self.loc(1, 1))
        self.graph = self.main
        """The graph new CNodes belong to."""
        self.outer_graphs: list[FuncGraph] = []
        self.env: dict[str, list] = {}
        self.symbols: dict[str, Symbol] = {}
        self.global_uses: list[ValueNode] = []
        """Every ``ValueNode(Symbol)`` made, dead code included (for name checks)."""
        self.branches: list[tuple[FuncGraph, FuncGraph]] = []
        self.lambda_values: set[ValueNode] = set()
        """Values of lambdas not yet named by a let."""
        self.folded: set[ValueNode] = set()
        self.result: Any = None
        self.notes: set[int] = set()
        """Lines that are doc (``##``) or attribute (``#@``) lines; the lexer fills it."""
        self.used_notes: set[int] = set()
        """Those of :attr:`notes` already attached to a definition, a let or the module."""

    def finish(self) -> tuple[list[tuple[str, Location]], list[tuple[FuncGraph, Location]],
                              list[ValueNode], dict[str, Any]]:
        """End the parse: ``(imports, definitions, global name uses, module metadata)``.

        Names the ``if`` branch graphs after their enclosing graphs
        (``✓✗fibonacci``), now that let-bound lambdas have their names.
        """
        # Branches are listed in creation order, after the graph enclosing them.
        for branch, enclosing in self.branches:
            branch.name = branch.name + enclosing.name
        imports, definitions, bare = self.result
        global_uses = self.global_uses
        metadata = self.module_notes() if self.notes else {}
        self.begin("<string>", [""])
        return imports, definitions, global_uses, metadata

    # -- doc comments and attributes -------------------------------------------
    def notes_before(self, token: Token) -> Optional[dict[str, Any]]:
        """The doc and attribute lines directly above ``token`` (a ``def`` or ``let``
        that starts its line), read and marked used; None when there are none."""
        line = token[2]
        notes = self.notes
        if line - 1 not in notes or self.lines[line - 1][:token[3] - 1].strip():
            return None
        first = line - 1
        while first - 1 in notes:
            first -= 1
        return self.read_notes(first, line)

    def module_notes(self) -> dict[str, Any]:
        """The module's metadata: the block of doc and attribute lines that opens the
        file (after blank lines and comments) when a blank line follows it; then
        every other such line must have been attached, or it is an error."""
        lines = self.lines
        notes = self.notes
        n = 1
        while n <= len(lines) and n not in notes and (
                not lines[n - 1].strip() or lines[n - 1].lstrip().startswith("#")):
            n += 1
        metadata: dict[str, Any] = {}
        if n in notes and n not in self.used_notes:
            end = n
            while end in notes:
                end += 1
            if end > len(lines) or not lines[end - 1].strip():
                metadata = self.read_notes(n, end)
        stray = sorted(notes - self.used_notes)
        if stray:
            text = lines[stray[0] - 1]
            raise AnfirSyntaxError(
                "this doc comment or attribute line belongs to nothing",
                self.loc(stray[0], len(text) - len(text.lstrip()) + 1),
                hint="'##' and '#@' lines go directly above a def or a let (no blank line "
                     "between), or open the file followed by a blank line (the module's); "
                     "'###' starts an ordinary comment")
        return metadata

    def read_notes(self, first: int, end: int) -> dict[str, Any]:
        """Lines ``first`` to ``end - 1`` (doc and attribute lines) as a dict: the doc
        string (the ``##`` lines joined by newlines) under ``"doc"``, then each
        ``#@ key value`` (a JSON value)."""
        doc: list[str] = []
        attrs: dict[str, Any] = {}
        for n in range(first, end):
            self.used_notes.add(n)
            text = self.lines[n - 1].rstrip("\r")
            start = len(text) - len(text.lstrip())
            body = text[start + 2:]
            if text[start + 1] == "#":
                doc.append(body[1:] if body.startswith(" ") else body)
                if DOC in attrs:
                    raise AnfirSyntaxError("a second doc string: this one has '#@ doc' already",
                                           self.loc(n, start + 1))
                continue
            col = start + 3  # the column of body[0]
            try:
                key, key_at, value_text, value_at = split_attribute(body)
            except MetadataSyntaxError as error:
                raise AnfirSyntaxError(error.message, self.loc(n, col + error.offset)) from None
            try:
                value = parse_json(value_text)
            except MetadataSyntaxError as error:
                raise AnfirSyntaxError(error.message, self.loc(n, col + value_at + error.offset),
                                       hint="attribute values are JSON: \"text\", 3, 2.5, true, "
                                            "null, [1, 2], {\"key\": 1}") from None
            if key in attrs or (key == DOC and doc):
                raise AnfirSyntaxError(f"the attribute {key!r} is given twice",
                                       self.loc(n, col + key_at))
            if key == DOC and not isinstance(value, str):
                raise AnfirSyntaxError("a doc string is a JSON string", self.loc(n, col + value_at))
            attrs[key] = value
        if doc:
            return {DOC: "\n".join(doc), **attrs}
        return attrs

    def token_loc(self, token: Token) -> Location:
        """The Location of a token."""
        return self.loc(token[2], token[3])

    # -- building blocks ----------------------------------------------------
    def apply(self, items: list, loc: Location) -> CNode:
        """``CNode(graph, items)``: ``items[0](items[1:])`` in the current graph."""
        cnode = CNode(self.graph, items, loc)
        for index, item in enumerate(items):
            if item.__class__ is PendingUse:
                item.pending.slots.append((cnode, index, item))
        return cnode

    def binary(self, prim: Any, left: Item, right: Item, loc: Location) -> CNode:
        """``prim(left, right)`` located at ``loc`` (the operator)."""
        if left.__class__ is PendingUse or right.__class__ is PendingUse:
            return self.apply([ValueNode(prim, loc), left, right], loc)
        # Neither operand is a PendingUse here; mypy narrows ``x.__class__ is C`` but not ``is not``.
        return CNode(self.graph, (ValueNode(prim, loc), left, right), loc)  # type: ignore[arg-type]

    def enter(self, graph: FuncGraph, params: list) -> None:
        """Build ``graph`` now, with ``params`` (``(token, annotation)`` pairs) in scope."""
        seen: dict[str, Token] = {}
        env = self.env
        for token, annotation in params:
            pname = token[1]
            if pname in seen:
                raise DuplicateDefinitionError(
                    f"duplicate parameter name '{pname}'", self.token_loc(token),
                    hint=f"the first '{pname}' is at column {seen[pname][3]}")
            seen[pname] = token
            param = graph.add_parameter(pname, self.token_loc(token))
            param.annotation = annotation
            stack = env.get(pname)
            if stack is None:
                env[pname] = [param]
            else:
                stack.append(param)
        self.outer_graphs.append(self.graph)
        self.graph = graph

    def leave(self, graph: FuncGraph, body: Item) -> None:
        """Finish ``graph`` with output ``body``; its parameters go out of scope."""
        _set_output(graph, body)
        env = self.env
        for param in graph.parameters:
            env[param.name].pop()  # type: ignore[index]
        self.graph = self.outer_graphs.pop()

    def check_callable(self, callee: Item) -> None:
        """Reject calling a literal (``3(4)``, ``"s"(1)``): located at the literal."""
        if callee.__class__ is ValueNode:
            value = callee.value
            if value.__class__ is Symbol:
                return
            if value is None or isinstance(value, (int, float, str)):
                kind = "None" if value is None else type(value).__name__
                raise AnfirTypeError(f"{value!r} is not a function: a value of type {kind} "
                                     "cannot be called", callee.loc)

    def resolve_pending(self, pending: Pending, value: Optional[Item]) -> None:
        """Fill the uses of a let's own name: ``value`` if it is a lambda, else the outer meaning."""
        slots = pending.slots
        if not slots:
            return
        outer = pending.outer
        for user, index, use in slots:
            if value is not None:
                target: Any = value
            elif outer is None:
                target = self.global_use(pending.name, use.line, use.col)
            elif outer.__class__ is Pending:
                target = use
                use.pending = outer
                outer.slots.append((user, index, use))
            else:
                target = outer
            if index < 0:
                user._raw_set_output(target)
            else:
                user._raw_set_input(index, target)

    def global_use(self, name: str, line: int, col: int) -> ValueNode:
        """``ValueNode(Symbol(name))`` for a use of a global name at ``line``:``col``."""
        symbol = self.symbols.get(name)
        if symbol is None:
            symbol = self.symbols[name] = Symbol(name)
        node = ValueNode(symbol, self.loc(line, col))
        self.global_uses.append(node)
        return node

    # -- module ---------------------------------------------------------------
    def start(self, c: list) -> None:
        """``start: imports body | body``; the result is kept for :meth:`finish`."""
        imports = c[0] if len(c) == 2 else []
        defs, bare = c[-1]
        self.result = (imports, defs, bare)

    def import_stmt(self, c: list) -> tuple[str, Location]:
        """``import "path"``: the path as written and where."""
        token = c[1]
        loc = self.token_loc(token)
        return string_value(token, self.filename, loc.line_text), loc

    def defs_body(self, c: list) -> tuple[list, bool]:
        """A sequence of definitions."""
        return c[0], False

    def bare_body(self, c: list) -> tuple[list, bool]:
        """One bare expression: the graph ``main`` (the lambda itself when it is one)."""
        body = c[0]
        main = self.main
        # (Any graph constant here is a lambda of this text: definitions are
        # only referred to by Symbols until the resolve phase.)
        if body.__class__ is ValueNode and isinstance(body.value, FuncGraph) \
                and not _captures(body.value, main):
            graph = body.value
            graph.name = "main"
        else:
            graph = main
            _set_output(main, body)
        return [(graph, graph.loc)], True

    def def_head(self, c: list) -> tuple[FuncGraph, Location]:
        """``def NAME(PARAMS) [-> TYPE] =``: the graph is built from here on."""
        name = c[1]
        loc = self.token_loc(name)
        graph = FuncGraph(name[1], loc)
        ret = c[5]
        if ret:
            graph.flags["return_type"] = ret[1]
        if self.notes:
            meta = self.notes_before(c[0])
            if meta is not None:
                _graph_meta(graph, meta)
        self.enter(graph, c[3])
        return graph, loc

    def definition(self, c: list) -> tuple[FuncGraph, Location]:
        """``def_head EXPR``."""
        graph, loc = c[0]
        self.leave(graph, c[1])
        return graph, loc

    def ret(self, c: list) -> list:
        """``-> TYPE`` or nothing."""
        return c

    def params(self, c: list) -> list:
        """The parameter list, possibly empty."""
        return c[0] if c else []

    def param(self, c: list) -> tuple[Token, Optional[TypeAnn]]:
        """``NAME`` or ``NAME: TYPE``."""
        return c[0], (c[2] if len(c) == 3 else None)

    # -- lists (one callback appends in place) --------------------------------
    def list1(self, c: list) -> list:
        """The first element of a list: the children list is the list."""
        return c

    def list_more1(self, c: list) -> list:
        """``list item``."""
        lst = c[0]
        lst.append(c[1])
        return lst

    def list_more2(self, c: list) -> list:
        """``list , item``."""
        lst = c[0]
        lst.append(c[2])
        return lst

    def first(self, c: list) -> Any:
        """A rule that only passes its single child through."""
        return c[0]

    # -- let ------------------------------------------------------------------
    def let_name(self, c: list) -> tuple[Token, Optional[TypeAnn], Pending, Optional[dict]]:
        """``let NAME [: TYPE] =``: while the value is parsed, the name is pending.
        (The doc and attribute lines above the ``let`` are read now, in order.)"""
        token = c[1]
        name = token[1]
        stack = self.env.get(name)
        pending = Pending(name, stack[-1] if stack else None)
        if stack is None:
            self.env[name] = [pending]
        else:
            stack.append(pending)
        meta = self.notes_before(c[0]) if self.notes else None
        return token, (c[3] if len(c) == 5 else None), pending, meta

    def let_head(self, c: list) -> str:
        """``let_name EXPR in``: bind the name for the body."""
        token, annotation, pending, meta = c[0]
        value = c[1]
        name = pending.name
        stack = self.env[name]
        stack.pop()
        cls = value.__class__
        if cls is ValueNode and value in self.lambda_values:
            # A lambda let-bound where it is written is named after its
            # variable and sees itself (a later alias `let g = f` renames nothing).
            self.lambda_values.discard(value)
            value.value.name = name
            self.resolve_pending(pending, value)
            if meta is not None:
                _graph_meta(value.value, meta)
                meta = None
        else:
            self.resolve_pending(pending, None)
            if cls is PendingUse and value.pending is pending:  # `let x = x in`
                outer = pending.outer
                if outer is None:
                    value = self.global_use(name, value.line, value.col)
                elif outer.__class__ is Pending:
                    value = PendingUse(outer, value.line, value.col)
                else:
                    value = outer
            elif cls is CNode and value.name is None and value.annotation is None:
                # The let names the node its expression computed.
                value.name = name
                if annotation is not None:
                    value.annotation = annotation
                annotation = None
                if meta is not None:
                    self.graph.node_meta[value] = meta
                    meta = None
        if annotation is not None:
            # The value is not a node this let computed (a parameter, another
            # let's node, a constant, a global...): the annotation is its own
            # check, so every annotation of one value is checked at its place.
            value = self.ascription(value, annotation, token, name)
            if meta is not None:
                self.graph.node_meta[value] = meta
                meta = None
        if meta is not None:
            raise AnfirSyntaxError(
                f"the doc or attributes above 'let {name}' describe nothing: its value is "
                "not computed there (it names a parameter, a constant or another let's value)",
                self.token_loc(token),
                hint="put them above the let that computes the value")
        stack.append(value)
        return name

    def ascription(self, value: Item, annotation: TypeAnn, token: Token, name: str) -> CNode:
        """``let name: T = value`` where ``value`` is not a node the let computed:
        ``identity(value)`` named ``name`` and annotated ``T`` (the specializer checks
        each annotated CNode), located at the annotation."""
        loc = annotation.loc or self.token_loc(token)
        check = self.apply([ValueNode(_IDENTITY, loc), value], loc)
        check.name = name
        check.annotation = annotation
        return check

    def let(self, c: list) -> Item:
        """``let_head EXPR``: the body's value; the name goes out of scope."""
        self.env[c[0]].pop()
        return c[1]

    # -- if ---------------------------------------------------------------------
    def if_head(self, c: list) -> IfParts:
        """``if COND then``: the ``then`` branch graph is built from here on."""
        loc = self.token_loc(c[0])
        then_graph = FuncGraph(TRUE_BRANCH, loc)
        self.branches.append((then_graph, self.graph))
        self.outer_graphs.append(self.graph)
        self.graph = then_graph
        return IfParts(c[1], then_graph, loc)

    def if_else(self, c: list) -> IfParts:
        """``if_head EXPR else``: the ``else`` branch graph is built from here on."""
        parts = c[0]
        _set_output(parts.then_graph, c[1])
        enclosing = self.outer_graphs[-1]
        else_graph = FuncGraph(FALSE_BRANCH, parts.loc)
        self.branches.append((else_graph, enclosing))
        parts.else_graph = else_graph
        self.graph = else_graph
        return parts

    def if_(self, c: list) -> CNode:
        """``if c then a else b`` -> ``switch(c, ✓g, ✗g)()``."""
        parts = c[0]
        else_graph = parts.else_graph
        _set_output(else_graph, c[1])
        self.graph = self.outer_graphs.pop()
        loc = parts.loc
        select = self.apply([ValueNode(_SWITCH, loc), parts.cond, ValueNode(parts.then_graph, loc),
                             ValueNode(else_graph, loc)], loc)
        return CNode(self.graph, (select,), loc)

    # -- operators ----------------------------------------------------------------
    def climb(self, c: list) -> Item:
        """A chain of operands and binary operators, by the spec's precedence table.

        ``c[0]`` alternates operands and operator tokens; an operand preceded
        by ``not`` is a :class:`Negated` (and the chain then a
        :class:`NegatedChain`).  An operator stack applies precedence and
        left associativity without recursion.
        """
        chain = c[0]
        count = len(chain)
        first = chain[0]
        if chain.__class__ is list:  # no `not`: the common cases first
            if count == 1:
                return first
            if count == 3:
                op = chain[1]
                return self.binary(_BINARY[op[0]][1], first, chain[2], self.loc(op[2], op[3]))
            if count == 5:  # `a OP b OP c`: which operator binds first
                op1, op2 = chain[1], chain[3]
                prec1, prim1 = _BINARY[op1[0]]
                prec2, prim2 = _BINARY[op2[0]]
                loc = self.loc
                if prec1 >= prec2:
                    left = self.binary(prim1, first, chain[2], loc(op1[2], op1[3]))
                    return self.binary(prim2, left, chain[4], loc(op2[2], op2[3]))
                right = self.binary(prim2, chain[2], chain[4], loc(op2[2], op2[3]))
                return self.binary(prim1, first, right, loc(op1[2], op1[3]))
        ops: list = []  # (precedence, primitive, token)
        values: list = []
        reduce_op = self._reduce_op
        if chain.__class__ is list:  # no `not` in the chain
            values.append(first)
            for index in range(1, count, 2):
                op = chain[index]
                precedence, prim = _BINARY[op[0]]
                while ops and ops[-1][0] >= precedence:
                    reduce_op(ops.pop(), values)
                ops.append((precedence, prim, op))
                values.append(chain[index + 1])
            while ops:
                reduce_op(ops.pop(), values)
            return values[0]
        if first.__class__ is Negated:
            for token in first.nots:
                ops.append((_NOT_PRECEDENCE, _NOT, token))
            first = first.operand
        values.append(first)
        for index in range(1, count, 2):
            op = chain[index]
            precedence, prim = _BINARY[op[0]]
            while ops and ops[-1][0] >= precedence:
                reduce_op(ops.pop(), values)
            ops.append((precedence, prim, op))
            operand = chain[index + 1]
            if operand.__class__ is Negated:
                if precedence > _NOT_PRECEDENCE:
                    raise AnfirSyntaxError(
                        f"'not' binds more loosely than '{op[1]}' before it",
                        self.token_loc(operand.nots[0]),
                        hint=f"put the operand in parentheses: a {op[1]} (not b)")
                for token in operand.nots:
                    ops.append((_NOT_PRECEDENCE, _NOT, token))
                operand = operand.operand
            values.append(operand)
        while ops:
            reduce_op(ops.pop(), values)
        return values[0]

    def climb_let(self, c: list) -> Item:
        """``chain OP let ... in EXPR``: the let is the chain's last operand."""
        chain = c[0]
        chain.append(c[1])
        chain.append(self.let([c[2], c[3]]))
        return self.climb([chain])

    def climb_if(self, c: list) -> Item:
        """``chain OP if ... else EXPR``: the if is the chain's last operand."""
        chain = c[0]
        chain.append(c[1])
        chain.append(self.if_([c[2], c[3]]))
        return self.climb([chain])

    def _reduce_op(self, op: tuple, values: list) -> None:
        _, prim, token = op
        loc = self.loc(token[2], token[3])
        if prim is _NOT:
            values.append(self.apply([ValueNode(prim, loc), values.pop()], loc))
        else:
            right = values.pop()
            values.append(self.binary(prim, values.pop(), right, loc))

    def chain_nots(self, c: list) -> list:
        """``not ... operand`` starting a chain."""
        return NegatedChain([Negated(c[0], c[1])])

    def chain_more(self, c: list) -> list:
        """``chain OP operand``."""
        chain = c[0]
        chain.append(c[1])
        chain.append(c[2])
        return chain

    def chain_more_nots(self, c: list) -> list:
        """``chain OP not ... operand``."""
        chain = c[0]
        if chain.__class__ is list:
            chain = NegatedChain(chain)
        chain.append(c[1])
        chain.append(Negated(c[2], c[3]))
        return chain

    def power(self, c: list) -> CNode:
        """``a ** b`` (right-associative; ``b`` may be negated)."""
        token = c[1]
        return self.binary(_POW, c[0], c[2], self.loc(token[2], token[3]))

    def negate(self, c: list) -> Item:
        """Unary minus: a literal folds into a negative constant, else ``neg``."""
        loc = self.token_loc(c[0])
        operand = c[1]
        if operand.__class__ is ValueNode and operand not in self.folded:
            value = operand.value
            if value.__class__ is int or value.__class__ is float:
                # Only a literal folds: `- -2` is neg(-2), as Python reads it.
                folded = ValueNode(-value, loc)
                self.folded.add(folded)
                return folded
        return self.apply([ValueNode(_NEG, loc), operand], loc)

    # -- atoms and postfix forms ------------------------------------------------
    def name(self, c: list) -> Item:
        """A name: its binding in scope, else a global ``ValueNode(Symbol(name))``."""
        token = c[0]
        text = token[1]
        stack = self.env.get(text)
        if stack:
            node = stack[-1]
            if node.__class__ is Pending:
                return PendingUse(node, token[2], token[3])
            return node
        symbol = self.symbols.get(text)
        if symbol is None:
            symbol = self.symbols[text] = Symbol(text)
        node = ValueNode(symbol, self.loc(token[2], token[3]))
        self.global_uses.append(node)
        return node

    def int_(self, c: list) -> ValueNode:
        """An integer literal (at most ``anfir.limits.MAX_INT_DIGITS`` digits)."""
        token = c[0]
        return ValueNode(self.int_value(token), self.loc(token[2], token[3]))

    def int_value(self, token: Token) -> int:
        """The value of an INT token; too many digits is a located syntax error."""
        text = token[1]
        if len(text) > 18:
            why = limits.int_too_long(text)
            if why is not None:
                raise AnfirSyntaxError(why, self.token_loc(token))
        return int(text)

    def float_(self, c: list) -> ValueNode:
        """A float literal."""
        token = c[0]
        return ValueNode(float(token[1]), self.loc(token[2], token[3]))

    def string(self, c: list) -> ValueNode:
        """A string literal."""
        loc = self.token_loc(c[0])
        return ValueNode(string_value(c[0], self.filename, loc.line_text), loc)

    def true(self, c: list) -> ValueNode:
        """``true`` / ``True``."""
        return ValueNode(True, self.token_loc(c[0]))

    def false(self, c: list) -> ValueNode:
        """``false`` / ``False``."""
        return ValueNode(False, self.token_loc(c[0]))

    def none(self, c: list) -> ValueNode:
        """``None``."""
        return ValueNode(None, self.token_loc(c[0]))

    def unit(self, c: list) -> CNode:
        """``()``: the empty tuple."""
        loc = self.token_loc(c[0])
        return self.apply([ValueNode(_MAKE_TUPLE, loc)], loc)

    def paren(self, c: list) -> Item:
        """``(EXPR)``."""
        return c[1]

    def tuple1(self, c: list) -> CNode:
        """``(EXPR,)``."""
        loc = self.token_loc(c[0])
        return self.apply([ValueNode(_MAKE_TUPLE, loc), c[1]], loc)

    def tuple_n(self, c: list) -> CNode:
        """``(EXPR, EXPR, ...)``."""
        loc = self.token_loc(c[0])
        items = [ValueNode(_MAKE_TUPLE, loc), c[1]]
        items.extend(c[3])
        return self.apply(items, loc)

    def lambda_head(self, c: list) -> FuncGraph:
        """``lambda (PARAMS)``: the lambda's graph is built from here on."""
        graph = FuncGraph("lambda", self.token_loc(c[0]))
        self.enter(graph, c[2])
        return graph

    def lambda_(self, c: list) -> ValueNode:
        """``lambda_head EXPR end``: the graph, valued as ``ValueNode(graph)``."""
        graph = c[0]
        self.leave(graph, c[1])
        value = ValueNode(graph, graph.loc)
        self.lambda_values.add(value)
        return value

    def call(self, c: list) -> CNode:
        """``callee(ARGS)``; the CNode is located at the ``(``."""
        callee = c[0]
        if callee.__class__ is ValueNode:
            self.check_callable(callee)
        token = c[1]
        if len(c) == 3:
            return self.apply([callee], self.loc(token[2], token[3]))
        items = [callee]
        items.extend(c[2])
        return self.apply(items, self.loc(token[2], token[3]))

    def kwarg(self, c: list) -> "Keyword":
        """``NAME = EXPR`` in a call: an attribute, whose value must be a constant."""
        token, value = c[0], c[2]
        found = static_value(value) if value.__class__ is not PendingUse else None
        if found is None:
            raise AnfirSyntaxError(
                f"the value of the keyword argument '{token[1]}' must be a constant",
                self.token_loc(token),
                hint="keyword arguments are a primitive's attributes: a number, true/false, "
                     "None, a string, or a tuple of those")
        return Keyword(token, found[0])

    def call_kw(self, c: list) -> CNode:
        """``callee(ARGS, NAME=VALUE, ...)``: a call with attributes, located at the ``(``.

        The callee must be a global name (a primitive once resolved: the
        resolve phase checks it and the attribute names).
        """
        callee = c[0]
        token = c[1]
        lists = [item for item in c[2:] if item.__class__ is list]
        keywords: list[Keyword] = lists[-1]
        if callee.__class__ is not ValueNode or callee.value.__class__ is not Symbol:
            raise AnfirTypeError(
                "keyword arguments are attributes of a call of a primitive; this callee is "
                "not a primitive", self.token_loc(keywords[0].token),
                hint="pass the value positionally, or call the primitive by its name")
        seen: dict[str, Token] = {}
        for keyword in keywords:
            name = keyword.token[1]
            if name in seen:
                raise AnfirSyntaxError(f"the keyword argument '{name}' is given twice",
                                       self.token_loc(keyword.token))
            seen[name] = keyword.token
        items = [callee]
        if len(lists) == 2:
            items.extend(lists[0])
        cnode = self.apply(items, self.loc(token[2], token[3]))
        cnode.set_attrs(Attrs((k.token[1], k.value) for k in keywords))
        return cnode

    def index(self, c: list) -> CNode:
        """``EXPR[INT]`` -> ``tuple_getitem(EXPR, INT)``, located at the ``[``."""
        loc = self.token_loc(c[1])
        position = c[2]
        return self.apply([ValueNode(_GETITEM, loc), c[0],
                           ValueNode(self.int_value(position), self.token_loc(position))], loc)

    # -- type annotations ---------------------------------------------------------
    def type_name(self, c: list) -> ScalarAnn:
        """A scalar type name (checked by :mod:`anfir.ir.type_syntax`)."""
        token = c[0]
        return scalar_type(token[1], self.token_loc(token))

    def type_tensor(self, c: list) -> TensorAnn:
        """``DTYPE[DIMS]`` (``f32[]`` is 0-d)."""
        token = c[0]
        return tensor_type(token[1], c[2] if len(c) == 4 else (), self.token_loc(token))

    def dim(self, c: list) -> Union[int, str]:
        """A dimension: a size, a dimension variable or ``*``."""
        return dimension(c[0][1], self.token_loc(c[0]))

    def type_paren(self, c: list) -> TypeAnn:
        """``(T)`` is ``T``."""
        return c[1]

    def type_tuple(self, c: list) -> TupleAnn:
        """``()``, ``(T,)``, ``(T1, T2, ...)``."""
        loc = self.token_loc(c[0])
        if len(c) == 2:
            return TupleAnn((), loc)
        items = [c[1]]
        if len(c) > 4:
            items.extend(c[3])
        return TupleAnn(tuple(items), loc)


def _captures(graph: FuncGraph, owner: FuncGraph) -> bool:
    """Whether ``graph`` or a graph it uses (not ``owner``) has an edge to a node of ``owner``."""
    seen_graphs = {graph}
    todo = [graph]
    seen: set[Node] = set()
    while todo:
        current = todo.pop()
        if not current.has_output:
            continue
        stack = [current.output]
        while stack:
            node = stack.pop()
            if node in seen:
                continue
            seen.add(node)
            if node.graph is owner:
                return True
            if isinstance(node, ValueNode):
                value = node.value
                if isinstance(value, FuncGraph) and value is not owner and value not in seen_graphs:
                    seen_graphs.add(value)
                    todo.append(value)
            elif isinstance(node, CNode):
                stack.extend(node.inputs)
    return False

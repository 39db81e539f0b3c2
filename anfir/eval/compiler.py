"""Compile a FuncGraph once into flat code for the VM.

A frame's registers are one Python list laid out as::

    [ parameters... | captured values (free_variables_total order)... | template... ]

where the template (copied on every call) holds the graph's constants, already
loaded, followed by one empty slot per computed value.  Every operand of every
instruction is resolved here to a register index, and every primitive callee to
its Python function (with the call's attributes bound as keyword
arguments), so the VM does no dict lookup, name resolution or isinstance test
on the common path.  No Python source is generated.

Compiled code is cached per graph and is recompiled when the graph's manager,
or the manager's ``epoch`` (bumped on every edit), has changed.
"""

from __future__ import annotations

import functools
import weakref
from operator import itemgetter
from typing import Any, Callable, Optional, Sequence

from anfir.errors import AnfirError, ArityError, IRConsistencyError
from anfir.eval.fastpath import FAST_PATHS, FastPath
from anfir.eval.opcodes import (BRANCH, CALL, CALLG, CLOSURE, F1, F2, K2, K2L, NAMES, P1, P2,
                                P3, PN, RAISE, RET, TBRANCH, TCALL, TCALLG)
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager, manage
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.walk import toposort
from anfir.ir.primitive import Arity, Primitive
from anfir.primitives import structure

Getter = Callable[[list], tuple]


class Code:
    """The compiled form of one FuncGraph."""

    __slots__ = ("graph", "nparams", "nfree", "template", "instrs", "operands",
                 "manager", "epoch", "string_free", "__weakref__")

    def __init__(self, graph: FuncGraph, nparams: int, nfree: int, template: list,
                 instrs: list[tuple], operands: list[tuple[int, ...]], manager: Manager) -> None:
        self.graph = graph
        """The graph this is the code of."""
        self.nparams = nparams
        """How many arguments a call passes."""
        self.nfree = nfree
        """How many captured values a closure of the graph carries."""
        self.template = template
        """Constants then empty slots; appended to arguments and captures on entry."""
        self.instrs = instrs
        """The instructions (see :mod:`anfir.eval.opcodes`); the last one returns or tail-calls."""
        self.operands = operands
        """Per instruction, the register indices a getter reads (for :func:`disassemble`)."""
        self.manager = manager
        """The manager whose facts the code was compiled from."""
        self.epoch = manager.epoch
        """``manager.epoch`` at compile time; a different epoch means stale code."""
        self.string_free: Any = None
        """The graph's signature (``graph.abstract``) once :func:`anfir.eval.run` has
        found that it holds no string constant to compare the arguments with."""


class GraphCell:
    """A known callee graph and its (lazily compiled, re-validated) code.

    Call instructions hold a cell instead of the code so that a graph may call
    itself (its code does not exist yet while it is compiled) and so that
    stale code is noticed at the call.
    """

    __slots__ = ("graph", "code")

    def __init__(self, graph: FuncGraph) -> None:
        self.graph = graph
        self.code: Optional[Code] = None

    def refresh(self) -> Code:
        """The graph's current code (compiling it if needed), remembered in the cell."""
        code = self.code = code_for(self.graph)
        return code


_CACHE: "weakref.WeakKeyDictionary[FuncGraph, Code]" = weakref.WeakKeyDictionary()


def code_for(graph: FuncGraph) -> Code:
    """``graph``'s compiled code, from the cache when still valid."""
    code = _CACHE.get(graph)
    manager = graph.manager
    if code is not None and code.manager is manager and code.epoch == manager.epoch:
        return code
    code = compile_graph(graph)
    _CACHE[graph] = code
    return code


def _empty(regs: list) -> tuple:
    return ()


def make_getter(indices: Sequence[int]) -> Getter:
    """A function ``regs -> tuple(regs[i] for i in indices)`` (itemgetter when it can)."""
    if len(indices) >= 2:
        return itemgetter(*indices)
    if len(indices) == 1:
        index = indices[0]
        return lambda regs: (regs[index],)
    return _empty


def _plural(count: int, word: str = "argument") -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def arity_words(fn: Arity) -> str:
    """``2 arguments``, ``1 argument``, ``1 to 2 arguments`` for a Primitive or MetaFunction."""
    return fn.arity_words()


class _Compiler:
    """Compiles one graph; see :func:`compile_graph`."""

    def __init__(self, graph: FuncGraph, manager: Manager) -> None:
        self.graph = graph
        self.manager = manager
        self.fvs = manager.free_variables_total(graph)
        self.reg: dict[Node, int] = {p: i for i, p in enumerate(graph.parameters)}
        base = len(graph.parameters)
        for j, fv in enumerate(self.fvs):
            self.reg[fv] = base + j
        self.offset = base + len(self.fvs)
        self.template: list = []
        self.instrs: list[tuple] = []
        self.operands: list[tuple[int, ...]] = []
        self.closures: dict[FuncGraph, int] = {}

    # -- registers ------------------------------------------------------------
    def new_reg(self, initial: Any = None) -> int:
        self.template.append(initial)
        return self.offset + len(self.template) - 1

    def emit(self, instr: tuple, operands: tuple[int, ...] = ()) -> None:
        self.instrs.append(instr)
        self.operands.append(operands)

    def captured(self, graph: FuncGraph, user: Node) -> list[int]:
        """Registers holding the values a closure of ``graph`` captures."""
        regs = []
        for fv in self.manager.free_variables_total(graph):
            r = self.reg.get(fv)
            if r is None:
                raise IRConsistencyError(
                    f"@{self.graph.name} makes a closure of @{graph.name}, which captures "
                    f"{fv!r}: neither computed in @{self.graph.name} nor captured by it",
                    user.loc)
            regs.append(r)
        return regs

    def operand(self, node: Node, user: Node) -> int:
        """The register of ``node``'s value (constants and closures get one on first use)."""
        r = self.reg.get(node)
        if r is not None:
            return r
        if not isinstance(node, ValueNode):
            raise IRConsistencyError(
                f"@{self.graph.name} uses {node!r}, which it neither computes nor captures",
                node.loc or user.loc)
        value = node.value
        if isinstance(value, FuncGraph) and self.manager.free_variables_total(value):
            r = self.closures.get(value)
            if r is None:
                env = self.captured(value, user)
                r = self.new_reg()
                self.closures[value] = r
                self.emit((CLOSURE, r, value, make_getter(env), user), tuple(env))
        else:
            r = self.new_reg(value)
        self.reg[node] = r
        return r

    # -- calls ----------------------------------------------------------------
    def fusable_switches(self, cnodes: list[CNode]) -> dict[CNode, CNode]:
        """``{call: switch}`` for each ``switch(c, ✓g, ✗g)(args)`` whose switch has no other use."""
        switch = structure.switch
        users = self.manager.users
        fused: dict[CNode, CNode] = {}
        for call in cnodes:
            head = call.inputs[0] if call.inputs else None
            if not (isinstance(head, CNode) and head.graph is self.graph
                    and head.is_apply(switch) and len(head.inputs) == 4):
                continue
            branches = head.inputs[2:]
            nargs = len(call.inputs) - 1
            if not all(isinstance(b, ValueNode) and isinstance(b.value, FuncGraph)
                       and len(b.value.parameters) == nargs for b in branches):
                continue
            if list(users.get(head, {})) != [(call, 0)]:
                continue
            fused[call] = head
        return fused

    def call(self, node: CNode, tail: bool, fused: dict[CNode, CNode]) -> bool:
        """Emit ``node``; True when it was emitted as a tail call (no RET needed)."""
        inputs = node.inputs
        if not inputs:
            raise IRConsistencyError(f"a call with no callee in @{self.graph.name}", node.loc)
        head, args = inputs[0], inputs[1:]
        count = len(args)
        if isinstance(head, ValueNode) and isinstance(head.value, Primitive):
            prim = head.value
            if not prim.accepts(count):
                self.fail(node, ArityError(f"{prim.name} takes {arity_words(prim)}, got {count}",
                                           node.loc))
                return False
            fast = FAST_PATHS.get(prim) if not node.attrs else None
            if fast is not None and self.fast_call(node, prim, fast, args):
                return False
            regs = [self.operand(a, node) for a in args]
            dst = self.new_reg()
            # A call's attributes are bound once here: the VM calls ``fn(*args)``.
            fn = functools.partial(prim.impl, **node.attrs) if node.attrs else prim.impl
            if count == 2:
                self.emit((P2, dst, fn, regs[0], regs[1], node))
            elif count == 1:
                self.emit((P1, dst, fn, regs[0], node))
            elif count == 3:
                self.emit((P3, dst, fn, regs[0], regs[1], regs[2], node))
            else:
                self.emit((PN, dst, fn, make_getter(regs), node), tuple(regs))
            self.reg[node] = dst
            return False
        if isinstance(head, ValueNode) and isinstance(head.value, FuncGraph):
            callee = head.value
            if len(callee.parameters) != count:
                self.fail(node, ArityError(
                    f"@{callee.name} takes {_plural(len(callee.parameters))}, got {count}",
                    node.loc))
                return False
            regs = [self.operand(a, node) for a in args] + self.captured(callee, node)
            dst = self.new_reg()
            self.emit((TCALLG if tail else CALLG, dst, GraphCell(callee), make_getter(regs), node),
                      tuple(regs))
            self.reg[node] = dst
            return tail
        switch = fused.get(node)
        if switch is not None:
            cond = self.operand(switch.inputs[1], switch)
            arg_regs = [self.operand(a, node) for a in args]
            then_node, else_node = switch.inputs[2], switch.inputs[3]
            assert isinstance(then_node, ValueNode) and isinstance(else_node, ValueNode)  # (fusable_switches)
            then_g = then_node.value
            else_g = else_node.value
            then_regs = arg_regs + self.captured(then_g, switch)
            else_regs = arg_regs + self.captured(else_g, switch)
            dst = self.new_reg()
            self.emit((TBRANCH if tail else BRANCH, dst, cond,
                       GraphCell(then_g), make_getter(then_regs),
                       GraphCell(else_g), make_getter(else_regs), node),
                      (cond, *then_regs, *else_regs))
            self.reg[node] = dst
            return tail
        fn_reg = self.operand(head, node)
        regs = [self.operand(a, node) for a in args]
        dst = self.new_reg()
        self.emit((TCALL if tail else CALL, dst, fn_reg, make_getter(regs), node), (fn_reg, *regs))
        self.reg[node] = dst
        return tail

    def fast_call(self, node: CNode, prim: Primitive, path: FastPath, args: Sequence[Node]) -> bool:
        """Emit a call of a primitive with a fast path (F1, F2, K2, K2L); False
        when the fast path can never apply (the caller emits a plain call)."""
        if len(args) not in (1, 2):
            return False
        # A constant operand's type is known now: one the fast path does not take
        # means it never applies (``x * 2``: ints are not ``mul``'s), one it takes
        # is the type the other operand must have (``x * 1.5``: a float).
        known = [type(a.value) if isinstance(a, ValueNode) else None for a in args]
        if any(kind is not None and kind not in path.types for kind in known):
            return False
        impl = prim.impl
        if len(args) == 1:
            a = self.operand(args[0], node)
            instr: tuple = (F1, self.new_reg(), path.fast, a, path.types, impl, node)
        elif known[1] is not None:
            a = self.operand(args[0], node)
            const = args[1]
            assert isinstance(const, ValueNode)  # (known)
            instr = (K2, self.new_reg(), path.fast, a, const.value, known[1], impl, node)
        elif known[0] is not None:
            const = args[0]
            assert isinstance(const, ValueNode)  # (known)
            b = self.operand(args[1], node)
            instr = (K2L, self.new_reg(), path.fast, const.value, b, known[0], impl, node)
        else:
            a, b = self.operand(args[0], node), self.operand(args[1], node)
            instr = (F2, self.new_reg(), path.fast, a, b, path.types, impl, node)
        self.emit(instr)
        self.reg[node] = instr[1]
        return True

    def fail(self, node: CNode, error: AnfirError) -> None:
        # The error is raised only if evaluation reaches the node (the program
        # may never take that path); its value slot stays empty.
        self.reg[node] = self.new_reg()
        self.emit((RAISE, error, node))

    def run(self) -> Code:
        graph = self.graph
        if not graph.has_output:
            raise IRConsistencyError(f"graph @{graph.name} has no output", graph.loc)
        cnodes = [n for n in toposort(graph, self.manager) if isinstance(n, CNode)]
        fused = self.fusable_switches(cnodes)
        skip = set(fused.values())
        output = graph.output
        tail_done = False
        for node in cnodes:
            if node in skip:
                continue
            tail_done = self.call(node, node is output, fused)
        if not tail_done:
            self.emit((RET, self.operand(output, output), output))
        return Code(graph, len(graph.parameters), len(self.fvs), self.template, self.instrs,
                    self.operands, self.manager)


def compile_graph(graph: FuncGraph) -> Code:
    """Compile ``graph`` (managing it first if nobody does) into :class:`Code`."""
    manager = graph.manager or manage(graph)
    return _Compiler(graph, manager).run()


def disassemble(graph: FuncGraph) -> str:
    """The compiled code of ``graph`` as text, one instruction a line (for debugging)."""
    code = code_for(graph)
    lines = [f"@{graph.name}: {code.nparams} params, {code.nfree} captured, "
             f"{len(code.template)} template slots"]
    for instr, operands in zip(code.instrs, code.operands):
        op = instr[0]
        name = NAMES[op]
        if op in (P1, P2, P3):
            fn = instr[2]
            text = f"r{instr[1]} = {_fn_name(fn)}({', '.join(f'r{r}' for r in instr[3:-1])})"
        elif op in (F1, F2, K2, K2L):
            # The primitive's name (``mul``): the fast function is its impl's unchecked twin.
            shown = {F1: [f"r{instr[3]}"], F2: [f"r{instr[3]}", f"r{instr[4]}"],
                     K2: [f"r{instr[3]}", _const_text(instr[4])],
                     K2L: [_const_text(instr[3]), f"r{instr[4]}"]}[op]
            text = f"r{instr[1]} = {instr[-1].inputs[0].value.name}({', '.join(shown)})"
        elif op == PN:
            text = f"r{instr[1]} = {_fn_name(instr[2])}({', '.join(f'r{r}' for r in operands)})"
        elif op == RET:
            text = f"r{instr[1]}"
        elif op == CLOSURE:
            text = f"r{instr[1]} = closure @{instr[2].name} [{', '.join(f'r{r}' for r in operands)}]"
        elif op in (CALLG, TCALLG):
            text = f"r{instr[1]} = @{instr[2].graph.name}({', '.join(f'r{r}' for r in operands)})"
        elif op in (BRANCH, TBRANCH):
            text = f"r{instr[1]} = r{instr[2]} ? @{instr[3].graph.name} : @{instr[5].graph.name}"
        elif op in (CALL, TCALL):
            text = f"r{instr[1]} = r{operands[0]}({', '.join(f'r{r}' for r in operands[1:])})"
        else:
            text = str(instr[1])
        lines.append(f"  {name:8} {text}")
    return "\n".join(lines)


def _fn_name(fn: Any) -> str:
    """A primitive's function as :func:`disassemble` shows it (``_sum[axis=1]``)."""
    if isinstance(fn, functools.partial):
        bound = ", ".join(f"{k}={v!r}" for k, v in fn.keywords.items())
        return f"{_fn_name(fn.func)}[{bound}]"
    return str(getattr(fn, "__name__", fn))


def _const_text(value: Any) -> str:
    """A constant operand as :func:`disassemble` shows it (an array by its shape)."""
    shape = getattr(value, "shape", None)
    return f"array{list(shape)}" if shape is not None else repr(value)

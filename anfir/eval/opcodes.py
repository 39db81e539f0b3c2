"""Instruction kinds of the evaluator's flat code.

Every instruction is a tuple whose first item is one of these small ints and
whose last item is the CNode it comes from (for located errors).  Operands are
register indices into the frame's register list (see ``compiler.Code``).

The VM tests the kinds in the order below, most frequent first, so the common
case (arithmetic with two arguments) costs one comparison.
"""

from __future__ import annotations

F2 = 13
"""``(F2, dst, fast, a, b, types, impl, node)``: a primitive with a fast path
(:mod:`anfir.eval.fastpath`): ``regs[dst] = fast(x, y)`` when ``x = regs[a]`` and
``y = regs[b]`` have the same type and it is in ``types``, else (or when ``fast``
raises) ``impl(x, y)``."""
F1 = 14
"""``(F1, dst, fast, a, types, impl, node)``: the same for one argument."""
P2 = 0
"""``(P2, dst, fn, a, b, node)``: ``regs[dst] = fn(regs[a], regs[b])``."""
P1 = 1
"""``(P1, dst, fn, a, node)``: ``regs[dst] = fn(regs[a])``."""
CALLG = 2
"""``(CALLG, dst, cell, getter, node)``: call the known graph ``cell.graph``;
``getter(regs)`` is the tuple of its arguments followed by its captured values."""
BRANCH = 3
"""``(BRANCH, dst, cond, cell_true, getter_true, cell_false, getter_false, node)``:
``switch(c, ✓g, ✗g)(args)`` fused: call the chosen branch graph directly, no
closure object is made."""
RET = 4
"""``(RET, src, node)``: return ``regs[src]`` to the caller."""
P3 = 5
"""``(P3, dst, fn, a, b, c, node)``: ``regs[dst] = fn(regs[a], regs[b], regs[c])``."""
PN = 6
"""``(PN, dst, fn, getter, node)``: ``regs[dst] = fn(*getter(regs))`` (0 or >3 arguments)."""
CLOSURE = 7
"""``(CLOSURE, dst, graph, getter, node)``: ``regs[dst] = Closure(graph, getter(regs))``."""
TCALLG = 8
"""Like CALLG in tail position: the callee's frame replaces the current one."""
TBRANCH = 9
"""Like BRANCH in tail position."""
CALL = 10
"""``(CALL, dst, fn_reg, getter, node)``: call whatever function value ``regs[fn_reg]`` holds."""
TCALL = 11
"""Like CALL in tail position."""
RAISE = 12
"""``(RAISE, error, node)``: raise ``error`` (a call found ill-formed at compile time,
raised only if evaluation reaches it)."""

NAMES = {P2: "p2", P1: "p1", CALLG: "callg", BRANCH: "branch", RET: "ret", P3: "p3",
         PN: "pn", CLOSURE: "closure", TCALLG: "tcallg", TBRANCH: "tbranch", CALL: "call",
         TCALL: "tcall", RAISE: "raise", F2: "f2", F1: "f1"}
"""Mnemonics for :func:`anfir.eval.compiler.disassemble`."""

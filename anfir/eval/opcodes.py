"""Instruction kinds of the evaluator's flat code.

Every instruction is a tuple whose first item is one of these small ints and
whose last item is the CNode it comes from (for located errors).  Operands are
register indices into the frame's register list (see ``compiler.Code``).

The VM tests the kinds in number order, most frequent first: arithmetic with
a constant (one comparison), arithmetic on two registers (two); then
``op < CALLG`` sends the other primitive calls, numbered below ``CALLG``, to
their own tests, so that a call of a known graph is reached after four
comparisons, not after every kind of primitive call.
"""

from __future__ import annotations

K2 = 0
"""``(K2, dst, fast, a, k, ktype, impl, node)``: a primitive with a fast path
(:mod:`anfir.eval.fastpath`) whose second operand is the constant ``k`` (of a
type the fast path takes, ``ktype``): ``regs[dst] = fast(x, k)`` when
``x = regs[a]`` is a ``ktype`` too, else (or when ``fast`` raises) ``impl(x, k)``
(``x * 1.0001``, ``i + 1``: the type of one operand is known when compiling)."""
F2 = 1
"""``(F2, dst, fast, a, b, types, impl, node)``: a primitive with a fast path:
``regs[dst] = fast(x, y)`` when ``x = regs[a]`` and ``y = regs[b]`` have the same
type and it is in ``types``, else (or when ``fast`` raises) ``impl(x, y)``."""
P2 = 2
"""``(P2, dst, fn, a, b, node)``: ``regs[dst] = fn(regs[a], regs[b])``."""
P1 = 3
"""``(P1, dst, fn, a, node)``: ``regs[dst] = fn(regs[a])``."""
F1 = 4
"""``(F1, dst, fast, a, types, impl, node)``: F2 for one argument."""
K2L = 5
"""``(K2L, dst, fast, k, b, ktype, impl, node)``: K2 with the constant as the first
operand (``1.0 - x``)."""
P3 = 6
"""``(P3, dst, fn, a, b, c, node)``: ``regs[dst] = fn(regs[a], regs[b], regs[c])``."""
PN = 7
"""``(PN, dst, fn, getter, node)``: ``regs[dst] = fn(*getter(regs))`` (0 or >3 arguments)."""
CALLG = 8
"""``(CALLG, dst, cell, getter, node)``: call the known graph ``cell.graph``;
``getter(regs)`` is the tuple of its arguments followed by its captured values."""
TCALLG = 9
"""Like CALLG in tail position: the callee's frame replaces the current one."""
BRANCH = 10
"""``(BRANCH, dst, cond, cell_true, getter_true, cell_false, getter_false, node)``:
``switch(c, ✓g, ✗g)(args)`` fused: call the chosen branch graph directly, no
closure object is made."""
TBRANCH = 11
"""Like BRANCH in tail position."""
RET = 12
"""``(RET, src, node)``: return ``regs[src]`` to the caller."""
CLOSURE = 13
"""``(CLOSURE, dst, graph, getter, node)``: ``regs[dst] = Closure(graph, getter(regs))``."""
CALL = 14
"""``(CALL, dst, fn_reg, getter, node)``: call whatever function value ``regs[fn_reg]`` holds."""
TCALL = 15
"""Like CALL in tail position."""
RAISE = 16
"""``(RAISE, error, node)``: raise ``error`` (a call found ill-formed at compile time,
raised only if evaluation reaches it)."""

NAMES = {P2: "p2", P1: "p1", CALLG: "callg", BRANCH: "branch", RET: "ret", P3: "p3",
         PN: "pn", CLOSURE: "closure", TCALLG: "tcallg", TBRANCH: "tbranch", CALL: "call",
         TCALL: "tcall", RAISE: "raise", F2: "f2", F1: "f1", K2: "k2", K2L: "k2l"}
"""Mnemonics for :func:`anfir.eval.compiler.disassemble`."""

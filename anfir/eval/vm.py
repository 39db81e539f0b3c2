"""The VM: runs compiled code with an explicit frame stack.

A call pushes ``(instruction iterator, registers, destination)`` on a Python
list and switches to the callee's code; ``RET`` pops it.  Python's own stack
never grows with the program's call depth, so deep (non-tail) recursion is
bounded only by memory.  A call in tail position (``TCALLG``, ``TBRANCH``,
``TCALL``) replaces the current frame instead of pushing one, so a loop
written as tail recursion runs in constant memory.

List iterators are resumable: a frame's "program counter" is simply its
iterator over the instruction list, so the inner loop is a plain ``for``.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from anfir import limits
from anfir.errors import (AnfirError, AnfirRuntimeError, AnfirTypeError, ArityError,
                          ShapeError)
from anfir.eval.compiler import Code, arity_words, code_for
from anfir.eval.describe import describe
from anfir.eval.opcodes import (BRANCH, CALL, CALLG, CLOSURE, F1, F2, K2, K2L, P1, P2, P3, PN,
                                RAISE, RET, TBRANCH, TCALL, TCALLG)
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.runtime_values import Closure, Partial

_bool_ = np.bool_


def enter(fn: Any, args: tuple) -> tuple[Optional[Code], Any]:
    """Start calling the function value ``fn`` on ``args``.

    Returns ``(code, registers)`` when ``fn`` is a graph (the caller runs the
    frame) and ``(None, result)`` when it was evaluated on the spot (primitives,
    meta functions).  Errors raised here carry no location: the caller knows
    the call site.
    """
    while isinstance(fn, Partial):
        args = (*fn.args, *args)
        fn = fn.fn
    if isinstance(fn, Closure):
        code = code_for(fn.graph)
        check_graph_call(code, len(args), len(fn.env))
        return code, [*args, *fn.env, *code.template]
    if isinstance(fn, Primitive):
        if not fn.accepts(len(args)):
            raise ArityError(f"{fn.name} takes {arity_words(fn)}, got {len(args)}")
        return None, fn.impl(*args)
    if isinstance(fn, FuncGraph):
        code = code_for(fn)
        check_graph_call(code, len(args), 0)
        return code, [*args, *code.template]
    if isinstance(fn, MetaFunction):
        if not fn.accepts(len(args)):
            raise ArityError(f"{fn.name} takes {arity_words(fn)}, got {len(args)}")
        if fn.generate is None:
            raise AnfirRuntimeError(f"{fn.name} cannot be evaluated directly")
        # The call is the generated graph's call on the same arguments: entered
        # here, it runs in this frame loop (no Python recursion).
        return enter(fn.generate(args), args)
    raise AnfirTypeError(f"calling a non-function ({describe(fn)})")


def check_graph_call(code: Code, nargs: int, nenv: int) -> None:
    """Raise the (unlocated) error of calling ``code`` with ``nargs`` arguments
    and ``nenv`` captured values, if they do not fit it."""
    if nargs != code.nparams:
        words = "1 argument" if code.nparams == 1 else f"{code.nparams} arguments"
        raise ArityError(f"@{code.graph.name} takes {words}, got {nargs}")
    if nenv != code.nfree:
        raise AnfirRuntimeError(f"@{code.graph.name} captures {code.nfree} values but was "
                                f"called with {nenv} (a closure made before the graph changed?)")


def _too_deep(limit: int) -> AnfirRuntimeError:
    return AnfirRuntimeError(
        f"recursion too deep: more than {limit:,} nested calls (a recursion that never ends?)",
        hint="the limit is anfir.limits.MAX_CALL_DEPTH (the command line's --max-depth)")


def _bad_condition(value: Any) -> AnfirTypeError:
    return AnfirTypeError(f"a condition must be a bool, not {describe(value)}")


def execute(code: Code, regs: list) -> Any:
    """Run ``code`` in a frame with registers ``regs`` until it returns; its result.

    Errors are located at the CNode being evaluated (see :func:`locate`).
    """
    stack: list[tuple[Any, list, tuple]] = []
    max_depth = limits.MAX_CALL_DEPTH
    it = iter(code.instrs)
    ins: Optional[tuple] = None
    tail_site: Optional[tuple] = None  # the last tail call: it left no frame behind
    try:
        while True:
            for ins in it:
                op = ins[0]
                if op == K2:
                    # Arithmetic with a constant: Python's operator when the other
                    # operand has the constant's type, else the primitive's impl.
                    x = regs[ins[3]]
                    if type(x) is ins[5]:
                        try:
                            regs[ins[1]] = ins[2](x, ins[4])
                        except Exception:  # noqa: BLE001 - (x / 0.0, a domain error): the impl answers
                            regs[ins[1]] = ins[6](x, ins[4])
                    else:
                        regs[ins[1]] = ins[6](x, ins[4])
                elif op == F2:
                    # Arithmetic: Python's operator when both operands have one
                    # type the primitive's fast path takes, else its checked impl.
                    x = regs[ins[3]]
                    y = regs[ins[4]]
                    # (chained: type(x) is type(y) and type(y) in types)
                    if type(x) is type(y) in ins[5]:
                        try:
                            regs[ins[1]] = ins[2](x, y)
                        except Exception:  # noqa: BLE001 - (x / 0.0, a domain error): the impl answers
                            regs[ins[1]] = ins[6](x, y)
                    else:
                        regs[ins[1]] = ins[6](x, y)
                elif op < CALLG:  # the other primitive calls (see opcodes)
                    if op == P2:
                        regs[ins[1]] = ins[2](regs[ins[3]], regs[ins[4]])
                    elif op == P1:
                        regs[ins[1]] = ins[2](regs[ins[3]])
                    elif op == F1:
                        x = regs[ins[3]]
                        if type(x) in ins[4]:
                            try:
                                regs[ins[1]] = ins[2](x)
                            except Exception:  # noqa: BLE001 - (log(0.0), exp(1e3)): the impl answers
                                regs[ins[1]] = ins[5](x)
                        else:
                            regs[ins[1]] = ins[5](x)
                    elif op == K2L:
                        y = regs[ins[4]]
                        if type(y) is ins[5]:
                            try:
                                regs[ins[1]] = ins[2](ins[3], y)
                            except Exception:  # noqa: BLE001 - (1.0 / 0.0): the impl answers
                                regs[ins[1]] = ins[6](ins[3], y)
                        else:
                            regs[ins[1]] = ins[6](ins[3], y)
                    elif op == P3:
                        regs[ins[1]] = ins[2](regs[ins[3]], regs[ins[4]], regs[ins[5]])
                    else:  # PN
                        regs[ins[1]] = ins[2](*ins[3](regs))
                elif op == CALLG or op == TCALLG:
                    cell = ins[2]
                    callee = cell.code
                    if (callee is None or callee.manager is not cell.graph.manager
                            or callee.epoch != callee.manager.epoch):
                        callee = cell.refresh()
                    new = [*ins[3](regs), *callee.template]
                    if op == CALLG:
                        stack.append((it, regs, ins))
                        if len(stack) > max_depth:
                            raise _too_deep(max_depth)
                    else:
                        tail_site = ins
                    regs = new
                    it = iter(callee.instrs)
                    break
                elif op == BRANCH or op == TBRANCH:
                    cond = regs[ins[2]]
                    if cond is True:
                        cell, get = ins[3], ins[4]
                    elif cond is False:
                        cell, get = ins[5], ins[6]
                    elif type(cond) is _bool_:
                        cell, get = (ins[3], ins[4]) if cond else (ins[5], ins[6])
                    else:
                        raise _bad_condition(cond)
                    callee = cell.code
                    if (callee is None or callee.manager is not cell.graph.manager
                            or callee.epoch != callee.manager.epoch):
                        callee = cell.refresh()
                    new = [*get(regs), *callee.template]
                    if op == BRANCH:
                        stack.append((it, regs, ins))
                        if len(stack) > max_depth:
                            raise _too_deep(max_depth)
                    regs = new
                    it = iter(callee.instrs)
                    break
                elif op == RET:
                    value = regs[ins[1]]
                    if not stack:
                        return value
                    it, regs, caller = stack.pop()
                    regs[caller[1]] = value
                    break
                elif op == CLOSURE:
                    regs[ins[1]] = Closure(ins[2], ins[3](regs))
                elif op == CALL or op == TCALL:
                    fn = regs[ins[2]]
                    args = ins[3](regs)
                    if type(fn) is Closure:
                        callee = code_for(fn.graph)
                        env = fn.env
                        if len(args) != callee.nparams or len(env) != callee.nfree:
                            check_graph_call(callee, len(args), len(env))
                        new = [*args, *env, *callee.template]
                    else:
                        callee, new = enter(fn, args)
                    if callee is not None:
                        if op == CALL:
                            stack.append((it, regs, ins))
                            if len(stack) > max_depth:
                                raise _too_deep(max_depth)
                        else:
                            tail_site = ins
                        regs = new
                        it = iter(callee.instrs)
                        break
                    if op == CALL:
                        regs[ins[1]] = new
                    else:
                        # A tail call that finished on the spot: return its value.
                        if not stack:
                            return new
                        it, regs, caller = stack.pop()
                        regs[caller[1]] = new
                        break
                elif op == RAISE:
                    error = ins[1]
                    raise type(error)(error.message, error.loc, error.hint)
                else:  # pragma: no cover - the compiler emits only the kinds above
                    raise AnfirRuntimeError(f"unknown instruction {ins!r}")
    except AnfirError as exc:
        if exc.loc is None and ins is not None:
            attach_location(exc, ins[-1])
        if exc.loc is None:
            # Generated code (e.g. the graph behind a run-time grad) has no
            # source: point at the nearest user call that led there.
            sites = [tail_site] + [call for _, _, call in reversed(stack)]
            for call in sites:
                if call is not None and _node_loc(call[-1]) is not None:
                    attach_location(exc, call[-1])
                    break
        raise
    except Exception as exc:  # a primitive's numpy / Python error
        raise locate(exc, ins[-1] if ins is not None else None) from exc


def attach_location(exc: AnfirError, node: Optional[Node]) -> None:
    """Give an unlocated AnfirError the location of ``node`` (or of its graph)."""
    loc = _node_loc(node)
    if loc is not None:
        exc.loc = loc
        exc.args = (exc.render(),)


def _node_loc(node: Optional[Node]) -> Any:
    if node is None:
        return None
    if node.loc is not None:
        return node.loc
    return node.graph.loc if node.graph is not None else None


_SHAPE_WORDS = ("shape", "broadcast", "dimension", "size", "align")


def locate(exc: Exception, node: Optional[Node]) -> AnfirError:
    """The located AnfirError standing for the Python exception ``exc`` raised at ``node``.

    ``TypeError`` becomes :class:`AnfirTypeError`; a ``ValueError`` about shapes
    (numpy broadcasting, matmul, reshape) a :class:`ShapeError`; anything else
    (division by zero, overflow, bad index...) an :class:`AnfirRuntimeError`.
    """
    what = _callee_name(node)
    text = f"{what}: {exc}" if what else str(exc) or type(exc).__name__
    if isinstance(exc, TypeError):
        kind: type[AnfirError] = AnfirTypeError
    elif isinstance(exc, ValueError) and any(w in str(exc).lower() for w in _SHAPE_WORDS):
        kind = ShapeError
    else:
        kind = AnfirRuntimeError
    return kind(text, _node_loc(node))


def _callee_name(node: Optional[Node]) -> str:
    if not isinstance(node, CNode) or not node.inputs:
        return ""
    head = node.inputs[0]
    if isinstance(head, ValueNode):
        value = head.value
        if isinstance(value, (Primitive, MetaFunction)):
            return value.name
        if isinstance(value, FuncGraph):
            return f"@{value.name}"
    return head.name or ""

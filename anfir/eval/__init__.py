"""The evaluator: FuncGraphs compiled once to flat code, run by a stackless VM.

* :func:`run` evaluates a graph (or a Module's entry, or a closure) on Python
  scalars, bools, strings, None, tuples and numpy arrays.
* :func:`call_function` calls any runtime function value (used by autodiff).
* :func:`anfir.eval.compiler.disassemble` shows the compiled code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from anfir.abstract.dimranges import check_argument_ranges
from anfir.abstract.values import AString, ATuple, GraphSig
from anfir.errors import AnfirError, AnfirTypeError
from anfir.eval.compiler import code_for, compile_graph, disassemble
from anfir.eval.vm import attach_location, check_graph_call, enter, execute, locate
from anfir.ir.graph import FuncGraph, Module
from anfir.runtime_values import Closure, Partial


def call_function(fn: Any, args: tuple) -> Any:
    """Call the function value ``fn`` (FuncGraph, Closure, Partial, Primitive,
    MetaFunction) on ``args`` and return the result.

    Errors raised before any node runs (wrong arity, a non-function) are
    located at the called graph's definition when it has one.
    """
    try:
        code, started = enter(fn, tuple(args))
    except AnfirError as exc:
        _locate_at_definition(exc, fn)
        raise
    except Exception as exc:  # a primitive called directly
        raise locate(exc, None) from exc
    if code is None:
        return started
    return execute(code, started)


def _locate_at_definition(exc: AnfirError, fn: Any) -> None:
    """Give an unlocated error the location of ``fn``'s graph definition, if any."""
    if exc.loc is None:
        graph = _graph_of(fn)
        if graph is not None and graph.loc is not None:
            exc.loc = graph.loc
            exc.args = (exc.render(),)


def _graph_of(fn: Any) -> "FuncGraph | None":
    while isinstance(fn, Partial):
        fn = fn.fn
    if isinstance(fn, FuncGraph):
        return fn
    if isinstance(fn, Closure):
        return fn.graph
    return None


def run(graph: Any, *args: Any) -> Any:
    """Evaluate ``graph`` (a FuncGraph, a Module — its entry —, a Closure, or any
    function value) on ``args``; returns Python/numpy values (functions come back
    as FuncGraph, Closure, Partial or Primitive objects)."""
    if isinstance(graph, Module):
        graph = graph.entry
    if any(type(a) not in _NATIVE for a in args):
        args = tuple(host_value(a, i) for i, a in enumerate(args))
    if not isinstance(graph, FuncGraph):
        return call_function(graph, args)
    # A graph, the common case, in one cache lookup (a small program's whole
    # evaluation costs a few of ``call_function``'s layers).
    try:
        code = code_for(graph)
        if len(args) != code.nparams or code.nfree:
            check_graph_call(code, len(args), 0)
    except AnfirError as exc:
        _locate_at_definition(exc, graph)
        raise
    # Sizes outside the ranges the graph declares for its dimension variables
    # (an imported torch.export Dim's) are refused once, before any node runs.
    check_argument_ranges(graph, args)
    sig = graph.abstract
    if sig is not None and sig is not code.string_free and isinstance(sig, GraphSig):
        if not check_specialized_arguments(graph, sig, args):
            code.string_free = sig  # nothing to compare on later runs either
    return execute(code, [*args, *code.template])


_NATIVE = frozenset({np.ndarray, int, float, bool, complex, str, tuple, type(None)})
"""Argument types the evaluator takes as they are (the common case: one set lookup each)."""


def host_value(value: Any, index: int) -> Any:
    """An argument of another array type as a numpy array: anything with
    ``__array__`` (a CPU ``torch.Tensor``, a JAX array...) or DLPack; tuples
    element by element.  A tensor that requires grad is refused with what to do."""
    if type(value) in _NATIVE or isinstance(value, (np.generic, np.ndarray)):
        return value
    if isinstance(value, tuple):
        return tuple(host_value(v, index) for v in value)
    if hasattr(value, "__array__") or hasattr(value, "__dlpack__"):
        if getattr(value, "requires_grad", False):
            raise AnfirTypeError(
                f"argument {index + 1} is a {type(value).__name__} that requires grad: pass "
                "tensor.detach() (anfir differentiates with anfir.grad, not through autograd)")
        try:
            return np.asarray(value) if hasattr(value, "__array__") else np.from_dlpack(value)
        except (TypeError, RuntimeError, ValueError, BufferError) as err:
            raise AnfirTypeError(f"argument {index + 1} ({type(value).__name__}) cannot be read "
                                 f"as a numpy array: {err}") from None
    return value


def check_specialized_arguments(graph: FuncGraph, sig: GraphSig, args: tuple) -> bool:
    """Refuse arguments that differ from the constants ``graph`` was specialized for.

    The specializer keeps the value of a string argument (a dtype name, a mode such
    as ``"l2"``) and folds what depends on it, so the compiled graph computes the
    result for that value only: any other value is an error, never a silent
    wrong result.  Returns whether ``sig`` holds such a string at all (when it
    does not, no arguments need this check)."""
    if not any(_has_string_constant(p) for p in sig.params):
        return False
    if len(args) != len(sig.params):
        return True  # the call reports the arity error
    for index, (param, expected, arg) in enumerate(zip(graph.parameters, sig.params, args)):
        stack = [(expected, arg)]
        while stack:
            abstract, value = stack.pop()
            if isinstance(abstract, ATuple):
                if isinstance(value, tuple) and len(value) == len(abstract.items):
                    stack.extend(zip(abstract.items, value))
                continue  # (a tuple of another shape: the graph's own code reports it)
            if isinstance(abstract, AString) and isinstance(abstract.value, str) and value != abstract.value:
                raise AnfirTypeError(
                    f"@{graph.name} was compiled for argument {index + 1} ({param.name}) "
                    f"containing the string {abstract.value!r}, and cannot run with {value!r}: "
                    "its result was computed for that string; compile it with this value",
                    graph.loc)
    return True


def _has_string_constant(abstract: Any) -> bool:
    """Whether ``abstract`` is, or (in nested tuples) holds, a known string."""
    stack = [abstract]
    while stack:
        item = stack.pop()
        if isinstance(item, ATuple):
            stack.extend(item.items)
        elif isinstance(item, AString) and isinstance(item.value, str):
            return True
    return False


__all__ = ["attach_location", "call_function", "code_for", "compile_graph", "disassemble",
           "run"]

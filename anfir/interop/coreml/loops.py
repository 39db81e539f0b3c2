"""Loops (the flat program's do-while :class:`~anfir.flat.statements.LoopOp`) in MIL.

A LoopOp is ``state = init; do { flag, *state = body(*state) } while flag``.  It is
written two ways:

* **exported** (:func:`write_while_loop`): one MIL ``while_loop`` over
  ``(flag, *state)`` whose cond block returns the flag and whose body block is the
  LoopOp's body.  coremltools types a ``while_loop`` by building its body twice:
  once with the loop variables' build-time values (``sym_val``), then, for each
  variable whose value changed, with no value — and it refuses a body whose
  outputs still differ from its inputs after that second build.  A counted loop
  (every ``scan``/``fori_loop``, and their gradients) starts from constants and
  needs one build per step before its values stop changing (the counter changes
  in the first build, the flag computed from it in the second), so it is refused.
  The loop is therefore written so that no loop variable has a build-time value:
  the initial values go through ``select(live, v, v)`` where ``live`` is a ``true``
  coremltools cannot compute at build time (derived from a program input, see
  :func:`live_true`), and a body output that does have one (a state the body sets
  to a constant) through ``select(flag, v, v)`` with the body's own flag input.
  ``select`` of a value with itself is that value: the model computes the same
  numbers; only build-time folding is prevented.
* **evaluated** (:func:`unroll`, inputs are constants: :func:`~anfir.interop.coreml.
  exporter.evaluate`): MIL's ``while_loop`` has no value inference, so the body is
  written once per iteration with the current state as its inputs; each op's
  value is coremltools' own inference of that op (the same MIL ops the exported
  body holds), and the flag's value decides whether another iteration follows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from anfir.abstract.values import AScalar
from anfir.errors import ExportError
from anfir.flat.statements import LoopOp, dtype_of_type

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.coreml.exporter import MilWriter

MAX_UNROLLED_ITERATIONS = 10_000
"""How many iterations :func:`unroll` writes before it refuses (each one adds the
body's ops to the evaluated program: a loop that does not end must not hang)."""


def zero_d(w: "MilWriter", var: Any) -> Any:
    """``var`` as a 0-d tensor when it is a scalar: MIL compares loop-carried types
    strictly (a 0-d tensor is not a scalar)."""
    if not var.shape:
        return w.reshape(var, np.zeros((0,), dtype=np.int32))
    return var


def live_true(w: "MilWriter") -> Optional[Any]:
    """A 0-d ``true`` that coremltools cannot compute at build time, or None when the
    program has no input to derive it from.  It is ``x == x or x != x`` on the first
    element of ``concat(flatten(p), [0])`` for the first program input ``p`` with no
    build-time value: true for every ``x`` (nan included), and defined for an empty
    input too (the appended 0 is read then)."""
    for value in w.flat.inputs:
        var = w.vars.get(id(value))
        if var is None or var.sym_val is not None:
            continue
        if w.types.builtin_to_string(var.dtype) == "bool":
            var = w.op("cast", x=var, dtype="int32")
        flat = w.op("reshape", x=var, shape=np.array([-1], dtype=np.int32))
        pad = w.mb.const(val=np.zeros((1,), dtype=w.types.nptype_from_builtin(var.dtype)),
                         name=w.names.take("const"))
        padded = w.op("concat", values=[flat, pad], axis=0)
        first = w.op("slice_by_size", x=padded, begin=np.array([0], dtype=np.int32),
                     size=np.array([1], dtype=np.int32))
        same = w.op("logical_or", x=w.op("equal", x=first, y=first),
                    y=w.op("not_equal", x=first, y=first))
        return w.op("reshape", x=same, shape=np.zeros((0,), dtype=np.int32))
    return None


def _unfolded(w: "MilWriter", var: Any, live: Any) -> Any:
    """``var`` itself, as a value coremltools cannot fold (``select(live, var, var)``)
    when it has a build-time value; unchanged otherwise."""
    if var.sym_val is None:
        return var
    return w.op("select", cond=live, a=var, b=var)


def write_while_loop(w: "MilWriter", op: LoopOp) -> None:
    """``op`` as one MIL ``while_loop`` over ``(flag, *state)``, flag first true, with
    no loop variable foldable at build time (see the module documentation)."""
    params = op.body.params
    live = live_true(w)
    if live is None:
        raise ExportError("a loop in a program without inputs cannot be written as a Core ML "
                          "while_loop: coremltools would compute its state at build time, "
                          "which its while_loop typing refuses", op.loc,
                          hint="give the program an input the loop's state depends on")
    init = [live]
    init += [_unfolded(w, zero_d(w, w.tensor(o, dtype_of_type(p.type))), live)
             for o, p in zip(op.init, params)]
    types = [AScalar("bool"), *(p.type for p in params)]

    def cond(flag: Any, *state: Any) -> Any:
        return flag

    def body(flag: Any, *state: Any) -> Any:
        for param, var in zip(params, state):
            w.vars[id(param)] = var
        w._write_block(op.body)
        return tuple(_unfolded(w, zero_d(w, w.tensor(o, dtype_of_type(t))), flag)
                     for o, t in zip(op.body.results, types))

    name = w.names.take((op.results[0].name if op.results else "loop") + "_loop")
    try:
        outs = w.mb.while_loop(_cond=cond, _body=body, loop_vars=tuple(init), name=name)
    except ValueError as exc:  # coremltools' typing of the loop state
        raise ExportError(f"coremltools cannot build this while_loop: {exc}", op.loc) from None
    for value, var in zip(op.results, list(outs)[1:]):
        w.vars[id(value)] = var


def unroll(w: "MilWriter", op: LoopOp) -> None:
    """``op`` with constant inputs: the body written once per iteration, its values
    inferred by coremltools, until the flag it computes is false."""
    params = op.body.params
    state = [w.tensor(o, dtype_of_type(p.type)) for o, p in zip(op.init, params)]
    types = [AScalar("bool"), *(p.type for p in params)]
    for _ in range(MAX_UNROLLED_ITERATIONS):
        for param, var in zip(params, state):
            w.vars[id(param)] = var
        w._write_block(op.body)
        w.loc = op.loc
        outs = [w.tensor(o, dtype_of_type(t)) for o, t in zip(op.body.results, types)]
        flag = outs[0].val
        if flag is None:
            raise ExportError("coremltools cannot compute this loop's condition at build time "
                              "(an op of its body has no value inference)", op.loc)
        state = outs[1:]
        if not bool(np.asarray(flag).reshape(())):
            break
    else:
        raise ExportError(f"the loop did not end within {MAX_UNROLLED_ITERATIONS} iterations "
                          "(evaluating a Core ML program unrolls its loops)", op.loc)
    for value, var in zip(op.results, state):
        w.vars[id(value)] = var


__all__ = ["MAX_UNROLLED_ITERATIONS", "live_true", "unroll", "write_while_loop", "zero_d"]

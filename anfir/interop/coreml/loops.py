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

import inspect
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

import numpy as np

from anfir.abstract.values import AScalar
from anfir.errors import ExportError
from anfir.flat.statements import LoopOp, dtype_of_type

if TYPE_CHECKING:  # pragma: no cover
    from anfir.interop.coreml.exporter import MilWriter

MAX_UNROLLED_ITERATIONS = 10_000
"""How many iterations :func:`unroll` writes before it refuses (each one adds the
body's ops to the evaluated program: a loop that does not end must not hang)."""

MAX_RUN_ITERATIONS = 1_000_000
"""How many iterations of one ``while_loop`` :func:`run_program` runs before it refuses."""


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


# -- running an exported program ----------------------------------------------------------
def run_program(program: Any, feeds: Mapping[str, Any],
                evaluators: Optional[Mapping[str, Callable[..., Any]]] = None) -> dict[str, Any]:
    """What the exported MIL ``program`` (its function ``main``, loops and all)
    computes for ``feeds`` (input name → value in the model's own form: scalars of
    shape ``(1,)``, booleans as int32), by output name.

    Core ML prediction needs macOS; this runs the very program that is converted,
    on any machine: each op's value is coremltools' value inference of the same op
    built with constant inputs (``evaluators``, as for :func:`~anfir.interop.coreml.
    exporter.evaluate`, stand for the ops it has none for); ``while_loop`` runs its
    cond and body blocks until the cond is false and ``cond`` the branch its
    predicate picks.  Blocks nest at most :data:`~anfir.interop.coreml.exporter.
    MAX_CONTROL_DEPTH` deep, so the walk into them is bounded."""
    from coremltools.converters.mil import Builder as mb
    from coremltools.converters.mil.mil import Function

    main = program.functions["main"]
    env: dict[int, Any] = {}
    for name, var in main.inputs.items():
        if name not in feeds:
            raise ExportError(f"no value is given for the input {name}")
        env[id(var)] = np.asarray(feeds[name], dtype=_numpy_dtype(var))
    with Function({}, opset_version=main.opset_version):
        _run_block(main, env, dict(evaluators or {}), mb)
    return {var.name: env[id(var)] for var in main.outputs}


def _numpy_dtype(var: Any) -> Any:
    """The numpy dtype of a MIL var."""
    from coremltools.converters.mil.mil import types

    return types.nptype_from_builtin(var.dtype)


def _value(env: dict[int, Any], var: Any) -> Any:
    """The value of ``var``: computed before, or its build-time value."""
    if id(var) in env:
        return env[id(var)]
    if var.val is None:
        raise ExportError(f"the MIL value {var.name} is read before it is computed")
    return var.val


def _call(evaluator: Callable[..., Any], inputs: dict[str, Any]) -> Any:
    """``evaluator`` of the op's inputs it names (MIL fills in the optional inputs an
    exporter rule left out, e.g. ``validate_indices``; :func:`evaluate` passes the
    ones the rule gave)."""
    params = inspect.signature(evaluator).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return evaluator(**inputs)
    return evaluator(**{k: v for k, v in inputs.items() if k in params})


def _run_block(block: Any, env: dict[int, Any], evaluators: dict[str, Callable[..., Any]],
               mb: Any) -> None:
    """Run the ops of ``block``, writing their outputs' values into ``env``."""
    for op in block.operations:
        if op.op_type == "const":
            env[id(op.outputs[0])] = op.outputs[0].val
            continue
        if op.op_type == "while_loop":
            cond_block, body_block = op.blocks
            values = [_value(env, v) for v in op.loop_vars]
            for _ in range(MAX_RUN_ITERATIONS):
                env.update(zip(map(id, cond_block.inputs), values))
                _run_block(cond_block, env, evaluators, mb)
                if not bool(np.asarray(_value(env, cond_block.outputs[0])).reshape(())):
                    break
                env.update(zip(map(id, body_block.inputs), values))
                _run_block(body_block, env, evaluators, mb)
                values = [_value(env, v) for v in body_block.outputs]
            else:
                raise ExportError(f"the while_loop {op.name} did not end")
            env.update(zip(map(id, op.outputs), values))
            continue
        if op.op_type == "cond":
            branch = op.blocks[0 if bool(np.asarray(_value(env, op.pred)).reshape(())) else 1]
            _run_block(branch, env, evaluators, mb)
            env.update(zip(map(id, op.outputs), (_value(env, v) for v in branch.outputs)))
            continue
        inputs = {name: (tuple(_value(env, v) for v in given) if isinstance(given, (tuple, list))
                         else _value(env, given)) for name, given in op.inputs.items()}
        if op.op_type in evaluators:
            results: Any = [_call(evaluators[op.op_type], inputs)]
        else:
            built = getattr(mb, op.op_type)(**inputs)
            outs = built if isinstance(built, (tuple, list)) else [built]
            results = [o.val for o in outs]
        for var, result in zip(op.outputs, results):
            if result is None:
                raise ExportError(f"coremltools cannot compute the MIL op {op.op_type} "
                                  f"({op.name}): it has no value inference")
            env[id(var)] = np.asarray(result, dtype=_numpy_dtype(var))


__all__ = ["MAX_RUN_ITERATIONS", "MAX_UNROLLED_ITERATIONS", "live_true", "run_program", "unroll", "write_while_loop",
           "zero_d"]

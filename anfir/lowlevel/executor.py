"""Running a low-level program on one preallocated numpy arena.

:class:`Executor` binds every instruction once: each alloc'd buffer is a view
of one ``uint8`` arena at its planned offset (an unplanned program gets a
plan first), inputs and outputs have buffers of their own, constants are
numpy arrays (scalars stay Python numbers, as the evaluator passes them).
Each instruction becomes a function of no arguments — the rule's kernel,
writing with numpy's ``out=``, or the primitive's evaluation copied into the
output view — so a run is a loop of calls that allocates nothing per
instruction (``tests/test_lowlevel.py`` measures it with tracemalloc).  A run
reads the arguments where they are and returns new output arrays.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Optional

import numpy as np

from anfir.dtypes import numpy_dtype
from anfir.errors import AnfirError, AnfirRuntimeError, UsageError
from anfir.lowlevel.plan import plan
from anfir.lowlevel.program import ALIGN, Buffer, Instr, LowProgram
from anfir.lowlevel.rules import RULES, TensorType
from anfir.values import DType


MAX_MEMORY_BYTES = 8 * 1024 ** 3
"""The most memory one executor allocates (arena plus declared buffers), checked before allocating."""


class Executor:
    """A low-level program bound to its memory, ready to run many times."""

    def __init__(self, program: LowProgram) -> None:
        """Allocate the arena and the declared buffers, and bind every instruction."""
        offsets: dict[Buffer, int] = {b: b.offset for b in program.allocs() if b.offset is not None}
        arena_bytes = program.arena_bytes or 0
        if program.arena_bytes is None or len(offsets) < len(program.allocs()):
            offsets, arena_bytes, _ = plan(program)  # an unplanned program: planned here, left as it is
        declared = sum(b.nbytes for b in program.declares)
        if arena_bytes + declared > MAX_MEMORY_BYTES:
            raise UsageError(f"@{program.name} needs {arena_bytes + declared} bytes (arena and declared "
                             f"buffers), beyond anfir.lowlevel.executor.MAX_MEMORY_BYTES = {MAX_MEMORY_BYTES}")
        self.program = program
        raw = np.empty(arena_bytes + ALIGN, dtype=np.uint8)
        start = (-raw.ctypes.data) % ALIGN  # the arena starts on an aligned address
        self.arena = raw[start:start + arena_bytes]
        self.views: dict[Buffer, Any] = {}
        for buffer in program.declares:
            if buffer.kind == "constant":
                value = buffer.value
                self.views[buffer] = value if not buffer.shape else np.asarray(
                    value, dtype=numpy_dtype(buffer.dtype))
            else:
                self.views[buffer] = np.zeros(buffer.shape, dtype=numpy_dtype(buffer.dtype))
        for buffer in program.allocs():
            dtype = numpy_dtype(buffer.dtype)
            offset = offsets[buffer]
            view = self.arena[offset:offset + buffer.nbytes].view(dtype)
            self.views[buffer] = view.reshape(buffer.shape)
        self.instructions = program.instructions()
        self.steps: list[Callable[[], Any]] = [self.bind(i) for i in self.instructions]
        # (each bind is checked: a hand-written .lir may give an instruction operands that do not fit)
        self.inputs = _leaves(program.params)
        self.outputs = [b for b in program.declares if b.kind == "output"]
        self.per_run = [index for index, instr in enumerate(self.instructions)
                        if any(b.kind in ("input", "output") for _, b in instr.operands)]
        """The instructions bound again at each run (they touch its arguments or outputs)."""
        self.fast = sum(1 for step in self.steps if not isinstance(step, _Evaluate))
        """How many instructions run a kernel with ``out=`` (the rest evaluate and copy)."""

    def bind(self, instr: Instr) -> Callable[[], Any]:
        """The instruction as a function of no arguments writing its output view
        (an AnfirRuntimeError at the instruction when its operands do not fit)."""
        try:
            return self._bind(instr)
        except AnfirError:
            raise
        except Exception as error:  # a kernel factory or the evaluation's binding refused the operands
            raise AnfirRuntimeError(f"{instr.prim.name}: cannot bind %{instr.name}: {error!r}",
                                    instr.loc) from None

    def _bind(self, instr: Instr) -> Callable[[], Any]:
        out = self.views[instr.output]
        args = [self.views[b] for b in instr.inputs]
        rule = RULES[instr.prim]
        statics = {k: (DType(v.name) if isinstance(v, DType) else v) for k, v in instr.statics.items()}
        if rule.kernel is not None:
            kernel = rule.kernel(out, args, statics)
            if kernel is not None:
                return kernel
        return _Evaluate(instr, out, args, statics)

    def run(self, *args: Any) -> Any:
        """The program's result for ``args`` (numpy arrays and Python numbers, nested as the entry's).

        The arguments are read where they are (converted only when their dtype
        or layout differs: instructions never write an input), and the outputs
        are new arrays each run, returned as they are: the instructions that
        touch them are bound again (a few Python objects each); the others,
        bound to the arena once, allocate nothing.
        """
        if len(args) != len(self.program.params):
            raise UsageError(f"@{self.program.name} takes {len(self.program.params)} arguments, "
                             f"not {len(args)}")
        flat_args = _flatten_args(self.program.params, args)
        for buffer, value in zip(self.inputs, flat_args):
            if np.shape(value) != buffer.shape:
                raise UsageError(f"argument %{buffer.name} has the shape {np.shape(value)}, "
                                 f"not {buffer.shape}")
            dtype = numpy_dtype(buffer.dtype)
            if not np.can_cast(np.asarray(value).dtype, dtype, casting="same_kind"):
                raise UsageError(f"argument %{buffer.name} is {np.asarray(value).dtype}, not {dtype}")
            self.views[buffer] = np.ascontiguousarray(value, dtype=dtype)
        for buffer in self.outputs:
            self.views[buffer] = np.empty(buffer.shape, dtype=numpy_dtype(buffer.dtype))
        for index in self.per_run:
            self.steps[index] = self.bind(self.instructions[index])
        index = 0
        try:
            for index, step in enumerate(self.steps):
                step()
        except AnfirError as error:
            raise AnfirRuntimeError(f"{self.instructions[index].prim.name}: {error.message}",
                                    self.instructions[index].loc) from None
        except Exception as error:  # numpy's, for operands a hand-written .lir got wrong
            raise AnfirRuntimeError(f"{self.instructions[index].prim.name}: {error}",
                                    self.instructions[index].loc) from None
        return _result(self.program.result, self.views)

    def run_steps(self) -> None:
        """Run the instructions once on the values already in the input buffers (for measuring)."""
        for step in self.steps:
            step()


class _Evaluate:
    """An instruction without a kernel: the primitive's evaluation, copied into the output."""

    def __init__(self, instr: Instr, out: Any, args: list[Any], statics: dict[str, Any]) -> None:
        self.out = out
        positional = {int(k[3:]): v for k, v in statics.items() if k.startswith("arg") and k[3:].isdigit()}
        self.kwargs = {k: v for k, v in statics.items() if not (k.startswith("arg") and k[3:].isdigit())}
        call: list[Any] = []
        data = iter(args)
        for position in range(len(args) + len(positional)):
            if position in positional:
                value = positional[position]
                if isinstance(value, TensorType):  # read for its type only: a stand-in of no memory
                    value = np.broadcast_to(np.zeros((), numpy_dtype(value.dtype)), value.shape)
                call.append(value)
            else:
                call.append(next(data))
        self.call = partial(instr.prim.impl, *call)

    def __call__(self) -> None:
        result = self.call(**self.kwargs)
        if isinstance(self.out, np.ndarray):
            np.copyto(self.out, result, casting="unsafe")


def _leaves(structure: Any) -> list[Buffer]:
    found: list[Buffer] = []
    stack = [structure]
    while stack:
        item = stack.pop()
        if isinstance(item, Buffer):
            found.append(item)
        elif isinstance(item, tuple):
            stack.extend(reversed(item))
    return found


def _flatten_args(structure: Any, args: Any) -> list[Any]:
    found: list[Any] = []
    stack: list[tuple[Any, Any]] = [(structure, tuple(args))]
    while stack:
        names, value = stack.pop()
        if isinstance(names, Buffer):
            found.append(value)
        elif isinstance(names, tuple):
            if not isinstance(value, (tuple, list)) or len(value) != len(names):
                raise UsageError(f"expected a tuple of {len(names)} values, got {type(value).__name__}")
            stack.extend(reversed(list(zip(names, value))))
    return found


def _result(structure: Any, views: dict[Buffer, Any]) -> Any:
    if structure is None:
        return None
    if isinstance(structure, Buffer):
        view = views[structure]
        return view.item() if view.ndim == 0 else view
    return tuple(_result(s, views) for s in structure)  # results nest shallowly (tuples of outputs)


def run_low(program: LowProgram, *args: Any, executor: Optional[Executor] = None) -> Any:
    """``anfir.run`` of a low-level program: bind it (once per call) and run it."""
    return (executor or Executor(program)).run(*args)


__all__ = ["Executor", "run_low"]

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

import sys
from functools import partial
from typing import Any, Callable, Optional

import numpy as np

from anfir.dtypes import numpy_dtype
from anfir.errors import AnfirError, AnfirRuntimeError, UsageError
from anfir.lowlevel.plan import plan
from anfir.lowlevel.program import ALIGN, Branch, Buffer, Instr, Line, Loop, LowProgram, linear
from anfir.lowlevel.kernels import RegionWorkspace, Workspace
from anfir.lowlevel.rules import RULES, LowRule, TensorType
from anfir.runtime_values import DType


MAX_MEMORY_BYTES = 8 * 1024 ** 3
"""The most memory one executor allocates (arena, declared buffers and the kernels' scratch workspace),
checked before allocating."""


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
        self._operands = [self._prepare(i) for i in self.instructions]
        """Per instruction, what binding it needs that does not change between runs."""
        self.workspace = Workspace(MAX_MEMORY_BYTES - arena_bytes - declared)
        """Scratch memory of the kernels that need some (shared: instructions run one at a time)."""
        self.steps: list[Callable[[], Any]] = [self.bind(i) for i in range(len(self.instructions))]
        if self.workspace.grown:  # bind again the kernels bound before the workspace reached its size
            for index, (rule, _, _, _) in enumerate(self._operands):
                if rule.scratch is not None:
                    self.steps[index] = self.bind(index)
        # (each bind is checked: a hand-written .lir may give an instruction operands that do not fit)
        self.inputs = _leaves(program.params)
        self.outputs = [b for b in program.declares if b.kind == "output"]
        self.users: dict[Buffer, list[int]] = {b: [] for b in (*self.inputs, *self.outputs)}
        """The instructions that touch each input and output: bound again when its array changes."""
        for index, instr in enumerate(self.instructions):
            for buffer in dict.fromkeys(b for _, b in instr.operands):
                if buffer in self.users:
                    self.users[buffer].append(index)
        self._dtypes = [numpy_dtype(b.dtype) for b in self.inputs]
        self._out_types = [(b, b.shape, numpy_dtype(b.dtype)) for b in self.outputs]
        self._held = {b: _references(self.views, b) for b in self.outputs}
        """Each output array's references when the executor alone holds it (see :meth:`run`)."""
        self.fast = sum(1 for step in self.steps if not isinstance(step, _Evaluate))
        """How many instructions run a kernel with ``out=`` (the rest evaluate and copy)."""
        self.top: Optional[list[Any]] = _runners(program.body, self.instructions, self.steps, self.views)
        """The program section as instruction indices and loop/branch runners, when it has
        control flow (None: a straight list, run as :attr:`steps`)."""

    @staticmethod
    def _prepare(instr: Instr) -> tuple[LowRule, Buffer, list[Buffer], dict[str, Any]]:
        """(rule, output buffer, data buffers, statics): fixed for the program's life."""
        statics = {k: (DType(v.name) if isinstance(v, DType) else v) for k, v in instr.statics.items()}
        return RULES[instr.prim], instr.output, instr.inputs, statics

    def bind(self, index: int) -> Callable[[], Any]:
        """Instruction ``index`` as a function of no arguments writing its output view
        (an AnfirRuntimeError at the instruction when its operands do not fit)."""
        rule, output, inputs, statics = self._operands[index]
        views = self.views
        out = views[output]
        args = [views[b] for b in inputs]
        scratch = self.instructions[index].scratch
        try:
            if rule.scratch is not None:
                # Its own @scratch buffer of the arena when the program has one (lowered
                # programs do), else the executor's shared workspace (a hand-written .lir).
                space = self.workspace if scratch is None else RegionWorkspace(
                    self.views[scratch].reshape(-1))
                kernel = rule.scratch(out, args, statics, space)
                if kernel is not None:
                    return kernel
            if rule.kernel is not None:
                kernel = rule.kernel(out, args, statics)
                if kernel is not None:
                    return kernel
            return _Evaluate(self.instructions[index], out, args, statics)
        except AnfirError:
            raise
        except Exception as error:  # a kernel factory or the evaluation's binding refused the operands
            instr = self.instructions[index]
            raise AnfirRuntimeError(f"{instr.prim.name}: cannot bind %{instr.name}: {error!r}",
                                    instr.loc) from None

    def run(self, *args: Any) -> Any:
        """The program's result for ``args`` (numpy arrays and Python numbers, nested as the entry's).

        The arguments are read where they are (converted only when their dtype
        or layout differs: instructions never write an input); the instructions
        that read an argument are bound again (a few Python objects each) only
        when it is not the array the previous run read.  The outputs are
        returned as they are, never written again while anyone else holds
        them: an output array the caller has let go of (CPython's reference
        count says the executor is its only holder) is written again by the
        next run, otherwise a new one is allocated and the instructions that
        write it bound again.  The rest, bound to the arena once, allocate
        nothing.
        """
        if len(args) != len(self.program.params):
            raise UsageError(f"@{self.program.name} takes {len(self.program.params)} arguments, "
                             f"not {len(args)}")
        flat_args = _flatten_args(self.program.params, args)
        views, users = self.views, self.users
        stale: set[int] = set()
        for buffer, dtype, value in zip(self.inputs, self._dtypes, flat_args):
            if not (type(value) is np.ndarray and value.dtype == dtype and value.shape == buffer.shape
                    and value.flags.c_contiguous):  # else the common case: read where it is
                if np.shape(value) != buffer.shape:
                    raise UsageError(f"argument %{buffer.name} has the shape {np.shape(value)}, "
                                     f"not {buffer.shape}")
                if not np.can_cast(np.asarray(value).dtype, dtype, casting="same_kind"):
                    raise UsageError(f"argument %{buffer.name} is {np.asarray(value).dtype}, not {dtype}")
                value = np.array(value, dtype=dtype, order="C")  # (ascontiguousarray makes a number 1-d)
            if views[buffer] is not value:
                views[buffer] = value
                stale.update(users[buffer])
        held = self._held
        for buffer, shape, dtype in self._out_types:
            if _references(views, buffer) != held[buffer]:  # the caller still has the last one
                views[buffer] = np.empty(shape, dtype=dtype)
                stale.update(users[buffer])
        if stale:
            steps, bind = self.steps, self.bind
            for index in stale:
                steps[index] = bind(index)
            for buffer in self.outputs:
                held[buffer] = _references(views, buffer)
        if self.top is not None:
            self._run_structured(self.top)
            return _result(self.program.result, self.views)
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

    def _run_structured(self, top: list[Any]) -> None:
        """Run a program section with loops and branches; an error is located at the
        instruction, or the loop or branch, it came from."""
        steps = self.steps
        item: Any = None
        try:
            for item in top:
                if type(item) is int:
                    steps[item]()
                else:
                    item()
        except _LoopError as error:
            raise AnfirRuntimeError(error.message, error.loc) from None
        except AnfirError as error:
            raise AnfirRuntimeError(f"{self._what(item)}: {error.message}", self._where(item)) from None
        except Exception as error:  # numpy's, for operands a hand-written .lir got wrong
            raise AnfirRuntimeError(f"{self._what(item)}: {error}", self._where(item)) from None

    def _what(self, item: Any) -> str:
        return self.instructions[item].prim.name if type(item) is int else item.line.name

    def _where(self, item: Any) -> Any:
        return self.instructions[item].loc if type(item) is int else item.line.loc

    def run_steps(self) -> None:
        """Run the instructions once on the values already in the input buffers (for measuring)."""
        if self.top is not None:
            self._run_structured(self.top)
            return
        for step in self.steps:
            step()


MAX_ITERATIONS = 100_000_000
"""The most iterations one ``loop`` of a low-level program runs (a hand-written ``.lir``
whose flag never turns false stops with an error instead of hanging)."""


class _LoopError(Exception):
    """A loop that ran past :data:`MAX_ITERATIONS` (reported at the loop)."""

    def __init__(self, message: str, loc: Any) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc


class _LoopRun:
    """A ``loop``: its body's items (instruction indices into ``steps`` — looked up on each
    call, since a run may bind an instruction again — and nested runners), repeated while
    the flag's arena view holds true.  Nothing is allocated per iteration."""

    def __init__(self, line: Loop, items: list[Any], steps: list[Callable[[], Any]], flag: Any) -> None:
        self.line, self.items, self.steps, self.flag = line, items, steps, flag

    def __call__(self) -> None:
        steps, items, flag = self.steps, self.items, self.flag
        for _ in range(MAX_ITERATIONS):
            for item in items:
                if type(item) is int:
                    steps[item]()
                else:
                    item()
            if not flag[()]:
                return
        raise _LoopError(f"the loop %{self.line.name} ran {MAX_ITERATIONS} iterations without its "
                         f"flag %{self.line.flag.name} turning false", self.line.loc)


class _BranchRun:
    """An ``if``: one body's items, on the condition's view."""

    def __init__(self, line: Branch, then_items: list[Any], else_items: list[Any],
                 steps: list[Callable[[], Any]], cond: Any) -> None:
        self.line, self.steps, self.cond = line, steps, cond
        self.then_items, self.else_items = then_items, else_items

    def __call__(self) -> None:
        steps = self.steps
        for item in (self.then_items if self.cond[()] else self.else_items):
            if type(item) is int:
                steps[item]()
            else:
                item()


def _runners(body: list[Line], instructions: list[Instr], steps: list[Callable[[], Any]],
             views: dict[Buffer, Any]) -> Optional[list[Any]]:
    """The program section as runnable items (None when it has no loop or branch).  Built
    innermost first over the :func:`linear` order, without recursion."""
    lines = linear(body)
    if not any(isinstance(line, (Loop, Branch)) for line in lines):
        return None
    index = {id(instr): k for k, instr in enumerate(instructions)}
    built: dict[int, Any] = {}

    def items(section: list[Line]) -> list[Any]:
        return [index[id(line)] if isinstance(line, Instr) else built[id(line)]
                for line in section if isinstance(line, (Instr, Loop, Branch))]
    for line in reversed(lines):
        if isinstance(line, Loop):
            built[id(line)] = _LoopRun(line, items(line.body), steps, views[line.flag])
        elif isinstance(line, Branch):
            built[id(line)] = _BranchRun(line, items(line.then_body), items(line.else_body), steps,
                                         views[line.cond])
    return items(body)


def _references(views: dict[Buffer, Any], buffer: Buffer) -> int:
    """How many references ``views[buffer]`` has (the same count whenever the same
    holders hold it: the executor's dict, its bound instructions, this call's argument)."""
    return sys.getrefcount(views[buffer])


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


__all__ = ["Executor", "MAX_ITERATIONS", "run_low"]

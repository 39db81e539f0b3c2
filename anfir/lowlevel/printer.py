"""The ``.lir`` text of a low-level program (the format ``lir.lark`` reads back).

Deterministic: the same program prints the same bytes.  Every instruction
ends with the source location of the node it came from.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from anfir.lowlevel.program import Alloc, Branch, Buffer, Dealloc, Instr, Loop, LowProgram, figures
from anfir.lowlevel.rules import TensorType
from anfir.runtime_values import DType


def type_text(dtype: str, shape: tuple[int, ...]) -> str:
    """``f64<8 x 32>`` (``f64<>`` for a scalar)."""
    return f"{dtype}<{' x '.join(str(d) for d in shape)}>"


def value_text(value: Any) -> str:
    """A static argument or a constant as ``.lir`` text (nested tuples and lists iteratively)."""
    parts: list[str] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, _Raw):
            parts.append(item.text)
        elif isinstance(item, TensorType):
            parts.append(type_text(item.dtype, item.shape))
        elif isinstance(item, (tuple, list)):
            opening, closing = ("(", ")") if isinstance(item, tuple) else ("[", "]")
            trailer = "," if isinstance(item, tuple) and len(item) == 1 else ""
            pieces: list[Any] = [_Raw(opening)]
            for index, element in enumerate(item):
                if index:
                    pieces.append(_Raw(", "))
                pieces.append(element)
            pieces.append(_Raw(trailer + closing))
            stack.extend(reversed(pieces))
        else:
            parts.append(_atom(item))
    return "".join(parts)


class _Raw:
    """Text already written (a bracket or a separator) on the printer's stack."""

    def __init__(self, text: str) -> None:
        self.text = text


def _atom(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        number = float(value)
        if math.isnan(number):
            return "nan"
        if math.isinf(number):
            return "inf" if number > 0 else "-inf"
        return repr(number)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, DType):
        return value.name
    raise TypeError(f"no .lir text for {type(value).__name__}")  # the lowering keeps only these


def struct_text(structure: Any) -> str:
    """The signature's structures: ``%name``, ``none`` or a tuple of them."""
    if isinstance(structure, Buffer):
        return f"%{structure.name}"
    if structure is None:
        return "none"
    return value_text(_named(structure))


def _named(structure: Any) -> Any:
    """Buffers as raw names inside (nested) tuples, for :func:`value_text`."""
    if isinstance(structure, Buffer):
        return _Raw(f"%{structure.name}")
    if structure is None:
        return _Raw("none")
    return tuple(_named(s) for s in structure)  # nesting of tuples is shallow (parameters)


def _constant_text(buffer: Buffer) -> str:
    if not buffer.shape:
        return _atom(buffer.value)
    return value_text(list(np.asarray(buffer.value).reshape(-1).tolist()))


def print_program(program: LowProgram) -> str:
    """The whole ``.lir`` text."""
    numbers = figures(program)
    arena = "not planned" if numbers["arena"] is None else f"{numbers['arena']} bytes"
    lines = [f"# Low-level program @{program.name}" + (f"   phase {program.phase}" if program.phase else ""),
             f"# arena: {arena}   max live: {numbers['max live']} bytes   "
             f"no sharing: {numbers['no sharing']} bytes",
             f"signature {struct_text(program.params)} -> {struct_text(program.result)}",
             "declare {"]
    for buffer in program.declares:
        text = f"  %{buffer.name} = {buffer.kind} {type_text(buffer.dtype, buffer.shape)}"
        if buffer.kind == "constant":
            text += " " + _constant_text(buffer)
        if buffer.comment:
            text = f"{text:<44}# {buffer.comment}"
        lines.append(text)
    lines += ["}", "program {"]
    # Bodies nest: an explicit stack of (lines left, indentation, what closes the body).
    stack: list[tuple[Any, str, list[str]]] = [(iter(program.body), "  ", ["}"])]
    while stack:
        items, pad, closing = stack[-1]
        line = next(items, None)
        if line is None:
            stack.pop()
            lines.extend(closing)
            continue
        if isinstance(line, Alloc):
            b = line.buffer
            where = f" @ {b.offset}" if b.offset is not None else ""
            lines.append(f"{pad}%{b.name} = alloc {type_text(b.dtype, b.shape)}{where}")
        elif isinstance(line, Dealloc):
            lines.append(f"{pad}dealloc %{line.buffer.name}")
        elif isinstance(line, Loop):
            lines.append(_located(f"{pad}%{line.name} = loop while %{line.flag.name} {{", line.loc))
            stack.append((iter(line.body), pad + "  ", [f"{pad}}}"]))
        elif isinstance(line, Branch):
            lines.append(_located(f"{pad}%{line.name} = if %{line.cond.name} {{", line.loc))
            stack.append((iter(line.else_body), pad + "  ", [f"{pad}}}"]))
            stack.append((iter(line.then_body), pad + "  ", [f"{pad}}} else {{"]))
        else:
            lines.append(_instr_text(line, pad))
    return "\n".join(lines) + "\n"


def _located(text: str, loc: Any) -> str:
    """``text`` followed by the source location (when it has one that prints on one line)."""
    if loc is not None and not set(loc.file) & {"#", "\n", "\r"}:
        return f"{text:<60}   # {loc.file}:{loc.line}:{loc.col}"
    return text


def _instr_text(instr: Instr, pad: str = "  ") -> str:
    statics = ""
    if instr.statics:
        statics = "[" + ", ".join(f"{k}={value_text(v)}" for k, v in instr.statics.items()) + "]"
    operands = ", ".join(f"{mode} %{b.name}" for mode, b in instr.operands)
    return _located(f"{pad}%{instr.name} = {instr.prim.name}{statics} {operands}", instr.loc)


__all__ = ["print_program", "struct_text", "type_text", "value_text"]

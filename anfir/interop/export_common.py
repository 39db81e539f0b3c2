"""What the ONNX and Core ML exporters decide alike, written once.

Both exporters write a flat program (:mod:`anfir.flat.statements`) op by op through
a table keyed by primitive object; their node-making differs (ONNX node protos,
MIL's builder), but the questions they ask of an op's operands before writing do
not: which rule writes it (or why none does), which axes a gradient helper sums,
which axes a squeeze or a flip acts on, a convolution's geometry.  Each such question is one function here;
each exporter keeps only the nodes it writes for the answer.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, TypeVar

import numpy as np

from anfir.abstract.values import AbstractValue
from anfir.decompositions import DECOMPOSITIONS
from anfir.errors import ExportError
from anfir.flat.statements import (
    Op, Operand, known_rank_shape, one_device_reasons, same_static_shape, static_dims, sum_to_axes,
)
from anfir.ir.primitive import Primitive
from anfir.location import Location
from anfir.passes.decompose import Declines
from anfir.primitives import complexes, conv, shaping

Rule = TypeVar("Rule", bound=Callable[..., Any])


class TypeReader(Protocol):
    """What the helpers read of a writer: operand types and constants, at its location."""

    loc: Optional[Location]

    def type_of(self, operand: Operand) -> AbstractValue:
        """The operand's anfir type."""

    def static(self, operand: Operand) -> Any:
        """The Python value of a constant operand."""


def rule_for(rules: Mapping[Primitive, Rule], unsupported: Mapping[Primitive, str], op: Op,
             target: str, language: str, declined: Optional[Declines] = None) -> Rule:
    """The rule of ``rules`` that writes ``op``, or an :class:`ExportError` located at the
    op giving why ``target`` has none: the stated reason (``unsupported``); for a composite,
    that its decomposition declined and why (``declined``, filled by the decomposition
    pass); else that no ``language`` rule is registered."""
    rule = rules.get(op.prim)
    if rule is None:
        if op.prim in unsupported:
            reason = unsupported[op.prim]
        elif op.prim in DECOMPOSITIONS:
            why = (declined or {}).get((op.prim, op.loc), "a shape or a constant it needs is "
                                       "not known before run time")
            reason = f"its decomposition into core primitives declined: {why}"
        else:
            reason = f"no {language} rule is registered for it"
        raise ExportError(f"the primitive {op.prim.name} cannot be exported to {target}: {reason}",
                          op.loc)
    return rule


OpRule = Callable[[Any, Op], None]
"""An exporter's rule: ``rule(writer, op)`` writes what computes ``op.results``."""


def result_dtype(w: Any, op: Op) -> str:
    """The dtype of the op's (first) result: what elementwise ops compute in."""
    return str(w.dtype(op.results[0]))


def common_dtype(w: Any, op: Op) -> str:
    """numpy's promotion of the op's operands (what a comparison compares in)."""
    return str(w.common_dtype(op.args))


def boolean(w: Any, op: Op) -> str:
    """``bool``: what the logical ops take."""
    return "bool"


def operands_rule(dtype: Callable[[Any, Op], str], write: Callable[[Any, Op, list[Any]], None],
                  doc: str, arity: Optional[int] = None) -> OpRule:
    """A rule that converts the first ``arity`` operands (None: all) to ``dtype(writer, op)``
    and calls ``write(writer, op, tensors)``: the one shape of the elementwise rule
    factories (``unary``, ``binary``, ``compare``, ``logical``) each exporter makes with
    its own node writer."""
    def rule(w: Any, op: Op) -> None:
        d = dtype(w, op)
        write(w, op, [w.tensor(a, d) for a in op.args[:arity]])
    rule.__doc__ = doc
    return rule


def operand_shape(w: TypeReader, operand: Operand, what: str) -> tuple[Any, ...]:
    """An operand's shape from its type (the rank must be known: else an error naming ``what``)."""
    return tuple(known_rank_shape(w.type_of(operand), what, w.loc))


def sum_to_plan(w: TypeReader, op: Op) -> Optional[list[int]]:
    """``sum_to(g, x)``: None when ``g`` has ``x``'s shape already (the result is ``g``), else
    the axes of ``g`` to sum, kept as 1, before reshaping to ``x``'s shape."""
    g_shape, x_shape = (operand_shape(w, a, "sum_to") for a in op.args[:2])
    return None if same_static_shape(g_shape, x_shape) else sum_to_axes(g_shape, x_shape, w.loc)


def broadcast_like_needed(w: TypeReader, op: Op) -> bool:
    """``broadcast_like(g, x)``: whether ``g`` must be broadcast (its shape is not provably
    ``x``'s)."""
    g_shape, x_shape = (operand_shape(w, a, "broadcast_like") for a in op.args[:2])
    return not same_static_shape(g_shape, x_shape)


def squeeze_axes(w: TypeReader, op: Op) -> tuple[list[int], int]:
    """The axes ``squeeze`` removes (no axis attribute: those of static length 1) and the
    operand's rank."""
    shape = operand_shape(w, op.args[0], "squeeze")
    axis = op.attrs["axis"]
    if axis is None:
        return [i for i, n in enumerate(shape) if n == 1], len(shape)
    return list(shaping.axes_of(axis, len(shape), "squeeze")), len(shape)


def flip_axes(w: TypeReader, op: Op) -> list[int]:
    """The axes ``flip`` reverses (its axis attribute, normalised against the operand's rank)."""
    rank = len(operand_shape(w, op.args[0], "flip"))
    return list(shaping.axes_of(op.attrs["axis"], rank, "flip"))


def static_shape(w: TypeReader, operand: Operand, what: str, target: str) -> tuple[int, ...]:
    """An operand's shape, every dimension known (else an error: ``what`` needs static
    dimensions to export to ``target``)."""
    return static_dims(operand_shape(w, operand, what), what, target, w.loc)


def conv_geometry(w: TypeReader, operand: Operand, what: str, target: str) -> tuple[int, ...]:
    """The shape of an (N, C, spatial...) operand of the convolution family: every dimension
    static but the batch, which may be symbolic (it counts as 1: no node written names it)."""
    shape = operand_shape(w, operand, what)
    if not shape:
        raise ExportError(f"{what} needs a tensor of rank >= 3", w.loc)
    batch = shape[0] if isinstance(shape[0], (int, np.integer)) else 1
    if not all(isinstance(d, (int, np.integer)) for d in shape[1:]):
        raise ExportError(f"{what} needs static channel and spatial dimensions to export to "
                          f"{target}, not {shape}", w.loc)
    return (int(batch), *(int(d) for d in shape[1:]))


def zero_array(shape: Sequence[int]) -> np.ndarray:
    """A zero-memory array of ``shape``, for the op library's geometry helpers (which read
    only shapes)."""
    return np.broadcast_to(np.zeros((), np.bool_), tuple(shape))


ConvParams = tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...], int]
"""(spatial rank, strides, pads as begins then ends, dilations, groups)."""


def conv_params_of(w: TypeReader, op: Op, x: Operand, weight: Operand, target: str) -> ConvParams:
    """A convolution-family op's geometry for input ``x`` and ``weight``, its attributes
    normalised by the op library (:func:`anfir.primitives.conv.conv_params`)."""
    a = op.attrs
    return conv.conv_params(zero_array(conv_geometry(w, x, op.prim.name, target)),
                            zero_array(static_shape(w, weight, op.prim.name, target)),
                            a.get("stride", 1), a.get("padding", 0), a.get("dilation", 1),
                            a.get("groups", 1), "conv")


_Entry = TypeVar("_Entry")


def merge_family_tables(tables: Sequence[Mapping[Primitive, _Entry]], what: str) -> dict[Primitive, _Entry]:
    """An exporter's families' tables (one module per family of ``anfir/primitives/``) as one,
    in the given fixed order; a primitive in two of them is an error (``what`` names the
    tables), so the merged table does not depend on that order."""
    table: dict[Primitive, _Entry] = {}
    for family in tables:
        for prim, entry in family.items():
            if prim in table:
                raise ExportError(f"two {what} for the primitive {prim.name}")
            table[prim] = entry
    return table


def room_tables(modules: Sequence[Any], target: str,
                complex_reason: str) -> tuple[dict[Primitive, Any], dict[Primitive, str]]:
    """An export room's two tables from its family modules (each with ``RULES`` and
    ``UNSUPPORTED``), merged in the modules' fixed order by :func:`merge_family_tables`:
    the rules, and the reasons — the families', the one-device primitives' (a
    program for one device has no collectives) and the complex ones' (no family
    module writes complex numbers), ``complex_reason`` quoted for each."""
    rules = merge_family_tables(tuple(module.RULES for module in modules), f"{target} export rules")
    reasons: dict[Primitive, str] = {
        **one_device_reasons(target),
        **merge_family_tables(tuple(module.UNSUPPORTED for module in modules),
                              f"{target} export reasons"),
        **{prim: complex_reason
           for prim in (complexes.complex_, complexes.real, complexes.imag, complexes.conj)},
    }
    return rules, reasons


__all__ = ["TypeReader", "rule_for", "OpRule", "result_dtype", "common_dtype", "boolean",
           "operands_rule", "operand_shape", "sum_to_plan", "broadcast_like_needed",
           "squeeze_axes", "flip_axes",
           "static_shape", "conv_geometry", "zero_array", "ConvParams", "conv_params_of",
           "merge_family_tables", "room_tables"]

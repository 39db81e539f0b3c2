"""Every program the ONNX exporter's tests export also round-trips MindIR (issue 29).

``tests/conftest.py`` wraps ``anfir.export_onnx`` for every test: when a program
exports to ONNX, it is also written with ``anfir.export_mindir``, read back with
``anfir.import_mindir`` and run by anfir, and the results must equal the
source's own on the same inputs — the test's arguments, or, when it exported for
types (``f64[N, 3]``), inputs made from the ONNX model's input types (each
dimension variable a size of its own).  A program MindIR cannot hold must be
refused with a located ``MindirError`` whose reason is one of :data:`LIMITS`,
the limits docs/mindir.md states; anything else fails the test that exported it.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Optional, Sequence

import numpy as np

import anfir
from anfir.ir.graph import FuncGraph, Module
from anfir.primitives.loops import flatten_value

LIMITS: tuple[str, ...] = (
    r"cast(_like)? to f8",                    # MindSpore has no 8-bit floats
    r"f8e\w+|f4e\w+|i4\b|u4\b",             # nor 4-bit numbers
    r"complex",                               # nor complex tensors here
    r"a scan whose number of steps",          # a scan of run-time length (its buffers need a size)
    r"a string value",                        # MindSpore's runtime computes no strings
    # operators with no MindIR rule yet (docs/mindir.md, "Limits")
    r"primitive (arange|einsum|einsum_ones|topk|gather_nd|gather_nd_grad|gather_elements|roll|roll_back|expand"
    r"|tile|flip|tril|triu"
    r"|scatter_add|scatter_nd) has no MindIR rule",
    r"a convolution that is not 2-d",
    r"(padded avg_pool|split|slice|pad|concat|concat_grad|stack|stack_grad|gather|gather_grad) needs static shapes",
    r"a slice with a step other than 1",
    r"pad mode '\w+' \(constant padding only\)",
    r"gather_grad along an axis other than 0",
)
"""Reasons (regular expressions) of the refusals docs/mindir.md states as limits."""

KNOWN_GAPS: dict[str, str] = {
    "g_softplus_j": "the gradient of a custom_jvp rule is typed for any arguments (the specializer "
                    "meets the rule only inside AD), so its nodes have no shapes to write",
}
"""Entries MindIR does not write yet, and why (docs/mindir.md's limits): each must still be
refused with a located MindirError — and the check fails once it is not, so the entry goes."""

SIZES = (3, 2, 4, 5)
"""The sizes given to a model's dimension variables, one per variable, in order."""


def _all_stated(message: str) -> bool:
    """Whether every node the error lists (its ``@graph: reason`` lines; or the message
    itself) is refused for one of :data:`LIMITS`."""
    reasons = re.findall(r"^ *@[^:]+: (.*)$", message, flags=re.M) or [message]
    return all(any(re.search(p, reason) for p in LIMITS) for reason in reasons)


def _concrete(args: Optional[Sequence[Any]]) -> bool:
    if args is None:
        return False
    leaves, _ = flatten_value(tuple(args))
    return all(isinstance(a, (np.ndarray, np.generic, bool, int, float, complex)) for a in leaves)


def _inputs_from_onnx(model: Any, count: int) -> Optional[list[Any]]:
    """Values for the ONNX model's inputs (random, of their types), when there is one
    per parameter of the entry; each dimension variable gets a size of :data:`SIZES`."""
    from onnx import helper

    graph_inputs = list(model.graph.input)
    if len(graph_inputs) != count:
        return None
    sizes: dict[str, int] = {}
    rng = np.random.default_rng(0)
    values: list[Any] = []
    for vi in graph_inputs:
        t = vi.type.tensor_type
        shape = []
        for d in t.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            else:
                sizes.setdefault(d.dim_param, SIZES[len(sizes) % len(SIZES)])
                shape.append(sizes[d.dim_param])
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
        if dtype.kind == "b":
            value: Any = rng.random(shape) > 0.5
        elif dtype.kind in "iu":
            value = rng.integers(1, 4, size=shape).astype(dtype)
        else:
            value = (rng.random(shape) + 0.5).astype(dtype)
        values.append(value if shape else value[()])
    return values


def _same(want: Any, got: Any, where: str) -> None:
    a_leaves, b_leaves = flatten_value(want)[0], flatten_value(got)[0]
    assert len(a_leaves) == len(b_leaves), f"{where}: {len(a_leaves)} results, MindIR gives {len(b_leaves)}"
    for a, b in zip(a_leaves, b_leaves):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape, f"{where}: shape {a.shape}, MindIR gives {b.shape}"
        low = a.dtype in (np.float32, np.float16) or b.dtype in (np.float32, np.float16)
        rtol = 1e-5 if low else 1e-9  # a reordered sum rounds differently
        if a.dtype.kind in "fc":
            np.testing.assert_allclose(b, a, rtol=rtol, atol=rtol * float(np.max(np.abs(a), initial=1.0)),
                                       equal_nan=True, err_msg=where)
        else:
            np.testing.assert_array_equal(b, a, err_msg=where)


def _entry(source: Any, entry: Optional[str]) -> FuncGraph:
    if isinstance(source, (str, os.PathLike)):
        source = anfir.load(os.fspath(source))
    if isinstance(source, Module):
        return source[entry] if entry else source.entry
    return source


def check_round_trip(source: Any, entry: Optional[str], args: Optional[Sequence[Any]], onnx_model: Any) -> None:
    """The MindIR round trip of one program the ONNX exporter wrote (see the module doc)."""
    from anfir.interop.mindir.common import MindirError

    where = f"MindIR round trip of {entry or 'the graph'}"
    try:
        data = anfir.export_mindir(source, entry=entry, args=args)
    except MindirError as e:
        if e.loc is not None and (entry in KNOWN_GAPS or _all_stated(e.message)):
            return  # stated limits, refused with the place and the reasons
        raise AssertionError(f"{where}: {e}") from None
    assert entry not in KNOWN_GAPS, f"{where} now works: take it out of KNOWN_GAPS and the docs' limits"
    back = anfir.import_mindir(data)
    if isinstance(source, (str, os.PathLike)):
        source = anfir.load(os.fspath(source))
    graph = _entry(source, entry)
    values = list(args) if _concrete(args) else _inputs_from_onnx(onnx_model, len(graph.parameters))
    if values is None:
        return  # exported and imported back; no inputs to run it on
    weights = dict(source.params) if isinstance(source, Module) else {}
    passed = [v for p, v in zip(graph.parameters, values) if p.name not in weights]
    try:
        want = anfir.run(graph, *values)
    except anfir.AnfirError:
        return  # the made-up inputs do not suit the program (a reshape's size): nothing to compare
    _same(want, anfir.run(back.entry, *passed), where)


def wrap(export_onnx: Callable[..., Any]) -> Callable[..., Any]:
    """``anfir.export_onnx`` that also checks the program's MindIR round trip."""
    def export_onnx_and_mindir(mod_or_graph: Any, entry: Optional[str] = None,
                               args: Optional[Sequence[Any]] = None) -> Any:
        model = export_onnx(mod_or_graph, entry=entry, args=args)
        check_round_trip(mod_or_graph, entry, args, model)
        return model
    return export_onnx_and_mindir

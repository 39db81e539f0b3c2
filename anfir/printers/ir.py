"""``dump_ir``: the ``.ir`` text of a program (the format of the spec's ``ir-dump.md``).

Readable first, and loadable (``anfir.load("x.ir")``, see
``anfir/grammar/ir_loader.py``) into isomorphic graphs with the same types,
locations, annotations, flags and constants.  A dump looks like::

    # IR entry: @f
    # Phase: 02_specialize
    # Definitions: f=@f
    # Total params: 2
    #   %para1_x : <Float64>
    #   %para2_y : <Float64>
    # Total subgraphs: 2
    # Total nodes: 4 CNodes, 3 parameters

    # prog.anf:1:1  def f(x, y) =
    subgraph @f(%para1_x, %para2_y) {
      param %para1_x : <Float64>
          # prog.anf:1:7  def f(x, y) =
      %1(a) = sub(%para1_x, 1)
          : (<Float64>, <Int64 = 1>) -> (<Float64>)
          # prog.anf:2:13  let a = x - 1 in
      %2 = @g(%1)
      %3 = sum(%2) primitive_attrs: {axis: 0, keepdims: true}
      return %3
          : <Float64>
    }

    subgraph @g parent: @f (%para1_c) {
      %1 = add($(@f:%1), %para1_c)
      return %1
    }

What is parsed back: the ``# IR entry`` / ``# Phase`` / ``# Definitions``
lines, the module's metadata (``# Meta key: value`` header lines, JSON
values), every ``subgraph`` block, its ``attr`` and ``meta key = value``
lines (the definition's doc string and attributes), ``param`` lines, node
lines with their attributes (``primitive_attrs: {name: value, ...}`` after
the call, as MindSpore prints them, then the node's metadata as ``meta: {...}``),
their ``: (in) -> (out)`` types and the ``# file:line:col (note)  line text``
location comment under them (or above a ``subgraph``).  Everything else after
``#`` (counts, the entry's parameter list) is for the reader only.

Graphs print in a fixed order (definitions in discovery order, each followed by
the graphs nested in it), with unique names (``lambda``, ``lambda.1``...);
nodes are numbered per graph in dependency order.  No ids, no hash order: the
same program always gives the same bytes.
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from anfir.abstract.values import AbstractValue
from anfir.errors import AnfirError
from anfir.ir.graph import FuncGraph, Module
from anfir.ir.metadata import json_object_text, json_text, key_text
from anfir.location import Location
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.walk import toposort
from anfir.printers.abstract_text import abstract_text
from anfir.printers.ir_constants import ConstantPrinter, string_text
from anfir.gcpause import without_gc
from anfir.printers.naming import NameAllocator
from anfir.printers.scopes import discover_managed

GraphOrModule = Union[FuncGraph, Module]

_IDENT_BAD = re.compile(r"[\s,()\[\]{}:=@$\"#<>%*+;?]")
_LABEL_BAD = re.compile(r"[\s,()\[\]{}:=@$\"#<>*+;?]")  # a node's name may keep its '%' 
_SIMPLE_FLAG = (bool, int, float, str, type(None))


@without_gc
def dump_ir(obj: GraphOrModule, phase: str = "", side: Optional[dict[str, np.ndarray]] = None) -> str:
    """The ``.ir`` text of a Module (or a graph and every graph it reaches).

    ``phase`` is written as ``# Phase: ...``.  With ``side`` (a dict), tensors
    of more than 64 elements are stored in it (keys ``t0``, ``t1``...) and the
    text refers to them as ``npz["t0"]``; save it with ``numpy.savez`` next to
    the ``.ir`` file as ``<same name>.npz`` (:func:`write_ir` does both).
    Without ``side`` every tensor is printed in full.
    """
    return _IRPrinter(obj, phase, side).render()


def write_ir(obj: GraphOrModule, path: Union[str, Path], phase: str = "") -> list[Path]:
    """Write ``path`` (the ``.ir`` text) and, if large tensors occur, ``path`` with ``.npz``.

    Returns the paths written.  ``anfir.load(path)`` reads both back.
    """
    target = Path(path)
    side: dict[str, np.ndarray] = {}
    text = dump_ir(obj, phase=phase, side=side)
    target.write_text(text, encoding="utf-8")
    written = [target]
    npz = side_file_path(target)
    if side:
        write_side_file(npz, side)
        written.append(npz)
    elif npz.exists():
        npz.unlink()  # a stale side file from an earlier dump would mislead a reader
    return written


def write_side_file(path: Union[str, Path], arrays: dict[str, np.ndarray]) -> None:
    """Save ``arrays`` as an ``.npz`` that ``numpy.load`` reads, byte-identical on every run.

    (``numpy.savez`` stamps members with the current time; a fixed stamp and
    sorted members keep dumps deterministic.)
    """
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for key in sorted(arrays):
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asarray(arrays[key]), allow_pickle=False)


def side_file_path(ir_path: Union[str, Path]) -> Path:
    """Where the side file of ``ir_path`` lives (``x.ir`` -> ``x.npz``)."""
    return Path(ir_path).with_suffix(".npz")


def dump_name(name: Optional[str], fallback: str = "g") -> str:
    """``name`` with the characters the ``.ir`` syntax reserves replaced by ``_``."""
    if not name:
        return fallback
    return _IDENT_BAD.sub("_", name)


class _IRPrinter:
    def __init__(self, obj: GraphOrModule, phase: str, side: Optional[dict[str, np.ndarray]]) -> None:
        self.phase = phase
        self.metadata: dict[str, Any] = {}
        if isinstance(obj, Module):
            self.metadata = obj.metadata
            self.definitions = dict(obj.graphs)
            try:
                entry: Optional[FuncGraph] = obj.graphs[obj.entry_name()]
            except AnfirError:  # no main and several definitions: the first one
                entry = next(iter(obj.graphs.values()), None)
        elif isinstance(obj, FuncGraph):
            self.definitions = {obj.name: obj}
            entry = obj
        else:
            raise TypeError(f"dump_ir needs a FuncGraph or a Module, not {type(obj).__name__}")
        self.entry = entry
        roots = list(dict.fromkeys(self.definitions.values()))
        self.mng, found = discover_managed(roots)
        self.graphs = self._nesting_order(found)
        alloc = NameAllocator(separator=".")
        self.gname: dict[FuncGraph, str] = {g: alloc.take(dump_name(g.name)) for g in self.graphs}
        self.constants = ConstantPrinter(self._graph_ref, side)
        self.local: dict[Node, str] = {}
        for g in self.graphs:
            self._number(g)

    def _graph_ref(self, g: FuncGraph) -> str:
        name = self.gname.get(g)
        if name is None:  # a graph outside the dump (e.g. named by a stale type)
            return "?" + dump_name(g.name)
        return name

    def _nesting_order(self, found: list[FuncGraph]) -> list[FuncGraph]:
        """Top-level graphs in discovery order, each followed by its nested graphs."""
        index = {g: i for i, g in enumerate(found)}
        children: dict[FuncGraph, list[FuncGraph]] = {}
        tops = []
        for g in found:
            parent = self.mng.parent(g)
            if parent is None or parent not in index:
                tops.append(g)
            else:
                children.setdefault(parent, []).append(g)
        order: list[FuncGraph] = []
        stack = list(reversed(tops))
        while stack:
            g = stack.pop()
            order.append(g)
            stack.extend(reversed(sorted(children.get(g, ()), key=index.__getitem__)))
        return order

    def _number(self, g: FuncGraph) -> None:
        for i, p in enumerate(g.parameters, 1):
            self.local[p] = f"%para{i}" + (f"_{dump_name(p.name, '')}" if p.name else "")
        count = 0
        for node in toposort(g, self.mng):
            if isinstance(node, CNode):
                count += 1
                self.local[node] = f"%{count}"

    # -- text ---------------------------------------------------------------------
    def render(self) -> str:
        lines: list[str] = []
        entry = self.entry
        if entry is not None:
            lines.append(f"# IR entry: @{self.gname[entry]}")
        if self.phase:
            lines.append(f"# Phase: {self.phase}")
        defs = " ".join(f"{dump_name(k)}=@{self.gname[g]}" for k, g in self.definitions.items())
        lines.append(f"# Definitions: {defs}")
        for key, value in self.metadata.items():
            lines.append(f"# Meta {key_text(key)}: {json_text(value)}")
        if entry is not None:
            lines.append(f"# Total params: {len(entry.parameters)}")
            for p in entry.parameters:
                lines.append(f"#   {self.local[p]} : {self._abstract(p.abstract)}")
        cnodes = sum(1 for n in self.local if isinstance(n, CNode))
        params = sum(len(g.parameters) for g in self.graphs)
        lines.append(f"# Total subgraphs: {len(self.graphs)}")
        lines.append(f"# Total nodes: {cnodes} CNodes, {params} parameters")
        for g in self.graphs:
            lines.append("")
            self._graph(g, lines)
        return "\n".join(lines) + "\n"

    def _graph(self, g: FuncGraph, lines: list[str]) -> None:
        if g.loc is not None:
            lines.append(location_comment(g.loc))
        params = []
        for p in g.parameters:
            text = self.local[p]
            if p.annotation is not None:
                text += f": {p.annotation}"
            params.append(text)
        head = f"subgraph @{self.gname[g]}"
        parent = self.mng.parent(g)
        if parent is not None and parent in self.gname:
            head += f" parent: @{self.gname[parent]}"
        head += f"({', '.join(params)})" if parent is None else f" ({', '.join(params)})"
        ret = g.flags.get("return_type")
        if ret is not None:
            head += f" -> {ret}"
        lines.append(head + " {")
        for key in sorted(g.flags):
            value = g.flags[key]
            if key != "return_type" and isinstance(value, _SIMPLE_FLAG) and re.match(r"[A-Za-z_]\w*\Z", key):
                lines.append(f"  attr {key} = {self.constants.text(value)}")
        meta = g.flags.get("meta")
        if isinstance(meta, dict):
            for key, value in meta.items():
                lines.append(f"  meta {key_text(key)} = {json_text(value)}")
        if isinstance(g.abstract, AbstractValue):
            lines.append(f"  abstract {self._abstract(g.abstract)}")
        for p in g.parameters:
            if p.abstract is None and p.loc is None:
                continue
            text = f"  param {self.local[p]}"
            if p.abstract is not None:
                text += f" : {self._abstract(p.abstract)}"
            lines.append(text)
            if p.loc is not None:
                lines.append("      " + location_comment(p.loc))
        for node in toposort(g, self.mng):
            if isinstance(node, CNode):
                self._cnode(node, lines)
        if g.has_output:
            out = g.output
            lines.append(f"  return {self._operand(out, g)}")
            if out.abstract is not None:
                lines.append(f"      : {self._abstract(out.abstract)}")
        lines.append("}")

    def _cnode(self, node: CNode, lines: list[str]) -> None:
        g = node.graph
        assert g is not None
        label = ""
        if node.name or node.annotation is not None:
            label = f"({_LABEL_BAD.sub('_', node.name) if node.name else ''}"
            if node.annotation is not None:
                label += f": {node.annotation}"
            label += ")"
        callee = self._operand(node.inputs[0], g)
        args = ", ".join(self._operand(a, g) for a in node.inputs[1:])
        attrs = ""
        if node.attrs:
            attrs = " primitive_attrs: {" + ", ".join(
                f"{name}: {self.constants.text(value)}" for name, value in node.attrs.items()) + "}"
        meta = g.node_meta.get(node)
        if meta:
            attrs += f" meta: {json_object_text(meta)}"
        lines.append(f"  {self.local[node]}{label} = {callee}({args}){attrs}")
        arg_types = [a.abstract for a in node.inputs[1:]]
        if node.abstract is not None or any(t is not None for t in arg_types):
            ins = ", ".join(self._abstract(t) for t in arg_types)
            lines.append(f"      : ({ins}) -> ({self._abstract(node.abstract)})")
        if node.loc is not None:
            lines.append("      " + location_comment(node.loc))

    def _operand(self, node: Node, g: FuncGraph) -> str:
        if isinstance(node, ValueNode):
            return self.constants.text(node.value)
        ref = self.local.get(node)
        if ref is None:
            raise TypeError(f"dump_ir: {node!r} is not part of the dumped graphs")
        if node.graph is g:
            return ref
        owner = node.graph
        assert owner is not None
        return f"$(@{self.gname[owner]}:{ref})"

    def _abstract(self, value: Any) -> str:
        if value is not None and not isinstance(value, AbstractValue):
            return "?"  # not an abstract value this format knows
        return abstract_text(value, self._graph_ref)


def location_comment(loc: Location) -> str:
    """``# file:line:col (note)  line text`` — the note only when there is one."""
    text = f"# {loc.file}:{loc.line}:{loc.col}"
    if loc.note:
        text += f" ({loc.note})"
    if loc.line_text:
        text += "  " + _line_window(loc.line_text.replace("\n", " ").replace("\r", ""), loc.col)
    return text


LINE_WINDOW = 120
"""A source line longer than :data:`LINE_LIMIT` is shown as this many
characters around the node's column: every node of a 60 KB one-line program
would otherwise repeat the whole line (gigabytes of dump)."""
LINE_LIMIT = 160


def _line_window(line: str, col: int) -> str:
    # Idempotent: a window is never longer than LINE_LIMIT, so a dump that is
    # loaded back and dumped again prints the same text.
    if len(line) <= LINE_LIMIT:
        return line
    start = max(0, min(col - 1 - LINE_WINDOW // 2, len(line) - LINE_WINDOW))
    end = start + LINE_WINDOW
    return ("…" if start > 0 else "") + line[start:end] + ("…" if end < len(line) else "")


__all__ = ["dump_ir", "write_ir", "write_side_file", "side_file_path", "location_comment", "dump_name", "string_text"]

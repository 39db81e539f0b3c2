"""Jupyter display: a graph or module as an SVG picture (``_repr_svg_``).

``FuncGraph._repr_svg_`` and ``Module._repr_svg_`` call :func:`graph_svg`.  It
renders :func:`~anfir.printers.dot.dump_dot` with the ``graphviz`` Python
package and the ``dot`` program; when either is missing (or the picture would
be too big to be useful) it returns None and Jupyter falls back to the text
representation.
"""

from __future__ import annotations

from typing import Any, Optional

from anfir.ir.graph import FuncGraph, Module
from anfir.ir.manager import analyse
from anfir.printers.dot import dump_dot

MAX_NODES = 2000
"""Programs with more nodes than this are not drawn (the layout gets slow and unreadable)."""


def graph_svg(obj: Any) -> Optional[str]:
    """SVG text of ``obj`` (a FuncGraph or Module), or None when it cannot be drawn."""
    try:
        import graphviz
    except ImportError:
        return None
    if not isinstance(obj, (FuncGraph, Module)):
        return None
    try:
        if _node_count(obj) > MAX_NODES:
            return None
        source = dump_dot(obj)
        svg = graphviz.Source(source).pipe(format="svg", encoding="utf-8")
    except Exception:  # noqa: BLE001 - a picture is optional: any failure falls back to text
        return None
    return svg if isinstance(svg, str) and "<svg" in svg else None


def _node_count(obj: Any) -> int:
    roots = list(obj.graphs.values()) if isinstance(obj, Module) else [obj]
    if not roots:
        return 0
    mng = analyse(*roots)
    return sum(len(nodes) for nodes in mng.nodes.values())


__all__ = ["graph_svg", "MAX_NODES"]

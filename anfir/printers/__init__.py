"""Printers: programs as text and pictures, and the check that printing loses nothing.

* :func:`~anfir.printers.text.to_text` — canonical ANF source (re-parses to the same graphs);
* :func:`~anfir.printers.ir.dump_ir` / :func:`~anfir.printers.ir.write_ir` — the ``.ir``
  dump of any phase (loaded back by :func:`anfir.load`);
* :func:`~anfir.printers.dot.dump_dot` — Graphviz source, one cluster per graph;
* :func:`~anfir.printers.display.graph_svg` — the SVG Jupyter shows;
* :func:`~anfir.printers.iso.isomorphic` — whether two programs have the same structure.
"""

from anfir.printers.display import graph_svg
from anfir.printers.dot import dump_dot
from anfir.printers.ir import dump_ir, write_ir
from anfir.printers.iso import IsomorphismError, assert_isomorphic, isomorphic
from anfir.printers.text import to_text

__all__ = ["IsomorphismError", "assert_isomorphic", "dump_dot", "dump_ir", "graph_svg",
           "isomorphic", "to_text", "write_ir"]

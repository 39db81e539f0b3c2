"""MindSpore's ``.mindir`` format: read MindSpore's exports, write anfir's programs.

* :mod:`anfir.interop.mindir.schema` — the protobuf schema, built from the
  format's field numbers (needs only ``protobuf``: ``pip install "anfir[mindir]"``);
* :mod:`anfir.interop.mindir.importer` — ``import_mindir``: a ``.mindir`` file as a Module;
* :mod:`anfir.interop.mindir.import_ops` — the table from MindSpore op names to anfir primitives;
* :mod:`anfir.interop.mindir.exporter` — ``export_mindir``: anfir's graphs as a ``.mindir`` file.

See docs/mindir.md.
"""

from anfir.interop.mindir.common import MindirError
from anfir.interop.mindir.importer import import_mindir

__all__ = ["MindirError", "import_mindir"]

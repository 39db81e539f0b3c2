"""ONNX: the importer and anfir as an ONNX backend.

* :mod:`anfir.interop.onnx.importer` — a ``ModelProto`` to a :class:`~anfir.ir.graph.Module`
  (:func:`~anfir.interop.onnx.importer.import_onnx`), each node built by its rule in
  :mod:`anfir.interop.onnx.import_rules` (one module per family of the anfir primitive
  the rule produces, as in ``anfir/primitives/``);
* :mod:`anfir.interop.onnx.common` — the context a rule gets and the helpers rules share;
* :mod:`anfir.interop.onnx.external` — tensors stored outside the model file;
* :mod:`anfir.interop.onnx.backend` — ``Backend`` (an ``onnx.backend.base.Backend``) and
  :class:`AnfirRep`, re-exported here: ``anfir.interop.onnx.Backend`` is public.

Every module here uses absolute imports, so ``import onnx`` inside this package is
the ``onnx`` package, never this one.
"""

from __future__ import annotations

from typing import Any

from anfir.interop.onnx import backend as _backend
from anfir.interop.onnx.backend import AnfirRep

__all__ = ["AnfirRep", "Backend"]


def __getattr__(name: str) -> Any:
    # ``Backend`` subclasses onnx's class, so it is made when first asked for
    # (importing anfir never needs the ``onnx`` package).
    if name == "Backend":
        return _backend.Backend
    raise AttributeError(name)

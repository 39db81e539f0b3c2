"""Importers and exporters: anfir programs to and from other formats.

* :mod:`anfir.interop.onnx.exporter` — ONNX models (needs the ``onnx`` package:
  ``pip install "anfir[onnx]"``), written from the first-order program of
  :mod:`anfir.flat` (a package of its own, below interop and the low level);
* :mod:`anfir.interop.coreml` — Core ML (MIL) programs (needs coremltools);
* :mod:`anfir.interop.onnx` — the ONNX importer (its rules by family in
  ``onnx/import_rules/``) and ``anfir.interop.onnx.Backend``;
* :mod:`anfir.interop.torch` — the torch.export importer (its rules by family in
  ``torch/rules/``);
* :mod:`anfir.interop.attributes` — the one spelling importers give window attributes.

Nothing here imports an optional package at import time: each exporter
imports its package when it is called.
"""

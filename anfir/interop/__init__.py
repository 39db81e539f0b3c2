"""Importers and exporters: anfir programs to and from other formats.

* :mod:`anfir.interop.flat` — the first-order program every exporter writes out;
* :mod:`anfir.interop.flatten` — the walk from an optimized graph to it
  (inlining, closure conversion, If and Loop);
* :mod:`anfir.interop.onnx_export` — ONNX models (needs the ``onnx`` package:
  ``pip install "anfir[onnx]"``);
* :mod:`anfir.interop.onnx` — the ONNX importer (its rules by family in
  ``onnx/import_rules/``) and ``anfir.interop.onnx.Backend``;
* :mod:`anfir.interop.torch` — the torch.export importer (its rules by family in
  ``torch/rules/``);
* :mod:`anfir.interop.attributes` — the one spelling importers give window attributes.

Nothing here imports an optional package at import time: each exporter
imports its package when it is called.
"""

"""Core ML: the MIL writer (:mod:`~anfir.interop.coreml.exporter`) and its rules, one module
per family of the op library (:mod:`~anfir.interop.coreml.export_rules`)."""

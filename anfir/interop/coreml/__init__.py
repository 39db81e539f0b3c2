"""Core ML: the MIL writer (:mod:`~anfir.interop.coreml.exporter`) and the rules of the
op library's nn, shaping, indexing and conv families (:mod:`~anfir.interop.coreml.nn`)."""

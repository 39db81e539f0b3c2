"""The first-order program every exporter and the low level start from.

:mod:`anfir.flat.statements` is the flat program (values, ops, blocks, ``if`` and
loops, no closures or tuples); :mod:`anfir.flat.flatten` walks an optimized
graph into it.  It sits below both ``anfir.interop`` (ONNX, Core ML) and
``anfir.lowlevel`` (the buffer IR), which read it and never each other.
"""

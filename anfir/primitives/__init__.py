"""The op library: every built-in operation, declared once each (see registry.py).

Importing this package declares every primitive; :func:`lookup` finds one by
name (only the front ends need that: everything after them holds the object).
"""

from anfir.ir.primitive import MetaFunction, Primitive
from anfir.primitives import arith, batching, complexes, conv, elementwise, gradient, indexing, meta, nn, reduce, shaping, structure, tensor  # noqa: F401  (the declarations)
from anfir.primitives import loops  # noqa: F401  (structured loops, custom derivatives)
from anfir.primitives import checkpointing  # noqa: F401  (checkpoint, remat_barrier)
from anfir.primitives import collective  # noqa: F401  (the SPMD primitives)
from anfir.primitives.registry import META_FUNCTIONS, PRIMITIVES, declare, lookup

__all__ = ["PRIMITIVES", "META_FUNCTIONS", "Primitive", "MetaFunction", "declare", "lookup"]

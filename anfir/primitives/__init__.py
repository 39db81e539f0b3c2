"""All built-in operations, declared once each (see registry.py).

Importing this package registers every primitive; ``lookup(name)`` finds one.
"""

from anfir.primitives import arith, gradient, meta, structure, tensor  # noqa: F401  (registration)
from anfir.primitives.registry import (META_FUNCTIONS, PRIMITIVES, MetaFunction, Primitive,
                                       declare, lookup)

__all__ = ["PRIMITIVES", "META_FUNCTIONS", "Primitive", "MetaFunction", "declare", "lookup"]

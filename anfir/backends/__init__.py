"""Back ends: programs of the optimized graph IR lowered to other systems.

* :mod:`anfir.backends.tojax` — a FuncGraph as a pure function of JAX arrays
  (``anfir.to_jax``), which ``jax.jit``, ``jax.grad``, ``jax.vmap`` and JAX's
  sharding accept; XLA compiles it.

A back end walks graphs with :func:`anfir.ir.walk.toposort` and dispatches on
the primitive *objects* through a table of its own.  Its optional package is
imported only when it is used: ``import anfir`` never needs it.
"""

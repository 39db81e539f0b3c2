"""Type inference: the engine (abstract interpretation over graphs, an explicit
stack and a fixpoint) and the specializer (a clone per call signature).

The ``specialize`` phase itself is :mod:`anfir.passes.specialize`.
"""

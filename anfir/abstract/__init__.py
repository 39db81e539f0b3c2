"""Abstract values and the shape/type rules of the specializer.

* :mod:`~anfir.abstract.values` — the abstract values and their dump syntax;
* :mod:`~anfir.abstract.lattice` — ⊥, join, widening, values of constants;
* :mod:`~anfir.abstract.shapes` — shape arithmetic on int/sympy dimensions;
* :mod:`~anfir.abstract.rules` — the ``infer=`` rules of the primitives;
* :mod:`~anfir.abstract.typeann` — annotations as abstract values, and checks;
* :mod:`~anfir.infer.engine` — the inference engine (explicit stack, fixpoint);
* :mod:`~anfir.infer.specializer` — per-signature clones and call redirection.

The phase itself is :mod:`anfir.passes.specialize`.
"""

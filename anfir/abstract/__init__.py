"""Abstract values and the shape/type rules of the specializer."""

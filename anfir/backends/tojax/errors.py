"""The errors of the JAX back end (no jax import here: ``anfir`` loads this module
whether or not JAX is installed)."""

from __future__ import annotations

from anfir.errors import AnfirError, MissingDependencyError

JAX_EXTRA = 'pip install "anfir[jax]"'
"""The command that installs what the JAX back end needs."""


MissingExtraError = MissingDependencyError
"""The one error of a missing optional package (the name the JAX back end used)."""


class LoweringError(AnfirError):
    """A program the JAX back end cannot express (the message says why and what to do)."""

    kind = "JAX lowering error"


class TracedRecursionError(LoweringError):
    """Non-tail recursion whose depth depends on traced values: JAX has no
    recursion, so a traced condition cannot decide how deep a call goes."""


__all__ = ["JAX_EXTRA", "LoweringError", "MissingExtraError", "TracedRecursionError"]

"""Error types: every error anfir raises on bad input derives from AnfirError.

An error that concerns user text carries a :class:`~anfir.location.Location`
and renders as ``file:line:col: message`` followed by the offending line and a
caret under the column, so both the API and the CLI can show it verbatim.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

if TYPE_CHECKING:  # pragma: no cover
    from anfir.location import Location


class AnfirError(Exception):
    """Base of every error anfir raises on bad input (syntax, names, types...)."""

    def __init__(self, message: str, loc: Optional["Location"] = None, hint: str = "") -> None:
        self.message = message
        self.loc = loc
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        """The full, located message: ``file:line:col: kind: message``, the line, a caret."""
        kind = type(self).kind
        head = f"{kind}: {self.message}"
        if self.loc is None:
            text = head
        else:
            text = f"{self.loc.file}:{self.loc.line}:{self.loc.col}: {head}"
            excerpt = self.loc.excerpt()
            if excerpt:
                text += "\n" + excerpt
        if self.hint:
            text += "\n" + self.hint
        return text

    def __str__(self) -> str:
        return self.render()

    kind = "error"


class AnfirSyntaxError(AnfirError):
    """The text does not follow the grammar (ANF or .ir)."""

    kind = "syntax error"


class NameResolutionError(AnfirError):
    """A name that is neither bound in scope, defined in the module, nor built in."""

    kind = "name error"


class DuplicateDefinitionError(AnfirError):
    """Two top-level definitions (or two parameters) share one name."""

    kind = "name error"


class ArityError(AnfirError):
    """A function called with the wrong number of arguments."""

    kind = "arity error"


class AnfirTypeError(AnfirError):
    """A value of the wrong type or shape (at inference or at run time)."""

    kind = "type error"


class ShapeError(AnfirTypeError):
    """Tensor shapes that do not fit together (broadcasting, matmul, reshape)."""

    kind = "shape error"


class DimensionRangeError(ShapeError):
    """An argument size outside the range a definition declares for its
    dimension variable (``#@ ranges``, a torch.export ``Dim``'s bounds), or a
    variable given two sizes by one call."""

    kind = "shape error"


class AnfirRuntimeError(AnfirError):
    """An error while evaluating a program (division by zero, bad index...)."""

    kind = "runtime error"


class InferenceError(AnfirTypeError):
    """Abstract interpretation failed (e.g. a recursion whose type cannot be inferred)."""

    kind = "inference error"


class GradientError(AnfirError):
    """A gradient requested of something that is not differentiable."""

    kind = "gradient error"


class IRConsistencyError(AnfirError):
    """A graph invariant is broken (raised by the validator, never by user text alone)."""

    kind = "invalid IR"


class ExportError(AnfirError):
    """A program that an exporter cannot express in its target (ONNX...): the
    message names the node and says why (a function value left after
    optimization, recursion that is not a loop...)."""

    kind = "export error"


class MissingDependencyError(AnfirError):
    """An optional feature whose package is not installed; the message names
    the extra to install (``pip install "anfir[onnx]"``)."""

    kind = "missing dependency"


class UsageError(AnfirError):
    """A bad use of the API or the command line (exit status 2 in the CLI)."""

    kind = "usage error"

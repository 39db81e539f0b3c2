"""Run-time side of the autodiff: ``J`` on values and the graphs behind ``grad``.

* :func:`j_value` — ``J`` applied to a run-time value: data is unchanged, a
  closure of ``h`` becomes a closure of ``▸h`` over the *same* captured
  values (``▸h`` has exactly ``h``'s free variables), a primitive becomes
  ``▸p``, a partial a J-world partial.
* :func:`generate_grad` — the graph behind a run-time call ``grad(f, i...)``
  (:func:`anfir.autodiff.gradgraphs.grad_graph`, from the arity of ``f``); the
  ``ad`` phase expands calls into the same graph statically.
"""

from __future__ import annotations

from typing import Any

from anfir.autodiff.gradgraphs import grad_graph, normalize_wrt
from anfir.autodiff.jtransform import check_function_value, j_graph_checked, j_meta
from anfir.autodiff.partials import j_partial_call, j_skip, regroups
from anfir.autodiff.primitive_j import j_primitive_value
from anfir.errors import GradientError
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import manage
from anfir.ir.primitive import MetaFunction, Primitive
from anfir.runtime_values import Closure, Partial


# -- J on values ----------------------------------------------------------------
def j_value(x: Any) -> Any:
    """The J-transform of a run-time value."""
    if isinstance(x, Closure):
        forward = j_graph_checked(x.graph)
        return Closure(forward, _remap_env(x.graph, forward, x.env))
    if isinstance(x, FuncGraph):
        forward = j_graph_checked(x)
        if manage(forward).free_variables_total(forward):
            raise GradientError(f"cannot differentiate @{x.name} outside of its closure")
        return forward
    if isinstance(x, Primitive):
        return j_primitive_value(x)
    if isinstance(x, MetaFunction):
        return j_meta(x)
    if isinstance(x, Partial):
        return Partial(j_partial_call(len(x.args), j_skip(x.fn)),
                       (j_value(x.fn), *(j_value(a) for a in x.args)))
    if isinstance(x, tuple):
        return tuple(j_value(v) for v in x)
    return x


def _remap_env(graph: FuncGraph, forward: FuncGraph, env: tuple) -> tuple:
    """Order ``env`` (captured for ``graph``) as ``forward``'s free variables expect."""
    before = manage(graph).free_variables_total(graph)
    after = manage(forward).free_variables_total(forward)
    if before == after:
        return env
    by_node = dict(zip(before, env))
    try:
        return tuple(by_node[n] for n in after)
    except KeyError:  # pragma: no cover - would be a bug in the J transform
        raise GradientError(f"internal: ▸{graph.name} captures values @{graph.name} does not") from None


# -- grad / value_and_grad ------------------------------------------------------
def arity_of(fn: Any) -> int:
    """How many arguments the function value ``fn`` takes."""
    if isinstance(fn, Closure):
        return len(fn.graph.parameters)
    if isinstance(fn, FuncGraph):
        return len(fn.parameters)
    if isinstance(fn, Partial):
        if regroups(fn.fn) and fn.args:  # a J-world partial: g's arity, less what is bound
            return arity_of(fn.args[0]) - (len(fn.args) - 1)
        return arity_of(fn.fn) - len(fn.args)
    if isinstance(fn, Primitive):
        if fn.max_args is not None and fn.min_args == fn.max_args:
            return fn.min_args
        raise GradientError(f"grad of {fn.name} needs a function of fixed arity; wrap it in a lambda")
    raise GradientError(f"grad needs a function, not {type(fn).__name__}")


def generate_grad(args: tuple, with_value: bool) -> FuncGraph:
    """The graph for a call ``grad(f, i...)`` (``value_and_grad`` with ``with_value``)."""
    if not args:
        raise GradientError("grad needs a function")
    nparams = arity_of(args[0])
    check_function_value(args[0])
    wrt, multi = normalize_wrt(args[1:], nparams)
    return grad_graph(nparams, wrt, multi, with_value, len(args) - 1)


__all__ = ["arity_of", "generate_grad", "j_value"]

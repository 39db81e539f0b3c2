"""A FuncGraph as a Python function of JAX arrays (what ``anfir.to_jax`` returns)."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from anfir.errors import AnfirError, UsageError
from anfir.ir.graph import FuncGraph
from anfir.backends.tojax.machine import Machine, plan_for
from anfir.backends.tojax.traced import Either, is_array, map_tuples
from anfir.runtime_values import Closure, GradEnv, Partial


class JaxFunction:
    """``graph`` as a pure function of JAX arrays: calling it traces the graph into
    JAX operations (see :mod:`anfir.backends.tojax.machine`), so ``jax.jit``,
    ``jax.grad``, ``jax.vmap`` and sharded inputs work on it as on any JAX
    function.

    Arguments may be JAX or numpy arrays (numpy ones become JAX arrays),
    Python scalars (kept as they are: constants unless JAX traces them) and
    tuples of these.  The result is the program's, with numbers and numpy
    arrays as JAX arrays; a program returning a function is refused.
    """

    def __init__(self, graph: FuncGraph) -> None:
        plan = plan_for(graph)
        if plan.fvs:
            raise UsageError(f"@{graph.name} is a closure over values of an enclosing graph; "
                             "convert the enclosing graph instead", graph.loc)
        self.graph = graph
        """The graph it runs."""
        self.__name__ = graph.name
        self.__qualname__ = graph.name
        self.__doc__ = f"@{graph.name} of anfir, as a function of JAX arrays"

    def __call__(self, *args: Any) -> Any:
        inputs = tuple(_input(a) for a in args)
        return _output(Machine().run(self.graph, inputs), self.graph)

    def __repr__(self) -> str:
        return f"<anfir.to_jax @{self.graph.name}>"


def _input(value: Any) -> Any:
    return map_tuples(value, lambda v: jnp.asarray(v) if isinstance(v, np.ndarray) else v)


def _output(value: Any, graph: FuncGraph) -> Any:
    def leaf(v: Any) -> Any:
        if is_array(v) or v is None or isinstance(v, str):
            return v
        if isinstance(v, (bool, int, float, np.ndarray, np.generic)):
            return jnp.asarray(v)
        if isinstance(v, (Closure, Partial, FuncGraph, Either, GradEnv)) or callable(v):
            raise AnfirError(f"@{graph.name} returns a function value; a function of JAX arrays "
                             "must return data (numbers, tensors, tuples of them)", graph.loc)
        return v

    return map_tuples(value, leaf)


__all__ = ["JaxFunction"]

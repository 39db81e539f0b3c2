"""``anfir.custom_vjp`` and ``anfir.custom_jvp``: a FuncGraph whose derivatives are the user's.

As ``jax.custom_vjp`` / ``jax.custom_jvp``, but with the rules given at once:
``custom_vjp(f, fwd, bwd)`` with ``fwd(x...) -> (f(x...), residuals)`` and
``bwd(residuals, dout) -> (dx...)`` (one cotangent per argument, a tuple);
``custom_jvp(f, rule)`` with ``rule((x...), (t...)) -> (f(x...), tangent)``,
linear in the tangents.  The graph returned has ``f``'s parameters and calls
the language's ``custom_vjp``/``custom_jvp``, so ``anfir.grad``, ``anfir.jvp``,
``anfir.compile`` and the exporters use the rule (values the three functions
capture get no gradient, as in JAX).
"""

from __future__ import annotations

from anfir.autodiff.api import entry_graph
from anfir.errors import UsageError
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import manage
from anfir.ir.nodes import CNode, ValueNode
from anfir.primitives import loops


def _wrap(name: str, prim: object, f: FuncGraph, rules: list[FuncGraph]) -> FuncGraph:
    fn = entry_graph(f)
    graphs = [entry_graph(r) for r in rules]
    wrapper = FuncGraph(f"{name}_{fn.name}", fn.loc)
    params = [wrapper.add_parameter(p.name or "x", p.loc) for p in fn.parameters]
    custom = CNode(wrapper, [ValueNode(prim), ValueNode(fn), *(ValueNode(g) for g in graphs)], fn.loc)
    wrapper.output = CNode(wrapper, [custom, *params], fn.loc)
    manage(wrapper)
    return wrapper


def custom_vjp(f: FuncGraph, fwd: FuncGraph, bwd: FuncGraph) -> FuncGraph:
    """``f`` with the reverse-mode derivative ``bwd(fwd(x)[1], dout)`` (see the module doc)."""
    if len(entry_graph(bwd).parameters) != 2:
        raise UsageError(f"custom_vjp: bwd takes (residuals, dout), 2 parameters; "
                         f"@{entry_graph(bwd).name} takes {len(entry_graph(bwd).parameters)}")
    return _wrap("custom_vjp", loops.custom_vjp, f, [fwd, bwd])


def custom_jvp(f: FuncGraph, jvp_rule: FuncGraph) -> FuncGraph:
    """``f`` with the derivative ``jvp_rule((x...), (t...))[1]`` (see the module doc)."""
    if len(entry_graph(jvp_rule).parameters) != 2:
        raise UsageError("custom_jvp: the rule takes (primals, tangents), 2 parameters")
    return _wrap("custom_jvp", loops.custom_jvp, f, [jvp_rule])


__all__ = ["custom_jvp", "custom_vjp"]

"""The J-world of the structured loops: their gradient is a reversed ``scan``.

A primitive's gradient rule (``bprop`` text) sees its inputs in the forward
world, which for a function argument is its J-transform: calling it returns
``(value, bprop)``.  ``scan`` cannot be called on such a function as it is, so
the J transform does not copy a ``scan`` call: it calls the graph here, the
*J-world* ``scan`` (``▸scan``), exactly as it calls the transform of a user's
function — ``(value, ◂scan)`` with ``◂scan(dout) = (env, d f, d init, d xs)``.

How ``▸scan`` differentiates (as JAX's ``scan`` with a per-step
checkpoint): the forward ``scan`` also stacks each step's *input carry*
(the residuals: first-order data, one stacked tensor per carry leaf); the
backward pass is a ``scan`` run the other way over ``(carries, xs, dys)``
whose carry is ``(gradient of f's captured values, d carry)``; each step
calls the J-transformed body again at its stored carry and pulls ``(d
carry, dy)`` back through it.  The closure that step makes is called in the
same step, so once the optimizer inlines the body the backward scan is
first-order.  ``◂scan`` is built from ``scan`` and primitives with rules, so
it is differentiated again the same way (second order).

``fori_loop`` is a ``scan`` over ``arange(lo, hi)`` whose carry is
``(i, carry)``, and its backward pass counts ``i`` down from ``hi - 1``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from anfir.errors import GradientError
from anfir.grammar.parser import parse_module
from anfir.ir.attrs import Attrs
from anfir.ir.clone import clone
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import Manager, manage
from anfir.ir.nodes import Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.primitives import loops

_cache: dict[tuple[Any, ...], FuncGraph] = {}


def _keywords(length: Any, reverse: bool) -> str:
    words = []
    if length is not None:
        words.append(f"length={int(length)}")
    if reverse:
        words.append("reverse=true")
    return "".join(", " + w for w in words)


def _scan_text(nargs: int, length: Any, reverse: bool, closed: bool) -> str:
    fwd_kw, bwd_kw = _keywords(length, reverse), _keywords(length, not reverse)
    xs = "xs" if nargs == 3 else "None"
    params = "f, init, xs" if nargs == 3 else "f, init"
    dxs = ", r[1]" if nargs == 3 else ""
    if closed:  # the body captures nothing: the backward carry is the carry's gradient alone
        return f"""
lambda ({params})
  let res = scan(lambda (c, x) let o = f(c, x)[0] in (o[0], (o[1], c)) end, init, {xs}{fwd_kw}) in
  let cs = res[1][1] in
  let back = lambda (dout)
    let r = scan(lambda (dc, item)
        let g = f(item[0], item[1])[1]((dc, item[2])) in (g[1], g[2]) end,
      dout[0], (cs, {xs}, dout[1]){bwd_kw}) in
    (newenv(), newenv(), r[0]{dxs}) end in
  ((res[0], res[1][0]), back)
end
"""
    return f"""
lambda ({params})
  let res = scan(lambda (c, x) let o = f(c, x)[0] in (o[0], (o[1], c)) end, init, {xs}{fwd_kw}) in
  let cs = res[1][1] in
  let back = lambda (dout)
    let r = scan(lambda (acc, item)
        let g = f(item[0], item[1])[1]((acc[1], item[2])) in
        ((gadd(acc[0], g[0]), g[1]), g[2]) end,
      (newenv(), dout[0]), (cs, {xs}, dout[1]){bwd_kw}) in
    (newenv(), r[0][0], r[0][1]{dxs}) end in
  ((res[0], res[1][0]), back)
end
"""


_FORI_TEXT = """
lambda (lo, hi, body, init)
  let res = scan(lambda (ic, k) let i = ic[0] in ((i + 1, body(i, ic[1])[0]), ic[1]) end,
                 (lo, init), arange(lo, hi)) in
  let back = lambda (dout)
    let r = scan(lambda (acc, c)
        let i = acc[0] in
        let g = body(i, c)[1](acc[2]) in
        ((i - 1, gadd(acc[1], g[0]), g[2]), None) end,
      (hi - 1, newenv(), dout), res[1], reverse=true) in
    (newenv(), zeros_like(lo), zeros_like(hi), r[0][1], r[0][2]) end in
  (res[0][1], back)
end
"""


_FORI_CLOSED_TEXT = """
lambda (lo, hi, body, init)
  let res = scan(lambda (ic, k) let i = ic[0] in ((i + 1, body(i, ic[1])[0]), ic[1]) end,
                 (lo, init), arange(lo, hi)) in
  let back = lambda (dout)
    let r = scan(lambda (acc, c)
        let i = acc[0] in
        let g = body(i, c)[1](acc[1]) in
        ((i - 1, g[2]), None) end,
      (hi - 1, dout), res[1], reverse=true) in
    (newenv(), zeros_like(lo), zeros_like(hi), newenv(), r[0][1]) end in
  (res[0][1], back)
end
"""


def _parsed(key: tuple[Any, ...], text: str, name: str) -> FuncGraph:
    graph = _cache.get(key)
    if graph is None:
        module = parse_module(text, f"<J-world {name}>", allow_internal=True)
        graph = module["main"]
        graph.name = name
        manage(graph)
        _cache[key] = graph
    # A copy per use: the ``ad`` phase types the graphs it builds where they are,
    # and two loops give it different bodies.
    return clone(graph)


def j_scan(attrs: Attrs, nargs: int, closed: bool = False, args: Sequence[Node] = ()) -> FuncGraph:
    """``▸scan`` for a call with these attributes and ``nargs`` arguments (``closed``:
    its body is a graph that captures nothing)."""
    bound = loops.scan.bound_attrs(attrs)
    length, reverse = bound["length"], bool(bound["reverse"])
    return _parsed(("scan", nargs, length, reverse, closed),
                   _scan_text(nargs, length, reverse, closed), "▸scan")


def j_fori_loop(attrs: Attrs, nargs: int, closed: bool = False,
                args: Sequence[Node] = ()) -> FuncGraph:
    """``▸fori_loop``."""
    return _parsed(("fori_loop", closed), _FORI_CLOSED_TEXT if closed else _FORI_TEXT,
                   "▸fori_loop")


def _arity_of(node: Node) -> int:
    value = node.value if isinstance(node, ValueNode) else None
    if isinstance(value, FuncGraph):
        return len(value.parameters)
    if isinstance(value, Primitive) and value.min_args == value.max_args:
        return value.min_args
    raise GradientError("the function given to custom_vjp / custom_jvp must be a function "
                        "written in place (a lambda or a definition's name) to be differentiated",
                        node.loc)


def j_custom_vjp(attrs: Attrs, nargs: int, closed: bool, args: Sequence[Node]) -> FuncGraph:
    """``▸custom_vjp``: the function's J-world value runs ``fwd`` and pulls back with ``bwd``."""
    n = _arity_of(args[0])
    xs = ", ".join(f"x{i}" for i in range(n))
    ds = "".join(f", d[{i}]" for i in range(n)) if n != 1 else ", d[0]"
    text = f"""
lambda (f, fwd, bwd)
  let fn = lambda ({xs})
    let t = fwd({xs})[0] in
    let res = t[1] in
    (t[0], lambda (dout) let d = bwd(res, dout)[0] in (newenv(){ds}) end)
  end in
  (fn, lambda (dfn) (newenv(), newenv(), newenv(), newenv()) end)
end
"""
    return _parsed(("custom_vjp", n), text, "▸custom_vjp")


def j_custom_jvp(attrs: Attrs, nargs: int, closed: bool, args: Sequence[Node]) -> FuncGraph:
    """``▸custom_jvp``: the pullback is the transpose of the user's tangent map, which is
    linear in the tangents: the gradient of ``⟨rule(x, t)[1], dout⟩`` with respect to
    ``t`` — read off the J-transformed rule's own pullback (at ``t = 0``; any ``t``
    gives the same)."""
    n = _arity_of(args[0])
    xs = ", ".join(f"x{i}" for i in range(n))
    zeros = ", ".join(f"zeros_like(x{i})" for i in range(n))
    ds = "".join(f", d[{i}]" for i in range(n))
    text = f"""
lambda (f, rule)
  let fn = lambda ({xs})
    let r = rule(({xs},), ({zeros},)) in
    let o = r[0] in
    (o[0], lambda (dout) let d = r[1]((zeros_like(o[0]), dout))[2] in (newenv(){ds}) end)
  end in
  (fn, lambda (dfn) (newenv(), newenv(), newenv()) end)
end
"""
    return _parsed(("custom_jvp", n), text, "▸custom_jvp")


BODY_INDEX: dict[Primitive, int] = {loops.scan: 0, loops.fori_loop: 2}
"""Which argument is the body, per structured loop."""


def closed_body(prim: Primitive, args: Sequence[Node], manager: Manager) -> bool:
    """Whether the body argument of a call of ``prim`` on ``args`` is a graph constant
    that captures nothing (its gradient has no captured values to carry back)."""
    index = BODY_INDEX.get(prim)
    if index is None or index >= len(args):
        return False
    body = args[index]
    return (isinstance(body, ValueNode) and isinstance(body.value, FuncGraph)
            and not manager.free_variables_total(body.value))


def bake_closed_body(world: FuncGraph, prim: Primitive, args: Sequence[Node]) -> None:
    """Put the J-transformed body of a closed loop into its J-world graph as a constant.

    ``▸scan``'s backward scan calls the J-transformed body ``f`` from a lambda; with
    ``f`` a parameter of ``▸scan`` that lambda captures it, so differentiating the
    gradient again (second order) would meet a loop body with a capture and carry
    its gradient environment through the backward loop — data no exporter writes.
    When the body is a graph capturing nothing (``closed``), its J-transform is a
    graph constant too (``args[index]``): every use of the parameter becomes that
    constant, and the loops inside ``▸scan`` capture nothing either."""
    index = BODY_INDEX.get(prim)
    if index is None or index >= len(args):
        return
    body = args[index]
    if not (isinstance(body, ValueNode) and isinstance(body.value, FuncGraph)):
        return
    # A manager of the copy's own for the rewrite, released after (the ad phase's
    # manager adopts the graph where the J transform calls it).
    owned = world.manager is None
    manager = manage(world)
    manager.replace(world.parameters[index], ValueNode(body.value, body.loc, body.name))
    if owned:
        for graph in list(manager.graphs):
            graph.manager = None


J_WORLD: dict[Primitive, Callable[[Attrs, int, bool, Sequence[Node]], FuncGraph]] = {
    loops.scan: j_scan,
    loops.fori_loop: j_fori_loop,
    loops.custom_vjp: j_custom_vjp,
    loops.custom_jvp: j_custom_jvp,
}
"""The J-world graph of each primitive that calls its function arguments, keyed by the
object; the J transform calls it instead of copying the call (see the module doc)."""

__all__ = ["J_WORLD", "bake_closed_body", "j_fori_loop", "j_scan"]

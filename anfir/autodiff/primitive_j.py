"""Gradient rules of primitives: parsing them, instantiating them, and ``▸p``.

A primitive's rule is ANF text declared with the primitive
(``bprop="lambda (x, y, out, dout) (dx, dy) end"``).  It is parsed once into
a graph; :func:`instantiate_bprop` copies its body into a backward graph with
the parameters bound to the actual forward values, every copied node located
at the user's node — so gradient nodes map back to the user's code.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from anfir.autodiff.loops import J_WORLD
from anfir.autodiff.partials import bound_gradient, j_partial_call
from anfir.abstract.values import AAny, AScalar, ATensor
from anfir.dtypes import is_complex, is_float
from anfir.errors import GradientError
from anfir.grammar.parser import parse_module
from anfir.ir.clone import Cloner
from anfir.ir.attrs import NO_ATTRS, Attrs
from anfir.ir.graph import FuncGraph
from anfir.location import Location
from anfir.ir.manager import manage
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.primitives import gradient, structure
from anfir.ir.primitive import MetaFunction, Primitive

_rules: dict[tuple[str, int], FuncGraph] = {}
_forward: dict[tuple[str, int], FuncGraph] = {}
_metas: dict[str, MetaFunction] = {}

def has_rule(prim: Primitive, nargs: int) -> bool:
    """Whether ``prim`` called with ``nargs`` arguments can be differentiated."""
    if not prim.differentiable or prim.structural_gradient or prim is structure.partial:
        return True
    if prim in J_WORLD:  # structured loops: their J-world graph (autodiff/loops.py)
        return True
    return prim.bprop_text(prim.input_count(nargs)) is not None


def rule_graph(prim: Primitive, ninputs: int) -> FuncGraph:
    """The parsed gradient rule ``(x1..xn, attr1..attrk, out, dout) -> (dx1..dxn)`` of
    ``prim`` called with ``ninputs`` inputs (its attributes are parameters too)."""
    key = (prim.name, ninputs)
    graph = _rules.get(key)
    if graph is None:
        text = prim.bprop_text(ninputs)
        if text is None:
            raise GradientError(f"no gradient rule for {prim.name} with {ninputs} arguments")
        module = parse_module(text, f"<gradient rule of {prim.name}>", allow_internal=True)
        graph = module["main"]
        graph.name = f"bprop_{prim.name}"
        expected = prim.rule_parameters(ninputs)
        if len(graph.parameters) != expected:
            raise GradientError(f"the gradient rule of {prim.name} takes {len(graph.parameters)} "
                                f"parameters; expected {expected} (inputs, attributes, out, dout)")
        manage(graph)
        _rules[key] = graph
    return graph


def instantiate_bprop(prim: Primitive, target: FuncGraph, args: list[Node], out: Node,
                      dout: Node, loc: Optional[Location], attrs: Attrs = NO_ATTRS,
                      types: Sequence[Any] = ()) -> list[Node]:
    """Nodes in ``target`` computing the gradient of each argument of ``prim(*args)``
    (a call with the attributes ``attrs``; ``types``: the arguments' types where the
    caller knows them, the forward copies ``args`` may not carry them).

    The rule's attribute parameters are bound to the call's attributes (their
    defaults when not given) as constants, or to the positional arguments that
    stand for them (``sum(x, a)``), which get zero gradients.
    """
    nargs = len(args)
    getitem = ValueNode(structure.tuple_getitem)
    if not prim.differentiable:
        return [CNode(target, [ValueNode(structure.zeros_like), a], loc) for a in args]
    if prim.structural_gradient:
        return [CNode(target, [getitem, dout, ValueNode(i)], loc) for i in range(nargs)]
    ninputs = prim.input_count(nargs)
    inputs, positional = args[:ninputs], args[ninputs:]
    rule = rule_graph(prim, ninputs)
    mng = rule.manager or manage(rule)
    attr_nodes: list[Node] = [positional[i] if i < len(positional)
                              else ValueNode(attrs[name] if name in attrs else default, loc)
                              for i, (name, default) in enumerate(prim.attrs.items())]
    seed: dict[Node, Node] = dict(zip(rule.parameters, [*inputs, *attr_nodes, out, dout]))
    cloner = Cloner(mng, mng.scope(rule), node_map=seed, inline_into={rule: target},
                    loc=loc.derive(f"ad: gradient rule of {prim.name}") if loc else None)
    result = cloner.output_of(rule)
    zeros = [CNode(target, [ValueNode(structure.zeros_like), a], loc) for a in positional]
    if isinstance(result, CNode) and result.is_apply(structure.make_tuple) \
            and len(result.inputs) == ninputs + 1:
        grads = list(result.inputs[1:])
    else:
        grads = [CNode(target, [getitem, result, ValueNode(i)], loc) for i in range(ninputs)]
    known = [*types, *([None] * ninputs)]
    return [*(_in_input_type(target, g, x, x.abstract if known[i] is None else known[i], loc)
              for i, (g, x) in enumerate(zip(grads, inputs))), *zeros]


def _in_input_type(target: FuncGraph, grad: Node, x: Node, abstract: Any,
                   loc: Optional[Location]) -> Node:
    """``grad``, the rule's sensitivity of input ``x``, in ``x``'s dtype:
    ``cast_like(grad, x)``, which is a zero of ``x``'s type when ``x`` is an integer
    or a boolean.

    The one rule for sensitivities of integers: they are zeros of the integer's
    type (as JAX's float0 cotangents), never floats.  A rule such as ``mul``'s
    computes ``x * dout`` for a loop counter ``i`` in ``i * x``, a float; were it kept,
    the counter's sensitivity would be an int where it starts (``zeros_like(i)``)
    and a float where a rule adds to it, and a loop carrying it (the backward scan
    of a ``fori_loop`` differentiated again, a tail-recursive ``◂loop``) would change
    its type.  Left out where ``x`` is known to be a float (the optimizer drops the
    cast too, once types show it is one), is not a number (a function, a tuple: the
    cast would keep a closure alive for nothing) or the rule already gives a zero."""
    if abstract is not None and not isinstance(abstract, AAny) and (
            not isinstance(abstract, (AScalar, ATensor))
            or is_float(abstract.dtype) or is_complex(abstract.dtype)):
        return grad
    if isinstance(x, ValueNode) and type(x.value) is float:
        return grad
    if isinstance(grad, CNode) and grad.is_apply(structure.zeros_like) and grad.inputs[1] is x:
        return grad
    return CNode(target, [ValueNode(gradient.cast_like), grad, x], loc)


def j_prim_graph(prim: Primitive, nargs: int) -> FuncGraph:
    """``▸prim`` for ``nargs`` arguments: ``(x...) -> (prim(x...), ◂prim)``."""
    key = (prim.name, nargs)
    graph = _forward.get(key)
    if graph is not None:
        return graph
    fwd = FuncGraph(f"▸{prim.name}")
    xs = [fwd.add_parameter(f"x{i}") for i in range(nargs)]
    if prim is structure.partial:
        y = CNode(fwd, [ValueNode(prim), ValueNode(j_partial_call(nargs - 1)), *xs])
    else:
        y = CNode(fwd, [ValueNode(prim), *xs])
    bwd = FuncGraph(f"◂{prim.name}")
    dout = bwd.add_parameter("dout")
    if prim is structure.partial:
        grads: list[Node] = [bound_gradient(bwd, dout, i, x) for i, x in enumerate(xs)]
    else:
        grads = instantiate_bprop(prim, bwd, list(xs), y, dout, None)
    bwd.output = CNode(bwd, [ValueNode(structure.make_tuple), CNode(bwd, [ValueNode(gradient.newenv)]), *grads])
    fwd.output = CNode(fwd, [ValueNode(structure.make_tuple), y, ValueNode(bwd)])
    _forward[key] = fwd
    return fwd


def j_primitive_value(prim: Primitive) -> Union[FuncGraph, MetaFunction]:
    """The J-transform of ``prim`` used as a value: ``▸prim``, or a meta function
    generating it per argument count when the arity varies."""
    if prim in J_WORLD:  # a structured loop (or custom rule) used as a value: call it directly
        raise GradientError(f"differentiating {prim.name} passed as a value: call it directly")
    if prim.max_args is not None and prim.min_args == prim.max_args:
        return j_prim_graph(prim, prim.min_args)
    meta = _metas.get(prim.name)
    if meta is None:
        meta = MetaFunction(f"J({prim.name})", f"the J-transform of {prim.name}",
                            prim.min_args, prim.max_args,
                            generate=lambda args: j_prim_graph(prim, len(args)), internal=True,
                            generate_for_types=lambda args: j_prim_graph(prim, len(args)))
        _metas[prim.name] = meta
    return meta


__all__ = ["has_rule", "instantiate_bprop", "j_prim_graph", "j_primitive_value", "rule_graph"]

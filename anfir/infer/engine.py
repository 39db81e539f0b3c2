"""The inference engine: abstract interpretation of graphs with an explicit stack.

One **spec** is one graph inferred for one signature (the widened abstract
values of its arguments).  Inferring a spec is a generator (:meth:`Engine.
_run_spec`) that walks the graph's nodes in dependency order and, whenever a
node calls a graph, *yields* a request ``("call", graph, signature, node)``.
The driver loop (:meth:`Engine.drive`) keeps the generators on a list used as
a stack and answers each request from a cache, or by pushing the callee's
generator.  No Python recursion depends on the program: a chain of 1,000
functions is a list of 1,000 generators.

Recursion is a fixpoint.  A request for a spec that is still running is
answered with its current approximation (⊥ at first) and the spec is marked.
When it finishes, if its result is not below the approximation it is run
again with the join as the new approximation (at most ``MAX_ITERATIONS``
times).  Specs that read an approximation (directly, through a callee, or
through the free variables of an enclosing spec that is not finished) are
*provisional*: they belong to the lowest running spec they depend on and are
reset and re-run with it; when that spec is stable they all become final.  A
spec whose final result is still ⊥ (``def f(x) = f(x)``) is an error, and a
graph that keeps being called with new signatures stops at
``MAX_SIGNATURES``.

How specs are made is the *provider*'s business: :mod:`anfir.abstract.
specializer` clones a graph per signature (the ``specialize`` phase); the
:class:`InPlaceProvider` here types freshly built graphs where they are (the
``ad`` phase and rewrites).

Calls of function atoms: a primitive uses its ``infer`` rule (with constant
folding); ``grad``/``value_and_grad`` make a :class:`GradFn`; graphs, partial
applications and ``GradFn`` are handled here; any other atom class (``JFn``)
is dispatched through :data:`ATOM_CALLERS`, keyed by the atom's class, to a *caller*
— a generator function ``caller(engine, atom, args, node)`` that may ``yield from
engine.call(fn_abstract, args, node)`` to infer further calls and returns the
result's abstract value.  The autodiff types ``JFn`` calls, a layer above, so its
entry calls the up-call slot ``UPCALLS.infer_j_call`` (:mod:`anfir.ir.upcalls`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Generator, Iterable, Optional, Sequence, TypeVar

import sympy

from anfir.abstract.lattice import (BOTTOM, JoinError, abstract_of_value, is_float_scalar, join,
                                    sorted_atoms, widen)
from anfir.abstract.shapes import norm_dim
from anfir.dtypes import is_float, is_integer, is_signed_int
from anfir.abstract.typeann import Binding, abstract_from_annotation, match_annotation
from anfir.abstract.values import (UNKNOWN, AAny, AbstractValue, AEnv, AFunction, ANone, AScalar,
                                   AString, ATensor, ATuple, FunctionAtom, GradFn, GraphFn,
                                   GraphSig, JFn, PartialFn, PrimFn)
from anfir.errors import (AnfirError, AnfirTypeError, ArityError, GradientError, InferenceError)
from anfir.ir.clone import clone
from anfir.ir.graph import FuncGraph
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.attrs import NO_ATTRS, Attrs
from anfir.ir.primitive import MetaFunction, call_attrs
from anfir.abstract.rules import static_of_abstract
from anfir.ir.walk import toposort
from anfir.ir.upcalls import UPCALLS
from anfir.infer.loops import PRIMITIVE_CALLERS
from anfir.primitives import meta as metas, structure
from anfir.runtime_values import Symbol

MAX_SIGNATURES = 50
"""Most signatures one graph may be specialized for before inference gives up."""
MAX_ITERATIONS = 100
"""Most re-runs of one recursive spec before inference gives up."""

NEW, RUNNING, PROVISIONAL, FINAL = "new", "running", "provisional", "final"
_INF = 1 << 60

Request = tuple
Infer = Generator[Request, Any, AbstractValue]
R = TypeVar("R")
AtomCaller = Callable[["Engine", FunctionAtom, tuple, Optional[CNode]], Infer]

ATOM_CALLERS: dict[type, AtomCaller] = {
    # looked up at each call: the slot is filled by anfir.wiring after this module loads
    JFn: lambda engine, atom, args, node: UPCALLS.infer_j_call(engine, atom, args, node),
}
"""Inference of calls to atom classes the engine does not know, by class (see module doc)."""


class Spec:
    """One graph inferred for one signature."""

    __slots__ = ("template", "sig", "graph", "order", "enclosing", "state", "approx", "used_approx",
                 "approx_site", "out", "index", "dep", "calls", "iterations", "binding", "serial")

    def __init__(self, template: FuncGraph, sig: tuple, graph: FuncGraph, order: list[Node],
                 enclosing: Optional["Spec"], binding: Binding, serial: int) -> None:
        self.template = template
        """The graph this spec was made from (clones are made from untouched templates)."""
        self.sig = sig
        """The widened argument abstracts."""
        self.graph = graph
        """The graph being typed (a clone, or the template itself in place)."""
        self.order = order
        """``graph``'s own nodes in dependency order (parameters first)."""
        self.enclosing = enclosing
        """The spec whose graph owns this graph's free variables, if any."""
        self.state = NEW
        self.approx: AbstractValue = BOTTOM
        self.used_approx = False
        self.approx_site: Optional[CNode] = None
        self.out: AbstractValue = BOTTOM
        self.index = -1
        """The stack position while running."""
        self.dep: Optional[Spec] = None
        """While provisional: the spec (lower on the stack) whose approximation it read."""
        self.calls: list[Spec] = []
        self.iterations = 0
        self.binding = binding
        """Dimension variables bound by the parameters' annotations."""
        self.serial = serial

    def ancestors(self) -> Iterable["Spec"]:
        """Enclosing specs, innermost first."""
        s = self.enclosing
        while s is not None:
            yield s
            s = s.enclosing

    def __repr__(self) -> str:
        return f"<Spec @{self.graph.name} ({', '.join(str(a) for a in self.sig)}) {self.state}>"


class _Frame:
    __slots__ = ("spec", "gen", "low", "mark")

    def __init__(self, spec: Optional[Spec], gen: Generator[Request, Any, Any], low: int, mark: int) -> None:
        self.spec = spec
        self.gen = gen
        self.low = low
        """The lowest stack position whose (unfinished) result this run has read."""
        self.mark = mark
        """Length of the provisional log when this run started."""


class Provider:
    """Makes and caches specs; subclasses decide whether graphs are cloned."""

    def typed_result(self, graph: FuncGraph, sig: tuple) -> Optional[AbstractValue]:
        """The result of calling an already typed graph, or None to infer it."""
        return None

    def spec_for(self, graph: FuncGraph, sig: tuple, site: Optional[CNode]) -> Spec:
        """The spec of ``graph`` for ``sig`` (made on first request)."""
        raise NotImplementedError

    def on_reset(self, spec: Spec) -> None:
        """Called when ``spec`` is reset for another fixpoint iteration."""


class Engine:
    """Runs spec generators to a fixpoint; see the module docstring."""

    def __init__(self, provider: Provider) -> None:
        self.provider = provider
        self.log: list[Spec] = []
        """Provisional specs in the order they finished (a run owns the part after its mark)."""
        self._copies: dict[tuple, FuncGraph] = {}
        self.failures: list[AnfirError] = []
        """Errors of calls that would always raise at run time (typed ⊥): a program is
        only rejected for them when its result depends on one."""

    def typing_copy(self, graph: FuncGraph, sig: tuple) -> FuncGraph:
        """This engine's own copy of the shared ``graph`` (and its nested graphs), to type
        for the signature ``sig``.

        Graphs generated by transformations are cached process-wide (``▸mul``,
        the J-world partial call); typing one in place would record the types
        of its first signature on it, and a later inference would trust them
        for any other signature.  One copy per (graph, signature) also keeps
        fixpoint re-runs from making new graphs.
        """
        key = (graph, tuple(widen(a) for a in sig))
        copy = self._copies.get(key)
        if copy is None:
            copy = self._copies[key] = clone(graph)
        return copy

    # -- the driver ---------------------------------------------------------------------
    def drive(self, root: Generator[Request, Any, R]) -> R:
        """Run ``root`` (a generator yielding call requests) and every spec it needs."""
        stack: list[_Frame] = [_Frame(None, root, _INF, len(self.log))]
        send: Any = None
        try:
            while True:
                frame = stack[-1]
                try:
                    request = frame.gen.send(send)
                except StopIteration as stop:
                    if frame.spec is None:
                        return stop.value
                    send = self._finish(stack, stop.value)
                    continue
                send = self._request(stack, request)
        except BaseException:
            # Leave no half-inferred spec behind: a later drive must not take a spec
            # that was running when the error struck for a recursive call.
            for s in [f.spec for f in stack[1:]] + self.log[stack[0].mark:]:
                if s is not None and s.state != FINAL:
                    s.state = NEW
                    s.used_approx = False
                    s.dep = None
                    self._clear(s)
            del self.log[stack[0].mark:]
            raise

    def _request(self, stack: list[_Frame], request: Request) -> Any:
        _, graph, sig, site = request
        caller = stack[-1]
        fixed = self.provider.typed_result(graph, sig)
        if fixed is not None:
            return (None, fixed)
        spec = self.provider.spec_for(graph, sig, site)
        if caller.spec is not None:
            caller.spec.calls.append(spec)
        if spec.state == FINAL:
            return (spec, spec.out)
        if spec.state == PROVISIONAL:
            caller.low = min(caller.low, _dep_index(spec))
            return (spec, spec.out)
        if spec.state == RUNNING:
            spec.used_approx = True
            if spec.approx_site is None:
                spec.approx_site = site
            caller.low = min(caller.low, spec.index)
            return (spec, spec.approx)
        spec.state = RUNNING
        spec.index = len(stack)
        stack.append(_Frame(spec, self._run_spec(spec), self._inherited_low(spec), len(self.log)))
        return None

    @staticmethod
    def _inherited_low(spec: Spec) -> int:
        # A closure reads its enclosing specs' nodes: it is no more final than they are.
        low = _INF
        for anc in spec.ancestors():
            if anc.state == RUNNING:
                low = min(low, anc.index)
            elif anc.state == PROVISIONAL:
                low = min(low, _dep_index(anc))
        return low

    def _finish(self, stack: list[_Frame], out: AbstractValue) -> Any:
        frame = stack[-1]
        spec = frame.spec
        assert spec is not None
        index = len(stack) - 1
        if spec.used_approx:
            try:
                grown = join(spec.approx, out)
            except JoinError as exc:
                site = spec.approx_site
                raise InferenceError(
                    f"cannot infer the type of the recursive function @{spec.graph.name}: it "
                    f"returns {exc.a} on one path and {exc.b} on another",
                    site.loc if site is not None else spec.graph.loc) from None
            if grown != spec.approx:
                spec.iterations += 1
                if spec.iterations > MAX_ITERATIONS:
                    raise InferenceError(
                        f"inference does not terminate for @{spec.graph.name} (its type keeps "
                        f"changing: {grown})", spec.graph.loc)
                spec.approx = grown
                spec.used_approx = False
                # Everything that finished during this run may have read the old approximation.
                for s in self.log[frame.mark:]:
                    if s.state == PROVISIONAL:
                        s.state = NEW
                        s.used_approx = False
                        s.dep = None
                        self._clear(s)
                del self.log[frame.mark:]
                self._clear(spec)
                frame.gen = self._run_spec(spec)
                frame.low = self._inherited_low(spec)
                return None
            out = spec.approx
        stack.pop()
        if out is BOTTOM and frame.low >= index and not self.failures:
            # (With a recorded failure, ⊥ is the result of a call that always raises:
            # the caller of the inference reports it if the entry itself is ⊥.)
            site = spec.approx_site
            raise InferenceError(
                f"cannot infer the type of @{spec.graph.name}: every path through it calls "
                f"itself again (a recursion without a base case)",
                site.loc if site is not None else spec.graph.loc)
        spec.out = out
        caller = stack[-1]
        if frame.low < index:
            spec.state = PROVISIONAL
            spec.dep = stack[frame.low].spec
            self.log.append(spec)
            caller.low = min(caller.low, frame.low)
        else:
            # Nothing below this run was read: it and all it left provisional are final.
            spec.state = FINAL
            for s in self.log[frame.mark:]:
                s.state = FINAL
                s.dep = None
            del self.log[frame.mark:]
        return (spec, out)

    def _clear(self, spec: Spec) -> None:
        for node in spec.order:
            if isinstance(node, CNode):
                node.abstract = None
        spec.calls = []
        spec.out = BOTTOM
        self.provider.on_reset(spec)

    # -- one spec ---------------------------------------------------------------------
    def _run_spec(self, spec: Spec) -> Infer:
        binding = dict(spec.binding)
        for node in spec.order:
            if not isinstance(node, CNode):
                continue
            result = yield from self.infer_cnode(node)
            node.abstract = result
            if node.annotation is not None and result is not BOTTOM:
                self._check_annotation(node.annotation, result, binding, node,
                                       f"the value of {node.name or 'this expression'}")
        graph = spec.graph
        out = self.input_abstract(graph.output)
        ret = graph.flags.get("return_type")
        if ret is not None and out is not BOTTOM:
            self._check_annotation(ret, out, binding, None, f"the result of @{graph.name}",
                                   fallback=graph.loc)
        return out

    @staticmethod
    def _check_annotation(ann: Any, value: AbstractValue, binding: Binding, node: Optional[Node],
                          what: str, fallback: Any = None) -> None:
        why = match_annotation(ann, value, binding)
        if why is not None:
            loc = getattr(ann, "loc", None) or (node.loc if node is not None else fallback)
            raise AnfirTypeError(f"{what} is {value}, which does not match its annotation "
                                 f"{ann} ({why})", loc)

    def input_abstract(self, node: Node) -> AbstractValue:
        """The abstract value of an input: constants are typed on first use."""
        if node.abstract is not None:
            return node.abstract
        if isinstance(node, ValueNode):
            value = constant_abstract(node)
            if node.annotation is not None:  # ``let y: i64 = 1.0 in ...``
                self._check_annotation(node.annotation, value, {}, node,
                                       f"the value of {node.name or 'this constant'}")
            node.abstract = value
            return value
        raise InferenceError(f"internal: {node!r} is used before it is typed", node.loc)

    def infer_cnode(self, node: CNode) -> Infer:
        """Infer one CNode from its inputs' abstracts (a generator: it may request calls)."""
        inputs = node.inputs
        if not inputs:
            raise InferenceError("a call without a callee", node.loc)
        callee = self.input_abstract(inputs[0])
        args = tuple(self.input_abstract(i) for i in inputs[1:])
        return (yield from self.call(callee, args, node))

    # -- calls -------------------------------------------------------------------------
    def call(self, callee: AbstractValue, args: tuple, node: Optional[CNode]) -> Infer:
        """Infer ``callee(*args)``: every function the callee may be, joined."""
        if callee is BOTTOM or any(a is BOTTOM for a in args):
            return BOTTOM  # calls are strict: no value yet
        if isinstance(callee, AAny):
            return AAny()
        loc = node.loc if node is not None else None
        if not isinstance(callee, AFunction):
            raise AnfirTypeError(f"cannot call a value of type {callee}: it is not a function", loc)
        result: AbstractValue = BOTTOM
        for atom in sorted_atoms(callee):
            value = yield from self.call_atom(atom, args, node)
            try:
                result = join(result, value)
            except JoinError as exc:
                what = ("the branches of this `if`" if _is_switch_call(node)
                        else "the functions this call may reach")
                raise AnfirTypeError(f"{what} return different types: {exc.a} and {exc.b}", loc) from None
        return result

    def call_atom(self, atom: FunctionAtom, args: tuple, node: Optional[CNode]) -> Infer:
        """Infer a call of one function atom."""
        loc = node.loc if node is not None else None
        if isinstance(atom, PrimFn):
            typed_here = PRIMITIVE_CALLERS.get(atom.prim)
            if typed_here is not None:  # a structured loop: the engine types its body call
                return (yield from typed_here(self, args, node))
            generated = self._generated_graph(atom.prim, args, node)
            if generated is not None:
                return (yield from self.call_atom(GraphFn(generated), args, node))
            return self.apply_primitive(atom.prim, args, node)
        if isinstance(atom, GraphFn):
            graph = atom.graph
            if len(args) != len(graph.parameters):
                raise ArityError(f"@{graph.name} takes {len(graph.parameters)} argument"
                                 f"{'' if len(graph.parameters) == 1 else 's'}, got {len(args)}", loc)
            if _too_big(args):
                raise InferenceError(
                    f"inference does not terminate for {graph.name} (signatures keep growing: "
                    f"its arguments' types are nested too deeply)", loc)
            sig = tuple(widen(a) for a in args)
            _, out = yield ("call", graph, sig, node)
            return out
        if isinstance(atom, PartialFn):
            return (yield from self.call_atom(atom.fn, tuple(atom.args) + tuple(args), node))
        if isinstance(atom, GradFn):
            return (yield from self._call_grad(atom, args, node))
        caller = ATOM_CALLERS.get(type(atom))
        if caller is None:
            raise InferenceError(f"cannot infer a call of {atom}", loc)
        return (yield from caller(self, atom, args, node))

    def _generated_graph(self, prim: Any, args: tuple, node: Optional[CNode]) -> Optional[FuncGraph]:
        """For a meta function whose graph the argument types determine (the J-world
        partial call, ``J`` of a variable-arity primitive), the graph to type the call
        as; None for anything else."""
        if not isinstance(prim, MetaFunction) or prim.generate_for_types is None:
            return None
        if not prim.accepts(len(args)) or any(a is BOTTOM for a in args):
            return None  # apply_primitive reports the arity error; calls are strict
        try:
            graph = prim.generate_for_types(args)
        except AnfirError as exc:
            if exc.loc is None and node is not None:
                raise type(exc)(exc.message, node.loc, exc.hint) from None
            raise
        if graph is None:
            return None
        return self.typing_copy(graph, args)

    def _call_grad(self, atom: GradFn, args: tuple, node: Optional[CNode]) -> Infer:
        loc = node.loc if node is not None else None
        out = yield from self.call_atom(atom.fn, args, node)
        if out is BOTTOM:
            return BOTTOM
        if not isinstance(out, AAny) and not is_float_scalar(out):
            kind = "a float" if isinstance(out, AScalar) else "a scalar"
            raise GradientError(f"grad of a function whose output is not {kind} (got {out})", loc)
        grads = []
        for i in atom.wrt:
            if not -len(args) <= i < len(args):  # (negative indices count from the end)
                plural = "" if len(args) == 1 else "s"
                raise GradientError(f"gradient with respect to argument {i}, but the function "
                                    f"is called with {len(args)} argument{plural}", loc)
            i %= len(args)
            try:
                grads.append(gradient_abstract(args[i], i, loc))
            except GradientError as err:
                # The call raises when it runs: it has no value (⊥), like at run time a
                # path that is not taken does not raise.  Reported if nothing else is left.
                self.failures.append(err)
                return BOTTOM
        grad = grads[0] if len(grads) == 1 else ATuple(tuple(grads))
        return ATuple((out, grad)) if atom.with_value else grad

    def apply_primitive(self, prim: Any, args: tuple, node: Optional[CNode]) -> AbstractValue:
        """Apply a primitive's (or meta function's) rule, with constant folding."""
        loc = node.loc if node is not None else None
        if not prim.accepts(len(args)):
            expected = prim.arity_text()
            raise ArityError(f"{prim.name} takes {expected} argument"
                             f"{'' if expected == '1' else 's'}, got {len(args)}", loc)
        if isinstance(prim, MetaFunction):
            return _meta_rule(prim, args, loc)
        if not prim.accepts_any and any(isinstance(a, AAny) for a in args):
            return AAny()
        if prim.infer is None:
            raise InferenceError(f"the primitive {prim.name} has no inference rule", loc)
        attrs = _site_attrs(node, prim)
        try:
            if prim.attrs:
                # The rule sees every attribute (defaults filled in); positional
                # arguments standing for attributes must be known constants.
                inputs = prim.input_count(len(args))
                positional = [static_of_abstract(a, f"the {name} of {prim.name}")
                              for name, a in zip(prim.positional_attrs, args[inputs:])]
                result = prim.infer(*args[:inputs], **prim.bound_attrs(attrs, positional))
            else:
                result = prim.infer(*args)
        except AnfirError as exc:
            if exc.loc is None:
                raise type(exc)(exc.message, loc, exc.hint) from None
            raise
        except Exception as exc:  # a rule's own bug must still be a located, typed error
            raise InferenceError(f"the inference rule of {prim.name} failed on "
                                 f"({', '.join(str(a) for a in args)}): {exc!r}", loc) from None
        if (isinstance(result, AScalar) and result.value is UNKNOWN and prim.foldable and args
                and all(_known(a) for a in args)):
            value = _fold(prim, args, result.dtype, attrs)
            if value is not UNKNOWN:
                result = AScalar(result.dtype, value)
        return result


MAX_TYPE_SIZE = 10_000
"""Most leaves an argument type may have (counted with sharing) before a call is refused."""


def _too_big(args: tuple) -> bool:
    # Sizes are counted over the DAG (shared sub-values once), so ``f((x, x))``
    # recursion is stopped long before hashing its signatures gets exponential.
    size: dict[int, int] = {}
    stack: list[tuple[AbstractValue, bool]] = [(a, False) for a in args]
    while stack:
        value, done = stack.pop()
        key = id(value)
        if key in size:
            continue
        if not isinstance(value, ATuple):
            size[key] = 1
        elif done:
            size[key] = sum(size[id(i)] for i in value.items) + 1
            if size[key] > MAX_TYPE_SIZE:
                return True
        else:
            stack.append((value, True))
            stack.extend((i, False) for i in value.items)
    return False


def _dep_index(spec: Spec) -> int:
    """The stack position of the running spec a provisional one depends on."""
    dep = spec.dep
    while dep is not None and dep.state == PROVISIONAL:
        dep = dep.dep
    if dep is None or dep.state != RUNNING:
        return _INF
    spec.dep = dep  # shorten the chain for the next lookup
    return dep.index


def _is_switch_call(node: Optional[CNode]) -> bool:
    if node is None or not node.inputs:
        return False
    head = node.inputs[0]
    if isinstance(head, CNode) and head.inputs:
        callee = head.inputs[0]
        return isinstance(callee, ValueNode) and callee.value is structure.switch
    return False


def constant_abstract(node: ValueNode) -> AbstractValue:
    """The abstract value of a constant node (graphs and primitives are function atoms)."""
    value = node.value
    if isinstance(value, Symbol):
        raise InferenceError(f"unresolved name {value.name!r}", node.loc)
    try:
        return abstract_of_value(value)
    except AnfirError as exc:
        raise type(exc)(exc.message, node.loc, exc.hint) from None


def gradient_abstract(arg: AbstractValue, index: int, loc: Any) -> AbstractValue:
    """The type of the gradient with respect to an argument of type ``arg``."""
    if isinstance(arg, AScalar) and not is_float(arg.dtype):
        raise GradientError(f"gradients with respect to integer arguments are not supported "
                            f"(argument {index} is {arg})", loc)
    if isinstance(arg, ATensor) and not is_float(arg.dtype):
        raise GradientError(f"gradients with respect to integer arguments are not supported "
                            f"(argument {index} is {arg})", loc)
    if isinstance(arg, AString):
        raise GradientError(f"a gradient with respect to a string is not defined "
                            f"(argument {index} is {arg})", loc)
    return _zero_of(widen(arg))


def _zero_of(a: AbstractValue) -> AbstractValue:
    if isinstance(a, ATuple):
        return ATuple(tuple(_zero_of(i) for i in a.items))
    if isinstance(a, (AFunction, AEnv)):
        return AEnv()
    if isinstance(a, AString):
        return ANone()
    return a


def _meta_rule(meta: Any, args: tuple, loc: Any) -> AbstractValue:
    if any(isinstance(a, AAny) for a in args):
        return AAny()  # (a function value typed for unknown arguments)
    if meta not in (metas.grad, metas.value_and_grad):
        raise InferenceError(f"cannot infer the meta function {meta.name}", loc)
    fn = args[0]
    if isinstance(fn, AAny):
        return AAny()
    if not isinstance(fn, AFunction):
        raise GradientError(f"{meta.name} needs a function, not {fn}", loc)
    wrt: list[int] = []
    for a in args[1:]:
        if (not isinstance(a, AScalar) or not is_signed_int(a.dtype)
                or a.value is UNKNOWN or isinstance(a.value, sympy.Basic)):
            raise GradientError(f"the argument indices of {meta.name} must be integer constants, "
                                f"not {a}", loc)
        wrt.append(int(a.value))
    indices = tuple(wrt) if wrt else (0,)
    with_value = meta is metas.value_and_grad
    return AFunction(frozenset(GradFn(atom, indices, with_value) for atom in fn.options))




# -- constant folding ------------------------------------------------------------------


def _known(a: AbstractValue) -> bool:
    return (isinstance(a, AScalar) and a.value is not UNKNOWN) or (
        isinstance(a, AString) and a.value is not UNKNOWN)


def _site_attrs(node: Any, prim: Any) -> Attrs:
    """The attributes of the call site ``node`` of ``prim``: a CNode's own, or those
    a stand-in site carries (the rewrites' typing of a node not built yet)."""
    if node is None:
        return NO_ATTRS
    if isinstance(node, CNode):
        return call_attrs(node, prim)
    attrs = getattr(node, "attrs", NO_ATTRS)
    return attrs if isinstance(attrs, Attrs) else NO_ATTRS


def _fold(prim: Any, args: tuple, dtype: str, attrs: Attrs = NO_ATTRS) -> Any:
    values = [a.value for a in args]
    if any(isinstance(v, sympy.Basic) for v in values):
        fn = prim.symbolic
        if fn is None:
            return UNKNOWN
        try:
            return norm_dim(sympy.expand(fn(*values)))
        except Exception:  # noqa: BLE001 - an unfoldable expression just stays unknown
            return UNKNOWN
    if prim.fold_guard is not None and not prim.fold_guard(values):
        return UNKNOWN  # too costly to fold at compile time (10 ** 10 ** 9)
    try:
        value = prim.impl(*values, **attrs)
    except Exception:  # noqa: BLE001 - a failing fold leaves the value to run time
        return UNKNOWN
    if hasattr(value, "item") and not isinstance(value, (bool, int, float, str)):
        try:
            value = value.item()
        except Exception:  # noqa: BLE001
            return UNKNOWN
    if not isinstance(value, (bool, int, float)):
        return UNKNOWN
    if dtype == "bool":
        return bool(value)
    if is_integer(dtype):
        value = int(value)
        return value if value.bit_length() <= 62 else UNKNOWN
    value = float(value)
    return UNKNOWN if math.isnan(value) else value


# -- typing new graphs in place -------------------------------------------------------
GENERIC = "generic"
"""The flag of a graph built after specialization that is typed for unknown arguments
wherever it is called, as the specializer types a function value called with several
signatures (the J-transform of such a graph, ``▸g`` and ``◂g``)."""


class InPlaceProvider(Provider):
    """Specs are the graphs themselves (no cloning): for graphs built after specialization.

    A graph that already has a :class:`GraphSig` is trusted (its output type is
    returned without re-inference); a new graph is typed for the first
    signature it is called with; a second, different signature is an error
    (clone the graph first) — except for a graph flagged :data:`GENERIC`, typed
    once for unknown arguments and serving every call.
    """

    def __init__(self) -> None:
        self.by_graph: dict[FuncGraph, Spec] = {}
        self.serial = 0

    def typed_result(self, graph: FuncGraph, sig: tuple) -> Optional[AbstractValue]:
        """A graph typed before this run is trusted: its recorded output type."""
        if graph not in self.by_graph and isinstance(graph.abstract, GraphSig):
            return graph.abstract.out
        return None

    def spec_for(self, graph: FuncGraph, sig: tuple, site: Optional[CNode]) -> Spec:
        """The graph itself, typed for its first signature (for unknown arguments if it
        is flagged :data:`GENERIC`, whatever the signature)."""
        if graph.flags.get(GENERIC):
            sig = tuple(AAny() for _ in graph.parameters)
        spec = self.by_graph.get(graph)
        if spec is not None:
            if spec.sig != sig:
                raise InferenceError(
                    f"@{graph.name} is called with two different signatures "
                    f"({', '.join(map(str, spec.sig))}) and ({', '.join(map(str, sig))}); "
                    "clone it to type both", site.loc if site is not None else graph.loc)
            return spec
        order = toposort(graph)
        enclosing = None
        if graph.manager is not None:
            parent = graph.manager.parent(graph)
            enclosing = self.by_graph.get(parent) if parent is not None else None
        binding = dict(enclosing.binding) if enclosing is not None else {}
        set_parameters(graph, sig, binding, site)
        self.serial += 1
        spec = Spec(graph, sig, graph, order, enclosing, binding, self.serial)
        self.by_graph[graph] = spec
        return spec

    def finish(self, engine: "Engine") -> None:
        """Type the function values that were made but never called (for unknown arguments,
        or their annotations), then give every typed graph its signature."""
        scanned: set[Spec] = set()
        failed: set[FuncGraph] = set()
        while True:
            pending: list[FuncGraph] = []
            for spec in list(self.by_graph.values()):
                if spec in scanned:
                    continue
                scanned.add(spec)
                nodes = [i for n in spec.order for i in n.inputs]
                if spec.graph.has_output:
                    nodes.append(spec.graph.output)
                for node in nodes:
                    if (isinstance(node, ValueNode) and isinstance(node.value, FuncGraph)
                            and node.value.abstract is None and node.value not in self.by_graph
                            and node.value not in pending and node.value not in failed):
                        pending.append(node.value)
            if not pending:
                break
            for graph in pending:
                binding: dict = {}
                sig = tuple(abstract_from_annotation(p.annotation, binding) if p.annotation
                            is not None else AAny() for p in graph.parameters)
                try:
                    engine.drive(_request_root(graph, sig))
                except AnfirError:
                    self.by_graph.pop(graph, None)  # never called and ill-typed: left untyped
                    graph.flags[UNTYPED] = True  # (the validator knows it is so by design)
                    failed.add(graph)
        for graph, spec in self.by_graph.items():
            graph.abstract = GraphSig(tuple(p.abstract for p in graph.parameters), spec.out)


UNTYPED = "untyped"
"""The flag of a graph the specializer leaves untyped by design: a function value
that is never called and is ill-typed for unknown arguments (``lambda (x) a(x)
end`` with ``a`` a number) — an error only if something calls it at run time."""


def _request_root(graph: FuncGraph, sig: tuple) -> Infer:
    _, out = yield ("call", graph, sig, None)
    return out


def set_parameters(graph: FuncGraph, sig: Sequence[AbstractValue], binding: Binding,
                   site: Optional[CNode]) -> None:
    """Type ``graph``'s parameters with ``sig``, checking their annotations."""
    for i, (param, value) in enumerate(zip(graph.parameters, sig)):
        ann = param.annotation
        if ann is not None:
            why = match_annotation(ann, value, binding)
            if why is not None:
                loc = site.loc if site is not None and site.loc is not None else (
                    getattr(ann, "loc", None) or param.loc)
                hint = ""
                ann_loc = getattr(ann, "loc", None)
                if site is not None and ann_loc is not None:
                    hint = f"the annotation is at {ann_loc.short()}"
                raise AnfirTypeError(
                    f"argument {i + 1} ({param.name}) of @{graph.name} is {value}, which does "
                    f"not match its annotation {ann} ({why})", loc, hint)
        param.abstract = value

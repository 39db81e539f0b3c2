"""Write anfir programs as MindSpore ``.mindir`` files.

::

    data = anfir.export_mindir(mod, entry="mlp_loss", args=[w1, w2, x, y], path="mlp.mindir")
    # in MindSpore:  mindspore.nn.GraphCell(mindspore.load("mlp.mindir"))(*tensors)

The program is compiled (``anfir.compile``: specialized, differentiated,
optimized) and its graphs themselves are written — not a flattened
first-order program — because MindIR has anfir's model: graphs are values,
closures are ``Partial``\\ s, ``if`` is ``Switch`` of two functions followed by
a call of the chosen one, a loop is a graph that tail-calls itself.

* every graph reachable from the entry becomes a ``GraphProto`` (the entry is
  ``ModelProto.graph``, the others ``functions``);
* closures are lambda-lifted: a graph's free variables become its first
  inputs, a use of the graph as a value is ``Partial(graph, captured...)`` and a
  direct call passes them first — no graph of the file has a free variable
  (MindSpore hangs loading one that does);
* a primitive call is written by :data:`RULES` (keyed by the primitive object)
  as MindSpore ops; a call of a computed function is ``REF::<node>``;
* weights: the entry's parameters named in ``params`` (e.g. ``mod.params`` of
  an imported model) are written as ``GraphProto.parameter`` tensors;
* dtypes as MindSpore wants them: anfir's Python scalars are 0-d tensors, a
  scalar constant next to a tensor carries that tensor's dtype (``Pow(f64,
  i64)`` finds no kernel), a tuple index is a scalar INT64 constant (a 0-d
  tensor there crashes MindSpore), a dtype is MindSpore's type id.

A program anfir cannot write (a primitive without a rule) is one located
:class:`MindirError` listing every such node.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Sequence

import numpy as np

from anfir.abstract.values import AScalar, ATensor, ATuple
from anfir.dtypes import BY_NAME, LITERAL_DTYPES, dtype_name, is_bool, is_integer
from anfir.interop.mindir.environments import EnvLayout, is_env, plan, signature, slot_types
from anfir.interop.mindir.common import TENSOR_TYPE_OF, TYPE_ID_OF, MindirError, write_tensor
from anfir.interop.mindir.schema import classes
from anfir.ir.graph import FuncGraph, Module
from anfir.ir.manager import analyse
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.ir.walk import reachable_graphs, toposort
from anfir.decompositions import DECOMPOSITIONS
from anfir.passes import ad, inline
from anfir.passes.compile_state import Program
from anfir.passes.inline import inline_calls
from anfir.ir.manager import remove_dead_graphs
from anfir.passes.decompose import decompose
from anfir.passes.pipeline import PHASES, Phase, compile_program
from anfir.primitives import arith, elementwise, gradient, structure, tensor
from anfir.primitives.conv import conv_params
from anfir.primitives.conv import pool_params as conv_params_pool
from anfir.primitives.registry import PRIMITIVES
from anfir.runtime_values import SymbolicKey

P = PRIMITIVES


class _Unsupported(Exception):
    """A node the writer has no rule for (collected into one MindirError)."""


class Writer:
    """One program being written."""

    def __init__(self, params: Optional[dict[str, Any]] = None) -> None:
        C = classes()
        self.C = C
        self.A = C["AttributeProto"]
        self.model = C["ModelProto"]()
        self.params = params or {}
        self.graph_names: dict[FuncGraph, str] = {}
        self.fvs: dict[FuncGraph, list[Node]] = {}
        self.prim_keys: dict[str, str] = {}
        self.constants: dict[Any, str] = {}
        self.counter = 0
        self.errors: list[str] = []
        self.first_error: Any = None
        # per graph being written
        self.gp: Any = None
        self.graph: Optional[FuncGraph] = None
        self.names: dict[Node, str] = {}
        # gradient environments as tuples (environments.py); None: Environ ops
        self.envs: Optional[EnvLayout] = None

    # -- names ----------------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        self.counter += 1
        return f"{base}_{self.counter}"

    def prim(self, op: str, attrs: Optional[dict[str, Any]] = None) -> str:
        """The key of MindSpore primitive ``op`` with ``attrs`` in the model's table
        (added once per distinct attributes: Conv2D keeps its stride there)."""
        ident = op if not attrs else f"{op}{sorted(attrs.items())!r}"
        key = self.prim_keys.get(ident)
        if key is None:
            key = f"{op}:{len(self.prim_keys) + 1}"
            self.prim_keys[ident] = key
            p = self.model.primitives.add(name=key, op_type=op, instance_name="")
            p.prim_type = 1
            for name, value in (attrs or {}).items():
                self.fill(p.attribute.add(name=name), value, None, scalar=True)
        return key

    # -- constants ------------------------------------------------------------------------
    def constant(self, value: Any, dtype: Optional[str] = None, scalar: bool = False) -> str:
        """The global name of a Constant node holding ``value``.  Numbers become
        0-d tensors of ``dtype`` (their own type otherwise) unless ``scalar``
        (a tuple index, an axis: MindSpore wants a scalar value node there)."""
        key = (_key(value), dtype, scalar)
        name = self.constants.get(key)
        if name is not None:
            return name
        name = self.fresh("const")
        node = self.model.graph.node.add(name=name, op_type="Constant")
        node.output.append(name)
        attr = node.attribute.add(name="value")
        self.fill(attr, value, dtype, scalar)
        self.constants[key] = name
        return name

    def fill(self, attr: Any, value: Any, dtype: Optional[str], scalar: bool, item: bool = False) -> None:
        # A scalar inside a tuple goes in the repeated field (``ints``), as MindSpore
        # writes it and its loader requires; a lone scalar in the singular one.
        A = self.A
        if isinstance(value, (bool, np.bool_)) and scalar:
            attr.type = A.BOOL
            attr.ints.append(int(bool(value))) if item else setattr(attr, "i", int(bool(value)))
        elif isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and scalar:
            attr.type = A.INT64
            attr.ints.append(int(value)) if item else setattr(attr, "i", int(value))
        elif isinstance(value, (float, np.floating)) and scalar:
            attr.type = A.FLOAT
            attr.floats.append(float(value)) if item else setattr(attr, "f", float(value))
        elif isinstance(value, (bool, int, float, np.generic, np.ndarray)):
            array = np.asarray(value)
            name = dtype or _dtype_of_value(value)
            attr.type = A.TENSORS
            write_tensor(attr.tensors.add(), array.astype(np.dtype(_numpy(name))), name)
        elif isinstance(value, tuple):
            attr.type = A.TUPLE
            for element in value:
                self.fill(attr.values.add(), element, dtype, scalar, item=True)
        elif value is None:
            attr.type = A.NONE
        elif isinstance(value, str):
            attr.type, attr.s = A.STRING, value.encode("utf-8")
        elif isinstance(value, SymbolicKey):
            # A gradient environment's key: a string (MindSpore's loader refuses SYMBOL);
            # the reader turns the key input of EnvironSet/EnvironGet back into a key.
            attr.type, attr.s = A.STRING, value.name.encode("utf-8")
        else:
            raise _Unsupported(f"a constant of type {type(value).__name__} ({value!r:.60})")

    # -- graphs ---------------------------------------------------------------------------
    def run(self, entry: FuncGraph) -> Any:
        graphs = reachable_graphs([entry])
        facts = analyse(*graphs)
        self.envs = plan(graphs)
        used: set[str] = set()
        for k, g in enumerate(graphs):
            base = "".join(c if c.isalnum() or c == "_" else "_" for c in g.name) or "graph"
            name = base if base not in used else f"{base}_{k}"
            used.add(name)
            self.graph_names[g] = name
            self.fvs[g] = list(facts.free_variables_total(g)) if g is not entry else []
        m = self.model
        m.ir_version, m.producer_name, m.model_version = "1.1", "anfir", "2.10.0"
        m.little_endian, m.mind_ir_version = True, 3
        for g in graphs:
            gp = m.graph if g is entry else m.functions.add()
            self.write_graph(g, gp, g is entry)
        if self.errors:
            listed = "\n  ".join(self.errors[:50])
            raise MindirError(f"{len(self.errors)} node(s) cannot be written as MindIR:\n  {listed}",
                              self.first_error)
        return m

    def write_graph(self, g: FuncGraph, gp: Any, is_entry: bool) -> None:
        self.gp, self.graph, self.names = gp, g, {}
        gname = self.graph_names[g]
        gp.name = gname
        for k, fv in enumerate(self.fvs[g]):
            name = f"{gname}:fv{k}_{fv.name or 'v'}"
            self.names[fv] = name
            self.value_info(gp.input.add(name=name), fv.abstract)
        for param in g.parameters:
            name = f"{gname}:{param.name or 'p'}"
            if name in self.names.values():
                name = self.fresh(name)
            self.names[param] = name
            if is_entry and param.name in self.params:
                t = gp.parameter.add(name=name, ref_key=param.name)
                value = np.asarray(self.params[param.name])
                write_tensor(t, value, _dtype_of_value(value))
            else:
                self.value_info(gp.input.add(name=name), param.abstract)
        for node in toposort(g):
            if isinstance(node, CNode):
                try:
                    self.names[node] = self.write_call(node)
                except _Unsupported as e:
                    self.errors.append(f"@{g.name}: {e}")
                    if self.first_error is None:
                        self.first_error = node.loc
                    self.names[node] = self.fresh("failed")
        try:
            out = self.ref(g.output)
        except _Unsupported as e:
            self.errors.append(f"@{g.name}: output: {e}")
            return
        self.value_info(gp.output.add(name=out), g.output.abstract)

    def value_info(self, info: Any, abstract: Any) -> None:
        if isinstance(abstract, ATensor) and abstract.shape is not None:
            t = info.tensor.add(data_type=TENSOR_TYPE_OF.get(abstract.dtype, 0))
            t.dims.extend(d if isinstance(d, int) else -1 for d in abstract.shape)
        elif isinstance(abstract, AScalar) and abstract.dtype in TENSOR_TYPE_OF:
            info.tensor.add(data_type=TENSOR_TYPE_OF[abstract.dtype])

    # -- nodes ----------------------------------------------------------------------------
    def ref(self, node: Node, dtype: Optional[str] = None) -> str:
        """The name of ``node``'s value in the graph being written."""
        name = self.names.get(node)
        if name is not None:
            return name
        if isinstance(node, ValueNode):
            value = node.value
            if isinstance(value, FuncGraph):
                return self.function_value(value)
            if isinstance(value, Primitive):
                raise _Unsupported(f"the primitive {value.name} used as a value")
            if isinstance(value, tuple) and _deeper_than(value, MAX_CONSTANT_NESTING):
                return self.tuple_nodes(value, dtype)
            return self.constant(value, dtype)
        raise _Unsupported(f"{node!r} is not visible in @{self.graph.name if self.graph else '?'}")

    def tuple_nodes(self, value: tuple[Any, ...], dtype: Optional[str]) -> str:
        """A deeply nested constant tuple as MakeTuple nodes, built without recursion
        (protobuf reads messages only ~100 deep: a nested constant would not load)."""
        stack: list[tuple[Any, bool]] = [(value, False)]
        done: list[str] = []
        while stack:
            item, expanded = stack.pop()
            if not isinstance(item, tuple) or not _deeper_than(item, MAX_CONSTANT_NESTING):
                done.append(self.constant(item, dtype))
            elif expanded:
                names = done[len(done) - len(item):] if item else []
                del done[len(done) - len(item):]
                done.append(self.emit("MakeTuple", names))
            else:
                stack.append((item, True))
                stack.extend((element, False) for element in reversed(item))
        return done[-1]

    def function_value(self, h: FuncGraph) -> str:
        """``h`` as a value: its name, or ``Partial(h, captured...)`` when it has free variables."""
        fvs = self.fvs.get(h)
        if fvs is None:
            raise _Unsupported(f"the graph @{h.name} is not part of the program")
        if not fvs:
            return self.graph_names[h]
        return self.emit("Partial", [self.graph_names[h], *(self.ref(v) for v in fvs)], prim=True)

    def emit(self, op: str, inputs: Sequence[str], prim: bool = True, abstract: Any = None,
             attrs: Optional[dict[str, Any]] = None) -> str:
        """Add ``op(inputs)`` to the graph being written; the node's name."""
        assert self.graph is not None
        name = f"{self.graph_names[self.graph]}:{self.fresh('CNode')}"
        node = self.gp.node.add(name=name, op_type=f"REF::{self.prim(op, attrs) if prim else op}")
        node.input.extend(inputs)
        node.output.append(name)
        # The result's type, where it is a tensor (anfir's scalars are 0-d tensors).
        if isinstance(abstract, ATensor) and abstract.shape is not None and abstract.dtype in TENSOR_TYPE_OF:
            shape = node.attribute.add(name="shape", type=self.A.TENSORS)
            t = shape.tensors.add(data_type=TENSOR_TYPE_OF[abstract.dtype])
            t.dims.extend(d if isinstance(d, int) else -1 for d in abstract.shape)
        elif isinstance(abstract, AScalar) and abstract.dtype in TENSOR_TYPE_OF:
            shape = node.attribute.add(name="shape", type=self.A.TENSORS)
            shape.tensors.add(data_type=TENSOR_TYPE_OF[abstract.dtype])
        return name

    def write_call(self, node: CNode) -> str:
        callee = node.callee
        if isinstance(callee, ValueNode) and isinstance(callee.value, Primitive):
            rule = RULES.get(callee.value)
            if rule is None:
                raise _Unsupported(f"primitive {callee.value.name} has no MindIR rule")
            return rule(self, node)
        if isinstance(callee, ValueNode) and isinstance(callee.value, FuncGraph):
            h = callee.value
            if h not in self.fvs:
                raise _Unsupported(f"calls @{h.name}, which is not part of the program")
            inputs = [*(self.ref(v) for v in self.fvs[h]), *(self.ref(a) for a in node.args)]
            return self.emit(self.graph_names[h], inputs, prim=False, abstract=node.abstract)
        return self.emit(self.ref(callee), [self.ref(a) for a in node.args], prim=False,
                         abstract=node.abstract)


# -- the rules ---------------------------------------------------------------------------------
Rule = Callable[[Writer, CNode], str]
RULES: dict[Primitive, Rule] = {}
"""anfir primitive -> how it is written as MindSpore ops."""


def _dtype_of(abstract: Any) -> Optional[str]:
    if isinstance(abstract, (ATensor, AScalar)):
        return str(abstract.dtype)
    return None


def _elementwise(op: str) -> Rule:
    def rule(w: Writer, node: CNode) -> str:
        # A constant operand takes the dtype of the other operand (MindSpore selects
        # kernels by exact dtypes).
        known = [_known(a) for a in node.args]
        others = [_dtype_of(a.abstract) for a, k in zip(node.args, known) if k is None]
        dtype = next((d for d in others if d), None) or _dtype_of(node.abstract)
        inputs = [w.ref(a) if k is None else w.constant(k[0], dtype) for a, k in zip(node.args, known)]
        return w.emit(op, inputs, abstract=node.abstract)
    return rule


def _known(node: Node) -> Optional[tuple[Any]]:
    """``(value,)`` of an operand known when writing: a constant, or the size of a
    tensor of static shape (written as a constant of the other operand's dtype)."""
    if isinstance(node, ValueNode) and not isinstance(node.value, (FuncGraph, Primitive)):
        return (node.value,)
    if isinstance(node, CNode) and node.is_apply(gradient.size):
        try:
            return (int(np.prod(_shape(node.args[0], "size"))),)
        except _Unsupported:
            return None
    return None


ELEMENTWISE: dict[Primitive, str] = {
    arith.add: "Add", arith.sub: "Sub", arith.mul: "Mul", arith.div: "RealDiv", arith.neg: "Neg",
    arith.exp: "Exp", arith.log: "Log", arith.sin: "Sin", arith.cos: "Cos", arith.tanh: "Tanh",
    arith.sqrt: "Sqrt", arith.abs_: "Abs", arith.sign: "Sign", arith.relu: "ReLU",
    arith.sigmoid: "Sigmoid", arith.maximum: "Maximum", arith.minimum: "Minimum", arith.pow_: "Pow",
    arith.gt: "Greater", arith.ge: "GreaterEqual", arith.lt: "Less", arith.le: "LessEqual",
    arith.eq: "Equal", arith.ne: "NotEqual", arith.logical_and: "LogicalAnd",
    arith.logical_or: "LogicalOr", arith.logical_not: "LogicalNot", arith.softplus: "Softplus",
    P["erf"]: "Erf", P["rsqrt"]: "Rsqrt", P["floor"]: "Floor", P["ceil"]: "Ceil",
    P["reciprocal"]: "Reciprocal", tensor.matmul: "MatMulExt",
    tensor.ones_like: "OnesLike", structure.zeros_like: "ZerosLike", tensor.where: "Select",
    elementwise.log1p: "Log1p", elementwise.expm1: "Expm1", elementwise.atan: "Atan",
    elementwise.sinh: "Sinh", elementwise.cosh: "Cosh", elementwise.tan: "Tan",
    elementwise.asin: "Asin", elementwise.acos: "Acos",
    # the seed of reverse mode: 1 of the (scalar, float) output's type
    gradient.grad_seed: "OnesLike",
}
"""Primitives written as one MindSpore op of the same inputs."""
for _prim, _op in ELEMENTWISE.items():
    RULES[_prim] = _elementwise(_op)


def _rule(*prims: Primitive) -> Callable[[Rule], Rule]:
    def register(rule: Rule) -> Rule:
        for prim in prims:
            RULES[prim] = rule
        return rule
    return register


_zeros_like = RULES[structure.zeros_like]


@_rule(structure.zeros_like)
def _zeros_like_rule(w: Writer, node: CNode) -> str:
    # the zero of an environment is the environment with nothing stored
    if w.envs is not None and is_env(node.abstract):
        return _zero_env(w, w.envs)
    return _zeros_like(w, node)


def _static(node: Node, what: str) -> Any:
    if not isinstance(node, ValueNode):
        raise _Unsupported(f"{what} must be a constant")
    return node.value


@_rule(structure.make_tuple)
def _make_tuple(w: Writer, node: CNode) -> str:
    # An int constant item is an anfir Python int (a reshape's (b, l, 4, -1)): a scalar
    # value node, as the items computed next to it are, not a 0-d tensor.
    return w.emit("MakeTuple", [_tuple_item(w, a) for a in node.args])


def _tuple_item(w: Writer, node: Node) -> str:
    if isinstance(node, ValueNode) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return w.constant(node.value, scalar=True)
    return w.ref(node)


@_rule(structure.tuple_getitem)
def _getitem(w: Writer, node: CNode) -> str:
    index = _static(node.args[1], "a tuple index")
    # A scalar INT64 value node: a 0-d tensor index crashes MindSpore.
    return w.emit("TupleGetItem", [w.ref(node.args[0]), w.constant(int(index), scalar=True)],
                  abstract=node.abstract)


@_rule(structure.switch)
def _switch(w: Writer, node: CNode) -> str:
    """``Switch`` of functions (the branches of an ``if``); a switch of data (a branch's
    gradient environment, joined after the call) is a ``Select`` per tensor: MindSpore's
    control-flow scheduler refuses a data ``Switch`` whose operand is a tuple it made
    ("Failed to get level for formal parameter")."""
    abstract = node.abstract
    if w.envs is not None and is_env(abstract) and all(is_env(a.abstract) for a in node.args[1:]):
        abstract = slot_types(w.envs)
    if signature(abstract) is None:
        return w.emit("Switch", [w.ref(a) for a in node.args])
    cond = w.ref(node.args[0])
    if _dtype_of(node.args[0].abstract) != "bool":  # Select takes a bool mask
        cond = w.emit("Cast", [cond, w.constant(TYPE_ID_OF["bool"], scalar=True)])

    def select(x: str, y: str, leaf: Any) -> str:
        shape = () if isinstance(leaf, AScalar) else _shape_of_abstract(leaf)
        mask = cond if shape == () else _broadcast(w, cond, shape)
        return w.emit("Select", [mask, x, y], abstract=leaf)
    return _leafwise(w, w.ref(node.args[1]), w.ref(node.args[2]), abstract, select)


@_rule(structure.partial)
def _partial(w: Writer, node: CNode) -> str:
    fn, *args = node.args
    if isinstance(fn, ValueNode) and isinstance(fn.value, FuncGraph):
        h = fn.value
        inputs = [w.graph_names[h], *(w.ref(v) for v in w.fvs.get(h, ())), *(w.ref(a) for a in args)]
        return w.emit("Partial", inputs)
    return w.emit("Partial", [w.ref(fn), *(w.ref(a) for a in args)])


@_rule(structure.identity, structure.stop_gradient)
def _identity(w: Writer, node: CNode) -> str:
    if node.is_apply(structure.stop_gradient):
        return w.emit("StopGradient", [w.ref(node.args[0])], abstract=node.abstract)
    return w.ref(node.args[0])  # identity: the value itself


@_rule(tensor.cast)
def _cast(w: Writer, node: CNode) -> str:
    dtype = _static(node.args[1], "a cast's dtype")
    if str(dtype) not in TYPE_ID_OF:
        raise _Unsupported(f"cast to {dtype}")
    return w.emit("Cast", [w.ref(node.args[0]), w.constant(TYPE_ID_OF[str(dtype)], scalar=True)],
                  abstract=node.abstract)


@_rule(tensor.transpose)
def _transpose(w: Writer, node: CNode) -> str:
    perm = _static(node.args[1], "a permutation") if len(node.args) > 1 else None
    if perm is None:
        abstract = node.args[0].abstract
        if not isinstance(abstract, ATensor) or abstract.shape is None:
            raise _Unsupported("transpose of a tensor of unknown rank")
        perm = tuple(reversed(range(len(abstract.shape))))
    return w.emit("Transpose", [w.ref(node.args[0]), w.constant(tuple(int(p) for p in perm), scalar=True)],
                  abstract=node.abstract)


@_rule(tensor.reshape)
def _reshape(w: Writer, node: CNode) -> str:
    shape = node.args[1]
    ref = (w.constant(tuple(int(d) for d in shape.value), scalar=True) if isinstance(shape, ValueNode)
           else w.ref(shape))
    return w.emit("Reshape", [w.ref(node.args[0]), ref], abstract=node.abstract)


def _reduce(op: str) -> Rule:
    def rule(w: Writer, node: CNode) -> str:
        axis = node.attrs.get("axis", None) if node.attrs else None
        keep = bool(node.attrs.get("keepdims", False)) if node.attrs else False
        axes = () if axis is None else ((int(axis),) if isinstance(axis, int) else tuple(int(a) for a in axis))
        if axes == () and axis is not None:
            return w.ref(node.args[0])  # an empty tuple of axes reduces nothing
        inputs = [w.ref(node.args[0]), w.constant(axes, scalar=True), w.constant(keep, scalar=True)]
        if op == "ReduceSum":
            inputs.append(w.constant(False, scalar=True))  # skip_mode
        return w.emit(op, inputs, abstract=node.abstract)
    return rule


RULES[tensor.sum_] = _reduce("ReduceSum")
RULES[tensor.mean] = _reduce("ReduceMean")


def _shape(node: Node, what: str) -> tuple[int, ...]:
    """The static shape of ``node`` (a scalar's is ``()``), or unsupported."""
    abstract = node.abstract
    if isinstance(abstract, AScalar):
        return ()
    if isinstance(abstract, ATensor) and abstract.shape is not None and all(
            isinstance(d, int) for d in abstract.shape):
        return tuple(int(d) for d in abstract.shape)
    raise _Unsupported(f"{what} needs static shapes (compile with concrete arguments)")


@_rule(tensor.shape)
def _shape_of(w: Writer, node: CNode) -> str:
    # a static shape is a constant (a tuple of scalar INT64)
    return w.constant(_shape(node.args[0], "shape"), scalar=True)


@_rule(gradient.size)
def _size(w: Writer, node: CNode) -> str:
    return w.constant(int(np.prod(_shape(node.args[0], "size"))), "i64")


def _swap_last(w: Writer, ref: str, rank: int) -> str:
    return w.emit("Transpose", [ref, w.constant(tuple(range(rank - 2)) + (rank - 1, rank - 2), scalar=True)])


def _batched_matmul_grad(w: Writer, node: CNode, wrt_x: bool) -> str:
    """The gradient of a batched ``x @ y`` (rank >= 2 operands): a MatMulExt with one
    operand transposed, summed back over the batch axes the operand was broadcast along
    (the expansion of anfir/decompositions/gradient.py, written in MindSpore's ops)."""
    if wrt_x:
        dout, y, x = node.args
        a, b = w.ref(dout), _swap_last(w, w.ref(y), len(_shape(y, "matmul_dx")))
        da, db, target = _shape(dout, "matmul_dx"), _shape(y, "matmul_dx"), x
    else:
        x, dout, y = node.args
        a, b = _swap_last(w, w.ref(x), len(_shape(x, "matmul_dy"))), w.ref(dout)
        da, db, target = _shape(x, "matmul_dy"), _shape(dout, "matmul_dy"), y
    if wrt_x:  # (..., m, n) @ (..., n, k)ᵀ ; (..., n, m)ᵀ @ (..., n, k)
        product_shape = (*np.broadcast_shapes(da[:-2], db[:-2]), da[-2], db[-2])
    else:
        product_shape = (*np.broadcast_shapes(da[:-2], db[:-2]), da[-1], db[-1])
    product = w.emit("MatMulExt", [a, b])
    return _summed_to(w, product, product_shape, _shape(target, "matmul"), node.abstract)


def _matmul_grad_rule(wrt_x: bool) -> Rule:
    what = "matmul_dx" if wrt_x else "matmul_dy"

    def rule(w: Writer, node: CNode) -> str:
        ranks = [len(_shape(a, what)) for a in node.args]
        if min(ranks) < 2:
            raise _Unsupported(f"{what} of a vector")
        if ranks != [2, 2, 2]:
            return _batched_matmul_grad(w, node, wrt_x)
        if wrt_x:
            dout, y, _ = node.args  # dout @ yᵀ
            return w.emit("MatMul", [w.ref(dout), w.ref(y), w.constant(False, scalar=True),
                                     w.constant(True, scalar=True)], abstract=node.abstract)
        x, dout, _ = node.args  # xᵀ @ dout
        return w.emit("MatMul", [w.ref(x), w.ref(dout), w.constant(True, scalar=True),
                                 w.constant(False, scalar=True)], abstract=node.abstract)
    return rule


RULES[gradient.matmul_dx] = _matmul_grad_rule(True)
RULES[gradient.matmul_dy] = _matmul_grad_rule(False)


def _summed_to(w: Writer, ref: str, gs: tuple[int, ...], xs: tuple[int, ...], abstract: Any) -> str:
    """``ref`` (of shape ``gs``) summed over the axes a tensor of shape ``xs`` was broadcast along."""
    if gs == xs:
        return ref
    lead = len(gs) - len(xs)
    axes = tuple(range(lead)) + tuple(lead + k for k, d in enumerate(xs) if d == 1 and gs[lead + k] != 1)
    total = w.emit("ReduceSum", [ref, w.constant(axes, scalar=True), w.constant(True, scalar=True),
                                 w.constant(False, scalar=True)])
    return w.emit("Reshape", [total, w.constant(xs, scalar=True)], abstract=abstract)


@_rule(gradient.sum_to)
def _sum_to(w: Writer, node: CNode) -> str:
    g, x = node.args  # the sum of g over the axes x was broadcast along
    return _summed_to(w, w.ref(g), _shape(g, "sum_to"), _shape(x, "sum_to"), node.abstract)


@_rule(gradient.broadcast_like)
def _broadcast_like(w: Writer, node: CNode) -> str:
    g, x = node.args
    if _shape(g, "broadcast_like") == _shape(x, "broadcast_like"):
        return w.ref(g)
    return w.emit("Mul", [w.emit("OnesLike", [w.ref(x)]), w.ref(g)], abstract=node.abstract)


@_rule(gradient.unreduce)
def _unreduce(w: Writer, node: CNode) -> str:
    g, x = node.args[:2]
    axis = node.attrs.get("axis", None) if node.attrs else None
    keep = bool(node.attrs.get("keepdims", False)) if node.attrs else False
    xs = _shape(x, "unreduce")
    ref = w.ref(g)
    if not keep and axis is not None and xs:
        axes = {a % len(xs) for a in ((axis,) if isinstance(axis, int) else axis)}
        view = tuple(1 if k in axes else d for k, d in enumerate(xs))
        ref = w.emit("Reshape", [ref, w.constant(view, scalar=True)])
    return w.emit("Mul", [w.emit("OnesLike", [w.ref(x)]), ref], abstract=node.abstract)


@_rule(gradient.cast_like)
def _cast_like(w: Writer, node: CNode) -> str:
    g, x = node.args
    want, have = _dtype_of(x.abstract), _dtype_of(g.abstract)
    if want is None or want == have:
        return w.ref(g)
    if want not in TYPE_ID_OF:
        raise _Unsupported(f"cast_like to {want}")
    cast = w.emit("Cast", [w.ref(g), w.constant(TYPE_ID_OF[want], scalar=True)], abstract=node.abstract)
    if is_integer(want) or is_bool(want):  # an integer's sensitivity is a zero
        return w.emit("ZerosLike", [cast], abstract=node.abstract)
    return cast


# -- the convolution family (2-d, NCHW) --------------------------------------------------------
def _conv_attrs(node: CNode, x: Node, w: Node, backprop: bool) -> dict[str, Any]:
    xs, ws = _shape(x, "conv"), _shape(w, "conv")
    if len(ws) != 4 or len(xs) != 4:
        raise _Unsupported("a convolution that is not 2-d")
    attrs = dict(node.attrs) if node.attrs else {}
    probe = np.broadcast_to(np.zeros((), np.float32), xs), np.broadcast_to(np.zeros((), np.float32), ws)
    try:
        _, stride, pads, dilation, groups = conv_params(*probe, attrs.get("stride", 1), attrs.get("padding", 0),
                                                       attrs.get("dilation", 1), attrs.get("groups", 1), "conv")
    except Exception as e:  # an AnfirError of the attributes: the node cannot be written
        raise _Unsupported(f"conv attributes: {e}") from None
    top, left, bottom, right = (int(p) for p in pads)
    pad = (top, bottom, left, right)  # MindSpore's order
    return {"kernel_size": (ws[2], ws[3]), "mode": 1, "out_channel": ws[0], "pad": pad,
            "pad_mode": "PAD" if backprop else "pad", "format": "NCHW", "pad_list": pad,
            "groups": int(groups), "group": int(groups), "stride": (1, 1, *(int(v) for v in stride)),
            "dilation": (1, 1, *(int(v) for v in dilation))}


@_rule(P["conv"], P["conv_core"])
def _conv(w: Writer, node: CNode) -> str:
    x, weight = node.args[:2]
    out = w.emit("Conv2D", [w.ref(x), w.ref(weight)], attrs=_conv_attrs(node, x, weight, False),
                 abstract=node.abstract if len(node.args) == 2 else None)
    if len(node.args) == 3:  # the bias along axis 1
        out = w.emit("BiasAdd", [out, w.ref(node.args[2]), w.constant(0, scalar=True)], abstract=node.abstract)
    return out


@_rule(P["conv_input_grad"])
def _conv_input_grad(w: Writer, node: CNode) -> str:
    dout, weight, x = node.args
    return w.emit("Conv2DBackpropInput", [w.ref(dout), w.ref(weight), w.constant(_shape(x, "conv"), scalar=True)],
                  attrs=_conv_attrs(node, x, weight, True), abstract=node.abstract)


@_rule(P["conv_weight_grad"])
def _conv_weight_grad(w: Writer, node: CNode) -> str:
    x, dout, weight = node.args
    return w.emit("Conv2DBackpropFilter", [w.ref(dout), w.ref(x), w.constant(_shape(weight, "conv"), scalar=True)],
                  attrs=_conv_attrs(node, x, weight, True), abstract=node.abstract)


def _window(node: CNode, x: Node, what: str) -> tuple[tuple[int, int], tuple[int, int]]:
    attrs = dict(node.attrs) if node.attrs else {}
    if len(_shape(x, what)) != 4:
        raise _Unsupported(f"{what} that is not 2-d")
    if attrs.get("padding", 0) not in (0, (0, 0), (0, 0, 0, 0)) or attrs.get("ceil_mode", False) or \
            attrs.get("dilation", 1) not in (1, (1, 1)):
        raise _Unsupported(f"{what} with padding, dilation or ceil_mode (MindSpore's VALID pooling only)")
    kernel = attrs.get("kernel")
    stride = attrs.get("stride") or kernel
    pair = (lambda v: (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1])))
    return pair(kernel), pair(stride)


def _maxpool_attrs(kernel: tuple[int, int], stride: tuple[int, int]) -> dict[str, Any]:
    return {"kernel_size": (1, 1, *kernel), "strides": (1, 1, *stride), "pad_mode": "VALID",
            "format": "NCHW"}


def _max_window(node: CNode, x: Node) -> tuple[tuple[int, int], tuple[int, int], list[int]]:
    """(kernel, stride, pads: top, left, bottom, right) of a 2-d max pool; ceil mode is
    padding at the ends (anfir's pool_params widens them), dilation has no MindSpore op."""
    attrs = dict(node.attrs) if node.attrs else {}
    xs = _shape(x, "max_pool")
    if len(xs) != 4:
        raise _Unsupported("max_pool that is not 2-d")
    if attrs.get("dilation", 1) not in (1, (1, 1)):
        raise _Unsupported("max_pool with dilation (MindSpore's MaxPool has none)")
    try:
        _, k, st, pads, _, _ = conv_params_pool(np.broadcast_to(np.zeros((), np.float32), xs), attrs.get("kernel"),
                                                attrs.get("stride"), attrs.get("padding", 0), 1,
                                                attrs.get("ceil_mode", False), "max_pool")
    except Exception as e:  # an AnfirError of the attributes: the node cannot be written
        raise _Unsupported(f"max_pool attributes: {e}") from None
    return (int(k[0]), int(k[1])), (int(st[0]), int(st[1])), [int(p) for p in pads]


def _pad_lowest(w: Writer, x: Node, pads: list[int]) -> tuple[str, tuple[int, ...]]:
    """x padded with the value that never wins a maximum (-inf, an integer's minimum), as
    Concat with broadcast constant blocks: MindSpore's MaxPool pads only as SAME/VALID."""
    ref, shape = w.ref(x), list(_shape(x, "max_pool"))
    dtype = _dtype_of(x.abstract) or "f32"
    kind = np.dtype(_numpy(dtype))
    if kind.kind not in "fiu":
        raise _Unsupported(f"max_pool of {dtype}")
    low = kind.type(-np.inf) if kind.kind == "f" else np.iinfo(kind).min
    fill = w.constant(np.asarray(low, kind), dtype)
    for axis, (before, after) in ((2, (pads[0], pads[2])), (3, (pads[1], pads[3]))):
        if before == after == 0:
            continue
        parts = []
        for width, where in ((before, 0), (after, 1)):
            if width:
                block = tuple(width if a == axis else d for a, d in enumerate(shape))
                parts.append((where, _broadcast(w, fill, block)))
        items = [p for where, p in parts if where == 0] + [ref] + [p for where, p in parts if where == 1]
        ref = w.emit("Concat", [w.emit("MakeTuple", items), w.constant(axis, scalar=True)])
        shape[axis] += before + after
    return ref, tuple(shape)


@_rule(P["max_pool"])
def _max_pool(w: Writer, node: CNode) -> str:
    kernel, stride, pads = _max_window(node, node.args[0])
    x, _ = _pad_lowest(w, node.args[0], pads)
    return w.emit("MaxPool", [x], attrs=_maxpool_attrs(kernel, stride), abstract=node.abstract)


@_rule(P["max_pool_grad"])
def _max_pool_grad(w: Writer, node: CNode) -> str:
    x, dout = node.args
    kernel, stride, pads = _max_window(node, x)
    attrs = _maxpool_attrs(kernel, stride)
    padded, _ = _pad_lowest(w, x, pads)
    out = w.emit("MaxPool", [padded], attrs=attrs)
    grad = w.emit("MaxPoolGrad", [padded, out, w.ref(dout)], attrs=attrs)
    if not any(pads):
        return grad
    # the gradient of the padding cut off: Slice(grad, begin, size)
    xs = _shape(x, "max_pool")
    return w.emit("Slice", [grad, w.constant((0, 0, pads[0], pads[1]), scalar=True), w.constant(xs, scalar=True)],
                  abstract=node.abstract)


def _avg_inputs(w: Writer, kernel: tuple[int, int], stride: tuple[int, int]) -> list[str]:
    # AvgPool takes (kernel, strides, pad_mode VALID = 2, data_format NCHW = 0) as inputs
    return [w.constant(kernel, scalar=True), w.constant(stride, scalar=True), w.constant(2, scalar=True),
            w.constant(0, scalar=True)]


@_rule(P["avg_pool"])
def _avg_pool(w: Writer, node: CNode) -> str:
    kernel, stride = _window(node, node.args[0], "avg_pool")
    return w.emit("AvgPool", [w.ref(node.args[0]), *_avg_inputs(w, kernel, stride)], abstract=node.abstract)


@_rule(P["avg_pool_grad"])
def _avg_pool_grad(w: Writer, node: CNode) -> str:
    dout, x = node.args
    kernel, stride = _window(node, x, "avg_pool")
    out = w.emit("AvgPool", [w.ref(x), *_avg_inputs(w, kernel, stride)])
    return w.emit("AvgPoolGrad", [w.ref(x), out, w.ref(dout), *_avg_inputs(w, kernel, stride)],
                  abstract=node.abstract)


@_rule(P["channel_sum"])
def _channel_sum(w: Writer, node: CNode) -> str:
    rank = len(_shape(node.args[0], "channel_sum"))
    axes = (0,) + tuple(range(2, rank))
    return w.emit("ReduceSum", [w.ref(node.args[0]), w.constant(axes, scalar=True), w.constant(False, scalar=True),
                                w.constant(False, scalar=True)], abstract=node.abstract)


@_rule(P["global_avg_pool"])
def _global_avg_pool(w: Writer, node: CNode) -> str:
    rank = len(_shape(node.args[0], "global_avg_pool"))
    return w.emit("ReduceMean", [w.ref(node.args[0]), w.constant(tuple(range(2, rank)), scalar=True),
                                 w.constant(True, scalar=True)], abstract=node.abstract)


@_rule(P["flatten"], P["squeeze"], P["unsqueeze"])
def _static_reshape(w: Writer, node: CNode) -> str:
    # a reshape to the result's static shape
    out = node.abstract
    if not isinstance(out, ATensor) or out.shape is None or not all(isinstance(d, int) for d in out.shape):
        raise _Unsupported(f"{node.callee.value.name} needs a static result shape")  # type: ignore[attr-defined]
    return w.emit("Reshape", [w.ref(node.args[0]), w.constant(tuple(int(d) for d in out.shape), scalar=True)],
                  abstract=out)


@_rule(P["softmax"], P["log_softmax"])
def _softmax(w: Writer, node: CNode) -> str:
    axis = int(node.attrs.get("axis", -1)) if node.attrs else -1
    op = "Softmax" if node.is_apply(P["softmax"]) else "LogSoftmax"
    # the axis is an input: a tuple of one for Softmax, an int for LogSoftmax
    where = w.constant((axis,) if op == "Softmax" else axis, scalar=True)
    return w.emit(op, [w.ref(node.args[0]), where], abstract=node.abstract)


@_rule(gradient.newenv)
def _newenv(w: Writer, node: CNode) -> str:
    if w.envs is not None:
        return _zero_env(w, w.envs)
    return w.emit("EnvironCreate", [])


@_rule(gradient.env_setitem)
def _env_set(w: Writer, node: CNode) -> str:
    if w.envs is None:
        return w.emit("EnvironSet", [w.ref(a) for a in node.args])
    env, key, value = node.args
    slot = w.envs.slot(_static(key, "a gradient environment's key"), value.abstract)
    # the environment a zero gradient of a function stands for (zeros_like of a closure)
    base = w.ref(env) if is_env(env.abstract) else _zero_env(w, w.envs)
    items = [w.ref(value) if k == slot else w.emit("TupleGetItem", [base, w.constant(k, scalar=True)])
             for k in range(len(w.envs.slots))]
    return w.emit("MakeTuple", items)


@_rule(gradient.env_getitem)
def _env_get(w: Writer, node: CNode) -> str:
    if w.envs is None:
        return w.emit("EnvironGet", [w.ref(a) for a in node.args], abstract=node.abstract)
    env, key, default = node.args
    if not is_env(env.abstract):  # nothing stored: the default (a zero)
        return w.ref(default)
    slot = w.envs.slot(_static(key, "a gradient environment's key"), default.abstract)
    return w.emit("TupleGetItem", [w.ref(env), w.constant(slot, scalar=True)], abstract=node.abstract)


def _zero_env(w: Writer, layout: EnvLayout) -> str:
    """An environment with nothing stored: every slot's zero."""
    return w.emit("MakeTuple", [_zero(w, abstract) for _, abstract in layout.slots])


def _zero(w: Writer, abstract: Any) -> str:
    """The zero of a slot's type (a number, a tensor of static shape, a tuple of them)."""
    if isinstance(abstract, ATuple):
        return w.emit("MakeTuple", [_zero(w, item) for item in abstract.items])
    dtype = str(abstract.dtype)
    if isinstance(abstract, AScalar):
        return w.constant(np.zeros((), _numpy(dtype)), dtype)
    shape = _shape_of_abstract(abstract)
    if int(np.prod(shape)) <= SMALL_ZERO:
        return w.constant(np.zeros(shape, _numpy(dtype)), dtype)
    return _broadcast(w, w.constant(np.zeros((), _numpy(dtype)), dtype), shape, abstract)


SMALL_ZERO = 64
"""A zero gradient with more elements is a BroadcastTo of a scalar, not a constant."""


def _shape_of_abstract(abstract: Any) -> tuple[int, ...]:
    assert isinstance(abstract, ATensor) and abstract.shape is not None
    return tuple(int(d) for d in abstract.shape)


_add = _elementwise("Add")


@_rule(gradient.gadd)
def _gadd(w: Writer, node: CNode) -> str:
    """The sum of two gradients: ``Add`` of numbers and tensors; of tuples (a tuple
    argument's gradient) item by item, as MakeTuple of the items' sums, walked with a
    stack (a gradient may nest tuples deeply)."""
    abstract = node.abstract
    if w.envs is not None and is_env(abstract):
        # environments (a tuple of slots); a zero gradient of a function adds nothing
        envs = [a for a in node.args if is_env(a.abstract)]
        if len(envs) < 2:
            return w.ref(envs[0]) if envs else _zero_env(w, w.envs)
        abstract = slot_types(w.envs)
    elif not isinstance(abstract, ATuple):
        return _add(w, node)
    return _leafwise(w, w.ref(node.args[0]), w.ref(node.args[1]), abstract,
                     lambda x, y, leaf: w.emit("Add", [x, y], abstract=leaf))


def _leafwise(w: Writer, a: str, b: str, abstract: Any, combine: Callable[[str, str, Any], str]) -> str:
    """``combine`` of the leaves of two values of type ``abstract`` (nested tuples), the
    results rebuilt as MakeTuples, walked with a stack (a gradient may nest deeply)."""
    # frames: (a, b, abstract, expanded); results gathered on `done`
    stack: list[tuple[str, str, Any, bool]] = [(a, b, abstract, False)]
    done: list[str] = []
    while stack:
        x, y, abstract, expanded = stack.pop()
        if not isinstance(abstract, ATuple):
            done.append(combine(x, y, abstract))
        elif expanded:
            n = len(abstract.items)
            items = done[len(done) - n:] if n else []
            del done[len(done) - n:]
            done.append(w.emit("MakeTuple", items))
        else:
            stack.append((x, y, abstract, True))
            for k in reversed(range(len(abstract.items))):
                index = w.constant(k, scalar=True)
                stack.append((w.emit("TupleGetItem", [x, index]), w.emit("TupleGetItem", [y, index]),
                              abstract.items[k], False))
    return done[-1]


@_rule(gradient.grad_arg_check)
def _grad_arg_check(w: Writer, node: CNode) -> str:
    # grad_arg_check(x, g) is g once compiled (its check is on x's type, made when
    # the program was specialized): the value itself
    return w.ref(node.args[1])


def _static_result(node: CNode, what: str) -> tuple[int, ...]:
    return _shape(node, what)


@_rule(tensor.broadcast_to)
def _broadcast_to(w: Writer, node: CNode) -> str:
    x, out = node.args[0], _static_result(node, "broadcast_to")
    if _shape(x, "broadcast_to") == out:
        return w.ref(x)
    return _broadcast(w, w.ref(x), out, node.abstract)


def _broadcast(w: Writer, ref: str, shape: tuple[int, ...], abstract: Any = None) -> str:
    """BroadcastTo(ref, shape): the shape an input (MindSpore 2.10 crashes on it as the
    primitive's attribute)."""
    return w.emit("BroadcastTo", [ref, w.constant(tuple(shape), scalar=True)], abstract=abstract)


@_rule(gradient.reshape_like)
def _reshape_like(w: Writer, node: CNode) -> str:
    g, x = node.args
    return w.emit("Reshape", [w.ref(g), w.constant(_shape(x, "reshape_like"), scalar=True)],
                  abstract=node.abstract)


@_rule(P["channel_spread"])
def _channel_spread(w: Writer, node: CNode) -> str:
    v, like = node.args
    shape = _shape(like, "channel_spread")
    column = w.emit("Reshape", [w.ref(v), w.constant((-1,) + (1,) * (len(shape) - 2), scalar=True)])
    return _broadcast(w, column, shape, node.abstract)


@_rule(P["batch_norm"])
def _batch_norm(w: Writer, node: CNode) -> str:
    # MindSpore's own BatchNorm in inference mode (its attributes are inputs 5 to 8:
    # is_training, epsilon, momentum, data_format NCHW = 0); its result 0 is y.
    if len(_shape(node.args[0], "batch_norm")) != 4:
        raise _Unsupported("batch_norm of other than NCHW (MindSpore's BatchNorm is 2-d)")
    dtype = _dtype_of(node.abstract)
    if dtype not in TYPE_ID_OF:
        raise _Unsupported(f"batch_norm of {dtype}")
    eps = float(node.attrs.get("eps", 1e-5)) if node.attrs else 1e-5
    args = [w.ref(a) if _dtype_of(a.abstract) == dtype else
            w.emit("Cast", [w.ref(a), w.constant(TYPE_ID_OF[str(dtype)], scalar=True)]) for a in node.args]
    out = w.emit("BatchNorm", [*args, w.constant(False, scalar=True), w.constant(eps, scalar=True),
                               w.constant(0.1, scalar=True), w.constant(0, scalar=True)])
    return w.emit("TupleGetItem", [out, w.constant(0, scalar=True)], abstract=node.abstract)


# -- helpers -----------------------------------------------------------------------------------
MAX_CONSTANT_NESTING = 32
"""Constant tuples nested deeper are written as MakeTuple nodes."""


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether the tuple ``value`` nests more than ``limit`` levels (iteratively)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        stack.extend((v, depth + 1) for v in item if isinstance(v, tuple))
    return False


def _key(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, tuple):
        return ("tuple",) + tuple(_key(v) for v in value)
    return (type(value).__name__, repr(value))


def _dtype_of_value(value: Any) -> str:
    if isinstance(value, (np.ndarray, np.generic)):
        return str(dtype_name(np.asarray(value).dtype))
    return LITERAL_DTYPES[type(value)] if type(value) in LITERAL_DTYPES else "f64"


def _numpy(dtype: str) -> Any:
    return BY_NAME[dtype].numpy


def native() -> frozenset[Primitive]:
    """The composites of :data:`anfir.decompositions.DECOMPOSITIONS` MindSpore has as ops of
    its own (those :data:`RULES` writes: ``Softmax``, ``LogSoftmax``, ``Softplus``...); the
    others are decomposed into core primitives before the graphs are written."""
    return frozenset(p for p in DECOMPOSITIONS if p in RULES)


def _inline_every_call(program: Program) -> Program:
    """The inline phase with no size limit: every call of a non-recursive graph is
    inlined (recursive ones, the loops, stay graphs).  A graph called twice — a
    network's block — otherwise keeps its backpropagator returning a gradient
    environment for its free variables, a type MindSpore's loader cannot infer;
    inlined, the optimizer resolves the environment to the gradients themselves."""
    manager = program.require_manager()
    remove_dead_graphs(manager)
    program.stats["inline"] += inline_calls(manager, threshold=UNLIMITED)
    remove_dead_graphs(manager)
    return program


UNLIMITED = 1 << 62
"""An inlining threshold no graph reaches."""


def export_mindir(source: Any, entry: Optional[str] = None, args: Optional[Sequence[Any]] = None,
                  path: Optional[str] = None, params: Optional[dict[str, Any]] = None) -> bytes:
    """Compile ``source``'s entry for ``args`` and write it as ``.mindir`` bytes (and to
    ``path`` when given).  ``params`` names entry parameters written as weights (a
    Module's ``params`` are used by default)."""
    if params is None and isinstance(source, Module):
        params = dict(source.params)
    # MindIR writes a loop as a graph that calls itself (a while header), so the
    # tail recursion stays: no counted loop becomes a fori_loop/scan (no loops phase).
    phases = [Phase(p.name, _inline_every_call, p.doc) if p.run is inline.run else p
              for p in PHASES if p.run is not ad.rewrite_counted_loops]
    graph = compile_program(source, entry=entry, args=args, phases=phases).graph
    model = Writer(params).run(decompose(graph, native()))
    data: bytes = model.SerializeToString(deterministic=True)
    if path is not None:
        with open(os.fspath(path), "wb") as handle:
            handle.write(data)
    return data


__all__ = ["ELEMENTWISE", "RULES", "Writer", "export_mindir"]

"""The MindIR writer: anfir's typed graphs as a ``ModelProto`` (see :mod:`anfir.interop.mindir.exporter`).

:class:`Writer` names graphs and constants, lambda-lifts free variables (a graph's
free variables become its first inputs, a use of it as a value a ``Partial``),
writes each primitive call through the rule :data:`~anfir.interop.mindir.export_rules.RULES`
holds for its primitive object, and collects every node it cannot write into one
located :class:`~anfir.interop.mindir.common.MindirError`.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from anfir.abstract.lattice import tuple_leaves
from anfir.abstract.values import AScalar, AString, ATensor
from anfir.dtypes import LITERAL_DTYPES, dtype_name, is_integer
from anfir.interop.mindir.common import TENSOR_TYPE_OF, TYPE_ID_OF, MindirError, write_tensor
from anfir.interop.mindir.environments import EnvLayout, plan
from anfir.interop.mindir.export_rules import RULES, UNSUPPORTED
from anfir.interop.mindir.export_rules.common import Unsupported, numpy_dtype
from anfir.interop.mindir.schema import classes
from anfir.ir.graph import FuncGraph
from anfir.ir.manager import analyse
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.ir.primitive import Primitive
from anfir.ir.walk import reachable_graphs, toposort
from anfir.primitives import arith, elementwise
from anfir.runtime_values import SymbolicKey


class Writer:
    """One program being written: ``Writer(params).run(entry)`` is its ``ModelProto``."""

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
        # Values MindSpore holds as scalars (Int64Imm), not as the 0-d tensors anfir's
        # numbers are written as: a run-time shape (``Shape``), its items, their sums and
        # products, ``Size``.  name -> the indices of a tuple's scalar items, or None for a
        # scalar itself; `ref` converts a scalar to a 0-d tensor where a tensor is read.
        self.scalars: dict[str, Optional[frozenset[int]]] = {}
        self.as_tensor: dict[str, str] = {}

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
            write_tensor(attr.tensors.add(), array.astype(np.dtype(numpy_dtype(name))), name)
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
            raise Unsupported(f"a constant of type {type(value).__name__} ({value!r:.60})")

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
                except Unsupported as e:
                    self.errors.append(f"@{g.name}: {e}")
                    if self.first_error is None:
                        self.first_error = node.loc
                    self.names[node] = self.fresh("failed")
        try:
            if _holds_string(g.output.abstract):
                raise Unsupported(STRING_VALUE)
            out = self.ref(g.output)
        except Unsupported as e:
            self.errors.append(f"@{g.name}: output: {e}")
            if self.first_error is None:
                self.first_error = g.output.loc or g.loc
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
        """The name of ``node``'s value in the graph being written (a MindSpore scalar as
        a 0-d tensor of its anfir dtype: ``ScalarToTensor``, once per value)."""
        name = self.names.get(node)
        if name is not None:
            if name in self.scalars and self.scalars[name] is None:
                return self.scalar_as_tensor(name, dtype_name_of(node.abstract) or dtype or "i64")
            return name
        if isinstance(node, ValueNode):
            value = node.value
            if isinstance(value, FuncGraph):
                return self.function_value(value)
            if isinstance(value, Primitive):
                raise Unsupported(f"the primitive {value.name} used as a value")
            if isinstance(value, tuple) and _deeper_than(value, MAX_CONSTANT_NESTING):
                return self.tuple_nodes(value, dtype)
            return self.constant(value, dtype)
        raise Unsupported(f"{node!r} is not visible in @{self.graph.name if self.graph else '?'}")

    def raw(self, node: Node) -> str:
        """The name of ``node``'s value as written: a MindSpore scalar stays one (a shape's
        item going into a ``MakeTuple`` of a shape, a scalar op)."""
        name = self.names.get(node)
        return name if name is not None else self.ref(node)

    def mark_scalar(self, name: str, items: Optional[frozenset[int]] = None) -> str:
        """Record that ``name`` is a MindSpore scalar (``items`` None), or a tuple whose
        ``items`` are; returns ``name``."""
        self.scalars[name] = items
        return name

    def scalar_items(self, node: Node) -> frozenset[int]:
        """The indices of the MindSpore scalars in the tuple ``node`` (none when it is not
        one): anfir's Python ints in a constant tuple, a run-time shape's dimensions."""
        name = self.names.get(node)
        if name is not None:
            return self.scalars.get(name) or frozenset()
        if isinstance(node, ValueNode) and isinstance(node.value, tuple):
            return frozenset(k for k, v in enumerate(node.value)
                             if isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)))
        return frozenset()

    def is_scalar(self, node: Node) -> bool:
        """Whether ``node``'s value is written as a MindSpore scalar."""
        name = self.names.get(node)
        return name is not None and name in self.scalars and self.scalars[name] is None

    def scalar_as_tensor(self, name: str, dtype: str) -> str:
        """The 0-d tensor of dtype ``dtype`` holding the MindSpore scalar ``name``."""
        key = f"{name}/{dtype}"
        out = self.as_tensor.get(key)
        if out is None:
            if dtype not in TYPE_ID_OF:
                raise Unsupported(f"a run-time scalar of dtype {dtype}")
            out = self.emit("ScalarToTensor", [name, self.constant(TYPE_ID_OF[dtype], scalar=True)],
                            abstract=AScalar(dtype))
            self.as_tensor[key] = out
        return out

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
            raise Unsupported(f"the graph @{h.name} is not part of the program")
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
            scalar_op = SCALAR_OPS.get(callee.value)
            if scalar_op is not None and self.scalar_call(node):
                inputs = [self.raw(a) if not isinstance(a, ValueNode) else self.constant(int(a.value), scalar=True)
                          for a in node.args]
                return self.mark_scalar(self.emit(scalar_op, inputs))
            if callee.value is arith.div and self.integer_division(node):
                return self.true_division(node)
            rule = RULES.get(callee.value)
            if rule is None:
                reason = UNSUPPORTED.get(callee.value)
                raise Unsupported(f"primitive {callee.value.name} has no MindIR rule"
                                  + (f" ({reason})" if reason else ""))
            return rule(self, node)
        if isinstance(callee, ValueNode) and isinstance(callee.value, FuncGraph):
            h = callee.value
            if h not in self.fvs:
                raise Unsupported(f"calls @{h.name}, which is not part of the program")
            inputs = [*(self.ref(v) for v in self.fvs[h]), *(self.ref(a) for a in node.args)]
            return self.emit(self.graph_names[h], inputs, prim=False, abstract=node.abstract)
        return self.emit(self.ref(callee), [self.ref(a) for a in node.args], prim=False,
                         abstract=node.abstract)

    def scalar_call(self, node: CNode) -> bool:
        """Whether integer arithmetic ``node`` stays on MindSpore scalars: an integer result,
        each operand a MindSpore scalar or an integer constant, one at least a scalar (the
        arithmetic of run-time shapes, as MindSpore writes it: ``ScalarMul``...)."""
        if not isinstance(node.abstract, AScalar) or not is_integer(str(node.abstract.dtype)):
            return False
        constant = [isinstance(a, ValueNode) and isinstance(a.value, (int, np.integer))
                    and not isinstance(a.value, (bool, np.bool_)) for a in node.args]
        scalar = [self.is_scalar(a) for a in node.args]
        return any(scalar) and all(c or s for c, s in zip(constant, scalar))

    def integer_division(self, node: CNode) -> bool:
        """Whether ``node`` (a ``div``) divides integers into a float (anfir's ``/`` is
        true division; MindSpore's RealDiv of integers stays an integer)."""
        out = dtype_name_of(node.abstract) or (str(node.abstract.dtype) if isinstance(node.abstract, ATensor) else None)
        if out is None or is_integer(out):
            return False
        kinds = [a.abstract.dtype for a in node.args if isinstance(a.abstract, (AScalar, ATensor))]
        return len(kinds) == len(node.args) and any(is_integer(str(k)) for k in kinds)

    def true_division(self, node: CNode) -> str:
        """``RealDiv`` of the operands converted to the result's dtype (a run-time scalar
        straight to a tensor of it, a constant written in it, a tensor through Cast)."""
        out = str(node.abstract.dtype)
        if out not in TYPE_ID_OF:
            raise Unsupported(f"a division into {out}")
        inputs = []
        for a in node.args:
            if isinstance(a, ValueNode) and isinstance(a.value, (int, float, np.number, np.ndarray)):
                inputs.append(self.constant(np.asarray(a.value).astype(numpy_dtype(out)), out))
            elif self.is_scalar(a):
                inputs.append(self.scalar_as_tensor(self.raw(a), out))
            elif dtype_name_of(a.abstract) == out or (isinstance(a.abstract, ATensor) and str(a.abstract.dtype) == out):
                inputs.append(self.ref(a))
            else:
                inputs.append(self.emit("Cast", [self.ref(a), self.constant(TYPE_ID_OF[out], scalar=True)]))
        return self.emit("RealDiv", inputs, abstract=node.abstract)


SCALAR_OPS: dict[Primitive, str] = {arith.add: "ScalarAdd", arith.sub: "ScalarSub", arith.mul: "ScalarMul",
                                    elementwise.floor_div: "ScalarFloorDiv"}
"""Integer arithmetic written as MindSpore's scalar ops when its operands are run-time
scalars (a shape's dimensions); any other use of a scalar reads it as a 0-d tensor."""

def dtype_name_of(abstract: Any) -> Optional[str]:
    """The dtype of a number's type (None for other types)."""
    return str(abstract.dtype) if isinstance(abstract, AScalar) else None


# -- constants -------------------------------------------------------------------------------
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

STRING_VALUE = ("a string value: MindSpore's runtime computes no strings (a GraphCell returns a "
                "meaningless uint8 for one, and MindSpore's own export of a cell returning one fails)")
"""Why a graph whose result holds a string cannot be written."""

def _holds_string(abstract: Any) -> bool:
    """Whether a value of type ``abstract`` is or holds (in nested tuples) a string."""
    return any(isinstance(leaf, AString) for leaf in tuple_leaves(abstract))


__all__ = ["MAX_CONSTANT_NESTING", "STRING_VALUE", "Writer"]

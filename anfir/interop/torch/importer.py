"""Import a ``torch.export.ExportedProgram`` as an anfir :class:`Module`.

The program is first lowered to core ATen (``ep.run_decompositions()``); its
FX graph then becomes one FuncGraph, ``forward``, whose parameters are the
graph signature's inputs in order — lifted parameters, buffers (persistent or
not), lifted constants, then the user's inputs — and whose result is the
user's output rebuilt from the program's pytree spec (dicts and lists become
tuples, in the spec's order).  A program that mutates buffers or user inputs
returns ``(mutated..., user output)``: the new values of what it mutated, in
the signature's order, as torch-mlir's FX importer makes mutations functional.
``mod.params`` holds the values of the lifted inputs as numpy arrays, keyed by
the entry's parameter names, so ``anfir.run(mod.entry, *mod.params.values(),
*inputs)`` runs the model.

Each ATen call is built by one entry of the table
:func:`anfir.interop.torch.rules.full_table` builds (its rules by family, as in
``anfir/primitives/``), keyed by the ``OpOverload``.  Every call node gets the
location of its ``stack_trace``: the innermost frame in the user's code (outside torch).
Dynamic dimensions (``torch.export.Dim``) become dimension variables named
after their sympy symbols (``f32[s77, 4]``); their ranges are the entry's
``ranges`` attribute (``#@ ranges {"s77": [2, 64]}`` above ``def forward``),
which calls are checked against.  ``torch.cond`` becomes ``switch`` on two branch
graphs that close over what they use; ``while_loop`` a tail-recursive graph.

An op outside the table is an :class:`TorchImportError` listing every
unsupported op of the program with the Python line it came from; nothing is
built then.  ``torch`` is imported only when a program is imported.
"""

from __future__ import annotations

import operator
import os
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import sympy

from anfir.abstract.dimranges import RANGES
from anfir.errors import AnfirError, MissingDependencyError, UsageError
from anfir.interop.torch.rules import full_table, needs_functionalization
from anfir.interop.torch.rules.common import Rule
from anfir.interop.torch.rules.conv import reads_pool_indices
from anfir.ir.annotations import ScalarAnn, TensorAnn
from anfir.ir.attrs import NO_ATTRS
from anfir.ir.graph import FuncGraph, Module
from anfir.ir.nodes import CNode, Node, ValueNode
from anfir.location import Location
from anfir.primitives import arith, elementwise, structure, tensor

EXTRA = "torch"
"""The extra that installs what this module needs: ``pip install "anfir[torch]"``."""

ENTRY = "forward"
"""The name of the imported entry graph."""

MAX_NESTING = 64
"""How deeply higher-order ops (cond, while_loop) may nest in one program."""


class TorchImportError(AnfirError):
    """A torch program anfir cannot import: the message names the op(s) and the
    user's Python line(s)."""

    kind = "torch import error"


def require_torch() -> Any:
    """The ``torch`` module, or a :class:`MissingDependencyError` naming the extra."""
    try:
        import torch
    except ImportError:
        raise MissingDependencyError(
            f'importing PyTorch programs needs torch: pip install "anfir[{EXTRA}]"') from None
    return torch


DTYPES = {
    "float16": "f16", "float32": "f32", "float64": "f64",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8",
    "bool": "bool",
}
"""torch dtype names (``str(torch.float32)`` without ``torch.``) -> anfir dtypes."""


def dtype_name(dtype: Any, where: Optional[Location] = None) -> str:
    """The anfir dtype of a torch dtype, or an error naming it."""
    name = str(dtype).replace("torch.", "")
    if name not in DTYPES:
        raise TorchImportError(f"dtype {name} has no anfir equivalent "
                               f"(supported: {', '.join(DTYPES)})", where)
    return DTYPES[name]


_FRAME = re.compile(r'File "([^"\n]+)", line (\d+), in [^\n]*\n[ \t]*([^\n]*)')


def location_of(fx_node: Any, torch_dir: str) -> Optional[Location]:
    """The node's ``stack_trace`` as a Location: the innermost frame outside torch
    (the user's module), else the innermost frame; None without a trace.

    The source file is never read: the line's text comes from the trace."""
    trace = fx_node.meta.get("stack_trace") if hasattr(fx_node, "meta") else None
    if not isinstance(trace, str) or not trace:
        return None
    frames = _FRAME.findall(trace[-100_000:])
    if not frames:
        return None
    chosen = frames[-1]
    for frame in reversed(frames):
        if not frame[0].startswith(torch_dir):
            chosen = frame
            break
    file, line, text = chosen
    return Location(file, int(line), 1, text.rstrip())


def _placeholder_location(ph: Any, torch_dir: str) -> Optional[Location]:
    """An input's location: its own trace (placeholders rarely have one), else
    that of its first use — the line of the user's ``forward`` that reads it, where
    an error about the argument (a size outside its ``Dim``'s range) points."""
    loc = location_of(ph, torch_dir)
    for user in ph.users if loc is None else ():
        loc = location_of(user, torch_dir)
        if loc is not None:
            break
    return loc


def _describe_op(loc: Optional[Location], fx_node: Any) -> str:
    where = f"{loc.file}:{loc.line}" if loc is not None else "no source line"
    return f"{fx_node.target} (node {fx_node.name}, {where})"


class _PoisonedOutput(TorchImportError):
    """A (sub)graph whose output depends on a refused op: not built; the refusal
    itself is in the importer's list."""


@dataclass
class Builder:
    """What an op's builder sees: the graph being built, the FX node's location,
    and helpers to make calls."""

    importer: "Importer"
    graph: FuncGraph
    fx_node: Any
    loc: Optional[Location]

    def call(self, prim: Any, *args: Any, **attrs: Any) -> CNode:
        """``prim(*args, **attrs)`` in the current graph at the node's location."""
        canonical = prim.canonical_attrs(attrs) if attrs else NO_ATTRS
        return self.graph.apply(prim, *args, loc=self.loc, attrs=canonical)

    def tuple_of(self, items: Any) -> Any:
        """A tuple argument, as ``make_tuple`` of its items (numbers, or nodes for
        symbolic sizes): what the ANF text ``(1, 0)`` parses to, so the printed
        program re-parses to the same graph."""
        return self.call(structure.make_tuple, *items)

    def out_shape(self, index: Optional[int] = None) -> Any:
        """The node's result shape (from its FakeTensor) as a tuple argument:
        symbolic dimensions become nodes computing them."""
        val = self.fx_node.meta.get("val")
        if index is not None:
            val = val[index]
        return self.tuple_of(self.importer.size_value(d, self) for d in val.shape)

    def out_dtype(self, index: Optional[int] = None) -> str:
        """The anfir dtype of the node's result."""
        val = self.fx_node.meta.get("val")
        if index is not None:
            val = val[index]
        return dtype_name(val.dtype, self.loc)

    def rank(self, fx_arg: Any) -> int:
        """The rank of an FX argument's value."""
        return len(fx_arg.meta["val"].shape)

    def arg_dtype(self, fx_arg: Any) -> str:
        """The anfir dtype of an FX argument's value."""
        return dtype_name(fx_arg.meta["val"].dtype, self.loc)




@dataclass
class Importer:
    """The state of one import: the table, the symbols of dynamic dims, where torch lives."""

    torch: Any
    table: dict[Any, Rule]
    torch_dir: str
    symbols: dict[Any, Node] = field(default_factory=dict)
    """sympy symbol -> the node computing it (made in the entry graph)."""
    depth: int = 0
    problems: list[str] = field(default_factory=list)
    """Every op refused so far (unsupported, or refused by its rule), with its line."""
    first: Optional[Location] = None
    """The location of the first refused op."""
    poisoned: set[Any] = field(default_factory=set)
    """FX nodes not built (refused, or fed by a refused one): their users are
    skipped silently, so one refusal is listed once and the import goes on to
    find the others."""

    # -- symbolic sizes ---------------------------------------------------------
    def size_value(self, dim: Any, b: Builder) -> Any:
        """A dimension (int or SymInt) as an int or a node computing it."""
        if isinstance(dim, int):
            return dim
        expr = dim.node.expr if hasattr(dim, "node") else dim
        return self.sym_expr(expr, b)

    def sym_expr(self, expr: Any, b: Builder) -> Any:
        """A sympy expression over the input symbols as nodes (sums, products, integers)."""
        # Post-order over the expression tree, with an explicit stack.
        done: dict[Any, Any] = {}
        stack = [expr]
        while stack:
            e = stack[-1]
            if e in done:
                stack.pop()
                continue
            if e.is_Integer:
                done[e] = int(e)
            elif e.is_Symbol:
                if e not in self.symbols:
                    raise TorchImportError(f"the size {e} is not a dimension of any input", b.loc)
                done[e] = self.symbols[e]
            elif isinstance(e, (sympy.Add, sympy.Mul)) or type(e).__name__ == "FloorDiv":
                pending = [a for a in e.args if a not in done]
                if pending:
                    stack.extend(pending)
                    continue
                args = [done[a] for a in e.args]
                if type(e).__name__ == "FloorDiv":
                    done[e] = b.call(elementwise.floor_div, *args)
                else:
                    prim = arith.add if isinstance(e, sympy.Add) else arith.mul
                    acc = args[0]
                    for a in args[1:]:
                        acc = b.call(prim, acc, a)
                    done[e] = acc
            else:
                raise TorchImportError(f"the symbolic size {e} ({type(e).__name__}) is not supported",
                                       b.loc)
            stack.pop()
        return done[expr]

    # -- graphs -----------------------------------------------------------------
    def convert(self, value: Any, env: dict[Any, Node], b: Builder) -> Any:
        """An FX argument with its nodes replaced by anfir nodes (lists stay lists)."""
        fx_node_type = self.torch.fx.Node
        if isinstance(value, fx_node_type):
            return env[value]
        if isinstance(value, (list, tuple)):
            return [self.convert(v, env, b) for v in value]
        if isinstance(value, self.torch.dtype):
            return dtype_name(value, b.loc)
        if isinstance(value, (self.torch.device, self.torch.layout, self.torch.memory_format)):
            return None
        return value

    def build_body(self, fx_graph: Any, graph: FuncGraph, env: dict[Any, Node],
                   owner: Any) -> Any:
        """Build the call nodes of ``fx_graph`` into ``graph`` (placeholders already
        in ``env``); return the FX output's arguments, converted."""
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise TorchImportError(f"control flow nested more than {MAX_NESTING} deep")
        result: Any = None
        for node in fx_graph.nodes:
            loc = location_of(node, self.torch_dir)
            b = Builder(self, graph, node, loc)
            if node.op == "placeholder":
                continue
            if node.op == "get_attr":
                env[node] = ValueNode(getattr(owner, node.target), loc)
                continue
            if node.op == "output":
                if any(a in self.poisoned for a in node.all_input_nodes):
                    self.depth -= 1
                    raise _PoisonedOutput("a refused op feeds this graph's output")
                result = self.convert(node.args[0], env, b)
                continue
            rule = self.table.get(node.target)
            if rule is None or any(a in self.poisoned for a in node.all_input_nodes):
                # Listed already (collect_unsupported), or fed by a refused op.
                self.poisoned.add(node)
                continue
            args = [self.convert(a, env, b) for a in node.args]
            kwargs = {k: self.convert(v, env, b) for k, v in node.kwargs.items()}
            try:
                made = rule(b, *args, **kwargs)
            except _PoisonedOutput:
                self.poisoned.add(node)  # a branch fed by a refused op: listed already
                continue
            except AnfirError as err:
                # A rule's refusal joins the one up-front list; the import goes on.
                self.refuse(node, err.loc or loc, err.message)
                continue
            except (TypeError, ValueError, IndexError, KeyError, AttributeError) as err:
                # Arguments a rule did not expect (an overload's rarer form): a refusal
                # with the reason, never a bare exception out of import_torch.
                self.refuse(node, loc, f"arguments this rule cannot read "
                                       f"({type(err).__name__}: {err})")
                continue
            if not isinstance(made, Node):
                made = ValueNode(made, loc)
            env[node] = made
        self.depth -= 1
        return result

    def refuse(self, fx_node: Any, loc: Optional[Location], why: str) -> None:
        """Record that ``fx_node`` cannot be imported (and poison it)."""
        self.first = self.first or loc
        self.problems.append(f"{_describe_op(loc, fx_node)}: {why}")
        self.poisoned.add(fx_node)

    def subgraph(self, gm_value: Any, name: str, inputs: list[Any], loc: Optional[Location],
                 params: int = 0) -> tuple[FuncGraph, list[Node]]:
        """A FuncGraph from an FX sub-module: its first ``params`` placeholders
        become parameters, the rest are bound to ``inputs`` (closed over).
        Returns the graph and its parameters."""
        gm = gm_value.value if isinstance(gm_value, ValueNode) else gm_value
        graph = FuncGraph(name, loc)
        env: dict[Any, Node] = {}
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        made: list[Node] = []
        for i, ph in enumerate(placeholders):
            if i < params:
                p = graph.add_parameter(_identifier(ph.name), loc)
                made.append(p)
                env[ph] = p
            else:
                value = inputs[i - params]
                env[ph] = value if isinstance(value, Node) else ValueNode(value, loc)
        outputs = self.build_body(gm.graph, graph, env, gm)
        b = Builder(self, graph, None, loc)
        graph.output = b.call(structure.make_tuple, *[self.as_node(o, loc) for o in outputs])
        return graph, made

    def as_node(self, value: Any, loc: Optional[Location]) -> Node:
        """A converted value as a node (constants as ValueNodes)."""
        return value if isinstance(value, Node) else ValueNode(value, loc)

    def collect_unsupported(self, gm: Any) -> tuple[list[str], Optional[Location]]:
        """Every op of ``gm`` and its sub-modules that the table lacks, with its
        line, and the location of the first."""
        missing: list[str] = []
        first: Optional[Location] = None
        seen: set[int] = set()
        stack = [gm]
        while stack:
            module = stack.pop()
            if id(module) in seen:
                continue
            seen.add(id(module))
            for node in module.graph.nodes:
                if node.op == "call_function" and node.target not in self.table:
                    loc = location_of(node, self.torch_dir)
                    first = first or loc
                    missing.append(_describe_op(loc, node))
                elif (node.op == "call_function" and "_with_indices" in str(node.target)
                      and reads_pool_indices(node)):
                    # anfir's max_pool has no indices result: refuse a program that reads them.
                    loc = location_of(node, self.torch_dir)
                    first = first or loc
                    missing.append(_describe_op(loc, node) + " whose indices are used")
                elif node.op == "get_attr":
                    sub = getattr(module, node.target, None)
                    if isinstance(sub, self.torch.fx.GraphModule):
                        stack.append(sub)
                elif node.op == "call_module":
                    missing.append(f"call_module {node.target} (node {node.name})")
        return missing, first


def _identifier(name: str) -> str:
    """An ANF identifier from an FX name (letters, digits, underscores; not a digit first)."""
    ident = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not ident or ident[0].isdigit():
        ident = "v_" + ident
    return ident


def _annotation(val: Any) -> Any:
    """The annotation of an input's FakeTensor (or SymInt/int) value."""
    torch = require_torch()
    if isinstance(val, torch.Tensor):
        dims: list[Any] = []
        for d in val.shape:
            if isinstance(d, int):
                dims.append(d)
            else:
                expr = d.node.expr
                dims.append(str(expr) if expr.is_Symbol else "*")
        if "*" in dims:
            return None
        return TensorAnn(dtype_name(val.dtype), tuple(dims))
    if isinstance(val, bool):
        return ScalarAnn("bool")
    if isinstance(val, (int, torch.SymInt)):
        return ScalarAnn("i64")
    if isinstance(val, (float, torch.SymFloat)):
        return ScalarAnn("f64")
    return None


def _storage_key(torch: Any, value: Any) -> Optional[tuple[Any, ...]]:
    """What makes two lifted tensors one (the same storage, offset, shape, strides
    and dtype), or None for a user input or a tensor without storage."""
    if not isinstance(value, torch.Tensor) or value.device.type == "meta":
        return None
    try:
        ptr = value.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    if ptr == 0:
        return None
    return (ptr, value.storage_offset(), tuple(value.shape), value.stride(), str(value.dtype))


def _to_numpy(value: Any, name: str) -> Any:
    torch = require_torch()
    if not isinstance(value, torch.Tensor):
        raise TorchImportError(f"lifted input {name} is a {type(value).__name__}, not a tensor")
    dtype_name(value.dtype)
    return value.detach().cpu().contiguous().numpy().copy()


def _tuple_tree(value: Any, b: Builder) -> Node:
    """A pytree of nodes (dicts, lists, tuples) as nested ``make_tuple`` calls,
    built bottom-up with an explicit stack."""
    def items(v: Any) -> Optional[list[Any]]:
        if isinstance(v, dict):
            return list(v.values())
        if isinstance(v, (list, tuple)):
            return list(v)
        return None

    done: dict[int, Node] = {}
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        v, expanded = stack.pop()
        kids = items(v)
        if kids is None:
            done[id(v)] = b.importer.as_node(v, b.loc)
        elif expanded:
            done[id(v)] = b.call(structure.make_tuple, *[done[id(k)] for k in kids])
        else:
            stack.append((v, True))
            stack.extend((k, False) for k in kids)
    return done[id(value)]


def import_torch(ep: Any) -> Module:
    """``ep`` (a ``torch.export.ExportedProgram``) as a Module whose entry
    ``forward`` takes the lifted parameters, buffers and constants, then the user
    inputs; ``mod.params`` holds the lifted values.  See the module docstring."""
    torch = require_torch()

    if not isinstance(ep, torch.export.ExportedProgram):
        raise UsageError(f"import_torch takes a torch.export.ExportedProgram, not {type(ep).__name__}")
    table = full_table(torch)
    direct = _direct_table(torch, ep, table)
    if direct is None:
        ep = _decompose(torch, ep, table)
        table = _direct_table(torch, ep, table, require_all=False) or table
    else:
        table = direct
    importer = Importer(torch, table, os.path.dirname(torch.__file__) + os.sep)
    gm = ep.graph_module
    importer.problems, importer.first = importer.collect_unsupported(gm)
    module = _build(torch, ep, importer)
    if importer.problems:
        n = len(importer.problems)
        raise TorchImportError(
            f"{n} unsupported op{'s' if n > 1 else ''} (nothing imported):\n  "
            + "\n  ".join(importer.problems), importer.first)
    return module


def _graphs(gm: Any, torch: Any) -> list[Any]:
    """``gm`` and every FX graph module it holds (cond branches, loop bodies)."""
    found, stack, seen = [], [gm], set()
    while stack:
        module = stack.pop()
        if id(module) in seen:
            continue
        seen.add(id(module))
        found.append(module)
        for node in module.graph.nodes:
            if node.op == "get_attr":
                sub = getattr(module, node.target, None)
                if isinstance(sub, torch.fx.GraphModule):
                    stack.append(sub)
    return found


def _is_view(target: Any) -> bool:
    """Whether an op's result may alias its input (``view``, ``transpose``, ...)."""
    schema = getattr(target, "_schema", None)
    return schema is not None and any(r.alias_info is not None for r in schema.returns)


def _inplace_twin(torch: Any, node: Any, table: dict[Any, Rule]) -> Optional[Rule]:
    """The rule of ``node``'s functional twin when ``node`` is an in-place op
    (``add_``, ``dropout_``) whose mutation nothing can observe: it writes only
    its first argument, an intermediate value made by an op that is not a view,
    none of whose other uses comes after it or is a view.  Then ``x.add_(y)`` is
    ``x + y``; anything else (a mutated input or buffer, a mutated view) is left
    to torch's functionalization."""
    schema = getattr(node.target, "_schema", None)
    if schema is None or not schema.is_mutable or not schema.name.endswith("_"):
        return None
    written = [a for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if len(written) != 1 or written[0] is not schema.arguments[0]:
        return None
    packet = getattr(torch.ops.aten, schema.name.split("::")[-1][:-1], None)
    twin = getattr(packet, node.target._overloadname, None)
    rule = table.get(twin)
    if rule is None or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    if schema.name in _EVAL_NO_OPS and len(node.args) > 2 and not node.args[2]:
        return rule  # dropout_ outside training writes nothing
    base = node.args[0]
    if base.op != "call_function" or _is_view(base.target) or base.target in _INPLACE_UNSAFE_BASES:
        return None
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    for user in base.users:
        if user is not node and (order[user] > order[node] or _is_view(user.target)
                                 or user.target is operator.getitem):
            return None
    return rule


_EVAL_NO_OPS = frozenset({"aten::dropout_", "aten::feature_dropout_", "aten::alpha_dropout_"})
"""In-place ops that change nothing when their ``train`` argument is false."""

_INPLACE_UNSAFE_BASES: frozenset[Any] = frozenset()
"""Producers whose result must not be treated as a fresh value (none so far)."""


def _direct_table(torch: Any, ep: Any, table: dict[Any, Rule],
                  require_all: bool = True) -> Optional[dict[Any, Rule]]:
    """The table extended by the program's safe in-place ops, or None when
    ``require_all`` and some op is neither in it nor such an in-place op (the
    program then goes through torch's decomposition first).  A program whose
    every op anfir maps is imported as exported: torch's re-tracing, most of an
    import's time, is skipped."""
    safe: dict[Any, Rule] = {}
    unsafe: set[Any] = set()
    for gm in _graphs(ep.graph_module, torch):
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target in table:
                if require_all and needs_functionalization(torch, node):
                    return None
                continue
            rule = _inplace_twin(torch, node, table)
            if rule is None:
                if require_all:
                    return None
                unsafe.add(node.target)
            else:
                safe[node.target] = rule
    extended = dict(table)
    extended.update((op, rule) for op, rule in safe.items() if op not in unsafe)
    return extended


def _decompose(torch: Any, ep: Any, table: dict[Any, Rule]) -> Any:
    """``ep`` lowered to core ATen, except the ops anfir maps whole (attention,
    ``linear``, ``hardsigmoid``, ...: every op of the table), which are kept — so
    the import keeps their meaning, their gradient convention and their speed,
    and does not depend on torch decomposing them (torch 2.13's own decomposition
    of GPT-2's attention fails).  Should torch's lowering fail anyway, the
    program is imported as exported (its ops outside the table are then listed)."""
    decompositions = torch.export.default_decompositions()
    # An op whose call here mutates state (batch norm updating running statistics) is
    # left to torch: its decomposition is what functionalization makes explicit.
    mutating = {node.target for gm in _graphs(ep.graph_module, torch) for node in gm.graph.nodes
                if node.op == "call_function" and needs_functionalization(torch, node)}
    for op in table:
        if op in decompositions and op not in mutating:
            decompositions.pop(op)
    try:
        with warnings.catch_warnings():
            # torch 2.13's own pytree deprecation notice, raised while it copies the program.
            warnings.simplefilter("ignore", FutureWarning)
            return ep.run_decompositions(decompositions)
    except Exception:  # torch's own failure: import the program as it was exported
        return ep


def _build(torch: Any, ep: Any, importer: "Importer") -> Module:
    """The Module of a decomposed program (refusals are collected in ``importer``)."""
    from torch.export.graph_signature import InputKind, OutputKind

    gm = ep.graph_module
    signature = ep.graph_signature
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    entry = FuncGraph(ENTRY, None)
    module = Module({}, filename="<torch.export>")
    env: dict[Any, Node] = {}
    shape_nodes: list[tuple[Node, int, Any]] = []
    kinds: list[str] = []
    owners: dict[tuple[Any, ...], tuple[Node, str]] = {}
    aliases: dict[str, str] = {}
    for spec, ph in zip(signature.input_specs, placeholders):
        kind = spec.kind
        value: Any = None
        if kind == InputKind.PARAMETER:
            value = ep.state_dict[spec.target]
        elif kind == InputKind.BUFFER:
            value = (ep.state_dict if spec.persistent else ep.constants)[spec.target]
        elif kind == InputKind.CONSTANT_TENSOR:
            value = ep.constants[spec.target]
        elif kind != InputKind.USER_INPUT:
            raise TorchImportError(f"input {spec.arg.name} of kind {kind.name} is not supported")
        key = _storage_key(torch, value)
        if key is not None and key in owners:
            # A tied weight (GPT-2's LM head is its token embedding): torch.export
            # lifts each alias, the source model has one tensor.  One parameter,
            # read wherever either alias is, so its gradient is the sum.
            env[ph], aliases[spec.target] = owners[key]
            continue
        name = _identifier(ph.name)
        param = entry.add_parameter(name, _placeholder_location(ph, importer.torch_dir))
        param.annotation = _annotation(ph.meta.get("val"))
        env[ph] = param
        if value is not None:
            module.params[name] = _to_numpy(value, spec.target)
        if key is not None:
            owners[key] = (param, spec.target)
        kinds.append(f"{kind.name.lower()} {spec.target or name}")
        val = ph.meta.get("val")
        if isinstance(val, torch.Tensor):
            for axis, d in enumerate(val.shape):
                if not isinstance(d, int) and d.node.expr.is_Symbol:
                    shape_nodes.append((param, axis, d.node.expr))
        elif isinstance(val, torch.SymInt) and val.node.expr.is_Symbol:
            importer.symbols.setdefault(val.node.expr, param)

    sizes = Builder(importer, entry, None, None)
    for holder, axis, sym in shape_nodes:
        if sym not in importer.symbols:
            importer.symbols[sym] = sizes.call(
                structure.tuple_getitem, sizes.call(tensor.shape, holder), axis)

    try:
        outputs = importer.build_body(gm.graph, entry, env, gm)
    except _PoisonedOutput:
        return module  # the refusals are in importer.problems: the caller raises
    out_specs = signature.output_specs
    mutated = [o for o, s in zip(outputs, out_specs)
               if s.kind in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION)]
    user = [o for o, s in zip(outputs, out_specs) if s.kind == OutputKind.USER_OUTPUT]
    if len(mutated) + len(user) != len(outputs):
        odd = [s.kind.name for s in out_specs
               if s.kind not in (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION,
                                 OutputKind.USER_OUTPUT)]
        raise TorchImportError(f"outputs of kind {', '.join(odd)} are not supported")
    tree = torch.utils._pytree.tree_unflatten(user, ep.call_spec.out_spec)
    out_loc = location_of(next(n for n in gm.graph.nodes if n.op == "output"), importer.torch_dir)
    b = Builder(importer, entry, None, out_loc)
    result = _tuple_tree(tree, b)
    if mutated:
        result = b.call(structure.make_tuple, *[importer.as_node(m, out_loc) for m in mutated], result)
    entry.output = result
    module.graphs[ENTRY] = entry
    module.default_entry = ENTRY
    module.metadata["producer"] = f"torch.export (torch {torch.__version__})"
    module.metadata["inputs"] = kinds
    if aliases:
        module.metadata["aliases"] = aliases
    module.metadata["mutations"] = [f"{s.kind.name.lower()} {s.target}" for s in out_specs
                                    if s.kind in (OutputKind.BUFFER_MUTATION,
                                                  OutputKind.USER_INPUT_MUTATION)]
    # The entry's own attribute (not the module's): it travels with the graph
    # through text, dumps and the passes' clones, and anfir.run, the compile of
    # concrete arguments and `anfir run` check calls against it
    # (anfir/abstract/dimranges.py).  [low, high] lists, None for an unbounded
    # side, as JSON has them: the printed text must read back equal.
    ranges = {str(sym): [_bound(vr.lower), _bound(vr.upper)]
              for sym, vr in ep.range_constraints.items() if getattr(sym, "is_Symbol", False)}
    if ranges:
        entry.flags.setdefault("meta", {})[RANGES] = ranges
    return module


def _bound(value: Any) -> Optional[int]:
    """A range bound as an int; None for an unbounded side (sympy's or torch's
    infinities, which ``int()`` does not turn into an error but crashes on)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif getattr(value, "is_Integer", False) and getattr(value, "is_finite", False):
        number = int(value)
    else:
        return None
    return number if abs(number) < 2 ** 62 else None


def load_pt2(path: str) -> Module:
    """Import a ``torch.export.save`` file (``.pt2``): loaded with ``torch.export.load``,
    which reads no pickled code."""
    torch = require_torch()
    try:
        with warnings.catch_warnings():
            # torch 2.13's own pytree deprecation notice, raised inside its loader.
            warnings.simplefilter("ignore", FutureWarning)
            ep = torch.export.load(path)
    except FileNotFoundError:
        raise UsageError(f"no such file: {path}") from None
    except Exception as err:
        raise TorchImportError(f"{path}: not a torch.export program ({type(err).__name__}: {err})") from None
    module = import_torch(ep)
    module.filename = path
    return module


__all__ = ["ENTRY", "EXTRA", "TorchImportError", "import_torch", "load_pt2", "require_torch"]

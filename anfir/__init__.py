"""anfir — a MindSpore-style functional graph IR with automatic differentiation.

The public API (see docs/ and shared spec ``api.md``)::

    mod = anfir.parse(text)            # or anfir.load("prog.anf" / "x.ir")
    anfir.run(mod["f"], 1.0)           # evaluate
    dg = anfir.grad(mod["f"])          # a new FuncGraph computing df/dx
    cg = anfir.compile(mod, dump_dir="dumps")   # the whole pipeline, with dumps
    anfir.to_text(g); anfir.dump_ir(g); anfir.dump_dot(g)
    fn = anfir.to_jax(cg)              # a function of JAX arrays (needs anfir[jax])

This module is the top layer: it imports every layer below, and
:mod:`anfir.wiring` plugs the higher layers into the lower ones' slots, so the
package behaves the same whichever submodule is imported first.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Union

from anfir import wiring  # noqa: F401  (fills the lower layers' slots before anything runs)
from anfir.autodiff import api as _ad
from anfir.autodiff import custom as _custom
from anfir.autodiff import batching as _batching, jacobians as _jac
from anfir.primitives import meta as _meta
from anfir.autodiff.checkpoint import checkpoint_api as _checkpoint_api
from anfir.backends import tojax as _tojax
from anfir.errors import AnfirError, UsageError
from anfir.eval import run as _run
from anfir.eval import mesh as _mesh
from anfir.grammar.parser import parse_module
from anfir.interop.coreml import exporter as _coreml_export
from anfir.interop.onnx import exporter as _onnx_export
from anfir.interop.onnx import external as _onnx_external
from anfir.interop.onnx import importer as _onnx_import
from anfir.interop.torch import importer as _torch_import
from anfir.interop import mindir as _mindir
from anfir.interop.mindir import exporter as _mindir_export
from anfir.ir.graph import FuncGraph, Module
from anfir.loading import load_file
from anfir import lowlevel as _lowlevel
from anfir.lowlevel import remat as _remat
from anfir.passes.pipeline import PHASES, compile_program
from anfir.passes import sharding as _sharding, sharding_search as _sharding_search
from anfir.printers.dot import dump_dot as _dump_dot
from anfir.printers.ir import dump_ir as _dump_ir
from anfir.printers.text import to_text as _to_text

__version__ = "0.1.0"

GraphOrModule = Union[FuncGraph, Module]


def parse(text: str, filename: str = "<string>") -> Module:
    """Parse ANF text into a :class:`Module` of resolved FuncGraphs."""
    return parse_module(text, filename)


def load(path: str) -> Any:
    """Read a ``.anf`` program, or load an ``.ir`` dump back, into a Module; a
    ``.lir`` dump loads as its low-level program (docs/lowlevel.md)."""
    return load_file(path)


def run(graph: Any, *args: Any) -> Any:
    """Evaluate ``graph`` (a FuncGraph, or a Module's entry) on Python/numpy ``args``;
    a low-level program (``anfir.lower``, a loaded ``.lir``) runs on its arena."""
    if isinstance(graph, _lowlevel.LowProgram):
        return _lowlevel.run_low(graph, *args)
    if _mesh.spmd_info(graph) is not None:  # a per-device program: simulate its mesh
        return _mesh.run_spmd(graph, *args)
    return _run(graph, *args)


def grad(graph: FuncGraph, wrt: Union[int, Sequence[int]] = 0) -> FuncGraph:
    """A new FuncGraph, with ``graph``'s parameters, returning d graph / d arg ``wrt``.

    ``wrt`` may be a tuple of indices: the graph then returns a tuple of gradients.
    """
    return _ad.grad(graph, wrt)


def value_and_grad(graph: FuncGraph, wrt: Union[int, Sequence[int]] = 0) -> FuncGraph:
    """A new FuncGraph returning ``(graph(*args), gradient)``."""
    return _ad.value_and_grad(graph, wrt)


def vjp(graph: FuncGraph) -> FuncGraph:
    """A new FuncGraph ``(*args) -> (out, bprop)``; ``bprop(dout)`` returns the input gradients."""
    return _ad.vjp(graph)


def jvp(graph: FuncGraph) -> FuncGraph:
    """A new FuncGraph ``(*args, *tangents) -> (out, tangent_out)``: forward mode,
    the derivative of ``graph`` at ``args`` along ``tangents``."""
    return _ad.jvp(graph)


def vmap(graph: FuncGraph, in_axes: Any = 0, out_axes: Any = 0) -> FuncGraph:
    """A new FuncGraph computing ``graph`` over a batch: each argument batched along its
    axis in ``in_axes`` (an int, None for not batched, or a tuple per argument, nested
    for tuple arguments), the result's batch axis at ``out_axes``."""
    return _batching.vmap_api(_ad.entry_graph(graph), in_axes, out_axes)


def jacfwd(graph: FuncGraph, wrt: int = 0) -> FuncGraph:
    """A new FuncGraph returning the Jacobian of ``graph`` w.r.t. argument ``wrt`` (forward
    mode: vmap of jvp); shape ``out.shape + arg.shape``."""

    return _jac.api_graph(_meta.jacfwd, _ad.entry_graph(graph), wrt)


def jacrev(graph: FuncGraph, wrt: int = 0) -> FuncGraph:
    """A new FuncGraph returning the Jacobian of ``graph`` w.r.t. argument ``wrt`` (reverse
    mode: vmap of the pullback); shape ``out.shape + arg.shape``."""

    return _jac.api_graph(_meta.jacrev, _ad.entry_graph(graph), wrt)


def hessian(graph: FuncGraph, wrt: int = 0) -> FuncGraph:
    """A new FuncGraph returning the Hessian of scalar ``graph`` w.r.t. argument ``wrt``."""

    return _jac.api_graph(_meta.hessian, _ad.entry_graph(graph), wrt)


def checkpoint(graph: FuncGraph) -> FuncGraph:
    """A new FuncGraph computing what ``graph`` does, whose gradient keeps only its
    inputs and recomputes ``graph``'s forward pass in the backward pass (as
    ``checkpoint(f)`` in programs; JAX's ``jax.checkpoint``).  See docs/remat.md."""
    return _checkpoint_api(graph)


def compile(mod_or_graph: Any, entry: Optional[str] = None, args: Optional[Sequence[Any]] = None,
            dump_dir: Optional[str] = None, backend: Optional[str] = None,
            lower: bool = False, remat: Any = None, mesh: Optional[dict] = None,
            in_shardings: Optional[Sequence[Any]] = None, fine_dumps: bool = False) -> FuncGraph:
    """Run the whole pipeline (parse ... validate) and return the optimized graph.

    ``args`` are example values (or abstract types); without them the entry's
    annotations are used.  With ``dump_dir``, each phase writes ``NN_phase.ir``
    and ``NN_phase.dot`` there.  ``fine_dumps=True`` adds the finer dumps: one
    ``.ir`` per optimizer round under ``optimize/``, and the ``loops`` phase
    (counted tail recursion rewritten into ``fori_loop``, numbered before
    ``ad``) when it rewrote a loop.

    ``backend="jax"`` adds one phase: the optimized graph lowered to JAX and
    jitted for the argument types, its StableHLO written as
    ``NN_stablehlo.mlir`` (which needs concrete shapes and ``anfir[jax]``).
    The result is the same optimized FuncGraph: ``anfir.run`` runs it, and
    ``anfir.to_jax`` of it is the lowered function.

    ``lower=True`` adds the low-level phases after ``validate`` (``lower``,
    ``share_buffers``, ``plan_memory``; docs/lowlevel.md), each dumped as
    ``NN_phase.lir``; :func:`lower` returns that program itself.

    ``remat="min-cut"`` (or a memory budget in bytes) adds the ``remat`` phase
    before ``validate``: a gradient program recomputes forward values in its
    backward pass instead of keeping them (docs/remat.md).
    ``mesh={"dp": 4, "mp": 2}`` (with ``in_shardings``, one layout per argument:
    a tuple with an axis name or None per dimension, None = replicated) adds
    the SPMD phases (``flatten``, ``sharding``, ``spmd``; docs/parallelism.md)
    and returns the per-device program: ``anfir.run`` of it simulates the mesh
    on global arguments, ``anfir.to_jax`` of it runs under ``jax.shard_map``.
    ``args`` are then the global example values or types.
    ``in_shardings="auto"`` chooses the layouts by the cost model's search
    (:mod:`anfir.passes.sharding_search`), recorded in the program's metadata.
    """
    phases = None
    if backend == "jax":
        phases = [*PHASES, _tojax.lowering_phase()]
    elif backend not in (None, "eval"):
        raise UsageError(f"unknown backend {backend!r}: 'eval' (the default) or 'jax'")
    if mesh is not None:
        if backend == "jax":
            raise UsageError("backend='jax' with a mesh: compile without it and run "
                             "anfir.to_jax(cg) under jax.shard_map (docs/parallelism.md)")
        chosen = _sharding_search.chooser() if in_shardings == "auto" else in_shardings
        phases = [*(phases or PHASES), *_sharding.phases(mesh, chosen)]
    elif in_shardings is not None:
        raise UsageError("in_shardings needs a mesh: anfir.compile(..., mesh={'dp': 8}, "
                         "in_shardings=[...])")
    if lower:
        phases = [*(phases or PHASES), *_lowlevel.PHASES]
    if remat is not None:
        phases = _remat.with_remat(list(phases or PHASES), remat)
    return compile_program(mod_or_graph, entry=entry, args=args, dump_dir=dump_dir,
                           phases=phases, fine_dumps=fine_dumps).graph


def lower(mod_or_graph: Any, entry: Optional[str] = None,
          args: Optional[Sequence[Any]] = None, remat: Any = None) -> Any:
    """The low-level buffer program of ``mod_or_graph``'s entry (docs/lowlevel.md):
    compiled for ``args`` (example values or types with sizes; the annotations
    otherwise), lowered to instructions over buffers, buffers shared, and
    planned in one arena.  ``anfir.run(low, *args)`` runs it; ``low.peak_bytes``,
    ``low.max_live_bytes`` and ``low.naive_bytes`` are its header's figures.  A
    program that cannot be lowered is an AnfirError at the node in the way.
    ``remat`` as for :func:`compile`."""
    phases = [*PHASES, *_lowlevel.PHASES]
    if remat is not None:
        phases = _remat.with_remat(phases, remat)
    result = compile_program(mod_or_graph, entry=entry, args=args, phases=phases)
    low = result.program.artifacts["lowlevel"]
    low.phase = result.program.last_phase
    return low


def to_jax(mod_or_graph: GraphOrModule, entry: Optional[str] = None) -> Any:
    """``mod_or_graph``'s entry as a pure function of JAX arrays, which ``jax.jit``,
    ``jax.grad``, ``jax.vmap`` and sharded inputs accept (see docs/jax.md).

    Needs JAX (``pip install "anfir[jax]"``); without it, an AnfirError saying so.
    """
    return _tojax.to_jax(mod_or_graph, entry)


def export_onnx(mod_or_graph: Any, entry: Optional[str] = None,
                args: Optional[Sequence[Any]] = None) -> Any:
    """Compile and write the optimized entry as an ``onnx.ModelProto`` (opset 21).

    ``args`` are example values or types, as for :func:`compile`.  Needs the
    ``onnx`` package (``pip install "anfir[onnx]"``); a program that is not
    first-order after optimization is an :class:`AnfirError` naming the node.
    See :mod:`anfir.interop.onnx.exporter`.
    """
    return _onnx_export.export_onnx(mod_or_graph, entry=entry, args=args)


def save_onnx(model: Any, path: str, external_data: Optional[bool] = None) -> Any:
    """Write an ONNX ``model`` (from :func:`export_onnx`) to ``path``; the model as written.

    ``external_data=True`` puts every tensor of 1 KiB or more in ``PATH.data``
    beside it (what ``torch.onnx.export`` does, and what protobuf's 2 GB limit
    needs for a large model); None (default) does so only past that limit;
    False never (a model past the limit is then an error).  The data file is
    written anew, never appended to; :func:`import_onnx` reads it back by path.
    """
    return _onnx_external.save_model(model, path, external_data)


def export_coreml(mod_or_graph: Any, entry: Optional[str] = None,
                  args: Optional[Sequence[Any]] = None) -> Any:
    """Compile and write the optimized entry as a coremltools MIL ``Program``
    (``if`` → ``cond``, loops → ``while_loop``; f64/i64 computed as fp32/int32).

    ``args`` are example values or types, as for :func:`compile`.  Needs
    coremltools (``pip install "anfir[coreml]"``); convert and save with
    ``anfir.interop.coreml.exporter.to_mlmodel(prog).save("X.mlpackage")``.
    See :mod:`anfir.interop.coreml.exporter` and docs/coreml.md.
    """
    return _coreml_export.export_coreml(mod_or_graph, entry=entry, args=args)


def import_onnx(model_or_path: Any, params_as_inputs: bool = False) -> Module:
    """Read an ONNX model (an ``onnx.ModelProto`` or a ``.onnx`` path) into a Module.

    The entry (``mod.entry``, named after the ONNX graph) takes the graph's
    inputs that have no initializer; initializers are constants, or with
    ``params_as_inputs=True`` the entry's first parameters, their values in
    ``mod.params``.  Needs the ``onnx`` package (``pip install "anfir[onnx]"``);
    every node that does not import is listed in one :class:`AnfirError`.
    See :mod:`anfir.interop.onnx.importer` and docs/onnx.md.
    """
    return _onnx_import.import_onnx(model_or_path, params_as_inputs=params_as_inputs)


def import_torch(ep: Any) -> Module:
    """A ``torch.export.ExportedProgram`` as a Module: entry ``forward`` takes the
    lifted parameters, buffers and constants, then the user inputs, in the
    graph signature's order; ``mod.params`` maps the lifted names to their values
    (numpy).  Needs ``pip install "anfir[torch]"``; an op anfir cannot express is
    an AnfirError naming it and its Python line.  See docs/torch.md.
    """
    return _torch_import.import_torch(ep)


def import_mindir(path_or_bytes: Any, params_as_inputs: bool = False) -> Module:
    """Read a MindSpore ``.mindir`` file (a path, or its bytes) into a Module: the
    entry graph (``main``) and every function graph; ``Switch`` of two ``Partial`` closures is
    ``if``, a while header a tail-recursive graph; weights are constants, or with
    ``params_as_inputs=True`` the entry's first parameters, their values in
    ``mod.params``.  Needs only protobuf (``pip install "anfir[mindir]"``); every
    node that does not import is listed in one located :class:`AnfirError`.
    See docs/mindir.md.
    """
    return _mindir.import_mindir(path_or_bytes, params_as_inputs=params_as_inputs)


def export_mindir(mod_or_graph: Any, entry: Optional[str] = None, args: Optional[Sequence[Any]] = None,
                  path: Optional[str] = None) -> bytes:
    """Compile and write the entry as a MindSpore ``.mindir`` file: its bytes, also
    written to ``path`` when given.  The graphs themselves are written — closures
    lambda-lifted to ``Partial``, ``if`` as ``Switch``, loops (and their gradients)
    as graphs that call themselves; a Module's ``params`` as weights.  ``args`` as
    for :func:`compile`.  Needs only protobuf (``pip install "anfir[mindir]"``);
    ``mindspore.load`` + ``nn.GraphCell`` run the file.  See docs/mindir.md.
    """
    return _mindir_export.export_mindir(mod_or_graph, entry=entry, args=args, path=path)


def to_text(obj: GraphOrModule) -> str:
    """Canonical ANF text that parses back to the same graphs."""
    return _to_text(obj)


def dump_ir(obj: GraphOrModule, phase: str = "") -> str:
    """The ``.ir`` dump text (readable, and loadable with :func:`load`)."""
    return _dump_ir(obj, phase=phase)


def dump_dot(obj: GraphOrModule) -> str:
    """Graphviz ``dot`` source drawing the graphs (one cluster per graph)."""
    return _dump_dot(obj)


__all__ = [
    "AnfirError", "FuncGraph", "Module", "compile", "dump_dot", "dump_ir", "export_coreml",
    "export_onnx", "grad", "import_onnx", "import_torch", "jvp", "load", "lower", "parse", "run",
    "to_jax", "to_text", "value_and_grad", "vjp",
    "vmap", "jacfwd", "jacrev", "hessian",
]


def custom_vjp(f: FuncGraph, fwd: FuncGraph, bwd: FuncGraph) -> FuncGraph:
    """``f`` whose reverse-mode derivative is the user's (as ``jax.custom_vjp``):
    ``fwd(x...) -> (f(x...), residuals)``, ``bwd(residuals, dout) -> (dx...)``."""
    return _custom.custom_vjp(f, fwd, bwd)


def custom_jvp(f: FuncGraph, jvp_rule: FuncGraph) -> FuncGraph:
    """``f`` whose derivative is the user's (as ``jax.custom_jvp``):
    ``jvp_rule((x...), (t...)) -> (f(x...), tangent)``, linear in the tangents."""
    return _custom.custom_jvp(f, jvp_rule)


__all__ += ["custom_jvp", "custom_vjp"]  # structured loops' branch: custom derivatives
__all__ += ["checkpoint"]
__all__ += ["export_mindir", "import_mindir"]  # MindSpore .mindir files (docs/mindir.md)
__all__ += ["save_onnx"]  # ONNX files with external data (docs/onnx.md)

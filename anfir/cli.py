"""The ``anfir`` command: run, grad, compile, export, fmt and dot on ``.anf`` files.

Exit status: 0 on success, 1 on an error in the user's input (a located
message on stderr, never a traceback), 2 on a usage error.  Set
``ANFIR_DEBUG=1`` to see the traceback of an internal error.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, NoReturn, Optional, Sequence

import numpy as np

from anfir.errors import AnfirError, UsageError
from anfir import limits
from anfir.limits import int_text
from anfir.abstract.dimranges import check_argument_ranges
from anfir.abstract.values import AbstractValue
from anfir.dtypes import dtype_name
from anfir.autodiff.api import grad
from anfir.backends import tojax
from anfir import lowlevel
from anfir.lowlevel import remat
from anfir.eval import run
from anfir.grammar.parser import parse_module
from anfir.grammar.resolve import resolve_module
from anfir.interop.coreml import exporter as coreml_export
from anfir.interop.onnx import exporter as onnx_export
from anfir.interop.onnx import external as onnx_external, importer as onnx_import
from anfir.interop.torch import importer as torch_import
from anfir.interop import mindir
from anfir.interop.mindir import exporter as mindir_exporter, schema as mindir_schema
from anfir.ir.walk import reachable_graphs
from anfir.loading import load_file
from anfir.nested import nested_text, tuple_items
from anfir.passes.pipeline import PHASES, compile_program
from anfir.passes.specialize import abstract_from_annotation_text
from anfir.printers.dot import dump_dot
from anfir.printers.ir import dump_ir
from anfir.printers.text import to_text

EXAMPLES = """\
examples:
  anfir run examples/fibonacci.anf 10            # prints 55
  anfir run examples/power.anf --entry dpower --backend jax 3.0
  anfir grad examples/power.anf --entry power --wrt 0 2.0 3
  anfir compile examples/mlp.anf --dump-dir dumps --time
  anfir export examples/mlp.anf -o mlp.onnx      # needs pip install "anfir[onnx]"
  anfir export examples/mlp.anf --to coreml -o mlp.mlpackage   # needs "anfir[coreml]"
  anfir import mlp.onnx -o mlp_again.anf         # needs pip install "anfir[onnx]"
  anfir fmt examples/hof.anf
  anfir dot examples/fibonacci.anf -o fib.svg
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors exit 2 with one clean line (no traceback)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: usage error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``anfir`` command."""
    parser = _Parser(prog="anfir", description="A MindSpore-style functional graph IR with "
                     "automatic differentiation: run, differentiate, compile and draw ANF programs.",
                     epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    raw = argparse.RawDescriptionHelpFormatter

    p = sub.add_parser("run", help="evaluate a definition on arguments", formatter_class=raw,
                       epilog="example:\n  anfir run examples/fibonacci.anf 10\n"
                              "  anfir run examples/mlp.anf w1.npy w2.npy x.npy y.npy")
    p.add_argument("file", help="an .anf program (or an .ir dump)")
    p.add_argument("--entry", help="the definition to run (default: main, or the only one)")
    _backend_option(p, "run it with anfir's evaluator (eval, the default) or jitted by JAX "
                       '(jax: XLA; needs pip install "anfir[jax]")')
    p.add_argument("args", nargs="*", metavar="ARG",
                   help='an ANF literal (3, 2.5, true, "s", (1, 2.0)) or an .npy file')
    _max_depth_option(p)

    p = sub.add_parser("grad", help="print the gradient of a definition at arguments",
                       formatter_class=raw,
                       epilog="example:\n  anfir grad examples/power.anf --entry power --wrt 0 2.0 3\n"
                              "  anfir grad examples/mlp.anf --wrt 0,1 -o grad.ir w1.npy w2.npy x.npy y.npy")
    p.add_argument("file", help="an .anf program (or an .ir dump)")
    p.add_argument("--entry", help="the definition to differentiate (default: main, or the only one)")
    p.add_argument("--wrt", default="0", help="argument indices, comma separated (default 0)")
    p.add_argument("-o", "--output", help="also write the gradient graph's .ir here "
                   "(then the ARGs may be left out)")
    p.add_argument("args", nargs="*", metavar="ARG",
                   help="the point at which to evaluate the gradient: ANF literals or .npy files")
    _max_depth_option(p)

    p = sub.add_parser("compile", help="run the pipeline, writing numbered per-phase dumps",
                       formatter_class=raw,
                       epilog="example:\n  anfir compile examples/mlp.anf --dump-dir dumps --time\n"
                              "  anfir compile examples/power.anf --entry dpower --args 3.0 --dump-dir dumps")
    p.add_argument("file", help="an .anf program (or an .ir dump)")
    p.add_argument("--entry", help="the definition to compile (default: main, or the only one)")
    p.add_argument("--args", nargs="*", default=None, metavar="ARG",
                   help="example arguments (values, .npy files or types such as 'f64[B, 3]'); "
                        "without them the entry's annotations are used; with values the "
                        "compiled graph is also run and its result printed")
    p.add_argument("--dump-dir", help="write NN_phase.ir and NN_phase.dot here")
    p.add_argument("--fine-dumps", action="store_true",
                   help="with --dump-dir, also the finer dumps: one .ir per optimizer round "
                        "under DIR/optimize/, and the loops phase (counted tail recursion "
                        "rewritten into fori_loop) when it rewrote a loop")
    p.add_argument("--time", action="store_true", help="print a per-phase timing table")
    _backend_option(p, "jax: lower the optimized graph to JAX after the pipeline (one more "
                       "phase, dumped as NN_stablehlo.mlir) and run the result with it")
    p.add_argument("--lower", action="store_true",
                   help="add the low-level phases (lower, share_buffers, plan_memory; dumped as "
                        "NN_phase.lir) and print the arena's figures; with values, run the "
                        "low-level program (docs/lowlevel.md)")
    p.add_argument("--remat", metavar="min-cut|BYTES|dots-saveable",
                   help="add the remat phase before validate: the gradient program recomputes "
                        "forward values in its backward pass instead of keeping them (min-cut), "
                        "or as little as keeps the planned arena within BYTES; dots-saveable: "
                        "each checkpoint(f) keeps its matmuls and convolutions (docs/remat.md)")
    _max_depth_option(p)

    p = sub.add_parser("export", help="write the optimized program as an ONNX or Core ML model",
                       formatter_class=raw,
                       epilog="examples:\n  anfir export examples/mlp.anf -o mlp.onnx\n"
                              "  anfir export examples/loop.anf --entry newton_sqrt --args 2.0 "
                              "-o sqrt.onnx\n"
                              "  anfir export examples/mlp.anf --to coreml -o mlp.mlpackage\n"
                              "(ONNX export needs the onnx package: pip install \"anfir[onnx]\"; "
                              'Core ML export coremltools: pip install "anfir[coreml]")')
    p.add_argument("file", help="an .anf program (or an .ir dump)")
    p.add_argument("--entry", help="the definition to export (default: main, or the only one)")
    p.add_argument("--args", nargs="*", default=None, metavar="ARG",
                   help="example arguments or types (as for compile); without them the entry's "
                        "annotations are used; symbolic dimensions become ONNX dim_params "
                        "(Core ML: flexible dimensions)")
    p.add_argument("--to", choices=sorted(EXPORTERS), default="onnx",
                   help="the format to write (default: onnx)")
    p.add_argument("-o", "--output", required=True, help="the file to write (OUT.onnx, or an OUT.mlpackage directory)")
    p.add_argument("--external-data", action="store_true",
                   help="ONNX: write the weights to OUT.onnx.data beside the model (chosen by itself "
                        "when one file would pass protobuf's 2 GB limit)")

    p = sub.add_parser("import", help="read a model (.onnx, .pt2) and print it as ANF text",
                       formatter_class=raw,
                       epilog="examples:\n  anfir export examples/mlp.anf -o mlp.onnx\n"
                              "  anfir import mlp.onnx -o mlp_again.anf\n"
                              "(a .pt2 file of torch.export.save imports the same way; the format is chosen by "
                              "the file's extension: "
                              f"{', '.join(sorted(IMPORTERS))}; ONNX needs the onnx package: "
                              'pip install "anfir[onnx]"; .pt2 needs torch: pip install "anfir[torch]")')
    p.add_argument("file", help=f"the model: {', '.join(sorted(IMPORTERS))}")
    p.add_argument("-o", "--output", help="the .anf file to write (default: standard output)")

    p = sub.add_parser("fmt", help="print the program as canonical ANF", formatter_class=raw,
                       epilog="example:\n  anfir fmt examples/hof.anf")
    p.add_argument("file", help="an .anf program (or an .ir dump)")

    p = sub.add_parser("dot", help="draw a definition with Graphviz", formatter_class=raw,
                       epilog="example:\n  anfir dot examples/fibonacci.anf -o fib.svg")
    p.add_argument("file", help="an .anf program (or an .ir dump)")
    p.add_argument("--entry", help="the definition to draw (default: main, or the only one)")
    p.add_argument("-o", "--output", help="OUT.dot, OUT.svg or OUT.png (default: dot source on stdout)")
    return parser


def _max_depth_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-depth", type=_positive, metavar="N",
                   help=f"the most nested calls an evaluation may make (default "
                        f"{limits.MAX_CALL_DEPTH:,}); deeper is a runtime error")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {text[:30]!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, not {value}")
    return value


def _backend_option(parser: argparse.ArgumentParser, text: str) -> None:
    parser.add_argument("--backend", choices=("eval", "jax"), default="eval", help=text)


# -- arguments ------------------------------------------------------------------
MAX_ARGUMENT_CHARS = 1_000_000
"""The longest literal ARG (larger values are passed as ``.npy`` files)."""


def parse_arg(text: str) -> Any:
    """A command-line ARG: an ``.npy`` path (loaded without pickle) or an ANF literal."""
    if text.endswith(".npy"):
        if not os.path.exists(text):
            raise UsageError(f"no such file: {text}")
        try:
            return limits.read_npy_file(text)
        except limits.ReadError as exc:
            raise UsageError(f"cannot read {text} as a numpy array: {exc}") from None
    shown = text if len(text) <= 60 else text[:50] + "..."
    if len(text) > MAX_ARGUMENT_CHARS:
        raise UsageError(f"the argument {shown!r} is too long ({len(text):,} characters; at most "
                         f"{MAX_ARGUMENT_CHARS:,}): pass large values as .npy files")
    try:
        module = parse_module(f"def __arg__() = {text}", "<argument>")
    except AnfirError as error:
        why = error.message if "at most" in error.message else ""
        raise UsageError(f"cannot read the argument {shown!r}: expected an ANF literal such as "
                         '3, 2.5, true, "s", (1, 2.0), or the path of an .npy file'
                         + (f" ({why})" if why else "")) from None
    graph = module["__arg__"]
    for node in graph.nodes():
        callee = node.inputs[0] if node.inputs else None
        name = getattr(getattr(callee, "value", None), "name", "")
        if callee is not None and name not in ("make_tuple", "neg", "array"):
            raise UsageError(f"an argument must be a literal, a tuple or an .npy file: {text}")
    return run(graph)


def parse_args_list(texts: Sequence[str]) -> list[Any]:
    """Every ARG parsed."""
    return [parse_arg(t) for t in texts]


def format_value(value: Any) -> str:
    """A result as ANF-like text (floats round-trip, arrays in full).

    Tuples may nest thousands deep: they are written without recursion.
    """

    return nested_text(value, tuple_items, _format_atom)


def _format_atom(value: Any) -> str:
    """One non-tuple result as text."""
    if isinstance(value, bool) or isinstance(value, np.bool_):
        return "true" if value else "false"
    if value is None:
        return "None"
    if isinstance(value, float) or isinstance(value, np.floating):
        return repr(float(value))
    if isinstance(value, (int, np.integer)):
        return int_text(int(value))
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, np.ndarray):
        body = np.array2string(value, separator=", ", threshold=sys.maxsize,
                               floatmode="unique", max_line_width=100)
        dtype = dtype_name(value.dtype) or value.dtype.name  # numpy's name for the others
        return f"Tensor[{dtype}, {value.shape}]({body})"
    return repr(value)


# -- commands -------------------------------------------------------------------
def _load(path: str, runnable: bool = False) -> Any:
    if not os.path.exists(path):
        raise UsageError(f"no such file: {path}")

    module = load_file(path)
    if runnable and not isinstance(module, lowlevel.LowProgram) and module.phase is not None:
        # A dump written before the resolve phase still holds global names;
        # resolve them, as compile would (a no-op on later dumps).

        resolve_module(module)
    return module


def cmd_run(ns: argparse.Namespace) -> int:

    module = _load(ns.file, runnable=True)
    args = parse_args_list(ns.args)
    if isinstance(module, lowlevel.LowProgram):  # a .lir dump runs on its arena
        print(format_value(lowlevel.run_low(module, *args)))
        return 0
    graph = module[module.entry_name(ns.entry)]
    if ns.backend == "jax":
        check_argument_ranges(graph, args)  # the entry's declared dimension ranges (run checks them itself)
        print(format_value(_run_jax(tojax.to_jax(graph), args)))
    else:
        print(format_value(run(graph, *args)))
    return 0


def _run_jax(fn: Any, args: list[Any]) -> Any:
    """``fn`` jitted on ``args`` (64-bit types on); a note on stderr when the program
    recursed on its scalar arguments and ran with them as constants."""
    result, static = tojax.run_with_jax(fn, args)
    if static:
        print("note: the program recurses on its scalar arguments; JAX ran it with them "
              "as compile-time constants (static)", file=sys.stderr)
    return result


def _wrt(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(",") if part.strip() != "")
    except ValueError:
        raise UsageError(f"--wrt takes argument indices such as 0 or 0,2, not {text!r}") from None


def cmd_grad(ns: argparse.Namespace) -> int:

    module = _load(ns.file, runnable=True)
    graph = module[module.entry_name(ns.entry)]
    indices = _wrt(ns.wrt)
    if not indices:
        raise UsageError("--wrt needs at least one index")
    gradient = grad(graph, indices[0] if len(indices) == 1 else indices)
    if ns.output:

        with open(ns.output, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(dump_ir(gradient))
    if ns.args or not graph.parameters:
        args = parse_args_list(ns.args)
        check_argument_ranges(graph, args)  # the gradient takes the entry's arguments
        print(format_value(run(gradient, *args)))
    elif not ns.output:
        raise UsageError(f"give the arguments of @{graph.name} to evaluate its gradient "
                         f"({len(graph.parameters)} expected), or -o OUT.ir to write the graph")
    return 0


def compile_args(texts: Optional[Sequence[str]]) -> Optional[list[Any]]:
    """``--args``: each an example value (a literal or an ``.npy`` file) or a type."""
    if texts is None:
        return None
    args: list[Any] = []
    for text in texts:
        try:
            args.append(parse_arg(text))
        except AnfirError as literal_error:
            try:
                args.append(abstract_from_annotation_text(text))
            except AnfirError:
                if text[:1].isalpha():
                    raise  # meant as a type: say what is wrong with it
                raise literal_error from None
    return args


def cmd_compile(ns: argparse.Namespace) -> int:
    if not os.path.exists(ns.file):
        raise UsageError(f"no such file: {ns.file}")
    args = compile_args(ns.args)
    values = args if args is not None and all(not _is_abstract(a) for a in args) else None
    phases = [*PHASES, tojax.lowering_phase()] if ns.backend == "jax" else None
    if ns.lower:
        phases = [*(phases or PHASES), *lowlevel.PHASES]
    if ns.remat is not None:
        phases = remat.with_remat(list(phases or PHASES), ns.remat)
    if ns.fine_dumps and not ns.dump_dir:
        raise UsageError("--fine-dumps needs --dump-dir DIR")
    result = compile_program(ns.file, entry=ns.entry, args=args, dump_dir=ns.dump_dir,
                             phases=phases, fine_dumps=ns.fine_dumps)
    graph = result.graph
    print(f"compiled @{graph.name}: {_count(graph)} nodes after {len(result.timings)} phases")
    if ns.time:
        print(_timing_table(result.timings))
    if ns.dump_dir:
        print(f"dumps in {ns.dump_dir}/: {', '.join(os.path.basename(p) for p in result.dump_files)}")
    if ns.remat is not None:
        print(result.program.artifacts["remat"].line())
    if ns.lower:
        low = result.program.artifacts["lowlevel"]
        print(f"low level: {len(low.instructions())} instructions, arena {low.peak_bytes} bytes, "
              f"max live {low.max_live_bytes} bytes, no sharing {low.naive_bytes} bytes")
        if values is not None:
            print(f"result (low level): {format_value(lowlevel.run_low(low, *values))}")
    if values is not None:
        if ns.backend == "jax":
            print(f"result: {format_value(_run_jax(result.program.artifacts['jax'], values))}")
        else:
            print(f"result: {format_value(run(graph, *values))}")
    return 0


def _is_abstract(value: Any) -> bool:

    return isinstance(value, AbstractValue)


def _count(graph: Any) -> int:

    return sum(len(g.nodes()) for g in reachable_graphs([graph]))


def _timing_table(timings: dict[str, float]) -> str:
    width = max([len(name) for name in timings] + [5])
    lines = [f"{'phase':<{width}}  {'ms':>9}", f"{'-' * width}  {'-' * 9}"]
    for name, seconds in timings.items():
        lines.append(f"{name:<{width}}  {seconds * 1000:9.2f}")
    lines.append(f"{'total':<{width}}  {sum(timings.values()) * 1000:9.2f}")
    return "\n".join(lines)


def cmd_export(ns: argparse.Namespace) -> int:
    """``anfir export``: compile, write the model, print a one-line summary."""
    if not os.path.exists(ns.file):
        raise UsageError(f"no such file: {ns.file}")
    write, save, summary = EXPORTERS[ns.to]
    if ns.external_data:
        if ns.to != "onnx":
            raise UsageError(f"--external-data is for ONNX files, not --to {ns.to}")
        save = _save_onnx_external
    model = write(ns.file, ns.entry, compile_args(ns.args))
    print(summary(save(model, ns.output), ns.output))
    return 0


def _save_onnx(model: Any, path: str) -> Any:
    """Write the ONNX model's deterministic bytes to ``path`` (its weights beside it
    in ``PATH.data`` if one file would pass protobuf's limit); the model."""
    return onnx_external.save_model(model, path)


def _save_onnx_external(model: Any, path: str) -> Any:
    """Write the ONNX model to ``path``, its weights to ``PATH.data``; the model."""
    return onnx_external.save_model(model, path, external_data=True)


def _save_coreml(program: Any, path: str) -> Any:
    """Convert the MIL Program (float32) and save it as an ``.mlpackage``; what it declares."""
    if not path.endswith(".mlpackage"):
        raise UsageError(f"a Core ML model is an .mlpackage directory: -o {path}.mlpackage?")
    model = coreml_export.to_mlmodel(program)
    model.save(path)
    return coreml_export.describe(path)


def _coreml_summary(described: Any, path: str) -> str:
    """``exported @f to f.mlpackage: Core ML mlprogram, 1 input, 1 output, 9 ops (1 cond)``."""
    ops = described["op_types"]
    control = ", ".join(f"{ops.count(k)} {k}" for k in ("cond", "while_loop") if k in ops)
    entry = described["metadata"].get("anfir.entry", "?")
    n_in, n_out = len(described["inputs"]), len(described["outputs"])
    return (f"exported @{entry} to {path}: Core ML mlprogram (float32), "
            f"{n_in} input{'s' * (n_in != 1)}, {n_out} output{'s' * (n_out != 1)}, "
            f"{len(ops)} ops" + (f" ({control})" if control else ""))


def _onnx_summary(model: Any, path: str) -> str:
    """``exported @f to f.onnx: ONNX opset 21, 1 input, 1 output, 9 nodes (1 If)``."""
    counts: dict[str, int] = {}
    total = 0
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            total += 1
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
            graphs.extend(a.g for a in node.attribute if a.HasField("g"))
    control = ", ".join(f"{counts[k]} {k}" for k in ("If", "Loop") if counts.get(k))
    entry = next((p.value for p in model.metadata_props if p.key == "anfir.entry"), "?")
    n_in, n_out = len(model.graph.input), len(model.graph.output)
    return (f"exported @{entry} to {path}: ONNX opset {model.opset_import[0].version}, "
            f"{n_in} input{'s' * (n_in != 1)}, {n_out} output{'s' * (n_out != 1)}, "
            f"{total} nodes" + (f" ({control})" if control else "")
            + (f", weights in {path}.data" if os.path.exists(path + ".data")
               and onnx_external.uses_external_data(model) else ""))


def _save_mindir(data: Any, path: str) -> Any:
    """Write the ``.mindir`` bytes to ``path``; the bytes."""
    with open(path, "wb") as handle:
        handle.write(data)
    return data


def _mindir_summary(data: Any, path: str) -> str:
    """``exported to f.mindir: MindIR, 3 graphs, 9 nodes, 1,234 bytes``."""
    model = mindir_schema.classes()["ModelProto"].FromString(data)
    graphs = [model.graph, *model.functions]
    nodes = sum(len(g.node) for g in graphs)
    return (f"exported @{model.graph.name} to {path}: MindIR, {len(graphs)} graph"
            f"{'s' * (len(graphs) != 1)}, {nodes} nodes, {len(data):,} bytes")


EXPORTERS: dict[str, tuple[Callable[[str, Optional[str], Optional[list[Any]]], Any],
                           Callable[[Any, str], Any], Callable[[Any, str], str]]] = {
    "onnx": (onnx_export.export_onnx, _save_onnx, _onnx_summary),
    "coreml": (coreml_export.export_coreml, _save_coreml, _coreml_summary),
    "mindir": (mindir_exporter.export_mindir, _save_mindir, _mindir_summary),
}
"""``--to`` format → (make the model of FILE, ENTRY, ARGS; save it to OUT, returning what
to summarize; describe that in one line)."""


IMPORTERS: dict[str, Callable[[str], Any]] = {
    ".onnx": onnx_import.import_onnx,
    ".pt2": torch_import.load_pt2,
    ".mindir": mindir.import_mindir,
}
"""A model file's extension → the importer that reads it into a Module."""


def cmd_import(ns: argparse.Namespace) -> int:
    """``anfir import``: read a model by its extension, print or write it as ANF text."""
    ext = os.path.splitext(ns.file)[1].lower()
    importer = IMPORTERS.get(ext)
    if importer is None:
        raise UsageError(f"cannot import {ns.file}: the extension must be one of "
                         f"{', '.join(sorted(IMPORTERS))}")
    if not os.path.exists(ns.file):
        raise UsageError(f"no such file: {ns.file}")
    text = to_text(importer(ns.file))
    if ns.output:
        with open(ns.output, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)
    return 0


def cmd_fmt(ns: argparse.Namespace) -> int:

    module = _load(ns.file)
    sys.stdout.write(to_text(module))
    return 0


def cmd_dot(ns: argparse.Namespace) -> int:

    module = _load(ns.file)
    graph = module[module.entry_name(ns.entry)]
    source = dump_dot(graph)
    if not ns.output:
        sys.stdout.write(source)
        return 0
    ext = os.path.splitext(ns.output)[1].lower()
    if ext == ".dot":
        with open(ns.output, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(source)
        return 0
    if ext not in (".svg", ".png"):
        raise UsageError(f"-o must end in .dot, .svg or .png, not {ext or 'nothing'}")
    import shutil
    import subprocess

    dot = shutil.which("dot")
    if dot is None:
        raise UsageError("rendering needs Graphviz's dot program (apt-get install graphviz); "
                         "use -o OUT.dot for the source")
    proc = subprocess.run([dot, f"-T{ext[1:]}", "-o", ns.output], input=source.encode("utf-8"),
                          capture_output=True, check=False)
    if proc.returncode != 0:
        raise AnfirError(f"dot failed: {proc.stderr.decode('utf-8', 'replace').strip()}")
    return 0


def _parse_command_line(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv``, letting options stand anywhere among a command's ARGs.

    Plain argparse stops a variable-length positional list at the first
    option (``anfir grad f.anf --entry power 2.0 3`` would fail), so the
    sub-command's own arguments are parsed with ``parse_intermixed_args``.
    """
    ns, extra = parser.parse_known_args(argv)
    if not ns.command or not extra:
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return ns
    command = ns.command
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    rest = argv[argv.index(command) + 1:]
    ns = sub.choices[command].parse_intermixed_args(rest)
    ns.command = command
    return ns


COMMANDS = {"run": cmd_run, "grad": cmd_grad, "compile": cmd_compile, "export": cmd_export,
            "import": cmd_import, "fmt": cmd_fmt, "dot": cmd_dot}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of the ``anfir`` command; returns the exit status."""
    parser = build_parser()
    ns = _parse_command_line(parser, list(sys.argv[1:] if argv is None else argv))
    if not ns.command:
        parser.print_help()
        return 2
    depth = limits.MAX_CALL_DEPTH
    if getattr(ns, "max_depth", None):
        limits.MAX_CALL_DEPTH = ns.max_depth
    try:
        return COMMANDS[ns.command](ns)
    except UsageError as err:
        print(f"anfir {ns.command}: {err}", file=sys.stderr)
        return 2
    except AnfirError as err:
        print(err.render(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (``anfir run ... | head``): stop quietly, as Unix tools do.
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:  # pragma: no cover
            pass
        return 0
    except OSError as exc:
        # A path on the command line that cannot be used (``-o`` into a missing
        # directory, ``--dump-dir`` naming a file): a usage error, not a crash.
        target = f" {exc.filename}" if exc.filename else ""
        print(f"anfir {ns.command}: usage error: cannot use{target}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    except RecursionError:
        if os.environ.get("ANFIR_DEBUG"):
            raise
        print("internal error: Python recursion limit reached (please report this program)",
              file=sys.stderr)
        return 3
    except Exception as exc:  # noqa: BLE001 - the CLI must never show a traceback
        if os.environ.get("ANFIR_DEBUG"):
            raise
        print(f"internal error: {type(exc).__name__}: {exc} (set ANFIR_DEBUG=1 for the "
              "traceback, and please report it)", file=sys.stderr)
        return 3
    finally:
        limits.MAX_CALL_DEPTH = depth


def console() -> None:
    """The console script: exit with :func:`main`'s status."""
    sys.exit(main())

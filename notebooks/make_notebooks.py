"""Write the tutorial notebooks from the cell lists below, executed.

The notebooks are generated so that they stay reviewable (a diff of this file
is a diff of the notebooks' code), and committed *with their outputs* so that
a reader of the repository sees the results and the pictures.  Run

    .venv/bin/python notebooks/make_notebooks.py

after editing a cell: it executes every notebook on a fresh kernel of this
interpreter (Graphviz's ``dot`` must be installed, for the pictures) and
writes it with outputs that do not depend on the machine or the moment: no
absolute paths (the notebooks work from the repository root and print
relative paths; the generator refuses to write one that still shows a path),
no timing metadata, execution counts 1, 2, 3...  Running it twice writes the
same bytes.  ``--clear`` writes the notebooks without outputs (no kernel).
``tests/test_notebooks.py`` checks the committed files and executes them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

Cell = tuple[str, str]
"""``("md", text)``, ``("py", code)``, or ``("py-varies", code)``: a code cell whose
output differs from run to run (timings), executed but committed without its output."""

TIMEOUT = 300
"""Seconds a cell may run."""

# Every notebook starts by working from the repository root (the folder that
# holds the anfir package and examples/), so it runs from any working
# directory (a copy in a temporary folder, in CI) and the paths it prints,
# e.g. in the location comments of dumps, are short and the same everywhere.
SETUP = '''\
import os
from pathlib import Path

import anfir

os.chdir(Path(anfir.__file__).resolve().parent.parent)
EXAMPLES = Path("examples")
print("anfir", anfir.__version__, "- examples in", EXAMPLES)'''

WRITING_IR: list[Cell] = [
    ("md", """\
# Writing IR by hand

anfir's input language is **ANF text**: every definition is a graph (a
`FuncGraph`), every call a node, and `let` just names a node. This notebook
parses the seed examples — the MindIR paper's own lambda, a higher-order
function, Fibonacci, closures — runs them, prints them back in canonical form
and as `.ir` dumps, and draws their graphs.

The language reference is `docs/language.md`."""),
    ("py", SETUP),
    ("md", """\
## The paper's lambda

A file may be one bare expression; it becomes the graph `main`. `%1` is an
ordinary variable name, as in the MindIR paper."""),
    ("py", '''\
paper = anfir.parse("""
lambda (x, y)
    let a = x - 1 in
    let b = a + y in
    let func = lambda (x, y)
        let ret = x / y in
        ret end in
    let %1 = func(a, b) in
    let c = b * %1 in
    c end
""", filename="paper.anf")
print(paper)
print("main(5.0, 2.0) =", anfir.run(paper["main"], 5.0, 2.0))'''),
    ("md", """\
`anfir.to_text` prints canonical ANF: one `let` per intermediate value,
names made unique. It parses back to the same graphs. Nested expressions are
accepted as input and come out let-normalised:"""),
    ("py", '''\
nested = anfir.parse("def f(x, g) = g(x * 2 + 1, -x) ** 2")
print(anfir.to_text(nested))
roundtrip = anfir.parse(anfir.to_text(nested))
assert anfir.to_text(roundtrip) == anfir.to_text(nested)'''),
    ("md", """\
Displaying a graph in Jupyter draws it (Graphviz): one box per graph,
parameters in blue, constants in yellow, each call with one port per
argument."""),
    ("py", 'paper["main"]'),
    ("md", """\
## Higher-order functions and closures

`examples/hof.anf` passes a function to a function; `examples/closure.anf` is
the MindIR example of free variables. A lambda that uses names of an
enclosing graph captures their values."""),
    ("py", '''\
hof = anfir.load(str(EXAMPLES / "hof.anf"))
print((EXAMPLES / "hof.anf").read_text())
print("hof(2.0) =", anfir.run(hof["hof"], 2.0))

closure = anfir.load(str(EXAMPLES / "closure.anf"))
print("ms_closure() =", anfir.run(closure["ms_closure"]))'''),
    ("md", """\
In the `.ir` dump a free variable is printed as `$(@owner:%N)`, and a
nested graph names its parent, so the closure is visible:"""),
    ("py", 'print(anfir.dump_ir(closure["func_outer"]))'),
    ("py", 'closure["func_outer"]'),
    ("md", """\
## Control flow and recursion

`if c then a else b` becomes `switch(c, ✓g, ✗g)()`: two branch graphs, a
`switch` that selects one, and a call that runs it. Loops are recursion."""),
    ("py", '''\
fib = anfir.load(str(EXAMPLES / "fibonacci.anf"))
print([anfir.run(fib["fibonacci"], n) for n in range(11)])
print(anfir.dump_ir(fib))'''),
    ("py", 'fib["fibonacci"]'),
    ("md", """\
`examples/closures.anf` has more: adders, `compose`, counters that return
their next state, closures chosen by `if`."""),
    ("py", '''\
closures = anfir.load(str(EXAMPLES / "closures.anf"))
print((EXAMPLES / "closures.anf").read_text())
print("main() =", anfir.run(closures["main"]))'''),
    ("md", """\
## Your own program

Edit and re-run. A tail-recursive loop runs without growing a stack, so
100,000 iterations are fine."""),
    ("py", '''\
mine = anfir.parse("""
def gcd(a, b) =
  if a == b then a
  else if a > b then gcd(a - b, b)
  else gcd(a, b - a)

def count_down(n) =
  let loop = lambda (i) if i == 0 then "done" else loop(i - 1) end in
  loop(n)
""")
print(anfir.run(mine["gcd"], 1071, 462), anfir.run(mine["count_down"], 100_000))'''),
    ("md", """\
Mistakes are reported with the file, line and column, the line, and a caret —
as `anfir.AnfirError` from Python (and exit status 1 from the command
line):"""),
    ("py", '''\
for text in ["def f(x) = x +", "def f(x) = y * 2", "def f(x) = x(1, 2)\\ndef g() = f(lambda (a) a end)"]:
    try:
        m = anfir.parse(text, filename="oops.anf")
        anfir.run(m["g"])
    except anfir.AnfirError as err:
        print(err.render(), end="\\n\\n")'''),
    ("md", """\
## The same graph from Python

The text is a convenience: graphs can also be built with the IR's own API.
This builds `sq(x) = x * x` node by node."""),
    ("py", '''\
from anfir.ir import FuncGraph
from anfir.primitives import PRIMITIVES

sq = FuncGraph("sq")
x = sq.add_parameter("x")
sq.output = sq.apply(PRIMITIVES["mul"], x, x)
print(anfir.to_text(sq))
print("sq(7) =", anfir.run(sq, 7))
sq'''),
]

DIFFERENTIATING: list[Cell] = [
    ("md", """\
# Differentiating

anfir's automatic differentiation is a **source transformation**: `grad`
turns a graph into a new graph that computes the derivative. It works through
closures, `if`, loops and recursion, and to any order, because the gradient
graph is an ordinary graph that can be differentiated again."""),
    ("py", SETUP + '''

import numpy as np
from anfir.ir.walk import reachable_graphs


def node_count(graph):
    """Nodes of a graph and of every graph it uses."""
    return sum(len(g.nodes()) for g in reachable_graphs([graph]))'''),
    ("md", """\
## `grad`, `value_and_grad`, `vjp`

From Python, each takes a FuncGraph and returns a new FuncGraph with the same
parameters."""),
    ("py", '''\
mod = anfir.parse("""
def f(x, y) = sin(x) * y + x * x
""")
f = mod["f"]
df_dx = anfir.grad(f)                     # d f / d x
df_both = anfir.grad(f, wrt=(0, 1))       # (d f / d x, d f / d y)
vg = anfir.value_and_grad(f)              # (f, d f / d x)
print(anfir.run(df_dx, 0.5, 2.0), 2.0 * np.cos(0.5) + 1.0)
print(anfir.run(df_both, 0.5, 2.0))
print(anfir.run(vg, 0.5, 2.0))'''),
    ("md", """\
`vjp` returns the value and a *backpropagator*: a function (a closure of the
program, which `anfir.run` calls) from the output's cotangent to the
gradients of every input."""),
    ("py", '''\
out, bprop = anfir.run(anfir.vjp(f), 0.5, 2.0)
print(out, bprop)
print(anfir.run(bprop, 1.0), anfir.run(bprop, 10.0))'''),
    ("md", """\
## Higher-order derivatives

`examples/power.anf` computes `x ** n` with a loop and differentiates it
*inside the program*: `dpower(x) = grad(power)(x, 3)`, i.e. `3 x²`. Its own
derivative is `6 x`."""),
    ("py", '''\
power = anfir.load(str(EXAMPLES / "power.anf"))
print((EXAMPLES / "power.anf").read_text())
d2 = anfir.grad(power["dpower"])
d3 = anfir.grad(d2)
for x in (1.0, 2.0, 3.0):
    print(f"x={x}: dpower={anfir.run(power['dpower'], x)}  (6x) {anfir.run(d2, x)}  (6) {anfir.run(d3, x)}")'''),
    ("md", """\
## Through closures and control flow

The gradient reaches values captured by closures, follows the branch `if`
took, and runs back through every iteration of a loop."""),
    ("py", '''\
closures = anfir.load(str(EXAMPLES / "closures.anf"))
loop = anfir.load(str(EXAMPLES / "loop.anf"))
print("d/dw (3w)^2 at w=3:", anfir.run(anfir.grad(closures["scaled_square"]), 3.0))
print("Newton sqrt, 20 iterations, d/da at a=2:", anfir.run(anfir.grad(loop["newton_sqrt"]), 2.0),
      "exact:", 1 / (2 * np.sqrt(2.0)))

piecewise = anfir.parse("""
def f(x) = if x > 0.0 then x * x else sin(x)
""")["f"]
dpiece = anfir.grad(piecewise)
print([anfir.run(dpiece, x) for x in (-1.0, 2.0)], "exact:", [float(np.cos(-1.0)), 4.0])'''),
    ("md", """\
## A check against finite differences

Central differences `(f(x + h) - f(x - h)) / 2h` agree with the gradient
graph to about `h²`."""),
    ("py", '''\
checks = anfir.parse("""
def a(x) = tanh(x) * exp(-x * x) + sqrt(x * x + 1.0)
def b(x) = let loop = lambda (i, acc) if i == 0 then acc else loop(i - 1, sin(acc) + x) end in loop(5, x)
def c(x) = (lambda (g) g(g(x)) end)(lambda (y) y * y + x end)
""")
h = 1e-5
for name in ("a", "b", "c"):
    for x in (-0.7, 0.3, 1.9):
        exact = anfir.run(anfir.grad(checks[name]), x)
        numeric = (anfir.run(checks[name], x + h) - anfir.run(checks[name], x - h)) / (2 * h)
        assert abs(exact - numeric) < 1e-6 * max(1.0, abs(exact)), (name, x, exact, numeric)
    print(f"{name}: grad matches finite differences at -0.7, 0.3, 1.9")'''),
    ("md", """\
## The gradient graph, before and after optimization

`anfir.grad` builds the transformed graph directly: the J transform of every
graph it reaches (returning `(value, backpropagator)` pairs), tuples, gradient
environments for free variables. `anfir.compile` runs the pipeline on it —
specialization for the argument types, inlining, and rewrites to a fixed
point — which removes that machinery from straight-line code. A loop keeps
its recursion in the backward pass (the trip count is only known at run time),
so less of it goes away there."""),
    ("py", '''\
square = anfir.parse("def sq_sum(x, y) = x * x + y")["sq_sum"]
raw = anfir.grad(square)
optimized = anfir.compile(raw, args=[3.0, 1.0])
print("before:", node_count(raw), "nodes   after:", node_count(optimized), "nodes")
print("value:", anfir.run(raw, 3.0, 1.0), anfir.run(optimized, 3.0, 1.0))
print(anfir.dump_ir(optimized))'''),
    ("py", 'optimized'),
    ("md", "The same for the loop of `power`, with `n = 3`:"),
    ("py", '''\
raw_power = anfir.grad(power["power"])
opt_power = anfir.compile(raw_power, args=[2.0, 3])
print("before:", node_count(raw_power), "nodes   after:", node_count(opt_power), "nodes")
print(anfir.run(raw_power, 2.0, 3), anfir.run(opt_power, 2.0, 3))
opt_power'''),
    ("md", """\
## Training a small MLP

`examples/mlp.anf` is a typed tensor program: a one-hidden-layer network and
its squared loss. `value_and_grad` with respect to the two weight matrices
gives everything a gradient-descent step needs; the loop here is in Python."""),
    ("py", '''\
mlp = anfir.load(str(EXAMPLES / "mlp.anf"))
print((EXAMPLES / "mlp.anf").read_text())
step = anfir.value_and_grad(mlp["mlp_loss"], wrt=(0, 1))

rng = np.random.default_rng(0)
x = rng.uniform(-2, 2, size=(64, 1))
y = np.sin(x)                                   # learn sin on [-2, 2]
w1 = rng.normal(scale=1.0, size=(1, 16))
w2 = rng.normal(scale=0.3, size=(16, 1))
losses = []
for epoch in range(300):
    loss, (g1, g2) = anfir.run(step, w1, w2, x, y)
    losses.append(loss)
    w1 = w1 - 0.005 * g1
    w2 = w2 - 0.005 * g2
print(f"loss: {losses[0]:.3f} -> {losses[-1]:.4f}")
assert losses[-1] < 0.2 * losses[0]'''),
    ("py", '''\
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from IPython.display import Image, display
import io

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3))
ax1.plot(losses)
ax1.set_yscale("log")
ax1.set_xlabel("step")
ax1.set_ylabel("loss")
ax1.set_title("training loss")
grid = np.linspace(-2, 2, 100).reshape(-1, 1)
ax2.plot(grid, np.sin(grid), label="sin")
ax2.plot(grid, np.tanh(grid @ w1) @ w2, label="MLP")
ax2.legend()
ax2.set_title("fit")
buffer = io.BytesIO()
fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
plt.close(fig)
display(Image(buffer.getvalue()))'''),
    ("md", """\
The same training loop can live *inside* the program: a tail-recursive loop
that calls `value_and_grad` on the loss at every step."""),
    ("py", '''\
trainer = anfir.parse((EXAMPLES / "mlp.anf").read_text() + """
def train(w1, w2, x, y, steps, rate) =
  let loop = lambda (k, w1, w2, first)
    let vg = value_and_grad(mlp_loss, 0, 1)(w1, w2, x, y) in
    let g = vg[1] in
    if k == 0 then (first, vg[0], w1, w2)
    else loop(k - 1, w1 - rate * g[0], w2 - rate * g[1], first) end in
  loop(steps, w1, w2, mlp_loss(w1, w2, x, y))
""", filename="train.anf")
w1 = rng.normal(scale=1.0, size=(1, 16))
w2 = rng.normal(scale=0.3, size=(16, 1))
first, last, w1, w2 = anfir.run(trainer["train"], w1, w2, x, y, 100, 0.005)
print(f"in-program training, 100 steps: loss {first:.3f} -> {last:.4f}")
assert last < first'''),
]

PIPELINE: list[Cell] = [
    ("md", """\
# Inspecting the pipeline

`anfir.compile` runs every phase — parse, resolve, specialize, ad, inline,
optimize, validate — and, given a `dump_dir`, writes what each phase made of
the program: `NN_phase.ir` (readable text that loads back) and `NN_phase.dot`
(a Graphviz picture), numbered in the order the phases ran.
`docs/reading-dumps.md` explains the format."""),
    ("py", SETUP + '''

import difflib
import shutil
import subprocess
import tempfile

from IPython.display import SVG, display
from anfir.passes.pipeline import compile_program

dumps = Path(tempfile.mkdtemp(prefix="anfir-dumps-"))'''),
    ("md", """\
## Compile with dumps

`dpower(x) = grad(power)(x, 3)`: the `ad` phase expands `grad` into the
forward and backward graphs of the loop, and `inline` and `optimize` take
away most of the tuples and environments that this creates."""),
    ("py", '''\
result = compile_program(str(EXAMPLES / "power.anf"), entry="dpower", args=[3.0], dump_dir=dumps)
print("result:", anfir.run(result.graph, 3.0))
for name in sorted(p.name for p in dumps.iterdir()):
    print(f"{name:24} {(dumps / name).stat().st_size:8} bytes")'''),
    ("md", "Which rewrite rules fired how often:"),
    ("py", '''\
for rule, count in result.rule_counts.items():
    print(f"{rule:32} {count}")'''),
    ("md", """\
And where the time went (it differs from run to run and machine to machine,
so this cell's output is not saved in the notebook: run it to see yours):"""),
    ("py-varies", '''\
for phase, seconds in result.timings.items():
    print(f"{phase:12} {seconds * 1000:8.2f} ms")'''),
    ("md", "The head of a dump: the entry, its typed parameters, the sizes."),
    ("py", '''\
ir_files = sorted(dumps.glob("*.ir"))
print("\\n".join((dumps / "02_specialize.ir").read_text().split("\\n")[:30]))'''),
    ("md", """\
## What changed between two phases

A unified diff of two consecutive dumps shows exactly what a phase did. Here,
the optimizer's work on the expanded gradient:"""),
    ("py", '''\
def phase_diff(before: Path, after: Path, context: int = 1) -> str:
    """The unified diff of two dumps, without the source-location comment lines."""
    def lines(path):
        return [line for line in path.read_text().split("\\n")
                if not (line.startswith(" ") and line.lstrip().startswith("# "))]
    return "\\n".join(difflib.unified_diff(lines(before), lines(after), before.name, after.name,
                                           n=context, lineterm=""))

names = [p.name for p in ir_files]
before = dumps / next(n for n in names if n.endswith("_inline.ir"))
after = dumps / next(n for n in names if n.endswith("_optimize.ir"))
diff = phase_diff(before, after)
print("\\n".join(diff.split("\\n")[:80]))'''),
    ("md", """\
## Pictures

Each `.dot` file renders with Graphviz's `dot -Tsvg` (the `graphviz` Python
package works too). Where `dot` is not installed, `render` shows the same
phase's `.ir` dump loaded back, which Jupyter displays as ANF text. The
optimized gradient of `power`:"""),
    ("py", '''\
def render(dot_path: Path):
    """The SVG picture of a .dot file, drawn by Graphviz's dot program.

    Without dot: the program of the .ir dump next to it, shown as text.
    """
    dot = shutil.which("dot")
    if dot is None:
        print("Graphviz's dot is not installed (apt-get install graphviz): the text form instead")
        return anfir.load(str(dot_path.with_suffix(".ir")))
    svg = subprocess.run([dot, "-Tsvg", str(dot_path)], capture_output=True, check=True).stdout
    return SVG(svg)

render(dumps / after.name.replace(".ir", ".dot"))'''),
    ("md", "And the program as it was parsed, before anything ran:"),
    ("py", 'render(dumps / "00_parse.dot")'),
    ("md", """\
## Load a dump back and run it again

Every dump is loadable: `anfir.load("…/05_optimize.ir")` returns graphs
isomorphic to the dumped ones, so a phase can be re-run from any dump and
the result checked."""),
    ("py", '''\
reloaded = anfir.load(str(after))
print("definitions:", ", ".join(reloaded.graphs), "  entry:", repr(reloaded.entry))
entry = reloaded.entry
print("re-run from", after.name, "->", anfir.run(entry, 3.0), "  (27.0 expected)")
assert anfir.run(entry, 3.0) == 27.0

# Re-dumping the loaded graphs gives the file's text again (less its "# Phase:" line).
original = [line for line in after.read_text().split("\\n") if not line.startswith("# Phase:")]
print("dump -> load -> dump gives the same text:",
      anfir.dump_ir(reloaded).split("\\n") == original)
assert anfir.dump_ir(reloaded).split("\\n") == original'''),
    ("md", """\
Compiling from a dump runs the pipeline again from those graphs, e.g. from the
specialized program:"""),
    ("py", '''\
again = anfir.compile(anfir.load(str(dumps / "02_specialize.ir")), args=[3.0])
print(anfir.run(again, 3.0))
again'''),
    ("md", """\
## A typed tensor program

With no example arguments, the annotations of `mlp_loss` (`f64[B, D]`...)
drive the specializer, and the dumps show symbolic shapes."""),
    ("py", '''\
mlp_dumps = Path(tempfile.mkdtemp(prefix="anfir-mlp-"))
mlp = compile_program(str(EXAMPLES / "mlp.anf"), dump_dir=mlp_dumps)
print((mlp_dumps / sorted(p.name for p in mlp_dumps.glob("*_specialize.ir"))[0]).read_text())'''),
    ("py", '''\
shutil.rmtree(dumps)
shutil.rmtree(mlp_dumps)'''),
]

IMPORTING_ONNX: list[Cell] = [
    ("md", """\
# Importing an ONNX model

`anfir.import_onnx` reads an ONNX model into FuncGraphs: here a small MLP and
its loss, built with `onnx.helper` (a model exported from PyTorch reads the
same way). With `params_as_inputs=True` the initializers (the weights) become
the entry's first parameters, their values in `mod.params`, so the model can
be differentiated with respect to them. What the model says about itself —
producer, opset imports, doc strings, `metadata_props`, each node's name —
is kept too, and printed with it. This notebook needs the onnx package
(`pip install "anfir[onnx]"`)."""),
    ("py", SETUP),
    ("py", '''\
import tempfile

import numpy as np
from onnx import TensorProto, helper, numpy_helper

rng = np.random.default_rng(0)
weights = {"w1": rng.normal(size=(3, 8)).astype(np.float32),
           "w2": rng.normal(size=(8, 2)).astype(np.float32)}
graph = helper.make_graph(
    [helper.make_node("Gemm", ["x", "w1"], ["h"], name="fc1", doc_string="the hidden layer"),
     helper.make_node("Relu", ["h"], ["a"], name="act"),
     helper.make_node("MatMul", ["a", "w2"], ["y"], name="fc2"),
     helper.make_node("Sub", ["y", "t"], ["d"], name="diff"),
     helper.make_node("Mul", ["d", "d"], ["sq"], name="square"),
     helper.make_node("ReduceMean", ["sq"], ["loss"], name="mse", keepdims=0,
                      doc_string="the mean squared error")],
    "mlp",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3]),
     helper.make_tensor_value_info("t", TensorProto.FLOAT, ["N", 2])],
    [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
    [numpy_helper.from_array(v, k) for k, v in weights.items()],
    doc_string="A two-layer MLP and its loss.")
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)],
                          producer_name="notebook", model_version=1)
helper.set_model_props(model, {"license": "MIT"})'''),
    ("md", """\
## The model as ANF text

Each ONNX value is a `let`; the ONNX `dim_param` `N` is a dimension variable
shared by `x` and `t`. The model's metadata is the header (`#@ key value`
lines, JSON values); the graph's doc string is the `##` comment above the
`def`; each node's ONNX name, op type and doc string sit above the `let` of
the node it became (an op that becomes several operations keeps them on the
one that computes its output). The text parses back to the same text,
metadata included (`anfir.parse`; see the language reference, "Doc comments
and attributes")."""),
    ("py", '''\
mod = anfir.import_onnx(model, params_as_inputs=True)
text = anfir.to_text(mod)
print(text)
print("params:", {k: v.shape for k, v in mod.params.items()})
print("metadata:", {k: mod.metadata[k] for k in ("producer_name", "opset_import", "metadata_props")})
again = anfir.parse(text)
assert anfir.to_text(again) == text and again.metadata == mod.metadata'''),
    ("md", "The imported graph, drawn (Jupyter shows a FuncGraph as a picture):"),
    ("py", "mod.entry"),
    ("md", """\
## Differentiate it, and look at the dumps

`anfir.grad` of the loss with respect to the two weights, compiled with
per-phase dumps."""),
    ("py", '''\
dumps = Path(tempfile.mkdtemp(prefix="anfir-onnx-"))
dloss = anfir.compile(anfir.grad(mod.entry, wrt=(0, 1)), dump_dir=str(dumps))
print(", ".join(sorted(p.name for p in dumps.glob("*.ir"))))
print(anfir.to_text(dloss))'''),
    ("md", """\
The gradient is a new graph, made of new nodes. The dumps of the model itself
keep its metadata: the module's is the header (`# Meta key: value`), the
graph's doc string its `attr doc` line, and each node's ONNX name, op type and
doc string end its line as `meta: {...}` — in the specialized dump too, where
every node is a typed copy."""),
    ("py", '''\
model_dumps = Path(tempfile.mkdtemp(prefix="anfir-onnx-model-"))
anfir.compile(mod, dump_dir=str(model_dumps))
print("\\n".join((model_dumps / "00_parse.ir").read_text().splitlines()[:9]))
specialized = (model_dumps / "02_specialize.ir").read_text()
print("\\n".join(line for line in specialized.splitlines() if "doc" in line or "meta" in line))'''),
    ("py", '''\
x = rng.normal(size=(4, 3)).astype(np.float32)
t = rng.normal(size=(4, 2)).astype(np.float32)
g1, g2 = anfir.run(dloss, *mod.params.values(), x, t)

# The same gradient by hand: d mean((relu(x @ w1) @ w2 - t)^2).
h = x @ weights["w1"]
a = np.maximum(h, 0)
dy = 2 * (a @ weights["w2"] - t) / t.size
want2 = a.T @ dy
want1 = x.T @ ((dy @ weights["w2"].T) * (h > 0))
print("dw1 matches:", np.allclose(g1, want1, rtol=1e-4), " dw2 matches:", np.allclose(g2, want2, rtol=1e-4))
assert np.allclose(g1, want1, rtol=1e-4) and np.allclose(g2, want2, rtol=1e-4)'''),
    ("md", "The optimized gradient graph:"),
    ("py", "dloss"),
    ("py", '''\
import shutil

shutil.rmtree(dumps)
shutil.rmtree(model_dumps)'''),
]

IMPORTING_TORCH: list[Cell] = [
    ("md", """\
# Importing a PyTorch model

`anfir.import_torch` takes what `torch.export` produces — an `ExportedProgram`:
core-ATen calls, a signature that lifts the weights into inputs, symbolic
shapes, the Python line of every call — and makes it an anfir Module. Here a
small CNN (two conv–batch-norm–relu–max-pool stages and a linear layer) with
its loss is exported, imported, read as ANF text, compiled with dumps that
point at its Python lines, differentiated with respect to every parameter
(checked against `torch.autograd`) and trained for a few steps with anfir's
gradient. This notebook needs PyTorch (`pip install "anfir[torch]"`);
`docs/torch.md` is the reference."""),
    ("py", SETUP),
    ("md", """\
The model lives in a file of its own, `notebooks/06_small_cnn.py`, so the
locations torch records name that file and its lines (a class defined in a
notebook cell would be named after the kernel's temporary file). It is
exported with its loss, `CrossEntropy(model)`: the cross-entropy of the
logits against one-hot labels, so every node of the imported program — the
loss's too — carries its Python line. The CNN is in eval mode (batch norm
uses its running statistics) and the batch dimension is dynamic."""),
    ("py", '''\
import runpy
import tempfile
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore", category=FutureWarning)  # torch 2.13's own pytree notice
# run_path keeps the path as given (relative to the repository root), so torch's
# stack traces, and the locations anfir takes from them, are short and the same everywhere.
small_cnn = runpy.run_path("notebooks/06_small_cnn.py")
source = Path("notebooks/06_small_cnn.py").read_text().splitlines()
start = next(i for i, line in enumerate(source) if line.startswith("class SmallCNN"))
print("\\n".join(f"{i + 1:3}  {line}" for i, line in enumerate(source) if i >= start))

torch.manual_seed(0)
model = small_cnn["SmallCNN"]().eval()
loss_model = small_cnn["CrossEntropy"](model)
rng = np.random.default_rng(0)
x = rng.standard_normal((16, 1, 8, 8)).astype(np.float32)
labels = rng.integers(0, 3, 16)
onehot = np.eye(3, dtype=np.float32)[labels]
batch = torch.export.Dim("batch", min=1, max=64)
ep = torch.export.export(loss_model, (torch.from_numpy(x), torch.from_numpy(onehot)),
                         dynamic_shapes=({0: batch}, {0: batch}))'''),
    ("md", """\
## The model as ANF text

The entry `forward` takes the lifted parameters (`p_…`) and buffers (`b_…`)
first, then the inputs `x` and `onehot`, whose batch is the dimension
variable torch named; its range, the `Dim`'s bounds, is the entry's
`#@ ranges` attribute, and a call with a batch outside it is refused (a
shape error naming the input, the variable and the range), as torch's own
guard would. `mod.params` holds the weights as numpy arrays. Each
ATen call became anfir primitives: `aten.convolution` is `conv`, batch norm
in eval `batch_norm`, `max_pool2d_with_indices` `max_pool`, `addmm` a matmul
and an add, `_log_softmax` a shift by the maximum and a `logsumexp`."""),
    ("py", '''\
mod = anfir.import_torch(ep)
print(anfir.to_text(mod))
print({kind: sum(1 for k in mod.metadata["inputs"] if k.startswith(kind))
       for kind in ("parameter", "buffer", "user_input")})
print("ranges:", mod.entry.flags["meta"]["ranges"])'''),
    ("md", "The imported graph, drawn:"),
    ("py", "mod.entry"),
    ("md", """\
The imported program against eager PyTorch, at a batch size other than the
exported one:"""),
    ("py", '''\
x7 = rng.standard_normal((7, 1, 8, 8)).astype(np.float32)
onehot7 = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 7)]
ours = anfir.run(mod.entry, *mod.params.values(), x7, onehot7)
theirs = loss_model(torch.from_numpy(x7), torch.from_numpy(onehot7)).item()
print(f"anfir {float(ours):.6f}   torch {theirs:.6f}")
assert np.isclose(ours, theirs, rtol=1e-4)'''),
    ("md", """\
## The gradient, and the dumps

`anfir.grad` differentiates the loss with respect to the ten parameters (not
the buffers), and `anfir.compile` writes a numbered dump after every phase."""),
    ("py", '''\
n_params = sum(1 for kind in mod.metadata["inputs"] if kind.startswith("parameter"))
args = [*mod.params.values(), x, onehot]
dumps = Path(tempfile.mkdtemp(prefix="anfir-torch-"))
dloss = anfir.compile(anfir.grad(mod.entry, wrt=tuple(range(n_params))), args=args,
                      dump_dir=str(dumps))
files = sorted(p.name for p in dumps.glob("*.ir"))
print(", ".join(files))'''),
    ("md", """\
The first dump, around the convolutions and the loss: below each node, the
file and line it came from, and the line's text."""),
    ("py", '''\
lines = (dumps / files[0]).read_text().splitlines()
for i, line in enumerate(lines):
    if "= conv(" in line or "= logsumexp(" in line:
        print("\\n".join(lines[i:i + 2]))
        assert "notebooks/06_small_cnn.py:" in lines[i + 1]
for name in files:  # every phase's dump names the model's lines
    assert "notebooks/06_small_cnn.py:23" in (dumps / name).read_text(), name'''),
    ("md", "Every dump loads back and computes the same gradient:"),
    ("py", '''\
grads = anfir.run(dloss, *args)
for name in files:
    again = anfir.run(anfir.load(str(dumps / name)).ir_entry, *args)
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(again, grads)), name
print(len(files), "dumps reloaded and run")'''),
    ("md", "The gradient against `torch.autograd.grad` of the same loss:"),
    ("py", '''\
want = torch.autograd.grad(loss_model(torch.from_numpy(x), torch.from_numpy(onehot)),
                           list(model.parameters()))
for (name, p), ours, theirs in zip(model.named_parameters(), grads, want):
    error = float(np.abs(ours - theirs.numpy()).max() / theirs.abs().max())
    print(f"{name:12} {str(tuple(p.shape)):14} relative difference {error:.1e}")
    assert np.allclose(ours, theirs.numpy(), rtol=1e-4, atol=1e-6)'''),
    ("md", """\
## Training with anfir's gradient

Plain gradient descent on the imported parameters with
`anfir.value_and_grad` (the loss and its gradient in one compiled program);
PyTorch's own SGD on the model, from the same start, follows the same losses."""),
    ("py", '''\
step_fn = anfir.compile(anfir.value_and_grad(mod.entry, wrt=tuple(range(n_params))), args=args)
params = [p.copy() for p in mod.params.values()]
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
losses = []
for step in range(10):
    value, grads = anfir.run(step_fn, *params, x, onehot)
    params[:n_params] = [p - 0.2 * g for p, g in zip(params[:n_params], grads)]
    optimizer.zero_grad()
    reference = loss_model(torch.from_numpy(x), torch.from_numpy(onehot))
    reference.backward()
    optimizer.step()
    losses.append(float(value))
    print(f"step {step}: anfir {float(value):.5f}   torch {reference.item():.5f}")
    assert abs(float(value) - reference.item()) < 1e-4
assert all(a > b for a, b in zip(losses, losses[1:])), "the loss decreases at every step"'''),
    ("py", '''\
import shutil

shutil.rmtree(dumps)'''),
]

MODELS_IN_ANF: list[Cell] = [
    ("md", """\
# A ResNet written in ANF

`examples/resnet18.anf` is torchvision's ResNet-18 (eval mode) in about thirty
lines of ANF: a 7x7 stem with batch norm, relu and max pool, four stages of
two BasicBlocks, a global average pool and a linear layer, plus the
cross-entropy loss and its gradient with respect to every parameter. This
notebook runs it, checks it against a plain numpy ResNet, differentiates it,
and looks at the compiled gradient. (`examples/transformer.anf`, a
transformer encoder block, is built the same way.)"""),
    ("py", SETUP),
    ("py", 'print((EXAMPLES / "resnet18.anf").read_text())'),
    ("md", """\
## Parameters

The parameters are one nested tuple, as torchvision's state dict nests them:
`(stem, layer1, layer2, layer3, layer4, fc)`, each batch norm a 4-tuple
`(weight, bias, running_mean, running_var)`. The widths come from the weights,
so narrow ones (8, 16, 32, 64 instead of 64 ... 512) make a quick demo."""),
    ("py", '''\
import numpy as np

rng = np.random.default_rng(0)


def conv_w(out, inp, k):
    return rng.normal(size=(out, inp, k, k)) * np.sqrt(2.0 / (inp * k * k))


def bn(c):
    return (rng.uniform(0.5, 1.5, c), rng.normal(size=c) * 0.1,
            rng.normal(size=c) * 0.1, rng.uniform(0.5, 1.5, c))


def resnet18_params(widths, classes):
    stages, inp = [], widths[0]
    for i, width in enumerate(widths):
        first = (conv_w(width, inp, 3), bn(width), conv_w(width, width, 3), bn(width))
        if i > 0:  # stages 2-4 halve the size: a 1x1 projection on the shortcut
            first += (conv_w(width, inp, 1), bn(width))
        second = (conv_w(width, width, 3), bn(width), conv_w(width, width, 3), bn(width))
        stages.append((first, second))
        inp = width
    fc = (rng.normal(size=(classes, inp)) / np.sqrt(inp), rng.normal(size=classes) * 0.1)
    return ((conv_w(widths[0], 3, 7), bn(widths[0])), *stages, fc)


params = resnet18_params((8, 16, 32, 64), classes=10)
x = rng.normal(size=(2, 3, 32, 32))
labels = np.array([3, 7])
leaves = []
stack = [params]
while stack:
    item = stack.pop()
    if isinstance(item, tuple):
        stack.extend(item)
    else:
        leaves.append(item)
print(len(leaves), "parameter arrays,", sum(a.size for a in leaves), "numbers")'''),
    ("md", """\
## Run it, and check it against numpy

`anfir.run` evaluates the parsed definitions directly. The reference below is
the same network in plain numpy: convolution as an `einsum` over
`sliding_window_view` windows, written independently of anfir's kernels."""),
    ("py", '''\
module = anfir.load(str(EXAMPLES / "resnet18.anf"))
logits = anfir.run(module["resnet18"], x, params)
print("logits", logits.shape, logits.dtype)
print(np.round(logits, 4))'''),
    ("md", """\
The parsed definition, drawn (Jupyter shows a FuncGraph as a picture): the
body of `resnet18` and its three lambdas, `bn`, `block` and `down`, each a
graph of its own; a call of one (`@bn`, `@block`) points to it with a dotted
edge."""),
    ("py", 'module["resnet18"]'),
    ("py", '''\
from numpy.lib.stride_tricks import sliding_window_view


def np_conv(v, w, stride=1, padding=0):
    v = np.pad(v, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    windows = sliding_window_view(v, w.shape[2:], axis=(2, 3))[:, :, ::stride, ::stride]
    return np.einsum("ncijkl,ockl->noij", windows, w)


def np_bn(v, s):
    scale, bias, mean, var = (a.reshape(1, -1, 1, 1) for a in s)
    return (v - mean) / np.sqrt(var + 1e-5) * scale + bias


def np_block(v, b):
    stride = 1 if len(b) == 4 else 2
    h = np.maximum(np_bn(np_conv(v, b[0], stride, 1), b[1]), 0)
    shortcut = v if len(b) == 4 else np_bn(np_conv(v, b[4], 2), b[5])
    return np.maximum(np_bn(np_conv(h, b[2], 1, 1), b[3]) + shortcut, 0)


def np_resnet18(v, p):
    h = np.maximum(np_bn(np_conv(v, p[0][0], 2, 3), p[0][1]), 0)
    h = np.pad(h, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf)
    h = sliding_window_view(h, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(4, 5))
    for stage in p[1:5]:
        h = np_block(np_block(h, stage[0]), stage[1])
    return h.mean(axis=(2, 3)) @ p[5][0].T + p[5][1]


want = np_resnet18(x, params)
print("largest difference from numpy:", np.abs(logits - want).max())
assert np.allclose(logits, want, rtol=1e-10, atol=1e-12)'''),
    ("md", """\
## Differentiate it

`resnet18_grad` is `grad(resnet18_loss, 1)`: the gradient of the loss with
respect to the whole parameter tuple, nested the same way. A directional
derivative checks all of it at once: moving every parameter along a random
direction `d` changes the loss by `<gradient, d>` per unit step."""),
    ("py", '''\
grads = anfir.run(module["resnet18_grad"], x, params, labels)
print("stem conv gradient:", grads[0][0].shape, "  fc gradient:", grads[5][0].shape)


def tmap(fn, *trees):
    if isinstance(trees[0], tuple):
        return tuple(tmap(fn, *items) for items in zip(*trees))
    return fn(*trees)


direction = tmap(lambda a: rng.normal(size=a.shape), params)
loss = module["resnet18_loss"]
eps = 1e-6
plus = anfir.run(loss, x, tmap(lambda p, d: p + eps * d, params, direction), labels)
minus = anfir.run(loss, x, tmap(lambda p, d: p - eps * d, params, direction), labels)
numeric = (plus - minus) / (2 * eps)
flat = []
tmap(lambda g, d: flat.append(np.sum(g * d)), grads, direction)
analytic = sum(flat)
print(f"<gradient, d> = {analytic:.6f}   finite difference = {numeric:.6f}")
assert abs(analytic - numeric) < 1e-5 * max(1.0, abs(numeric))'''),
    ("md", """\
## Compile it

`anfir.compile` specializes the gradient for these argument types, expands
`grad`, inlines and optimizes; the compiled graph computes the same thing.
Its dump (`anfir.dump_ir`: the text `anfir.compile(..., dump_dir=...)` writes
after each phase, see `03_inspecting_the_pipeline`) is readable: here the
lines of the optimized gradient that call the convolution's gradient kernels,
with their attributes."""),
    ("py", '''\
compiled = anfir.compile(module, entry="resnet18_grad", args=[x, params, labels])
again = anfir.run(compiled, x, params, labels)
flat_again, flat_run = [], []
tmap(flat_again.append, again)
tmap(flat_run.append, grads)
print("compiled == run:", all(np.allclose(a, b, rtol=1e-10, atol=1e-12)
                              for a, b in zip(flat_again, flat_run)))
dump = anfir.dump_ir(compiled).split("\\n")
calls = [line for line in dump if "conv_weight_grad(" in line or "conv_input_grad(" in line]
print(len(dump), "lines in the dump;", len(calls), "calls of the convolution's gradients, e.g.:")
for line in calls[:6]:
    print(line if len(line) <= 110 else line[:107] + "...")'''),
    ("md", """\
## At full size

The widths come from the weights: with torchvision's (64, 128, 256, 512) and
a 224x224 image the same definitions run ResNet-18 itself, 1.8 billion
multiply-adds a forward, each convolution an im2col and one matmul.
`python benchmarks/bench_convnet.py` times that forward and a training step
against PyTorch (the figures are in `benchmarks/README.md`)."""),
]

IMPORTING_GPT2: list[Cell] = [
    ("md", """\
# A Hugging Face GPT-2, imported, differentiated, trained and exported

A language model nobody on this project wrote: `transformers`' GPT-2 with a
tiny random configuration (one layer, width 16, a vocabulary of 50: nothing is
downloaded). Its loss is exported with `torch.export` — dynamic batch and
sequence length — and imported with `anfir.import_torch`; then the dumps of
its gradient are read, the gradient is checked against `torch.autograd`, a few
training steps are taken with anfir's gradient beside PyTorch's own, and the
loss and its gradient are exported to ONNX (run by onnxruntime) and lowered to
JAX (run under `jax.jit`). This notebook needs PyTorch and transformers
(`pip install "anfir[torch]" transformers`), onnxruntime and JAX;
`docs/torch.md` is the reference."""),
    ("py", SETUP),
    ("md", """\
The model and its loss: the next-token cross-entropy of the logits. GPT-2
ties its output layer to its token embedding (`lm_head.weight` *is*
`wte.weight`), and is called with an explicit attention mask, as a
tokenizer's batch has."""),
    ("py", '''\
import warnings

warnings.filterwarnings("ignore")  # torch.export's, transformers' and tqdm's notices

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
config = GPT2Config(vocab_size=50, n_positions=64, n_embd=16, n_layer=1, n_head=2,
                    bos_token_id=0, eos_token_id=0)
gpt2 = GPT2LMHeadModel(config).eval()


class NextTokenLoss(torch.nn.Module):
    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, tokens, targets):
        mask = torch.ones_like(tokens)
        logits = self.lm(tokens, attention_mask=mask, use_cache=False).logits
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


loss_model = NextTokenLoss(gpt2)
rng = np.random.default_rng(0)
tokens = rng.integers(0, 50, (2, 8))
targets = np.roll(tokens, -1, axis=1)
batch = torch.export.Dim("batch", min=1, max=16)
seq = torch.export.Dim("seq", min=3, max=64)
ep = torch.export.export(loss_model, (torch.from_numpy(tokens), torch.from_numpy(targets)),
                         dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
print("tied:", gpt2.lm_head.weight is gpt2.transformer.wte.weight)'''),
    ("md", """\
## The imported module

One parameter per tensor, as in the source model: torch.export lifts the
tied output weight as an input of its own, and the importer folds it back
into the embedding it aliases (`#@ aliases`), so its gradient is the sum of
both uses and a training step keeps the two tied. The batch and sequence
dimensions are the dimension variables torch named, with their ranges."""),
    ("py", '''\
mod = anfir.import_torch(ep)
text = anfir.to_text(mod).splitlines()
start = next(i for i, line in enumerate(text) if line.startswith("def forward"))
print("\\n".join(line[:150] for line in text[:start + 16]))
print("...", len(text), "lines")
print("aliases:", mod.metadata["aliases"])
n_params = sum(1 for kind in mod.metadata["inputs"] if kind.startswith("parameter"))
print(n_params, "parameters;", sum(1 for _ in gpt2.parameters()), "in torch")'''),
    ("md", """\
At another batch size and sequence length than the exported ones, against
eager PyTorch:"""),
    ("py", '''\
tokens3 = rng.integers(0, 50, (3, 5))
targets3 = np.roll(tokens3, -1, axis=1)
ours = anfir.run(mod.entry, *mod.params.values(), tokens3, targets3)
theirs = loss_model(torch.from_numpy(tokens3), torch.from_numpy(targets3)).item()
print(f"anfir {float(ours):.6f}   torch {theirs:.6f}")
assert np.isclose(ours, theirs, rtol=1e-5)'''),
    ("md", """\
The forward program once compiled — inlined, specialized to these shapes,
optimized — drawn. The attention is one `attention` primitive and each layer
norm one `layer_norm` (anfir's own, whose gradients are written once)."""),
    ("py", '''\
args = [*mod.params.values(), tokens, targets]
forward = anfir.compile(mod.entry, args=args)
forward'''),
    ("md", """\
## The gradient, and its dumps

`anfir.grad` with respect to all sixteen parameters, compiled with a numbered
dump after every phase. The optimized dump keeps the model's structure: its
`layer_norm` and `attention` calls, typed with the shapes of this batch."""),
    ("py", '''\
import tempfile

dumps = Path(tempfile.mkdtemp(prefix="anfir-gpt2-"))
dloss = anfir.compile(anfir.grad(mod.entry, wrt=tuple(range(n_params))), args=args,
                      dump_dir=str(dumps))
files = sorted(p.name for p in dumps.glob("*.ir"))
print(", ".join(files))
lines = (dumps / "05_optimize.ir").read_text().splitlines()
for i, line in enumerate(lines):
    if "= attention(" in line or "= layer_norm(" in line:
        print(line.strip()[:140])
        print("   ", lines[i + 1].strip())'''),
    ("md", "Every dump loads back and computes the same gradient:"),
    ("py", '''\
grads = anfir.run(dloss, *args)
for name in files:
    again = anfir.run(anfir.load(str(dumps / name)).ir_entry, *args)
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(again, grads)), name
print(len(files), "dumps reloaded and run")'''),
    ("md", "Against `torch.autograd.grad` of the same loss, parameter by parameter:"),
    ("py", '''\
want = torch.autograd.grad(loss_model(torch.from_numpy(tokens), torch.from_numpy(targets)),
                           list(gpt2.parameters()))
for (name, p), ours, theirs in zip(gpt2.named_parameters(), grads, want):
    error = float(np.abs(ours - theirs.numpy()).max() / theirs.abs().max())
    print(f"{name:34} {str(tuple(p.shape)):9} relative difference {error:.0e}")
    assert np.allclose(ours, theirs.numpy(), rtol=1e-4, atol=1e-6 * float(theirs.abs().max()))'''),
    ("md", """\
## Training

Gradient descent on the imported parameters with `anfir.value_and_grad`,
beside PyTorch's SGD on the model from the same start: the same losses, step
by step (the tied embedding stays one tensor in both)."""),
    ("py", '''\
step_fn = anfir.compile(anfir.value_and_grad(mod.entry, wrt=tuple(range(n_params))), args=args)
params = [p.copy() for p in mod.params.values()]
optimizer = torch.optim.SGD(gpt2.parameters(), lr=0.5)
losses = []
for step in range(6):
    value, step_grads = anfir.run(step_fn, *params, tokens, targets)
    params = [p - 0.5 * g for p, g in zip(params, step_grads)]
    optimizer.zero_grad()
    reference = loss_model(torch.from_numpy(tokens), torch.from_numpy(targets))
    reference.backward()
    optimizer.step()
    losses.append(float(value))
    print(f"step {step}: anfir {float(value):.5f}   torch {reference.item():.5f}")
    assert abs(float(value) - reference.item()) < 1e-4
assert losses[-1] < losses[0]'''),
    ("md", """\
## Out to ONNX and JAX

The compiled gradient program written as ONNX (opset 21) and run by
onnxruntime, and lowered to JAX and run under `jax.jit`: both give anfir's
gradient."""),
    ("py", '''\
import jax
import onnxruntime

from anfir.interop.onnx.exporter import onnx_inputs

onnx_model = anfir.export_onnx(dloss)
print(len(onnx_model.graph.node), "ONNX nodes, opset", onnx_model.opset_import[0].version)
session = onnxruntime.InferenceSession(onnx_model.SerializeToString())
on_ort = session.run(None, onnx_inputs(onnx_model, *args))
print("onnxruntime vs anfir:", max(float(np.abs(a - b).max()) for a, b in zip(on_ort, grads)))
assert all(np.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(on_ort, grads))

on_jax = jax.jit(anfir.to_jax(dloss))(*args)
print("jax.jit vs anfir:", max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(on_jax, grads)))
assert all(np.allclose(np.asarray(a), b, rtol=1e-4, atol=1e-6) for a, b in zip(on_jax, grads))'''),
    ("py", '''\
import shutil

shutil.rmtree(dumps)'''),
]

BATCHING: list[Cell] = [
    ("md", """\
# Batching: per-example gradients, Jacobians and Hessians

`vmap` is anfir's third transformation, beside `grad` and `jvp`: it makes a
function written for one example run on a batch, as JAX's `vmap` does — over
the whole language (closures, `if`, loops, recursion) and composed with the
derivatives in any order. From it come per-example gradients, `jacfwd`,
`jacrev` and `hessian`. Everything here is checked against JAX in float64.
`docs/language.md` ("Batching") is the reference."""),
    ("py", SETUP),
    ("md", """\
## vmap in the language

`vmap(f, in_axes)` batches `f` along the axes given per argument (`None`: not
batched, shared by every example). Here `y` is shared:"""),
    ("py", '''\
import numpy as np

mod = anfir.parse("""
def f(x, y) = sin(x) * y + sum(x)
def main(xs, y) = vmap(f, (0, None))(xs, y)
""")
xs = np.arange(6.0).reshape(3, 2)
y = np.array([10.0, 20.0])
batched = anfir.run(mod["main"], xs, y)
print(batched)
assert np.allclose(batched, [anfir.run(mod["f"], row, y) for row in xs])'''),
    ("md", """\
Compiled, the batched function is an ordinary graph (the compiler expands
`vmap` at the start of `specialize`): `sum` became a sum over the example
axis only, and the shared `y` is broadcast against the batch."""),
    ("py", '''\
compiled = anfir.compile(mod, entry="main", args=[xs, y])
compiled'''),
    ("md", """\
An `if` on a batched condition runs both branches and selects per example
(JAX's `select`); a loop whose trip count depends on the example runs until
every example is done, the finished ones keeping their state:"""),
    ("py", '''\
loops = anfir.parse("""
def absv(x) = if x > 0.0 then x else 0.0 - x
def power(x, n) =
  let loop = lambda (i, acc)
    if i < n then loop(i + 1, acc * x) else acc end in
  loop(0, 1.0)
""")
print(anfir.run(anfir.vmap(loops["absv"]), np.array([-2.0, 3.0, -0.5])))
print(anfir.run(anfir.vmap(loops["power"]), np.array([2.0, 3.0, 0.5]), np.array([3, 2, 4])))'''),
    ("md", """\
## Per-example gradients

The gradient of `examples/mlp.anf`'s loss with respect to both weights, for
each of 64 examples separately — what differential privacy and influence
functions need: `vmap(grad(loss))`, the weights shared, the examples batched.
JAX's `vmap(grad(...))` gives the same numbers."""),
    ("py", '''\
import jax
import jax.numpy as jnp

jax.config.update("jax_enable_x64", True)
loss = anfir.load(str(EXAMPLES / "mlp.anf"))["mlp_loss"]
rng = np.random.default_rng(0)
w1, w2 = 0.3 * rng.standard_normal((8, 16)), 0.3 * rng.standard_normal((16, 4))
x, y = rng.standard_normal((64, 1, 8)), rng.standard_normal((64, 1, 4))
per_example = anfir.vmap(anfir.grad(loss, wrt=(0, 1)), in_axes=(None, None, 0, 0))
g1, g2 = anfir.run(per_example, w1, w2, x, y)
print("per-example gradients:", g1.shape, g2.shape)


def jax_loss(w1, w2, x, y):
    return jnp.sum((jnp.tanh(x @ w1) @ w2 - y) ** 2) / 2


j1, j2 = jax.vmap(jax.grad(jax_loss, (0, 1)), (None, None, 0, 0))(w1, w2, x, y)
print("largest difference from JAX:", max(np.abs(g1 - j1).max(), np.abs(g2 - j2).max()))
assert np.allclose(g1, j1, rtol=1e-12, atol=1e-13) and np.allclose(g2, j2, rtol=1e-12, atol=1e-13)'''),
    ("md", """\
One batched program instead of a Python loop of 64 gradient runs (the times
depend on the machine; `benchmarks/bench_vmap.py` measures them properly):"""),
    ("py-varies", '''\
import time

one = anfir.grad(loss, wrt=(0, 1))
start = time.perf_counter()
looped = [anfir.run(one, w1, w2, x[i], y[i]) for i in range(64)]
loop_s = time.perf_counter() - start
start = time.perf_counter()
anfir.run(per_example, w1, w2, x, y)
batched_s = time.perf_counter() - start
print(f"loop {loop_s * 1e3:.1f} ms, vmap {batched_s * 1e3:.2f} ms: {loop_s / batched_s:.0f}x")'''),
    ("md", """\
## Jacobians and a Hessian

`jacrev(f, i)` pulls every basis vector of the output back through `f`
(`vmap` of the pullback), `jacfwd(f, i)` pushes every basis vector of
argument `i` through `jvp(f)`; both have JAX's shape `out.shape + arg.shape`.
`hessian(f, i)` is `jacrev(grad(f, i), i)`."""),
    ("py", '''\
net = anfir.parse("def net(x, w1, w2) = tanh(w2 @ tanh(w1 @ x))")["net"]
xv = rng.standard_normal(100)
a, b = 0.1 * rng.standard_normal((30, 100)), 0.3 * rng.standard_normal((10, 30))
reverse = anfir.run(anfir.jacrev(net, 0), xv, a, b)
forward = anfir.run(anfir.jacfwd(net, 0), xv, a, b)
reference = jax.jacrev(lambda x, a, b: jnp.tanh(b @ jnp.tanh(a @ x)))(xv, a, b)
print("Jacobian", reverse.shape, "- jacrev vs JAX", np.abs(reverse - reference).max(),
      "- jacfwd vs JAX", np.abs(forward - reference).max())
assert np.allclose(reverse, reference, rtol=1e-12, atol=1e-14)
assert np.allclose(forward, reference, rtol=1e-12, atol=1e-14)'''),
    ("md", """\
The Hessian of a function of ten parameters, run and compiled: compiled, the
pullback that `jacrev` batches is a function value only known at run time,
so the compiled program calls it once per basis vector in a `scan`."""),
    ("py", '''\
scal = anfir.parse("def scal(p) = sum(sin(p) * p) + sum(p) * sum(p * p * p)")["scal"]
p = rng.standard_normal(10)
hess = anfir.hessian(scal)
ours = anfir.run(hess, p)
theirs = jax.hessian(lambda p: jnp.sum(jnp.sin(p) * p) + jnp.sum(p) * jnp.sum(p ** 3))(p)
compiled_hess = anfir.compile(hess, args=[p])
print("Hessian", ours.shape, "- vs JAX", np.abs(ours - theirs).max(),
      "- compiled vs run", np.abs(anfir.run(compiled_hess, p) - ours).max())
print("symmetric:", np.allclose(ours, ours.T))
assert np.allclose(ours, theirs, rtol=1e-12, atol=1e-12)
assert np.allclose(anfir.run(compiled_hess, p), ours, rtol=1e-12, atol=1e-12)
assert "scan(" in anfir.to_text(compiled_hess)'''),
]

TRAINING_MEMORY: list[Cell] = [
    ("md", """\
# Training memory: checkpointing and rematerialisation

A gradient program keeps every forward value its backward pass reads alive
until that read: the buffer planner can place buffers in the least arena for
a given program, but not below the most bytes live at once. Only computing
some forward values again, in the backward pass, goes lower. anfir does it by
hand, with `checkpoint(f)` in the language, and automatically, with the
`remat` phase (`anfir.compile(..., remat="min-cut")` or a byte budget). This
notebook measures both with the planned arena of the lowered program;
`docs/remat.md` is the reference."""),
    ("py", SETUP),
    ("md", """\
## `checkpoint(f)` by hand

A chain of eight layers of 32 × 32 matrices, plain and with each layer
checkpointed: the gradients are the same, and the lowered training step
needs a smaller arena (each checkpointed layer keeps only its input and
recomputes its intermediates when the backward pass reaches it)."""),
    ("py", '''\
import numpy as np

chain = anfir.parse("""
def layer(x, w) = tanh(sin(x @ w) * 2.0 + x)
def plain(x, w) =
  let h1 = layer(x, w) in let h2 = layer(h1, w) in let h3 = layer(h2, w) in let h4 = layer(h3, w) in
  let h5 = layer(h4, w) in let h6 = layer(h5, w) in let h7 = layer(h6, w) in sum(layer(h7, w))
def saved(x, w) =
  let c = checkpoint(layer) in
  let h1 = c(x, w) in let h2 = c(h1, w) in let h3 = c(h2, w) in let h4 = c(h3, w) in
  let h5 = c(h4, w) in let h6 = c(h5, w) in let h7 = c(h6, w) in sum(c(h7, w))
def plain_step(x, w) = grad(plain, 1)(x, w)
def saved_step(x, w) = grad(saved, 1)(x, w)
""")
rng = np.random.default_rng(0)
x, w = rng.standard_normal((32, 32)), 0.2 * rng.standard_normal((32, 32))
want = anfir.run(chain["plain_step"], x, w)
got = anfir.run(chain["saved_step"], x, w)
print("largest difference of the gradients:", np.abs(got - want).max())
assert np.allclose(got, want, rtol=1e-12, atol=1e-14)
arenas = {name: anfir.lower(chain, entry=name, args=[x, w]).peak_bytes
          for name in ("plain_step", "saved_step")}
print(arenas, f"-> {arenas['saved_step'] / arenas['plain_step']:.2f}x")'''),
    ("md", """\
## The `remat` phase

With `remat="min-cut"` the compiler decides which forward values to keep:
a minimum cut, as AOTAutograd's partitioner makes, over the forward values
the backward pass reads, recomputing only cheap operations (elementwise,
layout, norms; never matrix products, convolutions or attention). Here the
training step of `examples/mlp2.anf`: its phase dump marks each copy and
says what was decided, in a summary line."""),
    ("py", '''\
import shutil
import tempfile

mlp2 = anfir.load(str(EXAMPLES / "mlp2.anf"))
small = [rng.standard_normal((16, 32)) * 0.2, np.zeros(32), rng.standard_normal((32, 4)) * 0.2,
         np.zeros(4), rng.standard_normal((8, 16)), rng.standard_normal((8, 4))]
dumps = Path(tempfile.mkdtemp(prefix="anfir-remat-"))
step = anfir.compile(mlp2, entry="mlp2_step", args=small, remat="min-cut", dump_dir=str(dumps))
text = next(dumps.glob("*_remat.ir")).read_text().splitlines()
print(next(line for line in text if line.startswith("# remat:")))
print(sum("remat: recomputed" in line for line in text), "nodes marked recomputed")
plain_grads = anfir.run(anfir.compile(mlp2, entry="mlp2_step", args=small), *small)
assert all(np.allclose(a, b, rtol=1e-12) for a, b in zip(anfir.run(step, *small), plain_grads))
shutil.rmtree(dumps)'''),
    ("md", "The rematerialised step, drawn (the recomputed values are read through `remat_barrier`s):"),
    ("py", "step"),
    ("md", """\
## A sweep: arena against recomputation

On the transformer block's training step (`examples/transformer.anf`,
batch 8, length 32, width 32), every candidate the budget search tries —
nothing recomputed, then the cheap operations of the first 1/8, 2/8, ... of
the forward pass, then more operation kinds — lowered and planned, with the
modeled extra floating-point operations of its copies. (The search is
`anfir.lowlevel.remat`; a budget picks the first candidate that fits.)"""),
    ("py", '''\
from anfir.ir.clone import clone
from anfir.lowlevel import lower as lower_compiled, remat
from anfir.passes.validate import rebuild_manager

block = anfir.load(str(EXAMPLES / "transformer.anf"))
shapes = [(32, 32), (32,)] * 4 + [(32,), (32,), (64, 32), (64,), (32, 64), (32,), (32,), (32,)]
p = tuple(rng.normal(size=s) * (0.2 if len(s) == 2 else 0.1) + (1.0 if i in (8, 14) else 0.0)
          for i, s in enumerate(shapes))
args = [rng.normal(size=(8, 32, 32)), p, rng.normal(size=(8, 32, 32))]
compiled = anfir.compile(block, entry="block_grad", args=args)
remat.inline_everything(rebuild_manager([compiled]))
points = []
for level, fraction in [("none", 0.0), *remat.candidates()]:
    trial = clone(compiled)
    rebuild_manager([trial])
    flops = 0 if level == "none" else remat.rematerialize(trial, level, fraction).extra_flops
    low = lower_compiled(trial)  # the compiled graph as it is (anfir.lower compiles first)
    points.append((f"{level} {fraction:.3g}", low.peak_bytes, flops, low))
    print(f"{points[-1][0]:<12} arena {low.peak_bytes:>10,} bytes   extra FLOPs {flops:>10,}")
reference = anfir.run(compiled, *args)
for name, _, _, low in points:  # every candidate computes the same gradient
    assert all(np.allclose(a, b, rtol=1e-10, atol=1e-12)
               for a, b in zip(anfir.run(low, *args), reference)), name
print("budget 1,100,000 bytes:", anfir.lower(block, entry="block_grad", args=args,
                                              remat=1_100_000).peak_bytes, "bytes planned")'''),
    ("py", '''\
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from IPython.display import Image, display

fig, ax = plt.subplots(figsize=(7, 3.8))
ax.plot([f / 1e6 for _, _, f, _ in points], [a / 1024 for _, a, _, _ in points], "o")
for name, arena, flops, _ in points:
    ax.annotate(name, (flops / 1e6, arena / 1024), textcoords="offset points", xytext=(4, 3), fontsize=7)
ax.set_xlabel("extra FLOPs of the recomputed copies (millions, modeled)")
ax.set_ylabel("planned arena (KiB)")
ax.set_title("transformer block step: rematerialisation candidates", fontsize=9)
ax.grid(alpha=0.3)
picture = io.BytesIO()  # a PNG: the notebooks' SVG pictures are the graphs Graphviz draws
fig.savefig(picture, format="png", dpi=90, metadata={"Software": None})
plt.close(fig)
display(Image(picture.getvalue()))'''),
    ("md", """\
The step times of the same candidates (they depend on the machine, so this
cell's output is not kept; `benchmarks/bench_remat.py` measures them with
the ResNet step too, and `benchmarks/README.md` has its figures):"""),
    ("py-varies", '''\
import time

for name, arena, _, low in points:
    best = min((lambda start: (anfir.run(low, *args), time.perf_counter() - start)[1])(time.perf_counter())
               for _ in range(5))
    print(f"{name:<12} arena {arena:>10,} bytes   step {best * 1e3:6.2f} ms")'''),
]

NOTEBOOKS: dict[str, list[Cell]] = {
    "01_writing_ir_by_hand.ipynb": WRITING_IR,
    "02_differentiating.ipynb": DIFFERENTIATING,
    "03_inspecting_the_pipeline.ipynb": PIPELINE,
    "04_importing_onnx.ipynb": IMPORTING_ONNX,
    "05_models_in_anf.ipynb": MODELS_IN_ANF,
    "06_importing_torch.ipynb": IMPORTING_TORCH,
    "07_importing_gpt2.ipynb": IMPORTING_GPT2,
    "08_batching.ipynb": BATCHING,
    "09_training_memory.ipynb": TRAINING_MEMORY,
}


def build(cells: list[Cell]) -> nbformat.NotebookNode:
    """A notebook (outputs empty) from a cell list."""
    notebook = new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                       "language": "python"}
    notebook.metadata["language_info"] = {"name": "python"}
    for index, (kind, text) in enumerate(cells):
        cell = new_markdown_cell(text) if kind == "md" else new_code_cell(text)
        cell["id"] = f"cell-{index:02d}"  # stable ids: regenerating gives identical files
        notebook.cells.append(cell)
    return notebook


def kernel_environment(directory: Path) -> dict[str, str]:
    """Environment variables that make Jupyter's ``python3`` kernel this interpreter's ipykernel.

    Writes the kernelspec under ``directory`` (a temporary ``JUPYTER_PATH``, so a
    differently configured system-wide ``python3`` kernel cannot be picked up)
    and puts the repository root on the kernel's ``PYTHONPATH``, so ``import
    anfir`` works without installing.
    """
    spec_dir = directory / "kernels" / "python3"
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (anfir)", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec), encoding="utf-8")
    path = os.environ.get("PYTHONPATH", "")
    return {"JUPYTER_PATH": str(directory),
            "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""),
            "MPLBACKEND": "Agg"}


def execute(notebook: nbformat.NotebookNode, workdir: Path) -> None:
    """Run every cell of ``notebook`` in place, on a fresh ``python3`` kernel started in ``workdir``."""
    import nbclient  # only needed to execute

    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    client = nbclient.NotebookClient(notebook, timeout=TIMEOUT, kernel_name="python3",
                                     record_timing=False,
                                     resources={"metadata": {"path": str(workdir)}})
    client.execute()


# What must not be committed: an absolute path of this machine, an object's
# address, a timestamp.  Checked in every text an output shows (not in the
# base64 of PNG images, where such letters occur by chance).
_MACHINE_SPECIFIC = re.compile(
    r"(?<![\w.~-])/(?:work|tmp|home|root|Users|private|var/folders|opt|usr)/"
    r"|\b0x[0-9a-fA-F]{6,}\b"
    r"|\b\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d")


def machine_specific(notebook: nbformat.NotebookNode) -> list[str]:
    """Texts of ``notebook``'s outputs and metadata that differ between machines or runs."""
    texts = [json.dumps(notebook.metadata)]
    for cell in notebook.cells:
        texts.append(json.dumps(cell.get("metadata", {})))
        for output in cell.get("outputs", []):
            texts.append(output.get("text", ""))
            texts += output.get("traceback", [])
            texts += [value if isinstance(value, str) else json.dumps(value)
                      for mime, value in output.get("data", {}).items() if mime != "image/png"]
    found = []
    for text in texts:
        text = "".join(text) if isinstance(text, list) else text
        found += [text[max(0, m.start() - 30):m.end() + 30] for m in _MACHINE_SPECIFIC.finditer(text)]
    home = str(Path.home())
    found += [text[:80] for text in texts
              if str(ROOT) in text or (len(Path.home().parts) > 1 and home in text)]
    return found


def shows_program_text(output: nbformat.NotebookNode) -> bool:
    """Whether a displayed value is a program shown as ANF text in place of its picture.

    That is Jupyter's fallback for a FuncGraph or Module when Graphviz's
    ``dot`` is missing: a ``text/plain`` form whose first definition starts
    with ``def`` — after any ``##`` doc and ``#@`` attribute lines, with which
    ANF text may begin (an imported model's ``#@ ranges``) — and no SVG.
    """
    data = output.get("data", {})
    text = data.get("text/plain", "")
    text = "".join(text) if isinstance(text, list) else text
    text = re.sub(r"\A(?:[ \t]*(?:#[#@][^\n]*)?\n)*", "", text)
    return "image/svg+xml" not in data and re.match(r"def \S+\(", text) is not None


def settle(notebook: nbformat.NotebookNode, cells: list[Cell]) -> None:
    """Make an executed notebook the same on every run and machine (or raise ValueError).

    The metadata is the generated one (not the kernel's Python version), cell
    metadata is empty (no timings), ``py-varies`` cells keep no output,
    consecutive prints to one stream are one output, and the execution counts
    must be 1, 2, 3... in cell order.  No cell may fail, print to stderr, or
    show a graph as text (the generator runs where ``dot`` draws them).
    """
    notebook.metadata = build(cells).metadata
    count = 0
    for cell, (kind, _) in zip(notebook.cells, cells):
        cell.metadata = nbformat.NotebookNode()
        if cell.cell_type != "code":
            continue
        count += 1
        if cell.execution_count != count:
            raise ValueError(f"{cell.id}: execution count {cell.execution_count}, not {count}")
        if kind == "py-varies":
            cell.outputs = []
        # How a cell's printing is cut into stream outputs depends on timing: one per stream.
        merged: list[nbformat.NotebookNode] = []
        for output in cell.outputs:
            last = merged[-1] if merged else None
            if (last is not None and output.output_type == last.output_type == "stream"
                    and output.name == last.name):
                last.text += output.text
            else:
                merged.append(output)
        cell.outputs = merged
        for output in cell.outputs:
            if output.output_type == "error":
                raise ValueError(f"{cell.id}: {output.ename}: {output.evalue}")
            if output.output_type == "stream" and output.name == "stderr":
                raise ValueError(f"{cell.id}: printed to stderr: {output.text[:300]}")
            if shows_program_text(output):
                raise ValueError(f"{cell.id}: a graph shown as text, not drawn (is dot working?)")
    found = machine_specific(notebook)
    if found:
        raise ValueError("outputs that differ between machines or runs:\n  " + "\n  ".join(found))


def main(argv: list[str] | None = None) -> None:
    """Write every notebook next to this script, executed unless ``--clear``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--clear", action="store_true",
                        help="write the notebooks without outputs (no kernel, no Graphviz)")
    parser.add_argument("--only", metavar="NAME", action="append", default=None,
                        help="write only this notebook (repeatable), e.g. 07_importing_gpt2.ipynb")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.only or ()) - set(NOTEBOOKS))
    if unknown:
        parser.error(f"no such notebook: {', '.join(unknown)} (choose from {', '.join(NOTEBOOKS)})")
    if not args.clear and shutil.which("dot") is None:
        parser.error("Graphviz's dot is not installed (apt-get install graphviz): the committed "
                     "notebooks show the pictures it draws (--clear writes them without outputs)")
    notebooks = {name: build(cells) for name, cells in NOTEBOOKS.items()
                 if args.only is None or name in args.only}
    if not args.clear:
        with tempfile.TemporaryDirectory(prefix="anfir-notebooks-") as scratch:
            os.environ.update(kernel_environment(Path(scratch)), PYTHONHASHSEED="0")
            for name, notebook in notebooks.items():
                print("executing", name, flush=True)
                execute(notebook, Path(scratch))
                try:
                    settle(notebook, NOTEBOOKS[name])
                except ValueError as error:
                    sys.exit(f"{name}: {error}")
    for name, notebook in notebooks.items():  # all written, or none
        nbformat.validate(notebook)
        with open(HERE / name, "w", encoding="utf-8", newline="\n") as handle:
            nbformat.write(notebook, handle)
        print("wrote", f"notebooks/{name}")


if __name__ == "__main__":
    main()

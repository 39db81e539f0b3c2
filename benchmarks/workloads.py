"""The programs the figures run, as ANF text (and, for xDSL, as MLIR generic form).

Each generator returns plain text, so a figure times exactly what a user's
``anfir.parse`` + ``anfir.run`` would do with the same file.
"""

from __future__ import annotations

PARSE_CYCLE = 3
"""The straight-line parse program cycles through three one-op lines."""


def parse_chain_anf(lines: int) -> str:
    """``def f(x0) = ...``: ``lines`` let-lines of one primitive each, cycling
    ``x * 1.0001``, ``sin(x)`` and ``x + previous`` (2 + ``lines`` lines in all)."""
    out = ["def f(x0) ="]
    for i in range(lines):
        kind = i % PARSE_CYCLE
        if kind == 0:
            expr = f"x{i} * 1.0001"
        elif kind == 1:
            expr = f"sin(x{i})"
        else:
            expr = f"x{i} + x{max(i - 1, 0)}"
        out.append(f"  let x{i + 1} = {expr} in")
    out.append(f"  x{lines}")
    return "\n".join(out) + "\n"


def parse_chain_mlir(lines: int) -> str:
    """The program of :func:`parse_chain_anf` in MLIR generic form (``arith``,
    ``math``, ``func`` dialects; one operation per line, the constant hoisted
    as MLIR writes it), 7 + ``lines`` lines."""
    out = [
        '"builtin.module"() ({',
        '  "func.func"() <{sym_name = "f", function_type = (f64) -> f64}> ({',
        "  ^bb0(%x0: f64):",
        '    %c = "arith.constant"() <{value = 1.0001 : f64}> : () -> f64',
    ]
    for i in range(lines):
        kind = i % PARSE_CYCLE
        if kind == 0:
            op = f'"arith.mulf"(%x{i}, %c) : (f64, f64) -> f64'
        elif kind == 1:
            op = f'"math.sin"(%x{i}) : (f64) -> f64'
        else:
            op = f'"arith.addf"(%x{i}, %x{max(i - 1, 0)}) : (f64, f64) -> f64'
        out.append(f"    %x{i + 1} = {op}")
    out.append(f'    "func.return"(%x{lines}) : (f64) -> ()')
    out.append("  }) : () -> ()")
    out.append("}) : () -> ()")
    return "\n".join(out) + "\n"


def eval_chain_anf(ops: int) -> str:
    """``def chain(x)``: ``ops`` primitive nodes alternating ``* 1.0001`` and ``+ 0.5``."""
    out = ["def chain(x0) ="]
    for i in range(ops):
        expr = f"x{i} * 1.0001" if i % 2 == 0 else f"x{i} + 0.5"
        out.append(f"  let x{i + 1} = {expr} in")
    out.append(f"  x{ops}")
    return "\n".join(out) + "\n"


def grad_chain_anf(steps: int) -> str:
    """``def f(x)``: ``x = x * 1.0001 + sin(x) * 0.001`` ``steps`` times (4 ops a step)."""
    out = ["def f(x0: f64) -> f64 ="]
    for i in range(steps):
        out.append(f"  let x{i + 1} = x{i} * 1.0001 + sin(x{i}) * 0.001 in")
    out.append(f"  x{steps}")
    return "\n".join(out) + "\n"


MLP_ANF = """\
def mlp_loss(w1: f64[D, H], w2: f64[H, K], x: f64[B, D], y: f64[B, K]) -> f64 =
  let h = tanh(x @ w1) in
  let out = h @ w2 in
  sum((out - y) ** 2) / 2
"""
"""The typed tensor program of the language spec, verbatim."""


MLP_BY_HAND_ANF = """\
def mlp_grad_by_hand(w1, w2, x, y) =
  let h = tanh(x @ w1) in
  let r = h @ w2 - y in
  let dh = r @ transpose(w2) in
  (transpose(x) @ (dh * (1.0 - h * h)), transpose(h) @ r)
"""
"""The numpy baseline's forward+backward written in ANF: what a perfect
optimizer could at best produce, so its time is the evaluator's and the
primitives' share of the gap to numpy."""


LOOP_ANF = """\
def run_loop(x, n) =
  let loop = lambda (i, acc)
    if i < n then loop(i + 1, acc * x + 0.5) else acc end in
  loop(0, 1.0)

def count(i, n, acc) =
  if i < n then count(i + 1, n, acc * 0.99999 + 0.5) else acc

def depth(n) =
  if n < 1 then 0 else 1 + depth(n - 1)
"""
"""Two loops, a local closure that recurses (the spec's ``power`` shape) and a
top-level tail-recursive definition, which must run in constant memory; and
``depth``, a non-tail recursion, whose memory must grow (the control)."""


# -- compile scaling (issue 10): program shapes whose compile time once grew
# quadratically.  Each returns ANF text of ``main(x)`` (``main(x, y)`` for the
# gradient chain) of ``size`` units; ``bench_scaling.py`` times them at N and
# 10N, ``tests/test_scaling.py`` counts the work.


def call_chain_anf(size: int) -> str:
    """``size`` definitions, each calling the previous one once
    (``def f3(x) = f2(x) * 1.0``), and ``main`` calling the last: the
    inliner folds the whole chain into ``main``."""
    out = ["def f0(x) = x + 1.0"]
    out.extend(f"def f{i}(x) = f{i - 1}(x) * 1.0" for i in range(1, size))
    out.append(f"def main(x) = f{size - 1}(x)")
    return "\n".join(out) + "\n"


def nested_tuples_anf(size: int) -> str:
    """``main(x)`` returning ``size``-deep nested 1-tuples twice: around ``x``
    (a chain of ``make_tuple`` nodes whose types nest deeper at each one) and
    around a constant (which the optimizer folds, one level at a time)."""
    return (f"def main(x) = ({'(' * size}x{',)' * size}, "
            f"{'(' * size}1.5{',)' * size})\n")


def wide_tuple_anf(size: int) -> str:
    """``main(x)`` returning one tuple literal of ``size`` elements, computed
    (``x * 2.0``) and constant (``3.0``) in turn."""
    items = (f"x * {i}.0" if i % 2 == 0 else f"{i}.0" for i in range(size))
    return f"def main(x) = ({', '.join(items)})\n"


def nested_ifs_anf(size: int) -> str:
    """``main(x)``: ``size`` ifs, each in the ``else`` branch of the previous
    one (``if x < 0.0 then 0.5 else if x < 1.0 then 1.5 else ...``): a graph
    per branch, each nested in the one before."""
    out = ["def main(x) ="]
    out.extend(f"  if x < {i}.0 then {i}.5 else" for i in range(size))
    out.append("  -1.0")
    return "\n".join(out) + "\n"


def grad_order_anf(size: int, order: int) -> str:
    """``f(x, y)``: a straight-line chain of ``size`` lets (``v * y`` and
    ``sin(v) + x`` in turn), and ``main(x, y)`` its first-order
    (``grad(f, 0)``) or second-order (``grad(grad(f, 0), 1)``) gradient."""
    out = ["def f(x, y) ="]
    previous = "x"
    for i in range(size):
        expr = f"{previous} * y" if i % 2 == 0 else f"sin({previous}) + x"
        out.append(f"  let v{i} = {expr} in")
        previous = f"v{i}"
    out.append(f"  {previous}")
    gradient = "grad(f, 0)" if order == 1 else "grad(grad(f, 0), 1)"
    out.append(f"def main(x, y) = {gradient}(x, y)")
    return "\n".join(out) + "\n"

"""The examples of the language contract (``shared/spec/anf-text.md``), verbatim.

One copy for every test that needs them; ``tests/test_docs.py``
checks them against the contract itself when it sits beside the checkout.
"""

PAPER = """\
lambda (x, y)
    let a = x - 1 in
    let b = a + y in
    let func = lambda (x, y)
        let ret = x / y in
        ret end in
    let %1 = func(a, b) in
    let c = b * %1 in
    c end
"""
"""The MindIR paper's own ANF text: a bare expression, graph ``main``; main(5.0, 2.0) is 4.0."""

HOF = """\
def hof(x) =
  let f = lambda (x) x + 3 end in
  let g = lambda (function, x) function(x) * function(x) end in
  g(f, x)
"""
"""Higher-order functions: hof(2.0) is 25.0."""

FIBONACCI = """\
def fibonacci(n) =
  if n < 1 then 0
  else if n == 1 then 1
  else fibonacci(n - 1) + fibonacci(n - 2)
"""
"""Control flow and recursion: fibonacci(10) is 55."""

CLOSURE = """\
def func_outer(a, b) =
  lambda (c) a + b + c end

def ms_closure() =
  let closure = func_outer(1, 2) in
  let out1 = closure(1) in
  let out2 = closure(2) in
  (out1, out2)
"""
"""Free variables and closures: ms_closure() is (4, 5)."""

POWER = """\
def power(x, n) =
  let loop = lambda (i, acc)
    if i < n then loop(i + 1, acc * x) else acc end in
  loop(0, 1.0)

def dpower(x) = grad(power)(x, 3)      # 3 * x ** 2
"""
"""A loop as local tail recursion, differentiated inside the program: dpower(x) is 3 x²."""

MLP = """\
def mlp_loss(w1: f64[D, H], w2: f64[H, K], x: f64[B, D], y: f64[B, K]) -> f64 =
  let h = tanh(x @ w1) in
  let out = h @ w2 in
  sum((out - y) ** 2) / 2
"""
"""A typed tensor program."""

ALL = {"paper": PAPER, "hof": HOF, "fibonacci": FIBONACCI, "closure": CLOSURE, "power": POWER,
       "mlp": MLP}
"""Every example by a short name."""

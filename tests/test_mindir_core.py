"""The MindIR writer's core: programs export, import back and compute ``anfir.run``'s numbers.

Covers the gradients of reductions over some axes (``unreduce`` reads its axes and
keepdims from its inputs), a program returning a string, and programs compiled with
dimension variables (``f64[N, 3]``): their files hold -1 dims and MindSpore's ``Shape``,
and run equal to anfir for several concrete sizes.  The live check against MindSpore
itself is tests_mindspore/test_mindspore_dynamic.py.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pytest

import anfir
from anfir.interop.mindir import MindirError


def leaves(value: Any) -> list[Any]:
    """The leaves of a nested tuple, in order (iteratively)."""
    out, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, tuple):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


def round_trip(source: Any, entry: Any, args: Any, runs: Sequence[tuple[Any, ...]]) -> bytes:
    """Export ``source``'s entry for ``args`` (values or types), import it back, and check
    the import computes what ``anfir.run`` of the compiled source does on every run."""
    data = anfir.export_mindir(source, entry=entry, args=args)
    back = anfir.import_mindir(data)
    compiled = anfir.compile(source, entry=entry, args=args)
    for values in runs:
        want, got = leaves(anfir.run(compiled, *values)), leaves(anfir.run(back.entry, *values))
        assert len(want) == len(got)
        for a, b in zip(want, got):
            if isinstance(a, str):
                assert a == b
                continue
            assert np.shape(a) == np.shape(b), (np.shape(a), np.shape(b))
            np.testing.assert_allclose(np.asarray(b, dtype=float), np.asarray(a, dtype=float),
                                       rtol=1e-12, atol=1e-12)
    return data


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("axis,keepdims", [(1, "true"), ((0, 2), "false"), (-1, "false"), ((2, 0), "true"),
                                           (None, "false")])
def test_the_gradient_of_a_reduction_over_some_axes_round_trips(reduction: str, axis: Any,
                                                                 keepdims: str) -> None:
    call = f"{reduction}(y, axis={'None' if axis is None else axis}, keepdims={keepdims})"
    mod = anfir.parse(f"def g(x) = grad(lambda (y) sum(sin({call}) * {call}) end)(x)\n")
    x = np.random.default_rng(3).uniform(-1.0, 1.0, size=(2, 3, 4))
    round_trip(mod, "g", [x], [(x,)])
    # the reference itself: the gradient by central differences
    g = anfir.run(anfir.compile(mod, entry="g", args=[x]), x)
    f = anfir.parse(f"def f(y) = sum(sin({call}) * {call})\n")["f"]
    e = np.zeros_like(x)
    e[1, 2, 3] = 1e-6
    numeric = (anfir.run(f, x + e) - anfir.run(f, x - e)) / 2e-6
    np.testing.assert_allclose(g[1, 2, 3], numeric, rtol=1e-6)


def test_a_program_returning_a_string_is_refused_with_a_located_error() -> None:
    # MindSpore's runtime computes no strings (GraphCell returns a meaningless uint8 for
    # one; its own export of such a cell fails): a located MindirError, not a file that
    # MindSpore runs wrong, nor a bare exception.
    mod = anfir.parse('def count_down(n) =\n'
                      '  let loop = lambda (i) if i == 0 then "done" else loop(i - 1) end in\n'
                      '  loop(n)\n', "count.anf")
    assert anfir.run(mod["count_down"], 3) == "done"
    with pytest.raises(anfir.AnfirError) as caught:
        anfir.export_mindir(mod, entry="count_down", args=[10])
    assert isinstance(caught.value, MindirError)
    assert "a string value" in str(caught.value)
    assert caught.value.loc is not None and caught.value.loc.file == "count.anf"
    assert caught.value.loc.line == 3  # the entry, whose result is the string
    # a string in a tuple result likewise
    pair = anfir.parse('def f(x) = (x * 2.0, "twice")\n', "pair.anf")
    with pytest.raises(MindirError, match="a string value"):
        anfir.export_mindir(pair, entry="f", args=[1.0])

"""Timing helpers and the result table of ``run_all.py``.

Every figure is measured the same way (:func:`paired_seconds`): warm-up
calls first (the evaluator compiles each graph to flat code on its first
call, torch builds its dispatch caches), then ``repeat`` rounds of timed
samples with ``time.perf_counter``, the compared functions taking turns,
with the garbage collector paused (as ``timeit`` does, so a collection
triggered by an earlier figure is not charged to this one); the *best*
sample of each is kept: the least disturbed run of the same work.
"""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional


def calls_per_sample(fn: Callable[[], Any], target: float = 0.02) -> int:
    """How many calls of ``fn`` make a sample of about ``target`` seconds
    (short calls are batched so the timer's resolution does not matter).
    Calls ``fn`` once or twice: a warm-up, then a timed call when ``target`` > 0."""
    fn()
    if target <= 0:
        return 1
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, int(target / once))


def paired_seconds(fns: dict[str, Callable[[], Any]], repeat: int = 11, target: float = 0.02
                   ) -> dict[str, float]:
    """Best time per call of each of ``fns``, their samples interleaved.

    The ratio of two figures is what matters: sampling them in turns (A, B,
    A, B, ...) exposes both to the same moments of a busy machine, so a
    burst of load elsewhere cannot favour one side.
    """
    numbers = {name: calls_per_sample(fn, target) for name, fn in fns.items()}
    best = {name: float("inf") for name in fns}
    gc.collect()  # garbage of earlier figures is not this one's to collect
    enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeat):
            for name, fn in fns.items():
                number = numbers[name]
                # Each sample starts from a clean heap: the cyclic garbage of the
                # previous sample (a compile leaves whole graphs) is collected
                # here, untimed, instead of piling up and spreading every later
                # sample over more memory.
                gc.collect()
                start = time.perf_counter()
                for _ in range(number):
                    fn()
                best[name] = min(best[name], (time.perf_counter() - start) / number)
    finally:
        if enabled:
            gc.enable()
    return best


@dataclass
class Figure:
    """One row of the table: what was measured, its value, the peer's value and the goal."""

    name: str
    """What the ratio is (one line)."""
    value: Optional[float] = None
    """anfir's figure (a ratio, or KiB for memory); None when it could not be measured."""
    peer: str = ""
    """The peer's corresponding figure, already formatted ("n/a" when it is not installed)."""
    goal: str = ""
    """The goal as text, e.g. ``>= 5x``."""
    passed: Optional[bool] = None
    """Whether the goal is met (None: not measured)."""
    unit: str = "x"
    """How ``value`` is printed: ``x`` for ratios, ``KiB`` for memory."""
    details: list[str] = field(default_factory=list)
    """The raw measurements behind the ratio, one short line each."""
    error: str = ""
    """Why the figure is missing (the exception of a part of anfir not ready)."""

    @property
    def verdict(self) -> str:
        """PASS, MISS, ERROR (anfir failed) or n/a (the peer is not installed)."""
        if self.error:
            return "ERROR"
        if self.passed is None:
            return "n/a"
        return "PASS" if self.passed else "MISS"

    def value_text(self) -> str:
        """The value as printed in the table."""
        if self.value is None:
            return "-"
        if self.unit == "x":
            return f"{self.value:.2f}x"
        return f"{self.value:+.1f} {self.unit}"


def format_table(figures: list[Figure]) -> str:
    """A Markdown table of the figures (readable in a terminal too)."""
    header = ("figure", "anfir", "peer", "goal", "result")
    rows = [(f.name, f.value_text(), f.peer or "-", f.goal, f.verdict) for f in figures]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: tuple[str, ...]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    out = [line(header), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out.extend(line(r) for r in rows)
    return "\n".join(out)


def format_details(figures: list[Figure]) -> str:
    """The raw measurements of every figure, and the errors, below the table."""
    out = []
    for f in figures:
        out.append(f"{f.name}:")
        out.extend(f"    {d}" for d in f.details)
        if f.error:
            out.append(f"    error: {f.error}")
    return "\n".join(out)


def micro(seconds: float) -> str:
    """``seconds`` in µs (three significant digits below 100 µs)."""
    us = seconds * 1e6
    return f"{us:.3g} µs" if us < 100 else f"{us:,.0f} µs"


def milli(seconds: float) -> str:
    """``seconds`` in ms."""
    return f"{seconds * 1e3:.2f} ms"

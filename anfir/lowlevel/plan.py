"""``plan_memory``: every alloc'd buffer at a byte offset in one arena.

Buffers whose lives overlap must not share bytes; the arena is at least the
most bytes live at one instruction (``max live``).  Placing intervals of
time × size in the least space is NP-hard in general, so, as Glow's and
executorch's planners do, several greedy strategies run and the smallest
arena wins (the first in :data:`STRATEGIES` order on ties; it stops at the
first that reaches ``max live``, which is optimal).  Each strategy orders the
buffers and places each at the lowest offset where it fits beside the buffers
already placed whose lives overlap its own (first fit):

* ``max_live_first`` — Glow's: repeatedly the largest buffer live at the
  instruction where the unplaced buffers are largest together;
* ``size_first`` — largest first (executorch's greedy by size);
* ``longest_life_first`` — longest life first;
* ``program_order`` — in the order of the allocs;
* ``short_lives_last`` — the buffers alive for one instruction (the kernels'
  ``@scratch``) after all the others, largest first, in the holes left.
"""

from __future__ import annotations

import random
from typing import Callable

from anfir.lowlevel.program import Buffer, LowProgram, lives, max_live

Lives = dict[Buffer, tuple[int, int]]
Strategy = Callable[[list[Buffer], Lives], list[Buffer]]


def _max_live_first(buffers: list[Buffer], life: Lives) -> list[Buffer]:
    """Glow's order: at the instruction where the unplaced buffers take the most
    bytes, the largest of them; again, until none is left."""
    if not buffers:
        return []
    count = max(end for _, end in life.values()) + 1
    live = [0] * count
    size = {b: b.size for b in buffers}
    for b in buffers:
        start, end = life[b]
        for t in range(start, end + 1):
            live[t] += size[b]
    order: list[Buffer] = []
    position = {b: i for i, b in enumerate(buffers)}
    left = dict.fromkeys(buffers)  # ordered, with O(1) removal
    while left:
        peak = max(range(count), key=lambda t: (live[t], -t))
        here = [b for b in left if life[b][0] <= peak <= life[b][1]]
        chosen = max(here, key=lambda b: (size[b], -position[b])) if here else next(iter(left))
        order.append(chosen)
        del left[chosen]
        start, end = life[chosen]
        for t in range(start, end + 1):
            live[t] -= size[chosen]
    return order


def _size_first(buffers: list[Buffer], life: Lives) -> list[Buffer]:
    return sorted(buffers, key=lambda b: (-b.size, life[b][0]))


def _longest_life_first(buffers: list[Buffer], life: Lives) -> list[Buffer]:
    return sorted(buffers, key=lambda b: (-(life[b][1] - life[b][0]), -b.size, life[b][0]))


def _program_order(buffers: list[Buffer], life: Lives) -> list[Buffer]:
    return list(buffers)


def _short_lives_last(buffers: list[Buffer], life: Lives) -> list[Buffer]:
    """The buffers that live longer than one instruction in Glow's order, then those
    alive for one instruction only (a kernel's scratch, mostly), largest first, in the
    holes the others leave."""
    short = [b for b in buffers if life[b][0] == life[b][1]]
    shorts = set(short)
    longer = [b for b in buffers if b not in shorts]
    head = (_max_live_first(longer, life) if len(longer) <= MAX_LIVE_FIRST_LIMIT
            else _longest_life_first(longer, life))
    return head + _size_first(short, life)


STRATEGIES: list[tuple[str, Strategy]] = [
    ("max_live_first", _max_live_first),
    ("size_first", _size_first),
    ("longest_life_first", _longest_life_first),
    ("program_order", _program_order),
    ("short_lives_last", _short_lives_last),
]
"""The planner's strategies, tried in this order."""

MAX_LIVE_FIRST_LIMIT = 4000
"""Above this many buffers the quadratic ``max_live_first`` order is skipped."""


def first_fit(order: list[Buffer], life: Lives) -> dict[Buffer, int]:
    """Offsets for the buffers, placed in ``order``, each at the lowest offset
    clear of the placed buffers whose lives overlap its own."""
    placed: list[tuple[int, int, int, int]] = []  # (start, end, offset, size)
    offsets: dict[Buffer, int] = {}
    for b in order:
        start, end = life[b]
        busy = sorted((o, o + s) for (s0, e0, o, s) in placed if s0 <= end and start <= e0)
        offset = 0
        for low, high in busy:
            if offset + b.size <= low:
                break
            offset = max(offset, high)
        offsets[b] = offset
        placed.append((start, end, offset, b.size))
    return offsets


def plan(program: LowProgram) -> tuple[dict[Buffer, int], int, str]:
    """The best plan: ``(offsets, arena bytes, strategy name)``."""
    life = lives(program)
    buffers = program.allocs()
    bound = max_live(program)
    best: tuple[dict[Buffer, int], int, str] = ({}, 0, "none")
    for name, strategy in STRATEGIES:
        if name == "max_live_first" and len(buffers) > MAX_LIVE_FIRST_LIMIT:
            continue
        offsets = first_fit(strategy(buffers, life), life)
        arena = max((offsets[b] + b.size for b in buffers), default=0)
        if best[2] == "none" or arena < best[1]:
            best = (offsets, arena, name)
        if arena <= bound:
            return best
    # Above max live: first fit in shuffled orders (seeded, so the plan is the same on
    # every run), as many as a fixed amount of work allows, keeping the smallest.  The
    # greedy orders place a kernel's large one-instruction scratch where it fragments
    # the arena; some other order often reaches max live (the convolutional gradients).
    rng = random.Random(0)
    order = list(buffers)
    for trial in range(min(SHUFFLES, SHUFFLE_WORK // max(1, len(buffers) ** 2))):
        rng.shuffle(order)
        offsets = first_fit(order, life)
        arena = max((offsets[b] + b.size for b in buffers), default=0)
        if arena < best[1]:
            best = (offsets, arena, f"shuffled_{trial}")
        if arena <= bound:
            break
    return best


SHUFFLES = 256
"""At most this many shuffled orders are tried after the greedy ones."""

SHUFFLE_WORK = 8_000_000
"""The shuffled orders tried cost at most about this many placements (a first fit of
``n`` buffers costs ``n²``): many for small programs, none for the largest."""


def plan_memory(program: LowProgram) -> LowProgram:
    """The program with every alloc at an offset of one arena (the best strategy's)."""
    offsets, arena, _ = plan(program)
    for buffer, offset in offsets.items():
        buffer.offset = offset
    program.arena_bytes = arena
    return program


__all__ = ["MAX_LIVE_FIRST_LIMIT", "STRATEGIES", "first_fit", "plan", "plan_memory"]

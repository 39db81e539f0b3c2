"""Meta functions: functions on functions, expanded by transformations."""

from __future__ import annotations

from anfir.primitives.registry import declare_meta

grad = declare_meta(
    "grad",
    "grad(f) — the gradient of scalar-valued f w.r.t. its first argument; "
    "grad(f, i, j, ...) — w.r.t. arguments i, j, ... (a tuple when several)")
value_and_grad = declare_meta(
    "value_and_grad",
    "value_and_grad(f, ...) — a function returning (f(...), gradient), same index rules as grad")

"""numpy meanings of the MIL ops coremltools infers no value for, shared by the Core ML
tests' ``evaluators`` (by MIL's documentation)."""

from __future__ import annotations

from typing import Any

import numpy as np


def gather_nd(x: Any, indices: Any) -> np.ndarray:
    """MIL gather_nd: the last axis of ``indices`` indexes ``x``'s leading axes."""
    index = np.asarray(indices)
    return np.asarray(x)[tuple(index[..., j] for j in range(index.shape[-1]))]


def scatter_nd(data: Any, indices: Any, updates: Any, mode: str) -> np.ndarray:
    """MIL scatter_nd in its modes ``update`` and ``add``."""
    out = np.array(data)
    index = np.asarray(indices)
    at = tuple(index[..., j] for j in range(index.shape[-1]))
    if mode == "add":
        np.add.at(out, at, np.asarray(updates))
    else:
        assert mode == "update", mode
        out[at] = updates
    return out

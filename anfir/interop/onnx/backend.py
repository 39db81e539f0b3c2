"""anfir as an ONNX backend: ``anfir.interop.onnx.Backend`` (an ``onnx.backend.base.Backend``).

::

    from anfir.interop.onnx import Backend
    rep = Backend.prepare(model)           # imported once (anfir.import_onnx)
    outputs = rep.run([x, y])              # evaluated by anfir's evaluator

ONNX's own backend test suite runs through it (``tests/test_onnx_import.py``).
The class is made on first use, so importing this module (and anfir) never
needs the ``onnx`` package.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from anfir.eval import run as _run
from anfir.interop.onnx.importer import (
    OnnxImportError,
    import_onnx,
    require_onnx,
    with_input_shapes,
)
from anfir.ir.graph import Module


class AnfirRep:
    """A prepared model: the imported Module and its entry, run on ONNX inputs.

    A model that feeds a value anfir takes statically (ReduceSum's axes, a
    Reshape's shape) as a graph input is imported again for each distinct value
    of those inputs when it runs, as a specializing compiler would; every other
    input stays a parameter.

    With ``static_shapes`` (``Backend.prepare(model, static_shapes=True)``), a model
    that does not import with its declared shapes (a rank that depends on a branch
    chosen by shape, as exported RNNs do) is imported again for each set of input
    shapes it is run with, those shapes made static."""

    def __init__(self, model: Any, module: Optional[Module], needs: tuple[str, ...] = (),
                 static_shapes: bool = False) -> None:
        self.model = model
        self.module = module
        self.needs = needs
        self.static_shapes = static_shapes
        self.input_names = [i.name for i in model.graph.input
                            if i.name not in {t.name for t in model.graph.initializer}]
        self.output_names = [o.name for o in model.graph.output]
        self._specialized: dict[bytes, Module] = {}

    def _module_for(self, feed: dict[str, Any]) -> Module:
        if self.module is not None:
            return self.module
        key = _key(feed, self.needs)
        shapes = {n: tuple(np.shape(v)) for n, v in feed.items() if not isinstance(v, list)}
        model = self.model
        if self.static_shapes:
            key += repr(sorted(shapes.items())).encode()
            model = with_input_shapes(self.model, shapes)
        found = self._specialized.get(key)
        if found is None:
            needs = list(self.needs)
            while True:
                try:
                    found = import_onnx(model, bind={n: feed[n] if isinstance(feed[n], list) else np.asarray(feed[n])
                                                     for n in needs})
                    break
                except OnnxImportError as e:
                    # A node may need several inputs' values (a Slice's starts and
                    # ends): each import names those it reached; bind them too.
                    more = [n for n in e.needs_values if n not in needs and n in feed]
                    if not more:
                        raise
                    needs.extend(more)
            if needs != list(self.needs):
                self.needs = tuple(needs)
                key = _key(feed, self.needs)
                if self.static_shapes:
                    key += repr(sorted(shapes.items())).encode()
            self._specialized[key] = found
        return found

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """The model's outputs (a tuple, in graph order) for ``inputs`` (a list in the
        order of the graph's inputs without initializers, or a dict by name)."""
        if isinstance(inputs, dict):
            feed = dict(inputs)
        else:
            values = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
            feed = dict(zip(self.input_names, values))
        module = self._module_for(feed)
        graph = module[module.entry_name()]
        args = [_anfir_value(feed[p.name]) for p in graph.parameters]
        result = _run(graph, *args)
        if len(self.output_names) > 1:
            return tuple(_onnx_value(r) for r in result)
        return (_onnx_value(result),)


def _key(feed: dict[str, Any], names: Sequence[str]) -> bytes:
    """The bytes that tell apart the values of the inputs ``names`` (tensors or lists)."""
    parts = []
    for n in names:
        for item in feed[n] if isinstance(feed[n], list) else [feed[n]]:
            parts.append(np.ascontiguousarray(item).tobytes() + repr(np.shape(item)).encode())
        parts.append(b"|list" if isinstance(feed[n], list) else b"|")
    return b"".join(parts)


def _anfir_value(value: Any) -> Any:
    """An ONNX input as anfir takes it: sequences (lists) are tuples."""
    if isinstance(value, list):
        return tuple(_anfir_value(v) for v in value)
    return value


def _onnx_value(value: Any) -> Any:
    """An output as ONNX gives it: numpy arrays (scalars as 0-d), sequences as lists."""
    if isinstance(value, tuple):
        return [_onnx_value(v) for v in value]
    if value is None:
        return None
    return np.asarray(value)


def _make_backend() -> type:
    onnx = require_onnx()
    import onnx.backend.base as base

    class Backend(base.Backend):
        """anfir as an ONNX backend: import + run on the CPU."""

        @classmethod
        def is_compatible(cls, model: Any, device: str = "CPU", **kwargs: Any) -> bool:
            return device.upper().startswith("CPU")

        @classmethod
        def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> Any:
            """Import ``model`` (``static_shapes=True``: if it does not import with
            its declared shapes, import it for the shapes it is run with)."""
            static = bool(kwargs.get("static_shapes", False))
            try:
                return AnfirRep(model, import_onnx(model))
            except OnnxImportError as e:
                if not e.needs_values and not static:
                    raise
                return AnfirRep(model, None, e.needs_values, static)

        @classmethod
        def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> Any:
            return cls.prepare(model, device).run(inputs)

        @classmethod
        def run_node(cls, node: Any, inputs: Any, device: str = "CPU",
                     outputs_info: Optional[Sequence[Any]] = None, **kwargs: Any) -> Any:
            raise NotImplementedError("anfir runs whole models: use run_model")

        @classmethod
        def supports_device(cls, device: str) -> bool:
            return device.upper().startswith("CPU")

    del onnx
    return Backend


_BACKEND: list[type] = []


def __getattr__(name: str) -> Any:
    # ``Backend`` subclasses onnx's class, so it is made when first asked for.
    if name == "Backend":
        if not _BACKEND:
            _BACKEND.append(_make_backend())
        return _BACKEND[0]
    raise AttributeError(name)

"""The rule rooms (issue 23): the ONNX import, ONNX and Core ML export and torch.export rules,
one module per primitive family, assembled into one table each — in a fixed order, refusing a
second rule for one op, so the table is the same whatever is imported first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from anfir.errors import AnfirError
from anfir.interop.onnx.import_rules import FAMILIES, OPS, merged
from anfir.interop.onnx.import_rules.common import RuleSet

ROOT = Path(__file__).resolve().parent.parent


def _rule_a(ctx: Any) -> list[Any]:
    return []


def _rule_b(ctx: Any) -> list[Any]:
    return []


def test_onnx_families_merge_by_opset_and_refuse_a_second_rule_for_one_opset() -> None:
    first, second = RuleSet(), RuleSet()
    first.op("Foo", 13)(_rule_b)
    second.op("Foo", 7)(_rule_a)
    assert merged((first, second))[("", "Foo")] == [(7, _rule_a), (13, _rule_b)]
    assert merged((second, first)) == merged((first, second))
    clash = RuleSet()
    clash.op("Foo", 13)(_rule_a)
    with pytest.raises(AnfirError, match="two ONNX import rules for ai.onnx::Foo from opset 13"):
        merged((first, clash))


def test_onnx_table_is_every_familys_rules() -> None:
    # OPS is exactly the union of the families' rules (nothing registered elsewhere).
    union = {key for family in FAMILIES for key in family.rules}
    assert set(OPS) == union and len(OPS) >= 150
    assert sum(len(v) for v in OPS.values()) == sum(len(v) for f in FAMILIES for v in f.rules.values())
    for entries in OPS.values():
        assert [s for s, _ in entries] == sorted({s for s, _ in entries})
    assert ("", "Conv") in OPS and ("", "If") in OPS and ("", "LSTM") in OPS


def test_torch_rule_table_refuses_a_second_rule_and_skips_ops_this_torch_lacks() -> None:
    torch = pytest.importorskip("torch")
    from anfir.interop.torch.rules import full_table
    from anfir.interop.torch.rules.common import RuleTable
    table = RuleTable(torch)
    table.named("relu", "default", _rule_a)
    table.named("no_such_op_anywhere", "default", _rule_a)
    assert list(table.rules) == [torch.ops.aten.relu.default]
    with pytest.raises(AnfirError, match="two torch import rules"):
        table.put(torch.ops.aten.relu.default, _rule_b)
    full = full_table(torch)
    assert len(full) >= 290 and torch.ops.aten.convolution.default in full


_FINGERPRINT = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
import torch
from anfir.interop.onnx.import_rules import OPS
from anfir.interop.torch.rules import full_table
print(sorted((k, [(s, r.__module__, r.__qualname__) for s, r in v]) for k, v in OPS.items()))
print(sorted((str(k), r.__module__, getattr(r, '__qualname__', '')) for k, r in full_table(torch).items()))
"""


def test_tables_do_not_depend_on_which_family_is_imported_first() -> None:
    pytest.importorskip("torch")
    families = ["arith", "elementwise", "tensor", "reduce", "shaping", "indexing", "nn", "conv", "structure"]
    onnx_mods = [f"anfir.interop.onnx.import_rules.{f}" for f in families + ["control"]]
    torch_mods = [f"anfir.interop.torch.rules.{f}" for f in families]
    outputs = []
    for order in (onnx_mods + torch_mods, list(reversed(torch_mods + onnx_mods))):
        done = subprocess.run([sys.executable, "-c", _FINGERPRINT, *order], cwd=ROOT, check=True,
                              capture_output=True, text=True, timeout=300)
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == 2


# -- the export rooms (ONNX, Core ML): one module per primitive family, merged into exporter.RULES --
def test_onnx_export_families_merge_and_refuse_a_second_rule_for_one_primitive() -> None:
    from anfir.interop.export_common import merge_family_tables
    from anfir.primitives import arith
    first, second = {arith.add: _rule_a}, {arith.sub: _rule_b}
    assert merge_family_tables((first, second), "X rules") == {arith.add: _rule_a, arith.sub: _rule_b}
    with pytest.raises(AnfirError, match="two ONNX export rules for the primitive add"):
        merge_family_tables((first, {arith.add: _rule_b}), "ONNX export rules")


@pytest.mark.parametrize("room", ["onnx", "coreml"])
def test_export_table_is_every_familys_rules_each_in_its_primitives_module(room: str) -> None:
    import importlib
    from anfir.flat.statements import DIM
    export_rules = importlib.import_module(f"anfir.interop.{room}.export_rules")
    exporter = importlib.import_module(f"anfir.interop.{room}.exporter")
    # The writer's tables are the families' merged tables (the same objects, nothing added elsewhere).
    assert exporter.RULES is export_rules.RULES and exporter.UNSUPPORTED is export_rules.UNSUPPORTED
    assert sum(len(family) for family in export_rules.FAMILIES) == len(exporter.RULES) >= 120
    for module in export_rules.MODULES:
        family = module.__name__.rpartition(".")[2]
        primitives = importlib.import_module(f"anfir.primitives.{family}")
        for prim in [*module.RULES, *module.UNSUPPORTED]:
            # A rule sits in the module named after the one declaring its primitive
            # (the flat program's DIM, one dimension of a shape, with the shape rules).
            assert prim is DIM and family == "shaping" or any(
                value is prim for value in vars(primitives).values()), (family, prim.name)
            assert exporter.RULES.get(prim) is module.RULES.get(prim)
            if prim in module.UNSUPPORTED:
                assert exporter.UNSUPPORTED[prim] == module.UNSUPPORTED[prim]


_EXPORT_FINGERPRINT = """
import importlib, sys
for name in sys.argv[2:]:
    importlib.import_module(name)
exporter = importlib.import_module(f"anfir.interop.{sys.argv[1]}.exporter")
print(sorted((p.name, r.__module__, getattr(r, '__qualname__', '')) for p, r in exporter.RULES.items()))
print(sorted((p.name, reason) for p, reason in exporter.UNSUPPORTED.items()))
"""


@pytest.mark.parametrize("room", ["onnx", "coreml"])
def test_export_table_does_not_depend_on_which_family_is_imported_first(room: str) -> None:
    families = ["arith", "elementwise", "tensor", "reduce", "shaping", "indexing", "nn", "conv", "structure",
                "gradient"]
    mods = [f"anfir.interop.{room}.export_rules.{f}" for f in families]
    outputs = []
    for order in (mods, list(reversed(mods)), [f"anfir.interop.{room}.exporter"]):
        done = subprocess.run([sys.executable, "-c", _EXPORT_FINGERPRINT, room, *order], cwd=ROOT, check=True,
                              capture_output=True, text=True, timeout=300)
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1] == outputs[2] and outputs[0].count("\n") == 2

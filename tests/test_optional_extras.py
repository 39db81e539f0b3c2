"""Optional really is optional: with only ``pip install -e .`` (no extra), anfir
imports, runs, compiles and differentiates, and every feature that needs an
extra says which one in a one-line ``missing dependency`` error — from the API
and from the command line — never an ``ImportError`` or a traceback.

The extras are hidden in a fresh interpreter (``sys.modules[name] = None``
makes ``import name`` raise ImportError whether or not it is installed), so the
test runs in the README's venv, where they are all installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

HIDDEN = ("onnx", "onnxruntime", "jax", "jaxlib", "torch", "coremltools", "transformers")
"""Every optional package (the extras' and the test references')."""

SCRIPT = textwrap.dedent("""
    import contextlib, io, json, sys
    HIDDEN = {hidden!r}
    for name in HIDDEN:
        sys.modules[name] = None
    import numpy as np
    import anfir
    from anfir.cli import main

    out = {{}}
    mod = anfir.load("examples/power.anf")
    out["run"] = anfir.run(mod["dpower"], 3.0)
    out["grad"] = anfir.run(anfir.grad(mod["power"]), 2.0, 3)
    out["compile"] = anfir.run(anfir.compile(mod, entry="dpower", args=[3.0]), 3.0)
    mlp = anfir.load("examples/mlp.anf")

    def api_error(call):
        try:
            call()
        except anfir.AnfirError as error:
            return [type(error).__name__, str(error)]
        except BaseException as error:  # anything else is the failure under test
            return [type(error).__name__, repr(error)]
        return ["no error", ""]

    out["to_jax"] = api_error(lambda: anfir.to_jax(mod, entry="dpower"))
    out["export_onnx"] = api_error(lambda: anfir.export_onnx(mlp, entry="mlp_loss"))
    out["export_coreml"] = api_error(lambda: anfir.export_coreml(mlp, entry="mlp_loss"))
    out["import_onnx"] = api_error(lambda: anfir.import_onnx("model.onnx"))
    out["import_torch"] = api_error(lambda: anfir.import_torch(object()))

    def cli(*args):
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                status = main(list(args))
            except SystemExit as stop:
                status = stop.code
        return [status, stdout.getvalue(), stderr.getvalue()]

    out["cli_grad"] = cli("grad", "examples/power.anf", "--entry", "power", "2.0", "3")
    out["cli_jax"] = cli("run", "examples/power.anf", "--entry", "dpower", "--backend", "jax", "3.0")
    out["cli_export_onnx"] = cli("export", "examples/mlp.anf", "--entry", "mlp_loss",
                                 "-o", "{tmp}/m.onnx")
    out["cli_export_coreml"] = cli("export", "examples/mlp.anf", "--entry", "mlp_loss",
                                   "--to", "coreml", "-o", "{tmp}/m.mlpackage")
    open("{tmp}/m.onnx", "wb").write(b"not a model")
    open("{tmp}/m.pt2", "wb").write(b"not a model")
    out["cli_import_onnx"] = cli("import", "{tmp}/m.onnx")
    out["cli_import_torch"] = cli("import", "{tmp}/m.pt2")
    out["loaded"] = sorted(name for name in HIDDEN if sys.modules.get(name) is not None)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def without_extras(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("no_extras")
    code = SCRIPT.format(hidden=HIDDEN, tmp=tmp)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_core_works_without_any_extra(without_extras: dict) -> None:
    assert without_extras["run"] == 27.0
    assert without_extras["grad"] == 12.0
    assert without_extras["compile"] == 27.0
    status, out, err = without_extras["cli_grad"]
    assert (status, out.strip(), err) == (0, "12.0", "")
    assert without_extras["loaded"] == []


@pytest.mark.parametrize("feature, extra", [
    ("to_jax", "jax"), ("export_onnx", "onnx"), ("export_coreml", "coreml"),
    ("import_onnx", "onnx"), ("import_torch", "torch")])
def test_each_api_feature_names_its_extra(without_extras: dict, feature: str, extra: str) -> None:
    kind, message = without_extras[feature]
    assert kind == "MissingDependencyError", (kind, message)
    assert message.startswith("missing dependency") and "\n" not in message.strip(), message
    assert f'pip install "anfir[{extra}]"' in message, message


@pytest.mark.parametrize("command, extra", [
    ("cli_jax", "jax"), ("cli_export_onnx", "onnx"), ("cli_export_coreml", "coreml"),
    ("cli_import_onnx", "onnx"), ("cli_import_torch", "torch")])
def test_each_command_names_its_extra(without_extras: dict, command: str, extra: str) -> None:
    status, out, err = without_extras[command]
    assert status == 1 and out == "", (status, out, err)
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "missing dependency" in err and f'pip install "anfir[{extra}]"' in err, err

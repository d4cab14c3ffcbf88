"""`lagom-jax analyze`: called through ``cli.main`` with explicit arguments."""

from __future__ import annotations

import io
import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from lagom_jax import cli
from lagom_jax.plan import report
from lagom_jax.program import hlo

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hlo"


def test_json_is_one_object_with_the_contract(capsys):
    assert cli.main(["analyze", "--json", str(FIXTURES / "gpu_collectives.hlo")]) == 0
    out = capsys.readouterr().out
    result = json.loads(out)  # exactly one JSON document
    expected = report.analyze(hlo.parse((FIXTURES / "gpu_collectives.hlo").read_text()))
    assert result == expected
    assert [c["kind"] for c in result["collectives"]] == [
        "all-reduce", "collective-permute", "all-to-all", "all-gather",
    ]


def test_table_for_builtin_example(capsys):
    assert cli.main(["analyze", "--example"]) == 0
    out = capsys.readouterr().out
    assert "jit_train_step" in out and "reduce-scatter-start" in out and "TFLOP" in out


def test_gpus_per_node_adds_nodes_column(capsys):
    assert cli.main(["analyze", "--example", "--gpus-per-node", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[1].split()
    assert header[-1] == "nodes"
    row = next(line.split() for line in lines if line.startswith("all-gather-start "))
    assert row[-1] == "2"  # 8 devices in one group over nodes of 4 GPUs


def test_stdin(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", io.StringIO((FIXTURES / "gpu_bare_names.hlo").read_text()))
    assert cli.main(["analyze", "--json", "-"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["module"] == "pipelined_step"
    assert {c["trip_count"] for c in result["collectives"]} == {6, 2}


def test_bad_file_exits_2_with_the_parse_error(tmp_path, capsys):
    bad = tmp_path / "bad.hlo"
    bad.write_text("HloModule m\nENTRY e {\n  a = f32[2] parameter(0)\n  b = f32[2] negate(zz)\n}\n")
    assert cli.main(["analyze", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "line 4, col 21: operand 'zz' is not defined" in err and "Traceback" not in err


def test_missing_file_and_bad_arguments_exit_2(tmp_path, capsys):
    assert cli.main(["analyze", str(tmp_path / "nope.hlo")]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert cli.main(["analyze"]) == 2
    assert "missing PATH" in capsys.readouterr().err
    assert cli.main(["analyze", "--example", "--gpus-per-node", "0"]) == 2
    assert "--gpus-per-node must be positive" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("lagom-jax") is None, reason="console script not installed")
def test_console_script():
    proc = subprocess.run(["lagom-jax", "analyze", "--example", "--json"],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["module"] == "jit_train_step"

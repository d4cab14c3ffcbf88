"""The simulate / tune / build-tuner / profile subcommands, called as functions."""

import json
import re

import pytest

from lagom_jax import Plan, cli


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_simulate_json_contract_and_trace(tmp_path, capsys):
    trace = tmp_path / "t.json"
    assert cli.main(["simulate", "--example", "--hardware", "a100-sxm-8", "--json",
                     "--trace", str(trace)]) == 0
    out = _json(capsys)
    for key in ("makespan_us", "bound_us", "compute_us", "comm_us", "exposed_comm_us"):
        assert out[key] >= 0
    assert out["makespan_us"] >= out["bound_us"] > 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["args"]["name"] for e in events if e.get("name") == "thread_name"} >= {"compute", "comm0"}


def test_tune_hlo_json_contract(capsys):
    assert cli.main(["tune", "--example", "--hardware", "a40-pcie-8", "--json"]) == 0
    out = _json(capsys)
    assert set(out["strategies"]) == {"lagom", "xla-default", "recipe", "autoccl"}
    lagom = out["strategies"]["lagom"]["makespan_us"]
    assert all(lagom <= s["makespan_us"] + 1e-6 for s in out["strategies"].values())
    assert out["bound_us"] <= lagom
    assert out["strategies"]["lagom"]["evaluations"] > 0
    assert out["xla_flags"].startswith("--xla_gpu_")


@pytest.mark.slow
def test_main_job_on_a_tiny_model_writes_every_artifact(tmp_path, capsys):
    out_dir = tmp_path / "out"
    assert cli.main(["tune", "--no-structures", "--model", "gpt2", "--config", "tiny", "--mesh", "data=2,model=4",
                     "--hardware", "h100-sxm-8", "--out", str(out_dir)]) == 0
    captured = capsys.readouterr()
    text = captured.out
    assert "lagom-jax plan for" in text and "XLA_FLAGS" in text and "predicted gain" in text
    # Every progress line says when it came and how long the stage before it took.
    progress = [line for line in captured.err.splitlines() if line.startswith("lagom-jax [")]
    assert len(progress) >= 3
    assert all(re.match(r"lagom-jax \[\d+\.\d s, \+\d+\.\d s\]: ", line) for line in progress), progress
    names = {p.name for p in out_dir.iterdir()}
    assert names >= {"plan.json", "report.txt", "xla_flags.txt", "nccl_env.sh", "nccl_tuner.conf",
                     "lhs_profile.pbtxt", "launch.sh", "trace.json", "timeline.png"}
    plan = Plan.load(out_dir / "plan.json")
    assert (out_dir / "xla_flags.txt").read_text().strip() == plan.xla_flags()
    assert plan.collectives


@pytest.mark.parametrize(
    "argv, message",
    [
        (["tune", "--example", "--hardware", "h10"], "unknown hardware 'h10'"),
        (["tune", "--no-structures", "--model", "gpt2", "--config", "tiny", "--hardware", "h10"], "unknown hardware 'h10'"),
        (["tune", "--example", "--strategy", "exhaustive"], "exhaustive search"),
        (["simulate", "--example", "--nodes", "0"], "--nodes must be positive"),
        (["tune", "--example", "--model", "gpt2"], "not several"),
        (["tune", "--no-structures", "--model", "gpt2", "--config", "tiny", "--seq-len", "99"], "seq_len 99 outside"),
        (["tune", "--model", "gpt2", "--mesh", "data=two"], "data=two"),
        (["tune", "--model", "gpt2", "--batch-size", "-2"], "--batch-size must be positive, got -2"),
        (["tune", "--model", "bert", "--batch-size", "0"], "--batch-size must be positive, got 0"),
        (["tune", "--model", "t5", "--seq-len", "0"], "--seq-len must be positive, got 0"),
        (["advise", "--model", "gpt2", "--devices", "0"], "--devices must be positive, got 0"),
        (["advise", "--model", "gpt2", "--global-batch", "-1"], "--global-batch must be positive"),
        (["tune", "--no-structures", "--model", "gpt2", "--config", "tiny", "--mesh", "data=3,model=4"],
         "a mesh of 12 GPUs is not a whole number of h100-sxm-8 nodes (8 GPUs each): use a mesh of 8 or 16 GPUs"),
        (["tune", "--no-structures", "--model", "gpt2", "--config", "tiny", "--mesh", "data=16", "--nodes", "4"],
         "a mesh of 16 GPUs needs 2 h100-sxm-8 nodes, but the cluster has 4"),
        (["tune", "--no-structures", "--model", "gpt2", "--config", "tiny", "--mesh", "data=6", "--batch-size", "8"],
         "batch size 8 is not a multiple of the 6 data-parallel ranks"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(argv, message, capsys):
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert message in captured.err and not captured.out
    assert captured.err.strip().splitlines()[-1].startswith("lagom-jax ")  # one line, no traceback
    assert "Traceback" not in captured.err


def test_build_tuner_prints_the_launch_variable(tmp_path, capsys):
    assert cli.main(["build-tuner", "--out", str(tmp_path)]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line == f"NCCL_TUNER_PLUGIN={tmp_path / 'libnccl-tuner-lagom.so'}"
    assert (tmp_path / "libnccl-tuner-lagom.so").exists()


@pytest.mark.slow
def test_advise_ranks_configurations(capsys):
    """gpt2 through the one search: the mesh the screen puts fastest probed and searched (one
    sequence per GPU: its remat policies and the other attention, no batch to bisect)."""
    assert cli.main(["advise", "--model", "gpt2", "--config", "tiny", "--devices", "8", "--global-batch", "8",
                     "--seq-len", "16", "--max-probes", "1", "--mesh-finalists", "1", "--no-tune", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["family"] == "gpt2" and out["candidates"] and out["candidates"][0]["fits"]
    with pytest.raises(SystemExit, match="2"):  # the first adviser's option is gone
        cli.main(["advise", "--model", "gpt2", "--top-k", "1"])


def test_out_naming_a_file_is_refused_before_any_work(tmp_path, capsys):
    target = tmp_path / "taken"
    target.write_text("mine")
    assert cli.main(["tune", "--example", "--out", str(target)]) == 2
    captured = capsys.readouterr()
    assert "exists and is not a directory" in captured.err and not captured.out
    assert target.read_text() == "mine"


def test_out_writes_a_launch_script_that_applies_the_whole_plan(tmp_path, capsys):
    import os
    import stat

    out_dir = tmp_path / "plan"
    assert cli.main(["tune", "--example", "--hardware", "a40-pcie-8", "--out", str(out_dir)]) == 0
    text = capsys.readouterr().out
    launch = out_dir / "launch.sh"
    assert f"{launch} python train.py" in text
    assert os.stat(launch).st_mode & stat.S_IXUSR
    assert oct(os.stat(out_dir / "plan.json").st_mode & 0o777) == oct(0o666 & ~_umask())
    script = launch.read_text()
    plan = Plan.load(out_dir / "plan.json")
    assert 'export NCCL_TUNER_PLUGIN="$here/libnccl-tuner-lagom.so"' in script
    assert 'export LAGOM_TUNER_CONFIG="$here/nccl_tuner.conf"' in script
    assert (out_dir / "libnccl-tuner-lagom.so").exists()
    flags = (out_dir / "xla_flags.txt").read_text()
    assert flags == (plan.xla_flags() + "\n" if plan.flags else "")
    if plan.flags:
        assert plan.xla_flags() in script
    assert script.rstrip().endswith('exec "$@"')
    # The script runs a command with everything set.
    import subprocess

    env_out = subprocess.run([str(launch), "env"], capture_output=True, text=True, check=True).stdout
    assert f"LAGOM_TUNER_CONFIG={out_dir / 'nccl_tuner.conf'}" in env_out


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_simulate_and_tune_agree_on_the_untuned_step(capsys):
    assert cli.main(["simulate", "--example", "--hardware", "h100-sxm-8", "--json"]) == 0
    simulated = _json(capsys)["makespan_us"]
    assert cli.main(["tune", "--example", "--hardware", "h100-sxm-8", "--json"]) == 0
    assert _json(capsys)["strategies"]["xla-default"]["makespan_us"] == pytest.approx(simulated, rel=1e-12)


def test_simulate_png_without_matplotlib_is_one_line(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert cli.main(["simulate", "--example", "--png", str(tmp_path / "t.png")]) == 2
    captured = capsys.readouterr()
    assert "--png needs matplotlib" in captured.err and not captured.out
    assert not (tmp_path / "t.png").exists()


@pytest.mark.slow
def test_the_default_batch_is_one_sequence_per_data_parallel_rank(capsys):
    from lagom_jax.models import default_batch

    assert default_batch({"fsdp": 6}) == 6
    assert default_batch({"data": 2, "fsdp": 4, "model": 2}) == 8
    assert default_batch({"data": 2, "stage": 2, "model": 2}) == 8  # two micro-batches per stage
    # A mesh of 6 data-parallel ranks works without --batch-size (the old default of 8 did not).
    assert cli.main(["tune", "--no-structures", "--model", "gpt2", "--config", "tiny", "--mesh", "data=6",
                     "--json"]) == 0
    capsys.readouterr()


@pytest.mark.slow
def test_without_the_structure_search_no_structure_is_claimed(capsys):
    assert cli.main(["tune", "--no-structures", "--model", "gpt2", "--config", "tiny", "--mesh", "data=2"]) == 0
    out = capsys.readouterr().out
    assert "best structure found" not in out and "the structure search did not run" in out


@pytest.mark.slow
def test_a_mesh_smaller_than_a_node_is_said(capsys):
    assert cli.main(["tune", "--no-structures", "--model", "gpt2", "--config", "tiny", "--mesh", "data=4",
                     "--hardware", "h100-sxm-8", "--json"]) == 0
    assert "uses 4 of the 8 GPUs" in capsys.readouterr().err


def test_tune_min_gain_is_a_real_option(capsys):
    assert cli.main(["tune", "--example", "--hardware", "a40-pcie-8", "--json", "--min-gain", "0"]) == 0
    out = _json(capsys)
    assert out["min_gain"] == 0 and out["held_back_us"] == 0
    with pytest.raises(SystemExit) as err:
        cli.main(["tune", "--example", "--min-gain", "1.5"])
    assert err.value.code == 2 and "a fraction in [0, 1)" in capsys.readouterr().err


@pytest.mark.parametrize("verbose", [False, True])
def test_xlas_log_lines_stay_off_the_terminal_unless_verbose(verbose):
    import subprocess
    import sys

    # What a compile that does not fit logs from C++, then a warning of our own.
    script = (
        "import os\n"
        "from lagom_jax import quiet\n"
        f"quiet.filter_stderr(xla_logs={verbose})\n"
        "os.write(2, b'W0000 00:00:1795.5 5695 hlo_rematerialization.cc:3121] Involuntary full rematerialization\\n')\n"
        "os.write(2, b'E0000 00:00:1795.6 5695 gpu_compiler.cc:2104] something else\\n')\n"
        "os.write(2, b'lagom-jax: warning: a line of ours\\n')\n"
    )
    err = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120).stderr
    assert "a line of ours" in err
    assert ("Involuntary full rematerialization" in err) == verbose
    assert ("2 log line(s) of XLA's kept off the terminal (--verbose shows them)" in err) == (not verbose)
    parser = cli.build_parser()
    assert parser.parse_args(["--verbose", "tune", "--example"]).verbose

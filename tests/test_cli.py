"""The simulate / tune / build-tuner / profile subcommands, called as functions."""

import json

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


def test_main_job_on_a_tiny_model_writes_every_artifact(tmp_path, capsys):
    out_dir = tmp_path / "out"
    assert cli.main(["tune", "--model", "gpt2", "--config", "tiny", "--mesh", "data=2,model=4",
                     "--hardware", "h100-sxm-8", "--out", str(out_dir)]) == 0
    text = capsys.readouterr().out
    assert "lagom-jax plan for" in text and "XLA_FLAGS" in text and "predicted gain" in text
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
        (["tune", "--model", "gpt2", "--config", "tiny", "--hardware", "h10"], "unknown hardware 'h10'"),
        (["tune", "--example", "--strategy", "exhaustive"], "exhaustive search"),
        (["simulate", "--example", "--nodes", "0"], "--nodes must be positive"),
        (["tune", "--example", "--model", "gpt2"], "not several"),
        (["tune", "--model", "gpt2", "--config", "tiny", "--seq-len", "99"], "seq_len 99 outside"),
        (["tune", "--model", "gpt2", "--mesh", "data=two"], "data=two"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_build_tuner_prints_the_launch_variable(tmp_path, capsys):
    assert cli.main(["build-tuner", "--out", str(tmp_path)]) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line == f"NCCL_TUNER_PLUGIN={tmp_path / 'libnccl-tuner-lagom.so'}"
    assert (tmp_path / "libnccl-tuner-lagom.so").exists()


def test_advise_ranks_configurations(capsys):
    assert cli.main(["advise", "--model", "gpt2", "--config", "tiny", "--devices", "8",
                     "--global-batch", "16", "--seq-len", "16", "--top-k", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["candidates"] and out["recommendation"]

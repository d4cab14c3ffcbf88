"""``lagom-jax bench``: arms run as fresh jobs of 2 processes x 4 CPU devices over jax.distributed
(gloo), interleaved, summarised with a 95% interval, resumed, and failures kept apart."""

from __future__ import annotations

import json
import shutil

import pytest

from lagom_jax import cli
from lagom_jax.bench import launch, report, run, stats
from lagom_jax.program import gpu_compile

ARGS = ["bench", "--model", "llama", "--config", "tiny", "--mesh", "fsdp=8", "--batch-size", "8", "--seq-len", "16",
        "--processes", "2", "--steps", "6", "--warmup", "1", "--rounds", "1", "--arms", "lagom"]


def test_the_interval_is_the_sign_tests_and_needs_six_steps():
    s = stats.summarize([10, 1, 9, 2, 8, 3, 7, 4, 6, 5])
    assert (s.n, s.median_ms, s.low_ms, s.high_ms) == (10, 5.5, 2, 9)  # x(2), x(9): 97.9% for n = 10
    few = stats.summarize([1.0, 2.0, 3.0])
    assert not few.bracketed and (few.low_ms, few.high_ms) == (1.0, 3.0)
    assert "fewer than 6" in stats.verdict(few, stats.summarize([5.0, 6.0, 7.0]), "lagom", "xla-default")
    fast, slow = stats.summarize([1.0] * 6), stats.summarize([2.0] * 6)
    assert "faster" in stats.verdict(fast, slow, "lagom", "xla-default") and "2.000x" in stats.verdict(
        fast, slow, "lagom", "xla-default")
    assert "do not differ" in stats.verdict(stats.summarize([1, 2, 3, 4, 5, 6]), stats.summarize([2, 3, 4, 5, 6, 7]),
                                            "lagom", "xla-default")
    with pytest.raises(ValueError, match="no step times"):
        stats.summarize([])


def test_launchers_are_the_clusters_own(tmp_path):
    sh, spec = tmp_path / "launch.sh", tmp_path / "s.json"
    assert launch.command("srun", sh, spec, 16)[:2] == ["srun", "--ntasks=16"]
    assert launch.command("mpirun", sh, spec, 4)[:3] == ["mpirun", "-np", "4"]
    assert launch.command("local", sh, spec, 2)[0] == str(sh)
    with pytest.raises(ValueError, match="unknown launcher 'pbs'"):
        launch.command("pbs", sh, spec, 2)


def test_an_arm_that_crashes_is_reported_with_its_last_lines(tmp_path):
    sh = tmp_path / "launch.sh"
    sh.write_text("#!/usr/bin/env bash\necho 'the first line' >&2\necho 'boom: the arm broke' >&2\nexit 7\n")
    sh.chmod(0o755)
    got = launch.run_arm("local", sh, {"processes": 2}, timeout_s=60)
    assert got.result is None and "exited with status 7" in got.error and "boom: the arm broke" in got.error


@pytest.fixture(scope="module")
def benched(tmp_path_factory):
    if gpu_compile.unavailable_reason() is not None:
        pytest.skip(f"no deviceless GPU compile: {gpu_compile.unavailable_reason()}")
    out = tmp_path_factory.mktemp("bench") / "run"
    assert cli.main([*ARGS, "--out", str(out)]) == 0
    return out


@pytest.mark.slow
def test_a_bench_of_two_processes_measures_every_arm_and_says_what_applied(benched, capsys):
    made = json.loads((benched / "report.json").read_text())
    arms = {a["name"]: a for a in made["arms"]}
    assert set(arms) == {"xla-default", "lagom"}
    for arm in arms.values():
        assert arm["measured"]["n"] == 6 and not arm["errors"] and arm["platform"] == "cpu"
        assert arm["measured"]["low_ms"] <= arm["measured"]["median_ms"] <= arm["measured"]["high_ms"]
    assert arms["xla-default"]["applied"] == {} and arms["xla-default"]["flags"] == ""
    lagom = arms["lagom"]
    assert lagom["flags"] and all(v.startswith("parsed by XLA at start") for v in lagom["applied"].values())
    assert "xla-default" in made["verdict"] and "lagom" in made["verdict"]
    assert (benched / "report.md").read_text().startswith("# lagom-jax bench")
    rows = (benched / run.MEASUREMENTS).read_text().splitlines()
    assert len(rows) == 3  # the setup, then one line per (arm, round)


@pytest.mark.slow
def test_a_rerun_resumes_and_keeps_what_was_measured(benched, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(benched, copy)
    before = (copy / run.MEASUREMENTS).read_text()
    assert cli.main([*ARGS, "--out", str(copy)]) == 0
    assert "measured before, kept" in capsys.readouterr().err
    assert (copy / run.MEASUREMENTS).read_text() == before
    other = [a if a != "6" else "7" for a in ARGS]  # another setup in the same folder: refused
    assert cli.main([*other, "--out", str(copy)]) == 2
    assert "holds a bench of another setup" in capsys.readouterr().err


@pytest.mark.slow
def test_a_plan_folder_of_another_step_is_refused_in_one_line(benched, tmp_path, capsys):
    folder = tmp_path / "plan"
    shutil.copytree(benched / "arms" / "lagom", folder)
    plan = json.loads((folder / "plan.json").read_text())
    plan["fingerprint"] = "0" * 64
    (folder / "plan.json").write_text(json.dumps(plan))
    assert cli.main([*ARGS, "--plan", str(folder), "--out", str(tmp_path / "out")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "its plan is of another step" in errors[0]


def test_bad_setups_are_one_line_each(tmp_path, capsys):
    three = [a if a != "2" else "3" for a in ARGS]  # 3 processes cannot hold a mesh of 8 devices evenly
    assert cli.main([*three, "--out", str(tmp_path)]) == 2
    assert "is not the mesh's 8 devices" in capsys.readouterr().err
    with pytest.raises(ValueError, match="steps must be at least 1"):
        run.BenchSetup(run.job.ModelSource("llama", "tiny"), steps=0)


def test_a_failed_or_unapplied_arm_is_never_compared():
    arm = report.ArmResult("lagom", "--x=1", 1.0, stats.summarize([1.0] * 6), 1, "cpu",
                           (("xla_gpu_x", "not applied: XLA_FLAGS has None, not '1'"),), ())
    base = report.ArmResult("xla-default", "", 1.0, None, 0, "?", (), ("process 0 exited with status 1:\nboom",))
    made = report.Report((base, arm), "v", "h100-sxm-8", "s")
    text = made.markdown()
    assert "| xla-default | failed |" in text and "| lagom | not applied |" in text and "boom" in text


PROGRAM = """
import sys
import jax
import jax.numpy as jnp
import lagom_jax

@lagom_jax.tune(hardware="h100-sxm-8", plan_dir=sys.argv[1] if len(sys.argv) > 1 else None)
@jax.jit
def step(w, x):
    return w - 0.1 * jax.grad(lambda w: jnp.mean(jnp.tanh(x @ w) ** 2))(w)

w, x = jnp.ones((64, 64)) * 0.01, jnp.ones((16, 64))
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 10):
    w = step(w, x)
"""


def test_a_users_program_reports_its_step_times_through_the_decorator(tmp_path, capsys):
    import sys

    program = tmp_path / "train.py"
    program.write_text(PROGRAM)
    assert __import__("subprocess").run([sys.executable, str(program), str(tmp_path / "plans"), "1"]).returncode == 0
    (folder,) = (tmp_path / "plans").iterdir()
    args = ["bench", "--plan", str(folder), "--warmup", "2", "--rounds", "1", "--out", str(tmp_path / "out"),
            "--profile", "--", sys.executable, str(program)]
    assert cli.main(args) == 0
    made = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [a["name"] for a in made["arms"]] == ["xla-default", folder.name]
    assert all(a["measured"]["n"] == 7 for a in made["arms"])  # 10 calls: 9 intervals, 2 of them warm-up
    assert folder.name in made["verdict"]
    # --profile: one more run of the plan's arm, whose decorated step traced a few calls for calibrate.
    assert (tmp_path / "out" / "profile" / "step.hlo").exists()
    assert "## Calibration" in (tmp_path / "out" / "report.md").read_text()
    args.remove("--profile")
    # A program that reports no step after the warm-up is a failed run, and the report says why.
    short = [*args[:-2], sys.executable, str(program), str(tmp_path / "unused"), "2"]
    short[short.index("--out") + 1] = str(tmp_path / "short")
    assert cli.main(short) == 0
    text = (tmp_path / "short" / "report.md").read_text()
    assert "| xla-default | failed |" in text and "reported no step times after the warm-up" in text

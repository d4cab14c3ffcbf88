"""``lagom-jax bench --search K`` (the model proposes, a measurement decides) and ``--profile``
(a trace of lagom's arm fitted by ``calibrate``), on what they decide from, without a job."""

from __future__ import annotations

import dataclasses
import pathlib
import types

import jax
import jax.numpy as jnp
import pytest

from lagom_jax.bench import report, run, stats, worker
from lagom_jax.cluster import hardware


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What the bench reads of a plan: its strategy, predictions and tuner rules."""

    strategy: str
    predicted_us: tuple[tuple[str, float], ...]
    rules: str = ""
    makespan_us: float = 0.0

    def nccl_tuner_config(self) -> str:
        return self.rules


def _arm(tmp_path: pathlib.Path, name: str, us: float, settings=(), tuner=False, rules="") -> run.Arm:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    (folder / "launch.sh").write_text("#!/usr/bin/env bash\nexec \"$@\"\n")
    strategy = "xla-default" if name == "xla-default" else "lagom"
    plan = _Plan(strategy, ((strategy, us), ("xla-default", 1000.0)), rules, us)
    return run.Arm(name, folder, plan, tuple(settings), tuner)


def test_search_measures_the_k_best_plans_no_two_setting_the_same(tmp_path, capsys):
    arms = [_arm(tmp_path, "lagom", 800, [("xla_a", "1"), ("NCCL_X", "2")], True, "r1"),
            _arm(tmp_path, "lagom-no-structure", 850, [("NCCL_X", "2")], True, "r1"),
            _arm(tmp_path, "lagom-no-nccl-settings", 820, [("xla_a", "1"), ("NCCL_X", "2")], True, "r1"),
            _arm(tmp_path, "autoccl", 900, [], True, "r2"),
            _arm(tmp_path, "recipe", 990, [("xla_b", "1")])]
    said = []
    kept = run._best_distinct(arms, 3, said.append)
    assert [a.name for a in kept] == ["lagom", "lagom-no-structure", "autoccl"]
    assert any("lagom-no-nccl-settings sets what a plan predicted faster sets" in s for s in said)
    assert run.changes(arms[0]) == 3  # two settings and the tuner's rules


def _result(name: str, times: list[float], applied=()) -> report.ArmResult:
    return report.ArmResult(name, "", 1.0, stats.summarize(times), 1, "cpu", tuple(applied), ())


def _made(results: list[report.ArmResult]) -> report.Report:
    return report.Report(tuple(results), "", "h100-sxm-8 (1 node(s) x 8 GPUs)", "")


SETUP = run.BenchSetup(None, program=("python", "train.py"), rounds=2)


def test_the_models_pick_stands_unless_a_measurement_beats_it_beyond_the_noise(tmp_path):
    arms = [_arm(tmp_path, "xla-default", 1000), _arm(tmp_path, "lagom", 800, [("xla_a", "1")], True),
            _arm(tmp_path, "autoccl", 900, [("xla_b", "1")])]
    out = tmp_path / "out"
    noisy = [_result("xla-default", [10, 11, 12, 13, 14, 15]), _result("lagom", [10.5, 11, 12, 13, 14, 15]),
             _result("autoccl", [9, 10, 11, 12, 13, 14])]
    said = run._choose(_made(noisy), arms, out, SETUP, lambda _: None)
    assert "Chosen: lagom" in said and "the model's pick; no arm measured faster" in said
    assert (out / "chosen" / "launch.sh").exists()
    assert "6 runs (3 arms x 2 rounds)" in said
    assert "2 settings lagom's plan changes in every combination, blind, would take 4 arms x 2 rounds = 8 runs" in said
    clear = [noisy[0], noisy[1], _result("autoccl", [5, 5.1, 5.2, 5.3, 5.4, 5.5])]
    said = run._choose(_made(clear), arms, out, SETUP, lambda _: None)
    assert "Chosen: autoccl" in said and "faster than the model's pick, lagom, beyond the noise" in said


def test_an_arm_that_did_not_apply_is_never_chosen(tmp_path):
    arms = [_arm(tmp_path, "xla-default", 1000), _arm(tmp_path, "lagom", 800, [("xla_a", "1")])]
    results = [_result("xla-default", [10] * 6), _result("lagom", [1] * 6, [("xla_a", "not applied: ...")])]
    said = run._choose(_made(results), arms, tmp_path / "out", SETUP, lambda _: None)
    assert "Chosen: xla-default" in said


def test_search_and_profile_need_the_built_in_model(tmp_path):
    setup = run.BenchSetup(None, program=("python", "train.py"))
    with pytest.raises(ValueError, match="--search plans the built-in model's step"):
        run.bench(setup, hardware.get("h100-sxm-8"), tmp_path, plans=(tmp_path,), search_k=2)


def test_a_traced_arm_is_fitted_by_calibrate(tmp_path):
    """The worker's trace of a few steps and the module they ran, then ``_calibrated`` on them
    (as on a rerun, which reads the trace the first run left)."""
    f = jax.jit(lambda s, b: (jnp.tanh(s @ b), {"loss": jnp.sum(s)}))
    built = types.SimpleNamespace(train_step=f)
    state, batch = jnp.ones((256, 256)), jnp.full((256, 256), 0.01)
    folder = tmp_path / "out" / "profile"
    folder.mkdir(parents=True)
    worker._profile(built, state, batch, folder)
    assert (folder / "step.hlo").exists() and list(folder.rglob("*.xplane.pb"))
    arms = [_arm(tmp_path, "xla-default", 1000), _arm(tmp_path, "lagom", 800)]
    hw = hardware.get("h100-sxm-8")
    profile, said = run._calibrated(None, hw, tmp_path / "out", arms, "cpu", lambda _: None)
    assert said.startswith("## Calibration") and "| class | ops |" in said
    assert (tmp_path / "out" / "calibrated.json").exists()
    assert profile is None or profile.name == "h100-sxm-8-calibrated"


def test_a_decorated_step_traces_a_few_calls_for_the_bench(tmp_path, monkeypatch):
    """Under the bench's profile variable a user's decorated step traces calls 3-5 (after its
    compile and one warm call) and writes the module they ran, which ``calibrate`` reads."""
    import lagom_jax
    from lagom_jax.bench import protocol

    folder = tmp_path / "profile"
    folder.mkdir()
    monkeypatch.setenv(protocol.TIMES_ENV, str(tmp_path / "times.jsonl"))
    monkeypatch.setenv(protocol.PROFILE_ENV, str(folder))
    step = lagom_jax.tune(jax.jit(lambda s: jnp.tanh(s @ s)))
    x = jnp.ones((128, 128))
    for calls in range(1, protocol.PROFILE_AFTER + protocol.PROFILE_STEPS + 2):
        x = step(x)
        traced = (folder / "step.hlo").exists()
        assert traced == (calls >= protocol.PROFILE_AFTER + protocol.PROFILE_STEPS)
    assert "tanh" in (folder / "step.hlo").read_text() and list(folder.rglob("*.xplane.pb"))
    assert protocol.read(str(tmp_path / "times.jsonl"), 0)["times_ms"]


def test_recalibrate_needs_the_built_in_model(tmp_path):
    setup = run.BenchSetup(None, program=("python", "train.py"))
    with pytest.raises(ValueError, match="--recalibrate plans the built-in model's step again"):
        run.bench(setup, hardware.get("h100-sxm-8"), tmp_path, plans=(tmp_path,), recalibrate=True)

"""The GPU scripts (benchmarks/gpu/hlo.py, benchmarks/gpu/accuracy.py) on the CPU.

What needs a GPU cannot be checked here: the mock GPU topology is never set on the CPU
(the scripts refuse it; ``--allow-cpu`` runs on the 8 CPU devices instead), XLA:CPU has no
GPU combiners, async collectives or latency-hiding scheduler, so the comparison logic is
tested on synthetic StepGraphs, and the end-to-end runs only show that the flow works and
writes what it should.
"""

from __future__ import annotations

import json

import jax
import pytest
from jax._src import xla_bridge

from benchmarks import common
from benchmarks.gpu import accuracy as gpu_accuracy
from benchmarks.gpu import hlo as gpu_hlo
from lagom_jax.cluster import hardware
from lagom_jax.passes.combine import combine
from lagom_jax.program import graph as graph_lib, hlo
from lagom_jax.program.graph import StepGraph, Task

GROUP = ((0, 1, 2, 3, 4, 5, 6, 7),)


def _ar(i: int, nbytes: int, deps: tuple[int, ...], done_before: int | None = None) -> Task:
    return Task(i, f"all-reduce.{i}", "all-reduce", bytes=nbytes, deps=deps, groups=GROUP,
                done_before=done_before, is_async=True)


def _uncombined() -> StepGraph:
    tasks = [Task(0, "fusion.0", "compute", flops=10, bytes=10),
             _ar(1, 100, (0,)), _ar(2, 200, (0,)), _ar(3, 300, (0,)),
             Task(4, "fusion.4", "compute", flops=10, bytes=10, deps=(1, 2, 3))]
    return StepGraph("synthetic", tuple(tasks), 8)


def test_compare_combine_agrees_with_our_pass_and_flags_a_different_combiner():
    predicted = combine(_uncombined(), {"all-reduce": 1000})
    xla_same = StepGraph("real", (Task(0, "fusion.0", "compute"), _ar(1, 600, (0,))), 8)
    (a,) = gpu_hlo.compare_combine(xla_same, predicted, 1000)
    assert (a.kind, a.real_count, a.predicted_count, a.count_match, a.sizes_match) == ("all-reduce", 1, 1, True, True)
    # A combiner that stopped at 500 bytes: two calls (300 + 300) where we predict one.
    xla_split = StepGraph("real", (Task(0, "fusion.0", "compute"), _ar(1, 300, (0,)), _ar(2, 300, (0,))), 8)
    (b,) = gpu_hlo.compare_combine(xla_split, predicted, 1000)
    assert not b.count_match and not b.sizes_match and b.size_overlap == 0.0
    assert b.to_dict()["real_bytes"] == b.to_dict()["predicted_bytes"] == 600
    # A kind only one side has still gets a row.
    rows = gpu_hlo.compare_combine(xla_same, _uncombined(), 0)
    assert [(r.real_sizes, r.predicted_sizes) for r in rows] == [((600,), (100, 200, 300))]
    assert rows[0].size_overlap == 0.0


def test_diff_schedules_counts_moved_collectives_and_compute_under():
    def step(done_first: int) -> StepGraph:
        tasks = [_ar(0, 100, (), done_before=done_first), _ar(1, 100, (), done_before=4),
                 Task(2, "fusion.2", "compute", flops=5), Task(3, "fusion.3", "compute", flops=7),
                 Task(4, "fusion.4", "compute", flops=1, deps=(0, 1))]
        return StepGraph("s", tuple(tasks), 8)

    same = gpu_hlo.diff_schedules(step(3), step(3))
    assert same.collectives == 2 and same.moved == () and same.only_in_one == 0
    d = gpu_hlo.diff_schedules(step(3), step(4))
    assert d.moved == (("all-reduce.0", 0, 0),)
    assert [w.compute_under for w in d.before] == [1, 2] and [w.compute_under for w in d.after] == [2, 2]
    assert d.after[0].flops_under == 12
    # Costlier collective (all-reduce.1) with more compute under it: full agreement; reversed: -1.
    ranked = StepGraph("r", (_ar(0, 1, (), done_before=2), Task(1, "f", "compute"), _ar(2, 1, (), done_before=5),
                             Task(3, "g", "compute"), Task(4, "h", "compute"), Task(5, "k", "compute"),
                             _ar(6, 1, (), done_before=None)), 8)
    diff = gpu_hlo.diff_schedules(ranked, ranked)
    assert [w.compute_under for w in diff.after] == [1, 2, 0]
    assert gpu_hlo.rank_agreement({"all-reduce.0": 2.0, "all-reduce.2": 3.0, "all-reduce.6": 1.0}, diff) == 1.0
    assert gpu_hlo.rank_agreement({"all-reduce.0": 2.0, "all-reduce.2": 1.0, "all-reduce.6": 3.0}, diff) == -1.0
    assert gpu_hlo.rank_agreement({"all-reduce.0": 2.0}, diff) is None


def test_boosted_profile_and_sizes():
    text = gpu_hlo.boosted_profile({"a": 1.0, "b": 2.0}, "b", 10)
    assert text == 'costs { name: "a" cost_us: 1.000 }\ncosts { name: "b" cost_us: 20.000 }\n'
    with pytest.raises(gpu_hlo.GpuHloError, match="'c'"):
        gpu_hlo.boosted_profile({"a": 1.0}, "c", 2)
    assert [gpu_hlo._bytes(s) for s in ("1MiB", "32MiB", "1GiB", "4096")] == [1 << 20, 32 << 20, 1 << 30, 4096]
    assert set(gpu_hlo.threshold_options(0).values()) == {0} and len(gpu_hlo.threshold_options(0)) == 4


def test_scripts_refuse_the_cpu_without_allow_cpu(capsys):
    jax.devices()  # the backend is up (CPU), as in any test process
    assert gpu_hlo.main(["--out", "unused"]) == 2
    assert gpu_accuracy.main(["--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert "no GPU" in err or "needs a GPU" in err
    assert xla_bridge.MOCK_GPU_TOPOLOGY.value == ""  # never set on the CPU


@pytest.mark.slow
def test_gpu_hlo_flow_on_cpu_writes_parsable_fixtures(tmp_path):
    results_before = common.RESULTS_MD.read_text() if common.RESULTS_MD.exists() else None
    assert gpu_hlo.main(["--allow-cpu", "--out", str(tmp_path), "--models", "gpt2", "--recipes", "dp",
                         "--check", "gpt2:dp", "--thresholds", "1MiB", "--boost", "0"]) == 0
    (fixture,) = tmp_path.glob("*.hlo")
    assert fixture.name == "cpu_gpt2_dp.hlo"  # marked CPU: never mistaken for GPU HLO
    g = graph_lib.from_module(hlo.parse(fixture.read_text()))
    assert g.num_devices == 8 and any(t.kind == "all-reduce" for t in g.collectives)
    report = json.loads((tmp_path / "cpu_hlo_report.json").read_text())
    assert report["backend"] == "cpu" and report["fixtures"][0]["collectives"]["all-reduce"] >= 1
    assert {r["kind"] for r in report["combine"]} >= {"all-reduce"}
    assert report["fdo"]["collectives"] >= 1 and report["boost"] is None
    assert xla_bridge.MOCK_GPU_TOPOLOGY.value == ""
    assert (common.RESULTS_MD.read_text() if common.RESULTS_MD.exists() else None) == results_before


def test_gpu_accuracy_flow_on_cpu(tmp_path):
    measured = hardware.get("h100-sxm-8").__class__
    fast = hardware.get("h100-sxm-8")
    slow = measured(**{**fast.__dict__, "name": "slow-test", "achieved_tflops": fast.achieved_tflops / 100})
    slow.save(tmp_path / "hardware.json")
    report = gpu_accuracy.run(tmp_path, allow_cpu=True, config="tiny", warmup=1, repeats=1,
                              hw_profile=str(tmp_path / "hardware.json"), min_measured_us=0.0,
                              progress=lambda s: None)
    assert report.backend == "cpu" and report.steps_traced == 1
    assert report.before.per_op and report.after is not None
    # Same ops scored; a 100x slower matmul rate predicts at least as long for every op.
    before, after = dict((o, p) for o, _, p in report.before.per_op), dict((o, p) for o, _, p in report.after.per_op)
    assert before.keys() == after.keys() and all(after[o] >= before[o] for o in before)
    assert any(after[o] > before[o] for o in before)
    saved = json.loads((tmp_path / "cpu_accuracy.json").read_text())
    assert saved["before"]["mape_percent"] == pytest.approx(report.before.mape)
    assert "CPU run, NOT a GPU" in gpu_accuracy.markdown(report)

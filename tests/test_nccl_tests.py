"""`lagom-jax calibrate --nccl-tests`: nccl-tests logs read, and the preset's collective terms
fitted to them."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from lagom_jax import cli
from lagom_jax.cluster import hardware
from lagom_jax.costs import nccl_tests

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "nccl_tests"


def test_a_log_with_its_header_gives_ranks_and_nodes_from_its_rank_lines():
    got = nccl_tests.parse((FIXTURES / "all_reduce_perf_2x8.log").read_text(), "all_reduce_perf_2x8.log")
    assert len(got) == 22
    assert {(s.kind, s.ranks, s.nodes) for s in got} == {("all-reduce", 16, 2)}
    big = max(got, key=lambda s: s.nbytes)
    assert (big.nbytes, big.time_us) == (16 << 30, 66132.0)
    assert big.busbw_gbps == pytest.approx(487.1, rel=1e-3)  # as nccl-tests printed it


def test_a_log_without_its_header_counts_ranks_from_the_bandwidth_ratio():
    got = nccl_tests.parse((FIXTURES / "all_gather_perf.txt").read_text(), "all_gather_perf.txt", gpus_per_node=8)
    assert {(s.kind, s.ranks, s.nodes) for s in got} == {("all-gather", 16, 2)}
    assert [round(s.busbw_gbps) for s in got] == [131, 200, 235, 216, 276, 322, 329]


def test_the_collective_comes_from_the_log_when_the_file_does_not_name_it():
    text = (FIXTURES / "all_reduce_perf_2x8.log").read_text()
    assert {s.kind for s in nccl_tests.parse(text, "run-17.out")} == {"all-reduce"}  # busbw = 2(n-1)/n algbw
    started = "# Collective test starting: reduce_scatter_perf\n" + text
    assert {s.kind for s in nccl_tests.parse(started, "run-17.out")} == {"reduce-scatter"}
    gather = (FIXTURES / "all_gather_perf.txt").read_text()
    with pytest.raises(ValueError, match="all-gather from all-to-all"):
        nccl_tests.parse(gather, "run-18.out")
    assert nccl_tests.parse("no table here\n", "notes.txt") == []


def test_a_folder_is_read_whole_and_what_is_not_a_log_is_said(tmp_path):
    for f in FIXTURES.glob("*_perf*"):
        (tmp_path / f.name).write_text(f.read_text())
    (tmp_path / "slurm-1234.err").write_text("srun: job 1234 queued\n")
    samples, skipped = nccl_tests.read_dir(tmp_path)
    assert {s.kind for s in samples} == {"all-reduce", "all-gather"}
    assert skipped == ["slurm-1234.err: no nccl-tests rows"]
    with pytest.raises(ValueError, match="no nccl-tests output"):
        nccl_tests.read_dir(tmp_path / "slurm-1234.err")
    with pytest.raises(ValueError, match="does not exist"):
        nccl_tests.read_dir(tmp_path / "missing")


def _measured_on(hw: hardware.HardwareProfile) -> list[nccl_tests.Sample]:
    """What nccl-tests would print on ``hw`` if the cost model were exact."""
    out = []
    for nodes in (2, 4):
        for kind in ("all-reduce", "all-gather"):
            for size in (1 << 20, 16 << 20, 256 << 20, 2 << 30):
                s = nccl_tests.Sample(kind, size, 8 * nodes, nodes, 1.0)
                out.append(dataclasses.replace(s, time_us=nccl_tests.predicted_us(s, hw)))
    return out


def test_the_fit_finds_a_network_that_differs_from_the_preset():
    preset = hardware.get("p5")
    truth = dataclasses.replace(preset, net_busbw_gbps=300.0, net_latency_us=30.0)
    got = nccl_tests.fit(_measured_on(truth), preset)
    assert {f for f, _, _ in got.changed} <= set(nccl_tests.NET_FIELDS)
    assert got.profile.net_latency_us < preset.net_latency_us
    assert max(abs(e) for e in nccl_tests.errors(_measured_on(truth), got.profile)) < 0.05
    assert all(b.after <= b.before for b in got.bands)
    assert got.profile.network_assumption == ""


def test_the_fit_keeps_a_preset_that_already_predicts_the_logs():
    preset = hardware.get("p5")
    got = nccl_tests.fit(_measured_on(preset), preset)
    assert got.changed == ()
    assert got.kept and "across nodes" in got.kept[0]


def test_logs_of_another_node_size_are_refused():
    s = nccl_tests.Sample("all-reduce", 1 << 30, 8, 2, 1000.0)  # 4 GPUs a node
    with pytest.raises(ValueError, match="4 ranks a node"):
        nccl_tests.fit([s], hardware.get("p5"))


def test_calibrate_nccl_tests_writes_a_profile_hardware_takes(tmp_path, capsys):
    out = tmp_path / "p5-fitted.json"
    assert cli.main(["calibrate", "--nccl-tests", str(FIXTURES), "--hardware", "p5", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "all-reduce over 16 ranks on 2 node(s)" in printed and "all-gather over 16 ranks" in printed
    assert "| across nodes | all-reduce | >= 64 MiB |" in printed
    fitted = hardware.resolve_cluster(str(out)).hardware
    assert fitted.name == "p5-nccl-tests"
    assert cli.main(["calibrate", "--hardware", "p5"]) == 2  # neither a trace nor logs
    assert "nccl-tests logs (--nccl-tests DIR), one of them" in capsys.readouterr().err

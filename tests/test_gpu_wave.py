"""The one-call GPU wave (benchmarks/gpu/order.py, kernels.py, wave_report.py) on the CPU.

The probes need an NVIDIA GPU and CuPy; here the parts that do not are checked: how a case's
numbers are read, the kernels' flow on tiny shapes, the report built from the recorded raw
files of the 2026-11-25 H100 run, and rescoring a recorded per-op run without a GPU.
"""

from __future__ import annotations

import json
import pathlib
import shutil

import pytest

from benchmarks.gpu import accuracy as gpu_accuracy
from benchmarks.gpu import kernels as gpu_kernels
from benchmarks.gpu import order as gpu_order
from benchmarks.gpu import wave_report as gpu_wave_report
from lagom_jax.cluster import hardware

WAVE = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu" / "wave_2026-11-25"


def _case(**kw) -> gpu_order.Case:
    base = dict(kind="hold", order="dep", priority="normal", ctas=2,
                gemm_us=[100.0, 130.0, 130.0, 120.0], gemm_start_us=[0.0, 100.0, 230.0, 360.0],
                ready_us=98.0, cta_start_us=[99.0, 100.0], end_us=400.0, bytes_moved=0, alone_us=100.0)
    return gpu_order.Case(**{**base, **kw})


def test_a_case_counts_only_the_gemms_that_ran_inside_the_collective():
    c = _case()
    # GEMM 0 ran before the CTAs started, GEMM 3 outlived the collective: only 1 and 2 count
    # (a GEMM counts from the moment the last CTA is resident).
    assert c.overlapped() == [130.0, 130.0]
    s = c.summary()
    assert s["slowdown"] == pytest.approx(1.3) and s["overlapped_gemms"] == 2
    assert s["wait_first_cta_us"] == pytest.approx(1.0) and s["wait_last_cta_us"] == pytest.approx(2.0)
    assert _case(cta_start_us=[99.0, 101.0]).overlapped() == [130.0]  # a CTA late into GEMM 1
    assert s["gemms_before_last_cta"] == 1 and s["gbps"] is None


def test_a_collective_that_never_overlaps_has_no_slowdown():
    c = _case(cta_start_us=[500.0], end_us=600.0)
    assert c.overlapped() == [] and c.summary()["slowdown"] is None


def test_the_probe_refuses_without_cupy(monkeypatch, capsys):
    import builtins

    real = builtins.__import__

    def no_cupy(name, *a, **k):  # noqa: ANN001, ANN202
        if name == "cupy":
            raise ImportError("no cupy here")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_cupy)
    assert gpu_order.main(["--out", "unused"]) == 2
    assert "needs CuPy" in capsys.readouterr().err


@pytest.mark.slow
def test_kernel_rates_flow_on_cpu(tmp_path):
    assert gpu_kernels.main(["--out", str(tmp_path), "--quick", "--parts", "fp8"]) == 2  # no GPU, no --allow-cpu
    assert gpu_kernels.main(["--out", str(tmp_path), "--quick", "--allow-cpu", "--parts", "fp8,ragged,grouped,dispatch",
                             "--repeats", "1", "--inner", "1"]) == 0
    raw = json.loads((tmp_path / "cpu_kernels.json").read_text())
    assert {r["gemm"] for r in raw["fp8"]} == {"qkv", "o", "gate/up", "down", "405b qkv", "405b o", "405b gate/up",
                                               "405b down"}
    assert {r["dtype"] for r in raw["fp8"]} == {"bfloat16", "float8_e4m3fn", "fp8 delayed scaling (bf16 in)"}
    scaled = [r for r in raw["fp8"] if r["dtype"].startswith("fp8 delayed")]
    assert {r["pass"] for r in scaled} == {"forward", "forward+backward"} and all(r["f8_operands"] for r in scaled)
    assert all("error" not in r and r["median_us"] > 0 for r in raw["fp8"] + raw["ragged"] + raw["dispatch"])
    assert {r.get("flag") for r in raw["ragged"]} == {None, gpu_kernels.GROUPED_GEMM_FLAG}
    assert {(r["einsum"], r["pass"]) for r in raw["dispatch"]} == {
        (e, p) for e in ("dispatch", "combine") for p in ("forward", "forward+backward")}
    skewed = next(r for r in raw["ragged"] if r["groups"] == "skewed")
    assert sum(skewed["group_sizes"]) == skewed["m"] and skewed["group_sizes"][0] > skewed["group_sizes"][-1]
    # The grouped part: both implementations, both loads and passes, checked against XLA's.
    assert {(r["impl"], r["load"], r["pass"]) for r in raw["grouped"]} == {
        (i, load, p) for i in ("grouped kernel", "XLA ragged_dot") for load in (1.0, 2.0)
        for p in ("forward", "forward+backward")}
    assert all(r["rel_error"] < 1e-5 for r in raw["grouped"] if r["impl"] == "grouped kernel")
    assert max(r["busiest"] for r in raw["grouped"]) == 2 * min(r["busiest"] for r in raw["grouped"])
    with pytest.raises(SystemExit):
        gpu_kernels.main(["--allow-cpu", "--parts", "nonsense"])


def test_the_report_reads_the_recorded_h100_wave():
    orders = [json.loads(p.read_text()) for p in sorted(WAVE.glob("gpu_order*.json"))]
    md = gpu_wave_report.order_section(orders)
    assert len(orders) == 2 and "| hold | first | normal | 64 |" in md
    # Priority does not move a case beyond the run-to-run spread: the finding the text states.
    first = {(c["kind"], c["order"], c["priority"], c["ctas"]): c["slowdown"] for c in orders[0]["cases"]}
    for (kind, order, prio, k), sd in first.items():
        if prio == "high" and sd is not None:
            assert abs(sd - first[(kind, order, "normal", k)]) < 0.05
    raw = json.loads((WAVE / "gpu_kernels.json").read_text())
    mem = gpu_wave_report.memory_section(raw)
    assert "| 6 | 38.684 | 38.705 | 38.684 |" in mem and "| 9 |" in mem and "no:" in mem
    assert "| cudnn | 8192 | forward+backward |" in gpu_wave_report.kernels_section(raw, gpu_wave_report.WAVES[WAVE.name])


def test_the_report_reads_the_recorded_h200_wave_under_its_own_names(tmp_path):
    wave = WAVE.parent / "wave_2026-11-28"
    raw = json.loads((wave / "gpu_kernels.json").read_text())
    md = gpu_wave_report.kernels_section(raw, gpu_wave_report.WAVES[wave.name])
    assert md.startswith("## gpu_kernels_moe_fp8 ") and "attention (llama3-8b" not in md  # no attention part ran
    assert "| 405b down | 8192 x 16384 x 53248 | fp8 delayed scaling (bf16 in), forward+backward |" in md
    # The finding the text states: fp8 on fp8 operands runs at least 1.75x bf16 at every shape.
    by = {(r["gemm"], r["dtype"]): r["tflops"] for r in raw["fp8"]}
    for gemm in {r["gemm"] for r in raw["fp8"]}:
        assert by[(gemm, "float8_e4m3fn")] / by[(gemm, "bfloat16")] > 1.75
    unknown = tmp_path / "wave_1999-01-01"
    unknown.mkdir()
    assert gpu_wave_report.main([str(unknown)]) == 2


def test_forward_backward_is_the_pullback_of_a_random_cotangent():
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.key(0), 3)
    sets = [(jax.random.normal(keys[0], (8, 4)), jax.random.normal(keys[1], (4, 6)))]
    step, args = gpu_kernels.with_backward(jnp.dot, sets, 2, keys[2])
    a, b, ct = args[0]
    y, (da, db) = step(a, b, ct)
    assert jnp.allclose(y, a @ b) and jnp.allclose(da, ct @ b.T, atol=1e-5) and jnp.allclose(db, a.T @ ct, atol=1e-5)
    assert not jnp.allclose(ct, ct[0, 0])  # not a sum's all-ones cotangent


def test_a_recorded_run_rescores_without_a_gpu(tmp_path):
    import gzip

    for suffix in (".json", ".hlo.txt.gz"):
        shutil.copy(WAVE / f"gpu_accuracy_llama2_7b{suffix}", tmp_path)
    with gzip.open(tmp_path / "gpu_accuracy_llama2_7b.hlo.txt.gz", "rt") as f:
        (tmp_path / "gpu_accuracy_llama2_7b.hlo.txt").write_text(f.read())
    [(tag, then, now)] = gpu_accuracy.rescore(tmp_path)
    assert tag == "llama2_7b" and then > 0 and now > 0
    # Another preset prices the same measured ops differently.
    [(_, _, other)] = gpu_accuracy.rescore(tmp_path, hw_name="a100-sxm-8")
    assert other != pytest.approx(now)
    assert hardware.get("a100-sxm-8").achieved_tflops < hardware.get("h100-sxm-8").achieved_tflops


def test_the_report_reads_the_recorded_h200_probes_and_grouped_kernels():
    wave = WAVE.parent / gpu_wave_report.H200_PROBES
    raw = json.loads((wave / "gpu_order.json").read_text())
    md = gpu_wave_report.paced_section(raw, (wave / "machine.txt").read_text())
    assert "| paced | first | 16 |" in md and "| paced-reduce | dep | 64 |" in md
    # The finding the text states: paced at NCCL's channel rate costs at most 6% over holding the SMs (1-32 CTAs).
    by = {(c["kind"], c["order"], c["ctas"]): c["slowdown"] for c in raw["cases"]}
    for order in ("first", "dep"):
        for k in (1, 4, 16, 32):
            assert 1.0 <= by[("paced", order, k)] / by[("hold", order, k)] < 1.06
    tiles = [r for p in sorted(wave.glob("grouped_tiles*.json")) for r in json.loads(p.read_text())["rows"]]
    first, tuned = (json.loads((wave / f).read_text()) for f in ("gpu_kernels_grouped.json", "gpu_kernels_grouped_tuned.json"))
    md = gpu_wave_report.grouped_section(first, tuned, tiles)
    assert "| mixtral-8x7b up (4096 -> 14336) | 1x | forward |" in md and "| weight_grad | 64 experts up |" in md
    # Every grouped kernel computed what XLA's ragged_dot computes, and beat it.
    grouped = [r for r in tuned["grouped"] if r["impl"] == "grouped kernel"]
    assert len(grouped) == 16 and all(r["rel_error"] < 1e-2 for r in grouped)


def test_the_probe_and_the_tile_sweep_refuse_bad_input_in_one_line(capsys):
    from benchmarks.gpu import grouped_tiles

    with pytest.raises(SystemExit):
        grouped_tiles.main(["--forward", "block_q=1"])
    assert "block_q=1" in capsys.readouterr().err
    assert grouped_tiles.main([]) == 2  # no GPU here: nothing measured
    with pytest.raises(ValueError, match="must be > 0"):
        gpu_order.Probe.__init__(object.__new__(gpu_order.Probe), paced_gbps=0.0)

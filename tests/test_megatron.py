"""The Megatron-terms step model and the matmul-by-shape kernel model."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import pathlib
import statistics

import pytest

from lagom_jax import cli
from lagom_jax.advise import configtuner as advise, megatron
from lagom_jax.cluster import hardware
from lagom_jax.costs import cost, kernels

A100 = hardware.get("a100-sxm-8")
H100 = hardware.get("h100-sxm-8")
DATA = pathlib.Path(kernels.__file__).parent.parent / "data" / "xla_matmul_h100.csv"
GPT_350M = dict(hidden=1024, heads=16, layers=24, seq_len=2048, vocab=51200)


def test_gemm_model_matches_xlas_measured_h100_table():
    rows = [r for r in csv.DictReader(DATA.open()) if r["dtype"].startswith("bf16xbf16")]
    errs = [abs(kernels.gemm_time_us(int(r["m"]), int(r["n"]), int(r["k"]), H100,
                                     batch=int(r["batch"])) / float(r["time_us"]) - 1) for r in rows]
    assert len(rows) == 375
    assert statistics.median(errs) < 0.06
    assert sorted(errs)[int(0.95 * len(errs))] < 0.25


def test_gemm_time_grows_with_size_and_falls_with_sms():
    t = kernels.gemm_time_us(4096, 4096, 4096, A100)
    assert kernels.gemm_time_us(4096, 4096, 8192, A100) > t
    assert kernels.gemm_time_us(4096, 4096, 4096, A100, sm_fraction=0.5) > 1.8 * (t - A100.launch_us) * 0.5
    assert kernels.gemm_tflops(16384, 16384, 16384, A100) <= A100.achieved_tflops
    # A matmul with a short contraction is far below peak (memory and tile start-up).
    assert kernels.gemm_tflops(2048, 2048, 64, A100) < 0.5 * A100.achieved_tflops
    with pytest.raises(ValueError, match="gemm dims"):
        kernels.gemm_time_us(-1, 2, 3, A100)


def test_a_partial_wave_of_tiles_costs_a_whole_wave():
    # 12 x 11 = 132 tiles of 256 x 128 fill H100's 132 SMs once; 7 x 19 = 133 tiles need a
    # second wave (or smaller tiles in more waves), so the matmul with 0.8% more work takes
    # far longer. Fractional waves would make it 1.008x.
    full = kernels.gemm_time_us(256 * 12, 128 * 11, 8192, H100)
    one_more = kernels.gemm_time_us(256 * 7, 128 * 19, 8192, H100)
    assert H100.sm_count == 132
    assert one_more / full > 1.3


def test_compute_time_uses_the_shape_model_for_matmuls():
    flops = 2.0 * 4096 * 4096 * 64
    nbytes = 2.0 * (4096 * 64 * 2 + 4096 * 4096)
    roofline = cost.compute_time_us(flops, nbytes, A100)
    shaped = cost.compute_time_us(flops, nbytes, A100, gemm=(1, 4096, 4096, 64))
    assert shaped == pytest.approx(max(kernels.gemm_time_us(4096, 4096, 64, A100),
                                       A100.launch_us + nbytes / (A100.achieved_hbm_gbps * 1e3)))
    assert shaped >= roofline


def run(**kw) -> megatron.GPTRun:
    return megatron.GPTRun(**(GPT_350M | dict(gpus=8, tp=1, dp=8, pp=1, micro_batch=1, global_batch=64) | kw))


@pytest.mark.parametrize("kw, match", [
    (dict(tp=3, dp=2, pp=1), "tp x dp x pp = 3 x 2 x 1 = 6 does not equal gpus 8"),
    (dict(tp=8, dp=1, heads=32, hidden=2048), None),
    (dict(tp=8, dp=1, heads=20, hidden=1280), "tp = 8 does not divide heads = 20"),
    (dict(pp=8, dp=1, layers=20), "pp x virtual_stages = 8 does not divide layers = 20"),
    (dict(global_batch=60), "micro_batch x dp = 8 does not divide global_batch = 60"),
    (dict(hidden=1000), "heads = 16 does not divide hidden = 1000"),
    (dict(schedule="zb"), "unknown schedule"),
    (dict(micro_batch=0), "micro_batch must be a positive integer"),
])
def test_configurations_that_do_not_divide_say_which_number(kw, match):
    if match is None:
        run(**kw)
        return
    with pytest.raises(ValueError, match=match.replace("(", r"\(").replace(")", r"\)")):
        run(**kw)


def test_predict_step_ms_never_raises_from_1_to_4096_gpus():
    for gpus in (1, 2, 4, 8, 16, 64, 256, 512, 1024, 4096):
        for tp in (1, 2, 4, 8):
            for pp in (1, 2, 4, 8, 16):
                if gpus % (tp * pp) or 96 % pp:
                    continue
                dp = gpus // (tp * pp)
                ms = advise.predict_step_ms(hidden=12288, heads=96, layers=96, seq_len=2048,
                                            vocab=51200, gpus=gpus, tp=tp, dp=dp, pp=pp,
                                            micro_batch=1, global_batch=dp * 16)
                assert math.isfinite(ms) and ms > 0


def test_the_pipeline_across_nodes_of_the_issue_predicts():
    # 256 GPUs, tp 8, dp 8, pp 4 crashed the analytic screen (nodes > group size).
    st = advise.predict_step(hidden=12288, heads=96, layers=96, seq_len=2048, vocab=51200,
                             gpus=256, tp=8, dp=8, pp=4, micro_batch=1, global_batch=512)
    assert st.total_ms > st.pipeline_ms > st.bubble_ms > 0
    assert st.recompute == "full"  # 175B on 32 GPUs per replica does not fit otherwise


def test_more_work_never_costs_less():
    base = megatron.predict(run(), A100, gpu_memory_gb=80).total_ms
    assert megatron.predict(run(global_batch=128), A100, gpu_memory_gb=80).total_ms > 1.9 * base
    # The embedding, output head and optimizer do not grow with the layers.
    assert megatron.predict(run(layers=48), A100, gpu_memory_gb=80).total_ms > 1.7 * base
    assert megatron.predict(run(recompute="full"), A100, gpu_memory_gb=80).total_ms > base


def test_pipeline_bubble_follows_the_schedule():
    big = dict(hidden=4096, heads=32, layers=64, dp=1, pp=8)
    one = megatron.predict(run(**big, global_batch=1), A100, gpu_memory_gb=80)
    many = megatron.predict(run(**big, global_batch=64), A100, gpu_memory_gb=80)
    # About (pp - 1) of m + pp - 1 ticks idle: 7/8 with one micro-batch, 7/71 with 64 (the
    # last stage, which also runs the output head, is the slowest).
    assert one.bubble_ms / one.pipeline_ms > 0.75
    assert many.bubble_ms / many.pipeline_ms < 0.12
    inter = megatron.predict(run(dp=2, pp=4, global_batch=32, virtual_stages=2), A100, gpu_memory_gb=80)
    plain = megatron.predict(run(dp=2, pp=4, global_batch=32), A100, gpu_memory_gb=80)
    assert inter.bubble_ms < 0.6 * plain.bubble_ms
    gpipe = megatron.predict(run(dp=2, pp=4, global_batch=64, schedule="gpipe", recompute="none"), A100, gpu_memory_gb=80)
    f1b = megatron.predict(run(dp=2, pp=4, global_batch=64, recompute="none"), A100, gpu_memory_gb=80)
    assert gpipe.total_ms == pytest.approx(f1b.total_ms)
    assert gpipe.memory_gb > f1b.memory_gb  # GPipe holds every micro-batch's activations


def test_auto_recompute_takes_the_cheapest_that_fits():
    big = run(hidden=12288, heads=96, layers=96, gpus=64, tp=8, dp=1, pp=8, global_batch=64)
    assert megatron.choose_recompute(big, 80.0) == "full"
    assert megatron.choose_recompute(run(), 80.0) == "none"
    assert megatron.choose_recompute(dataclasses.replace(run(), recompute="selective"), 80.0) == "selective"


def test_tensor_parallel_layer_matches_korthikanti_table_4():
    # 22B layer, tp 8, micro-batch 4 on A100: 7.7 ms forward, 11.9 ms backward measured.
    r = megatron.GPTRun(hidden=6144, heads=64, layers=1, seq_len=2048, vocab=51200, gpus=8, tp=8,
                        dp=1, pp=1, micro_batch=4, global_batch=4, recompute="none")
    fwd, bwd = megatron.layer_ms(r, A100)
    assert fwd == pytest.approx(7.7, rel=0.10)
    assert bwd == pytest.approx(11.9, rel=0.10)


def test_tp_comm_overlap_hides_tensor_parallel_traffic():
    kw = dict(tp=8, dp=1, sequence_parallel=True)
    plain = megatron.predict(run(**kw), A100, gpu_memory_gb=80)
    hidden = megatron.predict(run(**kw, tp_comm_overlap=True), A100, gpu_memory_gb=80)
    assert hidden.tp_comm_ms < plain.tp_comm_ms
    with pytest.raises(ValueError, match="sequence_parallel"):
        run(tp=8, dp=1, tp_comm_overlap=True)


def test_cli_predict_prints_the_parts_and_refuses_bad_numbers(capsys):
    args = ["predict", "--hidden", "1024", "--heads", "16", "--layers", "24", "--seq-len", "2048",
            "--gpus", "16", "--tp", "2", "--dp", "4", "--pp", "2", "--micro-batch", "2",
            "--global-batch", "64"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    assert "ms per iteration" in out and "dp all-reduce" in out
    assert cli.main(args + ["--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["total_ms"] == pytest.approx(advise.predict_step_ms(
        hidden=1024, heads=16, layers=24, seq_len=2048, vocab=51200, gpus=16, tp=2, dp=4, pp=2,
        micro_batch=2, global_batch=64))
    assert cli.main(args[:-1] + ["63"]) == 2
    assert "does not divide global_batch = 63" in capsys.readouterr().err


def test_a_step_graph_task_knows_its_matmul_shape():
    from lagom_jax.program import graph

    text = """HloModule m

fused {
  a = bf16[4,128,64]{2,1,0} parameter(0)
  b = bf16[4,64,256]{2,1,0} parameter(1)
  ROOT d = bf16[4,128,256]{2,1,0} dot(a, b), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, rhs_contracting_dims={1}
}

ENTRY e {
  x = bf16[4,128,64]{2,1,0} parameter(0)
  y = bf16[4,64,256]{2,1,0} parameter(1)
  ROOT f = bf16[4,128,256]{2,1,0} fusion(x, y), kind=kCustom, calls=fused
}
"""
    g = graph.from_hlo_text(text)
    (task,) = [t for t in g.tasks if t.flops]
    assert task.gemm == (4, 128, 256, 64)
    assert task.itemsize == 2


def test_fidelity_replays_every_published_run():
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from benchmarks.measured import fidelity

    rows = fidelity.load()
    assert len(rows) >= 130
    results = [(r, fidelity.predict(r)[0]) for r in rows]
    assert all(math.isfinite(p) and p > 0 for _, p in results)
    calibration = fidelity.figures((r, p) for r, p in results
                                   if r.source in (fidelity.NARAYANAN, fidelity.KORTHIKANTI))
    assert calibration.median_abs < 0.05 and calibration.spearman > 0.95
    held_out = fidelity.figures((r, p) for r, p in results if r.source == fidelity.BLOOM)
    assert held_out.median_abs < 0.20  # 12.6% when the model was fixed


def test_collectives_inside_an_a100_node_follow_the_measured_all_reduces():
    # Echo's nccl-tests, 8 x A100: 16 MiB all-reduce in 235.6 us (out of place).
    r = megatron.GPTRun(**(GPT_350M | dict(gpus=8, tp=8, dp=1, pp=1, micro_batch=1, global_batch=8)))
    t = megatron._Cluster(r, A100).tp("all-reduce", 16 * 2**20)
    assert t == pytest.approx(235.6, rel=0.05)
    # Across nodes nothing measured transfers: the model alone.
    assert cost.measured_ratio("all-reduce", 16 * 2**20, 16, 2, A100) == 1.0


# The schedule's formulas (issue 28): T = (m - 1) * max_i S_i + sum_i S_i for m micro-batches
# and per-micro-batch stage times S_i; the iteration adds the data-parallel reduction and
# the optimizer after it. Each test fails when one term is dropped or changed.

def _stage_sum(r: megatron.GPTRun, hw=A100) -> float:
    """sum_i S_i rebuilt from the layer and end phases, independently of `predict`'s loop."""
    rc = megatron.choose_recompute(r, 80)
    cl = megatron._Cluster(r, hw)
    eager = megatron.DEFAULT_EAGER
    lf, lb = (p.time_us(eager) for p in megatron._layer(r, hw, cl, rc))
    (ef, eb), (hf, hb) = ((a.time_us(eager), b.time_us(eager)) for a, b in megatron._ends(r, hw, cl))
    st = megatron.predict(r, hw, gpu_memory_gb=80)
    send = st.pp_comm_ms * 1e3
    return (r.layers * (lf + lb) + ef + eb + hf + hb + r.pp * send) / 1e3


@pytest.mark.parametrize("pp", [2, 4])
def test_one_micro_batch_runs_the_stages_one_after_another(pp):
    r = run(dp=8 // pp, pp=pp, global_batch=8 // pp)  # m = 1
    assert r.microbatches == 1
    st = megatron.predict(r, A100, gpu_memory_gb=80)
    assert st.pipeline_ms == pytest.approx(_stage_sum(r), rel=1e-9)
    slowest = st.forward_ms + st.backward_ms + st.pp_comm_ms
    # The bubble is everything but the slowest stage's one micro-batch.
    assert st.bubble_ms == pytest.approx(st.pipeline_ms - slowest, rel=1e-9)
    assert st.bubble_ms > (pp - 1) / pp * 0.8 * st.pipeline_ms


@pytest.mark.parametrize("pp, v", [(2, 1), (4, 1), (4, 2), (1, 1)])
def test_each_micro_batch_adds_the_slowest_stage_and_the_bubble_stays(pp, v):
    times = {}
    for m in (1, 2, 4, 8):
        r = run(dp=8 // pp, pp=pp, virtual_stages=v, global_batch=m * 8 // pp, recompute="none")
        assert r.microbatches == m
        times[m] = megatron.predict(r, A100, gpu_memory_gb=80)
    slowest = times[1].forward_ms + times[1].backward_ms + times[1].pp_comm_ms
    for m, st in times.items():
        assert st.bubble_ms == pytest.approx(times[1].bubble_ms, rel=1e-9)
        assert st.pipeline_ms == pytest.approx(m * slowest + st.bubble_ms, rel=1e-9)
        assert 0 <= st.bubble_ms <= st.pipeline_ms
        assert st.total_ms == pytest.approx(st.pipeline_ms + st.dp_comm_ms + st.optimizer_ms, rel=1e-9)
    if pp == 1:
        assert times[1].bubble_ms == 0
    else:
        assert times[1].bubble_ms > 0


def test_interleaving_divides_the_bubble_by_the_model_chunks():
    plain = megatron.predict(run(dp=2, pp=4, global_batch=16, recompute="none"), A100, gpu_memory_gb=80)
    inter = megatron.predict(run(dp=2, pp=4, global_batch=16, recompute="none", virtual_stages=2),
                             A100, gpu_memory_gb=80)
    # Same layers per GPU; each chunk sends forward and backward, so only the sends differ.
    plain_rest = plain.bubble_ms - 3 * plain.pp_comm_ms
    inter_rest = inter.bubble_ms - 3 * inter.pp_comm_ms / 2
    assert inter_rest == pytest.approx(plain_rest / 2, rel=1e-6)


@pytest.mark.parametrize("tp, dp, pp, mb", [(1, 8, 1, 1), (8, 1, 1, 8), (2, 2, 2, 4), (1, 2, 4, 2), (4, 1, 2, 1)])
def test_the_bubble_never_exceeds_the_pipeline_on_one_node(tp, dp, pp, mb):
    for gb_per_replica in (mb, 4 * mb, 16 * mb):
        r = megatron.GPTRun(hidden=1024, heads=16, layers=24, seq_len=1024, vocab=51200, gpus=8,
                            tp=tp, dp=dp, pp=pp, micro_batch=mb, global_batch=gb_per_replica * dp)
        st = megatron.predict(r, A100, gpu_memory_gb=80)
        assert 0 <= st.bubble_ms <= st.pipeline_ms < st.total_ms
        # No more idle than (pp - 1) of the m + pp - 1 ticks of a balanced pipeline allows,
        # with room for the ends' imbalance.
        m = r.microbatches
        assert st.bubble_ms <= st.pipeline_ms * (pp - 1) / (m + pp - 1) * 1.6 + 1e-9


# The eager host (issue 28): Megatron-LM's host time per layer, micro-batch and step.

SMALL_GPT = dict(hidden=512, heads=8, layers=12, seq_len=1024, vocab=50257, gpus=8, micro_batch=4,
                 global_batch=32, dtype="float16")
NO_HOST = megatron.Eager(layer_host_us=0.0, microbatch_host_us=0.0, step_host_us=0.0)


def test_a_small_layer_takes_at_least_the_hosts_time_to_issue_it():
    r = megatron.GPTRun(**SMALL_GPT, tp=8, dp=1, pp=1)
    e = megatron.DEFAULT_EAGER
    fwd, bwd = megatron.layer_ms(r, A100)
    gpu_fwd, gpu_bwd = megatron.layer_ms(r, A100, eager=NO_HOST)
    assert gpu_fwd + gpu_bwd < 0.5 * e.layer_host_us / 1e3  # the GPU's share is small here
    assert fwd == pytest.approx(e.layer_host_us * (1 - e.backward_host_share) / 1e3, rel=1e-9)
    assert bwd == pytest.approx(e.layer_host_us * e.backward_host_share / 1e3, rel=1e-9)
    # Full recomputation issues the forward again in the backward.
    full = megatron.GPTRun(**SMALL_GPT, tp=8, dp=1, pp=1, recompute="full")
    assert megatron.layer_ms(full, A100)[1] == pytest.approx(e.layer_host_us / 1e3, rel=1e-9)


def test_a_host_bound_layer_does_not_get_faster_with_tensor_parallelism():
    # Megatron-LM's functional tests: tp 4 runs four micro-batches per replica in 212.8 ms,
    # tp 1 one in 60.1 ms: splitting a small layer saves nothing while the host issues it.
    layer = {t: sum(megatron.layer_ms(megatron.GPTRun(**SMALL_GPT, tp=t, dp=8 // t, pp=1), A100))
             for t in (1, 2, 4, 8)}
    assert max(layer.values()) == pytest.approx(min(layer.values()), rel=1e-9)
    # Without the host it would: the GPU work of the layer falls with every split.
    gpu = [sum(megatron.layer_ms(megatron.GPTRun(**SMALL_GPT, tp=t, dp=8 // t, pp=1), A100, eager=NO_HOST))
           for t in (1, 2, 4, 8)]
    assert gpu == sorted(gpu, reverse=True) and gpu[0] > 1.5 * gpu[-1]
    # The step then grows with the micro-batches per replica, as measured (3.5x).
    tp1 = megatron.predict(megatron.GPTRun(**SMALL_GPT, tp=1, dp=8, pp=1), A100, gpu_memory_gb=80)
    tp4 = megatron.predict(megatron.GPTRun(**SMALL_GPT, tp=4, dp=2, pp=1), A100, gpu_memory_gb=80)
    assert 2.5 < tp4.total_ms / tp1.total_ms < 4.5


def test_the_host_adds_its_bookkeeping_per_micro_batch_and_step():
    e = dataclasses.replace(NO_HOST, microbatch_host_us=1000.0, step_host_us=5000.0)
    big = dict(hidden=6144, heads=48, layers=8, seq_len=2048, vocab=51200, gpus=8, tp=8, dp=1,
               micro_batch=1)
    for pp, m in ((1, 4), (2, 4)):
        r = megatron.GPTRun(**(big | dict(tp=8 // pp, pp=pp, global_batch=m)))
        with_host = megatron.predict(r, A100, gpu_memory_gb=80, eager=e)
        without = megatron.predict(r, A100, gpu_memory_gb=80, eager=NO_HOST)
        # Each of the m + pp - 1 ticks of the slowest stage carries one micro-batch's bookkeeping.
        assert with_host.pipeline_ms - without.pipeline_ms == pytest.approx((m + pp - 1) * 1.0, rel=1e-6)
        assert with_host.optimizer_ms - without.optimizer_ms == pytest.approx(5.0, rel=1e-9)


def test_each_stage_exchange_is_a_synchronised_host_call(monkeypatch):
    """Megatron's ``_communicate`` synchronises the device after every ``batch_isend_irecv``:
    each exchange's host calls (`megatron.P2P_HOST_CALLS`) add to the stage in series. They
    ride on every tick of the slowest stage, forward and backward: ``2 (m + pp - 1)`` of them,
    so their share per micro-batch shrinks as micro-batches grow, and a single stage has none."""
    calls = megatron.P2P_HOST_CALLS
    c = calls * megatron.DEFAULT_EAGER.host_us_per_kernel / 1e3
    assert c > 0

    def pipeline(run: megatron.GPTRun, calls: int) -> float:
        monkeypatch.setattr(megatron, "P2P_HOST_CALLS", calls)
        return megatron.predict(run, A100, gpu_memory_gb=80).pipeline_ms

    shares = []
    for pp, m in ((4, 1), (4, 2), (4, 4), (4, 8), (2, 2)):
        r = megatron.GPTRun(**(SMALL_GPT | dict(tp=1, dp=8 // pp, pp=pp, global_batch=4 * m * (8 // pp))))
        assert r.microbatches == m
        added = pipeline(r, calls) - pipeline(r, 0)
        assert added == pytest.approx(2 * (m + pp - 1) * c, rel=1e-6)
        if pp == 4:
            shares.append(added / m)
    assert shares == sorted(shares, reverse=True) and shares[0] > 2 * shares[-1]
    one = megatron.GPTRun(**SMALL_GPT, tp=1, dp=8, pp=1)
    assert pipeline(one, calls) == pipeline(one, 0)


def test_a_gpu_bound_run_does_not_see_the_host():
    r = megatron.GPTRun(hidden=12288, heads=96, layers=96, seq_len=2048, vocab=51200, gpus=384,
                        tp=8, dp=4, pp=12, micro_batch=1, global_batch=1536)
    a = megatron.predict(r, A100, gpu_memory_gb=80).total_ms
    b = megatron.predict(r, A100, gpu_memory_gb=80, eager=NO_HOST).total_ms
    # Only the step's host work and the micro-batches' bookkeeping remain, well under 1%.
    assert a - b == pytest.approx(megatron.DEFAULT_EAGER.step_host_us / 1e3
                                  + (1536 // 4 + 11) * megatron.DEFAULT_EAGER.microbatch_host_us / 1e3,
                                  rel=1e-6)
    assert a / b - 1 < 0.01


def test_each_node_has_its_own_host():
    assert megatron.eager_for(A100) is megatron.DEFAULT_EAGER
    assert megatron.eager_for(H100) is megatron.HOPPER_EAGER
    assert megatron.HOPPER_EAGER.layer_host_us < megatron.DEFAULT_EAGER.layer_host_us
    with pytest.raises(ValueError, match="layer_host_us"):
        megatron.Eager(layer_host_us=-1.0)
    with pytest.raises(ValueError, match="backward_host_share"):
        megatron.Eager(backward_host_share=1.5)


def test_the_host_constants_are_the_fit_of_megatrons_functional_tests():
    """The defaults are what `benchmarks.measured.fidelity --fit-host` finds (editing one without
    refitting fails here) and predict the layouts they were not fitted on."""
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
    from benchmarks.measured import fidelity

    ci = fidelity.load_ci()
    assert len(ci) >= 60
    for gpu, eager in (("a100", megatron.DEFAULT_EAGER), ("h100", megatron.HOPPER_EAGER)):
        fit_rows = [r for r in ci if r.source == f"ci-{gpu}-fit"]
        fitted, med = fidelity.fit_host(fit_rows, eager)
        for name in ("layer_host_us", "microbatch_host_us", "step_host_us"):
            assert getattr(fitted, name) == pytest.approx(getattr(eager, name), abs=50.0), name
        assert med < 0.08
        held = [(r, fidelity.predict(r)[0]) for r in ci if r.source == f"ci-{gpu}-held-out"]
        assert fidelity.figures(held).median_abs < 0.10  # 4.7% (A100), 8.2% (H100) when fitted


def test_the_prediction_says_when_the_layers_are_bound_by_the_host():
    small = megatron.predict(megatron.GPTRun(**SMALL_GPT, tp=8, dp=1, pp=1), A100, gpu_memory_gb=80)
    assert small.layer_host_ms > small.layer_gpu_ms
    assert "bound by the host" in small.describe()
    big = megatron.predict(megatron.GPTRun(hidden=6144, heads=48, layers=8, seq_len=2048, vocab=51200,
                                           gpus=8, tp=8, dp=1, pp=1, micro_batch=4, global_batch=4),
                           A100, gpu_memory_gb=80)
    assert big.layer_gpu_ms > big.layer_host_ms and "host" not in big.describe().split("GB/GPU")[1]


def test_rank_orders_the_layouts_megatrons_functional_tests_measured():
    # One DGX A100 node, 12 x 512 GPT, micro-batch 4, global batch 32 (benchmarks/data/
    # megatron_ci_runs.csv, plain fp16 rows): measured 60.1, 95.2, 130.6, 143.6, 212.8 ms.
    measured = {(1, 1): 60.1, (1, 2): 95.2, (1, 4): 130.6, (2, 2): 143.6, (4, 1): 212.8}
    ranked = advise.rank_steps(hidden=512, heads=8, layers=12, seq_len=1024, vocab=50257, gpus=8,
                               global_batch=32, micro_batches=(4,), dtype="float16")
    times = [st.total_ms for _, st in ranked]
    assert times == sorted(times) and all(st.fits for _, st in ranked)
    assert all(c["tp"] * c["dp"] * c["pp"] == 8 and 32 % (c["micro_batch"] * c["dp"]) == 0 for c, _ in ranked)
    order = [(c["tp"], c["pp"]) for c, _ in ranked if (c["tp"], c["pp"]) in measured]
    assert order == sorted(measured, key=measured.get)
    for c, st in ranked:
        if (c["tp"], c["pp"]) in measured:
            assert st.total_ms == pytest.approx(measured[(c["tp"], c["pp"])], rel=0.15)
    with pytest.raises(ValueError, match="no tp x dp x pp split"):
        advise.rank_steps(hidden=512, heads=8, layers=12, seq_len=1024, vocab=50257, gpus=8,
                          global_batch=3, micro_batches=(4,))


def test_cli_predict_rank_lists_the_fastest_splits(capsys):
    base = ["predict", "--hidden", "512", "--heads", "8", "--layers", "12", "--seq-len", "1024",
            "--gpus", "8", "--global-batch", "32"]
    assert cli.main(base + ["--rank", "3"]) == 0
    out = capsys.readouterr().out
    assert "the 3 fastest (predicted)" in out and out.count("host") >= 3
    assert cli.main(base + ["--rank", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and rows[0]["total_ms"] <= rows[1]["total_ms"] and rows[0]["config"]["tp"] >= 1
    assert cli.main(base + ["--rank", "3", "--tp", "2"]) == 2
    assert "leave out --tp" in capsys.readouterr().err

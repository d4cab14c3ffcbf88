"""ConfigTuner (`lagom_jax.advise.configtuner`): the analytic screen's laws and an end-to-end ranking."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lagom_jax.advise import configtuner as adv
from lagom_jax.cluster import hardware
from lagom_jax.models import FAMILIES
from lagom_jax.program import gpu_compile

GPT2_355M = FAMILIES["gpt2"].configs["355M"]
GPT2_TINY = FAMILIES["gpt2"].configs["tiny"]
H100 = hardware.get("h100-sxm-8")


def _est(pc: adv.ParallelConfig, batch: int = 32, seq: int = 1024, cfg=GPT2_355M, hw=H100):
    return adv.estimate(cfg, pc, hw, global_batch=batch, seq_len=seq)


def test_enumeration_covers_every_factorisation_once():
    configs = adv.enumerate_configs(8)
    assert all(pc.num_devices == 8 for pc in configs)
    assert len(set(configs)) == len(configs)
    shapes = {(pc.data, pc.fsdp, pc.stage, pc.model) for pc in configs}
    # ordered factorisations of 8 = 2^3 into 4 factors: C(3+3, 3) = 20
    assert len(shapes) == 20
    # pipelines get 2x, 4x and 8x their stages as micro-batches; others exactly 1
    for pc in configs:
        expected = {1} if pc.stage == 1 else {k * pc.stage for k in adv.MICROBATCH_FACTORS}
        assert pc.microbatches in expected
    assert not any(pc.sp for pc in configs)


def test_recipe_filter_and_names():
    configs = adv.enumerate_configs(8, recipes=["tp+dp", "tp+sp"])
    assert {pc.recipe for pc in configs} == {"dp+tp", "tp+sp"}
    pc = adv.ParallelConfig(data=2, fsdp=1, stage=2, model=2, microbatches=4)
    assert (pc.recipe, pc.mesh) == ("dp+pp+tp", "data=2,stage=2,model=2")
    assert adv.ParallelConfig(1, 1, 1, 1).recipe == "dp"


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([1, 2, 4]), st.sampled_from([8, 16, 64]))
def test_more_tensor_parallel_moves_more_activation_bytes(data, batch):
    """At a fixed data-parallel width, doubling tp (taking devices from fsdp) never lowers
    the activation traffic or the TP communication time."""
    tps = [t for t in (1, 2, 4, 8) if data * t <= 8]
    est = [_est(adv.ParallelConfig(data, 8 // (data * t), 1, t), batch=batch) for t in tps]
    for a, b in zip(est, est[1:]):
        assert b.tp_bytes > a.tp_bytes
        assert b.tp_comm_us > a.tp_comm_us


def test_bubble_share_follows_gpipe_formula():
    pc = adv.ParallelConfig(1, 1, 4, 2, microbatches=8)
    e = _est(pc)
    assert e.bubble_us == pytest.approx(e.compute_us * (4 - 1) / 8)
    assert _est(adv.ParallelConfig(4, 1, 1, 2)).bubble_us == 0.0


@pytest.mark.parametrize("stages", [2, 4])
def test_larger_global_batch_gives_smaller_bubble_share(stages):
    """At a fixed pipeline depth a larger batch admits more micro-batches, so the best
    feasible configuration loses a smaller share of its step to the fill and drain."""
    def best_share(batch: int) -> float:
        shares = [_est(pc, batch=batch).bubble_share for pc in adv.enumerate_configs(8)
                  if pc.stage == stages and pc.model == 8 // stages
                  and not adv.feasibility(GPT2_355M, pc, global_batch=batch, seq_len=1024)]
        return min(shares)

    shares = [best_share(stages * k) for k in adv.MICROBATCH_FACTORS]
    assert shares[0] > shares[1] > shares[2] > 0


def test_infeasible_configs_are_rejected_with_reasons():
    cfg = FAMILIES["gpt2"].configs["1.5B"]  # 25 heads
    reasons = adv.feasibility(cfg, adv.ParallelConfig(1, 1, 1, 8), global_batch=8, seq_len=1024)
    assert any("heads 25" in r for r in reasons)
    reasons = adv.feasibility(GPT2_355M, adv.ParallelConfig(1, 1, 8, 1, 16), global_batch=8, seq_len=1024)
    assert any("16 micro-batches" in r for r in reasons)
    reasons = adv.feasibility(GPT2_355M, adv.ParallelConfig(1, 1, 1, 8, sp=True), global_batch=8, seq_len=100)
    assert any("seq_len 100" in r for r in reasons)
    assert adv.feasibility(GPT2_355M, adv.ParallelConfig(2, 2, 1, 2), global_batch=8, seq_len=1024) == ()


def test_out_of_memory_configs_are_rejected():
    """GPT-2 1.5B with pure data parallelism holds 16 B/param of Adam state (~25 GB) plus
    the activations of 64 full-length sequences per device: over an A40's 48 GB."""
    advice = adv.advise("gpt2", "1.5B", 8, "a40-pcie-8", global_batch=512, seq_len=1024,
                        recipes=["dp", "fsdp"], top_k=0)
    rejected = {r.config.recipe: r.reason for r in advice.rejected}
    assert "GB/device" in rejected["dp"] and "usable" in rejected["dp"]
    assert all(c.memory_gb * 1e9 <= adv.usable_memory_bytes(hardware.get("a40-pcie-8"))
               for c in advice.candidates)


def test_memory_shrinks_with_sharding():
    dp = _est(adv.ParallelConfig(8, 1, 1, 1))
    fsdp = _est(adv.ParallelConfig(1, 8, 1, 1))
    assert fsdp.state_bytes == pytest.approx(dp.state_bytes / 8)
    tp = _est(adv.ParallelConfig(1, 1, 1, 8))
    sp = _est(adv.ParallelConfig(1, 1, 1, 8, sp=True))
    assert sp.activation_bytes < tp.activation_bytes
    assert sp.state_bytes == tp.state_bytes


def test_bad_inputs_name_the_fix():
    with pytest.raises(ValueError, match="known: bert, gpt2, t5"):
        adv.advise("gpt3", "tiny", 8, "h100-sxm-8", global_batch=8, seq_len=16)
    with pytest.raises(ValueError, match="seq_len 17"):
        adv.advise("gpt2", "tiny", 8, "h100-sxm-8", global_batch=8, seq_len=17)
    with pytest.raises(ValueError, match="nodes=2"):
        adv.advise("gpt2", "tiny", 16, hardware.get("h100-sxm-8"), global_batch=16, seq_len=16)


def test_preset_name_grows_to_the_nodes_needed():
    advice = adv.advise("gpt2", "tiny", 16, "h100-sxm-8", global_batch=16, seq_len=16, top_k=0)
    assert advice.nodes == 2


def test_end_to_end_gpt2_tiny_on_8_devices():
    lines = []
    advice = adv.advise("gpt2", "tiny", 8, "h100-sxm-8", global_batch=16, seq_len=16, top_k=2,
                        progress=lines.append)
    assert lines and "screened" in lines[0]
    compiled = [c for c in advice.candidates if c.compiled]
    assert len(compiled) == 2
    # compiled candidates come first, ranked by the tuned prediction, then the rest by estimate
    assert advice.candidates[:2] == tuple(compiled)
    assert compiled[0].tuned_ms <= compiled[1].tuned_ms
    rest = [c.analytic_ms for c in advice.candidates[2:]]
    assert rest == sorted(rest)
    for c in compiled:
        # lagom searches from the defaults and accepts only gains
        assert 0 < c.tuned_ms <= c.untuned_ms * (1 + 1e-9)
        assert c.config.num_devices == 8 and c.memory_gb > 0
    assert advice.recommendation is advice.candidates[0]
    # every enumerated configuration is either a candidate or rejected, never both
    seen = [c.config for c in advice.candidates] + [r.config for r in advice.rejected]
    assert sorted(seen) == sorted(adv.enumerate_configs(8))
    assert any("heads 4" in r.reason for r in advice.rejected)  # tp=8 does not divide 4 heads
    report = advice.report()
    assert "Recommendation: " + advice.recommendation.config.label() in report
    assert "predicted" in report
    assert adv.ANALYTIC_VS_COMPILED in report  # the two kinds of column are told apart
    data = json.loads(advice.to_json())
    assert data["recommendation"]["mesh"] == advice.recommendation.mesh
    assert len(data["candidates"]) == len(advice.candidates)


def test_pipeline_step_is_predicted_even_where_the_cpu_compiler_aborts():
    """jaxlib 0.10.2's CPU compiler aborts on bfloat16 GPipe steps; the prediction then
    comes from the float32 step and says that it is an upper bound."""
    pc = adv.ParallelConfig(2, 1, 2, 2, microbatches=4)
    pred = adv.predict_compiled("gpt2", "tiny", pc, H100, global_batch=16, seq_len=16,
                                dtype="bfloat16")
    assert 0 < pred.tuned_ms <= pred.untuned_ms * (1 + 1e-9)
    if gpu_compile.unavailable_reason() is None:
        assert pred.compiled_by == "XLA:GPU deviceless compile for 8x H100 SXM5"
    if pred.compiled_dtype == "float32":
        assert "aborted" in pred.note and "upper bound" in pred.note
    else:
        assert pred.compiled_dtype == "bfloat16" and pred.note == ""


def test_a_pipeline_across_many_nodes_is_estimated():
    # 256 GPUs, tp 8, dp 8, pp 4: the stage axis spans 4 nodes; each send joins two GPUs.
    e = _est(adv.ParallelConfig(8, 1, 4, 8, microbatches=8), batch=512,
             hw=hardware.get("a100-sxm-8", nodes=32))
    assert e.pp_comm_us > 0 and e.step_us > e.compute_us

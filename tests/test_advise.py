"""ConfigTuner (`lagom_jax.advise.configtuner`): the analytic screen's laws and an end-to-end ranking."""

from __future__ import annotations

import dataclasses
import json
import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lagom_jax.advise import configtuner as adv, predict as adv_predict
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
    rest = [c.screen_ms for c in advice.candidates[2:]]  # the screen calibrated on the compiled two
    assert rest == sorted(rest)
    for c in compiled:  # calibrated on them: within a third of each (a scale from two steps)
        assert c.screen_ms == pytest.approx(c.untuned_ms, rel=0.35)
    assert "The screen, calibrated on the 2 compiled steps" in advice.report()
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


# ------------------------------------------- advise_train_step: Llama, Mixtral, GPT (issue 37)

import concurrent.futures  # noqa: E402

from lagom_jax.advise import memory  # noqa: E402

TINY_LLAMA = dict(layers=2, d_model=32, heads=4, kv_heads=2, ffn=64, vocab=128)
LLAMA2_7B = dict(layers=32, d_model=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000)


@pytest.fixture(scope="module")
def advise_cache(tmp_path_factory):
    """One compile cache for this module's tests (they share compiles), none of the user's."""
    path = tmp_path_factory.mktemp("advise-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LAGOM_JAX_CACHE", str(path))
        yield path


def _fake_compile(calls, temp_per_seq=1e9):
    """A stand-in for memory.compile_step: records what would be compiled; memory is the
    arguments plus ``temp_per_seq`` per sequence, the step 10 ms per sequence + 5 ms."""
    def compile_step(hw, model, config, mesh, *, batch_size, seq_len, remat, attention, limit_bytes, **_):
        calls.append(dict(mesh))
        ways = math.prod(mesh.get(a, 1) for a in ("data", "fsdp", "expert"))
        b = batch_size // ways
        share = 0.3 if remat == "full" else 1.0
        args = 4 * 10 ** 9
        return memory.StepMemory(args, args, args, int(b * temp_per_seq * share), 0, 0,
                                 5 + 10 * b / share ** 0.1, "fake"), False
    return compile_step


def test_weights_alone_over_memory_are_rejected_before_any_compile(monkeypatch):
    """llama2-7b on 8 H100: meshes without fsdp/model sharding hold 84 GB of float32 weights
    and Adam moments per GPU, over the 59 GiB limit: rejected, never compiled."""
    calls: list[dict] = []
    monkeypatch.setattr(memory, "compile_step", _fake_compile(calls))
    advice = adv.advise_train_step("llama", **LLAMA2_7B, gpus=8, hardware="h100-sxm-8", global_batch=16,
                                   seq_len=4096, mesh_finalists=1, remats=("full",), jobs=1)
    limit = advice.limit_bytes
    assert limit == int(0.75 * memory.gpu_memory_bytes(H100))
    over = [c for c, why in advice.rejected if "weights and Adam state alone" in why]
    assert "data=8" in over
    assert calls and all(adv.state_bytes_per_gpu("llama", {**LLAMA2_7B, "seq_len": 4096}, m) <= limit
                         for m in calls)
    assert {"data": 8, "fsdp": 1, "model": 1, "expert": 1} not in calls
    # On one GPU nothing can hold the state: nothing is compiled, one line says so.
    calls.clear()
    with pytest.raises(adv.NothingFits, match="weights and Adam state alone need at least 75.* about 2 GPUs") as err:
        adv.advise_train_step("llama", **LLAMA2_7B, gpus=1, hardware="h100-sxm-8", global_batch=16,
                              seq_len=4096)
    assert calls == [] and "\n" not in str(err.value)


def test_search_takes_the_largest_batch_that_fits_and_says_how_it_pruned(monkeypatch):
    calls: list[dict] = []
    monkeypatch.setattr(memory, "compile_step", _fake_compile(calls, temp_per_seq=9 * 2 ** 30))
    advice = adv.advise_train_step("llama", **LLAMA2_7B, gpus=8, hardware="h100-sxm-8", global_batch=64,
                                   seq_len=4096, meshes=[{"fsdp": 8}], remats=("full", "none"), jobs=1,
                                   current={"mesh": {"fsdp": 8}, "per_device_batch": 1, "remat": "full"})
    limit = advice.limit_bytes
    best = advice.best
    assert all(c.fits == (c.peak_bytes <= limit) for c in advice.candidates)
    # none: 4 GiB + 9 GiB per sequence fits 5 sequences -> the largest divisor of 8 is 4;
    # full: 0.3 x 9 GiB per sequence fits all 8
    by = {(c.remat, c.per_device_batch) for c in advice.candidates if c.fits}
    assert ("none", 4) in by and ("none", 8) not in by and ("full", 8) in by
    assert best.step_ms == min(c.step_ms for c in advice.candidates if c.fits)
    assert advice.current.per_device_batch == 1 and advice.current.grad_accum == 8
    assert advice.gain(best) == pytest.approx(advice.current.step_ms / best.step_ms)
    report = advice.report()
    assert "Pruning:" in report and "MaxText-style config" in report
    assert "The screen, calibrated on the" in report  # the screen's error, said
    assert "gradient_accumulation_steps" in adv.maxtext_fragment(best, 8, 8)
    # The fragment names the attention kernel the step was priced with: MaxText's GPU
    # "flash" is JAX's Pallas mha, the kernel the families compile; cuDNN's is another.
    for attention, key in (("flash", "attention: flash "), ("xla", "attention: dot_product ")):
        text = adv.maxtext_fragment(dataclasses.replace(best, attention=attention), 8, 8)
        assert key in text and "cudnn_flash_te " not in text.split("#")[0]


def test_the_screens_error_against_the_compiled_candidates_is_said():
    screen = adv.Screen(1.2, 2.0, 0.5, 0.25, 3)
    text = adv.screen_agreement({"a": (90.0, 100.0), "b": (130.0, 100.0), "c": (105.0, 100.0)}, screen)
    assert "median +5%" in text and "worst +30.0% (b)" in text and "2 of 3 within 10%" in text
    assert "1.20 x compute + 2.00 x exposed" in text
    assert "not calibrated" in adv.screen_agreement({}, screen)


def test_the_screen_calibration_recovers_a_known_law_and_prices_what_it_was_not_fitted_on():
    """Steps made by a known calibration are fitted back exactly; a step it did not see
    (another mesh's mix of parts) is then priced as that law prices it."""
    law = adv.Screen(compute=1.4, exposed=3.0, weights=0.8, hidden=0.5)
    parts = [{"compute": c, "exposed": x, "weights": w}
             for c, x, w in ((100, 0, 20), (100, 10, 80), (60, 5, 120), (80, 0, 200), (50, 20, 10))]
    fitted = adv.Screen.fit([(t, law(t)) for t in parts[:4]])
    assert (fitted.compute, fitted.exposed, fitted.weights, fitted.hidden) == pytest.approx(
        (1.4, 3.0, 0.8, 0.5), rel=1e-6)
    assert fitted(parts[4]) == pytest.approx(law(parts[4]))
    # No pair: the uncalibrated screen; the parts: compute falls with less recomputation and
    # a tensor-parallel mesh pays exposed all-reduces, more of them per micro-step.
    assert adv.Screen.fit([]) == adv.UNCALIBRATED
    hw = adv.predict._cluster("h100-sxm-8", 16)  # noqa: SLF001
    dims = dict(layers=4, d_model=1024, heads=16, kv_heads=8, ffn=4096, vocab=32000, seq_len=2048)
    kw = dict(global_batch=32, seq_len=2048)
    full = adv.screen_terms("llama", dims, {"fsdp": 16}, hw, **kw)
    none = adv.screen_terms("llama", dims, {"fsdp": 16}, hw, remat="none", **kw)
    assert none["compute"] < full["compute"] and full["exposed"] == 0
    tp1 = adv.screen_terms("llama", dims, {"fsdp": 8, "model": 2}, hw, **kw)
    tp4 = adv.screen_terms("llama", dims, {"fsdp": 8, "model": 2}, hw, per_device_batch=4, **kw)
    assert tp1["exposed"] > 0 and tp4["weights"] == pytest.approx(tp1["weights"] / 4)


def test_bad_input_for_the_family_advisor():
    with pytest.raises(ValueError, match="not whole nodes"):
        adv.advise_train_step("llama", **TINY_LLAMA, gpus=12, hardware="h100-sxm-8", global_batch=24,
                              seq_len=16)
    with pytest.raises(ValueError, match="global batch 3 is divided by no mesh"):
        adv.advise_train_step("llama", **TINY_LLAMA, gpus=8, hardware="h100-sxm-8", global_batch=3,
                              seq_len=16)


def _peak(mesh, batch, remat):
    hw = H100.with_nodes(1)
    src = adv_predict.train_step_source("llama", **TINY_LLAMA, seq_len=16, global_batch=batch, mesh=mesh,
                                        remat=remat, attention="xla")
    step, _ = memory.compile_step(hw, src.model, src.config, src.shape(), batch_size=batch, seq_len=16,
                                  remat=remat, attention="xla",
                                  limit_bytes=int(0.75 * memory.gpu_memory_bytes(hw)))
    return step.peak_bytes


def test_xla_memory_rises_with_the_batch_and_falls_with_remat(advise_cache):
    """Deviceless compiles of a tiny llama on 2 GPUs (fsdp 2): XLA's peak per GPU."""
    cases = [(1, "none"), (2, "none"), (2, "full")]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        peaks = dict(zip(cases, pool.map(lambda c: _peak({"fsdp": 2}, 2 * c[0], c[1]), cases)))
    assert peaks[(2, "none")] > peaks[(1, "none")]
    assert peaks[(2, "full")] < peaks[(2, "none")]


def test_configurations_that_lower_to_one_program_share_one_compile(tmp_path):
    """MaxText's save_dot_except_mlp and save_dot_except_mlpwi keep the same values of a Llama
    layer (its MLP output goes to the residual and the backward never needs it): one XLA compile,
    the second answer is the first's, marked reused. full remat lowers to another program."""
    hw = H100.with_nodes(1)
    limit = int(0.75 * memory.gpu_memory_bytes(hw))

    def step(remat):
        src = adv_predict.train_step_source("llama", **TINY_LLAMA, seq_len=16, global_batch=2, mesh={"fsdp": 2},
                                            remat=remat, attention="xla")
        return memory.compile_step(hw, src.model, src.config, src.shape(), batch_size=2, seq_len=16, remat=remat,
                                   attention="xla", limit_bytes=limit, cache=False, programs=tmp_path)

    first, reused_first = step("save_dot_except_mlp")
    second, reused_second = step("save_dot_except_mlpwi")
    assert not reused_first and reused_second and second.reused
    assert (second.peak_bytes, second.step_ms) == (first.peak_bytes, first.step_ms)
    assert len(list(tmp_path.iterdir())) == 1
    assert not step("full")[1] and len(list(tmp_path.iterdir())) == 2


def test_ranked_by_the_contract_prediction(advise_cache):
    """A configuration is ranked by the number predict_train_step_ms gives it."""
    import lagom_jax

    advice = adv.advise_train_step("llama", **TINY_LLAMA, gpus=2, hardware="h100-sxm-8", global_batch=4,
                                   seq_len=16, meshes=[{"fsdp": 2}], remats=("full", "none"), jobs=2)
    ranked = [c.step_ms for c in advice.candidates if c.fits]
    assert ranked == sorted(ranked) and len(ranked) >= 2
    best = next(c for c in advice.candidates if c.grad_accum == 1)
    ms = lagom_jax.predict_train_step_ms("llama", **TINY_LLAMA, seq_len=16, global_batch=4, mesh=best.mesh,
                                         remat=best.remat, attention="xla")
    assert best.step_ms == pytest.approx(ms, rel=1e-9)
    assert best.attention == "xla"  # flash needs head_dim >= 16


def test_cli_family_advice_bad_input_is_one_line_and_exit_2(capsys):
    from lagom_jax import cli

    assert cli.main(["advise", "--model", "llama", "--config", "llama2-7b", "--gpus", "1", "--global-batch", "8",
                     "--seq-len", "4096"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing fits" in err[0] and "about 2 GPUs" in err[0]
    assert cli.main(["advise", "--model", "llama", "--config", "tiny", "--gpus", "12", "--global-batch", "24",
                     "--seq-len", "16"]) == 2
    assert "not whole nodes" in capsys.readouterr().err


def test_the_work_left_only_falls_as_the_search_goes(monkeypatch):
    # Every stage's most compiles are counted when the search starts: "~N to go" never rises
    # (before, the finalists' batch searches and the attention stage were added when they
    # began, and the time left jumped from about 0 to minutes).
    calls: list[dict] = []
    lines: list[str] = []
    monkeypatch.setattr(memory, "compile_step", _fake_compile(calls, temp_per_seq=2 * 2 ** 30))
    adv.advise_train_step("llama", **LLAMA2_7B, gpus=8, hardware="h100-sxm-8", global_batch=64, seq_len=4096,
                          remats=("full", "none"), attentions=("flash", "xla"), mesh_finalists=2, jobs=1,
                          progress=lines.append)
    to_go = [int(line.split("~")[1].split(" to go")[0]) for line in lines if " to go" in line]
    assert len(to_go) == len(calls) > 4
    assert all(b <= a - 1 for a, b in zip(to_go, to_go[1:])), to_go
    assert to_go[-1] == 0


def test_the_time_left_rises_only_by_work_newly_found():
    # The mean compile time moves as compiles finish (a probe at batch 1 is quicker than a finalist
    # at batch 8); the figure shown must not rise with it, only with work the search newly found.
    left = adv.TimeLeft()
    shown = [left(n, 20, each) for n, each in ((19, 10.0), (18, 30.0), (17, 5.0), (16, 40.0))]
    assert shown == [190.0, 190.0, 85.0, 85.0]
    assert left(15, 25, 40.0) == 85.0 + 5 * 40.0  # five compiles found: their time is added
    assert left(0, 25, 40.0) == 0.0


def test_the_calibrated_screen_prunes_probes_and_finalist_steps(monkeypatch):
    """Compiled steps that are 1.5 x the uncalibrated screen: the calibration finds the scale,
    agrees with every compiled step, and a mesh or configuration it puts over 10% behind is
    never compiled (each named in the pruning lines)."""
    dims = dict(LLAMA2_7B, seq_len=4096)
    hw = adv.predict._cluster("h100-sxm-8", 16)  # noqa: SLF001
    compiled: list[tuple] = []

    def compile_step(hw_, model, config, mesh, *, batch_size, seq_len, remat, attention, limit_bytes, **_):
        ways = math.prod(mesh.get(a, 1) for a in ("data", "fsdp", "expert"))
        b = batch_size // ways
        compiled.append((adv._mesh_str(mesh), b, remat))  # noqa: SLF001
        terms = adv.screen_terms("llama", dims, mesh, hw, global_batch=64, seq_len=seq_len, per_device_batch=b,
                                 remat=remat)
        step = 1.5 * adv.UNCALIBRATED(terms) / (64 // ways // b)  # a micro-step
        return memory.StepMemory(10 ** 9, 10 ** 9, 10 ** 9, b * 2 ** 30, 0, 0, step, "fake"), False

    monkeypatch.setattr(memory, "compile_step", compile_step)
    advice = adv.advise_train_step("llama", **LLAMA2_7B, gpus=16, hardware="h100-sxm-8", global_batch=64,
                                   seq_len=4096, attentions=("flash",), jobs=1)
    probes = {m for m, b, remat in compiled if b == 1 and remat == "full"}
    line = next(p for p in advice.pruning if "Not probed:" in p)
    skipped = line.split("(", 1)[1].split(";")[0].split(", ")
    assert skipped and all(entry.rsplit(" ", 2)[0] not in probes for entry in skipped if entry != "...")
    assert any("model=2" in entry for entry in skipped)  # the tensor-parallel meshes pay exposed all-reduces
    agreement = advice.pruning[-1]
    assert "1.50 x compute + 1.50 x exposed" in agreement and re.search(r"worst [+-]0\.0%", agreement), agreement
    assert "configurations not compiled" in next(p for p in advice.pruning if p.startswith("Per finalist"))


def test_xla_attention_is_tried_where_its_scores_fit(monkeypatch):
    """XLA's attention holds at least one layer's scores (batch x heads x seq^2, float32 and
    bfloat16: 24 GiB at b=8, 3 at b=1 for llama2-7b at 4096); the best step (b=8, 51.7 GiB of
    59.3) has no room for them, the next compiled (the probe, b=1) has: it is tried there."""
    calls: list[dict] = []
    monkeypatch.setattr(memory, "compile_step", _fake_compile(calls, temp_per_seq=20 * 2 ** 30))
    advice = adv.advise_train_step("llama", **LLAMA2_7B, gpus=8, hardware="h100-sxm-8", global_batch=64,
                                   seq_len=4096, meshes=[{"fsdp": 8}], remats=("full",), jobs=1)
    line = next(p for p in advice.pruning if p.startswith("Attention xla"))
    assert "tried at [data=1,fsdp=8,model=1,expert=1] b=1 x8 full" in line, line
    xla = [c for c in advice.candidates if c.attention == "xla"]
    assert [c.per_device_batch for c in xla] == [1]


def test_tied_candidates_are_one_row_with_their_alternatives(monkeypatch):
    # The fake compile gives remat "full" and "minimal" the same memory and time: XLA would
    # compile them to one step, so the table shows one rank and names both.
    calls: list[dict] = []
    fake = _fake_compile(calls, temp_per_seq=2 * 2 ** 30)

    def same_for_full_and_minimal(hw, model, config, mesh, *, remat, **kw):
        return fake(hw, model, config, mesh, remat="full" if remat == "minimal" else remat, **kw)

    monkeypatch.setattr(memory, "compile_step", same_for_full_and_minimal)
    advice = adv.advise_train_step("llama", **LLAMA2_7B, gpus=8, hardware="h100-sxm-8", global_batch=64,
                                   seq_len=4096, meshes=[{"fsdp": 8}], remats=("full", "minimal"), jobs=1)
    table = advice.table()
    ranks = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "rank" not in line]
    assert any(r.endswith(("(x2)", "(x3)")) for r in ranks)  # x3: the fake prices XLA's attention the same too
    note = next(line for line in table.splitlines() if "predicted the same" in line)
    assert " full" in note and " minimal" in note


def test_a_batch_a_compiled_one_shows_over_memory_is_not_compiled(monkeypatch):
    """80 GiB of temporaries per sequence (full remat keeps 0.3 of it): full fits 2 of the 8
    sequences, none no batch. Batch 8 with full at 196 GiB shows batch 4 over the limit even if
    all its temporaries grew with the batch (100 GiB), and none at batch 2 shows batch 1 over
    (84 GiB): neither is compiled, and the pruning says which compile showed it."""
    compiled: list[tuple] = []

    def compile_step(hw, model, config, mesh, *, batch_size, remat, **kw):
        compiled.append((batch_size // 8, remat))
        return fake(hw, model, config, mesh, batch_size=batch_size, remat=remat, **kw)

    fake = _fake_compile([], temp_per_seq=80 * 2 ** 30)
    monkeypatch.setattr(memory, "compile_step", compile_step)
    advice = adv.advise_train_step("llama", **LLAMA2_7B, gpus=8, hardware="h100-sxm-8", global_batch=64,
                                   seq_len=4096, meshes=[{"fsdp": 8}], remats=("full", "none"), attentions=("flash",),
                                   jobs=1)
    assert advice.best.remat == "full" and advice.best.per_device_batch == 2
    assert sorted(compiled) == [(1, "full"), (2, "full"), (2, "none"), (8, "full")]
    line = next(p for p in advice.pruning if p.startswith("Per finalist"))
    assert "2 not compiled" in line
    assert "fsdp=8 b=4 full, shown by b=8 full at 196 GiB; fsdp=8 b=1 none, shown by b=2 none at 167 GiB" in line

"""ConfigTuner (`lagom_jax.advise.configtuner`): the one search for every built-in model, its screen and its laws."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import re

import pytest

from lagom_jax.advise import configtuner as adv, memory, predict as adv_predict
from lagom_jax.cluster import hardware
from lagom_jax.models import FAMILIES
from lagom_jax.models.families import resolve_config

H100 = hardware.get("h100-sxm-8")


def _param_count(model: str, config: str) -> int:
    import flax.linen as nn
    import jax

    cfg = resolve_config(model, config)
    boxed = jax.eval_shape(lambda r: FAMILIES[model].init(cfg, r, jax.numpy.bfloat16), jax.random.key(0))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nn.meta.unbox(boxed)))


@pytest.mark.parametrize("model,config", [("gpt2", "124M"), ("bert", "base"), ("t5", "small"), ("llama", "tiny"),
                                          ("mixtral", "tiny"), ("bert", "tiny"), ("t5", "tiny")])
def test_the_state_the_search_rules_out_by_is_the_built_models(model, config):
    """12 bytes (a float32 weight and two Adam moments) per parameter of the model `build`
    makes, counted from its abstract init: the arithmetic that rejects meshes before any
    compile holds every family's real parameters."""
    dims = {**adv.family_dims(model, config), "seq_len": resolve_config(model, config).max_len}
    assert adv.state_bytes_per_gpu(model, dims, {}) == 12 * _param_count(model, config)
    # sharded over fsdp x model, the matrices divide; norms and biases only over fsdp
    sharded = adv.state_bytes_per_gpu(model, dims, {"fsdp": 2, "model": 2})
    assert adv.state_bytes_per_gpu(model, dims, {}) / 4 < sharded < adv.state_bytes_per_gpu(model, dims, {}) / 2


def test_model_flops_count_every_family_by_hand():
    """Per token: 6 x the matmul weights a token meets plus the attention scores (causal: half)."""
    s = 512
    gpt2 = {**adv.family_dims("gpt2", "124M"), "seq_len": s}
    L, d, ff, v = 12, 768, 3072, 50304
    assert adv.model_flops_per_token("gpt2", gpt2, s) == 6 * (L * (4 * d * d + 2 * d * ff) + v * d) + 6 * L * s * d
    bert = {**adv.family_dims("bert", "base"), "seq_len": s}
    v = 30592  # bidirectional scores, and the masked-LM head's d x d transform
    assert adv.model_flops_per_token("bert", bert, s) == 6 * (L * (4 * d * d + 2 * d * ff) + v * d + d * d) \
        + 12 * L * s * d
    t5 = {**adv.family_dims("t5", "small"), "seq_len": s}
    L, d, ff, v = 6, 512, 2048, 32128  # decoder: self- and cross-attention, causal and full scores
    enc, dec = 4 * d * d + 2 * d * ff, 8 * d * d + 2 * d * ff
    assert adv.model_flops_per_token("t5", t5, s) == 6 * (L * enc + L * dec + v * d) + 6 * L * s * d * (2 + 1 + 2)


def _recording_compile(calls):
    """memory.compile_step standing in: records the model and config each compile builds."""
    def compile_step(hw, model, config, mesh, *, batch_size, seq_len, remat, attention, limit_bytes, **_):
        calls.append((model, config, dict(mesh), remat, attention))
        ways = math.prod(mesh.get(a, 1) for a in ("data", "fsdp", "expert"))
        return memory.StepMemory(10 ** 9, 10 ** 9, 10 ** 9, batch_size // ways * 10 ** 8, 0, 0,
                                 5.0 + batch_size, "fake"), False
    return compile_step


@pytest.mark.parametrize("model,config,built", [("gpt2", "355M", "gpt2"), ("bert", "large", "bert"),
                                                ("t5", "small", "t5")])
def test_every_built_in_model_goes_through_the_one_search(monkeypatch, model, config, built):
    """gpt2, bert and t5 get the search llama gets: their own layers compiled at their config's
    dimensions, the remat policies their layers can take, and t5 no flash attention (its
    position bias)."""
    calls: list = []
    monkeypatch.setattr(memory, "compile_step", _recording_compile(calls))
    advice = adv.advise(model, config, 8, "h100-sxm-8", global_batch=32, seq_len=512, jobs=1, pipeline=False)
    assert calls and {c[0] for c in calls} == {built}
    resolved, named = resolve_config(built, calls[0][1]), resolve_config(built, config)
    fields = ("layers", "dec_layers", "d_model", "heads", "head_dim", "d_ff", "vocab")
    assert [getattr(resolved, f) for f in fields] == [getattr(named, f) for f in fields]
    assert {c[3] for c in calls} <= set(adv.GPT_REMATS)
    assert ("flash" in {c[4] for c in calls}) == (model != "t5")
    assert advice.family == model and advice.best.fits
    assert advice.report().startswith(model + " (layers ")


@pytest.mark.slow
def test_a_t5_step_is_advised_from_real_compiles(advise_cache):
    """End to end with XLA's compiles: t5 tiny on 8 GPUs as a two-stage GPipe pipeline (its
    micro-batch climbed); every row's memory is XLA's and its step the contract's prediction of
    the compiled step (a pipeline's micro-batches run inside it: no accumulation, no accumulator)."""
    advice = adv.advise("t5", "tiny", 8, "h100-sxm-8", global_batch=8, seq_len=16, jobs=2, remats=("full",),
                        meshes=[{"data": 4, "stage": 2}], tune=False)
    assert advice.compiles >= 2 and all(c.peak_bytes > 0 and c.step_ms > 0 for c in advice.candidates)
    assert {c.attention for c in advice.candidates} == {"xla"}
    piped = [c for c in advice.candidates if c.pipelined]
    assert piped and all(c.step_ms == c.micro_step_ms and "2-stage GPipe step" in c.why for c in piped)
    assert "num_pipeline_microbatches: " in adv.maxtext_fragment(piped[0], 8, 8)
    best = advice.best
    assert best.step_ms == min(c.step_ms for c in advice.candidates if c.fits)
    data = json.loads(advice.to_json())
    assert data["family"] == "t5" and data["dims"]["dec_layers"] == 2


def test_the_first_advisers_keywords_warn_once_with_their_new_names(monkeypatch):
    calls: list = []
    monkeypatch.setattr(memory, "compile_step", _recording_compile(calls))
    monkeypatch.setattr(adv, "_warned", set())
    with pytest.warns(DeprecationWarning) as record:
        advice = adv.advise("gpt2", "tiny", hardware="h100-sxm-8", num_devices=8, global_batch=8, seq_len=16,
                            top_k=2, max_candidates=3, recipes=["dp", "dp+tp"], dtype="bfloat16", jobs=1)
    said = sorted(str(w.message).split(")")[0] for w in record)
    assert said == ["advise(dtype=...", "advise(max_candidates=...", "advise(num_devices=...", "advise(recipes=...",
                    "advise(top_k=..."]
    assert "advise(top_k=...) is now max_probes=..." in [str(w.message) for w in record]
    assert advice.gpus == 8 and len(advice.candidates) <= 3
    assert all(set(c[2]) <= {"data", "model"} for c in calls)  # only the recipes' axes
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: the second call is silent
        adv.advise("gpt2", "tiny", hardware="h100-sxm-8", num_devices=8, global_batch=8, seq_len=16, top_k=2, jobs=1)
    with pytest.raises(ValueError, match="bfloat16 steps only"):
        adv.advise("gpt2", "tiny", 8, global_batch=8, seq_len=16, dtype="float32")


def test_bad_input_for_the_new_families_names_the_numbers():
    with pytest.raises(ValueError, match="seq_len 1024 is longer than the model's 512 positions"):
        adv.advise("bert", "large", 8, global_batch=8, seq_len=1024)
    with pytest.raises(ValueError, match="no grouped-query attention"):
        adv.advise_train_step("bert", layers=2, d_model=32, heads=4, kv_heads=2, ffn=64, vocab=128, max_len=16,
                              gpus=8, hardware="h100-sxm-8", global_batch=8, seq_len=16)
    with pytest.raises(ValueError, match="t5 needs dec_layers"):
        adv.advise_train_step("t5", layers=2, d_model=32, heads=4, ffn=64, vocab=128, gpus=8,
                              hardware="h100-sxm-8", global_batch=8, seq_len=16)
    with pytest.raises(ValueError, match="unknown model 'gpt3'"):
        adv.advise("gpt3", None, 8, global_batch=8, seq_len=16)


# ------------------------------------------- advise_train_step: Llama, Mixtral, GPT (issue 37)


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
                                 5 + 10 * b / share ** 0.3, "fake"), False
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
    per_finalist = next(p for p in advice.pruning if p.startswith("Per finalist"))
    # none at 4 is compiled, or named as one the calibrated screen ruled out (under 1% faster)
    assert ("none", 4) in by or "fsdp=8 b=4 none" in per_finalist
    assert ("none", 8) not in by and ("full", 8) in by
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
    screen = adv.Screen(1.2, 0.7, 2.0, 0.5, 0.25, 3)
    text = adv.screen_agreement({"a": (90.0, 100.0), "b": (130.0, 100.0), "c": (105.0, 100.0)}, screen)
    assert "median +5%" in text and "worst +30.0% (b)" in text and "2 of 3 within 10%" in text
    assert "1.20 x compute + 0.70 x memory-bound kernels + 2.00 x exposed" in text
    assert "not calibrated" in adv.screen_agreement({}, screen)


def test_the_screen_calibration_recovers_a_known_law_and_prices_what_it_was_not_fitted_on():
    """Steps made by a known calibration are fitted back exactly; a step it did not see
    (another mesh's mix of parts) is then priced as that law prices it."""
    law = adv.Screen(compute=1.4, memory=2.2, exposed=3.0, weights=0.8, hidden=0.5)
    parts = [{"compute": c, "memory": m, "exposed": x, "weights": w}
             for c, m, x, w in ((100, 10, 0, 20), (100, 30, 10, 80), (60, 5, 5, 120), (80, 40, 0, 200),
                                (70, 20, 40, 30), (50, 25, 20, 10))]
    fitted = adv.Screen.fit([(t, law(t)) for t in parts[:5]])
    assert (fitted.compute, fitted.memory, fitted.exposed, fitted.weights, fitted.hidden) == pytest.approx(
        (1.4, 2.2, 3.0, 0.8, 0.5), rel=1e-6)
    assert fitted(parts[5]) == pytest.approx(law(parts[5]))
    # A part that is never a tenth of a fitted step keeps the one scale: fitted on steps whose
    # exposed collectives are a few percent, a mesh they dominate is not priced by a guess.
    faint = [{**t, "exposed": t["exposed"] / 20} for t in parts[:5]]
    assert adv.Screen._fit_parts([(t, law(t)) for t in faint]).exposed == pytest.approx(  # noqa: SLF001
        adv.Screen._fit_scale([(t, law(t)) for t in faint]).exposed)  # noqa: SLF001
    # No pair: the uncalibrated screen; the parts: compute falls with less recomputation and
    # a tensor-parallel mesh pays exposed all-reduces, more of them per micro-step.
    assert adv.Screen.fit([]) == adv.UNCALIBRATED
    hw = adv.predict._cluster("h100-sxm-8", 16)  # noqa: SLF001
    dims = dict(layers=4, d_model=1024, heads=16, kv_heads=8, ffn=4096, vocab=32000, seq_len=2048)
    kw = dict(global_batch=32, seq_len=2048)
    full = adv.screen_terms("llama", dims, {"fsdp": 16}, hw, **kw)
    none = adv.screen_terms("llama", dims, {"fsdp": 16}, hw, remat="none", **kw)
    assert none["compute"] < full["compute"] and full["exposed"] == 0
    # XLA's attention: the whole square as matmuls and its scores through memory.
    xla = adv.screen_terms("llama", dims, {"fsdp": 16}, hw, attention="xla", **kw)
    assert xla["compute"] > full["compute"] and xla["memory"] > full["memory"]
    # Smaller micro-steps run their matmuls at a lower rate: the same FLOPs take longer.
    one = adv.screen_terms("llama", dims, {"fsdp": 16}, hw, per_device_batch=1, **kw)
    two = adv.screen_terms("llama", dims, {"fsdp": 16}, hw, per_device_batch=2, **kw)
    assert one["compute"] > two["compute"]
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


@pytest.mark.slow
def test_xla_memory_rises_with_the_batch_and_falls_with_remat(advise_cache):
    """Deviceless compiles of a tiny llama on 2 GPUs (fsdp 2): XLA's peak per GPU."""
    cases = [(1, "none"), (2, "none"), (2, "full")]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        peaks = dict(zip(cases, pool.map(lambda c: _peak({"fsdp": 2}, 2 * c[0], c[1]), cases)))
    assert peaks[(2, "none")] > peaks[(1, "none")]
    assert peaks[(2, "full")] < peaks[(2, "none")]


@pytest.mark.slow
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
    assert "1.50 x compute + 1.50 x memory-bound kernels + 1.50 x exposed" in agreement and re.search(r"worst [+-]0\.0%", agreement), agreement
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


def test_a_pipelines_micro_batch_grows_while_its_step_falls(monkeypatch):
    """A pipeline holds its whole per-rank batch whatever the micro-batch; its bubble grows with
    the micro-batch. So the search climbs from one sequence per micro-batch and stops at the first
    that is not faster, and the candidate's step is the compiled step (micro-batches inside)."""
    calls: list = []
    ms = {1: 50.0, 2: 40.0, 4: 45.0, 8: 60.0}

    def compile_step(hw, model, config, mesh, *, batch_size, seq_len, remat, attention, limit_bytes,
                     microbatches=None, **_):
        b = batch_size // (mesh.get("data", 1) * microbatches)
        calls.append((b, microbatches, remat, attention))
        return memory.StepMemory(10 ** 9, 10 ** 9, 10 ** 9, 10 ** 9, 0, 0, ms[b], "fake"), False

    monkeypatch.setattr(memory, "compile_step", compile_step)
    advice = adv.advise("gpt2", "tiny", 8, "h100-sxm-8", global_batch=32, seq_len=16, jobs=1, remats=("full",),
                        meshes=[{"data": 4, "stage": 2}])
    assert [c[:2] for c in calls] == [(1, 8), (2, 4), (4, 2)]  # 8 sequences per rank; b=8 never tried
    assert {c[3] for c in calls} == {"xla"}  # a pipeline's stages run XLA's attention
    best = advice.best
    assert (best.per_device_batch, best.grad_accum, best.step_ms) == (2, 4, 40.0) and best.pipelined
    assert "x4 mb" in best.label() and "4 (pipeline)" in advice.table()


def test_a_policy_whose_mlp_activations_alone_are_over_is_not_compiled(monkeypatch):
    """mixtral-8x7b on 64 GPUs, fsdp 64: `none` keeps each expert matmul's gate and up outputs and
    the output matmul's input, 3 x 32 layers x (b x 4096 x top-2) rows x 14336 x 2 bytes: 84 GiB at
    4 sequences, over the limit beside the arguments before anything is compiled; at 1 sequence
    (21 GiB) the compile decides. A dense layer's `minimal` keeps its gate and up outputs."""
    calls: list = []
    monkeypatch.setattr(memory, "compile_step", _recording_compile(calls))
    dims = dict(layers=32, d_model=4096, heads=32, kv_heads=8, ffn=14336, vocab=32000, experts=8, top_k=2)
    advice = adv.advise_train_step("mixtral", **dims, gpus=64, hardware="h100-sxm-8", global_batch=256,
                                   seq_len=4096, meshes=[{"fsdp": 64}], remats=("full", "none"), jobs=1)
    nones = [c for c in calls if c[3] == "none"]
    assert nones  # at one sequence: compiled
    compiled_b = {c.per_device_batch for c in advice.candidates if c.remat == "none"}
    assert compiled_b and max(compiled_b) < 4
    assert any("the MLP activations it keeps alone 84 GiB" in p for p in advice.pruning), advice.pruning
    moe = {**dims, "seq_len": 4096}
    assert adv.kept_mlp_bytes("mixtral", moe, {"fsdp": 64}, 4, "none") == 3 * 32 * 4 * 4096 * 2 * 14336 * 2
    assert adv.kept_mlp_bytes("mixtral", moe, {"fsdp": 64}, 4, "minimal") == 0  # expert matmuls: batch dims
    dense = {**moe, "experts": 0, "top_k": 0}
    assert adv.kept_mlp_bytes("llama", dense, {"fsdp": 8, "model": 2, "stage": 2}, 1, "minimal") == \
        16 * 4096 * 2 * 14336 / 2 * 2

"""MaxText's fp8 path in the llama and mixtral families (models/fp8.py)."""

import dataclasses

import jax
import numpy as np
import pytest

from lagom_jax import cli, models
from lagom_jax.advise import predict
from lagom_jax.models import fp8

TINY = "vocab=128,d_model=32,heads=4,kv_heads=2,head_dim=8,d_ff=64,layers=2,max_len=16"


def _train(model, config, steps):
    built = models.build(model, config, "dp", "data=1", batch_size=4, seq_len=16, dtype="bfloat16",
                         devices=jax.devices()[:1])
    state, batch = built.init(jax.random.key(0))
    params = [jax.device_get(state.params)]  # the step donates its state
    losses = []
    for _ in range(steps):
        state, metrics = built.train_step(state, batch)
        params.append(jax.device_get(state.params))
        losses.append(float(metrics["loss"]))
    return params, losses


def _leaf(params, *path):
    for key in path:
        params = params[key]
    return np.asarray(params)


@pytest.mark.slow
def test_fp8_steps_train_like_bf16_and_the_scales_follow_the_amax_history():
    _, bf16 = _train("llama", TINY, 2)
    params, losses = _train("llama", TINY + ",quantization=fp8", 2)
    assert np.allclose(losses, bf16, rtol=1e-3) and losses[1] < losses[0]
    # Six fp8 states for each of the layer's seven dots (q, k, v, o, wi_0, wi_1, wo).
    metas = [p for p, _ in jax.tree_util.tree_flatten_with_path(params[0])[0] if fp8.is_meta(p)]
    assert len(metas) == 7 * 6
    # Step 1 records the kernel's amax (the history was zeros, the scale stays 1); step 2 scales
    # by it: amax / 448 (e4m3's largest value). An optimizer update would give neither.
    w0 = _leaf(params[0], "blocks", "attn", "wq").astype(np.float32)
    amax = np.abs(w0.astype(jax.numpy.bfloat16).astype(np.float32)).reshape(2, -1).max(axis=1)
    hist1 = _leaf(params[1], "blocks", "attn", "wq_fp8", "kernel_amax_history")
    assert np.allclose(hist1[:, 0], amax, rtol=1e-6) and not hist1[:, 1:].any()
    assert np.allclose(_leaf(params[1], "blocks", "attn", "wq_fp8", "kernel_scale"), 1.0)
    assert np.allclose(_leaf(params[2], "blocks", "attn", "wq_fp8", "kernel_scale")[:, 0], amax / 448.0, rtol=1e-5)
    # The weights themselves take AdamW's steps (learning rate 1e-3: at most about 1e-3 a step).
    moved = np.abs(_leaf(params[2], "blocks", "attn", "wq") - w0)
    assert moved.max() > 1e-4 and moved.max() < 2.5e-3


def test_an_fp8_gshard_layer_quantizes_every_einsum_as_maxtext():
    params, losses = _train("mixtral", TINY + ",experts=4,top_k=2,quantization=fp8", 1)
    names = {str(p[-2].key) for p, _ in jax.tree_util.tree_flatten_with_path(params[0])[0] if fp8.is_meta(p)}
    assert names == {f"{n}_fp8" for n in ("wq", "wk", "wv", "wo", "router", "dispatch", "wi_0", "wi_1", "combine")}
    assert np.isfinite(losses).all()


@pytest.mark.parametrize("model, config, message", [
    ("mixtral", TINY + ",experts=4,top_k=2,moe=dropless,quantization=fp8", "use moe=dropping"),
    ("gpt2", "tiny", None),
    ("llama", TINY + ",quantization=int8", "must be fp8 or empty"),
])
def test_fp8_where_it_cannot_be_built_is_one_line(model, config, message):
    if config == "tiny":  # a family without MaxText's fp8 path
        cfg = dataclasses.replace(models.families.resolve_config(model, "tiny"), quantization="fp8")
        config = ",".join(f"{f.name}={getattr(cfg, f.name)}" for f in dataclasses.fields(cfg))
        message = "llama and mixtral only"
    with pytest.raises(ValueError, match=message):
        models.build(model, config, "dp", "data=1", batch_size=1, seq_len=16, devices=jax.devices()[:1])


def test_the_cli_refuses_fp8_where_maxtext_has_none(capsys):
    base = ["predict", "--layers", "1", "--d-model", "64", "--heads", "4", "--ffn", "128", "--vocab", "256",
            "--seq-len", "64", "--global-batch", "8", "--mesh", "fsdp=8", "--quantization", "fp8"]
    assert cli.main([*base, "--model", "gpt"]) == 2
    assert "needs --model llama or mixtral" in capsys.readouterr().err
    assert cli.main([*base, "--model", "mixtral", "--experts", "4", "--top-k", "2", "--moe", "dropless"]) == 2
    assert "use moe='dropping'" in capsys.readouterr().err


@pytest.mark.slow
def test_an_fp8_step_compiles_to_fp8_gemms_and_is_predicted_faster():
    # GEMM-heavy shapes (4096 tokens per device, hidden 2048): the dots dominate the step.
    kw = dict(layers=2, d_model=2048, heads=16, kv_heads=4, ffn=8192, vocab=1024, seq_len=2048, global_batch=16,
              mesh={"fsdp": 8}, hardware="h100-sxm-8", remat="minimal_flash", strategy="xla-default")
    bf16 = predict.train_step_job("llama", **kw)
    fp8_job = predict.train_step_job("llama", quantization="fp8", **kw)
    bf16_graph, fp8_graph = bf16.compiled.graph(), fp8_job.compiled.graph()
    gemms = [t for t in fp8_graph.compute_tasks if t.kernel == "fp8-matmul"]
    # Each of a layer's seven dots runs as three fp8 GEMMs (forward, and the two of its
    # backward); under the layer scan each appears once in the loop bodies.
    assert len(gemms) >= 3 * 7
    assert not any(t.kernel == "fp8-matmul" for t in bf16_graph.compute_tasks)
    # XLA quantizes the FSDP-sharded weights before gathering them: the all-gathers carry
    # fp8, half the bytes of bf16's, and the graph prices what they carry.
    def gathered(graph, dtype):
        return sum(t.bytes for t in graph.collectives if t.kind == "all-gather" and t.dtype == dtype)

    assert gathered(fp8_graph, "f8e4m3fn") > 0 and gathered(bf16_graph, "f8e4m3fn") == 0
    assert gathered(fp8_graph, "bf16") + 2 * gathered(fp8_graph, "f8e4m3fn") == pytest.approx(
        gathered(bf16_graph, "bf16"), rel=0.05)
    ratio = bf16.predicted_ms("xla-default") / fp8_job.predicted_ms("xla-default")
    # At bf16's rate the quantization's casts and amax reductions would make fp8 slower (< 1).
    assert 1.1 < ratio < 1.7

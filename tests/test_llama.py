"""Llama and Mixtral: they train sharded as on one device, route tokens as specified, and the
prediction contract compiles them for GPU clusters."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lagom_jax import models
from lagom_jax.models import llama, pipeline


@functools.cache
def _losses(model, recipe, mesh, steps=3, config="tiny", **kw):
    devices = jax.devices()[: math.prod(models.parse_mesh(mesh).values())]
    built = models.build(model, config, recipe, mesh, batch_size=8, devices=devices, **kw)
    state, batch = built.init(jax.random.key(0))
    out = []
    for _ in range(steps):
        state, metrics = built.train_step(state, batch)
        out.append(float(metrics["loss"]))
    return tuple(out)


@pytest.mark.parametrize("model,recipe,mesh,remat", [
    ("llama", "fsdp", "fsdp=8", "none"),
    ("llama", "dp+tp", "data=4,model=2", "minimal_flash"),
    ("mixtral", "fsdp+ep", "fsdp=2,expert=4", "save_dot_except_mlp"),
    ("mixtral", "dp+tp+ep", "data=2,model=2,expert=2", "none"),
    ("llama", "cp+ring", "context=8", "minimal_flash"),
    ("llama", "fsdp+cp", "fsdp=2,context=4", "none"),
    ("llama", "dp+cp+ring+tp", "data=2,context=2,model=2", "full"),
])
def test_sharded_training_matches_one_device(model, recipe, mesh, remat):
    one = _losses(model, "dp", "data=1")
    sharded = _losses(model, recipe, mesh, remat=remat)
    np.testing.assert_allclose(sharded, one, rtol=2e-5)
    assert one[2] < one[0]  # it learns


def test_unrolled_layers_and_full_remat_compute_the_same_step():
    np.testing.assert_allclose(_losses("llama", "fsdp", "fsdp=8", scan=False, remat="full"),
                               _losses("llama", "fsdp", "fsdp=8", remat="none"), rtol=1e-5)


def _module(model, recipe, mesh, **kw):
    devices = jax.devices()[: math.prod(models.parse_mesh(mesh).values())]
    return models.build(model, "tiny", recipe, mesh, batch_size=8, devices=devices, **kw).compiled_text()


def test_context_parallelism_shards_the_weights_and_the_sequence_over_context():
    built = models.build("llama", "tiny", "cp+ring", "context=8", batch_size=8)
    state_sh, _ = built.shardings
    wq = state_sh.params["blocks"]["attn"]["wq"].spec
    assert "context" in jax.tree.leaves(tuple(wq))  # embed over context, as fsdp
    text = built.compiled_text()
    # The ring's point-to-point steps: 7 forward and their transposes backward.
    assert sum(" collective-permute(" in ln or "collective-permute-start(" in ln for ln in text.splitlines()) >= 14


def test_scan_is_one_loop_and_unrolling_removes_it():
    assert _module("llama", "fsdp", "fsdp=8").count(" while(") >= 1
    assert " while(" not in _module("llama", "fsdp", "fsdp=8", scan=False)


def test_unrolled_layers_own_their_weights_as_maxtext_keeps_them():
    """Without scan each layer's weights are arrays of their own (MaxText's layers_0, layers_1, ...):
    no layer slices a stacked array in the forward pass nor pads its gradient back into one."""
    import re

    stacked = models.build("llama", "tiny", "fsdp", "fsdp=8", batch_size=8).abstract_inputs[0].params["blocks"]
    built = models.build("llama", "tiny", "fsdp", "fsdp=8", batch_size=8, scan=False)
    blocks = built.abstract_inputs[0].params["blocks"]
    assert isinstance(blocks, tuple) and len(blocks) == stacked["attn"]["wq"].shape[0]
    assert blocks[1]["attn"]["wq"].shape == stacked["attn"]["wq"].shape[1:]
    assert built.shardings[0].params["blocks"][0]["attn"]["wq"].spec[0] == "fsdp"  # no 'layers' axis left

    def stack_copies(text):
        return re.findall(r'op_name="jit\(\w+\)/(?:jvp\(\)|transpose\(jvp\(\)\))/(?:slice|pad)"', text)

    assert not stack_copies(built.compiled_text())
    # What the count catches: the same unrolled layers over one stacked array.
    w = jnp.ones((4, 8, 8))

    def loss(w):
        return pipeline.scan_layers(lambda p, h, enc, bias: jnp.tanh(h @ p), w, jnp.ones((2, 8)), None, None,
                                    scan=False).sum()

    assert len(stack_copies(jax.jit(jax.grad(loss)).lower(w).compile().as_text())) >= 4


def test_experts_reach_their_devices_by_all_to_all():
    def moe_all_to_alls(text):
        return [ln for ln in text.splitlines() if " all-to-all(" in ln and "LlamaBlock/mlp/" in ln]

    assert len(moe_all_to_alls(_module("mixtral", "fsdp+ep", "fsdp=2,expert=4"))) >= 2  # there and back
    assert not moe_all_to_alls(_module("mixtral", "fsdp", "fsdp=8"))  # experts not split: none


def test_remat_policies_save_less_as_they_get_stricter():
    """Full remat recomputes the whole layer in the backward pass: more FLOPs than none."""
    from lagom_jax.program import graph

    def flops(remat):
        return sum(t.flops * t.trip_count for t in graph.from_hlo_text(
            _module("llama", "dp", "data=8", remat=remat)).tasks)

    none, minimal, full = flops("none"), flops("minimal"), flops("full")
    assert none < full and minimal < full


def test_routing_keeps_capacity_and_drops_the_rest():
    # 4 tokens all preferring expert 0, then expert 1; 2 experts, top-1, capacity 2.
    logits = jnp.array([[[3.0, 1.0]] * 4])
    dispatch, combine = llama.route(logits, top_k=1, slots=2)
    assert dispatch.shape == (1, 4, 2, 2)
    per_token = dispatch.sum(axis=(2, 3))[0]
    np.testing.assert_array_equal(per_token, [1, 1, 0, 0])  # the first two fit, the rest drop
    np.testing.assert_array_equal(dispatch[0, :2, 0].argmax(-1), [0, 1])  # slots in token order
    np.testing.assert_allclose(combine.sum(axis=(2, 3))[0], [1, 1, 0, 0], rtol=1e-6)  # top-1 weight is 1


def test_top2_weights_are_renormalised_and_slots_go_in_token_order():
    logits = jnp.log(jnp.array([[[0.5, 0.3, 0.2], [0.2, 0.5, 0.3]]]))
    dispatch, combine = llama.route(logits, top_k=2, slots=4)
    np.testing.assert_allclose(combine.sum(axis=(2, 3))[0], [1.0, 1.0], rtol=1e-6)
    np.testing.assert_allclose(combine[0, 0].sum(-1), [0.625, 0.375, 0.0], rtol=1e-5)
    # Expert 1, as MaxText's generate_masks fills it (a count over tokens x choices): token 0's
    # second choice takes slot 0 before token 1's first choice (slot 1).
    assert dispatch[0, 0, 1, 0] == 1 and dispatch[0, 1, 1, 1] == 1


def test_capacity_formula():
    cfg = models.families.resolve_config("mixtral", "mixtral-8x7b")
    assert llama.capacity(cfg, 4096) == 1280  # MaxText: int(ceil(4096 * 2 / 8) * 1.25)
    assert llama.capacity(cfg, 1000) == 312  # int(250 * 1.25): truncated, where ceil(312.5) would give 313
    assert llama.capacity(dataclasses.replace(cfg, capacity_factor=1.0), 1024) == 256


def test_configs_match_the_published_shapes():
    c = models.families.resolve_config
    assert (c("llama", "llama3-70b").layers, c("llama", "llama3-70b").kv) == (80, 8)
    assert c("llama", "llama3.1-405b").d_ff == 53248 and c("llama", "llama2-7b").kv == 32
    m = c("mixtral", "mixtral-8x7b")
    assert (m.experts, m.top_k, m.vocab) == (8, 2, 32000)
    custom = c("llama", "layers=80,d_model=8192,heads=64,kv_heads=8,ffn=28672")
    assert (custom.layers, custom.head_dim, custom.d_ff, custom.kv) == (80, 128, 28672, 8)


@pytest.mark.parametrize("call,message", [
    (lambda: models.build("llama", "tiny", "tp", "model=4", devices=jax.devices()[:4]),
     "kv heads 2 not divisible by the model axis 4"),
    (lambda: models.build("mixtral", "tiny", "ep", "expert=8"), "experts 4 not divisible by the expert axis 8"),
    (lambda: models.build("llama", "tiny", "dp", "data=8", batch_size=4), "not a multiple of the 8 data-parallel ranks"),
    (lambda: models.build("llama", "huge", "dp", "data=8"), "unknown llama config 'huge'"),
    (lambda: models.build("llama", "tiny", "dp", "data=8", remat="most"), "unknown remat policy 'most'"),
    (lambda: models.build("llamas", "tiny", "dp", "data=8"), "unknown model 'llamas'"),
    (lambda: models.families.resolve_config("llama", "layers=x"), "layers='x' is not a number"),
    (lambda: models.build("mixtral", "tiny", "cp", "context=8"), "built for the llama family, not mixtral"),
    (lambda: models.build("llama", "tiny", "cp", "context=8", seq_len=8), "seq_len 8 does not divide"),
    (lambda: models.build("llama", "tiny", "cp", "context=8", attention="flash"), "use attention='xla'"),
    (lambda: models.build("llama", "tiny", "ring", "context=8"), "use it as 'cp\\+ring'"),
    (lambda: models.build("llama", "tiny", "cp+tp+sp", "context=4,model=2"), "not \\['sp'\\]"),
])
def test_bad_input_names_the_numbers(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_remat_names_are_maxtexts():
    assert set(pipeline.REMAT_POLICIES) >= {"none", "minimal", "save_qkv_proj", "save_dot_except_mlp",
                                            "save_dot_except_mlpwi", "full"}


@pytest.mark.parametrize("model,config", [
    ("llama", "vocab=128,d_model=64,heads=4,kv_heads=2,head_dim=16,d_ff=64,layers=2,max_len=16"),
    ("gpt2", "vocab=128,d_model=64,heads=4,head_dim=16,d_ff=64,layers=2,max_len=16"),
])
def test_flash_attention_trains_as_xla_attention(model, config):
    """On CPU devices the flash kernel runs in Pallas interpret mode: the same losses, sharded."""
    def losses(impl):
        built = models.build(model, config, "fsdp", "fsdp=8", batch_size=8, attention=impl)
        state, batch = built.init(jax.random.key(0))
        out = []
        for _ in range(2):
            state, metrics = built.train_step(state, batch)
            out.append(float(metrics["loss"]))
        return out

    np.testing.assert_allclose(losses("flash"), losses("xla"), rtol=1e-5)


def test_each_attention_layout_moves_the_step_flops_as_counted_by_hand():
    from jaxpr_flops import step_dot_flops

    base = "vocab=128,d_model=64,heads=4,kv_heads=2,head_dim=16,d_ff=128,layers=4,max_len=64"
    b, s, h, d, w = 2, 64, 4, 16, 16
    plain = step_dot_flops("llama", base, batch=b, seq=s)
    # Scores and context of one layer, forward: two dots of 2 b h d per query-key pair; the
    # step runs each forward once and backward twice (remat none): 3x.
    per_layer = lambda keys: 3 * 2 * (2 * b * h * s * keys * d)  # noqa: E731
    # Every layer windowed: blocks of w queries against 2w keys instead of s.
    windowed = step_dot_flops("llama", base + f",window={w}", batch=b, seq=s)
    assert plain - windowed == pytest.approx(4 * (per_layer(s) - per_layer(2 * w)), rel=1e-12)
    # Every 2nd layer global: half the layers back at s keys.
    pattern = step_dot_flops("llama", base + f",window={w},global_every=2", batch=b, seq=s)
    assert pattern - windowed == pytest.approx(2 * (per_layer(s) - per_layer(2 * w)), rel=1e-12)
    # The global layers' own KV heads (4 instead of 2): their k and v projections grow,
    # [b s, d_model] x [d_model, kv d] each, 3x for the step.
    kv4 = step_dot_flops("llama", base + f",window={w},global_every=2,global_kv_heads=4", batch=b, seq=s)
    assert kv4 - pattern == pytest.approx(2 * 3 * 2 * (2 * b * s * 64 * (4 - 2) * d), rel=1e-12)
    # Every 3rd of 4 layers global: one repeat (2 windowed, 1 global), then one windowed layer
    # past it, as written: one global layer of four.
    rest = step_dot_flops("llama", base + f",window={w},global_every=3", batch=b, seq=s)
    assert rest - windowed == pytest.approx(1 * (per_layer(s) - per_layer(2 * w)), rel=1e-12)


@pytest.mark.parametrize("config, message", [
    ("window=128", "does not fit seq_len 64"),
    ("window=24", "window must divide"),
    ("window=16,global_every=5", "4 layers hold no global layer of global_every 5"),
    ("global_every=2", "needs a window"),
    ("window=16,global_every=2,global_kv_heads=3", "must divide heads 4"),
])
def test_an_attention_layout_that_cannot_be_built_is_one_line(config, message):
    base = "vocab=128,d_model=64,heads=4,kv_heads=2,head_dim=16,d_ff=128,layers=4,max_len=128,"
    with pytest.raises(ValueError, match=message):
        models.build("llama", base + config, "dp", "data=1", batch_size=1, seq_len=64, devices=jax.devices()[:1])


TINY_DIMS = "vocab=128,d_model=32,heads=4,kv_heads=2,head_dim=8,d_ff=64,layers=2,max_len=16"


def test_a_matmul_embedding_lookup_trains_as_the_gather_does():
    # MaxText's use_iota_embed / Praxis' matmul lookup: the same rows, by a one-hot dot.
    gather = _losses("llama", "fsdp", "fsdp=8", config=TINY_DIMS)
    matmul = _losses("llama", "fsdp", "fsdp=8", config=TINY_DIMS + ",embed_lookup=matmul")
    np.testing.assert_allclose(matmul, gather, rtol=1e-5)
    gpt = lambda style: _losses("gpt2", "dp", "data=8", config=f"vocab=128,d_model=32,heads=4,head_dim=8,"  # noqa: E731
                                f"d_ff=64,layers=2,max_len=16,embed_lookup={style}")
    np.testing.assert_allclose(gpt("matmul"), gpt("gather"), rtol=1e-5)


def test_gradients_are_clipped_to_their_global_norm_before_the_update():
    plain = _losses("llama", "fsdp", "fsdp=8", config=TINY_DIMS)
    assert _losses("llama", "fsdp", "fsdp=8", config=TINY_DIMS + ",grad_clip=1e9") == pytest.approx(plain, rel=1e-5)
    clipped = _losses("llama", "fsdp", "fsdp=8", config=TINY_DIMS + ",grad_clip=1e-3")
    assert clipped[0] == pytest.approx(plain[0], rel=1e-6)  # the same first step's loss
    assert abs(clipped[2] - clipped[0]) < abs(plain[2] - plain[0])  # smaller updates move it less

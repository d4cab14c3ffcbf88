"""Mixture-of-experts as it is trained today (issue 38): dropless routing with grouped GEMMs,
shared and fine-grained experts, dense first layers, the grouped GEMM's price, bad input."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from lagom_jax import cli, models
from lagom_jax.advise import predict
from lagom_jax.cluster import hardware
from lagom_jax.costs import kernels
from lagom_jax.models import grouped_gemm, llama
from lagom_jax.models.sharding import Layout
from jaxpr_flops import dot_flops, step_dot_flops


def _config(name="tiny", **over):
    cfg = dataclasses.replace(models.families.resolve_config("mixtral", name), **over)
    return ",".join(f"{f.name}={getattr(cfg, f.name)}" for f in dataclasses.fields(cfg))


@functools.cache
def _losses(config, recipe="dp", mesh="data=1", steps=3):
    devices = jax.devices()[: math.prod(models.parse_mesh(mesh).values())]
    built = models.build("mixtral", config, recipe, mesh, batch_size=8, devices=devices)
    state, batch = built.init(jax.random.key(0))
    out = []
    for _ in range(steps):
        state, metrics = built.train_step(state, batch)
        out.append(float(metrics["loss"]))
    return tuple(out)


@pytest.mark.slow
def test_dropless_matches_dropping_when_nothing_drops():
    cfg = models.families.resolve_config("mixtral", "tiny")
    assert cfg.moe == "dropping"  # the default: MaxText's dense path (docs/moe.md)
    # capacity = tokens * top_k / experts * factor = every token: no assignment drops.
    roomy = cfg.experts / cfg.top_k
    dropless = _losses(_config(moe="dropless"))
    dropping = _losses(_config(moe="dropping", capacity_factor=roomy))
    np.testing.assert_allclose(dropless, dropping, rtol=1e-5)
    # With little capacity tokens drop, and the loss differs.
    assert not np.allclose(_losses(_config(moe="dropping", capacity_factor=0.25)), dropless, rtol=1e-5)


@pytest.mark.parametrize("recipe,mesh,moe", [("fsdp+ep", "fsdp=2,expert=4", "dropless"),
                                             ("dp+tp+ep", "data=2,model=2,expert=2", "dropping")])
@pytest.mark.slow
def test_shared_fine_grained_experts_and_dense_first_layer_train_sharded_as_on_one_device(recipe, mesh, moe):
    config = _config("tiny-deepseek", moe=moe)
    one = _losses(config)
    np.testing.assert_allclose(_losses(config, recipe, mesh), one, rtol=2e-5)
    assert one[2] < one[0]


def test_a_shared_expert_adds_exactly_one_dense_mlp_per_token():
    base = step_dot_flops("mixtral", _config(shared_experts=0))
    shared = step_dot_flops("mixtral", _config(shared_experts=1))
    cfg = models.families.resolve_config("mixtral", "tiny")
    tokens, moe_layers = 2 * 16, cfg.layers
    # A SwiGLU MLP: three [tokens, d] x [d, f] matmuls forward, twice as many backward.
    mlp = 3 * 2 * tokens * cfg.d_model * cfg.d_ff
    assert shared - base == pytest.approx(3 * mlp * moe_layers, rel=1e-12)


def test_grouped_gemm_priced_time_grows_with_imbalance_at_fixed_flops():
    hw = hardware.get("h100-sxm-8", 1)
    times = []
    for imbalance in (1.0, 2.0, 4.0):
        groups = kernels.balanced_groups(16384, 8, imbalance)
        assert sum(groups) == 16384 and max(groups) == round(2048 * imbalance)
        times.append(kernels.grouped_gemm_time_us(groups, 14336, 4096, hw))
    assert times[0] < times[1] < times[2]
    # Balanced, it runs near one dense GEMM of the same FLOPs (MegaBlocks: 98.6% of cuBLAS).
    dense = kernels.gemm_time_us(16384, 14336, 4096, hw)
    assert dense <= times[0] <= dense * 1.1


def test_jaxs_grouped_kernels_lose_rate_as_fewer_row_blocks_share_a_groups_weights():
    hw = hardware.get("h200-sxm-8", 1)
    eff = kernels.pallas_grouped_efficiency
    assert eff((512,) * 64) < eff((1024,) * 16) < eff((2048,) * 8) == eff((8192,) * 2) < kernels.GROUPED_GEMM_EFFICIENCY
    assert eff((0, 0)) == kernels.GROUPED_GEMM_EFFICIENCY and eff((0, 512)) == eff((512,))  # empty groups: none of it

    def priced(groups, rows, k, n):
        sizes = kernels.balanced_groups(rows, groups)
        return kernels.grouped_gemm_time_us(sizes, n, k, hw, efficiency=eff(sizes))

    # The H200 measurements the two numbers come from (in sample: the price is within 6% of each).
    for (groups, rows, k, n), measured_us in {(8, 16384, 4096, 14336): 3146, (8, 16384, 14336, 4096): 2934,
                                              (64, 32768, 2560, 1280): 599, (64, 32768, 1280, 2560): 577}.items():
        assert priced(groups, rows, k, n) == pytest.approx(measured_us, rel=0.06)


def test_configs_follow_the_published_shapes():
    c = models.families.resolve_config
    m = c("mixtral", "mixtral-8x22b")
    assert (m.d_model, m.layers, m.heads, m.kv, m.d_ff, m.vocab, m.experts, m.top_k) == (
        6144, 56, 48, 8, 16384, 32768, 8, 2)
    d = c("mixtral", "deepseek-v3")
    assert (d.d_model, d.layers, d.experts, d.top_k, d.shared_experts, d.expert_ffn, d.dense_layers, d.d_ff) == (
        7168, 61, 256, 8, 1, 2048, 3, 18432)
    assert c("mixtral", "layers=4,moe=dropping").moe == "dropping"
    r = c("mixtral", "marin-moe")  # marin-community/marin experiments/grug/moe_hero_fsdp
    assert (r.d_model, r.layers, r.heads, r.kv, r.experts, r.top_k, r.ffn_e, r.shared_experts) == (
        6144, 48, 48, 12, 128, 4, 3072, 2)
    assert (r.window, r.global_every, r.global_kv_heads, r.capacity_factor) == (512, 6, 6, 1.0)


@pytest.mark.parametrize("kw,message", [
    (dict(experts=6, top_k=2, expert_ways=4), "experts 6 not divisible by the expert axis 4"),
    (dict(experts=4, top_k=5), "top_k 5 must be in 1..experts \\(4\\)"),
    (dict(experts=8, top_k=2, expert_imbalance=0.5), "expert imbalance 0.5 must be >= 1"),
])
def test_bad_moe_options_name_the_numbers(kw, message):
    with pytest.raises(ValueError, match=message):
        predict.check_moe(**kw)


@pytest.mark.parametrize("extra,message", [
    (["--experts", "6", "--top-k", "2", "--mesh", "fsdp=2,expert=4"], "experts 6 not divisible by the expert axis 4"),
    (["--experts", "4", "--top-k", "5", "--mesh", "fsdp=8"], "top_k 5 must be in 1..experts"),
    (["--experts", "8", "--top-k", "2", "--mesh", "fsdp=8", "--expert-imbalance", "0.5"], "must be >= 1"),
    (["--experts", "8", "--top-k", "2", "--mesh", "fsdp=8", "--moe", "dropless", "--moe-dispatch", "ring"],
     "needs an expert axis"),
])
def test_cli_refuses_bad_moe_options_in_one_line(extra, message, capsys):
    args = ["predict", "--model", "mixtral", "--layers", "2", "--d-model", "64", "--heads", "4", "--ffn", "128",
            "--vocab", "256", "--seq-len", "64", "--global-batch", "8", *extra]
    assert cli.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message.replace("\\", "") in err and len(err.splitlines()) == 1


def test_llama_routing_helper_renormalises():
    weights, chosen = llama.top_k_routing(np.log(np.array([[0.5, 0.3, 0.2]])), 2)
    np.testing.assert_allclose(np.asarray(weights), [[0.625, 0.375]], rtol=1e-6)
    assert chosen.tolist() == [[0, 1]]


def test_the_cpu_ragged_all_to_all_does_what_jax_documents():
    # jax.lax.ragged_all_to_all's own example (axis of size 2), on the CPU stand-in.
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:2]), ("x",))
    rows = lambda *v: np.array(v, np.int32)  # noqa: E731
    args = (rows(1, 2, 2, 3, 4, 0), np.zeros(8, np.int32), rows(0, 1, 0, 1), rows(1, 2, 1, 1),
            rows(0, 0, 1, 2), rows(1, 1, 2, 1))
    run = jax.jit(jax.shard_map(functools.partial(llama.ragged_all_to_all, axis="x"), mesh=mesh,
                                in_specs=(P("x"),) * 6, out_specs=P("x")))
    assert np.asarray(run(*args)).tolist() == [1, 3, 0, 0, 2, 2, 4, 0]


def test_every_exchange_of_the_step_is_priced_also_inside_platform_dependents_conditional():
    # jax.lax.platform_dependent leaves a one-branch conditional around a collective: the forward's two
    # exchanges, their recompute under remat and the backward's two (each with the 16-byte all-to-all
    # of offsets JAX's transpose adds) are all in the graph, not one compute task per conditional.
    kw = dict(layers=1, d_model=64, heads=4, kv_heads=4, ffn=128, vocab=256, experts=4, top_k=2, moe="dropless",
              seq_len=64, global_batch=8, mesh={"fsdp": 2, "expert": 4}, hardware="h100-sxm-8",
              strategy="xla-default", remat="full")
    job = predict.train_step_job("mixtral", **kw)
    assert "conditional(" in job.compiled.text
    tasks = job.compiled.graph().tasks
    # Synchronous or async as the XLA release schedules them (jax 0.12 runs most synchronously).
    ragged = sorted(t.bytes for t in tasks if t.opcode.startswith("ragged-all-to-all"))
    # Each moves at most its rows: the combine sends from a buffer sized for all 4 sources.
    assert ragged == [16384.0] * 6
    dense = sorted(t.bytes for t in tasks if t.kind == "all-to-all" and not t.opcode.startswith("ragged"))
    assert dense == [16.0] * 4


def test_dropless_expert_exchange_compiles_for_gpus_as_a_ragged_all_to_all():
    from lagom_jax.program import graph

    job = predict.train_step_job("mixtral", layers=1, d_model=64, heads=4, kv_heads=4, ffn=128, vocab=256,
                                 experts=4, top_k=2, moe="dropless", seq_len=64, global_batch=8,
                                 mesh={"fsdp": 2, "expert": 4}, hardware="h100-sxm-8", strategy="xla-default")
    text = job.compiled.text
    assert "ragged-all-to-all" in text
    a2a = [t for t in graph.from_hlo_text(text).tasks if t.kind == "all-to-all"]
    assert a2a and all(t.bytes > 0 for t in a2a)


@pytest.mark.slow
@pytest.mark.parametrize("dispatch, extra", [
    # Fixed buffers of capacity_factor 4 x the even share hold every routed row of these batches
    # (the ring's: every assignment of the 4 shards' gathered tokens).
    ("ring", {"capacity_factor": 4.0}),
    ("all-to-all", {"capacity_factor": 4.0}),
])
def test_each_dispatch_trains_as_the_ragged_exchange(dispatch, extra):
    # The exchanges run the same experts on the same rows: the same losses, dropless and grouped.
    for moe in ("dropless", "grouped"):
        cfg = dict(moe=moe, d_model=32, d_ff=64, **extra)
        other = _losses(_config(moe_dispatch=dispatch, **cfg), "fsdp+ep", "fsdp=2,expert=4")
        ragged = _losses(_config(**cfg), "fsdp+ep", "fsdp=2,expert=4")
        np.testing.assert_allclose(other, ragged, rtol=1e-5)


def _dispatch_step(dispatch: str) -> tuple[str, tuple]:
    """(compiled text, tasks) of one dropless layer, 4 experts over expert=4, fsdp=2, with ``dispatch``."""
    from lagom_jax.program import graph

    kw = dict(layers=1, d_model=64, heads=4, kv_heads=4, ffn=128, vocab=256, experts=4, top_k=2, seq_len=64,
              global_batch=8, mesh={"fsdp": 2, "expert": 4}, hardware="h100-sxm-8", strategy="xla-default",
              remat="none")
    text = predict.train_step_job("mixtral", **kw, moe="dropless", moe_dispatch=dispatch).compiled.text
    return text, graph.from_hlo_text(text).tasks


def test_the_ring_dispatch_moves_the_bytes_counted_by_hand():
    # One layer, 4 experts over expert=4, fsdp=2: a device holds 8 x 64 / 8 = 64 tokens of d=64. The ring
    # all-gathers every device's tokens over the expert axis and reduce-scatters the weighted outputs:
    # [4 x 64, 64] of bf16 each, forward; no ragged all-to-all anywhere.
    text, tasks = _dispatch_step("ring")
    assert "ragged-all-to-all" not in text
    ag = [t for t in tasks if t.kind == "all-gather" and t.bytes == 4 * 64 * 64 * 2 and len(t.groups[0]) == 4]
    rs = [t for t in tasks if t.kind == "reduce-scatter" and t.bytes == 4 * 64 * 64 * 2 and len(t.groups[0]) == 4]
    assert ag and rs  # forward: tokens out, outputs back (the backward: the same two, transposed)


@pytest.mark.parametrize("kw,message", [
    (dict(experts=8, top_k=2, moe="dropless", moe_dispatch="ring"), "needs an expert axis"),
    (dict(experts=8, top_k=2, expert_ways=4, moe="dropping", moe_dispatch="ring"), "moe=dropless or moe=grouped"),
    (dict(experts=8, top_k=2, moe_dispatch="nccl"), "moe_dispatch must be one of"),
    (dict(experts=8, top_k=2, moe="dropless", moe_dispatch="all-to-all"), "needs an expert axis"),
])
def test_a_dispatch_the_mesh_cannot_run_is_refused_in_one_line(kw, message):
    with pytest.raises(ValueError, match=message):
        predict.check_moe(**kw)


def test_xlas_ragged_decomposer_turns_the_exchange_into_padded_all_to_alls():
    # The flag rewrites each ragged all-to-all into a dense one whose per-peer blocks are padded to the
    # whole send buffer: expert-axis (4) times the buffer, and no ragged collective left in the module.
    # The combine's send buffer is sized for all 4 sources, 4x the rows it moves.
    from lagom_jax.program import graph

    kw = dict(layers=1, d_model=64, heads=4, kv_heads=4, ffn=128, vocab=256, experts=4, top_k=2, moe="dropless",
              seq_len=64, global_batch=8, mesh={"fsdp": 2, "expert": 4}, hardware="h100-sxm-8",
              strategy="xla-default")
    flag = {"xla_gpu_unsupported_enable_ragged_all_to_all_decomposer": True}
    ragged = [t for t in predict.train_step_job("mixtral", **kw).compiled.graph().tasks if t.kind == "all-to-all"]
    job = predict.train_step_job("mixtral", **kw, xla_flags=flag)
    dense = [t for t in graph.from_hlo_text(job.compiled.text).tasks if t.kind == "all-to-all"]
    assert "ragged-all-to-all" not in job.compiled.text
    assert any(t.opcode.startswith("ragged-all-to-all") for t in ragged)
    assert max(t.bytes for t in dense) == 4 * 4 * max(t.bytes for t in ragged)


def test_the_busiest_device_sets_a_skewed_exchange():
    from lagom_jax.program import graph

    assert graph.busiest_device_load(8, 4, 1.0) == 1.0
    assert graph.busiest_device_load(8, 8, 2.0) == 2.0  # one expert per device: its own skew
    assert graph.busiest_device_load(8, 4, 2.0) == pytest.approx((2 + 6 / 7) / 2)  # shares a device
    assert graph.busiest_device_load(8, 2, 8.0) == 2.0  # every token to one device: all of it
    assert graph.busiest_device_load(8, 1, 4.0) == 1.0  # no exchange


@pytest.mark.slow
def test_expert_imbalance_moves_the_dropless_exchange_only():
    # Rows of 256 x bf16, 1024 routed rows per device: a 1 MiB exchange, past NCCL's latency floor.
    kw = dict(layers=1, d_model=256, heads=4, kv_heads=4, ffn=512, vocab=256, experts=4, top_k=2, seq_len=256,
              global_batch=32, mesh={"fsdp": 2, "expert": 4}, hardware="h100-sxm-8", strategy="xla-default")

    def exchange(job):
        """(bytes, predicted us) of the step's dropless exchanges under XLA's defaults."""
        result = job.planned.results["xla-default"]
        ids = {t.id: t for t in result.graph.tasks if t.kernel == "ragged-all-to-all"}
        us = sum(i.end - i.start for i in result.timeline.intervals if i.task_id in ids)
        return sum(t.bytes for t in ids.values()), us

    balanced = predict.train_step_job("mixtral", **kw, moe="dropless")
    skewed = predict.train_step_job("mixtral", **kw, moe="dropless", expert_imbalance=3.0)
    (b_bytes, b_us), (s_bytes, s_us) = exchange(balanced), exchange(skewed)
    assert b_bytes > 0 and s_bytes == pytest.approx(3.0 * b_bytes)  # one expert per device
    assert s_us > b_us
    assert skewed.predicted_ms("xla-default") != balanced.predicted_ms("xla-default")
    assert "receives and sends back 3.00x" in dict(skewed.plan.decisions)["expert imbalance"]
    # GShard's capacity buffers do not move with the routing: nothing priced changes, and it says so.
    dropping_skewed = predict.train_step_job("mixtral", **kw, moe="dropping", expert_imbalance=3.0)
    assert dropping_skewed.compiled.exchange_load == 1.0
    assert "changes nothing priced" in dict(dropping_skewed.plan.decisions)["expert imbalance"]


def test_a_gshard_layer_runs_maxtexts_dots_and_no_other():
    # MaxText's dense MoE (layers/moe.py dense_matmul with capacity_factor > 0), by hand per
    # group (one sequence): router 2BSME, dispatch "BSM,BSEC->EBCM" 2BSECM, experts
    # "EBCM,EMH->EBCH" x2 and "EBCH,EHM->EBCM" 6EBCMH, combine "EBCM,BSEC->BSM" 2BSECM; the
    # masks are built elementwise (generate_masks), no dot.
    cfg = dataclasses.replace(models.families.resolve_config("mixtral", "tiny"), d_model=64, d_ff=128)
    b, s = 2, 256
    m, h, e, c = cfg.d_model, cfg.ffn_e, cfg.experts, llama.capacity(cfg, s)
    assert c == int(math.ceil(s * cfg.top_k / e) * cfg.capacity_factor)
    layer = llama.MoE(cfg, jnp.bfloat16, Layout())
    x = jax.ShapeDtypeStruct((b, s, m), jnp.bfloat16)
    params = jax.eval_shape(lambda: layer.init(jax.random.PRNGKey(0), jnp.zeros((b, s, m), jnp.bfloat16)))
    jaxpr = jax.make_jaxpr(layer.apply)(params, jnp.zeros(x.shape, x.dtype)).jaxpr
    hand = 2 * b * s * m * e + 2 * b * s * e * c * m + 6 * e * b * c * m * h + 2 * b * s * e * c * m
    assert dot_flops(jaxpr) == hand


# ------------------------------------------------------- grouped GEMMs (moe="grouped")


@pytest.mark.slow
def test_grouped_kernels_train_as_ragged_dot():
    # On the CPU the kernels' contract runs as ragged_dot and the custom VJP's transposes: the
    # same losses as the dropless layer, on one device and with an expert exchange.
    for recipe, mesh in (("dp", "data=1"), ("fsdp+ep", "fsdp=2,expert=4")):
        np.testing.assert_allclose(_losses(_config(moe="grouped", d_model=32, d_ff=64), recipe, mesh),
                                   _losses(_config(moe="dropless", d_model=32, d_ff=64), recipe, mesh), rtol=1e-5)


def test_grouped_kernels_have_the_gradients_of_ragged_dot():
    from lagom_jax.models import grouped_gemm

    ks = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(ks[0], (40, 32))
    w = jax.random.normal(ks[1], (4, 32, 16))
    sizes = jnp.array([10, 0, 20, 6], jnp.int32)  # 36 rows in groups, 4 of padding
    dy = jax.random.normal(ks[2], (40, 16))
    got = jax.vjp(lambda x, w: grouped_gemm.grouped_matmul(x, w, sizes), x, w)
    want = jax.vjp(lambda x, w: jax.lax.ragged_dot(x, w, sizes), x, w)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    for a, b in zip(got[1](dy), want[1](dy)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_the_grouped_step_runs_jaxs_kernels_at_the_routed_flops_and_a_busier_expert_lengthens_them():
    # No expert axis: each device's rows are its own tokens x top_k, in 8 groups.
    kw = dict(layers=1, d_model=256, heads=4, kv_heads=4, ffn=512, vocab=256, experts=8, top_k=2, seq_len=256,
              global_batch=16, mesh={"fsdp": 8}, hardware="h100-sxm-8", strategy="xla-default", remat="none")
    grouped = predict.train_step_job("mixtral", **kw, moe="grouped")
    kernels_ = [t for t in grouped.compiled.graph().tasks if t.kernel == "grouped-gemm"]
    assert len(kernels_) == 9 and all("mosaic_gpu" in t.custom_call for t in kernels_)  # 3 GEMMs, fwd and 2 grads
    rows = 16 // 8 * 256 * 2  # tokens on a device x top_k
    forward = 2 * rows * 256 * 512 * 3  # wi_0, wi_1 [256 -> 512] and wo [512 -> 256]
    assert sum(t.flops for t in kernels_) == pytest.approx(3 * forward)
    dense = predict.train_step_job("mixtral", **kw, moe="dropless")
    dots = [t for t in dense.compiled.graph().tasks if t.gemm and t.flops >= 2 * rows * 256 * 512]
    # XLA's ragged_dot: one dense dot over every expert, 8x the routed FLOPs.
    assert sum(t.flops for t in dots) >= 8 * 3 * forward * 0.99
    skewed = predict.train_step_job("mixtral", **kw, moe="grouped", expert_imbalance=4.0)

    def kernel_us(job):
        result = job.planned.results["xla-default"]
        ids = {t.id for t in result.graph.tasks if t.kernel == "grouped-gemm"}
        return sum(i.end - i.start for i in result.timeline.intervals if i.task_id in ids)

    # The busiest expert's rows reach every kernel (4x the mean); at these small shapes every tile still
    # fits in one wave, so the time holds (kernels.grouped_gemm_time_us grows at Mixtral's shapes:
    # test_grouped_gemm_priced_time_grows_with_imbalance_at_fixed_flops).
    busiest = {t.gemm[1] for t in skewed.compiled.graph().tasks if t.kernel == "grouped-gemm"}
    assert busiest == {4 * rows // 8}
    assert kernel_us(skewed) >= kernel_us(grouped)
    assert "busiest group (expert) holds 4x" in dict(skewed.plan.decisions)["expert imbalance"]


def test_on_blackwell_the_grouped_gemms_are_ffi_calls_priced_at_the_measured_rate():
    # A step on 8 B200 with its experts over expert=4: no Pallas kernel (Hopper's), nine typed-FFI
    # calls standing in for the CuTe grouped GEMM users run, mocked by the deviceless compile and priced
    # by their group shapes at QuACK's measured 1175 TFLOP/s (over the B200's 1745 dense): slower than
    # a dense matmul of the same FLOPs would be, as measured. 256 tokens a device, top-2: 512 routed
    # rows in a receive buffer of 4 x 512 (room for every source); the calls are priced by the 512 rows
    # their groups hold. The ragged exchanges run XLA's one-shot kernel inside the 8-GPU host (no NCCL
    # call, so no tuner rule), one CTA a peer.
    from lagom_jax.costs import cost, kernels

    kw = dict(layers=1, d_model=256, heads=4, kv_heads=4, ffn=512, vocab=256, experts=8, top_k=2, seq_len=256,
              global_batch=8, mesh={"fsdp": 2, "expert": 4}, hardware="b200-sxm-8", strategy="xla-default",
              remat="none")
    job = predict.train_step_job("mixtral", **kw, moe="grouped")
    graph = job.compiled.graph()
    calls = [t for t in graph.tasks if t.kernel == "grouped-gemm"]
    assert len(calls) == 9 and {t.custom_call for t in calls} == set(grouped_gemm.FFI_TARGETS)
    assert "mosaic_gpu" not in job.compiled.text and "routed_rows_512" in job.compiled.text
    assert {t.flops / (2 * t.gemm[2] * t.gemm[3]) for t in calls} == {512.0}
    hw = job.compiled.hardware
    ragged = [graph.shape(t, hw.gpus_per_node) for t in graph.collectives
              if graph.shape(t, hw.gpus_per_node).kind == cost.RAGGED]
    assert ragged and {cost.nccl_default_params(*shape, hw).algorithm for shape in ragged} == {"one_shot"}
    assert {c.params.describe() for c in job.plan.collectives if c.kind == cost.RAGGED} == {
        "XLA's one-shot kernel (no NCCL)"}
    assert kernels.grouped_efficiency((512,) * 8, hw) == pytest.approx(1175.0 / 1745.0)
    t = calls[0]
    groups, busiest, n, k = t.gemm
    expected = kernels.grouped_gemm_time_us(kernels.balanced_groups(groups * busiest, groups), n, k, hw,
                                            efficiency=1175.0 / 1745.0)
    assert cost.compute_time_us(t.flops, t.bytes, hw, gemm=t.gemm, kernel=t.kernel) == pytest.approx(expected)
    assert "1175 TFLOP/s" in dict(job.plan.decisions)["grouped GEMMs"]
    assert grouped_gemm.kernel_for(type("D", (), {"compute_capability": "9.0"})()) == "pallas"
    assert grouped_gemm.kernel_for(type("D", (), {"compute_capability": "10.0"})()) == "ffi"


@pytest.mark.parametrize("kw,message", [
    (dict(hardware="a100-sxm-8"), "A100 SXM 80GB is ampere with no measured grouped-GEMM rate: use moe='dropless'"),
    (dict(d_model=72, heads=4), "multiples of 16"),
])
def test_grouped_kernels_refuse_what_they_cannot_run_in_one_line(kw, message):
    args = dict(layers=1, d_model=64, heads=4, kv_heads=4, ffn=128, vocab=256, experts=4, top_k=2, seq_len=64,
                global_batch=8, mesh={"fsdp": 8}, hardware="h100-sxm-8", moe="grouped")
    with pytest.raises(ValueError, match=message):
        predict.train_step_job("mixtral", **{**args, **kw}, strategy="xla-default")


def test_the_all_to_all_dispatch_moves_fixed_buffers_counted_by_hand():
    # One layer, 4 experts over expert=4, fsdp=2: a device holds 64 tokens, top-2: an even share of
    # 64 x 2 / 4 = 32 rows per expert, capacity 1.25 -> 40 slots; a device sends 4 experts x 40 slots x
    # d=64 bf16 each way: dense all-to-alls of that buffer, no ragged collective.
    text, tasks = _dispatch_step("all-to-all")
    assert "ragged-all-to-all" not in text
    buffer = 4 * 40 * 64 * 2
    a2a = [t for t in tasks if t.kind == "all-to-all" and t.bytes == buffer]
    assert len(a2a) >= 2  # to the experts and back (the backward: the same two, transposed)

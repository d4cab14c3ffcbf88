"""Attention cores (models/attention.py) and how the cost model prices flash attention.

On the 8 fake CPU devices the flash kernels run in Pallas interpret mode and must agree
with XLA attention (and with a plain reference); a deviceless compile for abstract H100s
must hold JAX's Triton flash kernels, no collective on q/k/v, and tasks priced by the
kernels' FLOP counts (lagom_jax.program.graph.flash_attention_flops).
"""

from __future__ import annotations

import functools
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, SingleDeviceSharding
from jax.sharding import PartitionSpec as P

from lagom_jax.cluster import hardware
from lagom_jax.costs import cost, simulate
from lagom_jax.program import custom_calls, gpu_compile, graph, hlo
from models import attention, sharding
from models.sharding import Layout

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hlo"
H100 = hardware.get("h100-sxm-8")


def _layout(mesh_spec: str | None, recipe: str, devices=None) -> Layout:
    if mesh_spec is None:
        return Layout()
    mesh = sharding.make_mesh(sharding.parse_mesh(mesh_spec), devices)
    return Layout(mesh, sharding.activation_rules(sharding.parse_recipe(recipe), mesh.axis_names))


def _qkvw(dtype, b=8, s=64, h=4, kvh=2, d=32, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(ks[0], (b, s, h, d), jnp.float32).astype(dtype)
    k = jax.random.normal(ks[1], (b, s, kvh, d), jnp.float32).astype(dtype)
    v = jax.random.normal(ks[2], (b, s, kvh, d), jnp.float32).astype(dtype)
    w = jax.random.normal(ks[3], (b, s, h, d), jnp.float32)
    return q, k, v, w


def _value_and_grads(impl, layout, causal, q, k, v, w):
    def loss(q, k, v):
        o = attention.attend(q, k, v, causal=causal, impl=impl, layout=layout)
        assert o.shape == q.shape and o.dtype == q.dtype
        return jnp.sum(o.astype(jnp.float32) * w)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)


def _reference(q, k, v, causal, window=0):
    """Plain numpy attention: k/v repeated per query head, float64; ``window``: keys within
    ``window`` positions back only."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("bqhd,bkhd->bhqk", q, k) * q.shape[-1] ** -0.5
    if causal:
        back = np.subtract.outer(np.arange(s.shape[-2]), np.arange(s.shape[-1]))
        s = np.where((back >= 0) & ((back < window) if window else True), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhqk,bkhd->bqhd", p, v)


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float(np.abs(a - b).max() / np.abs(b).max())


# ------------------------------------------------------------------------------- API


def test_impls_and_argument_checks():
    assert attention.IMPLS == ("xla", "flash")
    q, k, v, _ = _qkvw(jnp.float32, b=1, s=32)
    with pytest.raises(ValueError, match="unknown attention impl"):
        attention.attend(q, k, v, causal=True, impl="cudnn", layout=Layout())
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        attention.attend(q, k[:, :, :1].repeat(3, 2), v[:, :, :1].repeat(3, 2), causal=True,
                         impl="xla", layout=Layout())
    with pytest.raises(ValueError, match="multiple of 16"):
        attention.attend(q[:, :24], k[:, :24], v[:, :24], causal=True, impl="flash",
                         layout=Layout())
    with pytest.raises(ValueError, match="share a dtype"):
        attention.attend(q, k.astype(jnp.bfloat16), v, causal=True, impl="xla", layout=Layout())


@pytest.mark.parametrize("causal", [True, False])
def test_xla_attention_matches_a_plain_reference(causal):
    q, k, v, _ = _qkvw(jnp.float32, b=2, s=24, h=6, kvh=2, d=8)
    o = attention.attend(q, k, v, causal=causal, impl="xla", layout=Layout())
    np.testing.assert_allclose(o, _reference(q, k, v, causal), rtol=1e-5, atol=1e-5)


def test_xla_gqa_does_not_copy_kv():
    q, k, v, _ = _qkvw(jnp.float32, b=1, s=16, h=8, kvh=2, d=8)
    jaxpr = jax.make_jaxpr(functools.partial(attention.attend, causal=True, impl="xla",
                                             layout=Layout()))(q, k, v).jaxpr
    dots = [e for e in jaxpr.eqns if e.primitive.name == "dot_general"]
    # Both matmuls read k and v as given: the query heads are grouped instead.
    assert len(dots) == 2
    assert jaxpr.invars[1] in dots[0].invars and jaxpr.invars[2] in dots[1].invars


# ----------------------------------------------------------- context parallelism


def _context_layout(mesh_spec: str, recipe: str) -> Layout:
    layout = _layout(mesh_spec, recipe)
    return Layout(layout.mesh, layout.rules, context=sharding.context_strategy(sharding.parse_recipe(recipe)))


def test_the_load_balanced_order_gives_every_rank_the_same_causal_work():
    order = attention.balanced_order(32, 4)
    assert sorted(order) == list(range(32))
    work = [(order[r * 8:(r + 1) * 8] + 1).sum() for r in range(4)]  # keys each rank's queries see
    assert len(set(work)) == 1
    assert list(order[:8]) == [0, 1, 2, 3, 28, 29, 30, 31]  # rank 0: the first and the last chunk
    with pytest.raises(ValueError, match="8 equal chunks; sequence 20 does not divide"):
        attention.balanced_order(20, 4)


@pytest.mark.parametrize("mesh_spec, recipe", [("context=8", "cp+ring"), ("context=4", "cp"),
                                               ("data=2,context=2,model=2", "dp+cp+ring+tp")])
def test_context_parallel_attention_is_attention_in_the_balanced_order(mesh_spec, recipe):
    layout = _context_layout(mesh_spec, recipe)
    q, k, v, w = _qkvw(jnp.float32, b=4, s=32, h=4, kvh=2, d=8)
    order = attention.balanced_order(32, layout.context_ways)
    # The slots hold positions ``order``: attention over them is attention in position order, reordered.
    want = _reference(q[:, np.argsort(order)], k[:, np.argsort(order)], v[:, np.argsort(order)], True)[:, order]
    lc, gc = _value_and_grads("xla", layout, True, q, k, v, w)
    o = jax.jit(functools.partial(attention.attend, causal=True, impl="xla", layout=layout))(q, k, v)
    assert _rel(o, want) < 1e-5

    def plain(q, k, v):  # the same loss in position order on one device
        inv = np.argsort(order)
        o = attention.attend(q[:, inv], k[:, inv], v[:, inv], causal=True, impl="xla", layout=Layout())
        return jnp.sum(o[:, order] * w)

    lp, gp = jax.jit(jax.value_and_grad(plain, argnums=(0, 1, 2)))(q, k, v)
    assert float(lc) == pytest.approx(float(lp), rel=1e-5)
    for a, b in zip(gc, gp):
        assert _rel(a, b) < 1e-5


def _bytes(shape: str) -> int:
    dtype, dims = re.match(r"(\w+)\[([\d,]*)\]", shape).groups()
    return {"f32": 4, "bf16": 2}[dtype] * int(np.prod([int(d) for d in dims.split(",") if d]))


def test_the_ring_and_the_gather_move_the_bytes_counted_by_hand():
    q, k, v, w = _qkvw(jnp.float32, b=4, s=32, h=4, kvh=2, d=8)

    def collectives(recipe, kind):
        layout = _context_layout("context=8", recipe)
        text = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attention.attend(
            q, k, v, causal=True, impl="xla", layout=layout) * w), argnums=(0, 1, 2))).lower(q, k, v).compile().as_text()
        return [_bytes(m) for m in re.findall(rf"= (\w+\[[\d,]*\])\{{[^}}]*\}} {kind}\(", text)]

    # One k/v chunk pair per rank: [2 (k and v), batch 4, 32/8 rows, 2 kv heads, 8] float32.
    chunk = 2 * 4 * 4 * 2 * 8 * 4
    # Seven steps forward; backward, the gradients of the seven (and the chunks again, to
    # recompute each step's scores).
    permutes = collectives("cp+ring", "collective-permute")
    assert len(permutes) >= 14 and set(permutes) == {chunk}
    # The gather: every rank receives the 7 other ranks' chunks (the whole sequence's k/v).
    gathers = collectives("cp", "all-gather")
    assert gathers and set(gathers) == {8 * chunk}


def test_context_parallel_blocks_are_priced_as_the_fused_kernel_they_stand_in_for():
    b, s, h, kvh, d, ways = 4, 64, 4, 2, 8, 8
    q, k, v, w = _qkvw(jnp.float32, b=b, s=s, h=h, kvh=kvh, d=d)
    layout = _context_layout("context=8", "cp+ring")
    text = jax.jit(jax.grad(lambda q, k, v: jnp.sum(attention.attend(
        q, k, v, causal=True, impl="xla", layout=layout) * w), argnums=(0, 1, 2))).lower(q, k, v).compile().as_text()
    g = graph.from_hlo_text(text)
    fwd = [t for t in g.tasks if t.kernel == "attention-forward"]
    bwd = [t for t in g.tasks if t.kernel == "attention-backward"]
    parts = [t for t in g.tasks if t.kernel == custom_calls.FUSED_PART]
    assert fwd and bwd and parts
    assert all(t.gemm == () and t.bytes == 0 and t.fused_attention for t in fwd + bwd)
    # The forward's matmuls: each rank's own causal block (r x r keys, r = s / ways, half of
    # it run) and ways-1 steps of two unmasked c x c blocks (c = r / 2), 4 d FLOPs a pair.
    r = s // ways
    pairs = r * r / 2 + (ways - 1) * 2 * (r // 2) ** 2
    forward = 4.0 * b * h * d * pairs
    assert sum(t.flops for t in fwd) >= forward  # the backward recomputes the scores (a forward matmul)
    assert sum(t.flops for t in bwd) == pytest.approx(2 * forward)  # dq, dk, dv, dp: two forwards
    hw = H100
    assert all(simulate.alone_us(t, hw) == 0.0 for t in parts)  # the softmax runs inside the kernel
    # Switched off (the scopes renamed), the same blocks are einsums that write their scores.
    plain = graph.from_hlo_text(text.replace("fused_attention_block", "attention_block"))
    assert not any(t.kernel in ("attention-forward", "attention-backward", custom_calls.FUSED_PART)
                   for t in plain.tasks)

    def compute_us(gr):
        return sum(simulate.alone_us(t, hw) for t in gr.tasks if not t.is_collective)

    assert compute_us(g) < compute_us(plain)
    assert set(graph.FUSED_BLOCK_SCOPES) == {attention.FUSED_BLOCK_SCOPE, attention.FUSED_CAUSAL_BLOCK_SCOPE}


# ------------------------------------------------- flash == xla on 8 CPU devices (interpret)


@pytest.mark.parametrize("mesh_spec, recipe", [(None, "dp"), ("data=2,model=4", "dp+tp"),
                                               ("fsdp=8", "fsdp")])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_flash_matches_xla_forward_and_gradient(mesh_spec, recipe, dtype):
    # heads 4 / kv_heads 2: on model=4 the kv heads do not divide, so k/v enter the kernel's
    # shard_map whole along heads and each device slices its own.
    layout = _layout(mesh_spec, recipe)
    q, k, v, w = _qkvw(dtype)
    lf, gf = _value_and_grads("flash", layout, True, q, k, v, w)
    lx, gx = _value_and_grads("xla", Layout(), True, q, k, v, w)
    tol = 1e-5 if dtype == jnp.float32 else 2e-2
    assert float(lf) == pytest.approx(float(lx), rel=tol, abs=tol * 10)
    for a, b in zip(gf, gx):
        assert a.dtype == dtype and _rel(a, b) < tol
    of = jax.jit(functools.partial(attention.attend, causal=True, impl="flash",
                                   layout=layout))(q, k, v)
    assert _rel(of, _reference(q, k, v, True)) < (1e-5 if dtype == jnp.float32 else 2e-2)


@pytest.mark.parametrize("h, kvh", [(8, 4), (8, 8), (12, 3)])
def test_flash_gqa_splits_over_the_heads_axis(h, kvh):
    # kv heads divide over model=4 (k/v sharded), no GQA, and neither dividing the other.
    layout = _layout("data=2,model=4", "dp+tp")
    q, k, v, w = _qkvw(jnp.float32, b=4, s=32, h=h, kvh=kvh, d=16)
    causal = kvh != 8
    lf, gf = _value_and_grads("flash", layout, causal, q, k, v, w)
    lx, gx = _value_and_grads("xla", layout, causal, q, k, v, w)
    assert float(lf) == pytest.approx(float(lx), rel=1e-5, abs=1e-4)
    assert max(_rel(a, b) for a, b in zip(gf, gx)) < 1e-5


def test_flash_inside_a_pipeline_shard_map_matches_xla():
    # The pipeline runs blocks in a shard_map manual over `stage` with no layout: attend
    # nests its own shard_map over the automatic axes.
    mesh = sharding.make_mesh({"data": 2, "stage": 2, "model": 2})
    q, k, v, w = _qkvw(jnp.float32, b=4, s=32, h=4, kvh=2, d=16)

    def run(impl):
        def loss(q, k, v):
            o = jax.shard_map(
                lambda q, k, v: attention.attend(q, k, v, causal=True, impl=impl, layout=Layout()),
                mesh=mesh, in_specs=(P(), P(), P()), out_specs=P(), axis_names={"stage"})(q, k, v)
            return jnp.sum(o * w)
        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(q, k, v)

    (lf, gf), (lx, gx) = run("flash"), run("xla")
    assert float(lf) == pytest.approx(float(lx), rel=1e-5)
    assert max(_rel(a, b) for a, b in zip(gf, gx)) < 1e-5


def test_flash_on_cpu_is_the_interpreted_kernel_not_a_custom_call():
    q, k, v, _ = _qkvw(jnp.float32, b=1, s=32)
    text = jax.jit(functools.partial(attention.attend, causal=True, impl="flash",
                                     layout=Layout())).lower(q, k, v).as_text()
    assert "triton" not in text and "custom_call" not in text


# --------------------------------------------------------------------------- pricing


def _kernels(text: str) -> tuple[graph.StepGraph, dict[str, graph.Task]]:
    """The step graph of ``text`` and its Triton tasks by kernel name."""
    module = hlo.parse(text)
    insts = {i.name: i for c in module.computations for i in c.instructions}
    g = graph.from_module(module)
    return g, {graph.triton_kernel(insts[t.name])[0]: t for t in g.tasks
               if t.opcode == "custom-call"}


def _fraction(s: int, block: int, causal: bool) -> float:
    return (1 + block / s) / 2 if causal else 1.0


def test_fixture_kernels_are_priced_by_their_flops():
    # tests/fixtures/hlo/gpu_flash_attention.hlo: value_and_grad of a causal flash attention,
    # b=2 s=256 heads=4 kv_heads=2 head_dim=64 bf16, compiled for one abstract H100 (the
    # Triton IR strings shortened). Kernel blocks: 128 rows on the outer loop.
    _, tasks = _kernels((FIXTURES / "gpu_flash_attention.hlo").read_text())
    assert sorted(tasks) == sorted(graph.FLASH_KERNELS)
    b, s, h, d = 2, 256, 4, 64
    full = 4.0 * b * h * s * s * d
    assert tasks["mha_forward"].flops == full * _fraction(s, 128, True)  # (1 + 1/2) / 2
    assert tasks["mha_backward"].flops == 3.5 * full * _fraction(s, 128, True)
    assert tasks["mha_preprocess_backward"].flops == 2.0 * b * s * h * d
    qb = b * s * h * d * 2
    lse = b * h * s * 4
    assert tasks["mha_forward"].bytes == 3 * qb + qb + lse
    assert tasks["mha_backward"].bytes == 5 * qb + 2 * lse + 3 * qb
    assert all(t.gemm == () for t in tasks.values())


def test_the_causal_scope_is_the_one_the_cost_model_reads():
    assert attention.CAUSAL_SCOPE == graph.FLASH_CAUSAL_SCOPE
    assert attention.FULL_SCOPE != graph.FLASH_CAUSAL_SCOPE


def test_kernel_name_comes_from_backend_config_not_the_ir_string():
    text = (FIXTURES / "gpu_flash_attention.hlo").read_text()
    module = hlo.parse(text)
    names = [graph.triton_kernel(i) for i in module.entry.instructions if i.opcode == "custom-call"]
    assert [n for n, _ in names] == ["mha_forward", "mha_preprocess_backward", "mha_backward"]
    assert names[0][1] == {"x": 2, "y": 2, "z": 4} and names[2][1] == {"x": 2, "y": 4, "z": 2}


def test_non_causal_kernels_and_other_custom_calls():
    text = (FIXTURES / "gpu_flash_attention.hlo").read_text()
    full = 4.0 * 2 * 4 * 256 * 256 * 64
    # Without the causal scope the whole score matrix is priced.
    _, tasks = _kernels(text.replace("flash_attention_causal", "flash_attention"))
    assert tasks["mha_forward"].flops == full
    assert tasks["mha_backward"].flops == 3.5 * full
    # Another Pallas kernel, and custom calls XLA does not know, keep 0 FLOPs: they are
    # timed by the bytes they read and write (memory-bound), as before.
    _, other = _kernels(text.replace('name = "mha_forward"', 'name = "rms_norm"'))
    assert other["rms_norm"].flops == 0.0 and other["rms_norm"].bytes > 0
    foreign, _ = _kernels(text.replace('custom_call_target="__gpu$xla.gpu.triton"',
                                       'custom_call_target="my_kernel"'))
    assert [t.flops for t in foreign.tasks if t.opcode == "custom-call"] == [0.0, 0.0, 0.0]


# --------------------------------------------------------- deviceless compile for H100s

_NO_GPU_COMPILE = gpu_compile.unavailable_reason()
deviceless = pytest.mark.skipif(_NO_GPU_COMPILE is not None,
                                reason=f"no deviceless GPU compile here: {_NO_GPU_COMPILE}")


def _gpu_step_text(b, s, h, kvh, d, causal, mesh_shape=(2, 4)):
    devs = gpu_compile.devices(H100, 8)
    mesh = Mesh(np.array(devs).reshape(mesh_shape), ("data", "model"))
    rules = sharding.activation_rules(sharding.parse_recipe("dp+tp"), mesh.axis_names)
    layout = Layout(mesh, rules)
    spec = NamedSharding(mesh, P("data", None, "model", None))
    q = jax.ShapeDtypeStruct((b, s, h, d), jnp.bfloat16, sharding=spec)
    kv = jax.ShapeDtypeStruct((b, s, kvh, d), jnp.bfloat16, sharding=spec)

    def loss(q, k, v):
        o = attention.attend(q, k, v, causal=causal, impl="flash", layout=layout)
        return jnp.sum(o.astype(jnp.float32) ** 2)

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(q, kv, kv).compile().as_text()


@deviceless
@pytest.mark.parametrize("causal", [True, False])
def test_deviceless_h100_step_runs_the_triton_kernels_on_local_shards(causal):
    b, s, h, kvh, d = 4, 512, 8, 4, 128
    text = _gpu_step_text(b, s, h, kvh, d, causal)
    calls = re.findall(r'custom_call_target="([^"]+)"', text)
    assert calls.count(graph.TRITON_TARGET) == 3
    g, tasks = _kernels(text)
    assert sorted(tasks) == sorted(graph.FLASH_KERNELS)
    # Each device runs its own batch rows and heads: batch / data, heads / model.
    lb, lh = b // 2, h // 4
    full = 4.0 * lb * lh * s * s * d
    fwd = full * _fraction(s, 128, causal)
    assert tasks["mha_forward"].flops == fwd
    assert tasks["mha_backward"].flops == 3.5 * fwd
    # No collective touches q/k/v: the only one is the scalar loss's all-reduce.
    assert [(t.kind, t.bytes) for t in g.collectives] == [("all-reduce", 4.0)]
    # Compute-bound on the tensor cores: the FLOPs, not the bytes, set the time.
    t = tasks["mha_backward"]
    assert cost.compute_time_us(t.flops, t.bytes, H100) == pytest.approx(
        H100.launch_us + t.flops / (H100.achieved_tflops * 1e6))


@deviceless
def test_step_traced_on_cpu_devices_and_lowered_for_cuda_gets_the_triton_kernels():
    # lagom-jax's route: trace on the CPU devices, lower with lowering_platforms=("cuda",).
    layout = _layout("data=2,model=4", "dp+tp")
    spec = NamedSharding(layout.mesh, P("data", None, "model", None))
    q = jax.device_put(jnp.ones((2, 128, 4, 32), jnp.bfloat16), spec)

    def loss(q, k, v):
        return jnp.sum(attention.attend(q, k, v, causal=True, impl="flash", layout=layout)
                       .astype(jnp.float32))

    fn = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))
    text = gpu_compile.compile_for_cluster(fn, (q, q, q), {}, H100)
    assert sorted(_kernels(text)[1]) == sorted(graph.FLASH_KERNELS)
    value, _ = fn(q, q, q)  # and the same jitted step runs on the CPU devices
    assert float(value) == pytest.approx(2 * 128 * 4 * 32)


@deviceless
def test_single_abstract_gpu_without_a_mesh():
    dev = gpu_compile.devices(H100, 1)[0]
    q = jax.ShapeDtypeStruct((2, 256, 4, 64), jnp.bfloat16, sharding=SingleDeviceSharding(dev))
    # With no mesh, the Triton lowering of jax 0.11+ finds the GPU through the default device.
    with jax.default_device(dev):
        text = jax.jit(functools.partial(attention.attend, causal=True, impl="flash",
                                         layout=Layout())).lower(q, q, q).compile().as_text()
    (fwd,) = _kernels(text)[1].values()
    assert fwd.flops == 4.0 * 2 * 4 * 256 * 256 * 64 * 0.75


# ------------------------------------------------------------------- sliding window


@pytest.mark.parametrize("impl", ["xla", "flash"])
def test_a_sliding_window_attends_exactly_the_last_window_positions(impl):
    q, k, v, w = _qkvw(jnp.float32, b=2, s=64, h=4, kvh=2, d=16)

    def loss(q, k, v):
        return jnp.sum(attention.attend(q, k, v, causal=True, impl=impl, layout=Layout(), window=16) * w)

    out = attention.attend(q, k, v, causal=True, impl=impl, layout=Layout(), window=16)
    assert _rel(out, _reference(q, k, v, True, window=16)) < 1e-5
    # The gradient is the masked attention's too (the blocks never see a key past the window).
    def ref_loss(q, k, v):
        g = q.shape[2] // k.shape[2]
        kk, vv = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
        back = jnp.arange(64)[:, None] - jnp.arange(64)[None, :]
        logits = jnp.einsum("bqhd,bkhd->bhqk", q, kk) * 16 ** -0.5
        logits = jnp.where((back >= 0) & (back < 16), logits, -jnp.inf)
        return jnp.sum(jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(logits, -1), vv) * w)

    for got, want in zip(jax.grad(loss, (0, 1, 2))(q, k, v), jax.grad(ref_loss, (0, 1, 2))(q, k, v)):
        assert _rel(got, want) < 1e-5
    # A window as long as the sequence is causal attention.
    assert _rel(attention.attend(q, k, v, causal=True, impl="xla", layout=Layout(), window=64),
                _reference(q, k, v, True)) < 1e-5
    with pytest.raises(ValueError, match="must be causal and divide"):
        attention.attend(q, k, v, causal=True, impl="xla", layout=Layout(), window=24)


def test_a_windowed_layer_compiles_to_the_blocked_dots_counted_by_hand():
    b, s, h, kvh, d, w = 2, 1024, 8, 2, 64, 128
    args = [jax.ShapeDtypeStruct((b, s, n, d), jnp.bfloat16) for n in (h, kvh, kvh)]

    def dot_flops(window):
        fn = jax.jit(lambda q, k, v: attention.attend(q, k, v, causal=True, impl="xla", layout=Layout(),
                                                      window=window))
        text = gpu_compile.compile_for_cluster(fn, args, {}, H100)
        return sum(t.flops for t in graph.from_hlo_text(text).compute_tasks if t.gemm)

    # Scores and context: two dots of 2 b h s d FLOPs per key, s keys each without a window
    # (the causal mask is applied, not skipped), 2w per query in blocks of w with one.
    # (The GEMM fusions also count the softmax work XLA fuses into them: under 1%.)
    full, windowed = dot_flops(0), dot_flops(w)
    assert full == pytest.approx(2 * (2 * b * h * s * s * d), rel=0.01)
    assert windowed == pytest.approx(2 * (2 * b * h * s * 2 * w * d), rel=0.01)
    assert windowed < full / 3

"""CommFuse ring operations: numerics against the plain collectives, errors, GPU module."""

from __future__ import annotations

import json
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

from lagom_jax import ops
from lagom_jax.costs import commfuse


def mesh(t: int) -> jax.sharding.Mesh:
    return jax.make_mesh((t,), ("tp",), devices=jax.devices()[:t], axis_types=(AxisType.Auto,))


def fused(x, wi, wo, bidirectional=False):
    h = ops.allgather_matmul(x, wi, "tp", bidirectional=bidirectional)
    return ops.matmul_reducescatter(jax.nn.gelu(h), wo, "tp")


def plain(x, wi, wo, bidirectional=False):
    del bidirectional
    h = jax.lax.all_gather(x, "tp", axis=x.ndim - 2, tiled=True) @ wi
    return jax.lax.psum_scatter(jax.nn.gelu(h) @ wo, "tp", scatter_dimension=x.ndim - 2, tiled=True)


def run(f, t, x, wi, wo, **kw):
    """Value and gradients of sum(f(...)^2) under shard_map: x split by rows, wi by
    columns, wo by rows (Megatron's sequence-parallel MLP)."""
    def loss(x, wi, wo):
        return jax.lax.psum(jnp.sum(f(x, wi, wo, **kw).astype(jnp.float32) ** 2), "tp")
    g = jax.shard_map(loss, mesh=mesh(t), in_specs=(P(None, "tp"), P(None, "tp"), P("tp", None)),
                      out_specs=P())
    return jax.jit(jax.value_and_grad(g, argnums=(0, 1, 2)))(x, wi, wo)


@pytest.mark.parametrize("t", [2, 4, 8])
@pytest.mark.parametrize("dtype, tol", [(jnp.float32, 1e-5), (jnp.bfloat16, 3e-2)])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_forward_and_backward_equal_the_plain_collectives(t, dtype, tol, bidirectional):
    k = jax.random.split(jax.random.key(t), 3)
    x = jax.random.normal(k[0], (2, 4 * t, 16), dtype)
    wi = (jax.random.normal(k[1], (16, 8 * t)) * 0.2).astype(dtype)
    wo = (jax.random.normal(k[2], (8 * t, 16)) * 0.2).astype(dtype)
    (v1, g1), (v2, g2) = run(fused, t, x, wi, wo, bidirectional=bidirectional), run(plain, t, x, wi, wo)
    assert float(v1) == pytest.approx(float(v2), rel=tol)
    for a, b in zip(g1, g2):
        scale = float(jnp.max(jnp.abs(b.astype(jnp.float32)))) or 1.0
        assert float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))) <= tol * scale * 4


def test_shapes_that_do_not_fit_are_refused():
    f = jax.shard_map(lambda x, w: ops.matmul_reducescatter(x, w, "tp"), mesh=mesh(4),
                      in_specs=(P(), P()), out_specs=P(), check_vma=False)
    with pytest.raises(ValueError, match="4 devices do not divide the 6 rows"):
        jax.jit(f)(jnp.ones((6, 8)), jnp.ones((8, 4)))
    g = jax.shard_map(lambda x, w: ops.allgather_matmul(x, w, "tp"), mesh=mesh(4),
                      in_specs=(P(), P()), out_specs=P(), check_vma=False)
    with pytest.raises(ValueError, match="last dimension 8 does not match w's first 5"):
        jax.jit(g)(jnp.ones((4, 8)), jnp.ones((5, 4)))


def test_the_gpu_module_runs_the_ring_beside_the_matmuls():
    from lagom_jax.cluster import hardware
    from lagom_jax.program import gpu_compile

    if gpu_compile.unavailable_reason():
        pytest.skip(gpu_compile.unavailable_reason())
    t = 4
    f = jax.jit(jax.shard_map(fused, mesh=mesh(t), in_specs=(P(None, "tp"), P(None, "tp"), P("tp", None)),
                              out_specs=P(None, "tp")))
    args = (jax.ShapeDtypeStruct((2, 512, 256), jnp.bfloat16), jax.ShapeDtypeStruct((256, 1024), jnp.bfloat16),
            jax.ShapeDtypeStruct((1024, 256), jnp.bfloat16))
    try:
        text = gpu_compile.compile_for_cluster(f, args, {}, hardware.get("h100-sxm-8"))
    except gpu_compile.DevicelessUnavailable as e:
        pytest.skip(str(e))
    entry = text[text.index("ENTRY"):]
    order = []
    for line in entry.splitlines():
        m = re.search(r"\s(collective-permute-start|collective-permute-done|fusion|custom-call)\(", line)
        if m:
            order.append("gemm" if re.search(r"gemm|cublas", line) else m.group(1))
    starts = [i for i, o in enumerate(order) if o == "collective-permute-start"]
    # 3 ring steps each way; every transfer but the first reduce-scatter one has a matmul
    # scheduled between its start and its done.
    assert len(starts) == 2 * (t - 1)
    overlapped = sum("gemm" in order[s:order.index("collective-permute-done", s)] for s in starts)
    assert overlapped >= 2 * (t - 1) - 1


def test_the_choice_follows_compute_against_transfer():
    from lagom_jax.cluster import hardware

    hw = hardware.get("h100-sxm-8")
    # Wide outputs: each step's matmul outlasts its transfer, the ring hides it.
    wide = commfuse.choose("allgather", rows=8192, k=1024, n=65536, t=4, hw=hw)
    assert wide.ring and wide.ring_us < wide.plain_us and wide.exposed_ring_us < wide.exposed_plain_us
    # Narrow outputs (GPT-2 at TP 8): transfers dominate and the plain all-gather wins.
    narrow = commfuse.choose("allgather", rows=8192, k=1600, n=800, t=8, hw=hw)
    assert not narrow.ring and "plain" in narrow.why
    with pytest.raises(ValueError, match="dividing the 100 rows"):
        commfuse.choose("reducescatter", rows=100, k=8, n=8, t=8, hw=hw)
    with pytest.raises(ValueError, match="unknown kind"):
        commfuse.choose("allreduce", rows=64, k=8, n=8, t=8, hw=hw)


def test_tune_applies_the_choice_to_the_recipe():
    from lagom_jax import job
    from lagom_jax.cluster import hardware

    hw = hardware.get("h100-sxm-8")
    said = []

    def recipe(mode, base="tp+sp", model="gpt2", config="1.5B", batch=8):
        src = job.ModelSource(model, config, {"model": 8}, base, batch, 1024, commfuse=mode)
        return job._with_commfuse(src, hw, said.append)[0]

    assert recipe("on") == "tp+sp+cf"
    assert recipe("off") == "tp+sp"
    assert recipe("auto") == "tp+sp"  # comm-bound at TP 8: the cost model keeps the plain collectives
    assert any("CommFuse: the MLP runs plain collectives" in s for s in said)
    assert recipe("auto", base="dp+tp") == "dp+tp"  # no sequence parallelism: nothing to decompose
    with pytest.raises(ValueError, match="needs a tp\\+sp recipe"):
        recipe("on", base="dp+tp")


@pytest.mark.slow
def test_the_plan_records_the_commfuse_decision(capsys):
    from lagom_jax import cli

    args = ["tune", "--no-structures", "--model", "gpt2", "--config", "tiny", "--mesh", "model=4", "--recipe", "tp+sp",
            "--commfuse", "on", "--json"]
    assert cli.main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["decisions"][0] == ["commfuse", "the MLP runs rings (commfuse on)"]
    assert sum(c["kind"] == "collective-permute" for c in out["collectives"]) > 0

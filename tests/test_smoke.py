"""The smoke subset the test matrix runs on every JAX it installs (.ci/smoke_matrix).

Four things that touch the installed JAX and its CUDA plugin end to end: the decorator on
a sharded step, a deviceless compile of a small llama for 16 H100s, one HLO-text compile,
and the NCCL tuner plugin's build. In the matrix ``LAGOM_REQUIRE_DEVICELESS=1`` turns a
missing deviceless compile into a failure that says why; in other environments (no
plugin for this Python) those tests skip with the reason.
"""

from __future__ import annotations

import ctypes
import os
import pathlib
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from lagom_jax.models import compiled
from lagom_jax.program import gpu_compile

_REASON = gpu_compile.unavailable_reason()  # early: before anything starts JAX's backends
FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hlo"


def _need_deviceless() -> None:
    if _REASON is None:
        return
    if os.environ.get("LAGOM_REQUIRE_DEVICELESS"):
        pytest.fail(f"no deviceless GPU compile with jax {jax.__version__}: {_REASON}")
    pytest.skip(f"no deviceless GPU compile here: {_REASON}")


def test_the_decorator_tunes_a_sharded_step_with_the_gpu_module(capsys):
    import lagom_jax
    from lagom_jax import api

    _need_deviceless()
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    x = jax.device_put(jnp.arange(32 * 64, dtype=jnp.float32).reshape(32, 64) / 1e3,
                       NamedSharding(mesh, P("data", None)))
    w = jax.device_put(jnp.ones((64, 128), jnp.float32) / 64, NamedSharding(mesh, P(None, "model")))

    @jax.jit
    def step(x, w):
        h = jnp.tanh(x @ w)
        return jax.lax.with_sharding_constraint((h @ w.T).sum(axis=0), NamedSharding(mesh, P()))

    tuned = lagom_jax.tune(step, hardware="h100-sxm-8", use_cache=False, verbose=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", api.TuningWarning)
        out = tuned(x, w)
    np.testing.assert_allclose(out, step(x, w), rtol=1e-5)
    assert tuned.plan(x, w) is not None
    said = capsys.readouterr().out
    plugin = re.search(r"compiled deviceless for H100 SXM5 by (jax-cuda1[23]-plugin [\d.]+)", said)
    assert plugin, said
    assert plugin.group(1) == gpu_compile.compiler()


def test_a_small_llama_compiles_deviceless_for_16_h100s():
    from lagom_jax.cluster import hardware

    _need_deviceless()
    hw = hardware.get("h100-sxm-8", 2)
    step = compiled.compile_builtin(hw, "llama", "tiny", "fsdp+tp", "fsdp=8,model=2",
                                       batch_size=16, seq_len=16, dtype="bfloat16")
    assert step.warning is None and step.where == "XLA:GPU deviceless compile for 16x H100 SXM5"
    assert "num_partitions=16" in step.text.split("\n", 1)[0]
    assert re.search(r" all-gather-start\(", step.text) and re.search(r" reduce-scatter", step.text)


def test_an_hlo_text_compiles_for_abstract_gpus():
    from lagom_jax.cluster import hardware
    from lagom_jax.program import graph, hlo_compile

    _need_deviceless()
    text = (FIXTURES / "unoptimized" / "jax_fsdp_mlp_8.after_spmd.hlo").read_text()
    compiled = hlo_compile.compile_unoptimized(text, hardware.get("h100-sxm-8"), isolated=False)
    # Read as the tuner reads it: jax 0.10 makes both async pairs; from 0.11 the all-gathers
    # stay synchronous and the all-reduce runs in a Triton collective fusion (fusion-start).
    step = graph.from_hlo_text(compiled)
    assert {"all-gather", "all-reduce"} <= {c.kind for c in step.collectives}
    assert any(c.is_async for c in step.collectives if c.kind == "all-reduce")
    assert "is_scheduled=true" in compiled


def test_the_nccl_tuner_plugin_builds_and_loads(tmp_path):
    from lagom_jax.plan.nccl_tuner import build_tuner

    lib = ctypes.CDLL(str(build_tuner(tmp_path)))
    for version in (3, 4, 5, 6):
        assert hasattr(lib, f"ncclTunerPlugin_v{version}")

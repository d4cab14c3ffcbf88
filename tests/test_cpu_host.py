"""The decorator on a GPU-less host, as a user runs it: no JAX platform set, a trainer of
their own (plain flax and optax, none of lagom-jax's models), ``lagom_jax.tune`` on its
jitted step. It must run without the CUDA plugin's traceback and tune the module XLA's GPU
pipeline makes, not XLA:CPU's.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lagom_jax import files
from lagom_jax.program import gpu_compile

TRAINER = r'''
import json, warnings
import jax, jax.numpy as jnp, optax
import flax.linen as nn
import lagom_jax


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(10)(nn.relu(nn.Dense(128)(x)))


model = MLP()
params = model.init(jax.random.PRNGKey(0), jnp.ones((8, 32)))  # JAX's backends start here
tx = optax.adam(1e-3)
opt = tx.init(params)


def step(params, opt, x, y):
    def loss(p):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply(p, x), y).mean()
    value, grads = jax.value_and_grad(loss)(params)
    updates, opt = tx.update(grads, opt, params)
    return optax.apply_updates(params, updates), opt, value


tuned = lagom_jax.tune(jax.jit(step), hardware="h100-sxm-8", use_cache=False)
x, y = jnp.ones((8, 32)), jnp.zeros((8,), jnp.int32)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    p1, o1, l1 = tuned(params, opt, x, y)
    plan = tuned.plan(params, opt, x, y)
_, _, l0 = jax.jit(step)(params, opt, x, y)
print(json.dumps({
    "platforms": sorted({d.platform for d in jax.devices()}),
    "tuning_warnings": [str(w.message) for w in caught if issubclass(w.category, lagom_jax.TuningWarning)],
    "same_loss": float(l0) == float(l1),
    "tuned": plan is not None,
    "xla_flags": __import__("os").environ.get("XLA_FLAGS", ""),
}))
'''


def test_a_third_party_trainer_on_a_gpu_less_host_tunes_the_gpu_module_without_a_traceback(tmp_path):
    if gpu_compile.has_cuda_driver():
        pytest.skip("this host has a CUDA driver: the GPU-less path does not apply")
    if not gpu_compile._plugin_installed():
        pytest.skip("the CUDA plugin is not installed: nothing to compile for GPUs with")
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "Unable to load CUDA" not in proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["platforms"] == ["cpu"]  # the devices it would have run on anyway
    assert out["tuning_warnings"] == []  # among them: "tuning XLA:CPU's module instead"
    assert out["same_loss"] and out["tuned"]
    # Nothing to autotune on without a GPU, and the compiles share one kernel cache file.
    assert out["xla_flags"].split() == ["--xla_gpu_autotune_level=0",
                                        f"--xla_gpu_kernel_cache_file={files.cache_root() / gpu_compile.KERNEL_CACHE}"]


def test_deviceless_flags_the_user_set_are_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("LAGOM_JAX_CACHE", str(tmp_path))
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=4 --xla_gpu_kernel_cache_file=/tmp/mine.bin")
    gpu_compile._deviceless_xla_flags()
    assert os.environ["XLA_FLAGS"] == "--xla_gpu_autotune_level=4 --xla_gpu_kernel_cache_file=/tmp/mine.bin"
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    (tmp_path / gpu_compile.KERNEL_CACHE).write_bytes(b"x" * 16)
    monkeypatch.setattr(gpu_compile, "KERNEL_CACHE_LIMIT", 8)  # an oversized cache starts afresh
    gpu_compile._deviceless_xla_flags()
    assert os.environ["XLA_FLAGS"] == (f"--xla_dump_to=/tmp/x --xla_gpu_autotune_level=0 "
                                       f"--xla_gpu_kernel_cache_file={tmp_path / gpu_compile.KERNEL_CACHE}")
    assert not (tmp_path / gpu_compile.KERNEL_CACHE).exists()

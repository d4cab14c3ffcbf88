"""Every private JAX touchpoint of ``jax_internals``, pinned on the installed JAX.

The test matrix (.ci/smoke_matrix) runs this file on the oldest supported JAX and on the
CUDA 13 plugin's; the full suite runs it on the newest. A touchpoint that moved fails here
by name instead of somewhere inside a tuning run.
"""

from __future__ import annotations

import importlib.metadata
import os

import jax
import jax.numpy as jnp
import pytest

from lagom_jax.program import gpu_compile, jax_internals

_REASON = gpu_compile.unavailable_reason()  # early: before anything starts JAX's backends

TINY_HLO = """HloModule tiny, entry_computation_layout={(f32[8]{0})->f32[8]{0}}

ENTRY main {
  p = f32[8]{0} parameter(0)
  ROOT t = f32[8]{0} tanh(p)
}
"""


def test_backends_and_platforms():
    jax.devices()
    assert jax_internals.backends_started()
    assert not jax_internals.gpu_backend_started()  # CPU devices only, here and in CI
    platforms = jax_internals.registered_platforms()
    assert "cpu" in platforms
    assert ("cuda" in platforms) is (_REASON is None)


def test_jit_statics():
    def f(x, n, *, scale):
        return x * n * scale

    assert jax_internals.jit_statics(jax.jit(f, static_argnames=("scale",))) == ((), ("scale",))
    argnums, argnames = jax_internals.jit_statics(jax.jit(f, static_argnums=(1,), static_argnames=("scale",)))
    assert argnums == (1,) and "scale" in argnames
    assert jax_internals.jit_statics(f) == ((), ())


def test_is_jax_jit():
    assert jax_internals.is_jax_jit(jax.jit(jnp.tanh))
    assert not jax_internals.is_jax_jit(lambda x: x)


def test_lowering_for_makes_every_jit_lowering_inside_the_platforms():
    from lagom_jax.program import hlo_compile

    def bits(key, x):  # JAX's threefry lowers differently for the CPU (rolled) and CUDA
        return x * jax.random.bernoulli(key, 0.5, x.shape)

    class Wrapper:  # a wrapper's own lower, which calls jax.jit's inside
        def lower(self, *args):
            return jax.jit(bits).lower(*args)

    args = (jax.random.key(0), jnp.ones((64,)))
    assert hlo_compile.cpu_lowered(Wrapper().lower(*args).as_text(dialect="hlo"))
    with jax_internals.lowering_for(("cuda",)):
        text = Wrapper().lower(*args).as_text(dialect="hlo")
    assert hlo_compile.cpu_lowered(text) == ""
    assert hlo_compile.cpu_lowered(Wrapper().lower(*args).as_text(dialect="hlo")), "restored on exit"


def test_distributed_state_without_jax_distributed():
    assert jax_internals.distributed_state() == (None, 0, 1)


def test_a_moved_internal_raises_naming_it_and_the_checked_range(monkeypatch):
    from jax._src import distributed

    monkeypatch.delattr(distributed, "global_state")
    with pytest.raises(jax_internals.JaxInternalsError,
                       match=rf"jax\._src\.distributed\.global_state is not available in jax {jax.__version__} "
                             rf"\(lagom-jax checked it with jax {jax_internals.CHECKED_JAX[0]} to "
                             rf"{jax_internals.CHECKED_JAX[-1]}\)"):
        jax_internals.distributed_state()


def test_parse_xla_flags():
    jax_internals.parse_xla_flags()  # the flags of this process are XLA's to read; no error


def test_compile_for_devices_of_a_named_platform():
    cpus = jax.devices("cpu")
    lowered = jax.jit(lambda x: jnp.tanh(x) * 2).trace(jnp.ones((8,))).lower(lowering_platforms=("cpu",))
    text = jax_internals.compile_for_devices(lowered, lambda n: cpus[:n])
    assert text.startswith("HloModule") and "tanh" in text


def _abstract_h100s(n):
    """``n`` abstract H100s of the CUDA plugin (compile-only devices), or skip/fail as the
    smoke tests do when this environment cannot make them."""
    from lagom_jax.cluster import hardware

    if _REASON is not None:
        if os.environ.get("LAGOM_REQUIRE_DEVICELESS"):
            pytest.fail(f"no deviceless GPU compile with jax {jax.__version__}: {_REASON}")
        pytest.skip(f"no deviceless GPU compile here: {_REASON}")
    return gpu_compile.devices(hardware.get("h100-sxm-8"), n)


def test_compile_for_devices_of_abstract_gpus():
    gpus = _abstract_h100s(2)
    x = jnp.ones((8, 8))
    lowered = jax.jit(lambda x: jnp.tanh(x) * 2).trace(x).lower(lowering_platforms=("cuda",))
    text = jax_internals.compile_for_devices(lowered, lambda n: gpus[:n])
    assert text.startswith("HloModule") and "tanh" in text


def test_compile_hlo_for_devices():
    text = jax_internals.compile_hlo_for_devices(TINY_HLO, _abstract_h100s(1))
    assert text.startswith("HloModule") and "tanh" in text


@pytest.mark.parametrize("pjrt, sets", [("0.9.0", True), ("0.9.1", True), ("0.9.2", False),
                                        ("0.10.2", False), (None, False)])
def test_the_cuda_check_is_skipped_only_for_plugins_that_always_run_it(monkeypatch, pjrt, sets):
    def version(name):
        if name == "jax-cuda12-pjrt" and pjrt is not None:
            return pjrt
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    monkeypatch.delenv("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", raising=False)
    jax_internals.allow_cuda_plugin_without_driver()
    assert (os.environ.get("JAX_SKIP_CUDA_CONSTRAINTS_CHECK") == "1") is sets


def test_the_triton_lowering_is_told_the_gpu_and_then_forgets_it():
    kind = "NVIDIA H100 80GB HBM3"
    try:
        from jax._src.pallas.triton import gpu_info
    except ImportError:
        gpu_info = None
    if gpu_info is None or not hasattr(gpu_info, "get_device_kind"):  # before jax 0.11: nothing to tell
        assert jax.__version__.startswith(("0.9", "0.10")), jax.__version__
        with jax_internals.triton_kernels_for(kind):
            return
    before = gpu_info.get_device_kind
    with jax_internals.triton_kernels_for(kind):
        assert gpu_info.get_device_kind() == kind
        assert gpu_info.get_gpu_info().compute_capability == 90  # what the lowering reads from it
    assert gpu_info.get_device_kind is before

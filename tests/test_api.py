"""The ``tune`` decorator: behaves like jit, compiles once per signature, never breaks a step."""

from __future__ import annotations

import functools
import itertools
import re
import warnings
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import lagom_jax
from lagom_jax import api
from lagom_jax.cluster import hardware
from lagom_jax.program import gpu_compile
from lagom_jax.program.hlo import HloParseError

_COMPILES: list[str] = []


def _count(event: str, duration: float, **kw) -> None:
    if event == "/jax/core/compile/backend_compile_duration":
        _COMPILES.append(event)


jax.monitoring.register_event_duration_secs_listener(_count)


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((2, 4), ("data", "model"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _step(w1, w2, x):
    """A tiny DP x TP MLP train step: the gradients need all-reduces."""

    def loss(w1, w2):
        h = jnp.tanh(x @ w1)
        return jnp.mean((h @ w2) ** 2)

    l, (g1, g2) = jax.value_and_grad(loss, argnums=(0, 1))(w1, w2)
    return w1 - 0.1 * g1, w2 - 0.1 * g2, l


@pytest.fixture(scope="module")
def inputs(mesh):
    k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
    w1 = jax.device_put(jax.random.normal(k1, (32, 64)) * 0.1, NamedSharding(mesh, P(None, "model")))
    w2 = jax.device_put(jax.random.normal(k2, (64, 32)) * 0.1, NamedSharding(mesh, P("model", None)))
    x = jax.device_put(jax.random.normal(k3, (16, 32)), NamedSharding(mesh, P("data", None)))
    return w1, w2, x


def _tuned(tmp_path, **kw):
    return lagom_jax.tune(jax.jit(_step), hardware="h100-sxm-8", cache_dir=tmp_path, **kw)


def test_tuned_matches_jit_and_never_recompiles(tmp_path, inputs):
    tuned = _tuned(tmp_path)
    expected = jax.jit(_step)(*inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", api.TuningWarning)
        got = tuned(*inputs)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    before = len(_COMPILES)
    for _ in range(3):
        tuned(*inputs)
    assert len(_COMPILES) == before
    plan = tuned.plan(*inputs)
    assert plan is not None and plan.strategy == "lagom"
    assert plan.collectives, "a DP x TP step has collectives"
    assert len(_COMPILES) == before


def test_mirrors_jit_surface(tmp_path, inputs):
    jitted = jax.jit(_step)
    tuned = lagom_jax.tune(hardware="h100-sxm-8", cache_dir=tmp_path)(jitted)
    assert tuned.__wrapped__ is jitted
    assert "all-reduce" in tuned.lower(*inputs).compile().as_text()


def test_decorator_form_and_cache_hit(tmp_path, inputs):
    @lagom_jax.tune(hardware="h100-sxm-8", cache_dir=tmp_path)
    @jax.jit
    def step(w1, w2, x):
        return _step(w1, w2, x)

    first = step.plan(*inputs)
    assert list(tmp_path.glob("*.json"))
    again = lagom_jax.tune(step.__wrapped__, hardware="h100-sxm-8", cache_dir=tmp_path)
    with mock.patch.object(api.search_lib, "run_strategy", side_effect=AssertionError("searched")):
        assert again.plan(*inputs) == first


def test_auto_hardware_on_cpu_says_what_it_predicts():
    hw, note = api.auto_hardware()
    assert hw.name.startswith("h100-sxm-8")
    assert "no GPU" in note and "h100-sxm-8" in note


@pytest.mark.parametrize(
    "fault, match",
    [
        (lambda: mock.patch.object(api.job.graph_lib, "from_hlo_text",
                                   side_effect=HloParseError("line 3, col 7: expected shape", 3, 7)),
         "HloParseError"),
        (lambda: mock.patch.object(api.search_lib, "run_strategy",
                                   side_effect=RuntimeError("search exploded")), "search exploded"),
        (lambda: mock.patch.object(api.Plan, "compiler_options",
                                   return_value={"xla_gpu_bogus_option": 1}), "xla_gpu_bogus_option"),
    ],
    ids=["parser-error", "search-error", "invalid-flag"],
)
def test_failures_leave_the_step_running_untuned(tmp_path, inputs, fault, match):
    tuned = _tuned(tmp_path)
    expected = jax.jit(_step)(*inputs)
    with fault(), pytest.warns(api.TuningWarning, match=match):
        got = tuned(*inputs)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert tuned.plan(*inputs) is None


def test_unwritable_cache_still_tunes(tmp_path, inputs):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    tuned = lagom_jax.tune(jax.jit(_step), hardware="h100-sxm-8", cache_dir=blocker / "plans")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tuned(*inputs)
    messages = [str(w.message) for w in caught if w.category is api.TuningWarning]
    assert any("cannot read the plan cache" in m for m in messages)
    assert any("could not write the plan cache" in m for m in messages)
    assert tuned.plan(*inputs) is not None


def test_corrupt_cache_file_is_retuned(tmp_path, inputs):
    _tuned(tmp_path).plan(*inputs)
    (path,) = tmp_path.glob("*.json")
    path.write_text('{"module": "trunc')
    tuned = _tuned(tmp_path)
    with pytest.warns(api.TuningWarning, match="corrupt plan cache file"):
        plan = tuned.plan(*inputs)
    assert plan is not None
    assert api.Plan.load(path) == plan


def test_unknown_strategy_is_refused():
    with pytest.raises(ValueError, match="known:"):
        lagom_jax.tune(jax.jit(_step), strategy="fastest")


def test_nccl_env_is_set_only_before_a_gpu_backend(tmp_path, inputs, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no tuner plugin built there
    plan = _tuned(tmp_path).plan(*inputs)
    plan = api.Plan.from_json(re.sub(r'"nthreads": \d+', '"nthreads": 256', plan.to_json()))
    environ: dict[str, str] = {}
    assert api.apply_nccl_env(plan, environ) == {"NCCL_NTHREADS": "256"} == environ
    assert api.apply_nccl_env(plan, environ) == {}
    with mock.patch.object(api.jax_internals, "gpu_backend_started", return_value=True), \
            pytest.warns(api.TuningWarning, match="relaunch with: NCCL_NTHREADS=256 XLA_FLAGS="):
        assert api.apply_nccl_env(plan, {}) == {}


@pytest.mark.slow
def test_flax_model_step_tuned_matches_untuned(tmp_path):
    from lagom_jax import models

    built = models.build("gpt2", "tiny", "dp+tp", "data=2,model=4", batch_size=4, seq_len=16)
    # The step donates its state: give each call its own copy.
    expected_state, expected = built.train_step(*built.init(jax.random.key(1)))
    state, batch = built.init(jax.random.key(1))
    tuned = lagom_jax.tune(built.train_step, hardware="a40-pcie-8", cache_dir=tmp_path,
                           with_profile=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", api.TuningWarning)
        got_state, got = tuned(state, batch)
    np.testing.assert_allclose(got["loss"], expected["loss"], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(got_state), jax.tree.leaves(expected_state)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    state, batch = built.init(jax.random.key(1))
    plan = tuned.plan(state, batch)
    # On this CPU host the plan tunes the module XLA:GPU makes for the A40s (deviceless),
    # or, without the CUDA plugin, XLA:CPU's.
    if gpu_compile.unavailable_reason() is None:
        text = gpu_compile.compile_for_cluster(built.train_step, (state, batch), {},
                                               hardware.get("a40-pcie-8"), plan.compiler_options())
        assert "all-reduce-start" in text
    else:
        text = built.train_step.lower(state, batch).compile().as_text()
    names = {line.split()[0].lstrip("%") for line in text.splitlines() if " = " in line}
    profiled = {name for name, _ in plan.costs}
    # The LHS profile speaks the names of the module the plan's options make (combined
    # collectives aside).
    assert len(profiled & names) >= 0.9 * len(profiled)


def test_without_the_gpu_compile_the_cpu_module_is_tuned_with_a_warning(tmp_path, inputs,
                                                                       monkeypatch):
    def refuse(*_args, **_kwargs):
        raise gpu_compile.DevicelessUnavailable("no plugin in this test")

    monkeypatch.setattr(gpu_compile, "lower_for_cluster", refuse)
    with pytest.warns(api.TuningWarning, match="no plugin in this test.*XLA:CPU's module"):
        plan = _tuned(tmp_path).plan(*inputs)
    assert plan is not None and not any("-start" in name for name, _ in plan.costs)


def test_shard_map_step(tmp_path, mesh):
    @jax.jit
    def step(x):
        f = jax.shard_map(lambda b: jax.lax.psum(b * 2.0, "model"), mesh=mesh,
                      in_specs=P("data", "model"), out_specs=P("data", None))
        return f(x)

    x = jnp.arange(64.0).reshape(8, 8)
    tuned = lagom_jax.tune(step, hardware="h100-sxm-8", cache_dir=tmp_path)
    np.testing.assert_allclose(tuned(x), step(x))
    assert [c.kind for c in tuned.plan(x).collectives] == ["all-reduce"]


def test_static_arguments_and_python_scalars(tmp_path):
    @functools.partial(jax.jit, static_argnums=1, static_argnames=("power",))
    def scale(x, n, lr, *, power=1):
        return (x * n) ** power * lr

    tuned = lagom_jax.tune(scale, hardware="h100-sxm-8", cache_dir=tmp_path)
    x = jnp.arange(4.0)
    before = len(_COMPILES)
    np.testing.assert_allclose(tuned(x, 2, 0.5, power=2), scale(x, 2, 0.5, power=2))
    first = len(_COMPILES)
    # A new learning rate (a traced Python scalar) reuses the executable ...
    np.testing.assert_allclose(tuned(x, 2, 0.25, power=2), scale(x, 2, 0.25, power=2))
    assert len(_COMPILES) == first > before
    # ... a new static value is a new signature, and the re-tune says why.
    with pytest.warns(api.RetuneWarning, match="a static argument changed"):
        np.testing.assert_allclose(tuned(x, 3, 0.25, power=1), scale(x, 3, 0.25, power=1))
    assert len(_COMPILES) > first


def test_auto_hardware_maps_gpu_names_to_presets():
    import types

    gpus = [types.SimpleNamespace(platform="gpu", device_kind="NVIDIA H100 80GB HBM3")] * 16
    hw, note = api.auto_hardware(gpus)
    assert hw.nodes == 2
    assert hw.name.startswith("h100-sxm-8") and "2 node(s)" in note
    odd = [types.SimpleNamespace(platform="gpu", device_kind="Mystery GPU")]
    hw, note = api.auto_hardware(odd)
    assert "no preset for 'Mystery GPU'" in note


def test_drift_from_a_far_preset_replans_once_and_agreement_never(tmp_path, inputs):
    # An H100 predicts this tiny step in microseconds; the CPU takes far longer.
    policy = api.Retune(warmup=1, window=3, threshold=0.5, max_replans=1)
    tuned = _tuned(tmp_path, retune=policy)
    expected = jax.jit(_step)(*inputs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(12):
            got = jax.block_until_ready(tuned(*inputs))
    assert tuned.replans == 1
    assert any("re-planned (1 of at most 1)" in str(w.message) for w in caught)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    slow = tuned.recalibrated[0]
    assert slow.achieved_tflops < hardware.get("h100-sxm-8").achieved_tflops

    # Planned for the recalibrated hardware it predicts what was measured; when the steps
    # take exactly the predicted time (a clock that advances by it), nothing re-plans.
    again = lagom_jax.tune(jax.jit(_step), hardware=slow, cache_dir=tmp_path,
                           retune=api.Retune(warmup=1, window=3, threshold=0.1))
    jax.block_until_ready(again(*inputs))
    plan = again.plan(*inputs)
    clock = (i * plan.makespan_us / 1e6 for i in itertools.count(1))
    with mock.patch.object(api.time, "perf_counter", lambda: next(clock)):
        for _ in range(12):
            jax.block_until_ready(again(*inputs))
    assert again.replans == 0 and not again._watch  # compared once, agreed, stopped watching
    assert slow.name == "h100-sxm-8-measured"


def test_retune_policy_is_checked():
    with pytest.raises(ValueError, match="threshold"):
        api.Retune(threshold=0)
    with pytest.raises(ValueError, match="window >= 1"):
        api.Retune(window=0)

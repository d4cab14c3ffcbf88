"""Profile phase on the CPU: timing statistics, tiny real measurements, the Pallas copy
kernel in interpret mode, and fits that recover known parameters from synthetic curves."""

from __future__ import annotations

import dataclasses
import itertools
import json

import jax.numpy as jnp
import numpy as np
import pytest

from lagom_jax.cluster import hardware
from lagom_jax.cluster.hardware import HardwareProfile
from lagom_jax.costs import profile
from lagom_jax.costs.profile import ContentionPoint, ProfileError, Timing


def test_timing_median_and_iqr():
    t = Timing((1.0, 2.0, 3.0, 4.0, 100.0))
    assert t.median_us == 3.0
    assert t.iqr_us == pytest.approx(2.0)
    for bad in [(), (1.0, float("nan")), (0.0,), (-1.0,)]:
        with pytest.raises(ProfileError):
            Timing(bad)


def test_time_fn_excludes_warmup_and_rotates_inputs():
    ticks = itertools.count()
    seen = []

    def fn(x):
        seen.append(x)
        return x

    # The fake clock advances one second per read: every timed run lasts 1 s = 1e6 us.
    t = profile.time_fn(fn, [(1,), (2,), (3,)], warmup=2, repeats=4, clock=lambda: float(next(ticks)))
    assert t.samples_us == (1e6,) * 4
    assert seen == [1, 2, 1, 2, 3, 1]
    with pytest.raises(ProfileError, match="repeats"):
        profile.time_fn(fn, [(1,)], repeats=0)


def test_random_inputs_are_fresh_and_nonzero():
    sets = profile.random_inputs([(8, 4)], jnp.float32, sets=2, seed=0)
    a, b = sets[0][0], sets[1][0]
    assert a.shape == (8, 4) and not np.array_equal(a, b)
    assert np.count_nonzero(np.asarray(a)) == a.size


def test_real_cpu_measurements_are_consistent():
    g = profile.measure_gemm(16, 8, 32, "float32", warmup=1, repeats=3)
    assert g.flops == 2 * 16 * 8 * 32 and g.tflops > 0 and len(g.timing.samples_us) == 3
    h = profile.measure_hbm(1024, warmup=1, repeats=3)
    assert h.bytes_moved == 2 * 1024 * 4 and h.gbps > 0


@pytest.mark.parametrize("ctas", [1, 3])
def test_pallas_copy_kernel_copies_every_element(ctas):
    n = ctas * 2 * 128
    copy = profile.pallas_copy_kernel(ctas, n, jnp.float32, block=128, interpret=True)
    x = jnp.arange(1, n + 1, dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(copy(x)), np.asarray(x))


def test_pallas_copy_kernel_rejects_bad_shapes():
    with pytest.raises(ProfileError, match="multiple"):
        profile.pallas_copy_kernel(3, 1000, jnp.float32, block=128, interpret=True)
    with pytest.raises(ProfileError, match="power-of-two"):
        profile.pallas_copy_kernel(2, 1200, jnp.float32, block=300, interpret=True)


# --- Fits on synthetic curves -----------------------------------------------------------


def _noisy(rng, values, rel):
    return np.asarray(values) * (1 + rel * rng.standard_normal(len(values)))


@pytest.mark.parametrize("seed", range(5))
def test_fit_line_recovers_rate_and_intercept(seed):
    rng = np.random.default_rng(seed)
    rate_tflops, t0 = 700.0, 8.0
    flops = np.array([1e10, 5e10, 2e11, 1e12, 4e12])
    times = _noisy(rng, t0 + flops / (rate_tflops * 1e6), 0.01)
    fit = profile.fit_line(flops, times, scale=1e6, what="GEMM")
    assert fit.rate == pytest.approx(rate_tflops, rel=0.03)
    assert fit.points == 5


@pytest.mark.parametrize("bad, match", [
    (([1e9, 1e9], [5.0, 6.0]), "two distinct"),
    (([1e9, float("nan")], [5.0, 6.0]), "non-finite"),
    (([1e9, 2e9], [6.0, 5.0]), "does not grow"),
    (([1e9, 2e9, 3e9], [5.0, 6.0]), "3 sizes but 2 times"),
    (([1e9, 2e9], [-5.0, 6.0]), "positive"),
])
def test_fit_line_rejects_bad_input(bad, match):
    with pytest.raises(ProfileError, match=match):
        profile.fit_line(*bad, scale=1e3, what="HBM")


def synthetic_curve(sm_per_cta, gbps_per_cta, sat, sm_count=132, ks=profile.DEFAULT_KS, noise=0.005, seed=0):
    rng = np.random.default_rng(seed)
    k = np.array(ks, dtype=float)
    slow = sm_count / (sm_count - sm_per_cta * k)
    bw = np.minimum(gbps_per_cta * k, sat)
    return list(ks), _noisy(rng, slow, noise), _noisy(rng, bw, noise)


@pytest.mark.parametrize("a, b, sat", [(1.0, 60.0, 2800.0), (1.6, 80.0, 3000.0), (0.7, 120.0, 1500.0)])
@pytest.mark.parametrize("seed", range(3))
def test_fit_contention_recovers_parameters(a, b, sat, seed):
    ks, slow, bw = synthetic_curve(a, b, sat, seed=seed)
    fit = profile.fit_contention(ks, slow, bw, sm_count=132)
    assert fit.sm_per_cta == pytest.approx(a, rel=0.1)
    assert fit.hbm_gbps_per_cta == pytest.approx(b, rel=0.05)
    assert fit.hbm_saturation_gbps == pytest.approx(sat, rel=0.05)
    assert fit.points == len(ks)


def test_fit_contention_without_saturation():
    ks, slow, bw = synthetic_curve(1.0, 20.0, 1e9, noise=0.0)
    fit = profile.fit_contention(ks, slow, bw, sm_count=132)
    assert fit.hbm_gbps_per_cta == pytest.approx(20.0)
    assert fit.hbm_saturation_gbps == pytest.approx(20.0 * 64)


@pytest.mark.parametrize("mutate, match", [
    (lambda k, s, b: (k[:2], s[:2], b[:2]), "three distinct"),
    (lambda k, s, b: (k, [*s[:3], float("nan"), *s[4:]], b), "non-finite"),
    (lambda k, s, b: (k, [*s[:-1], 1.0], b), "falls with more CTAs"),
    (lambda k, s, b: (k, [0.5] * len(s), b), "faster beside"),
    (lambda k, s, b: (k, s, [0.0] * len(b)), "positive"),
    (lambda k, s, b: (k, s[:-1], b), "differ in length"),
    (lambda k, s, b: ([*k[:-1], 500], s, b), "SM count"),
])
def test_fit_contention_rejects_bad_input(mutate, match):
    ks, slow, bw = synthetic_curve(1.0, 60.0, 2800.0, noise=0.0)
    with pytest.raises(ProfileError, match=match):
        profile.fit_contention(*mutate(list(ks), list(slow), list(bw)), sm_count=132)


def test_contention_sweep_with_injected_probe_checks_ks():
    calls = []

    def probe(k):
        calls.append(k)
        return ContentionPoint(k, Timing((100.0,)), Timing((100.0 + k,)), 1000, Timing((1.0,)))

    points = profile.contention_sweep(probe, (1, 2, 4))
    assert calls == [1, 2, 4] and [p.slowdown for p in points] == [1.01, 1.02, 1.04]
    assert points[0].copy_gbps == pytest.approx(1.0)
    for ks in [(), (2, 1), (0, 1), (1, 65), (1, 1, 2)]:
        with pytest.raises(ProfileError, match="CTA counts"):
            profile.contention_sweep(probe, ks)
    with pytest.raises(ProfileError, match="returned a point for 1"):
        profile.contention_sweep(lambda k: probe(1), (1, 2))


def test_base_preset_for_known_and_unknown_gpus():
    assert profile.base_preset_for("NVIDIA H100 80GB HBM3") == "h100-sxm-8"
    assert profile.base_preset_for("NVIDIA H200") == "h200-sxm-8"
    assert profile.base_preset_for("NVIDIA A100-SXM4-80GB") == "a100-sxm-8"
    with pytest.raises(ProfileError, match="no preset for GPU 'TPU v5'"):
        profile.base_preset_for("TPU v5")


def test_measured_profile_round_trips_through_json(tmp_path):
    gemm = profile.LineFit(812.5, 6.0, 0.1, 5)
    hbm = profile.LineFit(3105.25, 4.0, 0.1, 3)
    prof = profile.measured_profile(hardware.get("h100-sxm-8"), name="measured-h100", gpu="NVIDIA H100",
                                    gemm=gemm, hbm=hbm, sm_count=132)
    assert prof == dataclasses.replace(hardware.get("h100-sxm-8"), name="measured-h100", gpu="NVIDIA H100",
                                       achieved_tflops=812.5, achieved_hbm_gbps=3105.25)
    path = profile.write_profile(tmp_path / "out", prof, {"k": [1, 2]})
    assert HardwareProfile.load(path) == prof
    assert hardware.resolve(str(path)) == prof
    assert json.loads((tmp_path / "out" / "raw.json").read_text()) == {"k": [1, 2]}


def test_run_profile_on_cpu_says_so_and_writes_loadable_files(tmp_path):
    lines = []

    def probe(k):  # a synthetic contention curve: 1 SM per CTA, 50 GB/s per CTA up to 2000
        t0 = 1000.0
        return ContentionPoint(k, Timing((t0,)), Timing((t0 * 132 / (132 - k),)), int(min(50 * k, 2000) * 1e3),
                               Timing((1.0,)))

    path = profile.run_profile(tmp_path, quick=True, progress=lines.append, probe=probe)
    assert any("NOT a GPU profile" in ln for ln in lines)
    prof = HardwareProfile.load(path)
    assert prof.name.startswith("cpu-not-a-gpu") and prof.achieved_tflops > 0 and prof.achieved_hbm_gbps > 0
    raw = json.loads(path.with_name("raw.json").read_text())
    assert raw["warning"] == profile.CPU_WARNING
    assert raw["environment"]["backend"] == "cpu" and raw["environment"]["jax"]
    assert len(raw["gemm"]) == 3 and len(raw["hbm"]) == 3
    fit = raw["fits"]["contention"]
    assert fit["hbm_gbps_per_cta"] == pytest.approx(50.0) and fit["hbm_saturation_gbps"] == pytest.approx(2000.0)
    # The SMs per CTA are fitted with the cost model's HBM pressure divided out, at the HBM
    # bandwidth this run measured (the curve above has none, so they come out below 1).
    points = raw["contention"]
    from lagom_jax.costs import cost

    again = profile.fit_contention([p["ctas"] for p in points], [p["slowdown"] for p in points],
                                   [p["copy_gbps"] for p in points], sm_count=prof.sm_count,
                                   hbm_gbps=prof.achieved_hbm_gbps,
                                   pressure_exponent=cost.DEFAULT_COSTS.hbm_pressure_exponent)
    assert fit["sm_per_cta"] == pytest.approx(again.sm_per_cta) and fit["sm_per_cta"] < 1.0
    assert prof.sm_share_per_channel == pytest.approx(round(min(max(again.sm_per_cta, 0.01), 1.0), 3))


def test_per_op_times_from_a_real_cpu_trace_match_compiled_hlo_names(tmp_path):
    import jax

    f = jax.jit(lambda a: jnp.tanh(a @ a) + 1)
    x = jnp.full((64, 64), 0.5, jnp.float32)
    hlo_text = f.lower(x).compile().as_text()
    f(x).block_until_ready()
    with jax.profiler.trace(str(tmp_path)):
        f(x).block_until_ready()
    (xplane,) = tmp_path.rglob("*.xplane.pb")
    times = profile.per_op_times_us(xplane)
    assert times and all(t > 0 for t in times.values())
    assert all(op in hlo_text for op in times)
    assert profile.per_op_times_us(xplane, module="no_such_module") == {}


def test_accuracy_mape():
    acc = profile.accuracy({"a": 10.0, "b": 20.0, "tiny": 0.1, "c": 5.0}, {"a": 12.0, "b": 15.0, "tiny": 9.0},
                           min_measured_us=1.0)
    assert acc.mape == pytest.approx(100 * (0.2 + 0.25) / 2)
    assert [o for o, _, _ in acc.per_op] == ["a", "b"] and acc.unmatched == ("c",)
    with pytest.raises(ProfileError, match="same module"):
        profile.accuracy({"a": 1.0}, {"x": 1.0})
    with pytest.raises(ProfileError, match="'a'"):
        profile.accuracy({"a": 1.0}, {"a": float("nan")})


def test_contention_program_puts_only_the_copy_on_the_second_stream():
    import jax

    copy = profile.pallas_copy_kernel(2, 512, jnp.float32, block=128, interpret=True)
    a = jnp.ones((8, 8), jnp.float32)
    x = jnp.arange(1, 513, dtype=jnp.float32)
    text = jax.jit(profile.gemm_beside_copy(copy)).lower(a, a, x).as_text()
    lines = text.splitlines()
    dots = [ln for ln in lines if "dot_general" in ln]
    assert dots and not any("_xla_stream_annotation" in ln for ln in dots)
    assert any('_xla_stream_annotation = "1"' in ln for ln in lines)


# A GPU trace as the profiler writes it: kernels on a stream line (one tagged with its
# HLO op), a memcpy, and a derived "XLA Ops" line that repeats the GEMM.
GPU_XSPACE = '''
planes {
  id: 1
  name: "/device:GPU:0"
  lines { id: 1 name: "Stream #13(Compute)" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 7000000 stats { metadata_id: 10 str_value: "dot.3" } }
    events { metadata_id: 2 offset_ps: 8000000 duration_ps: 2000000 }
    events { metadata_id: 3 offset_ps: 9000000 duration_ps: 500000 }
  }
  lines { id: 2 name: "XLA Ops" timestamp_ns: 1000
    events { metadata_id: 1 offset_ps: 0 duration_ps: 7000000 stats { metadata_id: 10 str_value: "dot.3" } }
  }
  event_metadata { key: 1 value { id: 1 name: "sm90_xmma_gemm_bf16" } }
  event_metadata { key: 2 value { id: 2 name: "lagom_copy" } }
  event_metadata { key: 3 value { id: 3 name: "MemcpyD2D" } }
  stat_metadata { key: 10 value { id: 10 name: "hlo_op" } }
}
planes { id: 2 name: "/host:CPU" lines { id: 1 name: "python" } }
'''


def test_gpu_trace_kernel_times_skip_memcpy_and_derived_lines(tmp_path):
    from jax.profiler import ProfileData

    path = tmp_path / "gpu.xplane.pb"
    path.write_bytes(ProfileData.text_proto_to_serialized_xspace(GPU_XSPACE))
    assert profile.device_kernel_times_us(path) == {"marked": [2.0], "other": [7.0]}
    assert profile.per_op_times_us(path) == {"dot.3": 7.0}


def test_contention_fit_divides_out_the_hbm_pressure_the_cost_model_adds():
    # Slowdowns made by the cost model's own law (a SMs per CTA, (1 - p)^-beta for the copy's
    # share p of HBM) give back a; fitted without the pressure term, the SMs absorb it.
    sm, hbm, a, beta = 132, 3000.0, 0.3, 0.8
    ks = np.array([1, 2, 4, 8, 16, 32])
    bw = np.minimum(80.0 * ks, 2000.0)
    s = sm / (sm - a * ks) * (1 - bw / hbm) ** -beta
    fit = profile.fit_contention(ks, s, bw, sm_count=sm, hbm_gbps=hbm, pressure_exponent=beta)
    assert fit.sm_per_cta == pytest.approx(a, rel=1e-6) and fit.slowdown_rms < 1e-9
    assert profile.fit_contention(ks, s, bw, sm_count=sm).sm_per_cta > 2 * a
    with pytest.raises(profile.ProfileError, match="HBM bandwidth"):
        profile.fit_contention(ks, s, bw, sm_count=sm, pressure_exponent=beta)

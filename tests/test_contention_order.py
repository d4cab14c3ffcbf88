"""Contention that knows launch order (issue 35 item 1): who holds the SMs first.

Each test pins one rule of ``simulate``'s replay (the rules and their sources are in
``lagom_jax/costs/simulate.py``; the H100 order probe is
``benchmarks/results/gpu/wave_2026-11-25/gpu_order_run1.json``).
"""

from __future__ import annotations

import dataclasses

import pytest

from lagom_jax.cluster import hardware
from lagom_jax.cluster.nccl_env import NcclEnv
from lagom_jax.costs import cost, kernels, simulate
from lagom_jax.program.graph import StepGraph, Task

H100 = hardware.get("h100-sxm-8")
A100 = hardware.get("a100-sxm-8")
ALL8 = (tuple(range(8)),)
N = 8192


def gemm(i, deps=()):
    return Task(id=i, name=f"gemm{i}", kind="compute", flops=2 * N**3, bytes=3 * N * N * 2, opcode="fusion",
                gemm=(1, N, N, N), deps=deps)


def all_gather(i, deps=(), nbytes=1 << 30):
    return Task(id=i, name=f"ag{i}", kind="all-gather", bytes=nbytes, groups=ALL8, is_async=True, deps=deps)


def run(tasks, hw):
    tl = simulate.simulate(StepGraph("order", tuple(tasks), num_devices=8), hw)
    return {i.task_id: (i.start, i.end) for i in tl.intervals}


def took(span):
    return span[1] - span[0]


def test_at_equal_priority_a_gemm_launched_after_a_collective_loses_its_sms_one_before_does_not():
    alone = simulate.alone_us(gemm(0), H100)
    # Collective first (schedule order): its CTAs are resident when the GEMM starts, and
    # each takes a whole SM from cuBLAS's one-CTA-per-SM Hopper GEMM (rule a).
    after = run([all_gather(0), gemm(1)], H100)
    assert after[0][0] == 0.0 == after[1][0]
    p = cost.nccl_default_params("all-gather", 1 << 30, 8, 1, H100)
    _, hbm = cost.collective_resource_use("all-gather", 1 << 30, 8, 1, p, H100)
    whole_sms = cost.compute_time_us(2 * N**3, 3 * N * N * 2, H100, gemm=(1, N, N, N), sms_taken=p.nchannels,
                                     hbm_gbps_taken=hbm)
    assert after[0][1] > after[1][1] and took(after[1]) == pytest.approx(whole_sms, rel=1e-6)
    assert took(after[1]) / alone > 1.1
    # GEMM first: the collective launched behind it waits for its end (rule b) and the GEMM
    # runs as if alone.
    before = run([gemm(0), all_gather(1)], H100)
    assert took(before[0]) == pytest.approx(alone, rel=1e-9)
    assert before[1][0] == pytest.approx(before[0][1])
    # XLA's case: the collective's start waits on the GEMM that produced its operand; at
    # that boundary the already-queued next GEMM wins, runs alone, and the collective's CTAs
    # take the SMs of the GEMM after it (the probe's "dep": 0.996-1.000x, then slowed).
    dep = run([gemm(0), all_gather(1, deps=(0,)), gemm(2, deps=(0,)), gemm(3, deps=(2,))], H100)
    assert took(dep[2]) == pytest.approx(alone, rel=1e-9)
    assert dep[1][0] == pytest.approx(dep[2][1])
    assert took(dep[3]) / alone > 1.1


def test_the_order_blind_model_is_what_the_rules_switch_off():
    blind = dataclasses.replace(H100, contention_order=False)
    before = run([gemm(0), all_gather(1)], blind)
    assert before[1][0] == 0.0 and took(before[0]) > simulate.alone_us(gemm(0), H100)


def test_a_high_priority_collective_behind_a_long_gemm_takes_its_sms_at_the_next_wave():
    # An A100 GEMM runs waves of tiles (no persistent kernel): under the priority rule a
    # collective launched behind it starts at the end of its first wave, and the GEMM's
    # remaining waves run on the SMs left.
    hw = dataclasses.replace(A100, priority_takes_sms_at_wave=True)
    waves = cost.cta_waves((1, N, N, N), hw)
    assert waves > 1
    alone = simulate.alone_us(gemm(0), hw)
    t = run([gemm(0), all_gather(1)], hw)
    assert t[1][0] == pytest.approx(alone / waves, rel=1e-6)
    assert took(t[0]) > alone * 1.01
    # The switch off (the H100 probe's evidence), or a collective stream of normal
    # priority: it waits for the whole GEMM.
    for off in (A100, dataclasses.replace(hw, comm_high_priority=False)):
        t = run([gemm(0), all_gather(1)], off)
        assert t[1][0] == pytest.approx(took(t[0])) and took(t[0]) == pytest.approx(alone, rel=1e-9)
    # On Hopper cuBLAS's GEMM is one wave of persistent CTAs: the next wave is its end.
    t = run([gemm(0), all_gather(1)], dataclasses.replace(H100, priority_takes_sms_at_wave=True))
    assert t[1][0] == pytest.approx(t[0][1])


def test_a_zero_cta_collective_holds_no_sm_but_still_takes_hbm_bandwidth():
    zero = dataclasses.replace(H100, nccl_env=NcclEnv.from_environ({"NCCL_CTA_POLICY": "2"}, symmetric_buffers=True))
    alone = simulate.alone_us(gemm(0), zero)
    # Copy engines need no SM: launched behind the GEMM it starts at once (rule d) ...
    t = run([gemm(0), all_gather(1)], zero)
    assert t[1][0] == 0.0
    # ... and slows the GEMM by the HBM bandwidth it takes, not by SMs.
    p = cost.nccl_default_params("all-gather", 1 << 30, 8, 1, zero)
    sms, hbm = cost.collective_resource_use("all-gather", 1 << 30, 8, 1, p, zero)
    assert sms == 0 and hbm > 0
    assert took(t[0]) > alone * 1.01
    assert took(t[0]) == pytest.approx(cost.compute_time_us(2 * N**3, 3 * N * N * 2, zero, gemm=(1, N, N, N),
                                                            hbm_gbps_taken=hbm), rel=1e-6)
    # The same all-gather on SMs, resident first, costs the GEMM far more.
    sm_based = run([all_gather(0), gemm(1)], H100)
    assert took(sm_based[1]) > took(t[0])


def test_a_gemm_of_many_waves_loses_a_wave_to_one_held_sm_and_a_one_wave_gemm_does_not():
    # The H100 order probe: one held SM of 132 cost its 16-wave GEMM 6.4-7.1%, not 0.8%.
    def slowdown(m, n, k, sms, cfg=cost.DEFAULT_COSTS):
        shape = dict(gemm=(1, m, n, k), cfg=cfg)
        alone = cost.compute_time_us(2 * m * n * k, 2 * (m * k + k * n + m * n), H100, **shape)
        return cost.compute_time_us(2 * m * n * k, 2 * (m * k + k * n + m * n), H100, sms_taken=sms, **shape) / alone

    waves = kernels.gemm_waves(N, N, N, H100)
    assert waves == 16
    assert slowdown(N, N, N, 1) == pytest.approx(1 + 1 / waves, rel=0.01)
    off = dataclasses.replace(cost.DEFAULT_COSTS, held_sm_tail_waves=0.0)
    assert slowdown(N, N, N, 1, off) < 1.01
    # 128 tiles fit the 131 SMs left: nothing waits.
    assert kernels.gemm_waves(2048, 2048, 8192, H100) == 1
    assert slowdown(2048, 2048, 8192, 1) == pytest.approx(1.0, abs=0.01)
    # An A100 GEMM shares its SM with a NCCL CTA (0.2 SM each): no whole SM, no tail.
    alone = cost.compute_time_us(2 * N**3, 6 * N * N, A100, gemm=(1, N, N, N))
    assert cost.compute_time_us(2 * N**3, 6 * N * N, A100, gemm=(1, N, N, N), sms_taken=0.2) / alone < 1.01

"""What NCCL's settings do to a collective and to the compute beside it: symmetric kernels,
NVLS on registered buffers, CTA caps (each test fails with its mechanism switched off)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from lagom_jax import cli, search
from lagom_jax.cluster import hardware
from lagom_jax.cluster.nccl_env import NcclEnv
from lagom_jax.costs import cost
from lagom_jax.program.graph import StepGraph, Task

H100 = hardware.get("h100-sxm-8")
B200 = hardware.get("b200-sxm-8")


def _with(hw, **env):
    return dataclasses.replace(hw, nccl_env=NcclEnv(**env))


def _gemm_beside(kind: str, nbytes: int) -> StepGraph:
    """An 8192^3 GEMM beside an independent collective over the 8 GPUs of one node."""
    coll = Task(id=0, name="c", kind=kind, bytes=nbytes, groups=(tuple(range(8)),), is_async=True)
    gemm = Task(id=1, name="gemm", kind="compute", flops=2 * 8192**3, bytes=3 * 8192**2 * 2, opcode="fusion",
                gemm=(1, 8192, 8192, 8192))
    return StepGraph("gemm+c", (coll, gemm), num_devices=8)


@pytest.mark.parametrize("hw", [H100, B200], ids=["h100", "b200"])
@pytest.mark.parametrize("kind", ["all-gather", "reduce-scatter", "all-reduce"])
def test_symmetric_kernels_hold_fewer_sms_than_ring_kernels_at_the_same_bandwidth(hw, kind):
    nbytes = 256 << 20
    ring = cost.nccl_default_params(kind, nbytes, 8, 1, hw)
    sym_hw = _with(hw, symmetric_buffers=True)
    sym = cost.nccl_default_params(kind, nbytes, 8, 1, sym_hw)
    assert sym.algorithm == "symmetric" and ring.algorithm != "symmetric"
    # NCCL's multicast kernels: ceil(16 / 8) CTAs on Hopper, ceil(32 / 8) on Blackwell.
    assert sym.nchannels <= (2 if hw is H100 else 4) < ring.nchannels
    t_ring = cost.collective_time_us(kind, nbytes, 8, 1, ring, hw)
    t_sym = cost.collective_time_us(kind, nbytes, 8, 1, sym, sym_hw)
    assert t_sym == pytest.approx(t_ring, rel=0.08)  # the same NVLink, the same bandwidth
    sms_ring = cost.collective_resource_use(kind, nbytes, 8, 1, ring, hw)[0]
    sms_sym = cost.collective_resource_use(kind, nbytes, 8, 1, sym, sym_hw)[0]
    assert sms_sym < sms_ring / 4


def test_symmetric_kernels_cut_the_latency_of_small_collectives_and_take_no_tuner_choice():
    sym_hw = _with(H100, symmetric_buffers=True)
    for kind in ("all-gather", "all-reduce"):
        base = cost.default_time_us(kind, 4096, 8, 1, H100)
        assert cost.default_time_us(kind, 4096, 8, 1, sym_hw) < 0.6 * base
        assert len(cost.candidate_params(kind, 4096, 8, 1, sym_hw)) == 1  # NCCL asks no tuner
    # Across nodes, over PCIe, on Ampere, for all-to-all: NCCL's regular kernels.
    assert cost.nccl_default_params("all-gather", 1 << 20, 16, 2, sym_hw.with_nodes(2)).algorithm == "ring"
    assert cost.nccl_default_params("all-to-all", 1 << 20, 8, 1, sym_hw).algorithm == "ring"
    a100 = _with(hardware.get("a100-sxm-8"), symmetric_buffers=True)
    assert cost.nccl_default_params("all-gather", 1 << 20, 8, 1, a100).algorithm == "ring"


def test_symmetric_buffers_speed_a_gemm_beside_a_reduce_scatter():
    step = _gemm_beside("reduce-scatter", 512 << 20)
    plain = search.run_strategy("xla-default", step, H100).makespan_us
    sym = search.run_strategy("xla-default", step, _with(H100, symmetric_buffers=True)).makespan_us
    assert sym < 0.95 * plain


def test_nvls_on_registered_buffers_holds_fewer_ctas_at_the_same_time():
    ub = _with(H100, user_buffers=True)
    plain = cost.nccl_default_params("all-reduce", 256 << 20, 8, 1, H100)
    registered = cost.nccl_default_params("all-reduce", 256 << 20, 8, 1, ub)
    assert plain.algorithm == registered.algorithm == "nvls"
    assert (plain.nchannels, registered.nchannels) == (16, 4)
    assert cost.nvls_registered_ctas(_with(B200, user_buffers=True)) == 8
    assert cost.collective_time_us("all-reduce", 256 << 20, 8, 1, registered, ub) == pytest.approx(
        cost.collective_time_us("all-reduce", 256 << 20, 8, 1, plain, H100), rel=0.01)
    step = _gemm_beside("all-reduce", 256 << 20)
    assert (search.run_strategy("xla-default", step, ub).makespan_us
            < 0.97 * search.run_strategy("xla-default", step, H100).makespan_us)


def test_nvls_gathers_run_at_under_half_the_all_reduce_rate_so_nccl_keeps_its_ring():
    # NCCL's model: an NVLS all-gather's busBw is the all-reduce's x (n-1)/2n.
    nvls = cost.CollectiveParams("nvls", "Simple", 16, 128 << 10, 512)
    assert cost.busbw_gbps(nvls, H100, kind="all-gather", n=8) == pytest.approx(476.0 * 7 / 16)
    assert cost.busbw_gbps(nvls, H100, kind="all-reduce", n=8) == pytest.approx(476.0)
    for kind in ("all-gather", "reduce-scatter"):
        assert cost.nccl_default_params(kind, 512 << 20, 8, 1, H100).algorithm == "ring"
        assert cost.nccl_default_params(kind, 512 << 20, 8, 1, _with(H100, algorithms=("nvls",))).algorithm == "nvls"
        assert "nvls" in {p.algorithm for p in cost.candidate_params(kind, 512 << 20, 8, 1, H100)}
    with pytest.raises(ValueError, match="at most 32 GPUs"):
        cost.collective_time_us("all-gather", 1 << 20, 64, 1, nvls, hardware.get("gb200-nvl72"))


def test_the_efficiency_policy_on_registered_buffers_moves_gathers_to_few_nvls_ctas():
    on = _with(H100, user_buffers=True, efficiency=True)
    for kind, ctas in (("all-gather", 4), ("reduce-scatter", 5)):
        p = cost.nccl_default_params(kind, 512 << 20, 8, 1, on)
        assert (p.algorithm, p.nchannels) == ("nvls", ctas)
        # Either alone changes nothing, nor does the policy across nodes or under NCCL_PROTO.
        for hw in (_with(H100, user_buffers=True), _with(H100, efficiency=True),
                   _with(H100, user_buffers=True, efficiency=True, protocols=("Simple",))):
            assert cost.nccl_default_params(kind, 512 << 20, 8, 1, hw).algorithm == "ring"
        assert cost.nccl_default_params(kind, 512 << 20, 16, 2, on.with_nodes(2)).algorithm == "ring"
    assert cost.nccl_default_params("all-gather", 512 << 20, 8, 1, _with(B200, user_buffers=True,
                                                                        efficiency=True)).nchannels == 4
    assert cost.nccl_default_params("reduce-scatter", 512 << 20, 8, 1, _with(B200, user_buffers=True,
                                                                            efficiency=True)).nchannels == 6
    # Slower alone, but the GEMM beside it keeps the SMs a ring would hold.
    step = _gemm_beside("all-gather", 512 << 20)
    spans = {}
    for name, hw in (("ring", H100), ("nvls", on)):
        t = search.run_strategy("xla-default", step, hw).timeline
        spans[name] = {iv.task_id: iv.end - iv.start for iv in t.intervals}
    assert spans["nvls"][0] > spans["ring"][0]
    assert spans["nvls"][1] < 0.95 * spans["ring"][1]


def test_a_cta_cap_slows_the_collective_and_speeds_the_compute_beside_it():
    step = _gemm_beside("all-gather", 512 << 20)
    runs = {}
    for cap in (0, 8):
        hw = _with(H100, max_ctas=cap)
        t = search.run_strategy("xla-default", step, hw).timeline
        spans = {iv.task_id: iv.end - iv.start for iv in t.intervals}
        runs[cap] = spans
    assert runs[8][0] > 1.5 * runs[0][0]  # the all-gather on 8 CTAs instead of 24
    assert runs[8][1] < 0.95 * runs[0][1]  # the GEMM beside it keeps 16 more SMs


def test_tune_searches_inside_a_users_cta_cap_and_carries_it(tmp_path, capsys):
    assert cli.main(["tune", "--example", "--hardware", "h100-sxm-8", "--json", "--nccl-env", "NCCL_MAX_CTAS=8",
                     "--nccl-env", "NCCL_DEBUG=WARN"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert "NCCL_DEBUG=WARN is accepted and changes nothing" in captured.err
    assert out["nccl_env"]["NCCL_MAX_CTAS"] == "8"
    assert all(c["params"]["nchannels"] <= 8 for c in out["collectives"])
    # NCCL_MAX_CTAS overrides XLA's maxCTAs: the plan does not set XLA's cap beside it.
    assert "xla_gpu_nccl_collective_max_nchannels" not in out["xla_flags"]


@pytest.mark.parametrize("value, fragment", [("NCCL_MAX_CTAS=0", "NCCL_MAX_CTAS=0"),
                                             ("NCCL_MIN_CTAS=9", None), ("NCCL_MAXCTAS=4", "did you mean")])
def test_tune_refuses_a_bad_nccl_setting_in_one_line_and_writes_nothing(tmp_path, capsys, value, fragment):
    argv = ["tune", "--example", "--out", str(tmp_path / "plan"), "--nccl-env", value]
    if fragment is None:  # MIN above a MAX given beside it
        argv += ["--nccl-env", "NCCL_MAX_CTAS=4"]
        fragment = "MIN <= MAX"
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "plan").exists()


def test_the_decorator_takes_the_same_variables():
    import jax

    from lagom_jax import api

    with pytest.raises(ValueError, match="NCCL_NTHREADS"):
        api.Tuned(jax.jit(lambda x: x), nccl_env={"NCCL_NTHREADS": "100"})
    tuned = api.Tuned(jax.jit(lambda x: x), nccl_env={"NCCL_MAX_CTAS": "16"}, use_cache=False)
    assert tuned._nccl_env == {"NCCL_MAX_CTAS": "16"}


def test_verification_says_the_nccl_settings_act_only_at_run_time():
    from lagom_jax.plan import verify
    from lagom_jax.plan.schema import Plan
    from lagom_jax.program import graph as graph_lib

    text = cli.example_text()
    plan = Plan(module="m", fingerprint="", hardware="h100-sxm-8", gpus_per_node=8, nodes=1, strategy="lagom",
                version="0", nccl_settings=(("NCCL_MAX_CTAS", "8"),))
    checked, _ = verify.verify_plan(plan, graph_lib.from_hlo_text(text), text, lambda options: text)
    lines = dict(checked.verification)
    assert "NCCL_MAX_CTAS=8" in lines["NCCL settings"] and "only at run time" in lines["NCCL settings"]

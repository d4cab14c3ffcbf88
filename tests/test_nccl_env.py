"""NCCL's process-wide settings as the cost model reads them (NCCL_ALGO, NCCL_PROTO, NCCL_NVLS_ENABLE)."""

from __future__ import annotations

import dataclasses

import pytest

from lagom_jax.cluster import hardware
from lagom_jax.cluster.nccl_env import NcclEnv


def test_nccl_list_syntax_is_read_as_nccl_reads_it():
    env = NcclEnv.from_environ({"NCCL_ALGO": "NVLS,Ring", "NCCL_NVLS_ENABLE": "1"})
    assert env.algorithms == ("ring", "nvls") and env.nvls
    assert env.allows_algorithm("nvls") and not env.allows_algorithm("tree")
    assert NcclEnv.from_environ({"NCCL_PROTO": "^LL128"}).protocols == ("LL", "Simple")
    assert NcclEnv.from_environ({"NCCL_PROTO": "simple"}).protocols == ("Simple",)
    # Algorithms the model does not price may be named beside ones it does.
    assert NcclEnv.from_environ({"NCCL_ALGO": "Ring,PAT,CollnetDirect"}).algorithms == ("ring",)
    off = NcclEnv.from_environ({"NCCL_NVLS_ENABLE": "0"})
    assert not off.allows_algorithm("nvls") and off.allows_algorithm("ring")
    assert NcclEnv.from_environ({}).is_default and NcclEnv().describe() == "NCCL's defaults"


@pytest.mark.parametrize("env", [
    {"NCCL_NVLS_ENABLE": "0", "NCCL_PROTO": "LL128"},
    {"NCCL_ALGO": "Ring,Tree"},
    {"NCCL_ALGO": "^Tree", "NCCL_PROTO": "^LL"},
])
def test_settings_round_trip_through_the_environment(env):
    made = NcclEnv.from_environ(env)
    assert NcclEnv.from_environ(made.as_environ()) == made


@pytest.mark.parametrize("env, match", [
    ({"NCCL_ALGO": "allreduce:tree"}, "per-collective"),
    ({"NCCL_ALGO": "Ring;allgather:ring"}, "per-collective"),
    ({"NCCL_ALGO": "Rings"}, "unknown"),
    ({"NCCL_PROTO": ""}, None),
    ({"NCCL_PROTO": "^LL,LL128,Simple"}, "leaves nothing"),
    ({"NCCL_ALGO": "PAT"}, "leaves nothing"),
    ({"NCCL_ALGO": "NVLS", "NCCL_NVLS_ENABLE": "0"}, "leaves no algorithm"),
    ({"NCCL_NVLS_ENABLE": "yes"}, "0, 1 or 2"),
    ({"NCCL_BUFFSIZE": "1"}, "at least 8192"),
    ({"NCCL_MAX_CTAS": "0"}, "NCCL_MAX_CTAS=0: must be at least 1"),
    ({"NCCL_MAX_CTAS": "65"}, "1 to 64"),
    ({"NCCL_MIN_CTAS": "32", "NCCL_MAX_CTAS": "8"}, "MIN <= MAX"),
    ({"NCCL_MAX_CTAS": "8", "NCCL_MAX_NCHANNELS": "16"}, "deprecated name"),
    ({"NCCL_NTHREADS": "320"}, "64, 128, 256, 512"),
    ({"NCCL_NTHREADS": "many"}, "not an integer"),
    ({"NCCL_MAXCTAS": "8"}, "did you mean NCCL_MAX_CTAS"),
    ({"NCCL_FOO_BAR": "1"}, "not one NCCL documents"),
    ({"XLA_FLAGS": "--foo"}, "not an NCCL variable"),
])
def test_bad_settings_are_named(env, match):
    if match is None:  # an empty value is NCCL's default
        assert NcclEnv.from_environ(env).is_default
        return
    with pytest.raises(ValueError, match=match):
        NcclEnv.from_environ(env)


def test_a_profile_carries_its_settings_through_json(tmp_path):
    hw = dataclasses.replace(hardware.get("h100-sxm-8"),
                             nccl_env=NcclEnv.from_environ({"NCCL_PROTO": "^LL128", "NCCL_NVLS_ENABLE": "0"}))
    path = tmp_path / "hw.json"
    hw.save(path)
    back = hardware.HardwareProfile.load(path)
    assert back == hw and not back.has_nvls and hardware.get("h100-sxm-8").has_nvls
    with pytest.raises(ValueError, match="NVLS exists only"):
        dataclasses.replace(hardware.get("a100-sxm-8"), nvls_busbw_gbps=400.0, nvls_channels=16)
    with pytest.raises(ValueError, match="both"):
        dataclasses.replace(hardware.get("h100-sxm-8"), nvls_channels=0)


def test_zero_cta_policy_frees_the_sms_of_data_moving_collectives_only():
    from lagom_jax.costs import cost
    from lagom_jax.cluster.params import CollectiveParams

    h100 = hardware.get("h100-sxm-8")
    zero = dataclasses.replace(h100, nccl_env=NcclEnv.from_environ({"NCCL_CTA_POLICY": "2"}, symmetric_buffers=True))
    assert zero.nccl_env.as_environ() == {"NCCL_CTA_POLICY": "2"}
    p = CollectiveParams("ring", "Simple", 24, 2 << 20, 512)
    sms, hbm = cost.comm_resource_use(p, zero, kind="all-gather")
    assert sms == 0 and hbm == cost.comm_resource_use(p, h100, kind="all-gather")[1] > 0
    assert cost.comm_resource_use(p, zero, kind="reduce-scatter")[0] > 0  # reductions need SMs
    assert cost.comm_resource_use(p, zero, nodes=2, kind="all-gather")[0] > 0  # copy engines drive NVLink only
    with pytest.raises(ValueError, match="0 \\(default\\), 1 \\(efficiency\\) or 2"):
        NcclEnv.from_environ({"NCCL_CTA_POLICY": "3"})
    assert NcclEnv.from_environ({"NCCL_CTA_POLICY": "1"}).as_environ() == {"NCCL_CTA_POLICY": "1"}


def test_zero_cta_policy_speeds_a_gemm_overlapped_with_an_all_gather():
    # The PyTorch microbenchmark's shape (pytorch/pytorch PR #172714): an 8192^3 fp16 GEMM
    # beside an independent all-gather of 64 MiB per rank over 8 H100; with copy engines
    # the GEMM keeps every SM.
    from lagom_jax import search
    from lagom_jax.program.graph import StepGraph, Task

    gemm = Task(id=0, name="gemm", kind="compute", flops=2 * 8192**3, bytes=3 * 8192**2 * 2, opcode="fusion",
                gemm=(1, 8192, 8192, 8192))
    ag = Task(id=1, name="ag", kind="all-gather", bytes=512 << 20, groups=(tuple(range(8)),), is_async=True)
    g = StepGraph("gemm+ag", (gemm, ag), num_devices=8)
    h100 = hardware.get("h100-sxm-8")
    zero = dataclasses.replace(h100, nccl_env=NcclEnv.from_environ({"NCCL_CTA_POLICY": "2"}, symmetric_buffers=True))
    sm_based = search.run_strategy("xla-default", g, h100).makespan_us
    copy_engine = search.run_strategy("xla-default", g, zero).makespan_us
    assert copy_engine < 0.99 * sm_based


def test_the_copy_engines_need_the_policy_and_xlas_symmetric_buffers_together():
    # NCCL runs zero-CTA only on symmetric windows; XLA registers them under its flag and
    # never sets the policy (AsNcclConfig): either alone leaves every collective on the SMs.
    policy = NcclEnv.from_environ({"NCCL_CTA_POLICY": "2"})
    flag = NcclEnv(symmetric_buffers=True)
    both = NcclEnv.from_environ({"NCCL_CTA_POLICY": "2"}, symmetric_buffers=True)
    assert both.copy_engine("all-gather", 1) and both.copy_engine("all-to-all", 1)
    assert not both.copy_engine("all-reduce", 1) and not both.copy_engine("all-gather", 2)
    assert not policy.copy_engine("all-gather", 1) and not flag.copy_engine("all-gather", 1)
    assert both.describe() == "NCCL_CTA_POLICY=2 on XLA's symmetric buffers"


def test_cta_pins_threads_and_buffer_are_read_as_nccl_reads_them():
    env = NcclEnv.from_environ({"NCCL_MIN_NCHANNELS": "4", "NCCL_MAX_CTAS": "16", "NCCL_NTHREADS": "256",
                                "NCCL_BUFFSIZE": "8388608", "NCCL_NVLS_NCHANNELS": "8"})
    assert (env.min_ctas, env.max_ctas, env.nthreads, env.buffsize, env.nvls_ctas) == (4, 16, 256, 8 << 20, 8)
    assert env.ctas(24) == 16 and env.ctas(2) == 4 and env.channel_cap == 16
    assert env.threads("Simple", 512) == 256 and env.threads("LL128", 640) == 640
    assert env.simple_chunk(2 << 20, ring=True) == 4 << 20 and env.max_simple_chunk == 4 << 20
    assert NcclEnv().ctas(24) == 24 and NcclEnv().channel_cap == 64
    # The deprecated name is written back under the current one, and read the same.
    assert NcclEnv.from_environ(env.as_environ()) == env
    assert env.as_environ()["NCCL_MIN_CTAS"] == "4"


def test_documented_variables_the_model_does_not_price_are_accepted_and_said():
    from lagom_jax.cluster import nccl_env

    given = {"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5", "NCCL_PROTO": "Simple"}
    assert NcclEnv.from_environ(given) == NcclEnv.from_environ({"NCCL_PROTO": "Simple"})
    lines = nccl_env.unpriced(given)
    assert len(lines) == 2 and lines[0].startswith("NCCL_DEBUG=INFO is accepted and changes nothing")


def test_cta_pins_bound_every_collective_and_the_search():
    from lagom_jax.costs import cost

    h100 = hardware.get("h100-sxm-8")
    capped = dataclasses.replace(h100, nccl_env=NcclEnv.from_environ({"NCCL_MAX_CTAS": "8"}))
    raised = dataclasses.replace(h100, nccl_env=NcclEnv.from_environ({"NCCL_MIN_CTAS": "32"}))
    big = (1 << 30)
    assert cost.nccl_default_params("all-gather", big, 8, 1, h100).nchannels == h100.nccl_channels
    assert cost.nccl_default_params("all-gather", big, 8, 1, capped).nchannels == 8
    assert cost.nccl_default_params("all-gather", big, 8, 1, raised).nchannels == 32
    # NCCL still cuts a small message's channels under a minimum (topoGetAlgoInfo).
    assert cost.nccl_default_params("all-gather", 4096, 8, 1, raised).nchannels == 1
    assert max(p.nchannels for p in cost.candidate_params("all-gather", big, 8, 1, capped)) == 8
    threads = dataclasses.replace(h100, nccl_env=NcclEnv.from_environ({"NCCL_NTHREADS": "256"}))
    assert {p.nthreads for p in cost.candidate_params("all-gather", big, 8, 1, threads)
            if p.protocol != "LL128"} == {256}
    buffer = dataclasses.replace(h100, nccl_env=NcclEnv.from_environ({"NCCL_BUFFSIZE": str(1 << 20)}))
    assert cost.nccl_default_params("all-gather", big, 8, 1, buffer).chunk_bytes == 512 << 10

"""Process-wide NCCL settings as choices of the plan (lagom_jax.plan.nccl_settings)."""

from __future__ import annotations

import dataclasses

import pytest

from lagom_jax.cluster import hardware
from lagom_jax.cluster.nccl_env import NcclEnv
from lagom_jax.plan import nccl_settings, planning
from lagom_jax.plan.schema import Plan
from lagom_jax.program.graph import StepGraph, Task


def _gemms_beside_all_gathers(n: int = 4, nodes_per_group: int = 1) -> StepGraph:
    """``n`` 8192^3 GEMMs, each beside an independent all-gather of 512 MiB (the PyTorch
    copy-engine microbenchmark's shape, pytorch/pytorch PR #172714), in a chain."""
    tasks, prev = [], ()
    ranks = tuple(range(8 * nodes_per_group))
    for i in range(n):
        ag = Task(id=len(tasks), name=f"ag{i}", kind="all-gather", bytes=512 << 20, groups=(ranks,),
                  is_async=True, deps=prev)
        tasks.append(ag)
        gemm = Task(id=len(tasks), name=f"gemm{i}", kind="compute", flops=2 * 8192**3, bytes=3 * 8192**2 * 2,
                    opcode="fusion", gemm=(1, 8192, 8192, 8192), deps=prev)
        tasks.append(gemm)
        prev = (ag.id, gemm.id)
    return StepGraph("gemm+ag", tuple(tasks), num_devices=len(ranks))


def test_candidates_follow_the_hardware():
    h100 = hardware.get("h100-sxm-8")
    names = [s.name for s in nccl_settings.candidates(h100)]
    assert any("zero-CTA" in n for n in names) and any("NVLS off" in n for n in names)
    assert any("symmetric kernels" in n for n in names) and any("user buffers" in n for n in names)
    assert {n for n in names if n.startswith("NCCL_MAX_CTAS")} == {"NCCL_MAX_CTAS=4", "NCCL_MAX_CTAS=8"}
    zero = [s for s in nccl_settings.candidates(h100) if s.env.zero_cta][0]
    assert [f.name for f in zero.flags] == ["xla_gpu_experimental_enable_nccl_symmetric_buffers"]
    assert {n for n in names if n.startswith("NCCL_MIN_CTAS")} == {
        "NCCL_MIN_CTAS=32 (more channels than the communicator's 24)",
        "NCCL_MIN_CTAS=64 (more channels than the communicator's 24)"}
    # No NVLink: no copy-engine collectives; no NVSwitch multicast: no NVLS to turn off; only
    # registered sends and receives and more channels than the communicator's 8.
    assert [s.name for s in nccl_settings.candidates(hardware.get("a40-pcie-8"))] == [
        "registered buffers (XLA's user buffers: direct sends and receives, NVLS on fewer CTAs)",
        "NCCL_MIN_CTAS=32 (more channels than the communicator's 8)",
        "NCCL_MIN_CTAS=64 (more channels than the communicator's 8)"]
    off = dataclasses.replace(h100, nccl_env=NcclEnv(nvls=False))
    assert any("NVLS on" in s.name for s in nccl_settings.candidates(off))


def test_zero_cta_is_taken_where_it_frees_the_sms_under_overlapped_gemms():
    h100 = hardware.get("h100-sxm-8")
    step = _gemms_beside_all_gathers()
    planned = planning.plan(step, h100, strategy="lagom", baselines=("xla-default",))
    out = nccl_settings.choose(step, planned, h100, strategy="lagom")
    assert out.setting is not None and out.setting.env.zero_cta
    plan = out.planned.plan
    assert plan.makespan_us < (1 - nccl_settings.SETTING_FLOOR) * planned.plan.makespan_us
    # The baseline stays XLA's defaults under the cluster's own settings.
    assert dict(plan.predicted_us)["xla-default"] == dict(planned.plan.predicted_us)["xla-default"]
    assert dict(plan.nccl_settings) == {"NCCL_CTA_POLICY": "2"}
    assert plan.nccl_env()["NCCL_CTA_POLICY"] == "2"
    assert "--xla_gpu_experimental_enable_nccl_symmetric_buffers=true" in plan.xla_flags()
    assert out.hardware.nccl_env.zero_cta
    why = dict(out.decisions)[out.setting.name]
    assert "taken" in why and "all-gather" in why and "MiB" in why
    assert "NCCL settings for every rank: NCCL_CTA_POLICY=2" in plan.report()
    again = Plan.from_json(plan.to_json())
    assert again.nccl_settings == plan.nccl_settings and again.flags == plan.flags


def test_a_gain_below_the_floor_is_not_taken(monkeypatch):
    h100 = hardware.get("h100-sxm-8")
    step = _gemms_beside_all_gathers()
    planned = planning.plan(step, h100, strategy="lagom", baselines=("xla-default",))
    monkeypatch.setattr(nccl_settings, "SETTING_FLOOR", 0.5)
    out = nccl_settings.choose(step, planned, h100, strategy="lagom")
    assert out.setting is None and out.planned is planned and out.hardware is h100
    assert any("not taken: below the 2.000x floor (50.0% of the step)" in why for _, why in out.decisions)


def test_settings_that_change_no_collective_are_not_priced():
    # All-gathers across two nodes: copy engines drive NVLink only, so zero-CTA changes
    # nothing; no all-reduce, so NVLS changes nothing either. Nothing is searched again.
    h100 = hardware.get("h100-sxm-8")
    step = _gemms_beside_all_gathers(nodes_per_group=2)
    two = h100.with_nodes(2)
    planned = planning.plan(step, two, strategy="lagom", baselines=())
    out = nccl_settings.choose(step, planned, two, strategy="lagom")
    buffers_and_nvls = [why for name, why in out.decisions if not name.startswith(("NCCL_MAX_CTAS", "NCCL_MIN_CTAS"))]
    assert buffers_and_nvls == ["not priced: no collective of this step would change"] * 5
    # A CTA cap reaches only the CTAs no tuner rule sets (NVLS, symmetric kernels): none here.
    caps = [why for name, why in out.decisions if name.startswith("NCCL_MAX_CTAS")]
    assert caps and all(why.startswith("not priced: a cap reaches only NVLS") for why in caps)
    # More channels than the communicator's: the only setting these all-gathers can take.
    assert out.setting is None or out.setting.name.startswith("NCCL_MIN_CTAS")


def test_memory_overhead_rounds_each_collective_buffer_to_the_granularity():
    step = StepGraph("s", (Task(id=0, name="a", kind="all-gather", bytes=3 << 20, groups=((0, 1),)),
                           Task(id=1, name="b", kind="all-reduce", bytes=4 << 20, groups=((0, 1),))), 2)
    assert nccl_settings.memory_overhead_bytes(step) == 1 << 20


@pytest.mark.parametrize("env, expect", [(NcclEnv(nvls=False), {"NCCL_NVLS_ENABLE": "1"}),
                                         (NcclEnv(), {"NCCL_NVLS_ENABLE": "0"})])
def test_turning_nvls_back_on_is_said(env, expect):
    hw = dataclasses.replace(hardware.get("h100-sxm-8"), nccl_env=env)
    setting = [s for s in nccl_settings.candidates(hw) if s.name.startswith(("NVLS on (", "NVLS off ("))][0]
    plan = nccl_settings.with_setting(Plan(module="m", fingerprint="", hardware=hw.name, gpus_per_node=8, nodes=1,
                                           strategy="lagom", version="0"), setting, hw)
    assert dict(plan.nccl_settings) == expect


def test_zero_cta_on_an_older_nccl_is_said():
    zero = Plan(module="m", fingerprint="", hardware="h100-sxm-8", gpus_per_node=8, nodes=1, strategy="lagom",
                version="0", nccl_settings=(("NCCL_CTA_POLICY", "2"),))
    assert "NCCL 2.27.3" in nccl_settings.unmet_needs(zero, (2, 27, 3))
    assert nccl_settings.unmet_needs(zero, (2, 28, 9)) == ""
    assert nccl_settings.unmet_needs(zero, None) == ""  # unknown: nothing to say
    assert nccl_settings.unmet_needs(dataclasses.replace(zero, nccl_settings=()), (2, 18, 5)) == ""


def test_the_launch_script_carries_the_settings(tmp_path):
    from lagom_jax.plan import artifacts

    h100 = hardware.get("h100-sxm-8")
    step = _gemms_beside_all_gathers()
    planned = planning.plan(step, h100, strategy="lagom", baselines=("xla-default",))
    out = nccl_settings.choose(step, planned, h100, strategy="lagom")
    launch = artifacts.write(tmp_path, out.planned.plan, out.planned.chosen, lambda _: None)
    text = launch.read_text() + (tmp_path / "nccl_env.sh").read_text()
    assert "NCCL_CTA_POLICY=2" in text
    assert "xla_gpu_experimental_enable_nccl_symmetric_buffers=true" in (tmp_path / "xla_flags.txt").read_text()


def test_a_setting_that_leaves_no_algorithm_is_reported_not_fatal():
    # The cluster runs NVLS only: turning NVLS off would leave its all-reduces no algorithm.
    hw = dataclasses.replace(hardware.get("h100-sxm-8"), nccl_env=NcclEnv.from_environ({"NCCL_ALGO": "NVLS"}))
    ar = Task(id=0, name="ar", kind="all-reduce", bytes=64 << 20, groups=(tuple(range(8)),), is_async=True)
    gemm = Task(id=1, name="gemm", kind="compute", flops=2 * 4096**3, bytes=3 * 4096**2 * 2, opcode="fusion",
                gemm=(1, 4096, 4096, 4096))
    step = StepGraph("ar+gemm", (ar, gemm), num_devices=8)
    planned = planning.plan(step, hw, strategy="lagom", baselines=())
    out = nccl_settings.choose(step, planned, hw, strategy="lagom")
    assert out.setting is None or not out.setting.name.startswith("NVLS off")
    why = dict(out.decisions)["NVLS off (NCCL_NVLS_ENABLE=0)"]
    assert why.startswith("not priced:") and "no" in why and "algorithm" in why


def test_cta_pins_are_priced_only_where_they_can_do_what_the_search_cannot():
    # One node: the all-reduce runs NVLS, whose CTAs only a cap reaches; the all-gathers took
    # their communicator's 24 channels, so more might help. Across nodes neither holds.
    h100 = hardware.get("h100-sxm-8")
    step = _gemms_beside_all_gathers()
    planned = planning.plan(step, h100, strategy="lagom", baselines=())
    out = dict(nccl_settings.choose(step, planned, h100, strategy="lagom").decisions)
    ar = Task(id=0, name="ar", kind="all-reduce", bytes=64 << 20, groups=(tuple(range(8)),), is_async=True)
    gemm = Task(id=1, name="gemm", kind="compute", flops=2 * 4096**3, bytes=3 * 4096**2 * 2, opcode="fusion",
                gemm=(1, 4096, 4096, 4096))
    nvls_step = StepGraph("ar+gemm", (ar, gemm), num_devices=8)
    nvls = dict(nccl_settings.choose(nvls_step, planning.plan(nvls_step, h100, strategy="lagom", baselines=()),
                                     h100, strategy="lagom").decisions)
    assert nvls["NCCL_MAX_CTAS=8"].startswith("step ")  # priced
    assert out["NCCL_MAX_CTAS=8"].startswith("not priced: a cap reaches only NVLS")


def test_only_the_kept_setting_reads_taken():
    h100 = hardware.get("h100-sxm-8")
    step = _gemms_beside_all_gathers()
    planned = planning.plan(step, h100, strategy="lagom", baselines=("xla-default",))
    out = nccl_settings.choose(step, planned, h100, strategy="lagom")
    taken = [name for name, why in out.decisions if "; taken;" in why]
    assert taken == [out.setting.name]


def _ring_of_sends(n: int = 6) -> StepGraph:
    """A ring of 32 MiB sends over 8 GPUs, each feeding a short GEMM: the sends are exposed."""
    tasks, prev = [], ()
    ring = tuple((j, (j + 1) % 8) for j in range(8))
    for i in range(n):
        send = Task(id=len(tasks), name=f"send{i}", kind="collective-permute", bytes=32 << 20, pairs=ring,
                    is_async=True, deps=prev)
        tasks.append(send)
        gemm = Task(id=len(tasks), name=f"gemm{i}", kind="compute", flops=2 * 2048**3, bytes=3 * 2048**2 * 2,
                    opcode="fusion", gemm=(1, 2048, 2048, 2048), deps=(send.id,))
        tasks.append(gemm)
        prev = (gemm.id,)
    return StepGraph("ring-of-sends", tuple(tasks), num_devices=8)


def test_registered_sends_are_priced_by_replaying_the_chosen_step_and_taken_above_the_floor():
    h100 = hardware.get("h100-sxm-8")
    step = _ring_of_sends()
    planned = planning.plan(step, h100, strategy="lagom", baselines=("xla-default",))
    out = nccl_settings.choose(step, planned, h100, strategy="lagom")
    why = dict(out.decisions)
    registered = next(n for n in why if n.startswith("registered buffers"))
    assert "changes collective-permute" in why[registered]
    # Exposed sends 10% faster: far above the floor, so it is taken and its plan searched.
    assert out.setting is not None and out.setting.env.user_buffers
    assert [f.name for f in out.setting.flags] == ["xla_gpu_enable_nccl_user_buffers"]
    assert out.planned.plan.makespan_us < 0.95 * planned.plan.makespan_us


def _exchanges_beside_gemms(ranks: int = 8) -> StepGraph:
    """Two dropless MoE exchanges (ragged all-to-alls of 256 MiB over ``ranks`` GPUs) with an
    8192^3 GEMM between them, as the step graph marks them."""
    group = (tuple(range(ranks)),)
    tasks = (Task(id=0, name="dispatch", kind="all-to-all", bytes=256 << 20, groups=group, kernel="ragged-all-to-all"),
             Task(id=1, name="experts", kind="compute", flops=2 * 8192**3, bytes=3 * 8192**2 * 2,
                  opcode="fusion", gemm=(1, 8192, 8192, 8192), deps=(0,)),
             Task(id=2, name="combine", kind="all-to-all", bytes=256 << 20, groups=group, kernel="ragged-all-to-all",
                  deps=(1,)))
    return StepGraph("moe", tasks, num_devices=ranks)


def test_the_ragged_exchange_through_nccl_is_a_setting_where_the_one_shot_kernel_is_measured():
    b200, h100 = hardware.get("b200-sxm-8"), hardware.get("h100-sxm-8")
    setting = [s for s in nccl_settings.candidates(b200) if not s.env.ragged_one_shot]
    assert [f.name for f in setting[0].flags] == [nccl_settings.RAGGED_ONE_SHOT]
    assert not any(f.value for f in setting[0].flags)
    # No one-shot rate measured on Hopper: its exchange is priced as NCCL's, nothing to offer.
    assert all(s.env.ragged_one_shot for s in nccl_settings.candidates(h100))
    # One-shot calls move one 128-thread CTA's worth a peer: NCCL's sends are far faster, and taken.
    step = _exchanges_beside_gemms()
    planned = planning.plan(step, b200, strategy="lagom", baselines=())
    assert all(c.params.algorithm == "one_shot" and c.kind == "ragged-all-to-all" for c in planned.plan.collectives)
    assert planned.plan.nccl_tuner_rules() == ()  # no NCCL call to tune
    out = nccl_settings.choose(step, planned, b200, strategy="lagom")
    assert out.setting is setting[0] or out.setting == setting[0]
    assert ("xla_gpu_unsupported_use_ragged_all_to_all_one_shot_kernel", False) in [
        (f.name, f.value) for f in out.planned.plan.flags]
    assert out.planned.plan.makespan_us < planned.plan.makespan_us / 10
    # NCCL's grouped sends: NCCL's own choice only (no tuner is asked about point-to-point).
    assert all(c.params == c.default_params for c in out.planned.plan.collectives if c.kind != "compute")


def test_settings_that_price_the_step_alike_are_searched_once(monkeypatch):
    # All-reduces inside one node: symmetric buffers alone and with the zero-CTA policy (which only moves
    # all-gathers and all-to-alls to the copy engines) give the search the same candidates: one search,
    # the same step for both, and the first of them kept where it is taken.
    h100 = hardware.get("h100-sxm-8")
    group = (tuple(range(8)),)
    tasks, prev = [], ()
    for i in range(3):
        ar = Task(id=len(tasks), name=f"ar{i}", kind="all-reduce", bytes=64 << 20, groups=group, is_async=True,
                  deps=prev)
        gemm = Task(id=len(tasks) + 1, name=f"gemm{i}", kind="compute", flops=2 * 8192**3, bytes=3 * 8192**2 * 2,
                    opcode="fusion", gemm=(1, 8192, 8192, 8192), deps=prev)
        tasks += [ar, gemm]
        prev = (ar.id, gemm.id)
    step = StepGraph("gemm+ar", tuple(tasks), num_devices=8)
    planned = planning.plan(step, h100, strategy="lagom", baselines=())
    searches = []
    real = planning.plan
    monkeypatch.setattr(planning, "plan", lambda *a, **kw: searches.append(a[1].nccl_env) or real(*a, **kw))
    out = nccl_settings.choose(step, planned, h100, strategy="lagom")
    why = dict(out.decisions)
    symmetric, zero = why["symmetric kernels (XLA's symmetric buffers)"], why[
        "zero-CTA collectives (NCCL_CTA_POLICY=2, symmetric buffers)"]
    assert symmetric.split(";")[0] == zero.split(";")[0]  # the same predicted step
    assert sum(env.symmetric_buffers for env in searches) == 1

"""HardwareProfile presets, JSON round trip and name resolution."""

from __future__ import annotations

import dataclasses

import pytest

from lagom_jax.cluster import hardware


NEW_PRESETS = ("h200-sxm-8", "b200-sxm-8", "dgx-h100", "a3", "a3-mega", "a3-ultra", "a4")


@pytest.mark.parametrize("name", ["a100-sxm-8", "h100-sxm-8", "a40-pcie-8", "v100-25g", "nd-a100-v4", *NEW_PRESETS])
def test_presets_exist_and_scale_with_nodes(name):
    hw = hardware.get(name, nodes=4)
    assert hw.name == name and hw.nodes == 4
    assert hw.num_gpus == 4 * hw.gpus_per_node
    assert hw.achieved_tflops <= hw.peak_tflops
    assert hw.achieved_hbm_gbps <= hw.hbm_gbps


def test_datasheet_numbers():
    # NVIDIA datasheets and architecture whitepapers (A100, H100, A40).
    assert hardware.get("a100-sxm-8").sm_count == 108
    assert hardware.get("h100-sxm-8").sm_count == 132
    assert hardware.get("a40-pcie-8").intra_link == "pcie"
    # One 25 Gb/s NIC per node is 3.125 GB/s of line rate; the ring gets a bit less.
    assert 2.5 < hardware.get("v100-25g").net_busbw_gbps < 3.125


def test_unknown_name_lists_known():
    with pytest.raises(ValueError, match="known: a100-sxm-8, h100-sxm-8, a40-pcie-8, v100-25g, h200-sxm-8, "
                                         "b200-sxm-8, dgx-h100, a3, a3-mega, a3-ultra, a4, p5, gb200-nvl72, nd-a100-v4\\)"):
        hardware.get("h10")
    with pytest.raises(ValueError, match="h100-sxm-8") as err:
        hardware.resolve("h10")
    assert all(name in str(err.value) for name in NEW_PRESETS)
    with pytest.raises(ValueError, match="a3-ultra"):
        hardware.resolve("a3-ultra-8g:nodes=2")


def test_json_round_trip(tmp_path):
    hw = hardware.get("h100-sxm-8", nodes=2)
    path = tmp_path / "hw.json"
    hw.save(path)
    assert hardware.HardwareProfile.load(path) == hw
    assert hardware.resolve(str(path)) == hw
    assert hardware.resolve(str(path), nodes=3).nodes == 3


def test_json_rejects_unknown_fields(tmp_path):
    d = hardware.get("a100-sxm-8").to_dict() | {"tflops": 1.0}
    with pytest.raises(ValueError, match="unknown \\['tflops'\\]"):
        hardware.HardwareProfile.from_dict(d)


def test_resolve_forms():
    assert hardware.resolve("a100-sxm-8") == hardware.get("a100-sxm-8")
    assert hardware.resolve("a100-sxm-8:nodes=4").nodes == 4
    assert hardware.resolve("a100-sxm-8:nodes=4", nodes=2).nodes == 2
    with pytest.raises(ValueError, match="nodes=4"):
        hardware.resolve("a100-sxm-8:gpus=4")


def test_validation_names_field():
    with pytest.raises(ValueError, match="sm_count"):
        dataclasses.replace(hardware.get("a100-sxm-8"), sm_count=0)
    with pytest.raises(ValueError, match="nodes must be >= 1"):
        hardware.get("a100-sxm-8", nodes=0)


def test_profiles_without_the_contention_share_still_load(tmp_path):
    import json

    d = hardware.get("a100-sxm-8").to_dict()
    del d["sm_share_per_channel"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(d))
    assert hardware.HardwareProfile.load(path) == hardware.get("a100-sxm-8")
    d["sm_share_per_channel"] = 1.5
    path.write_text(json.dumps(d))
    with pytest.raises(ValueError, match="sm_share_per_channel"):
        hardware.HardwareProfile.load(path)


def test_resolve_cluster_grows_to_the_job_unless_the_size_was_named(tmp_path):
    grown = hardware.resolve_cluster("a100-sxm-8", num_devices=32)
    assert grown.hardware.nodes == 4 and grown.note == "hardware: a100-sxm-8"
    assert hardware.resolve_cluster("a100-sxm-8", num_devices=8).hardware.nodes == 1
    assert hardware.resolve_cluster("a100-sxm-8:nodes=2", num_devices=32).hardware.nodes == 2
    assert hardware.resolve_cluster("a100-sxm-8", nodes=3, num_devices=32).hardware.nodes == 3
    profile = hardware.get("h100-sxm-8")
    assert hardware.resolve_cluster(profile, num_devices=64).hardware == profile
    path = tmp_path / "hw.json"
    profile.save(path)
    assert hardware.resolve_cluster(str(path), num_devices=16).hardware.nodes == 2
    with pytest.raises(ValueError, match="nodes must be positive"):
        hardware.resolve_cluster("a100-sxm-8", nodes=0)


def test_resolve_cluster_auto_names_what_it_chose():
    import types

    gpus = [types.SimpleNamespace(platform="gpu", device_kind="NVIDIA A100-SXM4-80GB")] * 12
    resolved = hardware.resolve_cluster("auto", devices=gpus)
    assert resolved.hardware.name == "a100-sxm-8" and resolved.hardware.nodes == 2
    assert resolved.note.endswith("2 node(s)") and "A100" in resolved.note


# --- The presets for Llama/Mixtral-class jobs: H200, B200, DGX H100 and Google Cloud ------


@pytest.mark.parametrize("name", NEW_PRESETS)
def test_new_presets_resolve_by_name_and_node_count(name):
    hw = hardware.resolve(name)
    assert hw == hardware.get(name) and hw.name == name and hw.nodes == 1 and hw.gpus_per_node == 8
    assert hardware.resolve(f"{name}:nodes=3").nodes == 3
    assert hardware.resolve(f"{name}:nodes=3", nodes=2).nodes == 2
    with pytest.raises(ValueError, match=f"'{name}:nodes=4'"):
        hardware.resolve(f"{name}:gpus=4")
    grown = hardware.resolve_cluster(name, num_devices=64)
    assert grown.hardware.nodes == 8 and grown.note == f"hardware: {name}"
    assert hardware.resolve_cluster(f"{name}:nodes=2", num_devices=64).hardware.nodes == 2


@pytest.mark.parametrize("name", NEW_PRESETS)
def test_new_presets_numbers_are_positive_and_consistent(name):
    hw = hardware.get(name)
    for field in ("sm_count", "peak_tflops", "achieved_tflops", "hbm_gbps", "achieved_hbm_gbps",
                  "intra_busbw_gbps", "intra_channel_gbps", "net_busbw_gbps", "net_channel_gbps",
                  "nccl_channels"):
        assert getattr(hw, field) > 0, field
    assert hw.intra_link == "nvlink" and hw.ll128_enabled and hw.xla_target
    assert hw.nccl_channels < hw.sm_count
    # NCCL's default channel count saturates NVLink: channels x per-CTA rate is the link's
    # busBw within 3% (24 x 15 = 360 of 367.6-370 on Hopper, 32 x 22.5 = 720 of 721.8 on B200).
    assert hw.nccl_channels * hw.intra_channel_gbps == pytest.approx(hw.intra_busbw_gbps, rel=0.03)
    # The network is slower than NVLink inside the node.
    assert hw.net_busbw_gbps < hw.intra_busbw_gbps
    assert hardware.HardwareProfile.from_dict(hw.to_dict()) == hw


def test_blackwell_and_hbm3e_parts_against_h100():
    h100, h200, b200 = (hardware.get(n) for n in ("h100-sxm-8", "h200-sxm-8", "b200-sxm-8"))
    # H200: the H100's chip (same SMs and tensor-core rate) with more and faster HBM.
    assert (h200.arch, h200.sm_count, h200.peak_tflops, h200.achieved_tflops) == (
        h100.arch, h100.sm_count, h100.peak_tflops, h100.achieved_tflops)
    assert h200.hbm_gbps > h100.hbm_gbps and h200.achieved_hbm_gbps > h100.achieved_hbm_gbps
    # B200 (NVIDIA datasheets, stas00/ml-engineering MAMF): more SMs, ~2.3x the BF16 rate,
    # 2.4x the HBM bandwidth, NVLink 5 at twice NVLink 4.
    assert b200.arch == "blackwell" and b200.sm_count == 148
    assert b200.peak_tflops > 2 * h100.peak_tflops and b200.achieved_tflops > 2 * h100.achieved_tflops
    assert b200.hbm_gbps > h200.hbm_gbps > h100.hbm_gbps
    assert b200.intra_busbw_gbps == pytest.approx(2 * h100.intra_busbw_gbps, rel=0.05)
    assert b200.nccl_channels == 32 and b200.intra_channel_gbps > h100.intra_channel_gbps
    # Measured on 4 nodes of 8x 400 Gb/s (50 GB/s per GPU, 400 GB/s per node): busBw below line rate.
    for hw in (h100, h200, b200):
        assert 300 < hw.net_busbw_gbps < 400


def test_gpu_memory_of_every_preset_for_advise():
    from lagom_jax.advise import configtuner as advise

    assert set(hardware.PRESETS) <= set(advise.GPU_MEMORY_GB)
    mem = advise.GPU_MEMORY_GB
    assert mem["b200-sxm-8"] > mem["h200-sxm-8"] > mem["h100-sxm-8"]
    assert mem["h200-sxm-8"] == 141.0 and mem["b200-sxm-8"] == 180.0
    for alias, base in (("dgx-h100", "h100-sxm-8"), ("a3", "h100-sxm-8"), ("a3-mega", "h100-sxm-8"),
                        ("a3-ultra", "h200-sxm-8"), ("a4", "b200-sxm-8"), ("p5", "h100-sxm-8")):
        assert mem[alias] == mem[base]


def test_dgx_h100_is_h100_sxm_8_under_its_own_name():
    dgx, h100 = hardware.get("dgx-h100"), hardware.get("h100-sxm-8")
    assert dgx.name == "dgx-h100" and dgx != h100
    assert dataclasses.replace(dgx, name="h100-sxm-8") == h100


@pytest.mark.parametrize("cloud, base, nominal_gbps", [
    ("a3", "h100-sxm-8", 4 * 200 / 8),  # a3-highgpu-8g: 4 x 200 Gb/s GPUDirect-TCPX
    ("a3-mega", "h100-sxm-8", 8 * 200 / 8),  # a3-megagpu-8g: 8 x 200 Gb/s GPUDirect-TCPXO
    ("a3-ultra", "h200-sxm-8", 8 * 400 / 8),  # a3-ultragpu-8g: 8 x 400 Gb/s RoCE (ConnectX-7)
    ("a4", "b200-sxm-8", 8 * 400 / 8),  # a4-highgpu-8g: 8 x 400 Gb/s RoCE (ConnectX-7)
    ("p5", "h100-sxm-8", 32 * 100 / 8),  # p5.48xlarge: 32 x 100 Gb/s EFA
])
def test_cloud_nodes_are_their_gpus_with_the_clouds_network(cloud, base, nominal_gbps):
    hw, node = hardware.get(cloud), hardware.get(base)
    # Inside the node: the HGX box's GPU, NVSwitch and NCCL defaults, and its XLA target.
    inside = ("gpu", "arch", "sm_count", "peak_tflops", "achieved_tflops", "hbm_gbps", "intra_busbw_gbps",
              "intra_channel_gbps", "nccl_channels", "xla_target")
    assert all(getattr(hw, f) == getattr(node, f) for f in inside)
    # Between nodes: below the GPU NICs' line rate, above 80% of it.
    assert 0.8 * nominal_gbps < hw.net_busbw_gbps < nominal_gbps


def test_cloud_networks_rank_as_their_nics():
    a3, mega, ultra, a4 = (hardware.get(n).net_busbw_gbps for n in ("a3", "a3-mega", "a3-ultra", "a4"))
    assert a3 < mega < ultra <= a4


def test_a_net_plugins_latency_is_paid_on_every_network_hop():
    """p5's EFA: aws-ofi-nccl reports 75 us to NCCL, which adds it to each inter-node hop of its
    latency composition (twice for Simple: the hop and its flush); the same H100 node on
    InfiniBand (NCCL's own transport) adds nothing."""
    from lagom_jax.cluster.nccl_env import NcclEnv
    from lagom_jax.costs import cost

    ring = NcclEnv(algorithms=("ring",), protocols=("Simple",))
    for nodes in (2, 4, 8):
        p5, ib = (dataclasses.replace(hardware.get(n, nodes=nodes), nccl_env=ring) for n in ("p5", "h100-sxm-8"))
        hops = 2 * (nodes - 1)  # a ring all-reduce crosses the network 2(nodes - 1) times
        extra = cost.default_time_us("all-reduce", 64, 8 * nodes, nodes, p5) - cost.default_time_us(
            "all-reduce", 64, 8 * nodes, nodes, ib)
        # 64 bytes: below NCCL's Simple x1.4; Simple pays the device's latency twice a hop (the flush).
        assert extra == pytest.approx(2 * 75.0 * hops, rel=0.05)
    assert hardware.get("p5").net_latency_us == 75.0 and hardware.get("h100-sxm-8").net_latency_us == 0.0


def test_tcpx_pays_its_measured_network_latency():
    """A3 High's GPUDirect-TCPX, from the 2-node all-reduce sweep the preset cites: 1.65-1.79 ms
    from 1 to 4 MiB (RDMA fabrics: ~0.1 ms) and 89.5 GB/s of bus bandwidth at 8 GiB."""
    from lagom_jax.costs import cost

    a3, ib = hardware.get("a3", nodes=2), hardware.get("h100-sxm-8", nodes=2)
    for mib, measured_us in ((1, 1788.7), (4, 1701.3)):
        assert cost.default_time_us("all-reduce", mib << 20, 16, 2, a3) == pytest.approx(measured_us, rel=0.1)
        assert cost.default_time_us("all-reduce", mib << 20, 16, 2, ib) < 0.3 * measured_us
    big = cost.default_time_us("all-reduce", 8 << 30, 16, 2, a3)
    assert (8 << 30) * 2 * 15 / 16 / (big * 1e3) == pytest.approx(89.54, rel=0.03)
    # The latency is the network's: one node of the same GPUs is untouched.
    one = hardware.get("a3")
    assert cost.default_time_us("all-gather", 1 << 20, 8, 1, one) == cost.default_time_us(
        "all-gather", 1 << 20, 8, 1, dataclasses.replace(one, net_latency_us=0.0))


def test_gpu_kinds_map_to_their_own_presets():
    assert hardware.preset_for_device("NVIDIA H200") == "h200-sxm-8"
    assert hardware.preset_for_device("NVIDIA H200 141GB HBM3e") == "h200-sxm-8"
    assert hardware.preset_for_device("NVIDIA B200") == "b200-sxm-8"
    assert hardware.preset_for_device("NVIDIA H100 80GB HBM3") == "h100-sxm-8"
    assert hardware.preset_for_device("NVIDIA H800") == "h100-sxm-8"
    assert dict(hardware.GPU_PRESETS)["H200"] == "h200-sxm-8"
    assert dict(hardware.GPU_PRESETS)["B200"] == "b200-sxm-8"
    assert all(preset in hardware.PRESETS for _, preset in hardware.GPU_PRESETS)


def test_resolve_cluster_auto_picks_b200_for_b200_devices():
    import types

    gpus = [types.SimpleNamespace(platform="gpu", device_kind="NVIDIA B200")] * 16
    resolved = hardware.resolve_cluster("auto", devices=gpus)
    assert resolved.hardware.name == "b200-sxm-8" and resolved.hardware.nodes == 2
    assert "B200 -> preset b200-sxm-8" in resolved.note


def test_blackwell_is_a_known_arch_and_schedules_like_hopper():
    assert hardware.ARCHS == ("volta", "ampere", "hopper", "blackwell")
    schedules = {name: hw.xla_schedules_by_default for name, hw in hardware.PRESETS.items()}
    assert schedules == {name: hw.arch in ("hopper", "blackwell") for name, hw in hardware.PRESETS.items()}
    assert schedules["b200-sxm-8"] and schedules["a4"] and not schedules["a100-sxm-8"]
    with pytest.raises(ValueError, match="known: volta, ampere, hopper, blackwell"):
        dataclasses.replace(hardware.get("b200-sxm-8"), arch="rubin")


def test_blackwell_profile_round_trips_through_json(tmp_path):
    hw = hardware.get("b200-sxm-8", nodes=2)
    path = tmp_path / "b200.json"
    hw.save(path)
    assert hardware.resolve(str(path)) == hw and hardware.resolve(str(path)).arch == "blackwell"


# --- Deviceless compiles for the XLA descriptions added with these presets ----------------


@pytest.fixture
def deviceless():
    from lagom_jax.program import gpu_compile

    reason = gpu_compile.unavailable_reason()
    if reason is not None:
        pytest.skip(f"no deviceless GPU compile here: {reason}")
    return gpu_compile


def _compile_tiny(gpu_compile, preset):
    import xla_forms
    from lagom_jax import models
    from lagom_jax.program import graph

    hw = hardware.get(preset)
    devices = gpu_compile.devices(hw)
    assert len(devices) == 8 and {d.platform for d in devices} == {"gpu"}
    # The abstract GPUs are XLA's description of the preset's GPU, and "auto" maps them back.
    assert hardware.preset_for_device(devices[0].device_kind) == preset
    built = models.build("gpt2", "tiny", "dp+tp", "data=2,model=4", devices=devices, dtype="bfloat16")
    text = built.compiled_text()
    assert text.startswith("HloModule") and "is_scheduled=true" in text
    xla_forms.assert_async_collectives(graph.from_hlo_text(text))
    return built, text


def test_deviceless_compile_for_h200(deviceless):
    text, dropped = deviceless.target_config("h200")
    assert "NVIDIA H200 141GB HBM3e" in text and "device_memory_size: 151397597184" in text
    assert all(f not in text for f in dropped)
    _compile_tiny(deviceless, "h200-sxm-8")


def test_deviceless_compile_for_b200_runs_the_latency_hiding_scheduler_unasked(deviceless):
    # sm_100a: the installed ptxas (nvidia-cuda-nvcc-cu12) has to know Blackwell, else this fails.
    from lagom_jax.plan import verify

    text, _ = deviceless.target_config("b200")
    assert 'platform_version: "Compute Capability 10.0a"' in text and "core_count: 148" in text
    built, module = _compile_tiny(deviceless, "b200-sxm-8")
    # XLA schedules Blackwell by default (the speed-of-light estimator supports it), so
    # turning that estimator off changes the module, as on Hopper (xla_schedules_by_default).
    without = built.compiled_text({"xla_gpu_enable_analytical_sol_latency_estimator": False})
    assert not verify._same_module(module, without)


def test_azure_a100_preset_carries_its_measured_network_and_the_model_scales_it_over_nodes():
    """nd-a100-v4's network rate is read from Echo's 2-VM log at 16 GiB; at 16 VMs (128 GPUs,
    4 GiB: 69,831 us measured, NetX-lab/Echo nccl-test-log/nccl_128.log) the model must carry
    it, where the DGX A100 rate of a100-sxm-8 is a third too fast."""
    from lagom_jax.costs import cost

    def predicted(name):
        return cost.default_time_us("all-reduce", 4 << 30, 128, 16, hardware.get(name, nodes=16))

    assert abs(predicted("nd-a100-v4") / 69_831 - 1) < 0.05
    assert predicted("a100-sxm-8") / 69_831 - 1 < -0.25
    azure, dgx = hardware.get("nd-a100-v4"), hardware.get("a100-sxm-8")
    assert azure.xla_target == "a100_sxm_40" and azure.net_busbw_gbps < dgx.net_busbw_gbps
    assert (azure.sm_count, azure.intra_busbw_gbps) == (dgx.sm_count, dgx.intra_busbw_gbps)


@pytest.mark.parametrize("name", sorted(hardware.PRESETS))
def test_channels_across_nodes_follow_the_nics_and_carry_the_network(name):
    hw = hardware.get(name)
    assert hw.channels(1) == hw.nccl_channels
    across = hw.channels(2)
    assert 1 <= across <= hw.sm_count
    # Enough CTAs at one CTA's share to carry the node's network (NCCL's ring across nodes
    # saturates its NICs).
    assert across * hw.net_channel_gbps >= hw.net_busbw_gbps * 0.99


def test_eight_nic_nodes_run_16_ctas_across_nodes_and_one_nic_nodes_2():
    # 8 NICs: 8 search channels, 2 CTAs each (NVIDIA/nccl #1453 "Channel 00/16"; #689).
    for name in ("a100-sxm-8", "h100-sxm-8", "dgx-h100", "h200-sxm-8", "b200-sxm-8", "p5", "a3-mega",
                 "a3-ultra", "a4", "nd-a100-v4"):
        assert hardware.get(name).channels(4) == 16, name
    assert hardware.get("v100-25g").channels(2) == 2  # one NIC per node
    assert hardware.get("a3").channels(2) == 12  # as the measured TCPX sweep ran
    with pytest.raises(ValueError, match="net_nccl_channels must be in 0..sm_count 132"):
        dataclasses.replace(hardware.get("h100-sxm-8"), net_nccl_channels=200)


def test_a_rack_run_with_fewer_gpus_than_it_holds_is_expressible():
    """A GB200 NVL72 rack is usually run with 64 of its 72 GPUs: 4 racks of 64 hold 256."""
    from lagom_jax.advise import predict

    got = hardware.resolve_cluster("gb200-nvl72:gpus_per_node=64", num_devices=256)
    assert (got.hardware.nodes, got.hardware.gpus_per_node) == (4, 64)
    assert got.note == "hardware: gb200-nvl72 (64 GPUs a node)"
    pinned = hardware.resolve_cluster("gb200-nvl72:gpus_per_node=64,nodes=8", num_devices=256).hardware
    assert (pinned.nodes, pinned.gpus_per_node) == (8, 64)
    assert predict._cluster("gb200-nvl72:gpus_per_node=64", 256).nodes == 4
    with pytest.raises(ValueError, match="gb200-nvl72:gpus_per_node=G"):
        predict._cluster("gb200-nvl72", 256)
    with pytest.raises(ValueError, match="more than the 72 GPUs a node of gb200-nvl72 has"):
        hardware.resolve("gb200-nvl72:gpus_per_node=80")
    with pytest.raises(ValueError, match="bad hardware option 'nodes=0'"):
        hardware.resolve("h100-sxm-8:nodes=0")

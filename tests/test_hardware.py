"""HardwareProfile presets, JSON round trip and name resolution."""

from __future__ import annotations

import dataclasses

import pytest

from lagom_jax import hardware


@pytest.mark.parametrize("name", ["a100-sxm-8", "h100-sxm-8", "a40-pcie-8", "v100-25g"])
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
    with pytest.raises(ValueError, match="known: a100-sxm-8, h100-sxm-8, a40-pcie-8, v100-25g"):
        hardware.get("h10")
    with pytest.raises(ValueError, match="h100-sxm-8"):
        hardware.resolve("h10")


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

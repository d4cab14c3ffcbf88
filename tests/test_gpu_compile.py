"""Deviceless XLA:GPU compiles: abstract GPUs of a preset, the CLI's cluster checks, verification."""

import dataclasses

import pytest
import xla_forms

from lagom_jax import cli, models
from lagom_jax.cluster import hardware
from lagom_jax.plan import planning, verify
from lagom_jax.program import gpu_compile, graph
from lagom_jax.program.flags import XlaFlag

pytestmark = pytest.mark.skipif(gpu_compile.unavailable_reason() is not None,
                                reason=f"no deviceless GPU compile here: {gpu_compile.unavailable_reason()}")


@pytest.mark.parametrize("preset", sorted(hardware.PRESETS))
def test_every_preset_loads_its_xla_description(preset):
    hw = hardware.get(preset)
    text, dropped = gpu_compile.target_config(hw.xla_target)
    assert "gpu_device_info" in text and all(f not in text for f in dropped)
    devices = gpu_compile.devices(hw)
    assert len(devices) == hw.gpus_per_node and {d.platform for d in devices} == {"gpu"}


def test_two_nodes_are_two_hosts():
    devices = gpu_compile.devices(hardware.get("h100-sxm-8", nodes=2))
    assert len(devices) == 16
    assert sorted({d.process_index for d in devices}) == [0, 1]


@pytest.mark.parametrize("n, nodes, want", [(8, 1, "1x1x8"), (4, 1, "1x1x4"), (16, 2, "1x2x8")])
def test_topology_string(n, nodes, want):
    assert gpu_compile.topology_string(hardware.get("a100-sxm-8", nodes=nodes), n) == want


@pytest.mark.parametrize("n, nodes, message", [(12, 2, "use a multiple of 8"), (16, 4, "use 2 nodes"),
                                               (4, 2, "fit in one node")])
def test_topology_refuses_a_mismatch(n, nodes, message):
    with pytest.raises(ValueError, match=message):
        gpu_compile.topology_string(hardware.get("a100-sxm-8", nodes=nodes), n)


@pytest.mark.slow
def test_gpu_module_has_async_collectives_and_gpu_fusions():
    hw = hardware.get("h100-sxm-8")
    built = models.build("gpt2", "tiny", "dp", "data=8", devices=gpu_compile.devices(hw), dtype="bfloat16")
    text = built.compiled_text()
    assert "is_scheduled=true" in text
    step = graph.from_hlo_text(text)
    xla_forms.assert_async_collectives(step)
    # The combine threshold really reaches the GPU combiner: at 0 nothing is combined.
    uncombined = graph.from_hlo_text(built.compiled_text(
        {"xla_gpu_all_reduce_combine_threshold_bytes": 0}))
    assert len(uncombined.collectives) > len(step.collectives)


@pytest.mark.slow
def test_verify_drops_an_option_that_changes_nothing_and_keeps_one_that_does():
    hw = hardware.get("h100-sxm-8")
    built = models.build("gpt2", "tiny", "dp", "data=8", devices=gpu_compile.devices(hw), dtype="bfloat16")
    text = built.compiled_text()
    step = graph.from_hlo_text(text)
    plan = dataclasses.replace(
        planning.make_plan(step, hw, strategy="xla-default"),
        # A data-parallel step has no collective-permute for its threshold to combine.
        flags=(XlaFlag("xla_gpu_all_reduce_combine_threshold_bytes", 0),
               XlaFlag("xla_gpu_collective_permute_combine_threshold_bytes", 1 << 20)))
    tuned, result = verify.verify_plan(plan, step, text, built.compiled_text)
    assert dict(result.option_changed) == {"xla_gpu_all_reduce_combine_threshold_bytes": True,
                                           "xla_gpu_collective_permute_combine_threshold_bytes": False}
    assert [f.name for f in tuned.flags] == ["xla_gpu_all_reduce_combine_threshold_bytes"]
    assert "dropped from the plan" in tuned.report()
    assert result.compiled["all-reduce"][0] > result.predicted["all-reduce"][0]
    assert 0 < result.async_starts <= result.compiled["all-reduce"][0]
    assert result.async_starts == result.compiled["all-reduce"][0] or not xla_forms.EVERY_COLLECTIVE_ASYNC


@pytest.mark.parametrize("preset, latency_hiding", [("h100-sxm-8", False), ("a40-pcie-8", True)])
@pytest.mark.slow
def test_the_plan_flag_for_the_latency_hiding_scheduler_changes_the_gpu_module(preset, latency_hiding):
    # Hopper schedules by default (the speed-of-light estimator turns the LHS on): turning
    # the estimator off turns it off. Older GPUs need the scheduler flag to turn it on.
    hw = hardware.get(preset)
    assert hw.xla_schedules_by_default is not latency_hiding
    assert planning.lhs_flags(hw.xla_schedules_by_default, hw) == []
    (flag,) = planning.lhs_flags(latency_hiding, hw)
    built = models.build("gpt2", "tiny", "dp+tp", "data=2,model=4", devices=gpu_compile.devices(hw),
                         dtype="bfloat16")
    assert not verify._same_module(built.compiled_text(), built.compiled_text({flag.name: flag.value}))


@pytest.mark.slow
def test_cli_tunes_the_gpu_module_and_reports_verification(capsys):
    assert cli.main(["tune", "--no-structures", "--model", "gpt2", "--config", "tiny", "--mesh", "data=4,model=2",
                     "--hardware", "h100-sxm-8", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["compiled_by"].startswith("XLA:GPU deviceless compile for 8x H100")
    assert out["verification"] and out["verification"][0][0] == "collectives"


def test_cli_falls_back_to_the_cpu_module_with_a_warning(monkeypatch, capsys):
    def unavailable(*_a, **_k):
        raise gpu_compile.DevicelessUnavailable("the CUDA PJRT plugin is not installed")

    monkeypatch.setattr(gpu_compile, "devices", unavailable)
    assert cli.main(["tune", "--no-structures", "--model", "gpt2", "--config", "tiny", "--mesh", "data=2,model=4",
                     "--hardware", "h100-sxm-8", "--json"]) == 0
    captured = capsys.readouterr()
    assert "Falling back to XLA:CPU's module" in captured.err
    import json

    out = json.loads(captured.out)
    assert out["compiled_by"].startswith("XLA:CPU") and "not recompiled" in out["verification"][0][1]


@pytest.mark.parametrize("argv, message", [
    (["--mesh", "data=4,model=4", "--nodes", "1"], "a mesh of 16 GPUs needs 2 h100-sxm-8 nodes, but the cluster has 1"),
    (["--mesh", "data=3,model=4"], "a mesh of 12 GPUs is not a whole number of h100-sxm-8 nodes"),
    (["--mesh", "data=2,model=2", "--nodes", "2"],
     "a mesh of 4 GPUs needs part of one h100-sxm-8 node, but the cluster has 2 (16 GPUs): use --nodes 1"),
])
def test_cli_mesh_preset_and_nodes_must_agree(argv, message, capsys):
    assert cli.main(["tune", "--no-structures", "--model", "gpt2", "--config", "tiny", "--hardware", "h100-sxm-8", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("mesh, n, nodes", [("data=8,model=2", 16, 2), ("data=32,model=2", 64, 8)])
@pytest.mark.slow
def test_cli_nodes_from_the_mesh_size(mesh, n, nodes, capsys):
    assert cli.main(["tune", "--no-structures", "--model", "gpt2", "--config", "tiny", "--mesh", mesh,
                     "--batch-size", "64", "--hardware", "h100-sxm-8", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    assert out["compiled_by"].startswith(f"XLA:GPU deviceless compile for {n}x")
    # The data axis (outer) spans every host: its gradient all-reduces cross all nodes.
    assert max(c["nodes"] for c in out["collectives"]) == nodes

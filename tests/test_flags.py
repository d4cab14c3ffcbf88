"""Flags are typed values, rendered at the edge, and validated by the installed XLA."""

import pytest

from lagom_jax.program import flags


def test_render_and_options_are_sorted_and_typed():
    fl = [
        flags.XlaFlag("xla_gpu_enable_latency_hiding_scheduler", True),
        flags.XlaFlag("xla_gpu_all_reduce_combine_threshold_bytes", 1 << 30),
    ]
    assert flags.render_xla_flags(fl) == (
        "--xla_gpu_all_reduce_combine_threshold_bytes=1073741824 "
        "--xla_gpu_enable_latency_hiding_scheduler=true"
    )
    assert flags.compiler_options(fl) == {
        "xla_gpu_all_reduce_combine_threshold_bytes": 1 << 30,
        "xla_gpu_enable_latency_hiding_scheduler": True,
    }


def test_process_level_flags_stay_out_of_compiler_options():
    fl = [flags.XlaFlag("xla_gpu_enable_nccl_comm_splitting", False)]
    assert flags.compiler_options(fl) == {}
    assert "comm_splitting=false" in flags.render_xla_flags(fl)


@pytest.mark.parametrize(
    "name, value",
    [("xla_gpu_not_a_flag", 1), ("xla_gpu_enable_latency_hiding_scheduler", 1),
     ("xla_gpu_all_reduce_combine_threshold_bytes", True)],
)
def test_unknown_or_mistyped_flags_are_refused(name, value):
    with pytest.raises(flags.FlagError, match=name):
        flags.XlaFlag(name, value)


def test_every_known_flag_is_accepted_by_installed_xla_at_its_default():
    fl = [flags.XlaFlag(s.name, s.default) for s in flags.KNOWN_FLAGS.values()]
    flags.validate(flags.render_xla_flags(fl), flags.compiler_options(fl))


@pytest.mark.parametrize(
    "xla_flags, options, culprit",
    [
        ("--xla_gpu_bogus_flag_xyz=1", None, "xla_gpu_bogus_flag_xyz"),
        ("--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_pgle_accuracy_checker=WARN",
         None, "xla_gpu_pgle_accuracy_checker=WARN"),
        ("", {"xla_gpu_bogus_option": 1}, "xla_gpu_bogus_option"),
    ],
)
def test_rejections_name_the_flag(xla_flags, options, culprit):
    with pytest.raises(flags.FlagError, match=culprit):
        flags.validate(xla_flags, options)


def test_a_step_is_planned_at_the_stream_priority_its_compile_gives_collectives(monkeypatch):
    from lagom_jax import job
    from lagom_jax.cluster import hardware
    from lagom_jax.program.flags import bool_setting

    name = "xla_gpu_enable_highest_priority_async_stream"
    monkeypatch.setenv("XLA_FLAGS", f"--xla_gpu_enable_latency_hiding_scheduler=true --{name}=false")
    assert bool_setting(name) is False
    assert bool_setting(name, {name: True}) is True  # a compile option wins over XLA_FLAGS
    hw = hardware.get("h100-sxm-8")
    assert hw.comm_high_priority  # XLA's default
    assert job._as_compiled_for(hw, {}).comm_high_priority is False
    monkeypatch.setenv("XLA_FLAGS", f"--{name}=true --{name}=false --{name}")  # the last one counts
    assert job._as_compiled_for(hw, {}).comm_high_priority is True
    monkeypatch.delenv("XLA_FLAGS")
    assert bool_setting(name) is None and job._as_compiled_for(hw, {}) is hw

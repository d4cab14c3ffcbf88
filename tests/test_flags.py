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


def test_every_known_flag_is_in_the_installed_table_or_renamed_to_one_that_is():
    table = flags.installed_table()
    assert set(table) == set(flags.KNOWN_FLAGS)
    for spec in flags.KNOWN_FLAGS.values():
        if table[spec.name] is not None:  # renamed: the other spelling is the installed one
            assert "No such compile option" in table[spec.name], (spec.name, table[spec.name])
            assert flags.for_installed(flags.XlaFlag(spec.name, spec.default)) is not None, spec.name
    fl = [flags.XlaFlag(s.name, s.default) for s in flags.KNOWN_FLAGS.values() if table[s.name] is None]
    flags.validate(flags.render_xla_flags(fl), flags.compiler_options(fl))


def test_a_pipelining_mode_renders_as_each_edge_reads_it():
    on = flags.XlaFlag("xla_gpu_pipeline_reduce_scatter", "on")
    assert on.render() == "--xla_gpu_pipeline_reduce_scatter=on"  # XLA's flag parser takes the word
    assert flags.compiler_options([on]) == {"xla_gpu_pipeline_reduce_scatter": "COLLECTIVE_PIPELINING_MODE_ON"}
    with pytest.raises(flags.FlagError, match="one of default, off, on, explicit"):
        flags.XlaFlag("xla_gpu_pipeline_reduce_scatter", "true")


@pytest.mark.parametrize("installed", ["old", "new"])
def test_renamed_flags_are_spelled_for_the_installed_xla(monkeypatch, installed):
    old, new = "xla_gpu_enable_pipelined_reduce_scatter", "xla_gpu_pipeline_reduce_scatter"
    gone = new if installed == "old" else old
    table = {name: None for name in flags.KNOWN_FLAGS}
    table[gone] = f"INVALID_ARGUMENT: No such compile option: '{gone}'"
    monkeypatch.setattr(flags, "installed_table", lambda: table)
    if installed == "new":  # jaxlib 0.11 on: the booleans map onto the modes
        assert flags.for_installed(flags.XlaFlag(old, False)) == flags.XlaFlag(new, "off")
        assert flags.installed_options({old: True}) == {new: "COLLECTIVE_PIPELINING_MODE_ON"}
    else:  # before 0.11: the modes map back; "explicit" has no boolean
        assert flags.for_installed(flags.XlaFlag(new, "on")) == flags.XlaFlag(old, True)
        assert flags.for_installed(flags.XlaFlag(new, "default")) == flags.XlaFlag(old, True)
        assert flags.for_installed(flags.XlaFlag(new, "explicit")) is None
        with pytest.raises(flags.FlagError, match=f"has no flag {new}"):
            flags.installed_options({new: "explicit"})


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


def test_what_the_installed_xla_accepted_is_checked_once_and_a_rejection_every_time(monkeypatch, tmp_path):
    import subprocess

    monkeypatch.setenv("LAGOM_JAX_CACHE", str(tmp_path))
    calls = []
    real_run = subprocess.run

    def counting_run(*args, **kwargs):
        calls.append(kwargs.get("env", {}).get("XLA_FLAGS"))
        return real_run(*args, **kwargs)

    monkeypatch.setattr(flags.subprocess, "run", counting_run)
    good, bad = "--xla_gpu_enable_latency_hiding_scheduler=true", "--xla_gpu_bogus_flag_xyz=1"
    for _ in range(2):
        flags._validate_cached.cache_clear()
        flags.validate(good)
        with pytest.raises(flags.FlagError, match="xla_gpu_bogus_flag_xyz"):
            flags.validate(bad)
    assert calls == [good, bad, bad]  # the accepted flags from disk the second time
    assert len(list((tmp_path / "flags").glob("*.ok"))) == 1
    # Another XLA (here: another jaxlib file identity) is asked again.
    monkeypatch.setattr(flags, "installed_xla_key", lambda: "another jaxlib")
    flags._validate_cached.cache_clear()
    flags.validate(good)
    assert calls[-1] == good and len(calls) == 4

"""Plans: JSON round trip, rendering, and a cache that never shows a torn file."""

import json
import multiprocessing as mp

import pytest

from lagom_jax.cluster.params import CollectiveParams
from lagom_jax.plan.cache import PlanCache
from lagom_jax.plan.schema import CollectiveChoice, Plan
from lagom_jax.program.flags import XlaFlag


def _plan(tag: str = "x", n: int = 3) -> Plan:
    choices = tuple(
        CollectiveChoice(
            name=f"all-reduce-start.{i}", kind="all-reduce", bytes=1 << (20 + i), group_size=8,
            nodes=1, params=CollectiveParams("ring", "Simple", 4 + i, 1 << 20, 256),
            default_params=CollectiveParams("ring", "LL128", 24, 2 << 20, 640),
            predicted_us=10.0 * (i + 1), exposed_us=float(i), why=f"{tag}: fewer channels win",
        )
        for i in range(n)
    )
    return Plan(
        module="jit_step", fingerprint="ab" * 16, hardware="h100-sxm-8", gpus_per_node=8,
        nodes=1, strategy="lagom", version="0.1.0", collectives=choices,
        flags=(XlaFlag("xla_gpu_enable_latency_hiding_scheduler", True),
               XlaFlag("xla_gpu_all_reduce_combine_threshold_bytes", 1 << 26)),
        predicted_us=(("lagom", 90.0), ("xla-default", 100.0)), bound_us=80.0,
        evaluations=42, search_seconds=0.01, costs=(("fusion.1", 12.5), ("all-reduce-start.0", 3.25)),
    )


def test_json_round_trip_is_exact():
    plan = _plan()
    assert Plan.from_json(plan.to_json()) == plan
    assert hash(Plan.from_json(plan.to_json())) == hash(plan)


def test_rendering():
    plan = _plan()
    assert plan.xla_flags() == (
        "--xla_gpu_all_reduce_combine_threshold_bytes=67108864 "
        "--xla_gpu_enable_latency_hiding_scheduler=true"
    )
    opts = plan.compiler_options(with_profile=True)
    assert opts["xla_gpu_enable_latency_hiding_scheduler"] is True
    assert opts["fdo_profile"] == (
        b'costs { name: "fusion.1" cost_us: 12.500 }\n'
        b'costs { name: "all-reduce-start.0" cost_us: 3.250 }\n'
    )
    assert "fdo_profile" not in plan.compiler_options()
    assert plan.speedup_over("xla-default") == pytest.approx(100 / 90)
    with pytest.raises(KeyError, match="autoccl"):
        plan.speedup_over("autoccl")


@pytest.mark.parametrize("text", ["", "{", "[]", json.dumps({"module": "m"})])
def test_bad_json_is_a_value_error(text):
    with pytest.raises(ValueError):
        Plan.from_json(text)


def test_cache_get_put_and_corrupt_file(tmp_path):
    cache = PlanCache(tmp_path)
    key = PlanCache.key("fp", "{}", "lagom", "0.1.0")
    assert key != PlanCache.key("fp", "{}", "autoccl", "0.1.0")
    assert cache.get(key) is None
    cache.put(key, _plan())
    assert cache.get(key) == _plan()
    cache.path(key).write_text('{"module": ')
    with pytest.raises(ValueError, match="corrupt plan cache file"):
        cache.get(key)


def _hammer(directory: str, worker: int, rounds: int, out: "mp.Queue") -> None:
    cache = PlanCache(directory)
    key = PlanCache.key("same", "{}", "lagom", "0.1.0")
    seen = 0
    for r in range(rounds):
        cache.put(key, _plan(f"w{worker}r{r}", n=20))
        plan = cache.get(key)  # raises on a torn file
        assert plan is not None and len(plan.collectives) == 20
        seen += 1
    out.put(seen)


def test_eight_processes_share_one_key_without_torn_files(tmp_path):
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_hammer, args=(str(tmp_path), i, 40, out)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)  # eight fresh processes importing JAX: slow on a loaded machine
    assert [p.exitcode for p in procs] == [0] * 8
    assert sum(out.get(timeout=5) for _ in procs) == 8 * 40
    assert not list(tmp_path.glob("*.tmp"))


def test_tuner_config_round_trips_through_the_plugin_parser():
    from lagom_jax.plan import nccl_tuner

    plan = _plan(n=3)
    rules, errors = nccl_tuner.parse_config(plan.nccl_tuner_config())
    assert not errors and len(rules) == 3
    for c in plan.collectives:
        rule = nccl_tuner.match_rule(rules, c.kind, c.bytes, c.group_size, c.nodes)
        assert (rule.algorithm, rule.protocol, rule.nchannels, rule.chunk_bytes) == (
            c.params.algorithm, c.params.protocol, c.params.nchannels, c.params.chunk_bytes)
    assert nccl_tuner.match_rule(rules, "all-gather", 1 << 20, 8, 1) is None


def test_nccl_env_includes_the_plugin_only_when_built(tmp_path):
    plan = _plan()
    env = plan.nccl_env(plugin_path=tmp_path / "missing.so")
    assert env == {"NCCL_NTHREADS": "256"}
    so = tmp_path / "libnccl-tuner-lagom.so"
    so.write_bytes(b"")
    env = plan.nccl_env(plugin_path=so, config_path=tmp_path / "plan.conf")
    assert env["NCCL_TUNER_PLUGIN"] == str(so.resolve())
    assert not (tmp_path / "plan.conf").exists()  # a Plan writes nothing
    assert plan.tuner_config_path(so) == tmp_path / "configs" / f"{plan.fingerprint[:16] or 'plan'}.conf"


def test_report_names_every_prediction_and_choice():
    text = _plan().report()
    assert "strategy lagom" in text and "1.111x over xla-default" in text
    assert "ring/LL128 24ch" in text and "ring/Simple 6ch" in text
    assert "fewer channels win" in text
    top5 = _plan(n=30).report(top=5)
    assert top5.count("  covers ") == 5 and "... 25 more rows" in top5


def test_report_has_one_row_per_tuner_key_with_the_instructions_it_covers():
    import dataclasses

    base = _plan(n=1).collectives[0]
    long_why = "ring/Simple nc=4: " + "because " * 40
    loop = tuple(dataclasses.replace(base, name="all-reduce.138", predicted_us=5.0 + i, exposed_us=1.0,
                                     why=long_why) for i in range(11))
    # another instruction with the same kind, bytes, ranks and nodes: the plugin cannot tell them apart
    twin = dataclasses.replace(base, name="all-reduce.140", predicted_us=2.0, exposed_us=0.0)
    combined = dataclasses.replace(base, name="combined(all-reduce.32+all-reduce.33+all-reduce.34)", bytes=1 << 25)
    plan = dataclasses.replace(_plan(n=1), collectives=loop + (twin, combined))
    text = plan.report()
    assert "13 collective calls after XLA's combiners, in 2 rows" in text
    rows = [line for line in text.splitlines() if line.startswith("all-reduce ")]
    assert len(rows) == 2
    key_row = next(r for r in rows if f"{sum(5.0 + i for i in range(11)) + 2.0:>9.1f}" in r)
    assert " 12  " in key_row and f"{11.0:>9.1f}" in key_row  # calls; exposed
    covers = [line for line in text.splitlines() if line.startswith("  covers")]
    assert "  covers all-reduce.138 x11, all-reduce.140" in covers
    assert "  covers combined 3: all-reduce.32+..." in covers
    assert max(len(line) for line in text.splitlines()) <= 120
    assert long_why.removeprefix("ring/Simple nc=4: ").rstrip() in plan.report(width=None)


_MODULE = """HloModule m
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
ENTRY %e (p0: f32[262144], p1: f32[262144]) -> (f32[262144], f32[262144]) {
  %p0 = f32[262144]{0} parameter(0)
  %p1 = f32[262144]{0} parameter(1)
BODY
}
"""
_GROUPS = "replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add"
_TWO_ALL_REDUCES = _MODULE.replace("BODY", f"""  %r0 = f32[262144]{{0}} all-reduce(%p0), {_GROUPS}
  %r1 = f32[262144]{{0}} all-reduce(%p1), {_GROUPS}
  ROOT %t = (f32[262144]{{0}}, f32[262144]{{0}}) tuple(%r0, %r1)""")
_COMBINED = _MODULE.replace("BODY", f"""  %r = (f32[262144]{{0}}, f32[262144]{{0}}) all-reduce(%p0, %p1), {_GROUPS}
  %g0 = f32[262144]{{0}} get-tuple-element(%r), index=0
  %g1 = f32[262144]{{0}} get-tuple-element(%r), index=1
  ROOT %t = (f32[262144]{{0}}, f32[262144]{{0}}) tuple(%g0, %g1)""")


@pytest.mark.parametrize("predicted_text, compiles", [(_COMBINED, 1), (_TWO_ALL_REDUCES, 3)])
def test_verification_leaves_options_out_only_where_the_recompile_is_not_the_predicted_module(
        predicted_text, compiles):
    import dataclasses

    from lagom_jax.cluster import hardware
    from lagom_jax.plan import planning, verify
    from lagom_jax.program import graph

    calls = []

    def compile_fn(options):
        calls.append(dict(options))
        # Only the all-reduce threshold combines; the other option changes nothing.
        return _COMBINED if "xla_gpu_all_reduce_combine_threshold_bytes" in options else _TWO_ALL_REDUCES

    base = graph.from_hlo_text(_TWO_ALL_REDUCES)
    plan = dataclasses.replace(
        planning.make_plan(base, hardware.get("h100-sxm-8"), strategy="xla-default"),
        flags=(XlaFlag("xla_gpu_all_reduce_combine_threshold_bytes", 1 << 30),
               XlaFlag("xla_gpu_collective_permute_combine_threshold_bytes", 1 << 20)))
    tuned, result = verify.verify_plan(plan, graph.from_hlo_text(predicted_text), _TWO_ALL_REDUCES, compile_fn)
    assert len(calls) == compiles == result.compiles
    changed = dict(result.option_changed)
    if compiles == 1:  # the recompile is the predicted module: both kept, unchecked one by one
        assert set(changed.values()) == {None} and len(tuned.flags) == 2
        assert "not left out one by one" in tuned.report()
    else:  # the prediction missed: each left out once, the one that changes nothing dropped
        assert changed == {"xla_gpu_all_reduce_combine_threshold_bytes": True,
                           "xla_gpu_collective_permute_combine_threshold_bytes": False}
        assert [f.name for f in tuned.flags] == ["xla_gpu_all_reduce_combine_threshold_bytes"]


def test_verification_keeps_a_runtime_option_no_recompile_can_show():
    """The NCCL channel cap changes how NCCL runs the step, never the module: it is not left
    out one by one nor dropped, and alone it costs no recompile."""
    import dataclasses

    from lagom_jax.cluster import hardware
    from lagom_jax.plan import planning, verify
    from lagom_jax.program import graph

    calls = []

    def compile_fn(options):
        calls.append(dict(options))
        return _COMBINED if "xla_gpu_all_reduce_combine_threshold_bytes" in options else _TWO_ALL_REDUCES

    base = graph.from_hlo_text(_TWO_ALL_REDUCES)
    made = planning.make_plan(base, hardware.get("h100-sxm-8"), strategy="xla-default")
    cap = XlaFlag("xla_gpu_nccl_collective_max_nchannels", 8)
    both = dataclasses.replace(made, flags=(XlaFlag("xla_gpu_all_reduce_combine_threshold_bytes", 1 << 30), cap))
    # The prediction missed (it kept two all-reduces); the threshold, the one option that acts
    # on the module, is judged by the one recompile, and the cap is not left out.
    tuned, result = verify.verify_plan(both, base, _TWO_ALL_REDUCES, compile_fn)
    assert dict(result.option_changed) == {"xla_gpu_all_reduce_combine_threshold_bytes": True}
    assert result.runtime == ("xla_gpu_nccl_collective_max_nchannels",) and len(calls) == 1
    assert cap in tuned.flags and "changes how NCCL runs the step" in tuned.report()
    calls.clear()
    alone, result = verify.verify_plan(dataclasses.replace(made, flags=(cap,)), base, _TWO_ALL_REDUCES, compile_fn)
    assert calls == [] and result.compiles == 0 and alone.flags == (cap,)

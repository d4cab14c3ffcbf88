"""Compile-in-the-loop structure search (lagom_jax.plan.structures) and its place in the pipeline."""

import dataclasses

import pytest

from lagom_jax import job
from lagom_jax.cluster import hardware
from lagom_jax.plan import planning, structures
from lagom_jax.program import flags, gpu_compile, graph

_REASON = gpu_compile.unavailable_reason()
needs_gpu_compile = pytest.mark.skipif(_REASON is not None, reason=f"no deviceless GPU compile here: {_REASON}")

HW = hardware.get("h100-sxm-8", 2)


def _compiled(layers=4, **kw):
    src = job.ModelSource("llama", f"layers={layers},d_model=256,heads=4,kv_heads=2,head_dim=64,d_ff=512,"
                          "vocab=1024,max_len=256", {"fsdp": 16}, None, 32, 256, **kw)
    return job.compile_source(src, HW)


def _candidate(name, value):
    return next(c for c in structures.CANDIDATES if (c.flag.name, c.flag.value) == (name, value))


def _planned(text):
    return planning.plan(graph.from_hlo_text(text), HW, strategy="lagom", baselines=("xla-default",))


@needs_gpu_compile
def test_a_candidate_that_changes_nothing_is_left():
    one_node = hardware.get("h100-sxm-8")
    base = job.compile_source(job.HloSource(open(_fixture()).read()), one_node)
    planned = planning.plan(graph.from_hlo_text(base.text), one_node, strategy="lagom", baselines=("xla-default",))
    # A "recompile" that returns the same module: nothing to take, and said so.
    everything = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all")
    cand = structures.Candidate(_candidate("xla_gpu_enable_all_gather_combine_by_dim", True).flag, everything,
                                needs_loop=False)
    same = structures.search(base.text, planned, one_node, lambda options: base.text, strategy="lagom",
                             baselines=("xla-default",), candidates=(cand,))
    assert same.flags == () and "same module" in same.decisions[0][1]


def _fixture():
    import pathlib

    return pathlib.Path(__file__).parent / "fixtures" / "hlo" / "unoptimized" / "jax_fsdp_mlp_8.after_spmd.hlo"


@needs_gpu_compile
@pytest.mark.slow
def test_taken_flags_reach_the_plan_and_its_verification():
    compiled = _compiled()
    fast = _compiled(layers=1)  # stands in for a restructured, faster module of the same step

    def recompile(options):
        return fast.text if options else compiled.text

    cand = structures.Candidate(_candidate("xla_gpu_pipeline_all_gather", "on").flag,
                                ("all-gather", "reduce-scatter", "all-reduce"))
    out = structures.search(compiled.text, _planned(compiled.text), HW, recompile, strategy="lagom",
                            baselines=("xla-default",), candidates=(cand,))
    assert out.flags == (flags.for_installed(cand.flag),) and out.decisions[0][1].startswith("taken: predicted step")
    assert out.planned.plan.makespan_us < _planned(compiled.text).plan.makespan_us
    # A trial is planned without the floor's note (a second search); the pipeline notes it
    # once, on the module kept, as a plan of that module alone says it.
    assert out.graph is not None and out.space is not None and out.planned.plan.held_back_us == 0
    noted = planning.note_floor(out.planned, out.graph, HW, out.space).plan
    alone = planning.plan(out.graph, HW, strategy="lagom", baselines=("xla-default",), space=out.space).plan
    assert noted.held_back_us == pytest.approx(alone.held_back_us) and noted.makespan_us == alone.makespan_us


@needs_gpu_compile
@pytest.mark.slow
def test_the_pipeline_runs_the_structure_search_for_sources_it_can_recompile():
    src = job.ModelSource("llama", "layers=3,d_model=128,heads=4,kv_heads=2,head_dim=32,d_ff=256,vocab=512,max_len=128",
                          {"fsdp": 16}, None, 16, 128)
    tuned = job.run(src, HW, structures=True, verify=True)
    decisions = dict(tuned.plan.decisions)
    # The recompile with every option of the plan makes the module the search predicted:
    # the same collectives, in the same places (the pipeliner's peeled ones included).
    checks = dict(tuned.plan.verification)
    assert checks["collectives"].startswith("as predicted") and checks["placement"].startswith("as predicted")
    pipelined = [f for f in tuned.plan.flags if "pipeline" in f.name]
    assert pipelined and not any(f.name.endswith("_combine_threshold_bytes") and k in f.name
                                 for f in tuned.plan.flags for k in ("all_gather",))
    for cand in structures.CANDIDATES:  # every candidate that is not XLA's default has a decision with its reason
        flag = flags.for_installed(cand.flag)
        if not flag.is_default:
            assert decisions[f"{flag.name}={str(flag.value).lower()}"].startswith(("taken: ", "left: ")), decisions
    priced = [d for d in decisions.values() if "predicted step" in d]
    assert priced and all("; exposed " in d and "the rest (compute" in d for d in priced)  # the why
    compiles = int(decisions["structure search"].split()[0])
    assert compiles <= len(structures.CANDIDATES)  # each structure compiled at most once
    taken = {s.split("=")[0] for s, d in tuned.plan.decisions if d.startswith("taken")}
    assert taken <= {f.name for f in tuned.plan.flags}
    assert tuned.plan.makespan_us <= dict(tuned.plan.predicted_us)["xla-default"] * (1 + 1e-9)
    hlo_only = job.run(job.HloSource(tuned.compiled.text, "compiled"), HW, structures=True, verify=False)
    assert ("structure search", "not run: compiled cannot be compiled again here") in hlo_only.plan.decisions


@needs_gpu_compile
@pytest.mark.slow
def test_verification_says_where_the_structure_put_the_collectives():
    from lagom_jax.plan import verify

    compiled = _compiled()
    flag = flags.for_installed(_candidate("xla_gpu_pipeline_all_gather", "on").flag)  # the collective pipeliner
    pipelined = compiled.recompile(flags.compiler_options([flag]))
    plain, moved = graph.from_hlo_text(compiled.text), graph.from_hlo_text(pipelined)
    # The pipeliner peels one layer's all-gathers out of the scanned loop: more run outside
    # it, and the loop runs one iteration fewer.
    assert verify.placement(moved) != verify.placement(plain)
    outside = {k: n for (k, trips), n in verify.placement(moved).items() if trips == 1}
    assert outside["all-gather"] > verify.placement(plain)[("all-gather", 1)]
    # Across iterations (issue 26, item 4): an all-gather issued in iteration i feeds
    # iteration i + 1 through the loop's carried tuple, and the simulator overlaps it with
    # iteration i's compute: less all-gather time is exposed than without the pipeliner.
    users: dict[int, list] = {}
    for t in moved.tasks:
        for d in t.deps:
            users.setdefault(d, []).append(t)

    def reaches_next_iteration(c) -> bool:
        seen, stack = set(), [c.id]
        while stack:
            for u in users.get(stack.pop(), []):
                if u.id not in seen:
                    seen.add(u.id)
                    stack.append(u.id)
        return any(moved.tasks[i].iteration == c.iteration + 1 and moved.tasks[i].trip_count == c.trip_count
                   for i in seen)

    looped = [c for c in moved.collectives if c.kind == "all-gather" and c.trip_count > 1
              and c.iteration + 1 < c.trip_count]
    assert looped and all(reaches_next_iteration(c) for c in looped)

    def exposed(g):
        made = planning.make_plan(g, HW, strategy="xla-default")
        return sum(c.exposed_us for c in made.collectives if c.kind == "all-gather")

    assert exposed(moved) < 0.5 * exposed(plain)
    plan = dataclasses.replace(planning.make_plan(moved, HW, strategy="xla-default"), flags=(flag,))
    # A plan whose predicted step is the pipelined module: the recompile puts them there.
    _, ok = verify.verify_plan(plan, moved, compiled.text, compiled.recompile)
    assert ok.placement_matches and dict(ok.lines())["placement"].startswith("as predicted: ")
    # One that predicted the unpipelined module is told its collectives are elsewhere.
    tuned, wrong = verify.verify_plan(plan, plain, compiled.text, compiled.recompile)
    assert not wrong.placement_matches
    assert dict(wrong.lines())["placement"].startswith("DIFFER: predicted ")
    assert dict(tuned.verification)["placement"] == dict(wrong.lines())["placement"]


def test_kinds_left_at_the_default_threshold_are_never_combined_further():
    from lagom_jax import search

    with pytest.raises(ValueError, match="all-to-all"):
        search.Space(default_combine_kinds=("all-to-all",))
    step = graph.from_hlo_text(open(_fixture().parent.parent / 'gpu_collectives.hlo').read())
    kinds = {t.kind for t in step.collectives} & {"all-gather", "reduce-scatter", "all-reduce"}
    fixed = search.Space(default_combine_kinds=tuple(sorted(kinds)))
    planned = planning.plan(step, HW, strategy="lagom", baselines=("xla-default", "recipe"), space=fixed)
    # No threshold flag for a fixed kind, whichever seed won, and the collectives stay as compiled.
    assert not [f for f in planned.plan.flags if f.name.endswith("_combine_threshold_bytes")]
    assert len(planned.chosen.graph.collectives) == len(step.collectives)


@needs_gpu_compile
def test_a_flag_the_installed_xla_lacks_is_left_out_and_the_run_ends_with_a_plan(monkeypatch):
    # As jaxlib 0.12 did to xla_gpu_enable_pipelined_*: an XLA whose table lacks a structure
    # flag (and its successor) never sees it; the search says so and goes on.
    table = dict(flags.installed_table())
    lacking = ("xla_gpu_enable_while_loop_double_buffering", "xla_gpu_pipeline_all_gather",
               "xla_gpu_enable_pipelined_all_gather")
    table.update({name: f"No such compile option: '{name}'" for name in lacking})
    monkeypatch.setattr(flags, "installed_table", lambda: table)
    compiled = _compiled(layers=2)
    asked: list[dict] = []

    def recompile(options):
        asked.append(dict(options))
        if set(options) & set(lacking):
            raise AssertionError(f"compiled with a flag the installed XLA lacks: {options}")
        return compiled.recompile(options)

    # The two lacking flags and one the XLA has (one compile, not the whole search's).
    kept = tuple(c for c in structures.CANDIDATES if c.flag.name in (
        "xla_gpu_enable_while_loop_double_buffering", "xla_gpu_pipeline_all_gather",
        "xla_gpu_enable_reduce_scatter_combine_by_dim"))
    out = structures.search(compiled.text, _planned(compiled.text), HW, recompile, strategy="lagom",
                            baselines=("xla-default",), candidates=kept)
    decisions = dict(out.decisions)
    assert decisions["xla_gpu_enable_while_loop_double_buffering=true"].startswith("left: the installed XLA")
    assert decisions["xla_gpu_pipeline_all_gather=on"].startswith("left: the installed XLA")
    assert out.planned.plan.makespan_us > 0 and asked  # the others were compiled and priced


def test_a_compile_that_fails_leaves_its_candidate_with_the_reason():
    step = open(_fixture().parent.parent / "gpu_collectives.hlo").read()
    planned = _planned(step)
    cand = structures.Candidate(_candidate("xla_gpu_enable_all_gather_combine_by_dim", True).flag,
                                ("all-gather", "reduce-scatter", "all-reduce", "all-to-all"), needs_loop=False)

    def refuse(options):
        raise RuntimeError("INVALID_ARGUMENT: No such compile option: 'xla_gpu_enable_all_gather_combine_by_dim'")

    out = structures.search(step, planned, HW, refuse, strategy="lagom", baselines=("xla-default",),
                            candidates=(cand,))
    assert out.flags == () and out.text == step
    assert dict(out.decisions)["xla_gpu_enable_all_gather_combine_by_dim=true"] == (
        "left: XLA could not compile with it: INVALID_ARGUMENT: No such compile option: "
        "'xla_gpu_enable_all_gather_combine_by_dim'")


def test_combine_by_dim_is_not_compiled_where_xla_combined_nothing_it_could_keep_apart():
    fixtures = _fixture().parent.parent
    step = open(fixtures / "gpu_collectives.hlo").read()
    assert structures._combined_kinds(step) == frozenset()  # one operand per collective
    assert structures._combined_kinds(open(fixtures / "cpu_fsdp_mlp_step.hlo").read()) == {"all-reduce"}
    combined = step.replace(
        "%all-gather-start = (f32[8,128]{1,0}, f32[16,128]{1,0}) all-gather-start(f32[8,128]{1,0} %partial)",
        "%all-gather-start = ((f32[8,128]{1,0}, f32[8,128]{1,0}), (f32[16,128]{1,0}, f32[16,128]{1,0})) "
        "all-gather-start(f32[8,128]{1,0} %partial, f32[8,128]{1,0} %partial)")
    assert structures._combined_kinds(combined) == {"all-gather"}
    cand = _candidate("xla_gpu_enable_all_gather_combine_by_dim", True)
    assert cand.only_splits
    cand = dataclasses.replace(cand, kinds=("all-gather", "reduce-scatter", "all-reduce", "all-to-all"))
    asked = []

    def recompile(options):
        asked.append(options)
        return step

    out = structures.search(step, _planned(step), HW, recompile, strategy="lagom", baselines=("xla-default",),
                            candidates=(cand,))
    assert asked == [] and out.flags == ()
    assert "compiles the same module (not compiled)" in dict(out.decisions)["xla_gpu_enable_all_gather_combine_by_dim=true"]
    assert dict(out.decisions)["structure search"].startswith("0 compile(s)")


def test_the_recompiler_compiles_each_option_set_once_and_can_start_some_ahead():
    import threading

    started, release, calls = threading.Event(), threading.Event(), []

    def compile_fn(options):
        calls.append(dict(options))
        if options.get("slow"):
            started.set()
            release.wait(5)
        if options.get("bad"):
            raise RuntimeError("XLA refused it")
        return f"module {sorted(options.items())}"

    r = structures.Recompiler(compile_fn)
    r.start({"slow": True}, {"a": 1}, {"c": 3})  # one after another
    assert started.wait(5)  # running in the background while the caller goes on
    assert r({"a": 1}) == "module [('a', 1)]"  # not begun behind the slow one: the caller compiles it
    release.set()
    assert r({"slow": True}) == "module [('slow', True)]"
    assert r({"c": 3}) == "module [('c', 3)]"
    assert r({"a": 1}) == "module [('a', 1)]" and r({"slow": True})
    assert sorted(map(str, calls)) == sorted(map(str, [{"slow": True}, {"a": 1}, {"c": 3}]))  # each once
    with pytest.raises(RuntimeError, match="refused"):
        r({"bad": True})


def test_while_the_caller_waits_for_a_queued_compile_the_next_one_runs_beside_it():
    import threading

    first_running, second_running, release = threading.Event(), threading.Event(), threading.Event()

    def compile_fn(options):
        if options.get("first"):
            first_running.set()
            assert second_running.wait(5), "the queue's next compile did not start while the caller waited"
        if options.get("second"):
            second_running.set()
            release.wait(5)
        return f"module {sorted(options.items())}"

    r = structures.Recompiler(compile_fn)
    r.start({"first": True}, {"second": True})
    assert first_running.wait(5)
    assert not second_running.is_set()  # one at a time while the caller works
    # Asking for the first waits on it: the second starts beside it, and the first can end.
    assert r({"first": True}) == "module [('first', True)]"
    release.set()
    assert r({"second": True}) == "module [('second', True)]"


def test_the_trials_started_ahead_are_the_ones_the_search_compiles():
    step = open(_fixture().parent.parent / "gpu_collectives.hlo").read()
    planned = _planned(step)
    # No loop here: the pipeliner and double buffering are out; combine-by-dim keeps nothing apart.
    assert structures.trials(step, planned) == []
    cand = dataclasses.replace(_candidate("xla_gpu_enable_all_gather_combine_by_dim", True), only_splits=False,
                               kinds=("all-gather", "reduce-scatter", "all-reduce", "all-to-all"))
    assert structures.trials(step, planned, (cand,)) == [flags.compiler_options((cand.flag,))]


@needs_gpu_compile
def test_the_ragged_decomposer_is_compiled_only_where_a_ragged_all_to_all_is():
    name = "xla_gpu_unsupported_enable_ragged_all_to_all_decomposer"
    cand = _candidate(name, True)
    dense = _compiled(layers=1)
    never = structures.search(dense.text, _planned(dense.text), HW, lambda options: pytest.fail("compiled"),
                              strategy="lagom", baselines=("xla-default",), candidates=(cand,))
    assert dict(never.decisions)[f"{name}=true"] == "left: the step has no ragged-all-to-all to rewrite"
    # A dropless MoE with an expert axis: the search compiles the rewrite and prices the module XLA made.
    one_node = hardware.get("h100-sxm-8")
    src = job.ModelSource("mixtral", "layers=1,d_model=64,heads=4,kv_heads=4,d_ff=128,vocab=256,max_len=64,"
                          "experts=4,top_k=2,moe=dropless", {"fsdp": 2, "expert": 4}, None, 8, 64)
    moe = job.compile_source(src, one_node)
    seen = []

    def recompile(options):
        seen.append(dict(options))
        return job.compile_source(dataclasses.replace(src, compiler_options=tuple(options.items())), one_node).text

    planned = planning.plan(graph.from_hlo_text(moe.text), one_node, strategy="lagom", baselines=("xla-default",))
    out = structures.search(moe.text, planned, one_node, recompile, strategy="lagom", baselines=("xla-default",),
                            candidates=(cand,))
    assert seen == [{name: True}]
    assert dict(out.decisions)[f"{name}=true"].startswith(("taken: predicted step", "left: predicted step"))

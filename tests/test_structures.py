"""Compile-in-the-loop structure search (lagom_jax.structures) and its place in the pipeline."""

import pytest

from lagom_jax import gpu_compile, graph, hardware, job, planning, structures

_REASON = gpu_compile.unavailable_reason()
needs_gpu_compile = pytest.mark.skipif(_REASON is not None, reason=f"no deviceless GPU compile here: {_REASON}")

HW = hardware.get("h100-sxm-8", 2)


def _compiled(layers=4, **kw):
    src = job.ModelSource("llama", f"layers={layers},d_model=256,heads=4,kv_heads=2,head_dim=64,d_ff=512,"
                          "vocab=1024,max_len=256", {"fsdp": 16}, None, 32, 256, **kw)
    return job.compile_source(src, HW)


def _planned(text):
    return planning.plan(graph.from_hlo_text(text), HW, strategy="lagom", baselines=("xla-default",))


@needs_gpu_compile
def test_a_candidate_that_changes_nothing_is_left():
    one_node = hardware.get("h100-sxm-8")
    base = job.compile_source(job.HloSource(open(_fixture()).read()), one_node)
    planned = planning.plan(graph.from_hlo_text(base.text), one_node, strategy="lagom", baselines=("xla-default",))
    # A "recompile" that returns the same module: nothing to take, and said so.
    everything = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all")
    cand = structures.Candidate(structures.CANDIDATES[4].flag, everything, needs_loop=False)
    same = structures.search(base.text, planned, one_node, lambda options: base.text, strategy="lagom",
                             baselines=("xla-default",), candidates=(cand,))
    assert same.flags == () and "same module" in same.decisions[0][1]


def _fixture():
    import pathlib

    return pathlib.Path(__file__).parent / "fixtures" / "hlo" / "unoptimized" / "jax_fsdp_mlp_8.after_spmd.hlo"


@needs_gpu_compile
def test_taken_flags_reach_the_plan_and_its_verification():
    compiled = _compiled()
    fast = _compiled(layers=1)  # stands in for a restructured, faster module of the same step

    def recompile(options):
        return fast.text if options else compiled.text

    cand = structures.Candidate(structures.CANDIDATES[0].flag, ("all-gather", "reduce-scatter", "all-reduce"))
    out = structures.search(compiled.text, _planned(compiled.text), HW, recompile, strategy="lagom",
                            baselines=("xla-default",), candidates=(cand,))
    assert out.flags == (cand.flag,) and out.decisions[0][1].startswith("taken: predicted step")
    assert out.planned.plan.makespan_us < _planned(compiled.text).plan.makespan_us


@needs_gpu_compile
def test_the_pipeline_runs_the_structure_search_for_sources_it_can_recompile():
    src = job.ModelSource("llama", "layers=4,d_model=256,heads=4,kv_heads=2,head_dim=64,d_ff=512,vocab=1024,max_len=256",
                          {"fsdp": 16}, None, 32, 256)
    tuned = job.run(src, HW, structures=True, verify=False)
    decisions = dict(tuned.plan.decisions)
    for cand in structures.CANDIDATES:  # every candidate has a decision with its reason
        subject = f"{cand.flag.name}={str(cand.flag.value).lower()}"
        assert decisions[subject].startswith(("taken: ", "left: ")), decisions
    compiles = int(decisions["structure search"].split()[0])
    assert compiles <= len(structures.CANDIDATES)  # each structure compiled at most once
    taken = {s.split("=")[0] for s, d in tuned.plan.decisions if d.startswith("taken")}
    assert taken <= {f.name for f in tuned.plan.flags}
    assert tuned.plan.makespan_us <= dict(tuned.plan.predicted_us)["xla-default"] * (1 + 1e-9)
    text = job.compile_source(src, HW).text
    hlo_only = job.run(job.HloSource(text, "compiled"), HW, structures=True, verify=False)
    assert ("structure search", "not run: compiled cannot be compiled again here") in hlo_only.plan.decisions

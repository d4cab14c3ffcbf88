"""The ``combine`` pass against XLA:GPU's own combiners.

The main test compiles a few built-in steps *deviceless* with XLA's GPU pipeline
(``lagom_jax.program.gpu_compile``): once with every combine threshold at 0 (uncombined), once per
threshold, and asserts that ``combine(uncombined, threshold)`` predicts exactly the
collectives XLA emitted: per kind, the count and the NCCL-convention size of every call.
The subset covers what the rules have to get right: bf16 and f32 all-reduces that must not
merge across element types or reductions (max vs add), collectives in loop bodies that
must not merge across loops, mixed-dtype all-gathers that do merge, reduce-scatters held
against the threshold by their result size, and a 4 KiB threshold that makes the byte
limit bind. ``python -m benchmarks.predicted.combine_sweep`` runs the whole sweep.

The hand-built tests below pin each rule without compiling.
"""

from __future__ import annotations

import pytest

from benchmarks.predicted import combine_sweep
from lagom_jax.passes.combine import combine_groups
from lagom_jax.program import gpu_compile, graph as graph_lib
from lagom_jax.program.graph import StepGraph, Task

KIB = 1 << 10
# (model, recipe, dtype, thresholds): five compiles in all, about a minute on 2 cores.
CASES = [
    ("gpt2", "dp+tp", "bfloat16", (4 * KIB, 1 << 30)),
    ("bert", "fsdp", "float32", (4 * KIB,)),
]


@pytest.mark.parametrize("model, recipe, dtype, thresholds", CASES)
@pytest.mark.slow
def test_combine_predicts_xla_gpu_combiners_exactly(model, recipe, dtype, thresholds):
    reason = gpu_compile.unavailable_reason()
    if reason is not None:
        pytest.skip(f"no deviceless GPU compile here: {reason}")
    from lagom_jax.cluster import hardware

    hw = hardware.get("h100-sxm-8")
    rows = combine_sweep.sweep_case(model, recipe, dtype, (0, *thresholds),
                                    devices=lambda n: gpu_compile.devices(hw, n),
                                    progress=lambda _: None)
    assert [r.threshold for r in rows] == [0, *thresholds]
    uncombined = {a.kind: a.real_count for a in rows[0].agreements}
    assert sum(uncombined.values()) > 0
    for row in rows:
        for a in row.agreements:
            assert (a.real_count, a.real_sizes) == (a.predicted_count, a.predicted_sizes), (
                f"{model} {recipe} {dtype} at {combine_sweep.threshold_label(row.threshold)}: "
                f"{a.kind} XLA {a.real_sizes} vs predicted {a.predicted_sizes}")
    # The thresholds really combine something: fewer calls than uncombined.
    for row in rows[1:]:
        assert sum(a.real_count for a in row.agreements) < sum(uncombined.values())


# ------------------------------------------------------------------ the rules, hand-built

G8 = (tuple(range(8)),)


def _c(i, deps=(), computation="main"):
    return Task(i, f"fusion.{i}", "compute", flops=1.0, bytes=1.0, deps=tuple(deps),
                computation=computation)


def _coll(i, kind="all-reduce", nbytes=1024, deps=(), dtype="f32", reduction="add",
          computation="main", post_order=-1, iteration=0, trip_count=1):
    return Task(i, f"{kind}.{i}", kind, bytes=nbytes, deps=tuple(deps), dtype=dtype,
                reduction=reduction if kind in ("all-reduce", "reduce-scatter") else "",
                groups=G8, computation=computation, post_order=post_order,
                iteration=iteration, trip_count=trip_count, is_async=True)


def _graph(*tasks):
    return StepGraph("rules", tuple(tasks), 8)


ALL = {k: 1 << 30 for k in ("all-reduce", "all-gather", "reduce-scatter", "collective-permute")}


def test_all_reduce_key_has_dtype_and_reduction_all_gather_does_not():
    g = _graph(_c(0), _coll(1, deps=[0]), _coll(2, dtype="bf16", deps=[0]), _coll(3, deps=[0]),
               _coll(4, reduction="maximum", deps=[0]),
               _coll(5, "all-gather", deps=[0]), _coll(6, "all-gather", dtype="s32", deps=[0]))
    assert combine_groups(g, ALL) == ((1, 3), (5, 6))


def test_only_one_computation_instance_merges():
    body = "main/body"
    g = _graph(_c(0), _coll(1, deps=[0]),
               _coll(2, deps=[0], computation=body, trip_count=2, iteration=0),
               _coll(3, deps=[0], computation=body, trip_count=2, iteration=0),
               _coll(4, deps=[0], computation=body, trip_count=2, iteration=1),
               _coll(5, deps=[0], computation="main/other_body", trip_count=2, iteration=0),
               _coll(6, deps=[0]))
    assert combine_groups(g, ALL) == ((1, 6), (2, 3))


def test_a_nested_loop_is_one_instruction_of_its_parent():
    # 1 feeds the loop through task 2, and 5 uses an output of the loop (task 3) that does
    # not depend on 1: in XLA the while is one instruction, so 5 depends on 1.
    g = _graph(_c(0), _coll(1, deps=[0]), _c(2, deps=[1], computation="main/body"),
               _c(3, deps=[0], computation="main/body"), _c(4, deps=[3]), _coll(5, deps=[4]))
    assert combine_groups(g, ALL) == ()
    flat = _graph(*(Task(**{**t.__dict__, "computation": "main"}) for t in g.tasks))
    assert combine_groups(flat, ALL) == ((1, 5),)


def test_rounds_follow_post_order_and_stop_at_a_dependent_collective():
    # Schedule order 1, 2, 4; post order 1, 4, 2. 4 depends on 1; 2 is independent.
    g = _graph(_c(0), _coll(1, deps=[0], post_order=1), _coll(2, deps=[0], post_order=9),
               _c(3, deps=[1]), _coll(4, deps=[3], post_order=5))
    # Post order: {1} stops at 4 (reachable from 1); then {4, 2}.
    assert combine_groups(g, ALL) == ((2, 4),)
    unordered = _graph(*(Task(**{**t.__dict__, "post_order": -1}) for t in g.tasks))
    assert combine_groups(unordered, ALL) == ((1, 2),)


def test_threshold_counts_the_result_and_a_big_one_does_not_stop_the_scan():
    # reduce-scatter of 8 KiB input on 8 devices: a 1 KiB result.
    g = _graph(_c(0), _coll(1, "reduce-scatter", 8 * KIB, deps=[0]),
               _coll(2, "reduce-scatter", 8 * KIB, deps=[0]))
    assert combine_groups(g, {"reduce-scatter": 2 * KIB}) == ((1, 2),)
    assert combine_groups(g, {"reduce-scatter": 2 * KIB - 1}) == ()
    h = _graph(_c(0), _coll(1, deps=[0]), _coll(2, nbytes=64 * KIB, deps=[0]), _coll(3, deps=[0]))
    assert combine_groups(h, {"all-reduce": 4 * KIB}) == ((1, 3),)


def test_merges_of_earlier_rounds_count_for_reachability():
    # The all-gather combiner merges 1 and 4 first. Then all-reduce 6 is reachable from
    # all-reduce 2 through the merged call: 2 -> 3 -> all-gather(1+4) -> 5 -> 6.
    g = _graph(_c(0), _coll(1, "all-gather", deps=[0]), _coll(2, deps=[0]), _c(3, deps=[2]),
               _coll(4, "all-gather", deps=[3]), _c(5, deps=[1]), _coll(6, deps=[5]))
    assert combine_groups(g, {"all-gather": 0, "all-reduce": 1 << 30}) == ((2, 6),)
    assert combine_groups(g, ALL) == ((1, 4),)


GRAPH_HLO = """HloModule m, entry_computation_layout={(f32[16]{0})->(f32[2]{0}, f32[2]{0})}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

%max (a.1: f32[], b.1: f32[]) -> f32[] {
  %a.1 = f32[] parameter(0)
  %b.1 = f32[] parameter(1)
  ROOT %m = f32[] maximum(%a.1, %b.1)
}

ENTRY %main (p: f32[16]) -> (f32[2], f32[2]) {
  %p = f32[16]{0} parameter(0)
  %rs-start = ((f32[16]{0}), f32[2]{0}) reduce-scatter-start(%p), channel_id=1, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}, to_apply=%add
  %n = f32[16]{0} negate(%p)
  %rs-done = f32[2]{0} reduce-scatter-done(%rs-start)
  %ar-start = f32[16]{0} all-reduce-start(%n), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%max
  %ar-done = f32[16]{0} all-reduce-done(%ar-start)
  %sl = f32[2]{0} slice(%ar-done), slice={[0:2]}
  ROOT %t = (f32[2]{0}, f32[2]{0}) tuple(%rs-done, %sl)
}
"""


def test_graph_reads_reduce_scatter_pairs_reductions_computations_and_post_order():
    g = graph_lib.from_hlo_text(GRAPH_HLO)
    rs, ar = g.collectives
    assert (rs.kind, rs.bytes, rs.reduction, rs.is_async) == ("reduce-scatter", 64.0, "add", True)
    assert (ar.kind, ar.reduction) == ("all-reduce", "maximum")
    assert {t.computation for t in g.tasks} == {"main"}
    # Post order from the root: rs-start (first operand) before negate before ar-start.
    neg = next(t for t in g.tasks if t.opcode == "negate")
    assert rs.post_order < neg.post_order < ar.post_order
    assert rs.done_before is not None

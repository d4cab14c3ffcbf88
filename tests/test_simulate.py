"""The timeline simulator: contract semantics, laws (hypothesis) and the Lagom case."""

from __future__ import annotations

import dataclasses
import gc
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lagom_jax.cluster import hardware
from lagom_jax.costs import cost, simulate
from lagom_jax.plan import report
from lagom_jax.program.graph import COLLECTIVE_KINDS, StepGraph, Task

A100 = hardware.get("a100-sxm-8")
ALL8 = (tuple(range(8)),)


def compute(i, flops=1e12, nbytes=1e8, deps=()):
    return Task(id=i, name=f"c{i}", kind="compute", flops=flops, bytes=nbytes, deps=deps)


def coll(i, nbytes=64 << 20, deps=(), done_before=None, kind="all-reduce", groups=ALL8):
    return Task(id=i, name=f"x{i}", kind=kind, bytes=nbytes, deps=deps, groups=groups,
                done_before=done_before, is_async=True)


@st.composite
def graphs(draw):
    """Small random StepGraphs: compute and collectives with random earlier deps and waits."""
    n = draw(st.integers(1, 14))
    tasks: list[Task] = []
    for i in range(n):
        deps = tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=2)))) if i else ()
        if draw(st.booleans()):
            tasks.append(compute(i, draw(st.floats(0, 1e12)), draw(st.floats(0, 1e9)), deps))
        else:
            size = draw(st.sampled_from([2, 4, 8, 16]))
            first = draw(st.integers(0, 16 - size))
            tasks.append(coll(i, draw(st.floats(0, 1 << 28)), deps, None,
                              draw(st.sampled_from(COLLECTIVE_KINDS)), (tuple(range(first, first + size)),)))
    # done_before: a later compute task, as XLA places the *-done.
    for t in list(tasks):
        later = [u.id for u in tasks if u.id > t.id and not u.is_collective]
        if t.is_collective and later and draw(st.booleans()):
            tasks[t.id] = dataclasses.replace(t, done_before=draw(st.sampled_from(later)))
    return StepGraph("random", tuple(tasks), 16)


hw_st = st.builds(hardware.get, st.sampled_from(tuple(hardware.PRESETS)), st.integers(1, 2))


def check_semantics(g, tl):
    iv = {i.task_id: i for i in tl.intervals}
    assert len(iv) == len(g.tasks)
    prev_end = 0.0
    for t in g.tasks:
        assert iv[t.id].end >= iv[t.id].start
        for d in t.deps:
            assert iv[t.id].start >= iv[d].end - 1e-6
        if not t.is_collective:
            assert iv[t.id].stream == "compute" and iv[t.id].start >= prev_end - 1e-6
            prev_end = iv[t.id].end
        elif t.done_before is not None:
            assert iv[t.done_before].start >= iv[t.id].end - 1e-6
    # Never more collectives at once than the limit.
    events = sorted((x, +1 if k == 0 else -1) for i in tl.intervals if i.stream != "compute"
                    for k, x in enumerate((i.start, i.end)) if i.end > i.start)
    live = 0
    for _, d in sorted(events, key=lambda e: (e[0], e[1])):
        live += d
        assert live <= tl.overlap_limit


@settings(max_examples=150, deadline=None)
@given(graphs(), hw_st, st.integers(1, 3))
def test_laws_bound_and_serial(g, hw, limit):
    tl = simulate.simulate(g, hw, overlap_limit=limit)
    check_semantics(g, tl)
    eps = 1e-9 * max(tl.makespan_us, 1.0)
    assert tl.makespan_us >= tl.bound_us - eps  # never beats the overlap bound
    # never worse than serial, or than the host's time to issue the step
    assert tl.makespan_us <= max(tl.compute_us + tl.comm_us, tl.host_us) + eps
    assert 0.0 <= tl.exposed_comm_us <= tl.comm_us + eps


@settings(max_examples=100, deadline=None)
@given(graphs(), hw_st)
def test_law_no_collectives_takes_exactly_compute_time(g, hw):
    only = StepGraph("compute-only", tuple(
        compute(t.id, t.flops, t.bytes, tuple(d for d in t.deps if not g.tasks[d].is_collective))
        for t in g.tasks), g.num_devices)
    tl = simulate.simulate(only, hw)
    serial = sum(cost.compute_time_us(t.flops, t.bytes, hw) for t in only.tasks)
    # Equal but for the order of float additions (13.8 against 13.799999999999999).
    assert tl.compute_us == pytest.approx(serial, rel=1e-12)
    assert tl.makespan_us == pytest.approx(max(tl.compute_us, tl.host_us), rel=1e-12)
    assert tl.exposed_comm_us == 0.0


def test_overlapped_collective_is_hidden_and_slows_compute():
    # The all-reduce is launched before the GEMM (schedule order), so its CTAs are resident
    # when the GEMM starts (a collective launched behind a running kernel waits for its end:
    # tests/test_contention_order.py).
    g = StepGraph("overlap", (coll(0, 64 << 20), compute(1, 4e12, 1e8), compute(2, 1e9, 1e6, deps=(0,))), 8)
    tl = simulate.simulate(g, A100)
    p = cost.nccl_default_params("all-reduce", 64 << 20, 8, 1, A100)
    t_comm = cost.collective_time_us("all-reduce", 64 << 20, 8, 1, p, A100)
    iv = {i.task_id: i for i in tl.intervals}
    assert iv[0].start == 0.0 and iv[0].end == pytest.approx(t_comm)
    # The GEMM outlasts the all-reduce, so nothing is exposed, but it ran slower.
    assert tl.exposed_comm_us == 0.0
    assert iv[1].end > cost.compute_time_us(4e12, 1e8, A100)
    assert tl.makespan_us > tl.bound_us


def test_waited_collective_is_exposed():
    # c2 waits for x1 (its -done sits before c2): x1 runs alone, fully exposed.
    g = StepGraph("exposed", (compute(0), coll(1, deps=(0,), done_before=2), compute(2)), 8)
    tl = simulate.simulate(g, A100)
    rec = tl.per_collective[0]
    assert rec.exposed_us == pytest.approx(rec.end - rec.start) == pytest.approx(tl.exposed_comm_us)
    assert tl.makespan_us == pytest.approx(tl.compute_us + tl.comm_us)


def test_priority_and_overlap_limit():
    g = StepGraph("prio", (coll(0, 1 << 20), coll(1, 1 << 30), compute(2)), 8)
    by_order = {i.task_id: i for i in simulate.simulate(g, A100).intervals}
    assert by_order[0].start < by_order[1].start
    by_prio = {i.task_id: i for i in simulate.simulate(g, A100, priority={1: 1.0}).intervals}
    assert by_prio[1].start < by_prio[0].start
    both = {i.task_id: i for i in simulate.simulate(g, A100, overlap_limit=2).intervals}
    assert both[0].start == both[1].start == 0.0 and {both[0].stream, both[1].stream} == {"comm0", "comm1"}


def test_trip_count_repeats_unless_unrolled():
    once = simulate.simulate(StepGraph("g", (compute(0),), 8), A100).makespan_us
    looped = StepGraph("g", (dataclasses.replace(compute(0), trip_count=3),), 8)
    assert simulate.simulate(looped, A100).makespan_us == pytest.approx(3 * once)
    unrolled = StepGraph("g", tuple(dataclasses.replace(compute(i), trip_count=2, iteration=i) for i in range(2)), 8)
    assert simulate.simulate(unrolled, A100).makespan_us == pytest.approx(2 * once)


def test_lagom_motivating_case_in_the_simulator():
    # Lagom (arXiv 2602.20656): on A40 (8-16 GPUs) AutoCCL's 8 -> 61 channels made a compute-bound step
    # slower than NCCL's default (0.87x). Two nodes of 8 A40, one gradient all-reduce
    # overlapping a compute-bound backward GEMM.
    hw = hardware.get("a40-pcie-8", nodes=2)
    g = StepGraph("a40-step", (
        coll(0, 16 << 20, groups=(tuple(range(16)),), done_before=2),
        compute(1, 2 * 4096 * 8192 * 8192, 3 * 4096 * 8192 * 2),
        compute(2, 1e9, 1e7),
    ), 16)
    default = simulate.simulate(g, hw)
    assert default.per_collective[0].params.nchannels == 8
    wide = dataclasses.replace(default.per_collective[0].params, nchannels=61)
    assert simulate.simulate(g, hw, {0: wide}).makespan_us > default.makespan_us


def test_errors_name_the_input():
    g = StepGraph("g", (compute(0), coll(1)), 8)
    with pytest.raises(ValueError, match=r"ids \[0\]"):
        simulate.simulate(g, A100, {0: cost.nccl_default_params("all-reduce", 1, 8, 1, A100)})
    with pytest.raises(ValueError, match="overlap_limit"):
        simulate.simulate(g, A100, overlap_limit=0)
    # x2 waits for c1, but c0 waits for x2: c0 can never start.
    stuck = StepGraph("stuck", (compute(0), compute(1), coll(2, deps=(1,), done_before=0)), 8)
    with pytest.raises(ValueError, match="cannot complete"):
        simulate.simulate(stuck, A100)


def test_timeline_json_and_report():
    g = StepGraph("report", (compute(0), coll(1, deps=(0,), done_before=2), compute(2)), 8)
    tl = simulate.simulate(g, A100)
    d = json.loads(tl.to_json())
    assert d["makespan_us"] == tl.makespan_us and len(d["intervals"]) == 3
    assert d["per_collective"][0]["params"]["protocol"] == tl.per_collective[0].params.protocol
    rep = json.loads(report.simulate_report(g, A100, as_json=True))
    for key in ("makespan_us", "bound_us", "compute_us", "comm_us", "exposed_comm_us"):
        assert rep[key] == getattr(tl, key)
    text = report.simulate_report(g, A100, as_json=False)
    assert "makespan" in text and "x1" in text and "a100-sxm-8" in text


@settings(max_examples=100, deadline=None)
@given(graphs(), hw_st, st.integers(1, 3), st.data())
def test_makespan_us_is_the_timelines_makespan(g, hw, limit, data):
    # The search scores candidates with makespan_us; it must be the Timeline's number
    # exactly, under any params and priorities, and on repeated calls (cached per graph).
    colls = [t for t in g.tasks if t.is_collective]
    params = {}
    for t in colls:
        cands = cost.candidate_params(*g.shape(t, hw.gpus_per_node), hw)
        if data.draw(st.booleans()):
            params[t.id] = data.draw(st.sampled_from(cands))
    priority = {t.id: data.draw(st.floats(-1, 1)) for t in colls if data.draw(st.booleans())}
    for _ in range(2):
        tl = simulate.simulate(g, hw, params, overlap_limit=limit, priority=priority)
        assert simulate.makespan_us(g, hw, params, overlap_limit=limit, priority=priority) == tl.makespan_us
    assert simulate.makespan_us(g, hw, overlap_limit=limit) == simulate.simulate(g, hw, overlap_limit=limit).makespan_us


def test_collective_shape_sizes_groups_and_all_device_collectives():
    two_nodes = hardware.get("a100-sxm-8", nodes=2)

    def shape(t):
        return StepGraph("g", (dataclasses.replace(t, id=0),), 16).shape(t, two_nodes.gpus_per_node)

    assert shape(coll(0, 1024)) == ("all-reduce", 1024.0, 8, 1)
    spread = coll(0, 1024, groups=((0, 8), (1, 9)))
    assert shape(spread) == ("all-reduce", 1024.0, 2, 2)
    # HLO's empty replica_groups: all 16 devices, over both nodes.
    assert shape(coll(0, 1024, groups=())).ranks == 16 and shape(coll(0, 1024, groups=())).nodes == 2
    permute = Task(id=0, name="p", kind="collective-permute", bytes=64, pairs=((0, 1), (1, 0)))
    assert shape(permute) == ("collective-permute", 64.0, 2, 1)


def test_per_graph_cache_forgets_collected_graphs():
    g = StepGraph("temp", (compute(0), coll(1, deps=(0,))), 8)
    simulate.simulate(g, A100)
    key = (id(g), A100)
    assert key in simulate._PREPARED
    del g
    gc.collect()
    # Its entry is gone (counting entries would also count graphs of earlier tests that
    # this collection freed), and no entry outlives its graph.
    assert key not in simulate._PREPARED
    assert all(ref() is not None for ref, _ in simulate._PREPARED.values())

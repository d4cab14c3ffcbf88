"""Fixture tests for ``decompose``: tiny hand-built graphs, counts, sizes, order, timelines."""

from __future__ import annotations

import dataclasses

import pytest

from lagom_jax.cluster import hardware
from lagom_jax.costs.simulate import simulate
from lagom_jax.passes import XLA_ORDER, decompose, decompose_rewrite, eligible_pairs, is_matmul
from lagom_jax.program.graph import StepGraph, Task

G8 = (tuple(range(8)),)
G4 = ((0, 1, 2, 3), (4, 5, 6, 7))
MiB = 1 << 20
# a40-pcie-8: PCIe links, so a collective's channels contend with the overlapped compute.
HW = hardware.get("a40-pcie-8")


def c(i, name, deps=(), flops=1e9, nbytes=1e6, opcode="fusion"):
    return Task(id=i, name=name, kind="compute", flops=flops, bytes=nbytes, deps=tuple(deps), opcode=opcode)


def coll(i, name, kind, nbytes, deps=(), groups=G8):
    return Task(id=i, name=name, kind=kind, bytes=nbytes, deps=tuple(deps), groups=groups, is_async=True)


def ag_gemm(flops=4e12, nbytes=64 * MiB, groups=G8):
    """x -> all-gather -> dot -> y (column-parallel linear under sequence parallelism)."""
    return StepGraph("ag-gemm", (
        c(0, "x"),
        coll(1, "ag", "all-gather", nbytes, [0], groups),
        c(2, "dot", [0, 1], flops=flops, nbytes=nbytes),
        c(3, "y", [2]),
    ), num_devices=8)


def gemm_rs(flops=4e12, nbytes=64 * MiB, kind="reduce-scatter"):
    """x -> dot -> reduce-scatter -> y (row-parallel linear)."""
    return StepGraph("gemm-rs", (
        c(0, "x"),
        c(1, "dot", [0], flops=flops, nbytes=nbytes),
        coll(2, "rs", kind, nbytes, [1]),
        c(3, "y", [2]),
    ), num_devices=8)


def by_name(g, prefix):
    return [t for t in g.tasks if t.name.startswith(prefix)]


@pytest.mark.parametrize("make", [ag_gemm, gemm_rs])
@pytest.mark.parametrize("order", ["commfuse", "naive"])
def test_ring_counts_and_sizes_are_conserved(make, order):
    g = make()
    out = decompose(g, 0, order=order)
    steps = [t for t in out.tasks if t.kind == "collective-permute"]
    blocks = by_name(out, "dot.")
    assert len(steps) == 7 and len(blocks) == 8
    assert not any(t.kind in ("all-gather", "reduce-scatter") for t in out.tasks)
    assert all(t.bytes == 64 * MiB / 8 for t in steps)
    assert sum(t.flops for t in blocks) == pytest.approx(4e12)
    assert sum(t.bytes for t in blocks) == pytest.approx(64 * MiB)
    assert out.total_flops == pytest.approx(g.total_flops)
    assert all(t.pairs == tuple((d, (d + 1) % 8) for d in range(8)) for t in steps)
    # The user of the pair still runs after all of it.
    y = by_name(out, "y")[0]
    assert y.id == len(out.tasks) - 1


def test_ring_pairs_follow_every_group():
    out = decompose(ag_gemm(groups=G4), 0)
    steps = [t for t in out.tasks if t.kind == "collective-permute"]
    assert len(steps) == 3
    assert steps[0].pairs == ((0, 1), (1, 2), (2, 3), (3, 0), (4, 5), (5, 6), (6, 7), (7, 4))


def test_all_gather_commfuse_computes_local_block_first_then_arrivals():
    out = decompose(ag_gemm(), 0)
    steps = [t.id for t in out.tasks if t.kind == "collective-permute"]
    blocks = by_name(out, "dot.")
    assert blocks[0].name == "dot.local/8" and not set(blocks[0].deps) & set(steps)
    for i, b in enumerate(blocks[1:], start=1):
        assert steps[i - 1] in b.deps  # block i waits for step i-1
    for i in range(1, 7):
        assert steps[i - 1] in out.tasks[steps[i]].deps  # the ring forwards what arrived
    naive = by_name(decompose(ag_gemm(), 0, order="naive"), "dot.")
    assert naive[-1].name == "dot.local/8" and naive[0].deps  # naive waits before the first block


def test_reduce_scatter_commfuse_computes_staying_block_last():
    out = decompose(gemm_rs(), 0)
    steps = [t for t in out.tasks if t.kind == "collective-permute"]
    blocks = by_name(out, "dot.")
    assert blocks[-1].name == "dot.local/8"
    for i, s in enumerate(steps):
        assert blocks[i].id in s.deps  # step i carries block i's partial sum
        if i:
            assert steps[i - 1].id in s.deps  # plus the sum received at step i-1
    y = by_name(out, "y")[0]
    assert {blocks[-1].id, steps[-1].id} <= set(y.deps)
    naive = by_name(decompose(gemm_rs(), 0, order="naive"), "dot.")
    assert naive[0].name == "dot.local/8"


def test_all_reduce_keeps_its_all_gather_half():
    g = gemm_rs(kind="all-reduce")
    assert eligible_pairs(g, 0) == ()  # XLA's windowed einsum has no all-reduce form
    rw = decompose_rewrite(g, [2])
    kinds = [t.kind for t in rw.graph.tasks]
    assert kinds.count("collective-permute") == 7 and kinds.count("all-gather") == 1
    gather = next(t for t in rw.graph.tasks if t.kind == "all-gather")
    assert gather.bytes == 64 * MiB and by_name(rw.graph, "y")[0].deps == (gather.id,)
    assert rw.origins[gather.id] == (1, 2)


def test_only_matmul_pairs_are_eligible():
    elementwise = ag_gemm(flops=1e6)  # 1e6 FLOP over 64 MiB: not a dot
    assert not is_matmul(elementwise.tasks[2]) and is_matmul(ag_gemm().tasks[2])
    assert decompose(elementwise, 0) == elementwise
    assert decompose(ag_gemm(), 128 * MiB) == ag_gemm()  # below the byte threshold
    with pytest.raises(ValueError, match="no matmul consumer"):
        decompose(elementwise, [1])
    with pytest.raises(ValueError, match="task 2 .* is not an all-gather"):
        decompose(ag_gemm(), [2])
    with pytest.raises(ValueError, match="unknown order fast"):
        decompose(ag_gemm(), 0, order="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"kinds without an order \['all-reduce'"):
        decompose(ag_gemm(), 0, order={"all-gather": "naive", "reduce-scatter": "naive"})


def test_a_matmul_is_split_for_one_pair_only():
    g = StepGraph("both", (
        c(0, "x"),
        coll(1, "ag", "all-gather", 64 * MiB, [0]),
        c(2, "dot", [1], flops=4e12, nbytes=64 * MiB),
        coll(3, "rs", "reduce-scatter", 64 * MiB, [2]),
        c(4, "y", [3]),
    ), num_devices=8)
    rw = decompose_rewrite(g, 0)
    assert [t.kind for t in rw.graph.tasks].count("reduce-scatter") == 1
    assert len(by_name(rw.graph, "dot.")) == 8
    assert all(o == (1, 2) for t, o in zip(rw.graph.tasks, rw.origins) if t.kind == "collective-permute")


def _steps(timeline):
    return sorted(r.end - r.start for r in timeline.per_collective)


def test_decomposed_all_gather_hides_behind_compute():
    g = ag_gemm()
    before, after = simulate(g, HW), simulate(decompose(g, 0), HW)
    assert after.comm_us <= after.compute_us  # the premise: communication fits behind compute
    assert before.exposed_comm_us > 0.05 * before.comm_us
    assert after.makespan_us < before.makespan_us
    # Launch order (costs/simulate.py rule b): a ring step made ready at a kernel boundary
    # waits for the matmul chunk already queued, so at most the last step stays exposed ...
    assert after.exposed_comm_us <= _steps(after)[-1] * (1 + 1e-9)
    # ... and without that rule the ring hides completely (CommFuse's no-exposed-tail order).
    blind = dataclasses.replace(HW, contention_order=False)
    assert simulate(decompose(g, 0), blind).exposed_comm_us <= 1e-6 * after.makespan_us


def test_per_kind_order_mapping():
    g = gemm_rs()
    assert decompose(g, 0, order=XLA_ORDER) == decompose(g, 0, order="naive")
    assert decompose(ag_gemm(), 0, order=XLA_ORDER) == decompose(ag_gemm(), 0, order="commfuse")


def test_reduce_scatter_local_last_exposes_less_than_naive():
    g = gemm_rs()
    fused, naive = simulate(decompose(g, 0), HW), simulate(decompose(g, 0, order="naive"), HW)
    assert naive.exposed_comm_us > 0
    # The local chunk last leaves one ring step exposed where the naive order leaves two (a
    # step ready at a kernel boundary waits for the queued chunk: rule b) ...
    assert fused.exposed_comm_us <= 0.6 * naive.exposed_comm_us
    assert fused.makespan_us < naive.makespan_us
    # ... and none without the launch-order rule.
    blind = dataclasses.replace(HW, contention_order=False)
    fused_blind, naive_blind = (simulate(decompose(g, 0, order=o), blind) for o in ("commfuse", "naive"))
    assert fused_blind.exposed_comm_us < 0.1 * naive_blind.exposed_comm_us


def test_a_partial_matmul_is_timed_as_its_own_piece_not_the_whole_matmul():
    # Windowed einsum's n partial matmuls together cost about the whole one (the shape-based
    # matmul model would charge each piece the whole matmul if its shape were not cut).
    from lagom_jax.cluster import hardware
    from lagom_jax.costs import cost
    from lagom_jax.program.graph import StepGraph, Task

    hw = hardware.get("h100-sxm-8")
    m, n, k = 16384, 14336, 8192
    ag = Task(id=0, name="ag", kind="all-gather", bytes=n * k * 2, groups=(tuple(range(8)),), is_async=True)
    dot = Task(id=1, name="dot", kind="compute", flops=2 * m * n * k, bytes=2 * (m * k + n * k + m * n),
               deps=(0,), opcode="fusion", gemm=(1, m, n, k))
    g = decompose(StepGraph("pair", (ag, dot), num_devices=8), 0)
    blocks = [t for t in g.tasks if not t.is_collective]
    assert len(blocks) == 8 and all(t.gemm[1] * 8 == m for t in blocks)
    whole = cost.compute_time_us(dot.flops, dot.bytes, hw, gemm=dot.gemm)
    parts = sum(cost.compute_time_us(t.flops, t.bytes, hw, gemm=t.gemm) for t in blocks)
    assert whole <= parts < 1.25 * whole


def test_a_gather_reaches_its_matmul_through_one_layout_only_fusion():
    """XLA lays out a gathered operand for its dot after SPMD partitioning (a transpose fusion
    with no FLOPs between them); windowed einsum decided on the pair before that."""
    g = StepGraph("ag-transpose-gemm", (
        c(0, "x"),
        coll(1, "ag", "all-gather", 64 * MiB, [0]),
        c(2, "transpose", [1], flops=0.0, nbytes=128 * MiB),
        c(3, "dot", [0, 2], flops=4e12, nbytes=64 * MiB),
        c(4, "y", [3]),
    ), num_devices=8)
    assert [(p.collective, p.compute) for p in eligible_pairs(g, 0)] == [(1, 3)]
    # Two data-moving steps apart is no longer the operand the dot was partitioned with.
    g2 = StepGraph("ag-two-copies-gemm", (
        c(0, "x"),
        coll(1, "ag", "all-gather", 64 * MiB, [0]),
        c(2, "transpose", [1], flops=0.0),
        c(3, "copy", [2], flops=0.0),
        c(4, "dot", [0, 3], flops=4e12, nbytes=64 * MiB),
    ), num_devices=8)
    assert eligible_pairs(g2, 0) == ()


def test_a_pair_left_out_does_not_claim_the_matmul_another_pair_needs():
    """A dot fed by a gather over two nodes (which XLA does not window) and one inside a node:
    with the first left out (``keep``), the second is the dot's pair."""
    g = StepGraph("two-gathers-one-dot", (
        c(0, "x"),
        coll(1, "ag-wide", "all-gather", 64 * MiB, [0], groups=G8),
        coll(2, "ag-local", "all-gather", 64 * MiB, [0], groups=G4),
        c(3, "dot", [1, 2], flops=4e12, nbytes=64 * MiB),
    ), num_devices=8)
    assert [(p.collective, p.compute) for p in eligible_pairs(g, 0)] == [(1, 3)]
    local = eligible_pairs(g, 0, keep=lambda t: t.name == "ag-local")
    assert [(p.collective, p.compute) for p in local] == [(2, 3)]
    assert len([t for t in decompose_rewrite(g, 0, keep=lambda t: t.name == "ag-local").graph.tasks
                if t.kind == "collective-permute"]) == 3


def test_windowed_einsum_keeps_its_rings_inside_one_nvlink_domain():
    """``Evaluator.windowed_pairs`` on two nodes of 8: XLA windows a gather whose ring stays in a
    node, never one across nodes, and the cross-node gather does not claim the dot both feed."""
    from lagom_jax.search import Space
    from lagom_jax.search.evaluator import Evaluator

    two_nodes = hardware.get("h100-sxm-8").with_nodes(2)
    g16, per_node = (tuple(range(16)),), (tuple(range(8)), tuple(range(8, 16)))

    def step(*gathers):
        tasks = [c(0, "x")] + [coll(1 + i, name, "all-gather", 64 * MiB, [0], groups=groups)
                               for i, (name, groups) in enumerate(gathers)]
        dot = c(len(tasks), "dot", list(range(1, len(tasks))), flops=4e12, nbytes=64 * MiB)
        return StepGraph("two-nodes", (*tasks, dot), num_devices=16)

    def windowed(g):
        return [(g.tasks[p.collective].name, g.tasks[p.compute].name)
                for p in Evaluator(g, two_nodes, Space()).windowed_pairs()]

    assert windowed(step(("ag-local", per_node))) == [("ag-local", "dot")]
    assert windowed(step(("ag-wide", g16))) == []
    assert windowed(step(("ag-wide", g16), ("ag-local", per_node))) == [("ag-local", "dot")]

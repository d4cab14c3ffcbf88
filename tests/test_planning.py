"""planning.plan: one call from a step to a Plan, made from the chosen result alone."""

from __future__ import annotations

import pytest

from lagom_jax import search
from lagom_jax.cluster import hardware
from lagom_jax.plan import planning
from lagom_jax.program import jax_internals
from lagom_jax.program.graph import StepGraph, Task
from lagom_jax.program.synthetic import random_graph

HW = hardware.get("h100-sxm-8")


def test_plan_is_the_chosen_result_with_every_baseline_beside_it():
    g = random_graph(6, seed=4, name="six")
    planned = planning.plan(g, HW, fingerprint="abc")
    plan, chosen = planned.plan, planned.chosen
    assert plan.strategy == "lagom" and plan.fingerprint == "abc" and plan.module == "six"
    assert list(planned.results) == ["lagom", *planning.BASELINES]
    assert dict(plan.predicted_us) == {n: r.makespan_us for n, r in planned.results.items()}
    assert chosen is search.run_strategy("lagom", g, HW)
    assert [c.params for c in plan.collectives] == [e.params for e in chosen.explanations]
    assert [c.why for c in plan.collectives] == [e.reason for e in chosen.explanations]
    assert plan.evaluations == chosen.evaluations and plan.bound_us == chosen.bound_us
    with pytest.raises(ValueError, match="unknown strategy"):
        planning.plan(g, HW, strategy="fastest")


def test_collectives_sharing_a_name_keep_their_own_explanations():
    # Unrolled loop copies of one instruction share its name; each row must still be its own.
    tasks = [Task(0, "gemm", "compute", flops=4e11, bytes=1e6)]
    for i in range(4):
        ar, gemm = len(tasks), len(tasks) + 1
        tasks.append(Task(ar, "ar", "all-reduce", bytes=(8 << 20) * (i + 1), groups=(tuple(range(8)),),
                          deps=(ar - 1,), iteration=i, trip_count=4))
        tasks.append(Task(gemm, "gemm", "compute", flops=4e11, bytes=1e6, deps=(ar,), iteration=i, trip_count=4))
    g = StepGraph("loop", tuple(tasks), 8)
    planned = planning.plan(g, HW, strategy="autoccl", baselines=())
    rows = [c for c in planned.plan.collectives if c.name == "ar"]
    assert len(rows) == 4
    assert len({c.why for c in rows}) == 4  # each names its own size's times


def test_empty_replica_groups_count_every_device():
    g = StepGraph("all", (Task(0, "x", "compute", flops=1e9), Task(1, "ar", "all-reduce", bytes=1 << 20, deps=(0,))), 16)
    (row,) = planning.plan(g, hardware.get("a100-sxm-8", nodes=2), baselines=()).plan.collectives
    assert (row.group_size, row.nodes) == (16, 2)


def test_a_moved_jax_internal_is_named():
    class Lowered:
        def compiler_ir(self, dialect):
            raise AssertionError("not reached")

    with pytest.raises(jax_internals.JaxInternalsError, match="_lowering.*checked it with jax"):
        jax_internals.compile_for_devices(Lowered(), lambda n: [])


def test_plan_says_how_small_a_gain_it_ignores():
    from lagom_jax.plan.schema import Plan

    g = random_graph(6, seed=4, name="six")
    plan = planning.plan(g, HW).plan
    # By default the floor is the model's measured error for the collective's size and span.
    assert plan.min_gain is None and search.Space().min_gain is None
    assert ("20% below 1 MiB, 8% at 1 MiB-64 MiB, 2% from 64 MiB inside a node; "
            "32% below 1 MiB, 16% at 1 MiB-64 MiB, 2% from 64 MiB across nodes") in plan.report(width=None)
    assert Plan.from_json(plan.to_json()) == plan
    fixed = planning.plan(g, HW, space=search.Space(min_gain=0.15)).plan
    assert fixed.min_gain == 0.15 and "exceeds 15% of its own time" in fixed.report(width=None)
    # The baselines take no such decision, and a search that takes every gain says none.
    assert planning.plan(g, HW, strategy="autoccl", baselines=()).plan.min_gain == 0
    eager = planning.plan(g, HW, space=search.Space(min_gain=0.0)).plan
    assert "of its own time" not in eager.report() and "measured error" not in eager.report()


def test_a_kind_xla_left_apart_at_its_default_stays_as_compiled_in_every_strategy():
    """A module where XLA left collectives apart that the combine pass would merge at the
    same threshold (jaxlib 0.12's pipelined reduce-scatters): the plan keeps them as
    compiled, predicts no threshold for them, and says why."""
    from lagom_jax.cluster import hardware
    from lagom_jax.program.graph import StepGraph, Task

    g8 = (tuple(range(8)),)
    tasks = [Task(id=0, name="bwd0", kind="compute", flops=1e9, bytes=1e6)]
    for i in range(3):  # three 4-MiB gradient reduce-scatters, each after its own backward
        tasks.append(Task(id=len(tasks), name=f"rs{i}", kind="reduce-scatter", bytes=4 << 20,
                          deps=(len(tasks) - 1,), groups=g8, is_async=True))
        tasks.append(Task(id=len(tasks), name=f"bwd{i + 1}", kind="compute", flops=1e9, bytes=1e6,
                          deps=(len(tasks) - 2,)))
    tasks.append(Task(id=len(tasks), name="update", kind="compute", flops=1e8, bytes=1e6,
                      deps=(1, 3, 5, len(tasks) - 1)))
    step = StepGraph("compiled", tuple(tasks), num_devices=8)
    hw = hardware.get("h100-sxm-8")
    space, kept = planning.module_space(step)
    assert space.default_combine_kinds == ("reduce-scatter",)
    assert [k for k, _ in kept] == ["reduce-scatter combine threshold"] and "3 reduce-scatters" in kept[0][1]
    planned = planning.plan(step, hw, strategy="lagom", space=space)
    for result in planned.results.values():
        assert len([t for t in result.graph.collectives if t.kind == "reduce-scatter"]) == 3
    assert not [f for f in planned.plan.flags if "reduce_scatter_combine" in f.name]
    # Without it the pass merges them, which is what the module shows XLA did not do.
    unfixed = planning.plan(step, hw, strategy="xla-default", baselines=())
    assert len(unfixed.chosen.graph.collectives) == 1

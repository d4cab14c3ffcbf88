"""StepGraph construction: FLOPs, bytes, collectives, loops, async pairs, analysis."""

from __future__ import annotations

import json
import pathlib
import re

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from test_hlo import STRATEGIES, compiled_steps  # noqa: F401  (module-scoped fixture)

from lagom_jax.cli import example_text
from lagom_jax.plan import report
from lagom_jax.program import graph, hlo

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hlo"


def fixture_graph(name: str, **kw) -> graph.StepGraph:
    return graph.from_hlo_text((FIXTURES / name).read_text(), **kw)


# ----------------------------------------------------------------------------- real modules


@pytest.fixture(scope="module")
def compiled_scan():
    """A 6-layer scanned MLP train step, FSDP+TP sharded: a while loop full of collectives."""
    auto = jax.sharding.AxisType.Auto
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(auto, auto))

    def loss(ws, x):
        h, _ = jax.lax.scan(lambda h, w: (jnp.tanh(h @ w), None), x, ws)
        return jnp.mean(h**2)

    def step(ws, x):
        value, g = jax.value_and_grad(loss)(ws, x)
        return ws - 0.1 * g, value

    ws = jax.ShapeDtypeStruct((6, 64, 64), jnp.float32,
                              sharding=NamedSharding(mesh, P(None, "data", "model")))
    x = jax.ShapeDtypeStruct((32, 64), jnp.float32, sharding=NamedSharding(mesh, P("data")))
    return jax.jit(step).lower(ws, x).compile()


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_flops_agree_with_xla_cost_analysis(compiled_steps, strategy):  # noqa: F811
    compiled = compiled_steps[strategy]
    g = graph.from_hlo_text(compiled.as_text())
    expected = compiled.cost_analysis()["flops"]
    assert g.total_flops == pytest.approx(expected, rel=0.05)


def test_loop_flops_agree_with_xla_and_count_trips(compiled_scan):
    text = compiled_scan.as_text()
    once = graph.from_hlo_text(text, unroll_loops=False)
    unrolled = graph.from_hlo_text(text)
    # XLA's HloCostAnalysis counts a while body once, whatever its trip count.
    assert sum(t.flops for t in once.tasks) == pytest.approx(
        compiled_scan.cost_analysis()["flops"], rel=0.05
    )
    in_loop = [t for t in once.tasks if t.trip_count > 1]
    assert in_loop and {t.trip_count for t in in_loop} == {6}
    assert unrolled.total_flops == pytest.approx(sum(t.flops * t.trip_count for t in once.tasks))
    copies = [t for t in unrolled.tasks if t.name == in_loop[0].name]
    assert [t.iteration for t in copies] == list(range(6))


_XLA_COLLECTIVES = {
    "kAllReduce": "all-reduce", "kAllGather": "all-gather", "kReduceScatter": "reduce-scatter",
    "kAllToAll": "all-to-all", "kCollectivePermute": "collective-permute",
}
_GROUPS_RE = re.compile(
    r"replica_groups=(mesh\[[^\]]*\] \{[^}]*\}|\[[\d,]*\]<=\[[\d,]*\](?:T\([\d,]*\))?"
    r"|\{(?:\{[\d,]*\},?)*\})"
)


def _xla_inventory(compiled) -> list[tuple[str, str, int]]:
    """(name, kind, group size) of every collective in jaxlib's structured module."""
    (module,) = compiled.runtime_executable().hlo_modules()
    out = []
    for comp in module.computations():
        for inst in comp.instructions():
            kind = _XLA_COLLECTIVES.get(inst.opcode.name)
            if kind is None:
                continue
            groups = hlo.parse_replica_groups(_GROUPS_RE.search(inst.to_string()).group(1))
            out.append((inst.name, kind, len(groups[0]) if groups else 8))
    return sorted(out)


def test_collective_inventory_agrees_with_jaxlib(compiled_steps, compiled_scan):  # noqa: F811
    for compiled in [*compiled_steps.values(), compiled_scan]:
        g = graph.from_hlo_text(compiled.as_text(), unroll_loops=False)
        ours = sorted((t.name, t.kind, t.ranks(g.num_devices)) for t in g.collectives)
        assert ours == _xla_inventory(compiled)


def test_dp_allreduce_bytes_and_groups(compiled_steps):  # noqa: F811
    g = graph.from_hlo_text(compiled_steps["dp"].as_text())
    (ar,) = g.collectives
    # Gradients of both weights (64×128 and 128×64 f32) plus the f32 loss, combined.
    assert ar.kind == "all-reduce" and ar.bytes == 2 * 64 * 128 * 4 + 4
    assert ar.groups == ((0, 2, 4, 6), (1, 3, 5, 7)) and not ar.is_async
    # A synchronous collective is waited on by the very next task.
    assert ar.done_before == ar.id + 1
    assert all(d < ar.id for d in ar.deps) and ar.deps


# ----------------------------------------------------------------------------- GPU fixtures


def test_async_collectives_of_gpu_fixture():
    g = fixture_graph("gpu_collectives.hlo")
    by_name = {t.name: t for t in g.tasks}
    assert [t.name for t in g.tasks] == [
        "cublas-gemm.0", "all-reduce-start", "collective-permute-start", "all-to-all-start",
        "all-gather-start", "scaled",
    ]
    gemm = by_name["cublas-gemm.0"]
    assert gemm.flops == 2 * 8 * 128 * 256 and gemm.dtype == "f32"
    colls = {t.kind: t for t in g.collectives}
    assert set(colls) == set(graph.COLLECTIVE_KINDS) - {"reduce-scatter"}
    assert all(t.is_async and t.done_before == by_name["scaled"].id for t in colls.values())
    assert colls["all-gather"].bytes == 16 * 128 * 4  # the gathered total
    assert colls["all-reduce"].bytes == 8 * 128 * 4
    assert colls["all-to-all"].bytes == 2 * 8 * 8 * 16 * 2 and colls["all-to-all"].ranks(g.num_devices) == 4
    cp = colls["collective-permute"]
    assert cp.pairs[0] == (0, 1) and cp.ranks(g.num_devices) == 2 and cp.groups == ()
    # Dependencies flow through get-tuple-element to the gemm; -done feeds the consumer;
    # control-predecessors count as dependencies.
    assert colls["all-reduce"].deps == (gemm.id,)
    assert by_name["scaled"].deps == (colls["all-reduce"].id, colls["all-gather"].id)
    assert g.consumers[gemm.id] == (1, 2, 4)


def test_nested_loops_unroll_with_product_trip_counts():
    g = fixture_graph("gpu_bare_names.hlo")
    ar = [t for t in g.tasks if t.kind == "all-reduce"]
    cp = [t for t in g.tasks if t.kind == "collective-permute"]
    assert len(ar) == 6 and {t.trip_count for t in ar} == {6}
    assert [t.iteration for t in ar] == list(range(6))
    assert len(cp) == 2 and [t.iteration for t in cp] == [0, 1]
    # Iteration k+1 of the inner loop consumes iteration k's all-reduce.
    mms = [t for t in g.tasks if t.name == "mm"]
    assert mms[1].deps == (ar[0].id,)
    conv = next(t for t in g.tasks if t.name == "conv")
    assert conv.flops == 2 * (4 * 8 * 8 * 16) * (3 * 3 * 3)
    once = fixture_graph("gpu_bare_names.hlo", unroll_loops=False)
    assert len(once.tasks) < len(g.tasks)
    assert sum(t.flops * t.trip_count for t in once.tasks) == pytest.approx(g.total_flops)


def test_max_tasks_guards_unrolling():
    with pytest.raises(ValueError, match="unroll_loops=False"):
        fixture_graph("gpu_bare_names.hlo", max_tasks=10)


def test_example_graph_is_a_gpt_step():
    g = graph.from_hlo_text(example_text())
    kinds = [t.kind for t in g.collectives]
    assert kinds.count("all-gather") == 24 and kinds.count("reduce-scatter") == 12
    assert kinds.count("all-reduce") == 2
    # Weight gathers are prefetched: the gather of layer k is waited on inside layer k.
    ag = [t for t in g.collectives if t.kind == "all-gather"]
    assert all(t.is_async and t.done_before is not None and t.done_before > t.id for t in ag)
    # 12 layers of (qkv, out, up, down) gemms on 4096 tokens, forward only:
    fwd_gemm = 2 * 4096 * 1024 * (3072 + 1024 + 4096) + 2 * 4096 * 4096 * 1024
    gemm_fwd = sum(t.flops for t in g.tasks if t.opcode == "custom-call" and t.trip_count == 12
                   and t.name in {"cublas-gemm.1", "cublas-gemm.2", "cublas-gemm.3", "cublas-gemm.4"})
    assert gemm_fwd == 12 * fwd_gemm
    assert g.num_devices == 8
    wide = next(t for t in g.collectives if t.name == "all-reduce-start.1")
    assert wide.crosses_nodes(4) and not wide.crosses_nodes(8) and wide.nodes_spanned(2) == 4


# ----------------------------------------------------------------------------- analyze


def test_analyze_json_contract():
    result = report.analyze(hlo.parse(example_text()))
    json.dumps(result)
    assert set(result) == {"module", "collectives", "compute"}
    assert result["module"] == "jit_train_step"
    assert set(result["compute"]) == {"flops", "bytes"}
    assert all(isinstance(v, float) for v in result["compute"].values())
    for c in result["collectives"]:
        assert set(c) == {"name", "kind", "bytes", "group_size", "trip_count", "async"}
        assert c["kind"] in graph.COLLECTIVE_KINDS
        assert isinstance(c["bytes"], int) and isinstance(c["async"], bool)
    by_name = {c["name"]: c for c in result["collectives"]}
    assert by_name["all-gather-start"]["trip_count"] == 12
    assert by_name["all-gather-start"]["bytes"] == 2 * 1024 * (3072 + 1024 + 4096) + 2 * 4096 * 1024
    assert by_name["reduce-scatter-start"]["kind"] == "reduce-scatter"
    assert by_name["all-reduce-start"]["bytes"] == 4
    assert result["compute"]["flops"] == pytest.approx(graph.from_hlo_text(example_text()).total_flops)


def test_format_analysis_lists_every_collective():
    result = report.analyze(hlo.parse((FIXTURES / "gpu_collectives.hlo").read_text()))
    table = report.format_analysis(result, nodes_of={"all-reduce-start": 2})
    for c in result["collectives"]:
        assert c["name"] in table
    assert "nodes" in table.splitlines()[1]
    assert "compute:" in table


def test_conditional_charges_its_most_expensive_branch():
    text = """HloModule c
b1 {
  p1 = f32[4]{0} parameter(0)
  ROOT n1 = f32[4]{0} negate(p1)
}
b2 {
  p2 = f32[4]{0} parameter(0)
  e2 = f32[4]{0} exponential(p2)
  ROOT m2 = f32[4]{0} multiply(e2, e2)
}
ENTRY e {
  i = s32[] parameter(0)
  x = f32[4]{0} parameter(1)
  ROOT c = f32[4]{0} conditional(i, x, x), branch_computations={b1, b2}
}
"""
    (task,) = graph.from_hlo_text(text).tasks
    assert task.opcode == "conditional" and task.flops == 8.0 and task.bytes == 4 + 3 * 16


def _conditional_module(branches: int) -> str:
    names = ", ".join(f"b{k}" for k in range(branches))
    bodies = "".join(f"""b{k} {{
  p{k} = f32[1024]{{0}} parameter(0)
  ROOT r{k} = f32[1024]{{0}} all-reduce(p{k}), replica_groups={{{{0,1,2,3}}}}, to_apply=add
}}
""" for k in range(branches))
    args = ", ".join(["x"] * branches)
    return f"""HloModule c
add {{
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}}
{bodies}ENTRY e {{
  i = s32[] parameter(0)
  x = f32[1024]{{0}} parameter(1)
  ROOT c = f32[1024]{{0}} conditional(i, {args}), branch_computations={{{names}}}
}}
"""


def test_a_conditional_of_one_branch_runs_it_and_one_of_several_is_named_unpriced():
    from lagom_jax.program import custom_calls

    (ar,) = graph.from_hlo_text(_conditional_module(1)).tasks  # the branch's all-reduce, priced as one
    assert ar.kind == "all-reduce" and ar.bytes == 4096 and ar.groups == ((0, 1, 2, 3),)
    (task,) = graph.from_hlo_text(_conditional_module(2)).tasks
    assert task.kind == "compute" and task.kernel == "unpriced"
    missing = custom_calls.unpriced((task,))
    assert missing == {custom_calls.CONDITIONAL_WITH_COLLECTIVES: 1}
    assert "collectives are not priced" in custom_calls.describe_unpriced(missing)


IN_PLACE = """HloModule m
%dus (p0: f32[64,8], p1: f32[1,8], p2: s32[]) -> f32[64,8] {
  %p0 = f32[64,8]{1,0} parameter(0)
  %p1 = f32[1,8]{1,0} parameter(1)
  %p2 = s32[] parameter(2)
  %z = s32[] constant(0)
  ROOT %d = f32[64,8]{1,0} dynamic-update-slice(%p0, %p1, %p2, %z)
}
%ds (q0: f32[64,8], q1: s32[]) -> f32[1,8] {
  %q0 = f32[64,8]{1,0} parameter(0)
  %q1 = s32[] parameter(1)
  %z = s32[] constant(0)
  %s = f32[1,8]{1,0} dynamic-slice(%q0, %q1, %z), dynamic_slice_sizes={1,8}
  ROOT %n = f32[1,8]{1,0} negate(%s)
}
ENTRY %e (a: f32[64,8], b: f32[1,8], i: s32[]) -> (f32[64,8], f32[1,8], f32[64,8]) {
  %a = f32[64,8]{1,0} parameter(0)
  %b = f32[1,8]{1,0} parameter(1)
  %i = s32[] parameter(2)
  %f = f32[64,8]{1,0} fusion(%a, %b, %i), kind=kLoop, calls=%dus
  %g = f32[1,8]{1,0} fusion(%a, %i), kind=kLoop, calls=%ds
  %h = f32[64,8]{1,0} add(%a, %a)
  ROOT %t = (f32[64,8]{1,0}, f32[1,8]{1,0}, f32[64,8]{1,0}) tuple(%f, %g, %h)
}
"""


def test_in_place_updates_and_slices_move_only_the_window():
    tasks = {t.name: t for t in graph.from_hlo_text(IN_PLACE).tasks}
    row, index = 8 * 4, 4
    assert tasks["f"].bytes == row + index + row  # read the update, write it in place
    assert tasks["g"].bytes == row + index + row  # read the slice, write the result
    assert tasks["h"].bytes == 3 * 64 * 8 * 4  # elementwise: two reads, one write


NORMALISED = """HloModule m
%dus (p0: s32[], p1: bf16[64,8], p2: bf16[1,8]) -> bf16[64,8] {
  %p1 = bf16[64,8]{1,0} parameter(1)
  %c1 = f32[64,8]{1,0} convert(%p1)
  %p2 = bf16[1,8]{1,0} parameter(2)
  %c2 = f32[1,8]{1,0} convert(%p2)
  %p0 = s32[] parameter(0)
  %z = s32[] constant(0)
  %d = f32[64,8]{1,0} dynamic-update-slice(%c1, %c2, %p0, %z)
  ROOT %r = bf16[64,8]{1,0} convert(%d)
}
%ds (q0: bf16[64,8], q1: s32[]) -> f32[1,8] {
  %q0 = bf16[64,8]{1,0} parameter(0)
  %c = f32[64,8]{1,0} convert(%q0)
  %q1 = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %s = f32[1,8]{1,0} dynamic-slice(%c, %q1, %z), dynamic_slice_sizes={1,8}
}
ENTRY %e (a: bf16[64,8], b: bf16[1,8], i: s32[]) -> (bf16[64,8], f32[1,8]) {
  %a = bf16[64,8]{1,0} parameter(0)
  %b = bf16[1,8]{1,0} parameter(1)
  %i = s32[] parameter(2)
  %f = bf16[64,8]{1,0} fusion(%i, %a, %b), kind=kLoop, calls=%dus
  %g = f32[1,8]{1,0} fusion(%a, %i), kind=kLoop, calls=%ds
  ROOT %t = (bf16[64,8]{1,0}, f32[1,8]{1,0}) tuple(%f, %g)
}
"""


def test_in_place_is_seen_through_dtype_conversions():
    # XLA:CPU wraps bf16 updates in f32 converts; a GPU compile updates bf16 in place.
    tasks = {t.name: t for t in graph.from_hlo_text(NORMALISED).tasks}
    row_bf16, index = 8 * 2, 4
    assert tasks["f"].bytes == index + row_bf16 + row_bf16
    assert tasks["g"].bytes == row_bf16 + index + 8 * 4


def test_evolve_is_replace_without_the_constructor():
    import dataclasses

    t = graph.Task(id=3, name="ag", kind="all-gather", bytes=1 << 20, groups=((0, 1),), deps=(1, 2))
    assert t.evolve(id=0, deps=(), is_async=True) == dataclasses.replace(t, id=0, deps=(), is_async=True)
    assert t.evolve().__dict__ == t.__dict__ and t.id == 3
    with pytest.raises(TypeError, match="no field"):
        t.evolve(ids=0)


def test_a_copy_of_a_task_keeps_its_collective_shape_only_while_it_is_the_same():
    t = graph.Task(id=0, name="ag", kind="all-gather", bytes=1 << 20, groups=((0, 4, 8, 9),))
    assert graph.collective_shape(t, 16, 8) == graph.CollectiveShape("all-gather", float(1 << 20), 4, 2)
    assert graph.collective_shape(t, 16, 4) == graph.CollectiveShape("all-gather", float(1 << 20), 4, 3)
    moved = t.evolve(id=5, deps=(1,))  # the same collective elsewhere in the step
    assert graph.collective_shape(moved, 16, 8).nodes == 2
    for changed, want in ((t.evolve(bytes=1 << 10), graph.CollectiveShape("all-gather", 1024.0, 4, 2)),
                          (t.evolve(groups=((0, 1),)), graph.CollectiveShape("all-gather", float(1 << 20), 2, 1)),
                          (t.evolve(kind="all-reduce"), graph.CollectiveShape("all-reduce", float(1 << 20), 4, 2))):
        assert graph.collective_shape(changed, 16, 8) == want
    assert graph.collective_shape(t, 16, 8).bytes == 1 << 20  # the original's kept shape is untouched
    assert "_collective_shapes" not in repr(t) and t == graph.Task(id=0, name="ag", kind="all-gather",
                                                                    bytes=1 << 20, groups=((0, 4, 8, 9),))

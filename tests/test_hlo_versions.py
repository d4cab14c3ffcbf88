"""The StepGraph counts every collective that jax 0.11 and 0.12 put in an XLA:GPU module.

The modules are ``tests/fixtures/hlo/jax-0.11/`` and ``jax-0.12/`` (optimized HLO of
deviceless compiles for H100s; ``make_version_fixtures.py`` made them, the README.md in each
folder says how). Read as text, so these tests run on any installed JAX.

Every expected number below is a hand count from the fixture text, not the reader's output:
counts by ``grep -c ' OPCODE(' FILE`` (a ``-start`` counted, never its ``-done``; a Triton
collective fusion by ``grep -c 'fusion-start(.*"kind":"__triton_collective"'``, its
all-reduce being the one ``grep -c ' all-reduce('`` finds, inside the fused computation),
bytes from the shapes printed on those lines in NCCL's ``nBytes`` convention
(``graph.Task.bytes``): the gathered output of an all-gather, the unscattered input of a
reduce-scatter (the printed output times the group size for a synchronous one), the
buffer of the others. bf16 and s32/f32 elements are 2 and 4 bytes.
"""

from __future__ import annotations

import collections
import functools
import pathlib

import pytest

from lagom_jax.program import graph

FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "hlo"

# (kind, opcode of the task) -> (count, bytes). The same steps give the same collectives
# on 0.11.2 and 0.12.0.1 (the fusions and names around them differ), so one count serves both.
EXPECTED = {
    # 8 devices, one group {0..7}.
    "fsdp_mlp_8": {
        # all-gather.2 -> 3 x bf16[256,256] = 3 x 131072; dot_general.8 and .9 -> bf16[64,256]
        # = 32768 each.
        ("all-gather", "all-gather"): (3, 3 * 131072 + 2 * 32768),
        # select_n.2, select_n.3: bf16[8,8,32] = 4096 each.
        ("all-to-all", "all-to-all"): (2, 2 * 4096),
        # reduce-scatter-start: 3 x bf16[256,256] in.
        ("reduce-scatter", "reduce-scatter-start"): (1, 3 * 131072),
        # fusion-start (Triton collective fusion) of %fused_reduce_sum.15.clone: f32[] all-reduce.
        ("all-reduce", "fusion-start"): (1, 4),
    },
    # 16 devices (2 nodes), one fsdp group; two of the collectives sit in scan bodies.
    "llama_fsdp_16": {
        # all-gather-start, all-gather-start.1 (the two while bodies): out bf16[32,64] x 3,
        # [32,8,4], [32,4,8], [32,2,8] x 2 = 9216 elements = 18432 each.
        ("all-gather", "all-gather-start"): (2, 2 * 18432),
        # all-gather.37: (s32[16,16], bf16[32,128]) = 1024 + 8192.
        ("all-gather", "all-gather"): (1, 9216),
        # reduce-scatter-start: in bf16[32,8,2] x 2, [32,4,8], [32,8,4], [32,64] x 3 = 9216
        # elements = 18432; reduce-scatter-start.1: bf16[32,128] = 8192.
        ("reduce-scatter", "reduce-scatter-start"): (2, 18432 + 8192),
        # all-to-all-start: f32[16,1,16,2] = 2048; all-to-all-start.1: bf16[1,16,16,2] = 1024.
        ("all-to-all", "all-to-all-start"): (2, 2048 + 1024),
        # all-reduce-start: f32[161].
        ("all-reduce", "all-reduce-start"): (1, 644),
    },
    # 8 devices as fsdp=2 x expert=4.
    "mixtral_ep_8": {
        # all-gather-start, .1 (while bodies): out bf16[32,64] x 3, [32,8,4], [32,4,8],
        # [32,2,8] x 2 (9216 elements, 18432) + f32[32,4] (512) = 18944 each;
        # all-gather-start.2: bf16[8,16,32] = 8192.
        ("all-gather", "all-gather-start"): (3, 2 * 18944 + 8192),
        # all-gather.50: (s32[2,16], bf16[32,128]) = 128 + 8192.
        ("all-gather", "all-gather"): (1, 8320),
        # all-reduce-start bf16[1536] = 3072, .1 f32[161] = 644, .2 f32[2176] = 8704.
        ("all-reduce", "all-reduce-start"): (3, 3072 + 644 + 8704),
        # fusion-start (Triton collective fusion) of %fused_all-reduce.17.0.clone: bf16[16,128].
        ("all-reduce", "fusion-start"): (1, 4096),
        # all-to-all.5.2, .7.2: bf16[4,1,1,1,10,32] = 2560 each; all-to-all.4.2:
        # f32[1,2,1,16,16] = 2048.
        ("all-to-all", "all-to-all"): (3, 2 * 2560 + 2048),
        # all-to-all-start, .1 and .3 (two of them): bf16[1,1,4,1,10,32] = 2560 each.
        ("all-to-all", "all-to-all-start"): (2, 2 * 2560),
        # Groups of 2 ({'axis_0'}): reduce-scatter.4.2 out f32[16,4] -> in 512;
        # reduce-scatter.12 out bf16[2,8,16] x 2, [8,4,16], [4,8,16], [1,64,16] x 3 (4608
        # elements) -> in 18432; reduce-scatter.8.2 out bf16[16,128] -> in 8192.
        ("reduce-scatter", "reduce-scatter"): (3, 512 + 18432 + 8192),
        # collective-permute.4: s32[1,16,1] = 64; collective-permute-start.1:
        # f32[1,1,16,32] = 2048.
        ("collective-permute", "collective-permute"): (1, 64),
        ("collective-permute", "collective-permute-start"): (1, 2048),
    },
}
VERSIONS = ("jax-0.11", "jax-0.12")
CASES = [(v, step) for v in VERSIONS for step in EXPECTED]


@functools.cache
def _text(version: str, step: str) -> str:
    return (FIXTURES / version / f"{step}.hlo").read_text()


@functools.cache
def _graph(version: str, step: str) -> graph.StepGraph:
    # Not unrolled: every collective instruction is one task, as the hand count counts them.
    return graph.from_hlo_text(_text(version, step), unroll_loops=False)


@pytest.mark.parametrize(("version", "step"), CASES)
def test_every_collective_is_counted_with_its_kind_and_bytes(version, step):
    found: dict[tuple[str, str], list] = collections.defaultdict(lambda: [0, 0.0])
    for t in _graph(version, step).collectives:
        found[(t.kind, t.opcode)][0] += 1
        found[(t.kind, t.opcode)][1] += t.bytes
    assert {k: tuple(v) for k, v in found.items()} == EXPECTED[step]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("step", "groups"), [
    ("fsdp_mlp_8", ((0, 1, 2, 3, 4, 5, 6, 7),)),
    # replica_groups=mesh['axis_0'=2,'axis_1'=4] {'axis_1'}
    ("mixtral_ep_8", ((0, 1, 2, 3), (4, 5, 6, 7))),
])
def test_a_triton_collective_fusion_is_an_async_all_reduce_marked_as_such(version, step, groups):
    text = _text(version, step)
    assert text.count('"kind":"__triton_collective"') == 2  # fusion-start and fusion-done
    assert "KERNEL_STRATEGY_TRITON_ONE_SHOT" in text
    g = _graph(version, step)
    (fused,) = [t for t in g.tasks if t.opcode == "fusion-start" and t.is_collective]
    assert fused.kind == "all-reduce" and fused.kernel == graph.TRITON_COLLECTIVE
    assert fused.is_async and fused.groups == groups and fused.reduction == "add"
    # Waited for where its fusion-done is: at a compute task after it.
    assert fused.done_before is not None and fused.done_before > fused.id
    assert not g.tasks[fused.done_before].is_collective
    # Only the Triton fusion carries the mark; NCCL's collectives do not.
    assert [t.name for t in g.collectives if t.kernel] == [fused.name]


@pytest.mark.parametrize(("version", "step"), CASES)
def test_synchronous_collectives_block_the_next_kernel(version, step):
    g = _graph(version, step)
    sync = [t for t in g.collectives if t.opcode == t.kind]
    assert sync and not any(t.is_async for t in sync)
    for t in sync:
        after = next(c.id for c in g.tasks[t.id + 1:] if not c.is_collective)
        assert t.done_before == after, t.name
    # The simulator's contract for every collective: a wait lands on a compute task.
    for t in g.collectives:
        assert t.done_before is None or not g.tasks[t.done_before].is_collective, t.name


_SYNC_TRITON = """\
HloModule sync_triton, is_scheduled=true, num_partitions=4

add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

fused_ar {
  p = f32[1024]{0} parameter(0)
  ROOT ar = f32[1024]{0} all-reduce(p), channel_id=1, replica_groups={{0,1,2,3}}, use_global_device_ids=true, to_apply=add
}

ENTRY main {
  x = f32[1024]{0} parameter(0)
  y = f32[1024]{0} fusion(x), kind=kCustom, calls=fused_ar, backend_config={"fusion_backend_config":{"kind":"__triton_collective"}}
  ROOT z = f32[1024]{0} negate(y)
}
"""


def test_a_synchronous_triton_collective_fusion_blocks():
    g = graph.from_hlo_text(_SYNC_TRITON)
    (ar,) = g.collectives
    assert (ar.kind, ar.opcode, ar.bytes, ar.kernel) == ("all-reduce", "fusion", 4096.0, graph.TRITON_COLLECTIVE)
    assert not ar.is_async and ar.groups == ((0, 1, 2, 3),)
    assert g.tasks[ar.done_before].name == "z"

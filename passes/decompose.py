"""``decompose``: CommFuse / collective matmul, as a what-if pass.

An all-gather feeding a matmul, or a matmul feeding a reduce-scatter, can run as a ring
of ``n - 1`` peer-to-peer steps over the group of ``n`` ranks with the matmul cut into
``n`` blocks, so that every step's transfer hides behind one block of compute. XLA does
this in the SPMD partitioner under ``xla_gpu_threshold_for_windowed_einsum_mib``
(openxla/xla ``xla/service/spmd/dot_handler.cc``; flag help in ``xla/debug_options_flags.cc``:
0 turns every eligible all-gather+dot and dot+reduce-scatter into a loop of
collective-permutes and dots). CommFuse (arXiv 2604.24013, "CommFuse: Hiding Tail Latency
via Communication Decomposition and Fusion for Distributed LLM Training") adds the order
that leaves no communication tail:

* all-gather + matmul: compute the block this rank already holds first, then each block
  as it arrives (block ``i`` waits for step ``i - 1``);
* matmul + reduce-scatter: compute the block that *stays* on this rank last: step ``i``
  sends the partial sum of block ``i`` (plus what it received at step ``i - 1``), and the
  staying block's matmul runs while the last step is in flight ("the final compute step
  does not wait on communication"); only the users wait for both (the add of the
  received sum is an epilogue, not modelled as a task).

``order="naive"`` is the chunked order of frameworks that slice data without that
schedule (Megatron-style chunking; the "tail latency" of CommFuse, arXiv 2604.24013): the
all-gather side computes the arrived blocks first and the local one last, so its first
transfer is exposed; the reduce-scatter side computes the local block first and ends on
a transfer, the exposed tail.

Sizes follow the ring: each step moves ``bytes / n`` (one block, NCCL's nBytes of a
collective-permute), each block does ``flops / n`` and moves ``bytes / n`` of HBM. An
all-reduce after a matmul (tensor parallelism without sequence parallelism, where it is
reduce-scatter + all-gather) is decomposed on its reduce-scatter half; the all-gather
half stays a collective of the full buffer. XLA's windowed einsum has no all-reduce form,
so only explicitly named all-reduces are decomposed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Literal

from lagom_jax.program.graph import StepGraph, Task

from .rewrite import Node, Rewrite, identity_nodes, rebuild

Order = Literal["commfuse", "naive"]
ORDERS = ("commfuse", "naive")
DECOMPOSABLE_KINDS = ("all-gather", "reduce-scatter", "all-reduce")
# The kinds XLA's windowed einsum rewrites (openxla/xla xla/service/spmd/dot_handler.cc).
WINDOWED_EINSUM_KINDS = ("all-gather", "reduce-scatter")
# What XLA's windowed einsum loops do, as far as the sources say: the all-gather loop
# starts on the local shard (jax docs/notebooks/shard_map.md, matmul_allgather_overlapped),
# the reduce-scatter loop ends on a transfer, leaving a tail exposed (NVIDIA/JAX-Toolbox
# docs/blog/collective-gemms.md; CommFuse, arXiv 2604.24013).
XLA_ORDER: Mapping[str, Order] = {
    "all-gather": "commfuse", "reduce-scatter": "naive", "all-reduce": "naive",
}
# FLOP per byte above which a fusion is taken to hold a dot. HloCostAnalysis charges an
# elementwise op one FLOP per output element while it moves >= 2 bytes per element per
# operand (bf16), so even a fusion of a dozen elementwise ops stays below ~4 FLOP/B; an
# n x n x n bf16 matmul does n/3 FLOP/B, above 16 from n = 48 on.
MIN_DOT_FLOPS_PER_BYTE = 16.0
_DOT_OPCODES = ("dot", "convolution", "custom-call")


def is_matmul(t: Task) -> bool:
    """Whether a compute task holds a matmul (a dot, a cuBLAS gemm, or a dot fusion)."""
    if t.is_collective or t.flops <= 0:
        return False
    return t.opcode in _DOT_OPCODES or t.flops >= MIN_DOT_FLOPS_PER_BYTE * t.bytes


@dataclasses.dataclass(frozen=True)
class Pair:
    """One collective and the matmul it is fused with (consumer or producer)."""

    collective: int
    compute: int

    @property
    def origin(self) -> tuple[int, ...]:
        return tuple(sorted((self.collective, self.compute)))


def _layout_only(t: Task) -> bool:
    """A compute task that only moves data (a transpose or copy fusion: no FLOPs). XLA lays
    out a gathered operand for its dot after SPMD partitioning, where windowed einsum has
    already decided on the pair, so the pass looks through one such task."""
    return not t.is_collective and t.flops <= 0


def _partner(graph: StepGraph, t: Task) -> int | None:
    """The matmul an all-gather feeds, or that feeds a reduce-scatter / all-reduce, directly
    or through one layout-only task between them (``_layout_only``)."""
    if t.kind == "all-gather":
        users = [u for u in graph.consumers[t.id] if not graph.tasks[u].is_collective]
        direct = next((u for u in users if is_matmul(graph.tasks[u])), None)
        if direct is not None or len(users) != 1 or not _layout_only(graph.tasks[users[0]]):
            return direct
        return next((u for u in graph.consumers[users[0]] if is_matmul(graph.tasks[u])), None)
    if t.kind in ("reduce-scatter", "all-reduce"):
        producers = [d for d in t.deps if not graph.tasks[d].is_collective]
        last = max(producers, default=None)
        if last is not None and _layout_only(graph.tasks[last]):
            inner = [d for d in graph.tasks[last].deps if not graph.tasks[d].is_collective]
            last = max(inner, default=None)
        return last if last is not None and is_matmul(graph.tasks[last]) else None
    return None


def eligible_pairs(
    graph: StepGraph, ids_or_min_bytes: Iterable[int] | int = 0, *, keep: Callable[[Task], bool] | None = None
) -> tuple[Pair, ...]:
    """The pairs :func:`decompose` rewrites, in schedule order.

    With an ``int`` every all-gather and reduce-scatter of at least that many bytes whose
    consumer / producer is a matmul (XLA's windowed einsum threshold), of those ``keep``
    accepts (e.g. rings inside one node); with ids, exactly those collectives (all-reduces
    allowed), each of which must be eligible. A matmul is split for one pair only: later
    pairs that would split it again are left alone.
    """
    if isinstance(ids_or_min_bytes, int):
        wanted = [
            t for t in graph.collectives
            if t.kind in WINDOWED_EINSUM_KINDS and t.bytes >= ids_or_min_bytes and (keep is None or keep(t))
        ]
        strict = False
    else:
        wanted = []
        for i in sorted({int(i) for i in ids_or_min_bytes}):
            if not 0 <= i < len(graph.tasks) or graph.tasks[i].kind not in DECOMPOSABLE_KINDS:
                raise ValueError(
                    f"decompose: task {i} of {graph.name!r} is not an "
                    f"{'/'.join(DECOMPOSABLE_KINDS)} (pass the id of one of those)"
                )
            wanted.append(graph.tasks[i])
        strict = True
    pairs: list[Pair] = []
    claimed: set[int] = set()
    for t in wanted:
        partner = _partner(graph, t) if t.ranks(graph.num_devices) > 1 else None
        if partner is None:
            if strict:
                raise ValueError(
                    f"decompose: {t.kind} {t.name!r} (id {t.id}) has no matmul "
                    f"{'consumer' if t.kind == 'all-gather' else 'producer'} over a group of 2+ "
                    "ranks; only such pairs can be decomposed"
                )
            continue
        if partner in claimed:
            continue
        claimed.add(partner)
        pairs.append(Pair(t.id, partner))
    return tuple(pairs)


def _ring(graph: StepGraph, t: Task) -> tuple[tuple[int, int], ...]:
    """Collective-permute pairs: rank i sends to rank i + 1 (mod n) in every group."""
    groups = t.groups or (tuple(range(graph.num_devices)),)
    return tuple((g[k], g[(k + 1) % len(g)]) for g in groups for k in range(len(g)))


def _step(t: Task, i: int, n: int, pairs: tuple[tuple[int, int], ...]) -> Task:
    return dataclasses.replace(
        t, name=f"{t.name}.step{i}/{n - 1}", kind="collective-permute", opcode="collective-permute",
        bytes=t.bytes / n, flops=0.0, groups=(), pairs=pairs, is_async=True,
    )


def _block(t: Task, i: int, n: int, local: bool) -> Task:
    label = "local" if local else f"block{i}"
    return t.piece(f"{t.name}.{label}/{n}", n)


def decompose_rewrite(
    graph: StepGraph, ids_or_min_bytes: Iterable[int] | int = 0,
    *, order: Order | Mapping[str, Order] = "commfuse", keep: Callable[[Task], bool] | None = None
) -> Rewrite:
    """:func:`decompose`, also returning where every new task came from.

    The pieces of a pair (ring steps, blocks, an all-reduce's all-gather half) all have
    the origin ``(collective id, matmul id)`` sorted, so the steps of one ring can be
    recognised downstream (they share NCCL params: XLA emits one permute in a loop).
    """
    orders = {k: order for k in DECOMPOSABLE_KINDS} if isinstance(order, str) else dict(order)
    bad = sorted(str(o) for o in orders.values() if o not in ORDERS)
    if bad or set(orders) != set(DECOMPOSABLE_KINDS) and not isinstance(order, str):
        missing = sorted(set(DECOMPOSABLE_KINDS) - set(orders))
        raise ValueError(
            f"decompose: unknown order {', '.join(bad) or '-'}, kinds without an order {missing or '-'} "
            f"(orders: {', '.join(ORDERS)}; a mapping needs {', '.join(DECOMPOSABLE_KINDS)})"
        )
    pairs = eligible_pairs(graph, ids_or_min_bytes, keep=keep)
    if not pairs:
        return Rewrite(graph, tuple((t.id,) for t in graph.tasks))
    # refs[old id]: what a user of that task depends on now; wait[old id]: the node a
    # collective waiting before that compute task now waits before.
    refs: dict[int, tuple[Hashable, ...]] = {t.id: (t.id,) for t in graph.tasks}
    wait: dict[int, Hashable] = {t.id: t.id for t in graph.tasks}
    built: list[tuple[Pair, list[tuple[Hashable, Task, tuple, Hashable | None, tuple[float, int]]]]] = []
    for pair in pairs:
        coll, comp = graph.tasks[pair.collective], graph.tasks[pair.compute]
        n = coll.ranks(graph.num_devices)
        ring = _ring(graph, coll)
        order_here = orders[coll.kind]
        step = [("step", pair.collective, i) for i in range(n - 1)]
        block = [("block", pair.compute, i) for i in range(n)]
        # Each entry: (ref, template, deps as old ids or new refs, done_before, key)
        pieces: list[tuple[Hashable, Task, tuple, Hashable | None, tuple[float, int]]] = []
        if coll.kind == "all-gather":
            others = tuple(d for d in comp.deps if d != coll.id)
            # commfuse: block 0 is local, block i waits for step i-1.
            # naive: block i waits for step i, the local block comes last.
            arrives = {i: step[i - 1] for i in range(1, n)} if order_here == "commfuse" else {
                i: step[i] for i in range(n - 1)}
            local = 0 if order_here == "commfuse" else n - 1
            for i in range(n - 1):
                user = next(b for b, s in arrives.items() if s == step[i])
                pieces.append((step[i], _step(coll, i, n, ring), coll.deps + ((step[i - 1],) if i else ()),
                               block[user], (float(coll.id), i)))
            for i in range(n):
                deps = others + ((arrives[i],) if i in arrives else ())
                pieces.append((block[i], _block(comp, i, n, i == local), deps, None, (float(comp.id), i)))
            refs[coll.id] = (step[-1],)
            refs[comp.id] = tuple(block)
            wait[comp.id] = block[0]
        else:
            # Ring reduce-scatter: step i carries block i's partial sum plus the one
            # received at step i-1. commfuse computes the staying block last, beside the
            # last step; naive computes it first, so the step ends on a transfer.
            sent = list(range(n - 1)) if order_here == "commfuse" else list(range(1, n))
            local = n - 1 if order_here == "commfuse" else 0
            extra = tuple(d for d in coll.deps if d != comp.id)
            for i in range(n):
                pieces.append((block[i], _block(comp, i, n, i == local), comp.deps, None, (float(comp.id), 2 * i)))
            for k, b in enumerate(sent):
                deps = (block[b],) + ((step[k - 1],) if k else extra)
                pieces.append((step[k], _step(coll, k, n, ring), deps, None, (float(comp.id), 2 * b + 1)))
            # The staying block's result is its own partial sum plus the one the last step
            # brings; the add is an epilogue, so the users wait for both.
            tail: list[Hashable] = [block[local], step[-1]]
            refs[comp.id] = tuple(block)
            wait[comp.id] = block[0]
            if coll.kind == "all-reduce":
                gather = ("gather", coll.id)
                template = dataclasses.replace(coll, name=f"{coll.name}.all-gather", kind="all-gather")
                pieces.append((gather, template, tuple(tail), coll.done_before, (float(coll.id), 0)))
                refs[coll.id] = (gather,)
            else:
                refs[coll.id] = tuple(tail)
                # The users wait for the last step where they waited for the collective.
                ref, tmpl, deps, _, key = pieces[-1]
                pieces[-1] = (ref, tmpl, deps, coll.done_before, key)
        wait[coll.id] = refs[coll.id][0]
        built.append((pair, pieces))

    replaced = {p.collective for p in pairs} | {p.compute for p in pairs}

    def new_deps(deps: tuple) -> tuple[Hashable, ...]:
        out: list[Hashable] = []
        for d in deps:
            out.extend(refs[d] if isinstance(d, int) else (d,))
        return tuple(dict.fromkeys(out))

    def new_wait(d: int | Hashable | None) -> Hashable | None:
        if d is None:
            return None
        return wait[d] if isinstance(d, int) else d

    nodes: list[Node] = []
    for n0 in identity_nodes(graph):
        if n0.ref in replaced:
            continue
        nodes.append(dataclasses.replace(n0, deps=new_deps(n0.deps), done_before=new_wait(n0.done_before)))
    for pair, pieces in built:
        for ref, template, deps, done, key in pieces:
            nodes.append(Node(ref=ref, key=key, template=template, deps=new_deps(deps),
                              done_before=new_wait(done), origin=pair.origin))
    return rebuild(graph.name, graph.num_devices, nodes)


def decompose(
    graph: StepGraph, ids_or_min_bytes: Iterable[int] | int = 0,
    *, order: Order | Mapping[str, Order] = "commfuse"
) -> StepGraph:
    """Replace collective + matmul pairs by ring steps and partial matmuls.

    ``ids_or_min_bytes``: collective ids to decompose, or (``int``) a byte size: every
    all-gather / reduce-scatter at least that large with a matmul consumer / producer, as
    XLA's windowed einsum under ``xla_gpu_threshold_for_windowed_einsum_mib`` (0 = all).
    ``order`` is ``"commfuse"`` (no exposed tail) or ``"naive"`` (plain chunked order), or
    a mapping kind -> order (``XLA_ORDER`` predicts XLA's own windowed einsum).
    """
    return decompose_rewrite(graph, ids_or_min_bytes, order=order).graph

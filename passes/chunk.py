"""``chunk``: split a large collective into k pieces that pipeline with its neighbours.

This is the software pipelining XLA performs for collectives next to the computation
that produces or consumes them (collective pipeliner, windowed einsum; openxla/xla
``xla/service/collective_pipeliner.cc`` and ``xla/service/spmd/dot_handler.cc``): piece i
of the collective is sent as soon as piece i of its producer is computed, and piece i of
the consumer starts as soon as piece i arrives.
Each piece pays the collective's launch and per-step latency again, so chunking helps
only when the exposed fill/drain it removes is larger than the latency it adds - a
choice the search evaluates with the cost model.

Only the last compute producer and the first compute consumer are split, and only when
no other chunked collective claims them: a compute task split two different ways would
need a common refinement, which XLA does not produce either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterable, Mapping

from lagom_jax.program.graph import StepGraph, Task

from .rewrite import Node, Rewrite, identity_nodes, rebuild


def _factors(graph: StepGraph, ids_or_min_bytes: Iterable[int] | int, k: int) -> dict[int, int]:
    if isinstance(ids_or_min_bytes, int):
        return {t.id: k for t in graph.collectives if t.bytes >= ids_or_min_bytes}
    return {int(i): k for i in ids_or_min_bytes}


def _piece(t: Task, i: int, k: int, label: str) -> Task:
    return t.piece(f"{t.name}.{label}{i}/{k}", k)


def chunk_rewrite(graph: StepGraph, factors: Mapping[int, int]) -> Rewrite:
    """Split collective ``c`` into ``factors[c]`` pieces (1 leaves it alone)."""
    for cid, k in factors.items():
        if not 0 <= cid < len(graph.tasks) or not graph.tasks[cid].is_collective:
            raise ValueError(f"chunk: task {cid} is not a collective of graph {graph.name!r}")
        if k < 1:
            raise ValueError(f"chunk: factor for task {cid} must be >= 1, got {k}")
    factors = {c: k for c, k in factors.items() if k > 1}
    if not factors:
        return Rewrite(graph, tuple((t.id,) for t in graph.tasks))
    consumers = graph.consumers

    # Claim the producer / consumer to split with each chunked collective.
    claims: dict[int, list[int]] = {}
    for cid in factors:
        c = graph.tasks[cid]
        prods = [d for d in c.deps if not graph.tasks[d].is_collective]
        cons = [u for u in consumers[cid] if not graph.tasks[u].is_collective]
        for tid in (max(prods, default=None), min(cons, default=None)):
            if tid is not None:
                claims.setdefault(tid, []).append(cid)
    split_with = {tid: cs[0] for tid, cs in claims.items() if len(cs) == 1}
    pieces: dict[int, int] = dict(factors)
    for tid, cid in split_with.items():
        pieces[tid] = factors[cid]

    def refs(tid: int) -> tuple[Hashable, ...]:
        k = pieces.get(tid, 1)
        return (tid,) if k == 1 else tuple((tid, i) for i in range(k))

    def first(tid: int | None) -> Hashable | None:
        return None if tid is None else refs(tid)[0]

    nodes: list[Node] = []
    for n in identity_nodes(graph):
        t = graph.tasks[n.ref]
        k = pieces.get(t.id, 1)
        if k == 1:
            deps = tuple(r for d in t.deps for r in refs(d))
            nodes.append(dataclasses.replace(n, deps=deps, done_before=first(t.done_before)))
            continue
        for i in range(k):
            deps: list[Hashable] = []
            for d in t.deps:
                # Piece i of a split producer/consumer pair links piece to piece.
                paired = split_with.get(d) == t.id or split_with.get(t.id) == d
                deps.extend([(d, i)] if paired else refs(d))
            done: Hashable | None = None
            if t.id in factors:
                q = t.done_before
                if q is not None and split_with.get(q) == t.id:
                    done = (q, i)
                else:
                    done = first(q)
            label = "chunk" if t.id in factors else "part"
            nodes.append(
                Node(
                    ref=(t.id, i),
                    key=(float(t.id), i),
                    template=_piece(t, i, k, label),
                    deps=tuple(deps),
                    done_before=done,
                    origin=(t.id,),
                )
            )
    return rebuild(graph.name, graph.num_devices, nodes)


def chunk(graph: StepGraph, ids_or_min_bytes: Iterable[int] | int, k: int) -> StepGraph:
    """Split collectives into ``k`` pipelined pieces.

    ``ids_or_min_bytes`` is either the collective ids to split or, as an ``int``, a byte
    size: every collective at least that large is split.
    """
    if k < 1:
        raise ValueError(f"chunk: k must be >= 1, got {k}")
    return chunk_rewrite(graph, _factors(graph, ids_or_min_bytes, k)).graph

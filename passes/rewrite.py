"""The one way passes build a new StepGraph: a stable topological re-sort.

A pass that merges or splits tasks cannot keep ids (``tasks[i].id == i``) or, in general,
the old order: a combined collective must come after the last producer of any of its
parts, and every consumer of a part must come after the combined collective. Each pass
therefore describes its output as nodes with a sort key (where the node sat in the old
schedule) and dependencies on other nodes, and :func:`rebuild` emits them in the order
that keeps the old schedule as far as the new dependencies allow (Kahn's algorithm, the
ready node with the smallest key first). The result records where every new task came
from, so that choices keyed by the old ids (per-collective params) can follow it.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Hashable, Sequence

from lagom_jax.program.graph import StepGraph, Task


@dataclasses.dataclass(frozen=True)
class Rewrite:
    """A pass's output graph and, per new task id, the input task ids it came from."""

    graph: StepGraph
    origins: tuple[tuple[int, ...], ...]

    def __post_init__(self) -> None:
        if len(self.origins) != len(self.graph.tasks):
            raise ValueError(
                f"origins has {len(self.origins)} entries for {len(self.graph.tasks)} tasks"
            )


@dataclasses.dataclass(frozen=True)
class Node:
    """One task of the output graph before it has an id.

    ``template`` supplies every field except ``id``, ``deps`` and ``done_before``, which
    are given as references to other nodes (``deps``, ``done_before``).
    """

    ref: Hashable
    key: tuple[float, int]
    template: Task
    deps: tuple[Hashable, ...]
    done_before: Hashable | None
    origin: tuple[int, ...]


def rebuild(name: str, num_devices: int, nodes: Sequence[Node]) -> Rewrite:
    """Number ``nodes`` in a dependency-respecting order closest to their keys."""
    by_ref = {n.ref: n for n in nodes}
    if len(by_ref) != len(nodes):
        raise ValueError("rebuild: node references are not unique")
    waiting = {n.ref: len(set(n.deps)) for n in nodes}
    users: dict[Hashable, list[Hashable]] = {n.ref: [] for n in nodes}
    for n in nodes:
        for d in set(n.deps):
            if d not in by_ref:
                raise ValueError(f"rebuild: node {n.ref!r} depends on unknown node {d!r}")
            users[d].append(n.ref)
    order = {n.ref: i for i, n in enumerate(nodes)}
    heap = [(n.key, order[n.ref], n.ref) for n in nodes if waiting[n.ref] == 0]
    heapq.heapify(heap)
    new_id: dict[Hashable, int] = {}
    emitted: list[Node] = []
    while heap:
        _, _, ref = heapq.heappop(heap)
        new_id[ref] = len(emitted)
        emitted.append(by_ref[ref])
        for u in users[ref]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(heap, (by_ref[u].key, order[u], u))
    if len(emitted) != len(nodes):
        stuck = sorted(str(r) for r, w in waiting.items() if w > 0)[:5]
        raise ValueError(f"rebuild: dependency cycle through {', '.join(stuck)}")
    tasks = []
    for i, n in enumerate(emitted):
        done = new_id[n.done_before] if n.done_before is not None else None
        if done is not None and done <= i:
            # The wait point moved before the task itself (its consumer now depends on
            # it through deps instead), so there is no separate wait left to record.
            done = None
        deps = tuple(sorted({new_id[d] for d in n.deps}))
        tasks.append(n.template.evolve(id=i, deps=deps, done_before=done))
    return Rewrite(
        StepGraph(name=name, tasks=tuple(tasks), num_devices=num_devices),
        tuple(n.origin for n in emitted),
    )


def identity_nodes(graph: StepGraph) -> list[Node]:
    """Every task of ``graph`` as a node referencing itself by its old id."""
    return [
        Node(
            ref=t.id,
            key=(float(t.id), 0),
            template=t,
            deps=t.deps,
            done_before=t.done_before,
            origin=(t.id,),
        )
        for t in graph.tasks
    ]

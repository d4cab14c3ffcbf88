"""``combine``: XLA:GPU's collective combiners, as a what-if pass.

XLA merges small collectives of one kind into one larger call so that the launch and
per-step latency is paid once (reference/xla_flags.md, section 1). The GPU pipeline runs
GpuAllGatherCombiner, GpuAllReduceCombiner and GpuReduceScatterCombiner (and the
collective-permute combiner) after fusion, each with a byte threshold
(``xla_gpu_<kind>_combine_threshold_bytes``, default 30 MiB + 7 = 31457287) and a count
cap (``xla_gpu_collective_combine_threshold_count``, default 2048). This pass follows the
plain combiner that runs whenever a threshold is set explicitly: walk the collectives in
schedule order, grow one open group per key (kind, replica groups / permute pairs, loop
nest), and close it when the next part would exceed the threshold or the count, or when
the next part depends on a member of the group (combining it would create a cycle).
All-to-all has no threshold flag in XLA:GPU, so it is never combined.

The combined collective depends on the union of its parts' producers (so it waits for the
last of them) and every consumer of any part depends on it (so the first consumer is
released late): exactly the trade-off the search has to weigh.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from lagom_jax.graph import StepGraph, Task

from .rewrite import Node, Rewrite, identity_nodes, rebuild

# xla/service/collective_utils.h: kDefault<Kind>CombineThreshold = 30 * 1024 * 1024 + 7
# (reference/xla_flags.md, section 1).
DEFAULT_COMBINE_THRESHOLD_BYTES = 30 * 1024 * 1024 + 7
# xla_gpu_collective_combine_threshold_count default (reference/xla_flags.md, section 1).
DEFAULT_COMBINE_MAX_COUNT = 2048
COMBINABLE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute")
DEFAULT_COMBINE_THRESHOLDS: Mapping[str, int] = {
    k: DEFAULT_COMBINE_THRESHOLD_BYTES for k in COMBINABLE_KINDS
}
# The XLA flag behind each kind's threshold, for explanations and plans.
THRESHOLD_FLAGS: Mapping[str, str] = {
    k: f"xla_gpu_{k.replace('-', '_')}_combine_threshold_bytes" for k in COMBINABLE_KINDS
}


def _check_thresholds(thresholds: Mapping[str, int]) -> dict[str, int]:
    unknown = sorted(set(thresholds) - set(COMBINABLE_KINDS))
    if unknown:
        raise ValueError(
            f"no combine threshold for {unknown} (combinable kinds: {', '.join(COMBINABLE_KINDS)})"
        )
    out = dict(DEFAULT_COMBINE_THRESHOLDS)
    for kind, value in thresholds.items():
        if value < 0:
            raise ValueError(f"combine threshold for {kind} must be >= 0 bytes, got {value}")
        out[kind] = int(value)
    return out


def _key(t: Task) -> tuple:
    return (t.kind, t.groups, t.pairs, t.trip_count, t.iteration)


def combine_groups(
    graph: StepGraph,
    thresholds: Mapping[str, int] = DEFAULT_COMBINE_THRESHOLDS,
    *,
    max_count: int = DEFAULT_COMBINE_MAX_COUNT,
) -> tuple[tuple[int, ...], ...]:
    """Which collectives the combiner merges: groups of >= 2 ids, in schedule order.

    ``thresholds`` maps a kind to its byte threshold; kinds left out keep XLA's default.
    """
    if max_count < 1:
        raise ValueError(f"max_count must be >= 1, got {max_count}")
    limits = _check_thresholds(thresholds)
    # ancestors[i]: bitset of every task i depends on, directly or not.
    ancestors: list[int] = []
    for t in graph.tasks:
        bits = 0
        for d in t.deps:
            bits |= ancestors[d] | (1 << d)
        ancestors.append(bits)

    done: list[tuple[int, ...]] = []
    open_groups: dict[tuple, tuple[list[int], float, int]] = {}  # key -> (ids, bytes, members bitset)

    def close(key: tuple) -> None:
        ids, _, _ = open_groups.pop(key)
        if len(ids) >= 2:
            done.append(tuple(ids))

    for t in graph.collectives:
        limit = limits.get(t.kind)
        if limit is None or t.bytes > limit:
            continue
        key = _key(t)
        if key in open_groups:
            ids, size, members = open_groups[key]
            if (
                ancestors[t.id] & members
                or size + t.bytes > limit
                or len(ids) + 1 > max_count
            ):
                close(key)
            else:
                ids.append(t.id)
                open_groups[key] = (ids, size + t.bytes, members | (1 << t.id))
                continue
        open_groups[key] = ([t.id], t.bytes, 1 << t.id)
    for key in list(open_groups):
        close(key)
    return tuple(sorted(done))


def _merged_task(parts: list[Task]) -> Task:
    first = parts[0]
    names = [p.name for p in parts]
    name = "+".join(names) if len(names) <= 3 else f"{names[0]}+...+{names[-1]}"
    dtypes = {p.dtype for p in parts}
    return dataclasses.replace(
        first,
        name=f"combined({name})",
        bytes=sum(p.bytes for p in parts),
        flops=sum(p.flops for p in parts),
        dtype=first.dtype if len(dtypes) == 1 else "mixed",
        is_async=any(p.is_async for p in parts),
    )


def combine_rewrite(
    graph: StepGraph,
    thresholds: Mapping[str, int] = DEFAULT_COMBINE_THRESHOLDS,
    *,
    max_count: int = DEFAULT_COMBINE_MAX_COUNT,
) -> Rewrite:
    """:func:`combine`, also returning where every new task came from."""
    groups = combine_groups(graph, thresholds, max_count=max_count)
    if not groups:
        return Rewrite(graph, tuple((t.id,) for t in graph.tasks))
    owner = {i: g for g in groups for i in g}
    ref = {i: ("combined", owner[i][0]) if i in owner else i for i in range(len(graph.tasks))}
    nodes: list[Node] = []
    for n in identity_nodes(graph):
        if n.ref in owner:
            continue
        nodes.append(
            dataclasses.replace(
                n,
                deps=tuple(ref[d] for d in n.deps),
                done_before=ref[n.done_before] if n.done_before is not None else None,
            )
        )
    for g in groups:
        parts = [graph.tasks[i] for i in g]
        deps = {ref[d] for p in parts for d in p.deps}
        waits = sorted(p.done_before for p in parts if p.done_before is not None)
        # The merged call is waited on where its earliest part was.
        done = ref[waits[0]] if waits else None
        nodes.append(
            Node(
                ref=("combined", g[0]),
                # Key of the first part: once its last producer is out, it goes first.
                key=(float(g[0]), 0),
                template=_merged_task(parts),
                deps=tuple(sorted(deps, key=str)),
                done_before=done,
                origin=g,
            )
        )
    return rebuild(graph.name, graph.num_devices, nodes)


def combine(
    graph: StepGraph,
    thresholds: Mapping[str, int] = DEFAULT_COMBINE_THRESHOLDS,
    *,
    max_count: int = DEFAULT_COMBINE_MAX_COUNT,
) -> StepGraph:
    """Merge independent collectives of one kind and group, as XLA's GPU combiners do.

    ``thresholds`` maps kind -> bytes (``xla_gpu_<kind>_combine_threshold_bytes``); a
    threshold of 0 disables combining for that kind, kinds left out keep XLA's default.
    ``max_count`` is ``xla_gpu_collective_combine_threshold_count``.
    """
    return combine_rewrite(graph, thresholds, max_count=max_count).graph

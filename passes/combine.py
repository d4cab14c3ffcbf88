"""``combine``: XLA:GPU's collective combiners, as a what-if pass.

XLA merges small collectives of one kind into one larger call so that the launch and
per-step latency is paid once. After fusion, XLA:GPU runs GpuAllGatherCombiner,
GpuAllReduceCombiner and GpuReduceScatterCombiner, in that order (``RunPostFusionPasses``
in openxla/xla xla/service/gpu/gpu_compiler.cc), and a collective-permute combiner. Each
has a byte threshold (``xla_gpu_<kind>_combine_threshold_bytes``, default 30 MiB + 7 =
31457287; 0 turns it off) and a count cap (``xla_gpu_collective_combine_threshold_count``),
and each is ``CombineInstructionsByKey`` (xla/service/collective_combiner_utils.h) with
its own key. This pass follows those rules:

- Only collectives of one computation merge: the entry, or one while body (here: one
  unrolled iteration of it). Inside a computation a nested while loop or call is one
  instruction, so every input of the loop reaches every output of it (XLA checks
  dependencies on the computation's ``HloReachabilityMap``). ``Task.computation`` says
  where a collective sits.
- Keys (``_key``): all-reduce and reduce-scatter need equal replica groups, element type
  and reduction opcode (``GetAllReduceKey``, xla/service/all_reduce_key.cc); all-gather
  only equal replica groups, since XLA:GPU builds its all-gather combiner with
  ``combine_different_dtypes=true`` and XLA's defaults
  ``xla_gpu_enable_{all_gather,reduce_scatter}_combine_by_dim=false`` keep the
  gather/scatter dimension out of the keys (``AllGatherCombiner::CombineKey``,
  ``ReduceScatterCombiner::CombineKey``, xla/hlo/transforms/collectives/); collective-permute
  equal source-target pairs (``GetCollectivePermuteKey``).
- The size held against the threshold is the collective's result (``ShapeUtil::ByteSizeOf``
  of its shape): the NCCL-convention ``bytes`` for every kind but reduce-scatter, whose
  result is its input divided among the group.
- Greedy rounds in XLA's post order of the computation (``Task.post_order``,
  ``HloComputation::MakeInstructionPostOrder``; the schedule order where it is unknown):
  the first collective left starts a group, and the scan adds each later collective with
  its key until one would pass the threshold or the count, or is reachable from a member
  (merging it would make a cycle). That one starts a later round. A collective bigger
  than the threshold on its own is never merged and does not stop the scan. A round's
  merge is applied before the next round checks reachability, and each combiner sees
  the merges of the ones before it.

All-to-all has no combiner in XLA:GPU, so it is never combined. Not modelled, all off by
default: with ``xla_gpu_experimental_enable_heuristic_collective_combining`` XLA:GPU first
merges the collectives a dry-run schedule leaves synchronous, and pipelined ones, under a
memory-derived threshold when the threshold is left at its default; collectives pipelined
by ``xla_gpu_enable_pipelined_*`` and instructions with a ``combiner_key`` frontend
attribute get keys of their own (GpuAllReduceCombiner and friends,
xla/backends/gpu/transforms/collectives/). XLA also skips collectives that already have
several operands (merged ones); a StepGraph does not record operand counts, so this pass
may merge them again. ``benchmarks/predicted/combine_sweep.py`` checks the pass against deviceless
XLA:GPU compiles.

The combined collective depends on the union of its parts' producers (so it waits for the
last of them) and every consumer of any part depends on it (so the first consumer is
released late): exactly the trade-off the search has to weigh.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from lagom_jax.program.flags import KNOWN_FLAGS
from lagom_jax.program.graph import StepGraph, Task

from .rewrite import Node, Rewrite, identity_nodes, rebuild

# XLA's defaults, defined once in lagom_jax.program.flags (xla/service/collective_utils.h:
# kDefault<Kind>CombineThreshold = 30 MiB + 7; the combine count cap 2048: a deviceless
# compile of 300 independent all-reduces merged them into one call).
DEFAULT_COMBINE_THRESHOLD_BYTES = int(KNOWN_FLAGS["xla_gpu_all_reduce_combine_threshold_bytes"].default)
DEFAULT_COMBINE_MAX_COUNT = int(KNOWN_FLAGS["xla_gpu_collective_combine_threshold_count"].default)
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


# The order of the combiners in XLA:GPU's post-fusion pipeline (``RunPostFusionPasses`` in
# xla/service/gpu/gpu_compiler.cc: all-gather, all-reduce, then reduce-scatter). The
# collective-permute combiner runs elsewhere; it is put last.
COMBINER_ORDER = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute")


def _key(t: Task) -> tuple:
    """Collectives with equal keys may merge (the combiners' ``GroupKey``s).

    Always: the kind and the computation (with the unrolled loop iteration), since the
    combiners work one computation at a time. all-reduce and reduce-scatter add the replica
    groups, the element type and the reduction's opcode (``GetAllReduceKey`` in
    xla/service/all_reduce_key.cc); all-gather only the replica groups, because the GPU
    all-gather combiner is built with ``combine_different_dtypes=true`` and by-dimension
    keys are off by default (``xla_gpu_enable_all_gather_combine_by_dim=false``,
    GpuAllGatherCombiner / ``AllGatherCombiner::CombineKey``); collective-permute its
    source-target pairs (``GetCollectivePermuteKey``).
    """
    base = (t.kind, t.computation, t.trip_count, t.iteration)
    if t.kind == "all-gather":
        return (*base, t.groups)
    if t.kind == "collective-permute":
        return (*base, t.pairs)
    return (*base, t.groups, t.dtype, t.reduction)


def _result_bytes(t: Task, num_devices: int) -> float:
    """The size the combiners compare with the threshold: the collective's *result*.

    ``CombineInstructionsByKey`` sizes an instruction by its output shape. That is the
    NCCL-convention ``bytes`` for every kind but reduce-scatter, whose result is its input
    divided among the group.
    """
    if t.kind == "reduce-scatter":
        return t.bytes / t.ranks(num_devices)
    return t.bytes


class _Scope:
    """One computation instance (a computation path and unrolled iteration), condensed.

    In XLA a while loop or call is one instruction of its parent computation, so a task
    of a nested computation counts as that instruction: every input of the loop reaches
    every output of it. The nodes are the scope's own task ids and ``("sub", path)`` for
    each nested computation; ``succ`` maps a node to the nodes that use it.
    """

    def __init__(self, graph: StepGraph, path: str, members: list[int]) -> None:
        self.num_devices = graph.num_devices
        self.succ: dict[object, set[object]] = {}
        node_of: dict[int, object] = {}
        for i in members:
            t = graph.tasks[i]
            if t.computation == path:
                node_of[i] = i
            else:
                child = t.computation[len(path) + 1:].split("/", 1)[0]
                node_of[i] = ("sub", child)
        for i in members:
            a = node_of[i]
            for d in graph.tasks[i].deps:
                b = node_of.get(d)
                if b is not None and b != a:
                    self.succ.setdefault(b, set()).add(a)


def _instance(t: Task) -> tuple[str, int]:
    """The computation instance a task runs in: (computation path, unrolled iteration).

    A graph without computation names (hand-built ones) is one instance.
    """
    return (t.computation, t.iteration) if t.computation else ("", 0)


def _scope_members(graph: StepGraph) -> dict[tuple[str, int], list[int]]:
    """Every computation instance with the ids of the tasks in it or nested in it.

    A task of path ``P/C...`` with trip count ``n`` and iteration ``k`` belongs to the
    instance ``(P, k // (n / n_P))`` of every enclosing computation ``P`` (trip count
    ``n_P``).
    """
    trips: dict[str, int] = {}
    by_instance: dict[tuple[str, int], list[int]] = {}
    for t in graph.tasks:
        trips.setdefault(t.computation, t.trip_count)
        by_instance.setdefault(_instance(t), []).append(t.id)
    out: dict[tuple[str, int], list[int]] = {}
    for (path, iteration), ids in by_instance.items():
        parts = path.split("/")
        for depth in range(1, len(parts) + 1):
            prefix = "/".join(parts[:depth])
            if prefix not in trips:  # no task of its own: never a combining scope
                continue
            per_parent = max(trips[path] // max(trips[prefix], 1), 1)
            out.setdefault((prefix, iteration // per_parent), []).extend(ids)
    return out


def combine_groups(
    graph: StepGraph,
    thresholds: Mapping[str, int] = DEFAULT_COMBINE_THRESHOLDS,
    *,
    max_count: int = DEFAULT_COMBINE_MAX_COUNT,
) -> tuple[tuple[int, ...], ...]:
    """Which collectives the combiners merge: groups of >= 2 ids, in schedule order.

    ``thresholds`` maps a kind to its byte threshold; kinds left out keep XLA's default.
    """
    if max_count < 1:
        raise ValueError(f"max_count must be >= 1, got {max_count}")
    limits = _check_thresholds(thresholds)
    candidates: dict[tuple[str, int], list[Task]] = {}
    for t in graph.collectives:
        limit = limits.get(t.kind, 0)
        if limit > 0 and _result_bytes(t, graph.num_devices) <= limit:
            candidates.setdefault(_instance(t), []).append(t)
    done: list[tuple[int, ...]] = []
    scopes = None
    for (path, iteration), cands in candidates.items():
        if len(cands) < 2:
            continue
        # XLA visits a computation's instructions in post order; the schedule order stands
        # in where the graph does not know it.
        cands.sort(key=lambda t: (t.post_order, t.id))
        if scopes is None:
            scopes = _scope_members(graph)
        done += _combine_scope(_Scope(graph, path, scopes[(path, iteration)]), cands, limits,
                               max_count)
    return tuple(sorted(done))


def _reach_bits(scope: _Scope, cands: list[Task]) -> dict[int, int]:
    """Per candidate id, the bitset (bit k = ``cands[k]``) of candidates reachable from it."""
    bit = {t.id: 1 << k for k, t in enumerate(cands)}
    succ = scope.succ
    reach: dict[object, int] = {}
    for root in list(succ):
        if root in reach:
            continue
        stack: list[tuple[object, bool]] = [(root, False)]
        while stack:  # depth first; a node's bits once all its users have theirs
            node, expanded = stack.pop()
            if node in reach:
                continue
            users = succ.get(node, ())
            if expanded:
                bits = 0
                for u in users:
                    bits |= reach[u] | bit.get(u, 0)  # type: ignore[call-overload]
                reach[node] = bits
                continue
            stack.append((node, True))
            stack.extend((u, False) for u in users if u not in reach)
    return {t.id: reach.get(t.id, 0) for t in cands}


def _combine_scope(scope: _Scope, cands: list[Task], limits: Mapping[str, int],
                   max_count: int) -> list[tuple[int, ...]]:
    """``CombineInstructionsByKey`` (xla/service/collective_combiner_utils.h) on one scope.

    ``cands`` are in visiting order. For each combiner in turn: take the first collective
    left and scan those after it with its key, adding each until the next would pass the
    threshold or the count, or is reachable from a member (it would wait on the group it
    joins): the scan stops there, and the next round starts from the first collective left.
    Every merge is applied before the next round looks at reachability, as XLA rebuilds
    its reachability map after each group: whatever reaches a member now reaches all that
    any member reaches.
    """
    bit = {t.id: 1 << k for k, t in enumerate(cands)}
    reach = _reach_bits(scope, cands)
    taken: set[int] = set()  # grouped, or alone in a round: never looked at again
    # (their entries leave ``reach``)
    out: list[tuple[int, ...]] = []
    for kind in COMBINER_ORDER:
        left = [t for t in cands if t.kind == kind]
        limit = limits.get(kind, 0)
        start = 0
        while True:
            while start < len(left) and left[start].id in taken:
                start += 1
            if start == len(left):
                break
            first = left[start]
            key = _key(first)
            group, size, below = [first], _result_bytes(first, scope.num_devices), reach[first.id]
            members = bit[first.id]
            for t in left[start + 1:]:
                if t.id in taken or _key(t) != key:
                    continue
                nbytes = _result_bytes(t, scope.num_devices)
                # (In post order a later collective never reaches an earlier one; the
                # second test only guards graphs whose order is not topological.)
                if size + nbytes > limit or below & bit[t.id] or reach[t.id] & members:
                    break
                group.append(t)
                size += nbytes
                below |= reach[t.id]
                members |= bit[t.id]
                if len(group) >= max_count:
                    break
            taken.update(t.id for t in group)
            for t in group:
                del reach[t.id]
            if len(group) < 2:
                continue
            # Merged: whatever reaches one member reaches all that any member reaches.
            for i, bits in reach.items():
                if bits & members:
                    reach[i] = bits | below
            out.append(tuple(sorted(t.id for t in group)))
    return out


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


def unreproduced_kinds(graph: StepGraph,
                       thresholds: Mapping[str, int] = DEFAULT_COMBINE_THRESHOLDS) -> dict[str, int]:
    """Kinds this pass would merge further in a module XLA already compiled under
    ``thresholds``, each with how many of its collectives it would merge.

    XLA's combiners have run on a compiled module, so at the thresholds it was compiled with
    the pass should find nothing left to merge. Where it does, XLA kept those collectives
    apart for a reason the pass does not model (a collective the pipeliner moved gets a
    combiner key of its own; one already merged is not merged again), and the pass cannot
    say what another threshold would compile to for that kind. jaxlib 0.12 pipelines
    reduce-scatters by default, for one: a double-buffered step's three reduce-scatters
    stay three at the default threshold, where the pass would make one.
    """
    out: dict[str, int] = {}
    for group in combine_groups(graph, thresholds):
        kind = graph.tasks[group[0]].kind
        out[kind] = out.get(kind, 0) + len(group)
    return dict(sorted(out.items()))


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

"""``schedule``: when each async collective starts, when it is waited on, who goes first.

XLA:GPU turns every collective into an async start/done pair and then lets a scheduler
place them (openxla/xla ``xla/service/gpu/gpu_hlo_schedule.cc``, ``ScheduleGpuModule``):

* with the latency-hiding scheduler (``xla_gpu_enable_latency_hiding_scheduler``, or
  optimization effort >= 0.2, or a PGLE profile) a collective starts as soon as its
  operands are ready and its done is pushed down to just before its first user;
* without it, only all-reduce and collective-permute get the "start early, finish late"
  post-processing; the other kinds are waited on right after they are issued.

How many collectives may be in flight at once is
``xla_gpu_experimental_parallel_collective_overlap_limit`` (default 1). Which ready
collective is issued first is the scheduler's priority; here it is explicit.

The result is a :class:`Schedule`: the graph with ``done_before`` set, plus the priority
and overlap limit, which is exactly what ``simulate`` takes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from lagom_jax.program.graph import StepGraph

# Kinds XLA's no-LHS post-processor still starts early and finishes late (openxla/xla
# xla/service/gpu/gpu_hlo_schedule.cc, PostprocessorToScheduleAsEarlyOrLateAsPossible).
_EARLY_LATE_WITHOUT_LHS = ("all-reduce", "collective-permute")
# xla_gpu_experimental_parallel_collective_overlap_limit default (xla/debug_options_flags.cc).
DEFAULT_OVERLAP_LIMIT = 1


@dataclasses.dataclass(frozen=True)
class Schedule:
    """A graph with its wait points, plus the issue priority and overlap limit."""

    graph: StepGraph
    priority: tuple[tuple[int, float], ...] | None = None
    overlap_limit: int = DEFAULT_OVERLAP_LIMIT
    latency_hiding: bool = True

    @property
    def priority_map(self) -> dict[int, float] | None:
        """Task id -> priority (higher issues first), as ``simulate`` takes it."""
        return None if self.priority is None else dict(self.priority)


def schedule(
    graph: StepGraph,
    *,
    priority: Mapping[int, float] | None = None,
    overlap_limit: int = DEFAULT_OVERLAP_LIMIT,
    latency_hiding: bool = True,
) -> Schedule:
    """Place every collective's wait point and fix the issue order settings.

    ``latency_hiding`` mirrors ``xla_gpu_enable_latency_hiding_scheduler``: True waits at
    the first compute consumer (or only at the end of the step when there is none); False waits right
    after issue except for all-reduce and collective-permute. ``priority`` maps collective
    id -> priority, higher first; left out, ready collectives go in schedule order.
    """
    if overlap_limit < 1:
        raise ValueError(
            f"overlap_limit must be >= 1 (xla_gpu_experimental_parallel_collective_overlap_limit), got {overlap_limit}"
        )
    if priority is not None:
        bad = sorted(i for i in priority if not (0 <= i < len(graph.tasks)) or not graph.tasks[i].is_collective)
        if bad:
            raise ValueError(f"priority names tasks that are not collectives of {graph.name!r}: {bad[:5]}")
    consumers = graph.consumers
    tasks = list(graph.tasks)
    next_compute: list[int | None] = [None] * len(tasks)
    upcoming = None
    for t in reversed(graph.tasks):
        next_compute[t.id] = upcoming
        if not t.is_collective:
            upcoming = t.id
    for t in graph.collectives:
        is_async = latency_hiding or t.kind in _EARLY_LATE_WITHOUT_LHS
        if is_async:
            # A collective consumer waits through its deps; the wait point is compute.
            wait = next((u for u in consumers[t.id] if not tasks[u].is_collective), None)
        else:
            # Synchronous: the next compute task in program order waits for it.
            wait = next_compute[t.id]
        tasks[t.id] = t.evolve(done_before=wait, is_async=is_async)
    out = StepGraph(name=graph.name, tasks=tuple(tasks), num_devices=graph.num_devices)
    prio = None if priority is None else tuple(sorted((int(i), float(p)) for i, p in priority.items()))
    return Schedule(out, prio, overlap_limit, latency_hiding)

"""The evaluator: a Structure and per-collective params applied to one step, and timed.

The pass pipeline runs in DESIGN order, each pass a pure function of the step before it::

    decompose (windowed einsum, when chosen) > combine (thresholds) > chunk (pipelined
    collectives) > schedule (latency hiding, overlap limit) > simulate

Built schedules are cached per structure (and per window), so that trying the candidates
of one collective replays the same graph object with other params only. Candidates per
collective are ``cost.candidate_params`` cut to its Pareto front in (time alone, SMs held,
HBM bandwidth held): a candidate that is slower and holds at least as much of both can
never shorten the step, because in the model the overlapped compute only depends on the
resources a collective holds and for how long.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from collections.abc import Mapping

from lagom_jax.cluster.hardware import HardwareProfile
from lagom_jax.cluster.params import CollectiveParams
from lagom_jax.costs import cost
from lagom_jax.costs import simulate as simulate_lib
from lagom_jax.costs.simulate import Timeline, makespan_us, simulate
from lagom_jax.passes import (Rewrite, Schedule, XLA_ORDER, chunk_rewrite, combine_rewrite,
                              Pair, decompose_rewrite, eligible_pairs, schedule)
from lagom_jax.program.graph import CollectiveShape, StepGraph, Task, collective_shape

from .space import Space, Structure

# Steps up to this many tasks are evaluated whole; larger ones per collective window.
FULL_GRAPH_TASKS = 64
WINDOW_MARGIN_TASKS = 3


def _shape(t: Task, num_devices: int, hw: HardwareProfile) -> CollectiveShape:
    return collective_shape(t, num_devices, hw.gpus_per_node)


def _time(t: Task, p: CollectiveParams, hw: HardwareProfile, num_devices: int) -> float:
    shape = _shape(t, num_devices, hw)
    time_us = _time_table(shape, hw).get(p)
    return cost.collective_time_us(*shape, p, hw) if time_us is None else time_us


@functools.lru_cache(maxsize=1 << 12)
def _time_table(shape: CollectiveShape, hw: HardwareProfile) -> Mapping[CollectiveParams, float]:
    """The candidates' times of one collective size (``cost.candidate_resources``, the table
    ``candidates`` cuts the front from) as a read-only lookup: the search asks for the time
    of a candidate far more often than it tabulates a size."""
    return types.MappingProxyType({p: time_us for p, time_us, _, _ in cost.candidate_resources(*shape, hw)})


def _default(t: Task, hw: HardwareProfile, num_devices: int) -> CollectiveParams:
    return cost.nccl_default_params(*_shape(t, num_devices, hw), hw)


_CANDIDATES: dict[tuple, tuple[CollectiveParams, ...]] = {}


def candidates(
    t: Task, hw: HardwareProfile, max_candidates: int | None = None, *, num_devices: int = 1
) -> tuple[CollectiveParams, ...]:
    """The Pareto front of ``cost.candidate_params`` in (time, SMs, HBM), NCCL's pick first.

    With ``max_candidates`` the front is thinned evenly (by channel count) to that many.
    ``num_devices`` sizes collectives with empty replica groups (all devices).
    """
    shape = _shape(t, num_devices, hw)
    key = (shape, hw, max_candidates)
    if key in _CANDIDATES:
        return _CANDIDATES[key]
    nodes = shape.nodes
    scored = []
    for p, time_us, sms, hbm in cost.candidate_resources(*shape, hw):
        scored.append(((time_us, sms, hbm), p))
    scored.sort()
    front: list[tuple[tuple[float, float, float], CollectiveParams]] = []
    for s, p in scored:
        # Sorted by time, so only an earlier (faster or equal) point can dominate.
        _, sms, hbm = s
        for (_, f_sms, f_hbm), _ in front:
            if f_sms <= sms and f_hbm <= hbm:
                break
        else:
            front.append((s, p))
    front.sort(key=lambda x: (x[0][1], x[0][0]))
    picks = [p for _, p in front]
    if max_candidates is not None and len(picks) > max_candidates:
        step = (len(picks) - 1) / max(max_candidates - 1, 1)
        picks = [picks[round(i * step)] for i in range(max_candidates)]
    default = cost.nccl_default_params(*shape, hw)
    out = (default,) + tuple(p for p in dict.fromkeys(picks) if p != default)
    _CANDIDATES[key] = out
    return out


@dataclasses.dataclass(frozen=True)
class _Built:
    """A structure applied: the scheduled graph and, per collective, its combined-graph id."""

    schedule: Schedule
    origins: tuple[tuple[int, ...], ...]
    parent: tuple[tuple[int, int], ...]  # (collective id in schedule.graph, combined-graph id)
    priority: Mapping[int, float] | None  # schedule.priority_map, made once

    def params(self, params: Mapping[int, CollectiveParams], override: tuple[int, CollectiveParams] | None = None
               ) -> dict[int, CollectiveParams]:
        if override is None:
            return {i: params[c] for i, c in self.parent}
        cid, p = override
        return {i: p if c == cid else params[c] for i, c in self.parent}


class Evaluator:
    """Builds and simulates configurations of one step, counting every evaluation."""

    def __init__(self, graph: StepGraph, hw: HardwareProfile, space: Space) -> None:
        self.graph, self.hw, self.space = graph, hw, space
        self.evaluations = 0
        self._decomposed: Rewrite | None = None
        self._combined: dict[tuple, Rewrite] = {}
        self._ties: dict[tuple, tuple[tuple[int, ...], dict[int, tuple[int, ...]]]] = {}
        self._built: dict[Structure, _Built] = {}
        self._windows: dict[tuple, _Built] = {}
        # (thresholds, windowed einsum, collective id) -> the (first, last) task of its window.
        self._spans: dict[tuple, tuple[int, int]] = {}
        # (structure, collective id, its window) of the last ``window`` call.
        self._last_window: tuple[Structure | None, int, _Built | None] = (None, -1, None)
        # policy -> collective shape -> its pick, and (thresholds, windowed einsum, policy) -> the
        # params of every tuned collective (``strategies._policy_params``)
        self.policy_picks: dict[str, dict[CollectiveShape, CollectiveParams]] = {}
        self.policy_params: dict[tuple, dict[int, CollectiveParams]] = {}
        # The first tasks of a long step, where its structure is judged (``strategies._segment``).
        self.segment: Evaluator | None = None

    def shape(self, t: Task) -> CollectiveShape:
        return _shape(t, self.graph.num_devices, self.hw)

    def time(self, t: Task, p: CollectiveParams) -> float:
        return _time(t, p, self.hw, self.graph.num_devices)

    def default(self, t: Task) -> CollectiveParams:
        return _default(t, self.hw, self.graph.num_devices)

    def candidates(self, t: Task) -> tuple[CollectiveParams, ...]:
        return candidates(t, self.hw, self.space.max_candidates, num_devices=self.graph.num_devices)

    def resources(self, t: Task, p: CollectiveParams) -> tuple[float, float]:
        return cost.collective_resource_use(*self.shape(t), p, self.hw)

    def _inside_node(self, t: Task) -> bool:
        return self.shape(t).nodes <= 1

    def windowed_pairs(self) -> tuple[Pair, ...]:
        """The pairs XLA's windowed einsum rewrites at threshold 0: those whose ring stays
        inside one node, since XLA caps a windowed-einsum loop at the fast-interconnect slice
        size (openxla/xla ``dot_handler.cc``, ``GetWindowedEinsumConfiguration``; the GPU
        client sets it to its NVLink domain). A matmul a cross-node gather also feeds stays
        free for the pair inside the node."""
        return eligible_pairs(self.graph, 0, keep=self._inside_node)

    def decomposed(self) -> Rewrite:
        """The step with every windowed-einsum pair (``windowed_pairs``) decomposed."""
        if self._decomposed is None:
            self._decomposed = decompose_rewrite(self.graph, 0, order=XLA_ORDER, keep=self._inside_node)
        return self._decomposed

    def combined(self, structure: Structure) -> Rewrite:
        """The step after windowed einsum (when chosen) and the combiners."""
        key = (structure.thresholds, structure.windowed_einsum)
        if key not in self._combined:
            g0 = self.decomposed().graph if structure.windowed_einsum else self.graph
            # Kinds left at XLA's default because the pass cannot mimic XLA on them stay as
            # XLA combined them in the module (the pass combines them no further).
            thresholds = {**structure.threshold_map, **{k: 0 for k in self.space.default_combine_kinds}}
            self._combined[key] = combine_rewrite(g0, thresholds)
        return self._combined[key]

    def ties(self, structure: Structure) -> tuple[tuple[int, ...], dict[int, tuple[int, ...]]]:
        """Per combined-graph task, the collective whose params it runs with, and per such
        collective, every task that shares them.

        The ring steps of one decomposed pair are one collective-permute in XLA's windowed
        einsum loop, so one NCCL config: they are tuned as one. Every other collective is
        its own.
        """
        key = (structure.thresholds, structure.windowed_einsum)
        if key not in self._ties:
            rw = self.combined(structure)
            ring_of: dict[int, tuple[int, ...]] = {}
            if structure.windowed_einsum:
                d = self.decomposed()
                for t in d.graph.collectives:
                    if t.kind == "collective-permute" and len(d.origins[t.id]) == 2:
                        ring_of[t.id] = d.origins[t.id]
            rep = list(range(len(rw.graph.tasks)))
            first: dict[tuple, int] = {}
            members: dict[int, tuple[int, ...]] = {}
            for t in rw.graph.collectives:
                parts = rw.origins[t.id]
                if ring_of and all(p in ring_of for p in parts):
                    ring = tuple(sorted({ring_of[p] for p in parts}))
                    rep[t.id] = first.setdefault(ring, t.id)
                members[rep[t.id]] = members.get(rep[t.id], ()) + (t.id,)
            self._ties[key] = (tuple(rep), members)
        return self._ties[key]

    def tuned(self, structure: Structure) -> list[Task]:
        """The collectives of the combined graph that carry their own params."""
        g1 = self.combined(structure).graph
        return [g1.tasks[c] for c in self.ties(structure)[1]]

    def _apply(self, g1: StepGraph, chunks: Mapping[int, int], structure: Structure,
               back: Mapping[int, int] | None = None) -> _Built:
        rw = chunk_rewrite(g1, chunks)
        sched = schedule(rw.graph, overlap_limit=structure.overlap_limit, latency_hiding=structure.latency_hiding)
        rep = self.ties(structure)[0]
        parent = tuple(
            (t.id, rep[back[rw.origins[t.id][0]] if back is not None else rw.origins[t.id][0]])
            for t in rw.graph.collectives
        )
        return _Built(sched, rw.origins, parent, sched.priority_map)

    def build(self, structure: Structure) -> _Built:
        """The whole step under ``structure``; collectives keep their combined-graph ids."""
        if structure not in self._built:
            self._built[structure] = self._apply(self.combined(structure).graph, dict(structure.chunks), structure)
        return self._built[structure]

    def full(self, structure: Structure, params: Mapping[int, CollectiveParams]) -> Timeline:
        built = self.build(structure)
        self.evaluations += 1
        sched = built.schedule
        return simulate(sched.graph, self.hw, built.params(params), overlap_limit=sched.overlap_limit,
                        priority=built.priority)

    def makespan(self, structure: Structure, params: Mapping[int, CollectiveParams]) -> float:
        """``full(...).makespan_us`` without the Timeline (a replay that keeps no intervals):
        where a search compares whole steps and reads nothing else."""
        built = self.build(structure)
        self.evaluations += 1
        sched = built.schedule
        return makespan_us(sched.graph, self.hw, built.params(params), overlap_limit=sched.overlap_limit,
                           priority=built.priority)

    def window(self, structure: Structure, params: Mapping[int, CollectiveParams], cid: int,
               p: CollectiveParams | None = None) -> float:
        """Makespan of the part of the step that collective ``cid`` (combined graph) can
        affect, with ``cid`` running ``p`` (default: its params in ``params``).

        Small steps are simulated whole, so the search on them is exact under the model.
        """
        override = None if p is None else (cid, p)
        last = self._last_window
        if last[0] is structure and last[1] == cid:  # the next candidate of the same collective
            built = last[2]
        else:
            g1 = self.combined(structure).graph
            built = self.build(structure) if len(g1.tasks) <= FULL_GRAPH_TASKS else self._window(structure, cid)
            self._last_window = (structure, cid, built)
        self.evaluations += 1
        sched = built.schedule
        return makespan_us(sched.graph, self.hw, built.params(params, override), overlap_limit=sched.overlap_limit,
                           priority=built.priority)

    def _window(self, structure: Structure, cid: int) -> _Built:
        """Tasks from a few before ``cid`` can start to a few after its first consumer.

        It can start once its last producer is done. Compute runs in schedule order on one
        stream, so of its compute producers the last in that order ends last; a producer
        that is a collective may end later than compute after it, and the window starts
        before the earliest such one. A producer that ended long before (an XLA step often
        slices every layer's weights at its start) does not stretch the window back to it:
        nothing before ``cid`` starts depends on ``cid``'s params.
        """
        g1 = self.combined(structure).graph
        span_key = (structure.thresholds, structure.windowed_einsum, cid)
        span = self._spans.get(span_key)
        if span is None:
            lo, hi = len(g1.tasks), 0
            for m in self.ties(structure)[1][cid]:
                t = g1.tasks[m]
                users = g1.consumers[m]
                lo = min(lo, max(0, _ready_from(g1, t) - WINDOW_MARGIN_TASKS))
                hi = max(hi, min(len(g1.tasks) - 1, max(users[:1], default=m) + WINDOW_MARGIN_TASKS))
            span = self._spans[span_key] = (lo, hi)
        lo, hi = span
        chunks = tuple((c, k) for c, k in structure.chunks if lo <= c <= hi)
        key = (structure.thresholds, structure.windowed_einsum, structure.latency_hiding, structure.overlap_limit,
               chunks, lo, hi)
        if key not in self._windows:
            # One collective is tuned at a time: keep only its window alive, so that
            # per-graph caches downstream (the simulator's) do not grow with the step.
            self._windows.clear()
            ids = {old: old - lo for old in range(lo, hi + 1)}
            tasks = tuple(
                g1.tasks[old].evolve(id=new, done_before=None,
                                     deps=tuple(ids[d] for d in g1.tasks[old].deps if d in ids))
                for old, new in ids.items()
            )
            sub = StepGraph(f"{g1.name}[{lo}:{hi + 1}]", tasks, g1.num_devices)
            self._windows[key] = self._apply(sub, {c - lo: k for c, k in chunks}, structure,
                                             back={new: old for old, new in ids.items()})
        return self._windows[key]


def _ready_from(graph: StepGraph, t: Task) -> int:
    """The producer of ``t`` that ends last, as far as the schedule order tells: the last
    compute producer, or an earlier collective producer (``Evaluator._window``)."""
    compute = [d for d in t.deps if not graph.tasks[d].is_collective]
    start = max(compute, default=t.id)
    return min([start, *(d for d in t.deps if graph.tasks[d].is_collective)])


def clear_caches() -> None:
    """Forget the candidate and timing tables (after the cost model changed in-process)."""
    _CANDIDATES.clear()
    _time_table.cache_clear()
    simulate_lib.clear_caches()

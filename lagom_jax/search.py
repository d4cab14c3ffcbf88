"""Search strategies: from a StepGraph and a HardwareProfile to the choices of a Plan.

A strategy picks, for one training step,

* the structure XLA builds: whether all-gather / reduce-scatter + matmul pairs run as
  windowed einsum (``passes.decompose``), per-kind combine thresholds
  (``passes.combine``), whether the latency-hiding scheduler places the waits
  (``passes.schedule``), how many collectives may be in flight, and which collectives
  are pipelined in pieces (``passes.chunk``);
* per collective, the NCCL parameters (algorithm, protocol, channels, chunk, threads),

and predicts the step with ``simulate``. Strategies:

* ``xla-default`` - XLA's defaults and NCCL's own per-call choice;
* ``recipe`` - the published JAX-Toolbox MaxText flag recipe (NVIDIA/JAX-Toolbox
  ``docs/frameworks/maxtext/README.md``), NCCL's own per-call choice;
* ``autoccl`` - every collective tuned alone for its *own* duration (AutoCCL's objective,
  NSDI'25; its code, gbxu/autoccl, times each collective's own kernel): compute beside
  it does not slow a collective in the model, so that is its fastest candidate, whatever
  it costs the compute it overlaps;
* ``lagom`` - start from the best of the three above; tune the scheduler, windowed
  einsum and the combine thresholds; rank collectives by priority (their effect on the
  makespan: exposed time plus the compute they slow); tune each in turn over its
  candidates with the others fixed, then its pipelining; then the overlap limit; accept
  only makespan gains. The ring steps of one windowed einsum share one set of params. The work
  is O(N x K) evaluations for N collectives with K candidates each: a collective is
  evaluated on the window of the step it can influence (the whole step when it is small);
* ``exhaustive`` - every combination of per-collective candidates (K^N), under each of
  the xla-default, recipe and no-combining structures and every overlap limit (or only
  the recipe structure with ``Space(tune_structure=False)``), with windowed einsum off
  and on where the step has pairs for it: the optimum under the model of that space, to
  measure lagom's gap; pipelining is not enumerated. Refuses instances
  above ``EXHAUSTIVE_LIMIT`` evaluations.

Candidates are ``cost.candidate_params`` cut to its Pareto front in (time alone, SMs
held, HBM bandwidth held): a candidate that is slower and holds at least as much of both
resources can never shorten the step, because in the model the overlapped compute only
depends on the resources a collective holds and for how long.

Results are frozen ``SearchResult`` values, cached in memory by (graph fingerprint,
hardware, strategy, space).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import json
import math
import time
import types
from collections.abc import Callable, Mapping
from typing import Protocol

from lagom_jax import cost
from lagom_jax.graph import StepGraph, Task
from lagom_jax.hardware import HardwareProfile
from lagom_jax.passes import (
    COMBINABLE_KINDS,
    DEFAULT_COMBINE_THRESHOLD_BYTES,
    THRESHOLD_FLAGS,
    XLA_ORDER,
    Rewrite,
    Schedule,
    chunk_rewrite,
    combine_rewrite,
    decompose_rewrite,
    eligible_pairs,
    schedule,
)
from lagom_jax.plan import CollectiveParams
from lagom_jax.simulate import Timeline, collective_shape, makespan_us, simulate

STRATEGIES = ("xla-default", "recipe", "autoccl", "lagom", "exhaustive")

# NVIDIA/JAX-Toolbox docs/frameworks/maxtext/README.md, "recommended XLA flags for
# MaxText" on 8xH100: every flag is accepted by jaxlib 0.10.2 (our own check). Flags are
# data here; rendering them belongs to the Plan.
RECIPE_FLAGS: Mapping[str, bool | int | str] = {
    "xla_gpu_enable_latency_hiding_scheduler": True,
    "xla_gpu_enable_command_buffer": "",
    "xla_gpu_all_reduce_combine_threshold_bytes": 1073741824,
    "xla_gpu_all_gather_combine_threshold_bytes": 1073741824,
    "xla_gpu_reduce_scatter_combine_threshold_bytes": 134217728,
    "xla_gpu_enable_pipelined_all_gather": True,
    "xla_gpu_enable_pipelined_reduce_scatter": True,
    "xla_gpu_enable_pipelined_all_reduce": True,
    "xla_gpu_enable_while_loop_double_buffering": True,
    "xla_gpu_enable_all_gather_combine_by_dim": False,
    "xla_gpu_enable_reduce_scatter_combine_by_dim": False,
    "xla_disable_hlo_passes": "rematerialization",
}
# Threshold values lagom tries per kind: off, powers of 4 from 1 MiB, XLA's default,
# and the recipe's values.
THRESHOLD_CANDIDATES = (0, 1 << 20, 4 << 20, 16 << 20, DEFAULT_COMBINE_THRESHOLD_BYTES, 128 << 20, 1 << 30)
CHUNK_CANDIDATES = (2, 4)
# A piece below this is latency-bound on every preset (NCCL's LL/LL128 range), so
# pipelining it cannot pay for the extra launches.
MIN_CHUNK_PIECE_BYTES = 1 << 20
OVERLAP_CANDIDATES = (1, 2, 4)
# Steps up to this many tasks are evaluated whole; larger ones per collective window.
FULL_GRAPH_TASKS = 64
WINDOW_MARGIN_TASKS = 3
SEGMENT_TASKS = 160
# Candidates per collective evaluated in the coarse pass of lagom's scan.
SCAN_COARSE = 8
EXHAUSTIVE_LIMIT = 200_000


@dataclasses.dataclass(frozen=True)
class Space:
    """What a strategy may choose.

    ``max_candidates`` caps the per-collective candidates (evenly over the Pareto front,
    plus NCCL's own choice) so that ``exhaustive`` stays feasible. With
    ``tune_structure=False`` every strategy keeps the recipe's structure (its combine
    thresholds, latency-hiding scheduler, one collective in flight, no pipelining) and
    only the per-collective parameters are searched.
    """

    max_candidates: int | None = None
    tune_structure: bool = True
    # Splitting one collective into pipelined pieces (passes.chunk) has no XLA flag that
    # applies it to a compiled step, so a Plan could not carry it out: off unless asked
    # for, as a what-if.
    split_collectives: bool = False
    # XLA's windowed einsum (collective matmul) as one more structure choice of lagom and
    # exhaustive; only graphs with all-gather/reduce-scatter + matmul pairs are affected.
    # Off unless asked for, as a what-if: jaxlib 0.10.2's XLA caps windowed-einsum loops
    # at the fast-interconnect slice size (dot_handler.cc, GetWindowedEinsumConfiguration),
    # which a deviceless compile leaves at 0 (GpuCompiler::CompileAheadOfTime; fixed by
    # openxla/xla 75d31665) and a real client sets to its local GPUs, so no compile here
    # can confirm that the flag applies and a step over more GPUs than one host refuses it.
    windowed_einsum: bool = False

    def __post_init__(self) -> None:
        if self.max_candidates is not None and self.max_candidates < 1:
            raise ValueError(f"max_candidates must be >= 1 or None, got {self.max_candidates}")


@dataclasses.dataclass(frozen=True)
class Structure:
    """The graph-level choices: what XLA flags decide."""

    thresholds: tuple[tuple[str, int], ...]
    latency_hiding: bool
    overlap_limit: int = 1
    # (collective id in the combined graph, pieces) for pipelined collectives.
    chunks: tuple[tuple[int, int], ...] = ()
    # XLA's collective matmul (``xla_gpu_threshold_for_windowed_einsum_mib``): True = 0,
    # every all-gather+matmul and matmul+reduce-scatter runs as a ring of
    # collective-permutes and partial matmuls (passes.decompose, XLA's order); False =
    # XLA's default 100000 MiB, off in practice.
    windowed_einsum: bool = False

    @property
    def threshold_map(self) -> dict[str, int]:
        return dict(self.thresholds)


def _thresholds(values: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple((k, int(values.get(k, DEFAULT_COMBINE_THRESHOLD_BYTES))) for k in COMBINABLE_KINDS)


def xla_default_structure(hw: HardwareProfile) -> Structure:
    """What XLA does with no flags: default thresholds; the latency-hiding scheduler where
    XLA runs it unasked (Hopper, ``HardwareProfile.xla_schedules_by_default``)."""
    return Structure(_thresholds({}), latency_hiding=hw.xla_schedules_by_default)
RECIPE_STRUCTURE = Structure(
    _thresholds({k: RECIPE_FLAGS[f] for k, f in THRESHOLD_FLAGS.items() if f in RECIPE_FLAGS}),  # type: ignore[misc]
    latency_hiding=bool(RECIPE_FLAGS["xla_gpu_enable_latency_hiding_scheduler"]),
)


@dataclasses.dataclass(frozen=True)
class Explanation:
    """Why one collective got its parameters: the winner against the alternatives."""

    name: str
    kind: str
    nbytes: float
    params: CollectiveParams
    chunks: int
    time_us: float  # the collective alone, per piece when chunked
    exposed_us: float
    reason: str


@dataclasses.dataclass(frozen=True)
class SearchResult:
    """A strategy's choices for one step and the predicted timeline under them.

    ``graph`` is the step after the passes (combined, chunked, scheduled); ``params`` is
    keyed by its collective ids. ``structure`` holds the flag-level choices a Plan renders.
    """

    strategy: str
    hardware: str
    graph_fingerprint: str
    graph: StepGraph
    timeline: Timeline
    params: tuple[tuple[int, CollectiveParams], ...]
    structure: Structure
    evaluations: int
    search_time_s: float
    explanations: tuple[Explanation, ...]
    notes: tuple[str, ...] = ()

    @property
    def makespan_us(self) -> float:
        return self.timeline.makespan_us

    @property
    def bound_us(self) -> float:
        return self.timeline.bound_us

    @property
    def thresholds(self) -> dict[str, int]:
        return self.structure.threshold_map

    @property
    def overlap_limit(self) -> int:
        return self.structure.overlap_limit

    @property
    def param_map(self) -> dict[int, CollectiveParams]:
        return dict(self.params)


class Strategy(Protocol):
    """Maps a step and a hardware profile to a search result."""

    def __call__(self, graph: StepGraph, hw: HardwareProfile, space: Space) -> SearchResult: ...


def fingerprint(graph: StepGraph) -> str:
    """Content hash of a step graph (names included: they appear in explanations)."""
    return hashlib.sha256(repr(graph).encode()).hexdigest()[:16]


# --- candidates ----------------------------------------------------------------------


def _time(t: Task, p: CollectiveParams, hw: HardwareProfile, num_devices: int) -> float:
    shape = collective_shape(t, num_devices, hw)
    time_us = _time_table(shape, hw).get(p)
    return cost.collective_time_us(*shape, p, hw) if time_us is None else time_us


@functools.lru_cache(maxsize=1 << 12)
def _time_table(shape: tuple[str, float, int, int], hw: HardwareProfile) -> Mapping[CollectiveParams, float]:
    """``cost.candidate_times`` of one collective size as a read-only lookup: the search
    asks for the time of a candidate far more often than it tabulates a size."""
    return types.MappingProxyType(dict(cost.candidate_times(*shape, hw)))


def _default(t: Task, hw: HardwareProfile, num_devices: int) -> CollectiveParams:
    return cost.nccl_default_params(*collective_shape(t, num_devices, hw), hw)


_CANDIDATES: dict[tuple, tuple[CollectiveParams, ...]] = {}


def candidates(
    t: Task, hw: HardwareProfile, max_candidates: int | None = None, *, num_devices: int = 1
) -> tuple[CollectiveParams, ...]:
    """The Pareto front of ``cost.candidate_params`` in (time, SMs, HBM), NCCL's pick first.

    With ``max_candidates`` the front is thinned evenly (by channel count) to that many.
    ``num_devices`` sizes collectives with empty replica groups (all devices).
    """
    shape = collective_shape(t, num_devices, hw)
    key = (shape, hw, max_candidates)
    if key in _CANDIDATES:
        return _CANDIDATES[key]
    nodes = shape[3]
    scored = []
    for p, time_us in cost.candidate_times(*shape, hw):
        sms, hbm = cost.comm_resource_use(p, hw, nodes=nodes)
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


# --- evaluation ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Built:
    """A structure applied: the scheduled graph and, per collective, its combined-graph id."""

    schedule: Schedule
    origins: tuple[tuple[int, ...], ...]
    parent: tuple[tuple[int, int], ...]  # (collective id in schedule.graph, combined-graph id)

    def params(self, params: Mapping[int, CollectiveParams], override: tuple[int, CollectiveParams] | None = None
               ) -> dict[int, CollectiveParams]:
        if override is None:
            return {i: params[c] for i, c in self.parent}
        cid, p = override
        return {i: p if c == cid else params[c] for i, c in self.parent}


class _Evaluator:
    """Builds and simulates configurations of one step, counting every evaluation.

    Built schedules are cached per structure (and per window), so trying the candidates
    of one collective re-simulates the same graph object with other params only.
    """

    def __init__(self, graph: StepGraph, hw: HardwareProfile, space: Space) -> None:
        self.graph, self.hw, self.space = graph, hw, space
        self.evaluations = 0
        self._decomposed: Rewrite | None = None
        self._combined: dict[tuple, Rewrite] = {}
        self._ties: dict[tuple, tuple[tuple[int, ...], dict[int, tuple[int, ...]]]] = {}
        self._built: dict[Structure, _Built] = {}
        self._windows: dict[tuple, _Built] = {}

    def time(self, t: Task, p: CollectiveParams) -> float:
        return _time(t, p, self.hw, self.graph.num_devices)

    def default(self, t: Task) -> CollectiveParams:
        return _default(t, self.hw, self.graph.num_devices)

    def candidates(self, t: Task) -> tuple[CollectiveParams, ...]:
        return candidates(t, self.hw, self.space.max_candidates, num_devices=self.graph.num_devices)

    def resources(self, t: Task, p: CollectiveParams) -> tuple[float, float]:
        return cost.comm_resource_use(p, self.hw, nodes=collective_shape(t, self.graph.num_devices, self.hw)[3])

    def decomposed(self) -> Rewrite:
        """The step with every windowed-einsum pair decomposed, as XLA does at threshold 0."""
        if self._decomposed is None:
            self._decomposed = decompose_rewrite(self.graph, 0, order=XLA_ORDER)
        return self._decomposed

    def combined(self, structure: Structure) -> Rewrite:
        """The step after windowed einsum (when chosen) and the combiners."""
        key = (structure.thresholds, structure.windowed_einsum)
        if key not in self._combined:
            g0 = self.decomposed().graph if structure.windowed_einsum else self.graph
            self._combined[key] = combine_rewrite(g0, structure.threshold_map)
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
        return _Built(sched, rw.origins, parent)

    def build(self, structure: Structure) -> _Built:
        """The whole step under ``structure``; collectives keep their combined-graph ids."""
        if structure not in self._built:
            self._built[structure] = self._apply(self.combined(structure).graph, dict(structure.chunks), structure)
        return self._built[structure]

    def full(self, structure: Structure, params: Mapping[int, CollectiveParams]) -> Timeline:
        built = self.build(structure)
        self.evaluations += 1
        sched = built.schedule
        return simulate(sched.graph, self.hw, built.params(params),
                        overlap_limit=sched.overlap_limit, priority=sched.priority_map)

    def window(self, structure: Structure, params: Mapping[int, CollectiveParams], cid: int,
               p: CollectiveParams | None = None) -> float:
        """Makespan of the part of the step that collective ``cid`` (combined graph) can
        affect, with ``cid`` running ``p`` (default: its params in ``params``).

        Small steps are simulated whole, so the search on them is exact under the model.
        """
        override = None if p is None else (cid, p)
        g1 = self.combined(structure).graph
        if len(g1.tasks) <= FULL_GRAPH_TASKS:
            built = self.build(structure)
        else:
            built = self._window(structure, cid)
        self.evaluations += 1
        sched = built.schedule
        return makespan_us(sched.graph, self.hw, built.params(params, override),
                           overlap_limit=sched.overlap_limit, priority=sched.priority_map)

    def _window(self, structure: Structure, cid: int) -> _Built:
        """Tasks from a few before ``cid``'s producers to a few after its first consumer."""
        g1 = self.combined(structure).graph
        lo, hi = len(g1.tasks), 0
        for m in self.ties(structure)[1][cid]:
            t = g1.tasks[m]
            users = g1.consumers[m]
            lo = min(lo, max(0, min(t.deps, default=m) - WINDOW_MARGIN_TASKS))
            hi = max(hi, min(len(g1.tasks) - 1, max(users[:1], default=m) + WINDOW_MARGIN_TASKS))
        chunks = tuple((c, k) for c, k in structure.chunks if lo <= c <= hi)
        key = (structure.thresholds, structure.windowed_einsum, structure.latency_hiding, structure.overlap_limit,
               chunks, lo, hi)
        if key not in self._windows:
            # One collective is tuned at a time: keep only its window alive, so that
            # per-graph caches downstream (the simulator's) do not grow with the step.
            self._windows.clear()
            ids = {old: old - lo for old in range(lo, hi + 1)}
            tasks = tuple(
                dataclasses.replace(
                    g1.tasks[old], id=new, done_before=None,
                    deps=tuple(ids[d] for d in g1.tasks[old].deps if d in ids),
                )
                for old, new in ids.items()
            )
            sub = StepGraph(f"{g1.name}[{lo}:{hi + 1}]", tasks, g1.num_devices)
            self._windows[key] = self._apply(sub, {c - lo: k for c, k in chunks}, structure,
                                             back={new: old for old, new in ids.items()})
        return self._windows[key]


# --- the result ----------------------------------------------------------------------


def _exposed(timeline: Timeline) -> dict[int, float]:
    return timeline.exposed


def _finish(
    name: str,
    ev: _Evaluator,
    structure: Structure,
    params: Mapping[int, CollectiveParams],
    started: float,
    reasons: Mapping[int, str],
    notes: tuple[str, ...] = (),
    timeline: Timeline | None = None,
) -> SearchResult:
    built = ev.build(structure)
    if timeline is None:
        timeline = ev.full(structure, params)
    exposed = _exposed(timeline)
    chunks = dict(structure.chunks)
    final = built.params(params)
    explanations = []
    tuned_as = dict(built.parent)
    for t in built.schedule.graph.collectives:
        origin = built.origins[t.id][0]
        p = final[t.id]
        explanations.append(
            Explanation(
                name=t.name,
                kind=t.kind,
                nbytes=t.bytes,
                params=p,
                chunks=chunks.get(origin, 1),
                time_us=ev.time(t, p),
                exposed_us=exposed.get(t.id, 0.0),
                reason=reasons.get(tuned_as[t.id], ""),
            )
        )
    return SearchResult(
        strategy=name,
        hardware=ev.hw.name,
        graph_fingerprint=fingerprint(ev.graph),
        graph=built.schedule.graph,
        timeline=timeline,
        params=tuple(sorted(final.items())),
        structure=structure,
        evaluations=ev.evaluations,
        search_time_s=time.perf_counter() - started,
        explanations=tuple(explanations),
        notes=notes,
    )


def _policy_params(ev: _Evaluator, structure: Structure, policy: str) -> dict[int, CollectiveParams]:
    """Per-collective params of the combined graph under a simple policy."""
    out = {}
    for t in ev.tuned(structure):
        if policy == "nccl":
            out[t.id] = ev.default(t)
        else:  # "fastest": AutoCCL's objective, the collective's own duration
            out[t.id] = min(ev.candidates(t), key=lambda p, t=t: ev.time(t, p))
    return out


def _base_structure(space: Space, structure: Structure) -> Structure:
    return structure if space.tune_structure else RECIPE_STRUCTURE


def _xla_default(graph: StepGraph, hw: HardwareProfile, space: Space) -> SearchResult:
    started = time.perf_counter()
    ev = _Evaluator(graph, hw, space)
    s = _base_structure(space, xla_default_structure(hw))
    params = _policy_params(ev, s, "nccl")
    return _finish("xla-default", ev, s, params, started, {c: "NCCL's own choice (XLA defaults)" for c in params})


def _recipe(graph: StepGraph, hw: HardwareProfile, space: Space) -> SearchResult:
    started = time.perf_counter()
    ev = _Evaluator(graph, hw, space)
    params = _policy_params(ev, RECIPE_STRUCTURE, "nccl")
    return _finish("recipe", ev, RECIPE_STRUCTURE, params, started,
                   {c: "NCCL's own choice (MaxText recipe flags)" for c in params})


def _autoccl(graph: StepGraph, hw: HardwareProfile, space: Space) -> SearchResult:
    started = time.perf_counter()
    ev = _Evaluator(graph, hw, space)
    s = _base_structure(space, xla_default_structure(hw))
    params = _policy_params(ev, s, "fastest")
    tuned = ev.tuned(s)
    # AutoCCL tries candidates on the running job: one measurement per candidate.
    ev.evaluations += sum(len(ev.candidates(t)) for t in tuned)
    reasons = {
        t.id: f"fastest alone ({ev.time(t, params[t.id]):.1f} us; NCCL's pick "
        f"{ev.time(t, ev.default(t)):.1f} us), blind to the compute it slows"
        for t in tuned
    }
    return _finish("autoccl", ev, s, params, started, reasons)


def _priority(ev: _Evaluator, structure: Structure, params: Mapping[int, CollectiveParams],
              timeline: Timeline) -> tuple[list[int], dict[int, float]]:
    """Collectives of the combined graph, highest effect on the makespan first, and
    the exposed time of each.

    Effect = exposed time + the compute time it takes away while running (its duration x
    the share of SMs it holds): the two ways a collective lengthens the step.
    """
    built = ev.build(structure)
    exposed = _exposed(timeline)
    score: dict[int, float] = {}
    exposed_by: dict[int, float] = {}
    final = built.params(params)
    tuned_as = dict(built.parent)
    for t in built.schedule.graph.collectives:
        origin = tuned_as[t.id]
        p = final[t.id]
        sms, _ = ev.resources(t, p)
        exposed_by[origin] = exposed_by.get(origin, 0.0) + exposed.get(t.id, 0.0)
        score[origin] = score.get(origin, 0.0) + exposed.get(t.id, 0.0) + ev.time(t, p) * sms / ev.hw.sm_count
    return sorted(score, key=lambda c: (-score[c], c)), exposed_by


def _prefix(graph: StepGraph, n: int) -> StepGraph:
    """The first ``n`` tasks: deps point backwards, so a prefix is a step of its own."""
    tasks = tuple(
        dataclasses.replace(t, done_before=t.done_before if t.done_before is not None and t.done_before < n else None)
        for t in graph.tasks[:n]
    )
    return StepGraph(f"{graph.name}[:{n}]", tasks, graph.num_devices)


def _better(a: float, b: float) -> bool:
    """Strictly better by more than float noise."""
    return a < b - 1e-9 * max(abs(b), 1.0)


def _lagom(graph: StepGraph, hw: HardwareProfile, space: Space) -> SearchResult:
    started = time.perf_counter()
    ev = _Evaluator(graph, hw, space)
    notes: list[str] = []
    # 1. Seeds: the three baselines; keep the best.
    seeds = []
    for label, s0, policy in (
        ("xla-default", xla_default_structure(hw), "nccl"),
        ("recipe", RECIPE_STRUCTURE, "nccl"),
        ("autoccl", xla_default_structure(hw), "fastest"),
    ):
        s = _base_structure(space, s0)
        params = _policy_params(ev, s, policy)
        seeds.append((ev.full(s, params).makespan_us, label, s, policy, params))
    best_ms, label, structure, policy, params = min(seeds, key=lambda x: x[0])
    seed_ms = best_ms
    notes.append(f"started from {label} ({best_ms:.1f} us)")

    # 2. Structure: scheduler and per-kind combine thresholds (params follow the policy).
    # A long step is judged on its first SEGMENT_TASKS tasks (a few layers of a step
    # that repeats its layers); the whole-step check at the end guards the choice.
    sev = ev if len(graph.tasks) <= SEGMENT_TASKS else _Evaluator(_prefix(graph, SEGMENT_TASKS), hw, space)
    if space.tune_structure:
        best_ms = sev.full(structure, _policy_params(sev, structure, policy)).makespan_us
        kinds = {t.kind for t in graph.collectives}
        # Windowed einsum is tried only where XLA would apply it: pairs with a matmul.
        windowed = [("windowed-einsum", 0)] if space.windowed_einsum and eligible_pairs(sev.graph) else []
        moves: list[tuple[str, int]] = [("latency-hiding", 0)] + windowed + [
            (kind, v) for kind in COMBINABLE_KINDS if kind in kinds for v in THRESHOLD_CANDIDATES
        ]
        for what, value in moves:
            # Each move is applied to the best structure so far.
            if what == "latency-hiding":
                trial = dataclasses.replace(structure, latency_hiding=not structure.latency_hiding)
            elif what == "windowed-einsum":
                trial = dataclasses.replace(structure, windowed_einsum=True)
                ms = sev.full(trial, _policy_params(sev, trial, policy)).makespan_us
                pairs = len(eligible_pairs(sev.graph))
                if _better(ms, best_ms):
                    notes.append(
                        f"windowed einsum (collective matmul) on: {pairs} all-gather/reduce-scatter + matmul "
                        f"pairs as ring steps beside partial matmuls, {best_ms:.1f} -> {ms:.1f} us"
                        + (f" on the first {SEGMENT_TASKS} tasks" if sev is not ev else "")
                    )
                    best_ms, structure = ms, trial
                else:
                    notes.append(
                        f"windowed einsum kept off: decomposing {pairs} pairs gives {ms:.1f} us, not better "
                        f"than {best_ms:.1f} us"
                    )
                continue
            elif value == structure.threshold_map[what]:
                continue
            else:
                trial = dataclasses.replace(
                    structure, thresholds=_thresholds({**structure.threshold_map, what: value})
                )
                if sev.combined(trial).origins == sev.combined(structure).origins:
                    continue  # the same combine groups: nothing new to evaluate
            ms = sev.full(trial, _policy_params(sev, trial, policy)).makespan_us
            if _better(ms, best_ms):
                best_ms, structure = ms, trial
        params = _policy_params(ev, structure, policy)
        if sev is not ev:
            ev.evaluations += sev.evaluations
        seed_thresholds = dict(seeds[[x[1] for x in seeds].index(label)][2].thresholds)
        changed = [k for k, v in structure.thresholds if k in kinds and v != seed_thresholds[k]]
        if changed:
            notes.append(
                "combine thresholds: "
                + ", ".join(f"{k}={v}" for k, v in structure.thresholds if k in changed)
            )

    # 3. Per collective, in priority order: params, then pipelining.
    g1 = ev.combined(structure).graph
    order, exposed = _priority(ev, structure, params, ev.full(structure, params))
    params = dict(params)
    reasons: dict[int, str] = {}
    for cid in order:
        t = g1.tasks[cid]
        current = params[cid]
        base = ev.window(structure, params, cid)
        scores: dict[CollectiveParams, float] = {current: base}
        _scan(ev.candidates(t), scores, lambda p, cid=cid: ev.window(structure, params, cid, p))
        winner = min(scores, key=lambda p: (scores[p], p != current))
        if _better(scores[winner], base):
            params[cid] = winner
        reasons[cid] = _why(ev, t, params[cid], current, scores)
        # Pipelining only removes exposed fill and drain; with nothing exposed it could
        # only add launches.
        if (space.tune_structure and space.split_collectives and exposed[cid] > 0
                and not (structure.windowed_einsum and t.kind == "collective-permute")
                and t.bytes / max(CHUNK_CANDIDATES) >= MIN_CHUNK_PIECE_BYTES):
            now = scores[params[cid]]
            for k in CHUNK_CANDIDATES:
                trial = dataclasses.replace(structure, chunks=tuple(sorted({**dict(structure.chunks), cid: k}.items())))
                ms = ev.window(trial, params, cid)
                if _better(ms, now):
                    structure, now = trial, ms
                    reasons[cid] += f"; pipelined in {k} pieces: window {ms:.1f} us"

    # 4. How many collectives in flight.
    timeline = ev.full(structure, params)
    if space.tune_structure:
        for limit in OVERLAP_CANDIDATES:
            if limit == structure.overlap_limit:
                continue
            trial = dataclasses.replace(structure, overlap_limit=limit)
            tl = ev.full(trial, params)
            if _better(tl.makespan_us, timeline.makespan_us):
                structure, timeline = trial, tl
                notes.append(f"overlap limit {limit}")

    # Windows are local; never hand back something the whole step does worse on.
    if _better(seed_ms, timeline.makespan_us):
        notes.append(f"per-window choices lost on the whole step ({timeline.makespan_us:.1f} us); kept {label}")
        s = _base_structure(space, {"xla-default": xla_default_structure(hw), "recipe": RECIPE_STRUCTURE,
                                     "autoccl": xla_default_structure(hw)}[label])
        return _finish("lagom", ev, s, _policy_params(ev, s, policy), started, {}, tuple(notes))
    return _finish("lagom", ev, structure, params, started, reasons, tuple(notes), timeline)


def _scan(cands: tuple[CollectiveParams, ...], scores: dict[CollectiveParams, float],
          evaluate: Callable[[CollectiveParams], float]) -> None:
    """Score candidates into ``scores``: all of them when there are few, else coarse to fine.

    ``cands`` after NCCL's pick runs along the Pareto front from the fewest resources to
    the most; the step time along it falls while the collective is exposed and rises once
    the compute it slows dominates. So: every SCAN_COARSE-th point, then walk from the best
    one to its neighbours while they improve.
    """
    def score(i: int) -> float:
        p = front[i]
        if p not in scores:
            scores[p] = evaluate(p)
        return scores[p]

    if cands[0] not in scores:
        scores[cands[0]] = evaluate(cands[0])
    front = cands[1:]
    if len(front) <= SCAN_COARSE:
        for i in range(len(front)):
            score(i)
        return
    step = (len(front) - 1) / (SCAN_COARSE - 1)
    coarse = sorted({round(i * step) for i in range(SCAN_COARSE)})
    best = min(coarse, key=score)
    for direction in (-1, 1):
        i = best
        while 0 <= i + direction < len(front) and score(i + direction) < score(i):
            i += direction


def _why(ev: _Evaluator, t: Task, chosen: CollectiveParams, previous: CollectiveParams,
         scores: Mapping[CollectiveParams, float]) -> str:
    """Name the winner's makespan against the previous choice and the fastest-alone one."""
    fastest = min(scores, key=lambda p: (ev.time(t, p), p))
    text = f"{chosen.describe()}: step {scores[chosen]:.1f} us, alone {ev.time(t, chosen):.1f} us"
    if chosen == previous:
        text += " (kept: no candidate shortened the step)"
    else:
        text += f"; was {previous.describe()} at {scores[previous]:.1f} us"
    if fastest != chosen:
        text += (
            f"; fastest alone {fastest.describe()} ({ev.time(t, fastest):.1f} us) gives "
            f"{scores[fastest]:.1f} us: its extra SMs/HBM slow the overlapped compute more than it saves"
        )
    return text


def _exhaustive(graph: StepGraph, hw: HardwareProfile, space: Space, limit: int = EXHAUSTIVE_LIMIT) -> SearchResult:
    started = time.perf_counter()
    ev = _Evaluator(graph, hw, space)
    if space.tune_structure:
        windowed = (False, True) if space.windowed_einsum and eligible_pairs(graph) else (False,)
        structures = [
            dataclasses.replace(s, overlap_limit=o, windowed_einsum=w)
            for w in windowed
            for s in (xla_default_structure(hw), RECIPE_STRUCTURE,
                      Structure(_thresholds({k: 0 for k in COMBINABLE_KINDS}), True))
            for o in OVERLAP_CANDIDATES
        ]
    else:
        structures = [RECIPE_STRUCTURE]
    sizes = []
    for s in structures:
        sizes.append(math.prod(len(ev.candidates(t)) for t in ev.tuned(s)))
    total = sum(sizes)
    if total > limit:
        raise ValueError(
            f"exhaustive search of {graph.name!r} needs {total} evaluations (limit {limit}): use "
            f"strategy 'lagom', or a smaller Space(max_candidates=...) / fewer collectives"
        )
    best: tuple[float, Structure, dict[int, CollectiveParams], Timeline] | None = None
    for s in structures:
        tuned = ev.tuned(s)
        ids = [t.id for t in tuned]
        for combo in itertools.product(*(ev.candidates(t) for t in tuned)):
            params = dict(zip(ids, combo))
            tl = ev.full(s, params)
            if best is None or _better(tl.makespan_us, best[0]):
                best = (tl.makespan_us, s, params, tl)
    assert best is not None
    ms, s, params, tl = best
    reasons = {c: f"optimum of {total} combinations: step {ms:.1f} us" for c in params}
    return _finish("exhaustive", ev, s, params, started, reasons, (), tl)


_STRATEGY_FNS: dict[str, Callable[[StepGraph, HardwareProfile, Space], SearchResult]] = {
    "xla-default": _xla_default,
    "recipe": _recipe,
    "autoccl": _autoccl,
    "lagom": _lagom,
    "exhaustive": _exhaustive,
}
_CACHE: dict[tuple[str, HardwareProfile, str, Space], SearchResult] = {}


def run_strategy(name: str, graph: StepGraph, hw: HardwareProfile, space: Space = Space()) -> SearchResult:
    """Run one strategy; results are cached by (graph content, hardware, strategy, space)."""
    if name not in _STRATEGY_FNS:
        raise ValueError(f"unknown strategy {name!r} (known: {', '.join(STRATEGIES)})")
    key = (fingerprint(graph), hw, name, space)
    if key not in _CACHE:
        _CACHE[key] = _STRATEGY_FNS[name](graph, hw, space)
    return _CACHE[key]


def clear_cache() -> None:
    """Forget cached results (after the cost model changed in-process)."""
    _CACHE.clear()
    _CANDIDATES.clear()
    _time_table.cache_clear()


# --- report --------------------------------------------------------------------------


def compare(graph: StepGraph, hw: HardwareProfile, space: Space = Space()) -> dict[str, SearchResult | str]:
    """Every strategy on one step; a strategy that refuses (exhaustive) maps to its reason."""
    out: dict[str, SearchResult | str] = {}
    for name in STRATEGIES:
        try:
            out[name] = run_strategy(name, graph, hw, space)
        except ValueError as e:
            if name != "exhaustive":
                raise
            out[name] = str(e)
    return out


def tune_report(graph: StepGraph, hw: HardwareProfile, *, strategy: str = "lagom", as_json: bool = False) -> str:
    """The plan of ``strategy`` per collective and every strategy's predicted step, side by side.

    Text for people; with ``as_json`` one JSON object holding at least
    ``strategies: {name: {"makespan_us", "evaluations"}}`` and ``bound_us``.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r} (known: {', '.join(STRATEGIES)})")
    results = compare(graph, hw)
    chosen = results[strategy]
    if isinstance(chosen, str):
        raise ValueError(chosen)
    base = results["xla-default"]
    assert isinstance(base, SearchResult)
    bound = chosen.bound_us
    table = {
        name: (
            {"refused": r}
            if isinstance(r, str)
            else {
                "makespan_us": r.makespan_us,
                "evaluations": r.evaluations,
                "search_time_s": r.search_time_s,
                "speedup_vs_xla_default": base.makespan_us / r.makespan_us,
            }
        )
        for name, r in results.items()
    }
    if as_json:
        return json.dumps(
            {
                "graph": graph.name,
                "hardware": hw.name,
                "strategy": strategy,
                "bound_us": bound,
                "strategies": table,
                "structure": {
                    "combine_threshold_bytes": chosen.thresholds,
                    "latency_hiding_scheduler": chosen.structure.latency_hiding,
                    "overlap_limit": chosen.overlap_limit,
                    "windowed_einsum": chosen.structure.windowed_einsum,
                },
                "collectives": [
                    {
                        "name": e.name,
                        "kind": e.kind,
                        "bytes": e.nbytes,
                        "params": dataclasses.asdict(e.params),
                        "pieces_of": e.chunks,
                        "time_us": e.time_us,
                        "exposed_us": e.exposed_us,
                        "why": e.reason,
                    }
                    for e in chosen.explanations
                ],
                "notes": list(chosen.notes),
            },
            indent=2,
        )
    lines = [
        f"{graph.name} on {hw.name}: {len(graph.collectives)} collectives, strategy {strategy}",
        "",
        f"{'strategy':<12} {'step us':>11} {'vs bound':>9} {'speedup':>8} {'evals':>8} {'search s':>9}",
    ]
    for name, r in results.items():
        if isinstance(r, str):
            lines.append(f"{name:<12} refused: {r}")
            continue
        lines.append(
            f"{name:<12} {r.makespan_us:>11.1f} {r.makespan_us / bound:>8.3f}x "
            f"{base.makespan_us / r.makespan_us:>7.3f}x {r.evaluations:>8d} {r.search_time_s:>9.3f}"
        )
    lines += [
        f"{'bound':<12} {bound:>11.1f}   (max of compute alone, communication at its fastest)",
        "",
        f"structure: latency-hiding scheduler {'on' if chosen.structure.latency_hiding else 'off'}, "
        f"overlap limit {chosen.overlap_limit}, windowed einsum {'on' if chosen.structure.windowed_einsum else 'off'}, "
        f"combine thresholds "
        + ", ".join(f"{k}={v}" for k, v in chosen.structure.thresholds),
    ]
    lines += [f"note: {n}" for n in chosen.notes]
    lines += ["", f"{'collective':<32} {'bytes':>11} {'params':<40} {'time us':>9} {'exposed':>9}  why"]
    for e in chosen.explanations:
        lines.append(
            f"{e.name[:32]:<32} {e.nbytes:>11.0f} {e.params.describe():<40} {e.time_us:>9.1f} "
            f"{e.exposed_us:>9.1f}  {e.reason}"
        )
    return "\n".join(lines)

"""One call from a step to a Plan: ``planning.plan(graph, hardware, strategy=...)``.

The decorator, the CLI, ``advise`` and the benchmark suite all reach their Plan here:
the chosen strategy and the baselines run once on the step, and the Plan is made from
the chosen result alone (its explanations carry everything a collective's row needs),
with every result's predicted step beside it. Nothing is recomputed and nothing is
written: rendering files from the Plan belongs to the caller.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from lagom_jax import search
from lagom_jax.cluster.hardware import HardwareProfile
from lagom_jax.cluster.params import MAX_CHANNELS
from lagom_jax.passes import THRESHOLD_FLAGS, unreproduced_kinds
from lagom_jax.plan.schema import CollectiveChoice, Plan
from lagom_jax.program.flags import XlaFlag
from lagom_jax.program.graph import StepGraph

# Bumped whenever a Plan's content or meaning changes: cached plans of another version
# are never read (PlanCache keys include it).
VERSION = "0.5.4"  # 0.5.4: kinds the combine pass cannot reproduce in a compiled module stay as
# compiled; the verification keeps runtime options (the NCCL channel cap)
BASELINES = ("xla-default", "recipe", "autoccl")


@dataclasses.dataclass(frozen=True)
class Planned:
    """A Plan and the search results it was made from (chosen strategy first).

    The Plan is the data to apply, cache and share between processes; ``results`` are for
    whoever wants more than the Plan says (a trace of the timeline, per-strategy search
    cost, the tuned graph to verify against).
    """

    plan: Plan
    results: Mapping[str, search.SearchResult]

    @property
    def chosen(self) -> search.SearchResult:
        return self.results[self.plan.strategy]


def module_space(graph: StepGraph, space: search.Space = search.Space()
                 ) -> tuple[search.Space, tuple[tuple[str, str], ...]]:
    """``space`` for a module XLA compiled (taken as compiled at XLA's default combine
    thresholds), and a decision line per kind it changed: the kinds whose collectives the
    combine pass would merge further in it (``passes.unreproduced_kinds``) keep XLA's
    default threshold and stay as compiled, since the pass cannot say what another
    threshold would compile to for them."""
    found = {k: n for k, n in unreproduced_kinds(graph).items() if k not in space.default_combine_kinds}
    if not found:
        return space, ()
    kinds = tuple(sorted({*space.default_combine_kinds, *found}))
    return dataclasses.replace(space, default_combine_kinds=kinds), tuple(
        (f"{kind} combine threshold", f"left at XLA's default: the compiled module keeps {n} {kind}s apart that "
         "the combine pass would merge at that threshold (XLA keys them apart for a reason the pass does not "
         "model, such as the collective pipeliner's own keys), so no other threshold is predicted for them")
        for kind, n in found.items())


def plan(graph: StepGraph, hardware: HardwareProfile, *, strategy: str = "lagom",
         baselines: tuple[str, ...] = BASELINES, fingerprint: str = "",
         space: search.Space = search.Space(), floor_note: bool = True) -> Planned:
    """Search ``graph`` with ``strategy`` and each baseline; the chosen result as a Plan.

    ``floor_note``: say what lagom's floor held back (`note_floor`, a second search). A
    pipeline that plans several candidate modules or settings and keeps one asks for it
    once, on the one it keeps.

    Raises ValueError for an unknown strategy, or when ``exhaustive`` refuses the step.
    """
    if strategy not in search.STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r} (known: {', '.join(search.STRATEGIES)})")
    results = {name: search.run_strategy(name, graph, hardware, space)
               for name in dict.fromkeys((strategy, *baselines))}
    made = plan_of(results, strategy, hardware, module=graph.name, fingerprint=fingerprint)
    if strategy == "lagom":
        made = dataclasses.replace(made, min_gain=space.min_gain)
    planned = Planned(made, results)
    return note_floor(planned, graph, hardware, space) if floor_note else planned


def note_floor(planned: Planned, graph: StepGraph, hardware: HardwareProfile, space: search.Space) -> Planned:
    """``planned`` (lagom's plan of ``graph`` on ``hardware`` under ``space``) with what the
    floor on per-collective changes held back: lagom's step against the same search taking
    every predicted gain (``min_gain=0``). Other strategies' plans are returned as they are."""
    if planned.plan.strategy != "lagom":
        return planned
    held_back = 0.0
    if space.min_gain != 0:
        eager = search.run_strategy("lagom", graph, hardware, dataclasses.replace(space, min_gain=0.0))
        held_back = max(0.0, planned.chosen.makespan_us - eager.makespan_us)
    return dataclasses.replace(planned, plan=dataclasses.replace(planned.plan, held_back_us=held_back))


def plan_of(results: Mapping[str, search.SearchResult], strategy: str, hardware: HardwareProfile, *,
            module: str, fingerprint: str = "") -> Plan:
    """The Plan of ``results[strategy]``, every result's predicted step beside it."""
    chosen = results[strategy]
    spans = {iv.task_id: (iv.start, iv.end) for iv in chosen.timeline.intervals}
    choices = tuple(
        CollectiveChoice(
            name=e.name, kind=e.kind, bytes=int(e.nbytes), group_size=e.ranks, nodes=e.nodes,
            params=e.params, default_params=e.default_params,
            predicted_us=spans[e.task_id][1] - spans[e.task_id][0], exposed_us=e.exposed_us, why=e.reason,
        )
        for e in chosen.explanations
    )
    costs = tuple((chosen.graph.tasks[i].name, end - start)
                  for i, (start, end) in sorted(spans.items()) if end > start)
    return Plan(
        module=module, fingerprint=fingerprint, hardware=hardware.name,
        gpus_per_node=hardware.gpus_per_node, nodes=hardware.nodes, strategy=strategy, version=VERSION,
        collectives=choices, flags=plan_flags(chosen, hardware),
        predicted_us=tuple((name, r.makespan_us) for name, r in results.items()),
        bound_us=chosen.bound_us, evaluations=chosen.evaluations,
        search_seconds=chosen.search_time_s, costs=costs,
    )


def make_plan(graph: StepGraph, hardware: HardwareProfile, *, strategy: str = "lagom",
              fingerprint: str = "", baselines: tuple[str, ...] = BASELINES) -> Plan:
    """``plan(...).plan``: the Plan alone."""
    return plan(graph, hardware, strategy=strategy, baselines=baselines, fingerprint=fingerprint).plan


def lhs_flags(latency_hiding: bool, hw: HardwareProfile) -> list[XlaFlag]:
    """The flag that gives XLA's latency-hiding scheduler the chosen state on ``hw``.

    Where XLA schedules by default (Hopper) the scheduler flag is already off and the
    speed-of-light estimator keeps the scheduler on: turning that estimator off is what
    turns the scheduler off (``IsLHSEnabled``, xla/service/gpu/gpu_hlo_schedule.cc).
    """
    if latency_hiding == hw.xla_schedules_by_default:
        return []
    if latency_hiding:
        return [XlaFlag("xla_gpu_enable_latency_hiding_scheduler", True)]
    return [XlaFlag("xla_gpu_enable_analytical_sol_latency_estimator", False)]


def plan_flags(result: search.SearchResult, hw: HardwareProfile) -> tuple[XlaFlag, ...]:
    """The flag-level choices of a search result that differ from XLA's defaults."""
    structure = result.structure
    out = [*lhs_flags(bool(structure.latency_hiding), hw),
           XlaFlag("xla_gpu_experimental_parallel_collective_overlap_limit", int(structure.overlap_limit))]
    out += [XlaFlag(THRESHOLD_FLAGS[kind], int(threshold))
            for kind, threshold in structure.thresholds if kind in THRESHOLD_FLAGS]
    if structure.windowed_einsum:  # every eligible einsum becomes a collective matmul
        out.append(XlaFlag("xla_gpu_threshold_for_windowed_einsum_mib", 0))
    # The channels the search chose: NCCL's symmetric kernels take their own CTAs.
    channels = [p.nchannels for _, p in result.params if p.algorithm != "symmetric"]
    # NCCL_MAX_CTAS overrides the maxCTAs XLA passes (NcclEnv), so beside it XLA's cap acts not;
    # under a user's NCCL_MIN_CTAS a lower cap would lower that minimum (NCCL: min := max).
    env = hw.nccl_env
    if channels and max(channels) < MAX_CHANNELS and not env.max_ctas and max(channels) >= env.min_ctas:
        out.append(XlaFlag("xla_gpu_nccl_collective_max_nchannels", max(channels)))
    return tuple(f for f in out if not f.is_default)

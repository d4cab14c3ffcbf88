"""The strategies, from a StepGraph and a HardwareProfile to a SearchResult.

See the package docstring for what each one does. Results are cached in memory by (graph
fingerprint, hardware, strategy, space).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import itertools
import math
import time
from collections.abc import Callable, Mapping

from lagom_jax.cluster.hardware import HardwareProfile
from lagom_jax.cluster.params import CONSULTED_KINDS, CollectiveParams
from lagom_jax.costs.simulate import Timeline
from lagom_jax.passes import COMBINABLE_KINDS
from lagom_jax.program.graph import StepGraph, Task

from . import evaluator as evaluator_lib
from .evaluator import Evaluator
from .results import Explanation, SearchResult, fingerprint
from .space import (
    CHUNK_CANDIDATES,
    MIN_CHUNK_PIECE_BYTES,
    OVERLAP_CANDIDATES,
    RECIPE_STRUCTURE,
    THRESHOLD_CANDIDATES,
    Space,
    Structure,
    thresholds_of,
    xla_default_structure,
)

STRATEGIES = ("xla-default", "recipe", "autoccl", "lagom", "exhaustive")
# A long step's structure is judged on its first SEGMENT_TASKS tasks.
SEGMENT_TASKS = 160
# Candidates per collective evaluated in the coarse pass of lagom's scan.
SCAN_COARSE = 8
EXHAUSTIVE_LIMIT = 200_000
# Starts (baselines after phases 2 and 4, shortest first) that phase 3 searches on from.
FULL_STARTS = 2


def _finish(
    name: str,
    ev: Evaluator,
    structure: Structure,
    params: Mapping[int, CollectiveParams],
    started: float,
    reasons: Mapping[int, str],
    notes: tuple[str, ...] = (),
    timeline: Timeline | None = None,
) -> SearchResult:
    params, reasons, changed = one_choice_per_key(ev, structure, params, reasons)
    built = ev.build(structure)
    if timeline is None or changed:
        timeline = ev.full(structure, params)
    exposed = timeline.exposed
    chunks = dict(structure.chunks)
    final = built.params(params)
    explanations = []
    tuned_as = dict(built.parent)
    for t in built.schedule.graph.collectives:
        origin = built.origins[t.id][0]
        p = final[t.id]
        shape = ev.shape(t)
        explanations.append(
            Explanation(
                task_id=t.id,
                name=t.name,
                kind=shape.kind,
                nbytes=t.bytes,
                ranks=shape.ranks,
                nodes=shape.nodes,
                params=p,
                default_params=ev.default(t),
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


def one_choice_per_key(ev: Evaluator, structure: Structure, params: Mapping[int, CollectiveParams],
                       reasons: Mapping[int, str]) -> tuple[dict[int, CollectiveParams], dict[int, str], bool]:
    """The params NCCL's tuner plugin can apply: one choice per key it is asked by.

    The plugin sees a call's kind, byte count, ranks and nodes, never the HLO instruction
    (``nccl_tuner``; NVIDIA/nccl ``getCollInfo`` in the tuner interface), so collectives whose
    calls share such a key run with one choice whatever the search chose per instruction.
    Each shared key gets the one, among its members' choices and NCCL's default, that predicts
    the shortest step (a full replay per candidate, keys taken longest total time first).
    Returns (params, reasons, whether anything changed).
    """
    built = ev.build(structure)
    graph = built.schedule.graph
    members: dict[tuple, list[int]] = {}
    weight: dict[tuple, float] = {}
    example: dict[tuple, Task] = {}  # one call of the key, for NCCL's default
    for sid, cid in built.parent:
        t = graph.tasks[sid]
        shape = ev.shape(t)
        if shape.kind not in CONSULTED_KINDS or cid not in params:
            continue
        key = (shape.kind, int(t.bytes), shape.ranks, shape.nodes)
        example.setdefault(key, t)
        if cid not in members.setdefault(key, []):
            members[key].append(cid)
        weight[key] = weight.get(key, 0.0) + ev.time(t, params[cid])
    out, why = dict(params), dict(reasons)
    changed = False
    for key in sorted(members, key=lambda k: -weight[k]):
        cids = members[key]
        choices = list(dict.fromkeys(out[c] for c in cids))
        if len(choices) < 2:
            continue
        candidates = list(dict.fromkeys([*choices, ev.default(example[key])]))
        timed = [(ev.makespan(structure, {**out, **dict.fromkeys(cids, p)}), i, p)
                 for i, p in enumerate(candidates)]
        best = min(timed)[2]
        note = (f"one choice for the {len(cids)} calls that NCCL's tuner sees as one key "
                f"({key[0]}, {key[1]} B, {key[2]} ranks, {key[3]} nodes)")
        for c in cids:
            if out[c] != best:
                changed = True
                why[c] = f"{best.describe()}: {note}; alone this instruction would run {out[c].describe()}"
            else:
                why[c] = f"{why[c]}; {note}" if why.get(c) else note
            out[c] = best
    return out, why, changed


def _policy_params(ev: Evaluator, structure: Structure, policy: str) -> dict[int, CollectiveParams]:
    """Per-collective params of the combined graph under a simple policy (a new dict; kept
    per combined graph and policy, which the starts and structure moves ask for again)."""
    key = (structure.thresholds, structure.windowed_einsum, policy)
    if key not in ev.policy_params:
        ev.policy_params[key] = _pick_by_policy(ev, structure, policy)
    return dict(ev.policy_params[key])


def _pick_by_policy(ev: Evaluator, structure: Structure, policy: str) -> dict[int, CollectiveParams]:
    if policy == "nccl":
        return {t.id: ev.default(t) for t in ev.tuned(structure)}
    # A policy's pick depends only on the collective's shape, and the structure moves
    # ask again for the same shapes: pick once per shape.
    picks = ev.policy_picks.setdefault(policy, {})
    out = {}
    for t in ev.tuned(structure):
        shape = ev.shape(t)
        pick = picks.get(shape)
        if pick is None:
            default = ev.default(t)
            # "fastest": AutoCCL's objective, the collective's own duration.
            pick = min(ev.candidates(t), key=lambda p, t=t: ev.time(t, p))
            # "fastest-floored": the same, but NCCL's own choice stays unless the fastest
            # beats it by more than the model's error on its time (``Space.floor``), the
            # floor lagom's own changes meet: a plan asks for 64 channels on a few KiB only
            # with a predicted gain it can show.
            if policy == "fastest-floored" and not _better(ev.time(t, pick),
                                                            ev.time(t, default) * (1 - _floor(ev, t))):
                pick = default
            picks[shape] = pick
        out[t.id] = pick
    return out


def _base_structure(space: Space, structure: Structure) -> Structure:
    s = structure if space.tune_structure else RECIPE_STRUCTURE
    if space.windowed_by_flag:
        s = dataclasses.replace(s, windowed_einsum=True)
    if not space.default_combine_kinds:
        return s
    kept = {k: v for k, v in s.threshold_map.items() if k not in space.default_combine_kinds}
    return dataclasses.replace(s, thresholds=thresholds_of(kept))


# The baselines: (structure, policy) on a step's hardware. lagom starts from the fastest.
def _baseline_setup(hw: HardwareProfile) -> dict[str, tuple[Structure, str]]:
    return {
        "xla-default": (xla_default_structure(hw), "nccl"),
        "recipe": (RECIPE_STRUCTURE, "nccl"),
        "autoccl": (xla_default_structure(hw), "fastest"),
    }


_BASELINE_REASONS = {
    "xla-default": "NCCL's own choice (XLA defaults)",
    "recipe": "NCCL's own choice (MaxText recipe flags)",
}


def _baseline(name: str, graph: StepGraph, hw: HardwareProfile, space: Space) -> SearchResult:
    started = time.perf_counter()
    ev = Evaluator(graph, hw, space)
    seed = _seed(ev, name, *_baseline_setup(hw)[name])
    if name == "autoccl":
        tuned = ev.tuned(seed.structure)
        # AutoCCL tries candidates on the running job: one measurement per candidate.
        ev.evaluations += sum(len(ev.candidates(t)) for t in tuned)
        reasons = {
            t.id: f"fastest alone ({ev.time(t, seed.params[t.id]):.1f} us; NCCL's pick "
            f"{ev.time(t, ev.default(t)):.1f} us), blind to the compute it slows"
            for t in tuned
        }
    else:
        reasons = dict.fromkeys(seed.params, _BASELINE_REASONS[name])
    return _finish(name, ev, seed.structure, seed.params, started, reasons)


def _priority(ev: Evaluator, structure: Structure, params: Mapping[int, CollectiveParams],
              timeline: Timeline) -> tuple[list[int], dict[int, float]]:
    """Collectives of the combined graph, highest effect on the makespan first, and
    the exposed time of each.

    Effect = exposed time + the compute time it takes away while running (its duration x
    the share of SMs it holds): the two ways a collective lengthens the step.
    """
    built = ev.build(structure)
    exposed = timeline.exposed
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


def _segment(ev: Evaluator) -> Evaluator:
    """The first SEGMENT_TASKS tasks of ``ev``'s step as an evaluator of their own, made once:
    every start of lagom tries structures on it, many the same (their combined steps, builds
    and prepared replays are kept)."""
    if ev.segment is None:
        ev.segment = Evaluator(_prefix(ev.graph, SEGMENT_TASKS), ev.hw, ev.space)
    return ev.segment


def _floor(ev: Evaluator, t: Task) -> float:
    """The fraction of ``t``'s time a change of it must gain (``Space.floor``)."""
    shape = ev.shape(t)
    return ev.space.floor(shape.bytes, shape.nodes)


def _better(a: float, b: float) -> bool:
    """Strictly better by more than float noise."""
    return a < b - 1e-9 * max(abs(b), 1.0)


@dataclasses.dataclass(frozen=True)
class _Seed:
    """A baseline lagom may start from, with its step time and params."""

    label: str
    structure: Structure
    policy: str  # "nccl" (NCCL's own pick), "fastest" (AutoCCL's objective) or "fastest-floored"
    makespan_us: float
    params: Mapping[int, CollectiveParams]


def _lagom(graph: StepGraph, hw: HardwareProfile, space: Space) -> SearchResult:
    """Lagom's priority-based search, in four phases; see the package docstring.

    Phase 2 (the structure, a few dozen evaluations, most on a segment of a long step) runs
    from every distinct baseline: they are greedy, one move at a time, so the fastest
    start need not give the shortest end (a recipe's thresholds, or a floored autoccl that
    contends less with compute, can end shorter). Phase 3, per collective and the costly
    one, runs on from the FULL_STARTS starts that ended shortest, and the shortest end is
    kept (of equal ends, the one from the shorter start). Nothing is handed back that the whole step
    does worse on than the fastest baseline, so lagom is never predicted slower than one.
    """
    started = time.perf_counter()
    ev = Evaluator(graph, hw, space)
    seeds = sorted(_seeds(ev), key=lambda x: x.makespan_us)  # stable: ties keep _seeds' order
    fastest = seeds[0]
    distinct: dict[tuple, _Seed] = {}
    for seed in seeds:
        distinct.setdefault((seed.structure, tuple(sorted(seed.params.items()))), seed)
    starts = []
    for seed in distinct.values():
        notes = [f"started from {seed.label} ({seed.makespan_us:.1f} us)"]
        structure = _tune_structure(ev, seed, notes) if space.tune_structure else seed.structure
        params = _policy_params(ev, structure, seed.policy) if space.tune_structure else dict(seed.params)
        starts.append((ev.makespan(structure, params), seed, structure, notes))
    starts.sort(key=lambda x: x[0])
    if len(starts) > 1:
        starts[0][3].append("structure from each baseline: " + ", ".join(
            f"{s.label} {ms:.1f} us" for ms, s, _, _ in starts))
    ends = []
    for _, seed, structure, notes in starts[:FULL_STARTS]:
        params = _policy_params(ev, structure, seed.policy) if space.tune_structure else dict(seed.params)
        structure, params, reasons = _tune_collectives(ev, structure, params, seed.label)
        structure, timeline = _tune_overlap(ev, structure, params, notes)
        params, reasons, changed = one_choice_per_key(ev, structure, params, reasons)
        if changed:
            timeline = ev.full(structure, params)
        ends.append((timeline.makespan_us, len(ends), structure, params, reasons, notes, timeline))
    _, first, structure, params, reasons, notes, timeline = min(ends, key=lambda e: e[:2])
    if len(ends) > 1:
        notes.append("searched on from " + " and ".join(
            f"{starts[i][1].label} ({ms:.1f} us)" for ms, i, *_ in ends) + f": kept {starts[first][1].label}")
    # Windows are local and the tuner's keys merge choices: never hand back something the
    # whole step does worse on than the fastest baseline.
    if _better(fastest.makespan_us, timeline.makespan_us):
        notes.append(f"per-window choices lost on the whole step ({timeline.makespan_us:.1f} us); "
                     f"kept {fastest.label}")
        kept = dict.fromkeys(fastest.params, f"the {fastest.label} choice: the search's changes lost on the whole step")
        return _finish("lagom", ev, fastest.structure, fastest.params, started, kept, tuple(notes))
    return _finish("lagom", ev, structure, params, started, reasons, tuple(notes), timeline)


def _seed(ev: Evaluator, label: str, structure: Structure, policy: str) -> _Seed:
    """A baseline's step as its strategy hands it back (one choice per tuner key)."""
    s = _base_structure(ev.space, structure)
    params, _, _ = one_choice_per_key(ev, s, _policy_params(ev, s, policy), {})
    return _Seed(label, s, policy, ev.makespan(s, params), params)


def _seeds(ev: Evaluator) -> list[_Seed]:
    """Phase 1: the baselines, each exactly as its own strategy runs it, and autoccl held to
    lagom's floor (a collective keeps NCCL's pick unless its fastest candidate beats it by
    more than the model's error). In this order, so that of equally fast starts the first
    (the one asking for fewer changes) is taken."""
    setups = _baseline_setup(ev.hw)
    seeds = [_seed(ev, name, *setups[name]) for name in ("xla-default", "recipe")]
    seeds.append(_seed(ev, "autoccl-floored", setups["autoccl"][0], "fastest-floored"))
    seeds.append(_seed(ev, "autoccl", *setups["autoccl"]))
    return seeds


def _tune_structure(ev: Evaluator, seed: _Seed, notes: list[str]) -> Structure:
    """Phase 2: the scheduler, windowed einsum and per-kind combine thresholds, one move
    at a time on the best structure so far (params follow the seed's policy).

    A long step is judged on its first SEGMENT_TASKS tasks (a few layers of a step that
    repeats its layers); the whole-step check at the end of the search guards the choice.
    """
    graph, policy, structure = ev.graph, seed.policy, seed.structure
    sev = ev if len(graph.tasks) <= SEGMENT_TASKS else _segment(ev)
    counted = sev.evaluations
    best_ms = sev.makespan(structure, _policy_params(sev, structure, policy))
    kinds = {t.kind for t in graph.collectives}
    # Windowed einsum is tried only where XLA would apply it (pairs with a matmul) and the step's
    # own flags have not already turned it on (``Space.windowed_by_flag``).
    windowed = ([("windowed-einsum", 0)] if ev.space.windowed_einsum and not structure.windowed_einsum
                and sev.windowed_pairs() else [])
    moves: list[tuple[str, int]] = [("latency-hiding", 0)] + windowed + [
        (kind, v) for kind in COMBINABLE_KINDS
        if kind in kinds and kind not in ev.space.default_combine_kinds for v in THRESHOLD_CANDIDATES
    ]
    for what, value in moves:
        if what == "latency-hiding":
            trial = dataclasses.replace(structure, latency_hiding=not structure.latency_hiding)
        elif what == "windowed-einsum":
            trial = dataclasses.replace(structure, windowed_einsum=True)
            ms = sev.makespan(trial, _policy_params(sev, trial, policy))
            found = sev.windowed_pairs()
            pairs = len(found)
            # A rewrite of whole collectives must gain more than the model's error on them
            # (the floor every per-collective change meets), not a rounding of the step.
            floor = sum(_floor(sev, t) * sev.time(t, sev.default(t))
                        for t in (sev.graph.tasks[p.collective] for p in found))
            if _better(ms, best_ms - floor):
                notes.append(
                    f"windowed einsum (collective matmul) on: {pairs} all-gather/reduce-scatter + matmul "
                    f"pairs as ring steps beside partial matmuls, {best_ms:.1f} -> {ms:.1f} us"
                    + (f" on the first {SEGMENT_TASKS} tasks" if sev is not ev else "")
                )
                best_ms, structure = ms, trial
            else:
                notes.append(
                    f"windowed einsum kept off: decomposing {pairs} pairs gives {ms:.1f} us, not better "
                    f"than {best_ms:.1f} us by the {floor:.1f} us floor (the model's error on their collectives)"
                )
            continue
        elif value == structure.threshold_map[what]:
            continue
        else:
            trial = dataclasses.replace(structure, thresholds=thresholds_of({**structure.threshold_map, what: value}))
            if sev.combined(trial).origins == sev.combined(structure).origins:
                continue  # the same combine groups: nothing new to evaluate
        ms = sev.makespan(trial, _policy_params(sev, trial, policy))
        if _better(ms, best_ms):
            best_ms, structure = ms, trial
    if sev is not ev:
        ev.evaluations += sev.evaluations - counted
    seed_thresholds = seed.structure.threshold_map
    changed = [k for k, v in structure.thresholds if k in kinds and v != seed_thresholds[k]]
    if changed:
        notes.append("combine thresholds: " + ", ".join(f"{k}={v}" for k, v in structure.thresholds if k in changed))
    return structure


def _tune_collectives(ev: Evaluator, structure: Structure, params: dict[int, CollectiveParams], seed: str
                      ) -> tuple[Structure, dict[int, CollectiveParams], dict[int, str]]:
    """Phase 3: per collective, in priority order, its params (then its pipelining), each
    over its candidates with the others fixed, scored on the window it can affect."""
    space = ev.space
    g1 = ev.combined(structure).graph
    scope = "step" if len(g1.tasks) <= evaluator_lib.FULL_GRAPH_TASKS else "window"
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
        floor = _floor(ev, t) * ev.time(t, current)
        if _better(scores[winner], base - floor):
            params[cid] = winner
        reasons[cid] = _why(ev, t, params[cid], current, scores, scope=scope, seed=seed, floor=floor)
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
    return structure, params, reasons


def _tune_overlap(ev: Evaluator, structure: Structure, params: Mapping[int, CollectiveParams],
                  notes: list[str]) -> tuple[Structure, Timeline]:
    """Phase 4: how many collectives may be in flight, on the whole step."""
    timeline = ev.full(structure, params)
    if ev.space.tune_structure:
        for limit in OVERLAP_CANDIDATES:
            if limit == structure.overlap_limit:
                continue
            trial = dataclasses.replace(structure, overlap_limit=limit)
            tl = ev.full(trial, params)
            if _better(tl.makespan_us, timeline.makespan_us):
                structure, timeline = trial, tl
                notes.append(f"overlap limit {limit}")
    return structure, timeline


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


def _why(ev: Evaluator, t: Task, chosen: CollectiveParams, previous: CollectiveParams,
         scores: Mapping[CollectiveParams, float], *, scope: str, seed: str, floor: float = 0.0) -> str:
    """Name the winner's time against the previous choice and the fastest-alone one.

    ``scope`` says what the scores are ("step", or "window" for the part of a long step
    the collective can affect); ``seed`` names the baseline the previous choice came from;
    ``floor`` is the gain (us) below which a change was not taken.
    """
    fastest = min(scores, key=lambda p: (ev.time(t, p), p))
    text = f"{chosen.describe()}: {scope} {scores[chosen]:.1f} us, alone {ev.time(t, chosen):.1f} us"
    if chosen == previous:
        whose = "NCCL's own choice" if previous == ev.default(t) else f"the {seed} choice"
        best = min(scores, key=lambda p: (scores[p], p != previous))
        if _better(scores[best], scores[previous]):
            text += (f" (kept {whose}: the best candidate, {best.describe()}, gains only "
                     f"{scores[previous] - scores[best]:.1f} us, within the model's error of "
                     f"{floor:.1f} us on this collective)")
        else:
            text += f" (kept {whose}: no candidate shortened the {scope})"
    else:
        text += f"; was {previous.describe()} at {scores[previous]:.1f} us"
    if fastest != chosen:
        text += f"; fastest alone {fastest.describe()} ({ev.time(t, fastest):.1f} us) gives {scores[fastest]:.1f} us"
        if _better(scores[chosen], scores[fastest]):
            text += ": its extra SMs/HBM slow the overlapped compute more than it saves"
        elif _better(scores[fastest], scores[chosen]):
            text += ": a gain within the model's error"
        else:
            text += ": no better, and it holds more SMs/HBM"
    return text


def _exhaustive(graph: StepGraph, hw: HardwareProfile, space: Space, limit: int = EXHAUSTIVE_LIMIT) -> SearchResult:
    started = time.perf_counter()
    ev = Evaluator(graph, hw, space)
    if space.tune_structure:
        windowed = (False, True) if space.windowed_einsum and ev.windowed_pairs() else (False,)
        structures = [
            dataclasses.replace(s, overlap_limit=o, windowed_einsum=w)
            for w in windowed
            for s in (xla_default_structure(hw), RECIPE_STRUCTURE,
                      Structure(thresholds_of({k: 0 for k in COMBINABLE_KINDS}), True))
            for o in OVERLAP_CANDIDATES
        ]
    else:
        structures = [RECIPE_STRUCTURE]
    structures = list(dict.fromkeys(_base_structure(space, s) for s in structures))
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
    "xla-default": functools.partial(_baseline, "xla-default"),
    "recipe": functools.partial(_baseline, "recipe"),
    "autoccl": functools.partial(_baseline, "autoccl"),
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
        with _cyclic_gc_paused():
            _CACHE[key] = _STRATEGY_FNS[name](graph, hw, space)
    return _CACHE[key]


@contextlib.contextmanager
def _cyclic_gc_paused():
    """A search allocates millions of small tuples, none in a reference cycle (reference
    counting frees them); left on, Python's cycle collector walks every live object of
    the process (JAX's included) each time they pile up, which measured 1.3-1.8x the
    search's own time on a 1000-collective step."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def clear_cache() -> None:
    """Forget cached results (after the cost model changed in-process)."""
    _CACHE.clear()
    evaluator_lib.clear_caches()


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

"""Event-driven replay of a StepGraph on one GPU: the Timeline of one training step.

The driver over the cost model (``cost``): compute tasks run in schedule order on one
compute stream; collectives run on up to ``overlap_limit`` communication streams. It is a
*fluid* model: every running task progresses at a rate, and the rates are recomputed at
each event (a task starting or ending), because a collective that starts or ends changes
the SMs and HBM bandwidth left to compute (``cost.ResourceTracker``).

Semantics (the shared contract):

* a compute task starts when the previous compute task ended, all its deps ended, and
  every collective ``c`` with ``c.done_before == task.id`` ended (the ``*-done`` wait);
* a collective is ready when its deps ended; ready collectives issue by ``priority``
  (higher first; unset = 0), ties in schedule order, while fewer than ``overlap_limit``
  collectives run;
* launch order (``HardwareProfile.contention_order``, rules a-d in ``_replay``): a collective
  whose CTAs need SMs takes them only where no compute kernel holds them (the compute stream
  idle, or a kernel boundary; one made ready at a boundary by the kernel that just ended
  waits for the next queued kernel too), and takes ``resident_sm_share`` SMs per CTA from
  every kernel that starts while it runs; copy-engine collectives start when ready;
* concurrent collectives share the network (processor sharing: with ``k`` running, each
  progresses at ``1/k`` of its own rate), so the communication never beats the sum of
  its parts and the overlap bound holds;
* a task with ``trip_count`` r stands for r executions unless the graph holds unrolled
  copies (some task has ``iteration > 0``); then each copy counts once;
* command buffers (``hw.command_buffer``, ``launch``): the step takes at least the host's
  time to issue it, and a collective captured in a graph holds back the compute after it
  (it runs between the graph's barriers, not beside the compute).

The simulator is called O(N*K) times by the search, so everything that depends only on
(graph, hardware) is computed once per pair and cached, and ``makespan_us`` replays
without building a Timeline (the search scores candidates by the makespan alone).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import json
import math
import weakref
from collections.abc import Mapping
from typing import Any, NamedTuple

from lagom_jax.cluster.hardware import HardwareProfile
from lagom_jax.cluster.params import CollectiveParams
from lagom_jax.costs import cost, launch
from lagom_jax.program.graph import StepGraph, Task, collective_shape

COMPUTE_STREAM = "compute"


@dataclasses.dataclass(frozen=True)
class Interval:
    """When one task ran, and on which stream (``compute`` or ``comm<k>``)."""

    task_id: int
    stream: str
    start: float
    end: float


@dataclasses.dataclass(frozen=True)
class CollectiveRecord:
    """One collective's run: its params, interval and the time compute waited idle."""

    task_id: int
    name: str
    params: CollectiveParams
    start: float
    end: float
    exposed_us: float


@dataclasses.dataclass(frozen=True)
class Timeline:
    """The result of one replay. Times in microseconds.

    ``exposed_comm_us`` is the time at least one collective ran while the compute stream
    was idle; a collective's ``exposed_us`` is its share of that idle time (the idle time
    inside its interval).
    """

    makespan_us: float
    bound_us: float
    compute_us: float
    comm_us: float
    exposed_comm_us: float
    intervals: tuple[Interval, ...]
    per_collective: tuple[CollectiveRecord, ...]
    overlap_limit: int = 1
    # The host's time to issue the step (``launch.host_issue_us``): the makespan's floor.
    host_us: float = 0.0

    @property
    def exposed(self) -> dict[int, float]:
        """Task id -> exposed time of that collective."""
        return {r.task_id: r.exposed_us for r in self.per_collective}

    def to_dict(self) -> dict[str, Any]:
        return {
            "makespan_us": self.makespan_us,
            "bound_us": self.bound_us,
            "compute_us": self.compute_us,
            "comm_us": self.comm_us,
            "exposed_comm_us": self.exposed_comm_us,
            "overlap_limit": self.overlap_limit,
            "host_us": self.host_us,
            "intervals": [dataclasses.asdict(i) for i in self.intervals],
            "per_collective": [
                dataclasses.asdict(r) | {"params": dataclasses.asdict(r.params)} for r in self.per_collective
            ],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)


@dataclasses.dataclass(frozen=True)
class _Prepared:
    """Everything about (graph, hardware) that does not depend on params or priorities.

    ``memo`` holds what is derived lazily and reused across calls: per (collective id,
    params) its time and resource use, and the overlap bound (only a full Timeline
    needs it, and it costs a tabulation of every candidate of every collective).
    """

    is_coll: tuple[bool, ...]
    repeat: tuple[int, ...]
    # Collectives: (kind, bytes, group size, nodes spanned); None for compute tasks.
    coll_key: tuple[tuple[str, float, int, int] | None, ...]
    compute_order: tuple[int, ...]
    pending: tuple[int, ...]  # deps + done_before waits
    ready_at_start: tuple[int, ...]  # collectives with nothing pending, in id order
    successors: tuple[tuple[int, ...], ...]
    # Compute tasks: (flops, bytes); collectives: None.
    work: tuple[tuple[float, float, tuple[int, ...], int] | None, ...]
    compute_alone: tuple[float, ...]
    default_params: Mapping[int, CollectiveParams]
    compute_us: float
    # Compute tasks: SMs one resident collective CTA takes from the task
    # (``HardwareProfile.resident_sm_share``) and its kernel boundaries as a fraction of its
    # work: ``repeat`` executions of ``cost.cta_waves`` waves each (0 waves: CTAs free SMs
    # continuously).
    sm_share: tuple[float, ...] = ()
    waves: tuple[int, ...] = ()
    # The host's time to issue the step under the cluster's command buffers (``launch``).
    host_us: float = 0.0
    memo: dict[Any, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # (compute task id, SMs taken, HBM GB/s taken) -> its duration under that contention.
    durations: dict[tuple[int, float, float], float] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # Collective id -> the memo entry (params, time, use, CTAs) of its params at the last call.
    last: dict[int, tuple[CollectiveParams, float, tuple[float, float], int]] = dataclasses.field(
        default_factory=dict, compare=False, repr=False)

    def bound_us(self, hw: HardwareProfile) -> float:
        """max(compute alone, every collective at its fastest candidate)."""
        if "bound" not in self.memo:
            fastest = sum(r * cost.fastest_time_us(*k, hw) for k, r in zip(self.coll_key, self.repeat)
                          if k is not None)
            self.memo["bound"] = max(self.compute_us, fastest)
        return self.memo["bound"]


# Keyed by graph identity (hashing a step's tasks would cost more than a replay); an
# entry leaves when its graph is collected.
_PREPARED: dict[tuple[int, HardwareProfile], tuple[weakref.ref[StepGraph], _Prepared]] = {}


def alone_us(task: Task, hw: HardwareProfile) -> float:
    """One execution of a compute task with nothing running beside it: by its matmul shape,
    operand width, fused-attention flag and library kernel where it has them."""
    return _kernel_us(_work(task), hw, 0.0, 0.0)


def clear_caches() -> None:
    """Forget the kernel- and collective-time tables (after the cost model changed in-process)."""
    _kernel_us.cache_clear()
    _COLLECTIVE_COSTS.clear()


def _work(task: Task) -> tuple:
    """What the cost model times a compute task by."""
    return (task.flops, task.bytes, task.gemm, task.itemsize, task.fused_attention, task.kernel)


@functools.lru_cache(maxsize=1 << 16)
def _kernel_us(work: tuple, hw: HardwareProfile, sms_taken: float, hbm_gbps_taken: float) -> float:
    """One execution of a compute kernel (``_work``) beside collectives holding ``sms_taken``
    SMs and ``hbm_gbps_taken`` of HBM bandwidth. One table for every graph: a scanned
    step's layers repeat the same kernels, and the search replays windows of them by the
    ten thousand, each a graph of its own."""
    flops, nbytes, gemm, itemsize, attention, kernel = work
    return cost.compute_time_us(flops, nbytes, hw, sms_taken=sms_taken, hbm_gbps_taken=hbm_gbps_taken, gemm=gemm,
                                itemsize=itemsize, attention=attention, kernel=kernel)


# (hardware, collective shape) -> params -> (time alone, (SMs, HBM GB/s) held): one table for
# every graph, as for ``_kernel_us``: the search replays thousands of windows, each a graph
# of its own, and asks in each for the same collectives under the same few params.
_COLLECTIVE_COSTS: dict[tuple, dict[CollectiveParams, tuple[float, tuple[float, float]]]] = {}


def _collective_cost(key: tuple[str, float, int, int], p: CollectiveParams, hw: HardwareProfile
                     ) -> tuple[float, tuple[float, float]]:
    """(``cost.collective_time_us``, ``cost.collective_resource_use``) of one collective: for
    a candidate of its size, its row of ``cost.candidate_resources`` (the same floats, which
    the search tabulates anyway), else from the model."""
    table = _COLLECTIVE_COSTS.get((hw, key))
    if table is None:
        if len(_COLLECTIVE_COSTS) >= 1 << 14:
            _COLLECTIVE_COSTS.clear()
        table = _COLLECTIVE_COSTS[(hw, key)] = {
            q: (one, (sms, hbm)) for q, one, sms, hbm in cost.candidate_resources(*key, hw)}
    hit = table.get(p)
    if hit is None:
        kind, nbytes, n, nodes = key
        one = cost.collective_time_us(kind, nbytes, n, nodes, p, hw)
        hit = table[p] = (one, cost.collective_resource_use(kind, nbytes, n, nodes, p, hw, time_us=one))
    return hit


def _next_compute(is_coll: tuple[bool, ...]) -> tuple[int | None, ...]:
    """For each task, the first compute task after it in schedule order (None: none)."""
    out: list[int | None] = [None] * len(is_coll)
    nxt = None
    for i in range(len(is_coll) - 1, -1, -1):
        out[i] = nxt
        if not is_coll[i]:
            nxt = i
    return tuple(out)


def _prepare(graph: StepGraph, hw: HardwareProfile) -> _Prepared:
    key = (id(graph), hw)
    hit = _PREPARED.get(key)
    if hit is not None and hit[0]() is graph:
        return hit[1]
    tasks = graph.tasks
    unrolled = any(t.iteration > 0 for t in tasks)
    gpus_per_node, sm_share = hw.gpus_per_node, (hw.resident_sm_share(False), hw.resident_sm_share(True))
    # One pass over the tasks (a search prepares thousands of small windows).
    is_coll: list[bool] = []
    repeat: list[int] = []
    coll_key: list[tuple[str, float, int, int] | None] = []
    work: list[tuple | None] = []
    compute_alone: list[float] = []
    shares: list[float] = []
    waves: list[int] = []
    default_params: dict[int, CollectiveParams] = {}
    for t in tasks:
        r = 1 if unrolled else max(t.trip_count, 1)
        repeat.append(r)
        if t.is_collective:
            is_coll.append(True)
            k = collective_shape(t, graph.num_devices, gpus_per_node)
            coll_key.append(k)
            default_params[t.id] = cost.nccl_default_params(k[0], k[1], k[2], k[3], hw)
            work.append(None)
            compute_alone.append(0.0)
            shares.append(0.0)
            waves.append(0)
        else:
            is_coll.append(False)
            coll_key.append(None)
            w = _work(t)
            work.append(w)
            compute_alone.append(r * _kernel_us(w, hw, 0.0, 0.0))
            shares.append(sm_share[bool(t.gemm)])
            waves.append(cost.cta_waves(t.gemm, hw))
    pending = [len(t.deps) for t in tasks]
    succ: list[list[int]] = [list(c) for c in graph.consumers]
    captured = launch.serialised(graph, hw.command_buffer)
    next_compute = _next_compute(tuple(is_coll)) if captured else ()
    for t in tasks:
        j = t.done_before
        if t.id in captured and next_compute[t.id] is not None and (j is None or next_compute[t.id] < j):
            j = next_compute[t.id]  # in a graph: the next kernel waits for it
        if j is not None and is_coll[t.id]:
            if not 0 <= j < len(tasks) or is_coll[j]:
                raise ValueError(
                    f"collective {t.name!r} (id {t.id}) has done_before={j}, which is not a compute task id")
            pending[j] += 1
            succ[t.id].append(j)
    prepared = _Prepared(
        is_coll=tuple(is_coll), repeat=tuple(repeat), coll_key=tuple(coll_key),
        compute_order=tuple(i for i, c in enumerate(is_coll) if not c),
        pending=tuple(pending), ready_at_start=tuple(i for i, c in enumerate(is_coll) if c and pending[i] == 0),
        successors=tuple(tuple(s) for s in succ),
        work=tuple(work),
        compute_alone=tuple(compute_alone), default_params=default_params,
        compute_us=sum(compute_alone),
        sm_share=tuple(shares),
        waves=tuple(waves),
        host_us=launch.host_issue_us(graph, hw.command_buffer),
    )

    def forget(ref: weakref.ref[StepGraph], key: tuple[int, HardwareProfile] = key) -> None:
        if _PREPARED.get(key, (None,))[0] is ref:
            del _PREPARED[key]

    _PREPARED[key] = (weakref.ref(graph, forget), prepared)
    return prepared


class _Run(NamedTuple):
    """The raw outcome of one replay, before it is dressed as a Timeline."""

    makespan_us: float
    start: list[float]
    end: list[float]
    stream_of: dict[int, int]
    exposed: dict[int, float]
    exposed_total: float
    chosen: Mapping[int, CollectiveParams]
    coll_time: dict[int, float]


def _replay(graph: StepGraph, hw: HardwareProfile, params: Mapping[int, CollectiveParams] | None,
            overlap_limit: int, priority: Mapping[int, float] | None, detail: bool) -> tuple[_Prepared, _Run]:
    """The event loop shared by ``simulate`` and ``makespan_us``; without ``detail`` it
    keeps no intervals, streams or exposed times (only the makespan is valid)."""
    if overlap_limit < 1:
        raise ValueError(f"overlap_limit must be >= 1, got {overlap_limit}")
    prep = _prepare(graph, hw)
    ntasks = len(prep.is_coll)
    chosen = prep.default_params
    if params:
        merged = {**chosen, **params}
        if len(merged) != len(chosen):
            bad = sorted(i for i in params if i not in chosen)
            raise ValueError(f"params given for ids {bad[:5]} that are not collectives of graph {graph.name!r}")
        chosen = merged
    prio = priority or {}

    # Per-collective constants under these params: time alone and resources held.
    # A search changes one collective's params per call: the others are the very same
    # objects as last time, which an identity check finds without hashing them.
    # With them, the CTAs it holds on SMs (none on the copy engines: launch-order rule d).
    memo, last = prep.memo, prep.last
    coll_time: dict[int, float] = {}
    coll_use: dict[int, tuple[float, float]] = {}
    ctas: dict[int, int] = {}
    for i, p in chosen.items():
        hit = last.get(i)
        if hit is None or hit[0] is not p:
            hit = memo.get((i, p))
            if hit is None:
                one, use = _collective_cost(prep.coll_key[i], p, hw)  # type: ignore[arg-type]
                hit = memo[(i, p)] = (p, prep.repeat[i] * one, use, p.nchannels if use[0] > 0.0 else 0)
            last[i] = hit
        _, coll_time[i], coll_use[i], ctas[i] = hit

    tracker = cost.ResourceTracker(hw)
    pending = list(prep.pending)
    successors, is_coll, repeat, work = prep.successors, prep.is_coll, prep.repeat, prep.work
    compute_alone, durations = prep.compute_alone, prep.durations
    sm_share, waves = prep.sm_share, prep.waves
    order = prep.compute_order
    n_compute = len(order)
    prio_of = prio.get
    heappush, heappop = heapq.heappush, heapq.heappop
    start = [0.0] * ntasks
    end = [0.0] * ntasks
    # Launch order (``hw.contention_order``). A collective whose CTAs need SMs ("gated")
    # takes them only where no compute kernel holds them: when the compute stream is idle, or
    # at a kernel boundary. Rules, each from the H100 order probe (benchmarks/results/gpu/
    # wave_2026-11-25/gpu_order_run1.json, docs/gpu_measurements.md):
    # (a) CTAs resident when a compute kernel starts take whole SMs from it for as long as
    #     they stay (``hw.resident_sm_share``: NCCL's __launch_bounds__(NCCL_MAX_NTHREADS, 1)
    #     kernels hold one SM per CTA; the CUDA programming guide: a resident block keeps its
    #     SM until it exits, nothing preempts it);
    # (b) a collective that becomes ready while a kernel runs waits for that kernel's end and
    #     then wins the SMs before the next queued kernel (probe "second": CTAs start 830-870
    #     us after launch, when the running 1430 us GEMM ends); one made ready at a compute
    #     boundary by the kernel that just ended (XLA's async start waits on the event of its
    #     operand's producer) loses the race to the compute kernel already queued, and waits
    #     for that one's end too (probe "dep": the next GEMM runs at 0.996-1.000x, the
    #     collective starts one GEMM later, at either priority). Simplification: a compute
    #     task that stands for ``repeat`` executions has a boundary every 1/repeat of its work;
    #     a kernel is assumed to fill every SM (a small kernel's free SMs are not modelled);
    # (c) with ``hw.priority_takes_sms_at_wave`` (and ``hw.comm_high_priority``, XLA's
    #     xla_gpu_enable_highest_priority_async_stream), a waiting collective takes its SMs
    #     at the running kernel's next wave (CUDA programming guide, stream priorities: the
    #     block scheduler gives freed SMs to pending blocks of the higher-priority stream);
    #     the kernel runs its remaining waves on what is left;
    # (d) a collective that holds no SM (copy engines, NCCL's zero-CTA policy:
    #     ``NcclEnv.copy_engine``) starts when ready, whatever runs, and takes HBM bandwidth.
    # Without ``contention_order`` every collective starts when ready and takes
    # ``sm_share_per_channel`` per channel from whatever runs (the order-blind model).
    gate = hw.contention_order
    wave_rule = gate and hw.priority_takes_sms_at_wave and hw.comm_high_priority
    ready: list[tuple[float, int]] = []  # gated collectives allowed to take SMs at the next chance
    free_ready: list[tuple[float, int]] = []  # collectives that may start at once
    deferred: list[tuple[float, int]] = []  # made ready at this compute boundary (rule b)
    first_compute = order[0] if n_compute else ntasks
    for i in prep.ready_at_start:
        item = (-prio_of(i, 0.0), i)
        if gate and ctas[i]:
            # Launched after the first compute kernel in schedule order: it waits for it.
            (ready if i < first_compute else deferred).append(item)
        else:
            free_ready.append(item)
    heapq.heapify(ready)
    heapq.heapify(free_ready)
    free_streams = list(range(overlap_limit))
    stream_of: dict[int, int] = {}
    running: dict[int, float] = {}  # collective id -> fraction left
    exposed: dict[int, float] = dict.fromkeys(chosen, 0.0) if detail else {}
    acquire, release = tracker.acquire, tracker.release
    held_ctas = 0
    exposed_total = 0.0
    cur, cur_left, cur_dur, nxt = -1, 0.0, 0.0, 0
    stale = True  # the compute rate must be recomputed (contention or task changed)
    now = 0.0
    done = 0

    # The loop body runs once per event, tens of thousands of times per search: it keeps
    # to locals and plain comparisons, with the float operations in a fixed order.
    while True:
        # Gated collectives may take SMs now: no kernel runs, or the running one is at a
        # boundary (a kernel of a repeated task; a wave under rule c) past its start.
        if ready and cur >= 0:
            k = repeat[cur] * (waves[cur] if wave_rule else 1)
            if wave_rule and waves[cur] == 0:
                open_now = True
            else:
                f = (1.0 - cur_left) * k
                open_now = f > 1e-6 and abs(f - round(f)) < 1e-6
        else:
            open_now = cur < 0
        while len(running) < overlap_limit:
            if free_ready and not (ready and open_now and ready[0] < free_ready[0]):
                i = heappop(free_ready)[1]
            elif ready and open_now:
                i = heappop(ready)[1]
            else:
                break
            running[i] = 1.0
            if detail:
                start[i] = now
                stream_of[i] = heappop(free_streams)
            acquire(coll_use[i])
            if gate:
                held_ctas += ctas[i]
            stale = True
        if cur < 0 and nxt < n_compute and pending[order[nxt]] == 0:
            cur, cur_left = order[nxt], 1.0
            nxt += 1
            start[cur] = now
            stale = True
        if deferred:
            # The queued kernel has won this boundary (or the stream has a gap: they start now).
            for item in deferred:
                heappush(ready, item)
            deferred = []
            if cur < 0:
                continue
        if cur < 0 and not running:
            break
        if cur >= 0 and stale:
            sms = held_ctas * sm_share[cur] if gate else tracker.sms
            if sms == 0.0 and tracker.hbm == 0.0:
                cur_dur = compute_alone[cur]  # the same roofline, nothing taken
            else:
                # The same few collectives overlap the same task in call after call.
                key = (cur, sms, tracker.hbm)
                cur_dur = durations.get(key, -1.0)
                if cur_dur < 0.0:
                    cur_dur = durations[key] = repeat[cur] * _kernel_us(work[cur], hw, sms, tracker.hbm)
            stale = False
        # Time to the next event; k running collectives share the network.
        k = len(running)
        dt = cur_left * cur_dur if cur >= 0 else math.inf
        if ready and cur >= 0 and k < overlap_limit:
            # The running kernel's next boundary, where a waiting collective takes its SMs.
            kb = repeat[cur] * (waves[cur] if wave_rule and waves[cur] else 1)
            target = 1.0 - (math.floor((1.0 - cur_left) * kb + 1e-6) + 1) / kb
            if target > 1e-9:
                x = (cur_left - target) * cur_dur
                if x < dt:
                    dt = x
        for i, left in running.items():
            x = left * coll_time[i] * k
            if x < dt:
                dt = x
        now += dt
        if cur < 0:
            if detail:
                exposed_total += dt
                for i in running:
                    exposed[i] += dt
        else:
            cur_left = cur_left - dt / cur_dur if cur_dur > 0 else 0.0
        ended = []
        for i, left in running.items():
            total = coll_time[i] * k
            left = left - dt / total if total > 0 else 0.0
            running[i] = left
            if left <= 1e-12:
                ended.append(i)
        if ended:
            stale = True
            for i in ended:
                del running[i]
                release(coll_use[i])
                if gate:
                    held_ctas -= ctas[i]
                if detail:
                    heappush(free_streams, stream_of[i])
        if cur >= 0 and cur_left <= 1e-12:
            ended.append(cur)
            cur = -1
        for i in ended:
            end[i] = now
            done += 1
            boundary = gate and not is_coll[i]
            for j in successors[i]:
                pending[j] -= 1
                if pending[j] == 0 and is_coll[j]:
                    item = (-prio_of(j, 0.0), j)
                    if not gate or not ctas[j]:
                        heappush(free_ready, item)
                    elif boundary:
                        deferred.append(item)
                    else:
                        heappush(ready, item)
    if done != ntasks:
        stuck = [graph.tasks[i].name for i in range(ntasks) if pending[i] > 0][:5]
        raise ValueError(
            f"graph {graph.name!r} cannot complete: tasks {stuck} wait on work that never runs "
            f"(check deps and done_before)")
    return prep, _Run(max(now, prep.host_us), start, end, stream_of, exposed, exposed_total, chosen, coll_time)


def makespan_us(graph: StepGraph, hw: HardwareProfile,
                params: Mapping[int, CollectiveParams] | None = None, *,
                overlap_limit: int = 1, priority: Mapping[int, float] | None = None) -> float:
    """``simulate(...).makespan_us`` without building the Timeline: what a search that
    scores thousands of candidates needs."""
    return _replay(graph, hw, params, overlap_limit, priority, detail=False)[1].makespan_us


def simulate(graph: StepGraph, hw: HardwareProfile,
             params: Mapping[int, CollectiveParams] | None = None, *,
             overlap_limit: int = 1, priority: Mapping[int, float] | None = None) -> Timeline:
    """Replay ``graph`` on ``hw`` with per-collective ``params`` (missing ids get NCCL's
    defaults) and return its Timeline."""
    prep, run = _replay(graph, hw, params, overlap_limit, priority, detail=True)
    tasks = graph.tasks
    start, end, chosen = run.start, run.end, run.chosen
    intervals = tuple(
        Interval(i, f"comm{run.stream_of[i]}" if prep.is_coll[i] else COMPUTE_STREAM, start[i], end[i])
        for i in range(len(tasks)))
    records = tuple(
        CollectiveRecord(i, tasks[i].name, chosen[i], start[i], end[i], run.exposed[i]) for i in sorted(chosen))
    return Timeline(
        makespan_us=run.makespan_us, bound_us=prep.bound_us(hw), compute_us=prep.compute_us,
        comm_us=sum(run.coll_time.values()), exposed_comm_us=run.exposed_total,
        intervals=intervals, per_collective=records, overlap_limit=overlap_limit, host_us=prep.host_us,
    )

"""Host launches: what XLA's command buffers (CUDA graphs) change in a step.

XLA runs a compiled step as a sequence of thunks the host issues one by one. With command
buffers (``--xla_gpu_enable_command_buffer``; XLA's default set,
``hardware.DEFAULT_COMMAND_BUFFER``, is on in every prediction unless a run turns it off)
runs of at least ``xla_gpu_graph_min_graph_size`` (5) consecutive thunks of the captured
types become one CUDA graph, launched once (``CommandBufferConversionPass``, openxla/xla
``xla/backends/gpu/runtime/command_buffer_conversion_pass.cc``; any other thunk ends a run: a
collective, a loop, a host copy). Two things follow:

* **launch gaps.** The host needs ``THUNK_US`` to issue one thunk and ``GRAPH_US`` plus
  ``GRAPH_NODE_US`` per kernel to launch a graph. It runs ahead of the GPU, so launches cost
  the step nothing while the kernels take longer than they do; a step of short kernels is
  bound by the host instead. The simulator takes a step as at least the host's time to issue
  it (``host_issue_us``): command buffers lower that floor, turning them off (``""``) raises it.
* **what capture costs the schedule.** A collective captured in a graph (the COLLECTIVES
  type, not in XLA's default set) runs in the graph's own execution scope, between barriers
  (openxla/xla PR #11348), not on XLA's async collective stream: the compute after it waits
  for it, so it loses its overlap (openxla/xla issue #35360: collectives captured, 0.71x on
  8 H100). ``serialised`` says which collectives the simulator runs that way.

The launch costs are third-party measurements, the only ones found with a per-node split:
6.4 us per kernel launched alone against 15 us plus 0.58 us per node for a CUDA graph
(ahrefs/ocannl issue #488, an RTX 5070 Ti with CUDA 12). No per-thunk cost of XLA's own
runtime was published. What the model does not price: the memory command buffers keep
(+3 GiB on MARIN's 64-GB200 MoE step, marin-community/marin issue #8054), the graph updates
when buffer addresses change, and any constraint capture puts on the schedule beyond
collectives.
"""

from __future__ import annotations

from collections.abc import Iterable

from lagom_jax.cluster.hardware import COMMAND_TYPES, DEFAULT_COMMAND_BUFFER
from lagom_jax.program.graph import StepGraph, Task

__all__ = ["FLAG", "host_issue_us", "parse", "serialised"]

FLAG = "xla_gpu_enable_command_buffer"
MIN_GRAPH_SIZE = 5  # xla_gpu_graph_min_graph_size
THUNK_US = 6.4
GRAPH_US = 15.0
GRAPH_NODE_US = 0.58


def parse(value: str | Iterable[str]) -> tuple[str, ...]:
    """XLA's flag syntax, as the sorted types it captures: a list of types
    (``"FUSION,CUBLAS"``; ``""`` for none) or changes to the default set
    (``"+COLLECTIVES,-CUDNN"``). ValueError names an unknown type."""
    items = [v.strip() for v in (value.split(",") if isinstance(value, str) else value) if v.strip()]
    names = [i.lstrip("+-").upper().removeprefix("COMMAND_BUFFER_CMD_TYPE_") for i in items]
    bad = sorted(set(names) - set(COMMAND_TYPES))
    if bad:
        raise ValueError(f"{FLAG}={value!r}: unknown type(s) {bad} (XLA's: {', '.join(COMMAND_TYPES)})")
    signed = [i[0] in "+-" for i in items]
    if items and all(signed):
        types = set(DEFAULT_COMMAND_BUFFER)
        for item, name in zip(items, names):
            (types.add if item[0] == "+" else types.discard)(name)
        return tuple(sorted(types))
    if any(signed):
        raise ValueError(f"{FLAG}={value!r}: give a list of types or only +/- changes to XLA's default set")
    return tuple(sorted(set(names)))


def _command_type(task: Task) -> str:
    if task.is_collective:
        return "COLLECTIVES"
    if task.kernel == "host-transfer":
        return "HOST"
    if task.custom_call:
        target = task.custom_call
        if target.startswith("__cublas$lt"):
            return "CUBLASLT"
        if target.startswith("__cublas"):
            return "CUBLAS"
        if target.startswith("__cudnn"):
            return "CUDNN"
        return "CUSTOM_CALL"
    if task.opcode in ("fusion", "copy", "dynamic-slice", "dynamic-update-slice"):
        return "FUSION"
    return "OTHER"


def host_issue_us(graph: StepGraph, types: tuple[str, ...]) -> float:
    """The host's time to issue one step of ``graph`` with ``types`` captured: each run of at
    least ``MIN_GRAPH_SIZE`` consecutive captured thunks of one computation a graph launch,
    every other thunk a launch of its own, each loop body as many times as it runs."""
    captured = frozenset(types)
    unrolled = any(t.iteration > 0 for t in graph.tasks)
    total = 0.0
    run: list[Task] = []

    def repeat(t: Task) -> int:
        return 1 if unrolled else max(t.trip_count, 1)

    def flush() -> float:
        if not run:
            return 0.0
        n = len(run)
        cost = GRAPH_US + GRAPH_NODE_US * n if n >= MIN_GRAPH_SIZE else THUNK_US * n
        out = repeat(run[0]) * cost
        run.clear()
        return out

    for t in graph.tasks:
        if _command_type(t) in captured:
            if run and run[-1].computation != t.computation:
                total += flush()
            run.append(t)
            continue
        total += flush() + repeat(t) * THUNK_US
    return total + flush()


def serialised(graph: StepGraph, types: tuple[str, ...]) -> frozenset[int]:
    """Ids of the collectives captured in a graph, which run without overlap."""
    return frozenset(t.id for t in graph.collectives) if "COLLECTIVES" in types else frozenset()

"""Pictures of a Timeline: a Perfetto / Chrome trace and a PNG Gantt chart.

``to_perfetto`` writes the Chrome Trace Event format (JSON object with ``traceEvents``),
which ui.perfetto.dev and chrome://tracing open directly: one process for the step, one
thread (track) per stream, one complete ("X") event per task, timestamps in
microseconds. ``to_png`` draws the same tracks with matplotlib, an optional extra
imported only when called.
"""

from __future__ import annotations

import json
import os
from typing import Any

from lagom_jax.costs.simulate import COMPUTE_STREAM, Timeline
from lagom_jax.program.graph import StepGraph

__all__ = ["to_perfetto", "write_perfetto", "to_png"]


def _streams(timeline: Timeline) -> list[str]:
    """Track order: compute first, then comm0, comm1, ..."""
    comm = sorted({i.stream for i in timeline.intervals if i.stream != COMPUTE_STREAM},
                  key=lambda s: (len(s), s))
    return [COMPUTE_STREAM, *comm]


def to_perfetto(timeline: Timeline, graph: StepGraph) -> dict[str, Any]:
    """The Timeline as a Chrome/Perfetto trace object (``json.dump`` it to a file)."""
    tids = {s: k + 1 for k, s in enumerate(_streams(timeline))}
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": f"step {graph.name}"}},
    ]
    for s, tid in tids.items():
        events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid, "args": {"name": s}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": 1, "tid": tid, "args": {"sort_index": tid}})
    records = {r.task_id: r for r in timeline.per_collective}
    for iv in timeline.intervals:
        task = graph.tasks[iv.task_id]
        args: dict[str, Any] = {"id": task.id, "bytes": task.bytes}
        if task.is_collective:
            rec = records[task.id]
            args |= {"params": rec.params.describe(), "exposed_us": rec.exposed_us,
                     "group_size": task.ranks(graph.num_devices)}
        else:
            args["flops"] = task.flops
        events.append({
            "ph": "X", "name": task.name, "cat": task.kind, "pid": 1, "tid": tids[iv.stream],
            "ts": iv.start, "dur": iv.end - iv.start, "args": args,
        })
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "makespan_us": timeline.makespan_us, "bound_us": timeline.bound_us,
            "compute_us": timeline.compute_us, "comm_us": timeline.comm_us,
            "exposed_comm_us": timeline.exposed_comm_us,
        },
    }


def write_perfetto(timeline: Timeline, graph: StepGraph, path: str | os.PathLike[str]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(to_perfetto(timeline, graph), f)


def to_png(timeline: Timeline, graph: StepGraph, path: str | os.PathLike[str], *,
           title: str = "predicted by the cost model") -> None:
    """A Gantt chart of the Timeline: one row per stream, tasks coloured by kind.

    ``title`` says what the timeline is (predicted, of which plan); the chart adds the
    step's makespan, bound and exposed communication."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError(
            "to_png needs matplotlib, an optional extra: pip install 'lagom-jax[plot]'") from e
    streams = _streams(timeline)
    row = {s: len(streams) - 1 - k for k, s in enumerate(streams)}
    colours = {"compute": "#4C72B0", "all-reduce": "#DD8452", "all-gather": "#55A868",
               "reduce-scatter": "#C44E52", "all-to-all": "#8172B3", "collective-permute": "#937860"}
    scale = 1e-3  # plot in ms
    fig, ax = plt.subplots(figsize=(12, 1.0 + 0.6 * len(streams)))
    bars: dict[tuple[str, str], list[tuple[float, float]]] = {}  # one collection per row and kind
    for iv in timeline.intervals:
        key = (iv.stream, graph.tasks[iv.task_id].kind)
        bars.setdefault(key, []).append((iv.start * scale, (iv.end - iv.start) * scale))
    for (stream, kind), spans in bars.items():
        ax.broken_barh(spans, (row[stream] - 0.4, 0.8), facecolors=colours[kind], edgecolor="none")
    ax.set_yticks([row[s] for s in streams], streams)
    ax.set_xlabel("time (ms)")
    ax.set_xlim(0, max(timeline.makespan_us, 1e-9) * scale)
    ax.set_title(f"{graph.name}, {title}\nmakespan {timeline.makespan_us * scale:.3f} ms, "
                 f"bound {timeline.bound_us * scale:.3f} ms, exposed comm {timeline.exposed_comm_us * scale:.3f} ms",
                 fontsize="medium")
    used = {graph.tasks[i.task_id].kind for i in timeline.intervals}
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for k, c in colours.items() if k in used]
    ax.legend(handles, [k for k in colours if k in used], loc="upper left", bbox_to_anchor=(1.0, 1.0),
              fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)

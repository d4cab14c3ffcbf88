"""The tables people read: ``analyze``, ``simulate`` and the strategy comparison of ``tune``.

``analyze`` sums up a module as plain JSON data (its collective inventory and compute
totals); the other functions turn values (that dict, a Timeline, search results) into text
or one JSON object. ``simulate_report`` and ``tune_report`` run the simulator or the
strategies when not handed their results. A Plan renders its own table (``Plan.report``).

Every printer of the CLI fits its lines to a terminal the one way :func:`wrap` does: prose
wrapped to ``WIDTH`` columns with a hanging indent, a :class:`Paste` line (an ``XLA_FLAGS``
line, an environment line, a command) whole on its own line.
"""

from __future__ import annotations

import dataclasses
import json
import re
import textwrap
from collections.abc import Iterable, Mapping

from lagom_jax.cluster.hardware import HardwareProfile
from lagom_jax.costs.simulate import Timeline, simulate
from lagom_jax.program import hlo
from lagom_jax.program.graph import StepGraph, from_module
from lagom_jax.search import SearchResult, STRATEGIES, compare
from lagom_jax.units import human_bytes, human_us


# The columns of a terminal every printed line fits, a Paste line aside (issue 79).
WIDTH = 100


class Paste(str):
    """A line meant to be pasted (an ``XLA_FLAGS`` line, an environment line, a command):
    :func:`wrap` keeps it whole on its own line, however wide."""


def wrap(lines: str | Iterable[str], *, width: int | None = WIDTH, indent: str = "  ") -> str:
    """``lines`` for a terminal, joined by newlines: every line of prose wider than
    ``width`` broken at spaces, its continuation lines indented ``indent`` beyond its own
    indent (and a ``# `` comment's continued as a comment); a :class:`Paste` line as it is.
    Nothing is cut: a word wider than the line stands alone on one, and a hyphenated word
    stays whole. ``width`` None: as they are."""
    items = [lines] if isinstance(lines, str) else list(lines)
    out: list[str] = []
    for item in items:
        if isinstance(item, Paste) or width is None:
            out.append(item)
            continue
        for line in item.split("\n"):
            if len(line) <= width:
                out.append(line)
                continue
            lead = re.match(r" *(# )?", line).group(0)
            out += textwrap.wrap(line[len(lead):], width, initial_indent=lead, subsequent_indent=lead + indent,
                                 break_long_words=False, break_on_hyphens=False)
    return "\n".join(out)


def analyze(module: hlo.Module) -> dict:
    """The collective inventory and compute totals of one step, as plain JSON data.

    Loops are not unrolled: each collective is listed once with the product of its
    enclosing trip counts, and the compute totals count every body ``trip_count`` times.
    """
    graph = from_module(module, unroll_loops=False)
    compute = graph.compute_tasks
    return {
        "module": module.name,
        "collectives": [
            {
                "name": t.name,
                "kind": t.kind,
                "bytes": int(t.bytes),
                "group_size": t.ranks(graph.num_devices),
                "trip_count": t.trip_count,
                "async": t.is_async,
            }
            for t in graph.collectives
        ],
        "compute": {
            "flops": float(sum(t.flops * t.trip_count for t in compute)),
            "bytes": float(sum(t.bytes * t.trip_count for t in compute)),
        },
    }


def format_analysis(result: dict, *, nodes_of: Mapping[str, int] | None = None) -> str:
    """A readable table of :func:`analyze`'s result.

    ``nodes_of`` (collective name -> nodes its group spans) adds a "nodes" column.
    """
    rows = [("collective", "kind", "bytes", "group", "trips", "async")]
    if nodes_of is not None:
        rows[0] += ("nodes",)
    for c in result["collectives"]:
        row = (
            c["name"], c["kind"], human_bytes(c["bytes"]), str(c["group_size"]),
            str(c["trip_count"]), "yes" if c["async"] else "no",
        )
        if nodes_of is not None:
            row += (str(nodes_of.get(c["name"], 1)),)
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [f"module {result['module']}: {len(result['collectives'])} collectives"]
    for k, r in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    per_kind: dict[str, list[float]] = {}
    for c in result["collectives"]:
        acc = per_kind.setdefault(c["kind"], [0, 0.0])
        acc[0] += c["trip_count"]
        acc[1] += c["bytes"] * c["trip_count"]
    lines.append("")
    for kind, (count, nbytes) in sorted(per_kind.items()):
        lines.append(f"{kind}: {count} per step, {human_bytes(nbytes)} per step")
    comp = result["compute"]
    lines.append(
        f"compute: {comp['flops'] / 1e12:.3f} TFLOP, {human_bytes(comp['bytes'])} moved per step"
    )
    return wrap(lines)


def format_timeline(timeline: Timeline, graph: StepGraph, top: int = 10) -> str:
    """A readable summary: makespan against the bound, exposed communication, and the
    collectives that expose the most time (with the params they ran with)."""
    tl = timeline
    ratio = tl.makespan_us / tl.bound_us if tl.bound_us > 0 else 1.0
    share = tl.exposed_comm_us / tl.comm_us if tl.comm_us > 0 else 0.0
    lines = [
        f"step {graph.name!r}: {len(graph.tasks)} tasks, {len(tl.per_collective)} collectives, "
        f"overlap limit {tl.overlap_limit}",
        f"  makespan      {human_us(tl.makespan_us):>12}   ({ratio:.3f}x the overlap bound)",
        f"  overlap bound {human_us(tl.bound_us):>12}   max(compute alone, comm at its fastest)",
        f"  compute alone {human_us(tl.compute_us):>12}",
        f"  comm alone    {human_us(tl.comm_us):>12}",
        f"  exposed comm  {human_us(tl.exposed_comm_us):>12}   ({share:.1%} of comm)",
    ]
    worst = sorted(tl.per_collective, key=lambda r: (-r.exposed_us, r.task_id))[:top]
    if worst:
        # Two lines a collective, so that a row fits WIDTH: its numbers, then the params it ran with.
        lines.append(f"  top {len(worst)} collectives by exposed time (under each, the params it ran with):")
        lines.append(f"    {'id':>5} {'name':<28} {'kind':<18} {'bytes':>10} {'time':>11} {'exposed':>11}")
        for r in worst:
            t = graph.tasks[r.task_id]
            lines.append(
                f"    {r.task_id:>5} {t.name:<28} {t.kind:<18} {human_bytes(t.bytes):>10} "
                f"{human_us(r.end - r.start):>11} {human_us(r.exposed_us):>11}")
            lines.append(f"{'':10}{r.params.describe()}")
    return wrap(lines)


def simulate_report(graph: StepGraph, hw: HardwareProfile, *, as_json: bool,
                    overlap_limit: int = 1, timeline: Timeline | None = None) -> str:
    """What ``lagom-jax simulate`` prints: the summary text, or one JSON object.

    ``timeline`` is the replay to report (default: one with NCCL's own choices)."""
    tl = timeline if timeline is not None else simulate(graph, hw, overlap_limit=overlap_limit)
    if as_json:
        return json.dumps({
            "graph": graph.name,
            "hardware": hw.name,
            "nodes": hw.nodes,
            "num_tasks": len(graph.tasks),
            "num_collectives": len(tl.per_collective),
            "makespan_us": tl.makespan_us,
            "bound_us": tl.bound_us,
            "compute_us": tl.compute_us,
            "comm_us": tl.comm_us,
            "exposed_comm_us": tl.exposed_comm_us,
            "per_collective": [
                {"task_id": r.task_id, "name": r.name, "params": r.params.describe(),
                 "start_us": r.start, "end_us": r.end, "exposed_us": r.exposed_us}
                for r in tl.per_collective
            ],
        })
    return f"hardware {hw.name} x{hw.nodes} node(s)\n" + format_timeline(tl, graph)


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

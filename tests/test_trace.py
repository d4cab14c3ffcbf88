"""Perfetto trace, PNG Gantt chart and text summary of a Timeline."""

from __future__ import annotations

import json
import sys

import pytest

from lagom_jax.cluster import hardware
from lagom_jax.costs import simulate
from lagom_jax.plan import report, trace
from lagom_jax.program.graph import StepGraph, Task

A100 = hardware.get("a100-sxm-8")


def graph():
    g8 = (tuple(range(8)),)
    return StepGraph("trace", (
        Task(0, "fwd", "compute", flops=2e12, bytes=1e8),
        Task(1, "grad-ar", "all-reduce", bytes=256 << 20, deps=(0,), groups=g8, done_before=3, is_async=True),
        Task(2, "bwd", "compute", flops=1e12, bytes=1e8, deps=(0,)),
        Task(3, "opt", "compute", flops=1e9, bytes=5e8, deps=(1, 2)),
        Task(4, "ag", "all-gather", bytes=64 << 20, deps=(0,), groups=g8, is_async=True),
    ), 8)


def test_perfetto_one_track_per_stream_and_valid_json(tmp_path):
    g = graph()
    tl = simulate.simulate(g, A100, overlap_limit=2)
    trace_obj = trace.to_perfetto(tl, g)
    events = trace_obj["traceEvents"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"compute", "comm0", "comm1"}
    spans = [e for e in events if e["ph"] == "X"]
    assert sorted(e["args"]["id"] for e in spans) == [0, 1, 2, 3, 4]
    tid = {e["args"]["name"]: e["tid"] for e in events if e["name"] == "thread_name"}
    assert all(e["tid"] == tid["compute"] for e in spans if e["cat"] == "compute")
    ar = next(e for e in spans if e["name"] == "grad-ar")
    assert ar["dur"] == pytest.approx(tl.per_collective[0].end - tl.per_collective[0].start)
    assert "nc=" in ar["args"]["params"]
    path = tmp_path / "t.json"
    trace.write_perfetto(tl, g, path)
    assert json.loads(path.read_text())["otherData"]["makespan_us"] == tl.makespan_us


def test_png_gantt(tmp_path):
    pytest.importorskip("matplotlib")
    g = graph()
    path = tmp_path / "t.png"
    trace.to_png(simulate.simulate(g, A100), g, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_png_without_matplotlib_says_how_to_install(tmp_path, monkeypatch):
    # A None entry in sys.modules makes `import matplotlib` raise ImportError.
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    g = graph()
    with pytest.raises(ImportError, match=r"lagom-jax\[plot\]"):
        trace.to_png(simulate.simulate(g, A100), g, tmp_path / "t.png")


def test_format_timeline_lists_worst_collective_first():
    g = graph()
    tl = simulate.simulate(g, A100)
    text = report.format_timeline(tl, g)
    worst = max(tl.per_collective, key=lambda r: r.exposed_us)
    lines = text.splitlines()
    assert lines[0].startswith("step 'trace': 5 tasks, 2 collectives")
    header = next(k for k, line in enumerate(lines) if line.split()[:2] == ["id", "name"])
    assert lines[header + 1].split()[1] == worst.name
    assert "overlap bound" in text and "exposed comm" in text

"""What changed between two runs of the benchmark suite: rows side by side, and a summary.

``python -m benchmarks.predicted.suite_compare OLD.json NEW.json [--name suite_gpu_vs_cpu]
[--old-label "XLA:CPU modules"] [--new-label "XLA:GPU modules"] [--differs "..."]``

Made for the move from XLA:CPU modules to XLA:GPU deviceless modules
(``benchmarks/results/suite_xla_cpu.json`` is the last suite run on CPU-compiled HLO), and
used for any change between two runs (the labels say what each run is): per (cell,
preset, nodes) present in both runs, the collectives of the compiled step, the
predicted xla-default step time and lagom's predicted speedup over xla-default, old and new;
above the table, how the speedups are spread in each run. Every number is *predicted*.
Prints the Markdown and records it as a RESULTS.md section.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.common import write_section


def _key(row: Mapping[str, Any]) -> tuple[str, str, int]:
    return (row["cell"], row["hardware"], row["nodes"])


def _speedup(row: Mapping[str, Any]) -> float:
    return row["strategies"]["lagom"]["speedup_vs_xla-default"]


def _spread(values: Sequence[float]) -> str:
    if not values:
        return "-"
    return (f"median {statistics.median(values):.3f}x, min {min(values):.3f}x, "
            f"max {max(values):.3f}x")


def compare(old: Mapping[str, Any], new: Mapping[str, Any], name: str, *,
            old_label: str = "XLA:CPU modules", new_label: str = "XLA:GPU modules",
            differs: str = "only the compiled module differs") -> str:
    """The Markdown section comparing two suite reports (rows matched by cell and preset)."""
    old_rows = {_key(r): r for r in old["rows"] if "strategies" in r}
    new_rows = {_key(r): r for r in new["rows"] if "strategies" in r}
    both = [k for k in new_rows if k in old_rows]
    if not both:
        raise ValueError("the two reports have no (cell, hardware, nodes) row in common")
    failed = [_key(r) for r in new["rows"] if "strategies" not in r]
    old_s = [_speedup(old_rows[k]) for k in both]
    new_s = [_speedup(new_rows[k]) for k in both]
    compiled_by = sorted({new_rows[k].get("compiled_by", "XLA:CPU").split(" for ")[0] for k in both})
    lines = [
        f"## {name} (predicted: suite on {new_label} vs on {old_label})", "",
        f"Old: `{old['command']}` on {old['machine']['date']} ({old['selection']}); new: "
        f"`{new['command']}` on {new['machine']['date']} ({new['selection']}), compiled by "
        f"{', '.join(compiled_by)}. Same cells and presets; {differs}. {len(both)} rows in both runs"
        + (f"; {len(failed)} rows of the new run did not compile: "
           + ", ".join(f"{c} {h} x{n}" for c, h, n in failed) if failed else "") + ".", "",
        f"- lagom over xla-default, {old_label}: {_spread(old_s)}",
        f"- lagom over xla-default, {new_label}: {_spread(new_s)}",
        f"- rows where the predicted gain grew: {sum(n > o + 1e-4 for o, n in zip(old_s, new_s))}, "
        f"shrank: {sum(n < o - 1e-4 for o, n in zip(old_s, new_s))}, of {len(both)}",
        "",
        "| cell | hardware | collectives old -> new | xla-default ms old -> new | lagom speedup old -> new |",
        "|---|---|---:|---:|---:|",
    ]
    for k in both:
        o, n = old_rows[k], new_rows[k]
        lines.append(
            f"| {n['label']} | {k[1]} x{k[2]} | {o['graph']['collectives']} -> "
            f"{n['graph']['collectives']} | "
            f"{o['strategies']['xla-default']['makespan_us'] / 1e3:.2f} -> "
            f"{n['strategies']['xla-default']['makespan_us'] / 1e3:.2f} | "
            f"{_speedup(o):.3f}x -> {_speedup(n):.3f}x |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old", type=pathlib.Path)
    ap.add_argument("new", type=pathlib.Path)
    ap.add_argument("--name", default="suite_gpu_vs_cpu", help="RESULTS.md section name")
    ap.add_argument("--old-label", default="XLA:CPU modules", help="what the old run is")
    ap.add_argument("--new-label", default="XLA:GPU modules", help="what the new run is")
    ap.add_argument("--differs", default="only the compiled module differs",
                    help="what differs between the runs, for the section's text")
    ap.add_argument("--no-record", action="store_true", help="print only")
    args = ap.parse_args(argv)
    md = compare(json.loads(args.old.read_text()), json.loads(args.new.read_text()), args.name,
                 old_label=args.old_label, new_label=args.new_label, differs=args.differs)
    print(md)
    if not args.no_record:
        write_section(args.name, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())

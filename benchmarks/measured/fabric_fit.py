"""`lagom-jax calibrate --nccl-tests` checked on published sweeps: fit on few nodes, predict many.

For each published multi-node sweep of `benchmarks/data/nccl_tests_scale.csv` that reaches 16
nodes or more (AWS p5 over EFA, 2-32 nodes, all-reduce and all-gather; Azure ND H100 v5 over
InfiniBand, all-reduce of 8 GiB over 2-64 nodes), the preset's collective terms are fitted
(`lagom_jax.costs.nccl_tests.fit`) on the points at 2-8 nodes only, and both the preset and
the fitted profile predict the points at 16 nodes and more, which the fit never saw. Recorded:
median |predicted / measured - 1| per source and collective, on the fitted and on the held-out
points, before (the preset) and after (the fit), and what the fit changed.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import time

from lagom_jax.cluster import hardware
from lagom_jax.costs import cost, nccl_tests

from ..common import DATA_DIR, machine_line, write_section

SWEEPS = (("p5-efa", "p5"), ("azure-ndv5-ib", "h100-sxm-8"))
FIT_MAX_NODES = 8


def samples(source: str) -> list[nccl_tests.Sample]:
    """The source's points as nccl-tests samples (bus bandwidth converted to time)."""
    out = []
    with open(DATA_DIR / "nccl_tests_scale.csv", newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            if r["source"] != source:
                continue
            n, size, kind = int(r["ranks"]), int(r["size_bytes"]), r["kind"]
            us = size * cost.bus_factor(kind, "ring", n) / (float(r["busbw_gbps"]) * 1e3)
            out.append(nccl_tests.Sample(kind, size, n, int(r["nodes"]), us, source))
    return out


def _median_abs(errs: list[float]) -> str:
    return f"{statistics.median(abs(e) for e in errs):.1%}" if errs else "-"


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    lines = ["## fabric_fit (predicted: `calibrate --nccl-tests` fitted on 2-8 nodes, judged on 16-64)", "",
             f"Machine: {machine_line()}. Each sweep's preset is fitted to its points at 2-{FIT_MAX_NODES} "
             "nodes (`lagom_jax.costs.nccl_tests.fit`); the points at 16 nodes and more are predicted by the "
             "preset (before) and by the fitted profile (after). Error: median |predicted / measured - 1|.", "",
             "| sweep | preset | collective | fitted points | fitted: before | fitted: after "
             "| held-out points (nodes) | held-out: before | held-out: after |",
             "|---|---|---|---:|---:|---:|---|---:|---:|"]
    notes = []
    for source, preset in SWEEPS:
        hw = hardware.get(preset)
        every = samples(source)
        seen = [s for s in every if s.nodes <= FIT_MAX_NODES]
        held = [s for s in every if s.nodes > FIT_MAX_NODES]
        start = time.perf_counter()
        fitted = nccl_tests.fit(seen, hw)
        seconds = time.perf_counter() - start
        for kind in sorted({s.kind for s in every}):
            a = [s for s in seen if s.kind == kind]
            b = [s for s in held if s.kind == kind]
            nodes = ", ".join(str(n) for n in sorted({s.nodes for s in b}))
            lines.append(f"| {source} | {preset} | {kind} | {len(a)} | {_median_abs(nccl_tests.errors(a, hw))} "
                         f"| {_median_abs(nccl_tests.errors(a, fitted.profile))} | {len(b)} ({nodes}) "
                         f"| {_median_abs(nccl_tests.errors(b, hw))} "
                         f"| {_median_abs(nccl_tests.errors(b, fitted.profile))} |")
        changed = ", ".join(f"{f} {old:.3g} -> {new:.3g}" for f, old, new in fitted.changed) or "nothing"
        notes.append(f"- {source}: the fit changed {changed} ({seconds:.1f} s)"
                     + (f"; kept: {'; '.join(fitted.kept)}" if fitted.kept else "") + ".")
    lines += ["", *notes, "",
              "Read: the fit helps where what changes past 8 nodes is what the model already scales with "
              "the node count (the ring's hops and their latency: p5's all-gathers). It cannot foresee what "
              "2-8 nodes do not show: Azure's bus bandwidth falls from 374 GB/s at 8 nodes to 235-275 at "
              "16-64 (its author blames fabric congestion), and p5's all-reduces at 16-32 nodes ran AWS's "
              "tuner plugin's picks, not NCCL's own that the fit predicts. Azure's points are one size, so "
              "only the saturated rate is fitted; it lands above the 400 GB/s of its NICs because the "
              "model's 2-node NVLSTree doubles the network rate and its 4-8-node ring saturates below it."]
    text = "\n".join(lines)
    print(text)
    write_section("fabric_fit", text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

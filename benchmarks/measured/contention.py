"""Contention: the cost model's slowdown of overlapped compute against every measurement.

One contention model (``cost.compute_time_us`` under the SMs and HBM bandwidth running
collectives hold, ``cost.collective_resource_use``; the simulator for whole steps) is judged on
every public measurement of compute beside communication, each as published:

* **h100-copy-probe**: the project's own H100 run (``benchmarks/results/gpu/raw.json``,
  RESULTS ``gpu_profile``): a cuBLAS 8192^3 fp16 GEMM beside a copy kernel of k CTAs x 512
  threads; the competitor is priced as k channels moving the copy's measured HBM bytes;
* **echo-a100**: NetX-lab/Echo-slowdown ``merged_features.csv`` (``benchmarks/data/
  a100_kernels.csv``): GPT-2 small kernels on A100 alone and beside DDP's 2-GPU all-reduce
  of 2 MB buckets, kernels at least half overlapped, scaled by the overlapped share;
* **ispass25**: arXiv 2507.03114 (A100/H100): overlap slows compute by 18.9% on average and
  40% at most; predicted for five kernel types (big and medium GEMMs, an MLP GEMM, an
  elementwise kernel, a norm) fully overlapped with NCCL's default 1 GiB all-reduce on
  8 A100 and 8 H100 (the study's windows are partly overlapped, so its average is a floor);
* **h100-order-probe**: the project's second H100 run (``benchmarks/results/gpu/wave_2026-11-25/
  gpu_order_run1.json``, RESULTS ``gpu_order``): the same GEMM beside k CTAs that only hold
  their SMs (``hold``) or copy HBM to HBM (``copy``), resident before the GEMMs (``first``) or
  arriving at a GEMM boundary (``dep``, where those 512-thread CTAs pack four to an SM; NCCL's
  kernels cannot, being built for one CTA per SM), and HBM traffic with no CTA of ours
  (``ce``: D2D ``cudaMemcpyAsync`` at 2.6 TB/s; ``d2h``: 55 GB/s to the host);
* **h200-paced-probe**: the same probe on an H200 (``benchmarks/results/gpu/wave_2026-11-28b/
  gpu_order.json``, RESULTS ``gpu_order_paced``), adding CTAs paced to one NCCL channel's rate
  (``paced``: 15 GB/s read a CTA, 30 of HBM) and CTAs that reduce as they copy (``reduce``, two
  reads and a write a word; ``paced-reduce``), so the SMs a collective holds are told apart from
  the HBM it moves;
* **pytorch-ag-gemm**: pytorch/pytorch PR #172714: an fp16 8192^3 GEMM beside an
  all-gather of 64 MiB per rank on 8 H100: 2.96 ms one after the other, 2.02 ms overlapped
  with NCCL's SM kernels, 1.77 ms with copy engines (``NCCL_CTA_POLICY=2``); predicted by
  the simulator on the two-kernel step.

    python -m benchmarks.measured.contention [--no-record]

Error = predicted / measured - 1 of the slowdown (or of the step time for pytorch-ag-gemm).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import json
import pathlib
import statistics
import sys

from lagom_jax.cluster import hardware
from lagom_jax.costs import cost

from ..common import DATA_DIR, RESULTS_DIR

PROBE = RESULTS_DIR / "gpu" / "raw.json"
ORDER_PROBE = RESULTS_DIR / "gpu" / "wave_2026-11-25" / "gpu_order_run1.json"
PACED_PROBE = RESULTS_DIR / "gpu" / "wave_2026-11-28b" / "gpu_order.json"
_SM_KINDS = ("copy", "hold", "reduce", "paced", "paced-reduce")  # kernels of CTAs; ce and d2h hold none
# Threads per SM on Hopper and Ampere (CUDA C Programming Guide, compute capability tables):
# how many of the probe's 512-thread CTAs one SM takes when they arrive together.
THREADS_PER_SM = 2048
KERNELS = DATA_DIR / "a100_kernels.csv"
GEMM = 8192


@dataclasses.dataclass(frozen=True)
class Point:
    source: str
    label: str
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1


def copy_probe() -> list[Point]:
    hw = hardware.get("h100-sxm-8")
    n = GEMM
    flops, nbytes = 2 * n**3, 3 * n * n * 2
    alone = cost.compute_time_us(flops, nbytes, hw, gemm=(1, n, n, n))
    out = []
    for p in json.loads(PROBE.read_text())["contention"]:
        measured = p["gemm_contended"]["median_us"] / p["gemm_alone"]["median_us"]
        # The copy kernel runs first and the GEMMs start beside its resident CTAs (rule a).
        shared = cost.compute_time_us(flops, nbytes, hw, gemm=(1, n, n, n),
                                      sms_taken=p["ctas"] * hw.resident_sm_share(True), hbm_gbps_taken=p["copy_gbps"])
        out.append(Point("h100-copy-probe", f"{p['ctas']} CTAs, {p['copy_gbps']:.0f} GB/s", measured, shared / alone))
    return out


def order_probe(path: pathlib.Path = ORDER_PROBE, preset: str = "h100-sxm-8",
                source: str = "h100-order-probe") -> list[Point]:
    """The order probe at normal priority (high priority measured the same)."""
    import math

    hw = hardware.get(preset)
    n = GEMM
    flops, nbytes = 2 * n**3, 3 * n * n * 2
    alone = cost.compute_time_us(flops, nbytes, hw, gemm=(1, n, n, n))
    per_sm = THREADS_PER_SM // 512
    out = []
    for c in json.loads(path.read_text())["cases"]:
        if c.get("slowdown") is None or c["priority"] != "normal" or c["order"] == "second":
            continue
        k = c["ctas"]
        # Both orders score the GEMMs that start with the CTAs resident (rule a): "dep" CTAs
        # reach their SMs at a GEMM boundary (rule b), together, and pack; copy engines hold none (rule d).
        sms = (k if c["order"] == "first" else math.ceil(k / per_sm)) if c["kind"] in _SM_KINDS else 0
        shared = cost.compute_time_us(flops, nbytes, hw, gemm=(1, n, n, n), sms_taken=sms * hw.resident_sm_share(True),
                                      hbm_gbps_taken=c["gbps"] or 0.0)
        label = f"{c['kind']} {c['order']}" + (f" {k} CTAs" if k else "") + (f", {c['gbps']:.0f} GB/s" if c["gbps"] else "")
        out.append(Point(source, label, c["slowdown"], shared / alone))
    return out


def echo() -> list[Point]:
    hw = hardware.get("a100-sxm-8")
    params = cost.nccl_default_params("all-reduce", 2 << 20, 2, 1, hw)
    _, hbm = cost.collective_resource_use("all-reduce", 2 << 20, 2, 1, params, hw)
    out = []
    with open(KERNELS, newline="", encoding="utf-8") as f:
        for r in csv.DictReader(f):
            frac = float(r["note"].split("overlap_frac=")[1].split(";")[0])
            if r["kind"] not in ("gemm", "memory") or frac < 0.5 or "alone=slow overlap=fast" in r["note"] \
                    or "alone=fast overlap=slow" in r["note"]:
                continue
            flops, nbytes = float(r["flops"] or 0), float(r["bytes"] or 0)
            alone = cost.compute_time_us(flops, nbytes, hw)
            # A kernel at least half overlapped started beside the all-reduce's resident CTAs
            # (rule a: a collective cannot join a kernel that fills the SMs, rule b).
            sms = params.nchannels * hw.resident_sm_share(r["kind"] == "gemm")
            shared = cost.compute_time_us(flops, nbytes, hw, sms_taken=sms, hbm_gbps_taken=hbm)
            out.append(Point("echo-a100", r["kind"], float(r["time_overlap_us"]) / float(r["time_alone_us"]),
                             1 + frac * (shared / alone - 1)))
    return out


ISPASS_KERNELS = (  # (flops, bytes, gemm shape or ())
    (2 * 8192**3, 3 * 8192**2 * 2, (1, 8192, 8192, 8192)), (2 * 4096**3, 3 * 4096**2 * 2, (1, 4096, 4096, 4096)),
    (2 * 2048 * 2048 * 8192, 2 * (2048 * 8192 * 2 + 2048**2), (1, 2048, 2048, 8192)), (1e8, 1e9, ()), (5e8, 4e8, ()),
)


def ispass() -> list[Point]:
    slow = []
    for name in ("a100-sxm-8", "h100-sxm-8"):
        hw = hardware.get(name)
        params = cost.nccl_default_params("all-reduce", 1 << 30, 8, 1, hw)
        _, hbm = cost.collective_resource_use("all-reduce", 1 << 30, 8, 1, params, hw)
        for flops, nbytes, gemm in ISPASS_KERNELS:
            alone = cost.compute_time_us(flops, nbytes, hw, gemm=gemm)
            sms = params.nchannels * hw.resident_sm_share(bool(gemm))  # the 1 GiB all-reduce resident first
            slow.append(cost.compute_time_us(flops, nbytes, hw, gemm=gemm, sms_taken=sms, hbm_gbps_taken=hbm) / alone)
    return [Point("ispass25", "mean slowdown", 1.189, statistics.mean(slow)),
            Point("ispass25", "worst slowdown", 1.40, max(slow))]


def gemm_beside_all_gather_ms(nccl_env: dict[str, str] | None = None, *, overlapped: bool = True,
                              command_buffer: str | None = None) -> float:
    """PyTorch's microbenchmark as a step, predicted (ms): an fp16 8192^3 GEMM and an
    all-gather of 64 MiB per rank over 8 H100 (512 MiB gathered), side by side or one after
    the other, under the NCCL settings ``nccl_env`` (and XLA's command buffers
    ``command_buffer``, its flag's syntax, where given)."""
    from lagom_jax.costs import launch

    from lagom_jax import search
    from lagom_jax.program.graph import StepGraph, Task
    from lagom_jax.cluster.nccl_env import NcclEnv

    n = GEMM
    # Overlapped, the all-gather is launched first and the GEMM starts beside its CTAs: the
    # microbenchmark enqueues the all-gather, then the matmul, on an idle GPU
    # (bench_overlapped_matmul_allgather.py ``_step_overlap``; docs/contention_sources.md).
    ag_id, gemm_id = (0, 1) if overlapped else (1, 0)
    gemm = Task(id=gemm_id, name="gemm", kind="compute", flops=2 * n**3, bytes=3 * n * n * 2, opcode="fusion",
                gemm=(1, n, n, n))
    ag = Task(id=ag_id, name="all-gather", kind="all-gather", bytes=512 << 20, groups=(tuple(range(8)),),
              is_async=True, deps=() if overlapped else (0,))
    # The copy-engine run's buffers are NCCL symmetric windows (what XLA's symmetric-buffers
    # flag makes), without which NCCL_CTA_POLICY=2 would move nothing to the copy engines; the
    # baseline is NCCL's SM-based all-gather on ordinary buffers (NCCL's regular kernels, not
    # its symmetric ones).
    env = nccl_env or {}
    hw = dataclasses.replace(hardware.get("h100-sxm-8"),
                             nccl_env=NcclEnv.from_environ(env, symmetric_buffers="NCCL_CTA_POLICY" in env))
    if command_buffer is not None:
        hw = dataclasses.replace(hw, command_buffer=launch.parse(command_buffer))
    step = StepGraph("gemm+all-gather", tuple(sorted((gemm, ag), key=lambda t: t.id)), num_devices=8)
    return search.run_strategy("xla-default", step, hw).makespan_us / 1e3


def pytorch() -> list[Point]:
    return [Point("pytorch-ag-gemm", "one after the other (ms)", 2.96, gemm_beside_all_gather_ms(overlapped=False)),
            Point("pytorch-ag-gemm", "overlapped, NCCL kernels (ms)", 2.02, gemm_beside_all_gather_ms()),
            Point("pytorch-ag-gemm", "overlapped, copy engines (ms)", 1.77,
                  gemm_beside_all_gather_ms({"NCCL_CTA_POLICY": "2"}))]


def all_points() -> list[Point]:
    return (copy_probe() + order_probe() + order_probe(PACED_PROBE, "h200-sxm-8", "h200-paced-probe") + echo()
            + ispass() + pytorch())


@contextlib.contextmanager
def whole_sm_everywhere():
    """The cost model with rule (a) applied to every kernel on every GPU, for a what-if: a
    resident collective CTA takes a whole SM from any kernel that starts beside it (every
    preset's ``sm_share_per_channel`` and ``matmul_sm_share_per_channel`` 1.0 while the
    block runs). Only hardware changes, so no cached table goes stale."""
    get = hardware.get
    hardware.get = lambda name, **kw: dataclasses.replace(get(name, **kw), sm_share_per_channel=1.0,
                                                          matmul_sm_share_per_channel=1.0)
    try:
        yield
    finally:
        hardware.get = get


def per_source(points: list[Point]) -> list[str]:
    lines = ["| source | points | measured (median) | predicted (median) | median error | median abs error | worst |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    by: dict[str, list[Point]] = {}
    for p in points:
        by.setdefault(p.source if p.source != "echo-a100" else f"echo-a100 {p.label}", []).append(p)
    for name, ps in by.items():
        errs = [p.error for p in ps]
        lines.append(f"| {name} | {len(ps)} | {statistics.median(p.measured for p in ps):.3f} "
                     f"| {statistics.median(p.predicted for p in ps):.3f} | {statistics.median(errs):+.1%} "
                     f"| {statistics.median(abs(e) for e in errs):.1%} | {max(errs, key=abs):+.0%} |")
    return lines


# The order-blind model this one replaced (recorded with it, same sources, same points): a
# running collective took 0.2 SM per channel from whatever ran beside it, HBM-pressure
# exponent 0.8. Median abs error per source, and the copy-engine effect on PyTorch's step.
BEFORE = {"h100-copy-probe": "2.9%", "h100-order-probe": "10.5%", "echo-a100 memory": "4.6%",
          "echo-a100 gemm": "6.3%", "ispass25": "3.2%", "pytorch-ag-gemm": "4.0%", "copy-engine effect": "+2.0%"}


def copy_engine_effect(points: list[Point]) -> tuple[float, float]:
    """(measured, predicted) share of PyTorch's overlapped step that copy engines save."""
    by = {p.label: p for p in points if p.source == "pytorch-ag-gemm"}
    nccl, ce = by["overlapped, NCCL kernels (ms)"], by["overlapped, copy engines (ms)"]
    return 1 - ce.measured / nccl.measured, 1 - ce.predicted / nccl.predicted


def section(points: list[Point], what_if: list[Point] | None = None) -> str:
    from benchmarks.common import machine_line

    hw = hardware.get("h100-sxm-8")
    measured, predicted = copy_engine_effect(points)
    lines = ["## contention (overlapped compute: the cost model against every measurement)", "",
             f"Machine: {machine_line()}. One contention model for all sources, which knows launch order "
             f"(`simulate`'s rules a-d): a collective's CTAs resident when a kernel starts take "
             f"`resident_sm_share` SMs each from it (a whole SM from a Hopper/Blackwell matmul, "
             f"{hw.sm_share_per_channel} from other kernels and on older GPUs), a collective made ready "
             f"while a kernel runs waits for its end (at a boundary the queued kernel wins), copy-engine "
             f"collectives hold no SM; HBM is taken in proportion to the bus bytes a collective moves "
             f"(`cost.collective_resource_use`) and compute runs on what is left (`cost.compute_time_us`; "
             f"HBM-pressure exponent on matmuls {cost.DEFAULT_COSTS.hbm_pressure_exponent}). "
             f"Error = predicted / measured - 1.", "",
             *per_source(points), "",
             f"Copy-engine effect on PyTorch's overlapped step (1 - copy engines / NCCL kernels): measured "
             f"{measured:+.1%}, predicted {predicted:+.1%} (the order-blind model: {BEFORE['copy-engine effect']}).",
             "", "The order-blind model before it (0.2 SM per channel from whatever ran beside a collective, "
             "exponent 0.8), median abs error: " + ", ".join(f"{k} {v}" for k, v in BEFORE.items()
                                                               if k != "copy-engine effect") + "."]
    if what_if:
        lines += ["", "What if rule (a) held for every kernel on every GPU (a whole SM per resident CTA, also "
                  "for Echo's A100 SIMT GEMMs and for non-matmul kernels; not the model in use):", "",
                  *per_source(what_if)]
    cand = {(p.source, p.label): p.predicted for p in what_if or []}
    lines += ["", "Points outside Echo's 581 kernels:", "",
              "| source | point | measured | predicted | error | what-if predicted | what-if error |",
              "|---|---|---:|---:|---:|---:|---:|"]
    for p in points:
        if p.source == "echo-a100":
            continue
        c = cand.get((p.source, p.label))
        extra = f"{c:.3f} | {c / p.measured - 1:+.1%}" if c is not None else "- | -"
        lines.append(f"| {p.source} | {p.label} | {p.measured:.3f} | {p.predicted:.3f} | {p.error:+.1%} | {extra} |")
    return "\n".join(lines) + "\n\n" + READING


READING = """How to read it:
- Launch order is what separates the sources. The H100 probe's GEMMs that start beside resident
  CTAs lose whole SMs (1.22x at 16, 1.80x at 64 of 132); a collective that arrives while a GEMM
  runs waits for it. XLA issues an async collective before the compute it overlaps, so in a JAX
  step the GEMMs after the first lose the collective's SMs; PyTorch's microbenchmark enqueues its
  all-gather first on an idle GPU (docs/contention_sources.md), so its GEMM starts beside the
  resident CTAs.
- Any held SM costs a GEMM of many waves a wave: one held SM of 132 cost the probe's 16-wave GEMM
  6.4-7.1%, where its share of the SMs predicts 0.8% (`CostConfig.held_sm_tail_waves`: at least one
  wave more than on every SM, for Hopper/Blackwell matmuls of two waves or more). Without it (the
  launch-order model of 2026-11-26 01:18) the median abs errors were: h100-copy-probe 6.5%,
  h100-order-probe 6.4%, ispass25 9.3%; the other sources are unchanged.
- Echo's A100 kernels are SIMT and Ampere GEMMs that run several CTAs per SM and share an SM with
  a NCCL CTA: the whole-SM rule there puts them about 27% slow where they measured 1.00x (the
  what-if), so they keep the 0.2 share. That split is by kernel and GPU, not by source, and no
  A100 probe has measured it.
- HBM pressure: copy engines moving 2.6 TB/s with no CTA slowed the GEMM 1.46x (exponent about 0.2),
  SM copies at 1.9-2.1 TB/s more (exponent about 0.8); 0.5 is the value of 0.2-0.8 whose worst
  per-source median error is smallest. ISPASS'25 (a 1 GiB all-reduce fully overlapping each kernel,
  a study whose windows were partly overlapped) is then the worst source.
- Not modelled: a small kernel's free SMs (a collective waits for any running kernel), the
  probe's 64-CTA copy (4.55x measured against about 3x), multi-wave kernels under priority
  (no measurement: the priority rule is off by default)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-record", action="store_true", help="print only; do not write RESULTS.md")
    args = parser.parse_args(argv)
    points = all_points()
    with whole_sm_everywhere():
        what_if = all_points()
    md = section(points, what_if)
    print(md)
    if not args.no_record:
        from benchmarks.common import write_section

        print(f"recorded in {write_section('contention', md)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

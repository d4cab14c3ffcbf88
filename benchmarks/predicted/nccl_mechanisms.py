"""What each NCCL setting changes, as the cost model prices it (predictions, no GPU).

For 8 H100 and 8 B200 of one node: NCCL's own choice against its symmetric kernels (XLA's
symmetric buffers), NVLS on registered buffers (XLA's user buffers) and those with the
efficiency CTA policy (NVLS all-gathers and reduce-scatters), per kind and size:
the kernel, its CTAs and its time alone; then a GEMM beside each collective, the step with
each setting and with NCCL_MAX_CTAS caps, so the SMs a setting hands back to compute show.
Across 2 and 16 such nodes: the all-reduce NCCL runs (NVLSTree where NVLS is on) under its
defaults, on registered buffers and with NVLS off, alone and beside a GEMM.

    python -m benchmarks.predicted.nccl_mechanisms [--no-record]
"""

from __future__ import annotations

import argparse
import dataclasses

from lagom_jax import search
from lagom_jax.cluster import hardware
from lagom_jax.cluster.nccl_env import NcclEnv
from lagom_jax.costs import cost
from lagom_jax.program.graph import StepGraph, Task

PRESETS = ("h100-sxm-8", "b200-sxm-8")
KINDS = ("all-reduce", "all-gather", "reduce-scatter")
SIZES = (4 << 10, 1 << 20, 16 << 20, 256 << 20)
SETTINGS = (("NCCL's defaults", {}), ("symmetric buffers", {"symmetric_buffers": True}),
            ("user buffers", {"user_buffers": True}),
            ("user buffers, NCCL_CTA_POLICY=1", {"user_buffers": True, "efficiency": True}),
            ("NCCL_MAX_CTAS=8", {"max_ctas": 8}),
            ("NCCL_MAX_CTAS=4", {"max_ctas": 4}))


# The settings whose pick is shown collective by collective (the CTA caps only in the step).
_PICKS = 4


def _size(nbytes: int) -> str:
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


def collective_rows() -> list[str]:
    rows = []
    for name in PRESETS:
        base = hardware.get(name)
        for kind in KINDS:
            for nbytes in SIZES:
                cells = []
                for _label, env in SETTINGS[:_PICKS]:
                    hw = dataclasses.replace(base, nccl_env=NcclEnv(**env))
                    p = cost.nccl_default_params(kind, nbytes, 8, 1, hw)
                    t = cost.collective_time_us(kind, nbytes, 8, 1, p, hw)
                    cells.append(f"{p.algorithm}/{p.protocol} {p.nchannels} CTAs, {t:.1f} us")
                rows.append(f"| {name} | {kind} | {_size(nbytes)} | " + " | ".join(cells) + " |")
    return rows


def _gemm_beside(kind: str, nbytes: int, gpus: int = 8) -> StepGraph:
    coll = Task(id=0, name="c", kind=kind, bytes=nbytes, groups=(tuple(range(gpus)),), is_async=True)
    gemm = Task(id=1, name="gemm", kind="compute", flops=2 * 8192**3, bytes=3 * 8192**2 * 2, opcode="fusion",
                gemm=(1, 8192, 8192, 8192))
    return StepGraph("gemm+c", (coll, gemm), num_devices=gpus)


NODES = (2, 16)
ACROSS = (("NCCL's defaults", {}), ("user buffers", {"user_buffers": True}), ("NVLS off", {"nvls": False}))
ACROSS_SIZES = (16 << 20, 256 << 20, 1 << 30)


def across_rows() -> list[str]:
    """An all-reduce over every GPU of ``nodes`` nodes: NCCL's pick, CTAs, time alone and busBw;
    then the step of a GEMM beside a 256 MiB one."""
    rows = []
    for name in PRESETS:
        for nodes in NODES:
            base = hardware.get(name, nodes=nodes)
            n = base.gpus_per_node * nodes
            for nbytes in (*ACROSS_SIZES, None):
                cells = []
                for _label, env in ACROSS:
                    hw = dataclasses.replace(base, nccl_env=NcclEnv(**env))
                    if nbytes is None:
                        step = _gemm_beside("all-reduce", 256 << 20, n)
                        cells.append(f"{search.run_strategy('xla-default', step, hw).makespan_us / 1e3:.3f} ms")
                        continue
                    p = cost.nccl_default_params("all-reduce", nbytes, n, nodes, hw)
                    t = cost.collective_time_us("all-reduce", nbytes, n, nodes, p, hw)
                    bus = nbytes * cost.bus_factor("all-reduce", "ring", n) / t / 1e3
                    cells.append(f"{p.algorithm}/{p.protocol} {p.nchannels} CTAs, {t:.0f} us ({bus:.0f} GB/s)")
                what = "GEMM beside 256 MiB" if nbytes is None else _size(nbytes)
                rows.append(f"| {name} x{nodes} | {what} | " + " | ".join(cells) + " |")
    return rows


def step_rows() -> list[str]:
    rows = []
    for name in PRESETS:
        base = hardware.get(name)
        for kind in KINDS:
            step = _gemm_beside(kind, 256 << 20)
            cells = []
            for _label, env in SETTINGS:
                hw = dataclasses.replace(base, nccl_env=NcclEnv(**env))
                cells.append(f"{search.run_strategy('xla-default', step, hw).makespan_us / 1e3:.3f}")
            rows.append(f"| {name} | {kind} | " + " | ".join(cells) + " |")
    return rows


def section() -> str:
    from benchmarks.common import machine_line

    labels = [label for label, _ in SETTINGS]
    return "\n".join([
        "## nccl_mechanisms (what NCCL's settings change, predicted)", "",
        f"Machine: {machine_line()}. `python -m benchmarks.predicted.nccl_mechanisms`. One node of 8 GPUs. "
        "NCCL's own pick for one collective (kernel, CTAs, time alone) under its defaults, on XLA's "
        "symmetric buffers (NCCL 2.27's symmetric kernels), on XLA's user buffers (NVLS on registered "
        "buffers) and on them with NCCL's efficiency CTA policy (NVLS all-gathers and reduce-scatters); "
        "docs/nccl.md says how each is priced and from which source.", "",
        "| GPUs | kind | bytes | " + " | ".join(labels[:_PICKS]) + " |", "|---|---|---:|" + "---|" * _PICKS,
        *collective_rows(), "",
        "An 8192^3 bf16 GEMM beside an independent 256 MiB collective, the step (ms) under each setting: what "
        "the SMs a setting frees or takes do to the compute beside it.", "",
        "| GPUs | collective | " + " | ".join(labels) + " |", "|---|---|" + "---:|" * len(labels),
        *step_rows(), "",
        "Across nodes (every GPU of 2 and 16 nodes): the all-reduce NCCL runs, its CTAs, time alone and bus "
        "bandwidth (NVLSTree on NVLS nodes: NVLS in each node, a tree between them; 6-7 CTAs on registered "
        "buffers), and an 8192^3 GEMM beside a 256 MiB one.", "",
        "| GPUs | all-reduce | " + " | ".join(label for label, _ in ACROSS) + " |", "|---|---|" + "---|" * len(ACROSS),
        *across_rows(),
    ])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-record", action="store_true", help="print only; do not write RESULTS.md")
    args = parser.parse_args(argv)
    md = section()
    print(md)
    if not args.no_record:
        from benchmarks.common import write_section

        write_section("nccl_mechanisms", md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

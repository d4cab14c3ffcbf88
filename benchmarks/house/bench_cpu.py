"""``lagom-jax bench`` at CPU scale on this machine: the real thing, 2 processes x 4 CPU devices.

    python -m benchmarks.house.bench_cpu [--rounds 2] [--write]
    python -m benchmarks.house.bench_cpu --search 2 --profile --recalibrate [--write]

The second form records `bench_cpu_search`: the model's 2 best plans measured, the choice and
the runs it took against the blind count, and lagom's arm traced, calibrated and re-planned.

A built-in Llama (``tiny``) under FSDP over 8 devices, planned for ``h100-sxm-8``; every arm
(XLA's defaults, recipe, autoccl, lagom) a fresh job of 2 processes joined by
``jax.distributed`` on a localhost coordinator, XLA:CPU's gloo collectives, interleaved rounds.
Records the bench's own report and its wall time. The measured times say nothing about GPUs:
the arms differ in ``xla_gpu_*`` flags, which XLA:CPU does not use, so the verdict should be
"no difference beyond the noise" (a check of the method, not of the plan).
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile
import time

from benchmarks.common import ROOT, machine_line, write_section


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--search", type=int, default=0)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--recalibrate", action="store_true")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    import lagom_jax  # noqa: F401 - before JAX starts

    out = pathlib.Path(tempfile.mkdtemp(prefix="lagom-bench-cpu-")) / "bench"
    cmd = [sys.executable, "-m", "lagom_jax.cli", "bench", "--model", "llama", "--config", "tiny", "--mesh", "fsdp=8",
           "--batch-size", "8", "--seq-len", "16", "--processes", "2", "--steps", "6", "--warmup", "1",
           "--rounds", str(args.rounds)]
    cmd += (["--search", str(args.search)] if args.search else []) + (["--profile"] if args.profile else [])
    cmd += (["--recalibrate"] if args.recalibrate else []) + ["--out", str(out)]
    name = "bench_cpu_search" if args.search or args.profile or args.recalibrate else "bench_cpu"
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    if proc.returncode:
        print(proc.stderr[-3000:])
        return proc.returncode
    # The bench's own report, its headings below this section's.
    report = (out / "report.md").read_text().replace("# lagom-jax bench\n", "").replace("\n## ", "\n#### ")
    text = "\n".join([
        f"## {name}", "",
        f"Machine: {machine_line()}.", "",
        f"`lagom-jax bench` at CPU scale, *measured*: `{' '.join(['lagom-jax', *cmd[3:-2]])}`. Whole bench "
        f"(planning every arm, then its runs of 2 processes each): {wall:.0f} s. The arms differ "
        "only in `xla_gpu_*` flags, which XLA:CPU does not use: this checks the method (fresh jobs, "
        "jax.distributed over gloo, interleaving, intervals, the applied check), not the plan.", "",
        report.strip()])
    print(text)
    if args.write:
        write_section(name, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

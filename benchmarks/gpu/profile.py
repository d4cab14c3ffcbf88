"""Profile one real GPU: achieved matmul rate, HBM bandwidth, and compute/copy contention.

Runs ``lagom_jax.costs.profile.run_profile`` on the default backend, prints a short table, and
records the ``gpu_profile`` section of RESULTS.md. It refuses to record anything when the
default backend is not a GPU, so that RESULTS.md never shows CPU numbers as GPU numbers.

Run on the GPU machine: ``python -m benchmarks.gpu.profile --out benchmarks/results/gpu``
(add ``--quick`` for a shorter sweep).
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from benchmarks.common import machine_line, write_section
from lagom_jax.cluster import hardware
from lagom_jax.costs import profile


def table(raw: dict, prof: hardware.HardwareProfile) -> str:
    """Markdown of the measured numbers, each with its median and IQR."""
    env = raw["environment"]
    base = hardware.get(raw["base_preset"])
    out = [
        "## gpu_profile (measured)",
        "",
        f"Machine: {machine_line()}; GPU {env['device_kind']}, driver {env['driver']}.",
        f"Measured profile `{prof.name}` (base preset `{raw['base_preset']}` for links and NCCL numbers).",
        "",
        "| GEMM m x n x k | dtype | median us | IQR us | TFLOP/s |",
        "|---|---|---|---|---|",
    ]
    out += [f"| {g['m']} x {g['n']} x {g['k']} | {g['dtype']} | {g['median_us']:.1f} | {g['iqr_us']:.1f} "
            f"| {g['tflops']:.1f} |" for g in raw["gemm"]]
    out += ["", "| fusion bytes | median us | IQR us | GB/s |", "|---|---|---|---|"]
    out += [f"| {h['bytes'] / 1e6:.0f} MB | {h['median_us']:.1f} | {h['iqr_us']:.1f} | {h['gbps']:.0f} |"
            for h in raw["hbm"]]
    if raw.get("contention"):
        out += ["", "| copy CTAs | GEMM alone us (IQR) | GEMM beside copy us (IQR) | slowdown | copy GB/s |",
                "|---|---|---|---|---|"]
        out += [f"| {c['ctas']} | {c['gemm_alone']['median_us']:.1f} ({c['gemm_alone']['iqr_us']:.1f}) "
                f"| {c['gemm_contended']['median_us']:.1f} ({c['gemm_contended']['iqr_us']:.1f}) "
                f"| {c['slowdown']:.3f} | {c['copy_gbps']:.0f} |" for c in raw["contention"]]
    fits = raw["fits"]
    out += ["", "| fitted | measured | preset |", "|---|---|---|",
            f"| achieved TFLOP/s | {prof.achieved_tflops:.1f} | {base.achieved_tflops:.1f} |",
            f"| achieved HBM GB/s | {prof.achieved_hbm_gbps:.0f} | {base.achieved_hbm_gbps:.0f} |",
            f"| SMs | {prof.sm_count} | {base.sm_count} |"]
    if "contention" in fits:
        c = fits["contention"]
        out += [f"| SMs taken per copy CTA | {c['sm_per_cta']:.2f} | {base.sm_share_per_channel:.2f} (sm_share_per_channel) |",
                f"| copy GB/s per CTA | {c['hbm_gbps_per_cta']:.1f} | - |",
                f"| copy saturation GB/s | {c['hbm_saturation_gbps']:.0f} | - |"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/gpu", help="directory for hardware.json and raw.json")
    ap.add_argument("--quick", action="store_true", help="fewer shapes, CTA counts and repeats")
    args = ap.parse_args(argv)

    import jax

    if jax.default_backend() != "gpu":
        print(f"gpu_profile: the default JAX backend is {jax.default_backend()!r}, not a GPU; nothing "
              "recorded (RESULTS.md must not show CPU numbers as GPU numbers). Run it on a GPU machine; "
              "`lagom-jax profile` still profiles a CPU, clearly marked.", file=sys.stderr)
        return 2
    path = profile.run_profile(pathlib.Path(args.out), quick=args.quick)
    raw = json.loads(path.with_name("raw.json").read_text())
    md = table(raw, hardware.HardwareProfile.load(path))
    print(md)
    write_section("gpu_profile", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
